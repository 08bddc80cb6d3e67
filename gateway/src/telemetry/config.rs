//! `[telemetry]`: where and how the gateway exports OpenTelemetry, and the
//! standard `OTEL_*` variables that configure the same settings.
//!
//! Off unless an endpoint is set (`[telemetry] endpoint`,
//! `PATCHBAY_TELEMETRY_ENDPOINT`, or `OTEL_EXPORTER_OTLP_ENDPOINT`).
//! A standard variable, when set, wins over the file (it is how collectors
//! and operators configure every OpenTelemetry SDK); `OTEL_SDK_DISABLED=true`
//! turns export off whatever the rest says.
//!
//! Read at start only: a changed setting needs a restart.
//!
//! Two protocols, per signal ([`Protocol`]): `http/protobuf` (OTLP over
//! HTTP/1.1, binary protobuf, the specification's default) and `grpc`
//! (OTLP/gRPC unary calls over HTTP/2, the same protobuf messages).
//! `OTEL_EXPORTER_OTLP_PROTOCOL` (or `[telemetry] protocol`) sets all three
//! signals, `OTEL_EXPORTER_OTLP_{TRACES,LOGS,METRICS}_PROTOCOL` one of them;
//! anything else (`http/json`) is refused at start, naming its source.
//!
//! Endpoints follow the specification: with `http/protobuf` the signal
//! path (`/v1/traces`, …) is appended to `OTEL_EXPORTER_OTLP_ENDPOINT`;
//! with `grpc` the endpoint is used as is (the call's path is the service
//! method's). Once some endpoint turns export on, a signal that has none
//! uses its protocol's default (`http://localhost:4318/v1/<signal>`, or
//! `http://localhost:4317` for gRPC).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::context::{Sampler, DEFAULT_SAMPLER};

/// Default `service.name`.
pub const DEFAULT_SERVICE_NAME: &str = "patchbay-gateway";
/// Default bound on items waiting for export (`OTEL_BSP_MAX_QUEUE_SIZE`'s).
pub const DEFAULT_QUEUE_SIZE: usize = 2048;
/// Default largest batch (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`'s).
pub const DEFAULT_BATCH_SIZE: usize = 512;
/// Default delay between exports of a partial batch.
pub const DEFAULT_BATCH_DELAY_MS: u64 = 1000;
/// Default bound on one export request (`OTEL_EXPORTER_OTLP_TIMEOUT`'s).
pub const DEFAULT_EXPORT_TIMEOUT_MS: u64 = 10_000;
/// Default metric export interval (`OTEL_METRIC_EXPORT_INTERVAL`'s).
pub const DEFAULT_METRICS_INTERVAL_MS: u64 = 60_000;
/// The specification's default endpoint for `http/protobuf`.
pub const DEFAULT_HTTP_ENDPOINT: &str = "http://localhost:4318";
/// The specification's default endpoint for `grpc`.
pub const DEFAULT_GRPC_ENDPOINT: &str = "http://localhost:4317";

/// How a signal is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP: a POST of the binary protobuf message (HTTP/1.1).
    HttpProtobuf,
    /// OTLP/gRPC: a unary call carrying the same message (HTTP/2).
    Grpc,
}

impl Protocol {
    /// The `OTEL_EXPORTER_OTLP_PROTOCOL` value, or `None` for one not spoken.
    pub fn parse(v: &str) -> Option<Self> {
        match v {
            "http/protobuf" => Some(Self::HttpProtobuf),
            "grpc" => Some(Self::Grpc),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::HttpProtobuf => "http/protobuf",
            Self::Grpc => "grpc",
        }
    }
}

