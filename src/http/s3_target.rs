//! What an S3 request touches, resolved the way the upstream will resolve it. Pure:
//! no I/O, no configuration beyond the [`Addressing`] it is given.
//!
//! The pass-through forwards requests unchanged, so stategate must read them exactly
//! as the S3 server behind it does: the bucket comes from the path (path style) or
//! from `Host` (virtual-host style, `<bucket>.<root domain>`); the key is the rest of
//! the path, percent-decoded (`+` stays a plus, `%2F` becomes `/`, `&` is part of the
//! key). Servers differ in the details (Garage and MinIO trim leading slashes of the
//! key, AWS keeps them; old Garage decoded the whole path before splitting it; some
//! servers clean `.`/`..` segments), so [`Target::locations`] holds *every* plausible
//! reading and a caller protecting data refuses if any of them touches it. The same
//! goes for the copy source of CopyObject/UploadPartCopy (`x-amz-copy-source`).
//!
//! A `Host` that is neither a path-style address nor `<bucket>.<root domain>` is an
//! error, never a guess: the upstream might take the bucket from it.

use http::HeaderMap;
use percent_encoding::percent_decode_str;

/// The names clients use for stategate, and the root domains of virtual-host style.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Addressing {
    path_hosts: Vec<String>,
    root_domains: Vec<String>,
}

impl Addressing {
    /// `path_hosts`: names (or IPs) whose requests are path style. `root_domains`:
    /// `<bucket>.<root domain>` is virtual-host style; the root domain itself is path style.
    /// Names that are not valid hosts are left out.
    pub fn new<H, R>(path_hosts: H, root_domains: R) -> Addressing
    where
        H: IntoIterator,
        H::Item: AsRef<str>,
        R: IntoIterator,
        R::Item: AsRef<str>,
    {
        let clean = |h: &str| normalize_host(h.trim().trim_start_matches('.'));
        let root_domains: Vec<String> = root_domains
            .into_iter()
            .filter_map(|d| clean(d.as_ref()))
            .collect();
        let mut path_hosts: Vec<String> = path_hosts
            .into_iter()
            .filter_map(|h| clean(h.as_ref()))
            .chain(root_domains.iter().cloned())
            .collect();
        path_hosts.sort();
        path_hosts.dedup();
        Addressing {
            path_hosts,
            root_domains,
        }
    }

    /// How the upstream may read a request sent with this `Host`: as path style,
    /// and/or as virtual-host style with one of these buckets (several when root
    /// domains nest). `None`: not a host of ours.
    fn styles(&self, host: &str) -> Option<(bool, Vec<String>)> {
        let host = normalize_host(host)?;
        let vhost: Vec<String> = self
            .root_domains
            .iter()
            .filter_map(|root| {
                host.strip_suffix(root.as_str())
                    .and_then(|rest| rest.strip_suffix('.'))
                    .filter(|bucket| !bucket.is_empty())
                    .map(str::to_string)
            })
            .collect();
        let path = self.path_hosts.contains(&host);
        (path || !vhost.is_empty()).then_some((path, vhost))
    }
}

/// The host name of a `Host` header value: lowercase, without port, brackets or a
/// trailing dot. `None` when it is not a well-formed `host[:port]`.
pub fn normalize_host(authority: &str) -> Option<String> {
    let authority = authority.trim();
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        if !after.is_empty() && !after.starts_with(':') {
            return None;
        }
        (host, after.strip_prefix(':'))
    } else if authority.matches(':').count() > 1 {
        // A bare IPv6 address.
        (authority, None)
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if port.is_some_and(|p| !p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let valid = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b));
    valid.then_some(host)
}

/// The host of a URL such as `https://stategate.lan:8080/x`, normalized.
pub fn host_of_url(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next()?;
    normalize_host(authority.rsplit('@').next().unwrap_or(authority))
}

/// A bucket, or an object in it (`key: None` is the bucket itself).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Location {
    pub bucket: String,
    pub key: Option<String>,
}

