//! Token authentication: where the token of `CONNECT` and of `AUTH_RESPONSE` comes from.

use std::path::PathBuf;

use crate::Error;

/// The `auth_method_name` of token authentication, in `CONNECT` and `AUTH_RESPONSE`.
pub const TOKEN_AUTH_METHOD: &str = "token";

/// Supplies the token a connection authenticates with.
///
/// [`TokenProvider::token`] is called for the `CONNECT` of every new connection, and again
/// whenever the broker asks for fresh credentials with `AUTH_CHALLENGE` (a broker with
/// token authentication does so when the token the connection authenticated with has
/// expired, checking every `authenticationRefreshCheckSeconds`). A provider that refreshes
/// its token keeps long-lived connections open across token expiries.
///
/// For a fixed token use [`ConnectOptions::auth_token`](crate::ConnectOptions::auth_token),
/// for a file that an operator rotates
/// [`ConnectOptions::auth_token_file`](crate::ConnectOptions::auth_token_file); implement
/// this trait (with the re-exported [`async_trait`](crate::async_trait)) for anything else:
///
/// ```
/// use pulsar_wire::{ConnectOptions, Error, TokenProvider, async_trait};
///
/// struct FromVault;
///
/// #[async_trait]
/// impl TokenProvider for FromVault {
///     async fn token(&self) -> Result<String, Error> {
///         // Ask the secret store for a current token here.
///         Ok("eyJhbGciOiJIUzI1NiJ9.e30.signature".to_owned())
///     }
/// }
///
/// let options = ConnectOptions::new("pulsar+ssl://broker.example:6651")?
///     .auth_token_provider(FromVault);
/// # Ok::<(), Error>(())
/// ```
///
/// or pass a closure returning a future of the token:
///
/// ```
/// use pulsar_wire::{ConnectOptions, Error};
///
/// let options = ConnectOptions::new("pulsar+ssl://broker.example:6651")?
///     .auth_token_provider(|| async {
///         // Ask the secret store for a current token here.
///         Ok::<_, Error>("eyJhbGciOiJIUzI1NiJ9.e30.signature".to_owned())
///     });
/// # Ok::<(), Error>(())
/// ```
#[async_trait::async_trait]
pub trait TokenProvider: Send + Sync {
    /// The token to send now.
    ///
    /// # Errors
    /// Whatever stops the provider from producing a token. During `CONNECT` the error is
    /// returned as it is by [`ClientBuilder::build`](crate::ClientBuilder::build) and every call that
    /// opens a connection; while answering an `AUTH_CHALLENGE` the connection is closed and
    /// what was pending on it fails with [`Error::ConnectionLost`] naming the error.
    async fn token(&self) -> Result<String, Error>;
}

/// A shared provider (the application keeps a handle, for example to read its state).
#[async_trait::async_trait]
impl<T: TokenProvider + ?Sized> TokenProvider for std::sync::Arc<T> {
    async fn token(&self) -> Result<String, Error> {
        T::token(self).await
    }
}

/// A closure returning a future of the token, called each time a token is needed.
#[async_trait::async_trait]
impl<F, Fut> TokenProvider for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<String, Error>> + Send,
{
    async fn token(&self) -> Result<String, Error> {
        self().await
    }
}

/// A token that never changes.
pub(crate) struct StaticToken(pub(crate) String);

impl std::fmt::Debug for StaticToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StaticToken(<redacted>)")
    }
}

#[async_trait::async_trait]
impl TokenProvider for StaticToken {
    async fn token(&self) -> Result<String, Error> {
        Ok(self.0.clone())
    }
}

/// A token read from a file each time one is needed (surrounding whitespace removed), so a
/// rotated file is picked up by the next connection and the next `AUTH_CHALLENGE`.
#[derive(Debug)]
pub(crate) struct TokenFile(pub(crate) PathBuf);

#[async_trait::async_trait]
impl TokenProvider for TokenFile {
    async fn token(&self) -> Result<String, Error> {
        let text = tokio::fs::read_to_string(&self.0)
            .await
            .map_err(|e| Error::Invalid {
                what: "token file",
                reason: format!(
                    "cannot read {}: {e} (ConnectOptions::auth_token_file names a file holding the token)",
                    self.0.display()
                ),
            })?;
        Ok(text.trim().to_owned())
    }
}

/// The token of `provider`, refused when empty (a broker would only say "Failed to
/// authenticate").
pub(crate) async fn fetch_token(provider: &dyn TokenProvider) -> Result<String, Error> {
    let token = provider.token().await?;
    if token.trim().is_empty() {
        return Err(Error::Invalid {
            what: "token",
            reason: "the token provider returned an empty token".into(),
        });
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_token_file_is_read_each_time_and_trimmed() {
        let dir = std::env::temp_dir().join(format!("pulsar-wire-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "first\n").unwrap();
        let provider = TokenFile(path.clone());
        assert_eq!(fetch_token(&provider).await.unwrap(), "first");
        std::fs::write(&path, "  second \n").unwrap();
        assert_eq!(fetch_token(&provider).await.unwrap(), "second");

        std::fs::write(&path, "\n").unwrap();
        let error = fetch_token(&provider).await.unwrap_err();
        assert!(error.to_string().contains("empty token"), "{error}");

        std::fs::remove_file(&path).unwrap();
        let error = fetch_token(&provider).await.unwrap_err();
        assert!(
            matches!(
                error,
                Error::Invalid {
                    what: "token file",
                    ..
                }
            ),
            "{error}"
        );
        assert!(
            error.to_string().contains(&path.display().to_string()),
            "{error}"
        );
        let _ = std::fs::remove_dir(&dir);
    }

    #[tokio::test]
    async fn a_closure_is_a_provider_asked_each_time() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU32, Ordering};

        let calls = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&calls);
        let provider = move || {
            let n = counted.fetch_add(1, Ordering::Relaxed);
            async move { Ok(format!("token-{n}")) }
        };
        assert_eq!(fetch_token(&provider).await.unwrap(), "token-0");
        assert_eq!(fetch_token(&provider).await.unwrap(), "token-1");
        // Shared behind an Arc, and as the dyn the connection holds.
        let shared: Arc<dyn TokenProvider> = Arc::new(provider);
        assert_eq!(fetch_token(&shared).await.unwrap(), "token-2");
        assert_eq!(calls.load(Ordering::Relaxed), 3);

        let failing = || async {
            Err(Error::Invalid {
                what: "token",
                reason: "sealed".into(),
            })
        };
        let error = fetch_token(&failing).await.unwrap_err();
        assert!(error.to_string().contains("sealed"), "{error}");
        let empty = || async { Ok(String::new()) };
        let error = fetch_token(&empty).await.unwrap_err();
        assert!(error.to_string().contains("empty token"), "{error}");
    }

    #[test]
    fn a_static_token_is_not_printed() {
        let debug = format!("{:?}", StaticToken("s3cr3t".into()));
        assert!(!debug.contains("s3cr3t"), "{debug}");
    }
}
