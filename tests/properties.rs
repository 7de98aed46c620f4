//! Property tests (proptest, bounded case counts so CI stays fast) for everything that
//! reads untrusted input before any state changes: the router, the S3 target resolver
//! and the protection it feeds, tfstate / OpenTofu envelope / LockInfo parsing, and
//! Content-MD5, and the names of a client certificate. Each property says what must
//! hold for every input, not just no panic.

use proptest::prelude::*;

use stategate::http::router::{self, Endpoint};
use stategate::http::s3_target::{self, Addressing};
use stategate::http::upstream::Protection;
use stategate::tfstate::{check_untrusted_json, parse_state, MAX_JSON_DEPTH};
use stategate::tofu::certificate::ClientIdentity;
use stategate::tofu::protocol::{parse_lock_info, verify_content_md5, UnlockRequest};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn addressing() -> Addressing {
    Addressing::new(["127.0.0.1", "localhost"], ["s3.lan"])
}

const STATE_BUCKET: &str = "tf";
const STATE_PREFIX: &str = "stategate/";

/// Ways of writing one path segment that an S3 server may read as the same text.
fn spelled(segment: &str, style: u8) -> String {
    match style % 4 {
        0 => segment.to_string(),
        // Every byte percent-encoded.
        1 => segment.bytes().map(|b| format!("%{b:02X}")).collect(),
        // Lowercase hex for the first byte only.
        2 => match segment.as_bytes().first() {
            Some(b) => format!("%{b:02x}{}", &segment[1..]),
            None => String::new(),
        },
        _ => segment.to_ascii_uppercase(),
    }
}

fn method() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "GET", "HEAD", "PUT", "POST", "DELETE", "LOCK", "UNLOCK", "PATCH",
    ])
}

