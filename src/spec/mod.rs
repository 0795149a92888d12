//! The pipeline spec: one TOML file that says where episodes come from, where
//! the graph is written, which model extracts it and which ontology types it.
//!
//! Every key is documented with its default in docs/spec.md ("Every key").
//! Unknown keys are rejected with the key's name and position, because a
//! typo such as `tokens_per_minit` must never silently fall back to a default.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub mod extract;
pub mod mapping;
pub mod ontology;
pub mod resolve;

pub use extract::ExtractSpec;
pub use mapping::MappingSpec;
pub use ontology::OntologySpec;
pub use resolve::ResolveSpec;

/// Errors raised while reading or checking a pipeline spec.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The spec file could not be read.
    #[error("cannot read pipeline spec {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the spec's shape
    /// (unknown key, wrong value type, missing required key).
    #[error("invalid pipeline spec {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A key has a value outside its allowed range.
    #[error("invalid pipeline spec {path}: `{key}` {message}")]
    Value {
        path: PathBuf,
        key: String,
        message: String,
    },
}

/// Result alias for spec loading.
pub type Result<T, E = SpecError> = std::result::Result<T, E>;

/// A whole pipeline spec as written in `pipelines/*.toml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// Where episodes are read from. Only `graphloom run` needs it.
    pub source: Option<SourceSpec>,
    /// Where the graph's tables live.
    pub output: OutputSpec,
    /// The OpenAI-compatible model server used by the LLM stages.
    #[serde(default)]
    pub llm: LlmSpec,
    /// Entity and edge types with their hierarchies.
    #[serde(default)]
    pub ontology: OntologySpec,
    /// Extraction and classification settings.
    #[serde(default)]
    pub extract: ExtractSpec,
    /// Resolution settings.
    #[serde(default)]
    pub resolve: ResolveSpec,
    /// Records mapped to entities and facts without an LLM, first match
    /// wins; records no mapping applies to are extracted by the LLM.
    #[serde(default)]
    pub mapping: Vec<MappingSpec>,
}

/// `[source]`: the archive of episodes (read by [`crate::source::load`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSpec {
    /// Object store URL of a directory (or prefix) holding episode files;
    /// every file below it with the format's extensions is read.
    pub url: String,
    /// File format of the episodes.
    #[serde(default)]
    pub format: SourceFormat,
    /// Kind of a record that has no `kind` field.
    #[serde(default)]
    pub default_kind: EpisodeKind,
    /// Parquet only: record field → column name, e.g.
    /// `{ content = "body", reference_time = "sent_at" }`. Fields not
    /// mapped are read from the column of the same name, if present.
    #[serde(default)]
    pub columns: BTreeMap<String, String>,
    /// Text only: target chunk size in tokens (a token is about 4 characters).
    #[serde(default = "default_chunk_tokens")]
    pub chunk_tokens: usize,
    /// Text only: tokens repeated from the end of one chunk at the start of
    /// the next; less than `chunk_tokens`.
    #[serde(default = "default_chunk_overlap_tokens")]
    pub chunk_overlap_tokens: usize,
    /// Largest record (JSON Lines line, JSON array item, Parquet row, text
    /// chunk) in bytes; a larger one is a failure, not an episode.
    #[serde(default = "default_max_record_bytes")]
    pub max_record_bytes: usize,
    /// Object store options for the source, like `output.storage_options`.
    /// Values never appear in logs.
    #[serde(default)]
    pub storage_options: BTreeMap<String, String>,
}

fn default_chunk_tokens() -> usize {
    400
}

fn default_chunk_overlap_tokens() -> usize {
    50
}

fn default_max_record_bytes() -> usize {
    1_048_576
}

/// Record fields the source reads; also the keys allowed in `source.columns`.
pub const RECORD_FIELDS: &[&str] = &[
    "content",
    "kind",
    "reference_time",
    "id",
    "document_id",
    "group_id",
    "source_description",
];

