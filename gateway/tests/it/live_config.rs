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
