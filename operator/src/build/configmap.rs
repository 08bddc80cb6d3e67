//! The two ConfigMaps: `<name>-gateway` (the gateway config, whose restart part is hashed into the
//! pod template) and `<name>-pool` (the live pool size, deliberately not hashed).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use sha2::{Digest, Sha256};

use super::meta::{child_meta, gateway_name, pool_name};
use crate::crd::RealtimeRoute;
use crate::gateway_config::{self, CONFIG_FILE_NAME, POOL_SIZE_KEY};
use crate::pool;

/// `<name>-gateway` with one key, `gateway.toml`.
pub fn gateway_config_map(route: &RealtimeRoute) -> ConfigMap {
    ConfigMap {
        metadata: child_meta(route, gateway_name(route)),
        data: Some(BTreeMap::from([(
            CONFIG_FILE_NAME.to_string(),
            gateway_config::render_watching(&route.spec, Some(&pool_name(route))),
        )])),
        ..ConfigMap::default()
    }
}

/// `<name>-pool` with one key, `REALTIME_POOL_SIZE`, a bare decimal number; and that number.
pub fn pool_config_map(route: &RealtimeRoute, observed_replicas: Option<i32>) -> (ConfigMap, i32) {
    let replicas = pool::sizing_replicas(&route.spec, observed_replicas);
    let size = pool::pool_size(&route.spec, replicas);
    let cm = ConfigMap {
        metadata: child_meta(route, pool_name(route)),
        data: Some(BTreeMap::from([(
            POOL_SIZE_KEY.to_string(),
            size.to_string(),
        )])),
        ..ConfigMap::default()
    };
    (cm, size)
}

/// SHA-256 of the part of the gateway ConfigMap's `gateway.toml` that needs a restart
/// ([`gateway_config::restart_part`]), hex-encoded: the pod-template annotation. Edits of the
/// live part (prices, metering) change the ConfigMap, which the gateway re-reads, and not this.
pub fn config_hash(cm: &ConfigMap) -> String {
    let mut hasher = Sha256::new();
    for (key, value) in cm.data.iter().flatten() {
        let value = if key == CONFIG_FILE_NAME {
            gateway_config::restart_part(value)
        } else {
            value.clone()
        };
        hasher.update(key.as_bytes());
        hasher.update([0]);
        hasher.update(value.as_bytes());
        hasher.update([0]);
    }
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn the_pool_config_map_holds_only_the_size_as_a_bare_number() {
        let mut spec = fixtures::autoscaled_spec();
        spec.peak_concurrency = 100;
        let route = fixtures::route(spec);
        let (cm, size) = pool_config_map(&route, Some(3));
        assert_eq!(size, 34);
        let data = cm.data.unwrap();
        assert_eq!(data.len(), 1);
        assert_eq!(data["REALTIME_POOL_SIZE"], "34");
    }

    #[test]
    fn the_pool_config_map_follows_the_observed_replicas_under_an_hpa() {
        let mut spec = fixtures::autoscaled_spec();
        spec.peak_concurrency = 100;
        let route = fixtures::route(spec);
        assert_eq!(pool_config_map(&route, None).1, 50); // replicas.min = 2
        assert_eq!(pool_config_map(&route, Some(4)).1, 25);
        assert_eq!(pool_config_map(&route, Some(10)).1, 10);
    }

    #[test]
    fn the_gateway_config_map_holds_gateway_toml_and_its_hash_is_stable() {
        let route = fixtures::route(fixtures::full_spec());
        let cm = gateway_config_map(&route);
        assert!(cm.data.as_ref().unwrap().contains_key("gateway.toml"));
        assert_eq!(config_hash(&cm), config_hash(&gateway_config_map(&route)));
        assert_eq!(config_hash(&cm).len(), 64);
    }
}