/// What an episode is, which decides how later stages prompt for it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum EpisodeKind {
    /// A message in a conversation (mail, chat) with a speaker.
    Message,
    /// Prose: a document or a chunk of one.
    #[default]
    Text,
    /// A structured record, stored as JSON text.
    Json,
}

impl EpisodeKind {
    /// The name stored in `episodes.kind`: `message`, `text` or `json`.
    pub fn as_str(self) -> &'static str {
        match self {
            EpisodeKind::Message => "message",
            EpisodeKind::Text => "text",
            EpisodeKind::Json => "json",
        }
    }

    /// Parses a kind name, ignoring ASCII case and surrounding spaces.
    pub fn parse(name: &str) -> Option<Self> {
        let name = name.trim();
        [EpisodeKind::Message, EpisodeKind::Text, EpisodeKind::Json]
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(name))
    }
}

impl std::fmt::Display for EpisodeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Episode file formats understood by the source stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum SourceFormat {
    /// One JSON object per line.
    #[default]
    Jsonl,
    /// A JSON array of objects per file.
    Json,
    /// Parquet files with a column mapping.
    Parquet,
    /// Plain text or Markdown documents split into chunks.
    Text,
}

/// `[output]`: the graph's root and how to reach it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// Root URL of the graph; each table is a Delta table below it.
    pub graph: String,
    /// Partition of the graph this pipeline writes to.
    #[serde(default = "default_group_id")]
    pub group_id: String,
    /// Extra object store options (e.g. `aws_region`, `aws_endpoint`,
    /// `allow_http`); the usual `AWS_*`, `GOOGLE_*`, `AZURE_*` environment
    /// variables are read as well. Values never appear in logs.
    #[serde(default)]
    pub storage_options: BTreeMap<String, String>,
    /// Seconds after which a writer lock whose holder stopped renewing it is
    /// considered abandoned and may be taken over.
    #[serde(default = "default_lock_stale_after_secs")]
    pub lock_stale_after_secs: u64,
}

fn default_group_id() -> String {
    "default".to_string()
}

fn default_lock_stale_after_secs() -> u64 {
    120
}

