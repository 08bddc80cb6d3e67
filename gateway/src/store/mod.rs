//! The metering store: rpm/tpm windows and budget counters behind one trait,
//! with an in-memory implementation (the embedded default, one process) and
//! a Redis one (shared by every gateway instance that points at it).
//!
//! The trait is shaped by round trips, not by counters: admission asks one
//! question ([`Store::admit`]) and a meter flush makes one write
//! ([`Store::flush`]), each a single pipeline on Redis. Decisions (is the
//! window full, is the budget spent, how long to wait) are pure functions in
//! [`crate::metering`] over the numbers the store returns, so both
//! implementations are held to the same rules and the rules are tested
//! without I/O.
//!
//! Both implementations use the same key names ([`KeyNames`]), so the
//! in-memory store is a faithful model of what lands in Redis:
//! - `{prefix}rpm:{key_id}:{minute}` and `{prefix}tpm:{key_id}:{minute}`:
//!   integer counters per UTC minute (`minute` = Unix seconds / 60), expiring
//!   after [`WINDOW_TTL`] so the previous minute stays readable;
//! - `{prefix}budget:{key|team|route}:{id}:{period}`: USD spent, a float;
//!   `period` is `total`, `d<YYYY-MM-DD>` or `m<YYYY-MM>` (UTC). Daily and
//!   monthly counters expire [`BUDGET_GRACE`] after their period ends; `total`
//!   never expires;
//! - `{prefix}request_logs`: the request-log stream (Redis only);
//! - `{prefix}sessions:{key_id}`: a capped key's live session leases
//!   (Redis only; [`leases`]).
//! - `{prefix}flushed:{session_id}`: the highest write of that session's
//!   meter already applied, expiring [`FLUSH_MARK_TTL`] after its last
//!   write: the guard that makes a replayed write a no-op.
//!
//! Writes are idempotent. Every write a meter makes carries a [`FlushId`]
//! (its session and a sequence number that grows by one per write), and a
//! store applies a write only if its sequence number is above the session's
//! mark, setting the mark in the same atomic step. A write whose reply was
//! lost (a timeout after Redis applied it) can therefore be sent again from
//! the outbox ([`crate::metering::outbox`]) without counting twice, rows
//! included. That relies on a session's writes being applied in order,
//! which the outbox guarantees (a session's write is only sent once every
//! earlier one was confirmed or dropped).
//!
//! Windows are a sliding-window estimate over two fixed minutes: the count
//! for "the last 60 s" is `previous × (1 − elapsed/60 s) + current`. That
//! avoids the 2× burst a fixed window allows at a minute boundary for the
//! price of one extra `GET`, and assumes the previous minute's traffic was
//! evenly spread. Minutes come from each gateway's own clock (NTP-synced
//! pods agree to well under a second; a skewed pod counts into a
//! neighbouring minute, it does not lose counts).
//!
//! Callers bound every call with a timeout and fail open on any error; the
//! Redis implementation also bounds each call itself.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::BudgetPeriod;
use crate::logs::RequestLogRow;

pub mod conn;
pub(crate) mod flush_parts;
pub(crate) mod grouped;
#[cfg(test)]
pub(crate) mod held_replies;
pub mod leases;
pub mod memory;
pub mod redis;

