//! The drift run history: one row per check or approved apply in `drift_runs`, and
//! in `drift_outputs_pruned` the runs whose plan text retention deleted.
//!
//! A row is inserted when a run starts and completed exactly once when it ends; the
//! database enforces the rest with triggers and indexes, whoever writes:
//! - a finished row can never change, and no row can ever be deleted;
//! - a workspace has at most one unfinished run (a check or an apply), across every
//!   process that opens the database (the server's scheduler, `drift run`);
//! - a check can be approved (an apply row naming it) at most once;
//! - a pruning record is written before the output blob is deleted and never changes,
//!   so a missing output without one is a loss, never retention.

use crate::store::sql::{params, Connection, OptionalExtension};
use serde::Serialize;

use super::plan::{Changes, Outcome};

/// The history tables, in the dialect both databases share (`crate::schema` spells them
/// for PostgreSQL); a macro so that [`SCHEMA`] can be made of them at compile time.
macro_rules! drift_tables {
    () => {
        r#"
CREATE TABLE IF NOT EXISTS drift_runs (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace       TEXT NOT NULL,
    kind            TEXT NOT NULL CHECK (kind IN ('check', 'apply')),
    trigger         TEXT NOT NULL,
    applies         INTEGER REFERENCES drift_runs(id),
    started_at      TEXT NOT NULL,
    finished_at     TEXT,
    exit_code       INTEGER,
    outcome         TEXT,
    message         TEXT,
    to_add          INTEGER,
    to_change       INTEGER,
    to_destroy      INTEGER,
    serial          INTEGER,
    lineage         TEXT,
    output_blob     TEXT,
    plan_expires_at INTEGER,
    locked_by       TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS drift_one_active_run
    ON drift_runs (workspace) WHERE finished_at IS NULL;
CREATE UNIQUE INDEX IF NOT EXISTS drift_one_apply_per_check
    ON drift_runs (applies) WHERE applies IS NOT NULL;
CREATE INDEX IF NOT EXISTS drift_by_workspace ON drift_runs (workspace, id);
CREATE TABLE IF NOT EXISTS drift_outputs_pruned (
    run_id       INTEGER PRIMARY KEY REFERENCES drift_runs(id),
    pruned_at    TEXT NOT NULL,
    keep_outputs INTEGER NOT NULL
);
"#
    };
}

/// The history tables and SQLite's append-only triggers; `crate::schema` applies it.
pub const SCHEMA: &str = concat!(
    drift_tables!(),
    r#"
CREATE TRIGGER IF NOT EXISTS drift_finished_rows_are_final BEFORE UPDATE ON drift_runs
WHEN OLD.finished_at IS NOT NULL
  OR NEW.id IS NOT OLD.id OR NEW.workspace IS NOT OLD.workspace OR NEW.kind IS NOT OLD.kind
  OR NEW.applies IS NOT OLD.applies OR NEW.started_at IS NOT OLD.started_at
BEGIN SELECT RAISE(ABORT, 'drift history is append-only: a finished run cannot be changed'); END;
CREATE TRIGGER IF NOT EXISTS drift_runs_no_delete BEFORE DELETE ON drift_runs
BEGIN SELECT RAISE(ABORT, 'drift history is append-only: runs cannot be deleted'); END;
CREATE TRIGGER IF NOT EXISTS drift_pruned_records_are_final BEFORE UPDATE ON drift_outputs_pruned
BEGIN SELECT RAISE(ABORT, 'drift history is append-only: a pruning record cannot be changed'); END;
CREATE TRIGGER IF NOT EXISTS drift_pruned_records_no_delete BEFORE DELETE ON drift_outputs_pruned
BEGIN SELECT RAISE(ABORT, 'drift history is append-only: a pruning record cannot be deleted'); END;
"#
);

/// [`SCHEMA`] for PostgreSQL: the same tables, spelled for it, the columns added since
/// (an index an earlier release made lacks them; `IF NOT EXISTS` keeps this
/// idempotent), and the same append-only rules as trigger functions (`TRUNCATE`
/// refused too).
pub fn postgres_schema() -> Result<String, String> {
    Ok(crate::store::sql::postgres_ddl(drift_tables!())?
        + POSTGRES_ADDED_COLUMNS
        + POSTGRES_TRIGGERS)
}

/// The `drift_runs` columns added after its first release, which an earlier release's
/// table gets by [`migrate`] (SQLite) or [`POSTGRES_ADDED_COLUMNS`]. NULL in the rows
/// it already holds: a finished row is final (the append-only triggers), so an old
/// `skipped_locked` run is never rewritten, and its message still names the holder.
const ADDED_RUN_COLUMNS: &[(&str, &str)] = &[("locked_by", "TEXT")];

const POSTGRES_ADDED_COLUMNS: &str = r#"
ALTER TABLE drift_runs ADD COLUMN IF NOT EXISTS locked_by TEXT COLLATE "C";
"#;

/// Migration (`crate::schema::MIGRATIONS`): adds [`ADDED_RUN_COLUMNS`] that an earlier
/// release's SQLite `drift_runs` lacks. Idempotent; a database without the table is
/// left to [`SCHEMA`]. (`ALTER TABLE … ADD COLUMN` fires no trigger and changes no row.)
pub fn migrate(conn: &Connection) -> Result<(), crate::store::sql::Error> {
    let present = conn.table_columns("drift_runs")?;
    if present.is_empty() {
        return Ok(());
    }
    for (name, kind) in ADDED_RUN_COLUMNS {
        if !present.iter().any(|p| p == name) {
            conn.execute_batch(&format!("ALTER TABLE drift_runs ADD COLUMN {name} {kind}"))?;
        }
    }
    Ok(())
}

/// PostgreSQL's append-only triggers of the history tables (see [`postgres_schema`]).
const POSTGRES_TRIGGERS: &str = r#"
CREATE OR REPLACE FUNCTION drift_runs_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION 'drift history is append-only: runs cannot be deleted';
    END IF;
    IF OLD.finished_at IS NOT NULL
       OR NEW.id IS DISTINCT FROM OLD.id OR NEW.workspace IS DISTINCT FROM OLD.workspace
       OR NEW.kind IS DISTINCT FROM OLD.kind OR NEW.applies IS DISTINCT FROM OLD.applies
       OR NEW.started_at IS DISTINCT FROM OLD.started_at THEN
        RAISE EXCEPTION 'drift history is append-only: a finished run cannot be changed';
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER drift_finished_rows_are_final BEFORE UPDATE OR DELETE ON drift_runs
    FOR EACH ROW EXECUTE FUNCTION drift_runs_append_only();
CREATE OR REPLACE TRIGGER drift_runs_no_truncate BEFORE TRUNCATE ON drift_runs
    FOR EACH STATEMENT EXECUTE FUNCTION drift_runs_append_only();
CREATE OR REPLACE FUNCTION drift_pruned_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'drift history is append-only: a pruning record cannot be changed';
    END IF;
    RAISE EXCEPTION 'drift history is append-only: a pruning record cannot be deleted';
END $$;
CREATE OR REPLACE TRIGGER drift_pruned_records_are_final BEFORE UPDATE OR DELETE ON drift_outputs_pruned
    FOR EACH ROW EXECUTE FUNCTION drift_pruned_append_only();
CREATE OR REPLACE TRIGGER drift_pruned_no_truncate BEFORE TRUNCATE ON drift_outputs_pruned
    FOR EACH STATEMENT EXECUTE FUNCTION drift_pruned_append_only();
"#;

/// Check or approved apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Check,
    Apply,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Check => "check",
            Kind::Apply => "apply",
        }
    }
}

