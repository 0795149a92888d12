//! `graphloom batches list|cancel`: the Batch API batches of a graph.

use clap::{Args, Subcommand};
use graphloom::Error;
use graphloom::llm::batch::{BatchApi, BatchRecord, Ledger, stages_text};
use graphloom::store::GraphStore;

use super::Failure;
use super::target::{GraphTarget, SpecTarget, load};

/// The subcommands of `graphloom batches`.
#[derive(Debug, Subcommand)]
pub enum BatchesCommand {
    /// List every batch the graph's runs submitted, with stage, requests,
    /// status and age.
    List(ListArgs),
    /// Ask the provider to cancel every batch still running; the next run
    /// collects their partial output and submits the rest again.
    Cancel(CancelArgs),
}

/// The flags of `graphloom batches list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    target: GraphTarget,
}

/// The flags of `graphloom batches cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    // The spec's [llm] names the provider.
    #[command(flatten)]
    target: SpecTarget,
}

impl BatchesCommand {
    /// Lists or cancels.
    pub async fn run(self) -> Result<(), Failure> {
        if let BatchesCommand::Cancel(args) = &self {
            let path = args.target.spec.path()?;
            return Ok(cancel(path, &args.target).await?);
        }
        Ok(self.list().await?)
    }

    async fn list(self) -> Result<(), Error> {
        match self {
            BatchesCommand::List(args) => {
                let records = ledger_of(&args.target.open()?).list().await?;
                if records.is_empty() {
                    out!("no batches: no run of this graph used batch mode");
                }
                print_batches(&records);
            }
            BatchesCommand::Cancel(_) => unreachable!("run cancels"),
        }
        Ok(())
    }
}

/// Asks the provider to cancel the batches still running.
async fn cancel(path: &std::path::Path, target: &SpecTarget) -> Result<(), Error> {
    let (spec, _) = load(path)?;
    let ledger = ledger_of(&target.open(&spec)?);
    let api = BatchApi::new(&spec.llm)?;
    let cancelled = graphloom::llm::batch::cancel_all(&api, &ledger).await?;
    if cancelled.is_empty() {
        out!("no batch is running");
    }
    for id in cancelled {
        out!("asked to cancel {id}");
    }
    Ok(())
}

/// The batch ledger kept under a graph, in the graph's object store.
pub fn ledger_of(store: &GraphStore) -> Ledger {
    Ledger::in_graph(store.object_store(), store.url())
}

/// One line per batch: id, status, requests per stage, age.
pub fn print_batches(records: &[BatchRecord]) {
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
            stages_text(&r.stages()),
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
