//! `[extract]`: extraction and classification settings (the stages are
//! [`crate::extract`] and [`crate::classify`]).

use serde::{Deserialize, Serialize};

use super::ontology::{EntityTypeSpec, PropertySpec};

/// `[extract]` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExtractSpec {
    /// Earlier episodes of the same document given as context.
    pub context_episodes: usize,
    /// Characters of each context episode shown.
    pub context_chars: usize,
    /// Extra instructions added to the extraction prompts.
    pub custom_instructions: String,
    /// Entities (or facts) per subtype-classification call.
    pub classify_batch_size: usize,
    /// Bound on the entity reply.
    pub entity_max_tokens: u32,
    /// Bound on the fact reply.
    pub fact_max_tokens: u32,
    /// Time budget of one call, retries included, in seconds.
    pub call_budget_secs: u64,
    /// Most entities kept from one episode.
    pub max_entities_per_episode: usize,
    /// Whether the fact call chooses among every declared edge type,
    /// subtypes included, instead of the top-level ones followed by the
    /// edge subtype walk.
    pub fold_edge_subtypes: bool,
    /// Whether the fact reply is grouped by source entity (one list of
    /// facts under each entity's name, offering only the fact types that
    /// entity's type can start) instead of one list of facts.
    pub facts_by_source: bool,
    /// Whether a name the episode writes only in lower case ("hardware",
    /// "the master agreement") is rejected as a description rather than a
    /// name. Turn it off with `resolve.embedding_candidates`, whose
    /// neighbours can bring such references to their entity.
    pub reject_descriptions: bool,
    /// Drop a fact unless some sentence of its episode names both ends
    /// (or its writer, speaking in the first person, is one end and the
    /// sentence names the other). A chat line's speaker and e-mail headers
    /// do not count as naming; records are not judged; an end the episode
    /// does not name at all passes. Off by default: it also drops true
    /// facts stated without naming an end.
    pub require_stated_pair: bool,
    /// Which properties of a type the entity call and the subtype walk
    /// ask the model to write (see [`AskedProperties`]).
    pub properties: AskedProperties,
    /// Where a model-extracted fact's start (`valid_at`) comes from (see
    /// [`FactStart`]).
    pub fact_start: FactStart,
    /// The language of the archive (a BCP 47 code such as `en`, `de`,
    /// `es`): cues of other languages are off unless `cues` turns them on.
    pub language: String,
    /// Cues turned on or off by name (`[extract.cues]`, see
    /// `docs/cues.md`), whatever `language` says.
    pub cues: std::collections::BTreeMap<String, bool>,
}

/// Where the start of a fact the model extracts comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FactStart {
    /// The fact schema asks the model for `valid_at`.
    #[default]
    Model,
    /// The schema does not ask: the start is a date the fact's sentence
    /// writes after a start word ("since", "starting", "effective", "as
    /// of" …), else the episode's reference time. Small models copied the
    /// episode's date into nearly every `valid_at` they were asked for,
    /// about a fifth of a fact's tokens.
    Text,
}

/// Which of a type's properties a model is asked to write. Each property
/// value costs completion tokens, and small models invent values the
/// episode never states (grounding drops those, but only after they were
/// paid for); identity properties are the ones resolution needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AskedProperties {
    /// Every declared property.
    #[default]
    All,
    /// Only the type's `identity_properties`.
    Identity,
    /// None: model-extracted entities carry no attributes (mappings and
    /// `graphloom add` still set them).
    None,
}

impl AskedProperties {
    /// The properties of `t` a model is asked for.
    pub fn of(self, t: &EntityTypeSpec) -> Vec<PropertySpec> {
        match self {
            AskedProperties::All => t.properties.clone(),
            AskedProperties::Identity => t
                .properties
                .iter()
                .filter(|p| t.identity_properties.contains(&p.name))
                .cloned()
                .collect(),
            AskedProperties::None => Vec::new(),
        }
    }
}

impl Default for ExtractSpec {
    fn default() -> Self {
        ExtractSpec {
            context_episodes: 3,
            context_chars: 1_200,
            custom_instructions: String::new(),
            classify_batch_size: 16,
            entity_max_tokens: 1_200,
            fact_max_tokens: 1_600,
            call_budget_secs: 300,
            max_entities_per_episode: 40,
            fold_edge_subtypes: false,
            facts_by_source: false,
            reject_descriptions: true,
            require_stated_pair: false,
            properties: AskedProperties::All,
            fact_start: FactStart::Model,
            language: "en".into(),
            cues: std::collections::BTreeMap::new(),
        }
    }
}
