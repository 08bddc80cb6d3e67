//! The text report and the JSON sample file.
//!
//! The report is a pure function of the run ([`Report::render`]); the JSON
//! file carries every sample with its target, start offset and phases in
//! microseconds (absent when the session failed before that phase), so any
//! other statistic can be computed later without rerunning.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::process::{self, Usage};
use crate::run::{RunResult, Sample, Target};
use crate::scrape::PoolCounts;
use crate::session::Phase;
use crate::stats::{delta_ms, ms, percent, ratio, Summary};

/// The run's parameters and its cost to the bench process.
#[derive(Debug, Clone, Serialize)]
pub struct Meta {
    pub started_unix_secs: u64,
    pub sessions: usize,
    pub concurrency: usize,
    pub timeout_secs: u64,
    pub model: String,
    pub beta: bool,
    pub threads: usize,
    pub wall_secs: f64,
    pub bench_cpu_user_secs: f64,
    pub bench_cpu_sys_secs: f64,
    pub bench_max_rss_kib: u64,
    /// Time the bench's threads were runnable but waiting for a CPU
    /// during the run (`None` without kernel schedstats).
    pub bench_cpu_wait_secs: Option<f64>,
}

/// A pool scrape for one target: the counts during the run, or why not.
pub type PoolResult = (String, Result<PoolCounts, String>);

/// The CPU and memory the process serving one target used during the run,
/// or why they could not be read.
pub type CpuResult = (String, Result<Usage, String>);

#[derive(Debug)]
pub struct Report<'a> {
    pub meta: &'a Meta,
    pub targets: &'a [Target],
    pub result: &'a RunResult,
    pub pools: &'a [PoolResult],
    pub cpu: &'a [CpuResult],
    /// Targets to compare the others against; the first is the baseline.
    /// Empty means the first target only.
    pub baselines: &'a [usize],
}

/// Per-target figures derived from the samples.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetStats {
    pub sessions: usize,
    pub ok: usize,
    /// One per [`Phase::ALL`], in order.
    pub phases: Vec<Option<Summary>>,
    /// Audio deltas received by the successful sessions, and their bytes.
    pub audio_frames: u64,
    pub audio_bytes: u64,
    /// Failure messages with their counts, most frequent first.
    pub failures: Vec<(String, usize)>,
}

impl TargetStats {
    pub fn of(samples: &[Sample], target: usize) -> Self {
        let mine: Vec<&Sample> = samples.iter().filter(|s| s.target == target).collect();
        let ok = mine.iter().filter(|s| s.error.is_none()).count();
        let phases = Phase::ALL
            .iter()
            .map(|&p| {
                // Only successful sessions: a failed session's early phases
                // would mix in a different population.
                let mut v: Vec<Duration> = mine
                    .iter()
                    .filter(|s| s.error.is_none())
                    .filter_map(|s| s.timings.get(p))
                    .collect();
                Summary::of(&mut v)
            })
            .collect();
        let mut failures: Vec<(String, usize)> = Vec::new();
        for e in mine.iter().filter_map(|s| s.error.as_ref()) {
            let e = e.to_string();
            match failures.iter_mut().find(|(m, _)| *m == e) {
                Some((_, n)) => *n += 1,
                None => failures.push((e, 1)),
            }
        }
        failures.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let succeeded = || mine.iter().filter(|s| s.error.is_none());
        Self {
            sessions: mine.len(),
            ok,
            phases,
            audio_frames: succeeded().map(|s| u64::from(s.timings.audio_frames)).sum(),
            audio_bytes: succeeded().map(|s| s.timings.audio_bytes).sum(),
            failures,
        }
    }

    pub fn success_percent(&self) -> f64 {
        percent(self.ok, self.sessions)
    }
}

