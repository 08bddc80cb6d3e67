//! Metering a WebRTC translation call (`POST /v1/realtime/translations/calls`)
//! by the time it is connected.
//!
//! A translation session reports no usage (openai-python
//! `types/realtime/realtime_translation_server_event.py`) and OpenAI prices
//! `gpt-realtime-translate` by "realtime audio duration", per minute. On a
//! WebSocket session the gateway measures that audio from the appends
//! ([`super::translation`]); on a WebRTC call the audio travels on the
//! call's media tracks, between the device and the upstream, and never
//! crosses the gateway or the sideband (the sideband carries the session's
//! events: `session.created`, transcript deltas, `session.closed`). What the
//! gateway does see is when the call was answered and when it ended, and a
//! WebRTC audio track streams for as long as the call is up (silence
//! included: the translation guide asks clients to keep sending audio
//! between phrases, and a browser's microphone track does so by itself). So
//! a call's audio duration is its connected time, and that is what is
//! billed: [`call_billed_seconds`], the part of a metering window during
//! which the call was connected, from the upstream's answer to the call's
//! end (hangup, the upstream closing the sideband, or the gateway letting
//! it go on drain).
//!
//! This bills at least what a media-time count would: a caller that mutes
//! its track still pays for the connected minutes (the gateway cannot tell),
//! never less. Time while no replica watches a call (between a draining
//! replica letting it go and another adopting it) is not billed.
//!
//! [`CallClock`] is shared by the call's sideband (which ends it) and its
//! meter (which reads it every window); one relaxed atomic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The seconds of the window `[from, to)` during which a call answered at
/// `answered` and ended at `ended` (`None`: still connected) was connected.
pub fn call_billed_seconds(
    answered: SystemTime,
    ended: Option<SystemTime>,
    from: SystemTime,
    to: SystemTime,
) -> f64 {
    let start = answered.max(from);
    let end = ended.map_or(to, |e| e.min(to));
    end.duration_since(start)
        .map_or(0.0, |d: Duration| d.as_secs_f64())
}

/// When a call was answered and, once it is over, when it ended.
#[derive(Debug)]
pub struct CallClock {
    answered: SystemTime,
    /// Milliseconds since the epoch; 0 while the call is connected.
    ended_ms: AtomicU64,
}

impl CallClock {
    pub fn new(answered: SystemTime) -> Self {
        Self {
            answered,
            ended_ms: AtomicU64::new(0),
        }
    }

    pub fn answered(&self) -> SystemTime {
        self.answered
    }

    /// The call ended at `at` (the first end counts).
    pub fn end(&self, at: SystemTime) {
        let ms = at
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| (d.as_millis() as u64).max(1));
        let _ = self
            .ended_ms
            .compare_exchange(0, ms, Ordering::Relaxed, Ordering::Relaxed);
    }

    pub fn ended(&self) -> Option<SystemTime> {
        match self.ended_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(UNIX_EPOCH + Duration::from_millis(ms)),
        }
    }

    /// The billed seconds of the window `[from, to)`.
    pub fn billed(&self, from: SystemTime, to: SystemTime) -> f64 {
        call_billed_seconds(self.answered, self.ended(), from, to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    #[test]
    fn a_window_is_billed_the_part_of_it_the_call_was_connected() {
        // Answered at 10, still up: a window before it, across it, after it.
        assert_eq!(call_billed_seconds(at(10), None, at(0), at(5)), 0.0);
        assert_eq!(call_billed_seconds(at(10), None, at(5), at(20)), 10.0);
        assert_eq!(call_billed_seconds(at(10), None, at(20), at(35)), 15.0);
        // Ended at 42: the window it ends in stops there, later ones are 0.
        assert_eq!(
            call_billed_seconds(at(10), Some(at(42)), at(35), at(50)),
            7.0
        );
        assert_eq!(
            call_billed_seconds(at(10), Some(at(42)), at(50), at(65)),
            0.0
        );
        // Answered and ended within one window.
        assert_eq!(call_billed_seconds(at(3), Some(at(4)), at(0), at(15)), 1.0);
    }

    #[test]
    fn consecutive_windows_add_up_to_the_connected_time() {
        let (answered, ended) = (at(7), at(100));
        let edges: Vec<SystemTime> = (0..=8).map(|i| at(i * 15)).collect();
        let total: f64 = edges
            .windows(2)
            .map(|w| call_billed_seconds(answered, Some(ended), w[0], w[1]))
            .sum();
        assert_eq!(total, 93.0);
    }

    #[test]
    fn the_clock_keeps_the_first_end() {
        let clock = CallClock::new(at(0));
        assert_eq!(clock.ended(), None);
        assert_eq!(clock.billed(at(0), at(30)), 30.0);
        clock.end(at(12));
        clock.end(at(20));
        assert_eq!(clock.ended(), Some(at(12)));
        assert_eq!(clock.billed(at(0), at(30)), 12.0);
    }
}
