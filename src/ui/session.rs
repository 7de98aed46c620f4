//! Operator sessions of the web UI, kept server-side. Logging in with an operator
//! token opens a session: a random id (`sgs_`) goes to the browser as a cookie, and
//! `crate::tokens` keeps only its SHA-256, issued under the operator token it was
//! opened with and with an absolute expiry. A session ends at its expiry, at logout
//! (revoked, like every token), or as soon as that operator token is revoked (a token
//! issued under another is live only while that one is). Its CSRF token is derived
//! from the session id, so nothing else is stored, and a page's forms carry it.
//!
//! A single sign-on session is issued under no token: it lasts `oidc.session_max_age`
//! at most, and `ui::oidc` re-checks it at the provider every `oidc.revalidate_seconds`;
//! [`regrant`] gives its operator the grant found then, [`end_sso`] ends it (audited).

use crate::store::sql::Connection;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::cluster::identity::AdminError;
use crate::error::Error;
use crate::operator::admin_error;
use crate::operator::identity::{
    live_operator_token, operator_by_id, sso_operator, Operator, SsoUser,
};
use crate::store::audit::{insert_audit, AuditEntry};
use crate::store::Db;
use crate::tokens::{self, Kind, NewToken};

/// Name of the session cookie.
pub const COOKIE: &str = "sg_session";
/// How long a session lasts from login (absolute, not sliding).
pub const LIFETIME_SECONDS: i64 = 12 * 3600;

const CSRF_PREFIX: &str = "csrf_";
/// Separates the CSRF token's hash from the session id's (the stored one).
const CSRF_LABEL: &[u8] = b"stategate ui csrf\0";

/// The CSRF token of the session whose cookie value is `cookie_value`: unguessable
/// without the cookie, and not the stored hash of the id.
fn csrf_of(cookie_value: &str) -> String {
    let digest = Sha256::new()
        .chain_update(CSRF_LABEL)
        .chain_update(cookie_value.as_bytes())
        .finalize();
    format!("{CSRF_PREFIX}{}", hex::encode(digest))
}

/// A live session: who it belongs to and the CSRF token its forms carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiSession {
    pub operator: Operator,
    pub csrf: String,
    /// The SHA-256 of the session id (what `tokens` and `ui::oidc` key it on).
    pub sha256: String,
    /// Opened by single sign-on (issued under no operator token).
    pub sso: bool,
}

/// A session just opened: the cookie value (the only time it exists in clear).
#[derive(Debug)]
pub struct Opened {
    pub cookie_value: String,
    pub session: UiSession,
}

/// Opens a session for the holder of operator `token`; `None` when the token is not a
/// live operator token (nothing is stored then). Expired sessions are swept here, and
/// the login is audited (`ui.login`, scope `operators`, no secret in the payload).
pub fn open(conn: &Connection, token: &[u8], now: i64) -> Result<Option<Opened>, AdminError> {
    let Some((token_sha256, operator)) = live_operator_token(conn, token, now)? else {
        return Ok(None);
    };
    issue(
        conn,
        operator,
        Some(&token_sha256),
        serde_json::json!({}),
        LIFETIME_SECONDS,
        now,
    )
    .map(Some)
}

/// Opens a session for a single sign-on user (`ui::oidc`): its operator is made or
/// updated with `user.grant` (`operator::identity::sso_operator`), then the session is
/// issued as for a token login, but under no operator token (it ends at its expiry or
/// logout). `None`, with nothing stored, when the user's name belongs to another
/// operator. Audited as `ui.login` with method `oidc`, the issuer, subject and email.
pub fn open_sso(
    conn: &Connection,
    user: SsoUser<'_>,
    email: Option<&str>,
    lifetime: i64,
    now: i64,
) -> Result<Option<Opened>, AdminError> {
    let Some(operator) = sso_operator(conn, user)? else {
        return Ok(None);
    };
    let payload = serde_json::json!({
        "method": "oidc",
        "issuer": user.issuer,
        "subject": user.subject,
        "email": email,
        "role": operator.grant.role.as_str(),
        "workspaces": operator.grant.workspaces(),
    });
    issue(
        conn,
        operator,
        None,
        payload,
        lifetime.min(LIFETIME_SECONDS),
        now,
    )
    .map(Some)
}

