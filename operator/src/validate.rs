//! Stage 1 of a reconcile: is the route servable?
//!
//! The schema already enforces types, minimums, enums and `replicas.min <= max`; what is left is
//! what a schema cannot say ([`check_route`], pure), and the gateway's own rules again (upstream
//! URLs, the bounds on what renders into `gateway.toml`, all from `patchbay-config`), so a route
//! accepted here renders a config the gateway loads. Whether the referenced Secrets exist is not
//! checked here: the operator has no access to Secrets at all. A missing one keeps the gateway
//! pods from starting, which [`crate::pods`] reports from the pods and their events.

use kube::ResourceExt;

use crate::crd::{
    Endpoint, Protocol, Provider, RealtimeRoute, RealtimeRouteSpec, SecretKeyRef,
    MAX_CLIENT_SECRET_TTL_SECONDS, MAX_PRICE_USD_PER_MILLION_TOKENS, MAX_PRICE_USD_PER_MINUTE,
    MAX_SECONDS, MAX_UPSTREAMS, MIN_CLIENT_SECRET_TTL_SECONDS, MIN_DRAIN_WAIT_SECONDS,
    MIN_POOL_MAX_IDLE_SECONDS, OPERATOR_ANNOTATION_PREFIX, OPERATOR_POD_LABELS,
    POD_DELETION_COST_ANNOTATION,
};
use crate::error::{Error, Result};

/// The route's name becomes its Service's name and a label value: it must be
/// a DNS-1035 label (at most 63 characters of `a-z`, `0-9` and `-`, starting
/// with a letter, ending with a letter or digit). Otherwise the Service (and
/// what is applied after it) would be refused by the API server on every
/// reconcile, with no condition saying why.
pub fn check_name(name: &str) -> Result<()> {
    let ok = is_dns_label(name) && name.starts_with(|c: char| c.is_ascii_lowercase());
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidSpec(format!(
            "metadata.name {name:?} cannot name the route's Service: use at most 63 characters \
             of a-z, 0-9 and '-', starting with a letter and ending with a letter or digit"
        )))
    }
}

/// A DNS-1123 label: at most 63 characters of `a-z`, `0-9` and `-`, starting and ending with a
/// letter or digit.
fn is_dns_label(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= 63
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name.chars().all(|c| alnum(c) || c == '-')
}

/// The gateway's own rules for `upstream_url` (`patchbay-config`), so that a route the operator
/// accepts never renders a config its pods refuse (and crash-loop on); a missing URL is
/// OpenAI's for an OpenAI upstream. `field` names the URL's place in the spec (`upstream.url`,
/// `upstreams[1].url`).
fn check_upstream_url(field: &str, url: Option<&str>, provider: Provider) -> Result<()> {
    let Some(url) = url else {
        return match provider {
            Provider::Azure => Err(Error::InvalidSpec(format!(
                "{field} is required for provider azure"
            ))),
            Provider::Openai => Ok(()),
        };
    };
    patchbay_config::validate_upstream_url(provider, url)
        .map_err(|e| Error::InvalidSpec(format!("{field} {url:?}: {e}")))
}

/// `value` of the spec's `field` within `min..=max`: the gateway's bounds on the key it renders
/// to, which the schema publishes too. Checked here as well because an object stored under an
/// older schema is not admitted again, and a value out of bounds would render a config the pods
/// refuse.
fn check_bounds(field: &str, value: i32, min: i32, max: i32) -> Result<()> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(Error::InvalidSpec(format!(
            "{field} {value} must be from {min} to {max}"
        )))
    }
}

/// Every number of seconds the spec renders into `gateway.toml`, within the gateway's bounds.
fn check_seconds(spec: &RealtimeRouteSpec) -> Result<()> {
    let seconds = [
        (
            "pool.maxIdleSeconds",
            spec.pool.max_idle_seconds,
            MIN_POOL_MAX_IDLE_SECONDS,
        ),
        ("metering.flushSeconds", spec.metering.flush_seconds, 0),
        (
            "drain.waitSeconds",
            spec.drain.wait_seconds,
            MIN_DRAIN_WAIT_SECONDS,
        ),
        ("drain.lingerSeconds", spec.drain.linger_seconds, 0),
    ];
    for (field, value, min) in seconds {
        check_bounds(field, value, min, MAX_SECONDS)?;
    }
    Ok(())
}

