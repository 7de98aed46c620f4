//! The append-only audit log: who did what to which scope, with metadata only.
//!
//! Entries are written by the code that makes the change, in the same transaction
//! (so a change and its audit row commit or roll back together), and read back by
//! the admin CLI. Payloads never hold state content or secrets.
//!
//! Append-only is enforced by the database, not by convention: [`SCHEMA`] adds
//! triggers that abort any UPDATE or DELETE on the table, whoever issues it.
//!
//! [`EVENTS`] is every event kind the code writes, each saying which payload fields
//! name workspaces (or workspace patterns, or credentials that carry a workspace), so
//! a listing can show a reader limited to workspace patterns only the names it may
//! see (`operator::redact`). A kind missing from it is refused by [`insert_audit`] in
//! debug builds (every test that writes it fails), and shown to a limited reader with
//! its whole payload hidden.

use crate::store::sql::{params, Connection, Dialect};

use super::now_rfc3339;

/// Triggers that make the `audit` table (created by `store::db::SCHEMA`) append-only.
pub const SCHEMA: &str = r#"
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only: rows cannot be changed'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only: rows cannot be deleted'); END;
"#;

/// [`SCHEMA`] for PostgreSQL: the same refusals, by a trigger function, and
/// `TRUNCATE` (which skips row triggers there) refused as well.
pub const POSTGRES_SCHEMA: &str = r#"
CREATE OR REPLACE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'the audit log is append-only: rows cannot be changed';
    END IF;
    RAISE EXCEPTION 'the audit log is append-only: rows cannot be deleted';
END $$;
CREATE OR REPLACE TRIGGER audit_no_update BEFORE UPDATE OR DELETE ON audit
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE OR REPLACE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
    FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only();
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

impl AuditEntry {
    /// An entry of `scope` (`tf/<workspace>`, `operators`, `keyring`, …) by `actor`,
    /// outside any org: every entry but the cluster API's.
    pub fn new(
        actor: impl Into<String>,
        scope: impl Into<String>,
        event: &'static str,
        payload: serde_json::Value,
    ) -> AuditEntry {
        AuditEntry {
            actor: actor.into(),
            org: None,
            scope: scope.into(),
            event,
            payload,
        }
    }

    /// The same entry in `org`'s log (the cluster API's entries: an org admin reads them).
    pub fn in_org(self, org: impl Into<String>) -> AuditEntry {
        AuditEntry {
            org: Some(org.into()),
            ..self
        }
    }
}

/// What the text at a payload field names, for a reader limited to workspace patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Names {
    /// A workspace name, or an array of them.
    Workspaces,
    /// Workspace patterns: one comma-separated text or an array of them.
    Patterns,
    /// A credential's recorded name (`tofu::access::Credential::name`), which may carry
    /// a workspace (`tf:<workspace>`, `consumer:<workspace>`).
    Credential,
}

/// One kind of audit event and the payload fields (dotted paths into nested objects)
/// that name workspaces. Every other field is metadata that names none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventKind {
    pub name: &'static str,
    pub names: &'static [(&'static str, Names)],
}

