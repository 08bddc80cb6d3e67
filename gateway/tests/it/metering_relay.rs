//! Metering on real WebSocket sessions: a client, the relay's splice with the
//! turn tracker as its tap and the meter's kill signal, and the simulator
//! upstream, all on 127.0.0.1. The session wiring here is the minimal one the
//! gateway's session path uses (see `metering/mod.rs`); what is asserted is
//! what a client and an operator see: events, close codes, rows, metrics.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use patchbay_gateway::auth::{KeySet, KeyStore};
use patchbay_gateway::config::{MeteringConfig, PriceRow, RouteConfig};
use patchbay_gateway::event::event_type;
use patchbay_gateway::logs::{Captured, RequestLog};
use patchbay_gateway::metering::{EndReason, Metering, SessionMeta};
use patchbay_gateway::metrics::Metrics;
use patchbay_gateway::relay::{self, Limits, Spliced, Tap};
use patchbay_gateway::secret::Secret;
use patchbay_gateway::store::memory::MemoryStore;
use patchbay_gateway::upstream::dial::Upstream;
use patchbay_gateway::upstream_key::UpstreamKey;
use patchbay_sim::{
    self as sim, usage_for, SimConfig, SimFault, SimHandle, AUDIO_TOKENS_PER_DELTA,
};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const UPSTREAM_KEY: &str = "sk-sim-test";
const WAIT: Duration = Duration::from_secs(10);

type Client = WebSocketStream<TcpStream>;

fn keys(extra: &str) -> KeySet {
    let digest = hex::encode(Secret::new("pb-k").sha256());
    KeySet::parse(&format!(
        "[[keys]]\nid = \"k\"\nsha256 = \"{digest}\"\nteam = \"support\"\n{extra}\n[[teams]]\nid = \"support\"\n"
    ))
    .unwrap()
}

struct Rig {
    addr: SocketAddr,
    sim: SimHandle,
    keys: Arc<KeyStore>,
    rows: Captured,
    metrics: Arc<Metrics>,
    ended: mpsc::Receiver<Spliced>,
}

/// The session limits of a rig.
#[derive(Clone, Copy)]
struct Limited {
    idle: Duration,
    max_session: Duration,
    max_message_bytes: usize,
}

impl Default for Limited {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(30),
            max_session: Duration::from_secs(60),
            max_message_bytes: 1 << 20,
        }
    }
}

/// A simulator, and a listener that runs each client session through
/// `relay::splice` with the tracker and the kill signal of `Metering`.
async fn rig(sim_config: SimConfig, key_extra: &str, flush_secs: u64) -> Rig {
    rig_with(sim_config, key_extra, flush_secs, Limited::default()).await
}

async fn rig_with(
    sim_config: SimConfig,
    key_extra: &str,
    flush_secs: u64,
    limited: Limited,
) -> Rig {
    let sim = sim::start(
        "127.0.0.1:0".parse().unwrap(),
        SimConfig {
            keys: vec![UPSTREAM_KEY.into()],
            ..sim_config
        },
    )
    .await
    .unwrap();
    let keys = Arc::new(KeyStore::new(keys(key_extra)));
    let metrics = Arc::new(Metrics::new());
    let (log, rows) = RequestLog::capture();
    let metering = Metering::with_store(
        MeteringConfig {
            flush_secs,
            ..MeteringConfig::default()
        },
        vec![
            PriceRow {
                upstream: None,
                model: "gpt-realtime".into(),
                text_input: 4.0,
                cached_text_input: 0.4,
                audio_input: 32.0,
                cached_audio_input: 0.4,
                text_output: 16.0,
                audio_output: 64.0,
                usd_per_minute: None,
            },
            PriceRow {
                upstream: None,
                model: "gpt-4o-transcribe".into(),
                text_input: 2.5,
                audio_input: 6.0,
                text_output: 10.0,
                ..PriceRow::default()
            },
            PriceRow {
                model: "gpt-realtime-whisper".into(),
                usd_per_minute: Some(0.017),
                ..PriceRow::default()
            },
        ],
        Arc::new(MemoryStore::new()),
        log,
        metrics.clone(),
        keys.clone(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ended_tx, ended) = mpsc::channel(16);
    let (upstream_url, store) = (sim.url(false), keys.clone());
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((tcp, _)) = listener.accept().await {
            n += 1;
            let session_id = format!("up{n}");
            let (metering, url, ended_tx) =
                (metering.clone(), upstream_url.clone(), ended_tx.clone());
            let key = store.get().by_id("k").unwrap().clone();
            tokio::spawn(async move {
                let spliced = session(tcp, &url, metering, &session_id, key, limited).await;
                let _ = ended_tx.send(spliced).await;
            });
        }
    });
    Rig {
        addr,
        sim,
        keys,
        rows,
        metrics,
        ended,
    }
}

