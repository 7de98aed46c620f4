//! LOCK, UNLOCK, force-unlock and lease expiry as [`TofuBackend`] operations: the
//! transactions around `lock.rs`'s pure rules (who holds, who shares, who waits), each
//! refusal answered with the holders' LockInfo.

use super::*;

/// The lock ID plus the client's own `Who`/`Operation` (bounded: they are client-supplied).
pub(super) fn lock_summary(lock: &HeldLock) -> serde_json::Value {
    let parsed: serde_json::Value = serde_json::from_str(&lock.info).unwrap_or_default();
    let field = |name: &str| {
        let text = parsed[name].as_str().unwrap_or("");
        text.chars().take(256).collect::<String>()
    };
    serde_json::json!({ "lock_id": lock.id, "who": field("Who"), "operation": field("Operation") })
}

/// What a LOCK with `lock_id` meets in the writer's transaction on `conn`: the 423 of
/// a freeze (for anyone but the holder retrying: the holder's retry stays theirs,
/// nobody else takes a frozen lock) or of another holder, else whether it takes the
/// lock, already holds it, or waits for plans ([`Lock::Wait`], refused once recorded;
/// the holders it was refused by come with it), and whether a waiting writer is
/// recorded (in force or not: taking the lock clears it). An expired freeze met here is ended
/// (`freeze_in_force`).
pub(super) fn judge_lock(
    conn: &Connection,
    workspace: &str,
    lock_id: &str,
    plan: bool,
) -> Result<(Lock, Holders, bool), Error> {
    let held = holders(conn, workspace).map_err(DbError::from)?;
    let recorded = lock::waiting(conn, workspace).map_err(DbError::from)?;
    let in_force = recorded
        .as_ref()
        .filter(|w| w.in_force(crate::clock::now_ms()));
    let decision = judge_lock_on(
        &held,
        in_force,
        || freeze_in_force(conn, workspace),
        lock_id,
        plan,
    )?;
    Ok((decision, held, recorded.is_some()))
}

/// [`judge_lock`]'s rule over the lock rows `held`, the writer `waiting` (in force) and
/// the freeze `freeze` finds.
pub(super) fn judge_lock_on(
    held: &Holders,
    waiting: Option<&lock::Waiting>,
    freeze: impl FnOnce() -> Result<Option<Freeze>, Error>,
    lock_id: &str,
    plan: bool,
) -> Result<Lock, Error> {
    let decision = decide_lock(held, waiting.is_some(), lock_id, plan);
    if decision != Lock::AlreadyHeld {
        if let Some(f) = freeze()? {
            return Err(frozen(&f));
        }
    }
    // The holder is shown only to a refused contender (for plan holders it is a
    // summary built from their LockInfos): a granted LOCK builds none.
    let shown = match (decision, waiting) {
        (Lock::Refuse | Lock::TooMany, _) => held.shown(),
        (Lock::Yield, Some(w)) => Some(lock::yielded(held, &w.lock)),
        _ => None,
    };
    match (decision, shown) {
        (Lock::Refuse | Lock::Yield, Some(holder)) => Err(locked_by(holder)),
        (Lock::TooMany, Some(holder)) => Err(too_many_plans(holder)),
        (decision, _) => Ok(decision),
    }
}

/// The 423 of a plan LOCK while [`lock::MAX_PLAN_HOLDERS`] plans hold the workspace:
/// the holders' LockInfo (so `-lock-timeout` retries), its `Info` saying why.
pub(super) fn too_many_plans(shown: HeldLock) -> Error {
    let mut info: serde_json::Value = serde_json::from_str(&shown.info).unwrap_or_default();
    let named = info["Info"].as_str().unwrap_or("").to_string();
    info["Info"] = format!(
        "too many plans: at most {} share a workspace lock; {named}",
        lock::MAX_PLAN_HOLDERS
    )
    .into();
    Error::Locked {
        holder_info: Bytes::from(info.to_string()),
    }
}

/// A workspace's lock row and freeze as a reader saw them: in the credential check's
/// read transaction ([`TofuBackend::authenticate_lock`]), or in a lookup of their own
/// for a LOCK authenticated by its certificate. A LOCK they refuse is answered from
/// them; a refusal from that snapshot is what the same LOCK sent a moment earlier gets.
/// One they let through is judged again by the writer ([`judge_lock`]), which also
/// ends a freeze that expired.
#[derive(Debug, Clone)]
pub struct LockSeen {
    held: Holders,
    waiting: Option<lock::Waiting>,
    freeze: Option<Freeze>,
}

