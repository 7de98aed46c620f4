//! Operator sessions of the web UI, kept server-side. Logging in with an operator
//! token opens a session: a random id goes to the browser as a cookie, and only its
//! SHA-256 is stored, beside the hash of the operator token it was opened with, a
//! per-session CSRF token and an absolute expiry. A session ends at its expiry, at
//! logout, or as soon as that operator token is revoked (every lookup joins the
//! token's row, so revocation needs no extra step here).

use rusqlite::{params, Connection, OptionalExtension};
use subtle::ConstantTimeEq;

use crate::cluster::identity::{new_token_with_prefix, token_hash, AdminError};
use crate::operator::identity::{operator_by_token, Operator};
use crate::store::audit::{insert_audit, AuditEntry};

/// The session table; `crate::schema` applies it.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS ui_sessions (
    id_sha256    TEXT PRIMARY KEY,       -- hex SHA-256 of the cookie value; the id itself is never stored
    token_sha256 TEXT NOT NULL,          -- the operator token it was opened with (operator_tokens)
    csrf         TEXT NOT NULL,          -- carried by every state-changing form of this session
    created_at   TEXT NOT NULL,
    expires_at   INTEGER NOT NULL        -- unix seconds
) WITHOUT ROWID;
"#;

/// Name of the session cookie.
pub const COOKIE: &str = "sg_session";
/// How long a session lasts from login (absolute, not sliding).
pub const LIFETIME_SECONDS: i64 = 12 * 3600;

const SESSION_PREFIX: &str = "sgs_";
const CSRF_PREFIX: &str = "csrf_";

/// A live session: who it belongs to and the CSRF token its forms carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiSession {
    pub operator: Operator,
    pub csrf: String,
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
    let Some(operator) = operator_by_token(conn, token)? else {
        return Ok(None);
    };
    conn.execute("DELETE FROM ui_sessions WHERE expires_at <= ?1", [now])?;
    let cookie_value = new_token_with_prefix(SESSION_PREFIX)?;
    let csrf = new_token_with_prefix(CSRF_PREFIX)?;
    conn.execute(
        "INSERT INTO ui_sessions (id_sha256, token_sha256, csrf, created_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            token_hash(cookie_value.as_bytes()),
            token_hash(token),
            csrf,
            crate::store::now_rfc3339(),
            now + LIFETIME_SECONDS
        ],
    )?;
    insert_audit(
        conn,
        &AuditEntry {
            actor: operator.actor(),
            org: None,
            scope: "operators".into(),
            event: "ui.login",
            payload: serde_json::json!({}),
        },
    )?;
    Ok(Some(Opened {
        cookie_value,
        session: UiSession { operator, csrf },
    }))
}

/// The live session a cookie value names: not expired, and its operator token not revoked.
pub fn find(
    conn: &Connection,
    cookie_value: &str,
    now: i64,
) -> Result<Option<UiSession>, rusqlite::Error> {
    conn.query_row(
        "SELECT o.id, o.email, s.csrf FROM ui_sessions s
           JOIN operator_tokens t ON t.token_sha256 = s.token_sha256 AND t.revoked_at IS NULL
           JOIN operators o ON o.id = t.operator_id
          WHERE s.id_sha256 = ?1 AND s.expires_at > ?2",
        params![token_hash(cookie_value.as_bytes()), now],
        |r| {
            Ok(UiSession {
                operator: Operator {
                    id: r.get(0)?,
                    email: r.get(1)?,
                },
                csrf: r.get(2)?,
            })
        },
    )
    .optional()
}

/// Ends the session a cookie value names (logout). Ending an unknown one is not an error.
pub fn close(conn: &Connection, cookie_value: &str) -> Result<(), AdminError> {
    conn.execute(
        "DELETE FROM ui_sessions WHERE id_sha256 = ?1",
        [token_hash(cookie_value.as_bytes())],
    )?;
    Ok(())
}

/// Does a submitted form's CSRF token match the session's? Constant time.
pub fn csrf_matches(session: &UiSession, submitted: Option<&str>) -> bool {
    submitted.is_some_and(|s| bool::from(s.as_bytes().ct_eq(session.csrf.as_bytes())))
}

/// The `Set-Cookie` value that hands `cookie_value` to the browser.
pub fn set_cookie(cookie_value: &str, secure: bool) -> String {
    cookie(cookie_value, LIFETIME_SECONDS, secure)
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
    header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::identity::tests::test_db;
    use crate::operator::identity::{create_operator, list_operator_tokens, revoke_operator_token};

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
            .query_row("SELECT id_sha256 FROM ui_sessions", [], |r| r.get(0))
            .unwrap();
        assert_ne!(stored, opened.cookie_value, "only the hash is stored");
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
