//! Fleet session leases: a key's live sessions counted across every gateway
//! that shares one Redis, so a key's `max_sessions` holds for the fleet, and
//! a gateway that dies without cleaning up (SIGKILL, node loss) frees its
//! sessions' slots within [`LEASE_TTL`].
//!
//! # In Redis
//! One sorted set per key, `{prefix}sessions:{key_id}`: member = lease id
//! (a session id; a call id for the calls path), score = the lease's expiry
//! in Unix milliseconds. Every write also sets the set's own TTL to
//! [`LEASE_TTL`], so a key nobody uses any more leaves nothing behind.
//!
//! # Guarantees
//! - **Admission is atomic**: one Lua script ([`ACQUIRE_SCRIPT`]) prunes the
//!   expired members, counts the rest and adds the new lease only if the
//!   count is below the cap. Redis runs a script as one step, so two
//!   gateways cannot both take the last slot.
//! - **Renewal is one round trip per tick**: every [`LEASE_RENEW`] a gateway
//!   sends ONE pipeline holding, per key it has live sessions of, one `ZADD`
//!   (all that key's live leases, new expiry) and one `PEXPIRE`; never a
//!   command per session. The `ZADD` is not `XX` on purpose: it re-adds
//!   leases Redis never saw or lost, so sessions admitted while Redis was
//!   unreachable (see below) are counted by the fleet again within one tick
//!   of Redis answering.
//! - **Ending frees the slot at once**: dropping a [`Lease`] queues its
//!   `ZREM`, sent right away by the task that renews. Renewals and removal
//!   batches are serialised (snapshot through reply, the drain's final batch
//!   included), so a removal is never overtaken by a renewal already in
//!   flight, which would resurrect the lease for a whole TTL. A removal that
//!   fails is retried every tick while it still matters, for [`LEASE_TTL`]
//!   (the lease has expired after that), at most [`MAX_PENDING_REMOVALS`].
//! - **A dead gateway's leases expire** within [`LEASE_TTL`] of its last
//!   renewal; nothing else needs to notice that it died.
//!
//! # Taking a lease over
//! A lease is named by its id, not by the gateway holding it:
//! [`Leases::adopt`] makes this gateway renew an existing lease (a call
//! whose sideband moved here) without a cap check, and [`Lease::hand_off`]
//! stops renewing it here without removing it. [`ACQUIRE_SCRIPT`] also
//! treats a lease id that is already live as admitted (and refreshes it), so
//! acquiring an id twice never takes two slots.
//!
//! # Clocks
//! Expiries come from each gateway's own clock, passed in as `now` so the
//! rules are testable without waiting (the rpm windows make the same
//! choice). A gateway whose clock runs Δ ahead prunes other gateways' leases
//! Δ early; that is harmless while Δ < `LEASE_TTL − LEASE_RENEW` (20 s),
//! because a live lease is renewed at least that long before it expires. A
//! dead gateway's leases then live up to `LEASE_TTL + Δ`. NTP-synced pods
//! are far inside both bounds.
//!
//! # Failure
//! Every call is bounded by [`CALL_TIMEOUT`]. [`Leases::acquire`] returns
//! the error and admission falls back to the process's own count (fail
//! open; the lease id is held and removed like any other, in case the
//! script ran although its reply was lost). An acquire abandoned before it
//! returns (its task dropped: a calls request whose client went away)
//! queues the lease's removal the same way. Renewal and removal failures
//! are logged and counted in `patchbay_store_errors_total`, and a failed
//! removal is retried. The script is sent with `EVAL`: it is a few hundred
//! bytes, Redis caches it by its hash either way, and `EVAL` needs no
//! `NOSCRIPT` retry.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Value;
use tokio::sync::Notify;
use tokio::time::MissedTickBehavior;

use super::grouped::Grouped;
use super::{StoreError, CALL_TIMEOUT};
use crate::metrics::Metrics;

/// How long a lease lives without a renewal.
pub const LEASE_TTL: Duration = Duration::from_secs(30);
/// How often a gateway renews the leases it holds.
pub const LEASE_RENEW: Duration = Duration::from_secs(10);
/// Bound on ended leases whose `ZREM` is waiting for Redis; past it the
/// oldest are forgotten (they expire on their own within [`LEASE_TTL`]).
pub const MAX_PENDING_REMOVALS: usize = 65_536;

