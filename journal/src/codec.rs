//! Protobuf mapping (to be written).
