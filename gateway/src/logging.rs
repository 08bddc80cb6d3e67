//! Log lines: `tracing` to stderr (stdout carries request-log rows), human
//! format by default, JSON lines when `PATCHBAY_LOG_FORMAT=json`. Level from
//! `RUST_LOG` (default `info`).
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
//!   change), which one writer thread drains to stderr
//!   (`tracing-appender`'s non-blocking writer, lossy mode). When the queue
//!   is full (a stalled collector, a pipe nobody reads) the line is dropped
//!   and counted: [`lines_dropped`], exported as
//!   `patchbay_log_lines_dropped_total`. Relays and meters keep running.
//! - **Flushed on exit.** [`init`] returns a [`LogGuard`]; `main` calls
//!   [`LogGuard::flush`] last, which waits until every queued line is
//!   written, at most [`FLUSH_LIMIT`], and then lets the process exit
//!   anyway: a stalled stderr never turns a shutdown into a hang. (It counts
//!   lines in and out rather than dropping `tracing-appender`'s guard, whose
//!   shutdown prints a complaint to stdout, the request-log rows' stream,
//!   when the queue is full.)
//!
//! Caveat: lines written with `eprintln!` before the runtime starts
//! (configuration errors) bypass the queue, so they can interleave with
//! queued lines; they are written once, at start, when nothing else runs.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tracing::Level;
use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};
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

/// The writer's drop counter, set once by [`init`].
static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Lines offered to the queue (kept or dropped), and lines the writer
/// thread has written (or failed to write) to stderr.
static OFFERED: AtomicU64 = AtomicU64::new(0);
static WRITTEN: AtomicU64 = AtomicU64::new(0);

/// Log lines dropped because the queue to stderr was full, since start (0
/// when logging was never initialised, as in in-process tests).
pub fn lines_dropped() -> u64 {
    DROPPED
        .get()
        .map_or(0, |c| u64::try_from(c.dropped_lines()).unwrap_or(u64::MAX))
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

/// Lines still queued: offered, neither dropped nor written yet.
pub fn pending(offered: u64, dropped: u64, written: u64) -> u64 {
    offered.saturating_sub(dropped.saturating_add(written))
}

/// The queue's writer, counting each line offered. `fmt` writes one event
/// with one `write_all`, which `NonBlocking` sends as one message.
#[derive(Clone)]
struct Offer(NonBlocking);

impl Write for Offer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        OFFERED.fetch_add(1, Ordering::Relaxed);
        self.0.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        OFFERED.fetch_add(1, Ordering::Relaxed);
        self.0.write_all(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl<'a> MakeWriter<'a> for Offer {
    type Writer = Offer;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// stderr for the writer thread, counting each line it took off the queue
/// (the thread writes a line with one `write_all`).
struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stderr().write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let written = std::io::stderr().write_all(buf);
        WRITTEN.fetch_add(1, Ordering::Release);
        written
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn json_requested() -> bool {
    std::env::var(LOG_FORMAT_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("json"))
}

/// Flushes queued log lines when the process ends; see [`LogGuard::flush`].
#[must_use = "dropping the guard at once stops the log writer"]
pub struct LogGuard(Option<WorkerGuard>);

impl LogGuard {
    /// Waits until every queued line is written, at most [`FLUSH_LIMIT`].
    /// The writer thread is left running (the process is about to exit):
    /// see the module doc for why its guard is not dropped.
    pub fn flush(mut self) {
        let Some(guard) = self.0.take() else {
            return;
        };
        let deadline = Instant::now() + FLUSH_LIMIT;
        while pending(
            OFFERED.load(Ordering::Relaxed),
            lines_dropped(),
            WRITTEN.load(Ordering::Acquire),
        ) > 0
            && Instant::now() < deadline
        {
            std::thread::sleep(FLUSH_POLL);
        }
        std::mem::forget(guard);
    }
}

/// Installs the global subscriber (a second call, as in tests, keeps the
/// first) and returns the guard that flushes it.
pub fn init() -> LogGuard {
    let queue = queue_lines(std::env::var(LOG_QUEUE_ENV).ok().as_deref());
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(*queue.as_ref().unwrap_or(&DEFAULT_LOG_QUEUE_LINES))
        .thread_name(WRITER_THREAD)
        .finish(Stderr);
    let dropped = writer.error_counter();
    let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LEVEL));
    let cap = filter_fn(|meta| allowed(meta.target(), meta.level()));
    let format = tracing_subscriber::fmt::layer().with_writer(Offer(writer));
    let format = if json_requested() {
        format.json().boxed()
    } else {
        format.boxed()
    };
    let installed = tracing_subscriber::registry()
        .with(format.with_filter(env.and(cap)))
        .try_init();
    if installed.is_ok() {
        let _ = DROPPED.set(dropped);
        if let Err(e) = queue {
            tracing::warn!(default = DEFAULT_LOG_QUEUE_LINES, "{e}; using the default");
        }
        LogGuard(Some(guard))
    } else {
        LogGuard(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_lines_are_those_neither_dropped_nor_written() {
        assert_eq!(pending(0, 0, 0), 0);
        assert_eq!(pending(10, 0, 0), 10);
        assert_eq!(pending(10, 3, 5), 2);
        assert_eq!(pending(10, 3, 7), 0);
        // Counters read one after the other may overtake each other.
        assert_eq!(pending(10, 4, 7), 0);
        assert_eq!(pending(u64::MAX, u64::MAX, u64::MAX), 0);
    }

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
