//! WebRTC and SIP calls through a real gateway in front of the simulator:
//! created (raw SDP, multipart, JSON) after admission, metered over the
//! call's sideband, hung up on budget, controlled only by their owner; bad
//! input answered with OpenAI-style errors and nothing left half-open.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::*;
use patchbay_gateway::calls::offer::encode_multipart;
use patchbay_gateway::metrics::{ActionRefusalLabels, ReasonLabels, StatusLabels};
use patchbay_sim::{SimConfig, SimFault};
use serde_json::json;

/// What a browser's `RTCPeerConnection` offers: audio and a data channel.
const OFFER: &str = "v=0\r\no=- 4611731400430051336 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n\
a=group:BUNDLE 0 1\r\na=msid-semantic: WMS\r\n\
m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\n\
a=fingerprint:sha-256 00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF\r\n\
a=setup:actpass\r\na=mid:0\r\na=sendrecv\r\na=rtcp-mux\r\na=rtpmap:111 opus/48000/2\r\n\
m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\nc=IN IP4 0.0.0.0\r\na=mid:1\r\na=sctp-port:5000\r\n";

/// One simulator turn (usage_for(1, 5)) costs $0.006692 at these prices
/// (and rows are flushed after every turn).
const PRICES: &str = "[metering]\nflush_secs = 0\n[[prices]]\nmodel = \"gpt-realtime\"\ntext_input = 4.0\ncached_text_input = 0.4\n\
                      audio_input = 32.0\ncached_audio_input = 0.4\ntext_output = 16.0\naudio_output = 64.0\n";

async fn create(addr: SocketAddr, key: &str, content_type: &str, body: &[u8]) -> Answer {
    create_at(addr, "/v1/realtime/calls", key, content_type, body).await
}

async fn create_at(
    addr: SocketAddr,
    path: &str,
    key: &str,
    content_type: &str,
    body: &[u8],
) -> Answer {
    let bearer = format!("Bearer {key}");
    request(
        addr,
        "POST",
        path,
        &[("Authorization", &bearer), ("Content-Type", content_type)],
        body,
    )
    .await
}

/// A browser's raw SDP offer; the model in the query.
async fn create_raw(addr: SocketAddr, key: &str) -> Answer {
    let path = format!("/v1/realtime/calls?model={MODEL}");
    create_at(addr, &path, key, "application/sdp", OFFER.as_bytes()).await
}

async fn act(addr: SocketAddr, key: &str, call_id: &str, action: &str, body: &str) -> Answer {
    let bearer = format!("Bearer {key}");
    request(
        addr,
        "POST",
        &format!("/v1/realtime/calls/{call_id}/{action}"),
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    )
    .await
}

fn call_id_of(a: &Answer) -> String {
    let location = a.header("location").expect("a Location header");
    let id = location
        .strip_prefix("/v1/realtime/calls/")
        .expect("the gateway's own call path");
    id.to_string()
}

fn turns(gw: &patchbay_gateway::bootstrap::Running, status: &str) -> u64 {
    gw.gateway
        .metrics
        .turns
        .get_or_create(&StatusLabels {
            model: MODEL.into(),
            status: status.into(),
        })
        .get()
}

fn sidebands(sim: &patchbay_sim::SimHandle, call_id: &str) -> usize {
    let needle = format!("call_id={call_id}");
    sim.stats
        .queries
        .lock()
        .unwrap()
        .iter()
        .filter(|q| q.contains(&needle))
        .count()
}

fn callers(turns: usize) -> SimConfig {
    SimConfig {
        caller_turns: turns,
        caller_turn_interval: Duration::from_millis(30),
        ..SimConfig::default()
    }
}

#[tokio::test]
async fn a_webrtc_offer_is_answered_through_the_gateway_and_its_turns_are_metered_over_the_sideband(
) {
    let (sim, gw) = sim_and_gateway(callers(3), PRICES).await;
    let a = create_raw(gw.addr, CLIENT_KEY).await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.header("content-type").as_deref(), Some("application/sdp"));
    let call_id = call_id_of(&a);
    assert!(call_id.starts_with("rtc_"), "{call_id}");
    let m_lines: Vec<&str> = a.body.lines().filter(|l| l.starts_with("m=")).collect();
    assert_eq!(m_lines.len(), 2, "{}", a.body);
    assert!(a.body.contains("a=mid:0") && a.body.contains("a=mid:1"));
    assert!(a.body.contains("a=setup:active"));

    // The upstream got the offer with the gateway's key and the route's model.
    let created = sim.stats.calls.created();
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].key, UPSTREAM_KEY);
    assert_eq!(created[0].sdp, OFFER);
    assert_eq!(created[0].session.as_ref().unwrap()["model"], MODEL);

    // The caller's three turns arrive on the sideband and are metered.
    assert!(
        eventually(|| turns(&gw, "200") == 3).await,
        "three metered turns"
    );
    assert_eq!(
        sidebands(&sim, &call_id),
        1,
        "one sideband, opened with the call id"
    );
    assert!(sim
        .stats
        .auth_headers
        .lock()
        .unwrap()
        .iter()
        .all(|k| k == UPSTREAM_KEY));
    assert_eq!(
        metric(gw.admin_addr, "patchbay_realtime_sessions_active", "").await,
        1.0
    );

    // The owner hangs up: forwarded, the sideband closes, the slot is freed.
    let h = act(gw.addr, CLIENT_KEY, &call_id, "hangup", "").await;
    assert_eq!(h.status, 200, "{}", h.body);
    let actions = sim.stats.calls.actions();
    assert_eq!(actions.len(), 1);
    assert_eq!(
        (actions[0].action.as_str(), actions[0].key.as_str()),
        ("hangup", UPSTREAM_KEY)
    );
    assert!(eventually(|| sim.stats.sessions_active.load(Ordering::Relaxed) == 0).await);
    assert!(
        eventually(|| gw.gateway.sessions.active() == 0).await,
        "the call's slot is freed"
    );
}

