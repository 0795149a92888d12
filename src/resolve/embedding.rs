//! Embedding candidates: the nearest committed nodes and run mentions by
//! name vector, for references no name rule finds ("our MSA" for "Master
//! Services Agreement", "the docks" for "Loading Dock B").
//!
//! Nearest neighbours are found by random-hyperplane LSH as DataFusion
//! plans, so no step holds the committed vectors in memory:
//!
//! 1. Each vector becomes a signature of `bands × band_bits` bits, bit `j`
//!    the sign of its dot product with hyperplane `j` (Gaussian entries
//!    from a fixed seed, so every run and machine draws the same planes). Two
//!    vectors at angle θ agree on a bit with probability 1 − θ/π.
//! 2. Each band of `band_bits` bits, with the root type of the chain,
//!    hashes to a band key: two names are compared when they agree on a
//!    whole band and have the same root type.
//! 3. The committed vectors are read once and hashed into an in-memory
//!    table of signatures (about 60 bytes a node). From it come the number
//!    of nodes behind each band key the run's mentions have (keys with
//!    more than `max_bucket` are skipped) and the pairs. Their similarity is
//!    estimated from the signatures, cos(π · differing bits / all bits)
//!    (about ±0.05 at 256 bits), which shortlists a few pairs per mention
//!    without carrying vectors through the joins.
//! 4. The shortlisted nodes' vectors are read once (a semi-join on
//!    `short_id`); the exact cosine keeps pairs at or above
//!    `min_similarity`, the `top_k` most similar per mention.
//!
//! The pairs are proposals: [`super::entities::Clusters::apply`] never
//! merges on them alone; they become adjudication options for mentions no
//! other rule placed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, Float64Array, Int64Array, Int64Builder, RecordBatch,
    StringBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{ColumnarValue, ScalarUDF, Volatility, create_udf};
use datafusion::prelude::SessionContext;

use super::ResolveSpec;
use super::mentions::{Kind, MentionKey, Pair, Target, list_of, string_lists, strings};
use super::udfs::register_udfs;
use crate::scratch::{register_batches, register_partitioned};

/// Name of the table of the probing mentions' band keys.
const PROBES_TABLE: &str = "resolve_embedding_probes";

/// Name of the table of the committed nodes' signatures.
const SIGNED_NODES_TABLE: &str = "resolve_embedding_nodes";

/// Name of the table of shortlisted node ids.
const SHORTLIST_TABLE: &str = "resolve_embedding_shortlist";

/// How far under `embedding_min_similarity` a signature estimate may be
/// and still be checked exactly (the estimate's standard deviation is
/// about 0.05 at 256 bits).
const SHORTLIST_SLACK: f64 = 0.15;

/// Shortlisted pairs per mention and side, as a multiple of `top_k`.
const SHORTLIST_FACTOR: usize = 3;

