//! Command line: targets, keys, load shape, outputs.
//!
//! A target is `NAME=URL`, or `NAME=URL@KEY` to give it its own client key
//! (the key is whatever follows the last `@` *after the URL's path starts*,
//! so `ws://user@host/…` still reads as userinfo). Targets without their own
//! key use `--key` (or `PATCHBAY_BENCH_KEY`, which keeps the key out of the
//! process list). The first target is the baseline of the ratios.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use patchbay_gateway::secret::Secret;

use crate::session::CloseAt;

pub const DEFAULT_MODEL: &str = "gpt-realtime";
/// The model a `--translation` run asks for unless `--model` names another.
pub const TRANSLATION_MODEL: &str = "gpt-realtime-translate";

#[derive(Debug, Parser)]
#[command(
    name = "patchbay-bench",
    version,
    about = "Opens Realtime sessions against interleaved targets and reports phase latencies"
)]
pub struct Cli {
    /// `NAME=URL` or `NAME=URL@KEY` (ws:// only); repeat. The first is the baseline.
    #[arg(long = "target", value_name = "NAME=URL[@KEY]", required = true, value_parser = parse_target)]
    pub targets: Vec<TargetSpec>,
    /// Client key sent as `Authorization: Bearer` to targets without their own.
    #[arg(long, env = "PATCHBAY_BENCH_KEY", hide_env_values = true)]
    pub key: Option<String>,
    /// Model put in `?model=` (unless the URL already has one); with
    /// `--translation`, the default is `gpt-realtime-translate`.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Speak the beta protocol (`OpenAI-Beta: realtime=v1`).
    #[arg(long)]
    pub beta: bool,
    /// Sessions in total, spread over the targets in turn.
    #[arg(short = 'n', long = "sessions", default_value_t = 100)]
    pub sessions: usize,
    /// Sessions open at once (across all targets).
    #[arg(short = 'c', long = "concurrency", default_value_t = 10)]
    pub concurrency: usize,
    /// Bound on one session, connect to `response.done`.
    #[arg(long, default_value_t = 30)]
    pub timeout_secs: u64,
    /// Write every sample (and the run's parameters) as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// `NAME=URL` of a target's Prometheus endpoint, scraped before and
    /// after the run for the pool hit rate; repeat.
    #[arg(long = "metrics", value_name = "NAME=URL", value_parser = parse_metrics)]
    pub metrics: Vec<MetricsSpec>,
    /// When each session closes: after `response.done`, or right after
    /// its first audio delta (the response still in flight). The `close`
    /// phase is the client's close until the server closed the connection.
    #[arg(long, value_enum, default_value_t = CloseAt::Done)]
    pub close_at: CloseAt,
    /// Runtime worker threads; 1 runs everything on the current thread.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Also compare every target's p50 against this target's (beside the
    /// first target's); repeat.
    #[arg(long = "against", value_name = "NAME")]
    pub against: Vec<String>,
    /// `NAME=PID` of the process serving target NAME (a gateway, a relay):
    /// its CPU over the run is reported per 1000 sessions; repeat.
    #[arg(long = "cpu-pid", value_name = "NAME=PID", value_parser = parse_cpu_pid)]
    pub cpu_pids: Vec<CpuPidSpec>,
    /// Calls mode: this many voice calls at once per target, each for
    /// `--call-secs`, instead of `-n` sessions of one turn
    /// (benchmarks/README.md, "calls").
    #[arg(long, value_name = "N")]
    pub calls: Option<usize>,
    /// Calls mode: how long each call lasts (no turn starts after it).
    #[arg(long, default_value_t = 60)]
    pub call_secs: u64,
    /// Calls mode: the user's speech per turn, as appends at real time.
    #[arg(long, default_value_t = 3000)]
    pub speech_ms: u64,
    /// Calls mode: the silence after each model answer.
    #[arg(long, default_value_t = 1000)]
    pub silence_ms: u64,
    /// Calls mode: the audio in one `input_audio_buffer.append`.
    #[arg(long, default_value_t = 20)]
    pub chunk_ms: u64,
    /// Calls mode: PCM16 sample rate of the appended audio (Hz).
    #[arg(long, default_value_t = 24_000)]
    pub sample_rate: u32,
    /// Calls mode: call starts are spread evenly over this time (a real
    /// set of calls is not in step).
    #[arg(long, default_value_t = 8)]
    pub ramp_secs: u64,
    /// Calls mode: translation sessions instead of conversations (the
    /// targets' URLs name `/v1/realtime/translations`): each streams
    /// `session.input_audio_buffer.append` at real time for `--call-secs`
    /// and reads the translated audio meanwhile (benchmarks/README.md,
    /// "translation").
    #[arg(long, requires = "calls")]
    pub translation: bool,
    /// Calls mode: one target at a time instead of all at once. Each of
    /// ROUNDS rounds gives every target, in turn, its `--calls` calls alone
    /// on the machine (the next target starts when the last call ended),
    /// the order shifted by one each round so that no target always runs
    /// first; each target's figures are pooled over its rounds. For frame
    /// latency at N calls: with every target at once the machine carries N
    /// per target, and the load generator's own delays swamp what a relay
    /// adds (benchmarks/README.md, "calls-latency").
    #[arg(long, value_name = "ROUNDS", requires = "calls")]
    pub rotate: Option<u32>,
}