/// One run as listings show it (the output itself is a sealed blob, fetched by `show`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    pub id: i64,
    pub workspace: String,
    pub kind: Kind,
    /// `schedule`, or the operator who asked (`operator:alice`).
    pub trigger: String,
    /// For an apply: the check whose saved plan it applies.
    pub applies: Option<i64>,
    pub started_at: String,
    /// `None` while running.
    pub finished_at: Option<String>,
    pub exit_code: Option<i64>,
    pub outcome: Option<Outcome>,
    pub message: Option<String>,
    pub changes: Option<Changes>,
    /// The state serial and lineage current when the run started.
    pub serial: Option<i64>,
    pub lineage: Option<String>,
    #[serde(skip)]
    pub output_blob: Option<String>,
    /// Until when (Unix time) the kept plan of a drifted check may be approved.
    pub plan_expires_at: Option<i64>,
    /// Who held the workspace's lock when a `skipped_locked` check met it (the lock's
    /// `Who`), recorded as such so a page shows it without reading the message; `None`
    /// for every other run, when the holder was not known (the child's own
    /// `-lock-timeout` ran out), or in a run an earlier release wrote.
    pub locked_by: Option<String>,
    /// The apply run that approved this check's plan.
    pub applied_by: Option<i64>,
    /// A drifted check whose kept plan may be approved now (set by `DriftService`).
    pub approvable: bool,
    /// An in_sync/drifted check whose workspace has a newer state (another serial or
    /// lineage) than the one it planned against: its finding may no longer hold, and
    /// Terraform will refuse its kept plan as stale.
    pub state_moved: bool,
}

