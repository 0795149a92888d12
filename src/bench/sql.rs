//! `graphloom bench sql`: whole-process query times of `graphloom sql`
//! against DuckDB reading the same Parquet files.
//!
//! The comparison a user makes is "run the query from a shell", so both
//! sides are timed as whole processes: this executable's `sql` command, and
//! `python3` importing DuckDB and querying `read_parquet` views of the
//! snapshot's data files (the files of the last completed run, which
//! [`Snapshot::file_uris`] lists). Each query runs once to warm the page
//! cache, then `runs` times; the median counts. `SELECT 1` on both sides
//! gives the start-up cost, which the report also subtracts. Both sides'
//! answers are compared, so a faster wrong answer cannot pass unnoticed.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use super::resolution::BenchError;
use crate::store::{GraphStore, Table};

/// Settings of `graphloom bench sql`.
#[derive(Debug, Clone)]
pub struct SqlBench {
    /// An existing graph (a local path or file:// URL); when `None`, one
    /// is built with the `bench add` generator under `dir`.
    pub graph: Option<String>,
    /// Node lines of the generated graph.
    pub nodes: usize,
    /// Fact lines of the generated graph.
    pub facts: usize,
    /// Generator seed.
    pub seed: u64,
    /// Where a generated graph lives; one already there for the same
    /// size is reused, since building 10M nodes takes minutes.
    pub dir: PathBuf,
    /// Timed runs per query and engine (the median counts).
    pub runs: usize,
    /// The Python interpreter that has the `duckdb` package.
    pub python: String,
    /// The `graphloom` executable whose `sql` command is timed (the
    /// running one, for the CLI).
    pub graphloom: PathBuf,
}

/// One query as graphloom and DuckDB spell it.
struct BenchQuery {
    name: &'static str,
    graphloom: &'static str,
    duckdb: &'static str,
}

/// The queries of issue 16: a label filter, an edge-family join with a
/// label filter, and a type-family count. DuckDB has no closure functions,
/// so its spelling reads the closure tables.
const QUERIES: [BenchQuery; 3] = [
    BenchQuery {
        name: "label filter, group by type",
        graphloom: "SELECT type, count(*) AS n FROM nodes \
                    WHERE has_label(labels, 'Contract') GROUP BY type ORDER BY type",
        duckdb: "SELECT type, count(*) AS n FROM nodes \
                 WHERE list_contains(labels, 'Contract') GROUP BY type ORDER BY type",
    },
    BenchQuery {
        name: "edge family join + label filter",
        graphloom: "SELECT n.type, count(*) AS n FROM edges e \
                    JOIN nodes n ON e.target_node_id = n.node_id \
                    WHERE edge_type_matches(e.relation_type, 'EMPLOYED_BY') \
                    AND has_label(n.labels, 'Company') GROUP BY n.type ORDER BY n.type",
        duckdb: "SELECT n.type, count(*) AS n FROM edges e \
                 JOIN nodes n ON e.target_node_id = n.node_id \
                 WHERE (e.relation_type = 'EMPLOYED_BY' OR e.relation_type IN \
                   (SELECT descendant FROM edge_type_closure WHERE ancestor = 'EMPLOYED_BY')) \
                 AND list_contains(n.labels, 'Company') GROUP BY n.type ORDER BY n.type",
    },
    BenchQuery {
        name: "type family count",
        graphloom: "SELECT count(*) AS n FROM nodes WHERE entity_type_matches(type, 'Contract')",
        duckdb: "SELECT count(*) AS n FROM nodes WHERE type = 'Contract' OR type IN \
                 (SELECT descendant FROM entity_type_closure WHERE ancestor = 'Contract')",
    },
];

/// Node lines per `graphloom add` when the bench builds a graph.
const NODES_PER_LOAD: usize = 1_000_000;

/// The tables DuckDB gets views of.
const DUCKDB_TABLES: [Table; 4] = [
    Table::Nodes,
    Table::Edges,
    Table::EntityTypeClosure,
    Table::EdgeTypeClosure,
];

/// Registers each table's files as a view, runs one query and prints its
/// rows as comma-separated lines (the shape `graphloom sql --format csv`
/// prints, less the header).
const DUCKDB_SCRIPT: &str = r#"
import json, sys
import duckdb
job = json.loads(sys.argv[1])
con = duckdb.connect()
for name, files in job["tables"].items():
    con.read_parquet(files).create_view(name)
for row in con.execute(job["query"]).fetchall():
    print(",".join("" if v is None else str(v) for v in row))
"#;