/// The section as written in the file (every key optional).
#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's base URL (`http://collector:4318`); with
    /// `http/protobuf` the signal paths `/v1/traces`, `/v1/logs` and
    /// `/v1/metrics` are appended, with `grpc` it is used as is.
    pub endpoint: Option<String>,
    /// `http/protobuf` (the default) or `grpc`.
    pub protocol: Option<String>,
    pub service_name: Option<String>,
    /// `key=value,key=value`, as `OTEL_RESOURCE_ATTRIBUTES`.
    pub resource_attributes: Option<String>,
    /// An `OTEL_TRACES_SAMPLER` name.
    pub sampler: Option<String>,
    pub sampler_arg: Option<String>,
    pub queue_size: Option<usize>,
    pub batch_size: Option<usize>,
    pub batch_delay_ms: Option<u64>,
    pub export_timeout_ms: Option<u64>,
    pub metrics_interval_ms: Option<u64>,
}

/// Where one signal goes, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    /// With `grpc`, only its scheme and authority are used.
    pub url: url::Url,
    pub protocol: Protocol,
}

/// Where each signal goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoints {
    pub traces: Endpoint,
    pub logs: Endpoint,
    pub metrics: Endpoint,
}

/// The settings in force, resolved from the file and the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub endpoints: Endpoints,
    /// Sent with every export (`OTEL_EXPORTER_OTLP_HEADERS`: a collector's
    /// token lives in the environment, never in the file).
    pub headers: Vec<(String, String)>,
    pub resource: Vec<(String, String)>,
    pub sampler: Sampler,
    pub queue_size: usize,
    pub batch_size: usize,
    pub batch_delay: Duration,
    pub export_timeout: Duration,
    pub metrics_interval: Duration,
}

/// A setting that cannot be used: the key or variable, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct SettingError {
    pub key: String,
    pub message: String,
}

fn err(key: &str, message: impl Into<String>) -> SettingError {
    SettingError {
        key: key.to_string(),
        message: message.into(),
    }
}