/// `upstream` or `upstreams`, exactly one: the CEL rule on the spec says the same, for API
/// servers that evaluate it; this check covers the ones that do not.
fn check_upstreams(spec: &RealtimeRouteSpec) -> Result<()> {
    let invalid = |why: String| Err(Error::InvalidSpec(why));
    match (&spec.upstream, spec.upstreams.is_empty()) {
        (Some(_), false) => {
            return invalid("set exactly one of spec.upstream and spec.upstreams, not both".into())
        }
        (None, true) => {
            return invalid("set exactly one of spec.upstream and spec.upstreams".into())
        }
        (Some(up), true) => {
            return check_upstream_url("upstream.url", up.url.as_deref(), up.provider)
        }
        (None, false) => {}
    }
    if spec.upstreams.len() > MAX_UPSTREAMS {
        return invalid(format!(
            "spec.upstreams lists {} upstreams; at most {MAX_UPSTREAMS}",
            spec.upstreams.len()
        ));
    }
    let first = &spec.upstreams[0];
    for (i, up) in spec.upstreams.iter().enumerate() {
        if !is_dns_label(&up.name) {
            return invalid(format!(
                "upstreams[{i}].name {:?} must be a DNS label: at most 63 characters of a-z, \
                 0-9 and '-', starting and ending with a letter or digit",
                up.name
            ));
        }
        if spec.upstreams[..i].iter().any(|u| u.name == up.name) {
            return invalid(format!("upstreams[{i}].name {:?} is listed twice", up.name));
        }
        if up.protocol != first.protocol {
            return invalid(format!(
                "route for model {:?} mixes protocols: upstreams[{i}] ({:?}) speaks {:?}, \
                 upstreams[0] ({:?}) speaks {:?}; all upstreams of a route speak one protocol",
                spec.model, up.name, up.protocol, first.name, first.protocol
            ));
        }
        check_upstream_url(
            &format!("upstreams[{i}].url"),
            up.url.as_deref(),
            up.provider,
        )?;
        if up.priority < 0 || up.weight < 0 {
            return invalid(format!("upstreams[{i}]: priority and weight must be >= 0"));
        }
    }
    Ok(())
}

/// `endpoint` and `intent` as the gateway loads them (its `routes[i].intent`,
/// `routes[i].protocol` and `routes[i].upstream_url` checks): only a `realtime` route takes an
/// intent, a `live` route speaks no beta, and every route dials only URLs of its own endpoint
/// (`patchbay_config::endpoint_of_url`, the gateway's rule). An OpenAI upstream without a `url`
/// gets the endpoint's own, so only a named URL can miss.
fn check_endpoint(spec: &RealtimeRouteSpec) -> Result<()> {
    let endpoint = spec.endpoint;
    let name = endpoint.as_str();
    if endpoint != Endpoint::Realtime && spec.intent.is_some() {
        return Err(Error::InvalidSpec(format!(
            "spec.intent: a route with endpoint: {name} takes no intent"
        )));
    }
    let single = spec
        .upstream
        .iter()
        .map(|u| ("upstream".to_string(), &u.url, u.protocol));
    let listed = (spec.upstreams.iter().enumerate())
        .map(|(i, u)| (format!("upstreams[{i}]"), &u.url, u.protocol));
    for (field, url, protocol) in single.chain(listed) {
        if endpoint == Endpoint::Live && protocol != Protocol::Ga {
            return Err(Error::InvalidSpec(format!(
                "{field}.protocol: GPT-Live has no beta protocol"
            )));
        }
        let Some(url) = url else { continue };
        let dials = patchbay_config::endpoint_of_url(url);
        if dials != endpoint {
            let why = if endpoint == Endpoint::Realtime {
                format!(
                    "this URL is OpenAI's {0} endpoint: set spec.endpoint: {0}",
                    dials.as_str()
                )
            } else {
                format!(
                    "a route with endpoint: {name} dials its endpoint (…{})",
                    endpoint.openai_path()
                )
            };
            return Err(Error::InvalidSpec(format!("{field}.url {url:?}: {why}")));
        }
    }
    Ok(())
}

/// `telemetry`: an `http(s)://host…` endpoint, resource attributes that survive the
/// `key=value,key=value` form the gateway reads them in, a ratio in `0..=1`.
fn check_telemetry(spec: &RealtimeRouteSpec) -> Result<()> {
    let Some(t) = &spec.telemetry else {
        return Ok(());
    };
    let bad = |what: String| Err(Error::InvalidSpec(format!("telemetry.{what}")));
    let rest = t
        .endpoint
        .strip_prefix("http://")
        .or_else(|| t.endpoint.strip_prefix("https://"));
    match rest {
        Some(rest)
            if !rest.is_empty()
                && !rest.starts_with('/')
                && !rest.contains(char::is_whitespace) => {}
        _ => {
            return bad(format!(
                "endpoint {:?}: an http:// or https:// URL with a host",
                t.endpoint
            ))
        }
    }
    for (key, value) in &t.resource_attributes {
        if key.is_empty() || key.contains([',', '=']) || value.contains(',') {
            return bad(format!(
                "resourceAttributes {key:?}: keys must be non-empty without ',' or '=', values without ','"
            ));
        }
    }
    if let Some(r) = t.traces_sampler_ratio {
        if !(0.0..=1.0).contains(&r) {
            return bad(format!("tracesSamplerRatio {r}: must be within 0 and 1"));
        }
    }
    Ok(())
}

