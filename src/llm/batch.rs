//! Batch mode (`llm.mode = "batch"`): calls go to the OpenAI or Azure
//! OpenAI Batch API instead of one HTTP request each.
//!
//! A run in batch mode goes in rounds. In each round the pipeline runs as
//! usual against the response cache; a call the cache cannot answer is
//! *queued* ([`BatchQueue`]) and fails with [`LlmError::Deferred`], and the
//! run stops after the first stage that queued anything (later stages
//! would ask questions built on missing answers). The queued calls are
//! written as JSONL input files (split at the provider's per-file limits),
//! uploaded, submitted and recorded in the [`Ledger`] before anything
//! waits; the batches are polled with backoff until they end, and their
//! answers go into the response cache. The next round then gets further:
//! one round per stage level (entities, each subtype level, facts, …),
//! and the last round, answered wholly from the cache, commits.
//!
//! The ledger (`_graphloom/batches/` under the graph) is what makes this
//! resumable: a run killed while waiting, or started with `--no-wait`,
//! leaves its batches there, and the next run polls them instead of
//! submitting the same calls again. A request that failed (a line of the
//! error file, or a batch that failed, expired or was cancelled before
//! answering it) is queued again by the next round, at most
//! `llm.batch.max_attempts` times; then the call fails like a sync call
//! that ran out of attempts, and its item becomes a `failures` row.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::auth::{ApiKey, auth_headers, redact};
use super::cache::{CachedReply, ResponseCache};
use super::error::LlmError;
use crate::rows::LlmCallRow;
use crate::spec::{ApiStyle, BatchSpec, LlmSpec};
use crate::stage::Stage;

/// The API a queued call goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// Chat completions.
    Chat,
    /// Embeddings.
    Embeddings,
}

impl Endpoint {
    /// The endpoint as the provider names it in input lines and in the
    /// batch (`/v1/chat/completions`; Azure: `/chat/completions`).
    fn path(self, style: ApiStyle) -> &'static str {
        match (self, style) {
            (Endpoint::Chat, ApiStyle::Azure) => "/chat/completions",
            (Endpoint::Embeddings, ApiStyle::Azure) => "/embeddings",
            (Endpoint::Chat, _) => "/v1/chat/completions",
            (Endpoint::Embeddings, _) => "/v1/embeddings",
        }
    }
}

/// A call waiting for the next submission.
#[derive(Debug, Clone)]
pub struct QueuedRequest {
    /// Its `custom_id`: the cache key of a chat call, or the hash of the
    /// keys of an embeddings request's texts.
    pub custom_id: String,
    /// Stage that made it.
    pub stage: Stage,
    /// What it is about (an episode id), for accounting.
    pub item: Option<String>,
    /// Chat or embeddings.
    pub endpoint: Endpoint,
    /// The model (Azure: the batch deployment) it names.
    pub model: String,
    /// The request body, as a sync call would send it.
    pub body: Value,
    /// Embeddings: the cache key of each input text, in input order.
    pub keys: Vec<String>,
}

/// The calls of one round that the cache could not answer. Shared by the
/// run's client (which fills it) and the run (which submits it).
#[derive(Debug, Default)]
pub struct BatchQueue {
    queued: Mutex<BTreeMap<String, QueuedRequest>>,
    /// Calls deferred this round, queued or already in flight.
    deferred: AtomicUsize,
    /// Requests of batches that have not ended: deferred, not queued.
    in_flight: HashSet<String>,
    /// Failed attempts per request so far, with the last reason.
    failed: HashMap<String, (u32, String)>,
    max_attempts: u32,
}

impl BatchQueue {
    /// A queue for one round, knowing what the ledger holds: requests of
    /// batches still running are not queued again, and failures count
    /// against `max_attempts` until a run commits.
    pub fn new(records: &[BatchRecord], max_attempts: u32) -> Self {
        let mut in_flight = HashSet::new();
        let mut failed: HashMap<String, (u32, String)> = HashMap::new();
        for r in records {
            if r.ended_at.is_none() {
                in_flight.extend(r.requests.iter().map(|q| q.custom_id.clone()));
                continue;
            }
            // A committed run's failures are its `failures` rows; the
            // next run tries those requests afresh, as sync mode does.
            if r.accounted_by.is_some() {
                continue;
            }
            for (id, why) in &r.failed {
                let e = failed.entry(id.clone()).or_default();
                e.0 += 1;
                e.1 = why.clone();
            }
        }
        BatchQueue {
            queued: Mutex::default(),
            deferred: AtomicUsize::new(0),
            in_flight,
            failed,
            max_attempts: max_attempts.max(1),
        }
    }

