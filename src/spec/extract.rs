//! `[extract]`: extraction and classification settings (the stages are
//! [`crate::extract`] and [`crate::classify`]).

use serde::{Deserialize, Serialize};

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
        }
    }
}