/// `[llm]`: the OpenAI-compatible endpoint and the budget it may use.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmSpec {
    /// Base URL up to and including `/v1` (for Azure: up to the deployment,
    /// `https://RESOURCE.openai.azure.com/openai/deployments/DEPLOYMENT`).
    pub base_url: String,
    /// Model (or deployment) name sent with each request.
    pub model: String,
    /// Name of the environment variable that holds the API key; the key
    /// itself never appears in a spec. An unset or empty variable sends no
    /// key (local servers need none).
    pub api_key_env: String,
    /// `openai` (Bearer key, `/chat/completions`) or `azure` (`api-key`
    /// header and `api-version` query parameter).
    pub api_style: ApiStyle,
    /// Azure OpenAI `api-version`; required when `api_style = "azure"`.
    pub azure_api_version: Option<String>,
    /// Request budget per minute shared by every stage of a run.
    pub requests_per_minute: u32,
    /// Token budget (prompt + completion) per minute shared by every stage.
    pub tokens_per_minute: u32,
    /// Requests that may go at once; default 5% of requests_per_minute.
    pub request_burst: Option<u32>,
    /// Tokens that may go at once; default 5% of tokens_per_minute. A single
    /// call larger than this is an error.
    pub token_burst: Option<u32>,
    /// Calls in flight at once, at most.
    pub max_concurrency: u32,
    /// Whether the calls in flight follow what the server sustains, from 2
    /// up to `max_concurrency` ([`crate::llm::concurrency`]); `false`
    /// keeps `max_concurrency` in flight.
    pub adaptive_concurrency: bool,
    /// How replies are constrained to JSON: `json_schema` (strict schema),
    /// `json_object`, or `prompt` (schema in the prompt only). A server that
    /// rejects the chosen `response_format` is retried one level down.
    pub structured_output: StructuredOutput,
    /// Sampling temperature.
    pub temperature: f64,
    /// Time budget of one HTTP attempt, in seconds.
    pub timeout_secs: u64,
    /// Attempts per call in total (1 = no retries).
    pub max_attempts: u32,
    /// Ceiling of the first backoff, in milliseconds; doubles per attempt.
    pub backoff_initial_ms: u64,
    /// Largest backoff between attempts, in milliseconds.
    pub backoff_max_ms: u64,
    /// Whether replies are cached (content-addressed) and reused.
    pub cache: bool,
    /// Where the cache lives; default `<output.graph>/_cache/llm/`.
    pub cache_url: Option<String>,
    /// Price in USD per million prompt tokens, for `runs.cost_usd`.
    pub price_per_1m_prompt_tokens: Option<f64>,
    /// Price in USD per million completion tokens.
    pub price_per_1m_completion_tokens: Option<f64>,
    /// Model for `/embeddings`; default: `model`.
    pub embedding_model: Option<String>,
    /// Endpoint for `/embeddings` when another server (or, on Azure,
    /// another deployment) serves them; default: `base_url`. llama-server
    /// serves one model, so the local embedding model runs as a second
    /// server (`scripts/local-llm.sh start --model nomic-embed`, port 8094).
    pub embedding_base_url: Option<String>,
    /// Extra fields merged into every chat request body, e.g.
    /// `{ cache_prompt = false }` for llama.cpp, `{ seed = 7 }`.
    pub extra_body: serde_json::Map<String, serde_json::Value>,
    /// Whether chat replies are streamed (server-sent events), so that a
    /// reply whose items begin to repeat word for word is stopped there
    /// instead of running on to `max_tokens` (the items it completed are
    /// kept). Needs a server that streams (OpenAI, vLLM, llama.cpp).
    pub stream: bool,
    /// Whether a burst of calls that open with one system prompt is led by
    /// a warm-up call: the system prompt alone, one token of reply, sent
    /// before the first of them that the response cache cannot answer
    /// while the others wait. A server that caches prompt prefixes then
    /// reads the shared prompt once instead of once per parallel slot
    /// (llama.cpp started by `scripts/local-llm.sh`, which also picks slots
    /// so that every slot can load the warmed prefix). One extra call per
    /// extraction run; a warm-up that fails is logged and skipped.
    pub warm_prefix: bool,
    /// `sync` (calls answered as they are made) or `batch` (each stage's
    /// calls go to the provider's Batch API, answered within its
    /// completion window at its batch price).
    pub mode: LlmMode,
    /// `[llm.batch]`: limits and timing of batch mode.
    pub batch: BatchSpec,
    /// `[[llm.endpoints]]`: several servers of one model (a fleet of vLLM
    /// or llama.cpp servers) behind the one budget above. Empty: `base_url`
    /// is the only endpoint. Given in a spec file, `base_url` must not be.
    pub endpoints: Vec<EndpointSpec>,
    /// Consecutive failed attempts (transport errors, timeouts, 5xx, 429)
    /// after which an endpoint of several is rested.
    pub endpoint_failures_to_rest: u32,
    /// First rest of a failing endpoint, in milliseconds; doubles each time
    /// its probe after a rest fails.
    pub endpoint_rest_initial_ms: u64,
    /// Longest rest of a failing endpoint, in milliseconds.
    pub endpoint_rest_max_ms: u64,
}

/// One server of `[[llm.endpoints]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    /// Base URL up to and including `/v1`, like `llm.base_url`.
    pub base_url: String,
    /// Calls in flight at once on this server; default: `llm.max_concurrency`
    /// (the global cap still bounds the sum).
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// Share of the calls relative to the other endpoints: calls go where
    /// free slots per unit of weight are most.
    #[serde(default = "default_weight")]
    pub weight: u32,
}

fn default_weight() -> u32 {
    1
}

impl LlmSpec {
    /// The base URL of the first endpoint: `endpoints[0]` when endpoints
    /// are listed, else `base_url`. Embeddings (unless
    /// `embedding_base_url` says otherwise) and the Batch API use it.
    pub fn primary_base_url(&self) -> &str {
        self.endpoints
            .first()
            .map_or(self.base_url.as_str(), |e| e.base_url.as_str())
    }
}