/// A run's columns (`state_moved` is filled in afterwards by [`mark_moved`]).
const COLUMNS: &str =
    "r.id, r.workspace, r.kind, r.trigger, r.applies, r.started_at, r.finished_at,
    r.exit_code, r.outcome, r.message, r.to_add, r.to_change, r.to_destroy, r.serial, r.lineage,
    r.output_blob, r.plan_expires_at,
    (SELECT a.id FROM drift_runs a WHERE a.applies = r.id), r.locked_by";

/// Sets `state_moved` on in_sync/drifted runs whose workspace's newest version
/// (tombstones included) has another serial or lineage than the run planned against.
/// The version is looked up through `store`, the owner of `versions`, in the same
/// transaction; each workspace once.
fn mark_moved(conn: &Connection, runs: &mut [Run]) -> Result<(), crate::store::sql::Error> {
    let mut newest = std::collections::HashMap::new();
    for run in runs
        .iter_mut()
        .filter(|r| matches!(r.outcome, Some(Outcome::InSync | Outcome::Drifted)))
    {
        if !newest.contains_key(&run.workspace) {
            let row = crate::store::latest_row(conn, &crate::tofu::scope(&run.workspace))?
                .map(|v| (v.serial, v.lineage));
            newest.insert(run.workspace.clone(), row);
        }
        run.state_moved = newest
            .get(&run.workspace)
            .and_then(Option::as_ref)
            .is_some_and(|(serial, lineage)| *serial != run.serial || *lineage != run.lineage);
    }
    Ok(())
}

fn row_to_run(r: &crate::store::sql::Row<'_>) -> Result<Run, crate::store::sql::Error> {
    let kind: String = r.get(2)?;
    let outcome: Option<String> = r.get(8)?;
    let counts: (Option<i64>, Option<i64>, Option<i64>) = (r.get(10)?, r.get(11)?, r.get(12)?);
    Ok(Run {
        id: r.get(0)?,
        workspace: r.get(1)?,
        kind: if kind == "apply" {
            Kind::Apply
        } else {
            Kind::Check
        },
        trigger: r.get(3)?,
        applies: r.get(4)?,
        started_at: r.get(5)?,
        finished_at: r.get(6)?,
        exit_code: r.get(7)?,
        outcome: outcome.as_deref().and_then(Outcome::parse),
        message: r.get(9)?,
        changes: match counts {
            (Some(add), Some(change), Some(destroy)) => Some(Changes {
                add,
                change,
                destroy,
            }),
            _ => None,
        },
        serial: r.get(13)?,
        lineage: r.get(14)?,
        output_blob: r.get(15)?,
        plan_expires_at: r.get(16)?,
        applied_by: r.get(17)?,
        locked_by: r.get(18)?,
        approvable: false,
        state_moved: false,
    })
}

