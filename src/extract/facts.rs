//! The fact call of an episode, the checks of its reply, and the ends
//! an episode states that the model gave no fact for.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, NaiveDate, Utc};

use super::fit::{
    declared_spelling, fits_either_way, fitting_relation_in, misapplied, only_relation, refinable,
    relation_type_of, types_named, types_written,
};
use super::prompt::fact_request;
use super::record::RecordPlaces;
use super::reply::{FactOut, FactReply};
use super::times::{default_start, fact_times, on_day, written_time};
use super::when::resolve_when;
use super::{
    ExtractSpec, FACT_MAX_CHARS, FactMention, FactStart, GENERIC_RELATION, Mention, Prompts,
    Rejected, dropped,
};
use crate::cues::Switches;
use crate::cues::ends::stated_start;
use crate::cues::sentences::Sentences;
use crate::llm::{LlmClient, LlmError};
use crate::ontology::{Ontology, is_relation_type_name};
use crate::source::Episode;
use crate::stage::Stage;
use crate::text::normalize_name;

/// Extracts the facts of one episode between its mentions. An episode with
/// fewer than two mentions makes no call.
pub async fn extract_facts(
    client: &LlmClient,
    ontology: &Ontology,
    spec: &ExtractSpec,
    prompts: &Prompts,
    episode: &Episode,
    context: &[&Episode],
    mentions: &[Mention],
) -> Result<(Vec<FactMention>, Vec<Rejected>), LlmError> {
    if mentions.len() < 2 {
        return Ok((Vec::new(), Vec::new()));
    }
    let (request, schema) = fact_request(ontology, prompts, spec, episode, context, mentions);
    let reply = client
        .chat_json_with_schema::<FactReply>(request, schema)
        .await?;
    let mut facts = Vec::new();
    let mut rejected = dropped(Stage::ExtractFacts, episode, reply.dropped);
    let (facts_out, unshaped) = reply.value.facts.into_list();
    rejected.extend(dropped(Stage::ExtractFacts, episode, unshaped));
    let mut seen: BTreeMap<(usize, usize, String, String), ()> = BTreeMap::new();
    let reading = Reading::new(ontology, spec, &prompts.cues, episode, mentions);
    for f in facts_out {
        let reject = |reason: String| Rejected {
            stage: Stage::ExtractFacts,
            episode_id: episode.episode_id.clone(),
            reason,
            excerpt: format!(
                "{} -[{}]-> {}: {}",
                f.source, f.relation_type, f.target, f.fact
            ),
        };
        let (fact, notes) = match reading.fact(&f) {
            Ok(read) => read,
            Err(reason) => {
                rejected.push(reject(reason));
                continue;
            }
        };
        rejected.extend(notes.into_iter().map(reject));
        let key = (
            fact.source,
            fact.target,
            fact.chain.last().cloned().unwrap_or_default(),
            normalize_name(&fact.fact),
        );
        if seen.insert(key, ()).is_none() {
            facts.push(fact);
        }
    }
    if reading.record.is_none() {
        let ended = ended_pairs(
            ontology,
            spec,
            episode,
            mentions,
            &reading.sentences,
            &facts,
        );
        facts.extend(ended);
    }
    Ok((facts, rejected))
}

/// What a fact call's reply is read against: the episode's mentions, its
/// sentences, and for a record, where it holds each name.
struct Reading<'a> {
    ontology: &'a Ontology,
    spec: &'a ExtractSpec,
    episode: &'a Episode,
    mentions: &'a [Mention],
    /// Each mention's normalised name, with its index.
    by_name: HashMap<String, usize>,
    sentences: Sentences<'a>,
    /// Where a record holds each name; `None` for prose.
    record: Option<RecordPlaces>,
    /// Whether a pair must be stated by one sentence of the episode.
    judged: bool,
    /// The cues the run applies.
    cues: &'a Switches,
}

impl<'a> Reading<'a> {
    fn new(
        ontology: &'a Ontology,
        spec: &'a ExtractSpec,
        cues: &'a Switches,
        episode: &'a Episode,
        mentions: &'a [Mention],
    ) -> Self {
        let by_name: HashMap<String, usize> = mentions
            .iter()
            .enumerate()
            .map(|(i, m)| (normalize_name(&m.name), i))
            .collect();
        let sentences = sentences_of(&episode.content, mentions, cues);
        // Records are not prose: their fields are not sentences, and their
        // structure says which values belong together.
        let record = (episode.kind == crate::spec::EpisodeKind::Json)
            .then(|| RecordPlaces::new(&episode.content, mentions, cues));
        let judged = spec.require_stated_pair && record.is_none();
        Reading {
            ontology,
            spec,
            episode,
            mentions,
            by_name,
            sentences,
            record,
            judged,
            cues,
        }
    }

