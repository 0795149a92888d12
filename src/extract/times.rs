//! A fact's times: its start and end from what the model wrote, the
//! fact's sentence and the episode's time.

use chrono::{DateTime, NaiveDate, NaiveTime, Utc};

use crate::cues::Switches;
use crate::cues::ends::stated_end;
use crate::values::parse_time;

/// The start of a fact whose text states none, when the model is not
/// asked for it (`extract.fact_start = "text"`): the episode's time, which
/// is when the fact is known to hold, unless the fact had ended by then
/// (its start is then unknown).
pub(super) fn default_start(
    invalid_at: Option<DateTime<Utc>>,
    reference: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    invalid_at
        .is_none_or(|end| end > reference)
        .then_some(reference)
}

/// The instant of a day a fact's time is given as: the episode's own
/// time on the episode's day, so that two episodes of one day keep their
/// order (a move in the afternoon after a join that morning), else the
/// day's start.
pub(super) fn on_day(day: NaiveDate, reference: DateTime<Utc>) -> DateTime<Utc> {
    if day == reference.date_naive() {
        reference
    } else {
        day.and_time(NaiveTime::MIN).and_utc()
    }
}

/// A date or time a model wrote for a fact: the schema asks for dates
/// without a time of day, which [`on_day`] places; a time the model did
/// write is kept. `None` when nothing parseable was written.
pub(super) fn written_time(v: Option<&str>, reference: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let t = parse_time(v).ok().flatten()?;
    let date_only = v.is_some_and(|v| v.trim().len() == 10);
    Some(if date_only {
        on_day(t.date_naive(), reference)
    } else {
        t
    })
}

/// A fact's `valid_at` and `invalid_at` from the start and end it was
/// given (by the model, or the start by its sentence), the fact's sentence
/// and, when both leave the end out, `episode_end` (the end the episode
/// states for the pair, [`Sentences::pair_end`]), at an episode written at
/// `reference`.
pub(super) fn fact_times(
    mut valid_at: Option<DateTime<Utc>>,
    mut invalid_at: Option<DateTime<Utc>>,
    text: &str,
    cues: &Switches,
    episode_end: impl FnOnce() -> Option<NaiveDate>,
    reference: DateTime<Utc>,
) -> (Option<DateTime<Utc>>, Option<DateTime<Utc>>) {
    let end_written = invalid_at.is_some();
    let ends = cues.fires("states_an_end", || crate::cues::ends::states_an_end(text));
    if valid_at.is_some() && invalid_at == valid_at && !ends {
        // One moment for both, as the model wrote them, is an event
        // ("signed on"), not a relationship that ended the moment it began.
        invalid_at = None;
    }
    if invalid_at.is_none() {
        // "On contract until the end of March": the fact's sentence, or
        // the episode's about the pair, gives an end the model left out.
        // Else, when the text says it ended, it had ended by the
        // episode's time.
        invalid_at = cues
            .gives("stated_end", || stated_end(text, reference.date_naive()))
            .or_else(episode_end)
            .map(|day| on_day(day, reference))
            .or(ends.then_some(reference));
        if invalid_at.is_some() && valid_at == invalid_at {
            // A start at that very time is the prompt's default for a
            // current fact, not a start.
            valid_at = None;
        }
    }
    if let (Some(v), Some(i)) = (valid_at, invalid_at)
        && i < v
    {
        if !end_written && v == reference {
            // The text's end before a start at the episode's own time: that
            // start is the prompt's default for a current fact ("Sofia is
            // no longer on it, since she left on Friday", written Monday).
            valid_at = None;
        } else {
            invalid_at = None;
        }
    }
    (valid_at, invalid_at)
}
