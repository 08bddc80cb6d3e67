//! The splice on real loopback sockets: both directions byte for byte
//! against tungstenite as the reference decoder, and the gateway's own
//! frames only between messages.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::frame::{self, opcode};
use super::leg::{Leg, Side};
use super::testing::{frame, random_stream, reference_messages, Rng};
use super::*;

const WAIT: Duration = Duration::from_secs(10);
const MASK: Option<[u8; 4]> = Some([0x37, 0xFA, 0x21, 0x3D]);

/// Two connected loopback sockets.
async fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
    (a.unwrap(), b.unwrap().0)
}

/// What a test's tap sees: upstream texts, and one response in flight
/// until a `response.done` arrives.
#[derive(Default)]
struct Seen {
    texts: Vec<String>,
    in_flight: Option<String>,
}

impl Tap for Seen {
    fn on_upstream_text(&mut self, text: &str) {
        if text.contains("response.done") {
            self.in_flight = None;
        }
        if let Some(id) = text
            .strip_prefix(r#"{"type":"response.created","response":{"id":""#)
            .and_then(|rest| rest.split('"').next())
        {
            self.in_flight = Some(id.to_string());
        }
        self.texts.push(text.to_string());
    }
    fn responses_in_flight(&self) -> Vec<Option<String>> {
        self.in_flight.iter().map(|id| Some(id.clone())).collect()
    }
}

/// A splice between two loopback pairs: returns the client's and the
/// upstream's peers, and the splice's end and tap.
struct Rig {
    client: TcpStream,
    upstream: TcpStream,
    kill: Option<oneshot::Sender<Kill>>,
    done: tokio::task::JoinHandle<(Spliced, Seen)>,
}

async fn rig(tap: Seen) -> Rig {
    let (client, client_leg) = pair().await;
    let (upstream, upstream_leg) = pair().await;
    let (kill_tx, kill_rx) = oneshot::channel::<Kill>();
    let done = tokio::spawn(async move {
        let mut tap = tap;
        let limits = Limits {
            idle_timeout: Duration::from_secs(60),
            deadline: Instant::now() + Duration::from_secs(60),
        };
        let kill = async move {
            match kill_rx.await {
                Ok(k) => k,
                Err(_) => std::future::pending().await,
            }
        };
        let spliced = splice(
            Leg::new(client_leg, &[], Side::Server, 1 << 20),
            Leg::new(upstream_leg, &[], Side::Client, 1 << 20),
            Vec::new(),
            limits,
            &mut tap,
            kill,
            || {},
        )
        .await;
        (spliced, tap)
    });
    Rig {
        client,
        upstream,
        kill: Some(kill_tx),
        done,
    }
}

/// Whole frames of `bytes`: (opcode, fin, bytes of the frame).
fn frames_of(bytes: &[u8]) -> Vec<(u8, bool, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Ok(Some(h)) = frame::parse_header(&bytes[at..]) {
        let end = at + h.frame_len() as usize;
        if end > bytes.len() {
            break;
        }
        out.push((h.opcode, h.fin, bytes[at..end].to_vec()));
        at = end;
    }
    out
}

/// The data frames of `bytes`, concatenated.
fn data_bytes(bytes: &[u8]) -> Vec<u8> {
    frames_of(bytes)
        .into_iter()
        .filter(|(op, ..)| *op & 0x8 == 0)
        .flat_map(|(.., b)| b)
        .collect()
}

/// Frames of `bytes` with opcode `op`.
fn count(bytes: &[u8], op: u8) -> usize {
    frames_of(bytes).iter().filter(|(o, ..)| *o == op).count()
}

/// Writes `bytes` while reading, until the data frames received add up to
/// `want_data` bytes and `want_pongs` pongs have come.
async fn write_and_read(
    peer: &mut TcpStream,
    bytes: &[u8],
    want_data: usize,
    want_pongs: usize,
) -> Vec<u8> {
    let (mut r, mut w) = peer.split();
    let write = async { w.write_all(bytes).await.unwrap() };
    let read = read_while(&mut r, |got| {
        data_bytes(got).len() < want_data || count(got, opcode::PONG) < want_pongs
    });
    let ((), got) = tokio::time::timeout(WAIT, async { tokio::join!(write, read) })
        .await
        .expect("everything arrives");
    got
}

/// Reads while `more` says the bytes so far are not enough; the peer must
/// not close first.
async fn read_while(
    r: &mut (impl AsyncReadExt + Unpin),
    mut more: impl FnMut(&[u8]) -> bool,
) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while more(&got) {
        let n = r.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed after {} bytes", got.len());
        got.extend_from_slice(&buf[..n]);
    }
    got
}

