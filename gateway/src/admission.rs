//! Admission: the ordered checks an upgrade passes before anything is
//! dialled, and the OpenAI-style JSON refusal each failure becomes.
//!
//! Order (first failure wins), after the server's own checks (upgrade,
//! credential, `?model=` missing 400 / unknown 404): the key's model
//! allow-list → 403 `model_not_allowed` (nothing is counted before it);
//! draining → 503; process session cap → 429; per-key session cap → 429;
//! then the store-backed checks in [`crate::metering`] (rpm, tpm, budgets,
//! unpriced). A [`Permit`] is the admitted session's hold on the counters;
//! dropping it (however the session ends) releases them, so a panic or a
//! cancelled task cannot leak a slot. A session releases it earlier, once
//! its client is gone ([`Permit::release`]), while its upstream leg may
//! still be cancelling and metering.
//!
//! The process cap is always per process: it protects a pod's memory. A
//! key's cap is per process without Redis; with Redis it is counted across
//! the fleet by session leases ([`crate::store::leases`]), which a dead pod
//! cannot leak for longer than the lease TTL. When Redis does not answer,
//! the key's cap falls back to this process's count ([`fallback_admits`]),
//! failing open like the rest of admission.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use prometheus_client::metrics::gauge::Gauge;

use crate::store::leases::Lease;

/// Seconds a client is told to wait after a session-cap refusal.
pub const SESSION_CAP_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Why an upgrade was refused, carrying what the client needs to know.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub status: StatusCode,
    /// OpenAI error `type`.
    pub kind: &'static str,
    /// OpenAI error `code`; also the `reason` label of the refusal metric.
    pub code: &'static str,
    pub message: String,
    pub retry_after: Option<Duration>,
    /// OpenAI error `param`: the request field at fault, if one is.
    pub param: Option<String>,
}

impl Refusal {
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            code,
            message: message.into(),
            retry_after: None,
            param: None,
        }
    }

    /// Names the request field at fault (`param`); empty means none.
    pub fn with_param(mut self, param: &str) -> Self {
        self.param = (!param.is_empty()).then(|| param.to_string());
        self
    }

    pub fn retry_after(mut self, d: Duration) -> Self {
        self.retry_after = Some(d);
        self
    }

    pub fn draining() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "shutting_down",
            "this gateway is shutting down; reconnect to another instance",
        )
        .retry_after(Duration::from_secs(1))
    }

    /// 429 for a full session cap (the process's or a key's).
    pub fn session_cap(message: String) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "too_many_sessions",
            message,
        )
        .retry_after(SESSION_CAP_RETRY_AFTER)
    }

    /// 403 for a model outside the key's (and its team's) allow-list. The
    /// message names the model, never the key.
    pub fn model_not_allowed(model: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            "model_not_allowed",
            format!("this API key is not allowed to use the model '{model}'"),
        )
    }

    /// 400 for a client of the retired Realtime beta on a GA route: the
    /// upstream no longer speaks its dialect, so nothing is dialled.
    pub fn beta_retired(path: &str) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "beta_protocol_retired",
            format!(
                "the Realtime beta protocol (OpenAI-Beta: realtime=v1, subprotocol openai-beta.realtime-v1) was retired on 2026-05-12 and this route speaks the GA protocol: connect to {path} without the beta header or subprotocol (Python SDK: client.realtime.connect, not client.beta.realtime.connect)"
            ),
        )
    }

    /// 429 for a key at its session cap; `fleet` when the count spans every
    /// gateway sharing the store.
    pub fn key_session_cap(key_id: &str, cap: usize, fleet: bool) -> Self {
        let scope = if fleet { " across all gateways" } else { "" };
        Self::session_cap(format!(
            "key '{key_id}' is at its limit of {cap} concurrent sessions{scope}"
        ))
    }

    pub fn unauthorized(message: &str) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            message,
        )
    }

    /// The OpenAI-style body: `{"error":{"message","type","code","param"}}`.
    pub fn body(&self) -> String {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "code": self.code,
                "param": self.param,
            }
        })
        .to_string()
    }
}

/// Per-process session counters.
#[derive(Debug, Default)]
pub struct Sessions {
    active: AtomicUsize,
    per_key: Mutex<HashMap<String, usize>>,
    draining: AtomicBool,
}

/// An admitted session's hold on the counters, released on drop.
#[derive(Debug)]
pub struct Permit {
    sessions: Arc<Sessions>,
    key_id: String,
    gauge: Gauge,
    /// The session's fleet lease (Redis configured and the key capped);
    /// dropped with the permit, which ends it.
    lease: Option<Lease>,
    /// The slot was given back ([`Permit::release`]).
    released: bool,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.release();
    }
}

