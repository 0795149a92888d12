//! How many calls go to the model at once: a limit that follows what the
//! server sustains, between 1 and `llm.max_concurrency`.
//!
//! A CPU server with sixteen slots decodes sixteen calls together, each
//! at a sixteenth of the speed: more calls in flight add little
//! throughput and make every call late (ten of twelve episodes of a
//! clinical archive ran past a 300 s budget that way). A hosted API, on
//! the other hand, serves many calls at full speed. So the limit is
//! found, not set:
//!
//! * it starts at [`START`] (or the maximum, when lower) and doubles
//!   after each round of calls that raised the completed tokens per second
//!   by at least [`GAIN`], then grows by one (slow start, as in TCP),
//!   unless a call of the round took more than a quarter of the time an
//!   attempt may take (its timeout, or what is left of its budget);
//! * a round whose throughput fell by more than [`GAIN`] steps it down by
//!   one; in between it holds;
//! * an overload (an attempt that timed out, a 429 or 5xx, or a reply
//!   after more than half of the time it was allowed) halves it at once.
//!
//! A round is as many completed attempts as the limit (at least two),
//! after the completion that opens it, once the calls that were in flight
//! at the last change are back: its throughput is the completion
//! tokens they returned over the time since that opening completion.
//! Lowering the limit never cancels a call: permits of calls in flight
//! are retired as those calls end.
//!
//! With `llm.adaptive_concurrency = false` the limit is the maximum.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// The limit a run starts at, when `llm.max_concurrency` is higher.
pub const START: usize = 2;

/// The change in throughput a round must show to move the limit: 10%.
pub const GAIN: f64 = 0.10;

/// The calls-in-flight limit of one client.
#[derive(Debug)]
pub struct Concurrency {
    permits: Semaphore,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    adaptive: bool,
    max: usize,
    /// The limit now.
    limit: usize,
    /// Permits to retire as calls end, after the limit was lowered.
    debt: usize,
    /// Doubling rather than adding one.
    slow_start: bool,
    /// Completions still to pass before a round opens: the calls that were
    /// in flight when the limit changed ran under the old one.
    settle: usize,
    /// The round being measured.
    round: Round,
    /// The throughput of the last complete round, in tokens per second.
    last: Option<f64>,
    /// The lowest and highest limit the run used.
    low: usize,
    high: usize,
}

#[derive(Debug, Default)]
struct Round {
    first: Option<Instant>,
    completed: usize,
    tokens: u64,
    /// A call of the round took more than a quarter of its time.
    crowded: bool,
}

/// How an attempt ended, as the limit reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// A reply came, with this many completion tokens, after this long in
    /// service; `allowed` is the most an attempt may take (the attempt
    /// timeout, or what is left of the call's budget when less).
    Replied {
        tokens: u64,
        took: Duration,
        allowed: Duration,
    },
    /// The server is overloaded: an attempt timed out or was told to back
    /// off (429, 5xx).
    Overloaded,
}

/// A slot for one attempt; the slot goes back (or is retired, after the
/// limit was lowered) when it is dropped.
pub struct Slot<'a> {
    permit: Option<SemaphorePermit<'a>>,
    of: &'a Concurrency,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let mut state = self.of.lock();
        if state.debt > 0 {
            state.debt -= 1;
            permit.forget();
        }
    }
}

