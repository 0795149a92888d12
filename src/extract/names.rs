//! The checks an entity name offered by a model must pass: not a type's
//! words, not a role, not a date, written in what the model was shown.

use super::{ExtractSpec, Prompts};
use crate::cues::roles::is_role_word;
use crate::ontology::ENTITY_LABEL;
use crate::text::normalize_name;
use crate::values::parse_time;

/// What an entity call's names are checked against: the episode and
/// its context as the model was shown them.
pub(super) struct NameChecks<'a> {
    pub(super) spec: &'a ExtractSpec,
    pub(super) prompts: &'a Prompts,
    /// The episode's text.
    pub(super) content: &'a str,
    /// The episode, then its context, each as its words.
    pub(super) shown: &'a [crate::cues::words::Written<'a>],
    /// The episode, its context as shown and its source description,
    /// each in [`crate::text::grounding_form`]: a name is written there.
    pub(super) shown_forms: &'a [String],
    /// Where the episode comes from ("engineering mailbox"), normalised,
    /// unless the episode itself writes it.
    pub(super) source_only: Option<&'a str>,
}

impl NameChecks<'_> {
    /// Why `name` (`normalized`, offered as a `kind`) is not an entity,
    /// by the first rule it breaks; `None` when it breaks none.
    pub(super) fn not_a_name(&self, name: &str, normalized: &str, kind: &str) -> Option<String> {
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
        let cues = &self.prompts.cues;
        if let Some(what) = cues.gives("non_entity_kind", || {
            crate::cues::kinds::non_entity_kind(name)
        }) {
            return Some(format!("`{name}` is {what}, not an entity"));
        }
        if cues.fires("month_as_date", || {
            crate::cues::dates::month_as_date(name, self.content)
        }) {
            return Some(format!(
                "`{name}` is a month the episode uses as a date, not an entity"
            ));
        }
        if self.source_only == Some(normalized) {
            return Some(format!(
                "`{name}` is the episode's source, not an entity it writes"
            ));
        }
        // Every name is copied from what the model was shown; one that is
        // not written there, case, punctuation and spacing aside, is made
        // up (the 0.5B model lists words of the prompt's own rules: "Date",
        // "Generic Noun"; the 1.5B one adds a legal form or a word the
        // text never writes with the name). Words of every script count.
        let form = crate::text::grounding_form(name);
        if !self.shown_forms.iter().any(|shown| shown.contains(&form)) {
            return Some(format!(
                "`{name}` is not written in the episode or its context (case, punctuation and spacing aside): not a name it writes"
            ));
        }
        if descriptions
            && cues.fires("common_noun", || {
                crate::cues::nouns::common_noun(name, self.shown)
            })
        {
            return Some(format!(
                "`{name}` is written only in lower case in the episode and its context: a common noun, not a name"
            ));
        }
        if descriptions
            && cues.fires("only_a_label", || {
                crate::cues::labels::only_a_label(name, &self.shown[0])
            })
        {
            return Some(format!(
                "`{name}` is written only as a field label (`{name}:`) in the episode, not a name"
            ));
        }
        if descriptions
            && self.prompts.person_types.contains(kind)
            && cues.fires("job_title", || crate::cues::people::job_title(name))
        {
            return Some(format!("`{name}` is a job title, not a person's name"));
        }
        if descriptions
            && cues.fires("only_a_defined_term", || {
                crate::cues::nouns::only_a_defined_term(name, self.shown)
            })
        {
            return Some(format!(
                "`{name}` is written only as a term for a party (`the {name}`), not a name"
            ));
        }
        if self.prompts.type_words.spelled_by(name) || normalized == normalize_name(ENTITY_LABEL) {
            return Some(format!("entity named after a type: `{name}`"));
        }
        if descriptions
            && cues.fires("role_words", || {
                is_role_word(&self.prompts.role_words, name)
            })
        {
            return Some(format!(
                "`{name}` is a role or a kind the type descriptions name, not a name"
            ));
        }
        None
    }
}
