//! A connection's first request is read by the gateway itself (a Realtime
//! upgrade skips hyper); everything else, and every later request on the
//! connection, is hyper's. These tests hold the seams: a request after a
//! refused upgrade, an upgrade after another request, bytes the client sent
//! right behind its upgrade request, a head that arrives in pieces, and a
//! body behind an upgrade request.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;

use patchbay_sim::SimConfig;

use crate::common::*;

const KEY_HEADER: &str = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==";

fn upgrade_head(bearer: &str) -> String {
    format!(
        "GET /v1/realtime?model={MODEL} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n{KEY_HEADER}\r\nAuthorization: Bearer {bearer}\r\n\r\n"
    )
}

/// One HTTP/1.1 response read off `s`: status, head, body (by its
/// `content-length`), and whatever was read past it.
async fn read_response(s: &mut TcpStream) -> (u16, String, Vec<u8>, Vec<u8>) {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, s.read(&mut chunk))
            .await
            .expect("a response in time")
            .expect("read");
        assert!(n > 0, "connection closed before a whole response head");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).expect("ASCII head");
    let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, s.read(&mut chunk))
            .await
            .expect("a body in time")
            .expect("read");
        assert!(n > 0, "connection closed inside a body");
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = buf[head_end..head_end + length].to_vec();
    let rest = buf[head_end + length..].to_vec();
    (status, head, body, rest)
}

/// The `101` read off `tcp` (its head returned) and the WebSocket client
/// the connection now is.
async fn switched(mut tcp: TcpStream) -> (String, Client) {
    let (status, head, _, rest) = read_response(&mut tcp).await;
    assert_eq!(status, 101, "{head}");
    let ws = WebSocketStream::from_partially_read(tcp, rest, Role::Client, None).await;
    (head, ws)
}

/// Upgrades an open connection with tungstenite's client handshake.
async fn upgrade(tcp: TcpStream) -> Client {
    let mut request = format!("ws://127.0.0.1/v1/realtime?model={MODEL}")
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {CLIENT_KEY}").parse().unwrap(),
    );
    tokio::time::timeout(WAIT, tokio_tungstenite::client_async(request, tcp))
        .await
        .expect("upgrade answered in time")
        .expect("upgrade accepted")
        .0
}

#[tokio::test]
async fn a_refused_upgrade_leaves_the_connection_open_for_the_next_request() {
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    tcp.write_all(upgrade_head("pb-wrong").as_bytes())
        .await
        .unwrap();
    let (status, head, body, rest) = read_response(&mut tcp).await;
    assert_eq!(status, 401, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let json: serde_json::Value = serde_json::from_slice(&body).expect("JSON body");
    assert_eq!(json["error"]["code"], "invalid_api_key", "{json}");
    assert!(rest.is_empty());
    assert_eq!(
        metric(
            gw.admin_addr,
            "patchbay_admission_refusals_total",
            "reason=\"invalid_api_key\""
        )
        .await,
        1.0
    );

    // The same connection, now with the right key: served (by hyper).
    let mut ws = upgrade(tcp).await;
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    let turn = one_turn(&mut ws).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");
}

#[tokio::test]
async fn an_upgrade_after_another_request_on_a_kept_alive_connection_is_served() {
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    // A plain GET of the Realtime path: the router's answer, not an upgrade.
    tcp.write_all(format!("GET /v1/realtime?model={MODEL} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (status, head, _, rest) = read_response(&mut tcp).await;
    assert!((400..500).contains(&status), "{head}");
    assert!(rest.is_empty());
    let mut ws = upgrade(tcp).await;
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    let turn = one_turn(&mut ws).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");
}

#[tokio::test]
async fn frames_sent_right_behind_the_upgrade_request_reach_the_upstream() {
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    // The head and a masked `response.create` frame in one write.
    let payload = br#"{"type":"response.create"}"#;
    let mask = [1u8, 2, 3, 4];
    let mut bytes = upgrade_head(CLIENT_KEY).into_bytes();
    bytes.extend_from_slice(&[0x81, 0x80 | payload.len() as u8]);
    bytes.extend_from_slice(&mask);
    bytes.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    tcp.write_all(&bytes).await.unwrap();

    let (head, mut ws) = switched(tcp).await;
    assert!(
        head.contains("sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        "RFC 6455's example key gets its example accept: {head}"
    );
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    // The pipelined frame was the session's first: its response arrives.
    let mut kinds = Vec::new();
    loop {
        let k = kind(&recv_text(&mut ws).await);
        kinds.push(k.clone());
        if k == "response.done" {
            break;
        }
    }
    assert_eq!(kinds.first().map(String::as_str), Some("response.created"));
}

#[tokio::test]
async fn a_head_that_arrives_in_pieces_is_read_whole() {
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let head = upgrade_head(CLIENT_KEY);
    for piece in head.as_bytes().chunks(7) {
        tcp.write_all(piece).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let (_, mut ws) = switched(tcp).await;
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
}

#[tokio::test]
async fn a_head_longer_than_the_gateways_read_is_answered_by_hyper() {
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    // 20 KiB of headers: past the gateway's own read, within hyper's.
    let filler: String = (0..20)
        .map(|i| format!("X-Filler-{i}: {}\r\n", "a".repeat(1000)))
        .collect();
    let head = upgrade_head(CLIENT_KEY).replacen("Host: x\r\n", &format!("Host: x\r\n{filler}"), 1);
    tcp.write_all(head.as_bytes()).await.unwrap();
    let (_, mut ws) = switched(tcp).await;
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
}

#[tokio::test]
async fn a_body_behind_a_refused_upgrade_is_read_as_its_body_not_as_a_request() {
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    // The body spells out a second request; a gateway that took the head
    // alone would answer it too once the upgrade was refused.
    let body = "GET /v1/realtime HTTP/1.1\r\nHost: x\r\n\r\n";
    let head = upgrade_head("pb-wrong").replacen(
        "Host: x\r\n",
        &format!("Host: x\r\nContent-Length: {}\r\n", body.len()),
        1,
    );
    tcp.write_all(format!("{head}{body}").as_bytes())
        .await
        .unwrap();
    tcp.shutdown().await.unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(WAIT, tcp.read_to_end(&mut all))
        .await
        .expect("the gateway closes in time")
        .expect("read");
    let text = String::from_utf8_lossy(&all);
    // A second answer would follow the first one's body on the same line.
    let statuses: Vec<&str> = text
        .match_indices("HTTP/1.1 ")
        .filter_map(|(at, _)| text.get(at..at + 12))
        .collect();
    assert_eq!(statuses, ["HTTP/1.1 401"], "{text}");
}
