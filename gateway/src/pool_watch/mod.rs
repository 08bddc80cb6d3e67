//! The pool size, watched through the Kubernetes API (`[pool]
//! size_configmap`): a new size reaches the pools the moment the operator
//! writes it, rather than at the kubelet's next sync of the mounted size
//! file (60–90 s).
//!
//! The pod's ServiceAccount is granted `get`, `list` and `watch` on that
//! one ConfigMap (`resourceNames`), and nothing else. The task GETs it,
//! applies `data.REALTIME_POOL_SIZE` exactly as the size file is applied
//! ([`crate::reload::apply_pool_size`]: parsed, capped at `[pool]
//! max_size`, set on every route's pools), then watches it (a list/watch
//! with a `metadata.name` field selector, from the GET's resourceVersion,
//! bookmarks on, [`event::WATCH_TIMEOUT_SECS`] per watch): `ADDED` and
//! `MODIFIED` apply, `BOOKMARK` moves the resourceVersion, `DELETED` keeps
//! the current size, an `ERROR` 410 (the resourceVersion is too old)
//! starts over with a GET. A watch the API server ends is resumed from
//! its last resourceVersion on a new connection.
//!
//! Failure mode: any other failure (cannot connect, TLS refused, 401/403,
//! a stream idle past its bound, a line over 1 MiB) closes the connection
//! and retries after a capped exponential backoff (1 s doubling to 30 s,
//! jittered), then GETs afresh. Meanwhile the pod keeps its current size,
//! and the mounted size file (`[pool] size_file`, the durable source)
//! still brings the new one at the kubelet's next sync. While the watch is
//! open and its value applied, that file is only checked, not applied: it
//! is an older copy of the same ConfigMap. A malformed or missing value is
//! ignored with a warning and counted in
//! `patchbay_config_reloads_total{file="pool_configmap",result="rejected"}`.
//! Connection failures warn once, then at most once a minute.
//!
//! Metrics: `patchbay_pool_size_watch_up` (1 while a watch is open),
//! `patchbay_pool_size_updates_total{source}` (from `reload`) and each
//! pool's `patchbay_pool_target_sockets`. The task stops when draining
//! starts.

pub mod event;
pub mod kube;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::gateway::Gateway;
use crate::metrics::ReloadLabels;
use crate::reload::{apply_pool_size, SizeSource};
use event::{get_path, parse_configmap, parse_event, watch_path, Backoff, Event, Seen, WarnGate};
use kube::{InCluster, KubeError};

/// How long a watch stream may stay silent before it is deemed dead: a bit
/// over its `timeoutSeconds`, after which the API server ends it anyway.
pub const WATCH_IDLE: Duration = Duration::from_secs(event::WATCH_TIMEOUT_SECS + 30);

/// Starts the watch when `[pool] size_configmap` is set and the pod is in
/// a cluster (or the environment says where one is); otherwise warns and
/// leaves the size to the file.
pub fn spawn(gw: &Arc<Gateway>) {
    let Some(name) = gw.config.pool.size_configmap.clone() else {
        return;
    };
    let cluster = match InCluster::from_env(&|k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(configmap = %name, error = %e,
                "the pool size ConfigMap cannot be watched; the size file alone resizes the pool");
            return;
        }
    };
    let watcher = Watcher {
        gw: gw.clone(),
        path: get_path(&cluster.namespace, &name),
        name,
        cluster,
        last_text: None,
    };
    tokio::spawn(watcher.run());
}

/// How one connection's watch ended without a failure.
enum Ended {
    /// The API server closed the stream: resume from this resourceVersion.
    Resume(String),
    /// 410 Gone: GET again.
    Expired,
}

struct Watcher {
    gw: Arc<Gateway>,
    cluster: InCluster,
    name: String,
    path: String,
    /// The last size text received, so a repeat is not counted again.
    last_text: Option<Option<String>>,
}