    /// Queues `request` (unless it is in flight) and returns the error its
    /// caller gets now: [`LlmError::Deferred`], or [`LlmError::Exhausted`]
    /// when it has failed in `max_attempts` batches already.
    pub(crate) fn defer(&self, request: QueuedRequest) -> LlmError {
        if let Some((n, why)) = self.failed.get(&request.custom_id)
            && *n >= self.max_attempts
        {
            return LlmError::Exhausted {
                stage: request.stage,
                attempts: *n,
                last: format!("Batch API: {why}"),
            };
        }
        let stage = request.stage;
        self.deferred.fetch_add(1, Ordering::SeqCst);
        if !self.in_flight.contains(&request.custom_id) {
            self.queued
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(request.custom_id.clone(), request);
        }
        LlmError::Deferred { stage }
    }

    /// Calls deferred so far this round (queued or waiting on a batch in
    /// flight).
    pub fn deferred(&self) -> usize {
        self.deferred.load(Ordering::SeqCst)
    }

    /// The queued calls, leaving none.
    pub fn take(&self) -> Vec<QueuedRequest> {
        std::mem::take(&mut *self.queued.lock().unwrap_or_else(|p| p.into_inner()))
            .into_values()
            .collect()
    }
}

/// A request as the ledger keeps it (no body: a call is rebuilt by the
/// pipeline, which makes the same request again).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// Its `custom_id`.
    pub custom_id: String,
    /// Stage that made it.
    pub stage: String,
    /// What it is about.
    pub item: Option<String>,
    /// Embeddings: the cache keys of its texts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
}

/// Tokens of an answered request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answered {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
}

/// One submitted input file and its batch, as the ledger keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchRecord {
    /// The ledger entry's name (also sent as the batch's
    /// `metadata.graphloom`, to find a batch whose id was never recorded).
    pub name: String,
    /// The provider's batch id; None until the create call answered.
    pub batch_id: Option<String>,
    /// The uploaded input file.
    pub input_file_id: String,
    /// Chat or embeddings.
    pub endpoint: Endpoint,
    /// The model the lines name.
    pub model: String,
    /// When it was recorded.
    pub submitted_at: DateTime<Utc>,
    /// The provider's last status (`validating`, `in_progress`, …).
    pub status: String,
    /// Its requests.
    pub requests: Vec<RecordedRequest>,
    /// When it ended (completed, failed, expired or cancelled) and its
    /// files were collected.
    pub ended_at: Option<DateTime<Utc>>,
    /// Answered requests and their tokens.
    #[serde(default)]
    pub answered: BTreeMap<String, Answered>,
    /// Requests without an answer, and why.
    #[serde(default)]
    pub failed: BTreeMap<String, String>,
    /// The run whose commit holds its `llm_calls` rows.
    pub accounted_by: Option<String>,
}

impl BatchRecord {
    /// Requests per stage.
    pub fn stages(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for r in &self.requests {
            *out.entry(r.stage.clone()).or_default() += 1;
        }
        out
    }

    /// `llm_calls` rows for its answered and failed requests (`call_id`
    /// `batch:<batch id>:<custom id>`, latency 0, wait = submission to
    /// end).
    pub fn call_rows(&self, run_id: &str) -> Vec<LlmCallRow> {
        let id = self.batch_id.as_deref().unwrap_or(&self.name);
        let ended = self.ended_at.unwrap_or_else(Utc::now);
        let wait = (ended - self.submitted_at).num_milliseconds().max(0);
        self.requests
            .iter()
            .filter_map(|r| {
                let answered = self.answered.get(&r.custom_id);
                let failed = self.failed.get(&r.custom_id);
                if answered.is_none() && failed.is_none() {
                    return None;
                }
                let a = answered.copied().unwrap_or(Answered {
                    prompt_tokens: 0,
                    completion_tokens: 0,
                });
                Some(LlmCallRow {
                    call_id: format!("batch:{id}:{}", r.custom_id),
                    run_id: run_id.to_string(),
                    stage: r.stage.clone(),
                    model: self.model.clone(),
                    item: r.item.clone(),
                    prompt_tokens: a.prompt_tokens as i64,
                    completion_tokens: a.completion_tokens as i64,
                    latency_ms: 0,
                    wait_ms: wait,
                    attempts: 1,
                    cache_hit: false,
                    status: if answered.is_some() { "ok" } else { "error" }.to_string(),
                    error: failed.map(|why| format!("batch: {why}")),
                    created_at: ended,
                    // The Batch API is one service, not a pool's server.
                    endpoint: None,
                })
            })
            .collect()
    }
}

