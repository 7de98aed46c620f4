//! Drift checks in process, over the real engine (SQLite, local blob store) with
//! local webhook receivers on port 0 and small shell scripts standing in for
//! `tofu`: signed webhook deliveries with bounded retries against endpoints that
//! answer 500, hang or refuse; clear error outcomes for a missing directory,
//! configuration or binary (and the next check still runs); a locked workspace
//! skipped without disturbing its holder; the approval flow (exactly the kept plan
//! applied once; twice, not drifted, expired refused); plan text kept for the newest
//! `keep_outputs` runs only, older runs saying "pruned" (still after `keep_outputs` is
//! raised; a missing output retention did not delete stays an error), orphan outputs
//! swept and nothing else in the store touched, the scheduler's sweep listing the store
//! only when it can find something; a reseal moving outputs and kept plans to a
//! rotated key (the plan still applies); kept plans in the blob store, so a plan kept
//! through one node is applied through another (two services on one index and store,
//! each with its own data dir), once, however the approvals race; plan files an
//! earlier release kept in the data dir moved into the store. The real Terraform CLI
//! runs in `integration/test_drift.py` and `integration/test_nodes.py`.

mod common;

use stategate::http::error::HttpError;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::drift::{check, check_dir, fake_tofu};
use common::{lock_info, TestServer};
use stategate::config::{Config, DriftCheck};
use stategate::drift::webhook::{verify, Notifier};
use stategate::drift::{DriftService, Outcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One received request: its signature header and its body.
type Request = (String, Vec<u8>);

/// A webhook receiver answering the scripted statuses in order, then 200.
struct Receiver {
    url: String,
    seen: Arc<Mutex<Vec<Request>>>,
}

async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let len: usize = header("content-length")?.parse().ok()?;
    while buf.len() < head_end + len {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some((
        header("x-stategate-signature").unwrap_or_default(),
        buf[head_end..head_end + len].to_vec(),
    ))
}

impl Receiver {
    async fn start(mut statuses: Vec<u16>) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        statuses.reverse();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let Some(request) = read_request(&mut stream).await else {
                    continue;
                };
                record.lock().unwrap().push(request);
                let status = statuses.pop().unwrap_or(200);
                let reply = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = stream.write_all(reply.as_bytes()).await;
            }
        });
        Receiver { url, seen }
    }

    fn seen(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }
}

/// Accepts connections and never answers.
async fn hanging_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    url
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// The blob store key of check run `run`'s kept plan.
fn plan_key(run: i64) -> String {
    format!("{}{run}.plan", stategate::drift::PLAN_PREFIX)
}

/// Check run `run`'s sealed kept plan as the blob store holds it.
async fn stored_plan(server: &TestServer, run: i64) -> Option<bytes::Bytes> {
    let blobs = server.app.tofu.store().blobs();
    blobs.get(&plan_key(run)).await.unwrap()
}

/// The kept plans in the blob store.
async fn stored_plans(server: &TestServer) -> Vec<String> {
    let blobs = server.app.tofu.store().blobs();
    blobs.list(stategate::drift::PLAN_PREFIX).await.unwrap()
}

/// `<data_dir>/drift/plans`, where earlier releases kept plans as files.
fn legacy_plans(server: &TestServer) -> std::path::PathBuf {
    server.config.data_dir.join("drift/plans")
}

#[tokio::test]
async fn webhooks_are_signed_and_retried_a_bounded_number_of_times() {
    let flaky = Receiver::start(vec![500, 503]).await;
    let hanging = hanging_endpoint().await;
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/hook", l.local_addr().unwrap())
    };
    let notifier = Notifier::new(
        vec![flaky.url.clone(), hanging.clone(), refused.clone()],
        "s3cret".into(),
        3,
        Duration::from_millis(300),
        Duration::from_millis(10),
    );
    let started = std::time::Instant::now();
    let mut deliveries = notifier
        .send(serde_json::json!({ "event": "test", "workspace": "prod" }))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "bounded");
    deliveries.sort_by_key(|d| d.url.clone());
    // Reported as host and port only: a webhook URL's path may be its credential.
    let by_url = |url: &str| {
        let shown = stategate::drift::webhook::redacted(url);
        deliveries.iter().find(|d| d.url == shown).unwrap().clone()
    };
    let ok = by_url(&flaky.url);
    assert!(
        ok.delivered && ok.attempts == 3 && ok.status == Some(200),
        "{ok:?}"
    );
    let hung = by_url(&hanging);
    assert!(
        !hung.delivered && hung.attempts == 3 && hung.status.is_none(),
        "{hung:?}"
    );
    let gone = by_url(&refused);
    assert!(!gone.delivered && gone.attempts == 3, "{gone:?}");

    let seen = flaky.seen();
    assert_eq!(seen.len(), 3, "one request per attempt");
    for (signature, body) in &seen {
        assert!(verify("s3cret", signature, body, now(), 300), "{signature}");
        assert!(!verify("other", signature, body, now(), 300));
        let event: serde_json::Value = serde_json::from_slice(body).unwrap();
        let t = signature
            .split(',')
            .next()
            .unwrap()
            .trim_start_matches("t=");
        assert_eq!(
            event["timestamp"].to_string(),
            t,
            "the signed timestamp is in the body"
        );
        assert_eq!(event["workspace"], "prod");
    }
    assert!(
        seen.iter().all(|s| s == &seen[0]),
        "retries resend the same event"
    );
}

/// A live credential for drift run `run` of `workspace`, as `execute` issues one for
/// its child; returns the secret.
fn issue_run_credential(server: &TestServer, workspace: &str, run: i64) -> String {
    use stategate::tofu::run_credential;
    let (secret, hash) = run_credential::new_secret().unwrap();
    let name = run_credential::name_of_run(run);
    run_credential::insert(&server.db(), &hash, workspace, &name, now() + 3600).unwrap();
    secret
}

fn service(server: &TestServer, checks: Vec<DriftCheck>, hooks: Vec<String>) -> DriftService {
    let config = Config {
        drift: checks,
        public_url: Some(server.base.clone()),
        drift_settings: stategate::config::DriftSettings {
            webhooks: hooks,
            webhook_attempts: 2,
            ..Default::default()
        },
        ..server.config.clone()
    };
    DriftService::with_backoff(
        &config,
        server.app.tofu.clone(),
        server.root.clone(),
        Duration::from_millis(10),
    )
}

