//! What a lite push consumer keeps about its lite subscriptions (RIP-83): the bind topic, the
//! lite topics it subscribed to, and the limits the proxy announced.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::pb;

/// The lite topic length the proxy allows until it says otherwise (`maxLiteTopicSize`).
pub(super) const DEFAULT_MAX_LITE_TOPIC_SIZE: usize = 64;

/// Where a new lite subscription starts reading (`OffsetOption` of `SyncLiteSubscription`, as
/// the Java client's `OffsetOption`).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use rocketmq_grpc::LiteOffset;
///
/// let from_an_hour_ago = LiteOffset::Timestamp(SystemTime::now() - Duration::from_secs(3600));
/// let last_ten = LiteOffset::TailN(10);
/// assert_ne!(from_an_hour_ago, last_ten);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LiteOffset {
    /// Where the group left off (the broker's default).
    Last,
    /// The oldest message the broker keeps.
    Min,
    /// Only messages stored from now on.
    Max,
    /// This queue offset.
    Offset(u64),
    /// The newest `n` messages.
    TailN(u64),
    /// Messages stored from this time on.
    Timestamp(SystemTime),
}

impl LiteOffset {
    /// The protocol's `OffsetOption` (a time before 1970 is 0 ms).
    pub(super) fn to_pb(self) -> pb::OffsetOption {
        use pb::offset_option::{OffsetType, Policy};
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let offset_type = match self {
            Self::Last => OffsetType::Policy(Policy::Last as i32),
            Self::Min => OffsetType::Policy(Policy::Min as i32),
            Self::Max => OffsetType::Policy(Policy::Max as i32),
            Self::Offset(offset) => OffsetType::Offset(clamp(offset)),
            Self::TailN(n) => OffsetType::TailN(clamp(n)),
            Self::Timestamp(at) => {
                let ms = at
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or(Duration::ZERO)
                    .as_millis();
                OffsetType::Timestamp(i64::try_from(ms).unwrap_or(i64::MAX))
            }
        };
        pb::OffsetOption {
            offset_type: Some(offset_type),
        }
    }
}

/// A lite push consumer's subscriptions and the proxy's limits for them.
#[derive(Debug)]
pub(super) struct LiteState {
    /// The parent topic the lite topics belong to (`lite.bind.topic` of the group).
    pub(super) bind_topic: String,
    /// The lite topics subscribed to (and not unsubscribed by the server since).
    pub(super) topics: Mutex<BTreeSet<String>>,
    /// The proxy's limits: how many lite topics one client may subscribe to
    /// (`lite_subscription_quota`; `None` until announced) and the longest name.
    pub(super) limits: Mutex<LiteLimits>,
    /// Serialises subscription changes so that the periodic full sync never races a partial
    /// one.
    pub(super) changing: tokio::sync::Mutex<()>,
}

/// The limits the proxy announces in its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LiteLimits {
    pub(super) quota: Option<usize>,
    pub(super) max_topic_size: usize,
}

impl LiteState {
    pub(super) fn new(bind_topic: String) -> Self {
        Self {
            bind_topic,
            topics: Mutex::new(BTreeSet::new()),
            limits: Mutex::new(LiteLimits {
                quota: None,
                max_topic_size: DEFAULT_MAX_LITE_TOPIC_SIZE,
            }),
            changing: tokio::sync::Mutex::new(()),
        }
    }

    /// Takes the limits of the server's subscription settings (a negative quota is none).
    pub(super) fn take_limits(&self, subscription: &pb::Subscription) {
        let mut limits = self.limits.lock();
        if let Some(quota) = subscription.lite_subscription_quota {
            limits.quota = usize::try_from(quota).ok();
        }
        if let Some(size) = subscription
            .max_lite_topic_size
            .and_then(|size| usize::try_from(size).ok())
            .filter(|size| *size > 0)
        {
            limits.max_topic_size = size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::offset_option::{OffsetType, Policy};

    #[test]
    fn offsets_map_to_the_protocol() {
        let of = |o: LiteOffset| o.to_pb().offset_type.unwrap();
        assert_eq!(
            of(LiteOffset::Last),
            OffsetType::Policy(Policy::Last as i32)
        );
        assert_eq!(of(LiteOffset::Min), OffsetType::Policy(Policy::Min as i32));
        assert_eq!(of(LiteOffset::Max), OffsetType::Policy(Policy::Max as i32));
        assert_eq!(of(LiteOffset::Offset(7)), OffsetType::Offset(7));
        assert_eq!(of(LiteOffset::TailN(u64::MAX)), OffsetType::TailN(i64::MAX));
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(
            of(LiteOffset::Timestamp(at)),
            OffsetType::Timestamp(1_700_000_000_123)
        );
    }

    #[test]
    fn limits_follow_the_server_and_a_negative_quota_is_none() {
        let state = LiteState::new("parent".into());
        assert_eq!(
            state.limits.lock().max_topic_size,
            DEFAULT_MAX_LITE_TOPIC_SIZE
        );
        state.take_limits(&pb::Subscription {
            lite_subscription_quota: Some(3),
            max_lite_topic_size: Some(32),
            ..Default::default()
        });
        assert_eq!(
            *state.limits.lock(),
            LiteLimits {
                quota: Some(3),
                max_topic_size: 32
            }
        );
        state.take_limits(&pb::Subscription {
            lite_subscription_quota: Some(-1),
            max_lite_topic_size: Some(0),
            ..Default::default()
        });
        assert_eq!(
            *state.limits.lock(),
            LiteLimits {
                quota: None,
                max_topic_size: 32
            }
        );
    }
}
