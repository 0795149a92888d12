//! The OpenAI-compatible client: chat completions with structured output,
//! embeddings, the shared limiter, retries, the response cache and one
//! accounting row per call.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use chrono::Utc;
use rand::SeedableRng;
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::auth::{ApiKey, auth_headers, redact};
use super::batch::{BatchQueue, Endpoint, QueuedRequest};
use super::cache::{CachedReply, ResponseCache, cache_key};
use super::concurrency::{CallClock, Concurrency, Outcome as LoadOutcome};
use super::endpoints::{self, EndpointStats, Pool, Slot};
use super::error::LlmError;
use super::limiter::{BudgetConfig, Limiter};
use super::reply;
use super::retry::{RetryPolicy, Verdict, classify, parse_retry_after};
use crate::rows::LlmCallRow;
use crate::spec::{ApiStyle, LlmSpec, StructuredOutput};
use crate::stage::Stage;

/// Texts per `/embeddings` request (sync, and per Batch API line).
const EMBED_BATCH: usize = 64;

/// A chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message {
            role: "system".into(),
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message {
            role: "user".into(),
            content: content.into(),
        }
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Message {
            role: "assistant".into(),
            content: content.into(),
        }
    }
}

/// One structured call.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// Stage name for accounting (`extract_entities`, `classify`, …).
    pub stage: Stage,
    /// What the call is about (an episode id), for accounting.
    pub item: Option<String>,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Bound on the reply, sized to its schema.
    pub max_tokens: u32,
    /// Version of the prompt; part of the cache key, so changing a prompt
    /// invalidates its cached replies.
    pub prompt_version: String,
    /// Time the call may take once its first request is sent, retries
    /// and a repair included ([`CallClock`]); `None`: only the attempts'
    /// `llm.timeout_secs` bound it.
    pub budget: Option<Duration>,
}

/// Token counts of a call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
}

/// A parsed reply.
#[derive(Debug, Clone)]
pub struct ChatReply<T> {
    /// The value.
    pub value: T,
    /// Tokens of the call (of the original call for a cache hit).
    pub usage: Usage,
    /// Whether the cache answered.
    pub cache_hit: bool,
    /// HTTP attempts made (0 for a cache hit).
    pub attempts: u32,
    /// What was dropped from the reply for breaking a bound of its schema
    /// (an array element, the items past `maxItems`), one note each.
    pub dropped: Vec<String>,
}

/// Totals over the calls of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LlmTotals {
    /// Calls, hits included.
    pub calls: u64,
    /// Calls answered by the cache.
    pub cache_hits: u64,
    /// Prompt tokens sent (hits excluded: they cost nothing).
    pub prompt_tokens: u64,
    /// Completion tokens received (hits excluded).
    pub completion_tokens: u64,
    /// Cost in USD when prices are configured.
    pub cost_usd: Option<f64>,
}

/// What decides a chat reply: the cache key hashes the compact JSON of
/// this, so the field names and their order are part of every key ever
/// written and must not change (a test checks them against the object
/// they were first written as).
#[derive(Serialize)]
struct ChatKey<'a> {
    kind: &'static str,
    model: &'a str,
    messages: &'a [Message],
    schema: &'a Value,
    level: u8,
    temperature: f64,
    max_tokens: u32,
    extra_body: &'a serde_json::Map<String, Value>,
    prompt_version: &'a str,
}

/// What decides an embedding: as [`ChatKey`], for one input text.
#[derive(Serialize)]
struct EmbeddingKey<'a> {
    kind: &'static str,
    model: &'a str,
    input: &'a str,
}

/// Estimates the prompt tokens of messages before sending: one token per
/// three characters plus a few per message, on the high side of real
/// tokenizers so that reservations rarely fall short.
pub fn estimate_tokens(messages: &[Message]) -> u64 {
    messages
        .iter()
        .map(|m| (m.content.chars().count() as u64).div_ceil(3) + 4)
        .sum::<u64>()
        + 3
}

#[derive(Debug)]
struct Settings {
    embedding_base_url: String,
    /// `embedding_base_url` as `llm_calls.endpoint` shows it.
    embedding_label: String,
    model: String,
    embedding_model: String,
    api_style: ApiStyle,
    azure_api_version: Option<String>,
    temperature: f64,
    timeout: Duration,
    retry: RetryPolicy,
    extra_body: serde_json::Map<String, Value>,
    /// Chat replies streamed, and stopped when they loop.
    stream: bool,
    /// Bursts declared by [`LlmClient::share_prefix`] are led by a warm-up.
    warm_prefix: bool,
    price_prompt: Option<f64>,
    price_completion: Option<f64>,
    /// Batch prices as a share of the sync prices.
    batch_price_factor: f64,
}

/// The client of one run. Share it (it is `Sync`): every stage must go
/// through the same limiter.
pub struct LlmClient {
    http: reqwest::Client,
    settings: Settings,
    key: Option<ApiKey>,
    limiter: Limiter,
    in_flight: Concurrency,
    /// The chat endpoints (`llm.endpoints`, or `llm.base_url` alone).
    pool: Pool,
    cache: Option<ResponseCache>,
    /// Structured-output level in use; only ever moves down.
    mode: AtomicU8,
    run_id: String,
    calls: Mutex<Calls>,
    rng: Mutex<rand::rngs::StdRng>,
    /// Batch mode: where cache misses are queued instead of sent.
    batch: Option<Arc<BatchQueue>>,
    /// The system prompts declared by [`LlmClient::share_prefix`], each
    /// with the warm-up that is sent for it at most once.
    warm: Mutex<HashMap<String, Arc<OnceCell<()>>>>,
}

/// The accounting rows so far and the tokens they used (hits excluded),
/// kept as a running total so progress displays cost nothing per call.
#[derive(Default)]
struct Calls {
    rows: Vec<LlmCallRow>,
    tokens: u64,
}

impl std::fmt::Debug for LlmClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmClient")
            .field("settings", &self.settings)
            .field("endpoints", &self.pool)
            .field("key", &self.key)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

fn mode_level(m: StructuredOutput) -> u8 {
    match m {
        StructuredOutput::JsonSchema => 0,
        StructuredOutput::JsonObject => 1,
        StructuredOutput::Prompt => 2,
    }
}

/// What one HTTP exchange produced.
struct Exchange {
    body: Value,
    spent: Spent,
    /// The most tokens the call can have used (see [`reported_tokens`]).
    token_bound: u64,
}

