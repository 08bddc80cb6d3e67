//! The outbox: one per process, it keeps every store write a meter could
//! not make (Redis down, slow or unreachable) and replays them, in order,
//! when the store answers again. It outlives the sessions whose writes it
//! holds, so a session that ends during an outage loses neither its rows
//! nor its spend.
//!
//! Guarantees:
//! - **In order.** Once anything is queued, meters queue their next writes
//!   behind it instead of writing directly, and an entry leaves the queue
//!   only once the store confirmed it. A session's writes therefore reach
//!   the store in the order they were made, which the store's write marks
//!   rely on ([`crate::store`]).
//! - **Exactly once.** Every write carries its [`FlushId`]; the store applies
//!   a write at most once, so replaying one whose reply was lost (applied,
//!   then the call timed out) counts nothing twice, rows included.
//! - **Where it belongs.** A write keeps the time it was made: its budget
//!   periods and tpm minute are those of that time, not of the replay.
//!   Writes are not merged: each keeps its own guard (merging two writes,
//!   one of which may already be applied, would count that one twice).
//! - **Bounded.** At most [`Bounds::max_rows`] rows and [`Bounds::max_bytes`]
//!   (approximate) are kept; past that the oldest writes are dropped, with a
//!   warning and `patchbay_outbox_dropped_total{sink="store"}` (rows) and
//!   `patchbay_outbox_dropped_usd_total` (their spend). Writes already sent
//!   in the replay's round trip are not dropped: the store's answer decides
//!   them (dropped and then applied, a write was counted twice: in the
//!   store, and by its meter as lost spend). The bound can be over by one
//!   replay batch ([`REPLAY_BATCH`] writes) for one round trip.
//! - **Never in the way.** Pushing is a short lock; the replay runs on its
//!   own task, retrying with a backoff from [`RETRY_MIN`] to [`RETRY_MAX`]
//!   (at once when the drain asks, see [`Outbox::settle`]). A write the
//!   store rejects outright (an error a retry cannot fix) is dropped and
//!   counted, so one bad write cannot block the queue.
//!
//! Caveat: the outbox lives in memory. A process killed (not drained)
//! during an outage loses what it holds; the drain waits for it within
//! `[drain] wait_secs`.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::lane::{Bounds, Lane, SETTLE_POLL};
use crate::metrics::{sink, Metrics, RefusalLabel};
use crate::store::{FlushBatch, Replayed, Store, StoreError};

/// Writes sent in one replay round trip.
pub const REPLAY_BATCH: usize = 64;
/// First wait before retrying a failed replay; doubles up to [`RETRY_MAX`].
pub const RETRY_MIN: Duration = Duration::from_millis(100);
pub const RETRY_MAX: Duration = Duration::from_secs(2);
/// Bytes counted per row on top of its field values.
const ROW_OVERHEAD_BYTES: usize = 256;

const PENDING: u8 = 0;
const APPLIED: u8 = 1;
const DROPPED: u8 = 2;

/// A queued write, shared with the meter that made it so the meter knows
/// whether its spend reached the store yet.
#[derive(Debug)]
pub struct Queued {
    pub batch: FlushBatch,
    state: AtomicU8,
}

/// Where a queued write is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueuedState {
    Pending,
    Applied,
    Dropped,
}

impl Queued {
    pub fn state(&self) -> QueuedState {
        match self.state.load(Ordering::Acquire) {
            APPLIED => QueuedState::Applied,
            DROPPED => QueuedState::Dropped,
            _ => QueuedState::Pending,
        }
    }

    fn set(&self, s: u8) {
        self.state.store(s, Ordering::Release);
    }
}

/// Approximate bytes of a write: its rows' field values plus overhead.
pub fn batch_bytes(b: &FlushBatch) -> usize {
    let rows: usize = b
        .rows
        .iter()
        .map(|r| ROW_OVERHEAD_BYTES + r.approx_bytes())
        .sum();
    rows + 128 * (1 + b.charges.len())
}

#[derive(Debug, Clone)]
struct Gauges {
    rows: Gauge,
    bytes: Gauge,
    dropped: Counter,
    dropped_usd: Counter<f64, std::sync::atomic::AtomicU64>,
    replayed: Counter,
    store_errors: Counter,
    refusals: Family<RefusalLabel, Counter>,
}

