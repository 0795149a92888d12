//! Benchmarks printed as figures (`graphloom bench ...`), never asserted on
//! time. `bench llm` drives the real client and limiter against the
//! faithful test server and reports how close to each limit it ran;
//! `bench resolve` ([`resolution`]) runs entity resolution over synthetic
//! mentions and nodes with known duplicates; `bench add` ([`add`]) loads
//! synthetic nodes and facts; `bench neighbours` ([`neighbours`]) finds
//! embedding candidates over synthetic name vectors; `bench run` ([`pipeline`]) runs the whole
//! pipeline over a synthetic archive against the test server, then
//! replays it from the response cache; `bench sql` ([`sql`]) times
//! `graphloom sql` against DuckDB on the same files.

pub mod add;
pub mod communities;
pub mod neighbours;
pub mod pipeline;
pub mod resolution;
pub mod sql;

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::llm::test_server::{Behavior, Fault, Reply, TestServer};
use crate::llm::{ChatRequest, LlmClient, LlmError, Message};
use crate::spec::LlmSpec;
use crate::stage::Stage;

/// "debug" or "release": which build the figures of a report come from.
pub(crate) fn build_kind() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Peak resident memory of this process since start or the last
/// [`reset_peak_rss`], in bytes (`VmHWM`; `None` off Linux).
pub(crate) fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resets the peak-memory high-water mark, so [`peak_rss`] measures what
/// follows (ignored where the kernel does not offer it).
pub(crate) fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The `time:` and `peak memory:` lines of the resolution benches: time
/// and mentions per second, the node-writing time when there was one
/// (not counted), peak memory in GiB.
pub(crate) fn write_time_and_memory(
    f: &mut std::fmt::Formatter<'_>,
    seconds: f64,
    mentions: usize,
    generate_seconds: f64,
    peak_rss: Option<u64>,
) -> std::fmt::Result {
    writeln!(
        f,
        "  time:        {seconds:.2} s ({:.0} mentions/s){}",
        mentions as f64 / seconds.max(1e-9),
        if generate_seconds > 0.0 {
            format!("; writing the nodes took {generate_seconds:.1} s (not counted)")
        } else {
            String::new()
        }
    )?;
    match peak_rss {
        Some(b) => writeln!(
            f,
            "  peak memory: {:.2} GiB",
            b as f64 / (1u64 << 30) as f64
        ),
        None => writeln!(f, "  peak memory: not measured on this platform"),
    }
}

/// Settings of `graphloom bench llm`.
#[derive(Debug, Clone)]
pub struct LlmBench {
    /// Calls to make.
    pub calls: usize,
    /// Server latency added to every reply.
    pub latency: Duration,
    /// Requests per minute allowed.
    pub rpm: u32,
    /// Tokens per minute allowed.
    pub tpm: u32,
    /// Share of requests answered 429 with `Retry-After: 1`.
    pub rate_429: f64,
    /// Calls in flight at once.
    pub concurrency: u32,
    /// Characters of prompt per call.
    pub prompt_chars: usize,
    /// `max_tokens` of each call.
    pub max_tokens: u32,
    /// Characters of each reply.
    pub reply_chars: usize,
}

impl Default for LlmBench {
    fn default() -> Self {
        LlmBench {
            calls: 400,
            latency: Duration::from_millis(200),
            rpm: 600,
            tpm: 200_000,
            rate_429: 0.0,
            concurrency: 32,
            prompt_chars: 3_200,
            max_tokens: 400,
            reply_chars: 1_000,
        }
    }
}

