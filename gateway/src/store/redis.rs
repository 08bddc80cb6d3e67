//! The Redis store: counters shared by every gateway instance pointed at the
//! same Redis (one server, a Cluster or a Sentinel-watched primary), through
//! the process's one [`RedisConn`].
//!
//! On one server each [`Store`] call is one round trip (in a cluster, one
//! per hash tag it touches, concurrently: [`super::grouped`],
//! [`super::flush_parts`]):
//! - admit: one pipeline: `INCR` + `EXPIRE` the rpm minute, `GET` the
//!   previous minute, `GET` both tpm minutes, `GET` each budget counter;
//! - flush: one Lua script ([`FLUSH_SCRIPT`], `EVALSHA`), atomic: if the
//!   batch's sequence number is above the session's mark
//!   (`{prefix}flushed:{session_id}`), it raises the mark and applies the
//!   batch: `XADD {prefix}request_logs MAXLEN ~ n * field value …` per row,
//!   `INCRBYFLOAT` + `EXPIRE` per charged budget, `INCRBY` + `EXPIRE` on the
//!   tpm minute; either way it returns the budget totals, which are the
//!   meter's budget re-read. A write sent twice is applied once;
//! - replay: one pipeline of `SCRIPT LOAD` and one `EVALSHA` per queued
//!   write, in order.
//!
//! A write is applied whole or not at all: before it sets the write mark,
//! the script checks every command it is about to run (the user's ACL
//! rights through `redis.acl_check_cmd`, each key's type, a counter's
//! value) and, if any would be refused, answers `NOTAPPLIED <reason>
//! <command> <key>` without writing anything. The write then waits in the
//! outbox like any write the store refused, counted in
//! `patchbay_store_refusals_total{reason}` and logged with the command, and
//! is replayed until the store takes it (a permission restored, a key
//! repaired). Writes after the checks still run under `pcall` and are
//! counted should one fail anyway.
//!
//! TLS: `rediss://` URLs connect with rustls (ring), verifying the server's
//! certificate against the webpki roots, or against the certificates of
//! `[store] ca_file` when it is set (then only those). Verification cannot
//! be turned off. `rediss://user:password@host:port` authenticates as a
//! Redis 6 ACL user.
//!
//! Failure handling: every call is bounded by [`CALL_TIMEOUT`] here, on top
//! of the connection's own connect and response timeouts, and errors are
//! returned, never retried here: the caller fails open and the outbox keeps
//! the write. The connection is made lazily, so a gateway starts (and
//! admits, failing open) while Redis is down, and reconnects when Redis
//! returns.

use std::time::Duration;

use redis::{Script, Value};

use super::conn::RedisConn;
use super::flush_parts::{self, Part};
use super::grouped::Grouped;
use super::{
    window_position, AdmitCounts, AdmitQuery, FlushBatch, KeyNames, Replayed, RpmWindow, Store,
    StoreError, StoreFuture, WindowCounts, CALL_TIMEOUT, WINDOW_TTL,
};

/// Bound on one replay round trip (up to [`crate::metering::outbox::REPLAY_BATCH`]
/// writes).
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);

/// The idempotent flush. KEYS: mark, stream, budgets…, [tpm]. ARGV: seq
/// (0 = read only), mark TTL s, stream MAXLEN (0 = none), budget count,
/// tpm increment (0 = none), tpm TTL s, row count, field count, field
/// names…, (cost, TTL s or 0) per budget, field values per row. Returns
/// `{failed commands, {budget totals as strings}}` (strings: Lua numbers
/// would be truncated to integers).
pub const FLUSH_SCRIPT: &str = r#"
local seq = tonumber(ARGV[1])
local nb = tonumber(ARGV[4])
local tpm_by = tonumber(ARGV[5])
local nrows = tonumber(ARGV[7])
local nf = tonumber(ARGV[8])
local b0 = 8 + nf
local fresh = false
if seq > 0 then
  local applied = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
  fresh = seq > applied
