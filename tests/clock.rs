//! A node sharing a PostgreSQL index whose clock steps after it started (issue 37,
//! finding 4), on a REAL PostgreSQL (`STATEGATE_TEST_POSTGRES_URL`, as in
//! `tests/postgres.rs`). The step is this process's clock shifted through the clock
//! module's test seam, so this file is a test binary of its own: no other test shares
//! the shifted clock.

mod common;

use common::{lock_info, new_postgres_database, state, status, TestServer};
use stategate::config::IndexKind;
use stategate::names::Pattern;
use stategate::tofu::access::Scope;
use stategate::tofu::credentials::{Grant, NewWorkspaceToken};

const HOUR_MS: i64 = 3_600_000;

async fn healthz(s: &TestServer) -> (u16, String) {
    status(reqwest::Client::new().get(format!("{}/healthz", s.base))).await
}

/// Stepped two hours back, the node accepted a token that expired an hour ago until
/// its next clock check; from then on everything that judges expiry is refused (503)
/// and `/healthz` says why, and once the clock is back the node serves again (the
/// expired token refused as before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_steps_refuses_expiry_judgments_until_it_is_back() {
    let Some(url) = new_postgres_database() else {
        return;
    };
    let s = TestServer::start_with(move |c| {
        c.index.kind = IndexKind::Postgres;
        c.index.url = Some(url.into());
    })
    .await;
    for (method, body) in [
        ("LOCK", lock_info("seed")),
        ("POST", state(1, "l", "")),
        ("UNLOCK", lock_info("seed")),
    ] {
        let req = s.tf(method, "prod").query(&[("ID", "seed")]).body(body);
        assert_eq!(status(req).await.0, 200, "{method}");
    }
    let new = NewWorkspaceToken {
        name: "ci".into(),
        grant: Grant {
            patterns: vec![Pattern::parse("prod").unwrap()],
            scope: Scope::Write,
            include_sensitive: false,
        },
        expires_in: Some(-3600),
    };
    let (expired, _) = s.app.tofu.create_token(new, "operator:test").await.unwrap();
    let with_token = || {
        reqwest::Client::new()
            .get(s.url("prod"))
            .basic_auth("stategate", Some(&expired))
    };
    assert_eq!(status(with_token()).await.0, 401, "expired an hour ago");
    assert_eq!(healthz(&s).await.0, 200);

    stategate::tokens::shift_clock_for_tests(-2 * HOUR_MS);
    s.app.tofu.store().check_clock().await.unwrap();
    let (code, body) = healthz(&s).await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("behind PostgreSQL") && body.contains("NTP"),
        "/healthz says why: {body}"
    );
    let (code, body) = status(with_token()).await;
    assert_eq!(code, 503, "the expired token is not judged: {body}");
    assert!(!body.contains(&expired));
    // Every credential and route that judges expiry, not only issued tokens.
    assert_eq!(status(s.tf("GET", "prod")).await.0, 503);
    assert_eq!(
        status(s.tf("LOCK", "prod").body(lock_info("x"))).await.0,
        503
    );
    let admin = reqwest::Client::new()
        .get(format!("{}/api/v1/admin/workspaces", s.base))
        .bearer_auth("sgo_not-a-token");
    assert_eq!(status(admin).await.0, 503);

    stategate::tokens::shift_clock_for_tests(0);
    s.app.tofu.store().check_clock().await.unwrap();
    assert_eq!(healthz(&s).await.0, 200);
    assert_eq!(status(with_token()).await.0, 401, "judged again: expired");
    assert_eq!(status(s.tf("GET", "prod")).await.0, 200);
    let (code, body) = status(s.tf("LOCK", "prod").body(lock_info("y"))).await;
    assert_eq!(code, 200, "the refused LOCK took nothing: {body}");
}
