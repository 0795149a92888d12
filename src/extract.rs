//! Extraction: one LLM call per episode for its entities (name, top-level
//! type, that type's properties) and one for the facts between them
//! (relation type, fact text, valid_at / invalid_at resolved against the
//! episode's reference time). Subtypes are chosen later, in batches
//! ([`crate::classify`]).
//!
//! Prompts are graphloom's own and hold no examples: examples in a prompt
//! leak into small models' answers. Allowed type names and, for facts, the
//! episode's entity names are enums in the reply schema, so a
//! schema-constrained decoder cannot invent them; replies are still checked.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, NaiveTime, Utc};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::llm::{ChatRequest, LlmClient, LlmError, Message};
use crate::ontology::{
    ENTITY_LABEL, EdgeTypeSpec, Ontology, PropertySpec, PropertyType, is_relation_type_name,
};
use crate::source::Episode;
use crate::stage::Stage;
use crate::text::normalize_name;
use crate::values::{
    coerce_text, parse_time, refers_back, stated_end, stated_end_after, stated_start,
};

pub use crate::spec::extract::{AskedProperties, ExtractSpec, FactStart};

/// Version of the extraction prompts; part of the cache key.
pub const PROMPT_VERSION: &str = "extract-v3";

/// One entity found in one episode.
#[derive(Debug, Clone, PartialEq)]
pub struct Mention {
    /// Episode it was found in.
    pub episode_id: String,
    /// Name as written.
    pub name: String,
    /// Type chain, top-level first; empty for the generic `Entity`.
    pub chain: Vec<String>,
    /// Properties of the last type in the chain.
    pub attributes: Map<String, Value>,
    /// The part of the episode around the name, for classification.
    pub context: String,
    /// Made by a `[[mapping]]` from a record, not read from text by the
    /// model: its type is the record's, and text mentions of the same name
    /// take it (`resolve.record_types_win`).
    pub mapped: bool,
}

impl Mention {
    /// The last type of the chain, or `Entity`.
    pub fn type_name(&self) -> &str {
        self.chain.last().map_or(ENTITY_LABEL, String::as_str)
    }
}

/// One fact found in one episode, between two of its mentions.
#[derive(Debug, Clone, PartialEq)]
pub struct FactMention {
    /// Episode it was found in.
    pub episode_id: String,
    /// Index of the source mention in the episode's mentions.
    pub source: usize,
    /// Index of the target mention.
    pub target: usize,
    /// Relation type chain (declared types) or a single derived type.
    pub chain: Vec<String>,
    /// Paraphrased fact.
    pub fact: String,
    /// When the fact started to hold.
    pub valid_at: Option<DateTime<Utc>>,
    /// When it stopped holding.
    pub invalid_at: Option<DateTime<Utc>>,
    /// Made by a `[[mapping]]` from a record (stored with origin `map`),
    /// not read from text by the model.
    pub mapped: bool,
    /// The declared relation types that the model's relation, the fact's
    /// text or its episode's sentences about the pair write in words
    /// ([`types_written`]), whatever the endpoints' types: where a record
    /// later retypes an end and the type given no longer fits, one of these
    /// may ([`fitting_relation_in`]).
    pub written_types: Vec<String>,
    /// Whether `valid_at` is a start the text or the model stated, not the
    /// episode's time taken for want of one: only a stated start marks a
    /// change that may end an older fact (resolution's contradiction
    /// judge is asked about no other).
    pub start_stated: bool,
    /// Whether the episode says the source moved to the target ("Notification
    /// Hub moves to Skylark on 1 July"): the source's earlier relationships
    /// of this family with other things of the target's type end when
    /// this one starts, without asking the LLM.
    pub moved: bool,
}

impl FactMention {
    /// The relation type stored on the edge: the last type of the chain.
    pub fn relation_type(&self) -> &str {
        self.chain.last().map_or(GENERIC_RELATION, String::as_str)
    }
}

/// An end an episode states for every relationship of one type that one
/// of its entities has as source, with no other end named: a leaver
/// record's last day ends the person's on-call shifts (`[[mapping.ends]]`).
/// Resolution ends the entity's live facts of that type and its subtypes
/// that started before `at`, whichever episodes of the run stated them,
/// and its committed ones.
#[derive(Debug, Clone, PartialEq)]
pub struct Withdrawal {
    /// Index of the entity's mention in the episode's mentions.
    pub subject: usize,
    /// The declared edge type whose facts end, with its subtypes'.
    pub relation_type: String,
    /// When they end.
    pub at: DateTime<Utc>,
}

/// Something an extraction dropped, for a `failures` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Stage that dropped it.
    pub stage: Stage,
    /// Episode concerned.
    pub episode_id: String,
    /// Why.
    pub reason: String,
    /// What the model wrote.
    pub excerpt: String,
}

#[derive(Debug, Deserialize)]
struct EntityReply {
    entities: Vec<EntityOut>,
}

#[derive(Debug, Deserialize)]
struct EntityOut {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    attributes: AttributesOut,
}

/// Attributes as the entity and walk schemas ask for them (an object of
/// property values), or as a list of name/value pairs from a server that
/// ignores the schema and follows an older prompt.
#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
pub enum AttributesOut {
    /// None given.
    #[default]
    None,
    /// Property name → value.
    Object(Map<String, Value>),
    /// Name/value pairs.
    List(Vec<AttributeOut>),
}

impl AttributesOut {
    /// The values as name/value pairs; a non-text value as its JSON text.
    pub fn pairs(self) -> Vec<AttributeOut> {
        match self {
            AttributesOut::None => Vec::new(),
            AttributesOut::List(list) => list,
            AttributesOut::Object(map) => map
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(name, v)| AttributeOut {
                    value: match v {
                        Value::String(s) => s,
                        other => other.to_string(),
                    },
                    name,
                })
                .collect(),
        }
    }
}

/// A property value as a model writes it.
#[derive(Debug, Clone, Deserialize)]
pub struct AttributeOut {
    /// Property name.
    pub name: String,
    /// Value as text.
    pub value: String,
}

#[derive(Debug, Deserialize)]
struct FactReply {
    facts: FactsOut,
}

/// Facts as one list, or grouped under their source's name
/// (`extract.facts_by_source`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FactsOut {
    List(Vec<FactOut>),
    BySource(Map<String, Value>),
}

/// A fact of a reply grouped by source.
#[derive(Debug, Deserialize)]
struct SourcedFactOut {
    target: String,
    relation_type: String,
    fact: String,
    valid_at: Option<String>,
    invalid_at: Option<String>,
}

impl FactsOut {
    /// Every fact with its source; a grouped fact that does not have the
    /// shape of one is left out with a note.
    fn into_list(self) -> (Vec<FactOut>, Vec<String>) {
        match self {
            FactsOut::List(list) => (list, Vec::new()),
            FactsOut::BySource(map) => {
                let (mut out, mut notes) = (Vec::new(), Vec::new());
                for (source, facts) in map {
                    let items = match facts {
                        Value::Array(items) => items,
                        other => vec![other],
                    };
                    for item in items {
                        match serde_json::from_value::<SourcedFactOut>(item) {
                            Ok(f) => out.push(FactOut {
                                source: source.clone(),
                                target: f.target,
                                relation_type: f.relation_type,
                                fact: f.fact,
                                valid_at: f.valid_at,
                                invalid_at: f.invalid_at,
                            }),
                            Err(e) => notes.push(format!("a fact of `{source}` dropped: {e}")),
                        }
                    }
                }
                (out, notes)
            }
        }
    }
}

#[derive(Debug, Deserialize)]
struct FactOut {
    source: String,
    target: String,
    relation_type: String,
    fact: String,
    valid_at: Option<String>,
    invalid_at: Option<String>,
}

/// Describes types for a prompt: name, description and properties.
pub fn describe_type(name: &str, description: &str, properties: &[PropertySpec]) -> String {
    let mut out = format!("- {name}: {}", description.trim());
    if !properties.is_empty() {
        let props: Vec<String> = properties
            .iter()
            .map(|p| {
                if p.description.is_empty() {
                    format!("{} ({})", p.name, p.kind)
                } else {
                    format!("{} ({}): {}", p.name, p.kind, p.description.trim())
                }
            })
            .collect();
        let _ = write!(out, "\n  properties: {}", props.join("; "));
    }
    out
}

/// One line describing an edge type for a prompt: its name, the
/// source → target pairs it allows (if restricted) and its description.
pub fn describe_edge_type(name: &str, t: &EdgeTypeSpec) -> String {
    let pairs: Vec<String> = t
        .source_targets
        .iter()
        .map(|p| format!("{} → {}", p.source, p.target))
        .collect();
    let allowed = if pairs.is_empty() {
        String::new()
    } else {
        format!(" ({})", pairs.join(", "))
    };
    format!("- {name}{allowed}: {}", t.description.trim())
}

/// What a model saw, for grounding the property values it writes: a value
/// it could not have read there was made up (small models invent e-mail
/// addresses and domains), and a made-up identity value would keep one
/// entity's mentions apart.
#[derive(Debug, Clone)]
pub struct Evidence {
    words: String,
    lower: String,
    numbers: Vec<f64>,
}

impl Evidence {
    /// The evidence of `text`.
    pub fn of(text: &str) -> Self {
        Evidence {
            words: crate::text::grounding_form(text),
            lower: text.to_lowercase(),
            numbers: crate::text::numbers_in(text),
        }
    }

    /// Whether `value` is written in the evidence as it is, ignoring
    /// case: a value of a patterned property (a code, an e-mail address,
    /// a domain) is copied, so "delaware.corporation" is not grounded by
    /// "a Delaware corporation" the way a phrase would be.
    pub fn holds_verbatim(&self, value: &str) -> bool {
        let v = value.trim().to_lowercase();
        v.is_empty() || self.lower.contains(&v)
    }

    /// Whether `value`, of `kind`, is written in the evidence: a text as
    /// whole words after [`crate::text::grounding_form`] on both sides, a
    /// number as a number of equal value. Dates and booleans are not
    /// checked (a model resolves "next Monday" or reads "yes" off the
    /// wording, which no spelling check can follow).
    pub fn holds(&self, kind: PropertyType, value: &Value) -> bool {
        match (kind, value) {
            (PropertyType::Text, Value::String(v)) => {
                let form = crate::text::grounding_form(v);
                form.trim().is_empty() || self.words.contains(&form)
            }
            (PropertyType::Int | PropertyType::Float, v) => v.as_f64().is_none_or(|x| {
                self.numbers
                    .iter()
                    .any(|n| (n - x).abs() <= 1e-9 * x.abs().max(1.0))
            }),
            _ => true,
        }
    }
}

/// Keeps the attributes a model gave that are properties of `properties`,
/// coerced to their kind and written in `evidence`; the rest are dropped.
/// Returns a note for each value dropped for not being in the evidence or
/// not matching the property's pattern (other drops, unknown properties
/// or uncoercible values, are silent).
pub fn typed_attributes(
    properties: &[PropertySpec],
    given: &[AttributeOut],
    evidence: &Evidence,
) -> (Map<String, Value>, Vec<String>) {
    let mut out = Map::new();
    let mut ungrounded = Vec::new();
    for a in given {
        let Some(p) = properties.iter().find(|p| p.name == a.name) else {
            continue;
        };
        let Some(v) = coerce_text(p.kind, &a.value) else {
            continue;
        };
        if let (Some(pattern), Value::String(text)) = (&p.pattern, &v)
            && !crate::text::Pattern::matches(pattern, text)
        {
            let shown: String = text.chars().take(80).collect();
            ungrounded.push(format!(
                "`{}` = `{shown}` does not have the property's shape ({pattern}); not stored",
                p.name
            ));
            continue;
        }
        let verbatim = match (&p.pattern, &v) {
            (Some(_), Value::String(text)) => evidence.holds_verbatim(text),
            _ => true,
        };
        if !verbatim || !evidence.holds(p.kind, &v) {
            let shown: String = a.value.trim().chars().take(80).collect();
            ungrounded.push(format!(
                "`{}` = `{shown}` is not written in the text; not stored",
                p.name
            ));
            continue;
        }
        out.entry(p.name.clone()).or_insert(v);
    }
    (out, ungrounded)
}

/// The part of `content` around the first occurrence of `name` (case
/// insensitive), about `width` characters on each side.
pub fn context_of(content: &str, name: &str, width: usize) -> String {
    let lower = content.to_lowercase();
    let chars: Vec<char> = content.chars().collect();
    context_in(&chars, &lower, name, width)
}

/// [`context_of`] with the content's characters and its lower case
/// computed once for all the names of an episode.
fn context_in(chars: &[char], lower: &str, name: &str, width: usize) -> String {
    let at = lower
        .find(&name.to_lowercase())
        .map(|byte| lower[..byte].chars().count())
        .unwrap_or(0);
    let start = at.saturating_sub(width);
    let end = (at + name.chars().count() + width).min(chars.len());
    let mut s: String = chars[start..end].iter().collect();
    s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if start > 0 {
        s.insert_str(0, "… ");
    }
    if end < chars.len() {
        s.push_str(" …");
    }
    s
}

fn episode_block(episode: &Episode, context: &[&Episode], context_chars: usize) -> String {
    let mut out = String::new();
    if !context.is_empty() {
        out.push_str("<PREVIOUS EPISODES>\n");
        for c in context {
            let text: String = c.content.chars().take(context_chars).collect();
            let _ = writeln!(
                out,
                "[{}] {}",
                c.reference_time.format("%Y-%m-%dT%H:%M:%SZ"),
                text.trim()
            );
        }
        out.push_str("</PREVIOUS EPISODES>\n\n");
    }
    let _ = writeln!(
        out,
        "<CURRENT EPISODE kind=\"{}\"{}>\n{}\n</CURRENT EPISODE>",
        episode.kind.as_str(),
        episode
            .source_description
            .as_deref()
            .map(|d| format!(" source=\"{d}\""))
            .unwrap_or_default(),
        episode.content.trim()
    );
    let _ = write!(
        out,
        "\nREFERENCE TIME (when the current episode was written): {}",
        episode.reference_time.format("%Y-%m-%dT%H:%M:%SZ")
    );
    out
}

fn custom(spec: &ExtractSpec) -> String {
    if spec.custom_instructions.trim().is_empty() {
        String::new()
    } else {
        format!(
            "\n\nAdditional instructions:\n{}",
            spec.custom_instructions.trim()
        )
    }
}

/// The parts of the extraction prompts that depend only on the ontology
/// and the spec, built once per run instead of per call.
///
/// Both calls of an episode send the same system prompt (the ontology)
/// and the episode next, and only then their task: a server that caches
/// prompt prefixes (llama.cpp's `cache_prompt`) reads the ontology once
/// per slot and the episode once for both calls.
#[derive(Debug, Clone)]
pub struct Prompts {
    system: String,
    entity_task: String,
    entity_schema: Value,
    fact_task: String,
    fact_task_by_source: String,
    type_words: TypeWords,
    /// The words the ontology's type descriptions write in lower case
    /// ("customer", "supplier", "employee"): roles and kinds, not names.
    role_words: HashSet<String>,
    /// The entity types of people, subtypes included ([`person_types`]).
    person_types: HashSet<String>,
}

impl Prompts {
    /// The prompts of `ontology` under `spec`.
    pub fn new(ontology: &Ontology, spec: &ExtractSpec) -> Self {
        Prompts {
            system: system_prompt(ontology, spec),
            entity_task: entity_task(spec),
            entity_schema: entity_schema(ontology, spec),
            fact_task: fact_task(ontology, spec, false),
            fact_task_by_source: fact_task(ontology, spec, true),
            type_words: TypeWords::new(ontology),
            role_words: role_words(ontology),
            person_types: person_types(ontology),
        }
    }

    /// The system message that opens both calls of every episode.
    pub fn system_message(&self) -> Message {
        Message::system(self.system.clone())
    }

    /// The request of an entity call; its schema is [`Prompts::entity_schema`].
    pub fn entity_request(
        &self,
        spec: &ExtractSpec,
        episode: &Episode,
        context: &[&Episode],
    ) -> ChatRequest {
        let user = format!(
            "{}\n\n{}",
            episode_block(episode, context, spec.context_chars),
            self.entity_task
        );
        ChatRequest {
            stage: Stage::ExtractEntities,
            item: Some(episode.episode_id.clone()),
            messages: vec![Message::system(self.system.clone()), Message::user(user)],
            max_tokens: entity_reply_bound(spec, episode),
            prompt_version: PROMPT_VERSION.into(),
        }
    }

    /// The reply schema of every entity call.
    pub fn entity_schema(&self) -> &Value {
        &self.entity_schema
    }
}

/// The lower-case words of the ontology's type descriptions ("A business
/// organisation such as a customer, a supplier or a reseller"): a
/// one-word name among them is a role or a kind, however a contract
/// capitalises it as a defined term ("the Customer"). Capitalised words
/// of a description (an example name) are not taken.
fn role_words(ontology: &Ontology) -> HashSet<String> {
    let descriptions = ontology
        .entity_types
        .values()
        .map(|t| t.description.as_str())
        .chain(ontology.edge_types.values().map(|t| t.description.as_str()));
    let mut out = HashSet::new();
    for d in descriptions {
        for w in crate::text::words(d) {
            if w.chars().all(|c| c.is_lowercase()) {
                out.insert(w.to_string());
            }
        }
    }
    out
}

/// The entity types whose entities are people: a type named as people
/// are (`Person`, `Employee`, `Contact`, …) or whose description's first
/// sentence says "person", "individual" or "human", and every subtype of
/// one. A job title offered as one of them is a role, not a person
/// ([`crate::text::job_title`]).
fn person_types(ontology: &Ontology) -> HashSet<String> {
    const NAMES: [&str; 7] = [
        "person",
        "people",
        "employee",
        "contact",
        "individual",
        "human",
        "staff",
    ];
    const WORDS: [&str; 4] = ["person", "individual", "human", "people"];
    let people = |name: &str, description: &str| {
        let first = description.split(['.', ';']).next().unwrap_or_default();
        NAMES.contains(&name.to_lowercase().as_str())
            || crate::text::words(first).any(|w| WORDS.contains(&w.to_lowercase().as_str()))
    };
    let roots: Vec<&String> = ontology
        .entity_types
        .iter()
        .filter(|(name, t)| people(name, &t.description))
        .map(|(name, _)| name)
        .collect();
    ontology
        .entity_types
        .keys()
        .filter(|t| roots.iter().any(|r| ontology.entity_tree.is_a(t, r)))
        .cloned()
        .collect()
}

