//! The lite subscriptions of a lite push consumer (RIP-83): `SyncLiteSubscription` requests
//! (add, remove, and the periodic full set), the client-side checks the Java client makes
//! before them, and the server's unsubscribe notices.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::lite_state::{LiteOffset, LiteState};
use super::state::Inner;
use crate::Error;
use crate::message::check_lite_topic;
use crate::pb::{self, Code, LiteSubscriptionAction};

/// How often the whole set is announced again (the Java client's period), so that a proxy or
/// broker that lost it (restart, another proxy) has it back.
pub(super) const FULL_SYNC_EVERY: Duration = Duration::from_secs(30);

/// The consumer's lite state; an error naming `setting` for a consumer that is not lite.
fn lite<'a>(inner: &'a Inner, setting: &'static str) -> Result<&'a LiteState, Error> {
    inner.lite.as_deref().ok_or_else(|| {
        Error::invalid(
            setting,
            "this consumer is not a lite push consumer (LitePushConsumer::builder)",
        )
    })
}

fn check_running(inner: &Inner) -> Result<(), Error> {
    if inner.shut_down.load(Ordering::Relaxed) {
        return Err(Error::Closed("the lite push consumer"));
    }
    Ok(())
}

/// Subscribes to `name` (nothing to do when already subscribed): checks the name and the
/// quota the proxy announced, then `SyncLiteSubscription(PARTIAL_ADD)`; the topic is in the
/// set once the proxy accepted it.
pub(super) async fn subscribe(
    inner: &Inner,
    name: &str,
    offset: Option<LiteOffset>,
) -> Result<(), Error> {
    check_running(inner)?;
    let state = lite(inner, "subscribe_lite")?;
    let _changing = state.changing.lock().await;
    if state.topics.lock().contains(name) {
        return Ok(());
    }
    check_lite_topic(name)?;
    let limits = *state.limits.lock();
    if name.len() > limits.max_topic_size {
        return Err(Error::invalid(
            "lite_topic",
            format!(
                "{name:?} is {} bytes, longer than the proxy's {} (maxLiteTopicSize)",
                name.len(),
                limits.max_topic_size
            ),
        ));
    }
    check_quota(state, 1)?;
    sync(
        inner,
        state,
        LiteSubscriptionAction::PartialAdd,
        vec![name.to_owned()],
        offset,
    )
    .await?;
    state.topics.lock().insert(name.to_owned());
    Ok(())
}

/// Unsubscribes from `name` (nothing to do when not subscribed) with
/// `SyncLiteSubscription(PARTIAL_REMOVE)`.
pub(super) async fn unsubscribe(inner: &Inner, name: &str) -> Result<(), Error> {
    check_running(inner)?;
    let state = lite(inner, "unsubscribe_lite")?;
    let _changing = state.changing.lock().await;
    if !state.topics.lock().contains(name) {
        return Ok(());
    }
    sync(
        inner,
        state,
        LiteSubscriptionAction::PartialRemove,
        vec![name.to_owned()],
        None,
    )
    .await?;
    state.topics.lock().remove(name);
    Ok(())
}

/// Announces the whole set (`COMPLETE_ADD`), as the Java client does at start and every 30 s.
pub(super) async fn sync_all(inner: &Inner) -> Result<(), Error> {
    let Some(state) = inner.lite.as_deref() else {
        return Ok(());
    };
    let _changing = state.changing.lock().await;
    let topics: Vec<String> = state.topics.lock().iter().cloned().collect();
    sync(
        inner,
        state,
        LiteSubscriptionAction::CompleteAdd,
        topics,
        None,
    )
    .await
}

/// The server's notice that the client no longer has `name` (the lite topic expired, or was
/// taken by another client of an exclusive group): it leaves the set.
pub(super) fn unsubscribed_by_server(inner: &Inner, name: &str) {
    if let Some(state) = inner.lite.as_deref()
        && !name.is_empty()
        && state.topics.lock().remove(name)
    {
        tracing::info!(lite_topic = name, "the proxy unsubscribed a lite topic");
    }
}

/// The client-side quota check: the set grown by `more` must stay within the quota the proxy
/// announced (`LITE_SUBSCRIPTION_QUOTA_EXCEEDED` otherwise, as the proxy would answer).
fn check_quota(state: &LiteState, more: usize) -> Result<(), Error> {
    let Some(quota) = state.limits.lock().quota else {
        return Ok(());
    };
    let count = state.topics.lock().len();
    if count + more > quota {
        return Err(Error::Server {
            rpc: "SyncLiteSubscription",
            code: Code::LiteSubscriptionQuotaExceeded as i32,
            message: format!(
                "checked before sending: {count} lite topics subscribed, the group's quota per \
                 client is {quota} (lite.sub.client.quota); unsubscribe from one first"
            ),
        });
    }
    Ok(())
}

/// One `SyncLiteSubscription` to the access point (the proxy passes it to every broker of the
/// bind topic).
async fn sync(
    inner: &Inner,
    state: &LiteState,
    action: LiteSubscriptionAction,
    topics: Vec<String>,
    offset: Option<LiteOffset>,
) -> Result<(), Error> {
    let session = &inner.session;
    let request = pb::SyncLiteSubscriptionRequest {
        action: action as i32,
        topic: Some(session.resource(&state.bind_topic)),
        group: Some(session.resource(&inner.group)),
        lite_topic_set: topics,
        version: None,
        offset_option: offset.map(LiteOffset::to_pb),
    };
    let access = session.config().endpoint().clone();
    let mut client = session.client(&access)?;
    let timeout = session.config().request_timeout;
    let response = client
        .sync_lite_subscription(session.request(request, timeout))
        .await
        .map_err(|status| Error::rpc("SyncLiteSubscription", status))?
        .into_inner();
    Error::check("SyncLiteSubscription", response.status.as_ref())
}

/// Announces the whole set every [`FULL_SYNC_EVERY`] while registered, and at once after each
/// new registration (a restarted proxy has forgotten the client's subscriptions); failures are
/// logged and tried again at the next turn.
pub(super) async fn full_sync_loop(inner: std::sync::Arc<Inner>) {
    let mut registered = inner.registration.subscribe();
    let mut seen = inner.registration.current();
    loop {
        tokio::select! {
            () = inner.stop.cancelled() => return,
            () = tokio::time::sleep(FULL_SYNC_EVERY) => {}
            changed = registered.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = *registered.borrow_and_update();
                if now.is_none() || now == seen {
                    continue;
                }
                seen = now;
            }
        }
        if inner.registration.current().is_none() {
            continue;
        }
        if let Err(error) = sync_all(&inner).await {
            tracing::warn!(%error, "SyncLiteSubscription of the whole set failed; trying again later");
        }
    }
}
