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
use common::{lock_info, state, TestServer};
use stategate::config::{S3Config, StoreKind};
use stategate::store::s3::S3Store;
use stategate::store::BlobStore;

fn s3_env() -> Option<S3Config> {
    let get = |k: &str| std::env::var(format!("STATEGATE_TEST_S3_{k}")).ok();
    let Some(endpoint) = get("ENDPOINT") else {
        let required = std::env::var_os("CI").is_some()
            || std::env::var_os("STATEGATE_TEST_REQUIRE_S3").is_some();
        assert!(
            !required,
            "STATEGATE_TEST_S3_* not set but a real S3 is required here"
        );
        eprintln!("STATEGATE_TEST_S3_ENDPOINT not set: skipping the real-S3 test (run scripts/test-all.sh)");
        return None;
    };
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
    let cfg = cfg.clone();
    TestServer::start_with(move |c| {
        c.store.kind = StoreKind::S3;
        c.store.s3 = cfg;
    })
    .await
}

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
    let s = s3_server(&cfg).await;
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
    let s = s3_server(&cfg).await;
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
