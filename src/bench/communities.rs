//! `graphloom bench communities`: the community pass over a synthetic
//! graph of planted groups (10–50 nodes, four in five links inside a
//! group), at the size asked and optionally at a tenth of it: the time to
//! number nodes and facts (DataFusion over Parquet), to run hierarchical
//! Leiden, and to commit the two tables into a fresh graph, with peak
//! memory and how many planted links end inside one level-0 community.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::resolution::BenchError;
use crate::communities::{self, CommunityOptions};
use crate::store::GraphStore;

/// Settings of the bench.
#[derive(Debug, Clone)]
pub struct CommunitiesBench {
    /// Nodes of the largest graph.
    pub nodes: usize,
    /// Also run at nodes / scale first.
    pub scale: Option<usize>,
    /// Generator and Leiden seed.
    pub seed: u64,
    /// Working directory (emptied first).
    pub dir: PathBuf,
}

/// Figures of one size.
#[derive(Debug, Clone)]
pub struct SizeReport {
    nodes: usize,
    edges: usize,
    generate_s: f64,
    read_s: f64,
    detect_s: f64,
    commit_s: f64,
    per_level: Vec<usize>,
    modularity: f64,
    planted_inside: f64,
    peak_rss: Option<u64>,
}

impl SizeReport {
    fn total(&self) -> f64 {
        self.read_s + self.detect_s + self.commit_s
    }
}

/// Figures of the bench.
#[derive(Debug, Clone)]
pub struct CommunitiesReport {
    sizes: Vec<SizeReport>,
}

impl fmt::Display for CommunitiesReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "bench communities (hierarchical Leiden, max_cluster_size 10)"
        )?;
        for s in &self.sizes {
            writeln!(f, "  {} nodes, {} facts:", s.nodes, s.edges)?;
            writeln!(
                f,
                "    number nodes+facts {:.2} s, leiden {:.2} s, commit {:.2} s, total {:.2} s (generating the Parquet files took {:.1} s, not counted)",
                s.read_s,
                s.detect_s,
                s.commit_s,
                s.total(),
                s.generate_s
            )?;
            writeln!(
                f,
                "    communities per level {:?}; modularity of level 0 {:.3}; planted links inside one level-0 community {:.3}",
                s.per_level, s.modularity, s.planted_inside
            )?;
            if let Some(b) = s.peak_rss {
                writeln!(
                    f,
                    "    peak memory {:.2} GiB",
                    b as f64 / (1u64 << 30) as f64
                )?;
            }
        }
        if let [small, large] = &self.sizes[..] {
            writeln!(
                f,
                "  ratio for {:.0}× the nodes: total {:.1}× (number {:.1}×, leiden {:.1}×, commit {:.1}×)",
                large.nodes as f64 / small.nodes as f64,
                large.total() / small.total().max(1e-9),
                large.read_s / small.read_s.max(1e-9),
                large.detect_s / small.detect_s.max(1e-9),
                large.commit_s / small.commit_s.max(1e-9),
            )?;
        }
        Ok(())
    }
}

fn node_id(i: usize) -> String {
    format!("node-{i:010}")
}

