//! The HTTP state backend in-process: real gateway, real SQLite, local blob store.

mod common;

use base64::Engine;
use common::{lock_info, state, status, wait_until, TestServer};
use md5::Digest;

/// Contended LOCKs are refused from a reader: however many clients retry a held lock,
/// none of their refusals (held by another, or frozen) queues on the index writer in
/// front of the holder's POST and UNLOCK, and each still carries the holder's (or the
/// freeze's) LockInfo. The holder's retry and a free lock still go to the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_locks_never_reach_the_index_writer() {
    let s = TestServer::start().await;
    let store = s.app.tofu.store();
    assert_eq!(status(s.tf("LOCK", "w").body(lock_info("L1"))).await.0, 200);
    let before = store.writer_jobs();
    for i in 0..20 {
        let (code, body) = status(s.tf("LOCK", "w").body(lock_info(&format!("X{i}")))).await;
        assert_eq!(code, 423);
        assert!(body.contains("\"L1\""), "{body}");
    }
    assert_eq!(
        store.writer_jobs(),
        before,
        "a refused LOCK ran on the writer"
    );
    assert_eq!(status(s.tf("LOCK", "w").body(lock_info("L1"))).await.0, 200);
    assert_eq!(
        status(s.tf("UNLOCK", "w").body(lock_info("L1"))).await.0,
        200
    );
    assert!(store.writer_jobs() >= before + 2);
    // A freeze refuses from the reader too, with the freeze's LockInfo.
    s.app
        .tofu
        .freeze("w", "incident 7", None, "operator:ops@example.com")
        .await
        .unwrap();
    let before = store.writer_jobs();
    for i in 0..5 {
        let (code, body) = status(s.tf("LOCK", "w").body(lock_info(&format!("F{i}")))).await;
        assert_eq!(code, 423);
        assert!(body.contains("incident 7"), "{body}");
    }
    assert_eq!(store.writer_jobs(), before);
    assert_eq!(s.count("SELECT count(*) FROM tf_locks"), 0);
}