impl Report<'_> {
    pub fn render(&self) -> String {
        let m = self.meta;
        let stats: Vec<TargetStats> = (0..self.targets.len())
            .map(|t| TargetStats::of(&self.result.samples, t))
            .collect();
        let width = self
            .targets
            .iter()
            .map(|t| t.name.len())
            .max()
            .unwrap_or(0)
            .max(8);
        let mut o = String::new();
        let w = &mut o;
        let _ = writeln!(
            w,
            "patchbay-bench: n={} c={} model={}{} timeout={} s threads={}",
            m.sessions,
            m.concurrency,
            m.model,
            if m.beta { " (beta)" } else { "" },
            m.timeout_secs,
            m.threads
        );
        for (i, t) in self.targets.iter().enumerate() {
            let base = if i == 0 { "  (baseline)" } else { "" };
            let _ = writeln!(w, "  {:<width$}  {}{base}", t.name, t.url);
        }
        let cpu = m.bench_cpu_user_secs + m.bench_cpu_sys_secs;
        let _ = writeln!(
            w,
            "wall {:.1} s, {:.0} sessions/s; bench CPU {:.1} s user + {:.1} s sys = {:.0} % of one core; peak RSS {:.0} MiB",
            m.wall_secs,
            m.sessions as f64 / m.wall_secs.max(1e-9),
            m.bench_cpu_user_secs,
            m.bench_cpu_sys_secs,
            cpu * 100.0 / m.wall_secs.max(1e-9),
            m.bench_max_rss_kib as f64 / 1024.0
        );
        if let Some(l) = self.result.loop_lag {
            let _ = write!(
                w,
                "bench event-loop lag ({} ms probe): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                crate::run::LAG_PROBE_EVERY.as_millis(),
                ms(l.p50),
                ms(l.p99),
                ms(l.max)
            );
            match m.bench_cpu_wait_secs {
                Some(s) => {
                    let _ = writeln!(w, "; runnable but waiting for a CPU {:.2} s", s);
                }
                None => {
                    let _ = writeln!(w);
                }
            }
        }

        let _ = writeln!(w);
        let _ = writeln!(
            w,
            "{:<width$}  {:>13}  {:>8}  {:>13}",
            "target", "ok/sessions", "success", "audio frames"
        );
        for (t, s) in self.targets.iter().zip(&stats) {
            let frames = if s.audio_frames == 0 {
                "-".to_string()
            } else {
                format!(
                    "{:.1} × {:.0} B",
                    s.audio_frames as f64 / s.ok.max(1) as f64,
                    s.audio_bytes as f64 / s.audio_frames as f64
                )
            };
            let _ = writeln!(
                w,
                "{:<width$}  {:>13}  {:>7.2}%  {:>13}",
                t.name,
                format!("{}/{}", s.ok, s.sessions),
                s.success_percent(),
                frames
            );
        }

        let _ = writeln!(w);
        let _ = writeln!(
            w,
            "{:<11}  {:<width$}  {:>9}  {:>9}  {:>9}  {:>9}  {:>6}",
            "phase (ms)", "target", "p50", "p95", "p99", "max", "n"
        );
        for (pi, phase) in Phase::ALL.iter().enumerate() {
            for (ti, (t, s)) in self.targets.iter().zip(&stats).enumerate() {
                let label = if ti == 0 { phase.name() } else { "" };
                match s.phases[pi] {
                    Some(x) => {
                        let _ = writeln!(
                            w,
                            "{label:<11}  {:<width$}  {:>9.2}  {:>9.2}  {:>9.2}  {:>9.2}  {:>6}",
                            t.name,
                            ms(x.p50),
                            ms(x.p95),
                            ms(x.p99),
                            ms(x.max),
                            x.count
                        );
                    }
                    None => {
                        let _ = writeln!(w, "{label:<11}  {:<width$}  {:>9}", t.name, "-");
                    }
                }
            }
        }

        let first = [0];
        let bases = if self.baselines.is_empty() {
            &first[..]
        } else {
            self.baselines
        };
        if self.targets.len() > 1 {
            for &b in bases.iter().filter(|&&b| b < stats.len()) {
                let _ = writeln!(w);
                self.ratio_table(w, &stats, b, width);
            }
        }

        if !self.cpu.is_empty() {
            let _ = writeln!(w);
            self.cpu_table(w, &stats, bases, width);
        }

        if stats.iter().any(|s| !s.failures.is_empty()) {
            let _ = writeln!(w);
            let _ = writeln!(w, "failures");
            for (t, s) in self.targets.iter().zip(&stats) {
                for (msg, n) in &s.failures {
                    let _ = writeln!(w, "  {:<width$}  {n:>6}  {msg}", t.name);
                }
            }
        }

        if !self.pools.is_empty() {
            let _ = writeln!(w);
            let _ = writeln!(w, "pool (counter increase during the run)");
            for (name, r) in self.pools {
                let line = match r {
                    Ok(c) => pool_line(c),
                    Err(e) => format!("n/a (scrape failed: {e})"),
                };
                let _ = writeln!(w, "  {name:<width$}  {line}");
            }
        }
        o
    }
}