/// Why a run could not start.
#[derive(Debug, PartialEq, Eq)]
pub enum StartRefused {
    /// Another run of the workspace is unfinished.
    Busy(i64),
}

/// Inserts an unfinished run, refused while the workspace has another.
pub fn start_run(
    conn: &Connection,
    workspace: &str,
    kind: Kind,
    trigger: &str,
    applies: Option<i64>,
    serial: Option<i64>,
    lineage: Option<&str>,
) -> Result<Result<i64, StartRefused>, crate::store::sql::Error> {
    if let Some(running) = active_run(conn, workspace)? {
        return Ok(Err(StartRefused::Busy(running)));
    }
    let id = conn.query_row(
        "INSERT INTO drift_runs (workspace, kind, trigger, applies, started_at, serial, lineage)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING id",
        params![
            workspace,
            kind.as_str(),
            trigger,
            applies,
            crate::store::now_rfc3339(),
            serial,
            lineage
        ],
        |r| r.get(0),
    )?;
    Ok(Ok(id))
}

/// The unfinished run of a workspace.
pub fn active_run(
    conn: &Connection,
    workspace: &str,
) -> Result<Option<i64>, crate::store::sql::Error> {
    conn.query_row(
        "SELECT id FROM drift_runs WHERE workspace = ?1 AND finished_at IS NULL",
        [workspace],
        |r| r.get(0),
    )
    .optional()
}

/// How a run ended.
#[derive(Debug, Clone, Default)]
pub struct Finished {
    pub exit_code: Option<i64>,
    pub outcome: Option<Outcome>,
    pub message: String,
    pub changes: Option<Changes>,
    pub output_blob: Option<String>,
    pub plan_expires_at: Option<i64>,
    /// A `skipped_locked` check's lock holder ([`Run::locked_by`]).
    pub locked_by: Option<String>,
}

/// Completes an unfinished run; `false` when it was already finished (never changed).
pub fn finish_run(
    conn: &Connection,
    id: i64,
    done: &Finished,
) -> Result<bool, crate::store::sql::Error> {
    let c = done.changes;
    let changed = conn.execute(
        "UPDATE drift_runs SET finished_at = ?2, exit_code = ?3, outcome = ?4, message = ?5,
                to_add = ?6, to_change = ?7, to_destroy = ?8, output_blob = ?9, plan_expires_at = ?10,
                locked_by = ?11
          WHERE id = ?1 AND finished_at IS NULL",
        params![
            id,
            crate::store::now_rfc3339(),
            done.exit_code,
            done.outcome.map(Outcome::as_str),
            done.message,
            c.map(|c| c.add),
            c.map(|c| c.change),
            c.map(|c| c.destroy),
            done.output_blob,
            done.plan_expires_at,
            done.locked_by
        ],
    )?;
    Ok(changed == 1)
}

pub fn get_run(conn: &Connection, id: i64) -> Result<Option<Run>, crate::store::sql::Error> {
    let run = conn
        .query_row(
            &format!("SELECT {COLUMNS} FROM drift_runs r WHERE r.id = ?1"),
            [id],
            row_to_run,
        )
        .optional()?;
    let mut runs: Vec<Run> = run.into_iter().collect();
    mark_moved(conn, &mut runs)?;
    Ok(runs.pop())
}

/// How many runs of `workspace` are newer than run `id`, counted up to `cap` (an
/// index range, however long the history).
pub fn newer_runs(
    conn: &Connection,
    workspace: &str,
    id: i64,
    cap: u64,
) -> Result<u64, crate::store::sql::Error> {
    conn.query_row(
        "SELECT count(*) FROM (SELECT 1 FROM drift_runs WHERE workspace = ?1 AND id > ?2 LIMIT ?3) later",
        params![workspace, id, i64::try_from(cap).unwrap_or(i64::MAX)],
        |r| r.get(0),
    )
}

