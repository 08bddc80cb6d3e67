//! A circuit breaker per upstream, shared by the sessions that dial it and
//! by its pool's refills, so an upstream that refuses is not hammered.
//!
//! States:
//! - **closed**: every dial may go; [`BreakerConfig::failures_to_open`]
//!   consecutive failures open it (a success resets the count);
//! - **open**: no dial goes until `open_for` has passed since it opened;
//! - **half-open**: exactly one dial (the probe) goes; its success closes the
//!   breaker, its failure opens it again for twice as long, up to
//!   [`BreakerConfig::max_open`]. A probe that never reports (its session
//!   went away mid-dial) is given up after [`BreakerConfig::probe_timeout`],
//!   and the next dial becomes the probe, so an upstream can never be left
//!   half-open for good.
//!
//! A non-retryable failure (our key refused: 401/403) opens the breaker at
//! once ([`Breaker::trip`]): no number of retries will fix it.
//!
//! The clock is a parameter (`now`), so the state machine is tested without
//! sleeping; callers pass `Instant::now()`.

use std::time::{Duration, Instant};

use crate::config::{
    ServerConfig, DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_MAX_OPEN_SECS,
    DEFAULT_BREAKER_OPEN_SECS,
};

/// Consecutive failures that open a closed breaker.
pub const DEFAULT_FAILURES_TO_OPEN: u32 = DEFAULT_BREAKER_FAILURES;
/// How long a breaker first stays open.
pub const DEFAULT_OPEN: Duration = Duration::from_secs(DEFAULT_BREAKER_OPEN_SECS);
/// The longest a breaker stays open between probes.
pub const DEFAULT_MAX_OPEN: Duration = Duration::from_secs(DEFAULT_BREAKER_MAX_OPEN_SECS);

/// How long a probe may go unreported before another dial may probe (the
/// dial's own deadline, `upgrade_timeout_secs`, in the gateway).
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    pub failures_to_open: u32,
    pub open: Duration,
    pub max_open: Duration,
    pub probe_timeout: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failures_to_open: DEFAULT_FAILURES_TO_OPEN,
            open: DEFAULT_OPEN,
            max_open: DEFAULT_MAX_OPEN,
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
        }
    }
}