async fn session(
    tcp: TcpStream,
    upstream_url: &str,
    metering: Metering,
    session_id: &str,
    key: patchbay_gateway::auth::KeyEntry,
    limited: Limited,
) -> Spliced {
    let client = crate::common::accept_leg(tcp, limited.max_message_bytes).await;
    let route = RouteConfig {
        upstream_url: upstream_url.to_string(),
        api_key: UpstreamKey::new(Secret::new(UPSTREAM_KEY)),
        ..RouteConfig::default()
    };
    let up = Upstream::new(&route, WAIT, limited.max_message_bytes).unwrap();
    let warm = up.dial().await.expect("session.created");
    let mut client = client;
    for f in &warm.created_frames {
        client.queue(f.clone());
    }
    client.flush().await.unwrap();
    let created = warm.session_created.clone();

    let (mut tracker, meter, kill) =
        metering.start_session(SessionMeta::new(session_id, &key, &route));
    let meter = tokio::spawn(meter.run());
    tracker.on_upstream_text(&created);
    let limits = Limits {
        idle_timeout: limited.idle,
        deadline: tokio::time::Instant::now() + limited.max_session,
    };
    let spliced = relay::splice(
        client,
        warm.leg,
        Vec::new(),
        limits,
        &mut tracker,
        kill.fired(),
        || {},
    )
    .await;
    tracker.finish(EndReason::from_end(&spliced.end));
    meter.await.unwrap();
    spliced
}

async fn connect(addr: SocketAddr) -> Client {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/v1/realtime"), tcp)
        .await
        .unwrap();
    let created = next_text(&mut ws).await.expect("session.created");
    assert_eq!(kind(&created), "session.created");
    ws
}

async fn response_create(ws: &mut Client) {
    ws.send(Message::text(
        json!({"type": "response.create"}).to_string(),
    ))
    .await
    .unwrap();
}

/// How the rig's next session ended (its meter has finished by then).
async fn session_end(rig: &mut Rig) -> Spliced {
    tokio::time::timeout(WAIT, rig.ended.recv())
        .await
        .expect("the session ends in time")
        .expect("the rig is running")
}

fn kind(text: &str) -> String {
    event_type(text).map(|t| t.into_owned()).unwrap_or_default()
}

/// The next text frame, or `None` at the close (whose code is returned by
/// [`close_code`]).
async fn next_text(ws: &mut Client) -> Option<String> {
    loop {
        match tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a frame in time")
        {
            Some(Ok(Message::Text(t))) => return Some(t.to_string()),
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return None,
            Some(Ok(_)) => {}
        }
    }
}

/// Reads until the close: the texts seen and the close code.
async fn until_close(ws: &mut Client) -> (Vec<String>, Option<u16>) {
    let mut texts = Vec::new();
    loop {
        match tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a frame in time")
        {
            Some(Ok(Message::Text(t))) => texts.push(t.to_string()),
            Some(Ok(Message::Close(f))) => return (texts, f.map(|f| u16::from(f.code))),
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return (texts, None),
        }
    }
}