/// `clientSecrets`: one of `key` and `keys`, no key twice, a TTL cap the gateway accepts.
fn check_client_secrets(spec: &RealtimeRouteSpec) -> Result<()> {
    let Some(cs) = &spec.client_secrets else {
        return Ok(());
    };
    let invalid = |why: String| Err(Error::InvalidSpec(why));
    let r = &cs.signing_keys_secret_ref;
    let forms = usize::from(r.key.is_some()) + usize::from(!r.keys.is_empty());
    if forms != 1 {
        return invalid(
            "clientSecrets.signingKeysSecretRef: set exactly one of key and keys".into(),
        );
    }
    let keys = r.key_list();
    for (i, k) in keys.iter().enumerate() {
        if k.is_empty() {
            return invalid("clientSecrets.signingKeysSecretRef: a key name is empty".into());
        }
        if keys[..i].contains(k) {
            return invalid(format!(
                "clientSecrets.signingKeysSecretRef.keys lists {k:?} twice"
            ));
        }
    }
    match cs.max_ttl_seconds {
        Some(ttl) => check_bounds(
            "clientSecrets.maxTTLSeconds",
            ttl,
            MIN_CLIENT_SECRET_TTL_SECONDS,
            MAX_CLIENT_SECRET_TTL_SECONDS,
        ),
        None => Ok(()),
    }
}

/// A model name that is empty or only whitespace: the gateway refuses `spec.model` so at start
/// (the pods would crash-loop), and an upstream model so would dial every session with
/// `?model=`. Checked here too because an object stored under an older schema (no `minLength`)
/// is not admitted again, and the schema cannot say "not only whitespace".
fn check_models(spec: &RealtimeRouteSpec) -> Result<()> {
    let upstream = spec
        .upstream
        .iter()
        .map(|up| ("upstream.model".to_string(), up.model.as_deref()));
    let listed = spec
        .upstreams
        .iter()
        .enumerate()
        .map(|(i, up)| (format!("upstreams[{i}].model"), up.model.as_deref()));
    let models = std::iter::once(("model".to_string(), Some(spec.model.as_str())))
        .chain(upstream)
        .chain(listed);
    for (field, model) in models {
        if model.is_some_and(|m| m.trim().is_empty()) {
            return Err(Error::InvalidSpec(format!(
                "{field} {:?} is blank: name a model",
                model.unwrap_or_default()
            )));
        }
    }
    Ok(())
}

/// The most characters of a Secret key (the API server's bound on a Secret's data keys).
const MAX_SECRET_KEY_CHARS: usize = 253;

/// A key a Secret can hold (what the API server admits in `data`): at most 253 characters of
/// `a-z`, `A-Z`, `0-9`, `-`, `_` and `.`, not `.` and not starting with `..`. So it is also a plain
/// file name, which it becomes: each key is mounted as a file of its own name and rendered into
/// `gateway.toml` as that file's path.
fn is_secret_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_SECRET_KEY_CHARS
        && key != "."
        && !key.starts_with("..")
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Every Secret key the route names is one a Secret can hold. Otherwise no Secret could provide
/// it, and a key such as `../k` (a path out of the mount) would be refused by the API server as
/// the Deployment's volume `items[].path`, after the ConfigMaps were written.
fn check_secret_keys(spec: &RealtimeRouteSpec) -> Result<()> {
    for (field, secret) in secret_refs(spec) {
        if !is_secret_key(&secret.key) {
            return Err(Error::InvalidSpec(format!(
                "{field} key {:?} is not a Secret key: use at most {MAX_SECRET_KEY_CHARS} \
                 characters of a-z, A-Z, 0-9, '-', '_' and '.', not '.' and not starting with '..'",
                secret.key
            )));
        }
    }
    Ok(())
}

