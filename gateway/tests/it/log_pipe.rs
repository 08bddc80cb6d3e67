//! A stalled log collector never stalls the relays: the real binary with
//! pipes nobody reads keeps completing every session it is given. Log lines
//! go through a bounded queue to a writer thread and are dropped and
//! counted (`patchbay_log_lines_dropped_total`) once the queue is full.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::*;
use patchbay_sim::SimConfig;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

/// A short log queue, so that a few hundred sessions fill it.
const QUEUE_LINES: &str = "64";
/// Sessions run at once.
const CONCURRENCY: usize = 4;
/// Sessions that certainly write more than a 64 KiB pipe holds, on either
/// stream: every session ends with a log line and a request-log row of
/// well over 64 bytes each.
const PIPE_FILLING_SESSIONS: u64 = 1024;

/// One session with a turn and a close handshake, all within [`WAIT`].
async fn session(addr: SocketAddr) {
    let done = async {
        let mut ws = connect(addr).await;
        assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
        assert_eq!(
            kind(one_turn(&mut ws).await.last().unwrap()),
            "response.done"
        );
        ws.close(Some(CloseFrame {
            code: 1000.into(),
            reason: "".into(),
        }))
        .await
        .expect("close sent");
        let (_, code, _) = until_close(&mut ws).await;
        assert_eq!(code, Some(1000));
    };
    tokio::time::timeout(WAIT, done)
        .await
        .expect("a session completes in time while nobody reads the gateway's output");
}

/// [`CONCURRENCY`] sessions at once; returns how many completed (all of
/// them: any session that does not complete fails the test).
async fn batch(addr: SocketAddr) -> u64 {
    let sessions: Vec<_> = (0..CONCURRENCY)
        .map(|_| tokio::spawn(session(addr)))
        .collect();
    for s in sessions {
        s.await.expect("the session task");
    }
    CONCURRENCY as u64
}

async fn lines_dropped(child: &Child) -> f64 {
    metric(child.admin_addr, "patchbay_log_lines_dropped_total", "").await
}

/// The log-line half on its own: stdout is drained, stderr is not read.
#[tokio::test]
async fn unread_stderr_drops_and_counts_log_lines_and_sessions_carry_on() {
    let sim = sim(SimConfig::default()).await;
    let mut child = Child::start_with(
        &sim.url(false),
        "",
        &[
            ("RUST_LOG", "trace"),
            ("PATCHBAY_LOG_QUEUE_LINES", QUEUE_LINES),
        ],
        Stderr::Unread,
    )
    .await;
    let mut stdout = child.process.stdout.take().unwrap();
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    assert_eq!(lines_dropped(&child).await, 0.0);

    // Until stderr's pipe and the queue are full and lines are dropped.
    let mut completed = 0;
    while lines_dropped(&child).await == 0.0 {
        assert!(
            completed < 4 * PIPE_FILLING_SESSIONS,
            "no log line dropped after {completed} sessions: stderr never filled"
        );
        completed += batch(child.addr).await;
    }
    let dropped = lines_dropped(&child).await;
    // Then more sessions, each completing, while lines keep being dropped.
    for _ in 0..16 {
        batch(child.addr).await;
    }
    assert!(lines_dropped(&child).await > dropped);
    // The exit's flush is bounded: a stalled stderr does not hang it.
    child.sigterm();
    assert_eq!(child.wait_exit(WAIT).await.0, Some(0));
}

/// The scenario: neither stdout (request-log rows) nor stderr (log
/// lines) is read, for 30 s of sessions with turns.
#[tokio::test]
async fn gateway_whose_stdout_and_stderr_nobody_reads_keeps_completing_sessions_for_30_s() {
    const RUN: Duration = Duration::from_secs(30);
    let sim = sim(SimConfig::default()).await;
    // Nobody reads stdout either: the drain waits its `wait_secs` for the
    // rows queued there, then exits 0 all the same.
    let mut child = Child::start_with(
        &sim.url(false),
        "[drain]\nwait_secs = 2\n",
        &[
            ("RUST_LOG", "debug"),
            ("PATCHBAY_LOG_QUEUE_LINES", QUEUE_LINES),
        ],
        Stderr::Unread,
    )
    .await;
    let started = Instant::now();
    let mut completed = 0;
    while started.elapsed() < RUN || completed < PIPE_FILLING_SESSIONS {
        completed += batch(child.addr).await;
    }
    assert!(
        lines_dropped(&child).await > 0.0,
        "stderr never filled in {completed} sessions"
    );
    child.sigterm();
    assert_eq!(child.wait_exit(WAIT).await.0, Some(0));
}
