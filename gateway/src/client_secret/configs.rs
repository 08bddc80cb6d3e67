//! Where a minted session config waits until its secret expires: Redis when
//! the gateway has a store URL (so a secret minted on one replica opens a
//! configured session on any other), process memory otherwise.
//!
//! Keys: `{prefix}client_secret:{secret id}` → the config's JSON text, with
//! a TTL equal to the secret's remaining life, so the entry never outlives
//! what it configures. A secret whose entry is gone (expired, Redis
//! flushed, or minted by a process with a memory store) is refused by the
//! caller: a session is never opened without its minted config.
//!
//! Every call is bounded by [`CALL_TIMEOUT`]. Unlike the metering counters
//! there is no fail-open here: minting fails (503) when the config cannot be
//! stored, and connecting fails (503) when it cannot be read.
//!
//! Caveats: the memory map holds at most [`MAX_MEMORY_CONFIGS`] live entries
//! and [`MAX_MEMORY_CONFIG_BYTES`] of config text (further mints get 503
//! until some expire), swept of expired ones every
//! [`SWEEP_EVERY_PUTS`] puts. The Redis connection is this module's own
//! (the process's shared connection on the `[store]` URL: its TLS settings
//! and reconnects apply here too).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::store::{StoreError, CALL_TIMEOUT};

/// Live entries the memory map holds at most.
pub const MAX_MEMORY_CONFIGS: usize = 100_000;
/// Config text the memory map holds at most, in bytes.
pub const MAX_MEMORY_CONFIG_BYTES: usize = 64 << 20;
/// Puts between sweeps of expired memory entries.
pub const SWEEP_EVERY_PUTS: u64 = 256;

pub enum SessionConfigs {
    Memory(Mutex<MemoryConfigs>),
    Redis {
        conn: crate::store::conn::RedisConn,
        prefix: String,
    },
}

#[derive(Debug, Default)]
pub struct MemoryConfigs {
    entries: HashMap<String, (String, Instant)>,
    /// Bytes of config text in `entries`.
    bytes: usize,
    puts: u64,
}

impl MemoryConfigs {
    /// Stores `config` until `now + ttl`; `false` when full.
    fn put_at(&mut self, id: &str, config: &str, ttl: Duration, now: Instant) -> bool {
        self.puts += 1;
        let full = |m: &Self| {
            m.entries.len() >= MAX_MEMORY_CONFIGS
                || m.bytes + config.len() > MAX_MEMORY_CONFIG_BYTES
        };
        if self.puts.is_multiple_of(SWEEP_EVERY_PUTS) || full(self) {
            self.entries.retain(|_, (_, exp)| *exp > now);
            self.bytes = self.entries.values().map(|(c, _)| c.len()).sum();
        }
        if full(self) {
            return false;
        }
        self.bytes += config.len();
        if let Some((old, _)) = self
            .entries
            .insert(id.to_string(), (config.to_string(), now + ttl))
        {
            self.bytes -= old.len();
        }
        true
    }

    fn get_at(&self, id: &str, now: Instant) -> Option<String> {
        match self.entries.get(id) {
            Some((c, exp)) if *exp > now => Some(c.clone()),
            _ => None,
        }
    }
}

impl std::fmt::Debug for SessionConfigs {
    // The Redis URL may carry a password: never print the connection.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

impl SessionConfigs {
    pub fn memory() -> Self {
        Self::Memory(Mutex::default())
    }

    /// A Redis-backed map under `prefix`; does not connect until first use.
    /// Must be called inside a Tokio runtime.
    pub fn redis(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let conn = crate::store::conn::RedisConn::new(url, None)?;
        Ok(Self::on(conn, prefix))
    }

    /// A Redis-backed map on the process's shared connection (the store's
    /// URL, TLS settings and reconnects).
    pub fn on(conn: crate::store::conn::RedisConn, prefix: &str) -> Self {
        Self::Redis {
            conn,
            prefix: prefix.to_string(),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Redis { .. } => "redis",
        }
    }

    /// Stores `config` under `id` for `ttl`. `Ok(false)`: the memory map is
    /// full.
    pub async fn put(&self, id: &str, config: &str, ttl: Duration) -> Result<bool, StoreError> {
        match self {
            Self::Memory(m) => {
                let mut m = m.lock().unwrap_or_else(|p| p.into_inner());
                Ok(m.put_at(id, config, ttl, Instant::now()))
            }
            Self::Redis { conn, prefix } => {
                let mut pipe = redis::pipe();
                pipe.cmd("SET")
                    .arg(key(conn, prefix, id))
                    .arg(config)
                    .arg("PX")
                    .arg(ttl.as_millis().max(1) as u64)
                    .ignore();
                run(conn, "client secret put", &pipe).await.map(|_| true)
            }
        }
    }