/// Whether an `llm_calls` row is a Batch API answer.
pub fn is_batch_row(row: &LlmCallRow) -> bool {
    row.call_id.starts_with("batch:")
}

/// Errors of batch mode.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// An HTTP exchange with the Batch API failed.
    #[error("Batch API: {what}: {message}")]
    Api {
        /// What graphloom was doing.
        what: String,
        /// Why it failed (never with the key).
        message: String,
    },
    /// The ledger could not be read or written.
    #[error("batch ledger at {location}: {message}")]
    Ledger {
        /// Where the ledger lives.
        location: String,
        /// Why.
        message: String,
    },
    /// Setting up failed.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// The ledger location is unusable.
    #[error(transparent)]
    Location(#[from] crate::objstore::LocationError),
}

type Result<T, E = BatchError> = std::result::Result<T, E>;

/// The batches of one graph: one JSON object per submitted input file
/// under `_graphloom/batches/`, each written whole by a single put.
#[derive(Debug, Clone)]
pub struct Ledger {
    store: std::sync::Arc<dyn ObjectStore>,
    prefix: Path,
    location: String,
}

impl Ledger {
    /// The ledger of the graph at `graph` (its URL, ending in `/`).
    pub fn open(graph: &str, options: &BTreeMap<String, String>) -> Result<Self> {
        let url = crate::objstore::parse_dir_url(graph)?;
        let store = crate::objstore::store_for(&url, options)?;
        Ok(Self::in_graph(store, &url))
    }

    /// The ledger of the graph at `graph` in `store`, the object store
    /// the graph's tables are in.
    pub fn in_graph(store: std::sync::Arc<dyn ObjectStore>, graph: &url::Url) -> Self {
        Ledger {
            prefix: crate::objstore::path_of(graph)
                .join("_graphloom")
                .join("batches"),
            location: format!("{}_graphloom/batches/", crate::objstore::redacted(graph)),
            store,
        }
    }

    fn err(&self, e: impl std::fmt::Display) -> BatchError {
        BatchError::Ledger {
            location: self.location.clone(),
            message: e.to_string(),
        }
    }

    /// Every record, oldest first.
    pub async fn list(&self) -> Result<Vec<BatchRecord>> {
        use futures::TryStreamExt;
        let metas: Vec<_> = self
            .store
            .list(Some(&self.prefix))
            .try_collect()
            .await
            .map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(metas.len());
        for m in metas {
            if !m.location.as_ref().ends_with(".json") {
                continue;
            }
            let bytes = self
                .store
                .get(&m.location)
                .await
                .map_err(|e| self.err(e))?
                .bytes()
                .await
                .map_err(|e| self.err(e))?;
            let record: BatchRecord = serde_json::from_slice(&bytes)
                .map_err(|e| self.err(format!("{}: {e}", m.location)))?;
            out.push(record);
        }
        out.sort_by(|a, b| (a.submitted_at, &a.name).cmp(&(b.submitted_at, &b.name)));
        Ok(out)
    }

    /// Writes (or replaces) a record.
    pub async fn put(&self, record: &BatchRecord) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| self.err(e))?;
        let path = self.prefix.clone().join(format!("{}.json", record.name));
        self.store
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }
}

/// The Batch API of the spec's provider: files and batches.
pub struct BatchApi {
    http: reqwest::Client,
    /// Only to redact it from what the provider sends back.
    key: Option<ApiKey>,
    base: String,
    embedding_base: String,
    style: ApiStyle,
    api_version: Option<String>,
    spec: BatchSpec,
}

impl std::fmt::Debug for BatchApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchApi")
            .field("base", &self.base)
            .field("style", &self.style)
            .finish_non_exhaustive()
    }
}

/// Where the Batch API of an Azure deployment URL lives: its resource's
/// `/openai` (an `/openai/v1` base is used as it is).
fn batch_base(base: &str, style: ApiStyle) -> String {
    let base = base.trim_end_matches('/');
    match style {
        ApiStyle::Azure => match base.find("/openai/deployments/") {
            Some(at) => base[..at + "/openai".len()].to_string(),
            None => base.to_string(),
        },
        _ => base.to_string(),
    }
}

impl BatchApi {
    /// The API of `llm` (its base URL, key, style and `[llm.batch]`).
    pub fn new(llm: &LlmSpec) -> Result<Self> {
        Self::with_key(llm, ApiKey::from_env(&llm.api_key_env))
    }