#[tokio::test]
async fn multipart_and_json_offers_are_accepted_and_the_session_config_is_forwarded() {
    let (sim, gw) = sim_and_gateway(SimConfig::default(), PRICES).await;
    let mut session = serde_json::Map::new();
    session.insert("model".into(), MODEL.into());
    session.insert("instructions".into(), "be brief".into());
    let (ct, body) = encode_multipart(OFFER, Some(&session));
    let a = create(gw.addr, CLIENT_KEY, &ct, &body).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let j =
        json!({"sdp": OFFER, "session": {"type": "realtime", "model": MODEL, "voice": "marin"}});
    let b = create(
        gw.addr,
        CLIENT_KEY,
        "application/json",
        j.to_string().as_bytes(),
    )
    .await;
    assert_eq!(b.status, 201, "{}", b.body);
    let created = sim.stats.calls.created();
    assert_eq!(created.len(), 2);
    assert_eq!(
        created[0].session.as_ref().unwrap()["instructions"],
        "be brief"
    );
    assert_eq!(created[1].session.as_ref().unwrap()["voice"], "marin");
    for id in [call_id_of(&a), call_id_of(&b)] {
        assert_eq!(
            act(gw.addr, CLIENT_KEY, &id, "hangup", "").await.status,
            200
        );
    }
}

#[tokio::test]
async fn a_spent_budget_hangs_the_call_up_and_the_next_call_is_refused_with_402() {
    let sim = sim(callers(3)).await;
    let keys = TempFile::new(
        "keys.toml",
        &key_entry("caller", "pb-caller", "budget_usd = 0.005"),
    );
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!("{PRICES}[keys]\nfile = \"{}\"\n", keys.0.display()),
    ))
    .await;
    let a = create_raw(gw.addr, "pb-caller").await;
    assert_eq!(a.status, 201, "{}", a.body);
    let call_id = call_id_of(&a);
    assert!(
        eventually(|| sim
            .stats
            .calls
            .actions()
            .iter()
            .any(|x| x.action == "hangup" && x.call_id == call_id))
        .await,
        "the gateway hung the call up"
    );
    assert!(sim.stats.calls.ended(&call_id));
    assert!(
        turns(&gw, "200") >= 1,
        "the turn that spent the budget is metered"
    );
    assert!(eventually(|| gw.gateway.sessions.active() == 0).await);
    let next = create_raw(gw.addr, "pb-caller").await;
    assert_eq!(next.status, 402, "{}", next.body);
    assert_eq!(
        sim.stats.calls.created().len(),
        1,
        "the refused call never reached the upstream"
    );
}

