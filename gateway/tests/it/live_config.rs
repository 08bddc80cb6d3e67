//! The live part of the config file (`[metering]`, `[[prices]]`) applies while the gateway runs;
//! the rest waits for a restart.

use patchbay_gateway::config::{Config, Unpriced};

use crate::common::*;

#[tokio::test]
async fn an_edited_unpriced_policy_and_flush_interval_apply_without_a_restart() {
    let sim = sim(patchbay_sim::SimConfig::default()).await;
    let toml = |metering: &str| gateway_toml(&sim.url(false), &format!("[metering]\n{metering}\n"));
    let file = TempFile::new("live.toml", &toml("flush_secs = 15\nunpriced = \"allow\""));
    let config = Config::from_file_with_env(&file.0, &test_env).unwrap();
    let gw = patchbay_gateway::bootstrap::start(config).await.unwrap();
    open_with(gw.addr, CLIENT_KEY)
        .await
        .expect("an unpriced model is allowed");

    // A changed listen address in the same edit is not applied live (and does not block the rest).
    let edited = toml("flush_secs = 3\nunpriced = \"block\"")
        .replace("listen = \"127.0.0.1:0\"", "listen = \"127.0.0.1:1\"");
    std::fs::write(&file.0, edited).unwrap();
    let metering = &gw.gateway.metering;
    assert!(
        eventually(
            || metering.config().flush_secs == 3 && metering.config().unpriced == Unpriced::Block
        )
        .await,
        "the live settings were reloaded"
    );
    assert_eq!(
        open_with(gw.addr, CLIENT_KEY).await.err(),
        Some(402),
        "the unpriced model is now refused"
    );
    assert_ne!(gw.addr.port(), 1);
}

#[tokio::test]
async fn an_edit_of_a_restart_only_key_is_named_in_a_warning() {
    let sim = sim(patchbay_sim::SimConfig::default()).await;
    let child = Child::start(
        &sim.url(false),
        "[relay]\nidle_timeout_secs = 30\n[metering]\nflush_secs = 15\n",
        &[],
    )
    .await;
    let path = child.config_path().to_path_buf();
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text
        .replace("idle_timeout_secs = 30", "idle_timeout_secs = 60")
        .replace("flush_secs = 15", "flush_secs = 5");
    assert_ne!(text, edited);
    std::fs::write(&path, edited).unwrap();
    assert!(
        eventually(|| child.logs().contains("need a restart to apply")).await,
        "{}",
        child.logs()
    );
    let logs = child.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("need a restart to apply"))
        .unwrap();
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("relay.idle_timeout_secs"), "{line}");
    // The live key changed in the same edit is not named.
    assert!(!line.contains("flush_secs"), "{line}");
}