/// Key prefix in production; tests use their own so they can run in parallel.
pub const DEFAULT_PREFIX: &str = "patchbay:";
/// Bound on one store call (a Redis call includes its connection).
pub const CALL_TIMEOUT: Duration = Duration::from_millis(500);
/// The rate windows' granularity.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Window counters live two windows, so the previous one is readable for
/// the whole current one.
pub const WINDOW_TTL: Duration = Duration::from_secs(120);
/// Daily and monthly budget counters outlive their period by this much, so
/// a pod with a slightly slow clock still reads the counter it writes.
pub const BUDGET_GRACE: Duration = Duration::from_secs(24 * 3600);
/// How long a session's write mark outlives the session's last write: a
/// write whose reply was lost is recognised as applied if it is replayed
/// within this time. One small key per session, not per write.
pub const FLUSH_MARK_TTL: Duration = Duration::from_secs(6 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {op} timed out after {after:?}")]
    Timeout { op: &'static str, after: Duration },
    #[error("store {op} failed: {source}")]
    Redis {
        op: &'static str,
        #[source]
        source: ::redis::RedisError,
    },
    #[error("store {op}: unexpected reply: {message}")]
    Reply { op: &'static str, message: String },
    #[error("invalid Redis URL: {0}")]
    Url(#[source] ::redis::RedisError),
    #[error("store ca_file: {0}")]
    CaFile(#[source] crate::pem::TlsSetupError),
}

impl StoreError {
    /// A write the store refused whole before writing anything (the flush
    /// script's `NOTAPPLIED <reason> <command> <key>`): the reason, and the
    /// command and key it refused.
    pub fn refusal(&self) -> Option<(&'static str, String)> {
        let text = self.to_string();
        let at = text.find("NOTAPPLIED")?;
        // The server's text comes after the code, however the client
        // library punctuates it (`"NOTAPPLIED": noperm XADD key`).
        let mut words = text[at + "NOTAPPLIED".len()..]
            .trim_start_matches(|c: char| c.is_whitespace() || matches!(c, ':' | '"' | '-'))
            .split_whitespace();
        let reason = match words.next()? {
            "noperm" => "noperm",
            "wrongtype" => "wrongtype",
            "not_a_number" => "not_a_number",
            _ => "other",
        };
        Some((reason, words.collect::<Vec<_>>().join(" ")))
    }
}

/// What became of one replayed write.
#[derive(Debug, Clone, PartialEq)]
pub enum Replayed {
    /// Applied now, or found already applied.
    Applied,
    /// The store answered with an error that a retry will not fix (the
    /// message is the store's); the write is dropped and counted.
    Rejected(String),
}

pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Counters for rate limits and budgets, shared by the sessions of a
/// process (memory) or of every process (Redis).
pub trait Store: Send + Sync + fmt::Debug {
    /// One round trip: counts one request in the key's rpm window (when
    /// [`RpmWindow::Count`]), and reads the rpm window (unless
    /// [`RpmWindow::Skip`]), the tpm window (when
    /// `read_tpm`) and the budget counters.
    fn admit<'a>(&'a self, q: &'a AdmitQuery) -> StoreFuture<'a, AdmitCounts>;

    /// Gives back a request counted by [`Store::admit`] for a session that
    /// was then refused.
    fn unadmit<'a>(&'a self, key_id: &'a str, minute: u64) -> StoreFuture<'a, ()>;

    /// One round trip, atomic and idempotent (see the module docs): unless
    /// the batch's [`FlushId`] was already applied, appends `rows` to the
    /// request-log stream (Redis only), adds each charge to its budget
    /// counter and the tokens to the tpm window, all of the period and
    /// minute of `batch.now`. Returns the budget totals after the write, in
    /// the order of `charges`.
    fn flush<'a>(&'a self, batch: &'a FlushBatch) -> StoreFuture<'a, Vec<f64>>;

    /// Sends queued writes again, in order (one round trip on Redis).
    /// `Err` when the store could not be reached: none, some or all were
    /// applied, and sending them again is safe.
    fn replay<'a>(&'a self, batches: &'a [&'a FlushBatch]) -> StoreFuture<'a, Vec<Replayed>>;

    /// One cheap round trip that proves the store answers (start-up check).
    fn ping(&self) -> StoreFuture<'_, ()>;

    /// `memory` or `redis`, for logs.
    fn kind(&self) -> &'static str;

    /// Whether [`Store::flush`] keeps the batch's rows (Redis appends them
    /// to its stream). A batch to a store that does not, with no charge and
    /// no tokens to count, is not sent at all.
    fn keeps_rows(&self) -> bool {
        true
    }

    /// What the store is, for logs: the kind, and for Redis its scheme,
    /// host and port (never a password).
    fn describe(&self) -> String {
        self.kind().to_string()
    }
}

/// Whose budget a counter is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Key,
    Team,
    Route,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Key => "key",
            Scope::Team => "team",
            Scope::Route => "route",
        }
    }
}

/// One budget counter: a scope's spend in one period.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetKey {
    pub scope: Scope,
    pub id: String,
    pub period: BudgetPeriod,
}

/// What [`Store::admit`] does with the key's rpm window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpmWindow {
    /// Neither count nor read it (the key has no rpm).
    Skip,
    /// Read it without counting a request (the usage answer).
    Read,
    /// Count this session as one request, then read it (admission).
    Count,
}

#[derive(Debug, Clone)]
pub struct AdmitQuery {
    pub key_id: String,
    pub rpm: RpmWindow,
    /// Read the tpm window (the key has a tpm).
    pub read_tpm: bool,
    pub budgets: Vec<BudgetKey>,
    pub now: SystemTime,
}

/// A rate window: the previous and the current minute's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowCounts {
    pub previous: u64,
    pub current: u64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct AdmitCounts {
    /// With this request counted in `current` ([`RpmWindow::Count`]).
    pub rpm: Option<WindowCounts>,
    pub tpm: Option<WindowCounts>,
    /// Spend so far, in the order of the query's budgets.
    pub budgets: Vec<f64>,
}

/// Which write a batch is: the `seq`-th (from 1) of a session's meter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushId {
    pub session_id: String,
    pub seq: u64,
}

