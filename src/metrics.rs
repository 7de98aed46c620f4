//! Prometheus metrics, served at `/metrics`. Labels are route names, status codes
//! and blob-store operation names only: never workspace names or anything a client
//! controls freely.
//!
//! Besides requests: blob-store latency and errors by operation (`store::metered`),
//! versions and bytes in the index (counted when scraped), the results of retention
//! passes, the time of the last backup an operator alerts on, and each configured
//! drift check's status and time (`drift`).

use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
    lock_held: IntGaugeVec,
    lease_held: IntGaugeVec,
    locks_expired: IntCounterVec,
    drift_status: IntGaugeVec,
    drift_checked: IntGaugeVec,
    store: StoreMetrics,
}

/// What the storage engine and its background work report.
#[derive(Clone)]
struct StoreMetrics {
    op_seconds: HistogramVec,
    op_errors: IntCounterVec,
    versions: IntGauge,
    version_bytes: IntGauge,
    pruned: IntCounter,
    swept: IntCounter,
    unreferenced: IntGauge,
    retention_errors: IntCounter,
    last_retention: Gauge,
    last_backup: Gauge,
    backup_failures: IntCounter,
}

/// The outcome of one retention pass, as metrics see it.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetentionResult {
    pub pruned_versions: u64,
    /// Blobs actually deleted by a sweep.
    pub swept_blobs: u64,
    /// Unreferenced blobs older than an hour left in the store (found, not deleted).
    pub unreferenced_blobs: u64,
    /// Blob deletes that failed (retried by a later pass).
    pub errors: u64,
}

fn register<T: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: T) -> T {
    registry
        .register(Box::new(c.clone()))
        .expect("register once");
    c
}

