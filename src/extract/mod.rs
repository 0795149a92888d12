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

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use crate::ontology::ENTITY_LABEL;
use crate::source::Episode;
use crate::stage::Stage;

mod entities;
mod evidence;
mod facts;
mod fit;
mod names;
mod prompt;
mod record;
mod reply;
#[cfg(test)]
mod tests;
mod times;
mod types;
mod when;

pub use crate::spec::extract::{AskedProperties, ExtractSpec, FactStart};
pub use entities::extract_entities;
pub use evidence::{Evidence, context_of, typed_attributes};
pub use facts::extract_facts;
pub use fit::{
    declared_spelling, fitting_relation, fitting_relation_in, misapplied, only_relation,
    relation_type_of, types_written,
};
pub use prompt::{Prompts, attributes_schema, describe_edge_type, describe_type, value_schema};
pub use record::stated_identities;
pub use reply::{AttributeOut, AttributesOut, entity_reply_bound, fact_reply_bound};
pub use when::{WHEN_MAX_CHARS, WHEN_PATTERN, resolve_when};

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

/// The relation type of a fact whose model named no declared type.
pub const GENERIC_RELATION: &str = "RELATES_TO";
