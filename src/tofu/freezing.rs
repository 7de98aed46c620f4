//! Maintenance freezes as [`TofuBackend`] operations (rules and SQL in `freeze.rs`):
//! freeze, unfreeze, list, and the check every LOCK and unlocked write makes.

use super::*;

/// The freeze in force on `workspace`. In a write transaction an expired freeze is
/// removed and its expiry audited here, where it is noticed; on a reader an expired
/// freeze is simply not in force (the commit that follows removes it).
pub(super) fn freeze_in_force(conn: &Connection, workspace: &str) -> Result<Option<Freeze>, Error> {
    let row = freeze::freeze_of(conn, workspace).map_err(DbError::from)?;
    match freeze::decide(row, unix_now()) {
        freeze::State::NotFrozen => Ok(None),
        freeze::State::Frozen(f) => Ok(Some(f)),
        freeze::State::Expired(f) => {
            if in_write_transaction(conn) {
                expire_freeze(conn, &f)?;
            }
            Ok(None)
        }
    }
}

pub(super) fn expire_freeze(conn: &Connection, f: &Freeze) -> Result<(), Error> {
    freeze::delete_freeze(conn, &f.workspace).map_err(DbError::from)?;
    let entry = audit(
        HOUSEKEEPING,
        &f.workspace,
        EVENT_FREEZE_EXPIRED,
        serde_json::json!({ "frozen_by": f.frozen_by, "reason": f.reason, "until": f.until }),
    );
    insert_audit(conn, &entry).map_err(DbError::from)?;
    Ok(())
}

/// The refusal of a LOCK or an unlocked write while frozen: 423 with the freeze's
/// LockInfo (Terraform prints it).
pub(super) fn frozen(f: &Freeze) -> Error {
    Error::Locked {
        holder_info: Bytes::from(f.lock_info()),
    }
}

/// What a freeze request did: the freeze now in force, and the lock held when it was
/// made (the freeze applies once that lock is released; it is never broken).
#[derive(Debug, Clone)]
pub struct Frozen {
    pub freeze: Freeze,
    pub held: Option<(HeldLock, String)>,
}

impl TofuBackend {
    /// Freezes `workspace` until `until` (unix seconds; `None`: until unfrozen) for
    /// `reason`, audited as `tf.frozen` by `actor`; replaces an earlier freeze. A held
    /// lock is left alone and returned: the freeze applies once it is released.
    pub async fn freeze(
        &self,
        workspace: &str,
        reason: &str,
        until: Option<i64>,
        actor: &str,
    ) -> Result<Frozen, Error> {
        crate::names::validate_workspace(workspace)?;
        let reason = freeze::check_reason(reason).map_err(|e| Error::Invalid(e.to_string()))?;
        if until.is_some_and(|t| t <= unix_now()) {
            return Err(Error::Invalid(freeze::BadFreeze::OutOfRange.to_string()));
        }
        let wanted = Freeze {
            workspace: workspace.to_string(),
            frozen_by: actor.to_string(),
            reason,
            created_at: crate::store::now_rfc3339(),
            until,
        };
        self.db
            .write(move |conn| -> Result<Frozen, Error> {
                let before = freeze_in_force(conn, &wanted.workspace)?;
                freeze::put_freeze(conn, &wanted).map_err(DbError::from)?;
                let held = lock::held_lock_since(conn, &wanted.workspace).map_err(DbError::from)?;
                let entry = audit(
                    &wanted.frozen_by,
                    &wanted.workspace,
                    EVENT_FROZEN,
                    serde_json::json!({
                        "reason": wanted.reason,
                        "until": wanted.until,
                        "replaced": before.map(|b| serde_json::json!({ "frozen_by": b.frozen_by, "reason": b.reason, "until": b.until })),
                        "lock_held": held.as_ref().map(|(l, _)| lock_summary(l)),
                    }),
                );
                insert_audit(conn, &entry).map_err(DbError::from)?;
                Ok(Frozen { freeze: wanted, held })
            })
            .await
    }

    /// Lifts the freeze of `workspace`, audited as `tf.unfrozen` by `actor`. `None`
    /// (nothing audited but a noticed expiry) when it was not frozen.
    pub async fn unfreeze(&self, workspace: &str, actor: &str) -> Result<Option<Freeze>, Error> {
        crate::names::validate_workspace(workspace)?;
        let (ws, actor) = (workspace.to_string(), actor.to_string());
        self.db
            .write(move |conn| -> Result<Option<Freeze>, Error> {
                let Some(f) = freeze_in_force(conn, &ws)? else {
                    return Ok(None);
                };
                freeze::delete_freeze(conn, &ws).map_err(DbError::from)?;
                let entry = audit(
                    &actor,
                    &ws,
                    EVENT_UNFROZEN,
                    serde_json::json!({ "frozen_by": f.frozen_by, "reason": f.reason, "until": f.until }),
                );
                insert_audit(conn, &entry).map_err(DbError::from)?;
                Ok(Some(f))
            })
            .await
    }

    /// Every freeze in force, by workspace; freezes found expired are removed and
    /// their expiry audited on the way (the listing and the housekeeping notice them).
    pub async fn freezes(&self) -> Result<Vec<Freeze>, Error> {
        self.db
            .write(move |conn| -> Result<Vec<Freeze>, Error> {
                let now = unix_now();
                let mut out = Vec::new();
                for f in freeze::all_freezes(conn).map_err(DbError::from)? {
                    if f.in_force(now) {
                        out.push(f);
                    } else {
                        expire_freeze(conn, &f)?;
                    }
                }
                Ok(out)
            })
            .await
    }

    /// The freeze in force on `workspace` right now (a read; changes nothing).
    pub async fn freeze_of(&self, workspace: &str) -> Result<Option<Freeze>, Error> {
        let ws = workspace.to_string();
        let row = self.db.read(move |c| freeze::freeze_of(c, &ws)).await?;
        Ok(row.filter(|f| f.in_force(unix_now())))
    }
}
