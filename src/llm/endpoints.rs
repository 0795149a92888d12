//! Several servers of one model behind the one budget (`[[llm.endpoints]]`):
//! which server an attempt goes to, resting a server that keeps failing,
//! and what each server did.
//!
//! The global limiter and `llm.max_concurrency` stay the run's one budget;
//! the pool only decides where an admitted attempt goes. An attempt goes to
//! the endpoint with the fewest calls in flight per unit of weight among
//! those with a free slot; ties go to the one that started the fewest
//! attempts per unit of weight (so one-at-a-time calls are spread by
//! weight too), then to the first listed. An endpoint that fails
//! `endpoint_failures_to_rest` attempts in a row is rested; when its rest
//! is over, one attempt probes it (the others keep away until the probe
//! answers): a success brings it back, a failure rests it twice as long,
//! up to `endpoint_rest_max_ms`. A single endpoint is never rested: with
//! nowhere else to go, the retry backoff is the right wait.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::spec::LlmSpec;

/// What one endpoint did during a run, for the run's summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// The endpoint's base URL without credentials, query or fragment.
    pub endpoint: String,
    /// HTTP attempts sent to it.
    pub attempts: u64,
    /// Of those, attempts that failed in a way worth retrying elsewhere
    /// (no reply, a timeout, 5xx, 429, a broken body).
    pub failed_attempts: u64,
    /// Times it was rested after failing repeatedly.
    pub rests: u64,
}

/// When an attempt fails on an endpoint.
#[derive(Debug, Clone, Copy)]
struct RestPolicy {
    failures_to_rest: u32,
    initial: Duration,
    max: Duration,
}

/// The health of one endpoint.
#[derive(Debug, Default)]
struct Health {
    /// Failed attempts since its last answer.
    failures: u32,
    /// Rests in a row without an answer in between (for the doubling).
    rests: u32,
    /// Resting until then; once past, the next attempt is a probe.
    rested_until: Option<Instant>,
    /// A probe is in flight: keep away until it answers.
    probing: bool,
    /// Attempts started, for spreading one-at-a-time calls by weight.
    started: u64,
    stats: EndpointStats,
}

struct Member {
    base_url: String,
    weight: u64,
    slots: Semaphore,
    capacity: usize,
}

/// The endpoints of a run's client with their health.
pub(crate) struct Pool {
    members: Vec<Member>,
    health: Mutex<Vec<Health>>,
    policy: RestPolicy,
    /// Woken when a slot frees, a probe answers or a rest is recorded.
    changed: Notify,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Labels only: a base URL may carry credentials.
        let labels: Vec<String> = self.stats().into_iter().map(|s| s.endpoint).collect();
        f.debug_struct("Pool").field("endpoints", &labels).finish()
    }
}

/// A free slot on one endpoint, held for the attempt. Dropping it frees
/// the slot; a probe dropped without an outcome (a cancelled call) lets
/// the next attempt probe instead.
pub(crate) struct Slot<'a> {
    pool: &'a Pool,
    index: usize,
    probe: bool,
    permit: Option<SemaphorePermit<'a>>,
}

impl Slot<'_> {
    /// The index of the endpoint, for [`Pool::label`].
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// The endpoint's base URL (for requests only; it may hold
    /// credentials).
    pub(crate) fn base_url(&self) -> &str {
        &self.pool.members[self.index].base_url
    }

    /// Records the attempt's outcome: `true` when the server answered
    /// (also with a refusal: it is up), `false` for a failure worth
    /// retrying elsewhere.
    pub(crate) fn finish(mut self, answered: bool) {
        self.pool.record(self.index, self.probe, answered);
        self.probe = false;
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.probe {
            let mut health = self.pool.lock();
            if let Some(h) = health.get_mut(self.index) {
                h.probing = false;
            }
        }
        // The permit goes first, so that the woken waiters find it free.
        self.permit.take();
        self.pool.changed.notify_waiters();
    }
}

/// Why no slot could be had.
#[derive(Debug)]
pub(crate) struct AllResting {
    /// When the first rested endpoint comes back, if any is resting.
    pub(crate) next: Option<Duration>,
}

/// What one look at the pool found.
enum Look<'a> {
    Slot(Slot<'a>),
    /// Every usable endpoint is busy: wait for a slot.
    Busy,
    /// Every endpoint is resting or being probed: wait for the earliest.
    Resting(Option<Instant>),
}

