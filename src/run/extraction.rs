//! The LLM half of a run: entity extraction, the entity subtype walk, fact
//! extraction and the edge subtype walk over the episodes a run took on,
//! and what it leaves for resolution.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use rayon::prelude::*;

use super::{Progress, Tick};
use crate::extract::{self, ExtractSpec, FactMention, Mention, Rejected, Withdrawal};
use crate::llm::{LlmClient, LlmError};
use crate::mapping::{Mapped, Mappings};
use crate::ontology::Ontology;
use crate::resolve::record_types;
use crate::resolve::stage::{RunFact, RunMention, RunWithdrawal};
use crate::rows::FailureRow;
use crate::source::Episode;
use crate::spec::ResolveSpec;
use crate::stage::Stage;

/// The episodes of each document (by group), in archive order, so that an
/// episode's context is found without scanning the archive before it.
pub(super) struct Documents<'a> {
    all: &'a [Episode],
    positions: HashMap<(&'a str, &'a str), Vec<usize>>,
}

impl<'a> Documents<'a> {
    pub(super) fn new(all: &'a [Episode]) -> Self {
        let mut positions: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
        for (i, e) in all.iter().enumerate() {
            if let Some(doc) = &e.document_id {
                positions
                    .entry((e.group_id.as_str(), doc.as_str()))
                    .or_default()
                    .push(i);
            }
        }
        Documents { all, positions }
    }

    /// Episode `index` and its context, owned (for a task of its own).
    fn owned(&self, index: usize, n: usize) -> (Episode, Vec<Episode>) {
        let context = self.context_for(index, n).into_iter().cloned().collect();
        (self.all[index].clone(), context)
    }

    /// Up to `n` earlier episodes of the same document, most recent last.
    pub(super) fn context_for(&self, index: usize, n: usize) -> Vec<&'a Episode> {
        let ep = &self.all[index];
        let Some(doc) = &ep.document_id else {
            return Vec::new();
        };
        let Some(list) = self.positions.get(&(ep.group_id.as_str(), doc.as_str())) else {
            return Vec::new();
        };
        let end = list.partition_point(|&p| p < index);
        list[end.saturating_sub(n)..end]
            .iter()
            .map(|&p| &self.all[p])
            .collect()
    }
}

/// What resolution takes from extraction.
pub(super) struct ForResolution<'a> {
    pub(super) mentions: Vec<RunMention<'a>>,
    pub(super) facts: Vec<RunFact<'a>>,
    pub(super) withdrawals: Vec<RunWithdrawal<'a>>,
}

/// What the extraction tasks of a run share.
struct Shared {
    ontology: Ontology,
    spec: ExtractSpec,
    prompts: extract::Prompts,
}

/// The extraction state of a run: mentions and facts by episode, and what
/// failed. Episodes are indices into the run's loaded episodes.
pub(super) struct Extraction<'a> {
    all: &'a [Episode],
    documents: Documents<'a>,
    client: Arc<LlmClient>,
    shared: Arc<Shared>,
    concurrency: usize,
    progress: &'a Progress,
    /// Every extracted mention, episode by episode.
    mentions: Vec<Mention>,
    /// An episode's mentions: `mentions[a..b]`.
    mention_range: HashMap<usize, (usize, usize)>,
    /// Every extracted fact, in episode order.
    facts: Vec<FactMention>,
    /// The episode of each fact.
    fact_owner: Vec<usize>,
    /// Every end stated for all relationships of a type an entity has,
    /// with its episode.
    withdrawals: Vec<(usize, Withdrawal)>,
    /// Episodes whose entity or fact call failed, or whose record could not
    /// be mapped, with the stage and the reason.
    failed: HashMap<usize, (Stage, String)>,
    /// What the mappings made of mapped records, joined to the mentions
    /// and facts after the subtype walks (a mapped type is the user's
    /// choice, never refined by the model).
    mapped: Vec<(usize, Mapped)>,
    /// Items the checks turned down (their episodes still count).
    rejected: Vec<Rejected>,
}

