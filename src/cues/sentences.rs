//! Sentences of an episode, and what each is about: which mentions it
//! names, who writes it (a chat line's speaker, an e-mail's sender, their
//! "I" and their organisation's "we"), and the pair of mentions it speaks
//! of alone, with the day it says their relationship starts, ends, moves
//! or is handed over.

use chrono::{DateTime, NaiveDate, Utc};

use super::Switches;
use super::dates::refers_back;
use super::ends::{stated_end_after, stated_start};
use super::mail::{HEADERS, org_of_address};
use super::moves::{is_moving_verb, is_taking_over};
use crate::text::normalize_name;

/// Where an episode names its mentions, sentence by sentence, and who
/// writes each sentence. A mention is named by its whole name (case
/// ignored), or by its first word as the text capitalises it ("Hamid" for
/// "Hamid Castellanos"). A chat line's speaker ("Arjun Raghunathan: …")
/// and an e-mail's `From:` are who writes the sentences, not what they
/// are about; header lines (`From:`, `To:`, `Cc:`, `Subject:` …) are not
/// sentences.
pub(crate) struct Sentences<'a> {
    sentences: Vec<Sentence<'a>>,
    /// Per mention: whether the episode names it anywhere, headers and
    /// speakers included.
    anywhere: Vec<bool>,
    /// Per mention: how a sentence names it.
    names: Vec<NameWords>,
    /// The cues a run applies.
    cues: Switches,
}

/// How a sentence names a mention: all its words in a row (case
/// ignored), or its first word as the text capitalises it.
/// Cue `name_by_first_word`.
struct NameWords {
    /// The name's words, in lower case.
    whole: Vec<String>,
    /// Its first word, when it is capitalised and 3 letters or more.
    first: Option<String>,
}

impl NameWords {
    pub(crate) fn of(name: &str, by_first_word: bool) -> Self {
        NameWords {
            whole: crate::text::words(name).map(str::to_lowercase).collect(),
            first: crate::text::words(name)
                .next()
                .filter(|w| {
                    by_first_word && w.chars().count() >= 3 && w.starts_with(char::is_uppercase)
                })
                .map(str::to_string),
        }
    }

