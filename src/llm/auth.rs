//! The API key, the header that carries it and the redaction of it from
//! what servers send back.

use reqwest::header::{HeaderMap, HeaderValue};

use super::error::LlmError;
use crate::spec::ApiStyle;

/// The authentication header of `style` for `key` (none without a key),
/// marked sensitive so it never shows in debug output.
pub(crate) fn auth_headers(style: ApiStyle, key: Option<&ApiKey>) -> Result<HeaderMap, LlmError> {
    let mut headers = HeaderMap::new();
    if let Some(ApiKey(k)) = key {
        let (name, value) = match style {
            ApiStyle::Openai => ("authorization", format!("Bearer {k}")),
            ApiStyle::Azure => ("api-key", k.clone()),
        };
        let mut value = HeaderValue::from_str(&value).map_err(|_| {
            LlmError::Setup("the API key holds characters not allowed in a header".into())
        })?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    Ok(headers)
}

/// `text` without `key` and without anything shaped like an OpenAI key
/// (`sk-…`), for text that came back from a server before it is stored or
/// shown.
pub(crate) fn redact(key: Option<&ApiKey>, text: &str) -> String {
    let mut out = text.to_string();
    if let Some(ApiKey(k)) = key
        && k.len() >= 4
    {
        out = out.replace(k.as_str(), "[redacted]");
    }
    out.split_inclusive(|c: char| c.is_whitespace() || c == '"' || c == '\'')
        .map(|w| {
            if w.trim_start_matches(['"', '\'']).starts_with("sk-") {
                let tail: String = w
                    .chars()
                    .filter(|c| c.is_whitespace() || *c == '"' || *c == '\'')
                    .collect();
                format!("[redacted]{tail}")
            } else {
                w.to_string()
            }
        })
        .collect()
}

/// The API key. Its `Debug` never shows it; it is sent only as a header
/// marked sensitive.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// Reads the key from the environment variable `name`; `None` when it is
    /// unset or empty (local servers need no key).
    pub fn from_env(name: &str) -> Option<ApiKey> {
        std::env::var(name)
            .ok()
            .filter(|k| !k.trim().is_empty())
            .map(|k| ApiKey(k.trim().to_string()))
    }

    /// Wraps a key given directly.
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(redacted)")
    }
}
