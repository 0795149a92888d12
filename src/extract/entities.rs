//! The entity call of an episode and the checks of its reply.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::evidence::{Evidence, context_in, typed_attributes};
use super::names::NameChecks;
use super::reply::{EntityOut, EntityReply};
use super::types::TypeWords;
use super::{ExtractSpec, Mention, Prompts, Rejected, dropped};
use crate::cues::Switches;
use crate::cues::names::shares_a_word;
use crate::llm::{LlmClient, LlmError};
use crate::ontology::{ENTITY_LABEL, Ontology};
use crate::source::Episode;
use crate::stage::Stage;
use crate::text::normalize_name;

/// Extracts the entities of one episode. Returns its mentions (top-level
/// types only) and what was dropped.
pub async fn extract_entities(
    client: &LlmClient,
    ontology: &Ontology,
    spec: &ExtractSpec,
    prompts: &Prompts,
    episode: &Episode,
    context: &[&Episode],
) -> Result<(Vec<Mention>, Vec<Rejected>), LlmError> {
    let request = prompts.entity_request(spec, episode, context);
    // The model sees the episode and its context as the request shows them.
    let evidence = Evidence::of(request.messages.last().map_or("", |m| m.content.as_str()));
    // The request carries `extract.call_budget_secs`, counted from its
    // first send ([`crate::llm::concurrency::CallClock`]).
    let reply = client
        .chat_json_with_schema_ref::<EntityReply>(request, prompts.entity_schema())
        .await?;
    let rejected = dropped(Stage::ExtractEntities, episode, reply.dropped);
    let context_shown = context_shown(spec, context);
    let shown = shown(episode, &context_shown, &prompts.cues);
    let shown_forms = shown_forms(episode, &context_shown);
    let source_only = source_only(episode);
    let checks = NameChecks {
        spec,
        prompts,
        content: &episode.content,
        shown: &shown,
        shown_forms: &shown_forms,
        source_only: source_only.as_deref(),
    };
    let mut found = Found::new(
        ontology,
        spec,
        &prompts.type_words,
        &prompts.cues,
        episode,
        rejected,
    );
    for e in reply.value.entities {
        found.offer(&checks, &evidence, e);
    }
    found.add_introduced_codes(&checks);
    found.take_misplaced_identity_values();
    Ok((found.mentions, found.rejected))
}

/// The texts of `context` the model was shown, each cut as the prompt
/// cuts it: a name it lifted from the context is judged by how the
/// context writes it.
fn context_shown(spec: &ExtractSpec, context: &[&Episode]) -> Vec<String> {
    context
        .iter()
        .map(|c| c.content.chars().take(spec.context_chars).collect())
        .collect()
}

/// The episode, then its context as shown, split into words once: every
/// name offered is checked against them.
fn shown<'a>(
    episode: &'a Episode,
    context_shown: &'a [String],
    cues: &crate::cues::Switches,
) -> Vec<crate::cues::words::Written<'a>> {
    std::iter::once(episode.content.as_str())
        .chain(context_shown.iter().map(String::as_str))
        .map(|text| crate::cues::words::Written::with_cues(text, cues))
        .collect()
}

/// The episode, its context as shown and its source description, each
/// in [`crate::text::grounding_form`], for [`NameChecks::not_a_name`].
fn shown_forms(episode: &Episode, context_shown: &[String]) -> Vec<String> {
    std::iter::once(episode.content.as_str())
        .chain(context_shown.iter().map(String::as_str))
        .chain(episode.source_description.as_deref())
        .map(crate::text::grounding_form)
        .collect()
}

/// Where the episode comes from ("engineering mailbox", "#ops chat"),
/// normalised, unless the episode itself writes it as a name.
fn source_only(episode: &Episode) -> Option<String> {
    episode
        .source_description
        .as_deref()
        .map(normalize_name)
        .filter(|d| !d.is_empty() && !normalize_name(&episode.content).contains(d.as_str()))
}