/// Whether `name` is one word (after a leading "the") that the type
/// descriptions write in lower case.
fn is_role_word(role_words: &HashSet<String>, name: &str) -> bool {
    let words: Vec<String> = crate::text::words(name).map(str::to_lowercase).collect();
    let words = match words.split_first() {
        Some((first, rest)) if first == "the" => rest,
        _ => &words[..],
    };
    matches!(words, [one] if role_words.contains(one))
}

/// A name as a type word: folded, without spaces, so that "Order Form"
/// and "purchase order" are recognised as the types `OrderForm` and
/// `PurchaseOrder`, not names of entities.
fn type_word(name: &str) -> String {
    normalize_name(name).replace(' ', "")
}

/// The names of an ontology's entity types as a model may write them as
/// entity names: each as a [`type_word`] ("Order Form" for `OrderForm`),
/// each acronym type (`MSA`, `SLA`: a name in capitals) by the initials
/// of the words that spell it out ("Master Services Agreement"), and each
/// type of two or more words by its initials in capitals ("PO" for
/// `PurchaseOrder`).
#[derive(Debug, Clone)]
struct TypeWords {
    /// Every entity type name as a [`type_word`], with the name.
    words: Vec<(String, String)>,
    /// The acronym type names, in lower case.
    acronyms: Vec<String>,
    /// The initials of the type names of two or more words, in capitals.
    initials: Vec<String>,
}

impl TypeWords {
    fn new(ontology: &Ontology) -> Self {
        let names = ontology.entity_types.keys();
        let initials = names
            .clone()
            .filter_map(|k| {
                let capitals: String = k.chars().filter(char::is_ascii_uppercase).collect();
                let camel = capitals.len() >= 2
                    && k.starts_with(|c: char| c.is_ascii_uppercase())
                    && k.chars().any(|c| c.is_ascii_lowercase());
                camel.then_some(capitals)
            })
            .collect();
        TypeWords {
            words: names.clone().map(|k| (type_word(k), k.clone())).collect(),
            acronyms: names
                .filter(|k| k.len() >= 2 && k.chars().all(|c| c.is_ascii_uppercase()))
                .map(|k| k.to_ascii_lowercase())
                .collect(),
            initials,
        }
    }

    /// The type and the code of a name written as a type's words followed
    /// by one code ("order form AOF-2024-031", "Purchase Order PO-4471"):
    /// the words say what the entity is, and the code alone is its name,
    /// the way other episodes and records write it.
    fn type_and_code<'a>(&self, name: &'a str) -> Option<(&str, &'a str)> {
        let (words, code) = name.trim().rsplit_once(char::is_whitespace)?;
        let code = code.trim_matches(|c: char| !c.is_alphanumeric());
        if !crate::text::is_code(code) {
            return None;
        }
        Some((self.type_named(words)?, code))
    }

    /// The type whose words the text writes right before the code `code`
    /// ("Thank you for signing order form QF-0087", "ORDER FORM QF-0087."),
    /// when every such place writes the same type; `None` when none does
    /// or two disagree. The model may list the code alone under another
    /// type, and a code so typed twice becomes two entities that never
    /// merge.
    fn written_before<'t>(&'t self, code: &str, text: &str) -> Option<&'t str> {
        let mut found: Option<&str> = None;
        for at in crate::text::standing_alone(text, code) {
            // The type's words end right before the code: one to three
            // words, with nothing but spaces between them and it.
            let before = &text[..at];
            if !before.ends_with(' ') {
                continue;
            }
            let mut last: Vec<&str> = crate::text::words(before).rev().take(3).collect();
            last.reverse();
            let kind =
                (1..=last.len()).find_map(|n| self.type_named(&last[last.len() - n..].join(" ")));
            match (found, kind) {
                (_, None) => {}
                (None, Some(k)) => found = Some(k),
                (Some(f), Some(k)) if f == k => {}
                (Some(_), Some(_)) => return None,
            }
        }
        found
    }

    /// The codes `text` writes right after a type's words, each once with
    /// that type ([`Self::written_before`]: every place that writes the
    /// code must agree), in the order the text first writes them: "ORDER
    /// FORM AOF-2024-031", "under purchase order PO-4590".
    fn introduced_codes<'t>(&'t self, text: &'t str) -> Vec<(&'t str, &'t str)> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        for word in text.split_whitespace() {
            let code = word.trim_matches(|c: char| !c.is_alphanumeric());
            if !crate::text::is_code(code) || out.iter().any(|(c, _)| *c == code) {
                continue;
            }
            if let Some(kind) = self.written_before(code, text) {
                out.push((code, kind));
            }
        }
        out
    }

    /// The entity type whose [`type_word`] `words` are, if one is.
    fn type_named(&self, words: &str) -> Option<&str> {
        let word = type_word(words);
        self.words
            .iter()
            .find(|(w, _)| *w == word)
            .map(|(_, kind)| kind.as_str())
    }

    /// Whether `name` spells a type: as a type word, as the initials of a
    /// type of several words, or, when it is two or more words of letters,
    /// by its initials as an acronym type.
    fn spelled_by(&self, name: &str) -> bool {
        if self.type_named(name).is_some() {
            return true;
        }
        let bare = name.trim().trim_end_matches(['.', 's']);
        if self.initials.iter().any(|i| i == bare) {
            return true;
        }
        let words: Vec<&str> = crate::text::words(name).collect();
        if words.len() < 2 || !words.iter().all(|w| w.chars().all(char::is_alphabetic)) {
            return false;
        }
        let initials: String = words
            .iter()
            .filter_map(|w| w.chars().next())
            .flat_map(char::to_lowercase)
            .collect();
        self.acronyms.contains(&initials)
    }
}

/// The `max_tokens` of an entity call: `extract.entity_max_tokens`, or
/// less for a short episode, which cannot name many entities. Small models
/// sometimes repeat their list until the bound; a bound sized to the
/// episode stops that sooner, and the items completed before the cut are
/// kept ([`crate::llm::reply::salvage`]).
pub fn entity_reply_bound(spec: &ExtractSpec, episode: &Episode) -> u32 {
    let chars = u32::try_from(episode.content.chars().count()).unwrap_or(u32::MAX);
    spec.entity_max_tokens.min(256u32.saturating_add(chars / 3))
}

/// The `max_tokens` of a fact call about `mentions` entities:
/// `extract.fact_max_tokens`, or less for few entities (200 tokens and
/// 100 an entity: two facts of about 50 tokens each), for the same reason
/// as [`entity_reply_bound`].
pub fn fact_reply_bound(spec: &ExtractSpec, mentions: usize) -> u32 {
    let mentions = u32::try_from(mentions).unwrap_or(u32::MAX);
    spec.fact_max_tokens
        .min(200u32.saturating_add(mentions.saturating_mul(100)))
}

/// Longest entity name a reply may write (characters).
pub const NAME_MAX_CHARS: usize = 100;
/// Longest attribute value a reply may write (characters): a value, not
/// a passage.
pub const VALUE_MAX_CHARS: usize = 200;
/// Longest fact sentence a reply may write (characters): one sentence;
/// a longer one is a model copying the episode.
pub const FACT_MAX_CHARS: usize = 200;
/// Longest relation type a reply may write (characters).
pub const RELATION_MAX_CHARS: usize = 100;
/// Facts a reply may list per entity of its episode (at least 8 in all).
pub const FACTS_PER_ENTITY: usize = 4;

/// What a reply lost to its schema's bounds, as rejections of `episode`.
fn dropped(stage: Stage, episode: &Episode, notes: Vec<String>) -> Vec<Rejected> {
    notes
        .into_iter()
        .map(|note| Rejected {
            stage,
            episode_id: episode.episode_id.clone(),
            // A reply cut at its bound or stopped in a loop says so
            // itself; other notes are items past a bound.
            reason: if note.starts_with("the reply was ") {
                note
            } else {
                format!("the reply broke a bound of its schema: {note}")
            },
            excerpt: String::new(),
        })
        .collect()
}

/// The system prompt both extraction calls share: what the job is, the
/// entity types (top level; subtypes are chosen by the walk) and the fact
/// types the fact call may name.
fn system_prompt(ontology: &Ontology, spec: &ExtractSpec) -> String {
    let mut types = String::new();
    for t in ontology.entity_tree.top_level() {
        if let Some(ts) = ontology.entity_types.get(&t.name) {
            let asked = spec.properties.of(ts);
            types.push_str(&describe_type(&t.name, &ts.description, &asked));
            types.push('\n');
        }
    }
    let mut facts = String::new();
    for name in fact_types(ontology, spec) {
        if let Some(et) = ontology.edge_types.get(&name) {
            let depth = ontology.edge_tree.get(&name).map_or(1, |n| n.depth);
            let indent = "  ".repeat(depth - 1);
            let _ = writeln!(facts, "{indent}{}", describe_edge_type(&name, et));
        }
    }
    format!(
        "You turn episodes from an organisation's records (emails, chat messages, document chunks, data records) into a knowledge graph: the named entities an episode mentions and the facts it states about them. Answer in JSON.\n\n\
         ENTITY TYPES:\n{types}\n\
         FACT TYPES (allowed source → target types in brackets):\n{facts}{}",
        custom(spec)
    )
}

/// The task of entity calls, written after the episode.
fn entity_task(spec: &ExtractSpec) -> String {
    let attributes = match spec.properties {
        AskedProperties::None => "",
        AskedProperties::All | AskedProperties::Identity => {
            "\n- attributes: only property values the episode writes out, copied from it; leave out every property it does not write."
        }
    };
    format!(
        "TASK: list the named entities the CURRENT EPISODE mentions.\n\
         - Each distinct entity once, under the most complete name the current episode gives it, written exactly as in the text (keep codes and numbers such as order numbers).\n\
         - Only entities named or uniquely identified in the current episode; previous episodes only help to resolve pronouns and short references.\n\
         - Dates, amounts, quantities, statuses and generic nouns are not entities. Never use a type name as an entity name.\n\
         - Contracts, orders, tickets and other documents are entities too when the episode gives their code or number; name them as written, code included.\n\
         - type: the entity type whose description fits; {ENTITY_LABEL} when none fits.{attributes}"
    )
}

/// The schema of a property value a model writes: bounded text, of the
/// property's shape when it has a pattern.
pub fn value_schema(property: &PropertySpec) -> Value {
    let mut schema = json!({"type": "string", "maxLength": VALUE_MAX_CHARS});
    if let Some(pattern) = &property.pattern {
        schema["pattern"] = json!(pattern);
    }
    schema
}

/// The schema of the `attributes` a reply gives for a type with
/// `properties`: an object of their values, each optional; `None` for a
/// type without properties.
pub fn attributes_schema(properties: &[PropertySpec]) -> Option<Value> {
    let values: Map<String, Value> = properties
        .iter()
        .map(|p| (p.name.clone(), value_schema(p)))
        .collect();
    (!values.is_empty()).then(|| {
        json!({
            "type": "object",
            "properties": values,
            "additionalProperties": false
        })
    })
}

/// The reply schema of entity calls: one shape per top-level type, whose
/// `attributes` object offers only that type's properties, all optional
/// (a model asked for a property tends to invent a value for it).
fn entity_schema(ontology: &Ontology, spec: &ExtractSpec) -> Value {
    let name = json!({"type": "string", "maxLength": NAME_MAX_CHARS});
    let mut shapes: Vec<Value> = Vec::new();
    for t in ontology.entity_tree.top_level() {
        let Some(ts) = ontology.entity_types.get(&t.name) else {
            continue;
        };
        let mut properties = json!({"name": name, "type": {"type": "string", "enum": [t.name]}});
        if let Some(attributes) = attributes_schema(&spec.properties.of(ts)) {
            properties["attributes"] = attributes;
        }
        shapes.push(json!({
            "type": "object",
            "properties": properties,
            "required": ["name", "type"],
            "additionalProperties": false
        }));
    }
    shapes.push(json!({
        "type": "object",
        "properties": {"name": name, "type": {"type": "string", "enum": [ENTITY_LABEL]}},
        "required": ["name", "type"],
        "additionalProperties": false
    }));
    json!({
        "type": "object",
        "properties": {
            "entities": {
                "type": "array",
                "maxItems": spec.max_entities_per_episode,
                "items": {"anyOf": shapes}
            }
        },
        "required": ["entities"],
        "additionalProperties": false
    })
}

async fn within_budget<T>(
    spec: &ExtractSpec,
    stage: Stage,
    call: impl std::future::Future<Output = Result<T, LlmError>>,
) -> Result<T, LlmError> {
    match tokio::time::timeout(Duration::from_secs(spec.call_budget_secs), call).await {
        Ok(r) => r,
        Err(_) => Err(LlmError::Exhausted {
            stage,
            attempts: 0,
            last: format!(
                "the call ran past its time budget of {} s (extract.call_budget_secs)",
                spec.call_budget_secs
            ),
        }),
    }
}

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
    let reply = within_budget(
        spec,
        Stage::ExtractEntities,
        client.chat_json_with_schema_ref::<EntityReply>(request, prompts.entity_schema()),
    )
    .await?;
    let mut mentions: Vec<Mention> = Vec::new();
    let mut rejected = dropped(Stage::ExtractEntities, episode, reply.dropped);
    let mut seen: HashMap<String, usize> = HashMap::new();
    let type_words = &prompts.type_words;
    let lower = episode.content.to_lowercase();
    // The texts the model was shown, each as its words: a name it lifted
    // from the context is judged by how the context writes it.
    let context_shown: Vec<String> = context
        .iter()
        .map(|c| c.content.chars().take(spec.context_chars).collect())
        .collect();
    // The episode, then its context, split into words once: every name
    // offered is checked against them.
    let shown: Vec<crate::text::Written> = std::iter::once(episode.content.as_str())
        .chain(context_shown.iter().map(String::as_str))
        .map(crate::text::Written::new)
        .collect();
    let mut shown_words: HashSet<String> = shown
        .iter()
        .flat_map(crate::text::Written::words)
        .map(str::to_lowercase)
        .collect();
    if let Some(d) = &episode.source_description {
        shown_words.extend(crate::text::words(d).map(str::to_lowercase));
    }
    // Where the episode comes from ("engineering mailbox", "#ops chat"),
    // unless the episode itself writes it as a name.
    let source_only = episode
        .source_description
        .as_deref()
        .map(normalize_name)
        .filter(|d| !d.is_empty() && !normalize_name(&episode.content).contains(d.as_str()));
    let checks = NameChecks {
        spec,
        prompts,
        content: &episode.content,
        shown: &shown,
        shown_words: &shown_words,
        source_only: source_only.as_deref(),
    };
    let chars: Vec<char> = episode.content.chars().collect();
    for e in reply.value.entities {
        let name = e
            .name
            .trim()
            .trim_matches(|c: char| c == '"' || c == '\'')
            .trim()
            .to_string();
        // A name with a code keeps the code as the episode writes it; a
        // count in front of a name, a price in brackets after it and an
        // affiliation after it ("Oskar from Pellucid") are not part of it.
        let name = crate::text::as_written(&name, &episode.content);
        let name = crate::text::without_count(crate::text::without_price(&name));
        let name = crate::text::without_affiliation(name).to_string();
        // A type's words in front of a code type the entity, whatever type
        // the model chose ("order form AOF-2024-031" listed as a Product).
        // So do a type's words the episode writes in front of a code the
        // model listed alone ("signing order form QF-0087").
        let (name, named_type) = match type_words.type_and_code(&name) {
            Some((kind, code)) => (code.to_string(), ontology.entity_tree.chain(kind)),
            None if crate::text::is_code(&name) => {
                let kind = type_words.written_before(&name, &episode.content);
                let chain = kind.and_then(|k| ontology.entity_tree.chain(k));
                (name, chain)
            }
            None => (name, None),
        };
        let normalized = normalize_name(&name);
        let reject = |reason: String| Rejected {
            stage: Stage::ExtractEntities,
            episode_id: episode.episode_id.clone(),
            reason,
            excerpt: format!("{} ({})", e.name, e.kind),
        };
        if let Some(reason) = checks.not_a_name(&name, &normalized, &e.kind) {
            rejected.push(reject(reason));
            continue;
        }
        // The model's type stands only when it is the named type or below it.
        let named_type = named_type.filter(|chain| {
            !chain
                .last()
                .is_some_and(|t| ontology.entity_tree.is_a(&e.kind, t))
        });
        let chain = match (named_type, ontology.entity_tree.get(&e.kind)) {
            (Some(named), _) => named,
            (None, Some(node)) if node.parent.is_none() => vec![e.kind.clone()],
            _ if e.kind == ENTITY_LABEL => Vec::new(),
            _ => {
                rejected.push(reject(format!(
                    "unknown top-level type `{}`; kept as {ENTITY_LABEL}",
                    e.kind
                )));
                Vec::new()
            }
        };
        if chain.is_empty() && ontology.strict {
            rejected.push(reject(format!(
                "`{name}` fits no declared type and ontology.strict is set"
            )));
            continue;
        }
        // Exact duplicates within one episode collapse into the first.
        if let Some(i) = seen.get(&normalized) {
            let first = &mut mentions[*i];
            if first.chain.is_empty() && !chain.is_empty() {
                first.chain = chain;
            }
            continue;
        }
        if mentions.len() >= spec.max_entities_per_episode {
            rejected.push(reject(format!(
                "more than {} entities in one episode",
                spec.max_entities_per_episode
            )));
            continue;
        }
        let (attributes, ungrounded) = chain
            .last()
            .and_then(|t| ontology.entity_types.get(t))
            .map(|t| typed_attributes(&spec.properties.of(t), &e.attributes.pairs(), &evidence))
            .unwrap_or_default();
        rejected.extend(ungrounded.into_iter().map(|reason| Rejected {
            stage: Stage::ExtractEntities,
            episode_id: episode.episode_id.clone(),
            reason,
            excerpt: name.clone(),
        }));
        seen.insert(normalized, mentions.len());
        mentions.push(Mention {
            episode_id: episode.episode_id.clone(),
            context: context_in(&chars, &lower, &name, 160),
            name,
            chain,
            attributes,
            mapped: false,
        });
    }
    // A code the episode introduces with a type's words is an entity of
    // that type, listed or not: small models leave out the code a
    // document is about when it heads the text ("ORDER FORM
    // AOF-2024-031. Seller: Acme Corp. …"), and with it every fact about
    // it.
    for (code, kind) in type_words.introduced_codes(&episode.content) {
        let normalized = normalize_name(code);
        let chain = ontology.entity_tree.chain(kind).unwrap_or_default();
        if seen.contains_key(&normalized)
            || chain.is_empty()
            || mentions.len() >= spec.max_entities_per_episode
            || checks.not_a_name(code, &normalized, kind).is_some()
        {
            continue;
        }
        seen.insert(normalized, mentions.len());
        mentions.push(Mention {
            episode_id: episode.episode_id.clone(),
            context: context_in(&chars, &lower, code, 160),
            name: code.to_string(),
            chain,
            attributes: Map::new(),
            mapped: false,
        });
    }
    for (i, reason) in misplaced_identity_values(ontology, &lower, &mut mentions) {
        rejected.push(Rejected {
            stage: Stage::ExtractEntities,
            episode_id: episode.episode_id.clone(),
            reason,
            excerpt: mentions[i].name.clone(),
        });
    }
    Ok((mentions, rejected))
}

