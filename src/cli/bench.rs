//! `graphloom bench …`: measure graphloom's parts and print the figures
//! (builds with the `testkit` feature).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use graphloom::Error;
use graphloom::bench::add::AddBench;
use graphloom::bench::communities::CommunitiesBench;
use graphloom::bench::neighbours::NeighboursBench;
use graphloom::bench::pipeline::RunBench;
use graphloom::bench::resolution::{BenchError, ResolveBench};
use graphloom::bench::sql::SqlBench;
use graphloom::resolve::ResolveSpec;

use super::{Failure, UsageError};

/// The subcommands of `graphloom bench`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Load synthetic node and fact lines with `graphloom add` into a
    /// fresh graph, at the given size and at a tenth of it, and print the
    /// times and their ratio. Build with --release for figures.
    Add(AddArgs),
    /// Time `graphloom sql` against DuckDB (Python's `duckdb` package)
    /// reading the same Parquet files: a label filter, an edge-family join
    /// and a type-family count, whole processes, median of --runs. Builds a
    /// graph with the `bench add` generator unless --graph is given. Build
    /// with --release for figures.
    Sql(SqlArgs),
    /// Run the whole pipeline over a synthetic message archive against the
    /// built-in test server, then replay it into a fresh graph from the
    /// response cache (--replay); print each stage's time, calls and
    /// episodes/s. Build with --release for figures.
    Run(RunArgs),
    /// Drive the LLM client and limiter against the built-in test server
    /// and report achieved requests/min and tokens/min against the limits,
    /// the most in any 60 s window, latency percentiles and client overhead.
    Llm(LlmArgs),
    /// Embedding candidates over synthetic name vectors: nearest committed
    /// nodes (and mentions) by random-hyperplane LSH; print time, peak
    /// memory, proposals and the recall of the true node among them.
    /// Build with --release for figures.
    Neighbours(NeighboursArgs),
    /// Find communities in a synthetic graph of planted groups (N nodes,
    /// 2N facts): time to number nodes and facts, to run hierarchical
    /// Leiden and to commit, peak memory, and with --scale the same at
    /// N/SCALE and the time ratio. Build with --release for figures.
    Communities(CommunitiesArgs),
    /// Resolve synthetic mentions against synthetic committed nodes with
    /// known duplicates; print time, peak memory, candidate counts and the
    /// precision/recall of the merges. Build with --release for figures.
    Resolve(ResolveArgs),
}

impl BenchCommand {
    /// Runs the benchmark and prints its report.
    pub async fn run(self) -> Result<(), Failure> {
        let report = match self {
            BenchCommand::Llm(a) => graphloom::bench::run_llm_bench(a.settings())
                .await
                .map_err(|e| Error::from(graphloom::llm::LlmError::Setup(e.to_string())))?
                .to_string(),
            BenchCommand::Neighbours(a) => {
                let settings = a.settings()?;
                let report = graphloom::bench::neighbours::run_neighbours_bench(settings);
                report.await.map_err(Error::from)?.to_string()
            }
            BenchCommand::Communities(a) => {
                let report = graphloom::bench::communities::run_communities_bench(a.settings());
                report.await.map_err(Error::from)?.to_string()
            }
            BenchCommand::Resolve(a) => {
                let settings = a.settings()?;
                let report = graphloom::bench::resolution::run_resolve_bench(settings);
                report.await.map_err(Error::from)?.to_string()
            }
            BenchCommand::Add(a) => graphloom::bench::add::run_add_bench(a.settings())
                .await
                .map_err(Error::from)?
                .to_string(),
            BenchCommand::Sql(a) => graphloom::bench::sql::run_sql_bench(a.settings()?)
                .await
                .map_err(Error::from)?
                .to_string(),
            BenchCommand::Run(a) => graphloom::bench::pipeline::run_pipeline_bench(a.settings())
                .await
                .map_err(Error::from)?
                .to_string(),
        };
        out!("{report}");
        Ok(())
    }
}

/// The flag of a bench that sets a [`ResolveSpec`] field, by the field's
/// key in the spec (as [`ResolveSpec::problems`] names it).
struct SpecFlag {
    key: &'static str,
    flag: &'static str,
}

