//! Workspace locks: at most one exclusive holder per workspace in `tf_locks`, or up to
//! [`MAX_PLAN_HOLDERS`] shared plan holders in `tf_plan_locks`, never both; each row
//! holds the holder's LockInfo exactly as the client sent it.
//!
//! A LOCK whose `Operation` is exactly [`PLAN_OPERATION`] is shared: a plan never
//! writes state, it only needs the state not to change under it. Every other
//! operation (apply, import, refresh, state commands, any other spelling) is
//! exclusive. A plan holder may not write ([`Write::PlanOnly`]).
//!
//! The rules are pure functions over the current holders and the request, like the
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
-- The shared holders of plan locks (`Operation` exactly `OperationTypePlan`): a
-- workspace has rows here or one row in tf_locks, never both.
CREATE TABLE IF NOT EXISTS tf_plan_locks (
    workspace   TEXT NOT NULL,
    lock_id     TEXT NOT NULL,
    info        TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    credential  TEXT,
    PRIMARY KEY (workspace, lock_id)
) WITHOUT ROWID;
-- The exclusive LOCK (an apply) last refused because plans held the workspace: once
-- it has retried, and while it keeps retrying (seen within WAITING_WINDOW_MS), no new
-- plan joins, so plans taken back to back cannot keep it out for ever. Taking the
-- lock clears it; a writer that gave up simply stops being seen.
CREATE TABLE IF NOT EXISTS tf_lock_waiters (
    workspace   TEXT PRIMARY KEY,
    lock_id     TEXT NOT NULL,
    info        TEXT NOT NULL,
    seen_ms     INTEGER NOT NULL,
    -- refusals of this lock_id in a row, each within the window of the one before
    tries       INTEGER NOT NULL
) WITHOUT ROWID;
"#;

/// The one `Operation` that shares the lock: what Terraform and OpenTofu send for
/// `plan`. Matched exactly (another case, spaces: exclusive).
pub const PLAN_OPERATION: &str = "OperationTypePlan";

/// Most plan holders of one workspace at once; one more is refused (423).
pub const MAX_PLAN_HOLDERS: usize = 64;

/// How long an exclusive LOCK refused because plans hold the workspace keeps new
/// plans out ([`Lock::Wait`]), from its latest refusal. Terraform and OpenTofu retry a
/// refused LOCK (`-lock-timeout`) after 1, 2, 4, 8 and then every 16 seconds, so a
/// writer still retrying is seen again well within it; one that gave up stops holding
/// plans back at most this long after its last try.
pub const WAITING_WINDOW_MS: i64 = 30_000;

/// A waiting writer seen more recently than this is not recorded again when the
/// snapshot a LOCK is first judged on already shows it: its retry is refused from
/// there, as other refusals are, without a write.
pub const WAITING_REFRESH_MS: i64 = 10_000;

/// Whether a LockInfo asks for a shared plan lock: its `Operation` is exactly
/// [`PLAN_OPERATION`].
pub fn is_plan(info: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(rename = "Operation")]
        operation: Option<String>,
    }
    serde_json::from_str::<Probe>(info)
        .ok()
        .and_then(|p| p.operation)
        .is_some_and(|op| op == PLAN_OPERATION)
}

/// Everyone holding a workspace's lock: one exclusive holder, or plan holders (oldest
/// first), or nobody.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    pub exclusive: Option<HeldLock>,
    pub plans: Vec<HeldLock>,
}

impl Holders {
    pub fn is_empty(&self) -> bool {
        self.exclusive.is_none() && self.plans.is_empty()
    }

    /// The lock as a contender is shown it: the exclusive holder's LockInfo, or one
    /// naming every plan holder (see [`plans_summary`]).
    pub fn shown(&self) -> Option<HeldLock> {
        match (&self.exclusive, self.plans.as_slice()) {
            (Some(holder), _) => Some(holder.clone()),
            (None, []) => None,
            (None, plans) => Some(plans_summary(plans)),
        }
    }

    fn plan(&self, id: &str) -> Option<&HeldLock> {
        self.plans.iter().find(|p| p.id == id)
    }
}

/// One LockInfo standing for several plan holders: the oldest one's fields (its `ID`,
/// so a contender's `-lock-timeout` keeps retrying) with `Info` naming every holder
/// (at most the first 8, then how many more).
pub fn plans_summary(plans: &[HeldLock]) -> HeldLock {
    let first = &plans[0];
    let parsed: serde_json::Value = serde_json::from_str(&first.info).unwrap_or_default();
    let field = |name: &str| -> String {
        parsed[name]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(256)
            .collect()
    };
    let named: Vec<String> = plans
        .iter()
        .take(8)
        .map(|p| {
            let info: serde_json::Value = serde_json::from_str(&p.info).unwrap_or_default();
            let who: String = info["Who"]
                .as_str()
                .unwrap_or("")
                .chars()
                .take(64)
                .collect();
            format!("{} ({who})", p.id)
        })
        .collect();
    let more = plans.len().saturating_sub(8);
    let mut text = format!("shared by {} plan(s): {}", plans.len(), named.join(", "));
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    let info = serde_json::json!({
        "ID": first.id,
        "Operation": PLAN_OPERATION,
        "Info": text,
        "Who": field("Who"),
        "Version": field("Version"),
        "Created": field("Created"),
        "Path": field("Path"),
    });
    HeldLock {
        id: first.id.clone(),
        info: info.to_string(),
    }
}

