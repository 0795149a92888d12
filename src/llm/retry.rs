//! Which failures are worth another attempt, and how long to wait.

use std::time::Duration;

use chrono::Utc;
use rand::Rng;

/// Retry settings (`llm.max_attempts`, `llm.backoff_initial_ms`,
/// `llm.backoff_max_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included.
    pub max_attempts: u32,
    /// Ceiling of the first backoff.
    pub initial: Duration,
    /// Largest backoff between two attempts (a `Retry-After` may ask for
    /// longer, up to [`MAX_RETRY_AFTER`]).
    pub max: Duration,
}

/// Longest `Retry-After` honoured; a provider asking for more is treated as
/// a failure rather than parking a run for hours.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

impl RetryPolicy {
    /// Exponential backoff with full jitter: a random wait in
    /// `[0, min(max, initial * 2^(attempt-1))]`, so that many clients that
    /// failed together do not retry together.
    pub fn backoff(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        let exp = 2u32.saturating_pow(attempt.saturating_sub(1).min(20));
        let ceiling = self.initial.saturating_mul(exp).min(self.max);
        let nanos = ceiling.as_nanos() as u64;
        if nanos == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(rng.random_range(0..=nanos))
    }
}

/// How a failed attempt is handled.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Worth another attempt, after `retry_after` if the server said so.
    Retry { retry_after: Option<Duration> },
    /// Retrying cannot help (bad request, auth, exhausted quota).
    Fatal,
}

/// Classifies an HTTP status and error body.
pub fn classify(status: u16, body: &str, retry_after: Option<Duration>) -> Verdict {
    match status {
        // An exhausted quota or billing problem does not pass with time.
        429 if body.contains("insufficient_quota") || body.contains("billing") => Verdict::Fatal,
        408 | 409 | 425 | 429 => Verdict::Retry { retry_after },
        500..=599 => Verdict::Retry { retry_after },
        _ => Verdict::Fatal,
    }
}

/// Parses a `Retry-After` header (seconds or an HTTP date) or OpenAI's
/// `retry-after-ms`. Negative, infinite and unparsable values are ignored;
/// a finite wait too long for a [`Duration`] (`1e300`) is
/// [`Duration::MAX`], which is past [`MAX_RETRY_AFTER`], so the call gives
/// up instead of waiting.
pub fn parse_retry_after(
    retry_after: Option<&str>,
    retry_after_ms: Option<&str>,
) -> Option<Duration> {
    if let Some(wait) = retry_after_ms
        .and_then(|v| v.trim().parse::<f64>().ok())
        .and_then(|ms| seconds(ms / 1000.0))
    {
        return Some(wait);
    }
    let value = retry_after?.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return seconds(secs);
    }
    let when = httpdate::parse_http_date(value).ok()?;
    let when: chrono::DateTime<Utc> = when.into();
    Some((when - Utc::now()).to_std().unwrap_or(Duration::ZERO))
}

/// A wait of `secs` seconds. `Duration::from_secs_f64` panics on values
/// it cannot hold, and servers may send anything.
fn seconds(secs: f64) -> Option<Duration> {
    if !(secs.is_finite() && secs >= 0.0) {
        return None;
    }
    Some(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn retry_after_reads_seconds_dates_and_milliseconds() {
        assert_eq!(
            parse_retry_after(Some("2"), None),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            parse_retry_after(Some("1.5"), None),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after(Some("7"), Some("250")),
            Some(Duration::from_millis(250))
        );
        let later = std::time::SystemTime::now() + Duration::from_secs(30);
        let parsed = parse_retry_after(Some(&httpdate::fmt_http_date(later)), None).expect("date");
        assert!(
            parsed > Duration::from_secs(25) && parsed <= Duration::from_secs(30),
            "{parsed:?}"
        );
        let past = std::time::SystemTime::now() - Duration::from_secs(30);
        assert_eq!(
            parse_retry_after(Some(&httpdate::fmt_http_date(past)), None),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after(Some("soon"), None), None);
        assert_eq!(parse_retry_after(Some("-3"), None), None);
        // Too long for a Duration: the longest one (the call gives up), not
        // a panic.
        for huge in ["1e300", "18446744073709551616"] {
            assert_eq!(parse_retry_after(Some(huge), None), Some(Duration::MAX));
            assert!(parse_retry_after(None, Some(huge)).is_some_and(|d| d > MAX_RETRY_AFTER));
        }
        assert_eq!(parse_retry_after(Some("-0"), None), Some(Duration::ZERO));
    }

    #[test]
    fn transient_statuses_retry_and_client_errors_fail_fast() {
        for status in [408, 409, 429, 500, 502, 503, 504] {
            assert!(
                matches!(classify(status, "", None), Verdict::Retry { .. }),
                "{status}"
            );
        }
        for status in [400, 401, 403, 404, 422] {
            assert_eq!(classify(status, "", None), Verdict::Fatal, "{status}");
        }
        let quota = r#"{"error":{"code":"insufficient_quota","message":"You exceeded your current quota"}}"#;
        assert_eq!(
            classify(429, quota, Some(Duration::from_secs(1))),
            Verdict::Fatal
        );
    }

    #[test]
    fn backoff_grows_and_stays_under_the_ceiling() {
        let policy = RetryPolicy {
            max_attempts: 6,
            initial: Duration::from_millis(500),
            max: Duration::from_secs(8),
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for attempt in 1..=10 {
            let ceiling = Duration::from_millis(500 * (1 << (attempt - 1).min(4)));
            for _ in 0..50 {
                let wait = policy.backoff(attempt, &mut rng);
                assert!(
                    wait <= ceiling.min(Duration::from_secs(8)),
                    "attempt {attempt}: {wait:?}"
                );
            }
        }
        // Jitter spreads the waits.
        let waits: std::collections::BTreeSet<_> =
            (0..20).map(|_| policy.backoff(3, &mut rng)).collect();
        assert!(waits.len() > 10);
    }
}
