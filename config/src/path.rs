//! Key paths (`agents.assistant.tools[1]`) and how errors find them in the text.
//!
//! toml's deserialization errors carry a byte span but no key; validation errors carry a key but no span.
//! Both are mapped here against the spanned parse tree ([`toml::de::DeTable`]), so that every
//! [`ConfigError`] names the key and, when there is text, its line and column.

use std::fmt;
use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::error::{ConfigError, Location};

/// One step of a key path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    Key(String),
    Index(usize),
}

/// A key path from the document root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyPath(Vec<Segment>);

impl KeyPath {
    pub(crate) fn root() -> Self {
        Self(Vec::new())
    }

    /// This path extended by a key.
    pub(crate) fn key(&self, key: &str) -> Self {
        let mut next = self.clone();
        next.0.push(Segment::Key(key.to_owned()));
        next
    }

    /// This path extended by an array index.
    pub(crate) fn index(&self, index: usize) -> Self {
        let mut next = self.clone();
        next.0.push(Segment::Index(index));
        next
    }

    /// An error about this key.
    pub(crate) fn invalid(&self, message: impl Into<String>) -> Invalid {
        Invalid { path: self.clone(), message: message.into() }
    }

    fn last_key(&self) -> Option<&str> {
        match self.0.last() {
            Some(Segment::Key(k)) => Some(k),
            _ => None,
        }
    }
}

/// Bare keys as written; other keys quoted the way TOML quotes them; indices as `[i]`; the root as
/// `(top level)`.
impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(top level)");
        }
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                        f.write_str(k)?;
                    } else {
                        write!(f, "{k:?}")?;
                    }
                }
                Segment::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A validation error before it is placed in the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Invalid {
    pub(crate) path: KeyPath,
    pub(crate) message: String,
}

impl Invalid {
    /// The error, located in `doc` when there is one.
    pub(crate) fn into_error(self, doc: Option<(&str, &DeTable<'_>)>) -> ConfigError {
        let location = doc
            .and_then(|(text, root)| span_of(root, &self.path).map(|span| Location::at(text, span.start)))
            .unwrap_or_default();
        ConfigError::Invalid { location, key: self.path.to_string(), message: self.message }
    }
}

/// `path.key` must be at least 1; `why` says what 0 would do.
pub(crate) fn positive(path: &KeyPath, key: &str, value: u64, why: &str) -> Result<(), Invalid> {
    if value == 0 { Err(path.key(key).invalid(format!("must be at least 1 ({why})"))) } else { Ok(()) }
}

/// The error for a toml parse failure (the text is not TOML).
pub(crate) fn syntax_error(text: &str, err: &toml::de::Error) -> ConfigError {
    let location = err.span().map(|s| Location::at(text, s.start)).unwrap_or_default();
    ConfigError::Syntax { location, message: one_line(err.message()) }
}

/// The error for a toml deserialization failure: the key is found from the error's span.
pub(crate) fn deserialize_error(text: &str, root: &DeTable<'_>, err: &toml::de::Error) -> ConfigError {
    let span = err.span();
    let mut path = span.clone().map(|s| path_at(root, &s)).unwrap_or_default();
    let (missing, message) = rewrite(&one_line(err.message()));
    if let Some(key) = missing
        && path.last_key() != Some(key.as_str())
    {
        path = path.key(&key);
    }
    let location = span.map(|s| Location::at(text, s.start)).unwrap_or_default();
    ConfigError::Invalid { location, key: path.to_string(), message }
}

fn one_line(message: &str) -> String {
    message.trim().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

fn contains(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end
}

/// The key whose key or value span most tightly contains `span` (the deepest one on a tie).
fn path_at(root: &DeTable<'_>, span: &Range<usize>) -> KeyPath {
    /// The best candidate so far: span length, depth, path.
    type Best = Option<(usize, usize, KeyPath)>;
    fn consider(candidate: Range<usize>, path: &KeyPath, span: &Range<usize>, best: &mut Best) {
        if contains(&candidate, span) {
            let (len, depth) = (candidate.len(), path.0.len());
            if best.as_ref().is_none_or(|(l, d, _)| len < *l || (len == *l && depth > *d)) {
                *best = Some((len, depth, path.clone()));
            }
        }
    }
    fn table(t: &DeTable<'_>, here: &KeyPath, span: &Range<usize>, best: &mut Best) {
        for (k, v) in t.iter() {
            let path = here.key(k.get_ref());
            consider(k.span(), &path, span, best);
            value(v, &path, span, best);
        }
    }
    fn value(v: &Spanned<DeValue<'_>>, here: &KeyPath, span: &Range<usize>, best: &mut Best) {
        consider(v.span(), here, span, best);
        match v.get_ref() {
            DeValue::Table(t) => table(t, here, span, best),
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    value(item, &here.index(i), span, best);
                }
            }
            _ => {}
        }
    }
    let mut best = None;
    table(root, &KeyPath::root(), span, &mut best);
    best.map(|(_, _, path)| path).unwrap_or_default()
}