impl Report<'_> {
    /// p50 of every target but `base` against `base`'s, per phase.
    fn ratio_table(&self, w: &mut String, stats: &[TargetStats], base: usize, width: usize) {
        let _ = writeln!(
            w,
            "p50 against {} (ratio, difference in ms)",
            self.targets[base].name
        );
        let _ = write!(w, "{:<width$}", "target");
        for p in Phase::ALL {
            let _ = write!(w, "  {:>18}", p.name());
        }
        let _ = writeln!(w);
        for (ti, (t, s)) in self.targets.iter().zip(stats).enumerate() {
            if ti == base {
                continue;
            }
            let _ = write!(w, "{:<width$}", t.name);
            for (pi, b) in stats[base].phases.iter().enumerate() {
                let cell = match (s.phases[pi], b) {
                    (Some(x), Some(b)) => match ratio(x.p50, b.p50) {
                        Some(r) => format!("{r:.3} ({:+.2})", delta_ms(x.p50, b.p50)),
                        None => format!("- ({:+.2})", delta_ms(x.p50, b.p50)),
                    },
                    _ => "-".into(),
                };
                let _ = write!(w, "  {cell:>18}");
            }
            let _ = writeln!(w);
        }
    }
}

impl Report<'_> {
    /// CPU-seconds per 1000 sessions of target `t`, if its process was
    /// measured and it ran sessions.
    fn cpu_per_1000(&self, stats: &[TargetStats], t: usize) -> Option<f64> {
        let name = &self.targets.get(t)?.name;
        let (_, r) = self.cpu.iter().find(|(n, _)| n == name)?;
        process::per_1000(r.as_ref().ok()?.cpu.total(), stats.get(t)?.sessions)
    }

    /// Sessions of target `t` in flight at once: `c` spread over the
    /// targets, at most the target's sessions.
    fn in_flight(&self, stats: &[TargetStats], t: usize) -> usize {
        let per_target = self.meta.concurrency.div_ceil(self.targets.len().max(1));
        per_target.min(stats.get(t).map_or(0, |s| s.sessions))
    }

    /// Each measured process's CPU over the run, per 1000 sessions of its
    /// target, and that figure against every baseline that has one: as a
    /// ratio, and as the difference in CPU-milliseconds per session. The
    /// ratio moves with what the baseline costs (a byte-copying relay's CPU
    /// is nearly all kernel time, which varies with the machine's state);
    /// the difference is what a target adds per session, and holds steadier
    /// from run to run.
    fn cpu_table(&self, w: &mut String, stats: &[TargetStats], bases: &[usize], width: usize) {
        let bases: Vec<(usize, f64)> = bases
            .iter()
            .filter_map(|&b| Some((b, self.cpu_per_1000(stats, b)?)))
            .collect();
        let _ = writeln!(
            w,
            "process CPU during the run (user + system from /proc/PID/stat over {:.1} s)",
            self.meta.wall_secs
        );
        let _ = write!(
            w,
            "{:<width$}  {:>7}  {:>7}  {:>9}  {:>16}  {:>10}  {:>10}  {:>13}",
            "target",
            "user s",
            "sys s",
            "% of core",
            "CPU-s/1000 sess.",
            "RSS before",
            "RSS peak",
            "KiB/in flight"
        );
        for &(b, _) in &bases {
            let _ = write!(
                w,
                "  {:>20}",
                format!("× {} (+ms/sess.)", self.targets[b].name)
            );
        }
        let _ = writeln!(w);
        for (name, r) in self.cpu {
            let c = match r {
                Ok(c) => c,
                Err(e) => {
                    let _ = writeln!(w, "{name:<width$}  n/a ({e})");
                    continue;
                }
            };
            let t = self.targets.iter().position(|t| &t.name == name);
            let per = t.and_then(|t| self.cpu_per_1000(stats, t));
            let in_flight = t.map_or(0, |t| self.in_flight(stats, t));
            let per_session = (in_flight > 0)
                .then(|| c.rss_peak_kib.saturating_sub(c.rss_before_kib) as f64 / in_flight as f64);
            let _ = write!(
                w,
                "{name:<width$}  {:>7.2}  {:>7.2}  {:>8.0}%  {:>16}  {:>6} MiB  {:>6} MiB  {:>13}",
                c.cpu.user.as_secs_f64(),
                c.cpu.system.as_secs_f64(),
                c.cpu.total().as_secs_f64() * 100.0 / self.meta.wall_secs.max(1e-9),
                per.map_or("-".to_string(), |p| format!("{p:.3}")),
                c.rss_before_kib / 1024,
                c.rss_peak_kib / 1024,
                per_session.map_or("-".to_string(), |k| format!("{k:.1}"))
            );
            for &(b, base) in &bases {
                // CPU-seconds per 1000 sessions are CPU-milliseconds per session.
                let cell = match per {
                    Some(p) if Some(b) != t && base > 0.0 => {
                        format!("{:.3} ({:+.3})", p / base, p - base)
                    }
                    _ => "-".to_string(),
                };
                let _ = write!(w, "  {cell:>20}");
            }
            let _ = writeln!(w);
        }
    }
}

