//! Shutdown: the signal, and the drain sequence.
//!
//! A session outlives the HTTP request that opened it, so the process must
//! track sessions itself: every session task is spawned on the gateway's
//! `TaskTracker` at admission (before the 101), and every session selects on
//! the gateway's `CancellationToken`. On SIGTERM or Ctrl-C:
//! 1. admission starts refusing (503) and `/readyz` fails at once;
//! 2. the token is cancelled: each session sends its client close 1001 (so
//!    SDKs reconnect elsewhere) and closes its upstream leg;
//! 3. the process waits up to `[drain] wait_secs` for the tracked tasks,
//!    then returns; a task still running is reported as a warning.

use std::time::Duration;

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
        wait_secs = wait.as_secs(),
        "draining"
    );
    gw.sessions.start_draining();
    gw.shutdown.cancel();
    gw.tasks.close();
    if tokio::time::timeout(wait, gw.tasks.wait()).await.is_err() {
        tracing::warn!(
            still_running = gw.tasks.len(),
            "drain wait ran out with sessions still running"
        );
    } else {
        tracing::info!("drained");
    }
}
