//! What an upstream's URL must be. The gateway's loader refuses a config whose `upstream_url`
//! breaks a rule here, and the operator refuses a route whose URL does, so a route the operator
//! accepts never renders a config its pods refuse (and crash-loop on). Both judge with the same
//! parser (`url`), so ports, hosts and escapes are read the same way.

use url::Url;

use crate::enums::Provider;

/// OpenAI's Realtime endpoint: the default route's upstream, and the URL the operator renders
/// for an OpenAI upstream that names none.
pub const OPENAI_REALTIME_URL: &str = "wss://api.openai.com/v1/realtime";

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
