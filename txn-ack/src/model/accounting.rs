//! [`ConsumerModel`]: a subscription with exactly one consumer, the shape of the
//! single-consumer rules (§5-§7).

use super::subscription::{ConsumerId, SubscriptionModel};
use super::{
    Aborted, AckOutcome, Committed, Counters, Dispatch, EntryView, ModelConfig, Redelivered,
    TxnStatus, WireAck,
};
use crate::Error;
use crate::{AckSet, EntryId, TxnId};

/// The id of the one consumer of a [`ConsumerModel`].
const ONLY: ConsumerId = ConsumerId(0);

/// The broker side of one Shared-subscription consumer on a 4.0.x broker: a
/// [`SubscriptionModel`] with exactly one consumer, which therefore owns every ack and
/// receives every replay. See the [module documentation](super) for the rules and the
/// sources.
///
/// Drive it with what happens on the wire, in order: [`dispatch`](Self::dispatch) for each
/// entry the dispatcher sends, [`ack`](Self::ack) for each acknowledged message id,
/// [`commit`](Self::commit) and [`abort`](Self::abort) for transactions ending, and
/// [`redeliver_unacknowledged`](Self::redeliver_unacknowledged) for a client's redelivery
/// request. Read the state with [`unacked`](Self::unacked), [`is_blocked`](Self::is_blocked),
/// [`entries`](Self::entries) and [`counters`](Self::counters).
///
/// Transactions are always enabled (`transactionCoordinatorEnabled=true`), so ordinary
/// batch-index acks are also merged into the pending-ack state, as on such a broker. The
/// unacked count is an `i64` (the broker's is an `int`) and may go negative, as the broker's
/// does with broken clients. Every entry dispatched once is remembered for good, so that late
/// acks of it are recognised.
#[derive(Debug, Clone)]
pub struct ConsumerModel {
    subscription: SubscriptionModel,
}

impl Default for ConsumerModel {
    fn default() -> Self {
        Self::new(ModelConfig::default())
    }
}

impl ConsumerModel {
    /// A consumer with nothing dispatched yet.
    pub fn new(config: ModelConfig) -> Self {
        let mut subscription = SubscriptionModel::new(config);
        subscription.add_consumer(ONLY);
        Self { subscription }
    }

    /// The subscription this consumer is the only consumer of.
    pub fn subscription(&self) -> &SubscriptionModel {
        &self.subscription
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        self.subscription.config()
    }

    /// Changes the limit of a connected consumer, as a topic-policy update of
    /// `maxUnackedMessagesOnConsumer` does on the broker: the count and the blocked flag stay
    /// as they are; the next dispatch blocks at the new limit and the next removed pending ack
    /// unblocks at half of it (at once when the new limit is 0, unlimited).
    pub fn set_max_unacked_messages(&mut self, max: u32) {
        self.subscription.set_max_unacked_messages(max);
    }

    /// The consumer's unacked count (`Consumer.unackedMessages`).
    pub fn unacked(&self) -> i64 {
        self.subscription.unacked(ONLY).unwrap_or_default()
    }

    /// Whether dispatch to the consumer is blocked (`blockedConsumerOnUnackedMsgs`).
    pub fn is_blocked(&self) -> bool {
        self.subscription.is_blocked(ONLY).unwrap_or_default()
    }

    /// What happened so far.
    pub fn counters(&self) -> &Counters {
        self.subscription.counters()
    }