#[derive(Debug, Clone)]
pub struct FlushBatch {
    /// `None` for a pure read (every charge 0, no tokens, no rows): it
    /// changes nothing, so it needs no guard.
    pub id: Option<FlushId>,
    /// When the batch was made: its budget periods and tpm minute, even
    /// when it is written later from the outbox.
    pub now: SystemTime,
    /// Cost to add to each budget counter (0 = just read it).
    pub charges: Vec<(BudgetKey, f64)>,
    /// Tokens to add to this key's tpm window.
    pub tpm: Option<(String, u64)>,
    /// Rows for the request-log stream.
    pub rows: Vec<RequestLogRow>,
    /// `XADD MAXLEN ~` cap; 0 = uncapped.
    pub stream_maxlen: usize,
}

impl FlushBatch {
    pub fn is_empty(&self) -> bool {
        self.counts_nothing() && self.rows.is_empty()
    }

    /// True when the batch has no counter to change or read (rows only).
    pub fn counts_nothing(&self) -> bool {
        self.charges.is_empty() && self.tpm.is_none()
    }

    /// True when the batch changes nothing (it only reads budgets).
    pub fn is_read_only(&self) -> bool {
        self.tpm.is_none() && self.rows.is_empty() && self.charges.iter().all(|(_, c)| *c <= 0.0)
    }

    /// The USD of the batch's rows (what each budget is charged).
    pub fn rows_cost(&self) -> f64 {
        self.rows.iter().map(|r| r.cost_usd).sum()
    }
}

/// Key names under one prefix. In a cluster ([`KeyNames::tagged`]) every
/// name carries the hash tag of the scope it serves (the id in braces:
/// `patchbay:budget:key:{k1}:total`), so the keys one script or pipeline
/// touches together share a slot; on one server the names are untagged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyNames {
    prefix: String,
    tagged: bool,
}

impl Default for KeyNames {
    fn default() -> Self {
        Self::new(DEFAULT_PREFIX)
    }
}

impl KeyNames {
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            tagged: false,
        }
    }

    /// The names of a cluster (`tagged`) or of one server.
    pub fn with_tags(prefix: impl Into<String>, tagged: bool) -> Self {
        Self {
            prefix: prefix.into(),
            tagged,
        }
    }

    pub fn tagged(&self) -> bool {
        self.tagged
    }

    /// `id`, in braces when tagged.
    fn id(&self, id: &str) -> String {
        if self.tagged {
            format!("{{{id}}}")
        } else {
            id.to_string()
        }
    }

    pub fn rpm(&self, key_id: &str, minute: u64) -> String {
        format!("{}rpm:{}:{minute}", self.prefix, self.id(key_id))
    }

    pub fn tpm(&self, key_id: &str, minute: u64) -> String {
        format!("{}tpm:{}:{minute}", self.prefix, self.id(key_id))
    }

    pub fn budget(&self, b: &BudgetKey, now: SystemTime) -> String {
        format!(
            "{}budget:{}:{}:{}",
            self.prefix,
            b.scope.as_str(),
            self.id(&b.id),
            period_label(b.period, now)
        )
    }

    /// The request-log stream of `key_id`'s rows: one stream on one server,
    /// one per client key in a cluster.
    pub fn request_logs(&self, key_id: &str) -> String {
        if self.tagged {
            format!("{}request_logs:{{{key_id}}}", self.prefix)
        } else {
            format!("{}request_logs", self.prefix)
        }
    }

    /// A session's write mark: one on one server; in a cluster one per
    /// scope its writes touch (`scope`, `id`), beside that scope's keys.
    pub fn flushed(&self, session_id: &str, scope: Scope, id: &str) -> String {
        if self.tagged {
            format!(
                "{}flushed:{}:{{{id}}}:{session_id}",
                self.prefix,
                scope.as_str()
            )
        } else {
            format!("{}flushed:{session_id}", self.prefix)
        }
    }
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// The UTC minute `t` falls in, and how far into it.
pub fn window_position(t: SystemTime) -> (u64, Duration) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let minute = d.as_secs() / WINDOW.as_secs();
    let into = d - Duration::from_secs(minute * WINDOW.as_secs());
    (minute, into)
}

/// `total`, `d2025-01-31` or `m2025-01` (UTC).
pub fn period_label(period: BudgetPeriod, now: SystemTime) -> String {
    let days = (unix_secs(now) / 86_400) as i64;
    let (y, m, d) = civil_from_days(days);
    match period {
        BudgetPeriod::Total => "total".into(),
        BudgetPeriod::Daily => format!("d{y:04}-{m:02}-{d:02}"),
        BudgetPeriod::Monthly => format!("m{y:04}-{m:02}"),
    }
}