/// A token count from a reply's `usage`, believed up to `bound`: the
/// request's reservation (estimated prompt plus `max_tokens`, which caps
/// the completion) plus its size in bytes (no tokenizer makes more than
/// one token per byte). A larger number comes from a broken server;
/// trusting it would push the shared budget's next slot centuries away
/// (u64::MAX tokens) and overflow the run's token totals.
fn reported_tokens(value: &Value, bound: u64) -> Option<u64> {
    value.as_u64().map(|n| n.min(bound))
}

/// What one attempt of an exchange came to.
enum Attempt {
    /// A reply, with the token bound it was settled against.
    Done(Value, u64),
    /// The server refused the structured-output format: rebuild the body
    /// one level down (not counted as an attempt).
    Downgrade(LlmError),
    /// A refusal no retry fixes.
    Fatal(LlmError),
    /// A transient failure: why, and how long the server asked to wait.
    Retry(String, Option<Duration>),
}

/// Why an exchange failed, with the counts spent on it.
struct ExchangeError {
    error: LlmError,
    spent: Spent,
}

/// What a call spent: HTTP attempts, time in exchanges, time waiting
/// for the budget, a free slot or a backoff, and the endpoint of its last
/// attempt (its `llm_calls` columns).
#[derive(Debug, Clone, Copy, Default)]
struct Spent {
    attempts: u32,
    http_time: Duration,
    wait_time: Duration,
    endpoint: Option<Served>,
}

/// The error of a call whose every endpoint rests after repeated
/// failures (`next`: when the first is back).
fn all_resting(stage: Stage, attempts: u32, last: &str, next: Option<Duration>) -> LlmError {
    LlmError::Exhausted {
        stage,
        attempts,
        last: format!(
            "{}every endpoint is resting after repeated failures{}",
            if last.is_empty() {
                String::new()
            } else {
                format!("{last}; ")
            },
            next.map(|d| format!(" (the first back in {}s)", d.as_secs()))
                .unwrap_or_default()
        ),
    }
}

/// Why an attempt got no reply (never with the URL, which may hold a key).
#[derive(Debug)]
struct NoReply {
    why: String,
    /// No reply within the attempt's time: a sign of load.
    timed_out: bool,
}

impl NoReply {
    fn timed_out(after: Duration) -> Self {
        NoReply {
            why: format!("no reply within {}s", after.as_secs()),
            timed_out: true,
        }
    }

    fn other(why: String) -> Self {
        NoReply {
            why,
            timed_out: false,
        }
    }
}

/// Where an attempt went.
#[derive(Debug, Clone, Copy)]
enum Served {
    /// A chat endpoint of the pool, by index.
    Pool(usize),
    /// `llm.embedding_base_url`.
    Embeddings,
}

impl std::ops::AddAssign for Spent {
    fn add_assign(&mut self, other: Spent) {
        self.attempts += other.attempts;
        self.http_time += other.http_time;
        self.wait_time += other.wait_time;
        self.endpoint = other.endpoint.or(self.endpoint);
    }
}

impl LlmClient {
    /// Builds the client of a run from the spec. The key is read from the
    /// environment variable the spec names.
    pub fn new(
        spec: &LlmSpec,
        cache: Option<ResponseCache>,
        run_id: &str,
    ) -> Result<Self, LlmError> {
        Self::with_key(spec, ApiKey::from_env(&spec.api_key_env), cache, run_id)
    }

    /// Builds the client with an explicit key.
    pub fn with_key(
        spec: &LlmSpec,
        key: Option<ApiKey>,
        cache: Option<ResponseCache>,
        run_id: &str,
    ) -> Result<Self, LlmError> {
        let requests = match spec.request_burst {
            Some(b) => BudgetConfig {
                per_minute: spec.requests_per_minute as u64,
                burst: b as u64,
            },
            None => BudgetConfig::with_default_burst(spec.requests_per_minute as u64),
        };
        let tokens = match spec.token_burst {
            Some(b) => BudgetConfig {
                per_minute: spec.tokens_per_minute as u64,
                burst: b as u64,
            },
            None => BudgetConfig::with_default_burst(spec.tokens_per_minute as u64),
        };
        let limiter = Limiter::new(requests, tokens)?;
        let headers = auth_headers(spec.api_style, key.as_ref())?;
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .pool_max_idle_per_host(spec.max_concurrency as usize)
            .build()
            .map_err(|e| LlmError::Setup(e.without_url().to_string()))?;
        Ok(LlmClient {
            http,
            settings: Settings {
                embedding_base_url: spec
                    .embedding_base_url
                    .as_deref()
                    .unwrap_or(spec.primary_base_url())
                    .trim_end_matches('/')
                    .to_string(),
                embedding_label: endpoints::label(
                    spec.embedding_base_url
                        .as_deref()
                        .unwrap_or(spec.primary_base_url()),
                ),
                model: spec.model.clone(),
                embedding_model: spec
                    .embedding_model
                    .clone()
                    .unwrap_or_else(|| spec.model.clone()),
                api_style: spec.api_style,
                azure_api_version: spec.azure_api_version.clone(),
                temperature: spec.temperature,
                timeout: Duration::from_secs(spec.timeout_secs),
                retry: RetryPolicy {
                    max_attempts: spec.max_attempts,
                    initial: Duration::from_millis(spec.backoff_initial_ms),
                    max: Duration::from_millis(spec.backoff_max_ms),
                },
                extra_body: spec.extra_body.clone(),
                stream: spec.stream,
                warm_prefix: spec.warm_prefix,
                price_prompt: spec.price_per_1m_prompt_tokens,
                price_completion: spec.price_per_1m_completion_tokens,
                batch_price_factor: spec.batch.price_factor,
            },
            key,
            limiter,
            in_flight: Concurrency::new(
                spec.max_concurrency.max(1) as usize,
                spec.adaptive_concurrency,
            ),
            pool: Pool::new(spec),
            cache,
            mode: AtomicU8::new(mode_level(spec.structured_output)),
            run_id: run_id.to_string(),
            calls: Mutex::new(Calls::default()),
            rng: Mutex::new(rand::rngs::StdRng::from_os_rng()),
            batch: None,
            warm: Mutex::new(HashMap::new()),
        })
    }

    /// The client in batch mode: calls the cache cannot answer are queued
    /// on `queue` and fail with [`LlmError::Deferred`].
    pub fn with_batch_queue(mut self, queue: Arc<BatchQueue>) -> Self {
        self.batch = Some(queue);
        self
    }