    /// [`BatchApi::new`] with an explicit key.
    pub fn with_key(llm: &LlmSpec, key: Option<ApiKey>) -> Result<Self> {
        let http = reqwest::Client::builder()
            .default_headers(auth_headers(llm.api_style, key.as_ref())?)
            .build()
            .map_err(|e| LlmError::Setup(e.without_url().to_string()))?;
        Ok(BatchApi {
            http,
            key,
            base: batch_base(&llm.base_url, llm.api_style),
            embedding_base: batch_base(
                llm.embedding_base_url
                    .as_deref()
                    .unwrap_or(llm.primary_base_url()),
                llm.api_style,
            ),
            style: llm.api_style,
            api_version: llm.azure_api_version.clone(),
            spec: llm.batch.clone(),
        })
    }

    fn url(&self, endpoint: Endpoint, path: &str) -> String {
        let base = match endpoint {
            Endpoint::Chat => &self.base,
            Endpoint::Embeddings => &self.embedding_base,
        };
        match (self.style, &self.api_version) {
            // The v1 Azure API takes no api-version.
            (ApiStyle::Azure, Some(v)) if !base.ends_with("/v1") => {
                format!("{base}{path}?api-version={v}")
            }
            _ => format!("{base}{path}"),
        }
    }

    /// Sends a request, retrying 429 and 5xx answers and failed
    /// connections a few times with backoff; returns the 200 body.
    async fn send(
        &self,
        what: &str,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<bytes::Bytes> {
        const ATTEMPTS: u32 = 5;
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            let outcome = build().timeout(Duration::from_secs(300)).send().await;
            let retry_after = match outcome {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let retry_after = resp
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<f64>().ok())
                        .map(|s| Duration::from_secs_f64(s.clamp(0.0, 60.0)));
                    let body = resp.bytes().await.map_err(|e| BatchError::Api {
                        what: what.to_string(),
                        message: e.without_url().to_string(),
                    })?;
                    if status == 200 {
                        return Ok(body);
                    }
                    let text = String::from_utf8_lossy(&body);
                    let message = serde_json::from_str::<Value>(&text)
                        .ok()
                        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                        .unwrap_or_else(|| text.chars().take(300).collect());
                    last = redact(self.key.as_ref(), &format!("HTTP {status}: {message}"));
                    if status != 429 && status < 500 {
                        break;
                    }
                    retry_after
                }
                Err(e) => {
                    last = e.without_url().to_string();
                    None
                }
            };
            if attempt < ATTEMPTS {
                let wait = retry_after
                    .unwrap_or_else(|| Duration::from_millis(500 * 2u64.pow(attempt - 1)));
                tracing::debug!("Batch API: {what}: {last}; retrying in {wait:?}");
                tokio::time::sleep(wait).await;
            }
        }
        Err(BatchError::Api {
            what: what.to_string(),
            message: last,
        })
    }

    async fn json(&self, what: &str, build: impl Fn() -> reqwest::RequestBuilder) -> Result<Value> {
        let body = self.send(what, build).await?;
        serde_json::from_slice(&body).map_err(|e| BatchError::Api {
            what: what.to_string(),
            message: format!("the answer is not JSON: {e}"),
        })
    }

    /// Uploads a JSONL input file; returns its id.
    pub async fn upload(&self, endpoint: Endpoint, name: &str, jsonl: Vec<u8>) -> Result<String> {
        let url = self.url(endpoint, "/files");
        let v = self
            .json(&format!("uploading {name}"), || {
                let part = reqwest::multipart::Part::bytes(jsonl.clone())
                    .file_name(name.to_string())
                    .mime_str("application/jsonl")
                    .expect("a valid MIME type");
                let form = reqwest::multipart::Form::new()
                    .text("purpose", "batch")
                    .part("file", part);
                self.http.post(&url).multipart(form)
            })
            .await?;
        id_of(&v, "uploading an input file")
    }

    /// Creates a batch over an uploaded file.
    pub async fn create(&self, endpoint: Endpoint, file_id: &str, name: &str) -> Result<Value> {
        let url = self.url(endpoint, "/batches");
        let body = json!({
            "input_file_id": file_id,
            "endpoint": endpoint.path(self.style),
            "completion_window": self.spec.completion_window,
            "metadata": {"graphloom": name},
        });
        self.json("creating a batch", || self.http.post(&url).json(&body))
            .await
    }

    /// A batch's current state.
    pub async fn retrieve(&self, endpoint: Endpoint, batch_id: &str) -> Result<Value> {
        let url = self.url(endpoint, &format!("/batches/{batch_id}"));
        self.json(&format!("polling batch {batch_id}"), || self.http.get(&url))
            .await
    }

    /// Asks the provider to cancel a batch.
    pub async fn cancel(&self, endpoint: Endpoint, batch_id: &str) -> Result<Value> {
        let url = self.url(endpoint, &format!("/batches/{batch_id}/cancel"));
        self.json(&format!("cancelling batch {batch_id}"), || {
            self.http.post(&url)
        })
        .await
    }

    /// The newest batches (up to 100), to find one whose id was never
    /// recorded.
    pub async fn list(&self, endpoint: Endpoint) -> Result<Vec<Value>> {
        let url = self.url(endpoint, "/batches");
        let v = self
            .json("listing batches", || {
                self.http.get(&url).query(&[("limit", "100")])
            })
            .await?;
        Ok(v["data"].as_array().cloned().unwrap_or_default())
    }

    /// A file's content.
    pub async fn content(&self, endpoint: Endpoint, file_id: &str) -> Result<bytes::Bytes> {
        let url = self.url(endpoint, &format!("/files/{file_id}/content"));
        self.send(&format!("downloading file {file_id}"), || {
            self.http.get(&url)
        })
        .await
    }
}