#[tokio::test]
async fn only_the_key_that_created_a_call_may_act_on_it() {
    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new(
        "keys.toml",
        &format!(
            "{}{}{}",
            key_entry("alice", "pb-alice", "team = \"a\""),
            key_entry("alice2", "pb-alice2", "team = \"a\""),
            key_entry("mallory", "pb-mallory", "")
        ),
    );
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!("{PRICES}[keys]\nfile = \"{}\"\n", keys.0.display()),
    ))
    .await;
    let call_id = call_id_of(&create_raw(gw.addr, "pb-alice").await);
    for action in ["hangup", "refer", "reject"] {
        let r = act(gw.addr, "pb-mallory", &call_id, action, "{}").await;
        assert_eq!(r.status, 404, "{action}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "call_not_found");
    }
    assert!(
        sim.stats.calls.actions().is_empty(),
        "nothing was forwarded"
    );
    let r = act(
        gw.addr,
        "pb-alice2",
        &call_id,
        "refer",
        r#"{"target_uri":"tel:+15550100"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "a key of the same team may: {}", r.body);
    assert_eq!(
        act(gw.addr, "pb-alice", &call_id, "hangup", "")
            .await
            .status,
        200
    );
    let actions: Vec<String> = sim
        .stats
        .calls
        .actions()
        .into_iter()
        .map(|a| a.action)
        .collect();
    assert_eq!(actions, ["refer", "hangup"]);
    assert_eq!(
        sim.stats.calls.actions()[0].body["target_uri"],
        "tel:+15550100"
    );
}

#[tokio::test]
async fn a_sip_call_accepted_through_the_gateway_is_metered_over_its_sideband() {
    let (sim, gw) = sim_and_gateway(callers(2), PRICES).await;
    let call_id = sim.stats.calls.incoming_sip_call();
    let missing = act(
        gw.addr,
        CLIENT_KEY,
        &call_id,
        "accept",
        r#"{"type":"realtime"}"#,
    )
    .await;
    assert_eq!(missing.status, 400, "{}", missing.body);
    assert_eq!(missing.json()["error"]["param"], "model");
    let body = json!({"type": "realtime", "model": MODEL, "instructions": "answer the phone"});
    let a = act(gw.addr, CLIENT_KEY, &call_id, "accept", &body.to_string()).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let accepted = &sim.stats.calls.actions()[0];
    assert_eq!(
        (accepted.action.as_str(), accepted.key.as_str()),
        ("accept", UPSTREAM_KEY)
    );
    assert_eq!(accepted.body["instructions"], "answer the phone");
    assert!(
        eventually(|| turns(&gw, "200") == 2).await,
        "two metered turns"
    );
    assert_eq!(sidebands(&sim, &call_id), 1);
    let again = act(gw.addr, CLIENT_KEY, &call_id, "accept", &body.to_string()).await;
    assert_eq!(again.status, 400, "{}", again.body);
    assert_eq!(
        act(gw.addr, CLIENT_KEY, &call_id, "hangup", "")
            .await
            .status,
        200
    );
    assert!(eventually(|| gw.gateway.sessions.active() == 0).await);
}

/// The SIP accepts a webhook retried at once: each a request of its own.
async fn accepts_at_once(addrs: [SocketAddr; 3], key: &str, call_id: &str) -> Vec<Answer> {
    let body = json!({"type": "realtime", "model": MODEL}).to_string();
    let [a, b, c] = addrs;
    let (a, b, c) = tokio::join!(
        act(a, key, call_id, "accept", &body),
        act(b, key, call_id, "accept", &body),
        act(c, key, call_id, "accept", &body),
    );
    vec![a, b, c]
}

/// The actions the simulator received for `call_id`, in order.
fn actions_on(sim: &patchbay_sim::SimHandle, call_id: &str) -> Vec<String> {
    sim.stats
        .calls
        .actions()
        .into_iter()
        .filter(|a| a.call_id == call_id)
        .map(|a| a.action)
        .collect()
}

/// One accept won: one 200, the others OpenAI's answer to a duplicate
/// accept; one accept upstream, one sideband.
async fn one_accept_won(answers: &[Answer], sim: &patchbay_sim::SimHandle, call_id: &str) {
    let won = answers.iter().filter(|a| a.status == 200).count();
    assert_eq!(
        won,
        1,
        "{:?}",
        answers
            .iter()
            .map(|a| (a.status, a.body.clone()))
            .collect::<Vec<_>>()
    );
    for lost in answers.iter().filter(|a| a.status != 200) {
        assert_eq!(lost.status, 400, "{}", lost.body);
        assert_eq!(lost.json()["error"]["code"], "call_already_accepted");
    }
    assert_eq!(actions_on(sim, call_id), ["accept"]);
    assert!(eventually(|| sidebands(sim, call_id) == 1).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sidebands(sim, call_id), 1, "one sideband meters the call");
}

fn slow_accepts() -> SimConfig {
    // The upstream takes a while to answer: the retries arrive meanwhile.
    SimConfig {
        accept_answer_delay: Duration::from_millis(800),
        ..callers(0)
    }
}

#[tokio::test]
async fn three_concurrent_accepts_of_one_sip_call_make_one_call() {
    let (sim, gw) = sim_and_gateway(slow_accepts(), PRICES).await;
    let call_id = sim.stats.calls.incoming_sip_call();
    let early = async {
        // While the winning accept waits for the upstream: the call is
        // being accepted, nothing else goes upstream.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let hangup = act(gw.addr, CLIENT_KEY, &call_id, "hangup", "").await;
        let reject = act(gw.addr, CLIENT_KEY, &call_id, "reject", "{}").await;
        (hangup, reject)
    };
    let (answers, (hangup, reject)) =
        tokio::join!(accepts_at_once([gw.addr; 3], CLIENT_KEY, &call_id), early);
    one_accept_won(&answers, &sim, &call_id).await;
    for early in [&hangup, &reject] {
        assert_eq!(early.status, 409, "{}", early.body);
        assert_eq!(early.json()["error"]["code"], "call_accept_in_progress");
        assert!(early.header("retry-after").is_some(), "{}", early.head);
    }
    assert_eq!(gw.gateway.sessions.active(), 1, "one session slot");
    let h = act(gw.addr, CLIENT_KEY, &call_id, "hangup", "").await;
    assert_eq!(h.status, 200, "{}", h.body);
    assert!(eventually(|| gw.gateway.sessions.active() == 0).await);
}

#[tokio::test]
async fn an_accept_the_upstream_refuses_releases_the_call_for_a_retry() {
    let (sim, gw) = sim_and_gateway(callers(0), PRICES).await;
    let call_id = sim.stats.calls.incoming_sip_call();
    let body = json!({"type": "realtime", "model": MODEL}).to_string();
    sim.set_refusing(true);
    let refused = act(gw.addr, CLIENT_KEY, &call_id, "accept", &body).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    sim.set_refusing(false);
    let retried = act(gw.addr, CLIENT_KEY, &call_id, "accept", &body).await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    assert!(eventually(|| sidebands(&sim, &call_id) == 1).await);
    assert_eq!(gw.gateway.sessions.active(), 1);
}

#[tokio::test]
async fn with_redis_three_concurrent_accepts_on_two_replicas_make_one_call() {
    if redis_url("concurrent accepts across replicas").is_none() {
        return;
    }
    let sim = sim(slow_accepts()).await;
    let keys = TempFile::new("keys.toml", &key_entry(&unique("sip"), "pb-sip", ""));
    let (first, second) = two_gateways(&sim, &keys).await;
    let call_id = sim.stats.calls.incoming_sip_call();
    let answers = accepts_at_once([first.addr, second.addr, first.addr], "pb-sip", &call_id).await;
    one_accept_won(&answers, &sim, &call_id).await;
    let active = || first.gateway.sessions.active() + second.gateway.sessions.active();
    assert_eq!(active(), 1, "one session slot in the fleet");

    // A refused accept leaves no claim behind: another replica's retry wins.
    let other = sim.stats.calls.incoming_sip_call();
    let body = json!({"type": "realtime", "model": MODEL}).to_string();
    sim.set_refusing(true);
    let refused = act(first.addr, "pb-sip", &other, "accept", &body).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    sim.set_refusing(false);
    let retried = act(second.addr, "pb-sip", &other, "accept", &body).await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    for id in [&call_id, &other] {
        let h = act(second.addr, "pb-sip", id, "hangup", "").await;
        assert_eq!(h.status, 200, "{}", h.body);
    }
    assert!(eventually(|| active() == 0).await);
}

#[tokio::test]
async fn a_sip_accept_answered_too_late_is_hung_up_so_no_call_runs_unmetered() {
    // The upstream carries out the accept but answers after the gateway's
    // 5-s timeout: the caller is connected to a session nobody meters. The
    // gateway refuses the accept and hangs the call up.
    let (sim, gw) = sim_and_gateway(
        SimConfig {
            accept_answer_delay: Duration::from_secs(7),
            ..callers(0)
        },
        PRICES,
    )
    .await;
    let call_id = sim.stats.calls.incoming_sip_call();
    let body = json!({"type": "realtime", "model": MODEL});
    let a = act(gw.addr, CLIENT_KEY, &call_id, "accept", &body.to_string()).await;
    assert!(a.status >= 500, "{} {}", a.status, a.body);
    let actions = || -> Vec<String> {
        sim.stats
            .calls
            .actions()
            .iter()
            .filter(|x| x.call_id == call_id)
            .map(|x| x.action.clone())
            .collect()
    };
    assert!(
        eventually(|| actions() == ["accept", "hangup"]).await,
        "{:?}",
        actions()
    );
    assert_eq!(sidebands(&sim, &call_id), 0);
    assert_eq!(gw.gateway.sessions.active(), 0);
}

#[tokio::test]
async fn bad_offers_are_refused_with_openai_errors_before_anything_goes_upstream() {
    let (sim, gw) = sim_and_gateway(SimConfig::default(), PRICES).await;
    let big = format!("{OFFER}{}", "a=x\r\n".repeat(14_000));
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "multipart/form-data; boundary=zz",
            b"--zz\r\nnot a part".to_vec(),
            400,
            "invalid_request",
        ),
        (
            "multipart/form-data; boundary=zz",
            b"--zz\r\nContent-Disposition: form-data; name=\"session\"\r\n\r\n{}\r\n--zz--\r\n"
                .to_vec(),
            400,
            "missing_required_parameter",
        ),
        (
            "application/json",
            b"{\"sdp\":".to_vec(),
            400,
            "invalid_request",
        ),
        ("application/sdp", b"hello".to_vec(), 400, "invalid_request"),
        (
            "application/sdp",
            big.into_bytes(),
            413,
            "request_too_large",
        ),
        (
            "text/html",
            OFFER.as_bytes().to_vec(),
            415,
            "unsupported_media_type",
        ),
    ];
    for (ct, body, status, code) in cases {
        let a = create(gw.addr, CLIENT_KEY, ct, &body).await;
        assert_eq!(a.status, status, "{ct}: {}", a.body);
        assert_eq!(a.json()["error"]["code"], code, "{ct}: {}", a.body);
        assert_eq!(a.json()["error"]["type"], "invalid_request_error");
    }
    let no_key = request(
        gw.addr,
        "POST",
        "/v1/realtime/calls",
        &[("Content-Type", "application/sdp")],
        OFFER.as_bytes(),
    )
    .await;
    assert_eq!(no_key.status, 401);
    let unknown = act(gw.addr, CLIENT_KEY, "rtc_nosuchcall", "hangup", "").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"]["code"], "call_not_found");
    // A wrong method or an undecodable call id: OpenAI-shaped answers too.
    let bearer = format!("Bearer {CLIENT_KEY}");
    for (method, path, status, code) in [
        ("GET", "/v1/realtime/calls", 405, "method_not_allowed"),
        (
            "PUT",
            "/v1/realtime/calls/rtc_x/accept",
            405,
            "method_not_allowed",
        ),
        (
            "POST",
            "/v1/realtime/calls/%FF/hangup",
            400,
            "invalid_call_id",
        ),
    ] {
        let a = request(gw.addr, method, path, &[("Authorization", &bearer)], b"").await;
        assert_eq!(a.status, status, "{method} {path}: {}", a.body);
        assert_eq!(
            a.json()["error"]["code"],
            code,
            "{method} {path}: {}",
            a.body
        );
    }
    assert_eq!(
        sim.stats.tcp_accepted.load(Ordering::Relaxed),
        0,
        "nothing reached the upstream"
    );
    // A refused call action is counted as one, not as an admission refusal.
    let m = &gw.gateway.metrics;
    let action_refusals = |action: &str, reason: &str| {
        m.call_action_refusals
            .get_or_create(&ActionRefusalLabels {
                action: action.into(),
                reason: reason.into(),
            })
            .get()
    };
    assert_eq!(action_refusals("hangup", "call_not_found"), 1);
    assert_eq!(action_refusals("unknown", "invalid_call_id"), 1);
    for reason in ["call_not_found", "invalid_call_id"] {
        let admissions = m
            .refusals
            .get_or_create(&ReasonLabels {
                model: String::new(),
                reason: reason.into(),
            })
            .get();
        assert_eq!(admissions, 0, "{reason} is not an admission refusal");
    }
}