impl crate::store::db::Weigh for LockSeen {
    fn weight(&self) -> usize {
        let held: usize = (self.held.exclusive.iter())
            .chain(&self.held.plans)
            .chain(self.waiting.iter().map(|w| &w.lock))
            .map(|h| h.id.len() + h.info.len())
            .sum();
        let freeze = self.freeze.as_ref().map_or(0, |f| {
            f.workspace.len() + f.frozen_by.len() + f.reason.len() + f.created_at.len()
        });
        held + freeze
    }
}

impl LockSeen {
    pub(super) fn read(
        conn: &Connection,
        workspace: &str,
    ) -> Result<LockSeen, crate::store::sql::Error> {
        let held = holders(conn, workspace)?;
        let waiting = lock::waiting(conn, workspace)?;
        let freeze = freeze::freeze_of(conn, workspace)?;
        Ok(LockSeen {
            held,
            waiting,
            freeze,
        })
    }

    /// The snapshot's answer: a refusal, or what the writer is to judge again. A writer
    /// waiting for plans is refused from here too while the snapshot shows its last
    /// refusal recent ([`lock::Waiting::fresh_for`]); else the writer records it.
    fn judge(self, lock_id: &str, plan: bool) -> Result<Lock, Error> {
        let now = crate::clock::now_ms();
        // An expired freeze is simply not in force here (the writer ends it).
        let in_force = self.freeze.filter(|f| f.in_force(now.div_euclid(1000)));
        let waiting = self.waiting.filter(|w| w.in_force(now));
        let decision = judge_lock_on(&self.held, waiting.as_ref(), || Ok(in_force), lock_id, plan)?;
        match (decision, self.held.shown()) {
            (Lock::Wait, Some(shown)) if waiting.is_some_and(|w| w.fresh_for(lock_id, now)) => {
                Err(locked_by(shown))
            }
            (decision, _) => Ok(decision),
        }
    }
}

pub(super) fn locked_by(holder: HeldLock) -> Error {
    Error::Locked {
        holder_info: Bytes::from(holder.info),
    }
}

/// Deletes the holders `freed` of `ws` (the exclusive one, or plan holders one by
/// one), each audited as `event` by `actor`.
pub(super) fn release(
    conn: &Connection,
    ws: &str,
    held: &Holders,
    freed: &[HeldLock],
    actor: &str,
    event: &'static str,
) -> Result<(), Error> {
    for holder in freed {
        let exclusive = held.exclusive.as_ref() == Some(holder);
        release_one(
            conn,
            ws,
            holder,
            exclusive,
            actor,
            event,
            serde_json::Map::new(),
        )?;
    }
    Ok(())
}

/// Deletes one holder's row (the exclusive one, or one plan holder) and audits it:
/// its ID, Who and Operation, `shared` for a plan holder, and `more`.
pub(super) fn release_one(
    conn: &Connection,
    ws: &str,
    holder: &HeldLock,
    exclusive: bool,
    actor: &str,
    event: &'static str,
    more: serde_json::Map<String, serde_json::Value>,
) -> Result<(), Error> {
    if exclusive {
        lock::delete_lock(conn, ws).map_err(DbError::from)?;
    } else {
        lock::delete_plan_lock(conn, ws, Some(&holder.id)).map_err(DbError::from)?;
    }
    let mut payload = lock_summary(holder);
    if !exclusive {
        payload["shared"] = true.into();
    }
    if let serde_json::Value::Object(fields) = &mut payload {
        fields.extend(more);
    }
    insert_audit(conn, &audit(actor, ws, event, payload)).map_err(DbError::from)?;
    Ok(())
}

/// A lock a lease released ([`TofuBackend::expire_leased_locks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredLock {
    pub workspace: String,
    pub lock_id: String,
    /// The credential that took it (`token:<name>`, `drift:run-N`, `ci:…`).
    pub taken_by: String,
    pub why: lock::Gone,
    pub idle_seconds: i64,
    pub shared: bool,
}

