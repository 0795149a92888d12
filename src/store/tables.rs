//! The graph's tables and their Arrow schemas. Column names are the
//! contract with users (docs/tables.md); types are chosen so that Spark,
//! Trino, DuckDB and the Python `deltalake` package read them unchanged:
//! strings, 64-bit integers, doubles, booleans, lists of strings and
//! microsecond UTC timestamps. JSON-valued columns are strings.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use crate::text::{IDENTITY_KEY_COLUMNS, NAME_KEY_COLUMNS};

/// One table of the graph; each is a Delta table in its own directory
/// under the graph root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Table {
    /// Source episodes, one row per processed episode.
    Episodes,
    /// Entities.
    Nodes,
    /// One row per (node, label), for joins.
    NodeLabels,
    /// Facts between two nodes.
    Edges,
    /// Entity types of the ontology in effect.
    EntityTypes,
    /// Edge types of the ontology in effect.
    EdgeTypes,
    /// (ancestor, descendant, distance) over entity types.
    EntityTypeClosure,
    /// (ancestor, descendant, distance) over edge types.
    EdgeTypeClosure,
    /// Communities of the graph (`graphloom communities`): one row per
    /// community of each level of the hierarchy.
    Communities,
    /// One row per (community, node).
    CommunityMembers,
    /// One row per run; the last completed row pins every other table.
    Runs,
    /// One row per LLM call (hits and misses).
    LlmCalls,
    /// Items that could not be processed, with the reason.
    Failures,
}

impl Table {
    /// Every table; data tables first, `runs` last, which is also the order
    /// a run commits them in.
    pub const ALL: [Table; 13] = [
        Table::Episodes,
        Table::Nodes,
        Table::NodeLabels,
        Table::Edges,
        Table::EntityTypes,
        Table::EdgeTypes,
        Table::EntityTypeClosure,
        Table::EdgeTypeClosure,
        Table::Communities,
        Table::CommunityMembers,
        Table::LlmCalls,
        Table::Failures,
        Table::Runs,
    ];

