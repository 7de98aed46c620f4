//! Write guards on the Terraform path: may a state POST replace the current state?
//!
//! The cluster API's push rules (seed 004), adapted: a state with another lineage than
//! the current one, a lower serial, or the same serial with different content is
//! refused, because no correct Terraform/OpenTofu write produces one (every write
//! path increments the serial of the state it read; see docs/terraform.md). They are
//! what copy-pasted backend blocks, racing `-lock=false` runs, `state push -force` of
//! an old file and a migration onto a workspace that already had state send.
//!
//! The rule is the pure [`decide_successor`]; it runs when the body has been read
//! and again inside the version commit, so two racing writers cannot both pass. An
//! operator may let ONE refused write through per workspace: an override row in
//! `tf_write_overrides` (this module owns it), granted with a reason, expiring after
//! minutes, consumed (deleted) in the commit of the write it lets through.

use crate::store::sql::{params, Connection, OptionalExtension};

use crate::store::VersionRow;

/// The one-shot write overrides; `crate::schema` applies it.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tf_write_overrides (
    workspace   TEXT PRIMARY KEY,
    granted_by  TEXT NOT NULL,
    reason      TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    expires_at  INTEGER NOT NULL
) WITHOUT ROWID;
"#;

/// Default lifetime of an override, and the longest one may be granted for.
pub const DEFAULT_OVERRIDE_MINUTES: u32 = 10;
pub const MAX_OVERRIDE_MINUTES: u32 = 60;
pub use crate::names::MAX_REASON_CHARS;

/// What a write sends: the body's serial and lineage, and the sha256 of the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub serial: i64,
    pub lineage: String,
    pub sha256: String,
    /// Plaintext or OpenTofu's envelope (`super::posture`).
    pub encryption: crate::tfstate::BodyEncryption,
}

/// Why a write may not replace the current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Another lineage: a different state (another configuration, a re-init).
    Lineage,
    /// A lower serial than the current one: an older state.
    Stale,
    /// The current serial with different content: a writer that read the same state
    /// as the one that wrote it (`-lock=false` runs racing, a forced old file).
    SerialReused,
}

impl Refusal {
    /// Stable name, in the 409 body and the audit payload of an override's use.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Lineage => "lineage_mismatch",
            Refusal::Stale => "stale_serial",
            Refusal::SerialReused => "serial_reused",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Successor {
    /// No current state, a higher serial of the same lineage, or the identical state
    /// again (a client retry, stored as a no-op).
    Allow,
    Refuse(Refusal),
}

/// May `sent` replace `current` (the newest row; a tombstone or nothing means there is
/// no current state)? A current row without a serial or lineage (written before they
/// were recorded) cannot be judged and does not refuse.
pub fn decide_successor(current: Option<&VersionRow>, sent: &Sent) -> Successor {
    let Some(row) = current.filter(|r| !r.is_tombstone()) else {
        return Successor::Allow;
    };
    let (Some(serial), Some(lineage)) = (row.serial, row.lineage.as_deref()) else {
        return Successor::Allow;
    };
    if lineage != sent.lineage {
        Successor::Refuse(Refusal::Lineage)
    } else if sent.serial < serial {
        Successor::Refuse(Refusal::Stale)
    } else if sent.serial == serial && row.sha256.as_deref() != Some(sent.sha256.as_str()) {
        Successor::Refuse(Refusal::SerialReused)
    } else {
        Successor::Allow
    }
}

/// An operator's permission for one refused write to one workspace.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Override {
    pub workspace: String,
    pub granted_by: String,
    pub reason: String,
    pub created_at: String,
    /// Unix seconds; the override is void from then on.
    pub expires_at: i64,
}

/// Why an override request is refused (before anything is written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadOverride {
    #[error("minutes must be 1-{MAX_OVERRIDE_MINUTES}")]
    Minutes,
    #[error("a reason is required (1-{MAX_REASON_CHARS} characters, no control characters)")]
    Reason,
}

/// The reason, trimmed, if it is one an audit row may carry.
pub fn check_request(minutes: u32, reason: &str) -> Result<String, BadOverride> {
    if !(1..=MAX_OVERRIDE_MINUTES).contains(&minutes) {
        return Err(BadOverride::Minutes);
    }
    crate::names::reason(reason)
        .map(str::to_string)
        .ok_or(BadOverride::Reason)
}

/// Grants (or replaces) the override of `workspace`; expired rows of any workspace
/// are dropped on the way.
pub fn put_override(
    conn: &Connection,
    grant: &Override,
    now: i64,
) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached("DELETE FROM tf_write_overrides WHERE expires_at <= ?1")?
        .execute([now])?;
    conn.prepare_cached(
        "INSERT INTO tf_write_overrides (workspace, granted_by, reason, created_at, expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (workspace) DO UPDATE SET \
         granted_by = excluded.granted_by, reason = excluded.reason, \
         created_at = excluded.created_at, expires_at = excluded.expires_at",
    )?
    .execute(params![
        grant.workspace,
        grant.granted_by,
        grant.reason,
        grant.created_at,
        grant.expires_at
    ])?;
    Ok(())
}

