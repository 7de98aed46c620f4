//! Prometheus metrics, served at `/metrics`. Labels are route names and status
//! codes only: never workspace names or anything a client controls freely.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
    lock_held: IntGaugeVec,
    lease_held: IntGaugeVec,
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
        for gauge in [&lock_held, &lease_held] {
            registry
                .register(Box::new(gauge.clone()))
                .expect("register once");
        }
        Metrics {
            registry,
            requests,
            duration,
            lock_held,
            lease_held,
        }
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
    }
}
