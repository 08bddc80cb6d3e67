//! W3C trace context and sampling, as plain functions: the `traceparent`
//! header a client's upgrade or HTTP request carries ([`TraceParent`]),
//! new trace and span ids, and the `OTEL_TRACES_SAMPLER` decision
//! ([`Sampler`]).
//!
//! A session's spans continue the client's trace: they share its trace id
//! and name the client's span as their parent, so a voice agent's trace
//! shows the gateway's turns as children of its own span. A session whose
//! client sent no (valid) `traceparent` starts a trace of its own.
//!
//! The sampling decision is made once per session, at its start: every
//! turn of a session is in the same trace, so a trace is exported whole or
//! not at all. Events (the session's lifecycle) and metrics are not
//! sampled.

/// A parsed W3C `traceparent` (version `00`; a later version is read the
/// same way, as the recommendation asks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The `sampled` flag (bit 0 of trace-flags).
    pub sampled: bool,
}

/// The header's name.
pub const TRACEPARENT: &str = "traceparent";

impl TraceParent {
    /// Parses a `traceparent` value; `None` when it is malformed, or its
    /// trace or span id is all zeros (both invalid by the recommendation).
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        let mut parts = value.split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        if version.len() != 2 || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
            return None;
        }
        let version = u8::from_str_radix(version, 16).ok()?;
        // Version ff is invalid; version 00 has exactly four fields.
        if version == 0xff || (version == 0 && parts.next().is_some()) {
            return None;
        }
        if !is_lower_hex(trace) || !is_lower_hex(span) || !is_lower_hex(flags) {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        hex::decode_to_slice(trace, &mut trace_id).ok()?;
        hex::decode_to_slice(span, &mut span_id).ok()?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        let flags = u8::from_str_radix(flags, 16).ok()?;
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The header value (version `00`).
    pub fn header_value(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            u8::from(self.sampled)
        )
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A new random trace id (never all zeros).
pub fn new_trace_id() -> [u8; 16] {
    loop {
        let mut id = [0u8; 16];
        fill_random(&mut id);
        if id != [0; 16] {
            return id;
        }
    }
}

/// A new random span id (never all zeros).
pub fn new_span_id() -> [u8; 8] {
    loop {
        let mut id = [0u8; 8];
        fill_random(&mut id);
        if id != [0; 8] {
            return id;
        }
    }
}

fn fill_random(buf: &mut [u8]) {
    // The OS generator does not fail on the platforms the gateway runs
    // on; if it ever did, ids from the clock still correlate a session.
    if getrandom::fill(buf).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            .to_le_bytes();
        for (b, n) in buf.iter_mut().zip(nanos.iter().cycle()) {
            *b = *n;
        }
    }
}

/// `OTEL_TRACES_SAMPLER` (with `OTEL_TRACES_SAMPLER_ARG` for the ratios).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampler {
    AlwaysOn,
    AlwaysOff,
    /// Samples this fraction of traces, by trace id.
    TraceIdRatio(f64),
    /// The client's decision when it sent a `traceparent`, else the root
    /// sampler's.
    ParentBased(Root),
}

/// A parent-based sampler's decision for traces the gateway starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Root {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio(f64),
}

/// The specification's default: `parentbased_always_on`.
pub const DEFAULT_SAMPLER: Sampler = Sampler::ParentBased(Root::AlwaysOn);

impl Sampler {
    /// Parses a sampler name and its argument (a ratio in `0..=1`, default
    /// 1.0 as the specification says). An unknown name or a bad ratio is an
    /// error message.
    pub fn parse(name: &str, arg: Option<&str>) -> Result<Self, String> {
        let ratio = || -> Result<f64, String> {
            match arg.map(str::trim).filter(|a| !a.is_empty()) {
                None => Ok(1.0),
                Some(a) => match a.parse::<f64>() {
                    Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                    _ => Err(format!(
                        "sampler argument `{a}` is not a ratio between 0 and 1"
                    )),
                },
            }
        };
        Ok(match name.trim() {
            "always_on" => Self::AlwaysOn,
            "always_off" => Self::AlwaysOff,
            "traceidratio" => Self::TraceIdRatio(ratio()?),
            "parentbased_always_on" => Self::ParentBased(Root::AlwaysOn),
            "parentbased_always_off" => Self::ParentBased(Root::AlwaysOff),
            "parentbased_traceidratio" => Self::ParentBased(Root::TraceIdRatio(ratio()?)),
            other => {
                return Err(format!(
                    "unknown sampler `{other}` (always_on, always_off, traceidratio, \
                     parentbased_always_on, parentbased_always_off, parentbased_traceidratio)"
                ))
            }
        })
    }

