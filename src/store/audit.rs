//! The append-only audit log: who did what to which scope, with metadata only.
//!
//! Entries are written by the code that makes the change, in the same transaction
//! (so a change and its audit row commit or roll back together), and read back by
//! the admin CLI. Payloads never hold state content or secrets.

use rusqlite::{params, Connection};

use super::now_rfc3339;

/// One audit-log entry, written in the same transaction as the change it describes.
#[derive(Debug, Clone)]
pub struct AuditEntry {
    pub actor: String,
    pub org: Option<String>,
    pub scope: String,
    pub event: &'static str,
    /// Metadata only: never state content or secrets.
    pub payload: serde_json::Value,
}

pub fn insert_audit(conn: &Connection, entry: &AuditEntry) -> Result<(), rusqlite::Error> {
    conn.execute(
        "INSERT INTO audit (at, actor, org, scope, event, payload) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            now_rfc3339(),
            entry.actor,
            entry.org,
            entry.scope,
            entry.event,
            entry.payload.to_string()
        ],
    )?;
    Ok(())
}

/// One audit row as the admin CLI prints it (one JSON object per line).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AuditRow {
    pub id: i64,
    pub at: String,
    pub actor: String,
    pub org: Option<String>,
    pub scope: String,
    pub event: String,
    pub payload: serde_json::Value,
}

/// The newest `limit` audit rows matching the filters, oldest first.
pub fn list_audit(
    conn: &Connection,
    scope: Option<&str>,
    event: Option<&str>,
    limit: u32,
) -> Result<Vec<AuditRow>, rusqlite::Error> {
    // Two texts, not `(?1 IS NULL OR scope = ?1)`: SQLite plans before it sees the
    // value, and only a plain `scope = ?1` lets it walk the `audit_by_scope` index
    // instead of the whole log.
    let sql = if scope.is_some() {
        "SELECT id, at, actor, org, scope, event, payload FROM audit
          WHERE scope = ?1 AND (?2 IS NULL OR event = ?2)
          ORDER BY id DESC LIMIT ?3"
    } else {
        "SELECT id, at, actor, org, scope, event, payload FROM audit
          WHERE ?1 IS NULL AND (?2 IS NULL OR event = ?2)
          ORDER BY id DESC LIMIT ?3"
    };
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt
        .query_map(params![scope, event, limit], |r| {
            let payload: String = r.get(6)?;
            Ok(AuditRow {
                id: r.get(0)?,
                at: r.get(1)?,
                actor: r.get(2)?,
                org: r.get(3)?,
                scope: r.get(4)?,
                event: r.get(5)?,
                payload: serde_json::from_str(&payload)
                    .unwrap_or(serde_json::Value::String(payload)),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.reverse();
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_entries_read_back_filtered_newest_oldest_first() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(super::super::db::SCHEMA).unwrap();
        let entries = [
            ("tf/a", "tf.state_written", 1),
            ("tf/b", "tf.state_written", 2),
            ("tf/a", "tf.lock_acquired", 3),
            ("tf/a", "tf.state_written", 4),
        ];
        for (scope, event, n) in entries {
            let entry = AuditEntry {
                actor: format!("tf:{scope}"),
                org: None,
                scope: scope.into(),
                event,
                payload: serde_json::json!({ "n": n }),
            };
            insert_audit(&conn, &entry).unwrap();
        }
        // (scope filter, event filter, limit, expected payload numbers)
        type Row<'a> = (Option<&'a str>, Option<&'a str>, u32, &'a [i64]);
        let table: &[Row] = &[
            (None, None, 100, &[1, 2, 3, 4]),
            (None, None, 2, &[3, 4]),
            (Some("tf/a"), None, 100, &[1, 3, 4]),
            (None, Some("tf.state_written"), 100, &[1, 2, 4]),
            (Some("tf/a"), Some("tf.state_written"), 1, &[4]),
            (Some("tf/c"), None, 100, &[]),
        ];
        for (scope, event, limit, expected) in table {
            let got: Vec<i64> = list_audit(&conn, *scope, *event, *limit)
                .unwrap()
                .iter()
                .map(|r| r.payload["n"].as_i64().unwrap())
                .collect();
            assert_eq!(&got, expected, "{scope:?} {event:?} {limit}");
        }
        let row = &list_audit(&conn, Some("tf/b"), None, 1).unwrap()[0];
        assert_eq!((row.actor.as_str(), row.org.as_deref()), ("tf:tf/b", None));
        assert!(!row.at.is_empty());
    }
}
