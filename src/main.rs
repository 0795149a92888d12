//! The `graphloom` command line. `main` only maps the outcome of [`run`] to
//! an exit code: 0 ok, 1 runtime error, 2 usage or configuration error.

// The CLI is where output goes to the terminal.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

mod cli;

use clap::{Args, Parser, Subcommand};
use graphloom::ontology::Ontology;
use graphloom::query::{GraphSession, OutputFormat, render};
use graphloom::spec::PipelineSpec;
use graphloom::stage::Stage;
use graphloom::store::{GraphStore, Table};
use graphloom::{Error, add};

/// Writes to stdout; a closed pipe (`graphloom sql ... | head`) ends the
/// process quietly instead of panicking like `println!` would.
fn emit(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

macro_rules! out {
    () => { emit("\n") };
    ($($arg:tt)*) => { emit(&format!("{}\n", format_args!($($arg)*))) };
}

macro_rules! out_raw {
    ($($arg:tt)*) => { emit(&format!($($arg)*)) };
}

/// Turn archives of episodes into a temporal knowledge graph stored as Delta
/// Lake tables, and query it with SQL.
#[derive(Debug, Parser)]
#[command(name = "graphloom", version, about, long_about = None)]
struct Cli {
    /// Log detail on stderr (error, warn, info, debug, trace); RUST_LOG
    /// overrides it.
    #[arg(long, global = true, default_value = "warn", value_name = "LEVEL")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with the ontology of a pipeline spec.
    #[command(subcommand)]
    Ontology(OntologyCommand),
    /// Build the graph from the pipeline's episodes: extract entities and
    /// facts with the LLM, classify them into the type hierarchies and
    /// commit the result as one run.
    Run {
        /// Pipeline spec (TOML).
        pipeline: PathBuf,
        /// Print the planned calls, tokens and cost; call and write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Process at most N new episodes (oldest first).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Neither read nor write the response cache.
        #[arg(long, conflicts_with = "refresh_cache")]
        no_cache: bool,
        /// Ignore cached replies and store fresh ones.
        #[arg(long, conflicts_with = "replay")]
        refresh_cache: bool,
        /// Rebuild from the response cache alone: make no LLM call; a
        /// request the cache has no reply for fails its episode (a
        /// `failures` row, retried by the next run).
        #[arg(long, conflicts_with = "no_cache")]
        replay: bool,
        /// Write to this graph instead of the spec's output.graph.
        #[arg(long, value_name = "URL")]
        graph: Option<String>,
        /// Send the LLM calls through the provider's Batch API (as
        /// llm.mode = "batch"): half the price, answers within 24 hours.
        #[arg(long, conflicts_with_all = ["no_cache", "refresh_cache", "replay"])]
        batch: bool,
        /// Batch mode: submit what the next round needs and exit; a later
        /// run collects the answers and goes on (for schedulers).
        #[arg(long)]
        no_wait: bool,
        /// Read the episodes from this file or directory instead of the
        /// spec's source.url (the format and options stay the spec's), for
        /// a first slice of an archive; a later run over the whole archive
        /// skips what the slice committed.
        #[arg(long, value_name = "URL")]
        source: Option<String>,
        /// Resolve on the Ballista cluster whose scheduler is at
        /// df://HOST:PORT (as resolve.cluster); its executors read and
        /// write the graph's files at the graph's URL.
        #[arg(long, value_name = "df://HOST:PORT", env = "GRAPHLOOM_CLUSTER")]
        cluster: Option<String>,
    },
    /// Score the graph against a gold file: entity precision and recall,
    /// chain accuracy and fact recall over the episodes it has processed.
    Eval {
        #[command(flatten)]
        target: GraphTarget,
        /// Gold file (JSON), e.g. pipelines/gold/procurement.json.
        #[arg(long, value_name = "PATH")]
        gold: PathBuf,
    },
    /// Load known nodes and facts from a JSON Lines file (no LLM).
    Add {
        /// Pipeline spec (TOML) whose ontology and output graph to use.
        pipeline: PathBuf,
        /// JSON Lines file: one {"node": ...} or {"fact": ...} per line; a
        /// local path or an object store URL.
        file: String,
        /// Write to this graph instead of the spec's output.graph.
        #[arg(long, value_name = "URL")]
        graph: Option<String>,
    },
    /// Run SQL against the graph's last completed run (read-only).
    Sql {
        #[command(flatten)]
        target: GraphTarget,
        /// The query; several statements may be separated by `;`.
        #[arg(conflicts_with = "file", required_unless_present = "file")]
        query: Option<String>,
        /// Read the query from a file instead.
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: OutputFormat,
        /// Run the query on the Ballista cluster whose scheduler is at
        /// df://HOST:PORT (`graphloom cluster scheduler`); its executors
        /// read the graph's files from the same URL.
        #[arg(long, value_name = "df://HOST:PORT", env = "GRAPHLOOM_CLUSTER")]
        cluster: Option<String>,
    },
    /// Run a scheduler or an executor of a Ballista cluster that runs
    /// graphloom's queries (build with `--features cluster`).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Show tables, row counts, versions, the writer lock and recent runs.
    Status {
        #[command(flatten)]
        target: GraphTarget,
        /// How many recent runs to list.
        #[arg(long, default_value_t = 10)]
        runs: usize,
    },
    /// Measure graphloom's parts and print the figures (builds with the
    /// `testkit` feature: `cargo build --release --features testkit`).
    #[cfg(feature = "testkit")]
    #[command(subcommand)]
    Bench(BenchCommand),
    /// List or cancel the Batch API batches of a graph (batch mode).
    #[command(subcommand)]
    Batches(BatchesCommand),
    /// Roll back the commits of an interrupted run (every write does this
    /// first; this command does only that).
    Recover {
        #[command(flatten)]
        target: GraphTarget,
    },
    /// Write the graph in another form for readers outside Delta Lake.
    #[command(subcommand)]
    Export(ExportCommand),
    /// Draw the graph (or the nodes a query selects) as one self-contained
    /// HTML page: search, a label filter that matches subtypes, and an
    /// as-of slider over the facts' validity.
    View {
        #[command(flatten)]
        target: GraphTarget,
        /// SQL returning a `node_id` column: the nodes to draw (and the
        /// edges among them). Default: every node.
        #[arg(long, value_name = "SQL")]
        query: Option<String>,
        /// Start the as-of slider at this time (RFC 3339, a date or a
        /// year); default: all times, ended facts dashed.
        #[arg(long, value_name = "TIME")]
        as_of: Option<String>,
        /// Draw at most N nodes (the highest-ranked of the selection); the
        /// page says when it shows fewer than matched.
        #[arg(long, value_name = "N", default_value_t = graphloom::pages::view::DEFAULT_MAX_NODES)]
        max_nodes: usize,
        /// The HTML file to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Find communities (groups of closely connected nodes) by hierarchical
    /// Leiden over the facts that hold now, and commit them as the
    /// `communities` and `community_members` tables (replacing the last
    /// ones); `export graphrag` then writes GraphRAG's community tables.
    Communities {
        #[command(flatten)]
        target: GraphTarget,
        /// Seed of Leiden's random choices: the same graph and seed give
        /// the same communities.
        #[arg(long, default_value_t = graphloom::communities::CommunityOptions::default().seed)]
        seed: u64,
        /// Split communities larger than this at the next level.
        #[arg(long, value_name = "N", default_value_t = graphloom::communities::CommunityOptions::default().max_cluster_size)]
        max_cluster_size: usize,
        /// Most levels of the hierarchy.
        #[arg(long, value_name = "N", default_value_t = graphloom::communities::CommunityOptions::default().max_levels)]
        max_levels: usize,
        /// Modularity resolution: higher gives smaller communities.
        #[arg(long, default_value_t = graphloom::communities::CommunityOptions::default().resolution)]
        resolution: f64,
    },
    /// Write a run report as one HTML page: per run and stage the LLM calls,
    /// tokens, cost, cache hits, time waiting vs in HTTP and latencies,
    /// failures by stage and reason with examples, and with --gold the
    /// eval scores.
    Report {
        #[command(flatten)]
        target: GraphTarget,
        /// Also score the graph against this gold file (as `graphloom eval`).
        #[arg(long, value_name = "PATH")]
        gold: Option<PathBuf>,
        /// The HTML file to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum ExportCommand {
    /// Write the last completed run's snapshot of every table as plain
    /// Parquet (`<DIR>/<table>.parquet`, plus `_graphloom_export.json`),
    /// for readers without Delta support.
    Parquet {
        #[command(flatten)]
        target: GraphTarget,
        /// Destination directory: a path or an object store URL. With
        /// --pipeline, the spec's output.storage_options apply to it too.
        #[arg(long, value_name = "DIR")]
        to: String,
    },
    /// Write the graph as GraphRAG's output tables (`entities`,
    /// `relationships`, `text_units`, `documents` and, when the graph has
    /// communities, `communities` and `community_reports`) for GraphRAG's
    /// query side and tools that read its index.
    Graphrag {
        #[command(flatten)]
        target: GraphTarget,
        /// Destination directory: a path or an object store URL. With
        /// --pipeline, the spec's output.storage_options apply to it too.
        #[arg(long, value_name = "DIR")]
        to: String,
        /// Leave out relationships that no longer hold (ended or
        /// superseded); by default they are exported with `current =
        /// false` and the end date in their description.
        #[arg(long)]
        current_only: bool,
    },
}

#[derive(Debug, Subcommand)]
enum BatchesCommand {
    /// List every batch the graph's runs submitted, with stage, requests,
    /// status and age.
    List {
        #[command(flatten)]
        target: GraphTarget,
    },
    /// Ask the provider to cancel every batch still running; the next run
    /// collects their partial output and submits the rest again.
    Cancel {
        /// Pipeline spec (TOML): its [llm] names the provider.
        pipeline: PathBuf,
        /// The graph instead of the spec's output.graph.
        #[arg(long, value_name = "URL")]
        graph: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
enum ClusterCommand {
    /// Start a scheduler: it plans each query and hands its tasks to the
    /// executors. Stops on Ctrl-C or SIGTERM.
    Scheduler {
        /// Address to listen on; executors are told to call it back, so
        /// give one they reach.
        #[arg(long, default_value = "127.0.0.1:50050", value_name = "HOST:PORT")]
        bind: std::net::SocketAddr,
        /// Seconds without word from an executor after which it counts as
        /// lost and its tasks run elsewhere (at least 10: a busy executor
        /// reports every 5 s).
        #[arg(long, default_value_t = 180, value_name = "SECS")]
        executor_timeout_secs: u64,
        /// Attempts of one task before its query fails.
        #[arg(long, default_value_t = 4, value_name = "N")]
        task_max_failures: usize,
    },
    /// Start an executor that registers with a scheduler and runs its
    /// tasks. Stops on Ctrl-C or SIGTERM after draining its tasks.
    Executor {
        /// The scheduler's address.
        #[arg(long, default_value = "127.0.0.1:50050", value_name = "HOST:PORT")]
        scheduler: String,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1", value_name = "HOST")]
        bind_host: String,
        /// Host the scheduler and other executors reach this one at
        /// (default: --bind-host).
        #[arg(long, value_name = "HOST")]
        external_host: Option<String>,
        /// Arrow Flight port (shuffle data and results).
        #[arg(long, default_value_t = 50051, value_name = "PORT")]
        flight_port: u16,
        /// gRPC port, registered with the scheduler (tasks are fetched
        /// from the scheduler, not sent here).
        #[arg(long, default_value_t = 50052, value_name = "PORT")]
        grpc_port: u16,
        /// Directory for shuffle files. Default: graphloom-executor-PORT
        /// under the temp dir.
        #[arg(long, value_name = "DIR")]
        work_dir: Option<PathBuf>,
        /// Tasks to run at once (0: one per core).
        #[arg(long, default_value_t = 0, value_name = "N")]
        concurrent_tasks: usize,
    },
}

#[derive(Debug, Subcommand)]
enum OntologyCommand {
    /// Validate the ontology and print its type trees; exits 2 on errors.
    Check {
        /// Pipeline spec (TOML).
        pipeline: PathBuf,
    },
}

#[cfg(feature = "testkit")]
#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Load synthetic node and fact lines with `graphloom add` into a
    /// fresh graph, at the given size and at a tenth of it, and print the
    /// times and their ratio. Build with --release for figures.
    Add {
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
    },
    /// Time `graphloom sql` against DuckDB (Python's `duckdb` package)
    /// reading the same Parquet files: a label filter, an edge-family join
    /// and a type-family count, whole processes, median of --runs. Builds a
    /// graph with the `bench add` generator unless --graph is given. Build
    /// with --release for figures.
    Sql {
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
    },
    /// Run the whole pipeline over a synthetic message archive against the
    /// built-in test server, then replay it into a fresh graph from the
    /// response cache (--replay); print each stage's time, calls and
    /// episodes/s. Build with --release for figures.
    Run {
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
    },
    /// Drive the LLM client and limiter against the built-in test server
    /// and report achieved requests/min and tokens/min against the limits,
    /// the most in any 60 s window, latency percentiles and client overhead.
    Llm {
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
    },
    /// Embedding candidates over synthetic name vectors: nearest committed
    /// nodes (and mentions) by random-hyperplane LSH; print time, peak
    /// memory, proposals and the recall of the true node among them.
    /// Build with --release for figures.
    Neighbours {
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
        #[arg(long, default_value_t = graphloom::resolve::ResolveSpec::default().embedding_bands)]
        bands: usize,
        /// Bits per band (resolve.embedding_band_bits); default: chosen from
        /// the nodes per root type.
        #[arg(long)]
        band_bits: Option<usize>,
        /// Largest bucket used (resolve.embedding_max_bucket).
        #[arg(long, default_value_t = graphloom::resolve::ResolveSpec::default().embedding_max_bucket)]
        max_bucket: usize,
        /// Proposal threshold (resolve.embedding_min_similarity).
        #[arg(long, default_value_t = graphloom::resolve::ResolveSpec::default().embedding_min_similarity)]
        min_similarity: f64,
    },
    /// Find communities in a synthetic graph of planted groups (N nodes,
    /// 2N facts): time to number nodes and facts, to run hierarchical
    /// Leiden and to commit, peak memory, and with --scale the same at
    /// N/SCALE and the time ratio. Build with --release for figures.
    Communities {
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
    },
    /// Resolve synthetic mentions against synthetic committed nodes with
    /// known duplicates; print time, peak memory, candidate counts and the
    /// precision/recall of the merges. Build with --release for figures.
    Resolve {
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
        #[arg(long, default_value_t = graphloom::resolve::ResolveSpec::default().lsh_bands)]
        lsh_bands: usize,
        /// MinHash rows per band (resolve.lsh_rows).
        #[arg(long, default_value_t = graphloom::resolve::ResolveSpec::default().lsh_rows)]
        lsh_rows: usize,
        /// Largest LSH bucket used (resolve.lsh_max_bucket).
        #[arg(long, default_value_t = graphloom::resolve::ResolveSpec::default().lsh_max_bucket)]
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
    },
}

/// Which graph a read command opens.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct GraphTarget {
    /// Root URL of the graph (file://, memory://, s3://, gs://, az:// or a path).
    #[arg(long, value_name = "URL")]
    graph: Option<String>,
    /// Take the graph (and its storage options) from a pipeline spec.
    #[arg(long, value_name = "PATH")]
    pipeline: Option<PathBuf>,
}

impl TryFrom<&GraphTarget> for GraphStore {
    type Error = Error;

    fn try_from(target: &GraphTarget) -> Result<Self, Error> {
        match (&target.graph, &target.pipeline) {
            (Some(url), _) => Ok(GraphStore::open(url, &Default::default())?),
            (None, Some(path)) => {
                let spec = PipelineSpec::from_path(path)?;
                open_output(&spec, None)
            }
            (None, None) => unreachable!("clap requires --graph or --pipeline"),
        }
    }
}

fn open_output(spec: &PipelineSpec, graph: Option<&str>) -> Result<GraphStore, Error> {
    let url = graph.unwrap_or(&spec.output.graph);
    Ok(GraphStore::open(url, &spec.output.storage_options)?
        .with_lock_stale_after(Duration::from_secs(spec.output.lock_stale_after_secs)))
}

fn load_spec(path: &Path) -> Result<(PipelineSpec, Ontology), Error> {
    let spec = PipelineSpec::from_path(path)?;
    let ontology = Ontology::try_from(&spec.ontology)?;
    Ok((spec, ontology))
}

// The engine allocates many small strings and JSON values per LLM call
// (prompts, cache entries, parsed replies); glibc's allocator spent about a
// third of a cached replay's CPU time in malloc and free.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Opts the process out of transparent huge pages. mimalloc asks for them
/// on its arenas; the joins then fault in whole 2 MiB pages, each zeroed by
/// the kernel, as hash tables and batches come and go. At 1M mentions × 10M
/// nodes that zeroing was a third of the CPU time (`bench resolve` 40.5 s
/// with them, 27.7 s without, on a 2-core Linux host). Best effort: a
/// kernel that refuses keeps its default.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::debug!("transparent huge pages stay as the kernel sets them: {e}");
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log_level);
    disable_transparent_huge_pages();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if matches!(cli.command, Command::Cluster(_)) {
        // Ballista's scheduler plans deep plans recursively.
        runtime.thread_stack_size(32 * 1024 * 1024);
    }
    let runtime = match runtime.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // Only graphloom's own messages by default: the libraries below log
        // the same failures that graphloom reports with more context.
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(format!("graphloom={level}")))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

async fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Ontology(OntologyCommand::Check { pipeline }) => ontology_check(&pipeline),
        Command::Run {
            pipeline,
            dry_run,
            limit,
            no_cache,
            refresh_cache,
            replay,
            graph,
            batch,
            no_wait,
            source,
            cluster,
        } => {
            let cluster = cluster
                .as_deref()
                .map(graphloom::cluster::ClusterUrl::parse)
                .transpose()?;
            let cache = if no_cache {
                graphloom::llm::CacheMode::Off
            } else if replay {
                graphloom::llm::CacheMode::Replay
            } else if refresh_cache {
                graphloom::llm::CacheMode::Refresh
            } else {
                graphloom::llm::CacheMode::ReadWrite
            };
            let options = graphloom::run::RunOptions {
                dry_run,
                limit,
                cache,
                progress: cli::progress::on_stderr(std::io::IsTerminal::is_terminal(
                    &std::io::stderr(),
                )),
                batch,
                no_wait,
                cluster,
            };
            run_pipeline(&pipeline, graph.as_deref(), source, &options).await
        }
        Command::Add {
            pipeline,
            file,
            graph,
        } => add_lines(&pipeline, &file, graph.as_deref()).await,
        Command::Sql {
            target,
            query,
            file,
            format,
            cluster,
        } => sql(&target, query, file, format, cluster.as_deref()).await,
        Command::Cluster(command) => cluster(command).await,
        Command::Eval { target, gold } => {
            let store = GraphStore::try_from(&target)?;
            let gold = graphloom::eval::Gold::from_path(&gold)?;
            let quality = graphloom::eval::evaluate(&store, &gold).await?;
            out!("{quality}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { target, runs } => {
            let store = GraphStore::try_from(&target)?;
            status(&store, runs).await?;
            let ledger = ledger_of(&store);
            let pending: Vec<_> = ledger
                .list()
                .await?
                .into_iter()
                .filter(|r| r.ended_at.is_none())
                .collect();
            if !pending.is_empty() {
                out!("\npending batches (run again to collect them):");
                print_batches(&pending);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Batches(BatchesCommand::List { target }) => {
            let records = ledger_of(&GraphStore::try_from(&target)?).list().await?;
            if records.is_empty() {
                out!("no batches: no run of this graph used batch mode");
            }
            print_batches(&records);
            Ok(ExitCode::SUCCESS)
        }
        Command::Batches(BatchesCommand::Cancel { pipeline, graph }) => {
            let (spec, _) = load_spec(&pipeline)?;
            let store = open_output(&spec, graph.as_deref())?;
            let ledger = ledger_of(&store);
            let api = graphloom::llm::batch::BatchApi::new(&spec.llm)?;
            let cancelled = graphloom::llm::batch::cancel_all(&api, &ledger).await?;
            if cancelled.is_empty() {
                out!("no batch is running");
            }
            for id in cancelled {
                out!("asked to cancel {id}");
            }
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(feature = "testkit")]
        Command::Bench(command) => bench(command).await,
        Command::Export(ExportCommand::Parquet { target, to }) => export(&target, &to, None).await,
        Command::Export(ExportCommand::Graphrag {
            target,
            to,
            current_only,
        }) => {
            let options = graphloom::export::GraphragOptions { current_only };
            export(&target, &to, Some(options)).await
        }
        Command::View {
            target,
            query,
            as_of,
            max_nodes,
            out,
        } => {
            let store = GraphStore::try_from(&target)?;
            let options = graphloom::pages::view::ViewOptions {
                query,
                as_of,
                max_nodes: max_nodes.max(1),
            };
            let v = graphloom::pages::view::write_view(&store, &options, &out).await?;
            let capped = if (v.nodes as u64) < v.matched_nodes {
                format!(
                    " (capped: {} matched, --max-nodes {})",
                    v.matched_nodes, options.max_nodes
                )
            } else {
                String::new()
            };
            out!(
                "wrote {}: {} nodes, {} edges of {}{capped}",
                out.display(),
                v.nodes,
                v.edges,
                store.display_url()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Communities {
            target,
            seed,
            max_cluster_size,
            max_levels,
            resolution,
        } => {
            let store = GraphStore::try_from(&target)?;
            let group_id = match &target.pipeline {
                Some(path) if target.graph.is_none() => {
                    PipelineSpec::from_path(path)?.output.group_id
                }
                _ => graphloom::communities::CommunityOptions::default().group_id,
            };
            let options = graphloom::communities::CommunityOptions {
                seed,
                max_cluster_size,
                max_levels,
                resolution,
                group_id,
            };
            let r = graphloom::communities::detect_communities(&store, &options).await?;
            let levels: Vec<String> = r
                .per_level
                .iter()
                .enumerate()
                .map(|(l, n)| format!("level {l}: {n}"))
                .collect();
            out!(
                "committed communities of {} (run {}): {} of {} nodes in communities over {} current facts; {}; modularity {:.3}; read {} ms, detect {} ms, write {} ms",
                store.display_url(),
                r.run_id,
                r.members,
                r.nodes,
                r.edges,
                if levels.is_empty() {
                    "no communities".to_string()
                } else {
                    levels.join(", ")
                },
                r.modularity,
                r.read_ms,
                r.detect_ms,
                r.write_ms
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Report { target, gold, out } => {
            let store = GraphStore::try_from(&target)?;
            // With --pipeline the spec's prices split each run's cost over
            // its stages.
            let prices = match &target.pipeline {
                Some(path) => {
                    let llm = PipelineSpec::from_path(path)?.llm;
                    llm.price_per_1m_prompt_tokens
                        .zip(llm.price_per_1m_completion_tokens)
                }
                None => None,
            };
            let options = graphloom::pages::report::ReportOptions { gold, prices };
            let r = graphloom::pages::report::write_report(&store, &options, &out).await?;
            out!(
                "wrote {}: {} runs, {} run stages, {} LLM calls, {} failures{} of {}",
                out.display(),
                r.runs,
                r.stages,
                r.calls,
                r.failures,
                if r.eval { ", eval scores" } else { "" },
                store.display_url()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Recover { target } => {
            let store = GraphStore::try_from(&target)?;
            // Recovery writes (it takes the lock and may create tables), so
            // a mistyped URL must not turn into a new empty graph.
            store.require_graph().await?;
            let rollbacks = store.recover().await?;
            if rollbacks.is_empty() {
                out!("nothing to recover: every table is at the last completed run");
            }
            for r in rollbacks {
                out!(
                    "rolled back `{}` from version {} to {}",
                    r.table,
                    r.from,
                    r.to
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `graphloom run`.
async fn run_pipeline(
    pipeline: &Path,
    graph: Option<&str>,
    source: Option<String>,
    options: &graphloom::run::RunOptions,
) -> Result<ExitCode, Error> {
    let (mut spec, ontology) = load_spec(pipeline)?;
    if let (Some(url), Some(s)) = (source, spec.source.as_mut()) {
        // Without a [source] table the run refuses with its own error.
        s.url = url;
    }
    let store = open_output(&spec, graph)?;
    let report = graphloom::run::run(&spec, &ontology, &store, options).await?;
    print_run(&spec, &store, &report);
    Ok(ExitCode::SUCCESS)
}

/// `graphloom add`.
async fn add_lines(pipeline: &Path, file: &str, graph: Option<&str>) -> Result<ExitCode, Error> {
    let (spec, ontology) = load_spec(pipeline)?;
    let store = open_output(&spec, graph)?;
    let report = add::add_file(
        &store,
        &ontology,
        &spec.resolve.name_keys(),
        &spec.output.group_id,
        file,
        &spec.output.storage_options,
    )
    .await?;
    out!(
        "added {} nodes ({} created for fact endpoints) and {} facts to {} (run {}, {} ms)",
        report.run.nodes_added,
        report.implicit_nodes,
        report.run.edges_added,
        store.display_url(),
        report.run.run_id,
        report.run.duration_ms,
    );
    if !report.failures.is_empty() {
        out!(
            "{} line(s) failed and were recorded in `failures`:",
            report.failures.len()
        );
        for f in &report.failures {
            out!("  {}: {}", f.item, f.reason);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `graphloom sql`.
async fn sql(
    target: &GraphTarget,
    query: Option<String>,
    file: Option<PathBuf>,
    format: OutputFormat,
    cluster: Option<&str>,
) -> Result<ExitCode, Error> {
    let sql = match (query, file) {
        (Some(q), _) => q,
        (None, Some(path)) => {
            std::fs::read_to_string(&path).map_err(|source| graphloom::query::QueryError::File {
                path: path.display().to_string(),
                source,
            })?
        }
        (None, None) => unreachable!("clap requires a query or --file"),
    };
    let cluster = cluster
        .map(graphloom::cluster::ClusterUrl::parse)
        .transpose()?;
    let store = GraphStore::try_from(target)?;
    let session = match &cluster {
        None => GraphSession::open(&store).await?,
        Some(url) => graphloom::cluster::open_graph(&store, url).await?,
    };
    let results = session.run(&sql).await?;
    for result in &results {
        out_raw!("{}", render(result, format)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// `graphloom cluster scheduler|executor`.
#[cfg(feature = "cluster")]
async fn cluster(command: ClusterCommand) -> Result<ExitCode, Error> {
    use graphloom::cluster::{ClusterError, ExecutorOptions, SchedulerOptions};
    match command {
        ClusterCommand::Scheduler {
            bind,
            executor_timeout_secs,
            task_max_failures,
        } => {
            eprintln!("graphloom cluster scheduler listening on df://{bind}");
            graphloom::cluster::run_scheduler(SchedulerOptions {
                bind,
                executor_timeout: Duration::from_secs(executor_timeout_secs),
                // Look for lost executors a few times per timeout.
                expire_interval: Duration::from_secs((executor_timeout_secs / 4).clamp(1, 15)),
                task_max_failures,
            })
            .await?;
        }
        ClusterCommand::Executor {
            scheduler,
            bind_host,
            external_host,
            flight_port,
            grpc_port,
            work_dir,
            concurrent_tasks,
        } => {
            let scheduler =
                graphloom::cluster::ClusterUrl::from_address(&scheduler).map_err(|_| {
                    ClusterError::Config(format!("--scheduler `{scheduler}` is not HOST:PORT"))
                })?;
            let work_dir = work_dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("graphloom-executor-{flight_port}"))
            });
            eprintln!(
                "graphloom cluster executor on {bind_host}:{flight_port} (tasks on :{grpc_port}), scheduler {}:{}, shuffle files in {}",
                scheduler.host,
                scheduler.port,
                work_dir.display()
            );
            graphloom::cluster::run_executor(ExecutorOptions {
                scheduler,
                bind_host,
                external_host,
                flight_port,
                grpc_port,
                work_dir,
                concurrent_tasks,
            })
            .await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Without the `cluster` feature the commands only say how to build it.
#[cfg(not(feature = "cluster"))]
async fn cluster(_command: ClusterCommand) -> Result<ExitCode, Error> {
    Err(graphloom::cluster::ClusterError::NotBuilt.into())
}

/// `graphloom export parquet` and, with GraphRAG options, `graphloom
/// export graphrag`.
async fn export(
    target: &GraphTarget,
    to: &str,
    graphrag: Option<graphloom::export::GraphragOptions>,
) -> Result<ExitCode, Error> {
    let store = GraphStore::try_from(target)?;
    let options = match &target.pipeline {
        Some(path) if target.graph.is_none() => {
            PipelineSpec::from_path(path)?.output.storage_options
        }
        _ => Default::default(),
    };
    let report = match graphrag {
        None => graphloom::export::export_parquet(&store, to, &options).await?,
        Some(g) => graphloom::export::export_graphrag(&store, to, &options, &g).await?,
    };
    out!(
        "exported {} {}tables of {} (run {}) to {}",
        report.tables.len(),
        if report.format == "graphrag" {
            "GraphRAG "
        } else {
            ""
        },
        report.graph,
        report.run_id.as_deref().unwrap_or("none"),
        report.to
    );
    for (name, t) in &report.tables {
        out!(
            "  {:<22} {:>10} rows  (version {})",
            name,
            t.rows,
            t.version.map_or("-".to_string(), |v| v.to_string())
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// " (N of them records mapped without an LLM)" when a mapping applied.
fn mapped_note(mapped: usize) -> String {
    if mapped == 0 {
        String::new()
    } else {
        format!(" ({mapped} of them records mapped without an LLM)")
    }
}

fn print_run(spec: &PipelineSpec, store: &GraphStore, r: &graphloom::run::RunReport) {
    if let Some(b) = r.batch.as_ref().filter(|b| b.waiting_on.is_some()) {
        let requests: usize = b.submitted.iter().flat_map(|(_, s)| s.values()).sum();
        out!(
            "batch mode on {}: round {} stopped at {}; submitted {} batch(es) with {} requests, {} batch(es) running",
            store.display_url(),
            b.rounds,
            b.waiting_on.map(|s| s.to_string()).unwrap_or_default(),
            b.submitted.len(),
            requests,
            b.running
        );
        for (id, stages) in &b.submitted {
            out!("  {id}: {}", graphloom::llm::batch::stages_text(stages));
        }
        out!(
            "nothing committed yet: run the same command again to collect the answers and go on (`graphloom status` lists the batches)"
        );
        return;
    }
    if r.run.is_none() {
        out!(
            "dry run for {}: {} episodes in the source, {} already in the graph, {} to process{}",
            store.display_url(),
            r.episodes_seen,
            r.episodes_skipped,
            r.episodes_planned,
            mapped_note(r.episodes_mapped)
        );
        if let Some(n) = r
            .failures_by_stage
            .get(Stage::Source.as_str())
            .filter(|n| **n > 0)
        {
            out!("{n} source item(s) could not be read and would be recorded in `failures`");
        }
        out!();
        out_raw!("{}", graphloom::llm::plan::render(&r.plan, &spec.llm));
        out_raw!(
            "{}",
            graphloom::llm::plan::render_batch(&r.plan, &spec.llm, r.batch_rounds)
        );
        return;
    }
    let calls: usize = r.calls_by_stage.values().sum();
    if let Some(b) = &r.batch {
        out!(
            "batch mode: {} round(s), {} batch(es) submitted by this run",
            b.rounds,
            b.submitted.len()
        );
    }
    out!(
        "run {} on {}: {} episodes in the source, {} already in the graph, {} processed{}, {} added",
        r.run.as_ref().map_or("", |x| x.run_id.as_str()),
        store.display_url(),
        r.episodes_seen,
        r.episodes_skipped,
        r.episodes_planned,
        mapped_note(r.episodes_mapped),
        r.episodes_added
    );
    out!(
        "graph: +{} nodes, {} existing nodes updated, +{} edges ({} duplicate facts merged, {} facts invalidated)",
        r.nodes_added,
        r.nodes_updated,
        r.edges_added,
        r.duplicate_facts,
        r.invalidated_facts
    );
    if r.retyped_mentions > 0 {
        out!(
            "records named the type of {} text mentions (resolve.record_types_win)",
            r.retyped_mentions
        );
    }
    if r.majority_retyped > 0 {
        out!(
            "other episodes named the type of {} text mentions (resolve.majority_types)",
            r.majority_retyped
        );
    }
    if r.ambiguous_entities > 0 {
        out!(
            "resolution: {} ambiguous mentions, {} merged on adjudication, the rest kept separate",
            r.ambiguous_entities,
            r.adjudicated_merges
        );
    }
    let stages: Vec<String> = r
        .calls_by_stage
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect();
    out!(
        "llm: {} calls ({} from cache; {}), {:.2} calls per episode, {} prompt + {} completion tokens{}",
        calls,
        r.cache_hits,
        if stages.is_empty() {
            "none".to_string()
        } else {
            stages.join(", ")
        },
        r.calls_per_episode(),
        r.prompt_tokens,
        r.completion_tokens,
        r.cost_usd.map(|c| format!(", ${c:.4}")).unwrap_or_default()
    );
    if !r.endpoints.is_empty() {
        out!("llm endpoints:");
        for e in &r.endpoints {
            out!(
                "  {}: {} calls ({} failed), {} prompt + {} completion tokens; {} attempts ({} failed), rested {} times",
                e.endpoint,
                e.calls,
                e.failed_calls,
                e.prompt_tokens,
                e.completion_tokens,
                e.attempts,
                e.failed_attempts,
                e.rests
            );
        }
    }
    let failures: usize = r.failures_by_stage.values().sum();
    if failures > 0 {
        let by: Vec<String> = r
            .failures_by_stage
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        out!(
            "failures: {failures} ({}), recorded in `failures`; for example:",
            by.join(", ")
        );
        for f in r.failure_samples.iter().take(5) {
            out!("  [{}] {}: {}", f.stage, f.item, f.reason);
        }
    }
    let stages: Vec<String> = r
        .timings
        .iter()
        .fold(Vec::<(Stage, f64)>::new(), |mut acc, (s, t)| {
            match acc.iter_mut().find(|(a, _)| *a == s) {
                Some((_, sum)) => *sum += t,
                None => acc.push((s, t)),
            }
            acc
        })
        .into_iter()
        .map(|(s, t)| format!("{s} {t:.1}"))
        .collect();
    out!("took {:.1} s ({})", r.seconds, stages.join(", "));
}

fn ontology_check(pipeline: &Path) -> Result<ExitCode, Error> {
    let spec = PipelineSpec::from_path(pipeline)?;
    let ontology = Ontology::try_from(&spec.ontology)?;
    let mappings = graphloom::mapping::Mappings::compile(&spec.mapping, &ontology)?;
    check_storage_options(&spec)?;
    out!(
        "ontology of {} is valid: {} entity types, {} edge types{}{}",
        pipeline.display(),
        ontology.entity_types.len(),
        ontology.edge_types.len(),
        if ontology.strict { " (strict)" } else { "" },
        match mappings.len() {
            0 => String::new(),
            n => format!("; {n} record mapping(s) valid"),
        }
    );
    out!("\nentity types:");
    out_raw!("{}", indent(&ontology.entity_tree.render()));
    out!("\nedge types:");
    out_raw!("{}", indent(&ontology.edge_tree.render()));
    Ok(ExitCode::SUCCESS)
}

/// Rejects storage option names the store of each location does not know
/// (the graph, the source and the response cache), as opening them would.
fn check_storage_options(spec: &PipelineSpec) -> Result<(), Error> {
    use graphloom::objstore::{check_options, parse_dir_url};
    let output = &spec.output.storage_options;
    check_options(&parse_dir_url(&spec.output.graph)?, output)?;
    if let Some(source) = &spec.source {
        let mut options = output.clone();
        options.extend(source.storage_options.clone());
        check_options(&parse_dir_url(&source.url)?, &options)?;
    }
    if let Some(cache) = &spec.llm.cache_url {
        check_options(&parse_dir_url(cache)?, output)?;
    }
    Ok(())
}

/// The batch ledger kept under a graph, in the graph's object store.
fn ledger_of(store: &GraphStore) -> graphloom::llm::batch::Ledger {
    graphloom::llm::batch::Ledger::in_graph(store.object_store(), store.url())
}

/// One line per batch: id, status, requests per stage, age.
fn print_batches(records: &[graphloom::llm::batch::BatchRecord]) {
    let now = chrono::Utc::now();
    for r in records {
        let age = (r.ended_at.unwrap_or(now) - r.submitted_at).num_seconds();
        let outcome = match r.ended_at {
            Some(_) => format!(
                ", {} answered, {} failed{}",
                r.answered.len(),
                r.failed.len(),
                r.accounted_by
                    .as_deref()
                    .map(|run| format!(", accounted by run {run}"))
                    .unwrap_or_default()
            ),
            None => String::new(),
        };
        out!(
            "  {:<28} {:<11} {} requests ({}), {} {}{}",
            r.batch_id.as_deref().unwrap_or(&r.name),
            r.status,
            r.requests.len(),
            graphloom::llm::batch::stages_text(&r.stages()),
            if r.ended_at.is_some() { "took" } else { "age" },
            human_seconds(age),
            outcome
        );
    }
}

/// `42 s`, `7 min`, `3.5 h`.
fn human_seconds(s: i64) -> String {
    match s {
        ..120 => format!("{s} s"),
        120..7200 => format!("{} min", s / 60),
        _ => format!("{:.1} h", s as f64 / 3600.0),
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

async fn status(store: &GraphStore, max_runs: usize) -> Result<(), Error> {
    let snapshot = store.existing_snapshot().await?;
    out!("graph: {}", store.display_url());
    match &snapshot.head.last_completed {
        Some(run) => out!(
            "last completed run: {} (#{}, `{}`, finished {})",
            run.run_id,
            run.run_seq,
            run.command,
            run.finished_at.format("%Y-%m-%dT%H:%M:%SZ")
        ),
        None => out!("last completed run: none (the graph is empty)"),
    }
    if let Some(holder) = store.lock_holder().await? {
        out!("writer lock: held by {holder}");
    }
    out!(
        "\n{:<22} {:>10} {:>9} {:>9}",
        "table",
        "rows",
        "version",
        "latest"
    );
    for table in Table::ALL {
        let rows: usize = snapshot
            .read(table)
            .await?
            .iter()
            .map(|b| b.num_rows())
            .sum();
        let pinned = snapshot
            .table(table)
            .and_then(|t| t.version())
            .map_or("-".to_string(), |v| v.to_string());
        let latest = store
            .load_latest(table)
            .await?
            .and_then(|t| t.version())
            .map_or("-".to_string(), |v| v.to_string());
        out!(
            "{:<22} {:>10} {:>9} {:>9}",
            table.name(),
            rows,
            pinned,
            latest
        );
    }
    let runs = &snapshot.head.runs;
    if !runs.is_empty() {
        out!("\nrecent runs:");
        for run in runs.iter().rev().take(max_runs) {
            out!(
                "  #{:<4} {} {:<9} {:<8} {} nodes +{} edges +{} failures {} {}",
                run.run_seq,
                run.started_at.format("%Y-%m-%dT%H:%M:%SZ"),
                run.status,
                run.command,
                run.nodes_added,
                run.edges_added,
                run.failures,
                run.run_id,
                run.error.as_deref().unwrap_or(""),
            );
        }
    }
    Ok(())
}

/// `graphloom bench …` (builds with the `testkit` feature).
#[cfg(feature = "testkit")]
async fn bench(command: BenchCommand) -> Result<ExitCode, Error> {
    match command {
        BenchCommand::Llm {
            calls,
            latency_ms,
            rpm,
            tpm,
            rate_429,
            concurrency,
            prompt_chars,
            max_tokens,
            reply_chars,
        } => {
            let settings = graphloom::bench::LlmBench {
                calls,
                latency: Duration::from_millis(latency_ms),
                rpm,
                tpm,
                rate_429: rate_429.clamp(0.0, 1.0),
                concurrency: concurrency.max(1),
                prompt_chars,
                max_tokens,
                reply_chars,
            };
            let report = graphloom::bench::run_llm_bench(settings)
                .await
                .map_err(|e| graphloom::llm::LlmError::Setup(e.to_string()))?;
            out!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Neighbours {
            mentions,
            nodes,
            dims,
            similarity,
            existing_share,
            seed,
            dir,
            bands,
            band_bits,
            max_bucket,
            min_similarity,
        } => {
            let spec = graphloom::resolve::ResolveSpec {
                embedding_candidates: true,
                embedding_bands: bands,
                embedding_band_bits: band_bits,
                embedding_max_bucket: max_bucket,
                embedding_min_similarity: min_similarity,
                ..Default::default()
            };
            if let Some((key, msg)) = spec.problems().into_iter().next() {
                let flag = key.replace("resolve.embedding_", "--").replace('_', "-");
                eprintln!("error: {flag} {msg}");
                return Ok(ExitCode::from(2));
            }
            if dims == 0 || !(0.0..=1.0).contains(&similarity) {
                eprintln!("error: --dims must be positive and --similarity between 0 and 1");
                return Ok(ExitCode::from(2));
            }
            let dir = dir.unwrap_or_else(|| {
                std::env::temp_dir()
                    .join(format!("graphloom-bench-neighbours-{nodes}-{dims}-{seed}"))
            });
            let settings = graphloom::bench::neighbours::NeighboursBench {
                mentions,
                nodes,
                dims,
                similarity,
                existing_share: existing_share.clamp(0.0, 1.0),
                seed,
                dir,
                spec,
            };
            let report = graphloom::bench::neighbours::run_neighbours_bench(settings).await?;
            out!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Communities {
            nodes,
            scale,
            seed,
            dir,
        } => {
            let dir = dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("graphloom-bench-communities-{nodes}-{seed}"))
            });
            let settings = graphloom::bench::communities::CommunitiesBench {
                nodes,
                scale,
                seed,
                dir,
            };
            let report = graphloom::bench::communities::run_communities_bench(settings).await?;
            out!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Resolve {
            mentions,
            nodes,
            seed,
            dir,
            existing_share,
            repeat_share,
            no_fuzzy,
            no_longer_names,
            lsh_bands,
            lsh_rows,
            lsh_max_bucket,
            cluster,
            computed_keys,
        } => {
            let cluster = cluster
                .as_deref()
                .map(graphloom::cluster::ClusterUrl::parse)
                .transpose()?;
            let spec = graphloom::resolve::ResolveSpec {
                fuzzy: !no_fuzzy,
                longer_names: !no_longer_names,
                lsh_bands,
                lsh_rows,
                lsh_max_bucket,
                ..Default::default()
            };
            if let Some((key, msg)) = spec.problems().into_iter().next() {
                let flag = key.replace("resolve.", "--").replace('_', "-");
                eprintln!("error: {flag} {msg}");
                return Ok(ExitCode::from(2));
            }
            let dir = dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("graphloom-bench-resolve-{nodes}-{seed}"))
            });
            let settings = graphloom::bench::resolution::ResolveBench {
                mentions,
                nodes,
                seed,
                dir,
                existing_share: existing_share.clamp(0.0, 1.0),
                repeat_share: repeat_share.clamp(0.0, 1.0 - existing_share.clamp(0.0, 1.0)),
                spec,
                cluster,
                computed_keys,
            };
            let report = graphloom::bench::resolution::run_resolve_bench(settings).await?;
            out!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Add {
            nodes,
            facts,
            seed,
            dir,
        } => {
            let dir = dir.unwrap_or_else(|| std::env::temp_dir().join("graphloom-bench-add"));
            let settings = graphloom::bench::add::AddBench {
                nodes,
                facts,
                seed,
                dir,
            };
            let report = graphloom::bench::add::run_add_bench(settings).await?;
            out!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Sql {
            graph,
            nodes,
            facts,
            seed,
            dir,
            runs,
            python,
        } => {
            let dir = dir.unwrap_or_else(|| std::env::temp_dir().join("graphloom-bench-sql"));
            let settings = graphloom::bench::sql::SqlBench {
                graph,
                nodes,
                facts,
                seed,
                dir,
                runs,
                python,
                graphloom: std::env::current_exe()
                    .map_err(graphloom::bench::resolution::BenchError::from)?,
            };
            let report = graphloom::bench::sql::run_sql_bench(settings).await?;
            out!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Run {
            episodes,
            scale,
            seed,
            concurrency,
            dir,
        } => {
            let dir = dir.unwrap_or_else(|| std::env::temp_dir().join("graphloom-bench-run"));
            let settings = graphloom::bench::pipeline::RunBench {
                episodes: episodes.max(1),
                scale,
                seed,
                dir,
                concurrency: concurrency.max(1),
            };
            let report = graphloom::bench::pipeline::run_pipeline_bench(settings).await?;
            out!("{report}");
            Ok(ExitCode::SUCCESS)
        }
    }
}