/// How LLM calls are executed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LlmMode {
    /// One HTTP request per call, answered at once.
    #[default]
    Sync,
    /// The OpenAI / Azure OpenAI Batch API: calls are written to JSONL
    /// files, submitted, polled and collected round by round.
    Batch,
}

/// `[llm.batch]`: the Batch API's limits (per input file) and how it is
/// polled. The defaults are OpenAI's limits; Azure allows 100,000
/// requests per file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchSpec {
    /// Most requests in one input file (OpenAI: 50,000; Azure: 100,000).
    pub max_requests_per_file: usize,
    /// Largest input file in bytes (both: 200 MB).
    pub max_bytes_per_file: u64,
    /// Sent as `completion_window` (the only value providers accept today
    /// is `24h`).
    pub completion_window: String,
    /// First wait between polls of a batch, in seconds; doubles while
    /// nothing changes.
    pub poll_initial_secs: f64,
    /// Longest wait between polls, in seconds (Azure asks for at most one
    /// poll a minute).
    pub poll_max_secs: f64,
    /// Rounds a request may be submitted in (a request that failed in the
    /// error file, or whose batch failed, expired or was cancelled, is
    /// submitted again in the next round); then it is a `failures` row.
    pub max_attempts: u32,
    /// Most rounds one run makes (one per stage level: entities, each
    /// subtype level, facts, …); a guard, not a tuning knob.
    pub max_rounds: u32,
    /// Batch price as a share of the sync price (OpenAI and Azure: 0.5).
    pub price_factor: f64,
}

impl Default for BatchSpec {
    fn default() -> Self {
        BatchSpec {
            max_requests_per_file: 50_000,
            max_bytes_per_file: 200_000_000,
            completion_window: "24h".to_string(),
            poll_initial_secs: 5.0,
            poll_max_secs: 60.0,
            max_attempts: 3,
            max_rounds: 40,
            price_factor: 0.5,
        }
    }
}

/// Wire conventions of the endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ApiStyle {
    /// OpenAI, vLLM, Ollama, llama.cpp's server and most others.
    #[default]
    Openai,
    /// Azure OpenAI.
    Azure,
}

/// How replies are constrained to JSON.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StructuredOutput {
    /// `response_format: {type: json_schema, strict: true}`.
    #[default]
    JsonSchema,
    /// `response_format: {type: json_object}` plus the schema in the prompt.
    JsonObject,
    /// The schema in the prompt only.
    Prompt,
}

impl Default for LlmSpec {
    fn default() -> Self {
        Self {
            base_url: "http://127.0.0.1:8093/v1".to_string(),
            model: "local-llm".to_string(),
            api_key_env: "OPENAI_API_KEY".to_string(),
            api_style: ApiStyle::Openai,
            azure_api_version: None,
            requests_per_minute: 600,
            tokens_per_minute: 1_000_000,
            request_burst: None,
            token_burst: None,
            max_concurrency: 8,
            adaptive_concurrency: true,
            structured_output: StructuredOutput::JsonSchema,
            temperature: 0.0,
            timeout_secs: 120,
            max_attempts: 6,
            backoff_initial_ms: 500,
            backoff_max_ms: 60_000,
            cache: true,
            cache_url: None,
            price_per_1m_prompt_tokens: None,
            price_per_1m_completion_tokens: None,
            embedding_model: None,
            embedding_base_url: None,
            extra_body: serde_json::Map::new(),
            stream: false,
            warm_prefix: false,
            mode: LlmMode::Sync,
            batch: BatchSpec::default(),
            endpoints: Vec::new(),
            endpoint_failures_to_rest: 3,
            endpoint_rest_initial_ms: 30_000,
            endpoint_rest_max_ms: 300_000,
        }
    }
}

