//! `/metrics` of a gateway that has served nothing yet: every family is
//! declared (`# TYPE`), and the series whose labels the configuration
//! already tells (each route's model and upstreams, fixed reason sets) read
//! 0, so dashboards show 0 rather than "no data".

use crate::common::*;
use patchbay_sim::SimConfig;

/// The value of the sample of `name` whose labels include every one of
/// `labels`, if the exposition has one.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{'))
        })
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test]
async fn a_fresh_gateway_exports_every_family_and_its_known_series_at_zero() {
    let sim = sim(SimConfig::default()).await;
    let url = sim.url(false);
    let gw = gateway(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [[routes]]\nmodel = \"{MODEL}\"\n\
         [[routes.upstreams]]\nname = \"a\"\nupstream_url = \"{url}\"\napi_key_env = \"SIM_KEY\"\n\
         [[routes.upstreams]]\nname = \"b\"\nupstream_url = \"{url}\"\napi_key_env = \"SIM_KEY\"\n\
         [pool]\nsize = 0\n"
    ))
    .await;
    let (status, text) = http_get(gw.admin_addr, "/metrics").await;
    assert_eq!(status, 200);
    let model = format!("model=\"{MODEL}\"");
    let m = model.as_str();
    for (name, labels) in [
        ("patchbay_budget_blocks_total", vec![m]),
        ("patchbay_rate_limit_blocks_total", vec![m]),
        ("patchbay_client_disconnects_total", vec![m]),
        ("patchbay_pool_hits_total", vec![m]),
        ("patchbay_pool_misses_total", vec![m, "reason=\"empty\""]),
        ("patchbay_pool_misses_total", vec![m, "reason=\"dead\""]),
        (
            "patchbay_pool_dials_total",
            vec![m, "upstream=\"a\"", "result=\"ok\""],
        ),
        (
            "patchbay_pool_dials_total",
            vec![m, "upstream=\"b\"", "result=\"timeout\""],
        ),
        ("patchbay_upstream_circuit_open", vec![m, "upstream=\"a\""]),
        ("patchbay_upstream_circuit_open", vec![m, "upstream=\"b\""]),
        (
            "patchbay_upstream_failovers_total",
            vec![m, "from=\"a\"", "to=\"b\"", "reason=\"timeout\""],
        ),
        (
            "patchbay_upstream_failovers_total",
            vec![m, "from=\"b\"", "to=\"a\"", "reason=\"rate_limited\""],
        ),
        ("patchbay_usage_records_dropped_total", vec![m]),
        ("patchbay_usage_implausible_total", vec![m]),
        ("patchbay_usage_duplicates_total", vec![m]),
        ("patchbay_cost_usd_total", vec![m]),
        (
            "patchbay_tokens_total",
            vec![m, "direction=\"output\"", "modality=\"audio\""],
        ),
        ("patchbay_client_secrets_minted_total", vec![m]),
        ("patchbay_realtime_sessions_active", vec![m]),
        ("patchbay_upstream_dial_seconds_count", vec![m]),
        ("patchbay_session_setup_seconds_count", vec![m]),
    ] {
        assert_eq!(
            sample(&text, name, &labels),
            Some(0.0),
            "{name} {labels:?} at 0 in {text}"
        );
    }
    // Families keyed by what only traffic tells are declared, without series.
    for family in [
        "patchbay_realtime_sessions counter",
        "patchbay_turns counter",
        "patchbay_admission_refusals counter",
        "patchbay_store_refusals counter",
        "patchbay_config_reloads counter",
        "patchbay_client_secrets_refused counter",
        "patchbay_call_action_refusals counter",
        "patchbay_outbox_dropped counter",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family}\n")),
            "{family} declared in {text}"
        );
    }
}
