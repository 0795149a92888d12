//! `graphloom bench resolve`: entity resolution over synthetic mentions and
//! committed nodes with known duplicates, timed, with peak memory and the
//! precision and recall of the merges.
//!
//! The generator is deterministic per seed. Node `i` is a function of
//! `(seed, i)`, so a mention of an existing node rebuilds its name without
//! keeping ten million names in memory. Names come from 1,792 syllables
//! (4,000 first names, about 5.7 billion surnames of 2–3 syllables), so
//! shared first names are common and same-name collisions rare but real,
//! as in real archives. Mentions are:
//!
//! * of an existing node (`existing_share`), written as a surface variant
//!   (case, punctuation, corporate suffix), with a typo, under another name
//!   with the same identity property (people's e-mail), or with a shorter
//!   chain (Contract instead of Contract/PurchaseOrder);
//! * a repeat of a new entity mentioned earlier in the run (`repeat_share`);
//! * otherwise a new entity.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, Int64Array, ListBuilder, RecordBatch, StringArray, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::resolve::entities::{Resolved, resolve_entities};
use crate::resolve::mentions::{MentionKey, Target, mentions_schema};
use crate::resolve::{ResolveSpec, normalize_name};
use crate::text::{IDENTITY_KEY_COLUMNS, IdentityKeys, NAME_KEY_COLUMNS};

/// Settings of `graphloom bench resolve`.
#[derive(Debug, Clone)]
pub struct ResolveBench {
    /// Mentions in the run.
    pub mentions: usize,
    /// Committed nodes.
    pub nodes: usize,
    /// Generator seed.
    pub seed: u64,
    /// Where the committed nodes are written as Parquet (reused when a
    /// previous bench wrote the same nodes there).
    pub dir: PathBuf,
    /// Share of mentions that are of an existing node.
    pub existing_share: f64,
    /// Share of mentions repeating a new entity of the same run.
    pub repeat_share: f64,
    /// Resolution settings (the `[resolve]` defaults unless changed).
    pub spec: ResolveSpec,
    /// Resolve on this Ballista cluster instead of in this process (its
    /// executors read the nodes and the scratch tables under `dir`).
    pub cluster: Option<crate::cluster::ClusterUrl>,
    /// Hide the nodes' stored name keys, so resolution computes every
    /// node's keys (as for a graph written before keys were stored).
    pub computed_keys: bool,
}

/// Syllables: onset + vowel + coda, 1,792 of them, so names share
/// trigrams about as unevenly as real ones do.
pub(crate) fn syllables() -> &'static [String] {
    static LIST: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    LIST.get_or_init(|| {
        const ONSETS: [&str; 28] = [
            "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
            "z", "br", "cl", "dr", "gr", "kr", "pl", "st", "th", "sh", "ch",
        ];
        const VOWELS: [&str; 8] = ["a", "e", "i", "o", "u", "ae", "ou", "y"];
        const CODAS: [&str; 8] = ["", "n", "r", "l", "s", "m", "nd", "rt"];
        let mut out = Vec::new();
        for o in ONSETS {
            for v in VOWELS {
                for c in CODAS {
                    out.push(format!("{o}{v}{c}"));
                }
            }
        }
        out
    })
}

const SUFFIXES: [(&str, &str); 4] = [
    ("Inc", "Incorporated"),
    ("Corp", "Corporation"),
    ("Ltd", "Limited"),
    ("GmbH", "GmbH"),
];

pub(crate) fn word(rng: &mut StdRng, count: usize) -> String {
    let list = syllables();
    let mut w = String::new();
    for _ in 0..count {
        w.push_str(&list[rng.random_range(0..list.len())]);
    }
    let mut c = w.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => w,
    }
}

fn first_name(seed: u64, k: u64) -> String {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_f125 ^ k.wrapping_mul(0x9e37_79b9));
    word(&mut rng, 2)
}

/// One synthetic entity: name, chain, attributes.
#[derive(Debug, Clone, PartialEq)]
struct Entity {
    name: String,
    chain: Vec<String>,
    email: Option<String>,
    first: String,
    last: String,
    suffix: Option<usize>,
}