const fn kind(name: &'static str, names: &'static [(&'static str, Names)]) -> EventKind {
    EventKind { name, names }
}

/// Every audit event kind the code writes. A new event is added here, with the fields
/// that name workspaces, or [`insert_audit`] refuses it in debug builds.
pub const EVENTS: &[EventKind] = &[
    // Workspaces (`tf/<workspace>`), written by `tofu` and `store::history`.
    kind("tf.state_written", &[]),
    kind("tf.state_deleted", &[]),
    kind("tf.lock_acquired", &[]),
    kind("tf.lock_released", &[]),
    kind("tf.lock_forced", &[]),
    kind("tf.rollback", &[]),
    kind("tf.restored", &[]),
    kind("tf.write_allowed", &[]),
    kind("tf.write_override_used", &[]),
    kind("tf.frozen", &[]),
    kind("tf.unfrozen", &[]),
    kind("tf.freeze_expired", &[]),
    kind(
        "tf.resources_moved",
        &[
            ("from.workspace", Names::Workspaces),
            ("to.workspace", Names::Workspaces),
        ],
    ),
    kind("tf.move_abandoned", &[("moved_by", Names::Credential)]),
    kind("tf.lock_expired", &[("taken_by", Names::Credential)]),
    kind("tf.credential_rotated", &[]),
    kind("tf.consumers_set", &[("consumers", Names::Workspaces)]),
    kind("tf.token_created", &[("workspaces", Names::Patterns)]),
    kind("tf.token_revoked", &[]),
    kind("state.revealed", &[]),
    kind("store.pruned", &[]),
    // Drift runs (`drift`).
    kind("drift.apply_approved", &[]),
    kind("drift.applied", &[]),
    kind("drift.lock_left", &[("taken_by", Names::Credential)]),
    // Clusters (`cluster`).
    kind("cluster.state_pushed", &[]),
    kind("cluster.state_lock_acquired", &[]),
    kind("cluster.state_lock_released", &[]),
    kind("cluster.state_lock_stolen", &[]),
    kind("cluster.state_lock_broken", &[]),
    // The keyring (`store::keyring`, `store::reseal`).
    kind("key.rotated", &[]),
    kind("key.retired", &[]),
    kind("key.rewrapped", &[]),
    kind("key.resealed", &[]),
    // The index (`stategate index restore`).
    kind("index.restored", &[]),
    // Orgs, users and operators (`cluster::identity`, `operator::identity`, `ui::session`).
    kind("admin.org_created", &[]),
    kind("admin.user_created", &[]),
    kind("admin.token_created", &[]),
    kind("admin.cluster_created", &[]),
    kind("admin.user_role_changed", &[]),
    kind("admin.user_disabled", &[]),
    kind("admin.token_revoked", &[]),
    kind("admin.operator_created", &[("workspaces", Names::Patterns)]),
    kind("admin.operator_role_set", GRANT_CHANGE),
    kind("admin.operator_role_reapplied", GRANT_CHANGE),
    kind("admin.operator_token_created", &[]),
    kind("admin.operator_token_revoked", &[]),
    kind("ui.login", &[("workspaces", Names::Patterns)]),
    kind(
        "ui.sso_regrant",
        &[
            ("from.workspaces", Names::Patterns),
            ("workspaces", Names::Patterns),
            ("groups.workspaces", Names::Patterns),
        ],
    ),
    kind("ui.session_ended", &[]),
];

/// An operator's grant changed (`from`, `to`, and a single sign-on operator's `cap`).
const GRANT_CHANGE: &[(&str, Names)] = &[
    ("from.workspaces", Names::Patterns),
    ("to.workspaces", Names::Patterns),
    ("cap.from.workspaces", Names::Patterns),
    ("cap.to.workspaces", Names::Patterns),
];

/// The declaration of the event kind `name`, if the code writes it.
pub fn event_kind(name: &str) -> Option<&'static EventKind> {
    EVENTS.iter().find(|k| k.name == name)
}

pub fn insert_audit(conn: &Connection, entry: &AuditEntry) -> Result<(), crate::store::sql::Error> {
    // A kind [`EVENTS`] does not declare would be shown to limited readers with its
    // whole payload hidden: refuse it where the tests run, so a new event must say.
    #[cfg(debug_assertions)]
    if event_kind(entry.event).is_none() {
        return Err(crate::store::sql::Error::Value(format!(
            "the audit event {:?} is not declared in store::audit::EVENTS",
            entry.event
        )));
    }
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
) -> Result<Vec<AuditRow>, crate::store::sql::Error> {
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
    /// Exactly this scope (`tf/prod`, `operators`); `operator::audit_scope` reads a
    /// bare workspace name as its scope first.
    pub scope: Option<String>,
    /// Events this text finds by [`event_matches`]: names it begins, or whose part
    /// after a dot it begins (`tf.lock` finds `tf.lock_acquired`, `rollback` finds
    /// `tf.rollback`), and names each of whose words (split on `.` and `_`) is a word
    /// of the name in another form (`move` finds `tf.resources_moved`, `freeze` finds
    /// `tf.frozen` and `tf.unfrozen`). Taken literally (no wildcards), whatever the
    /// case of its ASCII letters (`Move` and `FREEZE` find what `move`, `freeze` do).
    pub event: Option<String>,
    /// Rows whose event begins with this text are left out (the UI hides `ui.login`).
    pub exclude: Option<String>,
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

/// `text` as a GLOB pattern matching only itself: each wildcard character is put in
/// brackets, where GLOB reads it literally (GLOB has no ESCAPE clause).
fn glob_literal(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '*' | '?' | '[' => format!("[{c}]"),
            c => c.to_string(),
        })
        .collect()
}

