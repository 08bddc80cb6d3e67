//! Stage 1 of a reconcile: is the route servable?
//!
//! The schema already enforces types, minimums, enums and `replicas.min <= max`; what is left is
//! what a schema cannot say ([`check_spec`], pure) and whether the referenced Secrets exist
//! ([`check_secrets`]). Secrets are looked up by metadata only: the operator needs to know they
//! are there, never what they hold, and its RBAC grants `get` on Secrets for exactly this.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use crate::context::Context;
use crate::crd::{Provider, RealtimeRouteSpec, SecretKeyRef};
use crate::error::{Error, Result};

/// Problems a schema cannot express.
pub fn check_spec(spec: &RealtimeRouteSpec) -> Result<()> {
    if let Some(url) = &spec.upstream.url {
        if !(url.starts_with("wss://") || url.starts_with("ws://")) {
            return Err(Error::InvalidSpec(format!(
                "upstream.url must be a ws:// or wss:// URL, got {url:?}"
            )));
        }
    } else if spec.upstream.provider == Provider::Azure {
        return Err(Error::InvalidSpec(
            "upstream.url is required for provider azure".into(),
        ));
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

/// Fails with [`Error::SecretNotFound`] on the first referenced Secret that does not exist.
pub async fn check_secrets(ctx: &Context, namespace: &str, spec: &RealtimeRouteSpec) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    for (field, secret) in secret_refs(spec) {
        let found = ctx
            .call(
                "get",
                "Secret",
                &secret.name,
                secrets.get_metadata_opt(&secret.name),
            )
            .await?;
        if found.is_none() {
            return Err(Error::SecretNotFound {
                namespace: namespace.to_string(),
                name: secret.name.clone(),
                field,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

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
    fn a_model_priced_twice_is_refused() {
        let mut spec = fixtures::full_spec();
        let price = spec.metering.prices[0].clone();
        spec.metering.prices.push(price);
        assert!(check_spec(&spec).is_err());
    }

    #[test]
    fn the_redis_secret_is_checked_only_when_named() {
        assert_eq!(secret_refs(&fixtures::minimal_spec()).len(), 2);
        assert_eq!(secret_refs(&fixtures::full_spec()).len(), 3);
    }
}
