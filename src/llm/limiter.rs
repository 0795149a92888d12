//! The shared LLM budget: requests per minute and tokens per minute, each a
//! generic cell rate algorithm (GCRA) with a burst allowance.
//!
//! Each budget admits at most `limit` units in any 60 s window: it emits at
//! `limit - burst` units per minute and lets up to `burst` units go early.
//! A call reserves one request and its estimated tokens (prompt + max
//! completion) at a single send time that satisfies both budgets, so the
//! cells are placed where the request really goes out. Callers are served
//! first come, first served: the caller at the head sleeps until the
//! earliest time both budgets admit it, and is woken early when a finished
//! call gives tokens back.
//!
//! After the reply, [`Limiter::settle`] corrects the token reservation from
//! the reply's `usage`: unused tokens go back to the budget (unless the
//! budget went idle since, when there is nothing to return), extra tokens
//! push later slots back. This is why graphloom does not use `governor`:
//! its GCRA cannot return a reservation, and a token budget charged at
//! `max_tokens` would run far below the provider's limit.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// A budget cannot admit a reservation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// The reservation is larger than the budget's burst: it could never be
    /// sent without going over the limit.
    #[error(
        "a call needs {needed} {unit} but the {unit} budget admits at most {burst} at once (burst); raise llm.{key} (at most half of the per-minute limit) or send smaller calls"
    )]
    TooLarge {
        needed: u64,
        burst: u64,
        unit: &'static str,
        key: &'static str,
    },
    /// The configured limit and burst cannot work together.
    #[error("invalid {unit} budget: {reason}")]
    Invalid { unit: &'static str, reason: String },
}

/// One budget's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetConfig {
    /// Units admitted in any 60 s window.
    pub per_minute: u64,
    /// Units that may go at once; the steady rate is `per_minute - burst`.
    pub burst: u64,
}

impl BudgetConfig {
    /// The default burst: 5% of the limit (at least 1), so the steady rate is
    /// 95% of the limit and a short run starts at full speed.
    pub fn with_default_burst(per_minute: u64) -> Self {
        BudgetConfig {
            per_minute,
            burst: (per_minute / 20).max(1),
        }
    }
}

#[derive(Debug)]
struct Gcra {
    unit: &'static str,
    key: &'static str,
    burst: u64,
    /// Time one unit occupies at the steady rate.
    interval: Duration,
    /// Theoretical arrival time of the next unit.
    tat: Instant,
    /// Bumped whenever the budget was idle at a reservation (its TAT fell
    /// behind the clock); a refund is only exact within one epoch.
    epoch: u64,
}

impl Gcra {
    fn new(
        config: BudgetConfig,
        unit: &'static str,
        key: &'static str,
        now: Instant,
    ) -> Result<Self, LimitError> {
        let invalid = |reason: String| LimitError::Invalid { unit, reason };
        if config.per_minute == 0 {
            return Err(invalid("the per-minute limit must be at least 1".into()));
        }
        if config.burst == 0 {
            return Err(invalid("the burst must be at least 1".into()));
        }
        // The steady rate is what is left of the limit after the burst; a
        // limit of 1 per minute has no room for both, so it runs at 1/min
        // with a burst of 1 (at most 2 in a window, documented).
        let rate = config.per_minute.saturating_sub(config.burst).max(1);
        if config.burst > config.per_minute {
            return Err(invalid(format!(
                "burst {} is larger than the per-minute limit {}",
                config.burst, config.per_minute
            )));
        }
        // Rounded up: a interval rounded down would let the steady rate creep
        // past the limit.
        let interval = Duration::from_nanos(60_000_000_000u64.div_ceil(rate).max(1));
        Ok(Gcra {
            unit,
            key,
            burst: config.burst,
            interval,
            tat: now,
            epoch: 0,
        })
    }

    fn check(&self, n: u64) -> Result<(), LimitError> {
        if n > self.burst {
            return Err(LimitError::TooLarge {
                needed: n,
                burst: self.burst,
                unit: self.unit,
                key: self.key,
            });
        }
        Ok(())
    }

    /// Earliest time `n` units conform.
    fn earliest(&self, n: u64, now: Instant) -> Instant {
        // Conforms at t when max(tat, t) + n*I - t <= burst*I.
        let ahead = times(self.interval, n);
        let allowance = times(self.interval, self.burst);
        let candidate = (self.tat + ahead).checked_sub(allowance).unwrap_or(now);
        candidate.max(now)
    }

    fn take(&mut self, n: u64, at: Instant) -> u64 {
        if at > self.tat {
            self.tat = at;
            self.epoch += 1;
        }
        self.tat += times(self.interval, n);
        self.epoch
    }
}

fn times(interval: Duration, n: u64) -> Duration {
    Duration::from_nanos((interval.as_nanos() as u64).saturating_mul(n))
}

/// A granted slot: one request and `tokens` tokens, sent at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// When the budget admitted the call.
    pub at: Instant,
    /// Tokens reserved.
    pub tokens: u64,
    token_epoch: u64,
}

#[derive(Debug)]
struct State {
    requests: Gcra,
    tokens: Gcra,
    /// Tickets of the callers waiting, first come first served.
    queue: VecDeque<u64>,
    next_ticket: u64,
}

