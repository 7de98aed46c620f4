//! Maintenance freezes: while a workspace is frozen nobody may take its lock or write
//! its state without one (`-lock=false`), and drift checks skip it.
//!
//! A freeze is one row in `tf_freezes` (this module owns it): who froze the workspace,
//! why, and optionally until when. The rules that use it run in `tofu::mod` inside the
//! LOCK transaction and again inside every version commit, beside the lock holder
//! check, so a write cannot slip past a freeze that committed before it. A freeze
//! never breaks a lock already held: the holder's writes and unlock still work, and the
//! freeze applies once the lock is released (nobody can take it again).
//!
//! A LOCK refused by a freeze answers 423 with a LockInfo built from the freeze
//! ([`Freeze::lock_info`]): Terraform prints its `Who`/`Info`/`Operation`, so the person
//! running `apply` reads the reason and who froze it. An expired freeze is removed, and
//! audited, when it is noticed: by the first lock or write transaction after it
//! expired, by the `freezes` listing, or by the periodic housekeeping.

use crate::store::sql::{params, Connection, OptionalExtension};
use serde::Serialize;

/// The freezes table; `crate::schema` applies it.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tf_freezes (
    workspace   TEXT PRIMARY KEY,
    frozen_by   TEXT NOT NULL,
    reason      TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    -- unix seconds the freeze ends at; NULL: until unfrozen
    until       INTEGER
) WITHOUT ROWID;
"#;

pub use crate::names::MAX_REASON_CHARS;
/// Longest a freeze may be set for ahead (a year); longer is "until unfrozen".
pub const MAX_AHEAD_SECONDS: i64 = 366 * 24 * 3600;
/// The `ID` of the LockInfo a freeze answers with (never a lock a client can hold:
/// no lock is taken while a freeze is in force).
pub const LOCK_ID_PREFIX: &str = "stategate-freeze-";
/// The `Operation` of that LockInfo.
pub const OPERATION: &str = "stategate workspace freeze";

/// A workspace's freeze as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Freeze {
    pub workspace: String,
    pub frozen_by: String,
    pub reason: String,
    /// RFC 3339.
    pub created_at: String,
    /// Unix seconds; `None`: until unfrozen.
    pub until: Option<i64>,
}

impl Freeze {
    /// In force at `now` (not yet expired).
    pub fn in_force(&self, now: i64) -> bool {
        self.until.is_none_or(|until| now < until)
    }

    /// When it ends, for people, as every time is shown (`store::utc_minutes`):
    /// `until 2026-12-02 10:00 UTC`, or `until unfrozen`.
    pub fn until_text(&self) -> String {
        match self.until.and_then(crate::store::utc_minutes) {
            Some(t) => format!("until {t}"),
            None => "until unfrozen".to_string(),
        }
    }

    /// The LockInfo a refused LOCK (or unlocked write) carries: Terraform prints every
    /// field of it under "Lock Info:".
    pub fn lock_info(&self) -> String {
        let until = self.until_text();
        serde_json::json!({
            "ID": format!("{LOCK_ID_PREFIX}{}", self.workspace),
            "Operation": OPERATION,
            "Info": format!("workspace {} is frozen ({until}): {}", self.workspace, self.reason),
            "Who": format!("frozen by {}", self.frozen_by),
            "Version": "",
            "Created": self.created_at,
            "Path": "",
        })
        .to_string()
    }
}

/// A refusal's LockInfo as a freeze wrote it ([`Freeze::lock_info`]): who froze the
/// workspace and the `Info` (the workspace, the end and the reason). `None` for the
/// LockInfo of a lock holder, or anything that is not a freeze's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `frozen by op@site`.
    pub who: String,
    /// `workspace prod is frozen (until …): reason`.
    pub info: String,
}