/// Gives the operator of a single sign-on session the grant its provider names today,
/// held under the operator's cap if it has one (`operator::identity`: no re-grant
/// exceeds it); a change from the grant stored now (read here, in the write
/// transaction: a request racing this one through another node may have made the
/// change already) is audited (`ui.sso_regrant`: what it held and holds now, and what
/// its groups gave when a cap held them back). The operator as it is now.
pub fn regrant(
    conn: &Connection,
    session: &UiSession,
    grant: &crate::operator::roles::Grant,
) -> Result<Option<Operator>, AdminError> {
    let Some(current) = operator_by_id(conn, session.operator.id)? else {
        return Ok(None);
    };
    if crate::operator::identity::granted(conn, current.id)?.as_ref() == Some(grant) {
        return Ok(Some(current));
    }
    crate::operator::identity::set_grant(conn, current.id, grant)?;
    let Some(now) = operator_by_id(conn, current.id)? else {
        return Ok(None);
    };
    use crate::operator::identity::grant_json;
    let mut payload = grant_json(Some(&now.grant));
    payload["method"] = "oidc".into();
    payload["from"] = grant_json(Some(&current.grant));
    if &now.grant != grant {
        payload["groups"] = grant_json(Some(grant));
    }
    audit(conn, &current, "ui.sso_regrant", payload)?;
    Ok(Some(now))
}

/// Ends a single sign-on session the provider no longer vouches for (revoked like a
/// logout) and audits it (`ui.session_ended`, with a fixed reason word) once: requests
/// of the session that were in flight when it ended (on any node) end it again, and
/// find it ended.
pub fn end_sso(conn: &Connection, session: &UiSession, reason: &str) -> Result<(), AdminError> {
    if !tokens::revoke(conn, &session.sha256, &crate::store::now_rfc3339())? {
        return Ok(());
    }
    let payload = serde_json::json!({ "method": "oidc", "reason": reason });
    audit(conn, &session.operator, "ui.session_ended", payload)
}

/// An audit row of `operator` in scope `operators` (`payload` never holds a secret).
fn audit(
    conn: &Connection,
    operator: &Operator,
    event: &'static str,
    payload: serde_json::Value,
) -> Result<(), AdminError> {
    insert_audit(
        conn,
        &AuditEntry::new(operator.actor(), "operators", event, payload),
    )?;
    Ok(())
}

/// Issues the session of `operator` (live only while `parent` is, when given), sweeping
/// expired sessions first, and audits the login (`ui.login`, scope `operators`) with
/// `payload`, which never holds a secret.
fn issue(
    conn: &Connection,
    operator: Operator,
    parent: Option<&str>,
    payload: serde_json::Value,
    lifetime: i64,
    now: i64,
) -> Result<Opened, AdminError> {
    tokens::sweep_expired(conn, Kind::Session, now)?;
    let issued = tokens::issue(
        conn,
        NewToken {
            kind: Kind::Session,
            owner_id: Some(operator.id),
            parent,
            expires_at: Some(now + lifetime),
        },
    )?;
    audit(conn, &operator, "ui.login", payload)?;
    let csrf = csrf_of(&issued.secret);
    let session = UiSession {
        operator,
        csrf,
        sha256: tokens::hash(issued.secret.as_bytes()),
        sso: parent.is_none(),
    };
    Ok(Opened {
        cookie_value: issued.secret,
        session,
    })
}