#[tokio::test]
async fn an_upstream_refusal_keeps_its_status_never_its_body_and_leaves_nothing_open() {
    for status in [400u16, 401, 500, 503] {
        let (sim, gw) = sim_and_gateway(
            SimConfig {
                fault: Some(SimFault::Refuse { status }),
                ..SimConfig::default()
            },
            PRICES,
        )
        .await;
        let a = create_raw(gw.addr, CLIENT_KEY).await;
        assert_eq!(a.status, status, "{}", a.body);
        assert!(a.json()["error"]["code"].is_string(), "{}", a.body);
        assert!(
            !a.body.contains("sk-s"),
            "the upstream's body (quoting our key) is not passed on: {}",
            a.body
        );
        assert!(!a.body.contains("simulated refusal"), "{}", a.body);
        assert!(a.header("location").is_none());
        assert_eq!(gw.gateway.sessions.active(), 0, "no sideband, no slot held");
        assert!(
            sim.stats.queries.lock().unwrap().is_empty(),
            "no sideband was opened"
        );
    }
}

#[tokio::test]
async fn a_beta_route_refuses_calls_with_unsupported_for_route() {
    let sim = sim(SimConfig::default()).await;
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!("protocol = \"beta\"\n{PRICES}"),
    ))
    .await;
    let a = create_raw(gw.addr, CLIENT_KEY).await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.json()["error"]["code"], "unsupported_for_route");
    assert_eq!(sim.stats.tcp_accepted.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn browsers_get_cors_answers_and_an_allow_list_limits_them() {
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), PRICES).await;
    let preflight = |addr| async move {
        request(
            addr,
            "OPTIONS",
            "/v1/realtime/calls",
            &[
                ("Origin", "https://app.example"),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization, content-type",
                ),
            ],
            b"",
        )
        .await
    };
    let p = preflight(gw.addr).await;
    assert!(p.status < 300, "{}", p.head);
    assert_eq!(
        p.header("access-control-allow-origin").as_deref(),
        Some("*")
    );
    assert!(p
        .header("access-control-allow-methods")
        .unwrap()
        .contains("post"));
    assert!(p
        .header("access-control-allow-headers")
        .unwrap()
        .contains("authorization"));
    let bearer = format!("Bearer {CLIENT_KEY}");
    let a = request(
        gw.addr,
        "POST",
        &format!("/v1/realtime/calls?model={MODEL}"),
        &[
            ("Origin", "https://app.example"),
            ("Authorization", &bearer),
            ("Content-Type", "application/sdp"),
        ],
        OFFER.as_bytes(),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(
        a.header("access-control-allow-origin").as_deref(),
        Some("*")
    );
    assert!(a
        .header("access-control-expose-headers")
        .unwrap()
        .contains("location"));

    let sim3 = sim(SimConfig::default()).await;
    let toml = gateway_toml(&sim3.url(false), PRICES).replace(
        "[server]\n",
        "[server]\ncors_origins = [\"https://allowed.example\"]\n",
    );
    let gw3 = gateway(&toml).await;
    assert!(preflight(gw3.addr)
        .await
        .header("access-control-allow-origin")
        .is_none());
    let ok = request(
        gw3.addr,
        "OPTIONS",
        "/v1/realtime/calls",
        &[
            ("Origin", "https://allowed.example"),
            ("Access-Control-Request-Method", "POST"),
        ],
        b"",
    )
    .await;
    assert_eq!(
        ok.header("access-control-allow-origin").as_deref(),
        Some("https://allowed.example")
    );
}

