//! One call's sideband: the server-side WebSocket to the call's session,
//! metered like a WebSocket session, and the one place a call is ended.
//!
//! Guarantees:
//! - Opened with the route's upstream key right after the upstream answered
//!   the create (or the accept); every text frame goes through the same
//!   [`crate::metering::tracker::TurnTracker`] and meter as a WebSocket
//!   session, so each turn is one row (`transport` `webrtc`/`sip`,
//!   `call_id`), counted against rpm/tpm/budgets.
//! - The call is a tracked session: it holds its admission [`Permit`]
//!   (`/metrics` sessions gauge, caps, the drain's task count) until the
//!   sideband ends.
//! - When a budget runs out, the key is revoked or `max_session_secs`
//!   passes, the responses in flight are first cancelled over the sideband
//!   and their `response.done` metered ([`crate::relay::cancel_in_flight`],
//!   the billing-integrity rule of the relay), then the call is ended with
//!   `POST …/calls/{id}/hangup`, and the reason is logged.
//! - A sideband that cannot be opened ([`ATTACH_ATTEMPTS`] tries) ends the
//!   call with a hangup: a call the gateway cannot see would run unmetered
//!   and outside every budget.
//! - A hangup or reject by the client ([`Owners::client_end`]) ends the
//!   call as `client_hangup` at once, attached or not: an attach still
//!   under way is abandoned (it could only fail against the ended call),
//!   nothing more is sent upstream, and the session slot is freed.
//! - A draining gateway never ends a call (its audio does not pass through
//!   the pod): the sideband stays attached until `[drain] wait_secs` has
//!   nearly passed, then is closed without a hangup and the call is logged
//!   as let go. Turns after that are not metered by this process.
//! - A translation call (a route with `endpoint = "translations"`) reports
//!   no usage and its audio is on the call's media, not the sideband: it
//!   is billed by its connected time ([`crate::metering::call_time`]), from
//!   the start of this task (the upstream has answered) to the end computed
//!   here (after the hangup's answer when the gateway hangs up), a row per
//!   flush window.
//!
//! - A GPT-Live WebRTC session (a route with `endpoint = "live"`) attaches
//!   at `…/{id}/attach` and is metered by the cumulative seconds its
//!   `session.usage.updated` events report ([`crate::metering::live`]), its
//!   rows naming `live_session_id`. When the gateway hangs it up, the
//!   final figure is read from `session.closed` (waited for, bounded by
//!   [`relay::CLOSE_GRACE`]), else estimated. With Redis, what was charged
//!   is kept beside the call's record, raised before every window is
//!   charged ([`super::live_mark`]), so a replica that adopts the session
//!   charges only what is new, even after a kill; without Redis, a
//!   drain hangs a Live session up (it is billed by the second, and nobody
//!   would meter it after).
//!
//! Caveat: the upstream sends nothing for turns that happened before the
//! sideband attached; those are not metered.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::{SinkExt, StreamExt};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::admission::Permit;
use crate::auth::KeyEntry;
use crate::config::Endpoint;
use crate::gateway::{Gateway, Route};
use crate::metering::call_time::CallClock;
use crate::metering::live::LiveUsage;
use crate::metering::{EndReason, SessionMeta};
use crate::metrics::OutcomeLabels;
use crate::relay::{self, End, Kill, Tap};
use crate::telemetry::context::TraceParent;

use super::fleet::{CallFleet, HOLD_RENEW, RECORD_GRACE};
use super::live_mark::FleetMark;
use super::ownership::Owners;
use super::{upstream, Transport};

/// What is left of `[drain] wait_secs` when a draining gateway lets its
/// sidebands go: the sideband's close (at most [`relay::CLOSE_GRACE`]) and
/// a second for the meter's final flush.
pub const LET_GO_MARGIN: Duration = Duration::from_secs(relay::CLOSE_GRACE.as_secs() + 1);
/// Attempts at opening a sideband before the call is hung up (a call the
/// gateway cannot see would run unmetered).
pub const ATTACH_ATTEMPTS: u32 = 3;
/// Time between two attempts.
pub const ATTACH_BACKOFF: Duration = Duration::from_millis(500);
/// A sideband lost within this long of its attach dropped quickly: the next
/// attach waits (see [`Reattach`]).
pub const QUICK_DROP: Duration = Duration::from_secs(2);
/// Quick drops in a row after which the call is hung up, as when it cannot
/// be attached at all.
pub const MAX_QUICK_DROPS: u32 = 5;

