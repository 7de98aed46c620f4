//! Operators: site-wide identities (workspaces belong to no org) that use the admin
//! API and whose actions the audit log names. Tokens are made, hashed and looked up
//! exactly like the cluster API's (`cluster::identity`: 32 random bytes, stored only as
//! SHA-256, looked up by hash so the token never reaches SQL), with the `sgo_` prefix;
//! a revoked token keeps its row (revoked_at) so listings show what was revoked.

use rusqlite::{params, Connection, OptionalExtension};

use crate::cluster::identity::{
    new_token_with_prefix, normalize_email, parse_token_id, token_hash, token_id, AdminError,
    TokenRow,
};
use crate::store::audit::{insert_audit, AuditEntry};

/// The operator tables; `crate::schema` applies them.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS operators (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    email       TEXT NOT NULL UNIQUE,
    created_at  TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS operator_tokens (
    token_sha256 TEXT PRIMARY KEY,       -- hex SHA-256 of the bearer token; the token itself is never stored
    operator_id  INTEGER NOT NULL REFERENCES operators(id),
    created_at   TEXT NOT NULL,
    revoked_at   TEXT
) WITHOUT ROWID;
"#;

/// Prefix of every operator token.
pub const OPERATOR_TOKEN_PREFIX: &str = "sgo_";

/// An authenticated operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub id: i64,
    pub email: String,
}

impl Operator {
    /// How the audit log and version rows name this operator.
    pub fn actor(&self) -> String {
        format!("operator:{}", self.email)
    }
}

/// The operator a presented token belongs to, if it exists and is not revoked.
pub fn operator_by_token(
    conn: &Connection,
    token: &[u8],
) -> Result<Option<Operator>, rusqlite::Error> {
    conn.query_row(
        "SELECT o.id, o.email FROM operator_tokens t JOIN operators o ON o.id = t.operator_id
          WHERE t.token_sha256 = ?1 AND t.revoked_at IS NULL",
        [token_hash(token)],
        |r| {
            Ok(Operator {
                id: r.get(0)?,
                email: r.get(1)?,
            })
        },
    )
    .optional()
}

fn audit(
    conn: &Connection,
    actor: &str,
    event: &'static str,
    payload: serde_json::Value,
) -> Result<(), AdminError> {
    let entry = AuditEntry {
        actor: actor.to_string(),
        org: None,
        scope: "operators".into(),
        event,
        payload,
    };
    insert_audit(conn, &entry)?;
    Ok(())
}

fn insert_token(conn: &Connection, operator_id: i64) -> Result<String, AdminError> {
    let token = new_token_with_prefix(OPERATOR_TOKEN_PREFIX)?;
    conn.execute(
        "INSERT INTO operator_tokens (token_sha256, operator_id, created_at) VALUES (?1, ?2, ?3)",
        params![
            token_hash(token.as_bytes()),
            operator_id,
            crate::store::now_rfc3339()
        ],
    )?;
    Ok(token)
}

/// Creates an operator and its first token (returned: the only time it exists in clear).
pub fn create_operator(conn: &Connection, email: &str, actor: &str) -> Result<String, AdminError> {
    let email = normalize_email(email)?;
    let inserted = conn.execute(
        "INSERT INTO operators (email, created_at) VALUES (?1, ?2) ON CONFLICT (email) DO NOTHING",
        params![email, crate::store::now_rfc3339()],
    )?;
    if inserted == 0 {
        return Err(AdminError::Exists(format!(
            "an operator with email {email:?} already exists (use `admin operator token create` for another token)"
        )));
    }
    let token = insert_token(conn, conn.last_insert_rowid())?;
    audit(
        conn,
        actor,
        "admin.operator_created",
        serde_json::json!({ "email": email }),
    )?;
    Ok(token)
}

/// Another token for an existing operator (earlier tokens stay valid).
pub fn create_operator_token(
    conn: &Connection,
    email: &str,
    actor: &str,
) -> Result<String, AdminError> {
    let email = normalize_email(email)?;
    let id: i64 = conn
        .query_row("SELECT id FROM operators WHERE email = ?1", [&email], |r| {
            r.get(0)
        })
        .optional()?
        .ok_or_else(|| AdminError::NotFound(format!("no operator with email {email:?}")))?;
    let token = insert_token(conn, id)?;
    let payload =
        serde_json::json!({ "email": email, "token_id": token_id(&token_hash(token.as_bytes())) });
    audit(conn, actor, "admin.operator_token_created", payload)?;
    Ok(token)
}