impl Watcher {
    async fn run(mut self) {
        let draining = self.gw.draining.clone();
        let mut backoff = Backoff::default();
        let mut gate = WarnGate::default();
        let mut resume = None;
        tracing::info!(configmap = %self.name, namespace = %self.cluster.namespace,
            server = %self.cluster.server(), "watching the pool size ConfigMap");
        loop {
            let result = tokio::select! {
                () = draining.cancelled() => break,
                r = self.once(resume.take(), &mut backoff, &mut gate) => r,
            };
            self.set_up(false);
            let pause = match result {
                // The size applied stays current: the next watch resumes
                // where this one ended.
                Ok(Ended::Resume(rv)) => {
                    resume = Some(rv);
                    continue;
                }
                // A pause, in case an API server answered 410 at once.
                Ok(Ended::Expired) => backoff.failed(jitter()),
                Err(e) => {
                    self.gw.pool_size_watched.store(false, Ordering::Release);
                    let pause = backoff.failed(jitter());
                    if let Some(quiet) = gate.failed(Instant::now()) {
                        tracing::warn!(configmap = %self.name, server = %self.cluster.server(),
                            error = %e, retry_in = ?pause, failures_not_logged = quiet,
                            "cannot watch the pool size ConfigMap; the pool keeps its size \
                             (the mounted size file still brings changes)");
                    }
                    pause
                }
            };
            tokio::select! {
                () = draining.cancelled() => break,
                () = tokio::time::sleep(pause) => {}
            }
        }
        self.set_up(false);
        self.gw.pool_size_watched.store(false, Ordering::Release);
    }

    /// One connection: a GET unless resuming, then one watch to its end.
    async fn once(
        &mut self,
        resume: Option<String>,
        backoff: &mut Backoff,
        gate: &mut WarnGate,
    ) -> Result<Ended, KubeError> {
        let mut conn = self.cluster.connect().await?;
        let mut rv = match resume {
            Some(rv) => rv,
            None => {
                let body = conn.get(&self.path).await?;
                let seen = parse_configmap(&body).map_err(KubeError::Invalid)?;
                self.apply(&seen);
                seen.resource_version
            }
        };
        let path = watch_path(&self.cluster.namespace, &self.name, &rv);
        let mut watch = conn.watch(&path, WATCH_IDLE).await?;
        self.set_up(true);
        backoff.reset();
        if gate.recovered() {
            tracing::info!(configmap = %self.name, "watching the pool size ConfigMap again");
        }
        while let Some(line) = watch.next_line().await? {
            match parse_event(&line).map_err(KubeError::Invalid)? {
                Event::Changed(seen) => {
                    self.apply(&seen);
                    rv = seen.resource_version;
                }
                Event::Bookmark { resource_version } => rv = resource_version,
                Event::Deleted { resource_version } => {
                    tracing::warn!(configmap = %self.name,
                        "the pool size ConfigMap was deleted; the pool keeps its size");
                    self.gw.pool_size_watched.store(false, Ordering::Release);
                    rv = resource_version;
                }
                Event::Expired => return Ok(Ended::Expired),
                Event::Error { code, message } => {
                    return Err(KubeError::Invalid(format!(
                        "the watch answered an error {code}: {message}"
                    )))
                }
            }
        }
        Ok(Ended::Resume(rv))
    }

    /// Applies a size the API server sent; a missing or malformed one is
    /// ignored with a warning (once per distinct value).
    fn apply(&mut self, seen: &Seen) {
        let result = match &seen.size {
            Some(text) => apply_pool_size(&self.gw, text, SizeSource::ConfigMap),
            None => Err(format!("no {} key", event::SIZE_KEY)),
        };
        self.gw
            .pool_size_watched
            .store(result.is_ok(), Ordering::Release);
        if self.last_text.as_ref() == Some(&seen.size) {
            return;
        }
        self.last_text = Some(seen.size.clone());
        let label = if result.is_ok() {
            "applied"
        } else {
            "rejected"
        };
        self.gw
            .metrics
            .config_reloads
            .get_or_create(&ReloadLabels {
                file: "pool_configmap".into(),
                result: label.into(),
            })
            .inc();
        if let Err(e) = result {
            tracing::warn!(configmap = %self.name, error = %e,
                "the pool size ConfigMap holds no valid size; the pool keeps its size");
        }
    }

    fn set_up(&self, up: bool) {
        self.gw.metrics.pool_size_watch_up.set(i64::from(up));
    }
}

/// Uniform in `[0, 1)`.
fn jitter() -> f64 {
    (crate::ids::random_u64() >> 11) as f64 / (1u64 << 53) as f64
}
