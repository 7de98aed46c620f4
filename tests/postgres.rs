//! The index on a REAL PostgreSQL (started by `scripts/test-all.sh`, which exports
//! `STATEGATE_TEST_POSTGRES_URL`; `python3 integration/postgres_harness.py start DIR`
//! starts one by hand). Each test makes its own database. Two in-process servers on
//! one database are two nodes. Without the variable the tests say so and return,
//! unless `CI` or `STATEGATE_TEST_REQUIRE_POSTGRES` is set, in which case they fail.

mod common;

use common::{lock_info, new_postgres_database as new_database, state, status, TestServer};
use stategate::config::IndexKind;
use stategate::store::sql::Connection;
use stategate::store::{Db, DbError};

/// Runs `f` on a connection of its own to `url`, off the async runtime.
fn with_conn<T: Send + 'static>(url: &str, f: impl FnOnce(&Connection) -> T + Send + 'static) -> T {
    let url = url.to_string();
    std::thread::spawn(move || f(&Connection::connect_postgres(&url, None).unwrap()))
        .join()
        .unwrap()
}

async fn node(url: &str) -> TestServer {
    let url = url.to_string();
    TestServer::start_with(move |c| {
        c.index.kind = IndexKind::Postgres;
        c.index.url = Some(url.into());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_is_one_row_for_every_node_and_a_write_needs_its_holder() {
    let Some(url) = new_database() else { return };
    let (a, b) = (node(&url).await, node(&url).await);
    let ws = "shared";
    // Many LOCKs at once through both nodes: exactly one wins.
    let mut tries = Vec::new();
    for i in 0..16 {
        let server = if i % 2 == 0 { &a } else { &b };
        let req = server.tf("LOCK", ws).body(lock_info(&format!("id-{i}")));
        tries.push(tokio::spawn(status(req)));
    }
    let mut won = Vec::new();
    for (i, t) in tries.into_iter().enumerate() {
        let (code, body) = t.await.unwrap();
        match code {
            200 => won.push(i),
            423 => assert!(body.contains("\"ID\":\"id-"), "{body}"),
            other => panic!("LOCK {i}: {other} {body}"),
        }
    }
    assert_eq!(won.len(), 1, "one lock row: {won:?}");
    let holder = format!("id-{}", won[0]);
    // A write through the other node with another ID is refused and writes nothing.
    let (code, _) = status(
        b.tf("POST", ws)
            .query(&[("ID", "not-the-holder")])
            .body(state(1, "l", "")),
    )
    .await;
    assert_eq!(code, 423);
    let versions = with_conn(&url, |c| {
        c.query_row("SELECT count(*) FROM versions", [], |r| r.get::<_, i64>(0))
            .unwrap()
    });
    assert_eq!(versions, 0);
    // The holder's write through either node commits; its identical retry is a no-op.
    for server in [&a, &b] {
        let (code, body) = status(
            server
                .tf("POST", ws)
                .query(&[("ID", holder.as_str())])
                .body(state(1, "l", "")),
        )
        .await;
        assert_eq!(code, 200, "{body}");
    }
    let versions = with_conn(&url, |c| {
        c.query_row("SELECT count(*) FROM versions", [], |r| r.get::<_, i64>(0))
            .unwrap()
    });
    assert_eq!(
        versions, 1,
        "the identical retry through the other node wrote nothing"
    );
    let (code, body) = status(a.tf("GET", ws)).await;
    assert_eq!(code, 200);
    assert!(body.contains("\"serial\":1"), "{body}");
}

/// Writer preference across nodes (issue 41): an apply retrying through one node keeps
/// new plans out on the other, because the waiting writer is a row of the shared index.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_apply_waiting_on_one_node_keeps_plans_out_on_the_other() {
    let Some(url) = new_database() else { return };
    let (a, b) = (node(&url).await, node(&url).await);
    let ws = "busy";
    let plan = |id: &str| lock_info(id).replace("OperationTypeApply", "OperationTypePlan");
    let lock = |server: &TestServer, body: String| status(server.tf("LOCK", ws).body(body));
    assert_eq!(lock(&a, plan("P1")).await.0, 200);
    assert_eq!(lock(&b, plan("P2")).await.0, 200);
    for _ in 0..2 {
        assert_eq!(lock(&a, lock_info("A")).await.0, 423, "plans hold it");
    }
    let (code, body) = lock(&b, plan("P3")).await;
    assert_eq!(code, 423, "{body}");
    assert!(body.contains("is waiting for this lock"), "{body}");
    for (server, id) in [(&b, "P1"), (&a, "P2")] {
        let (code, body) = status(server.tf("UNLOCK", ws).body(plan(id))).await;
        assert_eq!(code, 200, "{body}");
    }
    assert_eq!(lock(&b, lock_info("A")).await.0, 200, "the apply's turn");
    let waiting = with_conn(&url, |c| {
        c.query_row("SELECT count(*) FROM tf_lock_waiters", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap()
    });
    assert_eq!(waiting, 0, "taking the lock clears its record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_itself_keeps_the_audit_log_and_finished_runs_append_only() {
    let Some(url) = new_database() else { return };
    let server = node(&url).await;
    let ws = "audited";
    let (code, _) = status(server.tf("LOCK", ws).body(lock_info("x"))).await;
    assert_eq!(code, 200);
    let refused = with_conn(&url, |c| {
        let before: i64 = c
            .query_row("SELECT count(*) FROM audit", [], |r| r.get(0))
            .unwrap();
        assert!(before > 0, "the LOCK was audited");
        let mut refusals = Vec::new();
        for sql in [
            "UPDATE audit SET actor = 'someone-else'",
            "DELETE FROM audit",
            "TRUNCATE audit",
            "INSERT INTO drift_runs (workspace, kind, trigger, started_at, finished_at) VALUES ('w', 'check', 't', 'then', 'then')",
        ] {
            refusals.push((sql, c.execute_batch(sql)));
        }
        let after: i64 = c
            .query_row("SELECT count(*) FROM audit", [], |r| r.get(0))
            .unwrap();
        assert_eq!(after, before, "nothing changed");
        for sql in [
            "UPDATE drift_runs SET outcome = 'in_sync'",
            "DELETE FROM drift_runs",
            "TRUNCATE drift_runs CASCADE",
        ] {
            refusals.push((sql, c.execute_batch(sql)));
        }
        refusals
            .into_iter()
            .map(|(sql, r)| {
                (
                    sql,
                    r.map_err(|e| (e.is_constraint_violation(), e.to_string())),
                )
            })
            .collect::<Vec<_>>()
    });
    for (sql, outcome) in refused {
        if sql.starts_with("INSERT") {
            assert!(outcome.is_ok(), "{sql}: {outcome:?}");
            continue;
        }
        let (constraint, message) = outcome.expect_err(sql);
        assert!(
            constraint && message.contains("append-only"),
            "{sql}: {message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_commit_is_synchronous_and_fsync_is_required() {
    let Some(url) = new_database() else { return };
    let _server = node(&url).await;
    let (sync, fsync) = with_conn(&url, |c| {
        (
            c.query_row("SHOW synchronous_commit", [], |r| r.get::<_, String>(0))
                .unwrap(),
            c.query_row("SHOW fsync", [], |r| r.get::<_, String>(0))
                .unwrap(),
        )
    });
    assert_eq!((sync.as_str(), fsync.as_str()), ("on", "on"));
    // A database whose role defaults to asynchronous commits still gets synchronous
    // ones from stategate (it sets them per connection).
    let name = database_of(&url);
    with_conn(&url, move |c| {
        c.execute_batch(&format!(
            "ALTER DATABASE {name} SET synchronous_commit = off"
        ))
        .unwrap()
    });
    let seen = with_conn(&url, |c| {
        c.query_row("SHOW synchronous_commit", [], |r| r.get::<_, String>(0))
            .unwrap()
    });
    assert_eq!(seen, "on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_url_is_a_clear_error_without_the_password() {
    let bad = "postgres://stategate:hunter2-secret@127.0.0.1:1/stategate";
    let err = std::thread::spawn(move || {
        stategate::schema::open_postgres(bad, None)
            .err()
            .expect("nothing listens on port 1")
            .to_string()
    })
    .join()
    .unwrap();
    assert!(err.contains("cannot connect to PostgreSQL"), "{err}");
    assert!(!err.contains("hunter2"), "the password leaked: {err}");
}

/// TLS to the index: the server's certificate is checked against `ca_file` (or the
/// system's roots), whatever `sslmode` says short of `disable`; a certificate nothing
/// vouches for is refused, never used unverified, and never falls back to plaintext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_the_index_is_verified_against_the_configured_roots() {
    let Some(url) = new_database() else { return };
    let ca = std::env::var("STATEGATE_TEST_POSTGRES_CA")
        .map(std::path::PathBuf::from)
        .expect("STATEGATE_TEST_POSTGRES_CA: the CA of the test PostgreSQL's certificate");
    let base = url.split('?').next().unwrap().to_string();
    let rows: Vec<(&str, String, Option<std::path::PathBuf>, bool)> = vec![
        (
            "require, its CA",
            format!("{base}?sslmode=require"),
            Some(ca.clone()),
            true,
        ),
        (
            "require, the system's roots",
            format!("{base}?sslmode=require"),
            None,
            false,
        ),
        (
            "prefer (no sslmode), the system's roots",
            base.clone(),
            None,
            false,
        ),
        ("prefer, its CA", base.clone(), Some(ca.clone()), true),
        (
            "require, a CA file that is no CA",
            format!("{base}?sslmode=require"),
            Some(std::path::PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/Cargo.toml"
            ))),
            false,
        ),
    ];
    for (what, url, ca_file, works) in rows {
        let outcome = std::thread::spawn(move || {
            let conn = Connection::connect_postgres(&url, ca_file.as_deref())?;
            conn.query_row(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                [],
                |r| r.get::<_, bool>(0),
            )
            .map_err(|e| e.to_string())
        })
        .join()
        .unwrap();
        match (works, outcome) {
            (true, Ok(ssl)) => assert!(ssl, "{what}: connected without TLS"),
            (false, Err(e)) => assert!(
                e.contains("cannot connect") || e.contains("ca_file"),
                "{what}: {e}"
            ),
            (works, outcome) => panic!("{what}: expected {works}, got {outcome:?}"),
        }
    }
}

/// The name of the database `url` names.
fn database_of(url: &str) -> String {
    let path = url.split('?').next().unwrap();
    path.rsplit('/').next().unwrap().to_string()
}

/// A bare index on `url` with one table, opened off the async runtime.
fn open_table_db(url: &str) -> Db {
    let url = url.to_string();
    std::thread::spawn(move || {
        Db::open_postgres(
            &url,
            None,
            &["CREATE TABLE t (x BIGINT PRIMARY KEY)".into()],
        )
        .unwrap()
    })
    .join()
    .unwrap()
}

async fn insert(db: &Db, x: i64) -> Result<usize, DbError> {
    db.write(move |c| {
        c.execute("INSERT INTO t VALUES (?1)", [x])
            .map_err(DbError::from)
    })
    .await
}

/// The table's rows, read once: a reader whose session the server ended reads again
/// on a new connection, so even the read that finds out does not fail.
async fn rows(db: &Db) -> Result<Vec<i64>, DbError> {
    db.read(|c| {
        c.prepare("SELECT x FROM t ORDER BY x")?
            .query_map([], |r| r.get(0))?
            .collect()
    })
    .await
}

/// Ends every session on database `name` but the caller's (what a server restart or
/// a failover does to stategate's connections).
fn end_sessions(base: &str, name: &str) {
    let name = name.to_string();
    with_conn(base, move |c| {
        c.query_row(
            "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = ?1 AND pid <> pg_backend_pid()",
            [name.as_str()],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
    });
}

/// PostgreSQL aborts a transaction at its first failed statement, and answers the
/// COMMIT of an aborted transaction with a rollback, not an error. A write whose
/// statement failed is never acknowledged, whether it was alone in its transaction or
/// grouped with others, and even if its code went on as if nothing happened; a failed
/// write changes nothing and the next one commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_statement_failed_is_never_acknowledged() {
    let Some(url) = new_database() else { return };
    let db = open_table_db(&url);
    insert(&db, 1).await.unwrap();
    // (what the job does, acknowledged)
    let swallowed = db
        .write(|c| -> Result<(), DbError> {
            // The duplicate fails; this code ignores it and writes on.
            let _ = c.execute("INSERT INTO t VALUES (1)", []);
            let _ = c.execute("INSERT INTO t VALUES (2)", []);
            Ok(())
        })
        .await;
    assert!(
        swallowed.is_err(),
        "acknowledged a write PostgreSQL rolled back"
    );
    let refused = db
        .write(|c| -> Result<(), DbError> {
            c.execute("INSERT INTO t VALUES (3)", [])?;
            Err(DbError::Task("refused by its own rule".into()))
        })
        .await;
    assert!(refused.is_err());
    assert_eq!(rows(&db).await.unwrap(), vec![1]);
    // Grouped: racing writes, every other one swallowing a failed statement. Only the
    // clean ones are acknowledged, and exactly they are kept.
    let mut tasks = Vec::new();
    for i in 10..60i64 {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            let done = db
                .write(move |c| -> Result<(), DbError> {
                    if i % 2 == 1 {
                        let _ = c.execute("INSERT INTO t VALUES (1)", []);
                    }
                    c.execute("INSERT INTO t VALUES (?1)", [i])
                        .map(drop)
                        .or(Ok(()))
                })
                .await;
            (i, done.is_ok())
        }));
    }
    let mut acknowledged = vec![1];
    for t in tasks {
        let (i, ok) = t.await.unwrap();
        assert_eq!(ok, i % 2 == 0, "write {i}");
        if ok {
            acknowledged.push(i);
        }
    }
    acknowledged.sort();
    assert_eq!(rows(&db).await.unwrap(), acknowledged);
}

/// The index goes away under the writer (its session ended, no new one admitted): a
/// write is told it never ran (`NotBegun`, which the edge answers 503), and changes
/// nothing; once connections are admitted again, the writer reconnects by itself and
/// the next write commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_index_is_gone_runs_nothing_and_reconnects() {
    let Some(url) = new_database() else { return };
    let db = open_table_db(&url);
    insert(&db, 1).await.unwrap();
    let base = std::env::var("STATEGATE_TEST_POSTGRES_URL").unwrap();
    let name = database_of(&url);
    let admit = |allow: bool| {
        let sql = format!("ALTER DATABASE {name} ALLOW_CONNECTIONS {allow}");
        with_conn(&base, move |c| c.execute_batch(&sql).unwrap());
        if !allow {
            end_sessions(&base, &name);
        }
    };
    admit(false);
    let gone = insert(&db, 2).await;
    assert!(matches!(gone, Err(DbError::NotBegun(_))), "{gone:?}");
    assert!(rows(&db).await.is_err(), "a read answered without an index");
    admit(true);
    insert(&db, 3).await.unwrap();
    assert_eq!(
        rows(&db).await.unwrap(),
        vec![1, 3],
        "the refused write left nothing"
    );
}

