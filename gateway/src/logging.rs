//! Log lines: `tracing` to stderr (stdout carries request-log rows), human
//! format by default (coloured only on a terminal, and never with `NO_COLOR`),
//! JSON lines when `PATCHBAY_LOG_FORMAT=json`. Level from
//! `RUST_LOG` (default `info`). The text format's fields and timestamp are
//! written by [`plain`], the same text as `tracing-subscriber`'s defaults at
//! a fraction of their cost (one line per session ends every session).
//!
//! Guarantees:
//! - **No secret at any level.** The gateway's own events never carry a key
//!   (secrets are [`crate::secret::Secret`]s and print as `[REDACTED]`). Its
//!   dependencies are another matter: tungstenite traces every upgrade
//!   request it writes, `Authorization: Bearer <upstream key>` included, and
//!   any HTTP or WebSocket library may do the same with a client's head. So
//!   every target outside the gateway's own is capped at
//!   [`DEPENDENCY_LEVEL_CAP`] (`info`) by a filter applied *after*
//!   `RUST_LOG`, which `RUST_LOG` cannot raise: `RUST_LOG=trace` or
//!   `RUST_LOG=tungstenite=trace` make the gateway verbose, never a
//!   dependency. The decision is [`allowed`], a pure function.
//! - **A log line never blocks the runtime.** An event is formatted on the
//!   thread that emits it and handed to a bounded queue of
//!   [`DEFAULT_LOG_QUEUE_LINES`] lines (`PATCHBAY_LOG_QUEUE_LINES` to
//!   change), which one writer thread drains to stderr in batches
//!   ([`queue::LineQueue`]: only the first line after it went idle wakes
//!   it, and when lines come often it lingers up to [`queue::LINGER`] so
//!   that the lines of that moment leave with one write). When the queue
//!   is full (a stalled collector, a pipe nobody reads) the line is dropped
//!   and counted: [`lines_dropped`], exported as
//!   `patchbay_log_lines_dropped_total`. Relays and meters keep running.
//! - **Flushed on exit.** [`init`] returns a [`LogGuard`]; `main` calls
//!   [`LogGuard::flush`] last, which waits until every queued line is
//!   written, at most [`FLUSH_LIMIT`], and then lets the process exit
//!   anyway: a stalled stderr never turns a shutdown into a hang.
//!
//! Caveat: lines written with `eprintln!` before the runtime starts
//! (configuration errors) bypass the queue, so they can interleave with
//! queued lines; they are written once, at start, when nothing else runs.

mod plain;
mod queue;

use std::io::{IsTerminal, Write};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tracing::Level;
use tracing_subscriber::filter::{filter_fn, FilterExt, LevelFilter};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub const LOG_FORMAT_ENV: &str = "PATCHBAY_LOG_FORMAT";

/// Overrides [`DEFAULT_LOG_QUEUE_LINES`] (a whole number ≥ 1).
pub const LOG_QUEUE_ENV: &str = "PATCHBAY_LOG_QUEUE_LINES";

/// The level when `RUST_LOG` is unset or invalid.
pub const DEFAULT_LEVEL: &str = "info";

/// Targets whose events may be logged at any level: the gateway's own.
pub const OWN_TARGETS: [&str; 1] = ["patchbay_gateway"];

/// The most verbose level a dependency's event may have, whatever
/// `RUST_LOG` says. Request and response heads are logged at debug or trace
/// (tungstenite's `Request: "GET … Authorization: Bearer …"` is a trace).
pub const DEPENDENCY_LEVEL_CAP: LevelFilter = LevelFilter::INFO;

/// Lines the queue to the writer thread holds before new lines are dropped:
/// a burst (every session of a drain ending at once) fits, and at a few
/// hundred bytes a line the queue stays within a few MiB.
pub const DEFAULT_LOG_QUEUE_LINES: usize = 16_384;

/// How long [`LogGuard::flush`] waits for queued lines to be written.
pub const FLUSH_LIMIT: Duration = Duration::from_secs(2);

/// How often [`LogGuard::flush`] looks at the writer's progress.
const FLUSH_POLL: Duration = Duration::from_millis(5);

const WRITER_THREAD: &str = "patchbay-log-writer";

/// The queue to stderr, set once by [`init`].
static QUEUE: OnceLock<Arc<queue::LineQueue>> = OnceLock::new();

/// Log lines dropped because the queue to stderr was full, since start (0
/// when logging was never initialised, as in in-process tests).
pub fn lines_dropped() -> u64 {
    QUEUE.get().map_or(0, |q| q.dropped())
}

/// Whether an event of `level` from `target` may reach the log at all
/// (`RUST_LOG` then decides among those that may).
pub fn allowed(target: &str, level: &Level) -> bool {
    is_own(target) || *level <= DEPENDENCY_LEVEL_CAP
}