/// What a request addressed to a bucket itself (not an object) does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketAccess {
    /// Reads metadata that names no object: HeadBucket, `?location`, `?versioning`,
    /// `?acl`, `?policy`, `?lifecycle`, …
    ReadConfig,
    /// Lists keys: ListObjects(V2), `?versions`, `?uploads`, or anything unrecognized.
    /// `prefixes` are every value of every `prefix`-like parameter (both ways of
    /// reading `+`); `confined` says whether an exact `prefix=` parameter is present.
    List {
        prefixes: Vec<String>,
        confined: bool,
    },
    /// Changes the bucket or many objects at once: PUT/POST/DELETE on the bucket
    /// (`?delete`, PostObject, `?lifecycle`, `?policy`, DeleteBucket, …).
    Write,
}

/// Everything a request touches, under every plausible reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Every (bucket, key) the upstream may read the request as; empty for the
    /// service itself (ListBuckets).
    pub locations: Vec<Location>,
    /// The reading Garage, MinIO and AWS share for ordinary keys: the only one the
    /// conditional guard acts on, and only when no other reading differs from it.
    pub canonical: Option<Location>,
    /// Set when some reading is the bucket itself.
    pub bucket_access: Option<BucketAccess>,
    /// Query parameter names (decoded).
    pub params: Vec<String>,
    /// Every reading of every copy source (`x-amz-copy-source`).
    pub copy_sources: Vec<Location>,
    /// A copy source that is not `bucket/key` (an access point ARN): cannot be judged.
    pub opaque_copy_source: bool,
}

impl Target {
    /// The one object this request addresses, when every reading agrees on it.
    pub fn object(&self) -> Option<(&str, &str)> {
        match (&self.canonical, self.locations.as_slice()) {
            (Some(c), [only]) if c == only => Some((&c.bucket, c.key.as_deref()?)),
            _ => None,
        }
    }

    /// Is a query parameter of this name present (ASCII case ignored)?
    pub fn has_param(&self, name: &str) -> bool {
        self.params.iter().any(|p| p.eq_ignore_ascii_case(name))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("the request has no Host header")]
    NoHost,
    #[error(
        "Host {0:?} is not an address of this stategate: add it to upstream.hosts \
         (STATEGATE_UPSTREAM_HOSTS) for path-style requests, or its parent domain to \
         upstream.root_domains (STATEGATE_UPSTREAM_ROOT_DOMAINS) for <bucket>.<domain> requests"
    )]
    UnknownHost(String),
    #[error("the request path or copy source is not valid percent-encoded UTF-8")]
    BadEncoding,
}

/// Resolves what a pass-through request touches. `path` and `query` are raw (still
/// percent-encoded), as they arrive on the request line.
pub fn resolve(
    method: &str,
    path: &str,
    query: Option<&str>,
    host: Option<&str>,
    headers: &HeaderMap,
    addressing: &Addressing,
) -> Result<Target, TargetError> {
    let host = host
        .filter(|h| !h.trim().is_empty())
        .ok_or(TargetError::NoHost)?;
    let (path_style, vhost_buckets) = addressing.styles(host).ok_or_else(|| {
        TargetError::UnknownHost(
            normalize_host(host).unwrap_or_else(|| host.escape_debug().to_string()),
        )
    })?;

    let (locations, canonical) = locations(path, path_style, &vhost_buckets)?;
    let pairs = query_pairs(query.unwrap_or(""));
    let mut params: Vec<String> = pairs.iter().map(|(k, _)| k.clone()).collect();
    params.dedup();
    let bucket_access = locations
        .iter()
        .any(|l| l.key.is_none())
        .then(|| bucket_access(method, &pairs));
    let (copy_sources, opaque_copy_source) = copy_sources(headers, &pairs)?;
    Ok(Target {
        locations,
        canonical,
        bucket_access,
        params,
        copy_sources,
        opaque_copy_source,
    })
}

/// Every reading of the path, and the canonical one.
fn locations(
    path: &str,
    path_style: bool,
    vhost_buckets: &[String],
) -> Result<(Vec<Location>, Option<Location>), TargetError> {
    let mut locations = Vec::new();
    let mut canonical = None;
    for bucket in vhost_buckets {
        // The upstream takes the bucket from Host when it matches a root domain.
        canonical = Some(Location {
            bucket: bucket.clone(),
            key: canonical_key(path)?,
        });
        for key in key_readings(path.strip_prefix('/').unwrap_or(path))? {
            locations.push(Location {
                bucket: bucket.clone(),
                key,
            });
        }
    }
    if path_style {
        let trimmed = path.trim_start_matches('/');
        if vhost_buckets.is_empty() {
            canonical = canonical_split(trimmed)?;
        }
        if !trimmed.is_empty() {
            locations.extend(split_readings(trimmed)?);
        }
    }
    locations.sort();
    locations.dedup();
    Ok((locations, canonical))
}