/// The server ends every session (a restart, a failover). The reader connections do
/// not know until they are used: each read that finds out runs again on a new
/// connection, so no read fails, and the writer reconnects before its next group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_server_ended_are_replaced_without_failing_a_request() {
    let Some(url) = new_database() else { return };
    let db = open_table_db(&url);
    insert(&db, 1).await.unwrap();
    let base = std::env::var("STATEGATE_TEST_POSTGRES_URL").unwrap();
    for _ in 0..2 {
        end_sessions(&base, &database_of(&url));
        // More reads at once than there are readers, so that every reader finds out.
        let reads: Vec<_> = (0..12)
            .map(|_| {
                let db = db.clone();
                tokio::spawn(async move { rows(&db).await })
            })
            .collect();
        for read in reads {
            assert_eq!(read.await.unwrap().unwrap(), vec![1]);
        }
    }
    insert(&db, 2).await.unwrap();
    assert_eq!(rows(&db).await.unwrap(), vec![1, 2]);
}

/// A node frozen in the middle of a write (a paused VM, a partition) holds the
/// index's write lock, and every other node's writes wait for it. The server ends a
/// session that sits idle in its transaction (stategate sets
/// `idle_in_transaction_session_timeout` on every connection, a minute unless the
/// URL's `options` say otherwise), which frees the lock: the others go on, and the
/// frozen node's commit, when it wakes, fails instead of being acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_frozen_inside_a_write_does_not_stop_the_others() {
    use std::time::{Duration, Instant};
    let Some(url) = new_database() else { return };
    let db = open_table_db(&url);
    let setting = |url: &str| {
        with_conn(url, |c| {
            c.query_row("SHOW idle_in_transaction_session_timeout", [], |r| {
                r.get::<_, String>(0)
            })
            .unwrap()
        })
    };
    assert_eq!(
        setting(&url),
        "1min",
        "the default on stategate's connections"
    );
    let join = if url.contains('?') { '&' } else { '?' };
    let frozen_url = format!("{url}{join}options=-c%20idle_in_transaction_session_timeout%3D1500");
    assert_eq!(setting(&frozen_url), "1500ms", "the URL's own wins");
    let (held_tx, held) = std::sync::mpsc::channel();
    let (wake, woken) = std::sync::mpsc::channel::<()>();
    let frozen = std::thread::spawn(move || {
        let c = Connection::connect_postgres(&frozen_url, None).unwrap();
        c.execute_batch(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({})",
            stategate::store::sql::PG_WRITE_LOCK
        ))
        .unwrap();
        c.execute("INSERT INTO t VALUES (99)", []).unwrap();
        held_tx.send(()).unwrap();
        woken.recv().unwrap();
        c.execute_batch("COMMIT")
    });
    held.recv().unwrap();
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(30), insert(&db, 1))
        .await
        .expect("the write still waits for the frozen node's lock")
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "the write did not wait for the lock: {:?}",
        started.elapsed()
    );
    wake.send(()).unwrap();
    assert!(
        frozen.join().unwrap().is_err(),
        "the frozen node's commit went through"
    );
    assert_eq!(rows(&db).await.unwrap(), vec![1]);
}