/// What `bench llm` measured.
#[derive(Debug, Clone)]
pub struct LlmBenchReport {
    pub settings: LlmBench,
    pub ok_calls: usize,
    pub failed_calls: usize,
    pub http_requests: usize,
    pub rate_limited: usize,
    pub span: Duration,
    pub requests_per_min: f64,
    pub tokens_per_min: f64,
    pub max_requests_60s: u64,
    pub max_tokens_60s: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub overhead_ms: f64,
    pub wall: Duration,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct BenchReply {
    #[allow(dead_code)]
    text: String,
}

/// Largest sum of `weights` over arrivals that fall in any window of
/// `window` (windows start at an arrival).
pub fn max_in_window(at: &[Duration], weights: &[u64], window: Duration) -> u64 {
    let mut best = 0;
    let mut sum = 0;
    let mut start = 0;
    for end in 0..at.len() {
        sum += weights[end];
        while at[end] >= at[start] + window {
            sum -= weights[start];
            start += 1;
        }
        best = best.max(sum);
    }
    best
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Runs the benchmark.
pub async fn run_llm_bench(settings: LlmBench) -> std::io::Result<LlmBenchReport> {
    let reply_text = format!(
        "{{\"text\": \"{}\"}}",
        "x".repeat(settings.reply_chars.saturating_sub(12))
    );
    let mut behavior = Behavior::with_responder(move |_| Reply::Content(reply_text.clone()));
    behavior.latency = settings.latency;
    behavior.seed = 42;
    if settings.rate_429 > 0.0 {
        behavior.faults = vec![(
            settings.rate_429,
            Fault::RateLimited {
                retry_after: Some("1".into()),
            },
        )];
    }
    let server = TestServer::start(behavior).await?;
    let spec = LlmSpec {
        base_url: server.base_url(),
        requests_per_minute: settings.rpm,
        tokens_per_minute: settings.tpm,
        max_concurrency: settings.concurrency,
        max_attempts: 10,
        backoff_initial_ms: 200,
        backoff_max_ms: 5_000,
        ..LlmSpec::default()
    };
    let client = Arc::new(
        LlmClient::with_key(&spec, None, None, "bench")
            .map_err(|e| std::io::Error::other(e.to_string()))?,
    );
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..settings.calls)
        .map(|i| {
            let client = client.clone();
            // Distinct prompts, as distinct episodes would be.
            let prompt = format!(
                "{i:06} {}",
                "lorem ipsum dolor sit amet ".repeat(settings.prompt_chars / 27 + 1)
            );
            let prompt: String = prompt.chars().take(settings.prompt_chars).collect();
            let max_tokens = settings.max_tokens;
            tokio::spawn(async move {
                client
                    .chat_json::<BenchReply>(ChatRequest {
                        stage: Stage::Bench,
                        item: Some(i.to_string()),
                        messages: vec![Message::system("Reply with JSON."), Message::user(prompt)],
                        max_tokens,
                        prompt_version: "bench".into(),
                        budget: None,
                    })
                    .await
            })
        })
        .collect();
    let mut ok_calls = 0;
    let mut failed_calls = 0;
    for t in futures::future::join_all(tasks).await {
        match t {
            Ok(Ok(_)) => ok_calls += 1,
            Ok(Err(LlmError::Exhausted { .. })) | Ok(Err(_)) | Err(_) => failed_calls += 1,
        }
    }
    let wall = started.elapsed();
    let requests = server.take_requests();
    server.shutdown().await;
    let at: Vec<Duration> = requests.iter().map(|r| r.at).collect();
    let ones = vec![1u64; at.len()];
    // Tokens as the provider counts them: prompt + completion of each
    // request it processed (a 429 is refused before any work).
    let tokens: Vec<u64> = requests
        .iter()
        .map(|r| {
            if r.status == 200 {
                r.prompt_tokens + r.completion_tokens
            } else {
                0
            }
        })
        .collect();
    let span = match (at.first(), at.last()) {
        (Some(a), Some(b)) if b > a => *b - *a,
        _ => Duration::from_secs(1),
    };
    // Rates over the span between the first and the last arrival, counting
    // the last minute as a whole: n arrivals spread over s seconds is
    // (n - 1) / s per second.
    let minutes = span.as_secs_f64() / 60.0;
    let requests_per_min = (at.len().saturating_sub(1)) as f64 / minutes;
    let token_total: u64 = tokens.iter().sum();
    let tokens_per_min = token_total.saturating_sub(*tokens.last().unwrap_or(&0)) as f64 / minutes;
    let rows = client.take_calls();
    let mut latencies: Vec<f64> = rows
        .iter()
        .filter(|r| r.status == "ok")
        .map(|r| r.latency_ms as f64 / r.attempts.max(1) as f64)
        .collect();
    latencies.sort_by(|a, b| a.total_cmp(b));
    let mean_latency = latencies.iter().sum::<f64>() / latencies.len().max(1) as f64;
    Ok(LlmBenchReport {
        ok_calls,
        failed_calls,
        http_requests: requests.len(),
        rate_limited: requests.iter().filter(|r| r.status == 429).count(),
        span,
        requests_per_min,
        tokens_per_min,
        max_requests_60s: max_in_window(&at, &ones, Duration::from_secs(60)),
        max_tokens_60s: max_in_window(&at, &tokens, Duration::from_secs(60)),
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        overhead_ms: mean_latency - settings.latency.as_secs_f64() * 1000.0,
        wall,
        settings,
    })
}

impl std::fmt::Display for LlmBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.settings;
        writeln!(
            f,
            "bench llm: {} calls, server latency {} ms, limits {} req/min and {} tokens/min, {:.0}% injected 429s, concurrency {}",
            s.calls,
            s.latency.as_millis(),
            s.rpm,
            s.tpm,
            s.rate_429 * 100.0,
            s.concurrency
        )?;
        writeln!(
            f,
            "  calls: {} ok, {} failed; HTTP requests {} ({} answered 429); wall {:.1} s, first→last request {:.1} s",
            self.ok_calls,
            self.failed_calls,
            self.http_requests,
            self.rate_limited,
            self.wall.as_secs_f64(),
            self.span.as_secs_f64()
        )?;
        writeln!(
            f,
            "  requests/min: {:.1} = {:.1}% of the limit; most in any 60 s window: {} (limit {})",
            self.requests_per_min,
            self.requests_per_min / s.rpm as f64 * 100.0,
            self.max_requests_60s,
            s.rpm
        )?;
        writeln!(
            f,
            "  tokens/min:   {:.0} = {:.1}% of the limit; most in any 60 s window: {} (limit {})",
            self.tokens_per_min,
            self.tokens_per_min / s.tpm as f64 * 100.0,
            self.max_tokens_60s,
            s.tpm
        )?;
        write!(
            f,
            "  latency per attempt: p50 {:.0} ms, p99 {:.0} ms; client overhead {:.1} ms per attempt",
            self.p50_ms, self.p99_ms, self.overhead_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_count_only_arrivals_less_than_a_window_apart() {
        let s = Duration::from_secs;
        let at = [s(0), s(10), s(59), s(60), s(61), s(200)];
        // From 10 s: 10, 59, 60 and 61 are less than 60 s apart.
        assert_eq!(max_in_window(&at, &[1; 6], s(60)), 4);
        assert_eq!(max_in_window(&at, &[5, 1, 1, 1, 1, 9], s(60)), 9);
        assert_eq!(max_in_window(&[], &[], s(60)), 0);
    }
}
