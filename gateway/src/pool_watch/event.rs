//! The pure part of the pool size watch: the API paths it asks for, the
//! ConfigMap and watch events it reads (newline-delimited JSON, split by
//! [`Lines`] with a bound on a line's length), its reconnect [`Backoff`]
//! and the gate that keeps its connection warnings to one a minute
//! ([`WarnGate`]). No I/O here: every decision is a function of its input.

use std::time::{Duration, Instant};

use serde::Deserialize;

/// The ConfigMap key holding the size (what the operator writes, and what
/// the mounted size file is named).
pub const SIZE_KEY: &str = "REALTIME_POOL_SIZE";
/// `timeoutSeconds` of each watch: the API server ends it cleanly after
/// this long and the gateway starts the next from the last resourceVersion.
pub const WATCH_TIMEOUT_SECS: u64 = 290;
/// The longest line of a watch stream (one event) or GET body read.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;
/// The first reconnect pause; it doubles up to [`BACKOFF_CAP`].
pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
pub const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// At most one connection warning per this long while the API server
/// cannot be reached (the first failure of a streak always warns).
pub const WARN_EVERY: Duration = Duration::from_secs(60);

/// `GET` of the one ConfigMap (what RBAC `resourceNames` authorises).
pub fn get_path(namespace: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/configmaps/{name}")
}

/// A watch of that ConfigMap alone: a list/watch with a `metadata.name`
/// field selector is what a Role's `resourceNames` allows (a watch of the
/// whole collection would be refused).
pub fn watch_path(namespace: &str, name: &str, resource_version: &str) -> String {
    let rv: String = url::form_urlencoded::byte_serialize(resource_version.as_bytes()).collect();
    format!(
        "/api/v1/namespaces/{namespace}/configmaps?fieldSelector=metadata.name%3D{name}\
         &watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds={WATCH_TIMEOUT_SECS}"
    )
}

#[derive(Debug, Deserialize)]
struct Metadata {
    #[serde(rename = "resourceVersion", default)]
    resource_version: String,
}

#[derive(Debug, Deserialize)]
struct ConfigMap {
    metadata: Metadata,
    #[serde(default)]
    data: std::collections::HashMap<String, String>,
}

/// What a ConfigMap says: its size text (`None` without the key) and its
/// resourceVersion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub size: Option<String>,
    pub resource_version: String,
}

/// Reads a ConfigMap object (a GET's body).
pub fn parse_configmap(body: &[u8]) -> Result<Seen, String> {
    let cm: ConfigMap =
        serde_json::from_slice(body).map_err(|e| format!("not a ConfigMap: {e}"))?;
    seen(cm)
}

fn seen(cm: ConfigMap) -> Result<Seen, String> {
    if cm.metadata.resource_version.is_empty() {
        return Err("the ConfigMap has no metadata.resourceVersion".into());
    }
    let mut data = cm.data;
    Ok(Seen {
        size: data.remove(SIZE_KEY),
        resource_version: cm.metadata.resource_version,
    })
}

/// One event of a watch stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `ADDED` or `MODIFIED`: apply the size.
    Changed(Seen),
    /// `BOOKMARK`: only the resourceVersion moves.
    Bookmark { resource_version: String },
    /// `DELETED`: the current size stays.
    Deleted { resource_version: String },
    /// `ERROR` 410 Gone: the resourceVersion is too old; GET again.
    Expired,
    /// Any other `ERROR`.
    Error { code: u16, message: String },
}

#[derive(Debug, Deserialize)]
struct RawEvent {
    #[serde(rename = "type")]
    kind: String,
    object: serde_json::Value,
}

#[derive(Debug, Deserialize)]
struct Status {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    message: String,
}