/// A node measures its clock against the index's when it opens it (and refuses to
/// start beyond `CLOCK_SKEW_MAX_MS`, see `store::db`'s table test): on this machine
/// the two agree, and a clock two minutes ahead is measured as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_measures_its_clock_against_the_index() {
    use stategate::store::db::{clock_skew, CLOCK_SKEW_MAX_MS};
    let Some(url) = new_database() else { return };
    let (agreed, ahead) = with_conn(&url, |c| {
        let now = stategate::tokens::now_ms;
        (
            clock_skew(c, now).unwrap(),
            clock_skew(c, || now() + 120_000).unwrap(),
        )
    });
    assert!(agreed.abs() < 1_000, "{agreed} ms");
    assert!((ahead + 120_000).abs() < 1_000, "{ahead} ms");
    assert!(ahead.abs() > CLOCK_SKEW_MAX_MS);
}

/// A whole-table read (a backup's copy, `index migrate`) goes through a cursor on
/// PostgreSQL, a batch at a time, instead of every row at once: all rows in order, a
/// failure in the middle stops it and leaves no cursor open, and outside a transaction
/// it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_table_is_read_through_a_cursor() {
    let Some(url) = new_database() else { return };
    with_conn(&url, |c| {
        c.execute_batch(
            "CREATE TABLE t (x BIGINT PRIMARY KEY); \
             INSERT INTO t SELECT g FROM generate_series(1, 2500) g",
        )
        .unwrap();
        let scan = "SELECT x FROM t ORDER BY x";
        assert!(
            c.for_each_row(scan, |_| Ok(())).is_err(),
            "outside a transaction"
        );
        c.execute_batch("BEGIN").unwrap();
        let mut seen = Vec::new();
        c.for_each_row(scan, |r| {
            seen.push(r.get::<_, i64>(0)?);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, (1..=2500).collect::<Vec<i64>>());
        let stopped = c.for_each_row(scan, |r| match r.get::<_, i64>(0)? {
            1500 => Err(stategate::store::sql::Error::Value("stop".into())),
            _ => Ok(()),
        });
        assert!(stopped.is_err());
        let open: i64 = c
            .query_row(
                "SELECT count(*) FROM pg_cursors WHERE name <> ''",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(open, 0, "a cursor was left open");
        c.execute_batch("COMMIT").unwrap();
    });
}

/// Issue 38, item 1: a node joining a PostgreSQL index with another key, or with none,
/// used to start (the latter making a fresh key) and answer 401 and 500. The index
/// records the first node's key fingerprint: both are refused before serving, naming
/// it, and no key is made; a node with the nodes' key joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_key_or_none_is_refused_by_the_shared_index() {
    let Some(url) = new_database() else { return };
    let a = node(&url).await;
    let (code, body) = status(a.tf("POST", "w").body(state(1, "l", ""))).await;
    assert_eq!(code, 200, "{body}");
    let fingerprint = a.root.fingerprint();

    let third = |dek: Option<&str>| {
        let dir = tempfile::tempdir().unwrap();
        let config = stategate::config::Config {
            data_dir: dir.path().join("data"),
            dek: dek.map(Into::into),
            index: stategate::config::IndexConfig {
                kind: IndexKind::Postgres,
                url: Some(url.clone().into()),
                ..Default::default()
            },
            ..Default::default()
        };
        (dir, config)
    };
    const OTHER: &str = "HxwdHhkaGxwdHh8ICQoLDA0ODxAREhMUFRYXGBkaGxw=";
    let (_dir, config) = third(Some(OTHER));
    let err = format!(
        "{:#}",
        stategate::server::build_app(&config).await.err().unwrap()
    );
    assert!(
        err.contains("another root key")
            && err.contains(&format!("its index records key fingerprint {fingerprint}")),
        "{err}"
    );
    let (_dir, config) = third(None);
    let err = format!(
        "{:#}",
        stategate::server::build_app(&config).await.err().unwrap()
    );
    assert!(
        err.contains("there is no root key") && err.contains(&fingerprint),
        "{err}"
    );
    assert!(!config.dek_path().exists(), "a new key was made");
    // The nodes' key joins (each test node has a blob store of its own: it writes and
    // reads a workspace of its own).
    let b = node(&url).await;
    let (code, body) = status(b.tf("POST", "w2").body(state(1, "l2", ""))).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = status(b.tf("GET", "w2")).await;
    assert_eq!(code, 200, "{body}");
}