/// A name as a model offered it, cleaned: without quotes around it, with
/// a code as the episode writes it, and without a count in front of it, a
/// price in brackets after it or an affiliation after it ("Oskar from
/// Pellucid"), none of which is part of it.
fn cleaned_name(offered: &str, content: &str, cues: &Switches) -> String {
    let name = offered
        .trim()
        .trim_matches(|c: char| c == '"' || c == '\'')
        .trim()
        .to_string();
    let name = crate::text::as_written(&name, content);
    let name = cut(
        cues,
        "without_price",
        &name,
        crate::cues::prices::without_price,
    );
    let name = cut(
        cues,
        "without_count",
        name,
        crate::cues::prices::without_count,
    );
    cut(
        cues,
        "without_affiliation",
        name,
        crate::cues::people::without_affiliation,
    )
    .to_string()
}

/// `name` as the cue `cue` shortens it, when it is on; a shortening
/// counts as its firing.
fn cut<'n>(cues: &Switches, cue: &str, name: &'n str, rule: fn(&str) -> &str) -> &'n str {
    let mut out = name;
    cues.fires(cue, || {
        out = rule(name);
        out.len() != name.len()
    });
    out
}

/// The mentions an entity call's reply makes, as they are found, and what
/// was dropped on the way.
struct Found<'a> {
    ontology: &'a Ontology,
    spec: &'a ExtractSpec,
    type_words: &'a TypeWords,
    cues: &'a Switches,
    episode: &'a Episode,
    /// The episode's content in lower case.
    lower: String,
    /// The episode's content as characters, for each mention's context.
    chars: Vec<char>,
    mentions: Vec<Mention>,
    rejected: Vec<Rejected>,
    /// Each mention's normalised name, with its index.
    seen: HashMap<String, usize>,
}

impl<'a> Found<'a> {
    fn new(
        ontology: &'a Ontology,
        spec: &'a ExtractSpec,
        type_words: &'a TypeWords,
        cues: &'a Switches,
        episode: &'a Episode,
        rejected: Vec<Rejected>,
    ) -> Self {
        Found {
            ontology,
            spec,
            type_words,
            cues,
            episode,
            lower: episode.content.to_lowercase(),
            chars: episode.content.chars().collect(),
            mentions: Vec::new(),
            rejected,
            seen: HashMap::new(),
        }
    }

    /// The name an entity is kept under and the type chain its words give
    /// it. A type's words in front of a code type the entity, whatever type
    /// the model chose ("order form AOF-2024-031" listed as a Product). So
    /// do a type's words the episode writes in front of a code the model
    /// listed alone ("signing order form QF-0087").
    fn named(&self, offered: &str) -> (String, Option<Vec<String>>) {
        let name = cleaned_name(offered, &self.episode.content, self.cues);
        let tree = &self.ontology.entity_tree;
        match self.type_words.type_and_code(&name) {
            Some((kind, code)) => (code.to_string(), tree.chain(kind)),
            None if crate::text::is_code(&name) => {
                let kind = self.type_words.written_before(&name, &self.episode.content);
                let chain = kind.and_then(|k| tree.chain(k));
                (name, chain)
            }
            None => (name, None),
        }
    }

    /// The type chain of an entity the model typed `kind`, whose words
    /// name `named_type`; with the reason, when the model's type is no
    /// top-level type, that it is kept as the generic type.
    fn chain(&self, kind: &str, named_type: Option<Vec<String>>) -> (Vec<String>, Option<String>) {
        let tree = &self.ontology.entity_tree;
        // The model's type stands only when it is the named type or below it.
        let named_type =
            named_type.filter(|chain| !chain.last().is_some_and(|t| tree.is_a(kind, t)));
        match (named_type, tree.get(kind)) {
            (Some(named), _) => (named, None),
            (None, Some(node)) if node.parent.is_none() => (vec![kind.to_string()], None),
            _ if kind == ENTITY_LABEL => (Vec::new(), None),
            _ => (
                Vec::new(),
                Some(format!(
                    "unknown top-level type `{kind}`; kept as {ENTITY_LABEL}"
                )),
            ),
        }
    }