/// Brings a `tf_locks` table of an earlier release up to [`SCHEMA`] (the `credential`
/// column; its existing locks record none). Nothing when the table is new or current.
pub fn migrate(conn: &Connection) -> Result<(), crate::store::sql::Error> {
    let existing = conn.table_columns("tf_locks")?;
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

/// What a LOCK does, given the current holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lock {
    /// Nobody holds it: take it alone.
    Take,
    /// A plan, and only plans hold it (or nobody): join them.
    Share,
    /// The caller already holds it (a retry after a lost response): nothing to do.
    AlreadyHeld,
    /// Someone else holds it: 423 with their LockInfo.
    Refuse,
    /// A plan, but [`MAX_PLAN_HOLDERS`] plans hold it already: 423.
    TooMany,
    /// Not a plan, and plans hold it: 423 naming them, and this LOCK is recorded as
    /// the waiting writer, which keeps new plans out while it retries.
    Wait,
    /// A plan, no exclusive holder, but a writer is waiting ([`Waiting`]): 423 saying
    /// so; the plan retries once the writer has had its turn.
    Yield,
}

/// A LOCK with `lock_id`, a plan when `plan` ([`is_plan`]), while `waiting` (a
/// writer waiting and still in force, [`Waiting::in_force`]) or not.
pub fn decide_lock(held: &Holders, waiting: bool, lock_id: &str, plan: bool) -> Lock {
    match (&held.exclusive, plan) {
        (Some(holder), _) if holder.id == lock_id => Lock::AlreadyHeld,
        (Some(_), _) => Lock::Refuse,
        (None, true) if held.plan(lock_id).is_some() => Lock::AlreadyHeld,
        // Writer preference: without it, plans overlapping back to back keep the
        // workspace shared for ever and a waiting apply never runs.
        (None, true) if waiting => Lock::Yield,
        (None, true) if held.plans.len() >= MAX_PLAN_HOLDERS => Lock::TooMany,
        (None, true) => Lock::Share,
        (None, false) if held.plans.is_empty() => Lock::Take,
        // An exclusive LOCK reusing a plan holder's ID never upgrades, and does not
        // hold other plans back.
        (None, false) if held.plan(lock_id).is_some() => Lock::Refuse,
        (None, false) => Lock::Wait,
    }
}

/// The writer waiting for a workspace's plans to finish ([`Lock::Wait`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub lock: HeldLock,
    /// When its LOCK was last refused, unix milliseconds.
    pub seen_ms: i64,
    /// How many times in a row its LOCK was refused.
    pub tries: i64,
}

impl Waiting {
    /// Whether it keeps new plans out at `now_ms`: it has retried (one LOCK refused
    /// once, `-lock-timeout=0`, has given up already and holds nobody back), and was
    /// seen within [`WAITING_WINDOW_MS`]. (A time ahead of `now_ms`, another node's
    /// clock within the bound the clock check keeps, counts as just seen.)
    pub fn in_force(&self, now_ms: i64) -> bool {
        self.tries >= 2 && now_ms.saturating_sub(self.seen_ms) < WAITING_WINDOW_MS
    }

    /// Whether a snapshot showing it may refuse its own retry without recording it
    /// again ([`WAITING_REFRESH_MS`]).
    pub fn fresh_for(&self, lock_id: &str, now_ms: i64) -> bool {
        self.in_force(now_ms)
            && self.lock.id == lock_id
            && now_ms.saturating_sub(self.seen_ms) < WAITING_REFRESH_MS
    }
}

/// What a plan kept out by the waiting writer is shown ([`Lock::Yield`]): the holders'
/// LockInfo (the waiting writer's when nobody holds the lock any more), so its
/// `-lock-timeout` keeps retrying, with `Info` naming the writer it waits for.
pub fn yielded(held: &Holders, waiting: &HeldLock) -> HeldLock {
    let base = held.shown().unwrap_or_else(|| waiting.clone());
    let mut info: serde_json::Value = serde_json::from_str(&base.info).unwrap_or_default();
    let writer: serde_json::Value = serde_json::from_str(&waiting.info).unwrap_or_default();
    let field = |value: &serde_json::Value, name: &str, most: usize| -> String {
        value[name]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(most)
            .collect()
    };
    let operation = field(&writer, "Operation", 64);
    let who = field(&writer, "Who", 64);
    let id: String = waiting.id.chars().take(64).collect();
    let before = field(&info, "Info", 1024);
    let mut text = format!(
        "{operation} {id} ({who}) is waiting for this lock: new plans wait until it has run"
    );
    if !before.is_empty() && base.id != waiting.id {
        text.push_str(&format!("; {before}"));
    }
    if info.is_object() {
        info["Info"] = text.into();
    }
    HeldLock {
        id: base.id,
        info: info.to_string(),
    }
}

/// The writer waiting on `workspace`, in force or not ([`Waiting::in_force`]).
pub fn waiting(
    conn: &Connection,
    workspace: &str,
) -> Result<Option<Waiting>, crate::store::sql::Error> {
    conn.prepare_cached(
        "SELECT lock_id, info, seen_ms, tries FROM tf_lock_waiters WHERE workspace = ?1",
    )?
    .query_row([workspace], |r| {
        Ok(Waiting {
            lock: HeldLock {
                id: r.get(0)?,
                info: r.get(1)?,
            },
            seen_ms: r.get(2)?,
            tries: r.get(3)?,
        })
    })
    .optional()
}

/// Records a refusal of `lock` as the writer waiting on `workspace`, at `now_ms`: one
/// more try of the same writer (seen within the window), or a new writer replacing any
/// other (the latest refused writer is the one that holds plans back).
pub fn put_waiting(
    conn: &Connection,
    workspace: &str,
    lock: &HeldLock,
    now_ms: i64,
) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached(
        "INSERT INTO tf_lock_waiters (workspace, lock_id, info, seen_ms, tries) VALUES (?1, ?2, ?3, ?4, 1) \
         ON CONFLICT (workspace) DO UPDATE SET \
         tries = CASE WHEN tf_lock_waiters.lock_id = excluded.lock_id AND tf_lock_waiters.seen_ms > ?5 \
                 THEN tf_lock_waiters.tries + 1 ELSE 1 END, \
         lock_id = excluded.lock_id, info = excluded.info, seen_ms = excluded.seen_ms",
    )?
    .execute(params![
        workspace,
        lock.id,
        lock.info,
        now_ms,
        now_ms.saturating_sub(WAITING_WINDOW_MS)
    ])?;
    Ok(())
}

