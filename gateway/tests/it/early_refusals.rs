//! Requests refused as soon as their head is read, on a raw socket: a body
//! declared over its route's limit (413, before any of it is read, never
//! the 408 of a body that does not come) and an HTTP/2 prior-knowledge
//! preface (505, then the connection closes).

use std::time::{Duration, Instant};

use patchbay_gateway::metrics::ReasonLabels;
use patchbay_sim::SimConfig;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

/// Well under the 5-s body timeout of the test gateways: the answer did
/// not wait for the body.
const PROMPTLY: Duration = Duration::from_secs(2);

/// Writes `bytes`, then reads until the gateway closes (or `WAIT`): what
/// came back, and how long it took.
async fn exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> (String, Duration) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    s.write_all(bytes).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // Until the answer is whole (its Content-Length read) or the gateway
    // closes; the declared body is never sent.
    loop {
        let n = match tokio::time::timeout(WAIT, s.read(&mut chunk)).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) => 0,
            Err(_) => panic!("no answer within {WAIT:?}"),
        };
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            });
            if length.is_some_and(|n| body.len() >= n) {
                break;
            }
        }
    }
    (String::from_utf8_lossy(&buf).to_string(), started.elapsed())
}

fn refusals(gw: &patchbay_gateway::bootstrap::Running, reason: &str) -> u64 {
    gw.gateway
        .metrics
        .refusals
        .get_or_create(&ReasonLabels {
            model: String::new(),
            reason: reason.into(),
        })
        .get()
}

#[tokio::test]
async fn a_body_declared_over_the_limit_is_refused_413_at_once() {
    let signing = TempFile::new("signing.key", &"early-refusal-signing-key-".repeat(2));
    let extra = format!(
        "[client_secrets]\nsigning_key_files = [\"{}\"]\n",
        signing.0.display()
    );
    let (sim, gw) = sim_and_gateway(SimConfig::default(), &extra).await;
    let call_id = sim.stats.calls.incoming_sip_call();
    let accept = format!("/v1/realtime/calls/{call_id}/accept");
    let paths = [
        "/v1/realtime/client_secrets",
        "/v1/realtime/calls?model=gpt-realtime",
        accept.as_str(),
    ];
    let mut refused = 0;
    for path in paths {
        for length in [10_000_000u64, 1 << 30] {
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CLIENT_KEY}\r\n\
                 Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
            );
            let (answer, took) = exchange(gw.addr, head.as_bytes()).await;
            assert!(
                answer.starts_with("HTTP/1.1 413 "),
                "{path} {length}: {answer}"
            );
            assert!(took < PROMPTLY, "{path} {length}: answered after {took:?}");
            let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
            let json: Value = serde_json::from_str(body).unwrap_or(Value::Null);
            assert_eq!(json["error"]["code"], "request_too_large", "{answer}");
            assert_eq!(json["error"]["type"], "invalid_request_error", "{answer}");
            refused += 1;
        }
    }
    assert_eq!(refusals(&gw, "request_too_large"), refused);
    assert!(
        sim.stats.calls.actions().is_empty() && sim.stats.calls.created().is_empty(),
        "nothing went upstream"
    );
}

#[tokio::test]
async fn an_http2_prior_knowledge_preface_is_answered_505_and_closed() {
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    // The client preface, then an empty SETTINGS frame, as h2 clients send.
    let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    preface.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let (answer, took) = exchange(gw.addr, &preface).await;
    assert!(answer.starts_with("HTTP/1.1 505 "), "{answer}");
    assert!(took < PROMPTLY, "answered after {took:?}");
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    assert!(
        body.contains("HTTP/1.1"),
        "the body says what to use: {body}"
    );
    assert_eq!(refusals(&gw, "http_version_not_supported"), 1);
}
