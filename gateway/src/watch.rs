//! Watching a file for content changes by polling: the files the gateway
//! re-reads live (the pool size file, the keys file, the config's prices)
//! are ConfigMap or Secret mounts in Kubernetes, whose updates arrive as
//! symlink swaps that inotify-style watchers easily miss; a read every few
//! seconds sees them all and costs nothing.
//!
//! There is no baseline: the first poll hands the file to `apply` even if it
//! is what was loaded at start, so an edit made before the watcher first
//! ran is never missed (`apply` must be idempotent). A changed content is
//! handed over only once it reads the same twice, [`SETTLE`] apart: a file
//! edited in place (truncated, then written) can be read between the two,
//! and an empty or half-written keys file applied would end the sessions of
//! every key missing from it. Each changed content is handed over once, and
//! counted in `patchbay_config_reloads_total{file,
//! result}` as `applied` or `rejected` (what `apply` answered; a rejection
//! is logged as a warning and keeps what is loaded). A read failure is
//! logged once until the file is readable again, and keeps what is loaded.
//! The decision per read is [`Tracker::observe`], a pure function.

use std::path::PathBuf;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio_util::sync::CancellationToken;

use crate::metrics::ReloadLabels;

/// How long after reading a changed content the file is read again, to
/// see that it stays (see the module doc).
pub const SETTLE: Duration = Duration::from_millis(250);

/// What one read of the file calls for.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// New content that read the same twice: hand it to `apply`.
    Apply(String),
    /// New content read once: read again after [`SETTLE`].
    Settling,
    /// Same content as the last handed over: nothing to do.
    Unchanged,
    /// The read failed and the last one did not: warn once.
    Unreadable,
    /// The read failed again: already reported.
    StillUnreadable,
}

/// The watcher's memory between reads.
#[derive(Debug, Default)]
pub struct Tracker {
    last_text: Option<String>,
    /// A changed content read once, not yet handed over.
    candidate: Option<String>,
    unreadable: bool,
}

impl Tracker {
    /// Decides what a read calls for and remembers it. A failed read keeps
    /// the last content, so the same content after an outage is unchanged.
    pub fn observe<E>(&mut self, read: Result<String, E>) -> Step {
        match read {
            Err(_) => {
                let first = !self.unreadable;
                self.unreadable = true;
                if first {
                    Step::Unreadable
                } else {
                    Step::StillUnreadable
                }
            }
            Ok(text) => {
                self.unreadable = false;
                if self.last_text.as_deref() == Some(text.as_str()) {
                    self.candidate = None;
                    Step::Unchanged
                } else if self.candidate.as_deref() == Some(text.as_str()) {
                    self.candidate = None;
                    self.last_text = Some(text.clone());
                    Step::Apply(text)
                } else {
                    self.candidate = Some(text);
                    Step::Settling
                }
            }
        }
    }
}

/// Where a watcher reports: the file's label in `config_reloads` and the
/// counter family.
#[derive(Clone, Debug)]
pub struct Reloads {
    pub file: &'static str,
    pub counters: Family<ReloadLabels, Counter>,
}

impl Reloads {
    fn count(&self, result: &str) {
        self.counters
            .get_or_create(&ReloadLabels {
                file: self.file.into(),
                result: result.into(),
            })
            .inc();
    }
}