/// How long a budget counter written at `now` must live: to the end of its
/// period plus [`BUDGET_GRACE`]; `None` for `total` (never expires).
pub fn period_ttl(period: BudgetPeriod, now: SystemTime) -> Option<Duration> {
    let secs = unix_secs(now);
    let end = match period {
        BudgetPeriod::Total => return None,
        BudgetPeriod::Daily => (secs / 86_400 + 1) * 86_400,
        BudgetPeriod::Monthly => {
            let (y, m, _) = civil_from_days((secs / 86_400) as i64);
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            days_from_civil(ny, nm, 1).max(0) as u64 * 86_400
        }
    };
    Some(Duration::from_secs(end.saturating_sub(secs)) + BUDGET_GRACE)
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian
/// (H. Hinnant's `civil_from_days`).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// (year, month, day) → days since 1970-01-01.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_write_is_read_from_the_error_however_it_is_worded() {
        for message in [
            "NOTAPPLIED wrongtype INCRBYFLOAT p:budget:key:k:total",
            "\"NOTAPPLIED\": wrongtype INCRBYFLOAT p:budget:key:k:total",
        ] {
            let e = StoreError::Reply {
                op: "replay",
                message: message.into(),
            };
            assert_eq!(
                e.refusal(),
                Some(("wrongtype", "INCRBYFLOAT p:budget:key:k:total".into()))
            );
        }
        let other = StoreError::Reply {
            op: "flush",
            message: "READONLY You can't write against a read only replica.".into(),
        };
        assert_eq!(other.refusal(), None);
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn civil_dates_round_trip_and_agree_with_rfc3339() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
        for secs in [
            0u64,
            951_782_400,
            1_709_164_800,
            1_735_689_599,
            4_102_444_800,
        ] {
            let text = humantime::format_rfc3339_seconds(at(secs)).to_string();
            let (y, m, d) = civil_from_days((secs / 86_400) as i64);
            assert_eq!(format!("{y:04}-{m:02}-{d:02}"), text[..10], "{secs}");
        }
    }

    #[test]
    fn period_labels_are_utc_day_and_month() {
        // 2024-02-29T23:59:59Z
        let t = at(1_709_251_199);
        assert_eq!(period_label(BudgetPeriod::Daily, t), "d2024-02-29");
        assert_eq!(period_label(BudgetPeriod::Monthly, t), "m2024-02");
        assert_eq!(period_label(BudgetPeriod::Total, t), "total");
    }

    #[test]
    fn budget_counters_expire_after_their_period_plus_grace() {
        let t = at(1_709_251_199); // one second before 2024-03-01
        assert_eq!(
            period_ttl(BudgetPeriod::Daily, t),
            Some(Duration::from_secs(1) + BUDGET_GRACE)
        );
        assert_eq!(
            period_ttl(BudgetPeriod::Monthly, t),
            Some(Duration::from_secs(1) + BUDGET_GRACE)
        );
        // 2024-12-15T00:00:00Z: monthly runs to 2025-01-01.
        let t = at(1_734_220_800);
        assert_eq!(
            period_ttl(BudgetPeriod::Monthly, t),
            Some(Duration::from_secs(17 * 86_400) + BUDGET_GRACE)
        );
        assert_eq!(period_ttl(BudgetPeriod::Total, t), None);
    }

    #[test]
    fn window_position_splits_minutes() {
        let (m, into) = window_position(at(125) + Duration::from_millis(500));
        assert_eq!(m, 2);
        assert_eq!(into, Duration::from_millis(5500));
    }

    #[test]
    fn key_names_carry_prefix_scope_and_period() {
        let k = KeyNames::new("p:");
        let b = BudgetKey {
            scope: Scope::Team,
            id: "support".into(),
            period: BudgetPeriod::Daily,
        };
        assert_eq!(k.budget(&b, at(0)), "p:budget:team:support:d1970-01-01");
        assert_eq!(k.rpm("k1", 7), "p:rpm:k1:7");
        assert_eq!(k.tpm("k1", 7), "p:tpm:k1:7");
        assert_eq!(
            KeyNames::default().request_logs("k1"),
            "patchbay:request_logs"
        );
        assert_eq!(k.flushed("up1", Scope::Team, "support"), "p:flushed:up1");
    }

    #[test]
    fn tagged_key_names_put_each_scope_in_the_slot_of_its_id() {
        let k = KeyNames::with_tags("p:", true);
        let b = BudgetKey {
            scope: Scope::Team,
            id: "support".into(),
            period: BudgetPeriod::Total,
        };
        assert_eq!(k.budget(&b, at(0)), "p:budget:team:{support}:total");
        assert_eq!(k.rpm("k1", 7), "p:rpm:{k1}:7");
        assert_eq!(k.tpm("k1", 7), "p:tpm:{k1}:7");
        assert_eq!(k.request_logs("k1"), "p:request_logs:{k1}");
        assert_eq!(
            k.flushed("up1", Scope::Team, "support"),
            "p:flushed:team:{support}:up1"
        );
        assert_eq!(k.flushed("up1", Scope::Key, "k1"), "p:flushed:key:{k1}:up1");
    }
}