/// Every reading of every copy source (header, or a query parameter that servers
/// such as Garage promote to a header in presigned URLs), and whether one of them
/// is not `bucket/key` at all.
fn copy_sources(
    headers: &HeaderMap,
    pairs: &[(String, String)],
) -> Result<(Vec<Location>, bool), TargetError> {
    let from_headers = headers.get_all("x-amz-copy-source").iter().map(|v| {
        v.to_str()
            .map(str::to_string)
            .map_err(|_| TargetError::BadEncoding)
    });
    let from_query = pairs
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("x-amz-copy-source"))
        .map(|(_, v)| Ok(v.clone()));
    let mut out = Vec::new();
    let mut opaque = false;
    for value in from_headers.chain(from_query) {
        let value = value?;
        let value = value.trim();
        let decoded = decode(value)?;
        // An access point ARN names no bucket stategate could compare.
        if decoded
            .trim_start_matches('/')
            .to_ascii_lowercase()
            .starts_with("arn:")
        {
            opaque = true;
            continue;
        }
        out.extend(copy_source_readings(value)?);
    }
    out.sort();
    out.dedup();
    Ok((out, opaque))
}

fn decode(text: &str) -> Result<String, TargetError> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| TargetError::BadEncoding)
}

/// Garage's and MinIO's reading of a path-style `bucket/key…` (leading slashes already
/// trimmed): bucket as sent, key with its leading slashes trimmed, then decoded.
fn canonical_split(trimmed: &str) -> Result<Option<Location>, TargetError> {
    if trimmed.is_empty() {
        return Ok(None);
    }
    let (bucket, rest) = trimmed.split_once('/').unwrap_or((trimmed, ""));
    Ok(Some(Location {
        bucket: bucket.to_string(),
        key: canonical_key(rest)?,
    }))
}

fn canonical_key(raw: &str) -> Result<Option<String>, TargetError> {
    let key = decode(raw.trim_start_matches('/'))?;
    Ok((!key.is_empty()).then_some(key))
}

/// Every reading of `bucket/key…` (path style, or a copy source).
fn split_readings(raw: &str) -> Result<Vec<Location>, TargetError> {
    let mut out = Vec::new();
    // Split first, then decode (Garage, MinIO, AWS); the bucket as sent and decoded.
    let trimmed = raw.trim_start_matches('/');
    let (bucket, rest) = trimmed.split_once('/').unwrap_or((trimmed, ""));
    let has_key_part = trimmed.contains('/');
    for bucket in [bucket.to_string(), decode(bucket)?] {
        if bucket.is_empty() {
            continue;
        }
        let keys = if has_key_part {
            key_readings(rest)?
        } else {
            vec![None]
        };
        for key in keys {
            out.push(Location {
                bucket: bucket.clone(),
                key,
            });
        }
    }
    // Decode first, then split (older Garage): `%2F` can move the bucket boundary.
    let decoded = decode(raw)?;
    let decoded = decoded.trim_start_matches('/');
    if let Some(bucket) = decoded.split('/').next().filter(|b| !b.is_empty()) {
        let rest = decoded.split_once('/').map(|(_, rest)| rest);
        let keys = match rest {
            Some(rest) => decoded_key_readings(rest),
            None => vec![None],
        };
        for key in keys {
            out.push(Location {
                bucket: bucket.to_string(),
                key,
            });
        }
    }
    Ok(out)
}

/// Every reading of the raw (encoded) key part of a path, after the bucket's slash.
fn key_readings(raw: &str) -> Result<Vec<Option<String>>, TargetError> {
    let mut out = decoded_key_readings(&decode(raw)?);
    // Trimming before decoding keeps an encoded leading slash (`%2F…`) in the key.
    out.push(Some(decode(raw.trim_start_matches('/'))?).filter(|k| !k.is_empty()));
    out.sort();
    out.dedup();
    Ok(out)
}

