//! The S3 pass-through: where non-stategate requests go, and which of them are refused.
//!
//! Requests are forwarded unchanged (method, path, query, headers including `Host`
//! and the SigV4 `Authorization`, body streamed), so a signature made for
//! stategate's address stays valid at the upstream. What stategate refuses is
//! decided by [`Protection`] on the [`Target`] that `s3_target` resolved: the state
//! bucket is reserved whole, or, when shared by opt-in, stategate's prefix in it is.
//! Protection follows the bucket *name* whenever the store is S3; it is never
//! switched off because the upstream is spelled differently from the store.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;

use super::s3_target::{Addressing, BucketAccess, Location, Target};
use crate::config::UpstreamConfig;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub host: String,
    pub port: u16,
    pub tls: bool,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// What the pass-through must not expose.
    pub protection: Protection,
    /// Which `Host` values are ours, and how each names a bucket.
    pub addressing: Addressing,
}

/// What of the S3 store the pass-through keeps clients away from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Protection {
    /// The store is not S3: there is nothing of stategate's behind the upstream.
    Off,
    /// The state bucket is stategate's alone: every request naming it is refused.
    ReservedBucket { bucket: String },
    /// Opt-in (`upstream.share_state_bucket`): user objects may live in the state
    /// bucket outside `prefix`; nothing may read, write, list or copy under it.
    SharedBucket { bucket: String, prefix: String },
}

/// Why a request is refused: S3's `403 AccessDenied`, with this message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied(pub &'static str);

impl Protection {
    /// Decides a resolved request. Every reading of the target and of its copy
    /// sources must pass.
    pub fn check(&self, target: &Target) -> Result<(), Denied> {
        match self {
            Protection::Off => Ok(()),
            Protection::ReservedBucket { bucket } => {
                let ours = |l: &Location| same_bucket(&l.bucket, bucket);
                if target.locations.iter().any(ours) {
                    return Err(Denied(
                        "this bucket is reserved for stategate's state and is not reachable through the pass-through",
                    ));
                }
                if target.copy_sources.iter().any(ours) || target.opaque_copy_source {
                    return Err(Denied(
                        "the copy source is in the bucket reserved for stategate's state",
                    ));
                }
                Ok(())
            }
            Protection::SharedBucket { bucket, prefix } => {
                let prefixes = protected_prefixes(prefix);
                let touches = |l: &Location| {
                    same_bucket(&l.bucket, bucket)
                        && l.key.as_deref().is_none_or(|k| under(k, &prefixes))
                };
                for l in target
                    .locations
                    .iter()
                    .filter(|l| same_bucket(&l.bucket, bucket))
                {
                    if target.has_param("delete") {
                        return Err(Denied(
                            "multi-object delete is not allowed in the bucket that holds stategate's state",
                        ));
                    }
                    match &l.key {
                        Some(key) if under(key, &prefixes) => {
                            return Err(Denied(
                                "this prefix holds stategate's state blobs and is not reachable through the pass-through",
                            ))
                        }
                        Some(_) => {}
                        None => bucket_level(target.bucket_access.as_ref(), &prefixes)?,
                    }
                }
                if target.copy_sources.iter().any(touches) || target.opaque_copy_source {
                    return Err(Denied("the copy source is under stategate's state prefix"));
                }
                Ok(())
            }
        }
    }
}

/// Bucket names compare exactly, and case-insensitively too: a server that folds
/// case must not be a way around the check.
fn same_bucket(a: &str, b: &str) -> bool {
    a == b || a.to_lowercase() == b.to_lowercase()
}

/// The protected prefix as configured, and as a server that trims leading slashes
/// stores it.
fn protected_prefixes(prefix: &str) -> Vec<String> {
    let mut out = vec![
        prefix.to_lowercase(),
        prefix.trim_start_matches('/').to_lowercase(),
    ];
    out.dedup();
    out
}

/// Is `key` under a protected prefix? Case is ignored (a store on a case-folding
/// file system maps `STATEGATE/…` onto `stategate/…`).
fn under(key: &str, prefixes: &[String]) -> bool {
    let key = key.to_lowercase();
    prefixes.iter().any(|p| key.starts_with(p.as_str()))
}

