//! Time expressions: the one small grammar in which a fact reply writes
//! when a relationship ends, and the one resolver that turns it into a
//! day against the stating episode's reference time.
//!
//! The model reads the episode in its own language and writes the end in
//! this grammar ("Ende Juni" and "at the end of June" are both
//! `end of june`; "el viernes pasado" is `last friday`), bound to it by
//! [`WHEN_PATTERN`] in the reply schema. No word list reads the episode:
//! resolving is arithmetic on the reference time, so an end is never
//! dated by another episode.
//!
//! The grammar, lower case:
//! - `no`: the relationship does not end (no day).
//! - `YYYY-MM-DD`, `D <month>` or `D <month> YYYY`: that day (without a
//!   year, the one nearest the reference day).
//! - `today`, `yesterday`, `tomorrow`.
//! - `last|this|next <weekday>`: the weekday before the reference day, on
//!   or after it, or in the week after it.
//! - `last|this|next week|month|year`: the first day of that period;
//!   `end of last|this|next week|month|year`: its last day (weeks start on
//!   Monday).
//! - `<month>` and `end of <month>`, optionally with a year: its first or
//!   its last day; without a year, the one nearest the reference day.
//! - `N days|weeks|months|years ago|later` (or the unit in the singular).

use chrono::{DateTime, Datelike, Days, Months, NaiveDate, Utc, Weekday};