/// Reads one line of a watch stream.
pub fn parse_event(line: &[u8]) -> Result<Event, String> {
    let raw: RawEvent =
        serde_json::from_slice(line).map_err(|e| format!("not a watch event: {e}"))?;
    let object = |o: serde_json::Value| -> Result<ConfigMap, String> {
        serde_json::from_value(o)
            .map_err(|e| format!("{} event without a ConfigMap: {e}", raw.kind))
    };
    match raw.kind.as_str() {
        "ADDED" | "MODIFIED" => Ok(Event::Changed(seen(object(raw.object)?)?)),
        "BOOKMARK" => Ok(Event::Bookmark {
            resource_version: seen(object(raw.object)?)?.resource_version,
        }),
        "DELETED" => Ok(Event::Deleted {
            resource_version: seen(object(raw.object)?)?.resource_version,
        }),
        "ERROR" => {
            let status: Status = serde_json::from_value(raw.object)
                .map_err(|e| format!("ERROR event without a Status: {e}"))?;
            Ok(if status.code == 410 {
                Event::Expired
            } else {
                Event::Error {
                    code: status.code,
                    message: status.message,
                }
            })
        }
        other => Err(format!("unknown watch event type {other:?}")),
    }
}

/// Splits a byte stream into lines (without their `\n`; blank lines are
/// skipped), refusing a line longer than its bound.
#[derive(Debug)]
pub struct Lines {
    partial: Vec<u8>,
    max: usize,
}

/// A line past [`Lines`]' bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a line of the watch stream is longer than {0} bytes")]
pub struct LineTooLong(pub usize);

impl Lines {
    pub fn new(max: usize) -> Self {
        Self {
            partial: Vec::new(),
            max,
        }
    }

    /// The complete lines `chunk` ends; a partial last line is kept for
    /// the next chunk.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Vec<u8>>, LineTooLong> {
        let mut lines = Vec::new();
        let mut rest = chunk;
        while let Some(i) = memchr::memchr(b'\n', rest) {
            self.take(&rest[..i])?;
            let line = std::mem::take(&mut self.partial);
            if !line.iter().all(u8::is_ascii_whitespace) {
                lines.push(line);
            }
            rest = &rest[i + 1..];
        }
        self.take(rest)?;
        Ok(lines)
    }

    fn take(&mut self, bytes: &[u8]) -> Result<(), LineTooLong> {
        if self.partial.len() + bytes.len() > self.max {
            return Err(LineTooLong(self.max));
        }
        self.partial.extend_from_slice(bytes);
        Ok(())
    }
}

/// Capped exponential backoff with jitter: each failure waits between
/// half and all of the current step, and doubles the step up to
/// [`BACKOFF_CAP`]; a watch that opens resets it.
#[derive(Debug)]
pub struct Backoff {
    step: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { step: BACKOFF_BASE }
    }
}

impl Backoff {
    /// The pause after a failure; `jitter` is uniform in `[0, 1)`.
    pub fn failed(&mut self, jitter: f64) -> Duration {
        let pause = self.step.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0));
        self.step = (self.step * 2).min(BACKOFF_CAP);
        pause
    }

    pub fn reset(&mut self) {
        self.step = BACKOFF_BASE;
    }
}

/// Rate-limits the warnings of a failure streak: the first failure warns,
/// then at most one per [`WARN_EVERY`], each saying how many were not.
#[derive(Debug, Default)]
pub struct WarnGate {
    last: Option<Instant>,
    quiet: u32,
}