/// A listing may only show keys that cannot be under the protected prefix; anything
/// else done to the bucket itself is refused.
fn bucket_level(access: Option<&BucketAccess>, prefixes: &[String]) -> Result<(), Denied> {
    match access {
        Some(BucketAccess::ReadConfig) => Ok(()),
        Some(BucketAccess::List { prefixes: asked, confined: true })
            if asked.iter().all(|q| disjoint(q, prefixes)) =>
        {
            Ok(())
        }
        Some(BucketAccess::List { .. }) => Err(Denied(
            "listing the bucket that holds stategate's state needs a prefix= outside stategate's prefix",
        )),
        Some(BucketAccess::Write) | None => Err(Denied(
            "changing the bucket that holds stategate's state is not allowed through the pass-through",
        )),
    }
}

fn disjoint(asked: &str, prefixes: &[String]) -> bool {
    let asked = asked.to_lowercase();
    !asked.is_empty()
        && prefixes
            .iter()
            .all(|p| !asked.starts_with(p.as_str()) && !p.starts_with(asked.as_str()))
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("upstream endpoint {0:?} must look like http://host:port or https://host[:port]")]
pub struct BadEndpoint(String);

/// Scheme, host and port of an `http(s)://host[:port]` endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub tls: bool,
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    pub fn parse(endpoint: &str) -> Result<Endpoint, BadEndpoint> {
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
        Ok(Endpoint {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            tls,
        })
    }
}

/// Is the upstream provably the store (so the store's credentials check what the
/// upstream holds)? Same scheme, same port, and host names that resolved to at
/// least one common address. `Err` says why not, for the startup log.
pub fn same_server(
    upstream: &Endpoint,
    upstream_addrs: &[IpAddr],
    store: &Endpoint,
    store_addrs: &[IpAddr],
) -> Result<(), String> {
    if upstream.tls != store.tls {
        return Err("the upstream and the store use different schemes (http vs https)".into());
    }
    if upstream.port != store.port {
        return Err(format!(
            "the upstream port {} is not the store port {}",
            upstream.port, store.port
        ));
    }
    if upstream_addrs.is_empty() || store_addrs.is_empty() {
        return Err(format!(
            "{} or {} did not resolve at startup",
            upstream.host, store.host
        ));
    }
    if !upstream_addrs.iter().any(|a| store_addrs.contains(a)) {
        return Err(format!(
            "{} and {} resolve to different addresses",
            upstream.host, store.host
        ));
    }
    Ok(())
}

