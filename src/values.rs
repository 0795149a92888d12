//! Values as the graph stores them: property values checked against their
//! declared kind, values a model wrote as text coerced to that kind, and
//! fact times normalised to UTC.

use chrono::{DateTime, NaiveDate, Utc};
use serde_json::Value;

use crate::spec::ontology::PropertyType;
use crate::text::MONTH_NAMES;

/// Checks a value against a property kind and returns its stored form.
pub fn check_value(kind: PropertyType, value: &Value) -> Option<Value> {
    match kind {
        PropertyType::Text => value.as_str().map(|s| Value::String(s.to_string())),
        PropertyType::Int => value.as_i64().map(Value::from),
        PropertyType::Float => value.as_f64().map(Value::from),
        PropertyType::Bool => value.as_bool().map(Value::from),
        PropertyType::Date => {
            let s = value.as_str()?;
            let date = NaiveDate::parse_from_str(s, "%Y-%m-%d")
                .ok()
                .or_else(|| DateTime::parse_from_rfc3339(s).ok().map(|d| d.date_naive()))?;
            Some(Value::String(date.format("%Y-%m-%d").to_string()))
        }
    }
}

/// Parses a fact time: RFC 3339 (converted to UTC), a date (midnight UTC)
/// or a year (January 1st, midnight UTC).
pub fn parse_time(text: Option<&str>) -> std::result::Result<Option<DateTime<Utc>>, String> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    if let Ok(d) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(Some(
            d.and_hms_opt(0, 0, 0)
                .map(|t| t.and_utc())
                .unwrap_or_default(),
        ));
    }
    if text.len() == 4
        && let Ok(y) = text.parse::<i32>()
        && let Some(d) = NaiveDate::from_ymd_opt(y, 1, 1)
    {
        return Ok(Some(
            d.and_hms_opt(0, 0, 0)
                .map(|t| t.and_utc())
                .unwrap_or_default(),
        ));
    }
    Err(format!(
        "{text:?} is not a time (use RFC 3339 such as 2025-03-10T00:00:00Z, a date 2025-03-10 or a year 2025)"
    ))
}

/// Coerces a value a model wrote as text into a property's kind: numbers
/// may carry thousands separators or a currency sign, booleans may be
/// yes/no, dates may be RFC 3339 timestamps. `None` when it does not fit.
pub fn coerce_text(kind: PropertyType, text: &str) -> Option<Value> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    match kind {
        PropertyType::Text => Some(Value::String(t.to_string())),
        PropertyType::Int | PropertyType::Float => {
            let cleaned: String = t
                .chars()
                .filter(|c| c.is_ascii_digit() || *c == '.' || *c == '-')
                .collect();
            if cleaned.is_empty() || cleaned.chars().filter(|c| *c == '.').count() > 1 {
                return None;
            }
            if kind == PropertyType::Int {
                cleaned.parse::<i64>().ok().map(Value::from)
            } else {
                cleaned
                    .parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .map(Value::from)
            }
        }
        PropertyType::Bool => match t.to_ascii_lowercase().as_str() {
            "true" | "yes" | "y" => Some(Value::Bool(true)),
            "false" | "no" | "n" => Some(Value::Bool(false)),
            _ => None,
        },
        PropertyType::Date => check_value(kind, &Value::String(t.to_string())),
    }
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

const WEEKDAY_NAMES: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
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

/// What the dates of a sentence are read against: the day it was written,
/// and the last date written before it, if that is known.
#[derive(Clone, Copy)]
struct When {
    today: NaiveDate,
    earlier: Option<NaiveDate>,
}

impl When {
    fn on(today: NaiveDate) -> Self {
        When {
            today,
            earlier: None,
        }
    }
}

