//! `graphloom add`: load known nodes and facts from a JSON Lines file.

use clap::Args;
use graphloom::Error;

use super::Failure;
use super::target::{SpecTarget, load};

/// The flags of `graphloom add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    // The spec whose ontology and output graph to use.
    #[command(flatten)]
    target: SpecTarget,
    /// JSON Lines file: one {"node": ...} or {"fact": ...} per line; a
    /// local path or an object store URL.
    #[arg(value_name = "FILE", required_unless_present = "pipeline")]
    file: Option<String>,
}

impl AddArgs {
    /// Loads the file and prints what it added and which lines failed.
    pub async fn run(self) -> Result<(), Failure> {
        let (path, file) = self.target.spec.path_and(self.file.as_deref())?;
        Ok(self.add(path, file).await?)
    }

    async fn add(&self, path: &std::path::Path, file: &str) -> Result<(), Error> {
        let (spec, ontology) = load(path)?;
        let store = self.target.open(&spec)?;
        let report = graphloom::add::add_file(
            &store,
            &ontology,
            &spec.resolve.name_keys(),
            &spec.output.group_id,
            file,
            &spec.output.storage_options,
        )
        .await?;
        out!(
            "added {} nodes ({} created for fact endpoints) and {} facts to {} (run {}, {} ms)",
            report.run.nodes_added,
            report.implicit_nodes,
            report.run.edges_added,
            store.display_url(),
            report.run.run_id,
            report.run.duration_ms,
        );
        if !report.failures.is_empty() {
            out!(
                "{} line(s) failed and were recorded in `failures`:",
                report.failures.len()
            );
            for f in &report.failures {
                out!("  {}: {}", f.item, f.reason);
            }
        }
        Ok(())
    }
}