fn entity(seed: u64, i: u64) -> Entity {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(i));
    let chain = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    match i % 10 {
        0..=4 => {
            let first = first_name(seed, rng.random_range(0..4_000));
            let syl = rng.random_range(2..=3);
            let last = word(&mut rng, syl);
            Entity {
                name: format!("{first} {last}"),
                chain: chain(&["Person"]),
                email: Some(format!(
                    "{}.{}.{i}@example.com",
                    first.to_lowercase(),
                    last.to_lowercase()
                )),
                first,
                last,
                suffix: None,
            }
        }
        5..=7 => {
            let a = word(&mut rng, 2);
            let b = word(&mut rng, 2);
            let s = rng.random_range(0..SUFFIXES.len());
            Entity {
                name: format!("{a} {b} {}", SUFFIXES[s].0),
                chain: chain(&["Organization", "Company"]),
                email: None,
                first: a,
                last: b,
                suffix: Some(s),
            }
        }
        // Order numbers and agreement codes are unique per entity (a
        // bijection of the index), as real ones are: equal codes would be
        // the same order, and no rule could tell them apart.
        8 => Entity {
            name: format!("PO {:08}", (i / 10).wrapping_mul(48_271) % 100_000_000),
            chain: chain(&["Contract", "PurchaseOrder"]),
            email: None,
            first: String::new(),
            last: String::new(),
            suffix: None,
        },
        _ => {
            let a = word(&mut rng, 2);
            Entity {
                name: format!("{a} MSA {:08}", (i / 10).wrapping_mul(7_919) % 100_000_000),
                chain: chain(&["Contract", "MasterAgreement"]),
                email: None,
                first: a,
                last: String::new(),
                suffix: None,
            }
        }
    }
}

fn attributes(e: &Entity) -> String {
    match &e.email {
        Some(m) => serde_json::json!({ "email": m }).to_string(),
        None => "{}".into(),
    }
}

/// A mention of `e` the way a document might write it.
fn variant(e: &Entity, rng: &mut StdRng) -> (MentionKey, &'static str) {
    let mut m = MentionKey {
        group_id: "bench".into(),
        name: e.name.clone(),
        chain: e.chain.clone(),
        attributes: attributes(e),
    };
    let r: f64 = rng.random();
    let mut kind = "as written";
    if r < 0.45 {
        kind = "surface";
        // Surface: case, punctuation, the other spelling of the suffix.
        m.name = match (rng.random_range(0..3), e.suffix) {
            (0, _) => e.name.to_uppercase(),
            (1, Some(s)) => format!("{} {}, {}.", e.first, e.last, SUFFIXES[s].1),
            _ => format!("{}.", e.name.to_lowercase()),
        };
    } else if r < 0.65 {
        // A typo inside the longest word.
        kind = if e.chain[0] == "Contract" {
            "typo in a code"
        } else {
            "typo"
        };
        let mut words: Vec<String> = e.name.split(' ').map(str::to_string).collect();
        if let Some(w) = words
            .iter_mut()
            .filter(|w| w.len() >= 6)
            .max_by_key(|w| w.len())
        {
            let mut chars: Vec<char> = w.chars().collect();
            let at = rng.random_range(1..chars.len() - 1);
            let c = (b'a' + rng.random_range(0..26u8)) as char;
            chars[at] = c;
            *w = chars.into_iter().collect();
        }
        m.name = words.join(" ");
    } else if r < 0.8 && e.email.is_some() {
        // Another name, the same e-mail.
        kind = "other name, same e-mail";
        m.name = format!("{}. {}", &e.first[..1], e.last);
    } else if e.chain.len() > 1 {
        // A shorter chain: typed at the parent only.
        kind = "parent type only";
        m.chain.truncate(1);
        m.attributes = "{}".into();
    }
    (m, kind)
}

/// The columns of `nodes` that resolution reads: the mentions table's,
/// with `node_id` and `short_id` in place of `mention_id`, then the stored
/// name keys as `graphloom run` and `add` write them.
fn nodes_schema() -> SchemaRef {
    let mut fields = vec![
        Field::new("node_id", DataType::Utf8, false),
        Field::new("short_id", DataType::Int64, false),
    ];
    fields.extend(
        mentions_schema()
            .fields()
            .iter()
            .skip(1)
            .map(|f| f.as_ref().clone()),
    );
    let nodes = crate::store::Table::Nodes.schema();
    for key in NAME_KEY_COLUMNS.into_iter().chain(IDENTITY_KEY_COLUMNS) {
        fields.push(nodes.field_with_name(key).expect("a nodes column").clone());
    }
    Arc::new(Schema::new(fields))
}

