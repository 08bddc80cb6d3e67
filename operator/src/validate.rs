//! Stage 1 of a reconcile: is the route servable?
//!
//! The schema already enforces types, minimums, enums and `replicas.min <= max`; what is left is
//! what a schema cannot say ([`check_route`], pure). Whether the referenced Secrets exist is not
//! checked here: the operator has no access to Secrets at all. A missing one keeps the gateway
//! pods from starting, which [`crate::pods`] reports from the pods and their events.

use kube::ResourceExt;

use crate::crd::{Provider, RealtimeRoute, RealtimeRouteSpec, SecretKeyRef};
use crate::error::{Error, Result};

/// The route's name becomes its Service's name and a label value: it must be
/// a DNS-1035 label (at most 63 characters of `a-z`, `0-9` and `-`, starting
/// with a letter, ending with a letter or digit). Otherwise the Service (and
/// what is applied after it) would be refused by the API server on every
/// reconcile, with no condition saying why.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidSpec(format!(
            "metadata.name {name:?} cannot name the route's Service: use at most 63 characters \
             of a-z, 0-9 and '-', starting with a letter and ending with a letter or digit"
        )))
    }
}

/// The rules the gateway's own config loader applies to `upstream_url`, so that a route the
/// operator accepts never renders a config its pods refuse (and crash-loop on).
fn check_upstream_url(url: &str, provider: Provider) -> Result<()> {
    let invalid = |why: String| Err(Error::InvalidSpec(format!("upstream.url {url:?}: {why}")));
    // The same parser as the gateway's loader (`url`), so ports, hosts and escapes are judged
    // the same way.
    let parsed = match url::Url::parse(url) {
        Ok(u) => u,
        Err(e) => return invalid(format!("not a valid URL ({e})")),
    };
    if !matches!(parsed.scheme(), "ws" | "wss") {
        return invalid("must be a ws:// or wss:// URL".into());
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return invalid("has no host".into());
    }
    if provider == Provider::Azure
        && !parsed.path().ends_with("/openai/v1/realtime")
        && !parsed.query_pairs().any(|(k, _)| k == "api-version")
    {
        return invalid("an Azure /openai/realtime URL needs ?api-version=…".into());
    }
    Ok(())
}

/// Problems a schema cannot express.
pub fn check_spec(spec: &RealtimeRouteSpec) -> Result<()> {
    if let Some(url) = &spec.upstream.url {
        check_upstream_url(url, spec.upstream.provider)?;
    } else if spec.upstream.provider == Provider::Azure {
        return Err(Error::InvalidSpec(
            "upstream.url is required for provider azure".into(),
        ));
    }
    let gw = &spec.gateway;
    let overrides = [
        (
            "gateway.resources",
            gw.resources.as_ref().map(|r| r.get().err()),
        ),
        (
            "gateway.tolerations",
            gw.tolerations.as_ref().map(|t| t.get().err()),
        ),
        (
            "gateway.affinity",
            gw.affinity.as_ref().map(|a| a.get().err()),
        ),
    ];
    for (field, problem) in overrides {
        if let Some(Some(e)) = problem {
            return Err(Error::InvalidSpec(format!(
                "{field} is not a valid Kubernetes value: {e}"
            )));
        }
    }
    let models = spec.metering.prices.iter().map(|p| p.model.as_str());
    let mut seen = std::collections::BTreeSet::new();
    for model in models {
        if !seen.insert(model) {
            return Err(Error::InvalidSpec(format!(
                "metering.prices lists model {model:?} twice"
            )));
        }
    }
    Ok(())
}

/// Every Secret the route references, with the spec field that names it.
pub fn secret_refs(spec: &RealtimeRouteSpec) -> Vec<(&'static str, &SecretKeyRef)> {
    let mut refs = vec![
        (
            "upstream.apiKeySecretRef",
            &spec.upstream.api_key_secret_ref,
        ),
        ("clientKeysSecretRef", &spec.client_keys_secret_ref),
    ];
    if let Some(redis) = &spec.metering.redis_url_secret_ref {
        refs.push(("metering.redisUrlSecretRef", redis));
    }
    refs
}

