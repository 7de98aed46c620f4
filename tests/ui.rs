//! The web UI (`/ui/`) in process on port 0: no session → 303 to login and nothing
//! shown, login with operator tokens only, cookie flags, CSRF on every form (refused
//! forms change nothing), escaping of values from state and LockInfo, rollback and
//! force-unlock audited as the operator, logout and token revocation ending sessions;
//! audited reveals and downloads, the rollback preview, and search across workspaces;
//! drift checks started and kept plans approved through `DriftService` as the operator
//! (CSRF and a typed confirmation first; refusals change nothing), plan text escaped, and
//! a run whose plan text retention deleted saying so.

mod common;

use common::roles::{
    expected_allowed, role_operators, snapshot, unfinished_runs, Aim, ROLE_OPERATORS, SECRET,
};
use common::{state, status, TestServer};
use reqwest::header::HeaderMap;
use stategate::cluster::identity::{self, Role};
use stategate::operator::identity as operators;

const OPS: &str = "ops@example.com";
const ACTOR: &str = "operator:ops@example.com";
const EVIL: &str = "<script>alert(1)</script>";
/// Every session row ever opened (an ended one keeps its row, revoked).
const SESSIONS: &str = "SELECT count(*) FROM tokens WHERE kind = 'session'";
/// Sessions a cookie could still use.
const LIVE_SESSIONS: &str =
    "SELECT count(*) FROM tokens WHERE kind = 'session' AND revoked_at IS NULL";

struct Env {
    server: TestServer,
    token: String,
    http: reqwest::Client,
}

struct Response {
    status: u16,
    headers: HeaderMap,
    body: String,
}

impl Response {
    fn location(&self) -> Option<&str> {
        self.headers.get("location").and_then(|v| v.to_str().ok())
    }

    fn set_cookie(&self) -> Option<&str> {
        self.headers.get("set-cookie").and_then(|v| v.to_str().ok())
    }
}

impl Env {
    async fn start() -> Env {
        Self::start_with_app(|_| {}).await
    }

    async fn start_with_app(adjust_app: impl FnOnce(&mut stategate::http::App)) -> Env {
        Self::start_full(|_| {}, adjust_app).await
    }

    async fn start_with(adjust: impl FnOnce(&mut stategate::config::Config)) -> Env {
        Self::start_full(adjust, |_| {}).await
    }

    async fn start_full(
        adjust: impl FnOnce(&mut stategate::config::Config),
        adjust_app: impl FnOnce(&mut stategate::http::App),
    ) -> Env {
        let server = TestServer::start_with_app(
            |c| {
                c.cluster.state_enc_key = Some(common::DEK.into());
                adjust(c);
            },
            adjust_app,
        )
        .await;
        let token = server
            .app
            .operator
            .admin_write(|c| operators::create_operator(c, OPS, "test"))
            .await
            .unwrap();
        Env {
            server,
            token,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
        }
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        cookie: Option<&str>,
        form: Option<&[(&str, &str)]>,
    ) -> Response {
        self.send_with(method, path, cookie, form, &[]).await
    }

