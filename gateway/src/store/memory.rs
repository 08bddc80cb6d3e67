//! The in-memory store: the embedded default when no Redis is configured.
//!
//! It models the Redis keyspace ([`super::KeyNames`]) in two maps behind one
//! `std::sync::Mutex`, held for a few map operations and never across an
//! await, so it is correct for the sessions of one process and nothing more:
//! two gateway replicas with in-memory stores each enforce the full limits
//! (a key gets `replicas × rpm`). Counters die with the process, including
//! `total` budgets; use Redis for anything that must survive a restart.
//!
//! Expiry follows the Redis TTLs: an expired entry reads as absent, and
//! expired entries are swept every [`SWEEP_EVERY`] calls so idle keys do not
//! accumulate. Request-log rows are not kept (stdout is the log). Writes
//! are guarded by the same per-session marks as on Redis, so a write sent
//! twice counts once here too.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::{
    period_ttl, window_position, AdmitCounts, AdmitQuery, FlushBatch, KeyNames, Replayed,
    RpmWindow, Store, StoreFuture, WindowCounts, FLUSH_MARK_TTL, WINDOW_TTL,
};

/// Calls between sweeps of expired entries.
pub const SWEEP_EVERY: u64 = 4096;

#[derive(Debug, Default)]
pub struct MemoryStore {
    names: KeyNames,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Window counters: value and expiry.
    windows: HashMap<String, (u64, Instant)>,
    /// Budget counters: USD and expiry (`None` = never).
    budgets: HashMap<String, (f64, Option<Instant>)>,
    /// Write marks: a session's highest applied write, and expiry.
    marks: HashMap<String, (u64, Instant)>,
    calls: u64,
}

impl State {
    fn window(&self, key: &str, now: Instant) -> u64 {
        match self.windows.get(key) {
            Some((v, exp)) if *exp > now => *v,
            _ => 0,
        }
    }

    fn incr_window(&mut self, key: String, by: i64, now: Instant) -> u64 {
        let current = self.window(&key, now);
        let next = if by >= 0 {
            current.saturating_add(by as u64)
        } else {
            current.saturating_sub(by.unsigned_abs())
        };
        self.windows.insert(key, (next, now + WINDOW_TTL));
        next
    }

    fn budget(&self, key: &str, now: Instant) -> f64 {
        match self.budgets.get(key) {
            Some((v, None)) => *v,
            Some((v, Some(exp))) if *exp > now => *v,
            _ => 0.0,
        }
    }

    fn incr_budget(&mut self, key: String, by: f64, ttl: Option<Duration>, now: Instant) -> f64 {
        let next = self.budget(&key, now) + by;
        self.budgets.insert(key, (next, ttl.map(|t| now + t)));
        next
    }

