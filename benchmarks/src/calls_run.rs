//! The calls mode's load: `N` calls at once per target, all targets
//! interleaved in one run, and the figures each target's calls produced.
//! With `--translation` each "call" is a translation session
//! ([`crate::translation`]) and the same accounting gives CPU per
//! session-minute.
//!
//! Call `i` goes to target `i mod T` and starts at `i / (N·T)` of the ramp,
//! so every target's calls start spread over the same ramp and run in the
//! same window: the same machine, the same moment, as the session mode's
//! interleaving. With `--rotate R` the targets take turns instead
//! ([`waves`]): N calls of one target alone on the machine, then the next
//! target's, for R rounds, each target's figures pooled over its rounds
//! (frame latency at N calls on the machine, not N per target). A call that
//! fails is not restarted (its slot stays empty for the rest of its wave),
//! so "every call completed" is a fact about the whole window.
//!
//! Each process named with `--cpu-pid` has its CPU and memory read before
//! the first call starts and after the last ends ([`process`]); its CPU is
//! reported per call-minute (the sum of its target's calls' live time), its
//! memory as the peak RSS over the RSS before, per call of its target live
//! at once (N).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::args::Cli;
use crate::calls::{self, CallRecord, CallShape};
use crate::process::{self, Usage};
use crate::run::{self, PlanError, Target};
use crate::translation;

/// Percentiles of one direction's transit times, in ns (nearest rank).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Transit {
    pub frames: usize,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
}

impl Transit {
    /// Sorts `ns` and summarises it; `None` when empty.
    pub fn of(ns: &mut [u64]) -> Option<Self> {
        if ns.is_empty() {
            return None;
        }
        ns.sort_unstable();
        // Rank ceil(‰ × n / 1000) in integers: 99.9 / 100 as a float is
        // 0.9990000000000001, which would round p99.9 of 1000 up to the max.
        let at = |per_mille: usize| {
            let rank = (per_mille * ns.len()).div_ceil(1000);
            ns[rank.clamp(1, ns.len()) - 1]
        };
        Some(Self {
            frames: ns.len(),
            p50_ns: at(500),
            p99_ns: at(990),
            p999_ns: at(999),
            max_ns: *ns.last()?,
        })
    }
}

/// One target's calls.
#[derive(Debug, Clone, Default)]
pub struct TargetCalls {
    pub name: String,
    /// Calls made, over every round ([`Cli::rotate`]).
    pub calls: usize,
    /// Calls live at once (the most): `--calls`.
    pub at_once: usize,
    pub completed: usize,
    /// Failures by kind (`SessionError`'s message).
    pub failures: BTreeMap<String, usize>,
    pub turns: u64,
    pub appends_sent: u64,
    /// Translation: output audio deltas received.
    pub audio_deltas: u64,
    /// Translation: append written → its translated audio read.
    pub round_trip: Option<Transit>,
    /// Client → upstream.
    pub up: Option<Transit>,
    /// Upstream → client.
    pub down: Option<Transit>,
    /// Sum of the calls' live time.
    pub call_time: Duration,
    /// Sum and maximum of the calls' close handshakes.
    pub close_time: Duration,
    pub close_max: Duration,
    /// The serving process's use over the run (`--cpu-pid`).
    pub usage: Option<Result<Usage, String>>,
}

impl TargetCalls {
    /// Mean close handshake, in ms.
    pub fn close_mean_ms(&self) -> f64 {
        if self.calls == 0 {
            return 0.0;
        }
        self.close_time.as_secs_f64() * 1000.0 / self.calls as f64
    }

    /// Counts one call of this target: its outcome (`error`, if it failed)
    /// and its totals.
    fn absorb(&mut self, rec: &CallRecord, error: Option<String>) {
        self.calls += 1;
        match error {
            None => self.completed += 1,
            Some(e) => *self.failures.entry(e).or_default() += 1,
        }
        self.turns += u64::from(rec.turns);
        self.appends_sent += rec.appends_sent;
        self.audio_deltas += rec.audio_deltas;
        self.call_time += rec.live;
        self.close_time += rec.close;
        self.close_max = self.close_max.max(rec.close);
    }

