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
//! 3. The committed side is scanned twice: once for the number of nodes
//!    behind each band key the run's mentions have (keys with more than
//!    `max_bucket` are skipped), once for the pairs. Their similarity is
//!    estimated from the signatures, cos(π · differing bits / all bits)
//!    (±0.06 at 256 bits), so no vector is fetched twice.
//! 4. Pairs at or above `min_similarity` are kept, the `top_k` most similar
//!    per mention.
//!
//! The pairs are proposals: [`super::entities::Clusters::apply`] never
//! merges on them alone; they become adjudication options for mentions no
//! other rule placed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, Float64Array, Int64Builder, ListBuilder, RecordBatch,
    StringBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{ColumnarValue, ScalarUDF, Volatility, create_udf};
use datafusion::prelude::SessionContext;

use super::ResolveSpec;
use super::entities::{
    Kind, MENTIONS_TABLE, MentionKey, Pair, decode_pairs, list_of, string_lists,
};

/// Name of the table of the probing mentions' band keys.
const PROBES_TABLE: &str = "resolve_embedding_probes";

/// The random hyperplanes for `planes` signature bits over `dims` dimensions,
/// row-major, drawn once per shape and shared.
fn hyperplanes(planes: usize, dims: usize) -> Arc<Vec<f32>> {
    /// Planes by (count, dimensions).
    type Planes = HashMap<(usize, usize), Arc<Vec<f32>>>;
    static CACHE: OnceLock<Mutex<Planes>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    Arc::clone(cache.entry((planes, dims)).or_insert_with(|| {
        // splitmix64 over a fixed seed: the planes are part of the
        // format of the band keys, so they never change between runs.
        let mut state: u64 = 0x6772_6170_686c_6f6f;
        let mut next = move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
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
    if v.is_empty() || !v.iter().all(|x| x.is_finite()) || v.iter().all(|&x| x == 0.0) {
        return None;
    }
    let planes = hyperplanes(bits, v.len());
    let mut out = vec![0u8; bits.div_ceil(8)];
    for (j, plane) in planes.chunks_exact(v.len()).enumerate() {
        let dot: f32 = plane.iter().zip(v).map(|(p, x)| p * x).sum();
        if dot >= 0.0 {
            out[j / 8] |= 1 << (j % 8);
        }
    }
    Some(out)
}

/// Cosine similarity estimated from two signatures of equal length.
pub fn signature_cosine(a: &[u8], b: &[u8]) -> f64 {
    let differ: u32 = a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum();
    let bits = (a.len().min(b.len()) * 8).max(1);
    (std::f64::consts::PI * f64::from(differ) / bits as f64).cos()
}

/// The band keys of a signature under a root type (the first label after
/// "Entity"; empty for untyped names).
pub fn band_keys(sig: &[u8], root: &str, bands: usize, band_bits: usize) -> Vec<i64> {
    let bit = |j: usize| u64::from(sig.get(j / 8).is_some_and(|b| b >> (j % 8) & 1 == 1));
    (0..bands)
        .map(|b| {
            let mut value: u64 = 0;
            for j in 0..band_bits {
                value |= bit(b * band_bits + j) << j;
            }
            // FNV-1a over the root, then the band index and its bits.
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for byte in root
                .bytes()
                .chain([0xff])
                .chain((b as u64).to_le_bytes())
                .chain(value.to_le_bytes())
            {
                h ^= u64::from(byte);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
            h as i64
        })
        .collect()
}

/// The UDFs the plans use: `embedding_signature(vector)`,
/// `embedding_bands(signature, labels)` and `signature_cosine(a, b)`.
pub fn udfs(spec: &ResolveSpec) -> Vec<ScalarUDF> {
    let (bands, band_bits) = (spec.embedding_bands, spec.embedding_band_bits);
    let bits = bands * band_bits;
    let sign = create_udf(
        "embedding_signature",
        vec![list_of(DataType::Float32)],
        DataType::Binary,
        Volatility::Immutable,
        Arc::new(move |args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let vectors = arrow::compute::cast(&arrays[0], &list_of(DataType::Float32))?;
            let vectors = vectors.as_list::<i32>();
            let mut out = BinaryBuilder::new();
            for i in 0..vectors.len() {
                let sig = if vectors.is_null(i) {
                    None
                } else {
                    let v = vectors.value(i);
                    let v = v.as_primitive::<arrow::datatypes::Float32Type>();
                    signature(v.values(), bits)
                };
                out.append_option(sig);
            }
            Ok(ColumnarValue::Array(Arc::new(out.finish())))
        }),
    );
    let band = create_udf(
        "embedding_bands",
        vec![DataType::Binary, list_of(DataType::Utf8)],
        list_of(DataType::Int64),
        Volatility::Immutable,
        Arc::new(move |args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let sigs = arrow::compute::cast(&arrays[0], &DataType::Binary)?;
            let sigs = sigs.as_binary::<i32>();
            let labels = string_lists(&arrays[1])?;
            let labels = labels.as_list::<i32>();
            let mut out = ListBuilder::new(Int64Builder::new());
            for i in 0..sigs.len() {
                if !sigs.is_null(i) {
                    let root = root_of(labels, i);
                    out.values()
                        .append_slice(&band_keys(sigs.value(i), &root, bands, band_bits));
                }
                out.append(!sigs.is_null(i));
            }
            Ok(ColumnarValue::Array(Arc::new(out.finish())))
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

/// The root type of row `i` of a labels list ("" when untyped).
fn root_of(labels: &arrow::array::ListArray, i: usize) -> String {
    if labels.is_null(i) {
        return String::new();
    }
    let l = labels.value(i);
    let l = l.as_string::<i32>();
    if l.len() > 1 && l.is_valid(1) {
        l.value(1).to_string()
    } else {
        String::new()
    }
}

fn probes_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("mention_id", DataType::Int64, false),
        Field::new("group_id", DataType::Utf8, false),
        Field::new("labels", list_of(DataType::Utf8), false),
        Field::new("sig", DataType::Binary, false),
        Field::new("k", DataType::Int64, false),
    ]))
}

/// The probing mentions as rows of band keys: `vectors[i]` is the name
/// vector of `mentions[i]` (the mentions table's `mention_id` is `i`).
fn probe_batch(
    mentions: &[MentionKey],
    vectors: &[Option<Arc<[f32]>>],
    spec: &ResolveSpec,
) -> Result<RecordBatch, DataFusionError> {
    use rayon::prelude::*;
    let (bands, band_bits) = (spec.embedding_bands, spec.embedding_band_bits);
    // Hashing is the CPU-heavy part (a dot product per signature bit).
    let signed: Vec<(usize, Vec<u8>)> = vectors
        .par_iter()
        .enumerate()
        .filter_map(|(i, v)| Some((i, signature(v.as_deref()?, bands * band_bits)?)))
        .collect();
    let mut ids = Int64Builder::new();
    let mut groups = StringBuilder::new();
    let mut labels = ListBuilder::new(StringBuilder::new());
    let mut sigs = BinaryBuilder::new();
    let mut keys = Int64Builder::new();
    for (i, sig) in &signed {
        let m = &mentions[*i];
        let root = m.chain.first().map_or("", String::as_str);
        for k in band_keys(sig, root, bands, band_bits) {
            ids.append_value(*i as i64);
            groups.append_value(&m.group_id);
            labels.values().append_value(crate::ontology::ENTITY_LABEL);
            for t in &m.chain {
                labels.values().append_value(t);
            }
            labels.append(true);
            sigs.append_value(sig);
            keys.append_value(k);
        }
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(ids.finish()),
        Arc::new(groups.finish()),
        Arc::new(labels.finish()),
        Arc::new(sigs.finish()),
        Arc::new(keys.finish()),
    ];
    Ok(RecordBatch::try_new(probes_schema(), columns)?)
}

/// Embedding candidates of the mentions that have a vector, against the
/// committed `nodes` (their `name_embedding`) and against each other, in
/// both directions (the rules read a pair from the mention's side). The
/// mentions table and the resolution UDFs must be registered on `ctx`.
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
    for f in udfs(spec) {
        ctx.register_udf(f);
    }
    let started = std::time::Instant::now();
    let batch = probe_batch(mentions, vectors, spec)
        .map_err(|e| e.context("the probing mentions' band keys"))?;
    let probes = batch.num_rows();
    super::entities::register_partitioned(ctx, PROBES_TABLE, batch)
        .map_err(|e| e.context("registering the probing mentions' band keys"))?;
    let p = PROBES_TABLE;
    let m = MENTIONS_TABLE;
    let max_bucket = spec.embedding_max_bucket;
    let min = spec.embedding_min_similarity;
    // Linked types are matched by their record-linkage rules alone.
    let (unlinked, unlinked_target) = if spec.linkage.is_empty() {
        ("", "")
    } else {
        (
            "AND linkage_of(p.labels) IS NULL",
            "AND linkage_of(q.labels) IS NULL",
        )
    };
    let node_keys = format!(
        "SELECT short_id AS target, group_id, name, type, labels, attributes, sig, \
           unnest(embedding_bands(sig, labels)) AS k \
         FROM (SELECT short_id, group_id, name, type, labels, attributes, \
           embedding_signature(name_embedding) AS sig FROM {nodes} WHERE name_embedding IS NOT NULL) \
         WHERE sig IS NOT NULL"
    );
    let top = |pairs: &str| {
        format!(
            "SELECT mention_id, target, score, CAST(1 AS BIGINT) AS n, name, labels, \
               identity_keys(type, attributes) AS ids \
             FROM (SELECT *, row_number() OVER (PARTITION BY mention_id ORDER BY score DESC, target) AS r \
               FROM (SELECT mention_id, target, max(score) AS score, first_value(name) AS name, \
                 first_value(type) AS type, first_value(labels) AS labels, first_value(attributes) AS attributes \
                 FROM ({pairs}) GROUP BY mention_id, target)) \
             WHERE r <= {k}",
            k = spec.embedding_top_k
        )
    };
    let against_nodes = top(&format!(
        "WITH t AS ({node_keys}), \
           crowded AS (SELECT group_id, k FROM t WHERE k IN (SELECT k FROM {p}) \
             GROUP BY group_id, k HAVING count(*) > {max_bucket}) \
         SELECT p.mention_id, t.target, signature_cosine(p.sig, t.sig) AS score, \
           t.name, t.type, t.labels, t.attributes \
         FROM {p} p JOIN t ON p.group_id = t.group_id AND p.k = t.k \
         LEFT ANTI JOIN crowded c ON t.group_id = c.group_id AND t.k = c.k \
         WHERE chains_compatible(p.labels, t.labels) AND signature_cosine(p.sig, t.sig) >= {min} {unlinked}"
    ));
    let among_mentions = top(&format!(
        "WITH crowded AS (SELECT group_id, k FROM {p} GROUP BY group_id, k HAVING count(*) > {max_bucket}) \
         SELECT p.mention_id, q.mention_id AS target, signature_cosine(p.sig, q.sig) AS score, \
           t.name, t.type, t.labels, t.attributes \
         FROM {p} p JOIN {p} q ON p.group_id = q.group_id AND p.k = q.k AND p.mention_id <> q.mention_id \
         JOIN {m} t ON t.mention_id = q.mention_id \
         LEFT ANTI JOIN crowded c ON p.group_id = c.group_id AND p.k = c.k \
         WHERE chains_compatible(p.labels, q.labels) AND signature_cosine(p.sig, q.sig) >= {min} \
           {unlinked} {unlinked_target}"
    ));
    let mut found = 0;
    for (sql, is_mention, what) in [
        (
            against_nodes,
            false,
            format!("embedding candidates against {nodes}"),
        ),
        (
            among_mentions,
            true,
            "embedding candidates among the run's mentions".to_string(),
        ),
    ] {
        let batches = match ctx.sql(&sql).await {
            Ok(frame) => frame.collect().await,
            Err(e) => Err(e),
        }
        .map_err(|e| e.context(what))?;
        let before = out.len();
        for b in &batches {
            decode_pairs(b, Kind::Embedding, is_mention, out)?;
        }
        found += out.len() - before;
    }
    let _ = ctx.deregister_table(PROBES_TABLE);
    tracing::debug!(
        "Embedding candidates: {found} pairs from {probes} probe keys in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
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
        let a = band_keys(&sig, "Contract", 8, 8);
        let b = band_keys(&sig, "Person", 8, 8);
        assert_eq!(a.len(), 8);
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
        let distinct: std::collections::BTreeSet<_> = a.iter().collect();
        assert_eq!(distinct.len(), 8, "each band has its own key space");
        assert_eq!(a, band_keys(&sig, "Contract", 8, 8), "deterministic");
    }
}