fn id_of(v: &Value, what: &str) -> Result<String> {
    v["id"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .ok_or_else(|| BatchError::Api {
            what: what.to_string(),
            message: format!("the answer has no id: {}", excerpt(v)),
        })
}

fn excerpt(v: &Value) -> String {
    v.to_string().chars().take(200).collect()
}

/// One input file: its endpoint, model, requests and JSONL bytes.
pub type InputFile = (Endpoint, String, Vec<QueuedRequest>, Vec<u8>);

/// Input files for `requests`: one per endpoint and model, split so that
/// none holds more than `max_requests` lines or `max_bytes` bytes. A
/// request too large for any file is returned apart, with its size.
pub fn input_files(
    requests: Vec<QueuedRequest>,
    style: ApiStyle,
    max_requests: usize,
    max_bytes: u64,
) -> (Vec<InputFile>, Vec<(QueuedRequest, usize)>) {
    let mut groups: BTreeMap<(Endpoint, String), Vec<QueuedRequest>> = BTreeMap::new();
    for r in requests {
        groups
            .entry((r.endpoint, r.model.clone()))
            .or_default()
            .push(r);
    }
    let mut files = Vec::new();
    let mut too_large = Vec::new();
    for ((endpoint, model), group) in groups {
        let mut lines: Vec<QueuedRequest> = Vec::new();
        let mut bytes: Vec<u8> = Vec::new();
        for r in group {
            let mut line = serde_json::to_vec(&json!({
                "custom_id": r.custom_id,
                "method": "POST",
                "url": endpoint.path(style),
                "body": r.body,
            }))
            .expect("JSON values serialise");
            line.push(b'\n');
            if line.len() as u64 > max_bytes {
                let n = line.len();
                too_large.push((r, n));
                continue;
            }
            if !lines.is_empty()
                && (lines.len() >= max_requests || (bytes.len() + line.len()) as u64 > max_bytes)
            {
                files.push((
                    endpoint,
                    model.clone(),
                    std::mem::take(&mut lines),
                    std::mem::take(&mut bytes),
                ));
            }
            bytes.extend_from_slice(&line);
            lines.push(r);
        }
        if !lines.is_empty() {
            files.push((endpoint, model, lines, bytes));
        }
    }
    (files, too_large)
}

/// Submits `requests`: input files uploaded, each batch recorded in the
/// ledger before it is created and again with its id, so a run killed at
/// any point leaves a record to resume from. Returns the records.
pub async fn submit(
    api: &BatchApi,
    ledger: &Ledger,
    requests: Vec<QueuedRequest>,
) -> Result<Vec<BatchRecord>> {
    let (files, too_large) = input_files(
        requests,
        api.style,
        api.spec.max_requests_per_file,
        api.spec.max_bytes_per_file,
    );
    let mut out = Vec::new();
    // A request larger than a whole input file can never be sent: it is
    // recorded as ended and failed, so the next round fails its call.
    for (r, size) in too_large {
        let record = BatchRecord {
            name: uuid::Uuid::now_v7().to_string(),
            batch_id: None,
            input_file_id: String::new(),
            endpoint: r.endpoint,
            model: r.model.clone(),
            submitted_at: Utc::now(),
            status: "not_sent".into(),
            failed: [(
                r.custom_id.clone(),
                format!(
                    "the request is {size} bytes, more than llm.batch.max_bytes_per_file ({})",
                    api.spec.max_bytes_per_file
                ),
            )]
            .into(),
            requests: vec![recorded(&r)],
            ended_at: Some(Utc::now()),
            answered: BTreeMap::new(),
            accounted_by: None,
        };
        ledger.put(&record).await?;
        out.push(record);
    }
    for (endpoint, model, lines, bytes) in files {
        let name = uuid::Uuid::now_v7().to_string();
        let file_id = api
            .upload(endpoint, &format!("graphloom-{name}.jsonl"), bytes)
            .await?;
        let mut record = BatchRecord {
            name: name.clone(),
            batch_id: None,
            input_file_id: file_id.clone(),
            endpoint,
            model,
            submitted_at: Utc::now(),
            status: "creating".into(),
            requests: lines.iter().map(recorded).collect(),
            ended_at: None,
            answered: BTreeMap::new(),
            failed: BTreeMap::new(),
            accounted_by: None,
        };
        ledger.put(&record).await?;
        let batch = api.create(endpoint, &file_id, &name).await?;
        record.batch_id = Some(id_of(&batch, "creating a batch")?);
        record.status = status_of(&batch);
        ledger.put(&record).await?;
        tracing::info!(
            "batch {} submitted: {} {} requests ({})",
            record.batch_id.as_deref().unwrap_or("?"),
            record.requests.len(),
            match endpoint {
                Endpoint::Chat => "chat",
                Endpoint::Embeddings => "embeddings",
            },
            stages_text(&record.stages())
        );
        out.push(record);
    }
    Ok(out)
}

fn recorded(r: &QueuedRequest) -> RecordedRequest {
    RecordedRequest {
        custom_id: r.custom_id.clone(),
        stage: r.stage.to_string(),
        item: r.item.clone(),
        keys: r.keys.clone(),
    }
}

/// `extract_entities 40, classify_entities 3`.
pub fn stages_text(stages: &BTreeMap<String, usize>) -> String {
    stages
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A batch status, lower case (Azure has written some capitalised).
fn status_of(batch: &Value) -> String {
    batch["status"]
        .as_str()
        .unwrap_or("unknown")
        .to_ascii_lowercase()
}

fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "expired" | "cancelled")
}