/// `KEYS[1]` the key's lease set; `ARGV`: now (Unix ms), the new lease's
/// expiry (Unix ms), the cap, the lease id, the set's TTL (ms). Returns
/// `{1, holders}` when the lease is held (new, or already live), else
/// `{0, holders}`; `holders` counts the live leases after the call.
pub const ACQUIRE_SCRIPT: &str = r"
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local live = redis.call('ZCARD', KEYS[1])
if not redis.call('ZSCORE', KEYS[1], ARGV[4]) then
  if live >= tonumber(ARGV[3]) then
    return {0, live}
  end
  live = live + 1
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {1, live}
";

/// Milliseconds since the Unix epoch (0 before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
        .try_into()
        .unwrap_or(u64::MAX)
}

/// The score of a lease written at `now`: its expiry in Unix milliseconds.
pub fn expiry_ms(now: SystemTime, ttl: Duration) -> u64 {
    unix_ms(now).saturating_add(ttl.as_millis().try_into().unwrap_or(u64::MAX))
}

/// The renewal for one tick: per key, its live lease ids, both in a stable
/// order; keys without a live lease are left out.
pub fn renewal_batches(live: &HashMap<String, HashMap<String, u32>>) -> Vec<(String, Vec<String>)> {
    let mut batches: Vec<(String, Vec<String>)> = live
        .iter()
        .filter(|(_, ids)| !ids.is_empty())
        .map(|(key, ids)| {
            let mut ids: Vec<String> = ids.keys().cloned().collect();
            ids.sort();
            (key.clone(), ids)
        })
        .collect();
    batches.sort();
    batches
}

/// An ended lease whose `ZREM` has not reached Redis yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub key_id: String,
    pub lease_id: String,
    pub at: Instant,
}

/// Whether removing a lease that ended at `ended_at` still matters at
/// `now`: after [`LEASE_TTL`] it has expired in Redis anyway.
pub fn removal_due(ended_at: Instant, now: Instant) -> bool {
    now.saturating_duration_since(ended_at) < LEASE_TTL
}

/// The removals still worth sending, grouped per key (one `ZREM` each):
/// drops those past [`removal_due`] and those whose id is live again here.
pub fn removal_batches(
    ended: &[Ended],
    live: &HashMap<String, HashMap<String, u32>>,
    now: Instant,
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in ended {
        let live_again = live
            .get(&e.key_id)
            .is_some_and(|ids| ids.contains_key(&e.lease_id));
        if removal_due(e.at, now) && !live_again {
            out.entry(e.key_id.clone())
                .or_default()
                .push(e.lease_id.clone());
        }
    }
    out
}

/// The outcome of [`Leases::acquire`].
#[derive(Debug)]
pub enum Acquire {
    /// The lease is held (and renewed) until the guard drops.
    Granted { lease: Lease, holders: u64 },
    /// The key is at its cap across the fleet.
    Full { holders: u64 },
}

/// This gateway's leases and its connection to Redis. Cheap to clone.
#[derive(Clone)]
pub struct Leases {
    inner: Arc<Inner>,
}

struct Inner {
    conn: super::conn::RedisConn,
    prefix: String,
    timeout: Duration,
    state: Mutex<State>,
    /// Woken when a lease ends, so its removal goes out at once.
    wake: Notify,
    /// Held across each renewal and each removal batch (snapshot through
    /// reply), so a removal queued after a renewal's snapshot always lands
    /// after that renewal, whichever task sends it.
    writes: tokio::sync::Mutex<()>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct State {
    /// Key id → lease id → guards held here (an id is normally held once).
    live: HashMap<String, HashMap<String, u32>>,
    ended: VecDeque<Ended>,
}

impl std::fmt::Debug for Leases {
    // The connection's URL may carry a password: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl Leases {
    /// Leases on `url` under `prefix` ([`super::DEFAULT_PREFIX`] in
    /// production). Does not connect; must be called inside a Tokio runtime.
    /// Nothing is renewed until [`Leases::spawn_renewal`].
    pub fn new(url: &str, prefix: &str, metrics: Arc<Metrics>) -> Result<Self, StoreError> {
        Ok(Self::with_conn(
            super::conn::RedisConn::new(url, None)?,
            prefix,
            metrics,
        ))
    }