/// Forgets the writer waiting on `workspace` (it took the lock).
pub fn clear_waiting(conn: &Connection, workspace: &str) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached("DELETE FROM tf_lock_waiters WHERE workspace = ?1")?
        .execute([workspace])?;
    Ok(())
}

/// What an UNLOCK does, given the current holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unlock {
    /// Nothing held, or a plan's own unlock again: nothing to do (idempotent).
    Nothing,
    /// The exclusive holder's own ID, or Terraform's force-unlock (no ID): delete the
    /// lock, and every plan holder (each audited).
    Release,
    /// One plan holder's: its own unlock (its LockInfo sent again) or a force-unlock
    /// naming it (a body with its ID and no `Operation`, OpenTofu's).
    ReleasePlan,
    /// Another ID than any holder's, or a plan holder's ID under another LockInfo (a
    /// holder unlocking someone else): 423 with the holders' LockInfo.
    Refuse,
}

/// An UNLOCK `request`, whose body was `sent` (the LockInfo, when it had one).
pub fn decide_unlock(held: &Holders, request: &UnlockRequest, sent: Option<&str>) -> Unlock {
    if held.is_empty() {
        return Unlock::Nothing;
    }
    let UnlockRequest::Id(id) = request else {
        return Unlock::Release;
    };
    if held.exclusive.as_ref().is_some_and(|h| &h.id == id) {
        return Unlock::Release;
    }
    match held.plan(id) {
        Some(holder) if sent.is_some_and(|sent| unlocks_plan(holder, sent)) => Unlock::ReleasePlan,
        // A plan that already unlocked (a retry after a lost answer) while other
        // plans still hold: nothing to do, as when nobody holds.
        None if held.exclusive.is_none() && sent.is_some_and(is_plan) => Unlock::Nothing,
        _ => Unlock::Refuse,
    }
}

/// Whether an UNLOCK body `sent` frees the plan `holder`: the holder's own LockInfo
/// (what Terraform and OpenTofu send again on unlock, compared as JSON) or a
/// force-unlock naming only its ID (no `Operation`).
fn unlocks_plan(holder: &HeldLock, sent: &str) -> bool {
    let Ok(sent) = serde_json::from_str::<serde_json::Value>(sent) else {
        return false;
    };
    let operation = sent["Operation"].as_str().unwrap_or("");
    if operation.is_empty() {
        return true;
    }
    serde_json::from_str::<serde_json::Value>(&holder.info).is_ok_and(|stored| stored == sent)
}

/// May a state write (or delete, or rollback) carrying `lock_id` (`?ID=`) proceed?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Unlocked and no ID, or the exclusive holder's ID.
    Allow,
    /// An ID, but nobody holds the lock (released or force-unlocked meanwhile): 409.
    NotHeld,
    /// A plan holder's ID: a plan lock never writes (409, nothing written).
    PlanOnly,
    /// Someone holds it and the write is not theirs: 423 with their LockInfo.
    Refuse,
}

pub fn decide_write(held: &Holders, lock_id: Option<&str>) -> Write {
    match (&held.exclusive, lock_id) {
        (Some(holder), Some(id)) if holder.id == id => Write::Allow,
        (Some(_), _) => Write::Refuse,
        (None, Some(id)) if held.plan(id).is_some() => Write::PlanOnly,
        (None, _) if !held.plans.is_empty() => Write::Refuse,
        (None, None) => Write::Allow,
        (None, Some(_)) => Write::NotHeld,
    }
}

/// Every holder of `workspace`'s lock.
pub fn holders(conn: &Connection, workspace: &str) -> Result<Holders, crate::store::sql::Error> {
    let exclusive = conn
        .prepare_cached("SELECT lock_id, info FROM tf_locks WHERE workspace = ?1")?
        .query_row([workspace], |r| {
            Ok(HeldLock {
                id: r.get(0)?,
                info: r.get(1)?,
            })
        })
        .optional()?;
    let plans = if exclusive.is_some() {
        Vec::new()
    } else {
        plan_rows(conn, workspace)?
            .into_iter()
            .map(|p| p.lock)
            .collect()
    };
    Ok(Holders { exclusive, plans })
}

/// One plan holder's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanRow {
    pub lock: HeldLock,
    pub created_at: String,
    pub credential: Option<String>,
}

/// The plan holders of `workspace`, oldest first.
pub fn plan_rows(
    conn: &Connection,
    workspace: &str,
) -> Result<Vec<PlanRow>, crate::store::sql::Error> {
    let rows = conn
        .prepare_cached(
            "SELECT lock_id, info, created_at, credential FROM tf_plan_locks WHERE workspace = ?1",
        )?
        .query_map([workspace], |r| {
            Ok(PlanRow {
                lock: HeldLock {
                    id: r.get(0)?,
                    info: r.get(1)?,
                },
                created_at: r.get(2)?,
                credential: r.get(3)?,
            })
        })?
        .collect::<Result<Vec<PlanRow>, _>>();
    // Sorted here, not by SQL: at most MAX_PLAN_HOLDERS rows, and the query stays a
    // pure index search.
    rows.map(|mut rows| {
        rows.sort_by(|a, b| (&a.created_at, &a.lock.id).cmp(&(&b.created_at, &b.lock.id)));
        rows
    })
}

/// Every plan holder: (workspace, row), by workspace then age.
pub fn all_plan_rows(
    conn: &Connection,
) -> Result<Vec<(String, PlanRow)>, crate::store::sql::Error> {
    let mut stmt = conn.prepare(
        "SELECT workspace, lock_id, info, created_at, credential FROM tf_plan_locks ORDER BY workspace, created_at, lock_id",
    )?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                PlanRow {
                    lock: HeldLock {
                        id: r.get(1)?,
                        info: r.get(2)?,
                    },
                    created_at: r.get(3)?,
                    credential: r.get(4)?,
                },
            ))
        })?
        .collect();
    rows
}