/// Polls every batch that has not ended, once; collects those that ended
/// (answers into `cache`, failures and tokens into the ledger). A record
/// left without a batch id by a killed run is matched to its batch by
/// metadata, or created now. Returns every record as it is now, oldest
/// first.
pub async fn poll_once(
    api: &BatchApi,
    ledger: &Ledger,
    cache: &ResponseCache,
) -> Result<Vec<BatchRecord>> {
    let mut records = ledger.list().await?;
    for record in records.iter_mut().filter(|r| r.ended_at.is_none()) {
        let endpoint = record.endpoint;
        let batch_id = match &record.batch_id {
            Some(id) => id.clone(),
            None => {
                let found =
                    api.list(endpoint).await?.into_iter().find(|b| {
                        b["metadata"]["graphloom"].as_str() == Some(record.name.as_str())
                    });
                let batch = match found {
                    Some(b) => b,
                    None => {
                        api.create(endpoint, &record.input_file_id, &record.name)
                            .await?
                    }
                };
                let id = id_of(&batch, "creating a batch")?;
                record.batch_id = Some(id.clone());
                record.status = status_of(&batch);
                ledger.put(record).await?;
                id
            }
        };
        let batch = api.retrieve(endpoint, &batch_id).await?;
        let status = status_of(&batch);
        if !is_terminal(&status) {
            if status != record.status {
                record.status = status;
                ledger.put(record).await?;
            }
            continue;
        }
        collect(api, cache, record, &batch, &status).await?;
        ledger.put(record).await?;
        tracing::info!(
            "batch {batch_id} {status}: {} answered, {} failed",
            record.answered.len(),
            record.failed.len()
        );
    }
    Ok(records)
}

