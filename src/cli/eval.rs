//! `graphloom eval`: score the graph against a gold file, or every corpus
//! of a suite as one table.

use std::path::{Path, PathBuf};

use clap::Args;
use graphloom::Error;
use graphloom::eval::{Gold, Quality};
use graphloom::spec::PipelineSpec;
use graphloom::store::GraphStore;

use super::target::GraphTarget;
use super::{Failure, UsageError};

/// The flags of `graphloom eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Root URL of the graph (file://, memory://, s3://, gs://, az:// or a path).
    #[arg(long, value_name = "URL", conflicts_with = "pipeline", required_unless_present_any = ["pipeline", "suite"])]
    graph: Option<String>,
    /// Take the graph (and its storage options) from a pipeline spec.
    #[arg(long, value_name = "PATH")]
    pipeline: Option<PathBuf>,
    /// Gold file (JSON), e.g. pipelines/gold/procurement.json.
    #[arg(long, value_name = "PATH", required_unless_present = "suite")]
    gold: Option<PathBuf>,
    /// Score every corpus under DIR (each a directory with `pipeline.toml`
    /// and `gold.json`, its graph where its pipeline's output.graph points,
    /// read from the current directory) and print one table, with a last
    /// row of each column's worst figure.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["gold", "graph", "pipeline"])]
    suite: Option<PathBuf>,
}

impl EvalArgs {
    /// Scores the graph (or the suite) and prints the scores.
    pub async fn run(self) -> Result<(), Failure> {
        if let Some(dir) = &self.suite {
            return suite(dir).await;
        }
        let Some(gold) = &self.gold else {
            return Err(UsageError(
                "give --gold with --graph or --pipeline, or --suite DIR".into(),
            )
            .into());
        };
        let store = GraphTarget::new(self.graph, self.pipeline).open()?;
        let gold = Gold::from_path(gold).map_err(Error::from)?;
        let quality = graphloom::eval::evaluate(&store, &gold)
            .await
            .map_err(Error::from)?;
        out!("{quality}");
        Ok(())
    }
}

/// The corpora of a suite directory: its subdirectories with a
/// `pipeline.toml` and a `gold.json`, by name.
fn corpora(dir: &Path) -> Result<Vec<(String, PathBuf)>, UsageError> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        UsageError(format!(
            "cannot read the suite directory {}: {e}",
            dir.display()
        ))
    })?;
    let mut out: Vec<(String, PathBuf)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join("pipeline.toml").is_file() && p.join("gold.json").is_file())
        .filter_map(|p| Some((p.file_name()?.to_str()?.to_string(), p)))
        .collect();
    out.sort();
    if out.is_empty() {
        return Err(UsageError(format!(
            "{} holds no corpus (a directory with pipeline.toml and gold.json)",
            dir.display()
        )));
    }
    Ok(out)
}

/// One column of the suite table.
struct Column {
    header: &'static str,
    /// The figure the worst row compares.
    figure: fn(&Quality) -> f64,
    /// Whether a higher figure is better.
    higher_better: bool,
    /// Decimals the figure is shown with.
    decimals: usize,
    /// A corpus row's cell, when it shows more than the figure.
    cell: Option<fn(&Quality) -> String>,
}

/// `a` of `b` as a share, 1 when there is nothing to count.
fn share(a: usize, b: usize) -> f64 {
    if b == 0 { 1.0 } else { a as f64 / b as f64 }
}

const fn column(header: &'static str, figure: fn(&Quality) -> f64, higher_better: bool) -> Column {
    Column {
        header,
        figure,
        higher_better,
        decimals: 2,
        cell: None,
    }
}

