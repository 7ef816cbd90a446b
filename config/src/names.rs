//! The small vocabularies of the file: keyword enums, names of tables, environment variables and headers.

use std::fmt;

/// The name of the built-in agent and of the built-in model it runs on.
pub const SCRIPTED: &str = "scripted";

/// A value that is not in the form its key allows. The message says what is allowed.
///
/// ```
/// use turnstile_config::Provider;
///
/// let err = "foo".parse::<Provider>().unwrap_err();
/// assert_eq!(err.to_string(), r#"unknown provider "foo" (allowed: openai, anthropic, scripted)"#);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueError(pub(crate) String);

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ValueError {}

/// An enum written in the file as one of a few words, with a message listing them when the word is unknown.
macro_rules! keyword_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in the order the documentation lists them.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The word written in the file.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::names::ValueError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $text => Ok($name::$variant), )+
                    _ => Err($crate::names::ValueError(format!(
                        "unknown {} {:?} (allowed: {})",
                        $what,
                        s,
                        [$($text),+].join(", ")
                    ))),
                }
            }
        }

        $crate::names::deserialize_from_str!($name);
    };
}
pub(crate) use keyword_enum;

/// Deserializes a type from a string through its `FromStr`, so that its message is the error's.
macro_rules! deserialize_from_str {
    ($name:ty) => {
        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_str($crate::names::FromStrVisitor(::std::marker::PhantomData))
            }
        }
    };
}
pub(crate) use deserialize_from_str;

/// Parses the string in `visit_str`, so that toml gives the error the span of the very value (an array
/// element, not the whole array).
pub(crate) struct FromStrVisitor<T>(pub(crate) std::marker::PhantomData<T>);

impl<T: std::str::FromStr<Err = ValueError>> serde::de::Visitor<'_> for FromStrVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<T, E> {
        v.parse().map_err(E::custom)
    }
}

/// What [`is_name`] allows, for messages.
pub(crate) const NAME_RULE: &str = "1 to 64 letters, digits, '_' or '-'";

/// A name of a model, agent or MCP server: 1 to 64 of `[A-Za-z0-9_-]`.
pub(crate) fn is_name(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// What [`is_env_var`] allows, for messages.
pub(crate) const ENV_VAR_RULE: &str =
    "an environment variable name: letters, digits and '_', not starting with a digit, e.g. \"OPENAI_API_KEY\"";

/// A portable environment variable name: `[A-Za-z_][A-Za-z0-9_]*`.
pub(crate) fn is_env_var(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// An HTTP header name (an RFC 9110 token).
pub(crate) fn is_header_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// `names` sorted and joined for a "(known: …)" list, or `none` when empty.
pub(crate) fn known<'a>(names: impl IntoIterator<Item = &'a String>) -> String {
    let names: Vec<&str> = names.into_iter().map(String::as_str).collect();
    if names.is_empty() { "none".to_owned() } else { names.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_name("local") && is_name("gpt-4o_mini") && is_name(&"a".repeat(64)));
        assert!(!is_name("") && !is_name("a.b") && !is_name("a b") && !is_name(&"a".repeat(65)));
        assert!(is_env_var("OPENAI_API_KEY") && is_env_var("_x1"));
        assert!(!is_env_var("") && !is_env_var("1X") && !is_env_var("sk-abc") && !is_env_var("A B"));
        assert!(is_header_name("Authorization") && is_header_name("X-Api-Key"));
        assert!(!is_header_name("") && !is_header_name("Bad Header") && !is_header_name("a:b"));
    }
}
