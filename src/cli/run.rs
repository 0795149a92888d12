//! `graphloom run`: build the graph from the pipeline's episodes.

use clap::Args;
use graphloom::Error;
use graphloom::llm::CacheMode;
use graphloom::run::{RunOptions, RunReport};
use graphloom::spec::PipelineSpec;
use graphloom::stage::Stage;
use graphloom::store::GraphStore;

use super::Failure;
use super::target::{SpecTarget, load};

/// The flags of `graphloom run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    target: SpecTarget,
    /// Print the planned calls, tokens and cost; call and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Process at most N new episodes (oldest first).
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Neither read nor write the response cache.
    #[arg(long, conflicts_with = "refresh_cache")]
    no_cache: bool,
    /// Ignore cached replies and store fresh ones.
    #[arg(long, conflicts_with = "replay")]
    refresh_cache: bool,
    /// Rebuild from the response cache alone: make no LLM call; a
    /// request the cache has no reply for fails its episode (a
    /// `failures` row, retried by the next run).
    #[arg(long, conflicts_with = "no_cache")]
    replay: bool,
    /// Send the LLM calls through the provider's Batch API (as
    /// llm.mode = "batch"): half the price, answers within 24 hours.
    #[arg(long, conflicts_with_all = ["no_cache", "refresh_cache", "replay"])]
    batch: bool,
    /// Batch mode: submit what the next round needs and exit; a later
    /// run collects the answers and goes on (for schedulers).
    #[arg(long)]
    no_wait: bool,
    /// Read the episodes from this file or directory instead of the
    /// spec's source.url (the format and options stay the spec's), for
    /// a first slice of an archive; a later run over the whole archive
    /// skips what the slice committed.
    #[arg(long, value_name = "URL")]
    source: Option<String>,
    /// Resolve on the Ballista cluster whose scheduler is at
    /// df://HOST:PORT (as resolve.cluster); its executors read and
    /// write the graph's files at the graph's URL.
    #[arg(long, value_name = "df://HOST:PORT", env = "GRAPHLOOM_CLUSTER")]
    cluster: Option<String>,
}

impl RunArgs {
    /// The run's options; fails on a malformed `--cluster` URL.
    fn options(&self) -> Result<RunOptions, Error> {
        let cluster = self
            .cluster
            .as_deref()
            .map(graphloom::cluster::ClusterUrl::parse)
            .transpose()?;
        let cache = if self.no_cache {
            CacheMode::Off
        } else if self.replay {
            CacheMode::Replay
        } else if self.refresh_cache {
            CacheMode::Refresh
        } else {
            CacheMode::ReadWrite
        };
        Ok(RunOptions {
            dry_run: self.dry_run,
            limit: self.limit,
            cache,
            progress: super::progress::on_stderr(std::io::IsTerminal::is_terminal(
                &std::io::stderr(),
            )),
            batch: self.batch,
            no_wait: self.no_wait,
            cluster,
        })
    }

    /// Runs the pipeline and prints its report.
    pub async fn run(self) -> Result<(), Failure> {
        let path = self.target.spec.path()?.to_path_buf();
        Ok(self.run_spec(&path).await?)
    }

    async fn run_spec(self, path: &std::path::Path) -> Result<(), Error> {
        let options = self.options()?;
        let (mut spec, ontology) = load(path)?;
        if let (Some(url), Some(s)) = (self.source, spec.source.as_mut()) {
            // Without a [source] table the run refuses with its own error.
            s.url = url;
        }
        let store = self.target.open(&spec)?;
        let report = graphloom::run::run(&spec, &ontology, &store, &options).await?;
        print_run(&spec, &store, &report);
        Ok(())
    }
}

/// " (N of them records mapped without an LLM)" when a mapping applied.
fn mapped_note(mapped: usize) -> String {
    if mapped == 0 {
        String::new()
    } else {
        format!(" ({mapped} of them records mapped without an LLM)")
    }
}

/// The report of a run, a dry run, or a batch-mode run waiting on batches.
fn print_run(spec: &PipelineSpec, store: &GraphStore, r: &RunReport) {
    if r.batch.as_ref().is_some_and(|b| b.waiting_on.is_some()) {
        print_waiting(store, r);
    } else if r.run.is_none() {
        print_dry_run(spec, store, r);
    } else {
        print_committed(store, r);
    }
}

/// A batch-mode run that stopped to wait for its batches.
fn print_waiting(store: &GraphStore, r: &RunReport) {
    let Some(b) = &r.batch else { return };
    let requests: usize = b.submitted.iter().flat_map(|(_, s)| s.values()).sum();
    out!(
        "batch mode on {}: round {} stopped at {}; submitted {} batch(es) with {} requests, {} batch(es) running",
        store.display_url(),
        b.rounds,
        b.waiting_on.map(|s| s.to_string()).unwrap_or_default(),
        b.submitted.len(),
        requests,
        b.running
    );
    for (id, stages) in &b.submitted {
        out!("  {id}: {}", graphloom::llm::batch::stages_text(stages));
    }
    out!(
        "nothing committed yet: run the same command again to collect the answers and go on (`graphloom status` lists the batches)"
    );
}