/// When a lost sideband is attached again: at once after a connection that
/// lasted; after [`ATTACH_BACKOFF`] times the count of quick drops in a row
/// otherwise, so an upstream that accepts and drops at once is not dialled
/// in a tight loop; never past [`MAX_QUICK_DROPS`] in a row.
#[derive(Debug)]
struct Reattach {
    attached_at: Instant,
    quick: u32,
}

impl Reattach {
    fn new(now: Instant) -> Self {
        Self {
            attached_at: now,
            quick: 0,
        }
    }

    /// The sideband was lost at `now`: the pause before attaching again, or
    /// `None` to give up.
    fn lost(&mut self, now: Instant) -> Option<Duration> {
        if now.saturating_duration_since(self.attached_at) < QUICK_DROP {
            self.quick += 1;
        } else {
            self.quick = 0;
        }
        (self.quick <= MAX_QUICK_DROPS).then(|| ATTACH_BACKOFF * self.quick)
    }

    fn attached(&mut self, now: Instant) {
        self.attached_at = now;
    }
}

/// A call admitted and answered by the upstream.
pub struct Call {
    pub id: String,
    /// The gateway's session id for the call (rows are `<id>:<turn>`).
    pub session_id: String,
    pub transport: Transport,
    pub key: KeyEntry,
    pub client_secret_id: Option<String>,
    pub route: Arc<Route>,
    pub permit: Permit,
    pub started: Instant,
    /// The `traceparent` of the client's create or accept (telemetry on).
    pub trace: Option<TraceParent>,
}

/// Why a sideband ended.
#[derive(Debug, Clone, PartialEq)]
pub enum SidebandEnd {
    /// The upstream closed the sideband: the call is over.
    CallEnded,
    /// The sideband could not be opened.
    AttachFailed(String),
    /// The client hung up or rejected the call (the upstream answered).
    ClientHangup,
    /// The gateway ended the call (budget, key revoked).
    Killed(Kill),
    /// `max_session_secs` passed.
    MaxDuration,
    /// The gateway is draining and stopped watching the call.
    LetGo,
    /// Another replica holds the call now (this one's hold expired during a
    /// Redis outage and was claimed): it meters the call from here on.
    TakenOver,
}

impl SidebandEnd {
    /// Whether this end hangs up the call.
    pub fn hangs_up(&self) -> bool {
        matches!(self, SidebandEnd::Killed(_) | SidebandEnd::MaxDuration)
    }

    pub fn outcome(&self) -> &'static str {
        match self {
            SidebandEnd::CallEnded => "call_ended",
            SidebandEnd::ClientHangup => "client_hangup",
            SidebandEnd::AttachFailed(_) => "sideband_failed",
            SidebandEnd::Killed(k) => k.outcome,
            SidebandEnd::MaxDuration => "max_session_duration",
            SidebandEnd::LetGo => "let_go_on_drain",
            SidebandEnd::TakenOver => "sideband_taken_over",
        }
    }

    fn end_reason(&self) -> EndReason {
        match self {
            SidebandEnd::CallEnded => EndReason::UpstreamClosed,
            SidebandEnd::ClientHangup => EndReason::ClientClosed,
            SidebandEnd::AttachFailed(_) => EndReason::UpstreamFailed,
            SidebandEnd::Killed(k) => EndReason::from_end(&End::Killed(k.clone())),
            SidebandEnd::MaxDuration => EndReason::MaxDuration,
            SidebandEnd::LetGo | SidebandEnd::TakenOver => EndReason::Shutdown,
        }
    }
}