/// Problems a schema cannot express.
pub fn check_spec(spec: &RealtimeRouteSpec) -> Result<()> {
    check_models(spec)?;
    check_upstreams(spec)?;
    check_endpoint(spec)?;
    check_seconds(spec)?;
    check_client_secrets(spec)?;
    check_telemetry(spec)?;
    check_secret_keys(spec)?;
    check_pod_metadata(spec)?;
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
        (
            "gateway.topologySpreadConstraints",
            gw.topology_spread_constraints
                .as_ref()
                .map(|t| t.get().err()),
        ),
    ];
    for (field, problem) in overrides {
        if let Some(Some(e)) = problem {
            return Err(Error::InvalidSpec(format!(
                "{field} is not a valid Kubernetes value: {e}"
            )));
        }
    }
    check_prices(spec)
}

/// `gateway.podLabels` and `gateway.podAnnotations` leave the operator's own keys alone: its labels
/// select the route's pods (Deployment, Service, PDB, the deletion-cost keeper and the chart's
/// admission policy), so a pod relabelled by a route would leave its own Deployment's selector or
/// be taken for another route's; its annotations carry the config hash and the deletion cost.
/// The CEL rules on the two maps say the same, for API servers that evaluate them.
fn check_pod_metadata(spec: &RealtimeRouteSpec) -> Result<()> {
    let gw = &spec.gateway;
    if let Some(key) = gw
        .pod_labels
        .keys()
        .find(|k| OPERATOR_POD_LABELS.contains(&k.as_str()))
    {
        return Err(Error::InvalidSpec(format!(
            "gateway.podLabels sets {key:?}, one of the operator's own labels ({}), which select \
             the route's gateway pods: remove it",
            OPERATOR_POD_LABELS.join(", ")
        )));
    }
    if let Some(key) = gw.pod_annotations.keys().find(|k| {
        k.starts_with(OPERATOR_ANNOTATION_PREFIX) || k.as_str() == POD_DELETION_COST_ANNOTATION
    }) {
        return Err(Error::InvalidSpec(format!(
            "gateway.podAnnotations sets {key:?}, which the operator owns (keys under \
             {OPERATOR_ANNOTATION_PREFIX} and {POD_DELETION_COST_ANNOTATION}): remove it"
        )));
    }
    Ok(())
}

/// `metering.prices`: no model twice, and every rate a number from 0 to the gateway's ceiling
/// ([`MAX_PRICE_USD_PER_MILLION_TOKENS`]). The gateway refuses a larger (or non-finite) price at
/// start, so such a route would crash-loop its pods; the schema publishes the same `maximum`, and
/// this check covers objects stored under an older schema and API servers that skip it.
fn check_prices(spec: &RealtimeRouteSpec) -> Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, p) in spec.metering.prices.iter().enumerate() {
        if !seen.insert(p.model.as_str()) {
            return Err(Error::InvalidSpec(format!(
                "metering.prices lists model {:?} twice",
                p.model
            )));
        }
        let rates = [
            ("textInput", p.text_input),
            ("cachedTextInput", p.cached_text_input),
            ("audioInput", p.audio_input),
            ("cachedAudioInput", p.cached_audio_input),
            ("textOutput", p.text_output),
            ("audioOutput", p.audio_output),
        ];
        for (field, rate) in rates {
            if !(rate.is_finite() && (0.0..=MAX_PRICE_USD_PER_MILLION_TOKENS).contains(&rate)) {
                return Err(Error::InvalidSpec(format!(
                    "metering.prices[{i}].{field} {rate} (model {:?}) must be a number from 0 to \
                     {MAX_PRICE_USD_PER_MILLION_TOKENS} USD per 1M tokens, the gateway's ceiling",
                    p.model
                )));
            }
        }
        if let Some(rate) = p.usd_per_minute {
            if !(rate.is_finite() && (0.0..=MAX_PRICE_USD_PER_MINUTE).contains(&rate)) {
                return Err(Error::InvalidSpec(format!(
                    "metering.prices[{i}].usdPerMinute {rate} (model {:?}) must be a number from \
                     0 to {MAX_PRICE_USD_PER_MINUTE} USD per minute of audio, the gateway's ceiling",
                    p.model
                )));
            }
        }
    }
    Ok(())
}

