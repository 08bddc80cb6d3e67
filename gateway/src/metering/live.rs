//! Metering a GPT-Live session (`/v1/live/sessions`) by the cumulative
//! seconds its upstream reports.
//!
//! OpenAI's Live API bills by the second and reports it cumulatively:
//! `session.usage.updated` carries `usage.seconds`, "the cumulative billable
//! duration in whole seconds ... Do not sum values across usage events"
//! (openai-python `types/live/session_usage.py`), and `session.closed`
//! carries "the final cumulative Live audio usage after session
//! finalization"; "a connection closing without this event does not confirm
//! successful finalization" (`types/live/session_closed_event.py`).
//!
//! The rule, one pure function each ([`charge_increase`], [`final_figure`]):
//! - the relay keeps the **highest** figure seen (a repeated or
//!   out-of-order event lowers nothing and adds nothing; a lost one is
//!   caught up by the next), and when it was seen;
//! - every flush window the meter charges the increase of that figure
//!   since it last charged, as one row (`end_reason` `window`), never a
//!   decrease;
//! - at the end the meter charges the rest of the final figure:
//!   `session.closed`'s `usage.seconds` when it came (never below the
//!   highest figure seen), else the highest figure seen plus the time since
//!   it was seen (or since the session started, if none came), that last
//!   row marked `usage_estimated`. A session that ran is never charged $0.
//!
//! A WebRTC Live session is metered over its sideband, which may move
//! between replicas ([`crate::calls::sideband`]): the replica that lets it
//! go ([`LiveUsage::let_go`]) charges up to the highest figure it saw and
//! no estimate, and what was charged so far ([`LiveUsage::charged_ms`],
//! kept in the store) is what the adopting replica starts from
//! ([`LiveUsage::resumed`]), so the two never charge the same seconds
//! twice. With a store, the figure a window brings the session to is
//! recorded *before* the window is charged ([`ChargedMark`],
//! [`LiveWindows::take_marked`]): a replica killed between the two leaves
//! the mark ahead of what it charged, so that window is charged by nobody
//! (at most one window's increase is lost, plus whatever the killed
//! replica's outbox held), and none is charged twice. A window whose mark
//! the store does not confirm is deferred to the next (during a store
//! outage the session's windows are charged together when it answers, or
//! in the last row).
//!
//! Token usage of the responses the session delegates to a Responses
//! backend comes inside nested `response.event`s; it is read here and
//! charged at the delegated model's token rates ([`super::delegated`],
//! [`LiveWindows::take_delegated`]), apart from the seconds.
//!
//! The figures cross from the relay's task to the meter's through relaxed
//! atomics written only by the session's own task ([`LiveUsage`]); the
//! final state is published with release/acquire before the tracker's
//! channel closes, which the meter waits for before its last flush.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime};

use memchr::memmem;
use serde::Deserialize;

use super::delegated::{self, DelegatedLedger, RESPONSE_EVENT};
use super::pricing::Usage;
use super::tracker::{TurnKind, TurnRecord};

const USAGE_UPDATED: &[u8] = b"session.usage.updated";
const CLOSED: &[u8] = b"session.closed";
/// The close a gateway-ended Live session asks its upstream for, so the
/// final usage comes back in `session.closed` (`session_close_event.py`).
pub const CLOSE_EVENT: &str = r#"{"type":"session.close"}"#;

