//! What the ontology's types say in words: the words of their names and
//! descriptions, the roles and the types of people, against which a name
//! offered by a model is checked (`names.rs`) and which the prompts show.

use std::collections::HashSet;

use crate::cues::roles::names_people;
use crate::ontology::Ontology;
use crate::text::normalize_name;

/// The lower-case words of the ontology's type descriptions
/// ([`crate::cues::roles::role_words`]): a one-word name among them is a
/// role or a kind, not a name.
pub(super) fn role_words(ontology: &Ontology) -> HashSet<String> {
    let descriptions = ontology
        .entity_types
        .values()
        .map(|t| t.description.as_str())
        .chain(ontology.edge_types.values().map(|t| t.description.as_str()));
    crate::cues::roles::role_words(descriptions)
}

/// The entity types whose entities are people: a type that
/// [`crate::cues::roles::names_people`], and every subtype of one. A job
/// title offered as one of them is a role, not a person
/// ([`crate::cues::people::job_title`]).
pub(super) fn person_types(ontology: &Ontology) -> HashSet<String> {
    let roots: Vec<&String> = ontology
        .entity_types
        .iter()
        .filter(|(name, t)| names_people(name, &t.description))
        .map(|(name, _)| name)
        .collect();
    ontology
        .entity_types
        .keys()
        .filter(|t| roots.iter().any(|r| ontology.entity_tree.is_a(t, r)))
        .cloned()
        .collect()
}

/// A name as a type word: folded, without spaces, so that "Order Form"
/// and "purchase order" are recognised as the types `OrderForm` and
/// `PurchaseOrder`, not names of entities.
pub(super) fn type_word(name: &str) -> String {
    normalize_name(name).replace(' ', "")
}

/// The names of an ontology's entity types as a model may write them as
/// entity names: each as a [`type_word`] ("Order Form" for `OrderForm`),
/// each acronym type (`MSA`, `SLA`: a name in capitals) by the initials
/// of the words that spell it out ("Master Services Agreement"), and each
/// type of two or more words by its initials in capitals ("PO" for
/// `PurchaseOrder`).
#[derive(Debug, Clone)]
pub(super) struct TypeWords {
    /// Every entity type name as a [`type_word`], with the name.
    words: Vec<(String, String)>,
    /// The acronym type names, in lower case.
    acronyms: Vec<String>,
    /// The initials of the type names of two or more words, in capitals.
    initials: Vec<String>,
}

impl TypeWords {
    pub(super) fn new(ontology: &Ontology) -> Self {
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
    pub(super) fn type_and_code<'a>(&self, name: &'a str) -> Option<(&str, &'a str)> {
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
    pub(super) fn written_before<'t>(&'t self, code: &str, text: &str) -> Option<&'t str> {
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
    pub(super) fn introduced_codes<'t>(&'t self, text: &'t str) -> Vec<(&'t str, &'t str)> {
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
    pub(super) fn type_named(&self, words: &str) -> Option<&str> {
        let word = type_word(words);
        self.words
            .iter()
            .find(|(w, _)| *w == word)
            .map(|(_, kind)| kind.as_str())
    }

    /// Whether `name` spells a type: as a type word, as the initials of a
    /// type of several words, or, when it is two or more words of letters,
    /// by its initials as an acronym type.
    pub(super) fn spelled_by(&self, name: &str) -> bool {
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