fn pool_line(c: &PoolCounts) -> String {
    let n = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.0}"));
    let rate = c
        .hit_rate()
        .map_or("n/a".to_string(), |r| format!("{:.1} %", r * 100.0));
    format!(
        "hits {}  misses {}  hit rate {rate}",
        n(c.hits),
        n(c.misses)
    )
}

#[derive(Serialize)]
struct JsonTarget<'a> {
    name: &'a str,
    url: &'a str,
}

#[derive(Serialize)]
struct JsonSample<'a> {
    index: usize,
    target: &'a str,
    started_us: u64,
    ok: bool,
    dial_us: Option<u64>,
    session_us: Option<u64>,
    first_audio_us: Option<u64>,
    turn_us: Option<u64>,
    total_us: Option<u64>,
    close_us: Option<u64>,
    audio_frames: u32,
    audio_bytes: u64,
    error: Option<String>,
}

#[derive(Serialize)]
struct JsonPool<'a> {
    target: &'a str,
    hits: Option<f64>,
    misses: Option<f64>,
    hit_rate: Option<f64>,
    error: Option<&'a str>,
}

#[derive(Serialize)]
struct JsonCpu<'a> {
    target: &'a str,
    user_secs: Option<f64>,
    sys_secs: Option<f64>,
    cpu_secs_per_1000_sessions: Option<f64>,
    rss_before_kib: Option<u64>,
    rss_peak_kib: Option<u64>,
    error: Option<&'a str>,
}

#[derive(Serialize)]
struct JsonLag {
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
}

#[derive(Serialize)]
struct JsonRun<'a> {
    meta: &'a Meta,
    bench_loop_lag: Option<JsonLag>,
    targets: Vec<JsonTarget<'a>>,
    pools: Vec<JsonPool<'a>>,
    cpu: Vec<JsonCpu<'a>>,
    samples: Vec<JsonSample<'a>>,
}

fn us(d: Duration) -> u64 {
    d.as_micros().try_into().unwrap_or(u64::MAX)
}