#[tokio::test]
async fn the_maximum_duration_cancels_the_response_in_flight_meters_it_then_hangs_up() {
    // One long caller turn (5 s of deltas); the call may last 1 s.
    let slow = SimConfig {
        caller_turns: 1,
        caller_turn_interval: Duration::from_millis(10),
        audio_deltas: 50,
        delta_interval: Duration::from_millis(100),
        ..SimConfig::default()
    };
    let (sim, gw) =
        sim_and_gateway(slow, &format!("{PRICES}[relay]\nmax_session_secs = 1\n")).await;
    let call_id = call_id_of(&create_raw(gw.addr, CLIENT_KEY).await);
    assert!(
        eventually(|| sim
            .stats
            .calls
            .actions()
            .iter()
            .any(|a| a.action == "hangup"))
        .await,
        "the gateway hung the call up"
    );
    let cancels = sim.stats.cancels.lock().unwrap().clone();
    assert_eq!(
        cancels.len(),
        1,
        "the response in flight was cancelled over the sideband first"
    );
    assert!(
        cancels[0]
            .as_deref()
            .is_some_and(|id| id.starts_with("resp_")),
        "{cancels:?}"
    );
    assert_eq!(sim.stats.calls.actions()[0].call_id, call_id);
    assert!(
        eventually(|| turns(&gw, "408") == 1).await,
        "the cut-short turn is metered with 408"
    );
    assert!(eventually(|| gw.gateway.sessions.active() == 0).await);
}