    fn tick(&mut self, now: Instant) {
        self.calls += 1;
        if self.calls.is_multiple_of(SWEEP_EVERY) {
            self.windows.retain(|_, (_, exp)| *exp > now);
            self.budgets
                .retain(|_, (_, exp)| exp.is_none_or(|e| e > now));
            self.marks.retain(|_, (_, exp)| *exp > now);
        }
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn admit_now(&self, q: &AdmitQuery) -> AdmitCounts {
        let now = Instant::now();
        let (minute, _) = window_position(q.now);
        let mut s = self.lock();
        s.tick(now);
        let rpm = match q.rpm {
            RpmWindow::Skip => None,
            RpmWindow::Read => Some(s.window(&self.names.rpm(&q.key_id, minute), now)),
            RpmWindow::Count => Some(s.incr_window(self.names.rpm(&q.key_id, minute), 1, now)),
        }
        .map(|current| WindowCounts {
            current,
            previous: s.window(&self.names.rpm(&q.key_id, minute.wrapping_sub(1)), now),
        });
        let tpm = q.read_tpm.then(|| WindowCounts {
            current: s.window(&self.names.tpm(&q.key_id, minute), now),
            previous: s.window(&self.names.tpm(&q.key_id, minute.wrapping_sub(1)), now),
        });
        let budgets = q
            .budgets
            .iter()
            .map(|b| s.budget(&self.names.budget(b, q.now), now))
            .collect();
        AdmitCounts { rpm, tpm, budgets }
    }

    fn flush_now(&self, batch: &FlushBatch) -> Vec<f64> {
        let now = Instant::now();
        let (minute, _) = window_position(batch.now);
        let mut s = self.lock();
        s.tick(now);
        let fresh = match &batch.id {
            Some(id) => {
                let key = self.names.flushed(&id.session_id, super::Scope::Key, "");
                let applied = match s.marks.get(&key) {
                    Some((seq, exp)) if *exp > now => *seq,
                    _ => 0,
                };
                let fresh = id.seq > applied;
                if fresh {
                    s.marks.insert(key, (id.seq, now + FLUSH_MARK_TTL));
                }
                fresh
            }
            None => false,
        };
        let totals = batch
            .charges
            .iter()
            .map(|(b, cost)| {
                let key = self.names.budget(b, batch.now);
                if fresh && *cost > 0.0 {
                    s.incr_budget(key, *cost, period_ttl(b.period, batch.now), now)
                } else {
                    s.budget(&key, now)
                }
            })
            .collect();
        if let Some((key_id, tokens)) = batch.tpm.as_ref().filter(|_| fresh) {
            let by = i64::try_from(*tokens).unwrap_or(i64::MAX);
            s.incr_window(self.names.tpm(key_id, minute), by, now);
        }
        totals
    }
}

impl Store for MemoryStore {
    fn admit<'a>(&'a self, q: &'a AdmitQuery) -> StoreFuture<'a, AdmitCounts> {
        let counts = self.admit_now(q);
        Box::pin(async move { Ok(counts) })
    }

    fn unadmit<'a>(&'a self, key_id: &'a str, minute: u64) -> StoreFuture<'a, ()> {
        let now = Instant::now();
        let mut s = self.lock();
        let key = self.names.rpm(key_id, minute);
        if s.window(&key, now) > 0 {
            s.incr_window(key, -1, now);
        }
        drop(s);
        Box::pin(async { Ok(()) })
    }

    fn flush<'a>(&'a self, batch: &'a FlushBatch) -> StoreFuture<'a, Vec<f64>> {
        let totals = self.flush_now(batch);
        Box::pin(async move { Ok(totals) })
    }

