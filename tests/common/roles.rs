//! The fixture both role tables share (admin API and web UI): the operators of every
//! role, unlimited and limited to `dev-*`, and one unfinished drift run per workspace.

use super::TestServer;

/// What a route is aimed at, for the expected outcome (written out here, not taken
/// from the rule under test).
#[derive(Clone, Copy, Debug)]
pub enum Aim {
    Nothing,
    Listing,
    Site,
    Ws(&'static str),
    /// Two workspaces (a move): the route needs the role on both.
    Both(&'static str, &'static str),
}

/// Is `role` with `patterns` expected to be let through a route needing `least`,
/// aimed at `aim`? (The fixture's limited operators are limited to `dev-*`.)
pub fn expected_allowed(role: &str, patterns: Option<&str>, least: &str, aim: Aim) -> bool {
    rank(role) >= rank(least)
        && match aim {
            Aim::Nothing | Aim::Listing => true,
            Aim::Site => patterns.is_none(),
            Aim::Ws(w) => patterns.is_none() || w.starts_with("dev-"),
            Aim::Both(a, b) => {
                patterns.is_none() || (a.starts_with("dev-") && b.starts_with("dev-"))
            }
        }
}

/// Everything a request could change: versions, the fixture's locks (exclusive and
/// shared plan holders, a writer waiting for plans), moves in progress, audit rows,
/// tokens (issued, CI identity, run credentials), runs, operators and their SSO caps,
/// write overrides, freezes, consumers, the resource timeline, the keyring, single
/// sign-on sign-ins and followed sessions. One count per query.
pub const CHANGE_COUNTS: [&str; 29] = [
    "SELECT count(*) FROM versions",
    "SELECT count(*) FROM tf_locks",
    "SELECT count(*) FROM tf_lock_waiters",
    "SELECT count(*) FROM tf_locks WHERE lock_id IN ('L-prod-x', 'L-dev-a')",
    "SELECT count(*) FROM tf_plan_locks",
    "SELECT count(*) FROM tf_moves",
    "SELECT coalesce(max(id), 0) FROM audit",
    "SELECT count(*) FROM tokens",
    "SELECT count(*) FROM tokens WHERE revoked_at IS NOT NULL",
    "SELECT count(*) FROM tf_ci_tokens",
    "SELECT count(*) FROM tf_run_credentials",
    "SELECT count(*) FROM drift_runs",
    "SELECT count(*) FROM operators",
    "SELECT count(*) FROM operator_sso_caps",
    "SELECT count(*) FROM tf_write_overrides",
    "SELECT count(*) FROM tf_freezes",
    "SELECT CAST(coalesce(sum(generation), 0) AS BIGINT) FROM tf_credential_generations",
    "SELECT count(*) FROM tf_consumers",
    "SELECT count(*) FROM tf_token_grants",
    "SELECT count(*) FROM resource_changes",
    "SELECT count(*) FROM resource_summary_heads",
    "SELECT count(*) FROM resource_instance_digests",
    "SELECT count(*) FROM key_generations",
    "SELECT count(*) FROM key_generations WHERE retired_at IS NOT NULL",
    "SELECT count(*) FROM cluster_leases",
    "SELECT CAST(coalesce(sum(heartbeat_at), 0) AS BIGINT) FROM cluster_leases",
    "SELECT count(*) FROM sso_logins",
    "SELECT count(*) FROM sso_sessions",
    "SELECT CAST(coalesce(sum(checked_ms + checking_until), 0) AS BIGINT) FROM sso_sessions",
];

/// [`CHANGE_COUNTS`], read in one statement on `db` (the authorization property reads
/// it thousands of times).
pub fn snapshot_of(db: &stategate::store::sql::Connection) -> Vec<i64> {
    let sql = format!(
        "SELECT {}",
        CHANGE_COUNTS.map(|c| format!("({c})")).join(", ")
    );
    db.query_row(&sql, [], |r| {
        (0..CHANGE_COUNTS.len()).map(|i| r.get(i)).collect()
    })
    .unwrap()
}

/// [`CHANGE_COUNTS`] on `server`'s index.
pub fn snapshot(server: &TestServer) -> Vec<i64> {
    snapshot_of(&server.db())
}

/// (email, role, workspace patterns). Viewers and limited operators come first, so
/// their refusals meet the locks still held.
pub const ROLE_OPERATORS: &[(&str, &str, Option<&str>)] = &[
    ("viewer-dev@x.io", "viewer", Some("dev-*")),
    ("viewer@x.io", "viewer", None),
    ("operator-dev@x.io", "operator", Some("dev-*")),
    ("admin-dev@x.io", "admin", Some("dev-*")),
    ("operator@x.io", "operator", None),
    ("admin@x.io", "admin", None),
];

/// A secret value in the role tables' states: never in a refusal.
pub const SECRET: &str = "hunter2-very-secret";

/// The rank of a role name: an action needing `need` is allowed to `role` when
/// `rank(role) >= rank(need)`.
pub fn rank(role: &str) -> u8 {
    ["viewer", "operator", "admin"]
        .iter()
        .position(|r| *r == role)
        .map(|p| p as u8)
        .unwrap_or_else(|| panic!("unknown role {role}"))
}

/// One unfinished drift check run per workspace (nothing to approve), as the service
/// stores them.
pub fn unfinished_runs(server: &TestServer, workspaces: &[&str]) {
    let conn = server.db();
    for ws in workspaces {
        stategate::drift::outcomes::start_run(
            &conn,
            ws,
            stategate::drift::Kind::Check,
            "test",
            None,
            Some(2),
            Some("lin-1"),
        )
        .unwrap()
        .unwrap();
    }
}

/// Creates every operator of [`ROLE_OPERATORS`]; their tokens, in that order.
pub async fn role_operators(server: &TestServer) -> Vec<String> {
    let mut tokens = Vec::new();
    for (email, role, patterns) in ROLE_OPERATORS {
        let grant = stategate::operator::roles::Grant::parse(role, *patterns).unwrap();
        let token = server
            .app
            .operator
            .admin_write(move |c| {
                stategate::operator::identity::create_operator_with(c, email, &grant, "test")
            })
            .await
            .unwrap();
        tokens.push(token);
    }
    tokens
}
