//! The load: `n` sessions, `c` at a time, interleaved over the targets.
//!
//! Session `i` goes to target `i mod T`. `c` workers take the next index from
//! one shared counter, so at any moment each target has about `c / T`
//! sessions in flight and every target sees the same machine: the same CPU
//! contention, the same TCP state, the same moment of the run. That is why
//! the report compares targets *within* one run (ratios of medians) rather
//! than across runs, which on a shared machine differ by more than the
//! effects measured here.
//!
//! The load is closed-loop: a worker starts its next session when the
//! previous one has finished (closed or timed out), so `c` is a true
//! concurrency, not an arrival rate.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{header, HeaderName, HeaderValue, Uri};
use patchbay_gateway::secret::Secret;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::session::{self, CloseAt, Endpoint, SessionError, Timings};
use crate::stats::Summary;

/// How often progress is printed to stderr.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Period of the event-loop lag probe.
pub const LAG_PROBE_EVERY: Duration = Duration::from_millis(10);

/// One target, resolved.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    /// The URL sessions open, `?model=` included.
    pub url: String,
    pub endpoint: Endpoint,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("target {name}: invalid URL {url:?}: {message}")]
    Url {
        name: String,
        url: String,
        message: String,
    },
    #[error("target {name}: cannot resolve {host}: {message}")]
    Resolve {
        name: String,
        host: String,
        message: String,
    },
}

