//! Usage and prices: turning a `response.done` (or transcription) `usage`
//! object into normalised token counts, and those into USD.
//!
//! Prices are `[[prices]]` rows, USD per 1M tokens. A route is priced by the
//! row whose `model` equals the route's `model`, else its `upstream_model`;
//! transcription usage by the row named after the transcription model.
//!
//! Normalisation (every usage field may be missing; missing is 0):
//! - `input_tokens`/`output_tokens` default to the sum of their details, and
//!   `total_tokens` to their sum;
//! - input tokens no detail accounts for are billed as text (so a usage
//!   without details is all text), likewise output tokens;
//! - cached tokens are a subset of input: `cached_tokens_details` splits
//!   them by modality; without it they are taken from text first, then
//!   audio; each is clamped to its modality's input;
//! - image input tokens are billed at the text input rate (the price table
//!   has no image column);
//! - transcription usage is a union (openai-python
//!   `types/realtime/conversation_item_input_audio_transcription_completed_event.py`):
//!   `{"type": "tokens", …}` is priced like any token usage, `{"type":
//!   "duration", "seconds": S}` (a usage with `seconds`) carries no tokens
//!   and is priced `S / 60 × usd_per_minute` ([`cost_usd`]). A row prices a
//!   usage only when it has a rate for its shape ([`prices`]): duration
//!   usage needs `usd_per_minute`, token usage a row that is not per-minute
//!   only; otherwise the usage is unpriced (cost 0, the `unpriced` warning).
//!
//! Plausibility: a turn whose usage no real turn can have is charged as a
//! bounded amount, not as reported ([`charge`]). It is implausible when its
//! `total` (the larger of the reported total and input + output, so at
//! least every other count) is above [`MAX_TURN_TOKENS`], when its audio is
//! longer than [`MAX_TURN_AUDIO_SECONDS`], or when its cost
//! is above `[metering] max_turn_usd` (default 100 USD). Its row keeps the
//! reported token counts and is flagged `usage_implausible`; it is charged
//! its cost capped at `max_turn_usd`, and its tokens capped at
//! [`MAX_TURN_TOKENS`] in the tpm window and the token metrics. So one turn
//! never moves a budget by more than `max_turn_usd`, nor a tpm window or a
//! token counter by more than [`MAX_TURN_TOKENS`].
//!
//! A cost is finite and >= 0 by construction: every rate is taken within
//! `[0, MAX_PRICE_USD_PER_MILLION_TOKENS]` (the loader refuses a price
//! outside it; the arithmetic does not rely on that), token counts are
//! `u64`, and token differences saturate at 0, so one price column adds at
//! most `u64::MAX` × 1e6 / 1e6 ≈ 1.8e19 USD and the sum of the eight stays
//! far below `f64::MAX`. Likewise a per-minute rate is taken within `[0,
//! MAX_PRICE_USD_PER_MINUTE]` and seconds within `[0, MAX_PRICED_SECONDS]`
//! (a negative, NaN or huge report cannot make a cost negative or infinite).

use patchbay_config::{MAX_PRICE_USD_PER_MILLION_TOKENS, MAX_PRICE_USD_PER_MINUTE};
use serde::Deserialize;

use crate::config::PriceRow;