/// The first problem of `spec` as a usage error naming the flag that set
/// the field (every other field has its valid default).
fn check_spec(spec: &ResolveSpec, flags: &[SpecFlag]) -> Result<(), UsageError> {
    match spec.problems().into_iter().next() {
        None => Ok(()),
        Some((key, msg)) => {
            let flag = flags
                .iter()
                .find(|f| f.key == key)
                .map_or(&*key, |f| f.flag);
            Err(UsageError(format!("{flag} {msg}")))
        }
    }
}

/// The flags of `graphloom bench add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// Node lines.
    #[arg(long, default_value_t = 100_000)]
    nodes: usize,
    /// Fact lines.
    #[arg(long, default_value_t = 50_000)]
    facts: usize,
    /// Generator seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Working directory (emptied first). Default: under the temp dir.
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl AddArgs {
    fn settings(self) -> AddBench {
        AddBench {
            nodes: self.nodes,
            facts: self.facts,
            seed: self.seed,
            dir: self
                .dir
                .unwrap_or_else(|| std::env::temp_dir().join("graphloom-bench-add")),
        }
    }
}

/// The flags of `graphloom bench sql`.
#[derive(Debug, Args)]
pub struct SqlArgs {
    /// Query this local graph instead of generating one.
    #[arg(long, value_name = "URL")]
    graph: Option<String>,
    /// Node lines of the generated graph.
    #[arg(long, default_value_t = 1_000_000)]
    nodes: usize,
    /// Fact lines of the generated graph.
    #[arg(long, default_value_t = 500_000)]
    facts: usize,
    /// Generator seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Where the generated graph is kept (a graph of the same size
    /// already there is reused). Default: under the temp dir.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Timed runs per query and engine; the median is reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Python interpreter with the duckdb package.
    #[arg(long, default_value = "python3")]
    python: String,
}

impl SqlArgs {
    /// The settings; this binary is the `graphloom` the bench times.
    fn settings(self) -> Result<SqlBench, Error> {
        Ok(SqlBench {
            graph: self.graph,
            nodes: self.nodes,
            facts: self.facts,
            seed: self.seed,
            dir: self
                .dir
                .unwrap_or_else(|| std::env::temp_dir().join("graphloom-bench-sql")),
            runs: self.runs,
            python: self.python,
            graphloom: std::env::current_exe().map_err(BenchError::from)?,
        })
    }
}

/// The flags of `graphloom bench run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Episodes in the archive.
    #[arg(long, default_value_t = 2_000)]
    episodes: usize,
    /// Also run at episodes/SCALE first and print each stage's time ratio.
    #[arg(long, value_name = "SCALE")]
    scale: Option<usize>,
    /// Generator seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// LLM calls in flight (llm.max_concurrency).
    #[arg(long, default_value_t = 16)]
    concurrency: u32,
    /// Working directory (emptied first). Default: under the temp dir.
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl RunArgs {
    fn settings(self) -> RunBench {
        RunBench {
            episodes: self.episodes.max(1),
            scale: self.scale,
            seed: self.seed,
            dir: self
                .dir
                .unwrap_or_else(|| std::env::temp_dir().join("graphloom-bench-run")),
            concurrency: self.concurrency.max(1),
        }
    }
}

/// The flags of `graphloom bench llm`.
#[derive(Debug, Args)]
pub struct LlmArgs {
    /// Calls to make.
    #[arg(long, default_value_t = 400)]
    calls: usize,
    /// Server latency per reply, in milliseconds.
    #[arg(long, default_value_t = 200)]
    latency_ms: u64,
    /// Requests-per-minute limit.
    #[arg(long, default_value_t = 600)]
    rpm: u32,
    /// Tokens-per-minute limit.
    #[arg(long, default_value_t = 200_000)]
    tpm: u32,
    /// Share of requests the server answers 429 (Retry-After: 1), 0..1.
    #[arg(long, default_value_t = 0.0)]
    rate_429: f64,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: u32,
    /// Characters of prompt per call.
    #[arg(long, default_value_t = 3_200)]
    prompt_chars: usize,
    /// max_tokens per call.
    #[arg(long, default_value_t = 400)]
    max_tokens: u32,
    /// Characters of each reply.
    #[arg(long, default_value_t = 1_000)]
    reply_chars: usize,
}