    /// Leases on the process's shared Redis connection.
    pub fn with_conn(conn: super::conn::RedisConn, prefix: &str, metrics: Arc<Metrics>) -> Self {
        Self {
            inner: Arc::new(Inner {
                conn,
                prefix: prefix.to_string(),
                timeout: CALL_TIMEOUT,
                state: Mutex::default(),
                wake: Notify::new(),
                writes: tokio::sync::Mutex::new(()),
                metrics,
            }),
        }
    }

    /// The sorted set holding `key_id`'s leases.
    pub fn set_name(&self, key_id: &str) -> String {
        if self.inner.conn.tagged() {
            format!("{}sessions:{{{key_id}}}", self.inner.prefix)
        } else {
            format!("{}sessions:{key_id}", self.inner.prefix)
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One round trip: takes a slot for `lease_id` if `key_id` holds fewer
    /// than `cap` live leases across the fleet (an id already live counts
    /// as held). Expiries are computed from `now`. On an error the script
    /// may still have run: the caller [`Leases::hold`]s the id so that its
    /// removal goes out when it ends. Dropped before it returns, it queues
    /// the removal itself.
    pub async fn acquire(
        &self,
        key_id: &str,
        lease_id: &str,
        cap: usize,
        now: SystemTime,
    ) -> Result<Acquire, StoreError> {
        const OP: &str = "lease acquire";
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(ACQUIRE_SCRIPT)
            .arg(1)
            .arg(self.set_name(key_id))
            .arg(unix_ms(now))
            .arg(expiry_ms(now, LEASE_TTL))
            .arg(cap)
            .arg(lease_id)
            .arg(LEASE_TTL.as_millis() as u64);
        // Until the call returns, the script may have added the lease
        // without anyone holding it: this future dropped mid-call (the
        // caller gave up on admission) would leave the slot taken for a
        // whole TTL. Then the lease's removal is queued, as when a held
        // lease ends. Once the call returns, the caller owns the outcome:
        // a granted lease is held below; on an error (the reply lost, a
        // timeout) the caller holds the id, so it is removed when that ends.
        let mut unanswered = Unanswered {
            leases: self,
            key_id,
            lease_id,
            answered: false,
        };
        let mut conn = self.inner.conn.get();
        let reply = tokio::time::timeout(self.inner.timeout, cmd.query_async(&mut conn)).await;
        unanswered.answered = true;
        let (held, holders): (i64, i64) = match reply {
            Ok(Ok(reply)) => reply,
            Ok(Err(source)) => return Err(StoreError::Redis { op: OP, source }),
            Err(_) => {
                return Err(StoreError::Timeout {
                    op: OP,
                    after: self.inner.timeout,
                })
            }
        };
        let holders = holders.max(0) as u64;
        Ok(if held == 1 {
            Acquire::Granted {
                lease: self.hold(key_id, lease_id),
                holders,
            }
        } else {
            Acquire::Full { holders }
        })
    }

    /// Holds `lease_id` here without asking Redis: renewed from the next
    /// tick on (which adds it if Redis does not have it), removed on drop.
    /// Admission uses it when Redis did not answer.
    pub fn hold(&self, key_id: &str, lease_id: &str) -> Lease {
        *self
            .lock()
            .live
            .entry(key_id.to_string())
            .or_default()
            .entry(lease_id.to_string())
            .or_insert(0) += 1;
        Lease {
            leases: self.clone(),
            key_id: key_id.to_string(),
            id: lease_id.to_string(),
            handed_off: false,
        }
    }

    /// Takes over an existing lease by id (no cap check: it is already
    /// counted): held and renewed here from now on, written to Redis at once
    /// with a fresh expiry. A failed write is counted and the next tick
    /// writes it again.
    pub async fn adopt(&self, key_id: &str, lease_id: &str, now: SystemTime) -> Lease {
        let lease = self.hold(key_id, lease_id);
        let batch = vec![(key_id.to_string(), vec![lease_id.to_string()])];
        // Under the write lock like a renewal: a removal of this lease
        // queued meanwhile must land after this write, not before it.
        let _writes = self.inner.writes.lock().await;
        if let Err(e) = self.run("lease adopt", &self.renewal(&batch, now)).await {
            self.store_error(&e, "lease adopt");
        }
        lease
    }

    /// Leases this gateway holds for `key_id`.
    pub fn held(&self, key_id: &str) -> usize {
        self.lock().live.get(key_id).map_or(0, HashMap::len)
    }

    /// One round trip: `key_id`'s live leases across the fleet (those
    /// still unexpired at `now`), counted as [`ACQUIRE_SCRIPT`] counts them;
    /// a read, nothing is pruned or written.
    pub async fn live(&self, key_id: &str, now: SystemTime) -> Result<u64, StoreError> {
        const OP: &str = "lease count";
        let mut g = Grouped::new(false);
        g.keep(
            key_id,
            redis::cmd("ZCOUNT")
                .arg(self.set_name(key_id))
                .arg(format!("({}", unix_ms(now)))
                .arg("+inf")
                .to_owned(),
        );
        match self.run(OP, &g).await?.first() {
            Some(Value::Int(n)) => Ok((*n).max(0) as u64),
            other => Err(StoreError::Reply {
                op: OP,
                message: format!("not a count: {other:?}"),
            }),
        }
    }

    fn end(&self, key_id: &str, lease_id: &str, remove: bool) {
        let mut s = self.lock();
        if let Some(ids) = s.live.get_mut(key_id) {
            if let Some(n) = ids.get_mut(lease_id) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    ids.remove(lease_id);
                }
            }
            if ids.is_empty() {
                s.live.remove(key_id);
            }
        }
        if remove {
            queue_removal(&mut s, key_id, lease_id);
        }
        drop(s);
        self.inner.wake.notify_one();
    }