    async fn send_with(
        &self,
        method: &str,
        path: &str,
        cookie: Option<&str>,
        form: Option<&[(&str, &str)]>,
        headers: &[(&str, &str)],
    ) -> Response {
        let mut req = self.http.request(
            method.parse().unwrap(),
            format!("{}{path}", self.server.base),
        );
        if let Some(c) = cookie {
            req = req.header("Cookie", format!("sg_session={c}"));
        }
        if let Some(fields) = form {
            req = req.form(fields);
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let resp = req.send().await.unwrap();
        Response {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: resp.text().await.unwrap(),
        }
    }

    async fn get(&self, path: &str, cookie: &str) -> Response {
        self.send("GET", path, Some(cookie), None).await
    }

    async fn page(&self, path: &str, cookie: &str) -> String {
        let r = self.get(path, cookie).await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        r.body
    }

    async fn post(&self, path: &str, cookie: &str, form: &[(&str, &str)]) -> Response {
        self.send("POST", path, Some(cookie), Some(form)).await
    }

    async fn login_with(&self, token: &str) -> Response {
        self.send("POST", "/ui/login", None, Some(&[("token", token)]))
            .await
    }

    /// Logs in with the operator token; returns the session cookie's value.
    async fn login(&self) -> String {
        let r = self.login_with(&self.token).await;
        assert_eq!((r.status, r.location()), (303, Some("/ui/")), "{}", r.body);
        let cookie = r.set_cookie().expect("a session cookie");
        let value = cookie
            .strip_prefix("sg_session=")
            .and_then(|rest| rest.split(';').next())
            .unwrap();
        value.to_string()
    }

    /// The CSRF token the pages of a session carry.
    async fn csrf(&self, cookie: &str) -> String {
        let body = self.page("/ui/workspaces", cookie).await;
        let at = body.find(r#"name="csrf" value=""#).expect("a csrf field") + 19;
        body[at..].split('"').next().unwrap().to_string()
    }

    async fn write(&self, ws: &str, body: String) {
        let (code, text) = status(self.server.tf("POST", ws).body(body)).await;
        assert_eq!(code, 200, "{text}");
    }

    async fn lock(&self, ws: &str, id: &str, who: &str) {
        let info = serde_json::json!({
            "ID": id, "Operation": "OperationTypeApply", "Info": "", "Who": who,
            "Version": "1.15.0", "Created": "2026-11-30T00:00:00Z", "Path": ""
        });
        let (code, text) = status(self.server.tf("LOCK", ws).body(info.to_string())).await;
        assert_eq!(code, 200, "{text}");
    }

    fn versions(&self, ws: &str) -> i64 {
        self.server.count(&format!(
            "SELECT count(*) FROM versions WHERE scope = 'tf/{ws}'"
        ))
    }

    fn locked(&self, ws: &str) -> bool {
        self.server.count(&format!(
            "SELECT count(*) FROM tf_locks WHERE workspace = '{ws}'"
        )) == 1
    }

    /// `state.revealed` rows of a scope as (actor, payload text).
    fn reveals(&self, scope: &str) -> Vec<(String, String)> {
        let conn = self.server.db();
        let mut stmt = conn
            .prepare(
                "SELECT actor, payload FROM audit WHERE scope = ?1 AND event = 'state.revealed' ORDER BY id",
            )
            .unwrap();
        stmt.query_map([scope], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    fn audit(&self, scope: &str) -> Vec<(String, String)> {
        let conn = self.server.db();
        let mut stmt = conn
            .prepare("SELECT event, actor FROM audit WHERE scope = ?1 ORDER BY id")
            .unwrap();
        stmt.query_map([scope], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }
}

fn with_output(serial: u64, lineage: &str, resources: &str, output: &str) -> String {
    let plain = state(serial, lineage, resources);
    let mut doc: serde_json::Value = serde_json::from_str(&plain).unwrap();
    doc["outputs"] = serde_json::json!({
        "shown": { "value": output, "type": "string" },
        "hidden": { "value": "hunter2-secret", "type": "string", "sensitive": true },
    });
    doc.to_string()
}

fn resource(name: &str, input: &str) -> String {
    format!(
        r#"{{"mode":"managed","type":"terraform_data","name":"{name}","provider":"p","instances":[{{"attributes":{{"input":"{input}"}}}}]}}"#
    )
}

fn assert_security_headers(r: &Response, what: &str) {
    let h = |name: &str| r.headers.get(name).and_then(|v| v.to_str().ok());
    assert!(
        h("content-security-policy").is_some_and(
            |v| v.contains("default-src 'self'") && v.contains("frame-ancestors 'none'")
        ),
        "{what}: CSP"
    );
    assert_eq!(h("x-content-type-options"), Some("nosniff"), "{what}");
    assert_eq!(h("referrer-policy"), Some("same-origin"), "{what}");
    assert_eq!(h("cache-control"), Some("no-store"), "{what}");
}

/// A form's fields.
type Fields = Vec<(&'static str, &'static str)>;

/// Every UI route with a session-only answer, as (method, path, form).
fn private_routes() -> Vec<(&'static str, &'static str, Option<Fields>)> {
    vec![
        ("GET", "/ui", None),
        ("GET", "/ui/", None),
        ("GET", "/ui/workspaces?q=prod", None),
        ("GET", "/ui/workspaces/prod", None),
        ("GET", "/ui/workspaces/prod/versions/1", None),
        ("GET", "/ui/workspaces/prod/versions/1?reveal=1", None),
        (
            "POST",
            "/ui/workspaces/prod/versions/1/reveal",
            Some(vec![]),
        ),
        (
            "POST",
            "/ui/workspaces/prod/versions/1/download",
            Some(vec![]),
        ),
        ("GET", "/ui/workspaces/prod/diff?from=1&to=2", None),
        ("GET", "/ui/workspaces/prod/rollback?to=1", None),
        ("GET", "/ui/search?q=terraform_data", None),
        ("GET", "/ui/audit", None),
        ("GET", "/ui/clusters", None),
        ("GET", "/ui/nope", None),
        ("POST", "/ui/logout", Some(vec![])),
        (
            "POST",
            "/ui/workspaces/prod/rollback",
            Some(vec![("to", "1"), ("confirm", "prod")]),
        ),
        (
            "POST",
            "/ui/workspaces/prod/unlock",
            Some(vec![("confirm", "yes")]),
        ),
        (
            "POST",
            "/ui/workspaces/prod/allow-write",
            Some(vec![("reason", "r"), ("confirm", "yes")]),
        ),
        (
            "POST",
            "/ui/workspaces/prod/freeze",
            Some(vec![("reason", "r"), ("confirm", "yes")]),
        ),
        ("POST", "/ui/workspaces/prod/unfreeze", Some(vec![])),
        ("GET", "/ui/drift", None),
        ("GET", "/ui/drift?workspace=prod", None),
        ("GET", "/ui/drift/1", None),
        ("POST", "/ui/drift/prod/run", Some(vec![])),
        ("POST", "/ui/drift/1/apply", Some(vec![("confirm", "prod")])),
        (
            "POST",
            "/ui/workspace-tokens/000000000000/revoke",
            Some(vec![("workspace", "prod"), ("confirm", "yes")]),
        ),
    ]
}

async fn seeded() -> Env {
    let env = Env::start().await;
    env.write(
        "prod",
        with_output(1, "lineage-secret-1", &resource("a", "one"), "out-one"),
    )
    .await;
    env.write(
        "prod",
        with_output(2, "lineage-secret-1", &resource("a", "two"), "out-two"),
    )
    .await;
    env.lock("prod", "L1", "holder-who@box").await;
    env
}

#[tokio::test]
async fn without_a_session_every_route_redirects_to_login_and_shows_nothing() {
    let env = seeded().await;
    let revoked = env.server.operator_token(OPS).await;
    // A session whose operator token has since been revoked is no session.
    let stale_cookie = {
        let r = env.login_with(&revoked).await;
        assert_eq!(r.status, 303);
        let c = r.set_cookie().unwrap().to_string();
        env.server.revoke_operator_token(&revoked).await;
        c["sg_session=".len()..]
            .split(';')
            .next()
            .unwrap()
            .to_string()
    };
    // A session past its expiry, and one logged out (its cookie replayed).
    let expired_cookie = env.login().await;
    env.server
        .db()
        .execute(
            "UPDATE tokens SET expires_at = 1 WHERE sha256 = ?1",
            [stategate::tokens::hash(expired_cookie.as_bytes())],
        )
        .unwrap();
    let logged_out = env.login().await;
    let csrf = env.csrf(&logged_out).await;
    let r = env
        .post("/ui/logout", &logged_out, &[("csrf", &csrf)])
        .await;
    assert_eq!(r.status, 303);
    for cookie in [
        None,
        Some("sgs_made_up"),
        Some(stale_cookie.as_str()),
        Some(expired_cookie.as_str()),
        Some(logged_out.as_str()),
    ] {
        for (method, path, form) in private_routes() {
            let r = env.send(method, path, cookie, form.as_deref()).await;
            let what = format!("{method} {path} with {cookie:?}");
            assert_eq!(r.status, 303, "{what}: {}", r.body);
            assert_eq!(r.location(), Some("/ui/login"), "{what}");
            assert_security_headers(&r, &what);
            for secret in ["prod", "lineage-secret", "holder-who", "out-one", "hunter2"] {
                assert!(!r.body.contains(secret), "{what} leaks {secret}");
            }
        }
    }
    // Nothing changed or was revealed through any of them.
    assert_eq!(env.versions("prod"), 2);
    assert_eq!(env.server.count("SELECT count(*) FROM drift_runs"), 0);
    assert!(env.reveals("tf/prod").is_empty());
    assert!(env.locked("prod"));
    // The login page and the stylesheet are public.
    let r = env.send("GET", "/ui/login", None, None).await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains("Operator token"));
    assert_security_headers(&r, "login page");
    let r = env.send("GET", "/ui/static/app.css", None, None).await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/css"));
    assert_security_headers(&r, "stylesheet");
}

#[tokio::test]
async fn only_a_live_operator_token_logs_in_and_the_cookie_is_locked_down() {
    let env = seeded().await;
    let revoked = env.server.operator_token(OPS).await;
    env.server.revoke_operator_token(&revoked).await;
    let bearer = env.server.bearer("prod");
    for bad in ["", "sgo_wrong", bearer.as_str(), revoked.as_str()] {
        let r = env.login_with(bad).await;
        assert_eq!(r.status, 401, "{bad}: {}", r.body);
        assert!(r.set_cookie().is_none(), "{bad}: no cookie");
        assert!(r.body.contains("not a valid operator token"), "{bad}");
        assert!(!r.body.contains("prod"), "{bad}: shows nothing");
        assert_security_headers(&r, bad);
    }
    assert_eq!(env.server.count(SESSIONS), 0);

    let r = env.login_with(&env.token).await;
    assert_eq!((r.status, r.location()), (303, Some("/ui/")));
    let cookie = r.set_cookie().unwrap();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/ui", "Max-Age=43200"] {
        assert!(cookie.contains(flag), "{cookie} lacks {flag}");
    }
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
    // Only the hash of the session id is stored.
    let value = &cookie["sg_session=".len()..cookie.find(';').unwrap()];
    let stored = env.server.count(&format!(
        "SELECT count(*) FROM tokens WHERE kind = 'session' AND sha256 = '{}'",
        stategate::tokens::hash(value.as_bytes())
    ));
    assert_eq!(stored, 1);
    assert_eq!(
        env.server.count(&format!(
            "SELECT count(*) FROM tokens WHERE sha256 = '{value}'"
        )),
        0
    );
    // The login page sends a signed-in operator on; the pages name them.
    let r = env.get("/ui/login", value).await;
    assert_eq!((r.status, r.location()), (303, Some("/ui/")));
    assert!(env.page("/ui/", value).await.contains(OPS));
    assert!(env
        .audit("operators")
        .contains(&("ui.login".into(), ACTOR.into())));

    // Under TLS the cookie is Secure too.
    let tls = Env::start_with_app(|app| app.tls = true).await;
    let r = tls.login_with(&tls.token).await;
    assert!(r.set_cookie().unwrap().contains("; Secure"));
}

#[tokio::test]
async fn forms_without_the_sessions_csrf_token_are_refused_and_change_nothing() {
    let env = seeded().await;
    let cookie = env.login().await;
    let csrf = env.csrf(&cookie).await;
    // Another session's token is as wrong as a made-up one.
    let other = env.login().await;
    let other_csrf = env.csrf(&other).await;
    assert_ne!(csrf, other_csrf);
    for token in [
        None,
        Some(""),
        Some("csrf_wrong"),
        Some(other_csrf.as_str()),
    ] {
        let with = |mut fields: Vec<(&'static str, String)>| {
            if let Some(t) = token {
                fields.push(("csrf", t.to_string()));
            }
            fields
        };
        let forms = [
            (
                "/ui/workspaces/prod/unlock",
                with(vec![("confirm", "yes".into()), ("lock_id", "L1".into())]),
            ),
            (
                "/ui/workspaces/prod/rollback",
                with(vec![("to", "1".into()), ("confirm", "prod".into())]),
            ),
            ("/ui/workspaces/prod/versions/1/reveal", with(vec![])),
            ("/ui/workspaces/prod/versions/1/download", with(vec![])),
            (
                "/ui/workspaces/prod/allow-write",
                with(vec![("reason", "r".into()), ("confirm", "yes".into())]),
            ),
            (
                "/ui/workspaces/prod/freeze",
                with(vec![("reason", "r".into()), ("confirm", "yes".into())]),
            ),
            ("/ui/workspaces/prod/unfreeze", with(vec![])),
            ("/ui/drift/prod/run", with(vec![])),
            ("/ui/drift/1/apply", with(vec![("confirm", "prod".into())])),
            (
                "/ui/workspace-tokens/000000000000/revoke",
                with(vec![
                    ("workspace", "prod".into()),
                    ("confirm", "yes".into()),
                ]),
            ),
            ("/ui/logout", with(vec![])),
        ];
        for (path, fields) in forms {
            let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let r = env.post(path, &cookie, &fields).await;
            assert_eq!(r.status, 403, "{path} with {token:?}: {}", r.body);
            assert!(r.body.contains("nothing was changed"), "{path}");
            assert!(!r.body.contains("hunter2"), "{path}: nothing revealed");
            assert!(r.set_cookie().is_none(), "{path}");
            assert_security_headers(&r, path);
        }
    }
    assert_eq!(env.versions("prod"), 2);
    assert!(env.locked("prod"));
    assert!(!env
        .audit("tf/prod")
        .iter()
        .any(|(e, _)| e == "tf.rollback" || e == "tf.lock_forced" || e == "tf.write_allowed"));
    assert!(
        env.reveals("tf/prod").is_empty(),
        "a refused reveal is not one"
    );
    // Another site's page posting the forms, even with this session's own token
    // (the cookie is SameSite=Strict; a browser that sent it anyway says where the
    // form came from): refused before the form is read.
    let before = snapshot(&env.server);
    let host = env.server.base.trim_start_matches("http://").to_string();
    let own = format!("http://{host}");
    for headers in [
        vec![("Origin", "https://evil.example")],
        vec![("Origin", "null")],
        vec![("Origin", "http://127.0.0.1.evil.example")],
        vec![("Sec-Fetch-Site", "cross-site")],
        vec![("Sec-Fetch-Site", "same-site"), ("Origin", own.as_str())],
    ] {
        for (path, fields) in [
            (
                "/ui/workspaces/prod/unlock",
                vec![("confirm", "yes"), ("lock_id", "L1")],
            ),
            (
                "/ui/workspaces/prod/rollback",
                vec![("to", "1"), ("confirm", "prod")],
            ),
            ("/ui/workspaces/prod/versions/1/reveal", vec![]),
            (
                "/ui/workspaces/prod/freeze",
                vec![("reason", "r"), ("confirm", "yes")],
            ),
            ("/ui/drift/prod/run", vec![]),
            ("/ui/logout", vec![]),
        ] {
            let mut form = vec![("csrf", csrf.as_str())];
            form.extend(fields);
            let r = env
                .send_with("POST", path, Some(&cookie), Some(&form), &headers)
                .await;
            assert_eq!(r.status, 403, "{path} with {headers:?}: {}", r.body);
            assert!(r.body.contains("nothing was changed"), "{path}");
            assert!(!r.body.contains("hunter2"), "{path}");
            assert_eq!(snapshot(&env.server), before, "{path} with {headers:?}");
        }
    }
    assert!(env.reveals("tf/prod").is_empty());
    // The same form from this UI's own page goes through.
    let r = env
        .send_with(
            "POST",
            "/ui/workspaces/prod/versions/1/reveal",
            Some(&cookie),
            Some(&[("csrf", csrf.as_str())]),
            &[("Origin", own.as_str()), ("Sec-Fetch-Site", "same-origin")],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    // The session survived the refused logouts.
    assert_eq!(env.get("/ui/", &cookie).await.status, 200);
}

#[tokio::test]
async fn markup_from_lockinfo_lineage_and_outputs_is_shown_escaped() {
    let env = Env::start().await;
    let lineage = "<script>lin</script>";
    env.write("evil", with_output(1, lineage, &resource("a", "x"), EVIL))
        .await;
    env.write(
        "evil",
        with_output(2, lineage, &resource("a", EVIL), "<b>two</b>"),
    )
    .await;
    env.lock("evil", "L<i>", EVIL).await;
    let cookie = env.login().await;
    let pages = [
        "/ui/workspaces",
        "/ui/workspaces?q=%3Cscript%3E",
        "/ui/workspaces/evil",
        "/ui/workspaces/evil/versions/1",
        "/ui/workspaces/evil/versions/1?reveal=1",
        "/ui/workspaces/evil/diff?from=1&to=2",
        "/ui/workspaces/evil/rollback?to=1",
        "/ui/search?q=terraform",
        "/ui/search?q=%3Cscript%3E",
        "/ui/audit",
        "/ui/audit?scope=%3Cscript%3E",
    ];
    for path in pages {
        let body = env.page(path, &cookie).await;
        assert!(!body.contains("<script"), "{path} shows raw markup: {body}");
        assert!(!body.contains("<b>two") && !body.contains("<i>"), "{path}");
    }
    let ws = env.page("/ui/workspaces/evil", &cookie).await;
    assert!(ws.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "Who");
    assert!(ws.contains("&lt;script&gt;lin&lt;/script&gt;"), "lineage");
    let list = env.page("/ui/workspaces", &cookie).await;
    assert!(list.contains("&lt;script&gt;alert(1)"), "Who in the list");
    let diff = env
        .page("/ui/workspaces/evil/diff?from=1&to=2", &cookie)
        .await;
    assert!(
        diff.contains("&lt;b&gt;two&lt;/b&gt;"),
        "output in the diff"
    );
    assert!(
        diff.contains("&lt;script&gt;alert(1)"),
        "attribute in the diff"
    );
    // A refusal that names the holder escapes it too.
    let csrf = env.csrf(&cookie).await;
    let r = env
        .post(
            "/ui/workspaces/evil/rollback",
            &cookie,
            &[("csrf", &csrf), ("to", "1"), ("confirm", "evil")],
        )
        .await;
    assert_eq!(r.status, 423, "{}", r.body);
    assert!(!r.body.contains("<script") && r.body.contains("&lt;script&gt;"));
}

#[tokio::test]
async fn pages_show_versions_masked_content_diffs_and_downloads() {
    let env = seeded().await;
    let cookie = env.login().await;
    let ws = env.page("/ui/workspaces/prod", &cookie).await;
    for text in [
        "holder-who@box",
        "<dd>apply</dd>",
        "Force unlock",
        "lineage-secret-1",
    ] {
        assert!(ws.contains(text), "{text}");
    }
    // Newest first.
    let (v2, v1) = (
        ws.find("/versions/2/download").unwrap(),
        ws.find("/versions/1/download").unwrap(),
    );
    assert!(v2 < v1);
    let shown = env.page("/ui/workspaces/prod/versions/1", &cookie).await;
    assert!(shown.contains("out-one") && shown.contains("(sensitive)"));
    assert!(!shown.contains("hunter2"), "masked by default");
    // The old GET link reveals nothing any more.
    let old_link = env
        .page("/ui/workspaces/prod/versions/1?reveal=1", &cookie)
        .await;
    assert!(!old_link.contains("hunter2"), "a GET never reveals");
    assert!(
        env.reveals("tf/prod").is_empty(),
        "viewing masked is not audited"
    );
    let diff = env
        .page("/ui/workspaces/prod/diff?from=1&to=2", &cookie)
        .await;
    for text in [
        "terraform_data.a",
        "changed",
        "input",
        "one",
        "two",
        "out-two",
    ] {
        assert!(diff.contains(text), "diff lacks {text}");
    }
    // The download is a CSRF-carrying POST and a reveal: audited.
    let csrf = env.csrf(&cookie).await;
    let r = env
        .post(
            "/ui/workspaces/prod/versions/1/download",
            &cookie,
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers["content-disposition"],
        "attachment; filename=\"prod-v1.tfstate\""
    );
    assert!(r.body.contains("hunter2-secret") && r.body.contains("\"serial\":1"));
    assert_eq!(
        env.reveals("tf/prod"),
        [(ACTOR.into(), r#"{"version":1,"via":"ui.download"}"#.into())]
    );
    // A GET of the download (a reload, a bookmark) is sent to the version page.
    let r = env
        .get("/ui/workspaces/prod/versions/1/download", &cookie)
        .await;
    assert_eq!(
        (r.status, r.location()),
        (303, Some("/ui/workspaces/prod/versions/1")),
        "GET download: {}",
        r.body
    );
    assert!(!r.body.contains("hunter2"));
    assert_eq!(env.reveals("tf/prod").len(), 1, "a GET downloads nothing");
    // Bad input is a clear error page, not data.
    for (path, code) in [
        ("/ui/workspaces/prod/versions/x", 400),
        ("/ui/workspaces/prod/versions/9", 404),
        ("/ui/workspaces/.hidden", 400),
        ("/ui/workspaces/nothing", 404),
        ("/ui/workspaces/prod/diff?from=1", 400),
        ("/ui/audit?since=yesterday", 400),
        ("/ui/nope", 404),
    ] {
        let r = env.get(path, &cookie).await;
        assert_eq!(r.status, code, "{path}: {}", r.body);
        assert!(r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html"));
    }
    let clusters = env.page("/ui/clusters", &cookie).await;
    assert!(clusters.contains("No clusters"));
    let filtered = env.page("/ui/workspaces?q=zzz", &cookie).await;
    assert!(filtered.contains("No workspace name contains"));
}

#[tokio::test]
async fn rollback_and_force_unlock_are_confirmed_and_audited_as_the_operator() {
    let env = seeded().await;
    let cookie = env.login().await;
    let csrf = env.csrf(&cookie).await;
    let post = |path: &'static str, fields: Vec<(&'static str, &'static str)>| {
        let mut all = vec![("csrf", csrf.as_str())];
        all.extend(fields);
        let cookie = cookie.clone();
        let env = &env;
        async move { env.post(path, &cookie, &all).await }
    };
    // Refused while locked, naming the holder; nothing written.
    let r = post(
        "/ui/workspaces/prod/rollback",
        vec![("to", "1"), ("confirm", "prod")],
    )
    .await;
    assert_eq!(r.status, 423, "{}", r.body);
    assert!(r.body.contains("holder-who@box"));
    let ws = env.page("/ui/workspaces/prod", &cookie).await;
    assert!(ws.contains("Rollback is refused while the workspace is locked"));
    // Unconfirmed unlock: nothing changes.
    let r = post("/ui/workspaces/prod/unlock", vec![("lock_id", "L1")]).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(env.locked("prod"));
    let r = post(
        "/ui/workspaces/prod/unlock",
        vec![("lock_id", "L1"), ("confirm", "yes")],
    )
    .await;
    assert_eq!(
        (r.status, r.location()),
        (303, Some("/ui/workspaces/prod?unlocked=1")),
        "{}",
        r.body
    );
    assert!(!env.locked("prod"));
    let ws = env.page("/ui/workspaces/prod?unlocked=1", &cookie).await;
    assert!(ws.contains("The lock was released."));
    // A wrong typed name: nothing written.
    for confirm in ["", "Prod", "prod2"] {
        let r = post(
            "/ui/workspaces/prod/rollback",
            vec![("to", "1"), ("confirm", confirm)],
        )
        .await;
        assert_eq!(r.status, 400, "{confirm}");
    }
    assert_eq!(env.versions("prod"), 2);
    let r = post(
        "/ui/workspaces/prod/rollback",
        vec![("to", "1"), ("confirm", "prod")],
    )
    .await;
    assert_eq!(
        (r.status, r.location()),
        (303, Some("/ui/workspaces/prod?rolled_back=3")),
        "{}",
        r.body
    );
    assert_eq!(env.versions("prod"), 3);
    let ws = env.page("/ui/workspaces/prod?rolled_back=3", &cookie).await;
    assert!(ws.contains("the workspace is now at version 3"));
    let audit = env.audit("tf/prod");
    assert!(
        audit.contains(&("tf.lock_forced".into(), ACTOR.into())),
        "{audit:?}"
    );
    assert!(
        audit.contains(&("tf.rollback".into(), ACTOR.into())),
        "{audit:?}"
    );
    let page = env.page("/ui/audit?scope=tf%2Fprod", &cookie).await;
    assert!(page.contains("tf.rollback") && page.contains("tf.lock_forced"));
    assert!(page.contains(ACTOR));
    let only = env.page("/ui/audit?event=tf.rollback", &cookie).await;
    // The rows (the event list above them names every kind in the log).
    let rows = audit_rows(&only);
    assert!(rows.contains("tf.rollback") && !rows.contains("tf.lock_forced"));
}

/// The audit table's body of an audit page ("" when no row matched).
/// The web UI's rollback goes through the same guard as the CLI's and the admin API's:
/// to a plaintext version over an encrypted state the downgrade policy covers, it is
/// refused with what to do, and nothing changes.
#[tokio::test]
async fn a_rollback_the_downgrade_policy_refuses_changes_nothing() {
    let env =
        Env::start_with(|c| c.tofu.refuse_plaintext_after_encrypted = vec!["prod".into()]).await;
    env.write(
        "prod",
        with_output(1, "L", &resource("a", "one"), "out-one"),
    )
    .await;
    // OpenTofu's encrypted envelope (serial and lineage in clear).
    let envelope = r#"{"serial":2,"lineage":"L","meta":{"key_provider.pbkdf2.main":"eyJzYWx0IjoiYWJjIiwiaXRlcmF0aW9ucyI6NjAwMDAwfQ=="},"encrypted_data":"q83vEjRWeJCrze8SNFZ4kA==","encryption_version":"v0"}"#;
    env.write("prod", envelope.to_string()).await;
    let cookie = env.login().await;
    let csrf = env.csrf(&cookie).await;
    let audit = env.audit("tf/prod");
    // The preview warns before the confirmation.
    let preview = env.page("/ui/workspaces/prod/rollback?to=1", &cookie).await;
    assert!(
        preview.contains(r#"id="rollback-refused""#) && preview.contains("allow-write prod"),
        "{preview}"
    );
    let r = env
        .post(
            "/ui/workspaces/prod/rollback",
            &cookie,
            &[("csrf", csrf.as_str()), ("to", "1"), ("confirm", "prod")],
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(
        r.body.contains("nothing was rolled back") && r.body.contains("allow-write prod"),
        "{}",
        r.body
    );
    assert!(!r.body.contains("out-one"), "{}", r.body);
    assert_eq!(env.versions("prod"), 2);
    assert_eq!(env.audit("tf/prod"), audit);
}

fn audit_rows(page: &str) -> &str {
    page.split_once("<tbody>")
        .map_or("", |(_, rows)| rows.split("</tbody>").next().unwrap())
}

#[tokio::test]
async fn audit_filters_read_a_workspace_name_a_prefix_and_hide_logins() {
    let env = seeded().await;
    let cookie = env.login().await;
    // (query, in the rows, not in the rows, elsewhere on the page)
    type Row<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);
    let table: &[Row] = &[
        // A bare workspace name is its scope.
        (
            "scope=prod",
            &["tf.state_written", "tf.lock_acquired"],
            &["ui.login"],
            &[],
        ),
        (
            "scope=tf%2Fprod",
            &["tf.state_written", "tf.lock_acquired"],
            &[],
            &[],
        ),
        // Logins are hidden until asked for (by the box or by their event).
        (
            "",
            &["tf.state_written"],
            &["ui.login"],
            &["Logins (<code>ui.login</code>) are hidden."],
        ),
        ("logins=1", &["ui.login", "tf.state_written"], &[], &[]),
        ("event=ui.login", &["ui.login"], &["tf.state_written"], &[]),
        (
            "scope=operators",
            &["admin.operator_created"],
            &["ui.login"],
            &[],
        ),
        (
            "scope=operators&event=ui.logout",
            &[],
            &[],
            &["No audit rows match."],
        ),
        ("scope=operators&logins=1", &["ui.login", OPS], &[], &[]),
        // Prefixes of a name or of its part after a dot; literal text.
        (
            "event=tf.lock",
            &["tf.lock_acquired"],
            &["tf.state_written"],
            &[],
        ),
        (
            "event=lock",
            &["tf.lock_acquired"],
            &["tf.state_written"],
            &[],
        ),
        (
            "event=state",
            &["tf.state_written"],
            &["tf.lock_acquired"],
            &[],
        ),
        // A word of the name (split on `.` and `_`), in any of its forms.
        (
            "event=written",
            &["tf.state_written"],
            &["tf.lock_acquired"],
            &[],
        ),
        ("event=writes", &["tf.state_written"], &[], &[]),
        ("event=writ", &[], &[], &["No audit rows match."]),
        (
            "event=tf.state_*",
            &[],
            &[],
            &["No event in the log begins with “tf.state_*”"],
        ),
        ("event=tf.%25", &[], &[], &["No audit rows match."]),
        (
            "scope=staging&event=tf.lock",
            &[],
            &[],
            &[
                "was read as <code>tf/staging</code>",
                "finds <code>tf.lock_acquired</code>",
                "Clear the filters",
            ],
        ),
    ];
    for (query, has, lacks, page_has) in table {
        let page = env.page(&format!("/ui/audit?{query}"), &cookie).await;
        let rows = audit_rows(&page);
        for want in *has {
            assert!(rows.contains(want), "{query}: {want} not in {rows}");
        }
        for not in *lacks {
            assert!(!rows.contains(not), "{query}: {not} in {rows}");
        }
        for want in *page_has {
            assert!(page.contains(want), "{query}: {want} not on {page}");
        }
    }
    // The event kinds to choose from, and the details in words with links.
    let page = env.page("/ui/audit?scope=prod", &cookie).await;
    for kind in ["tf.lock_acquired", "tf.state_written", "ui.login"] {
        assert!(
            page.contains(&format!(r#"<option value="{kind}">"#)),
            "{kind}"
        );
    }
    assert!(!audit_rows(&page).contains('{'), "no JSON: {page}");
    assert!(page.contains(r#"<a href="/ui/workspaces/prod"><code>tf/prod</code></a>"#));
    assert!(
        page.contains(r#"<span class="key">serial</span> 2"#),
        "{page}"
    );
}

#[tokio::test]
async fn audit_and_versions_page_through_everything() {
    let env = Env::start().await;
    for serial in 1..=60 {
        env.write(
            "big",
            state(serial, "lin", &resource("a", &serial.to_string())),
        )
        .await;
    }
    let cookie = env.login().await;
    let first = env.page("/ui/workspaces/big", &cookie).await;
    assert!(first.contains("/versions/60/download") && first.contains("/versions/41/download"));
    assert!(!first.contains("/versions/40/download"));
    assert!(first.contains("?page=2"));
    let third = env.page("/ui/workspaces/big?page=3", &cookie).await;
    assert!(third.contains("/versions/20/download") && third.contains("/versions/1/download"));
    assert!(!third.contains("?page=4"), "no older page");
    // 60 writes audited: the first audit page has 50 rows and a link to the rest.
    let audit = env.page("/ui/audit?scope=tf%2Fbig", &cookie).await;
    let older = audit
        .split("href=\"")
        .find_map(|s| {
            s.strip_prefix("/ui/audit?")
                .map(|q| q.split('"').next().unwrap())
        })
        .filter(|q| q.contains("before="));
    let rows = |page: &str| page.matches("<tr>").count() - 1; // minus the header row
    let total = env.audit("tf/big").len();
    assert!(total > 50, "{total}");
    assert_eq!(rows(&audit), 50);
    let older = older.expect("an older page").replace("&amp;", "&");
    let next = env.page(&format!("/ui/audit?{older}"), &cookie).await;
    assert_eq!(rows(&next), total - 50);
}

#[tokio::test]
async fn logout_ends_the_session() {
    let env = seeded().await;
    let cookie = env.login().await;
    let csrf = env.csrf(&cookie).await;
    let r = env.post("/ui/logout", &cookie, &[("csrf", &csrf)]).await;
    assert_eq!((r.status, r.location()), (303, Some("/ui/login")));
    assert!(r.set_cookie().unwrap().contains("Max-Age=0"));
    let r = env.get("/ui/workspaces/prod", &cookie).await;
    assert_eq!((r.status, r.location()), (303, Some("/ui/login")));
    assert!(!r.body.contains("prod"));
    let r = env
        .post(
            "/ui/workspaces/prod/unlock",
            &cookie,
            &[("csrf", &csrf), ("confirm", "yes")],
        )
        .await;
    assert_eq!(r.status, 303);
    assert!(env.locked("prod"));
    assert_eq!(env.server.count(LIVE_SESSIONS), 0);
}

#[tokio::test]
async fn deleted_workspaces_and_cluster_leases_are_shown() {
    let env = seeded().await;
    env.write("gone", state(1, "lin", &resource("a", "x")))
        .await;
    let (code, text) = status(env.server.tf("DELETE", "gone")).await;
    assert_eq!(code, 200, "{text}");
    let cookie = env.login().await;
    let list = env.page("/ui/workspaces", &cookie).await;
    let row = &list[list.find(">gone<").unwrap()..];
    assert!(
        row[..row.find("</tr>").unwrap()].contains("deleted"),
        "{list}"
    );
    let page = env.page("/ui/workspaces/gone", &cookie).await;
    assert!(page.contains("badge deleted"), "{page}");
    // Rolling a deleted workspace back: no diff against a deletion, but it can be confirmed.
    let preview = env.page("/ui/workspaces/gone/rollback?to=1", &cookie).await;
    assert!(preview.contains("version 2 is a deletion"), "{preview}");
    assert!(preview.contains(r#"id="confirm-rollback""#));
    // Search passes over it (its newest version is the deletion).
    let found = env.page("/ui/search?q=terraform_data", &cookie).await;
    assert!(found.contains(r#"href="/ui/workspaces/prod/versions/2#r-terraform_5fdata."#));
    assert!(!found.contains("/ui/workspaces/gone/"), "{found}");

    let admin = env
        .server
        .app
        .operator
        .admin_write(|c| {
            identity::create_org(c, "acme")?;
            let t = identity::create_principal(c, "acme", "a@acme", Role::Admin)?;
            identity::create_cluster(c, "acme", Some("edge"), None)?;
            Ok(t)
        })
        .await
        .unwrap();
    let page = env.page("/ui/clusters", &cookie).await;
    assert!(page.contains("acme") && page.contains("edge") && page.contains("free"));
    let id = env.server.app.operator.clusters().await.unwrap()[0]
        .id
        .clone();
    let (code, text) = status(
        reqwest::Client::new()
            .post(format!("{}/v1/clusters/{id}/lock", env.server.base))
            .bearer_auth(&admin)
            .body(r#"{"operation":"provision","host":"<b>box</b>"}"#),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    let page = env.page("/ui/clusters", &cookie).await;
    assert!(page.contains("a@acme") && page.contains("leased"), "{page}");
    assert!(
        !page.contains("<b>") && page.contains("&lt;b&gt;box"),
        "{page}"
    );
}

#[tokio::test]
async fn revealing_sensitive_values_is_a_csrf_post_audited_once_without_the_values() {
    let env = seeded().await;
    let cookie = env.login().await;
    let csrf = env.csrf(&cookie).await;
    // The version page offers the reveal as a form carrying this session's token.
    let page = env.page("/ui/workspaces/prod/versions/1", &cookie).await;
    assert!(
        page.contains(r#"action="/ui/workspaces/prod/versions/1/reveal""#),
        "{page}"
    );
    assert!(page.contains(&format!(r#"name="csrf" value="{csrf}""#)));
    assert!(!page.contains("hunter2"));
    // A GET of the reveal's URL is sent to the version page and shows nothing.
    let r = env
        .get("/ui/workspaces/prod/versions/1/reveal", &cookie)
        .await;
    assert_eq!(
        (r.status, r.location()),
        (303, Some("/ui/workspaces/prod/versions/1"))
    );
    assert!(!r.body.contains("hunter2"));
    assert!(env.reveals("tf/prod").is_empty());

    // POST-redirect-GET: the POST answers with a one-time ticket in a GET address.
    let r = env
        .post(
            "/ui/workspaces/prod/versions/1/reveal",
            &cookie,
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    let to = r.location().expect("a location").to_string();
    assert!(
        to.starts_with("/ui/workspaces/prod/versions/1?reveal=sgv_") && to.ends_with("#content"),
        "{to}"
    );
    assert!(!r.body.contains("hunter2"));
    let to = to.trim_end_matches("#content");
    // Another session cannot use the ticket (and that uses it up).
    let other = env.login().await;
    let stolen = env.page(to, &other).await;
    assert!(!stolen.contains("hunter2") && stolen.contains("reveal-used"));
    assert!(env.reveals("tf/prod").is_empty(), "nothing revealed");
    // A made-up ticket, and a live ticket of version 1 at version 2's address: masked,
    // nothing revealed (the second uses that ticket up).
    let made_up = env
        .page("/ui/workspaces/prod/versions/1?reveal=sgv_made_up", &cookie)
        .await;
    assert!(!made_up.contains("hunter2") && made_up.contains("reveal-used"));
    // The address a reveal POST of version 1 sends the browser to (a fresh ticket).
    let reveal_address = || async {
        let r = env
            .post(
                "/ui/workspaces/prod/versions/1/reveal",
                &cookie,
                &[("csrf", &csrf)],
            )
            .await;
        r.location()
            .unwrap()
            .trim_end_matches("#content")
            .to_string()
    };
    let ticket = reveal_address().await;
    let elsewhere = ticket.replace("/versions/1?", "/versions/2?");
    let shown = env.page(&elsewhere, &cookie).await;
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(
        !env.page(&ticket, &cookie).await.contains("hunter2"),
        "used up"
    );
    assert!(env.reveals("tf/prod").is_empty(), "nothing revealed");
    let to = reveal_address().await;
    let shown = env.page(&to, &cookie).await;
    assert!(shown.contains("hunter2-secret"), "revealed");
    assert!(shown.contains("Mask sensitive values") && shown.contains("state.revealed"));
    // A reload of that address shows the masked page and reveals nothing again.
    let reloaded = env.page(&to, &cookie).await;
    assert!(!reloaded.contains("hunter2"), "{reloaded}");
    assert!(reloaded.contains("reveal-used") && reloaded.contains("/versions/1/reveal"));
    // Exactly one row, naming the operator and the version, never a value.
    let rows = env.reveals("tf/prod");
    assert_eq!(
        rows,
        [(ACTOR.into(), r#"{"version":1,"via":"ui.view"}"#.into())]
    );
    let all: String = {
        let conn = env.server.db();
        let mut stmt = conn.prepare("SELECT payload FROM audit").unwrap();
        let texts: Vec<String> = stmt
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        texts.join("\n")
    };
    assert!(!all.contains("hunter2"), "no value in any audit row: {all}");
    // The audit page shows it to other operators.
    let audit = env.page("/ui/audit?event=state.revealed", &cookie).await;
    assert!(audit.contains("state.revealed") && audit.contains(ACTOR));

    // A refused reveal (unknown version, bad input) writes nothing.
    for (path, code) in [
        ("/ui/workspaces/prod/versions/9/reveal", 404),
        ("/ui/workspaces/prod/versions/x/reveal", 400),
        ("/ui/workspaces/nothing/versions/1/reveal", 404),
    ] {
        let r = env.post(path, &cookie, &[("csrf", &csrf)]).await;
        assert_eq!(r.status, code, "{path}: {}", r.body);
    }
    assert_eq!(env.reveals("tf/prod").len(), 1);
    assert_eq!(
        env.server
            .count("SELECT count(*) FROM audit WHERE event = 'state.revealed'"),
        1
    );
}

#[tokio::test]
async fn rollback_preview_shows_the_diff_then_the_confirmed_rollback_applies_it() {
    let env = seeded().await;
    let cookie = env.login().await;
    let csrf = env.csrf(&cookie).await;
    // The workspace page's rollback form only leads to the preview (a GET, no CSRF).
    let ws = env.page("/ui/workspaces/prod", &cookie).await;
    let form = &ws[ws.find(r#"id="rollback""#).unwrap()..];
    let form = &form[..form.find("</form>").unwrap()];
    assert!(form.contains(r#"method="get""#) && form.contains("Preview rollback"));

    // Locked: the preview shows what would change and who holds the lock; the
    // confirmation is disabled.
    let before = env.audit("tf/prod").len();
    let preview = env.page("/ui/workspaces/prod/rollback?to=1", &cookie).await;
    for text in [
        "The workspace is at version <strong>2</strong>",
        "terraform_data.a",
        "badge changed",
        "&quot;two&quot;",
        "&quot;one&quot;",
        "out-two",
        "out-one",
        "Rollback is refused while the workspace is locked by",
        "holder-who@box",
    ] {
        assert!(preview.contains(text), "preview lacks {text}: {preview}");
    }
    assert!(!preview.contains("hunter2"), "masked in the preview");
    let confirm = &preview[preview.find(r#"id="confirm-rollback""#).unwrap()..];
    let confirm = &confirm[..confirm.find("</form>").unwrap()];
    assert!(confirm.contains(r#"method="post""#) && confirm.contains(&csrf));
    assert!(confirm.contains(r#"name="from" value="2""#));
    assert!(confirm.contains("disabled"), "{confirm}");
    // The preview changes and audits nothing.
    assert_eq!(env.versions("prod"), 2);
    assert_eq!(env.audit("tf/prod").len(), before);

    // Still refused while locked, naming the holder.
    let fields = [
        ("csrf", csrf.as_str()),
        ("to", "1"),
        ("from", "2"),
        ("confirm", "prod"),
    ];
    let r = env
        .post("/ui/workspaces/prod/rollback", &cookie, &fields)
        .await;
    assert_eq!(r.status, 423, "{}", r.body);
    assert!(r.body.contains("holder-who@box"));
    assert_eq!(env.versions("prod"), 2);

    let (code, text) = status(
        env.server
            .tf("UNLOCK", "prod")
            .body(r#"{"ID":"L1"}"#.to_string()),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    let preview = env.page("/ui/workspaces/prod/rollback?to=1", &cookie).await;
    let confirm = &preview[preview.find(r#"id="confirm-rollback""#).unwrap()..];
    assert!(!confirm[..confirm.find("</form>").unwrap()].contains("disabled"));

    // A write after the preview: the confirmed rollback is refused, nothing written.
    env.write(
        "prod",
        with_output(3, "lineage-secret-1", &resource("a", "three"), "out-3"),
    )
    .await;
    let r = env
        .post("/ui/workspaces/prod/rollback", &cookie, &fields)
        .await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("changed since you looked"), "{}", r.body);
    assert_eq!(env.versions("prod"), 3);
    // Looked again: confirmed against version 3, it applies.
    let preview = env.page("/ui/workspaces/prod/rollback?to=1", &cookie).await;
    assert!(preview.contains("&quot;three&quot;") && preview.contains(r#"name="from" value="3""#));
    let r = env
        .post(
            "/ui/workspaces/prod/rollback",
            &cookie,
            &[
                ("csrf", csrf.as_str()),
                ("to", "1"),
                ("from", "3"),
                ("confirm", "prod"),
            ],
        )
        .await;
    assert_eq!(
        (r.status, r.location()),
        (303, Some("/ui/workspaces/prod?rolled_back=4")),
        "{}",
        r.body
    );
    let audit = env.audit("tf/prod");
    let rollbacks: Vec<_> = audit.iter().filter(|(e, _)| e == "tf.rollback").collect();
    assert_eq!(
        rollbacks,
        [&("tf.rollback".into(), ACTOR.into())],
        "{audit:?}"
    );
    // Bad input is an error page.
    for (path, code) in [
        ("/ui/workspaces/prod/rollback", 400),
        ("/ui/workspaces/prod/rollback?to=0", 400),
        ("/ui/workspaces/prod/rollback?to=99", 404),
        ("/ui/workspaces/nothing/rollback?to=1", 404),
    ] {
        assert_eq!(env.get(path, &cookie).await.status, code, "{path}");
    }
}

/// A state with one resource per (module, type, name).
fn resources_state(serial: u64, list: &[(Option<&str>, &str, &str)]) -> String {
    let resources: Vec<String> = list
        .iter()
        .map(|(module, kind, name)| {
            let mut r = serde_json::json!({
                "mode": "managed", "type": kind, "name": name, "provider": "p",
                "instances": [{"attributes": {"id": name, "password": "hunter2-secret"}}],
            });
            if let Some(m) = module {
                r["module"] = (*m).into();
            }
            r.to_string()
        })
        .collect();
    state(serial, "lin", &resources.join(","))
}

#[tokio::test]
async fn search_finds_resources_by_type_and_name_across_workspaces() {
    let env = Env::start().await;
    env.write(
        "alpha",
        resources_state(
            1,
            &[
                (None, "aws_instance", "web"),
                (Some("module.db"), "aws_db_instance", "main"),
            ],
        ),
    )
    .await;
    env.write("beta", resources_state(1, &[(None, "aws_instance", "api")]))
        .await;
    env.write(
        "beta",
        resources_state(2, &[(None, "aws_instance", "api2")]),
    )
    .await;
    env.write(
        "gamma",
        resources_state(1, &[(None, "<b>evil</b>", "<script>x</script>")]),
    )
    .await;
    let cookie = env.login().await;
    let empty = env.page("/ui/search", &cookie).await;
    assert!(empty.contains("Search resources") && !empty.contains("id=\"results\""));

    // By type: both workspaces, only their newest versions, linked to the version view.
    let by_type = env.page("/ui/search?q=AWS_INSTANCE", &cookie).await;
    for text in [
        "aws_instance.web",
        "aws_instance.api2",
        r#"href="/ui/workspaces/alpha/versions/1#r-aws_5finstance.web""#,
        r#"href="/ui/workspaces/beta/versions/2#r-aws_5finstance.api2""#,
        "2 matches in 3 workspaces searched",
    ] {
        assert!(by_type.contains(text), "{text}: {by_type}");
    }
    assert!(
        !by_type.contains("aws_instance.api<"),
        "only the newest version"
    );
    assert!(
        !by_type.contains("aws_db_instance"),
        "aws_instance is not a substring of it"
    );
    // By module and by name.
    let by_module = env.page("/ui/search?q=module.db", &cookie).await;
    assert!(by_module.contains("module.db.aws_db_instance.main"));
    assert!(by_module.contains("1 match in"));
    let by_name = env.page("/ui/search?q=.web", &cookie).await;
    assert!(by_name.contains("aws_instance.web") && !by_name.contains("api2"));
    // Values are never searched or shown; markup in a type or name is escaped.
    for q in ["hunter2", "password"] {
        let page = env.page(&format!("/ui/search?q={q}"), &cookie).await;
        assert!(page.contains("No resource address contains"), "{q}");
    }
    let evil = env.page("/ui/search?q=evil", &cookie).await;
    assert!(
        !evil.contains("<b>evil") && !evil.contains("<script>x"),
        "{evil}"
    );
    assert!(evil.contains("&lt;b&gt;evil&lt;/b&gt;") && evil.contains("&lt;script&gt;x"));
    let long = "x".repeat(201);
    assert_eq!(
        env.get(&format!("/ui/search?q={long}"), &cookie)
            .await
            .status,
        400
    );
    // Searching reveals nothing: no audit rows.
    assert_eq!(
        env.server
            .count("SELECT count(*) FROM audit WHERE event = 'state.revealed'"),
        0
    );
}

#[tokio::test]
async fn search_stops_at_its_bounds_and_says_so() {
    use stategate::operator::SearchLimits;
    let bounded = |limits: SearchLimits| async move {
        let env = Env::start_with_app(move |app| {
            app.operator = app.operator.clone().with_search_limits(limits);
        })
        .await;
        for ws in ["a1", "a2", "a3"] {
            env.write(ws, resources_state(1, &[(None, "aws_instance", ws)]))
                .await;
        }
        let cookie = env.login().await;
        let page = env.page("/ui/search?q=aws_instance", &cookie).await;
        let hits: Vec<String> = ["a1", "a2", "a3"]
            .iter()
            .filter(|ws| page.contains(&format!("aws_instance.{ws}<")))
            .map(|ws| ws.to_string())
            .collect();
        (page, hits)
    };
    let roomy = SearchLimits::default();
    let (page, hits) = bounded(roomy).await;
    assert_eq!(hits, ["a1", "a2", "a3"]);
    assert!(!page.contains("id=\"truncated\""));

    let (page, hits) = bounded(SearchLimits {
        max_workspaces: 2,
        ..roomy
    })
    .await;
    assert_eq!(hits, ["a1", "a2"], "by name, first two");
    assert!(page.contains("Stopped after 2 workspaces"), "{page}");

    let one = resources_state(1, &[(None, "aws_instance", "a1")]).len() as i64;
    let (page, hits) = bounded(SearchLimits {
        max_bytes: one + one / 2,
        ..roomy
    })
    .await;
    assert_eq!(hits, ["a1"], "the second state would pass the byte bound");
    assert!(
        page.contains("limit of") && page.contains("of state read"),
        "{page}"
    );

    let (page, hits) = bounded(SearchLimits {
        max_hits: 1,
        ..roomy
    })
    .await;
    assert_eq!(hits, ["a1"]);
    assert!(page.contains("Showing the first 1 matches"), "{page}");
}

/// A `tofu` stand-in whose plan fails with markup on stderr.
const MARKUP_TOFU: &str = "#!/bin/sh\necho '<script>alert(1)</script>' >&2\nexit 1\n";

/// The run a drift form redirected to (`/ui/drift/{id}`), once it finished.
async fn finished_run(env: &Env, location: Option<&str>) -> stategate::drift::Run {
    let id: i64 = location
        .and_then(|l| l.strip_prefix("/ui/drift/"))
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("not a run page: {location:?}"));
    for _ in 0..500 {
        let run = env.server.app.drift.run(id).await.unwrap();
        if run.finished_at.is_some() {
            return run;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("drift run {id} never finished");
}

#[tokio::test]
async fn drift_checks_and_approvals_go_through_the_drift_service_as_the_operator() {
    use stategate::drift::{Kind, Outcome};
    use std::os::unix::fs::PermissionsExt;
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("prod");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("main.tf"), "").unwrap();
    std::fs::write(dir.join("input"), "same").unwrap();
    let tofu = common::drift::fake_tofu(&dir).display().to_string();
    let evil_dir = scratch.path().join("evil");
    std::fs::create_dir_all(evil_dir.join(".terraform")).unwrap();
    std::fs::write(evil_dir.join("main.tf"), "").unwrap();
    let evil_tofu = evil_dir.join("evil-tofu");
    std::fs::write(&evil_tofu, MARKUP_TOFU).unwrap();
    std::fs::set_permissions(&evil_tofu, std::fs::Permissions::from_mode(0o755)).unwrap();
    let checks = vec![
        common::drift::check("prod", &dir, &tofu),
        common::drift::check("evil", &evil_dir, &evil_tofu.display().to_string()),
    ];
    let env = Env::start_with(move |c| c.drift = checks).await;
    env.write("prod", state(1, "lineage-1", &resource("a", "one")))
        .await;
    let cookie = env.login().await;
    let csrf = env.csrf(&cookie).await;
    let runs = || env.server.count("SELECT count(*) FROM drift_runs");

    let page = env.page("/ui/drift", &cookie).await;
    assert!(
        page.contains(r#"href="/ui/drift""#),
        "the nav links the page"
    );
    assert!(page.contains("never run") && page.contains("Run check now"));
    assert!(page.contains("No drift runs yet."));
    let ws_page = env.page("/ui/workspaces/prod", &cookie).await;
    assert!(ws_page.contains(r#"id="drift-status""#) && ws_page.contains("never run"));

    // Forms without this session's CSRF token start nothing.
    for token in [None, Some("csrf_wrong")] {
        let mut form = vec![];
        if let Some(t) = token {
            form.push(("csrf", t));
        }
        let r = env.post("/ui/drift/prod/run", &cookie, &form).await;
        assert_eq!(r.status, 403, "{token:?}: {}", r.body);
        assert!(r.body.contains("CSRF"), "{}", r.body);
    }
    assert_eq!(runs(), 0);

    // Run check now: the service's check, triggered by the operator; its page.
    let r = env
        .post("/ui/drift/prod/run", &cookie, &[("csrf", &csrf)])
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    let in_sync = finished_run(&env, r.location()).await;
    assert_eq!(
        (in_sync.outcome, in_sync.trigger.as_str()),
        (Some(Outcome::InSync), ACTOR)
    );
    let shown = env.page(r.location().unwrap(), &cookie).await;
    assert!(
        shown.contains("in_sync") && shown.contains("No changes."),
        "{shown}"
    );
    assert!(!shown.contains(r#"id="approve""#));
    assert!(env
        .page("/ui/workspaces/prod", &cookie)
        .await
        .contains("in_sync"));

    // Markup a child printed is shown as text, in the message and the plan output.
    let r = env
        .post("/ui/drift/evil/run", &cookie, &[("csrf", &csrf)])
        .await;
    let failed = finished_run(&env, r.location()).await;
    assert_eq!(failed.outcome, Some(Outcome::Error));
    let shown = env.page(r.location().unwrap(), &cookie).await;
    assert!(!shown.contains(EVIL), "{shown}");
    assert!(
        shown.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{shown}"
    );
    let listing = env.page("/ui/drift", &cookie).await;
    assert!(!listing.contains(EVIL));

    // Drift: the kept plan can be approved, with the CSRF token and the typed name.
    std::fs::write(dir.join("input"), "changed").unwrap();
    let r = env
        .post("/ui/drift/prod/run", &cookie, &[("csrf", &csrf)])
        .await;
    let drifted = finished_run(&env, r.location()).await;
    assert!(drifted.outcome == Some(Outcome::Drifted) && drifted.approvable);
    let run_page = r.location().unwrap().to_string();
    let shown = env.page(&run_page, &cookie).await;
    assert!(shown.contains(r#"id="approve""#) && shown.contains("Approve and apply"));
    assert!(shown.contains("human text of the saved plan"), "{shown}");
    assert!(shown.contains("0 to add, 1 to change, 0 to destroy"));
    let listing = env.page("/ui/drift?workspace=prod", &cookie).await;
    assert!(listing.contains("drifted") && listing.contains("awaiting approval"));

    let apply = format!("{run_page}/apply");
    let before = runs();
    let approvals = || {
        env.server
            .count("SELECT count(*) FROM audit WHERE event = 'drift.apply_approved'")
    };
    for (token, confirm, want) in [
        (None, "prod", 403),
        (Some("csrf_wrong"), "prod", 403),
        (Some(csrf.as_str()), "", 400),
        (Some(csrf.as_str()), "prod2", 400),
    ] {
        let mut form = vec![("confirm", confirm)];
        if let Some(t) = token {
            form.push(("csrf", t));
        }
        let r = env.post(&apply, &cookie, &form).await;
        assert_eq!(r.status, want, "{token:?} {confirm}: {}", r.body);
        assert!(r.body.contains("nothing was"), "{}", r.body);
    }
    assert_eq!((runs(), approvals()), (before, 0), "nothing was approved");
    assert!(!dir.join("applied").exists());

    let r = env
        .post(&apply, &cookie, &[("csrf", &csrf), ("confirm", "prod")])
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    let applied = finished_run(&env, r.location()).await;
    assert_eq!(applied.kind, Kind::Apply);
    assert_eq!(applied.outcome, Some(Outcome::Applied), "{applied:?}");
    assert_eq!(
        (applied.applies, applied.trigger.as_str()),
        (Some(drifted.id), ACTOR)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("applied")).unwrap(),
        "PLAN-changed",
        "exactly the kept plan was applied"
    );
    assert!(env
        .audit("tf/prod")
        .contains(&("drift.apply_approved".into(), ACTOR.into())));
    let shown = env.page(r.location().unwrap(), &cookie).await;
    assert!(shown.contains("applied") && shown.contains(&format!("check #{}", drifted.id)));
    let shown = env.page(&run_page, &cookie).await;
    assert!(!shown.contains(r#"id="approve""#));
    assert!(shown.contains(&format!("apply run #{}", applied.id)));

    // Approving twice, or a run that did not drift, is refused on the error page.
    let in_sync_apply = format!("/ui/drift/{}/apply", in_sync.id);
    for (path, says) in [
        (apply.as_str(), "already approved"),
        (in_sync_apply.as_str(), "not a drifted check"),
    ] {
        let r = env
            .post(path, &cookie, &[("csrf", &csrf), ("confirm", "prod")])
            .await;
        assert_eq!(r.status, 409, "{path}: {}", r.body);
        assert!(
            r.body.contains(says) && r.body.contains("Error 409"),
            "{}",
            r.body
        );
    }
    assert_eq!(approvals(), 1);

    // A check while another run of the workspace is going: 409, nothing started.
    env.server
        .db()
        .execute(
            "INSERT INTO drift_runs (workspace, kind, trigger, started_at) VALUES ('evil', 'check', 'schedule', '2026-11-30T00:00:00Z')",
            [],
        )
        .unwrap();
    let before = runs();
    let r = env
        .post("/ui/drift/evil/run", &cookie, &[("csrf", &csrf)])
        .await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("still going"), "{}", r.body);
    assert_eq!(runs(), before);
    let listing = env.page("/ui/drift", &cookie).await;
    assert!(listing.contains("badge running"), "{listing}");
    // Bad input on the pages is a clear 400 or 404.
    for (path, want) in [
        ("/ui/drift/abc", 400),
        ("/ui/drift/9999", 404),
        ("/ui/drift?limit=0", 400),
        ("/ui/drift?workspace=..%2f", 400),
    ] {
        assert_eq!(env.get(path, &cookie).await.status, want, "{path}");
    }
    let r = env
        .post("/ui/drift/nope/run", &cookie, &[("csrf", &csrf)])
        .await;
    assert_eq!(r.status, 404, "{}", r.body);
}

#[tokio::test]
async fn the_drift_page_says_how_to_configure_checks_when_there_are_none() {
    let env = Env::start().await;
    let cookie = env.login().await;
    let page = env.page("/ui/drift", &cookie).await;
    assert!(page.contains("No drift checks are configured"), "{page}");
    assert!(page.contains("[[drift]]") && page.contains("Drift checks"));
    assert!(page.contains("No drift runs yet."));
    env.write("prod", state(1, "lineage-1", &resource("a", "one")))
        .await;
    let ws = env.page("/ui/workspaces/prod", &cookie).await;
    assert!(ws.contains(r#"href="/ui/drift""#), "the nav links the page");
    assert!(!ws.contains("drift-status"), "no check, no drift line");
}

#[tokio::test]
async fn a_run_whose_plan_text_was_pruned_says_so() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    std::fs::write(dir.join("main.tf"), "").unwrap();
    std::fs::write(dir.join("input"), "changed").unwrap();
    let tofu = common::drift::fake_tofu(dir).display().to_string();
    let mut prod = common::drift::check("prod", dir, &tofu);
    prod.approve_apply = false;
    let env = Env::start_with(move |c| {
        c.drift = vec![prod];
        c.drift_settings.keep_outputs = 1;
    })
    .await;
    let drift = &env.server.app.drift;
    let old = drift.check_now("prod", "test").await.unwrap();
    let new = drift.check_now("prod", "test").await.unwrap();
    drift.tidy().await.unwrap();
    let cookie = env.login().await;
    let page = env.page(&format!("/ui/drift/{}", old.id), &cookie).await;
    assert!(
        page.contains("plan text pruned by retention at ")
            && page.contains("(it kept only the newest 1 runs per workspace)"),
        "{page}"
    );
    let page = env.page(&format!("/ui/drift/{}", new.id), &cookie).await;
    assert!(page.contains("human text of the saved plan"), "{page}");
}

/// A login as a browser on another site (or a script) would send it.
async fn login_as(env: &Env, token: &str, headers: &[(&str, &str)]) -> Response {
    env.send_with(
        "POST",
        "/ui/login",
        None,
        Some(&[("token", token)]),
        headers,
    )
    .await
}

fn sessions_and_logins(env: &Env) -> (i64, i64) {
    (
        env.server.count(SESSIONS),
        env.server
            .count("SELECT count(*) FROM audit WHERE event = 'ui.login'"),
    )
}

#[tokio::test]
async fn cross_site_wrong_replayed_and_throttled_logins_open_no_session() {
    let env = Env::start_with_app(|app| {
        app.login_guard = stategate::http::login_guard::LoginGuard::new(
            stategate::http::login_guard::Limits {
                per_client_burst: 30,
                ..Default::default()
            },
            None,
        )
    })
    .await;
    let host = env.server.base.trim_start_matches("http://").to_string();
    let own = format!("http://{host}");
    // A token that once logged in and was revoked since: replaying it opens nothing.
    let replayed = env.server.operator_token(OPS).await;
    assert_eq!(login_as(&env, &replayed, &[]).await.status, 303);
    env.server.revoke_operator_token(&replayed).await;
    let before = sessions_and_logins(&env);
    let well_shaped = format!("sgo_{}", "A".repeat(43));
    let long = format!("sgo_{}", "A".repeat(3000));
    let right = env.token.clone();
    // (what, token, headers, status)
    type Row<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, u16);
    let table: Vec<Row> = vec![
        (
            "evil origin",
            &right,
            vec![("Origin", "https://evil.example")],
            403,
        ),
        (
            "cross-site fetch",
            &right,
            vec![("Sec-Fetch-Site", "cross-site")],
            403,
        ),
        (
            "evil origin, cross-site fetch",
            &right,
            vec![
                ("Origin", "https://evil.example"),
                ("Sec-Fetch-Site", "cross-site"),
            ],
            403,
        ),
        (
            "same-site fetch",
            &right,
            vec![("Sec-Fetch-Site", "same-site")],
            403,
        ),
        ("sandboxed document", &right, vec![("Origin", "null")], 403),
        (
            "own host, other port",
            &right,
            vec![("Origin", "http://127.0.0.1:1")],
            403,
        ),
        ("wrong token", &well_shaped, vec![("Origin", &own)], 401),
        ("workspace-style token", "sgp_nope", vec![], 401),
        ("overlong token", &long, vec![], 401),
        ("empty token", "", vec![], 401),
        (
            "replayed revoked token",
            &replayed,
            vec![("Origin", &own)],
            401,
        ),
    ];
    for (what, token, headers, want) in &table {
        let r = login_as(&env, token, headers).await;
        assert_eq!(r.status, *want, "{what}: {}", r.body);
        assert!(r.set_cookie().is_none(), "{what}: no cookie");
        assert!(!r.body.contains(&right), "{what}");
        assert_security_headers(&r, what);
    }
    assert_eq!(sessions_and_logins(&env), before, "nothing opened");

    // Our own page's login (the headers a browser sends) gets in.
    let r = login_as(
        &env,
        &right,
        &[("Origin", &own), ("Sec-Fetch-Site", "same-origin")],
    )
    .await;
    assert_eq!((r.status, r.location()), (303, Some("/ui/")), "{}", r.body);
    assert_eq!(env.server.count(SESSIONS), before.0 + 1);
}

#[tokio::test]
async fn logins_are_throttled_per_client_with_retry_after_and_open_nothing() {
    let env = Env::start().await;
    // 60 wrong tokens at once, as in the report: the first ten are checked, the rest
    // get 429 with Retry-After.
    let wrong = format!("sgo_{}", "B".repeat(43));
    let mut statuses = Vec::new();
    for _ in 0..60 {
        let r = env.login_with(&wrong).await;
        if r.status == 429 {
            let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
            assert!((1..=60).contains(&retry), "{retry}");
            assert!(r.body.contains("Too many login attempts"), "{}", r.body);
            assert_security_headers(&r, "throttled");
        }
        statuses.push(r.status);
    }
    assert_eq!(statuses.iter().filter(|s| **s == 401).count(), 10);
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 50);
    // Throttled, even the right token opens nothing.
    let r = env.login_with(&env.token).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.set_cookie().is_none());
    assert_eq!(sessions_and_logins(&env), (0, 0));
}

#[tokio::test]
async fn all_clients_together_are_throttled_too() {
    let env = Env::start_with_app(|app| {
        app.login_guard = stategate::http::login_guard::LoginGuard::new(
            stategate::http::login_guard::Limits {
                global_burst: 3,
                global_every: std::time::Duration::from_secs(60),
                ..Default::default()
            },
            None,
        )
    })
    .await;
    for _ in 0..3 {
        assert_eq!(env.login_with("sgo_wrong").await.status, 401);
    }
    let r = env.login_with(&env.token).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.headers["retry-after"], "60");
    assert_eq!(sessions_and_logins(&env), (0, 0));
}

#[tokio::test]
async fn an_obviously_bad_token_is_refused_without_waiting_for_the_writer() {
    let env = Env::start().await;
    // The single SQLite writer is busy for three seconds.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let app = env.server.app.clone();
    let busy = tokio::spawn(async move {
        app.operator
            .admin_write(move |_| {
                let _ = started_tx.send(());
                std::thread::sleep(std::time::Duration::from_secs(3));
                Ok(())
            })
            .await
    });
    started_rx.await.unwrap();
    let t = std::time::Instant::now();
    for bad in ["sgo_wrong", "sgp_x", "", &"sgo_x".repeat(500)] {
        assert_eq!(env.login_with(bad).await.status, 401, "{} bytes", bad.len());
    }
    assert!(
        t.elapsed() < std::time::Duration::from_secs(2),
        "answered without the writer: {:?}",
        t.elapsed()
    );
    // Control: a well-shaped token is looked up by the writer, so it waits for it.
    let r = env.login_with(&format!("sgo_{}", "C".repeat(43))).await;
    assert_eq!(r.status, 401);
    assert!(
        t.elapsed() >= std::time::Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    busy.await.unwrap().unwrap();
}

#[tokio::test]
async fn login_returns_to_the_ui_page_asked_for_and_nowhere_else() {
    let env = seeded().await;
    // Asked for a page without a session: sent to login, the page remembered.
    let r = env
        .send("GET", "/ui/workspaces/prod/diff?from=1&to=2", None, None)
        .await;
    assert_eq!((r.status, r.location()), (303, Some("/ui/login")));
    let remembered = r.set_cookie().expect("the page is remembered").to_string();
    for flag in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/ui/login",
        "Max-Age=600",
    ] {
        assert!(remembered.contains(flag), "{remembered} lacks {flag}");
    }
    let value = remembered.split(';').next().unwrap().to_string();
    assert_eq!(value, "sg_return=/ui/workspaces/prod/diff?from=1&to=2");
    let r = env
        .send_with(
            "POST",
            "/ui/login",
            None,
            Some(&[("token", &env.token)]),
            &[("Cookie", &value)],
        )
        .await;
    assert_eq!(
        (r.status, r.location()),
        (303, Some("/ui/workspaces/prod/diff?from=1&to=2"))
    );
    let cookies: Vec<_> = r
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert!(
        cookies.iter().any(|c| c.starts_with("sg_session=")),
        "{cookies:?}"
    );
    assert!(
        cookies
            .iter()
            .any(|c| c.starts_with("sg_return=;") && c.contains("Max-Age=0")),
        "the remembered page is forgotten: {cookies:?}"
    );

    // A form target is not remembered, and a planted cookie naming anything but a UI
    // page is not followed.
    let r = env
        .send("POST", "/ui/workspaces/prod/unlock", None, Some(&[]))
        .await;
    assert_eq!(r.location(), Some("/ui/login"));
    assert!(r.set_cookie().is_none());
    for planted in [
        "sg_return=https://evil.example/",
        "sg_return=//evil.example/ui/",
        "sg_return=/ui//evil.example",
        "sg_return=/api/v1/admin/workspaces",
        "sg_return=/ui/logout",
    ] {
        let r = env
            .send_with(
                "POST",
                "/ui/login",
                None,
                Some(&[("token", &env.token)]),
                &[("Cookie", planted)],
            )
            .await;
        assert_eq!((r.status, r.location()), (303, Some("/ui/")), "{planted}");
    }
}

/// At serial `i64::MAX` no fresh serial is left: the preview says the rollback would be
/// refused (instead of promising a wrapped serial) and disables it; posted anyway, it
/// is a 409 and nothing is written.
#[tokio::test]
async fn a_rollback_with_no_serial_left_is_refused_in_the_preview_and_on_post() {
    let env = Env::start().await;
    env.write("huge", with_output(1, "lin", &resource("a", "one"), "o1"))
        .await;
    let top = with_output(1, "lin", &resource("a", "two"), "o2")
        .replace("\"serial\":1,", &format!("\"serial\":{},", i64::MAX));
    assert!(top.contains(&i64::MAX.to_string()));
    env.write("huge", top).await;
    let cookie = env.login().await;
    let csrf = env.csrf(&cookie).await;
    let preview = env.page("/ui/workspaces/huge/rollback?to=1", &cookie).await;
    assert!(
        preview.contains("This rollback would be refused"),
        "{preview}"
    );
    assert!(preview.contains("9223372036854775807"), "{preview}");
    assert!(!preview.contains("-9223372036854775808"), "{preview}");
    let confirm = &preview[preview.find(r#"id="confirm-rollback""#).unwrap()..];
    assert!(confirm[..confirm.find("</form>").unwrap()].contains("disabled"));
    let r = env
        .post(
            "/ui/workspaces/huge/rollback",
            &cookie,
            &[
                ("csrf", csrf.as_str()),
                ("to", "1"),
                ("from", "2"),
                ("confirm", "huge"),
            ],
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("largest stategate can store"), "{}", r.body);
    assert_eq!(env.versions("huge"), 2);
}

#[tokio::test]
async fn allowing_one_refused_write_is_confirmed_and_audited_as_the_operator() {
    let env = seeded().await;
    let cookie = env.login().await;
    let csrf = env.csrf(&cookie).await;
    let ws = env.page("/ui/workspaces/prod", &cookie).await;
    assert!(
        ws.contains("Allow one write"),
        "the form is on the workspace page"
    );
    let post = |fields: Vec<(&'static str, &'static str)>| {
        let mut all = vec![("csrf", csrf.as_str())];
        all.extend(fields);
        let cookie = cookie.clone();
        let env = &env;
        async move {
            env.post("/ui/workspaces/prod/allow-write", &cookie, &all)
                .await
        }
    };
    // Unconfirmed, no reason, bad minutes: 400 and nothing granted.
    for fields in [
        vec![("reason", "adopt")],
        vec![("reason", ""), ("confirm", "yes")],
        vec![("reason", "adopt"), ("minutes", "0"), ("confirm", "yes")],
        vec![("reason", "adopt"), ("minutes", "-5"), ("confirm", "yes")],
        vec![("reason", "adopt"), ("minutes", "x"), ("confirm", "yes")],
    ] {
        let r = post(fields.clone()).await;
        assert_eq!(r.status, 400, "{fields:?}: {}", r.body);
    }
    assert!(!env
        .audit("tf/prod")
        .iter()
        .any(|(e, _)| e == "tf.write_allowed"));
    let r = post(vec![
        ("reason", "adopt"),
        ("minutes", "3"),
        ("confirm", "yes"),
    ])
    .await;
    assert_eq!(
        (r.status, r.location()),
        (303, Some("/ui/workspaces/prod?write_allowed=1")),
        "{}",
        r.body
    );
    let page = env
        .page("/ui/workspaces/prod?write_allowed=1", &cookie)
        .await;
    assert!(page.contains("allowed once"));
    assert!(env
        .audit("tf/prod")
        .contains(&("tf.write_allowed".into(), ACTOR.into())));
}

// ---- Roles: role × every UI page and form ----

/// One session per operator of [`ROLE_OPERATORS`]: (email, role, patterns, cookie, csrf).
type RoleSession = (
    &'static str,
    &'static str,
    Option<&'static str>,
    String,
    String,
);

async fn role_env() -> (Env, Vec<RoleSession>) {
    let env = Env::start().await;
    for ws in ["prod-x", "dev-a"] {
        for n in 1..=2 {
            let input = format!("{SECRET}-{n}");
            env.write(ws, state(n, "lin-1", &resource("one", &input)))
                .await;
        }
        env.lock(ws, &format!("L-{ws}"), "ci@runner").await;
    }
    unfinished_runs(&env.server, &["prod-x", "dev-a"]);
    let mut sessions = Vec::new();
    let tokens = role_operators(&env.server).await;
    for ((email, role, patterns), token) in ROLE_OPERATORS.iter().zip(tokens) {
        let r = env.login_with(&token).await;
        assert_eq!(r.status, 303, "{}", r.body);
        let cookie = r
            .set_cookie()
            .and_then(|c| c.strip_prefix("sg_session="))
            .and_then(|rest| rest.split(';').next())
            .unwrap()
            .to_string();
        let csrf = env.csrf(&cookie).await;
        sessions.push((*email, *role, *patterns, cookie, csrf));
    }
    (env, sessions)
}

#[tokio::test]
async fn every_ui_page_and_form_by_role_refuses_identically_and_changes_nothing() {
    let (env, sessions) = role_env().await;
    // (method, path, form fields besides csrf, least role, aim)
    type Route = (
        &'static str,
        String,
        Vec<(&'static str, String)>,
        &'static str,
        Aim,
    );
    let mut routes: Vec<Route> = vec![
        ("GET", "/ui/".into(), vec![], "viewer", Aim::Listing),
        (
            "GET",
            "/ui/workspaces".into(),
            vec![],
            "viewer",
            Aim::Listing,
        ),
        ("GET", "/ui/audit".into(), vec![], "viewer", Aim::Listing),
        (
            "GET",
            "/ui/search?q=terraform_data".into(),
            vec![],
            "viewer",
            Aim::Listing,
        ),
        ("GET", "/ui/drift".into(), vec![], "viewer", Aim::Listing),
        ("GET", "/ui/clusters".into(), vec![], "viewer", Aim::Site),
        (
            "POST",
            "/ui/workspace-tokens/000000000000/revoke".into(),
            vec![("workspace", "prod-x".into()), ("confirm", "yes".into())],
            "admin",
            Aim::Site,
        ),
        (
            "GET",
            "/ui/workspaces/prod-nope".into(),
            vec![],
            "viewer",
            Aim::Ws("prod-nope"),
        ),
    ];
    for (ws, run) in [("prod-x", 1), ("dev-a", 2)] {
        let w = |p: &str| format!("/ui/workspaces/{ws}{p}");
        routes.extend([
            ("GET", w(""), vec![], "viewer", Aim::Ws(ws)),
            ("GET", w("/versions/1"), vec![], "viewer", Aim::Ws(ws)),
            (
                "POST",
                w("/versions/1/reveal"),
                vec![],
                "admin",
                Aim::Ws(ws),
            ),
            (
                "POST",
                w("/versions/1/download"),
                vec![],
                "admin",
                Aim::Ws(ws),
            ),
            ("GET", w("/diff?from=1&to=2"), vec![], "viewer", Aim::Ws(ws)),
            ("GET", w("/rollback?to=1"), vec![], "viewer", Aim::Ws(ws)),
            (
                "POST",
                w("/rollback"),
                vec![("to", "1".into()), ("confirm", ws.into())],
                "operator",
                Aim::Ws(ws),
            ),
            (
                "POST",
                w("/unlock"),
                vec![("confirm", "yes".into())],
                "operator",
                Aim::Ws(ws),
            ),
            (
                "POST",
                w("/allow-write"),
                vec![("reason", "adopt".into()), ("confirm", "yes".into())],
                "operator",
                Aim::Ws(ws),
            ),
            (
                "POST",
                w("/freeze"),
                vec![("reason", "window".into()), ("confirm", "yes".into())],
                "operator",
                Aim::Ws(ws),
            ),
            ("POST", w("/unfreeze"), vec![], "operator", Aim::Ws(ws)),
            (
                "GET",
                format!("/ui/drift?workspace={ws}"),
                vec![],
                "viewer",
                Aim::Ws(ws),
            ),
            (
                "GET",
                format!("/ui/drift/{run}"),
                vec![],
                "viewer",
                Aim::Ws(ws),
            ),
            (
                "POST",
                format!("/ui/drift/{ws}/run"),
                vec![],
                "operator",
                Aim::Ws(ws),
            ),
            (
                "POST",
                format!("/ui/drift/{run}/apply"),
                vec![("confirm", ws.into())],
                "operator",
                Aim::Ws(ws),
            ),
        ]);
    }
    let (mut refused, mut allowed) = (0, 0);
    for (email, role, patterns, cookie, csrf) in &sessions {
        let mut bodies = std::collections::BTreeSet::new();
        for (method, path, fields, least, aim) in &routes {
            let mut form: Vec<(&str, &str)> = vec![("csrf", csrf.as_str())];
            form.extend(fields.iter().map(|(k, v)| (*k, v.as_str())));
            let before = snapshot(&env.server);
            let form = (*method == "POST").then_some(form.as_slice());
            let r = env.send(method, path, Some(cookie), form).await;
            let what = format!("{email} ({role} {patterns:?}) {method} {path}");
            if expected_allowed(role, *patterns, least, *aim) {
                allowed += 1;
                assert!(
                    r.status != 403 && r.location() != Some("/ui/login"),
                    "{what}: allowed, got {} {}",
                    r.status,
                    r.body
                );
            } else {
                refused += 1;
                assert_eq!(r.status, 403, "{what}: {}", r.body);
                assert!(r.body.contains("not permitted"), "{what}: {}", r.body);
                assert!(
                    !r.body.contains(SECRET) && !r.body.contains("L-prod-x"),
                    "{what}"
                );
                assert_eq!(
                    snapshot(&env.server),
                    before,
                    "{what}: a refusal changed something"
                );
                bodies.insert(r.body);
            }
        }
        assert!(bodies.len() <= 1, "{email}: refusals differ: {bodies:#?}");
    }
    assert!(
        refused > 50 && allowed > 50,
        "{refused} refused, {allowed} allowed"
    );
    let conn = env.server.db();
    let forced: Vec<(String, String)> = conn
        .prepare("SELECT scope, actor FROM audit WHERE event = 'tf.lock_forced' ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        forced,
        [
            (
                "tf/dev-a".to_string(),
                "operator:operator-dev@x.io".to_string()
            ),
            ("tf/prod-x".into(), "operator:operator@x.io".into()),
        ]
    );
}

#[tokio::test]
async fn pages_offer_only_what_the_role_allows_and_show_it() {
    let (env, sessions) = role_env().await;
    let cookie = |email: &str| sessions.iter().find(|s| s.0 == email).unwrap().3.clone();
    // A viewer: no reveal, download, rollback, unlock or drift buttons; role in the header.
    let viewer = cookie("viewer@x.io");
    let page = env.page("/ui/workspaces/dev-a", &viewer).await;
    assert!(page.contains("viewer"), "{page}");
    for offered in [
        "/download",
        "/unlock",
        "/rollback",
        "Force unlock",
        "/freeze",
    ] {
        assert!(!page.contains(offered), "viewer offered {offered}");
    }
    let page = env.page("/ui/workspaces/dev-a/versions/1", &viewer).await;
    assert!(
        !page.contains("/reveal") && !page.contains("/download"),
        "{page}"
    );
    let page = env
        .page("/ui/workspaces/dev-a/rollback?to=1", &viewer)
        .await;
    assert!(!page.contains("confirm-rollback"), "{page}");
    let page = env.page("/ui/drift/2", &viewer).await;
    assert!(!page.contains("/ui/drift/2/apply"), "{page}");
    // An operator: rollback and unlock, no reveal.
    let operator = cookie("operator@x.io");
    let page = env.page("/ui/workspaces/dev-a", &operator).await;
    assert!(
        page.contains("/unlock") && page.contains("/rollback"),
        "{page}"
    );
    assert!(!page.contains("/download"), "{page}");
    assert!(page.contains("/ui/workspaces/dev-a/freeze"), "{page}");
    // The freeze card: set with its reason (escaped), shown to everyone, lifted.
    let csrf = &sessions.iter().find(|s| s.0 == "operator@x.io").unwrap().4;
    let r = env
        .post(
            "/ui/workspaces/dev-a/freeze",
            &operator,
            &[
                ("csrf", csrf),
                ("reason", "<b>incident</b>"),
                ("for", "2h"),
                ("confirm", "yes"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    let page = env.page("/ui/workspaces/dev-a", &viewer).await;
    assert!(
        page.contains("FROZEN") && page.contains("&lt;b&gt;incident&lt;/b&gt;"),
        "{page}"
    );
    assert!(
        !page.contains("<b>incident") && !page.contains("/unfreeze"),
        "{page}"
    );
    let page = env.page("/ui/workspaces/dev-a", &operator).await;
    assert!(page.contains("/ui/workspaces/dev-a/unfreeze"), "{page}");
    let r = env
        .post(
            "/ui/workspaces/dev-a/unfreeze",
            &operator,
            &[("csrf", csrf)],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(!env
        .page("/ui/workspaces/dev-a", &viewer)
        .await
        .contains("FROZEN"));
    // An admin: everything.
    let admin = cookie("admin@x.io");
    let page = env.page("/ui/workspaces/dev-a/versions/1", &admin).await;
    assert!(
        page.contains("/reveal") && page.contains("/download"),
        "{page}"
    );
    // Limited to dev-*: the header says so, no clusters link, prod-x listed nowhere.
    let limited = cookie("admin-dev@x.io");
    let page = env.page("/ui/workspaces", &limited).await;
    assert!(page.contains("admin (dev-*)"), "{page}");
    assert!(!page.contains("/ui/clusters"), "{page}");
    for path in [
        "/ui/workspaces",
        "/ui/search?q=terraform_data",
        "/ui/audit",
        "/ui/drift",
    ] {
        let page = env.page(path, &limited).await;
        assert!(!page.contains("prod-x"), "{path}: {page}");
        assert!(page.contains("dev-a"), "{path}: {page}");
    }
    // Naming the other workspace bare, by prefix or with logins shown finds nothing of it.
    for path in [
        "/ui/audit?scope=prod-x",
        "/ui/audit?scope=prod-x&logins=1",
        "/ui/audit?scope=tf%2Fprod-x&event=tf",
        "/ui/audit?event=tf.state",
    ] {
        let page = env.page(path, &limited).await;
        assert!(!audit_rows(&page).contains("prod-x"), "{path}: {page}");
    }
    let page = env.page("/ui/workspaces", &viewer).await;
    assert!(
        page.contains("prod-x") && page.contains("/ui/clusters"),
        "{page}"
    );
    // A changed role holds at once for an open session, both ways.
    let set = |role: &'static str| {
        let grant = stategate::operator::roles::Grant::parse(role, None).unwrap();
        env.server
            .app
            .operator
            .admin_write(move |c| operators::set_operator_grant(c, "viewer@x.io", &grant, "test"))
    };
    set("operator").await.unwrap();
    let page = env.page("/ui/workspaces/dev-a", &viewer).await;
    assert!(
        page.contains("/unlock") && page.contains("operator"),
        "{page}"
    );
    set("viewer").await.unwrap();
    let csrf = &sessions.iter().find(|s| s.0 == "viewer@x.io").unwrap().4;
    let r = env
        .post(
            "/ui/workspaces/dev-a/unlock",
            &viewer,
            &[("csrf", csrf), ("confirm", "yes")],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(env.locked("dev-a"));
}

/// A workspace token to issue: `name`, one `pattern`, `scope`, no expiry.
fn new_token(
    name: &str,
    pattern: &str,
    scope: stategate::tofu::access::Scope,
) -> stategate::tofu::credentials::NewWorkspaceToken {
    stategate::tofu::credentials::NewWorkspaceToken {
        name: name.into(),
        grant: stategate::tofu::credentials::Grant {
            patterns: vec![stategate::names::Pattern::parse(pattern).unwrap()],
            scope,
            include_sensitive: false,
        },
        expires_in: None,
    }
}

/// The workspace page's token card (admin): the live tokens covering the workspace,
/// each revoked by a confirmed POST carrying the CSRF token (the same call as the CLI's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_card_lists_and_revokes_workspace_tokens() {
    use stategate::tofu::access::Scope;
    let env = Env::start().await;
    env.write("prod", common::state(1, "lin", "")).await;
    let new = |name: &str, pattern: &str| new_token(name, pattern, Scope::Read);
    let tofu = &env.server.app.tofu;
    let (secret, ci) = tofu
        .create_token(new("ci-prod", "prod*"), "t")
        .await
        .unwrap();
    tofu.create_token(new("ci-dev", "dev-*"), "t")
        .await
        .unwrap();
    let cookie = env.login().await;
    let csrf = env.csrf(&cookie).await;
    let page = env.page("/ui/workspaces/prod", &cookie).await;
    assert!(
        page.contains("Workspace tokens") && page.contains("ci-prod"),
        "{page}"
    );
    assert!(
        !page.contains("ci-dev"),
        "a token for other workspaces is not shown"
    );
    assert!(!page.contains(&secret));
    let path = format!("/ui/workspace-tokens/{}/revoke", ci.id);
    // Without the confirmation or the CSRF token: refused, still live.
    let unconfirmed = env
        .post(&path, &cookie, &[("csrf", &csrf), ("workspace", "prod")])
        .await;
    assert_eq!(unconfirmed.status, 400, "{}", unconfirmed.body);
    let forged = env
        .post(&path, &cookie, &[("workspace", "prod"), ("confirm", "yes")])
        .await;
    assert_ne!(forged.status, 303);
    let url = env.server.url("prod");
    let get = || {
        reqwest::Client::new()
            .get(&url)
            .basic_auth("x", Some(&secret))
    };
    assert_eq!(status(get()).await.0, 200);
    let done = env
        .post(
            &path,
            &cookie,
            &[("csrf", &csrf), ("workspace", "prod"), ("confirm", "yes")],
        )
        .await;
    assert_eq!(
        (done.status, done.location()),
        (303, Some("/ui/workspaces/prod?token_revoked=1"))
    );
    assert_eq!(status(get()).await.0, 401);
    let page = env.page("/ui/workspaces/prod", &cookie).await;
    assert!(!page.contains("ci-prod"), "a revoked token leaves the card");
}

/// The tokens page (admin): every issued token, live ones first and revoked ones
/// apart, each live one revoked from there by a confirmed POST that returns to it; the
/// keys page: the key service and each generation with what it seals. Both linked from
/// the header for an admin only (who may read them: the authorization property test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokens_and_keys_pages_show_what_the_cli_does() {
    use stategate::tofu::access::Scope;
    let env = Env::start().await;
    env.write("prod", common::state(1, "lin", "")).await;
    let new = |name: &str, pattern: &str| new_token(name, pattern, Scope::Write);
    let tofu = &env.server.app.tofu;
    let (secret, ci) = tofu
        .create_token(new("ci-prod", "prod*"), "t")
        .await
        .unwrap();
    let (_, old) = tofu
        .create_token(new("ci-old", "dev-*"), "t")
        .await
        .unwrap();
    tofu.revoke_token(&old.id, "t").await.unwrap();
    let cookie = env.login().await;
    let csrf = env.csrf(&cookie).await;

    let home = env.page("/ui/", &cookie).await;
    assert!(
        home.contains(r#"href="/ui/workspace-tokens""#) && home.contains(r#"href="/ui/keys""#),
        "{home}"
    );
    let page = env.page("/ui/workspace-tokens", &cookie).await;
    let (live, ended) = page.split_once("Revoked or expired").expect("two sections");
    assert!(live.contains("ci-prod") && live.contains("prod*"), "{page}");
    assert!(
        ended.contains("ci-old") && ended.contains("revoked"),
        "{page}"
    );
    assert!(!page.contains(&secret));
    // From the tokens page too: without the confirmation, or without the CSRF token,
    // nothing is revoked.
    let path = format!("/ui/workspace-tokens/{}/revoke", ci.id);
    let unconfirmed = env.post(&path, &cookie, &[("csrf", &csrf)]).await;
    assert_eq!(unconfirmed.status, 400, "{}", unconfirmed.body);
    let forged = env.post(&path, &cookie, &[("confirm", "yes")]).await;
    assert_ne!(forged.status, 303, "{}", forged.body);
    let url = env.server.url("prod");
    let (code, _) = status(
        reqwest::Client::new()
            .get(&url)
            .basic_auth("x", Some(&secret)),
    )
    .await;
    assert_eq!(code, 200, "still live");
    // Revoked from the tokens page: back to it, and the credential is refused.
    let done = env
        .post(&path, &cookie, &[("csrf", &csrf), ("confirm", "yes")])
        .await;
    assert_eq!(
        (done.status, done.location()),
        (303, Some("/ui/workspace-tokens?token_revoked=1"))
    );
    let (code, _) = status(
        reqwest::Client::new()
            .get(&url)
            .basic_auth("x", Some(&secret)),
    )
    .await;
    assert_eq!(code, 401);
    let page = env
        .page("/ui/workspace-tokens?token_revoked=1", &cookie)
        .await;
    assert!(page.contains("The token was revoked"), "{page}");
    let (live, ended) = page.split_once("Revoked or expired").expect("two sections");
    assert!(
        live.contains("No live token.") && ended.contains("ci-prod"),
        "{page}"
    );

    let keys = env.page("/ui/keys", &cookie).await;
    assert!(
        keys.contains("New writes are sealed under data key generation")
            && keys.contains("new writes")
            && keys.contains(r#"data-label="Versions">1<"#),
        "{keys}"
    );
}

#[tokio::test]
async fn a_get_of_any_form_address_goes_to_its_page_and_changes_nothing() {
    let env = seeded().await;
    // Without a session it is the login page, like every other route.
    let r = env
        .send("GET", "/ui/workspaces/prod/unlock", None, None)
        .await;
    assert_eq!((r.status, r.location()), (303, Some("/ui/login")));
    let cookie = env.login().await;
    let table = [
        ("/ui/logout", "/ui/"),
        ("/ui/workspaces/prod/unlock", "/ui/workspaces/prod"),
        ("/ui/workspaces/prod/allow-write", "/ui/workspaces/prod"),
        (
            "/ui/workspaces/prod/versions/1/reveal",
            "/ui/workspaces/prod/versions/1",
        ),
        (
            "/ui/workspaces/prod/versions/2/download",
            "/ui/workspaces/prod/versions/2",
        ),
        ("/ui/drift/prod/run", "/ui/drift?workspace=prod"),
        ("/ui/drift/7/apply", "/ui/drift/7"),
    ];
    for (path, page) in table {
        for method in ["GET", "HEAD"] {
            let before = snapshot(&env.server);
            let r = env.send(method, path, Some(&cookie), None).await;
            assert_eq!(
                (r.status, r.location()),
                (303, Some(page)),
                "{method} {path}"
            );
            assert_security_headers(&r, path);
            assert_eq!(
                snapshot(&env.server),
                before,
                "{method} {path} changed something"
            );
        }
    }
    assert!(env.locked("prod"), "still locked");
    assert!(
        env.page("/ui/", &cookie).await.contains("Log out"),
        "still logged in"
    );
    // A name that is not a workspace's, or a run that is not a number, is an error page,
    // never a redirect carrying it.
    for (path, code) in [
        ("/ui/workspaces/.hidden/unlock", 400),
        ("/ui/drift/x/apply", 400),
        ("/ui/workspaces/prod/versions/x/reveal", 400),
    ] {
        let r = env.get(path, &cookie).await;
        assert_eq!((r.status, r.location()), (code, None), "{path}: {}", r.body);
    }
    // Other methods are still refused (no 405 words from inside, though).
    let r = env
        .send("PUT", "/ui/workspaces/prod/unlock", Some(&cookie), None)
        .await;
    assert_eq!(r.status, 405);
    assert!(!r.body.contains("method this method"), "{}", r.body);
}

#[tokio::test]
async fn stategate_serves_its_own_icon_and_pages_speak_plainly() {
    let env = seeded().await;
    // The icon is public and ours (not an S3 404).
    for method in ["GET", "HEAD"] {
        let r = env
            .http
            .request(
                method.parse().unwrap(),
                format!("{}/favicon.ico", env.server.base),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{method}");
        assert_eq!(r.headers()["content-type"], "image/x-icon");
        if method == "GET" {
            let bytes = r.bytes().await.unwrap();
            assert!(bytes.starts_with(&[0, 0, 1, 0]), "an ICO file");
        }
    }
    let cookie = env.login().await;
    let page = env.page("/ui/", &cookie).await;
    assert!(page.contains(r#"rel="icon" href="/favicon.ico""#));
    // Terraform's operation names read as words.
    for path in ["/ui/", "/ui/workspaces/prod"] {
        let page = env.page(path, &cookie).await;
        assert!(!page.contains("OperationType"), "{path}: {page}");
        assert!(page.contains("apply"), "{path}");
    }
    // A rollback gets a fresh serial, and the help says so.
    let page = env.page("/ui/workspaces/prod", &cookie).await;
    assert!(page.contains("fresh serial"), "{page}");
    assert!(!page.contains("with its serial and lineage"));
    // The typed confirmation's words stay on one line (one element inside the label).
    let preview = env.page("/ui/workspaces/prod/rollback?to=1", &cookie).await;
    assert!(
        preview.contains("<label><span>Type <code>prod</code> to confirm</span><input"),
        "{preview}"
    );
    // After a force-unlock the page says what to do next.
    let page = env.page("/ui/workspaces/prod?unlocked=1", &cookie).await;
    assert!(page.contains("was not saved to the state") && page.contains("terraform plan"));
    // Error pages name workspaces, not internal scopes.
    let r = env.get("/ui/workspaces/prod/versions/99", &cookie).await;
    assert_eq!(r.status, 404);
    assert!(
        r.body.contains("Workspace prod has no version 99"),
        "{}",
        r.body
    );
    assert!(!r.body.contains("tf/prod"), "{}", r.body);
}

/// A state with one VPC whose `tags.tier` is `tier`, a `terraform_data` whose
/// dynamically typed input holds a marked password, and `extra` resources.
fn tagged_state(serial: u64, tier: &str, password: &str, extra: &str) -> String {
    let vpc = serde_json::json!({
        "mode": "managed", "type": "aws_vpc", "name": "main", "provider": "p",
        "instances": [{"attributes": {"id": "vpc-1", "tags": {"tier": tier, "team": "net"}}}]
    });
    let db = serde_json::json!({
        "mode": "managed", "type": "terraform_data", "name": "db", "provider": "p",
        "instances": [{
            "attributes": {"input": {"value": {"user": "app", "pass": password},
                                     "type": ["object", {"user": "string", "pass": "string"}]}},
            "sensitive_attributes": [[{"type": "get_attr", "value": "input"}, {"type": "get_attr", "value": "pass"}]]
        }]
    });
    let mut resources = vec![vpc.to_string(), db.to_string()];
    if !extra.is_empty() {
        resources.push(extra.to_string());
    }
    state(serial, "lin-tags", &resources.join(","))
}

#[tokio::test]
async fn a_diff_reads_by_attribute_path_with_counts_and_masks_every_value() {
    let env = Env::start().await;
    env.write(
        "net",
        tagged_state(1, "private", "first-password-1", &resource("gone", "bye")),
    )
    .await;
    let added = r#"{"mode":"managed","type":"aws_subnet","name":"a","module":"module.app","provider":"p","instances":[{"index_key":0,"attributes":{"cidr":"10.0.1.0/24","tags":{"az":"a"}}}]}"#;
    env.write("net", tagged_state(2, "app", "second-password-2", added))
        .await;
    let cookie = env.login().await;
    let page = env
        .page("/ui/workspaces/net/diff?from=1&to=2", &cookie)
        .await;
    // Counts on top.
    assert!(
        page.contains("+1 to add")
            && page.contains("~2 to change")
            && page.contains("−1 to destroy"),
        "{page}"
    );
    // The changed value by its path, before struck and after highlighted.
    assert!(
        page.contains(r#"<code class="path">tags.tier</code>: <del>&quot;private&quot;</del> → <ins>&quot;app&quot;</ins>"#),
        "{page}"
    );
    assert!(
        !page.contains("tags.team"),
        "an unchanged path is not listed"
    );
    // The type schema of a dynamic value is gone; the masked password's change is said.
    assert!(
        !page.contains("&quot;object&quot;") && !page.contains("[&quot;object"),
        "{page}"
    );
    assert!(page.contains("input.pass") && page.contains("both sides are masked"));
    // Added and removed resources list their (masked) attributes, with anchors.
    assert!(page.contains(r#"<code class="path">cidr</code>: <ins>&quot;10.0.1.0/24&quot;</ins>"#));
    assert!(page.contains(r#"<code class="path">tags.az</code>"#));
    assert!(page.contains(r#"<code class="path">input</code>: <del>&quot;bye&quot;</del>"#));
    assert!(page.contains(r#"id="r-module.app.aws_5fsubnet.a_5b0_5d""#));
    assert!(page.contains(r#"href="/ui/workspaces/net/versions/2#r-aws_5fvpc.main""#));
    // No sensitive value anywhere on the page.
    for secret in ["first-password-1", "second-password-2"] {
        assert!(!page.contains(secret), "{secret}");
    }
    // The rollback preview reads the same way.
    let preview = env.page("/ui/workspaces/net/rollback?to=1", &cookie).await;
    assert!(preview.contains("<del>&quot;app&quot;</del> → <ins>&quot;private&quot;</ins>"));
    assert!(!preview.contains("first-password-1") && !preview.contains("second-password-2"));
}

#[tokio::test]
async fn a_version_reads_as_an_outline_with_anchors_that_search_and_diffs_link_to() {
    let env = Env::start().await;
    env.write("net", tagged_state(1, "private", "first-password-1", ""))
        .await;
    env.write("net", tagged_state(2, "app", "second-password-2", ""))
        .await;
    let cookie = env.login().await;
    let page = env.page("/ui/workspaces/net/versions/2", &cookie).await;
    // The outline: module → type → instance, each a link to its section.
    assert!(page.contains(r#"id="outline""#) && page.contains("root module"));
    assert!(page.contains(r##"href="#r-aws_5fvpc.main""##), "{page}");
    assert!(page.contains(r#"<section class="card resource" id="r-aws_5fvpc.main">"#));
    // Attributes by path, the type schema dropped, only the marked sub-path masked.
    assert!(page.contains(
        r#"<code class="path">tags.tier</code>: <span class="value">&quot;app&quot;</span>"#
    ));
    assert!(page.contains(
        r#"<code class="path">input.user</code>: <span class="value">&quot;app&quot;</span>"#
    ));
    assert!(page.contains(r#"<code class="path">input.pass</code>: <span class="value">&quot;(sensitive)&quot;</span>"#));
    assert!(!page.contains("second-password-2") && !page.contains("first-password-1"));
    // The previous version is one click away, and so is each row's diff.
    assert!(page.contains(r#"href="/ui/workspaces/net/diff?from=1&amp;to=2""#));
    let ws = env.page("/ui/workspaces/net", &cookie).await;
    assert!(
        ws.contains(r#"href="/ui/workspaces/net/diff?from=1&amp;to=2""#),
        "{ws}"
    );
    assert!(
        !ws.contains("diff?from=0"),
        "version 1 has nothing before it"
    );
    // Search hits land on the resource, not the top of the page.
    let found = env.page("/ui/search?q=aws_vpc", &cookie).await;
    assert!(
        found.contains(r#"href="/ui/workspaces/net/versions/2#r-aws_5fvpc.main""#),
        "{found}"
    );
}

#[tokio::test]
async fn every_workspace_says_how_to_connect_terraform_and_an_empty_one_starts_there() {
    let env = seeded().await;
    let cookie = env.login().await;
    let base = env.server.app.client_url.clone();
    let address = format!("{base}/api/v1/tf/state/prod");
    let page = env.page("/ui/workspaces/prod", &cookie).await;
    assert!(page.contains(r#"id="connect""#), "{page}");
    assert!(
        page.contains(&format!("address        = &quot;{address}&quot;")),
        "{page}"
    );
    assert!(page.contains(&format!("unlock_address = &quot;{address}&quot;")));
    assert!(page.contains("stategate workspace env prod") && page.contains("issued token"));
    // Never the credential itself.
    let bearer = env.server.bearer("prod");
    assert!(!page.contains(&bearer));
    // A name nothing wrote to: the same panel, opened, instead of a bare error.
    let r = env.get("/ui/workspaces/fresh-ws", &cookie).await;
    assert_eq!(r.status, 404);
    assert!(
        r.body.contains("has no state yet") && r.body.contains(r#"id="connect" open"#),
        "{}",
        r.body
    );
    assert!(
        r.body.contains("/api/v1/tf/state/fresh-ws")
            && r.body.contains("stategate workspace env fresh-ws")
    );
}

#[tokio::test]
async fn a_stale_lock_stands_out_and_times_read_without_hovering() {
    let env = Env::start_with(|c| c.locks.stale_after_seconds = 0).await;
    env.write("prod", with_output(1, "l", &resource("a", "one"), "o"))
        .await;
    env.write("dev", with_output(1, "l", &resource("a", "one"), "o"))
        .await;
    env.lock("prod", "L1", "ci@runner").await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let cookie = env.login().await;
    let list = env.page("/ui/", &cookie).await;
    assert!(
        list.contains(r#"id="stale-locks""#) && list.contains("1 stale lock</strong>"),
        "{list}"
    );
    assert!(list.contains(r##"href="/ui/workspaces/prod#lock""##));
    assert!(list.contains("1 of 2 workspaces locked now."));
    let page = env.page("/ui/workspaces/prod", &cookie).await;
    assert!(
        page.contains(r#"id="stale""#) && page.contains("may have died"),
        "{page}"
    );
    // Every time: UTC without fractions in `datetime`, shown beside the relative one.
    let times: Vec<&str> = page.split("<time datetime=\"").skip(1).collect();
    assert!(!times.is_empty());
    for t in times {
        let iso = &t[..t.find('"').unwrap()];
        assert!(
            iso.len() == 20 && iso.ends_with('Z') && !iso.contains('.'),
            "{iso}"
        );
        assert!(
            t.contains(r#"<span class="abs">"#) && t.contains(" UTC</span> · "),
            "{t}"
        );
    }
    // A fresh lock is no banner.
    let fresh = Env::start().await;
    fresh
        .write("prod", with_output(1, "l", &resource("a", "one"), "o"))
        .await;
    fresh.lock("prod", "L1", "ci@runner").await;
    let cookie = fresh.login().await;
    let list = fresh.page("/ui/", &cookie).await;
    assert!(!list.contains("stale-locks") && list.contains("1 of 1 workspace locked now."));
}

/// A session cookie for the operator `token`.
async fn session_of(env: &Env, token: &str) -> String {
    let r = env.login_with(token).await;
    assert_eq!(r.status, 303, "{}", r.body);
    r.set_cookie()
        .and_then(|c| c.strip_prefix("sg_session="))
        .and_then(|rest| rest.split(';').next())
        .unwrap()
        .to_string()
}

/// Issue 37, finding 5: after a move from `team-a-1` into `prod-x` and consumers of
/// `team-a-1` naming `prod-x`, operators limited to `team-a-*` read the audit log (API
/// and UI), the consumers, search, freezes, drift and every page of their workspaces,
/// and no byte of any answer holds `prod-x`: the rows are there, the name is
/// `<hidden workspace>` and never a link. An unlimited admin reads the names and the
/// links. A limited admin's consumers `PUT` keeps the consumer it cannot see.
#[tokio::test]
async fn a_limited_reader_never_reads_a_hidden_workspace_in_audit_or_any_listing() {
    let env = Env::start().await;
    let hidden = "prod-x";
    env.write(
        "team-a-1",
        state(
            1,
            "lin-a",
            &[resource("mv", "1"), resource("keep", "2")].join(","),
        ),
    )
    .await;
    env.write(hidden, state(1, "lin-p", &resource("other", "3")))
        .await;
    let mut tokens = Vec::new();
    for (role, email) in [("viewer", "viewer-a@x.io"), ("admin", "admin-a@x.io")] {
        let grant = stategate::operator::roles::Grant::parse(role, Some("team-a-*")).unwrap();
        let token = env
            .server
            .app
            .operator
            .admin_write(move |c| operators::create_operator_with(c, email, &grant, "test"))
            .await
            .unwrap();
        tokens.push(token);
    }
    let (viewer, admin_a) = (tokens[0].clone(), tokens[1].clone());
    let api = |method: &str, path: &str, token: &str, body: Option<serde_json::Value>| {
        let mut req = reqwest::Client::new()
            .request(
                method.parse().unwrap(),
                format!("{}/api/v1/admin/{path}", env.server.base),
            )
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.body(b.to_string());
        }
        status(req)
    };
    let (code, text) = api(
        "POST",
        "workspaces/team-a-1/move/prod-x",
        &env.token,
        Some(serde_json::json!({"addresses": ["terraform_data.mv"]})),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    let (code, text) = api(
        "PUT",
        "workspaces/team-a-1/consumers",
        &env.token,
        Some(serde_json::json!({"consumers": ["team-a-2", hidden]})),
    )
    .await;
    assert_eq!(code, 200, "{text}");

    let reads = [
        "audit",
        "audit?scope=team-a-1",
        "audit?event=tf.resources_moved",
        "audit?event=consumers",
        "workspaces",
        "workspaces/team-a-1",
        "workspaces/team-a-1/versions",
        "workspaces/team-a-1/timeline",
        // A move's versions name the other workspace (issue 38, item 9): hidden too.
        "workspaces/team-a-1/diff?from=1&to=2",
        "search?q=terraform_data",
        "freezes",
        "drift",
    ];
    for token in [&viewer, &admin_a] {
        for path in reads {
            let (code, text) = api("GET", path, token, None).await;
            assert_eq!(code, 200, "{path}: {text}");
            assert!(!text.contains(hidden), "{path}: {text}");
        }
        let (_, audit) = api("GET", "audit", token, None).await;
        let rows: serde_json::Value = serde_json::from_str(&audit).unwrap();
        let row = |event: &str| {
            rows["audit"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["event"] == event)
                .unwrap_or_else(|| panic!("no {event} row in {audit}"))
                .clone()
        };
        let moved = row("tf.resources_moved");
        assert_eq!(moved["payload"]["from"]["workspace"], "team-a-1");
        assert_eq!(moved["payload"]["to"]["workspace"], "<hidden workspace>");
        assert_eq!(
            row("tf.consumers_set")["payload"]["consumers"],
            serde_json::json!(["team-a-2", "<hidden workspace>"])
        );
    }
    // The admin limited to team-a-*: consumers it cannot see are hidden and kept.
    let (code, text) = api("GET", "workspaces/team-a-1/consumers", &admin_a, None).await;
    assert_eq!(code, 200, "{text}");
    assert!(!text.contains(hidden), "{text}");
    assert!(
        text.contains(r#"["team-a-2","<hidden workspace>"]"#),
        "{text}"
    );
    let (code, text) = api(
        "PUT",
        "workspaces/team-a-1/consumers",
        &admin_a,
        Some(serde_json::json!({"consumers": ["team-a-3", "<hidden workspace>"]})),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    assert!(
        text.contains(r#"["team-a-3","<hidden workspace>"]"#),
        "{text}"
    );
    let (_, all) = api("GET", "workspaces/team-a-1/consumers", &env.token, None).await;
    assert!(all.contains(r#"["prod-x","team-a-3"]"#), "{all}");

    // The web UI, every page the limited viewer reads.
    let cookie = session_of(&env, &viewer).await;
    let pages = [
        "/ui/audit",
        "/ui/audit?scope=team-a-1",
        "/ui/audit?event=tf.resources_moved",
        "/ui/workspaces",
        "/ui/workspaces/team-a-1",
        "/ui/workspaces/team-a-1/versions/2",
        "/ui/workspaces/team-a-1/diff?from=1&to=2",
        "/ui/search?q=terraform_data",
        "/ui/drift",
    ];
    for path in pages {
        let page = env.page(path, &cookie).await;
        assert!(!page.contains(hidden), "{path}: {page}");
    }
    let page = env.page("/ui/audit", &cookie).await;
    assert!(page.contains("&lt;hidden workspace&gt;"), "{page}");
    assert!(!page.contains("/ui/workspaces/&lt;"), "{page}");

    // Not limited: every name, linked.
    let (_, audit) = api("GET", "audit", &env.token, None).await;
    assert!(audit.contains(r#""workspace":"prod-x""#), "{audit}");
    assert!(audit.contains(r#"["team-a-2","prod-x"]"#), "{audit}");
    let cookie = session_of(&env, &env.token).await;
    let page = env.page("/ui/audit", &cookie).await;
    assert!(
        page.contains(r#"<a href="/ui/workspaces/prod-x">prod-x</a>"#),
        "{page}"
    );
    assert!(
        page.contains(r#"<a href="/ui/workspaces/prod-x/versions/2">v2</a>"#),
        "{page}"
    );
}

/// Every event name the code exports is declared in `store::audit::EVENTS` (a write of
/// an undeclared one is refused in debug builds; this names the ones no test writes).
#[test]
fn every_exported_audit_event_declares_what_names_workspaces() {
    use stategate::{cluster, drift, operator, store, tofu};
    for event in [
        tofu::EVENT_ROLLBACK,
        tofu::EVENT_WRITTEN,
        tofu::EVENT_DELETED,
        tofu::EVENT_LOCKED,
        tofu::EVENT_UNLOCKED,
        tofu::EVENT_FORCE_UNLOCKED,
        tofu::EVENT_RESTORED,
        tofu::EVENT_WRITE_ALLOWED,
        tofu::EVENT_OVERRIDE_USED,
        tofu::EVENT_FROZEN,
        tofu::EVENT_UNFROZEN,
        tofu::EVENT_FREEZE_EXPIRED,
        tofu::EVENT_RESOURCES_MOVED,
        tofu::EVENT_MOVE_ABANDONED,
        tofu::credentials::EVENT_ROTATED,
        tofu::credentials::EVENT_TOKEN_CREATED,
        tofu::credentials::EVENT_TOKEN_REVOKED,
        tofu::credentials::EVENT_CONSUMERS_SET,
        drift::EVENT_APPLY_APPROVED,
        drift::EVENT_APPLIED,
        drift::EVENT_LOCK_LEFT,
        cluster::EVENT_PUSHED,
        cluster::EVENT_ACQUIRED,
        cluster::EVENT_RELEASED,
        cluster::EVENT_STOLEN,
        cluster::EVENT_BROKEN,
        store::retention::EVENT_PRUNED,
        operator::EVENT_REVEALED,
    ] {
        assert!(
            store::audit::event_kind(event).is_some(),
            "{event} is not declared in store::audit::EVENTS"
        );
    }
}

/// The per-holder force-unlock of shared plan locks: each holder has its own form
/// (with its `Who` escaped); a viewer, a post without the session's CSRF token and a
/// holder's ID sent to another workspace's path free nothing and audit nothing; an
/// operator frees exactly the holder it names, audited once.
#[tokio::test]
async fn a_plan_holder_is_force_unlocked_alone_and_only_by_an_operator() {
    let (env, sessions) = role_env().await;
    let session = |email: &str| {
        let s = sessions.iter().find(|s| s.0 == email).unwrap();
        (s.3.clone(), s.4.clone())
    };
    env.write("dev-p", state(1, "lin-1", &resource("one", "x")))
        .await;
    for (id, who) in [("P1", "<b>plan-one</b>"), ("P2", "plan-two")] {
        let info = serde_json::json!({
            "ID": id, "Operation": "OperationTypePlan", "Info": "", "Who": who,
            "Version": "1.15.0", "Created": "2026-11-30T00:00:00Z", "Path": ""
        });
        let (code, text) = status(env.server.tf("LOCK", "dev-p").body(info.to_string())).await;
        assert_eq!(code, 200, "{text}");
    }
    let holders = || {
        env.server
            .count("SELECT count(*) FROM tf_plan_locks WHERE workspace = 'dev-p'")
    };
    let forced = || {
        env.audit("tf/dev-p")
            .iter()
            .filter(|(event, _)| event == "tf.lock_forced")
            .count()
    };
    let (operator, operator_csrf) = session("operator-dev@x.io");
    let page = env.page("/ui/workspaces/dev-p", &operator).await;
    assert_eq!(page.matches("Force unlock").count(), 2, "{page}");
    assert!(
        page.contains("&lt;b&gt;plan-one&lt;/b&gt;") && !page.contains("<b>plan-one"),
        "{page}"
    );

    let (viewer, viewer_csrf) = session("viewer@x.io");
    let refused = [
        (
            "a viewer",
            "/ui/workspaces/dev-p/unlock",
            viewer.clone(),
            viewer_csrf.clone(),
        ),
        (
            "another session's CSRF token",
            "/ui/workspaces/dev-p/unlock",
            operator.clone(),
            viewer_csrf.clone(),
        ),
        (
            "another workspace's path",
            "/ui/workspaces/dev-a/unlock",
            operator.clone(),
            operator_csrf.clone(),
        ),
    ];
    for (who, path, cookie, csrf) in refused {
        let r = env
            .post(
                path,
                &cookie,
                &[("csrf", &csrf), ("lock_id", "P1"), ("confirm", "yes")],
            )
            .await;
        assert!(
            r.status >= 400,
            "{who}: {} {:?} {}",
            r.status,
            r.location(),
            r.body
        );
        assert_eq!(holders(), 2, "{who}: a plan holder was freed");
        assert_eq!(forced(), 0, "{who}: audited");
        assert!(env.locked("dev-a"), "{who}: dev-a's lock was freed");
    }

    let r = env
        .post(
            "/ui/workspaces/dev-p/unlock",
            &operator,
            &[
                ("csrf", &operator_csrf),
                ("lock_id", "P1"),
                ("confirm", "yes"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(holders(), 1, "exactly the named holder is freed");
    assert_eq!(
        env.server.count(
            "SELECT count(*) FROM tf_plan_locks WHERE workspace = 'dev-p' AND lock_id = 'P2'"
        ),
        1
    );
    assert_eq!(forced(), 1);
}

/// Issue 38, item 11: the encryption column says what it means: every workspace is
/// encrypted at rest (AES-256-GCM, with the key generation on its page, the admin API
/// has it too), and separately whether OpenTofu encrypts it client-side, with where to
/// read how to turn that on; no "plaintext" badge that reads as "stored unencrypted".
#[tokio::test]
async fn the_encryption_column_says_at_rest_and_client_side_apart() {
    let env = Env::start().await;
    env.write("prod", state(1, "lin-p", "")).await;
    let envelope = r#"{"serial":1,"lineage":"lin-e","meta":{"key_provider.pbkdf2.main":"eyJzYWx0IjoiIn0="},"encrypted_data":"q83vEjRWeJCrze8SNFZ4kA==","encryption_version":"v0"}"#;
    env.write("tofu", envelope.to_string()).await;
    let cookie = env.login().await;
    let list = env.page("/ui/workspaces", &cookie).await;
    assert!(!list.contains("plaintext"), "{list}");
    let row = |name: &str| {
        let at = list
            .find(&format!(r#"<a href="/ui/workspaces/{name}">{name}</a>"#))
            .unwrap();
        list[at..at + list[at..].find("</tr>").unwrap()].to_string()
    };
    let prod = row("prod");
    // The list names who wrote each newest version (issue 38, item 12).
    assert!(list.contains("<th>Written by</th>"), "{list}");
    assert!(
        prod.contains(r#"<td data-label="Written by">tf:prod</td>"#),
        "{prod}"
    );
    assert!(prod.contains("At rest: AES-256-GCM"), "{prod}");
    assert!(prod.contains("OpenTofu encryption: no"), "{prod}");
    assert!(
        prod.contains(
            r##"<a href="/ui/workspaces/prod#opentofu-encryption">how to turn it on</a>"##
        ),
        "{prod}"
    );
    let tofu = row("tofu");
    assert!(
        tofu.contains("OpenTofu encryption: yes (pbkdf2.main)"),
        "{tofu}"
    );
    assert!(!tofu.contains("how to turn it on"), "{tofu}");
    // The workspace page names the key generation its newest version is sealed under,
    // and the link lands on how to turn client-side encryption on.
    let page = env.page("/ui/workspaces/prod", &cookie).await;
    assert!(
        page.contains("At rest: AES-256-GCM, key generation 0"),
        "{page}"
    );
    assert!(page.contains(r#"id="opentofu-encryption""#), "{page}");
    assert!(page.contains("--opentofu-encryption"), "{page}");
    assert!(!page.contains("plaintext"), "{page}");
    let (code, text) = status(
        reqwest::Client::new()
            .get(format!("{}/api/v1/admin/workspaces/prod", env.server.base))
            .bearer_auth(&env.token),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    let one: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(one["key_generation"], 0, "{one}");
}

#[tokio::test]
async fn the_audit_filter_finds_freezes_by_their_words_and_a_bad_time_keeps_the_form() {
    let env = seeded().await;
    let cookie = env.login().await;
    let csrf = env.csrf(&cookie).await;
    let r = env
        .post(
            "/ui/workspaces/prod/freeze",
            &cookie,
            &[
                ("csrf", csrf.as_str()),
                ("reason", "incident"),
                ("for", "2h"),
                ("confirm", "yes"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    let r = env
        .post(
            "/ui/workspaces/prod/unfreeze",
            &cookie,
            &[("csrf", csrf.as_str())],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    // (event filter, in the rows, not in the rows): the words in another form, on
    // whichever index the suite runs on.
    type Row<'a> = (&'a str, &'a [&'a str], &'a [&'a str]);
    let table: &[Row] = &[
        (
            "freeze",
            &["tf.frozen", "tf.unfrozen"],
            &["tf.state_written"],
        ),
        (
            "frozen",
            &["tf.frozen", "tf.unfrozen"],
            &["tf.lock_acquired"],
        ),
        ("unfreeze", &["tf.unfrozen"], &["tf.frozen<"]),
        ("tf.unfrozen", &["tf.unfrozen"], &["tf.frozen<"]),
        ("moved", &[], &["tf.frozen"]),
        // Whatever the case typed.
        (
            "FREEZE",
            &["tf.frozen", "tf.unfrozen"],
            &["tf.state_written"],
        ),
        (
            "Frozen",
            &["tf.frozen", "tf.unfrozen"],
            &["tf.lock_acquired"],
        ),
        ("UnFreeze", &["tf.unfrozen"], &["tf.frozen<"]),
        ("TF.UNFROZEN", &["tf.unfrozen"], &["tf.frozen<"]),
    ];
    for (event, has, lacks) in table {
        let page = env.page(&format!("/ui/audit?event={event}"), &cookie).await;
        let rows = audit_rows(&page);
        for want in *has {
            assert!(rows.contains(want), "{event}: {want} not in {rows}");
        }
        for not in *lacks {
            assert!(!rows.contains(not), "{event}: {not} in {rows}");
        }
    }
    // A time that is not one: the page again, the form as typed, the field named
    // with the forms it takes, and no rows.
    for (query, field, typed) in [
        (
            "since=yesterday&event=freeze&scope=prod",
            "Since",
            "yesterday",
        ),
        ("until=2026-02-30&scope=prod", "Until", "2026-02-30"),
    ] {
        let r = env.get(&format!("/ui/audit?{query}"), &cookie).await;
        assert_eq!(r.status, 400, "{query}: {}", r.body);
        let page = &r.body;
        for want in [
            r#"id="audit-filter""#,
            &format!(r#"value="{typed}""#),
            r#"value="prod""#,
            r#"aria-invalid="true""#,
            &format!("<strong>{field}</strong> “{typed}” is not a time."),
            "<code>2026-03-01</code>",
            "RFC 3339",
            r#"<option value="tf.state_written">"#,
        ] {
            assert!(page.contains(want), "{query}: {want} not on {page}");
        }
        assert!(!page.contains("<table"), "{query}: rows on {page}");
    }
}

#[tokio::test]
async fn a_mistyped_workspace_suggests_only_close_names_the_reader_may_see() {
    let (env, sessions) = role_env().await;
    // Close to `dev-b` but outside `dev-*`: never shown to a reader limited to it.
    env.write("dex-b", state(1, "lin-1", &resource("one", "x")))
        .await;
    let cookie = |email: &str| sessions.iter().find(|s| s.0 == email).unwrap().3.clone();
    // (reader, typed, suggested, never on the page)
    type Row<'a> = (&'a str, &'a str, &'a [&'a str], &'a [&'a str]);
    let table: &[Row] = &[
        ("viewer@x.io", "dev-b", &["dev-a", "dex-b"], &[]),
        ("viewer-dev@x.io", "dev-b", &["dev-a"], &["dex-b"]),
        ("viewer@x.io", "prdo-x", &["prod-x"], &[]),
        ("viewer@x.io", "unrelated-name", &[], &["Did you mean"]),
    ];
    for (reader, typed, suggested, never) in table {
        let r = env
            .get(&format!("/ui/workspaces/{typed}"), &cookie(reader))
            .await;
        assert_eq!(r.status, 404, "{reader} {typed}: {}", r.body);
        let page = &r.body;
        assert!(page.contains("has no state yet"), "{page}");
        if !suggested.is_empty() {
            assert!(page.contains("Did you mean"), "{reader} {typed}: {page}");
        }
        for name in *suggested {
            assert!(
                page.contains(&format!(r#"<a href="/ui/workspaces/{name}">{name}</a>"#)),
                "{reader} {typed}: {name} not on {page}"
            );
        }
        for not in *never {
            assert!(!page.contains(not), "{reader} {typed}: {not} on {page}");
        }
    }
}

/// Issue 38: the consumers of `dev-a` (`dev-b`, and `prod-x` outside `dev-*`), as
/// an unlimited admin sets them; the session cookie of each of [`role_env`]'s operators.
async fn consumers_env() -> (Env, impl Fn(&str) -> String) {
    let (env, sessions) = role_env().await;
    let set = env
        .server
        .app
        .operator
        .set_consumers(
            "dev-a",
            vec!["dev-b".into(), "prod-x".into()],
            ACTOR,
            &stategate::operator::roles::Grant::ROOT,
        )
        .await
        .unwrap();
    assert_eq!(set, ["dev-b", "prod-x"]);
    let cookie = move |email: &str| sessions.iter().find(|s| s.0 == email).unwrap().3.clone();
    (env, cookie)
}

#[tokio::test]
async fn an_admin_sees_a_workspaces_consumers_as_links_and_how_to_change_them() {
    let (env, cookie) = consumers_env().await;
    let page = env
        .page("/ui/workspaces/dev-a", &cookie("admin@x.io"))
        .await;
    assert!(page.contains(r#"id="consumers""#), "{page}");
    for name in ["dev-b", "prod-x"] {
        assert!(
            page.contains(&format!(r#"<a href="/ui/workspaces/{name}">{name}</a>"#)),
            "{name} not linked on {page}"
        );
    }
    assert!(
        page.contains("stategate workspace consumers set dev-a"),
        "{page}"
    );
    assert!(!page.contains("neither see nor remove"), "{page}");
    // A workspace with none says so.
    let page = env
        .page("/ui/workspaces/prod-x", &cookie("admin@x.io"))
        .await;
    assert!(
        page.contains(r#"id="consumers""#)
            && page.contains("No workspace reads this workspace’s outputs."),
        "{page}"
    );
}

#[tokio::test]
async fn viewers_and_operators_are_not_shown_the_consumers_card() {
    let (env, cookie) = consumers_env().await;
    // Only who may administer the workspace (the guard's rule for the consumers routes).
    for (email, shown) in [
        ("viewer@x.io", false),
        ("viewer-dev@x.io", false),
        ("operator@x.io", false),
        ("operator-dev@x.io", false),
        ("admin-dev@x.io", true),
        ("admin@x.io", true),
    ] {
        let page = env.page("/ui/workspaces/dev-a", &cookie(email)).await;
        for what in [
            r#"id="consumers""#,
            "consumers set",
            r#"href="/ui/workspaces/dev-b""#,
        ] {
            assert_eq!(page.contains(what), shown, "{email}: {what} on {page}");
        }
    }
}

#[tokio::test]
async fn a_limited_admin_sees_no_consumer_outside_its_patterns() {
    let (env, cookie) = consumers_env().await;
    let page = env
        .page("/ui/workspaces/dev-a", &cookie("admin-dev@x.io"))
        .await;
    let card = page
        .split(r#"id="consumers""#)
        .nth(1)
        .and_then(|rest| rest.split("</section>").next())
        .unwrap_or_else(|| panic!("no consumers card on {page}"));
    assert!(
        card.contains(r#"<a href="/ui/workspaces/dev-b">dev-b</a>"#),
        "{card}"
    );
    // The one it may not see: counted, never named, never a link.
    assert!(card.contains("&lt;hidden workspace&gt;"), "{card}");
    assert!(!card.contains("/ui/workspaces/&lt;"), "{card}");
    assert!(card.contains("you can neither see nor remove it"), "{card}");
    assert!(!page.contains("prod-x"), "{page}");
}