    /// Where `words` (as written) first name it: the index of the name's
    /// first word, and of the word after the name.
    pub(crate) fn in_words(&self, words: &[&str]) -> Option<(usize, usize)> {
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
    /// organisation, if one does ([`org_of_address`](super::mail::org_of_address)).
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
    pub(crate) fn speaks_of(&self, x: usize) -> bool {
        self.named.contains(&x)
            || (self.first_person && self.writer == Some(x))
            || (self.we && self.org == Some(x))
    }

    /// Every mention the sentence speaks of ([`Self::speaks_of`]), in
    /// order, each once.
    pub(crate) fn spoken(&self) -> Vec<usize> {
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

impl<'a> Sentences<'a> {
    /// The cues the run applies.
    pub(crate) fn cues(&self) -> &Switches {
        &self.cues
    }

    /// The sentences of `content` read for the names of `mentions`, with
    /// every cue on.
    #[cfg(test)]
    pub(crate) fn new(content: &'a str, mentions: &[&str]) -> Self {
        Self::with_cues(content, mentions, &Switches::default())
    }

    /// The sentences of `content` read for the names of `mentions`, by
    /// the cues `cues` has on.
    pub(crate) fn with_cues(content: &'a str, mentions: &[&str], cues: &Switches) -> Self {
        // Each name's words are taken once, not once per sentence.
        let by_first_word = cues.on("name_by_first_word");
        let names: Vec<NameWords> = mentions
            .iter()
            .map(|m| NameWords::of(m, by_first_word))
            .collect();
        // The names folded as a domain label would write them, taken only
        // for an episode with a `From:` address.
        let mut folded: Option<Vec<String>> = None;
        let fold = || -> Vec<String> {
            mentions
                .iter()
                .map(|m| {
                    crate::text::fold_suffixes(
                        &normalize_name(m),
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
            cues: cues.clone(),
        };
        let mut sender: Option<usize> = None;
        let mut sender_org: Option<usize> = None;
        for line in content.lines() {
            let lower = line.trim_start().to_lowercase();
            let header = HEADERS.iter().find(|h| lower.starts_with(*h));
            if let Some(header) = header.filter(|_| cues.fires("mail_headers", || true)) {
                let named = named_in(line);
                if *header == "from:" {
                    sender = named.first().copied();
                    sender_org = cues.gives("mail_domain_org", || {
                        org_of_address(line, folded.get_or_insert_with(fold))
                    });
                }
                for i in named {
                    out.anywhere[i] = true;
                }
                continue;
            }
            // Cue `chat_speaker`.
            let (writer, org, said) = match line.split_once(": ") {
                Some((speaker, said))
                    if cues.fires("chat_speaker", || {
                        (1..=4).contains(&speaker.split_whitespace().count())
                            && speaker
                                .split_whitespace()
                                .all(|w| w.starts_with(char::is_uppercase))
                    }) =>
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
            // Cue `sentence_split`.
            let split = cues.fires("sentence_split", || said.contains(['.', '!', '?', ';']));
            let marks: &[char] = if split { &['.', '!', '?', ';'] } else { &[] };
            for sentence in said.split(marks) {
                if sentence.trim().is_empty() {
                    continue;
                }
                let named = named_in(sentence);
                for &i in &named {
                    out.anywhere[i] = true;
                }
                // Cue `first_person`.
                let first_person = cues.fires("first_person", || {
                    crate::text::words(sentence)
                        .any(|w| matches!(w, "I" | "me" | "my" | "Me" | "My"))
                });
                // Cue `first_person_plural`.
                // "US" in capitals is a country, not "us".
                let we = cues.fires("first_person_plural", || {
                    crate::text::words(sentence)
                        .any(|w| matches!(w, "we" | "We" | "our" | "Our" | "us" | "ours"))
                });
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

    /// The text of sentence `k`.
    pub(crate) fn text(&self, k: usize) -> &'a str {
        self.sentences[k].text
    }

    /// Whether some sentence states something of `a` and `b` together:
    /// it names one and speaks of the other ([`Sentence::speaks_of`]: names
    /// it too, or is written by it in the first person, or by its people
    /// as "we"). A mention the episode does not name
    /// at all (the model took it from a previous episode, "signed it
    /// yesterday") cannot be judged, and passes.
    pub(crate) fn pair_stated(&self, a: usize, b: usize) -> bool {
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
    /// day is the one an end word gives ([`stated_end`](crate::cues::ends::stated_end): "ends tonight",
    /// "left on Friday", "no longer … as of 1 May", "until 23:59 UTC on
    /// that day", that day being the last date written before); an end word without a day is not read, since a
    /// sentence about the pair may say something else has ended ("Beatrix
    /// at Relaywave confirmed that nothing was left in their queue"). Small
    /// models restate "Today is Hamid's last day: his contract with
    /// Tidewell ends tonight" as "Hamid works for Tidewell", leaving the
    /// end behind; a sentence that also names a third entity ("Priya's
    /// contract with Acme ended in February and she joined Brightline")
    /// may be about another relationship and is not read.
    pub(crate) fn pair_end(
        &self,
        a: usize,
        b: usize,
        reference: DateTime<Utc>,
    ) -> Option<NaiveDate> {
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
    pub(crate) fn handed_over(
        &self,
        giver: usize,
        thing: usize,
        today: NaiveDate,
    ) -> Option<NaiveDate> {
        self.handover(giver, thing, today).map(|(_, day)| day)
    }

    /// [`Self::handed_over`] with the sentence that says it, by number.
    pub(crate) fn handover(
        &self,
        giver: usize,
        thing: usize,
        today: NaiveDate,
    ) -> Option<(usize, NaiveDate)> {
        if !self.cues.on("handover") {
            return None;
        }
        let taking_over = self.cues.on("taking_over");
        self.sentences.iter().enumerate().find_map(|(k, s)| {
            if !s.named.contains(&thing) {
                return None;
            }
            let words: Vec<&str> = crate::text::words(s.text).collect();
            let lower: Vec<String> = words.iter().map(|w| w.to_lowercase()).collect();
            let verb = lower
                .windows(2)
                .position(|w| taking_over && is_taking_over(&w[0], &w[1]))?;
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
            self.cues.fires("handover", || true);
            Some((k, self.day_of(k, today).unwrap_or(today)))
        })
    }

    /// The day sentence `k` says something happens: the one a start word
    /// gives ("from 3 March"), else the date it writes ("on 10 March"),
    /// else, when it says "that day" or "then", the last date the episode
    /// wrote before it.
    pub(crate) fn day_of(&self, k: usize, today: NaiveDate) -> Option<NaiveDate> {
        let text = self.sentences[k].text;
        let cues = &self.cues;
        cues.gives("stated_start", || stated_start(text, today))
            .or_else(|| cues.gives("last_date", || crate::cues::dates::last_date(text, today)))
            .or_else(|| {
                // Cue `then_refers_back`.
                let then = cues.fires("then_refers_back", || {
                    crate::text::words(text).any(|w| w.eq_ignore_ascii_case("then"))
                });
                (cues.fires("refers_back", || refers_back(text)) || then)
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
    pub(crate) fn stated_pair_ends(
        &self,
        today: NaiveDate,
    ) -> Vec<(usize, usize, NaiveDate, &'a str)> {
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
    pub(crate) fn end_in(&self, k: usize, today: NaiveDate) -> Option<NaiveDate> {
        let text = self.sentences[k].text;
        let cues = &self.cues;
        let earlier = cues
            .fires("refers_back", || refers_back(text))
            .then(|| self.date_before(k, today))
            .flatten();
        cues.gives("stated_end_after", || {
            stated_end_after(text, today, earlier)
        })
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
    /// Cue `move_to`.
    pub(crate) fn moved_to(&self, mover: usize, to: usize) -> Option<usize> {
        if !self.cues.on("move_to") {
            return None;
        }
        let moving_verb = self.cues.on("moving_verb");
        let found = self.about_pair_at(mover, to).find(|&k| {
            let s = &self.sentences[k];
            let words: Vec<&str> = crate::text::words(s.text).collect();
            let lower: Vec<String> = words.iter().map(|w| w.to_lowercase()).collect();
            (0..lower.len()).any(|verb| {
                if !(moving_verb && is_moving_verb(&lower[verb])) {
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
        });
        if found.is_some() {
            self.cues.fires("move_to", || true);
        }
        found
    }

    /// The day the episode starts the relationship between `a` and `b`,
    /// read from a sentence about the pair alone ([`Self::about_pair`])
    /// by its start word ([`stated_start`]): "From 1 July 2025 Notification
    /// Hub sends every SMS through Skylark Messaging" starts the pair on 1
    /// July, which the model's "Skylark Messaging supplies Notification
    /// Hub" does not say.
    pub(crate) fn pair_start(&self, a: usize, b: usize, today: NaiveDate) -> Option<NaiveDate> {
        self.about_pair(a, b).find_map(|text| {
            self.cues
                .gives("stated_start", || stated_start(text, today))
        })
    }

    /// The last date written before sentence `k`: what its "that day"
    /// refers back to.
    pub(crate) fn date_before(&self, k: usize, today: NaiveDate) -> Option<NaiveDate> {
        self.sentences[..k]
            .iter()
            .rev()
            .find_map(|p| crate::cues::dates::last_date(p.text, today))
    }

    /// The sentences about `a` and `b` alone: each names one of them and
    /// no other mention, and speaks of both ([`Sentence::speaks_of`]).
    pub(crate) fn about_pair(&self, a: usize, b: usize) -> impl Iterator<Item = &'a str> + '_ {
        self.about_pair_at(a, b).map(|k| self.sentences[k].text)
    }

    /// Where [`Self::about_pair`]'s sentences are, by number.
    pub(crate) fn about_pair_at(&self, a: usize, b: usize) -> impl Iterator<Item = usize> + '_ {
        self.sentences.iter().enumerate().filter_map(move |(k, s)| {
            let only_pair = s.named.iter().all(|&i| i == a || i == b);
            // At least one is named: a writer's "I" and "we" alone do not
            // make a sentence about the writer and their organisation.
            let named = s.named.contains(&a) || s.named.contains(&b);
            (only_pair && named && s.speaks_of(a) && s.speaks_of(b)).then_some(k)
        })
    }
}

#[cfg(test)]
mod tests {
    use chrono::NaiveDate;

    use super::*;
    use crate::values::parse_time;

    #[test]
    fn a_pair_is_stated_by_a_sentence_naming_both_or_by_its_writer_in_the_first_person() {
        let mentions = ["Dana Whitcombe", "Acme Corp", "Priya Raman", "PO-1"];
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
        let mentions = ["Notification Hub", "Skylark Messaging", "Relaywave"];
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
    fn a_sentence_about_two_mentions_alone_states_when_their_relationship_ends() {
        let today = NaiveDate::from_ymd_opt(2025, 5, 12).expect("day");
        let mentions = [
            "Beatrix Holm",
            "Relaywave Ltd",
            "Notification Hub",
            "Maya Okonjo",
            "Fare Engine",
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
    fn a_sentence_that_moves_its_subject_to_the_other_end_says_it_moved() {
        let mentions = [
            "Priya Raman",
            "Data Platform",
            "Ledger Service",
            "Postgres",
            "Acme Corp",
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
        let mentions = [
            "Beatrix Holm",
            "Relaywave Ltd",
            "Notification Hub",
            "Tidewell",
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
        let mentions = ["Hamid Castellanos", "Tidewell", "Arjun Raghunathan", "Acme"];
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
    fn taking_something_over_from_someone_ends_their_relationship_with_it_and_not_the_takers() {
        // Written on Monday 24 February 2025.
        let reference = parse_time(Some("2025-02-24T16:40:00Z"))
            .expect("time")
            .expect("some");
        let mentions = [
            "Tomás Ferreira",
            "Sofia Brandt",
            "Harbour Gateway",
            "Platform Reliability",
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
