//! The codec's error and the field-path helpers every decoder uses.

use turnstile_model::ValueError;

/// A protobuf value that cannot become a domain value. `path` names the offending field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// A structural rule is broken (missing field, unknown enum value, type/payload mismatch).
    #[error("{path}: {detail}")]
    Invalid { path: String, detail: String },
    /// A value rule of SPEC §1 is broken.
    #[error("{path}: {value}")]
    Value { path: String, value: ValueError },
    /// The bytes are not a protobuf message of the expected kind at all.
    #[error("bytes are not a protobuf {what}: {detail}; they were not written by this codec or are damaged")]
    Malformed { what: &'static str, detail: String },
}

impl CodecError {
    pub fn invalid(path: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::Invalid { path: path.into(), detail: detail.into() }
    }

    /// A required field that is absent; `hint` says what to set.
    pub fn missing(path: impl Into<String>, hint: &str) -> Self {
        Self::Invalid { path: path.into(), detail: format!("is missing; {hint}") }
    }

    pub fn value(path: impl Into<String>, value: ValueError) -> Self {
        Self::Value { path: path.into(), value }
    }

    /// The error of a value decoded at a path relative to `parent` (or at `parent` itself, for an empty
    /// path), as seen from the root: decoders of nested values build their paths only when they fail,
    /// since a path built up front costs an allocation for every value decoded (the read path's profile).
    #[must_use]
    pub fn under(self, parent: &str) -> Self {
        let rebase = |path: String| match (parent.is_empty(), path.is_empty()) {
            (true, _) => path,
            (false, true) => parent.to_owned(),
            (false, false) if path.starts_with('[') => format!("{parent}{path}"),
            (false, false) => format!("{parent}.{path}"),
        };
        match self {
            Self::Invalid { path, detail } => Self::Invalid { path: rebase(path), detail },
            Self::Value { path, value } => Self::Value { path: rebase(path), value },
            malformed @ Self::Malformed { .. } => malformed,
        }
    }

    /// The field path the error is about, when it is about one field.
    pub fn path(&self) -> Option<&str> {
        match self {
            Self::Invalid { path, .. } | Self::Value { path, .. } => Some(path),
            Self::Malformed { .. } => None,
        }
    }
}

/// `parent.child`, or `child` at the root.
pub fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() { child.to_owned() } else { format!("{parent}.{child}") }
}

/// `parent[i]`.
pub fn index(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}
