//! Checks of the configuration beyond a key's type: a route's endpoint
//! against its upstream URLs, the client listener's TLS pair, and the
//! shape of a Kubernetes name (`[pool] size_configmap`).

//!
//! Each answers the key at fault and why (the config module makes that its
//! error), so this module needs nothing of it.

use std::path::Path;

use patchbay_config::{Endpoint, Protocol, RouteConfig};

/// The key at fault and what is wrong.
pub type Fault = (String, String);

/// A translations route (`endpoint = "translations"`) dials OpenAI's
/// translation endpoint, a Live route (`endpoint = "live"`) OpenAI's Live
/// sessions; neither takes an intent, and a Live route speaks no beta.
/// Any other route dials a Realtime URL.
pub fn endpoint_fits<K: Clone>(route: &RouteConfig<K>, i: usize) -> Result<(), Fault> {
    let endpoint = route.endpoint;
    if endpoint != Endpoint::Realtime && route.intent.is_some() {
        return Err((
            format!("routes[{i}].intent"),
            format!("a {} route takes no intent", endpoint.as_str()),
        ));
    }
    if endpoint == Endpoint::Live && route.protocol != Protocol::Ga {
        return Err((
            format!("routes[{i}].protocol"),
            "GPT-Live has no beta protocol: leave protocol out on a live route".into(),
        ));
    }
    for u in route.upstream_list().iter() {
        let dials = patchbay_config::endpoint_of_url(&u.upstream_url);
        if dials != endpoint {
            let message = if endpoint == Endpoint::Realtime {
                format!(
                    "this URL is OpenAI's {} endpoint: set endpoint = \"{}\" on the route",
                    dials.as_str(),
                    dials.as_str()
                )
            } else {
                format!(
                    "a route with endpoint = \"{}\" dials OpenAI's {} endpoint (wss://api.openai.com{})",
                    endpoint.as_str(),
                    endpoint.as_str(),
                    endpoint.openai_path()
                )
            };
            return Err((format!("routes[{i}].upstream_url"), message));
        }
    }
    Ok(())
}

/// `tls_cert_file` and `tls_key_file`: both or neither, and a pair that
/// loads ([`crate::pem::load_pair`]).
pub fn tls_pair(cert: Option<&Path>, key: Option<&Path>) -> Result<(), Fault> {
    let key_name = || "server.tls_cert_file".to_string();
    match (cert, key) {
        (None, None) => Ok(()),
        (Some(cert), Some(key)) => crate::pem::load_pair(cert, key)
            .map(|_| ())
            .map_err(|e| (key_name(), e)),
        (Some(_), None) | (None, Some(_)) => Err((
            key_name(),
            "tls_cert_file and tls_key_file go together".into(),
        )),
    }
}

/// `[pool] size_configmap`: a ConfigMap's name.
pub fn pool_configmap(name: Option<&str>) -> Result<(), Fault> {
    match name {
        Some(n) if !is_dns_name(n, false) => Err((
            "pool.size_configmap".into(),
            format!("{n:?} is not a ConfigMap name (lower-case letters, digits, '-' and '.')"),
        )),
        _ => Ok(()),
    }
}

/// Whether `s` is a DNS-1123 subdomain (what names a ConfigMap, at most
/// 253 characters) or, with `label`, a DNS-1123 label (a namespace, at
/// most 63). The pool size watch puts both into request paths unescaped.
pub fn is_dns_name(s: &str, label: bool) -> bool {
    let max = if label { 63 } else { 253 };
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !p.starts_with('-')
            && !p.ends_with('-')
    };
    s.len() <= max
        && if label {
            part_ok(s)
        } else {
            s.split('.').all(part_ok)
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_1123() {
        assert!(is_dns_name("voice-pool", false));
        assert!(is_dns_name("a.b-c.d", false));
        assert!(is_dns_name("voice", true));
        assert!(!is_dns_name("a.b", true));
        for bad in ["", "Voice", "-a", "a-", "a..b", "a/b", "a?b", "a b", "a%2f"] {
            assert!(!is_dns_name(bad, false), "{bad:?}");
        }
        assert!(!is_dns_name(&"a".repeat(64), true));
        assert!(pool_configmap(Some("voice-pool")).is_ok());
        assert!(pool_configmap(Some("voice/pool")).is_err());
        assert!(is_dns_name(&"a".repeat(63), true));
    }

    fn route(endpoint: Endpoint, url: &str) -> RouteConfig<()> {
        RouteConfig {
            model: "m".into(),
            upstream_url: url.into(),
            endpoint,
            ..RouteConfig::default()
        }
    }

    #[test]
    fn a_route_dials_the_endpoint_it_serves() {
        let t = "wss://api.openai.com/v1/realtime/translations";
        let r = "wss://api.openai.com/v1/realtime";
        assert!(endpoint_fits(&route(Endpoint::Translations, t), 0).is_ok());
        assert!(endpoint_fits(&route(Endpoint::Realtime, r), 0).is_ok());
        let (key, why) = endpoint_fits(&route(Endpoint::Translations, r), 2).unwrap_err();
        assert_eq!(key, "routes[2].upstream_url");
        assert!(why.contains("translations endpoint"), "{why}");
        let (_, why) = endpoint_fits(&route(Endpoint::Realtime, t), 0).unwrap_err();
        assert!(why.contains("endpoint = \"translations\""), "{why}");
        let mut with_intent = route(Endpoint::Translations, t);
        with_intent.intent = Some(patchbay_config::Intent::Transcription);
        assert_eq!(
            endpoint_fits(&with_intent, 1).unwrap_err().0,
            "routes[1].intent"
        );
    }

    #[test]
    fn a_live_route_dials_live_sessions_and_speaks_no_beta() {
        let l = "wss://api.openai.com/v1/live/sessions";
        let r = "wss://api.openai.com/v1/realtime";
        assert!(endpoint_fits(&route(Endpoint::Live, l), 0).is_ok());
        let (key, why) = endpoint_fits(&route(Endpoint::Live, r), 1).unwrap_err();
        assert_eq!(key, "routes[1].upstream_url");
        assert!(why.contains("/v1/live/sessions"), "{why}");
        let (_, why) = endpoint_fits(&route(Endpoint::Realtime, l), 0).unwrap_err();
        assert!(why.contains("endpoint = \"live\""), "{why}");
        let mut beta = route(Endpoint::Live, l);
        beta.protocol = Protocol::Beta;
        assert_eq!(endpoint_fits(&beta, 0).unwrap_err().0, "routes[0].protocol");
    }
}
