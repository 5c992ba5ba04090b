//! The end of a run: dropping the batcher or closing it, and what must hold afterwards.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use ack_batcher::{Error, ItemOptions};
use tokio::time::Instant;

use super::case::Case;
use super::checker::{Outcome, check_counters};
use super::log::{Event, lock};
use super::runner::{HANG, Sink, TestBatcher, millis, poll_once};

pub(super) type Submitter = tokio::task::JoinHandle<Result<(), String>>;

pub(super) type Detached = Vec<Pin<Box<dyn Future<Output = ()> + Send>>>;

/// Awaits a spawned submitter; it must finish and have found nothing wrong.
async fn join(submitter: Submitter) -> Result<(), String> {
    tokio::time::timeout(HANG, submitter)
        .await
        .map_err(|_| "a spawned submit hung".to_owned())?
        .map_err(|error| format!("a spawned submit panicked: {error}"))?
}

/// Ends a run by dropping the last handle: the batcher closes itself in the background
/// within `drop_timeout`, and every ticket still resolves.
pub(super) async fn end_by_drop(
    batcher: TestBatcher,
    sink: &Sink,
    submitters: Vec<Submitter>,
    detached: Detached,
    outcomes: &mut HashMap<u64, Outcome>,
    case: &Case,
) -> Result<(), String> {
    // The submitters hold handles too; let them finish (they may wait for room) first.
    for submitter in submitters {
        join(submitter).await?;
    }
    lock(&sink.log).events.push(Event::CloseStart);
    let dropped = Instant::now();
    drop(batcher);
    let tickets = std::mem::take(&mut *sink.tickets.lock().expect("tickets lock poisoned"));
    for (id, ticket) in tickets {
        let result = tokio::time::timeout(HANG, ticket)
            .await
            .map_err(|_| format!("item {id} never resolved after the batcher was dropped"))?;
        ensure!(
            outcomes.insert(id, Outcome::from_result(result)?).is_none(),
            "item {id} resolved twice"
        );
    }
    let elapsed = dropped.elapsed();
    let timeout = millis(case.close_ms.max(1));
    ensure!(
        elapsed <= timeout,
        "the dropped batcher took {elapsed:?} to resolve everything, drop_timeout is {timeout:?}"
    );
    for flush in detached {
        tokio::time::timeout(HANG, flush)
            .await
            .map_err(|_| "a flush future hung after the batcher was dropped".to_owned())?;
    }
    Ok(())
}

/// Ends a run with `close`.
pub(super) struct Closing<'a> {
    pub(super) sink: &'a Sink,
    pub(super) submitters: Vec<Submitter>,
    pub(super) detached: Detached,
    pub(super) timeout: Duration,
    /// An id never used, for the submits after close.
    pub(super) next_id: u64,
}

impl Closing<'_> {
    pub(super) async fn close(
        mut self,
        batcher: &TestBatcher,
        outcomes: &mut HashMap<u64, Outcome>,
    ) -> Result<(), String> {
        let pending_at_close = self.sink.collect(outcomes)?;
        lock(&self.sink.log).events.push(Event::CloseStart);
        let timeout = self.timeout;
        let started = Instant::now();
        let report = tokio::time::timeout(timeout + HANG, batcher.close(timeout))
            .await
            .map_err(|_| "close hung".to_owned())?;
        let elapsed = started.elapsed();

        // Right after close returned: everything is resolved.
        let unresolved = self.sink.collect(outcomes)?;
        ensure!(
            unresolved.is_empty(),
            "tickets still pending right after close returned: {unresolved:?}"
        );
        for flush in &mut self.detached {
            ensure!(
                poll_once(flush).is_ready(),
                "a flush future is still pending after close"
            );
        }
        // Spawned submits still waiting were refused; none may have got in after close.
        for submitter in self.submitters.drain(..) {
            join(submitter).await?;
        }
        let late = self.sink.collect(outcomes)?;
        ensure!(late.is_empty(), "items accepted after close: {late:?}");

        let count = |ids: &[u64], f: fn(&Outcome) -> bool| {
            ids.iter().filter(|id| f(&outcomes[*id])).count() as u64
        };
        let is_ok = |o: &Outcome| matches!(o, Outcome::Ok(_));
        let is_failed = |o: &Outcome| matches!(o, Outcome::Failed { .. } | Outcome::Missing { .. });
        let is_abandoned = |o: &Outcome| *o == Outcome::Abandoned;
        let is_terminal =
            |o: &Outcome| matches!(o, Outcome::Failed { source, .. } if !source.retryable);

        // The close report covers exactly the items pending when close started.
        ensure!(
            report.pending_at_close == pending_at_close.len(),
            "report {report:?}, {} items were pending",
            pending_at_close.len()
        );
        let (succeeded, failed, abandoned) = (
            count(&pending_at_close, is_ok),
            count(&pending_at_close, is_failed),
            count(&pending_at_close, is_abandoned),
        );
        ensure!(
            (report.succeeded, report.failed, report.abandoned) == (succeeded, failed, abandoned),
            "report {report:?}, outcomes of the pending items: {succeeded} succeeded, {failed} \
             failed, {abandoned} abandoned"
        );
        ensure!(
            report.timed_out == (abandoned > 0),
            "report {report:?} with {abandoned} abandoned"
        );
        ensure!(
            if report.timed_out {
                elapsed == timeout
            } else {
                elapsed <= timeout
            },
            "close took {elapsed:?} with a timeout of {timeout:?} ({report:?})"
        );

        // The counters agree with the outcomes and the log.
        let stats = batcher.stats();
        let all: Vec<u64> = outcomes.keys().copied().collect();
        let accepted = self.sink.accepted().len() as u64;
        ensure!(
            stats.pending == 0
                && stats.in_flight == 0
                && stats.queued == 0
                && stats.awaiting_retry == 0
                && stats.keys == 0,
            "after close: {stats:?}"
        );
        ensure!(
            stats.items_submitted == accepted
                && stats.items_succeeded == count(&all, is_ok)
                && stats.items_failed == count(&all, is_failed)
                && stats.items_abandoned == count(&all, is_abandoned),
            "counters {stats:?} vs {accepted} accepted and outcomes {outcomes:?}"
        );
        let terminal = count(&all, is_terminal);
        ensure!(
            (terminal..=stats.items_failed).contains(&stats.terminal_failures),
            "terminal_failures {} with {terminal} non-retryable failures of {}",
            stats.terminal_failures,
            stats.items_failed
        );
        check_counters(&lock(&self.sink.log), &stats, report.timed_out)?;

        // A closed batcher hands items back.
        ensure!(batcher.is_closed(), "is_closed() is false after close");
        let id = self.next_id;
        let refused = [
            batcher.enqueue(0, id, ItemOptions::new()).await.err(),
            batcher
                .try_enqueue(0, id, ItemOptions::new().immediate())
                .err(),
            batcher.submit(0, id).await.err(),
            batcher.submit_immediate(0, id).await.err(),
        ]
        .map(|error| {
            error.and_then(|error| matches!(error, Error::Closed(_)).then(|| error.into_item()))
        });
        ensure!(
            refused.iter().all(|item| *item == Some(Some(id))),
            "after close, submitting gave {refused:?}"
        );
        let again = batcher.close(timeout).await;
        ensure!(
            again.pending_at_close == 0
                && again.succeeded + again.failed + again.abandoned == 0
                && !again.timed_out,
            "a second close reported {again:?}"
        );
        ensure!(
            batcher.stats().items_submitted == accepted,
            "refused items were counted as submitted"
        );
        Ok(())
    }
}