    /// Queues the removal of a lease this gateway may never have held (an
    /// acquire left without its answer). Skipped when sent if the id is
    /// held here by then.
    fn remove_unheld(&self, key_id: &str, lease_id: &str) {
        queue_removal(&mut self.lock(), key_id, lease_id);
        self.inner.wake.notify_one();
    }

    /// One pipeline on one server; in a cluster one per key's set.
    fn renewal(&self, batches: &[(String, Vec<String>)], now: SystemTime) -> Grouped {
        let expiry = expiry_ms(now, LEASE_TTL);
        let mut g = Grouped::new(self.inner.conn.tagged());
        for (key_id, ids) in batches {
            let set = self.set_name(key_id);
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(&set);
            for id in ids {
                zadd.arg(expiry).arg(id);
            }
            g.ignore(key_id, zadd).ignore(
                key_id,
                redis::cmd("PEXPIRE")
                    .arg(&set)
                    .arg(LEASE_TTL.as_millis() as u64)
                    .to_owned(),
            );
        }
        g
    }

    /// One pipeline renewing every lease held here; nothing is sent when
    /// none is held.
    pub async fn renew(&self, now: SystemTime) -> Result<(), StoreError> {
        let _writes = self.inner.writes.lock().await;
        let batches = renewal_batches(&self.lock().live);
        if batches.is_empty() {
            return Ok(());
        }
        self.run("lease renew", &self.renewal(&batches, now))
            .await
            .map(|_| ())
    }

    /// Sends the queued removals (one `ZREM` per key, one pipeline). On
    /// failure they are queued again for the next attempt.
    pub async fn send_removals(&self, now: Instant) -> Result<(), StoreError> {
        let _writes = self.inner.writes.lock().await;
        let (ended, batches) = {
            let mut s = self.lock();
            let ended: Vec<Ended> = s.ended.drain(..).collect();
            let batches = removal_batches(&ended, &s.live, now);
            (ended, batches)
        };
        if batches.is_empty() {
            return Ok(());
        }
        let mut g = Grouped::new(self.inner.conn.tagged());
        for (key_id, ids) in &batches {
            g.ignore(
                key_id,
                redis::cmd("ZREM")
                    .arg(self.set_name(key_id))
                    .arg(ids)
                    .to_owned(),
            );
        }
        let result = self.run("lease remove", &g).await.map(|_| ());
        if result.is_err() {
            let mut s = self.lock();
            for e in ended.into_iter().rev() {
                if s.ended.len() >= MAX_PENDING_REMOVALS {
                    break;
                }
                s.ended.push_front(e);
            }
        }
        result
    }

    /// Starts the task that renews every [`LEASE_RENEW`] and sends removals
    /// as leases end. It stops once every handle to these leases (the
    /// gateway's and every [`Lease`]'s) is gone.
    pub fn spawn_renewal(&self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(renew_loop(Arc::downgrade(&self.inner)))
    }

    async fn run(&self, op: &'static str, g: &Grouped) -> Result<Vec<Value>, StoreError> {
        g.run(&self.inner.conn.get(), op, self.inner.timeout).await
    }