/// The store outbox; see the module docs.
pub struct Outbox {
    store: Arc<dyn Store>,
    lane: Mutex<Lane<Arc<Queued>>>,
    /// Wakes the replayer when something is queued.
    queued: Arc<Notify>,
    /// Cuts the replayer's backoff short (drain).
    urgent: Arc<Notify>,
    gauges: Gauges,
}

impl std::fmt::Debug for Outbox {
    // Counts only: the queue can hold many rows.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lane = self.lock();
        f.debug_struct("Outbox")
            .field("store", &self.store.describe())
            .field("writes", &lane.len())
            .field("rows", &lane.rows())
            .finish_non_exhaustive()
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        // Lets the replayer notice the outbox is gone and end.
        self.queued.notify_one();
        self.urgent.notify_one();
    }
}

impl Outbox {
    /// An outbox in front of `store`, with its replay task spawned (must be
    /// called inside the runtime). The task ends when the outbox is dropped.
    pub fn start(store: Arc<dyn Store>, bounds: Bounds, metrics: &Metrics) -> Arc<Self> {
        let gauges = Gauges {
            rows: metrics.outbox_rows.get_or_create(&sink("store")).clone(),
            bytes: metrics.outbox_bytes.get_or_create(&sink("store")).clone(),
            dropped: metrics.outbox_dropped.get_or_create(&sink("store")).clone(),
            dropped_usd: metrics.outbox_dropped_usd.clone(),
            replayed: metrics.outbox_replayed.clone(),
            store_errors: metrics.store_errors.clone(),
            refusals: metrics.store_refusals.clone(),
        };
        let outbox = Arc::new(Self {
            store,
            lane: Mutex::new(Lane::new(bounds)),
            queued: Arc::new(Notify::new()),
            urgent: Arc::new(Notify::new()),
            gauges,
        });
        tokio::spawn(replay_loop(
            Arc::downgrade(&outbox),
            outbox.queued.clone(),
            outbox.urgent.clone(),
        ));
        outbox
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lane<Arc<Queued>>> {
        self.lane.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True while any write waits: new writes must queue behind it.
    pub fn is_pending(&self) -> bool {
        !self.lock().is_empty()
    }

    /// Writes waiting.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        !self.is_pending()
    }

    /// Queues `batch` for replay; returns the handle its meter watches.
    pub fn push(&self, batch: FlushBatch) -> Arc<Queued> {
        let rows = batch.rows.len();
        let bytes = batch_bytes(&batch);
        let q = Arc::new(Queued {
            batch,
            state: AtomicU8::new(PENDING),
        });
        let dropped = {
            let mut lane = self.lock();
            let (_, dropped) = lane.push(q.clone(), rows, bytes);
            self.update_gauges(&lane);
            dropped
        };
        if !dropped.is_empty() {
            let rows: usize = dropped.iter().map(|(_, r)| r).sum();
            let usd: f64 = dropped.iter().map(|(q, _)| q.batch.rows_cost()).sum();
            for (q, _) in &dropped {
                q.set(DROPPED);
            }
            self.gauges.dropped.inc_by(rows as u64);
            self.gauges.dropped_usd.inc_by(usd);
            tracing::warn!(
                writes = dropped.len(),
                rows,
                usd,
                "store outbox full: dropped the oldest writes (their rows and spend never reach the store)"
            );
        }
        self.queued.notify_one();
        q
    }

    fn update_gauges(&self, lane: &Lane<Arc<Queued>>) {
        self.gauges.rows.set(lane.rows() as i64);
        self.gauges.bytes.set(lane.bytes() as i64);
    }

    /// Waits until every queued write is confirmed, or `deadline`; retries
    /// at once instead of after the backoff. True when the outbox is empty.
    pub async fn settle(&self, deadline: Instant) -> bool {
        loop {
            if self.is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            self.urgent.notify_one();
            tokio::time::sleep(SETTLE_POLL.min(deadline - Instant::now())).await;
        }
    }

    /// One replay round trip over the front of the queue. `Ok(true)` when
    /// something was confirmed or dropped, `Ok(false)` when the queue was
    /// empty.
    async fn replay_once(&self) -> Result<bool, StoreError> {
        let front = one_write_per_session(
            self.lock()
                .front(REPLAY_BATCH)
                .into_iter()
                .map(|(id, q)| (id, q.clone()))
                .collect(),
        );
        if front.is_empty() {
            return Ok(false);
        }
        {
            let mut lane = self.lock();
            for (id, _) in &front {
                lane.set_in_flight(*id, true);
            }
        }
        let batches: Vec<&FlushBatch> = front.iter().map(|(_, q)| &q.batch).collect();
        let results = match tokio::time::timeout(
            crate::store::redis::REPLAY_TIMEOUT,
            self.store.replay(&batches),
        )
        .await
        {
            Ok(Ok(results)) => results,
            Ok(Err(e)) => return Err(self.back_to_waiting(&front, e)),
            Err(_) => {
                let e = StoreError::Timeout {
                    op: "replay",
                    after: crate::store::redis::REPLAY_TIMEOUT,
                };
                return Err(self.back_to_waiting(&front, e));
            }
        };
        let mut lane = self.lock();
        for ((id, q), result) in front.iter().zip(results) {
            lane.remove(*id);
            match result {
                Replayed::Applied => {
                    q.set(APPLIED);
                    self.gauges.replayed.inc();
                }
                Replayed::Rejected(message) => {
                    q.set(DROPPED);
                    self.gauges.dropped.inc_by(q.batch.rows.len() as u64);
                    self.gauges.dropped_usd.inc_by(q.batch.rows_cost());
                    tracing::error!(store = %self.store.describe(), error = %message, rows = q.batch.rows.len(), "the store rejected a queued write; dropped");
                }
            }
        }
        self.update_gauges(&lane);
        Ok(true)
    }

    /// After a failed round trip its writes wait again (and the bound may
    /// drop them from now on); returns `e`.
    fn back_to_waiting(&self, front: &[(u64, Arc<Queued>)], e: StoreError) -> StoreError {
        let mut lane = self.lock();
        for (id, _) in front {
            lane.set_in_flight(*id, false);
        }
        e
    }
}

/// The front writes, keeping at most the first write of each session: a
/// round trip runs every write it carries even when one fails, so a later
/// write of the same session could raise the session's mark past an earlier
/// one that failed transiently, which would then be skipped as already
/// applied. The queue order is kept.
fn one_write_per_session(front: Vec<(u64, Arc<Queued>)>) -> Vec<(u64, Arc<Queued>)> {
    let mut seen = std::collections::HashSet::new();
    front
        .into_iter()
        .filter(|(_, q)| match &q.batch.id {
            Some(id) => seen.insert(id.session_id.clone()),
            None => true,
        })
        .collect()
}

/// The replay task: waits for queued writes, replays them, backs off while
/// the store fails. Holds the outbox only while it works, so dropping the
/// outbox ends it.
async fn replay_loop(outbox: Weak<Outbox>, queued: Arc<Notify>, urgent: Arc<Notify>) {
    let mut backoff = RETRY_MIN;
    let mut failing = false;
    loop {
        let result = {
            let Some(ob) = outbox.upgrade() else { return };
            // Bounded by the replay timeout inside.
            let r = ob.replay_once().await;
            if let Err(e) = &r {
                ob.gauges.store_errors.inc();
                if let Some((reason, refused)) = e.refusal() {
                    ob.gauges
                        .refusals
                        .get_or_create(&RefusalLabel {
                            reason: reason.into(),
                        })
                        .inc();
                    if !failing {
                        tracing::warn!(store = %ob.store.describe(), reason, refused = %refused, queued = ob.len(),
                            "the store refuses a queued write (nothing of it applied); keeping it and the writes behind it in the outbox");
                    }
                } else if !failing {
                    tracing::warn!(store = %ob.store.describe(), error = %e, queued = ob.len(), "store unreachable; keeping writes in the outbox");
                }
            } else if failing {
                tracing::info!(store = %ob.store.describe(), "store answers again; replaying the outbox");
            }
            r
        };
        match result {
            Ok(true) => {
                failing = false;
                backoff = RETRY_MIN;
            }
            Ok(false) => {
                failing = false;
                backoff = RETRY_MIN;
                queued.notified().await;
            }
            Err(_) => {
                failing = true;
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = urgent.notified() => {}
                }
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logs::RequestLogRow;
    use crate::store::redis::RedisStore;
    use crate::store::FlushId;
    use std::time::SystemTime;

    fn one_row_batch(seq: u64, cost_usd: f64) -> FlushBatch {
        let row = RequestLogRow {
            request_id: format!("up1:{seq}"),
            session_id: "up1".into(),
            key_id: "k".into(),
            client_secret_id: None,
            transport: "websocket".into(),
            call_id: None,
            live_session_id: None,
            response_id: None,
            delegation_id: None,
            team: None,
            model: "m".into(),
            upstream_model: "m".into(),
            provider: "openai".into(),
            upstream: "m".into(),
            started_at: String::new(),
            ended_at: String::new(),
            latency_ms: 0,
            ttft_ms: None,
            status: 200,
            input_tokens: 0,
            output_tokens: 0,
            total_tokens: 0,
            input_text_tokens: 0,
            input_audio_tokens: 0,
            input_image_tokens: 0,
            input_cached_tokens: 0,
            output_text_tokens: 0,
            output_audio_tokens: 0,
            transcription_tokens: 0,
            audio_seconds: None,
            output_audio_seconds: None,
            cost_usd,
            usage_unknown: false,
            usage_implausible: false,
            usage_estimated: false,
            usage_unpriced: false,
            end_reason: "completed".into(),
        };
        FlushBatch {
            id: Some(FlushId {
                session_id: "up1".into(),
                seq,
            }),
            now: SystemTime::now(),
            charges: vec![],
            tpm: None,
            rows: vec![row],
            stream_maxlen: 0,
        }
    }

    #[test]
    fn a_replay_round_carries_at_most_one_write_per_session_in_queue_order() {
        let queued = |session: &str, seq: u64| {
            let mut batch = one_row_batch(seq, 0.01);
            batch.id = Some(FlushId {
                session_id: session.into(),
                seq,
            });
            Arc::new(Queued {
                batch,
                state: AtomicU8::new(PENDING),
            })
        };
        let front = vec![
            (1, queued("a", 1)),
            (2, queued("a", 2)),
            (3, queued("b", 1)),
            (4, queued("a", 3)),
            (5, queued("b", 2)),
            (6, queued("c", 7)),
        ];
        let kept: Vec<u64> = one_write_per_session(front)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(kept, vec![1, 3, 6]);
    }

    #[tokio::test]
    async fn past_its_bound_the_outbox_drops_the_oldest_writes_and_counts_rows_and_spend() {
        // A Redis nobody listens on: every replay fails, writes stay.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let store = Arc::new(RedisStore::new(&format!("redis://127.0.0.1:{port}"), "t:").unwrap());
        let metrics = Metrics::new();
        let outbox = Outbox::start(store, bounds(3, usize::MAX), &metrics);
        let queued: Vec<Arc<Queued>> = (1..=5)
            .map(|seq| outbox.push(one_row_batch(seq, 0.25 * seq as f64)))
            .collect();
        assert_eq!(outbox.len(), 3);
        let states: Vec<QueuedState> = queued.iter().map(|q| q.state()).collect();
        assert_eq!(
            states,
            [
                QueuedState::Dropped,
                QueuedState::Dropped,
                QueuedState::Pending,
                QueuedState::Pending,
                QueuedState::Pending
            ]
        );
        let text = metrics.encode();
        assert!(
            text.contains("patchbay_outbox_dropped_total{sink=\"store\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("patchbay_outbox_dropped_usd_total 0.75"),
            "{text}"
        );
        assert!(
            text.contains("patchbay_outbox_rows{sink=\"store\"} 3"),
            "{text}"
        );
        // The drain's wait gives up at its deadline while the store is down.
        let deadline = Instant::now() + Duration::from_millis(50);
        assert!(!outbox.settle(deadline).await);
    }

    #[tokio::test]
    async fn a_write_in_the_replays_round_trip_is_decided_by_the_store_not_dropped_by_the_bound() {
        let Some(url) = crate::test_skip::redis_url(
            "a_write_in_the_replays_round_trip_is_decided_by_the_store_not_dropped_by_the_bound",
        ) else {
            return;
        };
        let proxy = crate::store::held_replies::HeldReplies::start(&url).await;
        let prefix = format!("patchbay-test-{}:", crate::ids::short_id());
        let store = Arc::new(RedisStore::new(&proxy.url(), &prefix).unwrap());
        let metrics = Metrics::new();
        let outbox = Outbox::start(store, bounds(2, usize::MAX), &metrics);
        let first = outbox.push(one_row_batch(1, 0.5));
        // Its replay reached Redis; the answer is held.
        tokio::time::timeout(Duration::from_secs(5), proxy.replied())
            .await
            .expect("the replay is sent");
        let second = outbox.push(one_row_batch(2, 0.25));
        let third = outbox.push(one_row_batch(3, 0.125));
        // Over the bound: the oldest write not in flight goes.
        assert_eq!(first.state(), QueuedState::Pending);
        assert_eq!(second.state(), QueuedState::Dropped);
        proxy.release();
        assert!(outbox.settle(Instant::now() + Duration::from_secs(5)).await);
        assert_eq!(first.state(), QueuedState::Applied);
        assert_eq!(third.state(), QueuedState::Applied);
        let text = metrics.encode();
        assert!(
            text.contains("patchbay_outbox_dropped_total{sink=\"store\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("patchbay_outbox_dropped_usd_total 0.25"),
            "{text}"
        );
    }

    fn bounds(max_rows: usize, max_bytes: usize) -> Bounds {
        Bounds {
            max_rows,
            max_bytes,
        }
    }

    #[test]
    fn a_lane_keeps_order_and_drops_the_oldest_past_its_row_bound() {
        let mut lane = Lane::new(bounds(5, 1000));
        assert!(lane.push("a", 2, 10).1.is_empty());
        assert!(lane.push("b", 2, 10).1.is_empty());
        let (_, dropped) = lane.push("c", 2, 10);
        assert_eq!(dropped, vec![("a", 2)]);
        assert_eq!((lane.rows(), lane.bytes(), lane.len()), (4, 20, 2));
        let front: Vec<&str> = lane.front(10).into_iter().map(|(_, t)| *t).collect();
        assert_eq!(front, ["b", "c"]);
    }

    #[test]
    fn a_lane_drops_the_oldest_past_its_byte_bound_even_the_new_item() {
        let mut lane = Lane::new(bounds(100, 50));
        lane.push("a", 1, 30);
        let (_, dropped) = lane.push("b", 1, 30);
        assert_eq!(dropped, vec![("a", 1)]);
        let (_, dropped) = lane.push("huge", 1, 60);
        assert_eq!(dropped, vec![("b", 1), ("huge", 1)]);
        assert!(lane.is_empty());
        assert_eq!((lane.rows(), lane.bytes()), (0, 0));
    }

    #[test]
    fn a_lane_never_drops_an_item_in_flight() {
        let mut lane = Lane::new(bounds(2, 1000));
        let (a, _) = lane.push("a", 1, 1);
        lane.set_in_flight(a, true);
        lane.push("b", 1, 1);
        let (c, dropped) = lane.push("c", 1, 1);
        assert_eq!(dropped, vec![("b", 1)]);
        // Only items in flight left over the bound: kept until answered.
        lane.set_in_flight(c, true);
        let (_, dropped) = lane.push("d", 1, 1);
        assert_eq!(dropped, vec![("d", 1)]);
        assert_eq!(lane.remove(a), Some("a"));
        lane.set_in_flight(c, false);
        let (_, dropped) = lane.push("e", 1, 1);
        assert!(dropped.is_empty());
        assert_eq!(lane.take_all(), vec![("c", 1), ("e", 1)]);
    }

    #[test]
    fn a_lane_removes_by_id_even_after_drops_shifted_the_front() {
        let mut lane = Lane::new(bounds(3, 1000));
        let (a, _) = lane.push("a", 1, 1);
        let (b, _) = lane.push("b", 1, 1);
        let front = lane.front(1);
        assert_eq!(front, vec![(a, &"a")]);
        lane.push("c", 1, 1);
        lane.push("d", 1, 1); // drops "a" while it was being replayed
        assert_eq!(lane.remove(a), None);
        assert_eq!(lane.remove(b), Some("b"));
        assert_eq!((lane.rows(), lane.len()), (2, 2));
        assert_eq!(lane.take_all(), vec![("c", 1), ("d", 1)]);
        assert_eq!((lane.rows(), lane.bytes()), (0, 0));
    }
}