impl std::fmt::Debug for LlmSpec {
    // Spelled out so that a future key holding a secret cannot slip into
    // `{:?}` output by accident: only names and numbers are printed, and
    // extra_body only by its keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmSpec")
            .field("base_url", &self.base_url)
            .field("embedding_base_url", &self.embedding_base_url)
            .field("model", &self.model)
            .field("api_key_env", &self.api_key_env)
            .field("api_style", &self.api_style)
            .field("requests_per_minute", &self.requests_per_minute)
            .field("tokens_per_minute", &self.tokens_per_minute)
            .field("max_concurrency", &self.max_concurrency)
            .field("adaptive_concurrency", &self.adaptive_concurrency)
            .field("structured_output", &self.structured_output)
            .field("max_attempts", &self.max_attempts)
            .field("cache", &self.cache)
            .field("mode", &self.mode)
            .field("batch", &self.batch)
            .field("endpoints", &self.endpoints.len())
            .field(
                "extra_body_keys",
                &self.extra_body.keys().collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl PipelineSpec {
    /// Reads and checks a spec file. The ontology is parsed here but
    /// validated separately ([`crate::ontology::Ontology::try_from`]) so that
    /// `graphloom ontology check` can list every ontology error at once.
    pub fn from_path(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text, path)
    }

    /// Parses a spec from TOML text; `path` is only used in messages.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self> {
        let spec: PipelineSpec = toml::from_str(text).map_err(|e| SpecError::Parse {
            path: path.to_path_buf(),
            message: describe_toml_error(text, &e),
        })?;
        spec.check_values(path)?;
        // `base_url` has a default, so only the text tells whether it was
        // written next to `endpoints`; both would leave one of them unused.
        if !spec.llm.endpoints.is_empty() && llm_key_written(text, "base_url") {
            return Err(SpecError::Value {
                path: path.to_path_buf(),
                key: "llm.base_url".into(),
                message: "cannot be set together with llm.endpoints: list every server under [[llm.endpoints]]".into(),
            });
        }
        Ok(spec)
    }

    fn check_values(&self, path: &Path) -> Result<()> {
        let problem = self
            .output_problem()
            .or_else(|| self.llm_problem())
            .or_else(|| self.resolve_problem())
            .or_else(|| self.extract_problem())
            .or_else(|| self.source.as_ref().and_then(source_problem));
        match problem {
            Some((key, message)) => Err(SpecError::Value {
                path: path.to_path_buf(),
                key,
                message,
            }),
            None => Ok(()),
        }
    }

    /// The first bad value of `[output]`, as (key, message).
    fn output_problem(&self) -> Option<(String, String)> {
        if self.output.graph.trim().is_empty() {
            return bad("output.graph", "must not be empty");
        }
        if self.output.group_id.trim().is_empty() {
            return bad("output.group_id", "must not be empty");
        }
        if self.output.lock_stale_after_secs == 0 {
            return bad("output.lock_stale_after_secs", "must be at least 1");
        }
        None
    }