async fn one_turn(ws: &mut Client) {
    response_create(ws).await;
    while let Some(t) = next_text(ws).await {
        if kind(&t) == "response.done" {
            return;
        }
    }
    panic!("closed before response.done");
}

#[tokio::test]
async fn simulator_turns_are_metered_as_the_simulator_reports_them() {
    let mut rig = rig(SimConfig::default(), "", 15).await;
    let mut ws = connect(rig.addr).await;
    one_turn(&mut ws).await;
    one_turn(&mut ws).await;
    ws.close(None).await.unwrap();
    let spliced = session_end(&mut rig).await;
    assert_eq!(spliced.end.outcome(), "client_closed");
    let rows = rig.rows.rows();
    assert_eq!(rows.len(), 2);
    for (i, r) in rows.iter().enumerate() {
        let n = i as u64 + 1;
        let usage = usage_for(n, 5);
        assert_eq!(r.request_id, format!("up1:{n}"));
        assert_eq!(r.total_tokens, usage["total_tokens"].as_u64().unwrap());
        assert_eq!(
            r.input_cached_tokens,
            usage["input_token_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        );
        assert_eq!(r.output_audio_tokens, 50);
        assert_eq!((r.status, r.usage_unknown), (200, false));
        let ttft = r.ttft_ms.expect("the audio deltas stamp ttft");
        assert!(ttft <= r.latency_ms);
        assert!(r.cost_usd > 0.0);
    }
    rig.sim.stop();
}

#[tokio::test]
async fn a_burst_of_unfinished_responses_cannot_push_out_the_billed_turn_behind_it() {
    // 5,000 `response.created` written at once, then the billed
    // `response.done`: the turn tracker evicts all but 16 as `never_done`,
    // and those can fill the channel to the meter while the relay handles
    // the burst in a few polls. The billed record then waits and the relay
    // pauses instead of dropping it (the tracker's unit tests pin the
    // channel full; here the meter may also keep up).
    let mut rig = rig(
        SimConfig {
            fault: Some(SimFault::CreatedBurst { count: 5_000 }),
            ..SimConfig::default()
        },
        "",
        15,
    )
    .await;
    let mut ws = connect(rig.addr).await;
    one_turn(&mut ws).await;
    ws.close(None).await.unwrap();
    session_end(&mut rig).await;
    let rows = rig.rows.rows();
    let billed: Vec<_> = rows.iter().filter(|r| r.status == 200).collect();
    assert_eq!(billed.len(), 1, "the billed turn has its row");
    assert_eq!(
        billed[0].total_tokens,
        usage_for(1, 5)["total_tokens"].as_u64().unwrap()
    );
    assert!(billed[0].cost_usd > 0.0);
    let never_done = rows.iter().filter(|r| r.end_reason == "never_done").count() as u64;
    let dropped = rig
        .metrics
        .usage_records_dropped
        .get_or_create(&patchbay_gateway::metrics::model("gpt-realtime"))
        .get();
    // 5,001 responses opened (the billed one first, so it was evicted before
    // its `response.done` came, which is billed all the same); the last 16
    // are cut short by the close, every other one is a `never_done` row or
    // a counted drop. How many are dropped depends on how far the meter
    // keeps up with the relay (none when it runs beside it on another
    // core): the billed turn must survive either way.
    let cut_short = rows.len() as u64 - 1 - never_done;
    assert_eq!(cut_short, 16, "{} rows", rows.len());
    assert_eq!(never_done + dropped, 5_001 - 16);
    rig.sim.stop();
}

#[tokio::test]
async fn a_session_is_closed_with_an_error_event_and_1008_when_its_budget_runs_out() {
    // One simulated turn costs $0.006692.
    let mut rig = rig(SimConfig::default(), "budget_usd = 0.005", 1).await;
    let mut ws = connect(rig.addr).await;
    one_turn(&mut ws).await;
    let (texts, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1008));
    let error: serde_json::Value = serde_json::from_str(texts.last().unwrap()).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "insufficient_quota");
    assert_eq!(error["error"]["code"], "insufficient_quota");
    assert_eq!(
        error["error"]["message"],
        "budget exceeded for key 'k' (limit $0.005)"
    );
    let spliced = session_end(&mut rig).await;
    assert_eq!(spliced.end.outcome(), "budget_exhausted");
    assert_eq!(spliced.client_code, Some(1008));
    // The upstream leg was closed too.
    assert!(spliced.upstream_code.is_some());
    let text = rig.metrics.encode();
    assert!(
        text.contains("patchbay_budget_blocks_total{model=\"gpt-realtime\"} 1"),
        "{text}"
    );
    assert_eq!(rig.rows.rows().len(), 1);
    rig.sim.stop();
}