/// Attaches, meters and ends one call. Runs as a tracked task. With a
/// `fleet` (Redis), the call is held there while this sideband meters it,
/// and a drain hands it over at once instead of keeping it until
/// `wait_secs`.
pub async fn run(gw: Arc<Gateway>, mut call: Call, owners: Arc<Owners>, fleet: Option<CallFleet>) {
    let route = call.route.config.clone();
    let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
    let mut meta = SessionMeta::new(call.session_id.clone(), &call.key, &route)
        .with_client_secret(call.client_secret_id.clone())
        .for_call(call.transport.as_str(), &call.id);
    let is_live = route.endpoint == Endpoint::Live;
    if is_live {
        meta = meta.for_live_session(Some(call.id.clone()));
    }
    // Calls go to the route's first upstream (`calls::upstream`).
    if let Some(up) = call.route.upstreams.first() {
        meta = meta.on_upstream(&up.config, &route);
    }
    let meta = meta.traced(&gw.telemetry, call.trace, &route, &[]);
    let trace = meta.trace.clone();
    let (mut tracker, meter, kill) = gw.metering.start_session(meta);
    // A translation call is billed by its connected time, from here (the
    // upstream has answered) to its end ([`crate::metering::call_time`]).
    let clock = (route.endpoint == Endpoint::Translations)
        .then(|| Arc::new(CallClock::new(SystemTime::now())));
    // A Live session is billed by the cumulative seconds it reports, from
    // what another replica charged already, if it metered it before.
    let live = match (is_live, &fleet) {
        (false, _) => None,
        (true, Some(f)) => match f.live_charged(&call.id).await {
            Some(ms) if ms > 0 => Some(Arc::new(LiveUsage::resumed(std::time::Instant::now(), ms))),
            _ => Some(Arc::new(LiveUsage::new(call.started.into_std()))),
        },
        (true, None) => Some(Arc::new(LiveUsage::new(call.started.into_std()))),
    };
    let charged_ttl = Duration::from_secs(gw.config.relay.max_session_secs) + RECORD_GRACE;
    if let (Some(u), Some(f)) = (&live, &fleet) {
        // The delegated responses another replica charged are not charged
        // again here.
        if let Some(ids) = f.live_delegated(&call.id).await {
            u.knows_delegated(ids);
        }
        // Each window's figure is marked before it is charged.
        u.marked_by(Arc::new(FleetMark {
            fleet: f.clone(),
            call_id: call.id.clone(),
            ttl: charged_ttl,
        }));
    }
    let meter = match (&clock, &live) {
        (Some(c), _) => meter.measuring_call(c.clone()),
        (None, Some(u)) => meter.measuring_live(u.clone()),
        (None, None) => meter,
    };
    gw.tasks.spawn(meter.run());
    let call_over = |clock: &Option<Arc<CallClock>>| {
        if let Some(c) = clock {
            c.end(SystemTime::now());
        }
    };
    let deadline = call.started + Duration::from_secs(gw.config.relay.max_session_secs);
    let client_end = owners.client_end(&call.id);
    let attaching = attach_holding(&gw, &route, &call.id, timeout, fleet.as_ref());
    let end = match unless_client_ended(attaching, &client_end).await {
        Err(end) => {
            if matches!(end, SidebandEnd::AttachFailed(_)) {
                // A call the gateway cannot see cannot be governed: end it.
                hang_up(&gw, &call, &end).await;
            }
            end
        }
        Ok(ws) => {
            let (mut tx, mut rx) = ws.split();
            let draining = gw.draining.clone();
            let wait = if fleet.is_some() {
                Duration::ZERO
            } else {
                Duration::from_secs(gw.config.drain.wait_secs).saturating_sub(LET_GO_MARGIN)
            };
            let mut renew = renew_ticks();
            let let_go = async move {
                draining.cancelled().await;
                tokio::time::sleep(wait).await;
            };
            tokio::pin!(let_go);
            let kill = kill.fired();
            tokio::pin!(kill);
            let mut reattach = Reattach::new(Instant::now());
            let end = loop {
                let mut lost = false;
                // The tracker's backpressure: a closing record waiting for
                // the meter is taken before the next frame is read.
                let _ = tokio::time::timeout(
                    relay::CLOSE_GRACE,
                    std::future::poll_fn(|cx| tracker.poll_ready(cx)),
                )
                .await;
                tokio::select! {
                    msg = rx.next() => match msg {
                        Some(Ok(Message::Text(t))) => on_text(&mut tracker, live.as_deref(), &t),
                        Some(Ok(Message::Close(_))) => break SidebandEnd::CallEnded,
                        // The connection dropped without a close: the call's
                        // media may well go on, so watch it again.
                        Some(Err(_)) | None => lost = true,
                        Some(Ok(_)) => {}
                    },
                    k = &mut kill => break SidebandEnd::Killed(k),
                    _ = client_end.cancelled() => break SidebandEnd::ClientHangup,
                    _ = tokio::time::sleep_until(deadline) => break SidebandEnd::MaxDuration,
                    _ = &mut let_go => break SidebandEnd::LetGo,
                    _ = renew.tick(), if fleet.is_some() => {
                        if let Some(f) = &fleet {
                            if f.renew(&call.id).await == Some(false) {
                                tracing::warn!(call_id = %call.id,
                                    "another replica holds this call now; it meters it from here");
                                break SidebandEnd::TakenOver;
                            }
                        }
                    }
                }
                if lost {
                    let Some(pause) = reattach.lost(Instant::now()) else {
                        break SidebandEnd::AttachFailed(format!(
                            "the sideband dropped more than {MAX_QUICK_DROPS} times in a row right after attaching"
                        ));
                    };
                    tracing::warn!(call_id = %call.id, pause_ms = pause.as_millis() as u64,
                        "sideband connection lost; attaching again");
                    tokio::time::sleep(pause).await;
                    let attaching = attach_holding(&gw, &route, &call.id, timeout, fleet.as_ref());
                    match unless_client_ended(attaching, &client_end).await {
                        Ok(ws) => {
                            (tx, rx) = ws.split();
                            reattach.attached(Instant::now());
                        }
                        Err(end) => break end,
                    }
                }
            };
            // The upstream closes the sideband of a call the client hung
            // up: when the hangup's answer was already in, the call is
            // still the client's to have ended (the select took either).
            let end = match end {
                SidebandEnd::CallEnded if client_end.is_cancelled() => SidebandEnd::ClientHangup,
                // Nobody would meter a Live session let go without a fleet.
                SidebandEnd::LetGo if live.is_some() && fleet.is_none() => {
                    SidebandEnd::Killed(Kill {
                        code: 1001,
                        reason: "server shutting down".into(),
                        error_event: None,
                        outcome: "shutdown",
                    })
                }
                end => end,
            };
            if !end.hangs_up() {
                call_over(&clock);
            }
            if end.hangs_up() {
                let relay_end = match &end {
                    SidebandEnd::Killed(k) => End::Killed(k.clone()),
                    _ => End::MaxDuration,
                };
                tracker.ending(&relay_end);
                let mut leg = relay::WsLeg {
                    tx: &mut tx,
                    rx: &mut rx,
                };
                relay::cancel_in_flight(&mut leg, &mut tracker).await;
                hang_up(&gw, &call, &end).await;
                call_over(&clock);
                if let Some(u) = &live {
                    // The final figure comes in `session.closed`.
                    let _ = tokio::time::timeout(relay::CLOSE_GRACE, async {
                        while !u.closed() {
                            std::future::poll_fn(|cx| tracker.poll_ready(cx)).await;
                            match rx.next().await {
                                Some(Ok(Message::Text(t))) => on_text(&mut tracker, Some(u), &t),
                                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                                Some(Ok(_)) => {}
                            }
                        }
                    })
                    .await;
                }
            } else if matches!(end, SidebandEnd::AttachFailed(_)) {
                // The sideband could not be attached again: a call the
                // gateway cannot see cannot be governed.
                hang_up(&gw, &call, &end).await;
            }
            if !matches!(end, SidebandEnd::CallEnded | SidebandEnd::AttachFailed(_)) {
                let _ = tokio::time::timeout(relay::CLOSE_GRACE, async {
                    let _ = tx
                        .send(Message::Close(Some(relay::close(1000, "sideband closed"))))
                        .await;
                    loop {
                        std::future::poll_fn(|cx| tracker.poll_ready(cx)).await;
                        let Some(Ok(m)) = rx.next().await else { break };
                        if let Message::Text(t) = m {
                            on_text(&mut tracker, live.as_deref(), &t);
                        }
                    }
                })
                .await;
            }
            end
        }
    };
    call_over(&clock);
    let reason = end.end_reason();
    if let Some(u) = &live {
        // Before the tracker finishes: the meter's last row carries it.
        match &end {
            SidebandEnd::LetGo | SidebandEnd::TakenOver => u.let_go(),
            SidebandEnd::CallEnded | SidebandEnd::ClientHangup if u.closed() => {
                u.ended(200, "session_closed")
            }
            _ => u.ended(reason.status(), reason.as_str()),
        }
    }
    tracker.finish(reason);
    if let Some(t) = trace {
        t.ended(end.outcome(), None, None);
    }
    let handed_over = matches!(end, SidebandEnd::LetGo | SidebandEnd::TakenOver);
    if is_live && !handed_over {
        owners.retire(&call.id, std::time::Instant::now());
    } else {
        owners.remove(&call.id);
    }
    match (&fleet, &end) {
        (Some(f), SidebandEnd::LetGo | SidebandEnd::TakenOver) => {
            // Another replica re-attaches; the key's fleet slot goes with
            // the call, and a Live session's charge so far (its last row
            // here charges up to the figure seen, no more).
            if let Some(u) = &live {
                f.set_live_charged(&call.id, u.seen_ms(), charged_ttl).await;
            }
            if let Some(lease) = call.permit.take_lease() {
                lease.hand_off();
            }
            f.release(&call.id).await;
        }
        (Some(f), _) if is_live => f.retire(&route, &call.id).await,
        (Some(f), _) => f.forget(&route, &call.id).await,
        (None, _) => {}
    }
    gw.metrics
        .sessions_total
        .get_or_create(&OutcomeLabels {
            model: route.model.clone(),
            outcome: end.outcome().into(),
        })
        .inc();
    let detail = match &end {
        SidebandEnd::AttachFailed(e) => Some(e.as_str()),
        SidebandEnd::Killed(k) => Some(k.reason.as_str()),
        _ => None,
    };
    if end == SidebandEnd::LetGo && fleet.is_some() {
        tracing::info!(call_id = %call.id, session_id = %call.session_id, key_id = %call.key.id, "draining: call handed over to another replica");
    } else if end == SidebandEnd::LetGo {
        tracing::warn!(call_id = %call.id, session_id = %call.session_id, key_id = %call.key.id, "draining: stopped metering this call; it goes on without a sideband");
    } else {
        tracing::info!(
            call_id = %call.id,
            session_id = %call.session_id,
            key_id = %call.key.id,
            transport = call.transport.as_str(),
            model = %route.model,
            duration_ms = call.started.elapsed().as_millis() as u64,
            outcome = end.outcome(),
            detail,
            "call ended"
        );
    }
    drop(call.permit);
}