/// A process to account CPU for, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuPidSpec {
    pub name: String,
    pub pid: u32,
}

/// A target as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSpec {
    pub name: String,
    pub url: String,
    pub key: Option<Secret>,
}

/// A metrics endpoint as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSpec {
    pub name: String,
    pub url: String,
}

fn split_name(s: &str, what: &str) -> Result<(String, String), String> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME={what}, got {s:?}"))?;
    let name = name.trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!("bad name {name:?}: use visible ASCII, no spaces"));
    }
    if rest.is_empty() {
        return Err(format!("{name}: missing {what}"));
    }
    Ok((name.to_string(), rest.to_string()))
}

pub fn parse_target(s: &str) -> Result<TargetSpec, String> {
    let (name, rest) = split_name(s, "URL")?;
    let path_start = rest
        .find("://")
        .and_then(|i| rest[i + 3..].find('/').map(|j| i + 3 + j));
    let (url, key) = match (path_start, rest.rfind('@')) {
        (Some(p), Some(at)) if at > p => (&rest[..at], Some(&rest[at + 1..])),
        _ => (rest.as_str(), None),
    };
    if !url.starts_with("ws://") {
        return Err(format!(
            "{name}: {url:?} is not a ws:// URL (wss is not supported: benchmark the plain listener)"
        ));
    }
    let key = match key {
        Some("") => return Err(format!("{name}: empty key after '@'")),
        k => k.map(Secret::new),
    };
    Ok(TargetSpec {
        name,
        url: url.to_string(),
        key,
    })
}

pub fn parse_metrics(s: &str) -> Result<MetricsSpec, String> {
    let (name, url) = split_name(s, "URL")?;
    if !url.starts_with("http://") {
        return Err(format!("{name}: {url:?} is not an http:// URL"));
    }
    Ok(MetricsSpec { name, url })
}

pub fn parse_cpu_pid(s: &str) -> Result<CpuPidSpec, String> {
    let (name, pid) = split_name(s, "PID")?;
    match pid.parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(CpuPidSpec { name, pid }),
        _ => Err(format!("{name}: {pid:?} is not a process id")),
    }
}

impl Cli {
    /// Checks what clap cannot: unique names, metrics and comparisons that
    /// name a target, non-zero counts.
    pub fn validate(&self) -> Result<(), String> {
        for (i, t) in self.targets.iter().enumerate() {
            if self.targets[..i].iter().any(|o| o.name == t.name) {
                return Err(format!("target {:?} is given twice", t.name));
            }
        }
        for m in &self.metrics {
            if !self.targets.iter().any(|t| t.name == m.name) {
                return Err(format!("--metrics {}: no target of that name", m.name));
            }
        }
        for (i, c) in self.cpu_pids.iter().enumerate() {
            if !self.targets.iter().any(|t| t.name == c.name) {
                return Err(format!("--cpu-pid {}: no target of that name", c.name));
            }
            if self.cpu_pids[..i].iter().any(|o| o.name == c.name) {
                return Err(format!("--cpu-pid {}: given twice", c.name));
            }
        }
        for a in &self.against {
            if !self.targets.iter().any(|t| &t.name == a) {
                return Err(format!("--against {a}: no target of that name"));
            }
        }
        for (flag, v) in [
            ("--sessions", self.sessions),
            ("--concurrency", self.concurrency),
            ("--threads", self.threads),
        ] {
            if v == 0 {
                return Err(format!("{flag} must be at least 1"));
            }
        }
        if self.calls == Some(0) {
            return Err("--calls must be at least 1".into());
        }
        if self.rotate == Some(0) {
            return Err("--rotate must be at least 1".into());
        }
        for (flag, v) in [
            ("--call-secs", self.call_secs),
            ("--speech-ms", self.speech_ms),
            ("--chunk-ms", self.chunk_ms),
            ("--sample-rate", u64::from(self.sample_rate)),
        ] {
            if v == 0 {
                return Err(format!("{flag} must be at least 1"));
            }
        }
        if self.timeout_secs == 0 {
            return Err("--timeout-secs must be at least 1".into());
        }
        if self.model.is_empty() {
            return Err("--model must not be empty".into());
        }
        Ok(())
    }

