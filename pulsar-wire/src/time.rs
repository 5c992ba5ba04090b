//! Wall-clock times on the wire: the protocol carries them as milliseconds since the Unix
//! epoch (`publish_time`, `event_time`, `deliver_at_time`), the API as [`SystemTime`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The time `millis` milliseconds after the epoch, as received from the network.
///
/// Never panics: a value past the latest time this platform's [`SystemTime`] holds (none on
/// Linux and macOS, whose `SystemTime` holds every `u64` of milliseconds) is clamped to that
/// latest time.
pub(crate) fn from_millis(millis: u64) -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_millis(millis))
        .unwrap_or_else(latest)
}

/// `time` in milliseconds since the epoch (sub-millisecond parts dropped), or why the wire's
/// unsigned 64-bit milliseconds cannot hold it (`what` names the field in the reason).
pub(crate) fn to_millis(time: SystemTime, what: &str) -> Result<u64, String> {
    let since = time
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{time:?} is before 1970, which {what} cannot hold"))?;
    u64::try_from(since.as_millis()).map_err(|_| {
        format!("{time:?} is past what {what} (64-bit milliseconds since 1970) can hold")
    })
}

/// The latest time after the epoch that [`SystemTime`] holds on this platform, found by
/// bisection (only on the rare path of a time from the network that it cannot hold).
fn latest() -> SystemTime {
    // The largest whole seconds, then the largest nanoseconds on top of them.
    let (mut low, mut high) = (0u64, u64::MAX);
    while low < high {
        let mid = low + (high - low).div_ceil(2);
        if UNIX_EPOCH.checked_add(Duration::from_secs(mid)).is_some() {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    let seconds = UNIX_EPOCH + Duration::from_secs(low);
    let (mut low_ns, mut high_ns) = (0u32, 999_999_999u32);
    while low_ns < high_ns {
        let mid = low_ns + (high_ns - low_ns).div_ceil(2);
        if seconds
            .checked_add(Duration::from_nanos(u64::from(mid)))
            .is_some()
        {
            low_ns = mid;
        } else {
            high_ns = mid - 1;
        }
    }
    seconds + Duration::from_nanos(u64::from(low_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_the_epoch() {
        assert_eq!(from_millis(0), UNIX_EPOCH);
        assert_eq!(to_millis(UNIX_EPOCH, "t"), Ok(0));
    }

    #[test]
    fn milliseconds_round_trip_exactly() {
        for millis in [1, 999, 1_000, 1_733_500_000_123, i64::MAX as u64] {
            assert_eq!(to_millis(from_millis(millis), "t"), Ok(millis), "{millis}");
        }
        // Sub-millisecond parts are dropped, not rounded.
        let time = UNIX_EPOCH + Duration::from_micros(1_999);
        assert_eq!(to_millis(time, "t"), Ok(1));
    }

    #[test]
    fn the_largest_value_from_the_wire_does_not_panic() {
        let time = from_millis(u64::MAX);
        assert!(time > from_millis(u64::MAX - 1) || time == latest());
        // Where the platform holds it, it is exact; elsewhere, the latest time it holds.
        match UNIX_EPOCH.checked_add(Duration::from_millis(u64::MAX)) {
            Some(exact) => {
                assert_eq!(time, exact);
                assert_eq!(to_millis(time, "t"), Ok(u64::MAX));
            }
            None => assert_eq!(time, latest()),
        }
    }

    #[test]
    fn the_clamp_is_the_latest_time_held() {
        let latest = latest();
        assert!(latest > UNIX_EPOCH);
        assert!(latest.checked_add(Duration::from_nanos(1)).is_none());
        // A time beyond 64-bit milliseconds (Linux's SystemTime holds one) is refused, named.
        let millis = latest.duration_since(UNIX_EPOCH).map(|d| d.as_millis());
        let beyond = millis.is_ok_and(|millis| millis > u128::from(u64::MAX));
        match to_millis(latest, "event_time") {
            Ok(_) => assert!(!beyond),
            Err(error) => assert!(beyond && error.contains("event_time"), "{error}"),
        }
    }

    #[test]
    fn times_before_the_epoch_are_refused() {
        let error = to_millis(UNIX_EPOCH - Duration::from_millis(1), "event_time").unwrap_err();
        assert!(
            error.contains("before 1970") && error.contains("event_time"),
            "{error}"
        );
    }
}
