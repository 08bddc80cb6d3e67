//! The manifests in `examples/` are valid routes.

use std::path::PathBuf;

use patchbay_operator::crd::RealtimeRoute;
use patchbay_operator::validate;
use serde::Deserialize;

const EXAMPLES: [&str; 6] = [
    "realtimeroute.yaml",
    "realtimeroute-minimal.yaml",
    "realtimeroute-full.yaml",
    "realtimeroute-upstreams.yaml",
    "realtimeroute-translations.yaml",
    "realtimeroute-gateway-api.yaml",
];

fn example_routes(file: &str) -> Vec<RealtimeRoute> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("example file");
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("YAML document"))
        .filter(|doc| doc["kind"] == "RealtimeRoute")
        .map(|doc| serde_yaml::from_value(doc).expect("a valid RealtimeRoute"))
        .collect()
}

#[test]
fn every_example_holds_one_servable_route() {
    for file in EXAMPLES {
        let routes = example_routes(file);
        assert_eq!(routes.len(), 1, "{file}");
        validate::check_spec(&routes[0].spec).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
}