    /// The first bad value of `[llm]`.
    fn llm_problem(&self) -> Option<(String, String)> {
        let llm = &self.llm;
        for (key, value) in [
            ("llm.requests_per_minute", llm.requests_per_minute),
            ("llm.tokens_per_minute", llm.tokens_per_minute),
            ("llm.max_concurrency", llm.max_concurrency),
            ("llm.max_attempts", llm.max_attempts),
            (
                "llm.timeout_secs",
                llm.timeout_secs.min(u32::MAX as u64) as u32,
            ),
            ("llm.request_burst", llm.request_burst.unwrap_or(1)),
            ("llm.token_burst", llm.token_burst.unwrap_or(1)),
        ] {
            if value == 0 {
                return bad(key, "must be at least 1");
            }
        }
        if llm.api_key_env.trim().is_empty() {
            return bad(
                "llm.api_key_env",
                "must name an environment variable (e.g. OPENAI_API_KEY)",
            );
        }
        // The value is never echoed: if it is a key, it must not reach a log.
        if looks_like_secret(&llm.api_key_env) {
            return bad(
                "llm.api_key_env",
                "looks like an API key; put the key in an environment variable and name the variable here",
            );
        }
        if !is_env_var_name(&llm.api_key_env) {
            return bad(
                "llm.api_key_env",
                "must be an environment variable name (letters, digits and `_`, not starting with a digit)",
            );
        }
        if llm.request_burst.unwrap_or(0) > llm.requests_per_minute {
            return bad(
                "llm.request_burst",
                "must not exceed llm.requests_per_minute",
            );
        }
        if llm.token_burst.unwrap_or(0) > llm.tokens_per_minute {
            return bad("llm.token_burst", "must not exceed llm.tokens_per_minute");
        }
        if llm.api_style == ApiStyle::Azure
            && llm.azure_api_version.as_deref().is_none_or(str::is_empty)
        {
            return bad(
                "llm.azure_api_version",
                "is required when llm.api_style = \"azure\" (e.g. \"2024-10-21\")",
            );
        }
        if !(0.0..=2.0).contains(&llm.temperature) {
            return bad("llm.temperature", "must be between 0 and 2");
        }
        if llm.backoff_initial_ms > llm.backoff_max_ms {
            return bad(
                "llm.backoff_initial_ms",
                "must not exceed llm.backoff_max_ms",
            );
        }
        for (key, price) in [
            (
                "llm.price_per_1m_prompt_tokens",
                llm.price_per_1m_prompt_tokens,
            ),
            (
                "llm.price_per_1m_completion_tokens",
                llm.price_per_1m_completion_tokens,
            ),
        ] {
            if price.is_some_and(|p| !p.is_finite() || p < 0.0) {
                return bad(key, "must be a non-negative number");
            }
        }
        let b = &llm.batch;
        if b.max_requests_per_file == 0 {
            return bad("llm.batch.max_requests_per_file", "must be at least 1");
        }
        if b.max_bytes_per_file < 1024 {
            return bad("llm.batch.max_bytes_per_file", "must be at least 1024");
        }
        if !(b.poll_initial_secs.is_finite()
            && b.poll_initial_secs > 0.0
            && b.poll_max_secs.is_finite()
            && b.poll_initial_secs <= b.poll_max_secs)
        {
            return bad(
                "llm.batch.poll_initial_secs",
                "must be a positive number of seconds, at most llm.batch.poll_max_secs",
            );
        }
        if b.max_attempts == 0 {
            return bad("llm.batch.max_attempts", "must be at least 1");
        }
        if b.max_rounds == 0 {
            return bad("llm.batch.max_rounds", "must be at least 1");
        }
        if !(b.price_factor.is_finite() && b.price_factor >= 0.0) {
            return bad("llm.batch.price_factor", "must be a non-negative number");
        }
        if !llm.base_url.starts_with("http://") && !llm.base_url.starts_with("https://") {
            return bad("llm.base_url", "must be an http:// or https:// URL");
        }
        if let Some(url) = &llm.embedding_base_url
            && !url.starts_with("http://")
            && !url.starts_with("https://")
        {
            return bad(
                "llm.embedding_base_url",
                "must be an http:// or https:// URL",
            );
        }
        endpoints_problem(llm)
    }

    /// The first bad value of `[resolve]`.
    fn resolve_problem(&self) -> Option<(String, String)> {
        for (i, t) in self.resolve.functional_edge_types.iter().enumerate() {
            if !self.ontology.edge_types.iter().any(|e| &e.name == t) {
                return bad(
                    &format!("resolve.functional_edge_types[{i}]"),
                    &format!("`{t}` is not a declared edge type"),
                );
            }
        }
        for (i, l) in self.resolve.linkage.iter().enumerate() {
            let at = format!("resolve.linkage[{i}]");
            let Some(t) = self
                .ontology
                .entity_types
                .iter()
                .find(|e| e.name == l.entity_type)
            else {
                return bad(
                    &format!("{at}.type"),
                    &format!("`{}` is not a declared entity type", l.entity_type),
                );
            };
            if let Some(f) = l
                .fields()
                .into_iter()
                .find(|f| f != "name" && !t.properties.iter().any(|p| &p.name == f))
            {
                return bad(
                    &at,
                    &format!(
                        "field `{f}` is neither `name` nor a property of `{}`",
                        l.entity_type
                    ),
                );
            }
            if self.resolve.linkage[..i]
                .iter()
                .any(|o| o.entity_type == l.entity_type)
            {
                return bad(
                    &format!("{at}.type"),
                    &format!("`{}` has a linkage already", l.entity_type),
                );
            }
        }
        self.resolve.problems().into_iter().next()
    }

