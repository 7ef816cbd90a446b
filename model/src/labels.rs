//! Session labels and label selectors (SPEC §16).
//!
//! Labels are `key → value` pairs set by `SetLabels` and stored durably by `session/labeled`; a selector
//! (`k=v,k!=v,k,!k`, like Kubernetes) picks sessions by them in `ListSessions`.
//!
//! ```
//! use std::collections::BTreeMap;
//! use turnstile_model::labels::Selector;
//! let labels = BTreeMap::from([("team".to_string(), "blue".to_string())]);
//! assert!(Selector::parse("team=blue,!archived").unwrap().matches(&labels));
//! assert!(!Selector::parse("team!=blue").unwrap().matches(&labels));
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Longest label key.
pub const MAX_KEY_LEN: usize = 63;
/// Longest label value, in bytes.
pub const MAX_VALUE_BYTES: usize = 256;
/// Most labels one session holds.
pub const MAX_LABELS: usize = 32;

/// A session's labels.
pub type Labels = BTreeMap<String, String>;

/// `session/labeled`: labels set (added or changed) and keys removed, in one event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Labeled {
    pub set: BTreeMap<String, String>,
    pub removed: Vec<String>,
}

impl Labeled {
    /// `labels` after this change.
    pub fn apply_to(&self, labels: &mut Labels) {
        for key in &self.removed {
            labels.remove(key);
        }
        for (k, v) in &self.set {
            labels.insert(k.clone(), v.clone());
        }
    }
}

/// A key: `[a-z0-9_.-/]{1,63}`.
pub fn validate_key(key: &str) -> Result<(), LabelError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(LabelError::KeyLength { key: key.to_owned(), len: key.len() });
    }
    if let Some(c) = key.chars().find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '_' | '.' | '-' | '/')) {
        return Err(LabelError::KeyChar { key: key.to_owned(), c });
    }
    Ok(())
}

/// The characters a selector reads as its own syntax (`k=v,k!=v`): a value holding one could be stored but
/// no selector could name it.
pub const SELECTOR_SYNTAX: [char; 2] = [',', '='];

/// A value of `key`: at most [`MAX_VALUE_BYTES`], none of [`SELECTOR_SYNTAX`], no whitespace at either
/// end (a selector trims it). The one rule for a value, applied where labels are set and where a
/// selector names one, so that every value stored can be selected and every value selected can be stored.
pub fn validate_value(key: &str, value: &str) -> Result<(), LabelError> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(LabelError::ValueLength { key: key.to_owned(), len: value.len() });
    }
    let detail = if let Some(c) = value.chars().find(|c| SELECTOR_SYNTAX.contains(c)) {
        format!("holds {c:?}")
    } else if value.trim() != value {
        "starts or ends with whitespace".to_owned()
    } else {
        return Ok(());
    };
    Err(LabelError::ValueChar { key: key.to_owned(), value: value.to_owned(), detail })
}

/// Checks a `SetLabels` change against the labels a session has: keys, values, the count after it, and
/// that no key is both set and removed.
pub fn check_change(current: &Labels, change: &Labeled) -> Result<(), LabelError> {
    for (key, value) in &change.set {
        validate_key(key)?;
        validate_value(key, value)?;
    }
    for key in &change.removed {
        validate_key(key)?;
        if change.set.contains_key(key) {
            return Err(LabelError::SetAndRemoved { key: key.clone() });
        }
    }
    let mut after = current.clone();
    change.apply_to(&mut after);
    if after.len() > MAX_LABELS {
        return Err(LabelError::TooMany { count: after.len() });
    }
    Ok(())
}

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
}

impl Requirement {
    fn matches(&self, labels: &Labels) -> bool {
        match self {
            Self::Equals(k, v) => labels.get(k) == Some(v),
            // Like Kubernetes: a session without the key matches `k!=v`.
            Self::NotEquals(k, v) => labels.get(k) != Some(v),
            Self::Exists(k) => labels.contains_key(k),
            Self::Absent(k) => !labels.contains_key(k),
        }
    }
}

/// A label selector: every requirement must hold. The empty selector matches every session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Selector {
    pub requirements: Vec<Requirement>,
}

