//! Metering against both stores: the in-memory one always, the real Redis
//! at `PATCHBAY_TEST_REDIS_URL` when it is set (each test under its own key
//! prefix, so tests run in parallel). Sessions are driven through the real
//! tracker and meter with simulator-shaped events; what is asserted is what
//! an operator sees: rows, counters, refusals, kills and metrics.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use patchbay_gateway::admission::Refusal;
use patchbay_gateway::auth::{KeyEntry, KeySet, KeyStore, TeamEntry};
use patchbay_gateway::config::{BudgetPeriod, MeteringConfig, PriceRow, RouteConfig, Unpriced};
use patchbay_gateway::logs::{Captured, RequestLog, RequestLogRow};
use patchbay_gateway::metering::{
    EndReason, InlineMeter, KillSignal, Metering, SessionMeta, TurnTracker,
};
use patchbay_gateway::metrics::Metrics;
use patchbay_gateway::relay::{Kill, Tap};
use patchbay_gateway::secret::Secret;
use patchbay_gateway::store::memory::MemoryStore;
use patchbay_gateway::store::redis::RedisStore;
use patchbay_gateway::store::{BudgetKey, KeyNames, Scope, Store};
use patchbay_sim::usage_for;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const REDIS_ENV: &str = "PATCHBAY_TEST_REDIS_URL";
const MODEL: &str = "gpt-realtime";
/// Cost of the simulator's first response at [`price`]: 25 text + 100 audio
/// in, 12 text + 50 audio out.
const TURN1_USD: f64 = (25.0 * 4.0 + 100.0 * 32.0 + 12.0 * 16.0 + 50.0 * 64.0) / 1e6;
/// Second response: 30 text + 100 audio in (64 audio cached).
const TURN2_USD: f64 = (30.0 * 4.0 + 36.0 * 32.0 + 64.0 * 0.4 + 12.0 * 16.0 + 50.0 * 64.0) / 1e6;

fn price() -> PriceRow {
    PriceRow {
        upstream: None,
        model: MODEL.into(),
        text_input: 4.0,
        cached_text_input: 0.4,
        audio_input: 32.0,
        cached_audio_input: 0.4,
        text_output: 16.0,
        audio_output: 64.0,
        usd_per_minute: None,
    }
}

#[derive(Clone, Debug)]
enum Backend {
    Memory,
    Redis { url: String, prefix: String },
}

/// The in-memory store, and Redis when configured.
fn backends(test: &str) -> Vec<Backend> {
    let mut out = vec![Backend::Memory];
    match std::env::var(REDIS_ENV) {
        Ok(url) if !url.is_empty() => out.push(Backend::Redis {
            url,
            prefix: format!(
                "patchbay-test:{test}:{}:",
                patchbay_gateway::ids::short_id()
            ),
        }),
        _ => crate::common::skipped(test, &format!("{REDIS_ENV} is not set: the Redis half")),
    }
    out
}

fn redis_only(test: &str) -> Option<Backend> {
    match std::env::var(REDIS_ENV) {
        Ok(url) if !url.is_empty() => Some(Backend::Redis {
            url,
            prefix: format!(
                "patchbay-test:{test}:{}:",
                patchbay_gateway::ids::short_id()
            ),
        }),
        _ => {
            eprintln!("{test}: {REDIS_ENV} is not set; skipped (needs Redis)");
            None
        }
    }
}

impl Backend {
    fn store(&self) -> Arc<dyn Store> {
        match self {
            Backend::Memory => Arc::new(MemoryStore::new()),
            Backend::Redis { url, prefix } => Arc::new(RedisStore::new(url, prefix).unwrap()),
        }
    }

    /// Deletes the test's keys (only when it passed: a failed test leaves
    /// them for inspection).
    async fn cleanup(&self) {
        let Backend::Redis { url, prefix } = self else {
            return;
        };
        let mut conn = redis_conn(url).await;
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{prefix}*"))
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .unwrap();
            if !keys.is_empty() {
                let () = redis::cmd("DEL")
                    .arg(keys)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
            if next == 0 {
                return;
            }
            cursor = next;
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis { .. } => "redis",
        }
    }
}

fn digest(id: &str) -> String {
    hex::encode(Secret::new(format!("pb-{id}")).sha256())
}