impl StoreMetrics {
    fn new(r: &Registry) -> Self {
        let gauge =
            |name: &str, help: &str| register(r, IntGauge::new(name, help).expect("valid metric"));
        let counter = |name: &str, help: &str| {
            register(r, IntCounter::new(name, help).expect("valid metric"))
        };
        let time =
            |name: &str, help: &str| register(r, Gauge::new(name, help).expect("valid metric"));
        StoreMetrics {
            op_seconds: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "stategate_store_operation_duration_seconds",
                        "Blob store operation latency by operation (put, get, delete, list)",
                    )
                    .buckets(vec![
                        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
                    ]),
                    &["op"],
                )
                .expect("valid metric"),
            ),
            op_errors: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "stategate_store_operation_errors_total",
                        "Blob store operations that failed, by operation",
                    ),
                    &["op"],
                )
                .expect("valid metric"),
            ),
            versions: gauge(
                "stategate_versions_stored",
                "Version rows in the index (tombstones included)",
            ),
            version_bytes: gauge(
                "stategate_version_bytes_stored",
                "Plaintext bytes of all stored versions",
            ),
            pruned: counter(
                "stategate_pruned_versions_total",
                "Versions removed by retention passes",
            ),
            swept: counter(
                "stategate_swept_blobs_total",
                "Unreferenced blobs deleted by sweeps",
            ),
            unreferenced: gauge(
                "stategate_unreferenced_blobs",
                "Unreferenced blobs older than an hour found by the last retention pass",
            ),
            retention_errors: counter(
                "stategate_retention_errors_total",
                "Failed retention passes and blob deletes",
            ),
            last_retention: time(
                "stategate_last_retention_timestamp_seconds",
                "When the last retention pass finished (Unix time)",
            ),
            last_backup: time(
                "stategate_last_backup_timestamp_seconds",
                "When the newest backup in the store was taken (Unix time; 0: none yet)",
            ),
            backup_failures: counter(
                "stategate_backup_failures_total",
                "Scheduled backups that failed",
            ),
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "stategate_requests_total",
                "Requests answered, by route and status",
            ),
            &["route", "status"],
        )
        .expect("valid metric");
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "stategate_request_duration_seconds",
                "Request latency by route",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
            ]),
            &["route"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(requests.clone()))
            .expect("register once");
        registry
            .register(Box::new(duration.clone()))
            .expect("register once");
        // The one exception to "no client-chosen labels": an alert on a stuck lock must
        // name it. Only held locks are series, so the set stays as small as the locks.
        let lock_held = IntGaugeVec::new(
            Opts::new(
                "stategate_lock_held_seconds",
                "Seconds each workspace lock has been held (only held locks)",
            ),
            &["workspace"],
        )
        .expect("valid metric");
        let lease_held = IntGaugeVec::new(
            Opts::new(
                "stategate_lease_held_seconds",
                "Seconds each cluster lease has been held (only held leases)",
            ),
            &["cluster"],
        )
        .expect("valid metric");
        // Drift series are named by configured workspaces only (operator-chosen).
        let drift_status = IntGaugeVec::new(
            Opts::new(
                "stategate_drift_status",
                "Latest drift check outcome per configured workspace: 0 in sync, 1 drifted, 2 error",
            ),
            &["workspace"],
        )
        .expect("valid metric");
        let drift_checked = IntGaugeVec::new(
            Opts::new(
                "stategate_drift_last_check_timestamp_seconds",
                "When that outcome was found (Unix time; skipped checks do not count)",
            ),
            &["workspace"],
        )
        .expect("valid metric");
        for gauge in [&lock_held, &lease_held, &drift_status, &drift_checked] {
            registry
                .register(Box::new(gauge.clone()))
                .expect("register once");
        }
        let locks_expired = register(
            &registry,
            IntCounterVec::new(
                Opts::new(
                    "stategate_locks_expired_total",
                    "Workspace locks released by a [[lock_policy]] lease, by why their credential is gone",
                ),
                &["why"],
            )
            .expect("valid metric"),
        );
        let store = StoreMetrics::new(&registry);
        Metrics {
            registry,
            requests,
            duration,
            lock_held,
            lease_held,
            locks_expired,
            drift_status,
            drift_checked,
            store,
        }
    }

    /// One blob-store operation (`op` is a fixed name such as "put").
    pub fn observe_store_op(&self, op: &str, seconds: f64, ok: bool) {
        self.store
            .op_seconds
            .with_label_values(&[op])
            .observe(seconds);
        if !ok {
            self.store.op_errors.with_label_values(&[op]).inc();
        }
    }

    /// Versions and their plaintext bytes in the index now.
    pub fn set_stored(&self, versions: i64, bytes: i64) {
        self.store.versions.set(versions);
        self.store.version_bytes.set(bytes);
    }

    pub fn record_retention(&self, result: RetentionResult, unix_seconds: f64) {
        let s = &self.store;
        s.pruned.inc_by(result.pruned_versions);
        s.swept.inc_by(result.swept_blobs);
        s.unreferenced.set(result.unreferenced_blobs as i64);
        s.retention_errors.inc_by(result.errors);
        s.last_retention.set(unix_seconds);
    }

    pub fn retention_failed(&self) {
        self.store.retention_errors.inc();
    }

    /// The newest backup in the store was taken at `unix_seconds`.
    pub fn record_backup(&self, unix_seconds: i64) {
        let gauge = &self.store.last_backup;
        gauge.set(gauge.get().max(unix_seconds as f64));
    }

    pub fn backup_failed(&self) {
        self.store.backup_failures.inc();
    }

    pub fn observe(&self, route: &str, status: u16, seconds: f64) {
        self.requests
            .with_label_values(&[route, &status.to_string()])
            .inc();
        self.duration.with_label_values(&[route]).observe(seconds);
    }

    /// Replaces the lock and lease gauges with the ones held now (freed ones vanish).
    pub fn set_held_locks(&self, locks: &[(String, i64)], leases: &[(String, i64)]) {
        for (gauge, held) in [(&self.lock_held, locks), (&self.lease_held, leases)] {
            gauge.reset();
            for (name, seconds) in held {
                gauge.with_label_values(&[name]).set(*seconds);
            }
        }
    }

    /// A lease released a lock (`why`: a fixed label, `tofu::lock::Gone::label`).
    pub fn lock_expired(&self, why: &str) {
        self.locks_expired.with_label_values(&[why]).inc();
    }

    /// Replaces the drift gauges: (workspace, status 0/1/2, when found in Unix time).
    pub fn set_drift(&self, rows: &[(String, i64, i64)]) {
        self.drift_status.reset();
        self.drift_checked.reset();
        for (workspace, status, at) in rows {
            self.drift_status
                .with_label_values(&[workspace])
                .set(*status);
            self.drift_checked.with_label_values(&[workspace]).set(*at);
        }
    }

    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_retention_and_backup_metrics_render() {
        let m = Metrics::new();
        m.observe_store_op("put", 0.02, true);
        m.observe_store_op("get", 0.5, false);
        m.set_stored(7, 1234);
        let pass = RetentionResult {
            pruned_versions: 3,
            swept_blobs: 0,
            unreferenced_blobs: 2,
            errors: 1,
        };
        m.record_retention(pass, 1_700_000_000.0);
        m.record_retention(pass, 1_700_000_100.0);
        m.record_backup(1_700_000_050);
        m.record_backup(1_600_000_000); // an older one never moves the time back
        let text = String::from_utf8(m.render()).unwrap();
        for line in [
            r#"stategate_store_operation_duration_seconds_count{op="put"} 1"#,
            r#"stategate_store_operation_errors_total{op="get"} 1"#,
            "stategate_versions_stored 7",
            "stategate_version_bytes_stored 1234",
            "stategate_pruned_versions_total 6",
            "stategate_unreferenced_blobs 2",
            "stategate_retention_errors_total 2",
            "stategate_last_retention_timestamp_seconds 1700000100",
            "stategate_last_backup_timestamp_seconds 1700000050",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(!text.contains(r#"stategate_store_operation_errors_total{op="put"}"#));
    }

    #[test]
    fn renders_observations() {
        let m = super::Metrics::new();
        m.observe("tf.get", 200, 0.002);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(
            text.contains(r#"stategate_requests_total{route="tf.get",status="200"} 1"#),
            "{text}"
        );
        m.set_held_locks(&[("prod".into(), 42)], &[("c-1".into(), 7)]);
        m.set_held_locks(&[("dev".into(), 5)], &[]);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(
            text.contains(r#"stategate_lock_held_seconds{workspace="dev"} 5"#),
            "{text}"
        );
        assert!(
            !text.contains(r#"workspace="prod""#) && !text.contains("c-1"),
            "freed locks vanish: {text}"
        );
        m.set_drift(&[("prod".into(), 1, 1_700_000_000)]);
        let text = String::from_utf8(m.render()).unwrap();
        for line in [
            r#"stategate_drift_status{workspace="prod"} 1"#,
            r#"stategate_drift_last_check_timestamp_seconds{workspace="prod"} 1700000000"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