impl LlmArgs {
    fn settings(self) -> graphloom::bench::LlmBench {
        graphloom::bench::LlmBench {
            calls: self.calls,
            latency: Duration::from_millis(self.latency_ms),
            rpm: self.rpm,
            tpm: self.tpm,
            rate_429: self.rate_429.clamp(0.0, 1.0),
            concurrency: self.concurrency.max(1),
            prompt_chars: self.prompt_chars,
            max_tokens: self.max_tokens,
            reply_chars: self.reply_chars,
        }
    }
}

/// The flags of `graphloom bench neighbours`.
#[derive(Debug, Args)]
pub struct NeighboursArgs {
    /// Mentions probing.
    #[arg(long, default_value_t = 100_000)]
    mentions: usize,
    /// Committed nodes with a name vector.
    #[arg(long, default_value_t = 1_000_000)]
    nodes: usize,
    /// Vector dimensions (768 for nomic-embed-text-v1.5).
    #[arg(long, default_value_t = 768)]
    dims: usize,
    /// Cosine of a mention of an existing node to its node's vector.
    #[arg(long, default_value_t = 0.8)]
    similarity: f64,
    /// Share of mentions that are of an existing node, 0..1.
    #[arg(long, default_value_t = 0.5)]
    existing_share: f64,
    /// Generator seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Where the nodes are written as Parquet (reused for the same
    /// seed, size and dimensions). Default: under the temp dir.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// LSH bands (resolve.embedding_bands).
    #[arg(long, default_value_t = ResolveSpec::default().embedding_bands)]
    bands: usize,
    /// Bits per band (resolve.embedding_band_bits); default: chosen from
    /// the nodes per root type.
    #[arg(long)]
    band_bits: Option<usize>,
    /// Largest bucket used (resolve.embedding_max_bucket).
    #[arg(long, default_value_t = ResolveSpec::default().embedding_max_bucket)]
    max_bucket: usize,
    /// Proposal threshold (resolve.embedding_min_similarity).
    #[arg(long, default_value_t = ResolveSpec::default().embedding_min_similarity)]
    min_similarity: f64,
}

/// The spec fields the flags of `bench neighbours` set.
const NEIGHBOURS_FLAGS: &[SpecFlag] = &[
    SpecFlag {
        key: "resolve.embedding_bands",
        flag: "--bands",
    },
    SpecFlag {
        key: "resolve.embedding_band_bits",
        flag: "--band-bits",
    },
    SpecFlag {
        key: "resolve.embedding_max_bucket",
        flag: "--max-bucket",
    },
    SpecFlag {
        key: "resolve.embedding_min_similarity",
        flag: "--min-similarity",
    },
];

impl NeighboursArgs {
    /// The settings; out-of-range flags are usage errors.
    fn settings(self) -> Result<NeighboursBench, UsageError> {
        let spec = ResolveSpec {
            embedding_candidates: true,
            embedding_bands: self.bands,
            embedding_band_bits: self.band_bits,
            embedding_max_bucket: self.max_bucket,
            embedding_min_similarity: self.min_similarity,
            ..Default::default()
        };
        check_spec(&spec, NEIGHBOURS_FLAGS)?;
        if self.dims == 0 || !(0.0..=1.0).contains(&self.similarity) {
            return Err(UsageError(
                "--dims must be positive and --similarity between 0 and 1".into(),
            ));
        }
        let (nodes, dims, seed) = (self.nodes, self.dims, self.seed);
        let dir = self.dir.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("graphloom-bench-neighbours-{nodes}-{dims}-{seed}"))
        });
        Ok(NeighboursBench {
            mentions: self.mentions,
            nodes,
            dims,
            similarity: self.similarity,
            existing_share: self.existing_share.clamp(0.0, 1.0),
            seed,
            dir,
            spec,
        })
    }
}

/// The flags of `graphloom bench communities`.
#[derive(Debug, Args)]
pub struct CommunitiesArgs {
    /// Nodes.
    #[arg(long, default_value_t = 1_000_000)]
    nodes: usize,
    /// Also run at nodes/SCALE first and print the time ratio.
    #[arg(long, value_name = "SCALE")]
    scale: Option<usize>,
    /// Generator and Leiden seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Working directory (emptied first). Default: under the temp dir.
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl CommunitiesArgs {
    fn settings(self) -> CommunitiesBench {
        let (nodes, seed) = (self.nodes, self.seed);
        CommunitiesBench {
            nodes,
            scale: self.scale,
            seed,
            dir: self.dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("graphloom-bench-communities-{nodes}-{seed}"))
            }),
        }
    }
}