    /// Takes one entity of the reply as a mention, or says why not.
    fn offer(&mut self, checks: &NameChecks<'_>, evidence: &Evidence, e: EntityOut) {
        let (name, named_type) = self.named(&e.name);
        let normalized = normalize_name(&name);
        let episode = self.episode;
        let reject = |reason: String| Rejected {
            stage: Stage::ExtractEntities,
            episode_id: episode.episode_id.clone(),
            reason,
            excerpt: format!("{} ({})", e.name, e.kind),
        };
        if let Some(reason) = checks.not_a_name(&name, &normalized, &e.kind) {
            self.rejected.push(reject(reason));
            return;
        }
        let (chain, unknown) = self.chain(&e.kind, named_type);
        self.rejected.extend(unknown.map(reject));
        if chain.is_empty() && self.ontology.strict {
            self.rejected.push(reject(format!(
                "`{name}` fits no declared type and ontology.strict is set"
            )));
            return;
        }
        // Exact duplicates within one episode collapse into the first.
        if let Some(i) = self.seen.get(&normalized) {
            let first = &mut self.mentions[*i];
            if first.chain.is_empty() && !chain.is_empty() {
                first.chain = chain;
            }
            return;
        }
        if self.mentions.len() >= self.spec.max_entities_per_episode {
            self.rejected.push(reject(format!(
                "more than {} entities in one episode",
                self.spec.max_entities_per_episode
            )));
            return;
        }
        let (attributes, ungrounded) = chain
            .last()
            .and_then(|t| self.ontology.entity_types.get(t))
            .map(|t| typed_attributes(&self.spec.properties.of(t), &e.attributes.pairs(), evidence))
            .unwrap_or_default();
        self.rejected
            .extend(ungrounded.into_iter().map(|reason| Rejected {
                stage: Stage::ExtractEntities,
                episode_id: episode.episode_id.clone(),
                reason,
                excerpt: name.clone(),
            }));
        self.push(normalized, name, chain, attributes);
    }

    /// Adds a mention of `name` (`normalized`) to the episode's.
    fn push(
        &mut self,
        normalized: String,
        name: String,
        chain: Vec<String>,
        attributes: Map<String, Value>,
    ) {
        self.seen.insert(normalized, self.mentions.len());
        self.mentions.push(Mention {
            episode_id: self.episode.episode_id.clone(),
            context: context_in(&self.chars, &self.lower, &name, 160),
            name,
            chain,
            attributes,
            mapped: false,
        });
    }

    /// A code the episode introduces with a type's words is an entity of
    /// that type, listed or not: small models leave out the code a
    /// document is about when it heads the text ("ORDER FORM
    /// AOF-2024-031. Seller: Acme Corp. …"), and with it every fact about
    /// it.
    fn add_introduced_codes(&mut self, checks: &NameChecks<'_>) {
        for (code, kind) in self.type_words.introduced_codes(&self.episode.content) {
            let normalized = normalize_name(code);
            let chain = self.ontology.entity_tree.chain(kind).unwrap_or_default();
            if self.seen.contains_key(&normalized)
                || chain.is_empty()
                || self.mentions.len() >= self.spec.max_entities_per_episode
                || checks.not_a_name(code, &normalized, kind).is_some()
            {
                continue;
            }
            self.push(normalized, code.to_string(), chain, Map::new());
        }
    }

    /// Takes identity values off the mentions they were not written for
    /// ([`misplaced_identity_values`]), each with a rejection.
    fn take_misplaced_identity_values(&mut self) {
        for (i, reason) in
            misplaced_identity_values(self.ontology, &self.lower, &mut self.mentions, self.cues)
        {
            self.rejected.push(Rejected {
                stage: Stage::ExtractEntities,
                episode_id: self.episode.episode_id.clone(),
                reason,
                excerpt: self.mentions[i].name.clone(),
            });
        }
    }
}

