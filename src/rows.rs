//! Typed rows of the graph's tables, as the stages produce them and the
//! store writes them ([`crate::store::rows`] converts them to Arrow). A
//! leaf: stages build rows without reaching the store.

use arrow::array::RecordBatch;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::stage::Stage;

/// Rows that could not be decoded from Arrow batches (a column that does
/// not fit the row type).
#[derive(Debug, thiserror::Error)]
#[error("cannot decode `{table}` rows: {source}")]
pub struct DecodeError {
    /// The table the batches came from.
    pub table: &'static str,
    /// What did not fit (an Arrow or JSON error).
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// Decodes record batches of `table` into rows, through arrow-json's
/// serde support.
pub fn decode<T: DeserializeOwned>(
    table: &'static str,
    batches: &[RecordBatch],
) -> Result<Vec<T>, DecodeError> {
    let err = |e: Box<dyn std::error::Error + Send + Sync>| DecodeError { table, source: e };
    let mut out = Vec::new();
    for batch in batches {
        if batch.num_rows() == 0 {
            continue;
        }
        let mut writer = arrow::json::ArrayWriter::new(Vec::new());
        writer.write(batch).map_err(|e| err(e.into()))?;
        writer.finish().map_err(|e| err(e.into()))?;
        let buf = writer.into_inner();
        let rows: Vec<T> = serde_json::from_slice(&buf).map_err(|e| err(e.into()))?;
        out.extend(rows);
    }
    Ok(out)
}

/// A row of `episodes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeRow {
    pub episode_id: String,
    pub group_id: String,
    pub document_id: Option<String>,
    pub source_id: Option<String>,
    pub source_uri: String,
    pub source_description: Option<String>,
    pub kind: String,
    pub content: String,
    pub reference_time: DateTime<Utc>,
    pub reference_time_source: String,
    pub ingested_at: DateTime<Utc>,
    pub run_id: String,
}

/// A row of `nodes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRow {
    pub node_id: String,
    pub short_id: i64,
    pub group_id: String,
    pub name: String,
    pub name_normalized: String,
    #[serde(rename = "type")]
    pub node_type: String,
    pub labels: Vec<String>,
    pub summary: Option<String>,
    /// JSON object text.
    pub attributes: String,
    pub episode_ids: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub rank: i64,
    pub name_embedding: Option<Vec<f32>>,
    /// How the node entered the graph: `add` or `extract`.
    pub origin: String,
    pub run_id: String,
}

/// A row of `node_labels`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeLabelRow {
    pub node_id: String,
    pub group_id: String,
    pub label: String,
    /// 0 for `Entity`, 1 for the top-level type, 2 for its subtype, ...
    pub depth: i64,
}

/// The `node_labels` rows of nodes: one per label, with its depth in the
/// chain (0 for `Entity`).
pub fn node_label_rows(nodes: &[NodeRow]) -> Vec<NodeLabelRow> {
    nodes
        .iter()
        .flat_map(|n| {
            n.labels
                .iter()
                .enumerate()
                .map(|(depth, label)| NodeLabelRow {
                    node_id: n.node_id.clone(),
                    group_id: n.group_id.clone(),
                    label: label.clone(),
                    depth: depth as i64,
                })
        })
        .collect()
}

/// A row of `edges`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeRow {
    pub edge_id: String,
    pub group_id: String,
    pub source_node_id: String,
    pub target_node_id: String,
    pub relation_type: String,
    pub fact: String,
    pub attributes: String,
    pub episode_ids: Vec<String>,
    pub valid_at: Option<DateTime<Utc>>,
    pub invalid_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub expired_at: Option<DateTime<Utc>>,
    pub fact_embedding: Option<Vec<f32>>,
    pub origin: String,
    pub run_id: String,
}

/// A row of `entity_types`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntityTypeRow {
    pub name: String,
    pub parent: Option<String>,
    pub depth: i64,
    pub description: String,
    /// JSON array of `{name, type, description}`.
    pub properties: String,
    pub identity_properties: Vec<String>,
    pub run_id: String,
}