impl<'a> Extraction<'a> {
    pub(super) fn new(
        all: &'a [Episode],
        ontology: &Ontology,
        spec: &ExtractSpec,
        client: Arc<LlmClient>,
        concurrency: usize,
        progress: &'a Progress,
    ) -> Self {
        // Each episode's calls run as a task of their own, so that building
        // prompts, hashing cache keys and parsing replies use every core (a
        // replay from the cache is nothing but that work).
        let shared = Arc::new(Shared {
            ontology: ontology.clone(),
            spec: spec.clone(),
            prompts: extract::Prompts::new(ontology, spec),
        });
        Extraction {
            all,
            documents: Documents::new(all),
            client,
            shared,
            concurrency,
            progress,
            mentions: Vec::new(),
            mention_range: HashMap::new(),
            facts: Vec::new(),
            fact_owner: Vec::new(),
            withdrawals: Vec::new(),
            failed: HashMap::new(),
            mapped: Vec::new(),
            rejected: Vec::new(),
        }
    }

    /// Runs `call` for each of `episodes` as tasks, `concurrency` at a
    /// time, longest prompt first ([`Extraction::longest_first`]), and
    /// reports progress as they finish. Every call opens with the same
    /// system prompt, declared to the client as shared
    /// ([`LlmClient::share_prefix`]: with `llm.warm_prefix` a warm-up call
    /// leads the burst).
    ///
    /// No more episodes than the client has calls in flight: a call's time
    /// budget (`extract.call_budget_secs`) runs from its first poll, so an
    /// episode queued behind the client's own in-flight limit spent its
    /// budget waiting (with four slots of a local server, a long fact reply
    /// queued behind four others ran past 300 s).
    async fn per_episode<T, Fut>(
        &self,
        phase: Stage,
        episodes: &[usize],
        call: impl Fn(usize) -> Fut,
    ) -> HashMap<usize, Result<T, LlmError>>
    where
        Fut: Future<Output = Result<T, LlmError>>,
    {
        if episodes.len() > 1 {
            // Both calls of an episode open with the same system prompt.
            self.client
                .share_prefix(&self.shared.prompts.system_message());
        }
        let mut stream = futures::stream::iter(self.longest_first(phase, episodes))
            .map(|i| {
                let reply = call(i);
                async move { (i, reply.await) }
            })
            .buffer_unordered(self.concurrency);
        let mut out = HashMap::new();
        let mut failures = self.failed.len();
        self.tick(phase, 0, episodes.len(), failures);
        while let Some((i, r)) = stream.next().await {
            failures += usize::from(r.is_err());
            out.insert(i, r);
            self.tick(phase, out.len(), episodes.len(), failures);
        }
        out
    }

    /// `episodes` in the order their calls go out: the longest prompt
    /// first (the episode and the context shown with it; for a fact call,
    /// its entities too), in archive order among equals. A stage lasts
    /// until its last reply, and reply length grows with the prompt (a
    /// correlation of 0.46–0.66 over the example corpora's calls), so the
    /// long calls start while every slot is busy and the short ones fill
    /// the end: replayed through a model of the server's speed by busy
    /// slots, the two stages take 4–7% less time than in archive order.
    /// The order of replies has no effect on what a run builds.
    fn longest_first(&self, phase: Stage, episodes: &[usize]) -> Vec<usize> {
        let n = self.shared.spec.context_episodes;
        let shown = self.shared.spec.context_chars;
        let size = |i: usize| -> usize {
            let context: usize = self
                .documents
                .context_for(i, n)
                .iter()
                .map(|c| c.content.chars().take(shown).count())
                .sum();
            let entities: usize = match (phase, self.mention_range.get(&i)) {
                (Stage::ExtractFacts, Some(&(a, b))) => self.mentions[a..b]
                    .iter()
                    .map(|m| m.name.chars().count() + m.type_name().len() + 8)
                    .sum(),
                _ => 0,
            };
            self.all[i].content.chars().count() + context + entities
        };
        let mut order: Vec<(usize, usize)> = episodes.iter().map(|&i| (size(i), i)).collect();
        // Stable: equal sizes keep archive order.
        order.sort_by_key(|&(len, _)| std::cmp::Reverse(len));
        order.into_iter().map(|(_, i)| i).collect()
    }