#[tokio::test]
async fn bad_checks_are_error_outcomes_and_the_change_is_notified() {
    let server = TestServer::start().await;
    let hooks = Receiver::start(vec![]).await;
    let scratch = tempfile::tempdir().unwrap();
    let empty = scratch.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let configured = scratch.path().join("conf");
    std::fs::create_dir(&configured).unwrap();
    std::fs::write(configured.join("main.tf"), "").unwrap();
    let drift = service(
        &server,
        vec![
            check("nodir", &scratch.path().join("missing"), "tofu"),
            check("noconf", &empty, "tofu"),
            check("nobin", &configured, "no-such-tofu-binary"),
            check("badpath", &configured, "/nonexistent/tofu"),
        ],
        vec![hooks.url.clone()],
    );
    for (ws, why) in [
        ("nodir", "does not exist"),
        ("noconf", "has no configuration"),
        ("nobin", "was not found on PATH"),
        ("badpath", "does not exist or is not executable"),
    ] {
        let run = drift.check_now(ws, "test").await.unwrap();
        assert_eq!(run.outcome, Some(Outcome::Error), "{ws}");
        assert!(
            run.message.as_deref().unwrap().contains(why),
            "{ws}: {run:?}"
        );
    }
    let delivered = drift.flush_webhooks().await;
    assert_eq!(delivered.len(), 4);
    assert!(delivered.iter().all(|d| d.delivered));
    // The same error again is no news; the schedule goes on with every check.
    let again = drift.check_now("nodir", "test").await.unwrap();
    assert_eq!(again.outcome, Some(Outcome::Error));
    assert!(drift.flush_webhooks().await.is_empty());
    let events: Vec<serde_json::Value> = hooks
        .seen()
        .iter()
        .map(|(_, body)| serde_json::from_slice(body).unwrap())
        .collect();
    assert_eq!(events.len(), 4);
    assert!(events
        .iter()
        .all(|e| e["outcome"] == "error" && e["previous"].is_null()));
    let err = drift.check_now("unconfigured", "test").await.unwrap_err();
    assert_eq!(err.http_status(), 404);
    let status = drift.metric_rows().await.unwrap();
    assert_eq!(status.len(), 4);
    assert!(status.iter().all(|(_, s, _)| *s == 2));
}