    /// Calls deferred to the Batch API so far (0 in sync mode).
    pub fn deferred(&self) -> usize {
        self.batch.as_ref().map_or(0, |q| q.deferred())
    }

    /// Declares that many of the coming chat calls open with `system` and
    /// go out at once. With `llm.warm_prefix`, the first of them that the
    /// response cache cannot answer sends a warm-up call before it (the
    /// system prompt alone, one token of reply) and the others wait for
    /// that, so a server that caches prompt prefixes reads the shared
    /// prompt once rather than once per parallel slot. Declaring a prompt
    /// twice, or calls that all hit the cache, sends nothing.
    pub fn share_prefix(&self, system: &Message) {
        if self.settings.warm_prefix && system.role == "system" {
            let mut warm = self.warm.lock().unwrap_or_else(|p| p.into_inner());
            warm.entry(system.content.clone()).or_default();
        }
    }

    /// Waits for the warm-up of `req`'s system prompt, sending it if no
    /// call has yet, when that prompt was declared by
    /// [`LlmClient::share_prefix`].
    async fn warm_up(&self, req: &ChatRequest) {
        let Some(system) = req.messages.first().filter(|m| m.role == "system") else {
            return;
        };
        let cell = {
            let warm = self.warm.lock().unwrap_or_else(|p| p.into_inner());
            warm.get(&system.content).cloned()
        };
        if let Some(cell) = cell {
            cell.get_or_init(|| self.send_warm_up(req.stage, system))
                .await;
        }
    }

    /// The warm-up call: `system` and an empty user message, one token of
    /// reply, no response format (the reply is thrown away). Recorded in
    /// `llm_calls` with the item `warm-up`; a failure is logged and the
    /// calls go on without it.
    async fn send_warm_up(&self, stage: Stage, system: &Message) {
        let messages = [system.clone(), Message::user("")];
        let mut body = json!({
            "model": self.settings.model,
            "messages": messages,
            "temperature": self.settings.temperature,
            "max_tokens": 1,
        });
        self.merge_extra_body(&mut body);
        let est = estimate_tokens(&messages) + 1;
        let item = Some("warm-up".to_string());
        let (usage, spent, error) = match self
            .exchange(stage, "chat/completions", &body, est, None, None)
            .await
        {
            Ok(x) => {
                let usage = &x.body["usage"];
                let usage = Usage {
                    prompt_tokens: reported_tokens(&usage["prompt_tokens"], x.token_bound)
                        .unwrap_or(est - 1),
                    completion_tokens: reported_tokens(&usage["completion_tokens"], x.token_bound)
                        .unwrap_or(1),
                };
                (usage, x.spent, None)
            }
            Err(e) => {
                tracing::warn!(
                    "{stage}: the prompt warm-up call failed, the calls go on without it: {}",
                    self.redact(&e.error.to_string())
                );
                (Usage::default(), e.spent, Some(e.error))
            }
        };
        let model = self.settings.model.clone();
        self.record(self.row(
            stage,
            &model,
            item.as_ref(),
            usage,
            spent,
            false,
            error.as_ref(),
        ));
    }

    /// The structured-output level in effect (it moves down when a server
    /// rejects `response_format`).
    pub fn structured_output(&self) -> StructuredOutput {
        match self.mode.load(Ordering::SeqCst) {
            0 => StructuredOutput::JsonSchema,
            1 => StructuredOutput::JsonObject,
            _ => StructuredOutput::Prompt,
        }
    }

    /// Whether misses fail instead of calling the model (replay).
    fn replay_only(&self) -> bool {
        self.cache.as_ref().is_some_and(ResponseCache::replay_only)
    }

    /// The model name calls are sent with.
    pub fn model(&self) -> &str {
        &self.settings.model
    }

    /// What each chat endpoint did so far (attempts, failed attempts,
    /// rests), in the order of `llm.endpoints`.
    pub fn endpoint_stats(&self) -> Vec<EndpointStats> {
        self.pool.stats()
    }

    /// The fewest and the most calls let go at once so far, and the most
    /// allowed (`llm.max_concurrency`).
    pub fn in_flight(&self) -> (usize, usize, usize) {
        let (low, high) = self.in_flight.range();
        (low, high, self.in_flight.max())
    }

    fn url(&self, base: &str, endpoint: &str) -> String {
        match (self.settings.api_style, &self.settings.azure_api_version) {
            (ApiStyle::Azure, Some(v)) => format!("{base}/{endpoint}?api-version={v}"),
            _ => format!("{base}/{endpoint}"),
        }
    }

    /// Removes the key (and anything shaped like an OpenAI key) from text
    /// that came back from the server before it is stored or shown.
    fn redact(&self, text: &str) -> String {
        redact(self.key.as_ref(), text)
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        self.settings.retry.backoff(attempt, &mut *rng)
    }

    /// The time an attempt may take: the attempt timeout, or what is left
    /// of the call's budget when less (the first attempt starts the
    /// clock); `None` once the budget is spent.
    fn attempt_timeout(&self, clock: Option<&CallClock>) -> Option<Duration> {
        match clock.and_then(CallClock::sending) {
            Some(left) if left.is_zero() => None,
            Some(left) => Some(left.min(self.settings.timeout)),
            None => Some(self.settings.timeout),
        }
    }

    /// Where an attempt goes: the URL of `endpoint` at the pool's `slot`,
    /// or at the embedding server.
    fn target(&self, slot: Option<&Slot>, endpoint: &str) -> (String, Served) {
        match slot {
            Some(slot) => (
                self.url(slot.base_url(), endpoint),
                Served::Pool(slot.index()),
            ),
            None => (
                self.url(&self.settings.embedding_base_url, endpoint),
                Served::Embeddings,
            ),
        }
    }