impl Pool {
    /// The pool of `spec`: its `endpoints`, or `base_url` alone.
    pub(crate) fn new(spec: &LlmSpec) -> Pool {
        let global = spec.max_concurrency.max(1);
        let members: Vec<Member> = if spec.endpoints.is_empty() {
            vec![member(&spec.base_url, global, 1)]
        } else {
            spec.endpoints
                .iter()
                .map(|e| {
                    member(
                        &e.base_url,
                        e.max_concurrency.unwrap_or(global).max(1),
                        e.weight,
                    )
                })
                .collect()
        };
        let health = members
            .iter()
            .map(|m| Health {
                stats: EndpointStats {
                    endpoint: label(&m.base_url),
                    ..EndpointStats::default()
                },
                ..Health::default()
            })
            .collect();
        Pool {
            members,
            health: Mutex::new(health),
            policy: RestPolicy {
                failures_to_rest: spec.endpoint_failures_to_rest.max(1),
                initial: Duration::from_millis(spec.endpoint_rest_initial_ms),
                max: Duration::from_millis(spec.endpoint_rest_max_ms),
            },
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Health>> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of endpoints.
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// The label of endpoint `index` for `llm_calls.endpoint`.
    pub(crate) fn label(&self, index: usize) -> String {
        self.lock()
            .get(index)
            .map(|h| h.stats.endpoint.clone())
            .unwrap_or_default()
    }

    /// What every endpoint did so far, in the spec's order.
    pub(crate) fn stats(&self) -> Vec<EndpointStats> {
        self.lock().iter().map(|h| h.stats.clone()).collect()
    }

    /// A slot for the next attempt, avoiding `avoid` (the endpoint the
    /// last attempt failed on) while another endpoint can take it. Waits
    /// for a free slot as long as it takes (calls in flight end within
    /// their timeout), and for a rested endpoint at most `max_waits` times.
    pub(crate) async fn acquire(
        &self,
        avoid: Option<usize>,
        max_waits: u32,
    ) -> Result<Slot<'_>, AllResting> {
        let mut waits = 0;
        loop {
            // Registered before looking, so that a slot freed between the
            // look and the wait still wakes this caller.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.look(avoid) {
                Look::Slot(slot) => return Ok(slot),
                Look::Busy => notified.await,
                Look::Resting(until) => {
                    waits += 1;
                    if waits > max_waits {
                        return Err(AllResting {
                            next: until.map(|u| u.saturating_duration_since(Instant::now())),
                        });
                    }
                    match until {
                        Some(until) => {
                            tokio::select! {
                                _ = notified => {}
                                _ = tokio::time::sleep_until(until) => {}
                            }
                        }
                        None => notified.await,
                    }
                }
            }
        }
    }