#[tokio::test]
async fn a_locked_workspace_is_skipped_and_its_holder_kept() {
    let server = TestServer::start().await;
    let scratch = tempfile::tempdir().unwrap();
    std::fs::write(scratch.path().join("main.tf"), "").unwrap();
    std::fs::write(scratch.path().join("input"), "same").unwrap();
    let tofu = fake_tofu(scratch.path());
    let drift = service(
        &server,
        vec![check("prod", scratch.path(), &tofu.display().to_string())],
        vec![],
    );
    let lock = server
        .tf("LOCK", "prod")
        .body(lock_info("holder-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(lock.status(), 200);
    let run = drift.check_now("prod", "test").await.unwrap();
    assert_eq!(run.outcome, Some(Outcome::SkippedLocked));
    // The holder is recorded as a field of the run (what pages show), and reads back.
    assert_eq!(run.locked_by.as_deref(), Some("tester@host"));
    let stored = drift.run(run.id).await.unwrap();
    assert_eq!(stored.locked_by.as_deref(), Some("tester@host"));
    let holder = server.app.tofu.lock_holder("prod").await.unwrap().unwrap();
    assert_eq!(holder.id, "holder-1", "the holder was not disturbed");
    assert!(
        !scratch.path().join(".terraform").exists(),
        "the binary never ran"
    );
    assert!(drift.metric_rows().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_frozen_workspace_is_skipped_and_nothing_runs() {
    let server = TestServer::start().await;
    let scratch = tempfile::tempdir().unwrap();
    std::fs::write(scratch.path().join("main.tf"), "").unwrap();
    std::fs::write(scratch.path().join("input"), "same").unwrap();
    let tofu = fake_tofu(scratch.path());
    let drift = service(
        &server,
        vec![check("prod", scratch.path(), &tofu.display().to_string())],
        vec![],
    );
    server
        .app
        .operator
        .freeze("prod", "change freeze", None, Some("1h"), "operator:ops")
        .await
        .unwrap();
    let run = drift.check_now("prod", "test").await.unwrap();
    assert_eq!(run.outcome, Some(Outcome::SkippedFrozen));
    let message = run.message.clone().unwrap_or_default();
    assert!(
        message.contains("change freeze") && message.contains("operator:ops"),
        "{message}"
    );
    assert!(
        !scratch.path().join(".terraform").exists(),
        "the binary never ran"
    );
    assert_eq!(server.count("SELECT count(*) FROM tf_locks"), 0);
    assert_eq!(
        server.count("SELECT count(*) FROM drift_runs WHERE outcome = 'skipped_frozen'"),
        1
    );
    assert!(drift.metric_rows().await.unwrap().is_empty());
    // Unfrozen, the next check runs.
    server
        .app
        .operator
        .unfreeze("prod", "operator:ops")
        .await
        .unwrap();
    let run = drift.check_now("prod", "test").await.unwrap();
    assert_ne!(run.outcome, Some(Outcome::SkippedFrozen));
}

#[tokio::test]
async fn only_a_drifted_checks_kept_plan_is_applied_and_only_once() {
    let server = TestServer::start().await;
    let hooks = Receiver::start(vec![]).await;
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    std::fs::write(dir.join("main.tf"), "").unwrap();
    std::fs::write(dir.join("input"), "same").unwrap();
    let tofu = fake_tofu(dir);
    let drift = service(
        &server,
        vec![check("prod", dir, &tofu.display().to_string())],
        vec![hooks.url.clone()],
    );

    let in_sync = drift.check_now("prod", "test").await.unwrap();
    assert_eq!(in_sync.outcome, Some(Outcome::InSync));
    assert!(dir.join(".terraform").exists(), "init ran once");
    std::fs::write(dir.join("input"), "changed").unwrap();
    let drifted = drift.check_now("prod", "test").await.unwrap();
    assert_eq!(drifted.outcome, Some(Outcome::Drifted));
    assert_eq!(drifted.changes.unwrap().change, 1);
    assert!(drifted.approvable);
    assert_eq!(drift.flush_webhooks().await.len(), 1, "in sync -> drifted");
    let (_, output) = drift.show(drifted.id).await.unwrap();
    assert!(output
        .text()
        .unwrap()
        .contains("human text of the saved plan"));

    // Kept in the blob store, where every node sharing it reads it; not on this disk.
    let sealed = stored_plan(&server, drifted.id)
        .await
        .expect("the plan is in the store");
    assert!(
        !String::from_utf8_lossy(&sealed).contains("PLAN-"),
        "sealed at rest"
    );
    assert!(
        !legacy_plans(&server).exists(),
        "no plan file in the data dir"
    );
    let no_plaintext = std::fs::read_dir(server.config.data_dir.join("drift/work"))
        .unwrap()
        .count();
    assert_eq!(no_plaintext, 0, "no plaintext plan is left in work/");

    let refused = drift.approve(in_sync.id, "operator:t").await.unwrap_err();
    assert!(
        refused.to_string().contains("not a drifted check"),
        "{refused}"
    );
    let started = drift.approve(drifted.id, "operator:t").await.unwrap();
    let busy = drift.start_check("prod", "test").await.unwrap_err();
    assert_eq!(busy.http_status(), 409, "one run per workspace at a time");
    let applied = drift.execute(started).await.unwrap();
    assert_eq!(applied.outcome, Some(Outcome::Applied));
    assert_eq!(
        std::fs::read_to_string(dir.join("applied")).unwrap(),
        "PLAN-changed",
        "exactly the kept plan was applied"
    );
    assert_eq!(
        stored_plan(&server, drifted.id).await,
        None,
        "a used plan is deleted from the store"
    );
    let twice = drift.approve(drifted.id, "operator:t").await.unwrap_err();
    assert!(twice.to_string().contains("already approved"), "{twice}");
    assert_eq!(
        server.count("SELECT count(*) FROM audit WHERE event IN ('drift.apply_approved', 'drift.applied') AND scope = 'tf/prod'"),
        2
    );

    // A plan past its expiry is refused and deleted by the tidy pass.
    let mut config = server.config.clone();
    config.drift = vec![check("prod", dir, &tofu.display().to_string())];
    config.drift_settings.plan_expiry_seconds = 0;
    let expiring = DriftService::new(&config, server.app.tofu.clone(), server.root.clone());
    let expired = expiring.check_now("prod", "test").await.unwrap();
    assert_eq!(expired.outcome, Some(Outcome::Drifted));
    assert!(!expired.approvable);
    let refused = expiring
        .approve(expired.id, "operator:t")
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("expired"), "{refused}");
    assert!(stored_plan(&server, expired.id).await.is_some());
    expiring.tidy().await.unwrap();
    assert_eq!(stored_plan(&server, expired.id).await, None);
    assert_eq!(stored_plans(&server).await, Vec::<String>::new());
}

/// [`service`] as another node would run it: the same index and blob store, its own
/// data dir (`data_dir`), so nothing on the first node's disk is in reach.
fn other_node(
    server: &TestServer,
    checks: Vec<DriftCheck>,
    data_dir: &std::path::Path,
) -> DriftService {
    let config = Config {
        drift: checks,
        public_url: Some(server.base.clone()),
        data_dir: data_dir.to_path_buf(),
        ..server.config.clone()
    };
    DriftService::new(&config, server.app.tofu.clone(), server.root.clone())
}

#[tokio::test]
async fn a_plan_kept_through_one_node_is_applied_through_another_once() {
    let server = TestServer::start().await;
    let (scratch, tofu) = check_dir("changed");
    let dir = scratch.path();
    let node_b_data = tempfile::tempdir().unwrap();
    let a = service(&server, vec![check("prod", dir, &tofu)], vec![]);
    let b = other_node(&server, vec![check("prod", dir, &tofu)], node_b_data.path());

    // Both nodes asked for a check at once: the index admits one run of a workspace.
    let (through_a, through_b) =
        tokio::join!(a.start_check("prod", "a"), b.start_check("prod", "b"));
    let (admitted, refused) = match (through_a, through_b) {
        (Ok(started), Err(e)) | (Err(e), Ok(started)) => (started, e),
        other => panic!("exactly one check is admitted: {other:?}"),
    };
    assert_eq!(refused.http_status(), 409, "{refused}");
    assert!(refused.to_string().contains("still going"), "{refused}");
    let drifted = a.execute(admitted).await.unwrap();
    assert_eq!(drifted.outcome, Some(Outcome::Drifted));
    assert!(stored_plan(&server, drifted.id).await.is_some());

    // Approved through both nodes at once: one apply is admitted, through either.
    let (through_a, through_b) = tokio::join!(
        a.approve(drifted.id, "operator:a"),
        b.approve(drifted.id, "operator:b")
    );
    let (started, refused) = match (through_a, through_b) {
        (Ok(started), Err(e)) | (Err(e), Ok(started)) => (started, e),
        other => panic!("exactly one approval is admitted: {other:?}"),
    };
    assert_eq!(refused.http_status(), 409, "{refused}");
    // The apply runs on node B, whose disk never held the plan.
    let applied = b.execute(started).await.unwrap();
    assert_eq!(applied.outcome, Some(Outcome::Applied), "{applied:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("applied")).unwrap(),
        "PLAN-changed",
        "exactly the plan node A kept was applied"
    );
    assert_eq!(
        stored_plan(&server, drifted.id).await,
        None,
        "used, then deleted"
    );
    for node in [a, b] {
        let again = node.approve(drifted.id, "operator:t").await.unwrap_err();
        assert!(again.to_string().contains("already approved"), "{again}");
    }
    assert_eq!(
        server.count("SELECT count(*) FROM drift_runs WHERE kind = 'apply'"),
        1
    );
    assert!(!node_b_data.path().join("drift/plans").exists());
    assert!(!legacy_plans(&server).exists());
}

#[tokio::test]
async fn plan_files_an_earlier_release_kept_move_into_the_store() {
    use stategate::store::reseal::Census;
    let server = TestServer::start().await;
    let (scratch, tofu) = check_dir("changed");
    let dir = scratch.path();
    let drift = service(&server, vec![check("prod", dir, &tofu)], vec![]);
    let drifted = drift.check_now("prod", "test").await.unwrap();
    assert_eq!(drifted.outcome, Some(Outcome::Drifted));

    // As an earlier release left it: the same sealed bytes as a file, nothing in the
    // store; beside it a plan of no run and a reseal's temporary copy.
    let sealed = stored_plan(&server, drifted.id).await.unwrap();
    let blobs = server.app.tofu.store().blobs();
    blobs.delete(&plan_key(drifted.id)).await.unwrap();
    let files = legacy_plans(&server);
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join(format!("{}.plan", drifted.id)), &sealed).unwrap();
    std::fs::write(files.join("987654.plan"), b"sealed plan of no run").unwrap();
    std::fs::write(files.join("3.plan.resealing"), b"half a reseal").unwrap();

    // `key status` counts it where it is (and moves nothing).
    let mut census = Census::default();
    drift.count_sealed(&mut census).await.unwrap();
    assert_eq!(census.generations[&0].drift_plans, 2, "{census:?}");
    assert!(files.join(format!("{}.plan", drifted.id)).exists());

    // Approving moves it into the store first, unchanged, and clears the directory.
    let started = drift.approve(drifted.id, "operator:t").await.unwrap();
    assert!(!files.exists(), "every old plan file was moved or deleted");
    assert_eq!(stored_plan(&server, drifted.id).await.unwrap(), sealed);
    assert_eq!(
        stored_plans(&server).await,
        vec![plan_key(drifted.id)],
        "a plan file of no run is not moved"
    );
    let applied = drift.execute(started).await.unwrap();
    assert_eq!(applied.outcome, Some(Outcome::Applied), "{applied:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("applied")).unwrap(),
        "PLAN-changed"
    );
    assert_eq!(stored_plans(&server).await, Vec::<String>::new());

    // A file of a plan no longer wanted (here: used) is deleted, not moved.
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join(format!("{}.plan", drifted.id)), &sealed).unwrap();
    drift.tidy().await.unwrap();
    assert!(!files.exists());
    assert_eq!(stored_plans(&server).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_reseal_moves_drift_outputs_and_kept_plans_to_the_new_key_and_the_plan_still_applies() {
    use stategate::crypto::SealKey;
    use stategate::store::reseal::Census;
    let server = TestServer::start().await;
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    std::fs::write(dir.join("main.tf"), "").unwrap();
    std::fs::write(dir.join("input"), "changed").unwrap();
    let tofu = fake_tofu(dir);
    let drift = service(
        &server,
        vec![check("prod", dir, &tofu.display().to_string())],
        vec![],
    );
    let drifted = drift.check_now("prod", "test").await.unwrap();
    assert_eq!(drifted.outcome, Some(Outcome::Drifted));
    let census = |drift: DriftService| async move {
        let mut c = Census::default();
        drift.count_sealed(&mut c).await.unwrap();
        c
    };
    let before = census(drift.clone()).await;
    assert_eq!(before.generations[&0].drift_outputs, 1);
    assert_eq!(before.generations[&0].drift_plans, 1);

    let with_check = Config {
        drift: vec![check("prod", dir, &tofu.display().to_string())],
        ..server.config.clone()
    };
    let drift_cli = rotate_as_the_cli(&with_check).await;
    let done = drift_cli.reseal().await.unwrap();
    assert_eq!((done.outputs, done.plans, done.current), (1, 1, 0));
    let after = census(drift_cli.clone()).await;
    assert_eq!(after.generations.get(&0), None, "{after:?}");
    assert_eq!(after.generations[&1].drift_outputs, 1);
    assert_eq!(after.generations[&1].drift_plans, 1);
    let kept = stored_plan(&server, drifted.id).await.unwrap();
    assert_eq!(SealKey::sealed_generation(&kept), 1);
    let again = drift_cli.reseal().await.unwrap();
    assert_eq!((again.outputs, again.plans, again.current), (0, 0, 2));
    assert_eq!(
        stored_plans(&server).await,
        vec![plan_key(drifted.id)],
        "resealed in place: nothing else is left beside the plan"
    );

    // The resealed text still reads and the resealed plan still applies, exactly once.
    let (_, output) = drift_cli.show(drifted.id).await.unwrap();
    assert!(output
        .text()
        .unwrap()
        .contains("human text of the saved plan"));
    let started = drift_cli.approve(drifted.id, "operator:t").await.unwrap();
    let applied = drift_cli.execute(started).await.unwrap();
    assert_eq!(applied.outcome, Some(Outcome::Applied));
    assert_eq!(
        std::fs::read_to_string(dir.join("applied")).unwrap(),
        "PLAN-changed"
    );
}

/// What `stategate key rotate` does, on its own handles on `config`'s data dir (data
/// generation 1 added and in use), and the drift service `key reseal` then runs with.
async fn rotate_as_the_cli(config: &Config) -> DriftService {
    use stategate::crypto::Purpose;
    use stategate::store::keyring;
    let store = stategate::installation::open_state_store(config)
        .await
        .unwrap();
    let root = stategate::installation::load_root_key(config, false).unwrap();
    stategate::installation::open_keyring(config, &root, &store, true)
        .await
        .unwrap();
    let service_key = stategate::installation::key_service(config, &root);
    keyring::rotate(&store, &service_key, Purpose::Data, "test")
        .await
        .unwrap();
    root.reload().unwrap();
    assert_eq!(root.data_generation(), 1);
    let tofu = stategate::tofu::TofuBackend::new(store, root.clone());
    DriftService::new(config, tofu, root)
}

/// A tidy pass that deletes an output past retention and expired plans while a reseal
/// has read them and not yet written them back: the reseal deletes them again, so
/// nothing tidy deleted comes back under the new key.
#[tokio::test]
async fn what_tidy_deletes_while_a_reseal_runs_stays_deleted() {
    // Before the first output is written back (the outputs race), and before the
    // first plan is (both outputs resealed, then the plans race).
    tidy_racing_a_reseal(0, (1, 0)).await;
    tidy_racing_a_reseal(2, (2, 0)).await;
}

/// A server with two drifted runs (keep 1 output, plans expire at once), whose tidy
/// runs once, at the `at`-th object a CLI reseal has read and not yet written back;
/// `resealed` is (outputs, plans) the reseal reports.
async fn tidy_racing_a_reseal(at: usize, resealed: (u64, u64)) {
    use stategate::crypto::SealKey;
    use stategate::drift::RunOutput;
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    std::fs::write(dir.join("main.tf"), "").unwrap();
    std::fs::write(dir.join("input"), "changed").unwrap();
    let tofu = fake_tofu(&dir).display().to_string();
    let server = TestServer::start_with(|c| {
        c.drift = vec![check("prod", &dir, &tofu)];
        c.drift_settings.keep_outputs = 1;
        c.drift_settings.plan_expiry_seconds = 0;
    })
    .await;
    let drift = &server.app.drift;
    let first = drift.check_now("prod", "test").await.unwrap();
    let second = drift.check_now("prod", "test").await.unwrap();
    assert_eq!(second.outcome, Some(Outcome::Drifted));
    let blobs = server.app.tofu.store().blobs().clone();
    let (old_text, new_text) = (
        first.output_blob.clone().unwrap(),
        second.output_blob.clone().unwrap(),
    );
    assert!(blobs.get(&old_text).await.unwrap().is_some());
    assert_eq!(
        stored_plans(&server).await.len(),
        2,
        "both expired plans still there before the race"
    );

    // The server's tidy racing the reseal.
    let drift_cli = rotate_as_the_cli(&server.config).await;
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let done = drift_cli
        .reseal_racing(|| {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move {
                if n == at {
                    drift.tidy().await.unwrap()
                }
            }
        })
        .await
        .unwrap();
    assert_eq!((done.outputs, done.plans), resealed, "at {at}: {done:?}");
    assert!(
        blobs.get(&old_text).await.unwrap().is_none(),
        "at {at}: the pruned output stays deleted"
    );
    assert_eq!(
        stored_plans(&server).await,
        Vec::<String>::new(),
        "at {at}: the expired plans stay deleted"
    );
    let kept = blobs.get(&new_text).await.unwrap().unwrap();
    assert_eq!(SealKey::sealed_generation(&kept), 1);
    let (_, output) = drift.show(first.id).await.unwrap();
    assert!(matches!(output, RunOutput::Pruned { .. }), "{output:?}");
    let (_, output) = drift.show(second.id).await.unwrap();
    assert!(output
        .text()
        .unwrap()
        .contains("human text of the saved plan"));
}

#[tokio::test]
async fn the_admin_api_lists_runs_starts_checks_and_refuses_bad_approvals() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    std::fs::write(dir.join("main.tf"), "").unwrap();
    std::fs::write(dir.join("input"), "same").unwrap();
    let tofu = fake_tofu(&dir).display().to_string();
    let server = TestServer::start_with(|c| c.drift = vec![check("prod", &dir, &tofu)]).await;
    let token = server
        .app
        .operator
        .admin_write(|c| stategate::operator::identity::create_operator(c, "ops@example.com", "t"))
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let call = |method: &str, path: &str, token: Option<&str>| {
        let mut req = http.request(
            method.parse().unwrap(),
            format!("{}/api/v1/admin/{path}", server.base),
        );
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let body: serde_json::Value =
                serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap_or_default();
            (status, body)
        }
    };
    assert_eq!(call("GET", "drift", None).await.0, 401);
    let (status, body) = call("GET", "drift", Some(&token)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["checks"][0]["workspace"], "prod");
    assert_eq!(body["runs"], serde_json::json!([]));

    let (status, started) = call("POST", "drift/prod/run", Some(&token)).await;
    assert_eq!(status, 202, "{started}");
    let run = started["run"].as_i64().unwrap();
    let mut shown = serde_json::Value::Null;
    for _ in 0..500 {
        shown = call("GET", &format!("drift/{run}"), Some(&token)).await.1;
        if !shown["run"]["finished_at"].is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(shown["run"]["outcome"], "in_sync", "{shown}");
    assert_eq!(shown["run"]["trigger"], "operator:ops@example.com");
    assert!(shown["output"].as_str().unwrap().contains("No changes."));

    for (method, path, want) in [
        ("POST", format!("drift/{run}/apply"), 409),
        ("POST", "drift/9999/apply".to_string(), 404),
        ("POST", "drift/nope/run".to_string(), 404),
        ("POST", "drift/..%2f/run".to_string(), 400),
        ("GET", "drift/abc".to_string(), 400),
        ("GET", "drift?limit=0".to_string(), 400),
    ] {
        let (status, body) = call(method, &path, Some(&token)).await;
        assert_eq!(status, want, "{method} {path}: {body}");
        assert!(body["error"].is_string(), "{body}");
    }
}

#[tokio::test]
async fn the_scheduler_runs_due_checks_and_stops_on_shutdown() {
    let server = TestServer::start().await;
    let (scratch, tofu) = check_dir("same");
    let dir = scratch.path();
    let mut scheduled = check("prod", dir, &tofu);
    scheduled.interval_seconds = 3600;
    let manual = check("manual", dir, &tofu);
    let drift = service(&server, vec![scheduled, manual], vec![]);
    let (stop, watch) = tokio::sync::watch::channel(false);
    let claims = stategate::jobs::Claims::of(server.app.tofu.store());
    let scheduler = tokio::spawn({
        let drift = drift.clone();
        async move { drift.schedule(watch, &claims).await }
    });
    let mut runs = Vec::new();
    for _ in 0..500 {
        runs = drift.runs(None, 10).await.unwrap();
        if runs.iter().any(|r| r.finished_at.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        runs.len(),
        1,
        "only the check with an interval, once: {runs:?}"
    );
    assert_eq!(
        (runs[0].workspace.as_str(), runs[0].trigger.as_str()),
        ("prod", "schedule")
    );
    assert_eq!(runs[0].outcome, Some(Outcome::InSync));
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), scheduler)
        .await
        .expect("the scheduler stops on shutdown")
        .unwrap();
}

#[tokio::test]
async fn a_run_abandoned_by_a_stopped_process_is_closed_and_its_lock_cleared() {
    let server = TestServer::start().await;
    let scratch = tempfile::tempdir().unwrap();
    let drift = service(&server, vec![check("prod", scratch.path(), "tofu")], vec![]);
    // A run started an hour ago by a process that died with its child holding the lock.
    let started = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    let rfc = |t: time::OffsetDateTime| {
        t.format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    server
        .db()
        .execute(
            "INSERT INTO drift_runs (workspace, kind, trigger, started_at) VALUES ('prod', 'check', 'schedule', ?1)",
            [rfc(started)],
        )
        .unwrap();
    // Its child locked with the credential issued for run 1 (as `execute` issues it).
    let secret = issue_run_credential(&server, "prod", 1);
    let child_lock = serde_json::json!({
        "ID": "child-lock", "Operation": "OperationTypePlan", "Who": "x@y",
        "Created": rfc(started + time::Duration::seconds(2)),
    });
    let lock = reqwest::Client::new()
        .request("LOCK".parse().unwrap(), server.url("prod"))
        .basic_auth("stategate", Some(&secret))
        .body(child_lock.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(lock.status(), 200);
    assert_eq!(
        drift
            .start_check("prod", "test")
            .await
            .unwrap_err()
            .http_status(),
        409,
        "the abandoned run still blocks the workspace"
    );
    drift.tidy().await.unwrap();
    let run = &drift.runs(Some("prod".into()), 1).await.unwrap()[0];
    assert_eq!(run.outcome, Some(Outcome::Error));
    let message = run.message.as_deref().unwrap();
    assert!(
        message.contains("abandoned") && message.contains("force-cleared"),
        "{message}"
    );
    assert!(server.app.tofu.lock_holder("prod").await.unwrap().is_none());
    assert_eq!(
        server.count(
            "SELECT count(*) FROM audit WHERE event = 'tf.lock_forced' AND actor = 'drift:run-1'"
        ),
        1
    );
}

#[tokio::test]
async fn only_the_newest_runs_keep_their_plan_text_and_orphan_outputs_are_swept() {
    use stategate::drift::RunOutput;
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    std::fs::write(dir.join("main.tf"), "").unwrap();
    std::fs::write(dir.join("input"), "changed").unwrap();
    let tofu = fake_tofu(&dir).display().to_string();
    let mut prod = check("prod", &dir, &tofu);
    // Kept plans waiting for approval keep their text; these are plain findings.
    prod.approve_apply = false;
    let dev = check("dev", &dir, &tofu);
    let server = TestServer::start_with(|c| {
        c.drift = vec![prod, dev];
        c.drift_settings.keep_outputs = 3;
    })
    .await;
    let put = server
        .tf("POST", "prod")
        .body(common::state(1, "L", "[]"))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let drift = &server.app.drift;
    let mut runs = Vec::new();
    for _ in 0..5 {
        let run = drift.check_now("prod", "test").await.unwrap();
        assert_eq!(run.outcome, Some(Outcome::Drifted));
        runs.push(run);
    }
    let blobs = server.app.tofu.store().blobs().clone();
    let outputs = |keys: &[String]| -> Vec<String> {
        keys.iter()
            .filter(|k| k.ends_with(".out"))
            .cloned()
            .collect()
    };
    assert_eq!(outputs(&blobs.list("drift/").await.unwrap()).len(), 5);

    // Left by crashes between storing an output and recording it: of a finished run
    // (never recordable now), of a run still going, and of a run this index never had.
    let going = drift.start_check("dev", "test").await.unwrap();
    let orphan = format!("drift/{}-0123456789abcdef.out", runs[4].id);
    let in_flight = format!("drift/{}-0123456789abcdef.out", going.id);
    let unknown = "drift/99999-0123456789abcdef.out".to_string();
    let other = "drift/not-an-output.txt".to_string();
    for key in [&orphan, &in_flight, &unknown, &other] {
        blobs.put(key, "x".into()).await.unwrap();
    }
    let states = blobs.list("states/").await.unwrap();
    assert!(!states.is_empty());

    drift.tidy().await.unwrap();

    let mut left = blobs.list("drift/").await.unwrap();
    left.sort();
    let mut want: Vec<String> = runs[2..]
        .iter()
        .map(|r| r.output_blob.clone().unwrap())
        .chain([in_flight, unknown, other])
        .collect();
    want.sort();
    assert_eq!(
        left, want,
        "the newest 3 outputs and what is not provably garbage"
    );
    assert_eq!(
        blobs.list("states/").await.unwrap(),
        states,
        "states untouched"
    );

    let mut notes = Vec::new();
    for old in &runs[..2] {
        let (_, output) = drift.show(old.id).await.unwrap();
        assert!(
            matches!(output, RunOutput::Pruned { keep: 3, .. }),
            "{output:?}"
        );
        let note = output.pruned_note().unwrap();
        assert!(
            note.starts_with("plan text pruned by retention at ")
                && note.ends_with("(it kept only the newest 3 runs per workspace)"),
            "{note}"
        );
        notes.push(note);
    }
    for new in &runs[2..] {
        let (_, output) = drift.show(new.id).await.unwrap();
        assert!(output
            .text()
            .unwrap()
            .contains("human text of the saved plan"));
    }

    let token = server
        .app
        .operator
        .admin_write(|c| stategate::operator::identity::create_operator(c, "ops@example.com", "t"))
        .await
        .unwrap();
    let response = reqwest::Client::new()
        .get(format!("{}/api/v1/admin/drift/{}", server.base, runs[0].id))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let shown: serde_json::Value =
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(shown["output_pruned"], notes[0], "{shown}");
    assert!(shown["output"].is_null() && shown["run"]["id"] == runs[0].id);

    // An output that should still exist but is gone is an error, never "pruned".
    blobs
        .delete(runs[4].output_blob.as_deref().unwrap())
        .await
        .unwrap();
    let err = drift.show(runs[4].id).await.unwrap_err();
    assert_eq!(err.http_status(), 500, "{err}");
    assert!(err.to_string().contains("missing from the store"), "{err}");
}

/// A server whose one check, `prod`, always finds drift and keeps no plan for approval
/// (its runs' text is plain findings, under retention), keeping `keep` runs' text; and
/// the scratch directory the check runs in, which must outlive it.
async fn server_keeping_plain_findings(keep: u64) -> (tempfile::TempDir, TestServer) {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    std::fs::write(dir.join("main.tf"), "").unwrap();
    std::fs::write(dir.join("input"), "changed").unwrap();
    let tofu = fake_tofu(&dir).display().to_string();
    let mut prod = check("prod", &dir, &tofu);
    prod.approve_apply = false;
    let server = TestServer::start_with(|c| {
        c.drift = vec![prod];
        c.drift_settings.keep_outputs = keep;
    })
    .await;
    (scratch, server)
}

#[tokio::test]
async fn pruned_runs_stay_pruned_when_keep_outputs_is_raised_and_a_lost_output_stays_an_error() {
    use stategate::drift::RunOutput;
    let (_scratch, server) = server_keeping_plain_findings(1).await;
    let drift = &server.app.drift;
    let mut runs = Vec::new();
    for _ in 0..4 {
        runs.push(drift.check_now("prod", "test").await.unwrap());
    }
    drift.tidy().await.unwrap();
    assert_eq!(
        server.count("SELECT count(*) FROM drift_outputs_pruned"),
        3,
        "each pruned run recorded"
    );

    // The operator raises keep_outputs: the same database and store, a new service.
    let mut raised = server.config.clone();
    raised.drift_settings.keep_outputs = 10;
    let raised = DriftService::new(&raised, server.app.tofu.clone(), server.root.clone());
    for old in &runs[..3] {
        let (_, output) = raised.show(old.id).await.unwrap();
        assert!(
            matches!(output, RunOutput::Pruned { keep: 1, .. }),
            "pruned by retention, still pruned: {output:?}"
        );
        assert!(output
            .pruned_note()
            .unwrap()
            .ends_with("(it kept only the newest 1 runs per workspace)"));
    }
    let (_, kept) = raised.show(runs[3].id).await.unwrap();
    assert!(kept
        .text()
        .unwrap()
        .contains("human text of the saved plan"));

    // Deleted by hand, not by retention: an error under either setting, even once a
    // newer run puts it past retention.
    let blobs = server.app.tofu.store().blobs().clone();
    blobs
        .delete(runs[3].output_blob.as_deref().unwrap())
        .await
        .unwrap();
    drift.check_now("prod", "test").await.unwrap();
    drift.tidy().await.unwrap();
    for service in [&raised, drift] {
        let err = service.show(runs[3].id).await.unwrap_err();
        assert_eq!(err.http_status(), 500, "{err}");
        assert!(err.to_string().contains("missing from the store"), "{err}");
    }
}

/// LIST calls the server's blob store has answered (its store metrics count each).
fn store_lists(server: &TestServer) -> u64 {
    let metrics = String::from_utf8(server.app.metrics.render()).unwrap();
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"stategate_store_operation_duration_seconds_count{op="list"} "#)
        })
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn the_scheduler_lists_drift_outputs_only_when_a_sweep_can_find_something() {
    use stategate::drift::RunOutput;
    let (_scratch, server) = server_keeping_plain_findings(1).await;
    let drift = &server.app.drift;
    let pruned = |output: &RunOutput| matches!(output, RunOutput::Pruned { .. });
    let first = drift.check_now("prod", "test").await.unwrap();
    let second = drift.check_now("prod", "test").await.unwrap();

    let before = store_lists(&server);
    for _ in 0..3 {
        drift.tidy_when_due().await.unwrap();
    }
    assert_eq!(
        store_lists(&server) - before,
        1,
        "the first tick sweeps; the next ones find nothing changed"
    );
    assert!(pruned(&drift.show(first.id).await.unwrap().1));
    assert!(!pruned(&drift.show(second.id).await.unwrap().1));

    drift.check_now("prod", "test").await.unwrap();
    let before = store_lists(&server);
    for _ in 0..3 {
        drift.tidy_when_due().await.unwrap();
    }
    assert_eq!(
        store_lists(&server) - before,
        1,
        "a finished run asks for one sweep"
    );
    assert!(
        pruned(&drift.show(second.id).await.unwrap().1),
        "and it retired the older run's text"
    );

    let before = store_lists(&server);
    drift.tidy().await.unwrap();
    drift.tidy_when_due().await.unwrap();
    assert_eq!(
        store_lists(&server) - before,
        1,
        "a full tidy always sweeps, and counts as the tick's sweep"
    );
}

/// Issue 20 item 9: a timeout (or plan expiry) too large for the clock used to panic
/// on `Instant` overflow, leaving the run unfinished forever. Now it is as good as no
/// timeout: the check finishes, and so does the approved apply of its kept plan.
#[tokio::test]
async fn a_timeout_too_large_for_the_clock_still_finishes_the_run() {
    let server = TestServer::start().await;
    let (scratch, tofu) = check_dir("changed");
    let dir = scratch.path();
    for (ws, timeout) in [("huge", i64::MAX as u64), ("max", u64::MAX)] {
        let mut huge = check(ws, dir, &tofu);
        huge.timeout_seconds = timeout;
        let mut config = server.config.clone();
        config.public_url = Some(server.base.clone());
        config.drift = vec![huge];
        config.drift_settings.plan_expiry_seconds = u64::MAX;
        let drift = DriftService::new(&config, server.app.tofu.clone(), server.root.clone());
        let run = drift.check_now(ws, "test").await.unwrap();
        assert_eq!(run.outcome, Some(Outcome::Drifted), "{ws}: {run:?}");
        assert!(run.approvable, "{ws}: a plan kept for ever is approvable");
        let started = drift.approve(run.id, "operator:t").await.unwrap();
        let applied = drift.execute(started).await.unwrap();
        assert_eq!(applied.outcome, Some(Outcome::Applied), "{ws}: {applied:?}");
        drift.tidy().await.unwrap();
        assert!(
            drift.start_check(ws, "test").await.is_ok(),
            "{ws}: nothing left unfinished"
        );
    }
}

/// Issue 20 item 3: a drift child (anything the configuration runs) reads nothing of
/// the server. The child tries the environment, command line, maps and memory of its
/// parent and of the server's pid, and the data dir's DEK file and database; it sees
/// no server process (its own PID namespace with a fresh /proc) and an empty data dir.
#[tokio::test]
async fn a_drift_child_can_read_nothing_of_the_server() {
    let server = TestServer::start().await;
    let data = &server.config.data_dir;
    std::fs::write(data.join("dek"), common::DEK).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    std::fs::write(dir.join("main.tf"), "").unwrap();
    let tofu = common::drift::nosy_tofu(dir).display().to_string();
    let mut nosy = check("prod", dir, &tofu);
    let server_pid = std::process::id().to_string();
    nosy.env
        .insert("NOSY_PID".into(), server_pid.as_str().into());
    nosy.env
        .insert("NOSY_DATA".into(), data.display().to_string().into());
    let drift = service(&server, vec![nosy], vec![]);
    let run = drift.check_now("prod", "test").await.unwrap();
    assert_eq!(run.outcome, Some(Outcome::InSync), "{run:?}");
    let report = String::from_utf8_lossy(&std::fs::read(dir.join("report")).unwrap()).into_owned();
    let read: Vec<&str> = report.lines().filter(|l| l.starts_with("READ ")).collect();
    // Inside the sandbox the parent is the sandbox's own init (pid 1 of its namespace),
    // exec'd fresh with the child's own environment (its workspace credential, by
    // design); nothing else is readable.
    assert!(
        read.iter().all(|l| l.starts_with("READ /proc/1/")),
        "the child read {read:?}:\n{report}"
    );
    assert!(
        !report.contains(&format!("PPID {server_pid}\n")),
        "the server is not the child's parent in its namespace:\n{report}"
    );
    // On PostgreSQL, the index's URL (its password with it) is a secret of the server too.
    let index_url = server
        .config
        .index
        .url
        .as_ref()
        .map(|u| u.expose().to_string());
    for secret in [
        common::DEK.to_string(),
        server.bearer("other"),
        "STATEGATE_".to_string(),
        "SQLite format".to_string(),
    ]
    .into_iter()
    .chain(index_url)
    {
        assert!(!report.contains(&secret), "{secret:?} leaked:\n{report}");
    }
    for target in ["environ", "cmdline", "maps", "mem"] {
        assert!(
            report.contains(&format!("DENIED /proc/{server_pid}/{target}")),
            "{target}:\n{report}"
        );
    }
    // The index's file, where the index is one (on PostgreSQL the data dir has none,
    // and the URL's secret is a variable the child does not get: `STATEGATE_` above).
    let files: &[&str] = match server.config.index.kind {
        stategate::config::IndexKind::Sqlite => &["dek", "stategate.db"],
        stategate::config::IndexKind::Postgres => &["dek"],
    };
    for file in files {
        assert!(
            report.contains(&format!("DENIED {}", data.join(file).display())),
            "{file}:\n{report}"
        );
        assert!(data.join(file).exists(), "{file}");
    }
}

/// Issue 20 item 4: after a crash, a human took the workspace lock with the same
/// Operation, after the abandoned run had started. Recovering the run used to
/// force-clear it (any lock "created after the run started" looked like the child's),
/// so two applies could run at once. Now only a lock its own run credential took is
/// cleared: the human's stays, flagged on the run and in the audit log.
#[tokio::test]
async fn recovering_an_abandoned_run_keeps_a_lock_its_child_did_not_take() {
    let server = TestServer::start().await;
    let scratch = tempfile::tempdir().unwrap();
    let drift = service(
        &server,
        vec![
            check("prod", scratch.path(), "tofu"),
            check("staging", scratch.path(), "tofu"),
        ],
        vec![],
    );
    let started = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    let rfc = |t: time::OffsetDateTime| {
        t.format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    for ws in ["prod", "staging"] {
        server
            .db()
            .execute(
                "INSERT INTO drift_runs (workspace, kind, trigger, started_at) VALUES (?1, 'check', 'schedule', ?2)",
                [ws, &rfc(started)],
            )
            .unwrap();
    }
    let (prod_run, staging_run) = (1, 2);
    // prod: the crashed run's child still holds the lock it took with its credential.
    let child_secret = issue_run_credential(&server, "prod", prod_run);
    let child_lock = serde_json::json!({
        "ID": "child-lock", "Operation": "OperationTypePlan", "Who": "drift@host",
        "Created": rfc(started + time::Duration::seconds(2)),
    });
    let as_child = |method: &str, ws: &str| {
        reqwest::Client::new()
            .request(method.parse().unwrap(), server.url(ws))
            .basic_auth("stategate", Some(&child_secret))
    };
    let locked = as_child("LOCK", "prod")
        .body(child_lock.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(locked.status(), 200);
    assert_eq!(
        as_child("GET", "staging").send().await.unwrap().status(),
        401,
        "a run credential is for its own workspace only"
    );
    // staging: its crashed run's child had no lock left; after the restart a human
    // `terraform plan` took one, same Operation, created after the run started.
    issue_run_credential(&server, "staging", staging_run);
    let human_lock = serde_json::json!({
        "ID": "human-lock", "Operation": "OperationTypePlan", "Who": "alice@laptop",
        "Created": rfc(time::OffsetDateTime::now_utc()),
    });
    let locked = server
        .tf("LOCK", "staging")
        .body(human_lock.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(locked.status(), 200);

    drift.tidy().await.unwrap();

    let staging = drift.run(staging_run).await.unwrap();
    assert_eq!(staging.outcome, Some(Outcome::Error));
    let message = staging.message.as_deref().unwrap();
    assert!(
        message.contains("abandoned")
            && message.contains("human-lock")
            && message.contains("left alone")
            && message.contains("tf:staging"),
        "{message}"
    );
    let kept = server
        .app
        .tofu
        .lock_holder("staging")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.id, "human-lock", "the human's lock is kept");
    assert_eq!(
        server.count(
            "SELECT count(*) FROM audit WHERE event = 'tf.lock_forced' AND scope = 'tf/staging'"
        ),
        0
    );
    assert_eq!(
        server.count("SELECT count(*) FROM audit WHERE event = 'drift.lock_left' AND actor = 'drift:run-2' AND scope = 'tf/staging'"),
        1,
        "flagged in the audit log"
    );
    // The child's own stale lock is still cleared, and its credential ended with the run.
    let prod = drift.run(prod_run).await.unwrap();
    assert!(
        prod.message.as_deref().unwrap().contains("force-cleared"),
        "{prod:?}"
    );
    assert!(server.app.tofu.lock_holder("prod").await.unwrap().is_none());
    assert_eq!(
        server.count("SELECT count(*) FROM audit WHERE event = 'tf.lock_forced' AND actor = 'drift:run-1' AND scope = 'tf/prod'"),
        1
    );
    assert_eq!(as_child("GET", "prod").send().await.unwrap().status(), 401);
}

/// A `tofu` stand-in whose `plan` takes the workspace lock with the credential it was
/// given, records that credential in `secret`, and hangs until the timeout kills it.
const LOCKING_TOFU: &str = r#"#!/bin/sh
case "$1" in
init) mkdir -p .terraform; exit 0 ;;
plan)
  printf '%s' "$TF_HTTP_PASSWORD" > secret
  curl -s -o /dev/null -w '%{http_code}' -X LOCK -u "$TF_HTTP_USERNAME:$TF_HTTP_PASSWORD" \
    --data '{"ID":"child-lock","Operation":"OperationTypePlan","Who":"child"}' "$TF_HTTP_LOCK_ADDRESS" > locked
  sleep 30 ;;
esac
exit 1
"#;

/// The child of run N locks under a credential issued for run N (recorded on the
/// lock and in the audit log), not the workspace bearer; when the timeout kills it,
/// exactly that lock is cleared; the credential is refused once the run is over.
#[tokio::test]
async fn a_drift_child_locks_under_its_runs_own_credential() {
    use std::os::unix::fs::PermissionsExt;
    let server = TestServer::start().await;
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    std::fs::write(dir.join("main.tf"), "").unwrap();
    let tofu = dir.join("locking-tofu");
    std::fs::write(&tofu, LOCKING_TOFU).unwrap();
    std::fs::set_permissions(&tofu, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut slow = check("prod", dir, &tofu.display().to_string());
    slow.timeout_seconds = 3;
    let drift = service(&server, vec![slow], vec![]);
    let run = drift.check_now("prod", "test").await.unwrap();
    assert_eq!(std::fs::read_to_string(dir.join("locked")).unwrap(), "200");
    assert_eq!(run.outcome, Some(Outcome::Error), "{run:?}");
    assert!(
        run.message.as_deref().unwrap().contains("force-cleared"),
        "{run:?}"
    );
    assert!(server.app.tofu.lock_holder("prod").await.unwrap().is_none());
    let name = format!("drift:run-{}", run.id);
    for event in ["tf.lock_acquired", "tf.lock_forced"] {
        assert_eq!(
            server.count(&format!(
                "SELECT count(*) FROM audit WHERE event = '{event}' AND actor = '{name}'"
            )),
            1,
            "{event}"
        );
    }
    let secret = std::fs::read_to_string(dir.join("secret")).unwrap();
    assert!(secret.starts_with("sgr_"));
    assert_ne!(secret, server.bearer("prod"), "not the workspace bearer");
    let after = reqwest::Client::new()
        .get(server.url("prod"))
        .basic_auth("stategate", Some(&secret))
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), 401, "the credential ended with its run");
}
