//! The words of a text a model was shown, each with whether it opens a
//! sentence: what the noun, label and defined-term cues read.

/// A text a model was shown, split once into the words
/// [`common_noun`](super::nouns::common_noun) and
/// [`only_a_label`](super::labels::only_a_label) read, each of which is asked about every name
/// offered for the episode.
pub struct Written<'a> {
    pub(super) text: &'a str,
    pub(super) words: Vec<Word<'a>>,
}

impl<'a> Written<'a> {
    /// Splits `text` into its words ([`words_opening_sentences`]).
    pub fn new(text: &'a str) -> Self {
        Written {
            text,
            words: words_opening_sentences(text),
        }
    }

    /// [`Written::new`] when the cue `words_opening_sentences` is on;
    /// otherwise no word opens a sentence, so every capital counts.
    pub fn with_cues(text: &'a str, cues: &super::Switches) -> Self {
        let mut written = Written::new(text);
        let opening = written.words.iter().any(|w| w.opens);
        if !cues.fires("words_opening_sentences", || opening) {
            for w in &mut written.words {
                w.opens = false;
            }
        }
        written
    }

    /// Every run of words that spells `wanted` (words in lower case),
    /// case ignored.
    pub(super) fn occurrences<'w>(
        &'w self,
        wanted: &'w [String],
    ) -> impl Iterator<Item = &'w [Word<'a>]> {
        self.occurrences_at(wanted).map(|(_, window)| window)
    }

    /// [`Self::occurrences`], each with the index of its first word.
    pub(super) fn occurrences_at<'w>(
        &'w self,
        wanted: &'w [String],
    ) -> impl Iterator<Item = (usize, &'w [Word<'a>])> {
        self.words
            .windows(wanted.len())
            .enumerate()
            .filter(move |(_, window)| {
                window
                    .iter()
                    .zip(wanted)
                    .all(|(w, want)| w.text.to_lowercase() == *want)
            })
    }

    /// Whether word `at` is capitalised and follows, with one space
    /// between, a capitalised plain word that opens no sentence: the last
    /// word of a longer name ("Payments Engineering"), not "Dear Maya".
    pub(super) fn ends_a_longer_name(&self, at: usize) -> bool {
        let capitalised = |w: &Word<'_>| w.text.starts_with(char::is_uppercase);
        let (Some(prev), Some(word)) = (
            at.checked_sub(1).map(|p| &self.words[p]),
            self.words.get(at),
        ) else {
            return false;
        };
        capitalised(word)
            && capitalised(prev)
            && prev.plain
            && !prev.opens
            && self.text[prev.at + prev.text.len()..word.at] == *" "
    }
}

/// A word of a text as [`common_noun`](super::nouns::common_noun) reads
/// it.
pub(super) struct Word<'a> {
    pub(super) text: &'a str,
    /// Where it starts in the text (a byte offset).
    pub(super) at: usize,
    /// It opens a sentence.
    pub(super) opens: bool,
    /// It stands as a word of its own, not inside an address, a domain or
    /// a slug (`acme` in `dana@acme.com`).
    pub(super) plain: bool,
}

/// The [`crate::text::words`] of `text`, each with whether it opens a sentence: it is
/// the first word, or the last mark before it (quotes, brackets, dashes
/// and spaces aside) ends a sentence or a line, or it follows a speaker
/// ("Dana Whitcombe: Legal sent …": one to four capitalised words opening
/// the line, then the line's first colon). Another colon does not: what
/// follows a label ("description": "Onsite deployment …") is written as
/// its writer styles it.
fn words_opening_sentences(text: &str) -> Vec<Word<'_>> {
    let code_mark = |c: char| "@._/-".contains(c);
    let speaker = |head: &str| {
        let words: Vec<&str> = head.split_whitespace().collect();
        (1..=4).contains(&words.len())
            && !head.contains(':')
            && words.iter().all(|w| w.starts_with(char::is_uppercase))
    };
    let mut out = Vec::new();
    let mut opens = true;
    let mut line_start = 0;
    let mut start: Option<usize> = None;
    for (i, c) in text.char_indices() {
        if c.is_alphanumeric() {
            start.get_or_insert(i);
            continue;
        }
        if let Some(s) = start.take() {
            // A mark joins two words only with no space around it
            // ("acme.com"; not "acme. Then").
            let after = text[i + c.len_utf8()..].chars().next();
            let joined = code_mark(c) && after.is_some_and(char::is_alphanumeric);
            let before = text[..s].chars().next_back().is_some_and(code_mark);
            out.push(Word {
                text: &text[s..i],
                at: s,
                opens,
                plain: !before && !joined,
            });
            opens = false;
        }
        if c == '\n' {
            line_start = i + 1;
        }
        if matches!(c, '.' | '!' | '?' | '\n') {
            opens = true;
        } else if c == ':' {
            opens = speaker(&text[line_start..i]);
        } else if !(c.is_whitespace() || "\"'“”‘’()[]-–—*•".contains(c)) {
            opens = false;
        }
    }
    if let Some(s) = start {
        out.push(Word {
            text: &text[s..],
            at: s,
            opens,
            plain: !text[..s].chars().next_back().is_some_and(code_mark),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn with_words_opening_sentences_off_no_word_opens_a_sentence() {
        let text = "Dana: Legal sent it. Then Acme replied.";
        let on = Written::with_cues(text, &super::super::Switches::default());
        let opening: Vec<&str> = on
            .words
            .iter()
            .filter(|w| w.opens)
            .map(|w| w.text)
            .collect();
        assert_eq!(opening, ["Dana", "Legal", "Then"]);
        let off = BTreeMap::from([("words_opening_sentences".to_string(), false)]);
        let off = Written::with_cues(text, &super::super::Switches::new("en", &off));
        assert!(off.words.iter().all(|w| !w.opens));
    }
}
