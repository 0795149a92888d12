//! `graphloom status`: tables, row counts, versions, the writer lock,
//! recent runs and pending batches.

use clap::Args;
use graphloom::Error;
use graphloom::store::{GraphStore, Table};

use super::batches::{ledger_of, print_batches};
use super::target::GraphTarget;

/// The flags of `graphloom status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    target: GraphTarget,
    /// How many recent runs to list.
    #[arg(long, default_value_t = 10)]
    runs: usize,
}

impl StatusArgs {
    /// Prints the graph's state, then the batches still running.
    pub async fn run(self) -> Result<(), Error> {
        let store = self.target.open()?;
        status(&store, self.runs).await?;
        let pending: Vec<_> = ledger_of(&store)
            .list()
            .await?
            .into_iter()
            .filter(|r| r.ended_at.is_none())
            .collect();
        if !pending.is_empty() {
            out!("\npending batches (run again to collect them):");
            print_batches(&pending);
        }
        Ok(())
    }
}

/// The graph, its last completed run, the lock, the tables and the last
/// `max_runs` runs.
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
