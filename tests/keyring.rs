//! The keyring on the real gateway (SQLite, the local store): a rotation made by
//! another process while the server writes refuses nothing and is used by new writes
//! without a restart; a reseal racing writes loses nothing and leaves every version
//! readable; retire is refused while anything needs the generation; a backup made
//! before the rotation restores with the generations only the store's copies hold;
//! a tampered generation field is a 5xx, never "no state".

mod common;

use std::sync::Arc;

use common::{state, AdminEnv, TestServer};
use stategate::crypto::service::KeyService;
use stategate::crypto::{Purpose, RootKey};
use stategate::installation;
use stategate::store::{backup, format, keyring, reseal, BlobStore, LocalStore, StateStore};

/// What an operator command opens: its own index handle and root over the same data dir.
struct Cli {
    store: StateStore,
    root: RootKey,
    service: Arc<dyn KeyService>,
}

impl Cli {
    /// One whole `key reseal` pass (state versions, backups, revocation records).
    async fn reseal(&self) -> reseal::Resealed {
        reseal::reseal(
            &self.store,
            &stategate::schema::scope_keys(self.root.clone(), None),
            &self.root,
            (stategate::tokens::REVOCATIONS_PREFIX, "revocation/"),
            "test",
            &|_, _| {},
        )
        .await
        .unwrap()
    }
}

async fn cli(server: &TestServer) -> Cli {
    let store = installation::open_state_store(&server.config)
        .await
        .unwrap();
    let root = installation::load_root_key(&server.config, false).unwrap();
    installation::open_keyring(&server.config, &root, &store, true)
        .await
        .unwrap();
    let service = installation::key_service(&server.config, &root);
    Cli {
        store,
        root,
        service,
    }
}

fn blobs(server: &TestServer) -> LocalStore {
    LocalStore::open(&server.config.local_store_path()).unwrap()
}

/// (version, blob key, sha256) of every version of `workspace`.
fn rows(server: &TestServer, workspace: &str) -> Vec<(i64, String, String)> {
    rows_in(&server.db(), workspace)
}