/// [`Refusal`] of a LockInfo, if a freeze wrote it: the one reading of a freeze's
/// refusal, for the CLI's and the UI's error texts.
pub fn refusal(holder_info: &[u8]) -> Option<Refusal> {
    let info: serde_json::Value = serde_json::from_slice(holder_info).ok()?;
    let frozen = info["ID"].as_str()?.starts_with(LOCK_ID_PREFIX)
        && info["Operation"].as_str() == Some(OPERATION);
    let field = |k: &str| info[k].as_str().map(|s| s.chars().take(1024).collect());
    frozen.then_some(())?;
    Some(Refusal {
        who: field("Who")?,
        info: field("Info")?,
    })
}

/// Why a freeze request is refused (before anything is written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadFreeze {
    #[error("a reason is required (1-{MAX_REASON_CHARS} characters, no control characters)")]
    Reason,
    #[error("give --until or --for, not both")]
    Both,
    #[error("until must be an RFC 3339 time such as 2026-12-02T10:00:00Z (or 2026-12-02T10:00Z)")]
    Until,
    #[error("for must be a duration such as 90m, 2h or 3d")]
    For,
    #[error("the end of the freeze must be in the future and at most a year ahead")]
    OutOfRange,
}

/// The reason, trimmed, if it is one a LockInfo and an audit row may carry.
pub fn check_reason(reason: &str) -> Result<String, BadFreeze> {
    crate::names::reason(reason)
        .map(str::to_string)
        .ok_or(BadFreeze::Reason)
}

/// When a freeze requested at `now` ends: `until` (RFC 3339; seconds may be left
/// out), `for` (`90s`, `30m`, `2h`, `3d`), or neither (until unfrozen).
pub fn parse_end(
    until: Option<&str>,
    for_: Option<&str>,
    now: i64,
) -> Result<Option<i64>, BadFreeze> {
    let end = match (
        until.map(str::trim).filter(|s| !s.is_empty()),
        for_.map(str::trim).filter(|s| !s.is_empty()),
    ) {
        (Some(_), Some(_)) => return Err(BadFreeze::Both),
        (None, None) => return Ok(None),
        (Some(text), None) => parse_instant(text)?,
        (None, Some(text)) => now
            .checked_add(parse_duration(text)?)
            .ok_or(BadFreeze::OutOfRange)?,
    };
    if end <= now || end - now > MAX_AHEAD_SECONDS {
        return Err(BadFreeze::OutOfRange);
    }
    Ok(Some(end))
}

fn parse_instant(text: &str) -> Result<i64, BadFreeze> {
    use time::format_description::well_known::Rfc3339;
    if text.len() > 64 {
        return Err(BadFreeze::Until);
    }
    let parsed = time::OffsetDateTime::parse(text, &Rfc3339).or_else(|_| {
        // `2026-12-02T10:00Z`: the same instant without seconds.
        let (clock, zone) = text
            .find(['Z', 'z', '+'])
            .or_else(|| text.rfind('-').filter(|&i| i > 10))
            .map(|i| text.split_at(i))
            .ok_or(BadFreeze::Until)?;
        time::OffsetDateTime::parse(&format!("{clock}:00{zone}"), &Rfc3339)
            .map_err(|_| BadFreeze::Until)
    })?;
    Ok(parsed.unix_timestamp())
}

fn parse_duration(text: &str) -> Result<i64, BadFreeze> {
    crate::config::parse_duration(text)
        .and_then(|s| i64::try_from(s).ok())
        .ok_or(BadFreeze::For)
}

/// What a workspace's freeze row means at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    NotFrozen,
    Frozen(Freeze),
    /// Ended, but not yet removed: whoever notices it in a write transaction removes
    /// it and audits the expiry.
    Expired(Freeze),
}

pub fn decide(row: Option<Freeze>, now: i64) -> State {
    match row {
        None => State::NotFrozen,
        Some(f) if f.in_force(now) => State::Frozen(f),
        Some(f) => State::Expired(f),
    }
}