    /// Picks and claims a slot if one is free.
    fn look(&self, avoid: Option<usize>) -> Look<'_> {
        let now = Instant::now();
        let mut health = self.lock();
        let mut best: Option<(usize, bool)> = None;
        let mut busy = false;
        let mut earliest: Option<Instant> = None;
        // The endpoint to avoid is only taken when no other one is free.
        for pass in [false, true] {
            for (i, (m, h)) in self.members.iter().zip(health.iter()).enumerate() {
                if (Some(i) == avoid) != pass {
                    continue;
                }
                let probe = match h.rested_until {
                    Some(until) if until > now => {
                        earliest = Some(earliest.map_or(until, |e| e.min(until)));
                        continue;
                    }
                    Some(_) if h.probing => continue,
                    Some(_) => true,
                    None => false,
                };
                let free = m.slots.available_permits();
                if free == 0 {
                    busy = true;
                    continue;
                }
                let better = match best {
                    None => true,
                    Some((b, _)) => self.before(i, &health[i], b, &health[b]),
                };
                if better {
                    best = Some((i, probe));
                }
            }
            if best.is_some() {
                break;
            }
        }
        let Some((index, probe)) = best else {
            return if busy {
                Look::Busy
            } else {
                Look::Resting(earliest)
            };
        };
        let Ok(permit) = self.members[index].slots.try_acquire() else {
            // Slots are only taken under this lock, so a free one stays
            // free; should that ever change, waiting is still correct.
            return Look::Busy;
        };
        let h = &mut health[index];
        h.started += 1;
        h.stats.attempts += 1;
        if probe {
            h.probing = true;
        }
        Look::Slot(Slot {
            pool: self,
            index,
            probe,
            permit: Some(permit),
        })
    }

    /// Whether endpoint `a` goes before `b`: fewer calls in flight per
    /// unit of weight, then fewer attempts started per unit of weight,
    /// then the order of the spec (`a` is compared only against earlier
    /// ones, so a tie keeps `b`).
    fn before(&self, a: usize, ha: &Health, b: usize, hb: &Health) -> bool {
        let (ma, mb) = (&self.members[a], &self.members[b]);
        let busy = |m: &Member| (m.capacity - m.slots.available_permits()) as u128;
        let (wa, wb) = (ma.weight as u128, mb.weight as u128);
        // (x_a / w_a) < (x_b / w_b) without division.
        let load = (busy(ma) * wb).cmp(&(busy(mb) * wa));
        let share = (ha.started as u128 * wb).cmp(&(hb.started as u128 * wa));
        load.then(share).is_lt()
    }

    /// Whether an endpoint other than `failed` has answered its last
    /// attempts and is not resting: the next attempt can go there at once.
    pub(crate) fn healthy_other_than(&self, failed: usize) -> bool {
        let now = Instant::now();
        self.lock().iter().enumerate().any(|(i, h)| {
            i != failed && h.failures == 0 && h.rested_until.is_none_or(|u| u <= now) && !h.probing
        })
    }

    fn record(&self, index: usize, probe: bool, answered: bool) {
        let many = self.members.len() > 1;
        let mut health = self.lock();
        // Back from a rest, an endpoint joins the others' share instead of
        // taking every one-at-a-time call until its count catches up.
        let level = self.members.get(index).map_or(0, |me| {
            let weight = u128::from(me.weight);
            health
                .iter()
                .zip(&self.members)
                .map(|(o, m)| (u128::from(o.started) * weight).div_ceil(u128::from(m.weight)))
                .max()
                .unwrap_or(0) as u64
        });
        let Some(h) = health.get_mut(index) else {
            return;
        };
        if probe {
            h.probing = false;
        }
        if answered {
            if h.rested_until.is_some() {
                tracing::info!("LLM endpoint {} answers again", h.stats.endpoint);
            }
            if probe {
                h.started = h.started.max(level);
            }
            h.failures = 0;
            h.rests = 0;
            h.rested_until = None;
        } else {
            h.failures += 1;
            h.stats.failed_attempts += 1;
            if many && (probe || h.failures >= self.policy.failures_to_rest) {
                let rest = self
                    .policy
                    .initial
                    .saturating_mul(2u32.saturating_pow(h.rests.min(20)))
                    .min(self.policy.max);
                h.rests += 1;
                h.stats.rests += 1;
                h.rested_until = Some(Instant::now() + rest);
                tracing::warn!(
                    "LLM endpoint {} failed {} attempts in a row; resting it for {rest:?}",
                    h.stats.endpoint,
                    h.failures
                );
            }
        }
        drop(health);
        self.changed.notify_waiters();
    }
}

fn member(base_url: &str, capacity: u32, weight: u32) -> Member {
    Member {
        base_url: base_url.trim().trim_end_matches('/').to_string(),
        weight: u64::from(weight.max(1)),
        slots: Semaphore::new(capacity as usize),
        capacity: capacity as usize,
    }
}

