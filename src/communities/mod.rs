//! `graphloom communities`: groups of closely connected nodes, found by
//! hierarchical Leiden over the facts that hold now, and committed as the
//! `communities` and `community_members` tables in one run (the commit
//! protocol every writer uses), replacing the previous communities.
//!
//! The pass reads the node ids once (for the output rows) and otherwise
//! only integers: nodes are numbered in `short_id` order, and the facts
//! come back as pairs of short ids from hash joins, so the Leiden graph is two `u32` arrays
//! and a weight per edge whatever the length of the ids. Each fact is one
//! unit of weight between its endpoints (two facts between the same nodes
//! weigh 2); ended or superseded facts do not count. Nodes with no current
//! fact belong to no community, as in GraphRAG.
//!
//! Level 0 partitions the graph; a community with more than
//! `max_cluster_size` members is split again at the next level (GraphRAG's
//! hierarchical Leiden). The same graph and seed give the same communities.

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{
    Array, ArrayBuilder, ArrayRef, AsArray, Int64Array, Int64Builder, ListBuilder, RecordBatch,
    StringArray, StringBuilder,
};
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;

use crate::store::{GraphStore, RunStats, StoreError, Table, WriteMode};

pub mod leiden;

/// Errors of the community pass.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommunityError {
    /// The graph could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A DataFusion step failed; `step` says which.
    #[error("communities: {step}: {source}")]
    Step {
        step: &'static str,
        #[source]
        source: DataFusionError,
    },
    /// The graph is beyond what `u32` node numbers hold.
    #[error("communities: {0} nodes are more than the 4,294,967,295 the pass numbers")]
    TooLarge(usize),
    /// The detection task panicked or was cancelled.
    #[error("communities: the detection task failed: {0}")]
    Task(String),
    /// Building the output rows failed.
    #[error("communities: building the rows: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

/// Result alias for the community pass.
pub type Result<T, E = CommunityError> = std::result::Result<T, E>;

fn step(step: &'static str) -> impl FnOnce(DataFusionError) -> CommunityError {
    move |source| CommunityError::Step { step, source }
}

/// Settings of the pass.
#[derive(Debug, Clone)]
pub struct CommunityOptions {
    /// Seed of Leiden's random choices.
    pub seed: u64,
    /// Communities larger than this are split at the next level (GraphRAG's
    /// default is 10).
    pub max_cluster_size: usize,
    /// Most levels of the hierarchy.
    pub max_levels: usize,
    /// Modularity resolution (higher: smaller communities).
    pub resolution: f64,
    /// Group id written in the `runs` row.
    pub group_id: String,
}

impl Default for CommunityOptions {
    fn default() -> Self {
        let p = leiden::Params::default();
        CommunityOptions {
            seed: p.seed,
            max_cluster_size: p.max_cluster_size,
            max_levels: p.max_levels,
            resolution: p.resolution,
            group_id: "default".into(),
        }
    }
}

/// What the pass found and wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct CommunityReport {
    /// The run that committed the communities.
    pub run_id: String,
    /// Nodes of the graph.
    pub nodes: usize,
    /// Current facts used as links.
    pub edges: usize,
    /// Nodes in some community (the others have no current fact).
    pub members: usize,
    /// Communities per level, level 0 first.
    pub per_level: Vec<usize>,
    /// Modularity of level 0.
    pub modularity: f64,
    /// Milliseconds reading, detecting and committing.
    pub read_ms: u128,
    /// See `read_ms`.
    pub detect_ms: u128,
    /// See `read_ms`.
    pub write_ms: u128,
}

/// Facts that hold now: not superseded, not ended.
pub const CURRENT_EDGES: &str = "expired_at IS NULL AND (invalid_at IS NULL OR invalid_at > now())";

/// Rows per output batch.
const BATCH_ROWS: usize = 1 << 20;

/// Communities found and their rows, not yet committed.
pub struct Found {
    /// Rows of `communities`.
    pub communities: Vec<RecordBatch>,
    /// Rows of `community_members`.
    pub members: Vec<RecordBatch>,
    /// Figures; `run_id` and `write_ms` are filled by the commit.
    pub report: CommunityReport,
}

