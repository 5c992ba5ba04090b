//! The tokio runtime of an `e2e_load` process, and which one our produce children get.
//!
//! Tuned, our producers run on a current-thread runtime: the application's sends and the
//! client's connection tasks share one thread, so a request handed to the connection and its
//! answer handed back wake no other thread (on the default multi-thread runtime each does, a
//! third of the RocketMQ producer's CPU per message). That is the README's recommendation for
//! a process whose main work is sending. With the defaults they run on `#[tokio::main]`'s
//! multi-thread runtime, as most applications do. The driver and every other child use the
//! multi-thread runtime.

use tokio::runtime::{Builder, Runtime};

use crate::args::Settings;

/// The environment variable naming a child's runtime.
pub(crate) const VAR: &str = "E2E_RUNTIME";
/// Its value for a current-thread runtime.
pub(crate) const CURRENT_THREAD: &str = "current-thread";
/// Its value for a multi-thread runtime (also taken when it is unset).
pub(crate) const MULTI_THREAD: &str = "multi-thread";

/// Which runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One thread for everything.
    CurrentThread,
    /// `#[tokio::main]`'s: a worker per core.
    MultiThread,
}

/// The runtime [`VAR`]'s `value` names (multi-thread when unset).
///
/// # Errors
/// An unknown value, named.
pub(crate) fn kind(value: Option<&str>) -> Result<Kind, String> {
    match value {
        None | Some(MULTI_THREAD) => Ok(Kind::MultiThread),
        Some(CURRENT_THREAD) => Ok(Kind::CurrentThread),
        Some(other) => Err(format!(
            "{VAR}={other:?}: give {CURRENT_THREAD:?} or {MULTI_THREAD:?}"
        )),
    }
}

/// The runtime this process's [`VAR`] names.
///
/// # Errors
/// An unknown value, or the runtime's own error.
pub(crate) fn build() -> Result<Runtime, String> {
    let value = std::env::var(VAR).ok();
    let mut builder = match kind(value.as_deref())? {
        Kind::CurrentThread => Builder::new_current_thread(),
        Kind::MultiThread => Builder::new_multi_thread(),
    };
    builder
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}

/// The environment of our produce child at `settings`.
pub(crate) fn ours_env(settings: Settings) -> Vec<(String, String)> {
    let value = match settings {
        Settings::Tuned => CURRENT_THREAD,
        Settings::Defaults => MULTI_THREAD,
    };
    vec![(VAR.to_owned(), value.to_owned())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuned_children_get_a_current_thread_runtime_and_bad_values_are_named() {
        let runtime_of = |settings| {
            let env = ours_env(settings);
            assert_eq!(env.len(), 1);
            assert_eq!(env[0].0, VAR);
            kind(Some(env[0].1.as_str())).unwrap()
        };
        assert_eq!(runtime_of(Settings::Tuned), Kind::CurrentThread);
        assert_eq!(runtime_of(Settings::Defaults), Kind::MultiThread);
        assert_eq!(kind(None).unwrap(), Kind::MultiThread);
        let error = kind(Some("two")).unwrap_err();
        assert!(
            error.contains("\"two\"") && error.contains(CURRENT_THREAD),
            "{error}"
        );
    }
}
