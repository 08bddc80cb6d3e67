//! What an upstream's URL must be. The gateway's loader refuses a config whose `upstream_url`
//! breaks a rule here, and the operator refuses a route whose URL does, so a route the operator
//! accepts never renders a config its pods refuse (and crash-loop on). Both judge with the same
//! parser (`url`), so ports, hosts and escapes are read the same way.

use url::Url;

use crate::enums::{Endpoint, Provider};

/// OpenAI's Realtime endpoint: the default route's upstream, and the URL the operator renders
/// for an OpenAI upstream that names none.
pub const OPENAI_REALTIME_URL: &str = "wss://api.openai.com/v1/realtime";
/// OpenAI's URL of `endpoint` (its WebSocket URL, `wss://api.openai.com` and the endpoint's
/// path): what the operator renders for an OpenAI upstream of such a route that names none.
pub fn openai_url(endpoint: Endpoint) -> String {
    format!("wss://api.openai.com{}", endpoint.openai_path())
}

/// The endpoint an upstream URL dials, by its path: translations and Live by their own paths
/// (`…/realtime/translations`, `…/live/sessions`), any other a Realtime one. A route dials only
/// URLs of its own endpoint; the gateway's loader and the operator judge with this one rule.
pub fn endpoint_of_url(upstream_url: &str) -> Endpoint {
    let path = Url::parse(upstream_url)
        .map(|u| u.path().trim_end_matches('/').to_string())
        .unwrap_or_default();
    if path.ends_with("/realtime/translations") {
        Endpoint::Translations
    } else if path.ends_with("/live/sessions") {
        Endpoint::Live
    } else {
        Endpoint::Realtime
    }
}

/// Why an upstream URL is refused; `Display` is the gateway's message for the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamUrlError {
    #[error("invalid URL: {0}")]
    Invalid(#[from] url::ParseError),
    #[error("scheme must be ws or wss, not {scheme}")]
    Scheme { scheme: String },
    #[error("URL has no host")]
    NoHost,
    /// Azure's `/openai/realtime` path is versioned by query; `/openai/v1/realtime` is not.
    #[error("an Azure /openai/realtime URL needs ?api-version=…")]
    AzureApiVersion,
}

/// Checks `upstream_url` for an upstream of `provider`: a `ws://` or `wss://` URL with a host,
/// and for Azure either the `/openai/v1/realtime` path or an `api-version` query parameter.
pub fn validate_upstream_url(
    provider: Provider,
    upstream_url: &str,
) -> Result<(), UpstreamUrlError> {
    let url = Url::parse(upstream_url)?;
    if !matches!(url.scheme(), "ws" | "wss") {
        return Err(UpstreamUrlError::Scheme {
            scheme: url.scheme().to_string(),
        });
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(UpstreamUrlError::NoHost);
    }
    if provider == Provider::Azure
        && !url.path().ends_with("/openai/v1/realtime")
        && !url.query_pairs().any(|(k, _)| k == "api-version")
    {
        return Err(UpstreamUrlError::AzureApiVersion);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_urls_endpoint_is_told_by_its_path() {
        let t = "wss://api.openai.com/v1/realtime/translations";
        assert_eq!(endpoint_of_url(t), Endpoint::Translations);
        assert_eq!(
            endpoint_of_url("ws://127.0.0.1:9/v1/realtime/translations/"),
            Endpoint::Translations
        );
        assert_eq!(endpoint_of_url(OPENAI_REALTIME_URL), Endpoint::Realtime);
        assert_eq!(
            endpoint_of_url("wss://h/v1/realtime?x=/realtime/translations"),
            Endpoint::Realtime
        );
        assert_eq!(endpoint_of_url("wss://h/v1/live/sessions"), Endpoint::Live);
        assert_eq!(endpoint_of_url("not a url"), Endpoint::Realtime);
        assert_eq!(openai_url(Endpoint::Translations), t);
        assert_eq!(openai_url(Endpoint::Realtime), OPENAI_REALTIME_URL);
    }

    #[test]
    fn websocket_urls_with_a_host_are_accepted() {
        for (provider, url) in [
            (Provider::Openai, OPENAI_REALTIME_URL),
            (Provider::Openai, "ws://127.0.0.1:8081/v1/realtime"),
            (Provider::Azure, "wss://res.openai.azure.com/openai/v1/realtime"),
            (
                Provider::Azure,
                "wss://res.openai.azure.com/openai/realtime?api-version=2025-04-01-preview&deployment=d",
            ),
        ] {
            validate_upstream_url(provider, url).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }

    #[test]
    fn each_broken_rule_is_its_own_error_with_the_gateways_message() {
        let cases = [
            (
                "not a url",
                Provider::Openai,
                "invalid URL: relative URL without a base",
            ),
            ("wss://", Provider::Openai, "invalid URL: empty host"),
            (
                "wss://host:99999/v1/realtime",
                Provider::Openai,
                "invalid URL: invalid port number",
            ),
            (
                "https://api.openai.com/v1/realtime",
                Provider::Openai,
                "scheme must be ws or wss, not https",
            ),
            (
                "wss://res.openai.azure.com/openai/realtime?deployment=d",
                Provider::Azure,
                "an Azure /openai/realtime URL needs ?api-version=…",
            ),
        ];
        for (url, provider, message) in cases {
            let e = validate_upstream_url(provider, url).unwrap_err();
            assert_eq!(e.to_string(), message, "{url}");
        }
        assert_eq!(
            validate_upstream_url(
                Provider::Openai,
                "wss://res.openai.azure.com/openai/realtime"
            ),
            Ok(()),
            "the api-version rule is Azure's only"
        );
    }
}