/// What the relay saw of a Live session's usage.
#[derive(Debug)]
pub struct LiveUsage {
    /// When the session started (the upstream's `session.started`).
    started: Instant,
    /// The highest cumulative figure seen, in milliseconds.
    seen_ms: AtomicU64,
    /// When a figure was last seen, in milliseconds since `started`.
    seen_at_ms: AtomicU64,
    /// `session.closed` came; its figure is in `seen_ms`.
    closed: AtomicBool,
    /// How the session ended (`EndReason`'s status and name), set before
    /// the tracker finishes: the last row carries it.
    end: OnceLock<(u16, &'static str)>,
    /// Charged (by another replica) before this one metered the session.
    resumed_ms: u64,
    /// Charged so far, published by the meter after each window.
    charged_ms: AtomicU64,
    /// Handed over to another replica: no estimate at the end.
    let_go: AtomicBool,
    /// Delegated responses seen, and those not yet charged (rare events:
    /// a lock per delegated response, none per frame).
    delegated: Mutex<DelegatedLedger>,
    /// Where each window's charged figure is recorded before it is
    /// charged (a WebRTC Live session with a fleet), see [`ChargedMark`].
    mark: OnceLock<Arc<dyn ChargedMark>>,
}

/// Where a session's charged figure is kept for a replica that may adopt
/// it ([`crate::calls::fleet`]'s `live_charged`). A window is charged only
/// once the figure it brings the session to is recorded here, so a replica
/// killed between the two has charged *less* than its mark, never more:
/// the adopting replica, which starts from the mark, charges nothing twice.
pub trait ChargedMark: Send + Sync + std::fmt::Debug {
    /// Records that `charged_ms` is charged (never lowering a higher
    /// mark); false when the store did not confirm it.
    fn mark(&self, charged_ms: u64) -> Pin<Box<dyn Future<Output = bool> + Send + '_>>;
    /// Records that the delegated responses `response_ids` are charged;
    /// false when the store did not confirm it.
    fn mark_delegated(
        &self,
        response_ids: Vec<String>,
    ) -> Pin<Box<dyn Future<Output = bool> + Send + '_>>;
}

impl LiveUsage {
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            seen_ms: AtomicU64::new(0),
            seen_at_ms: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            end: OnceLock::new(),
            resumed_ms: 0,
            charged_ms: AtomicU64::new(0),
            let_go: AtomicBool::new(false),
            delegated: Mutex::new(DelegatedLedger::default()),
            mark: OnceLock::new(),
        }
    }

    /// Delegated responses charged by the replica that metered the session
    /// before: charged nothing more here.
    pub fn knows_delegated(&self, response_ids: impl IntoIterator<Item = String>) {
        let mut ledger = self.delegated.lock().unwrap_or_else(|p| p.into_inner());
        for id in response_ids {
            ledger.seen_already(id);
        }
    }

    /// Charges each window only once `mark` has recorded its figure.
    pub fn marked_by(&self, mark: Arc<dyn ChargedMark>) {
        let _ = self.mark.set(mark);
    }

    /// A session another replica metered up to `charged_ms`: that much is
    /// charged already and is the figure seen so far.
    pub fn resumed(started: Instant, charged_ms: u64) -> Self {
        let u = Self {
            resumed_ms: charged_ms,
            ..Self::new(started)
        };
        u.seen_ms.store(charged_ms, Ordering::Relaxed);
        u.charged_ms.store(charged_ms, Ordering::Relaxed);
        u
    }

    /// What the meter has charged so far, in milliseconds.
    pub fn charged_ms(&self) -> u64 {
        self.charged_ms.load(Ordering::Relaxed)
    }

    /// The highest figure seen, in milliseconds.
    pub fn seen_ms(&self) -> u64 {
        self.seen_ms.load(Ordering::Relaxed)
    }

    /// The session goes on, metered by another replica: the last row
    /// charges up to the highest figure seen and no estimate.
    pub fn let_go(&self) {
        self.let_go.store(true, Ordering::Release);
    }

    /// A cumulative figure (seconds), from a usage event or the close.
    fn saw(&self, seconds: f64, closed: bool) {
        let ms = seconds_to_ms(seconds);
        self.seen_ms.fetch_max(ms, Ordering::Relaxed);
        let at = self.started.elapsed().as_millis() as u64;
        self.seen_at_ms.fetch_max(at, Ordering::Relaxed);
        if closed {
            self.closed.store(true, Ordering::Release);
        }
    }

    /// Whether `session.closed` came.
    pub fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// How the session ended, for its last row.
    pub fn ended(&self, status: u16, reason: &'static str) {
        let _ = self.end.set((status, reason));
    }

    /// An upstream text message: a usage figure is kept, and a delegated
    /// response's usage queued to be charged.
    pub fn on_upstream(&self, text: &[u8]) {
        let kind = crate::event::leading_event_type_bytes(text);
        if let Some(d) = delegated::read(text, kind.map(|k| k == RESPONSE_EVENT)) {
            self.delegated
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .add(d);
            return;
        }
        let read = match kind {
            Some(k) => k == USAGE_UPDATED || k == CLOSED,
            // The type is not first: only events naming one of the two
            // anywhere are read whole.
            None => {
                memmem::find(text, USAGE_UPDATED).is_some() || memmem::find(text, CLOSED).is_some()
            }
        };
        if !read {
            return;
        }
        #[derive(Deserialize)]
        struct Event {
            #[serde(rename = "type")]
            kind: String,
            usage: Option<SessionUsage>,
        }
        // openai-python `types/live/session_usage.py`.
        #[derive(Deserialize)]
        struct SessionUsage {
            seconds: f64,
        }
        let Ok(event) = serde_json::from_slice::<Event>(text) else {
            return;
        };
        let is_closed = event.kind.as_bytes() == CLOSED;
        if !is_closed && event.kind.as_bytes() != USAGE_UPDATED {
            return;
        }
        match event.usage {
            Some(u) => self.saw(u.seconds, is_closed),
            // A close without usage still ends the session; its figure is
            // the last one seen.
            None if is_closed => self.saw(0.0, true),
            None => {}
        }
    }
}