/// The random hyperplanes for `planes` signature bits over `dims`
/// dimensions, dimension-major (entry `d · planes + j` is coordinate `d` of
/// plane `j`), drawn once per shape and shared.
fn hyperplanes(planes: usize, dims: usize) -> Arc<Vec<f32>> {
    /// Planes by (count, dimensions).
    type Planes = HashMap<(usize, usize), Arc<Vec<f32>>>;
    static CACHE: OnceLock<Mutex<Planes>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    Arc::clone(cache.entry((planes, dims)).or_insert_with(|| {
        // splitmix64 over a fixed seed: the planes are part of the
        // format of the band keys, so they never change between runs.
        let mut next = crate::text::splitmix_stream(0x6772_6170_686c_6f6f);
        // Gaussian entries (Box-Muller): the planes' directions are
        // uniform, so the bit-agreement rule holds for every vector, also
        // sparse or axis-aligned ones (±1 entries would not do for those).
        let mut uniform = move || ((next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let mut out = Vec::with_capacity(planes * dims + 1);
        while out.len() < planes * dims {
            let (u, v) = (uniform(), uniform());
            let r = (-2.0 * u.ln()).sqrt();
            let t = std::f64::consts::TAU * v;
            out.push((r * t.cos()) as f32);
            out.push((r * t.sin()) as f32);
        }
        out.truncate(planes * dims);
        Arc::new(out)
    }))
}

/// The signature of a vector: `bits` sign bits, packed little-endian.
/// `None` for an empty, zero or non-finite vector (it has no direction).
pub fn signature(v: &[f32], bits: usize) -> Option<Vec<u8>> {
    signatures(&[v], bits).pop().flatten()
}

/// [`signature`] of many vectors (one column of a batch).
pub fn signatures(vectors: &[&[f32]], bits: usize) -> Vec<Option<Vec<u8>>> {
    let mut dots = vec![0f32; bits];
    vectors
        .iter()
        .map(|v| {
            if v.is_empty() || !v.iter().all(|x| x.is_finite()) || v.iter().all(|&x| x == 0.0) {
                return None;
            }
            let planes = hyperplanes(bits, v.len());
            // Dimension by dimension (the planes are stored
            // dimension-major): a broadcast multiply-add over all planes,
            // which vectorises, instead of one reduction per plane.
            dots.fill(0.0);
            for (row, &x) in planes.chunks_exact(bits).zip(v.iter()) {
                for (d, p) in dots.iter_mut().zip(row) {
                    *d += p * x;
                }
            }
            let mut sig = vec![0u8; bits.div_ceil(8)];
            for (j, dot) in dots.iter().enumerate() {
                if *dot >= 0.0 {
                    sig[j / 8] |= 1 << (j % 8);
                }
            }
            Some(sig)
        })
        .collect()
}

/// Cosine similarity estimated from two signatures of equal length.
pub fn signature_cosine(a: &[u8], b: &[u8]) -> f64 {
    let differ: u32 = a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum();
    let bits = (a.len().min(b.len()) * 8).max(1);
    (std::f64::consts::PI * f64::from(differ) / bits as f64).cos()
}

/// The key of band `b` of a signature under a root type (the first label
/// after "Entity"; empty for untyped names): FNV-1a over the root, the
/// band index and the band's bits.
pub fn band_key(sig: &[u8], root: &str, b: usize, band_bits: usize) -> i64 {
    let bit = |j: usize| u64::from(sig.get(j / 8).is_some_and(|x| x >> (j % 8) & 1 == 1));
    let mut value: u64 = 0;
    for j in 0..band_bits {
        value |= bit(b * band_bits + j) << j;
    }
    crate::text::fnv1a(
        root.bytes()
            .chain([0xff])
            .chain((b as u64).to_le_bytes())
            .chain(value.to_le_bytes()),
    ) as i64
}

/// The family name under which the embedding functions carry their
/// settings (bands and bits per band).
pub const FUNCTION_FAMILY: &str = "resolve.embedding";

/// Rebuilds the embedding functions from the settings they carry.
pub fn functions_from_state(state: &[u8]) -> Option<Vec<ScalarUDF>> {
    let (bands, band_bits): (usize, usize) = serde_json::from_slice(state).ok()?;
    Some(udfs(bands, band_bits))
}

/// The UDFs the plans use: `embedding_signature(vector)`,
/// `embedding_band(signature, root, band)` and `signature_cosine(a, b)`,
/// for `bands` bands of `band_bits` bits.
pub fn udfs(bands: usize, band_bits: usize) -> Vec<ScalarUDF> {
    let bits = bands * band_bits;
    let sign = create_udf(
        "embedding_signature",
        vec![list_of(DataType::Float32)],
        DataType::Binary,
        Volatility::Immutable,
        Arc::new(move |args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let vectors = float_lists(&arrays[0])?;
            let vectors = vectors.as_list::<i32>();
            let values = vectors
                .values()
                .as_primitive::<arrow::datatypes::Float32Type>();
            let offsets = vectors.value_offsets();
            let slices: Vec<&[f32]> = (0..vectors.len())
                .map(|i| {
                    if vectors.is_null(i) {
                        &[][..]
                    } else {
                        let (a, b) = (offsets[i] as usize, offsets[i + 1] as usize);
                        &values.values()[a..b]
                    }
                })
                .collect();
            let mut out = BinaryBuilder::new();
            for sig in signatures(&slices, bits) {
                out.append_option(sig);
            }
            Ok(ColumnarValue::Array(Arc::new(out.finish())))
        }),
    );
    let band = create_udf(
        "embedding_band",
        vec![DataType::Binary, DataType::Utf8, DataType::Int64],
        DataType::Int64,
        Volatility::Immutable,
        Arc::new(move |args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let sigs = arrow::compute::cast(&arrays[0], &DataType::Binary)?;
            let sigs = sigs.as_binary::<i32>();
            let roots = strings(&arrays[1])?;
            let roots = roots.as_string::<i32>();
            let band = arrow::compute::cast(&arrays[2], &DataType::Int64)?;
            let band = band.as_primitive::<arrow::datatypes::Int64Type>();
            let out: Int64Array = (0..sigs.len())
                .map(|i| {
                    if sigs.is_null(i) || band.is_null(i) {
                        return None;
                    }
                    let b = usize::try_from(band.value(i)).ok()?;
                    let root = if roots.is_null(i) { "" } else { roots.value(i) };
                    Some(band_key(sigs.value(i), root, b, band_bits))
                })
                .collect();
            Ok(ColumnarValue::Array(Arc::new(out)))
        }),
    );
    let cosine = create_udf(
        "signature_cosine",
        vec![DataType::Binary, DataType::Binary],
        DataType::Float64,
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let a = arrow::compute::cast(&arrays[0], &DataType::Binary)?;
            let b = arrow::compute::cast(&arrays[1], &DataType::Binary)?;
            let (a, b) = (a.as_binary::<i32>(), b.as_binary::<i32>());
            let out: Float64Array = a
                .iter()
                .zip(b.iter())
                .map(|(a, b)| Some(signature_cosine(a?, b?)))
                .collect();
            Ok(ColumnarValue::Array(Arc::new(out)))
        }),
    );
    vec![sign, band, cosine]
}