/// `--dry-run`: what the run would do and what it would cost.
fn print_dry_run(spec: &PipelineSpec, store: &GraphStore, r: &RunReport) {
    out!(
        "dry run for {}: {} episodes in the source, {} already in the graph, {} to process{}",
        store.display_url(),
        r.episodes_seen,
        r.episodes_skipped,
        r.episodes_planned,
        mapped_note(r.episodes_mapped)
    );
    if let Some(n) = r
        .failures_by_stage
        .get(Stage::Source.as_str())
        .filter(|n| **n > 0)
    {
        out!("{n} source item(s) could not be read and would be recorded in `failures`");
    }
    out!();
    out_raw!("{}", graphloom::llm::plan::render(&r.plan, &spec.llm));
    out_raw!(
        "{}",
        graphloom::llm::plan::render_batch(&r.plan, &spec.llm, r.batch_rounds)
    );
}

/// A committed run: episodes, graph changes, LLM use, failures, times.
fn print_committed(store: &GraphStore, r: &RunReport) {
    if let Some(b) = &r.batch {
        out!(
            "batch mode: {} round(s), {} batch(es) submitted by this run",
            b.rounds,
            b.submitted.len()
        );
    }
    out!(
        "run {} on {}: {} episodes in the source, {} already in the graph, {} processed{}, {} added",
        r.run.as_ref().map_or("", |x| x.run_id.as_str()),
        store.display_url(),
        r.episodes_seen,
        r.episodes_skipped,
        r.episodes_planned,
        mapped_note(r.episodes_mapped),
        r.episodes_added
    );
    print_graph_changes(r);
    print_llm_use(r);
    print_failures(r);
    print_timings(r);
}

/// The nodes and edges a run added or changed, and how it typed and
/// resolved mentions.
fn print_graph_changes(r: &RunReport) {
    out!(
        "graph: +{} nodes, {} existing nodes updated, +{} edges ({} duplicate facts merged, {} facts invalidated)",
        r.nodes_added,
        r.nodes_updated,
        r.edges_added,
        r.duplicate_facts,
        r.invalidated_facts
    );
    if r.retyped_mentions > 0 {
        out!(
            "records named the type of {} text mentions (resolve.record_types_win)",
            r.retyped_mentions
        );
    }
    if r.majority_retyped > 0 {
        out!(
            "other episodes named the type of {} text mentions (resolve.majority_types)",
            r.majority_retyped
        );
    }
    let fired: Vec<String> = r
        .cue_fires
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!("{name} {n}"))
        .collect();
    if !fired.is_empty() {
        out!("language cues fired: {}", fired.join(", "));
    }
    if !r.cues_off.is_empty() {
        out!("language cues off: {}", r.cues_off.join(", "));
    }
    if r.refined_by_relations > 0 {
        out!(
            "facts' relations named the subtype of {} text mentions",
            r.refined_by_relations
        );
    }
    if r.ambiguous_entities > 0 {
        out!(
            "resolution: {} ambiguous mentions, {} merged on adjudication, the rest kept separate",
            r.ambiguous_entities,
            r.adjudicated_merges
        );
    }
}

/// The LLM calls, tokens and cost, in all and per endpoint.
fn print_llm_use(r: &RunReport) {
    let calls: usize = r.calls_by_stage.values().sum();
    let stages: Vec<String> = r
        .calls_by_stage
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect();
    out!(
        "llm: {} calls ({} from cache; {}), {:.2} calls per episode, {} prompt + {} completion tokens{}",
        calls,
        r.cache_hits,
        if stages.is_empty() {
            "none".to_string()
        } else {
            stages.join(", ")
        },
        r.calls_per_episode(),
        r.prompt_tokens,
        r.completion_tokens,
        r.cost_usd.map(|c| format!(", ${c:.4}")).unwrap_or_default()
    );
    let (low, high, max) = r.in_flight;
    if calls > r.cache_hits && max > 0 {
        out!(
            "llm: {} calls in flight (llm.max_concurrency {max})",
            if low == high {
                low.to_string()
            } else {
                format!("{low} to {high}")
            }
        );
    }
    if !r.endpoints.is_empty() {
        out!("llm endpoints:");
        for e in &r.endpoints {
            out!(
                "  {}: {} calls ({} failed), {} prompt + {} completion tokens; {} attempts ({} failed), rested {} times",
                e.endpoint,
                e.calls,
                e.failed_calls,
                e.prompt_tokens,
                e.completion_tokens,
                e.attempts,
                e.failed_attempts,
                e.rests
            );
        }
    }
}

/// The failures by stage, with a few examples.
fn print_failures(r: &RunReport) {
    let failures: usize = r.failures_by_stage.values().sum();
    if failures == 0 {
        return;
    }
    let by: Vec<String> = r
        .failures_by_stage
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect();
    out!(
        "failures: {failures} ({}), recorded in `failures`; for example:",
        by.join(", ")
    );
    for f in r.failure_samples.iter().take(5) {
        out!("  [{}] {}: {}", f.stage, f.item, f.reason);
    }
}

/// The run's time in all and per stage (a stage's phases summed).
fn print_timings(r: &RunReport) {
    let stages: Vec<String> = r
        .timings
        .iter()
        .fold(Vec::<(Stage, f64)>::new(), |mut acc, (s, t)| {
            match acc.iter_mut().find(|(a, _)| *a == s) {
                Some((_, sum)) => *sum += t,
                None => acc.push((s, t)),
            }
            acc
        })
        .into_iter()
        .map(|(s, t)| format!("{s} {t:.1}"))
        .collect();
    out!("took {:.1} s ({})", r.seconds, stages.join(", "));
}
