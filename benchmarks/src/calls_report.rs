//! The calls mode's report: text for a reader and JSON for scripts (the
//! `calls` stage's capacity steps read it).
//!
//! Per target: calls completed and failed (by kind), frames each way, and
//! the transit time of every frame in each direction (p50/p99/p99.9 over
//! all frames of all its calls); then, against each baseline (the first
//! target, and each `--against`), the *added* per-frame latency: the
//! difference of each percentile to the baseline's in the same run; then
//! the serving process's CPU-seconds per call-minute, its ratio to each
//! baseline that has one, and its RSS per call. The report is a pure
//! function of [`CallsResult`].

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::calls_run::{CallsResult, TargetCalls, Transit};

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// `value − base` in ms.
fn added_ms(value: u64, base: u64) -> f64 {
    (value as f64 - base as f64) / 1e6
}

fn transit_cells(t: Option<&Transit>) -> String {
    match t {
        Some(t) => format!(
            "{:>8} {:>7.3} {:>7.3} {:>7.3}",
            t.frames,
            ms(t.p50_ns),
            ms(t.p99_ns),
            ms(t.p999_ns)
        ),
        None => format!("{:>8} {:>7} {:>7} {:>7}", 0, "n/a", "n/a", "n/a"),
    }
}

fn added_cells(t: Option<&Transit>, b: Option<&Transit>) -> String {
    match (t, b) {
        (Some(t), Some(b)) => format!(
            "{:>+7.3} {:>+7.3} {:>+7.3}",
            added_ms(t.p50_ns, b.p50_ns),
            added_ms(t.p99_ns, b.p99_ns),
            added_ms(t.p999_ns, b.p999_ns)
        ),
        _ => format!("{:>7} {:>7} {:>7}", "n/a", "n/a", "n/a"),
    }
}

impl CallsResult {
    pub fn render(&self) -> String {
        let mut w = String::new();
        let width = self
            .targets
            .iter()
            .map(|t| t.name.len())
            .max()
            .unwrap_or(6)
            .max(6);
        if self.shape.translation {
            self.translation_tables(&mut w, width);
        } else {
            self.call_tables(&mut w, width);
        }
        self.cpu_table(&mut w, width);
        let failed: Vec<_> = self
            .targets
            .iter()
            .flat_map(|t| t.failures.iter().map(move |(k, n)| (&t.name, k, n)))
            .collect();
        if !failed.is_empty() {
            let _ = writeln!(w, "\nfailures:");
            for (name, kind, n) in failed {
                let _ = writeln!(w, "  {name:<width$} {n:>6} × {kind}");
            }
        }
        w
    }

    /// How the targets shared the run, when not all at once.
    fn rotation(&self) -> String {
        self.rounds.map_or(String::new(), |r| {
            format!(", one at a time (each alone on the machine) in {r} rounds, figures pooled per target")
        })
    }

    /// Translation sessions: appends and deltas, and each append's round
    /// trip, per target and added over each baseline's.
    fn translation_tables(&self, w: &mut String, width: usize) {
        let s = &self.shape;
        let _ = writeln!(
            w,
            "translation: {} sessions per target × {} targets{}, {} s of audio each in {} appends of {} ms \
             ({} B of PCM16, {} base64 characters) at real time, the translated audio read meanwhile; \
             wall {:.1} s, bench CPU {:.1} s",
            self.calls_per_target,
            self.targets.len(),
            self.rotation(),
            s.length.as_secs(),
            s.chunks_per_length(),
            s.chunk.as_millis(),
            s.chunk_bytes,
            s.audio_b64.len(),
            self.wall.as_secs_f64(),
            self.bench_cpu.as_secs_f64(),
        );
        let _ = writeln!(
            w,
            "\n{:<width$} {:>8} {:>6} {:>8} {:>8}   round trip, append → its audio (ms)   close (ms)",
            "target", "sessions", "failed", "appends", "deltas"
        );
        let _ = writeln!(
            w,
            "{:<width$} {:>8} {:>6} {:>8} {:>8}   {:>8} {:>7} {:>7} {:>7}          {:>7} {:>7}",
            "", "", "", "", "", "frames", "p50", "p99", "p99.9", "mean", "max"
        );
        for t in &self.targets {
            let _ = writeln!(
                w,
                "{:<width$} {:>8} {:>6} {:>8} {:>8}   {}          {:>7.1} {:>7.1}",
                t.name,
                t.calls,
                t.calls - t.completed,
                t.appends_sent,
                t.audio_deltas,
                transit_cells(t.round_trip.as_ref()),
                t.close_mean_ms(),
                t.close_max.as_secs_f64() * 1000.0,
            );
        }
        for &b in &self.baselines {
            let base = &self.targets[b];
            let _ = writeln!(
                w,
                "\nadded round trip against {} (ms, each percentile minus {}'s):\n{:<width$}   p50/p99/p99.9",
                base.name, base.name, "target"
            );
            for t in self.targets.iter().filter(|t| t.name != base.name) {
                let _ = writeln!(
                    w,
                    "{:<width$}   {}",
                    t.name,
                    added_cells(t.round_trip.as_ref(), base.round_trip.as_ref()),
                );
            }
        }
    }

