//! Embedded backend (to be written).