/// The `usage` object of `response.done` and of
/// `conversation.item.input_audio_transcription.completed`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct UsageJson {
    pub total_tokens: Option<u64>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub input_token_details: Option<InputDetails>,
    pub output_token_details: Option<OutputDetails>,
    /// Duration usage (`{"type": "duration", "seconds": S}`): seconds of
    /// input audio. Its presence is what makes a usage a duration.
    pub seconds: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct InputDetails {
    pub text_tokens: Option<u64>,
    pub audio_tokens: Option<u64>,
    pub image_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub cached_tokens_details: Option<CachedDetails>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct CachedDetails {
    pub text_tokens: Option<u64>,
    pub audio_tokens: Option<u64>,
    pub image_tokens: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct OutputDetails {
    pub text_tokens: Option<u64>,
    pub audio_tokens: Option<u64>,
}

/// Normalised token counts of one turn. Invariants: `input_text +
/// input_audio + input_image == input`, `output_text + output_audio ==
/// output`, `cached_text <= input_text`, `cached_audio <= input_audio`,
/// `cached_image <= input_image`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub total: u64,
    pub input_text: u64,
    pub input_audio: u64,
    pub input_image: u64,
    pub cached_text: u64,
    pub cached_audio: u64,
    pub cached_image: u64,
    pub output_text: u64,
    pub output_audio: u64,
    /// Seconds of audio of a duration usage (as reported); `None` for a
    /// token usage.
    pub audio_seconds: Option<f64>,
}

impl Usage {
    pub fn from_json(u: &UsageJson) -> Self {
        let d = u.input_token_details.clone().unwrap_or_default();
        let (text, audio, image) = (
            d.text_tokens.unwrap_or(0),
            d.audio_tokens.unwrap_or(0),
            d.image_tokens.unwrap_or(0),
        );
        let input = u
            .input_tokens
            .unwrap_or_else(|| text.saturating_add(audio).saturating_add(image));
        // Details larger than the total are trusted over the total.
        let input = input.max(text.saturating_add(audio).saturating_add(image));
        // Clamped so the parts add up to `input` even when sums saturate.
        let input_audio = audio.min(input);
        let image = image.min(input - input_audio);
        let input_text = input - input_audio - image;

        let cached = d.cached_tokens.unwrap_or(0).min(input);
        let (cached_text, cached_audio, cached_image) = match &d.cached_tokens_details {
            Some(c) => (
                c.text_tokens.unwrap_or(0).min(input_text),
                c.audio_tokens.unwrap_or(0).min(input_audio),
                c.image_tokens.unwrap_or(0).min(image),
            ),
            None => {
                let t = cached.min(input_text);
                let a = (cached - t).min(input_audio);
                (t, a, (cached - t - a).min(image))
            }
        };

        let o = u.output_token_details.clone().unwrap_or_default();
        let out_audio = o.audio_tokens.unwrap_or(0);
        let out_text = o.text_tokens.unwrap_or(0);
        let output = u
            .output_tokens
            .unwrap_or_else(|| out_text.saturating_add(out_audio))
            .max(out_text.saturating_add(out_audio));
        let output_text = output.saturating_sub(out_audio);

        let total = u
            .total_tokens
            .unwrap_or(0)
            .max(input.saturating_add(output));
        Self {
            input,
            output,
            total,
            input_text,
            input_audio,
            input_image: image,
            cached_text,
            cached_audio,
            cached_image,
            output_text,
            output_audio: out_audio,
            audio_seconds: u.seconds,
        }
    }

    pub fn cached(&self) -> u64 {
        self.cached_text
            .saturating_add(self.cached_audio)
            .saturating_add(self.cached_image)
    }
}

/// The price row for a session on upstream `upstream` of a route (`model`,
/// else `upstream_model`) or, with both the same, for a transcription model.
/// A row naming the upstream wins over one that names none.
pub fn find<'a>(
    prices: &'a [PriceRow],
    model: &str,
    upstream_model: &str,
    upstream: &str,
) -> Option<&'a PriceRow> {
    let pick = |m: &str| {
        prices
            .iter()
            .find(|p| p.model == m && p.upstream.as_deref() == Some(upstream))
            .or_else(|| prices.iter().find(|p| p.model == m && p.upstream.is_none()))
    };
    pick(model).or_else(|| pick(upstream_model))
}

/// Whether every upstream of `route` has a price for its response turns, which report tokens: a
/// row with only `usd_per_minute` does not price them ([`PriceRow::prices_tokens`]).
pub fn route_priced(prices: &[PriceRow], route: &crate::config::RouteConfig) -> bool {
    route.upstream_list().iter().all(|u| {
        find(prices, &route.model, u.upstream_model(route), &u.name)
            .is_some_and(PriceRow::prices_tokens)
    })
}