/// The live session a cookie value names: not expired or logged out, and its operator
/// token not revoked.
pub fn find(
    conn: &Connection,
    cookie_value: &str,
    now: i64,
) -> Result<Option<UiSession>, crate::store::sql::Error> {
    let Some(live) = tokens::live(conn, Kind::Session, cookie_value.as_bytes(), now)? else {
        return Ok(None);
    };
    let Some(owner) = live.owner_id else {
        return Ok(None);
    };
    Ok(operator_by_id(conn, owner)?.map(|operator| UiSession {
        operator,
        csrf: csrf_of(cookie_value),
        sso: live.parent.is_none(),
        sha256: live.sha256,
    }))
}

/// Ends the session a cookie value names (logout): revoked like any token. Ending an
/// unknown or ended one is not an error.
pub fn close(conn: &Connection, cookie_value: &str) -> Result<(), AdminError> {
    tokens::revoke(
        conn,
        &tokens::hash(cookie_value.as_bytes()),
        &crate::store::now_rfc3339(),
    )?;
    Ok(())
}

/// The UI's sessions over the index, for `http::ui`: each operation is one transaction
/// of its own, composed here, so the edge passes plain values and maps the answer.
#[derive(Clone)]
pub struct Sessions {
    pub(super) db: Db,
}

impl Sessions {
    pub fn new(db: Db) -> Sessions {
        Sessions { db }
    }

    /// A change to sessions (and their audit rows), in one write transaction.
    pub(super) async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, AdminError> + Send + 'static,
    ) -> Result<T, Error> {
        self.db.write(f).await.map_err(admin_error)
    }

    /// The live session `cookie_value` names ([`find`]), on a reader.
    pub async fn find(&self, cookie_value: &str, now: i64) -> Result<Option<UiSession>, Error> {
        let cookie_value = cookie_value.to_string();
        Ok(self.db.read(move |c| find(c, &cookie_value, now)).await?)
    }

    /// A login with operator `token` ([`open`]).
    pub async fn log_in(&self, token: Vec<u8>, now: i64) -> Result<Option<Opened>, Error> {
        self.write(move |conn| open(conn, &token, now)).await
    }

    /// Logout: the session `cookie_value` names ends, and so does the following of its
    /// single sign-on (`sso_rows`, keyed by the session's id hash `followed`), in one
    /// transaction, so no node re-checks a session that has ended.
    pub async fn log_out(&self, cookie_value: &str, followed: &str) -> Result<(), Error> {
        let (cookie_value, followed) = (cookie_value.to_string(), followed.to_string());
        self.write(move |conn| {
            close(conn, &cookie_value)?;
            Ok(super::sso_rows::forget(conn, &followed)?)
        })
        .await
    }

    /// The single sign-on session `me` with the grant its provider gives today
    /// ([`regrant`]); `None` when its operator is gone.
    pub(super) async fn regrant(
        &self,
        me: UiSession,
        grant: crate::operator::roles::Grant,
    ) -> Result<Option<UiSession>, Error> {
        self.write(move |conn| {
            let operator = regrant(conn, &me, &grant)?;
            Ok(operator.map(|operator| UiSession { operator, ..me }))
        })
        .await
    }

    /// Ends the single sign-on session `me` for `reason` ([`end_sso`]).
    pub(super) async fn end_sso(&self, me: UiSession, reason: &'static str) -> Result<(), Error> {
        self.write(move |conn| end_sso(conn, &me, reason)).await
    }
}

/// Does a submitted form's CSRF token match the session's? Constant time.
pub fn csrf_matches(session: &UiSession, submitted: Option<&str>) -> bool {
    submitted.is_some_and(|s| bool::from(s.as_bytes().ct_eq(session.csrf.as_bytes())))
}

/// The `Set-Cookie` value that hands `cookie_value` to the browser.
pub fn set_cookie(cookie_value: &str, secure: bool) -> String {
    set_cookie_for(cookie_value, LIFETIME_SECONDS, secure)
}