/// Reads an ended batch's output and error files into `cache` and the
/// record. Requests neither file answers (a cancelled or failed batch)
/// fail with the batch's status.
async fn collect(
    api: &BatchApi,
    cache: &ResponseCache,
    record: &mut BatchRecord,
    batch: &Value,
    status: &str,
) -> Result<()> {
    let by_id: HashMap<&str, &RecordedRequest> = record
        .requests
        .iter()
        .map(|r| (r.custom_id.as_str(), r))
        .collect();
    let mut answered: BTreeMap<String, Answered> = BTreeMap::new();
    let mut failed: BTreeMap<String, String> = BTreeMap::new();
    for field in ["output_file_id", "error_file_id"] {
        let Some(file_id) = batch[field].as_str().filter(|s| !s.is_empty()) else {
            continue;
        };
        let bytes = api.content(record.endpoint, file_id).await?;
        for line in bytes.split(|b| *b == b'\n') {
            let line = line.trim_ascii();
            if line.is_empty() {
                continue;
            }
            let Ok(v) = serde_json::from_slice::<Value>(line) else {
                continue;
            };
            let Some(r) = v["custom_id"].as_str().and_then(|id| by_id.get(id)) else {
                continue;
            };
            match answer(record, r, &v) {
                Ok((entries, tokens)) => {
                    for (key, entry) in entries {
                        cache.put(&key, &entry).await;
                    }
                    answered.insert(r.custom_id.clone(), tokens);
                }
                Err(why) => {
                    failed.insert(r.custom_id.clone(), why);
                }
            }
        }
    }
    let errors: Vec<String> = batch["errors"]["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["message"].as_str().map(str::to_string))
        .take(3)
        .collect();
    for r in &record.requests {
        if !answered.contains_key(&r.custom_id) && !failed.contains_key(&r.custom_id) {
            let why = if errors.is_empty() {
                format!("batch {status} without answering it")
            } else {
                format!("batch {status}: {}", errors.join("; "))
            };
            failed.insert(r.custom_id.clone(), why);
        }
    }
    record.status = status.to_string();
    record.answered = answered;
    // The reasons are the provider's text: they go to the ledger, logs
    // and `failures`, never with a key.
    record.failed = failed
        .into_iter()
        .map(|(id, why)| (id, redact(api.key.as_ref(), &why)))
        .collect();
    record.ended_at = Some(Utc::now());
    Ok(())
}

/// The cache entries one output line gives (one for a chat call, one per
/// text for embeddings) and its tokens, or why it gives none.
fn answer(
    record: &BatchRecord,
    r: &RecordedRequest,
    line: &Value,
) -> std::result::Result<(Vec<(String, CachedReply)>, Answered), String> {
    if !line["error"].is_null() {
        let e = &line["error"];
        return Err(format!(
            "{}: {}",
            e["code"].as_str().unwrap_or("error"),
            e["message"].as_str().unwrap_or("")
        ));
    }
    let response = &line["response"];
    let status = response["status_code"].as_u64().unwrap_or(0);
    let body = &response["body"];
    if status != 200 {
        let message = body["error"]["message"].as_str().unwrap_or("");
        return Err(format!("HTTP {status}: {message}"));
    }
    let usage = &body["usage"];
    let tokens = Answered {
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
        completion_tokens: usage["completion_tokens"].as_u64().unwrap_or(0),
    };
    match record.endpoint {
        Endpoint::Chat => {
            let content = body["choices"][0]["message"]["content"]
                .as_str()
                .ok_or("the answer has no message content")?;
            Ok((
                vec![(
                    r.custom_id.clone(),
                    CachedReply {
                        content: Value::String(content.to_string()),
                        prompt_tokens: tokens.prompt_tokens,
                        completion_tokens: tokens.completion_tokens,
                        model: record.model.clone(),
                    },
                )],
                tokens,
            ))
        }
        Endpoint::Embeddings => {
            let data = body["data"].as_array().ok_or("the answer has no data")?;
            let per_text = tokens.prompt_tokens / r.keys.len().max(1) as u64;
            let mut out = Vec::with_capacity(r.keys.len());
            for d in data {
                let index = d["index"].as_u64().unwrap_or(u64::MAX) as usize;
                let (Some(key), Ok(v)) = (
                    r.keys.get(index),
                    serde_json::from_value::<Vec<f32>>(d["embedding"].clone()),
                ) else {
                    continue;
                };
                out.push((
                    key.clone(),
                    CachedReply {
                        content: json!(v),
                        prompt_tokens: per_text,
                        completion_tokens: 0,
                        model: record.model.clone(),
                    },
                ));
            }
            if out.len() != r.keys.len() {
                return Err(format!(
                    "the answer holds {} of {} embeddings",
                    out.len(),
                    r.keys.len()
                ));
            }
            Ok((out, tokens))
        }
    }
}

/// Polls until no batch is running, waiting `poll_initial_secs` at first
/// and up to twice as long after each poll that saw no batch end (at most
/// `poll_max_secs`).
pub async fn wait_all(api: &BatchApi, ledger: &Ledger, cache: &ResponseCache) -> Result<()> {
    let (initial, max) = (api.spec.poll_initial_secs, api.spec.poll_max_secs);
    let mut wait = initial;
    let mut last = usize::MAX;
    loop {
        let records = poll_once(api, ledger, cache).await?;
        let running = records.iter().filter(|r| r.ended_at.is_none()).count();
        if running == 0 {
            return Ok(());
        }
        wait = if running < last {
            initial
        } else {
            (wait * 2.0).min(max)
        };
        last = running;
        tracing::info!("{running} batches running; next poll in {wait:.1} s");
        tokio::time::sleep(Duration::from_secs_f64(wait)).await;
    }
}

/// Cancels every running batch (`graphloom batches cancel`); returns the
/// ids asked. Their partial output is collected by the next poll.
pub async fn cancel_all(api: &BatchApi, ledger: &Ledger) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for record in ledger.list().await? {
        if record.ended_at.is_some() {
            continue;
        }
        if let Some(id) = record.batch_id.clone() {
            let batch = api.cancel(record.endpoint, &id).await?;
            let mut record = record;
            record.status = status_of(&batch);
            ledger.put(&record).await?;
            out.push(id);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: &str, endpoint: Endpoint, model: &str, size: usize) -> QueuedRequest {
        QueuedRequest {
            custom_id: id.into(),
            stage: Stage::ExtractEntities,
            item: None,
            endpoint,
            model: model.into(),
            body: json!({"pad": "x".repeat(size)}),
            keys: Vec::new(),
        }
    }

    #[test]
    fn input_files_split_by_endpoint_model_count_and_bytes() {
        let reqs = vec![
            request("a", Endpoint::Chat, "m", 10),
            request("b", Endpoint::Chat, "m", 10),
            request("c", Endpoint::Chat, "m", 10),
            request("d", Endpoint::Chat, "other", 10),
            request("e", Endpoint::Embeddings, "m", 10),
            request("huge", Endpoint::Chat, "m", 5000),
        ];
        let (files, too_large) = input_files(reqs, ApiStyle::Openai, 2, 1000);
        let shape: Vec<(Endpoint, String, Vec<String>)> = files
            .iter()
            .map(|(e, m, lines, _)| {
                (
                    *e,
                    m.clone(),
                    lines.iter().map(|r| r.custom_id.clone()).collect(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (Endpoint::Chat, "m".into(), vec!["a".into(), "b".into()]),
                (Endpoint::Chat, "m".into(), vec!["c".into()]),
                (Endpoint::Chat, "other".into(), vec!["d".into()]),
                (Endpoint::Embeddings, "m".into(), vec!["e".into()]),
            ]
        );
        assert_eq!(too_large.len(), 1);
        assert_eq!(too_large[0].0.custom_id, "huge");
        for (_, _, lines, bytes) in &files {
            let text = std::str::from_utf8(bytes).expect("utf-8");
            assert_eq!(text.lines().count(), lines.len());
            let first: Value =
                serde_json::from_str(text.lines().next().expect("a line")).expect("JSON");
            assert_eq!(first["method"], "POST");
            assert!(first["url"].as_str().expect("url").starts_with("/v1/"));
        }
        // By bytes: each line is ~70 bytes, 150 allows two.
        let reqs = (0..5)
            .map(|i| request(&i.to_string(), Endpoint::Chat, "m", 10))
            .collect();
        let (files, _) = input_files(reqs, ApiStyle::Openai, 100, 150);
        assert!(files.iter().all(|f| f.3.len() <= 150));
        assert_eq!(files.iter().map(|f| f.2.len()).sum::<usize>(), 5);
    }

    #[test]
    fn azure_batches_live_under_the_resources_openai_path() {
        assert_eq!(
            batch_base(
                "https://r.openai.azure.com/openai/deployments/gpt-batch/",
                ApiStyle::Azure
            ),
            "https://r.openai.azure.com/openai"
        );
        assert_eq!(
            batch_base("https://r.openai.azure.com/openai/v1", ApiStyle::Azure),
            "https://r.openai.azure.com/openai/v1"
        );
        assert_eq!(Endpoint::Chat.path(ApiStyle::Azure), "/chat/completions");
    }

    #[test]
    fn a_request_that_failed_max_attempts_times_is_exhausted_not_queued() {
        let mut record = BatchRecord {
            name: "n".into(),
            batch_id: Some("batch_1".into()),
            input_file_id: "file-1".into(),
            endpoint: Endpoint::Chat,
            model: "m".into(),
            submitted_at: Utc::now(),
            status: "completed".into(),
            requests: vec![],
            ended_at: Some(Utc::now()),
            answered: BTreeMap::new(),
            failed: [("x".to_string(), "HTTP 500: boom".to_string())].into(),
            accounted_by: None,
        };
        let q = BatchQueue::new(std::slice::from_ref(&record), 2);
        assert!(matches!(
            q.defer(request("x", Endpoint::Chat, "m", 1)),
            LlmError::Deferred { .. }
        ));
        record.name = "n2".into();
        let q = BatchQueue::new(&[record.clone(), record], 2);
        assert!(matches!(
            q.defer(request("x", Endpoint::Chat, "m", 1)),
            LlmError::Exhausted { attempts: 2, .. }
        ));
        assert!(q.take().is_empty());
    }
}