/// Whether `p` has a rate for the shape of `u`: duration usage needs its
/// `usd_per_minute`, token usage a row that is not per-minute only.
pub fn prices(p: &PriceRow, u: &Usage) -> bool {
    match u.audio_seconds {
        Some(_) => p.prices_duration(),
        None => p.prices_tokens(),
    }
}

const PER: f64 = 1_000_000.0;

/// Most seconds of audio one turn can plausibly report: a transcription
/// covers one committed stretch of input audio, within one session of at
/// most 60 minutes; two hours is twice that.
pub const MAX_TURN_AUDIO_SECONDS: f64 = 7200.0;

/// Most seconds the arithmetic takes from a report (about 136 years): at
/// the per-minute ceiling that is about 7e10 USD, finite.
pub const MAX_PRICED_SECONDS: f64 = u32::MAX as f64;

/// Most tokens one turn can plausibly report, in its `total` (so in any
/// field). A turn's input is at most its model's context window and its
/// output at most the longest answer: 32k in all for `gpt-realtime`, 128k +
/// 32k for `gpt-realtime-2`. Ten million is over sixty times the largest,
/// while a usage of 2^64-1 tokens is an upstream that cannot be believed.
pub const MAX_TURN_TOKENS: u64 = 10_000_000;

/// What one turn is charged (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Charge {
    /// USD added to every applicable budget and to the cost metric, and
    /// written as the row's `cost_usd`.
    pub cost_usd: f64,
    /// Tokens added to the key's tpm window and the token metrics' bound.
    pub tokens: u64,
    /// The usage was beyond the plausibility bound: the row is flagged.
    pub implausible: bool,
}

/// The charge of a turn whose usage is `u` and whose cost at its price is
/// `cost_usd` ([`cost_usd`], or 0 when unpriced): as reported when the
/// usage is plausible, else flagged with the cost capped at `max_turn_usd`
/// and the tokens at [`MAX_TURN_TOKENS`].
pub fn charge(u: &Usage, cost_usd: f64, max_turn_usd: f64) -> Charge {
    // A NaN cost (impossible from `cost_usd`) is capped too, and so is a
    // NaN duration.
    let too_long = u
        .audio_seconds
        .is_some_and(|s| s.is_nan() || s > MAX_TURN_AUDIO_SECONDS);
    let implausible =
        u.total > MAX_TURN_TOKENS || too_long || cost_usd.is_nan() || cost_usd > max_turn_usd;
    if implausible {
        Charge {
            cost_usd: cost_usd.min(max_turn_usd).max(0.0),
            tokens: u.total.min(MAX_TURN_TOKENS),
            implausible,
        }
    } else {
        Charge {
            cost_usd,
            tokens: u.total,
            implausible,
        }
    }
}

/// USD for `u` at `p`, to the nano-dollar: the sum's binary rounding noise
/// (`1.9999999999999998e-5` for what is 2e-5) would otherwise be printed in
/// every row. The row, the budgets and the metrics all take this one value.
/// Finite and >= 0 whatever `p` and `u` hold (see the module doc).
pub fn cost_usd(p: &PriceRow, u: &Usage) -> f64 {
    if let Some(seconds) = u.audio_seconds {
        let seconds = within(seconds, MAX_PRICED_SECONDS);
        let per_minute = within(p.usd_per_minute.unwrap_or(0.0), MAX_PRICE_USD_PER_MINUTE);
        return (seconds / 60.0 * per_minute * NANO).round() / NANO;
    }
    let tokens = |n: u64, usd_per_million: f64| n as f64 * rate(usd_per_million) / PER;
    let usd = tokens(u.input_text.saturating_sub(u.cached_text), p.text_input)
        + tokens(u.cached_text, p.cached_text_input)
        + tokens(u.input_image.saturating_sub(u.cached_image), p.text_input)
        + tokens(u.cached_image, p.cached_text_input)
        + tokens(u.input_audio.saturating_sub(u.cached_audio), p.audio_input)
        + tokens(u.cached_audio, p.cached_audio_input)
        + tokens(u.output_text, p.text_output)
        + tokens(u.output_audio, p.audio_output);
    (usd * NANO).round() / NANO
}

