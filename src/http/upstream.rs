//! The S3 pass-through: where non-stategate requests go, and which of them are refused.
//!
//! Requests are forwarded unchanged (method, path, query, headers including `Host`
//! and the SigV4 `Authorization`, body streamed), so a signature made for
//! stategate's address stays valid at a path-style upstream. The only thing
//! stategate refuses is reaching into its own state prefix, when configured to.

use std::time::Duration;

use bytes::Bytes;

use crate::config::UpstreamConfig;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub host: String,
    pub port: u16,
    pub tls: bool,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// `(bucket, key prefix)` that the pass-through must not expose.
    pub protected: Option<(String, String)>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("upstream endpoint {0:?} must look like http://host:port or https://host[:port]")]
pub struct BadEndpoint(String);

impl Upstream {
    pub fn from_config(
        config: &UpstreamConfig,
        endpoint: &str,
        protected: Option<(String, String)>,
    ) -> Result<Upstream, BadEndpoint> {
        let bad = || BadEndpoint(endpoint.to_string());
        let (tls, rest) = if let Some(rest) = endpoint.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = endpoint.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(bad());
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') || authority.contains('@') {
            return Err(bad());
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !host.ends_with(']') || authority.starts_with('[') => {
                (host.to_string(), port.parse().map_err(|_| bad())?)
            }
            _ => (authority.to_string(), if tls { 443 } else { 80 }),
        };
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Upstream {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            tls,
            connect_timeout: Duration::from_secs(config.connect_timeout_seconds),
            read_timeout: Duration::from_secs(config.read_timeout_seconds),
            protected,
        })
    }

    /// Does this path-style request reach into stategate's own objects?
    pub fn is_protected(&self, path: &str, query: Option<&str>) -> bool {
        let Some((bucket, prefix)) = &self.protected else {
            return false;
        };
        let path = path.trim_start_matches('/');
        let (req_bucket, key) = path.split_once('/').unwrap_or((path, ""));
        if req_bucket != bucket {
            return false;
        }
        let key = percent_decode(key);
        if !key.is_empty() {
            return key.starts_with(prefix.as_str())
                || prefix.starts_with(&key) && key.ends_with('/');
        }
        // Bucket-level: a listing into the prefix, or a multi-object delete (whose body may name our keys).
        form_urlencoded::parse(query.unwrap_or("").as_bytes()).any(|(k, v)| {
            k == "delete"
                || (k == "prefix"
                    && (v.starts_with(prefix.as_str())
                        || prefix.starts_with(v.as_ref()) && !v.is_empty()))
        })
    }
}

pub(crate) fn percent_decode(text: &str) -> String {
    form_urlencoded::parse(format!("k={}", text.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// An S3-style XML error body, which every S3 client knows how to read.
pub fn s3_error(code: &str, message: &str, resource: &str) -> Bytes {
    let escape = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    Bytes::from(format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message><Resource>{}</Resource></Error>",
        escape(code),
        escape(message),
        escape(resource)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(endpoint: &str) -> Result<Upstream, BadEndpoint> {
        Upstream::from_config(
            &UpstreamConfig::default(),
            endpoint,
            Some(("tf".into(), "stategate/".into())),
        )
    }

    #[test]
    fn endpoints() {
        type Expected = Option<(&'static str, u16, bool)>;
        let table: &[(&str, Expected)] = &[
            ("http://127.0.0.1:3900", Some(("127.0.0.1", 3900, false))),
            ("http://127.0.0.1:3900/", Some(("127.0.0.1", 3900, false))),
            ("https://minio.lan", Some(("minio.lan", 443, true))),
            ("http://minio:9000", Some(("minio", 9000, false))),
            ("http://[::1]:9000", Some(("::1", 9000, false))),
            ("ftp://x", None),
            ("http://", None),
            ("http://h:port", None),
            ("http://h:1/path", None),
            ("http://user@h:1", None),
            ("127.0.0.1:3900", None),
        ];
        for (endpoint, expected) in table {
            let got = up(endpoint).ok().map(|u| (u.host.clone(), u.port, u.tls));
            let expected = expected.map(|(h, p, t)| (h.to_string(), p, t));
            assert_eq!(got, expected, "{endpoint}");
        }
    }

    #[test]
    fn protection() {
        let u = up("http://x:1").unwrap();
        let table: &[(&str, Option<&str>, bool)] = &[
            ("/tf/stategate/states/a.blob", None, true),
            ("/tf/stategate%2Fstates/a.blob", None, true),
            ("/tf/stategate/", None, true),
            ("/tf/stategate", None, false),
            ("/tf/other/key", None, false),
            ("/other/stategate/x", None, false),
            ("/tf", Some("list-type=2&prefix=stategate/st"), true),
            ("/tf", Some("list-type=2&prefix=state"), true),
            ("/tf", Some("list-type=2&prefix=docs/"), false),
            ("/tf", Some("list-type=2"), false),
            ("/tf", Some("delete"), true),
            ("/tf/", Some("delete="), true),
            ("/", None, false),
        ];
        for (path, query, expected) in table {
            assert_eq!(u.is_protected(path, *query), *expected, "{path} {query:?}");
        }
        let open = Upstream {
            protected: None,
            ..u
        };
        assert!(!open.is_protected("/tf/stategate/x", None));
    }

    #[test]
    fn xml_errors_are_escaped() {
        let body = s3_error("BadGateway", "a <b> & c", "/x");
        let text = std::str::from_utf8(&body).unwrap();
        assert!(text.contains("<Code>BadGateway</Code>"));
        assert!(text.contains("a &lt;b&gt; &amp; c"));
    }
}