end
if fresh then
  -- Every command is checked before anything is written, so the write
  -- mark and the writes it guards land together or not at all: a refused
  -- write is answered as an error (NOTAPPLIED reason command key), left
  -- unmarked, and sent again by the outbox.
  local function allowed(...)
    if redis.acl_check_cmd == nil then return true end
    return redis.acl_check_cmd(...)
  end
  local function kind(key) return redis.call('TYPE', key)['ok'] end
  local function refuse(reason, cmd, key)
    return redis.error_reply('NOTAPPLIED ' .. reason .. ' ' .. cmd .. ' ' .. key)
  end
  if not allowed('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) then return refuse('noperm', 'SET', KEYS[1]) end
  local t = kind(KEYS[1])
  if t ~= 'none' and t ~= 'string' then return refuse('wrongtype', 'SET', KEYS[1]) end
  for i = 1, nb do
    local key = KEYS[2 + i]
    local cost = ARGV[b0 + 2 * i - 1]
    local ttl = ARGV[b0 + 2 * i]
    if tonumber(cost) > 0 then
      if not allowed('INCRBYFLOAT', key, cost) then return refuse('noperm', 'INCRBYFLOAT', key) end
      if tonumber(ttl) > 0 and not allowed('EXPIRE', key, ttl) then return refuse('noperm', 'EXPIRE', key) end
      t = kind(key)
      if t == 'string' then
        if tonumber(redis.call('GET', key)) == nil then return refuse('not_a_number', 'INCRBYFLOAT', key) end
      elseif t ~= 'none' then
        return refuse('wrongtype', 'INCRBYFLOAT', key)
      end
    end
  end
  if tpm_by > 0 then
    local key = KEYS[3 + nb]
    if not allowed('INCRBY', key, ARGV[5]) then return refuse('noperm', 'INCRBY', key) end
    if not allowed('EXPIRE', key, ARGV[6]) then return refuse('noperm', 'EXPIRE', key) end
    t = kind(key)
    if t == 'string' then
      local v = tonumber(redis.call('GET', key))
      if v == nil or v ~= math.floor(v) then return refuse('not_a_number', 'INCRBY', key) end
    elseif t ~= 'none' then
      return refuse('wrongtype', 'INCRBY', key)
    end
  end
  if nrows > 0 then
    if not allowed('XADD', KEYS[2], '*', ARGV[9], 'x') then return refuse('noperm', 'XADD', KEYS[2]) end
    t = kind(KEYS[2])
    if t ~= 'none' and t ~= 'stream' then return refuse('wrongtype', 'XADD', KEYS[2]) end
  end
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
end
local failed = 0
local function count(r)
  if type(r) == 'table' and r.err then failed = failed + 1 end
  return r
end
local totals = {}
for i = 1, nb do
  local key = KEYS[2 + i]
  local cost = ARGV[b0 + 2 * i - 1]
  local ttl = tonumber(ARGV[b0 + 2 * i])
  local r
  if fresh and tonumber(cost) > 0 then
    r = count(redis.pcall('INCRBYFLOAT', key, cost))
    if ttl > 0 then redis.pcall('EXPIRE', key, ttl) end
  else
    r = redis.pcall('GET', key)
  end
  if type(r) ~= 'string' then r = '0' end
  totals[i] = r
end
if fresh and tpm_by > 0 then
  local key = KEYS[3 + nb]
  count(redis.pcall('INCRBY', key, ARGV[5]))
  redis.pcall('EXPIRE', key, ARGV[6])
end
if fresh and nrows > 0 then
  local r0 = b0 + 2 * nb
  local maxlen = tonumber(ARGV[3])
  for r = 0, nrows - 1 do
    local args = {'XADD', KEYS[2]}
    if maxlen > 0 then
      args[#args + 1] = 'MAXLEN'
      args[#args + 1] = '~'
      args[#args + 1] = ARGV[3]
    end
    args[#args + 1] = '*'
    for f = 1, nf do
      args[#args + 1] = ARGV[8 + f]
      args[#args + 1] = ARGV[r0 + r * nf + f]
    end
    count(redis.pcall(unpack(args)))
  end
end
return {failed, totals}
"#;

/// Server error codes that a later retry can succeed past: the flush
/// script's own refusal (`NOTAPPLIED`: nothing was written), a cluster's
/// redirections and failovers, a loading, busy, read-only or full server, one that cannot persist (`MISCONF`) or
/// lacks its replicas (`NOREPLICAS`), a user whose rights or login changed
/// (`NOPERM`, `NOAUTH`). Any other error rejects the write.
const TRANSIENT_ERRORS: [&str; 15] = [
    "NOTAPPLIED",
    "LOADING",
    "BUSY",
    "TRYAGAIN",
    // A cluster's redirections the client could not follow within its
    // retries (a failover in progress): the slot's owner answers later.
    "MOVED",
    "ASK",
    "MASTERDOWN",
    "READONLY",
    "OOM",
    "CLUSTERDOWN",
    "NOSCRIPT",
    "MISCONF",
    "NOREPLICAS",
    "NOPERM",
    "NOAUTH",
];

/// Whether a write refused with `code` and `message` may succeed later.
/// Redis 6 reports an error raised inside a script as `ERR Error running
/// script … -READONLY …`: the code that matters is inside the message.
fn transient(code: &str, message: &str) -> bool {
    TRANSIENT_ERRORS.contains(&code)
        || (code == "ERR"
            && TRANSIENT_ERRORS
                .iter()
                .any(|t| message.contains(&format!("-{t} "))))
}

pub struct RedisStore {
    conn: RedisConn,
    prefix: String,
    timeout: Duration,
    script: Script,
    /// Replicas that must confirm each write (`[store] replica_acks`).
    acks: u32,
}

/// How long a write waits for its replicas' confirmation (`WAIT`).
pub const REPLICA_ACK_TIMEOUT: Duration = Duration::from_millis(250);

impl std::fmt::Debug for RedisStore {
    // The URL may carry a password: never print the connection.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("endpoint", &self.conn.endpoint())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on `url` under `prefix` ([`super::DEFAULT_PREFIX`] in
    /// production). Does not connect; must be called inside a Tokio runtime.
    pub fn new(url: &str, prefix: &str) -> Result<Self, StoreError> {
        Ok(Self::with_conn(RedisConn::new(url, None)?, prefix))
    }

    /// A store on a shared connection.
    pub fn with_conn(conn: RedisConn, prefix: &str) -> Self {
        Self {
            conn,
            prefix: prefix.to_string(),
            timeout: CALL_TIMEOUT,
            script: Script::new(FLUSH_SCRIPT),
            acks: 0,
        }
    }

    /// Each write confirmed by `acks` replicas (`WAIT`) before it counts as
    /// written; one not confirmed is an error, kept by the outbox and
    /// replayed (applied once: its write mark).
    pub fn with_replica_acks(mut self, acks: u32) -> Self {
        self.acks = acks;
        self
    }

    /// Err unless `reply` (a `WAIT`'s) counts at least the replicas asked.
    fn confirmed(&self, op: &'static str, reply: &Value) -> Result<(), StoreError> {
        let acked = int(op, reply)?;
        if acked < u64::from(self.acks) {
            return Err(StoreError::Reply {
                op,
                message: format!(
                    "{acked} of {} replicas confirmed the write within {REPLICA_ACK_TIMEOUT:?}",
                    self.acks
                ),
            });
        }
        Ok(())
    }

    /// The key names for the connection's topology (tagged in a cluster).
    pub fn names(&self) -> KeyNames {
        KeyNames::with_tags(self.prefix.clone(), self.conn.tagged())
    }

    async fn admit_inner(&self, q: &AdmitQuery) -> Result<AdmitCounts, StoreError> {
        const OP: &str = "admit";
        let names = self.names();
        let (minute, _) = window_position(q.now);
        let key = q.key_id.as_str();
        let mut g = Grouped::new(names.tagged());
        let cur = names.rpm(key, minute);
        let get = |k: String| redis::cmd("GET").arg(k).to_owned();
        match q.rpm {
            RpmWindow::Skip => {}
            RpmWindow::Read => {
                g.keep(key, get(cur));
            }
            RpmWindow::Count => {
                g.keep(key, redis::cmd("INCR").arg(&cur).to_owned()).ignore(
                    key,
                    redis::cmd("EXPIRE")
                        .arg(&cur)
                        .arg(WINDOW_TTL.as_secs())
                        .to_owned(),
                );
            }
        }
        if q.rpm != RpmWindow::Skip {
            g.keep(key, get(names.rpm(key, minute.wrapping_sub(1))));
        }
        if q.read_tpm {
            g.keep(key, get(names.tpm(key, minute)))
                .keep(key, get(names.tpm(key, minute.wrapping_sub(1))));
        }
        for b in &q.budgets {
            g.keep(&b.id, get(names.budget(b, q.now)));
        }
        let replies = g.run(&self.conn.get(), OP, self.timeout).await?;
        let mut it = replies.iter();
        let mut next = || {
            it.next().ok_or_else(|| StoreError::Reply {
                op: OP,
                message: "fewer replies than commands".into(),
            })
        };
        let rpm = if q.rpm != RpmWindow::Skip {
            let current = int(OP, next()?)?;
            let previous = int(OP, next()?)?;
            Some(WindowCounts { previous, current })
        } else {
            None
        };
        let tpm = if q.read_tpm {
            let current = int(OP, next()?)?;
            let previous = int(OP, next()?)?;
            Some(WindowCounts { previous, current })
        } else {
            None
        };
        let mut budgets = Vec::with_capacity(q.budgets.len());
        for _ in &q.budgets {
            budgets.push(float(OP, next()?)?);
        }
        Ok(AdmitCounts { rpm, tpm, budgets })
    }

    /// One script call (EVALSHA, loading the script on `NOSCRIPT`), and
    /// with `replica_acks` its replicas' confirmation.
    async fn invoke(
        &self,
        op: &'static str,
        part: &Part,
        timeout: Duration,
    ) -> Result<Value, StoreError> {
        let call = async {
            if self.acks == 0 {
                let mut inv = self.script.prepare_invoke();
                for k in &part.keys {
                    inv.key(k);
                }
                for a in &part.args {
                    inv.arg(a);
                }
                return inv
                    .invoke_async::<Value>(&mut self.conn.get())
                    .await
                    .map_err(|source| StoreError::Redis { op, source });
            }
            self.invoke_confirmed(op, part).await
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout { op, after: timeout }),
        }
    }

    /// `EVALSHA` then `WAIT` in one pipeline (so on the write's node in a
    /// cluster), the script loaded first if the server lacks it.
    async fn invoke_confirmed(&self, op: &'static str, part: &Part) -> Result<Value, StoreError> {
        let redis_err = |source| StoreError::Redis { op, source };
        let mut conn = self.conn.get();
        for _ in 0..2 {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            pipe.cmd("EVALSHA")
                .arg(self.script.get_hash())
                .arg(part.keys.len())
                .arg(&part.keys)
                .arg(&part.args);
            pipe.cmd("WAIT")
                .arg(self.acks)
                .arg(REPLICA_ACK_TIMEOUT.as_millis() as u64);
            let replies: Vec<Value> = pipe.query_async(&mut conn).await.map_err(redis_err)?;
            let [written, acked] = replies.as_slice() else {
                return Err(StoreError::Reply {
                    op,
                    message: format!("{} replies for a write and its WAIT", replies.len()),
                });
            };
            match written {
                Value::ServerError(e) if e.code() == "NOSCRIPT" => {
                    redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(FLUSH_SCRIPT)
                        .query_async::<String>(&mut conn)
                        .await
                        .map_err(redis_err)?;
                }
                Value::ServerError(e) => return Err(redis_err(e.clone().into())),
                v => {
                    self.confirmed(op, acked)?;
                    return Ok(v.clone());
                }
            }
        }
        Err(StoreError::Reply {
            op,
            message: "the server does not keep the flush script".into(),
        })
    }

    async fn flush_inner(&self, batch: &FlushBatch) -> Result<Vec<f64>, StoreError> {
        const OP: &str = "flush";
        let parts = flush_parts::parts(&self.names(), batch);
        let replies = futures_util::future::try_join_all(
            parts.iter().map(|p| self.invoke(OP, p, self.timeout)),
        )
        .await?;
        let mut totals = vec![0.0; batch.charges.len()];
        for (part, reply) in parts.iter().zip(&replies) {
            let (failed, got) = script_reply(OP, reply)?;
            if failed > 0 {
                tracing::warn!(store = %self.conn.endpoint(), failed, "the store refused part of a flush (a metering key holds a value of another type?)");
            }
            if got.len() != part.charges.len() {
                return Err(StoreError::Reply {
                    op: OP,
                    message: format!("{} totals for {} budgets", got.len(), part.charges.len()),
                });
            }
            for (&i, t) in part.charges.iter().zip(got) {
                totals[i] = t;
            }
        }
        Ok(totals)
    }

    async fn replay_inner(&self, batches: &[&FlushBatch]) -> Result<Vec<Replayed>, StoreError> {
        if self.conn.tagged() {
            return self.replay_by_part(batches).await;
        }
        const OP: &str = "replay";
        let names = self.names();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        // Loaded in the same pipeline, so a restarted (empty) Redis knows
        // the script before the first EVALSHA.
        pipe.cmd("SCRIPT").arg("LOAD").arg(FLUSH_SCRIPT);
        for batch in batches {
            // One server: one part per batch.
            for part in flush_parts::parts(&names, batch) {
                pipe.cmd("EVALSHA")
                    .arg(self.script.get_hash())
                    .arg(part.keys.len())
                    .arg(part.keys)
                    .arg(part.args);
            }
        }
        if self.acks > 0 {
            pipe.cmd("WAIT")
                .arg(self.acks)
                .arg(REPLICA_ACK_TIMEOUT.as_millis() as u64);
        }
        let mut conn = self.conn.get();
        let mut replies =
            match tokio::time::timeout(REPLAY_TIMEOUT, pipe.query_async::<Vec<Value>>(&mut conn))
                .await
            {
                Ok(Ok(v)) => v,
                Ok(Err(source)) => return Err(StoreError::Redis { op: OP, source }),
                Err(_) => {
                    return Err(StoreError::Timeout {
                        op: OP,
                        after: REPLAY_TIMEOUT,
                    })
                }
            };
        if self.acks > 0 {
            // Every write of the round trip, confirmed or none.
            let acked = replies.pop().unwrap_or(Value::Nil);
            self.confirmed(OP, &acked)?;
        }
        if replies.len() != batches.len() + 1 {
            return Err(StoreError::Reply {
                op: OP,
                message: format!("{} replies for {} writes", replies.len(), batches.len()),
            });
        }
        let mut out = Vec::with_capacity(batches.len());
        for reply in &replies[1..] {
            match reply {
                Value::ServerError(e) => {
                    if transient(e.code(), &e.to_string()) {
                        return Err(StoreError::Reply {
                            op: OP,
                            message: e.to_string(),
                        });
                    }
                    out.push(Replayed::Rejected(e.to_string()));
                }
                other => {
                    self.applied(OP, other)?;
                    out.push(Replayed::Applied);
                }
            }
        }
        Ok(out)
    }

    /// A cluster's replay: each batch's parts in turn, each in its own slot
    /// (a part applied before is answered as a read). A batch is applied
    /// when all its parts are; a transient refusal stops the replay there.
    async fn replay_by_part(&self, batches: &[&FlushBatch]) -> Result<Vec<Replayed>, StoreError> {
        const OP: &str = "replay";
        let names = self.names();
        let deadline = tokio::time::Instant::now() + REPLAY_TIMEOUT;
        let mut out = Vec::with_capacity(batches.len());
        for batch in batches {
            let mut outcome = Replayed::Applied;
            for part in flush_parts::parts(&names, batch) {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                match self.invoke(OP, &part, left).await {
                    Ok(v) => self.applied(OP, &v)?,
                    Err(StoreError::Redis { source, .. })
                        if source.code().is_some()
                            && !transient(
                                source.code().unwrap_or_default(),
                                &source.to_string(),
                            ) =>
                    {
                        outcome = Replayed::Rejected(source.to_string());
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            out.push(outcome);
        }
        Ok(out)
    }

    fn applied(&self, op: &'static str, reply: &Value) -> Result<(), StoreError> {
        let (failed, _) = script_reply(op, reply)?;
        if failed > 0 {
            tracing::warn!(store = %self.conn.endpoint(), failed, "the store refused part of a replayed flush (a metering key holds a value of another type?)");
        }
        Ok(())
    }
}

/// The script's `{failed, {totals…}}`.
fn script_reply(op: &'static str, v: &Value) -> Result<(u64, Vec<f64>), StoreError> {
    let bad = |message: String| StoreError::Reply { op, message };
    let Value::Array(parts) = v else {
        return Err(bad(format!("not an array: {v:?}")));
    };
    let [failed, totals] = parts.as_slice() else {
        return Err(bad(format!("{} parts, expected 2", parts.len())));
    };
    let failed = int(op, failed)?;
    let totals = match totals {
        Value::Array(t) => t
            .iter()
            .map(|v| float(op, v))
            .collect::<Result<Vec<_>, _>>()?,
        Value::Nil => Vec::new(),
        other => return Err(bad(format!("totals not an array: {other:?}"))),
    };
    Ok((failed, totals))
}

fn int(op: &'static str, v: &Value) -> Result<u64, StoreError> {
    redis::from_redis_value_ref::<Option<i64>>(v)
        .map(|n| n.unwrap_or(0).max(0) as u64)
        .map_err(|e| StoreError::Reply {
            op,
            message: e.to_string(),
        })
}

fn float(op: &'static str, v: &Value) -> Result<f64, StoreError> {
    redis::from_redis_value_ref::<Option<f64>>(v)
        .map(|n| n.unwrap_or(0.0))
        .map_err(|e| StoreError::Reply {
            op,
            message: e.to_string(),
        })
}

impl Store for RedisStore {
    fn admit<'a>(&'a self, q: &'a AdmitQuery) -> StoreFuture<'a, AdmitCounts> {
        Box::pin(self.admit_inner(q))
    }

    fn unadmit<'a>(&'a self, key_id: &'a str, minute: u64) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut g = Grouped::new(false);
            g.ignore(
                key_id,
                redis::cmd("DECR")
                    .arg(self.names().rpm(key_id, minute))
                    .to_owned(),
            );
            g.run(&self.conn.get(), "unadmit", self.timeout)
                .await
                .map(|_| ())
        })
    }

    fn flush<'a>(&'a self, batch: &'a FlushBatch) -> StoreFuture<'a, Vec<f64>> {
        Box::pin(self.flush_inner(batch))
    }

    fn replay<'a>(&'a self, batches: &'a [&'a FlushBatch]) -> StoreFuture<'a, Vec<Replayed>> {
        Box::pin(self.replay_inner(batches))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let mut g = Grouped::new(false);
            g.ignore("", redis::cmd("PING"));
            g.run(&self.conn.get(), "ping", self.timeout)
                .await
                .map(|_| ())
        })
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    fn describe(&self) -> String {
        format!("redis at {}", self.conn.endpoint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BudgetPeriod;
    use crate::store::{BudgetKey, FlushId, Scope};

    /// With `replica_acks`, a write no replica confirmed is an error (the
    /// test Redis has no replica), whose replay counts it once.
    #[tokio::test]
    async fn a_write_no_replica_confirmed_is_an_error_and_counts_once_when_sent_again() {
        let Some(url) = crate::test_skip::redis_url("store::redis (a Redis-backed test)") else {
            return;
        };
        let prefix = format!("patchbay-test-{}:", crate::ids::short_id());
        let store = RedisStore::new(&url, &prefix).unwrap().with_replica_acks(1);
        let key = BudgetKey {
            scope: Scope::Key,
            id: "k1".into(),
            period: BudgetPeriod::Total,
        };
        let batch = FlushBatch {
            id: Some(FlushId {
                session_id: "s1".into(),
                seq: 1,
            }),
            now: std::time::SystemTime::now(),
            charges: vec![(key.clone(), 0.5)],
            tpm: None,
            rows: Vec::new(),
            stream_maxlen: 0,
        };
        let e = store.flush(&batch).await.unwrap_err();
        assert!(e.to_string().contains("0 of 1 replicas confirmed"), "{e}");
        assert!(store.replay(&[&batch]).await.is_err(), "still unconfirmed");
        let unconfirmed = RedisStore::new(&url, &prefix).unwrap();
        assert_eq!(
            unconfirmed.replay(&[&batch]).await.unwrap(),
            [Replayed::Applied]
        );
        assert_eq!(
            unconfirmed.flush(&batch).await.unwrap(),
            [0.5],
            "counted once"
        );
    }

    #[test]
    fn errors_a_retry_can_get_past_are_transient_even_inside_a_script_error() {
        assert!(transient(
            "NOREPLICAS",
            "Not enough good replicas to write."
        ));
        assert!(transient(
            "MISCONF",
            "Redis is configured to save RDB snapshots"
        ));
        assert!(transient("NOPERM", "this user has no permissions"));
        assert!(transient("MOVED", "5012 127.0.0.1:7002"));
        assert!(transient("ASK", "5012 127.0.0.1:7002"));
        // Redis 6: the code of a call inside a script is in the message.
        assert!(transient(
            "ERR",
            "Error running script (call to f_1): @user_script:76: @user_script: 76: \
             -READONLY You can't write against a read only replica."
        ));
        assert!(!transient(
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value"
        ));
        assert!(!transient(
            "ERR",
            "Error running script: attempt to compare nil with number"
        ));
    }
}
