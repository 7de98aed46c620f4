//! A [`BlobStore`] wrapper that times every operation and counts failures into
//! [`Metrics`] (`stategate_store_operation_*`), whatever the store is. `serve` wraps
//! its store with it; the operator commands do not (they export no metrics).

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;

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

    async fn get(&self, key: &str) -> Result<Option<Bytes>, BlobError> {
        let started = Instant::now();
        let result = self.inner.get(key).await;
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

    async fn check(&self) -> Result<(), BlobError> {
        self.inner.check().await
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
        let text = String::from_utf8(metrics.render()).unwrap();
        for line in [
            r#"stategate_store_operation_duration_seconds_count{op="put"} 1"#,
            r#"stategate_store_operation_duration_seconds_count{op="get"} 2"#,
            r#"stategate_store_operation_duration_seconds_count{op="list"} 1"#,
            r#"stategate_store_operation_errors_total{op="get"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