    /// Voice calls: turns, and each direction's transit per target and
    /// added over each baseline's.
    fn call_tables(&self, w: &mut String, width: usize) {
        let s = &self.shape;
        let _ = writeln!(
            w,
            "calls: {} per target × {} targets{}, {} s each; turn: {} ms of speech ({} appends of {} B), \
             the model's answer as the upstream streams it, {} ms of silence; wall {:.1} s, bench CPU {:.1} s",
            self.calls_per_target,
            self.targets.len(),
            self.rotation(),
            s.length.as_secs(),
            s.speech.as_millis(),
            s.chunks_per_turn(),
            s.chunk_bytes,
            s.silence.as_millis(),
            self.wall.as_secs_f64(),
            self.bench_cpu.as_secs_f64(),
        );
        let _ = writeln!(
            w,
            "\n{:<width$} {:>6} {:>6} {:>7}   client→upstream (ms)               upstream→client (ms)              close (ms)",
            "target", "calls", "failed", "turns"
        );
        let _ = writeln!(
            w,
            "{:<width$} {:>6} {:>6} {:>7}   {:>8} {:>7} {:>7} {:>7}   {:>8} {:>7} {:>7} {:>7}   {:>7} {:>7}",
            "", "", "", "", "frames", "p50", "p99", "p99.9", "frames", "p50", "p99", "p99.9", "mean", "max"
        );
        for t in &self.targets {
            let _ = writeln!(
                w,
                "{:<width$} {:>6} {:>6} {:>7}   {}   {}   {:>7.1} {:>7.1}",
                t.name,
                t.calls,
                t.calls - t.completed,
                t.turns,
                transit_cells(t.up.as_ref()),
                transit_cells(t.down.as_ref()),
                t.close_mean_ms(),
                t.close_max.as_secs_f64() * 1000.0,
            );
        }
        for &b in &self.baselines {
            let base = &self.targets[b];
            let _ = writeln!(
                w,
                "\nadded per-frame latency against {} (ms, each percentile minus {}'s):",
                base.name, base.name
            );
            let _ = writeln!(
                w,
                "{:<width$}   client→upstream p50/p99/p99.9   upstream→client p50/p99/p99.9",
                "target"
            );
            for t in self.targets.iter().filter(|t| t.name != base.name) {
                let _ = writeln!(
                    w,
                    "{:<width$}   {}   {}",
                    t.name,
                    added_cells(t.up.as_ref(), base.up.as_ref()),
                    added_cells(t.down.as_ref(), base.down.as_ref()),
                );
            }
        }
    }