/// Finds the communities of the `nodes` and `edges` tables registered in
/// `ctx` and builds their rows for run `run_id`.
pub async fn find_communities(
    ctx: &SessionContext,
    options: &CommunityOptions,
    run_id: &str,
) -> Result<Found> {
    let started = Instant::now();
    let (node_ids, edges) = read_graph(ctx).await?;
    let n = node_ids.iter().map(|a| a.len()).sum::<usize>();
    let read_ms = started.elapsed().as_millis();

    let started = Instant::now();
    let params = leiden::Params {
        seed: options.seed,
        resolution: options.resolution,
        max_cluster_size: options.max_cluster_size.max(1),
        max_levels: options.max_levels.max(1),
        ..leiden::Params::default()
    };
    let edge_count = edges.len();
    let (communities, modularity, internal) = tokio::task::spawn_blocking(move || {
        let graph = leiden::Graph::from_edges(n, &edges);
        let communities = leiden::hierarchical_leiden(&graph, &params);
        let (modularity, internal) = level_figures(&graph, n, &edges, &communities, &params);
        (communities, modularity, internal)
    })
    .await
    .map_err(|e| CommunityError::Task(e.to_string()))?;
    let detect_ms = started.elapsed().as_millis();

    let (community_rows, member_rows) = to_batches(&communities, &internal, &node_ids, run_id)?;
    let members = communities
        .iter()
        .filter(|c| c.level == 0)
        .map(|c| c.members.len())
        .sum();
    let levels = communities
        .iter()
        .map(|c| c.level as usize + 1)
        .max()
        .unwrap_or(0);
    let mut per_level = vec![0; levels];
    for c in &communities {
        per_level[c.level as usize] += 1;
    }
    Ok(Found {
        communities: community_rows,
        members: member_rows,
        report: CommunityReport {
            run_id: run_id.to_string(),
            nodes: n,
            edges: edge_count,
            members,
            per_level,
            modularity,
            read_ms,
            detect_ms,
            write_ms: 0,
        },
    })
}

/// Finds the communities of `store`'s graph and commits them as one run.
pub async fn detect_communities(
    store: &GraphStore,
    options: &CommunityOptions,
) -> Result<CommunityReport> {
    store.require_graph().await?;
    let tx = store.begin("communities", &options.group_id).await?;
    let ctx = tx.base_context().await?;
    let run_id = tx.run_id().to_string();
    let found = find_communities(&ctx, options, &run_id).await?;
    commit(tx, found).await
}

/// Commits found communities in `tx`, replacing the previous ones.
pub async fn commit(mut tx: crate::store::Transaction, found: Found) -> Result<CommunityReport> {
    let started = Instant::now();
    tx.stage(Table::Communities, WriteMode::Overwrite, found.communities);
    tx.stage(Table::CommunityMembers, WriteMode::Overwrite, found.members);
    tx.commit(RunStats::default()).await?;
    Ok(CommunityReport {
        write_ms: started.elapsed().as_millis(),
        ..found.report
    })
}

/// Node ids in number order and the current facts as number pairs.
///
/// Nodes are numbered in `short_id` order (an integer, unique per graph),
/// so numbering sorts integers, not ids; facts are joined to their nodes'
/// short ids by hash joins and mapped to numbers through a table indexed
/// by short id.
async fn read_graph(ctx: &SessionContext) -> Result<(Vec<StringArray>, Vec<(u32, u32, f64)>)> {
    let batches = ctx
        .sql("SELECT node_id, short_id FROM nodes")
        .await
        .map_err(step("planning the node read"))?
        .collect()
        .await
        .map_err(step("reading the nodes"))?;
    let mut ids: Vec<ArrayRef> = Vec::with_capacity(batches.len());
    let mut short: Vec<i64> = Vec::with_capacity(batches.iter().map(RecordBatch::num_rows).sum());
    for batch in &batches {
        ids.push(arrow::compute::cast(
            batch.column(0),
            &arrow::datatypes::DataType::Utf8,
        )?);
        let s = arrow::compute::cast(batch.column(1), &arrow::datatypes::DataType::Int64)?;
        short.extend_from_slice(s.as_primitive::<arrow::datatypes::Int64Type>().values());
    }
    drop(batches);
    let n = short.len();
    if n > u32::MAX as usize {
        return Err(CommunityError::TooLarge(n));
    }
    // Number = rank by short id (ties, which a graph does not have, by
    // read order: the sort is stable).
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by_key(|&p| short[p as usize]);
    let refs: Vec<&dyn Array> = ids.iter().map(|a| a.as_ref()).collect();
    let all = if refs.is_empty() {
        Arc::new(StringArray::from(Vec::<&str>::new())) as ArrayRef
    } else {
        arrow::compute::concat(&refs)?
    };
    drop(ids);
    let number = ShortIdNumbers::new(&short, &order);
    drop(short);
    let in_order = arrow::compute::take(&all, &arrow::array::UInt32Array::from(order), None)?;
    drop(all);
    let node_ids = vec![in_order.as_string::<i32>().clone()];

    let pairs = ctx
        .sql(&format!(
            "SELECT s.short_id AS s, t.short_id AS t \
             FROM edges e JOIN nodes s ON s.node_id = e.source_node_id \
             JOIN nodes t ON t.node_id = e.target_node_id WHERE {CURRENT_EDGES}"
        ))
        .await
        .map_err(step("planning the fact read"))?
        .collect()
        .await
        .map_err(step("reading the facts"))?;
    let mut edges = Vec::with_capacity(pairs.iter().map(RecordBatch::num_rows).sum());
    for batch in pairs {
        let s = arrow::compute::cast(batch.column(0), &arrow::datatypes::DataType::Int64)?;
        let t = arrow::compute::cast(batch.column(1), &arrow::datatypes::DataType::Int64)?;
        let s = s.as_primitive::<arrow::datatypes::Int64Type>();
        let t = t.as_primitive::<arrow::datatypes::Int64Type>();
        for (s, t) in s.values().iter().zip(t.values()) {
            if let (Some(a), Some(b)) = (number.of(*s), number.of(*t)) {
                edges.push((a, b, 1.0));
            }
        }
    }
    Ok((node_ids, edges))
}