/// The bench ontology's identity properties: a person's e-mail.
fn identity_properties() -> BTreeMap<String, Vec<String>> {
    [("Person".to_string(), vec!["email".to_string()])].into()
}

const ROWS_PER_FILE: usize = 500_000;

fn write_nodes_file(path: &Path, seed: u64, range: std::ops::Range<u64>) -> Result<(), BenchError> {
    let file = std::fs::File::create(path)?;
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(128 * 1024))
        .build();
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, nodes_schema(), Some(props))?;
    let ids: Vec<u64> = range.collect();
    // The keys a graph written under the default settings stores.
    let keys = ResolveSpec::default().name_keys();
    let identity = IdentityKeys::new(identity_properties());
    for chunk in ids.chunks(64 * 1024) {
        let es: Vec<Entity> = chunk.iter().map(|&i| entity(seed, i)).collect();
        let groups = StringArray::from_iter_values(chunk.iter().map(|_| "bench"));
        let normalized = StringArray::from_iter_values(es.iter().map(|e| normalize_name(&e.name)));
        let key_columns = crate::store::name_key_columns(&keys, &groups, &normalized);
        let types = StringArray::from_iter_values(
            es.iter()
                .map(|e| e.chain.last().map_or("Entity", String::as_str)),
        );
        let attributes = StringArray::from_iter_values(es.iter().map(attributes));
        let id_columns = crate::store::identity_key_columns(&identity, &types, &attributes);
        let mut labels = ListBuilder::new(StringBuilder::new());
        for e in &es {
            labels.values().append_value("Entity");
            for t in &e.chain {
                labels.values().append_value(t);
            }
            labels.append(true);
        }
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(
                chunk.iter().map(|i| format!("node-{seed}-{i}")),
            )),
            Arc::new(Int64Array::from_iter_values(
                chunk.iter().map(|&i| i as i64),
            )),
            Arc::new(groups),
            Arc::new(StringArray::from_iter_values(
                es.iter().map(|e| e.name.as_str()),
            )),
            Arc::new(normalized),
            Arc::new(types),
            Arc::new(labels.finish()),
            Arc::new(attributes),
        ];
        columns.extend(key_columns);
        columns.extend(id_columns);
        writer.write(&RecordBatch::try_new(nodes_schema(), columns)?)?;
    }
    writer.close()?;
    Ok(())
}

/// Writes the committed nodes as Parquet files under `dir` (skipped when a
/// marker says the same nodes are already there). Returns the seconds spent.
fn ensure_nodes(dir: &Path, seed: u64, nodes: usize) -> Result<f64, BenchError> {
    let started = Instant::now();
    let marker = dir.join("_complete");
    let stamp = format!("seed={seed} nodes={nodes} format=5");
    if std::fs::read_to_string(&marker).is_ok_and(|s| s == stamp) {
        return Ok(0.0);
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    let files = nodes.div_ceil(ROWS_PER_FILE);
    (0..files).into_par_iter().try_for_each(|f| {
        let start = (f * ROWS_PER_FILE) as u64;
        let end = ((f + 1) * ROWS_PER_FILE).min(nodes) as u64;
        write_nodes_file(&dir.join(format!("part-{f:05}.parquet")), seed, start..end)
    })?;
    std::fs::write(&marker, stamp)?;
    Ok(started.elapsed().as_secs_f64())
}

/// Which entity a mention really is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Truth {
    Existing(i64),
    New(u64),
}

fn mentions(b: &ResolveBench) -> (Vec<MentionKey>, Vec<Truth>, Vec<&'static str>) {
    let mut rng = StdRng::seed_from_u64(b.seed ^ 0x00de_ad00_beef);
    let (mut out, mut truth) = (
        Vec::with_capacity(b.mentions),
        Vec::with_capacity(b.mentions),
    );
    let mut kinds = Vec::with_capacity(b.mentions);
    let mut new_count: u64 = 0;
    let base = b.nodes as u64;
    for _ in 0..b.mentions {
        let r: f64 = rng.random();
        if r < b.existing_share && b.nodes > 0 {
            let x = rng.random_range(0..base);
            let (m, kind) = variant(&entity(b.seed, x), &mut rng);
            out.push(m);
            kinds.push(kind);
            truth.push(Truth::Existing(x as i64));
        } else if r < b.existing_share + b.repeat_share && new_count > 0 {
            let k = rng.random_range(0..new_count);
            let (m, kind) = variant(&entity(b.seed, base + k), &mut rng);
            out.push(m);
            kinds.push(kind);
            truth.push(Truth::New(k));
        } else {
            let e = entity(b.seed, base + new_count);
            out.push(MentionKey {
                group_id: "bench".into(),
                name: e.name.clone(),
                chain: e.chain.clone(),
                attributes: attributes(&e),
            });
            truth.push(Truth::New(new_count));
            kinds.push("new");
            new_count += 1;
        }
    }
    (out, truth, kinds)
}