/// Month names of the grammar, January first.
const MONTHS: [&str; 12] = [
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

/// Weekday names of the grammar, Monday first.
const WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// The reply schema's pattern of a time expression ([`resolve_when`]
/// reads every string it matches).
pub const WHEN_PATTERN: &str = "^(no|[0-9]{4}-[0-9]{2}-[0-9]{2}|([1-9]|[12][0-9]|3[01]) (january|february|march|april|may|june|july|august|september|october|november|december)( [0-9]{4})?|today|yesterday|tomorrow|(last|this|next) (monday|tuesday|wednesday|thursday|friday|saturday|sunday|week|month|year)|end of (last|this|next) (week|month|year)|(end of )?(january|february|march|april|may|june|july|august|september|october|november|december)( [0-9]{4})?|[1-9][0-9]{0,2} (days?|weeks?|months?|years?) (ago|later))$";

/// Longest time expression a reply may write (characters).
pub const WHEN_MAX_CHARS: usize = 32;

/// The day `expr` names, read against `reference` (when the stating
/// episode was written); `None` when it is not in the grammar or names no
/// calendar day. Case and surrounding space aside.
pub fn resolve_when(expr: &str, reference: DateTime<Utc>) -> Option<NaiveDate> {
    let today = reference.date_naive();
    let lower = expr.trim().to_lowercase();
    let words: Vec<&str> = lower.split_whitespace().collect();
    match words.as_slice() {
        ["no"] => None,
        [day] if day.len() == 10 => NaiveDate::parse_from_str(day, "%Y-%m-%d").ok(),
        [d, month, rest @ ..]
            if d.chars().all(|c| c.is_ascii_digit()) && MONTHS.contains(month) =>
        {
            let rest: Vec<&str> = std::iter::once(*month)
                .chain(rest.iter().copied())
                .collect();
            let first = month_named(today, &rest)?;
            first.with_day(d.parse().ok()?)
        }
        ["today"] => Some(today),
        ["yesterday"] => today.pred_opt(),
        ["tomorrow"] => today.succ_opt(),
        ["end", "of", which @ ("last" | "this" | "next"), period] => {
            let start = period_start(today, which, period)?;
            period_end(start, period)
        }
        ["end", "of", rest @ ..] => {
            let first = month_named(today, rest)?;
            period_end(first, "month")
        }
        [which @ ("last" | "this" | "next"), word] => match weekday(word) {
            Some(day) => weekday_near(today, which, day),
            None => period_start(today, which, word),
        },
        [n, unit, direction @ ("ago" | "later")] => {
            let n: u32 = n.parse().ok()?;
            shifted(today, n, unit, *direction == "later")
        }
        rest => month_named(today, rest),
    }
}

fn weekday(word: &str) -> Option<Weekday> {
    let i = WEEKDAYS.iter().position(|w| *w == word)?;
    Weekday::try_from(u8::try_from(i).ok()?).ok()
}

/// `last`: the latest such weekday before `today`; `this`: the first on
/// or after it; `next`: that weekday in the week after `today`'s.
fn weekday_near(today: NaiveDate, which: &str, day: Weekday) -> Option<NaiveDate> {
    let ahead = (7 + day.num_days_from_monday() - today.weekday().num_days_from_monday()) % 7;
    match which {
        "last" => {
            let back =
                (7 + today.weekday().num_days_from_monday() - day.num_days_from_monday()) % 7;
            today.checked_sub_days(Days::new(u64::from(if back == 0 { 7 } else { back })))
        }
        "this" => today.checked_add_days(Days::new(u64::from(ahead))),
        _ => {
            let monday_next = today.checked_add_days(Days::new(u64::from(
                7 - today.weekday().num_days_from_monday(),
            )))?;
            monday_next.checked_add_days(Days::new(u64::from(day.num_days_from_monday())))
        }
    }
}

/// The first day of the week, month or year `which` (`last`, `this`,
/// `next`) names relative to `today`.
fn period_start(today: NaiveDate, which: &str, period: &str) -> Option<NaiveDate> {
    let step: i32 = match which {
        "last" => -1,
        "this" => 0,
        "next" => 1,
        _ => return None,
    };
    match period {
        "week" => {
            let monday = today
                .checked_sub_days(Days::new(u64::from(today.weekday().num_days_from_monday())))?;
            let days = Days::new(7);
            match step {
                -1 => monday.checked_sub_days(days),
                0 => Some(monday),
                _ => monday.checked_add_days(days),
            }
        }
        "month" => {
            let first = today.with_day(1)?;
            match step {
                -1 => first.checked_sub_months(Months::new(1)),
                0 => Some(first),
                _ => first.checked_add_months(Months::new(1)),
            }
        }
        "year" => NaiveDate::from_ymd_opt(today.year() + step, 1, 1),
        _ => None,
    }
}

/// The last day of the week, month or year that starts on `start`.
fn period_end(start: NaiveDate, period: &str) -> Option<NaiveDate> {
    let next = match period {
        "week" => start.checked_add_days(Days::new(7))?,
        "month" => start.checked_add_months(Months::new(1))?,
        "year" => start.checked_add_months(Months::new(12))?,
        _ => return None,
    };
    next.pred_opt()
}

/// The first day of the month `words` name (`["june"]`, `["june",
/// "2026"]`): in that year, or without one the June nearest `today`
/// (within six months either way; ties go ahead).
fn month_named(today: NaiveDate, words: &[&str]) -> Option<NaiveDate> {
    let (name, year) = match words {
        [name] => (*name, None),
        [name, year] => (*name, Some(year.parse::<i32>().ok()?)),
        _ => return None,
    };
    let month = MONTHS.iter().position(|m| *m == name)? as u32 + 1;
    if let Some(year) = year {
        return NaiveDate::from_ymd_opt(year, month, 1);
    }
    let here = today.year() * 12 + today.month0() as i32;
    (today.year() - 1..=today.year() + 1)
        .filter_map(|y| NaiveDate::from_ymd_opt(y, month, 1))
        .min_by_key(|d| {
            let there = d.year() * 12 + d.month0() as i32;
            // Nearest first; of two equally near, the one ahead.
            ((there - here).abs(), there < here)
        })
}

/// `today` moved `n` units ahead (`later`) or back.
fn shifted(today: NaiveDate, n: u32, unit: &str, later: bool) -> Option<NaiveDate> {
    let (days, months) = match unit {
        "day" | "days" => (u64::from(n), 0),
        "week" | "weeks" => (u64::from(n) * 7, 0),
        "month" | "months" => (0, n),
        "year" | "years" => (0, n.checked_mul(12)?),
        _ => return None,
    };
    if later {
        today
            .checked_add_days(Days::new(days))?
            .checked_add_months(Months::new(months))
    } else {
        today
            .checked_sub_days(Days::new(days))?
            .checked_sub_months(Months::new(months))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wednesday 12 March 2025, 09:30 UTC.
    fn wednesday() -> DateTime<Utc> {
        "2025-03-12T09:30:00Z".parse().expect("a time")
    }

    fn day(s: &str) -> Option<NaiveDate> {
        Some(NaiveDate::parse_from_str(s, "%Y-%m-%d").expect("a day"))
    }

    #[test]
    fn every_form_of_the_grammar_resolves_against_the_reference_day() {
        let at = wednesday();
        let cases = [
            ("2025-06-30", "2025-06-30"),
            ("31 december 2025", "2025-12-31"),
            ("4 july", "2025-07-04"),
            ("28 february", "2025-02-28"),
            ("today", "2025-03-12"),
            ("yesterday", "2025-03-11"),
            ("tomorrow", "2025-03-13"),
            ("last friday", "2025-03-07"),
            ("last wednesday", "2025-03-05"),
            ("this friday", "2025-03-14"),
            ("this wednesday", "2025-03-12"),
            ("next monday", "2025-03-17"),
            ("next friday", "2025-03-21"),
            ("last week", "2025-03-03"),
            ("this month", "2025-03-01"),
            ("next month", "2025-04-01"),
            ("last year", "2024-01-01"),
            ("end of this week", "2025-03-16"),
            ("end of next month", "2025-04-30"),
            ("end of last month", "2025-02-28"),
            ("end of this year", "2025-12-31"),
            ("end of june", "2025-06-30"),
            ("end of february 2024", "2024-02-29"),
            ("june", "2025-06-01"),
            ("january", "2025-01-01"),
            ("december", "2024-12-01"),
            ("september", "2025-09-01"),
            ("october 2026", "2026-10-01"),
            ("3 days ago", "2025-03-09"),
            ("2 weeks later", "2025-03-26"),
            ("1 month later", "2025-04-12"),
            ("1 years ago", "2024-03-12"),
        ];
        let pattern = regex::Regex::new(WHEN_PATTERN).expect("a pattern");
        for (expr, want) in cases {
            assert_eq!(resolve_when(expr, at), day(want), "{expr}");
            assert!(pattern.is_match(expr), "{expr} is in the schema's grammar");
            assert!(expr.len() <= WHEN_MAX_CHARS, "{expr}");
        }
    }

    #[test]
    fn case_and_space_do_not_matter_and_anything_else_names_no_day() {
        let at = wednesday();
        assert_eq!(resolve_when("  End of June ", at), day("2025-06-30"));
        for bad in [
            "",
            "no",
            "31 february 2025",
            "soon",
            "end of june and july",
            "2025-02-30",
            "last fortnight",
            "ende juni",
            "0x days ago",
            "99999999999 days ago",
        ] {
            assert_eq!(resolve_when(bad, at), None, "{bad:?}");
        }
    }

    #[test]
    fn a_month_without_a_year_is_the_nearest_on_either_side() {
        // Written 2 December 2026: "until January" is the coming one,
        // "since June" the past one.
        let at: DateTime<Utc> = "2026-12-02T10:00:00Z".parse().expect("a time");
        assert_eq!(resolve_when("january", at), day("2027-01-01"));
        assert_eq!(resolve_when("end of july", at), day("2026-07-31"));
        // Six months either way: the one ahead wins the tie.
        assert_eq!(resolve_when("june", at), day("2027-06-01"));
    }
}