impl WarnGate {
    /// `Some(failures not warned about since the last warning)` when this
    /// failure is to be warned about.
    pub fn failed(&mut self, now: Instant) -> Option<u32> {
        match self.last {
            Some(at) if now.duration_since(at) < WARN_EVERY => {
                self.quiet += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.quiet))
            }
        }
    }

    /// Ends the streak; `true` when it had warned (so recovery is logged).
    pub fn recovered(&mut self) -> bool {
        self.quiet = 0;
        self.last.take().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paths_are_the_ones_resource_names_authorise() {
        assert_eq!(
            get_path("voice", "voice-pool"),
            "/api/v1/namespaces/voice/configmaps/voice-pool"
        );
        assert_eq!(
            watch_path("voice", "voice-pool", "1234"),
            "/api/v1/namespaces/voice/configmaps?fieldSelector=metadata.name%3Dvoice-pool\
             &watch=true&resourceVersion=1234&allowWatchBookmarks=true&timeoutSeconds=290"
        );
        assert!(watch_path("n", "c", "a&b=c").contains("resourceVersion=a%26b%3Dc&"));
    }

    #[test]
    fn a_configmap_gives_its_size_and_resource_version() {
        let body = br#"{"kind":"ConfigMap","metadata":{"name":"p","resourceVersion":"7"},"data":{"REALTIME_POOL_SIZE":"12"}}"#;
        assert_eq!(
            parse_configmap(body).unwrap(),
            Seen {
                size: Some("12".into()),
                resource_version: "7".into()
            }
        );
        let no_key = br#"{"metadata":{"resourceVersion":"8"}}"#;
        assert_eq!(parse_configmap(no_key).unwrap().size, None);
        assert!(parse_configmap(br#"{"metadata":{}}"#).is_err());
        assert!(parse_configmap(b"<html>").is_err());
    }

    #[test]
    fn watch_events_are_read_by_type() {
        let cm = |t: &str| {
            format!(
                r#"{{"type":"{t}","object":{{"metadata":{{"resourceVersion":"9"}},"data":{{"REALTIME_POOL_SIZE":"3"}}}}}}"#
            )
        };
        let changed = Event::Changed(Seen {
            size: Some("3".into()),
            resource_version: "9".into(),
        });
        assert_eq!(parse_event(cm("ADDED").as_bytes()).unwrap(), changed);
        assert_eq!(parse_event(cm("MODIFIED").as_bytes()).unwrap(), changed);
        assert_eq!(
            parse_event(cm("DELETED").as_bytes()).unwrap(),
            Event::Deleted {
                resource_version: "9".into()
            }
        );
        let bookmark = br#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","metadata":{"resourceVersion":"12"}}}"#;
        assert_eq!(
            parse_event(bookmark).unwrap(),
            Event::Bookmark {
                resource_version: "12".into()
            }
        );
        let gone = br#"{"type":"ERROR","object":{"kind":"Status","status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410}}"#;
        assert_eq!(parse_event(gone).unwrap(), Event::Expired);
        let other = br#"{"type":"ERROR","object":{"kind":"Status","message":"boom","code":500}}"#;
        assert_eq!(
            parse_event(other).unwrap(),
            Event::Error {
                code: 500,
                message: "boom".into()
            }
        );
        assert!(parse_event(br#"{"type":"PATCHED","object":{}}"#).is_err());
        assert!(parse_event(b"{").is_err());
    }

    #[test]
    fn lines_are_split_across_chunks_and_bounded() {
        let mut lines = Lines::new(8);
        assert_eq!(lines.push(b"abc").unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(
            lines.push(b"de\n\nfg\nh").unwrap(),
            vec![b"abcde".to_vec(), b"fg".to_vec()]
        );
        assert_eq!(lines.push(b"\n").unwrap(), vec![b"h".to_vec()]);
        assert_eq!(
            lines.push(b"12345678\n").unwrap(),
            vec![b"12345678".to_vec()]
        );
        assert_eq!(lines.push(b"12345"), Ok(Vec::new()));
        assert_eq!(lines.push(b"6789"), Err(LineTooLong(8)));
    }

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter_and_resets() {
        let mut b = Backoff::default();
        assert_eq!(b.failed(1.0), Duration::from_secs(1));
        assert_eq!(b.failed(0.0), Duration::from_secs(1));
        assert_eq!(b.failed(1.0), Duration::from_secs(4));
        for _ in 0..10 {
            b.failed(0.5);
        }
        assert_eq!(b.failed(1.0), BACKOFF_CAP);
        assert_eq!(b.failed(0.0), BACKOFF_CAP / 2);
        b.reset();
        assert_eq!(b.failed(1.0), BACKOFF_BASE);
    }

    #[test]
    fn a_failure_streak_warns_once_a_minute_and_counts_the_quiet_ones() {
        let mut gate = WarnGate::default();
        let t0 = Instant::now();
        assert_eq!(gate.failed(t0), Some(0));
        assert_eq!(gate.failed(t0 + Duration::from_secs(1)), None);
        assert_eq!(gate.failed(t0 + Duration::from_secs(30)), None);
        assert_eq!(gate.failed(t0 + WARN_EVERY), Some(2));
        assert!(gate.recovered());
        assert!(!gate.recovered());
        assert_eq!(gate.failed(t0 + WARN_EVERY), Some(0));
    }
}
