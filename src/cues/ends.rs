//! Sentences that say a relationship ended ("has left", "no longer"),
//! and the day a fact sentence says it ends or starts ("until the end of
//! March", "since 3 March").

use chrono::NaiveDate;

use super::dates::{When, date_after};
use crate::text::words;

/// Phrases with which a sentence says a relationship has ended.
const END_PHRASES: [&str; 16] = [
    "no longer",
    "has left",
    "have left",
    "had left",
    "left",
    "former",
    "formerly",
    "used to",
    "ended",
    "ceased",
    "stopped",
    "terminated",
    "cancelled",
    "canceled",
    "resigned",
    "quit",
];

/// Whether a fact sentence says its relationship has ended ("is no longer
/// employed by", "has left", "the contract was cancelled"), by whole
/// words. A future end ("until next year") is not an end yet.
pub fn states_an_end(fact: &str) -> bool {
    let words: Vec<String> = words(fact).map(str::to_lowercase).collect();
    END_PHRASES.iter().any(|p| {
        let phrase: Vec<&str> = p.split(' ').collect();
        words
            .windows(phrase.len())
            .any(|w| w.iter().zip(&phrase).all(|(a, b)| a == b))
    })
}

/// Words after which a fact sentence gives the day its relationship ends,
/// with whether that day lies ahead of the sentence ("on contract until
/// the end of March", "his contract ends tonight") or behind it ("the
/// contract ended on 3 March").
const END_DATE_WORDS: [(&str, bool); 11] = [
    ("until", true),
    ("till", true),
    ("through", true),
    ("ends", true),
    ("ending", true),
    ("expires", true),
    ("expiring", true),
    ("ended", false),
    ("expired", false),
    ("terminated", false),
    ("left", false),
];

/// The day a fact sentence says its relationship ends or ended, resolved
/// against `today` (the episode's day): the date after an end word
/// ([`END_DATE_WORDS`]) written as `YYYY-MM-DD`, "31 March [2025]",
/// "March 31[, 2025]", "[the] end of March", "[the] end of the month /
/// quarter / year", "March" (its first day: "until March"), "today",
/// "tonight", "tomorrow", "yesterday" or a weekday. A date without a year
/// is the nearest one on the side the end word points to. `None` when no
/// end word is followed by a date.
///
/// Small models often write "X is on contract with Y until the end of
/// March" as the fact and leave its end empty; this gives it one.
pub fn stated_end(fact: &str, today: NaiveDate) -> Option<NaiveDate> {
    stated_end_after(fact, today, None)
}

/// [`stated_end`] for a sentence of a longer text, whose "that day" or
/// "that date" is `earlier`, the last date written before it: "We
/// confirm that the contract was cancelled with effect from 30 June. We
/// will keep accepting messages until 23:59 UTC on that day" ends on 30
/// June.
pub fn stated_end_after(
    fact: &str,
    today: NaiveDate,
    earlier: Option<NaiveDate>,
) -> Option<NaiveDate> {
    let words: Vec<String> = crate::text::words(fact).map(str::to_lowercase).collect();
    let when = When { today, earlier };
    date_after(&words, when, |i| listed(&END_DATE_WORDS, &words[i]))
        .or_else(|| no_longer_as_of(&words, when))
}

/// Whether `word` is one of `table`'s words, and if so, whether the date
/// after it lies ahead.
fn listed(table: &[(&str, bool)], word: &str) -> Option<bool> {
    table
        .iter()
        .find(|(w, _)| *w == word)
        .map(|(_, ahead)| *ahead)
}

/// Whether `words[i]` is the "of" of "as of".
fn as_of(words: &[String], i: usize) -> bool {
    words[i] == "of" && i > 0 && words[i - 1] == "as"
}

/// Where "no longer" begins in `words`.
fn no_longer_at(words: &[String]) -> Option<usize> {
    words
        .windows(2)
        .position(|w| w[0] == "no" && w[1] == "longer")
}

/// Words after which a fact sentence gives the day its relationship
/// starts or started, with whether that day lies ahead of the sentence
/// ("on call starting Monday") or behind it ("on the team since 3 March").
/// "as of" is read too.
const START_DATE_WORDS: [(&str, bool); 9] = [
    ("since", false),
    ("from", true),
    ("starting", true),
    ("starts", true),
    ("started", false),
    ("effective", true),
    ("begins", true),
    ("began", false),
    ("beginning", true),
];

/// The day a fact sentence says its relationship starts or started,
/// resolved against `today` (the episode's day) as [`stated_end`] resolves
/// ends: the date right after a start word ([`START_DATE_WORDS`]) or "as
/// of". `None` when no start word is followed by a date ("moved from
/// Payments to Platform" names no day). A sentence that says the
/// relationship is over ("no longer … as of 1 May") gives its end, not its
/// start.
pub fn stated_start(fact: &str, today: NaiveDate) -> Option<NaiveDate> {
    let words: Vec<String> = crate::text::words(fact).map(str::to_lowercase).collect();
    if no_longer_at(&words).is_some() {
        return None;
    }
    date_after(&words, When::on(today), |i| {
        if as_of(&words, i) {
            Some(true)
        } else {
            listed(&START_DATE_WORDS, &words[i])
        }
    })
}