    fn cpu_table(&self, w: &mut String, width: usize) {
        if !self.targets.iter().any(|t| t.usage.is_some()) {
            return;
        }
        let bases: Vec<&TargetCalls> = self
            .baselines
            .iter()
            .map(|&b| &self.targets[b])
            .filter(|b| b.cpu_per_call_minute().is_some())
            .collect();
        // A translation session is what a call is to the calls mode.
        let (unit, u) = if self.shape.translation {
            ("session", "s")
        } else {
            ("call", "c")
        };
        let _ = write!(
            w,
            "\nserving process (--cpu-pid): CPU-s per {unit}-minute, RSS per {unit}\n{:<width$} {:>9} {:>8} {:>10}",
            "target",
            format!("{unit}-min"),
            "CPU-s",
            format!("CPU/{u}-min")
        );
        for b in &bases {
            let _ = write!(w, " {:>14}", format!("× {}", b.name));
        }
        let _ = writeln!(
            w,
            " {:>10} {:>10} {:>10}",
            "RSS0 MiB",
            "peak MiB",
            format!("KiB/{unit}")
        );
        for t in &self.targets {
            let Some(usage) = &t.usage else { continue };
            let u = match usage {
                Ok(u) => u,
                Err(e) => {
                    let _ = writeln!(w, "{:<width$} {e}", t.name);
                    continue;
                }
            };
            let per = t.cpu_per_call_minute();
            let _ = write!(
                w,
                "{:<width$} {:>9.1} {:>8.2} {:>10}",
                t.name,
                t.call_minutes(),
                u.cpu.total().as_secs_f64(),
                per.map_or("n/a".into(), |v| format!("{v:.4}")),
            );
            for b in &bases {
                let r = per.zip(b.cpu_per_call_minute()).map(|(v, bv)| v / bv);
                let _ = write!(w, " {:>14}", r.map_or("n/a".into(), |r| format!("{r:.3}")));
            }
            let _ = writeln!(
                w,
                " {:>10.1} {:>10.1} {:>10}",
                u.rss_before_kib as f64 / 1024.0,
                u.rss_peak_kib as f64 / 1024.0,
                t.rss_per_call_kib()
                    .map_or("n/a".into(), |v| format!("{v:.1}")),
            );
        }
    }

