//! Watching a file for content changes by polling: the files the gateway
//! re-reads live (the pool size file, the keys file, the config's prices)
//! are ConfigMap or Secret mounts in Kubernetes, whose updates arrive as
//! symlink swaps that inotify-style watchers easily miss; a read every few
//! seconds sees them all and costs nothing.
//!
//! There is no baseline: the first poll hands the file to `apply` even if it
//! is what was loaded at start, so an edit made before the watcher first
//! ran is never missed (`apply` must be idempotent). A read failure is
//! logged once until the file is readable again, and keeps what is loaded.

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Calls `apply` with the file's text whenever it changed, every `poll`,
/// until `stop`.
pub async fn on_change(
    path: PathBuf,
    what: &'static str,
    poll: Duration,
    stop: CancellationToken,
    mut apply: impl FnMut(&str),
) {
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last_text: Option<String> = None;
    let mut unreadable = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let text = match tokio::fs::read_to_string(&path).await {
            Ok(t) => t,
            Err(e) => {
                if !unreadable {
                    tracing::warn!(file = %path.display(), error = %e, "cannot read the {what}; keeping what is loaded");
                }
                unreadable = true;
                continue;
            }
        };
        unreadable = false;
        if last_text.as_deref() != Some(text.as_str()) {
            apply(&text);
            last_text = Some(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn applies_the_first_content_then_each_change_once() {
        let path = std::env::temp_dir().join(format!("patchbay-watch-{}", crate::ids::short_id()));
        std::fs::write(&path, "a").unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let s = seen.clone();
        let task = tokio::spawn(on_change(
            path.clone(),
            "test file",
            Duration::from_millis(10),
            stop.clone(),
            move |t| s.lock().unwrap().push(t.to_string()),
        ));
        tokio::time::sleep(Duration::from_millis(60)).await;
        std::fs::write(&path, "b").unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        std::fs::remove_file(&path).unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        stop.cancel();
        task.await.unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            vec!["a".to_string(), "b".to_string()]
        );
    }
}