/// When retention deleted a run's output, and the `keep_outputs` it applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pruned {
    pub at: String,
    pub keep: u64,
}

/// Records that retention (keeping `keep` runs per workspace) is deleting these runs'
/// outputs; called before the blobs are deleted. A run recorded already keeps its
/// first record (an earlier pass whose delete failed).
pub fn record_pruned(
    conn: &Connection,
    runs: &[i64],
    keep: u64,
) -> Result<(), crate::store::sql::Error> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO drift_outputs_pruned (run_id, pruned_at, keep_outputs)
         VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
    )?;
    let (at, keep) = (
        crate::store::now_rfc3339(),
        i64::try_from(keep).unwrap_or(i64::MAX),
    );
    for run in runs {
        stmt.execute(params![run, at, keep])?;
    }
    Ok(())
}

/// The pruning record of a run's output, if retention deleted it.
pub fn pruned(conn: &Connection, run: i64) -> Result<Option<Pruned>, crate::store::sql::Error> {
    conn.query_row(
        "SELECT pruned_at, keep_outputs FROM drift_outputs_pruned WHERE run_id = ?1",
        [run],
        |r| {
            Ok(Pruned {
                at: r.get(0)?,
                keep: u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
            })
        },
    )
    .optional()
}

/// The newest `limit` runs (of one workspace, or all), newest first.
pub fn list_runs(
    conn: &Connection,
    workspace: Option<&str>,
    limit: u32,
) -> Result<Vec<Run>, crate::store::sql::Error> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM drift_runs r WHERE (CAST(?1 AS TEXT) IS NULL OR r.workspace = ?1)
          ORDER BY r.id DESC LIMIT ?2"
    ))?;
    let rows = stmt.query_map(params![workspace, limit], row_to_run)?;
    let mut runs = rows.collect::<Result<Vec<_>, _>>()?;
    mark_moved(conn, &mut runs)?;
    Ok(runs)
}

/// The outcome of the last finished check before run `before` that said something
/// about the infrastructure (in sync, drifted, error).
pub fn previous_status(
    conn: &Connection,
    workspace: &str,
    before: i64,
) -> Result<Option<Outcome>, crate::store::sql::Error> {
    let text: Option<String> = conn
        .query_row(
            "SELECT outcome FROM drift_runs
              WHERE workspace = ?1 AND id < ?2 AND kind = 'check'
                AND outcome IN ('in_sync', 'drifted', 'error')
              ORDER BY id DESC LIMIT 1",
            params![workspace, before],
            |r| r.get(0),
        )
        .optional()?;
    Ok(text.as_deref().and_then(Outcome::parse))
}

/// Per workspace: the latest status-bearing check outcome and when it finished.
pub fn latest_status(
    conn: &Connection,
) -> Result<Vec<(String, Outcome, String)>, crate::store::sql::Error> {
    let mut stmt = conn.prepare(
        "SELECT workspace, outcome, finished_at FROM drift_runs r
          WHERE id = (SELECT max(id) FROM drift_runs s
                       WHERE s.workspace = r.workspace AND s.kind = 'check'
                         AND s.outcome IN ('in_sync', 'drifted', 'error'))",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (ws, outcome, at) = row?;
        if let Some(outcome) = Outcome::parse(&outcome) {
            out.push((ws, outcome, at));
        }
    }
    Ok(out)
}

/// Per workspace: its newest finished check, whatever its outcome.
pub fn latest_checks(conn: &Connection) -> Result<Vec<Run>, crate::store::sql::Error> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM drift_runs r WHERE r.id IN
           (SELECT max(id) FROM drift_runs WHERE kind = 'check' AND finished_at IS NOT NULL
             GROUP BY workspace)"
    ))?;
    let mut runs = stmt
        .query_map([], row_to_run)?
        .collect::<Result<Vec<_>, _>>()?;
    mark_moved(conn, &mut runs)?;
    Ok(runs)
}

