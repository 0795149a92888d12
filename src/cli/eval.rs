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

/// One row of the suite table's figures, in column order: each with
/// whether a higher value is better.
fn figures(q: &Quality) -> Vec<(f64, bool)> {
    let (calls, _, seconds) = q.per_episode();
    let share = |a: usize, b: usize| if b == 0 { 1.0 } else { a as f64 / b as f64 };
    vec![
        (q.entity_precision(), true),
        (q.entity_recall(), true),
        (q.chain_accuracy(), true),
        (q.nodes_per_entity(), false),
        (q.fact_recall(), true),
        (q.fact_recall_exact(), true),
        (share(q.ended_dated, q.ended_found), true),
        (share(q.current_stored_live, q.current_found), true),
        (q.episodes_lost as f64, false),
        (calls, false),
        (seconds, false),
    ]
}

const HEADER: &str = "| corpus | entity P | entity R | chains | nodes per entity | facts (family) | facts (exact) | ended, right date | current live | lost | calls / ep | s / ep |\n|---|---|---|---|---|---|---|---|---|---|---|---|";

fn row(name: &str, q: &Quality) -> String {
    let (calls, _, seconds) = q.per_episode();
    format!(
        "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} of {} | {} of {} | {} | {calls:.2} | {seconds:.1} |",
        q.entity_precision(),
        q.entity_recall(),
        q.chain_accuracy(),
        q.nodes_per_entity(),
        q.fact_recall(),
        q.fact_recall_exact(),
        q.ended_dated,
        q.ended_found,
        q.current_stored_live,
        q.current_found,
        q.episodes_lost,
    )
}

/// The last row: each column's worst figure over the corpora, with the
/// corpus it comes from.
fn worst_row(scored: &[(String, Quality)]) -> String {
    let rows: Vec<Vec<(f64, bool)>> = scored.iter().map(|(_, q)| figures(q)).collect();
    let mut cells = Vec::new();
    for col in 0..rows.first().map_or(0, Vec::len) {
        let higher_better = rows[0][col].1;
        let (k, value) = rows
            .iter()
            .enumerate()
            .map(|(k, r)| (k, r[col].0))
            .fold(None::<(usize, f64)>, |worst, (k, v)| match worst {
                Some((_, w)) if (higher_better && w <= v) || (!higher_better && w >= v) => worst,
                _ => Some((k, v)),
            })
            .unwrap_or((0, 0.0));
        let shown = match col {
            8 => format!("{value:.0}"),
            10 => format!("{value:.1}"),
            _ => format!("{value:.2}"),
        };
        cells.push(format!("**{shown}** ({})", scored[k].0));
    }
    format!("| **worst** | {} |", cells.join(" | "))
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
    out!("{HEADER}");
    for (name, q) in &scored {
        out!("{}", row(name, q));
    }
    if !scored.is_empty() {
        out!("{}", worst_row(&scored));
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