    fn tick(&self, phase: Stage, done: usize, total: usize, failures: usize) {
        let (calls, tokens) = self.client.progress();
        self.progress.report(&Tick {
            phase,
            done,
            total,
            calls,
            tokens,
            failures,
        });
    }

    /// Maps the records of `todo` that a mapping applies to, and returns
    /// the rest: the episodes for the LLM. A record that cannot be mapped
    /// fails (it is not extracted by the LLM instead: its mapping says
    /// what it holds).
    pub(super) fn map_records(&mut self, todo: &[usize], mappings: &Mappings) -> Vec<usize> {
        if mappings.is_empty() {
            return todo.to_vec();
        }
        self.tick(Stage::MapRecords, 0, todo.len(), self.failed.len());
        // Records map independently: rayon spreads them over the cores (a
        // backfill of ERP exports is millions of them). Nothing else of
        // this run is under way yet, so holding this task is harmless.
        let (all, ontology) = (self.all, &self.shared.ontology);
        let results: Vec<(usize, Option<Result<Mapped, String>>)> = todo
            .par_iter()
            .map(|&i| {
                let episode = &all[i];
                let outcome = mappings
                    .find(episode)
                    .map(|(m, record)| m.apply(ontology, episode, &record));
                (i, outcome)
            })
            .collect();
        let mut to_extract = Vec::new();
        for (i, outcome) in results {
            match outcome {
                None => to_extract.push(i),
                Some(Ok(mapped)) => self.mapped.push((i, mapped)),
                Some(Err(reason)) => {
                    self.failed.insert(i, (Stage::MapRecords, reason));
                }
            }
        }
        let done = todo.len() - to_extract.len();
        self.tick(Stage::MapRecords, done, todo.len(), self.failed.len());
        to_extract
    }

    /// Joins what the mappings made to the extracted mentions and facts.
    pub(super) fn join_mapped(&mut self) {
        for (i, mapped) in std::mem::take(&mut self.mapped) {
            let start = self.mentions.len();
            self.mentions.extend(mapped.mentions);
            self.mention_range.insert(i, (start, self.mentions.len()));
            self.fact_owner
                .extend(std::iter::repeat_n(i, mapped.facts.len()));
            self.facts.extend(mapped.facts);
            self.withdrawals
                .extend(mapped.withdrawals.into_iter().map(|w| (i, w)));
            self.rejected.extend(mapped.rejected);
        }
    }

    /// One entity call per episode in `todo`. An episode whose call fails
    /// is done for this run.
    pub(super) async fn entities(&mut self, todo: &[usize]) {
        let n = self.shared.spec.context_episodes;
        let mut replies = self
            .per_episode(Stage::ExtractEntities, todo, |i| {
                let (client, shared) = (self.client.clone(), self.shared.clone());
                let (episode, context) = self.documents.owned(i, n);
                crate::llm::in_task(async move {
                    let context: Vec<&Episode> = context.iter().collect();
                    let s = &*shared;
                    extract::extract_entities(
                        &client,
                        &s.ontology,
                        &s.spec,
                        &s.prompts,
                        &episode,
                        &context,
                    )
                    .await
                })
            })
            .await;
        for &i in todo {
            match replies.remove(&i) {
                Some(Ok((found, rejected))) => {
                    self.rejected.extend(rejected);
                    let start = self.mentions.len();
                    self.mentions.extend(found);
                    self.mention_range.insert(i, (start, self.mentions.len()));
                }
                Some(Err(e)) => {
                    self.failed
                        .insert(i, (Stage::ExtractEntities, e.to_string()));
                }
                None => {}
            }
        }
    }

    /// The entity subtype walk, batched across episodes.
    pub(super) async fn classify_entities(&mut self) {
        let s = &*self.shared;
        let (walk, rejected) = crate::classify::walk_entities(
            &self.client,
            &s.ontology,
            &s.spec,
            self.concurrency,
            &mut self.mentions,
        )
        .await;
        tracing::info!(
            "entity subtype walk: {} calls, {} entities refined",
            walk.calls,
            walk.refined
        );
        self.rejected.extend(rejected);
    }