/// Adds `lock` to `workspace`'s plan holders, recording the `credential` that took it.
pub fn put_plan_lock(
    conn: &Connection,
    workspace: &str,
    lock: &HeldLock,
    credential: &str,
) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached(
        "INSERT INTO tf_plan_locks (workspace, lock_id, info, created_at, credential) VALUES (?1, ?2, ?3, ?4, ?5)",
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

/// Removes one plan holder (`None`: every one) of `workspace`.
pub fn delete_plan_lock(
    conn: &Connection,
    workspace: &str,
    lock_id: Option<&str>,
) -> Result<(), crate::store::sql::Error> {
    match lock_id {
        Some(id) => conn
            .prepare_cached("DELETE FROM tf_plan_locks WHERE workspace = ?1 AND lock_id = ?2")?
            .execute([workspace, id])?,
        None => conn
            .prepare_cached("DELETE FROM tf_plan_locks WHERE workspace = ?1")?
            .execute([workspace])?,
    };
    Ok(())
}

/// The lock of a workspace as a contender is shown it ([`Holders::shown`]).
pub fn held_lock(
    conn: &Connection,
    workspace: &str,
) -> Result<Option<HeldLock>, crate::store::sql::Error> {
    Ok(holders(conn, workspace)?.shown())
}

/// A workspace's lock as shown ([`Holders::shown`]) and when it was taken
/// (`created_at`, RFC 3339; the oldest plan holder's).
pub fn held_lock_since(
    conn: &Connection,
    workspace: &str,
) -> Result<Option<(HeldLock, String)>, crate::store::sql::Error> {
    let exclusive = conn
        .prepare_cached("SELECT lock_id, info, created_at FROM tf_locks WHERE workspace = ?1")?
        .query_row([workspace], |r| {
            let lock = HeldLock {
                id: r.get(0)?,
                info: r.get(1)?,
            };
            Ok((lock, r.get(2)?))
        })
        .optional()?;
    if exclusive.is_some() {
        return Ok(exclusive);
    }
    let plans = plan_rows(conn, workspace)?;
    let Some(oldest) = plans.first() else {
        return Ok(None);
    };
    let locks: Vec<HeldLock> = plans.iter().map(|p| p.lock.clone()).collect();
    Ok(Some((plans_summary(&locks), oldest.created_at.clone())))
}

/// The lock of a workspace with the name of the credential that took it (`None`
/// for a lock of an earlier release): the exclusive holder, or the oldest plan holder.
pub fn held_lock_credential(
    conn: &Connection,
    workspace: &str,
) -> Result<Option<(HeldLock, Option<String>)>, crate::store::sql::Error> {
    let exclusive = conn
        .prepare_cached("SELECT lock_id, info, credential FROM tf_locks WHERE workspace = ?1")?
        .query_row([workspace], |r| {
            Ok((
                HeldLock {
                    id: r.get(0)?,
                    info: r.get(1)?,
                },
                r.get(2)?,
            ))
        })
        .optional()?;
    if exclusive.is_some() {
        return Ok(exclusive);
    }
    Ok(plan_rows(conn, workspace)?
        .into_iter()
        .next()
        .map(|p| (p.lock, p.credential)))
}

/// A lock of `workspace` the credential `credential` took, exclusive or plan (the
/// oldest), if any.
pub fn lock_taken_by(
    conn: &Connection,
    workspace: &str,
    credential: &str,
) -> Result<Option<HeldLock>, crate::store::sql::Error> {
    if let Some((lock, Some(taker))) = held_lock_credential(conn, workspace)? {
        if taker == credential {
            return Ok(Some(lock));
        }
    }
    Ok(plan_rows(conn, workspace)?
        .into_iter()
        .find(|p| p.credential.as_deref() == Some(credential))
        .map(|p| p.lock))
}

/// Every exclusive lock: (workspace, lock, when it was taken); plan holders are
/// [`all_plan_rows`].
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

/// Why the credential that took a lock is provably gone: it can make no request any
/// more, so nothing of the run that held the lock can still be going through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// An issued workspace token (`token:<name>`) every copy of which is revoked (or
    /// revoked or expired).
    TokenRevoked,
    /// An issued workspace token whose every copy expired (none revoked).
    TokenExpired,
    /// A drift run's credential (`drift:run-N`), ended when its run finished (or its
    /// expiry passed).
    RunFinished,
    /// A CI identity (`ci:<issuer>:<identity>`) none of whose tokens is accepted any
    /// more: each past its run window and its own expiry.
    IdentityWindowEnded,
}

impl Gone {
    /// As the audit row and the log say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Gone::TokenRevoked => "token revoked",
            Gone::TokenExpired => "token expired",
            Gone::RunFinished => "run finished",
            Gone::IdentityWindowEnded => "identity window ended",
        }
    }

    /// A fixed metric label.
    pub fn label(self) -> &'static str {
        match self {
            Gone::TokenRevoked => "token_revoked",
            Gone::TokenExpired => "token_expired",
            Gone::RunFinished => "run_finished",
            Gone::IdentityWindowEnded => "identity_window_ended",
        }
    }
}

