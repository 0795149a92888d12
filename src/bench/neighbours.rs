//! `graphloom bench neighbours`: embedding candidates (nearest neighbours
//! by name vector, [`crate::resolve::embedding`]) over synthetic vectors,
//! timed, with peak memory and recall of the true node among the options.
//!
//! Node `i` has a Gaussian random unit vector drawn from `(seed, i)` and
//! one of four root types. A mention is, with probability
//! `existing_share`, of a random existing node: its vector is the node's
//! plus Gaussian noise sized for a cosine of `similarity` to it, its type
//! the node's; otherwise a fresh random vector (nothing should be near
//! it). Dimensions are a flag: the hashing cost grows with them, the joins
//! do not.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{
    ArrayRef, Float32Builder, Int64Array, ListBuilder, RecordBatch, StringArray, StringBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use super::resolution::BenchError;
use crate::resolve::ResolveSpec;
use crate::resolve::mentions::{MentionKey, Target};

/// Settings of `graphloom bench neighbours`.
#[derive(Debug, Clone)]
pub struct NeighboursBench {
    /// Mentions probing.
    pub mentions: usize,
    /// Committed nodes with a name vector.
    pub nodes: usize,
    /// Vector dimensions.
    pub dims: usize,
    /// Cosine of a mention of an existing node to that node's vector.
    pub similarity: f64,
    /// Share of mentions that are of an existing node.
    pub existing_share: f64,
    /// Generator seed.
    pub seed: u64,
    /// Where the nodes are written as Parquet (reused for the same seed,
    /// size and dimensions).
    pub dir: PathBuf,
    /// Resolution settings (the `embedding_*` keys are read).
    pub spec: ResolveSpec,
}

/// Figures of one bench run.
#[derive(Debug, Clone)]
pub struct NeighboursReport {
    /// Settings the figures are of.
    pub settings: NeighboursBench,
    /// Seconds spent writing the nodes (0 when reused).
    pub generate_seconds: f64,
    /// Seconds of the neighbour search.
    pub seconds: f64,
    /// Peak resident memory during the search, in bytes.
    pub peak_rss: Option<u64>,
    /// Proposals against committed nodes.
    pub node_pairs: usize,
    /// Proposals among the mentions.
    pub mention_pairs: usize,
    /// Mentions of existing nodes whose node was proposed / all of them.
    pub found: (usize, usize),
    /// Proposals for mentions of no existing node (each would be an
    /// adjudication option the LLM declines).
    pub stray: usize,
}

impl fmt::Display for NeighboursReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        writeln!(
            f,
            "neighbours bench: {} mentions against {} nodes, {} dimensions, {} bands x {} bits, min similarity {}, top {}",
            s.mentions,
            s.nodes,
            s.dims,
            s.spec.embedding_bands,
            s.spec
                .embedding_band_bits
                .map_or("auto".to_string(), |b| b.to_string()),
            s.spec.embedding_min_similarity,
            s.spec.embedding_top_k
        )?;
        super::write_time_and_memory(
            f,
            self.seconds,
            s.mentions,
            self.generate_seconds,
            self.peak_rss,
        )?;
        writeln!(
            f,
            "  proposals:   {} against nodes, {} among mentions",
            self.node_pairs, self.mention_pairs
        )?;
        let (hit, all) = self.found;
        writeln!(
            f,
            "  recall:      {:.4} ({hit}/{all} mentions of an existing node at cosine {} had it among their options)",
            hit as f64 / all.max(1) as f64,
            s.similarity
        )?;
        write!(
            f,
            "  stray:       {} proposals for mentions of no existing node",
            self.stray
        )
    }
}

const ROOTS: [&str; 4] = ["Person", "Company", "Contract", "Product"];
const ROWS_PER_FILE: usize = 250_000;