    /// Records name types (`resolve.record_types_win`): a text mention
    /// named exactly as a record's entity (mapped by this run, or a
    /// committed node of origin `map`) but typed incompatibly takes the
    /// record's chain, and drops its properties (of the other type). Then
    /// most episodes do (`resolve.majority_types`): a text mention whose
    /// name the run's other mentions and the committed nodes mostly give
    /// another top-level type takes it. This runs before the fact calls,
    /// so that a fact call offers the relation types the entity's type
    /// allows: typed as a Company, the team "Platform Reliability" could
    /// only be WORKS_FOR's target, and nobody's MEMBER_OF. Returns how
    /// many mentions took a record's type, and how many the majority's.
    pub(super) async fn take_named_types(
        &mut self,
        ctx: &SessionContext,
        spec: &ResolveSpec,
    ) -> Result<(usize, usize), DataFusionError> {
        // Records of this run or committed ones may type any text mention:
        // only a run without text mentions has nothing to do.
        if !(spec.record_types_win || spec.majority_types) || self.mentions.is_empty() {
            return Ok((0, 0));
        }
        let mut group_of = vec![""; self.mentions.len()];
        for (&i, &(a, b)) in &self.mention_range {
            group_of[a..b].fill(self.all[i].group_id.as_str());
        }
        let (evidence, records) = {
            let run = self.run_mentions(&group_of);
            let evidence = record_types::TypeEvidence::read(ctx, "nodes", spec, &run).await?;
            let records = if spec.record_types_win {
                record_types::record_chains(&run, &evidence)
            } else {
                vec![None; run.len()]
            };
            log_retyped("records", &run, &records);
            (evidence, records)
        };
        let by_records = self.retype(records);
        let by_majority = if spec.majority_types {
            let run = self.run_mentions(&group_of);
            let majority = record_types::majority_chains(&run, &evidence);
            log_retyped("other episodes", &run, &majority);
            drop(run);
            self.retype(majority)
        } else {
            0
        };
        Ok((by_records, by_majority))
    }