impl Permit {
    /// Gives the slot back and ends the lease now, before the permit is
    /// dropped (once only): a session whose client is gone frees its slot
    /// while its upstream leg is still being cancelled and metered.
    pub fn release(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        self.lease = None;
        self.sessions.active.fetch_sub(1, Ordering::AcqRel);
        self.gauge.dec();
        let mut per_key = lock(&self.sessions.per_key);
        if let Some(n) = per_key.get_mut(&self.key_id) {
            *n -= 1;
            if *n == 0 {
                per_key.remove(&self.key_id);
            }
        }
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Makes the session's fleet lease live and die with this permit.
    pub fn hold_lease(&mut self, lease: Lease) {
        self.lease = Some(lease);
    }

    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// Takes the lease out (to [`Lease::hand_off`] it to another gateway);
    /// the permit's process counters are unaffected.
    pub fn take_lease(&mut self) -> Option<Lease> {
        self.lease.take()
    }
}

/// Whether a capped key may open one more session when the fleet count is
/// unavailable (Redis unreachable): this process's count, which already
/// includes the session being admitted, must stay within the cap.
pub fn fallback_admits(cap: usize, local_including_this: usize) -> bool {
    local_including_this <= cap
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sessions {
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub fn key_active(&self, key_id: &str) -> usize {
        lock(&self.per_key).get(key_id).copied().unwrap_or(0)
    }

    /// The local checks, in order; on success the session holds a slot.
    pub fn admit(
        self: &Arc<Self>,
        max_sessions: usize,
        key_id: &str,
        key_max_sessions: Option<usize>,
        gauge: Gauge,
    ) -> Result<Permit, Refusal> {
        if self.is_draining() {
            return Err(Refusal::draining());
        }
        // Reserve the process slot first, then give it back on a refusal.
        let previous = self.active.fetch_add(1, Ordering::AcqRel);
        if previous >= max_sessions {
            self.active.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::session_cap(format!(
                "this gateway instance is at its limit of {max_sessions} concurrent sessions"
            )));
        }
        let mut per_key = lock(&self.per_key);
        let n = per_key.entry(key_id.to_string()).or_insert(0);
        if let Some(cap) = key_max_sessions {
            if *n >= cap {
                if *n == 0 {
                    per_key.remove(key_id);
                }
                drop(per_key);
                self.active.fetch_sub(1, Ordering::AcqRel);
                return Err(Refusal::key_session_cap(key_id, cap, false));
            }
        }
        *n += 1;
        drop(per_key);
        gauge.inc();
        Ok(Permit {
            sessions: self.clone(),
            key_id: key_id.to_string(),
            gauge,
            lease: None,
            released: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_cap_refuses_with_429_and_retry_after_and_frees_on_drop() {
        let s = Arc::new(Sessions::default());
        let g = Gauge::default();
        let a = s.admit(2, "k", None, g.clone()).unwrap();
        let _b = s.admit(2, "k", None, g.clone()).unwrap();
        let r = s.admit(2, "k", None, g.clone()).unwrap_err();
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(r.retry_after.is_some());
        assert_eq!(s.active(), 2);
        assert_eq!(g.get(), 2);
        drop(a);
        assert_eq!(s.active(), 1);
        assert!(s.admit(2, "k", None, g.clone()).is_ok());
    }

    #[test]
    fn a_released_permit_frees_its_slots_once_and_its_drop_frees_nothing_more() {
        let s = Arc::new(Sessions::default());
        let g = Gauge::default();
        let mut a = s.admit(10, "k", Some(1), g.clone()).unwrap();
        let _b = s.admit(10, "other", None, g.clone()).unwrap();
        a.release();
        a.release();
        assert_eq!((s.active(), s.key_active("k"), g.get()), (1, 0, 1));
        let c = s.admit(10, "k", Some(1), g.clone()).unwrap();
        drop(a);
        assert_eq!((s.active(), s.key_active("k"), g.get()), (2, 1, 2));
        drop(c);
        assert_eq!((s.active(), s.key_active("k"), g.get()), (1, 0, 1));
    }

    #[test]
    fn per_key_cap_applies_to_that_key_only() {
        let s = Arc::new(Sessions::default());
        let g = Gauge::default();
        let _a = s.admit(10, "a", Some(1), g.clone()).unwrap();
        let r = s.admit(10, "a", Some(1), g.clone()).unwrap_err();
        assert!(r.message.contains("key 'a'"), "{}", r.message);
        assert_eq!(
            s.active(),
            1,
            "a refused key must give its process slot back"
        );
        assert!(s.admit(10, "b", Some(1), g.clone()).is_ok());
    }

    #[test]
    fn draining_refuses_with_503_first() {
        let s = Arc::new(Sessions::default());
        s.start_draining();
        let r = s.admit(10, "a", None, Gauge::default()).unwrap_err();
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(s.active(), 0);
    }

    #[test]
    fn fallback_admits_up_to_the_cap_counting_the_new_session() {
        for cap in 0..5 {
            for local in 1..8 {
                assert_eq!(fallback_admits(cap, local), local <= cap, "{cap} {local}");
            }
        }
    }

    #[test]
    fn model_not_allowed_is_a_403_naming_the_model() {
        let r = Refusal::model_not_allowed("gpt-realtime-mini");
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        assert!(r.retry_after.is_none());
        let body: serde_json::Value = serde_json::from_str(&r.body()).unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], "model_not_allowed");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'gpt-realtime-mini'"));
    }

    #[test]
    fn refusal_body_is_openai_shaped() {
        let body: serde_json::Value =
            serde_json::from_str(&Refusal::unauthorized("bad key").body()).unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], "invalid_api_key");
        assert_eq!(body["error"]["message"], "bad key");
        assert!(body["error"]["param"].is_null());
    }
}
