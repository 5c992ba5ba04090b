//! CPU time of this process, of its waited-for children and of another process.

use std::time::Duration;

/// What `getrusage` reports: user and system CPU time, and the peak resident set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time in user mode.
    pub user: Duration,
    /// CPU time in the kernel on the process's behalf.
    pub system: Duration,
    /// The peak resident set size, in KiB.
    pub max_rss_kib: i64,
}

impl Usage {
    /// User plus system time.
    pub fn total(&self) -> Duration {
        self.user + self.system
    }
}

/// CPU time this process has used so far (all threads), user plus system.
pub fn own() -> Duration {
    own_usage().total()
}

/// CPU time of the child processes this process has waited for (a peer client run as a
/// subprocess counts once it has exited and been reaped).
pub fn children() -> Duration {
    usage(libc::RUSAGE_CHILDREN).total()
}

/// This process's usage so far.
pub fn own_usage() -> Usage {
    usage(libc::RUSAGE_SELF)
}

/// The CPU time (user plus system) another running process has used so far, from
/// `/proc/PID/stat`; `None` when it cannot be read (the process is gone, or this is not Linux).
pub fn of_process(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces; the
    // first of them is field 3 (state), utime is field 14 and stime field 15.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    let total = ticks(14)? + ticks(15)?;
    Some(Duration::from_secs(total / hz) + Duration::from_nanos((total % hz) * 1_000_000_000 / hz))
}

/// The resident memory of another running process in KiB (`VmRSS` of `/proc/PID/status`);
/// `None` when it cannot be read.
pub fn rss_of_process(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn usage(who: libc::c_int) -> Usage {
    // SAFETY: `getrusage` only writes the struct it is given, which is zero-initialised plain
    // data; `who` is one of libc's RUSAGE_* constants.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        if libc::getrusage(who, &mut usage) != 0 {
            return Usage::default();
        }
        usage
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Usage {
        user: time(usage.ru_utime),
        system: time(usage.ru_stime),
        max_rss_kib: usage.ru_maxrss,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_grows_with_work_and_proc_agrees() {
        let before = own();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = own();
        assert!(after > before, "50 ms of spinning shows as CPU time");
        let from_proc = of_process(std::process::id()).expect("/proc/self/stat is readable");
        // /proc counts in clock ticks (10 ms): it may lag getrusage by a tick or two.
        assert!(
            from_proc + Duration::from_millis(30) >= before,
            "{from_proc:?} vs {before:?}"
        );
        assert!(own_usage().max_rss_kib > 0);
        assert_eq!(of_process(u32::MAX), None);
        let rss = rss_of_process(std::process::id()).expect("/proc/self/status is readable");
        assert!(rss > 0 && rss as i64 <= own_usage().max_rss_kib, "{rss}");
        assert_eq!(rss_of_process(u32::MAX), None);
    }
}
