//! The S3 store and the pass-through against a REAL S3 server (Garage, started by
//! `scripts/test-all.sh`, which exports `STATEGATE_TEST_S3_*`). Without those
//! variables the tests say so and return, unless `CI` or
//! `STATEGATE_TEST_REQUIRE_S3` is set, in which case they fail.

mod common;

use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use common::{lock_info, state, wait_until, TestServer};
use stategate::config::{Config, S3Config, StoreKind};
use stategate::store::s3::S3Store;
use stategate::store::BlobStore;
use std::time::Duration;

fn s3_env() -> Option<S3Config> {
    let get = |k: &str| std::env::var(format!("STATEGATE_TEST_S3_{k}")).ok();
    let endpoint = common::real_component(
        "STATEGATE_TEST_S3_ENDPOINT",
        "STATEGATE_TEST_REQUIRE_S3",
        "S3",
    )?;
    Some(S3Config {
        endpoint,
        bucket: get("BUCKET").expect("STATEGATE_TEST_S3_BUCKET"),
        region: get("REGION").unwrap_or_else(|| "garage".into()),
        access_key_id: get("ACCESS_KEY_ID").expect("STATEGATE_TEST_S3_ACCESS_KEY_ID"),
        secret_access_key: get("SECRET_ACCESS_KEY")
            .expect("STATEGATE_TEST_S3_SECRET_ACCESS_KEY")
            .into(),
        prefix: format!("test-{}/", uuid::Uuid::new_v4().simple()),
        ..S3Config::default()
    })
}

/// A plain S3 client (what any user tool would be) pointed at `endpoint`.
fn s3_client(endpoint: &str, cfg: &S3Config) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new(cfg.region.clone()))
        .credentials_provider(Credentials::new(
            &cfg.access_key_id,
            cfg.secret_access_key.expose(),
            None,
            None,
            "test",
        ))
        .force_path_style(true)
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

async fn s3_server(cfg: &S3Config) -> TestServer {
    s3_server_with(cfg, |_| {}).await
}

/// The Garage of `scripts/test-all.sh` has one bucket; tests that keep user objects in
/// it next to stategate's prefix opt in to sharing it.
async fn shared_bucket_server(cfg: &S3Config) -> TestServer {
    s3_server_with(cfg, |c| c.upstream.share_state_bucket = true).await
}

async fn s3_server_with(cfg: &S3Config, adjust: impl FnOnce(&mut Config)) -> TestServer {
    let cfg = cfg.clone();
    TestServer::start_with(move |c| {
        c.store.kind = StoreKind::S3;
        c.store.s3 = cfg;
        // Garage's s3_api.root_domain in integration/garage_harness.py.
        c.upstream.root_domains = vec![GARAGE_ROOT_DOMAIN.into()];
        adjust(c);
    })
    .await
}