/// Writes nodes.parquet and edges.parquet of a planted-group graph; returns
/// the edge count and the planted group of every node.
fn generate(dir: &Path, n: usize, seed: u64) -> Result<(usize, Vec<u32>), BenchError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut group = Vec::with_capacity(n);
    let mut starts = Vec::new();
    while group.len() < n {
        let size = rng.random_range(10..=50).min(n - group.len());
        starts.push(group.len());
        let g = starts.len() as u32 - 1;
        group.extend(std::iter::repeat_n(g, size));
    }
    starts.push(n);
    let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let nodes_schema = Arc::new(Schema::new(vec![
        Field::new("node_id", DataType::Utf8, false),
        Field::new("short_id", DataType::Int64, false),
    ]));
    let edges_schema = Arc::new(Schema::new(vec![
        Field::new("source_node_id", DataType::Utf8, false),
        Field::new("target_node_id", DataType::Utf8, false),
        Field::new("invalid_at", ts.clone(), true),
        Field::new("expired_at", ts, true),
    ]));
    let io = |e: std::io::Error| BenchError::Step(e.to_string());
    let pq = |e: parquet::errors::ParquetError| BenchError::Step(e.to_string());
    let arrow_err = |e: arrow::error::ArrowError| BenchError::Step(e.to_string());
    let mut nodes_writer = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(dir.join("nodes.parquet")).map_err(io)?,
        nodes_schema.clone(),
        None,
    )
    .map_err(pq)?;
    const CHUNK: usize = 1 << 20;
    for lo in (0..n).step_by(CHUNK) {
        let ids = StringArray::from_iter_values((lo..(lo + CHUNK).min(n)).map(node_id));
        let short = arrow::array::Int64Array::from_iter_values(
            (lo..(lo + CHUNK).min(n)).map(|i| i as i64 + 1),
        );
        let batch = RecordBatch::try_new(
            nodes_schema.clone(),
            vec![Arc::new(ids) as ArrayRef, Arc::new(short) as ArrayRef],
        )
        .map_err(arrow_err)?;
        nodes_writer.write(&batch).map_err(pq)?;
    }
    nodes_writer.close().map_err(pq)?;

    let mut edges_writer = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(dir.join("edges.parquet")).map_err(io)?,
        edges_schema.clone(),
        None,
    )
    .map_err(pq)?;
    let m = 2 * n;
    for lo in (0..m).step_by(CHUNK) {
        let rows = (lo + CHUNK).min(m) - lo;
        let mut s = Vec::with_capacity(rows);
        let mut t = Vec::with_capacity(rows);
        for _ in 0..rows {
            let a = rng.random_range(0..n);
            let b = if rng.random_range(0..5) < 4 {
                let g = group[a] as usize;
                rng.random_range(starts[g]..starts[g + 1])
            } else {
                rng.random_range(0..n)
            };
            s.push(node_id(a));
            t.push(node_id(b));
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(s)),
            Arc::new(StringArray::from(t)),
            Arc::new(TimestampMicrosecondArray::new_null(rows).with_timezone("UTC")),
            Arc::new(TimestampMicrosecondArray::new_null(rows).with_timezone("UTC")),
        ];
        let batch = RecordBatch::try_new(edges_schema.clone(), columns).map_err(arrow_err)?;
        edges_writer.write(&batch).map_err(pq)?;
    }
    edges_writer.close().map_err(pq)?;
    Ok((m, group))
}