/// The first date written right after a word for which `ahead_after`
/// (given the word's index) says whether that date lies ahead of the
/// sentence or behind it; words it returns `None` for are passed over.
fn date_after(
    words: &[String],
    when: When,
    ahead_after: impl Fn(usize) -> Option<bool>,
) -> Option<NaiveDate> {
    (0..words.len()).find_map(|i| date_at(&words[i + 1..], when, ahead_after(i)?))
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

/// The last date `text` writes, resolved against `today` as [`stated_end`]
/// resolves a date ahead of it ("on Monday 3 March I move …" gives 3
/// March): what "from that day" refers back to. A date is read where a
/// word begins one ("3 March", "March 3", "2025-03-03", "Monday",
/// "tomorrow"), not from a word inside one. `None` when it writes none.
pub fn last_date(text: &str, today: NaiveDate) -> Option<NaiveDate> {
    let words: Vec<String> = crate::text::words(text).map(str::to_lowercase).collect();
    let inside = |i: usize| {
        i > 0 && {
            let before = words[i - 1].as_str();
            day_number(before).is_some()
                || month_number(before).is_some()
                || WEEKDAY_NAMES.contains(&before)
                || year_number(Some(&words[i - 1])).is_some()
        }
    };
    (0..words.len())
        .rev()
        .filter(|&i| !inside(i))
        .find_map(|i| date_at(&words[i..], When::on(today), true))
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

fn month_number(word: &str) -> Option<u32> {
    let prefix_ok = word.len() >= 3 && (word.len() == 3 || word == "sept");
    MONTH_NAMES
        .iter()
        .position(|m| *m == word || (prefix_ok && m.starts_with(word)))
        .and_then(|i| u32::try_from(i + 1).ok())
}

/// A day of the month as written: "31", "31st", "1st", "2nd", "3rd".
fn day_number(word: &str) -> Option<u32> {
    let digits = word.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &word[digits.len()..];
    if !matches!(suffix, "" | "st" | "nd" | "rd" | "th") || digits.len() > 2 {
        return None;
    }
    digits.parse().ok().filter(|d| (1..=31).contains(d))
}

fn year_number(word: Option<&String>) -> Option<i32> {
    let w = word?;
    (w.len() == 4).then(|| w.parse().ok()).flatten()
}

fn last_day_of_month(year: i32, month: u32) -> Option<NaiveDate> {
    let (y, m) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    NaiveDate::from_ymd_opt(y, m, 1)?.pred_opt()
}

/// The nearest `(month, day)` on the side of `today` that `ahead` says,
/// `today` itself included; `day` 0 is the month's last day.
fn nearest(today: NaiveDate, month: u32, day: u32, ahead: bool) -> Option<NaiveDate> {
    use chrono::Datelike;
    let on = |year: i32| {
        if day == 0 {
            last_day_of_month(year, month)
        } else {
            NaiveDate::from_ymd_opt(year, month, day)
        }
    };
    let this_year = on(today.year())?;
    Some(match (ahead, this_year < today, this_year > today) {
        (true, true, _) => on(today.year() + 1)?,
        (false, _, true) => on(today.year() - 1)?,
        _ => this_year,
    })
}

/// Whether `words` (lower case) begin with "that day" or "that date".
fn is_that_day(words: &[String]) -> bool {
    matches!(words, [that, day, ..] if that == "that" && (day == "day" || day == "date"))
}

/// Whether a sentence says "that day" or "that date", which refers back
/// to the last date written before it ("until 23:59 UTC on that day"):
/// the sentences a caller reads with [`stated_end_after`].
pub fn refers_back(text: &str) -> bool {
    let words: Vec<String> = crate::text::words(text).map(str::to_lowercase).collect();
    (0..words.len()).any(|i| is_that_day(&words[i..]))
}

/// Time zones and clock words that may follow a time of day.
const CLOCK_WORDS: [&str; 9] = ["utc", "gmt", "z", "cet", "cest", "bst", "am", "pm", "hours"];

/// `words` without a leading time of day: "23:59 [UTC]" (which words
/// split into "23", "59"), "9 am", "midnight", "noon", "midday". Two
/// numbers are a time only when the second is two digits up to 59 and
/// the first an hour: no date is written "23 59".
fn skip_time_of_day(words: &[String]) -> &[String] {
    let n = match words {
        [w, ..] if matches!(w.as_str(), "midnight" | "noon" | "midday") => 1,
        [h, m, ..]
            if h.len() <= 2
                && h.parse::<u32>().is_ok_and(|h| h <= 24)
                && m.len() == 2
                && m.parse::<u32>().is_ok_and(|m| m <= 59) =>
        {
            2
        }
        [h, ampm, ..]
            if matches!(ampm.as_str(), "am" | "pm")
                && h.len() <= 2
                && h.parse::<u32>().is_ok_and(|h| (1..=12).contains(&h)) =>
        {
            2
        }
        _ => return words,
    };
    let rest = &words[n..];
    match rest.first() {
        Some(z) if CLOCK_WORDS.contains(&z.as_str()) => &rest[1..],
        _ => rest,
    }
}

/// `words` without the leading ones among `filler`.
fn skip<'a>(words: &'a [String], filler: &[&str]) -> &'a [String] {
    let n = words
        .iter()
        .take_while(|w| filler.contains(&w.as_str()))
        .count();
    &words[n..]
}