/// The kind of credential a lock records, as far as a lease goes: only these three can
/// be proved gone. A workspace's derived credential (`tf:`), a consumer, a client
/// certificate, a person, an operator's move, a lock of an earlier release (no
/// credential recorded) are none of them: a lease never releases their locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leasable<'a> {
    /// `token:<name>`.
    Token(&'a str),
    /// `drift:run-N`, the whole recorded name.
    Run(&'a str),
    /// `ci:<issuer>:<identity>`, without the `ci:`.
    Ci(&'a str),
}

/// What [`Leasable`] a recorded credential name is, if any.
pub fn leasable(credential: Option<&str>) -> Option<Leasable<'_>> {
    let name = credential?;
    if let Some(token) = name.strip_prefix("token:").filter(|n| !n.is_empty()) {
        return Some(Leasable::Token(token));
    }
    if let Some(identity) = name.strip_prefix("ci:").filter(|n| !n.is_empty()) {
        return Some(Leasable::Ci(identity));
    }
    let run = name.strip_prefix("drift:run-")?;
    (!run.is_empty() && run.bytes().all(|b| b.is_ascii_digit())).then_some(Leasable::Run(name))
}

/// The `[[lock_policy]]` entries: per workspace pattern, the lease of gone
/// credentials' locks. The first entry naming a workspace is its policy; a workspace
/// none names has no lease (its locks are only ever flagged stale).
#[derive(Debug, Clone, Default)]
pub struct LeasePolicies(Vec<(Vec<crate::names::Pattern>, i64)>);

impl LeasePolicies {
    pub fn from_config(
        policies: &[crate::config::LockPolicyConfig],
    ) -> Result<LeasePolicies, crate::config::ConfigError> {
        policies
            .iter()
            .enumerate()
            .map(|(at, p)| {
                let lease = i64::try_from(p.lease_seconds(at)?).unwrap_or(i64::MAX);
                Ok((p.patterns(at)?, lease))
            })
            .collect::<Result<_, _>>()
            .map(LeasePolicies)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The lease (seconds) of `workspace`'s locks, if a policy names it.
    pub fn lease_of(&self, workspace: &str) -> Option<i64> {
        self.0
            .iter()
            .find(|(patterns, _)| patterns.iter().any(|p| p.matches(workspace)))
            .map(|(_, lease)| *lease)
    }

    /// The shortest lease of any policy (how often housekeeping looks).
    pub fn shortest(&self) -> Option<i64> {
        self.0.iter().map(|(_, lease)| *lease).min()
    }
}

/// What a lease does to one lock holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// Left alone: no policy names the workspace, its credential is not provably
    /// gone, or it has not been idle for the whole lease.
    Keep,
    /// Released: its credential is gone (`why`) and it has been idle `idle_seconds`,
    /// longer than the lease.
    Expire { why: Gone, idle_seconds: i64 },
}

/// The lease rule for one holder. `lease`: the policy's, `None` when no policy names
/// the workspace. `gone`: why its credential is provably gone, `None` when it is not
/// (or it is not a [`Leasable`] credential). `taken`: when the lock was taken (unix
/// seconds; `None`, unreadable: never released). `last_use`: the credential's last
/// known use. Idle time runs from the later of the two; both conditions must hold:
/// Terraform writes state during a long apply, but a resource can take an hour
/// without a write, so an idle lock alone does not mean a dead run, and a gone
/// credential alone does not mean its last run is not still finishing.
pub fn decide_lease(
    lease: Option<i64>,
    gone: Option<Gone>,
    taken: Option<i64>,
    last_use: Option<i64>,
    now: i64,
) -> Lease {
    let (Some(lease), Some(why), Some(taken)) = (lease, gone, taken) else {
        return Lease::Keep;
    };
    let since = last_use.map_or(taken, |used| used.max(taken));
    let idle_seconds = now.saturating_sub(since);
    if idle_seconds > lease {
        Lease::Expire { why, idle_seconds }
    } else {
        Lease::Keep
    }
}

/// One holder a lease may release: the exclusive one or one plan holder, with the
/// credential that took it and when (unix seconds; `None` when unreadable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseCandidate {
    pub workspace: String,
    pub lock: HeldLock,
    pub shared: bool,
    pub credential: String,
    pub taken: Option<i64>,
}

