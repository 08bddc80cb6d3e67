//! Checks of the configuration that read more than one key: a route's
//! endpoint against its upstream URLs, and the client listener's TLS pair.

//!
//! Each answers the key at fault and why (the config module makes that its
//! error), so this module needs nothing of it.

use std::path::Path;

use patchbay_config::{Endpoint, RouteConfig};

/// The key at fault and what is wrong.
pub type Fault = (String, String);

/// A translations route (`endpoint = "translations"`) dials OpenAI's
/// translation endpoint and takes no intent; any other route dials a
/// Realtime URL.
pub fn endpoint_fits<K: Clone>(route: &RouteConfig<K>, i: usize) -> Result<(), Fault> {
    let translations = route.endpoint == Endpoint::Translations;
    if translations && route.intent.is_some() {
        return Err((
            format!("routes[{i}].intent"),
            "a translations route takes no intent".into(),
        ));
    }
    for u in route.upstream_list().iter() {
        let path = url::Url::parse(&u.upstream_url)
            .map(|url| url.path().trim_end_matches('/').to_string())
            .unwrap_or_default();
        let on_translations = path.ends_with("/realtime/translations");
        if translations != on_translations {
            let message = if translations {
                "a route with endpoint = \"translations\" dials OpenAI's translation endpoint (wss://api.openai.com/v1/realtime/translations)"
            } else {
                "this URL is a translation endpoint: set endpoint = \"translations\" on the route"
            };
            return Err((format!("routes[{i}].upstream_url"), message.into()));
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(why.contains("translation endpoint"), "{why}");
        let (_, why) = endpoint_fits(&route(Endpoint::Realtime, t), 0).unwrap_err();
        assert!(why.contains("endpoint = \"translations\""), "{why}");
        let mut with_intent = route(Endpoint::Translations, t);
        with_intent.intent = Some(patchbay_config::Intent::Transcription);
        assert_eq!(
            endpoint_fits(&with_intent, 1).unwrap_err().0,
            "routes[1].intent"
        );
    }
}
