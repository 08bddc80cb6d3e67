//! Calls known to the simulator (WebRTC, SIP and WebRTC translation calls)
//! and what was asked of them: created, accepted, hung up. The HTTP surface
//! over them is [`crate::calls_api`]; sidebands attach through
//! [`SimCalls::attach`]. A translation call is billed by the upstream for
//! its audio, which on WebRTC streams for as long as the call is up:
//! [`SimCalls::connected_secs`] is what the simulated upstream would bill.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::wire::short_id;

/// WebRTC or SIP, a WebRTC translation call, or a Live WebRTC session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    Webrtc,
    Sip,
    /// `POST /v1/realtime/translations/calls`; its sideband is a translation
    /// session (`/v1/realtime/translations?call_id=`).
    Translation,
    /// `POST /v1/live/sessions` (a GPT-Live WebRTC session, or a fork); its
    /// sideband is `/v1/live/sessions/{id}/attach` ([`crate::live_webrtc`]).
    Live,
}

#[derive(Debug)]
pub(crate) struct SimCall {
    pub(crate) kind: CallKind,
    pub(crate) accepted: bool,
    pub(crate) ended: CancellationToken,
    pub(crate) turns_done: usize,
    /// The session's model (a translation call's `session.model`).
    pub(crate) model: Option<String>,
    pub(crate) created_at: Instant,
    pub(crate) ended_at: Option<Instant>,
    /// A Live session on its primary WebSocket ([`crate::live`]): that
    /// connection bills it, not its end here.
    pub(crate) primary: bool,
}

impl SimCall {
    pub(crate) fn new(kind: CallKind, accepted: bool, model: Option<String>) -> Self {
        Self {
            kind,
            accepted,
            ended: CancellationToken::new(),
            turns_done: 0,
            model,
            created_at: Instant::now(),
            ended_at: None,
            primary: false,
        }
    }

    /// Ends the call (its sidebands close); the first end counts.
    pub(crate) fn end(&mut self) {
        if self.ended_at.is_none() {
            self.ended_at = Some(Instant::now());
        }
        self.ended.cancel();
    }
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
        lock(&self.calls).insert(id.clone(), SimCall::new(CallKind::Sip, false, None));
        id
    }

    /// How long a call has been connected (until its end, or now): what the
    /// simulated upstream bills a WebRTC translation call.
    pub fn connected_secs(&self, call_id: &str) -> Option<f64> {
        let calls = lock(&self.calls);
        let c = calls.get(call_id)?;
        let end = c.ended_at.unwrap_or_else(Instant::now);
        Some(end.saturating_duration_since(c.created_at).as_secs_f64())
    }

    /// Ends a call as its session closing does (`session.close`).
    pub(crate) fn end(&self, call_id: &str) {
        if let Some(c) = lock(&self.calls).get_mut(call_id) {
            c.end();
        }
    }

    /// Registers a Live WebSocket session under its id, so that its
    /// sidebands attach, its forks find its model and its hangup ends it
    /// (`resources/live/sideband.py`, `forks.py`, `sessions.py` take any
    /// Live session id); its primary connection bills it.
    pub(crate) fn primary_started(&self, id: &str, model: String) -> CancellationToken {
        let mut call = SimCall::new(CallKind::Live, true, Some(model));
        call.primary = true;
        let ended = call.ended.clone();
        lock(&self.calls).insert(id.to_string(), call);
        ended
    }

    /// Whether the call has been hung up or rejected.
    pub fn ended(&self, call_id: &str) -> bool {
        lock(&self.calls)
            .get(call_id)
            .is_some_and(|c| c.ended.is_cancelled())
    }

    /// The token a sideband for `call_id` watches, and the call's model,
    /// when the call is live (created over WebRTC, or a SIP call that was
    /// accepted) and of the endpoint the sideband is at: a translation
    /// call's at `/v1/realtime/translations`, every other at `/v1/realtime`.
    pub(crate) fn attach(
        &self,
        call_id: &str,
        translation: bool,
    ) -> Option<(CancellationToken, Option<String>)> {
        if self.refuse_sidebands.load(Ordering::Relaxed) {
            return None;
        }
        let calls = lock(&self.calls);
        let c = calls.get(call_id)?;
        let live = !c.ended.is_cancelled() && (c.kind != CallKind::Sip || c.accepted);
        let here = (c.kind == CallKind::Translation) == translation && c.kind != CallKind::Live;
        (live && here).then(|| (c.ended.clone(), c.model.clone()))
    }

    /// Whether a Live session's sideband can attach: the session is up.
    /// The model of a Live WebRTC session (ended or not: a stored session
    /// can be forked).
    pub(crate) fn live_model(&self, id: &str) -> Option<String> {
        lock(&self.calls)
            .get(id)
            .filter(|c| c.kind == CallKind::Live)
            .and_then(|c| c.model.clone())
    }

    pub(crate) fn live_up(&self, id: &str) -> bool {
        if self.refuse_sidebands.load(Ordering::Relaxed) {
            return false;
        }
        lock(&self.calls)
            .get(id)
            .is_some_and(|c| c.kind == CallKind::Live && !c.ended.is_cancelled())
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
