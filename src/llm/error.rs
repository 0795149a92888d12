//! The error of the LLM layer.

use super::limiter::LimitError;
use crate::stage::Stage;

/// Errors of the LLM layer. Messages never contain the API key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The call does not fit the budget (larger than the burst).
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The provider refused the request for a reason retrying cannot fix.
    #[error("{stage}: the model server answered HTTP {status}: {message}")]
    Refused {
        stage: Stage,
        status: u16,
        message: String,
    },
    /// Every attempt failed with a transient error.
    #[error("{stage}: gave up after {attempts} attempts; last error: {last}")]
    Exhausted {
        stage: Stage,
        attempts: u32,
        last: String,
    },
    /// The reply did not match the schema, also after one repair attempt.
    #[error(
        "{stage}: the reply does not match the expected JSON ({reason}); reply starts: {excerpt}"
    )]
    InvalidReply {
        stage: Stage,
        reason: String,
        excerpt: String,
    },
    /// The reply was cut at `max_tokens`.
    #[error("{stage}: the reply was cut at max_tokens = {max_tokens}; reply starts: {excerpt}")]
    Truncated {
        stage: Stage,
        max_tokens: u32,
        excerpt: String,
    },
    /// The client could not be built.
    #[error("cannot set up the LLM client: {0}")]
    Setup(String),
    /// Replay mode (`graphloom run --replay`) and the response cache holds
    /// no reply for this request: nothing was sent.
    #[error(
        "{stage}: no reply for this request in the response cache, and --replay makes no LLM calls (run without --replay to ask the model)"
    )]
    NotCached { stage: Stage },
    /// Batch mode: the request is queued for the Batch API and its answer
    /// comes in a later round; nothing was sent.
    #[error("{stage}: queued for the Batch API; the answer comes in a later round")]
    Deferred { stage: Stage },
}

impl LlmError {
    /// Short class for `llm_calls.error` and `failures`.
    pub fn class(&self) -> &'static str {
        match self {
            LlmError::Limit(_) => "too_large",
            LlmError::Refused { .. } => "refused",
            LlmError::Exhausted { .. } => "exhausted",
            LlmError::InvalidReply { .. } => "invalid_reply",
            LlmError::Truncated { .. } => "truncated",
            LlmError::Setup(_) => "setup",
            LlmError::NotCached { .. } => "not_cached",
            LlmError::Deferred { .. } => "deferred",
        }
    }

    /// Whether the call was queued for the Batch API (batch mode): not a
    /// failure, and nothing about the item should be concluded from it.
    pub fn is_deferred(&self) -> bool {
        matches!(self, LlmError::Deferred { .. })
    }
}
