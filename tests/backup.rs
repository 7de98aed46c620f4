//! Backups of the index into the store and restores from them, on the real engine
//! (SQLite + a local store): a restore gives back the snapshot's orgs, tokens,
//! clusters and audit rows plus every version committed after it; a wrong DEK or a
//! tampered or foreign snapshot is refused with nothing written.

mod common;

use common::engine::{engine, write, Engine, CLUSTER_KEY};
use stategate::cluster::identity::{self, Role};
use stategate::crypto::RootKey;
use stategate::store::backup::{self, BackupError, BackupInfo};
use stategate::store::rebuild::ScopeKeys;
use stategate::store::retention::Retention;
use stategate::store::BlobStore;

fn keys(root: &RootKey) -> ScopeKeys {
    stategate::schema::scope_keys(root.clone(), Some(RootKey::from_bytes(CLUSTER_KEY)))
}

/// A backup of the engine's index, whichever kind it is, as `serve` takes one.
async fn take(e: &Engine) -> BackupInfo {
    let snapshot = e.index.snapshot(&stategate::schema::INDEX, e.dir.path());
    backup::take_backup_from(snapshot, &*e.blobs, &e.root)
        .await
        .unwrap()
}

async fn restore(
    e: &Engine,
    root: &RootKey,
    from: &BackupInfo,
    into: &std::path::Path,
) -> Result<backup::RestoreReport, BackupError> {
    backup::restore(
        &*e.blobs,
        root,
        &keys(root),
        from.clone(),
        into,
        stategate::schema::MIGRATIONS,
        stategate::schema::ALL,
        &|_, _| {},
        &mut |_| Ok(()),
    )
    .await
}

/// Every row of a table, as text, for comparing whole databases: a restored file
/// (`path`) or the live index (`e.conn()`).
fn dump_file(path: &std::path::Path, sql: &str) -> Vec<String> {
    dump(&stategate::store::sql::Connection::open(path).unwrap(), sql)
}

