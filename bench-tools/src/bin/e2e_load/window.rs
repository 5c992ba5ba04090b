//! Sends with a fixed number in flight, as every produce path's own client does.

use std::fmt::Display;
use std::future::Future;
use std::time::Instant;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

/// Runs `n` sends made by `send`, keeping `in_flight` of them open; returns each send's
/// latency in µs (from its first poll to its result), or the first failure.
pub(crate) async fn send_windowed<F, T, E>(
    n: usize,
    in_flight: usize,
    mut send: impl FnMut() -> F,
) -> Result<Vec<u32>, String>
where
    F: Future<Output = Result<T, E>>,
    E: Display,
{
    let mut latencies = Vec::with_capacity(n);
    let mut pending = FuturesUnordered::new();
    let mut next = 0;
    while next < n || !pending.is_empty() {
        while next < n && pending.len() < in_flight.max(1) {
            let sent = send();
            pending.push(async move {
                let started = Instant::now();
                let result = sent.await;
                (started.elapsed(), result)
            });
            next += 1;
        }
        if let Some((latency, result)) = pending.next().await {
            result.map_err(|e| format!("send: {e}"))?;
            latencies.push(latency.as_micros().min(u128::from(u32::MAX)) as u32);
        }
    }
    Ok(latencies)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    #[tokio::test]
    async fn at_most_the_window_is_open_and_a_failure_ends_the_run() {
        let open = Rc::new(Cell::new(0usize));
        let most = Rc::new(Cell::new(0usize));
        let latencies = send_windowed(10, 3, || {
            let (open, most) = (Rc::clone(&open), Rc::clone(&most));
            async move {
                open.set(open.get() + 1);
                most.set(most.get().max(open.get()));
                // Lets the other open sends start before this one ends.
                tokio::task::yield_now().await;
                open.set(open.get() - 1);
                Ok::<_, String>(())
            }
        })
        .await
        .expect("every send succeeds");
        assert_eq!(latencies.len(), 10);
        assert_eq!(most.get(), 3);
        let mut count = 0;
        let failed = send_windowed(10, 3, || {
            count += 1;
            let fail = count == 4;
            async move { if fail { Err("refused") } else { Ok(()) } }
        })
        .await;
        assert_eq!(failed, Err("send: refused".to_owned()));
    }
}