/// The override of `workspace` that is still valid at `now`.
pub fn active_override(
    conn: &Connection,
    workspace: &str,
    now: i64,
) -> Result<Option<Override>, crate::store::sql::Error> {
    conn.prepare_cached(
        "SELECT workspace, granted_by, reason, created_at, expires_at FROM tf_write_overrides \
         WHERE workspace = ?1 AND expires_at > ?2",
    )?
    .query_row(params![workspace, now], |r| {
        Ok(Override {
            workspace: r.get(0)?,
            granted_by: r.get(1)?,
            reason: r.get(2)?,
            created_at: r.get(3)?,
            expires_at: r.get(4)?,
        })
    })
    .optional()
}

/// Uses up the override of `workspace` (inside the commit of the write it allowed).
pub fn delete_override(conn: &Connection, workspace: &str) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached("DELETE FROM tf_write_overrides WHERE workspace = ?1")?
        .execute([workspace])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(serial: Option<i64>, lineage: Option<&str>, sha: &str) -> VersionRow {
        VersionRow {
            scope: "tf/w".into(),
            version: 3,
            serial,
            lineage: lineage.map(str::to_string),
            sha256: Some(sha.into()),
            size: 10,
            blob_key: Some("k".into()),
            created_at: String::new(),
            actor: String::new(),
            facts: Default::default(),
            changes: None,
            key_generation: None,
        }
    }

    #[test]
    fn successor_decisions() {
        let tombstone = VersionRow {
            blob_key: None,
            serial: None,
            lineage: None,
            sha256: None,
            ..row(None, None, "")
        };
        let current = row(Some(5), Some("L"), "aaa");
        let unknown = row(None, None, "aaa");
        let sent = |serial: i64, lineage: &str, sha: &str| Sent {
            serial,
            lineage: lineage.into(),
            sha256: sha.into(),
            encryption: crate::tfstate::BodyEncryption::Plaintext,
        };
        use Refusal::*;
        use Successor::*;
        // (current row, sent, expected)
        let table: Vec<(Option<&VersionRow>, Sent, Successor)> = vec![
            // nothing to guard: first write, or after a DELETE
            (None, sent(0, "M", "x"), Allow),
            (Some(&tombstone), sent(1, "M", "x"), Allow),
            // the successor every Terraform write path sends
            (Some(&current), sent(6, "L", "bbb"), Allow),
            (Some(&current), sent(60, "L", "bbb"), Allow),
            // the identical state again: a client retry (a no-op)
            (Some(&current), sent(5, "L", "aaa"), Allow),
            // misuse
            (Some(&current), sent(6, "M", "bbb"), Refuse(Lineage)),
            (Some(&current), sent(5, "M", "aaa"), Refuse(Lineage)),
            (Some(&current), sent(4, "L", "bbb"), Refuse(Stale)),
            (Some(&current), sent(4, "L", "aaa"), Refuse(Stale)),
            (Some(&current), sent(-1, "L", "bbb"), Refuse(Stale)),
            (Some(&current), sent(5, "L", "bbb"), Refuse(SerialReused)),
            // a row that never recorded serial and lineage cannot be judged
            (Some(&unknown), sent(1, "M", "bbb"), Allow),
        ];
        for (current, sent, expected) in table {
            assert_eq!(
                decide_successor(current, &sent),
                expected,
                "{current:?} <- {sent:?}"
            );
        }
    }

    #[test]
    fn override_requests() {
        assert_eq!(check_request(10, "  re-init  ").unwrap(), "re-init");
        assert_eq!(check_request(0, "x"), Err(BadOverride::Minutes));
        assert_eq!(
            check_request(MAX_OVERRIDE_MINUTES + 1, "x"),
            Err(BadOverride::Minutes)
        );
        assert_eq!(check_request(1, " "), Err(BadOverride::Reason));
        assert_eq!(check_request(1, "a\nb"), Err(BadOverride::Reason));
        assert_eq!(
            check_request(1, &"x".repeat(MAX_REASON_CHARS + 1)),
            Err(BadOverride::Reason)
        );
        assert!(check_request(MAX_OVERRIDE_MINUTES, &"é".repeat(MAX_REASON_CHARS)).is_ok());
    }

    #[test]
    fn override_rows_expire_and_are_single() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        let grant = |ws: &str, by: &str, expires_at: i64| Override {
            workspace: ws.into(),
            granted_by: by.into(),
            reason: "r".into(),
            created_at: "t".into(),
            expires_at,
        };
        put_override(&conn, &grant("w", "a", 100), 0).unwrap();
        assert_eq!(
            active_override(&conn, "w", 99).unwrap(),
            Some(grant("w", "a", 100))
        );
        assert_eq!(active_override(&conn, "w", 100).unwrap(), None, "expired");
        assert_eq!(active_override(&conn, "other", 0).unwrap(), None);
        // a second grant replaces the first: still one override per workspace
        put_override(&conn, &grant("w", "b", 200), 0).unwrap();
        assert_eq!(
            active_override(&conn, "w", 150).unwrap(),
            Some(grant("w", "b", 200))
        );
        // expired rows are dropped by the next grant
        put_override(&conn, &grant("x", "a", 300), 250).unwrap();
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM tf_write_overrides", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 1);
        delete_override(&conn, "x").unwrap();
        assert_eq!(active_override(&conn, "x", 0).unwrap(), None);
    }
}