/// A price as the arithmetic takes it: within `[0,
/// MAX_PRICE_USD_PER_MILLION_TOKENS]`, anything else (NaN included) as the
/// nearest bound, so that no row can make a cost infinite, NaN or negative.
fn rate(usd_per_million: f64) -> f64 {
    within(usd_per_million, MAX_PRICE_USD_PER_MILLION_TOKENS)
}

/// `v` within `[0, max]`; NaN as 0.
fn within(v: f64, max: f64) -> f64 {
    if v > 0.0 {
        v.min(max)
    } else {
        0.0
    }
}

const NANO: f64 = 1e9;

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(v: serde_json::Value) -> Usage {
        Usage::from_json(&serde_json::from_value(v).unwrap())
    }

    fn realtime_price() -> PriceRow {
        PriceRow {
            upstream: None,
            model: "gpt-realtime".into(),
            text_input: 4.0,
            cached_text_input: 0.4,
            audio_input: 32.0,
            cached_audio_input: 0.4,
            text_output: 16.0,
            audio_output: 64.0,
            usd_per_minute: None,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn simulator_usage_normalises_and_prices_audio_text_and_cached() {
        // The simulator's second response: 30 text + 100 audio in, 64 of the
        // audio cached; 12 text + 50 audio out.
        let u = Usage::from_json(&serde_json::from_value(patchbay_sim::usage_for(2, 5)).unwrap());
        assert_eq!(
            u,
            Usage {
                input: 130,
                output: 62,
                total: 192,
                input_text: 30,
                input_audio: 100,
                input_image: 0,
                cached_text: 0,
                cached_audio: 64,
                cached_image: 0,
                output_text: 12,
                output_audio: 50,
                audio_seconds: None,
            }
        );
        let expected = (30.0 * 4.0 + 36.0 * 32.0 + 64.0 * 0.4 + 12.0 * 16.0 + 50.0 * 64.0) / 1e6;
        assert!(close(cost_usd(&realtime_price(), &u), expected));
        assert!(close(expected, 0.0046896));
    }

    #[test]
    fn cached_text_is_billed_at_the_cached_text_rate() {
        let u = usage(serde_json::json!({
            "input_tokens": 1000, "output_tokens": 0,
            "input_token_details": {"text_tokens": 1000, "cached_tokens": 800,
                "cached_tokens_details": {"text_tokens": 800}}
        }));
        assert_eq!((u.cached_text, u.cached_audio), (800, 0));
        let c = cost_usd(&realtime_price(), &u);
        assert!(close(c, (200.0 * 4.0 + 800.0 * 0.4) / 1e6), "{c}");
    }

    #[test]
    fn missing_fields_count_as_zero_and_undetailed_tokens_as_text() {
        assert_eq!(usage(serde_json::json!({})), Usage::default());
        let u = usage(serde_json::json!({"input_tokens": 10, "output_tokens": 4}));
        assert_eq!((u.input_text, u.output_text, u.total), (10, 4, 14));
        // Cached without details: text first, then audio.
        let u = usage(serde_json::json!({"input_tokens": 50,
            "input_token_details": {"text_tokens": 10, "audio_tokens": 40, "cached_tokens": 30}}));
        assert_eq!((u.cached_text, u.cached_audio), (10, 20));
        // Details larger than the stated total win; the total follows.
        let u = usage(serde_json::json!({"input_tokens": 5, "total_tokens": 1,
            "input_token_details": {"audio_tokens": 9}}));
        assert_eq!(
            (u.input, u.input_audio, u.input_text, u.total),
            (9, 9, 0, 9)
        );
        // Cached can never exceed its modality.
        let u = usage(serde_json::json!({"input_tokens": 5,
            "input_token_details": {"text_tokens": 5, "cached_tokens": 50,
                "cached_tokens_details": {"text_tokens": 50, "audio_tokens": 50}}}));
        assert_eq!((u.cached_text, u.cached_audio), (5, 0));
    }

    #[test]
    fn transcription_usage_prices_audio_in_and_text_out() {
        let u = usage(
            serde_json::json!({"type": "tokens", "input_tokens": 30, "output_tokens": 5,
            "total_tokens": 35, "input_token_details": {"audio_tokens": 30, "text_tokens": 0}}),
        );
        let p = PriceRow {
            upstream: None,
            model: "gpt-4o-transcribe".into(),
            text_input: 2.5,
            audio_input: 6.0,
            text_output: 10.0,
            ..PriceRow::default()
        };
        assert!(close(cost_usd(&p, &u), (30.0 * 6.0 + 5.0 * 10.0) / 1e6));
        assert!(prices(&p, &u));
        // A token row has no rate for a duration: it does not price one.
        let d = usage(serde_json::json!({"type": "duration", "seconds": 2.5}));
        assert!(!prices(&p, &d));
        assert_eq!(cost_usd(&p, &d), 0.0);
    }

    #[test]
    fn duration_usage_is_priced_per_minute_and_token_usage_at_the_token_rates() {
        let p = PriceRow {
            model: "gpt-live-transcribe".into(),
            usd_per_minute: Some(0.017),
            ..PriceRow::default()
        };
        let d = usage(serde_json::json!({"type": "duration", "seconds": 90}));
        assert_eq!(d.audio_seconds, Some(90.0));
        assert_eq!((d.input, d.output, d.total), (0, 0, 0));
        assert!(prices(&p, &d));
        assert_eq!(cost_usd(&p, &d), 0.0255, "1.5 min x 0.017");
        let d = usage(serde_json::json!({"type": "duration", "seconds": 2.5}));
        assert_eq!(cost_usd(&p, &d), 0.000708333, "to the nano-dollar");
        // Per-minute only: token usage is not priced by this row.
        let t = usage(serde_json::json!({"type": "tokens", "input_tokens": 30,
            "output_tokens": 5, "total_tokens": 35,
            "input_token_details": {"audio_tokens": 30, "text_tokens": 0}}));
        assert!(!prices(&p, &t));
        // A row with both: each usage takes the rate of its shape.
        let both = PriceRow {
            audio_input: 6.0,
            text_output: 10.0,
            ..p.clone()
        };
        assert!(prices(&both, &t) && prices(&both, &d));
        assert!(close(cost_usd(&both, &t), (30.0 * 6.0 + 5.0 * 10.0) / 1e6));
        assert_eq!(cost_usd(&both, &d), 0.000708333);
    }

    #[test]
    fn a_duration_cost_is_finite_and_never_negative_and_a_long_one_is_implausible() {
        let at = |seconds: f64, per_minute: f64| {
            let p = PriceRow {
                usd_per_minute: Some(per_minute),
                ..PriceRow::default()
            };
            let u = Usage {
                audio_seconds: Some(seconds),
                ..Usage::default()
            };
            (cost_usd(&p, &u), charge(&u, cost_usd(&p, &u), 100.0))
        };
        for s in [-5.0, f64::NAN, f64::MAX, f64::INFINITY, 1e308] {
            for r in [f64::MAX, f64::NAN, -1.0, MAX_PRICE_USD_PER_MINUTE] {
                let (c, _) = at(s, r);
                assert!(c.is_finite() && c >= 0.0, "{s} s at {r}: {c}");
            }
        }
        assert!(!at(MAX_TURN_AUDIO_SECONDS, 0.017).1.implausible);
        let (_, c) = at(MAX_TURN_AUDIO_SECONDS + 1.0, 0.017);
        assert!(c.implausible);
        let (_, c) = at(1e9, 0.017);
        assert_eq!((c.implausible, c.cost_usd), (true, 100.0), "capped");
        assert!(at(f64::NAN, 0.017).1.implausible);
    }

    /// Images are priced at the text rates, cached ones at the cached
    /// text rate, and counted as cached.
    #[test]
    fn cached_image_tokens_are_priced_and_counted_as_cached() {
        let u = usage(serde_json::json!({"input_tokens": 1050,
            "input_token_details": {"text_tokens": 50, "image_tokens": 1000, "cached_tokens": 1050,
                "cached_tokens_details": {"text_tokens": 50, "image_tokens": 1000}}}));
        assert_eq!(
            (u.input_image, u.cached_image, u.cached()),
            (1000, 1000, 1050)
        );
        assert_eq!(cost_usd(&realtime_price(), &u), 1050.0 * 0.4 / 1e6);
        // Without the details, cached tokens are taken from text, audio,
        // then images.
        let u = usage(serde_json::json!({"input_tokens": 1050,
            "input_token_details": {"text_tokens": 50, "image_tokens": 1000, "cached_tokens": 550}}));
        assert_eq!(
            (u.cached_text, u.cached_audio, u.cached_image),
            (50, 0, 500)
        );
    }

    #[test]
    fn a_cost_is_kept_to_the_nano_dollar_without_binary_noise() {
        let u = usage(serde_json::json!({"input_tokens": 1, "output_tokens": 1,
            "input_token_details": {"text_tokens": 1}, "output_token_details": {"text_tokens": 1}}));
        let c = cost_usd(&realtime_price(), &u);
        assert_eq!(c, 2e-5);
        assert_eq!(serde_json::to_string(&c).unwrap(), "0.00002");
        // Below a nano-dollar nothing is lost that a row could show.
        let one = usage(
            serde_json::json!({"input_tokens": 1, "input_token_details": {"cached_tokens": 1, "text_tokens": 1}}),
        );
        assert_eq!(cost_usd(&realtime_price(), &one), 4e-7);
    }

    fn every_field_max() -> Usage {
        usage(serde_json::json!({
            "total_tokens": u64::MAX, "input_tokens": u64::MAX, "output_tokens": u64::MAX,
            "input_token_details": {"text_tokens": u64::MAX, "audio_tokens": u64::MAX,
                "image_tokens": u64::MAX, "cached_tokens": u64::MAX,
                "cached_tokens_details": {"text_tokens": u64::MAX, "audio_tokens": u64::MAX,
                    "image_tokens": u64::MAX}},
            "output_token_details": {"text_tokens": u64::MAX, "audio_tokens": u64::MAX}
        }))
    }

    fn every_rate(usd_per_million: f64) -> PriceRow {
        PriceRow {
            upstream: None,
            model: "m".into(),
            text_input: usd_per_million,
            cached_text_input: usd_per_million,
            audio_input: usd_per_million,
            cached_audio_input: usd_per_million,
            text_output: usd_per_million,
            usd_per_minute: None,
            audio_output: usd_per_million,
        }
    }

    #[test]
    fn the_largest_usage_at_the_highest_allowed_price_costs_a_finite_amount() {
        let c = cost_usd(
            &every_rate(patchbay_config::MAX_PRICE_USD_PER_MILLION_TOKENS),
            &every_field_max(),
        );
        assert!(c.is_finite() && c > 0.0, "{c}");
    }

    /// Prices are validated at load, but the arithmetic does not rely on
    /// it: a row built in code with a rate past the ceiling (or not a
    /// number) still gives a finite cost >= 0.
    #[test]
    fn a_cost_is_finite_and_never_negative_whatever_the_row_holds() {
        let u = every_field_max();
        for rate in [
            f64::MAX,
            1e308,
            f64::INFINITY,
            f64::NAN,
            -1.0,
            f64::NEG_INFINITY,
        ] {
            let c = cost_usd(&every_rate(rate), &u);
            assert!(c.is_finite() && c >= 0.0, "rate {rate}: cost {c}");
        }
        // A Usage built in code that breaks the cached <= input invariant
        // neither panics nor wraps around.
        let odd = Usage {
            input_text: 1,
            cached_text: 5,
            ..Usage::default()
        };
        let c = cost_usd(&realtime_price(), &odd);
        assert!(c.is_finite() && c >= 0.0, "{c}");
    }

    #[test]
    fn a_plausible_turn_is_charged_as_reported() {
        let u = Usage::from_json(&serde_json::from_value(patchbay_sim::usage_for(2, 5)).unwrap());
        let cost = cost_usd(&realtime_price(), &u);
        let c = charge(&u, cost, 100.0);
        assert_eq!((c.cost_usd, c.tokens, c.implausible), (cost, 192, false));
        // At the bounds exactly: still plausible.
        let edge = Usage {
            total: MAX_TURN_TOKENS,
            ..Usage::default()
        };
        assert_eq!(
            charge(&edge, 100.0, 100.0),
            Charge {
                cost_usd: 100.0,
                tokens: MAX_TURN_TOKENS,
                implausible: false
            }
        );
    }

    #[test]
    fn too_many_tokens_flag_the_turn_and_cap_its_cost_and_tokens() {
        let u = every_field_max();
        let cost = cost_usd(&realtime_price(), &u);
        assert!(cost > 100.0);
        let c = charge(&u, cost, 100.0);
        assert_eq!(
            c,
            Charge {
                cost_usd: 100.0,
                tokens: MAX_TURN_TOKENS,
                implausible: true
            }
        );
        // Just past the bound, cheap (or unpriced): flagged, cost kept.
        let over = Usage {
            total: MAX_TURN_TOKENS + 1,
            ..Usage::default()
        };
        assert_eq!(
            charge(&over, 0.0, 100.0),
            Charge {
                cost_usd: 0.0,
                tokens: MAX_TURN_TOKENS,
                implausible: true
            }
        );
    }

    #[test]
    fn a_cost_above_max_turn_usd_flags_the_turn_and_is_capped() {
        let u = Usage {
            total: 1000,
            ..Usage::default()
        };
        let c = charge(&u, 250.0, 100.0);
        assert_eq!((c.cost_usd, c.tokens, c.implausible), (100.0, 1000, true));
        let c = charge(&u, f64::NAN, 3.0);
        assert_eq!((c.cost_usd, c.implausible), (3.0, true));
    }

    #[test]
    fn a_route_priced_only_per_minute_is_unpriced_for_its_response_turns() {
        let route = crate::config::RouteConfig {
            model: "m".into(),
            ..Default::default()
        };
        let per_minute = |tokens: f64| {
            vec![PriceRow {
                model: "m".into(),
                text_input: tokens,
                usd_per_minute: Some(0.017),
                ..PriceRow::default()
            }]
        };
        assert!(!route_priced(&per_minute(0.0), &route));
        assert!(route_priced(&per_minute(4.0), &route));
        let free = vec![PriceRow {
            model: "m".into(),
            ..PriceRow::default()
        }];
        assert!(
            route_priced(&free, &route),
            "a row of zeros is a free model"
        );
    }

    #[test]
    fn a_route_is_priced_by_model_then_upstream_model() {
        let prices = vec![
            PriceRow {
                upstream: None,
                model: "up".into(),
                text_input: 1.0,
                ..PriceRow::default()
            },
            PriceRow {
                upstream: None,
                model: "m".into(),
                text_input: 2.0,
                ..PriceRow::default()
            },
        ];
        assert_eq!(find(&prices, "m", "up", "m").unwrap().text_input, 2.0);
        assert_eq!(find(&prices, "other", "up", "m").unwrap().text_input, 1.0);
        assert!(find(&prices, "x", "y", "m").is_none());
    }

    #[test]
    fn a_row_naming_the_upstream_prices_its_sessions_and_others_take_the_plain_row() {
        let prices = vec![
            PriceRow {
                model: "m".into(),
                text_input: 2.0,
                ..PriceRow::default()
            },
            PriceRow {
                upstream: Some("azure-eastus".into()),
                model: "m".into(),
                text_input: 3.0,
                ..PriceRow::default()
            },
            PriceRow {
                upstream: Some("only-here".into()),
                model: "solo".into(),
                text_input: 5.0,
                ..PriceRow::default()
            },
        ];
        assert_eq!(
            find(&prices, "m", "m", "azure-eastus").unwrap().text_input,
            3.0
        );
        assert_eq!(find(&prices, "m", "m", "openai").unwrap().text_input, 2.0);
        assert_eq!(
            find(&prices, "solo", "solo", "only-here")
                .unwrap()
                .text_input,
            5.0
        );
        assert!(find(&prices, "solo", "solo", "elsewhere").is_none());
    }
}