/// One query's figures.
#[derive(Debug, Clone)]
pub struct QueryFigures {
    /// What the query does.
    pub name: &'static str,
    /// Median whole-process seconds of `graphloom sql`.
    pub graphloom: f64,
    /// Median whole-process seconds of DuckDB, when it ran.
    pub duckdb: Option<f64>,
    /// Whether both printed the same rows (when DuckDB ran).
    pub same_answer: Option<bool>,
    /// graphloom's answer, for the report.
    pub answer: Vec<String>,
}

/// What `bench sql` measured.
#[derive(Debug, Clone)]
pub struct SqlBenchReport {
    /// The graph queried.
    pub graph: String,
    /// Whether the graph was built by this run (false: given or reused).
    pub built: bool,
    /// Rows of `nodes` and `edges`.
    pub nodes: u64,
    pub edges: u64,
    /// Data files and bytes of `nodes`.
    pub node_files: usize,
    pub node_bytes: u64,
    /// Timed runs per query and engine.
    pub runs: usize,
    /// `SELECT 1`: start-up of each side.
    pub startup: QueryFigures,
    /// The benchmark queries.
    pub queries: Vec<QueryFigures>,
    /// Why DuckDB was not run, when it was not.
    pub duckdb_missing: Option<String>,
}

/// Runs the benchmark.
pub async fn run_sql_bench(settings: SqlBench) -> Result<SqlBenchReport, BenchError> {
    let step = |what: &str, e: String| BenchError::Step(format!("{what}: {e}"));
    let (graph, built) = match &settings.graph {
        Some(graph) => (graph.clone(), false),
        None => generated_graph(&settings).await?,
    };
    let store = GraphStore::open(&graph, &Default::default())
        .map_err(|e| step("opening the graph", e.to_string()))?;
    let snapshot = store
        .existing_snapshot()
        .await
        .map_err(|e| step("reading the graph's last run", e.to_string()))?;
    // Each table's local file paths, by table name, as DuckDB gets them.
    let mut tables: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut missing = None;
    for table in DUCKDB_TABLES {
        let uris = snapshot
            .file_uris(table)
            .map_err(|e| step("listing the graph's files", e.to_string()))?;
        let paths: Option<Vec<String>> = uris.iter().map(|u| local_path(u)).collect();
        match paths {
            Some(paths) if !paths.is_empty() => {
                tables.insert(table.name(), paths);
            }
            Some(_) => missing = Some(format!("the graph has no {} files", table.name())),
            None => missing = Some("DuckDB is compared on local graphs only".to_string()),
        }
    }
    let node_paths = tables.get(Table::Nodes.name()).cloned().unwrap_or_default();
    let node_bytes = node_paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    if missing.is_none() {
        missing = duckdb_unavailable(&settings.python);
    }
    let count = |table: &str| -> Result<u64, BenchError> {
        let rows = run_graphloom(
            &settings.graphloom,
            &graph,
            &format!("SELECT count(*) FROM {table}"),
        )?;
        rows.first()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| BenchError::Step(format!("counting {table}: got {rows:?}")))
    };
    let (nodes, edges) = (count("nodes")?, count("edges")?);

    let runs = settings.runs.max(1);
    let measure =
        |name: &'static str, ours: &str, theirs: &str| -> Result<QueryFigures, BenchError> {
            let (graphloom, answer) =
                median_of(runs, || run_graphloom(&settings.graphloom, &graph, ours))?;
            let (duckdb, same_answer) = if missing.is_none() {
                let job = serde_json::json!({"tables": tables, "query": theirs}).to_string();
                let (seconds, rows) = median_of(runs, || run_duckdb(&settings.python, &job))?;
                (Some(seconds), Some(rows == answer))
            } else {
                (None, None)
            };
            Ok(QueryFigures {
                name,
                graphloom,
                duckdb,
                same_answer,
                answer,
            })
        };
    let startup = measure("SELECT 1", "SELECT 1", "SELECT 1")?;
    let queries = QUERIES
        .iter()
        .map(|q| measure(q.name, q.graphloom, q.duckdb))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SqlBenchReport {
        graph,
        built,
        nodes,
        edges,
        node_files: node_paths.len(),
        node_bytes,
        runs,
        startup,
        queries,
        duckdb_missing: missing,
    })
}

/// The generated graph of `settings`' size: reused when a completed one is
/// already under `dir`, otherwise loaded by `bench add`'s generator.
async fn generated_graph(settings: &SqlBench) -> Result<(String, bool), BenchError> {
    let graph_dir = super::add::graph_dir(&settings.dir, settings.nodes, settings.facts);
    let url = format!("file://{}/", graph_dir.display());
    if let Ok(store) = GraphStore::open(&url, &Default::default())
        && store.existing_snapshot().await.is_ok()
    {
        return Ok((url, false));
    }
    let add = super::add::AddBench {
        nodes: settings.nodes,
        facts: settings.facts,
        seed: settings.seed,
        dir: settings.dir.clone(),
    };
    // One `add` holds its whole input and graph in memory (about 3.7 GB
    // at 1M nodes), so larger graphs are built by several loads.
    super::add::load(&add, settings.nodes, settings.facts, NODES_PER_LOAD).await?;
    Ok((url, true))
}