impl Report<'_> {
    /// Every sample and the run's parameters, as JSON.
    pub fn to_json(&self) -> String {
        let run = JsonRun {
            meta: self.meta,
            bench_loop_lag: self.result.loop_lag.map(|l| JsonLag {
                p50_us: us(l.p50),
                p99_us: us(l.p99),
                max_us: us(l.max),
            }),
            targets: self
                .targets
                .iter()
                .map(|t| JsonTarget {
                    name: &t.name,
                    url: &t.url,
                })
                .collect(),
            pools: self
                .pools
                .iter()
                .map(|(name, r)| match r {
                    Ok(c) => JsonPool {
                        target: name,
                        hits: c.hits,
                        misses: c.misses,
                        hit_rate: c.hit_rate(),
                        error: None,
                    },
                    Err(e) => JsonPool {
                        target: name,
                        hits: None,
                        misses: None,
                        hit_rate: None,
                        error: Some(e),
                    },
                })
                .collect(),
            cpu: self
                .cpu
                .iter()
                .map(|(name, r)| {
                    let t = self.targets.iter().position(|t| &t.name == name);
                    let sessions = t.map_or(0, |t| {
                        self.result.samples.iter().filter(|s| s.target == t).count()
                    });
                    match r {
                        Ok(c) => JsonCpu {
                            target: name,
                            user_secs: Some(c.cpu.user.as_secs_f64()),
                            sys_secs: Some(c.cpu.system.as_secs_f64()),
                            cpu_secs_per_1000_sessions: process::per_1000(c.cpu.total(), sessions),
                            rss_before_kib: Some(c.rss_before_kib),
                            rss_peak_kib: Some(c.rss_peak_kib),
                            error: None,
                        },
                        Err(e) => JsonCpu {
                            target: name,
                            user_secs: None,
                            sys_secs: None,
                            cpu_secs_per_1000_sessions: None,
                            rss_before_kib: None,
                            rss_peak_kib: None,
                            error: Some(e),
                        },
                    }
                })
                .collect(),
            samples: self
                .result
                .samples
                .iter()
                .map(|s| JsonSample {
                    index: s.index,
                    target: &self.targets[s.target].name,
                    started_us: us(s.started),
                    ok: s.error.is_none(),
                    dial_us: s.timings.dial.map(us),
                    session_us: s.timings.session.map(us),
                    first_audio_us: s.timings.first_audio.map(us),
                    turn_us: s.timings.turn.map(us),
                    total_us: s.timings.total.map(us),
                    close_us: s.timings.close.map(us),
                    audio_frames: s.timings.audio_frames,
                    audio_bytes: s.timings.audio_bytes,
                    error: s.error.as_ref().map(|e| e.to_string()),
                })
                .collect(),
        };
        // Plain data with string keys: serialising cannot fail.
        serde_json::to_string(&run).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{Endpoint, SessionError, Timings};

    fn target(name: &str) -> Target {
        Target {
            name: name.into(),
            url: format!("ws://127.0.0.1:1/{name}"),
            endpoint: Endpoint {
                addr: "127.0.0.1:1".parse().unwrap(),
                uri: "ws://127.0.0.1:1/".parse().unwrap(),
                headers: Vec::new(),
            },
        }
    }

    fn sample(index: usize, target: usize, total_ms: u64, error: Option<SessionError>) -> Sample {
        let d = Duration::from_millis;
        Sample {
            index,
            target,
            started: d(index as u64),
            timings: Timings {
                dial: Some(d(total_ms / 2)),
                session: Some(d(1)),
                first_audio: error.is_none().then(|| d(2)),
                turn: error.is_none().then(|| d(3)),
                total: error.is_none().then(|| d(total_ms)),
                close: error.is_none().then(|| d(1)),
                audio_frames: 5,
                audio_bytes: 3000,
            },
            error,
        }
    }

    fn meta() -> Meta {
        Meta {
            started_unix_secs: 0,
            sessions: 6,
            concurrency: 2,
            timeout_secs: 30,
            model: "gpt-realtime".into(),
            beta: false,
            threads: 1,
            wall_secs: 2.0,
            bench_cpu_user_secs: 0.5,
            bench_cpu_sys_secs: 0.5,
            bench_max_rss_kib: 10240,
            bench_cpu_wait_secs: Some(0.25),
        }
    }

    fn result() -> RunResult {
        RunResult {
            samples: vec![
                sample(0, 0, 100, None),
                sample(1, 1, 50, None),
                sample(2, 0, 300, None),
                sample(3, 1, 150, None),
                sample(4, 0, 200, None),
                sample(5, 1, 0, Some(SessionError::Timeout(Phase::FirstAudio))),
            ],
            wall: Duration::from_secs(2),
            loop_lag: Summary::of(&mut [Duration::from_micros(100), Duration::from_millis(3)]),
        }
    }

    #[test]
    fn target_stats_use_successful_sessions_only() {
        let r = result();
        let s = TargetStats::of(&r.samples, 1);
        assert_eq!((s.ok, s.sessions), (2, 3));
        assert!((s.success_percent() - 200.0 / 3.0).abs() < 1e-9);
        let total = s.phases[4].unwrap();
        assert_eq!(total.count, 2);
        assert_eq!(total.p50, Duration::from_millis(50));
        assert_eq!(total.max, Duration::from_millis(150));
        assert_eq!(
            s.failures,
            vec![("timed out in first_audio".to_string(), 1)]
        );
        assert_eq!((s.audio_frames, s.audio_bytes), (10, 6000));
    }

    #[test]
    fn report_shows_success_percentiles_and_ratios() {
        let (m, r) = (meta(), result());
        let targets = [target("direct"), target("gw")];
        let pools = vec![
            (
                "gw".to_string(),
                Ok(PoolCounts {
                    hits: Some(9.0),
                    misses: Some(1.0),
                }),
            ),
            ("direct".to_string(), Ok(PoolCounts::default())),
        ];
        let text = Report {
            meta: &m,
            targets: &targets,
            result: &r,
            pools: &pools,
            cpu: &[],
            baselines: &[],
        }
        .render();
        assert!(text.contains("3/3   100.00%"), "{text}");
        assert!(text.contains("2/3    66.67%"), "{text}");
        assert!(text.contains("50 % of one core"), "{text}");
        assert!(
            text.contains("lag (10 ms probe): p50 0.10 ms, p99 3.00 ms"),
            "{text}"
        );
        // total p50: direct 200 ms, gw 50 ms → 0.25, −150 ms.
        assert!(text.contains("0.250 (-150.00)"), "{text}");
        assert!(text.contains("timed out in first_audio"), "{text}");
        assert!(text.contains("hits 9  misses 1  hit rate 90.0 %"), "{text}");
        assert!(
            text.contains("hits n/a  misses n/a  hit rate n/a"),
            "{text}"
        );
    }

    #[test]
    fn each_baseline_gets_its_own_ratio_table() {
        let (m, r) = (meta(), result());
        let targets = [target("direct"), target("gw")];
        let render = |baselines: &[usize]| {
            Report {
                meta: &m,
                targets: &targets,
                result: &r,
                pools: &[],
                cpu: &[],
                baselines,
            }
            .render()
        };
        let one = render(&[0]);
        assert_eq!(one.matches("p50 against").count(), 1, "{one}");
        assert!(!one.contains("p50 against gw"), "{one}");
        let two = render(&[0, 1]);
        assert!(two.contains("p50 against direct"), "{two}");
        // total p50 against gw: direct 200 ms over gw's 50 ms → 4, +150 ms.
        let against_gw = &two[two.find("p50 against gw").unwrap()..];
        assert!(against_gw.contains("4.000 (+150.00)"), "{against_gw}");
        assert!(
            !against_gw.contains("\ngw "),
            "no row for the base itself: {against_gw}"
        );
    }

    #[test]
    fn json_carries_every_sample_in_microseconds() {
        let (m, r) = (meta(), result());
        let targets = [target("direct"), target("gw")];
        let json = Report {
            meta: &m,
            targets: &targets,
            result: &r,
            pools: &[("gw".into(), Err("timed out".into()))],
            cpu: &cpu_results(),
            baselines: &[0],
        }
        .to_json();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let samples = v["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 6);
        assert_eq!(samples[1]["target"], "gw");
        assert_eq!(samples[1]["total_us"], 50_000);
        assert_eq!(samples[5]["ok"], false);
        assert!(samples[5]["total_us"].is_null());
        assert_eq!(samples[5]["error"], "timed out in first_audio");
        assert_eq!(v["meta"]["sessions"], 6);
        assert_eq!(v["targets"][0]["name"], "direct");
        assert_eq!(v["pools"][0]["error"], "timed out");
        assert_eq!(v["bench_loop_lag"]["max_us"], 3000);
        // direct: 1.5 s over its 3 sessions → 500 CPU-s per 1000.
        assert_eq!(v["cpu"][0]["target"], "direct");
        assert_eq!(v["cpu"][0]["cpu_secs_per_1000_sessions"], 500.0);
        assert_eq!(v["cpu"][1]["error"], "gone");
        assert_eq!(v["cpu"][0]["rss_peak_kib"], 6144);
        assert!(v["cpu"][1]["user_secs"].is_null());
    }

    fn usage(user_ms: u64, sys_ms: u64, before_kib: u64, peak_kib: u64) -> Usage {
        Usage {
            cpu: process::ProcCpu {
                user: Duration::from_millis(user_ms),
                system: Duration::from_millis(sys_ms),
            },
            rss_before_kib: before_kib,
            rss_peak_kib: peak_kib,
        }
    }

    fn cpu_results() -> Vec<CpuResult> {
        vec![
            ("direct".into(), Ok(usage(1000, 500, 4096, 6144))),
            ("gw".into(), Err("gone".into())),
        ]
    }

    #[test]
    fn cpu_per_1000_sessions_is_compared_with_each_measured_baseline() {
        let (m, r) = (meta(), result());
        let targets = [target("direct"), target("relay"), target("gw")];
        // Three targets over six samples, two each (session i to i mod 3).
        let r = RunResult {
            samples: r
                .samples
                .into_iter()
                .map(|mut s| {
                    s.target = s.index % 3;
                    s
                })
                .collect(),
            ..r
        };
        let cpu = vec![
            ("relay".to_string(), Ok(usage(150, 50, 10240, 10240))),
            ("gw".to_string(), Ok(usage(200, 100, 20480, 20480 + 64))),
            ("direct".to_string(), Err("cannot read /proc/9/stat".into())),
        ];
        let text = Report {
            meta: &m,
            targets: &targets,
            result: &r,
            pools: &[],
            cpu: &cpu,
            baselines: &[0, 1],
        }
        .render();
        let table = &text[text.find("process CPU during the run").expect(&text)..];
        // direct has no figure, so only relay is a column.
        assert!(table.contains("× relay"), "{table}");
        assert!(!table.contains("× direct"), "{table}");
        // relay: 0.2 s over 2 sessions → 100 CPU-s per 1000, 10 % of 2 s.
        let relay = table.lines().find(|l| l.starts_with("relay")).unwrap();
        assert!(relay.contains("100.000"), "{relay}");
        assert!(relay.contains("10%"), "{relay}");
        assert!(
            relay.trim_end().ends_with('-'),
            "no ratio to itself: {relay}"
        );
        // gw: 0.3 s over 2 sessions → 150, 1.5 × relay, 50 ms more CPU
        // per session.
        let gw = table.lines().find(|l| l.starts_with("gw")).unwrap();
        assert!(gw.contains("150.000"), "{gw}");
        assert!(gw.trim_end().ends_with("1.500 (+50.000)"), "{gw}");
        assert!(
            table.contains("direct    n/a (cannot read /proc/9/stat)"),
            "{table}"
        );
    }
}