#[tokio::test]
async fn a_draining_gateway_lets_its_calls_go_without_hanging_them_up() {
    // Without Redis the sidebands stay (and meter) until wait_secs minus
    // the let-go margin: 1 s here, in which the caller speaks ~10 turns.
    let caller = SimConfig {
        caller_turns: 200,
        caller_turn_interval: Duration::from_millis(100),
        ..SimConfig::default()
    };
    let (sim, gw) = sim_and_gateway(caller, &format!("{PRICES}[drain]\nwait_secs = 4\n")).await;
    let call_id = call_id_of(&create_raw(gw.addr, CLIENT_KEY).await);
    let second = call_id_of(&create_raw(gw.addr, CLIENT_KEY).await);
    assert!(
        eventually(|| sim.stats.sessions_active.load(Ordering::Relaxed) == 2).await,
        "sidebands attached"
    );
    let draining = gw.gateway.clone();
    let drain = tokio::spawn(async move { patchbay_gateway::drain::drain(&draining).await });
    assert!(eventually(|| gw.gateway.sessions.is_draining()).await);
    assert_eq!(
        create_raw(gw.addr, CLIENT_KEY).await.status,
        503,
        "no new calls while draining"
    );
    let at_drain = turns(&gw, "200");
    assert!(
        eventually(|| turns(&gw, "200") > at_drain).await,
        "calls are still metered while the gateway drains"
    );
    tokio::time::timeout(Duration::from_secs(8), drain)
        .await
        .expect("the drain ends within wait_secs")
        .unwrap();
    assert!(
        sim.stats.calls.actions().is_empty(),
        "no call was hung up by the drain"
    );
    assert!(!sim.stats.calls.ended(&call_id) && !sim.stats.calls.ended(&second));
    assert!(
        eventually(|| sim.stats.sessions_active.load(Ordering::Relaxed) == 0).await,
        "sidebands let go"
    );
    assert_eq!(gw.gateway.sessions.active(), 0);
}

#[tokio::test]
async fn a_browser_with_an_ephemeral_secret_creates_a_call_configured_by_the_secret() {
    let (sim, gw) = sim_and_gateway(callers(1), PRICES).await;
    let bearer = format!("Bearer {CLIENT_KEY}");
    let mint = json!({"session": {"type": "realtime", "model": MODEL, "instructions": "Speak like a pirate."}});
    let minted = request(
        gw.addr,
        "POST",
        "/v1/realtime/client_secrets",
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/json"),
        ],
        mint.to_string().as_bytes(),
    )
    .await;
    assert_eq!(minted.status, 200, "{}", minted.body);
    let secret = minted.json()["value"].as_str().unwrap().to_string();
    // The page sends only the SDP: the model and config come from the secret.
    let a = create(gw.addr, &secret, "application/sdp", OFFER.as_bytes()).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let session = sim.stats.calls.created()[0].session.clone().unwrap();
    assert_eq!(session["instructions"], "Speak like a pirate.");
    assert_eq!(session["model"], MODEL);
    assert!(
        eventually(|| turns(&gw, "200") == 1).await,
        "the call's turn is metered"
    );
    // A secret cannot control calls (that needs the key), and cannot pick another model.
    let h = act(gw.addr, &secret, &call_id_of(&a), "hangup", "").await;
    assert_eq!(h.status, 401, "{}", h.body);
    assert!(h.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("cannot control calls"));
    let other = json!({"sdp": OFFER, "session": {"model": "gpt-other"}});
    let o = create(
        gw.addr,
        &secret,
        "application/json",
        other.to_string().as_bytes(),
    )
    .await;
    assert_eq!(o.status, 403, "{}", o.body);
    assert_eq!(sim.stats.calls.created().len(), 1);
}

/// Two gateways sharing the test Redis in front of one simulator.
async fn two_gateways(
    sim: &patchbay_sim::SimHandle,
    keys: &TempFile,
) -> (
    patchbay_gateway::bootstrap::Running,
    patchbay_gateway::bootstrap::Running,
) {
    let toml = gateway_toml(
        &sim.url(false),
        &format!(
            "{PRICES}[store]\nredis_url_env = \"{REDIS_ENV}\"\n[keys]\nfile = \"{}\"\n[drain]\nwait_secs = 5\n",
            keys.0.display()
        ),
    );
    (gateway(&toml).await, gateway(&toml).await)
}