fn data_messages(messages: Vec<WsMessage>) -> Vec<WsMessage> {
    messages
        .into_iter()
        .filter(|m| m.is_text() || m.is_binary())
        .collect()
}

#[tokio::test]
async fn random_frame_streams_pass_both_ways_byte_for_byte_and_decode_as_tungstenite_does() {
    let mut rng = Rng(0xF00D_CAFE_0000_0015);
    for round in 0..12 {
        let from_client = random_stream(&mut rng, true);
        let from_upstream = random_stream(&mut rng, false);
        let mut rig = rig(Seen::default()).await;
        let up_want = data_bytes(&from_client).len();
        let down_want = data_bytes(&from_upstream).len();
        let (c_pings, u_pings) = (
            count(&from_client, opcode::PING),
            count(&from_upstream, opcode::PING),
        );
        // Both directions at once: each peer writes while it reads.
        let (c_got, u_got) = tokio::join!(
            write_and_read(&mut rig.client, &from_client, down_want, c_pings),
            write_and_read(&mut rig.upstream, &from_upstream, up_want, u_pings),
        );

        // Byte for byte: the data frames arrive as they were sent.
        assert_eq!(
            data_bytes(&u_got),
            data_bytes(&from_client),
            "round {round}"
        );
        assert_eq!(
            data_bytes(&c_got),
            data_bytes(&from_upstream),
            "round {round}"
        );
        // And they decode to the messages tungstenite decodes from the input.
        assert_eq!(
            data_messages(reference_messages(u_got.clone(), Role::Server)),
            data_messages(reference_messages(from_client.clone(), Role::Server)),
            "round {round}: client to upstream"
        );
        assert_eq!(
            data_messages(reference_messages(c_got.clone(), Role::Client)),
            data_messages(reference_messages(from_upstream.clone(), Role::Client)),
            "round {round}: upstream to client"
        );
        // Each peer's pings were answered on its own leg, payload for
        // payload, and never forwarded.
        let payloads = |m: Vec<WsMessage>| -> Vec<Vec<u8>> {
            m.into_iter()
                .filter_map(|m| match m {
                    WsMessage::Ping(p) | WsMessage::Pong(p) => Some(p.to_vec()),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(
            payloads(reference_messages(c_got, Role::Client)),
            payloads(reference_messages(from_client, Role::Server)),
            "round {round}: the client's pongs"
        );
        assert_eq!(
            payloads(reference_messages(u_got, Role::Server)),
            payloads(reference_messages(from_upstream, Role::Client)),
            "round {round}: the upstream's pongs"
        );
        let _ = rig.kill.take();
        rig.done.abort();
    }
}

/// Reads until `done` holds for the frames received.
async fn read_until(
    peer: &mut TcpStream,
    done: impl Fn(&[(u8, bool, Vec<u8>)]) -> bool,
) -> Vec<(u8, bool, Vec<u8>)> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    tokio::time::timeout(WAIT, async {
        while !done(&frames_of(&got)) {
            let n = peer.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed after {:?}", frames_of(&got));
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the frames arrive");
    frames_of(&got)
}

fn data_count(frames: &[(u8, bool, Vec<u8>)]) -> usize {
    frames.iter().filter(|(op, ..)| op & 0x8 == 0).count()
}

/// The payload of a whole frame, unmasked.
fn payload(bytes: &[u8]) -> Vec<u8> {
    let h = frame::parse_header(bytes).unwrap().unwrap();
    let mut p = bytes[h.header_len..].to_vec();
    if let Some(m) = h.mask {
        frame::unmask(&mut p, m, 0);
    }
    p
}

fn budget_kill() -> Kill {
    Kill {
        code: 1008,
        reason: "budget exhausted".into(),
        error_event: Some(r#"{"type":"error","error":{"code":"budget_exhausted"}}"#.into()),
        outcome: "budget_exhausted",
    }
}

fn in_flight(id: &str) -> Seen {
    Seen {
        in_flight: Some(id.into()),
        ..Seen::default()
    }
}

#[tokio::test]
async fn a_cancel_waits_until_the_clients_fragmented_message_has_passed() {
    let mut rig = rig(in_flight("resp_1")).await;
    let first = frame(
        false,
        OpCode::Data(Data::Text),
        MASK,
        br#"{"type":"conversation.item.create","#.to_vec(),
    );
    let last = frame(
        true,
        OpCode::Data(Data::Continue),
        MASK,
        br#""item":{"type":"message"}}"#.to_vec(),
    );
    rig.client.write_all(&first).await.unwrap();
    let got = read_until(&mut rig.upstream, |f| data_count(f) == 1).await;
    assert_eq!(got[0].2, first);
    // The session is killed while the client's message is half through.
    rig.kill.take().unwrap().send(budget_kill()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    rig.client.write_all(&last).await.unwrap();
    let got = read_until(&mut rig.upstream, |f| data_count(f) == 2).await;
    assert_eq!(got[0].2, last, "the message ends before anything else");
    assert_eq!(got[1].0, opcode::TEXT);
    assert_eq!(
        payload(&got[1].2),
        cancel_event(Some("resp_1")).into_bytes(),
        "then the cancel, as a message of its own"
    );
    let done = frame(
        true,
        OpCode::Data(Data::Text),
        None,
        br#"{"type":"response.done","response":{"id":"resp_1"}}"#.to_vec(),
    );
    rig.upstream.write_all(&done).await.unwrap();
    let got = read_until(&mut rig.upstream, |f| {
        f.iter().any(|(op, ..)| *op == opcode::CLOSE)
    })
    .await;
    assert_eq!(payload(&got[0].2)[..2], 1000u16.to_be_bytes());
    drop(rig.upstream);
    let (spliced, tap) = tokio::time::timeout(WAIT, rig.done).await.unwrap().unwrap();
    assert_eq!(spliced.end.outcome(), "budget_exhausted");
    assert!(tap.texts.iter().any(|t| t.contains("response.done")));
}

#[tokio::test]
async fn an_error_event_waits_until_the_upstreams_fragmented_message_has_passed() {
    let mut rig = rig(Seen::default()).await;
    let first = frame(
        false,
        OpCode::Data(Data::Text),
        None,
        br#"{"type":"response.output_text.delta","#.to_vec(),
    );
    let last = frame(
        true,
        OpCode::Data(Data::Continue),
        None,
        br#""delta":"hi"}"#.to_vec(),
    );
    rig.upstream.write_all(&first).await.unwrap();
    let got = read_until(&mut rig.client, |f| data_count(f) == 1).await;
    assert_eq!(got[0].2, first);
    rig.kill.take().unwrap().send(budget_kill()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    rig.upstream.write_all(&last).await.unwrap();
    let got = read_until(&mut rig.client, |f| {
        f.iter().any(|(op, ..)| *op == opcode::CLOSE)
    })
    .await;
    let kinds: Vec<u8> = got.iter().map(|(op, ..)| *op).collect();
    assert_eq!(
        kinds,
        [opcode::CONTINUATION, opcode::TEXT, opcode::CLOSE],
        "the message's end, then the error event, then the close"
    );
    assert_eq!(got[0].2, last);
    assert!(String::from_utf8(payload(&got[1].2))
        .unwrap()
        .contains("budget_exhausted"));
    assert_eq!(payload(&got[2].2)[..2], 1008u16.to_be_bytes());
    drop(rig.client);
    drop(rig.upstream);
    let (_, tap) = tokio::time::timeout(WAIT, rig.done).await.unwrap().unwrap();
    assert_eq!(
        tap.texts,
        [r#"{"type":"response.output_text.delta","delta":"hi"}"#],
        "the tap saw the message assembled"
    );
}

#[tokio::test]
async fn a_client_gone_mid_message_has_it_ended_validly_before_the_cancel() {
    let mut rig = rig(in_flight("resp_9")).await;
    // The message stops inside a character: C3 and no continuation byte.
    let first = frame(
        false,
        OpCode::Data(Data::Text),
        MASK,
        [&br#"{"type":"x","text":""#[..], &[0xC3]].concat(),
    );
    rig.client.write_all(&first).await.unwrap();
    read_until(&mut rig.upstream, |f| data_count(f) == 1).await;
    drop(rig.client);
    let got = read_until(&mut rig.upstream, |f| data_count(f) == 2).await;
    assert_eq!((got[0].0, got[0].1), (opcode::CONTINUATION, true));
    assert_eq!(
        payload(&got[0].2),
        [0x80],
        "the character is completed (as U+00C0, the smallest that starts with C3)"
    );
    assert_eq!(
        payload(&got[1].2),
        cancel_event(Some("resp_9")).into_bytes()
    );
    let mut all = first.clone();
    all.extend(got.iter().flat_map(|(.., b)| b.clone()));
    let messages = reference_messages(all, Role::Server);
    assert!(
        matches!(&messages[0], WsMessage::Text(t) if t.as_str() == "{\"type\":\"x\",\"text\":\"\u{c0}"),
        "{messages:?}"
    );
    drop(rig.upstream);
    let (spliced, _) = tokio::time::timeout(WAIT, rig.done).await.unwrap().unwrap();
    assert_eq!(spliced.end, End::ClientGone);
}

/// An unmasked fragment ends the session (1002) without counting as
/// forwarded: the message its masked first fragment opened upstream is
/// ended validly before the cancel, so the upstream still answers the
/// cancel with the `response.done` the turn is billed from.
#[tokio::test]
async fn an_unmasked_last_fragment_is_not_taken_for_the_end_of_the_message() {
    let mut rig = rig(in_flight("resp_3")).await;
    let first = frame(
        false,
        OpCode::Data(Data::Text),
        MASK,
        br#"{"type":"conversation.item.create","#.to_vec(),
    );
    rig.client.write_all(&first).await.unwrap();
    read_until(&mut rig.upstream, |f| data_count(f) == 1).await;
    let unmasked = frame(true, OpCode::Data(Data::Continue), None, b"}".to_vec());
    rig.client.write_all(&unmasked).await.unwrap();
    let got = read_until(&mut rig.upstream, |f| data_count(f) == 2).await;
    assert_eq!((got[0].0, got[0].1), (opcode::CONTINUATION, true));
    assert_ne!(got[0].2, unmasked, "the unmasked frame is not forwarded");
    assert!(
        payload(&got[0].2).is_empty(),
        "the gateway's own, empty end"
    );
    assert_eq!(
        payload(&got[1].2),
        cancel_event(Some("resp_3")).into_bytes()
    );
    drop(rig.client);
    drop(rig.upstream);
    let (spliced, _) = tokio::time::timeout(WAIT, rig.done).await.unwrap().unwrap();
    assert_eq!(spliced.end, End::ClientProtocolError(1002));
}

/// An unmasked first fragment opens nothing upstream: the cancel is the
/// next message there, with no continuation before it.
#[tokio::test]
async fn an_unmasked_first_fragment_opens_no_message_upstream() {
    let mut rig = rig(in_flight("resp_4")).await;
    let unmasked = frame(false, OpCode::Data(Data::Text), None, b"{".to_vec());
    rig.client.write_all(&unmasked).await.unwrap();
    let got = read_until(&mut rig.upstream, |f| data_count(f) == 1).await;
    assert_eq!((got[0].0, got[0].1), (opcode::TEXT, true));
    assert_eq!(
        payload(&got[0].2),
        cancel_event(Some("resp_4")).into_bytes()
    );
    drop(rig.client);
    drop(rig.upstream);
    let (spliced, _) = tokio::time::timeout(WAIT, rig.done).await.unwrap().unwrap();
    assert_eq!(spliced.end, End::ClientProtocolError(1002));
}

/// A kill while both legs are inside a fragmented message, the upstream's
/// turning out to be a `response.created`: the client's message is ended
/// before the cancel that response gets, not cut by it.
#[tokio::test]
async fn a_response_created_by_the_message_forwarded_at_the_end_is_cancelled_between_messages() {
    let mut rig = rig(Seen::default()).await;
    let client_first = frame(
        false,
        OpCode::Data(Data::Text),
        MASK,
        br#"{"type":"conversation.item.create","#.to_vec(),
    );
    rig.client.write_all(&client_first).await.unwrap();
    read_until(&mut rig.upstream, |f| data_count(f) == 1).await;
    let created_first = frame(
        false,
        OpCode::Data(Data::Text),
        None,
        br#"{"type":"response.created","response":{"id":"resp_7""#.to_vec(),
    );
    rig.upstream.write_all(&created_first).await.unwrap();
    read_until(&mut rig.client, |f| data_count(f) == 1).await;
    rig.kill.take().unwrap().send(budget_kill()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let created_last = frame(true, OpCode::Data(Data::Continue), None, b"}}".to_vec());
    rig.upstream.write_all(&created_last).await.unwrap();
    let got = read_until(&mut rig.upstream, |f| data_count(f) == 2).await;
    assert_eq!(
        (got[0].0, got[0].1),
        (opcode::CONTINUATION, true),
        "the client's message is ended first"
    );
    assert_eq!(got[1].0, opcode::TEXT);
    assert_eq!(
        payload(&got[1].2),
        cancel_event(Some("resp_7")).into_bytes()
    );
    drop(rig.client);
    drop(rig.upstream);
    let (spliced, _) = tokio::time::timeout(WAIT, rig.done).await.unwrap().unwrap();
    assert_eq!(spliced.end.outcome(), "budget_exhausted");
}

/// A ping from the upstream with nothing after it is answered at once: its
/// pong, queued on the upstream leg while reading that leg, is written
/// without waiting for another frame to wake the splice.
#[tokio::test]
async fn a_lone_upstream_ping_is_answered() {
    let mut rig = rig(Seen::default()).await;
    let ping = frame(
        true,
        OpCode::Control(Control::Ping),
        None,
        b"are you there".to_vec(),
    );
    rig.upstream.write_all(&ping).await.unwrap();
    let got = read_until(&mut rig.upstream, |f| {
        f.iter().any(|(op, ..)| *op == opcode::PONG)
    })
    .await;
    let pong = got.iter().find(|(op, ..)| *op == opcode::PONG).unwrap();
    assert_eq!(payload(&pong.2), b"are you there");
    rig.done.abort();
}

/// Past the high-water mark towards a client that does not read, the
/// splice stops reading the upstream; once the client reads, everything
/// arrives, in order.
#[tokio::test]
async fn a_client_slower_than_its_upstream_gets_every_byte_in_order() {
    let mut rig = rig(Seen::default()).await;
    let mut sent = Vec::new();
    for i in 0..64u8 {
        sent.extend(frame(
            true,
            OpCode::Data(Data::Binary),
            None,
            vec![i; 32 * 1024],
        ));
    }
    let upstream = &mut rig.upstream;
    let client = &mut rig.client;
    let write = async {
        upstream.write_all(&sent).await.unwrap();
    };
    let read = async {
        // The client reads nothing at first: every buffer on its side fills.
        tokio::time::sleep(Duration::from_millis(300)).await;
        read_while(client, |got| got.len() < sent.len()).await
    };
    let ((), got) = tokio::time::timeout(WAIT, async { tokio::join!(write, read) })
        .await
        .expect("everything arrives");
    assert!(got == sent, "the client got the upstream's bytes as sent");
    rig.done.abort();
}