/// What the lease rule says of `candidate` at `now`: whether its credential is gone,
/// from its owner's table, and its last known use (its owner's record, and the newest
/// version of the workspace when that credential wrote it).
pub(super) fn judge_lease(
    conn: &Connection,
    policies: &lock::LeasePolicies,
    candidate: &lock::LeaseCandidate,
    now: i64,
) -> Result<lock::Lease, crate::store::sql::Error> {
    use lock::{Gone, Leasable};
    let lease = policies.lease_of(&candidate.workspace);
    let (gone, mut last_use) = match lock::leasable(Some(&candidate.credential)) {
        None => (None, None),
        Some(Leasable::Token(name)) => match credentials::token_end(conn, name, now)? {
            Some((why, used)) => (Some(why), used),
            None => (None, None),
        },
        Some(Leasable::Run(name)) => {
            let gone = !run_credential::is_live(conn, name, now)?;
            (gone.then_some(Gone::RunFinished), None)
        }
        Some(Leasable::Ci(identity)) => {
            let until = ci_identity::identity_accepted_until(conn, identity)?;
            let gone = until.is_none_or(|until| until <= now);
            (gone.then_some(Gone::IdentityWindowEnded), None)
        }
    };
    if gone.is_none() || lease.is_none() {
        return Ok(lock::Lease::Keep);
    }
    if let Some(row) = crate::store::latest_row(conn, &scope(&candidate.workspace))? {
        if row.actor == candidate.credential {
            let written =
                crate::store::retention::parse_time(&row.created_at).map(|t| t.unix_timestamp());
            last_use = last_use.max(written);
        }
    }
    Ok(lock::decide_lease(
        lease,
        gone,
        candidate.taken,
        last_use,
        now,
    ))
}

impl TofuBackend {
    /// Who holds the workspace lock right now.
    pub async fn lock_holder(&self, workspace: &str) -> Result<Option<HeldLock>, Error> {
        let ws = workspace.to_string();
        Ok(self.db.read(move |c| held_lock(c, &ws)).await?)
    }

    /// An operator's force-unlock, audited as `tf.lock_forced` by `actor`. `expected`:
    /// the lock ID the operator was shown; a different holder is refused (409) rather
    /// than freed unseen. Returns the freed lock, or `None` (no audit row) when unlocked.
    pub async fn force_unlock(
        &self,
        workspace: &str,
        expected: Option<String>,
        actor: &str,
    ) -> Result<Option<HeldLock>, Error> {
        let ws = workspace.to_string();
        let actor = actor.to_string();
        self.db
            .write(move |conn| -> Result<Option<HeldLock>, Error> {
                let held = holders(conn, &ws).map_err(DbError::from)?;
                let Some(shown) = held.shown() else {
                    return Ok(None);
                };
                // One plan holder by its ID, or the exclusive holder, or (no ID
                // expected) everyone.
                let freed: Vec<HeldLock> = match &expected {
                    None => held.exclusive.iter().chain(&held.plans).cloned().collect(),
                    Some(id) => (held.exclusive.iter())
                        .chain(&held.plans)
                        .filter(|h| &h.id == id)
                        .cloned()
                        .collect(),
                };
                if freed.is_empty() {
                    return Err(Error::Conflict(format!(
                        "the lock of {ws} changed (now held as {}); nothing was unlocked, look again",
                        shown.id
                    )));
                }
                release(conn, &ws, &held, &freed, &actor, EVENT_FORCE_UNLOCKED)?;
                Ok(Some(if held.plans.len() > 1 && expected.is_none() {
                    shown
                } else {
                    freed[0].clone()
                }))
            })
            .await
    }

    /// Force-unlock of the lock `lock_id` only if the credential `taken_by` took it
    /// (checked in the write transaction), audited as `tf.lock_forced` by `taken_by`:
    /// a drift run clearing what its own child left. Another holder is a 409, nothing
    /// freed; `None` when the workspace is unlocked.
    pub async fn force_unlock_taken_by(
        &self,
        workspace: &str,
        lock_id: &str,
        taken_by: &str,
    ) -> Result<Option<HeldLock>, Error> {
        let (ws, id, who) = (
            workspace.to_string(),
            lock_id.to_string(),
            taken_by.to_string(),
        );
        self.db
            .write(move |conn| -> Result<Option<HeldLock>, Error> {
                let held = holders(conn, &ws).map_err(DbError::from)?;
                if held.is_empty() {
                    return Ok(None);
                }
                let ours = lock::lock_taken_by(conn, &ws, &who).map_err(DbError::from)?;
                let Some(holder) = ours.filter(|h| h.id == id) else {
                    return Err(Error::Conflict(format!(
                        "the lock of {ws} is not the one {who} took; nothing was unlocked"
                    )));
                };
                release(
                    conn,
                    &ws,
                    &held,
                    std::slice::from_ref(&holder),
                    &who,
                    EVENT_FORCE_UNLOCKED,
                )?;
                Ok(Some(holder))
            })
            .await
    }

