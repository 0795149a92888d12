//! `graphloom export parquet|graphrag`: the graph in forms for readers
//! outside Delta Lake.

use clap::{Args, Subcommand};
use graphloom::Error;
use graphloom::export::GraphragOptions;

use super::target::GraphTarget;

/// The subcommands of `graphloom export`.
#[derive(Debug, Subcommand)]
pub enum ExportCommand {
    /// Write the last completed run's snapshot of every table as plain
    /// Parquet (`<DIR>/<table>.parquet`, plus `_graphloom_export.json`),
    /// for readers without Delta support.
    Parquet(ParquetArgs),
    /// Write the graph as GraphRAG's output tables (`entities`,
    /// `relationships`, `text_units`, `documents` and, when the graph has
    /// communities, `communities` and `community_reports`) for GraphRAG's
    /// query side and tools that read its index.
    Graphrag(GraphragArgs),
}

/// The flags of `graphloom export parquet`.
#[derive(Debug, Args)]
pub struct ParquetArgs {
    #[command(flatten)]
    target: GraphTarget,
    /// Destination directory: a path or an object store URL. With
    /// --pipeline, the spec's output.storage_options apply to it too.
    #[arg(long, value_name = "DIR")]
    to: String,
}

/// The flags of `graphloom export graphrag`.
#[derive(Debug, Args)]
pub struct GraphragArgs {
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
}

impl ExportCommand {
    /// Exports and prints each table written.
    pub async fn run(self) -> Result<(), Error> {
        match self {
            ExportCommand::Parquet(a) => export(&a.target, &a.to, None).await,
            ExportCommand::Graphrag(a) => {
                let options = GraphragOptions {
                    current_only: a.current_only,
                };
                export(&a.target, &a.to, Some(options)).await
            }
        }
    }
}

/// Plain Parquet, or GraphRAG's tables with `graphrag` options.
async fn export(
    target: &GraphTarget,
    to: &str,
    graphrag: Option<GraphragOptions>,
) -> Result<(), Error> {
    let (store, spec) = target.open_with_spec()?;
    let options = spec.map(|s| s.output.storage_options).unwrap_or_default();
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
    Ok(())
}
