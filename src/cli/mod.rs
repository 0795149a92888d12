//! The `graphloom` command line: the parser, the dispatch to one module per
//! command (each holds the command's flags, their conversion into the
//! library's options, the call and what it prints), and the one place an
//! outcome becomes an exit code: 0 ok, 1 runtime error, 2 usage or
//! configuration error. (The library prints nothing; everything a person
//! sees is drawn here.)

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use graphloom::Error;

#[macro_use]
mod output;

mod add;
mod batches;
#[cfg(feature = "testkit")]
mod bench;
mod cluster;
mod communities;
mod eval;
mod export;
mod ontology;
mod pages;
pub mod progress;
mod recover;
mod run;
mod sql;
mod status;
mod target;

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
    Ontology(ontology::OntologyCommand),
    /// Build the graph from the pipeline's episodes: extract entities and
    /// facts with the LLM, classify them into the type hierarchies and
    /// commit the result as one run.
    Run(run::RunArgs),
    /// Score the graph against a gold file: entity precision and recall,
    /// chain accuracy and fact recall over the episodes it has processed.
    Eval(eval::EvalArgs),
    /// Load known nodes and facts from a JSON Lines file (no LLM).
    Add(add::AddArgs),
    /// Run SQL against the graph's last completed run (read-only).
    Sql(sql::SqlArgs),
    /// Run a scheduler or an executor of a Ballista cluster that runs
    /// graphloom's queries (build with `--features cluster`).
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Show tables, row counts, versions, the writer lock and recent runs.
    Status(status::StatusArgs),
    /// Measure graphloom's parts and print the figures (builds with the
    /// `testkit` feature: `cargo build --release --features testkit`).
    #[cfg(feature = "testkit")]
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// List or cancel the Batch API batches of a graph (batch mode).
    #[command(subcommand)]
    Batches(batches::BatchesCommand),
    /// Roll back the commits of an interrupted run (every write does this
    /// first; this command does only that).
    Recover(recover::RecoverArgs),
    /// Write the graph in another form for readers outside Delta Lake.
    #[command(subcommand)]
    Export(export::ExportCommand),
    /// Draw the graph (or the nodes a query selects) as one self-contained
    /// HTML page: search, a label filter that matches subtypes, and an
    /// as-of slider over the facts' validity.
    View(pages::ViewArgs),
    /// Find communities (groups of closely connected nodes) by hierarchical
    /// Leiden over the facts that hold now, and commit them as the
    /// `communities` and `community_members` tables (replacing the last
    /// ones); `export graphrag` then writes GraphRAG's community tables.
    Communities(communities::CommunitiesArgs),
    /// Write a run report as one HTML page: per run and stage the LLM calls,
    /// tokens, cost, cache hits, time waiting vs in HTTP and latencies,
    /// failures by stage and reason with examples, and with --gold the
    /// eval scores.
    Report(pages::ReportArgs),
}

/// Flags a command found wrong after parsing (a value out of range): a
/// usage error, exit code 2.
#[derive(Debug)]
pub struct UsageError(pub String);

/// Why a command failed: the library's error or a usage error.
#[derive(Debug)]
pub enum Failure {
    /// The library's error; its exit code is [`Error::exit_code`].
    Error(Error),
    /// Flags out of range.
    Usage(UsageError),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Error(e)
    }
}

impl From<UsageError> for Failure {
    fn from(e: UsageError) -> Self {
        Failure::Usage(e)
    }
}

/// Parses the command line, runs the command and returns its exit code.
pub fn run() -> ExitCode {
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
    match runtime.block_on(dispatch(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Error(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
        Err(Failure::Usage(UsageError(message))) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

/// Runs the command.
async fn dispatch(command: Command) -> Result<(), Failure> {
    match command {
        Command::Ontology(c) => c.run()?,
        Command::Run(a) => a.run().await?,
        Command::Eval(a) => a.run().await?,
        Command::Add(a) => a.run().await?,
        Command::Sql(a) => a.run().await?,
        Command::Cluster(c) => c.run().await?,
        Command::Status(a) => a.run().await?,
        #[cfg(feature = "testkit")]
        Command::Bench(c) => c.run().await?,
        Command::Batches(c) => c.run().await?,
        Command::Recover(a) => a.run().await?,
        Command::Export(c) => c.run().await?,
        Command::View(a) => a.run().await?,
        Command::Communities(a) => a.run().await?,
        Command::Report(a) => a.run().await?,
    }
    Ok(())
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
