//! History and roll-forward rollback through the workspace backend, in-process: the
//! real gateway over real SQLite and a local blob store.

mod common;

use common::{lock_info, state, status, TestServer};
use stategate::http::error::HttpError;
use stategate::store::history::history_rows;
use stategate::store::{StoreError, WriteOutcome};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_lists_versions_newest_first() {
    let s = TestServer::start().await;
    let store = s.app.tofu.store();
    for serial in 1..=3 {
        let body = state(serial, "lin", "");
        assert_eq!(status(s.tf("POST", "hist").body(body)).await.0, 200);
    }
    assert_eq!(status(s.tf("DELETE", "hist")).await.0, 200);

    let rows = store.history("tf/hist", None).await.unwrap();
    let summary: Vec<(i64, Option<i64>, bool)> = rows
        .iter()
        .map(|r| (r.version, r.serial, r.is_tombstone()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (4, None, true),
            (3, Some(3), false),
            (2, Some(2), false),
            (1, Some(1), false)
        ]
    );
    assert!(rows[1..]
        .iter()
        .all(|r| r.lineage.as_deref() == Some("lin") && r.sha256.is_some() && r.size > 0));
    let two = store.history("tf/hist", Some(2)).await.unwrap();
    assert_eq!(
        two.iter().map(|r| r.version).collect::<Vec<_>>(),
        vec![4, 3]
    );
    assert!(store.history("tf/nothing", None).await.unwrap().is_empty());
    // The same rows through the plain-connection function the CLI uses.
    assert_eq!(
        history_rows(&s.db(), "tf/hist", None).unwrap(),
        rows,
        "history_rows and StateStore::history agree"
    );
}