#[tokio::test]
async fn a_removed_key_ends_its_live_session_with_an_error_event_and_1008() {
    let mut rig = rig(SimConfig::default(), "", 15).await;
    let mut ws = connect(rig.addr).await;
    rig.keys.replace(KeySet::default());
    let (texts, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1008));
    let error: serde_json::Value = serde_json::from_str(texts.last().unwrap()).unwrap();
    assert_eq!(error["error"]["code"], "invalid_api_key");
    let spliced = session_end(&mut rig).await;
    assert_eq!(spliced.end.outcome(), "key_revoked");
    rig.sim.stop();
}

#[tokio::test]
async fn a_response_cut_short_by_the_upstream_is_logged_unknown_with_502() {
    let sim_config = SimConfig {
        fault: Some(SimFault::DropMidResponse { after_deltas: 2 }),
        ..SimConfig::default()
    };
    let mut rig = rig(sim_config, "", 15).await;
    let mut ws = connect(rig.addr).await;
    response_create(&mut ws).await;
    let (_, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1011));
    let spliced = session_end(&mut rig).await;
    assert_eq!(spliced.end.outcome(), "upstream_gone");
    let rows = rig.rows.rows();
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(
        (r.status, r.usage_unknown, r.end_reason.as_str()),
        (502, true, "upstream_failed")
    );
    assert!(r.ttft_ms.is_some());
    rig.sim.stop();
}

#[tokio::test]
async fn usage_that_arrives_while_the_session_closes_is_still_metered() {
    // The key is removed mid-response, a second in (its removal ends the
    // session at once).
    // The upstream answers the gateway's close only after its response.done
    // (with usage), as when that event was already on its way: it reaches
    // the gateway during the close handshake. That turn was billed upstream
    // and must be metered, not logged as cut short.
    // The model takes 2 s to its first audio: the kill comes at ~1 s, the
    // response.done at ~2 s, inside the close grace. Sleep-timed, so a
    // loaded machine does not shift either by much.
    let sim_config = SimConfig {
        inference_delay: Duration::from_secs(2),
        fault: Some(SimFault::FinishResponseBeforeClose),
        ..SimConfig::default()
    };
    let mut rig = rig(sim_config, "", 15).await;
    let mut ws = connect(rig.addr).await;
    response_create(&mut ws).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    rig.keys.replace(KeySet::default());
    let (_, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1008));
    let spliced = session_end(&mut rig).await;
    assert_eq!(spliced.end.outcome(), "key_revoked");
    let rows = rig.rows.rows();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    assert_eq!((r.status, r.usage_unknown), (200, false), "{r:?}");
    let deltas = SimConfig::default().audio_deltas as u64;
    assert_eq!(
        r.output_audio_tokens,
        deltas * AUDIO_TOKENS_PER_DELTA,
        "{r:?}"
    );
    rig.sim.stop();
}

