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

pub(crate) mod booleans;
pub(crate) mod dates;
pub(crate) mod ends;
pub(crate) mod kinds;
pub(crate) mod labels;
pub(crate) mod mail;
pub(crate) mod moves;
pub(crate) mod names;
pub(crate) mod nouns;
pub(crate) mod people;
pub(crate) mod prices;
pub(crate) mod relations;
pub(crate) mod roles;
pub(crate) mod sentences;
pub(crate) mod words;

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
    // text's and values' cues
    Cue {
        name: "words_opening_sentences",
        language: Language::English,
        module: "words",
        decides: "which words of a text open a sentence (after a stop, a line, a speaker)",
    },
    Cue {
        name: "without_price",
        language: Language::English,
        module: "prices",
        decides: "whether a bracket after a name is its price, cut off: (USD 27,400.00)",
    },
    Cue {
        name: "without_count",
        language: Language::English,
        module: "prices",
        decides: "whether a number before a name is a count, cut off: 12 Ridgeback 14 laptops",
    },
    Cue {
        name: "without_affiliation",
        language: Language::English,
        module: "people",
        decides: "whether \"from X\" after a person's name is an affiliation, cut off",
    },
    Cue {
        name: "non_entity_kind",
        language: Language::English,
        module: "kinds",
        decides: "whether a name is a date, an amount, a span, a status, a clause, … instead",
    },
    Cue {
        name: "month_as_date",
        language: Language::English,
        module: "dates",
        decides: "whether a month name is used as a date by the text (\"in June\", \"July 3\")",
    },
    Cue {
        name: "common_noun",
        language: Language::English,
        module: "nouns",
        decides: "whether a name is a common noun phrase the texts write in lower case",
    },
    Cue {
        name: "only_a_label",
        language: Language::English,
        module: "labels",
        decides: "whether a word is only a field label mid-line (\"Subscription: …\")",
    },
    Cue {
        name: "job_title",
        language: Language::English,
        module: "people",
        decides: "whether a name offered as a person is a job title (\"Sales Lead\")",
    },
    Cue {
        name: "only_a_defined_term",
        language: Language::English,
        module: "nouns",
        decides: "whether a word only stands for a party (\"the Client\", defined in quotes)",
    },
    Cue {
        name: "states_an_end",
        language: Language::English,
        module: "ends",
        decides: "whether a fact says its relationship has ended (\"no longer\", \"has left\")",
    },
    Cue {
        name: "stated_end",
        language: Language::English,
        module: "ends",
        decides: "the day a fact says its relationship ends (\"until the end of March\")",
    },
    Cue {
        name: "stated_end_after",
        language: Language::English,
        module: "ends",
        decides: "the day a fact ends, reading \"that day\" as the date written before",
    },
    Cue {
        name: "stated_start",
        language: Language::English,
        module: "ends",
        decides: "the day a fact says its relationship starts (\"since 3 March\", \"as of\")",
    },
    Cue {
        name: "last_date",
        language: Language::English,
        module: "dates",
        decides: "the last date a text writes, which \"from that day\" refers back to",
    },
    Cue {
        name: "refers_back",
        language: Language::English,
        module: "dates",
        decides: "whether a sentence says \"that day\" or \"that date\" of an earlier date",
    },
    Cue {
        name: "yes_or_no",
        language: Language::English,
        module: "booleans",
        decides: "the truth value a model wrote as a word (\"yes\", \"n\", \"true\")",
    },
];

/// The registry entry named `name`.
pub fn cue(name: &str) -> Option<&'static Cue> {
    REGISTRY.iter().find(|c| c.name == name)
}

/// Which cues a run applies, and how often each changed an outcome.
///
/// A cue is on when `[extract.cues]` says so by name, else when its
/// language is the pipeline's (`extract.language`, default `"en"`). Built
/// once per run; clones share the counts, so the run reports them after
/// every episode's calls, whichever task made them.
#[derive(Debug, Clone)]
pub struct Switches {
    on: Vec<bool>,
    fired: std::sync::Arc<Vec<std::sync::atomic::AtomicU64>>,
}

impl Default for Switches {
    /// Every cue on, as for a pipeline in English.
    fn default() -> Self {
        Switches::new("en", &std::collections::BTreeMap::new())
    }
}

impl Switches {
    /// The switches of a pipeline in `language` with `overrides` by cue
    /// name (names not in [`REGISTRY`] are refused by the spec's checks
    /// and ignored here).
    pub fn new(language: &str, overrides: &std::collections::BTreeMap<String, bool>) -> Self {
        let on = REGISTRY
            .iter()
            .map(|c| {
                overrides
                    .get(c.name)
                    .copied()
                    .unwrap_or(c.language.code() == language)
            })
            .collect();
        let fired = REGISTRY
            .iter()
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect();
        Switches {
            on,
            fired: std::sync::Arc::new(fired),
        }
    }

    fn index(name: &str) -> Option<usize> {
        REGISTRY.iter().position(|c| c.name == name)
    }

    /// Whether the cue `name` is on (an unknown name is off).
    pub fn on(&self, name: &str) -> bool {
        Self::index(name).is_some_and(|i| self.on[i])
    }

    /// Whether the cue `name` is on and `rule` holds; a hold counts as
    /// one firing. The rule is not evaluated when the cue is off.
    pub fn fires(&self, name: &str, rule: impl FnOnce() -> bool) -> bool {
        let Some(i) = Self::index(name) else {
            return false;
        };
        if !self.on[i] || !rule() {
            return false;
        }
        self.fired[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        true
    }

    /// What the cue `name` gives when it is on (a firing when it gives
    /// something), `None` when it is off.
    pub fn gives<T>(&self, name: &str, rule: impl FnOnce() -> Option<T>) -> Option<T> {
        let mut out = None;
        self.fires(name, || {
            out = rule();
            out.is_some()
        });
        out
    }

    /// How often each cue that is on fired, in registry order, and the
    /// names of those that are off.
    pub fn counts(&self) -> (Vec<(&'static str, u64)>, Vec<&'static str>) {
        let mut fired = Vec::new();
        let mut off = Vec::new();
        for (i, c) in REGISTRY.iter().enumerate() {
            if self.on[i] {
                fired.push((
                    c.name,
                    self.fired[i].load(std::sync::atomic::Ordering::Relaxed),
                ));
            } else {
                off.push(c.name);
            }
        }
        (fired, off)
    }
}