fn hex_sha256(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// A rollback of OpenTofu's encrypted envelope cannot renumber it (its clear fields may
/// be authenticated by the client): the bytes come back exactly, serial and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_keeps_an_encrypted_envelope_byte_for_byte() {
    let s = TestServer::start().await;
    let ws = "enc";
    let env = |serial: u32, data: &str| {
        format!(
            r#"{{"serial":{serial},"lineage":"lin","meta":{{}},"encrypted_data":"{data}","encryption_version":"v0"}}"#
        )
    };
    for (serial, data) in [(1, "AAAA"), (2, "BBBB")] {
        let code = status(s.tf("POST", ws).body(env(serial, data))).await.0;
        assert_eq!(code, 200);
    }
    let done = s.app.tofu.rollback(ws, 1, "op").await.unwrap();
    assert!(matches!(done.outcome, WriteOutcome::Stored(ref r) if r.serial == Some(1)));
    assert_eq!(status(s.tf("GET", ws)).await, (200, env(1, "AAAA")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_writes_old_bytes_as_a_new_version() {
    let s = TestServer::start().await;
    let ws = "rb";
    let v1 = state(1, "lin", r#"{"name":"one"}"#);
    let v2 = state(2, "lin", r#"{"name":"two"}"#);
    for body in [&v1, &v2] {
        assert_eq!(status(s.tf("POST", ws).body(body.clone())).await.0, 200);
    }
    let done = s.app.tofu.rollback(ws, 1, "operator:test").await.unwrap();
    assert_eq!((done.from_version, done.to_version), (2, 1));
    let WriteOutcome::Stored(row) = done.outcome else {
        panic!("rollback stored nothing")
    };
    // Version 1's bytes under a serial above every stored one, so a plan saved before
    // the rollback is refused as stale; the history keeps all three.
    assert_eq!((row.version, row.serial), (3, Some(3)));
    assert_eq!(row.actor, "operator:test");
    let restored = state(3, "lin", r#"{"name":"one"}"#);
    assert_eq!(status(s.tf("GET", ws)).await, (200, restored.clone()));
    let rows = s.app.tofu.store().history("tf/rb", None).await.unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(
        rows[0].sha256.as_deref(),
        Some(hex_sha256(restored.as_bytes()).as_str())
    );

    // Audited in the same transaction: versions and serial, never content.
    let (event, actor, payload): (String, String, String) = s
        .db()
        .query_row(
            "SELECT event, actor, payload FROM audit WHERE scope = 'tf/rb' AND event = 'tf.rollback'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(
        (event.as_str(), actor.as_str()),
        ("tf.rollback", "operator:test")
    );
    let payload: serde_json::Value = serde_json::from_str(&payload).unwrap();
    assert_eq!(
        payload,
        serde_json::json!({"from_version": 2, "to_version": 1, "new_version": 3, "serial": 3, "restored_serial": 1})
    );
    assert!(!payload.to_string().contains("one"));

    // Rolling back to the content that is already current writes nothing.
    let again = s.app.tofu.rollback(ws, 1, "operator:test").await.unwrap();
    assert!(matches!(again.outcome, WriteOutcome::Unchanged(ref r) if r.version == 3));
    assert_eq!(
        s.count("SELECT count(*) FROM audit WHERE scope = 'tf/rb' AND event = 'tf.rollback'"),
        1
    );

    // A normal client write continues from there: it read the fresh serial (3) and
    // sends 4. A client still holding the state from before the rollback (serial 2 + 1
    // = 3, other content; or its old serial 2) is refused by the write guard.
    for stale in [3, 2] {
        let body = state(stale, "lin", r#"{"name":"stale"}"#);
        assert_eq!(status(s.tf("POST", ws).body(body)).await.0, 409);
    }
    let v4 = state(4, "lin", r#"{"name":"after"}"#);
    assert_eq!(status(s.tf("POST", ws).body(v4.clone())).await.0, 200);
    assert_eq!(status(s.tf("GET", ws)).await, (200, v4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_is_refused_while_locked_and_for_bad_versions() {
    let s = TestServer::start().await;
    let ws = "rbl";
    for serial in 1..=2 {
        let body = state(serial, "lin", "");
        assert_eq!(status(s.tf("POST", ws).body(body)).await.0, 200);
    }
    let versions = || s.count("SELECT count(*) FROM versions WHERE scope = 'tf/rbl'");

    assert_eq!(status(s.tf("LOCK", ws).body(lock_info("L1"))).await.0, 200);
    let err = s.app.tofu.rollback(ws, 1, "op").await.unwrap_err();
    assert_eq!(err.http_status(), 423);
    assert!(String::from_utf8_lossy(&err.body()).contains("L1"));
    assert_eq!(versions(), 2);
    assert_eq!(
        status(s.tf("UNLOCK", ws).body(lock_info("L1"))).await.0,
        200
    );

    // No such version, a tombstone, a missing blob, a corrupt blob: errors, nothing written.
    assert_eq!(
        s.app
            .tofu
            .rollback(ws, 9, "op")
            .await
            .unwrap_err()
            .http_status(),
        404
    );
    assert_eq!(
        s.app
            .tofu
            .rollback("never-written", 1, "op")
            .await
            .unwrap_err()
            .http_status(),
        404
    );
    assert_eq!(status(s.tf("DELETE", ws)).await.0, 200); // v3 = tombstone
    assert_eq!(
        s.app
            .tofu
            .rollback(ws, 3, "op")
            .await
            .unwrap_err()
            .http_status(),
        409
    );
    let blob_of = |version: i64| -> std::path::PathBuf {
        let key: String = s
            .db()
            .query_row(
                "SELECT blob_key FROM versions WHERE scope = 'tf/rbl' AND version = ?1",
                [version],
                |r| r.get(0),
            )
            .unwrap();
        s.config.local_store_path().join(key)
    };
    let mut bytes = std::fs::read(blob_of(2)).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(blob_of(2), bytes).unwrap();
    std::fs::remove_file(blob_of(1)).unwrap();
    for version in [1, 2] {
        let err = s.app.tofu.rollback(ws, version, "op").await.unwrap_err();
        assert_eq!(err.http_status(), 500, "v{version}: {err}");
        assert!(err
            .log_detail()
            .unwrap()
            .contains(&format!("version {version}")));
    }
    assert_eq!(versions(), 3);
    assert_eq!(status(s.tf("GET", ws)).await.0, 404); // still deleted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_undeletes_and_refuses_when_the_scope_moved() {
    let s = TestServer::start().await;
    let ws = "undel";
    let v1 = state(1, "lin", "");
    assert_eq!(status(s.tf("POST", ws).body(v1.clone())).await.0, 200);
    assert_eq!(status(s.tf("DELETE", ws)).await.0, 200);
    let done = s.app.tofu.rollback(ws, 1, "op").await.unwrap();
    assert!(matches!(done.outcome, WriteOutcome::Stored(ref r) if r.version == 3));
    // Back, under the next serial (the tombstone has none; version 1 had 1).
    assert_eq!(status(s.tf("GET", ws)).await, (200, state(2, "lin", "")));
    let v4 = state(3, "lin", "");
    assert_eq!(status(s.tf("POST", ws).body(v4)).await.0, 200);

    // A write landing between the rollback's read and its commit is detected.
    let store = s.app.tofu.store();
    let key = s.root.blob_key("tf/undel");
    let request = stategate::store::history::Rollback {
        scope: "tf/undel".into(),
        to_version: 1,
        actor: "op".into(),
        org: None,
        event: "tf.rollback",
        renumber: None,
        summarize: None,
    };
    let config = s.config.clone();
    let err = store
        .rollback(request, &key, move |_conn, latest| {
            // First call (before the blob is put): another process (the server, while
            // the CLI rolls back) commits a version right now.
            if latest.map(|r| r.version) == Some(4) {
                common::index_connection(&config)
                    .execute(
                        "INSERT INTO versions (scope, version, size, created_at, actor) \
                         VALUES ('tf/undel', 5, 0, '2026-01-01T00:00:00Z', 'other')",
                        [],
                    )
                    .unwrap();
            }
            Ok::<(), StoreError>(())
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Moved { found: 5, .. }), "{err:?}");
    assert_eq!(
        s.count("SELECT max(version) FROM versions WHERE scope = 'tf/undel'"),
        5
    );
    // The rollback's blob was discarded: only v1, v3 and v4 have blobs.
    assert_eq!(s.blob_files().len(), 3);
}

/// Terraform's serial is a uint64, stategate's an i64. A serial above `i64::MAX` is
/// refused (400, saying why) and changes nothing; at `i64::MAX` itself a rollback cannot
/// make a fresh serial: the preview says so instead of promising a wrapped one, and the
/// rollback is refused (409) with nothing written — it never stores a negative serial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serials_past_i64_are_refused_and_rollback_never_wraps() {
    let s = TestServer::start().await;
    let ws = "huge";
    let versions = || s.count("SELECT count(*) FROM versions WHERE scope = 'tf/huge'");
    // (serial as written, what the 400 says)
    let refused = [
        (
            "9223372036854775808",
            "the largest serial stategate can store",
        ),
        (
            "18446744073709551615",
            "the largest serial stategate can store",
        ),
        ("-9223372036854775808", "must not be negative"),
        ("7.5", "non-negative integer"),
    ];
    for (serial, words) in refused {
        let body = state(1, "lin", "").replace("\"serial\":1,", &format!("\"serial\":{serial},"));
        assert!(body.contains(serial));
        let (code, text) = status(s.tf("POST", ws).body(body)).await;
        assert_eq!(code, 400, "{serial}: {text}");
        assert!(text.contains(words), "{serial}: {text}");
        assert_eq!(versions(), 0, "{serial}");
    }

    let v1 = state(1, "lin", r#"{"name":"one"}"#);
    let top = state(1, "lin", r#"{"name":"top"}"#)
        .replace("\"serial\":1,", &format!("\"serial\":{},", i64::MAX));
    for body in [&v1, &top] {
        assert_eq!(status(s.tf("POST", ws).body(body.clone())).await.0, 200);
    }
    let preview = s.app.operator.rollback_preview(ws, 1).await.unwrap();
    assert_eq!(preview.to_serial, None, "{preview:?}");
    let why = preview.refused.clone().unwrap_or_default();
    assert!(why.contains("9223372036854775807"), "{preview:?}");
    assert!(!serde_json::to_string(&preview)
        .unwrap()
        .contains("-9223372036854775808"));

    for (how, err) in [
        (
            "rollback",
            s.app.tofu.rollback(ws, 1, "op").await.unwrap_err(),
        ),
        (
            "operator rollback",
            s.app
                .operator
                .rollback(ws, 1, Some(2), "operator:test")
                .await
                .unwrap_err(),
        ),
    ] {
        assert_eq!(err.http_status(), 409, "{how}: {err}");
        let body = String::from_utf8_lossy(&err.body()).to_string();
        assert!(
            body.contains("largest stategate can store"),
            "{how}: {body}"
        );
    }
    assert_eq!(versions(), 2);
    assert_eq!(
        s.count("SELECT count(*) FROM versions WHERE scope = 'tf/huge' AND serial < 0"),
        0
    );
    assert_eq!(
        s.count("SELECT count(*) FROM audit WHERE scope = 'tf/huge' AND event = 'tf.rollback'"),
        0
    );
    assert_eq!(status(s.tf("GET", ws)).await, (200, top));
}