    /// The run as JSON: its shape and each target's figures (transit
    /// percentiles in ns, failures by kind, CPU and memory).
    pub fn to_json(&self) -> String {
        let targets: Vec<Value> = self
            .targets
            .iter()
            .map(|t| {
                let usage = t.usage.as_ref().map(|u| match u {
                    Ok(u) => json!({
                        "cpu_user_secs": u.cpu.user.as_secs_f64(),
                        "cpu_system_secs": u.cpu.system.as_secs_f64(),
                        "rss_before_kib": u.rss_before_kib,
                        "rss_peak_kib": u.rss_peak_kib,
                    }),
                    Err(e) => json!({ "error": e }),
                });
                json!({
                    "name": t.name,
                    "calls": t.calls,
                    "completed": t.completed,
                    "failures": t.failures,
                    "turns": t.turns,
                    "appends_sent": t.appends_sent,
                    "audio_deltas": t.audio_deltas,
                    "round_trip": t.round_trip,
                    "call_minutes": t.call_minutes(),
                    "close_mean_ms": t.close_mean_ms(),
                    "close_max_ms": t.close_max.as_secs_f64() * 1000.0,
                    "up": t.up,
                    "down": t.down,
                    "usage": usage,
                    "cpu_per_call_minute": t.cpu_per_call_minute(),
                    "rss_per_call_kib": t.rss_per_call_kib(),
                })
            })
            .collect();
        let s = &self.shape;
        let v = json!({
            "mode": if s.translation { "translation" } else { "calls" },
            "calls_per_target": self.calls_per_target,
            "rounds": self.rounds,
            "call_secs": s.length.as_secs_f64(),
            "speech_ms": s.speech.as_millis() as u64,
            "silence_ms": s.silence.as_millis() as u64,
            "chunk_ms": s.chunk.as_millis() as u64,
            "chunk_bytes": s.chunk_bytes,
            "wall_secs": self.wall.as_secs_f64(),
            "bench_cpu_secs": self.bench_cpu.as_secs_f64(),
            "baselines": self.baselines.iter().map(|&b| &self.targets[b].name).collect::<Vec<_>>(),
            "targets": targets,
        });
        serde_json::to_string_pretty(&v).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::calls::CallShape;
    use crate::process::{ProcCpu, Usage};

    fn transit(p50: u64, p99: u64, p999: u64) -> Option<Transit> {
        Some(Transit {
            frames: 1000,
            p50_ns: p50,
            p99_ns: p99,
            p999_ns: p999,
            max_ns: p999,
        })
    }

    fn result() -> CallsResult {
        let shape = CallShape::new(
            Duration::from_secs(60),
            Duration::from_secs(3),
            Duration::from_secs(1),
            Duration::from_millis(20),
            24_000,
            Duration::from_secs(30),
        );
        let target = |name: &str, up, down, cpu_ms: Option<u64>| TargetCalls {
            name: name.into(),
            calls: 10,
            at_once: 10,
            completed: 10,
            turns: 70,
            up,
            down,
            call_time: Duration::from_secs(600),
            usage: cpu_ms.map(|ms| {
                Ok(Usage {
                    cpu: ProcCpu {
                        user: Duration::from_millis(ms),
                        system: Duration::ZERO,
                    },
                    rss_before_kib: 1000,
                    rss_peak_kib: 1120,
                })
            }),
            ..TargetCalls::default()
        };
        CallsResult {
            shape,
            calls_per_target: 10,
            rounds: None,
            targets: vec![
                target(
                    "direct",
                    transit(100_000, 400_000, 900_000),
                    transit(50_000, 200_000, 300_000),
                    None,
                ),
                target(
                    "tcp-relay",
                    transit(150_000, 500_000, 1_000_000),
                    transit(80_000, 300_000, 400_000),
                    Some(1000),
                ),
                target(
                    "gw",
                    transit(200_000, 900_000, 2_000_000),
                    transit(100_000, 300_000, 500_000),
                    Some(1200),
                ),
            ],
            wall: Duration::from_secs(70),
            baselines: vec![0, 1],
            bench_cpu: Duration::from_secs(3),
        }
    }

    #[test]
    fn added_latency_is_each_percentile_minus_the_baselines() {
        let text = result().render();
        assert!(text.contains("against direct"), "{text}");
        let gw = text
            .lines()
            .filter(|l| l.starts_with("gw "))
            .nth(1)
            .unwrap();
        assert!(gw.contains("+0.100  +0.500  +1.100"), "{gw}");
        assert!(gw.contains("+0.050  +0.100  +0.200"), "{gw}");
        assert!(text.contains("against tcp-relay"), "{text}");
    }

    #[test]
    fn cpu_per_call_minute_is_compared_with_the_relay() {
        let text = result().render();
        let gw = text.lines().rfind(|l| l.starts_with("gw ")).unwrap();
        // 1.2 CPU-s over 10 call-minutes, 1.2 × tcp-relay's, 12 KiB a call.
        assert!(gw.contains("0.1200"), "{gw}");
        assert!(gw.contains("1.200"), "{gw}");
        assert!(gw.contains("12.0"), "{gw}");
    }

    #[test]
    fn a_translation_run_reports_round_trips_and_cpu_per_session_minute() {
        let mut r = result();
        r.shape.translation = true;
        for t in &mut r.targets {
            t.round_trip = t.up;
            (t.appends_sent, t.audio_deltas) = (6000, 6000);
        }
        let text = r.render();
        assert!(
            text.starts_with("translation: 10 sessions per target"),
            "{text}"
        );
        assert!(text.contains("3000 appends of 20 ms"), "{text}");
        assert!(text.contains("CPU-s per session-minute"), "{text}");
        assert!(!text.contains("call"), "{text}");
        let gw: Vec<_> = text.lines().filter(|l| l.starts_with("gw ")).collect();
        assert!(gw[0].contains(" 6000     6000 "), "{}", gw[0]);
        // Against direct, then against tcp-relay.
        assert!(gw[1].contains("+0.100  +0.500  +1.100"), "{}", gw[1]);
        assert!(gw[2].contains("+0.050  +0.400  +1.000"), "{}", gw[2]);
        assert!(gw[3].contains("1.200"), "{}", gw[3]);
        let v: Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["mode"], "translation");
        assert_eq!(v["targets"][2]["round_trip"]["p99_ns"], 900_000);
        assert_eq!(v["targets"][2]["audio_deltas"], 6000);
    }

    #[test]
    fn json_has_each_targets_figures() {
        let v: Value = serde_json::from_str(&result().to_json()).unwrap();
        assert_eq!(v["mode"], "calls");
        assert_eq!(v["targets"][2]["up"]["p99_ns"], 900_000);
        assert_eq!(v["targets"][2]["completed"], 10);
        assert_eq!(v["targets"][1]["cpu_per_call_minute"], 0.1);
        assert_eq!(v["targets"][0]["usage"], Value::Null);
        assert_eq!(v["baselines"][1], "tcp-relay");
    }
}
