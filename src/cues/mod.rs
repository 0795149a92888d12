//! Language cues: every rule that reads the *wording* of a text — word
//! lists, phrases, sentence shapes — rather than the ontology's structure.
//!
//! Typing and resolution should come from the ontology; where a stage also
//! reads English, the rule lives here, once, as a named item of
//! [`REGISTRY`] with its language, so that a reader can see every such
//! rule in one list and a later spec key can switch one off by name. The
//! stages call the rules through this module. It imports no stage: it is
//! a leaf, like [`crate::text`] (which keeps normalisation and hashing).
//!
//! Each submodule holds the rules of one kind; every rule in it has a
//! registry entry naming that submodule (`tests/it/architecture.rs`
//! checks both directions).

/// The language whose wording a cue reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Language {
    English,
}

impl Language {
    /// The BCP 47 code of the language (`en`).
    pub fn code(self) -> &'static str {
        match self {
            Language::English => "en",
        }
    }
}

/// One named rule that reads wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cue {
    /// The rule's name, unique in [`REGISTRY`] and stable (a spec key may
    /// name it): `snake_case`.
    pub name: &'static str,
    /// The language of the words it reads.
    pub language: Language,
    /// The submodule of `cues` that holds it (its file name).
    pub module: &'static str,
    /// What it decides, in one line.
    pub decides: &'static str,
}

/// Every language cue, in the order of the flow that calls them.
pub const REGISTRY: &[Cue] = &[];

/// The registry entry named `name`.
pub fn cue(name: &str) -> Option<&'static Cue> {
    REGISTRY.iter().find(|c| c.name == name)
}
