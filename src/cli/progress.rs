//! Progress of `graphloom run`: a bar per phase on a terminal, a log line
//! every 10 seconds (and at the end of a phase) otherwise, so that cron
//! and CI logs show progress without raising the log level.

use std::sync::Mutex;
use std::time::Instant;

use graphloom::run::{Progress, Tick};
use graphloom::stage::Stage;

/// The phase being shown.
struct Phase {
    stage: Stage,
    bar: Option<indicatif::ProgressBar>,
    last_log: Instant,
}

/// A [`Progress`] that draws on stderr: bars when `terminal`, lines
/// otherwise.
pub fn on_stderr(terminal: bool) -> Progress {
    let current: Mutex<Option<Phase>> = Mutex::new(None);
    Progress::new(move |tick: &Tick| {
        let mut current = current.lock().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_none_or(|p| p.stage != tick.phase) {
            if let Some(bar) = current.take().and_then(|p| p.bar) {
                bar.finish();
            }
            *current = Some(Phase {
                stage: tick.phase,
                bar: terminal.then(|| bar(tick)),
                last_log: Instant::now(),
            });
        }
        let Some(phase) = current.as_mut() else {
            return;
        };
        let msg = format!(
            "calls {}, tokens {}, failures {}",
            tick.calls, tick.tokens, tick.failures
        );
        match &phase.bar {
            Some(bar) => {
                bar.set_position(tick.done as u64);
                bar.set_message(msg);
                if tick.done == tick.total {
                    bar.finish();
                }
            }
            None => {
                let end = tick.done == tick.total;
                if tick.done > 0 && (end || phase.last_log.elapsed().as_secs() >= 10) {
                    phase.last_log = Instant::now();
                    eprintln!(
                        "{}: {}/{} episodes, {msg}",
                        tick.phase, tick.done, tick.total
                    );
                }
            }
        }
    })
}

fn bar(tick: &Tick) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(tick.total as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix:>18} [{bar:30}] {pos}/{len} {msg} (eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(tick.phase.as_str());
    bar
}