/// A vector column as `List<Float32>`: as it is when it already is one
/// (whatever its item field is called; a cast would copy every number),
/// cast otherwise (large or fixed-size lists, other float widths).
fn float_lists(array: &ArrayRef) -> Result<ArrayRef, DataFusionError> {
    match array.data_type() {
        DataType::List(f) if f.data_type() == &DataType::Float32 => Ok(Arc::clone(array)),
        _ => Ok(arrow::compute::cast(array, &list_of(DataType::Float32))?),
    }
}

fn probes_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("mention_id", DataType::Int64, false),
        Field::new("group_id", DataType::Utf8, false),
        Field::new("root", DataType::Utf8, false),
        Field::new("sig", DataType::Binary, false),
    ]))
}

/// Mentions per batch of the probes table.
const PROBE_BATCH_MENTIONS: usize = 8192;

/// The probing mentions with their signatures: `vectors[i]` is the name
/// vector of `mentions[i]` (the mentions table's `mention_id` is `i`).
/// Mentions of a type with a record-linkage rule do not probe: such types
/// are matched by their rules alone.
fn probe_batches(
    mentions: &[MentionKey],
    vectors: &[Option<Arc<[f32]>>],
    bits: usize,
    spec: &ResolveSpec,
) -> Result<Vec<RecordBatch>, DataFusionError> {
    use rayon::prelude::*;
    // Hashing is the CPU-heavy part (a dot product per signature bit).
    vectors
        .par_chunks(PROBE_BATCH_MENTIONS)
        .enumerate()
        .map(|(c, chunk)| {
            let first = c * PROBE_BATCH_MENTIONS;
            let slices: Vec<&[f32]> = chunk
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Some(v) if !spec.is_linked(&mentions[first + i].chain) => &v[..],
                    _ => &[][..],
                })
                .collect();
            let mut ids = Int64Builder::new();
            let mut groups = StringBuilder::new();
            let mut roots = StringBuilder::new();
            let mut sigs = BinaryBuilder::new();
            for (i, sig) in signatures(&slices, bits).into_iter().enumerate() {
                let Some(sig) = sig else { continue };
                let m = &mentions[first + i];
                ids.append_value((first + i) as i64);
                groups.append_value(&m.group_id);
                roots.append_value(m.chain.first().map_or("", String::as_str));
                sigs.append_value(&sig);
            }
            let columns: Vec<ArrayRef> = vec![
                Arc::new(ids.finish()),
                Arc::new(groups.finish()),
                Arc::new(roots.finish()),
                Arc::new(sigs.finish()),
            ];
            Ok(RecordBatch::try_new(probes_schema(), columns)?)
        })
        .collect()
}

