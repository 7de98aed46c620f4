//! Maintenance freezes in process on port 0 (`tofu::freeze`): while frozen every LOCK
//! and every unlocked write is refused with a LockInfo that carries the reason, and
//! nothing is written; a lock held before the freeze keeps working; unfreeze and
//! expiry lift it (audited); the freeze is re-checked inside the commit.

mod common;

use common::{lock_info, state, status, AdminEnv};
use serde_json::{json, Value};

const OPS: &str = "ops@example.com";
const ACTOR: &str = "operator:ops@example.com";

/// The shared setup (`common::AdminEnv`) and this file's helpers over it.
struct Env(AdminEnv);

impl std::ops::Deref for Env {
    type Target = AdminEnv;
    fn deref(&self) -> &AdminEnv {
        &self.0
    }
}

impl Env {
    async fn start() -> Env {
        Env(AdminEnv::start(OPS).await)
    }

    async fn freeze(&self, ws: &str, body: Value) -> Value {
        let (code, text) = self
            .admin("POST", &format!("workspaces/{ws}/freeze"), Some(body))
            .await;
        assert_eq!(code, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    }

    async fn write(&self, ws: &str, serial: u64, lock: Option<&str>) -> (u16, String) {
        let url = match lock {
            Some(id) => format!("{}?ID={id}", self.server.url(ws)),
            None => self.server.url(ws),
        };
        status(
            reqwest::Client::new()
                .post(url)
                .basic_auth("stategate", Some(self.server.bearer(ws)))
                .body(state(serial, "lin-1", "")),
        )
        .await
    }

    async fn lock(&self, ws: &str, id: &str) -> (u16, String) {
        status(self.server.tf("LOCK", ws).body(lock_info(id))).await
    }

    /// Everything a refused request could have changed.
    fn snapshot(&self) -> (i64, i64, i64, usize) {
        (
            self.server.count("SELECT count(*) FROM versions"),
            self.server.count("SELECT count(*) FROM tf_locks"),
            self.server.count("SELECT coalesce(max(id), 0) FROM audit"),
            self.server.blob_files().len(),
        )
    }

    fn events(&self, ws: &str) -> Vec<(String, String)> {
        let conn = self.server.db();
        let mut stmt = conn
            .prepare(
                "SELECT event, actor FROM audit WHERE scope = ?1 \
                 AND event IN ('tf.frozen', 'tf.unfrozen', 'tf.freeze_expired') ORDER BY id",
            )
            .unwrap();
        stmt.query_map([format!("tf/{ws}")], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }
}

#[tokio::test]
async fn a_freeze_refuses_every_lock_and_unlocked_write_with_its_reason() {
    let env = Env::start().await;
    assert_eq!(env.write("prod", 1, None).await.0, 200);
    let done = env
        .freeze(
            "prod",
            json!({"reason": "incident 42: DB failover", "for": "2h"}),
        )
        .await;
    assert_eq!(done["freeze"]["frozen_by"], ACTOR);
    assert_eq!(done["lock_held"], Value::Null);
    let before = env.snapshot();
    // LOCK: 423 with a LockInfo Terraform prints (ID kept for -lock-timeout).
    let (code, body) = env.lock("prod", "a-run").await;
    assert_eq!(code, 423, "{body}");
    let info: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(info["ID"], "stategate-freeze-prod");
    assert_eq!(info["Who"], format!("frozen by {ACTOR}"));
    assert!(
        info["Info"]
            .as_str()
            .unwrap()
            .contains("incident 42: DB failover"),
        "{info}"
    );
    assert_eq!(info["Operation"], "stategate workspace freeze");
    // the GitLab-style lock route too
    let (code, _) = status(
        reqwest::Client::new()
            .post(format!("{}/lock", env.server.url("prod")))
            .basic_auth("stategate", Some(env.server.bearer("prod")))
            .body(lock_info("b-run")),
    )
    .await;
    assert_eq!(code, 423);
    // -lock=false writes, an unlocked DELETE, an operator rollback: the same 423.
    let (code, body) = env.write("prod", 2, None).await;
    assert_eq!((code, body.as_str()), (423, info.to_string().as_str()));
    let (code, _) = status(env.server.tf("DELETE", "prod")).await;
    assert_eq!(code, 423);
    let (code, body) = env
        .admin("POST", "workspaces/prod/rollback", Some(json!({"to": 1})))
        .await;
    assert_eq!(code, 423, "{body}");
    assert_eq!(env.snapshot(), before, "a refusal changed something");
    // Reads still work.
    let (code, body) = status(env.server.tf("GET", "prod")).await;
    assert_eq!((code, body.contains("\"serial\":1")), (200, true));
    // Listed, and shown on the workspace.
    let (code, text) = env.admin("GET", "freezes", None).await;
    assert_eq!(code, 200);
    let listed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(listed["freezes"][0]["workspace"], "prod");
    assert_eq!(listed["freezes"][0]["reason"], "incident 42: DB failover");
    let (_, text) = env.admin("GET", "workspaces/prod", None).await;
    assert!(text.contains("incident 42"), "{text}");
    // Unfreeze: LOCK and writes work again.
    let (code, text) = env.admin("POST", "workspaces/prod/unfreeze", None).await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["unfrozen"],
        true
    );
    assert_eq!(env.lock("prod", "a-run").await.0, 200);
    assert_eq!(env.write("prod", 2, Some("a-run")).await.0, 200);
    // Unfreezing again changes nothing.
    let before = env.snapshot();
    let (_, text) = env.admin("POST", "workspaces/prod/unfreeze", None).await;
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["unfrozen"],
        false
    );
    assert_eq!(env.snapshot(), before);
    assert_eq!(
        env.events("prod"),
        [
            ("tf.frozen".to_string(), ACTOR.to_string()),
            ("tf.unfrozen".into(), ACTOR.into())
        ]
    );
}