/// The request and token budgets of one run, shared by every stage.
#[derive(Debug)]
pub struct Limiter {
    state: Mutex<State>,
    /// Woken when the head of the queue may have changed or a settlement
    /// returned tokens.
    changed: Notify,
}

/// Removes a waiter's ticket if its future is dropped before it is served.
struct Ticket<'a> {
    limiter: &'a Limiter,
    id: u64,
    served: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.served {
            let mut state = self.limiter.lock();
            state.queue.retain(|t| *t != self.id);
            drop(state);
            self.limiter.changed.notify_waiters();
        }
    }
}

impl Limiter {
    /// A limiter with the given request and token budgets.
    pub fn new(requests: BudgetConfig, tokens: BudgetConfig) -> Result<Self, LimitError> {
        let now = Instant::now();
        Ok(Limiter {
            state: Mutex::new(State {
                requests: Gcra::new(requests, "requests", "request_burst", now)?,
                tokens: Gcra::new(tokens, "tokens", "token_burst", now)?,
                queue: VecDeque::new(),
                next_ticket: 0,
            }),
            changed: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until both budgets admit one request and `tokens` tokens, then
    /// charges them at that moment. Callers are served in arrival order;
    /// the one at the head waits for the earliest time the budgets allow,
    /// and is woken early when a settlement returns tokens. A call larger
    /// than a burst fails at once.
    pub async fn acquire(&self, tokens: u64) -> Result<Reservation, LimitError> {
        let mut ticket = {
            let mut state = self.lock();
            state.requests.check(1)?;
            state.tokens.check(tokens)?;
            let id = state.next_ticket;
            state.next_ticket += 1;
            state.queue.push_back(id);
            Ticket {
                limiter: self,
                id,
                served: false,
            }
        };
        loop {
            // Register for wake-ups before looking, so none is missed.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wait_until = {
                let mut state = self.lock();
                if state.queue.front() == Some(&ticket.id) {
                    let now = Instant::now();
                    let at = state
                        .requests
                        .earliest(1, now)
                        .max(state.tokens.earliest(tokens, now));
                    if at <= now {
                        state.requests.take(1, now);
                        let token_epoch = state.tokens.take(tokens, now);
                        state.queue.pop_front();
                        ticket.served = true;
                        drop(state);
                        self.changed.notify_waiters();
                        return Ok(Reservation {
                            at: now,
                            tokens,
                            token_epoch,
                        });
                    }
                    Some(at)
                } else {
                    None
                }
            };
            match wait_until {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = &mut notified => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Corrects a reservation once the real token count is known (0 for a
    /// request the provider refused without processing it).
    pub fn settle(&self, reservation: &Reservation, actual_tokens: u64) {
        let mut state = self.lock();
        let budget = &mut state.tokens;
        if actual_tokens > reservation.tokens {
            budget.tat += times(budget.interval, actual_tokens - reservation.tokens);
        } else if budget.epoch == reservation.token_epoch {
            let unused = times(budget.interval, reservation.tokens - actual_tokens);
            let floor = reservation.at;
            budget.tat = budget.tat.checked_sub(unused).unwrap_or(floor).max(floor);
        }
        drop(state);
        self.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn limiter(rpm: u64, rburst: u64, tpm: u64, tburst: u64) -> Arc<Limiter> {
        Arc::new(
            Limiter::new(
                BudgetConfig {
                    per_minute: rpm,
                    burst: rburst,
                },
                BudgetConfig {
                    per_minute: tpm,
                    burst: tburst,
                },
            )
            .expect("valid budgets"),
        )
    }

    /// Acquires in order, one after another, and returns the grant times.
    async fn grants(l: &Limiter, sizes: &[u64]) -> Vec<Instant> {
        let mut out = Vec::new();
        for n in sizes {
            out.push(l.acquire(*n).await.expect("fits").at);
        }
        out
    }

    /// Largest weight of grants that fall in any window of `window`.
    fn max_in_window(times: &[Instant], weights: &[u64], window: Duration) -> u64 {
        let mut best = 0;
        for (i, start) in times.iter().enumerate() {
            let sum: u64 = times
                .iter()
                .zip(weights)
                .skip(i)
                .take_while(|(t, _)| **t < *start + window)
                .map(|(_, w)| *w)
                .sum();
            best = best.max(sum);
        }
        best
    }

    #[tokio::test(start_paused = true)]
    async fn requests_never_exceed_the_limit_in_any_minute() {
        let l = limiter(60, 3, 1_000_000, 50_000);
        let slots = grants(&l, &[10; 300]).await;
        let ones = vec![1; slots.len()];
        let max = max_in_window(&slots, &ones, Duration::from_secs(60));
        assert!((59..=60).contains(&max), "{max} requests in one minute");
        // Three go at once (the burst), then one every 60/57 s.
        assert_eq!(slots[2], slots[0]);
        assert!(slots[3] > slots[2]);
        let span = slots[299] - slots[0];
        let per_minute = 299.0 / span.as_secs_f64() * 60.0;
        assert!(
            (56.0..=58.0).contains(&per_minute),
            "steady rate {per_minute}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_never_exceed_the_limit_in_any_minute() {
        let l = limiter(10_000, 500, 10_000, 2_000);
        let sizes: Vec<u64> = (0..200).map(|i| 100 + (i * 37) % 900).collect();
        let slots = grants(&l, &sizes).await;
        let max = max_in_window(&slots, &sizes, Duration::from_secs(60));
        assert!(max <= 10_000, "{max} tokens in one minute");
        assert!(
            max >= 9_000,
            "the budget is used, not just respected: {max}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_are_served_in_arrival_order_within_the_limit() {
        let l = limiter(120, 2, 1_000_000, 50_000);
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let l = l.clone();
                tokio::spawn(async move { (i, l.acquire(1).await.expect("fits").at) })
            })
            .collect();
        let mut got = Vec::new();
        for t in tasks {
            got.push(t.await.expect("task"));
        }
        let times: Vec<Instant> = got.iter().map(|(_, t)| *t).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "served in order");
        let ones = vec![1; times.len()];
        assert!(max_in_window(&times, &ones, Duration::from_secs(60)) <= 120);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_larger_than_the_burst_is_an_error_not_a_wait() {
        let l = limiter(600, 30, 100_000, 5_000);
        let err = l.acquire(5_001).await.expect_err("too large");
        assert!(err.to_string().contains("needs 5001 tokens"), "{err}");
        assert!(err.to_string().contains("llm.token_burst"), "{err}");
        assert!(l.acquire(5_000).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn unused_tokens_return_to_the_budget() {
        let l = limiter(10_000, 1_000, 6_000, 1_000);
        // The burst goes at once; the next 1000 tokens would wait 12 s at
        // the steady rate of 5000 tokens/min...
        let start = Instant::now();
        let first = l.acquire(1_000).await.expect("fits");
        assert_eq!(first.at, start);
        // ...but the first call used only 100, so 900 come back and the
        // second waits for 100 tokens' worth: 1.2 s.
        l.settle(&first, 100);
        let second = l.acquire(1_000).await.expect("fits");
        assert_eq!(second.at - start, Duration::from_millis(1_200));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_woken_when_tokens_come_back() {
        let l = limiter(10_000, 1_000, 6_000, 1_000);
        let start = Instant::now();
        let first = l.acquire(1_000).await.expect("fits");
        let waiter = {
            let l = l.clone();
            tokio::spawn(async move { l.acquire(1_000).await.expect("fits").at })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        // The waiter is due at 12 s; a refund of 900 tokens makes it due at
        // 1.2 s, and it must not sleep on until 12 s.
        l.settle(&first, 100);
        let at = waiter.await.expect("task");
        assert_eq!(at - start, Duration::from_millis(1_200));
    }

    #[tokio::test(start_paused = true)]
    async fn extra_tokens_push_later_calls_back() {
        let l = limiter(10_000, 1_000, 6_000, 1_000);
        let start = Instant::now();
        let first = l.acquire(500).await.expect("fits");
        l.settle(&first, 1_500);
        let next = l.acquire(1_000).await.expect("fits");
        // 1500 used + 1000 wanted - 1000 burst = 1500 tokens at 5000/min.
        assert_eq!(next.at - start, Duration::from_secs(18));
    }

    #[tokio::test(start_paused = true)]
    async fn no_refund_after_the_budget_went_idle() {
        let l = limiter(10_000, 1_000, 6_000, 1_000);
        let first = l.acquire(1_000).await.expect("fits");
        tokio::time::advance(Duration::from_secs(120)).await;
        let second = l.acquire(1_000).await.expect("fits");
        // The idle minutes already gave the budget back; refunding the
        // first call now would let more than the burst go at once.
        l.settle(&first, 0);
        let third = l.acquire(1_000).await.expect("fits");
        assert_eq!(third.at - second.at, Duration::from_secs(12));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_does_not_block_the_queue() {
        let l = limiter(60, 1, 1_000_000, 50_000);
        l.acquire(1).await.expect("fits");
        // This one would wait ~1 s; cancel it after 100 ms.
        let cancelled = tokio::time::timeout(Duration::from_millis(100), l.acquire(1)).await;
        assert!(cancelled.is_err());
        let next = tokio::time::timeout(Duration::from_secs(5), l.acquire(1)).await;
        assert!(
            next.is_ok(),
            "the queue moved on after the cancelled waiter"
        );
    }

    #[test]
    fn invalid_budgets_are_rejected() {
        let bad = Limiter::new(
            BudgetConfig {
                per_minute: 10,
                burst: 11,
            },
            BudgetConfig::with_default_burst(1000),
        );
        assert!(matches!(bad, Err(LimitError::Invalid { .. })));
        let zero = Limiter::new(
            BudgetConfig {
                per_minute: 0,
                burst: 1,
            },
            BudgetConfig::with_default_burst(1000),
        );
        assert!(zero.is_err());
        assert_eq!(BudgetConfig::with_default_burst(600).burst, 30);
        assert_eq!(BudgetConfig::with_default_burst(10).burst, 1);
    }
}
