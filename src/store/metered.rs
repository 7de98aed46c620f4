//! A [`BlobStore`] wrapper that times every operation and counts failures into
//! [`Metrics`] (`stategate_store_operation_*`), whatever the store is. `serve` wraps
//! its store with it; the operator commands do not (they export no metrics).

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;

use super::blob::{BlobReader, BlobSink};
use super::{BlobError, BlobStore};
use crate::metrics::Metrics;

pub struct MeteredStore {
    inner: Arc<dyn BlobStore>,
    metrics: Metrics,
}

impl MeteredStore {
    pub fn wrap(inner: Arc<dyn BlobStore>, metrics: Metrics) -> Arc<dyn BlobStore> {
        Arc::new(MeteredStore { inner, metrics })
    }

    fn record<T>(&self, op: &str, started: Instant, result: &Result<T, BlobError>) {
        self.metrics
            .observe_store_op(op, started.elapsed().as_secs_f64(), result.is_ok());
    }
}

#[async_trait]
impl BlobStore for MeteredStore {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), BlobError> {
        let started = Instant::now();
        let result = self.inner.put(key, data).await;
        self.record("put", started, &result);
        result
    }

    async fn create(&self, key: &str) -> Result<Box<dyn BlobSink>, BlobError> {
        let started = Instant::now();
        let result = self.inner.create(key).await;
        match result {
            Ok(inner) => Ok(Box::new(MeteredSink {
                inner,
                metrics: self.metrics.clone(),
                busy: started.elapsed(),
            })),
            Err(e) => {
                let failed = Err(e);
                self.record("put", started, &failed);
                failed
            }
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>, BlobError> {
        let started = Instant::now();
        let result = self.inner.get(key).await;
        self.record("get", started, &result);
        result
    }

    /// Timed until the reader is open (the first piece's latency); the rest of the
    /// read is paced by the client, which is not the store's time.
    async fn read(&self, key: &str) -> Result<Option<BlobReader>, BlobError> {
        let started = Instant::now();
        let result = self.inner.read(key).await;
        self.record("get", started, &result);
        result
    }

    async fn delete(&self, key: &str) -> Result<(), BlobError> {
        let started = Instant::now();
        let result = self.inner.delete(key).await;
        self.record("delete", started, &result);
        result
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, BlobError> {
        let started = Instant::now();
        let result = self.inner.list(prefix).await;
        self.record("list", started, &result);
        result
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn write_buffer_bytes(&self) -> u64 {
        self.inner.write_buffer_bytes()
    }

    async fn check(&self) -> Result<(), BlobError> {
        self.inner.check().await
    }
}

/// A streamed write, observed as one `put` of the time spent inside the store's own
/// calls (not the time waiting for the client's next bytes in between). An aborted
/// write is the client's doing and records nothing; a failed piece counts as a failed put.
struct MeteredSink {
    inner: Box<dyn BlobSink>,
    metrics: Metrics,
    busy: std::time::Duration,
}

#[async_trait]
impl BlobSink for MeteredSink {
    async fn write(&mut self, data: Bytes) -> Result<(), BlobError> {
        let started = Instant::now();
        let result = self.inner.write(data).await;
        self.busy += started.elapsed();
        if result.is_err() {
            self.metrics
                .observe_store_op("put", self.busy.as_secs_f64(), false);
        }
        result
    }

    async fn finish(self: Box<Self>) -> Result<(), BlobError> {
        let started = Instant::now();
        let result = self.inner.finish().await;
        let busy = self.busy + started.elapsed();
        self.metrics
            .observe_store_op("put", busy.as_secs_f64(), result.is_ok());
        result
    }

    async fn abort(self: Box<Self>) {
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LocalStore;

    #[tokio::test]
    async fn operations_are_timed_and_failures_counted() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let store = MeteredStore::wrap(
            Arc::new(LocalStore::open(dir.path()).unwrap()),
            metrics.clone(),
        );
        store.put("a/b", Bytes::from_static(b"x")).await.unwrap();
        assert!(store.get("a/b").await.unwrap().is_some());
        assert_eq!(store.list("a/").await.unwrap(), vec!["a/b".to_string()]);
        assert!(store.get("../escape").await.is_err());
        let mut sink = store.create("a/c").await.unwrap();
        sink.write(Bytes::from_static(b"streamed")).await.unwrap();
        sink.finish().await.unwrap();
        store.create("a/d").await.unwrap().abort().await;
        let mut reader = store.read("a/c").await.unwrap().unwrap();
        assert_eq!(reader.len, 8);
        assert_eq!(
            reader.chunks.recv().await.unwrap().unwrap(),
            &b"streamed"[..]
        );
        let text = String::from_utf8(metrics.render()).unwrap();
        for line in [
            r#"stategate_store_operation_duration_seconds_count{op="put"} 2"#,
            r#"stategate_store_operation_duration_seconds_count{op="get"} 3"#,
            r#"stategate_store_operation_duration_seconds_count{op="list"} 1"#,
            r#"stategate_store_operation_errors_total{op="get"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