/// Takes identity values off the mentions they were not written for: an
/// e-mail address or a code in the episode (`lower`: its content in lower
/// case) belongs to the mention whose
/// name is written nearest to it ("From: Priya Raman <priya@…> To: Dana
/// Whitcombe <dana@…>"). A small model copies a neighbour's address
/// onto an entity, and an identity value shared by two names would merge
/// two people. A value is kept when one of its occurrences is nearest to
/// the mention's own name (ties included), when the episode does not write
/// it standing alone (it came from a context episode, or it is a domain
/// inside an address), or when the mention's name is not written as
/// given (nothing to measure from). Returns the mention and
/// the reason of every value taken off.
pub(super) fn misplaced_identity_values(
    ontology: &Ontology,
    lower: &str,
    mentions: &mut [Mention],
    cues: &Switches,
) -> Vec<(usize, String)> {
    let spots_of = |needle: &str| -> Vec<usize> {
        if needle.is_empty() {
            return Vec::new();
        }
        lower.match_indices(needle).map(|(at, _)| at).collect()
    };
    // Where each mention's name is written: (start, end, mention).
    let mut names: Vec<(usize, usize, usize)> = Vec::new();
    for (i, m) in mentions.iter().enumerate() {
        let name = m.name.to_lowercase();
        names.extend(
            spots_of(&name)
                .into_iter()
                .map(|at| (at, at + name.len(), i)),
        );
    }
    let gap = |(start, end): (usize, usize), (a, b): (usize, usize)| {
        // Zero when the two overlap.
        start.saturating_sub(b).max(a.saturating_sub(end))
    };
    let mut taken: Vec<(usize, String, String)> = Vec::new();
    for i in 0..mentions.len() {
        if !names.iter().any(|n| n.2 == i) {
            continue;
        }
        let Some(t) = ontology.entity_types.get(mentions[i].type_name()) else {
            continue;
        };
        for property in &t.identity_properties {
            let Some(Value::String(value)) = mentions[i].attributes.get(property) else {
                continue;
            };
            let needle = value.trim().to_lowercase();
            // Only where the value stands alone: a domain inside an
            // e-mail address ("dana@northwind.example") says nothing
            // about which name it belongs to.
            let part_of_token =
                |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || "@._-%+/".contains(c));
            let spots: Vec<usize> = spots_of(&needle)
                .into_iter()
                .filter(|&at| {
                    !part_of_token(lower[..at].chars().next_back())
                        && !part_of_token(lower[at + needle.len()..].chars().next())
                })
                .collect();
            if spots.is_empty() {
                continue;
            }
            let mut nearest_other: Option<usize> = None;
            let owned = spots.iter().any(|&at| {
                let at = (at, at + needle.len());
                // The value written as the name itself (a ticket named by
                // its number) is the mention's own.
                if names.iter().any(|n| n.2 == i && n.0 < at.1 && at.0 < n.1) {
                    return true;
                }
                // A name inside the value itself ("Tidewell" in
                // grace@tidewell.io) does not count as next to it.
                let around: Vec<(usize, usize)> = names
                    .iter()
                    .filter(|n| n.1 <= at.0 || n.0 >= at.1)
                    .map(|n| (gap(at, (n.0, n.1)), n.2))
                    .collect();
                let best = around.iter().map(|a| a.0).min();
                let mine = around.iter().filter(|a| a.1 == i).map(|a| a.0).min();
                // A nearest name sharing a word with the mention's own
                // ("D. Whitcombe", "Dana Whitcombe") may be the same
                // entity: resolution decides.
                let kin = around.iter().filter(|a| Some(a.0) == best).any(|a| {
                    cues.fires("shared_long_word", || {
                        shares_a_word(&mentions[a.1].name, &mentions[i].name)
                    })
                });
                if best.is_none() || (mine.is_some() && mine == best) || kin {
                    return true;
                }
                nearest_other = around.iter().find(|a| Some(a.0) == best).map(|a| a.1);
                false
            });
            if !owned {
                let other = nearest_other.map_or("another entity", |o| mentions[o].name.as_str());
                let reason = format!(
                    "`{property}` = `{value}` is written next to `{other}`, not `{}`; not stored",
                    mentions[i].name
                );
                taken.push((i, property.clone(), reason));
            }
        }
    }
    taken
        .into_iter()
        .map(|(i, property, reason)| {
            mentions[i].attributes.remove(&property);
            (i, reason)
        })
        .collect()
}
