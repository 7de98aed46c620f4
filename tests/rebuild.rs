//! The index rebuild: the version index reproduced from blobs alone into a new file,
//! on the real engine (SQLite + a local store).

mod common;

use bytes::Bytes;
use common::engine::{engine, write, CLUSTER_KEY};
use stategate::crypto::RootKey;
use stategate::schema::open_db;
use stategate::store::format::{self, BlobHeader};
use stategate::store::history::history_rows;
use stategate::store::rebuild::{rebuild_index, RebuildError};
use stategate::store::{BlobStore, StateStore, StoreError, VersionRow, WriteOutcome};
use time::{Duration, OffsetDateTime};

fn live_rows(conn: &stategate::store::sql::Connection) -> Vec<VersionRow> {
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
                renumber: None,
                summarize: None,
            },
            &e.root.blob_key("tf/prod"),
            |_, _| Ok::<(), StoreError>(()),
        )
        .await
        .unwrap();
    assert!(matches!(rolled.outcome, WriteOutcome::Stored(ref r) if r.version == 4));
    // An orphan claiming an existing version, stamped a day AFTER the committed one
    // (a clock that went backwards): v3's parent link still proves which v2 committed.
    let orphan = e.put_orphan("tf/prod", 2, now + Duration::days(1)).await;
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
            parent: None,
            facts: Default::default(),
            key_gen: 0,
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
    let keys =
        stategate::schema::scope_keys(e.root.clone(), Some(RootKey::from_bytes(CLUSTER_KEY)));
    let into = dir.path().join("rebuilt.db");
    let report = rebuild_index(&*e.blobs, &keys, &into, stategate::schema::ALL)
        .await
        .unwrap();
    assert_eq!(
        report.rows, live,
        "rebuilt rows = live rows minus tombstones"
    );
    let rebuilt = stategate::store::sql::Connection::open(&into).unwrap();
    assert_eq!(live_rows(&rebuilt), live);
    assert_eq!(
        report
            .superseded
            .iter()
            .map(|c| c.key.as_str())
            .collect::<Vec<_>>(),
        vec![orphan.as_str()]
    );
    assert!(report.unproven.is_empty(), "{:?}", report.unproven);
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
    let keys = stategate::schema::scope_keys(e.root.clone(), None);
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
