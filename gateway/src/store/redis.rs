//! The Redis store: counters shared by every gateway instance pointed at the
//! same Redis, through one redis-rs [`ConnectionManager`] per process
//! (a multiplexed connection that reconnects on its own).
//!
//! Each [`Store`] call is one pipeline (one round trip):
//! - admit: `INCR` + `EXPIRE` the rpm minute, `GET` the previous minute,
//!   `GET` both tpm minutes, `GET` each budget counter;
//! - flush: `XADD {prefix}request_logs MAXLEN ~ n * field value …` per row,
//!   `INCRBYFLOAT` + `EXPIRE` per charged budget (a plain `GET` when the
//!   window cost nothing), `INCRBY` + `EXPIRE` on the tpm minute. The
//!   `INCRBYFLOAT` replies are the budget re-read, so spending and checking
//!   cost one round trip.
//!
//! The pipeline is not a `MULTI`: nothing needs the commands to be atomic
//! together, and each counter update is atomic on its own.
//!
//! Failure handling: every call is bounded by [`CALL_TIMEOUT`] here, on top
//! of the manager's own connect and response timeouts, and errors are
//! returned, never retried: the caller fails open and the meter carries the
//! unsent charge to its next flush. The manager is created lazily, so a
//! gateway starts (and admits, failing open) while Redis is down, and
//! reconnects when Redis returns; the first call after an outage can still
//! fail while the new connection is made.
//!
//! Not supported: Redis Cluster (keys of one call span hash slots).

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Pipeline, Value};

use super::{
    period_ttl, window_position, AdmitCounts, AdmitQuery, FlushBatch, KeyNames, Store, StoreError,
    StoreFuture, WindowCounts, CALL_TIMEOUT, WINDOW_TTL,
};

/// Bound on one connection attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Reconnect attempts per outage detection; the next call tries again.
const RECONNECT_RETRIES: usize = 1;
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(50);

pub struct RedisStore {
    conn: ConnectionManager,
    names: KeyNames,
    timeout: Duration,
}

impl std::fmt::Debug for RedisStore {
    // The URL may carry a password: never print the connection.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on `url` under `prefix` ([`super::DEFAULT_PREFIX`] in
    /// production). Does not connect; must be called inside a Tokio runtime.
    pub fn new(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(StoreError::Url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(CALL_TIMEOUT))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(RECONNECT_MIN_DELAY)
            .set_max_delay(CONNECT_TIMEOUT);
        let conn =
            ConnectionManager::new_lazy_with_config(client, config).map_err(StoreError::Url)?;
        Ok(Self {
            conn,
            names: KeyNames::new(prefix),
            timeout: CALL_TIMEOUT,
        })
    }

    async fn run(&self, op: &'static str, pipe: &Pipeline) -> Result<Vec<Value>, StoreError> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.timeout, pipe.query_async::<Vec<Value>>(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(StoreError::Redis { op, source }),
            Err(_) => Err(StoreError::Timeout {
                op,
                after: self.timeout,
            }),
        }
    }

    async fn admit_inner(&self, q: &AdmitQuery) -> Result<AdmitCounts, StoreError> {
        const OP: &str = "admit";
        let (minute, _) = window_position(q.now);
        let mut pipe = redis::pipe();
        if q.count_request {
            let cur = self.names.rpm(&q.key_id, minute);
            pipe.incr(&cur, 1)
                .expire(&cur, WINDOW_TTL.as_secs() as i64)
                .ignore()
                .get(self.names.rpm(&q.key_id, minute.wrapping_sub(1)));
        }
        if q.read_tpm {
            pipe.get(self.names.tpm(&q.key_id, minute))
                .get(self.names.tpm(&q.key_id, minute.wrapping_sub(1)));
        }
        for b in &q.budgets {
            pipe.get(self.names.budget(b, q.now));
        }
        let replies = self.run(OP, &pipe).await?;
        let mut it = replies.iter();
        let mut next = || {
            it.next().ok_or_else(|| StoreError::Reply {
                op: OP,
                message: "fewer replies than commands".into(),
            })
        };
        let rpm = if q.count_request {
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

    async fn flush_inner(&self, batch: &FlushBatch) -> Result<Vec<f64>, StoreError> {
        const OP: &str = "flush";
        let mut pipe = redis::pipe();
        let stream = self.names.request_logs();
        for row in &batch.rows {
            let cmd = pipe.cmd("XADD").arg(&stream);
            if batch.stream_maxlen > 0 {
                cmd.arg("MAXLEN").arg("~").arg(batch.stream_maxlen);
            }
            cmd.arg("*");
            for (field, value) in row.stream_fields() {
                cmd.arg(field).arg(value);
            }
            cmd.ignore();
        }
        for (b, cost) in &batch.charges {
            let key = self.names.budget(b, batch.now);
            if *cost > 0.0 {
                pipe.cmd("INCRBYFLOAT").arg(&key).arg(*cost);
                if let Some(ttl) = period_ttl(b.period, batch.now) {
                    pipe.expire(&key, ttl.as_secs() as i64).ignore();
                }
            } else {
                pipe.get(&key);
            }
        }
        if let Some((key_id, tokens)) = &batch.tpm {
            let (minute, _) = window_position(batch.now);
            let key = self.names.tpm(key_id, minute);
            // Redis integers are i64; the meter caps an increment far
            // below that (`MAX_TPM_INCREMENT`).
            let by = i64::try_from(*tokens).unwrap_or(i64::MAX);
            pipe.incr(&key, by)
                .ignore()
                .expire(&key, WINDOW_TTL.as_secs() as i64)
                .ignore();
        }
        let replies = self.run(OP, &pipe).await?;
        if replies.len() != batch.charges.len() {
            return Err(StoreError::Reply {
                op: OP,
                message: format!(
                    "{} replies for {} budgets",
                    replies.len(),
                    batch.charges.len()
                ),
            });
        }
        replies.iter().map(|v| float(OP, v)).collect()
    }
}

/// A lazily connecting [`ConnectionManager`] on `url` with the same bounds
/// as the store's (connect and response timeouts, one reconnect attempt per
/// failure), for other Redis users in the process (session leases).
pub fn connection_manager(url: &str) -> Result<ConnectionManager, StoreError> {
    let client = redis::Client::open(url).map_err(StoreError::Url)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(CALL_TIMEOUT))
        .set_number_of_retries(RECONNECT_RETRIES)
        .set_min_delay(RECONNECT_MIN_DELAY)
        .set_max_delay(CONNECT_TIMEOUT);
    ConnectionManager::new_lazy_with_config(client, config).map_err(StoreError::Url)
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
            let mut pipe = redis::pipe();
            pipe.decr(self.names.rpm(key_id, minute), 1).ignore();
            self.run("unadmit", &pipe).await.map(|_| ())
        })
    }

    fn flush<'a>(&'a self, batch: &'a FlushBatch) -> StoreFuture<'a, Vec<f64>> {
        Box::pin(self.flush_inner(batch))
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}