    fn replay<'a>(&'a self, batches: &'a [&'a FlushBatch]) -> StoreFuture<'a, Vec<Replayed>> {
        let out = batches
            .iter()
            .map(|b| {
                self.flush_now(b);
                Replayed::Applied
            })
            .collect();
        Box::pin(async move { Ok(out) })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    /// Rows go to stdout only.
    fn keeps_rows(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::config::BudgetPeriod;
    use crate::store::{BudgetKey, FlushId, Scope};

    fn query(budgets: Vec<BudgetKey>, now: SystemTime) -> AdmitQuery {
        AdmitQuery {
            key_id: "k".into(),
            rpm: RpmWindow::Count,
            read_tpm: true,
            budgets,
            now,
        }
    }

    fn team(period: BudgetPeriod) -> BudgetKey {
        BudgetKey {
            scope: Scope::Team,
            id: "t".into(),
            period,
        }
    }

    fn id(seq: u64) -> FlushId {
        FlushId {
            session_id: "up1".into(),
            seq,
        }
    }

    #[tokio::test]
    async fn reading_the_rpm_window_counts_no_request() {
        let s = MemoryStore::new();
        let now = SystemTime::now();
        let read = AdmitQuery {
            rpm: RpmWindow::Read,
            ..query(vec![], now)
        };
        assert_eq!(s.admit(&read).await.unwrap().rpm.unwrap().current, 0);
        assert_eq!(
            s.admit(&query(vec![], now))
                .await
                .unwrap()
                .rpm
                .unwrap()
                .current,
            1
        );
        assert_eq!(s.admit(&read).await.unwrap().rpm.unwrap().current, 1);
        assert_eq!(s.admit(&read).await.unwrap().rpm.unwrap().current, 1);
        let skip = AdmitQuery {
            rpm: RpmWindow::Skip,
            ..query(vec![], now)
        };
        assert_eq!(s.admit(&skip).await.unwrap().rpm, None);
    }

    #[tokio::test]
    async fn a_write_sent_again_counts_once_and_an_older_one_is_ignored() {
        let s = MemoryStore::new();
        let now = SystemTime::now();
        let batch = |seq| FlushBatch {
            id: Some(id(seq)),
            now,
            charges: vec![(team(BudgetPeriod::Total), 1.0)],
            tpm: Some(("k".into(), 10)),
            rows: vec![],
            stream_maxlen: 0,
        };
        assert_eq!(s.flush(&batch(1)).await.unwrap(), vec![1.0]);
        // The same write again (its reply was lost): read, not charged.
        assert_eq!(s.flush(&batch(1)).await.unwrap(), vec![1.0]);
        let replayed = s.replay(&[&batch(1), &batch(2), &batch(2)]).await.unwrap();
        assert_eq!(replayed, vec![Replayed::Applied; 3]);
        let c = s
            .admit(&query(vec![team(BudgetPeriod::Total)], now))
            .await
            .unwrap();
        assert_eq!(c.budgets, vec![2.0]);
        assert_eq!(c.tpm.unwrap().current, 20);
        // Another session's first write is its own.
        let other = FlushBatch {
            id: Some(FlushId {
                session_id: "up2".into(),
                seq: 1,
            }),
            ..batch(1)
        };
        assert_eq!(s.flush(&other).await.unwrap(), vec![3.0]);
    }

    #[tokio::test]
    async fn requests_count_per_minute_and_can_be_given_back() {
        let s = MemoryStore::new();
        let now = SystemTime::now();
        let q = query(vec![], now);
        assert_eq!(s.admit(&q).await.unwrap().rpm.unwrap().current, 1);
        assert_eq!(s.admit(&q).await.unwrap().rpm.unwrap().current, 2);
        let (minute, _) = window_position(now);
        s.unadmit("k", minute).await.unwrap();
        assert_eq!(s.admit(&q).await.unwrap().rpm.unwrap().current, 2);
        // The next minute sees these as the previous window.
        let later = query(vec![], now + Duration::from_secs(60));
        let c = s.admit(&later).await.unwrap().rpm.unwrap();
        assert_eq!((c.previous, c.current), (2, 1));
    }

    #[tokio::test]
    async fn flush_charges_budgets_and_tpm_and_returns_totals() {
        let s = MemoryStore::new();
        let now = SystemTime::now();
        let batch = FlushBatch {
            id: Some(id(1)),
            now,
            charges: vec![
                (team(BudgetPeriod::Total), 1.25),
                (team(BudgetPeriod::Daily), 0.5),
            ],
            tpm: Some(("k".into(), 300)),
            rows: vec![],
            stream_maxlen: 0,
        };
        assert_eq!(s.flush(&batch).await.unwrap(), vec![1.25, 0.5]);
        let second = FlushBatch {
            id: Some(id(2)),
            ..batch.clone()
        };
        assert_eq!(s.flush(&second).await.unwrap(), vec![2.5, 1.0]);
        let read = FlushBatch {
            id: None,
            charges: vec![(team(BudgetPeriod::Total), 0.0)],
            tpm: None,
            ..batch
        };
        assert_eq!(s.flush(&read).await.unwrap(), vec![2.5]);
        let c = s
            .admit(&query(vec![team(BudgetPeriod::Daily)], now))
            .await
            .unwrap();
        assert_eq!(c.tpm.unwrap().current, 600);
        assert_eq!(c.budgets, vec![1.0]);
    }

    #[tokio::test]
    async fn a_daily_budget_starts_over_the_next_day() {
        let s = MemoryStore::new();
        let now = SystemTime::now();
        let batch = FlushBatch {
            id: Some(id(1)),
            now,
            charges: vec![(team(BudgetPeriod::Daily), 3.0)],
            tpm: None,
            rows: vec![],
            stream_maxlen: 0,
        };
        s.flush(&batch).await.unwrap();
        let tomorrow = now + Duration::from_secs(86_400);
        let c = s
            .admit(&query(vec![team(BudgetPeriod::Daily)], tomorrow))
            .await
            .unwrap();
        assert_eq!(c.budgets, vec![0.0]);
    }
}