/// What an entity call's names are checked against: the episode and
/// its context as the model was shown them.
struct NameChecks<'a> {
    spec: &'a ExtractSpec,
    prompts: &'a Prompts,
    /// The episode's text.
    content: &'a str,
    /// The episode, then its context, each as its words.
    shown: &'a [crate::text::Written<'a>],
    /// Every word shown (the source description's too), in lower case.
    shown_words: &'a HashSet<String>,
    /// Where the episode comes from ("engineering mailbox"), normalised,
    /// unless the episode itself writes it.
    source_only: Option<&'a str>,
}

impl NameChecks<'_> {
    /// Why `name` (`normalized`, offered as a `kind`) is not an entity,
    /// by the first rule it breaks; `None` when it breaks none.
    fn not_a_name(&self, name: &str, normalized: &str, kind: &str) -> Option<String> {
        let descriptions = self.spec.reject_descriptions;
        if normalized.is_empty() {
            return Some("entity with an empty name".into());
        }
        // Small models list dates and amounts despite the rules.
        if parse_time(Some(name)).is_ok_and(|t| t.is_some())
            || !name.chars().any(char::is_alphabetic)
        {
            return Some(format!("`{name}` is a date or a number, not an entity"));
        }
        if let Some(what) = crate::text::non_entity_kind(name) {
            return Some(format!("`{name}` is {what}, not an entity"));
        }
        if crate::text::month_as_date(name, self.content) {
            return Some(format!(
                "`{name}` is a month the episode uses as a date, not an entity"
            ));
        }
        if self.source_only == Some(normalized) {
            return Some(format!(
                "`{name}` is the episode's source, not an entity it writes"
            ));
        }
        // Every name is copied from what the model was shown; one that
        // shares no word with it is made up (the 0.5B model lists words of
        // the prompt's own rules: "Date", "Quantity", "Generic Noun").
        if !crate::text::words(name).any(|w| self.shown_words.contains(&w.to_lowercase())) {
            return Some(format!(
                "`{name}` shares no word with the episode or its context: not a name it writes"
            ));
        }
        if descriptions && crate::text::common_noun(name, self.shown) {
            return Some(format!(
                "`{name}` is written only in lower case in the episode and its context: a common noun, not a name"
            ));
        }
        if descriptions && crate::text::only_a_label(name, &self.shown[0]) {
            return Some(format!(
                "`{name}` is written only as a field label (`{name}:`) in the episode, not a name"
            ));
        }
        if descriptions && self.prompts.person_types.contains(kind) && crate::text::job_title(name)
        {
            return Some(format!("`{name}` is a job title, not a person's name"));
        }
        if descriptions && crate::text::only_a_defined_term(name, self.shown) {
            return Some(format!(
                "`{name}` is written only as a term for a party (`the {name}`), not a name"
            ));
        }
        if self.prompts.type_words.spelled_by(name) || normalized == normalize_name(ENTITY_LABEL) {
            return Some(format!("entity named after a type: `{name}`"));
        }
        if descriptions && is_role_word(&self.prompts.role_words, name) {
            return Some(format!(
                "`{name}` is a role or a kind the type descriptions name, not a name"
            ));
        }
        None
    }
}

/// Whether two names share a word of three or more letters (case
/// ignored): "D. Whitcombe" and "Dana Whitcombe" do, "Priya Raman" and
/// "Dana Whitcombe" do not.
fn shares_a_word(a: &str, b: &str) -> bool {
    let long = |s: &str| -> Vec<String> {
        crate::text::words(s)
            .filter(|w| w.chars().count() >= 3)
            .map(str::to_lowercase)
            .collect()
    };
    let theirs = long(b);
    long(a).iter().any(|w| theirs.contains(w))
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
fn misplaced_identity_values(
    ontology: &Ontology,
    lower: &str,
    mentions: &mut [Mention],
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
                let kin = around
                    .iter()
                    .filter(|a| Some(a.0) == best)
                    .any(|a| shares_a_word(&mentions[a.1].name, &mentions[i].name));
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

/// The edge types a fact call may name: every declared type when the
/// spec folds the edge subtype choice into the call, else the top-level
/// ones (subtypes are then chosen by the edge walk).
fn fact_types(ontology: &Ontology, spec: &ExtractSpec) -> Vec<String> {
    if spec.fold_edge_subtypes {
        ontology.edge_tree.iter().map(|t| t.name.clone()).collect()
    } else {
        ontology
            .edge_tree
            .top_level()
            .map(|t| t.name.clone())
            .collect()
    }
}

/// The task of fact calls, written after the episode and its entities.
fn fact_task(ontology: &Ontology, spec: &ExtractSpec, by_source: bool) -> String {
    let layout = if by_source {
        "- facts: under each entity's name, the facts whose source it is (the entity that does, holds or owns what the fact says); [] when there are none. Go through every entity.\n- target: a name copied exactly from ENTITIES, another entity."
    } else {
        "- source and target: names copied exactly from ENTITIES; two different entities."
    };
    let subtypes = if spec.fold_edge_subtypes && ontology.edge_tree.iter().any(|t| t.depth > 1) {
        "\n- An indented fact type is a more specific kind of the type above it: use it when the episode says which kind; otherwise the type above."
    } else {
        ""
    };
    let valid_at = match spec.fact_start {
        FactStart::Model => {
            "- valid_at: the date the relationship started, when the episode gives one; else null.\n"
        }
        FactStart::Text => "",
    };
    format!(
        "TASK: state every fact the CURRENT EPISODE gives about a relationship between two of the ENTITIES.\n\
         {layout}\n\
         - relation_type: the FACT TYPE whose source → target types fit the two entities' types. When none fits, a short lowercase verb phrase.{subtypes}\n\
         - fact: one short sentence that paraphrases what the episode says, with entity names instead of pronouns.\n\
         {valid_at}\
         - invalid_at: the date it ended, only when the episode says it has ended or will end (has left, no longer, former, cancelled, until a date); else null. \"X left A and joined B\" states two facts: X with A (ended) and X with B.\n\
         - Dates as YYYY-MM-DD; resolve relative dates (last Tuesday, next month, tonight) against the REFERENCE TIME.\n\
         - Only facts the current episode states or clearly implies; previous episodes only help to resolve references. No duplicates."
    )
}

/// A date, as the fact schema lets a model write `valid_at` and
/// `invalid_at`. A time of day is not offered: given the choice, small
/// models copied the episode's full reference time into nearly every
/// fact, about ten tokens more per date for a precision that relationships
/// rarely have.
pub const TIME_PATTERN: &str = "^[0-9]{4}-[0-9]{2}-[0-9]{2}$";

/// A relation a model may write when no declared type fits: lowercase
/// words, so that the grammar tells it apart from every declared
/// (SCREAMING_SNAKE_CASE) type, and bounded (at most 6 words of 24).
pub const FREE_RELATION_PATTERN: &str = "^[a-z]{1,24}( [a-z]{1,24}){0,5}$";

/// The schema of one fact: one branch per declared type and
/// `source_targets` pair, whose source and target are enums of the
/// mentions whose types fit that pair, so a schema-constrained decoder can
/// only name a declared type for endpoints it allows; and one branch for a
/// free lowercase relation between any two mentions.
fn fact_item_schema(ontology: &Ontology, spec: &ExtractSpec, mentions: &[Mention]) -> Value {
    json!({"anyOf": fact_branches(ontology, spec, mentions, None)})
}

/// The branches of [`fact_item_schema`]; with `from`, those of the facts
/// whose source is that mention, without a `source` property (the reply
/// groups facts by source, see `extract.facts_by_source`).
fn fact_branches<'a>(
    ontology: &Ontology,
    spec: &ExtractSpec,
    mentions: &'a [Mention],
    from: Option<&'a Mention>,
) -> Vec<Value> {
    let time = json!({"anyOf": [
        // The pattern binds grammar-constrained servers to a date; the
        // length still admits a UTC time from a server that ignores it.
        {"type": "string", "pattern": TIME_PATTERN, "maxLength": 20},
        {"type": "null"}
    ]});
    let names = |wanted: &str| -> Vec<&'a str> {
        let mut out: Vec<&str> = Vec::new();
        for m in mentions {
            if ontology.entity_fits(m.type_name(), wanted) && !out.contains(&m.name.as_str()) {
                out.push(&m.name);
            }
        }
        out
    };
    let branch = |relation: Value, sources: Vec<&str>, targets: Vec<&str>| {
        let mut item = json!({
            "type": "object",
            "properties": {
                "source": {"type": "string", "enum": sources},
                "relation_type": relation,
                "target": {"type": "string", "enum": targets},
                "fact": {"type": "string", "maxLength": FACT_MAX_CHARS},
                "valid_at": time,
                "invalid_at": time
            },
            "additionalProperties": false
        });
        if let Some(p) = item["properties"].as_object_mut() {
            if from.is_some() {
                p.shift_remove("source");
            }
            if spec.fact_start == FactStart::Text {
                p.shift_remove("valid_at");
            }
            let required: Vec<String> = p.keys().cloned().collect();
            item["required"] = json!(required);
        }
        item
    };
    // With a source, only it may start a fact, and it cannot be its own
    // target.
    let pick =
        |sources: Vec<&'a str>, targets: Vec<&'a str>| -> Option<(Vec<&'a str>, Vec<&'a str>)> {
            match from {
                None => {
                    let one_and_same = sources.len() == 1 && targets == sources;
                    (!sources.is_empty() && !targets.is_empty() && !one_and_same)
                        .then_some((sources, targets))
                }
                Some(m) => {
                    let targets: Vec<&str> = targets.into_iter().filter(|t| *t != m.name).collect();
                    (sources.contains(&m.name.as_str()) && !targets.is_empty())
                        .then(|| (vec![m.name.as_str()], targets))
                }
            }
        };
    let mut branches: Vec<Value> = Vec::new();
    for name in fact_types(ontology, spec) {
        let Some(et) = ontology.edge_types.get(&name) else {
            continue;
        };
        let any = [(ENTITY_LABEL, ENTITY_LABEL)];
        let pairs: Vec<(&str, &str)> = if et.source_targets.is_empty() {
            any.to_vec()
        } else {
            et.source_targets
                .iter()
                .map(|p| (p.source.as_str(), p.target.as_str()))
                .collect()
        };
        for (s, t) in pairs {
            let Some((sources, targets)) = pick(names(s), names(t)) else {
                continue;
            };
            let b = branch(json!({"type": "string", "enum": [name]}), sources, targets);
            if !branches.contains(&b) {
                branches.push(b);
            }
        }
    }
    let all = names(ENTITY_LABEL);
    if let Some((sources, targets)) = pick(all.clone(), all) {
        branches.push(branch(
            json!({"type": "string", "pattern": FREE_RELATION_PATTERN, "maxLength": RELATION_MAX_CHARS}),
            sources,
            targets,
        ));
    }
    branches
}

/// The request and reply schema of a fact call about `mentions`: the
/// entity call's system prompt and episode, then the entities and the task.
fn fact_request(
    ontology: &Ontology,
    prompts: &Prompts,
    spec: &ExtractSpec,
    episode: &Episode,
    context: &[&Episode],
    mentions: &[Mention],
) -> (ChatRequest, Value) {
    let mut entities = String::new();
    let mut by_source = Map::new();
    for m in mentions {
        if !spec.facts_by_source {
            let _ = writeln!(entities, "- {} ({})", m.name, m.type_name());
            continue;
        }
        // The declared types this entity can start, as a reminder of what
        // to look for; its list in the reply offers exactly those.
        let branches = fact_branches(ontology, spec, mentions, Some(m));
        let mut starts: Vec<&str> = branches
            .iter()
            .filter_map(|b| b["properties"]["relation_type"]["enum"][0].as_str())
            .collect();
        starts.dedup();
        if starts.is_empty() {
            let _ = writeln!(entities, "- {} ({})", m.name, m.type_name());
        } else {
            let _ = writeln!(
                entities,
                "- {} ({}; can be the source of {})",
                m.name,
                m.type_name(),
                starts.join(", ")
            );
        }
        by_source.insert(
            m.name.clone(),
            json!({"type": "array", "maxItems": FACTS_PER_ENTITY, "items": {"anyOf": branches}}),
        );
    }
    let task = if spec.facts_by_source {
        &prompts.fact_task_by_source
    } else {
        &prompts.fact_task
    };
    let user = format!(
        "{}\n\nENTITIES:\n{entities}\n{task}",
        episode_block(episode, context, spec.context_chars),
    );
    let facts = if spec.facts_by_source {
        let names: Vec<&String> = by_source.keys().collect();
        json!({
            "type": "object",
            "properties": by_source,
            "required": names,
            "additionalProperties": false
        })
    } else {
        json!({
            "type": "array",
            "maxItems": (FACTS_PER_ENTITY * mentions.len()).max(8),
            "items": fact_item_schema(ontology, spec, mentions)
        })
    };
    let schema = json!({
        "type": "object",
        "properties": {"facts": facts},
        "required": ["facts"],
        "additionalProperties": false
    });
    (
        ChatRequest {
            stage: Stage::ExtractFacts,
            item: Some(episode.episode_id.clone()),
            messages: vec![Message::system(prompts.system.clone()), Message::user(user)],
            max_tokens: fact_reply_bound(spec, mentions.len()),
            prompt_version: PROMPT_VERSION.into(),
        },
        schema,
    )
}

/// Turns what a model wrote as a relation type into SCREAMING_SNAKE_CASE.
pub fn relation_type_of(text: &str) -> String {
    let mut out = String::new();
    let mut gap = false;
    for c in text.trim().chars() {
        if c.is_ascii_alphanumeric() {
            if gap && !out.is_empty() {
                out.push('_');
            }
            gap = false;
            out.push(c.to_ascii_uppercase());
        } else {
            gap = true;
        }
    }
    if out.chars().next().is_some_and(|c| c.is_ascii_digit()) {
        out.insert_str(0, "R_");
    }
    out
}

/// The relation type of a fact whose model named no declared type.
pub const GENERIC_RELATION: &str = "RELATES_TO";

/// The declared type an undeclared relation name spells another way, and
/// whether it is written in the other voice (its endpoints then go the
/// other way round). Small models write `SUPPLIEDBY` or `SuppliedBy` for
/// SUPPLIED_BY, and "Skylark supplies Notification Hub" as SUPPLIED or
/// SUPPLIES: the active voice of SUPPLIED_BY, turned round; OWNED_BY is
/// the passive of a declared OWNS. Read in this order: the same letters
/// without the underscores; a passive `X_BY` whose active form of X is
/// declared; an active form of X for a declared `X_BY`. The active forms
/// of a participle X are X itself ("SUPPLIED"), and its present tense
/// ("SUPPLIES", "OWNS", "APPROVES"). `None` for a declared type, or when
/// no declared type is spelled.
pub fn declared_spelling(ontology: &Ontology, relation: &str) -> Option<(String, bool)> {
    if ontology.edge_types.contains_key(relation) {
        return None;
    }
    let bare = |r: &str| r.replace('_', "");
    let wanted = bare(relation);
    if let Some(name) = ontology.edge_types.keys().find(|n| bare(n) == wanted) {
        return Some((name.clone(), false));
    }
    // The active forms a participle such as SUPPLIED, OWNED or APPROVED
    // is written in.
    let active_forms = |participle: &str| -> Vec<String> {
        let mut forms = vec![participle.to_string()];
        if let Some(stem) = participle.strip_suffix("IED") {
            forms.push(format!("{stem}IES"));
        } else if let Some(stem) = participle.strip_suffix("ED") {
            forms.push(format!("{stem}S"));
            forms.push(format!("{stem}ES"));
        }
        forms
    };
    if let Some(participle) = relation.strip_suffix("_BY")
        && let Some(active) = active_forms(participle)
            .into_iter()
            .find(|f| ontology.edge_types.contains_key(f))
    {
        return Some((active, true));
    }
    ontology.edge_types.keys().find_map(|name| {
        let participle = name.strip_suffix("_BY")?;
        active_forms(participle)
            .iter()
            .any(|f| *f == relation)
            .then(|| (name.clone(), true))
    })
}

