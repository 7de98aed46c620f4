//! A prompt, clean stop on SIGTERM.
//!
//! pingora's SIGTERM path stops accepting, then sleeps through the whole grace period
//! before it drops its runtimes, so even an idle server needed `shutdown_grace_seconds`
//! (and more) to exit and `docker stop` ended in SIGKILL. Here every request holds an
//! [`InflightGuard`] from the moment its header is read until it is done, and
//! [`ExitWhenDrained`] ends the process as soon as shutdown has begun and none is left.
//! The grace period stays the upper bound for requests that do not finish.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pingora::server::ShutdownWatch;
use tokio::sync::Notify;

/// Counts the requests in flight.
#[derive(Clone, Default)]
pub struct Inflight(Arc<Counter>);

#[derive(Default)]
struct Counter {
    requests: AtomicUsize,
    drained: Notify,
}

/// One request in flight; dropping it ends the request.
pub struct InflightGuard(Arc<Counter>);

impl Inflight {
    pub fn enter(&self) -> InflightGuard {
        self.0.requests.fetch_add(1, Ordering::SeqCst);
        InflightGuard(self.0.clone())
    }

    pub fn count(&self) -> usize {
        self.0.requests.load(Ordering::SeqCst)
    }

    /// Resolves once no request is in flight.
    pub async fn drained(&self) {
        loop {
            // Registered before the check, so a guard dropped in between still wakes us.
            let notified = self.0.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if self.0.requests.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.drained.notify_waiters();
        }
    }
}

/// Exits the process once pingora's shutdown has begun and the last request is done,
/// running the second field first (the server checkpoints its index there).
pub struct ExitWhenDrained(pub Inflight, pub Box<dyn Fn() + Send + Sync>);

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for ExitWhenDrained {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        while !*shutdown.borrow_and_update() {
            if shutdown.changed().await.is_err() {
                return;
            }
        }
        let waiting = self.0.count();
        if waiting > 0 {
            tracing::info!(
                requests = waiting,
                "stopping: waiting for requests in flight"
            );
        }
        self.0.drained().await;
        (self.1)();
        tracing::info!("stopped: no request in flight");
        crate::log::flush();
        // pingora would only exit after its fixed grace-period sleep; nothing is left
        // to finish, and everything stategate writes is durable once acknowledged.
        std::process::exit(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Poll;

    async fn poll_once<F: Future>(mut f: Pin<&mut F>) -> Poll<F::Output> {
        std::future::poll_fn(move |cx| Poll::Ready(f.as_mut().poll(cx))).await
    }

    #[tokio::test]
    async fn drained_resolves_when_the_last_request_ends() {
        let inflight = Inflight::default();
        assert!(poll_once(std::pin::pin!(inflight.drained()))
            .await
            .is_ready());

        let (a, b) = (inflight.enter(), inflight.enter());
        assert_eq!(inflight.count(), 2);
        let mut drained = std::pin::pin!(inflight.drained());
        assert!(poll_once(drained.as_mut()).await.is_pending());
        drop(a);
        assert!(poll_once(drained.as_mut()).await.is_pending());
        drop(b);
        assert!(poll_once(drained.as_mut()).await.is_ready());
        assert_eq!(inflight.count(), 0);
    }
}