/// The suite table's columns after the corpus name.
const COLUMNS: [Column; 12] = [
    column("entity P", Quality::entity_precision, true),
    column("entity R", Quality::entity_recall, true),
    column("chains", Quality::chain_accuracy, true),
    Column {
        cell: Some(|q| format!("{} of {}", q.sub_right, q.sub_asked)),
        ..column("subtype reached", Quality::subtype_accuracy, true)
    },
    column("nodes per entity", Quality::nodes_per_entity, false),
    column("facts (family)", Quality::fact_recall, true),
    column("facts (exact)", Quality::fact_recall_exact, true),
    Column {
        cell: Some(|q| format!("{} of {}", q.ended_dated, q.ended_found)),
        ..column(
            "ended, right date",
            |q| share(q.ended_dated, q.ended_found),
            true,
        )
    },
    Column {
        cell: Some(|q| format!("{} of {}", q.current_stored_live, q.current_found)),
        ..column(
            "current live",
            |q| share(q.current_stored_live, q.current_found),
            true,
        )
    },
    Column {
        decimals: 0,
        ..column("lost", |q| q.episodes_lost as f64, false)
    },
    column("calls / ep", |q| q.per_episode().0, false),
    Column {
        decimals: 1,
        ..column("s / ep", |q| q.per_episode().2, false)
    },
];

fn header() -> String {
    let names: Vec<&str> = COLUMNS.iter().map(|c| c.header).collect();
    format!(
        "| corpus | {} |\n|---|{}",
        names.join(" | "),
        "---|".repeat(COLUMNS.len())
    )
}

fn row(name: &str, q: &Quality) -> String {
    let cells: Vec<String> = COLUMNS
        .iter()
        .map(|c| match c.cell {
            Some(cell) => cell(q),
            None => format!("{:.*}", c.decimals, (c.figure)(q)),
        })
        .collect();
    format!("| {name} | {} |", cells.join(" | "))
}

/// The last row: each column's worst figure over the corpora, with the
/// corpus it comes from (the first of equals); `None` without corpora.
fn worst_row(scored: &[(String, Quality)]) -> Option<String> {
    let cells: Option<Vec<String>> = COLUMNS
        .iter()
        .map(|c| {
            let worse = |a: f64, b: f64| if c.higher_better { a < b } else { a > b };
            let (name, value) = scored
                .iter()
                .map(|(name, q)| (name, (c.figure)(q)))
                .reduce(|w, x| if worse(x.1, w.1) { x } else { w })?;
            Some(format!("**{:.*}** ({name})", c.decimals, value))
        })
        .collect();
    Some(format!("| **worst** | {} |", cells?.join(" | ")))
}

async fn suite(dir: &Path) -> Result<(), Failure> {
    let mut scored = Vec::new();
    let mut unscored: Vec<(String, Failure)> = Vec::new();
    for (name, path) in corpora(dir)? {
        match score(&path).await {
            Ok(quality) if quality.runs == 0 => unscored.push((
                name,
                UsageError("its graph has no completed run".into()).into(),
            )),
            Ok(quality) => scored.push((name, quality)),
            Err(e) => unscored.push((name, e.into())),
        }
    }
    out!("{}", header());
    for (name, q) in &scored {
        out!("{}", row(name, q));
    }
    if let Some(worst) = worst_row(&scored) {
        out!("{worst}");
    }
    // A corpus without a graph (not run yet) is named, not skipped: a
    // suite's worst row over fewer corpora than it has says less.
    for (name, e) in &unscored {
        eprintln!("error: corpus {name} not scored: {}", describe(e));
    }
    match unscored.into_iter().next() {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}

fn describe(f: &Failure) -> String {
    match f {
        Failure::Error(e) => e.to_string(),
        Failure::Usage(UsageError(m)) => m.clone(),
    }
}

/// The scores of the corpus at `path`.
async fn score(path: &Path) -> Result<Quality, Error> {
    let spec = PipelineSpec::from_path(&path.join("pipeline.toml"))?;
    let store = GraphStore::open(&spec.output.graph, &spec.output.storage_options)?;
    let gold = Gold::from_path(&path.join("gold.json"))?;
    Ok(graphloom::eval::evaluate(&store, &gold).await?)
}
