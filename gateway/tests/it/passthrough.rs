//! Frames through the whole gateway (HTTP upgrade, dial, splice) to a raw
//! upstream, compared byte for byte in both directions.

use std::net::SocketAddr;

use crate::common::*;
use patchbay_gateway::relay::frame::{self, opcode};
use patchbay_gateway::upstream::handshake;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader};

const CREATED: &str = r#"{"type":"session.created","event_id":"e0","session":{"id":"sess_raw"}}"#;

fn frame(fin: bool, op: OpCode, masked: bool, payload: Vec<u8>) -> Vec<u8> {
    let h = FrameHeader {
        is_final: fin,
        opcode: op,
        mask: masked.then_some([0xA5, 0x01, 0x7E, 0x33]),
        ..FrameHeader::default()
    };
    let mut out = Vec::new();
    Frame::from_payload(h, payload.into())
        .format(&mut out)
        .unwrap();
    out
}

/// Text and binary, empty, at every length-encoding edge, and fragmented
/// with a ping between fragments and a character split across them.
fn frames(masked: bool) -> Vec<u8> {
    let text = OpCode::Data(Data::Text);
    let binary = OpCode::Data(Data::Binary);
    let cont = OpCode::Data(Data::Continue);
    let ping = OpCode::Control(Control::Ping);
    let mut out = Vec::new();
    out.extend(frame(true, text, masked, Vec::new()));
    out.extend(frame(true, binary, masked, Vec::new()));
    for len in [125usize, 126, 65535, 65536] {
        out.extend(frame(
            true,
            binary,
            masked,
            (0..len).map(|i| i as u8).collect(),
        ));
        out.extend(frame(true, text, masked, vec![b'a'; len]));
    }
    let euro = "€".as_bytes();
    out.extend(frame(
        false,
        text,
        masked,
        [b"{\"t\":\"", &euro[..1]].concat(),
    ));
    out.extend(frame(true, ping, masked, b"mid-message".to_vec()));
    out.extend(frame(false, cont, masked, euro[1..].to_vec()));
    out.extend(frame(true, cont, masked, b"\"}".to_vec()));
    out
}

/// Whole frames of `bytes`: (opcode, bytes).
fn frames_of(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Ok(Some(h)) = frame::parse_header(&bytes[at..]) {
        let end = at + h.frame_len() as usize;
        if end > bytes.len() {
            break;
        }
        out.push((h.opcode, bytes[at..end].to_vec()));
        at = end;
    }
    out
}

fn data(bytes: &[u8]) -> Vec<u8> {
    frames_of(bytes)
        .into_iter()
        .filter(|(op, _)| op & 0x8 == 0)
        .flat_map(|(_, b)| b)
        .collect()
}

fn has(bytes: &[u8], op: u8) -> bool {
    frames_of(bytes).iter().any(|(o, _)| *o == op)
}

/// An upstream that sends `session.created`, sends [`frames`] once the
/// client's first data frame arrives, answers a close, and reports every
/// byte it received after the handshake.
async fn raw_upstream() -> (SocketAddr, mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                accept_raw(&mut tcp).await;
                let created = frame(true, OpCode::Data(Data::Text), false, CREATED.into());
                tcp.write_all(&created).await.unwrap();
                let (mut got, mut sent) = (Vec::new(), false);
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    got.extend_from_slice(&buf[..n]);
                    if !sent && !data(&got).is_empty() {
                        tcp.write_all(&frames(false)).await.unwrap();
                        sent = true;
                    }
                    if has(&got, opcode::CLOSE) {
                        let _ = tcp.write_all(&[0x88, 0x02, 0x03, 0xE8]).await;
                        break;
                    }
                }
                let _ = tx.send(got).await;
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn frames_cross_the_gateway_byte_for_byte_both_ways() {
    let (upstream, mut recorded) = raw_upstream().await;
    let gw = gateway(&gateway_toml(&format!("ws://{upstream}/v1/realtime"), "")).await;
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    let mut request = handshake::head(&format!("/v1/realtime?model={MODEL}"), &gw.addr.to_string());
    handshake::push_header(
        &mut request,
        "authorization",
        format!("Bearer {CLIENT_KEY}").as_bytes(),
    );
    let mut got = handshake::client(&mut tcp, request).await.unwrap();
    let sent = frames(true);
    tcp.write_all(&sent).await.unwrap();
    let expected = data(
        &[
            frame(true, OpCode::Data(Data::Text), false, CREATED.into()),
            frames(false),
        ]
        .concat(),
    );
    let mut buf = vec![0u8; 64 * 1024];
    tokio::time::timeout(WAIT, async {
        while data(&got).len() < expected.len() || !has(&got, opcode::PONG) {
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "got {} of {} data bytes, frames {:?}",
            data(&got).len(),
            expected.len(),
            frames_of(&got)
                .iter()
                .map(|(o, b)| (*o, b.len()))
                .collect::<Vec<_>>()
        )
    });
    assert_eq!(
        data(&got),
        expected,
        "session.created and every upstream frame as sent"
    );
    let pong = frames_of(&got)
        .into_iter()
        .find(|(op, _)| *op == opcode::PONG)
        .unwrap()
        .1;
    assert_eq!(
        &pong[2..],
        b"mid-message",
        "the client's ping answered by the gateway"
    );

    // A masked close with code 1000.
    let close = frame(
        true,
        OpCode::Control(Control::Close),
        true,
        vec![0x03, 0xE8],
    );
    tcp.write_all(&close).await.unwrap();
    let at_upstream = tokio::time::timeout(WAIT, recorded.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        data(&at_upstream),
        data(&sent),
        "every client frame as sent"
    );
    let upstream_saw: Vec<u8> = frames_of(&at_upstream).iter().map(|(op, _)| *op).collect();
    assert!(
        !upstream_saw.contains(&opcode::PING),
        "the client's ping is answered by the gateway, not forwarded"
    );
    assert!(
        upstream_saw.contains(&opcode::PONG),
        "the upstream's ping is answered on its leg"
    );
}