/// `url` with `model=` added to its query unless it has one.
pub fn with_model(url: &str, model: &str) -> String {
    let (base, fragment) = url.split_once('#').unwrap_or((url, ""));
    let has_model = base
        .split_once('?')
        .is_some_and(|(_, q)| q.split('&').any(|kv| kv.split('=').next() == Some("model")));
    let mut out = base.to_string();
    if !has_model {
        out.push(if base.contains('?') { '&' } else { '?' });
        out.push_str("model=");
        out.push_str(model);
    }
    if !fragment.is_empty() {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

impl Target {
    /// Resolves the host once (sessions then connect to the address, with no
    /// lookup per connection) and prepares the upgrade headers.
    pub async fn resolve(
        name: &str,
        url: &str,
        key: Option<&Secret>,
        model: &str,
        beta: bool,
    ) -> Result<Self, PlanError> {
        let url = with_model(url, model);
        let bad = |message: String| PlanError::Url {
            name: name.into(),
            url: url.clone(),
            message,
        };
        let uri: Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(e.to_string()))?;
        if uri.scheme_str() != Some("ws") {
            return Err(bad("only ws:// is supported".into()));
        }
        let host = uri
            .host()
            .ok_or_else(|| bad("no host".into()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(80);
        let resolve_err = |message: String| PlanError::Resolve {
            name: name.into(),
            host: host.clone(),
            message,
        };
        let addr: SocketAddr = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| resolve_err(e.to_string()))?
            .next()
            .ok_or_else(|| resolve_err("no address".into()))?;
        let mut headers = Vec::new();
        if let Some(key) = key {
            let mut v = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
                .map_err(|_| bad("the key is not a valid header value".into()))?;
            v.set_sensitive(true);
            headers.push((header::AUTHORIZATION, v));
        }
        if beta {
            headers.push((
                HeaderName::from_static("openai-beta"),
                HeaderValue::from_static("realtime=v1"),
            ));
        }
        Ok(Self {
            name: name.into(),
            url,
            endpoint: Endpoint { addr, uri, headers },
        })
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub targets: Vec<Target>,
    pub sessions: usize,
    pub concurrency: usize,
    /// Bound on one session.
    pub timeout: Duration,
    /// Print progress to stderr.
    pub progress: bool,
    /// When each session closes.
    pub close_at: CloseAt,
}

/// One session's outcome.
#[derive(Debug, Clone)]
pub struct Sample {
    pub index: usize,
    pub target: usize,
    /// When the session started, from the start of the run.
    pub started: Duration,
    pub timings: Timings,
    pub error: Option<SessionError>,
}

#[derive(Debug)]
pub struct RunResult {
    /// Ordered by index.
    pub samples: Vec<Sample>,
    pub wall: Duration,
    /// How late the bench's own runtime ran a ready timer during the run
    /// ([`LAG_PROBE_EVERY`] probe): the delay the bench itself may have
    /// added to any measured phase.
    pub loop_lag: Option<Summary>,
}

/// Wakes every [`LAG_PROBE_EVERY`] and records how late each wake-up was,
/// until `stop` fires (or is dropped).
async fn probe_lag(mut stop: oneshot::Receiver<()>) -> Vec<Duration> {
    let mut tick = tokio::time::interval(LAG_PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut lags = Vec::new();
    loop {
        tokio::select! {
            _ = &mut stop => return lags,
            scheduled = tick.tick() => lags.push(Instant::now().saturating_duration_since(scheduled)),
        }
    }
}

/// Runs the plan to the end: every session finishes or times out.
pub async fn run(plan: Arc<Plan>) -> RunResult {
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let (stop_probe, probe_stop) = oneshot::channel();
    let probe = tokio::spawn(probe_lag(probe_stop));
    let mut workers = JoinSet::new();
    for _ in 0..plan.concurrency.min(plan.sessions) {
        let (plan, next, done) = (plan.clone(), next.clone(), done.clone());
        workers.spawn(async move {
            let mut samples = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= plan.sessions {
                    break;
                }
                let target = index % plan.targets.len();
                let started = start.elapsed();
                let mut timings = Timings::default();
                let deadline = Instant::now() + plan.timeout;
                let error = session::run(
                    &plan.targets[target].endpoint,
                    deadline,
                    plan.close_at,
                    &mut timings,
                )
                .await
                .err();
                samples.push(Sample {
                    index,
                    target,
                    started,
                    timings,
                    error,
                });
                done.fetch_add(1, Ordering::Relaxed);
            }
            samples
        });
    }
    let progress = plan.progress.then(|| {
        let (done, total) = (done.clone(), plan.sessions);
        spawn_progress(start, move || {
            format!("{}/{total} sessions done", done.load(Ordering::Relaxed))
        })
    });
    let mut samples = Vec::with_capacity(plan.sessions);
    while let Some(r) = workers.join_next().await {
        // A worker only ends by returning its samples; a panic is a bug here.
        match r {
            Ok(s) => samples.extend(s),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    let wall = start.elapsed();
    if let Some(p) = progress {
        p.abort();
    }
    let _ = stop_probe.send(());
    let mut lags = probe.await.unwrap_or_default();
    samples.sort_unstable_by_key(|s| s.index);
    RunResult {
        samples,
        wall,
        loop_lag: Summary::of(&mut lags),
    }
}

/// CPU time (user, system) this process has used so far, and its peak RSS
/// in KiB.
pub fn cpu_usage() -> (Duration, Duration, u64) {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a full `rusage` into the pointer it is given;
    // RUSAGE_SELF is always valid, so it cannot fail.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime), ru.ru_maxrss as u64)
}

/// Time this process's threads have spent on a CPU and runnable but
/// waiting for one (the kernel's `schedstat`, summed over threads); `None`
/// where the kernel does not expose it. The wait separates "the bench was
/// busy" from "the machine did not run the bench".
pub fn sched_times() -> Option<(Duration, Duration)> {
    let mut on_cpu = 0;
    let mut waiting = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        // A thread that exited since the listing has no schedstat any more;
        // its time is gone from the process's total either way.
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        let (c, w) = parse_schedstat(&text)?;
        on_cpu += c;
        waiting += w;
    }
    Some((Duration::from_nanos(on_cpu), Duration::from_nanos(waiting)))
}

/// `on-CPU ns, run-queue wait ns, timeslices` → the first two.
pub fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut f = text.split_whitespace().map(str::parse::<u64>);
    Some((f.next()?.ok()?, f.next()?.ok()?))
}

/// Prints `  <seconds> s  <line()>` to stderr every [`PROGRESS_EVERY`]
/// after the first, until the task is aborted.
pub fn spawn_progress(
    start: Instant,
    line: impl Fn() -> String + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tick.tick().await;
        loop {
            tick.tick().await;
            eprintln!("  {:>6.1} s  {}", start.elapsed().as_secs_f64(), line());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_cpu_and_wait() {
        assert_eq!(parse_schedstat("570148 2500 1\n"), Some((570148, 2500)));
        assert_eq!(parse_schedstat("570148"), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
        assert!(sched_times().is_some_and(|(cpu, _)| !cpu.is_zero()));
    }

    #[test]
    fn model_is_added_to_the_query_once() {
        assert_eq!(
            with_model("ws://h:1/v1/realtime", "gpt-realtime"),
            "ws://h:1/v1/realtime?model=gpt-realtime"
        );
        assert_eq!(
            with_model("ws://h:1/openai/realtime?api-version=x", "m"),
            "ws://h:1/openai/realtime?api-version=x&model=m"
        );
        assert_eq!(
            with_model("ws://h:1/v1/realtime?model=other", "m"),
            "ws://h:1/v1/realtime?model=other"
        );
        assert_eq!(
            with_model("ws://h:1/v1/realtime?modelx=1", "m"),
            "ws://h:1/v1/realtime?modelx=1&model=m"
        );
    }

    #[tokio::test]
    async fn target_resolves_to_an_address_with_its_headers() {
        let key = Secret::new("pb-key");
        let t = Target::resolve(
            "gw",
            "ws://127.0.0.1:8080/v1/realtime",
            Some(&key),
            "m",
            true,
        )
        .await
        .unwrap();
        assert_eq!(t.endpoint.addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(t.url, "ws://127.0.0.1:8080/v1/realtime?model=m");
        let names: Vec<_> = t.endpoint.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["authorization", "openai-beta"]);
        assert_eq!(t.endpoint.headers[0].1, "Bearer pb-key");
        assert!(
            !format!("{t:?}").contains("pb-key"),
            "the key is not printed"
        );
    }

    #[tokio::test]
    async fn target_without_a_port_uses_80() {
        let t = Target::resolve("a", "ws://127.0.0.1/v1/realtime", None, "m", false)
            .await
            .unwrap();
        assert_eq!(t.endpoint.addr.port(), 80);
        assert!(t.endpoint.headers.is_empty());
    }
}
