//! Frame timestamps for the calls benchmark ([`SimConfig::stamp_frames`]):
//! how a load generator on the same machine measures the time each frame
//! spends between the two ends, through whatever sits in between.
//!
//! Both ends read `CLOCK_REALTIME` in nanoseconds ([`now_ns`]); on one
//! machine it is one clock, so a difference of two readings taken in two
//! processes is a transit time. A stamp travels in the event's `event_id`,
//! which openai-python types as a free-form string on every client and
//! server event (`types/realtime/input_audio_buffer_append_event.py`,
//! `types/realtime/response_audio_delta_event.py`), so a stamped event keeps
//! its exact shape and a relay passes it as it passes any other id. The
//! stamp is the id's last `_`-separated part: `t` and the nanoseconds
//! (`event_5f3a9c1e_17_t1733325600123456789`).
//!
//! - Upstream → client: each audio delta's `event_id` carries the time the
//!   simulator wrote it.
//! - Client → upstream: the client stamps its `input_audio_buffer.append`
//!   events; the simulator reads the time it received each one, and at the
//!   next `input_audio_buffer.commit` reports the transit times of the
//!   appends it committed in one extra field of `input_audio_buffer.committed`
//!   ([`APPEND_TRANSITS_FIELD`], nanoseconds, in arrival order). That is
//!   one frame per user turn, on an event the real API sends at that moment
//!   anyway, rather than an echo per append (which would double the
//!   downstream frames the real API never sends) or a side channel that
//!   would have to tell the targets' frames apart.
//!
//! [`SimConfig::stamp_frames`]: crate::SimConfig::stamp_frames

use std::time::{SystemTime, UNIX_EPOCH};

/// The field of `input_audio_buffer.committed` with the committed appends'
/// transit times (ns), when stamping.
pub const APPEND_TRANSITS_FIELD: &str = "patchbay_sim_append_transit_ns";
/// How far into a frame the `event_id` is looked for: the simulator and the
/// bench write `type` and `event_id` first.
const EVENT_ID_WITHIN: usize = 160;
/// At most this many transit times are kept per commit (a client that never
/// commits does not grow the simulator's memory without bound).
pub const MAX_TRANSITS_PER_COMMIT: usize = 10_000;

/// `CLOCK_REALTIME` now, in nanoseconds since the epoch.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// `base` with the stamp `ns` appended, as an `event_id`.
pub fn stamped_id(base: &str, ns: u64) -> String {
    format!("{base}_t{ns}")
}

/// The stamp of a frame's `event_id` (among its first bytes), if it has one.
pub fn stamp_of(text: &str) -> Option<u64> {
    const KEY: &str = r#""event_id":""#;
    let head = &text.as_bytes()[..text.len().min(EVENT_ID_WITHIN)];
    let at = head.windows(KEY.len()).position(|w| w == KEY.as_bytes())?;
    let rest = &text[at + KEY.len()..];
    let id = &rest[..rest.find('"')?];
    let digits = id.rsplit('_').next()?.strip_prefix('t')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The transit times (ns) listed in an `input_audio_buffer.committed`
/// event's [`APPEND_TRANSITS_FIELD`]; empty when it has none.
pub fn transits_of(committed: &str) -> Vec<u64> {
    let key = format!("\"{APPEND_TRANSITS_FIELD}\":[");
    let Some(at) = committed.find(&key) else {
        return Vec::new();
    };
    let rest = &committed[at + key.len()..];
    let list = &rest[..rest.find(']').unwrap_or(0)];
    list.split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamped_id_reads_back_its_stamp() {
        let id = stamped_id("event_5f3a9c1e_17", 1_733_325_600_123_456_789);
        let frame =
            format!(r#"{{"type":"response.output_audio.delta","event_id":"{id}","delta":"AAAA"}}"#);
        assert_eq!(stamp_of(&frame), Some(1_733_325_600_123_456_789));
    }

    #[test]
    fn ids_without_a_stamp_or_far_into_the_frame_have_none() {
        assert_eq!(stamp_of(r#"{"type":"x","event_id":"event_ab_3"}"#), None);
        assert_eq!(stamp_of(r#"{"type":"x","event_id":"event_t"}"#), None);
        assert_eq!(stamp_of(r#"{"type":"x","event_id":"e_t12x"}"#), None);
        assert_eq!(stamp_of(r#"{"type":"x"}"#), None);
        let far = format!(r#"{{"pad":"{}","event_id":"e_t5"}}"#, "x".repeat(200));
        assert_eq!(stamp_of(&far), None);
    }

    #[test]
    fn transits_are_read_from_the_committed_event() {
        let e = format!(
            r#"{{"type":"input_audio_buffer.committed","item_id":"i","{APPEND_TRANSITS_FIELD}":[120,3400,56]}}"#
        );
        assert_eq!(transits_of(&e), vec![120, 3400, 56]);
        let empty = format!(r#"{{"{APPEND_TRANSITS_FIELD}":[]}}"#);
        assert!(transits_of(&empty).is_empty());
        assert!(transits_of(r#"{"type":"input_audio_buffer.committed"}"#).is_empty());
    }

    #[test]
    fn the_clock_is_the_epochs() {
        // 2020-01-01 in ns: any working clock is past it.
        assert!(now_ns() > 1_577_836_800_000_000_000);
    }
}
