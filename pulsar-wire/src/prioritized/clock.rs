//! The clock of the gate and the router: tokio's, so that `tokio::time::pause` drives them.

/// The current instant on Tokio's clock (so that `tokio::time::pause` drives the gate).
pub(super) fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}