/// An upstream text frame: to the tracker, and for a Live session its
/// usage figures.
fn on_text(tracker: &mut crate::metering::tracker::TurnTracker, live: Option<&LiveUsage>, t: &str) {
    tracker.on_upstream_text(t);
    if let Some(u) = live {
        u.on_upstream(t.as_bytes());
    }
}

/// When a call's hold is renewed: every [`HOLD_RENEW`], the first one
/// period from now.
fn renew_ticks() -> tokio::time::Interval {
    let mut renew = tokio::time::interval(HOLD_RENEW);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    renew.reset();
    renew
}

/// `attaching`, abandoned as [`SidebandEnd::ClientHangup`] once the client
/// has hung up (an attach that fails meanwhile is the hangup's doing too).
async fn unless_client_ended<T>(
    attaching: impl std::future::Future<Output = Result<T, SidebandEnd>>,
    client_end: &CancellationToken,
) -> Result<T, SidebandEnd> {
    tokio::select! {
        biased;
        _ = client_end.cancelled() => Err(SidebandEnd::ClientHangup),
        r = attaching => match r {
            Err(SidebandEnd::AttachFailed(_)) if client_end.is_cancelled() => {
                Err(SidebandEnd::ClientHangup)
            }
            r => r,
        },
    }
}

/// [`attach`], with a fleet the call's hold renewed meanwhile: the attempts
/// can outlast the hold's TTL, and a lapsed hold lets another replica adopt
/// the call while this one attaches it too. `Err` is `AttachFailed`, or
/// `TakenOver` when another replica holds the call already.
async fn attach_holding(
    gw: &Gateway,
    route: &crate::config::RouteConfig,
    call_id: &str,
    timeout: Duration,
    fleet: Option<&CallFleet>,
) -> Result<crate::upstream::dial::UpstreamSocket, SidebandEnd> {
    let failed = |e: upstream::UpstreamCallError| SidebandEnd::AttachFailed(e.to_string());
    let attaching = attach(gw, route, call_id, timeout);
    let Some(fleet) = fleet else {
        return attaching.await.map_err(failed);
    };
    tokio::pin!(attaching);
    let mut renew = renew_ticks();
    loop {
        tokio::select! {
            r = &mut attaching => return r.map_err(failed),
            _ = renew.tick() => {
                if fleet.renew(call_id).await == Some(false) {
                    return Err(SidebandEnd::TakenOver);
                }
            }
        }
    }
}

