//! Workspace locks: at most one row per workspace in `tf_locks`, holding the
//! holder's LockInfo exactly as the client sent it.
//!
//! The rules are pure functions over the current holder and the request, like the
//! cluster API's leases (`cluster::lease`); the SQL around them always runs inside one
//! write transaction (and the writer check again inside each version commit).

use crate::store::sql::{params, Connection, OptionalExtension};

use super::protocol::UnlockRequest;

/// The workspace locks table; `crate::schema` applies it.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tf_locks (
    workspace   TEXT PRIMARY KEY,
    lock_id     TEXT NOT NULL,
    info        TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    -- who took it: `tf:<workspace>` (the workspace bearer) or a run's credential
    -- (`drift:run-N`, `run_credential`); NULL for locks taken before it was recorded
    credential  TEXT
) WITHOUT ROWID;
"#;

/// Brings a `tf_locks` table of an earlier release up to [`SCHEMA`] (the `credential`
/// column; its existing locks record none). Nothing when the table is new or current.
pub fn migrate(conn: &Connection) -> Result<(), crate::store::sql::Error> {
    let columns = |table: &str| -> Result<Vec<String>, crate::store::sql::Error> {
        conn.prepare("SELECT name FROM pragma_table_info(?1)")?
            .query_map([table], |r| r.get(0))?
            .collect()
    };
    let existing = columns("tf_locks")?;
    if !existing.is_empty() && !existing.iter().any(|c| c == "credential") {
        conn.execute_batch("ALTER TABLE tf_locks ADD COLUMN credential TEXT")?;
    }
    Ok(())
}

/// The lock row of a workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    pub id: String,
    /// The holder's LockInfo, verbatim: what a refused contender is shown.
    pub info: String,
}

/// What a LOCK does, given the current holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lock {
    /// Nobody holds it.
    Take,
    /// The caller already holds it (a retry after a lost response): nothing to do.
    AlreadyHeld,
    /// Someone else holds it: 423 with their LockInfo.
    Refuse,
}

pub fn decide_lock(held: Option<&HeldLock>, lock_id: &str) -> Lock {
    match held {
        None => Lock::Take,
        Some(holder) if holder.id == lock_id => Lock::AlreadyHeld,
        Some(_) => Lock::Refuse,
    }
}

/// What an UNLOCK does, given the current holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unlock {
    /// Nothing held: nothing to do (idempotent).
    Nothing,
    /// The holder's own ID, or Terraform's force-unlock (no ID): delete the lock.
    Release,
    /// Another ID than the holder's: 423 with the holder's LockInfo.
    Refuse,
}

pub fn decide_unlock(held: Option<&HeldLock>, request: &UnlockRequest) -> Unlock {
    match (held, request) {
        (None, _) => Unlock::Nothing,
        (Some(_), UnlockRequest::Force) => Unlock::Release,
        (Some(holder), UnlockRequest::Id(id)) if &holder.id == id => Unlock::Release,
        (Some(_), UnlockRequest::Id(_)) => Unlock::Refuse,
    }
}

/// May a state write (or delete, or rollback) carrying `lock_id` (`?ID=`) proceed?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Unlocked and no ID, or the holder's ID.
    Allow,
    /// An ID, but nobody holds the lock (released or force-unlocked meanwhile): 409.
    NotHeld,
    /// Someone holds it and the write is not theirs: 423 with their LockInfo.
    Refuse,
}

pub fn decide_write(held: Option<&HeldLock>, lock_id: Option<&str>) -> Write {
    match (held, lock_id) {
        (None, None) => Write::Allow,
        (None, Some(_)) => Write::NotHeld,
        (Some(holder), Some(id)) if holder.id == id => Write::Allow,
        (Some(_), _) => Write::Refuse,
    }
}

pub fn held_lock(
    conn: &Connection,
    workspace: &str,
) -> Result<Option<HeldLock>, crate::store::sql::Error> {
    conn.prepare_cached("SELECT lock_id, info FROM tf_locks WHERE workspace = ?1")?
        .query_row([workspace], |r| {
            Ok(HeldLock {
                id: r.get(0)?,
                info: r.get(1)?,
            })
        })
        .optional()
}

/// A workspace's lock and when it was taken (`created_at`, RFC 3339).
pub fn held_lock_since(
    conn: &Connection,
    workspace: &str,
) -> Result<Option<(HeldLock, String)>, crate::store::sql::Error> {
    conn.prepare_cached("SELECT lock_id, info, created_at FROM tf_locks WHERE workspace = ?1")?
        .query_row([workspace], |r| {
            let lock = HeldLock {
                id: r.get(0)?,
                info: r.get(1)?,
            };
            Ok((lock, r.get(2)?))
        })
        .optional()
}

/// The lock of a workspace with the name of the credential that took it (`None`
/// for a lock of an earlier release).
pub fn held_lock_credential(
    conn: &Connection,
    workspace: &str,
) -> Result<Option<(HeldLock, Option<String>)>, crate::store::sql::Error> {
    conn.prepare_cached("SELECT lock_id, info, credential FROM tf_locks WHERE workspace = ?1")?
        .query_row([workspace], |r| {
            Ok((
                HeldLock {
                    id: r.get(0)?,
                    info: r.get(1)?,
                },
                r.get(2)?,
            ))
        })
        .optional()
}