fn gaussian(rng: &mut StdRng, dims: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(dims + 1);
    while out.len() < dims {
        let (u, v): (f64, f64) = (rng.random(), rng.random());
        let r = (-2.0 * (1.0 - u).ln()).sqrt();
        let t = std::f64::consts::TAU * v;
        out.push((r * t.cos()) as f32);
        out.push((r * t.sin()) as f32);
    }
    out.truncate(dims);
    out
}

fn normalised(mut v: Vec<f32>) -> Vec<f32> {
    let n = v
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::MIN_POSITIVE);
    v.iter_mut().for_each(|x| *x /= n);
    v
}

fn node_vector(seed: u64, i: u64, dims: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i);
    normalised(gaussian(&mut rng, dims))
}

fn nodes_schema() -> SchemaRef {
    let list = |item: DataType| DataType::List(Arc::new(Field::new("item", item, true)));
    Arc::new(Schema::new(vec![
        Field::new("short_id", DataType::Int64, false),
        Field::new("group_id", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("type", DataType::Utf8, false),
        Field::new("labels", list(DataType::Utf8), false),
        Field::new("attributes", DataType::Utf8, false),
        Field::new("name_embedding", list(DataType::Float32), true),
    ]))
}

fn write_nodes_file(
    path: &Path,
    seed: u64,
    dims: usize,
    range: std::ops::Range<u64>,
) -> Result<(), BenchError> {
    let file = std::fs::File::create(path)?;
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, nodes_schema(), None)?;
    let ids: Vec<u64> = range.collect();
    for chunk in ids.chunks(32 * 1024) {
        let mut labels = ListBuilder::new(StringBuilder::new());
        let mut vectors = ListBuilder::new(Float32Builder::new());
        for &i in chunk {
            labels.values().append_value(crate::ontology::ENTITY_LABEL);
            labels.values().append_value(ROOTS[i as usize % 4]);
            labels.append(true);
            vectors.values().append_slice(&node_vector(seed, i, dims));
            vectors.append(true);
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(
                chunk.iter().map(|&i| i as i64),
            )),
            Arc::new(StringArray::from_iter_values(chunk.iter().map(|_| "bench"))),
            Arc::new(StringArray::from_iter_values(
                chunk.iter().map(|i| format!("node {i}")),
            )),
            Arc::new(StringArray::from_iter_values(
                chunk.iter().map(|&i| ROOTS[i as usize % 4]),
            )),
            Arc::new(labels.finish()),
            Arc::new(StringArray::from_iter_values(chunk.iter().map(|_| "{}"))),
            Arc::new(vectors.finish()),
        ];
        writer.write(&RecordBatch::try_new(nodes_schema(), columns)?)?;
    }
    writer.close()?;
    Ok(())
}