/// Opens the sideband, [`ATTACH_ATTEMPTS`] times at most,
/// [`ATTACH_BACKOFF`] apart; the last error.
async fn attach(
    gw: &Gateway,
    route: &crate::config::RouteConfig,
    call_id: &str,
    timeout: Duration,
) -> Result<crate::upstream::dial::UpstreamSocket, upstream::UpstreamCallError> {
    let mut attempt = 1;
    loop {
        match upstream::sideband(route, call_id, timeout, gw.config.relay.max_message_bytes).await {
            Ok(ws) => return Ok(ws),
            Err(e) if attempt >= ATTACH_ATTEMPTS => return Err(e),
            Err(e) => {
                tracing::warn!(call_id, attempt, error = %e, "sideband not attached; retrying");
                attempt += 1;
                tokio::time::sleep(ATTACH_BACKOFF).await;
            }
        }
    }
}

/// Ends the call upstream; a failure is logged (the call then runs on until
/// the caller or the upstream ends it).
async fn hang_up(gw: &Gateway, call: &Call, end: &SidebandEnd) {
    let route = &call.route.config;
    let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
    let result = match upstream::action_url(route, &call.id, "hangup") {
        Ok(url) => upstream::post(route, &url, None, Vec::new(), timeout)
            .await
            .map(|a| a.status),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(s) if s.is_success() => {
            tracing::info!(call_id = %call.id, reason = end.outcome(), "call hung up by the gateway")
        }
        Ok(s) => {
            tracing::warn!(call_id = %call.id, status = s.as_u16(), reason = end.outcome(), "the upstream refused the hangup")
        }
        Err(e) => {
            tracing::warn!(call_id = %call.id, error = %e, reason = end.outcome(), "could not hang up the call")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sideband_that_keeps_dropping_is_attached_again_ever_later_then_given_up() {
        let t0 = Instant::now();
        let mut r = Reattach::new(t0);
        // A connection that lasted: attached again at once.
        let mut now = t0 + QUICK_DROP * 3;
        assert_eq!(r.lost(now), Some(Duration::ZERO));
        r.attached(now);
        // Dropped right after each attach: a growing pause, then given up.
        for n in 1..=MAX_QUICK_DROPS {
            now += Duration::from_millis(10);
            assert_eq!(r.lost(now), Some(ATTACH_BACKOFF * n), "drop {n}");
            r.attached(now);
        }
        now += Duration::from_millis(10);
        assert_eq!(r.lost(now), None);
        // One that lasts again resets the count.
        let mut r = Reattach::new(t0);
        assert_eq!(r.lost(t0), Some(ATTACH_BACKOFF));
        r.attached(t0);
        assert_eq!(r.lost(t0 + QUICK_DROP), Some(Duration::ZERO));
    }
}