    /// The first bad value of `[extract]`.
    fn extract_problem(&self) -> Option<(String, String)> {
        let x = &self.extract;
        for (key, value, min) in [
            (
                "extract.classify_batch_size",
                x.classify_batch_size as u64,
                1,
            ),
            ("extract.entity_max_tokens", x.entity_max_tokens as u64, 64),
            ("extract.fact_max_tokens", x.fact_max_tokens as u64, 64),
            ("extract.call_budget_secs", x.call_budget_secs, 1),
            (
                "extract.max_entities_per_episode",
                x.max_entities_per_episode as u64,
                1,
            ),
        ] {
            if value < min {
                return bad(key, &format!("must be at least {min}"));
            }
        }
        if let Some(name) = x.cues.keys().find(|n| crate::cues::cue(n).is_none()) {
            let known: Vec<&str> = crate::cues::REGISTRY.iter().map(|c| c.name).collect();
            return bad(
                &format!("extract.cues.{name}"),
                &format!("is no cue; the cues are {}", known.join(", ")),
            );
        }
        let code = x.language.trim();
        if code.is_empty() || !code.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return bad(
                "extract.language",
                "must be a language code such as \"en\", \"de\" or \"es\"",
            );
        }
        None
    }
}

/// The first bad value of `[[llm.endpoints]]` and its rest settings. URLs
/// are never echoed (one may hold a key); entries are named by index.
fn endpoints_problem(llm: &LlmSpec) -> Option<(String, String)> {
    if llm.endpoint_failures_to_rest == 0 {
        return bad("llm.endpoint_failures_to_rest", "must be at least 1");
    }
    if llm.endpoint_rest_initial_ms == 0 || llm.endpoint_rest_initial_ms > llm.endpoint_rest_max_ms
    {
        return bad(
            "llm.endpoint_rest_initial_ms",
            "must be at least 1 and not exceed llm.endpoint_rest_max_ms",
        );
    }
    if !llm.endpoints.is_empty() && llm.mode == LlmMode::Batch {
        return bad(
            "llm.endpoints",
            "is for sync mode (servers without a Batch API); batch mode sends to llm.base_url",
        );
    }
    let mut seen: Vec<String> = Vec::new();
    for (i, e) in llm.endpoints.iter().enumerate() {
        let at = format!("llm.endpoints[{i}]");
        let url = e.base_url.trim();
        if url.is_empty() {
            return bad(&format!("{at}.base_url"), "must not be empty");
        }
        if !url.starts_with("http://") && !url.starts_with("https://") {
            return bad(
                &format!("{at}.base_url"),
                "must be an http:// or https:// URL",
            );
        }
        if e.max_concurrency == Some(0) {
            return bad(&format!("{at}.max_concurrency"), "must be at least 1");
        }
        if e.weight == 0 {
            return bad(&format!("{at}.weight"), "must be at least 1");
        }
        // The same server twice would double its share and its slots.
        let same = url.trim_end_matches('/').to_ascii_lowercase();
        if let Some(j) = seen.iter().position(|s| *s == same) {
            return bad(
                &format!("{at}.base_url"),
                &format!("is the same server as llm.endpoints[{j}]"),
            );
        }
        seen.push(same);
    }
    None
}

/// Whether the spec text writes `key` in its `[llm]` table.
fn llm_key_written(text: &str, key: &str) -> bool {
    toml::from_str::<toml::Table>(text).is_ok_and(|t| {
        t.get("llm")
            .and_then(toml::Value::as_table)
            .is_some_and(|llm| llm.contains_key(key))
    })
}