#[tokio::test]
async fn a_freeze_never_breaks_a_lock_held_before_it() {
    let env = Env::start().await;
    assert_eq!(env.lock("prod", "held").await.0, 200);
    let done = env.freeze("prod", json!({"reason": "migration"})).await;
    assert_eq!(done["lock_held"]["id"], "held");
    assert_eq!(done["until_text"], "until unfrozen");
    // The holder: its retry, its writes and its unlock still work.
    assert_eq!(env.lock("prod", "held").await.0, 200);
    assert_eq!(env.write("prod", 1, Some("held")).await.0, 200);
    assert_eq!(env.write("prod", 2, Some("held")).await.0, 200);
    // Anyone else: the freeze.
    let (code, body) = env.lock("prod", "other").await;
    assert_eq!(code, 423);
    assert!(body.contains("migration"), "{body}");
    let (code, _) = env.write("prod", 3, None).await;
    assert_eq!(code, 423);
    let (code, _) = status(env.server.tf("UNLOCK", "prod").body(lock_info("held"))).await;
    assert_eq!(code, 200);
    // Released: now nobody takes it.
    let before = env.snapshot();
    assert_eq!(env.lock("prod", "held").await.0, 423);
    assert_eq!(env.snapshot(), before);
    assert_eq!(env.server.count("SELECT max(version) FROM versions"), 2);
}

