//! The calls mode against a real simulator, directly and through
//! tcp-relay, on 127.0.0.1.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use patchbay_bench::args::Cli;
use patchbay_sim::{self as sim, SimConfig, SimHandle};

const UPSTREAM_KEY: &str = "sk-sim-bench";

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A simulator that answers each turn with `deltas` audio deltas of 20 ms,
/// 20 ms apart, its frames stamped, and tcp-relay in front of it.
async fn sim_and_relay(deltas: usize) -> (SimHandle, SocketAddr) {
    let sim = sim::start(
        loopback(),
        SimConfig {
            keys: vec![UPSTREAM_KEY.into()],
            audio_deltas: deltas,
            audio_delta_bytes: 960,
            delta_interval: Duration::from_millis(20),
            stamp_frames: true,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let relay = tokio::net::TcpListener::bind(loopback()).await.unwrap();
    let relay_addr = relay.local_addr().unwrap();
    tokio::spawn(patchbay_bench::tcp_relay::serve(relay, sim.addr));
    (sim, relay_addr)
}

/// The bench's command line: direct and relay as targets, short calls
/// (`speech_ms` of speech, 100 ms of silence, no ramp), then `extra`.
fn calls_cli(sim: &SimHandle, relay: SocketAddr, speech_ms: u32, extra: &[String]) -> Cli {
    let mut args: Vec<String> = vec![
        "patchbay-bench".into(),
        "--target".into(),
        format!("direct={}@{UPSTREAM_KEY}", sim.url(false)),
        "--target".into(),
        format!("relay=ws://{relay}/v1/realtime@{UPSTREAM_KEY}"),
        "--speech-ms".into(),
        speech_ms.to_string(),
        "--silence-ms".into(),
        "100".into(),
        "--ramp-secs".into(),
        "0".into(),
        "--timeout-secs".into(),
        "10".into(),
    ];
    args.extend_from_slice(extra);
    let cli = Cli::try_parse_from(args).unwrap();
    cli.validate().unwrap();
    cli
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_short_calls_stream_frames_both_ways_and_time_each_one() {
    let (sim, relay) = sim_and_relay(5).await;
    let extra: Vec<String> = [
        "--calls".into(),
        "1".into(),
        "--call-secs".into(),
        "2".into(),
        "--cpu-pid".into(),
        format!("relay={}", std::process::id()),
    ]
    .into();
    let cli = calls_cli(&sim, relay, 300, &extra);
    let result = patchbay_bench::calls_run::execute(&cli, false)
        .await
        .unwrap();

    assert_eq!(result.targets.len(), 2);
    for t in &result.targets {
        assert_eq!((t.calls, t.completed), (1, 1), "{t:?}");
        assert!(t.turns >= 2, "2 s of turns of ~0.5 s: {t:?}");
        // 300 ms of speech in 20 ms chunks: 15 appends a turn, each timed.
        assert_eq!(t.appends_sent, 15 * t.turns, "{t:?}");
        let up = t.up.expect("client→upstream transits");
        assert_eq!(up.frames as u64, t.appends_sent, "every append was timed");
        let down = t.down.expect("upstream→client transits");
        assert_eq!(down.frames as u64, 5 * t.turns, "every delta was timed");
        for d in [up, down] {
            assert!(d.p50_ns > 0 && d.p50_ns <= d.p99_ns && d.p99_ns <= d.p999_ns);
            assert!(
                d.p999_ns < 1_000_000_000,
                "loopback transits are short: {d:?}"
            );
        }
        assert!(t.call_time >= Duration::from_secs(2), "{t:?}");
    }
    assert!(result.targets[1].cpu_per_call_minute().is_some());
    let text = result.render();
    for needle in [
        "added per-frame latency against direct",
        "CPU-s per call-minute",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
    let json: serde_json::Value = serde_json::from_str(&result.to_json()).unwrap();
    assert_eq!(json["targets"][1]["name"], "relay");
    assert!(json["targets"][1]["down"]["p99_ns"].as_u64().unwrap() > 0);
    sim.stop();
}

/// `--rotate`: the targets take turns, each with its calls alone, round
/// after round; each target's figures are pooled over its rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_calls_run_one_target_at_a_time_and_pool_its_rounds() {
    let (sim, relay) = sim_and_relay(2).await;
    let extra: Vec<String> = ["--calls", "2", "--rotate", "2", "--call-secs", "1"]
        .map(String::from)
        .into();
    let cli = calls_cli(&sim, relay, 200, &extra);
    let result = patchbay_bench::calls_run::execute(&cli, false)
        .await
        .unwrap();

    // Four waves of calls of at least 1 s each, one after the other (all at
    // once, the run would take a little over 1 s).
    assert!(result.wall >= Duration::from_secs(4), "{:?}", result.wall);
    for t in &result.targets {
        assert_eq!((t.calls, t.completed, t.at_once), (4, 4, 2), "{t:?}");
        // 200 ms of speech in 20 ms chunks: 10 appends a turn, each timed.
        let up = t.up.expect("client→upstream transits");
        assert_eq!(up.frames as u64, t.appends_sent, "{t:?}");
        assert_eq!(t.appends_sent, 10 * t.turns, "{t:?}");
        assert!(t.turns >= 4, "at least a turn per call: {t:?}");
    }
    assert!(result.render().contains("one at a time"));
    let json: serde_json::Value = serde_json::from_str(&result.to_json()).unwrap();
    assert_eq!(json["rounds"], 2);
    assert_eq!(json["targets"][0]["calls"], 4);
    sim.stop();
}
