//! What a command adds to the graph, and the one way it becomes table
//! writes: `run` and `add` both hand their rows to
//! [`Transaction::stage_changes`], so short ids, label rewrites and the
//! ontology tables are handled in one place.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Int64Builder, ListBuilder, RecordBatch, StringArray, StringBuilder,
};
use arrow::datatypes::{DataType, Int64Type};
use datafusion::functions_aggregate::expr_fn::max;
use datafusion::logical_expr::JoinType;
use datafusion::prelude::{SessionContext, col};

use super::rows::{self, EdgeRow, EpisodeRow, FailureRow, LlmCallRow, NodeRow};
use rayon::prelude::*;

use super::{Result, StoreError, Table, Transaction, WriteMode, step};
use crate::ontology::Ontology;
use crate::text::{IDENTITY_KEY_COLUMNS, IdentityKeys, NAME_KEY_COLUMNS, NameKeys};

/// The rows a command adds or replaces. Empty vectors write nothing.
#[derive(Debug, Default)]
pub struct Changes {
    /// Episodes committed with their entities and facts.
    pub episodes: Vec<EpisodeRow>,
    /// New nodes and committed nodes updated in place.
    pub nodes: Vec<NodeRow>,
    /// Ids of the committed nodes among `nodes`: they replace their old
    /// rows (a Delta MERGE) and their labels are rewritten, since their
    /// type chain may have grown.
    pub updated_node_ids: Vec<String>,
    /// New edges and committed edges that changed (invalidated, merged).
    pub edges: Vec<EdgeRow>,
    /// Whether `edges` holds committed edges (then they are merged on
    /// `edge_id` instead of appended).
    pub edges_changed: bool,
    /// The command's LLM calls.
    pub llm_calls: Vec<LlmCallRow>,
    /// Items that ended in `failures`.
    pub failures: Vec<FailureRow>,
}

impl Transaction {
    /// Stages `changes`, and the ontology's four tables when its hash
    /// differs from the last completed run's. Returns that hash, for the
    /// `runs` row. Every node row is written with its name blocking keys
    /// under `keys` (the resolve settings in effect) and its identity keys
    /// under the ontology's identity properties, so later runs with the
    /// same settings read them instead of recomputing them.
    pub fn stage_changes(
        &mut self,
        changes: &Changes,
        ontology: &Ontology,
        keys: &NameKeys,
    ) -> Result<String> {
        let merge_or_append = |merge: bool, key| {
            if merge {
                WriteMode::Upsert(key)
            } else {
                WriteMode::Append
            }
        };
        let nodes_mode = merge_or_append(!changes.updated_node_ids.is_empty(), &["node_id"]);
        let edges_mode = merge_or_append(changes.edges_changed, &["edge_id"]);
        // An updated node's chain only grows (a longer compatible chain
        // wins, see resolve::stage), so its old labels are a subset of its
        // new ones: merging on (node_id, label) adds the new labels. (A
        // delete of the updated ids' old labels first put every id into
        // one IN list, which delta-rs turns into an expression nested as
        // deep as the list is long: 4,868 updated nodes overflowed the
        // stack.)
        let labels_mode =
            merge_or_append(!changes.updated_node_ids.is_empty(), &["node_id", "label"]);
        let labels = rows::node_label_rows(&changes.nodes);
        let writes = [
            (
                Table::Episodes,
                WriteMode::Append,
                rows::to_batch(Table::Episodes, &changes.episodes)?,
            ),
            (
                Table::Nodes,
                nodes_mode,
                with_blocking_keys(
                    rows::to_batch(Table::Nodes, &changes.nodes)?,
                    keys,
                    &IdentityKeys::new(crate::resolve::entities::identity_properties(ontology)),
                )?,
            ),
            (
                Table::Edges,
                edges_mode,
                rows::to_batch(Table::Edges, &changes.edges)?,
            ),
            (
                Table::LlmCalls,
                WriteMode::Append,
                rows::to_batch(Table::LlmCalls, &changes.llm_calls)?,
            ),
            (
                Table::Failures,
                WriteMode::Append,
                rows::to_batch(Table::Failures, &changes.failures)?,
            ),
        ];
        for (table, mode, batch) in writes {
            if batch.num_rows() > 0 {
                self.stage(table, mode, vec![batch]);
            }
        }
        if !labels.is_empty() {
            let batch = rows::to_batch(Table::NodeLabels, &labels)?;
            self.stage(Table::NodeLabels, labels_mode, vec![batch]);
        }
        let hash = ontology.content_hash();
        let last = self.head.last_completed.as_ref();
        if last.map(|r| r.ontology_hash.as_str()) != Some(hash.as_str()) {
            for (table, batch) in super::ontology_batches(ontology, &self.run_id)? {
                self.stage(table, WriteMode::Overwrite, vec![batch]);
            }
        }
        Ok(hash)
    }
}