#[tokio::test]
async fn an_expired_freeze_is_lifted_when_noticed_and_audited() {
    let env = Env::start().await;
    env.freeze("prod", json!({"reason": "window", "for": "1h"}))
        .await;
    let tomorrow = (time::OffsetDateTime::now_utc() + time::Duration::days(1))
        .replace_nanosecond(0)
        .unwrap();
    let until = tomorrow
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let dev = env
        .freeze("dev", json!({"reason": "window", "until": until}))
        .await;
    assert_eq!(dev["freeze"]["until"], tomorrow.unix_timestamp());
    assert_eq!(env.lock("prod", "a").await.0, 423);
    // The hour passes.
    env.server
        .db()
        .execute(
            "UPDATE tf_freezes SET until = ?1 WHERE workspace = 'prod'",
            [time::OffsetDateTime::now_utc().unix_timestamp() - 1],
        )
        .unwrap();
    // The first LOCK after it notices: taken, and the expiry audited by stategate.
    assert_eq!(env.lock("prod", "a").await.0, 200);
    assert_eq!(
        env.events("prod"),
        [
            ("tf.frozen".to_string(), ACTOR.to_string()),
            ("tf.freeze_expired".into(), "stategate".into())
        ]
    );
    assert_eq!(
        env.server
            .count("SELECT count(*) FROM tf_freezes WHERE workspace = 'prod'"),
        0
    );
    // An unlocked write is the first to notice, too: stored, the expiry audited once
    // (its early look on a reader changes nothing; the commit ends the freeze).
    env.freeze("stage", json!({"reason": "window", "for": "1h"}))
        .await;
    env.server
        .db()
        .execute(
            "UPDATE tf_freezes SET until = ?1 WHERE workspace = 'stage'",
            [time::OffsetDateTime::now_utc().unix_timestamp() - 1],
        )
        .unwrap();
    assert_eq!(env.write("stage", 1, None).await.0, 200);
    assert_eq!(
        env.events("stage"),
        [
            ("tf.frozen".to_string(), ACTOR.to_string()),
            ("tf.freeze_expired".into(), "stategate".into())
        ]
    );
    // The listing notices too (and removes what ended).
    env.server
        .db()
        .execute(
            "UPDATE tf_freezes SET until = ?1 WHERE workspace = 'dev'",
            [time::OffsetDateTime::now_utc().unix_timestamp() - 1],
        )
        .unwrap();
    let (_, text) = env.admin("GET", "freezes", None).await;
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["freezes"],
        json!([])
    );
    assert_eq!(env.events("dev").last().unwrap().0, "tf.freeze_expired");
    assert_eq!(env.server.count("SELECT count(*) FROM tf_freezes"), 0);
}

#[tokio::test]
async fn bad_freeze_requests_are_refused_and_change_nothing() {
    let env = Env::start().await;
    let long = "x".repeat(stategate::tofu::freeze::MAX_REASON_CHARS + 1);
    let table: Vec<(&str, Value, u16)> = vec![
        ("prod", json!({}), 400),
        ("prod", json!({"reason": "  "}), 400),
        ("prod", json!({"reason": long}), 400),
        ("prod", json!({"reason": "a\u{7}b"}), 400),
        ("prod", json!({"reason": "r", "for": "2w"}), 400),
        ("prod", json!({"reason": "r", "for": "0m"}), 400),
        ("prod", json!({"reason": "r", "for": "9999d"}), 400),
        (
            "prod",
            json!({"reason": "r", "until": "2001-01-01T00:00Z"}),
            400,
        ),
        ("prod", json!({"reason": "r", "until": "soon"}), 400),
        (
            "prod",
            json!({"reason": "r", "until": "2099-01-01T00:00Z", "for": "1h"}),
            400,
        ),
        ("prod", json!({"reason": "r", "extra": 1}), 400),
        ("..%2Fetc", json!({"reason": "r"}), 400),
    ];
    for (ws, body, expected) in table {
        let before = env.snapshot();
        let (code, text) = env
            .admin(
                "POST",
                &format!("workspaces/{ws}/freeze"),
                Some(body.clone()),
            )
            .await;
        assert_eq!(code, expected, "{ws} {body}: {text}");
        assert_eq!(env.snapshot(), before, "{body}");
        assert_eq!(env.server.count("SELECT count(*) FROM tf_freezes"), 0);
    }
}

