//! [`PriorityRouter`]: the `priority` crate's router as a producer's partition router.

use ::mq_priority::{LayoutSpec, PriorityPolicy, Router, RouterConfig};

use crate::{Client, Error, OutgoingMessage, PartitionRouter};

/// Routes each message to a partition of its priority level (see [`::mq_priority::Router`]):
/// the level comes from the message's priority property through the router's
/// [`PriorityPolicy`]; a message with a key goes to the key's partition within the level,
/// one without a key goes round robin over the level's partitions (per level, sticky for a
/// window so that batches fill). The layout is recomputed whenever the producer's partition
/// count changes, so partitions added to the topic get their share. The count never goes
/// down (a partitioned topic never shrinks): a producer that passes fewer partitions than the
/// router has, for example one created on a stale read of the count right after a growth,
/// gets [`Error::Priority`] (`PartitionsShrunk`) from its sends until
/// [`crate::Producer::refresh_partitions`] reads the grown count.
///
/// Give it to [`crate::ProducerOptions::router`] as an `Arc<dyn PartitionRouter>`.
#[derive(Debug)]
pub struct PriorityRouter {
    router: Router,
}

impl PriorityRouter {
    /// Wraps a router.
    pub fn new(router: Router) -> Self {
        Self { router }
    }

    /// A router for `topic` as it is now: reads the partition count and builds the layout.
    ///
    /// # Errors
    /// [`Error::Invalid`] when the topic is not partitioned; [`Error::Priority`] when the
    /// layout does not fit the partition count (for example fewer partitions than levels);
    /// the lookup's errors.
    pub async fn for_topic(
        client: &Client,
        topic: &str,
        policy: PriorityPolicy,
        layout: LayoutSpec,
        config: RouterConfig,
    ) -> Result<Self, Error> {
        let partitions = client.partitions(topic).await?;
        if partitions == 0 {
            return Err(Error::Invalid {
                what: "topic",
                reason: format!(
                    "{topic} is not partitioned; priority levels live on partitions, so create \
                     a partitioned topic with at least one partition per level"
                ),
            });
        }
        let router = Router::new(policy, layout, partitions, config, super::clock::now())?;
        Ok(Self { router })
    }

    /// The underlying router (its policy, layout and parse counters).
    pub fn router(&self) -> &Router {
        &self.router
    }
}

impl PartitionRouter for PriorityRouter {
    /// Routes a message of the policy's default level. When the layout cannot be computed
    /// for `partitions`, returns partition 0 (the producer calls
    /// [`PartitionRouter::route_message`], which reports that error instead).
    fn route(&self, key: Option<&str>, partitions: u32) -> u32 {
        let level = self.router.policy().default_level();
        self.router
            .route(level, key, partitions, super::clock::now())
            .unwrap_or(0)
    }

    fn route_message(&self, message: &OutgoingMessage, partitions: u32) -> Result<u32, Error> {
        let priority = message.property_value(self.router.policy().property());
        Ok(self.router.route_message(
            priority,
            message.partition_key(),
            partitions,
            super::clock::now(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use ::mq_priority::{Level, StickyWindow, Unlisted};

    use super::*;

    fn router(spec: LayoutSpec) -> PriorityRouter {
        let policy = PriorityPolicy::builder()
            .levels(2)
            .property("prio")
            .build()
            .unwrap();
        let config = RouterConfig {
            sticky: StickyWindow::per_message(),
            ..RouterConfig::default()
        };
        PriorityRouter::new(
            Router::new(policy, spec, 4, config, super::super::clock::now()).unwrap(),
        )
    }

    #[test]
    fn routes_by_the_priority_property_and_follows_growth() {
        let r = router(LayoutSpec::explicit_with(
            [(Level::new(0), vec![0])],
            Unlisted::DefaultLevel,
        ));
        let high = OutgoingMessage::new("h").property("prio", "0");
        let low = OutgoingMessage::new("l").property("prio", "1");
        let unmarked = OutgoingMessage::new("u");
        for _ in 0..8 {
            assert_eq!(r.route_message(&high, 4).unwrap(), 0);
            assert!((1..4).contains(&r.route_message(&low, 4).unwrap()));
            assert!((1..4).contains(&r.route_message(&unmarked, 4).unwrap()));
        }
        // Keys stay on one partition of their level.
        let keyed = OutgoingMessage::new("k")
            .property("prio", "1")
            .key("order-9");
        let p = r.route_message(&keyed, 4).unwrap();
        assert!((1..4).contains(&p));
        assert_eq!(r.route_message(&keyed, 4).unwrap(), p);
        // Grown to 8: the new partitions join the default (low) level and get traffic.
        let lows: std::collections::BTreeSet<u32> =
            (0..28).map(|_| r.route_message(&low, 8).unwrap()).collect();
        assert_eq!(lows.into_iter().collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(r.route_message(&high, 8).unwrap(), 0);
        assert!(r.route(None, 8) >= 1);
        // A partition-shares layout is recomputed too.
        let r = router(LayoutSpec::partition_shares([1, 3]));
        let highs: std::collections::BTreeSet<u32> =
            (0..8).map(|_| r.route_message(&high, 8).unwrap()).collect();
        let layout = r.router().layout();
        assert_eq!(layout.partitions(), 8);
        assert_eq!(
            highs.into_iter().collect::<Vec<_>>(),
            layout.partitions_of(Level::new(0))
        );
    }

    #[test]
    fn an_uncovered_layout_is_an_error_not_a_wrong_partition() {
        let spec = LayoutSpec::explicit([(Level::new(0), vec![0]), (Level::new(1), vec![1, 2, 3])]);
        let r = router(spec);
        let low = OutgoingMessage::new("l").property("prio", "1");
        assert!(matches!(r.route_message(&low, 6), Err(Error::Priority(_))));
        assert_eq!(r.route(None, 6), 0);
        let spec = LayoutSpec::explicit_with([(Level::new(0), vec![0])], Unlisted::DefaultLevel);
        let r = router(spec);
        assert!((1..6).contains(&r.route_message(&low, 6).unwrap()));
    }
}