/// The event filter's conditions: `?2` begins the event or one of its parts after a
/// dot, or the event is one of the names in `?8` (a JSON array of text: the names
/// [`word_matches`] finds, resolved in Rust by [`names_by_words`]); `?7` begins no
/// event shown. `?2` matches whatever its case (an operator types `Move` or `FREEZE`):
/// it arrives in ASCII lower case and is compared with the event in ASCII lower case —
/// SQLite's `lower` folds ASCII only, and PostgreSQL's does too under the `C`
/// collation — so both databases fold exactly as [`event_matches`] does. `?7` (the
/// code's own `ui.login`) is compared as it is. `_` is literal: SQLite's GLOB (the
/// filters bracketed by [`glob_literal`]), PostgreSQL's `starts_with` and `strpos`
/// (the filters as they are). `?2`, `?7` and `?8` are text.
fn event_conditions(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => {
            "(CAST(?2 AS TEXT) IS NULL OR lower(event) GLOB ?2 || '*'
              OR lower(event) GLOB '*.' || ?2 || '*'
              OR event IN (SELECT value FROM json_each(?8)))
            AND (CAST(?7 AS TEXT) IS NULL OR event NOT GLOB ?7 || '*')"
        }
        Dialect::Postgres => {
            "(CAST(?2 AS TEXT) IS NULL OR starts_with(lower(event COLLATE \"C\"), ?2)
              OR strpos(lower(event COLLATE \"C\"), '.' || ?2) > 0
              OR event IN (SELECT jsonb_array_elements_text(CAST(CAST(?8 AS TEXT) AS JSONB))))
            AND (CAST(?7 AS TEXT) IS NULL OR NOT starts_with(event, ?7))"
        }
    }
}

/// An audit row's time (RFC 3339 text) in unix seconds, fractions kept.
fn at_seconds(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => "unixepoch(at, 'subsec')",
        Dialect::Postgres => {
            "CAST(EXTRACT(EPOCH FROM CAST(at AS TIMESTAMPTZ)) AS DOUBLE PRECISION)"
        }
    }
}

/// The listing's SQL: with a scope it walks the `audit_by_scope` index, without one
/// the log by id, newest first; both stop after `limit` matching rows.
fn listing_sql(with_scope: bool, dialect: Dialect) -> String {
    // Two texts, not `(?1 IS NULL OR scope = ?1)`: SQLite plans before it sees the
    // value, and only a plain `scope = ?1` lets it walk the `audit_by_scope` index
    // instead of the whole log.
    let scope = if with_scope {
        "scope = ?1"
    } else {
        "CAST(?1 AS TEXT) IS NULL"
    };
    let (events, at) = (event_conditions(dialect), at_seconds(dialect));
    format!(
        "SELECT id, at, actor, org, scope, event, payload FROM audit
          WHERE {scope} AND {events}
            AND (CAST(?4 AS DOUBLE PRECISION) IS NULL OR {at} >= ?4)
            AND (CAST(?5 AS DOUBLE PRECISION) IS NULL OR {at} < ?5)
            AND (CAST(?6 AS BIGINT) IS NULL OR id < ?6)
          ORDER BY id DESC LIMIT ?3"
    )
}

