//! Calls known to the simulator (WebRTC and SIP) and what was asked of
//! them: created, accepted, hung up. The HTTP surface over them is
//! [`crate::calls_api`]; sidebands attach through [`SimCalls::attach`].

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::wire::short_id;

/// WebRTC or SIP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    Webrtc,
    Sip,
}

#[derive(Debug)]
pub(crate) struct SimCall {
    pub(crate) kind: CallKind,
    pub(crate) accepted: bool,
    pub(crate) ended: CancellationToken,
    pub(crate) turns_done: usize,
}

/// One request against a call, as received.
#[derive(Debug, Clone, PartialEq)]
pub struct CallAction {
    pub call_id: String,
    pub action: String,
    pub body: Value,
    /// The key the request carried.
    pub key: String,
}

/// One created call, as received.
#[derive(Debug, Clone)]
pub struct CreatedCall {
    pub call_id: String,
    pub sdp: String,
    pub session: Option<Value>,
    pub key: String,
}

/// Calls known to the simulator and what was asked of them.
#[derive(Debug, Default)]
pub struct SimCalls {
    pub(crate) calls: Mutex<HashMap<String, SimCall>>,
    pub(crate) actions: Mutex<Vec<CallAction>>,
    pub(crate) created: Mutex<Vec<CreatedCall>>,
    /// While set, sideband upgrades are refused with 404 (tests).
    pub refuse_sidebands: std::sync::atomic::AtomicBool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SimCalls {
    /// Every accept/hangup/reject/refer received, in order.
    pub fn actions(&self) -> Vec<CallAction> {
        lock(&self.actions).clone()
    }

    /// Every call created over WebRTC, in order.
    pub fn created(&self) -> Vec<CreatedCall> {
        lock(&self.created).clone()
    }

    /// A phone call arrives: its id, to be accepted (as from the webhook).
    pub fn incoming_sip_call(&self) -> String {
        let id = format!("rtc_{}", short_id());
        lock(&self.calls).insert(
            id.clone(),
            SimCall {
                kind: CallKind::Sip,
                accepted: false,
                ended: CancellationToken::new(),
                turns_done: 0,
            },
        );
        id
    }

    /// Whether the call has been hung up or rejected.
    pub fn ended(&self, call_id: &str) -> bool {
        lock(&self.calls)
            .get(call_id)
            .is_some_and(|c| c.ended.is_cancelled())
    }

    /// The token a sideband for `call_id` watches, when the call is live
    /// (created over WebRTC, or a SIP call that was accepted).
    pub(crate) fn attach(&self, call_id: &str) -> Option<CancellationToken> {
        if self.refuse_sidebands.load(Ordering::Relaxed) {
            return None;
        }
        let calls = lock(&self.calls);
        let c = calls.get(call_id)?;
        let live = !c.ended.is_cancelled() && (c.kind == CallKind::Webrtc || c.accepted);
        live.then(|| c.ended.clone())
    }

    /// Takes one of the caller's turns, if any are left.
    pub(crate) fn take_turn(&self, call_id: &str, turns: usize) -> bool {
        let mut calls = lock(&self.calls);
        match calls.get_mut(call_id) {
            Some(c) if c.turns_done < turns && !c.ended.is_cancelled() => {
                c.turns_done += 1;
                true
            }
            _ => false,
        }
    }
}