/// A row of `edge_types`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeTypeRow {
    pub name: String,
    pub parent: Option<String>,
    pub depth: i64,
    pub description: String,
    /// JSON array of `{name, type, description}`.
    pub properties: String,
    /// JSON array of `{source, target}`.
    pub source_targets: String,
    pub run_id: String,
}

/// A row of `entity_type_closure` or `edge_type_closure`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClosureRow {
    pub ancestor: String,
    pub descendant: String,
    pub distance: i64,
}

/// A row of `runs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    pub run_id: String,
    /// 1 for the graph's first run, then one more per run.
    pub run_seq: i64,
    pub command: String,
    /// `completed` or `failed`.
    pub status: String,
    pub group_id: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub duration_ms: i64,
    pub episodes_seen: i64,
    pub episodes_skipped: i64,
    pub episodes_added: i64,
    pub nodes_added: i64,
    pub edges_added: i64,
    pub failures: i64,
    pub llm_calls: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_usd: Option<f64>,
    pub ontology_hash: String,
    /// JSON object: table name → Delta version this run left it at.
    pub table_versions: String,
    pub error: Option<String>,
    pub graphloom_version: String,
}

/// A row of `llm_calls`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmCallRow {
    pub call_id: String,
    pub run_id: String,
    pub stage: String,
    pub model: String,
    pub item: Option<String>,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    /// Time spent in HTTP exchanges.
    pub latency_ms: i64,
    /// Time spent waiting for the budget, a free slot or a backoff.
    pub wait_ms: i64,
    pub attempts: i64,
    pub cache_hit: bool,
    pub status: String,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    /// The endpoint of the call's last attempt: its base URL without
    /// credentials, query or fragment. None for cache hits, Batch API
    /// answers, calls that sent nothing, and rows of graphs written before
    /// the column existed.
    #[serde(default)]
    pub endpoint: Option<String>,
}

/// A row of `failures`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRow {
    pub failure_id: String,
    pub run_id: String,
    /// Stage that gave up on the item, e.g. `add`, `source`, `extract`.
    pub stage: String,
    /// What failed, e.g. `facts.jsonl:12` or an episode id.
    pub item: String,
    pub source_uri: Option<String>,
    pub line: Option<i64>,
    pub episode_id: Option<String>,
    pub reason: String,
    /// The start of the offending input, for a human to recognise it.
    pub excerpt: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// Characters of the offending input a failure keeps as its excerpt.
pub const EXCERPT_CHARS: usize = 200;

impl FailureRow {
    /// The failure of `item` in `stage` of run `run_id`, for `reason`;
    /// where it came from and an excerpt are added with [`FailureRow::at`],
    /// [`FailureRow::of_episode`] and [`FailureRow::excerpt`].
    pub fn new(
        run_id: &str,
        stage: Stage,
        item: impl Into<String>,
        reason: impl Into<String>,
        created_at: DateTime<Utc>,
    ) -> Self {
        FailureRow {
            failure_id: uuid::Uuid::now_v7().to_string(),
            run_id: run_id.to_string(),
            stage: stage.into(),
            item: item.into(),
            source_uri: None,
            line: None,
            episode_id: None,
            reason: reason.into(),
            excerpt: None,
            created_at,
        }
    }

    /// The file (and line) the failed input came from.
    pub fn at(mut self, source_uri: impl Into<String>, line: Option<i64>) -> Self {
        self.source_uri = Some(source_uri.into());
        self.line = line;
        self
    }

    /// The episode the failure belongs to.
    pub fn of_episode(mut self, episode_id: impl Into<String>) -> Self {
        self.episode_id = Some(episode_id.into());
        self
    }

    /// The start of the offending input: its first [`EXCERPT_CHARS`]
    /// characters.
    pub fn excerpt(mut self, text: &str) -> Self {
        self.excerpt = Some(text.chars().take(EXCERPT_CHARS).collect());
        self
    }
}