/// The freeze is judged again in the commit: an unlocked write whose body was still
/// arriving when the freeze committed is refused, and leaves nothing behind.
#[tokio::test]
async fn a_write_in_flight_when_the_freeze_commits_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = Env::start().await;
    assert_eq!(env.write("prod", 1, None).await.0, 200);
    let blobs = env.server.blob_files().len();
    let body = state(2, "lin-1", "").into_bytes();
    let auth = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        format!("stategate:{}", env.server.bearer("prod")),
    );
    let head = format!(
        "POST /api/v1/tf/state/prod HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let addr = env.server.base.trim_start_matches("http://");
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(head.as_bytes()).await.unwrap();
    sock.write_all(&body[..20]).await.unwrap();
    // The write has begun (its early look found no freeze) when the freeze commits.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    env.freeze("prod", json!({"reason": "now"})).await;
    sock.write_all(&body[20..]).await.unwrap();
    let mut out = Vec::new();
    let _ = sock.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out);
    assert_eq!(common::status_line_code(&text), 423, "{text}");
    assert!(text.contains("stategate-freeze-prod"), "{text}");
    assert_eq!(env.server.count("SELECT max(version) FROM versions"), 1);
    assert_eq!(
        env.server.blob_files().len(),
        blobs,
        "the refused write left a blob"
    );
}

/// A freeze answers only after the credential: without it (or with another
/// workspace's) LOCK and POST get the same 401 as ever, never the reason.
#[tokio::test]
async fn a_freeze_never_answers_before_authentication() {
    let env = Env::start().await;
    env.freeze("prod", json!({"reason": "secret-ish reason"}))
        .await;
    let other = env.server.bearer("dev");
    // Issued tokens that must not learn the freeze either: expired, revoked, another
    // workspace's, and one whose scope cannot write.
    let server = &env.server;
    let issue = |name: &'static str, ws: &'static str, scope, expires_in| async move {
        let grant = stategate::tofu::credentials::Grant {
            patterns: vec![stategate::names::Pattern::parse(ws).unwrap()],
            scope,
            include_sensitive: false,
        };
        let new = stategate::tofu::credentials::NewWorkspaceToken {
            name: name.into(),
            grant,
            expires_in,
        };
        server
            .app
            .tofu
            .create_token(new, "operator:test")
            .await
            .unwrap()
            .0
    };
    use stategate::tofu::access::Scope;
    let expired = issue("old", "prod", Scope::Write, Some(-1)).await;
    let revoked = issue("gone", "prod", Scope::Write, None).await;
    env.server
        .app
        .tofu
        .revoke_token("gone", "operator:test")
        .await
        .unwrap();
    let elsewhere = issue("dev-ci", "dev", Scope::Write, None).await;
    let outputs = issue("outs", "prod", Scope::Outputs, None).await;
    let before = env.snapshot();
    for (method, body) in [("LOCK", lock_info("x")), ("POST", state(1, "l", ""))] {
        for password in [
            None,
            Some("wrong"),
            Some(other.as_str()),
            Some(expired.as_str()),
            Some(revoked.as_str()),
            Some(elsewhere.as_str()),
            Some(outputs.as_str()),
        ] {
            let req = env
                .server
                .tf_as(method, "prod", password)
                .body(body.clone());
            let (code, text) = status(req).await;
            assert_eq!(code, 401, "{method} {password:?}: {text}");
            assert!(!text.contains("secret-ish"), "{text}");
        }
    }
    assert_eq!(env.snapshot(), before, "a refusal changed something");
}

