//! Topic names: resolving them as Pulsar does, and the partitions in them.

/// The partitioned topic whose partitions name the transaction coordinators; the emulator
/// runs one coordinator, so it has one partition.
pub(super) const TC_ASSIGN_TOPIC: &str =
    "persistent://pulsar/system/transaction_coordinator_assign";

/// Resolves a topic name as Pulsar does: `t` is `persistent://public/default/t`,
/// `tenant/ns/t` is `persistent://tenant/ns/t`.
pub(super) fn normalize(name: &str) -> Result<String, String> {
    let (domain, rest) = name.split_once("://").unwrap_or(("persistent", name));
    if domain != "persistent" && domain != "non-persistent" {
        return Err(format!(
            "topic {name:?}: the domain must be persistent or non-persistent"
        ));
    }
    let parts: Vec<&str> = rest.split('/').collect();
    if parts.iter().any(|part| part.is_empty()) || name.chars().any(char::is_whitespace) {
        return Err(format!("topic {name:?} has an empty part or whitespace"));
    }
    match parts.len() {
        1 => Ok(format!("{domain}://public/default/{rest}")),
        // tenant/namespace/topic, or the v1 tenant/cluster/namespace/topic.
        3 | 4 => Ok(format!("{domain}://{rest}")),
        _ => Err(format!(
            "topic {name:?} is not topic, tenant/namespace/topic or domain://tenant/namespace/topic"
        )),
    }
}

/// Splits `base-partition-N`.
pub(super) fn split_partition(name: &str) -> Option<(&str, u32)> {
    let (base, index) = name.rsplit_once("-partition-")?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((base, index.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_like_pulsar() {
        assert_eq!(normalize("t").unwrap(), "persistent://public/default/t");
        assert_eq!(normalize("a/b/t").unwrap(), "persistent://a/b/t");
        assert_eq!(
            normalize("non-persistent://a/b/t").unwrap(),
            "non-persistent://a/b/t"
        );
        for bad in ["", "a/b", "x://a/b/t", "a//t", "a b"] {
            assert!(normalize(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            split_partition("p://a/b/t-partition-12"),
            Some(("p://a/b/t", 12))
        );
        assert_eq!(split_partition("t-partition-"), None);
        assert_eq!(split_partition("t-partition-+1"), None);
        assert_eq!(split_partition("t"), None);
    }
}