/// A response of 100 small deltas 20 ms apart (two seconds), and the
/// number of deltas the client saw before it left.
async fn leave_mid_response(rig: &Rig, gracefully: bool) -> u64 {
    let mut ws = connect(rig.addr).await;
    response_create(&mut ws).await;
    let mut seen = 0;
    while seen < 3 {
        let text = next_text(&mut ws).await.expect("deltas");
        if kind(&text) == "response.output_audio.delta" {
            seen += 1;
        }
    }
    if gracefully {
        ws.close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "done listening".into(),
        }))
        .await
        .unwrap();
        // Read to the close reply: dropping a socket with unread frames
        // resets it, which would make this a client that went away.
        let _ =
            tokio::time::timeout(WAIT, async { while let Some(Ok(_)) = ws.next().await {} }).await;
    }
    drop(ws);
    seen
}

fn slow_response() -> SimConfig {
    SimConfig {
        audio_deltas: 100,
        audio_delta_bytes: 16,
        delta_interval: Duration::from_millis(20),
        ..SimConfig::default()
    }
}

#[tokio::test]
async fn a_client_leaving_mid_response_is_charged_for_what_was_generated() {
    // The client closes after 3 of 100 deltas. The gateway cancels the
    // response upstream and meters the usage of its cancelled
    // response.done; only then does the client's close go upstream.
    for gracefully in [true, false] {
        let mut rig = rig(slow_response(), "", 15).await;
        let seen = leave_mid_response(&rig, gracefully).await;
        let spliced = session_end(&mut rig).await;
        let outcome = if gracefully {
            "client_closed"
        } else {
            "client_gone"
        };
        assert_eq!(spliced.end.outcome(), outcome);
        let rows = rig.rows.rows();
        assert_eq!(rows.len(), 1, "{rows:?}");
        let r = &rows[0];
        let reason = if gracefully {
            "client_closed"
        } else {
            "client_left"
        };
        assert_eq!(
            (r.status, r.usage_unknown, r.end_reason.as_str()),
            (499, false, reason),
            "{outcome}: {r:?}"
        );
        let deltas = r.output_audio_tokens / AUDIO_TOKENS_PER_DELTA;
        assert!(
            (seen..100).contains(&deltas),
            "{outcome}: charged for {deltas} deltas, the client saw {seen}"
        );
        assert!(r.cost_usd > 0.0, "{r:?}");
        let codes = rig.sim.stats.close_codes.lock().unwrap().clone();
        let expected = if gracefully { 1000 } else { 1001 };
        assert_eq!(
            codes,
            vec![expected],
            "{outcome}: the close reached the upstream after the cancel"
        );
        rig.sim.stop();
    }
}