fn is_own(target: &str) -> bool {
    OWN_TARGETS.iter().any(|own| {
        target
            .strip_prefix(own)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// The queue length from [`LOG_QUEUE_ENV`]'s value, if set.
pub fn queue_lines(value: Option<&str>) -> Result<usize, String> {
    match value {
        None => Ok(DEFAULT_LOG_QUEUE_LINES),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "{LOG_QUEUE_ENV} must be a whole number of lines, at least 1; got {v:?}"
            )),
        },
    }
}

/// The queue's writer: `fmt` writes one event with one `write_all`, which
/// becomes one queued line.
#[derive(Clone)]
struct Offer(Arc<queue::LineQueue>);

impl Write for Offer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.offer(buf);
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.0.offer(buf);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Offer {
    type Writer = Offer;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

fn json_requested() -> bool {
    std::env::var(LOG_FORMAT_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("json"))
}

/// Flushes queued log lines when the process ends; see [`LogGuard::flush`].
#[must_use = "call `flush` last, or lines queued at exit are lost"]
pub struct LogGuard(Option<Arc<queue::LineQueue>>);

impl LogGuard {
    /// Ends the writer's linger and waits until every queued line is
    /// written, at most [`FLUSH_LIMIT`]. The writer thread is left running
    /// (the process is about to exit).
    pub fn flush(mut self) {
        let Some(queue) = self.0.take() else {
            return;
        };
        queue.hurry();
        let deadline = Instant::now() + FLUSH_LIMIT;
        while queue.pending() > 0 && Instant::now() < deadline {
            std::thread::sleep(FLUSH_POLL);
        }
    }
}

/// Colours (ANSI escapes) in the text format only on a terminal, and not
/// when `NO_COLOR` is set: log files and collectors get plain text.
fn colors_wanted() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// Installs the global subscriber (a second call, as in tests, keeps the
/// first) and returns the guard that flushes it.
pub fn init() -> LogGuard {
    let queue = queue_lines(std::env::var(LOG_QUEUE_ENV).ok().as_deref());
    let lines = queue::LineQueue::new(*queue.as_ref().unwrap_or(&DEFAULT_LOG_QUEUE_LINES));
    let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LEVEL));
    let cap = filter_fn(|meta| allowed(meta.target(), meta.level()));
    let format = tracing_subscriber::fmt::layer()
        .with_ansi(colors_wanted())
        .with_writer(Offer(lines.clone()));
    let format = if json_requested() {
        format.json().boxed()
    } else {
        format
            .fmt_fields(plain::PlainFields)
            .with_timer(plain::UtcMicros)
            .boxed()
    };
    let installed = tracing_subscriber::registry()
        .with(format.with_filter(env.and(cap)))
        .try_init();
    if installed.is_ok() {
        let _ = QUEUE.set(lines.clone());
        let writer = lines.clone();
        let spawned = std::thread::Builder::new()
            .name(WRITER_THREAD.into())
            .spawn(move || writer.run(&mut std::io::stderr()));
        if let Err(e) = spawned {
            eprintln!("cannot start the log writer thread ({e}); log lines are dropped");
        }
        if let Err(e) = queue {
            tracing::warn!(default = DEFAULT_LOG_QUEUE_LINES, "{e}; using the default");
        }
        LogGuard(Some(lines))
    } else {
        LogGuard(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_length_is_a_positive_whole_number_or_the_default() {
        assert_eq!(queue_lines(None), Ok(DEFAULT_LOG_QUEUE_LINES));
        assert_eq!(queue_lines(Some("64")), Ok(64));
        assert_eq!(queue_lines(Some(" 1 ")), Ok(1));
        for bad in ["0", "-1", "", "lots", "1.5"] {
            let e = queue_lines(Some(bad)).unwrap_err();
            assert!(e.contains(LOG_QUEUE_ENV), "{e}");
        }
    }

    #[test]
    fn the_gateway_logs_at_every_level() {
        for target in ["patchbay_gateway", "patchbay_gateway::upstream::dial"] {
            for level in [
                Level::ERROR,
                Level::WARN,
                Level::INFO,
                Level::DEBUG,
                Level::TRACE,
            ] {
                assert!(allowed(target, &level), "{target} {level}");
            }
        }
    }

    #[test]
    fn dependencies_never_log_below_info() {
        for target in [
            "tungstenite::handshake::client",
            "tokio_tungstenite",
            "hyper",
            "hyper_util::client",
            "h2::codec",
            "rustls::client::hs",
            "redis",
            "log",
            // Look-alikes of the gateway's own target are dependencies.
            "patchbay_gateway_extra",
            "patchbay",
            "",
        ] {
            assert!(allowed(target, &Level::ERROR), "{target}");
            assert!(allowed(target, &Level::WARN), "{target}");
            assert!(allowed(target, &Level::INFO), "{target}");
            assert!(!allowed(target, &Level::DEBUG), "{target}");
            assert!(!allowed(target, &Level::TRACE), "{target}");
        }
    }
}