/// Every Secret key the route references, with the spec field that names it.
pub fn secret_refs(spec: &RealtimeRouteSpec) -> Vec<(String, SecretKeyRef)> {
    let mut refs = Vec::new();
    if let Some(up) = &spec.upstream {
        refs.push((
            "upstream.apiKeySecretRef".to_string(),
            up.api_key_secret_ref.clone(),
        ));
    }
    for (i, up) in spec.upstreams.iter().enumerate() {
        refs.push((
            format!("upstreams[{i}].apiKeySecretRef"),
            up.api_key_secret_ref.clone(),
        ));
        if let Some(ca) = &up.ca_secret_ref {
            refs.push((format!("upstreams[{i}].caSecretRef"), ca.clone()));
        }
    }
    refs.push((
        "clientKeysSecretRef".to_string(),
        spec.client_keys_secret_ref.clone(),
    ));
    if let Some(redis) = &spec.metering.redis_url_secret_ref {
        refs.push(("metering.redisUrlSecretRef".to_string(), redis.clone()));
    }
    if let Some(cs) = &spec.client_secrets {
        let r = &cs.signing_keys_secret_ref;
        for key in r.key_list() {
            refs.push((
                "clientSecrets.signingKeysSecretRef".to_string(),
                SecretKeyRef {
                    name: r.name.clone(),
                    key: key.to_string(),
                },
            ));
        }
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
    fn pod_labels_that_would_move_the_pods_out_of_the_selector_are_refused() {
        for key in OPERATOR_POD_LABELS {
            let mut spec = fixtures::full_spec();
            spec.gateway.pod_labels.insert(key.into(), "other".into());
            let msg = invalid(&spec);
            assert!(
                msg.contains(&format!("gateway.podLabels sets {key:?}")),
                "{msg}"
            );
        }
        let mut spec = fixtures::full_spec();
        spec.gateway
            .pod_labels
            .insert("team".into(), "voice".into());
        spec.gateway
            .pod_labels
            .insert("app.kubernetes.io/version".into(), "1.2".into());
        check_spec(&spec).expect("other labels, even app.kubernetes.io/version, are the user's");
    }

    #[test]
    fn pod_annotations_the_operator_owns_are_refused() {
        for key in [
            "patchbay.dev/config-hash",
            "patchbay.dev/anything",
            "controller.kubernetes.io/pod-deletion-cost",
        ] {
            let mut spec = fixtures::full_spec();
            spec.gateway.pod_annotations.insert(key.into(), "1".into());
            let msg = invalid(&spec);
            assert!(
                msg.contains(&format!("gateway.podAnnotations sets {key:?}")),
                "{msg}"
            );
        }
        let mut spec = fixtures::full_spec();
        spec.gateway
            .pod_annotations
            .insert("prometheus.io/scrape".into(), "true".into());
        check_spec(&spec).expect("other annotations are the user's");
    }

    #[test]
    fn a_malformed_topology_spread_constraint_is_refused_on_its_route() {
        let mut spec = fixtures::full_spec();
        spec.gateway.topology_spread_constraints =
            Some(serde_json::from_value(serde_json::json!([{"maxSkew": "one"}])).unwrap());
        assert!(invalid(&spec).contains("gateway.topologySpreadConstraints"));
    }

    #[test]
    fn an_azure_route_needs_a_url() {
        let mut spec = fixtures::minimal_spec();
        fixtures::single(&mut spec).provider = Provider::Azure;
        let err = check_spec(&spec).unwrap_err();
        assert_eq!(err.reason(), "InvalidSpec");
        fixtures::single(&mut spec).url =
            Some("wss://res.openai.azure.com/openai/v1/realtime".into());
        check_spec(&spec).unwrap();
    }

    #[test]
    fn an_http_upstream_url_is_refused() {
        let mut spec = fixtures::minimal_spec();
        fixtures::single(&mut spec).url = Some("https://api.openai.com/v1/realtime".into());
        let err = check_spec(&spec).unwrap_err().to_string();
        assert!(err.contains("scheme must be ws or wss, not https"), "{err}");
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
            fixtures::single(&mut spec).url = Some(url.into());
            let err = check_spec(&spec).unwrap_err();
            assert_eq!(err.reason(), "InvalidSpec", "{url}");
            assert!(err.to_string().contains("upstream.url"), "{url}: {err}");
        }
        fixtures::single(&mut spec).provider = Provider::Azure;
        fixtures::single(&mut spec).url =
            Some("wss://res.openai.azure.com/openai/realtime?deployment=d".into());
        assert!(check_spec(&spec)
            .unwrap_err()
            .to_string()
            .contains("api-version"));
        for ok in [
            "wss://res.openai.azure.com/openai/realtime?api-version=2025-04-01-preview&deployment=d",
            "wss://res.openai.azure.com/openai/v1/realtime",
        ] {
            fixtures::single(&mut spec).url = Some(ok.into());
            check_spec(&spec).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn seconds_outside_the_gateways_bounds_are_refused_naming_the_field() {
        type Field = fn(&mut RealtimeRouteSpec) -> &mut i32;
        let edits: [(&str, Field, i32); 4] = [
            (
                "pool.maxIdleSeconds",
                |s| &mut s.pool.max_idle_seconds,
                MIN_POOL_MAX_IDLE_SECONDS,
            ),
            (
                "metering.flushSeconds",
                |s| &mut s.metering.flush_seconds,
                0,
            ),
            (
                "drain.waitSeconds",
                |s| &mut s.drain.wait_seconds,
                MIN_DRAIN_WAIT_SECONDS,
            ),
            ("drain.lingerSeconds", |s| &mut s.drain.linger_seconds, 0),
        ];
        for (field, at, min) in edits {
            for ok in [min, MAX_SECONDS] {
                let mut spec = fixtures::full_spec();
                *at(&mut spec) = ok;
                check_spec(&spec).unwrap_or_else(|e| panic!("{field} {ok}: {e}"));
            }
            for bad in [min - 1, MAX_SECONDS + 1] {
                let mut spec = fixtures::full_spec();
                *at(&mut spec) = bad;
                let msg = invalid(&spec);
                assert!(
                    msg.contains(&format!("{field} {bad} must be from")),
                    "{msg}"
                );
            }
        }
    }

    /// A spec to start from, and an edit setting one string field of it.
    type Spec = fn() -> RealtimeRouteSpec;
    type Edit = fn(&mut RealtimeRouteSpec, &str);

    #[test]
    fn a_blank_model_is_refused_naming_its_field() {
        let edits: [(&str, Spec, Edit); 3] = [
            ("model", fixtures::full_spec, |s, m| s.model = m.into()),
            ("upstream.model", fixtures::full_spec, |s, m| {
                fixtures::single(s).model = Some(m.into())
            }),
            ("upstreams[1].model", fixtures::two_upstream_spec, |s, m| {
                s.upstreams[1].model = Some(m.into())
            }),
        ];
        for (field, spec, edit) in edits {
            for blank in ["", " ", "\t\n"] {
                let mut bad = spec();
                edit(&mut bad, blank);
                let msg = invalid(&bad);
                assert!(
                    msg.contains(&format!("{field} {blank:?} is blank")),
                    "{msg}"
                );
            }
            let mut ok = spec();
            edit(&mut ok, "gpt-realtime-mini");
            check_spec(&ok).unwrap_or_else(|e| panic!("{field}: {e}"));
        }
    }

    #[test]
    fn a_secret_key_that_is_not_a_plain_file_name_is_refused_naming_its_field() {
        let edits: [(&str, Spec, Edit); 5] = [
            ("upstream.apiKeySecretRef", fixtures::full_spec, |s, k| {
                fixtures::single(s).api_key_secret_ref.key = k.into()
            }),
            ("clientKeysSecretRef", fixtures::full_spec, |s, k| {
                s.client_keys_secret_ref.key = k.into()
            }),
            ("metering.redisUrlSecretRef", fixtures::full_spec, |s, k| {
                s.metering.redis_url_secret_ref.as_mut().unwrap().key = k.into()
            }),
            (
                "upstreams[1].caSecretRef",
                fixtures::two_upstream_spec,
                |s, k| s.upstreams[1].ca_secret_ref.as_mut().unwrap().key = k.into(),
            ),
            (
                "clientSecrets.signingKeysSecretRef",
                fixtures::full_spec,
                |s, k| {
                    s.client_secrets
                        .as_mut()
                        .unwrap()
                        .signing_keys_secret_ref
                        .keys[1] = k.into()
                },
            ),
        ];
        let too_long = "k".repeat(254);
        for (field, spec, edit) in edits {
            for bad in [
                "../k",
                "a/b",
                "/abs",
                ".",
                "..",
                "..data",
                "key with space",
                &too_long,
            ] {
                let mut s = spec();
                edit(&mut s, bad);
                let msg = invalid(&s);
                assert!(
                    msg.contains(&format!("{field} key {bad:?} is not a Secret key")),
                    "{bad:?}: {msg}"
                );
            }
            for ok in ["api-key", "ca.pem", ".hidden", "KEY_1", &"k".repeat(253)] {
                let mut s = spec();
                edit(&mut s, ok);
                check_spec(&s).unwrap_or_else(|e| panic!("{field} {ok:?}: {e}"));
            }
        }
    }

    #[test]
    fn a_price_above_the_gateways_ceiling_is_refused_naming_the_field() {
        type Rate = fn(&mut crate::crd::Price) -> &mut f64;
        let rates: [(&str, Rate); 6] = [
            ("textInput", |p| &mut p.text_input),
            ("cachedTextInput", |p| &mut p.cached_text_input),
            ("audioInput", |p| &mut p.audio_input),
            ("cachedAudioInput", |p| &mut p.cached_audio_input),
            ("textOutput", |p| &mut p.text_output),
            ("audioOutput", |p| &mut p.audio_output),
        ];
        for (field, rate) in rates {
            for ok in [0.0, 64.0, MAX_PRICE_USD_PER_MILLION_TOKENS] {
                let mut spec = fixtures::full_spec();
                *rate(&mut spec.metering.prices[0]) = ok;
                check_spec(&spec).unwrap_or_else(|e| panic!("{field} {ok}: {e}"));
            }
            let past = MAX_PRICE_USD_PER_MILLION_TOKENS * (1.0 + f64::EPSILON);
            for bad in [past, 2e6, -0.5, f64::INFINITY, f64::NAN] {
                let mut spec = fixtures::full_spec();
                *rate(&mut spec.metering.prices[0]) = bad;
                let msg = invalid(&spec);
                assert!(
                    msg.contains(&format!("metering.prices[0].{field} {bad}")),
                    "{msg}"
                );
                assert!(msg.contains("1000000 USD per 1M tokens"), "{msg}");
            }
        }
    }

    #[test]
    fn a_per_minute_price_is_checked_against_the_gateways_ceiling() {
        for ok in [0.0, 0.017, MAX_PRICE_USD_PER_MINUTE] {
            let mut spec = fixtures::full_spec();
            spec.metering.prices[0].usd_per_minute = Some(ok);
            check_spec(&spec).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [1000.5, -0.5, f64::INFINITY, f64::NAN] {
            let mut spec = fixtures::full_spec();
            spec.metering.prices[0].usd_per_minute = Some(bad);
            let msg = invalid(&spec);
            assert!(
                msg.contains(&format!("metering.prices[0].usdPerMinute {bad}")),
                "{msg}"
            );
            assert!(msg.contains("1000 USD per minute of audio"), "{msg}");
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
    fn every_referenced_secret_key_is_named_with_its_field() {
        let fields = |spec: &RealtimeRouteSpec| -> Vec<String> {
            secret_refs(spec)
                .into_iter()
                .map(|(f, s)| format!("{f}={}/{}", s.name, s.key))
                .collect()
        };
        assert_eq!(
            fields(&fixtures::minimal_spec()),
            [
                "upstream.apiKeySecretRef=openai/api-key",
                "clientKeysSecretRef=voice-keys/keys.toml"
            ]
        );
        assert_eq!(
            fields(&fixtures::two_upstream_spec()),
            [
                "upstreams[0].apiKeySecretRef=openai/api-key",
                "upstreams[1].apiKeySecretRef=azure/key",
                "upstreams[1].caSecretRef=openai/ca.pem",
                "clientKeysSecretRef=voice-keys/keys.toml",
                "metering.redisUrlSecretRef=redis/url",
                "clientSecrets.signingKeysSecretRef=signing/current",
                "clientSecrets.signingKeysSecretRef=signing/previous",
            ]
        );
    }

    fn invalid(spec: &RealtimeRouteSpec) -> String {
        let err = check_spec(spec).unwrap_err();
        assert_eq!(err.reason(), "InvalidSpec");
        err.to_string()
    }

    #[test]
    fn upstream_and_upstreams_are_exclusive_and_one_is_required() {
        check_spec(&fixtures::two_upstream_spec()).expect("a listed route is valid");
        let mut both = fixtures::two_upstream_spec();
        both.upstream = fixtures::full_spec().upstream;
        assert!(invalid(&both).contains("not both"));
        let mut neither = fixtures::two_upstream_spec();
        neither.upstreams.clear();
        assert!(invalid(&neither).contains("exactly one of spec.upstream and spec.upstreams"));
    }

    #[test]
    fn listed_upstreams_that_mix_protocols_are_refused_naming_the_route() {
        let mut spec = fixtures::two_upstream_spec();
        spec.upstreams[1].protocol = crate::crd::Protocol::Beta;
        let msg = invalid(&spec);
        assert!(msg.contains("\"gpt-realtime\" mixes protocols"), "{msg}");
        assert!(msg.contains("azure-eastus"), "{msg}");
        for u in &mut spec.upstreams {
            u.protocol = crate::crd::Protocol::Beta;
        }
        check_spec(&spec).expect("all beta is one protocol");
    }

    #[test]
    fn upstream_names_are_unique_dns_labels() {
        for bad in ["", "Azure", "azure_east", "-a", "a-", &"a".repeat(64)] {
            let mut spec = fixtures::two_upstream_spec();
            spec.upstreams[1].name = bad.to_string();
            assert!(invalid(&spec).contains("upstreams[1].name"), "{bad:?}");
        }
        let mut spec = fixtures::two_upstream_spec();
        spec.upstreams[1].name = "openai".into();
        assert!(invalid(&spec).contains("listed twice"));
        spec.upstreams[1].name = "0-east".into();
        check_spec(&spec).expect("a label may start with a digit");
    }

    #[test]
    fn each_listed_upstream_url_is_checked_with_its_index() {
        let mut spec = fixtures::two_upstream_spec();
        spec.upstreams[1].url = None;
        assert!(invalid(&spec).contains("upstreams[1].url is required for provider azure"));
        spec.upstreams[1].url = Some("https://eastus.openai.azure.com/openai/v1/realtime".into());
        assert!(invalid(&spec).contains("upstreams[1].url"));
        let mut spec = fixtures::two_upstream_spec();
        spec.upstreams[0].weight = -1;
        assert!(invalid(&spec).contains("upstreams[0]"));
        let mut spec = fixtures::two_upstream_spec();
        let extra = spec.upstreams[1].clone();
        for i in 0..MAX_UPSTREAMS {
            let mut u = extra.clone();
            u.name = format!("extra-{i}");
            spec.upstreams.push(u);
        }
        assert!(invalid(&spec).contains("at most 16"));
    }

    #[test]
    fn a_translations_route_dials_only_translation_urls_and_takes_no_intent() {
        let mut spec = fixtures::full_spec();
        assert_eq!(spec.intent, Some(crate::crd::Intent::Transcription));
        check_spec(&spec).expect("a realtime route may serve the transcription intent");
        spec.endpoint = Endpoint::Translations;
        assert!(invalid(&spec).contains("spec.intent"));
        spec.intent = None;
        let msg = invalid(&spec);
        assert!(
            msg.contains("upstream.url") && msg.contains("dials its endpoint"),
            "{msg}"
        );
        fixtures::single(&mut spec).url = None;
        check_spec(&spec).expect("an OpenAI upstream without a url gets the endpoint's own");
        fixtures::single(&mut spec).url = Some("ws://127.0.0.1:9/v1/realtime/translations".into());
        check_spec(&spec).unwrap();
        spec.endpoint = Endpoint::Realtime;
        assert!(invalid(&spec).contains("set spec.endpoint: translations"));
        // A Live route: its own URL, no intent, no beta.
        let mut spec = fixtures::minimal_spec();
        spec.endpoint = Endpoint::Live;
        check_spec(&spec).expect("OpenAI's Live URL by default");
        fixtures::single(&mut spec).protocol = Protocol::Beta;
        assert!(invalid(&spec).contains("upstream.protocol"));
        fixtures::single(&mut spec).protocol = Protocol::Ga;
        fixtures::single(&mut spec).url = Some("wss://api.openai.com/v1/realtime".into());
        assert!(invalid(&spec).contains("…/v1/live/sessions"));
        let mut spec = fixtures::two_upstream_spec();
        spec.intent = None;
        spec.endpoint = Endpoint::Translations;
        let msg = invalid(&spec);
        assert!(msg.contains("upstreams[1].url \"wss://eastus"), "{msg}");
    }

    #[test]
    fn client_secrets_need_exactly_one_of_key_and_keys_and_a_ttl_the_gateway_accepts() {
        let mut spec = fixtures::full_spec();
        check_spec(&spec).unwrap();
        let cs = spec.client_secrets.as_mut().unwrap();
        cs.signing_keys_secret_ref.key = Some("single".into());
        assert!(invalid(&spec).contains("exactly one of key and keys"));
        let cs = spec.client_secrets.as_mut().unwrap();
        cs.signing_keys_secret_ref.keys.clear();
        check_spec(&spec).expect("a single key");
        let cs = spec.client_secrets.as_mut().unwrap();
        cs.signing_keys_secret_ref.key = None;
        assert!(invalid(&spec).contains("exactly one of key and keys"));
        let cs = spec.client_secrets.as_mut().unwrap();
        cs.signing_keys_secret_ref.keys = vec!["a".into(), "a".into()];
        assert!(invalid(&spec).contains("twice"));
        let cs = spec.client_secrets.as_mut().unwrap();
        cs.signing_keys_secret_ref.keys = vec!["a".into()];
        for ttl in [9, 7201, -1] {
            spec.client_secrets.as_mut().unwrap().max_ttl_seconds = Some(ttl);
            assert!(invalid(&spec).contains("maxTTLSeconds"), "{ttl}");
        }
        for ttl in [10, 7200] {
            spec.client_secrets.as_mut().unwrap().max_ttl_seconds = Some(ttl);
            check_spec(&spec).unwrap();
        }
    }
}