/// Errors of the benches.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// Writing the synthetic nodes failed.
    #[error("bench data: {0}")]
    Io(#[from] std::io::Error),
    /// Encoding Parquet failed.
    #[error("bench data: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Building a batch failed.
    #[error("bench data: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// Resolution failed.
    #[error("resolution: {0}")]
    DataFusion(#[from] datafusion::error::DataFusionError),
    /// A step of the run or add bench failed (the message says which).
    #[error("bench: {0}")]
    Step(String),
}

/// Figures of one bench run.
#[derive(Debug, Clone)]
pub struct ResolveReport {
    /// Mentions resolved.
    pub mentions: usize,
    /// Committed nodes.
    pub nodes: usize,
    /// Seconds spent writing the nodes (0 when reused).
    pub generate_seconds: f64,
    /// Seconds of resolution (candidate joins + rules).
    pub seconds: f64,
    /// Peak resident memory during resolution, in bytes (None off Linux).
    pub peak_rss: Option<u64>,
    /// Candidate pairs by kind.
    pub pairs: BTreeMap<String, usize>,
    /// Mentions left ambiguous (separate without an LLM).
    pub ambiguous: usize,
    /// Adjudication calls those would take.
    pub adjudication_calls: usize,
    /// Precision and recall had a correct adjudicator answered them.
    pub with_adjudication: (f64, f64),
    /// Mentions merged into a committed node: right / made / should.
    pub node_merges: (u64, u64, u64),
    /// Mention pairs put together: right / made / should.
    pub pair_merges: (u64, u64, u64),
    /// A few wrong merges into committed nodes, as "mention → node".
    pub wrong_samples: Vec<String>,
    /// Mentions of committed nodes by how they were written: merged into
    /// the right node / all.
    pub by_variant: BTreeMap<&'static str, (u64, u64)>,
}

impl ResolveReport {
    /// Precision over both kinds of merges.
    pub fn precision(&self) -> f64 {
        precision(self.node_merges, self.pair_merges)
    }

    /// Recall over both kinds of merges.
    pub fn recall(&self) -> f64 {
        recall(self.node_merges, self.pair_merges)
    }
}

impl fmt::Display for ResolveReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "resolve bench: {} mentions against {} committed nodes",
            self.mentions, self.nodes
        )?;
        super::write_time_and_memory(
            f,
            self.seconds,
            self.mentions,
            self.generate_seconds,
            self.peak_rss,
        )?;
        let pairs: Vec<String> = self.pairs.iter().map(|(k, v)| format!("{k} {v}")).collect();
        writeln!(f, "  candidates:  {}", pairs.join(", "))?;
        writeln!(
            f,
            "  ambiguous:   {} mentions left separate (no LLM in the bench; {} adjudication calls would ask about them)",
            self.ambiguous, self.adjudication_calls
        )?;
        let (r, m, s) = self.node_merges;
        writeln!(
            f,
            "  to committed nodes: {r} right of {m} made, {s} expected"
        )?;
        let (r, m, s) = self.pair_merges;
        writeln!(
            f,
            "  mention pairs:      {r} right of {m} made, {s} expected"
        )?;
        let recall: Vec<String> = self
            .by_variant
            .iter()
            .map(|(k, (r, n))| format!("{k} {:.3} ({r}/{n})", *r as f64 / (*n).max(1) as f64))
            .collect();
        writeln!(f, "  recall by variant: {}", recall.join(", "))?;
        for w in &self.wrong_samples {
            writeln!(f, "  wrong merge: {w}")?;
        }
        writeln!(
            f,
            "  precision {:.4}, recall {:.4} (rules alone)",
            self.precision(),
            self.recall()
        )?;
        write!(
            f,
            "  precision {:.4}, recall {:.4} had a correct adjudicator answered the ambiguous mentions",
            self.with_adjudication.0, self.with_adjudication.1
        )
    }
}

