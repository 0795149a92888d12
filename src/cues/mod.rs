//! Language cues: every rule that reads the *wording* of a text — word
//! lists, phrases, sentence shapes — rather than the ontology's structure.
//!
//! Typing and resolution should come from the ontology; where a stage also
//! reads English, the rule lives here, once, as a named item of
//! [`REGISTRY`] with its language, so that a reader can see every such
//! rule in one list and a later spec key can switch one off by name. The
//! stages call the rules through this module. It imports no stage: it is
//! a leaf, like [`crate::text`] (which keeps normalisation and hashing).
//! A rule that needs the ontology or a stage's types takes plain data
//! from its caller (names, description texts, word sets): extraction
//! hands [`sentences::Sentences`] its mentions' names, not the mentions.
//!
//! Each submodule holds the rules of one kind; every rule in it has a
//! registry entry naming that submodule (`tests/it/architecture.rs`
//! checks both directions).

pub(crate) mod mail;
pub(crate) mod moves;
pub(crate) mod names;
pub(crate) mod relations;
pub(crate) mod roles;
pub(crate) mod sentences;

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
pub const REGISTRY: &[Cue] = &[
    // extract's cues
    Cue {
        name: "role_words",
        language: Language::English,
        module: "roles",
        decides: "a one-word name (after \"the\") that the type descriptions write in lower case is a role, not a name",
    },
    Cue {
        name: "people_types",
        language: Language::English,
        module: "roles",
        decides: "a type named as people are, or described as a person, individual or human, is a type of people",
    },
    Cue {
        name: "shared_long_word",
        language: Language::English,
        module: "names",
        decides: "two names sharing a word of three letters or more may be one entity's",
    },
    Cue {
        name: "record_writes_name",
        language: Language::English,
        module: "names",
        decides: "a record's value writes a name when one's words stand within the other's",
    },
    Cue {
        name: "passive_relation",
        language: Language::English,
        module: "relations",
        decides: "an undeclared X_BY, or an active form of a declared X_BY, is that type the other way round",
    },
    Cue {
        name: "relation_preposition",
        language: Language::English,
        module: "relations",
        decides: "a relation name's last preposition need not be written for a text to name the relation",
    },
    Cue {
        name: "sentence_split",
        language: Language::English,
        module: "sentences",
        decides: "an episode's sentences end at a line end, '.', '!', '?' or ';'",
    },
    Cue {
        name: "name_by_first_word",
        language: Language::English,
        module: "sentences",
        decides: "a sentence names a mention by its whole name or by its capitalised first word",
    },
    Cue {
        name: "chat_speaker",
        language: Language::English,
        module: "sentences",
        decides: "one to four capitalised words before \": \" are the line's speaker, not what it is about",
    },
    Cue {
        name: "first_person",
        language: Language::English,
        module: "sentences",
        decides: "\"I\", \"me\", \"my\" in a sentence speak of its writer",
    },
    Cue {
        name: "first_person_plural",
        language: Language::English,
        module: "sentences",
        decides: "\"we\", \"our\", \"us\" in a sentence speak of its writer's organisation",
    },
    Cue {
        name: "then_refers_back",
        language: Language::English,
        module: "sentences",
        decides: "a sentence saying \"then\" happens on the last date written before it",
    },
    Cue {
        name: "handover",
        language: Language::English,
        module: "sentences",
        decides: "\"takes over\" the giver's (or \"my\", or \"from\" the giver) thing ends the giver's relation with it",
    },
    Cue {
        name: "move_to",
        language: Language::English,
        module: "sentences",
        decides: "a mention before a verb of moving, \"over\", \"to\" and another mention moved to it",
    },
    Cue {
        name: "mail_headers",
        language: Language::English,
        module: "mail",
        decides: "lines starting From:, To:, Cc:, Bcc:, Subject:, Date:, Reply-To: are headers, not sentences",
    },
    Cue {
        name: "mail_domain_org",
        language: Language::English,
        module: "mail",
        decides: "the sender's address domain names the mention that is the writer's organisation",
    },
    Cue {
        name: "moving_verb",
        language: Language::English,
        module: "moves",
        decides: "forms of move, switch, migrate and transfer are verbs of moving",
    },
    Cue {
        name: "taking_over",
        language: Language::English,
        module: "moves",
        decides: "a form of \"take\" followed by \"over\" is taking something over",
    },
];

/// The registry entry named `name`.
pub fn cue(name: &str) -> Option<&'static Cue> {
    REGISTRY.iter().find(|c| c.name == name)
}