fn freeze_row(r: &crate::store::sql::Row<'_>) -> crate::store::sql::Result<Freeze> {
    Ok(Freeze {
        workspace: r.get(0)?,
        frozen_by: r.get(1)?,
        reason: r.get(2)?,
        created_at: r.get(3)?,
        until: r.get(4)?,
    })
}

const COLUMNS: &str = "workspace, frozen_by, reason, created_at, until";

/// The freeze row of `workspace`, expired or not.
pub fn freeze_of(
    conn: &Connection,
    workspace: &str,
) -> Result<Option<Freeze>, crate::store::sql::Error> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM tf_freezes WHERE workspace = ?1"
    ))?
    .query_row([workspace], freeze_row)
    .optional()
}

/// Every freeze row, by workspace name.
pub fn all_freezes(conn: &Connection) -> Result<Vec<Freeze>, crate::store::sql::Error> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM tf_freezes ORDER BY workspace"
    ))?;
    let rows = stmt.query_map([], freeze_row)?.collect();
    rows
}

/// Freezes (or re-freezes, replacing the earlier row) a workspace.
pub fn put_freeze(conn: &Connection, freeze: &Freeze) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached(&format!(
        "INSERT INTO tf_freezes ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (workspace) DO UPDATE SET frozen_by = excluded.frozen_by,
           reason = excluded.reason, created_at = excluded.created_at, until = excluded.until"
    ))?
    .execute(params![
        freeze.workspace,
        freeze.frozen_by,
        freeze.reason,
        freeze.created_at,
        freeze.until
    ])?;
    Ok(())
}