    /// The fact a reply's fact makes, with notes for the `failures` table
    /// (kept under another type than the one given, an end not taken); or
    /// why it is dropped.
    fn fact(&self, f: &FactOut) -> Result<(FactMention, Vec<String>), String> {
        let (s, t) = self.ends(f)?;
        let text = f.fact.trim();
        if text.is_empty() {
            return Err("empty fact text".into());
        }
        let (relation, s, t) = self.relation(&f.relation_type, s, t);
        let (st, tt) = (self.mentions[s].type_name(), self.mentions[t].type_name());
        let label = relation.replace('_', " ");
        let mut texts = vec![label.as_str(), text];
        texts.extend(self.sentences.about_pair(s, t));
        let written_types = types_written(self.ontology, &texts);
        let (relation, swap, kept_as) = self.fitted(f, &relation, &written_types, (st, tt))?;
        let (s, t) = if swap { (t, s) } else { (s, t) };
        let chain = self
            .ontology
            .edge_tree
            .chain(&relation)
            .unwrap_or_else(|| vec![relation.clone()]);
        let (end, end_note) = self.end(f);
        let times = self.times(f, end, &relation, (s, t), text);
        let fact = FactMention {
            episode_id: self.episode.episode_id.clone(),
            source: s,
            target: t,
            chain,
            fact: text.to_string(),
            valid_at: times.valid_at,
            invalid_at: times.invalid_at,
            mapped: false,
            written_types,
            start_stated: times.start_stated,
            moved: times.moved,
        };
        Ok((fact, kept_as.into_iter().chain(end_note).collect()))
    }

    /// The end a reply's fact states: the day its `ends` names
    /// ([`resolve_when`], against this episode's time only; none for
    /// `no`), or the date a server that ignores the schema wrote as
    /// `invalid_at`. A note says why a stated end is not taken.
    fn end(&self, f: &FactOut) -> (Option<DateTime<Utc>>, Option<String>) {
        let reference = self.episode.reference_time;
        let when = f.ends.as_deref().map(str::trim).unwrap_or_default();
        if when.is_empty() || when.eq_ignore_ascii_case("no") {
            return (written_time(f.invalid_at.as_deref(), reference), None);
        }
        match resolve_when(when, reference).map(|day| on_day(day, reference)) {
            Some(t) => (Some(t), None),
            None => match written_time(Some(when), reference) {
                Some(t) => (Some(t), None),
                None => (
                    None,
                    Some(format!("the end `{when}` names no day: end not taken")),
                ),
            },
        }
    }

    /// The mentions a fact names as its source and target, when they are
    /// two of the episode's that it states together.
    fn ends(&self, f: &FactOut) -> Result<(usize, usize), String> {
        let (Some(&s), Some(&t)) = (
            self.by_name.get(&normalize_name(&f.source)),
            self.by_name.get(&normalize_name(&f.target)),
        ) else {
            let missing = if self.by_name.contains_key(&normalize_name(&f.source)) {
                &f.target
            } else {
                &f.source
            };
            return Err(format!("`{missing}` is not in the episode's entity list"));
        };
        if s == t {
            return Err("a fact needs two distinct entities".into());
        }
        let names = (&self.mentions[s].name, &self.mentions[t].name);
        // Small models give a chat line's speaker, or an e-mail's
        // recipient, the company the line or the e-mail names ("Dana:
        // Legal sent over the new Acme contract" became "Dana works for
        // Acme").
        // Small models pair every vendor of a report's list with every
        // order in it ("Acme Corp is a party to PO-4614", a Brightline
        // order listed next to two of Acme's).
        if self.record.as_ref().is_some_and(|r| !r.pair_stated(s, t)) {
            return Err(format!(
                "the record never holds `{}` and `{}` in one object (values of two items of a list are not related): not stated, fact dropped",
                names.0, names.1
            ));
        }
        if self.judged && !self.sentences.pair_stated(s, t) {
            return Err(format!(
                "no sentence of the episode names both `{}` and `{}` (a chat speaker or an e-mail header does not count; a writer's \"I\" does): not stated, fact dropped",
                names.0, names.1
            ));
        }
        Ok((s, t))
    }