    fn store_error(&self, e: &StoreError, during: &'static str) {
        self.inner.metrics.store_errors.inc();
        tracing::warn!(store = "redis", error = %e, during, "session lease call failed");
    }
}

fn queue_removal(s: &mut State, key_id: &str, lease_id: &str) {
    if s.ended.len() >= MAX_PENDING_REMOVALS {
        s.ended.pop_front();
    }
    s.ended.push_back(Ended {
        key_id: key_id.to_string(),
        lease_id: lease_id.to_string(),
        at: Instant::now(),
    });
}

/// An acquire that has not returned: dropped so, it queues the lease's
/// removal.
struct Unanswered<'a> {
    leases: &'a Leases,
    key_id: &'a str,
    lease_id: &'a str,
    answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.leases.remove_unheld(self.key_id, self.lease_id);
        }
    }
}

async fn renew_loop(inner: Weak<Inner>) {
    let mut tick = tokio::time::interval(LEASE_RENEW);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    // After a failed removal, wait for the next tick rather than retrying
    // on every ended session while Redis is away.
    let mut removals_paused = false;
    loop {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let leases = Leases { inner };
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = leases.renew(SystemTime::now()).await {
                    leases.store_error(&e, "lease renewal");
                }
                removals_paused = false;
            }
            _ = leases.inner.wake.notified() => {}
        }
        if !removals_paused {
            if let Err(e) = leases.send_removals(Instant::now()).await {
                leases.store_error(&e, "lease removal");
                removals_paused = true;
            }
        }
    }
}

/// A held session lease; dropping it ends the lease (its `ZREM` goes out at
/// once), unless it was handed off.
#[derive(Debug)]
pub struct Lease {
    leases: Leases,
    key_id: String,
    id: String,
    handed_off: bool,
}

