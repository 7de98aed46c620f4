//! The web UI (`/ui/`) in process on port 0: no session → 303 to login and nothing
//! shown, login with operator tokens only, cookie flags, CSRF on every form (refused
//! forms change nothing), escaping of values from state and LockInfo, rollback and
//! force-unlock audited as the operator, logout and token revocation ending sessions.

mod common;

use common::{state, status, TestServer};
use reqwest::header::HeaderMap;
use stategate::cluster::identity::{self, Role};
use stategate::operator::identity as operators;

const OPS: &str = "ops@example.com";
const ACTOR: &str = "operator:ops@example.com";
const EVIL: &str = "<script>alert(1)</script>";

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
        let server = TestServer::start_with_app(
            |c| c.cluster.state_enc_key = Some(common::DEK.into()),
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
        ("GET", "/ui/workspaces/prod/versions/1/download", None),
        ("GET", "/ui/workspaces/prod/diff?from=1&to=2", None),
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
    let revoked = env
        .server
        .app
        .operator
        .admin_write(|c| operators::create_operator_token(c, OPS, "test"))
        .await
        .unwrap();
    // A session whose operator token has since been revoked is no session.
    let stale_cookie = {
        let r = env.login_with(&revoked).await;
        assert_eq!(r.status, 303);
        let c = r.set_cookie().unwrap().to_string();
        let id = identity::token_id(&identity::token_hash(revoked.as_bytes()));
        env.server
            .app
            .operator
            .admin_write(move |c| operators::revoke_operator_token(c, &id, "test"))
            .await
            .unwrap();
        c["sg_session=".len()..]
            .split(';')
            .next()
            .unwrap()
            .to_string()
    };
    for cookie in [None, Some("sgs_made_up"), Some(stale_cookie.as_str())] {
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
    // Nothing changed through any of them.
    assert_eq!(env.versions("prod"), 2);
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
    let revoked = env
        .server
        .app
        .operator
        .admin_write(|c| operators::create_operator_token(c, OPS, "test"))
        .await
        .unwrap();
    let id = identity::token_id(&identity::token_hash(revoked.as_bytes()));
    env.server
        .app
        .operator
        .admin_write(move |c| operators::revoke_operator_token(c, &id, "test"))
        .await
        .unwrap();
    let bearer = env.server.bearer("prod");
    for bad in ["", "sgo_wrong", bearer.as_str(), revoked.as_str()] {
        let r = env.login_with(bad).await;
        assert_eq!(r.status, 401, "{bad}: {}", r.body);
        assert!(r.set_cookie().is_none(), "{bad}: no cookie");
        assert!(r.body.contains("not a valid operator token"), "{bad}");
        assert!(!r.body.contains("prod"), "{bad}: shows nothing");
        assert_security_headers(&r, bad);
    }
    assert_eq!(env.server.count("SELECT count(*) FROM ui_sessions"), 0);

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
        "SELECT count(*) FROM ui_sessions WHERE id_sha256 = '{}'",
        identity::token_hash(value.as_bytes())
    ));
    assert_eq!(stored, 1);
    assert_eq!(
        env.server.count(&format!(
            "SELECT count(*) FROM ui_sessions WHERE id_sha256 = '{value}'"
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
            ("/ui/logout", with(vec![])),
        ];
        for (path, fields) in forms {
            let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let r = env.post(path, &cookie, &fields).await;
            assert_eq!(r.status, 403, "{path} with {token:?}: {}", r.body);
            assert!(r.body.contains("nothing was changed"), "{path}");
            assert!(r.set_cookie().is_none(), "{path}");
            assert_security_headers(&r, path);
        }
    }
    assert_eq!(env.versions("prod"), 2);
    assert!(env.locked("prod"));
    assert!(!env
        .audit("tf/prod")
        .iter()
        .any(|(e, _)| e == "tf.rollback" || e == "tf.lock_forced"));
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
        "OperationTypeApply",
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
    let revealed = env
        .page("/ui/workspaces/prod/versions/1?reveal=1", &cookie)
        .await;
    assert!(revealed.contains("hunter2-secret"));
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
    let r = env
        .get("/ui/workspaces/prod/versions/1/download", &cookie)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers["content-disposition"],
        "attachment; filename=\"prod-v1.tfstate\""
    );
    assert!(r.body.contains("hunter2-secret") && r.body.contains("\"serial\":1"));
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
    assert!(only.contains("tf.rollback") && !only.contains("tf.lock_forced"));
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
    assert_eq!(env.server.count("SELECT count(*) FROM ui_sessions"), 0);
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