impl TelemetryConfig {
    /// The settings in force, or `None` when export is off (no endpoint,
    /// or `OTEL_SDK_DISABLED=true`).
    pub fn resolve(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Settings>, SettingError> {
        let var = |k: &str| {
            env(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        // A standard variable wins over the file; the file's key names the
        // error when the value came from it.
        let pick =
            |std_var: &'static str, file: &Option<String>, key: &'static str| match var(std_var) {
                Some(v) => Some((v, std_var)),
                None => file
                    .clone()
                    .filter(|v| !v.trim().is_empty())
                    .map(|v| (v, key)),
            };
        let base = pick(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            &self.endpoint,
            "telemetry.endpoint",
        );
        let per_signal = |name: &'static str| var(name).map(|v| (v, name));
        let traces_own = per_signal("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        let logs_own = per_signal("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT");
        let metrics_own = per_signal("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
        if base.is_none() && traces_own.is_none() && logs_own.is_none() && metrics_own.is_none() {
            return Ok(None);
        }
        let protocol_of = |key: &str, v: &str| {
            Protocol::parse(v).ok_or_else(|| {
                err(
                    key,
                    format!("protocol `{v}` is not supported: use `http/protobuf` or `grpc`"),
                )
            })
        };
        let protocol = match pick(
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            &self.protocol,
            "telemetry.protocol",
        ) {
            Some((v, key)) => protocol_of(key, &v)?,
            None => Protocol::HttpProtobuf,
        };
        let signal = |own: Option<(String, &'static str)>,
                      protocol_var: &'static str,
                      path: &str|
         -> Result<Endpoint, SettingError> {
            let protocol = match var(protocol_var) {
                Some(v) => protocol_of(protocol_var, &v)?,
                None => protocol,
            };
            // A signal's own endpoint is always used as is; the base gets
            // the signal's path with http/protobuf only.
            let url = match (own, &base) {
                (Some((v, key)), _) => parse_http_url(&v, key)?,
                (None, Some((v, key))) => with_signal_path(parse_http_url(v, key)?, protocol, path),
                (None, None) => {
                    let default = match protocol {
                        Protocol::HttpProtobuf => DEFAULT_HTTP_ENDPOINT,
                        Protocol::Grpc => DEFAULT_GRPC_ENDPOINT,
                    };
                    with_signal_path(parse_http_url(default, "default")?, protocol, path)
                }
            };
            Ok(Endpoint { url, protocol })
        };
        let endpoints = Endpoints {
            traces: signal(
                traces_own,
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                "v1/traces",
            )?,
            logs: signal(logs_own, "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "v1/logs")?,
            metrics: signal(
                metrics_own,
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
                "v1/metrics",
            )?,
        };
        let headers = match var("OTEL_EXPORTER_OTLP_HEADERS") {
            Some(h) => parse_pairs(&h).map_err(|m| err("OTEL_EXPORTER_OTLP_HEADERS", m))?,
            None => Vec::new(),
        };
        let mut resource = vec![
            ("service.name".to_string(), DEFAULT_SERVICE_NAME.to_string()),
            (
                "service.version".to_string(),
                env!("CARGO_PKG_VERSION").to_string(),
            ),
            ("telemetry.sdk.name".to_string(), "patchbay".to_string()),
            ("telemetry.sdk.language".to_string(), "rust".to_string()),
        ];
        let mut set = |k: String, v: String| match resource.iter_mut().find(|(rk, _)| *rk == k) {
            Some(slot) => slot.1 = v,
            None => resource.push((k, v)),
        };
        if let Some(name) = &self.service_name {
            set("service.name".into(), name.clone());
        }
        for (source, key) in [
            (
                self.resource_attributes.clone(),
                "telemetry.resource_attributes",
            ),
            (var("OTEL_RESOURCE_ATTRIBUTES"), "OTEL_RESOURCE_ATTRIBUTES"),
        ] {
            if let Some(text) = source {
                for (k, v) in parse_pairs(&text).map_err(|m| err(key, m))? {
                    set(k, v);
                }
            }
        }
        if let Some(name) = var("OTEL_SERVICE_NAME") {
            set("service.name".into(), name);
        }
        let sampler = match pick("OTEL_TRACES_SAMPLER", &self.sampler, "telemetry.sampler") {
            Some((name, key)) => {
                let arg = var("OTEL_TRACES_SAMPLER_ARG").or_else(|| self.sampler_arg.clone());
                Sampler::parse(&name, arg.as_deref()).map_err(|m| err(key, m))?
            }
            None => DEFAULT_SAMPLER,
        };
        let number = |std_var: &'static str, file: Option<u64>, key: &'static str, default: u64| {
            let v = match var(std_var) {
                Some(v) => v
                    .parse::<u64>()
                    .map_err(|_| err(std_var, format!("`{v}` is not a whole number")))?,
                None => file.unwrap_or(default),
            };
            if v == 0 {
                return Err(err(key, "must be at least 1"));
            }
            Ok(v)
        };
        let queue_size = number(
            "OTEL_BSP_MAX_QUEUE_SIZE",
            self.queue_size.map(|v| v as u64),
            "telemetry.queue_size",
            DEFAULT_QUEUE_SIZE as u64,
        )?;
        let batch_size = number(
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            self.batch_size.map(|v| v as u64),
            "telemetry.batch_size",
            DEFAULT_BATCH_SIZE as u64,
        )?;
        let ms = Duration::from_millis;
        Ok(Some(Settings {
            endpoints,
            headers,
            resource,
            sampler,
            queue_size: queue_size as usize,
            batch_size: batch_size.min(queue_size) as usize,
            batch_delay: ms(number(
                "OTEL_BSP_SCHEDULE_DELAY",
                self.batch_delay_ms,
                "telemetry.batch_delay_ms",
                DEFAULT_BATCH_DELAY_MS,
            )?),
            export_timeout: ms(number(
                "OTEL_EXPORTER_OTLP_TIMEOUT",
                self.export_timeout_ms,
                "telemetry.export_timeout_ms",
                DEFAULT_EXPORT_TIMEOUT_MS,
            )?),
            metrics_interval: ms(number(
                "OTEL_METRIC_EXPORT_INTERVAL",
                self.metrics_interval_ms,
                "telemetry.metrics_interval_ms",
                DEFAULT_METRICS_INTERVAL_MS,
            )?),
        }))
    }
}

/// `u` as it may be logged: without a user name or password.
pub fn shown(u: &url::Url) -> String {
    let mut u = u.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.to_string()
}

/// `base` with the signal's `path` appended (http/protobuf), or as it is
/// (grpc).
fn with_signal_path(mut base: url::Url, protocol: Protocol, path: &str) -> url::Url {
    if protocol == Protocol::HttpProtobuf {
        let joined = format!("{}/{path}", base.path().trim_end_matches('/'));
        base.set_path(&joined);
    }
    base
}

/// An `http://` or `https://` URL with a host.
fn parse_http_url(v: &str, key: &str) -> Result<url::Url, SettingError> {
    let u = url::Url::parse(v).map_err(|e| err(key, format!("`{v}` is not a URL: {e}")))?;
    match u.scheme() {
        "http" | "https" if u.host_str().is_some() => Ok(u),
        _ => Err(err(
            key,
            format!("`{v}` must be an http:// or https:// URL"),
        )),
    }
}

/// `k=v,k=v` with percent-encoded keys and values (the W3C baggage form the
/// `OTEL_*` lists use).
fn parse_pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!("`{item}` is not key=value"));
        };
        let decode = |s: &str| {
            url::form_urlencoded::parse(format!("x={}", s.trim().replace('+', "%2B")).as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        let k = decode(k);
        if k.is_empty() {
            return Err(format!("`{item}` has an empty key"));
        }
        out.push((k, decode(v)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::telemetry::context::Root;

    fn resolve(
        file: &TelemetryConfig,
        vars: &[(&str, &str)],
    ) -> Result<Option<Settings>, SettingError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        file.resolve(&|k| vars.get(k).cloned())
    }

    #[test]
    fn export_is_off_without_an_endpoint() {
        assert_eq!(resolve(&TelemetryConfig::default(), &[]), Ok(None));
        assert_eq!(
            resolve(
                &TelemetryConfig::default(),
                &[
                    ("OTEL_SERVICE_NAME", "x"),
                    ("OTEL_TRACES_SAMPLER", "always_on")
                ]
            ),
            Ok(None)
        );
    }

    #[test]
    fn the_standard_variables_configure_every_signal() {
        let s = resolve(
            &TelemetryConfig::default(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/base/"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_SERVICE_NAME", "voice-gw"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "deployment.environment=prod,team=a%2Cb",
                ),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            s.endpoints.traces.url.as_str(),
            "http://collector:4318/base/v1/traces"
        );
        assert_eq!(
            s.endpoints.logs.url.as_str(),
            "http://collector:4318/base/v1/logs"
        );
        assert_eq!(
            s.endpoints.metrics.url.as_str(),
            "http://collector:4318/base/v1/metrics"
        );
        let res: HashMap<_, _> = s.resource.iter().cloned().collect();
        assert_eq!(res["service.name"], "voice-gw");
        assert_eq!(res["deployment.environment"], "prod");
        assert_eq!(res["team"], "a,b");
        assert_eq!(s.sampler, Sampler::ParentBased(Root::TraceIdRatio(0.5)));
        assert_eq!(s.headers, vec![("authorization".into(), "Bearer t".into())]);
        assert_eq!(s.queue_size, DEFAULT_QUEUE_SIZE);
    }

    #[test]
    fn a_standard_variable_wins_over_the_file_and_the_file_works_alone() {
        let file = TelemetryConfig {
            endpoint: Some("http://file:4318".into()),
            service_name: Some("from-file".into()),
            sampler: Some("always_off".into()),
            queue_size: Some(10),
            ..TelemetryConfig::default()
        };
        let s = resolve(&file, &[]).unwrap().unwrap();
        assert_eq!(
            s.endpoints.traces.url.as_str(),
            "http://file:4318/v1/traces"
        );
        assert_eq!(s.sampler, Sampler::AlwaysOff);
        assert_eq!(s.queue_size, 10);
        assert_eq!(s.batch_size, 10);
        let s = resolve(&file, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318")])
            .unwrap()
            .unwrap();
        assert_eq!(s.endpoints.traces.url.as_str(), "http://env:4318/v1/traces");
        let with_password = url::Url::parse("https://u:p@c:4318/v1/traces").unwrap();
        assert_eq!(shown(&with_password), "https://c:4318/v1/traces");
        assert_eq!(resolve(&file, &[("OTEL_SDK_DISABLED", "true")]), Ok(None));
    }

    #[test]
    fn unknown_protocols_and_bad_values_are_refused_naming_their_source() {
        let e = resolve(
            &TelemetryConfig::default(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ],
        )
        .unwrap_err();
        assert_eq!(e.key, "OTEL_EXPORTER_OTLP_PROTOCOL");
        let e = resolve(
            &TelemetryConfig::default(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "gRPC"),
            ],
        )
        .unwrap_err();
        assert_eq!(e.key, "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL");
        let file = TelemetryConfig {
            endpoint: Some("http://c:4317".into()),
            protocol: Some("thrift".into()),
            ..TelemetryConfig::default()
        };
        assert_eq!(resolve(&file, &[]).unwrap_err().key, "telemetry.protocol");
        let file = TelemetryConfig {
            endpoint: Some("collector:4318".into()),
            ..TelemetryConfig::default()
        };
        assert_eq!(resolve(&file, &[]).unwrap_err().key, "telemetry.endpoint");
        let e = resolve(
            &TelemetryConfig::default(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_TRACES_SAMPLER", "xray"),
            ],
        )
        .unwrap_err();
        assert_eq!(e.key, "OTEL_TRACES_SAMPLER");
    }

    #[test]
    fn grpc_uses_the_endpoint_as_is_for_every_signal() {
        let s = resolve(
            &TelemetryConfig::default(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
        )
        .unwrap()
        .unwrap();
        for e in [&s.endpoints.traces, &s.endpoints.logs, &s.endpoints.metrics] {
            assert_eq!(e.protocol, Protocol::Grpc);
            assert_eq!(e.url.as_str(), "https://collector:4317/");
        }
        let file = TelemetryConfig {
            endpoint: Some("http://file:4317".into()),
            protocol: Some("grpc".into()),
            ..TelemetryConfig::default()
        };
        let s = resolve(&file, &[]).unwrap().unwrap();
        assert_eq!(s.endpoints.metrics.protocol, Protocol::Grpc);
        assert_eq!(s.endpoints.metrics.url.as_str(), "http://file:4317/");
        // The standard variable wins over the file.
        let s = resolve(&file, &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")])
            .unwrap()
            .unwrap();
        assert_eq!(s.endpoints.logs.protocol, Protocol::HttpProtobuf);
        assert_eq!(s.endpoints.logs.url.as_str(), "http://file:4317/v1/logs");
    }

    #[test]
    fn a_signal_can_have_a_protocol_and_endpoint_of_its_own() {
        let s = resolve(
            &TelemetryConfig::default(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:4317"),
                ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.endpoints.traces.protocol, Protocol::Grpc);
        assert_eq!(s.endpoints.traces.url.as_str(), "http://t:4317/");
        assert_eq!(s.endpoints.logs.protocol, Protocol::HttpProtobuf);
        assert_eq!(s.endpoints.logs.url.as_str(), "http://c:4318/v1/logs");
        // gRPC on the base endpoint: as is, no signal path.
        assert_eq!(s.endpoints.metrics.protocol, Protocol::Grpc);
        assert_eq!(s.endpoints.metrics.url.as_str(), "http://c:4318/");
    }

    #[test]
    fn a_signal_without_an_endpoint_uses_its_protocols_default() {
        let s = resolve(
            &TelemetryConfig::default(),
            &[
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://t:4318/v1/traces",
                ),
                ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.endpoints.traces.url.as_str(), "http://t:4318/v1/traces");
        assert_eq!(
            s.endpoints.logs.url.as_str(),
            "http://localhost:4318/v1/logs"
        );
        assert_eq!(s.endpoints.metrics.url.as_str(), "http://localhost:4317/");
        // A protocol alone does not turn export on.
        assert_eq!(
            resolve(
                &TelemetryConfig::default(),
                &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]
            ),
            Ok(None)
        );
    }
}