/// Short id → node number: a table indexed by short id when the ids are
/// dense (graphloom hands them out consecutively), else a sorted lookup.
enum ShortIdNumbers {
    Dense { min: i64, numbers: Vec<u32> },
    Sorted(Vec<(i64, u32)>),
}

impl ShortIdNumbers {
    fn new(short: &[i64], order: &[u32]) -> Self {
        let (Some(&min), Some(&max)) = (short.iter().min(), short.iter().max()) else {
            return ShortIdNumbers::Sorted(Vec::new());
        };
        let span = (max - min) as u128 + 1;
        if span <= 4 * short.len() as u128 + 1024 {
            let mut numbers = vec![u32::MAX; span as usize];
            for (number, &p) in order.iter().enumerate() {
                numbers[(short[p as usize] - min) as usize] = number as u32;
            }
            ShortIdNumbers::Dense { min, numbers }
        } else {
            ShortIdNumbers::Sorted(
                order
                    .iter()
                    .enumerate()
                    .map(|(number, &p)| (short[p as usize], number as u32))
                    .collect(),
            )
        }
    }

    fn of(&self, short_id: i64) -> Option<u32> {
        match self {
            ShortIdNumbers::Dense { min, numbers } => short_id
                .checked_sub(*min)
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| numbers.get(i))
                .copied()
                .filter(|&n| n != u32::MAX),
            ShortIdNumbers::Sorted(pairs) => pairs
                .binary_search_by_key(&short_id, |&(s, _)| s)
                .ok()
                .map(|i| pairs[i].1),
        }
    }
}

/// Level 0's modularity and, per community, the facts inside it.
fn level_figures(
    graph: &leiden::Graph,
    n: usize,
    edges: &[(u32, u32, f64)],
    communities: &[leiden::Community],
    params: &leiden::Params,
) -> (f64, Vec<i64>) {
    let mut internal = vec![0i64; communities.len()];
    let levels = communities.iter().map(|c| c.level + 1).max().unwrap_or(0);
    let mut modularity = 0.0;
    let mut of = vec![u32::MAX; n];
    for level in 0..levels {
        of.fill(u32::MAX);
        for c in communities.iter().filter(|c| c.level == level) {
            for &m in &c.members {
                of[m as usize] = c.id;
            }
        }
        for &(s, t, _) in edges {
            let (a, b) = (of[s as usize], of[t as usize]);
            if a != u32::MAX && a == b {
                internal[a as usize] += 1;
            }
        }
        if level == 0 {
            // Isolated nodes are in no community; for the modularity each
            // is its own (they add nothing either way).
            let mut next = communities.len() as u32;
            let membership: Vec<u32> = of
                .iter()
                .map(|&c| {
                    if c == u32::MAX {
                        next += 1;
                        next
                    } else {
                        c
                    }
                })
                .collect();
            modularity = leiden::modularity(graph, &membership, params.resolution);
        }
    }
    (modularity, internal)
}