/// The Live session id in a `session.started` text
/// (`types/live/session_started_event.py`: `session.id`).
pub fn started_id(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Started {
        session: Option<Resource>,
    }
    #[derive(Deserialize)]
    struct Resource {
        id: Option<String>,
    }
    serde_json::from_str::<Started>(text).ok()?.session?.id
}

/// A client's `session.start` with its model set to `model` (the one the
/// upstream serves the route's model as): written anew from the parsed
/// event, so the upstream reads exactly one model (a duplicate key the
/// client sent is gone). `None` when `start` is not a JSON object with a
/// `session` object.
pub fn with_model(start: &serde_json::Value, model: &str) -> Option<String> {
    let mut start = start.clone();
    let session = start.get_mut("session")?.as_object_mut()?;
    session.insert("model".into(), serde_json::Value::from(model));
    Some(start.to_string())
}

/// Milliseconds of a reported figure: negative, NaN and absurd figures
/// count as nothing or saturate (a figure is whole seconds by the SDK's
/// type; its bound is the one every usage has, [`super::pricing`]).
fn seconds_to_ms(seconds: f64) -> u64 {
    if seconds.is_finite() && seconds > 0.0 {
        (seconds * 1000.0).min(u64::MAX as f64 / 2.0) as u64
    } else {
        0
    }
}

/// The seconds a window charges: the increase of the highest figure since
/// the last charge, never a decrease.
pub fn charge_increase(charged_ms: u64, seen_ms: u64) -> u64 {
    seen_ms.saturating_sub(charged_ms)
}

/// The session's final figure and whether it is an estimate:
/// `session.closed`'s (already the highest seen) when it came, else the
/// highest seen plus the time since it was seen.
pub fn final_figure(seen_ms: u64, closed: bool, since_seen_ms: u64) -> (u64, bool) {
    if closed {
        (seen_ms, false)
    } else {
        (seen_ms.saturating_add(since_seen_ms), true)
    }
}

/// The meter's side: what it has charged, and the windows it wrote.
#[derive(Debug)]
pub struct LiveWindows {
    usage: Arc<LiveUsage>,
    charged_ms: u64,
    windows: u64,
    since: SystemTime,
}

impl LiveWindows {
    pub fn new(usage: Arc<LiveUsage>) -> Self {
        Self {
            charged_ms: usage.resumed_ms,
            usage,
            windows: 0,
            since: SystemTime::now(),
        }
    }

    /// The window's record: the increase since the last one (none when
    /// nothing rose), or at the end (`last`) the rest of the final figure,
    /// always written.
    pub fn take(&mut self, last: bool) -> Option<TurnRecord> {
        let (target, estimated) = self.target(last);
        self.charge(target, estimated, last)
    }

    /// [`LiveWindows::take`], the window's figure first recorded by the
    /// session's [`ChargedMark`] when it has one: a window whose mark the
    /// store did not confirm is not charged now (the next window, or the
    /// last, charges it with its own); the last is charged whatever the
    /// mark's fate (the session is over, its mark retired).
    pub async fn take_marked(&mut self, last: bool) -> Option<TurnRecord> {
        let Some(mark) = self.usage.mark.get().cloned() else {
            return self.take(last);
        };
        let (target, estimated) = self.target(last);
        if target > self.charged_ms && !mark.mark(target).await && !last {
            tracing::warn!(
                charged_ms = self.charged_ms,
                target_ms = target,
                "live session: the charged mark was not confirmed; this window is charged with the next"
            );
            return None;
        }
        self.charge(target, estimated, last)
    }