/// The relation type a fact is stored under, and whether its endpoints are
/// swapped. A declared type must allow the endpoint types (`source_targets`):
/// as written; reversed (small models often reverse a direction they
/// clearly mean); or else the nearest parent type that allows them; or
/// else the fact is kept as [`GENERIC_RELATION`], so that no fact is lost
/// to a server that ignores the reply schema. `None` only when the
/// ontology declares the generic type itself and it does not fit either.
pub fn fitting_relation(
    ontology: &Ontology,
    relation: &str,
    source: &str,
    target: &str,
) -> Option<(String, bool)> {
    let fit = |r: &str| fits_either_way(ontology, r, source, target);
    // An undeclared relation is a chain of itself.
    let chain = ontology
        .edge_tree
        .chain(relation)
        .unwrap_or_else(|| vec![relation.to_string()]);
    chain
        .iter()
        .rev()
        .find_map(|r| fit(r))
        .or_else(|| fit(GENERIC_RELATION))
}

/// [`fitting_relation`] for a fact whose words write the declared types
/// `written` ([`types_written`]): where the type the model gave cannot
/// hold the endpoints (it falls back to [`GENERIC_RELATION`]) or is no
/// declared type (a free relation), the written type that fits them.
/// "Kenji Mori: I'm no longer on call for Fare Engine", given as WORKS_FOR
/// between a person and a service, is ON_CALL_FOR; so is a free "was on
/// call for". When the written types that fit lie on one chain the most
/// specific is taken; types of two families leave the choice to no one.
pub fn fitting_relation_in(
    ontology: &Ontology,
    relation: &str,
    written: &[String],
    source: &str,
    target: &str,
) -> Option<(String, bool)> {
    let fit = fitting_relation(ontology, relation, source, target);
    let declared_fit = fit
        .as_ref()
        .is_some_and(|(r, _)| r != GENERIC_RELATION && ontology.edge_types.contains_key(r));
    if declared_fit {
        return fit;
    }
    let fitting: Vec<(String, bool)> = written
        .iter()
        .filter_map(|name| fits_either_way(ontology, name, source, target))
        .collect();
    let deepest = fitting
        .iter()
        .max_by_key(|(n, _)| ontology.edge_tree.get(n).map_or(0, |t| t.depth));
    match deepest {
        Some(d)
            if fitting
                .iter()
                .all(|(n, _)| ontology.edge_tree.is_a(&d.0, n)) =>
        {
            Some(d.clone())
        }
        _ => fit,
    }
}

/// The one declared relation type that entities of types `a` and `b` can
/// be related by, and whether it goes from `b` to `a`: the broadest of the
/// declared types whose `source_targets` allow the pair, when every other
/// one is below it (Person → Service: RESPONSIBLE_FOR, with its kinds
/// ON_CALL_FOR and OWNS). `None` when none fits, when two families do
/// (a type without `source_targets` fits every pair), or when the type
/// fits both ways round.
pub fn only_relation(ontology: &Ontology, a: &str, b: &str) -> Option<(String, bool)> {
    let fitting: Vec<(String, bool)> = ontology
        .edge_tree
        .iter()
        .filter(|t| t.name != GENERIC_RELATION)
        .filter_map(|t| fits_either_way(ontology, &t.name, a, b))
        .collect();
    let (broadest, turned) = fitting.iter().find(|(n, _)| {
        fitting
            .iter()
            .all(|(other, _)| ontology.edge_tree.is_a(other, n))
    })?;
    let both_ways = ontology.edge_allows(broadest, a, b) && ontology.edge_allows(broadest, b, a);
    (!both_ways).then(|| (broadest.clone(), *turned))
}

/// `relation` with whether it must be turned round, when its own
/// `source_targets` allow the endpoint types as given or else reversed.
fn fits_either_way(
    ontology: &Ontology,
    relation: &str,
    source: &str,
    target: &str,
) -> Option<(String, bool)> {
    if ontology.edge_allows(relation, source, target) {
        Some((relation.to_string(), false))
    } else if ontology.edge_allows(relation, target, source) {
        Some((relation.to_string(), true))
    } else {
        None
    }
}

/// The declared relation types whose names, without a last word that is
/// a preposition, `text` writes as consecutive words, case and
/// punctuation aside: ON_CALL_FOR in "my on-call shifts", OWNS in "owns".
fn types_named(ontology: &Ontology, text: &str) -> Vec<String> {
    const PREPOSITIONS: [&str; 8] = ["for", "to", "of", "by", "with", "in", "on", "at"];
    let words: Vec<String> = crate::text::words(text).map(str::to_lowercase).collect();
    ontology
        .edge_tree
        .iter()
        .filter(|node| {
            let mut phrase: Vec<String> = crate::text::words(&node.name)
                .map(str::to_lowercase)
                .collect();
            if phrase.len() > 1
                && phrase
                    .last()
                    .is_some_and(|w| PREPOSITIONS.contains(&w.as_str()))
            {
                phrase.pop();
            }
            !phrase.is_empty() && words.windows(phrase.len()).any(|w| w == phrase)
        })
        .map(|node| node.name.clone())
        .collect()
}

/// The declared relation types whose names `texts` write as consecutive
/// words, case and punctuation aside (ON_CALL_FOR in "no longer on-call
/// for"), in declared order.
pub fn types_written(ontology: &Ontology, texts: &[&str]) -> Vec<String> {
    let words_of =
        |s: &str| -> Vec<String> { crate::text::words(s).map(str::to_lowercase).collect() };
    let texts: Vec<Vec<String>> = texts.iter().map(|t| words_of(t)).collect();
    ontology
        .edge_tree
        .iter()
        .filter(|node| {
            let phrase = words_of(&node.name);
            !phrase.is_empty()
                && texts
                    .iter()
                    .any(|words| words.windows(phrase.len()).any(|w| w == phrase))
        })
        .map(|node| node.name.clone())
        .collect()
}

/// Whether a fact given under `relation` and fitted to `fitted` (by
/// [`fitting_relation`]) names a declared type that its endpoints cannot
/// hold, either way round, nor under a parent: the model meant that type
/// ("party to" is `PARTY_TO`: the free branch of the schema spells a
/// declared type in lower case) for entities it does not relate, and the
/// fact is noise, not a relationship the ontology leaves out.
pub fn misapplied(ontology: &Ontology, relation: &str, fitted: &str) -> bool {
    fitted == GENERIC_RELATION
        && relation != GENERIC_RELATION
        && ontology.edge_types.contains_key(relation)
}

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
    let reply = within_budget(
        spec,
        Stage::ExtractFacts,
        client.chat_json_with_schema::<FactReply>(request, schema),
    )
    .await?;
    let by_name: HashMap<String, usize> = mentions
        .iter()
        .enumerate()
        .map(|(i, m)| (normalize_name(&m.name), i))
        .collect();
    let mut facts = Vec::new();
    let mut rejected = dropped(Stage::ExtractFacts, episode, reply.dropped);
    let (facts_out, unshaped) = reply.value.facts.into_list();
    rejected.extend(dropped(Stage::ExtractFacts, episode, unshaped));
    let mut seen: BTreeMap<(usize, usize, String, String), ()> = BTreeMap::new();
    let sentences = Sentences::new(&episode.content, mentions);
    // Records are not prose: their fields are not sentences, and their
    // structure says which values belong together.
    let record = (episode.kind == crate::spec::EpisodeKind::Json)
        .then(|| RecordPlaces::new(&episode.content, mentions));
    let judged = spec.require_stated_pair && record.is_none();
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
        let (Some(&s), Some(&t)) = (
            by_name.get(&normalize_name(&f.source)),
            by_name.get(&normalize_name(&f.target)),
        ) else {
            let missing = if by_name.contains_key(&normalize_name(&f.source)) {
                &f.target
            } else {
                &f.source
            };
            rejected.push(reject(format!(
                "`{missing}` is not in the episode's entity list"
            )));
            continue;
        };
        if s == t {
            rejected.push(reject("a fact needs two distinct entities".into()));
            continue;
        }
        // Small models give a chat line's speaker, or an e-mail's
        // recipient, the company the line or the e-mail names ("Dana:
        // Legal sent over the new Acme contract" became "Dana works for
        // Acme").
        // Small models pair every vendor of a report's list with every
        // order in it ("Acme Corp is a party to PO-4614", a Brightline
        // order listed next to two of Acme's).
        if record.as_ref().is_some_and(|r| !r.pair_stated(s, t)) {
            rejected.push(reject(format!(
                "the record never holds `{}` and `{}` in one object (values of two items of a list are not related): not stated, fact dropped",
                mentions[s].name, mentions[t].name
            )));
            continue;
        }
        if judged && !sentences.pair_stated(s, t) {
            rejected.push(reject(format!(
                "no sentence of the episode names both `{}` and `{}` (a chat speaker or an e-mail header does not count; a writer's \"I\" does): not stated, fact dropped",
                mentions[s].name, mentions[t].name
            )));
            continue;
        }
        let text = f.fact.trim();
        if text.is_empty() {
            rejected.push(reject("empty fact text".into()));
            continue;
        }
        let mut relation = relation_type_of(&f.relation_type);
        if relation.is_empty() || !is_relation_type_name(&relation) {
            relation = GENERIC_RELATION.into();
        }
        let (s, t) = match declared_spelling(ontology, &relation) {
            Some((declared, turned)) => {
                relation = declared;
                if turned { (t, s) } else { (s, t) }
            }
            None => (s, t),
        };
        let (st, tt) = (mentions[s].type_name(), mentions[t].type_name());
        let label = relation.replace('_', " ");
        let mut texts = vec![label.as_str(), text];
        texts.extend(sentences.about_pair(s, t));
        let written_types = types_written(ontology, &texts);
        let (fitted, swap) = match fitting_relation_in(ontology, &relation, &written_types, st, tt)
        {
            Some(fit) => fit,
            None => {
                rejected.push(reject(format!(
                    "`{relation}` does not allow {st} → {tt}, and neither does {GENERIC_RELATION}; fact dropped"
                )));
                continue;
            }
        };
        if misapplied(ontology, &relation, &fitted) {
            let pairs = if st == tt {
                format!("{st} → {tt}")
            } else {
                format!("{st} → {tt} or {tt} → {st}")
            };
            rejected.push(reject(format!(
                "`{relation}` (written `{}`) does not allow {pairs}, and no parent type does: a misapplied type, fact dropped",
                f.relation_type.trim()
            )));
            continue;
        }
        if fitted != relation {
            // Kept, under a parent type that allows its endpoints or the
            // type the episode writes; the row says what the model wrote.
            let why = if ontology.edge_types.contains_key(&relation) {
                format!("`{relation}` does not allow {st} → {tt}")
            } else {
                format!("`{relation}` is no declared type")
            };
            let how = if written_types.contains(&fitted)
                && !ontology.edge_tree.is_a(&relation, &fitted)
            {
                ", which the episode writes"
            } else {
                ""
            };
            rejected.push(reject(format!("{why}; kept as {fitted}{how}")));
        }
        let relation = fitted;
        let (s, t) = if swap { (t, s) } else { (s, t) };
        let chain = ontology
            .edge_tree
            .chain(&relation)
            .unwrap_or_else(|| vec![relation.clone()]);
        let reference = episode.reference_time;
        let today = reference.date_naive();
        // A move starts the fact on its day ("moves to Skylark on 1 July").
        // A relation no declared type names says too little to end others.
        let move_at = ontology
            .edge_types
            .contains_key(&relation)
            .then(|| sentences.moved_to(s, t))
            .flatten();
        let move_day = move_at
            .and_then(|k| sentences.day_of(k, today))
            .map(|d| on_day(d, reference));
        let stated = match spec.fact_start {
            FactStart::Model => written_time(f.valid_at.as_deref(), reference),
            FactStart::Text => stated_start(text, today)
                .or_else(|| sentences.pair_start(s, t, today))
                .map(|d| on_day(d, reference)),
        }
        .or(move_day);
        let (mut valid_at, invalid_at) = fact_times(
            stated,
            written_time(f.invalid_at.as_deref(), reference),
            text,
            || sentences.pair_end(s, t, reference),
            reference,
        );
        let start_stated = valid_at.is_some();
        let moved = move_at.is_some();
        if spec.fact_start == FactStart::Text && valid_at.is_none() {
            valid_at = default_start(invalid_at, reference);
        }
        let key = (
            s,
            t,
            chain.last().cloned().unwrap_or_default(),
            normalize_name(text),
        );
        if seen.insert(key, ()).is_some() {
            continue;
        }
        facts.push(FactMention {
            episode_id: episode.episode_id.clone(),
            source: s,
            target: t,
            chain,
            fact: text.to_string(),
            valid_at,
            invalid_at,
            mapped: false,
            written_types,
            start_stated,
            moved,
        });
    }
    if record.is_none() {
        let ended = ended_pairs(ontology, spec, episode, mentions, &sentences, &facts);
        facts.extend(ended);
    }
    Ok((facts, rejected))
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
fn ended_pairs(
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
            let text = sentences.sentences[k].text;
            let (tg, tt) = (mentions[giver].type_name(), mentions[thing].type_name());
            let named: Vec<(String, bool)> = types_named(ontology, text)
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

/// Where a record (a JSON episode) holds each mention's name: per
/// mention, the containers (objects and lists, by number, the outermost
/// first) around each value or key that writes it.
struct RecordPlaces {
    /// `None` when the episode is not JSON: nothing can be judged.
    places: Option<Vec<Vec<Vec<Container>>>>,
}

/// An object or list of a record, numbered in the order the walk meets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Container {
    id: usize,
    is_object: bool,
}

impl RecordPlaces {
    fn new(content: &str, mentions: &[Mention]) -> Self {
        let Ok(value) = serde_json::from_str::<Value>(content) else {
            return RecordPlaces { places: None };
        };
        let names: Vec<String> = mentions.iter().map(|m| normalize_name(&m.name)).collect();
        let mut places = vec![Vec::new(); mentions.len()];
        let mut next = 0;
        let mut path = Vec::new();
        Self::walk(&value, &names, &mut path, &mut next, &mut places);
        RecordPlaces {
            places: Some(places),
        }
    }

    fn walk(
        value: &Value,
        names: &[String],
        path: &mut Vec<Container>,
        next: &mut usize,
        places: &mut [Vec<Vec<Container>>],
    ) {
        let note = |text: &str, path: &[Container], places: &mut [Vec<Vec<Container>>]| {
            let written = normalize_name(text);
            for (i, name) in names.iter().enumerate() {
                if writes(&written, name) {
                    places[i].push(path.to_vec());
                }
            }
        };
        match value {
            Value::Object(map) => {
                path.push(Container {
                    id: *next,
                    is_object: true,
                });
                *next += 1;
                for (key, v) in map {
                    note(key, path, places);
                    Self::walk(v, names, path, next, places);
                }
                path.pop();
            }
            Value::Array(items) => {
                path.push(Container {
                    id: *next,
                    is_object: false,
                });
                *next += 1;
                for v in items {
                    Self::walk(v, names, path, next, places);
                }
                path.pop();
            }
            Value::String(text) => note(text, path, places),
            Value::Number(n) => note(&n.to_string(), path, places),
            Value::Bool(_) | Value::Null => {}
        }
    }

    /// Whether the record relates `a` and `b`: one is written as a field
    /// (a value or a key) of an object that holds the other, at any depth
    /// ("buyer" of a report and an order in its list); two values in
    /// different items of one list are not related. A mention the record
    /// does not write (the model took it from elsewhere) passes.
    fn pair_stated(&self, a: usize, b: usize) -> bool {
        let Some(places) = &self.places else {
            return true;
        };
        if places[a].is_empty() || places[b].is_empty() {
            return true;
        }
        places[a].iter().any(|pa| {
            places[b].iter().any(|pb| {
                let common = pa.iter().zip(pb).take_while(|(x, y)| x == y).count();
                // The innermost container holding both: an object of which
                // one of the two is a field of its own.
                common > 0 && pa[common - 1].is_object && (pa.len() == common || pb.len() == common)
            })
        })
    }
}

/// Whether a record's value (normalised) writes a mention's name
/// (normalised): the same words, or the name's words within the value's
/// ("Acme Corp" in "Acme Corp (UK)"), or the value's within the name's
/// when the value is not a short code ("Northwind Outfitters" for
/// "Northwind Outfitters Inc").
fn writes(value: &str, name: &str) -> bool {
    let within = |outer: &str, inner: &str| {
        !inner.is_empty()
            && (outer == inner
                || outer.starts_with(&format!("{inner} "))
                || outer.ends_with(&format!(" {inner}"))
                || outer.contains(&format!(" {inner} ")))
    };
    within(value, name) || (value.len() >= 4 && within(name, value))
}

/// Where an episode names its mentions, sentence by sentence, and who
/// writes each sentence. A mention is named by its whole name (case
/// ignored), or by its first word as the text capitalises it ("Hamid" for
/// "Hamid Castellanos"). A chat line's speaker ("Arjun Raghunathan: …")
/// and an e-mail's `From:` are who writes the sentences, not what they
/// are about; header lines (`From:`, `To:`, `Cc:`, `Subject:` …) are not
/// sentences.
struct Sentences<'a> {
    sentences: Vec<Sentence<'a>>,
    /// Per mention: whether the episode names it anywhere, headers and
    /// speakers included.
    anywhere: Vec<bool>,
    /// Per mention: how a sentence names it.
    names: Vec<NameWords>,
}

/// How a sentence names a mention: all its words in a row (case
/// ignored), or its first word as the text capitalises it.
struct NameWords {
    /// The name's words, in lower case.
    whole: Vec<String>,
    /// Its first word, when it is capitalised and 3 letters or more.
    first: Option<String>,
}

impl NameWords {
    fn of(name: &str) -> Self {
        NameWords {
            whole: crate::text::words(name).map(str::to_lowercase).collect(),
            first: crate::text::words(name)
                .next()
                .filter(|w| w.chars().count() >= 3 && w.starts_with(char::is_uppercase))
                .map(str::to_string),
        }
    }