    /// The relation type a model wrote as `written`, in SCREAMING_SNAKE_CASE
    /// and as the declared type it spells, with the ends `s` and `t` turned
    /// round when it spells that type in the other voice.
    fn relation(&self, written: &str, s: usize, t: usize) -> (String, usize, usize) {
        let mut relation = relation_type_of(written);
        if relation.is_empty() || !is_relation_type_name(&relation) {
            relation = GENERIC_RELATION.into();
        }
        match declared_spelling(self.ontology, &relation, self.cues) {
            Some((declared, turned)) => {
                if turned {
                    (declared, t, s)
                } else {
                    (declared, s, t)
                }
            }
            None => (relation, s, t),
        }
    }

    /// The type a fact of `relation` between ends of `types` is stored
    /// under ([`fitting_relation_in`]), whether its ends are swapped, and
    /// a note when that is not `relation`; why not, when none fits or the
    /// type is misapplied.
    fn fitted(
        &self,
        f: &FactOut,
        relation: &str,
        written_types: &[String],
        (st, tt): (&str, &str),
    ) -> Result<(String, bool, Option<String>), String> {
        let ontology = self.ontology;
        // Kept as given when a refinement of an end lets it fit; the
        // refinement, or the fall back when none holds, comes after the
        // edge walk.
        if let Some(swap) = refinable(ontology, relation, st, tt) {
            return Ok((relation.to_string(), swap, None));
        }
        let Some((fitted, swap)) = fitting_relation_in(ontology, relation, written_types, st, tt)
        else {
            return Err(format!(
                "`{relation}` does not allow {st} → {tt}, and neither does {GENERIC_RELATION}; fact dropped"
            ));
        };
        if misapplied(ontology, relation, &fitted) {
            let pairs = if st == tt {
                format!("{st} → {tt}")
            } else {
                format!("{st} → {tt} or {tt} → {st}")
            };
            return Err(format!(
                "`{relation}` (written `{}`) does not allow {pairs}, and no parent type does: a misapplied type, fact dropped",
                f.relation_type.trim()
            ));
        }
        let mut kept_as = None;
        if fitted != relation {
            // Kept, under a parent type that allows its endpoints or the
            // type the episode writes; the row says what the model wrote.
            let why = if ontology.edge_types.contains_key(relation) {
                format!("`{relation}` does not allow {st} → {tt}")
            } else {
                format!("`{relation}` is no declared type")
            };
            let how =
                if written_types.contains(&fitted) && !ontology.edge_tree.is_a(relation, &fitted) {
                    ", which the episode writes"
                } else {
                    ""
                };
            kept_as = Some(format!("{why}; kept as {fitted}{how}"));
        }
        Ok((fitted, swap, kept_as))
    }

    /// The times of a fact of `relation` from `s` to `t` with sentence
    /// `text`, and whether its start is stated and it is a move.
    fn times(
        &self,
        f: &FactOut,
        end: Option<DateTime<Utc>>,
        relation: &str,
        (s, t): (usize, usize),
        text: &str,
    ) -> Times {
        let spec = self.spec;
        let sentences = &self.sentences;
        let reference = self.episode.reference_time;
        let today = reference.date_naive();
        // A move starts the fact on its day ("moves to Skylark on 1 July").
        // A relation no declared type names says too little to end others.
        let move_at = self
            .ontology
            .edge_types
            .contains_key(relation)
            .then(|| sentences.moved_to(s, t))
            .flatten();
        let move_day = move_at
            .and_then(|k| sentences.day_of(k, today))
            .map(|d| on_day(d, reference));
        let stated = match spec.fact_start {
            FactStart::Model => written_time(f.valid_at.as_deref(), reference),
            FactStart::Text => self
                .cues
                .gives("stated_start", || stated_start(text, today))
                .or_else(|| sentences.pair_start(s, t, today))
                .map(|d| on_day(d, reference)),
        }
        .or(move_day);
        let (mut valid_at, invalid_at) = fact_times(
            stated,
            end,
            text,
            self.cues,
            || sentences.pair_end(s, t, reference),
            reference,
        );
        let start_stated = valid_at.is_some();
        let moved = move_at.is_some();
        if spec.fact_start == FactStart::Text && valid_at.is_none() {
            valid_at = default_start(invalid_at, reference);
        }
        Times {
            valid_at,
            invalid_at,
            start_stated,
            moved,
        }
    }
}

/// A fact's times as [`Reading::times`] reads them.
struct Times {
    valid_at: Option<DateTime<Utc>>,
    invalid_at: Option<DateTime<Utc>>,
    start_stated: bool,
    moved: bool,
}

