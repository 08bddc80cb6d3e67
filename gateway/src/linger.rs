//! How a writer thread that drains a queue in batches is woken, and how it
//! lingers: shared by the log lines' queue ([`crate::logging`]) and the
//! request-log rows' ([`crate::logs`]).
//!
//! A producer wakes the thread only for the first item after it went idle
//! (or when the queue reaches the batch size), never for the items that
//! follow while it is busy. Once woken, the thread lingers for more when
//! items come often (its last write was less than the period ago), up to
//! the period or the batch size, so that the items of that moment leave
//! with one write: a thread hand-off costs two context switches and a futex
//! call on each side, a measurable share of a short session's CPU
//! (`benchmarks/README.md`). When items are rare it writes at once, as the
//! linger's own timer would cost another wake-up for nothing.

use std::sync::{Condvar, MutexGuard};
use std::time::{Duration, Instant};

/// The wake-up state of one writer thread, kept under its queue's lock.
#[derive(Debug)]
pub struct Linger {
    period: Duration,
    batch_bytes: usize,
    /// The writer sleeps until the next item (not lingering).
    idle: bool,
    /// Write without lingering from now on (the process is ending).
    hurry: bool,
}

impl Linger {
    pub fn new(period: Duration, batch_bytes: usize) -> Self {
        Self {
            period,
            batch_bytes,
            idle: false,
            hurry: false,
        }
    }

    /// Whether a producer that grew the queue from `before` to `after`
    /// bytes must wake the writer.
    pub fn wakes(&self, before: usize, after: usize) -> bool {
        self.idle || (before < self.batch_bytes && after >= self.batch_bytes)
    }

    /// Ends lingering for good; the caller then wakes the writer.
    pub fn hurry(&mut self) {
        self.hurry = true;
    }

    pub fn is_idle(&self) -> bool {
        self.idle
    }
}

/// A queue's state as its writer thread sees it.
pub trait Batching {
    fn linger(&mut self) -> &mut Linger;
    /// There is something to write, or the queue was closed.
    fn ready(&self) -> bool;
    /// The queue was closed: write what is left without lingering.
    fn closed(&self) -> bool {
        false
    }
    fn queued_bytes(&self) -> usize;
}

/// The writer's wait for its next batch: until the queue is [ready], then
/// (when its last write was recent) the linger. Returns with the lock held.
///
/// [ready]: Batching::ready
pub fn wait_for_batch<'a, S: Batching>(
    wake: &Condvar,
    mut s: MutexGuard<'a, S>,
    last_write: Option<Instant>,
) -> MutexGuard<'a, S> {
    while !s.ready() {
        s.linger().idle = true;
        s = wake.wait(s).unwrap_or_else(|p| p.into_inner());
    }
    let linger = s.linger();
    linger.idle = false;
    let (period, batch_bytes) = (linger.period, linger.batch_bytes);
    if last_write.is_some_and(|t| t.elapsed() < period) {
        (s, _) = wake
            .wait_timeout_while(s, period, |s| {
                !s.closed() && !s.linger().hurry && s.queued_bytes() < batch_bytes
            })
            .unwrap_or_else(|p| p.into_inner());
    }
    s
}