/// The embedding candidates of `mentions` alone (no name rules), for
/// callers that want the neighbours themselves: `vectors[i]` is the name
/// vector of `mentions[i]`, `nodes` a registered table with the columns
/// of `nodes` (`name_embedding` included). Pairs come as
/// [`Kind::Embedding`], at most `embedding_top_k` per mention and target
/// side, best first.
pub async fn neighbours(
    ctx: &SessionContext,
    nodes: &str,
    mentions: &[MentionKey],
    vectors: &[Option<Arc<[f32]>>],
    spec: &ResolveSpec,
) -> Result<Vec<Pair>, DataFusionError> {
    register_udfs(ctx, spec, &std::collections::BTreeMap::new());
    let mut out = Vec::new();
    embedding_pairs(ctx, nodes, mentions, vectors, spec, &mut out).await?;
    Ok(out)
}

/// Embedding candidates of the mentions that have a vector, against the
/// committed `nodes` (their `name_embedding`) and against each other, in
/// both directions (the rules read a pair from the mention's side). The
/// resolution UDFs must be registered on `ctx`.
pub(super) async fn embedding_pairs(
    ctx: &SessionContext,
    nodes: &str,
    mentions: &[MentionKey],
    vectors: &[Option<Arc<[f32]>>],
    spec: &ResolveSpec,
    out: &mut Vec<Pair>,
) -> Result<(), DataFusionError> {
    if vectors.iter().all(Option::is_none) {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let bands = spec.embedding_bands;
    let band_bits = match spec.embedding_band_bits {
        Some(bits) => bits,
        None => auto_band_bits(ctx, nodes).await?,
    };
    let state: Arc<[u8]> = serde_json::to_vec(&(bands, band_bits))
        .unwrap_or_default()
        .into();
    for f in udfs(bands, band_bits) {
        ctx.register_udf(crate::portable::wrap(f, FUNCTION_FAMILY, state.clone()));
    }
    let batches = probe_batches(mentions, vectors, bands * band_bits, spec)
        .map_err(|e| e.context("the probing mentions' signatures"))?;
    let probes: usize = batches.iter().map(RecordBatch::num_rows).sum();
    register_batches(ctx, PROBES_TABLE, probes_schema(), batches)
        .await
        .map_err(|e| e.context("registering the probing mentions' signatures"))?;
    // Only ids and signatures go through the joins: names, labels and
    // vectors are read for the shortlist alone. The committed vectors are
    // hashed once, into a table every band below reads.
    let step = std::time::Instant::now();
    sign_nodes(ctx, nodes).await?;
    tracing::debug!(
        "signatures of {nodes}' name vectors in {:.2} s",
        step.elapsed().as_secs_f64()
    );
    // One band at a time: a plan's rows are one per node and one per
    // mention (not one per band of each), so memory stays linear in the
    // input whatever the number of bands.
    let max_bucket = spec.embedding_max_bucket;
    let min = spec.embedding_min_similarity - SHORTLIST_SLACK;
    let keep = spec.embedding_top_k * SHORTLIST_FACTOR;
    let mut best: HashMap<usize, Vec<(Target, f64)>> = HashMap::new();
    let step = std::time::Instant::now();
    for b in 0..bands {
        let p = format!(
            "SELECT mention_id, group_id, sig, embedding_band(sig, root, {b}) AS k FROM {PROBES_TABLE}"
        );
        let t = format!(
            "SELECT target, group_id, sig, embedding_band(sig, root, {b}) AS k FROM {SIGNED_NODES_TABLE}"
        );
        let against_nodes = format!(
            "WITH p AS ({p}), t AS ({t}), \
               crowded AS (SELECT group_id, k FROM t WHERE k IN (SELECT k FROM p) \
                 GROUP BY group_id, k HAVING count(*) > {max_bucket}) \
             SELECT p.mention_id, t.target, signature_cosine(p.sig, t.sig) AS score \
             FROM p JOIN t ON p.group_id = t.group_id AND p.k = t.k \
             LEFT ANTI JOIN crowded c ON t.group_id = c.group_id AND t.k = c.k \
             WHERE signature_cosine(p.sig, t.sig) >= {min}"
        );
        let among_mentions = format!(
            "WITH p AS ({p}), \
               crowded AS (SELECT group_id, k FROM p GROUP BY group_id, k HAVING count(*) > {max_bucket}) \
             SELECT p.mention_id, q.mention_id AS target, signature_cosine(p.sig, q.sig) AS score \
             FROM p JOIN p q ON p.group_id = q.group_id AND p.k = q.k AND p.mention_id <> q.mention_id \
             LEFT ANTI JOIN crowded c ON p.group_id = c.group_id AND p.k = c.k \
             WHERE signature_cosine(p.sig, q.sig) >= {min}"
        );
        for (sql, is_mention) in [(against_nodes, false), (among_mentions, true)] {
            let what = if is_mention {
                format!("embedding candidates among the run's mentions (band {b})")
            } else {
                format!("embedding candidates against {nodes} (band {b})")
            };
            let batches = match ctx.sql(&sql).await {
                Ok(frame) => frame.collect().await,
                Err(e) => Err(e),
            }
            .map_err(|e| e.context(what))?;
            for batch in &batches {
                let ids = arrow::compute::cast(batch.column(0), &DataType::Int64)?;
                let targets = arrow::compute::cast(batch.column(1), &DataType::Int64)?;
                let scores = arrow::compute::cast(batch.column(2), &DataType::Float64)?;
                let ids = ids.as_primitive::<arrow::datatypes::Int64Type>();
                let targets = targets.as_primitive::<arrow::datatypes::Int64Type>();
                let scores = scores.as_primitive::<arrow::datatypes::Float64Type>();
                for i in 0..batch.num_rows() {
                    let target = if is_mention {
                        Target::Mention(targets.value(i) as usize)
                    } else {
                        Target::Node(targets.value(i))
                    };
                    let list = best.entry(ids.value(i) as usize).or_default();
                    shortlist_push(list, target, scores.value(i), keep);
                }
            }
        }
    }
    tracing::debug!(
        "{bands} bands of {band_bits} bits joined in {:.2} s",
        step.elapsed().as_secs_f64()
    );
    let mut shortlist: Vec<(usize, Target)> = best
        .into_iter()
        .flat_map(|(m, list)| list.into_iter().map(move |(t, _)| (m, t)))
        .collect();
    shortlist.sort_unstable();
    let _ = ctx.deregister_table(PROBES_TABLE);
    let _ = ctx.deregister_table(SIGNED_NODES_TABLE);
    let shortlisted = shortlist.len();
    let exact = rescore(ctx, nodes, mentions, vectors, shortlist, spec).await?;
    let kept = exact.len();
    out.extend(exact);
    tracing::debug!(
        "Embedding candidates: {kept} of {shortlisted} shortlisted pairs from {probes} probe keys in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Hashes the committed name vectors into [`SIGNED_NODES_TABLE`]
/// (`target, group_id, root, sig`; `root` the first type label, "" for
/// untyped nodes). The scan is spread round-robin over
/// the session's partitions before hashing: a graph of one large file
/// would otherwise hash on one core.
async fn sign_nodes(ctx: &SessionContext, nodes: &str) -> Result<(), DataFusionError> {
    use datafusion::execution::FunctionRegistry;
    use datafusion::logical_expr::{Partitioning, col};
    let parts = ctx.state().config().target_partitions().max(1);
    let signed = async {
        let frame = ctx
            .sql(&format!(
                "SELECT short_id AS target, group_id, coalesce(labels[2], '') AS root, name_embedding \
                 FROM {nodes} WHERE name_embedding IS NOT NULL"
            ))
            .await?
            .repartition(Partitioning::RoundRobinBatch(parts))?;
        let sign = ctx.udf("embedding_signature")?;
        let frame = frame
            .select(vec![
                col("target"),
                col("group_id"),
                col("root"),
                sign.call(vec![col("name_embedding")]).alias("sig"),
            ])?
            .filter(col("sig").is_not_null())?;
        let schema = Arc::clone(frame.schema().inner());
        let batches = frame.collect().await?;
        register_batches(ctx, SIGNED_NODES_TABLE, schema, batches).await
    };
    signed
        .await
        .map_err(|e| e.context(format!("hashing the name vectors of {nodes}")))
}

/// Adds a pair to a mention's shortlist (`keep` per side, the best
/// estimates; a target found in several bands once, at its best).
fn shortlist_push(list: &mut Vec<(Target, f64)>, target: Target, score: f64, keep: usize) {
    if let Some(e) = list.iter_mut().find(|(t, _)| *t == target) {
        e.1 = e.1.max(score);
        return;
    }
    let side = |t: &Target| matches!(t, Target::Mention(_));
    let same: Vec<usize> = (0..list.len())
        .filter(|&i| side(&list[i].0) == side(&target))
        .collect();
    if same.len() < keep {
        list.push((target, score));
        return;
    }
    // Full: the new pair replaces the weakest of its side if it beats it.
    if let Some(&weakest) = same.iter().min_by(|&&a, &&b| {
        list[a]
            .1
            .total_cmp(&list[b].1)
            .then(list[b].0.cmp(&list[a].0))
    }) && score > list[weakest].1
    {
        list[weakest] = (target, score);
    }
}

/// Nodes per bucket [`auto_band_bits`] aims at.
const AUTO_BUCKET: f64 = 16.0;

/// Band bits for about [`AUTO_BUCKET`] nodes per bucket of the largest
/// (group, root type), from one count over the committed labels: 8 up to
/// ~4,000 nodes of a type, one more per doubling, at most 24.
async fn auto_band_bits(ctx: &SessionContext, nodes: &str) -> Result<usize, DataFusionError> {
    let sql = format!(
        "SELECT max(n) AS n FROM (SELECT count(*) AS n FROM {nodes} GROUP BY group_id, labels[2])"
    );
    let batches = match ctx.sql(&sql).await {
        Ok(frame) => frame.collect().await,
        Err(e) => Err(e),
    }
    .map_err(|e| e.context("counting committed nodes per root type for the band width"))?;
    let largest = batches
        .iter()
        .find(|b| b.num_rows() > 0)
        .and_then(|b| {
            let n = arrow::compute::cast(b.column(0), &DataType::Int64).ok()?;
            let n = n.as_primitive::<arrow::datatypes::Int64Type>();
            n.is_valid(0).then(|| n.value(0))
        })
        .unwrap_or(0);
    let bits = (largest.max(1) as f64 / AUTO_BUCKET).log2().ceil();
    let bits = (bits.max(8.0) as usize).min(24);
    tracing::debug!("embedding LSH: {bits} bits per band for {largest} nodes of the largest type");
    Ok(bits)
}

/// Estimates shortlist the pairs (by [`SHORTLIST_SLACK`] under the
/// threshold, [`SHORTLIST_FACTOR`] times `top_k` per mention); the exact
/// cosine decides, and chains must be compatible. The shortlisted nodes
/// (vector, name, labels, identity keys) are read in one semi-join on
/// `short_id`; the mentions are at hand.
async fn rescore(
    ctx: &SessionContext,
    nodes: &str,
    mentions: &[MentionKey],
    vectors: &[Option<Arc<[f32]>>],
    shortlist: Vec<(usize, Target)>,
    spec: &ResolveSpec,
) -> Result<Vec<Pair>, DataFusionError> {
    let mut targets: Vec<i64> = shortlist
        .iter()
        .filter_map(|(_, t)| match t {
            Target::Node(n) => Some(*n),
            Target::Mention(_) => None,
        })
        .collect();
    targets.sort_unstable();
    targets.dedup();
    // Node targets by short id: vector, name, chain, identity keys.
    type NodeRow = (Vec<f32>, String, Vec<String>, Vec<String>);
    let mut node_rows: HashMap<i64, NodeRow> = HashMap::with_capacity(targets.len());
    if !targets.is_empty() {
        let ids = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(targets)) as ArrayRef],
        )?;
        register_partitioned(ctx, SHORTLIST_TABLE, ids).await?;
        let unlinked = if spec.linkage.is_empty() {
            ""
        } else {
            "AND linkage_of(labels) IS NULL"
        };
        let sql = format!(
            "SELECT short_id, name_embedding, name, labels, identity_keys(type, attributes) AS ids \
             FROM {nodes} WHERE short_id IN (SELECT id FROM {SHORTLIST_TABLE}) {unlinked}"
        );
        let batches = match ctx.sql(&sql).await {
            Ok(frame) => frame.collect().await,
            Err(e) => Err(e),
        }
        .map_err(|e| e.context("reading the shortlisted nodes"));
        let _ = ctx.deregister_table(SHORTLIST_TABLE);
        for b in &batches? {
            let ids = arrow::compute::cast(b.column(0), &DataType::Int64)?;
            let ids = ids.as_primitive::<arrow::datatypes::Int64Type>();
            let lists = float_lists(b.column(1))?;
            let lists = lists.as_list::<i32>();
            let names = strings(b.column(2))?;
            let names = names.as_string::<i32>();
            let labels = string_lists(b.column(3))?;
            let labels = labels.as_list::<i32>();
            let keys = string_lists(b.column(4))?;
            let keys = keys.as_list::<i32>();
            let texts = |l: &arrow::array::ListArray, i: usize, skip: usize| -> Vec<String> {
                if l.is_null(i) {
                    return Vec::new();
                }
                let v = l.value(i);
                v.as_string::<i32>()
                    .iter()
                    .skip(skip)
                    .flatten()
                    .map(str::to_string)
                    .collect()
            };
            for i in 0..b.num_rows() {
                if lists.is_valid(i) {
                    let v = lists.value(i);
                    let v = v.as_primitive::<arrow::datatypes::Float32Type>();
                    node_rows.insert(
                        ids.value(i),
                        (
                            v.values().to_vec(),
                            names.value(i).to_string(),
                            texts(labels, i, 1),
                            texts(keys, i, 0),
                        ),
                    );
                }
            }
        }
    }
    let compatible = |a: &[String], b: &[String]| {
        let n = a.len().min(b.len());
        a[..n] == b[..n]
    };
    let mut kept: Vec<Pair> = shortlist
        .into_iter()
        .filter_map(|(m, target)| {
            let a = vectors.get(m)?.as_deref()?;
            let (b, name, chain, identity) = match target {
                Target::Node(n) => {
                    let (v, name, chain, ids) = node_rows.get(&n)?;
                    (v.as_slice(), name.clone(), chain.clone(), ids.clone())
                }
                Target::Mention(t) => (
                    vectors.get(t)?.as_deref()?,
                    mentions[t].name.clone(),
                    mentions[t].chain.clone(),
                    Vec::new(),
                ),
            };
            if !compatible(&mentions[m].chain, &chain) {
                return None;
            }
            let score = cosine(a, b)?;
            (score >= spec.embedding_min_similarity).then_some(Pair {
                mention: m,
                target,
                kind: Kind::Embedding,
                score,
                count: 1,
                name,
                chain,
                identity,
            })
        })
        .collect();
    // The most similar first per mention and side, `top_k` of each.
    kept.sort_by(|a, b| {
        (a.mention, matches!(a.target, Target::Mention(_)))
            .cmp(&(b.mention, matches!(b.target, Target::Mention(_))))
            .then(b.score.total_cmp(&a.score))
            .then(a.target.cmp(&b.target))
    });
    let mut out = Vec::with_capacity(kept.len());
    let mut last = None;
    let mut n = 0;
    for p in kept {
        let side = (p.mention, matches!(p.target, Target::Mention(_)));
        if last != Some(side) {
            last = Some(side);
            n = 0;
        }
        n += 1;
        if n <= spec.embedding_top_k {
            out.push(p);
        }
    }
    Ok(out)
}

