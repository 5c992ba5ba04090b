//! CPU time (user + system) of this process and of its waited-for children, from `getrusage`.

use std::time::Duration;

/// CPU time this process has used so far (all threads).
pub fn own() -> Duration {
    of(libc::RUSAGE_SELF)
}

/// CPU time of the child processes this process has waited for (a peer client run as a
/// subprocess counts once it has exited and been reaped).
pub fn children() -> Duration {
    of(libc::RUSAGE_CHILDREN)
}

fn of(who: libc::c_int) -> Duration {
    // SAFETY: `getrusage` only writes the struct it is given, which is zero-initialised plain
    // data; `who` is one of the two constants above.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        if libc::getrusage(who, &mut usage) != 0 {
            return Duration::ZERO;
        }
        usage
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_grows_with_work() {
        let before = own();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(own() > before, "30 ms of spinning shows as CPU time");
    }
}