    /// Posts `body` to `endpoint` under the limiter with retries; returns
    /// the parsed JSON of the first 200 reply.
    ///
    /// `level` is the structured-output level the body was built for (chat
    /// calls only); a 400 that blames the response format moves the client
    /// one level down and returns at once so the caller can rebuild the body.
    async fn exchange(
        &self,
        stage: Stage,
        endpoint: &str,
        body: &Value,
        est_tokens: u64,
        level: Option<u8>,
        clock: Option<&CallClock>,
    ) -> Result<Exchange, ExchangeError> {
        let mut spent = Spent::default();
        let mut last = String::new();
        let body_bytes = serde_json::to_vec(body).map_or(0, |b| b.len() as u64);
        let max_attempts = self.settings.retry.max_attempts;
        // Embeddings go to their one server; chat attempts to the pool.
        let pooled = endpoint != "embeddings";
        // The endpoint the last attempt failed on, for the next to avoid.
        let mut avoid = None;
        while spent.attempts < max_attempts {
            spent.attempts += 1;
            let attempts = spent.attempts;
            let waited = Instant::now();
            let Some(permit) = self.in_flight.acquire().await else {
                let error = LlmError::Setup("client closed".into());
                return Err(ExchangeError { error, spent });
            };
            // The endpoint is chosen before the budget is reserved, so that
            // waiting for a rested fleet does not hold budget back from
            // nobody; and after the global slot, so that the choice sees
            // the load of the moment the attempt goes.
            let slot = if pooled {
                match self.pool.acquire(avoid, max_attempts).await {
                    Ok(slot) => Some(slot),
                    Err(resting) => {
                        spent.attempts -= 1;
                        spent.wait_time += waited.elapsed();
                        let error = all_resting(stage, spent.attempts, &last, resting.next);
                        return Err(ExchangeError { error, spent });
                    }
                }
            } else {
                None
            };
            let reservation = match self.limiter.acquire(est_tokens).await {
                Ok(r) => r,
                Err(error) => {
                    let error = LlmError::from(error);
                    return Err(ExchangeError { error, spent });
                }
            };
            spent.wait_time += waited.elapsed();
            // The budget runs from the first send, not while this call
            // waited for a slot or the budget: an attempt gets what is left.
            let Some(timeout) = self.attempt_timeout(clock) else {
                let last = clock.map(CallClock::past_budget).unwrap_or_default();
                let attempts = spent.attempts - 1;
                let error = LlmError::Exhausted {
                    stage,
                    attempts,
                    last,
                };
                return Err(ExchangeError { error, spent });
            };
            let (url, served) = self.target(slot.as_ref(), endpoint);
            spent.endpoint = Some(served);
            let started = Instant::now();
            let outcome = self.send_once(&url, body, timeout).await;
            let took = started.elapsed();
            spent.http_time += took;
            if matches!(
                &outcome,
                Ok((429 | 500..=599, ..))
                    | Err(NoReply {
                        timed_out: true,
                        ..
                    })
            ) {
                self.in_flight.record(LoadOutcome::Overloaded);
            }
            drop(permit);
            let verdict = self
                .judge(stage, outcome, &reservation, body_bytes, level)
                .await;
            // A refusal is an answer too: the server is up.
            let failed_on = slot.as_ref().map(Slot::index);
            if let Some(slot) = slot {
                slot.finish(!matches!(verdict, Attempt::Retry(..)));
            }
            let retry_after = match verdict {
                Attempt::Done(body, token_bound) => {
                    self.in_flight.record(LoadOutcome::Replied {
                        tokens: reported_tokens(&body["usage"]["completion_tokens"], token_bound)
                            .unwrap_or(0),
                        took,
                        allowed: timeout,
                    });
                    return Ok(Exchange {
                        body,
                        spent,
                        token_bound,
                    });
                }
                Attempt::Downgrade(error) => {
                    // Not a transient failure: the next attempt uses a
                    // format the server accepts, at once (and this one
                    // does not count).
                    spent.attempts -= 1;
                    return Err(ExchangeError { error, spent });
                }
                Attempt::Fatal(error) => return Err(ExchangeError { error, spent }),
                Attempt::Retry(why, retry_after) => {
                    last = match failed_on.filter(|_| self.pool.len() > 1) {
                        Some(i) => format!("{why} (at {})", self.pool.label(i)),
                        None => why,
                    };
                    retry_after
                }
            };
            if attempts >= max_attempts {
                break;
            }
            if let Some(clock) = clock.filter(|c| c.spent()) {
                last = format!("{last}; {}", clock.past_budget());
                break;
            }
            if let Some(failed) = failed_on {
                avoid = Some(failed);
                // Another endpoint that answers takes the next attempt at
                // once: the backoff and any Retry-After were about the
                // server that failed.
                if self.pool.healthy_other_than(failed) {
                    tracing::debug!(
                        "{stage}: attempt {attempts} failed ({last}); retrying on another endpoint"
                    );
                    continue;
                }
            }
            let wait = match retry_after {
                Some(w) if w > super::retry::MAX_RETRY_AFTER => {
                    let last = format!(
                        "{last}; the server asked to wait {}s, longer than graphloom waits",
                        w.as_secs()
                    );
                    let error = LlmError::Exhausted {
                        stage,
                        attempts,
                        last,
                    };
                    return Err(ExchangeError { error, spent });
                }
                Some(w) => w,
                None => self.backoff(attempts),
            };
            tracing::debug!("{stage}: attempt {attempts} failed ({last}); retrying in {wait:?}");
            tokio::time::sleep(wait).await;
            spent.wait_time += wait;
        }
        let error = LlmError::Exhausted {
            stage,
            attempts: spent.attempts,
            last,
        };
        Err(ExchangeError { error, spent })
    }