    /// The figure the window charges up to, and whether it is an estimate.
    fn target(&self, last: bool) -> (u64, bool) {
        let u = &self.usage;
        let closed = last && (u.closed() || u.let_go.load(Ordering::Acquire));
        let seen = u.seen_ms.load(Ordering::Relaxed);
        if last {
            let since = (u.started.elapsed().as_millis() as u64)
                .saturating_sub(u.seen_at_ms.load(Ordering::Relaxed));
            final_figure(seen, closed, since)
        } else {
            (seen, false)
        }
    }

    /// The record charging up to `target`.
    fn charge(&mut self, target: u64, estimated: bool, last: bool) -> Option<TurnRecord> {
        let u = &self.usage;
        let ms = charge_increase(self.charged_ms, target);
        if ms == 0 && !last {
            return None;
        }
        self.charged_ms += ms;
        u.charged_ms.store(self.charged_ms, Ordering::Relaxed);
        let now = SystemTime::now();
        let started_at = std::mem::replace(&mut self.since, now);
        self.windows += 1;
        let (status, end_reason) = match (last, u.end.get()) {
            (true, Some(&(status, reason))) => (status, reason),
            _ => (200, "window"),
        };
        Some(TurnRecord {
            n: self.windows,
            kind: TurnKind::Live { estimated },
            started_at,
            ended_at: now,
            latency: now.duration_since(started_at).unwrap_or_default(),
            ttft: None,
            status,
            end_reason,
            usage: Some(Usage {
                audio_seconds: Some(ms as f64 / 1000.0),
                ..Usage::default()
            }),
            response_id: None,
            conversation_id: None,
        })
    }
}

impl LiveWindows {
    fn ledger(&self) -> std::sync::MutexGuard<'_, DelegatedLedger> {
        self.usage
            .delegated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The delegated responses seen since the last call, one record each,
    /// priced at their own model's token rates by the meter.
    pub fn take_delegated(&mut self) -> Vec<TurnRecord> {
        let taken = self.ledger().take();
        records_of(taken)
    }

    /// [`LiveWindows::take_delegated`], their response ids first recorded
    /// by the session's [`ChargedMark`] when it has one (so that a replica
    /// adopting the session knows them: [`LiveUsage::knows_delegated`]);
    /// responses whose ids the store did not confirm wait for the next
    /// flush, unless this is the last.
    pub async fn take_delegated_marked(&mut self, last: bool) -> Vec<TurnRecord> {
        let taken = self.ledger().take();
        let mark = self.usage.mark.get().cloned();
        if let (Some(mark), false) = (mark, taken.is_empty()) {
            let ids = taken.iter().map(|d| d.response_id.clone()).collect();
            if !mark.mark_delegated(ids).await && !last {
                self.ledger().requeue(taken);
                return Vec::new();
            }
        }
        records_of(taken)
    }
}