    /// Directory and SQL name of the table.
    pub fn name(self) -> &'static str {
        match self {
            Table::Episodes => "episodes",
            Table::Nodes => "nodes",
            Table::NodeLabels => "node_labels",
            Table::Edges => "edges",
            Table::EntityTypes => "entity_types",
            Table::EdgeTypes => "edge_types",
            Table::EntityTypeClosure => "entity_type_closure",
            Table::EdgeTypeClosure => "edge_type_closure",
            Table::Communities => "communities",
            Table::CommunityMembers => "community_members",
            Table::Runs => "runs",
            Table::LlmCalls => "llm_calls",
            Table::Failures => "failures",
        }
    }

    /// Looks a table up by its name.
    pub fn from_name(name: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Arrow schema of the table.
    pub fn schema(self) -> SchemaRef {
        let fields = match self {
            Table::Episodes => episodes_fields(),
            Table::Nodes => nodes_fields(),
            Table::NodeLabels => vec![
                text("node_id"),
                text("group_id"),
                text("label"),
                int("depth"),
            ],
            Table::Edges => edges_fields(),
            Table::EntityTypes | Table::EdgeTypes => {
                let mut f = vec![
                    text("name"),
                    text_null("parent"),
                    int("depth"),
                    text("description"),
                    text("properties"),
                ];
                if self == Table::EntityTypes {
                    f.push(list_text("identity_properties"));
                } else {
                    f.push(text("source_targets"));
                }
                f.push(text("run_id"));
                f
            }
            Table::EntityTypeClosure | Table::EdgeTypeClosure => {
                vec![text("ancestor"), text("descendant"), int("distance")]
            }
            Table::Communities => communities_fields(),
            Table::CommunityMembers => vec![
                int("community_id"),
                int("level"),
                text("node_id"),
                text("run_id"),
            ],
            Table::Runs => runs_fields(),
            Table::LlmCalls => llm_calls_fields(),
            Table::Failures => failures_fields(),
        };
        Arc::new(Schema::new(fields))
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The columns of `episodes`.
fn episodes_fields() -> Vec<Field> {
    vec![
        text("episode_id"),
        text("group_id"),
        text_null("document_id"),
        text_null("source_id"),
        text("source_uri"),
        text_null("source_description"),
        text("kind"),
        text("content"),
        ts("reference_time"),
        text("reference_time_source"),
        ts("ingested_at"),
        text("run_id"),
    ]
}

/// The columns of `nodes`.
fn nodes_fields() -> Vec<Field> {
    vec![
        text("node_id"),
        int("short_id"),
        text("group_id"),
        text("name"),
        text("name_normalized"),
        text("type"),
        list_text("labels"),
        text_null("summary"),
        text("attributes"),
        list_text("episode_ids"),
        ts("created_at"),
        ts("updated_at"),
        int("rank"),
        Field::new(
            "name_embedding",
            DataType::List(Arc::new(Field::new("item", DataType::Float32, true))),
            true,
        ),
        text("origin"),
        text("run_id"),
        // Last, and nullable: added after graphs were written
        // without them (see GraphStore's schema evolution). The
        // name's blocking keys under the settings fingerprinted in
        // `name_keys_fingerprint` (crate::text::NameKeys); null or
        // another fingerprint means resolution computes them.
        text_null(NAME_KEY_COLUMNS[0]),
        Field::new(
            NAME_KEY_COLUMNS[1],
            DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
            true,
        ),
        text_null(NAME_KEY_COLUMNS[2]),
        // Added after the name keys, nullable for the same reason:
        // the node's identity keys under the identity properties
        // fingerprinted in `identity_keys_fingerprint`
        // (crate::text::IdentityKeys).
        Field::new(
            IDENTITY_KEY_COLUMNS[0],
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        ),
        text_null(IDENTITY_KEY_COLUMNS[1]),
    ]
}

/// The columns of `edges`.
fn edges_fields() -> Vec<Field> {
    vec![
        text("edge_id"),
        text("group_id"),
        text("source_node_id"),
        text("target_node_id"),
        text("relation_type"),
        text("fact"),
        text("attributes"),
        list_text("episode_ids"),
        ts_null("valid_at"),
        ts_null("invalid_at"),
        ts("created_at"),
        ts_null("expired_at"),
        Field::new(
            "fact_embedding",
            DataType::List(Arc::new(Field::new("item", DataType::Float32, true))),
            true,
        ),
        text("origin"),
        text("run_id"),
    ]
}

/// The columns of `communities`.
fn communities_fields() -> Vec<Field> {
    vec![
        int("community_id"),
        int("level"),
        Field::new("parent", DataType::Int64, true),
        Field::new(
            "children",
            DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
            false,
        ),
        text("title"),
        int("size"),
        int("edges"),
        text("run_id"),
    ]
}

/// The columns of `runs`.
fn runs_fields() -> Vec<Field> {
    vec![
        text("run_id"),
        int("run_seq"),
        text("command"),
        text("status"),
        text("group_id"),
        ts("started_at"),
        ts("finished_at"),
        int("duration_ms"),
        int("episodes_seen"),
        int("episodes_skipped"),
        int("episodes_added"),
        int("nodes_added"),
        int("edges_added"),
        int("failures"),
        int("llm_calls"),
        int("prompt_tokens"),
        int("completion_tokens"),
        Field::new("cost_usd", DataType::Float64, true),
        text("ontology_hash"),
        text("table_versions"),
        text_null("error"),
        text("graphloom_version"),
    ]
}

/// The columns of `llm_calls`.
fn llm_calls_fields() -> Vec<Field> {
    vec![
        text("call_id"),
        text("run_id"),
        text("stage"),
        text("model"),
        text_null("item"),
        int("prompt_tokens"),
        int("completion_tokens"),
        int("latency_ms"),
        int("wait_ms"),
        int("attempts"),
        Field::new("cache_hit", DataType::Boolean, false),
        text("status"),
        text_null("error"),
        ts("created_at"),
        // Last, and nullable: added after graphs were written
        // without it (see GraphStore's schema evolution).
        text_null("endpoint"),
    ]
}

/// The columns of `failures`.
fn failures_fields() -> Vec<Field> {
    vec![
        text("failure_id"),
        text("run_id"),
        text("stage"),
        text("item"),
        text_null("source_uri"),
        Field::new("line", DataType::Int64, true),
        text_null("episode_id"),
        text("reason"),
        text_null("excerpt"),
        ts("created_at"),
    ]
}

fn text(name: &str) -> Field {
    Field::new(name, DataType::Utf8, false)
}

fn text_null(name: &str) -> Field {
    Field::new(name, DataType::Utf8, true)
}

fn int(name: &str) -> Field {
    Field::new(name, DataType::Int64, false)
}

fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn ts(name: &str) -> Field {
    Field::new(name, ts_type(), false)
}

fn ts_null(name: &str) -> Field {
    Field::new(name, ts_type(), true)
}

fn list_text(name: &str) -> Field {
    Field::new(
        name,
        DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
        false,
    )
}