/// Every held lock: (workspace, lock, when it was taken).
pub fn all_locks(
    conn: &Connection,
) -> Result<Vec<(String, HeldLock, String)>, crate::store::sql::Error> {
    let mut stmt = conn.prepare("SELECT workspace, lock_id, info, created_at FROM tf_locks")?;
    let rows = stmt
        .query_map([], |r| {
            let lock = HeldLock {
                id: r.get(1)?,
                info: r.get(2)?,
            };
            Ok((r.get(0)?, lock, r.get(3)?))
        })?
        .collect();
    rows
}

/// Takes the lock of `workspace` for `lock`, recording the `credential` that took it.
pub fn put_lock(
    conn: &Connection,
    workspace: &str,
    lock: &HeldLock,
    credential: &str,
) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached(
        "INSERT INTO tf_locks (workspace, lock_id, info, created_at, credential) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        workspace,
        lock.id,
        lock.info,
        crate::store::now_rfc3339(),
        credential
    ])?;
    Ok(())
}

pub fn delete_lock(conn: &Connection, workspace: &str) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached("DELETE FROM tf_locks WHERE workspace = ?1")?
        .execute([workspace])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(id: &str) -> HeldLock {
        HeldLock {
            id: id.into(),
            info: format!(r#"{{"ID":"{id}"}}"#),
        }
    }

    #[test]
    fn lock_decisions() {
        // (holder, LOCK with ID, expected)
        let table: &[(Option<&str>, &str, Lock)] = &[
            (None, "a", Lock::Take),
            (Some("a"), "a", Lock::AlreadyHeld),
            (Some("a"), "b", Lock::Refuse),
        ];
        for (holder, id, expected) in table {
            let current = holder.map(held);
            assert_eq!(
                decide_lock(current.as_ref(), id),
                *expected,
                "{holder:?} <- {id}"
            );
        }
    }

    #[test]
    fn unlock_decisions() {
        let id = |id: &str| UnlockRequest::Id(id.into());
        // (holder, UNLOCK request, expected)
        let table: &[(Option<&str>, UnlockRequest, Unlock)] = &[
            (None, UnlockRequest::Force, Unlock::Nothing),
            (None, id("a"), Unlock::Nothing),
            (Some("a"), id("a"), Unlock::Release),
            (Some("a"), UnlockRequest::Force, Unlock::Release),
            (Some("a"), id("b"), Unlock::Refuse),
        ];
        for (holder, request, expected) in table {
            let current = holder.map(held);
            assert_eq!(
                decide_unlock(current.as_ref(), request),
                *expected,
                "{holder:?} <- {request:?}"
            );
        }
    }

    #[test]
    fn write_decisions() {
        // (holder, ?ID= of the write, expected)
        let table: &[(Option<&str>, Option<&str>, Write)] = &[
            (None, None, Write::Allow),
            (None, Some("a"), Write::NotHeld),
            (Some("a"), Some("a"), Write::Allow),
            (Some("a"), Some("b"), Write::Refuse),
            (Some("a"), None, Write::Refuse),
        ];
        for (holder, id, expected) in table {
            let current = holder.map(held);
            assert_eq!(
                decide_write(current.as_ref(), *id),
                *expected,
                "holder {holder:?}, write with {id:?}"
            );
        }
    }

    #[test]
    fn lock_rows() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        assert_eq!(held_lock(&conn, "ws").unwrap(), None);
        put_lock(&conn, "ws", &held("a"), "drift:run-3").unwrap();
        assert!(
            put_lock(&conn, "ws", &held("b"), "tf:ws").is_err(),
            "one lock per workspace"
        );
        assert_eq!(held_lock(&conn, "ws").unwrap(), Some(held("a")));
        assert_eq!(
            held_lock_credential(&conn, "ws").unwrap(),
            Some((held("a"), Some("drift:run-3".into())))
        );
        assert_eq!(held_lock(&conn, "other").unwrap(), None);
        let (lock, since) = held_lock_since(&conn, "ws").unwrap().unwrap();
        assert_eq!(lock, held("a"));
        assert!(
            crate::store::retention::parse_time(&since).is_some(),
            "{since}"
        );
        put_lock(&conn, "other", &held("c"), "tf:other").unwrap();
        let mut all: Vec<(String, String)> = all_locks(&conn)
            .unwrap()
            .into_iter()
            .map(|(ws, lock, _)| (ws, lock.id))
            .collect();
        all.sort();
        assert_eq!(
            all,
            [("other".into(), "c".into()), ("ws".into(), "a".into())]
        );
        delete_lock(&conn, "ws").unwrap();
        assert_eq!(held_lock(&conn, "ws").unwrap(), None);
        assert_eq!(held_lock_since(&conn, "ws").unwrap(), None);
    }

    #[test]
    fn a_lock_table_of_an_earlier_release_gains_the_credential_column() {
        let conn = Connection::open_in_memory().unwrap();
        migrate(&conn).unwrap();
        conn.execute_batch(
            "CREATE TABLE tf_locks (workspace TEXT PRIMARY KEY, lock_id TEXT NOT NULL, info TEXT NOT NULL, created_at TEXT NOT NULL) WITHOUT ROWID;
             INSERT INTO tf_locks VALUES ('old', 'a', '{\"ID\":\"a\"}', 't');",
        )
        .unwrap();
        migrate(&conn).unwrap();
        migrate(&conn).unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        assert_eq!(
            held_lock_credential(&conn, "old").unwrap(),
            Some((held("a"), None)),
            "an old lock records no credential"
        );
        put_lock(&conn, "new", &held("b"), "tf:new").unwrap();
        assert_eq!(
            held_lock_credential(&conn, "new")
                .unwrap()
                .unwrap()
                .1
                .as_deref(),
            Some("tf:new")
        );
    }
}