const GARAGE_ROOT_DOMAIN: &str = "s3.garage.localhost";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_store_round_trip() {
    let Some(cfg) = s3_env() else { return };
    let store = S3Store::new(&cfg);
    store.check().await.unwrap();
    store
        .put("a/b.blob", Bytes::from_static(b"hello"))
        .await
        .unwrap();
    assert_eq!(store.get("a/b.blob").await.unwrap().unwrap(), "hello");
    assert_eq!(store.get("a/missing.blob").await.unwrap(), None);
    assert_eq!(
        store.list("a/").await.unwrap(),
        vec!["a/b.blob".to_string()]
    );
    store.delete("a/b.blob").await.unwrap();
    assert_eq!(store.get("a/b.blob").await.unwrap(), None);

    // Wrong credentials: a clear, non-retryable failure at the startup check.
    let wrong = S3Config {
        secret_access_key: "wrong".into(),
        ..cfg.clone()
    };
    let err = S3Store::new(&wrong).check().await.unwrap_err().to_string();
    assert!(
        err.contains("403") || err.contains("AccessDenied") || err.contains("Forbidden"),
        "{err}"
    );
    // Unreachable endpoint: retryable "unavailable".
    let down = S3Config {
        endpoint: "http://127.0.0.1:9".into(),
        ..cfg.clone()
    };
    let err = S3Store::new(&down).check().await.unwrap_err();
    assert!(
        matches!(err, stategate::store::BlobError::Unavailable(_)),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tf_backend_on_garage_and_tamper_detection() {
    let Some(cfg) = s3_env() else { return };
    let s = s3_server(&cfg).await;
    assert_eq!(send(s.tf("GET", "g")).await, 404);
    assert_eq!(send(s.tf("LOCK", "g").body(lock_info("L"))).await, 200);
    let body = state(1, "lin", "");
    assert_eq!(
        send(s.tf("POST", "g").query(&[("ID", "L")]).body(body.clone())).await,
        200
    );
    assert_eq!(
        s.tf("GET", "g").send().await.unwrap().text().await.unwrap(),
        body
    );
    assert_eq!(send(s.tf("UNLOCK", "g").body(lock_info("L"))).await, 200);

    // Overwrite the blob in the bucket with other content: served never, 5xx always.
    let key: String = s
        .db()
        .query_row(
            "SELECT blob_key FROM versions WHERE scope = 'tf/g'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let direct = s3_client(&cfg.endpoint, &cfg);
    direct
        .put_object()
        .bucket(&cfg.bucket)
        .key(format!("{}{key}", cfg.prefix))
        .body(ByteStream::from_static(b"SGB1 tampered"))
        .send()
        .await
        .unwrap();
    assert_eq!(send(s.tf("GET", "g")).await, 500);
    direct
        .delete_object()
        .bucket(&cfg.bucket)
        .key(format!("{}{key}", cfg.prefix))
        .send()
        .await
        .unwrap();
    assert_eq!(send(s.tf("GET", "g")).await, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_through_forwards_signed_requests_unchanged() {
    let Some(cfg) = s3_env() else { return };
    let s = shared_bucket_server(&cfg).await;
    // The client signs for stategate's address; Garage must accept the forwarded signature.
    let via = s3_client(&s.base, &cfg);
    let key = format!("user-data/{}/small.txt", uuid::Uuid::new_v4().simple());
    via.put_object()
        .bucket(&cfg.bucket)
        .key(&key)
        .body(ByteStream::from_static(b"through stategate"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        read_object(&via, &cfg.bucket, &key).await,
        "through stategate"
    );
    let listed = via
        .list_objects_v2()
        .bucket(&cfg.bucket)
        .prefix("user-data/")
        .send()
        .await
        .unwrap();
    assert!(listed
        .contents()
        .iter()
        .any(|o| o.key() == Some(key.as_str())));

    // Multipart upload > 16 MiB, streamed both ways.
    let big_key = format!("user-data/{}/big.bin", uuid::Uuid::new_v4().simple());
    let part = vec![7u8; 9 * 1024 * 1024];
    let upload = via
        .create_multipart_upload()
        .bucket(&cfg.bucket)
        .key(&big_key)
        .send()
        .await
        .unwrap();
    let upload_id = upload.upload_id().unwrap().to_string();
    let mut parts = Vec::new();
    for n in 1..=2 {
        let out = via
            .upload_part()
            .bucket(&cfg.bucket)
            .key(&big_key)
            .upload_id(&upload_id)
            .part_number(n)
            .body(ByteStream::from(part.clone()))
            .send()
            .await
            .unwrap();
        parts.push(
            aws_sdk_s3::types::CompletedPart::builder()
                .part_number(n)
                .e_tag(out.e_tag().unwrap())
                .build(),
        );
    }
    via.complete_multipart_upload()
        .bucket(&cfg.bucket)
        .key(&big_key)
        .upload_id(&upload_id)
        .multipart_upload(
            aws_sdk_s3::types::CompletedMultipartUpload::builder()
                .set_parts(Some(parts))
                .build(),
        )
        .send()
        .await
        .unwrap();
    let data = read_object(&via, &cfg.bucket, &big_key).await;
    assert_eq!(data.len(), 18 * 1024 * 1024);
    assert!(data.iter().all(|b| *b == 7));

    via.delete_object()
        .bucket(&cfg.bucket)
        .key(&key)
        .send()
        .await
        .unwrap();
    via.delete_object()
        .bucket(&cfg.bucket)
        .key(&big_key)
        .send()
        .await
        .unwrap();
    assert!(via
        .get_object()
        .bucket(&cfg.bucket)
        .key(&key)
        .send()
        .await
        .is_err());

    // stategate's own prefix is not reachable through the pass-through.
    assert_eq!(send(s.tf("POST", "p").body(state(1, "l", ""))).await, 200);
    let blob_key: String = s
        .db()
        .query_row(
            "SELECT blob_key FROM versions WHERE scope = 'tf/p'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let err = via
        .get_object()
        .bucket(&cfg.bucket)
        .key(format!("{}{blob_key}", cfg.prefix))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(403));
    let err = via
        .delete_object()
        .bucket(&cfg.bucket)
        .key(format!("{}{blob_key}", cfg.prefix))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(403));
    assert_eq!(send(s.tf("GET", "p")).await, 200);
}

async fn send(r: reqwest::RequestBuilder) -> u16 {
    common::status(r).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conditional_puts_through_stategate_are_atomic() {
    let Some(cfg) = s3_env() else { return };
    let s = shared_bucket_server(&cfg).await;
    let direct = s3_client(&cfg.endpoint, &cfg);
    let via = s3_client(&s.base, &cfg);

    // Straight at Garage, create-only is not enforced: the second writer wins silently.
    let key = format!("locks/{}.tflock", uuid::Uuid::new_v4().simple());
    let put = |client: &aws_sdk_s3::Client, body: &'static [u8]| {
        client
            .put_object()
            .bucket(&cfg.bucket)
            .key(&key)
            .if_none_match("*")
            .body(ByteStream::from_static(body))
            .send()
    };
    let first = status_of(put(&direct, b"A").await);
    let second = status_of(put(&direct, b"B").await);
    eprintln!("garage direct: If-None-Match:* twice -> {first}, {second}");

    // Through stategate: exactly one of many concurrent create-only writers wins.
    let key = format!("locks/{}.tflock", uuid::Uuid::new_v4().simple());
    let mut tasks = Vec::new();
    for i in 0..8 {
        let req = via
            .put_object()
            .bucket(&cfg.bucket)
            .key(&key)
            .if_none_match("*")
            .body(ByteStream::from(format!("writer-{i}").into_bytes()));
        tasks.push(tokio::spawn(async move {
            req.send().await.map(|o| o.e_tag().map(str::to_string))
        }));
    }
    let mut winners = 0;
    let mut refused = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => winners += 1,
            Err(e) => {
                assert_eq!(
                    e.raw_response().map(|r| r.status().as_u16()),
                    Some(412),
                    "{e:?}"
                );
                refused += 1;
            }
        }
    }
    assert_eq!((winners, refused), (1, 7));

    // If-Match: only the current ETag may replace it.
    let head = via
        .head_object()
        .bucket(&cfg.bucket)
        .key(&key)
        .send()
        .await
        .unwrap();
    let etag = head.e_tag().unwrap().to_string();
    let replace = |etag: String| {
        via.put_object()
            .bucket(&cfg.bucket)
            .key(&key)
            .if_match(etag)
            .body(ByteStream::from_static(b"replaced"))
            .send()
    };
    assert_eq!(status_of(replace("\"not-the-etag\"".into()).await), 412);
    assert_eq!(status_of(replace(etag).await), 200);
    via.delete_object()
        .bucket(&cfg.bucket)
        .key(&key)
        .send()
        .await
        .unwrap();
    // After the delete, create-only succeeds again.
    let again = via
        .put_object()
        .bucket(&cfg.bucket)
        .key(&key)
        .if_none_match("*")
        .body(ByteStream::from_static(b"again"))
        .send()
        .await;
    assert_eq!(status_of(again), 200);
}

/// 200 for success, else the HTTP status the S3 endpoint answered (0 without a response).
fn status_of<T, E>(
    result: Result<T, aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>>,
) -> u16 {
    match result {
        Ok(_) => 200,
        Err(e) => e.raw_response().map_or(0, |r| r.status().as_u16()),
    }
}

async fn read_object(client: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Bytes {
    let object = client
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap();
    object.body.collect().await.unwrap().into_bytes()
}

/// `host:port` of a base URL.
fn authority(base: &str) -> &str {
    base.trim_start_matches("http://")
        .trim_start_matches("https://")
        .trim_end_matches('/')
}

/// Sends one request signed with the store's credentials (SigV4, as any S3 client
/// would sign it) byte for byte as given: path, query and `Host` are not normalized.
/// Returns the status and the whole response text.
/// The request target as Garage (like S3) canonicalizes it for SigV4: the path
/// percent-decoded, then every byte but `A-Za-z0-9-._~/` encoded again; the query as
/// sent (the signer sorts and encodes it).
fn canonical_target(target: &str) -> String {
    use percent_encoding::{percent_decode_str, percent_encode, AsciiSet, NON_ALPHANUMERIC};
    const KEEP: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~')
        .remove(b'/');
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    let decoded: Vec<u8> = percent_decode_str(path).collect();
    let mut out = percent_encode(&decoded, KEEP).to_string();
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

async fn signed_raw(
    cfg: &S3Config,
    to: &str,
    method: &str,
    host: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    use aws_sigv4::http_request::{
        sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
        SigningSettings, UriPathNormalizationMode,
    };
    let identity = Credentials::new(
        &cfg.access_key_id,
        cfg.secret_access_key.expose(),
        None,
        None,
        "test",
    )
    .into();
    // S3's rules: the path is signed as sent, never re-encoded or normalized.
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(&cfg.region)
        .name("s3")
        .time(std::time::SystemTime::now())
        .settings(settings)
        .build()
        .unwrap()
        .into();
    let mut signed_headers = vec![("host", host)];
    signed_headers.extend_from_slice(headers);
    let signable = SignableRequest::new(
        method,
        format!("http://{host}{}", canonical_target(target)),
        signed_headers.into_iter(),
        SignableBody::Bytes(body.as_bytes()),
    )
    .unwrap();
    let (instructions, _) = sign(signable, &params).unwrap().into_parts();
    let mut request = format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n");
    for (name, value) in headers.iter().copied().chain(instructions.headers()) {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    common::raw_request(to, &request, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_bucket_is_reserved_by_default() {
    let Some(cfg) = s3_env() else { return };
    let s = s3_server(&cfg).await;
    let direct = s3_client(&cfg.endpoint, &cfg);
    let via = s3_client(&s.base, &cfg);
    let key = format!("user-data/{}.txt", uuid::Uuid::new_v4().simple());
    // Control: with the same credentials, Garage serves the bucket.
    direct
        .put_object()
        .bucket(&cfg.bucket)
        .key(&key)
        .body(ByteStream::from_static(b"user object"))
        .send()
        .await
        .unwrap();
    let get = via.get_object().bucket(&cfg.bucket).key(&key).send().await;
    assert_eq!(status_of(get), 403);
    let put = via
        .put_object()
        .bucket(&cfg.bucket)
        .key(&key)
        .body(ByteStream::from_static(b"x"))
        .send()
        .await;
    assert_eq!(status_of(put), 403);
    let list = via
        .list_objects_v2()
        .bucket(&cfg.bucket)
        .prefix("user-data/")
        .send()
        .await;
    assert_eq!(status_of(list), 403);
    // Virtual-host style: Garage takes the bucket from Host; stategate refuses it too.
    let vhost = format!("{}.{GARAGE_ROOT_DOMAIN}", cfg.bucket);
    let target = format!("/{key}");
    let (status, text) = signed_raw(&cfg, &cfg.endpoint, "GET", &vhost, &target, &[], "").await;
    assert_eq!(status, 200, "control straight to Garage: {text}");
    assert!(text.contains("user object"), "{text}");
    let (status, text) = signed_raw(&cfg, &s.base, "GET", &vhost, &target, &[], "").await;
    assert_eq!(status, 403, "{text}");
    // The state API itself is unaffected.
    assert_eq!(send(s.tf("POST", "r").body(state(1, "l", ""))).await, 200);
    assert_eq!(send(s.tf("GET", "r")).await, 200);
    let via_store = read_object(&direct, &cfg.bucket, &key).await;
    assert_eq!(via_store, "user object");
    direct
        .delete_object()
        .bucket(&cfg.bucket)
        .key(&key)
        .send()
        .await
        .unwrap();
}

/// How the control straight to Garage shows that the attack reaches protected data.
enum Reaches {
    /// Garage's answer contains this text (the decoy's content or key).
    Shows(String),
    /// The decoy is gone afterwards.
    Deletes,
    /// The decoy holds the user object's content afterwards.
    Overwrites,
    /// This object was created with the decoy's content.
    CopiesTo(String),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_reach_state_objects_on_garage_but_not_through_stategate() {
    let Some(cfg) = s3_env() else { return };
    let s = shared_bucket_server(&cfg).await;
    let direct = s3_client(&cfg.endpoint, &cfg);
    let (b, p) = (cfg.bucket.as_str(), cfg.prefix.as_str());
    let id = uuid::Uuid::new_v4().simple().to_string();
    // A decoy under the protected prefix stands in for a state blob.
    let decoy = format!("{p}states/decoy-{id}.blob");
    let user = format!("user-data/{id}.txt");
    let copy = format!("user-data/{id}-copy.txt");
    let vhost = format!("{b}.{GARAGE_ROOT_DOMAIN}");
    let delete_body =
        format!("<Delete><Object><Key>{decoy}</Key></Object><Quiet>true</Quiet></Delete>");
    let delete_md5 = {
        use base64::Engine;
        use md5::Digest;
        base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(delete_body.as_bytes()))
    };
    let copy_out = format!("{b}/{decoy}");
    let copy_in = format!("{b}/{user}");
    // (what, method, virtual-host Host?, target, headers, body, how Garage shows it works)
    type Case<'a> = (
        &'a str,
        &'a str,
        bool,
        String,
        Vec<(&'a str, &'a str)>,
        &'a str,
        Reaches,
    );
    let cases: Vec<Case> = vec![
        (
            "GET with // after the bucket",
            "GET",
            false,
            format!("/{b}//{decoy}"),
            vec![],
            "",
            Reaches::Shows("DECOY".into()),
        ),
        (
            "GET with %2F in the key",
            "GET",
            false,
            format!("/{b}/{}", decoy.replace('/', "%2F")),
            vec![],
            "",
            Reaches::Shows("DECOY".into()),
        ),
        (
            "GET virtual-host style",
            "GET",
            true,
            format!("/{decoy}"),
            vec![],
            "",
            Reaches::Shows("DECOY".into()),
        ),
        (
            "listing without prefix",
            "GET",
            false,
            format!("/{b}?list-type=2"),
            vec![],
            "",
            Reaches::Shows(decoy.clone()),
        ),
        (
            "listing virtual-host style",
            "GET",
            true,
            "/?list-type=2".into(),
            vec![],
            "",
            Reaches::Shows(decoy.clone()),
        ),
        (
            "copy out of the prefix",
            "PUT",
            false,
            format!("/{b}/{copy}"),
            vec![("x-amz-copy-source", copy_out.as_str())],
            "",
            Reaches::CopiesTo(copy.clone()),
        ),
        (
            "copy over a state object",
            "PUT",
            false,
            format!("/{b}/{decoy}"),
            vec![("x-amz-copy-source", copy_in.as_str())],
            "",
            Reaches::Overwrites,
        ),
        (
            "DELETE with // after the bucket",
            "DELETE",
            false,
            format!("/{b}//{decoy}"),
            vec![],
            "",
            Reaches::Deletes,
        ),
        (
            "bulk delete at /bucket//",
            "POST",
            false,
            format!("/{b}//?delete"),
            vec![("content-md5", delete_md5.as_str())],
            delete_body.as_str(),
            Reaches::Deletes,
        ),
    ];
    let put = |key: String, body: &'static [u8]| {
        direct
            .put_object()
            .bucket(b)
            .key(key)
            .body(ByteStream::from_static(body))
            .send()
    };
    let decoy_now = || async {
        match direct.get_object().bucket(b).key(&decoy).send().await {
            Ok(o) => Some(o.body.collect().await.unwrap().into_bytes()),
            Err(_) => None,
        }
    };
    for (what, method, virtual_host, target, headers, body, reaches) in cases {
        put(decoy.clone(), b"DECOY").await.unwrap();
        put(user.clone(), b"USER").await.unwrap();
        let host_via = if virtual_host {
            vhost.clone()
        } else {
            authority(&s.base).to_string()
        };
        let (status, text) =
            signed_raw(&cfg, &s.base, method, &host_via, &target, &headers, body).await;
        assert_eq!(status, 403, "{what} through stategate: {text}");
        assert!(text.contains("<Code>AccessDenied</Code>"), "{what}: {text}");
        assert_eq!(
            decoy_now().await.as_deref(),
            Some(&b"DECOY"[..]),
            "{what} changed the decoy"
        );
        // Control: the same signed request straight to Garage reaches the decoy.
        let host_direct = if virtual_host {
            vhost.clone()
        } else {
            authority(&cfg.endpoint).to_string()
        };
        let (status, text) = signed_raw(
            &cfg,
            &cfg.endpoint,
            method,
            &host_direct,
            &target,
            &headers,
            body,
        )
        .await;
        assert!(
            (200..300).contains(&status),
            "{what} straight to Garage: {text}"
        );
        match reaches {
            Reaches::Shows(needle) => assert!(text.contains(&needle), "{what}: {text}"),
            Reaches::Deletes => assert_eq!(decoy_now().await, None, "{what}"),
            Reaches::Overwrites => {
                assert_eq!(decoy_now().await.as_deref(), Some(&b"USER"[..]), "{what}")
            }
            Reaches::CopiesTo(key) => {
                assert_eq!(read_object(&direct, b, &key).await, "DECOY", "{what}")
            }
        }
    }
    for key in [&decoy, &user, &copy] {
        let _ = direct.delete_object().bucket(b).key(key).send().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_answers_only_signed_requests_and_guards_the_exact_key() {
    let Some(cfg) = s3_env() else { return };
    let s = shared_bucket_server(&cfg).await;
    let direct = s3_client(&cfg.endpoint, &cfg);
    let b = cfg.bucket.as_str();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let existing = format!("locks/{id}-held.tflock");
    direct
        .put_object()
        .bucket(b)
        .key(&existing)
        .body(ByteStream::from_static(b"held"))
        .send()
        .await
        .unwrap();
    // Unsigned: no 412 (which would say the object exists), the same 403 Garage gives.
    let unsigned = format!(
        "PUT /{b}/{existing} HTTP/1.1\r\nHost: {}\r\nIf-None-Match: *\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
        authority(&s.base)
    );
    let (status, text) = common::raw_request(&s.base, &unsigned, None).await;
    assert_eq!(status, 403, "{text}");
    let unsigned_direct = unsigned.replace(authority(&s.base), authority(&cfg.endpoint));
    let (status, text) = common::raw_request(&cfg.endpoint, &unsigned_direct, None).await;
    assert_eq!(status, 403, "control straight to Garage: {text}");
    assert_eq!(read_object(&direct, b, &existing).await, "held");

    // A raw `&` in the key: the guard checks the whole key, so only one create wins.
    let target = format!("/{b}/locks/{id}-a&b.tflock");
    let me = authority(&s.base).to_string();
    let create = [("if-none-match", "*")];
    let first = signed_raw(&cfg, &s.base, "PUT", &me, &target, &create, "one").await;
    let second = signed_raw(&cfg, &s.base, "PUT", &me, &target, &create, "two").await;
    assert_eq!((first.0, second.0), (200, 412), "{first:?} {second:?}");
    assert_eq!(
        read_object(&direct, b, &format!("locks/{id}-a&b.tflock")).await,
        "one"
    );
    // Control: Garage alone lets the second create overwrite the first.
    let garage = authority(&cfg.endpoint).to_string();
    let target = format!("/{b}/locks/{id}-direct-a&b.tflock");
    let first = signed_raw(&cfg, &cfg.endpoint, "PUT", &garage, &target, &create, "one").await;
    let second = signed_raw(&cfg, &cfg.endpoint, "PUT", &garage, &target, &create, "two").await;
    eprintln!(
        "garage direct: create-only twice -> {}, {}",
        first.0, second.0
    );
    for key in [
        existing,
        format!("locks/{id}-a&b.tflock"),
        format!("locks/{id}-direct-a&b.tflock"),
    ] {
        let _ = direct.delete_object().bucket(b).key(key).send().await;
    }
}

/// A state of `bytes` of padding: above the S3 store's part size it goes up as a
/// multipart upload.
fn big_state(serial: u64, lineage: &str, bytes: usize) -> String {
    let pad = "abcdefghijklmnopqrstuvwxyz0123456789".repeat(bytes / 36 + 1);
    state(
        serial,
        lineage,
        &format!(r#"{{"pad":"{}"}}"#, &pad[..bytes]),
    )
}

/// Objects under the test's prefix (but the installation's own records under
/// `keyring/`, which every start writes) and multipart uploads still open there.
async fn leftovers(client: &aws_sdk_s3::Client, cfg: &S3Config) -> (Vec<String>, Vec<String>) {
    let keyring = format!(
        "{}{}",
        cfg.prefix,
        stategate::store::keyring::KEYRING_PREFIX
    );
    let objects = client
        .list_objects_v2()
        .bucket(&cfg.bucket)
        .prefix(&cfg.prefix)
        .send()
        .await
        .unwrap()
        .contents()
        .iter()
        .filter_map(|o| o.key().map(str::to_string))
        .filter(|k| !k.starts_with(&keyring))
        .collect();
    let uploads = client
        .list_multipart_uploads()
        .bucket(&cfg.bucket)
        .prefix(&cfg.prefix)
        .send()
        .await
        .unwrap()
        .uploads()
        .iter()
        .filter_map(|u| u.key().map(str::to_string))
        .collect();
    (objects, uploads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_states_go_up_as_multipart_and_an_aborted_upload_leaves_nothing() {
    use tokio::io::AsyncWriteExt;
    let Some(cfg) = s3_env() else { return };
    let s = s3_server_with(&cfg, |c| c.max_state_bytes = 32 << 20).await;
    let direct = s3_client(&cfg.endpoint, &cfg);
    let part = stategate::store::s3::PART_SIZE;

    // 12 MiB: three parts, streamed in and out intact.
    let body = big_state(1, "big", 12 << 20);
    assert!(body.len() > 2 * part);
    assert_eq!(send(s.tf("POST", "big").body(body.clone())).await, 200);
    let got = s.tf("GET", "big").send().await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.content_length(), Some(body.len() as u64));
    assert!(got.bytes().await.unwrap() == body.as_bytes());
    let (objects, uploads) = leftovers(&direct, &cfg).await;
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert!(uploads.is_empty(), "{uploads:?}");
    let key: String = s
        .db()
        .query_row(
            "SELECT blob_key FROM versions WHERE scope = 'tf/big'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(objects[0], format!("{}{key}", cfg.prefix));

    // A client gone after more than a part: the multipart upload is aborted.
    let body = big_state(1, "gone", 12 << 20);
    let mut conn = tokio::net::TcpStream::connect(authority(&s.base))
        .await
        .unwrap();
    let head = format!(
        "POST /api/v1/tf/state/gone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n",
        s.bearer("gone"),
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&body.as_bytes()[..part + part / 2])
        .await
        .unwrap();
    // The first part has reached Garage: an upload is open.
    let mut open = Vec::new();
    for _ in 0..500 {
        open = leftovers(&direct, &cfg).await.1;
        if !open.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(open.len(), 1, "the upload never went multipart");
    drop(conn);
    let mut left = leftovers(&direct, &cfg).await;
    for _ in 0..500 {
        if left.1.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        left = leftovers(&direct, &cfg).await;
    }
    assert!(left.1.is_empty(), "upload not aborted: {:?}", left.1);
    assert_eq!(left.0.len(), 1, "only the first state: {:?}", left.0);
    assert_eq!(
        s.count("SELECT count(*) FROM versions WHERE scope = 'tf/gone'"),
        0
    );
    assert_eq!(send(s.tf("GET", "gone")).await, 404);
}

/// A streamed write into S3 collects a whole part (5 MiB) before it goes up: those bytes
/// count in the body budget like every other body byte, so writes cannot pile up part
/// buffers beyond it. (Counting only the 1 MiB pipeline, A would hold 1 MiB here and B
/// would be let in.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_part_buffers_count_in_the_body_budget() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(cfg) = s3_env() else { return };
    let part = stategate::store::s3::PART_SIZE as u64;
    let hold = stategate::http::body::STREAM_RESERVE + part;
    let budget = hold + (64 << 10);
    let s = s3_server_with(&cfg, |c| {
        c.max_state_bytes = 32 << 20;
        c.max_inflight_body_bytes = budget;
    })
    .await;
    let post_head = |ws: &str, len: usize| {
        format!(
            "POST /api/v1/tf/state/{ws} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: {len}\r\n\r\n",
            s.bearer(ws)
        )
    };
    // A sends more than a part and a pipeline's worth of a 12 MiB state, then waits.
    let big = big_state(1, "a", 12 << 20);
    let sent = (hold + part / 4) as usize;
    let mut a = tokio::net::TcpStream::connect(authority(&s.base))
        .await
        .unwrap();
    a.write_all(post_head("a", big.len()).as_bytes())
        .await
        .unwrap();
    a.write_all(&big.as_bytes()[..sent]).await.unwrap();
    let held = || budget - s.app.body_budget.available_bytes();
    wait_until(
        "A to hold a part and its pipeline of the budget",
        Duration::from_secs(20),
        || held() >= hold,
    )
    .await;
    // B's 100 KiB state does not fit in what is left: told to retry, nothing stored.
    let small = big_state(1, "b", 100 << 10);
    let mut b = tokio::net::TcpStream::connect(authority(&s.base))
        .await
        .unwrap();
    b.write_all(post_head("b", small.len()).as_bytes())
        .await
        .unwrap();
    let _ = b.write_all(small.as_bytes()).await; // the server may stop reading early
    let mut reply = Vec::new();
    let _ = b.read_to_end(&mut reply).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 429"), "{reply}");
    assert_eq!(
        s.count("SELECT count(*) FROM versions WHERE scope = 'tf/b'"),
        0
    );
    // A finishes and is stored; its share comes back and B goes in.
    a.write_all(&big.as_bytes()[sent..]).await.unwrap();
    let mut buf = [0u8; 512];
    let n = a.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    drop(a);
    wait_until(
        "A's share of the budget to come back",
        Duration::from_secs(20),
        || held() == 0,
    )
    .await;
    assert_eq!(send(s.tf("POST", "b").body(small)).await, 200);
    let got = s.tf("GET", "a").send().await.unwrap();
    assert_eq!(got.status(), 200);
    assert!(got.bytes().await.unwrap() == big.as_bytes());
}