/// Transcription is billed at its model's price, the model learnt from
/// the `session.updated` that turned it on.
#[tokio::test]
async fn input_audio_transcription_usage_gets_its_own_row() {
    let mut rig = rig(SimConfig::default(), "", 15).await;
    let mut ws = connect(rig.addr).await;
    let on = json!({"type": "session.update", "session": {"type": "realtime",
        "audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}}}});
    ws.send(Message::text(on.to_string())).await.unwrap();
    while let Some(t) = next_text(&mut ws).await {
        if kind(&t) == "session.updated" {
            break;
        }
    }
    ws.send(Message::text(
        json!({"type": "input_audio_buffer.commit"}).to_string(),
    ))
    .await
    .unwrap();
    while let Some(t) = next_text(&mut ws).await {
        if kind(&t) == "conversation.item.input_audio_transcription.completed" {
            break;
        }
    }
    ws.close(None).await.unwrap();
    tokio::time::timeout(WAIT, rig.ended.recv())
        .await
        .unwrap()
        .unwrap();
    let rows = rig.rows.rows();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].model, "gpt-4o-transcribe");
    assert_eq!(
        (rows[0].transcription_tokens, rows[0].input_audio_tokens),
        (35, 30)
    );
    // 30 audio tokens in at $6/M, 5 text tokens out at $10/M.
    assert_eq!(rows[0].cost_usd, (30.0 * 6.0 + 5.0 * 10.0) / 1e6);
    assert_eq!(rows[0].audio_seconds, None);
    rig.sim.stop();
}

/// A transcription reported as a duration (`{"type": "duration", "seconds":
/// 90}`) is billed at its model's per-minute rate, and charged to the key's
/// budget like any row: 1.5 min × $0.017 = $0.0255 spends a $0.02 budget.
#[tokio::test]
async fn a_duration_transcription_is_billed_per_minute_and_charged_to_the_budget() {
    let sim = SimConfig {
        transcription_usage: sim::TranscriptionUsage::Duration { seconds: 90.0 },
        ..SimConfig::default()
    };
    let mut rig = rig(sim, "budget_usd = 0.02", 0).await;
    let mut ws = connect(rig.addr).await;
    let on = json!({"type": "session.update", "session": {"type": "realtime",
        "audio": {"input": {"transcription": {"model": "gpt-realtime-whisper"}}}}});
    ws.send(Message::text(on.to_string())).await.unwrap();
    while let Some(t) = next_text(&mut ws).await {
        if kind(&t) == "session.updated" {
            break;
        }
    }
    ws.send(Message::text(
        json!({"type": "input_audio_buffer.commit"}).to_string(),
    ))
    .await
    .unwrap();
    let mut quota = None;
    while let Some(t) = next_text(&mut ws).await {
        if kind(&t) == "error" {
            quota = Some(t);
            break;
        }
    }
    let quota = quota.expect("the spent budget closes the session with an error event");
    assert!(quota.contains("insufficient_quota"), "{quota}");
    tokio::time::timeout(WAIT, rig.ended.recv())
        .await
        .unwrap()
        .unwrap();
    let rows = rig.rows.rows();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].model, "gpt-realtime-whisper");
    assert_eq!(rows[0].audio_seconds, Some(90.0));
    assert_eq!((rows[0].total_tokens, rows[0].transcription_tokens), (0, 0));
    assert_eq!(rows[0].cost_usd, 0.0255);
    rig.sim.stop();
}

// ---------------------------------------------------------------------------
// Every way a session ends charges the response in flight: the teardown
// cancels it by its response_id and meters the cancelled response.done, and
// the row names the cause.

/// Starts a slow response and reads `deltas` of its audio deltas.
async fn mid_response(rig: &Rig, deltas: usize) -> Client {
    let mut ws = connect(rig.addr).await;
    response_create(&mut ws).await;
    let mut seen = 0;
    while seen < deltas {
        let text = next_text(&mut ws).await.expect("deltas");
        if kind(&text) == "response.output_audio.delta" {
            seen += 1;
        }
    }
    ws
}

/// The rig's one row, asserted charged: the usage of a cancelled
/// response.done, a cost, the cause's status and end_reason; and the cancel
/// that reached the simulator named the response.
async fn assert_charged(rig: &mut Rig, outcome: &str, status: u16, reason: &str) {
    let spliced = session_end(rig).await;
    assert_eq!(spliced.end.outcome(), outcome);
    let rows = rig.rows.rows();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    assert_eq!(
        (r.status, r.usage_unknown, r.end_reason.as_str()),
        (status, false, reason),
        "{r:?}"
    );
    assert!(r.input_tokens > 0 && r.cost_usd > 0.0, "{r:?}");
    let cancels = rig.sim.stats.cancels.lock().unwrap().clone();
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    let id = cancels[0].clone().expect("the cancel names the response");
    assert!(id.starts_with("resp_"), "{id}");
}

/// A long response: 500 small deltas 20 ms apart (ten seconds).
fn long_response() -> SimConfig {
    SimConfig {
        audio_deltas: 500,
        ..slow_response()
    }
}