impl Selector {
    /// Parses `k=v,k!=v,k,!k` (whitespace around items and operators is ignored; `==` means `=`).
    pub fn parse(text: &str) -> Result<Self, LabelError> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self { requirements });
        }
        for item in text.split(',') {
            let item = item.trim();
            let bad = |detail: &str| LabelError::Selector { item: item.to_owned(), detail: detail.to_owned() };
            if item.is_empty() {
                return Err(bad("is empty (two commas in a row, or a trailing comma)"));
            }
            let requirement = if let Some((k, v)) = item.split_once("!=") {
                Requirement::NotEquals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = item.split_once("==").or_else(|| item.split_once('=')) {
                Requirement::Equals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some(k) = item.strip_prefix('!') {
                Requirement::Absent(k.trim().to_owned())
            } else {
                Requirement::Exists(item.to_owned())
            };
            let (key, value) = match &requirement {
                Requirement::Equals(k, v) | Requirement::NotEquals(k, v) => (k, Some(v)),
                Requirement::Exists(k) | Requirement::Absent(k) => (k, None),
            };
            validate_key(key).map_err(|e| bad(&e.to_string()))?;
            if let Some(v) = value {
                validate_value(key, v).map_err(|e| bad(&e.to_string()))?;
            }
            requirements.push(requirement);
        }
        Ok(Self { requirements })
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

/// Labels or a selector that break the rules of SPEC §16.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("label key {key:?} must be 1 to {MAX_KEY_LEN} characters, got {len}")]
    KeyLength { key: String, len: usize },
    #[error("label key {key:?} has the character {c:?}; use only a-z, 0-9, '_', '.', '-' and '/'")]
    KeyChar { key: String, c: char },
    #[error("label {key:?} has a value of {len} bytes; values are at most {MAX_VALUE_BYTES} bytes")]
    ValueLength { key: String, len: usize },
    #[error(
        "label {key:?} has the value {value:?}, which {detail}; a value may hold any character but ',' and '=' and \
         may not start or end with whitespace, so that a label selector (k=v, k!=v) can name it"
    )]
    ValueChar { key: String, value: String, detail: String },
    #[error("label {key:?} is both set and removed; do one or the other")]
    SetAndRemoved { key: String },
    #[error("the session would have {count} labels; at most {MAX_LABELS} are allowed: remove some with remove_keys")]
    TooMany { count: usize },
    #[error("label_selector item {item:?} {detail}; write items as k=v, k!=v, k or !k joined by commas")]
    Selector { item: String, detail: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_parse_match_and_refuse_precisely() {
        let labels = Labels::from([("env".into(), "prod".into()), ("team".into(), "a".into())]);
        for (text, expected) in [
            ("env=prod", true),
            ("env==prod, team", true),
            ("env!=prod", false),
            ("owner!=x", true),
            ("!owner", true),
            ("!team", false),
            ("", true),
        ] {
            assert_eq!(Selector::parse(text).unwrap().matches(&labels), expected, "{text}");
        }
        let e = Selector::parse("Env=prod").unwrap_err().to_string();
        assert!(e.contains("'E'") && e.contains("k=v"), "{e}");
        let e = Selector::parse("a,,b").unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
    }

    #[test]
    fn changes_are_checked_against_the_rules() {
        let mut many = Labeled::default();
        for i in 0..=MAX_LABELS {
            many.set.insert(format!("k{i}"), String::new());
        }
        assert!(matches!(check_change(&Labels::new(), &many), Err(LabelError::TooMany { .. })));
        let both = Labeled { set: BTreeMap::from([("a".into(), "1".into())]), removed: vec!["a".into()] };
        assert!(matches!(check_change(&Labels::new(), &both), Err(LabelError::SetAndRemoved { .. })));
        let long = Labeled { set: BTreeMap::from([("a".into(), "x".repeat(257))]), removed: vec![] };
        assert!(matches!(check_change(&Labels::new(), &long), Err(LabelError::ValueLength { .. })));
        assert!(validate_key("app.kubernetes.io/name").is_ok());
    }

    #[test]
    fn values_a_selector_cannot_name_are_refused_and_every_stored_value_can_be_selected() {
        for bad in ["a,b", "a=b", "x!=y", " lead", "trail ", "\tx"] {
            let change = Labeled { set: BTreeMap::from([("k".into(), bad.into())]), removed: vec![] };
            let err = check_change(&Labels::new(), &change).unwrap_err();
            assert!(matches!(err, LabelError::ValueChar { .. }), "{bad:?}: {err}");
            assert!(err.to_string().contains("any character but ',' and '='"), "{err}");
        }
        for good in ["", "prod", "a b", "ünï", "!x", "x!", "a.b/c-d_e", "émoji 🚀"] {
            let labels = Labels::from([("k".to_string(), good.to_string())]);
            let change = Labeled { set: labels.clone(), removed: vec![] };
            assert!(check_change(&Labels::new(), &change).is_ok(), "{good:?}");
            let selector = Selector::parse(&format!("k={good}")).unwrap();
            assert!(selector.matches(&labels), "k={good} selects it");
            assert!(!Selector::parse(&format!("k!={good}")).unwrap().matches(&labels), "k!={good}");
        }
        // The selector refuses what could not be stored, with the same rule.
        let e = Selector::parse("k=a=b").unwrap_err().to_string();
        assert!(e.contains("holds '='"), "{e}");
    }
}