/// Cosine similarity of two vectors of equal length; `None` otherwise or
/// when one has no direction.
pub fn cosine(a: &[f32], b: &[f32]) -> Option<f64> {
    if a.len() != b.len() || a.is_empty() {
        return None;
    }
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    let norm = (na * nb).sqrt();
    (norm > 0.0 && norm.is_finite()).then(|| dot / norm)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(v: Vec<f32>) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }

    #[test]
    fn signature_similarity_tracks_the_cosine_of_the_vectors() {
        // Two 64-d vectors at a known angle: cos = 0.8.
        let a = unit((0..64).map(|i| ((i * 7 % 13) as f32) - 6.0).collect());
        let mut b_raw: Vec<f32> = (0..64).map(|i| ((i * 5 % 11) as f32) - 5.0).collect();
        // b = 0.8·a + 0.6·(unit part of b orthogonal to a)
        let dot: f32 = a.iter().zip(&b_raw).map(|(x, y)| x * y).sum();
        for (y, x) in b_raw.iter_mut().zip(&a) {
            *y -= dot * x;
        }
        let o = unit(b_raw);
        let b: Vec<f32> = a.iter().zip(&o).map(|(x, y)| 0.8 * x + 0.6 * y).collect();
        let (sa, sb) = (signature(&a, 1024).unwrap(), signature(&b, 1024).unwrap());
        let est = signature_cosine(&sa, &sb);
        assert!((est - 0.8).abs() < 0.08, "estimated {est}, true 0.8");
        assert!((signature_cosine(&sa, &sa) - 1.0).abs() < 1e-9);
        let neg: Vec<f32> = a.iter().map(|x| -x).collect();
        let sn = signature(&neg, 1024).unwrap();
        assert!(signature_cosine(&sa, &sn) < -0.99);
    }

    #[test]
    fn a_vector_without_direction_has_no_signature() {
        assert!(signature(&[], 64).is_none());
        assert!(signature(&[0.0; 8], 64).is_none());
        assert!(signature(&[1.0, f32::NAN], 64).is_none());
    }

    #[test]
    fn band_keys_differ_by_root_type_and_band() {
        let sig = signature(&unit((0..16).map(|i| i as f32 - 7.5).collect()), 64).unwrap();
        let band_keys =
            |root: &str| -> Vec<i64> { (0..8).map(|b| band_key(&sig, root, b, 8)).collect() };
        let a = band_keys("Contract");
        let b = band_keys("Person");
        assert_eq!(a.len(), 8);
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
        let distinct: std::collections::BTreeSet<_> = a.iter().collect();
        assert_eq!(distinct.len(), 8, "each band has its own key space");
        assert_eq!(a, band_keys("Contract"), "deterministic");
    }
}