/// The flags of `graphloom bench resolve`.
#[derive(Debug, Args)]
pub struct ResolveArgs {
    /// Mentions in the run.
    #[arg(long, default_value_t = 100_000)]
    mentions: usize,
    /// Committed nodes.
    #[arg(long, default_value_t = 100_000)]
    nodes: usize,
    /// Generator seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Where the nodes are written as Parquet (reused across runs with
    /// the same seed and size). Default: a folder under the temp dir.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Share of mentions that are of an existing node, 0..1.
    #[arg(long, default_value_t = 0.5)]
    existing_share: f64,
    /// Share of mentions repeating a new entity of the run, 0..1.
    #[arg(long, default_value_t = 0.2)]
    repeat_share: f64,
    /// Turn fuzzy (MinHash/LSH) candidates off.
    #[arg(long)]
    no_fuzzy: bool,
    /// Turn longer-name proposals off (resolve.longer_names).
    #[arg(long)]
    no_longer_names: bool,
    /// LSH bands (resolve.lsh_bands).
    #[arg(long, default_value_t = ResolveSpec::default().lsh_bands)]
    lsh_bands: usize,
    /// MinHash rows per band (resolve.lsh_rows).
    #[arg(long, default_value_t = ResolveSpec::default().lsh_rows)]
    lsh_rows: usize,
    /// Largest LSH bucket used (resolve.lsh_max_bucket).
    #[arg(long, default_value_t = ResolveSpec::default().lsh_max_bucket)]
    lsh_max_bucket: usize,
    /// Resolve on the Ballista cluster at df://HOST:PORT (a build with
    /// --features testkit,cluster); its executors must reach --dir.
    #[arg(long, value_name = "df://HOST:PORT")]
    cluster: Option<String>,
    /// Ignore the name keys stored with the nodes and compute every
    /// node's folded name and band keys, as for a graph written before
    /// keys were stored.
    #[arg(long)]
    computed_keys: bool,
}

/// The spec fields the flags of `bench resolve` set.
const RESOLVE_FLAGS: &[SpecFlag] = &[
    SpecFlag {
        key: "resolve.fuzzy",
        flag: "--no-fuzzy",
    },
    SpecFlag {
        key: "resolve.longer_names",
        flag: "--no-longer-names",
    },
    SpecFlag {
        key: "resolve.lsh_bands",
        flag: "--lsh-bands",
    },
    SpecFlag {
        key: "resolve.lsh_rows",
        flag: "--lsh-rows",
    },
    SpecFlag {
        key: "resolve.lsh_max_bucket",
        flag: "--lsh-max-bucket",
    },
];

impl ResolveArgs {
    /// The settings; a malformed `--cluster` is the library's error,
    /// out-of-range flags are usage errors.
    fn settings(self) -> Result<ResolveBench, Failure> {
        let cluster = self
            .cluster
            .as_deref()
            .map(graphloom::cluster::ClusterUrl::parse)
            .transpose()
            .map_err(Error::from)?;
        let spec = ResolveSpec {
            fuzzy: !self.no_fuzzy,
            longer_names: !self.no_longer_names,
            lsh_bands: self.lsh_bands,
            lsh_rows: self.lsh_rows,
            lsh_max_bucket: self.lsh_max_bucket,
            ..Default::default()
        };
        check_spec(&spec, RESOLVE_FLAGS)?;
        let (nodes, seed) = (self.nodes, self.seed);
        let existing_share = self.existing_share.clamp(0.0, 1.0);
        Ok(ResolveBench {
            mentions: self.mentions,
            nodes,
            seed,
            dir: self.dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("graphloom-bench-resolve-{nodes}-{seed}"))
            }),
            existing_share,
            repeat_share: self.repeat_share.clamp(0.0, 1.0 - existing_share),
            spec,
            cluster,
            computed_keys: self.computed_keys,
        })
    }
}