fn dump(conn: &stategate::store::sql::Connection, sql: &str) -> Vec<String> {
    let mut stmt = conn.prepare(sql).unwrap();
    let n = stmt.column_count();
    stmt.query_map([], |r| {
        (0..n)
            .map(|i| r.get_ref(i).map(|v| format!("{v:?}")))
            .collect::<Result<Vec<_>, _>>()
            .map(|cols| cols.join("|"))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

const VERSIONS: &str = "SELECT scope, version, serial, sha256, size, blob_key, created_at, actor FROM versions ORDER BY scope, version";

/// Files in `dir` other than the live database and blobs: a refused restore leaves none.
fn stray_files(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("stategate.db") && n != "blobs")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_gives_back_the_snapshot_and_every_version_after_it() {
    let e = engine();
    let cluster_scope = "cluster/6f1c2a4e-0000-4000-8000-000000000001";
    let token =
        e.db.write(|c| {
            identity::create_org(c, "acme")?;
            identity::create_cluster(
                c,
                "acme",
                Some("prod"),
                Some("6f1c2a4e-0000-4000-8000-000000000001"),
            )?;
            identity::create_principal(c, "acme", "ops@acme.test", Role::Admin)
        })
        .await
        .unwrap();
    for i in 1..=3 {
        write(
            &e.store,
            "tf/prod",
            format!("{{\"p\":{i}}}").as_bytes(),
            Some(i),
        )
        .await;
    }
    write(&e.store, cluster_scope, b"{\"c\":1}", Some(1)).await;
    let snap = take(&e).await;

    // After the snapshot: more versions of an old scope, a new scope, a cluster write.
    write(&e.store, "tf/prod", b"{\"p\":4}", Some(4)).await;
    write(&e.store, "tf/new", b"{\"n\":1}", Some(1)).await;
    write(&e.store, cluster_scope, b"{\"c\":2}", Some(2)).await;

    let into = e.dir.path().join("restored.db");
    let report = restore(&e, &e.root, &snap, &into).await.unwrap();
    let added: Vec<(String, i64)> = report
        .added
        .iter()
        .map(|r| (r.scope.clone(), r.version))
        .collect();
    assert_eq!(
        added,
        vec![
            (cluster_scope.to_string(), 2),
            ("tf/new".into(), 1),
            ("tf/prod".into(), 4)
        ]
    );
    assert!(report.dropped.is_empty() && report.skipped.is_empty());
    // Every version of the live index, with the same blobs, times and actors.
    assert_eq!(dump_file(&into, VERSIONS), dump(&e.conn(), VERSIONS));
    // What only the index knows comes back as of the snapshot.
    for table in [
        "SELECT * FROM orgs",
        "SELECT * FROM clusters",
        "SELECT * FROM principals",
        "SELECT * FROM tokens",
        "SELECT * FROM audit ORDER BY id",
    ] {
        let restored = dump_file(&into, table);
        assert!(!restored.is_empty(), "{table}");
        assert_eq!(restored, dump(&e.conn(), table), "{table}");
    }
    // The old token authenticates against the restored database.
    let restored = stategate::schema::open_db(&into).unwrap();
    let who = restored
        .read(move |c| identity::principal_by_token(c, token.as_bytes()))
        .await
        .unwrap();
    assert_eq!(who.map(|p| p.email).as_deref(), Some("ops@acme.test"));
    // A self-contained file (no WAL beside it), append-only audit included.
    drop(restored);
    let conn = stategate::store::sql::Connection::open(&into).unwrap();
    let err = conn.execute("DELETE FROM audit", []).unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_restores_write_nothing() {
    let e = engine();
    write(&e.store, "tf/prod", b"{\"p\":1}", Some(1)).await;
    let snap = take(&e).await;
    let into = e.dir.path().join("restored.db");

    // A foreign snapshot: another installation's backup (another DEK) in this store,
    // under its own id and renamed to look like one of ours.
    let other = engine();
    write(&other.store, "tf/prod", b"{\"p\":1}", Some(1)).await;
    let other_root = RootKey::from_bytes([8; 32]);
    let other_db = tokio::task::spawn_blocking(
        other
            .index
            .snapshot(&stategate::schema::INDEX, other.dir.path()),
    )
    .await
    .unwrap()
    .unwrap();
    let foreign_id = backup::new_id(time::OffsetDateTime::now_utc());
    let foreign = backup::pick(&*e.blobs, Some(&foreign_id)).await.unwrap();
    let foreign_blob = backup::seal(&other_root, &foreign.id, &other_db, "2026-01-01T00:00:00Z");
    e.blobs
        .put(&foreign.key, foreign_blob.unwrap().into())
        .await
        .unwrap();

    // Our own snapshot with one byte flipped, as a new id.
    let mut tampered = e.blobs.get(&snap.key).await.unwrap().unwrap().to_vec();
    let mid = tampered.len() / 2;
    tampered[mid] ^= 0x40;
    let tampered_info = backup::pick(
        &*e.blobs,
        Some(&format!(
            "{}-{}",
            snap.id.split('-').next().unwrap(),
            "0".repeat(32)
        )),
    )
    .await
    .unwrap();
    e.blobs
        .put(&tampered_info.key, tampered.into())
        .await
        .unwrap();
    // Our snapshot copied under another backup's name.
    let copied = backup::pick(
        &*e.blobs,
        Some(&format!(
            "{}-{}",
            snap.id.split('-').next().unwrap(),
            "1".repeat(32)
        )),
    )
    .await
    .unwrap();
    let ours = e.blobs.get(&snap.key).await.unwrap().unwrap();
    e.blobs.put(&copied.key, ours).await.unwrap();

    let wrong_dek = RootKey::from_bytes([42; 32]);
    // (case, key, backup, what the error says)
    let cases: Vec<(&str, &RootKey, &BackupInfo, &str)> = vec![
        ("wrong DEK", &wrong_dek, &snap, "cannot be opened"),
        ("foreign snapshot", &e.root, &foreign, "cannot be opened"),
        (
            "tampered snapshot",
            &e.root,
            &tampered_info,
            "cannot be opened",
        ),
        (
            "snapshot under another id",
            &e.root,
            &copied,
            "cannot be opened",
        ),
    ];
    for (case, root, from, needle) in cases {
        let err = restore(&e, root, from, &into).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(needle) && text.contains("nothing was written"),
            "{case}: {text}"
        );
        assert!(!into.exists(), "{case}");
        assert_eq!(stray_files(e.dir.path()), Vec::<String>::new(), "{case}");
    }
    // A backup that is not there, and none at all.
    let missing = backup::pick(
        &*e.blobs,
        Some(&format!(
            "{}-{}",
            snap.id.split('-').next().unwrap(),
            "2".repeat(32)
        )),
    )
    .await
    .unwrap();
    let err = restore(&e, &e.root, &missing, &into).await.unwrap_err();
    assert!(matches!(err, BackupError::NotFound(_)), "{err}");
    let empty = engine();
    let err = backup::pick(&*empty.blobs, Some("latest"))
        .await
        .unwrap_err();
    assert!(matches!(err, BackupError::NoBackups), "{err}");
    assert!(matches!(
        backup::pick(&*e.blobs, Some("../../etc/passwd")).await,
        Err(BackupError::BadId(_))
    ));
    // An existing file is never replaced.
    std::fs::write(&into, b"keep me").unwrap();
    let err = restore(&e, &e.root, &snap, &into).await.unwrap_err();
    assert!(matches!(err, BackupError::Exists(_)), "{err}");
    assert_eq!(std::fs::read(&into).unwrap(), b"keep me");
    // And the real one still restores.
    std::fs::remove_file(&into).unwrap();
    restore(&e, &e.root, &snap, &into).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_taken_during_writes_and_prunes_restore_exactly_the_live_index() {
    let e = engine();
    let scopes: [&'static str; 3] = ["tf/a", "tf/b", "tf/c"];
    for scope in scopes {
        write(&e.store, scope, b"{\"v\":0}", Some(0)).await;
    }
    let writers: Vec<_> = scopes
        .into_iter()
        .map(|scope| {
            let store = e.store.clone();
            tokio::spawn(async move {
                for i in 1..=15 {
                    write(&store, scope, format!("{{\"v\":{i}}}").as_bytes(), Some(i)).await;
                }
            })
        })
        .collect();
    let policy = Retention {
        keep_versions: 3,
        keep_days: 0,
    };
    let mut taken = Vec::new();
    for _ in 0..4 {
        taken.push(take(&e).await);
        e.store
            .run_retention(policy, time::OffsetDateTime::now_utc(), false, false)
            .await
            .unwrap();
    }
    for w in writers {
        w.await.unwrap();
    }
    e.store
        .run_retention(policy, time::OffsetDateTime::now_utc(), false, false)
        .await
        .unwrap();
    let mut live = dump(&e.conn(), VERSIONS);
    live.sort();
    // Whichever snapshot is restored, the result is the live index now: rows pruned
    // since are dropped (their blobs are gone), versions written since are added.
    for (i, snap) in taken.iter().enumerate() {
        let into = e.dir.path().join(format!("restored-{i}.db"));
        restore(&e, &e.root, snap, &into).await.unwrap();
        let mut got = dump_file(&into, VERSIONS);
        got.sort();
        assert_eq!(got, live, "snapshot {i}");
    }
    assert_eq!(
        e.versions("tf/a").len(),
        3,
        "the prune ran: {:?}",
        e.versions("tf/a")
    );
}

#[tokio::test]
async fn only_the_newest_backups_are_kept_and_other_keys_are_left_alone() {
    let e = engine();
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(take(&e).await.id);
    }
    e.blobs
        .put("backups/README", bytes::Bytes::from_static(b"not a backup"))
        .await
        .unwrap();
    let listed: Vec<String> = backup::list_backups(&*e.blobs)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.id)
        .collect();
    assert_eq!(listed, ids, "oldest first, non-backups ignored");
    let deleted: Vec<String> = backup::keep_newest(&*e.blobs, 2)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.id)
        .collect();
    assert_eq!(deleted, ids[..2]);
    let left: Vec<String> = backup::list_backups(&*e.blobs)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.id)
        .collect();
    assert_eq!(left, ids[2..]);
    assert!(e.blobs.get("backups/README").await.unwrap().is_some());
    // keep = 0 still keeps the newest one.
    backup::keep_newest(&*e.blobs, 0).await.unwrap();
    assert_eq!(backup::list_backups(&*e.blobs).await.unwrap().len(), 1);
    // `latest` is the newest.
    assert_eq!(
        backup::pick(&*e.blobs, Some("latest")).await.unwrap().id,
        ids[3]
    );
}
