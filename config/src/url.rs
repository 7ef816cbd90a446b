//! [`HttpUrl`]: an absolute `http` or `https` URL.

use std::fmt;
use std::str::FromStr;

use crate::names::{ValueError, deserialize_from_str};

/// An absolute `http://` or `https://` URL with a host, no credentials and no fragment: a model endpoint,
/// a streamable HTTP MCP server, a remote hook.
///
/// Errors never repeat the text (a URL may carry a token); they say what is wrong.
///
/// ```
/// use turnstile_config::HttpUrl;
///
/// let url: HttpUrl = "http://127.0.0.1:8080/v1".parse().unwrap();
/// assert_eq!(url.as_str(), "http://127.0.0.1:8080/v1");
/// assert!("127.0.0.1:8080".parse::<HttpUrl>().is_err());
/// assert!("https://user:pw@example.com".parse::<HttpUrl>().is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HttpUrl(url::Url);

impl HttpUrl {
    /// The URL as text (normalized: lower-case scheme and host).
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The parsed URL.
    pub fn as_url(&self) -> &url::Url {
        &self.0
    }
}

const EXAMPLE: &str = "write it like \"http://127.0.0.1:8080/v1\"";

impl FromStr for HttpUrl {
    type Err = ValueError;

    fn from_str(s: &str) -> Result<Self, ValueError> {
        let err = |what: &str| Err(ValueError(what.to_owned()));
        let lower = s.get(..8).unwrap_or(s).to_ascii_lowercase();
        if !(lower.starts_with("http://") || lower.starts_with("https://")) {
            return err(&format!("not an absolute http(s) URL: it must start with http:// or https://; {EXAMPLE}"));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return err("not a valid URL: it contains whitespace or control characters");
        }
        let url = match url::Url::parse(s) {
            Ok(url) => url,
            Err(e) => return err(&format!("not a valid URL: {e}; {EXAMPLE}")),
        };
        if url.host_str().is_none_or(str::is_empty) {
            return err(&format!("not a valid URL: it has no host; {EXAMPLE}"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return err(
                "a URL must not carry a user name or password; give credentials through an environment variable (api_key_env, headers_env)",
            );
        }
        if url.fragment().is_some() {
            return err("a URL must not have a #fragment");
        }
        Ok(Self(url))
    }
}

deserialize_from_str!(HttpUrl);

impl fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HttpUrl({:?})", self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(s: &str) -> String {
        s.parse::<HttpUrl>().unwrap_err().to_string()
    }

    #[test]
    fn absolute_http_urls_pass() {
        for ok in ["http://127.0.0.1:8080/v1", "https://api.openai.com/v1", "HTTP://Example.com", "http://[::1]:7700"] {
            assert!(ok.parse::<HttpUrl>().is_ok(), "{ok}");
        }
        assert_eq!("HTTP://Example.COM/v1".parse::<HttpUrl>().unwrap().as_str(), "http://example.com/v1");
    }

    #[test]
    fn everything_else_fails_without_echoing_the_text() {
        let start = "not an absolute http(s) URL: it must start with http:// or https://; write it like \"http://127.0.0.1:8080/v1\"";
        for bad in ["127.0.0.1:8080", "localhost:8080/v1", "ftp://x", "/v1", "", "http:/x", "http:x"] {
            assert_eq!(message(bad), start, "{bad}");
        }
        assert_eq!(message("http://"), "not a valid URL: empty host; write it like \"http://127.0.0.1:8080/v1\"");
        assert_eq!(message("http://a b"), "not a valid URL: it contains whitespace or control characters");
        assert_eq!(
            message("http://host:99999"),
            "not a valid URL: invalid port number; write it like \"http://127.0.0.1:8080/v1\""
        );
        assert!(!message("https://me:hunter2@example.com").contains("hunter2"));
        assert_eq!(message("http://x/#top"), "a URL must not have a #fragment");
    }
}
