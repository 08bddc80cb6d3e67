//! Shutdown: the signal, and the drain sequence.
//!
//! A session outlives the HTTP request that opened it, so the process tracks
//! sessions itself: every session task is tracked by the gateway's
//! `TaskTracker` from admission, before the 101 (its meter runs inside it,
//! or in a tracked task of its own when its final flush waits on the
//! store), and
//! every session selects on the gateway's `CancellationToken`. On SIGTERM or
//! Ctrl-C:
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
//! In Kubernetes: preStop sleep (endpoints are removed meanwhile) → SIGTERM
//! → drain (≤ linger_secs + wait_secs) → exit, all inside
//! `terminationGracePeriodSeconds`.

use std::time::Duration;

use crate::config::DrainMode;
use crate::gateway::Gateway;

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => {}
            r = tokio::signal::ctrl_c() => r?,
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}

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
