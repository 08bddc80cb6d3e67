//! The translation mode (`--calls N --translation`) against a real
//! simulator, directly and through tcp-relay, on 127.0.0.1.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::Parser;
use patchbay_bench::args::Cli;
use patchbay_sim::{self as sim, SimConfig};

const UPSTREAM_KEY: &str = "sk-sim-bench";

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_short_translation_sessions_stream_audio_and_time_each_round_trip() {
    let sim = sim::start(
        loopback(),
        SimConfig {
            keys: vec![UPSTREAM_KEY.into()],
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let relay = tokio::net::TcpListener::bind(loopback()).await.unwrap();
    let relay_addr = relay.local_addr().unwrap();
    tokio::spawn(patchbay_bench::tcp_relay::serve(relay, sim.addr));

    let args: Vec<String> = [
        "--target".into(),
        format!(
            "direct=ws://{}/v1/realtime/translations@{UPSTREAM_KEY}",
            sim.addr
        ),
        "--target".into(),
        format!("relay=ws://{relay_addr}/v1/realtime/translations@{UPSTREAM_KEY}"),
        "--against".into(),
        "relay".into(),
        "--calls".into(),
        "1".into(),
        "--translation".into(),
        "--call-secs".into(),
        "2".into(),
        "--chunk-ms".into(),
        "100".into(),
        "--ramp-secs".into(),
        "0".into(),
        "--timeout-secs".into(),
        "10".into(),
        "--cpu-pid".into(),
        format!("relay={}", std::process::id()),
    ]
    .into();
    let cli =
        Cli::try_parse_from(std::iter::once("patchbay-bench".to_string()).chain(args)).unwrap();
    cli.validate().unwrap();
    let result = patchbay_bench::calls_run::execute(&cli, false)
        .await
        .unwrap();

    assert_eq!(result.targets.len(), 2);
    for t in &result.targets {
        assert_eq!((t.calls, t.completed), (1, 1), "{t:?}");
        assert_eq!(t.turns, 0, "no commit, no response: {t:?}");
        // 2 s of audio in 100 ms chunks, each answered with its translation.
        assert_eq!((t.appends_sent, t.audio_deltas), (20, 20), "{t:?}");
        let rt = t.round_trip.expect("round trips");
        assert_eq!(rt.frames, 20, "every append was timed");
        assert!(rt.p50_ns > 0 && rt.p50_ns <= rt.p99_ns && rt.p99_ns <= rt.p999_ns);
        assert!(
            rt.p999_ns < 1_000_000_000,
            "loopback round trips are short: {rt:?}"
        );
        assert!(
            t.call_time >= Duration::from_millis(1900),
            "the audio streams at real time: {t:?}"
        );
        assert_eq!((t.up, t.down), (None, None), "no transit stamps here");
    }
    // What the simulated upstream received: 2 s of 24 kHz PCM16 per session.
    assert_eq!(
        sim.stats.translation_input_bytes.load(Ordering::Relaxed),
        2 * 2 * 48_000
    );
    assert!(result.targets[1].cpu_per_call_minute().is_some());
    let text = result.render();
    for needle in [
        "translation: 1 sessions per target × 2 targets, 2 s of audio each in 20 appends of 100 ms (4800 B of PCM16, 6400 base64 characters)",
        "added round trip against direct",
        "added round trip against relay",
        "CPU-s per session-minute",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
    let json: serde_json::Value = serde_json::from_str(&result.to_json()).unwrap();
    assert_eq!(json["mode"], "translation");
    assert_eq!(json["targets"][1]["name"], "relay");
    assert_eq!(json["targets"][1]["audio_deltas"], 20);
    assert!(json["targets"][1]["round_trip"]["p99_ns"].as_u64().unwrap() > 0);
    sim.stop();
}