/// The date the words after an end word begin with (see [`stated_end`]).
fn date_at(words: &[String], when: When, ahead: bool) -> Option<NaiveDate> {
    use chrono::{Datelike, Days};
    const FILLER: [&str; 7] = ["on", "at", "by", "in", "the", "this", "next"];
    let today = when.today;
    let w = skip(words, &FILLER);
    // A time of day before the date says when on that day ("until 23:59
    // UTC on 30 June", "until midnight on 30 June"); the day is read.
    let w = skip(skip_time_of_day(w), &FILLER);
    let first = w.first()?.as_str();
    if is_that_day(w) {
        return when.earlier;
    }
    let dated = |month: u32, day: u32, year: Option<i32>| match year {
        Some(y) if day == 0 => last_day_of_month(y, month),
        Some(y) => NaiveDate::from_ymd_opt(y, month, day),
        None => nearest(today, month, day, ahead),
    };
    match first {
        "today" | "tonight" => return Some(today),
        "tomorrow" => return today.checked_add_days(Days::new(1)),
        "yesterday" => return today.checked_sub_days(Days::new(1)),
        _ => {}
    }
    if first == "end" && w.get(1).map(String::as_str) == Some("of") {
        let rest = skip(&w[2..], &["the", "this"]);
        let what = rest.first()?.as_str();
        return match what {
            "month" => last_day_of_month(today.year(), today.month()),
            "quarter" => last_day_of_month(today.year(), today.month().div_ceil(3) * 3),
            "year" => NaiveDate::from_ymd_opt(today.year(), 12, 31),
            _ => dated(month_number(what)?, 0, year_number(rest.get(1))),
        };
    }
    if let Some(weekday) = WEEKDAY_NAMES.iter().position(|d| *d == first) {
        // "Monday 3 March": the date says the day; the weekday only
        // repeats it.
        let date_follows = w
            .get(1)
            .is_some_and(|x| day_number(x).is_some() || month_number(x).is_some());
        if let Some(date) = date_follows
            .then(|| date_at(&w[1..], when, ahead))
            .flatten()
        {
            return Some(date);
        }
        let from = today.weekday().num_days_from_monday();
        let to = u32::try_from(weekday).ok()?;
        let days = if ahead {
            (to + 7 - from) % 7
        } else {
            (7 + from - to) % 7
        };
        let days = Days::new(u64::from(days));
        return if ahead {
            today.checked_add_days(days)
        } else {
            today.checked_sub_days(days)
        };
    }
    // 2025-03-31, split into three words.
    if let (Some(y), Some(m), Some(d)) = (
        year_number(w.first()),
        w.get(1).and_then(|m| m.parse::<u32>().ok()),
        w.get(2).and_then(|d| d.parse::<u32>().ok()),
    ) {
        return NaiveDate::from_ymd_opt(y, m, d);
    }
    // 31 March [2025]
    if let (Some(d), Some(m)) = (day_number(first), w.get(1).and_then(|m| month_number(m))) {
        return dated(m, d, year_number(w.get(2)));
    }
    let month = month_number(first)?;
    // March 31[, 2025]
    if let Some(d) = w.get(1).and_then(|d| day_number(d)) {
        return dated(month, d, year_number(w.get(2)));
    }
    // March [2025]: its first day.
    dated(month, 1, year_number(w.get(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_date_a_text_writes_is_read_where_it_begins() {
        let today = NaiveDate::from_ymd_opt(2025, 2, 24).expect("day");
        let last = |t: &str| super::last_date(t, today).map(|d| d.to_string());
        // A weekday before a date only repeats it (24 February is itself
        // a Monday: read alone it would be today).
        assert_eq!(
            last("Heads-up: on Monday 3 March I move to Payments").as_deref(),
            Some("2025-03-03")
        );
        assert_eq!(
            last("from 2025-03-01 until March 14, 2025, then on Friday").as_deref(),
            Some("2025-02-28")
        );
        assert_eq!(last("raised the pool from 40 to 120 per pod"), None);
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
    fn model_text_is_coerced_to_the_declared_kind() {
        assert_eq!(
            coerce_text(PropertyType::Float, "USD 51,600.00"),
            Some(Value::from(51600.0))
        );
        assert_eq!(
            coerce_text(PropertyType::Int, "150"),
            Some(Value::from(150))
        );
        assert_eq!(coerce_text(PropertyType::Int, "about forty"), None);
        assert_eq!(
            coerce_text(PropertyType::Bool, "Yes"),
            Some(Value::Bool(true))
        );
        assert_eq!(
            coerce_text(PropertyType::Date, "2024-03-14T09:00:00Z"),
            Some(Value::from("2024-03-14"))
        );
        assert_eq!(coerce_text(PropertyType::Date, "March"), None);
        assert_eq!(
            coerce_text(PropertyType::Text, "  open "),
            Some(Value::from("open"))
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
    fn fact_times_are_normalised_to_utc() {
        let t = |s| {
            parse_time(Some(s))
                .expect("parses")
                .expect("some")
                .to_rfc3339()
        };
        assert_eq!(t("2025-03-10T09:30:00+02:00"), "2025-03-10T07:30:00+00:00");
        assert_eq!(t("2025-03-10"), "2025-03-10T00:00:00+00:00");
        assert_eq!(t("2025"), "2025-01-01T00:00:00+00:00");
        assert_eq!(parse_time(Some("  ")), Ok(None));
        assert!(parse_time(Some("last week")).is_err());
    }

    #[test]
    fn a_sentence_that_says_when_it_ends_gives_its_end() {
        let reference = parse_time(Some("2025-02-10T09:15:00Z")).unwrap().unwrap();
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