/// `batch` (rows of `nodes`) with its name-key columns filled under
/// `keys` ([`name_key_columns`]) and its identity-key columns under
/// `identity` ([`identity_key_columns`]).
fn with_blocking_keys(
    batch: RecordBatch,
    keys: &NameKeys,
    identity: &IdentityKeys,
) -> Result<RecordBatch> {
    let schema = batch.schema();
    let strings = |name: &str| -> Result<ArrayRef> {
        let i = schema.index_of(name).map_err(|e| encode_err(name, e))?;
        arrow::compute::cast(batch.column(i), &DataType::Utf8).map_err(|e| encode_err(name, e))
    };
    let (groups, names) = (strings("group_id")?, strings("name_normalized")?);
    let (types, attributes) = (strings("type")?, strings("attributes")?);
    let names = name_key_columns(keys, groups.as_string(), names.as_string());
    let ids = identity_key_columns(identity, types.as_string(), attributes.as_string());
    let mut columns = batch.columns().to_vec();
    let filled = NAME_KEY_COLUMNS
        .into_iter()
        .zip(names)
        .chain(IDENTITY_KEY_COLUMNS.into_iter().zip(ids));
    for (name, array) in filled {
        let i = schema.index_of(name).map_err(|e| encode_err(name, e))?;
        columns[i] = array;
    }
    RecordBatch::try_new(schema, columns).map_err(|e| encode_err("blocking keys", e))
}

/// The two identity-key columns of `nodes` ([`IDENTITY_KEY_COLUMNS`]) for
/// rows of these final types and attributes (JSON objects). Parsing is
/// proportional to the rows, spread over rayon's threads.
pub fn identity_key_columns(
    identity: &IdentityKeys,
    types: &StringArray,
    attributes: &StringArray,
) -> [ArrayRef; 2] {
    let computed: Vec<Vec<String>> = (0..types.len())
        .into_par_iter()
        .map(|i| identity.keys(types.value(i), attributes.value(i)))
        .collect();
    let mut keys = ListBuilder::new(StringBuilder::new());
    for k in &computed {
        for v in k {
            keys.values().append_value(v);
        }
        keys.append(true);
    }
    let fingerprint = identity.fingerprint();
    let fingerprints = StringArray::from_iter_values(computed.iter().map(|_| fingerprint.as_str()));
    [Arc::new(keys.finish()), Arc::new(fingerprints)]
}

/// The three name-key columns of `nodes` ([`NAME_KEY_COLUMNS`], in the
/// table's types) for rows of these groups and normalised names. Folding
/// and MinHash are CPU work proportional to the rows, spread over rayon's
/// threads.
pub fn name_key_columns(
    keys: &NameKeys,
    groups: &StringArray,
    names_normalized: &StringArray,
) -> [ArrayRef; 3] {
    let computed: Vec<(String, Vec<i64>)> = (0..names_normalized.len())
        .into_par_iter()
        .map(|i| {
            let folded = keys.folded(names_normalized.value(i));
            let bands = keys.band_keys(groups.value(i), &folded);
            (folded, bands)
        })
        .collect();
    let mut folded = StringBuilder::new();
    let mut bands = ListBuilder::new(Int64Builder::new());
    for (f, b) in &computed {
        folded.append_value(f);
        bands.values().append_slice(b);
        bands.append(true);
    }
    let fingerprint = keys.fingerprint();
    let fingerprints = StringArray::from_iter_values(computed.iter().map(|_| fingerprint.as_str()));
    [
        Arc::new(folded.finish()),
        Arc::new(bands.finish()),
        Arc::new(fingerprints),
    ]
}

fn encode_err(what: &str, source: arrow::error::ArrowError) -> StoreError {
    StoreError::Encode {
        table: Table::Nodes.name(),
        source: arrow::error::ArrowError::InvalidArgumentError(format!(
            "filling the blocking keys ({what}): {source}"
        )),
    }
}

/// The largest `short_id` among the nodes registered in `ctx` (0 when
/// there are none): new nodes number on from it.
pub async fn max_short_id(ctx: &SessionContext) -> Result<i64> {
    let what = "the largest short id of committed nodes";
    let batches = ctx
        .table(Table::Nodes.name())
        .await
        .and_then(|t| t.aggregate(vec![], vec![max(col("short_id"))]))
        .map_err(step(what))?
        .collect()
        .await
        .map_err(step(what))?;
    let max = batches
        .first()
        .filter(|b| b.num_rows() > 0)
        .and_then(|b| b.column(0).as_primitive_opt::<Int64Type>())
        .filter(|a| !a.is_null(0))
        .map_or(0, |a| a.value(0));
    Ok(max)
}

/// The ids among `candidates` that are not in the `episodes` table
/// registered in `ctx`: an anti-join, so that a re-run does no work and a
/// grown archive only processes what is new.
pub async fn unseen_episodes(
    ctx: &SessionContext,
    candidates: &[String],
) -> Result<HashSet<String>> {
    let what = "the anti-join of the source's episodes with committed ones";
    let ids = Arc::new(StringArray::from(candidates.to_vec()));
    crate::scratch::register_column(ctx, "run_candidates", "candidate_id", ids)
        .await
        .map_err(step(what))?;
    let committed = ctx
        .table(Table::Episodes.name())
        .await
        .and_then(|t| t.select_columns(&["episode_id"]))
        .map_err(step(what))?;
    let batches = ctx
        .table("run_candidates")
        .await
        .and_then(|c| {
            c.join(
                committed,
                JoinType::LeftAnti,
                &["candidate_id"],
                &["episode_id"],
                None,
            )
        })
        .map_err(step(what))?
        .collect()
        .await
        .map_err(step(what))?;
    let mut out = HashSet::new();
    for b in batches {
        out.extend(
            b.column(0)
                .as_string::<i32>()
                .iter()
                .flatten()
                .map(str::to_string),
        );
    }
    Ok(out)
}
