//! Prometheus metrics, served at `/metrics`. Labels are route names and status
//! codes only: never workspace names or anything a client controls freely.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
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
        Metrics {
            registry,
            requests,
            duration,
        }
    }

    pub fn observe(&self, route: &str, status: u16, seconds: f64) {
        self.requests
            .with_label_values(&[route, &status.to_string()])
            .inc();
        self.duration.with_label_values(&[route]).observe(seconds);
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
    }
}
