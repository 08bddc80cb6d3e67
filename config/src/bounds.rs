//! Bounds on the numbers of `gateway.toml` that a route's spec sets: the gateway's loader refuses
//! a value outside them (naming the key), the operator's CRD schema publishes them as `minimum`
//! and `maximum`, and the operator's validation refuses a route whose value is outside them. A
//! bound not listed here is the type's own (`0` for a `u64`).

/// Upper bound of every `*_secs` setting: one year. Every duration is added to a clock reading
/// somewhere; past a year it is a typo, and near `u64::MAX` seconds the addition would overflow
/// at run time instead of failing at load.
pub const MAX_SECS: u64 = 366 * 24 * 3600;

/// Least `pool.max_idle_secs`: a warm socket is kept at least a second.
pub const MIN_POOL_MAX_IDLE_SECS: u64 = 1;

/// Least `drain.wait_secs`: a drain lasts at least a second.
pub const MIN_DRAIN_WAIT_SECS: u64 = 1;

/// Least `client_secrets.max_ttl_secs`, and the shortest life a minted client secret may ask for
/// (`expires_after.seconds`), as OpenAI's API.
pub const MIN_CLIENT_SECRET_TTL_SECS: u64 = 10;

/// Most `client_secrets.max_ttl_secs`, its default, and the longest life of a minted client
/// secret, as OpenAI's API.
pub const MAX_CLIENT_SECRET_TTL_SECS: u64 = 7200;

/// Most any `[[prices]]` rate may be, in USD per 1M tokens. The most expensive published Realtime
/// rate is under 100 USD per 1M tokens, so this never refuses a real price; a larger value is a
/// typo (or a unit mistake), and the ceiling keeps every cost finite: the largest usage a turn can
/// report (`u64::MAX` tokens, about 1.8e19) at this rate is about 1.8e19 USD per price column,
/// far below `f64::MAX`. Enforced by the gateway's loader (and its cost arithmetic), published as
/// the `maximum` of every price field of the operator's CRD, and checked by the operator's
/// validation, so a route the gateway would refuse at start is refused before any pod runs.
pub const MAX_PRICE_USD_PER_MILLION_TOKENS: f64 = 1_000_000.0;

/// Most a `[[prices]]` row's `usd_per_minute` may be. The published per-minute rates are cents
/// (`gpt-realtime-whisper` and `gpt-live-transcribe`: 0.017 USD per minute of audio), so this
/// never refuses a real price and catches a rate typed per hour or in cents. Enforced like
/// [`MAX_PRICE_USD_PER_MILLION_TOKENS`]: the gateway's loader, the CRD's `maximum`, the operator's
/// validation.
pub const MAX_PRICE_USD_PER_MINUTE: f64 = 1_000.0;
