//! CPU and memory of another process (a target's gateway or relay) over
//! the run.
//!
//! A target served by a process of its own (`--cpu-pid NAME=PID`) has that
//! process's user + system time read from `/proc/PID/stat` just before the
//! first session starts and just after the last one ends; the difference,
//! over the sessions that target ran, is its CPU-seconds per 1000 sessions.
//! Targets run interleaved in one window, so those figures compare like with
//! like: the report prints each against every baseline that has one too
//! (e.g. the gateway against `tcp-relay`). Its resident memory is read from
//! `/proc/PID/status` at the same two moments: `VmRSS` before, and `VmHWM`
//! (the process's peak RSS so far) after, so the peak is exact as long as
//! the process started fresh for the run.
//!
//! Caveats: `/proc/PID/stat` counts in clock ticks (`CLK_TCK`, 10 ms on
//! Linux), so a window needs seconds of CPU for two-digit precision; the
//! process's background work during the window (pool refills, row writes)
//! is counted, which is the point. A process that exits mid-run, or a
//! system without `/proc`, gives an error for that target, never a figure.

use std::time::Duration;

/// Why a process's counters could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcError {
    #[error("cannot read /proc/{pid}/stat: {message}")]
    Read { pid: u32, message: String },
    #[error("/proc/{pid}/stat: unexpected format")]
    Format { pid: u32 },
    #[error("the clock tick rate is unknown")]
    ClockTicks,
}

/// CPU time a process has used so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcCpu {
    pub user: Duration,
    pub system: Duration,
}

impl ProcCpu {
    pub fn total(&self) -> Duration {
        self.user + self.system
    }

    /// What was used between `before` and `self` (zero if the counters
    /// went backwards, which only a different process could do).
    pub fn since(&self, before: &ProcCpu) -> ProcCpu {
        ProcCpu {
            user: self.user.saturating_sub(before.user),
            system: self.system.saturating_sub(before.system),
        }
    }
}

/// `(utime, stime)` in clock ticks from the text of `/proc/PID/stat`.
///
/// The second field (the command name, in parentheses) may itself contain
/// spaces and parentheses, so fields are counted from the last `)`: after
/// it come field 3 (state) onwards, and utime, stime are fields 14 and 15.
pub fn parse_stat_ticks(text: &str) -> Option<(u64, u64)> {
    /// utime's position among the fields after the command name (field 3
    /// is index 0).
    const UTIME_AFTER_COMM: usize = 14 - 3;
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(UTIME_AFTER_COMM);
    let user = fields.next()?.parse().ok()?;
    let system = fields.next()?.parse().ok()?;
    Some((user, system))
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
fn clock_ticks_per_sec() -> Result<u64, ProcError> {
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz)
        .ok()
        .filter(|&hz| hz > 0)
        .ok_or(ProcError::ClockTicks)
}

fn ticks(n: u64, hz: u64) -> Duration {
    Duration::from_secs(n / hz) + Duration::from_nanos((n % hz) * 1_000_000_000 / hz)
}

/// The CPU process `pid` has used so far.
pub fn read(pid: u32) -> Result<ProcCpu, ProcError> {
    let text =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| ProcError::Read {
            pid,
            message: e.to_string(),
        })?;
    let (user, system) = parse_stat_ticks(&text).ok_or(ProcError::Format { pid })?;
    let hz = clock_ticks_per_sec()?;
    Ok(ProcCpu {
        user: ticks(user, hz),
        system: ticks(system, hz),
    })
}

/// Resident memory of a process, in KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rss {
    /// `VmRSS`: resident now.
    pub current_kib: u64,
    /// `VmHWM`: the peak resident so far.
    pub peak_kib: u64,
}

/// `VmRSS` and `VmHWM` from the text of `/proc/PID/status`.
pub fn parse_status_rss(text: &str) -> Option<Rss> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse().ok())
    };
    Some(Rss {
        current_kib: field("VmRSS")?,
        peak_kib: field("VmHWM")?,
    })
}

/// The resident memory of process `pid`.
pub fn read_rss(pid: u32) -> Result<Rss, ProcError> {
    let text =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| ProcError::Read {
            pid,
            message: e.to_string(),
        })?;
    parse_status_rss(&text).ok_or(ProcError::Format { pid })
}