/// The lock row and freeze a LOCK's credential lookup reads on the same snapshot
/// (`TofuBackend::authenticate_lock`) answer only after the credential: a wrong one, or
/// another workspace's, gets the 401 of any refusal, never the holder's LockInfo.
#[tokio::test]
async fn a_held_lock_never_answers_before_authentication() {
    let s = TestServer::start().await;
    assert_eq!(status(s.tf("LOCK", "w").body(lock_info("L1"))).await.0, 200);
    let other = s.bearer("other");
    for password in [None, Some("wrong"), Some(other.as_str())] {
        let req = s.tf_as("LOCK", "w", password).body(lock_info("L2"));
        let (code, text) = status(req).await;
        assert_eq!(code, 401, "{password:?}: {text}");
        assert!(
            !text.contains("L1") && !text.contains("tester@host"),
            "{text}"
        );
    }
    // The holder's own retry is still theirs; the lock is unchanged.
    assert_eq!(status(s.tf("LOCK", "w").body(lock_info("L1"))).await.0, 200);
    assert_eq!(
        s.count("SELECT count(*) FROM tf_locks WHERE lock_id = 'L1'"),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_get_lock_write_unlock() {
    let s = TestServer::start().await;
    let ws = "prod";
    assert_eq!(status(s.tf("GET", ws)).await.0, 404);

    assert_eq!(
        status(s.tf("LOCK", ws).body(lock_info("L1"))).await,
        (200, String::new())
    );
    // The holder's retry after a lost response is still a 200.
    assert_eq!(status(s.tf("LOCK", ws).body(lock_info("L1"))).await.0, 200);
    // Another client gets 423 with the CURRENT holder's LockInfo (it must contain ID).
    let (code, body) = status(s.tf("LOCK", ws).body(lock_info("L2"))).await;
    assert_eq!(code, 423);
    let holder: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(holder["ID"], "L1");
    assert_eq!(holder["Who"], "tester@host");

    let body1 = state(1, "lin", "");
    let w = s.tf("POST", ws).query(&[("ID", "L1")]).body(body1.clone());
    assert_eq!(status(w).await.0, 200);
    let (code, got) = status(s.tf("GET", ws)).await;
    assert_eq!((code, got), (200, body1.clone()));

    // Writes without the lock or with another ID are refused while locked.
    let (code, body) = status(s.tf("POST", ws).body(state(2, "lin", ""))).await;
    assert_eq!(code, 423);
    assert!(body.contains("L1"));
    assert_eq!(
        status(
            s.tf("POST", ws)
                .query(&[("ID", "L2")])
                .body(state(2, "lin", ""))
        )
        .await
        .0,
        423
    );

    // Unlock with another ID is refused; with the right one succeeds; again is idempotent.
    assert_eq!(
        status(s.tf("UNLOCK", ws).body(lock_info("L2"))).await.0,
        423
    );
    assert_eq!(
        status(s.tf("UNLOCK", ws).body(lock_info("L1"))).await.0,
        200
    );
    assert_eq!(
        status(s.tf("UNLOCK", ws).body(lock_info("L1"))).await.0,
        200
    );

    // Unlocked: a write without ID is accepted; one with a stale ID is refused (lock lost).
    assert_eq!(
        status(s.tf("POST", ws).body(state(2, "lin", ""))).await.0,
        200
    );
    assert_eq!(
        status(
            s.tf("POST", ws)
                .query(&[("ID", "L1")])
                .body(state(3, "lin", ""))
        )
        .await
        .0,
        409
    );
    assert_eq!(
        s.count("SELECT count(*) FROM versions WHERE scope = 'tf/prod'"),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_retry_creates_no_second_version() {
    let s = TestServer::start().await;
    let body = state(5, "lin", "");
    for _ in 0..3 {
        assert_eq!(status(s.tf("POST", "w").body(body.clone())).await.0, 200);
    }
    assert_eq!(s.count("SELECT count(*) FROM versions"), 1);
    assert_eq!(s.blob_files().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_both_dialects_and_gitlab_style_paths() {
    let s = TestServer::start().await;
    let lock_url = format!("{}/lock", s.url("w"));
    let client = reqwest::Client::new();
    let auth = |r: reqwest::RequestBuilder| r.bearer_auth(s.bearer("w"));

    // lock_method = "POST" on .../lock, unlock_method = "DELETE".
    assert_eq!(
        status(auth(client.post(&lock_url)).body(lock_info("A")))
            .await
            .0,
        200
    );
    assert_eq!(
        status(auth(client.post(&lock_url)).body(lock_info("B")))
            .await
            .0,
        423
    );
    // Terraform's force-unlock: empty body.
    assert_eq!(status(auth(client.delete(&lock_url))).await.0, 200);
    assert_eq!(s.count("SELECT count(*) FROM tf_locks"), 0);

    // OpenTofu >= 1.10 force-unlock: {"ID": ...} of the holder.
    assert_eq!(status(s.tf("LOCK", "w").body(lock_info("C"))).await.0, 200);
    assert_eq!(
        status(s.tf("UNLOCK", "w").body(r#"{"ID":"C"}"#)).await.0,
        200
    );
    assert_eq!(s.count("SELECT count(*) FROM tf_locks"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_is_per_workspace_and_gives_no_hints() {
    let s = TestServer::start().await;
    let client = reqwest::Client::new();
    let url = s.url("a");
    let cases: Vec<(reqwest::RequestBuilder, u16)> = vec![
        (client.get(&url), 401),
        (client.get(&url).basic_auth("stategate", Some("wrong")), 401),
        (
            client
                .get(&url)
                .basic_auth("stategate", Some(s.bearer("b"))),
            401,
        ),
        (client.get(&url).bearer_auth(s.bearer("b")), 401),
        (client.get(&url).header("Authorization", "Basic %%%"), 401),
        (client.get(&url).bearer_auth(s.bearer("a")), 404),
        (
            client.get(&url).basic_auth("anyone", Some(s.bearer("a"))),
            404,
        ),
    ];
    let mut bodies = std::collections::HashSet::new();
    for (req, expected) in cases {
        let (code, body) = status(req).await;
        assert_eq!(code, expected, "{body}");
        if code == 401 {
            bodies.insert(body);
        }
    }
    assert_eq!(bodies.len(), 1, "401 bodies must not differ by cause");
    // Unauthorized writes change nothing.
    let (code, _) = status(
        client
            .post(&url)
            .bearer_auth("nope")
            .body(state(1, "l", "")),
    )
    .await;
    assert_eq!(code, 401);
    assert_eq!(s.count("SELECT count(*) FROM versions"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_rejected_and_changes_nothing() {
    let s = TestServer::start_with(|c| c.max_state_bytes = 4096).await;
    let md5 = |b: &str| base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(b));
    let good = state(1, "l", "");
    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (s.tf("POST", "w").body("not json"), 400, "not a Terraform"),
        (s.tf("POST", "w").body("[1,2]"), 400, "JSON object"),
        (
            s.tf("POST", "w").body(r#"{"hello":"world"}"#),
            400,
            "version",
        ),
        (
            s.tf("POST", "w")
                .body(r#"{"version":4,"serial":"x","lineage":"l"}"#),
            400,
            "serial",
        ),
        (s.tf("POST", "w").body("x".repeat(5000)), 413, "limit"),
        (
            s.tf("POST", "w")
                .header("Content-MD5", md5("other"))
                .body(good.clone()),
            400,
            "Content-MD5",
        ),
        (s.tf("LOCK", "w").body(r#"{"Who":"x"}"#), 400, "ID"),
        (s.tf("LOCK", "w").body("garbage"), 400, "LockInfo"),
        (s.tf("LOCK", "w").body("x".repeat(70_000)), 413, "limit"),
        (s.tf("PUT", "w").body(good.clone()), 405, "not allowed"),
        (s.tf("PROPFIND", "w"), 405, "not allowed"),
    ];
    for (req, code, needle) in cases {
        let (got, body) = status(req).await;
        assert_eq!(got, code, "{body}");
        assert!(body.contains(needle), "{body} lacks {needle}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(json["error"].is_string());
    }
    assert_eq!(s.count("SELECT count(*) FROM versions"), 0);
    assert_eq!(s.count("SELECT count(*) FROM tf_locks"), 0);
    assert!(s.blob_files().is_empty());
    // A correct Content-MD5 is accepted.
    let (code, _) = status(
        s.tf("POST", "w")
            .header("Content-MD5", md5(&good))
            .body(good),
    )
    .await;
    assert_eq!(code, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_workspace_names_are_400() {
    let s = TestServer::start().await;
    let long = "a".repeat(1024);
    let names = [
        "%2e%2e",
        "..",
        "..%2Fetc",
        ".x",
        "a%00b",
        "a\x01b",
        long.as_str(),
        "%20",
    ];
    for name in names {
        // Raw requests: a client library would normalize some of these paths away.
        let request =
            format!("GET /api/v1/tf/state/{name} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (code, text) = common::raw_request(&s.base, &request, None).await;
        assert_eq!(code, 400, "{name}: {text}");
        assert!(text.contains("invalid workspace name"), "{text}");
    }
    let (code, _) = common::raw_request(
        &s.base,
        "GET /api/v1/tf/state/../../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        None,
    )
    .await;
    assert_eq!(code, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_corrupt_blob_is_5xx_never_404() {
    let s = TestServer::start().await;
    assert_eq!(
        status(s.tf("POST", "w").body(state(1, "l", ""))).await.0,
        200
    );
    let blob = s.blob_files().pop().unwrap();

    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    let (code, body) = status(s.tf("GET", "w")).await;
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("cannot be read"));
    assert!(
        !body.contains("states/"),
        "internal paths must not leak: {body}"
    );

    std::fs::remove_file(&blob).unwrap();
    assert_eq!(status(s.tf("GET", "w")).await.0, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_are_encrypted_and_bound_to_their_version() {
    let s = TestServer::start().await;
    let secret = r#"{"type":"terraform_data","name":"password-hunter2"}"#;
    assert_eq!(
        status(s.tf("POST", "w").body(state(1, "l", secret)))
            .await
            .0,
        200
    );
    assert_eq!(
        status(s.tf("POST", "w").body(state(2, "l", ""))).await.0,
        200
    );
    let files = s.blob_files();
    assert_eq!(files.len(), 2);
    for f in &files {
        let raw = std::fs::read(f).unwrap();
        assert!(!String::from_utf8_lossy(&raw).contains("hunter2"));
    }
    // Copying version 1's blob over version 2's must not serve version 1's content.
    std::fs::copy(&files[0], &files[1]).unwrap();
    assert_eq!(status(s.tf("GET", "w")).await.0, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_tombstones_and_respects_the_lock() {
    let s = TestServer::start().await;
    assert_eq!(
        status(s.tf("POST", "w").body(state(1, "l", ""))).await.0,
        200
    );
    assert_eq!(status(s.tf("LOCK", "w").body(lock_info("X"))).await.0, 200);
    assert_eq!(status(s.tf("DELETE", "w")).await.0, 423);
    assert_eq!(
        status(s.tf("UNLOCK", "w").body(lock_info("X"))).await.0,
        200
    );
    assert_eq!(status(s.tf("DELETE", "w")).await.0, 200);
    assert_eq!(status(s.tf("GET", "w")).await.0, 404);
    // History is kept: the old version's blob is still there.
    assert_eq!(s.blob_files().len(), 1);
    assert_eq!(s.count("SELECT count(*) FROM versions"), 2);
    // A new state after deletion starts cleanly.
    assert_eq!(
        status(s.tf("POST", "w").body(state(1, "new", ""))).await.0,
        200
    );
    assert_eq!(status(s.tf("GET", "w")).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_lockers_exactly_one_wins() {
    let s = TestServer::start().await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let req = s.tf("LOCK", "race").body(lock_info(&format!("id-{i}")));
        tasks.push(tokio::spawn(async move {
            req.send().await.unwrap().status().as_u16()
        }));
    }
    let mut codes = Vec::new();
    for t in tasks {
        codes.push(t.await.unwrap());
    }
    assert_eq!(codes.iter().filter(|c| **c == 200).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 423).count(), 15, "{codes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_unlocked_writers_get_distinct_versions() {
    let s = TestServer::start().await;
    let mut tasks = Vec::new();
    for i in 0..12 {
        let req = s.tf("POST", "w").body(state(i, "l", ""));
        tasks.push(tokio::spawn(async move {
            req.send().await.unwrap().status().as_u16()
        }));
    }
    // The write guard refuses a serial lower than the one stored by then (409); every
    // write it lets through gets its own version number, with no gaps.
    let mut stored = 0;
    for t in tasks {
        let code = t.await.unwrap();
        assert!(code == 200 || code == 409, "{code}");
        stored += i64::from(code == 200);
    }
    assert!(stored >= 1, "the highest serial is never refused");
    assert_eq!(s.count("SELECT count(*) FROM versions"), stored);
    assert_eq!(s.count("SELECT max(version) FROM versions"), stored);
    assert_eq!(
        s.count("SELECT count(*) FROM versions a JOIN versions b ON b.version = a.version + 1 WHERE b.serial <= a.serial"),
        0,
        "serials only grow"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_and_health_and_metrics() {
    let s = TestServer::start().await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = s.base.trim_start_matches("http://");
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = state(1, "l", "");
    let head = format!(
        "POST /api/v1/tf/state/w HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        s.bearer("w"),
        body.len()
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    let mut buf = [0u8; 256];
    let n = sock.read(&mut buf).await.unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    sock.write_all(body.as_bytes()).await.unwrap();
    let n = sock.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("200 OK"));

    let client = reqwest::Client::new();
    let h = client
        .get(format!("{}/healthz", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status(), 200);
    let m = client
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(m.contains("stategate_requests_total"), "{m}");
    // Unknown routes are a clear 404, never a redirect.
    let r = client.get(format!("{}/nope", s.base)).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_is_a_502_s3_error_not_a_hang() {
    // Port 9 (discard) is closed on loopback here: connection refused at once.
    let s = TestServer::start_with(|c| {
        c.upstream.endpoint = Some("http://127.0.0.1:9".into());
        c.upstream.connect_timeout_seconds = 2;
    })
    .await;
    let started = std::time::Instant::now();
    let resp = reqwest::Client::new()
        .get(format!("{}/some-bucket/some-key", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    let body = resp.text().await.unwrap();
    assert!(body.contains("<Code>BadGateway</Code>"), "{body}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    // stategate's own routes keep working.
    assert_eq!(status(s.tf("GET", "w")).await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_mid_upload_stores_nothing() {
    use tokio::io::AsyncWriteExt;
    let s = TestServer::start().await;
    let body = state(1, "l", "{\"x\":1},".repeat(1000).trim_end_matches(','));
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /api/v1/tf/state/w HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n",
        s.bearer("w"),
        body.len()
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    sock.write_all(&body.as_bytes()[..body.len() / 2])
        .await
        .unwrap();
    // The client goes away (FIN), and waits until the server is done with it: the body
    // is streamed into the store as it arrives, so "done" includes discarding it.
    sock.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut sock, &mut rest),
    )
    .await;
    assert!(closed.is_ok(), "the server kept the connection open");
    // The server noticed the short body; a normal request proves it is still serving.
    let (code, _) = status(s.tf("GET", "w")).await;
    assert_eq!(code, 404);
    assert_eq!(s.count("SELECT count(*) FROM versions"), 0);
    assert!(s.blob_files().is_empty(), "{:?}", s.blob_files());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_changes_are_audited_without_content() {
    let s = TestServer::start().await;
    let secret_state = state(1, "lin", r#"{"name":"hunter2-secret"}"#);
    assert_eq!(status(s.tf("LOCK", "w").body(lock_info("L1"))).await.0, 200);
    assert_eq!(status(s.tf("LOCK", "w").body(lock_info("L2"))).await.0, 423); // not a change
    assert_eq!(
        status(s.tf("POST", "w").query(&[("ID", "L1")]).body(secret_state))
            .await
            .0,
        200
    );
    assert_eq!(
        status(s.tf("UNLOCK", "w").body(lock_info("L1"))).await.0,
        200
    );
    assert_eq!(status(s.tf("LOCK", "w").body(lock_info("L3"))).await.0, 200);
    assert_eq!(status(s.tf("UNLOCK", "w")).await.0, 200); // force-unlock: empty body
    assert_eq!(status(s.tf("DELETE", "w")).await.0, 200);

    let db = s.db();
    let mut stmt = db
        .prepare("SELECT actor, scope, event, payload FROM audit ORDER BY id")
        .unwrap();
    let rows: Vec<(String, String, String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let events: Vec<&str> = rows.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(
        events,
        [
            "tf.lock_acquired",
            "tf.state_written",
            "tf.lock_released",
            "tf.lock_acquired",
            "tf.lock_forced",
            "tf.state_deleted"
        ]
    );
    for (actor, scope, _, payload) in &rows {
        assert_eq!((actor.as_str(), scope.as_str()), ("tf:w", "tf/w"));
        assert!(
            !payload.contains("hunter2"),
            "state content leaked into the audit log: {payload}"
        );
    }
    let written: serde_json::Value = serde_json::from_str(&rows[1].3).unwrap();
    assert_eq!(written["serial"], 1);
    let forced: serde_json::Value = serde_json::from_str(&rows[4].3).unwrap();
    assert_eq!(
        (forced["lock_id"].as_str(), forced["who"].as_str()),
        (Some("L3"), Some("tester@host"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_dir_files_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let s = TestServer::start_with(|c| c.dek = None).await; // DEK file created on first start
    let dek = std::fs::read_to_string(s.config.dek_path()).unwrap();
    let bearer = stategate::crypto::RootKey::from_base64(&dek)
        .unwrap()
        .workspace_bearer("w");
    let write = reqwest::Client::new()
        .post(s.url("w"))
        .bearer_auth(bearer)
        .body(state(1, "l", ""));
    assert_eq!(status(write).await.0, 200);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&s.config.data_dir), 0o700);
    assert_eq!(mode(&s.config.dek_path()), 0o600);
    match s.config.index.kind {
        stategate::config::IndexKind::Sqlite => assert_eq!(mode(&s.config.db_path()), 0o600),
        // The index is the database server's: the data dir holds no file of it.
        stategate::config::IndexKind::Postgres => assert!(!s.config.db_path().exists()),
    }
    for blob in s.blob_files() {
        assert_eq!(mode(blob.parent().unwrap()), 0o700, "{}", blob.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opentofu_encrypted_envelope_is_stored_verbatim() {
    // What OpenTofu's state encryption POSTs (no OpenTofu binary is installable here):
    // serial and lineage stay in clear, the rest is opaque.
    let s = TestServer::start().await;
    let envelope = r#"{"serial":3,"lineage":"0b1d5c6e-2f7a-4c1e-9d3b-7e8f9a0b1c2d","meta":{"key_provider.pbkdf2.stategate":"eyJzYWx0IjoiIn0="},"encrypted_data":"q83vEjRWeJCrze8SNFZ4kA==","encryption_version":"v0"}"#;
    let w = reqwest::Client::new()
        .post(s.url("tofu"))
        .header("Authorization", format!("Bearer {}", s.bearer("tofu")))
        .body(envelope);
    assert_eq!(status(w).await.0, 200);
    assert_eq!(
        status(s.tf("GET", "tofu")).await,
        (200, envelope.to_string())
    );
    let (serial, lineage): (i64, String) = s
        .db()
        .query_row("SELECT serial, lineage FROM versions", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(
        (serial, lineage.as_str()),
        (3, "0b1d5c6e-2f7a-4c1e-9d3b-7e8f9a0b1c2d")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_share_a_bounded_memory_budget() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = TestServer::start_with(|c| {
        c.max_state_bytes = 8 * 1024;
        c.max_inflight_body_bytes = 8 * 1024;
    })
    .await;
    let served = state(1, "g", &format!(r#"{{"pad":"{}"}}"#, "y".repeat(1000)));
    assert_eq!(status(s.tf("POST", "g").body(served.clone())).await.0, 200);
    // A declares a body as large as the whole budget and is told to go ahead (100)...
    let body = state(1, "l", &format!(r#"{{"pad":"{}"}}"#, "x".repeat(8000)));
    let mut a = tokio::net::TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .unwrap();
    let head = format!(
        "POST /api/v1/tf/state/w HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        s.bearer("w"),
        body.len()
    );
    assert!(body.len() > 7 * 1024 && body.len() <= 8 * 1024);
    a.write_all(head.as_bytes()).await.unwrap();
    let mut buf = [0u8; 512];
    let n = a.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 100"));
    // ...but a declared length is a claim, not memory: B is not starved by it.
    let lock = |id: &str| s.tf("LOCK", "other").body(lock_info(id));
    assert_eq!(status(lock("B")).await.0, 200);
    assert_eq!(
        status(s.tf("UNLOCK", "other").body(lock_info("B"))).await.0,
        200
    );
    // Once A's bytes are actually held, B is told to retry (429) rather than pile up
    // in memory. (A's bytes are counted as the server reads them: wait until it has.)
    // B's reservation is released just after its answer is sent; A's bytes arriving
    // before that would not fit and A would rightly be the one told to retry.
    let free = || s.app.body_budget.available_bytes();
    let ten_seconds = std::time::Duration::from_secs(10);
    wait_until("B's budget to come back", ten_seconds, || {
        free() >= 8 * 1024
    })
    .await;
    let (most, last) = body.as_bytes().split_at(body.len() - 16);
    a.write_all(most).await.unwrap();
    // Probing with B meanwhile would race A for the budget (and A, not fitting, would
    // rightly be the one told to retry), so wait until A's bytes fill it.
    wait_until("A's bytes to fill the budget", ten_seconds, || free() == 0).await;
    let (code, text) = status(lock("B")).await;
    assert_eq!(
        code, 429,
        "B was not refused while A's body filled the budget: {text}"
    );
    assert_eq!(s.count("SELECT count(*) FROM tf_locks"), 0);
    // A finishes; the budget is free again.
    a.write_all(last).await.unwrap();
    let n = a.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("200 OK"));
    drop(a);
    assert_eq!(status(lock("B")).await.0, 200);
    assert_eq!(status(s.tf("GET", "g")).await, (200, served));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_slower_than_the_minimum_rate_is_cut_off_and_changes_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = TestServer::start_with(|c| {
        c.body_read_timeout_seconds = 1;
        c.body_min_bytes_per_second = 1024;
    })
    .await;
    let body = state(1, "l", "");
    let mut a = tokio::net::TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .unwrap();
    let head = format!(
        "POST /api/v1/tf/state/w HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n",
        s.bearer("w"),
        body.len() + 4096
    );
    a.write_all(head.as_bytes()).await.unwrap();
    a.write_all(body.as_bytes()).await.unwrap();
    // The rest never comes. Meanwhile another client is served at once.
    let started = std::time::Instant::now();
    assert_eq!(status(s.tf("GET", "w")).await.0, 404);
    assert!(started.elapsed() < std::time::Duration::from_millis(900));
    let mut response = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        a.read_to_end(&mut response),
    )
    .await;
    assert!(read.is_ok(), "the slow client was never cut off");
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    assert_eq!(s.count("SELECT count(*) FROM versions"), 0);
}

/// A state of many chunks, with a big resource blob so it spans several 64 KiB chunks.
fn big_state(serial: u64, lineage: &str, bytes: usize) -> String {
    let pad = "abcdefghijklmnopqrstuvwxyz0123456789".repeat(bytes / 36 + 1);
    state(
        serial,
        lineage,
        &format!(r#"{{"pad":"{}"}}"#, &pad[..bytes]),
    )
}

#[tokio::test]
async fn large_states_stream_in_and_out_intact() {
    let s = TestServer::start_with(|c| c.max_state_bytes = 8 << 20).await;
    let body = big_state(1, "big", 3 << 20);
    assert_eq!(status(s.tf("POST", "big").body(body.clone())).await.0, 200);
    let got = s.tf("GET", "big").send().await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.content_length(), Some(body.len() as u64));
    assert_eq!(got.bytes().await.unwrap(), body.as_bytes());
    // The identical retry stores nothing new.
    assert_eq!(status(s.tf("POST", "big").body(body.clone())).await.0, 200);
    assert_eq!(s.count("SELECT count(*) FROM versions"), 1);
    assert_eq!(s.blob_files().len(), 1);
}

#[tokio::test]
async fn content_md5_mismatch_on_a_streamed_body_changes_nothing() {
    let s = TestServer::start_with(|c| c.max_state_bytes = 8 << 20).await;
    let md5 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(b));
    // Below and past the size whose MD5 moves to a worker thread (crypto::off_thread).
    for size in [512 << 10, 3 << 20] {
        let body = big_state(1, "m", size);
        let (code, text) = status(
            s.tf("POST", "m")
                .header("Content-MD5", md5(b"other"))
                .body(body.clone()),
        )
        .await;
        assert_eq!(code, 400, "{size}: {text}");
        assert!(text.contains("Content-MD5"), "{text}");
        assert_eq!(s.count("SELECT count(*) FROM versions"), 0);
        assert!(s.blob_files().is_empty(), "{:?}", s.blob_files());
    }
    let body = big_state(1, "m", 1 << 20);
    // A body that stops being a state half way is refused the same way.
    let (code, _) = status(
        s.tf("POST", "m")
            .body(format!("{}]", &body[..body.len() - 1])),
    )
    .await;
    assert_eq!(code, 400);
    assert!(s.blob_files().is_empty());
    // The right MD5 of a large body is accepted.
    let large = big_state(1, "m", 3 << 20);
    let (code, text) = status(
        s.tf("POST", "m")
            .header("Content-MD5", md5(large.as_bytes()))
            .body(large.clone()),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(s.count("SELECT count(*) FROM versions"), 1);
}

#[tokio::test]
async fn a_client_gone_mid_upload_leaves_no_row_and_no_blob() {
    use tokio::io::AsyncWriteExt;
    let s = TestServer::start_with(|c| c.max_state_bytes = 8 << 20).await;
    let body = big_state(1, "gone", 2 << 20);
    let mut conn = tokio::net::TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .unwrap();
    let head = format!(
        "POST /api/v1/tf/state/gone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n",
        s.bearer("gone"),
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&body.as_bytes()[..1 << 20]).await.unwrap();
    drop(conn);
    // The server notices, aborts the write and removes its temp file.
    for _ in 0..500 {
        if s.blob_files().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(s.blob_files().is_empty(), "{:?}", s.blob_files());
    assert_eq!(s.count("SELECT count(*) FROM versions"), 0);
    assert_eq!(s.tf("GET", "gone").send().await.unwrap().status(), 404);
}

#[tokio::test]
async fn a_corrupt_chunk_mid_blob_aborts_the_get_instead_of_a_short_200() {
    let s = TestServer::start_with(|c| c.max_state_bytes = 8 << 20).await;
    let body = big_state(1, "c", 2 << 20);
    assert_eq!(status(s.tf("POST", "c").body(body.clone())).await.0, 200);
    let file = s.blob_files().pop().unwrap();
    let mut blob = std::fs::read(&file).unwrap();
    let middle = blob.len() / 2;
    blob[middle] ^= 1;
    std::fs::write(&file, &blob).unwrap();
    let got = s.tf("GET", "c").send().await.unwrap();
    // The first chunks verify, so the answer starts as a 200 of the full length...
    assert_eq!(got.status(), 200);
    assert_eq!(got.content_length(), Some(body.len() as u64));
    // ...and is cut off before the declared length: an error, never a short state.
    let read = got.bytes().await;
    assert!(read.is_err(), "a corrupt blob must not read back as a body");
    // A blob corrupt from its first chunk is a 5xx before anything is sent.
    blob[middle] ^= 1;
    blob[200] ^= 1;
    std::fs::write(&file, &blob).unwrap();
    let got = s.tf("GET", "c").send().await.unwrap();
    assert_eq!(got.status(), 500);
}

/// A blob store that takes `delay` for every piece written: a server slow to take a
/// body (busy disk, many uploads on few cores), so its reads fall behind the client.
/// (The store is the only place the test can slow the server down.)
struct SlowStore {
    inner: std::sync::Arc<dyn stategate::store::BlobStore>,
    delay: std::time::Duration,
}

struct SlowSink {
    inner: Box<dyn stategate::store::blob::BlobSink>,
    delay: std::time::Duration,
}

#[async_trait::async_trait]
impl stategate::store::blob::BlobSink for SlowSink {
    async fn write(&mut self, data: bytes::Bytes) -> Result<(), stategate::store::BlobError> {
        tokio::time::sleep(self.delay).await;
        self.inner.write(data).await
    }
    async fn finish(self: Box<Self>) -> Result<(), stategate::store::BlobError> {
        self.inner.finish().await
    }
    async fn abort(self: Box<Self>) {
        self.inner.abort().await
    }
}

#[async_trait::async_trait]
impl stategate::store::BlobStore for SlowStore {
    async fn put(&self, key: &str, data: bytes::Bytes) -> Result<(), stategate::store::BlobError> {
        self.inner.put(key, data).await
    }
    async fn create(
        &self,
        key: &str,
    ) -> Result<Box<dyn stategate::store::blob::BlobSink>, stategate::store::BlobError> {
        Ok(Box::new(SlowSink {
            inner: self.inner.create(key).await?,
            delay: self.delay,
        }))
    }
    async fn get(&self, key: &str) -> Result<Option<bytes::Bytes>, stategate::store::BlobError> {
        self.inner.get(key).await
    }
    async fn read(
        &self,
        key: &str,
    ) -> Result<Option<stategate::store::blob::BlobReader>, stategate::store::BlobError> {
        self.inner.read(key).await
    }
    async fn delete(&self, key: &str) -> Result<(), stategate::store::BlobError> {
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, stategate::store::BlobError> {
        self.inner.list(prefix).await
    }
    fn describe(&self) -> String {
        "slow local store".into()
    }
    fn write_buffer_bytes(&self) -> u64 {
        self.inner.write_buffer_bytes()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_is_not_charged_for_the_time_the_server_is_busy_with_its_body() {
    use stategate::tofu::TofuBackend;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Allowance for 1 MiB: 2 s + 1 MiB at 4 MiB/s = 2.25 s of waiting for the client.
    // The store takes 150 ms per sealed piece written: about 2.7 s for the whole body.
    let s = TestServer::start_with_app(
        |c| {
            c.body_read_timeout_seconds = 2;
            c.body_min_bytes_per_second = 4 << 20;
        },
        |app| {
            let store = app.tofu.store();
            let slow = SlowStore {
                inner: store.blobs().clone(),
                delay: std::time::Duration::from_millis(150),
            };
            let root = stategate::crypto::RootKey::from_base64(common::DEK).unwrap();
            app.tofu = TofuBackend::new(store.with_blobs(std::sync::Arc::new(slow)), root);
        },
    )
    .await;
    let body = big_state(1, "slow", 1 << 20);
    let mut conn = tokio::net::TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .unwrap();
    let head = format!(
        "POST /api/v1/tf/state/slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n",
        s.bearer("slow"),
        body.len()
    );
    let started = std::time::Instant::now();
    conn.write_all(head.as_bytes()).await.unwrap();
    let (most, last) = body.as_bytes().split_at(body.len() - 100);
    conn.write_all(most).await.unwrap();
    // The last bytes come 3.5 s after the start: past the wall-clock allowance, but
    // the server was busy for most of it, so the client kept it waiting well under 2 s.
    tokio::time::sleep(std::time::Duration::from_millis(3500)).await;
    conn.write_all(last).await.unwrap();
    let mut response = Vec::new();
    conn.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(started.elapsed() > std::time::Duration::from_millis(2250));
    assert_eq!(
        s.tf("GET", "slow")
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap(),
        body.as_bytes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reading_slower_than_the_minimum_rate_is_disconnected() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = TestServer::start_with(|c| {
        c.body_min_bytes_per_second = 4 * 1024 * 1024;
    })
    .await;
    let big = state(1, "l", &format!(r#"{{"pad":"{}"}}"#, "z".repeat(8 << 20)));
    assert_eq!(status(s.tf("POST", "big").body(big.clone())).await.0, 200);
    // A tiny receive buffer (no autotuning), so the server's writes block on this reader.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr = s.base.trim_start_matches("http://").parse().unwrap();
    let mut reader = socket.connect(addr).await.unwrap();
    let request = format!(
        "GET /api/v1/tf/state/big HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {}\r\n\r\n",
        s.bearer("big")
    );
    reader.write_all(request.as_bytes()).await.unwrap();
    // Once the answer has started, the reader stops reading for longer than 8 MiB at
    // 4 MiB/s may take (2 s)...
    let mut head = [0u8; 12];
    reader.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    // ...so the server has given up on it: what arrives is less than the state.
    let mut got = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        reader.read_to_end(&mut got),
    )
    .await;
    assert!(
        read.is_ok(),
        "the server kept the slow reader's connection open"
    );
    assert!(
        got.len() < big.len(),
        "a slow reader still got the whole state ({} bytes)",
        got.len()
    );
    // Others are served meanwhile and afterwards.
    assert_eq!(status(s.tf("GET", "big")).await, (200, big));
}

/// What a refused write must leave as it was: rows, audit, blobs.
fn snapshot(s: &TestServer) -> (i64, i64, usize, i64) {
    (
        s.count("SELECT count(*) FROM versions"),
        s.count("SELECT count(*) FROM audit"),
        s.blob_files().len(),
        s.count("SELECT count(*) FROM tf_write_overrides"),
    )
}

const SECRET: &str = "hunter2-guard-secret";

fn secret_resource(value: &str) -> String {
    format!(
        r#"{{"mode":"managed","type":"terraform_data","name":"x","provider":"p","instances":[{{"attributes":{{"input":"{SECRET}-{value}"}}}}]}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_guard_refuses_other_lineage_lower_serial_and_reused_serial() {
    let s = TestServer::start().await;
    let current = state(5, "L", &secret_resource("current"));
    assert_eq!(status(s.tf("POST", "w").body(current.clone())).await.0, 200);
    let before = snapshot(&s);
    // (body, refused as, sent serial, sent lineage)
    let table: Vec<(String, &str, i64, &str)> = vec![
        (state(6, "M", &secret_resource("a")), "lineage_mismatch", 6, "M"),
        (state(5, "M", &secret_resource("current")), "lineage_mismatch", 5, "M"),
        (state(4, "L", &secret_resource("b")), "stale_serial", 4, "L"),
        (state(0, "L", ""), "stale_serial", 0, "L"),
        (state(5, "L", &secret_resource("c")), "serial_reused", 5, "L"),
        // OpenTofu's encrypted envelope keeps serial and lineage in clear: same rules.
        (
            r#"{"serial":4,"lineage":"L","meta":{"key_provider.pbkdf2.x":"e30="},"encrypted_data":"q83vEjRWeJCrze8SNFZ4kA==","encryption_version":"v0"}"#.to_string(),
            "stale_serial",
            4,
            "L",
        ),
        (
            r#"{"serial":9,"lineage":"other","meta":{},"encrypted_data":"q83vEjRWeJCrze8SNFZ4kA==","encryption_version":"v0"}"#.to_string(),
            "lineage_mismatch",
            9,
            "other",
        ),
    ];
    for (body, why, serial, lineage) in &table {
        for locked in [false, true] {
            // Holding the lock does not change the verdict.
            let mut req = s.tf("POST", "w").body(body.clone());
            if locked {
                assert_eq!(status(s.tf("LOCK", "w").body(lock_info("G"))).await.0, 200);
                req = req.query(&[("ID", "G")]);
            }
            let (code, text) = status(req).await;
            if locked {
                assert_eq!(
                    status(s.tf("UNLOCK", "w").body(lock_info("G"))).await.0,
                    200
                );
            }
            assert_eq!(code, 409, "{why}: {text}");
            let reply: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(reply["refused"], *why, "{text}");
            assert_eq!(reply["stored"]["serial"], 5, "{text}");
            assert_eq!(reply["stored"]["lineage"], "L", "{text}");
            assert_eq!(reply["stored"]["version"], 1, "{text}");
            assert_eq!(reply["sent"]["serial"], *serial, "{text}");
            assert_eq!(reply["sent"]["lineage"], *lineage, "{text}");
            assert!(reply["error"]
                .as_str()
                .unwrap()
                .contains("nothing was written"));
            assert!(reply["how_to_proceed"]
                .as_str()
                .unwrap()
                .contains("stategate workspace allow-write w"));
            // Metadata only: neither the stored nor the sent content.
            assert!(!text.contains(SECRET), "{text}");
            assert!(
                !text.contains("encrypted_data") && !text.contains("q83v"),
                "{text}"
            );
        }
        // Nothing written (the lock and unlock rows aside).
        assert_eq!(s.count("SELECT count(*) FROM versions"), before.0, "{why}");
        assert_eq!(s.blob_files().len(), before.2, "{why}");
        assert_eq!(
            s.count("SELECT count(*) FROM audit WHERE event = 'tf.state_written'"),
            1
        );
        assert_eq!(status(s.tf("GET", "w")).await, (200, current.clone()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_guard_answers_only_after_the_credential() {
    let s = TestServer::start().await;
    assert_eq!(
        status(s.tf("POST", "w").body(state(5, "L", ""))).await.0,
        200
    );
    let before = snapshot(&s);
    let refused_kind = state(4, "M", &secret_resource("x"));
    let client = reqwest::Client::new();
    let attempts = [
        client.post(s.url("w")),
        client
            .post(s.url("w"))
            .basic_auth("stategate", Some("wrong")),
        client.post(s.url("w")).bearer_auth(s.bearer("other")),
        client
            .post(s.url("w"))
            .query(&[("ID", "x")])
            .basic_auth("stategate", Some(s.bearer("w") + "x")),
    ];
    for req in attempts {
        let (code, text) = status(req.body(refused_kind.clone())).await;
        assert_eq!(code, 401, "{text}");
        assert!(
            !text.contains("serial") && !text.contains("lineage"),
            "{text}"
        );
        assert!(!text.contains("refused"), "{text}");
    }
    assert_eq!(snapshot(&s), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_guard_lets_retries_successors_and_fresh_starts_through() {
    let s = TestServer::start().await;
    // First write: anything goes.
    assert_eq!(
        status(s.tf("POST", "w").body(state(3, "L", ""))).await.0,
        200
    );
    // The identical state again (a client retry): 200, no second version.
    assert_eq!(
        status(s.tf("POST", "w").body(state(3, "L", ""))).await.0,
        200
    );
    assert_eq!(s.count("SELECT count(*) FROM versions"), 1);
    // The next serial, and a jump (state push of a newer file).
    assert_eq!(
        status(s.tf("POST", "w").body(state(4, "L", &secret_resource("a"))))
            .await
            .0,
        200
    );
    assert_eq!(
        status(s.tf("POST", "w").body(state(9, "L", &secret_resource("b"))))
            .await
            .0,
        200
    );
    // After a DELETE there is no current state: a new lineage starts fresh.
    assert_eq!(status(s.tf("DELETE", "w")).await.0, 200);
    assert_eq!(
        status(s.tf("POST", "w").body(state(1, "N", ""))).await.0,
        200
    );
    assert_eq!(s.count("SELECT count(*) FROM versions"), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_unlocked_writers_of_one_serial_exactly_one_wins() {
    // Two `-lock=false` runs that read the same state both send its serial + 1.
    let s = TestServer::start().await;
    assert_eq!(
        status(s.tf("POST", "w").body(state(5, "L", ""))).await.0,
        200
    );
    let mut tasks = Vec::new();
    for i in 0..8 {
        let req = s
            .tf("POST", "w")
            .body(state(6, "L", &secret_resource(&i.to_string())));
        tasks.push(tokio::spawn(async move { status(req).await }));
    }
    let mut codes = Vec::new();
    for t in tasks {
        let (code, text) = t.await.unwrap();
        if code == 409 {
            assert!(text.contains("serial_reused"), "{text}");
        }
        codes.push(code);
    }
    assert_eq!(codes.iter().filter(|c| **c == 200).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 409).count(), 7, "{codes:?}");
    assert_eq!(s.count("SELECT count(*) FROM versions"), 2);
    assert_eq!(s.blob_files().len(), 2, "refused writes leave no blob");
}

/// An operator and a token for the admin API.
async fn operator(s: &TestServer) -> String {
    s.app
        .operator
        .admin_write(|c| stategate::operator::identity::create_operator(c, "ops@example.com", "t"))
        .await
        .unwrap()
}

async fn allow_write(s: &TestServer, token: &str, body: serde_json::Value) -> (u16, String) {
    status(
        reqwest::Client::new()
            .post(format!("{}/api/v1/admin/workspaces/w/allow-write", s.base))
            .bearer_auth(token)
            .body(body.to_string()),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_override_lets_exactly_one_refused_write_through() {
    let s = TestServer::start().await;
    let token = operator(&s).await;
    assert_eq!(
        status(s.tf("POST", "w").body(state(5, "L", ""))).await.0,
        200
    );
    let old = state(3, "L", &secret_resource("old"));
    assert_eq!(status(s.tf("POST", "w").body(old.clone())).await.0, 409);

    let (code, text) = allow_write(
        &s,
        &token,
        serde_json::json!({"reason": "restore the pre-incident file", "minutes": 5}),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    let grant: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(grant["workspace"], "w");
    assert_eq!(grant["granted_by"], "operator:ops@example.com");
    assert_eq!(grant["reason"], "restore the pre-incident file");
    // A correct write does not use the override up.
    assert_eq!(
        status(s.tf("POST", "w").body(state(6, "L", ""))).await.0,
        200
    );
    assert_eq!(s.count("SELECT count(*) FROM tf_write_overrides"), 1);
    // The refused kind of write goes through once...
    assert_eq!(status(s.tf("POST", "w").body(old.clone())).await.0, 200);
    assert_eq!(status(s.tf("GET", "w")).await, (200, old.clone()));
    assert_eq!(s.count("SELECT count(*) FROM tf_write_overrides"), 0);
    // ...and only once.
    let again = state(2, "L", &secret_resource("older"));
    let (code, text) = status(s.tf("POST", "w").body(again)).await;
    assert_eq!(code, 409, "{text}");
    assert_eq!(s.count("SELECT count(*) FROM versions"), 3);

    let audit: Vec<(String, String, String)> = {
        let db = s.db();
        let mut q = db
            .prepare("SELECT event, actor, payload FROM audit WHERE scope = 'tf/w' ORDER BY id")
            .unwrap();
        q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let events: Vec<(&str, &str)> = audit
        .iter()
        .map(|(e, a, _)| (e.as_str(), a.as_str()))
        .collect();
    assert_eq!(
        events,
        [
            ("tf.state_written", "tf:w"),
            ("tf.write_allowed", "operator:ops@example.com"),
            ("tf.state_written", "tf:w"),
            ("tf.write_override_used", "tf:w"),
            ("tf.state_written", "tf:w"),
        ]
    );
    let used: serde_json::Value = serde_json::from_str(&audit[3].2).unwrap();
    assert_eq!(used["refused"], "stale_serial");
    assert_eq!(used["granted_by"], "operator:ops@example.com");
    assert_eq!(used["stored"]["serial"], 6);
    assert_eq!(used["sent"]["serial"], 3);
    assert!(audit.iter().all(|(_, _, p)| !p.contains(SECRET)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_override_allows_nothing() {
    let s = TestServer::start().await;
    let token = operator(&s).await;
    assert_eq!(
        status(s.tf("POST", "w").body(state(5, "L", ""))).await.0,
        200
    );
    let (code, _) = allow_write(&s, &token, serde_json::json!({"reason": "r"})).await;
    assert_eq!(code, 200);
    s.db()
        .execute(
            "UPDATE tf_write_overrides SET expires_at = expires_at - 601",
            [],
        )
        .unwrap();
    let (code, _) = status(s.tf("POST", "w").body(state(1, "M", ""))).await;
    assert_eq!(code, 409);
    assert_eq!(s.count("SELECT count(*) FROM versions"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_write_checks_the_operator_then_the_input_and_changes_nothing_when_refused() {
    let s = TestServer::start().await;
    let token = operator(&s).await;
    assert_eq!(
        status(s.tf("POST", "w").body(state(5, "L", ""))).await.0,
        200
    );
    let before = snapshot(&s);
    let good = serde_json::json!({"reason": "r"});
    // Not an operator: the workspace credential, nothing, a wrong token.
    for t in [s.bearer("w"), String::new(), "sgo_wrong".into()] {
        let (code, text) = allow_write(&s, &t, good.clone()).await;
        assert_eq!(code, 401, "{text}");
    }
    // (body, status) with a good token
    let table = [
        (serde_json::json!({}), 400),
        (serde_json::json!({"reason": ""}), 400),
        (serde_json::json!({"reason": "  "}), 400),
        (serde_json::json!({"reason": "a\nb"}), 400),
        (serde_json::json!({"reason": "x".repeat(501)}), 400),
        (serde_json::json!({"reason": "r", "minutes": 0}), 400),
        (serde_json::json!({"reason": "r", "minutes": 61}), 400),
        (serde_json::json!({"reason": "r", "minutes": -1}), 400),
        (serde_json::json!({"reason": "r", "minutes": "5"}), 400),
        (serde_json::json!({"reason": "r", "extra": 1}), 400),
        (serde_json::json!(["r"]), 400),
    ];
    for (body, expected) in table {
        let (code, text) = allow_write(&s, &token, body.clone()).await;
        assert_eq!(code, expected, "{body}: {text}");
        assert!(text.contains("\"error\""), "{text}");
    }
    let (code, _) = status(
        reqwest::Client::new()
            .post(format!(
                "{}/api/v1/admin/workspaces/bad%20name/allow-write",
                s.base
            ))
            .bearer_auth(&token)
            .body(good.to_string()),
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(snapshot(&s), before);
}

/// OpenTofu's encrypted envelope as `internal/encryption` marshals it (meta values are
/// base64 JSON of the key provider's metadata), serial and lineage in clear.
fn envelope(serial: u64, provider: &str) -> String {
    format!(
        r#"{{"serial":{serial},"lineage":"L","meta":{{"key_provider.pbkdf2.{provider}":"eyJzYWx0IjoiYWJjIiwiaXRlcmF0aW9ucyI6NjAwMDAwfQ=="}},"encrypted_data":"q83vEjRWeJCrze8SNFZ4kA==","encryption_version":"v0"}}"#
    )
}

async fn admin_workspace(s: &TestServer, token: &str, ws: &str) -> serde_json::Value {
    let (code, text) = status(
        reqwest::Client::new()
            .get(format!("{}/api/v1/admin/workspaces/{ws}", s.base))
            .bearer_auth(token),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// What a refused downgrade must leave as it was, with the posture rows.
fn posture_snapshot(s: &TestServer) -> ((i64, i64, usize, i64), i64) {
    (
        snapshot(s),
        s.count("SELECT count(*) FROM tf_state_encryption"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encryption_posture_is_recorded_per_version_and_shown() {
    let s = TestServer::start().await;
    let token = operator(&s).await;
    // (workspace, bodies written in order, state, current, key providers)
    type Row<'a> = (&'a str, Vec<String>, &'a str, &'a str, Vec<&'a str>);
    let rows: Vec<Row> = vec![
        (
            "enc",
            vec![envelope(1, "main"), envelope(2, "main")],
            "encrypted",
            "encrypted",
            vec!["pbkdf2.main"],
        ),
        (
            "plain",
            vec![state(1, "L", ""), state(2, "L", "")],
            "plaintext",
            "plaintext",
            vec![],
        ),
        (
            "migrated",
            vec![state(1, "L", ""), envelope(2, "main")],
            "mixed",
            "encrypted",
            vec!["pbkdf2.main"],
        ),
        (
            "rotated",
            vec![envelope(1, "old"), envelope(2, "new")],
            "encrypted",
            "encrypted",
            vec!["pbkdf2.new", "pbkdf2.old"],
        ),
    ];
    for (ws, bodies, ..) in &rows {
        for body in bodies {
            assert_eq!(
                status(s.tf("POST", ws).body(body.clone())).await.0,
                200,
                "{ws}"
            );
        }
        // An identical retry stores nothing and records nothing.
        let last = bodies.last().unwrap().clone();
        assert_eq!(status(s.tf("POST", ws).body(last)).await.0, 200);
    }
    for (ws, bodies, state_, current, providers) in &rows {
        let shown = admin_workspace(&s, &token, ws).await;
        let enc = &shown["encryption"];
        assert_eq!(enc["state"], *state_, "{ws}: {shown}");
        assert_eq!(enc["current"], *current, "{ws}: {shown}");
        assert_eq!(
            enc["key_providers"],
            serde_json::json!(providers),
            "{ws}: {shown}"
        );
        assert_eq!(enc["known"], bodies.len(), "{ws}: {shown}");
        // Posture only: no meta values, no ciphertext.
        let text = shown.to_string();
        assert!(
            !text.contains("eyJzYWx0") && !text.contains("q83v"),
            "{text}"
        );
    }
    assert_eq!(s.count("SELECT count(*) FROM tf_state_encryption"), 8);
    // The listing carries the same; a deleted workspace has none.
    assert_eq!(status(s.tf("DELETE", "plain")).await.0, 200);
    let (code, text) = status(
        reqwest::Client::new()
            .get(format!("{}/api/v1/admin/workspaces", s.base))
            .bearer_auth(&token),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    let list: serde_json::Value = serde_json::from_str(&text).unwrap();
    let find = |name: &str| {
        list.as_array()
            .or_else(|| list["workspaces"].as_array())
            .unwrap()
            .iter()
            .find(|w| w["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(find("migrated")["encryption"]["state"], "mixed", "{text}");
    assert!(find("plain")["encryption"].is_null(), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_write_onto_an_encrypted_state_is_refused_where_the_policy_says() {
    let s = TestServer::start_with(|c| {
        c.tofu.refuse_plaintext_after_encrypted = vec!["prod-*".into()];
    })
    .await;
    let token = operator(&s).await;
    let current = envelope(5, "main");
    assert_eq!(
        status(s.tf("POST", "prod-a").body(current.clone())).await.0,
        200
    );
    let before = posture_snapshot(&s);
    // (what, body) — every plaintext successor is refused the same way.
    let table: Vec<(&str, String)> = vec![
        ("the next serial", state(6, "L", &secret_resource("a"))),
        ("a far serial", state(60, "L", "")),
        ("an empty state", state(7, "L", "")),
    ];
    for (what, body) in &table {
        for locked in [false, true] {
            let mut req = s.tf("POST", "prod-a").body(body.clone());
            if locked {
                assert_eq!(
                    status(s.tf("LOCK", "prod-a").body(lock_info("G"))).await.0,
                    200
                );
                req = req.query(&[("ID", "G")]);
            }
            let (code, text) = status(req).await;
            if locked {
                assert_eq!(
                    status(s.tf("UNLOCK", "prod-a").body(lock_info("G")))
                        .await
                        .0,
                    200
                );
            }
            assert_eq!(code, 409, "{what}: {text}");
            let reply: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(reply["refused"], "plaintext_after_encrypted", "{text}");
            assert_eq!(reply["stored"]["encryption"], "encrypted", "{text}");
            assert_eq!(reply["stored"]["version"], 1, "{text}");
            assert_eq!(reply["stored"]["serial"], 5, "{text}");
            assert_eq!(reply["sent"]["encryption"], "plaintext", "{text}");
            assert!(reply["error"]
                .as_str()
                .unwrap()
                .contains("nothing was written"));
            let how = reply["how_to_proceed"].as_str().unwrap();
            assert!(
                how.contains("TF_ENCRYPTION") && how.contains("allow-write prod-a"),
                "{how}"
            );
            assert!(!text.contains(SECRET) && !text.contains("q83v"), "{text}");
        }
        let now = posture_snapshot(&s);
        assert_eq!(
            (now.0 .0, now.0 .2, now.1),
            (before.0 .0, before.0 .2, before.1),
            "{what}"
        );
        assert_eq!(
            s.count("SELECT count(*) FROM audit WHERE event = 'tf.state_written'"),
            1
        );
        assert_eq!(status(s.tf("GET", "prod-a")).await, (200, current.clone()));
    }
    // Hostile rows: the policy never answers before the credential — another
    // workspace's bearer or none gets the same refusal as any bad credential.
    let other = s.bearer("dev-a");
    for auth in [Some(other.as_str()), None] {
        let req = s.tf_as("POST", "prod-a", auth).body(state(6, "L", ""));
        let (code, text) = status(req).await;
        assert_eq!(code, 401, "{text}");
        assert!(
            !text.contains("plaintext_after_encrypted") && !text.contains("encrypted"),
            "{text}"
        );
    }
    assert_eq!(posture_snapshot(&s).1, before.1);
    // Encrypted successors, even under another key provider, pass.
    assert_eq!(
        status(s.tf("POST", "prod-a").body(envelope(6, "next")))
            .await
            .0,
        200
    );
    // A workspace the policy does not name takes plaintext after encrypted (mixed).
    assert_eq!(
        status(s.tf("POST", "dev-a").body(envelope(1, "main")))
            .await
            .0,
        200
    );
    assert_eq!(
        status(s.tf("POST", "dev-a").body(state(2, "L", "")))
            .await
            .0,
        200
    );
    assert_eq!(
        admin_workspace(&s, &token, "dev-a").await["encryption"]["state"],
        "mixed"
    );
    // A first write, or one after a delete, has nothing to downgrade from.
    assert_eq!(
        status(s.tf("POST", "prod-new").body(state(1, "L", "")))
            .await
            .0,
        200
    );

    // The operator override lets exactly one decrypting write through, audited.
    let (code, text) = status(
        reqwest::Client::new()
            .post(format!(
                "{}/api/v1/admin/workspaces/prod-a/allow-write",
                s.base
            ))
            .bearer_auth(&token)
            .body(serde_json::json!({"reason": "decrypt for the audit"}).to_string()),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    let plain = state(7, "L", "");
    assert_eq!(
        status(s.tf("POST", "prod-a").body(plain.clone())).await.0,
        200
    );
    assert_eq!(status(s.tf("GET", "prod-a")).await, (200, plain));
    let used: serde_json::Value = serde_json::from_str(&s.db().query_row(
        "SELECT payload FROM audit WHERE event = 'tf.write_override_used' AND scope = 'tf/prod-a'",
        [],
        |r| r.get::<_, String>(0),
    ).unwrap())
    .unwrap();
    assert_eq!(used["refused"], "plaintext_after_encrypted");
    assert_eq!(s.count("SELECT count(*) FROM tf_write_overrides"), 0);
    let shown = admin_workspace(&s, &token, "prod-a").await;
    assert_eq!(shown["encryption"]["current"], "plaintext", "{shown}");
    assert_eq!(shown["encryption"]["state"], "mixed", "{shown}");
    // Re-encrypting and then downgrading again is refused again (the override is gone).
    assert_eq!(
        status(s.tf("POST", "prod-a").body(envelope(8, "main")))
            .await
            .0,
        200
    );
    assert_eq!(
        status(s.tf("POST", "prod-a").body(state(9, "L", "")))
            .await
            .0,
        409
    );
}

/// An admin API call by `token`: (status, body).
async fn admin_post(
    s: &TestServer,
    token: &str,
    path: &str,
    body: serde_json::Value,
) -> (u16, String) {
    status(
        reqwest::Client::new()
            .post(format!("{}/api/v1/admin/workspaces/{path}", s.base))
            .bearer_auth(token)
            .body(body.to_string()),
    )
    .await
}

/// A rollback stores an old version's content as the current state, so the downgrade
/// policy judges it as it judges a write of that content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_to_a_plaintext_version_over_an_encrypted_state_is_refused_like_a_write() {
    let s = TestServer::start_with(|c| {
        c.tofu.refuse_plaintext_after_encrypted = vec!["prod-*".into()];
    })
    .await;
    let token = operator(&s).await;
    for ws in ["prod-r", "dev-r"] {
        for body in [
            state(1, "L", &secret_resource("old")),
            envelope(2, "main"),
            envelope(3, "main"),
        ] {
            assert_eq!(status(s.tf("POST", ws).body(body)).await.0, 200, "{ws}");
        }
    }
    let current = envelope(3, "main");
    // The preview says so beforehand, in the rollback's own words.
    let preview = |to: i64| {
        let request = reqwest::Client::new()
            .get(format!(
                "{}/api/v1/admin/workspaces/prod-r/rollback?to={to}",
                s.base
            ))
            .bearer_auth(&token);
        async move {
            let (code, text) = status(request).await;
            assert_eq!(code, 200, "{text}");
            serde_json::from_str::<serde_json::Value>(&text).unwrap()["refused"].clone()
        }
    };
    let why = preview(1).await;
    assert!(
        why.as_str().unwrap().contains("allow-write prod-r"),
        "{why}"
    );
    assert!(preview(2).await.is_null());
    let before = posture_snapshot(&s);
    let (code, text) =
        admin_post(&s, &token, "prod-r/rollback", serde_json::json!({"to": 1})).await;
    assert_eq!(code, 409, "{text}");
    let reply: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(reply["refused"], "plaintext_after_encrypted", "{text}");
    assert_eq!(reply["stored"]["version"], 3, "{text}");
    assert_eq!(reply["stored"]["encryption"], "encrypted", "{text}");
    assert_eq!(reply["sent"]["version"], 1, "{text}");
    assert_eq!(reply["sent"]["encryption"], "plaintext", "{text}");
    let error = reply["error"].as_str().unwrap();
    assert!(
        error.contains("nothing was rolled back") && error.contains("allow-write prod-r"),
        "{error}"
    );
    assert!(!text.contains(SECRET) && !text.contains("q83v"), "{text}");
    // Nothing changed: no version, no blob, no audit row, no posture row.
    assert_eq!(posture_snapshot(&s), before);
    assert_eq!(status(s.tf("GET", "prod-r")).await, (200, current.clone()));

    // A rollback to an encrypted version passes; so does any rollback of a workspace
    // the policy does not cover.
    let (code, text) =
        admin_post(&s, &token, "prod-r/rollback", serde_json::json!({"to": 2})).await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        status(s.tf("GET", "prod-r")).await,
        (200, envelope(2, "main"))
    );
    let (code, text) = admin_post(&s, &token, "dev-r/rollback", serde_json::json!({"to": 1})).await;
    assert_eq!(code, 200, "{text}");
    assert!(status(s.tf("GET", "dev-r")).await.1.contains(SECRET));
    assert_eq!(
        admin_workspace(&s, &token, "dev-r").await["encryption"]["current"],
        "plaintext"
    );
    // The restored version carries the target's posture: still refused from there.
    let (code, text) =
        admin_post(&s, &token, "prod-r/rollback", serde_json::json!({"to": 1})).await;
    assert_eq!(code, 409, "{text}");

    // The operator's override lets exactly one decrypting rollback through, audited.
    let (code, text) = admin_post(
        &s,
        &token,
        "prod-r/allow-write",
        serde_json::json!({"reason": "decrypt for the audit"}),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    assert!(preview(1).await.is_null(), "allowed once");
    let (code, text) = admin_post(
        &s,
        &token,
        "prod-r/rollback",
        serde_json::json!({"to": 1, "from": 4}),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    assert!(status(s.tf("GET", "prod-r")).await.1.contains(SECRET));
    assert_eq!(s.count("SELECT count(*) FROM tf_write_overrides"), 0);
    let (actor, used): (String, String) = s
        .db()
        .query_row(
            "SELECT actor, payload FROM audit WHERE event = 'tf.write_override_used' AND scope = 'tf/prod-r'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let used: serde_json::Value = serde_json::from_str(&used).unwrap();
    assert_eq!(used["refused"], "plaintext_after_encrypted", "{used}");
    assert_eq!(used["reason"], "decrypt for the audit", "{used}");
    assert_eq!(used["sent"]["rollback_to"], 1, "{used}");
    assert!(actor.contains("ops@example.com"), "{actor}");
    assert_eq!(
        admin_workspace(&s, &token, "prod-r").await["encryption"]["current"],
        "plaintext"
    );
    // Used up: back to encrypted, the same rollback is refused again.
    let (code, text) =
        admin_post(&s, &token, "prod-r/rollback", serde_json::json!({"to": 2})).await;
    assert_eq!(code, 200, "{text}");
    let (code, text) =
        admin_post(&s, &token, "prod-r/rollback", serde_json::json!({"to": 1})).await;
    assert_eq!(code, 409, "{text}");
}

/// A restore brings back the state that was current before the delete, with its
/// posture: the next plaintext write is judged against an encrypted state again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_encrypted_state_is_guarded_like_the_one_deleted() {
    let s = TestServer::start_with(|c| {
        c.tofu.refuse_plaintext_after_encrypted = vec!["prod-*".into()];
    })
    .await;
    let token = operator(&s).await;
    assert_eq!(
        status(s.tf("POST", "prod-d").body(envelope(1, "main")))
            .await
            .0,
        200
    );
    assert_eq!(status(s.tf("DELETE", "prod-d")).await.0, 200);
    let (code, text) = admin_post(&s, &token, "prod-d/restore", serde_json::json!({})).await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        admin_workspace(&s, &token, "prod-d").await["encryption"]["current"],
        "encrypted"
    );
    let (code, text) = status(s.tf("POST", "prod-d").body(state(2, "L", ""))).await;
    assert_eq!(code, 409, "{text}");
    assert!(text.contains("plaintext_after_encrypted"), "{text}");
}