    /// One HTTP request: status, body and the server's retry hint, or why
    /// no reply came (never with the URL, which may hold a key).
    async fn send_once(
        &self,
        url: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<(u16, bytes::Bytes, Option<Duration>), NoReply> {
        let sent = self.http.post(url).timeout(timeout).json(body).send().await;
        match sent {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let header = |name: &str| {
                    resp.headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string)
                };
                let retry_after = parse_retry_after(
                    header("retry-after").as_deref(),
                    header("retry-after-ms").as_deref(),
                );
                let streamed = body["stream"] == true
                    && header("content-type").is_some_and(|t| t.starts_with("text/event-stream"));
                if streamed {
                    return read_events(resp)
                        .await
                        .map(|bytes| (status, bytes, retry_after))
                        .map_err(NoReply::other);
                }
                match resp.bytes().await {
                    Ok(bytes) => Ok((status, bytes, retry_after)),
                    Err(e) if e.is_timeout() => Err(NoReply::timed_out(timeout)),
                    Err(e) => Err(NoReply::other(format!(
                        "reading the reply failed: {}",
                        e.without_url()
                    ))),
                }
            }
            Err(e) if e.is_timeout() => Err(NoReply::timed_out(timeout)),
            Err(e) => Err(NoReply::other(format!(
                "request failed: {}",
                error_chain(&e.without_url())
            ))),
        }
    }

    /// What one attempt's outcome means: a reply (its tokens settled with
    /// the limiter), a refusal, a format to downgrade, or a retry.
    async fn judge(
        &self,
        stage: Stage,
        outcome: Result<(u16, bytes::Bytes, Option<Duration>), NoReply>,
        reservation: &super::limiter::Reservation,
        body_bytes: u64,
        level: Option<u8>,
    ) -> Attempt {
        let (status, bytes, retry_after) = match outcome {
            Ok(o) => o,
            // The server may or may not have done the work: keep the
            // reservation, the conservative choice.
            Err(no_reply) => return Attempt::Retry(no_reply.why, None),
        };
        if status == 200 {
            let parsed: Result<Value, _> = if bytes.len() > 256 * 1024 {
                // Large replies are parsed off the I/O threads.
                tokio::task::spawn_blocking(move || serde_json::from_slice(&bytes))
                    .await
                    .unwrap_or_else(|e| Err(serde::de::Error::custom(e.to_string())))
            } else {
                serde_json::from_slice(&bytes)
            };
            return match parsed {
                Ok(value) => {
                    let bound = reservation.tokens.saturating_add(body_bytes);
                    let usage = &value["usage"];
                    let used = reported_tokens(&usage["total_tokens"], bound)
                        .or_else(|| {
                            let p = reported_tokens(&usage["prompt_tokens"], bound)?;
                            let c = reported_tokens(&usage["completion_tokens"], bound);
                            Some(p.saturating_add(c.unwrap_or(0)).min(bound))
                        })
                        .unwrap_or(reservation.tokens);
                    self.limiter.settle(reservation, used);
                    Attempt::Done(value, bound)
                }
                // The server did the work; charge the whole reservation.
                Err(e) => Attempt::Retry(format!("the reply body is not JSON: {e}"), None),
            };
        }
        self.limiter.settle(reservation, 0);
        let text = self.redact(&String::from_utf8_lossy(&bytes));
        let message = error_message(&text);
        if status == 400 && level.is_some_and(|l| self.downgrade_for(&text, l)) {
            return Attempt::Downgrade(LlmError::Refused {
                stage,
                status: 400,
                message: format!("{message} (retrying with a simpler structured-output mode)"),
            });
        }
        match classify(status, &text, retry_after) {
            Verdict::Fatal => Attempt::Fatal(LlmError::Refused {
                stage,
                status,
                message,
            }),
            Verdict::Retry { retry_after } => {
                Attempt::Retry(format!("HTTP {status}: {message}"), retry_after)
            }
        }
    }

    /// Moves structured output one level down when a 400 blames the
    /// response format. Returns whether it did.
    fn downgrade_for(&self, body: &str, used: u8) -> bool {
        let lower = body.to_ascii_lowercase();
        if !(lower.contains("response_format") || lower.contains("json_schema")) || used >= 2 {
            return false;
        }
        // Several calls may be refused at once; only the first moves the
        // level, the others just retry at the level now in effect.
        let moved = self
            .mode
            .compare_exchange(used, used + 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        let current = used;
        if moved {
            tracing::warn!(
                "the model server rejected response_format; using {} from now on",
                if current + 1 == 1 {
                    "json_object"
                } else {
                    "schema-in-prompt"
                }
            );
        }
        true
    }

    fn chat_body(&self, messages: &[Message], schema: &Value, max_tokens: u32, level: u8) -> Value {
        let mut messages = messages.to_vec();
        if level > 0 {
            // Without a schema-constrained decoder the schema goes into the
            // prompt (json_object mode also needs the word JSON there).
            let instruction = format!(
                "Reply with only one JSON value that matches this JSON Schema, and nothing else:\n{schema}"
            );
            match messages.iter_mut().find(|m| m.role == "system") {
                Some(system) => {
                    system.content.push_str("\n\n");
                    system.content.push_str(&instruction);
                }
                None => messages.insert(0, Message::system(instruction)),
            }
        }
        let mut body = json!({
            "model": self.settings.model,
            "messages": messages,
            "temperature": self.settings.temperature,
            "max_tokens": max_tokens,
        });
        match level {
            0 => {
                body["response_format"] = json!({
                    "type": "json_schema",
                    "json_schema": {"name": "reply", "strict": true, "schema": schema},
                });
            }
            1 => body["response_format"] = json!({"type": "json_object"}),
            _ => {}
        }
        self.merge_extra_body(&mut body);
        body
    }

    /// Merges `llm.extra_body` into a chat request body.
    fn merge_extra_body(&self, body: &mut Value) {
        if let Value::Object(map) = body {
            for (k, v) in &self.settings.extra_body {
                map.insert(k.clone(), v.clone());
            }
        }
    }

    /// The error of a replay that found no cached reply, recorded as a
    /// call that sent nothing.
    fn not_cached(&self, stage: Stage, model: &str, item: Option<&String>) -> LlmError {
        let error = LlmError::NotCached { stage };
        self.record(self.row(
            stage,
            model,
            item,
            Usage::default(),
            Spent::default(),
            false,
            Some(&error),
        ));
        error
    }

    fn record(&self, row: LlmCallRow) {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        if !row.cache_hit {
            calls.tokens += (row.prompt_tokens + row.completion_tokens) as u64;
        }
        calls.rows.push(row);
    }

    #[allow(clippy::too_many_arguments)]
    fn row(
        &self,
        stage: Stage,
        model: &str,
        item: Option<&String>,
        usage: Usage,
        spent: Spent,
        cache_hit: bool,
        error: Option<&LlmError>,
    ) -> LlmCallRow {
        LlmCallRow {
            call_id: uuid::Uuid::now_v7().to_string(),
            run_id: self.run_id.clone(),
            stage: stage.into(),
            model: model.to_string(),
            item: item.cloned(),
            prompt_tokens: usage.prompt_tokens as i64,
            completion_tokens: usage.completion_tokens as i64,
            latency_ms: spent.http_time.as_millis() as i64,
            wait_ms: spent.wait_time.as_millis() as i64,
            attempts: spent.attempts as i64,
            cache_hit,
            status: match error {
                None => "ok".to_string(),
                Some(_) => "error".to_string(),
            },
            error: error.map(|e| format!("{}: {}", e.class(), self.redact(&e.to_string()))),
            created_at: Utc::now(),
            endpoint: spent.endpoint.map(|served| match served {
                Served::Pool(i) => self.pool.label(i),
                Served::Embeddings => self.settings.embedding_label.clone(),
            }),
        }
    }

    /// Sends a chat request whose reply must be JSON of type `T`. A reply
    /// that does not parse is sent back once with the parse error; a reply
    /// cut at `max_tokens` fails at once. Every call, hit or miss, success
    /// or failure, becomes one `llm_calls` row.
    pub async fn chat_json<T>(&self, req: ChatRequest) -> Result<ChatReply<T>, LlmError>
    where
        T: DeserializeOwned + JsonSchema,
    {
        self.chat_json_with_schema(req, reply::schema_for::<T>())
            .await
    }

    /// Like [`LlmClient::chat_json`] with a schema built by the caller, for
    /// replies whose allowed values depend on data (type names from the
    /// ontology, entity names from an episode as enums). The schema must
    /// describe JSON that deserialises into `T`.
    pub async fn chat_json_with_schema<T>(
        &self,
        req: ChatRequest,
        schema: Value,
    ) -> Result<ChatReply<T>, LlmError>
    where
        T: DeserializeOwned,
    {
        self.chat_json_with_schema_ref(req, &schema).await
    }

    /// [`LlmClient::chat_json_with_schema`] with a borrowed schema, for
    /// callers that send one schema with many requests.
    pub async fn chat_json_with_schema_ref<T>(
        &self,
        req: ChatRequest,
        schema: &Value,
    ) -> Result<ChatReply<T>, LlmError>
    where
        T: DeserializeOwned,
    {
        let mut level = self.mode.load(Ordering::SeqCst);
        let key_for = |level: u8| {
            cache_key(&ChatKey {
                kind: "chat",
                model: &self.settings.model,
                messages: &req.messages,
                schema,
                level,
                temperature: self.settings.temperature,
                max_tokens: req.max_tokens,
                extra_body: &self.settings.extra_body,
                prompt_version: &req.prompt_version,
            })
        };
        let mut key = key_for(level);
        let entry = match &self.cache {
            Some(cache) => cache.get(&key).await,
            None => None,
        };
        let unusable = match entry {
            Some(entry) => match self.cached_reply(&req, entry, schema) {
                Ok(hit) => return Ok(hit),
                Err(content) => Some(content),
            },
            None => None,
        };
        if self.replay_only() {
            return Err(self.not_cached(req.stage, &self.settings.model, req.item.as_ref()));
        }
        if let Some(queue) = &self.batch {
            // A batch answer that neither parses nor salvages is final:
            // asking the same request again would get the same answer.
            if let Some(content) = unusable {
                let error = LlmError::InvalidReply {
                    stage: req.stage,
                    reason: "the Batch API's answer does not match the expected JSON".into(),
                    excerpt: reply::excerpt(&content, 200),
                };
                self.record(self.row(
                    req.stage,
                    &self.settings.model,
                    req.item.as_ref(),
                    Usage::default(),
                    Spent::default(),
                    true,
                    Some(&error),
                ));
                return Err(error);
            }
            return Err(queue.defer(QueuedRequest {
                custom_id: key,
                stage: req.stage,
                item: req.item.clone(),
                endpoint: Endpoint::Chat,
                model: self.settings.model.clone(),
                body: self.chat_body(&req.messages, schema, req.max_tokens, level),
                keys: Vec::new(),
            }));
        }

        self.warm_up(&req).await;
        let (clock, mut messages) = (CallClock::new(req.budget), req.messages.clone());
        let mut usage = Usage::default();
        let mut spent = Spent::default();
        let mut repaired = false;
        let result: Result<(T, String, Vec<String>), LlmError> = loop {
            let mut body = self.chat_body(&messages, schema, req.max_tokens, level);
            if self.settings.stream {
                // Not in chat_body: a Batch API request cannot stream.
                body["stream"] = json!(true);
                body["stream_options"] = json!({"include_usage": true});
            }
            let est = estimate_tokens(&messages) + req.max_tokens as u64;
            let exchange = match self
                .exchange(
                    req.stage,
                    "chat/completions",
                    &body,
                    est,
                    Some(level),
                    Some(&clock),
                )
                .await
            {
                Ok(x) => x,
                Err(e) => {
                    spent += e.spent;
                    let now = self.mode.load(Ordering::SeqCst);
                    if now > level && matches!(e.error, LlmError::Refused { status: 400, .. }) {
                        level = now;
                        key = key_for(level);
                        continue;
                    }
                    break Err(e.error);
                }
            };
            spent += exchange.spent;
            let b = &exchange.body;
            let bound = exchange.token_bound;
            usage.prompt_tokens = usage.prompt_tokens.saturating_add(
                reported_tokens(&b["usage"]["prompt_tokens"], bound)
                    .unwrap_or_else(|| estimate_tokens(&messages)),
            );
            let content = b["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            usage.completion_tokens = usage.completion_tokens.saturating_add(
                reported_tokens(&b["usage"]["completion_tokens"], bound)
                    .unwrap_or_else(|| (content.chars().count() as u64).div_ceil(4)),
            );
            let finish = &b["choices"][0]["finish_reason"];
            if finish == "length" || finish == STOPPED_REPEATING {
                // The items completed before the cut are kept; asking
                // again would run into the same bound (or loop).
                break match reply::parse_cut::<T>(&content, schema) {
                    Ok((value, dropped)) => Ok((value, content, dropped)),
                    Err(_) => Err(LlmError::Truncated {
                        stage: req.stage,
                        max_tokens: req.max_tokens,
                        excerpt: reply::excerpt(&content, 200),
                    }),
                };
            }
            match reply::parse_within::<T>(&content, schema) {
                Ok((value, dropped)) => break Ok((value, content, dropped)),
                Err(reason) if !repaired => {
                    repaired = true;
                    tracing::debug!(
                        "{}: reply does not parse ({reason}); asking once more",
                        req.stage
                    );
                    messages.push(Message::assistant(content));
                    messages.push(Message::user(format!(
                        "Your reply could not be used: {reason}. Reply again with only the JSON value, matching the schema exactly."
                    )));
                }
                Err(reason) => {
                    break Err(LlmError::InvalidReply {
                        stage: req.stage,
                        reason,
                        excerpt: reply::excerpt(&content, 200),
                    });
                }
            }
        };
        self.finish(&req, &key, result, usage, spent).await
    }

    /// A cached reply to `req` that still parses within `schema`, recorded
    /// as a hit; else the entry's content.
    fn cached_reply<T: DeserializeOwned>(
        &self,
        req: &ChatRequest,
        hit: CachedReply,
        schema: &Value,
    ) -> Result<ChatReply<T>, String> {
        // A cached reply that was cut is salvaged again, with its note.
        let Some(content) = hit.content.as_str() else {
            return Err(hit.content.to_string());
        };
        let (value, dropped) = reply::parse_within::<T>(content, schema)
            .or_else(|_| reply::parse_cut::<T>(content, schema))
            .map_err(|_| content.to_string())?;
        let usage = Usage {
            prompt_tokens: hit.prompt_tokens,
            completion_tokens: hit.completion_tokens,
        };
        self.record(self.row(
            req.stage,
            &hit.model,
            req.item.as_ref(),
            usage,
            Spent::default(),
            true,
            None,
        ));
        Ok(ChatReply {
            value,
            usage,
            cache_hit: true,
            attempts: 0,
            dropped,
        })
    }

    /// Caches a good reply under `key` and records the call either way.
    async fn finish<T>(
        &self,
        req: &ChatRequest,
        key: &str,
        result: Result<(T, String, Vec<String>), LlmError>,
        usage: Usage,
        spent: Spent,
    ) -> Result<ChatReply<T>, LlmError> {
        let error = result.as_ref().err();
        let row = self.row(
            req.stage,
            &self.settings.model,
            req.item.as_ref(),
            usage,
            spent,
            false,
            error,
        );
        let (value, content, dropped) = match result {
            Ok(good) => good,
            Err(error) => {
                self.record(row);
                return Err(error);
            }
        };
        if let Some(cache) = &self.cache {
            let reply = CachedReply {
                content: Value::String(content),
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
                model: self.settings.model.clone(),
            };
            cache.put(key, &reply).await;
        }
        self.record(row);
        Ok(ChatReply {
            value,
            usage,
            cache_hit: false,
            attempts: spent.attempts,
            dropped,
        })
    }

    /// The cached vector of each key, where the cache has one, and the
    /// indices of the keys it has none for.
    async fn cached_vectors(&self, keys: &[String]) -> (Vec<Option<Vec<f32>>>, Vec<usize>) {
        let mut out: Vec<Option<Vec<f32>>> = vec![None; keys.len()];
        let mut missing = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let hit = match &self.cache {
                Some(cache) => cache.get(key).await,
                None => None,
            };
            match hit.and_then(|h| serde_json::from_value::<Vec<f32>>(h.content).ok()) {
                Some(v) => out[i] = Some(v),
                None => missing.push(i),
            }
        }
        (out, missing)
    }

    /// Embeds texts through `/embeddings` (64 texts per request), with the
    /// same limiter, retries and cache as chat calls. One `llm_calls` row
    /// per request.
    pub async fn embed(&self, stage: Stage, texts: &[String]) -> Result<Vec<Vec<f32>>, LlmError> {
        let model = self.settings.embedding_model.clone();
        let keys: Vec<String> = texts
            .iter()
            .map(|t| {
                cache_key(&EmbeddingKey {
                    kind: "embedding",
                    model: &model,
                    input: t,
                })
            })
            .collect();
        let (mut out, missing) = self.cached_vectors(&keys).await;
        let hits = texts.len() - missing.len();
        if !missing.is_empty() && self.replay_only() {
            let item = format!("{} texts", missing.len());
            return Err(self.not_cached(stage, &model, Some(&item)));
        }
        if let Some(queue) = self.batch.as_ref().filter(|_| !missing.is_empty()) {
            // One queued request per chunk, as a sync run would send; a
            // chunk whose attempts ran out fails the call.
            let mut outcome = LlmError::Deferred { stage };
            for chunk in missing.chunks(EMBED_BATCH) {
                let input: Vec<&str> = chunk.iter().map(|i| texts[*i].as_str()).collect();
                let chunk_keys: Vec<String> = chunk.iter().map(|i| keys[*i].clone()).collect();
                let error = queue.defer(QueuedRequest {
                    custom_id: cache_key(&chunk_keys),
                    stage,
                    item: Some(format!("{} texts", input.len())),
                    endpoint: Endpoint::Embeddings,
                    model: model.clone(),
                    body: json!({"model": model, "input": input}),
                    keys: chunk_keys,
                });
                if !error.is_deferred() {
                    outcome = error;
                }
            }
            return Err(outcome);
        }
        if hits > 0 {
            self.record(self.row(
                stage,
                &model,
                Some(&format!("{hits} cached texts")),
                Usage::default(),
                Spent::default(),
                true,
                None,
            ));
        }
        for chunk in missing.chunks(EMBED_BATCH) {
            let input: Vec<&str> = chunk.iter().map(|i| texts[*i].as_str()).collect();
            let est = input
                .iter()
                .map(|t| (t.chars().count() as u64).div_ceil(3) + 1)
                .sum::<u64>();
            let body = json!({"model": model, "input": input});
            let item = Some(format!("{} texts", input.len()));
            let exchange = match self
                .exchange(stage, "embeddings", &body, est, None, None)
                .await
            {
                Ok(x) => x,
                Err(e) => {
                    self.record(self.row(
                        stage,
                        &model,
                        item.as_ref(),
                        Usage::default(),
                        e.spent,
                        false,
                        Some(&e.error),
                    ));
                    return Err(e.error);
                }
            };
            let prompt_tokens = reported_tokens(
                &exchange.body["usage"]["prompt_tokens"],
                exchange.token_bound,
            )
            .unwrap_or(est);
            let data = exchange.body["data"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut vectors: Vec<Option<Vec<f32>>> = vec![None; chunk.len()];
            for d in data {
                let index = d["index"].as_u64().unwrap_or(u64::MAX) as usize;
                if let (Some(slot), Ok(v)) = (
                    vectors.get_mut(index),
                    serde_json::from_value::<Vec<f32>>(d["embedding"].clone()),
                ) {
                    *slot = Some(v);
                }
            }
            // One llm_calls row per request, failed or not.
            let error = vectors
                .iter()
                .any(Option::is_none)
                .then(|| LlmError::InvalidReply {
                    stage,
                    reason: format!(
                        "the server returned {} of {} embeddings",
                        vectors.iter().flatten().count(),
                        chunk.len()
                    ),
                    excerpt: reply::excerpt(&exchange.body.to_string(), 200),
                });
            self.record(self.row(
                stage,
                &model,
                item.as_ref(),
                Usage {
                    prompt_tokens,
                    completion_tokens: 0,
                },
                exchange.spent,
                false,
                error.as_ref(),
            ));
            if let Some(error) = error {
                return Err(error);
            }
            let per_text = prompt_tokens / chunk.len().max(1) as u64;
            for (slot, vector) in chunk.iter().zip(vectors.into_iter().flatten()) {
                if let Some(cache) = &self.cache {
                    cache
                        .put(
                            &keys[*slot],
                            &CachedReply {
                                content: json!(vector),
                                prompt_tokens: per_text,
                                completion_tokens: 0,
                                model: model.clone(),
                            },
                        )
                        .await;
                }
                out[*slot] = Some(vector);
            }
        }
        Ok(out.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// Calls and tokens so far, for progress displays.
    pub fn progress(&self) -> (usize, u64) {
        let calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        (calls.rows.len(), calls.tokens)
    }

    /// The accounting rows so far, leaving none behind.
    pub fn take_calls(&self) -> Vec<LlmCallRow> {
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(|p| p.into_inner())).rows
    }

    /// Totals over `rows` with this client's prices.
    pub fn totals(&self, rows: &[LlmCallRow]) -> LlmTotals {
        let mut t = LlmTotals {
            calls: rows.len() as u64,
            ..LlmTotals::default()
        };
        let mut cost = 0.0;
        let (pp, pc) = (
            self.settings.price_prompt.unwrap_or(0.0),
            self.settings.price_completion.unwrap_or(0.0),
        );
        for r in rows {
            if r.cache_hit {
                t.cache_hits += 1;
            } else {
                t.prompt_tokens += r.prompt_tokens as u64;
                t.completion_tokens += r.completion_tokens as u64;
                // Batch answers cost the batch price.
                let factor = if super::batch::is_batch_row(r) {
                    self.settings.batch_price_factor
                } else {
                    1.0
                };
                cost += factor
                    * (r.prompt_tokens as f64 / 1e6 * pp + r.completion_tokens as f64 / 1e6 * pc);
            }
        }
        if self.settings.price_prompt.is_some() || self.settings.price_completion.is_some() {
            t.cost_usd = Some(cost);
        }
        t
    }
}

/// The `finish_reason` of a streamed reply that [`read_events`] stopped
/// because it began to repeat its items.
const STOPPED_REPEATING: &str = "repeating";

/// Reads a streamed chat completion (server-sent events of
/// `chat.completion.chunk`s) into the body of one `chat.completion`, so
/// that the rest of the client reads it as it reads any reply. A reply
/// that begins to repeat its items ([`reply::RepeatWatch`]) is stopped
/// there: dropping the response closes the connection, which tells the
/// server to stop writing. Its `finish_reason` is then
/// [`STOPPED_REPEATING`] and its completion tokens are the chunks read
/// (one token each from llama.cpp and vLLM).
async fn read_events(mut resp: reqwest::Response) -> Result<bytes::Bytes, String> {
    let mut pending: Vec<u8> = Vec::new();
    let mut content = String::new();
    let (mut finish, mut usage, mut chunks) = (Value::Null, Value::Null, 0u64);
    let mut watch = reply::RepeatWatch::default();
    'read: loop {
        let chunk = match resp.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(e) if e.is_timeout() => return Err("the streamed reply did not end in time".into()),
            Err(e) => return Err(format!("reading the reply failed: {}", e.without_url())),
        };
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:").map(str::trim) else {
                continue;
            };
            if data == "[DONE]" {
                break 'read;
            }
            let event: Value = serde_json::from_str(data)
                .map_err(|e| format!("a streamed event is not JSON: {e}"))?;
            if let Some(message) = event["error"]["message"].as_str() {
                return Err(format!("the server failed mid-reply: {message}"));
            }
            let choice = &event["choices"][0];
            if let Some(piece) = choice["delta"]["content"].as_str() {
                content.push_str(piece);
                chunks += 1;
            }
            if choice["finish_reason"].is_string() {
                finish = choice["finish_reason"].clone();
            }
            if event["usage"].is_object() {
                usage = event["usage"].clone();
            }
            if finish.is_null() && watch.feed(&content) {
                tracing::debug!("a reply began to repeat its items; stopped after {chunks} chunks");
                finish = json!(STOPPED_REPEATING);
                usage = json!({"completion_tokens": chunks});
                break 'read;
            }
        }
    }
    let body = json!({
        "object": "chat.completion",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": finish,
        }],
        "usage": usage,
    });
    Ok(bytes::Bytes::from(body.to_string()))
}

