//! Moving resources between workspaces in process on port 0 (`tofu::moves`, admin
//! `POST workspaces/{src}/move/{dst}`): one new version of each, lineages kept, one
//! audit event naming both, no lock left; and every refusal changes nothing.

mod common;

use common::{lock_info, state, status, TestServer};
use serde_json::{json, Value};
use stategate::operator::identity as operators;

const OPS: &str = "ops@example.com";

struct Env {
    server: TestServer,
    token: String,
}

fn resource(name: &str, instances: usize) -> String {
    let list: Vec<String> = (0..instances)
        .map(|i| format!(r#"{{"index_key":{i},"attributes":{{"id":"{name}-{i}"}}}}"#))
        .collect();
    format!(
        r#"{{"mode":"managed","type":"terraform_data","name":"{name}","provider":"provider[\"terraform.io/builtin/terraform\"]","instances":[{}]}}"#,
        list.join(",")
    )
}

impl Env {
    async fn start_with(adjust: impl FnOnce(&mut stategate::config::Config)) -> Env {
        let server = TestServer::start_with(adjust).await;
        let token = server
            .app
            .operator
            .admin_write(|c| operators::create_operator(c, OPS, "test"))
            .await
            .unwrap();
        Env { server, token }
    }

    async fn put(&self, ws: &str, serial: u64, lineage: &str, resources: &[String]) {
        let body = state(serial, lineage, &resources.join(","));
        let (code, text) = status(self.server.tf("POST", ws).body(body)).await;
        assert_eq!(code, 200, "{text}");
    }

    async fn moves(&self, src: &str, dst: &str, body: Value) -> (u16, String) {
        status(
            reqwest::Client::new()
                .post(format!(
                    "{}/api/v1/admin/workspaces/{src}/move/{dst}",
                    self.server.base
                ))
                .bearer_auth(&self.token)
                .body(body.to_string()),
        )
        .await
    }

    async fn current(&self, ws: &str) -> Value {
        let (code, body) = status(self.server.tf("GET", ws)).await;
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// Everything a refused move could have changed.
    fn snapshot(&self) -> Vec<i64> {
        [
            "SELECT count(*) FROM versions",
            "SELECT coalesce(max(id), 0) FROM audit",
            "SELECT count(*) FROM tf_locks",
            "SELECT count(*) FROM tf_locks WHERE lock_id LIKE 'stategate-move-%'",
            "SELECT count(*) FROM tf_state_encryption",
        ]
        .iter()
        .map(|sql| self.server.count(sql))
        .chain([self.server.blob_files().len() as i64])
        .collect()
    }
}

fn names(doc: &Value) -> Vec<String> {
    doc["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_move_writes_one_version_of_each_and_one_audit_event() {
    let env = Env::start_with(|_| {}).await;
    env.put(
        "net",
        5,
        "lin-net",
        &[resource("a", 2), resource("b", 1), resource("keep", 1)],
    )
    .await;
    env.put("app", 2, "lin-app", &[resource("x", 1)]).await;
    let (code, text) = env
        .moves(
            "net",
            "app",
            json!({"addresses": ["terraform_data.a", "terraform_data.b"]}),
        )
        .await;
    assert_eq!(code, 200, "{text}");
    let done: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        done["from"],
        json!({"workspace": "net", "version": 2, "serial": 6})
    );
    assert_eq!(
        done["to"],
        json!({"workspace": "app", "version": 2, "serial": 3})
    );
    assert_eq!(done["instances"], 3);
    let (net, app) = (env.current("net").await, env.current("app").await);
    assert_eq!(
        (net["serial"].as_i64(), net["lineage"].as_str()),
        (Some(6), Some("lin-net"))
    );
    assert_eq!(
        (app["serial"].as_i64(), app["lineage"].as_str()),
        (Some(3), Some("lin-app"))
    );
    assert_eq!(names(&net), ["keep"]);
    assert_eq!(names(&app), ["x", "a", "b"]);
    assert_eq!(
        app["resources"][1]["instances"][1]["attributes"]["id"],
        "a-1"
    );
    // One audit event, under the source, naming both new versions; no lock left.
    let conn = env.server.db();
    let events: Vec<(String, String, String)> = conn
        .prepare("SELECT scope, actor, payload FROM audit WHERE event = 'tf.resources_moved'")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "tf/net");
    assert_eq!(events[0].1, "operator:ops@example.com");
    let payload: Value = serde_json::from_str(&events[0].2).unwrap();
    assert_eq!(payload["from"]["version"], 2);
    assert_eq!(payload["to"]["version"], 2);
    assert_eq!(payload["to"]["workspace"], "app");
    assert_eq!(
        payload["addresses"],
        json!(["terraform_data.a", "terraform_data.b"])
    );
    assert_eq!(env.server.count("SELECT count(*) FROM tf_locks"), 0);
    // Both new versions have a known posture (plaintext), in the move's own commit.
    for ws in ["net", "app"] {
        assert_eq!(
            env.server.count(&format!(
                "SELECT count(*) FROM tf_state_encryption WHERE workspace = '{ws}' AND version = 2 AND encrypted = 0"
            )),
            1,
            "{ws}"
        );
    }
    // Terraform's next plan reads and writes both as usual (successor of the new serial).
    let (code, _) = status(env.server.tf("POST", "app").body(state(4, "lin-app", ""))).await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn every_refused_move_changes_nothing() {
    let env = Env::start_with(|c| c.max_view_bytes = 8192).await;
    env.put("src", 1, "lin-s", &[resource("a", 1), resource("b", 1)])
        .await;
    env.put("dst", 1, "lin-d", &[resource("b", 1)]).await;
    env.put("big", 1, "lin-g", &[resource(&"g".repeat(9000), 1)])
        .await;
    let envelope = r#"{"serial":3,"lineage":"0b1d5c6e-2f7a-4c1e-9d3b-7e8f9a0b1c2d","meta":{"key_provider.pbkdf2.stategate":"eyJzYWx0IjoiIn0="},"encrypted_data":"q83vEjRWeJCrze8SNFZ4kA==","encryption_version":"v0"}"#;
    let (code, _) = status(env.server.tf("POST", "enc").body(envelope)).await;
    assert_eq!(code, 200);
    // A deleted workspace: a tombstone is no state to move into.
    env.put("gone", 1, "lin-x", &[]).await;
    assert_eq!(status(env.server.tf("DELETE", "gone")).await.0, 200);
    // Locked by a run, and frozen.
    assert_eq!(
        status(env.server.tf("LOCK", "held").body(lock_info("run-1")))
            .await
            .0,
        200
    );
    env.put("frozen", 1, "lin-f", &[]).await;
    env.server
        .app
        .operator
        .freeze("frozen", "window", None, Some("1h"), "operator:x")
        .await
        .unwrap();
    let a = || json!({"addresses": ["terraform_data.a"]});
    let long = format!("terraform_data.{}", "n".repeat(1100));
    let many: Vec<String> = (0..1001).map(|i| format!("terraform_data.n{i}")).collect();
    let table: Vec<(&str, &str, Value, u16, &str)> = vec![
        ("src", "src", a(), 400, "same workspace"),
        (
            "src",
            "dst",
            json!({"addresses": ["terraform_data.zz"]}),
            400,
            "not in the state of",
        ),
        (
            "src",
            "dst",
            json!({"addresses": ["terraform_data.a", "terraform_data.b"]}),
            409,
            "already in the state of",
        ),
        ("src", "nowhere", a(), 409, "has no state"),
        ("src", "gone", a(), 409, "has no state"),
        ("src", "enc", a(), 409, "encrypted by OpenTofu"),
        ("enc", "src", a(), 409, "encrypted by OpenTofu"),
        ("big", "src", a(), 409, "max_view_bytes"),
        ("src", "held", a(), 423, "run-1"),
        ("held", "src", a(), 423, "run-1"),
        ("src", "frozen", a(), 423, "window"),
        // A frozen source is refused as well, and before its state is read: an address
        // it does not hold gets the freeze's refusal, not a 400.
        ("frozen", "src", a(), 423, "window"),
        (
            "frozen",
            "src",
            json!({"addresses": ["terraform_data.zz"]}),
            423,
            "window",
        ),
        ("src", "dst", json!({"addresses": []}), 400, "at least one"),
        (
            "src",
            "dst",
            json!({"addresses": many}),
            400,
            "at most 1000",
        ),
        (
            "src",
            "dst",
            json!({"addresses": [long]}),
            400,
            "longer than",
        ),
        (
            "src",
            "dst",
            json!({"addresses": ["terraform_data.a[0]"]}),
            400,
            "one instance",
        ),
        (
            "src",
            "dst",
            json!({"addresses": ["module.x"]}),
            400,
            "not a resource address",
        ),
        (
            "src",
            "dst",
            json!({"addresses": ["terraform_data.a", "terraform_data.a"]}),
            400,
            "twice",
        ),
        (
            "src",
            "dst",
            json!({"addresses": "terraform_data.a"}),
            400,
            "expected a JSON body",
        ),
        (
            "src",
            "dst",
            json!({"addresses": ["terraform_data.a"], "force": true}),
            400,
            "expected a JSON body",
        ),
        ("src", "..%2Fdst", a(), 400, "workspace"),
    ];
    for (src, dst, body, expected, says) in table {
        let before = env.snapshot();
        let (code, text) = env.moves(src, dst, body.clone()).await;
        assert_eq!(code, expected, "{src} -> {dst} {body}: {text}");
        assert!(text.contains(says), "{src} -> {dst}: {text}");
        assert_eq!(
            env.snapshot(),
            before,
            "{src} -> {dst} {body}: changed something"
        );
    }
    // The held lock and the freeze are still there, untouched.
    assert_eq!(
        env.server
            .count("SELECT count(*) FROM tf_locks WHERE workspace = 'held' AND lock_id = 'run-1'"),
        1
    );
    assert_eq!(env.server.count("SELECT count(*) FROM tf_freezes"), 1);
    // No refused move left its record behind (it is written with the locks, in the
    // transaction the freeze check rolled back).
    assert_eq!(env.server.count("SELECT count(*) FROM tf_moves"), 0);
    // A body larger than any valid move is refused before it is read whole.
    let huge = json!({"addresses": vec!["x".repeat(1000); 3000]});
    let before = env.snapshot();
    let (code, _) = env.moves("src", "dst", huge).await;
    assert_eq!(code, 413);
    assert_eq!(env.snapshot(), before);
}

/// The engine under the move: both versions in one commit or neither, and a refused
/// commit leaves no blob behind.
#[tokio::test]
async fn write_versions_commits_all_or_nothing() {
    use stategate::store::{NewVersion, StoreError};
    let e = common::engine::engine();
    for scope in ["tf/a", "tf/b"] {
        common::engine::write(&e.store, scope, b"{\"serial\":1}", Some(1)).await;
    }
    let blobs = || {
        common::files_under(&e.dir.path().join("blobs"))
            .iter()
            .filter(|f| f.extension().is_some_and(|x| x == "blob"))
            .count()
    };
    let before = blobs();
    let news = |tag: &str| {
        ["tf/b", "tf/a"]
            .into_iter()
            .map(|scope| {
                let new = NewVersion {
                    scope: scope.into(),
                    plaintext: bytes::Bytes::from(format!("{{\"serial\":2,\"t\":\"{tag}\"}}")),
                    serial: Some(2),
                    lineage: Some("lin".into()),
                    actor: "test".into(),
                    facts: Default::default(),
                    audit: None,
                    resources: None,
                };
                (new, e.root.blob_key(scope))
            })
            .collect::<Vec<_>>()
    };
    // The guard refuses inside the commit: no row, and the blobs are discarded.
    let refused = e
        .store
        .write_versions(news("no"), |_, current, rows| {
            assert_eq!(current.len(), 2);
            assert_eq!(rows.iter().map(|r| r.version).collect::<Vec<_>>(), [2, 2]);
            Err::<(), StoreError>(StoreError::Contended)
        })
        .await;
    assert!(refused.is_err());
    assert_eq!((e.versions("tf/a"), e.versions("tf/b")), (vec![1], vec![1]));
    assert_eq!(blobs(), before, "a refused commit left blobs");
    // The same scope twice is refused before anything is written.
    let mut twice = news("x");
    twice[1].0.scope = "tf/b".into();
    assert!(e
        .store
        .write_versions(twice, |_, _, _| Ok::<(), StoreError>(()))
        .await
        .is_err());
    assert_eq!(blobs(), before);
    // Allowed: both rows, in the order given.
    let rows = e
        .store
        .write_versions(news("yes"), |_, _, _| Ok::<(), StoreError>(()))
        .await
        .unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| (r.scope.as_str(), r.version))
            .collect::<Vec<_>>(),
        [("tf/b", 2), ("tf/a", 2)]
    );
    assert_eq!(
        (e.versions("tf/a"), e.versions("tf/b")),
        (vec![1, 2], vec![1, 2])
    );
    assert_eq!(blobs(), before + 2);
}

impl Env {
    async fn admin_get(&self, path: &str) -> Value {
        let (code, text) = status(
            reqwest::Client::new()
                .get(format!("{}/api/v1/admin/{path}", self.server.base))
                .bearer_auth(&self.token),
        )
        .await;
        assert_eq!(code, 200, "{path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    async fn ui(&self) -> reqwest::Client {
        common::ui_session(&self.server.base, &self.token).await
    }

    async fn page(&self, ui: &reqwest::Client, path: &str) -> (u16, String) {
        status(ui.get(format!("{}{path}", self.server.base))).await
    }
}

/// Issue 38, item 9: a move's versions count only what moved, as "moved to/from
/// <workspace>" and never as added or destroyed, in the version counts (admin API and
/// UI), the diff (admin API and UI), the timeline (admin API and UI); untouched
/// resources are not "changed"; and the audit row links each version to its own
/// workspace (the two have different version numbers here, so a link to the wrong
/// workspace would be a 404).
#[tokio::test]
async fn a_moves_versions_read_as_moved_everywhere_and_the_audit_links_both() {
    let env = Env::start_with(|_| {}).await;
    let net = [resource("a", 2), resource("b", 1), resource("keep", 1)];
    env.put("net", 5, "lin-net", &net).await;
    env.put("net", 6, "lin-net", &net).await;
    env.put("app", 2, "lin-app", &[resource("x", 1)]).await;
    let (code, text) = env
        .moves(
            "net",
            "app",
            json!({"addresses": ["terraform_data.a", "terraform_data.b"]}),
        )
        .await;
    assert_eq!(code, 200, "{text}");
    // net v3 lost three instances to app, app v2 got them from net.
    let from = env.admin_get("workspaces/net/versions").await["versions"][0].clone();
    let to = env.admin_get("workspaces/app/versions").await["versions"][0].clone();
    assert_eq!(from["version"], 3);
    assert_eq!(
        from["changes"],
        json!({"added": 0, "changed": 0, "removed": 0, "moved": 3})
    );
    assert_eq!(from["moved"], json!({"to": "app"}));
    assert_eq!(to["version"], 2);
    assert_eq!(
        to["changes"],
        json!({"added": 0, "changed": 0, "removed": 0, "moved": 3})
    );
    assert_eq!(to["moved"], json!({"from": "net"}));
    // The version before the move is an ordinary one.
    let before = env.admin_get("workspaces/net/versions").await["versions"][1].clone();
    assert_eq!(before["moved"], Value::Null);
    assert_eq!(before["changes"]["moved"], 0);

    // The timeline: every address of the move's version moved; nothing "changed".
    for (ws, version, moved) in [
        ("net", 3, json!({"to": "app"})),
        ("app", 2, json!({"from": "net"})),
    ] {
        let timeline = env.admin_get(&format!("workspaces/{ws}/timeline")).await;
        let rows: Vec<&Value> = timeline["changes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["version"] == version)
            .collect();
        assert_eq!(rows.len(), 3, "{ws}: {timeline}");
        for r in rows {
            assert_eq!(
                (&r["change"], &r["moved"]),
                (&json!("moved"), &moved),
                "{r}"
            );
        }
    }

    // The diff of the move's version against the one before it says so; a wider one
    // does not pretend the move covered its other changes.
    let d = env.admin_get("workspaces/net/diff?from=2&to=3").await;
    assert_eq!(d["moved"], json!({"to": "app"}), "{d}");
    let wide = env.admin_get("workspaces/net/diff?from=1&to=3").await;
    assert!(wide.get("moved").is_none(), "{wide}");

    // The UI: counts in the versions table, the timeline, the diff page.
    let ui = env.ui().await;
    let (code, page) = env.page(&ui, "/ui/workspaces/net").await;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("3 moved to app"), "{page}");
    assert!(
        page.contains(r#"<span class="badge">moved to app</span>"#),
        "{page}"
    );
    assert!(!page.contains("−3"), "{page}");
    let (_, page) = env.page(&ui, "/ui/workspaces/app").await;
    assert!(page.contains("3 moved from net"), "{page}");
    let (code, page) = env.page(&ui, "/ui/workspaces/net/diff?from=2&to=3").await;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("−0 to destroy"), "{page}");
    assert!(page.contains(">3 moved to app</span>"), "{page}");
    assert!(
        page.contains(r#"<span class="badge moved">moved to app</span>"#),
        "{page}"
    );

    // The audit row links net's v3 and app's v2, and both pages exist.
    let (_, audit) = env.page(&ui, "/ui/audit?event=tf.resources_moved").await;
    for link in [
        "/ui/workspaces/net/versions/3",
        "/ui/workspaces/app/versions/2",
    ] {
        assert!(
            audit.contains(&format!(r#"href="{link}""#)),
            "{link}: {audit}"
        );
        assert_eq!(env.page(&ui, link).await.0, 200, "{link}");
    }
    for wrong in [
        "/ui/workspaces/net/versions/2\"",
        "/ui/workspaces/app/versions/3",
    ] {
        assert!(!audit.contains(wrong), "{wrong}: {audit}");
    }
}