/// Stage 1 as a whole: the route's name, then its spec.
pub fn check_route(route: &RealtimeRoute) -> Result<()> {
    check_name(&route.name_any())?;
    check_spec(&route.spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn a_route_name_must_be_a_dns_label() {
        for good in ["voice", "v1-voice", "a", &"a".repeat(63)] {
            check_name(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for bad in ["", "1voice", "v1.voice", "Voice", "voice-", &"a".repeat(64)] {
            let err = check_name(bad).unwrap_err();
            assert_eq!(err.reason(), "InvalidSpec", "{bad}");
        }
    }

    #[test]
    fn a_malformed_pod_override_decodes_and_is_reported_on_its_route_alone() {
        // What the API server accepts for an open object; a typed field
        // would fail the whole watch page.
        let spec: RealtimeRouteSpec = serde_json::from_value(serde_json::json!({
            "model": "gpt-realtime",
            "upstream": {"apiKeySecretRef": {"name": "openai", "key": "api-key"}},
            "clientKeysSecretRef": {"name": "keys", "key": "keys.toml"},
            "gateway": {"resources": {"limits": "1"}}
        }))
        .expect("a route with any object in gateway.resources decodes");
        let err = check_spec(&spec).unwrap_err();
        assert_eq!(err.reason(), "InvalidSpec");
        assert!(err.to_string().contains("gateway.resources"), "{err}");

        let mut spec = fixtures::full_spec();
        spec.gateway.tolerations =
            Some(serde_json::from_value(serde_json::json!([{"tolerationSeconds": "60"}])).unwrap());
        assert!(check_spec(&spec)
            .unwrap_err()
            .to_string()
            .contains("gateway.tolerations"));
        check_spec(&fixtures::full_spec()).expect("the well-formed overrides pass");
    }

    #[test]
    fn an_azure_route_needs_a_url() {
        let mut spec = fixtures::minimal_spec();
        spec.upstream.provider = Provider::Azure;
        let err = check_spec(&spec).unwrap_err();
        assert_eq!(err.reason(), "InvalidSpec");
        spec.upstream.url = Some("wss://res.openai.azure.com/openai/v1/realtime".into());
        check_spec(&spec).unwrap();
    }

    #[test]
    fn an_http_upstream_url_is_refused() {
        let mut spec = fixtures::minimal_spec();
        spec.upstream.url = Some("https://api.openai.com/v1/realtime".into());
        assert!(check_spec(&spec).unwrap_err().to_string().contains("ws://"));
    }

    #[test]
    fn upstream_urls_the_gateway_would_refuse_are_refused_here() {
        let mut spec = fixtures::minimal_spec();
        for url in [
            "wss://",
            "wss:// /x",
            "wss://host:99999/v1/realtime",
            "wss://host:abc/v1/realtime",
        ] {
            spec.upstream.url = Some(url.into());
            let err = check_spec(&spec).unwrap_err();
            assert_eq!(err.reason(), "InvalidSpec", "{url}");
            assert!(err.to_string().contains("upstream.url"), "{url}: {err}");
        }
        spec.upstream.provider = Provider::Azure;
        spec.upstream.url = Some("wss://res.openai.azure.com/openai/realtime?deployment=d".into());
        assert!(check_spec(&spec)
            .unwrap_err()
            .to_string()
            .contains("api-version"));
        for ok in [
            "wss://res.openai.azure.com/openai/realtime?api-version=2025-04-01-preview&deployment=d",
            "wss://res.openai.azure.com/openai/v1/realtime",
        ] {
            spec.upstream.url = Some(ok.into());
            check_spec(&spec).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn a_model_priced_twice_is_refused() {
        let mut spec = fixtures::full_spec();
        let price = spec.metering.prices[0].clone();
        spec.metering.prices.push(price);
        assert!(check_spec(&spec).is_err());
    }

    #[test]
    fn the_redis_secret_is_referenced_only_when_named() {
        assert_eq!(secret_refs(&fixtures::minimal_spec()).len(), 2);
        assert_eq!(secret_refs(&fixtures::full_spec()).len(), 3);
    }
}