    pub fn call_minutes(&self) -> f64 {
        self.call_time.as_secs_f64() / 60.0
    }

    /// CPU-seconds of the serving process per call-minute.
    pub fn cpu_per_call_minute(&self) -> Option<f64> {
        let u = self.usage.as_ref()?.as_ref().ok()?;
        (self.call_minutes() > 0.0).then(|| u.cpu.total().as_secs_f64() / self.call_minutes())
    }

    /// Peak RSS over the RSS before the run, per call live at once, in KiB.
    pub fn rss_per_call_kib(&self) -> Option<f64> {
        let u = self.usage.as_ref()?.as_ref().ok()?;
        (self.at_once > 0)
            .then(|| u.rss_peak_kib.saturating_sub(u.rss_before_kib) as f64 / self.at_once as f64)
    }
}

/// The order calls are made in: waves run one after the other (a wave
/// starts when the last call of the one before ended), each naming the
/// target of each of its calls. Without `rotate`, one wave of
/// `per_target` calls per target, interleaved (call `i` to target
/// `i mod targets`); with `rotate` rounds, `targets` waves per round, each
/// of `per_target` calls to one target, the round's first target shifted
/// by one each round.
pub fn waves(targets: usize, per_target: usize, rotate: Option<u32>) -> Vec<Vec<usize>> {
    match rotate {
        None => vec![(0..per_target * targets).map(|i| i % targets).collect()],
        Some(rounds) => (0..rounds as usize)
            .flat_map(|r| (0..targets).map(move |k| vec![(k + r) % targets; per_target]))
            .collect(),
    }
}

/// One target's frame transit times (ns), pooled over its calls.
#[derive(Debug, Clone, Default)]
struct Frames {
    up: Vec<u64>,
    down: Vec<u64>,
    round_trip: Vec<u64>,
}

impl Frames {
    fn absorb(&mut self, rec: CallRecord) {
        self.up.extend(rec.up_ns);
        self.down.extend(rec.down_ns);
        self.round_trip.extend(rec.round_trip_ns);
    }
}

/// What a calls run produced.
#[derive(Debug)]
pub struct CallsResult {
    pub shape: CallShape,
    pub calls_per_target: usize,
    /// One target at a time, in this many rounds ([`Cli::rotate`]).
    pub rounds: Option<u32>,
    pub targets: Vec<TargetCalls>,
    pub wall: Duration,
    /// Targets the report compares against ([`Cli::baselines`]).
    pub baselines: Vec<usize>,
    /// The bench's own CPU (user + system) over the run.
    pub bench_cpu: Duration,
}