#[tokio::test]
async fn a_frame_header_over_the_size_limit_ends_the_session_with_1009_and_charges_the_turn() {
    use tokio::io::AsyncWriteExt;
    let mut rig = rig(long_response(), "", 15).await;
    let mut ws = mid_response(&rig, 3).await;
    // A masked text frame header claiming 2^40 bytes, and no payload.
    let mut header = vec![0x81, 0xFF];
    header.extend_from_slice(&(1u64 << 40).to_be_bytes());
    header.extend_from_slice(&[1, 2, 3, 4]);
    ws.get_mut().write_all(&header).await.unwrap();
    let (_, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1009));
    assert_charged(
        &mut rig,
        "client_message_too_big",
        499,
        "client_oversize_frame",
    )
    .await;
    rig.sim.stop();
}

#[tokio::test]
async fn invalid_utf8_from_the_client_ends_the_session_with_1007_and_charges_the_turn() {
    use tokio::io::AsyncWriteExt;
    let mut rig = rig(long_response(), "", 15).await;
    let mut ws = mid_response(&rig, 3).await;
    // A masked text frame whose payload is not UTF-8.
    let mask = [9u8, 8, 7, 6];
    let payload = [0xFFu8, 0xFE, 0xFD];
    let mut frame = vec![0x81, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    ws.get_mut().write_all(&frame).await.unwrap();
    let (_, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1007));
    assert_charged(
        &mut rig,
        "client_protocol_error",
        499,
        "client_protocol_error",
    )
    .await;
    rig.sim.stop();
}

#[tokio::test]
async fn an_idle_timeout_with_a_response_in_flight_charges_the_turn() {
    // The model is silent for 5 s after response.created; the idle timeout
    // is 1 s.
    let sim_config = SimConfig {
        inference_delay: Duration::from_secs(5),
        ..SimConfig::default()
    };
    let limited = Limited {
        idle: Duration::from_secs(1),
        ..Limited::default()
    };
    let mut rig = rig_with(sim_config, "", 15, limited).await;
    let mut ws = connect(rig.addr).await;
    response_create(&mut ws).await;
    let (_, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1001));
    assert_charged(&mut rig, "idle_timeout", 408, "idle_timeout").await;
    rig.sim.stop();
}

#[tokio::test]
async fn the_maximum_session_duration_charges_the_turn_in_flight() {
    let limited = Limited {
        max_session: Duration::from_secs(1),
        ..Limited::default()
    };
    let mut rig = rig_with(long_response(), "", 15, limited).await;
    let mut ws = mid_response(&rig, 1).await;
    let (texts, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1001));
    assert!(
        texts.last().is_some_and(|t| t.contains("session_expired")),
        "{texts:?}"
    );
    assert_charged(
        &mut rig,
        "max_session_duration",
        408,
        "max_session_duration",
    )
    .await;
    rig.sim.stop();
}

#[tokio::test]
async fn a_revoked_key_charges_the_turn_in_flight_with_403() {
    let mut rig = rig(long_response(), "", 15).await;
    let mut ws = mid_response(&rig, 1).await;
    rig.keys.replace(KeySet::default());
    let (_, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1008));
    assert_charged(&mut rig, "key_revoked", 403, "key_revoked").await;
    rig.sim.stop();
}

