//! File descriptors, the first thing a busy gateway runs out of: every
//! live session holds two sockets (its client's and its upstream's), every
//! warm pool socket one, and the process a few more of its own (listeners,
//! Redis, the runtime, log pipes, files it watches).
//!
//! At start the soft `RLIMIT_NOFILE` is raised to the hard limit
//! ([`raise_nofile_limit`]: the soft one is often 1024 while the hard one
//! allows far more), and [`sessions_that_fit`] says how many sessions the
//! limit leaves room for, so start-up can warn when `[limits]
//! max_sessions` cannot be reached. When descriptors run out anyway,
//! `accept()` and the upstream dial fail with `EMFILE` (or `ENFILE`, the
//! system's table): [`is_out_of_descriptors`] tells those apart from the
//! network's failures, so the gateway reports itself busy and not ready
//! rather than blaming the upstream.

use std::io;

/// Sockets one live session holds: its client's and its upstream's.
pub const SOCKETS_PER_SESSION: u64 = 2;
/// Descriptors kept for the process's own use beside sessions and the
/// pool: listeners, Redis connections, the runtime's, log pipes, watched
/// files, calls API requests in flight.
pub const DESCRIPTOR_MARGIN: u64 = 64;

/// The process's `RLIMIT_NOFILE` as start-up left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    /// The soft limit the process was started with.
    pub soft_before: u64,
    /// The soft limit now.
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (an unlimited hard
/// limit: to the kernel's `fs.nr_open`); the limits before and after.
pub fn raise_nofile_limit() -> io::Result<NofileLimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, which outlives the
    // call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // `rlim_t` is `u64` on the 64-bit Linux targets the gateway runs on.
    let soft_before: u64 = limit.rlim_cur;
    let hard: u64 = limit.rlim_max;
    let target = if limit.rlim_max == libc::RLIM_INFINITY {
        nr_open().unwrap_or(soft_before)
    } else {
        hard
    };
    if target <= soft_before {
        return Ok(NofileLimit {
            soft_before,
            soft: soft_before,
            hard,
        });
    }
    limit.rlim_cur = target;
    // SAFETY: setrlimit reads the struct it is given, which outlives the
    // call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(NofileLimit {
        soft_before,
        soft: target,
        hard,
    })
}

/// The kernel's ceiling on a process's descriptors (Linux).
fn nr_open() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// How many sessions fit in `limit` descriptors beside `pool_sockets` warm
/// sockets and [`DESCRIPTOR_MARGIN`].
pub fn sessions_that_fit(limit: u64, pool_sockets: u64) -> u64 {
    limit.saturating_sub(pool_sockets.saturating_add(DESCRIPTOR_MARGIN)) / SOCKETS_PER_SESSION
}

/// Whether `e` says the process (`EMFILE`) or the system (`ENFILE`) has no
/// descriptor left.
pub fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_descriptors_per_session_after_the_pool_and_the_margin() {
        assert_eq!(sessions_that_fit(1024, 0), (1024 - 64) / 2);
        assert_eq!(sessions_that_fit(1024, 16), (1024 - 80) / 2);
        assert_eq!(sessions_that_fit(65_536, 512), (65_536 - 576) / 2);
        assert_eq!(sessions_that_fit(64, 0), 0);
        assert_eq!(sessions_that_fit(10, 100), 0);
    }

    #[test]
    fn only_emfile_and_enfile_are_out_of_descriptors() {
        for (errno, want) in [
            (libc::EMFILE, true),
            (libc::ENFILE, true),
            (libc::ECONNREFUSED, false),
            (libc::ENOBUFS, false),
        ] {
            assert_eq!(
                is_out_of_descriptors(&io::Error::from_raw_os_error(errno)),
                want,
                "{errno}"
            );
        }
        let plain = io::Error::other("no errno");
        assert!(!is_out_of_descriptors(&plain));
    }

    #[test]
    fn raising_the_limit_leaves_soft_at_hard() {
        let limit = raise_nofile_limit().expect("getrlimit works");
        assert!(limit.soft >= limit.soft_before);
        assert!(limit.soft <= limit.hard);
        // A second raise finds nothing left to do.
        let again = raise_nofile_limit().unwrap();
        assert_eq!(again.soft_before, again.soft);
    }
}