/// Per workspace: when its newest check started (the schedule counts from it).
pub fn last_checks_started(
    conn: &Connection,
) -> Result<Vec<(String, String)>, crate::store::sql::Error> {
    let mut stmt = conn.prepare(
        "SELECT workspace, started_at FROM drift_runs r
          WHERE id = (SELECT max(id) FROM drift_runs s
                       WHERE s.workspace = r.workspace AND s.kind = 'check')",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

/// When the newest check of a workspace started (the schedule counts from it).
pub fn last_check_started(
    conn: &Connection,
    workspace: &str,
) -> Result<Option<String>, crate::store::sql::Error> {
    conn.query_row(
        "SELECT started_at FROM drift_runs WHERE workspace = ?1 AND kind = 'check'
          ORDER BY id DESC LIMIT 1",
        [workspace],
        |r| r.get(0),
    )
    .optional()
}

/// An unfinished run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    pub id: i64,
    pub workspace: String,
    pub kind: Kind,
    pub started_at: String,
}

/// Every unfinished run.
pub fn unfinished(conn: &Connection) -> Result<Vec<Unfinished>, crate::store::sql::Error> {
    let mut stmt = conn.prepare(
        "SELECT id, workspace, kind, started_at FROM drift_runs WHERE finished_at IS NULL",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(Unfinished {
            id: r.get(0)?,
            workspace: r.get(1)?,
            kind: if r.get::<_, String>(2)? == "apply" {
                Kind::Apply
            } else {
                Kind::Check
            },
            started_at: r.get(3)?,
        })
    })?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        // As `Db::open` sets it.
        conn.pragma_update(None, "foreign_keys", "ON").unwrap();
        conn.execute_batch(crate::store::db::SCHEMA).unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        conn
    }

    fn finished(outcome: Outcome) -> Finished {
        Finished {
            exit_code: Some(0),
            outcome: Some(outcome),
            message: "m".into(),
            ..Finished::default()
        }
    }

    /// A `skipped_locked` check's holder is a column of its row, read back as such; an
    /// earlier release's table gets the column on open (twice is a no-op), its finished
    /// rows untouched (NULL holder, message as written: they are final).
    #[test]
    fn the_lock_holder_is_recorded_and_an_earlier_releases_runs_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stategate.db");
        let earlier = SCHEMA.replace(",\n    locked_by       TEXT", "");
        assert_ne!(
            earlier, SCHEMA,
            "the earlier table is the one without the column"
        );
        let old = Connection::open(&path).unwrap();
        old.execute_batch(&earlier).unwrap();
        let message = r#"the workspace is locked by "ana" (apply, lock L1); nothing was disturbed"#;
        let id = start_run(&old, "prod", Kind::Check, "schedule", None, None, None)
            .unwrap()
            .unwrap();
        let skipped = Finished {
            outcome: Some(Outcome::SkippedLocked),
            message: message.into(),
            ..Finished::default()
        };
        old.execute(
            "UPDATE drift_runs SET finished_at = 't', outcome = 'skipped_locked', message = ?2 WHERE id = ?1",
            params![id, message],
        )
        .unwrap();
        drop(old);
        for _ in 0..2 {
            drop(crate::schema::open_db(&path).unwrap());
            let conn = Connection::open(&path).unwrap();
            let run = get_run(&conn, id).unwrap().unwrap();
            assert_eq!(run.outcome, Some(Outcome::SkippedLocked));
            assert_eq!(run.message.as_deref(), Some(message));
            assert_eq!(run.locked_by, None);
        }
        let conn = Connection::open(&path).unwrap();
        let next = start_run(&conn, "prod", Kind::Check, "schedule", None, None, None)
            .unwrap()
            .unwrap();
        let held = Finished {
            locked_by: Some("ci@runner-7".into()),
            ..skipped
        };
        assert!(finish_run(&conn, next, &held).unwrap());
        let run = get_run(&conn, next).unwrap().unwrap();
        assert_eq!(run.locked_by.as_deref(), Some("ci@runner-7"));
        assert_eq!(
            list_runs(&conn, Some("prod"), 10).unwrap()[0].locked_by,
            run.locked_by
        );
        // Final like every other column of a finished run.
        let err = conn
            .execute(
                "UPDATE drift_runs SET locked_by = 'x' WHERE id = ?1",
                [next],
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("append-only"), "{err}");
    }

    #[test]
    fn one_active_run_per_workspace_and_finished_rows_are_final() {
        let c = db();
        let a = start_run(
            &c,
            "prod",
            Kind::Check,
            "schedule",
            None,
            Some(3),
            Some("L"),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            start_run(&c, "prod", Kind::Check, "schedule", None, None, None).unwrap(),
            Err(StartRefused::Busy(a))
        );
        assert!(
            start_run(&c, "dev", Kind::Check, "schedule", None, None, None)
                .unwrap()
                .is_ok()
        );
        assert!(finish_run(&c, a, &finished(Outcome::InSync)).unwrap());
        assert!(
            !finish_run(&c, a, &finished(Outcome::Drifted)).unwrap(),
            "finished once"
        );
        let run = get_run(&c, a).unwrap().unwrap();
        assert_eq!(run.outcome, Some(Outcome::InSync));
        assert_eq!(run.serial, Some(3));
        for sql in [
            "UPDATE drift_runs SET outcome = 'drifted' WHERE id = 1",
            "DELETE FROM drift_runs WHERE id = 1",
            "DELETE FROM drift_runs WHERE id = 2",
        ] {
            let err = c.execute(sql, []).unwrap_err().to_string();
            assert!(err.contains("append-only"), "{sql}: {err}");
        }
        assert!(
            start_run(&c, "prod", Kind::Check, "schedule", None, None, None)
                .unwrap()
                .is_ok()
        );
    }

    #[test]
    fn state_moved_looks_up_the_workspaces_scope_through_the_index() {
        let c = db();
        let id = start_run(
            &c,
            "prod",
            Kind::Check,
            "schedule",
            None,
            Some(3),
            Some("L"),
        )
        .unwrap()
        .unwrap();
        finish_run(&c, id, &finished(Outcome::InSync)).unwrap();
        let version = |scope: &str, serial: i64| {
            c.execute(
                "INSERT INTO versions (scope, version, serial, lineage, size, created_at, actor)
                 VALUES (?1, ?2, ?2, 'L', 0, 'now', 't')",
                params![scope, serial],
            )
            .unwrap();
        };
        version(&crate::tofu::scope("prod"), 3);
        version("org/prod", 9);
        assert!(
            !get_run(&c, id).unwrap().unwrap().state_moved,
            "same serial"
        );
        version(&crate::tofu::scope("prod"), 4);
        assert!(get_run(&c, id).unwrap().unwrap().state_moved);
        assert!(list_runs(&c, Some("prod"), 1).unwrap()[0].state_moved);
        assert!(latest_checks(&c).unwrap()[0].state_moved);

        let mut stmt = c
            .prepare(&format!(
                "EXPLAIN QUERY PLAN SELECT {COLUMNS} FROM drift_runs r WHERE r.id = ?1"
            ))
            .unwrap();
        let plan: Vec<String> = stmt
            .query_map([id], |r| r.get(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        // The newest version is store's lookup (its plan is checked in store::db).
        assert!(!plan.iter().any(|s| s.starts_with("SCAN")), "{plan:?}");
    }

    #[test]
    fn newer_runs_are_counted_per_workspace_up_to_the_cap() {
        let c = db();
        let mut ids = Vec::new();
        for ws in ["prod", "dev", "prod", "prod", "prod"] {
            let id = start_run(&c, ws, Kind::Check, "schedule", None, None, None)
                .unwrap()
                .unwrap();
            finish_run(&c, id, &finished(Outcome::InSync)).unwrap();
            ids.push(id);
        }
        let table: &[(&str, i64, u64, u64)] = &[
            ("prod", ids[0], 10, 3),
            ("prod", ids[0], 2, 2),
            ("prod", ids[3], 10, 1),
            ("prod", ids[4], 10, 0),
            ("dev", ids[1], 10, 0),
            ("none", ids[0], 10, 0),
        ];
        for (ws, id, cap, want) in table {
            assert_eq!(
                newer_runs(&c, ws, *id, *cap).unwrap(),
                *want,
                "{ws} {id} {cap}"
            );
        }
    }

    #[test]
    fn pruning_records_keep_the_first_and_are_final() {
        let c = db();
        let id = start_run(&c, "prod", Kind::Check, "schedule", None, None, None)
            .unwrap()
            .unwrap();
        finish_run(&c, id, &finished(Outcome::InSync)).unwrap();
        assert_eq!(pruned(&c, id).unwrap(), None);
        record_pruned(&c, &[id], 5).unwrap();
        let first = pruned(&c, id).unwrap().unwrap();
        assert_eq!(first.keep, 5);
        record_pruned(&c, &[id], 9).unwrap();
        assert_eq!(
            pruned(&c, id).unwrap(),
            Some(first),
            "the first record stays"
        );
        let err = record_pruned(&c, &[id + 100], 5).unwrap_err().to_string();
        assert!(err.contains("FOREIGN KEY"), "only runs that exist: {err}");
        for sql in [
            "UPDATE drift_outputs_pruned SET keep_outputs = 50",
            "DELETE FROM drift_outputs_pruned",
        ] {
            let err = c.execute(sql, []).unwrap_err().to_string();
            assert!(err.contains("append-only"), "{sql}: {err}");
        }
    }

    #[test]
    fn a_check_is_approved_at_most_once() {
        let c = db();
        let check = start_run(&c, "prod", Kind::Check, "schedule", None, None, None)
            .unwrap()
            .unwrap();
        finish_run(&c, check, &finished(Outcome::Drifted)).unwrap();
        let apply = start_run(
            &c,
            "prod",
            Kind::Apply,
            "operator:a",
            Some(check),
            None,
            None,
        )
        .unwrap()
        .unwrap();
        finish_run(&c, apply, &finished(Outcome::Applied)).unwrap();
        let err = start_run(
            &c,
            "prod",
            Kind::Apply,
            "operator:b",
            Some(check),
            None,
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("UNIQUE"), "{err}");
        assert_eq!(get_run(&c, check).unwrap().unwrap().applied_by, Some(apply));
    }

    #[test]
    fn previous_and_latest_status_skip_what_says_nothing() {
        let c = db();
        let mut ids = Vec::new();
        for outcome in [
            Outcome::Drifted,
            Outcome::SkippedLocked,
            Outcome::InSync,
            Outcome::SkippedLocked,
        ] {
            let id = start_run(&c, "prod", Kind::Check, "schedule", None, None, None)
                .unwrap()
                .unwrap();
            finish_run(&c, id, &finished(outcome)).unwrap();
            ids.push(id);
        }
        assert_eq!(
            previous_status(&c, "prod", ids[2]).unwrap(),
            Some(Outcome::Drifted)
        );
        assert_eq!(previous_status(&c, "prod", ids[0]).unwrap(), None);
        let latest = latest_status(&c).unwrap();
        assert_eq!(latest.len(), 1);
        assert_eq!(latest[0].1, Outcome::InSync);
        let last = latest_checks(&c).unwrap();
        assert_eq!(
            last.iter().map(|r| (r.id, r.outcome)).collect::<Vec<_>>(),
            vec![(ids[3], Some(Outcome::SkippedLocked))],
            "the newest finished check, whatever it found"
        );
        assert_eq!(last_checks_started(&c).unwrap().len(), 1);
        let listed = list_runs(&c, Some("prod"), 2).unwrap();
        assert_eq!(
            listed.iter().map(|r| r.id).collect::<Vec<_>>(),
            vec![ids[3], ids[2]]
        );
        assert!(list_runs(&c, Some("dev"), 10).unwrap().is_empty());
    }
}