    /// The consumer's `pendingAcks`: each entry with its batch size, in order.
    pub fn pending_acks(&self) -> impl Iterator<Item = (EntryId, u32)> + '_ {
        self.subscription.pending_acks(ONLY)
    }

    /// Everything known of one entry, if it was ever dispatched.
    pub fn entry(&self, entry: &EntryId) -> Option<EntryView<'_>> {
        self.subscription.entry(entry)
    }

    /// Every entry ever dispatched, in order.
    pub fn entries(&self) -> impl Iterator<Item = EntryView<'_>> + '_ {
        self.subscription.entries()
    }

    /// Gives the consumer the cursor's batch-deleted indexes of an entry it never received:
    /// `outstanding` holds the indexes the subscription's cursor still has to deliver (the
    /// others were acknowledged at batch-index level through a consumer of the subscription
    /// that has gone). The next [`dispatch`](Self::dispatch) of the entry then sends the
    /// cursor's ack set and counts only the outstanding indexes, as the dispatcher does with
    /// the cursor's `batchDeletedIndexes`; a set with nothing outstanding makes the entry
    /// deleted. An entry the consumer already knows keeps its state (its own is newer), and so
    /// does every entry when batch-index acks are disabled (the cursor then keeps no such
    /// sets). Returns whether the state was taken.
    ///
    /// # Errors
    /// [`Error::InvalidBatchSize`] unless `1 <= num_messages <= MAX_BATCH_SIZE`;
    /// [`Error::InconsistentBatchSize`] if `outstanding` is a set of another size.
    pub fn restore_cursor(
        &mut self,
        entry: EntryId,
        num_messages: i32,
        outstanding: &AckSet,
    ) -> Result<bool, Error> {
        self.subscription
            .restore_cursor(entry, num_messages, outstanding)
    }

    /// The unacked count held by entries that left `pendingAcks`: what no correct ack can take
    /// back any more. A client that drops `batch_size` leaves `batch_size - 1` per entry here.
    pub fn leaked_unacked(&self) -> i64 {
        self.subscription.leaked_unacked(ONLY)
    }

    /// Where a transaction stands.
    pub fn transaction_status(&self, txn: &TxnId) -> TxnStatus {
        self.subscription.transaction_status(txn)
    }

    /// The entries an open transaction acknowledged, in order (none for other transactions).
    pub fn transaction_entries(&self, txn: &TxnId) -> impl Iterator<Item = EntryId> + '_ {
        self.subscription.transaction_entries(txn)
    }

    /// The open transactions, in order.
    pub fn open_transactions(&self) -> impl Iterator<Item = TxnId> + '_ {
        self.subscription.open_transactions()
    }

    /// Sends an entry holding `num_messages` messages (`num_messages_in_batch`, 1 for an entry
    /// that is not a batch) to the consumer, as the dispatcher and `Consumer.sendMessages` do
    /// (§7.1):
    /// - a blocked consumer gets nothing: [`Dispatch::Blocked`], nothing changes;
    /// - an entry the cursor deleted, or whose every message is acknowledged or pending in a
    ///   transaction, is not sent: [`Dispatch::Skipped`];
    /// - otherwise the entry goes into `pendingAcks` (replacing itself if it is there
    ///   already) and the count grows by the batch size minus the messages already
    ///   acknowledged in the cursor or pending in a transaction (the dispatcher's ack set is
    ///   the cursor's batch-deleted set AND the pending-ack set); the consumer is blocked if
    ///   the count reaches the limit.
    ///
    /// # Errors
    /// [`Error::InvalidBatchSize`] unless `1 <= num_messages <= MAX_BATCH_SIZE`;
    /// [`Error::InconsistentBatchSize`] if the entry was dispatched with another size.
    pub fn dispatch(&mut self, entry: EntryId, num_messages: i32) -> Result<Dispatch, Error> {
        self.subscription.dispatch(ONLY, entry, num_messages)
    }

    /// Sends several entries to the consumer in one `Consumer.sendMessages` call, as the
    /// Shared dispatcher does when it picks a consumer: it checks once that the consumer is
    /// not blocked (`isConsumerAvailable`), hands it up to a batch of entries, and
    /// `sendMessages` adds them all to the count before it blocks the consumer
    /// (`incrementUnackedMessages` after the loop, `Consumer.java` of 4.0.8, l.333-447, l.428).
    /// So one call can take the count past the limit by more than one entry: a 4.0.8 broker
    /// with a limit of 12 sent a consumer whose count a redelivery request had reset two
    /// replayed batches of 6 and a new batch of 5 at once, to 17 (seen by
    /// `integration_tests::conformance`). Each entry is handled as by
    /// [`dispatch`](Self::dispatch), except that the blocked flag is checked only before the
    /// first and set only after the last; every [`Dispatch::Dispatched`] reports the flag as it
    /// is after the call. A blocked consumer gets nothing: every answer is
    /// [`Dispatch::Blocked`].
    ///
    /// # Errors
    /// As [`dispatch`](Self::dispatch), for the first entry that fails; the entries before it
    /// stay dispatched and the blocked flag is updated for them.
    pub fn dispatch_all(&mut self, entries: &[(EntryId, i32)]) -> Result<Vec<Dispatch>, Error> {
        self.subscription.dispatch_all(ONLY, entries)
    }

    /// A FLOW command (`Consumer.flowPermits`): a Shared consumer at or above the limit is
    /// blocked. Returns whether the consumer is blocked.
    pub fn flow_permits(&mut self) -> bool {
        self.subscription.flow_permits(ONLY).unwrap_or_default()
    }

    /// A client's REDELIVER_UNACKNOWLEDGED_MESSAGES with message ids
    /// (`Consumer.redeliverUnacknowledgedMessages(List)`): each named entry in `pendingAcks`
    /// leaves it and the count goes down by its outstanding messages (the cursor's
    /// batch-deleted set with batch-index acks enabled, else the batch size; pending
    /// transactional acks are not considered). The consumer is unblocked (§7.1). Entries not in
    /// `pendingAcks` are passed over.
    pub fn redeliver_unacknowledged(&mut self, entries: &[EntryId]) -> Redelivered {
        self.subscription
            .redeliver_unacknowledged(ONLY, entries)
            .unwrap_or_default()
    }

    /// A client's REDELIVER_UNACKNOWLEDGED_MESSAGES without ids: the count is reset to 0,
    /// `pendingAcks` emptied and the consumer unblocked (§7.1).
    pub fn redeliver_all(&mut self) -> Redelivered {
        self.subscription.redeliver_all(ONLY).unwrap_or_default()
    }

    /// Handles one acknowledged message id as the broker does; see
    /// [`SubscriptionModel::ack`] (the one consumer owns every ack).
    ///
    /// # Errors
    /// Nothing changes when one is returned.
    /// - [`Error::UnknownEntry`]: the entry was never dispatched.
    /// - [`Error::BitsBeyondBatch`]: the ack set has a bit at or beyond the entry's batch
    ///   size.
    /// - [`Error::InvalidBatchSize`]: a transactional ack's `batch_size` is present but
    ///   not in `1..=MAX_BATCH_SIZE`.
    /// - [`Error::TransactionEnded`]: the transaction already committed or aborted.
    pub fn ack(&mut self, ack: &WireAck) -> Result<AckOutcome, Error> {
        self.subscription.ack(ONLY, ack)
    }

    /// Commits `txn`; see [`SubscriptionModel::commit`].
    ///
    /// # Errors
    /// [`Error::TransactionEnded`] if `txn` already ended; nothing changes.
    pub fn commit(&mut self, txn: TxnId) -> Result<Committed, Error> {
        self.subscription.commit(txn)
    }

    /// Aborts `txn`: the pending-ack state gets its indexes back and the entries are returned
    /// for redelivery (§6). The consumer's count, blocked flag and `pendingAcks` are not
    /// touched: the redelivery goes through the dispatcher, so send the entries with
    /// [`dispatch`](Self::dispatch). An entry still in `pendingAcks` is then counted again
    /// (see [`Counters::recounted_on_redispatch`](super::Counters::recounted_on_redispatch)).
    /// See [`SubscriptionModel::abort`].
    ///
    /// # Errors
    /// [`Error::TransactionEnded`] if `txn` already ended; nothing changes.
    pub fn abort(&mut self, txn: TxnId) -> Result<Aborted, Error> {
        self.subscription.abort(txn)
    }
}