/// [`rows`] of the index `conn` (a restored or rebuilt one).
fn rows_in(
    conn: &stategate::store::sql::Connection,
    workspace: &str,
) -> Vec<(i64, String, String)> {
    let mut stmt = conn
        .prepare("SELECT version, blob_key, sha256 FROM versions WHERE scope = ?1 ORDER BY version")
        .unwrap();
    stmt.query_map([format!("tf/{workspace}")], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

async fn generation_of(server: &TestServer, key: &str) -> u32 {
    let bytes = blobs(server).get(key).await.unwrap().expect("blob exists");
    format::key_generation(&bytes).unwrap().unwrap()
}

/// Every version of `workspace` opens under `root` and hashes as its row says.
async fn all_readable(server: &TestServer, root: &RootKey, workspace: &str) -> usize {
    let scope = format!("tf/{workspace}");
    let all = rows(server, workspace);
    for (version, key, sha) in &all {
        let bytes = blobs(server).get(key).await.unwrap().expect("blob exists");
        format::decode(&root.blob_key(&scope), &bytes, &scope, *version, Some(sha))
            .unwrap_or_else(|e| panic!("{scope} v{version}: {e}"));
    }
    all.len()
}

async fn post(server: &TestServer, workspace: &str, serial: u64) -> u16 {
    server
        .tf("POST", workspace)
        .body(state(serial, "lin-1", ""))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Posts serials from `first` on until the newest version of `workspace` is sealed
/// under data generation `generation` (the server picks a rotation up within its ring
/// re-read); returns the last serial posted.
async fn post_until_generation(
    server: &TestServer,
    workspace: &str,
    first: u64,
    generation: u32,
) -> u64 {
    let patience = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut serial = first;
    loop {
        assert_eq!(post(server, workspace, serial).await, 200);
        let newest = rows(server, workspace).last().unwrap().1.clone();
        if generation_of(server, &newest).await == generation {
            return serial;
        }
        serial += 1;
        assert!(
            std::time::Instant::now() < patience,
            "the server never wrote under generation {generation}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn current(server: &TestServer, workspace: &str) -> (u16, String) {
    let resp = server.tf("GET", workspace).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// Lets a retire go on at once (it waits a few seconds after a rotation otherwise).
fn age_ring(server: &TestServer) {
    server
        .db()
        .execute(
            "UPDATE key_generations SET created_at = '2020-01-01T00:00:00Z'",
            [],
        )
        .unwrap();
}

fn audit_events(server: &TestServer, event: &str) -> i64 {
    server.count(&format!(
        "SELECT COUNT(*) FROM audit WHERE event = '{event}'"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rotate_and_reseal_while_serving_lose_nothing_and_refuse_nothing() {
    let server = TestServer::start().await;
    for serial in 1..=5 {
        assert_eq!(post(&server, "prod", serial).await, 200);
    }
    let op = cli(&server).await;
    let bearer_before = server.bearer("prod");

    // A writer keeps going through the rotation and the reseal.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let base = server.base.clone();
        let bearer = bearer_before.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut codes = Vec::new();
            let mut serial = 5u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) || serial < 30 {
                serial += 1;
                let resp = client
                    .post(format!("{base}/api/v1/tf/state/prod"))
                    .basic_auth("stategate", Some(&bearer))
                    .body(state(serial, "lin-1", ""))
                    .send()
                    .await
                    .unwrap();
                codes.push(resp.status().as_u16());
                let read = client
                    .get(format!("{base}/api/v1/tf/state/prod"))
                    .basic_auth("stategate", Some(&bearer))
                    .send()
                    .await
                    .unwrap();
                codes.push(read.status().as_u16());
            }
            (serial, codes)
        })
    };
    assert_eq!(
        keyring::rotate(&op.store, &op.service, Purpose::Data, "test")
            .await
            .unwrap(),
        1
    );
    op.root.reload().unwrap();
    assert_eq!(op.root.data_generation(), 1);
    // The server notices by itself: a write after the rotation is sealed under 1.
    let patience = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let newest = rows(&server, "prod").last().unwrap().1.clone();
        if generation_of(&server, &newest).await == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < patience,
            "the server never used generation 1"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let done = op.reseal().await;
    assert!(done.versions >= 5, "{done:?}");
    assert_eq!(done.generation, 1);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (last, codes) = writer.await.unwrap();
    assert!(codes.iter().all(|c| *c == 200), "{codes:?}");
    // What the writer committed after the reseal passed it is generation 1 already.
    let n = last as usize;

    // Nothing lost: one version per write, the last one is what GET gives, every one
    // opens, and each is under generation 1 now (a second reseal has nothing to do).
    let all = rows(&server, "prod");
    assert_eq!(all.len(), n);
    assert_eq!(
        current(&server, "prod").await,
        (200, state(last, "lin-1", ""))
    );
    assert_eq!(all_readable(&server, &op.root, "prod").await, n);
    for (_, key, _) in &all {
        assert_eq!(generation_of(&server, key).await, 1);
    }
    let again = op.reseal().await;
    assert_eq!((again.versions, again.current), (0, n as u64));
    // No blob left behind: one file per version.
    let states = server
        .blob_files()
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("/states/"))
        .count();
    assert_eq!(states, n);
    // Credentials did not change; the events are audited without key bytes.
    assert_eq!(server.bearer("prod"), bearer_before);
    assert_eq!(post(&server, "prod", last + 1).await, 200);
    assert_eq!(audit_events(&server, "key.rotated"), 1);
    assert_eq!(audit_events(&server, "key.resealed"), done.versions as i64);
    let payloads: Vec<String> = {
        let conn = server.db();
        let mut stmt = conn
            .prepare("SELECT payload FROM audit WHERE event LIKE 'key.%'")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let wrapped: Vec<Vec<u8>> = {
        let conn = server.db();
        let mut stmt = conn.prepare("SELECT wrapped FROM key_generations").unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    use base64::Engine;
    for p in &payloads {
        for w in &wrapped {
            assert!(!p.contains(&base64::engine::general_purpose::STANDARD.encode(w)));
        }
    }
}

/// `versions.key_gen` of every version of `workspace`, beside its blob key.
fn recorded_generations(server: &TestServer, workspace: &str) -> Vec<(String, Option<i64>)> {
    let conn = server.db();
    let mut stmt = conn
        .prepare("SELECT blob_key, key_gen FROM versions WHERE scope = ?1 ORDER BY version")
        .unwrap();
    stmt.query_map([format!("tf/{workspace}")], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Issue 38: "at rest: AES-GCM under generation N" in listings too. The index records
/// each version's data key generation as its blob's header names it (written, then
/// resealed), so `workspace list`, the UI list and `--json` show it without reading a
/// blob; a row an earlier release wrote (no generation recorded) shows none in a
/// listing and its header's on the workspace's own page.
#[tokio::test]
async fn listings_show_the_key_generation_the_index_records_with_each_version() {
    use stategate::operator::roles::Grant;
    let server = TestServer::start().await;
    assert_eq!(post(&server, "prod", 1).await, 200);
    let op = cli(&server).await;
    assert_eq!(
        keyring::rotate(&op.store, &op.service, Purpose::Data, "test")
            .await
            .unwrap(),
        1
    );
    op.root.reload().unwrap();
    post_until_generation(&server, "app", 1, 1).await;
    for ws in ["prod", "app"] {
        for (key, recorded) in recorded_generations(&server, ws) {
            let named = i64::from(generation_of(&server, &key).await);
            assert_eq!(recorded, Some(named), "{ws} {key}");
        }
    }
    let listed = |rows: Vec<stategate::operator::WorkspaceSummary>| -> Vec<(String, Option<u32>)> {
        rows.into_iter()
            .map(|w| (w.name, w.key_generation))
            .collect()
    };
    let ops = &server.app.operator;
    assert_eq!(
        listed(ops.list_workspaces(&Grant::ROOT).await.unwrap()),
        [("app".to_string(), Some(1)), ("prod".to_string(), Some(0))]
    );
    // Resealed under 1: the rows say so too.
    op.reseal().await;
    for (key, recorded) in recorded_generations(&server, "prod") {
        assert_eq!(recorded, Some(1), "{key}");
        assert_eq!(generation_of(&server, &key).await, 1);
    }
    assert_eq!(
        listed(ops.list_workspaces(&Grant::ROOT).await.unwrap()),
        [("app".to_string(), Some(1)), ("prod".to_string(), Some(1))]
    );
    // A row as an earlier release wrote it: unknown in the listing, read from the
    // header for the workspace's own page.
    server
        .db()
        .execute(
            "UPDATE versions SET key_gen = NULL WHERE scope = 'tf/prod'",
            [],
        )
        .unwrap();
    let list = listed(ops.list_workspaces(&Grant::ROOT).await.unwrap());
    assert_eq!(list[1], ("prod".to_string(), None));
    assert_eq!(ops.workspace("prod").await.unwrap().key_generation, Some(1));
    // The CLI's listing says the generation in words (and --json carries the number).
    let run = |args: &[&str]| cli_command(&server, args);
    let (code, out, err) = run(&["workspace", "list"]);
    assert_eq!(code, 0, "{err}");
    let app = out.lines().find(|l| l.starts_with("app ")).unwrap();
    assert!(app.contains("AES-256-GCM, key generation 1"), "{out}");
    let (code, json, err) = run(&["workspace", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let app: serde_json::Value = json
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["name"] == "app")
        .unwrap();
    assert_eq!(app["key_generation"], 1, "{app}");
}

/// `POST keys/retire` of `generation` through the admin API: (status, body).
async fn retire(env: &AdminEnv, generation: u32) -> (u16, String) {
    env.admin(
        "POST",
        "keys/retire",
        Some(serde_json::json!({ "generation": generation })),
    )
    .await
}

/// `stategate key <args>` run as the real binary on the server's data dir, while it
/// serves: (exit code, stdout, stderr).
fn key_command(server: &TestServer, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["key"];
    all.extend_from_slice(args);
    cli_command(server, &all)
}

/// `stategate <args>` run as the real binary on the server's data dir, while it
/// serves: (exit code, stdout, stderr).
fn cli_command(server: &TestServer, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stategate"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("STATEGATE_DATA_DIR", &server.config.data_dir)
        .env("STATEGATE_DEK", common::DEK)
        .envs(common::index_env(&server.config))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn actors_of(server: &TestServer, event: &str) -> Vec<String> {
    let conn = server.db();
    let mut stmt = conn
        .prepare("SELECT actor FROM audit WHERE event = ?1 ORDER BY id")
        .unwrap();
    stmt.query_map([event], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_drives_status_rotate_and_retire_as_the_commands_do() {
    let env = AdminEnv::start("keys@x.io").await;
    let server = &env.server;
    let actor = "operator:keys@x.io";
    for serial in 1..=2 {
        assert_eq!(post(server, "prod", serial).await, 200);
    }
    let json = |text: &str| -> serde_json::Value {
        serde_json::from_str(text).unwrap_or_else(|_| panic!("{text}"))
    };

    // The census: the same document `key status --json` prints, never key bytes.
    let (code, text) = env.admin("GET", "keys", None).await;
    assert_eq!(code, 200, "{text}");
    assert!(!text.contains(common::DEK), "{text}");
    let status = json(&text);
    assert_eq!(status["data_generation"], 0);
    assert_eq!(
        status["generations"],
        serde_json::json!([{"generation": 0, "in_ring": true, "writes": true, "versions": 2,
            "backups": 0, "revocation_records": 0, "drift_outputs": 0, "drift_plans": 0}])
    );
    assert!(status["key_service"].is_string(), "{text}");
    let (code, out, err) = key_command(server, &["status", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out), status);

    // A rotation: audited with the operator, used by the very next write.
    let (code, text) = env.admin("POST", "keys/rotate", None).await;
    assert_eq!(code, 200, "{text}");
    let rotated = json(&text);
    assert_eq!(
        (
            &rotated["action"],
            &rotated["purpose"],
            &rotated["generation"]
        ),
        (
            &serde_json::json!("key.rotated"),
            &serde_json::json!("data"),
            &serde_json::json!(1)
        )
    );
    assert_eq!(actors_of(server, "key.rotated"), [actor]);
    assert_eq!(post(server, "prod", 3).await, 200);
    let newest = rows(server, "prod").last().unwrap().1.clone();
    assert_eq!(generation_of(server, &newest).await, 1);

    // Refusals: 409 naming why, nothing changed.
    let generations = || server.count("SELECT count(*) FROM key_generations");
    let before = generations();
    for (generation, why) in [(0, "less than 5 s"), (1, "newest"), (7, "not in the ring")] {
        let (code, text) = retire(&env, generation).await;
        assert_eq!(code, 409, "{generation}: {text}");
        assert!(
            json(&text)["error"].as_str().unwrap().contains(why),
            "{generation}: {text}"
        );
    }
    age_ring(server);
    let (code, text) = retire(&env, 0).await;
    assert_eq!(code, 409, "{text}");
    let refusal = json(&text)["error"].as_str().unwrap().to_string();
    assert!(refusal.contains("2 state versions"), "{refusal}");
    // The command refuses with the same words: one code path.
    let (code, _, err) = key_command(server, &["retire", "0"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&refusal), "{err}");
    assert_eq!(generations(), before);
    assert_eq!(audit_events(server, "key.retired"), 0);
    let status = json(&env.admin("GET", "keys", None).await.1);
    assert_eq!(status["data_generation"], 1);
    let counts: Vec<(u64, u64, bool)> = status["generations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["generation"].as_u64().unwrap(),
                g["versions"].as_u64().unwrap(),
                g["writes"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(counts, [(0, 2, false), (1, 1, true)]);

    // After a reseal nothing needs 0: the retire goes through, audited, and the server
    // no longer holds it.
    cli(server).await.reseal().await;
    let (code, text) = retire(&env, 0).await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        json(&text),
        serde_json::json!({"action": "key.retired", "generation": 0})
    );
    assert_eq!(actors_of(server, "key.retired"), [actor]);
    let status = json(&env.admin("GET", "keys", None).await.1);
    assert_eq!(status["generations"][0]["generation"], 1, "{status}");
    assert_eq!(
        status["generations"].as_array().unwrap().len(),
        1,
        "{status}"
    );
    assert_eq!(current(server, "prod").await.0, 200);
    let (code, text) = retire(&env, 0).await;
    assert_eq!(code, 409, "{text}");
    assert_eq!(audit_events(server, "key.retired"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retire_is_refused_while_anything_needs_the_generation() {
    let server = TestServer::start().await;
    for serial in 1..=3 {
        assert_eq!(post(&server, "prod", serial).await, 200);
    }
    let op = cli(&server).await;
    keyring::rotate(&op.store, &op.service, Purpose::Data, "test")
        .await
        .unwrap();
    op.root.reload().unwrap();
    age_ring(&server);
    let needed = |c: &reseal::Census, g: u32| {
        c.generations
            .get(&g)
            .filter(|c| c.total() > 0)
            .map(|c| c.describe())
    };
    let census = reseal::census(&op.store, "tf/", "revocations/", &|_, _| {})
        .await
        .unwrap();
    let what = needed(&census, 0);
    assert_eq!(what.as_deref(), Some("3 state versions"));
    let ring_before = server.count("SELECT COUNT(*) FROM key_generations");
    let err = keyring::retire(&op.store, &op.service, 0, "test", move |_| Ok(what))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("still seals 3 state versions"), "{err}");
    assert_eq!(
        server.count("SELECT COUNT(*) FROM key_generations"),
        ring_before
    );
    assert_eq!(audit_events(&server, "key.retired"), 0);
    // The newest is never retired.
    let err = keyring::retire(&op.store, &op.service, 1, "test", |_| Ok(None))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("newest"), "{err}");

    op.reseal().await;
    let census = reseal::census(&op.store, "tf/", "revocations/", &|_, _| {})
        .await
        .unwrap();
    assert_eq!(needed(&census, 0), None);
    assert_eq!(census.generations[&1].versions, 3);
    keyring::retire(&op.store, &op.service, 0, "test", |_| Ok(None))
        .await
        .unwrap();
    assert_eq!(audit_events(&server, "key.retired"), 1);
    // The server keeps serving (it re-reads the ring on its own).
    assert_eq!(current(&server, "prod").await, (200, state(3, "lin-1", "")));
    assert_eq!(post(&server, "prod", 4).await, 200);
    op.root.reload().unwrap();
    assert_eq!(op.root.data_generations(), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_generation_field_is_a_server_error_never_no_state() {
    let server = TestServer::start().await;
    assert_eq!(post(&server, "prod", 1).await, 200);
    let op = cli(&server).await;
    keyring::rotate(&op.store, &op.service, Purpose::Data, "test")
        .await
        .unwrap();
    post_until_generation(&server, "prod", 2, 1).await;
    let (_, key, _) = rows(&server, "prod").pop().unwrap();
    let path = server.config.local_store_path().join(&key);
    let original = std::fs::read(&path).unwrap();
    let text = String::from_utf8_lossy(&original).to_string();
    let at = text
        .find("\"key_gen\":1")
        .expect("the header names generation 1");
    for replacement in [b'0', b'2'] {
        let mut tampered = original.clone();
        tampered[at + "\"key_gen\":".len()] = replacement;
        std::fs::write(&path, &tampered).unwrap();
        let (code, _) = current(&server, "prod").await;
        assert!(code >= 500, "{code}");
    }
    std::fs::write(&path, &original).unwrap();
    assert_eq!(current(&server, "prod").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_from_before_the_rotation_restores_with_the_rings_copies() {
    let server = TestServer::start().await;
    for serial in 1..=2 {
        assert_eq!(post(&server, "prod", serial).await, 200);
    }
    let op = cli(&server).await;
    let before = common::take_backup(&server.config, op.store.blobs().as_ref(), &op.root).await;
    let before_id = before.id.clone();
    keyring::rotate(&op.store, &op.service, Purpose::Data, "test")
        .await
        .unwrap();
    op.root.reload().unwrap();
    // Written after the rotation, under generation 1 (the server picks it up).
    let serial = post_until_generation(&server, "prod", 3, 1).await;
    // A retire attempt of the backup's generation is refused: the backup needs it.
    age_ring(&server);
    let census = reseal::census(&op.store, "tf/", "revocations/", &|_, _| {})
        .await
        .unwrap();
    assert_eq!(census.generations[&0].backups, 1);
    let what = census.generations.get(&0).map(|c| c.describe());
    assert!(
        keyring::retire(&op.store, &op.service, 0, "test", move |_| Ok(what))
            .await
            .is_err()
    );

    // The data dir is lost: a fresh root has only the DEK and the store's copies.
    let fresh = RootKey::from_base64(common::DEK).unwrap();
    let copies = keyring::copies(op.store.blobs().as_ref()).await.unwrap();
    assert_eq!(copies.len(), 1);
    let empty = stategate::store::sql::Connection::open_in_memory().unwrap();
    fresh.install(keyring::load(&empty, &copies, op.service.as_ref()).unwrap());
    assert_eq!(fresh.data_generation(), 1);
    assert_eq!(
        reseal::blob_generation(op.store.blobs().as_ref(), &before.key)
            .await
            .unwrap(),
        Some(0)
    );
    let into = server.dir.path().join("restored.db");
    let report = restore(op.store.blobs().as_ref(), &fresh, before.clone(), &into).await;
    let added: Vec<i64> = report.added.iter().map(|r| r.version).collect();
    assert_eq!(added, (3..=serial as i64).collect::<Vec<_>>());
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    // Without the copies, the versions under generation 1 do not open: they are skipped.
    let bare = RootKey::from_base64(common::DEK).unwrap();
    let into2 = server.dir.path().join("restored2.db");
    let report = restore(op.store.blobs().as_ref(), &bare, before, &into2).await;
    // (what was written before the server noticed the rotation is generation 0)
    assert!(report.added.iter().all(|r| r.version < serial as i64));
    assert!(
        report
            .skipped
            .iter()
            .any(|s| s.reason.contains("generation 1")),
        "{:?}",
        report.skipped
    );

    // After a reseal the backup's rows name deleted blobs: the restore points them at
    // the resealed ones (same version, same content) instead of dropping them.
    op.reseal().await;
    let into3 = server.dir.path().join("restored3.db");
    let chosen = backup::pick(op.store.blobs().as_ref(), Some(&before_id))
        .await
        .unwrap();
    assert_eq!(
        reseal::blob_generation(op.store.blobs().as_ref(), &chosen.key)
            .await
            .unwrap(),
        Some(1),
        "the backup itself was resealed"
    );
    let report = restore(op.store.blobs().as_ref(), &fresh, chosen, &into3).await;
    let names = |v: &[(String, i64)]| v.iter().map(|(_, n)| *n).collect::<Vec<_>>();
    assert_eq!(names(&report.resealed), [1, 2]);
    assert!(report.dropped.is_empty());
    let restored = stategate::store::sql::Connection::open(&into3).unwrap();
    let n: i64 = restored
        .query_row("SELECT COUNT(*) FROM versions", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, serial as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_service_stops_the_keyring_with_a_clear_message() {
    let server = TestServer::start().await;
    let op = cli(&server).await;
    keyring::rotate(&op.store, &op.service, Purpose::Data, "test")
        .await
        .unwrap();
    let mut other = server.config.clone();
    other.dek = Some(base64_of([9; 32]).into());
    let root = RootKey::from_bytes([9; 32]);
    let err = installation::open_keyring(&other, &root, &op.store, true)
        .await
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("data/1") && text.contains("STATEGATE_DEK"),
        "{text}"
    );
}

fn base64_of(bytes: [u8; 32]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A server whose DEK is a key file (what `key rewrap` replaces), not `dek`.
async fn start_with_key_file() -> TestServer {
    TestServer::start_with(|c| {
        std::fs::create_dir_all(&c.data_dir).unwrap();
        stategate::crypto::write_secret_file(
            &c.data_dir.join("dek"),
            format!("{}\n", common::DEK).as_bytes(),
        )
        .unwrap();
        c.dek = None;
    })
    .await
}

/// What whoever holds the leaked key file can open: every wrapped ring entry (table
/// and store copies) that unwraps under it, and every version blob that decodes with
/// the leaked key plus whatever generations they unwrapped.
async fn opens_with_leaked_key(server: &TestServer, workspace: &str) -> Vec<String> {
    let leaked = RootKey::from_base64(common::DEK).unwrap();
    let service = leaked.file_service(None);
    let mut out = Vec::new();
    let mut entries = keyring::copies(&blobs(server)).await.unwrap();
    entries.extend(keyring::read_rows(&server.db()).unwrap());
    let mut opened = Vec::new();
    for e in &entries {
        if let Some(w) = &e.wrapped {
            if let Ok(g) =
                stategate::crypto::Generation::unwrap(&service, e.purpose, e.generation, w)
            {
                out.push(format!("ring entry {}", e.purpose.label(e.generation)));
                opened.push(g);
            }
        }
    }
    leaked.install(stategate::crypto::RingView {
        generations: opened,
        retired: Vec::new(),
    });
    let scope = format!("tf/{workspace}");
    for (version, key, sha) in rows(server, workspace) {
        let bytes = blobs(server).get(&key).await.unwrap().unwrap();
        if format::decode(
            &leaked.blob_key(&scope),
            &bytes,
            &scope,
            version,
            Some(&sha),
        )
        .is_ok()
        {
            out.push(format!("{scope} v{version}"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_rewrap_reseal_retire_and_rotate_credentials_nothing_opens_with_the_leaked_key() {
    let server = start_with_key_file().await;
    for serial in 1..=3 {
        assert_eq!(post(&server, "prod", serial).await, 200);
    }
    let key_file = server.config.dek_path();
    let next = server.config.next_dek_path();
    let op = cli(&server).await;
    // Rotated before the leak was known: data/1 is wrapped under the leaked key.
    keyring::rotate(&op.store, &op.service, Purpose::Data, "test")
        .await
        .unwrap();
    assert_eq!(opens_with_leaked_key(&server, "prod").await.len(), 2 + 3);

    // A kill after the ring was re-wrapped but before the new file replaced the old
    // one: `.next` exists, the table and the copies are under it, the key file is the
    // leaked one. Every process still opens everything.
    let pending = RootKey::generate().unwrap();
    stategate::crypto::write_secret_file(&next, format!("{}\n", pending.to_base64()).as_bytes())
        .unwrap();
    let pending_service: Arc<dyn KeyService> = Arc::new(pending.file_service(None));
    let zero = vec![
        op.root.generation_zero(Purpose::Data).unwrap(),
        op.root.generation_zero(Purpose::Credentials).unwrap(),
    ];
    keyring::rewrap(&op.store, &op.service, &pending_service, zero, "test")
        .await
        .unwrap();
    let mid = cli(&server).await;
    mid.root.reload().unwrap();
    assert_eq!(mid.root.data_generations(), vec![0, 1]);
    assert_eq!(all_readable(&server, &mid.root, "prod").await, 3);
    assert_eq!(current(&server, "prod").await, (200, state(3, "lin-1", "")));

    // The rerun finishes with the same pending key and moves it over the key file.
    let done = installation::rewrap(&server.config, &mid.root, &mid.store, "test")
        .await
        .unwrap();
    assert!(done.added.is_empty(), "{done:?}");
    assert!(!next.exists());
    let on_disk = std::fs::read_to_string(&key_file).unwrap();
    assert_eq!(on_disk.trim(), pending.to_base64());
    assert_eq!(audit_events(&server, "key.rewrapped"), 2);
    // The serving process keeps serving and writing (it re-reads the key file).
    assert_eq!(post(&server, "prod", 4).await, 200);
    assert_eq!(current(&server, "prod").await, (200, state(4, "lin-1", "")));

    // The rest of the runbook, each step from a freshly opened installation.
    let op = cli(&server).await;
    assert_eq!(all_readable(&server, &op.root, "prod").await, 4);
    let leaked_bearer = server.bearer("prod");
    assert_eq!(op.root.workspace_bearer("prod"), leaked_bearer);
    keyring::rotate(&op.store, &op.service, Purpose::Data, "test")
        .await
        .unwrap();
    op.root.reload().unwrap();
    // The retire grace is skipped below (`age_ring`), so first wait until the server
    // writes under the new generation, as the grace would have made sure.
    let serial = post_until_generation(&server, "prod", 5, 2).await + 1;
    let versions = rows(&server, "prod").len();
    op.reseal().await;
    age_ring(&server);
    for g in [0, 1] {
        keyring::retire(&op.store, &op.service, g, "test", |_| Ok(None))
            .await
            .unwrap();
    }
    keyring::rotate(&op.store, &op.service, Purpose::Credentials, "test")
        .await
        .unwrap();

    let after = cli(&server).await;
    after.root.reload().unwrap();
    assert_eq!(after.root.data_generations(), vec![2]);
    assert_eq!(all_readable(&server, &after.root, "prod").await, versions);
    assert_ne!(after.root.workspace_bearer("prod"), leaked_bearer);
    assert_eq!(
        opens_with_leaked_key(&server, "prod").await,
        Vec::<String>::new()
    );
    // And the server, which started on the leaked file, follows it all: within its
    // ring re-read the leaked bearer is refused and the new one writes.
    let patience = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while post(&server, "prod", serial).await != 401 {
        assert!(
            std::time::Instant::now() < patience,
            "the leaked bearer still works"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let status = reqwest::Client::new()
        .post(server.url("prod"))
        .basic_auth("stategate", Some(after.root.workspace_bearer("prod")))
        .body(state(serial + 1, "lin-1", ""))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
    assert!(all_readable(&server, &after.root, "prod").await > versions);
    assert_eq!(
        opens_with_leaked_key(&server, "prod").await,
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_looked_up_the_row_before_reseal_deleted_the_blob_still_reads() {
    let server = TestServer::start().await;
    for serial in 1..=2 {
        assert_eq!(post(&server, "prod", serial).await, 200);
    }
    let op = cli(&server).await;
    // The reader's lookup, before the reseal.
    let row = op.store.latest("tf/prod").await.unwrap().unwrap();
    keyring::rotate(&op.store, &op.service, Purpose::Data, "test")
        .await
        .unwrap();
    op.root.reload().unwrap();
    op.reseal().await;
    let old_blob = row.blob_key.clone().unwrap();
    assert!(blobs(&server).get(&old_blob).await.unwrap().is_none());
    // ... then its read: the row is re-read once and the resealed blob streams.
    let mut stream = op
        .store
        .stream_row(row.clone(), &op.root.blob_key("tf/prod"))
        .await
        .unwrap();
    let mut body = Vec::new();
    while let Some(piece) = stream.chunks.recv().await {
        body.extend_from_slice(&piece.unwrap());
    }
    assert_eq!(String::from_utf8(body).unwrap(), state(2, "lin-1", ""));
    // A row whose blob is really gone (not repointed) is still an error, never "no state".
    let current = op.store.latest("tf/prod").await.unwrap().unwrap();
    blobs(&server)
        .delete(current.blob_key.as_deref().unwrap())
        .await
        .unwrap();
    let err = op
        .store
        .stream_row(current, &op.root.blob_key("tf/prod"))
        .await
        .err()
        .expect("a missing blob is an error");
    assert!(err.to_string().contains("blob is missing"), "{err}");
}

/// A backup made before `key rewrap` holds the ring wrapped under the replaced key
/// file. Restored and opened as `serve` opens it, the ring comes from the store's
/// re-wrapped copies: startup succeeds, every version (old and new generation) opens,
/// the restored table is repaired, and the store's copies are not overwritten with the
/// old wrapping (which only the replaced, maybe leaked, file would open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_from_before_a_rewrap_restores_and_opens_with_the_new_key_file() {
    let server = start_with_key_file().await;
    assert_eq!(post(&server, "prod", 1).await, 200);
    let op = cli(&server).await;
    keyring::rotate(&op.store, &op.service, Purpose::Data, "test")
        .await
        .unwrap();
    op.root.reload().unwrap();
    let serial = post_until_generation(&server, "prod", 2, 1).await;
    let before = common::take_backup(&server.config, op.store.blobs().as_ref(), &op.root).await;
    installation::rewrap(&server.config, &op.root, &op.store, "test")
        .await
        .unwrap();
    let after = cli(&server).await;
    let new_service = after.service.clone();

    // The data dir is restored from the backup: its own dir, the same key file and store.
    let scratch = tempfile::tempdir().unwrap();
    let mut restored = server.config.clone();
    restored.data_dir = scratch.path().to_path_buf();
    restored.dek_file = Some(server.config.dek_path());
    restored.store.path = Some(server.config.local_store_path());
    // `restore --into` writes a SQLite file, whichever kind the backup was taken of.
    restored.index = stategate::config::IndexConfig::default();
    let report = restore(
        after.store.blobs().as_ref(),
        &after.root,
        before,
        &restored.db_path(),
    )
    .await;
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    let stale =
        keyring::read_rows(&stategate::store::sql::Connection::open(restored.db_path()).unwrap())
            .unwrap()
            .into_iter()
            .filter(|r| r.wrapped.is_some())
            .filter(|r| {
                stategate::crypto::Generation::unwrap(
                    new_service.as_ref(),
                    r.purpose,
                    r.generation,
                    r.wrapped.as_ref().unwrap(),
                )
                .is_err()
            })
            .count();
    assert_eq!(
        stale, 1,
        "the backup's data/1 is wrapped under the old key file"
    );

    // What reads the ring without repairing it (a server's reload) takes the copies too.
    let copies = keyring::copies(&blobs(&server)).await.unwrap();
    let unrepaired = stategate::store::sql::Connection::open(restored.db_path()).unwrap();
    let view = keyring::load(&unrepaired, &copies, new_service.as_ref()).unwrap();
    assert_eq!(view.generations.len(), 3, "data/0, data/1, credentials/0");
    drop(unrepaired);
    // Opened as `serve` opens it.
    let store = installation::open_state_store(&restored).await.unwrap();
    let root = installation::read_root_key(&restored, false).unwrap();
    installation::open_keyring(&restored, &root, &store, true)
        .await
        .unwrap();
    assert_eq!(root.data_generations(), vec![0, 1]);
    let conn = stategate::store::sql::Connection::open(restored.db_path()).unwrap();
    let versions = rows_in(&conn, "prod");
    assert_eq!(versions.len(), serial as usize);
    for (version, key, sha) in &versions {
        let bytes = blobs(&server).get(key).await.unwrap().unwrap();
        format::decode(
            &root.blob_key("tf/prod"),
            &bytes,
            "tf/prod",
            *version,
            Some(sha),
        )
        .unwrap_or_else(|e| panic!("v{version}: {e}"));
    }
    // Both copies of the ring now open under the new key file alone.
    let mut entries = keyring::copies(&blobs(&server)).await.unwrap();
    entries.extend(keyring::read_rows(&conn).unwrap());
    for e in entries.iter().filter(|e| e.wrapped.is_some()) {
        stategate::crypto::Generation::unwrap(
            new_service.as_ref(),
            e.purpose,
            e.generation,
            e.wrapped.as_ref().unwrap(),
        )
        .unwrap_or_else(|_| panic!("{} does not open", e.purpose.label(e.generation)));
    }
}

/// A `kill -9` of `key reseal` after its commit and before it deleted the old blob
/// leaves both blobs of a version in the store. An index rebuild then meets two claims
/// per version: it keeps exactly one per version, each opens and hashes as the version
/// did, and the others are reported as superseded (swept like any orphan).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_rebuild_after_a_reseal_killed_before_its_deletes_keeps_every_version() {
    let server = TestServer::start().await;
    for serial in 1..=3 {
        assert_eq!(post(&server, "prod", serial).await, 200);
    }
    let op = cli(&server).await;
    let before = rows(&server, "prod");
    let mut old_blobs = Vec::new();
    for (_, key, _) in &before {
        old_blobs.push((key.clone(), blobs(&server).get(key).await.unwrap().unwrap()));
    }
    keyring::rotate(&op.store, &op.service, Purpose::Data, "test")
        .await
        .unwrap();
    op.root.reload().unwrap();
    op.reseal().await;
    let after = rows(&server, "prod");
    for ((_, old, _), (_, new, _)) in before.iter().zip(&after) {
        assert_ne!(old, new, "resealed into a new blob");
    }
    // The deletes the kill prevented: the old blobs are still there.
    for (key, bytes) in old_blobs {
        blobs(&server).put(&key, bytes).await.unwrap();
    }
    let into = server.dir.path().join("rebuilt.db");
    let report = stategate::store::rebuild::rebuild_index(
        &blobs(&server),
        &stategate::schema::scope_keys(op.root.clone(), None),
        &into,
        stategate::schema::ALL,
    )
    .await
    .unwrap();
    let prod: Vec<_> = report
        .rows
        .iter()
        .filter(|r| r.scope == "tf/prod")
        .collect();
    assert_eq!(prod.len(), 3, "{:?}", report.rows);
    assert_eq!(report.superseded.len(), 3);
    for (row, (version, _, sha)) in prod.iter().zip(&before) {
        assert_eq!(
            (row.version, row.sha256.as_deref()),
            (*version, Some(sha.as_str()))
        );
        let key = row.blob_key.as_deref().unwrap();
        let bytes = blobs(&server).get(key).await.unwrap().unwrap();
        format::decode(
            &op.root.blob_key("tf/prod"),
            &bytes,
            "tf/prod",
            *version,
            Some(sha),
        )
        .unwrap_or_else(|e| panic!("v{version}: {e}"));
    }
}

/// A plain restore of `backup` into `into` with `key`: today's schema, no progress, no
/// extra step.
async fn restore(
    blobs: &dyn stategate::store::BlobStore,
    key: &RootKey,
    backup: backup::BackupInfo,
    into: &std::path::Path,
) -> backup::RestoreReport {
    backup::restore(
        blobs,
        key,
        &stategate::schema::scope_keys(key.clone(), None),
        backup,
        into,
        stategate::schema::MIGRATIONS,
        stategate::schema::ALL,
        &|_, _| {},
        &mut |_| Ok(()),
    )
    .await
    .unwrap()
}
