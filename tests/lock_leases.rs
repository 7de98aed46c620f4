//! Leases for CI locks, and writer preference over plan locks (issue 41). On a
//! workspace a `[[lock_policy]]` names, the housekeeping pass
//! (`TofuBackend::expire_leased_locks`) releases a lock only when the credential that
//! took it is provably gone AND the lock has been idle longer than the lease. Time
//! moves through the one clock seam (`tokens::shift_clock_for_tests`), which is the
//! process's: this file is a test binary of its own, and its tests take turns on the
//! clock ([`Shifted`]).

mod common;

use common::{lock_info, state, status, TestServer};
use stategate::config::LockPolicyConfig;
use stategate::names::Pattern;
use stategate::tofu::access::Scope;
use stategate::tofu::credentials::{Grant, NewWorkspaceToken};
use stategate::tofu::lock::Gone;

/// The lease of every test's policy.
const LEASE: i64 = 60;

/// Holds the process's clock for one test and puts it back when dropped.
struct Shifted(#[allow(dead_code)] tokio::sync::MutexGuard<'static, ()>);

static CLOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Shifted {
    async fn take() -> Shifted {
        let guard = CLOCK.lock().await;
        stategate::tokens::shift_clock_for_tests(0);
        Shifted(guard)
    }

    /// The clock is `seconds` ahead of the machine's.
    fn ahead(&self, seconds: i64) {
        stategate::tokens::shift_clock_for_tests(seconds * 1000);
    }
}

impl Drop for Shifted {
    fn drop(&mut self) {
        stategate::tokens::shift_clock_for_tests(0);
    }
}

/// A server whose one policy gives `ci-*` a lease of [`LEASE`] seconds.
async fn server() -> TestServer {
    TestServer::start_with(|c| {
        c.lock_policy = vec![LockPolicyConfig {
            workspaces: vec!["ci-*".into()],
            lease: format!("{LEASE}s"),
        }];
    })
    .await
}

/// Issues a write token `name` on `ci-*` and `prod-*`; returns its secret.
async fn token(s: &TestServer, name: &str) -> String {
    let new = NewWorkspaceToken {
        name: name.into(),
        grant: Grant {
            patterns: vec![
                Pattern::parse("ci-*").unwrap(),
                Pattern::parse("prod-*").unwrap(),
            ],
            scope: Scope::Write,
            include_sensitive: false,
        },
        expires_in: None,
    };
    s.app
        .tofu
        .create_token(new, "operator:test")
        .await
        .unwrap()
        .0
}

fn plan_info(id: &str) -> String {
    lock_info(id).replace("OperationTypeApply", "OperationTypePlan")
}

/// LOCKs `workspace` as `id` with `secret` (the workspace's own credential: `None`).
async fn lock(s: &TestServer, workspace: &str, secret: Option<&str>, body: String) {
    let req = match secret {
        Some(secret) => s.tf_as("LOCK", workspace, Some(secret)),
        None => s.tf("LOCK", workspace),
    };
    let (code, text) = status(req.body(body)).await;
    assert_eq!(code, 200, "LOCK {workspace}: {text}");
}

/// The lock IDs holding `workspace` now (exclusive or plan holders), sorted.
fn holders(s: &TestServer, workspace: &str) -> Vec<String> {
    let conn = s.db();
    let mut ids: Vec<String> = Vec::new();
    for table in ["tf_locks", "tf_plan_locks"] {
        let mut stmt = conn
            .prepare(&format!("SELECT lock_id FROM {table} WHERE workspace = ?1"))
            .unwrap();
        let found: Vec<String> = stmt
            .query_map([workspace], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        ids.extend(found);
    }
    ids.sort();
    ids
}

/// Every `tf.lock_expired` row: (scope, actor, payload).
fn expired_rows(s: &TestServer) -> Vec<(String, String, serde_json::Value)> {
    let conn = s.db();
    let mut stmt = conn
        .prepare(
            "SELECT scope, actor, payload FROM audit WHERE event = 'tf.lock_expired' ORDER BY id",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            let payload: String = r.get(2)?;
            Ok((
                r.get(0)?,
                r.get(1)?,
                serde_json::from_str(&payload).unwrap(),
            ))
        })
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    rows
}

async fn expire(s: &TestServer) -> Vec<stategate::tofu::ExpiredLock> {
    s.app.tofu.expire_leased_locks().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_tokens_idle_lock_is_released_after_its_lease_and_audited_once() {
    let clock = Shifted::take().await;
    let s = server().await;
    let secret = token(&s, "ci-job").await;
    lock(&s, "ci-web", Some(&secret), lock_info("L1")).await;
    revoke(&s, "ci-job").await;

    clock.ahead(LEASE / 2);
    assert_eq!(expire(&s).await, [], "within its lease");
    assert_eq!(holders(&s, "ci-web"), ["L1"]);

    clock.ahead(LEASE + 5);
    let released = expire(&s).await;
    assert_eq!(released.len(), 1, "{released:?}");
    let r = &released[0];
    assert_eq!(
        (
            r.workspace.as_str(),
            r.lock_id.as_str(),
            r.taken_by.as_str()
        ),
        ("ci-web", "L1", "token:ci-job")
    );
    assert_eq!(r.why, Gone::TokenRevoked);
    assert!(r.idle_seconds > LEASE, "{r:?}");
    assert!(!r.shared);
    assert_eq!(holders(&s, "ci-web"), Vec::<String>::new());

    let rows = expired_rows(&s);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (scope, actor, payload) = &rows[0];
    assert_eq!((scope.as_str(), actor.as_str()), ("tf/ci-web", "stategate"));
    assert_eq!(payload["lock_id"], "L1");
    assert_eq!(payload["who"], "tester@host");
    assert_eq!(payload["operation"], "OperationTypeApply");
    assert_eq!(payload["taken_by"], "token:ci-job");
    assert_eq!(payload["why"], "token revoked");
    assert_eq!(payload["lease_seconds"], LEASE);
    assert!(
        payload["idle_seconds"].as_i64().unwrap() > LEASE,
        "{payload}"
    );
    assert!(
        !payload.to_string().contains(&secret),
        "no secret in the audit"
    );

    // Once: a second pass finds nothing, and the workspace is free for the next job.
    assert_eq!(expire(&s).await, []);
    assert_eq!(expired_rows(&s).len(), 1);
    lock(&s, "ci-web", None, lock_info("L2")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_token_a_derived_credential_and_an_unlisted_workspace_keep_their_locks() {
    let clock = Shifted::take().await;
    let s = server().await;
    let live = token(&s, "live").await;
    let gone = token(&s, "gone").await;
    lock(&s, "ci-live", Some(&live), lock_info("LIVE")).await;
    lock(&s, "ci-derived", None, lock_info("DERIVED")).await;
    // A lease on a workspace outside every policy: its gone token's lock stays.
    lock(&s, "prod-web", Some(&gone), lock_info("OUTSIDE")).await;
    revoke(&s, "gone").await;

    clock.ahead(30 * 24 * 3600);
    assert_eq!(expire(&s).await, []);
    assert_eq!(holders(&s, "ci-live"), ["LIVE"]);
    assert_eq!(holders(&s, "ci-derived"), ["DERIVED"]);
    assert_eq!(holders(&s, "prod-web"), ["OUTSIDE"]);
    assert_eq!(expired_rows(&s), []);
    // The live holder still writes and unlocks under its lock.
    let req = s
        .tf_as("POST", "ci-live", Some(&live))
        .query(&[("ID", "LIVE")])
        .body(state(1, "lin", ""));
    assert_eq!(status(req).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_time_runs_from_the_credentials_last_use() {
    let clock = Shifted::take().await;
    let s = server().await;
    let secret = token(&s, "busy").await;
    lock(&s, "ci-busy", Some(&secret), lock_info("B")).await;
    // Used well after the lock was taken (a state read during a long apply).
    clock.ahead(10 * LEASE);
    let read = s.tf_as("GET", "ci-busy", Some(&secret));
    assert_eq!(status(read).await.0, 404, "authenticated: no state yet");
    revoke(&s, "busy").await;

    clock.ahead(10 * LEASE + LEASE / 2);
    assert_eq!(
        expire(&s).await,
        [],
        "idle for half a lease since its last use"
    );
    assert_eq!(holders(&s, "ci-busy"), ["B"]);
    clock.ahead(11 * LEASE + 5);
    let released = expire(&s).await;
    assert_eq!(released.len(), 1);
    assert!(
        released[0].idle_seconds <= LEASE + 10,
        "from the last use, not from the lock: {released:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_holders_are_released_one_by_one() {
    let clock = Shifted::take().await;
    let s = server().await;
    let (a, b) = (token(&s, "plan-a").await, token(&s, "plan-b").await);
    lock(&s, "ci-plans", Some(&a), plan_info("PA")).await;
    lock(&s, "ci-plans", Some(&b), plan_info("PB")).await;
    lock(&s, "ci-plans", None, plan_info("PD")).await;
    revoke(&s, "plan-a").await;

    clock.ahead(LEASE + 5);
    let released = expire(&s).await;
    assert_eq!(released.len(), 1, "{released:?}");
    assert_eq!(
        (released[0].lock_id.as_str(), released[0].shared),
        ("PA", true)
    );
    assert_eq!(holders(&s, "ci-plans"), ["PB", "PD"]);

    revoke(&s, "plan-b").await;
    let released = expire(&s).await;
    assert_eq!(released.len(), 1, "{released:?}");
    assert_eq!(released[0].lock_id, "PB");
    assert_eq!(
        holders(&s, "ci-plans"),
        ["PD"],
        "the derived credential's plan stays"
    );

    let rows = expired_rows(&s);
    let ids: Vec<&str> = rows
        .iter()
        .map(|r| r.2["lock_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["PA", "PB"], "one row per holder");
    assert!(rows.iter().all(|r| r.2["shared"] == true), "{rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_drift_run_and_an_ended_ci_identity_are_gone_a_running_one_is_not() {
    use stategate::tofu::{ci_identity, lock as locks, run_credential};
    let clock = Shifted::take().await;
    let s = server().await;
    let now = stategate::tokens::now();
    let (run, hash) = run_credential::new_secret().unwrap();
    let (running, running_hash) = run_credential::new_secret().unwrap();
    {
        let conn = s.db();
        run_credential::insert(&conn, &hash, "ci-drift", "drift:run-7", now + 3600).unwrap();
        run_credential::insert(&conn, &running_hash, "ci-run", "drift:run-8", now + 100_000)
            .unwrap();
    }
    lock(&s, "ci-drift", Some(&run), lock_info("R7")).await;
    lock(&s, "ci-run", Some(&running), lock_info("R8")).await;
    run_credential::revoke(&s.db(), "drift:run-7").unwrap();

    // A CI identity's lock as its requests record it: the lock row and the window of
    // the identity's token (a real issuer is `integration/`'s and tests/access's).
    let held = |id: &str| locks::HeldLock {
        id: id.into(),
        info: lock_info(id),
    };
    {
        let conn = s.db();
        locks::put_lock(&conn, "ci-oidc", &held("C1"), "ci:gh:acme/infra@main").unwrap();
        ci_identity::record(&conn, "h1", "gh:acme/infra@main", now, now + 2 * LEASE).unwrap();
    }

    clock.ahead(LEASE + 5);
    let released = expire(&s).await;
    assert_eq!(released.len(), 1, "only the finished run's: {released:?}");
    assert_eq!(
        (released[0].lock_id.as_str(), released[0].why),
        ("R7", Gone::RunFinished)
    );
    assert_eq!(holders(&s, "ci-oidc"), ["C1"], "its token's window is open");
    assert_eq!(holders(&s, "ci-run"), ["R8"], "its run is going");

    // The window over (and the lock idle since it was taken): released.
    clock.ahead(2 * LEASE + 5);
    let released = expire(&s).await;
    assert_eq!(released.len(), 1, "{released:?}");
    assert_eq!(
        (released[0].lock_id.as_str(), released[0].why),
        ("C1", Gone::IdentityWindowEnded)
    );
    assert_eq!(holders(&s, "ci-run"), ["R8"]);
    let whys: Vec<String> = expired_rows(&s)
        .iter()
        .map(|r| r.2["why"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(whys, ["run finished", "identity window ended"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_policy_nothing_is_ever_released() {
    let clock = Shifted::take().await;
    let s = TestServer::start().await;
    let secret = token(&s, "ci-job").await;
    lock(&s, "ci-web", Some(&secret), lock_info("L1")).await;
    revoke(&s, "ci-job").await;
    clock.ahead(365 * 24 * 3600);
    assert_eq!(expire(&s).await, []);
    assert_eq!(holders(&s, "ci-web"), ["L1"]);
}

/// A bad lease or pattern refuses the configuration, and the server, naming it.
/// Revokes the issued token `name`, as an operator would.
async fn revoke(s: &TestServer, name: &str) {
    s.app
        .tofu
        .revoke_token(name, "operator:test")
        .await
        .unwrap();
}

#[tokio::test]
async fn a_bad_policy_is_refused_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    // (policy TOML, what the refusal says)
    let table = [
        (
            "workspaces = [\"ci-*\"]\nlease = \"30 minutes\"",
            "lock_policy[0].lease must be a duration such as 90s, 30m, 2h or 1d",
        ),
        (
            "workspaces = [\"ci-*\"]\nlease = \"0s\"",
            "from 1 second to 30 days",
        ),
        (
            "workspaces = [\"ci-*\"]\nlease = \"90d\"",
            "lock_policy[0].lease",
        ),
        (
            "workspaces = [\"ci/*\"]\nlease = \"30m\"",
            "lock_policy[0].workspaces[0]",
        ),
        (
            "workspaces = []\nlease = \"30m\"",
            "lock_policy[0].workspaces must list",
        ),
    ];
    for (policy, says) in table {
        let path = dir.path().join("stategate.toml");
        std::fs::write(&path, format!("[[lock_policy]]\n{policy}\n")).unwrap();
        let err = stategate::config::Config::load(Some(&path)).unwrap_err();
        assert!(err.to_string().contains(says), "{policy}: {err}");

        // The same entry given to the server directly never starts it.
        let mut config = stategate::config::Config {
            data_dir: dir.path().join("data"),
            dek: Some(common::DEK.into()),
            ..Default::default()
        };
        config.lock_policy =
            toml::from_str::<stategate::config::Config>(&format!("[[lock_policy]]\n{policy}\n"))
                .unwrap()
                .lock_policy;
        let built = stategate::server::build_app_with_clock(
            &config,
            std::sync::Arc::new(stategate::cluster::SystemClock),
        )
        .await;
        let err = built.err().expect("refused");
        assert!(err.to_string().contains(says), "{policy}: {err}");
    }
}

/// LOCKs (or UNLOCKs) `workspace` with its own credential; the status and the body.
async fn try_lock(s: &TestServer, method: &str, workspace: &str, body: String) -> (u16, String) {
    status(s.tf(method, workspace).body(body)).await
}

/// The writer waiting on `workspace` and how often it was refused, if one is recorded.
fn waiter(s: &TestServer, workspace: &str) -> Option<(String, i64)> {
    s.db()
        .query_row(
            "SELECT lock_id, tries FROM tf_lock_waiters WHERE workspace = ?1",
            [workspace],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .ok()
}

/// Writer preference (issue 41): plans taken back to back would otherwise keep the
/// workspace shared for ever, and an apply waiting with `-lock-timeout` never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrying_apply_keeps_new_plans_out_until_it_has_run() {
    let _clock = Shifted::take().await;
    let s = server().await;
    let ws = "prod-busy";
    for id in ["P1", "P2"] {
        lock(&s, ws, None, plan_info(id)).await;
    }

    // An apply refused once (`-lock-timeout=0`) has given up: plans still join.
    let (code, text) = try_lock(&s, "LOCK", ws, lock_info("A")).await;
    assert_eq!(code, 423, "{text}");
    assert!(text.contains("shared by 2 plan(s)"), "{text}");
    lock(&s, ws, None, plan_info("P3")).await;

    // Retrying, it is waiting: a new plan is refused, told which writer it waits for,
    // with an ID its own -lock-timeout retries on; the holders keep their locks.
    let (code, _) = try_lock(&s, "LOCK", ws, lock_info("A")).await;
    assert_eq!(code, 423);
    assert_eq!(waiter(&s, ws), Some(("A".into(), 2)));
    let (code, text) = try_lock(&s, "LOCK", ws, plan_info("P4")).await;
    assert_eq!(code, 423, "{text}");
    let shown: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(shown["ID"], "P1", "{text}");
    let why = shown["Info"].as_str().unwrap();
    assert!(
        why.starts_with("OperationTypeApply A (tester@host) is waiting for this lock")
            && why.contains("shared by 3 plan(s)"),
        "{why}"
    );
    lock(&s, ws, None, plan_info("P1")).await; // a holder's retry is still its own
    assert_eq!(holders(&s, ws), ["P1", "P2", "P3"]);

    // The plans finish; until the apply's next try nobody holds, and plans still wait.
    for id in ["P1", "P2", "P3"] {
        let (code, text) = try_lock(&s, "UNLOCK", ws, plan_info(id)).await;
        assert_eq!(code, 200, "{text}");
    }
    let (code, text) = try_lock(&s, "LOCK", ws, plan_info("P4")).await;
    assert_eq!(code, 423, "{text}");
    assert!(
        text.contains(r#""ID":"A""#),
        "the waiting writer's ID: {text}"
    );
    assert!(holders(&s, ws).is_empty());

    // The apply takes the lock (its record goes), runs, and the plans share again.
    lock(&s, ws, None, lock_info("A")).await;
    assert_eq!(waiter(&s, ws), None);
    let (code, _) = try_lock(&s, "LOCK", ws, plan_info("P4")).await;
    assert_eq!(code, 423, "the apply holds the lock");
    let (code, text) = try_lock(&s, "UNLOCK", ws, lock_info("A")).await;
    assert_eq!(code, 200, "{text}");
    lock(&s, ws, None, plan_info("P4")).await;
    lock(&s, ws, None, plan_info("P5")).await;
    assert_eq!(holders(&s, ws), ["P4", "P5"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_stopped_retrying_holds_plans_back_for_its_window_only() {
    let clock = Shifted::take().await;
    let s = server().await;
    let ws = "prod-gave-up";
    lock(&s, ws, None, plan_info("P1")).await;
    for _ in 0..2 {
        assert_eq!(try_lock(&s, "LOCK", ws, lock_info("A")).await.0, 423);
    }
    // Retries keep the record fresh: 12 s on it is seen again, so at 35 s from the
    // start (past one window from the first refusals) plans are still kept out.
    clock.ahead(12);
    assert_eq!(try_lock(&s, "LOCK", ws, lock_info("A")).await.0, 423);
    assert_eq!(waiter(&s, ws), Some(("A".into(), 3)));
    clock.ahead(35);
    assert_eq!(try_lock(&s, "LOCK", ws, plan_info("P2")).await.0, 423);
    // It stops retrying: one window after its last try, plans join again.
    clock.ahead(12 + 31);
    lock(&s, ws, None, plan_info("P2")).await;
    assert_eq!(holders(&s, ws), ["P1", "P2"]);
}