fn ensure_nodes(dir: &Path, seed: u64, nodes: usize, dims: usize) -> Result<f64, BenchError> {
    let started = Instant::now();
    let marker = dir.join("_complete");
    let stamp = format!("seed={seed} nodes={nodes} dims={dims} format=1");
    if std::fs::read_to_string(&marker).is_ok_and(|s| s == stamp) {
        return Ok(0.0);
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    (0..nodes.div_ceil(ROWS_PER_FILE))
        .into_par_iter()
        .try_for_each(|f| {
            let start = (f * ROWS_PER_FILE) as u64;
            let end = ((f + 1) * ROWS_PER_FILE).min(nodes) as u64;
            write_nodes_file(
                &dir.join(format!("part-{f:05}.parquet")),
                seed,
                dims,
                start..end,
            )
        })?;
    std::fs::write(&marker, stamp)?;
    Ok(started.elapsed().as_secs_f64())
}

/// The mentions, their vectors, and the node each is of (if any).
type Probes = (Vec<MentionKey>, Vec<Option<Arc<[f32]>>>, Vec<Option<i64>>);

fn probes(b: &NeighboursBench) -> Probes {
    let (dims, c) = (b.dims, b.similarity.clamp(0.0, 1.0));
    // |noise|² ≈ dims·σ², so cos ≈ 1/√(1 + dims·σ²).
    let sigma = if c > 0.0 {
        ((1.0 / (c * c) - 1.0) / dims as f64).sqrt()
    } else {
        1.0
    };
    let rows: Vec<(MentionKey, Arc<[f32]>, Option<i64>)> = (0..b.mentions)
        .into_par_iter()
        .map(|j| {
            let mut rng = StdRng::seed_from_u64(b.seed ^ 0x006e_6569_6768 ^ (j as u64) << 20);
            let existing = b.nodes > 0 && rng.random::<f64>() < b.existing_share;
            let (vector, root, truth) = if existing {
                let i = rng.random_range(0..b.nodes as u64);
                let base = node_vector(b.seed, i, dims);
                let noise = gaussian(&mut rng, dims);
                let v: Vec<f32> = base
                    .iter()
                    .zip(&noise)
                    .map(|(x, n)| x + (sigma as f32) * n)
                    .collect();
                (normalised(v), ROOTS[i as usize % 4], Some(i as i64))
            } else {
                let root = ROOTS[rng.random_range(0..4)];
                (normalised(gaussian(&mut rng, dims)), root, None)
            };
            let key = MentionKey {
                group_id: "bench".into(),
                name: format!("mention {j}"),
                chain: vec![root.to_string()],
                attributes: "{}".into(),
            };
            (key, Arc::from(vector), truth)
        })
        .collect();
    let mut keys = Vec::with_capacity(rows.len());
    let mut vectors = Vec::with_capacity(rows.len());
    let mut truth = Vec::with_capacity(rows.len());
    for (k, v, t) in rows {
        keys.push(k);
        vectors.push(Some(v));
        truth.push(t);
    }
    (keys, vectors, truth)
}

/// Runs the bench.
pub async fn run_neighbours_bench(b: NeighboursBench) -> Result<NeighboursReport, BenchError> {
    let (dir, seed, nodes, dims) = (b.dir.clone(), b.seed, b.nodes, b.dims);
    let generate_seconds = if nodes > 0 {
        tokio::task::spawn_blocking(move || ensure_nodes(&dir, seed, nodes, dims))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))??
    } else {
        0.0
    };
    let (mentions, vectors, truth) = probes(&b);
    let config = SessionConfig::new()
        .with_target_partitions(std::thread::available_parallelism().map_or(2, |n| n.get()));
    let ctx = SessionContext::new_with_config(config);
    if nodes > 0 {
        ctx.register_parquet(
            "bench_nodes",
            b.dir.to_string_lossy().as_ref(),
            ParquetReadOptions::default(),
        )
        .await?;
    } else {
        ctx.register_batch("bench_nodes", RecordBatch::new_empty(nodes_schema()))?;
    }
    super::reset_peak_rss();
    let started = Instant::now();
    let pairs =
        crate::resolve::embedding::neighbours(&ctx, "bench_nodes", &mentions, &vectors, &b.spec)
            .await?;
    let seconds = started.elapsed().as_secs_f64();
    let peak = super::peak_rss();
    let mut found = vec![false; mentions.len()];
    let (mut node_pairs, mut mention_pairs, mut stray) = (0, 0, 0);
    for p in &pairs {
        match p.target {
            Target::Node(n) => {
                node_pairs += 1;
                if truth[p.mention] == Some(n) {
                    found[p.mention] = true;
                }
            }
            Target::Mention(_) => mention_pairs += 1,
        }
        if truth[p.mention].is_none() {
            stray += 1;
        }
    }
    let existing = truth.iter().filter(|t| t.is_some()).count();
    let hit = found.iter().filter(|f| **f).count();
    Ok(NeighboursReport {
        settings: b,
        generate_seconds,
        seconds,
        peak_rss: peak,
        node_pairs,
        mention_pairs,
        found: (hit, existing),
        stray,
    })
}