    /// Who holds the workspace lock, with the name of the credential that took it
    /// (`None` for a lock taken before credentials were recorded).
    pub async fn lock_holder_credential(
        &self,
        workspace: &str,
    ) -> Result<Option<(HeldLock, Option<String>)>, Error> {
        let ws = workspace.to_string();
        Ok(self
            .db
            .read(move |c| lock::held_lock_credential(c, &ws))
            .await?)
    }

    /// A lock of `workspace` (exclusive, or one of the plan holders) the credential
    /// named `credential` took, if any.
    pub async fn lock_taken_by(
        &self,
        workspace: &str,
        credential: &str,
    ) -> Result<Option<HeldLock>, Error> {
        let (ws, who) = (workspace.to_string(), credential.to_string());
        Ok(self
            .db
            .read(move |c| lock::lock_taken_by(c, &ws, &who))
            .await?)
    }

    /// Releases every lock a lease ends (`[[lock_policy]]`, [`lock::decide_lease`]):
    /// on a workspace a policy names, taken by a credential that is provably gone (a
    /// revoked or expired workspace token, a finished drift run, a CI identity past its
    /// run window), idle longer than the lease since it was taken or its credential was
    /// last used. Each holder (exclusive, or each plan holder on its own) is audited as
    /// `tf.lock_expired` by [`HOUSEKEEPING`]. Judged on a reader first (most passes find
    /// nothing and take no write lock), then again in the writer's transaction. This
    /// node's pending token uses are written first, so its last uses count.
    pub async fn expire_leased_locks(&self) -> Result<Vec<ExpiredLock>, Error> {
        if self.leases.is_empty() {
            return Ok(Vec::new());
        }
        self.flush_last_used().await?;
        let policies = Arc::clone(&self.leases);
        let now = unix_now();
        let judged = self
            .db
            .read(move |conn| {
                let mut due = Vec::new();
                for c in lock::lease_candidates(conn, &policies)? {
                    if judge_lease(conn, &policies, &c, now)? != lock::Lease::Keep {
                        due.push((c.workspace, c.lock.id));
                    }
                }
                Ok(due)
            })
            .await?;
        if judged.is_empty() {
            return Ok(Vec::new());
        }
        let policies = Arc::clone(&self.leases);
        self.db
            .write(move |conn| -> Result<Vec<ExpiredLock>, Error> {
                let now = unix_now();
                let mut expired = Vec::new();
                let candidates = lock::lease_candidates(conn, &policies).map_err(DbError::from)?;
                for c in candidates {
                    if !judged.contains(&(c.workspace.clone(), c.lock.id.clone())) {
                        continue;
                    }
                    let lock::Lease::Expire { why, idle_seconds } =
                        judge_lease(conn, &policies, &c, now).map_err(DbError::from)?
                    else {
                        continue;
                    };
                    let mut more = serde_json::Map::new();
                    more.insert("taken_by".into(), c.credential.clone().into());
                    more.insert("why".into(), why.as_str().into());
                    more.insert("idle_seconds".into(), idle_seconds.into());
                    let lease = policies.lease_of(&c.workspace).unwrap_or_default();
                    more.insert("lease_seconds".into(), lease.into());
                    release_one(
                        conn,
                        &c.workspace,
                        &c.lock,
                        !c.shared,
                        HOUSEKEEPING,
                        EVENT_LOCK_EXPIRED,
                        more,
                    )?;
                    expired.push(ExpiredLock {
                        workspace: c.workspace,
                        lock_id: c.lock.id,
                        taken_by: c.credential,
                        why,
                        idle_seconds,
                        shared: c.shared,
                    });
                }
                Ok(expired)
            })
            .await
    }

