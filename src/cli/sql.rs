//! `graphloom sql`: run SQL against the graph's last completed run.

use std::path::PathBuf;

use clap::Args;
use graphloom::Error;
use graphloom::query::{GraphSession, OutputFormat, QueryError, render};

use super::target::GraphTarget;

/// The flags of `graphloom sql`.
#[derive(Debug, Args)]
pub struct SqlArgs {
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
}

impl SqlArgs {
    /// The SQL text, from the argument or from `--file`.
    fn sql(&self) -> Result<String, QueryError> {
        match (&self.query, &self.file) {
            (Some(q), _) => Ok(q.clone()),
            (None, Some(path)) => {
                std::fs::read_to_string(path).map_err(|source| QueryError::File {
                    path: path.display().to_string(),
                    source,
                })
            }
            (None, None) => unreachable!("clap requires a query or --file"),
        }
    }

    /// Runs the statements and prints each result in the chosen format.
    pub async fn run(self) -> Result<(), Error> {
        let sql = self.sql()?;
        let cluster = self
            .cluster
            .as_deref()
            .map(graphloom::cluster::ClusterUrl::parse)
            .transpose()?;
        let store = self.target.open()?;
        let session = match &cluster {
            None => GraphSession::open(&store).await?,
            Some(url) => graphloom::cluster::open_graph(&store, url).await?,
        };
        let results = session.run(&sql).await?;
        for result in &results {
            out_raw!("{}", render(result, self.format)?);
        }
        Ok(())
    }
}