/// As [`set_cookie`], for a session that lasts `max_age` seconds.
pub fn set_cookie_for(cookie_value: &str, max_age: i64, secure: bool) -> String {
    cookie(cookie_value, max_age, secure)
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn clear_cookie(secure: bool) -> String {
    cookie("", 0, secure)
}

fn cookie(value: &str, max_age: i64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/ui; Max-Age={max_age}{secure}")
}

/// The session cookie's value in a `Cookie` request header, if present.
pub fn from_cookie_header(header: &str) -> Option<&str> {
    cookie_in(header, COOKIE)
}

/// The non-empty value of cookie `name` in one `Cookie` header.
pub fn cookie_in<'h>(header: &'h str, name: &str) -> Option<&'h str> {
    header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| value.trim())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::identity::tests::test_db;
    use crate::operator::identity::{create_operator, list_operator_tokens, revoke_operator_token};
    use crate::store::sql::OptionalExtension;

    #[test]
    fn cookie_headers() {
        let table = [
            ("sg_session=abc", Some("abc")),
            ("a=1; sg_session=abc; b=2", Some("abc")),
            ("sg_session=", None),
            ("x_sg_session=abc", None),
            ("other=1", None),
            ("", None),
        ];
        for (header, want) in table {
            assert_eq!(from_cookie_header(header), want, "{header}");
        }
        assert_eq!(
            set_cookie("v", true),
            "sg_session=v; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=43200; Secure"
        );
        assert_eq!(
            clear_cookie(false),
            "sg_session=; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=0"
        );
    }

    #[test]
    fn sessions_live_until_expiry_logout_or_token_revocation() {
        let (_dir, conn) = test_db();
        let token = create_operator(&conn, "ops@x", "test").unwrap();
        let now = 1_000_000;
        assert!(open(&conn, b"sgo_wrong", now).unwrap().is_none());
        let opened = open(&conn, token.as_bytes(), now).unwrap().unwrap();
        let stored: String = conn
            .query_row(
                "SELECT sha256 FROM tokens WHERE kind = 'session'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_ne!(stored, opened.cookie_value, "only the hash is stored");
        assert_eq!(stored, tokens::hash(opened.cookie_value.as_bytes()));
        assert_ne!(
            opened.session.csrf, stored,
            "the CSRF token is not the stored hash"
        );
        assert!(opened.session.csrf.starts_with(CSRF_PREFIX));
        let unknown: Option<String> = conn
            .query_row(
                "SELECT sha256 FROM tokens WHERE sha256 = ?1",
                [opened.session.csrf.as_str()],
                |r| r.get(0),
            )
            .optional()
            .unwrap();
        assert_eq!(unknown, None);
        let found = find(&conn, &opened.cookie_value, now + 1).unwrap().unwrap();
        assert_eq!(found, opened.session);
        assert!(csrf_matches(&found, Some(&found.csrf)));
        for bad in [None, Some(""), Some("csrf_x"), Some(&found.csrf[1..])] {
            assert!(!csrf_matches(&found, bad), "{bad:?}");
        }
        assert!(find(&conn, "sgs_other", now).unwrap().is_none());
        assert!(find(&conn, &opened.cookie_value, now + LIFETIME_SECONDS)
            .unwrap()
            .is_none());

        // Logout ends one session; revoking the token ends every session it opened.
        let second = open(&conn, token.as_bytes(), now).unwrap().unwrap();
        close(&conn, &opened.cookie_value).unwrap();
        assert!(find(&conn, &opened.cookie_value, now).unwrap().is_none());
        assert!(find(&conn, &second.cookie_value, now).unwrap().is_some());
        let id = list_operator_tokens(&conn).unwrap()[0].id.clone();
        revoke_operator_token(&conn, &id, "test").unwrap();
        assert!(find(&conn, &second.cookie_value, now).unwrap().is_none());
    }
}
