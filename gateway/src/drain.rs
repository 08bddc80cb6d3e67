//! Shutdown: the signal, and the drain sequence.
//!
//! A session outlives the HTTP request that opened it, so the process tracks
//! sessions itself: every session task is tracked by the gateway's
//! `TaskTracker` from admission, before the 101 (its meter runs inside it,
//! or in a tracked task of its own when its final flush waits on the
//! store), and
//! every session selects on the gateway's `CancellationToken`. On SIGTERM,
//! SIGINT (Ctrl-C), SIGHUP or SIGQUIT ([`shutdown_signal`]):
//! 1. admission refuses new upgrades with 503 (the listener keeps accepting
//!    so clients get that answer, not a refused connection) and `/readyz`
//!    fails at once; pooled upstream sockets are closed;
//! 2. `close` mode: every session is told to close now: its client gets
//!    close 1001 (going away, so SDKs reconnect elsewhere), its upstream leg
//!    is closed, its meter runs its final flush. `linger` mode: live
//!    sessions run on until they end or `linger_secs` pass, then close the
//!    same way;
//! 3. the process waits up to `[drain] wait_secs` for the tracked tasks
//!    (each meter's final flush included), and, within the same
//!    `wait_secs`, for the request-log rows still queued for stdout and the
//!    store writes still in the outbox (Redis slow or down), then exits 0;
//!    anything still running or waiting is reported as a warning (rows and
//!    writes still waiting then are lost with the process).
//!
//! Which signals drain and which are ignored, and why: `SIGNALS`.
//!
//! In Kubernetes: preStop sleep (endpoints are removed meanwhile) → SIGTERM
//! → drain (≤ linger_secs + wait_secs) → exit, all inside
//! `terminationGracePeriodSeconds`.

use std::time::Duration;

#[cfg(unix)]
use tokio::signal::unix::SignalKind;

use crate::config::DrainMode;
use crate::gateway::Gateway;

/// What a caught signal does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnSignal {
    /// Start the drain.
    Drain,
    /// Log it and carry on.
    Ignore,
}

/// The signals the gateway catches, and what each does. Every one of them
/// would otherwise end the process at once, with sessions mid-response: no
/// 1001 for their clients, no rows for their turns.
///
/// - SIGTERM (Kubernetes, `docker stop`, systemd, `kill`), SIGINT (Ctrl-C),
///   SIGHUP (the terminal, SSH or tmux session it ran in was closed) and
///   SIGQUIT (`Ctrl-\`, and the stop signal of images and supervisors that
///   use it for a graceful stop, as nginx's image does) all drain, the same
///   way: whoever sends one means "stop".
/// - SIGUSR1 and SIGUSR2 are logged and ignored: by convention they ask a
///   running program for something (reopen its logs, dump its state), never
///   to stop, so one sent by habit or by a log rotator must not end every
///   live call. A supervisor configured to stop with one gets a warning
///   line naming the signal, and kills the process after its own timeout.
///
/// Left at their defaults: SIGKILL and SIGSTOP (uncatchable), the faults
/// (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT: the process cannot go on),
/// SIGPIPE (ignored by the Rust runtime), and the timer and limit signals
/// (SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU, SIGXFSZ), which no runtime or
/// shell sends to stop a process.
#[cfg(unix)]
pub const SIGNALS: [(&str, SignalKind, OnSignal); 6] = [
    ("SIGTERM", SignalKind::terminate(), OnSignal::Drain),
    ("SIGINT", SignalKind::interrupt(), OnSignal::Drain),
    ("SIGHUP", SignalKind::hangup(), OnSignal::Drain),
    ("SIGQUIT", SignalKind::quit(), OnSignal::Drain),
    ("SIGUSR1", SignalKind::user_defined1(), OnSignal::Ignore),
    ("SIGUSR2", SignalKind::user_defined2(), OnSignal::Ignore),
];

/// Resolves on the first signal of `SIGNALS` that drains, logging which
/// one arrived; logs and ignores the others. Every handler stays installed
/// for the life of the process (so a second signal during the drain does
/// not kill it).
pub async fn shutdown_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut streams = SIGNALS
            .iter()
            .map(|&(name, kind, on)| Ok((name, on, tokio::signal::unix::signal(kind)?)))
            .collect::<std::io::Result<Vec<_>>>()?;
        let named = |what: OnSignal| {
            let names: Vec<&str> = SIGNALS
                .iter()
                .filter(|s| s.2 == what)
                .map(|s| s.0)
                .collect();
            names.join(" ")
        };
        tracing::debug!(
            drain = %named(OnSignal::Drain),
            ignore = %named(OnSignal::Ignore),
            "listening for signals"
        );
        loop {
            let (name, on) = std::future::poll_fn(|cx| {
                for (name, on, stream) in &mut streams {
                    if stream.poll_recv(cx).is_ready() {
                        return std::task::Poll::Ready((*name, *on));
                    }
                }
                std::task::Poll::Pending
            })
            .await;
            match on {
                OnSignal::Drain => {
                    tracing::info!(signal = name, "{name} received: draining");
                    return Ok(());
                }
                OnSignal::Ignore => tracing::warn!(
                    signal = name,
                    "{name} received: ignored (SIGTERM, SIGINT, SIGHUP and SIGQUIT drain the gateway)"
                ),
            }
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await?;
        tracing::info!(signal = "ctrl-c", "ctrl-c received: draining");
        Ok(())
    }
}

/// The longest the drain waits for queued telemetry to be exported.
pub const TELEMETRY_FLUSH: Duration = Duration::from_secs(2);

/// Runs the drain sequence and returns when every session ended or the
/// wait ran out.
pub async fn drain(gw: &Gateway) {
    let wait = Duration::from_secs(gw.config.drain.wait_secs);
    tracing::info!(
        active = gw.sessions.active(),
        mode = ?gw.config.drain.mode,
        wait_secs = wait.as_secs(),
        "draining"
    );
    gw.sessions.start_draining();
    gw.draining.cancel();
    gw.tasks.close();
    if gw.config.drain.mode == DrainMode::Linger {
        let linger = Duration::from_secs(gw.config.drain.linger_secs);
        if tokio::time::timeout(linger, gw.tasks.wait()).await.is_ok() {
            tracing::info!("every session ended while lingering");
        }
    }
    gw.shutdown.cancel();
    let deadline = tokio::time::Instant::now() + wait;
    if tokio::time::timeout_at(deadline, gw.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            still_running = gw.tasks.len(),
            "drain wait ran out with tasks still running"
        );
    }
    match gw.metering.settle(deadline).await {
        (0, 0) => tracing::info!("drained"),
        (rows, writes) => tracing::warn!(
            rows_not_written = rows,
            store_writes_not_replayed = writes,
            "drain wait ran out before every request-log row and store write was out"
        ),
    }
    // The last turns' spans and the sessions' `.ended` events, exported
    // once more within a bound.
    gw.telemetry.flush(TELEMETRY_FLUSH).await;
    // The sessions just closed free their fleet slots now rather than when
    // their leases expire: one store call, its wait for a renewal in
    // flight included.
    if let Some(leases) = &gw.leases {
        match tokio::time::timeout(
            crate::store::CALL_TIMEOUT,
            leases.send_removals(std::time::Instant::now()),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not release session leases; they expire on their own")
            }
            Err(_) => {
                tracing::warn!("releasing session leases timed out; they expire on their own")
            }
        }
    }
}
