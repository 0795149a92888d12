//! `graphloom recover`: roll back the commits of an interrupted run.

use clap::Args;
use graphloom::Error;

use super::target::GraphTarget;

/// The flags of `graphloom recover`.
#[derive(Debug, Args)]
pub struct RecoverArgs {
    #[command(flatten)]
    target: GraphTarget,
}

impl RecoverArgs {
    /// Rolls back and prints each table rolled back.
    pub async fn run(self) -> Result<(), Error> {
        let store = self.target.open()?;
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
        Ok(())
    }
}