/// A keys file: each `(id, extra TOML lines)`, plus the team `support`.
fn keys_toml(keys: &[(&str, &str)], team_budget: Option<f64>) -> String {
    let mut t = String::new();
    for (id, extra) in keys {
        t.push_str(&format!(
            "[[keys]]\nid = \"{id}\"\nsha256 = \"{}\"\nteam = \"support\"\n{extra}\n",
            digest(id)
        ));
    }
    t.push_str("[[teams]]\nid = \"support\"\n");
    if let Some(b) = team_budget {
        t.push_str(&format!("budget_usd = {b}\n"));
    }
    t
}

struct Gw {
    metering: Metering,
    rows: Captured,
    keys: Arc<KeyStore>,
    metrics: Arc<Metrics>,
    route: RouteConfig,
}

fn gateway(backend: &Backend, keys: &str, flush_secs: u64) -> Gw {
    gateway_on(backend.store(), keys, flush_secs, Unpriced::Allow)
}

fn gateway_on(store: Arc<dyn Store>, keys: &str, flush_secs: u64, unpriced: Unpriced) -> Gw {
    let keys = Arc::new(KeyStore::new(KeySet::parse(keys).unwrap()));
    let metrics = Arc::new(Metrics::new());
    let (log, rows) = RequestLog::capture();
    let config = MeteringConfig {
        flush_secs,
        unpriced,
        ..MeteringConfig::default()
    };
    let metering = Metering::with_store(
        config,
        vec![price()],
        store,
        log,
        metrics.clone(),
        keys.clone(),
    );
    Gw {
        metering,
        rows,
        keys,
        metrics,
        route: RouteConfig::default(),
    }
}

struct Live {
    tracker: TurnTracker,
    meter: JoinHandle<()>,
    kill: KillSignal,
}

impl Gw {
    fn key(&self, id: &str) -> KeyEntry {
        self.keys.get().by_id(id).unwrap().clone()
    }

    fn team(&self) -> Option<TeamEntry> {
        self.keys.get().team("support").cloned()
    }

    async fn admit(&self, id: &str) -> Result<(), Refusal> {
        let key = self.key(id);
        self.metering
            .admit(&key, self.team().as_ref(), &self.route)
            .await
    }

    fn open(&self, session: &str, key_id: &str) -> Live {
        let meta = SessionMeta::new(session, &self.key(key_id), &self.route);
        let (tracker, meter, kill) = self.metering.start_session(meta);
        Live {
            tracker,
            meter: tokio::spawn(meter.run()),
            kill,
        }
    }
}

/// One complete response: created, a delta, done with the simulator's
/// `n`-th usage. Keys are sorted, as the simulator writes them.
fn turn(tracker: &mut TurnTracker, id: &str, n: u64) {
    tracker.on_upstream_text(&created(id));
    tracker.on_upstream_text(&delta(id));
    tracker.on_upstream_text(&done(id, n));
}

impl Live {
    fn turn(&mut self, id: &str, n: u64) {
        turn(&mut self.tracker, id, n);
    }

    async fn end(self, reason: EndReason) {
        self.tracker.finish(reason);
        tokio::time::timeout(Duration::from_secs(5), self.meter)
            .await
            .expect("the meter ends after its final flush")
            .unwrap();
    }
}

fn created(id: &str) -> String {
    json!({"type": "response.created", "event_id": "e1",
           "response": {"id": id, "object": "realtime.response", "status": "in_progress", "usage": null}})
    .to_string()
}

fn delta(id: &str) -> String {
    json!({"type": "response.output_audio.delta", "event_id": "e2", "response_id": id,
           "item_id": "item_1", "output_index": 0, "content_index": 0, "delta": "AAAAAAAA"})
    .to_string()
}

