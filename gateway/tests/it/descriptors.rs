//! A gateway process short of file descriptors: it raises its soft limit
//! to the hard one at start (and says so), warns when `max_sessions` cannot
//! fit, and while accepts fail with `EMFILE` its `/readyz` answers 503,
//! back to 200 once connections close.

use std::os::unix::process::CommandExt;
use std::time::Duration;

use patchbay_sim::SimConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

/// The child's limits: the soft one it starts with, the hard one it may
/// raise it to.
const SOFT: libc::rlim_t = 40;
const HARD: libc::rlim_t = 64;

/// Starts the gateway binary with `RLIMIT_NOFILE` at [`SOFT`]/[`HARD`].
async fn short_of_descriptors(sim: &patchbay_sim::SimHandle) -> Child {
    Child::start_configured(
        &sim.url(false),
        "",
        &[("RUST_LOG", "info")],
        Stderr::Collected,
        |cmd| {
            // SAFETY: between fork and exec only setrlimit (async-signal-
            // safe) runs, on a value built before the fork.
            unsafe {
                cmd.pre_exec(|| {
                    let limit = libc::rlimit {
                        rlim_cur: SOFT,
                        rlim_max: HARD,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        },
    )
    .await
}

/// `GET /readyz` on a kept-alive admin connection (a new one could not be
/// accepted while descriptors are out): its status.
async fn readyz(admin: &mut TcpStream) -> u16 {
    admin
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 1024];
        let n = tokio::time::timeout(WAIT, admin.read(&mut chunk))
            .await
            .expect("/readyz answers")
            .unwrap();
        assert!(n > 0, "the admin connection closed");
        buf.extend_from_slice(&chunk[..n]);
        // Both answers end with a newline-terminated one-line body.
        let text = String::from_utf8_lossy(&buf);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            if body.ends_with('\n') {
                return head.split_whitespace().nth(1).unwrap().parse().unwrap();
            }
        }
    }
}

#[tokio::test]
async fn out_of_descriptors_readyz_answers_503_until_connections_close() {
    let sim = sim(SimConfig::default()).await;
    let child = short_of_descriptors(&sim).await;
    // Log lines leave in batches: wait for start-up's.
    let started = || child.logs().contains("gateway listening");
    assert!(eventually(started).await, "{}", child.logs());
    let logs = child.logs();
    let raised = logs
        .lines()
        .find(|l| l.contains("RLIMIT_NOFILE"))
        .unwrap_or_else(|| panic!("no line about the limit: {logs}"));
    assert!(
        raised.contains(&format!("soft_before={SOFT}")) && raised.contains(&format!("hard={HARD}")),
        "{raised}"
    );
    assert!(
        logs.lines()
            .any(|l| l.contains("WARN") && l.contains("max_sessions")),
        "a warning that max_sessions cannot fit: {logs}"
    );

    let mut admin = TcpStream::connect(child.admin_addr).await.unwrap();
    assert_eq!(readyz(&mut admin).await, 200);
    // Connections that send nothing each hold a descriptor (for the
    // 5-s head timeout) until accepts fail.
    let mut held = Vec::new();
    let mut saw_503 = false;
    for _ in 0..HARD {
        held.push(TcpStream::connect(child.addr).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
        if readyz(&mut admin).await == 503 {
            saw_503 = true;
            break;
        }
    }
    assert!(
        saw_503,
        "accepts never failed with {} connections",
        held.len()
    );
    let said = || child.logs().lines().any(|l| l.contains("accept failed"));
    assert!(eventually(said).await, "{}", child.logs());
    drop(held);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if readyz(&mut admin).await == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still not ready after the connections closed: {}",
            child.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens a session in a task of its own: it may wait in the gateway's
/// accept queue.
fn open_session(addr: std::net::SocketAddr) -> tokio::task::JoinHandle<Client> {
    tokio::spawn(async move {
        let bearer = format!("Bearer {CLIENT_KEY}");
        let query = format!("?model={MODEL}");
        connect_with(addr, &query, &[("authorization", &bearer)])
            .await
            .expect("upgraded")
            .0
    })
}

#[tokio::test]
async fn a_session_without_a_descriptor_for_its_upstream_is_told_the_gateway_is_busy() {
    let sim = sim(SimConfig::default()).await;
    let child = short_of_descriptors(&sim).await;
    // A kept-alive connection holding one descriptor, let go when no
    // descriptor is left for the next client at all.
    let mut spare = TcpStream::connect(child.addr).await.unwrap();
    spare
        .write_all(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 512];
    let n = tokio::time::timeout(WAIT, spare.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 404"));
    let mut spare = Some(spare);
    // Sessions hold two descriptors each, until one is accepted with a
    // single descriptor left: its upstream cannot get a socket.
    let mut live = Vec::new();
    for _ in 0..HARD {
        let mut opening = open_session(child.addr);
        let mut ws = match tokio::time::timeout(Duration::from_secs(2), &mut opening).await {
            Ok(ws) => ws.unwrap(),
            Err(_) => {
                // Not even accepted: freeing one descriptor lets it in,
                // with none left for its upstream.
                drop(spare.take().expect("waited in the queue only once"));
                opening.await.unwrap()
            }
        };
        let first = recv_text(&mut ws).await;
        if kind(&first) == "session.created" {
            live.push(ws);
            continue;
        }
        let event: serde_json::Value = serde_json::from_str(&first).unwrap();
        assert_eq!(event["error"]["code"], "server_busy", "{first}");
        assert_eq!(event["error"]["type"], "server_error", "{first}");
        let (_, code, _) = until_close(&mut ws).await;
        assert_eq!(code, Some(1013), "try again later");
        let said = || {
            child
                .logs()
                .contains("the gateway is out of file descriptors")
        };
        assert!(eventually(said).await, "{}", child.logs());
        return;
    }
    panic!("{} sessions opened and none ran short", live.len());
}