/// "No longer on call for Fare Engine as of 1 May": the day after "as of"
/// (or "from", "since", "effective") that follows "no longer", behind the sentence
/// unless it speaks of the future ("will no longer … as of 1 June").
fn no_longer_as_of(words: &[String], when: When) -> Option<NaiveDate> {
    let at = no_longer_at(words)?;
    let ahead = words[..at].iter().any(|w| w == "will");
    let rest = &words[at + 2..];
    date_after(rest, when, |i| {
        (as_of(rest, i) || matches!(rest[i].as_str(), "from" | "since" | "effective"))
            .then_some(ahead)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_relationships_are_told_by_whole_words() {
        for f in [
            "Dana Whitcombe is no longer employed by Acme Corp",
            "Priya Raman has left Brightline",
            "Sam left Acme in March",
            "The MSA between Acme and Brightline was cancelled",
            "Lee is a former employee of Globex",
        ] {
            assert!(states_an_end(f), "{f}");
        }
        for f in [
            "Dana works for Acme Corp",
            "Acme's leftover stock ships to Brightline",
            "Brightline endorsed the order",
            "Lee works at Globex until next year",
        ] {
            assert!(!states_an_end(f), "{f}");
        }
    }

    #[test]
    fn an_end_reads_the_day_after_a_time_of_day_and_that_day_as_the_date_before() {
        let today = NaiveDate::from_ymd_opt(2025, 5, 12).expect("day");
        let end = |t: &str| stated_end(t, today).map(|d| d.to_string());
        assert_eq!(
            end("open until 23:59 UTC on 30 June").as_deref(),
            Some("2025-06-30")
        );
        assert_eq!(
            end("stays open until midnight on 30 June").as_deref(),
            Some("2025-06-30")
        );
        assert_eq!(
            end("on call until 9 am Friday").as_deref(),
            Some("2025-05-16")
        );
        // A date is still a date: "23 June" is no time.
        assert_eq!(end("until 23 June").as_deref(), Some("2025-06-23"));
        // A time alone names no day.
        assert_eq!(end("until 23:59 UTC"), None);
        let earlier = NaiveDate::from_ymd_opt(2025, 6, 30);
        let after = |t: &str, e| stated_end_after(t, today, e).map(|d| d.to_string());
        assert_eq!(
            after(
                "We will keep accepting messages until 23:59 UTC on that day",
                earlier
            )
            .as_deref(),
            Some("2025-06-30")
        );
        assert_eq!(
            after("until that day", None),
            None,
            "nothing written before"
        );
    }

    #[test]
    fn a_start_word_followed_by_a_date_gives_the_start() {
        let today = NaiveDate::from_ymd_opt(2025, 3, 12).expect("date"); // a Wednesday
        let d = |m, d| NaiveDate::from_ymd_opt(2025, m, d);
        let start = |s| stated_start(s, today);
        assert_eq!(start("Priya has been on the team since 3 March."), d(3, 3));
        assert_eq!(start("Sofia is on call starting Monday."), d(3, 17));
        assert_eq!(start("The MSA is effective 2025-04-01."), d(4, 1));
        assert_eq!(start("Dana works for Acme as of March 1, 2025."), d(3, 1));
        // A name after the word, no date: no start.
        assert_eq!(start("Maya moved from Payments to Platform."), None);
        assert_eq!(start("Grace works for Tidewell."), None);
        // An end phrased with a start word is not a start.
        assert_eq!(start("Tomás is no longer on call as of 1 May."), None);
    }

    #[test]
    fn a_sentence_that_says_when_it_ends_gives_its_end() {
        // The day as `values::parse_time` reads this time (cues import no
        // stage and not `values`).
        let reference = chrono::DateTime::parse_from_rfc3339("2025-02-10T09:15:00Z").unwrap();
        let end = |s: &str| stated_end(s, reference.date_naive()).map(|d| d.to_string());
        let day = |d: &str| Some(d.to_string());
        for (fact, want) in [
            (
                "Hamid is on contract with Tidewell until the end of March.",
                day("2025-03-31"),
            ),
            (
                "Hamid's contract with Tidewell ends tonight",
                day("2025-02-10"),
            ),
            ("The lease runs until 31 January 2026", day("2026-01-31")),
            ("The lease runs until 31st January", day("2026-01-31")),
            (
                "Support is covered through March 15, 2025",
                day("2025-03-15"),
            ),
            ("The trial expires on 2025-04-01", day("2025-04-01")),
            ("Kenji covers fare-engine until Friday", day("2025-02-14")),
            ("Priya stays until March", day("2025-03-01")),
            ("The old MSA ended on 3 February", day("2025-02-03")),
            ("The pilot ended in December", day("2024-12-01")),
            ("Cover ends at the end of the quarter", day("2025-03-31")),
            (
                "Sofia is off the rotation since she left on Friday",
                day("2025-02-07"),
            ),
            (
                "I'm no longer on call for Fare Engine as of 1 February",
                day("2025-02-01"),
            ),
            (
                "Lena will no longer cover Fare Engine as of 1 February",
                day("2026-02-01"),
            ),
        ] {
            assert_eq!(end(fact), want, "{fact}");
        }
        for fact in [
            "Dana works for Acme Corp",
            "Lee works at Globex until further notice",
            "The project ends soon",
            "Sam joined on 3 March",
            "Through Acme, Northwind buys laptops",
            "Hamid left Tidewell",
            "Kenji is no longer on call",
        ] {
            assert_eq!(end(fact), None, "{fact}");
        }
    }
}
