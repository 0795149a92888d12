//! `graphloom communities`: find and commit the graph's communities.

use clap::Args;
use graphloom::Error;
use graphloom::communities::CommunityOptions;

use super::target::GraphTarget;

/// The flags of `graphloom communities`.
#[derive(Debug, Args)]
pub struct CommunitiesArgs {
    #[command(flatten)]
    target: GraphTarget,
    /// Seed of Leiden's random choices: the same graph and seed give
    /// the same communities.
    #[arg(long, default_value_t = CommunityOptions::default().seed)]
    seed: u64,
    /// Split communities larger than this at the next level.
    #[arg(long, value_name = "N", default_value_t = CommunityOptions::default().max_cluster_size)]
    max_cluster_size: usize,
    /// Most levels of the hierarchy.
    #[arg(long, value_name = "N", default_value_t = CommunityOptions::default().max_levels)]
    max_levels: usize,
    /// Modularity resolution: higher gives smaller communities.
    #[arg(long, default_value_t = CommunityOptions::default().resolution)]
    resolution: f64,
}

impl CommunitiesArgs {
    /// Detects and commits the communities and prints their levels.
    pub async fn run(self) -> Result<(), Error> {
        let (store, spec) = self.target.open_with_spec()?;
        let options = CommunityOptions {
            seed: self.seed,
            max_cluster_size: self.max_cluster_size,
            max_levels: self.max_levels,
            resolution: self.resolution,
            // A spec's group; a bare --graph gets the default one.
            group_id: spec.map_or_else(
                || CommunityOptions::default().group_id,
                |s| s.output.group_id,
            ),
        };
        let r = graphloom::communities::detect_communities(&store, &options).await?;
        let levels: Vec<String> = r
            .per_level
            .iter()
            .enumerate()
            .map(|(l, n)| format!("level {l}: {n}"))
            .collect();
        out!(
            "committed communities of {} (run {}): {} of {} nodes in communities over {} current facts; {}; modularity {:.3}; read {} ms, detect {} ms, write {} ms",
            store.display_url(),
            r.run_id,
            r.members,
            r.nodes,
            r.edges,
            if levels.is_empty() {
                "no communities".to_string()
            } else {
                levels.join(", ")
            },
            r.modularity,
            r.read_ms,
            r.detect_ms,
            r.write_ms
        );
        Ok(())
    }
}