    /// Where `words` (as written) first name it: the index of the name's
    /// first word, and of the word after the name.
    fn in_words(&self, words: &[&str]) -> Option<(usize, usize)> {
        let n = self.whole.len();
        (0..words.len()).find_map(|i| {
            if n > 0
                && words.len() >= i + n
                && words[i..i + n]
                    .iter()
                    .zip(&self.whole)
                    .all(|(w, x)| w.to_lowercase() == *x)
            {
                Some((i, i + n))
            } else if self.first.as_deref() == Some(words[i]) {
                Some((i, i + 1))
            } else {
                None
            }
        })
    }
}

/// One sentence of an episode, as [`Sentences`] reads it.
struct Sentence<'a> {
    text: &'a str,
    /// The mentions it names.
    named: Vec<usize>,
    /// The mention writing it, if one is.
    writer: Option<usize>,
    /// Whether it speaks in the first person ("I", "me", "my").
    first_person: bool,
    /// The mention the writer's e-mail address names as their
    /// organisation, if one does ([`org_of_address`]).
    org: Option<usize>,
    /// Whether it speaks in the first person plural ("we", "our", "us"):
    /// for an e-mail's writer, their organisation.
    we: bool,
}

impl Sentence<'_> {
    /// Whether the sentence speaks of mention `x`: it names it, its writer
    /// is `x` speaking in the first person ("I cancelled …"), or `x` is the
    /// writer's organisation and the sentence says "we" ("We will keep
    /// accepting messages from your Notification Hub until …", from an
    /// address at relaywave.com, speaks of Relaywave).
    fn speaks_of(&self, x: usize) -> bool {
        self.named.contains(&x)
            || (self.first_person && self.writer == Some(x))
            || (self.we && self.org == Some(x))
    }

    /// Every mention the sentence speaks of ([`Self::speaks_of`]), in
    /// order, each once.
    fn spoken(&self) -> Vec<usize> {
        let mut spoken = self.named.clone();
        if self.first_person {
            spoken.extend(self.writer);
        }
        if self.we {
            spoken.extend(self.org);
        }
        spoken.sort_unstable();
        spoken.dedup();
        spoken
    }
}

/// The mention an e-mail header line's address names as the writer's
/// organisation: one whose name, folded like a company's (lower case,
/// corporate suffixes dropped, no spaces), is a label of the address's
/// domain other than its last ("Relaywave Ltd" for
/// `beatrix.holm@relaywave.com`, "Acme Corp" for `dana@mail.acme.co.uk`).
/// Which mention that is, is read off the address and the names alone: a
/// person's name is no domain label.
fn org_of_address(line: &str, folded: &[String]) -> Option<usize> {
    let (_, after) = line.split_once('@')?;
    let domain: String = after
        .chars()
        .take_while(|c| c.is_alphanumeric() || matches!(c, '.' | '-'))
        .collect::<String>()
        .to_lowercase();
    let labels: Vec<&str> = domain.split('.').collect();
    let (_, named) = labels.split_last()?;
    let named: Vec<String> = named.iter().map(|l| l.replace('-', "")).collect();
    folded
        .iter()
        .position(|f| !f.is_empty() && named.iter().any(|l| l == f))
}

/// E-mail header lines, in lower case.
const HEADERS: [&str; 7] = [
    "from:",
    "to:",
    "cc:",
    "bcc:",
    "subject:",
    "date:",
    "reply-to:",
];

impl<'a> Sentences<'a> {
    fn new(content: &'a str, mentions: &[Mention]) -> Self {
        // Each name's words are taken once, not once per sentence.
        let names: Vec<NameWords> = mentions.iter().map(|m| NameWords::of(&m.name)).collect();
        // The names folded as a domain label would write them, taken only
        // for an episode with a `From:` address.
        let mut folded: Option<Vec<String>> = None;
        let fold = || -> Vec<String> {
            mentions
                .iter()
                .map(|m| {
                    crate::text::fold_suffixes(
                        &normalize_name(&m.name),
                        crate::spec::resolve::DEFAULT_CORPORATE_SUFFIXES,
                    )
                    .replace(' ', "")
                })
                .collect()
        };
        let named_in = |text: &str| -> Vec<usize> {
            let words: Vec<&str> = crate::text::words(text).collect();
            (0..names.len())
                .filter(|&i| names[i].in_words(&words).is_some())
                .collect()
        };
        let mut out = Sentences {
            sentences: Vec::new(),
            anywhere: vec![false; mentions.len()],
            names: Vec::new(),
        };
        let mut sender: Option<usize> = None;
        let mut sender_org: Option<usize> = None;
        for line in content.lines() {
            let lower = line.trim_start().to_lowercase();
            if let Some(header) = HEADERS.iter().find(|h| lower.starts_with(*h)) {
                let named = named_in(line);
                if *header == "from:" {
                    sender = named.first().copied();
                    sender_org = org_of_address(line, folded.get_or_insert_with(fold));
                }
                for i in named {
                    out.anywhere[i] = true;
                }
                continue;
            }
            let (writer, org, said) = match line.split_once(": ") {
                Some((speaker, said))
                    if (1..=4).contains(&speaker.split_whitespace().count())
                        && speaker
                            .split_whitespace()
                            .all(|w| w.starts_with(char::is_uppercase)) =>
                {
                    let named = named_in(speaker);
                    for &i in &named {
                        out.anywhere[i] = true;
                    }
                    // A chat line's speaker has no address to read.
                    (named.first().copied(), None, said)
                }
                _ => (sender, sender_org, line),
            };
            for sentence in said.split(['.', '!', '?', ';']) {
                if sentence.trim().is_empty() {
                    continue;
                }
                let named = named_in(sentence);
                for &i in &named {
                    out.anywhere[i] = true;
                }
                let first_person = crate::text::words(sentence)
                    .any(|w| matches!(w, "I" | "me" | "my" | "Me" | "My"));
                // "US" in capitals is a country, not "us".
                let we = crate::text::words(sentence)
                    .any(|w| matches!(w, "we" | "We" | "our" | "Our" | "us" | "ours"));
                out.sentences.push(Sentence {
                    text: sentence,
                    named,
                    writer,
                    first_person,
                    org,
                    we,
                });
            }
        }
        out.names = names;
        out
    }

    /// Whether some sentence states something of `a` and `b` together:
    /// it names one and speaks of the other ([`Sentence::speaks_of`]: names
    /// it too, or is written by it in the first person, or by its people
    /// as "we"). A mention the episode does not name
    /// at all (the model took it from a previous episode, "signed it
    /// yesterday") cannot be judged, and passes.
    fn pair_stated(&self, a: usize, b: usize) -> bool {
        if !self.anywhere[a] || !self.anywhere[b] {
            return true;
        }
        self.sentences.iter().any(|s| {
            (s.named.contains(&a) || s.named.contains(&b)) && s.speaks_of(a) && s.speaks_of(b)
        })
    }

    /// The day the episode ends the relationship between `a` and `b`, read
    /// from a sentence about the pair alone ([`Self::about_pair`]: it
    /// names one of them and no third, and speaks of the other, by name,
    /// as its writer's "I", or as the writer's organisation's "we"). The
    /// day is the one an end word gives ([`stated_end`]: "ends tonight",
    /// "left on Friday", "no longer … as of 1 May", "until 23:59 UTC on
    /// that day", that day being the last date written before); an end word without a day is not read, since a
    /// sentence about the pair may say something else has ended ("Beatrix
    /// at Relaywave confirmed that nothing was left in their queue"). Small
    /// models restate "Today is Hamid's last day: his contract with
    /// Tidewell ends tonight" as "Hamid works for Tidewell", leaving the
    /// end behind; a sentence that also names a third entity ("Priya's
    /// contract with Acme ended in February and she joined Brightline")
    /// may be about another relationship and is not read.
    fn pair_end(&self, a: usize, b: usize, reference: DateTime<Utc>) -> Option<NaiveDate> {
        let today = reference.date_naive();
        self.about_pair_at(a, b)
            .find_map(|k| self.end_in(k, today))
            .or_else(|| self.handed_over(a, b, today))
            .or_else(|| self.handed_over(b, a, today))
    }

    /// The day the episode says someone takes `thing` over from `giver`,
    /// which ends the giver's relationship with it: "Sofia takes over my
    /// Harbour Gateway on-call shifts from 3 March" (written by the giver),
    /// "Ingrid takes over Priya's account", "… takes over Harbour Gateway
    /// from Tomás". The one taking over is the verb's subject: the giver
    /// and the thing are named after "take(s) over". The day is the one a
    /// start word gives ("from 3 March"), else the one the sentence
    /// writes ("on 10 March"); else, when the sentence says
    /// "that day" or "then", the last date the episode wrote before it;
    /// else the episode's day. Small models write such a sentence as the
    /// new holder's fact alone, or as the giver's current one.
    fn handed_over(&self, giver: usize, thing: usize, today: NaiveDate) -> Option<NaiveDate> {
        self.handover(giver, thing, today).map(|(_, day)| day)
    }

    /// [`Self::handed_over`] with the sentence that says it, by number.
    fn handover(&self, giver: usize, thing: usize, today: NaiveDate) -> Option<(usize, NaiveDate)> {
        self.sentences.iter().enumerate().find_map(|(k, s)| {
            if !s.named.contains(&thing) {
                return None;
            }
            let words: Vec<&str> = crate::text::words(s.text).collect();
            let lower: Vec<String> = words.iter().map(|w| w.to_lowercase()).collect();
            let verb = lower.windows(2).position(|w| {
                matches!(
                    w[0].as_str(),
                    "take" | "takes" | "took" | "taking" | "taken"
                ) && w[1] == "over"
            })?;
            let after = verb + 2;
            self.names[thing].in_words(&words[after..])?;
            let rest = &lower[after..];
            let gives = if s.writer == Some(giver) && !s.named.contains(&giver) {
                rest.iter().any(|w| w == "my" || w == "me")
            } else {
                // "Priya's account" or "from Tomás", after the verb.
                self.names[giver]
                    .in_words(&words[after..])
                    .is_some_and(|(start, end)| {
                        rest.get(end).is_some_and(|w| w == "s")
                            || start > 0 && rest[start - 1] == "from"
                    })
            };
            if !gives {
                return None;
            }
            Some((k, self.day_of(k, today).unwrap_or(today)))
        })
    }

    /// The day sentence `k` says something happens: the one a start word
    /// gives ("from 3 March"), else the date it writes ("on 10 March"),
    /// else, when it says "that day" or "then", the last date the episode
    /// wrote before it.
    fn day_of(&self, k: usize, today: NaiveDate) -> Option<NaiveDate> {
        let text = self.sentences[k].text;
        stated_start(text, today)
            .or_else(|| crate::values::last_date(text, today))
            .or_else(|| {
                let then = crate::text::words(text).any(|w| w.eq_ignore_ascii_case("then"));
                (refers_back(text) || then)
                    .then(|| self.date_before(k, today))
                    .flatten()
            })
    }

    /// The pairs of mentions a sentence is about alone (it speaks of
    /// exactly two, [`Sentence::speaks_of`], and names one of them at
    /// least) and says their relationship ends, with the day it ends
    /// ([`stated_end_after`], "that day" read back as in
    /// [`Self::pair_end`]) and the sentence: the first such sentence of
    /// each pair, in episode order, the pair's lower number first.
    fn stated_pair_ends(&self, today: NaiveDate) -> Vec<(usize, usize, NaiveDate, &'a str)> {
        let mut out: Vec<(usize, usize, NaiveDate, &'a str)> = Vec::new();
        for (k, s) in self.sentences.iter().enumerate() {
            // A writer's "I" and "we" alone do not make a sentence about
            // the writer and their organisation.
            if s.named.is_empty() {
                continue;
            }
            let &[a, b] = s.spoken().as_slice() else {
                continue;
            };
            if out.iter().any(|&(x, y, _, _)| (x, y) == (a, b)) {
                continue;
            }
            if let Some(day) = self.end_in(k, today) {
                out.push((a, b, day, s.text));
            }
        }
        out
    }

    /// The day sentence `k` says a relationship ends ([`stated_end_after`]),
    /// its "that day" read as the last date written before it.
    fn end_in(&self, k: usize, today: NaiveDate) -> Option<NaiveDate> {
        let text = self.sentences[k].text;
        let earlier = refers_back(text)
            .then(|| self.date_before(k, today))
            .flatten();
        stated_end_after(text, today, earlier)
    }

    /// Whether the episode says `mover` moves to `to`: a sentence about
    /// the pair alone ([`Self::about_pair_at`]) names `mover` (or has it
    /// speak as "I" or "we") before a verb of moving ("moves", "switched",
    /// "migrating", "transfers", optionally "over") followed by "to" and
    /// `to`'s name, at most two words on ("Notification Hub moves to
    /// Skylark on 1 July", "Priya transfers to the Data team", "we
    /// switched over to Skylark"). Moving to one thing is leaving the one
    /// before: resolution ends the mover's earlier relationships of the
    /// same family with things of `to`'s type (a supplier for a supplier).
    /// Returns the sentence, by number.
    fn moved_to(&self, mover: usize, to: usize) -> Option<usize> {
        self.about_pair_at(mover, to).find(|&k| {
            let s = &self.sentences[k];
            let words: Vec<&str> = crate::text::words(s.text).collect();
            let lower: Vec<String> = words.iter().map(|w| w.to_lowercase()).collect();
            (0..lower.len()).any(|verb| {
                if !is_moving_verb(&lower[verb]) {
                    return false;
                }
                let mut at = verb + 1;
                if lower.get(at).is_some_and(|w| w == "over") {
                    at += 1;
                }
                if lower.get(at).is_none_or(|w| w != "to") {
                    return false;
                }
                let subject = match verb.checked_sub(1).map(|i| lower[i].as_str()) {
                    Some("i") => s.first_person && s.writer == Some(mover),
                    Some("we") => s.we && s.org == Some(mover),
                    _ => self.names[mover].in_words(&words[..verb]).is_some(),
                };
                subject
                    && self.names[to]
                        .in_words(&words[at + 1..])
                        .is_some_and(|(start, _)| start <= 2)
            })
        })
    }

    /// The day the episode starts the relationship between `a` and `b`,
    /// read from a sentence about the pair alone ([`Self::about_pair`])
    /// by its start word ([`stated_start`]): "From 1 July 2025 Notification
    /// Hub sends every SMS through Skylark Messaging" starts the pair on 1
    /// July, which the model's "Skylark Messaging supplies Notification
    /// Hub" does not say.
    fn pair_start(&self, a: usize, b: usize, today: NaiveDate) -> Option<NaiveDate> {
        self.about_pair(a, b)
            .find_map(|text| stated_start(text, today))
    }

    /// The last date written before sentence `k`: what its "that day"
    /// refers back to.
    fn date_before(&self, k: usize, today: NaiveDate) -> Option<NaiveDate> {
        self.sentences[..k]
            .iter()
            .rev()
            .find_map(|p| crate::values::last_date(p.text, today))
    }

    /// The sentences about `a` and `b` alone: each names one of them and
    /// no other mention, and speaks of both ([`Sentence::speaks_of`]).
    fn about_pair(&self, a: usize, b: usize) -> impl Iterator<Item = &'a str> + '_ {
        self.about_pair_at(a, b).map(|k| self.sentences[k].text)
    }

    /// Where [`Self::about_pair`]'s sentences are, by number.
    fn about_pair_at(&self, a: usize, b: usize) -> impl Iterator<Item = usize> + '_ {
        self.sentences.iter().enumerate().filter_map(move |(k, s)| {
            let only_pair = s.named.iter().all(|&i| i == a || i == b);
            // At least one is named: a writer's "I" and "we" alone do not
            // make a sentence about the writer and their organisation.
            let named = s.named.contains(&a) || s.named.contains(&b);
            (only_pair && named && s.speaks_of(a) && s.speaks_of(b)).then_some(k)
        })
    }
}

/// Whether `word` (in lower case) is a form of a verb of moving from one
/// thing to another: move, switch, migrate, transfer.
fn is_moving_verb(word: &str) -> bool {
    matches!(
        word,
        "move"
            | "moves"
            | "moved"
            | "moving"
            | "switch"
            | "switches"
            | "switched"
            | "switching"
            | "migrate"
            | "migrates"
            | "migrated"
            | "migrating"
            | "transfer"
            | "transfers"
            | "transferred"
            | "transferring"
    )
}

/// The start of a fact whose text states none, when the model is not
/// asked for it (`extract.fact_start = "text"`): the episode's time, which
/// is when the fact is known to hold, unless the fact had ended by then
/// (its start is then unknown).
fn default_start(
    invalid_at: Option<DateTime<Utc>>,
    reference: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    invalid_at
        .is_none_or(|end| end > reference)
        .then_some(reference)
}

/// The instant of a day a fact's time is given as: the episode's own
/// time on the episode's day, so that two episodes of one day keep their
/// order (a move in the afternoon after a join that morning), else the
/// day's start.
fn on_day(day: NaiveDate, reference: DateTime<Utc>) -> DateTime<Utc> {
    if day == reference.date_naive() {
        reference
    } else {
        day.and_time(NaiveTime::MIN).and_utc()
    }
}

/// A date or time a model wrote for a fact: the schema asks for dates
/// without a time of day, which [`on_day`] places; a time the model did
/// write is kept. `None` when nothing parseable was written.
fn written_time(v: Option<&str>, reference: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let t = parse_time(v).ok().flatten()?;
    let date_only = v.is_some_and(|v| v.trim().len() == 10);
    Some(if date_only {
        on_day(t.date_naive(), reference)
    } else {
        t
    })
}