/// Does the event filter `filter` find `event`? The rule [`list_audit_filtered`]'s SQL
/// applies: it begins the name, or one of its parts after a dot (`tf.lock`, `rollb`),
/// or [`word_matches`] (the words in another form: `moved`, `freeze`). Whatever the
/// case of either: ASCII letters compare folded (`Move`, `FREEZE`, `TF.LOCK` find what
/// their lower case finds), anything else exactly.
pub fn event_matches(event: &str, filter: &str) -> bool {
    let (event, filter) = (event.to_ascii_lowercase(), filter.to_ascii_lowercase());
    event.starts_with(&filter)
        || event
            .match_indices('.')
            .any(|(i, _)| event[i + 1..].starts_with(&filter))
        || word_matches(&event, &filter)
}

/// A filter longer than this, or of more words, finds nothing by its words (it still
/// finds what it begins): the rule's work stays bounded whatever is typed.
const MAX_FILTER_WORDS: usize = 8;
const MAX_FILTER_LEN: usize = 100;

/// Irregular forms of the words event names use, read as the form the names spell.
const IRREGULAR: &[(&str, &str)] = &[
    ("frozen", "freeze"),
    ("unfrozen", "unfreeze"),
    ("written", "write"),
];

/// The forms a word may be the inflection of: itself, its irregular base, and itself
/// without `s`, `es`, `d`, `ed`, `ing` (and `ing` read as `e`): `moved` may be `move`
/// or `mov`, `moves` `move` or `mov`, `moving` `mov` or `move`.
fn stems(word: &str) -> Vec<String> {
    let mut out = vec![word.to_string()];
    if let Some((_, base)) = IRREGULAR.iter().find(|(w, _)| *w == word) {
        out.push((*base).to_string());
    }
    for suffix in ["s", "es", "d", "ed", "ing"] {
        if let Some(root) = word.strip_suffix(suffix).filter(|r| r.len() >= 3) {
            out.push(root.to_string());
            if suffix == "ing" {
                out.push(format!("{root}e"));
            }
        }
    }
    out
}

/// Is a word whose forms are `wanted` ([`stems`]) a part of the name in another form?
/// The same word, inflected, or its undoing with `un` (`freeze` finds `unfrozen`).
fn same_word(wanted: &[String], part: &str) -> bool {
    let found = |part: &str| stems(part).iter().any(|s| wanted.contains(s));
    found(part) || part.strip_prefix("un").is_some_and(found)
}

/// The filter's words rule: split on `.` and `_`, every word (ASCII letters and digits
/// only; a filter with any other character has no words) is, in some form, one of the
/// event's parts split the same way. `moved` finds `tf.resources_moved` and
/// `tf.move_abandoned`; `tf.frozen` finds `tf.frozen`, `tf.unfrozen` and
/// `tf.freeze_expired`; `lock` finds `cluster.state_lock_broken`. ASCII letters compare
/// folded, as in [`event_matches`] (`MOVED` finds `tf.resources_moved`).
pub fn word_matches(event: &str, filter: &str) -> bool {
    if filter.len() > MAX_FILTER_LEN {
        return false;
    }
    // After the length bound, so the copies are bounded too.
    let (event, filter) = (event.to_ascii_lowercase(), filter.to_ascii_lowercase());
    let words: Vec<&str> = filter.split(['.', '_']).filter(|w| !w.is_empty()).collect();
    if words.is_empty()
        || words.len() > MAX_FILTER_WORDS
        || words
            .iter()
            .any(|w| !w.bytes().all(|b| b.is_ascii_alphanumeric()))
    {
        return false;
    }
    let parts: Vec<&str> = event.split(['.', '_']).filter(|p| !p.is_empty()).collect();
    words.iter().all(|w| {
        let wanted = stems(w);
        parts.iter().any(|p| same_word(&wanted, p))
    })
}

/// The names among the declared kinds ([`EVENTS`]) and `logged` (the kinds in the log)
/// that `filter` finds by [`word_matches`], as the JSON array the listing's SQL reads.
fn names_by_words(filter: &str, logged: &[String]) -> String {
    let mut names: Vec<&str> = EVENTS
        .iter()
        .map(|k| k.name)
        .chain(logged.iter().map(String::as_str))
        .filter(|name| word_matches(name, filter))
        .collect();
    names.sort_unstable();
    names.dedup();
    serde_json::Value::from(names).to_string()
}