/// Every operator token (ids only, revoked ones included), by operator.
pub fn list_operator_tokens(conn: &Connection) -> Result<Vec<TokenRow>, AdminError> {
    let mut stmt = conn.prepare(
        "SELECT t.token_sha256, o.email, t.created_at, t.revoked_at FROM operator_tokens t
           JOIN operators o ON o.id = t.operator_id ORDER BY o.email, t.created_at",
    )?;
    let rows = stmt
        .query_map([], |r| {
            Ok(TokenRow {
                id: token_id(&r.get::<_, String>(0)?),
                email: r.get(1)?,
                created_at: r.get(2)?,
                revoked_at: r.get(3)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// Revokes an operator token by id: it stops working at once. Audited as
/// `admin.operator_token_revoked`; revoking a revoked token is an error (nothing to do).
pub fn revoke_operator_token(conn: &Connection, id: &str, actor: &str) -> Result<(), AdminError> {
    let id = parse_token_id(id)?;
    let found: Vec<(String, String)> = conn
        .prepare(
            "SELECT t.token_sha256, o.email FROM operator_tokens t JOIN operators o ON o.id = t.operator_id
              WHERE substr(t.token_sha256, 1, 12) = ?1 AND t.revoked_at IS NULL",
        )?
        .query_map([&id], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let [(hash, email)] = found.as_slice() else {
        return Err(AdminError::NotFound(format!(
            "no unrevoked operator token with id {id}"
        )));
    };
    conn.execute(
        "UPDATE operator_tokens SET revoked_at = ?1 WHERE token_sha256 = ?2",
        params![crate::store::now_rfc3339(), hash],
    )?;
    audit(
        conn,
        actor,
        "admin.operator_token_revoked",
        serde_json::json!({ "email": email, "token_id": id }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::identity::tests::test_db;
    use crate::store::audit::list_audit;

    #[test]
    fn operator_lifecycle() {
        let (_dir, conn) = test_db();
        let t1 = create_operator(&conn, "Ops@X", "cli:root").unwrap();
        assert!(t1.starts_with(OPERATOR_TOKEN_PREFIX));
        assert!(matches!(
            create_operator(&conn, "ops@x", "cli:root"),
            Err(AdminError::Exists(_))
        ));
        assert!(matches!(
            create_operator(&conn, "nope", "cli:root"),
            Err(AdminError::Invalid(_))
        ));
        let t2 = create_operator_token(&conn, "ops@x", "cli:root").unwrap();
        assert!(create_operator_token(&conn, "who@x", "cli:root").is_err());
        let me = operator_by_token(&conn, t1.as_bytes()).unwrap().unwrap();
        assert_eq!(
            (me.email.as_str(), me.actor()),
            ("ops@x", "operator:ops@x".to_string())
        );
        // A cluster-API token is not an operator token, and the other way round.
        assert_eq!(operator_by_token(&conn, b"sgo_wrong").unwrap(), None);
        assert_eq!(
            crate::cluster::identity::principal_by_token(&conn, t1.as_bytes()).unwrap(),
            None
        );

        let listed = list_operator_tokens(&conn).unwrap();
        assert_eq!(listed.len(), 2);
        let text = serde_json::to_string(&listed).unwrap();
        assert!(!text.contains(&t1) && !text.contains(&t2));
        let id1 = token_id(&token_hash(t1.as_bytes()));
        revoke_operator_token(&conn, &id1, &me.actor()).unwrap();
        assert!(
            revoke_operator_token(&conn, &id1, &me.actor()).is_err(),
            "already revoked"
        );
        assert!(revoke_operator_token(&conn, "x", &me.actor()).is_err());
        assert_eq!(operator_by_token(&conn, t1.as_bytes()).unwrap(), None);
        assert!(operator_by_token(&conn, t2.as_bytes()).unwrap().is_some());
        let revoked: Vec<bool> = list_operator_tokens(&conn)
            .unwrap()
            .iter()
            .map(|t| t.revoked_at.is_some())
            .collect();
        assert_eq!(revoked.iter().filter(|r| **r).count(), 1);

        let events: Vec<(String, String)> = list_audit(&conn, Some("operators"), None, 10)
            .unwrap()
            .into_iter()
            .map(|r| (r.event, r.actor))
            .collect();
        assert_eq!(
            events,
            [
                ("admin.operator_created".to_string(), "cli:root".to_string()),
                ("admin.operator_token_created".into(), "cli:root".into()),
                (
                    "admin.operator_token_revoked".into(),
                    "operator:ops@x".into()
                ),
            ]
        );
        let all = list_audit(&conn, Some("operators"), None, 10).unwrap();
        assert!(
            !serde_json::to_string(&all).unwrap().contains(&t2),
            "no token in the audit log"
        );
    }
}
