//! Single sign-on at the edge, in process (the flow against a real provider is
//! integration/test_oidc.py): without `[oidc]` there is no sign-on at all; with it,
//! a bad `[oidc]` stops the server naming the key, an unreachable provider makes
//! sign-on unavailable (503, token logins unaffected), and a callback without a
//! pending sign-in is the one refusal. None of them changes anything.

mod common;

use common::TestServer;
use stategate::config::{Config, OidcConfig};

/// Operators, tokens (sessions among them) and audit rows, as one number.
const COUNTS: &str = "SELECT (SELECT count(*) FROM operators) * 1000000
    + (SELECT count(*) FROM tokens) * 1000 + (SELECT count(*) FROM audit)";

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn get(s: &TestServer, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    let mut req = client().get(format!("{}{path}", s.base));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let csp = r
        .headers()
        .get("content-security-policy")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, csp, r.text().await.unwrap())
}

/// An `[oidc]` whose provider does not answer (nothing listens on port 9 here).
fn unreachable(c: &mut Config) {
    c.public_url = Some("http://127.0.0.1:8080".into());
    let mut oidc: OidcConfig = toml::from_str(
        "issuer_url = \"http://127.0.0.1:9\"\nclient_id = \"sg\"\nclient_secret = \"s3cret\"\n\
         display_name = \"Test IdP\"\n[roles]\n\"dev\" = \"viewer\"\n",
    )
    .unwrap();
    oidc.scopes = vec!["email".into()];
    c.oidc = Some(oidc);
}

#[tokio::test]
async fn without_oidc_there_is_no_single_sign_on() {
    let s = TestServer::start().await;
    let before = s.count(COUNTS);
    let (status, _, body) = get(&s, "/ui/login", &[]).await;
    assert_eq!(status, 200);
    assert!(
        !body.contains("/ui/login/oidc") && !body.contains("Sign in with"),
        "{body}"
    );
    for path in ["/ui/login/oidc", "/ui/login/oidc/callback?state=x&code=y"] {
        let (status, csp, body) = get(&s, path, &[]).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(csp.contains("default-src 'self'"), "{path}: {csp}");
    }
    assert_eq!(s.count(COUNTS), before);
}

#[tokio::test]
async fn an_unreachable_provider_makes_sign_on_unavailable_and_a_stray_callback_is_refused() {
    let s = TestServer::start_with(unreachable).await;
    let before = s.count(COUNTS);
    let (status, _, body) = get(&s, "/ui/login", &[]).await;
    assert_eq!(status, 200);
    assert!(body.contains("Sign in with Test IdP"), "{body}");
    assert!(body.contains("Operator token"), "token logins stay: {body}");
    let (status, _, body) = get(&s, "/ui/login/oidc", &[("Sec-Fetch-Site", "same-origin")]).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("Single sign-on is not available right now"),
        "{body}"
    );
    assert!(!body.contains("s3cret"));
    // From another site's page: the login's cross-site refusal, before anything else.
    let (status, _, body) = get(&s, "/ui/login/oidc", &[("Sec-Fetch-Site", "cross-site")]).await;
    assert_eq!(status, 403, "{body}");
    // A callback nobody started, however it looks: the one refusal.
    for query in [
        "",
        "?state=x&code=y",
        "?code=y",
        "?state=&code=",
        "?state=x&error=access_denied",
    ] {
        let (status, _, body) = get(
            &s,
            &format!("/ui/login/oidc/callback{query}"),
            &[("Cookie", "sg_sso=abc")],
        )
        .await;
        assert_eq!(status, 401, "{query}: {body}");
        assert!(
            body.contains("not a valid operator token or single sign-on"),
            "{query}: {body}"
        );
    }
    assert_eq!(s.count(COUNTS), before, "nothing was made");
}

#[tokio::test]
async fn a_bad_oidc_section_stops_the_server_naming_the_key() {
    // (change, part of the refusal)
    type Edit = fn(&mut Config);
    let table: &[(Edit, &str)] = &[
        (|c| c.public_url = None, "[oidc] needs public_url"),
        (
            |c| c.oidc.as_mut().unwrap().issuer_url = "http://id.example.com".into(),
            "oidc.issuer_url must be https",
        ),
        (
            |c| {
                let roles = &mut c.oidc.as_mut().unwrap().roles;
                roles.insert("dev".into(), toml::Value::String("superuser".into()));
            },
            "oidc.roles.\"dev\": unknown role",
        ),
        (
            |c| c.oidc.as_mut().unwrap().client_secret_file = Some("/nonexistent".into()),
            "set one, not both",
        ),
    ];
    for (edit, want) in table {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config {
            data_dir: dir.path().join("data"),
            dek: Some(common::DEK.into()),
            ..Config::default()
        };
        unreachable(&mut config);
        edit(&mut config);
        let clock = std::sync::Arc::new(stategate::cluster::SystemClock);
        let err = match stategate::server::build_app_with_clock(&config, clock).await {
            Ok(_) => panic!("{want}: the server started"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(want), "{want}: {err}");
        assert!(!err.contains("s3cret"), "{err}");
        assert!(
            !config.data_dir.exists(),
            "{want}: refused before anything was opened"
        );
    }
}
