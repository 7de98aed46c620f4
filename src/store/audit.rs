//! The append-only audit log: who did what to which scope, with metadata only.
//!
//! Entries are written by the code that makes the change, in the same transaction
//! (so a change and its audit row commit or roll back together), and read back by
//! the admin CLI. Payloads never hold state content or secrets.
//!
//! Append-only is enforced by the database, not by convention: [`SCHEMA`] adds
//! triggers that abort any UPDATE or DELETE on the table, whoever issues it.

use rusqlite::{params, Connection};

use super::now_rfc3339;

/// Triggers that make the `audit` table (created by `store::db::SCHEMA`) append-only.
pub const SCHEMA: &str = r#"
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only: rows cannot be changed'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only: rows cannot be deleted'); END;
"#;

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
    conn.prepare_cached(
        "INSERT INTO audit (at, actor, org, scope, event, payload) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        now_rfc3339(),
        entry.actor,
        entry.org,
        entry.scope,
        entry.event,
        entry.payload.to_string()
    ])?;
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
    let filter = AuditFilter {
        scope: scope.map(str::to_string),
        event: event.map(str::to_string),
        ..AuditFilter::default()
    };
    list_audit_filtered(conn, &filter, limit)
}

/// Which audit rows to list; `None` matches everything.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub scope: Option<String>,
    pub event: Option<String>,
    /// Rows at or after this instant.
    pub since: Option<time::OffsetDateTime>,
    /// Rows strictly before this instant.
    pub until: Option<time::OffsetDateTime>,
    /// Rows with an id below this one (the next page of a listing, newest first).
    pub before_id: Option<i64>,
}

/// Seconds since the epoch with the fraction, as SQLite's `unixepoch(at, 'subsec')`
/// computes them (RFC 3339 text does not order correctly within one second).
fn epoch(t: Option<time::OffsetDateTime>) -> Option<f64> {
    t.map(|t| t.unix_timestamp_nanos() as f64 / 1e9)
}

/// `--since` / `--until`: an RFC 3339 instant, or a date (midnight UTC).
pub fn parse_instant(text: &str) -> Result<time::OffsetDateTime, String> {
    use time::format_description::well_known::Rfc3339;
    if let Ok(t) = time::OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(t);
    }
    time::Date::parse(
        text,
        time::macros::format_description!("[year]-[month]-[day]"),
    )
    .map(|d| d.midnight().assume_utc())
    .map_err(|_| "expected an RFC 3339 time (2026-03-01T10:00:00Z) or a date (2026-03-01)".into())
}

