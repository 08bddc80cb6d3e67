//! Pool hit rate from a gateway's Prometheus endpoint.
//!
//! The endpoint is scraped before and after the run and the difference is
//! reported, so sessions from earlier runs (or warm-up) do not count. The
//! request is a plain HTTP/1.0 GET over one TCP connection (no client crate
//! for one request to localhost), bounded in time and size. Counters are
//! summed over all their label sets; a counter with no sample in the
//! exposition is "not exported" (`None`), which the report prints as n/a.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const POOL_HITS: &str = "patchbay_pool_hits_total";
pub const POOL_MISSES: &str = "patchbay_pool_misses_total";
/// Bound on one scrape.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on an exposition's size.
const MAX_BODY_BYTES: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("not an http://host:port/path URL: {0}")]
    Url(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("timed out")]
    Timeout,
    #[error("HTTP status {0}")]
    Status(String),
}

/// Fetches `url` (http only) and returns the body.
pub async fn fetch(url: &str) -> Result<String, ScrapeError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| ScrapeError::Url(url.into()))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/metrics"),
    };
    if authority.is_empty() {
        return Err(ScrapeError::Url(url.into()));
    }
    let get = async {
        let host_port = if authority.contains(':') && !authority.ends_with(']') {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        let mut tcp = TcpStream::connect(host_port).await?;
        tcp.write_all(format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n").as_bytes())
            .await?;
        let mut raw = Vec::new();
        tcp.take(MAX_BODY_BYTES).read_to_end(&mut raw).await?;
        Ok::<_, ScrapeError>(raw)
    };
    let raw = tokio::time::timeout(SCRAPE_TIMEOUT, get)
        .await
        .map_err(|_| ScrapeError::Timeout)??;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.lines().next().unwrap_or("");
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(ScrapeError::Status(status.to_string()));
    }
    Ok(body.to_string())
}

/// Sum of every sample of counter `name` (any labels); `None` if the
/// exposition has no sample of it.
pub fn counter_sum(exposition: &str, name: &str) -> Option<f64> {
    let mut sum = None;
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let value = if let Some(labels) = rest.strip_prefix('{') {
            match labels.split_once('}') {
                Some((_, v)) => v,
                None => continue,
            }
        } else if rest.starts_with(' ') {
            rest
        } else {
            // A longer name with this prefix, e.g. `…_total_created`.
            continue;
        };
        if let Some(v) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum
}

/// Pool counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PoolCounts {
    pub hits: Option<f64>,
    pub misses: Option<f64>,
}

impl PoolCounts {
    pub fn from_exposition(text: &str) -> Self {
        Self {
            hits: counter_sum(text, POOL_HITS),
            misses: counter_sum(text, POOL_MISSES),
        }
    }

    /// What happened between `before` and `self`. A counter missing before
    /// (not yet created) counts from zero; one missing after is unknown.
    pub fn since(&self, before: &PoolCounts) -> PoolCounts {
        let d = |after: Option<f64>, before: Option<f64>| after.map(|a| a - before.unwrap_or(0.0));
        PoolCounts {
            hits: d(self.hits, before.hits),
            misses: d(self.misses, before.misses),
        }
    }

    /// Hits over hits + misses. A missing counter with the other present
    /// counts as zero (a gateway that never missed exports no miss sample).
    pub fn hit_rate(&self) -> Option<f64> {
        let (h, m) = match (self.hits, self.misses) {
            (None, None) => return None,
            (h, m) => (h.unwrap_or(0.0), m.unwrap_or(0.0)),
        };
        (h + m > 0.0).then(|| h / (h + m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = "\
# HELP patchbay_pool_hits Sessions served a warm socket.
# TYPE patchbay_pool_hits counter
patchbay_pool_hits_total{model=\"gpt-realtime\"} 90
patchbay_pool_hits_total{model=\"other\"} 10 1700000000
patchbay_pool_hits_total_created{model=\"gpt-realtime\"} 1700000000.5
# TYPE patchbay_pool_misses counter
patchbay_pool_misses_total{model=\"gpt-realtime\",reason=\"empty\"} 20
patchbay_pool_misses_total{model=\"gpt-realtime\",reason=\"disabled\"} 5
patchbay_pool_misses_totalx 1000
# EOF
";

    #[test]
    fn counters_are_summed_over_their_labels_only() {
        assert_eq!(counter_sum(EXPOSITION, POOL_HITS), Some(100.0));
        assert_eq!(counter_sum(EXPOSITION, POOL_MISSES), Some(25.0));
        assert_eq!(counter_sum("plain_total 3\n", "plain_total"), Some(3.0));
    }

    #[test]
    fn a_registered_counter_without_samples_is_not_exported() {
        let text = "# HELP patchbay_pool_hits x\n# TYPE patchbay_pool_hits counter\n# EOF\n";
        assert_eq!(counter_sum(text, POOL_HITS), None);
        assert_eq!(PoolCounts::from_exposition(text).hit_rate(), None);
    }

    #[test]
    fn hit_rate_is_over_the_run_only() {
        let before = PoolCounts {
            hits: Some(40.0),
            misses: None,
        };
        let after = PoolCounts::from_exposition(EXPOSITION);
        let run = after.since(&before);
        assert_eq!(run.hits, Some(60.0));
        assert_eq!(run.misses, Some(25.0));
        assert!((run.hit_rate().unwrap() - 60.0 / 85.0).abs() < 1e-12);
    }

    #[test]
    fn hit_rate_with_one_counter_missing_or_nothing_counted() {
        let only_misses = PoolCounts {
            hits: None,
            misses: Some(10.0),
        };
        assert_eq!(only_misses.hit_rate(), Some(0.0));
        let nothing = PoolCounts {
            hits: Some(0.0),
            misses: Some(0.0),
        };
        assert_eq!(nothing.hit_rate(), None);
    }

    #[tokio::test]
    async fn bad_urls_are_refused_before_connecting() {
        assert!(matches!(
            fetch("https://127.0.0.1:1/metrics").await,
            Err(ScrapeError::Url(_))
        ));
        assert!(matches!(
            fetch("http:///metrics").await,
            Err(ScrapeError::Url(_))
        ));
    }
}