/// `base_url` as it may be shown and stored: scheme, host, port and path,
/// without user, password, query or fragment (any of which may carry a
/// key). A URL that does not parse is shown as `unparsable URL`, never as
/// written.
pub fn label(base_url: &str) -> String {
    match url::Url::parse(base_url.trim()) {
        Ok(u) => {
            let host = u.host_str().unwrap_or_default();
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!(
                "{}://{host}{port}{}",
                u.scheme(),
                u.path().trim_end_matches('/')
            )
        }
        Err(_) => "unparsable URL".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::EndpointSpec;

    fn spec(endpoints: &[(u32, u32)]) -> LlmSpec {
        LlmSpec {
            endpoints: endpoints
                .iter()
                .enumerate()
                .map(|(i, (cap, weight))| EndpointSpec {
                    base_url: format!("http://10.0.0.{i}:8000/v1"),
                    max_concurrency: Some(*cap),
                    weight: *weight,
                })
                .collect(),
            endpoint_failures_to_rest: 2,
            endpoint_rest_initial_ms: 60_000,
            endpoint_rest_max_ms: 240_000,
            ..LlmSpec::default()
        }
    }

    #[test]
    fn labels_drop_credentials_query_and_fragment() {
        assert_eq!(
            label("https://user:sk-secret@api.example.com:8443/v1/?key=abc#x"),
            "https://api.example.com:8443/v1"
        );
        assert_eq!(
            label("http://127.0.0.1:8093/v1/"),
            "http://127.0.0.1:8093/v1"
        );
        assert_eq!(label("not a url sk-123"), "unparsable URL");
    }

    #[tokio::test]
    async fn one_at_a_time_calls_follow_the_weights() {
        let pool = Pool::new(&spec(&[(4, 1), (4, 3)]));
        let mut count = [0; 2];
        for _ in 0..40 {
            let slot = pool.acquire(None, 1).await.expect("a slot");
            count[slot.index()] += 1;
            slot.finish(true);
        }
        assert_eq!(count, [10, 30]);
    }

    #[tokio::test]
    async fn busy_endpoints_give_way_to_free_ones() {
        let pool = Pool::new(&spec(&[(1, 1), (3, 1)]));
        let held: Vec<Slot<'_>> = {
            let mut v = Vec::new();
            for _ in 0..4 {
                v.push(pool.acquire(None, 1).await.expect("a slot"));
            }
            v
        };
        let mut on = held.iter().map(Slot::index).collect::<Vec<_>>();
        on.sort_unstable();
        assert_eq!(on, [0, 1, 1, 1]);
        // Both full: the next caller waits until a slot frees.
        assert!(matches!(pool.look(None), Look::Busy));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_endpoint_rests_then_one_probe_brings_it_back() {
        let pool = Pool::new(&spec(&[(4, 1), (4, 1)]));
        for _ in 0..2 {
            let slot = pool.acquire(Some(1), 1).await.expect("a slot");
            assert_eq!(slot.index(), 0);
            slot.finish(false);
        }
        assert_eq!(pool.stats()[0].rests, 1);
        // Resting: every attempt goes to the other one, even when asked to
        // avoid it.
        for _ in 0..5 {
            let slot = pool.acquire(Some(1), 1).await.expect("a slot");
            assert_eq!(slot.index(), 1);
            slot.finish(true);
        }
        tokio::time::advance(Duration::from_secs(61)).await;
        let probe = pool.acquire(Some(1), 1).await.expect("the probe");
        assert_eq!(probe.index(), 0);
        // While the probe is out, nobody else goes there.
        let other = pool.acquire(None, 1).await.expect("a slot");
        assert_eq!(other.index(), 1);
        drop(other);
        probe.finish(false);
        // The failed probe doubles the rest.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(pool.acquire(Some(1), 1).await.expect("a slot").index(), 1);
        tokio::time::advance(Duration::from_secs(60)).await;
        let probe = pool.acquire(Some(1), 1).await.expect("the probe");
        assert_eq!(probe.index(), 0);
        probe.finish(true);
        let stats = pool.stats();
        assert_eq!((stats[0].failed_attempts, stats[0].rests), (3, 2));
        assert!(pool.healthy_other_than(1));
    }

    #[tokio::test(start_paused = true)]
    async fn with_every_endpoint_resting_a_caller_waits_for_the_first_back() {
        let pool = Pool::new(&spec(&[(4, 1), (4, 1)]));
        for _ in 0..4 {
            let slot = pool.acquire(None, 1).await.expect("a slot");
            slot.finish(false);
        }
        let before = Instant::now();
        let slot = pool.acquire(None, 1).await.expect("the first back");
        assert!(before.elapsed() >= Duration::from_secs(60));
        drop(slot);
        // A caller allowed no wait is told when the next comes back.
        let pool = Pool::new(&spec(&[(4, 1), (4, 1)]));
        for _ in 0..4 {
            pool.acquire(None, 1).await.expect("a slot").finish(false);
        }
        let refused = pool.acquire(None, 0).await.err().expect("all resting");
        assert!(refused.next.is_some());
    }

    #[tokio::test]
    async fn a_single_endpoint_is_never_rested() {
        let pool = Pool::new(&LlmSpec::default());
        for _ in 0..10 {
            pool.acquire(None, 0).await.expect("a slot").finish(false);
        }
        assert_eq!(pool.stats()[0].rests, 0);
        assert_eq!(pool.stats()[0].endpoint, "http://127.0.0.1:8093/v1");
    }
}