impl Concurrency {
    /// A limit between 1 and `max` that adapts, or `max` fixed.
    pub fn new(max: usize, adaptive: bool) -> Self {
        let max = max.max(1);
        let limit = if adaptive { START.min(max) } else { max };
        Concurrency {
            permits: Semaphore::new(limit),
            state: Mutex::new(State {
                adaptive,
                max,
                limit,
                debt: 0,
                slow_start: true,
                settle: 0,
                round: Round::default(),
                last: None,
                low: limit,
                high: limit,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a slot; `None` once the client is closed.
    pub async fn acquire(&self) -> Option<Slot<'_>> {
        let permit = self.permits.acquire().await.ok()?;
        Some(Slot {
            permit: Some(permit),
            of: self,
        })
    }

    /// The limit now.
    pub fn limit(&self) -> usize {
        self.lock().limit
    }

    /// The highest limit allowed.
    pub fn max(&self) -> usize {
        self.lock().max
    }

    /// The lowest and the highest limit used so far.
    pub fn range(&self) -> (usize, usize) {
        let state = self.lock();
        (state.low, state.high)
    }

    /// Feeds one attempt's outcome to the limit.
    pub fn record(&self, outcome: Outcome) {
        let mut state = self.lock();
        if !state.adaptive {
            return;
        }
        let (tokens, took, allowed) = match outcome {
            Outcome::Replied {
                tokens,
                took,
                allowed,
            } if took <= allowed / 2 => (tokens, took, allowed),
            // Overloaded, or a reply after half its time.
            _ => {
                let to = (state.limit / 2).max(1);
                state.slow_start = false;
                self.set(&mut state, to, "the server is overloaded or calls run late");
                return;
            }
        };
        if state.settle > 0 {
            state.settle -= 1;
            return;
        }
        let now = Instant::now();
        let round_size = state.limit.max(2);
        let round = &mut state.round;
        // The first completion opens the round: the time before it is not
        // measured, so its tokens do not count either (with them, a round
        // of two would read twice its rate).
        let Some(first) = round.first else {
            round.first = Some(now);
            return;
        };
        round.completed += 1;
        round.tokens = round.tokens.saturating_add(tokens);
        // A round with a call past a quarter of its time has no room to
        // grow: more calls at once would make every one later.
        round.crowded |= took > allowed / 4;
        if round.completed < round_size {
            return;
        }
        let secs = now.duration_since(first).as_secs_f64();
        let rate = if secs > 0.0 {
            round.tokens as f64 / secs
        } else {
            f64::INFINITY
        };
        let last = state.last.replace(rate);
        let crowded = state.round.crowded;
        state.round = Round::default();
        match last {
            Some(last) if rate < last * (1.0 - GAIN) => {
                state.slow_start = false;
                let to = state.limit.saturating_sub(1).max(1);
                self.set(&mut state, to, "throughput fell");
            }
            Some(last) if rate < last * (1.0 + GAIN) => {
                // Flat: more calls would only make each one later.
                state.slow_start = false;
            }
            _ if crowded => state.slow_start = false,
            _ if state.limit < state.max => {
                let to = if state.slow_start {
                    state.limit * 2
                } else {
                    state.limit + 1
                };
                let to = to.min(state.max);
                self.set(&mut state, to, "throughput grew");
            }
            _ => {}
        }
    }

    fn set(&self, state: &mut State, to: usize, why: &str) {
        let from = state.limit;
        if to == from {
            return;
        }
        if to > from {
            // Permits still owed are cancelled before new ones are added.
            let mut add = to - from;
            let paid = add.min(state.debt);
            state.debt -= paid;
            add -= paid;
            self.permits.add_permits(add);
        } else {
            let mut owe = from - to;
            // Free permits are retired now, the rest as calls end.
            while owe > 0 {
                match self.permits.try_acquire() {
                    Ok(p) => {
                        p.forget();
                        owe -= 1;
                    }
                    Err(_) => break,
                }
            }
            state.debt += owe;
        }
        state.limit = to;
        state.low = state.low.min(to);
        state.high = state.high.max(to);
        // A new limit is measured afresh, once the calls sent under the
        // old one are back.
        state.round = Round::default();
        state.settle = from;
        tracing::info!("calls in flight: {from} → {to} ({why})");
    }
}

/// The time budget of one call (`ChatRequest::budget`), counted from the
/// moment its first attempt is sent: waiting for a slot of this client or
/// for the rate limiter does not count, retries, backoffs and a repair
/// do. Unbounded without a budget.
#[derive(Debug)]
pub struct CallClock {
    budget: Option<Duration>,
    sent: Mutex<Option<Instant>>,
}

impl CallClock {
    /// A clock for a call with this budget.
    pub fn new(budget: Option<Duration>) -> Self {
        CallClock {
            budget,
            sent: Mutex::new(None),
        }
    }

    /// Marks an attempt going out (the first one starts the clock) and
    /// returns the time left, `None` when unbounded.
    pub fn sending(&self) -> Option<Duration> {
        let budget = self.budget?;
        let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        let first = *sent.get_or_insert_with(Instant::now);
        Some(budget.saturating_sub(first.elapsed()))
    }

    /// Whether the budget is spent.
    pub fn spent(&self) -> bool {
        let sent = *self.sent.lock().unwrap_or_else(|p| p.into_inner());
        matches!((self.budget, sent), (Some(b), Some(first)) if first.elapsed() >= b)
    }

    /// What a call past its budget says.
    pub fn past_budget(&self) -> String {
        format!(
            "the call ran past its time budget of {} s, counted from its first request (extract.call_budget_secs)",
            self.budget.unwrap_or_default().as_secs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replied(tokens: u64) -> Outcome {
        Outcome::Replied {
            tokens,
            took: Duration::from_secs(1),
            allowed: Duration::from_secs(300),
        }
    }

    /// One round at the current limit: the opening completion, then one
    /// second later as many completions as the limit, `tokens` each.
    async fn round(c: &Concurrency, tokens: u64) {
        c.lock().settle = 0;
        c.record(replied(tokens));
        tokio::time::advance(Duration::from_secs(1)).await;
        for _ in 0..c.limit().max(2) {
            c.record(replied(tokens));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_limit_doubles_while_throughput_grows_and_holds_when_it_is_flat() {
        let c = Concurrency::new(16, true);
        assert_eq!(c.limit(), START);
        // 2 × 50 tokens in 1 s; no earlier round, so it grows.
        round(&c, 50).await;
        assert_eq!(c.limit(), 4);
        // 4 × 100 in 1 s, four times as many: it doubles.
        round(&c, 100).await;
        assert_eq!(c.limit(), 8);
        // 8 × 50: the same 400 tokens per second, flat: it holds.
        round(&c, 50).await;
        assert_eq!(c.limit(), 8);
        round(&c, 52).await;
        assert_eq!(c.limit(), 8, "within 10% it still holds");
        assert_eq!(c.range(), (2, 8));
    }

    #[tokio::test(start_paused = true)]
    async fn an_overload_or_a_late_call_halves_the_limit_and_permits_of_calls_in_flight_retire() {
        let c = Concurrency::new(8, true);
        c.set(&mut c.lock(), 8, "test");
        let slots: Vec<Slot<'_>> = futures::future::join_all((0..8).map(|_| c.acquire()))
            .await
            .into_iter()
            .map(|s| s.expect("open"))
            .collect();
        c.record(Outcome::Overloaded);
        assert_eq!(c.limit(), 4);
        // All eight are in flight: four permits are owed and retired as
        // calls end, so only the last four ends free a slot.
        let mut slots = slots.into_iter();
        for s in slots.by_ref().take(4) {
            drop(s);
        }
        assert_eq!(c.permits.available_permits(), 0);
        drop(slots);
        assert_eq!(c.permits.available_permits(), 4);
        // A call that took more than half its budget halves it again.
        c.record(Outcome::Replied {
            tokens: 10,
            took: Duration::from_secs(200),
            allowed: Duration::from_secs(300),
        });
        assert_eq!(c.limit(), 2);
        assert_eq!(c.permits.available_permits(), 2);
        // Never below one.
        c.record(Outcome::Overloaded);
        c.record(Outcome::Overloaded);
        assert_eq!(c.limit(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_with_a_call_past_a_quarter_of_its_time_does_not_grow() {
        let c = Concurrency::new(16, true);
        c.record(replied(50));
        tokio::time::advance(Duration::from_secs(1)).await;
        c.record(replied(50));
        c.record(Outcome::Replied {
            tokens: 500,
            took: Duration::from_secs(100),
            allowed: Duration::from_secs(300),
        });
        assert_eq!(
            c.limit(),
            START,
            "ten times the tokens, but one call took a third"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_that_loses_throughput_steps_down_and_a_fixed_limit_never_moves() {
        let c = Concurrency::new(8, true);
        c.set(&mut c.lock(), 4, "test");
        c.lock().slow_start = false;
        for (tokens, limit) in [(100, 5), (100, 6), (20, 5)] {
            round(&c, tokens).await;
            assert_eq!(c.limit(), limit);
        }
        let fixed = Concurrency::new(8, false);
        fixed.record(Outcome::Overloaded);
        assert_eq!((fixed.limit(), fixed.permits.available_permits()), (8, 8));
    }
}