/// [`list_audit`] with a time window too.
pub fn list_audit_filtered(
    conn: &Connection,
    filter: &AuditFilter,
    limit: u32,
) -> Result<Vec<AuditRow>, rusqlite::Error> {
    // Two texts, not `(?1 IS NULL OR scope = ?1)`: SQLite plans before it sees the
    // value, and only a plain `scope = ?1` lets it walk the `audit_by_scope` index
    // instead of the whole log.
    let sql = if filter.scope.is_some() {
        "SELECT id, at, actor, org, scope, event, payload FROM audit
          WHERE scope = ?1 AND (?2 IS NULL OR event = ?2)
            AND (?4 IS NULL OR unixepoch(at, 'subsec') >= ?4)
            AND (?5 IS NULL OR unixepoch(at, 'subsec') < ?5)
            AND (?6 IS NULL OR id < ?6)
          ORDER BY id DESC LIMIT ?3"
    } else {
        "SELECT id, at, actor, org, scope, event, payload FROM audit
          WHERE ?1 IS NULL AND (?2 IS NULL OR event = ?2)
            AND (?4 IS NULL OR unixepoch(at, 'subsec') >= ?4)
            AND (?5 IS NULL OR unixepoch(at, 'subsec') < ?5)
            AND (?6 IS NULL OR id < ?6)
          ORDER BY id DESC LIMIT ?3"
    };
    let mut stmt = conn.prepare_cached(sql)?;
    let params = params![
        filter.scope,
        filter.event,
        limit,
        epoch(filter.since),
        epoch(filter.until),
        filter.before_id
    ];
    let mut rows = stmt
        .query_map(params, |r| {
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
    fn instants_parse_as_rfc3339_or_dates() {
        let table = [
            ("2026-03-01T10:00:00Z", Some(1_772_359_200)),
            ("2026-03-01T12:00:00+02:00", Some(1_772_359_200)),
            ("2026-03-01", Some(1_772_323_200)),
            ("2026-02-30", None),
            ("yesterday", None),
            ("", None),
        ];
        for (text, want) in table {
            let got = parse_instant(text).ok().map(|t| t.unix_timestamp());
            assert_eq!(got, want, "{text}");
        }
    }

    fn audit_db() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(super::super::db::SCHEMA).unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        conn
    }

    fn entry(scope: &str, event: &'static str) -> AuditEntry {
        AuditEntry {
            actor: "test".into(),
            org: None,
            scope: scope.into(),
            event,
            payload: serde_json::json!({}),
        }
    }

    #[test]
    fn the_database_refuses_to_change_or_delete_audit_rows() {
        let conn = audit_db();
        insert_audit(&conn, &entry("tf/a", "tf.state_written")).unwrap();
        for (sql, word) in [
            ("UPDATE audit SET actor = 'someone else'", "changed"),
            ("UPDATE audit SET payload = '{}' WHERE id = 1", "changed"),
            ("DELETE FROM audit", "deleted"),
            ("DELETE FROM audit WHERE id = 1", "deleted"),
        ] {
            let err = conn.execute(sql, []).unwrap_err().to_string();
            assert!(
                err.contains("append-only") && err.contains(word),
                "{sql}: {err}"
            );
        }
        let rows = list_audit(&conn, None, None, 10).unwrap();
        assert_eq!((rows.len(), rows[0].actor.as_str()), (1, "test"));
        // Appending still works.
        insert_audit(&conn, &entry("tf/a", "tf.state_written")).unwrap();
        assert_eq!(list_audit(&conn, None, None, 10).unwrap().len(), 2);
    }

    #[test]
    fn time_windows_compare_instants_not_text() {
        let conn = audit_db();
        // Written with explicit times: within one second, ".5Z" sorts before "Z" as text.
        for (id, at) in [
            (1, "2026-03-01T10:00:00Z"),
            (2, "2026-03-01T10:00:00.5Z"),
            (3, "2026-03-01T11:00:00.123456789Z"),
            (4, "2026-03-02T00:00:00Z"),
        ] {
            conn.execute(
                "INSERT INTO audit (id, at, actor, scope, event, payload) VALUES (?1, ?2, 'a', 's', 'e', '{}')",
                params![id, at],
            )
            .unwrap();
        }
        let t = |s: &str| {
            time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
        };
        // (since, until, ids)
        let table: &[(Option<&str>, Option<&str>, &[i64])] = &[
            (None, None, &[1, 2, 3, 4]),
            (Some("2026-03-01T10:00:00.2Z"), None, &[2, 3, 4]),
            (None, Some("2026-03-01T10:00:00.5Z"), &[1]),
            (
                Some("2026-03-01T10:00:00Z"),
                Some("2026-03-02T00:00:00Z"),
                &[1, 2, 3],
            ),
            (Some("2026-03-01T11:00:00.2Z"), None, &[4]),
            (Some("2026-03-03T00:00:00Z"), None, &[]),
        ];
        for (since, until, ids) in table {
            let filter = AuditFilter {
                since: since.map(t),
                until: until.map(t),
                ..AuditFilter::default()
            };
            let got: Vec<i64> = list_audit_filtered(&conn, &filter, 100)
                .unwrap()
                .iter()
                .map(|r| r.id)
                .collect();
            assert_eq!(&got, ids, "{since:?} {until:?}");
        }
        // Paging: rows below an id, newest `limit` of them, still oldest first.
        for (before, limit, ids) in [
            (Some(4), 2, &[2i64, 3][..]),
            (Some(2), 5, &[1]),
            (Some(1), 5, &[]),
            (None, 1, &[4]),
        ] {
            let filter = AuditFilter {
                before_id: before,
                ..AuditFilter::default()
            };
            let got: Vec<i64> = list_audit_filtered(&conn, &filter, limit)
                .unwrap()
                .iter()
                .map(|r| r.id)
                .collect();
            assert_eq!(got, ids, "{before:?} {limit}");
        }
    }

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
