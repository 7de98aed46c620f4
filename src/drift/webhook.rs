//! Signed drift events to the configured webhook URLs.
//!
//! Each delivery is a JSON POST with `X-Stategate-Signature: t=<unix>,v1=<hex>`, the
//! HMAC-SHA256 of `"<t>.<body>"` under the DEK-derived webhook secret
//! (`RootKey::webhook_secret`, used as text). The body carries the same `timestamp`,
//! so a receiver can refuse replays of old events. Delivery runs on its own task,
//! with a per-attempt timeout and a bounded number of attempts with doubling backoff:
//! a hanging or failing endpoint delays nothing else.

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The signature header.
pub const SIGNATURE_HEADER: &str = "X-Stategate-Signature";

/// `t=<timestamp>,v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>`.
pub fn signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

/// Does `header` sign `body` under `secret`, no older than `max_age` seconds at `now`?
/// (What a receiver does; stategate's own tests use it.)
pub fn verify(secret: &str, header: &str, body: &[u8], now: i64, max_age: i64) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", value)) => t = value.parse::<i64>().ok(),
            Some(("v1", value)) => v1 = Some(value),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return false;
    };
    let expected = signature(secret, t, body);
    let expected = expected.rsplit("v1=").next().unwrap_or_default();
    (now - t).abs() <= max_age && crate::crypto::secrets_equal(v1.as_bytes(), expected.as_bytes())
}

/// Where and how events are delivered.
#[derive(Clone)]
pub struct Notifier {
    urls: Vec<String>,
    secret: String,
    attempts: u32,
    /// Wait before the second attempt; doubled before each next one.
    backoff: Duration,
    client: reqwest::Client,
}

/// What happened to one event at one URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The endpoint as [`redacted`]: fit for a log or a terminal.
    pub url: String,
    pub attempts: u32,
    /// The last HTTP status, if any answer came.
    pub status: Option<u16>,
    pub delivered: bool,
}

/// A webhook URL as it may be shown: scheme, host and port only. Paths and queries of
/// webhook URLs are often the credential itself (Slack, Discord, chat bridges), and a
/// secret never reaches a log.
pub fn redacted(url: &str) -> String {
    match url.parse::<http::Uri>() {
        Ok(uri) => {
            let scheme = uri.scheme_str().unwrap_or("?");
            let authority = uri.authority().map_or("?", |a| a.as_str());
            // Userinfo (`user:pass@`) is a credential too.
            let host = authority.rsplit('@').next().unwrap_or(authority);
            let rest = uri.path_and_query().map_or("", |p| p.as_str());
            let more = if rest.is_empty() || rest == "/" {
                ""
            } else {
                "/…"
            };
            format!("{scheme}://{host}{more}")
        }
        Err(_) => "<not a URL>".into(),
    }
}

impl Notifier {
    pub fn new(
        urls: Vec<String>,
        secret: String,
        attempts: u32,
        timeout: Duration,
        backoff: Duration,
    ) -> Self {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("a client with rustls builds");
        Notifier {
            urls,
            secret,
            attempts: attempts.max(1),
            backoff,
            client,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// Sends `event` (a JSON object; `timestamp` is added) to every URL on a spawned
    /// task; the handle resolves when every URL was delivered to or given up on.
    pub fn send(&self, mut event: serde_json::Value) -> tokio::task::JoinHandle<Vec<Delivery>> {
        let timestamp = crate::clock::now_utc().unix_timestamp();
        if let Some(fields) = event.as_object_mut() {
            fields.insert("timestamp".into(), timestamp.into());
        }
        let body = event.to_string();
        let signed = signature(&self.secret, timestamp, body.as_bytes());
        let this = self.clone();
        tokio::spawn(async move {
            let mut all = Vec::new();
            let tasks: Vec<_> = this
                .urls
                .iter()
                .map(|url| {
                    let (this, url, body, signed) =
                        (this.clone(), url.clone(), body.clone(), signed.clone());
                    tokio::spawn(async move { this.deliver(url, body, signed).await })
                })
                .collect();
            for task in tasks {
                if let Ok(done) = task.await {
                    all.push(done);
                }
            }
            all
        })
    }

    async fn deliver(&self, target: String, body: String, signed: String) -> Delivery {
        let url = redacted(&target);
        let mut wait = self.backoff;
        let mut status = None;
        for attempt in 1..=self.attempts {
            let sent = self
                .client
                .post(&target)
                .header("Content-Type", "application/json")
                .header("User-Agent", "stategate-drift")
                .header(SIGNATURE_HEADER, &signed)
                .body(body.clone())
                .send()
                .await;
            let error = match sent {
                Ok(resp) if resp.status().is_success() => {
                    tracing::info!(url = %url, attempt, status = resp.status().as_u16(), "drift webhook delivered");
                    return Delivery {
                        url,
                        attempts: attempt,
                        status: Some(resp.status().as_u16()),
                        delivered: true,
                    };
                }
                Ok(resp) => {
                    status = Some(resp.status().as_u16());
                    format!("answered {}", resp.status())
                }
                Err(e) if e.is_timeout() => "timed out".to_string(),
                Err(e) => format!("failed: {}", e.without_url()),
            };
            tracing::warn!(url = %url, attempt, of = self.attempts, error = %error, "drift webhook not delivered");
            if attempt < self.attempts {
                tokio::time::sleep(wait).await;
                wait = wait.saturating_mul(2);
            }
        }
        tracing::warn!(url = %url, attempts = self.attempts, "drift webhook given up");
        Delivery {
            url,
            attempts: self.attempts,
            status,
            delivered: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_path_query_or_userinfo() {
        let cases = [
            (
                "https://hooks.slack.com/services/T0/B0/SECRET",
                "https://hooks.slack.com/…",
            ),
            (
                "http://127.0.0.1:8080/hook?token=SECRET",
                "http://127.0.0.1:8080/…",
            ),
            ("https://user:SECRET@example.com/x", "https://example.com/…"),
            ("https://example.com", "https://example.com"),
            ("https://example.com/", "https://example.com"),
            ("not a url", "<not a URL>"),
        ];
        for (url, shown) in cases {
            assert_eq!(redacted(url), shown, "{url}");
            assert!(!redacted(url).contains("SECRET"));
        }
    }

    #[test]
    fn signature_is_hmac_sha256_of_timestamp_dot_body() {
        // Recomputed independently: HMAC-SHA256("secret", "1700000000.{}").
        let mut mac = Hmac::<Sha256>::new_from_slice(b"secret").unwrap();
        mac.update(b"1700000000.{}");
        let want = format!(
            "t=1700000000,v1={}",
            hex::encode(mac.finalize().into_bytes())
        );
        assert_eq!(signature("secret", 1_700_000_000, b"{}"), want);
    }

    #[test]
    fn verification_refuses_tampering_other_keys_and_old_events() {
        let header = signature("k", 1000, b"body");
        let table: &[(&str, &str, &[u8], i64, bool)] = &[
            ("k", &header, b"body", 1000, true),
            ("k", &header, b"body", 1200, true),
            ("k", &header, b"body", 1301, false),
            ("k", &header, b"bodx", 1000, false),
            ("other", &header, b"body", 1000, false),
            ("k", "t=1000", b"body", 1000, false),
            ("k", "", b"body", 1000, false),
            (
                "k",
                &header.replace("t=1000", "t=1001"),
                b"body",
                1000,
                false,
            ),
        ];
        for (secret, header, body, now, want) in table {
            assert_eq!(verify(secret, header, body, *now, 300), *want, "{header}");
        }
    }
}
