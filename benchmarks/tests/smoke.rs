//! The bench against a real simulator and a real gateway on 127.0.0.1.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use patchbay_bench::args::Cli;
use patchbay_bench::session::Phase;
use patchbay_gateway::config::{Config, MASTER_KEY_ENV};
use patchbay_sim::{self as sim, SimConfig};

const UPSTREAM_KEY: &str = "sk-sim-bench";
const CLIENT_KEY: &str = "pb-bench-key";

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn cli(args: &[String]) -> Cli {
    let cli = Cli::try_parse_from(
        std::iter::once("patchbay-bench".to_string()).chain(args.iter().cloned()),
    )
    .unwrap();
    cli.validate().unwrap();
    cli
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_session_succeeds_and_every_phase_has_samples() {
    let sim = sim::start(
        loopback(),
        SimConfig {
            keys: vec![UPSTREAM_KEY.into()],
            upgrade_delay: Duration::from_millis(5),
            session_delay: Duration::from_millis(2),
            inference_delay: Duration::from_millis(3),
            audio_deltas: 4,
            audio_delta_bytes: 400,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [[routes]]\nmodel = \"gpt-realtime\"\nupstream_url = \"{}\"\napi_key_env = \"UPSTREAM_KEY\"\n",
        sim.url(false)
    );
    let env = |k: &str| match k {
        "UPSTREAM_KEY" => Some(UPSTREAM_KEY.to_string()),
        MASTER_KEY_ENV => Some(CLIENT_KEY.to_string()),
        _ => None,
    };
    let gw = patchbay_gateway::bootstrap::start(Config::from_toml_with_env(&toml, &env).unwrap())
        .await
        .unwrap();

    let relay = tokio::net::TcpListener::bind(loopback()).await.unwrap();
    let relay_addr = relay.local_addr().unwrap();
    tokio::spawn(patchbay_bench::tcp_relay::serve(relay, sim.addr));

    let args: Vec<String> = [
        "--target".into(),
        format!("direct={}@{UPSTREAM_KEY}", sim.url(false)),
        "--target".into(),
        format!("gateway=ws://{}/v1/realtime", gw.addr),
        "--target".into(),
        format!("relay=ws://{relay_addr}/v1/realtime@{UPSTREAM_KEY}"),
        "--against".into(),
        "relay".into(),
        "--key".into(),
        CLIENT_KEY.into(),
        "-n".into(),
        "30".into(),
        "-c".into(),
        "6".into(),
        "--timeout-secs".into(),
        "10".into(),
        "--metrics".into(),
        format!("gateway=http://{}/metrics", gw.admin_addr),
        // Everything runs in this process: its CPU stands in for both.
        "--cpu-pid".into(),
        format!("gateway={}", std::process::id()),
        "--cpu-pid".into(),
        format!("relay={}", std::process::id()),
    ]
    .into();
    let outcome = patchbay_bench::execute(&cli(&args), false).await.unwrap();

    let samples = &outcome.result.samples;
    assert_eq!(samples.len(), 30);
    let failures: Vec<_> = samples.iter().filter_map(|s| s.error.as_ref()).collect();
    assert!(failures.is_empty(), "100 % success expected: {failures:?}");
    // Interleaved: session i to target i mod 3.
    for s in samples {
        assert_eq!(s.target, s.index % 3);
        for p in Phase::ALL {
            assert!(s.timings.get(p).is_some(), "{} missing in {s:?}", p.name());
        }
        assert_eq!(s.timings.audio_frames, 4);
    }
    assert_eq!(
        sim.stats
            .responses_done
            .load(std::sync::atomic::Ordering::Relaxed),
        30,
        "ten direct, ten through the gateway, ten through the relay"
    );

    let report = outcome.report();
    let text = report.render();
    for needle in [
        "10/10   100.00%",
        "first_audio",
        "p50 against direct",
        "p50 against relay",
        "pool (counter",
        "process CPU during the run",
        "× relay",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
    assert_eq!(outcome.pools.len(), 1);
    assert!(
        outcome.pools[0].1.is_ok(),
        "the admin endpoint was scraped: {:?}",
        outcome.pools
    );
    assert_eq!(outcome.cpu.len(), 2);
    for (name, usage) in &outcome.cpu {
        let u = usage.as_ref().expect(name);
        assert!(
            u.rss_before_kib > 0 && u.rss_peak_kib >= u.rss_before_kib,
            "{name}: {u:?}"
        );
    }
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["samples"].as_array().unwrap().len(), 30);
    assert_eq!(json["cpu"][0]["target"], "gateway");
    assert!(json["cpu"][0]["cpu_secs_per_1000_sessions"].is_number());

    gw.gateway.shutdown.cancel();
    sim.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_relay_upgrades_both_legs_and_relays_whole_sessions() {
    ws_relay_sessions(None).await;
}

/// The metering floor relays the same sessions and writes a row with usage
/// for each turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metering_ws_relay_relays_whole_sessions_and_writes_a_row_per_turn() {
    let kept = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    ws_relay_sessions(Some(patchbay_bench::metered::Rows::Kept(kept.clone()))).await;
    let rows = kept.lock().unwrap();
    assert_eq!(rows.len(), 6, "{rows:?}");
    for line in rows.iter() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(row["usage_unknown"], false, "{line}");
        assert!(row["output_audio_tokens"].as_u64().unwrap() > 0, "{line}");
    }
}

async fn ws_relay_sessions(meter: Option<patchbay_bench::metered::Rows>) {
    let sim = sim::start(
        loopback(),
        SimConfig {
            keys: vec![UPSTREAM_KEY.into()],
            audio_deltas: 3,
            audio_delta_bytes: 300,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind(loopback()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(patchbay_bench::ws_relay::serve(
        listener,
        patchbay_bench::ws_relay::WsRelay {
            upstream: sim.addr,
            client_key: CLIENT_KEY.into(),
            upstream_key: UPSTREAM_KEY.into(),
            meter,
        },
    ));
    let args: Vec<String> = [
        "--target".into(),
        format!("ws-relay=ws://{addr}/v1/realtime"),
        "--target".into(),
        format!("wrong-key=ws://{addr}/v1/realtime@not-the-key"),
        "--key".into(),
        CLIENT_KEY.into(),
        "-n".into(),
        "12".into(),
        "-c".into(),
        "4".into(),
        "--timeout-secs".into(),
        "10".into(),
    ]
    .into();
    let outcome = patchbay_bench::execute(&cli(&args), false).await.unwrap();
    for s in &outcome.result.samples {
        if s.target == 0 {
            assert!(s.error.is_none(), "through ws-relay: {s:?}");
            assert_eq!(s.timings.audio_frames, 3);
        } else {
            assert_eq!(
                s.error,
                Some(patchbay_bench::session::SessionError::Refused(401)),
                "a wrong client key is refused: {s:?}"
            );
        }
    }
    assert_eq!(
        sim.stats
            .responses_done
            .load(std::sync::atomic::Ordering::Relaxed),
        6,
        "the six sessions with the right key reached the upstream, with its key"
    );
}

/// `--close-at first-audio`: each session closes right after its first
/// audio delta, the response still in flight; the close is measured and
/// the turn is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_at_first_audio_measures_the_close_of_a_response_in_flight() {
    let sim = sim::start(
        loopback(),
        SimConfig {
            keys: vec![UPSTREAM_KEY.into()],
            audio_deltas: 200,
            audio_delta_bytes: 100,
            delta_interval: Duration::from_millis(50),
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let args: Vec<String> = [
        "--target".into(),
        format!("direct={}@{UPSTREAM_KEY}", sim.url(false)),
        "-n".into(),
        "4".into(),
        "-c".into(),
        "2".into(),
        "--close-at".into(),
        "first-audio".into(),
    ]
    .into();
    let outcome = patchbay_bench::execute(&cli(&args), false).await.unwrap();
    for s in &outcome.result.samples {
        assert!(s.error.is_none(), "{s:?}");
        assert_eq!(s.timings.audio_frames, 1, "{s:?}");
        assert!(s.timings.first_audio.is_some() && s.timings.close.is_some());
        assert_eq!((s.timings.turn, s.timings.total), (None, None), "{s:?}");
    }
    assert_eq!(outcome.result.samples.len(), 4);
    let text = outcome.report().render();
    assert!(text.contains("close "), "{text}");
    sim.stop();
}