impl Upstream {
    pub fn from_config(
        config: &UpstreamConfig,
        endpoint: &str,
        protection: Protection,
        addressing: Addressing,
    ) -> Result<Upstream, BadEndpoint> {
        let Endpoint { tls, host, port } = Endpoint::parse(endpoint)?;
        Ok(Upstream {
            host,
            port,
            tls,
            connect_timeout: Duration::from_secs(config.connect_timeout_seconds),
            read_timeout: Duration::from_secs(config.read_timeout_seconds),
            protection,
            addressing,
        })
    }
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
    use crate::http::s3_target::resolve;
    use http::HeaderMap;

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
            let got = Endpoint::parse(endpoint)
                .ok()
                .map(|u| (u.host.clone(), u.port, u.tls));
            let expected = expected.map(|(h, p, t)| (h.to_string(), p, t));
            assert_eq!(got, expected, "{endpoint}");
        }
    }

    fn addressing() -> Addressing {
        Addressing::new(["127.0.0.1"], ["s3.lan"])
    }

    /// (method, Host, path, query, copy source) → refused?
    type Case<'a> = (
        &'a str,
        &'a str,
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        bool,
    );

    fn run(protection: &Protection, table: &[Case]) {
        for (method, host, path, query, copy, refused) in table {
            let mut headers = HeaderMap::new();
            if let Some(c) = copy {
                headers.insert("x-amz-copy-source", c.parse().unwrap());
            }
            let target =
                resolve(method, path, *query, Some(host), &headers, &addressing()).unwrap();
            assert_eq!(
                protection.check(&target).is_err(),
                *refused,
                "{method} {host}{path}?{query:?} copy={copy:?}: {target:?}"
            );
        }
    }

    const H: &str = "127.0.0.1:8080";

    #[test]
    fn a_reserved_state_bucket_is_unreachable_in_every_addressing_form() {
        let p = Protection::ReservedBucket {
            bucket: "tf".into(),
        };
        run(
            &p,
            &[
                ("GET", H, "/tf/stategate/states/a.blob", None, None, true),
                ("GET", H, "/tf/user/file.txt", None, None, true),
                (
                    "GET",
                    H,
                    "/tf",
                    Some("list-type=2&prefix=docs/"),
                    None,
                    true,
                ),
                ("HEAD", H, "/tf", None, None, true),
                ("DELETE", H, "/tf//stategate/x", None, None, true),
                ("POST", H, "/tf//", Some("delete"), None, true),
                ("GET", H, "/TF/x", None, None, true),
                ("GET", H, "/%74f/x", None, None, true),
                ("GET", H, "/%2Ftf/x", None, None, true),
                ("GET", "tf.s3.lan", "/stategate/x", None, None, true),
                ("GET", "TF.s3.lan:3900", "/", None, None, true),
                ("PUT", H, "/other/x", None, Some("tf/stategate/x"), true),
                ("PUT", H, "/other/x", None, Some("/TF/a"), true),
                ("PUT", H, "/other/x", None, Some("tf%2Fa"), true),
                (
                    "PUT",
                    H,
                    "/other/x",
                    Some("partNumber=1&uploadId=u"),
                    Some("tf/a"),
                    true,
                ),
                (
                    "PUT",
                    H,
                    "/other/x",
                    None,
                    Some("arn:aws:s3:r:1:accesspoint/a/object/k"),
                    true,
                ),
                // Other buckets and the service itself pass.
                ("GET", H, "/other/stategate/x", None, None, false),
                ("GET", H, "/tfx/k", None, None, false),
                ("GET", H, "/", None, None, false),
                ("GET", "other.s3.lan", "/stategate/x", None, None, false),
                ("PUT", H, "/other/x", None, Some("other/tf/x"), false),
                ("POST", H, "/other", Some("delete"), None, false),
            ],
        );
    }

    #[test]
    fn a_shared_state_bucket_protects_the_prefix_listings_copies_and_the_bucket() {
        let p = Protection::SharedBucket {
            bucket: "tf".into(),
            prefix: "stategate/".into(),
        };
        run(
            &p,
            &[
                // Keys, after every normalization.
                ("GET", H, "/tf/stategate/states/a.blob", None, None, true),
                ("GET", H, "/tf/stategate%2Fstates/a.blob", None, None, true),
                (
                    "DELETE",
                    H,
                    "/tf//stategate/states/a.blob",
                    None,
                    None,
                    true,
                ),
                ("GET", H, "//tf///stategate/x", None, None, true),
                ("GET", H, "/tf/%2Fstategate/x", None, None, true),
                ("GET", H, "/tf/docs/../stategate/x", None, None, true),
                ("GET", H, "/tf/StateGate/x", None, None, true),
                ("GET", H, "/tf/stategate/", None, None, true),
                ("PUT", H, "/tf/stategate/x", Some("tagging"), None, true),
                ("POST", H, "/tf/stategate/x", Some("uploads"), None, true),
                ("GET", "tf.s3.lan", "/stategate/x", None, None, true),
                ("GET", "tf.s3.lan", "//stategate/x", None, None, true),
                // Listings.
                ("GET", H, "/tf", None, None, true),
                ("GET", H, "/tf", Some("list-type=2"), None, true),
                (
                    "GET",
                    H,
                    "/tf",
                    Some("list-type=2&start-after=stategate/"),
                    None,
                    true,
                ),
                ("GET", H, "/tf", Some("marker=stategate/"), None, true),
                (
                    "GET",
                    H,
                    "/tf",
                    Some("list-type=2&prefix=stategate/st"),
                    None,
                    true,
                ),
                (
                    "GET",
                    H,
                    "/tf",
                    Some("list-type=2&prefix=state"),
                    None,
                    true,
                ),
                ("GET", H, "/tf", Some("list-type=2&prefix="), None, true),
                (
                    "GET",
                    H,
                    "/tf",
                    Some("list-type=2&Prefix=docs/"),
                    None,
                    true,
                ),
                (
                    "GET",
                    H,
                    "/tf",
                    Some("prefix=docs/&prefix=stategate/"),
                    None,
                    true,
                ),
                ("GET", H, "/tf", Some("versions"), None, true),
                ("GET", H, "/tf", Some("uploads"), None, true),
                ("GET", "tf.s3.lan", "/", Some("list-type=2"), None, true),
                (
                    "GET",
                    H,
                    "/tf",
                    Some("list-type=2&prefix=docs/"),
                    None,
                    false,
                ),
                ("GET", H, "/tf/", Some("versions&prefix=docs/"), None, false),
                ("GET", H, "/tf", Some("uploads&prefix=docs/"), None, false),
                (
                    "GET",
                    "tf.s3.lan",
                    "/",
                    Some("list-type=2&prefix=docs/"),
                    None,
                    false,
                ),
                // Bulk delete and every bucket-level write.
                ("POST", H, "/tf", Some("delete"), None, true),
                ("POST", H, "/tf//", Some("delete"), None, true),
                ("POST", H, "/tf/docs/x", Some("delete"), None, true),
                ("POST", H, "/tf", None, None, true),
                ("PUT", H, "/tf", Some("lifecycle"), None, true),
                ("PUT", H, "/tf", Some("policy"), None, true),
                ("DELETE", H, "/tf", None, None, true),
                ("DELETE", H, "/tf", Some("lifecycle"), None, true),
                // Bucket-level reads of configuration pass.
                ("HEAD", H, "/tf", None, None, false),
                ("GET", H, "/tf", Some("location"), None, false),
                ("GET", H, "/tf", Some("versioning"), None, false),
                // Copies, both directions.
                (
                    "PUT",
                    H,
                    "/tf/docs/x",
                    None,
                    Some("tf/stategate/states/a"),
                    true,
                ),
                (
                    "PUT",
                    H,
                    "/other/x",
                    None,
                    Some("/tf/stategate/a?versionId=1"),
                    true,
                ),
                ("PUT", H, "/other/x", None, Some("tf//stategate/a"), true),
                ("PUT", H, "/other/x", None, Some("tf%2Fstategate%2Fa"), true),
                ("PUT", H, "/tf/stategate/a", None, Some("other/x"), true),
                ("PUT", H, "/tf/docs/y", None, Some("tf/docs/x"), false),
                ("PUT", H, "/other/y", None, Some("tf/docs/x"), false),
                // User objects outside the prefix pass.
                ("GET", H, "/tf/docs/x", None, None, false),
                ("PUT", H, "/tf/stategate", None, None, false),
                ("DELETE", H, "/tf/state/x", None, None, false),
                ("GET", "tf.s3.lan", "/docs/x", None, None, false),
            ],
        );
    }

    #[test]
    fn off_protects_nothing() {
        run(
            &Protection::Off,
            &[("GET", H, "/tf/stategate/x", None, None, false)],
        );
    }

    #[test]
    fn the_guard_runs_only_against_a_proven_store() {
        let ep = |tls, host: &str, port| Endpoint {
            tls,
            host: host.into(),
            port,
        };
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let v6: IpAddr = "::1".parse().unwrap();
        // (upstream, its addresses, store, its addresses, same?)
        type Row = (Endpoint, Vec<IpAddr>, Endpoint, Vec<IpAddr>, bool);
        let table: Vec<Row> = vec![
            (
                ep(false, "localhost", 3900),
                vec![v6, lo],
                ep(false, "127.0.0.1", 3900),
                vec![lo],
                true,
            ),
            (
                ep(false, "garage", 3900),
                vec![other],
                ep(false, "garage", 3900),
                vec![other],
                true,
            ),
            (
                ep(true, "s3.lan", 443),
                vec![other],
                ep(false, "s3.lan", 443),
                vec![other],
                false,
            ),
            (
                ep(false, "localhost", 3900),
                vec![lo],
                ep(false, "localhost", 3901),
                vec![lo],
                false,
            ),
            (
                ep(false, "a", 3900),
                vec![lo],
                ep(false, "b", 3900),
                vec![other],
                false,
            ),
            (
                ep(false, "a", 3900),
                vec![],
                ep(false, "a", 3900),
                vec![],
                false,
            ),
        ];
        for (up, up_addrs, store, store_addrs, same) in table {
            let got = same_server(&up, &up_addrs, &store, &store_addrs);
            assert_eq!(got.is_ok(), same, "{up:?} {store:?}: {got:?}");
        }
    }

    #[test]
    fn xml_errors_are_escaped() {
        let body = s3_error("BadGateway", "a <b> & c", "/x");
        let text = std::str::from_utf8(&body).unwrap();
        assert!(text.contains("<Code>BadGateway</Code>"));
        assert!(text.contains("a &lt;b&gt; &amp; c"));
    }
}