/// Resolves the targets and runs `cli.calls` calls per target.
pub async fn execute(cli: &Cli, progress: bool) -> Result<CallsResult, PlanError> {
    let per_target = cli.calls.unwrap_or(1);
    let mut targets = Vec::with_capacity(cli.targets.len());
    for t in &cli.targets {
        let key = cli.key_for(t);
        let model = cli.session_model();
        targets.push(Target::resolve(&t.name, &t.url, key.as_ref(), model, cli.beta).await?);
    }
    let shape = CallShape {
        translation: cli.translation,
        ..CallShape::new(
            Duration::from_secs(cli.call_secs),
            Duration::from_millis(cli.speech_ms),
            Duration::from_millis(cli.silence_ms),
            Duration::from_millis(cli.chunk_ms),
            cli.sample_rate,
            cli.timeout(),
        )
    };
    let targets = Arc::new(targets);
    let ramp = Duration::from_secs(cli.ramp_secs);
    let (user0, sys0, _) = run::cpu_usage();
    let procs0: Vec<_> = cli
        .cpu_pids
        .iter()
        .map(|c| process::before(c.pid))
        .collect();
    let start = Instant::now();
    let live = Arc::new(AtomicUsize::new(0));
    let reporter = progress.then(|| {
        let live = live.clone();
        run::spawn_progress(start, move || {
            format!("{} calls live", live.load(Ordering::Relaxed))
        })
    });
    let mut out: Vec<TargetCalls> = targets
        .iter()
        .map(|t| TargetCalls {
            name: t.name.clone(),
            at_once: per_target,
            ..TargetCalls::default()
        })
        .collect();
    let mut frames = vec![Frames::default(); targets.len()];
    for wave in waves(targets.len(), per_target, cli.rotate) {
        let mut calls = JoinSet::new();
        let wave_start = Instant::now();
        let n = wave.len();
        for (i, target) in wave.into_iter().enumerate() {
            let (targets, shape, live) = (targets.clone(), shape.clone(), live.clone());
            let at = wave_start + ramp.mul_f64(i as f64 / n as f64);
            calls.spawn(async move {
                tokio::time::sleep_until(at).await;
                let mut rec = CallRecord::default();
                live.fetch_add(1, Ordering::Relaxed);
                let endpoint = &targets[target].endpoint;
                let r = if shape.translation {
                    translation::run(endpoint, &shape, &mut rec).await
                } else {
                    calls::run(endpoint, &shape, &mut rec).await
                };
                live.fetch_sub(1, Ordering::Relaxed);
                (target, rec, r.err())
            });
        }
        while let Some(r) = calls.join_next().await {
            let (target, rec, error) = match r {
                Ok(v) => v,
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            };
            out[target].absorb(&rec, error.map(|e| e.to_string()));
            frames[target].absorb(rec);
        }
    }
    let wall = start.elapsed();
    if let Some(r) = reporter {
        r.abort();
    }
    for (c, b) in cli.cpu_pids.iter().zip(procs0) {
        let used = b
            .and_then(|b| process::since(c.pid, &b))
            .map_err(|e| e.to_string());
        if let Some(t) = out.iter_mut().find(|t| t.name == c.name) {
            t.usage = Some(used);
        }
    }
    for (t, f) in out.iter_mut().zip(&mut frames) {
        t.up = Transit::of(&mut f.up);
        t.down = Transit::of(&mut f.down);
        t.round_trip = Transit::of(&mut f.round_trip);
    }
    let (user1, sys1, _) = run::cpu_usage();
    Ok(CallsResult {
        shape,
        calls_per_target: per_target,
        rounds: cli.rotate,
        targets: out,
        wall,
        baselines: cli.baselines(),
        bench_cpu: user1.saturating_sub(user0) + sys1.saturating_sub(sys0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::ProcCpu;

    #[test]
    fn transit_percentiles_are_nearest_rank() {
        let mut ns: Vec<u64> = (1..=1000).rev().collect();
        let t = Transit::of(&mut ns).unwrap();
        assert_eq!(
            (t.frames, t.p50_ns, t.p99_ns, t.p999_ns, t.max_ns),
            (1000, 500, 990, 999, 1000)
        );
        assert_eq!(Transit::of(&mut []), None);
    }

    #[test]
    fn calls_go_all_at_once_or_one_target_at_a_time_in_rotation() {
        assert_eq!(waves(3, 2, None), vec![vec![0, 1, 2, 0, 1, 2]]);
        assert_eq!(
            waves(3, 2, Some(2)),
            vec![
                vec![0, 0],
                vec![1, 1],
                vec![2, 2],
                vec![1, 1],
                vec![2, 2],
                vec![0, 0],
            ]
        );
        // Every target gets its calls in every round.
        let w = waves(4, 5, Some(3));
        assert_eq!(w.len(), 12);
        for t in 0..4 {
            assert_eq!(w.iter().flatten().filter(|&&x| x == t).count(), 15);
        }
    }

    #[test]
    fn cpu_per_call_minute_and_rss_per_call() {
        let t = TargetCalls {
            calls: 300,
            at_once: 100,
            call_time: Duration::from_secs(100 * 60),
            usage: Some(Ok(Usage {
                cpu: ProcCpu {
                    user: Duration::from_secs(30),
                    system: Duration::from_secs(20),
                },
                rss_before_kib: 10_000,
                rss_peak_kib: 11_200,
            })),
            ..TargetCalls::default()
        };
        assert_eq!(t.cpu_per_call_minute(), Some(0.5));
        assert_eq!(t.rss_per_call_kib(), Some(12.0));
        let none = TargetCalls::default();
        assert_eq!(none.cpu_per_call_minute(), None);
        assert_eq!(none.rss_per_call_kib(), None);
    }
}