/// A fact's `valid_at` and `invalid_at` from the start and end it was
/// given (by the model, or the start by its sentence), the fact's sentence
/// and, when both leave the end out, `episode_end` (the end the episode
/// states for the pair, [`Sentences::pair_end`]), at an episode written at
/// `reference`.
fn fact_times(
    mut valid_at: Option<DateTime<Utc>>,
    mut invalid_at: Option<DateTime<Utc>>,
    text: &str,
    episode_end: impl FnOnce() -> Option<NaiveDate>,
    reference: DateTime<Utc>,
) -> (Option<DateTime<Utc>>, Option<DateTime<Utc>>) {
    let end_written = invalid_at.is_some();
    let ends = crate::text::states_an_end(text);
    if valid_at.is_some() && invalid_at == valid_at && !ends {
        // One moment for both, as the model wrote them, is an event
        // ("signed on"), not a relationship that ended the moment it began.
        invalid_at = None;
    }
    if invalid_at.is_none() {
        // "On contract until the end of March": the fact's sentence, or
        // the episode's about the pair, gives an end the model left out.
        // Else, when the text says it ended, it had ended by the
        // episode's time.
        invalid_at = stated_end(text, reference.date_naive())
            .or_else(episode_end)
            .map(|day| on_day(day, reference))
            .or(ends.then_some(reference));
        if invalid_at.is_some() && valid_at == invalid_at {
            // A start at that very time is the prompt's default for a
            // current fact, not a start.
            valid_at = None;
        }
    }
    if let (Some(v), Some(i)) = (valid_at, invalid_at)
        && i < v
    {
        if !end_written && v == reference {
            // The text's end before a start at the episode's own time: that
            // start is the prompt's default for a current fact ("Sofia is
            // no longer on it, since she left on Friday", written Monday).
            valid_at = None;
        } else {
            invalid_at = None;
        }
    }
    (valid_at, invalid_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relation_types_become_screaming_snake_case() {
        assert_eq!(relation_type_of("works for"), "WORKS_FOR");
        assert_eq!(relation_type_of("signed-by"), "SIGNED_BY");
        assert_eq!(relation_type_of("EMPLOYED_BY"), "EMPLOYED_BY");
        assert_eq!(relation_type_of("3rd party of"), "R_3RD_PARTY_OF");
        assert_eq!(relation_type_of("  "), "");
    }

    /// The ontology of an `[ontology]` table's TOML.
    fn ontology(text: &str) -> Ontology {
        let spec: crate::ontology::OntologySpec = toml::from_str(text).expect("ontology spec");
        Ontology::try_from(&spec).expect("valid ontology")
    }

    fn hr() -> Ontology {
        ontology(
            r#"
            [[entity_types]]
            name = "Person"
            description = "A person."
            [[entity_types]]
            name = "Company"
            description = "A company."
            [[entity_types]]
            name = "Team"
            description = "A team."
            [[edge_types]]
            name = "WORKS_FOR"
            description = "Works for a company."
            source_targets = [{ source = "Person", target = "Company" }]
            [[edge_types]]
            name = "CONTRACTS_FOR"
            description = "Works for a company under contract."
            source_targets = [{ source = "Person", target = "Company" }]
            [[edge_types]]
            name = "RESPONSIBLE_FOR"
            description = "Answers for something."
            source_targets = [{ source = "Person", target = "Team" }, { source = "Team", target = "Company" }]
            [edge_type_hierarchy]
            WORKS_FOR = { CONTRACTS_FOR = {} }
            "#,
        )
    }

    #[test]
    fn each_entity_type_offers_only_its_own_optional_properties() {
        let ontology = ontology(
            r#"
            [[entity_types]]
            name = "Person"
            description = "A person."
            properties = [
              { name = "email", type = "text", pattern = '^[^@ ]{1,64}@[^@ ]{1,64}$' },
              { name = "title", type = "text" },
            ]
            [[entity_types]]
            name = "Company"
            description = "A company."
            properties = [{ name = "domain", type = "text" }]
            [[entity_types]]
            name = "Team"
            description = "A team."
            "#,
        );
        let schema = entity_schema(&ontology, &ExtractSpec::default());
        let shapes = schema["properties"]["entities"]["items"]["anyOf"]
            .as_array()
            .expect("one shape per type");
        let of = |t: &str| {
            shapes
                .iter()
                .find(|s| s["properties"]["type"]["enum"] == json!([t]))
                .unwrap_or_else(|| panic!("no shape for {t}"))
        };
        let person = &of("Person")["properties"]["attributes"];
        let keys: Vec<&String> = person["properties"]
            .as_object()
            .expect("keys")
            .keys()
            .collect();
        assert_eq!(keys, ["email", "title"]);
        assert!(
            person.get("required").is_none(),
            "every property is optional"
        );
        assert_eq!(
            person["properties"]["email"]["pattern"],
            json!("^[^@ ]{1,64}@[^@ ]{1,64}$")
        );
        assert_eq!(
            person["properties"]["title"]["maxLength"],
            json!(VALUE_MAX_CHARS)
        );
        let company = &of("Company")["properties"]["attributes"]["properties"];
        assert_eq!(company.as_object().map(|o| o.len()), Some(1));
        // A type without properties, and the generic Entity, have no
        // attributes to fill in; no shape requires them.
        assert!(of("Team")["properties"].get("attributes").is_none());
        assert!(of(ENTITY_LABEL)["properties"].get("attributes").is_none());
        for s in shapes {
            assert_eq!(s["required"], json!(["name", "type"]));
        }
    }

    #[test]
    fn asked_properties_narrow_what_the_entity_call_offers_and_describes() {
        let ontology = ontology(
            r#"
            [[entity_types]]
            name = "Person"
            description = "A person."
            properties = [
              { name = "email", type = "text", description = "Mail address." },
              { name = "title", type = "text", description = "Job title." },
            ]
            identity_properties = ["email"]
            [[entity_types]]
            name = "Company"
            description = "A company."
            properties = [{ name = "industry", type = "text" }]
            "#,
        );
        let offered = |asked: AskedProperties| {
            let spec = ExtractSpec {
                properties: asked,
                ..ExtractSpec::default()
            };
            let schema = entity_schema(&ontology, &spec);
            let mut keys: Vec<String> = Vec::new();
            for shape in schema["properties"]["entities"]["items"]["anyOf"]
                .as_array()
                .expect("shapes")
            {
                if let Some(props) = shape["properties"]["attributes"]["properties"].as_object() {
                    keys.extend(props.keys().cloned());
                }
            }
            let prompt = system_prompt(&ontology, &spec);
            let task = entity_task(&spec);
            (
                keys,
                prompt.contains("title (text)"),
                task.contains("attributes"),
            )
        };
        assert_eq!(
            offered(AskedProperties::All),
            (
                vec!["email".into(), "title".into(), "industry".into()],
                true,
                true
            )
        );
        assert_eq!(
            offered(AskedProperties::Identity),
            (vec!["email".into()], false, true)
        );
        assert_eq!(offered(AskedProperties::None), (Vec::new(), false, false));
    }

    #[test]
    fn an_identity_value_belongs_to_the_name_written_nearest_to_it() {
        let ontology = ontology(
            r#"
            [[entity_types]]
            name = "Person"
            description = "A person."
            properties = [{ name = "email", type = "text" }, { name = "role", type = "text" }]
            identity_properties = ["email"]
            "#,
        );
        let content = "From: Priya Raman <priya@acme.example>\n\
                       To: Dana Whitcombe <dana@northwind.example>\n\
                       Cc: Felix <felix@northwind.example>\n\nHi Dana, see below.\n\
                       Grace Adeyemi <grace.adeyemi@acme.example>, VP at Acme\n\
                       Signed, D. Whitcombe";
        let person = |name: &str, email: &str| Mention {
            episode_id: "e".into(),
            name: name.into(),
            chain: vec!["Person".into()],
            attributes: serde_json::from_value(json!({"email": email, "role": "buyer"}))
                .expect("map"),
            context: String::new(),
            mapped: false,
        };
        let mut mentions = vec![
            // Dana's address copied onto Priya: taken off.
            person("Priya Raman", "dana@northwind.example"),
            // Her own: kept.
            person("Dana Whitcombe", "dana@northwind.example"),
            // Not written in this episode (a context episode's): kept.
            person("Felix", "felix@old.example"),
            // The name as given is not written: nothing to measure, kept.
            person("Felix Oyelaran", "felix@northwind.example"),
            // "Acme" inside the address is not a name next to it.
            person("Grace Adeyemi", "grace.adeyemi@acme.example"),
            person("Acme", ""),
            // A domain written only inside addresses is not judged.
            person("Northwind", "northwind.example"),
            // Nearest to "Dana Whitcombe", but sharing her surname: may be
            // her, left to resolution.
            person("D. Whitcombe", "dana@northwind.example"),
            // A value written as the name itself is the mention's own.
            person("priya@acme.example", "priya@acme.example"),
        ];
        let taken = misplaced_identity_values(&ontology, &content.to_lowercase(), &mut mentions);
        assert_eq!(taken.len(), 1, "{taken:?}");
        assert_eq!(taken[0].0, 0);
        assert!(taken[0].1.contains("next to `Dana Whitcombe`"), "{taken:?}");
        assert!(mentions[0].attributes.get("email").is_none());
        assert_eq!(mentions[0].attributes["role"], "buyer", "other values stay");
        for m in &mentions[1..] {
            assert!(m.attributes.get("email").is_some(), "{}", m.name);
        }
    }

    #[test]
    fn a_one_word_role_the_type_descriptions_write_in_lower_case_is_not_a_name() {
        let onto = ontology(
            r#"
            [[entity_types]]
            name = "Company"
            description = "A business such as a customer or a supplier, e.g. Globex."
            [[edge_types]]
            name = "EMPLOYS"
            description = "A company employs a person."
            "#,
        );
        let roles = role_words(&onto);
        for role in ["Customer", "the Supplier", "PERSON"] {
            assert!(is_role_word(&roles, role), "{role}");
        }
        // An example name, a longer name holding a role, or a word the
        // descriptions do not use.
        for name in ["Globex", "Customer Success Team", "Acme"] {
            assert!(!is_role_word(&roles, name), "{name}");
        }
    }

    #[test]
    fn the_types_of_people_are_found_by_name_or_description_with_their_subtypes() {
        let onto = ontology(
            r#"
            [[entity_types]]
            name = "Staffer"
            description = "A named individual. Not a team."
            [[entity_types]]
            name = "Engineer"
            description = "Writes code."
            [[entity_types]]
            name = "Contact"
            description = "Someone we write to."
            [[entity_types]]
            name = "Team"
            description = "A group of engineers. Not a person."
            [[entity_types]]
            name = "Product"
            description = "A thing we sell, e.g. Secrets Manager."
            [entity_type_hierarchy]
            Staffer = { Engineer = {} }
            "#,
        );
        let people = person_types(&onto);
        let mut found: Vec<&str> = people.iter().map(String::as_str).collect();
        found.sort_unstable();
        // "Not a person" is in Team's second sentence, not its first.
        assert_eq!(found, ["Contact", "Engineer", "Staffer"]);
    }

    #[test]
    fn a_type_written_as_words_is_a_type_word() {
        assert_eq!(type_word("Order Form"), type_word("OrderForm"));
        assert_eq!(type_word("purchase-order"), type_word("PurchaseOrder"));
        assert_ne!(type_word("Order Form OF-601"), type_word("OrderForm"));
        let onto = ontology(
            r#"
            [[entity_types]]
            name = "MSA"
            description = "A master services agreement."
            [[entity_types]]
            name = "OrderForm"
            description = "An order form."
            [[entity_types]]
            name = "Team"
            description = "A team."
            "#,
        );
        let words = TypeWords::new(&onto);
        let is_type = |name: &str| words.spelled_by(name);
        assert!(
            is_type("Master Services Agreement"),
            "an acronym type spelled out"
        );
        assert!(is_type("order form"));
        assert!(!is_type("Acme MSA"));
        assert!(!is_type("Mutual Supply Addendum 2"), "a name with a number");
        assert!(!is_type("Maria Santos"), "initials that spell no type");
        assert!(
            !is_type("Tidewell East Asia Markets"),
            "initials match acronym types only"
        );
        assert!(is_type("OF"), "the initials of a type of two words");
        assert!(is_type("OFs"));
        assert!(!is_type("Of"), "initials are written in capitals");
        assert!(!is_type("T"), "a type of one word has no initials");
        let typed = |name: &'static str| words.type_and_code(name);
        assert_eq!(
            typed("order form AOF-2024-031"),
            Some(("OrderForm", "AOF-2024-031"))
        );
        assert_eq!(typed("ORDER FORM OF-601."), Some(("OrderForm", "OF-601")));
        assert_eq!(typed("MSA M-2024-1"), Some(("MSA", "M-2024-1")));
        assert_eq!(typed("order form 2024"), None, "a number is not a code");
        assert_eq!(typed("Acme order form OF-601"), None, "more than a type");
        assert_eq!(typed("Ridgeback 14"), None);
        assert_eq!(typed("OF-601"), None, "a code alone");
        let before = |code: &str, text: &str| words.written_before(code, text);
        assert_eq!(
            before(
                "QF-0087",
                "Thank you for signing order form QF-0087 yesterday!"
            ),
            Some("OrderForm")
        );
        assert_eq!(
            before(
                "QF-0087",
                "Quillfeather Software. ORDER FORM QF-0087. Customer: …"
            ),
            Some("OrderForm"),
            "in capitals, the code at a sentence's end"
        );
        assert_eq!(
            before("M-2024-1", "Under M-2024-1; see MSA M-2024-1."),
            Some("MSA"),
            "a place that writes no type does not count"
        );
        assert_eq!(
            before("X-12", "order form X-12 replaces MSA X-12"),
            None,
            "two types for one code"
        );
        assert_eq!(
            before("OF-601", "the order form OF-6012"),
            None,
            "another code"
        );
        assert_eq!(
            before("OF-601", "order form:OF-601"),
            None,
            "not right before it"
        );
        assert_eq!(before("OF-601", "We signed OF-601."), None);
        assert_eq!(
            words.introduced_codes(
                "ORDER FORM AOF-2024-031. It falls under MSA M-2024-1, not order \
                 form X-12 or MSA X-12; see AOF-2024-031 and PO-77."
            ),
            [("AOF-2024-031", "OrderForm"), ("M-2024-1", "MSA")],
            "each code once; none where two types disagree or none is written"
        );
    }

    #[test]
    fn attributes_parse_as_an_object_or_as_name_value_pairs() {
        let object: EntityOut = serde_json::from_str(
            r#"{"name": "Dana", "type": "Person", "attributes": {"title": "CFO", "email": null}}"#,
        )
        .expect("object form");
        let pairs = object.attributes.pairs();
        assert_eq!(pairs.len(), 1);
        assert_eq!(
            (pairs[0].name.as_str(), pairs[0].value.as_str()),
            ("title", "CFO")
        );
        let list: EntityOut = serde_json::from_str(
            r#"{"name": "Dana", "type": "Person", "attributes": [{"name": "title", "value": "CFO"}]}"#,
        )
        .expect("list form");
        assert_eq!(list.attributes.pairs().len(), 1);
        let none: EntityOut =
            serde_json::from_str(r#"{"name": "Dana", "type": "Person"}"#).expect("no attributes");
        assert!(none.attributes.pairs().is_empty());
    }

    fn mention(name: &str, kind: &str) -> Mention {
        Mention {
            episode_id: "e".into(),
            name: name.into(),
            chain: vec![kind.into()],
            attributes: Map::new(),
            context: String::new(),
            mapped: false,
        }
    }

    /// (relation, sources, targets) of each branch of a fact item schema.
    fn branches(schema: &Value) -> Vec<(String, Vec<String>, Vec<String>)> {
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        schema["anyOf"]
            .as_array()
            .expect("anyOf")
            .iter()
            .map(|b| {
                let p = &b["properties"];
                let relation = strings(&p["relation_type"]["enum"])
                    .pop()
                    .unwrap_or_else(|| "(free)".into());
                (
                    relation,
                    strings(&p["source"]["enum"]),
                    strings(&p["target"]["enum"]),
                )
            })
            .collect()
    }

    #[test]
    fn a_fact_schema_offers_a_declared_type_only_for_endpoints_it_allows() {
        let onto = hr();
        let mentions = [
            mention("Dana", "Person"),
            mention("Acme", "Company"),
            mention("Globex", "Company"),
        ];
        let folded = ExtractSpec {
            fold_edge_subtypes: true,
            ..ExtractSpec::default()
        };
        let got = branches(&fact_item_schema(&onto, &folded, &mentions));
        let (dana, companies) = (
            vec!["Dana".to_string()],
            vec!["Acme".to_string(), "Globex".into()],
        );
        let all: Vec<String> = mentions.iter().map(|m| m.name.clone()).collect();
        assert_eq!(
            got,
            vec![
                ("WORKS_FOR".into(), dana.clone(), companies.clone()),
                ("CONTRACTS_FOR".into(), dana, companies),
                // RESPONSIBLE_FOR needs a team on one side: no branch.
                ("(free)".into(), all.clone(), all),
            ]
        );
        let top = ExtractSpec::default();
        let names: Vec<String> = branches(&fact_item_schema(&onto, &top, &mentions))
            .into_iter()
            .map(|b| b.0)
            .collect();
        assert_eq!(
            names,
            ["WORKS_FOR", "(free)"],
            "subtypes are left to the walk"
        );
    }

    #[test]
    fn a_fact_start_read_from_the_text_is_not_asked_of_the_model() {
        let onto = hr();
        let mentions = [mention("Dana", "Person"), mention("Acme", "Company")];
        let keys = |spec: &ExtractSpec| -> Vec<Vec<String>> {
            let schema = fact_item_schema(&onto, spec, &mentions);
            let branches = schema["anyOf"].as_array().expect("branches").clone();
            branches
                .iter()
                .map(|b| {
                    let props: Vec<String> = b["properties"]
                        .as_object()
                        .expect("properties")
                        .keys()
                        .cloned()
                        .collect();
                    let required: Vec<String> =
                        serde_json::from_value(b["required"].clone()).expect("required");
                    assert_eq!(props, required, "every property is required");
                    props
                })
                .collect()
        };
        for props in keys(&ExtractSpec::default()) {
            assert!(props.contains(&"valid_at".to_string()), "{props:?}");
        }
        let text = ExtractSpec {
            fact_start: FactStart::Text,
            ..ExtractSpec::default()
        };
        for props in keys(&text) {
            assert_eq!(
                props,
                ["source", "relation_type", "target", "fact", "invalid_at"]
            );
        }
        // ("invalid_at" holds "valid_at": look for the rule's own line.)
        assert!(fact_task(&onto, &ExtractSpec::default(), false).contains("- valid_at:"));
        assert!(!fact_task(&onto, &text, false).contains("- valid_at:"));
    }

    #[test]
    fn a_fact_without_a_stated_start_starts_at_its_episode_unless_it_had_ended() {
        let reference = parse_time(Some("2025-02-10T09:15:00Z"))
            .expect("time")
            .expect("some");
        let t = |s: &str| parse_time(Some(s)).expect("time").expect("some");
        assert_eq!(default_start(None, reference), Some(reference));
        assert_eq!(
            default_start(Some(t("2025-03-31")), reference),
            Some(reference),
            "ends later: known to hold from the episode on"
        );
        assert_eq!(default_start(Some(reference), reference), None);
        assert_eq!(default_start(Some(t("2024-12-31")), reference), None);
    }

    #[test]
    fn facts_grouped_by_source_offer_only_what_that_entity_can_start() {
        let onto = hr();
        let mentions = [
            mention("Dana", "Person"),
            mention("Acme", "Company"),
            mention("Globex", "Company"),
        ];
        let spec = ExtractSpec::default();
        let dana = fact_branches(&onto, &spec, &mentions, Some(&mentions[0]));
        let shapes: Vec<(String, Vec<String>)> = dana
            .iter()
            .map(|b| {
                let relation = b["properties"]["relation_type"]["enum"][0]
                    .as_str()
                    .unwrap_or("(free)")
                    .to_string();
                let targets = b["properties"]["target"]["enum"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                (relation, targets)
            })
            .collect();
        assert_eq!(
            shapes,
            vec![
                (
                    "WORKS_FOR".to_string(),
                    vec!["Acme".to_string(), "Globex".into()]
                ),
                (
                    "(free)".to_string(),
                    vec!["Acme".to_string(), "Globex".into()]
                ),
            ],
            "never itself as a target"
        );
        // The source is the key, not a property; the rest keep their order
        // (a model writes them in schema order: the end date last).
        let keys: Vec<&String> = dana[0]["properties"]
            .as_object()
            .expect("props")
            .keys()
            .collect();
        assert_eq!(
            keys,
            ["relation_type", "target", "fact", "valid_at", "invalid_at"]
        );
        assert_eq!(dana[0]["required"].as_array().map(Vec::len), Some(5));
        // A company starts no declared type here: only the free shape.
        let acme = fact_branches(&onto, &spec, &mentions, Some(&mentions[1]));
        assert_eq!(acme.len(), 1);
        assert!(
            acme[0]["properties"]["relation_type"]
                .get("pattern")
                .is_some()
        );
        // A reply grouped by source reads as facts with their source.
        let reply: FactReply = serde_json::from_value(json!({"facts": {
            "Dana": [{"relation_type": "WORKS_FOR", "target": "Acme", "fact": "Dana works for Acme.",
                      "valid_at": null, "invalid_at": null}, {"target": "Acme"}],
            "Acme": []
        }}))
        .expect("grouped reply");
        let (facts, notes) = reply.facts.into_list();
        assert_eq!(facts.len(), 1);
        assert_eq!(
            (facts[0].source.as_str(), facts[0].target.as_str()),
            ("Dana", "Acme")
        );
        assert_eq!(
            notes.len(),
            1,
            "the item without a fact's shape is noted: {notes:?}"
        );
    }

    #[test]
    fn the_free_relation_cannot_spell_a_declared_type() {
        let re = regex::Regex::new(FREE_RELATION_PATTERN).expect("pattern");
        assert!(re.is_match("works with") && re.is_match("reports to"));
        for declared in ["WORKS_FOR", "Works for", "works_for", ""] {
            assert!(!re.is_match(declared), "{declared}");
        }
        assert!(!re.is_match("a ".repeat(7).trim_end()), "at most six words");
    }

    #[test]
    fn a_relation_spelled_without_underscores_or_in_the_other_voice_is_the_declared_type() {
        let onto = ontology(
            r#"
            [[entity_types]]
            name = "Service"
            description = "A service."
            [[entity_types]]
            name = "Company"
            description = "A company."
            [[entity_types]]
            name = "Team"
            description = "A team."
            [[edge_types]]
            name = "SUPPLIED_BY"
            description = "A service uses a vendor."
            source_targets = [{ source = "Service", target = "Company" }]
            [[edge_types]]
            name = "OWNS"
            description = "A team owns a service."
            source_targets = [{ source = "Team", target = "Service" }]
            "#,
        );
        let read = |r: &str| declared_spelling(&onto, &relation_type_of(r));
        assert_eq!(read("suppliedby"), Some(("SUPPLIED_BY".into(), false)));
        assert_eq!(read("SuppliedBy"), Some(("SUPPLIED_BY".into(), false)));
        assert_eq!(read("supplied"), Some(("SUPPLIED_BY".into(), true)));
        assert_eq!(read("supplies"), Some(("SUPPLIED_BY".into(), true)));
        assert_eq!(read("owned by"), Some(("OWNS".into(), true)));
        assert_eq!(read("supplied by"), None, "declared as written");
        assert_eq!(read("supplier of"), None, "no declared type spelled");
        assert_eq!(read("owned"), None, "OWNED_BY is not declared");
    }

    #[test]
    fn a_declared_type_that_does_not_fit_keeps_its_fact_under_one_that_does() {
        let onto = hr();
        let fit = |r: &str, s: &str, t: &str| fitting_relation(&onto, r, s, t);
        assert_eq!(
            fit("WORKS_FOR", "Person", "Company"),
            Some(("WORKS_FOR".into(), false))
        );
        assert_eq!(
            fit("WORKS_FOR", "Company", "Person"),
            Some(("WORKS_FOR".into(), true)),
            "a reversed direction is turned round"
        );
        assert_eq!(
            fit("CONTRACTS_FOR", "Company", "Company"),
            Some((GENERIC_RELATION.into(), false)),
            "neither the subtype nor its parent fits"
        );
        assert_eq!(
            fit("RESPONSIBLE_FOR", "Team", "Company"),
            Some(("RESPONSIBLE_FOR".into(), false)),
            "any pair of the list counts"
        );
        assert_eq!(
            fit("WORKS_WITH", "Company", "Company"),
            Some(("WORKS_WITH".into(), false))
        );
    }

    /// People, companies and services: WORKS_FOR, RESPONSIBLE_FOR with
    /// its kind ON_CALL_FOR, OWNS (person → service) and CALLS (service →
    /// company).
    fn people_and_services() -> Ontology {
        ontology(
            r#"
            [[entity_types]]
            name = "Person"
            description = "A person."
            [[entity_types]]
            name = "Company"
            description = "A company."
            [[entity_types]]
            name = "Service"
            description = "A running service."
            [[edge_types]]
            name = "WORKS_FOR"
            description = "Works for a company."
            source_targets = [{ source = "Person", target = "Company" }]
            [[edge_types]]
            name = "RESPONSIBLE_FOR"
            description = "Answers for a service."
            source_targets = [{ source = "Person", target = "Service" }]
            [[edge_types]]
            name = "ON_CALL_FOR"
            description = "Takes on-call shifts."
            source_targets = [{ source = "Person", target = "Service" }]
            [[edge_types]]
            name = "CALLS"
            description = "A service calls a company's API."
            source_targets = [{ source = "Service", target = "Company" }]
            [[edge_types]]
            name = "OWNS"
            description = "Owns a service."
            source_targets = [{ source = "Person", target = "Service" }]
            [edge_type_hierarchy]
            RESPONSIBLE_FOR = { ON_CALL_FOR = {} }
            "#,
        )
    }

    #[test]
    fn a_type_that_cannot_hold_its_endpoints_yields_to_the_one_its_words_write() {
        let onto = people_and_services();
        let written = |texts: &[&str]| types_written(&onto, texts);
        let fit = |r: &str, texts: &[&str], s: &str, t: &str| {
            fitting_relation_in(&onto, r, &written(texts), s, t)
        };
        let said = [
            "Kenji Mori works for Fare Engine.",
            "I'm no longer on-call for Fare Engine",
        ];
        assert_eq!(
            written(&said),
            ["WORKS_FOR", "ON_CALL_FOR"],
            "in declared order"
        );
        assert_eq!(
            fit("WORKS_FOR", &said, "Person", "Service"),
            Some(("ON_CALL_FOR".into(), false)),
            "the episode's words name the type that fits"
        );
        assert_eq!(
            fit("WORKS_FOR", &said, "Service", "Person"),
            Some(("ON_CALL_FOR".into(), true)),
            "turned round like any fit"
        );
        assert_eq!(
            fit(
                &relation_type_of("was on call for"),
                &["was on call for"],
                "Person",
                "Service"
            ),
            Some(("ON_CALL_FOR".into(), false)),
            "a free relation that writes a declared type is that type"
        );
        assert_eq!(
            fit("RESPONSIBLE_FOR", &said, "Person", "Service"),
            Some(("RESPONSIBLE_FOR".into(), false)),
            "a type that fits is kept: the subtype walk refines it"
        );
        assert_eq!(
            fit(
                "WORKS_FOR",
                &["Kenji works for Fare Engine."],
                "Person",
                "Service"
            ),
            Some((GENERIC_RELATION.into(), false)),
            "words of a type that cannot hold the endpoints do not count"
        );
        assert_eq!(
            fit(
                "WORKS_FOR",
                &["Kenji calls Fare Engine when he is on call for it."],
                "Person",
                "Service"
            ),
            Some(("ON_CALL_FOR".into(), false)),
            "CALLS cannot hold a person and a service: one family fits"
        );
        assert_eq!(
            fit(
                "WORKS_FOR",
                &["Kenji is responsible for Fare Engine and on call for it."],
                "Person",
                "Service"
            ),
            Some(("ON_CALL_FOR".into(), false)),
            "a type and its subtype: the subtype"
        );
        assert_eq!(
            fit(
                "WORKS_FOR",
                &["Kenji owns Fare Engine and is on call for it."],
                "Person",
                "Service"
            ),
            Some((GENERIC_RELATION.into(), false)),
            "two families: neither is chosen"
        );
    }

    #[test]
    fn a_declared_type_no_endpoint_order_or_parent_fits_is_misapplied() {
        let onto = hr();
        let misfit = |r: &str, s: &str, t: &str| {
            let (fitted, _) = fitting_relation(&onto, r, s, t).expect("a fit");
            misapplied(&onto, r, &fitted)
        };
        // "contracts for" between two companies: the free branch spelled a
        // declared type the endpoints cannot hold.
        assert!(misfit(
            &relation_type_of("contracts for"),
            "Company",
            "Company"
        ));
        // Turned round, or not a declared type: kept.
        assert!(!misfit("CONTRACTS_FOR", "Company", "Person"));
        assert!(!misfit("WORKS_WITH", "Company", "Company"));
        assert!(!misfit(GENERIC_RELATION, "Company", "Company"));
    }

    #[test]
    fn a_property_value_is_kept_only_when_the_text_writes_it() {
        let props = [
            PropertySpec {
                name: "email".into(),
                kind: PropertyType::Text,
                description: String::new(),
                may_change: true,
                pattern: Some("^[^@ ]+@[^@ ]+$".into()),
            },
            PropertySpec {
                name: "amount".into(),
                kind: PropertyType::Float,
                description: String::new(),
                may_change: false,
                pattern: None,
            },
            PropertySpec {
                name: "signed_on".into(),
                kind: PropertyType::Date,
                description: String::new(),
                may_change: false,
                pattern: None,
            },
        ];
        let evidence = Evidence::of(
            "Dana (Dana.Whitcombe@Northwind.test) signed on 1 March for USD 1,250.50.",
        );
        let given = |pairs: &[(&str, &str)]| -> Vec<AttributeOut> {
            pairs
                .iter()
                .map(|(n, v)| AttributeOut {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect()
        };
        let (kept, notes) = typed_attributes(
            &props,
            &given(&[
                ("email", "dana.whitcombe@northwind.test"),
                ("amount", "1250.5"),
                ("signed_on", "2025-03-01"),
            ]),
            &evidence,
        );
        assert_eq!(kept.len(), 3, "{kept:?}");
        assert!(notes.is_empty(), "{notes:?}");
        let (kept, notes) = typed_attributes(
            &props,
            &given(&[("email", "dwhitcombe@example.com"), ("amount", "1250")]),
            &evidence,
        );
        assert!(kept.is_empty(), "made-up values are not stored: {kept:?}");
        assert_eq!(notes.len(), 2);
        assert!(
            notes[0].contains("`email` = `dwhitcombe@example.com` is not written"),
            "{notes:?}"
        );
        // A patterned value is copied as written, not pieced together
        // from words of the text.
        let (kept, notes) = typed_attributes(
            &props,
            &given(&[("email", "dana@whitcombe.northwind")]),
            &Evidence::of("Dana Whitcombe of Northwind (Dana.Whitcombe@Northwind.test)"),
        );
        assert!(kept.is_empty(), "{kept:?}");
        assert!(notes[0].contains("is not written"), "{notes:?}");
        // Written in the text, but not of the property's shape.
        let (kept, notes) = typed_attributes(&props, &given(&[("email", "Dana")]), &evidence);
        assert!(kept.is_empty(), "{kept:?}");
        assert!(
            notes[0].contains("does not have the property's shape"),
            "{notes:?}"
        );
        // Whole words only: a fragment of a word is not the word.
        let (kept, _) = typed_attributes(&props, &given(&[("email", "orthwind")]), &evidence);
        assert!(kept.is_empty());
    }

    #[test]
    fn context_is_cut_around_the_name() {
        let text = format!(
            "{} Acme Corp sent PO-4471 {}",
            "a ".repeat(200),
            "b ".repeat(200)
        );
        let c = context_of(&text, "po-4471", 20);
        assert!(
            c.contains("PO-4471") && c.starts_with("… ") && c.ends_with(" …"),
            "{c}"
        );
        assert!(c.chars().count() < 80);
    }

    #[test]
    fn fact_times_take_the_episodes_time_on_its_day_and_an_end_the_sentence_states() {
        let reference = parse_time(Some("2025-02-10T09:15:00Z"))
            .expect("time")
            .expect("some");
        let t = |s: &str| parse_time(Some(s)).expect("time");
        let at = |v| written_time(v, reference);
        let times = |v, i, text| fact_times(at(v), at(i), text, || None, reference);
        // A date on the episode's day is the episode's time; a written
        // time, or another day, is kept.
        assert_eq!(
            times(Some("2025-02-10"), None, "Hamid works for Tidewell"),
            (Some(reference), None)
        );
        assert_eq!(
            times(
                Some("2025-02-10T08:00:00Z"),
                None,
                "Hamid works for Tidewell"
            ),
            (t("2025-02-10T08:00:00Z"), None)
        );
        assert_eq!(
            times(Some("2025-01-06"), None, "Hamid works for Tidewell"),
            (t("2025-01-06"), None)
        );
        // An end the sentence states and the model left out.
        assert_eq!(
            times(
                Some("2025-02-10"),
                None,
                "Hamid is on contract with Tidewell until the end of March."
            ),
            (Some(reference), t("2025-03-31"))
        );
        // One the model wrote wins.
        assert_eq!(
            times(
                None,
                Some("2025-03-28"),
                "Hamid is on contract until the end of March."
            ),
            (None, t("2025-03-28"))
        );
        // An end the sentence puts on the episode's own day: its time.
        assert_eq!(
            times(None, None, "Hamid's contract with Tidewell ends tonight"),
            (None, Some(reference))
        );
        // Ended with no date: at the episode's time, and a start at that
        // very time is dropped.
        assert_eq!(
            times(Some("2025-02-10"), None, "Hamid has left Tidewell"),
            (None, Some(reference))
        );
        // The episode's end for the pair, when the fact's sentence has none.
        let today = reference.date_naive();
        assert_eq!(
            fact_times(
                at(Some("2025-02-10")),
                at(None),
                "Hamid works for Tidewell",
                || Some(today),
                reference
            ),
            (None, Some(reference))
        );
        assert_eq!(
            fact_times(
                at(None),
                at(Some("2025-03-28")),
                "Hamid works for Tidewell",
                || panic!("not read when the model gave an end"),
                reference
            ),
            (None, t("2025-03-28"))
        );
        // An end before the episode's day, found in the text, drops a start
        // the model left at the episode's time (its default), not the end;
        // a start it dated otherwise keeps its fact live.
        let friday = || today.checked_sub_days(chrono::Days::new(3));
        assert_eq!(
            fact_times(
                at(Some("2025-02-10")),
                at(None),
                "Sofia is on the rotation",
                friday,
                reference
            ),
            (None, t("2025-02-07"))
        );
        assert_eq!(
            fact_times(
                at(Some("2025-02-08")),
                at(None),
                "Sofia is on the rotation",
                friday,
                reference
            ),
            (t("2025-02-08"), None)
        );
    }

    #[test]
    fn a_pair_is_stated_by_a_sentence_naming_both_or_by_its_writer_in_the_first_person() {
        let mention = |name: &str| mention(name, "Entity");
        let mentions = [
            mention("Dana Whitcombe"),
            mention("Acme Corp"),
            mention("Priya Raman"),
            mention("PO-1"),
        ];
        let stated = |content: &str, a, b| Sentences::new(content, &mentions).pair_stated(a, b);
        let chat =
            "Dana Whitcombe: Legal sent over the new Acme contract. Priya is leaving Acme Corp.";
        assert!(
            !stated(chat, 0, 1),
            "the speaker is not what the line is about"
        );
        assert!(stated(chat, 2, 1), "named together");
        assert!(stated(chat, 1, 2), "either order");
        let mail = "From: Priya Raman <priya@acme.example>\nTo: Dana Whitcombe <dana@nw.example>\n\
                    Subject: Acme Corp and you\n\nHi Dana,\n\nI joined Acme Corp in 2021. It resells laptops.";
        assert!(
            !stated(mail, 0, 1),
            "the recipient is only in the headers and the greeting"
        );
        assert!(stated(mail, 2, 1), "the sender's I");
        assert!(
            stated("Dana Whitcombe signed it yesterday.", 0, 3),
            "PO-1 is not named here at all: the model took it from a previous episode"
        );
        assert!(
            !stated(
                "Dana Whitcombe: I asked about PO-1. Acme Corp confirmed.",
                1,
                3
            ),
            "in different sentences"
        );
        assert!(
            stated("Dana Whitcombe: I asked about PO-1.", 0, 3),
            "the speaker's I"
        );
    }

    #[test]
    fn a_start_is_read_from_the_episodes_sentence_about_the_pair_alone() {
        let today = NaiveDate::from_ymd_opt(2025, 6, 10).expect("day");
        let mention = |name: &str| mention(name, "Entity");
        let mentions = [
            mention("Notification Hub"),
            mention("Skylark Messaging"),
            mention("Relaywave"),
        ];
        let text = "Target state. From 1 July 2025 Notification Hub sends every SMS through \
                    Skylark Messaging. It costs 15% less than Relaywave from 1 May.";
        let sentences = Sentences::new(text, &mentions);
        let start = |a, b| sentences.pair_start(a, b, today).map(|d| d.to_string());
        assert_eq!(start(0, 1).as_deref(), Some("2025-07-01"));
        assert_eq!(start(1, 0).as_deref(), Some("2025-07-01"), "either order");
        assert_eq!(
            start(0, 2),
            None,
            "Relaywave's sentence does not name the hub"
        );
    }

    #[test]
    fn the_only_relation_of_two_types_is_the_broadest_type_that_fits_them() {
        let onto = ontology(
            r#"
            [[entity_types]]
            name = "Person"
            description = "A person."
            [[entity_types]]
            name = "Service"
            description = "A service."
            [[entity_types]]
            name = "Company"
            description = "A company."
            [[entity_types]]
            name = "Ticket"
            description = "A ticket."
            [[edge_types]]
            name = "RESPONSIBLE_FOR"
            description = "Answers for a service."
            source_targets = [{ source = "Person", target = "Service" }]
            [[edge_types]]
            name = "ON_CALL_FOR"
            description = "Takes on-call shifts."
            source_targets = [{ source = "Person", target = "Service" }]
            [[edge_types]]
            name = "SUPPLIED_BY"
            description = "A service uses a vendor."
            source_targets = [{ source = "Service", target = "Company" }]
            [[edge_types]]
            name = "WORKS_FOR"
            description = "Works for a company."
            source_targets = [{ source = "Person", target = "Company" }]
            [[edge_types]]
            name = "SUED"
            description = "Took a company to court."
            source_targets = [{ source = "Person", target = "Company" }]
            [[edge_types]]
            name = "CAUSED_BY"
            description = "One ticket caused another."
            source_targets = [{ source = "Ticket", target = "Ticket" }]
            [edge_type_hierarchy]
            RESPONSIBLE_FOR = { ON_CALL_FOR = {} }
            "#,
        );
        let only = |a: &str, b: &str| only_relation(&onto, a, b);
        assert_eq!(
            only("Person", "Service"),
            Some(("RESPONSIBLE_FOR".into(), false)),
            "a family: its broadest type"
        );
        assert_eq!(
            only("Company", "Service"),
            Some(("SUPPLIED_BY".into(), true))
        );
        assert_eq!(only("Person", "Company"), None, "two families");
        assert_eq!(only("Ticket", "Ticket"), None, "either way round");
        assert_eq!(only("Person", "Ticket"), None, "none fits");
    }

    #[test]
    fn a_sentence_about_two_mentions_alone_states_when_their_relationship_ends() {
        let today = NaiveDate::from_ymd_opt(2025, 5, 12).expect("day");
        let mentions = [
            mention("Beatrix Holm", "Person"),
            mention("Relaywave Ltd", "Company"),
            mention("Notification Hub", "Service"),
            mention("Maya Okonjo", "Person"),
            mention("Fare Engine", "Service"),
        ];
        let mail = "From: Beatrix Holm <beatrix.holm@relaywave.com>\nTo: Maya Okonjo \
                    <maya@tidewell.io>\n\nDear Maya,\n\nThe contract was cancelled today, with \
                    effect from 30 June 2025. We will keep accepting messages from your \
                    Notification Hub until 23:59 UTC on that day. Maya Okonjo stays on Fare \
                    Engine until Friday, and Notification Hub until 1 July. Notification Hub \
                    will run until 2 July.";
        let sentences = Sentences::new(mail, &mentions);
        let ends: Vec<(usize, usize, String)> = sentences
            .stated_pair_ends(today)
            .into_iter()
            .map(|(a, b, day, _)| (a, b, day.to_string()))
            .collect();
        assert_eq!(
            ends,
            vec![(1, 2, "2025-06-30".to_string())],
            "the writer's company as \"we\"; not a sentence of three mentions, nor of one"
        );
        // Only the writer's "I" and their company's "we": no name written.
        let own = "From: Beatrix Holm <beatrix.holm@relaywave.com>\n\nWe keep my desk open until 30 June.";
        let own = Sentences::new(own, &mentions);
        assert!(own.stated_pair_ends(today).is_empty());
    }

    #[test]
    fn a_hand_over_of_a_relation_the_sentence_names_ends_the_givers_one() {
        let onto = people_and_services();
        let mentions = [
            mention("Tomás Ferreira", "Person"),
            mention("Sofia Brandt", "Person"),
            mention("Harbour Gateway", "Service"),
            mention("Acme Corp", "Company"),
        ];
        let episode = crate::source::Episode {
            episode_id: "chat".into(),
            source_id: None,
            group_id: "g".into(),
            document_id: None,
            source_uri: "file:///tmp/chat.jsonl#L1".into(),
            source_description: None,
            kind: crate::spec::EpisodeKind::Message,
            content: "Tomás Ferreira: On Monday 3 March I move teams. Sofia takes over my \
                      Harbour Gateway on-call shifts from that day, and my Acme Corp account."
                .into(),
            reference_time: chrono::DateTime::parse_from_rfc3339("2025-02-24T16:40:00Z")
                .expect("time")
                .to_utc(),
            reference_time_source: "field".into(),
            order: (0, 0),
        };
        let sentences = Sentences::new(&episode.content, &mentions);
        let spec = ExtractSpec::default();
        let ended = ended_pairs(&onto, &spec, &episode, &mentions, &sentences, &[]);
        let got: Vec<(&str, &str, &str, String)> = ended
            .iter()
            .map(|f| {
                (
                    mentions[f.source].name.as_str(),
                    f.relation_type(),
                    mentions[f.target].name.as_str(),
                    f.invalid_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![(
                "Tomás Ferreira",
                "ON_CALL_FOR",
                "Harbour Gateway",
                "2025-03-03T00:00:00+00:00".to_string()
            )],
            "the shifts the sentence names end on the day; the account is no \
             relation it names, so Tomás's work for Acme Corp does not end"
        );
        // A fact the model gave about the pair is not repeated.
        let given = FactMention {
            episode_id: "chat".into(),
            source: 0,
            target: 2,
            chain: vec!["RESPONSIBLE_FOR".into()],
            fact: "Tomás is responsible for Harbour Gateway.".into(),
            valid_at: None,
            invalid_at: None,
            mapped: false,
            written_types: Vec::new(),
            start_stated: false,
            moved: false,
        };
        let ended = ended_pairs(&onto, &spec, &episode, &mentions, &sentences, &[given]);
        assert!(ended.is_empty(), "{ended:?}");
    }

    #[test]
    fn a_sentence_that_moves_its_subject_to_the_other_end_says_it_moved() {
        let mention = |name: &str| mention(name, "Entity");
        let mentions = [
            mention("Priya Raman"),
            mention("Data Platform"),
            mention("Ledger Service"),
            mention("Postgres"),
            mention("Acme Corp"),
        ];
        let text = "From 1 May Priya transfers to the Data Platform team. Ledger Service \
                    migrated over to Postgres last week. Postgres moves to Ledger Service's \
                    own host. Acme Corp moved its office to Postgres.";
        let sentences = Sentences::new(text, &mentions);
        assert!(
            sentences.moved_to(0, 1).is_some(),
            "by the first word of the name, an article between"
        );
        assert!(
            sentences.moved_to(1, 0).is_none(),
            "the mover is the verb's subject"
        );
        assert!(sentences.moved_to(2, 3).is_some(), "\"over to\"");
        assert!(
            sentences.moved_to(3, 2).is_some(),
            "each sentence on its own"
        );
        assert!(
            sentences.moved_to(4, 3).is_none(),
            "what moves is not the subject"
        );
        let mail = "From: Priya Raman <priya@acme.com>\n\nI move to Data Platform on Monday.";
        let mail = Sentences::new(mail, &mentions);
        assert!(mail.moved_to(0, 1).is_some(), "the writer's I");
        // The move's day: a start word's, else the date the sentence writes.
        let today = NaiveDate::from_ymd_opt(2025, 4, 10).expect("day");
        let day = |s: &Sentences, a, b| {
            s.moved_to(a, b)
                .and_then(|k| s.day_of(k, today))
                .map(|d| d.to_string())
        };
        assert_eq!(day(&sentences, 0, 1).as_deref(), Some("2025-05-01"));
        assert_eq!(day(&sentences, 2, 3), None, "\"last week\" gives no day");
        let dated = Sentences::new("Ledger Service moves to Postgres on 1 July.", &mentions);
        assert_eq!(day(&dated, 2, 3).as_deref(), Some("2025-07-01"));
        let staying = Sentences::new("Priya Raman stays with Data Platform.", &mentions);
        assert!(staying.moved_to(0, 1).is_none());
    }

    #[test]
    fn a_mail_writers_we_speaks_for_the_organisation_their_address_names() {
        let reference = parse_time(Some("2025-05-12T15:10:00Z"))
            .expect("time")
            .expect("some");
        let mention = |name: &str| mention(name, "Entity");
        let mentions = [
            mention("Beatrix Holm"),
            mention("Relaywave Ltd"),
            mention("Notification Hub"),
            mention("Tidewell"),
        ];
        let mail = "From: Beatrix Holm <beatrix.holm@relaywave.com>\nTo: Maya <maya@tidewell.io>\n\
                    Subject: Cancellation\n\nDear Maya,\n\nThe contract was cancelled today, with \
                    effect from 30 June 2025. We will keep accepting messages from your \
                    Notification Hub until 23:59 UTC on that day.";
        let sentences = Sentences::new(mail, &mentions);
        assert!(sentences.pair_stated(1, 2), "the writer's company says we");
        assert_eq!(
            sentences.pair_end(2, 1, reference).map(|d| d.to_string()),
            Some("2025-06-30".into()),
            "until a time on that day: the last date written before"
        );
        assert!(
            !sentences.pair_stated(3, 2),
            "Tidewell is not the writer's organisation"
        );
        // The same words from a chat line's speaker name no organisation.
        let chat = "Beatrix Holm: Relaywave Ltd is a vendor. We will keep accepting messages \
                    from your Notification Hub until 30 June.";
        let sentences = Sentences::new(chat, &mentions);
        assert!(!sentences.pair_stated(1, 2));
        assert_eq!(sentences.pair_end(2, 1, reference), None);
        // A person's name is no domain label, and a sentence without "we"
        // does not speak for the organisation.
        let mail = "From: Beatrix Holm <beatrix.holm@relaywave.com>\n\n\
                    Relaywave Ltd is a vendor. Notification Hub sends until 30 June.";
        let sentences = Sentences::new(mail, &mentions);
        assert!(!sentences.pair_stated(1, 2));
        assert!(!sentences.pair_stated(0, 2), "no I either");
    }

    #[test]
    fn an_end_is_read_from_an_episode_sentence_that_names_the_pair_and_no_other_entity() {
        let reference = parse_time(Some("2025-03-31T17:05:00Z"))
            .expect("time")
            .expect("some");
        let mention = |name: &str| mention(name, "Entity");
        let mentions = [
            mention("Hamid Castellanos"),
            mention("Tidewell"),
            mention("Arjun Raghunathan"),
            mention("Acme"),
        ];
        let end = |content: &str, a, b| {
            Sentences::new(content, &mentions)
                .pair_end(a, b, reference)
                .map(|d| d.to_string())
        };
        let chat = "Arjun Raghunathan: Today is Hamid's last day: his contract with Tidewell \
                    ends tonight. SEC-11 is closed.";
        assert_eq!(end(chat, 0, 1).as_deref(), Some("2025-03-31"));
        assert_eq!(end(chat, 1, 0).as_deref(), Some("2025-03-31"));
        assert_eq!(end(chat, 2, 1), None, "the speaker is not in the sentence");
        assert_eq!(
            end(
                "Today Hamid's contract with Tidewell ends, Arjun says: tonight.",
                0,
                1
            ),
            None,
            "a third entity in the sentence"
        );
        assert_eq!(
            end(
                "Hamid's contract with Acme ended yesterday and he joined Tidewell.",
                0,
                1
            ),
            None,
            "a sentence about another relationship too"
        );
        assert_eq!(
            end("Hamid works for Tidewell. Acme's deal ends tonight.", 0, 1),
            None,
            "the end is in another sentence"
        );
        // The writer's own relationship, in the first person; a clause
        // after a semicolon is another sentence.
        let own = "Hamid Castellanos: I'm no longer on call for Tidewell as of 1 March; \
                   I only take Acme shifts now.";
        assert_eq!(end(own, 0, 1).as_deref(), Some("2025-03-01"));
        assert_eq!(end(own, 2, 1), None, "not Arjun's relationship");
        assert_eq!(
            end(
                "Arjun Raghunathan: I'm no longer on call for Tidewell.",
                2,
                1
            ),
            None,
            "an end with no day given is not read from the episode"
        );
        assert_eq!(
            end(
                "Hamid at Tidewell confirmed that nothing was left in the queue.",
                0,
                1
            ),
            None,
            "something else was left"
        );
        assert_eq!(
            end("Arjun Raghunathan: I'm on call for Tidewell.", 2, 1),
            None,
            "no end stated"
        );
    }

    #[test]
    fn a_record_relates_a_field_to_what_its_object_holds_and_not_two_items_of_a_list() {
        let mentions = [
            mention("Northwind Outfitters Inc.", "Company"),
            mention("Acme Corp", "Company"),
            mention("PO-4590", "PurchaseOrder"),
            mention("PO-4614", "PurchaseOrder"),
            mention("Brightline Systems", "Company"),
            mention("Dana Whitcombe", "Person"),
        ];
        let report = r#"{"record_type": "open_po_report", "buyer": "Northwind Outfitters",
            "open_purchase_orders": [
                {"po_number": "PO-4590", "vendor": "Acme Corp", "amount": 8750.0},
                {"po_number": "PO-4614", "vendor": "Brightline Systems", "amount": 11200.0}]}"#;
        let r = RecordPlaces::new(report, &mentions);
        assert!(r.pair_stated(1, 2), "one item of the list");
        assert!(r.pair_stated(2, 1), "either order");
        assert!(!r.pair_stated(1, 3), "two items of one list");
        assert!(!r.pair_stated(2, 3), "two items of one list");
        assert!(r.pair_stated(0, 3), "the report's own field and an item");
        assert!(r.pair_stated(0, 4), "a suffix the record leaves out");
        assert!(
            r.pair_stated(5, 1),
            "a name the record does not write passes"
        );
        // Keys count as fields; text that is not JSON is not judged.
        let keyed = r#"{"Acme Corp": {"orders": ["PO-4590", "PO-4614"]}}"#;
        let r = RecordPlaces::new(keyed, &mentions);
        assert!(r.pair_stated(1, 3) && r.pair_stated(1, 2));
        assert!(!r.pair_stated(2, 3), "two entries of one list");
        assert!(RecordPlaces::new("not json", &mentions).pair_stated(1, 3));
    }

    #[test]
    fn taking_something_over_from_someone_ends_their_relationship_with_it_and_not_the_takers() {
        // Written on Monday 24 February 2025.
        let reference = parse_time(Some("2025-02-24T16:40:00Z"))
            .expect("time")
            .expect("some");
        let mentions = [
            mention("Tomás Ferreira", "Person"),
            mention("Sofia Brandt", "Person"),
            mention("Harbour Gateway", "Service"),
            mention("Platform Reliability", "Team"),
        ];
        let end = |content: &str, a, b| {
            Sentences::new(content, &mentions)
                .pair_end(a, b, reference)
                .map(|d| d.to_string())
        };
        // The writer hands over; "that day" is the date written before.
        let chat = "Tomás Ferreira: Heads-up: on Monday 3 March I move from Platform \
                    Reliability. Sofia takes over my Harbour Gateway on-call shifts from that day.";
        assert_eq!(end(chat, 0, 2).as_deref(), Some("2025-03-03"));
        assert_eq!(
            end(chat, 2, 0).as_deref(),
            Some("2025-03-03"),
            "either order"
        );
        assert_eq!(end(chat, 1, 2), None, "the one taking over keeps it");
        assert_eq!(end(chat, 1, 0), None, "the two people are not handed over");
        // A named giver, after the verb; a start word gives the day.
        let named = "Sofia takes over Harbour Gateway from Tomás on 10 March.";
        assert_eq!(end(named, 0, 2).as_deref(), Some("2025-03-10"));
        let possessive = "Sofia takes over Tomás's Harbour Gateway shifts.";
        assert_eq!(
            end(possessive, 0, 2).as_deref(),
            Some("2025-02-24"),
            "no day written: the episode's"
        );
        assert_eq!(end(possessive, 1, 2), None);
        // Not a handover: the writer takes something over, or someone
        // takes over nothing the pair names.
        assert_eq!(
            end(
                "Tomás Ferreira: I take over Harbour Gateway from today.",
                0,
                2
            ),
            None
        );
        assert_eq!(
            end("Tomás Ferreira: Sofia takes over our account.", 0, 2),
            None
        );
    }
}