fn pairs_of(n: u64) -> u64 {
    n * n.saturating_sub(1) / 2
}

/// Runs the bench.
pub async fn run_resolve_bench(b: ResolveBench) -> Result<ResolveReport, BenchError> {
    let dir = b.dir.clone();
    let (seed, nodes) = (b.seed, b.nodes);
    let generate_seconds = if nodes > 0 {
        tokio::task::spawn_blocking(move || ensure_nodes(&dir, seed, nodes))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))??
    } else {
        0.0
    };
    let (mentions, truth, kinds) = mentions(&b);
    let (ctx, scratch) = match &b.cluster {
        None => {
            // DataFusion settings from `DATAFUSION_*` variables, as
            // `graphloom sql` reads them, to compare plans without a
            // rebuild; by default a partition per core.
            let config = SessionConfig::from_env()
                .map_err(|e| e.context("reading DATAFUSION_* settings from the environment"))?;
            (SessionContext::new_with_config(config), None)
        }
        Some(url) => {
            let (ctx, scratch) = cluster_context(url, &b.dir).await?;
            (ctx, Some(scratch))
        }
    };
    if nodes > 0 {
        ctx.register_parquet(
            "bench_node_files",
            b.dir.to_string_lossy().as_ref(),
            ParquetReadOptions::default(),
        )
        .await?;
    } else {
        ctx.register_batch("bench_node_files", RecordBatch::new_empty(nodes_schema()))?;
    }
    let columns: Vec<String> = nodes_schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|c| {
            let key = NAME_KEY_COLUMNS.contains(&c.as_str())
                || IDENTITY_KEY_COLUMNS.contains(&c.as_str());
            !(b.computed_keys && key)
        })
        .collect();
    ctx.sql(&format!(
        "CREATE VIEW bench_nodes AS SELECT {} FROM bench_node_files",
        columns.join(", ")
    ))
    .await?;
    let identity = identity_properties();
    // Peak memory of resolution only: reset the high-water mark first.
    super::reset_peak_rss();
    let started = Instant::now();
    let (clusters, open) =
        resolve_entities(&ctx, "bench_nodes", &mentions, &[], &b.spec, &identity).await?;
    let pairs = clusters.stats.pairs.clone();
    // What a correct adjudicator would add: for each open mention, the
    // option that is really it (if shown), as the LLM would be asked.
    let mut judged = clusters.clone();
    let resolved = clusters.finish();
    let seconds = started.elapsed().as_secs_f64();
    let peak = super::peak_rss();
    for a in &open {
        let right = a
            .options
            .iter()
            .take(b.spec.max_candidates)
            .find(|p| match p.target {
                Target::Node(x) => truth[a.mention] == Truth::Existing(x),
                Target::Mention(j) => truth[j] == truth[a.mention],
            });
        if let Some(p) = right {
            judged.link(a.mention, p);
        }
    }
    if let Some(scratch) = scratch {
        // Best effort: the bench's figures do not depend on it.
        let _ = std::fs::remove_dir_all(scratch);
    }
    let judged = judged.finish();
    let with_llm = score(&judged, &truth, &kinds, &mentions, b.seed);
    let without = score(&resolved, &truth, &kinds, &mentions, b.seed);
    Ok(ResolveReport {
        mentions: b.mentions,
        nodes: b.nodes,
        generate_seconds,
        seconds,
        peak_rss: peak,
        pairs,
        ambiguous: open.len(),
        adjudication_calls: open.len().div_ceil(b.spec.adjudication_batch_size.max(1)),
        node_merges: without.node,
        pair_merges: without.pair,
        wrong_samples: without.wrong_samples,
        by_variant: without.by_variant,
        with_adjudication: (with_llm.precision(), with_llm.recall()),
    })
}