/// The message of an OpenAI-style error body, or the body's start.
fn error_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| {
            v["error"]["message"]
                .as_str()
                .map(str::to_string)
                .or_else(|| v["error"].as_str().map(str::to_string))
        })
        .unwrap_or_else(|| reply::excerpt(body.trim(), 200))
}

/// An error and its causes on one line (reqwest's own message is terse).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        cur = s.source();
    }
    parts.join(": ")
}

/// Shared handle to a run's client.
pub type SharedClient = Arc<LlmClient>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_are_those_of_the_json_objects_they_were_first_written_as() {
        let messages = vec![
            Message::system("Rules:\n- \"quoted\", tabs\t, ünïcödé → and \u{1f600}"),
            Message::user("<CURRENT EPISODE kind=\"message\">\nhi\n</CURRENT EPISODE>"),
        ];
        let schema =
            json!({"type": "object", "properties": {"a": {"type": "string", "enum": ["x", "y"]}}});
        let mut extra = serde_json::Map::new();
        extra.insert("cache_prompt".into(), json!(false));
        extra.insert("seed".into(), json!(7));
        for (temperature, level, max_tokens) in [(0.0, 0u8, 1200u32), (0.7, 2, 64), (1.25, 1, 0)] {
            let old = cache_key(&json!({
                "kind": "chat",
                "model": "local-llm",
                "messages": messages,
                "schema": schema,
                "level": level,
                "temperature": temperature,
                "max_tokens": max_tokens,
                "extra_body": extra,
                "prompt_version": "extract-v1",
            }));
            let new = cache_key(&ChatKey {
                kind: "chat",
                model: "local-llm",
                messages: &messages,
                schema: &schema,
                level,
                temperature,
                max_tokens,
                extra_body: &extra,
                prompt_version: "extract-v1",
            });
            assert_eq!(old, new);
        }
        assert_eq!(
            cache_key(&json!({"kind": "embedding", "model": "m", "input": "Acme \"Corp\""})),
            cache_key(&EmbeddingKey {
                kind: "embedding",
                model: "m",
                input: "Acme \"Corp\"",
            })
        );
        // And the streamed hash is the hash of the string.
        let v = json!({"k": "v"});
        assert_eq!(
            cache_key(&v),
            blake3::hash(v.to_string().as_bytes()).to_hex().to_string()
        );
    }
}