impl BreakerConfig {
    /// The `[server] breaker_*` settings.
    pub fn from_server(server: &ServerConfig) -> Self {
        Self {
            failures_to_open: server.breaker_failures,
            open: Duration::from_secs(server.breaker_open_secs),
            max_open: Duration::from_secs(server.breaker_max_open_secs),
            // A probe reports within its dial's deadline, or never.
            probe_timeout: Duration::from_secs(server.upgrade_timeout_secs),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
        open_for: Duration,
    },
    /// The probe is out (until `probe_until`); `open_for` is how long the
    /// breaker stayed open last time.
    HalfOpen {
        open_for: Duration,
        probe_until: Instant,
    },
}

#[derive(Debug, Clone)]
pub struct Breaker {
    config: BreakerConfig,
    state: State,
}

impl Breaker {
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            state: State::Closed { failures: 0 },
        }
    }

    /// Whether a dial may go now. An open breaker whose time is up lets this
    /// caller through as the probe (and nobody else until it reports).
    pub fn allow(&mut self, now: Instant) -> bool {
        match self.state {
            State::Closed { .. } => true,
            State::Open { until, open_for } if now >= until => {
                self.probe(now, open_for);
                true
            }
            // The last probe never reported: this dial probes instead.
            State::HalfOpen {
                open_for,
                probe_until,
            } if now >= probe_until => {
                self.probe(now, open_for);
                true
            }
            State::Open { .. } | State::HalfOpen { .. } => false,
        }
    }

    fn probe(&mut self, now: Instant, open_for: Duration) {
        self.state = State::HalfOpen {
            open_for,
            probe_until: now + self.config.probe_timeout,
        };
    }

    /// Whether a dial would be allowed now, without taking the probe.
    pub fn would_allow(&self, now: Instant) -> bool {
        match self.state {
            State::Closed { .. } => true,
            State::Open { until, .. } => now >= until,
            State::HalfOpen { probe_until, .. } => now >= probe_until,
        }
    }

    /// A probe is out.
    pub fn probing(&self) -> bool {
        matches!(self.state, State::HalfOpen { .. })
    }

    /// Open (or half-open with its probe out): not serving.
    pub fn is_open(&self) -> bool {
        !matches!(self.state, State::Closed { .. })
    }

    pub fn success(&mut self) {
        self.state = State::Closed { failures: 0 };
    }

    /// A retryable failure. Returns true when this failure opened the
    /// breaker.
    pub fn failure(&mut self, now: Instant) -> bool {
        match self.state {
            State::Closed { failures } => {
                let failures = failures + 1;
                if failures >= self.config.failures_to_open {
                    self.open(now, self.config.open);
                    true
                } else {
                    self.state = State::Closed { failures };
                    false
                }
            }
            State::HalfOpen { open_for, .. } => {
                let next = (open_for * 2).min(self.config.max_open);
                self.open(now, next);
                true
            }
            // A dial that started before the breaker opened.
            State::Open { .. } => false,
        }
    }

    /// A failure no retry will fix (our key refused): open at once, for the
    /// longest time. Returns true when this opened the breaker.
    pub fn trip(&mut self, now: Instant) -> bool {
        let was_open = self.is_open();
        self.open(now, self.config.max_open);
        !was_open
    }

    fn open(&mut self, now: Instant, open_for: Duration) {
        self.state = State::Open {
            until: now + open_for,
            open_for,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn breaker() -> Breaker {
        Breaker::new(BreakerConfig::default())
    }

    #[test]
    fn five_consecutive_failures_open_it_and_a_success_resets_the_count() {
        let t0 = Instant::now();
        let mut b = breaker();
        for _ in 0..4 {
            assert!(!b.failure(t0));
        }
        b.success();
        for _ in 0..4 {
            assert!(!b.failure(t0));
            assert!(b.allow(t0));
        }
        assert!(b.failure(t0), "the fifth in a row opens it");
        assert!(b.is_open());
        assert!(!b.allow(t0));
        assert!(!b.allow(t0 + 4 * S));
    }

    #[test]
    fn after_the_open_time_exactly_one_probe_goes_and_its_success_closes_it() {
        let t0 = Instant::now();
        let mut b = breaker();
        for _ in 0..5 {
            b.failure(t0);
        }
        let t = t0 + 5 * S;
        assert!(b.would_allow(t));
        assert!(b.allow(t), "the probe");
        assert!(!b.allow(t), "one probe at a time");
        assert!(!b.would_allow(t));
        b.success();
        assert!(!b.is_open());
        assert!(b.allow(t));
    }

    #[test]
    fn failed_probes_double_the_open_time_up_to_the_maximum() {
        let t0 = Instant::now();
        let mut b = breaker();
        for _ in 0..5 {
            b.failure(t0);
        }
        let mut t = t0;
        for expected in [5, 10, 20, 40, 60, 60] {
            let open_for = Duration::from_secs(expected);
            // Closed until exactly the open time has passed.
            assert!(!b.allow(t + open_for - Duration::from_millis(1)));
            t += open_for;
            assert!(b.allow(t), "probe after {expected}s");
            assert!(b.failure(t), "a failed probe opens it again");
        }
    }

    #[test]
    fn a_probe_that_never_reports_is_replaced_after_the_probe_timeout() {
        let t0 = Instant::now();
        let mut b = breaker();
        for _ in 0..5 {
            b.failure(t0);
        }
        let t = t0 + 5 * S;
        assert!(
            b.allow(t),
            "the probe; its session then goes away unreported"
        );
        assert!(!b.would_allow(t + 9 * S));
        assert!(!b.allow(t + 9 * S));
        assert!(b.would_allow(t + 10 * S));
        assert!(b.allow(t + 10 * S), "the next dial probes instead");
        assert!(!b.allow(t + 10 * S), "still one probe at a time");
        b.success();
        assert!(!b.is_open());
    }

    #[test]
    fn a_refused_key_opens_it_at_once_for_the_longest_time() {
        let t0 = Instant::now();
        let mut b = breaker();
        assert!(b.trip(t0));
        assert!(!b.allow(t0 + 59 * S));
        assert!(b.allow(t0 + 60 * S));
        assert!(!b.trip(t0 + 60 * S), "already open");
    }

    #[test]
    fn a_failure_reported_while_open_changes_nothing() {
        let t0 = Instant::now();
        let mut b = breaker();
        for _ in 0..5 {
            b.failure(t0);
        }
        assert!(!b.failure(t0 + 2 * S));
        assert!(b.allow(t0 + 5 * S), "the open time was not extended");
    }
}
