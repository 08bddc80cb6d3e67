//! Secrets as files: a route's `api_key_file` is re-read while the gateway runs, and the next
//! dial (a session's or the pool's refill) sends the rotated key, with no restart and without
//! cutting the sessions that are live.

use patchbay_gateway::bootstrap;
use patchbay_gateway::config::Config;
use patchbay_sim::{self as sim, SimConfig};

use crate::common::*;

const OLD_KEY: &str = "sk-rotate-old";
const NEW_KEY: &str = "sk-rotate-new";

fn toml(upstream_url: &str, key_file: &std::path::Path, pool: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nupgrade_timeout_secs = 5\n\
         [[routes]]\nmodel = \"{MODEL}\"\nupstream_url = \"{upstream_url}\"\napi_key_file = \"{}\"\n\
         [pool]\n{pool}\n",
        key_file.display()
    )
}

/// The credential of the simulator's most recent upgrade.
fn last_key(sim: &sim::SimHandle) -> Option<String> {
    sim.stats.auth_headers.lock().unwrap().last().cloned()
}

async fn sim_knowing_both_keys() -> sim::SimHandle {
    sim::start(
        localhost(),
        SimConfig {
            keys: vec![OLD_KEY.into(), NEW_KEY.into()],
            ..SimConfig::default()
        },
    )
    .await
    .expect("simulator starts")
}

#[tokio::test]
async fn a_rotated_upstream_key_file_is_sent_by_the_next_dial_and_live_sessions_continue() {
    let sim = sim_knowing_both_keys().await;
    let key_file = TempFile::new("upstream-key", &format!("{OLD_KEY}\n"));
    let config =
        Config::from_toml_with_env(&toml(&sim.url(false), &key_file.0, "size = 0"), &test_env)
            .expect("valid config");
    let gw = bootstrap::start(config).await.expect("gateway starts");

    let mut live = open_with(gw.addr, CLIENT_KEY).await.expect("session");
    assert_eq!(last_key(&sim).as_deref(), Some(OLD_KEY));

    std::fs::write(&key_file.0, format!("{NEW_KEY}\n")).unwrap();
    // The file is polled; new sessions pick the new key up within a few polls.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let ws = open_with(gw.addr, CLIENT_KEY).await.expect("session");
        drop(ws);
        if last_key(&sim).as_deref() == Some(NEW_KEY) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no dial used the rotated key"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // The session dialled with the old key is untouched.
    let texts = one_turn(&mut live).await;
    assert_eq!(kind(texts.last().unwrap()), "response.done");
}

#[tokio::test]
async fn the_pool_refills_with_the_rotated_key() {
    let sim = sim_knowing_both_keys().await;
    let key_file = TempFile::new("upstream-key-pool", OLD_KEY);
    let config = Config::from_toml_with_env(
        &toml(&sim.url(false), &key_file.0, "size = 1\nmax_idle_secs = 30"),
        &test_env,
    )
    .expect("valid config");
    let gw = bootstrap::start(config).await.expect("gateway starts");
    assert!(
        eventually(|| last_key(&sim).as_deref() == Some(OLD_KEY)).await,
        "the pool warms with the old key"
    );

    std::fs::write(&key_file.0, NEW_KEY).unwrap();
    // Take the warm socket (dialled with the old key) and wait for its refill; once the file was
    // re-read, a refill dials with the new key.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let upgrades = || {
            sim.stats
                .upgrades
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let before = upgrades();
        let ws = open_with(gw.addr, CLIENT_KEY).await.expect("session");
        drop(ws);
        assert!(eventually(|| upgrades() > before).await, "the pool refills");
        if last_key(&sim).as_deref() == Some(NEW_KEY) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no refill used the rotated key"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // No upgrade after the rotation was refused: every dial carried a key the upstream knows.
    assert_eq!(
        sim.stats.refused.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}
