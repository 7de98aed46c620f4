//! History, roll-forward rollback, pruning, the garbage sweep and the index rebuild,
//! in-process: real SQLite, real local blob store, real gateway where HTTP matters.
//! Time-based rules get an explicit `now`; nothing sleeps.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use common::{lock_info, state, status, TestServer};
use stategate::crypto::RootKey;
use stategate::schema::open_db;
use stategate::store::format::{self, BlobHeader};
use stategate::store::history::history_rows;
use stategate::store::rebuild::{rebuild_index, RebuildError, ScopeKeys};
use stategate::store::retention::{Retention, GARBAGE_MIN_AGE};
use stategate::store::{
    BlobError, BlobStore, LocalStore, NewVersion, StateStore, StoreError, VersionRow, WriteOutcome,
};
use time::{Duration, OffsetDateTime};

// ---------------------------------------------------------------------------
// history and rollback through the workspace backend
// ---------------------------------------------------------------------------

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
    assert_eq!((row.version, row.serial), (3, Some(1)));
    assert_eq!(row.actor, "operator:test");
    // GET answers version 1's exact bytes; the history keeps all three.
    assert_eq!(status(s.tf("GET", ws)).await, (200, v1.clone()));
    let rows = s.app.tofu.store().history("tf/rb", None).await.unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].sha256, rows[2].sha256);

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
        serde_json::json!({"from_version": 2, "to_version": 1, "new_version": 3, "serial": 1})
    );
    assert!(!payload.to_string().contains("one"));

    // Rolling back to the content that is already current writes nothing.
    let again = s.app.tofu.rollback(ws, 1, "operator:test").await.unwrap();
    assert!(matches!(again.outcome, WriteOutcome::Unchanged(ref r) if r.version == 3));
    assert_eq!(
        s.count("SELECT count(*) FROM audit WHERE scope = 'tf/rb' AND event = 'tf.rollback'"),
        1
    );

    // A normal client write continues from there.
    let v4 = state(2, "lin", r#"{"name":"after"}"#);
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
    assert_eq!(status(s.tf("GET", ws)).await, (200, v1));
    let v4 = state(2, "lin", "");
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
    };
    let db_path = s.config.db_path();
    let err = store
        .rollback(request, &key, move |_conn, latest| {
            // First call (before the blob is put): another process (the server, while
            // the CLI rolls back) commits a version right now.
            if latest.map(|r| r.version) == Some(4) {
                rusqlite::Connection::open(&db_path)
                    .unwrap()
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

// ---------------------------------------------------------------------------
// engine-level helpers: a store whose deletes are watched
// ---------------------------------------------------------------------------

/// A local store that records, at every delete, whether a version row still pointed
/// at the blob (it must not: rows go first), and can be told to fail deletes.
struct WatchedStore {
    inner: LocalStore,
    db_path: std::path::PathBuf,
    deleted_while_referenced: Mutex<Vec<String>>,
    deletes: Mutex<Vec<String>>,
    fail_deletes: AtomicBool,
}

#[async_trait]
impl BlobStore for WatchedStore {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), BlobError> {
        self.inner.put(key, data).await
    }
    async fn get(&self, key: &str) -> Result<Option<Bytes>, BlobError> {
        self.inner.get(key).await
    }
    async fn delete(&self, key: &str) -> Result<(), BlobError> {
        let conn = rusqlite::Connection::open(&self.db_path).unwrap();
        let refs: i64 = conn
            .query_row(
                "SELECT count(*) FROM versions WHERE blob_key = ?1",
                [key],
                |r| r.get(0),
            )
            .unwrap();
        if refs > 0 {
            self.deleted_while_referenced
                .lock()
                .unwrap()
                .push(key.to_string());
        }
        if self.fail_deletes.load(Ordering::SeqCst) {
            return Err(BlobError::Unavailable("test: store down".into()));
        }
        self.deletes.lock().unwrap().push(key.to_string());
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, BlobError> {
        self.inner.list(prefix).await
    }
    fn describe(&self) -> String {
        "watched local store".into()
    }
}

struct Engine {
    _dir: tempfile::TempDir,
    store: StateStore,
    blobs: Arc<WatchedStore>,
    db_path: std::path::PathBuf,
    root: RootKey,
}

fn engine() -> Engine {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("stategate.db");
    let db = open_db(&db_path).unwrap();
    let blobs = Arc::new(WatchedStore {
        inner: LocalStore::open(&dir.path().join("blobs")).unwrap(),
        db_path: db_path.clone(),
        deleted_while_referenced: Mutex::new(Vec::new()),
        deletes: Mutex::new(Vec::new()),
        fail_deletes: AtomicBool::new(false),
    });
    Engine {
        store: StateStore::new(db, blobs.clone()),
        blobs,
        db_path,
        root: RootKey::from_bytes([7; 32]),
        _dir: dir,
    }
}

const CLUSTER_KEY: [u8; 32] = [9; 32];

/// Writes one version (no guard) sealed under the key its scope kind uses.
async fn write(store: &StateStore, scope: &str, body: &[u8], serial: Option<i64>) -> VersionRow {
    let root = if scope.starts_with("cluster/") {
        RootKey::from_bytes(CLUSTER_KEY)
    } else {
        RootKey::from_bytes([7; 32])
    };
    let new = NewVersion {
        scope: scope.into(),
        plaintext: Bytes::copy_from_slice(body),
        serial,
        lineage: Some("lin".into()),
        actor: "test".into(),
        audit: None,
    };
    match store
        .write_version(new, &root.blob_key(scope), |_, _| Ok::<(), StoreError>(()))
        .await
        .unwrap()
    {
        WriteOutcome::Stored(row) => row,
        WriteOutcome::Unchanged(row) => panic!("unchanged at v{}", row.version),
    }
}

impl Engine {
    fn conn(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(&self.db_path).unwrap()
    }

    fn set_created(&self, scope: &str, version: i64, at: OffsetDateTime) {
        let text = at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        let n = self
            .conn()
            .execute(
                "UPDATE versions SET created_at = ?1 WHERE scope = ?2 AND version = ?3",
                rusqlite::params![text, scope, version],
            )
            .unwrap();
        assert_eq!(n, 1);
    }

    fn versions(&self, scope: &str) -> Vec<i64> {
        history_rows(&self.conn(), scope, None)
            .unwrap()
            .into_iter()
            .rev()
            .map(|r| r.version)
            .collect()
    }

    fn blob_exists(&self, key: &str) -> bool {
        self._dir.path().join("blobs").join(key).exists()
    }

    /// Puts a blob no row references, claiming (scope, version), written at `at`.
    async fn put_orphan(&self, scope: &str, version: i64, at: OffsetDateTime) -> String {
        let body = b"{\"orphan\":true}";
        let header = BlobHeader {
            scope: scope.into(),
            version,
            serial: Some(99),
            lineage: Some("lin".into()),
            sha256: hex::encode(format::sha2_digest(body)),
            size: body.len() as i64,
            created_at: at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap(),
            actor: "test".into(),
        };
        let blob = format::encode(&self.root.blob_key(scope), &header, body).unwrap();
        let key = stategate::store::blob_key_for(scope, version);
        self.blobs.put(&key, Bytes::from(blob)).await.unwrap();
        key
    }
}

// ---------------------------------------------------------------------------
// pruning
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_keeps_exactly_what_the_policy_says() {
    let e = engine();
    let now = OffsetDateTime::now_utc();
    let mut rows = Vec::new();
    for i in 1..=6 {
        rows.push(
            write(
                &e.store,
                "tf/a",
                format!("{{\"a\":{i}}}").as_bytes(),
                Some(i),
            )
            .await,
        );
    }
    for (version, days) in [(1, 60), (2, 50), (3, 40), (4, 3), (5, 2), (6, 1)] {
        e.set_created("tf/a", version, now - Duration::days(days));
    }
    // Another scope with a single ancient version: the newest is never pruned.
    write(&e.store, "tf/lonely", b"{}", Some(1)).await;
    e.set_created("tf/lonely", 1, now - Duration::days(900));
    // A scope whose newest is a tombstone: the tombstone stays, old content goes.
    write(&e.store, "tf/gone", b"{\"g\":1}", Some(1)).await;
    write(&e.store, "tf/gone", b"{\"g\":2}", Some(2)).await;
    e.store
        .write_tombstone("tf/gone", "test", None, |_, _| Ok::<(), StoreError>(()))
        .await
        .unwrap();
    for v in 1..=3 {
        e.set_created("tf/gone", v, now - Duration::days(100));
    }

    let policy = Retention {
        keep_versions: 2,
        keep_days: 10,
    };
    // Dry run: reports, deletes nothing.
    let dry = e.store.prune(policy, now, true).await.unwrap();
    let listed: Vec<(String, i64)> = dry
        .pruned
        .iter()
        .map(|p| (p.scope.clone(), p.version))
        .collect();
    let expected: Vec<(String, i64)> = [("tf/a", 1), ("tf/a", 2), ("tf/a", 3), ("tf/gone", 1)]
        .iter()
        .map(|(s, v)| (s.to_string(), *v))
        .collect();
    assert_eq!(listed, expected);
    assert_eq!(e.versions("tf/a"), vec![1, 2, 3, 4, 5, 6]);
    assert!(e.blobs.deletes.lock().unwrap().is_empty());

    let report = e.store.prune(policy, now, false).await.unwrap();
    let pruned: Vec<(String, i64)> = report
        .pruned
        .iter()
        .map(|p| (p.scope.clone(), p.version))
        .collect();
    assert_eq!(pruned, expected);
    assert!(report.blob_errors.is_empty());
    assert_eq!(e.versions("tf/a"), vec![4, 5, 6]);
    assert_eq!(e.versions("tf/lonely"), vec![1]);
    assert_eq!(e.versions("tf/gone"), vec![2, 3]);
    for row in &rows[..3] {
        assert!(!e.blob_exists(row.blob_key.as_ref().unwrap()));
    }
    for row in &rows[3..] {
        assert!(e.blob_exists(row.blob_key.as_ref().unwrap()));
    }
    assert_eq!(e.blobs.deletes.lock().unwrap().len(), 4);
    assert!(
        e.blobs.deleted_while_referenced.lock().unwrap().is_empty(),
        "a blob was deleted while its row still existed"
    );
    // Audited per scope.
    let audits: i64 = e
        .conn()
        .query_row(
            "SELECT count(*) FROM audit WHERE event = 'store.pruned'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(audits, 2);
    // The current state is untouched.
    let key = e.root.blob_key("tf/a");
    let (row, body) = e.store.read_current("tf/a", &key).await.unwrap().unwrap();
    assert_eq!((row.version, body), (6, b"{\"a\":6}".to_vec()));

    // Idempotent at the same time; a later `now` moves the window.
    assert!(e
        .store
        .prune(policy, now, false)
        .await
        .unwrap()
        .pruned
        .is_empty());
    let later = e
        .store
        .prune(policy, now + Duration::days(365), false)
        .await
        .unwrap();
    assert_eq!(
        later.pruned.iter().map(|p| p.version).collect::<Vec<_>>(),
        vec![4]
    );
    assert_eq!(e.versions("tf/a"), vec![5, 6]);
    // New versions continue the numbering: a pruned number is never reused.
    assert_eq!(
        write(&e.store, "tf/a", b"{\"a\":7}", Some(7)).await.version,
        7
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_blob_delete_leaves_garbage_that_the_sweep_removes() {
    let e = engine();
    let now = OffsetDateTime::now_utc();
    let old = write(&e.store, "tf/f", b"{\"v\":1}", Some(1)).await;
    write(&e.store, "tf/f", b"{\"v\":2}", Some(2)).await;
    e.set_created("tf/f", 1, now - Duration::days(40));
    e.blobs.fail_deletes.store(true, Ordering::SeqCst);
    let policy = Retention {
        keep_versions: 1,
        keep_days: 30,
    };
    let report = e.store.prune(policy, now, false).await.unwrap();
    assert_eq!(report.pruned.len(), 1);
    assert_eq!(report.blob_errors.len(), 1);
    // The row is gone (committed first); the blob stays behind as garbage.
    assert_eq!(e.versions("tf/f"), vec![2]);
    let key = old.blob_key.unwrap();
    assert!(e.blob_exists(&key));

    e.blobs.fail_deletes.store(false, Ordering::SeqCst);
    // Its header says it was written just now: too young for the sweep...
    let young = e
        .store
        .sweep_garbage(now, GARBAGE_MIN_AGE, false)
        .await
        .unwrap();
    assert_eq!((young.swept.len(), young.young), (0, 1));
    // ...an hour later it goes.
    let swept = e
        .store
        .sweep_garbage(now + Duration::minutes(61), GARBAGE_MIN_AGE, false)
        .await
        .unwrap();
    assert_eq!(
        swept
            .swept
            .iter()
            .map(|g| g.key.as_str())
            .collect::<Vec<_>>(),
        vec![key.as_str()]
    );
    assert!(!e.blob_exists(&key));
    assert!(e.blobs.deleted_while_referenced.lock().unwrap().is_empty());
}

// ---------------------------------------------------------------------------
// garbage sweep
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_removes_only_old_unreferenced_blobs() {
    let e = engine();
    let now = OffsetDateTime::now_utc();
    let live1 = write(&e.store, "tf/s", b"{\"s\":1}", Some(1)).await;
    let live2 = write(&e.store, "tf/s", b"{\"s\":2}", Some(2)).await;
    // Orphans of writes that never committed: one old, one possibly in flight.
    let old = e.put_orphan("tf/s", 3, now - Duration::hours(2)).await;
    let fresh = e.put_orphan("tf/s", 3, now - Duration::minutes(5)).await;
    // Something under states/ that is not a stategate blob: reported, never deleted.
    e.blobs
        .put("states/zz/not-a-blob", Bytes::from_static(b"hello"))
        .await
        .unwrap();
    // Outside states/: not the sweep's business.
    e.blobs
        .put("other/old", Bytes::from_static(b"x"))
        .await
        .unwrap();

    let dry = e
        .store
        .sweep_garbage(now, GARBAGE_MIN_AGE, true)
        .await
        .unwrap();
    assert_eq!(
        dry.swept.iter().map(|g| g.key.as_str()).collect::<Vec<_>>(),
        vec![old.as_str()]
    );
    assert!(e.blob_exists(&old));

    let report = e
        .store
        .sweep_garbage(now, GARBAGE_MIN_AGE, false)
        .await
        .unwrap();
    assert_eq!(
        report
            .swept
            .iter()
            .map(|g| (g.key.as_str(), g.version))
            .collect::<Vec<_>>(),
        vec![(old.as_str(), 3)]
    );
    assert_eq!(report.young, 1);
    assert_eq!(
        report.unrecognized,
        vec!["states/zz/not-a-blob".to_string()]
    );
    assert!(!e.blob_exists(&old));
    for key in [
        fresh.as_str(),
        live1.blob_key.as_deref().unwrap(),
        live2.blob_key.as_deref().unwrap(),
        "states/zz/not-a-blob",
        "other/old",
    ] {
        assert!(e.blob_exists(key), "{key} must survive");
    }
    assert!(e.blobs.deleted_while_referenced.lock().unwrap().is_empty());
    // The full retention pass (prune + sweep) with the default policy touches nothing live.
    let (pruned, swept) = e
        .store
        .run_retention(Retention::default(), now, false, true)
        .await
        .unwrap();
    assert!(pruned.pruned.is_empty() && swept.swept.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_automatic_pass_reports_unreferenced_blobs_but_never_deletes_them() {
    // An old blob no row references: a crash leftover, or a committed version of a
    // database restored from an older backup. Only an operator may delete it.
    let e = engine();
    let now = OffsetDateTime::now_utc();
    write(&e.store, "tf/r", b"{\"s\":1}", Some(1)).await;
    let forgotten = e.put_orphan("tf/r", 2, now - Duration::hours(5)).await;
    let (_, found) = e
        .store
        .run_retention(Retention::default(), now, false, false)
        .await
        .unwrap();
    assert_eq!(found.swept.len(), 1);
    assert!(
        e.blob_exists(&forgotten),
        "the automatic pass deleted a blob"
    );
    let (_, swept) = e
        .store
        .run_retention(Retention::default(), now, false, true)
        .await
        .unwrap();
    assert_eq!(swept.swept.len(), 1);
    assert!(!e.blob_exists(&forgotten));
}

// ---------------------------------------------------------------------------
// index rebuild
// ---------------------------------------------------------------------------

fn live_rows(conn: &rusqlite::Connection) -> Vec<VersionRow> {
    let scopes: Vec<String> = conn
        .prepare("SELECT DISTINCT scope FROM versions ORDER BY scope")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut out = Vec::new();
    for scope in scopes {
        let mut rows = history_rows(conn, &scope, None).unwrap();
        rows.reverse();
        out.extend(rows.into_iter().filter(|r| !r.is_tombstone()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_reproduces_the_live_index_from_blobs() {
    let e = engine();
    let now = OffsetDateTime::now_utc();
    for i in 1..=3 {
        write(
            &e.store,
            "tf/prod",
            format!("{{\"p\":{i}}}").as_bytes(),
            Some(i),
        )
        .await;
    }
    write(&e.store, "tf/dev", b"{\"d\":1}", Some(1)).await;
    write(&e.store, "tf/dev", b"{\"d\":2}", Some(2)).await;
    e.store
        .write_tombstone("tf/dev", "test", None, |_, _| Ok::<(), StoreError>(()))
        .await
        .unwrap();
    let cluster = "cluster/6f1c2a4e-0000-4000-8000-000000000001";
    write(&e.store, cluster, b"{\"c\":1}", Some(1)).await;
    // A rollback is an ordinary version in the blobs too.
    let rolled = e
        .store
        .rollback(
            stategate::store::history::Rollback {
                scope: "tf/prod".into(),
                to_version: 1,
                actor: "op".into(),
                org: None,
                event: "tf.rollback",
            },
            &e.root.blob_key("tf/prod"),
            |_, _| Ok::<(), StoreError>(()),
        )
        .await
        .unwrap();
    assert!(matches!(rolled.outcome, WriteOutcome::Stored(ref r) if r.version == 4));
    // An orphan claiming an existing version, written before the committed one.
    let orphan = e.put_orphan("tf/prod", 2, now - Duration::days(1)).await;
    // A blob sealed under another DEK (copied from another installation).
    let foreign = {
        let body = b"{}";
        let header = BlobHeader {
            scope: "tf/prod".into(),
            version: 7,
            serial: None,
            lineage: None,
            sha256: hex::encode(format::sha2_digest(body)),
            size: 2,
            created_at: stategate::store::now_rfc3339(),
            actor: "x".into(),
        };
        let blob = format::encode(
            &RootKey::from_bytes([1; 32]).blob_key("tf/prod"),
            &header,
            body,
        )
        .unwrap();
        let key = stategate::store::blob_key_for("tf/prod", 7);
        e.blobs.put(&key, Bytes::from(blob)).await.unwrap();
        key
    };
    e.blobs
        .put("states/junk", Bytes::from_static(b"junk"))
        .await
        .unwrap();

    let live = live_rows(&e.conn());
    let dir = tempfile::tempdir().unwrap();
    let keys = ScopeKeys {
        workspaces: e.root.clone(),
        clusters: Some(RootKey::from_bytes(CLUSTER_KEY)),
    };
    let into = dir.path().join("rebuilt.db");
    let report = rebuild_index(&*e.blobs, &keys, &into, stategate::schema::ALL)
        .await
        .unwrap();
    assert_eq!(
        report.rows, live,
        "rebuilt rows = live rows minus tombstones"
    );
    let rebuilt = rusqlite::Connection::open(&into).unwrap();
    assert_eq!(live_rows(&rebuilt), live);
    assert_eq!(
        report
            .superseded
            .iter()
            .map(|c| c.key.as_str())
            .collect::<Vec<_>>(),
        vec![orphan.as_str()]
    );
    let mut skipped: Vec<&str> = report.skipped.iter().map(|s| s.key.as_str()).collect();
    skipped.sort();
    let mut expected = vec![foreign.as_str(), "states/junk"];
    expected.sort();
    assert_eq!(skipped, expected);
    // Locks, tombstones and the audit log are not in blobs.
    for table in ["tf_locks", "audit", "orgs", "clusters"] {
        let n: i64 = rebuilt
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 0, "{table}");
    }
    drop(rebuilt);
    // A store opened on the rebuilt index serves the same current states.
    let store = StateStore::new(open_db(&into).unwrap(), e.blobs.clone());
    for scope in ["tf/prod", cluster] {
        let root = if scope.starts_with("cluster/") {
            RootKey::from_bytes(CLUSTER_KEY)
        } else {
            e.root.clone()
        };
        let key = root.blob_key(scope);
        let a = e.store.read_current(scope, &key).await.unwrap().unwrap();
        let b = store.read_current(scope, &key).await.unwrap().unwrap();
        assert_eq!(a, b, "{scope}");
    }
    // The deleted workspace comes back with its last content (tombstones are not in blobs).
    let dev = store
        .read_current("tf/dev", &e.root.blob_key("tf/dev"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(dev.1, b"{\"d\":2}".to_vec());

    // Never overwrites: the same path again is refused.
    assert!(matches!(
        rebuild_index(&*e.blobs, &keys, &into, stategate::schema::ALL).await,
        Err(RebuildError::Exists(_))
    ));
    // Without the cluster key, cluster scopes are skipped and reported.
    let keys = ScopeKeys {
        workspaces: e.root.clone(),
        clusters: None,
    };
    let report = rebuild_index(
        &*e.blobs,
        &keys,
        &dir.path().join("no-cluster.db"),
        stategate::schema::ALL,
    )
    .await
    .unwrap();
    assert!(report.rows.iter().all(|r| r.scope.starts_with("tf/")));
    assert!(report
        .skipped
        .iter()
        .any(|s| s.reason.contains("ADJ_STATE_ENC_KEY")));
}
