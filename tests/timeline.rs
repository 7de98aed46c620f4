//! Who wrote every version and which resources each version changed, in process: the
//! real gateway over real SQLite and a local blob store, driven over HTTP like
//! Terraform (LOCK, POST ?ID=, UNLOCK) and through the admin API like an operator.

mod common;

use common::{state, status, AdminEnv};
use serde_json::{json, Value};

const OPS: &str = "ops@example.com";

/// The shared setup (`common::AdminEnv`) and this file's helpers over it.
struct Env(AdminEnv);

impl std::ops::Deref for Env {
    type Target = AdminEnv;
    fn deref(&self) -> &AdminEnv {
        &self.0
    }
}

impl Env {
    async fn start() -> Env {
        Env(AdminEnv::start(OPS).await)
    }

    async fn json(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (code, text) = self.admin(method, path, body).await;
        assert_eq!(code, 200, "{method} {path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// Terraform's apply: LOCK with `who`, POST under the lock ID, UNLOCK.
    async fn apply(&self, ws: &str, who: &str, body: String) {
        let id = format!("lock-{}", body.len());
        let info = json!({"ID": id, "Operation": "OperationTypeApply", "Info": "", "Who": who,
                          "Version": "1.15.0", "Created": "2026-11-30T00:00:00Z", "Path": ""})
        .to_string();
        let s = &self.server;
        assert_eq!(status(s.tf("LOCK", ws).body(info.clone())).await.0, 200);
        let url = format!("{}?ID={id}", s.url(ws));
        let post = reqwest::Client::new()
            .post(url)
            .basic_auth("stategate", Some(s.bearer(ws)))
            .body(body);
        let (code, text) = status(post).await;
        assert_eq!(code, 200, "{text}");
        assert_eq!(status(s.tf("UNLOCK", ws).body(info)).await.0, 200);
    }

    async fn versions(&self, ws: &str) -> Vec<Value> {
        let v = self
            .json("GET", &format!("workspaces/{ws}/versions"), None)
            .await;
        v["versions"].as_array().unwrap().clone()
    }

    /// (version, change, address, writer) of the timeline, newest first.
    async fn timeline(&self, ws: &str, query: &str) -> Vec<(i64, String, String, String)> {
        let v = self
            .json("GET", &format!("workspaces/{ws}/timeline{query}"), None)
            .await;
        v["changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["version"].as_i64().unwrap(),
                    c["change"].as_str().unwrap().to_string(),
                    c["address"].as_str().unwrap().to_string(),
                    c["writer"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }
}

fn instance(index: Option<&str>, attrs: &str) -> String {
    match index {
        Some(key) => format!(r#"{{"index_key":{key},"schema_version":0,"attributes":{attrs}}}"#),
        None => format!(r#"{{"schema_version":0,"attributes":{attrs}}}"#),
    }
}

fn resource(module: Option<&str>, kind: &str, name: &str, instances: &[String]) -> String {
    let module = module.map_or(String::new(), |m| format!(r#""module":"{m}","#));
    format!(
        r#"{{{module}"mode":"managed","type":"{kind}","name":"{name}","provider":"provider[\"registry.terraform.io/hashicorp/null\"]","instances":[{}]}}"#,
        instances.join(",")
    )
}

/// A write under a lock records the credential, the lock's Who and Operation, in the
/// version row, the blob header, the admin API listing and the audit row; an unlocked
/// write records only the credential; a rollback records the operator and "rollback of
/// vN"; a drift run's credential writes as `drift:run-N`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_version_names_its_writer() {
    let env = Env::start().await;
    let s = &env.server;
    let one = resource(
        None,
        "null_resource",
        "a",
        &[instance(None, r#"{"id":"1"}"#)],
    );
    env.apply("prod", "ci@runner-3", state(1, "lin", &one))
        .await;
    // Without a lock (-lock=false): only the credential.
    assert_eq!(
        status(s.tf("POST", "prod").body(state(2, "lin", "")))
            .await
            .0,
        200
    );
    // A drift run's credential (as `drift` issues it) writes as that run.
    let (secret, hash) = stategate::tofu::run_credential::new_secret().unwrap();
    stategate::tofu::run_credential::insert(&s.db(), &hash, "prod", "drift:run-7", i64::MAX)
        .unwrap();
    let post = reqwest::Client::new()
        .post(s.url("prod"))
        .basic_auth("stategate", Some(secret))
        .body(state(3, "lin", ""));
    assert_eq!(status(post).await.0, 200);
    // An operator rolls back to version 1.
    let done = env
        .json(
            "POST",
            "workspaces/prod/rollback",
            Some(json!({"to": 1, "from": 3})),
        )
        .await;
    assert_eq!(done["current"]["version"], 4, "{done}");

    let rows = env.versions("prod").await;
    let facts: Vec<(i64, &str, Value, Value, Value, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["version"].as_i64().unwrap(),
                r["writer"].as_str().unwrap(),
                r["lock_who"].clone(),
                r["lock_operation"].clone(),
                r["restored_from"].clone(),
                r["written_by"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        facts,
        vec![
            (
                4,
                "operator:ops@example.com",
                Value::Null,
                Value::Null,
                json!(1),
                "operator:ops@example.com · rollback of v1"
            ),
            (
                3,
                "drift:run-7",
                Value::Null,
                Value::Null,
                Value::Null,
                "drift:run-7"
            ),
            (
                2,
                "tf:prod",
                Value::Null,
                Value::Null,
                Value::Null,
                "tf:prod"
            ),
            (
                1,
                "tf:prod",
                json!("ci@runner-3"),
                json!("OperationTypeApply"),
                Value::Null,
                "ci@runner-3 (apply) via tf:prod"
            ),
        ]
    );
    // The same facts are sealed into each blob's authenticated header.
    let conn = s.db();
    let key: String = conn
        .query_row(
            "SELECT blob_key FROM versions WHERE scope = 'tf/prod' AND version = 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let blob = std::fs::read(s.config.local_store_path().join(&key)).unwrap();
    let header = stategate::store::format::read_header(&blob).unwrap();
    assert_eq!(header.facts.lock_who.as_deref(), Some("ci@runner-3"));
    // Every tf.* audit row names the credential that acted, and the write under the
    // lock keeps its Who/Operation.
    let mut stmt = conn
        .prepare("SELECT event, actor, payload FROM audit WHERE scope = 'tf/prod' ORDER BY id")
        .unwrap();
    let audit: Vec<(String, String, Value)> = stmt
        .query_map([], |r| {
            let payload: String = r.get(2)?;
            Ok((
                r.get(0)?,
                r.get(1)?,
                serde_json::from_str(&payload).unwrap(),
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let actors: Vec<(&str, &str)> = audit
        .iter()
        .map(|(e, a, _)| (e.as_str(), a.as_str()))
        .collect();
    assert_eq!(
        actors,
        vec![
            ("tf.lock_acquired", "tf:prod"),
            ("tf.state_written", "tf:prod"),
            ("tf.lock_released", "tf:prod"),
            ("tf.state_written", "tf:prod"),
            ("tf.state_written", "drift:run-7"),
            ("tf.rollback", "operator:ops@example.com"),
        ]
    );
    let written = &audit[1].2;
    assert_eq!(
        (&written["who"], &written["operation"]),
        (&json!("ci@runner-3"), &json!("OperationTypeApply"))
    );
    assert!(audit[3].2.get("who").is_none(), "{}", audit[3].2);
}

/// A client-supplied Who is bounded and cleaned before it is recorded anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_lock_who_is_bounded() {
    let env = Env::start().await;
    let who = format!("evil\u{7}\n{}", "x".repeat(5000));
    env.apply("prod", &who, state(1, "lin", "")).await;
    let rows = env.versions("prod").await;
    let kept = rows[0]["lock_who"].as_str().unwrap();
    assert!(kept.chars().count() <= 256 && kept.len() > 200, "{kept}");
    assert!(kept.starts_with("evilxxx") && !kept.chars().any(char::is_control));
}

/// The timeline names exactly the instance addresses each version added, changed or
/// removed (modules, count and for_each keys), with who wrote it; a rollback and a
/// deletion have their timeline too; an unchanged instance never appears; a query by
/// address finds its instances and a module's contents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeline_names_what_each_version_changed() {
    let env = Env::start().await;
    let s = &env.server;
    let v1 = [
        resource(
            None,
            "null_resource",
            "one",
            &[instance(None, r#"{"id":"1"}"#)],
        ),
        resource(
            None,
            "null_resource",
            "many",
            &[
                instance(Some("0"), r#"{"id":"m0"}"#),
                instance(Some("1"), r#"{"id":"m1"}"#),
            ],
        ),
        resource(
            Some("module.net"),
            "null_resource",
            "subnet",
            &[instance(Some(r#""a""#), r#"{"id":"sa"}"#)],
        ),
    ];
    env.apply("prod", "alice@laptop", state(1, "lin", &v1.join(",")))
        .await;
    // v2: one attribute of many[1] changes, module.net's for_each gets key "b".
    let v2 = [
        v1[0].clone(),
        resource(
            None,
            "null_resource",
            "many",
            &[
                instance(Some("0"), r#"{"id":"m0"}"#),
                instance(Some("1"), r#"{"id":"m1-new"}"#),
            ],
        ),
        resource(
            Some("module.net"),
            "null_resource",
            "subnet",
            &[
                instance(Some(r#""a""#), r#"{"id":"sa"}"#),
                instance(Some(r#""b""#), r#"{"id":"sb"}"#),
            ],
        ),
    ];
    env.apply("prod", "bob@ci", state(2, "lin", &v2.join(",")))
        .await;
    // v3: null_resource.one destroyed.
    env.apply("prod", "bob@ci", state(3, "lin", &v2[1..].join(",")))
        .await;
    // v4: rollback to v2 brings one back.
    env.json(
        "POST",
        "workspaces/prod/rollback",
        Some(json!({"to": 2, "from": 3})),
    )
    .await;

    let op = "operator:ops@example.com".to_string();
    let tf = "tf:prod".to_string();
    let all = env.timeline("prod", "").await;
    let expect = |rows: &[(i64, &str, &str, &String)]| -> Vec<(i64, String, String, String)> {
        rows.iter()
            .map(|(v, c, a, w)| (*v, c.to_string(), a.to_string(), w.to_string()))
            .collect()
    };
    assert_eq!(
        all,
        expect(&[
            (4, "added", "null_resource.one", &op),
            (3, "removed", "null_resource.one", &tf),
            (2, "added", "module.net.null_resource.subnet[\"b\"]", &tf),
            (2, "changed", "null_resource.many[1]", &tf),
            (1, "added", "module.net.null_resource.subnet[\"a\"]", &tf),
            (1, "added", "null_resource.many[0]", &tf),
            (1, "added", "null_resource.many[1]", &tf),
            (1, "added", "null_resource.one", &tf),
        ])
    );
    // By address: the resource's instances; a module's contents; an exact instance.
    let many = env.timeline("prod", "?address=null_resource.many").await;
    assert_eq!(
        many.iter().map(|r| (r.0, r.2.as_str())).collect::<Vec<_>>(),
        vec![
            (2, "null_resource.many[1]"),
            (1, "null_resource.many[0]"),
            (1, "null_resource.many[1]")
        ]
    );
    let module = env.timeline("prod", "?address=module.net").await;
    assert_eq!(module.len(), 2, "{module:?}");
    let exact = env
        .timeline("prod", "?address=null_resource.many%5B0%5D")
        .await;
    assert_eq!(exact.len(), 1, "{exact:?}");
    assert!(env
        .timeline("prod", "?address=null_resource.man")
        .await
        .is_empty());
    let limited = env.timeline("prod", "?limit=2").await;
    assert_eq!(limited.len(), 2);
    // The version rows carry the counts; the JSON names the lock's Who per change.
    let rows = env.versions("prod").await;
    let counts: Vec<Value> = rows.iter().map(|r| r["changes"].clone()).collect();
    assert_eq!(
        counts,
        vec![
            json!({"added": 1, "changed": 0, "removed": 0, "moved": 0}),
            json!({"added": 0, "changed": 0, "removed": 1, "moved": 0}),
            json!({"added": 1, "changed": 1, "removed": 0, "moved": 0}),
            json!({"added": 4, "changed": 0, "removed": 0, "moved": 0}),
        ]
    );
    let v = env
        .json("GET", "workspaces/prod/timeline?limit=1", None)
        .await;
    assert_eq!(
        v["changes"][0]["written_by"],
        "operator:ops@example.com · rollback of v2"
    );
    // A deletion removes every address; a new state after it adds them all again.
    assert_eq!(status(s.tf("DELETE", "prod")).await.0, 200);
    let after = env.timeline("prod", "?limit=5").await;
    assert!(
        after.iter().all(|r| r.0 == 5 && r.1 == "removed"),
        "{after:?}"
    );
    assert_eq!(
        s.count("SELECT count(*) FROM resource_changes WHERE version = 5"),
        5
    );
}

/// A state the server cannot read (OpenTofu's encrypted envelope) records no timeline
/// (counts unknown), and the version after it, compared with nothing known, none
/// either; the one after that is compared again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_state_records_no_timeline() {
    let env = Env::start().await;
    let s = &env.server;
    let one = resource(
        None,
        "null_resource",
        "a",
        &[instance(None, r#"{"id":"1"}"#)],
    );
    let post = |body: String| status(s.tf("POST", "enc").body(body));
    assert_eq!(post(state(1, "lin", &one)).await.0, 200);
    let envelope =
        r#"{"serial":2,"lineage":"lin","meta":{},"encrypted_data":"ZZ","encryption_version":"v0"}"#;
    assert_eq!(post(envelope.to_string()).await.0, 200);
    assert_eq!(post(state(3, "lin", &one)).await.0, 200);
    assert_eq!(post(state(4, "lin", "")).await.0, 200);
    let rows = env.versions("enc").await;
    let counts: Vec<Value> = rows.iter().map(|r| r["changes"].clone()).collect();
    assert_eq!(
        counts,
        vec![
            json!({"added": 0, "changed": 0, "removed": 1, "moved": 0}),
            Value::Null,
            Value::Null,
            json!({"added": 1, "changed": 0, "removed": 0, "moved": 0}),
        ]
    );
}

/// Bad timeline queries are refused with 400 (unknown workspace 404) and change
/// nothing; no address is echoed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_timeline_queries_are_refused() {
    let env = Env::start().await;
    let s = &env.server;
    assert_eq!(
        status(s.tf("POST", "prod").body(state(1, "lin", "")))
            .await
            .0,
        200
    );
    let long = "a".repeat(513);
    let table = [
        ("workspaces/prod/timeline?address=%07x".to_string(), 400),
        (format!("workspaces/prod/timeline?address={long}"), 400),
        ("workspaces/prod/timeline?address=".to_string(), 400),
        ("workspaces/prod/timeline?limit=0".to_string(), 400),
        (
            "workspaces/prod/timeline?limit=99999999999".to_string(),
            400,
        ),
        ("workspaces/none/timeline".to_string(), 404),
    ];
    let before = common::roles::snapshot(s);
    for (path, code) in table {
        let (got, body) = env.admin("GET", &path, None).await;
        assert_eq!(got, code, "{path}: {body}");
        assert!(!body.contains(&long), "{path}: the address is not echoed");
    }
    assert_eq!(common::roles::snapshot(s), before);
}

/// An index rebuilt from the blobs alone has the same writers (from the sealed
/// headers) and the same resource timeline (recomputed from the content) as the live
/// index, and the next write after it is compared as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_and_the_timeline_survive_an_index_rebuild() {
    let env = Env::start().await;
    let s = &env.server;
    let a = |id: &str| {
        resource(
            None,
            "null_resource",
            "a",
            &[instance(None, &format!(r#"{{"id":"{id}"}}"#))],
        )
    };
    let b = resource(
        Some("module.m"),
        "null_resource",
        "b",
        &[instance(Some("0"), r#"{"id":"b"}"#)],
    );
    env.apply("prod", "ci@runner-3", state(1, "lin", &a("1")))
        .await;
    env.apply(
        "prod",
        "ci@runner-4",
        state(2, "lin", &format!("{},{b}", a("2"))),
    )
    .await;
    env.json(
        "POST",
        "workspaces/prod/rollback",
        Some(json!({"to": 1, "from": 2})),
    )
    .await;
    // A move out of prod: its version names where the resource went (issue 38, item 9),
    // in the sealed header too, so the rebuild brings it back.
    env.apply("app", "ci@runner-5", state(1, "lin-app", ""))
        .await;
    env.json(
        "POST",
        "workspaces/prod/move/app",
        Some(json!({"addresses": ["null_resource.a"]})),
    )
    .await;
    let read = |conn: &stategate::store::sql::Connection| {
        // Each row's columns as SQL literals (NULL included), compared whole.
        let versions: Vec<String> = conn
            .prepare("SELECT version, actor, lock_who, lock_operation, restored_from, res_added, res_changed, res_removed, moved_to, moved_from FROM versions WHERE scope IN ('tf/prod', 'tf/app') ORDER BY scope DESC, version")
            .unwrap()
            .query_map([], |r| {
                (0..10)
                    .map(|i| r.get_ref(i).map(literal))
                    .collect::<Result<Vec<_>, _>>()
                    .map(|cols| cols.join(" "))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let changes: Vec<(i64, String, String)> = conn
            .prepare("SELECT version, address, change FROM resource_changes WHERE scope = 'tf/prod' ORDER BY version, address")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let digests: Vec<(String, i64)> = conn
            .prepare("SELECT scope, version FROM resource_summary_heads ORDER BY scope")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        (versions, changes, digests)
    };
    let live = read(&s.db());
    assert_eq!(
        live.0,
        vec![
            "1 'tf:prod' 'ci@runner-3' 'OperationTypeApply' NULL 1 0 0 NULL NULL",
            "2 'tf:prod' 'ci@runner-4' 'OperationTypeApply' NULL 1 1 0 NULL NULL",
            "3 'operator:ops@example.com' NULL NULL 1 0 1 1 NULL NULL",
            "4 'operator:ops@example.com' NULL NULL NULL 0 0 1 'app' NULL",
            "1 'tf:app' 'ci@runner-5' 'OperationTypeApply' NULL 0 0 0 NULL NULL",
            "2 'operator:ops@example.com' NULL NULL NULL 1 0 0 NULL 'prod'",
        ]
    );
    assert_eq!(live.1.len(), 6, "{:?}", live.1);
    let dir = tempfile::tempdir().unwrap();
    let into = dir.path().join("rebuilt.db");
    let keys = stategate::schema::scope_keys(s.root.clone(), None);
    let blobs = stategate::store::LocalStore::open(&s.config.local_store_path()).unwrap();
    stategate::store::rebuild::rebuild_index(&blobs, &keys, &into, stategate::schema::ALL)
        .await
        .unwrap();
    let rebuilt = read(&stategate::store::sql::Connection::open(&into).unwrap());
    assert_eq!(rebuilt, live);
}

/// A column's value as an SQL literal (SQLite's `quote`), read the same from either
/// kind of index.
fn literal(value: stategate::store::sql::ValueRef<'_>) -> String {
    use stategate::store::sql::ValueRef;
    match value {
        ValueRef::Null => "NULL".into(),
        ValueRef::Integer(i) => i.to_string(),
        ValueRef::Real(f) => f.to_string(),
        ValueRef::Text(t) => format!("'{}'", String::from_utf8_lossy(t).replace('\'', "''")),
        ValueRef::Blob(b) => format!("X'{}'", hex::encode_upper(b)),
    }
}

/// A column's value written plainly: text as it is, a blob in upper-case hex.
fn plain(value: stategate::store::sql::ValueRef<'_>) -> String {
    use stategate::store::sql::ValueRef;
    match value {
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
        ValueRef::Blob(b) => hex::encode_upper(b),
        other => literal(other),
    }
}

/// A restore recomputes the resource timeline a snapshot does not have: from a
/// snapshot shaped like the release before the timeline (no `resource_changes` or
/// kept summaries, no writer or count columns in `versions`), the restored index
/// has the live index's counts, changes and newest summaries, for the versions of the
/// snapshot and for the one written after it; a snapshot that has the timeline keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_recomputes_the_timeline_an_earlier_releases_snapshot_lacks() {
    use stategate::store::backup;
    let env = Env::start().await;
    let s = &env.server;
    let a = |id: &str| {
        resource(
            None,
            "null_resource",
            "a",
            &[instance(None, &format!(r#"{{"id":"{id}"}}"#))],
        )
    };
    let b = |id: &str| {
        resource(
            Some("module.m"),
            "null_resource",
            "b",
            &[
                instance(Some("0"), &format!(r#"{{"id":"b0-{id}"}}"#)),
                instance(Some("1"), r#"{"id":"b1"}"#),
            ],
        )
    };
    env.apply("prod", "ci@runner-3", state(1, "lin", &a("1")))
        .await;
    env.apply(
        "prod",
        "ci@runner-4",
        state(2, "lin", &format!("{},{}", a("2"), b("1"))),
    )
    .await;
    env.apply("other", "ci@runner-5", state(1, "lin-o", &b("1")))
        .await;
    let blobs = stategate::store::LocalStore::open(&s.config.local_store_path()).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    // The live index copied, then cut back to the earlier release's shape.
    let old = scratch.path().join("old.db");
    let snapshot = stategate::store::index::Index::of(&s.config)
        .snapshot(&stategate::schema::INDEX, scratch.path());
    let bytes = tokio::task::spawn_blocking(snapshot)
        .await
        .unwrap()
        .unwrap();
    std::fs::write(&old, bytes).unwrap();
    stategate::store::sql::Connection::open(&old)
        .unwrap()
        .execute_batch(
            "DROP TABLE resource_changes; DROP TABLE resource_summary_heads; DROP TABLE resource_instance_digests;
             ALTER TABLE versions DROP COLUMN lock_who; ALTER TABLE versions DROP COLUMN lock_operation;
             ALTER TABLE versions DROP COLUMN restored_from; ALTER TABLE versions DROP COLUMN res_added;
             ALTER TABLE versions DROP COLUMN res_changed; ALTER TABLE versions DROP COLUMN res_removed;",
        )
        .unwrap();
    let old_snap = backup::take_backup(&old, scratch.path(), &blobs, &s.root)
        .await
        .unwrap();
    let current_snap = backup::take_backup_from(
        stategate::store::index::Index::of(&s.config)
            .snapshot(&stategate::schema::INDEX, scratch.path()),
        &blobs,
        &s.root,
    )
    .await
    .unwrap();
    // After both snapshots: b's second instance removed, a changed, in a later version.
    env.apply(
        "prod",
        "ci@runner-6",
        state(3, "lin", &format!("{},{}", a("3"), b("1"))),
    )
    .await;
    env.apply(
        "prod",
        "ci@runner-6",
        state(
            4,
            "lin",
            &format!(
                "{},{}",
                a("3"),
                resource(
                    Some("module.m"),
                    "null_resource",
                    "b",
                    &[instance(Some("0"), r#"{"id":"b0-1"}"#)]
                )
            ),
        ),
    )
    .await;
    let read = |conn: &stategate::store::sql::Connection| {
        // Each row's columns, written plainly and joined by spaces.
        let rows = |sql: &str, n: usize| -> Vec<String> {
            conn.prepare(sql)
                .unwrap()
                .query_map([], |r| {
                    (0..n)
                        .map(|i| r.get_ref(i).map(plain))
                        .collect::<Result<Vec<_>, _>>()
                        .map(|cols| cols.join(" "))
                })
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        // Each kept summary: its scope, version and instance digests (address=HEX, by
        // address).
        let mut heads: Vec<String> = Vec::new();
        for row in rows("SELECT h.scope, h.version, d.address, d.digest FROM resource_summary_heads h JOIN resource_instance_digests d ON d.scope = h.scope ORDER BY h.scope, d.address", 4) {
            let mut cols = row.splitn(4, ' ');
            let head = format!("{} {}", cols.next().unwrap(), cols.next().unwrap());
            let digest = format!("{}={}", cols.next().unwrap(), cols.next().unwrap());
            match heads.last_mut() {
                Some(last) if last.starts_with(&format!("{head} ")) => {
                    last.push(',');
                    last.push_str(&digest);
                }
                _ => heads.push(format!("{head} {digest}")),
            }
        }
        (
            rows("SELECT scope, version, res_added, res_changed, res_removed FROM versions ORDER BY scope, version", 5),
            rows("SELECT scope, version, change, address FROM resource_changes ORDER BY scope, version, address", 4),
            heads,
        )
    };
    let live = read(&s.db());
    assert_eq!(
        live.0,
        vec![
            "tf/other 1 2 0 0",
            "tf/prod 1 1 0 0",
            "tf/prod 2 2 1 0",
            "tf/prod 3 0 1 0",
            "tf/prod 4 0 0 1",
        ]
    );
    assert_eq!(live.1.len(), 8, "{:?}", live.1);
    assert_eq!(live.2.len(), 2, "{:?}", live.2);
    let keys = stategate::schema::scope_keys(s.root.clone(), None);
    for (case, snap) in [("earlier release", old_snap), ("current", current_snap)] {
        let into = scratch.path().join(format!("restored-{}.db", case.len()));
        let report = backup::restore(
            &blobs,
            &s.root,
            &keys,
            snap,
            &into,
            stategate::schema::MIGRATIONS,
            stategate::schema::ALL,
            &|_, _| {},
            &mut |_| Ok(()),
        )
        .await
        .unwrap();
        let added: Vec<i64> = report.added.iter().map(|r| r.version).collect();
        assert_eq!(added, vec![3, 4], "{case}");
        assert_eq!(
            read(&stategate::store::sql::Connection::open(&into).unwrap()),
            live,
            "{case}"
        );
    }
}