    /// The run's mentions with their groups: text mentions first, in
    /// `self.mentions` order (`group_of` gives theirs), then the records'.
    fn run_mentions<'s>(&'s self, group_of: &[&'s str]) -> Vec<RunMention<'s>> {
        let mut run: Vec<RunMention> = self
            .mentions
            .iter()
            .zip(group_of)
            .map(|(mention, group_id)| RunMention { group_id, mention })
            .collect();
        for (i, mapped) in &self.mapped {
            let group_id = self.all[*i].group_id.as_str();
            run.extend(
                mapped
                    .mentions
                    .iter()
                    .map(|mention| RunMention { group_id, mention }),
            );
        }
        run
    }

    /// Gives each text mention the chain `chains` holds for it (in
    /// [`Self::run_mentions`] order), dropping its properties, which
    /// belong to its old type. Returns how many changed.
    fn retype(&mut self, chains: Vec<Option<Vec<String>>>) -> usize {
        let mut n = 0;
        for (m, chain) in self.mentions.iter_mut().zip(chains) {
            if let Some(chain) = chain {
                m.chain = chain;
                m.attributes.clear();
                n += 1;
            }
        }
        n
    }

    /// One fact call per episode with entities.
    pub(super) async fn facts(&mut self, todo: &[usize]) {
        let with_entities: Vec<usize> = todo
            .iter()
            .copied()
            .filter(|i| self.mention_range.contains_key(i))
            .collect();
        let n = self.shared.spec.context_episodes;
        let mut replies = self
            .per_episode(Stage::ExtractFacts, &with_entities, |i| {
                let (client, shared) = (self.client.clone(), self.shared.clone());
                let (a, b) = self.mention_range[&i];
                let own: Vec<Mention> = self.mentions[a..b].to_vec();
                let (episode, context) = self.documents.owned(i, n);
                crate::llm::in_task(async move {
                    let context: Vec<&Episode> = context.iter().collect();
                    let s = &*shared;
                    extract::extract_facts(
                        &client,
                        &s.ontology,
                        &s.spec,
                        &s.prompts,
                        &episode,
                        &context,
                        &own,
                    )
                    .await
                })
            })
            .await;
        // Facts in episode order, not in the order replies arrived: the edge
        // walk batches them by position, and its requests (hence cache keys)
        // must be the same on every run over the same episodes.
        for &i in &with_entities {
            match replies.remove(&i) {
                Some(Ok((found, rejected))) => {
                    self.rejected.extend(rejected);
                    self.fact_owner.extend(std::iter::repeat_n(i, found.len()));
                    self.facts.extend(found);
                }
                Some(Err(e)) => {
                    self.failed.insert(i, (Stage::ExtractFacts, e.to_string()));
                }
                None => {}
            }
        }
    }

    /// The edge subtype walk; a fact's endpoints are typed by its
    /// episode's mentions.
    /// Nothing to do when the fact call chose among every declared edge
    /// type (`extract.fold_edge_subtypes`).
    pub(super) async fn classify_facts(&mut self) {
        if self.shared.spec.fold_edge_subtypes {
            return;
        }
        let index_of: HashMap<&str, usize> = self
            .all
            .iter()
            .enumerate()
            .map(|(i, e)| (e.episode_id.as_str(), i))
            .collect();
        let (mentions, mention_range) = (&self.mentions, &self.mention_range);
        let endpoint_types = |f: &FactMention| -> (String, String) {
            let Some(&i) = index_of.get(f.episode_id.as_str()) else {
                return ("Entity".into(), "Entity".into());
            };
            let (a, _) = mention_range.get(&i).copied().unwrap_or((0, 0));
            (
                mentions[a + f.source].type_name().to_string(),
                mentions[a + f.target].type_name().to_string(),
            )
        };
        let s = &*self.shared;
        let (walk, rejected) = crate::classify::walk_facts(
            &self.client,
            &s.ontology,
            &s.spec,
            self.concurrency,
            &mut self.facts,
            &endpoint_types,
        )
        .await;
        tracing::info!(
            "edge subtype walk: {} calls, {} facts refined",
            walk.calls,
            walk.refined
        );
        self.rejected.extend(rejected);
    }

    /// How often each cue that was on fired over this run's calls, and
    /// which were off.
    pub(super) fn cue_counts(&self) -> (Vec<(String, u64)>, Vec<String>) {
        let (fired, off) = self.shared.prompts.cues.counts();
        (
            fired.into_iter().map(|(n, k)| (n.to_string(), k)).collect(),
            off.into_iter().map(String::from).collect(),
        )
    }

    /// Relations refine types, one episode at a time
    /// ([`crate::classify::refine_by_relations`]): after both walks, since
    /// the fact call and the edge walk are what state the relations.
    pub(super) fn refine_types(&mut self) -> crate::classify::Refined {
        let mut total = crate::classify::Refined::default();
        // Facts are in episode order: each episode's are one run of
        // `fact_owner`, refined as one group.
        let owners = std::mem::take(&mut self.fact_owner);
        let mut facts = std::mem::take(&mut self.facts).into_iter();
        for run in owners.chunk_by(|a, b| a == b) {
            let owner = run[0];
            let mut group: Vec<FactMention> = facts.by_ref().take(run.len()).collect();
            // Facts come only from episodes with mentions.
            if let Some(&(a, b)) = self.mention_range.get(&owner) {
                let (counts, rejected) = crate::classify::refine_by_relations(
                    &self.shared.ontology,
                    &self.shared.spec,
                    &mut self.mentions[a..b],
                    &mut group,
                );
                total.mentions += counts.mentions;
                total.refit += counts.refit;
                total.dropped += counts.dropped;
                self.rejected.extend(rejected);
            }
            self.fact_owner
                .extend(std::iter::repeat_n(owner, group.len()));
            self.facts.extend(group);
        }
        tracing::info!(
            "relations refined {} entities; {} facts kept under another type, {} dropped",
            total.mentions,
            total.refit,
            total.dropped
        );
        total
    }

    /// Identity values that JSON records state for their mentions
    /// ([`extract::stated_identities`]), once the types are final: a
    /// record's `package_id` beside its `name` is that entity's, so a
    /// mention elsewhere named by the value resolves to it.
    pub(super) fn stated_identities(&mut self) {
        let ontology = &self.shared.ontology;
        let identity_of = |t: &str| {
            ontology
                .entity_types
                .get(t)
                .map(|t| t.identity_properties.clone())
                .unwrap_or_default()
        };
        let mut added = 0;
        for (&episode, &(a, b)) in &self.mention_range {
            let mentions = &mut self.mentions[a..b];
            let found =
                extract::stated_identities(&self.all[episode].content, mentions, identity_of);
            added += found.len();
            for (i, property, value) in found {
                mentions[i].attributes.insert(property, value);
            }
        }
        if added > 0 {
            tracing::info!("records stated {added} identity values of their mentions");
        }
    }

    /// The episodes of `todo` whose calls all succeeded: they are committed.
    /// An episode with a failed call has its output dropped and is retried
    /// by the next run.
    pub(super) fn succeeded(&self, todo: &[usize]) -> Vec<usize> {
        todo.iter()
            .copied()
            .filter(|i| !self.failed.contains_key(i))
            .collect()
    }

    /// The mentions, facts and withdrawals of the `succeeded` episodes,
    /// for resolution (a fact's endpoints and a withdrawal's entity become
    /// indices into the mentions).
    pub(super) fn for_resolution(&self, succeeded: &[usize]) -> ForResolution<'_> {
        let mut mentions: Vec<RunMention> = Vec::new();
        let mut index_of_mention: HashMap<usize, usize> = HashMap::new();
        for &i in succeeded {
            let Some(&(a, b)) = self.mention_range.get(&i) else {
                continue;
            };
            for (k, m) in self.mentions[a..b].iter().enumerate() {
                index_of_mention.insert(a + k, mentions.len());
                mentions.push(RunMention {
                    group_id: &self.all[i].group_id,
                    mention: m,
                });
            }
        }
        let mut facts: Vec<RunFact> = Vec::new();
        for (f, owner) in self.facts.iter().zip(&self.fact_owner) {
            let Some(&(a, _)) = self.mention_range.get(owner) else {
                continue;
            };
            if let (Some(&source), Some(&target)) = (
                index_of_mention.get(&(a + f.source)),
                index_of_mention.get(&(a + f.target)),
            ) {
                facts.push(RunFact {
                    source,
                    target,
                    fact: f,
                    episode_time: self.all[*owner].reference_time,
                });
            }
        }
        let withdrawals = self
            .withdrawals
            .iter()
            .filter_map(|(owner, w)| {
                let &(a, _) = self.mention_range.get(owner)?;
                Some(RunWithdrawal {
                    subject: *index_of_mention.get(&(a + w.subject))?,
                    withdrawal: w,
                })
            })
            .collect();
        ForResolution {
            mentions,
            facts,
            withdrawals,
        }
    }