/// The local path of a file URI (percent-decoded) or path; `None` for
/// remote stores.
fn local_path(uri: &str) -> Option<String> {
    if !uri.contains("://") {
        return Some(uri.to_string());
    }
    let path = url::Url::parse(uri).ok()?.to_file_path().ok()?;
    Some(path.to_str()?.to_string())
}

/// Why DuckDB cannot run here, if it cannot.
fn duckdb_unavailable(python: &str) -> Option<String> {
    match Command::new(python).args(["-c", "import duckdb"]).output() {
        Ok(out) if out.status.success() => None,
        Ok(_) => Some(format!(
            "{python} cannot import duckdb (pip install duckdb)"
        )),
        Err(e) => Some(format!("cannot start {python}: {e}")),
    }
}

/// Runs `once` one time to warm caches, then `runs` times; the median of
/// the timed runs and the last answer.
fn median_of(
    runs: usize,
    mut once: impl FnMut() -> Result<Vec<String>, BenchError>,
) -> Result<(f64, Vec<String>), BenchError> {
    let mut answer = once()?;
    let mut seconds = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        answer = once()?;
        seconds.push(started.elapsed().as_secs_f64());
    }
    seconds.sort_by(f64::total_cmp);
    Ok((seconds[seconds.len() / 2], answer))
}

/// `graphloom sql` of `exe`; the result rows without the header.
fn run_graphloom(exe: &Path, graph: &str, query: &str) -> Result<Vec<String>, BenchError> {
    let mut command = Command::new(exe);
    command.args(["sql", "--graph", graph, "--format", "csv", query]);
    let mut rows = output_lines(command, "graphloom sql")?;
    if !rows.is_empty() {
        rows.remove(0);
    }
    Ok(rows)
}

fn run_duckdb(python: &str, job: &str) -> Result<Vec<String>, BenchError> {
    let mut command = Command::new(python);
    command.args(["-c", DUCKDB_SCRIPT, job]);
    output_lines(command, "DuckDB")
}

fn output_lines(mut command: Command, what: &str) -> Result<Vec<String>, BenchError> {
    let out = command.output()?;
    if !out.status.success() {
        return Err(BenchError::Step(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

impl SqlBenchReport {
    /// graphloom's time over DuckDB's for one query, whole processes.
    pub fn ratio(q: &QueryFigures) -> Option<f64> {
        q.duckdb.filter(|d| *d > 0.0).map(|d| q.graphloom / d)
    }
}

impl fmt::Display for SqlBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "bench sql: {} build, {} cores; graph {}{}",
            super::build_kind(),
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            self.graph,
            if self.built { " (built now)" } else { "" }
        )?;
        writeln!(
            f,
            "  {} nodes in {} file(s), {:.1} MB; {} edges; whole processes, median of {}",
            self.nodes,
            self.node_files,
            self.node_bytes as f64 / 1e6,
            self.edges,
            self.runs
        )?;
        if let Some(why) = &self.duckdb_missing {
            writeln!(f, "  DuckDB not run: {why}")?;
        }
        let secs = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{s:.3} s"));
        let base = &self.startup;
        writeln!(
            f,
            "  {:<34} graphloom {:>9}  DuckDB {:>9}",
            base.name,
            secs(Some(base.graphloom)),
            secs(base.duckdb)
        )?;
        for q in &self.queries {
            let ratio = Self::ratio(q).map_or("-".to_string(), |r| format!("{r:.2}×"));
            // Without start-up: what the query itself costs each engine.
            let net = match q.duckdb.zip(base.duckdb) {
                Some((d, d0)) => format!(
                    "; less start-up {:.3} s vs {:.3} s",
                    (q.graphloom - base.graphloom).max(0.0),
                    (d - d0).max(0.0)
                ),
                None => String::new(),
            };
            let answer = match q.same_answer {
                Some(true) => "same answer",
                Some(false) => "ANSWERS DIFFER",
                None => "not compared",
            };
            writeln!(
                f,
                "  {:<34} graphloom {:>9}  DuckDB {:>9}  ratio {ratio}{net}; {answer}: {}",
                q.name,
                secs(Some(q.graphloom)),
                secs(q.duckdb),
                q.answer.join(" | ")
            )?;
        }
        Ok(())
    }
}
