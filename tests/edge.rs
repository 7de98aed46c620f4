//! What every route meets at the edge, in process on port 0: an oversized request head
//! is refused with 431 before routing (and changes nothing), `/metrics` can require a
//! bearer, every answer that is not a UI page is sandboxed for browsers, and HSTS is
//! sent under TLS. The pass-through's forwarded answers are covered in
//! `passthrough_faults.rs` (scripted upstream) and, in a real browser against real
//! Garage, in `integration/test_ui_origin.py`.

mod common;

use common::{state, status, TestServer};

async fn get(
    s: &TestServer,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .request(method.parse().unwrap(), format!("{}{path}", s.base));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.send().await.unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> Vec<String> {
    r.headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

/// One path of every kind of route: health, metrics, the state API, the cluster API,
/// the admin API, the UI, and the pass-through.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/api/v1/tf/state/prod"),
    ("POST", "/api/v1/tf/state/prod"),
    ("GET", "/v1/clusters/c1/tfstate"),
    ("GET", "/api/v1/admin/workspaces"),
    ("GET", "/ui/"),
    ("POST", "/ui/login"),
    ("GET", "/some-bucket/x.html"),
];

#[tokio::test]
async fn oversized_request_heads_get_431_on_every_route_and_change_nothing() {
    let s = TestServer::start().await;
    let line = "x".repeat(200 * 1024);
    let parts = "y".repeat(15 * 1024);
    for (method, path) in ROUTES {
        // One 200 KB header line.
        let r = get(&s, method, path, &[("x-big", &line)]).await;
        assert_eq!(r.status(), 431, "{method} {path}");
        assert_eq!(header(&r, "content-security-policy"), vec!["sandbox"]);
        let body = r.text().await.unwrap();
        assert!(body.contains("too large"), "{body}");
        assert!(!body.contains("xxxx"), "the header is not echoed");
        // Five lines each under the line limit, over the total together.
        let many: Vec<(&str, &str)> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| (*n, parts.as_str()))
            .collect();
        let r = get(&s, method, path, &many).await;
        assert_eq!(r.status(), 431, "{method} {path}: total");
        // Control: one such line alone is fine.
        let r = get(&s, method, path, &many[..1]).await;
        assert_ne!(r.status(), 431, "{method} {path}: control");
    }
    // A state write with an oversized header stores nothing.
    let (code, _) = status(
        s.tf("POST", "prod")
            .header("x-big", &line)
            .body(state(1, "l-1", "[]")),
    )
    .await;
    assert_eq!(code, 431);
    assert_eq!(s.count("SELECT count(*) FROM versions"), 0);
    let (code, _) = status(s.tf("POST", "prod").body(state(1, "l-1", "[]"))).await;
    assert_eq!(code, 200, "control: the same write without it is stored");
}

#[tokio::test]
async fn metrics_require_the_configured_bearer() {
    let open = TestServer::start().await;
    let r = get(&open, "GET", "/metrics", &[]).await;
    assert_eq!(r.status(), 200, "no token configured: open as before");

    let token = "metrics-scrape-secret";
    let s = TestServer::start_with(|c| c.metrics_token = Some(token.into())).await;
    let (code, _) = status(s.tf("POST", "secret-workspace").body(state(1, "l-1", "[]"))).await;
    assert_eq!(code, 200);
    let wrong_basic = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            "prometheus:nope"
        )
    );
    for auth in [
        None,
        Some("Bearer nope"),
        Some("Bearer "),
        Some("metrics-scrape-secret"),
        Some(wrong_basic.as_str()),
    ] {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", *a)).collect();
        let r = get(&s, "GET", "/metrics", &headers).await;
        assert_eq!(r.status(), 401, "{auth:?}");
        assert_eq!(
            header(&r, "www-authenticate"),
            vec![r#"Bearer realm="stategate metrics""#]
        );
        let body = r.text().await.unwrap();
        assert!(
            !body.contains("stategate_"),
            "{auth:?}: no metric in {body}"
        );
    }
    let r = get(
        &s,
        "GET",
        "/metrics",
        &[("authorization", "Bearer metrics-scrape-secret")],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("stategate_"));
    // The health check stays open: probes carry no credential.
    assert_eq!(get(&s, "GET", "/healthz", &[]).await.status(), 200);
}

#[tokio::test]
async fn the_metrics_token_comes_from_the_environment_too() {
    let mut c = stategate::config::Config::default();
    c.apply_env(|k| (k == "STATEGATE_METRICS_TOKEN").then(|| "from-env".to_string()))
        .unwrap();
    assert_eq!(
        c.metrics_token.as_ref().map(|t| t.expose()),
        Some("from-env")
    );
    assert!(stategate::config::ENV_VARS
        .iter()
        .any(|(var, key)| *var == "STATEGATE_METRICS_TOKEN" && *key == "metrics_token"));
}

#[tokio::test]
async fn answers_that_are_not_ui_pages_are_sandboxed_and_hsts_comes_with_tls() {
    let plain = TestServer::start().await;
    let tls = TestServer::start_with_app(|_| {}, |app| app.tls = true).await;
    for (method, path) in ROUTES {
        for (s, under_tls) in [(&plain, false), (&tls, true)] {
            let r = get(s, method, path, &[]).await;
            let what = format!("{method} {path} (tls {under_tls}): {}", r.status());
            let csp = header(&r, "content-security-policy");
            assert_eq!(csp.len(), 1, "{what}: {csp:?}");
            if path.starts_with("/ui/") {
                assert!(csp[0].contains("script-src 'none'"), "{what}: {csp:?}");
            } else {
                assert_eq!(csp, vec!["sandbox"], "{what}");
            }
            assert_eq!(
                header(&r, "x-content-type-options"),
                vec!["nosniff"],
                "{what}"
            );
            let sts = header(&r, "strict-transport-security");
            if under_tls {
                assert_eq!(sts, vec!["max-age=31536000"], "{what}");
            } else {
                assert!(sts.is_empty(), "{what}: {sts:?}");
            }
        }
    }
}