/// Issue 38, item 10: a freeze is visible wherever a lock is — the admin API listing,
/// the web UI's workspace list and page (its end formatted like every time, and no
/// claim that every Terraform prints the reason) — the rollback preview warns and
/// offers no rollback, the refused rollback says in words that the workspace is
/// frozen and changes nothing, and the audit page shows the end as a time, not as
/// Unix seconds.
#[tokio::test]
async fn a_freeze_is_shown_wherever_a_lock_is_and_a_rollback_says_so() {
    let env = Env::start().await;
    assert_eq!(env.write("prod", 1, None).await.0, 200);
    assert_eq!(env.write("prod", 2, None).await.0, 200);
    let done = env
        .freeze("prod", json!({"reason": "incident 42", "for": "3h"}))
        .await;
    let until = done["freeze"]["until"].as_i64().unwrap();

    // The admin API's listing (the CLI's `workspace list --json` is the same value).
    let (code, text) = env.admin("GET", "workspaces", None).await;
    assert_eq!(code, 200, "{text}");
    let listed: Value = serde_json::from_str(&text).unwrap();
    let prod = &listed["workspaces"][0];
    assert_eq!(prod["frozen"]["reason"], "incident 42", "{prod}");
    assert_eq!(prod["frozen"]["until"], until);
    // The admin API's preview carries the freeze.
    let (code, text) = env
        .admin("GET", "workspaces/prod/rollback?to=1", None)
        .await;
    assert_eq!(code, 200, "{text}");
    let preview: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(preview["frozen"]["reason"], "incident 42", "{preview}");

    let ui = common::ui_session(&env.server.base, &env.token).await;
    let page = |path: &'static str| {
        let ui = ui.clone();
        let base = env.server.base.clone();
        async move { status(ui.get(format!("{base}{path}"))).await }
    };
    // The list: a frozen badge, the reason and the end, not "unlocked".
    let (code, list) = page("/ui/workspaces").await;
    assert_eq!(code, 200, "{list}");
    let row = &list[list.find("<tbody>").unwrap()..];
    assert!(row.contains(">frozen</span>"), "{row}");
    assert!(row.contains("incident 42"), "{row}");
    assert!(row.contains("UTC</span> · in "), "{row}");
    assert!(!row.contains("unlocked"), "{row}");
    // The card: the end as every time is shown; no promise every client prints it.
    let (_, ws) = page("/ui/workspaces/prod").await;
    let card = &ws[ws.find(r#"id="freeze""#).unwrap()..];
    let card = &card[..card.find("</section>").unwrap()];
    assert!(card.contains("UTC</span> · in "), "{card}");
    assert!(!card.contains("Z</dd>"), "raw RFC 3339: {card}");
    assert!(!card.contains("Terraform prints the reason"), "{card}");
    assert!(card.contains("Terraform 1.11"), "{card}");
    // The rollback preview warns and offers no rollback.
    let (code, preview) = page("/ui/workspaces/prod/rollback?to=1").await;
    assert_eq!(code, 200, "{preview}");
    assert!(preview.contains(r#"id="frozen-refusal""#), "{preview}");
    assert!(preview.contains("incident 42"), "{preview}");
    let button = &preview[preview.find(r#"<button class="danger""#).unwrap()..];
    assert!(
        button[..button.find('>').unwrap()].contains("disabled"),
        "{button}"
    );
    // Sent anyway: refused in words, nothing changed.
    let before = env.snapshot();
    let (_, ws_page) = page("/ui/workspaces").await;
    let at = ws_page.find(r#"name="csrf" value=""#).unwrap() + 19;
    let csrf = ws_page[at..].split('"').next().unwrap().to_string();
    let r = ui
        .post(format!("{}/ui/workspaces/prod/rollback", env.server.base))
        .form(&[
            ("csrf", csrf.as_str()),
            ("to", "1"),
            ("from", "2"),
            ("confirm", "prod"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 423);
    let refused = r.text().await.unwrap();
    assert!(refused.contains("workspace prod is frozen"), "{refused}");
    assert!(refused.contains("incident 42"), "{refused}");
    assert!(refused.contains("unfreeze"), "{refused}");
    assert!(!refused.contains("locked by"), "{refused}");
    assert_eq!(env.snapshot(), before);
    // The audit page: the end as a time.
    let (_, audit) = page("/ui/audit?event=tf.frozen").await;
    assert!(!audit.contains(&until.to_string()), "{audit}");
    assert!(
        audit.contains("<span class=\"key\">until</span> <time"),
        "{audit}"
    );
}
