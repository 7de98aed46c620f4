//! Retention: pruning by policy and the garbage sweep, on the real engine (SQLite +
//! a local store whose deletes are watched). Time-based rules get an explicit `now`;
//! nothing sleeps.

mod common;

use std::sync::atomic::Ordering;

use bytes::Bytes;

use common::engine::{engine, write};
use stategate::store::retention::{PruneReport, Retention, SweepReport, GARBAGE_MIN_AGE};
use stategate::store::{BlobStore, StoreError};
use time::{Duration, OffsetDateTime};

/// (scope, version) of every version a prune pass lists.
fn pruned(report: &PruneReport) -> Vec<(String, i64)> {
    report
        .pruned
        .iter()
        .map(|p| (p.scope.clone(), p.version))
        .collect()
}

/// The blob keys a sweep lists.
fn swept_keys(report: &SweepReport) -> Vec<&str> {
    report.swept.iter().map(|g| g.key.as_str()).collect()
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

    // Each workspace version's encryption posture (`tofu::posture`, its own table).
    for v in 1..=6 {
        stategate::tofu::posture::record(
            &e.conn(),
            "a",
            v,
            &stategate::tfstate::BodyEncryption::Plaintext,
        )
        .unwrap();
    }
    let postures = || -> Vec<i64> {
        let conn = e.conn();
        let mut stmt = conn
            .prepare("SELECT version FROM tf_state_encryption WHERE workspace = 'a' ORDER BY 1")
            .unwrap();
        let rows = stmt
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        rows
    };

    let policy = Retention {
        keep_versions: 2,
        keep_days: 10,
    };
    // Dry run: reports, deletes nothing.
    let dry = e.store.prune(policy, now, true).await.unwrap();
    let listed = pruned(&dry);
    let expected: Vec<(String, i64)> = [("tf/a", 1), ("tf/a", 2), ("tf/a", 3), ("tf/gone", 1)]
        .iter()
        .map(|(s, v)| (s.to_string(), *v))
        .collect();
    assert_eq!(listed, expected);
    assert_eq!(e.versions("tf/a"), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(postures(), vec![1, 2, 3, 4, 5, 6]);
    assert!(e.blobs.deletes.lock().unwrap().is_empty());

    let report = e.store.prune(policy, now, false).await.unwrap();
    assert_eq!(pruned(&report), expected);
    assert!(report.blob_errors.is_empty());
    assert_eq!(e.versions("tf/a"), vec![4, 5, 6]);
    // The pruned versions' postures went in the same transaction; the kept ones stay.
    assert_eq!(postures(), vec![4, 5, 6]);
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
    assert_eq!(swept_keys(&swept), vec![key.as_str()]);
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
    assert_eq!(swept_keys(&dry), vec![old.as_str()]);
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