fn done(id: &str, n: u64) -> String {
    json!({"type": "response.done", "event_id": "e3",
           "response": {"id": id, "object": "realtime.response", "status": "completed",
                        "output": [], "usage": usage_for(n, 5)}})
    .to_string()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

async fn eventually<F: FnMut() -> bool>(what: &str, within: Duration, mut f: F) {
    let deadline = tokio::time::Instant::now() + within;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn fired(kill: &KillSignal, within: Duration) -> Kill {
    tokio::time::timeout(within, kill.clone().fired())
        .await
        .expect("the session is killed")
}

async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn redis_budget(backend: &Backend, scope: Scope, id: &str) -> f64 {
    let Backend::Redis { url, prefix } = backend else {
        unreachable!()
    };
    let key = KeyNames::new(prefix.clone()).budget(
        &BudgetKey {
            scope,
            id: id.into(),
            period: BudgetPeriod::Total,
        },
        SystemTime::now(),
    );
    let v: Option<f64> = redis::cmd("GET")
        .arg(key)
        .query_async(&mut redis_conn(url).await)
        .await
        .unwrap();
    v.unwrap_or(0.0)
}

#[tokio::test]
async fn a_completed_turn_is_logged_with_its_usage_and_cost() {
    for b in backends("completed") {
        let gw = gateway(
            &b,
            &keys_toml(&[("k", "budget_usd = 10.0")], Some(50.0)),
            15,
        );
        gw.admit("k").await.unwrap();
        let mut s = gw.open("up1", "k");
        s.turn("resp_1", 1);
        s.turn("resp_2", 2);
        s.end(EndReason::ClientLeft).await;

        let rows = gw.rows.rows();
        assert_eq!(rows.len(), 2, "{}", b.name());
        let r = &rows[0];
        assert_eq!(r.request_id, "up1:1");
        assert_eq!(
            (r.key_id.as_str(), r.team.as_deref()),
            ("k", Some("support"))
        );
        assert_eq!(
            (r.status, r.usage_unknown, r.end_reason.as_str()),
            (200, false, "completed")
        );
        assert_eq!(
            (r.input_tokens, r.output_tokens, r.total_tokens),
            (125, 62, 187)
        );
        assert!(r.ttft_ms.is_some());
        assert!(close(r.cost_usd, TURN1_USD), "{}", r.cost_usd);
        assert_eq!(rows[1].input_cached_tokens, 64);
        assert!(close(rows[1].cost_usd, TURN2_USD), "{}", rows[1].cost_usd);
        let text = gw.metrics.encode();
        assert!(
            text.contains("patchbay_turns_total{model=\"gpt-realtime\",status=\"200\"} 2"),
            "{text}"
        );

        if let Backend::Redis { url, prefix } = &b {
            let spent = TURN1_USD + TURN2_USD;
            assert!(close(redis_budget(&b, Scope::Key, "k").await, spent));
            assert!(close(redis_budget(&b, Scope::Team, "support").await, spent));
            let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(format!("{prefix}request_logs"))
                .arg("-")
                .arg("+")
                .query_async(&mut redis_conn(url).await)
                .await
                .unwrap();
            assert_eq!(entries.ids.len(), 2);
            let e = &entries.ids[0];
            let field = |k: &str| e.get::<String>(k).unwrap();
            assert_eq!(field("request_id"), "up1:1");
            assert_eq!(field("total_tokens"), "187");
            assert_eq!(field("usage_unknown"), "false");
            assert_eq!(field("team"), "support");
            assert!(close(field("cost_usd").parse().unwrap(), TURN1_USD));
            assert_eq!(e.map.len(), patchbay_gateway::logs::FIELDS.len());
        }
        b.cleanup().await;
    }
}

#[tokio::test]
async fn a_session_that_stays_open_is_accounted_on_the_flush_timer() {
    for b in backends("open") {
        let gw = gateway(&b, &keys_toml(&[("k", "budget_usd = 10.0")], None), 1);
        let mut s = gw.open("up1", "k");
        s.turn("resp_1", 1);
        eventually("the timer's flush", Duration::from_secs(3), || {
            gw.rows.rows().len() == 1
        })
        .await;
        if matches!(b, Backend::Redis { .. }) {
            assert!(close(redis_budget(&b, Scope::Key, "k").await, TURN1_USD));
        }
        // The session is still live; a later turn lands in a later flush.
        s.turn("resp_2", 2);
        eventually("the second flush", Duration::from_secs(3), || {
            gw.rows.rows().len() == 2
        })
        .await;
        s.end(EndReason::ClientLeft).await;
        assert_eq!(gw.rows.rows().len(), 2, "{}", b.name());
        b.cleanup().await;
    }
}

#[tokio::test]
async fn a_cut_short_response_is_logged_as_unknown() {
    for b in backends("cut") {
        let gw = gateway(&b, &keys_toml(&[("k", "")], None), 15);
        let mut s = gw.open("up1", "k");
        s.tracker.on_upstream_text(&created("resp_1"));
        s.tracker.on_upstream_text(&delta("resp_1"));
        s.end(EndReason::UpstreamFailed).await;
        let rows = gw.rows.rows();
        assert_eq!(rows.len(), 1, "{}", b.name());
        let r = &rows[0];
        assert!(r.usage_unknown);
        assert_eq!((r.status, r.end_reason.as_str()), (502, "upstream_failed"));
        assert_eq!((r.total_tokens, r.cost_usd), (0, 0.0));
        assert!(r.ttft_ms.is_some());
        b.cleanup().await;
    }
}

#[tokio::test]
async fn turns_waiting_on_the_timer_are_flushed_when_the_session_ends() {
    for b in backends("waiting") {
        let gw = gateway(&b, &keys_toml(&[("k", "budget_usd = 10.0")], None), 3600);
        let mut s = gw.open("up1", "k");
        s.turn("resp_1", 1);
        s.tracker.on_upstream_text(&created("resp_2"));
        assert!(gw.rows.rows().is_empty());
        s.end(EndReason::Shutdown).await;
        let rows = gw.rows.rows();
        assert_eq!(rows.len(), 2, "{}", b.name());
        assert_eq!((rows[1].status, rows[1].usage_unknown), (503, true));
        if matches!(b, Backend::Redis { .. }) {
            assert!(close(redis_budget(&b, Scope::Key, "k").await, TURN1_USD));
        }
        b.cleanup().await;
    }
}

#[tokio::test]
async fn an_unpriced_model_is_refused_under_block() {
    for b in backends("unpriced") {
        let keys = keys_toml(&[("k", "")], None);
        let mut gw = gateway_on(b.store(), &keys, 15, Unpriced::Block);
        gw.admit("k").await.unwrap();
        gw.route.model = "gpt-realtime-mini".into();
        let r = gw.admit("k").await.unwrap_err();
        assert_eq!(r.status.as_u16(), 402, "{}", b.name());
        assert_eq!(r.code, "model_not_priced");
        // Priced through the upstream model: admitted.
        gw.route.upstream_model = Some(MODEL.into());
        gw.admit("k").await.unwrap();
        // Allow admits the unpriced model, and logs it at cost 0.
        let mut allow = gateway_on(b.store(), &keys, 15, Unpriced::Allow);
        allow.route.model = "gpt-realtime-mini".into();
        allow.admit("k").await.unwrap();
        let mut s = allow.open("up1", "k");
        s.turn("resp_1", 1);
        s.end(EndReason::ClientLeft).await;
        assert_eq!(allow.rows.rows()[0].cost_usd, 0.0);
        b.cleanup().await;
    }
}

/// How a WebSocket session runs its meter: inside the session's own task,
/// polled beside the relay when it woke, its final flush made in place when
/// the store answers at once (memory) and on the task tracker when the store
/// makes it wait (Redis); nothing is lost either way.
#[tokio::test]
async fn an_inline_meter_meters_beside_the_relay_and_ends_in_place_or_on_the_tracker() {
    for b in backends("inline") {
        // Flushed after every turn; the team's budget is below one turn.
        let gw = gateway(&b, &keys_toml(&[("k", "")], Some(0.005)), 0);
        gw.admit("k").await.unwrap();
        let meta = SessionMeta::new("inline1", &gw.key("k"), &gw.route);
        let (mut tracker, meter, kill) = gw.metering.start_session(meta);
        let mut meter = InlineMeter::new(meter);
        // The relay's stand-in sees a turn and waits for the kill: only a
        // meter polled beside it meters the turn and fires the kill.
        let killed = {
            let relay = std::pin::pin!(async {
                turn(&mut tracker, "resp_1", 1);
                kill.fired().await
            });
            tokio::time::timeout(Duration::from_secs(5), meter.beside(relay))
                .await
                .expect("the meter ran beside the relay")
        };
        assert_eq!(killed.outcome, "budget_exhausted", "{}", b.name());
        assert_eq!(gw.rows.rows().len(), 1, "{}", b.name());

        // A turn the meter has not seen yet, then the end.
        turn(&mut tracker, "resp_2", 2);
        tracker.finish(EndReason::ClientLeft);
        let tasks = TaskTracker::new();
        meter.finish(&tasks);
        // The row leaves at once either way; only a store round trip waits.
        assert_eq!(gw.rows.rows().len(), 2, "{}", b.name());
        let spawned = match b {
            Backend::Memory => 0,
            Backend::Redis { .. } => 1,
        };
        assert_eq!(tasks.len(), spawned, "{}", b.name());
        tasks.close();
        tokio::time::timeout(Duration::from_secs(5), tasks.wait())
            .await
            .expect("the final flush ends");
        // Both turns' spend reached the store.
        let rows = gw.rows.rows();
        assert!(close(rows[1].cost_usd, TURN2_USD), "{}", rows[1].cost_usd);
        if let Backend::Redis { .. } = &b {
            let spent = TURN1_USD + TURN2_USD;
            assert!(close(redis_budget(&b, Scope::Team, "support").await, spent));
        }
        b.cleanup().await;
    }
}

#[tokio::test]
async fn a_spent_budget_refuses_a_new_session() {
    for b in backends("spent") {
        let keys = keys_toml(&[("k", ""), ("k2", "")], Some(0.005));
        let gw = gateway(&b, &keys, 15);
        gw.admit("k").await.unwrap();
        let mut s = gw.open("up1", "k");
        s.turn("resp_1", 1);
        s.end(EndReason::ClientLeft).await;
        // The team's budget is spent for every key of the team.
        for id in ["k", "k2"] {
            let r = gw.admit(id).await.unwrap_err();
            assert_eq!(r.status.as_u16(), 402, "{}", b.name());
            assert_eq!(
                (r.kind, r.code),
                ("insufficient_quota", "insufficient_quota")
            );
            assert_eq!(
                r.message,
                "budget exceeded for team 'support' (limit $0.005)"
            );
            let body: serde_json::Value = serde_json::from_str(&r.body()).unwrap();
            assert_eq!(body["error"]["code"], "insufficient_quota");
        }
        assert!(gw
            .metrics
            .encode()
            .contains("patchbay_budget_blocks_total{model=\"gpt-realtime\"} 2"));

        // A route budget is its own counter.
        let mut other = gateway(&b, &keys_toml(&[("k", "")], None), 15);
        other.route.budget_usd = Some(0.001);
        other.admit("k").await.unwrap();
        let mut s = other.open("up2", "k");
        s.turn("resp_1", 1);
        s.end(EndReason::ClientLeft).await;
        let r = other.admit("k").await.unwrap_err();
        assert_eq!(
            r.message,
            "budget exceeded for route 'gpt-realtime' (limit $0.001)"
        );
        b.cleanup().await;
    }
}

fn assert_budget_kill(kill: &Kill, scope_message: &str) {
    assert_eq!(kill.code, 1008);
    assert_eq!(kill.outcome, "budget_exhausted");
    let event: serde_json::Value =
        serde_json::from_str(kill.error_event.as_deref().unwrap()).unwrap();
    assert_eq!(event["type"], "error");
    assert!(event["event_id"]
        .as_str()
        .unwrap()
        .starts_with("event_patchbay_"));
    assert_eq!(event["error"]["type"], "insufficient_quota");
    assert_eq!(event["error"]["code"], "insufficient_quota");
    assert_eq!(event["error"]["message"], scope_message);
    assert!(event["error"]["param"].is_null());
}

#[tokio::test]
async fn a_session_is_closed_when_its_budget_runs_out() {
    for b in backends("runs_out") {
        let gw = gateway(&b, &keys_toml(&[("k", "budget_usd = 0.01")], None), 1);
        gw.admit("k").await.unwrap();
        let mut s = gw.open("up1", "k");
        s.turn("resp_1", 1);
        tokio::time::sleep(Duration::from_millis(1300)).await;
        assert!(s.kill.get().is_none(), "one turn is within the budget");
        s.turn("resp_2", 2);
        let kill = fired(&s.kill, Duration::from_secs(3)).await;
        assert_budget_kill(&kill, "budget exceeded for key 'k' (limit $0.01)");
        s.end(EndReason::Budget).await;
        assert!(gw
            .metrics
            .encode()
            .contains("patchbay_budget_blocks_total{model=\"gpt-realtime\"} 1"));
        assert_eq!(gw.rows.rows().len(), 2, "{}", b.name());
        b.cleanup().await;
    }
}

/// Other traffic (another gateway instance on Redis; another session of
/// the same process in memory) spends the team budget of an idle session.
async fn idle_session_closed_by_others(b: Backend, flush_secs: u64) {
    let keys = keys_toml(&[("idle", ""), ("busy", "")], Some(0.005));
    let gw = gateway(&b, &keys, flush_secs);
    let other = match &b {
        Backend::Memory => None,
        Backend::Redis { .. } => Some(gateway(&b, &keys, flush_secs)),
    };
    let spender = other.as_ref().unwrap_or(&gw);
    let idle = gw.open("idle1", "idle");
    let mut busy = spender.open("busy1", "busy");
    busy.turn("resp_1", 1);
    busy.end(EndReason::ClientLeft).await;
    let kill = fired(&idle.kill, Duration::from_secs(flush_secs.max(1) + 2)).await;
    assert_budget_kill(&kill, "budget exceeded for team 'support' (limit $0.005)");
    idle.end(EndReason::Budget).await;
    assert!(gw.rows.rows().iter().all(|r| r.session_id != "idle1"));
}

#[tokio::test]
async fn a_budget_spent_by_other_traffic_closes_an_idle_session_on_the_flush_tick() {
    for b in backends("others_tick") {
        idle_session_closed_by_others(b.clone(), 2).await;
        b.cleanup().await;
    }
}

#[tokio::test]
async fn with_flush_secs_0_an_idle_session_is_closed_on_the_one_second_tick() {
    for b in backends("others_zero") {
        idle_session_closed_by_others(b.clone(), 0).await;
        b.cleanup().await;
    }
}

#[tokio::test]
async fn with_flush_secs_0_every_turn_is_flushed_at_once() {
    for b in backends("every_turn") {
        let gw = gateway(&b, &keys_toml(&[("k", "")], None), 0);
        let mut s = gw.open("up1", "k");
        s.turn("resp_1", 1);
        eventually("the turn's own flush", Duration::from_millis(900), || {
            gw.rows.rows().len() == 1
        })
        .await;
        s.end(EndReason::ClientLeft).await;
        b.cleanup().await;
    }
}

#[tokio::test]
async fn rpm_applies_per_key_across_two_gateway_instances_sharing_redis() {
    let Some(b) = redis_only("rpm") else { return };
    let keys = keys_toml(&[("k", "rpm = 2"), ("other", "rpm = 2")], None);
    let a = gateway(&b, &keys, 15);
    let c = gateway(&b, &keys, 15);
    a.admit("k").await.unwrap();
    c.admit("k").await.unwrap();
    for gw in [&a, &c] {
        let r = gw.admit("k").await.unwrap_err();
        assert_eq!(r.status.as_u16(), 429);
        assert_eq!((r.kind, r.code), ("requests", "rate_limit_exceeded"));
        let after = r.retry_after.expect("Retry-After");
        assert!(after >= Duration::from_secs(1) && after <= Duration::from_secs(120));
    }
    // Refused sessions were not counted, and other keys are unaffected.
    let Backend::Redis { url, prefix } = &b else {
        unreachable!()
    };
    let (minute, _) = patchbay_gateway::store::window_position(SystemTime::now());
    let n: Option<u64> = redis::cmd("GET")
        .arg(KeyNames::new(prefix.clone()).rpm("k", minute))
        .query_async(&mut redis_conn(url).await)
        .await
        .unwrap();
    // (A minute boundary between the admits splits the count.)
    assert!(n.unwrap_or(0) <= 2, "{n:?}");
    a.admit("other").await.unwrap();
    assert!(a
        .metrics
        .encode()
        .contains("patchbay_rate_limit_blocks_total{model=\"gpt-realtime\"} 1"));
    b.cleanup().await;
}

#[tokio::test]
async fn in_memory_rpm_applies_per_process() {
    let keys = keys_toml(&[("k", "rpm = 1")], None);
    let a = gateway(&Backend::Memory, &keys, 15);
    let c = gateway(&Backend::Memory, &keys, 15);
    a.admit("k").await.unwrap();
    assert_eq!(a.admit("k").await.unwrap_err().status.as_u16(), 429);
    c.admit("k").await.unwrap();
}

#[tokio::test]
async fn turn_tokens_fill_the_keys_tpm_window() {
    for b in backends("tpm") {
        let gw = gateway(
            &b,
            &keys_toml(&[("k", "tpm = 300"), ("free", "tpm = 300")], None),
            15,
        );
        gw.admit("k").await.unwrap();
        let mut s = gw.open("up1", "k");
        s.turn("resp_1", 1);
        s.end(EndReason::ClientLeft).await;
        // 187 of 300: still room.
        gw.admit("k").await.unwrap();
        let mut s = gw.open("up2", "k");
        s.turn("resp_1", 1);
        // A full window does not close a live session...
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(s.kill.get().is_none());
        s.end(EndReason::ClientLeft).await;
        // ...but refuses the next one.
        let r = gw.admit("k").await.unwrap_err();
        assert_eq!(r.status.as_u16(), 429, "{}", b.name());
        assert_eq!((r.kind, r.code), ("tokens", "rate_limit_exceeded"));
        assert!(r.retry_after.is_some());
        gw.admit("free").await.unwrap();
        b.cleanup().await;
    }
}

#[tokio::test]
async fn a_removed_or_disabled_key_ends_its_live_session() {
    for b in backends("revoked") {
        let gw = gateway(&b, &keys_toml(&[("k", ""), ("stays", "")], None), 15);
        let s = gw.open("up1", "k");
        let stays = gw.open("up2", "stays");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(s.kill.get().is_none());
        gw.keys
            .replace(KeySet::parse(&keys_toml(&[("stays", "")], None)).unwrap());
        let kill = fired(&s.kill, Duration::from_secs(3)).await;
        assert_eq!((kill.code, kill.outcome), (1008, "key_revoked"));
        let event: serde_json::Value =
            serde_json::from_str(kill.error_event.as_deref().unwrap()).unwrap();
        assert_eq!(event["error"]["code"], "invalid_api_key");
        assert!(event["error"]["message"]
            .as_str()
            .unwrap()
            .contains("removed"));
        s.end(EndReason::KeyRevoked).await;

        gw.keys
            .replace(KeySet::parse(&keys_toml(&[("stays", "disabled = true")], None)).unwrap());
        let kill = fired(&stays.kill, Duration::from_secs(3)).await;
        assert_eq!(kill.outcome, "key_revoked", "{}", b.name());
        stays.end(EndReason::KeyRevoked).await;
        b.cleanup().await;
    }
}

/// A meter learns of a new key set when it is loaded, not on a timer: on
/// this single-threaded runtime, the kill has fired by the time the test
/// task runs again after the swap (with a clock to wait for, it would not).
#[tokio::test]
async fn a_key_removal_reaches_its_live_sessions_at_once() {
    let b = Backend::Memory;
    let gw = gateway(&b, &keys_toml(&[("k", ""), ("stays", "")], None), 15);
    let s = gw.open("up1", "k");
    tokio::task::yield_now().await;
    assert!(s.kill.get().is_none());
    gw.keys
        .replace(KeySet::parse(&keys_toml(&[("stays", "")], None)).unwrap());
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
    let kill = s.kill.get().expect("the kill fired with the swap");
    assert_eq!((kill.code, kill.outcome), (1008, "key_revoked"));
    s.end(EndReason::KeyRevoked).await;
}

#[tokio::test]
async fn transcription_usage_is_billed_on_its_own_model() {
    for b in backends("transcription") {
        let gw = gateway(&b, &keys_toml(&[("k", "budget_usd = 10.0")], None), 15);
        gw.metering.set_prices(vec![
            price(),
            PriceRow {
                upstream: None,
                model: "gpt-4o-transcribe".into(),
                audio_input: 6.0,
                text_output: 10.0,
                ..PriceRow::default()
            },
        ]);
        let mut s = gw.open("up1", "k");
        s.tracker.on_upstream_text(
            &json!({"type": "session.updated", "event_id": "e0", "session": {"type": "realtime",
                "audio": {"input": {"transcription": {"model": "gpt-4o-transcribe", "language": "en"}}}}})
            .to_string(),
        );
        s.tracker.on_upstream_text(
            &json!({"type": "conversation.item.input_audio_transcription.completed", "event_id": "e1",
                "item_id": "item_1", "content_index": 0, "transcript": "hello there",
                "usage": {"type": "tokens", "input_tokens": 30, "output_tokens": 5, "total_tokens": 35,
                          "input_token_details": {"audio_tokens": 30, "text_tokens": 0}}})
            .to_string(),
        );
        s.turn("resp_1", 1);
        s.end(EndReason::ClientLeft).await;
        let rows = gw.rows.rows();
        let t: &RequestLogRow = rows
            .iter()
            .find(|r| r.model == "gpt-4o-transcribe")
            .expect("a transcription row");
        assert_eq!((t.transcription_tokens, t.input_audio_tokens), (35, 30));
        let expected = (30.0 * 6.0 + 5.0 * 10.0) / 1e6;
        assert!(close(t.cost_usd, expected), "{}", t.cost_usd);
        if matches!(b, Backend::Redis { .. }) {
            let spent = redis_budget(&b, Scope::Key, "k").await;
            assert!(close(spent, expected + TURN1_USD), "{spent}");
        }
        b.cleanup().await;
    }
}

#[tokio::test]
async fn an_edited_price_applies_from_the_next_flush() {
    for b in backends("reprice") {
        let gw = gateway(&b, &keys_toml(&[("k", "")], None), 1);
        let mut s = gw.open("up1", "k");
        s.turn("resp_1", 1);
        eventually("the first flush", Duration::from_secs(3), || {
            gw.rows.rows().len() == 1
        })
        .await;
        let mut doubled = price();
        doubled.audio_output *= 2.0;
        gw.metering.set_prices(vec![doubled]);
        s.turn("resp_2", 1);
        s.end(EndReason::ClientLeft).await;
        let rows = gw.rows.rows();
        assert!(close(rows[0].cost_usd, TURN1_USD));
        assert!(close(rows[1].cost_usd, TURN1_USD + 50.0 * 64.0 / 1e6));
        b.cleanup().await;
    }
}

/// A TCP relay in front of Redis that the test can cut and restore: cut
/// resets every relayed connection and refuses new ones.
struct Relay {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<CancellationToken>>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Relay {
            addr: listener.local_addr().unwrap(),
            up: Arc::new(AtomicBool::new(true)),
            conns: Arc::new(Mutex::new(CancellationToken::new())),
        };
        let (up, conns) = (relay.up.clone(), relay.conns.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !up.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let token = conns.lock().unwrap().clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = token.cancelled() => {}
                    }
                });
            }
        });
        relay
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        let mut t = self.conns.lock().unwrap();
        t.cancel();
        *t = CancellationToken::new();
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn redis_stopped_mid_session_fails_open_then_counting_resumes() {
    let Some(Backend::Redis { url, prefix }) = redis_only("outage") else {
        return;
    };
    let parsed = url::Url::parse(&url).unwrap();
    let target: SocketAddr = format!(
        "{}:{}",
        parsed.host_str().unwrap(),
        parsed.port().unwrap_or(6379)
    )
    .parse()
    .unwrap();
    let relay = Relay::start(target).await;
    let mut via = parsed.clone();
    via.set_port(Some(relay.addr.port())).unwrap();
    let store = Arc::new(RedisStore::new(via.as_str(), &prefix).unwrap());
    let direct = Backend::Redis {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let gw = gateway_on(
        store,
        &keys_toml(&[("k", "budget_usd = 10.0\nrpm = 100")], None),
        1,
        Unpriced::Allow,
    );

    gw.admit("k").await.unwrap();
    let mut s = gw.open("up1", "k");
    s.turn("resp_1", 1);
    eventually("the first flush", Duration::from_secs(3), || {
        gw.rows.rows().len() == 1
    })
    .await;
    assert!(close(
        redis_budget(&direct, Scope::Key, "k").await,
        TURN1_USD
    ));

    relay.cut();
    // Admission fails open, quickly.
    let started = tokio::time::Instant::now();
    gw.admit("k").await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    s.turn("resp_2", 2);
    eventually(
        "the row on stdout during the outage",
        Duration::from_secs(3),
        || gw.rows.rows().len() == 2,
    )
    .await;
    eventually("a counted store error", Duration::from_secs(3), || {
        gw.metrics.store_errors.get() > 0
    })
    .await;
    assert!(close(
        redis_budget(&direct, Scope::Key, "k").await,
        TURN1_USD
    ));

    relay.restore();
    s.turn("resp_3", 1);
    let all = TURN1_USD + TURN2_USD + TURN1_USD;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    loop {
        let spent = redis_budget(&direct, Scope::Key, "k").await;
        if close(spent, all) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "counting did not resume: {spent} of {all}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.end(EndReason::ClientLeft).await;
    // Every row reached the stream once the store was back.
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(format!("{prefix}request_logs"))
        .arg("-")
        .arg("+")
        .query_async(&mut redis_conn(&url).await)
        .await
        .unwrap();
    assert_eq!(entries.ids.len(), 3);
    direct.cleanup().await;
}