/// Calls `apply` with the file's text whenever it changed, every `poll`,
/// until `stop`. `apply` answers `Err(why)` for content it did not take.
pub async fn on_change(
    path: PathBuf,
    what: &'static str,
    poll: Duration,
    stop: CancellationToken,
    reloads: Reloads,
    mut apply: impl FnMut(&str) -> Result<(), String>,
) {
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut tracker = Tracker::default();
    let mut settling = false;
    loop {
        if settling {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(SETTLE) => {}
            }
        } else {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
        }
        let read = tokio::fs::read_to_string(&path).await;
        let error = read.as_ref().err().map(ToString::to_string);
        let step = tracker.observe(read);
        settling = step == Step::Settling;
        match step {
            Step::Apply(text) => match apply(&text) {
                Ok(()) => reloads.count("applied"),
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "ignoring an invalid {what}; keeping what is loaded");
                    reloads.count("rejected");
                }
            },
            Step::Unreadable => {
                let error = error.unwrap_or_default();
                tracing::warn!(file = %path.display(), %error, "cannot read the {what}; keeping what is loaded");
            }
            Step::Settling | Step::Unchanged | Step::StillUnreadable => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Result<String, ()> {
        Ok(s.to_string())
    }

    #[test]
    fn each_content_is_applied_once_it_reads_the_same_twice_and_each_outage_reported_once() {
        let mut t = Tracker::default();
        assert_eq!(t.observe(ok("a")), Step::Settling);
        assert_eq!(t.observe(ok("a")), Step::Apply("a".into()));
        assert_eq!(t.observe(ok("a")), Step::Unchanged);
        assert_eq!(t.observe(ok("b")), Step::Settling);
        assert_eq!(t.observe(ok("b")), Step::Apply("b".into()));
        assert_eq!(t.observe(Err(())), Step::Unreadable);
        assert_eq!(t.observe(Err(())), Step::StillUnreadable);
        // Back with the same content: nothing to apply again.
        assert_eq!(t.observe(ok("b")), Step::Unchanged);
        assert_eq!(t.observe(Err(())), Step::Unreadable, "a new outage");
        assert_eq!(t.observe(ok("c")), Step::Settling);
        assert_eq!(t.observe(ok("c")), Step::Apply("c".into()));
        // Going back to an earlier content is a change.
        assert_eq!(t.observe(ok("a")), Step::Settling);
        assert_eq!(t.observe(ok("a")), Step::Apply("a".into()));
    }

    #[test]
    fn a_file_read_mid_write_is_not_applied() {
        let mut t = Tracker::default();
        assert_eq!(t.observe(ok("k1\nk2\n")), Step::Settling);
        assert_eq!(t.observe(ok("k1\nk2\n")), Step::Apply("k1\nk2\n".into()));
        // Truncated, then written: each state read once only.
        assert_eq!(t.observe(ok("")), Step::Settling);
        assert_eq!(t.observe(ok("k1\n")), Step::Settling);
        assert_eq!(t.observe(ok("k1\nk3\n")), Step::Settling);
        assert_eq!(t.observe(ok("k1\nk3\n")), Step::Apply("k1\nk3\n".into()));
        // A change undone before it settled was never applied.
        assert_eq!(t.observe(ok("x")), Step::Settling);
        assert_eq!(t.observe(ok("k1\nk3\n")), Step::Unchanged);
    }

    #[test]
    fn a_file_unreadable_from_the_start_is_applied_when_it_appears() {
        let mut t = Tracker::default();
        assert_eq!(t.observe(Err(())), Step::Unreadable);
        assert_eq!(t.observe(ok("")), Step::Settling);
        assert_eq!(t.observe(ok("")), Step::Apply(String::new()));
        assert_eq!(t.observe(ok("")), Step::Unchanged);
    }

    async fn next(rx: &mut tokio::sync::mpsc::Receiver<String>) -> String {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the watcher hands the change over in time")
            .expect("the watcher runs")
    }

    #[tokio::test]
    async fn the_watcher_hands_over_each_change_and_counts_what_apply_answered() {
        let path = std::env::temp_dir().join(format!("patchbay-watch-{}", crate::ids::short_id()));
        std::fs::write(&path, "a").unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let stop = CancellationToken::new();
        let reloads = Reloads {
            file: "test",
            counters: Family::default(),
        };
        let count = |result: &str| {
            reloads
                .counters
                .get_or_create(&ReloadLabels {
                    file: "test".into(),
                    result: result.into(),
                })
                .get()
        };
        let task = tokio::spawn(on_change(
            path.clone(),
            "test file",
            Duration::from_millis(10),
            stop.clone(),
            reloads.clone(),
            move |t| {
                let _ = tx.try_send(t.to_string());
                if t == "bad" {
                    Err("not good".into())
                } else {
                    Ok(())
                }
            },
        ));
        assert_eq!(next(&mut rx).await, "a");
        std::fs::write(&path, "bad").unwrap();
        assert_eq!(next(&mut rx).await, "bad");
        std::fs::write(&path, "b").unwrap();
        assert_eq!(next(&mut rx).await, "b");
        stop.cancel();
        task.await.unwrap();
        assert_eq!(count("applied"), 2);
        assert_eq!(count("rejected"), 1);
        let _ = std::fs::remove_file(&path);
    }
}
