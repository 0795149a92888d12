//! `graphloom view` and `graphloom report`: the graph, and its runs, as
//! self-contained HTML pages.

use std::path::PathBuf;

use clap::Args;
use graphloom::Error;
use graphloom::pages::report::ReportOptions;
use graphloom::pages::view::{DEFAULT_MAX_NODES, ViewOptions};

use super::target::GraphTarget;

/// The flags of `graphloom view`.
#[derive(Debug, Args)]
pub struct ViewArgs {
    #[command(flatten)]
    target: GraphTarget,
    /// SQL returning a `node_id` column: the nodes to draw (and the
    /// edges among them). Default: every node.
    #[arg(long, value_name = "SQL")]
    query: Option<String>,
    /// Start the as-of slider at this time (RFC 3339, a date or a
    /// year); default: all times, ended facts dashed.
    #[arg(long, value_name = "TIME")]
    as_of: Option<String>,
    /// Draw at most N nodes (the highest-ranked of the selection); the
    /// page says when it shows fewer than matched.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_NODES)]
    max_nodes: usize,
    /// The HTML file to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

impl ViewArgs {
    /// Writes the page and prints what it drew.
    pub async fn run(self) -> Result<(), Error> {
        let store = self.target.open()?;
        let options = ViewOptions {
            query: self.query,
            as_of: self.as_of,
            max_nodes: self.max_nodes.max(1),
        };
        let v = graphloom::pages::view::write_view(&store, &options, &self.out).await?;
        let capped = if (v.nodes as u64) < v.matched_nodes {
            format!(
                " (capped: {} matched, --max-nodes {})",
                v.matched_nodes, options.max_nodes
            )
        } else {
            String::new()
        };
        out!(
            "wrote {}: {} nodes, {} edges of {}{capped}",
            self.out.display(),
            v.nodes,
            v.edges,
            store.display_url()
        );
        Ok(())
    }
}

/// The flags of `graphloom report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    #[command(flatten)]
    target: GraphTarget,
    /// Also score the graph against this gold file (as `graphloom eval`).
    #[arg(long, value_name = "PATH")]
    gold: Option<PathBuf>,
    /// The HTML file to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

impl ReportArgs {
    /// Writes the report and prints what it covers.
    pub async fn run(self) -> Result<(), Error> {
        let (store, spec) = self.target.open_with_spec()?;
        // With --pipeline the spec's prices split each run's cost over
        // its stages.
        let prices = spec.and_then(|s| {
            s.llm
                .price_per_1m_prompt_tokens
                .zip(s.llm.price_per_1m_completion_tokens)
        });
        let options = ReportOptions {
            gold: self.gold,
            prices,
        };
        let r = graphloom::pages::report::write_report(&store, &options, &self.out).await?;
        out!(
            "wrote {}: {} runs, {} run stages, {} LLM calls, {} failures{} of {}",
            self.out.display(),
            r.runs,
            r.stages,
            r.calls,
            r.failures,
            if r.eval { ", eval scores" } else { "" },
            store.display_url()
        );
        Ok(())
    }
}
