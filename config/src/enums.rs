//! The settings spelled as one of a few lowercase words, the same in `gateway.toml` and in a
//! `RealtimeRoute` (`provider = "azure"`, `provider: azure`).
//!
//! With feature `schemars` each derives `JsonSchema` (a string `enum` in variant order, the
//! default from `Default`). The types and variants carry plain comments, not doc comments, on
//! purpose: schemars would publish doc comments in the CRD as descriptions.

use serde::{Deserialize, Serialize};

// Who serves an upstream: OpenAI (`Authorization: Bearer`) or Azure OpenAI (`api-key`, and a
// deployment instead of a model).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    #[default]
    Openai,
    Azure,
}

// What kind of session a route starts when the client names no model: `transcription` is
// OpenAI's `GET /v1/realtime?intent=transcription` (the model is chosen in `session.update`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Intent {
    Transcription,
}

impl Intent {
    /// The value of the `intent` query parameter.
    pub fn as_str(self) -> &'static str {
        match self {
            Intent::Transcription => "transcription",
        }
    }
}

// Which OpenAI endpoint a route serves: `realtime` (`/v1/realtime`: conversations, transcription
// sessions), `translations` (`/v1/realtime/translations`: `gpt-realtime-translate`) or `live`
// (`/v1/live/sessions`: GPT-Live, `gpt-live-1`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    #[default]
    Realtime,
    Translations,
    Live,
}

impl Endpoint {
    /// The path OpenAI serves it at (an upstream URL's path ends so).
    pub fn openai_path(self) -> &'static str {
        match self {
            Endpoint::Realtime => "/v1/realtime",
            Endpoint::Translations => "/v1/realtime/translations",
            Endpoint::Live => "/v1/live/sessions",
        }
    }

    /// Its value in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Realtime => "realtime",
            Endpoint::Translations => "translations",
            Endpoint::Live => "live",
        }
    }
}

// The Realtime API's event names: the GA ones, or the beta ones (`OpenAI-Beta: realtime=v1`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Ga,
    Beta,
}

// What a session on a model without a price gets: metered at cost 0 (`allow`) or refused (`block`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Unpriced {
    #[default]
    Allow,
    Block,
}

// What a draining gateway does with live sessions once `drain.wait_secs` has passed: close them
// (`close`), or let them run on for `drain.linger_secs` (`linger`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum DrainMode {
    #[default]
    Close,
    Linger,
}

// The period a route's (or key's, or team's) budget is counted over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriod {
    Daily,
    Monthly,
    #[default]
    Total,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_is_spelled_as_one_lowercase_word_both_ways() {
        fn round_trip<T>(variants: &[(T, &str)])
        where
            T: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug,
        {
            #[derive(Serialize, Deserialize)]
            struct Doc<T> {
                v: T,
            }
            for (variant, word) in variants {
                let text = toml::to_string(&Doc { v: variant }).unwrap();
                assert_eq!(text.trim(), format!("v = \"{word}\""));
                let back: Doc<T> = toml::from_str(&text).unwrap();
                assert_eq!(&back.v, variant);
            }
        }
        round_trip(&[(Provider::Openai, "openai"), (Provider::Azure, "azure")]);
        round_trip(&[(Protocol::Ga, "ga"), (Protocol::Beta, "beta")]);
        round_trip(&[(Unpriced::Allow, "allow"), (Unpriced::Block, "block")]);
        round_trip(&[(DrainMode::Close, "close"), (DrainMode::Linger, "linger")]);
        round_trip(&[
            (BudgetPeriod::Daily, "daily"),
            (BudgetPeriod::Monthly, "monthly"),
            (BudgetPeriod::Total, "total"),
        ]);
    }

    #[test]
    fn the_defaults_are_openai_ga_allow_close_and_total() {
        assert_eq!(Provider::default(), Provider::Openai);
        assert_eq!(Protocol::default(), Protocol::Ga);
        assert_eq!(Unpriced::default(), Unpriced::Allow);
        assert_eq!(DrainMode::default(), DrainMode::Close);
        assert_eq!(BudgetPeriod::default(), BudgetPeriod::Total);
    }
}