/// The audit event filter's SQL on PostgreSQL finds what `event_matches` says, the
/// words rule (`moved`, `freeze`) and the folding of ASCII case (`Move`, `FREEZE`)
/// included: both spellings of the rule agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_event_filter_agrees_with_its_rule_on_postgres() {
    use stategate::store::audit::{event_matches, list_audit_filtered, AuditFilter};
    let Some(url) = new_database() else { return };
    let _server = node(&url).await;
    let events = [
        "tf.lock_acquired",
        "tf.resources_moved",
        "tf.move_abandoned",
        "tf.frozen",
        "tf.unfrozen",
        "tf.freeze_expired",
        "cluster.state_lock_broken",
        "tf.locking*",
        "Legacy.Resources_Moved",
        "tf.\u{c9}TAT",
    ];
    let filters = [
        "move",
        "moved",
        "moves",
        "freeze",
        "frozen",
        "unfreeze",
        "lock",
        "tf.lock",
        "mo",
        "tf.lock%",
        "move*",
        "MOVE",
        "Move",
        "FREEZE",
        "TF.LOCK",
        "legacy.res",
        "\u{c9}tat",
        "\u{e9}tat",
        "expired",
        "tf.locking*",
    ];
    let got = with_conn(&url, move |c| {
        for event in events {
            c.execute(
                "INSERT INTO audit (at, actor, scope, event, payload) VALUES ('2026-03-01T10:00:00Z', 't', 'tf/a', ?1, '{}')",
                stategate::store::sql::params![event],
            )
            .unwrap();
        }
        filters
            .iter()
            .map(|f| {
                let filter = AuditFilter {
                    event: Some(f.to_string()),
                    scope: Some("tf/a".into()),
                    ..AuditFilter::default()
                };
                let rows = list_audit_filtered(c, &filter, 100).unwrap();
                (*f, rows.into_iter().map(|r| r.event).collect::<Vec<_>>())
            })
            .collect::<Vec<_>>()
    });
    for (filter, found) in got {
        let want: Vec<String> = events
            .iter()
            .filter(|e| event_matches(e, filter))
            .map(|e| e.to_string())
            .collect();
        assert_eq!(found, want, "{filter}");
    }
    let find = |f: &str| -> Vec<&str> {
        events
            .iter()
            .copied()
            .filter(|e| event_matches(e, f))
            .collect()
    };
    assert_eq!(
        find("moved"),
        [
            "tf.resources_moved",
            "tf.move_abandoned",
            "Legacy.Resources_Moved"
        ]
    );
    assert_eq!(find("Move"), find("move"));
    assert_eq!(
        find("FREEZE"),
        ["tf.frozen", "tf.unfrozen", "tf.freeze_expired"]
    );
    // Only ASCII letters fold, on PostgreSQL too.
    assert_eq!(find("\u{e9}tat"), Vec::<&str>::new());
}