/// Share of planted (same-group) links whose ends share a level-0 community.
async fn planted_inside(
    ctx: &SessionContext,
    graph: &GraphStore,
    group: &[u32],
) -> Result<f64, BenchError> {
    let df = |e: datafusion::error::DataFusionError| BenchError::Step(e.to_string());
    let snapshot = graph
        .existing_snapshot()
        .await
        .map_err(|e| BenchError::Step(e.to_string()))?;
    let members = snapshot
        .read(crate::store::Table::CommunityMembers)
        .await
        .map_err(|e| BenchError::Step(e.to_string()))?;
    let mut of = vec![u32::MAX; group.len()];
    for b in &members {
        use arrow::array::AsArray;
        let ids = b
            .column_by_name("community_id")
            .map(|c| c.as_primitive::<arrow::datatypes::Int64Type>().clone());
        let levels = b
            .column_by_name("level")
            .map(|c| c.as_primitive::<arrow::datatypes::Int64Type>().clone());
        let nodes = b
            .column_by_name("node_id")
            .and_then(|c| arrow::compute::cast(c, &DataType::Utf8).ok())
            .map(|c| c.as_string::<i32>().clone());
        if let (Some(ids), Some(levels), Some(nodes)) = (ids, levels, nodes) {
            for r in 0..b.num_rows() {
                if levels.value(r) == 0
                    && let Some(i) = nodes
                        .value(r)
                        .strip_prefix("node-")
                        .and_then(|d| d.parse::<usize>().ok())
                {
                    of[i] = ids.value(r) as u32;
                }
            }
        }
    }
    let edges = ctx
        .sql("SELECT source_node_id, target_node_id FROM edges")
        .await
        .map_err(df)?
        .collect()
        .await
        .map_err(df)?;
    let (mut planted, mut inside) = (0u64, 0u64);
    for b in &edges {
        use arrow::array::AsArray;
        let s = arrow::compute::cast(b.column(0), &DataType::Utf8)
            .map_err(|e| BenchError::Step(e.to_string()))?;
        let t = arrow::compute::cast(b.column(1), &DataType::Utf8)
            .map_err(|e| BenchError::Step(e.to_string()))?;
        let (s, t) = (s.as_string::<i32>(), t.as_string::<i32>());
        for r in 0..b.num_rows() {
            let a: usize = s.value(r)[5..].parse().unwrap_or(0);
            let c: usize = t.value(r)[5..].parse().unwrap_or(0);
            if group[a] == group[c] && a != c {
                planted += 1;
                if of[a] != u32::MAX && of[a] == of[c] {
                    inside += 1;
                }
            }
        }
    }
    Ok(inside as f64 / planted.max(1) as f64)
}

async fn one_size(dir: &Path, n: usize, seed: u64) -> Result<SizeReport, BenchError> {
    let io = |e: std::io::Error| BenchError::Step(e.to_string());
    let df = |e: datafusion::error::DataFusionError| BenchError::Step(e.to_string());
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(io)?;
    let started = Instant::now();
    let (edges, group) = generate(dir, n, seed)?;
    let generate_s = started.elapsed().as_secs_f64();

    let ctx = SessionContext::new();
    for table in ["nodes", "edges"] {
        let path = dir.join(format!("{table}.parquet"));
        ctx.register_parquet(
            table,
            path.to_string_lossy().as_ref(),
            ParquetReadOptions::default(),
        )
        .await
        .map_err(df)?;
    }
    let graph = GraphStore::open(&dir.join("graph").to_string_lossy(), &Default::default())
        .map_err(|e| BenchError::Step(e.to_string()))?;
    super::reset_peak_rss();
    let tx = graph
        .begin("communities", "bench")
        .await
        .map_err(|e| BenchError::Step(e.to_string()))?;
    let run_id = tx.run_id().to_string();
    let options = CommunityOptions {
        seed,
        ..CommunityOptions::default()
    };
    let found = communities::find_communities(&ctx, &options, &run_id)
        .await
        .map_err(|e| BenchError::Step(e.to_string()))?;
    let r = communities::commit(tx, found)
        .await
        .map_err(|e| BenchError::Step(e.to_string()))?;
    let peak_rss = super::peak_rss();
    let planted_inside = planted_inside(&ctx, &graph, &group).await?;
    Ok(SizeReport {
        nodes: n,
        edges,
        generate_s,
        read_s: r.read_ms as f64 / 1e3,
        detect_s: r.detect_ms as f64 / 1e3,
        commit_s: r.write_ms as f64 / 1e3,
        per_level: r.per_level,
        modularity: r.modularity,
        planted_inside,
        peak_rss,
    })
}

/// Runs the bench.
pub async fn run_communities_bench(b: CommunitiesBench) -> Result<CommunitiesReport, BenchError> {
    let mut sizes = Vec::new();
    if let Some(scale) = b.scale.filter(|s| *s > 1) {
        sizes.push(one_size(&b.dir.join("small"), (b.nodes / scale).max(10), b.seed).await?);
    }
    sizes.push(one_size(&b.dir.join("large"), b.nodes.max(10), b.seed).await?);
    Ok(CommunitiesReport { sizes })
}