    /// A `failures` row for every failed episode and rejected item.
    pub(super) fn failures(&self, run_id: &str, now: DateTime<Utc>) -> Vec<FailureRow> {
        let by_id: HashMap<&str, &Episode> = self
            .all
            .iter()
            .map(|e| (e.episode_id.as_str(), e))
            .collect();
        let failed = self.failed.iter().map(|(&i, (stage, e))| {
            let ep = &self.all[i];
            FailureRow::new(run_id, *stage, ep.source_uri.clone(), e.to_string(), now)
                .at(ep.source_uri.clone(), None)
                .of_episode(ep.episode_id.clone())
                .excerpt(&ep.content)
        });
        let rejected = self.rejected.iter().map(|r| {
            let ep = by_id.get(r.episode_id.as_str());
            let item = ep.map_or_else(|| r.episode_id.clone(), |e| e.source_uri.clone());
            let row = FailureRow::new(run_id, r.stage, item, r.reason.clone(), now)
                .of_episode(r.episode_id.clone())
                .excerpt(&r.excerpt);
            match ep {
                Some(e) => row.at(e.source_uri.clone(), None),
                None => row,
            }
        });
        failed.chain(rejected).collect()
    }
}

/// Logs how many of the run's mentions `who` retyped, and from which type
/// to which.
fn log_retyped(who: &str, run: &[RunMention<'_>], chains: &[Option<Vec<String>>]) {
    if chains.iter().any(Option::is_some) {
        tracing::info!(
            "{who} named the type of {} text mentions: {:?}",
            chains.iter().flatten().count(),
            record_types::summary(run, chains)
        );
    }
}