/// A session on the cluster at `url` whose scratch tables are Parquet
/// files in a fresh directory beside `dir` (returned, to be removed).
#[cfg(feature = "cluster")]
async fn cluster_context(
    url: &crate::cluster::ClusterUrl,
    dir: &Path,
) -> Result<(SessionContext, PathBuf), BenchError> {
    let ctx = crate::cluster::connect(url)
        .await
        .map_err(|e| BenchError::Step(e.to_string()))?;
    let scratch = dir.with_file_name(format!(
        "{}-scratch-{}",
        dir.file_name()
            .map_or("bench".into(), |n| n.to_string_lossy()),
        uuid::Uuid::new_v4()
    ));
    std::fs::create_dir_all(&scratch)?;
    let root = url::Url::from_directory_path(&scratch)
        .map_err(|()| BenchError::Step(format!("scratch directory {}", scratch.display())))?;
    let store = crate::objstore::store_for(&root, &BTreeMap::new())
        .map_err(|e| BenchError::Step(e.to_string()))?;
    ctx.state_ref()
        .write()
        .config_mut()
        .set_extension(Arc::new(crate::scratch::ScratchFiles::new(root, store)));
    Ok((ctx, scratch))
}

/// Without the `cluster` feature there is no cluster to resolve on.
#[cfg(not(feature = "cluster"))]
async fn cluster_context(
    _url: &crate::cluster::ClusterUrl,
    _dir: &Path,
) -> Result<(SessionContext, PathBuf), BenchError> {
    Err(BenchError::Step(
        crate::cluster::ClusterError::NotBuilt.to_string(),
    ))
}

/// Merge counts of one outcome against the truth.
struct Score {
    node: (u64, u64, u64),
    pair: (u64, u64, u64),
    wrong_samples: Vec<String>,
    by_variant: BTreeMap<&'static str, (u64, u64)>,
}

impl Score {
    fn precision(&self) -> f64 {
        precision(self.node, self.pair)
    }

    fn recall(&self) -> f64 {
        recall(self.node, self.pair)
    }
}

/// Right merges over merges made, both kinds of (right, made, expected)
/// counts together; 1 when none were made.
fn precision(node: (u64, u64, u64), pair: (u64, u64, u64)) -> f64 {
    let made = node.1 + pair.1;
    if made == 0 {
        return 1.0;
    }
    (node.0 + pair.0) as f64 / made as f64
}

/// Right merges over expected merges; 1 when none were expected.
fn recall(node: (u64, u64, u64), pair: (u64, u64, u64)) -> f64 {
    let should = node.2 + pair.2;
    if should == 0 {
        return 1.0;
    }
    (node.0 + pair.0) as f64 / should as f64
}

fn score(
    resolved: &Resolved,
    truth: &[Truth],
    kinds: &[&'static str],
    mentions: &[MentionKey],
    seed: u64,
) -> Score {
    // Merges to committed nodes.
    let mut node = (0u64, 0u64, 0u64);
    let mut wrong_samples = Vec::new();
    let mut by_variant: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    for (k, t) in truth.iter().enumerate() {
        let got = resolved.committed[resolved.cluster_of[k]];
        if let Truth::Existing(x) = t {
            node.2 += 1;
            let slot = by_variant.entry(kinds[k]).or_insert((0, 0));
            slot.1 += 1;
            if got == Some(*x) {
                node.0 += 1;
                slot.0 += 1;
            }
        }
        if let Some(g) = got {
            node.1 += 1;
            if *t != Truth::Existing(g) && wrong_samples.len() < 5 {
                let is = match t {
                    Truth::Existing(x) => format!("node {x}"),
                    Truth::New(_) => "a new entity".to_string(),
                };
                wrong_samples.push(format!(
                    "{:?} ({is}) → {:?} (node {g})",
                    mentions[k].name,
                    entity(seed, g as u64).name
                ));
            }
        }
    }
    // Mention pairs in one cluster, counted per group (no pair loops).
    let mut by_cluster: HashMap<usize, u64> = HashMap::new();
    let mut by_truth: HashMap<Truth, u64> = HashMap::new();
    let mut by_both: HashMap<(usize, Truth), u64> = HashMap::new();
    for (k, t) in truth.iter().enumerate() {
        let c = resolved.cluster_of[k];
        *by_cluster.entry(c).or_default() += 1;
        *by_truth.entry(*t).or_default() += 1;
        *by_both.entry((c, *t)).or_default() += 1;
    }
    let pair = (
        by_both.values().map(|&n| pairs_of(n)).sum(),
        by_cluster.values().map(|&n| pairs_of(n)).sum(),
        by_truth.values().map(|&n| pairs_of(n)).sum(),
    );
    Score {
        node,
        pair,
        wrong_samples,
        by_variant,
    }
}