/// An end an episode states of two mentions: the two, the day, the
/// sentence, and the relation it ends with whether it runs from the second
/// to the first (none when no one relation is told).
type StatedEnd<'t> = (usize, usize, NaiveDate, &'t str, Option<(String, bool)>);

/// Facts of the relationships an episode says have ended ("We will keep
/// accepting messages from your Notification Hub until 23:59 UTC on that
/// day", written by Relaywave) between two of its mentions that the
/// model gave no fact for ([`Sentences::stated_pair_ends`]). The fact is
/// the sentence, under the one declared type the two entities' types can
/// be related by ([`only_relation`]; no fact where two could be), with
/// the day as its end. A hand-over ([`Sentences::handed_over`]) states
/// such an end for the giver and what it hands over, of the one type of
/// relation the sentence names in words ([`types_named`]). Resolution
/// then ends the live edge of that type between the two, or of a narrower
/// type, as for any fact with an end;
/// where there is none, the graph keeps that the relationship held until
/// then. A small model leaves such a sentence out: the end of a supply or
/// a shift is written of the relationship, not as a fact about it.
pub(super) fn ended_pairs(
    ontology: &Ontology,
    spec: &ExtractSpec,
    episode: &Episode,
    mentions: &[Mention],
    sentences: &Sentences<'_>,
    facts: &[FactMention],
) -> Vec<FactMention> {
    let reference = episode.reference_time;
    let related = |a: usize, b: usize| {
        facts
            .iter()
            .any(|f| (f.source, f.target) == (a, b) || (f.source, f.target) == (b, a))
    };
    let today = reference.date_naive();
    // Each stated end with the relation it is of: the only one the two
    // types can be related by.
    let mut stated: Vec<StatedEnd<'_>> = sentences
        .stated_pair_ends(today)
        .into_iter()
        .map(|(a, b, day, text)| {
            let relation =
                only_relation(ontology, mentions[a].type_name(), mentions[b].type_name());
            (a, b, day, text, relation)
        })
        .collect();
    // A hand-over ends the giver's relationship with what is handed over
    // ("Sofia takes over my Harbour Gateway on-call shifts from that day",
    // written by Tomás), which the model may state for the taker alone.
    // What is handed over must be a relation the sentence names ("on-call"
    // for ON_CALL_FOR): "takes over my Acme account" does not end the
    // giver's employment at Acme.
    for giver in 0..mentions.len() {
        for thing in (0..mentions.len()).filter(|&t| t != giver) {
            let pair = (giver.min(thing), giver.max(thing));
            if stated
                .iter()
                .any(|&(x, y, ..)| (x.min(y), x.max(y)) == pair)
            {
                continue;
            }
            let Some((k, day)) = sentences.handover(giver, thing, today) else {
                continue;
            };
            let text = sentences.text(k);
            let (tg, tt) = (mentions[giver].type_name(), mentions[thing].type_name());
            let named: Vec<(String, bool)> = types_named(ontology, text, sentences.cues())
                .iter()
                .filter_map(|r| fits_either_way(ontology, r, tg, tt))
                .collect();
            if let [(relation, turned)] = named.as_slice() {
                stated.push((giver, thing, day, text, Some((relation.clone(), *turned))));
            }
        }
    }
    let mut out = Vec::new();
    for (a, b, day, text, relation) in stated {
        let (ta, tb) = (&mentions[a].chain, &mentions[b].chain);
        if related(a, b) || ta.is_empty() || tb.is_empty() {
            continue;
        }
        let Some((relation, turned)) = relation else {
            continue;
        };
        let (source, target) = if turned { (b, a) } else { (a, b) };
        let invalid_at = Some(on_day(day, reference));
        let valid_at = match spec.fact_start {
            FactStart::Text => default_start(invalid_at, reference),
            FactStart::Model => None,
        };
        out.push(FactMention {
            episode_id: episode.episode_id.clone(),
            source,
            target,
            chain: ontology
                .edge_tree
                .chain(&relation)
                .unwrap_or_else(|| vec![relation.clone()]),
            fact: text
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .chars()
                .take(FACT_MAX_CHARS)
                .collect(),
            valid_at,
            invalid_at,
            mapped: false,
            written_types: Vec::new(),
            start_stated: false,
            moved: false,
        });
    }
    out
}

/// The sentences of `content` ([`Sentences`]), read for the names of
/// `mentions`.
pub(super) fn sentences_of<'a>(
    content: &'a str,
    mentions: &[Mention],
    cues: &Switches,
) -> Sentences<'a> {
    let names: Vec<&str> = mentions.iter().map(|m| m.name.as_str()).collect();
    Sentences::with_cues(content, &names, cues)
}
