//! The LLM layer: an OpenAI-compatible client with one shared request and
//! token budget, retries, a response cache and per-call accounting.
//!
//! * [`client`]: chat completions with structured output and embeddings;
//! * [`error`]: the layer's error; [`auth`]: the API key and its header;
//! * [`batch`]: batch mode, calls queued for the Batch API;
//! * [`concurrency`]: how many calls go at once, following the server;
//! * [`endpoints`]: several servers of one model behind the one budget;
//! * [`limiter`]: the requests-per-minute and tokens-per-minute budget;
//! * [`retry`]: which failures are retried and how long to wait;
//! * [`reply`]: schemas sent with calls and the clean-up of replies;
//! * [`cache`]: the content-addressed response cache;
//! * [`plan`]: planned calls, tokens and cost before a run (dry run);
//! * [`test_server`]: a faithful OpenAI-compatible server for tests and
//!   benchmarks.

pub mod auth;
pub mod batch;
pub mod cache;
pub mod client;
pub mod concurrency;
pub mod endpoints;
pub mod error;
pub mod limiter;
pub mod plan;
pub mod reply;
pub mod retry;
#[cfg(feature = "testkit")]
pub mod test_server;

pub use auth::ApiKey;
pub use cache::{CacheMode, ResponseCache};
pub use client::{ChatReply, ChatRequest, LlmClient, LlmTotals, Message, Usage};
pub use error::LlmError;

/// Runs `call` as a task of its own, so that the work around LLM calls
/// (building prompts, hashing cache keys, parsing replies: all there is to
/// a cached replay) spreads over every core. The task starts at once; one
/// that panicked panics in the task awaiting it too.
pub fn in_task<F>(call: F) -> impl std::future::Future<Output = F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let task = tokio::spawn(call);
    async move {
        match task.await {
            Ok(v) => v,
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(e) => panic!("an LLM call's task was cancelled: {e}"),
            },
        }
    }
}