/// The `stategate` binary on a PostgreSQL installation (`index.url` = `url`) whose
/// data dir, store and key are `node`'s: (exit code, stdout, stderr).
fn cli(node: &TestServer, url: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stategate"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("STATEGATE_DATA_DIR", &node.config.data_dir)
        .env("STATEGATE_DEK", common::DEK)
        .env("STATEGATE_INDEX", "postgres")
        .env("STATEGATE_INDEX_URL", url)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// `SELECT count(*) …` on the database at `url`.
fn count(url: &str, sql: &'static str) -> i64 {
    with_conn(url, move |c| c.query_row(sql, [], |r| r.get(0)).unwrap())
}

/// An operator command on a PostgreSQL database no node has opened is refused (or,
/// `workspace env`, needs none) and makes no table there (`installation::require_index`): only `serve`, a rebuild or a
/// restore make an index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_on_a_database_no_node_opened_is_refused_and_makes_no_table() {
    let Some(url) = new_database() else { return };
    let Some(empty) = new_database() else { return };
    let live = node(&url).await;
    let commands: [&[&str]; 5] = [
        &["workspace", "list"],
        &["workspace", "history", "prod"],
        &["prune", "--dry-run"],
        &["backup"],
        &["key", "status"],
    ];
    for args in commands {
        let (code, _, err) = cli(&live, &empty, args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains("holds no index yet"), "{args:?}: {err}");
    }
    // `workspace env` needs no index (a workspace is at generation 0 until rotated).
    let (code, out, err) = cli(&live, &empty, &["workspace", "env", "prod"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("TF_HTTP_PASSWORD"), "{out}");
    let tables = "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()";
    assert_eq!(count(&empty, tables), 0);
}

/// `index rebuild` and `restore` on a PostgreSQL installation write into an empty
/// PostgreSQL database named by `--into`: from the store alone, and from a backup plus
/// the version written after it, or into the configured database while it holds no
/// index. A node on the restored database serves the newest state. A database that
/// holds an index, or a file path, is refused and nothing is written; the scratch file
/// in the data dir is gone afterwards; no password is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_and_restore_write_a_postgres_index_from_the_store_alone_and_a_backup() {
    let Some(url) = new_database() else { return };
    let live = node(&url).await;
    let write = |serial: u64| status(live.tf("POST", "prod").body(state(serial, "l", "")));
    for serial in 1..=2 {
        assert_eq!(write(serial).await.0, 200);
    }
    let (code, _, err) = cli(&live, &url, &["backup"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(write(3).await.0, 200, "a version after the backup");
    let password = |text: &str| {
        let secret = url.split_once("://").and_then(|(_, r)| r.split_once('@'));
        secret.is_some_and(|(user, _)| user.contains(':') && text.contains(user))
    };

    // From the store alone.
    let Some(rebuilt) = new_database() else {
        return;
    };
    let (code, out, err) = cli(&live, &url, &["index", "rebuild", "--into", &rebuilt]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("3 version(s) of 1 scope(s)"), "{out}");
    assert!(out.contains("set index.url to PostgreSQL "), "{out}");
    assert!(!password(&out) && !password(&err), "{out}{err}");
    assert_eq!(count(&rebuilt, "SELECT count(*) FROM versions"), 3);
    assert_eq!(count(&rebuilt, "SELECT count(*) FROM key_fingerprint"), 1);
    assert_eq!(
        count(&rebuilt, "SELECT count(*) FROM tf_state_encryption"),
        3
    );

    // From the newest backup and the version written after it.
    let Some(restored) = new_database() else {
        return;
    };
    let (code, out, err) = cli(&live, &url, &["restore", "--into", &restored]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Added 1 version(s)"), "{out}");
    assert_eq!(count(&restored, "SELECT count(*) FROM versions"), 3);
    assert_eq!(
        count(
            &restored,
            "SELECT count(*) FROM audit WHERE event = 'index.restored'"
        ),
        1
    );
    let scratch = std::fs::read_dir(&live.config.data_dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(".new-index-"))
        .count();
    assert_eq!(scratch, 0, "the scratch files are gone");

    // Refused, writing nothing: a database holding an index (the live one, used by a
    // node besides; the rebuilt one), and a file path.
    for into in [&url, &rebuilt] {
        for command in [&["index", "rebuild", "--into"][..], &["restore", "--into"]] {
            let (code, _, err) = cli(&live, &url, &[command, &[into.as_str()]].concat());
            assert_eq!(code, 1, "{command:?} {err}");
            assert!(
                err.contains("holds an index already") || err.contains("other stategate sessions"),
                "{err}"
            );
        }
    }
    let file = live.dir.path().join("new.db");
    let (code, _, err) = cli(&live, &url, &["restore", "--into", file.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("URL of an empty PostgreSQL") || err.contains("by its URL"),
        "{err}"
    );
    assert!(!file.exists());
    assert_eq!(count(&rebuilt, "SELECT count(*) FROM versions"), 3);

    // Into the configured database itself, while no node has opened it: in place.
    let Some(empty) = new_database() else { return };
    let (code, out, err) = cli(&live, &empty, &["index", "rebuild", "--into", &empty]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("It is this installation's index already"),
        "{out}"
    );
    assert_eq!(count(&empty, "SELECT count(*) FROM versions"), 3);

    // A node on the restored index, over the same store, serves the newest state.
    let blobs = live.config.local_store_path();
    let back = TestServer::start_with(move |c| {
        c.index.kind = IndexKind::Postgres;
        c.index.url = Some(restored.into());
        c.store.path = Some(blobs);
    })
    .await;
    let (code, body) = status(back.tf("GET", "prod")).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"serial\":3"), "{body}");
}

/// The downgrade policy's rollback guard and a restore's posture on PostgreSQL: a
/// rollback to a plaintext version over an encrypted state is refused with nothing
/// written, goes through once allowed (the override used up and audited), and a
/// restored encrypted state is judged as encrypted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_to_plaintext_over_encrypted_is_refused_on_postgres() {
    let Some(url) = new_database() else { return };
    let pg = url.clone();
    let s = TestServer::start_with(move |c| {
        c.index.kind = IndexKind::Postgres;
        c.index.url = Some(pg.into());
        c.tofu.refuse_plaintext_after_encrypted = vec!["prod".into()];
    })
    .await;
    let envelope = |serial: u64| {
        format!(
            r#"{{"serial":{serial},"lineage":"L","meta":{{"key_provider.pbkdf2.main":"eyJzYWx0IjoiYWJjIiwiaXRlcmF0aW9ucyI6NjAwMDAwfQ=="}},"encrypted_data":"q83vEjRWeJCrze8SNFZ4kA==","encryption_version":"v0"}}"#
        )
    };
    for body in [state(1, "L", ""), envelope(2)] {
        assert_eq!(status(s.tf("POST", "prod").body(body)).await.0, 200);
    }
    let tofu = &s.app.tofu;
    let err = tofu.rollback("prod", 1, "op").await.unwrap_err();
    assert!(err.to_string().contains("allow-write prod"), "{err}");
    assert_eq!(count(&url, "SELECT count(*) FROM versions"), 2);
    tofu.allow_write("prod", 5, "decrypt", "op").await.unwrap();
    tofu.rollback("prod", 1, "op").await.unwrap();
    assert_eq!(count(&url, "SELECT count(*) FROM tf_write_overrides"), 0);
    assert_eq!(
        count(
            &url,
            "SELECT count(*) FROM audit WHERE event = 'tf.write_override_used'"
        ),
        1
    );
    // Encrypted again, deleted, restored: the restored version is recorded encrypted.
    assert_eq!(status(s.tf("POST", "prod").body(envelope(9))).await.0, 200);
    assert_eq!(status(s.tf("DELETE", "prod")).await.0, 200);
    tofu.restore("prod", "op").await.unwrap();
    assert_eq!(
        count(
            &url,
            "SELECT count(*) FROM tf_state_encryption WHERE workspace = 'prod' AND version = 6 AND encrypted = 1"
        ),
        1
    );
    assert_eq!(
        status(s.tf("POST", "prod").body(state(10, "L", "")))
            .await
            .0,
        409
    );
}