/// The first bad value of `[source]`.
fn source_problem(source: &SourceSpec) -> Option<(String, String)> {
    if source.url.trim().is_empty() {
        return bad("source.url", "must not be empty");
    }
    if !source.columns.is_empty() && source.format != SourceFormat::Parquet {
        return bad(
            "source.columns",
            "is only used with source.format = \"parquet\"",
        );
    }
    for (field, column) in &source.columns {
        if !RECORD_FIELDS.contains(&field.as_str()) {
            return bad(
                &format!("source.columns.{field}"),
                &format!(
                    "is not a record field (fields: {})",
                    RECORD_FIELDS.join(", ")
                ),
            );
        }
        if column.trim().is_empty() {
            return bad(&format!("source.columns.{field}"), "must name a column");
        }
    }
    if !(1..=1_000_000).contains(&source.chunk_tokens) {
        return bad("source.chunk_tokens", "must be between 1 and 1000000");
    }
    if source.chunk_overlap_tokens >= source.chunk_tokens {
        return bad(
            "source.chunk_overlap_tokens",
            &format!(
                "must be less than source.chunk_tokens ({})",
                source.chunk_tokens
            ),
        );
    }
    if !(1..=1 << 30).contains(&source.max_record_bytes) {
        return bad(
            "source.max_record_bytes",
            "must be between 1 and 1073741824 (1 GiB)",
        );
    }
    None
}

/// A (key, message) problem.
fn bad(key: &str, message: &str) -> Option<(String, String)> {
    Some((key.to_string(), message.to_string()))
}

/// Location and message of a TOML error without the source line that the
/// parser's own message quotes, nor the value that serde's messages quote:
/// either could hold a secret pasted into the wrong key
/// (`api_key = "sk-..."`, `requests_per_minute = "sk-..."`).
fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let message = without_quoted_values(e.message().trim_end());
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message.to_string(),
    }
}

/// `message` without the values serde quotes in it, unless they are short
/// plain words: `invalid type: string "sk-…", expected u32` becomes
/// `invalid type: string, expected u32` and ``unknown variant `sk-…`,
/// expected …`` becomes `unknown variant, expected …`, while ``unknown
/// variant `string`, expected one of `text`, …`` stays as it is. The
/// error's position still says where the value is.
fn without_quoted_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("string \"") {
        let quoted = &rest[at + "string ".len()..];
        // serde writes the string with `{:?}`: a `"` inside it is escaped.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in quoted.char_indices().skip(1) {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let Some(end) = end else { break };
        if may_show(&quoted[1..end]) {
            out.push_str(&rest[..at + "string ".len() + end + 1]);
        } else {
            out.push_str(&rest[..at + "string".len()]);
        }
        rest = &quoted[end + 1..];
    }
    out.push_str(rest);
    // Unknown keys stay named whatever they are: naming the key is the
    // point of the message, and the value is not in it.
    const VARIANT: &str = "unknown variant `";
    if let Some(at) = out.find(VARIANT) {
        let after = &out[at + VARIANT.len()..];
        // The value may hold backticks; the text serde writes after it does not.
        let end = ["`, expected", "`, there are no"]
            .iter()
            .filter_map(|tail| after.rfind(tail))
            .min();
        if let Some(end) = end
            && !may_show(&after[..end])
        {
            let tail = after[end + 1..].to_string();
            out.truncate(at + VARIANT.len() - " `".len());
            out.push_str(&tail);
        }
    }
    out
}

/// Whether a value serde refused may be shown: a short plain word (`600`,
/// `string`, `azur`) helps the reader; anything that could be a key is left
/// out.
fn may_show(value: &str) -> bool {
    value.chars().count() <= 24
        && !looks_like_secret(value)
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '_' | '-' | '.'))
}

/// Prefixes of API keys of common providers.
const SECRET_PREFIXES: &[&str] = &[
    "sk-", "sk_", "gsk_", "xai-", "aiza", "ghp_", "hf_", "pk-", "rk-",
];

fn looks_like_secret(value: &str) -> bool {
    let v = value.trim().to_ascii_lowercase();
    SECRET_PREFIXES.iter().any(|p| v.starts_with(p))
}

fn is_env_var_name(value: &str) -> bool {
    let mut chars = value.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