/// Where `path` (or the longest part of it that is in the text) is written: a table by its key (its header),
/// anything else by its value.
fn span_of(root: &DeTable<'_>, path: &KeyPath) -> Option<Range<usize>> {
    let mut table = Some(root);
    let mut array: Option<&[Spanned<DeValue<'_>>]> = None;
    let mut found = None;
    for segment in &path.0 {
        let (key_span, value) = match segment {
            Segment::Key(k) => match table.and_then(|t| t.iter().find(|(key, _)| key.get_ref() == k)) {
                Some((key, value)) => (Some(key.span()), value),
                None => break,
            },
            Segment::Index(i) => match array.and_then(|a| a.get(*i)) {
                Some(value) => (None, value),
                None => break,
            },
        };
        (table, array) = match value.get_ref() {
            DeValue::Table(t) => (Some(t), None),
            DeValue::Array(a) => (None, Some(&a[..])),
            _ => (None, None),
        };
        found = match (value.get_ref(), key_span) {
            (DeValue::Table(_), Some(k)) => Some(k),
            _ => Some(value.span()),
        };
    }
    found
}

/// serde's messages in the words of this file format: keys rather than fields, tables rather than maps,
/// and no string values echoed (a value may be a secret written in the wrong place). Returns the key a
/// "missing field" message names, to be added to the path.
fn rewrite(message: &str) -> (Option<String>, String) {
    let ticked = |s: &str| -> Vec<String> { s.split('`').skip(1).step_by(2).map(str::to_owned).collect() };
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let tail = rest.split_once('`').map_or("", |(_, t)| t);
        let allowed = ticked(tail);
        let message = if allowed.is_empty() {
            "unknown key (this table takes no keys)".to_owned()
        } else {
            format!("unknown key (allowed: {})", allowed.join(", "))
        };
        return (None, message);
    }
    if let Some(rest) = message.strip_prefix("unknown variant `")
        && let Some((value, tail)) = rest.split_once('`')
    {
        return (None, format!("unknown value {value:?} (allowed: {})", ticked(tail).join(", ")));
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let key = rest.split_once('`').map_or(rest, |(k, _)| k);
        return (Some(key.to_owned()), "missing; this key is required".to_owned());
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((found, expected)) = rest.rsplit_once(", expected ")
        {
            return (None, format!("expected {}, found {}", expected_words(expected), found_words(found)));
        }
    }
    (None, message.to_owned())
}

fn expected_words(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u64" | "usize" => "a non-negative integer".to_owned(),
        "u32" => "a non-negative integer no larger than 4294967295".to_owned(),
        "i64" | "isize" | "i32" => "an integer".to_owned(),
        "a sequence" => "an array".to_owned(),
        "a map" => "a table".to_owned(),
        e if e.starts_with("struct ") => "a table".to_owned(),
        e => e.to_owned(),
    }
}

fn found_words(found: &str) -> String {
    let value = || found.split('`').nth(1).unwrap_or_default().to_owned();
    if found.starts_with("string") {
        "a string".to_owned()
    } else if found.starts_with("integer") || found.starts_with("floating point") || found.starts_with("boolean") {
        value()
    } else if found == "map" {
        "a table".to_owned()
    } else if found == "sequence" {
        "an array".to_owned()
    } else {
        found.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_render_bare_keys_quoted_keys_and_indices() {
        let p = KeyPath::root().key("agents").key("my agent").key("tools").index(2);
        assert_eq!(p.to_string(), r#"agents."my agent".tools[2]"#);
        assert_eq!(KeyPath::root().to_string(), "(top level)");
    }

    #[test]
    fn serde_messages_are_rewritten_without_echoing_strings() {
        assert_eq!(rewrite("unknown field `x`, expected `a` or `b`").1, "unknown key (allowed: a, b)");
        assert_eq!(rewrite("unknown field `x`, expected one of `a`, `b`, `c`").1, "unknown key (allowed: a, b, c)");
        assert_eq!(rewrite("unknown field `x`, there are no fields").1, "unknown key (this table takes no keys)");
        assert_eq!(
            rewrite("missing field `url`"),
            (Some("url".to_owned()), "missing; this key is required".to_owned())
        );
        assert_eq!(
            rewrite("invalid type: string \"sk-secret\", expected u64").1,
            "expected a non-negative integer, found a string"
        );
        assert_eq!(
            rewrite("invalid value: integer `-1`, expected usize").1,
            "expected a non-negative integer, found -1"
        );
        assert_eq!(rewrite("invalid type: map, expected a sequence").1, "expected an array, found a table");
        assert_eq!(rewrite("invalid type: integer `3`, expected struct AgentConfig").1, "expected a table, found 3");
        assert_eq!(rewrite("unknown variant `x`, expected `a` or `b`").1, r#"unknown value "x" (allowed: a, b)"#);
        assert_eq!(rewrite("something else").1, "something else");
    }

    #[test]
    fn spans_are_found_in_header_tables_implicit_tables_and_arrays() {
        let text = "[a.b]\nx = 1\n[a.c]\nhooks = [{ url = 'u' }, {}]\n[[a.d.hooks]]\nurl = 'v'\n";
        let root = DeTable::parse(text).unwrap();
        let root = root.get_ref();
        let at = |needle: &str| {
            let start = text.find(needle).unwrap();
            path_at(root, &(start..start + needle.len())).to_string()
        };
        assert_eq!(at("x"), "a.b.x");
        assert_eq!(at("1"), "a.b.x");
        assert_eq!(at("hooks"), "a.c.hooks");
        assert_eq!(at("'u'"), "a.c.hooks[0].url");
        assert_eq!(at("{}"), "a.c.hooks[1]");
        assert_eq!(at("'v'"), "a.d.hooks[0].url");
        let span = |p: &KeyPath| span_of(root, p).map(|s| &text[s]);
        assert_eq!(span(&KeyPath::root().key("a").key("b")), Some("b"));
        assert_eq!(span(&KeyPath::root().key("a").key("b").key("x")), Some("1"));
        assert_eq!(span(&KeyPath::root().key("a").key("b").key("nope")), Some("b"));
        assert_eq!(span(&KeyPath::root().key("a").key("c").key("hooks").index(1)), Some("{}"));
        assert_eq!(span(&KeyPath::root().key("zz")), None);
    }
}