    /// The config stored under `id`, if it is still there.
    pub async fn get(&self, id: &str) -> Result<Option<String>, StoreError> {
        match self {
            Self::Memory(m) => {
                let m = m.lock().unwrap_or_else(|p| p.into_inner());
                Ok(m.get_at(id, Instant::now()))
            }
            Self::Redis { conn, prefix } => {
                let mut pipe = redis::pipe();
                pipe.get(key(conn, prefix, id));
                let replies = run(conn, "client secret get", &pipe).await?;
                let first = replies.first().ok_or_else(|| StoreError::Reply {
                    op: "client secret get",
                    message: "no reply".into(),
                })?;
                redis::from_redis_value_ref::<Option<String>>(first).map_err(|e| {
                    StoreError::Reply {
                        op: "client secret get",
                        message: e.to_string(),
                    }
                })
            }
        }
    }
}

/// In a cluster the id is the key's hash tag, as every key's scope id is.
fn key(conn: &crate::store::conn::RedisConn, prefix: &str, id: &str) -> String {
    if conn.tagged() {
        format!("{prefix}client_secret:{{{id}}}")
    } else {
        format!("{prefix}client_secret:{id}")
    }
}

async fn run(
    conn: &crate::store::conn::RedisConn,
    op: &'static str,
    pipe: &redis::Pipeline,
) -> Result<Vec<redis::Value>, StoreError> {
    let mut conn = conn.get();
    match tokio::time::timeout(
        CALL_TIMEOUT,
        pipe.query_async::<Vec<redis::Value>>(&mut conn),
    )
    .await
    {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(StoreError::Redis { op, source }),
        Err(_) => Err(StoreError::Timeout {
            op,
            after: CALL_TIMEOUT,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_entries_expire_with_their_secret() {
        let mut m = MemoryConfigs::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        assert!(m.put_at("a", "{}", ttl, t0));
        assert_eq!(m.get_at("a", t0).as_deref(), Some("{}"));
        assert_eq!(m.get_at("b", t0), None);
        assert_eq!(
            m.get_at("a", t0 + ttl - Duration::from_millis(1))
                .as_deref(),
            Some("{}")
        );
        assert_eq!(m.get_at("a", t0 + ttl), None);
    }

    #[test]
    fn a_full_memory_map_refuses_until_entries_expire() {
        let mut m = MemoryConfigs::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        for i in 0..MAX_MEMORY_CONFIGS {
            assert!(m.put_at(&i.to_string(), "{}", ttl, t0));
        }
        assert!(!m.put_at("one-more", "{}", ttl, t0));
        // Once they expired, the sweep makes room.
        assert!(m.put_at("one-more", "{}", ttl, t0 + ttl));
        assert_eq!(m.entries.len(), 1);
        assert_eq!(m.bytes, 2);
    }

    #[test]
    fn the_memory_map_is_bounded_in_bytes_too() {
        let mut m = MemoryConfigs::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        let big = "x".repeat(MAX_MEMORY_CONFIG_BYTES / 4);
        for i in 0..4 {
            assert!(m.put_at(&i.to_string(), &big, ttl, t0));
        }
        assert!(!m.put_at("4", "y", ttl, t0));
        assert!(m.put_at("4", "y", ttl, t0 + ttl));
        assert_eq!(m.bytes, 1);
    }

    #[tokio::test]
    async fn the_memory_map_serves_what_it_stored() {
        let c = SessionConfigs::memory();
        assert!(c.put("a", "{}", Duration::from_secs(10)).await.unwrap());
        assert_eq!(c.get("a").await.unwrap().as_deref(), Some("{}"));
    }

    #[tokio::test]
    async fn redis_entries_are_shared_and_expire() {
        let Some(url) = crate::test_skip::redis_url("redis_entries_are_shared_and_expire") else {
            return;
        };
        let prefix = format!("test-{}:", crate::ids::short_id());
        let a = SessionConfigs::redis(&url, &prefix).unwrap();
        let b = SessionConfigs::redis(&url, &prefix).unwrap();
        assert!(a
            .put("x", r#"{"instructions":"hi"}"#, Duration::from_millis(300))
            .await
            .unwrap());
        assert_eq!(
            b.get("x").await.unwrap().as_deref(),
            Some(r#"{"instructions":"hi"}"#)
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while b.get("x").await.unwrap().is_some() {
            assert!(std::time::Instant::now() < deadline, "never expired");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