#[tokio::test]
async fn with_redis_another_replica_answers_for_a_call_and_takes_its_sideband_over_on_drain() {
    if redis_url("calls hand-over").is_none() {
        return;
    }
    // Six caller turns, one every 300 ms: some before the drain, some after.
    let sim = sim(SimConfig {
        caller_turns: 6,
        caller_turn_interval: Duration::from_millis(300),
        ..SimConfig::default()
    })
    .await;
    let keys = TempFile::new(
        "keys.toml",
        &format!(
            "{}{}",
            key_entry(&unique("owner"), "pb-owner", ""),
            key_entry(&unique("other"), "pb-other", "")
        ),
    );
    let (first, second) = two_gateways(&sim, &keys).await;
    let call_id = call_id_of(&create_raw(first.addr, "pb-owner").await);
    assert!(
        eventually(|| turns(&first, "200") >= 1).await,
        "the first replica meters"
    );

    // The second replica knows the call's owner from the Redis record.
    let r = act(second.addr, "pb-other", &call_id, "refer", "{}").await;
    assert_eq!(r.status, 404, "{}", r.body);
    let r = act(
        second.addr,
        "pb-owner",
        &call_id,
        "refer",
        r#"{"target_uri":"tel:+1"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);

    tokio::time::timeout(
        Duration::from_secs(10),
        patchbay_gateway::drain::drain(&first.gateway),
    )
    .await
    .expect("the drain ends");
    assert!(
        eventually(|| sidebands(&sim, &call_id) == 2).await,
        "the second replica re-attached a sideband"
    );
    assert!(
        eventually(|| turns(&second, "200") >= 1).await,
        "turns after the hand-over are metered by the second replica"
    );
    assert!(
        sim.stats
            .calls
            .actions()
            .iter()
            .all(|a| a.action != "hangup"),
        "no call was hung up by the drain"
    );
    let h = act(second.addr, "pb-owner", &call_id, "hangup", "").await;
    assert_eq!(h.status, 200, "{}", h.body);
    assert!(eventually(|| second.gateway.sessions.active() == 0).await);
    assert!(turns(&first, "200") + turns(&second, "200") <= 6);
}

#[tokio::test]
async fn a_call_whose_sideband_cannot_be_opened_is_hung_up_rather_than_left_unmetered() {
    let (sim, gw) = sim_and_gateway(SimConfig::default(), PRICES).await;
    sim.stats
        .calls
        .refuse_sidebands
        .store(true, Ordering::Relaxed);
    let a = create_raw(gw.addr, CLIENT_KEY).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let call_id = call_id_of(&a);
    assert!(
        eventually(|| sim.stats.calls.ended(&call_id)).await,
        "the gateway hung up the call it could not see"
    );
    assert!(eventually(|| gw.gateway.sessions.active() == 0).await);
    assert_eq!(
        act(gw.addr, CLIENT_KEY, &call_id, "hangup", "")
            .await
            .status,
        404,
        "nothing is left of the call"
    );
}

/// How soon a call the client ended frees its session slot: far less than
/// the failing attaches (two [`patchbay_gateway::calls::sideband::ATTACH_BACKOFF`]s)
/// it used to wait for.
const PROMPTLY: Duration = Duration::from_millis(500);

#[tokio::test]
async fn a_call_hung_up_before_its_sideband_attaches_ends_as_the_clients_hangup() {
    // The upgrade takes a while (OpenAI's ~250 ms): the hangup arrives while
    // the sideband is still being attached.
    let config = SimConfig {
        upgrade_delay: Duration::from_millis(50),
        ..SimConfig::default()
    };
    let (sim, gw) = sim_and_gateway(config, PRICES).await;
    let outcome = |o: &str| format!("outcome=\"{o}\"");
    for n in 1..=3 {
        let a = create_raw(gw.addr, CLIENT_KEY).await;
        assert_eq!(a.status, 201, "{}", a.body);
        let call_id = call_id_of(&a);
        let h = act(gw.addr, CLIENT_KEY, &call_id, "hangup", "").await;
        assert_eq!(h.status, 200, "{}", h.body);
        assert!(
            within(PROMPTLY, async || gw.gateway.sessions.active() == 0).await,
            "call {n}: the session slot is freed at once"
        );
        let ended = async || {
            metric(
                gw.admin_addr,
                "patchbay_realtime_sessions_total",
                &outcome("client_hangup"),
            )
            .await
                == n as f64
        };
        assert!(
            within(WAIT, ended).await,
            "call {n} ends as the client's hangup"
        );
        // The call's task is over (its outcome is counted after any hangup
        // of its own): the client's hangup is the only one upstream.
        assert_eq!(actions_on(&sim, &call_id), ["hangup"], "call {n}");
    }
    assert_eq!(
        metric(
            gw.admin_addr,
            "patchbay_realtime_sessions_total",
            &outcome("sideband_failed")
        )
        .await,
        0.0
    );
}

#[tokio::test]
async fn removing_the_key_hangs_up_its_live_call() {
    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new("keys.toml", &key_entry("leaving", "pb-leaving", ""));
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!("{PRICES}[keys]\nfile = \"{}\"\n", keys.0.display()),
    ))
    .await;
    let call_id = call_id_of(&create_raw(gw.addr, "pb-leaving").await);
    assert!(eventually(|| sidebands(&sim, &call_id) == 1).await);
    std::fs::write(&keys.0, key_entry("someone-else", "pb-else", "")).unwrap();
    assert!(
        eventually(|| sim.stats.calls.ended(&call_id)).await,
        "the revoked key's call was hung up"
    );
    assert!(eventually(|| gw.gateway.sessions.active() == 0).await);
}

