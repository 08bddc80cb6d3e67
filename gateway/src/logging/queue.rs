//! The bounded, lossy queue between the threads that format log lines and
//! the one thread that writes them, woken once per batch rather than once
//! per line.
//!
//! A line is appended to one buffer under a short lock (never I/O); the
//! writer thread takes everything queued and writes it with one
//! `write_all`. It is woken and lingers as [`crate::linger`] says: up to
//! [`LINGER`] or [`LINGER_BYTES`]. Past `limit` queued lines a new line is
//! dropped and counted.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::linger::{self, Batching, Linger};

/// How long the writer waits, once woken, for more lines before it writes
/// (only when its last write was less than this ago).
pub const LINGER: Duration = Duration::from_millis(50);
/// Queued bytes at which the writer stops lingering.
pub const LINGER_BYTES: usize = 64 * 1024;

#[derive(Debug)]
struct State {
    buf: Vec<u8>,
    lines: usize,
    linger: Linger,
}

impl Batching for State {
    fn linger(&mut self) -> &mut Linger {
        &mut self.linger
    }

    fn ready(&self) -> bool {
        self.lines > 0
    }

    fn queued_bytes(&self) -> usize {
        self.buf.len()
    }
}

/// See the module doc. Counts lines offered, dropped and written, so a
/// caller can tell when everything offered is out.
#[derive(Debug)]
pub struct LineQueue {
    state: Mutex<State>,
    wake: Condvar,
    limit: usize,
    offered: AtomicU64,
    dropped: AtomicU64,
    written: AtomicU64,
}

impl LineQueue {
    /// A queue of at most `limit` lines (at least 1).
    pub fn new(limit: usize) -> Arc<Self> {
        Self::with_linger(limit, LINGER)
    }

    fn with_linger(limit: usize, linger: Duration) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                buf: Vec::new(),
                lines: 0,
                linger: Linger::new(linger, LINGER_BYTES),
            }),
            wake: Condvar::new(),
            limit: limit.max(1),
            offered: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            written: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues one whole line (or drops it when `limit` lines wait).
    pub fn offer(&self, line: &[u8]) {
        self.offered.fetch_add(1, Ordering::Relaxed);
        let wake = {
            let mut s = self.lock();
            if s.lines >= self.limit {
                drop(s);
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let before = s.buf.len();
            s.buf.extend_from_slice(line);
            s.lines += 1;
            s.linger.wakes(before, s.buf.len())
        };
        if wake {
            self.wake.notify_one();
        }
    }

    /// Stops lingering: whatever is queued, and every later line, is
    /// written as soon as the writer gets to it.
    pub fn hurry(&self) {
        self.lock().linger.hurry();
        self.wake.notify_all();
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Lines offered and neither dropped nor written yet.
    pub fn pending(&self) -> u64 {
        // Offered is read last, so every line counted written or dropped
        // is counted in it: the result never falls below the truth.
        let written = self.written.load(Ordering::Acquire);
        let dropped = self.dropped.load(Ordering::Acquire);
        let offered = self.offered.load(Ordering::Acquire);
        pending(offered, dropped, written)
    }

    /// The writer: forever takes what is queued and writes it to `out`. A
    /// failed write counts its lines as written (there is nowhere to report
    /// them).
    pub fn run(&self, out: &mut dyn Write) {
        let mut last_write: Option<Instant> = None;
        loop {
            let (batch, lines) = {
                let mut s = linger::wait_for_batch(&self.wake, self.lock(), last_write);
                let lines = std::mem::take(&mut s.lines);
                (std::mem::take(&mut s.buf), lines)
            };
            let _ = out.write_all(&batch).and_then(|()| out.flush());
            last_write = Some(Instant::now());
            self.written.fetch_add(lines as u64, Ordering::Release);
        }
    }
}

/// Lines still queued: offered, neither dropped nor written yet.
fn pending(offered: u64, dropped: u64, written: u64) -> u64 {
    offered.saturating_sub(dropped.saturating_add(written))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink the test can read while the writer thread owns it.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn lines_are_written_whole_in_order_and_counted() {
        let q = LineQueue::new(100);
        let out = Shared::default();
        let (tq, mut tout) = (q.clone(), out.clone());
        std::thread::spawn(move || tq.run(&mut tout));
        for i in 0..50 {
            q.offer(format!("line {i}\n").as_bytes());
        }
        wait_until("every line written", || q.pending() == 0);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let expected: String = (0..50).map(|i| format!("line {i}\n")).collect();
        assert_eq!(text, expected);
        assert_eq!(q.dropped(), 0);
    }

    #[test]
    fn past_the_limit_new_lines_are_dropped_and_counted() {
        // No writer: nothing leaves the queue.
        let q = LineQueue::new(3);
        for i in 0..5 {
            q.offer(format!("{i}\n").as_bytes());
        }
        assert_eq!(q.dropped(), 2);
        assert_eq!(q.pending(), 3);
        assert_eq!(q.lock().buf, b"0\n1\n2\n");
    }

    /// Long enough that only `hurry` or a full batch ends it in a test.
    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn a_lingering_writer_takes_later_lines_in_the_same_write() {
        let q = LineQueue::with_linger(100, LONG);
        let writes = Arc::new(Mutex::new(Vec::<usize>::new()));
        struct Counting(Arc<Mutex<Vec<usize>>>);
        impl Write for Counting {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().push(buf.len());
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (tq, w) = (q.clone(), writes.clone());
        std::thread::spawn(move || tq.run(&mut Counting(w)));
        // A first line is written at once; the next, so soon after, lingers.
        q.offer(b"0\n");
        wait_until("the first line written", || q.pending() == 0);
        wait_until("the writer idle", || q.lock().linger.is_idle());
        q.offer(b"a\n");
        wait_until("the writer lingering", || !q.lock().linger.is_idle());
        q.offer(b"b\n");
        assert_eq!(q.pending(), 2, "nothing written while lingering");
        q.hurry();
        wait_until("both written", || q.pending() == 0);
        assert_eq!(
            *writes.lock().unwrap(),
            vec![2, 4],
            "one write for both lines"
        );
    }

    #[test]
    fn a_full_batch_ends_the_linger() {
        let q = LineQueue::with_linger(1_000_000, LONG);
        let out = Shared::default();
        let (tq, mut tout) = (q.clone(), out.clone());
        std::thread::spawn(move || tq.run(&mut tout));
        q.offer(b"0\n");
        wait_until("the first line written", || q.pending() == 0);
        wait_until("the writer idle", || q.lock().linger.is_idle());
        let line = [vec![b'x'; 1023], vec![b'\n']].concat();
        for _ in 0..(LINGER_BYTES / 1024) {
            q.offer(&line);
        }
        // Well within LONG, without `hurry`.
        wait_until("the batch written", || q.pending() == 0);
        assert_eq!(out.0.lock().unwrap().len(), 2 + LINGER_BYTES);
    }

    #[test]
    fn pending_lines_are_those_neither_dropped_nor_written() {
        assert_eq!(pending(0, 0, 0), 0);
        assert_eq!(pending(10, 0, 0), 10);
        assert_eq!(pending(10, 3, 5), 2);
        assert_eq!(pending(10, 3, 7), 0);
        // Counters read one after the other may overtake each other.
        assert_eq!(pending(10, 4, 7), 0);
        assert_eq!(pending(u64::MAX, u64::MAX, u64::MAX), 0);
    }
}