    /// Whether a trace with `trace_id` (and the client's `parent`, if any)
    /// is recorded and exported.
    pub fn sample(&self, parent: Option<&TraceParent>, trace_id: &[u8; 16]) -> bool {
        match self {
            Self::AlwaysOn => true,
            Self::AlwaysOff => false,
            Self::TraceIdRatio(r) => ratio_sample(*r, trace_id),
            Self::ParentBased(root) => match parent {
                Some(p) => p.sampled,
                None => match root {
                    Root::AlwaysOn => true,
                    Root::AlwaysOff => false,
                    Root::TraceIdRatio(r) => ratio_sample(*r, trace_id),
                },
            },
        }
    }
}

/// The trace id's last 8 bytes (its random part in W3C trace context
/// level 2) against the ratio, so every process that sees the trace
/// decides alike.
fn ratio_sample(ratio: f64, trace_id: &[u8; 16]) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    let x = u64::from_be_bytes(low) >> 11;
    // 53 bits, the precision of the ratio.
    (x as f64) < ratio * (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_read_with_its_sampled_flag() {
        let p = TraceParent::parse(VALID).unwrap();
        assert_eq!(hex::encode(p.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex::encode(p.span_id), "00f067aa0ba902b7");
        assert!(p.sampled);
        assert_eq!(p.header_value(), VALID);
        let unsampled = TraceParent::parse(&VALID.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled);
    }

    #[test]
    fn malformed_or_all_zero_traceparents_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
        // A later version may carry more fields.
        assert!(TraceParent::parse(&format!("01{}-more", &VALID[2..])).is_some());
    }

    #[test]
    fn new_ids_are_never_zero_and_differ() {
        assert_ne!(new_trace_id(), [0; 16]);
        assert_ne!(new_span_id(), [0; 8]);
        assert_ne!(new_trace_id(), new_trace_id());
    }

    #[test]
    fn samplers_parse_by_their_standard_names() {
        assert_eq!(Sampler::parse("always_on", None), Ok(Sampler::AlwaysOn));
        assert_eq!(
            Sampler::parse("parentbased_traceidratio", Some("0.25")),
            Ok(Sampler::ParentBased(Root::TraceIdRatio(0.25)))
        );
        assert_eq!(
            Sampler::parse("traceidratio", None),
            Ok(Sampler::TraceIdRatio(1.0))
        );
        assert!(Sampler::parse("traceidratio", Some("2")).is_err());
        assert!(Sampler::parse("jaeger_remote", None).is_err());
    }

    #[test]
    fn a_parent_based_sampler_follows_the_clients_flag() {
        let sampled = TraceParent::parse(VALID).unwrap();
        let unsampled = TraceParent {
            sampled: false,
            ..sampled
        };
        let s = Sampler::ParentBased(Root::AlwaysOn);
        assert!(s.sample(Some(&sampled), &sampled.trace_id));
        assert!(!s.sample(Some(&unsampled), &sampled.trace_id));
        assert!(s.sample(None, &new_trace_id()));
        assert!(!Sampler::ParentBased(Root::AlwaysOff).sample(None, &new_trace_id()));
        assert!(!Sampler::AlwaysOff.sample(Some(&sampled), &sampled.trace_id));
    }

    #[test]
    fn a_ratio_sampler_keeps_about_its_ratio_of_traces() {
        let s = Sampler::TraceIdRatio(0.25);
        let kept = (0..4000)
            .filter(|_| s.sample(None, &new_trace_id()))
            .count();
        assert!((800..1200).contains(&kept), "{kept} of 4000");
        assert!(!Sampler::TraceIdRatio(0.0).sample(None, &[1; 16]));
    }
}
