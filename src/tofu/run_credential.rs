//! Credentials issued for one drift run: the child of run N presents its own secret
//! (as `TF_HTTP_PASSWORD`) instead of the workspace bearer, so every lock it takes
//! records that it was run N's (`tf_locks.credential = "drift:run-N"`), and recovering
//! an abandoned run clears exactly the locks its child took — never a human's lock
//! that merely looks alike (issue 20 item 4).
//!
//! A secret is made and hashed by `crate::tokens` (`sgr_` + 32 random bytes in
//! base64url, stored only as its SHA-256) and kept in this module's own table: it is
//! the backend's to accept, for its one workspace, until it is revoked (in the
//! transaction that finishes or closes the run) or its expiry passes (the run's
//! timeout plus a margin, so a crash that never closes the run still ends it).

use crate::store::sql::{params, Connection, OptionalExtension};

/// The run credentials table; `crate::schema` applies it.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tf_run_credentials (
    token_sha256  TEXT PRIMARY KEY,  -- hex SHA-256 of the secret; the secret is never stored
    workspace     TEXT NOT NULL,
    name          TEXT NOT NULL UNIQUE,
    expires_unix  INTEGER NOT NULL
) WITHOUT ROWID;
"#;

/// What every run secret starts with (the backend looks a presented secret up only
/// when it has this form).
pub const PREFIX: &str = "sgr_";

/// The name a run's credential is recorded under (lock rows, audit actors).
pub fn name_of_run(run: i64) -> String {
    format!("drift:run-{run}")
}

/// A fresh secret and its hash (what is stored).
pub fn new_secret() -> Result<(String, String), String> {
    let secret = crate::tokens::generate(PREFIX).map_err(|e| e.to_string())?;
    let hash = crate::tokens::hash(secret.as_bytes());
    Ok((secret, hash))
}

/// Records the credential `name` for `workspace` (replacing an earlier one of the same
/// name: a run re-executed after a crash gets a new secret).
pub fn insert(
    conn: &Connection,
    token_sha256: &str,
    workspace: &str,
    name: &str,
    expires_unix: i64,
) -> Result<(), crate::store::sql::Error> {
    revoke(conn, name)?;
    conn.prepare_cached(
        "INSERT INTO tf_run_credentials (token_sha256, workspace, name, expires_unix) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![token_sha256, workspace, name, expires_unix])?;
    Ok(())
}

/// Ends the credential `name` (nothing when there is none).
pub fn revoke(conn: &Connection, name: &str) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached("DELETE FROM tf_run_credentials WHERE name = ?1")?
        .execute([name])?;
    Ok(())
}

/// Whether `secret` has a run credential's shape (its prefix).
pub fn is_run_shaped(secret: &[u8]) -> bool {
    secret.starts_with(PREFIX.as_bytes())
}

/// The name of the live credential `secret` is, for `workspace` only.
pub fn lookup(
    conn: &Connection,
    workspace: &str,
    secret: &[u8],
    now_unix: i64,
) -> Result<Option<String>, crate::store::sql::Error> {
    if !is_run_shaped(secret) {
        return Ok(None);
    }
    let hash = crate::tokens::hash(secret);
    conn.prepare_cached(
        "SELECT name FROM tf_run_credentials WHERE token_sha256 = ?1 AND workspace = ?2 AND expires_unix > ?3",
    )?
    .query_row(params![hash, workspace, now_unix], |r| r.get(0))
    .optional()
}

/// Whether the run credential `name` (`drift:run-N`) can still be used at `now`: its
/// row is there (a finished or closed run's is deleted) and not expired.
pub fn is_live(
    conn: &Connection,
    name: &str,
    now_unix: i64,
) -> Result<bool, crate::store::sql::Error> {
    let found: Option<i64> = conn
        .prepare_cached("SELECT expires_unix FROM tf_run_credentials WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()?;
    Ok(found.is_some_and(|expires| expires > now_unix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_credential_is_for_its_workspace_until_revoked_or_expired() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        let (secret, hash) = new_secret().unwrap();
        assert!(secret.starts_with(PREFIX) && secret.len() > 40);
        assert!(!hash.contains(&secret));
        insert(&conn, &hash, "prod", &name_of_run(7), 1000).unwrap();
        let found = |ws: &str, s: &str, now| lookup(&conn, ws, s.as_bytes(), now).unwrap();
        // (workspace, secret, now, expected)
        let other = new_secret().unwrap().0;
        let table: &[(&str, &str, i64, Option<&str>)] = &[
            ("prod", &secret, 999, Some("drift:run-7")),
            ("staging", &secret, 999, None),
            ("prod", &secret, 1000, None),
            ("prod", &other, 999, None),
            ("prod", &hash, 999, None),
            ("prod", "", 999, None),
        ];
        for (ws, s, now, want) in table {
            assert_eq!(found(ws, s, *now).as_deref(), *want, "{ws} {s} {now}");
        }
        let (again, again_hash) = new_secret().unwrap();
        insert(&conn, &again_hash, "prod", &name_of_run(7), 1000).unwrap();
        assert_eq!(
            found("prod", &secret, 0),
            None,
            "re-issued: the old secret is gone"
        );
        assert_eq!(found("prod", &again, 0).as_deref(), Some("drift:run-7"));
        assert!(is_live(&conn, &name_of_run(7), 999).unwrap());
        assert!(!is_live(&conn, &name_of_run(7), 1000).unwrap(), "expired");
        assert!(!is_live(&conn, &name_of_run(8), 0).unwrap(), "never issued");
        revoke(&conn, &name_of_run(7)).unwrap();
        assert_eq!(found("prod", &again, 0), None);
        assert!(
            !is_live(&conn, &name_of_run(7), 0).unwrap(),
            "its run finished"
        );
    }
}