/// How many kinds in the log [`list_audit_filtered`] resolves a filter's words against
/// besides the declared ones (the log holds only those, and earlier releases' few).
const LOGGED_KINDS: u32 = 500;

/// Every event kind in the log, in name order, at most `limit` of them (the audit
/// page's list to choose from). A skip scan over `audit_by_event`: one index seek
/// per kind, however long the log.
pub fn event_kinds(conn: &Connection, limit: u32) -> Result<Vec<String>, crate::store::sql::Error> {
    let mut stmt = conn.prepare_cached(EVENT_KINDS_SQL)?;
    let kinds = stmt
        .query_map(params![limit], |r| r.get(0))?
        .collect::<Result<Vec<String>, _>>()?;
    Ok(kinds)
}

const EVENT_KINDS_SQL: &str = "WITH RECURSIVE kinds(event) AS (
        SELECT MIN(event) FROM audit
        UNION ALL
        SELECT (SELECT MIN(event) FROM audit WHERE event > kinds.event) FROM kinds
         WHERE kinds.event IS NOT NULL
    )
    SELECT event FROM kinds WHERE event IS NOT NULL LIMIT ?1";

/// [`list_audit`] with a time window too.
pub fn list_audit_filtered(
    conn: &Connection,
    filter: &AuditFilter,
    limit: u32,
) -> Result<Vec<AuditRow>, crate::store::sql::Error> {
    let dialect = conn.dialect();
    let mut stmt = conn.prepare_cached(&listing_sql(filter.scope.is_some(), dialect))?;
    let literal = |filter: &str| match dialect {
        Dialect::Sqlite => glob_literal(filter),
        Dialect::Postgres => filter.to_string(),
    };
    // Lower case, as the SQL compares the event (see `event_conditions`).
    let event = filter
        .event
        .as_deref()
        .map(|f| literal(&f.to_ascii_lowercase()));
    let exclude = filter.exclude.as_deref().map(literal);
    // The words rule over every name the log may hold, resolved here so the SQL
    // compares names only (one skip scan of `audit_by_event`, one seek per kind).
    let by_words = match filter.event.as_deref() {
        Some(f) => names_by_words(f, &event_kinds(conn, LOGGED_KINDS)?),
        None => "[]".to_string(),
    };
    let params = params![
        filter.scope,
        event,
        limit,
        epoch(filter.since),
        epoch(filter.until),
        filter.before_id,
        exclude,
        by_words,
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
    fn events_match_by_prefix_of_the_name_or_of_a_part() {
        let conn = audit_db();
        let events = [
            "tf.lock_acquired",
            "tf.lock_forced",
            "tf.rollback",
            "cluster.state_lock_broken",
            "ui.login",
            "ui.logout",
            "state.revealed",
            "tf.locking*",
            "tf.resources_moved",
            "tf.move_abandoned",
            "tf.frozen",
            "tf.unfrozen",
            "tf.freeze_expired",
        ];
        // Written around `insert_audit`: some of these names are no kind the code
        // writes (the filters must take any name literally).
        for event in events {
            conn.execute(
                "INSERT INTO audit (at, actor, scope, event, payload) VALUES ('2026-03-01T10:00:00Z', 't', 'tf/a', ?1, '{}')",
                params![event],
            )
            .unwrap();
        }
        // (event filter, left out, events listed oldest first)
        type Row<'a> = (Option<&'a str>, Option<&'a str>, &'a [&'a str]);
        let table: &[Row] = &[
            (
                Some("tf.lock"),
                None,
                &["tf.lock_acquired", "tf.lock_forced", "tf.locking*"],
            ),
            (Some("rollback"), None, &["tf.rollback"]),
            (Some("tf.rollback"), None, &["tf.rollback"]),
            // By prefix, and by its word in `cluster.state_lock_broken`.
            (
                Some("lock"),
                None,
                &[
                    "tf.lock_acquired",
                    "tf.lock_forced",
                    "cluster.state_lock_broken",
                    "tf.locking*",
                ],
            ),
            // Words in another form: moves and freezes.
            (
                Some("move"),
                None,
                &["tf.resources_moved", "tf.move_abandoned"],
            ),
            (
                Some("moved"),
                None,
                &["tf.resources_moved", "tf.move_abandoned"],
            ),
            (
                Some("moves"),
                None,
                &["tf.resources_moved", "tf.move_abandoned"],
            ),
            (
                Some("tf.moving"),
                None,
                &["tf.resources_moved", "tf.move_abandoned"],
            ),
            (Some("resources_move"), None, &["tf.resources_moved"]),
            (Some("move_abandon"), None, &["tf.move_abandoned"]),
            (
                Some("freeze"),
                None,
                &["tf.frozen", "tf.unfrozen", "tf.freeze_expired"],
            ),
            (
                Some("frozen"),
                None,
                &["tf.frozen", "tf.unfrozen", "tf.freeze_expired"],
            ),
            (Some("unfreeze"), None, &["tf.unfrozen"]),
            (Some("unfrozen"), None, &["tf.unfrozen"]),
            (Some("freeze_expire"), None, &["tf.freeze_expired"]),
            (Some("expired"), None, &["tf.freeze_expired"]),
            (Some("mo"), None, &["tf.move_abandoned"]),
            (Some("movement"), None, &[]),
            // Whatever the case: what the lower case finds.
            (
                Some("MOVE"),
                None,
                &["tf.resources_moved", "tf.move_abandoned"],
            ),
            (
                Some("Move"),
                None,
                &["tf.resources_moved", "tf.move_abandoned"],
            ),
            (
                Some("FREEZE"),
                None,
                &["tf.frozen", "tf.unfrozen", "tf.freeze_expired"],
            ),
            (Some("UnFrozen"), None, &["tf.unfrozen"]),
            (Some("Tf.Rollback"), None, &["tf.rollback"]),
            (Some("ROLLB"), None, &["tf.rollback"]),
            (Some("MOVEMENT"), None, &[]),
            (Some("move*"), None, &[]),
            (Some("lock%"), None, &[]),
            (
                Some("state"),
                None,
                &["cluster.state_lock_broken", "state.revealed"],
            ),
            (Some("ollback"), None, &[]),
            (
                Some("TF.LOCK"),
                None,
                &["tf.lock_acquired", "tf.lock_forced", "tf.locking*"],
            ),
            (Some("TF.LOCKING*"), None, &["tf.locking*"]),
            (Some("TF.LOCK%"), None, &[]),
            // Wildcards and LIKE's characters are taken literally.
            (Some("*"), None, &[]),
            (Some("tf.locking*"), None, &["tf.locking*"]),
            (Some("tf.lock?acquired"), None, &[]),
            (Some("tf.lock%"), None, &[]),
            (Some("tf.lock[_]"), None, &[]),
            (Some("ui"), Some("ui.login"), &["ui.logout"]),
            (
                None,
                Some("ui.login"),
                &[
                    "tf.lock_acquired",
                    "tf.lock_forced",
                    "tf.rollback",
                    "cluster.state_lock_broken",
                    "ui.logout",
                    "state.revealed",
                    "tf.locking*",
                    "tf.resources_moved",
                    "tf.move_abandoned",
                    "tf.frozen",
                    "tf.unfrozen",
                    "tf.freeze_expired",
                ],
            ),
            (Some("ui.login"), None, &["ui.login"]),
        ];
        for (event, exclude, want) in table {
            let filter = AuditFilter {
                event: event.map(str::to_string),
                exclude: exclude.map(str::to_string),
                ..AuditFilter::default()
            };
            let got: Vec<String> = list_audit_filtered(&conn, &filter, 100)
                .unwrap()
                .into_iter()
                .map(|r| r.event)
                .collect();
            assert_eq!(&got, want, "{event:?} {exclude:?}");
        }
        // The Rust rule and the SQL agree.
        for (event, exclude, want) in table {
            if exclude.is_none() {
                let by_rule: Vec<&str> = events
                    .iter()
                    .copied()
                    .filter(|e| event.is_none_or(|f| event_matches(e, f)))
                    .collect();
                assert_eq!(&by_rule, want, "{event:?}");
            }
        }
        let kinds = event_kinds(&conn, 100).unwrap();
        let mut sorted: Vec<String> = events.iter().map(|e| e.to_string()).collect();
        sorted.sort();
        assert_eq!(kinds, sorted);
        assert_eq!(event_kinds(&conn, 2).unwrap(), sorted[..2]);
    }

    /// The filter finds the same whatever the case of its ASCII letters, and of the
    /// name's (a kind an earlier release wrote in another case); other letters compare
    /// exactly, in the SQL as in the Rust rule.
    #[test]
    fn event_filters_fold_ascii_case_and_nothing_else() {
        let conn = audit_db();
        let events = [
            "tf.resources_moved",
            "tf.frozen",
            "Legacy.Resources_Moved",
            "tf.\u{c9}TAT",
        ];
        for event in events {
            conn.execute(
                "INSERT INTO audit (at, actor, scope, event, payload) VALUES ('2026-03-01T10:00:00Z', 't', 'tf/a', ?1, '{}')",
                params![event],
            )
            .unwrap();
        }
        // (filter, events found oldest first)
        let table: &[(&str, &[&str])] = &[
            ("move", &["tf.resources_moved", "Legacy.Resources_Moved"]),
            ("Move", &["tf.resources_moved", "Legacy.Resources_Moved"]),
            ("MOVED", &["tf.resources_moved", "Legacy.Resources_Moved"]),
            ("legacy", &["Legacy.Resources_Moved"]),
            ("LEGACY.RES", &["Legacy.Resources_Moved"]),
            (
                "resources_MOVED",
                &["tf.resources_moved", "Legacy.Resources_Moved"],
            ),
            ("freeze", &["tf.frozen"]),
            ("FREEZE", &["tf.frozen"]),
            ("Frozen", &["tf.frozen"]),
            // Only ASCII letters fold: É and é are different letters to the filter.
            ("\u{c9}tat", &["tf.\u{c9}TAT"]),
            ("\u{c9}TAT", &["tf.\u{c9}TAT"]),
            ("\u{e9}tat", &[]),
        ];
        for (filter, want) in table {
            let listed = AuditFilter {
                event: Some(filter.to_string()),
                ..AuditFilter::default()
            };
            let got: Vec<String> = list_audit_filtered(&conn, &listed, 100)
                .unwrap()
                .into_iter()
                .map(|r| r.event)
                .collect();
            assert_eq!(&got, want, "{filter}");
            let by_rule: Vec<&str> = events
                .iter()
                .copied()
                .filter(|e| event_matches(e, filter))
                .collect();
            assert_eq!(&by_rule, want, "{filter}");
        }
    }

    /// Both listings and the kinds walk an index or the log by id, never sort it.
    #[test]
    fn the_listing_and_the_kinds_use_an_index_and_no_sort() {
        let conn = audit_db();
        for sql in [
            listing_sql(true, Dialect::Sqlite),
            listing_sql(false, Dialect::Sqlite),
            EVENT_KINDS_SQL.to_string(),
        ] {
            let plan = crate::store::db::query_plan(&conn, &sql);
            assert!(
                !plan.iter().any(|s| s.contains("TEMP B-TREE")),
                "{sql}: {plan:?}"
            );
            if sql.contains("scope = ?1") {
                assert!(
                    plan.iter().any(|s| s.contains("audit_by_scope")),
                    "{plan:?}"
                );
            }
            if sql.contains("MIN(event)") {
                assert!(
                    plan.iter().filter(|s| s.contains("audit_by_event")).count() >= 2,
                    "{plan:?}"
                );
            }
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

    #[test]
    fn an_undeclared_event_is_refused_where_tests_run_and_declared_ones_are_unique() {
        let conn = audit_db();
        let err = insert_audit(&conn, &entry("tf/a", "tf.never_declared")).unwrap_err();
        assert!(err.to_string().contains("EVENTS"), "{err}");
        assert!(list_audit(&conn, None, None, 10).unwrap().is_empty());
        let mut names: Vec<&str> = EVENTS.iter().map(|k| k.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), EVENTS.len(), "an event kind is declared twice");
        for k in EVENTS {
            assert_eq!(event_kind(k.name), Some(k));
        }
    }
}