    /// LOCK by `who`, which the lock row records (a drift run's recovery clears only
    /// locks its own credential took).
    pub async fn lock(
        &self,
        workspace: &str,
        body: &[u8],
        who: &Credential,
        seen: Option<LockSeen>,
    ) -> Result<(), Error> {
        let info = parse_lock_info(body)?;
        let wanted = HeldLock {
            id: info.id,
            info: info.raw,
        };
        let ws = workspace.to_string();
        let credential = who.name(workspace);
        // When clients contend, most LOCKs are refused (each retries until it gets the
        // lock): one a committed snapshot shows refused is answered from there (the
        // credential check's, or else a reader's), so the one writer meets only the
        // LOCKs that may take it, not dozens of refusals queued before the holder's
        // POST and UNLOCK. Such a refusal is what the same LOCK sent a moment earlier
        // gets.
        let plan = lock::is_plan(&wanted.info);
        let seen = match seen {
            Some(seen) => seen,
            None => {
                let seen_ws = ws.clone();
                self.db
                    .read_quick(move |conn| LockSeen::read(conn, &seen_ws))
                    .await?
            }
        };
        seen.judge(&wanted.id, plan)?;
        let refused = self
            .db
            .write(move |conn| -> Result<Option<HeldLock>, Error> {
                let (decision, held, writer_recorded) = judge_lock(conn, &ws, &wanted.id, plan)?;
                match decision {
                    Lock::Take => {
                        lock::put_lock(conn, &ws, &wanted, &credential).map_err(DbError::from)?;
                        // Only when there is one: the common LOCK writes one row.
                        if writer_recorded {
                            lock::clear_waiting(conn, &ws).map_err(DbError::from)?;
                        }
                    }
                    Lock::Share => lock::put_plan_lock(conn, &ws, &wanted, &credential)
                        .map_err(DbError::from)?,
                    // Refused, but recorded (committed) first, so new plans stay out.
                    Lock::Wait => {
                        let now = crate::clock::now_ms();
                        lock::put_waiting(conn, &ws, &wanted, now).map_err(DbError::from)?;
                        return Ok(held.shown());
                    }
                    // The holder retrying after a lost response: already theirs.
                    Lock::AlreadyHeld | Lock::Refuse | Lock::TooMany | Lock::Yield => {
                        return Ok(None)
                    }
                }
                let mut payload = lock_summary(&wanted);
                payload["shared"] = (decision == Lock::Share).into();
                let entry = audit(&credential, &ws, EVENT_LOCKED, payload);
                insert_audit(conn, &entry).map_err(DbError::from)?;
                Ok(None)
            })
            .await?;
        match refused {
            Some(holders) => Err(locked_by(holders)),
            None => Ok(()),
        }
    }

    /// Unlock by `who`. An empty body is Terraform's force-unlock (the ID is never sent).
    pub async fn unlock(
        &self,
        workspace: &str,
        body: &[u8],
        who: &Credential,
    ) -> Result<(), Error> {
        let request = UnlockRequest::parse(body)?;
        // The LockInfo sent, when there is one: a plan holder is freed by its own
        // (or by a force-unlock naming only its ID), never by another holder's.
        let sent = match request {
            UnlockRequest::Force => None,
            UnlockRequest::Id(_) => Some(parse_lock_info(body)?.raw),
        };
        let ws = workspace.to_string();
        let actor = who.name(workspace);
        self.db
            .write(move |conn| -> Result<(), Error> {
                let held = holders(conn, &ws).map_err(DbError::from)?;
                let event = match request {
                    UnlockRequest::Force => EVENT_FORCE_UNLOCKED,
                    UnlockRequest::Id(_) => EVENT_UNLOCKED,
                };
                match (
                    decide_unlock(&held, &request, sent.as_deref()),
                    held.shown(),
                ) {
                    (Unlock::Nothing, _) | (_, None) => Ok(()), // idempotent
                    (Unlock::Refuse, Some(shown)) => Err(locked_by(shown)),
                    (Unlock::Release, Some(_)) => {
                        let all: Vec<HeldLock> =
                            held.exclusive.iter().chain(&held.plans).cloned().collect();
                        release(conn, &ws, &held, &all, &actor, event)
                    }
                    (Unlock::ReleasePlan, Some(_)) => {
                        let UnlockRequest::Id(id) = &request else {
                            return Ok(());
                        };
                        let freed: Vec<HeldLock> =
                            held.plans.iter().filter(|p| &p.id == id).cloned().collect();
                        // A body with no Operation is a force-unlock naming the holder.
                        let by_force = sent.as_deref().is_some_and(|s| !lock::is_plan(s));
                        let event = if by_force {
                            EVENT_FORCE_UNLOCKED
                        } else {
                            event
                        };
                        release(conn, &ws, &held, &freed, &actor, event)
                    }
                }
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_carries_the_holders_lock_info_verbatim() {
        let holder = HeldLock {
            id: "a".into(),
            info: r#"{"ID":"a","Who":"me"}"#.into(),
        };
        let Error::Locked { holder_info } = locked_by(holder) else {
            panic!("not a lock refusal");
        };
        assert_eq!(&holder_info[..], br#"{"ID":"a","Who":"me"}"#);
    }
}