#[tokio::test]
async fn a_budget_kill_charges_the_turn_in_flight_with_402() {
    // Budget $0.005; flushes after every turn with a 1 s budget re-read.
    let mut rig = rig(long_response(), "budget_usd = 0.005", 0).await;
    let mut busy = mid_response(&rig, 1).await;
    // A second session spends the budget: it cancels its own response after
    // 3 deltas ($0.005412).
    let mut spender = mid_response(&rig, 3).await;
    spender
        .send(Message::text(
            json!({"type": "response.cancel"}).to_string(),
        ))
        .await
        .unwrap();
    let (_, code) = until_close(&mut spender).await;
    assert_eq!(code, Some(1008), "the spender is closed at its own flush");
    let first = session_end(&mut rig).await;
    assert_eq!(first.end.outcome(), "budget_exhausted");
    // The busy session is closed at its next budget re-read, mid-response.
    let (texts, code) = until_close(&mut busy).await;
    assert_eq!(code, Some(1008));
    assert!(
        texts
            .last()
            .is_some_and(|t| t.contains("insufficient_quota")),
        "{texts:?}"
    );
    let second = session_end(&mut rig).await;
    assert_eq!(second.end.outcome(), "budget_exhausted");
    let rows = rig.rows.rows();
    let killed: Vec<_> = rows.iter().filter(|r| r.status == 402).collect();
    assert_eq!(killed.len(), 1, "{rows:?}");
    let r = killed[0];
    assert_eq!(
        (r.usage_unknown, r.end_reason.as_str()),
        (false, "budget_exhausted")
    );
    assert!(r.output_audio_tokens > 0 && r.cost_usd > 0.0, "{r:?}");
    rig.sim.stop();
}

#[tokio::test]
async fn the_client_gets_its_close_at_once_while_the_upstream_leg_waits_for_the_cancelled_turn() {
    // The upstream ignores the cancel (its response.done comes only after
    // 8 s of model time, past both graces). The key is revoked mid-response: the client's
    // 1008 goes out at once; the session itself ends only when the upstream
    // leg gave up waiting (the close grace), with the turn cut short.
    let sim_config = SimConfig {
        inference_delay: Duration::from_secs(8),
        fault: Some(SimFault::FinishResponseBeforeClose),
        ..SimConfig::default()
    };
    let mut rig = rig(sim_config, "", 15).await;
    let mut ws = connect(rig.addr).await;
    response_create(&mut ws).await;
    // Revoked once the response is under way (the meter acts at once).
    while let Some(text) = next_text(&mut ws).await {
        if kind(&text) == "response.created" {
            break;
        }
    }
    rig.keys.replace(KeySet::default());
    let (_, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1008));
    assert!(
        rig.ended.try_recv().is_err(),
        "the client's close did not wait for the upstream leg"
    );
    let spliced = session_end(&mut rig).await;
    assert_eq!(spliced.end.outcome(), "key_revoked");
    let rows = rig.rows.rows();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0].status, rows[0].usage_unknown),
        (403, true),
        "no response.done within the grace: usage unknown"
    );
    rig.sim.stop();
}

/// An upstream that sends every `response.done` twice: each response is
/// charged once (one row per turn, the simulator's usage), and every
/// repeat is counted as a duplicate.
#[tokio::test]
async fn a_response_done_sent_twice_is_charged_once_and_counted_as_a_duplicate() {
    let mut rig = rig(
        SimConfig {
            fault: Some(SimFault::DoneTwice),
            ..SimConfig::default()
        },
        "",
        0,
    )
    .await;
    let mut ws = connect(rig.addr).await;
    for _ in 0..2 {
        one_turn(&mut ws).await;
        let again = next_text(&mut ws)
            .await
            .expect("the repeated response.done");
        assert_eq!(kind(&again), "response.done");
    }
    ws.close(None).await.unwrap();
    session_end(&mut rig).await;
    let rows = rig.rows.rows();
    let ids: Vec<&str> = rows.iter().map(|r| r.request_id.as_str()).collect();
    assert_eq!(ids, ["up1:1", "up1:2"], "{rows:?}");
    for (n, r) in (1..).zip(&rows) {
        assert_eq!(
            r.total_tokens,
            usage_for(n, 5)["total_tokens"].as_u64().unwrap()
        );
    }
    let text = rig.metrics.encode();
    assert!(
        text.contains("patchbay_usage_duplicates_total{model=\"gpt-realtime\"} 2"),
        "{text}"
    );
    rig.sim.stop();
}