/// Readings of an already decoded key: as is (AWS), leading slashes trimmed
/// (Garage, MinIO), and cleaned of empty, `.` and `..` segments.
fn decoded_key_readings(key: &str) -> Vec<Option<String>> {
    let mut cleaned: Vec<&str> = Vec::new();
    for segment in key.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                cleaned.pop();
            }
            s => cleaned.push(s),
        }
    }
    let mut cleaned = cleaned.join("/");
    if key.ends_with('/') && !cleaned.is_empty() {
        cleaned.push('/');
    }
    let mut out: Vec<Option<String>> = [key, key.trim_start_matches('/'), &cleaned]
        .into_iter()
        .map(|k| (!k.is_empty()).then(|| k.to_string()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Every reading of an `x-amz-copy-source` value: `[/]bucket/key[?versionId=…]`,
/// URL-encoded. Garage keeps a `?versionId=` suffix as part of the key; AWS does not.
fn copy_source_readings(value: &str) -> Result<Vec<Location>, TargetError> {
    let mut out = Vec::new();
    let without_version = value.split_once('?').map(|(before, _)| before);
    for v in std::iter::once(value).chain(without_version) {
        out.extend(split_readings(v)?);
    }
    // An encoded `%3F` is a `?` once decoded: read the part before it as well.
    if let Some((before, _)) = decode(value)?.split_once('?') {
        let before = before.trim_start_matches('/');
        let (bucket, rest) = before.split_once('/').unwrap_or((before, ""));
        out.extend(decoded_key_readings(rest).into_iter().map(|key| Location {
            bucket: bucket.to_string(),
            key,
        }));
    }
    Ok(out)
}

/// Query pairs, decoded both ways a server may read `+` (space, or a literal plus).
fn query_pairs(query: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let plus_literal = query.replace('+', "%2B");
    out.extend(
        form_urlencoded::parse(plus_literal.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned())),
    );
    out.sort();
    out.dedup();
    out
}

/// Bucket-level GET parameters that read configuration and never name objects.
const CONFIG_READS: &[&str] = &[
    "accelerate",
    "acl",
    "analytics",
    "cors",
    "encryption",
    "intelligent-tiering",
    "inventory",
    "lifecycle",
    "location",
    "logging",
    "metrics",
    "notification",
    "object-lock",
    "ownershipControls",
    "policy",
    "policyStatus",
    "publicAccessBlock",
    "replication",
    "requestPayment",
    "tagging",
    "versioning",
    "website",
];

/// Sub-resources that list keys.
const LISTINGS: &[&str] = &["list-type", "versions", "uploads"];

/// Parameters that shape a listing or a signature without choosing the operation.
const MODIFIERS: &[&str] = &[
    "continuation-token",
    "delimiter",
    "encoding-type",
    "fetch-owner",
    "id",
    "key-marker",
    "marker",
    "max-keys",
    "max-uploads",
    "prefix",
    "start-after",
    "upload-id-marker",
    "version-id-marker",
    "x-id",
];

fn bucket_access(method: &str, pairs: &[(String, String)]) -> BucketAccess {
    if !matches!(method, "GET" | "HEAD") {
        return BucketAccess::Write;
    }
    let is = |name: &str, set: &[&str]| set.iter().any(|s| s.eq_ignore_ascii_case(name));
    let keywords: Vec<&str> = pairs
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !is(k, MODIFIERS) && !k.to_ascii_lowercase().starts_with("x-amz-"))
        .collect();
    let lists = keywords.iter().any(|k| is(k, LISTINGS));
    let config_only = keywords.iter().all(|k| is(k, CONFIG_READS));
    if !lists && config_only && (!keywords.is_empty() || method == "HEAD" && pairs.is_empty()) {
        return BucketAccess::ReadConfig;
    }
    BucketAccess::List {
        prefixes: pairs
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("prefix"))
            .map(|(_, v)| v.clone())
            .collect(),
        confined: pairs.iter().any(|(k, _)| k == "prefix"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addressing() -> Addressing {
        Addressing::new(
            ["127.0.0.1", "localhost", "::1", "stategate.lan"],
            ["s3.lan", ".web.example"],
        )
    }

    fn loc(bucket: &str, key: Option<&str>) -> Location {
        Location {
            bucket: bucket.into(),
            key: key.map(str::to_string),
        }
    }

    fn resolve_simple(method: &str, path: &str, query: Option<&str>, host: &str) -> Target {
        resolve(
            method,
            path,
            query,
            Some(host),
            &HeaderMap::new(),
            &addressing(),
        )
        .unwrap_or_else(|e| panic!("{method} {path} {host}: {e}"))
    }

    #[test]
    fn hosts() {
        let table: &[(&str, &str)] = &[
            ("127.0.0.1:8080", "127.0.0.1"),
            ("LOCALHOST", "localhost"),
            ("[::1]:9000", "::1"),
            ("::1", "::1"),
            ("stategate.lan.", "stategate.lan"),
            ("Host.Example:1", "host.example"),
            ("h:", "h"),
        ];
        for (raw, want) in table {
            assert_eq!(normalize_host(raw).as_deref(), Some(*want), "{raw}");
        }
        for bad in [
            "",
            "[::1",
            "[::1]x",
            "h:port",
            "a b",
            "h:1, evil",
            "h/x",
            ":80",
        ] {
            assert_eq!(normalize_host(bad), None, "{bad:?}");
        }
        assert_eq!(
            host_of_url("https://StateGate.lan:8080/x").as_deref(),
            Some("stategate.lan")
        );
        assert_eq!(host_of_url("http://[::1]:1").as_deref(), Some("::1"));
        assert_eq!(host_of_url("http://u:p@h.lan/").as_deref(), Some("h.lan"));
        assert_eq!(host_of_url("http://").as_deref(), None);
    }

    #[test]
    fn styles_by_host() {
        let a = addressing();
        // (Host, path style?, virtual-host bucket)
        type Styles<'a> = Option<(bool, &'a [&'a str])>;
        let table: &[(&str, Styles)] = &[
            ("127.0.0.1:8080", Some((true, &[]))),
            ("localhost:1", Some((true, &[]))),
            ("[::1]:1", Some((true, &[]))),
            ("stategate.lan", Some((true, &[]))),
            ("s3.lan:3900", Some((true, &[]))),
            ("tf.s3.lan:3900", Some((false, &["tf"]))),
            ("TF.S3.LAN", Some((false, &["tf"]))),
            (
                "my.dotted.bucket.s3.lan",
                Some((false, &["my.dotted.bucket"])),
            ),
            ("b.web.example", Some((false, &["b"]))),
            ("tf.s3.lan.", Some((false, &["tf"]))),
            (".s3.lan", None),
            ("evil.lan", None),
            ("s3.lan.evil", None),
            ("xs3.lan", None),
            ("10.0.0.5:8080", None),
            ("127.0.0.1:8080, evil", None),
        ];
        for (host, want) in table {
            let got = a.styles(host);
            let want = want.map(|(p, b)| (p, b.iter().map(|b| b.to_string()).collect()));
            assert_eq!(got, want, "{host}");
        }
        // Nested root domains: every reading of the bucket.
        let nested = Addressing::new(["localhost"], ["lan", "s3.lan"]);
        assert_eq!(
            nested.styles("tf.s3.lan"),
            Some((false, vec!["tf.s3".to_string(), "tf".to_string()]))
        );
    }

    #[test]
    fn unknown_or_missing_hosts_are_errors() {
        let a = addressing();
        let h = HeaderMap::new();
        assert_eq!(
            resolve("GET", "/tf/k", None, None, &h, &a),
            Err(TargetError::NoHost)
        );
        let err = resolve("GET", "/tf/k", None, Some("evil.lan:80"), &h, &a).unwrap_err();
        assert_eq!(err, TargetError::UnknownHost("evil.lan".into()));
        let text = err.to_string();
        assert!(text.contains("upstream.hosts") && text.contains("upstream.root_domains"));
    }

    #[test]
    fn path_and_vhost_readings() {
        type Row<'a> = (&'a str, &'a str, Vec<(&'a str, Option<&'a str>)>);
        let table: Vec<Row> = vec![
            ("127.0.0.1", "/tf/a/b.txt", vec![("tf", Some("a/b.txt"))]),
            ("127.0.0.1", "/tf", vec![("tf", None)]),
            ("127.0.0.1", "/tf/", vec![("tf", None)]),
            ("127.0.0.1", "/", vec![]),
            // `+` is a literal plus, `&` part of the key, `%2F` a slash.
            ("127.0.0.1", "/tf/a+b&c", vec![("tf", Some("a+b&c"))]),
            (
                "127.0.0.1",
                "/tf/a%2Bb%26c%20d",
                vec![("tf", Some("a+b&c d"))],
            ),
            (
                "127.0.0.1",
                "/tf/stategate%2Fstates/x",
                vec![("tf", Some("stategate/states/x"))],
            ),
            // Leading slashes after the bucket: AWS keeps them, Garage/MinIO trim them.
            (
                "127.0.0.1",
                "/tf//stategate/x",
                vec![("tf", Some("/stategate/x")), ("tf", Some("stategate/x"))],
            ),
            (
                "127.0.0.1",
                "//tf///stategate/x",
                vec![("tf", Some("//stategate/x")), ("tf", Some("stategate/x"))],
            ),
            ("127.0.0.1", "/tf//", vec![("tf", None), ("tf", Some("/"))]),
            (
                "127.0.0.1",
                "/tf/%2Fstategate/x",
                vec![("tf", Some("/stategate/x")), ("tf", Some("stategate/x"))],
            ),
            // Dot segments, for servers that clean paths.
            (
                "127.0.0.1",
                "/tf/docs/../stategate/x",
                vec![
                    ("tf", Some("docs/../stategate/x")),
                    ("tf", Some("stategate/x")),
                ],
            ),
            // An encoded bucket, and `%2F` moving the bucket boundary when decoded first.
            (
                "127.0.0.1",
                "/%74f/k",
                vec![("%74f", Some("k")), ("tf", Some("k"))],
            ),
            (
                "127.0.0.1",
                "/tf%2Fstategate%2Fx",
                vec![
                    ("tf", Some("stategate/x")),
                    ("tf%2Fstategate%2Fx", None),
                    ("tf/stategate/x", None),
                ],
            ),
            // Virtual-host style: the whole path is the key.
            (
                "tf.s3.lan",
                "/stategate/x",
                vec![("tf", Some("stategate/x"))],
            ),
            ("tf.s3.lan", "/", vec![("tf", None)]),
            (
                "tf.s3.lan",
                "//stategate/x",
                vec![("tf", Some("/stategate/x")), ("tf", Some("stategate/x"))],
            ),
            // The root domain itself is path style.
            ("s3.lan", "/tf/x", vec![("tf", Some("x"))]),
        ];
        for (host, path, want) in table {
            let t = resolve_simple("GET", path, None, host);
            let mut want: Vec<Location> = want.into_iter().map(|(b, k)| loc(b, k)).collect();
            want.sort();
            assert_eq!(t.locations, want, "{host} {path}");
        }
    }

    #[test]
    fn the_object_is_unambiguous_or_none() {
        type Object<'a> = Option<(&'a str, &'a str)>;
        let table: &[(&str, &str, Object)] = &[
            (
                "127.0.0.1",
                "/tf/locks/a%26b.tflock",
                Some(("tf", "locks/a&b.tflock")),
            ),
            (
                "127.0.0.1",
                "/tf/locks/a&b.tflock",
                Some(("tf", "locks/a&b.tflock")),
            ),
            ("127.0.0.1", "/tf/a+b", Some(("tf", "a+b"))),
            (
                "tf.s3.lan",
                "/locks/x.tflock",
                Some(("tf", "locks/x.tflock")),
            ),
            ("127.0.0.1", "/tf//x", None),
            ("127.0.0.1", "/tf/a/../x", None),
            ("127.0.0.1", "/%74f/x", None),
            ("127.0.0.1", "/tf", None),
            ("127.0.0.1", "/", None),
        ];
        for (host, path, want) in table {
            let t = resolve_simple("PUT", path, None, host);
            assert_eq!(t.object(), *want, "{host} {path}");
        }
    }

    #[test]
    fn bucket_level_access() {
        let list = |prefixes: &[&str], confined| BucketAccess::List {
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            confined,
        };
        let table: Vec<(&str, Option<&str>, BucketAccess)> = vec![
            ("HEAD", None, BucketAccess::ReadConfig),
            ("GET", Some("location"), BucketAccess::ReadConfig),
            ("GET", Some("versioning"), BucketAccess::ReadConfig),
            ("GET", Some("policy"), BucketAccess::ReadConfig),
            (
                "GET",
                Some("lifecycle&x-id=GetBucketLifecycleConfiguration"),
                BucketAccess::ReadConfig,
            ),
            ("GET", None, list(&[], false)),
            ("GET", Some("list-type=2"), list(&[], false)),
            (
                "GET",
                Some("list-type=2&prefix=docs%2F"),
                list(&["docs/"], true),
            ),
            ("GET", Some("prefix=a+b"), list(&["a b", "a+b"], true)),
            ("GET", Some("Prefix=docs/"), list(&["docs/"], false)),
            ("GET", Some("versions&prefix=docs/"), list(&["docs/"], true)),
            ("GET", Some("uploads"), list(&[], false)),
            ("GET", Some("location&versions"), list(&[], false)),
            ("GET", Some("start-after=stategate/"), list(&[], false)),
            ("GET", Some("something-new"), list(&[], false)),
            ("HEAD", Some("list-type=2"), list(&[], false)),
            ("POST", Some("delete"), BucketAccess::Write),
            ("POST", None, BucketAccess::Write),
            ("PUT", Some("lifecycle"), BucketAccess::Write),
            ("PUT", Some("policy"), BucketAccess::Write),
            ("PUT", None, BucketAccess::Write),
            ("DELETE", None, BucketAccess::Write),
            ("DELETE", Some("lifecycle"), BucketAccess::Write),
            ("PATCH", None, BucketAccess::Write),
        ];
        for (method, query, want) in table {
            let t = resolve_simple(method, "/tf", query, "127.0.0.1");
            assert_eq!(t.bucket_access, Some(want), "{method} {query:?}");
        }
        let t = resolve_simple("POST", "/tf//", Some("delete"), "127.0.0.1");
        assert_eq!(t.bucket_access, Some(BucketAccess::Write));
        assert!(t.has_param("delete"));
        assert_eq!(
            resolve_simple("GET", "/tf/k", None, "127.0.0.1").bucket_access,
            None
        );
    }

    #[test]
    fn copy_sources() {
        type Row<'a> = (&'a str, Vec<(&'a str, Option<&'a str>)>);
        let table: Vec<Row> = vec![
            ("tf/a/b", vec![("tf", Some("a/b"))]),
            ("/tf/a/b", vec![("tf", Some("a/b"))]),
            ("tf/a%2Bb%26c", vec![("tf", Some("a+b&c"))]),
            (
                "tf%2Fstategate%2Fx",
                vec![
                    ("tf", Some("stategate/x")),
                    ("tf%2Fstategate%2Fx", None),
                    ("tf/stategate/x", None),
                ],
            ),
            (
                "tf/stategate/x?versionId=3",
                vec![
                    ("tf", Some("stategate/x")),
                    ("tf", Some("stategate/x?versionId=3")),
                ],
            ),
            (
                "tf/stategate/x%3FversionId=3",
                vec![
                    ("tf", Some("stategate/x")),
                    ("tf", Some("stategate/x?versionId=3")),
                ],
            ),
            (
                "tf//stategate/x",
                vec![("tf", Some("/stategate/x")), ("tf", Some("stategate/x"))],
            ),
        ];
        for (value, want) in table {
            let mut headers = HeaderMap::new();
            headers.insert("x-amz-copy-source", value.parse().unwrap());
            let t = resolve(
                "PUT",
                "/other/dst",
                None,
                Some("127.0.0.1"),
                &headers,
                &addressing(),
            )
            .unwrap();
            let mut want: Vec<Location> = want.into_iter().map(|(b, k)| loc(b, k)).collect();
            want.sort();
            assert_eq!(t.copy_sources, want, "{value}");
            assert!(!t.opaque_copy_source);
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-amz-copy-source",
            "arn:aws:s3:us-east-1:1:accesspoint/ap/object/k"
                .parse()
                .unwrap(),
        );
        let t = resolve(
            "PUT",
            "/o/d",
            None,
            Some("127.0.0.1"),
            &headers,
            &addressing(),
        )
        .unwrap();
        assert!(t.opaque_copy_source);
        // A copy source smuggled in the query is read too.
        let t = resolve_simple("PUT", "/o/d", Some("X-Amz-Copy-Source=tf%2Fk"), "127.0.0.1");
        assert!(t.copy_sources.contains(&loc("tf", Some("k"))));
    }

    #[test]
    fn bad_encodings_are_errors() {
        let h = HeaderMap::new();
        let a = addressing();
        assert_eq!(
            resolve("GET", "/tf/%FF%FE", None, Some("localhost"), &h, &a),
            Err(TargetError::BadEncoding)
        );
        // Not a valid escape: kept literally, as every server does.
        let t = resolve_simple("GET", "/tf/100%zz", None, "localhost");
        assert_eq!(t.object(), Some(("tf", "100%zz")));
    }
}
