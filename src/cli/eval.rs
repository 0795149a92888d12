//! `graphloom eval`: score the graph against a gold file.

use std::path::PathBuf;

use clap::Args;
use graphloom::Error;

use super::target::GraphTarget;

/// The flags of `graphloom eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    target: GraphTarget,
    /// Gold file (JSON), e.g. pipelines/gold/procurement.json.
    #[arg(long, value_name = "PATH")]
    gold: PathBuf,
}

impl EvalArgs {
    /// Scores the graph and prints the scores.
    pub async fn run(self) -> Result<(), Error> {
        let store = self.target.open()?;
        let gold = graphloom::eval::Gold::from_path(&self.gold)?;
        let quality = graphloom::eval::evaluate(&store, &gold).await?;
        out!("{quality}");
        Ok(())
    }
}