/// Every holder of a workspace `policies` names whose recorded credential is
/// [`leasable`]: the only locks a lease may release.
pub fn lease_candidates(
    conn: &Connection,
    policies: &LeasePolicies,
) -> Result<Vec<LeaseCandidate>, crate::store::sql::Error> {
    let unix = |at: &str| crate::store::retention::parse_time(at).map(|t| t.unix_timestamp());
    let mut out = Vec::new();
    let mut stmt = conn.prepare(
        "SELECT workspace, lock_id, info, created_at, credential FROM tf_locks WHERE credential IS NOT NULL",
    )?;
    let exclusive = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                HeldLock {
                    id: r.get(1)?,
                    info: r.get(2)?,
                },
                r.get::<_, String>(3)?,
                r.get::<_, Option<String>>(4)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let plans = all_plan_rows(conn)?
        .into_iter()
        .map(|(ws, p)| (ws, p.lock, p.created_at, p.credential, true));
    let exclusive = exclusive
        .into_iter()
        .map(|(ws, lock, at, credential)| (ws, lock, at, credential, false));
    for (workspace, lock, at, credential, shared) in exclusive.chain(plans) {
        let Some(credential) = credential.filter(|c| leasable(Some(c)).is_some()) else {
            continue;
        };
        if policies.lease_of(&workspace).is_none() {
            continue;
        }
        out.push(LeaseCandidate {
            taken: unix(&at),
            workspace,
            lock,
            shared,
            credential,
        });
    }
    Ok(out)
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

    fn exclusive(id: &str) -> Holders {
        Holders {
            exclusive: Some(held(id)),
            plans: Vec::new(),
        }
    }

    fn plans(ids: &[&str]) -> Holders {
        Holders {
            exclusive: None,
            plans: ids.iter().map(|id| plan_held(id)).collect(),
        }
    }

    fn plan_held(id: &str) -> HeldLock {
        HeldLock {
            id: id.into(),
            info: format!(r#"{{"ID":"{id}","Operation":"OperationTypePlan","Who":"w-{id}"}}"#),
        }
    }

    #[test]
    fn only_the_exact_plan_operation_shares() {
        let op = |op: &str| format!(r#"{{"ID":"a","Operation":{op}}}"#);
        let table = [
            (op(r#""OperationTypePlan""#), true),
            (op(r#""OperationTypeApply""#), false),
            (op(r#""operationtypeplan""#), false),
            (op(r#""OPERATIONTYPEPLAN""#), false),
            (op(r#"" OperationTypePlan""#), false),
            (op(r#""OperationTypePlan ""#), false),
            (op(r#""OperationTypeRefresh""#), false),
            (op(r#""OperationTypeInvalid""#), false),
            (op(r#""migration destination state""#), false),
            (op("null"), false),
            (op("1"), false),
            (op(r#"["OperationTypePlan"]"#), false),
            (r#"{"ID":"a"}"#.to_string(), false),
        ];
        for (info, shared) in table {
            assert_eq!(is_plan(&info), shared, "{info}");
        }
    }

    #[test]
    fn lock_decisions() {
        let many: Vec<String> = (0..MAX_PLAN_HOLDERS).map(|i| format!("p{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        // (holders, a writer waiting?, LOCK with ID, a plan?, expected)
        let table: Vec<(Holders, bool, &str, bool, Lock)> = vec![
            (Holders::default(), false, "a", false, Lock::Take),
            (Holders::default(), false, "a", true, Lock::Share),
            (exclusive("a"), false, "a", false, Lock::AlreadyHeld),
            (exclusive("a"), false, "b", false, Lock::Refuse),
            (exclusive("a"), false, "b", true, Lock::Refuse),
            (plans(&["p"]), false, "q", true, Lock::Share),
            (plans(&["p", "q"]), false, "q", true, Lock::AlreadyHeld),
            // an apply while plans hold waits, and keeps new plans out meanwhile
            (plans(&["p"]), false, "a", false, Lock::Wait),
            (plans(&["p"]), true, "a", false, Lock::Wait),
            (plans(&["p"]), true, "q", true, Lock::Yield),
            (Holders::default(), true, "q", true, Lock::Yield),
            // a plan already holding keeps its lock; the waiting writer takes a free one
            (plans(&["p", "q"]), true, "q", true, Lock::AlreadyHeld),
            (Holders::default(), true, "a", false, Lock::Take),
            (exclusive("a"), true, "q", true, Lock::Refuse),
            (exclusive("a"), true, "a", false, Lock::AlreadyHeld),
            // an exclusive LOCK under a plan holder's own ID never upgrades it, nor
            // keeps other plans out
            (plans(&["p"]), false, "p", false, Lock::Refuse),
            (plans(&many), false, "new", true, Lock::TooMany),
            (plans(&many), true, "new", true, Lock::Yield),
            (plans(&many), false, "p3", true, Lock::AlreadyHeld),
        ];
        for (holders, waiting, id, plan, expected) in table {
            assert_eq!(
                decide_lock(&holders, waiting, id, plan),
                expected,
                "{holders:?} <- {id} (plan {plan}, writer waiting {waiting})"
            );
        }
    }

    #[test]
    fn a_waiting_writer_is_in_force_for_its_window() {
        let once = Waiting {
            lock: held("a"),
            seen_ms: 100_000,
            tries: 1,
        };
        for now in [100_000, 100_001, 99_000] {
            assert!(!once.in_force(now), "a LOCK refused once has given up");
            assert!(!once.fresh_for("a", now));
        }
        let w = Waiting { tries: 2, ..once };
        let table = [
            (100_000, true, true),
            (100_000 + WAITING_REFRESH_MS - 1, true, true),
            (100_000 + WAITING_REFRESH_MS, true, false),
            (100_000 + WAITING_WINDOW_MS - 1, true, false),
            (100_000 + WAITING_WINDOW_MS, false, false),
            // another node's clock slightly ahead: just seen
            (99_000, true, true),
            (i64::MAX, false, false),
            (i64::MIN, true, true),
        ];
        for (now, in_force, fresh) in table {
            assert_eq!(w.in_force(now), in_force, "in force at {now}");
            assert_eq!(w.fresh_for("a", now), fresh, "fresh at {now}");
            assert!(!w.fresh_for("b", now), "another writer's retry is recorded");
        }
    }

    #[test]
    fn a_writer_is_recorded_once_per_refusal_and_in_force_once_it_retries() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        let tries = |conn: &Connection| waiting(conn, "ws").unwrap().map(|w| (w.lock.id, w.tries));
        // (writer, now, expected (writer, tries) afterwards)
        let steps: &[(&str, i64, (&str, i64))] = &[
            ("a", 1_000, ("a", 1)),
            ("a", 2_000, ("a", 2)),
            ("a", 18_000, ("a", 3)),
            // another writer refused: it is the one waiting now, from its first try
            ("b", 19_000, ("b", 1)),
            ("b", 20_000, ("b", 2)),
            // the same writer back after the window lapsed starts again
            ("b", 20_000 + WAITING_WINDOW_MS + 1, ("b", 1)),
        ];
        for &(writer, now, (id, n)) in steps {
            put_waiting(&conn, "ws", &held(writer), now).unwrap();
            assert_eq!(tries(&conn), Some((id.to_string(), n)), "{writer} at {now}");
        }
        assert_eq!(waiting(&conn, "other").unwrap(), None);
        clear_waiting(&conn, "ws").unwrap();
        assert_eq!(tries(&conn), None);
    }

    #[test]
    fn a_plan_kept_out_is_shown_the_holders_and_the_writer_it_waits_for() {
        let writer = HeldLock {
            id: "apply-1".into(),
            info: r#"{"ID":"apply-1","Operation":"OperationTypeApply","Who":"ci@runner"}"#.into(),
        };
        let shown = yielded(&plans(&["p", "q"]), &writer);
        let info: serde_json::Value = serde_json::from_str(&shown.info).unwrap();
        assert_eq!(
            shown.id, "p",
            "the oldest holder's ID, so -lock-timeout retries"
        );
        assert_eq!(info["ID"], "p");
        let text = info["Info"].as_str().unwrap();
        assert!(
            text.starts_with("OperationTypeApply apply-1 (ci@runner) is waiting for this lock"),
            "{text}"
        );
        assert!(text.contains("shared by 2 plan(s)"), "{text}");
        // nobody holds any more: the writer's own LockInfo, its Info saying why
        let shown = yielded(&Holders::default(), &writer);
        let info: serde_json::Value = serde_json::from_str(&shown.info).unwrap();
        assert_eq!(
            (shown.id.as_str(), &info["ID"]),
            ("apply-1", &serde_json::json!("apply-1"))
        );
        assert!(info["Info"].as_str().unwrap().contains("new plans wait"));
    }

    #[test]
    fn unlock_decisions() {
        let id = |id: &str| UnlockRequest::Id(id.into());
        let own = plan_held("p").info;
        let other_info = plan_held("q").info.replace(r#""ID":"q""#, r#""ID":"p""#);
        // (holders, UNLOCK request, body sent, expected)
        let table: Vec<(Holders, UnlockRequest, Option<&str>, Unlock)> = vec![
            (
                Holders::default(),
                UnlockRequest::Force,
                None,
                Unlock::Nothing,
            ),
            (
                Holders::default(),
                id("a"),
                Some(r#"{"ID":"a"}"#),
                Unlock::Nothing,
            ),
            (
                exclusive("a"),
                id("a"),
                Some(r#"{"ID":"a"}"#),
                Unlock::Release,
            ),
            (exclusive("a"), UnlockRequest::Force, None, Unlock::Release),
            (
                exclusive("a"),
                id("b"),
                Some(r#"{"ID":"b"}"#),
                Unlock::Refuse,
            ),
            (plans(&["p", "q"]), id("p"), Some(&own), Unlock::ReleasePlan),
            // OpenTofu's force-unlock: the ID alone
            (
                plans(&["p", "q"]),
                id("p"),
                Some(r#"{"ID":"p"}"#),
                Unlock::ReleasePlan,
            ),
            (
                plans(&["p", "q"]),
                id("p"),
                Some(r#"{"ID":"p","Operation":""}"#),
                Unlock::ReleasePlan,
            ),
            // q's LockInfo naming p: one holder unlocking another
            (
                plans(&["p", "q"]),
                id("p"),
                Some(&other_info),
                Unlock::Refuse,
            ),
            (
                plans(&["p", "q"]),
                id("x"),
                Some(r#"{"ID":"x"}"#),
                Unlock::Refuse,
            ),
            (plans(&["q"]), id("p"), Some(&own), Unlock::Nothing),
            (exclusive("a"), id("p"), Some(&own), Unlock::Refuse),
            (
                plans(&["p", "q"]),
                UnlockRequest::Force,
                None,
                Unlock::Release,
            ),
        ];
        for (holders, request, sent, expected) in table {
            assert_eq!(
                decide_unlock(&holders, &request, sent),
                expected,
                "{holders:?} <- {request:?} {sent:?}"
            );
        }
    }

    #[test]
    fn write_decisions() {
        // (holders, ?ID= of the write, expected)
        let table: Vec<(Holders, Option<&str>, Write)> = vec![
            (Holders::default(), None, Write::Allow),
            (Holders::default(), Some("a"), Write::NotHeld),
            (exclusive("a"), Some("a"), Write::Allow),
            (exclusive("a"), Some("b"), Write::Refuse),
            (exclusive("a"), None, Write::Refuse),
            (plans(&["p"]), Some("p"), Write::PlanOnly),
            (plans(&["p"]), Some("x"), Write::Refuse),
            (plans(&["p"]), None, Write::Refuse),
        ];
        for (holders, id, expected) in table {
            assert_eq!(
                decide_write(&holders, id),
                expected,
                "holders {holders:?}, write with {id:?}"
            );
        }
    }

    #[test]
    fn only_provably_ending_credentials_are_leasable() {
        let table: &[(Option<&str>, Option<Leasable>)] = &[
            (Some("token:ci"), Some(Leasable::Token("ci"))),
            (Some("drift:run-12"), Some(Leasable::Run("drift:run-12"))),
            (
                Some("ci:gh:acme/infra@main"),
                Some(Leasable::Ci("gh:acme/infra@main")),
            ),
            // The derived credential, a consumer, a certificate, an operator, a lock
            // of an earlier release, and names that only look alike.
            (Some("tf:ci-a"), None),
            (Some("consumer:ci-a"), None),
            (Some("cert:build.example"), None),
            (Some("operator:alice"), None),
            (Some("stategate"), None),
            (None, None),
            (Some("token:"), None),
            (Some("ci:"), None),
            (Some("drift:run-"), None),
            (Some("drift:run-1x"), None),
            (Some("Token:ci"), None),
            (Some(" token:ci"), None),
        ];
        for (credential, expected) in table {
            assert_eq!(leasable(*credential), *expected, "{credential:?}");
        }
    }

    #[test]
    fn a_lease_ends_only_a_gone_credential_idle_for_longer_than_it() {
        let gone = Some(Gone::TokenRevoked);
        let expire = |idle| Lease::Expire {
            why: Gone::TokenRevoked,
            idle_seconds: idle,
        };
        // (lease, gone, taken, last use, now) → lease decision
        type Row = (
            Option<i64>,
            Option<Gone>,
            Option<i64>,
            Option<i64>,
            i64,
            Lease,
        );
        let table: &[Row] = &[
            (Some(60), gone, Some(1000), None, 1061, expire(61)),
            (Some(60), gone, Some(1000), None, 1060, Lease::Keep),
            (Some(60), gone, Some(1000), None, 1000, Lease::Keep),
            // Idle from the later of taken and last use.
            (Some(60), gone, Some(1000), Some(1050), 1100, Lease::Keep),
            (Some(60), gone, Some(1000), Some(1050), 1111, expire(61)),
            (Some(60), gone, Some(1000), Some(500), 1061, expire(61)),
            // Not gone (a live credential, a derived one), no policy, unknown time.
            (Some(60), None, Some(1000), None, 99_999, Lease::Keep),
            (None, gone, Some(1000), None, 99_999, Lease::Keep),
            (Some(60), gone, None, None, 99_999, Lease::Keep),
            // A clock that went back makes nothing idle.
            (Some(60), gone, Some(1000), None, 10, Lease::Keep),
            (
                Some(60),
                gone,
                Some(i64::MIN),
                None,
                i64::MAX,
                expire(i64::MAX),
            ),
        ];
        for (lease, gone, taken, last_use, now, expected) in table {
            assert_eq!(
                decide_lease(*lease, *gone, *taken, *last_use, *now),
                *expected,
                "{lease:?} {gone:?} {taken:?} {last_use:?} {now}"
            );
        }
    }

    #[test]
    fn the_first_policy_naming_a_workspace_is_its_lease() {
        let policy = |w: &[&str], lease: &str| crate::config::LockPolicyConfig {
            workspaces: w.iter().map(|s| s.to_string()).collect(),
            lease: lease.into(),
        };
        let policies = LeasePolicies::from_config(&[
            policy(&["ci-prod-*"], "2h"),
            policy(&["ci-*", "build"], "30m"),
        ])
        .unwrap();
        assert_eq!(policies.lease_of("ci-prod-web"), Some(7200));
        assert_eq!(policies.lease_of("ci-dev"), Some(1800));
        assert_eq!(policies.lease_of("build"), Some(1800));
        assert_eq!(policies.lease_of("prod"), None);
        assert_eq!(policies.lease_of("xci-dev"), None);
        assert_eq!(policies.shortest(), Some(1800));
        assert!(LeasePolicies::default().is_empty());
        assert_eq!(LeasePolicies::default().shortest(), None);
        let err = LeasePolicies::from_config(&[policy(&["ci-*"], "soon")]).unwrap_err();
        assert!(err.to_string().contains("lock_policy[0].lease"), "{err}");
    }

    #[test]
    fn lease_candidates_are_leasable_holders_of_named_workspaces() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        let policies = LeasePolicies::from_config(&[crate::config::LockPolicyConfig {
            workspaces: vec!["ci-*".into()],
            lease: "1m".into(),
        }])
        .unwrap();
        put_lock(&conn, "ci-a", &held("a"), "token:ci").unwrap();
        put_lock(&conn, "ci-b", &held("b"), "tf:ci-b").unwrap();
        put_lock(&conn, "prod", &held("c"), "token:ci").unwrap();
        put_plan_lock(&conn, "ci-p", &plan_held("p"), "token:ci").unwrap();
        put_plan_lock(&conn, "ci-p", &plan_held("q"), "cert:me").unwrap();
        put_plan_lock(&conn, "ci-p", &plan_held("r"), "drift:run-3").unwrap();
        let mut found: Vec<(String, String, bool, String)> = lease_candidates(&conn, &policies)
            .unwrap()
            .into_iter()
            .map(|c| {
                assert!(c.taken.is_some(), "{c:?}");
                (c.workspace, c.lock.id, c.shared, c.credential)
            })
            .collect();
        found.sort();
        let want = |ws: &str, id: &str, shared, by: &str| {
            (ws.to_string(), id.to_string(), shared, by.to_string())
        };
        assert_eq!(
            found,
            [
                want("ci-a", "a", false, "token:ci"),
                want("ci-p", "p", true, "token:ci"),
                want("ci-p", "r", true, "drift:run-3"),
            ]
        );
    }

    #[test]
    fn the_shown_lock_of_plan_holders_is_a_lock_info_naming_them() {
        let shown = plans(&["p", "q"]).shown().unwrap();
        assert_eq!(shown.id, "p");
        let info: serde_json::Value = serde_json::from_str(&shown.info).unwrap();
        assert_eq!(info["ID"], "p");
        assert_eq!(info["Operation"], PLAN_OPERATION);
        let text = info["Info"].as_str().unwrap();
        assert!(
            text.contains("2 plan") && text.contains("q (w-q)"),
            "{text}"
        );
        let ids: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let shown = plans(&ids).shown().unwrap();
        assert!(shown.info.contains("and 12 more"), "{}", shown.info);
        assert_eq!(exclusive("a").shown(), Some(held("a")));
        assert_eq!(Holders::default().shown(), None);
    }

    #[test]
    fn plan_rows_are_shared() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        put_plan_lock(&conn, "ws", &plan_held("p"), "tf:ws").unwrap();
        put_plan_lock(&conn, "ws", &plan_held("q"), "drift:run-2").unwrap();
        assert!(put_plan_lock(&conn, "ws", &plan_held("q"), "tf:ws").is_err());
        let h = holders(&conn, "ws").unwrap();
        assert_eq!(h.exclusive, None);
        let mut ids: Vec<&str> = h.plans.iter().map(|p| p.id.as_str()).collect();
        ids.sort();
        assert_eq!(ids, ["p", "q"]);
        assert_eq!(held_lock(&conn, "ws").unwrap().map(|l| l.id.len()), Some(1));
        assert_eq!(
            lock_taken_by(&conn, "ws", "drift:run-2").unwrap(),
            Some(plan_held("q"))
        );
        assert_eq!(lock_taken_by(&conn, "ws", "drift:run-9").unwrap(), None);
        assert_eq!(all_plan_rows(&conn).unwrap().len(), 2);
        delete_plan_lock(&conn, "ws", Some("p")).unwrap();
        assert_eq!(holders(&conn, "ws").unwrap().plans, [plan_held("q")]);
        delete_plan_lock(&conn, "ws", None).unwrap();
        assert!(holders(&conn, "ws").unwrap().is_empty());
        assert_eq!(held_lock_since(&conn, "ws").unwrap(), None);
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