/// One process's use over the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu: ProcCpu,
    /// `VmRSS` before the first session.
    pub rss_before_kib: u64,
    /// `VmHWM` after the last: the peak (for a process started for the run).
    pub rss_peak_kib: u64,
}

/// What is read before the run.
#[derive(Debug, Clone, Copy)]
pub struct Before {
    cpu: ProcCpu,
    rss: Rss,
}

/// Reads process `pid`'s counters before the run.
pub fn before(pid: u32) -> Result<Before, ProcError> {
    Ok(Before {
        cpu: read(pid)?,
        rss: read_rss(pid)?,
    })
}

/// Reads process `pid`'s counters after the run: its use since `before`.
pub fn since(pid: u32, before: &Before) -> Result<Usage, ProcError> {
    Ok(Usage {
        cpu: read(pid)?.since(&before.cpu),
        rss_before_kib: before.rss.current_kib,
        rss_peak_kib: read_rss(pid)?.peak_kib,
    })
}

/// CPU-seconds per 1000 sessions; `None` without sessions.
pub fn per_1000(cpu: Duration, sessions: usize) -> Option<f64> {
    (sessions > 0).then(|| cpu.as_secs_f64() * 1000.0 / sessions as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utime_and_stime_are_fields_14_and_15() {
        let line = "4242 (patchbay-gatew) S 1 4242 4242 0 -1 4194560 9000 0 0 0 \
                    1234 567 0 0 20 0 3 0 100 200000000 5000 18446744073709551615";
        assert_eq!(parse_stat_ticks(line), Some((1234, 567)));
    }

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_fields() {
        let line = "7 (a) b (c) R 1 7 7 0 -1 0 0 0 0 0 11 22 0 0 20 0 1 0 5 1 1 1";
        assert_eq!(parse_stat_ticks(line), Some((11, 22)));
    }

    #[test]
    fn truncated_or_garbled_stat_is_refused() {
        assert_eq!(parse_stat_ticks("1 (x) S 1 2 3"), None);
        assert_eq!(parse_stat_ticks("no parenthesis 1 2 3"), None);
        assert_eq!(parse_stat_ticks("1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 2 0"), None);
    }

    #[test]
    fn ticks_convert_without_losing_the_fraction() {
        assert_eq!(ticks(250, 100), Duration::from_millis(2500));
        assert_eq!(ticks(1, 3), Duration::from_nanos(333_333_333));
    }

    #[test]
    fn own_process_reads_and_grows_with_work() {
        let pid = std::process::id();
        let before = read(pid).unwrap();
        // Spin until the kernel has charged at least one more tick.
        let mut x = 0u64;
        let mut after = before;
        while after.total() <= before.total() {
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            after = read(pid).unwrap();
        }
        assert!(after.since(&before).total() > Duration::ZERO);
        assert_eq!(before.since(&after), ProcCpu::default());
    }

    #[test]
    fn a_missing_process_is_an_error_not_zero() {
        // PIDs are below 2^22 on Linux.
        assert!(matches!(read(u32::MAX), Err(ProcError::Read { .. })));
    }

    #[test]
    fn rss_and_its_peak_come_from_status() {
        let text = "Name:\tpatchbay\nVmPeak:\t  900 kB\nVmHWM:\t   5120 kB\nVmRSS:\t    4096 kB\n";
        assert_eq!(
            parse_status_rss(text),
            Some(Rss {
                current_kib: 4096,
                peak_kib: 5120
            })
        );
        assert_eq!(parse_status_rss("VmRSS:\t4096 kB\n"), None, "no peak");
        assert_eq!(parse_status_rss("VmRSS:\tx kB\nVmHWM:\t1 kB\n"), None);
        let own = read_rss(std::process::id()).unwrap();
        assert!(
            own.current_kib > 0 && own.peak_kib >= own.current_kib,
            "{own:?}"
        );
    }

    #[test]
    fn usage_over_a_window_of_this_process() {
        let pid = std::process::id();
        let b = before(pid).unwrap();
        let u = since(pid, &b).unwrap();
        assert!(u.rss_before_kib > 0);
        assert!(u.rss_peak_kib >= u.rss_before_kib, "{u:?}");
        assert!(matches!(before(u32::MAX), Err(ProcError::Read { .. })));
    }

    #[test]
    fn per_1000_sessions() {
        assert_eq!(per_1000(Duration::from_secs(2), 4000), Some(0.5));
        assert_eq!(per_1000(Duration::from_secs(2), 0), None);
    }
}