/// The two tables' rows.
fn to_batches(
    communities: &[leiden::Community],
    internal: &[i64],
    node_ids: &[StringArray],
    run_id: &str,
) -> Result<(Vec<RecordBatch>, Vec<RecordBatch>)> {
    let mut children: Vec<Vec<i64>> = vec![Vec::new(); communities.len()];
    for c in communities {
        if let Some(p) = c.parent {
            children[p as usize].push(c.id as i64);
        }
    }
    // Node number → (batch, row) of its id.
    let mut starts = Vec::with_capacity(node_ids.len());
    let mut at = 0usize;
    for a in node_ids {
        starts.push(at);
        at += a.len();
    }
    let id_of = |m: u32| {
        let m = m as usize;
        let b = starts.partition_point(|&s| s <= m) - 1;
        node_ids[b].value(m - starts[b])
    };

    let schema = Table::Communities.schema();
    let mut community_batches = Vec::new();
    for chunk in communities.chunks(BATCH_ROWS) {
        let mut kids = ListBuilder::new(Int64Builder::new());
        let mut parent = Int64Builder::new();
        let mut title = StringBuilder::new();
        for c in chunk {
            kids.append_value(children[c.id as usize].iter().map(|&k| Some(k)));
            parent.append_option(c.parent.map(i64::from));
            title.append_value(format!("Community {}", c.id));
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(
                chunk.iter().map(|c| c.id as i64),
            )),
            Arc::new(Int64Array::from_iter_values(
                chunk.iter().map(|c| c.level as i64),
            )),
            Arc::new(parent.finish()),
            Arc::new(kids.finish()),
            Arc::new(title.finish()),
            Arc::new(Int64Array::from_iter_values(
                chunk.iter().map(|c| c.members.len() as i64),
            )),
            Arc::new(Int64Array::from_iter_values(
                chunk.iter().map(|c| internal[c.id as usize]),
            )),
            Arc::new(StringArray::from_iter_values(chunk.iter().map(|_| run_id))),
        ];
        community_batches.push(RecordBatch::try_new(schema.clone(), columns)?);
    }

    let schema = Table::CommunityMembers.schema();
    let mut member_batches = Vec::new();
    let mut ids = Int64Builder::new();
    let mut levels = Int64Builder::new();
    let mut nodes = StringBuilder::new();
    let mut flush = |ids: &mut Int64Builder,
                     levels: &mut Int64Builder,
                     nodes: &mut StringBuilder|
     -> Result<()> {
        let rows = ids.len();
        if rows == 0 {
            return Ok(());
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(ids.finish()),
            Arc::new(levels.finish()),
            Arc::new(nodes.finish()),
            Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                run_id, rows,
            ))),
        ];
        member_batches.push(RecordBatch::try_new(schema.clone(), columns)?);
        Ok(())
    };
    for c in communities {
        for &m in &c.members {
            ids.append_value(c.id as i64);
            levels.append_value(c.level as i64);
            nodes.append_value(id_of(m));
            if ids.len() >= BATCH_ROWS {
                flush(&mut ids, &mut levels, &mut nodes)?;
            }
        }
    }
    flush(&mut ids, &mut levels, &mut nodes)?;
    Ok((community_batches, member_batches))
}

#[cfg(test)]
mod tests {
    use super::ShortIdNumbers;

    #[test]
    fn short_ids_map_to_their_rank_dense_or_sparse() {
        // Read order 0..4 with short ids 7, 3, 5, 4: numbers follow the ids.
        let short = [7, 3, 5, 4];
        let mut order: Vec<u32> = (0..4).collect();
        order.sort_by_key(|&p| short[p as usize]);
        let dense = ShortIdNumbers::new(&short, &order);
        assert!(matches!(dense, ShortIdNumbers::Dense { .. }));
        let got: Vec<_> = [3, 4, 5, 7, 6, 2, 8].iter().map(|&s| dense.of(s)).collect();
        assert_eq!(got, [Some(0), Some(1), Some(2), Some(3), None, None, None]);

        let short = [1_000_000_000_000, 3, 5];
        let mut order: Vec<u32> = (0..3).collect();
        order.sort_by_key(|&p| short[p as usize]);
        let sparse = ShortIdNumbers::new(&short, &order);
        assert!(matches!(sparse, ShortIdNumbers::Sorted(_)));
        assert_eq!(sparse.of(1_000_000_000_000), Some(2));
        assert_eq!(sparse.of(5), Some(1));
        assert_eq!(sparse.of(4), None);
    }
}
