//! Name checks the proxy applies to topics and consumer groups (`ILLEGAL_TOPIC`,
//! `ILLEGAL_CONSUMER_GROUP`).

const MAX_TOPIC_LEN: usize = 127;
const MAX_GROUP_LEN: usize = 255;
const SYSTEM_PREFIXES: [&str; 2] = ["rmq_sys_", "%RETRY%"];

fn legal_chars(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'%' | b'|' | b'_' | b'-'))
}

/// `Err(explanation)` for an illegal topic name.
pub(crate) fn topic(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("topic name cannot be blank".to_owned());
    }
    if name.len() > MAX_TOPIC_LEN {
        return Err(format!(
            "topic name is longer than {MAX_TOPIC_LEN} characters"
        ));
    }
    if !legal_chars(name) {
        return Err(format!("topic name {name:?} has illegal characters"));
    }
    if SYSTEM_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return Err(format!("cannot access system topic {name:?}"));
    }
    Ok(())
}

/// `Err(explanation)` for an illegal consumer group name.
pub(crate) fn group(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("consumer group cannot be blank".to_owned());
    }
    if name.len() > MAX_GROUP_LEN {
        return Err(format!(
            "consumer group is longer than {MAX_GROUP_LEN} characters"
        ));
    }
    if !legal_chars(name) {
        return Err(format!("consumer group {name:?} has illegal characters"));
    }
    if SYSTEM_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return Err(format!("cannot use system consumer group {name:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics() {
        assert!(topic("orders-1_x").is_ok());
        assert!(topic("ns%orders").is_ok());
        for bad in ["", "  ", "a b", "ä", "rmq_sys_TRACE", &"x".repeat(128)] {
            assert!(topic(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn groups() {
        assert!(group("g-1").is_ok());
        for bad in ["", "g/1", "%RETRY%g", &"g".repeat(256)] {
            assert!(group(bad).is_err(), "{bad:?}");
        }
    }
}