impl Lease {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Stops renewing the lease here without removing it, for another
    /// gateway to [`Leases::adopt`]; if none does, it expires within
    /// [`LEASE_TTL`].
    pub fn hand_off(mut self) {
        self.handed_off = true;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.leases.end(&self.key_id, &self.id, !self.handed_off);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::held_replies::HeldReplies;

    fn live(pairs: &[(&str, &[&str])]) -> HashMap<String, HashMap<String, u32>> {
        pairs
            .iter()
            .map(|(k, ids)| {
                (
                    k.to_string(),
                    ids.iter().map(|i| (i.to_string(), 1)).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn expiry_is_now_plus_ttl_in_unix_milliseconds() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(unix_ms(t), 1_700_000_000_123);
        assert_eq!(expiry_ms(t, LEASE_TTL), 1_700_000_030_123);
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
    }

    #[test]
    fn renewal_is_one_batch_per_key_with_every_live_lease() {
        let l = live(&[("b", &["s2", "s1"]), ("a", &["s3"]), ("empty", &[])]);
        assert_eq!(
            renewal_batches(&l),
            vec![
                ("a".to_string(), vec!["s3".to_string()]),
                ("b".to_string(), vec!["s1".to_string(), "s2".to_string()]),
            ]
        );
        assert!(renewal_batches(&HashMap::new()).is_empty());
    }

    #[test]
    fn removals_matter_for_one_ttl_and_skip_leases_live_again() {
        let t0 = Instant::now();
        assert!(removal_due(t0, t0));
        assert!(removal_due(t0, t0 + LEASE_TTL - Duration::from_millis(1)));
        assert!(!removal_due(t0, t0 + LEASE_TTL));
        let ended = |k: &str, id: &str, at| Ended {
            key_id: k.into(),
            lease_id: id.into(),
            at,
        };
        let old = t0;
        let now = t0 + LEASE_TTL + Duration::from_secs(1);
        let recent = now - Duration::from_secs(1);
        let batches = removal_batches(
            &[
                ended("a", "s1", recent),
                ended("a", "s2", recent),
                ended("a", "s3", old),
                ended("b", "s4", recent),
                ended("c", "s5", recent),
            ],
            &live(&[("b", &["s4"])]),
            now,
        );
        assert_eq!(
            batches.into_iter().collect::<Vec<_>>(),
            vec![
                ("a".to_string(), vec!["s1".to_string(), "s2".to_string()]),
                ("c".to_string(), vec!["s5".to_string()]),
            ]
        );
    }

    fn words(g: &Grouped) -> Vec<Vec<String>> {
        g.commands()
            .map(|c| {
                c.args_iter()
                    .map(|a| match a {
                        redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                        _ => "<cursor>".into(),
                    })
                    .collect()
            })
            .collect()
    }

    #[tokio::test]
    async fn a_renewal_is_one_zadd_and_one_pexpire_per_key_however_many_sessions() {
        // Lazy connection: nothing is dialled, only the pipeline is built.
        let l = Leases::new("redis://127.0.0.1:1", "p:", Arc::new(Metrics::new())).unwrap();
        let mut held: Vec<Lease> = (0..50).map(|i| l.hold("a", &format!("s{i:02}"))).collect();
        held.push(l.hold("b", "x"));
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        let batches = renewal_batches(&l.lock().live);
        let cmds = words(&l.renewal(&batches, now));
        assert_eq!(cmds.len(), 4, "two keys, two commands each");
        let expiry = expiry_ms(now, LEASE_TTL).to_string();
        assert_eq!(cmds[0][..2], ["ZADD", "p:sessions:a"]);
        assert_eq!(cmds[0].len(), 2 + 2 * 50);
        assert!(cmds[0][2..].chunks(2).all(|pair| pair[0] == expiry));
        assert_eq!(cmds[1], ["PEXPIRE", "p:sessions:a", "30000"]);
        assert_eq!(cmds[2], ["ZADD", "p:sessions:b", &expiry, "x"]);
        assert_eq!(cmds[3], ["PEXPIRE", "p:sessions:b", "30000"]);
        // Ended leases leave the renewal and queue one ZREM per key.
        held.truncate(1);
        assert_eq!(l.held("a"), 1);
        assert_eq!(l.held("b"), 0);
        let queued: Vec<Ended> = l.lock().ended.iter().cloned().collect();
        let removals = removal_batches(&queued, &l.lock().live, Instant::now());
        assert_eq!(removals.len(), 2);
        assert_eq!(removals["a"].len(), 49);
        assert_eq!(removals["b"], ["x"]);
    }

    fn redis_url() -> Option<String> {
        crate::test_skip::redis_url("store::leases (a Redis-backed test)")
    }

    fn leases(url: &str) -> Leases {
        let prefix = format!("patchbay-test-{}:", crate::ids::short_id());
        Leases::new(url, &prefix, Arc::new(Metrics::new())).unwrap()
    }

    async fn members(l: &Leases, key: &str) -> Vec<(String, u64)> {
        let client = redis::Client::open(redis_url().unwrap()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("ZRANGE")
            .arg(l.set_name(key))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut c)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn acquire_admits_up_to_the_cap_and_expired_leases_free_their_slot() {
        let Some(url) = redis_url() else { return };
        let l = leases(&url);
        let t0 = SystemTime::now();
        let a = match l.acquire("k", "s1", 2, t0).await.unwrap() {
            Acquire::Granted { lease, holders } => {
                assert_eq!(holders, 1);
                lease
            }
            Acquire::Full { .. } => panic!("first lease refused"),
        };
        assert!(matches!(
            l.acquire("k", "s2", 2, t0).await.unwrap(),
            Acquire::Granted { holders: 2, .. }
        ));
        // Granted guards dropped at once above: only `a` is held here, but
        // s2's removal has not been sent (no renewal task), so Redis has 2.
        assert!(matches!(
            l.acquire("k", "s3", 2, t0).await.unwrap(),
            Acquire::Full { holders: 2 }
        ));
        // An id already live is held, not counted twice.
        assert!(matches!(
            l.acquire("k", "s1", 2, t0).await.unwrap(),
            Acquire::Granted { holders: 2, .. }
        ));
        // One millisecond before expiry both still count; at expiry they
        // are pruned and the slot is free.
        let almost = t0 + LEASE_TTL - Duration::from_millis(1);
        assert!(matches!(
            l.acquire("k", "s3", 2, almost).await.unwrap(),
            Acquire::Full { holders: 2 }
        ));
        let later = t0 + LEASE_TTL;
        assert!(matches!(
            l.acquire("k", "s3", 2, later).await.unwrap(),
            Acquire::Granted { holders: 1, .. }
        ));
        drop(a);
    }

    #[tokio::test]
    async fn a_cap_of_zero_admits_nothing() {
        let Some(url) = redis_url() else { return };
        let l = leases(&url);
        assert!(matches!(
            l.acquire("k", "s1", 0, SystemTime::now()).await.unwrap(),
            Acquire::Full { holders: 0 }
        ));
        assert!(members(&l, "k").await.is_empty());
    }

    #[tokio::test]
    async fn renewal_rewrites_every_held_lease_and_removal_deletes_it() {
        let Some(url) = redis_url() else { return };
        let l = leases(&url);
        let t0 = SystemTime::now();
        // Held without Redis (as after a failed acquire): renewal adds them.
        let a = l.hold("k", "s1");
        let b = l.hold("k", "s2");
        let c = l.hold("other", "s3");
        assert!(members(&l, "k").await.is_empty());
        l.renew(t0).await.unwrap();
        let expiry = expiry_ms(t0, LEASE_TTL);
        assert_eq!(
            members(&l, "k").await,
            vec![("s1".to_string(), expiry), ("s2".to_string(), expiry)]
        );
        assert_eq!(members(&l, "other").await, vec![("s3".to_string(), expiry)]);
        // A later tick pushes the expiry out.
        let t1 = t0 + LEASE_RENEW;
        l.renew(t1).await.unwrap();
        assert_eq!(members(&l, "other").await[0].1, expiry_ms(t1, LEASE_TTL));

        drop(a);
        l.send_removals(Instant::now()).await.unwrap();
        assert_eq!(members(&l, "k").await.len(), 1);
        // A handed-off lease stays in Redis for its new holder.
        b.hand_off();
        l.send_removals(Instant::now()).await.unwrap();
        assert_eq!(members(&l, "k").await.len(), 1);
        assert_eq!(l.held("k"), 0);
        // Another gateway adopts it by id and renews it from then on.
        let other = Leases::new(&url, &l.inner.prefix, Arc::new(Metrics::new())).unwrap();
        let t2 = t1 + LEASE_RENEW;
        let adopted = other.adopt("k", "s2", t2).await;
        assert_eq!(members(&l, "k").await[0].1, expiry_ms(t2, LEASE_TTL));
        assert_eq!(other.held("k"), 1);
        drop(adopted);
        drop(c);
        other.send_removals(Instant::now()).await.unwrap();
        l.send_removals(Instant::now()).await.unwrap();
        assert!(members(&l, "k").await.is_empty());
        assert!(members(&l, "other").await.is_empty());
    }

    #[tokio::test]
    async fn an_acquire_dropped_after_the_script_ran_frees_its_slot() {
        let Some(url) = redis_url() else { return };
        let proxy = HeldReplies::start(&url).await;
        let prefix = format!("patchbay-test-{}:", crate::ids::short_id());
        let l = Leases::new(&proxy.url(), &prefix, Arc::new(Metrics::new())).unwrap();
        // The script runs (Redis answered the proxy), and the admission
        // waiting for that answer is dropped.
        tokio::select! {
            r = l.acquire("k", "s1", 1, SystemTime::now()) => panic!("answered through a holding proxy: {r:?}"),
            _ = proxy.replied() => {}
        }
        let names = |m: Vec<(String, u64)>| m.into_iter().map(|(id, _)| id).collect::<Vec<_>>();
        assert_eq!(
            names(members(&l, "k").await),
            ["s1"],
            "the script took the slot"
        );
        proxy.release();
        l.send_removals(Instant::now()).await.unwrap();
        let held = names(members(&l, "k").await);
        assert!(
            held.is_empty(),
            "the abandoned lease still holds a slot: {held:?}"
        );
    }

    #[tokio::test]
    async fn unreachable_redis_is_an_error_and_removals_wait_for_it() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let metrics = Arc::new(Metrics::new());
        let l = Leases::new(
            &format!("redis://127.0.0.1:{port}"),
            "patchbay-test:",
            metrics,
        )
        .unwrap();
        assert!(l.acquire("k", "s1", 1, SystemTime::now()).await.is_err());
        drop(l.hold("k", "s1"));
        assert!(l.send_removals(Instant::now()).await.is_err());
        assert_eq!(l.lock().ended.len(), 1, "a failed removal is kept");
        // Past the TTL it is no longer worth sending: nothing goes out.
        l.send_removals(Instant::now() + LEASE_TTL).await.unwrap();
        assert!(l.lock().ended.is_empty());
    }
}