/// Polls `f` until it is true or `limit` passes.
async fn within(limit: Duration, mut f: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    f().await
}

async fn metered(admin: SocketAddr) -> f64 {
    metric(admin, "patchbay_turns_total", "status=\"200\"").await
}

/// Two gateway processes sharing Redis; a call created on the first.
async fn two_processes(sim: &patchbay_sim::SimHandle) -> (Child, Child, String) {
    let url = redis_url("calls hand-over between processes").unwrap();
    let extra =
        format!("{PRICES}[store]\nredis_url_env = \"{REDIS_ENV}\"\n[drain]\nwait_secs = 5\n");
    let env = [(REDIS_ENV, url.as_str())];
    let first = Child::start(&sim.url(false), &extra, &env).await;
    let second = Child::start(&sim.url(false), &extra, &env).await;
    let call_id = call_id_of(&create_raw(first.addr, CLIENT_KEY).await);
    (first, second, call_id)
}

fn slow_caller() -> SimConfig {
    // Turns every 300 ms for a while: some before the hand-over, some after.
    SimConfig {
        caller_turns: 40,
        caller_turn_interval: Duration::from_millis(300),
        ..SimConfig::default()
    }
}

#[tokio::test]
async fn on_sigterm_another_gateway_process_takes_the_calls_over_and_none_is_hung_up() {
    if redis_url("calls hand-over between processes").is_none() {
        return;
    }
    let sim = sim(slow_caller()).await;
    let (mut first, second, call_id) = two_processes(&sim).await;
    assert!(within(WAIT, async || metered(first.admin_addr).await >= 1.0).await);
    first.sigterm();
    let (code, _) = first.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(code, Some(0));
    assert!(
        within(WAIT, async || metered(second.admin_addr).await >= 2.0).await,
        "turns after the hand-over are metered by the second process"
    );
    assert_eq!(sidebands(&sim, &call_id), 2);
    assert!(
        !sim.stats.calls.ended(&call_id),
        "no call was hung up by the drain"
    );
    assert_eq!(
        act(second.addr, CLIENT_KEY, &call_id, "hangup", "")
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn when_a_gateway_process_dies_its_calls_are_adopted_after_their_leases_expire() {
    if redis_url("calls failover between processes").is_none() {
        return;
    }
    let sim = sim(slow_caller()).await;
    let (mut first, second, call_id) = two_processes(&sim).await;
    assert!(within(WAIT, async || metered(first.admin_addr).await >= 1.0).await);
    first.process.kill().unwrap();
    let _ = first.process.wait();
    let limit = patchbay_gateway::calls::fleet::HOLD_TTL + WAIT;
    assert!(
        within(limit, async || metered(second.admin_addr).await >= 1.0).await,
        "the second process re-attached and meters"
    );
    assert!(sidebands(&sim, &call_id) >= 2);
    assert!(!sim.stats.calls.ended(&call_id));
    assert_eq!(
        act(second.addr, CLIENT_KEY, &call_id, "hangup", "")
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn a_lost_sideband_connection_is_attached_again_and_the_call_stays_metered() {
    // The caller speaks every 300 ms for long enough to see turns on both
    // sides of the loss.
    let (sim, gw) = sim_and_gateway(
        SimConfig {
            caller_turns: 20,
            caller_turn_interval: Duration::from_millis(300),
            ..SimConfig::default()
        },
        PRICES,
    )
    .await;
    let a = create_raw(gw.addr, CLIENT_KEY).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let call_id = call_id_of(&a);
    assert!(
        eventually(|| turns(&gw, "200") >= 1).await,
        "metered before the loss"
    );
    // The sideband's TCP connection drops without a close frame.
    sim.drop_all();
    assert!(
        eventually(|| sidebands(&sim, &call_id) == 2).await,
        "a second sideband was opened for the same call"
    );
    let before = turns(&gw, "200");
    assert!(
        eventually(|| turns(&gw, "200") > before).await,
        "turns after the loss are metered"
    );
    assert!(
        sim.stats.calls.actions().is_empty(),
        "the call was not hung up"
    );
    assert_eq!(gw.gateway.sessions.active(), 1, "still one live call");
}

#[tokio::test]
async fn an_action_on_a_call_whose_owner_cannot_be_looked_up_is_refused_not_forwarded() {
    let sim = sim(SimConfig::default()).await;
    // Redis configured, nothing listening: no replica's record can be read.
    let url = format!("redis://127.0.0.1:{}", free_port());
    let toml = gateway_toml(
        &sim.url(false),
        &format!("{PRICES}[store]\nredis_url_env = \"CALLS_REDIS\"\n"),
    );
    let env = |k: &str| match k {
        "CALLS_REDIS" => Some(url.clone()),
        other => test_env(other),
    };
    let config = patchbay_gateway::config::Config::from_toml_with_env(&toml, &env).unwrap();
    let gw = patchbay_gateway::bootstrap::start(config).await.unwrap();
    for action in ["reject", "accept", "hangup"] {
        let r = act(gw.addr, CLIENT_KEY, "rtc_held_elsewhere", action, "{}").await;
        assert_eq!(r.status, 503, "{action}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "store_unavailable");
        assert!(r.header("retry-after").is_some(), "{}", r.head);
    }
    assert!(
        sim.stats.calls.actions().is_empty(),
        "nothing was forwarded"
    );
}