/// One record per delegated response.
fn records_of(taken: Vec<delegated::Delegated>) -> Vec<TurnRecord> {
    let now = SystemTime::now();
    taken
        .into_iter()
        .map(|d| TurnRecord {
            n: 0,
            kind: TurnKind::Delegated {
                model: d.model,
                delegation_id: d.delegation_id,
            },
            started_at: now,
            ended_at: now,
            latency: std::time::Duration::ZERO,
            ttft: None,
            status: 200,
            end_reason: d.status,
            usage: Some(d.usage),
            response_id: Some(d.response_id),
            conversation_id: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(s: f64) -> String {
        format!(r#"{{"type":"session.usage.updated","event_id":"e","usage":{{"seconds":{s}}}}}"#)
    }

    fn closed(s: f64) -> String {
        format!(
            r#"{{"type":"session.closed","event_id":"e","reason":"close_requested","session":{{}},"usage":{{"seconds":{s}}}}}"#
        )
    }

    fn seconds(rec: &TurnRecord) -> f64 {
        rec.usage.unwrap().audio_seconds.unwrap()
    }

    #[test]
    fn increases_are_charged_whatever_the_order_repetition_or_loss_of_events() {
        // The same 60 s session reported four ways; each charges 60 s.
        let ways: [&[f64]; 4] = [
            &[10.0, 20.0, 30.0, 40.0, 50.0, 60.0],
            &[10.0, 10.0, 20.0, 20.0, 30.0, 60.0, 60.0],
            &[20.0, 10.0, 40.0, 30.0, 60.0, 50.0],
            &[30.0, 60.0],
        ];
        for figures in ways {
            let u = Arc::new(LiveUsage::new(Instant::now()));
            let mut w = LiveWindows::new(u.clone());
            let mut total = 0.0;
            for (i, s) in figures.iter().enumerate() {
                u.on_upstream(usage(*s).as_bytes());
                if i % 2 == 1 {
                    total += w.take(false).map_or(0.0, |r| seconds(&r));
                }
            }
            u.on_upstream(closed(60.0).as_bytes());
            let last = w.take(true).unwrap();
            assert_eq!(last.kind, TurnKind::Live { estimated: false });
            total += seconds(&last);
            assert_eq!(total, 60.0, "{figures:?}");
        }
    }

    #[test]
    fn a_window_without_a_rise_writes_nothing_and_a_decrease_charges_nothing() {
        let u = Arc::new(LiveUsage::new(Instant::now()));
        let mut w = LiveWindows::new(u.clone());
        assert!(w.take(false).is_none());
        u.on_upstream(usage(5.0).as_bytes());
        assert_eq!(seconds(&w.take(false).unwrap()), 5.0);
        u.on_upstream(usage(3.0).as_bytes());
        assert!(w.take(false).is_none());
        // A final figure below the highest seen lowers nothing.
        u.on_upstream(closed(4.0).as_bytes());
        assert_eq!(seconds(&w.take(true).unwrap()), 0.0);
    }

    #[test]
    fn without_session_closed_the_end_is_the_last_figure_plus_the_time_since_it() {
        let u = Arc::new(LiveUsage::new(
            Instant::now() - std::time::Duration::from_secs(30),
        ));
        u.ended(499, "client_gone");
        let mut w = LiveWindows::new(u.clone());
        u.on_upstream(usage(12.0).as_bytes());
        // Seen just now: the estimate adds (almost) nothing to 12 s.
        let last = w.take(true).unwrap();
        assert_eq!(last.kind, TurnKind::Live { estimated: true });
        assert!((12.0..12.5).contains(&seconds(&last)), "{last:?}");
        assert_eq!((last.status, last.end_reason), (499, "client_gone"));

        // No figure at all: the time since the session started.
        let u = Arc::new(LiveUsage::new(
            Instant::now() - std::time::Duration::from_secs(30),
        ));
        let last = LiveWindows::new(u).take(true).unwrap();
        assert!((30.0..31.0).contains(&seconds(&last)), "{last:?}");
        assert_eq!(final_figure(5_000, false, 2_000), (7_000, true));
        assert_eq!(final_figure(5_000, true, 2_000), (5_000, false));
    }

    #[test]
    fn the_start_is_rewritten_with_one_model_and_the_started_id_is_read() {
        let start: serde_json::Value = serde_json::from_str(
            r#"{"type":"session.start","event_id":"e1","session":{"model":"voice","model":"gpt-live-1.1","instructions":"hi"}}"#,
        )
        .unwrap();
        let out = with_model(&start, "gpt-live-1").unwrap();
        assert_eq!(out.matches("\"model\"").count(), 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["session"]["model"], "gpt-live-1");
        assert_eq!(v["session"]["instructions"], "hi");
        assert_eq!(v["event_id"], "e1");
        assert!(with_model(&serde_json::json!({"type": "session.start"}), "m").is_none());
        assert_eq!(
            started_id(r#"{"type":"session.started","session":{"id":"live_1","model":"m"}}"#)
                .as_deref(),
            Some("live_1")
        );
        assert_eq!(started_id("{}"), None);
    }

    #[test]
    fn a_session_handed_over_is_charged_once_across_the_two_replicas() {
        let started = Instant::now() - std::time::Duration::from_secs(60);
        let a = Arc::new(LiveUsage::new(started));
        let mut wa = LiveWindows::new(a.clone());
        a.on_upstream(usage(20.0).as_bytes());
        assert_eq!(seconds(&wa.take(false).unwrap()), 20.0);
        a.on_upstream(usage(25.0).as_bytes());
        a.let_go();
        // No estimate for the time since: the next replica meters it.
        let last = wa.take(true).unwrap();
        assert_eq!(
            (seconds(&last), last.kind),
            (5.0, TurnKind::Live { estimated: false })
        );
        assert_eq!(a.charged_ms(), 25_000);

        let b = Arc::new(LiveUsage::resumed(Instant::now(), a.charged_ms()));
        let mut wb = LiveWindows::new(b.clone());
        b.on_upstream(usage(24.0).as_bytes());
        assert!(wb.take(false).is_none(), "nothing charged twice");
        b.on_upstream(usage(40.0).as_bytes());
        b.on_upstream(closed(42.0).as_bytes());
        assert_eq!(seconds(&wb.take(true).unwrap()), 17.0);
    }

    /// A store's mark: the figures recorded, what was charged when each
    /// was asked for, and whether it confirms.
    #[derive(Debug, Default)]
    struct Mark {
        usage: OnceLock<Arc<LiveUsage>>,
        asked: Mutex<Vec<(u64, u64)>>,
        delegated: Mutex<Vec<String>>,
        fails: AtomicBool,
    }

    impl ChargedMark for Mark {
        fn mark(&self, charged_ms: u64) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
            let charged = self.usage.get().map_or(0, |u| u.charged_ms());
            self.asked.lock().unwrap().push((charged_ms, charged));
            let ok = !self.fails.load(Ordering::Relaxed);
            Box::pin(async move { ok })
        }

        fn mark_delegated(
            &self,
            response_ids: Vec<String>,
        ) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
            let ok = !self.fails.load(Ordering::Relaxed);
            if ok {
                self.delegated.lock().unwrap().extend(response_ids);
            }
            Box::pin(async move { ok })
        }
    }

    fn delegated_done(id: &str) -> String {
        format!(
            r#"{{"type":"response.event","event_id":"e","delegation_id":"dlg_1","event":{{"type":"response.completed","response":{{"id":"{id}","model":"gpt-5.5","usage":{{"input_tokens":10,"output_tokens":5,"total_tokens":15}}}}}}}}"#
        )
    }

    #[tokio::test]
    async fn delegated_responses_charged_before_a_hand_over_are_not_charged_again_after_it() {
        // Replica A charges resp_1, its id marked first.
        let a = Arc::new(LiveUsage::new(Instant::now()));
        let mark = Arc::new(Mark::default());
        a.marked_by(mark.clone());
        let mut wa = LiveWindows::new(a.clone());
        a.on_upstream(delegated_done("resp_1").as_bytes());
        assert_eq!(wa.take_delegated_marked(false).await.len(), 1);
        let charged = mark.delegated.lock().unwrap().clone();
        assert_eq!(charged, vec!["resp_1".to_string()]);

        // Replica B adopts the session knowing the marked ids: the same
        // terminal event repeated there charges nothing; a new one does,
        // once its id is marked (a failed mark waits for the next flush).
        let b = Arc::new(LiveUsage::resumed(Instant::now(), 0));
        b.knows_delegated(charged);
        b.marked_by(mark.clone());
        let mut wb = LiveWindows::new(b.clone());
        b.on_upstream(delegated_done("resp_1").as_bytes());
        assert!(wb.take_delegated_marked(false).await.is_empty());
        b.on_upstream(delegated_done("resp_2").as_bytes());
        mark.fails.store(true, Ordering::Relaxed);
        assert!(wb.take_delegated_marked(false).await.is_empty());
        mark.fails.store(false, Ordering::Relaxed);
        let taken = wb.take_delegated_marked(false).await;
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].response_id.as_deref(), Some("resp_2"));
        assert!(wb.take_delegated_marked(false).await.is_empty());
    }

    #[tokio::test]
    async fn a_window_is_charged_only_after_its_figure_is_marked_and_an_unmarked_one_waits() {
        let u = Arc::new(LiveUsage::new(Instant::now()));
        let mark = Arc::new(Mark::default());
        mark.usage.set(u.clone()).unwrap();
        u.marked_by(mark.clone());
        let mut w = LiveWindows::new(u.clone());
        u.on_upstream(usage(20.0).as_bytes());
        assert_eq!(seconds(&w.take_marked(false).await.unwrap()), 20.0);
        // Nothing rose: nothing to mark.
        assert!(w.take_marked(false).await.is_none());
        // The store does not confirm: not charged, the mark never behind.
        mark.fails.store(true, Ordering::Relaxed);
        u.on_upstream(usage(30.0).as_bytes());
        assert!(w.take_marked(false).await.is_none());
        assert_eq!(u.charged_ms(), 20_000);
        mark.fails.store(false, Ordering::Relaxed);
        u.on_upstream(usage(35.0).as_bytes());
        assert_eq!(seconds(&w.take_marked(false).await.unwrap()), 15.0);
        // The last is charged even if its mark fails.
        mark.fails.store(true, Ordering::Relaxed);
        u.on_upstream(closed(40.0).as_bytes());
        assert_eq!(seconds(&w.take_marked(true).await.unwrap()), 5.0);
        // Each mark was asked for before the window reaching it was
        // charged: a replica killed in between has charged less than its
        // mark, and the one adopting from the mark charges nothing twice.
        let asked = mark.asked.lock().unwrap().clone();
        assert_eq!(
            asked,
            vec![
                (20_000, 0),
                (30_000, 20_000),
                (35_000, 20_000),
                (40_000, 35_000)
            ]
        );
    }

    #[test]
    fn odd_events_and_figures_never_raise_the_count_wrongly() {
        let u = LiveUsage::new(Instant::now());
        // Type elsewhere than first, still read.
        u.on_upstream(br#"{"usage":{"seconds":7},"type":"session.usage.updated"}"#);
        assert_eq!(u.seen_ms.load(Ordering::Relaxed), 7_000);
        // Another event that mentions the name is not a usage event.
        u.on_upstream(br#"{"type":"session.output_transcript.delta","delta":"session.usage.updated","usage":{"seconds":900}}"#);
        u.on_upstream(br#"{"delta":"session.usage.updated","usage":{"seconds":900},"type":"x"}"#);
        for odd in ["-5", "1e400", "\"9\"", "null"] {
            u.on_upstream(
                format!(r#"{{"type":"session.usage.updated","usage":{{"seconds":{odd}}}}}"#)
                    .as_bytes(),
            );
        }
        assert_eq!(u.seen_ms.load(Ordering::Relaxed), 7_000);
        assert!(!u.closed());
        u.on_upstream(br#"{"type":"session.closed","reason":"expired","session":{}}"#);
        assert!(u.closed());
        assert_eq!(charge_increase(7_000, 5_000), 0);
    }

    #[test]
    fn a_delegated_response_is_taken_once_as_its_models_record_and_leaves_the_seconds_alone() {
        let u = Arc::new(LiveUsage::new(Instant::now()));
        let mut w = LiveWindows::new(u.clone());
        let done = r#"{"type":"response.event","event_id":"e","delegation_id":"dlg_1","event":{"type":"response.completed","response":{"id":"resp_1","model":"gpt-5.5","usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":1},"total_tokens":15}}}}"#;
        u.on_upstream(done.as_bytes());
        u.on_upstream(done.as_bytes());
        u.on_upstream(usage(3.0).as_bytes());
        let taken = w.take_delegated();
        assert_eq!(taken.len(), 1, "{taken:?}");
        let rec = &taken[0];
        assert_eq!(
            rec.kind,
            TurnKind::Delegated {
                model: "gpt-5.5".into(),
                delegation_id: Some("dlg_1".into())
            }
        );
        assert_eq!(rec.response_id.as_deref(), Some("resp_1"));
        assert_eq!(rec.end_reason, "completed");
        let tokens = rec.usage.unwrap();
        assert_eq!(
            (tokens.input_text, tokens.cached_text, tokens.output_text),
            (10, 4, 5)
        );
        assert!(w.take_delegated().is_empty());
        assert_eq!(u.seen_ms(), 3_000);
    }
}