proptest! {
    #![proptest_config(config())]

    /// The router never panics, and whatever it calls a workspace obeys the name rule,
    /// so a routed name can never mean a path.
    #[test]
    fn router_only_routes_valid_workspaces(
        method in method(),
        path in "(/api/v1/tf/state/|/v1/clusters/|/)?[ -~]{0,80}",
        query in proptest::option::of("[ -~]{0,40}"),
    ) {
        if let Ok(Endpoint::Tf { workspace, .. }) = router::route(method, &path, query.as_deref()) {
            prop_assert!(stategate::names::validate_workspace(&workspace).is_ok());
            prop_assert!(!workspace.contains('/') && !workspace.contains('%'));
        }
    }

    /// No path, query, host or copy source makes the resolver panic; an unknown Host is
    /// always refused rather than guessed.
    #[test]
    fn resolver_is_total(
        method in method(),
        path in "/[ -~]{0,60}",
        query in proptest::option::of("[ -~]{0,40}"),
        host in "[a-zA-Z0-9.:\\[\\]-]{0,30}",
        copy in proptest::option::of("[ -~]{0,40}"),
    ) {
        let mut headers = http::HeaderMap::new();
        if let Some(copy) = copy.as_deref().and_then(|c| http::HeaderValue::from_str(c).ok()) {
            headers.insert("x-amz-copy-source", copy);
        }
        let got = s3_target::resolve(method, &path, query.as_deref(), Some(&host), &headers, &addressing());
        if let Some(h) = s3_target::normalize_host(&host) {
            let ours = ["127.0.0.1", "localhost", "s3.lan"].contains(&h.as_str()) || h.ends_with(".s3.lan");
            if !ours {
                prop_assert!(got.is_err(), "{host} resolved: {got:?}");
            }
        }
    }

    /// The reserved state bucket is refused however the request spells it: slashes,
    /// percent-encoding, case, virtual-host style, or as a copy source.
    #[test]
    fn the_reserved_bucket_is_unreachable(
        method in method(),
        style in 0u8..4,
        leading_slashes in 1usize..4,
        inner_slashes in 1usize..3,
        key in "[a-z0-9/._-]{0,20}",
        vhost in any::<bool>(),
        as_copy_source in any::<bool>(),
        query in prop::sample::select(vec!["", "delete", "list-type=2", "versions", "uploads", "prefix=stategate/"]),
    ) {
        let protection = Protection::ReservedBucket { bucket: STATE_BUCKET.into() };
        let bucket = spelled(STATE_BUCKET, style);
        let slashes = "/".repeat(leading_slashes);
        let inner = "/".repeat(inner_slashes);
        let mut headers = http::HeaderMap::new();
        let (path, host) = if as_copy_source {
            let source = format!("{slashes}{bucket}{inner}{key}");
            headers.insert("x-amz-copy-source", http::HeaderValue::from_str(&source).unwrap());
            ("/user-bucket/copy".to_string(), "127.0.0.1:8080".to_string())
        } else if vhost {
            (format!("{slashes}{key}"), format!("{}.s3.lan", STATE_BUCKET.to_ascii_uppercase()))
        } else {
            (format!("{slashes}{bucket}{inner}{key}"), "localhost:8080".to_string())
        };
        let query = (!query.is_empty()).then_some(query);
        if let Ok(target) = s3_target::resolve(method, &path, query, Some(&host), &headers, &addressing()) {
            prop_assert!(protection.check(&target).is_err(), "{method} {path} {query:?} Host: {host} {headers:?}");
        }
    }

    /// With a shared bucket, no spelling of a key under the state prefix gets through,
    /// and ordinary keys outside it do.
    #[test]
    fn the_shared_prefix_is_unreachable(
        method in prop::sample::select(vec!["GET", "HEAD", "PUT", "DELETE"]),
        style in 0u8..4,
        slashes in 1usize..4,
        rest in "[a-z0-9_-][a-z0-9._-]{0,11}(/[a-z0-9_-][a-z0-9._-]{0,11}){0,2}",
    ) {
        let protection = Protection::SharedBucket { bucket: STATE_BUCKET.into(), prefix: STATE_PREFIX.into() };
        let prefix_dir = spelled("stategate", style);
        let path = format!("/{STATE_BUCKET}{}{prefix_dir}/{rest}", "/".repeat(slashes));
        let headers = http::HeaderMap::new();
        if let Ok(target) = s3_target::resolve(method, &path, None, Some("127.0.0.1"), &headers, &addressing()) {
            prop_assert!(protection.check(&target).is_err(), "{method} {path}");
        }
        let outside = format!("/{STATE_BUCKET}/user/{rest}");
        let target = s3_target::resolve(method, &outside, None, Some("127.0.0.1"), &headers, &addressing()).unwrap();
        prop_assert!(protection.check(&target).is_ok(), "{method} {outside}");
    }

    /// Arbitrary bytes never panic the body parsers; whatever parses as a state has a
    /// non-negative serial and a printable-ASCII lineage.
    #[test]
    fn body_parsers_are_total(body in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(meta) = parse_state(&body) {
            prop_assert!(meta.serial >= 0);
            prop_assert!(meta.lineage.bytes().all(|b| b.is_ascii_graphic()));
        }
        if let Ok(info) = parse_lock_info(&body) {
            prop_assert!(info.id.bytes().all(|b| b.is_ascii_graphic()));
        }
        let _ = UnlockRequest::parse(&body);
        let _ = check_untrusted_json(&body);
        let _ = verify_content_md5(std::str::from_utf8(&body).ok(), &body);
    }

    /// Well-formed states and OpenTofu envelopes parse to exactly their serial and
    /// lineage, whatever else they carry.
    #[test]
    fn states_parse_to_their_serial_and_lineage(
        serial in 0i64..i64::MAX,
        lineage in "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        envelope in any::<bool>(),
        extra in "[a-z]{1,8}",
        depth in 0usize..50,
    ) {
        let nested = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let body = if envelope {
            format!(r#"{{"serial":{serial},"lineage":"{lineage}","meta":{{"{extra}":{nested}}},"encrypted_data":"eA==","encryption_version":"v0"}}"#)
        } else {
            format!(r#"{{"version":4,"serial":{serial},"lineage":"{lineage}","outputs":{{"{extra}":{{"value":{nested}}}}},"resources":[]}}"#)
        };
        let meta = parse_state(body.as_bytes()).unwrap();
        prop_assert_eq!(meta.serial, serial);
        prop_assert_eq!(meta.lineage, lineage);
    }

    /// Nesting is refused exactly beyond the limit, and brackets inside strings don't count.
    #[test]
    fn nesting_limit_is_exact(depth in 0usize..(MAX_JSON_DEPTH + 20), in_string in any::<bool>()) {
        let body = if in_string {
            format!(r#"{{"s":"{}"}}"#, "[".repeat(depth))
        } else {
            format!("{}{}", "[".repeat(depth), "]".repeat(depth))
        };
        let accepted = check_untrusted_json(body.as_bytes()).is_ok();
        prop_assert_eq!(accepted, in_string || depth <= MAX_JSON_DEPTH);
    }
}

/// The DER of a real certificate with DNS, URI, IP and email SANs.
fn san_certificate_der() -> Vec<u8> {
    use base64::Engine;
    let pem = include_str!("../src/tofu/testdata/san.pem");
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .expect("the fixture is PEM")
}

proptest! {
    #![proptest_config(config())]

    /// A client certificate's names are read totally: whatever bytes (a real
    /// certificate with bytes flipped or cut, or noise), no panic, and every name it
    /// answers to could be a configured subject (printable ASCII, bounded, no repeats),
    /// so `cert:<subject>` is always safe to record.
    #[test]
    fn certificate_names_are_total_and_printable(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
        noise in prop::collection::vec(any::<u8>(), 0..200),
        use_noise in any::<bool>(),
    ) {
        let mut der = if use_noise { noise } else { san_certificate_der() };
        for (at, byte) in &flips {
            if !der.is_empty() {
                let i = at.index(der.len());
                der[i] ^= byte;
            }
        }
        if flips.len() == 3 && !der.is_empty() {
            der.truncate(cut.index(der.len()));
        }
        if let Some(identity) = ClientIdentity::from_der(&der) {
            let names = identity.names();
            prop_assert!(!names.is_empty() && names.len() <= 32);
            for (i, name) in names.iter().enumerate() {
                prop_assert!(!name.is_empty() && name.len() <= 253, "{name:?}");
                prop_assert!(name.bytes().all(|b| (0x20..0x7f).contains(&b)), "{name:?}");
                prop_assert_eq!(name.trim(), name.as_str());
                prop_assert!(!names[..i].contains(name), "{name:?} twice");
            }
        }
    }
}