    /// The model every session asks for: `--model`, or the translation
    /// model when `--translation` is given and `--model` is left at its
    /// default.
    pub fn session_model(&self) -> &str {
        if self.translation && self.model == DEFAULT_MODEL {
            TRANSLATION_MODEL
        } else {
            &self.model
        }
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }

    /// Indices of the targets the report compares against: the first, then
    /// each `--against` in order, once each.
    pub fn baselines(&self) -> Vec<usize> {
        let mut out = vec![0];
        for a in &self.against {
            if let Some(i) = self.targets.iter().position(|t| &t.name == a) {
                if !out.contains(&i) {
                    out.push(i);
                }
            }
        }
        out
    }

    /// The key for `target`: its own, else `--key`.
    pub fn key_for(&self, target: &TargetSpec) -> Option<Secret> {
        target
            .key
            .clone()
            .or_else(|| self.key.as_deref().map(Secret::new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Result<Cli, String> {
        let cli =
            Cli::try_parse_from(std::iter::once("patchbay-bench").chain(args.iter().copied()))
                .map_err(|e| e.to_string())?;
        cli.validate()?;
        Ok(cli)
    }

    #[test]
    fn target_is_a_name_and_a_url() {
        let t = parse_target("direct=ws://127.0.0.1:9100/v1/realtime").unwrap();
        assert_eq!(t.name, "direct");
        assert_eq!(t.url, "ws://127.0.0.1:9100/v1/realtime");
        assert_eq!(t.key, None);
    }

    #[test]
    fn key_after_the_path_overrides_the_default_key() {
        let t = parse_target("gw=ws://127.0.0.1:8080/v1/realtime?x=1@pb-key").unwrap();
        assert_eq!(t.url, "ws://127.0.0.1:8080/v1/realtime?x=1");
        assert_eq!(t.key, Some(Secret::new("pb-key")));
    }

    #[test]
    fn userinfo_before_the_path_is_not_a_key() {
        let t = parse_target("gw=ws://user@127.0.0.1:8080/v1/realtime").unwrap();
        assert_eq!(t.url, "ws://user@127.0.0.1:8080/v1/realtime");
        assert_eq!(t.key, None);
    }

    #[test]
    fn bad_targets_are_refused_with_a_reason() {
        for (arg, needle) in [
            ("ws://127.0.0.1:1/v1/realtime", "NAME=URL"),
            ("=ws://127.0.0.1:1/", "bad name"),
            ("a b=ws://127.0.0.1:1/", "bad name"),
            ("a=", "missing URL"),
            ("a=http://127.0.0.1:1/", "not a ws://"),
            ("a=wss://127.0.0.1:1/", "wss is not supported"),
            ("a=ws://127.0.0.1:1/v1@", "empty key"),
        ] {
            let e = parse_target(arg).unwrap_err();
            assert!(e.contains(needle), "{arg}: {e}");
        }
    }

    #[test]
    fn metrics_endpoint_must_be_http() {
        let m = parse_metrics("pool-on=http://127.0.0.1:9091/metrics").unwrap();
        assert_eq!(m.name, "pool-on");
        assert_eq!(m.url, "http://127.0.0.1:9091/metrics");
        assert!(parse_metrics("pool-on=ws://127.0.0.1:9091/metrics").is_err());
    }

    #[test]
    fn full_command_line_parses() {
        let c = cli(&[
            "--target",
            "direct=ws://127.0.0.1:9100/v1/realtime@sk-sim",
            "--target",
            "gw=ws://127.0.0.1:8080/v1/realtime",
            "--key",
            "pb-key",
            "--model",
            "gpt-realtime-mini",
            "-n",
            "5000",
            "-c",
            "500",
            "--timeout-secs",
            "20",
            "--out",
            "/tmp/x.json",
            "--metrics",
            "gw=http://127.0.0.1:9090/metrics",
            "--threads",
            "2",
            "--beta",
            "--against",
            "gw",
            "--against",
            "direct",
            "--cpu-pid",
            "gw=4242",
        ])
        .unwrap();
        assert_eq!(c.targets.len(), 2);
        assert_eq!(c.sessions, 5000);
        assert_eq!(c.concurrency, 500);
        assert_eq!(c.timeout(), Duration::from_secs(20));
        assert_eq!(c.model, "gpt-realtime-mini");
        assert_eq!(c.out, Some(PathBuf::from("/tmp/x.json")));
        assert_eq!(c.metrics.len(), 1);
        assert_eq!(c.threads, 2);
        assert!(c.beta);
        assert_eq!(c.baselines(), vec![0, 1], "the first once, then --against");
        assert_eq!(
            c.cpu_pids,
            vec![CpuPidSpec {
                name: "gw".into(),
                pid: 4242
            }]
        );
        assert_eq!(c.key_for(&c.targets[0]), Some(Secret::new("sk-sim")));
        assert_eq!(c.key_for(&c.targets[1]), Some(Secret::new("pb-key")));
    }

    #[test]
    fn defaults_are_small_and_safe() {
        let c = cli(&["--target", "a=ws://127.0.0.1:1/v1/realtime"]).unwrap();
        assert_eq!(c.sessions, 100);
        assert_eq!(c.concurrency, 10);
        assert_eq!(c.threads, 1);
        assert_eq!(c.model, DEFAULT_MODEL);
        assert_eq!(c.timeout(), Duration::from_secs(30));
        assert!(!c.beta);
        assert_eq!(c.baselines(), vec![0]);
    }

    #[test]
    fn calls_mode_defaults_are_a_real_call() {
        let c = cli(&[
            "--target",
            "a=ws://127.0.0.1:1/v1/realtime",
            "--calls",
            "500",
        ])
        .unwrap();
        assert_eq!(c.calls, Some(500));
        assert_eq!(c.call_secs, 60);
        assert_eq!((c.speech_ms, c.silence_ms, c.chunk_ms), (3000, 1000, 20));
        assert_eq!(c.sample_rate, 24_000);
        assert_eq!(c.ramp_secs, 8);
        assert_eq!(c.rotate, None);
        for bad in [
            &["--calls", "0"][..],
            &["--calls", "1", "--chunk-ms", "0"],
            &["--calls", "1", "--rotate", "0"],
            &["--rotate", "2"],
        ] {
            let mut args = vec!["--target", "a=ws://127.0.0.1:1/v1/realtime"];
            args.extend_from_slice(bad);
            assert!(cli(&args).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn translation_mode_asks_for_the_translation_model_and_needs_calls() {
        let t = "a=ws://127.0.0.1:1/v1/realtime/translations";
        let c = cli(&["--target", t, "--calls", "100", "--translation"]).unwrap();
        assert!(c.translation);
        assert_eq!(c.session_model(), TRANSLATION_MODEL);
        let c = cli(&[
            "--target",
            t,
            "--calls",
            "1",
            "--translation",
            "--model",
            "my-translate",
        ])
        .unwrap();
        assert_eq!(c.session_model(), "my-translate");
        let c = cli(&["--target", t, "--calls", "1"]).unwrap();
        assert_eq!(c.session_model(), DEFAULT_MODEL);
        assert!(cli(&["--target", t, "--translation"]).is_err());
    }

    #[test]
    fn inconsistent_command_lines_are_refused() {
        let t = "a=ws://127.0.0.1:1/v1/realtime";
        assert!(cli(&[]).is_err(), "a target is required");
        let e = cli(&["--target", t, "--target", t]).unwrap_err();
        assert!(e.contains("given twice"), "{e}");
        let e = cli(&["--target", t, "--metrics", "b=http://127.0.0.1:2/metrics"]).unwrap_err();
        assert!(e.contains("no target of that name"), "{e}");
        let e = cli(&["--target", t, "--against", "b"]).unwrap_err();
        assert!(e.contains("--against b: no target"), "{e}");
        let e = cli(&["--target", t, "--cpu-pid", "b=1"]).unwrap_err();
        assert!(e.contains("--cpu-pid b: no target"), "{e}");
        let e = cli(&["--target", t, "--cpu-pid", "a=1", "--cpu-pid", "a=2"]).unwrap_err();
        assert!(e.contains("given twice"), "{e}");
        for bad in ["a=0", "a=-3", "a=x", "a="] {
            assert!(cli(&["--target", t, "--cpu-pid", bad]).is_err(), "{bad}");
        }
        let e = cli(&["--target", t, "-c", "0"]).unwrap_err();
        assert!(e.contains("--concurrency"), "{e}");
        let e = cli(&["--target", t, "-n", "0"]).unwrap_err();
        assert!(e.contains("--sessions"), "{e}");
        let e = cli(&["--target", t, "--timeout-secs", "0"]).unwrap_err();
        assert!(e.contains("--timeout-secs"), "{e}");
    }
}
