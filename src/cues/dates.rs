//! Dates as English writes them: month and weekday names, days relative
//! to the text ("tomorrow", "next Friday", "end of June"), times of day
//! and spans of time, resolved against the day a text was written.

use chrono::NaiveDate;

/// Month names, January first (dates are told apart by them, and
/// [`super::ends::stated_end`] reads them).
const MONTH_NAMES: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// The common abbreviations of month names.
const MONTH_ABBREVIATIONS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
];

/// Whether a lower-case word is a month's name or abbreviation ("sept.").
pub(super) fn is_month(word: &str) -> bool {
    let w = word.trim_end_matches('.');
    MONTH_NAMES.contains(&w) || MONTH_ABBREVIATIONS.contains(&w)
}

/// Units a span of time is written in after its number.
pub(super) const DURATION_UNITS: [&str; 14] = [
    "second", "seconds", "minute", "minutes", "hour", "hours", "day", "days", "week", "weeks",
    "month", "months", "year", "years",
];

/// Words that may stand between a span's number and its unit ("30
/// business days").
pub(super) const DURATION_QUALIFIERS: [&str; 3] = ["business", "calendar", "working"];

/// Words that place a day relative to when the text was written.
pub(super) const RELATIVE_DAYS: [&str; 4] = ["today", "tonight", "tomorrow", "yesterday"];

/// Whether `name` is only a month name (or its abbreviation) that `text`
/// uses as a date: after a word that places a time ("in June", "the
/// first week of July", "by Sept.") or before a number ("June 3", "July
/// 2025"). A month name that `text` writes otherwise, such as a person's
/// ("June said …"), is left to the other rules.
pub fn month_as_date(name: &str, text: &str) -> bool {
    const BEFORE: [&str; 16] = [
        "in", "of", "by", "until", "till", "since", "from", "before", "after", "during", "through",
        "next", "last", "early", "late", "mid",
    ];
    let name = name.trim().trim_end_matches('.');
    if name.is_empty() || name.contains(char::is_whitespace) || !is_month(&name.to_lowercase()) {
        return false;
    }
    let written: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
        .filter(|w| !w.is_empty())
        .collect();
    written.iter().enumerate().any(|(i, w)| {
        let bare = w.trim_end_matches(['.', ':', ';', '!', '?']);
        if !bare.eq_ignore_ascii_case(name) {
            return false;
        }
        let before = i
            .checked_sub(1)
            .map(|j| written[j].to_lowercase())
            .is_some_and(|b| BEFORE.contains(&b.as_str()));
        let after = written
            .get(i + 1)
            .is_some_and(|a| a.starts_with(|c: char| c.is_ascii_digit()));
        before || after
    })
}

const WEEKDAY_NAMES: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// What the dates of a sentence are read against: the day it was written,
/// and the last date written before it, if that is known.
#[derive(Clone, Copy)]
pub(super) struct When {
    pub(super) today: NaiveDate,
    pub(super) earlier: Option<NaiveDate>,
}

impl When {
    pub(super) fn on(today: NaiveDate) -> Self {
        When {
            today,
            earlier: None,
        }
    }
}

/// The first date written right after a word for which `ahead_after`
/// (given the word's index) says whether that date lies ahead of the
/// sentence or behind it; words it returns `None` for are passed over.
pub(super) fn date_after(
    words: &[String],
    when: When,
    ahead_after: impl Fn(usize) -> Option<bool>,
) -> Option<NaiveDate> {
    (0..words.len()).find_map(|i| date_at(&words[i + 1..], when, ahead_after(i)?))
}

/// The last date `text` writes, resolved against `today` as
/// [`stated_end`](super::ends::stated_end) resolves a date ahead of it ("on Monday 3 March I move …" gives 3
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
/// the sentences a caller reads with [`stated_end_after`](super::ends::stated_end_after).
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

/// The date the words after an end word begin with (see
/// [`stated_end`](super::ends::stated_end)).
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
    fn a_month_name_the_text_uses_as_a_date_is_a_date_and_a_given_name_is_not() {
        let text = "Delivery is planned for the first week of July. Renewal is due in June; \
                    Sept. 3 at the latest. June said she would check.";
        for name in ["July", "June", "Sept", "Sept."] {
            assert!(month_as_date(name, text), "{name}");
        }
        assert!(!month_as_date("June", "June said she would check."));
        assert!(!month_as_date("August", text), "not in the text");
        assert!(!month_as_date("June Carter", text), "a month and more");
        assert!(!month_as_date("Acme", "in Acme"));
    }

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
}