/// Removes the freeze of `workspace`; whether there was one.
pub fn delete_freeze(conn: &Connection, workspace: &str) -> Result<bool, crate::store::sql::Error> {
    let n = conn
        .prepare_cached("DELETE FROM tf_freezes WHERE workspace = ?1")?
        .execute([workspace])?;
    Ok(n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn freeze(until: Option<i64>) -> Freeze {
        Freeze {
            workspace: "prod".into(),
            frozen_by: "op@site".into(),
            reason: "incident 42".into(),
            created_at: "2026-12-01T00:00:00Z".into(),
            until,
        }
    }

    #[test]
    fn decisions() {
        assert_eq!(decide(None, 10), State::NotFrozen);
        assert_eq!(decide(Some(freeze(None)), 10), State::Frozen(freeze(None)));
        assert_eq!(
            decide(Some(freeze(Some(11))), 10),
            State::Frozen(freeze(Some(11)))
        );
        assert_eq!(
            decide(Some(freeze(Some(10))), 10),
            State::Expired(freeze(Some(10)))
        );
    }

    #[test]
    fn ends() {
        let now = 1_796_205_600; // 2026-12-02T10:00:00Z
        let long = "9".repeat(100);
        type Row<'a> = (
            Option<&'a str>,
            Option<&'a str>,
            Result<Option<i64>, BadFreeze>,
        );
        let table: Vec<Row> = vec![
            (None, None, Ok(None)),
            (Some(" "), None, Ok(None)),
            (None, Some("2h"), Ok(Some(now + 7200))),
            (None, Some("90m"), Ok(Some(now + 5400))),
            (None, Some("3d"), Ok(Some(now + 3 * 86_400))),
            (None, Some("45s"), Ok(Some(now + 45))),
            (Some("2026-12-02T11:00Z"), None, Ok(Some(now + 3600))),
            (Some("2026-12-02T11:00:30Z"), None, Ok(Some(now + 3630))),
            (Some("2026-12-02T12:00+01:00"), None, Ok(Some(now + 3600))),
            (Some("2026-12-02T09:00-02:00"), None, Ok(Some(now + 3600))),
            (Some("2026-12-02T11:00Z"), Some("2h"), Err(BadFreeze::Both)),
            (Some("tomorrow"), None, Err(BadFreeze::Until)),
            (Some("2026-12-02"), None, Err(BadFreeze::Until)),
            (Some(&long), None, Err(BadFreeze::Until)),
            (Some("2026-12-02T09:00Z"), None, Err(BadFreeze::OutOfRange)),
            (Some("2026-12-02T10:00Z"), None, Err(BadFreeze::OutOfRange)),
            (Some("2028-12-02T10:00Z"), None, Err(BadFreeze::OutOfRange)),
            (None, Some("0h"), Err(BadFreeze::OutOfRange)),
            (None, Some("400d"), Err(BadFreeze::OutOfRange)),
            (None, Some("999999999d"), Err(BadFreeze::OutOfRange)),
            (None, Some("9999999999d"), Err(BadFreeze::For)),
            (None, Some("2"), Err(BadFreeze::For)),
            (None, Some("h"), Err(BadFreeze::For)),
            (None, Some("2w"), Err(BadFreeze::For)),
            (None, Some("-2h"), Err(BadFreeze::For)),
            (None, Some("2h30m"), Err(BadFreeze::For)),
        ];
        for (until, for_, expected) in table {
            assert_eq!(parse_end(until, for_, now), expected, "{until:?} {for_:?}");
        }
    }

    #[test]
    fn reasons() {
        assert_eq!(check_reason("  incident  ").unwrap(), "incident");
        assert_eq!(check_reason(""), Err(BadFreeze::Reason));
        assert_eq!(check_reason("a\nb"), Err(BadFreeze::Reason));
        assert_eq!(
            check_reason(&"x".repeat(MAX_REASON_CHARS + 1)),
            Err(BadFreeze::Reason)
        );
        assert!(check_reason(&"é".repeat(MAX_REASON_CHARS)).is_ok());
    }

    #[test]
    fn the_lock_info_names_the_reason_and_who_froze_it() {
        let info: serde_json::Value =
            serde_json::from_str(&freeze(Some(1_796_205_600)).lock_info()).unwrap();
        assert_eq!(info["ID"], "stategate-freeze-prod");
        assert_eq!(info["Who"], "frozen by op@site");
        assert_eq!(info["Operation"], OPERATION);
        assert_eq!(
            info["Info"],
            "workspace prod is frozen (until 2026-12-02 10:00 UTC): incident 42"
        );
    }

    /// The CLI and the UI tell a freeze's refusal from a lock holder's by this one
    /// reading: a freeze's LockInfo reads back as who and why; a holder's (even one whose
    /// ID mimics a freeze's, but not its operation) or a body that is not JSON does not.
    #[test]
    fn a_freezes_refusal_reads_back_and_nothing_else_does() {
        let f = freeze(Some(1_796_205_600));
        assert_eq!(
            refusal(f.lock_info().as_bytes()),
            Some(Refusal {
                who: "frozen by op@site".into(),
                info: "workspace prod is frozen (until 2026-12-02 10:00 UTC): incident 42".into(),
            })
        );
        for other in [
            &br#"{"ID":"L1","Operation":"OperationTypeApply","Who":"me","Info":""}"#[..],
            br#"{"ID":"stategate-freeze-prod","Operation":"OperationTypeApply","Who":"me","Info":"x"}"#,
            b"not json",
            b"",
        ] {
            assert_eq!(refusal(other), None, "{}", String::from_utf8_lossy(other));
        }
        assert_eq!(f.until_text(), "until 2026-12-02 10:00 UTC");
        assert_eq!(freeze(None).until_text(), "until unfrozen");
    }

    #[test]
    fn rows() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        assert_eq!(freeze_of(&conn, "prod").unwrap(), None);
        put_freeze(&conn, &freeze(None)).unwrap();
        put_freeze(&conn, &freeze(Some(5))).unwrap();
        assert_eq!(freeze_of(&conn, "prod").unwrap(), Some(freeze(Some(5))));
        assert_eq!(all_freezes(&conn).unwrap(), vec![freeze(Some(5))]);
        assert!(delete_freeze(&conn, "prod").unwrap());
        assert!(!delete_freeze(&conn, "prod").unwrap());
        assert!(all_freezes(&conn).unwrap().is_empty());
    }
}
