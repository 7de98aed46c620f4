//! The OpenTofu/Terraform HTTP state backend: GET, POST (?ID=), LOCK, UNLOCK, DELETE.
//!
//! Handlers take plain values (workspace, lock id, body bytes) and return plain
//! results; HTTP framing lives in `http`. Locks are rows in `tf_locks` (rules in
//! `lock.rs`); the write guard (lineage, serial, content) and its one-shot operator
//! override are in `guard.rs`; maintenance freezes (every LOCK and unlocked write
//! refused, a held lock left alone) in `freeze.rs`; moving resources between two
//! workspaces' states (both locks, both versions in one commit) in `moves.rs` and
//! [`TofuBackend::move_resources`]. Every check that decides whether a write may
//! proceed runs again inside the commit transaction.

pub mod access;
pub mod certificate;
pub mod ci_identity;
pub mod credentials;
pub mod freeze;
pub mod guard;
pub mod lock;
pub mod moves;
pub mod outputs;
pub mod posture;
pub mod protocol;
pub mod run_credential;

use std::sync::{Arc, Mutex};

use crate::store::sql::Connection;
use bytes::Bytes;

use crate::crypto::off_thread::OffThreadHash;
use crate::crypto::RootKey;
use crate::error::Error;
use crate::store::db::in_write_transaction;
use crate::store::history::{Rollback, RolledBack};
use crate::store::{
    audit::{insert_audit, AuditEntry},
    BodyCheck, BodyChunks, BodyMeta, DbError, NewVersion, StateStore, StateStream, StoreError,
    StreamedVersion, WriteOutcome,
};
use crate::store::{VersionRow, WriteFacts};
pub use access::Credential;
use freeze::Freeze;
use guard::{decide_successor, Override, Refusal, Sent, Successor};
pub use lock::SCHEMA;
use lock::{
    decide_lock, decide_unlock, decide_write, held_lock, holders, HeldLock, Holders, Lock, Unlock,
};
use protocol::{parse_lock_info, UnlockRequest};

/// Largest LockInfo body accepted.
pub const MAX_LOCK_BODY: u64 = 64 * 1024;

#[derive(Clone)]
pub struct TofuBackend {
    store: StateStore,
    /// For this module's own table (`tf_locks`); versions go through `store`.
    db: crate::store::Db,
    root: RootKey,
    /// When each issued workspace token was last used, until the next flush.
    last_used: credentials::LastUsed,
    /// `tofu.refuse_plaintext_after_encrypted` (`posture`).
    downgrade: Arc<posture::DowngradePolicy>,
    /// The CI issuers whose job tokens are credentials (`[[ci_identity]]`).
    ci: Arc<ci_identity::CiIdentities>,
    /// Leases on the locks of gone credentials (`[[lock_policy]]`).
    leases: Arc<lock::LeasePolicies>,
}

/// Audit event of an operator rollback (payload: versions and serial, never content).
pub const EVENT_ROLLBACK: &str = "tf.rollback";

/// What every workspace's version-index scope starts with: the one rule, which SQL that
/// joins workspaces to their versions binds as a parameter instead of repeating it.
pub const SCOPE_PREFIX: &str = "tf/";

/// Version-index scope of a workspace's state.
pub fn scope(workspace: &str) -> String {
    format!("{SCOPE_PREFIX}{workspace}")
}

/// Audit events of the workspace backend (payloads are metadata, never state content).
pub const EVENT_WRITTEN: &str = "tf.state_written";
pub const EVENT_DELETED: &str = "tf.state_deleted";
pub const EVENT_LOCKED: &str = "tf.lock_acquired";
pub const EVENT_UNLOCKED: &str = "tf.lock_released";
/// An unlock without the holder's ID: Terraform's `force-unlock`, or an operator's.
pub const EVENT_FORCE_UNLOCKED: &str = "tf.lock_forced";
/// An operator undid a DELETE by rolling the last live version forward.
pub const EVENT_RESTORED: &str = "tf.restored";
/// An operator allowed one write the guard would refuse (payload: reason, expiry).
pub const EVENT_WRITE_ALLOWED: &str = "tf.write_allowed";
/// A write the guard would have refused went through on an operator's override
/// (payload: why it was refused, stored and sent serial/lineage, who allowed it).
pub const EVENT_OVERRIDE_USED: &str = "tf.write_override_used";

/// An operator froze a workspace (payload: reason, until, whom it replaced).
pub const EVENT_FROZEN: &str = "tf.frozen";
/// An operator lifted a freeze (payload: the freeze lifted).
pub const EVENT_UNFROZEN: &str = "tf.unfrozen";
/// A freeze's `until` passed and stategate noticed (actor [`HOUSEKEEPING`]).
pub const EVENT_FREEZE_EXPIRED: &str = "tf.freeze_expired";
/// An operator moved resources from one workspace to another (one event, naming both
/// new versions; recorded under the source's scope).
pub const EVENT_RESOURCES_MOVED: &str = "tf.resources_moved";
/// The actor of what stategate does by itself (a freeze's expiry).
pub const HOUSEKEEPING: &str = "stategate";
/// The locks of a move whose process is gone were released (actor [`HOUSEKEEPING`]).
pub const EVENT_MOVE_ABANDONED: &str = "tf.move_abandoned";
/// A lease released the idle lock of a gone credential (actor [`HOUSEKEEPING`];
/// payload: the holder, the credential that took it, why it is gone, idle time, lease).
pub const EVENT_LOCK_EXPIRED: &str = "tf.lock_expired";

/// An audit row of `workspace` by `actor`, the name of the credential that acted
/// ([`Credential::name`]) or the operator.
fn audit(
    actor: &str,
    workspace: &str,
    event: &'static str,
    payload: serde_json::Value,
) -> AuditEntry {
    AuditEntry {
        actor: actor.to_string(),
        org: None,
        scope: scope(workspace),
        event,
        payload,
    }
}

/// The payload of `tf.state_written`: metadata, and the lock it was written under with
/// the client's own Who/Operation (bounded) when there was one.
fn written_payload(
    serial: i64,
    lineage: &str,
    size: u64,
    lock: Option<&(String, WriteFacts)>,
) -> serde_json::Value {
    let mut payload = serde_json::json!({ "serial": serial, "lineage": lineage, "size": size });
    if let Some((lock_id, facts)) = lock {
        payload["lock_id"] = lock_id.as_str().into();
        payload["who"] = facts.lock_who.as_deref().unwrap_or("").into();
        payload["operation"] = facts.lock_operation.as_deref().unwrap_or("").into();
    }
    payload
}

/// The lock ID plus the client's own `Who`/`Operation` (bounded: they are client-supplied).
fn lock_summary(lock: &HeldLock) -> serde_json::Value {
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
/// the holders it was refused by come with it). An expired freeze met here is ended
/// (`freeze_in_force`).
fn judge_lock(
    conn: &Connection,
    workspace: &str,
    lock_id: &str,
    plan: bool,
) -> Result<(Lock, Holders), Error> {
    let held = holders(conn, workspace).map_err(DbError::from)?;
    let waiting = lock::waiting(conn, workspace).map_err(DbError::from)?;
    let waiting = waiting.filter(|w| w.in_force(crate::clock::now_ms()));
    let decision = judge_lock_on(
        &held,
        waiting.as_ref(),
        || freeze_in_force(conn, workspace),
        lock_id,
        plan,
    )?;
    Ok((decision, held))
}

/// [`judge_lock`]'s rule over the lock rows `held`, the writer `waiting` (in force) and
/// the freeze `freeze` finds.
fn judge_lock_on(
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
fn too_many_plans(shown: HeldLock) -> Error {
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
    fn read(conn: &Connection, workspace: &str) -> Result<LockSeen, crate::store::sql::Error> {
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

fn locked_by(holder: HeldLock) -> Error {
    Error::Locked {
        holder_info: Bytes::from(holder.info),
    }
}

/// What a credential check reads: the workspace's credentials (`credentials::presented`)
/// and the drift run the secret is a credential of, if any.
type Found = (credentials::Presented, Option<String>);

/// What a streamed state write checks as its body passes.
struct StateCheck {
    workspace: String,
    /// The credential's name and the lock the write is made under, with its facts.
    writer: String,
    lock: Option<(String, WriteFacts)>,
    scanner: crate::tfstate::StateScanner,
    md5: Option<(Vec<u8>, OffThreadHash<md5::Md5>)>,
    pending: Arc<Mutex<Pending>>,
    /// The downgrade policy applies to this workspace (`posture`).
    downgrade: bool,
}

/// What the guard of one streamed write learns on the way: the newest row and whether
/// an override was there when the write began (the early look, before any byte is
/// stored), then what the body turned out to be (once it is read).
#[derive(Default)]
struct Pending {
    seen: Option<VersionRow>,
    /// Whether `seen` was recorded as encrypted (`posture`; `None`: not recorded).
    seen_encrypted: Option<bool>,
    overridable: bool,
    sent: Option<Sent>,
}

fn pending(slot: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    // A panic elsewhere cannot leave this half-written: every field is set whole.
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn unix_now() -> i64 {
    crate::tokens::now()
}

/// The 409 of a write the guard refuses: what is stored, what was sent and how to
/// proceed (serials and lineages only, never content).
fn refused(workspace: &str, current: &VersionRow, sent: &Sent, why: Refusal) -> Error {
    let stored_serial = current.serial.unwrap_or_default();
    let stored_lineage = current.lineage.as_deref().unwrap_or_default();
    let message = match why {
        Refusal::Lineage => format!(
            "refused: workspace {workspace:?} holds a different state (lineage {stored_lineage:?}, serial {stored_serial}) than the one sent (lineage {:?}, serial {}); nothing was written. Another configuration may be using this address, or this is a re-initialisation or a migration onto existing state.",
            sent.lineage, sent.serial
        ),
        Refusal::Stale => format!(
            "refused: the state sent (serial {}) is older than the current state of workspace {workspace:?} (serial {stored_serial}); nothing was written. Someone wrote in between: pull the current state and run again.",
            sent.serial
        ),
        Refusal::SerialReused => format!(
            "refused: serial {stored_serial} of workspace {workspace:?} is already stored with different content; nothing was written. Another run that read the same state wrote first (racing -lock=false runs?): pull the current state and run again.",
        ),
    };
    tracing::warn!(
        workspace,
        refused = why.as_str(),
        stored_serial,
        sent_serial = sent.serial,
        "state write refused by the write guard"
    );
    Error::WriteRefused {
        message,
        facts: serde_json::json!({
            "refused": why.as_str(),
            "stored": {
                "version": current.version,
                "serial": current.serial,
                "lineage": current.lineage,
            },
            "sent": { "serial": sent.serial, "lineage": sent.lineage },
            "how_to_proceed": format!(
                "if this write is intended (state push -force of an older state, a deliberate re-initialisation), an operator can allow one such write for {} minutes: `stategate workspace allow-write {workspace} --reason \"...\"` or POST /api/v1/admin/workspaces/{workspace}/allow-write; then retry. Otherwise pull the current state and run again.",
                guard::DEFAULT_OVERRIDE_MINUTES
            ),
        }),
    }
}

/// The 409 of a plaintext write onto an encrypted current state where the downgrade
/// policy applies: what is stored, what was sent, how to proceed (no content).
fn refused_downgrade(workspace: &str, current: &VersionRow, sent: &Sent) -> Error {
    let message = format!(
        "refused: workspace {workspace:?} holds an OpenTofu-encrypted state (version {}, serial {}) and the state sent (serial {}) is plaintext; nothing was written. tofu.refuse_plaintext_after_encrypted covers this workspace so that a run without its encryption configuration (TF_ENCRYPTION unset, a plain terraform) cannot silently store the state in clear.",
        current.version,
        current.serial.unwrap_or_default(),
        sent.serial
    );
    tracing::warn!(
        workspace,
        refused = REFUSED_DOWNGRADE,
        "plaintext state write onto an encrypted state refused"
    );
    Error::WriteRefused {
        message,
        facts: serde_json::json!({
            "refused": REFUSED_DOWNGRADE,
            "stored": {
                "version": current.version,
                "serial": current.serial,
                "lineage": current.lineage,
                "encryption": "encrypted",
            },
            "sent": { "serial": sent.serial, "lineage": sent.lineage, "encryption": "plaintext" },
            "how_to_proceed": format!(
                "run with the workspace's encryption configuration (TF_ENCRYPTION / the encryption block) so the state is written encrypted. If decrypting it is intended (a deliberate migration to plaintext), an operator can allow one such write for {} minutes: `stategate workspace allow-write {workspace} --reason \"...\"` or POST /api/v1/admin/workspaces/{workspace}/allow-write; then retry.",
                guard::DEFAULT_OVERRIDE_MINUTES
            ),
        }),
    }
}

/// The `refused` name of a downgrade in the 409 body and the override's audit row.
pub const REFUSED_DOWNGRADE: &str = "plaintext_after_encrypted";

/// The guard of a state POST: the lock holder first ([`lock::decide_write`]), then,
/// once `sent` is known, the successor rules ([`guard::decide_successor`]). A refused
/// kind of write passes on a valid operator override; inside the commit (a write
/// transaction) the override is used up and audited with the write, while a look
/// before the commit (on a reader, outside any transaction) leaves it in place.
fn guard_write(
    conn: &Connection,
    workspace: &str,
    writer: &str,
    lock_id: Option<&str>,
    current: Option<&VersionRow>,
    sent: Option<&Sent>,
    downgrade: &posture::DowngradePolicy,
) -> Result<(), Error> {
    check_writer(conn, workspace, lock_id)?;
    let Some(sent) = sent else {
        return Ok(());
    };
    let in_commit = in_write_transaction(conn);
    let Some(row) = current else {
        if in_commit {
            posture::record(conn, workspace, 1, &sent.encryption).map_err(DbError::from)?;
        }
        return Ok(());
    };
    let why = match decide_successor(Some(row), sent) {
        Successor::Allow => None,
        Successor::Refuse(why) => Some(why),
    };
    let live = !row.is_tombstone();
    let current_encrypted = if live && downgrade.applies(workspace) {
        posture::of_version(conn, workspace, row.version).map_err(DbError::from)?
    } else {
        None
    };
    let downgraded =
        posture::is_refused_downgrade(downgrade, workspace, current_encrypted, &sent.encryption);
    // What the commit records for the version it is about to insert; an identical
    // retry inserts nothing and records nothing.
    let record = |conn: &Connection| -> Result<(), Error> {
        if in_commit && !(live && row.sha256.as_deref() == Some(sent.sha256.as_str())) {
            posture::record(conn, workspace, row.version + 1, &sent.encryption)
                .map_err(DbError::from)?;
        }
        Ok(())
    };
    if why.is_none() && !downgraded {
        return record(conn);
    }
    let grant = guard::active_override(conn, workspace, unix_now()).map_err(DbError::from)?;
    let Some(grant) = grant else {
        return Err(match why {
            Some(why) => refused(workspace, row, sent, why),
            None => refused_downgrade(workspace, row, sent),
        });
    };
    if !in_commit {
        return Ok(()); // the commit decides again, and uses the override up there
    }
    guard::delete_override(conn, workspace).map_err(DbError::from)?;
    let entry = audit(
        writer,
        workspace,
        EVENT_OVERRIDE_USED,
        serde_json::json!({
            "refused": why.map_or(REFUSED_DOWNGRADE, Refusal::as_str),
            "granted_by": grant.granted_by,
            "reason": grant.reason,
            "stored": { "serial": row.serial, "lineage": row.lineage },
            "sent": { "serial": sent.serial, "lineage": sent.lineage },
        }),
    );
    insert_audit(conn, &entry).map_err(DbError::from)?;
    record(conn)
}

/// The check speaks the caller's error type, so the body's own failures (which only
/// the caller knows, e.g. the HTTP edge's) pass through the write unchanged.
impl<E: From<Error> + Send + 'static> BodyCheck<E> for StateCheck {
    fn chunk(&mut self, data: &Bytes) -> Result<(), E> {
        self.check_chunk(data).map_err(E::from)
    }

    fn finish(self: Box<Self>, sha256: &str, size: u64) -> Result<BodyMeta, E> {
        self.check_end(sha256, size).map_err(E::from)
    }
}

impl StateCheck {
    fn check_chunk(&mut self, data: &Bytes) -> Result<(), Error> {
        if let Some((_, hasher)) = &mut self.md5 {
            hasher.update(data);
        }
        self.scanner.push(data)
    }

    fn check_end(self: Box<Self>, sha256: &str, size: u64) -> Result<BodyMeta, Error> {
        if let Some((expected, hasher)) = self.md5 {
            protocol::check_md5(&expected, &hasher.finish()?)?;
        }
        let encryption = self.scanner.encryption();
        let (meta, resources) = self.scanner.finish_with_resources()?;
        let sent = Sent {
            serial: meta.serial,
            lineage: meta.lineage.clone(),
            sha256: sha256.to_string(),
            encryption,
        };
        {
            // Judged against the row seen when the write began, before the blob is
            // complete: a refused write leaves no blob at all. The commit judges again.
            let mut pending = pending(&self.pending);
            if let Some(row) = &pending.seen {
                if let Successor::Refuse(why) = decide_successor(Some(row), &sent) {
                    if !pending.overridable {
                        return Err(refused(&self.workspace, row, &sent, why));
                    }
                }
                let downgraded = self.downgrade
                    && !row.is_tombstone()
                    && pending.seen_encrypted == Some(true)
                    && sent.encryption == crate::tfstate::BodyEncryption::Plaintext;
                if downgraded && !pending.overridable {
                    return Err(refused_downgrade(&self.workspace, row, &sent));
                }
            }
            pending.sent = Some(sent);
        }
        Ok(BodyMeta {
            serial: Some(meta.serial),
            lineage: Some(meta.lineage.clone()),
            audit: Some(audit(
                &self.writer,
                &self.workspace,
                EVENT_WRITTEN,
                written_payload(meta.serial, &meta.lineage, size, self.lock.as_ref()),
            )),
            resources,
        })
    }
}

/// The freeze in force on `workspace`. In a write transaction an expired freeze is
/// removed and its expiry audited here, where it is noticed; on a reader an expired
/// freeze is simply not in force (the commit that follows removes it).
fn freeze_in_force(conn: &Connection, workspace: &str) -> Result<Option<Freeze>, Error> {
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

fn expire_freeze(conn: &Connection, f: &Freeze) -> Result<(), Error> {
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
fn frozen(f: &Freeze) -> Error {
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

/// What a move did: the new version of each workspace and what moved.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MoveDone {
    pub from: MovedSide,
    pub to: MovedSide,
    pub addresses: Vec<String>,
    /// Resource instances moved (every instance of each address).
    pub instances: usize,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MovedSide {
    pub workspace: String,
    pub version: i64,
    pub serial: Option<i64>,
}

/// May a write carrying `lock_id` proceed: the lock holder's (a freeze never breaks a
/// held lock), or without a lock only while nobody holds it and no freeze is in force.
fn check_writer(conn: &Connection, workspace: &str, lock_id: Option<&str>) -> Result<(), Error> {
    if lock_id.is_none() {
        if let Some(f) = freeze_in_force(conn, workspace)? {
            return Err(frozen(&f));
        }
    }
    let held = holders(conn, workspace).map_err(DbError::from)?;
    let decision = decide_write(&held, lock_id);
    // Shown only to a refused writer (see `judge_lock_on`).
    let shown = match decision {
        lock::Write::Refuse => held.shown(),
        _ => None,
    };
    match (decision, shown) {
        (lock::Write::Allow, _) => Ok(()),
        (lock::Write::Refuse, Some(holder)) => Err(locked_by(holder)),
        (lock::Write::PlanOnly, _) => Err(Error::Conflict(format!(
            "lock {} is a plan lock (shared with other plans): a plan never writes state; nothing was written. Run apply (an exclusive lock) to write",
            lock_id.unwrap_or_default()
        ))),
        (lock::Write::NotHeld | lock::Write::Refuse, _) => Err(Error::Conflict(format!(
            "lock {} is not held on this workspace (it was released or force-unlocked); nothing was written",
            lock_id.unwrap_or_default()
        ))),
    }
}

/// Deletes the holders `freed` of `ws` (the exclusive one, or plan holders one by
/// one), each audited as `event` by `actor`.
fn release(
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
fn release_one(
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
fn judge_lease(
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

/// Operator writes (rollback, restore) wait for nobody: refused (423 + holder's
/// LockInfo) while anyone holds the workspace lock, and (423 + the freeze's LockInfo)
/// while it is frozen.
fn ensure_unlocked(conn: &Connection, workspace: &str) -> Result<(), Error> {
    check_writer(conn, workspace, None)
}

impl TofuBackend {
    pub fn new(store: StateStore, root: RootKey) -> Self {
        TofuBackend {
            db: store.index_handle(),
            store,
            root,
            last_used: credentials::LastUsed::default(),
            downgrade: Arc::default(),
            ci: Arc::default(),
            leases: Arc::default(),
        }
    }

    /// Releases, in housekeeping, the idle locks of gone credentials on the
    /// workspaces `policies` names (`[[lock_policy]]`, [`Self::expire_leased_locks`]).
    pub fn with_lease_policies(mut self, policies: lock::LeasePolicies) -> Self {
        self.leases = Arc::new(policies);
        self
    }

    /// The lease policies in force.
    pub fn lease_policies(&self) -> &lock::LeasePolicies {
        &self.leases
    }

    /// Accepts the job tokens of these CI issuers (`[[ci_identity]]`).
    pub fn with_ci_identities(mut self, ci: ci_identity::CiIdentities) -> Self {
        self.ci = Arc::new(ci);
        self
    }

    /// Refuses plaintext writes onto encrypted current states of the workspaces
    /// `policy` names (`tofu.refuse_plaintext_after_encrypted`).
    pub fn with_downgrade_policy(mut self, policy: posture::DowngradePolicy) -> Self {
        self.downgrade = Arc::new(policy);
        self
    }

    pub fn store(&self) -> &StateStore {
        &self.store
    }

    /// Roll-forward: stores version `to_version`'s content as a new version, audited as
    /// `tf.rollback`. Refused while the workspace is locked, re-checked at commit.
    pub async fn rollback(
        &self,
        workspace: &str,
        to_version: i64,
        actor: &str,
    ) -> Result<RolledBack, Error> {
        self.rollback_from(workspace, to_version, None, actor).await
    }

    /// [`Self::rollback`], refused (409) unless the current version is still
    /// `expected_from` (when given): what the operator previewed is what changes.
    pub async fn rollback_from(
        &self,
        workspace: &str,
        to_version: i64,
        expected_from: Option<i64>,
        actor: &str,
    ) -> Result<RolledBack, Error> {
        let scope = scope(workspace);
        let key = self.root.blob_key(&scope);
        let ws = workspace.to_string();
        let request = Rollback {
            scope,
            to_version,
            actor: actor.to_string(),
            org: None,
            event: EVENT_ROLLBACK,
            // Plans saved before the rollback must not apply to what it restores.
            renumber: Some(crate::tfstate::serial_span_scan),
            summarize: Some(crate::tfstate::resource_scan),
        };
        self.store
            .rollback(request, &key, move |conn, latest| {
                let now = latest.map(|r| r.version);
                if expected_from.is_some_and(|e| now != Some(e)) {
                    return Err(Error::Conflict(format!(
                        "{ws} changed since you looked (now at version {}); nothing was rolled back, look again",
                        now.unwrap_or(0)
                    )));
                }
                ensure_unlocked(conn, &ws)?;
                if in_write_transaction(conn) {
                    // The restored content is what it was: its posture carries over
                    // (a later version number only ever replaces this row).
                    posture::copy(conn, &ws, to_version, now.unwrap_or(0) + 1)
                        .map_err(DbError::from)?;
                }
                Ok(())
            })
            .await
    }

    /// One version's content, verified like the current one (missing or unreadable is
    /// an error, a tombstone is a conflict, an unknown version a 404), held whole: one
    /// larger than `max_bytes` is refused (409) before it is read.
    pub async fn read_version(
        &self,
        workspace: &str,
        version: i64,
        max_bytes: u64,
    ) -> Result<(crate::store::VersionRow, Vec<u8>), Error> {
        let scope = scope(workspace);
        let key = self.root.blob_key(&scope);
        Ok(self
            .store
            .read_version(&scope, version, &key, max_bytes)
            .await?)
    }

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

    /// Undoes a DELETE: the newest version with content becomes current again as a new
    /// version, audited as `tf.restored`. Refused unless the newest version is a
    /// tombstone, and while the workspace is locked.
    pub async fn restore(&self, workspace: &str, actor: &str) -> Result<RolledBack, Error> {
        let scope = scope(workspace);
        let rows = self.store.history(&scope, None).await?;
        let Some(latest) = rows.first() else {
            return Err(Error::NotFound(format!(
                "workspace {workspace:?} has no versions"
            )));
        };
        if !latest.is_tombstone() {
            return Err(Error::Conflict(format!(
                "workspace {workspace:?} is not deleted (version {} is current); nothing to restore",
                latest.version
            )));
        }
        let Some(live) = rows.iter().find(|r| !r.is_tombstone()) else {
            return Err(Error::Conflict(format!(
                "workspace {workspace:?} has no version with content to restore"
            )));
        };
        let key = self.root.blob_key(&scope);
        let ws = workspace.to_string();
        let request = Rollback {
            scope,
            to_version: live.version,
            actor: actor.to_string(),
            org: None,
            event: EVENT_RESTORED,
            // Plans saved before the rollback must not apply to what it restores.
            renumber: Some(crate::tfstate::serial_span_scan),
            summarize: Some(crate::tfstate::resource_scan),
        };
        self.store
            .rollback(request, &key, move |conn, _latest| {
                ensure_unlocked(conn, &ws)
            })
            .await
    }

    /// Which credential of `workspace` `presented` is, if any, for a request that does
    /// `what` (only an outputs read looks at consumers). Every credential is checked
    /// here, in this order, after one short lookup on an idle reader (never the
    /// writer): the workspace's derived bearer at its current generation (constant
    /// time), a drift run's credential (`sgr_`), an issued workspace token (`sgw_`:
    /// found by its hash whether live or not, then judged here, so a revoked, expired
    /// or other workspace's token costs what a wrong one does), and for an outputs
    /// read the derived credentials of the consumers this workspace names. The caller
    /// asks [`access::permits`]; every refusal is the same 401.
    pub async fn authenticate(
        &self,
        workspace: &str,
        presented: Option<Vec<u8>>,
        what: access::Use,
    ) -> Result<Option<Credential>, Error> {
        let Some(secret) = presented else {
            return Ok(None);
        };
        let now = unix_now();
        if ci_identity::is_token_shaped(&secret) {
            return self.authenticate_ci(workspace, &secret, what, now).await;
        }
        let outputs = what == access::Use::ReadOutputs;
        let found = self
            .look_up(workspace, &secret, outputs, now, "credential", |_| Ok(()))
            .await?;
        Ok(self.judge_credential(workspace, &secret, now, found.0))
    }

    /// [`Self::authenticate`] of a LOCK (a write), reading the workspace's lock row and
    /// freeze in the same lookup, whatever the credential turns out to be (so every
    /// refusal costs the same): the LOCK that follows is answered from them when they
    /// refuse it ([`LockSeen`]).
    pub async fn authenticate_lock(
        &self,
        workspace: &str,
        secret: Vec<u8>,
    ) -> Result<(Option<Credential>, LockSeen), Error> {
        let ws = workspace.to_string();
        let now = unix_now();
        if ci_identity::is_token_shaped(&secret) {
            let who = self
                .authenticate_ci(workspace, &secret, access::Use::Write, now)
                .await?;
            let seen = self
                .db
                .read_remembered(format!("ci-lock:{workspace}"), move |c| {
                    LockSeen::read(c, &ws)
                })
                .await?;
            return Ok((who, seen));
        }
        let (found, seen) = self
            .look_up(workspace, &secret, false, now, "lock", move |c| {
                LockSeen::read(c, &ws)
            })
            .await?;
        Ok((self.judge_credential(workspace, &secret, now, found), seen))
    }

    /// [`Self::authenticate`] of a CI job's identity token (`ci_identity`): verified
    /// against its issuer's keys, mapped by its rules, and admitted inside its window
    /// (which writes its first-seen record, so only for a request `what` is permitted).
    async fn authenticate_ci(
        &self,
        workspace: &str,
        token: &[u8],
        what: access::Use,
        now: i64,
    ) -> Result<Option<Credential>, Error> {
        let Some(verified) = self.ci.verify(token, now).await else {
            return Ok(None);
        };
        let Some(who) = verified
            .credential(workspace)
            .filter(|who| access::permits(who, what))
        else {
            return Ok(None);
        };
        let admitted = self.ci.admit(&self.db, &verified, now).await?;
        Ok(admitted.then_some(who))
    }

    /// What the credential check reads at `now`, in one short read transaction on an
    /// idle reader (never the writer), with `also` (named `also_name`) of the same
    /// snapshot.
    ///
    /// A secret of neither an issued token's nor a drift run's shape can only be a
    /// derived credential, whose check reads the workspace's generation alone: nothing
    /// the secret or the time selects. That lookup is remembered between commits
    /// (`Db::read_remembered`), so a storm of refused LOCKs, right or wrong secret
    /// alike, reads no rows until something changes.
    async fn look_up<T: Clone + crate::store::db::Weigh + Send + 'static>(
        &self,
        workspace: &str,
        secret: &[u8],
        outputs: bool,
        now: i64,
        also_name: &str,
        also: impl Fn(&Connection) -> Result<T, crate::store::sql::Error> + Send + 'static,
    ) -> Result<(Found, T), Error> {
        let ws = workspace.to_string();
        if !outputs
            && !credentials::is_token_shaped(secret)
            && !run_credential::is_run_shaped(secret)
        {
            let (generation, also) = self
                .db
                .read_remembered(format!("{also_name}:{workspace}"), move |c| {
                    Ok((credentials::generation(c, &ws)?, also(c)?))
                })
                .await?;
            let presented = credentials::Presented {
                generation,
                ..Default::default()
            };
            return Ok(((presented, None), also));
        }
        let lookup = secret.to_vec();
        Ok(self
            .db
            .read_snapshot(move |c| {
                let presented = credentials::presented(c, &ws, &lookup, outputs)?;
                let run = run_credential::lookup(c, &ws, &lookup, now)?;
                Ok(((presented, run), also(c)?))
            })
            .await?)
    }

    /// Which credential of `workspace` `secret` is at `now`, from what
    /// [`Self::look_up`] found.
    fn judge_credential(
        &self,
        workspace: &str,
        secret: &[u8],
        now: i64,
        (found, run): Found,
    ) -> Option<Credential> {
        let bearer = self.root.workspace_bearer_at(workspace, found.generation);
        if crate::crypto::secrets_equal(secret, bearer.as_bytes()) {
            return Some(Credential::Workspace);
        }
        if let Some(name) = run {
            return Some(Credential::Run(name));
        }
        if let Some((stored, Some(grant))) = found.token {
            if stored.is_live(now) && grant.covers(workspace) {
                self.last_used.touch(&stored.sha256, now);
                let name = stored
                    .name
                    .unwrap_or_else(|| crate::tokens::id_of(&stored.sha256));
                return Some(Credential::Token {
                    name,
                    scope: grant.scope,
                    include_sensitive: grant.include_sensitive,
                });
            }
            return None;
        }
        // A secret no bearer could be needs no derivation: the test depends on the
        // secret alone, never on the workspace.
        if !found.outputs || secret.len() != crate::crypto::BEARER_LEN {
            return None;
        }
        // Exactly MAX_CONSUMERS bearers are derived and compared, whatever the number
        // of consumers (none for a missing workspace) and which one matches: the work,
        // and so the time of a 401, does not tell whether the workspace exists or how
        // many consumers it names. The padding's name is empty, which no workspace is.
        let mut consumer = None;
        let mut named = found.consumers.into_iter();
        for _ in 0..credentials::MAX_CONSUMERS {
            let (name, generation) = named.next().unwrap_or_default();
            let theirs = self.root.workspace_bearer_at(&name, generation);
            let equal = crate::crypto::secrets_equal(secret, theirs.as_bytes());
            if equal && !name.is_empty() {
                consumer = Some(Credential::Consumer { workspace: name });
            }
        }
        consumer
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

    /// The current state as verified pieces, or `None` when there is none. Returns once
    /// the blob's header and first chunk verified (a blob unreadable from the start is
    /// an error here, before anything was sent).
    pub async fn get_stream(&self, workspace: &str) -> Result<Option<StateStream>, Error> {
        let key = self.root.blob_key(&scope(workspace));
        Ok(self.store.stream_current(&scope(workspace), &key).await?)
    }

    /// A whole-body state write by `who` (tools and benchmarks; Terraform's POSTs
    /// stream through [`Self::write_stream`]).
    pub async fn write(
        &self,
        workspace: &str,
        lock_id: Option<String>,
        body: Bytes,
        who: &Credential,
    ) -> Result<WriteOutcome, Error> {
        let key = self.root.blob_key(&scope(workspace));
        let mut scanner = crate::tfstate::StateScanner::with_resources(key.resource_digest_key());
        scanner.push(&body)?;
        let encryption = scanner.encryption();
        let (meta, resources) = scanner.finish_with_resources()?;
        let size = body.len() as u64;
        let ws = workspace.to_string();
        let writer = who.name(workspace);
        let lock = self.lock_facts(workspace, lock_id.as_deref()).await?;
        let new = NewVersion {
            scope: scope(workspace),
            plaintext: body,
            serial: Some(meta.serial),
            lineage: Some(meta.lineage.clone()),
            actor: writer.clone(),
            facts: lock.as_ref().map(|(_, f)| f.clone()).unwrap_or_default(),
            audit: Some(audit(
                &writer,
                workspace,
                EVENT_WRITTEN,
                written_payload(meta.serial, &meta.lineage, size, lock.as_ref()),
            )),
            resources,
        };
        let sent = Sent {
            serial: meta.serial,
            lineage: meta.lineage,
            sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&new.plaintext)),
            encryption,
        };
        let downgrade = self.downgrade.clone();
        self.store
            .write_version(new, &key, move |conn, latest| {
                guard_write(
                    conn,
                    &ws,
                    &writer,
                    lock_id.as_deref(),
                    latest,
                    Some(&sent),
                    &downgrade,
                )
            })
            .await
    }

    /// The lock `lock_id` a write is made under, with the Who/Operation its holder
    /// sent (bounded), when it holds the workspace now; the commit checks again that it
    /// still does, so a write never records a lock it was not made under.
    async fn lock_facts(
        &self,
        workspace: &str,
        lock_id: Option<&str>,
    ) -> Result<Option<(String, WriteFacts)>, Error> {
        let Some(id) = lock_id.map(str::to_string) else {
            return Ok(None);
        };
        let ws = workspace.to_string();
        let held = self.db.read_quick(move |c| held_lock(c, &ws)).await?;
        Ok(held.filter(|h| h.id == id).map(|held| {
            let summary = lock_summary(&held);
            let field = |name: &str| summary[name].as_str().unwrap_or("").to_string();
            let facts = WriteFacts::under_lock(&field("who"), &field("operation"));
            (held.id, facts)
        }))
    }

    /// A state write whose body arrives in pieces through `body`: scanned for serial
    /// and lineage, hashed (and checked against `content_md5`, the decoded header) and
    /// sealed into the store as it comes. Any failure stores nothing. `E` is the
    /// caller's error: a failure the body stream sends arrives back unchanged.
    pub async fn write_stream<E>(
        &self,
        workspace: &str,
        lock_id: Option<String>,
        content_md5: Option<Vec<u8>>,
        body: BodyChunks<E>,
        who: &Credential,
    ) -> Result<WriteOutcome, E>
    where
        E: From<Error> + From<StoreError> + From<DbError> + Send + 'static,
    {
        let key = self.root.blob_key(&scope(workspace));
        let ws = workspace.to_string();
        let writer = who.name(workspace);
        let lock = self.lock_facts(workspace, lock_id.as_deref()).await?;
        let slot = Arc::new(Mutex::new(Pending::default()));
        let new = StreamedVersion {
            scope: scope(workspace),
            actor: writer.clone(),
            facts: lock.as_ref().map(|(_, f)| f.clone()).unwrap_or_default(),
            check: Box::new(StateCheck {
                workspace: workspace.to_string(),
                writer: writer.clone(),
                lock,
                scanner: crate::tfstate::StateScanner::with_resources(key.resource_digest_key()),
                md5: content_md5.map(|expected| (expected, OffThreadHash::default())),
                pending: slot.clone(),
                downgrade: self.downgrade.applies(workspace),
            }),
        };
        let downgrade = self.downgrade.clone();
        self.store
            .write_stream(new, body, &key, move |conn, latest| {
                let sent = pending(&slot).sent.clone();
                if sent.is_none() {
                    // The look before the body: remember what the body will be judged
                    // against when it ends.
                    let now = unix_now();
                    let overridable = guard::active_override(conn, &ws, now)
                        .map_err(DbError::from)?
                        .is_some();
                    let seen_encrypted = match latest {
                        Some(row) if downgrade.applies(&ws) => {
                            posture::of_version(conn, &ws, row.version).map_err(DbError::from)?
                        }
                        _ => None,
                    };
                    let mut pending = pending(&slot);
                    pending.seen = latest.cloned();
                    pending.seen_encrypted = seen_encrypted;
                    pending.overridable = overridable;
                }
                guard_write(
                    conn,
                    &ws,
                    &writer,
                    lock_id.as_deref(),
                    latest,
                    sent.as_ref(),
                    &downgrade,
                )
                .map_err(E::from)
            })
            .await
    }

    /// Lets ONE write that the guard would refuse through to `workspace` within
    /// `minutes` (replacing an earlier override), audited as `tf.write_allowed` by
    /// `actor`. The write that uses it is audited as `tf.write_override_used`.
    pub async fn allow_write(
        &self,
        workspace: &str,
        minutes: u32,
        reason: &str,
        actor: &str,
    ) -> Result<Override, Error> {
        crate::names::validate_workspace(workspace)?;
        let reason =
            guard::check_request(minutes, reason).map_err(|e| Error::Invalid(e.to_string()))?;
        let now = unix_now();
        let grant = Override {
            workspace: workspace.to_string(),
            granted_by: actor.to_string(),
            reason,
            created_at: crate::store::now_rfc3339(),
            expires_at: now + i64::from(minutes) * 60,
        };
        let done = grant.clone();
        self.db
            .write(move |conn| -> Result<(), Error> {
                guard::put_override(conn, &grant, now).map_err(DbError::from)?;
                let entry = audit(
                    &grant.granted_by,
                    &grant.workspace,
                    EVENT_WRITE_ALLOWED,
                    serde_json::json!({
                        "reason": grant.reason,
                        "minutes": minutes,
                        "expires_at": grant.expires_at,
                    }),
                );
                insert_audit(conn, &entry).map_err(DbError::from)?;
                Ok(())
            })
            .await?;
        Ok(done)
    }

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

    /// Moves the resource records `addresses` (every instance of each) from the state
    /// of `source` to the state of `destination`, as `terraform state mv -state-out`
    /// between two files would, by `actor`: takes both workspace locks (in name order,
    /// in one transaction; refused with 423 while either is locked or frozen), reads
    /// both current states whole (each at most `max_bytes`, else 409), writes one new
    /// version of each (next serial, lineage kept) in ONE commit that re-checks both
    /// locks, audited as one `tf.resources_moved` naming both versions, then releases
    /// the locks. Any refusal changes nothing.
    pub async fn move_resources(
        &self,
        source: &str,
        destination: &str,
        addresses: &[String],
        actor: &str,
        max_bytes: u64,
    ) -> Result<MoveDone, Error> {
        crate::names::validate_workspace(source)?;
        crate::names::validate_workspace(destination)?;
        if source == destination {
            return Err(Error::Invalid(
                "the source and the destination are the same workspace; nothing was moved".into(),
            ));
        }
        let addresses = moves::check_addresses(addresses)
            .map_err(|e| Error::Invalid(format!("{e}; nothing was moved")))?;
        let move_id = format!("stategate-move-{}", uuid::Uuid::new_v4());
        let mut order = [source.to_string(), destination.to_string()];
        order.sort();
        let info = serde_json::json!({
            "ID": move_id,
            "Operation": "stategate workspace move",
            "Info": format!("moving {} resources from {source} to {destination}", addresses.len()),
            "Who": actor,
            "Version": "",
            "Created": crate::store::now_rfc3339(),
            "Path": "",
        })
        .to_string();
        let lock = HeldLock {
            id: move_id.clone(),
            info,
        };
        let (taken, by) = (order.clone(), actor.to_string());
        // Recorded in the transaction that takes the locks, before them: no lock of a
        // move exists without the record that lets housekeeping release it.
        let record = moves::Recorded {
            move_id: move_id.clone(),
            source: source.to_string(),
            destination: destination.to_string(),
            actor: actor.to_string(),
            process: moves::this_process().to_string(),
            heartbeat_unix: unix_now(),
            started_at: crate::store::now_rfc3339(),
        };
        self.db
            .write(move |conn| -> Result<(), Error> {
                moves::record(conn, &record).map_err(DbError::from)?;
                for ws in &taken {
                    if let Some(f) = freeze_in_force(conn, ws)? {
                        return Err(frozen(&f));
                    }
                    if let Some(holder) = held_lock(conn, ws).map_err(DbError::from)? {
                        return Err(locked_by(holder));
                    }
                    lock::put_lock(conn, ws, &lock, &by).map_err(DbError::from)?;
                }
                Ok(())
            })
            .await?;
        // In a JoinSet, which aborts the heartbeat when dropped: it stops with this
        // move however the move ends (returned, cancelled with its request, panicked),
        // so no node keeps a dead move looking alive.
        let mut beating = tokio::task::JoinSet::new();
        {
            let (db, id) = (self.db.clone(), move_id.clone());
            beating.spawn(async move {
                loop {
                    tokio::time::sleep(moves::HEARTBEAT).await;
                    let id = id.clone();
                    let beat = db
                        .write(move |c| -> Result<(), DbError> {
                            Ok(moves::beat(c, &id, unix_now())?)
                        })
                        .await;
                    if let Err(e) = beat {
                        tracing::warn!(error = %e, "a move cannot renew its heartbeat");
                    }
                }
            });
        }
        moves::pause_point("locked").await;
        let done = self
            .move_locked(source, destination, &addresses, actor, max_bytes, &move_id)
            .await;
        if done.is_ok() {
            moves::pause_point("committed").await;
        }
        drop(beating);
        let (held, id) = (order, move_id);
        let released = self
            .db
            .write(move |conn| -> Result<(), Error> {
                for ws in &held {
                    if held_lock(conn, ws)
                        .map_err(DbError::from)?
                        .is_some_and(|l| l.id == id)
                    {
                        lock::delete_lock(conn, ws).map_err(DbError::from)?;
                    }
                }
                moves::forget(conn, &id).map_err(DbError::from)?;
                Ok(())
            })
            .await;
        if let Err(e) = released {
            tracing::warn!(source, destination, error = %e, "a move could not release its locks; free them with `stategate workspace unlock`");
        }
        done
    }

    /// Releases the locks of every move whose process is gone ([`moves::gone`]: killed
    /// or crashed, on this machine at once, elsewhere once its heartbeat lapsed), each
    /// audited as `tf.move_abandoned` on its workspace by [`HOUSEKEEPING`]; returns
    /// their lock IDs. Nothing a move committed is undone: its two versions were
    /// committed together or not at all. Housekeeping runs it at start and on every
    /// pass.
    pub async fn release_abandoned_moves(&self) -> Result<Vec<String>, Error> {
        // Judged on a reader first: a pass with no abandoned move (nearly every pass, on
        // every node) takes no write lock; the writer judges its candidates again.
        let now = unix_now();
        let recorded = self.db.read(moves::recorded).await?;
        let abandoned: Vec<String> = recorded
            .into_iter()
            .filter(|m| moves::gone(&m.process, m.heartbeat_unix, now))
            .map(|m| m.move_id)
            .collect();
        if abandoned.is_empty() {
            return Ok(Vec::new());
        }
        self.db
            .write(move |conn| -> Result<Vec<String>, Error> {
                let now = unix_now();
                let mut released = Vec::new();
                for m in moves::recorded(conn).map_err(DbError::from)? {
                    if !abandoned.contains(&m.move_id)
                        || !moves::gone(&m.process, m.heartbeat_unix, now)
                    {
                        continue;
                    }
                    for ws in [&m.source, &m.destination] {
                        let ours = held_lock(conn, ws)
                            .map_err(DbError::from)?
                            .is_some_and(|l| l.id == m.move_id);
                        if !ours {
                            continue;
                        }
                        lock::delete_lock(conn, ws).map_err(DbError::from)?;
                        // Each workspace's row names only that workspace.
                        let entry = audit(
                            HOUSEKEEPING,
                            ws,
                            EVENT_MOVE_ABANDONED,
                            serde_json::json!({
                                "lock_id": m.move_id,
                                "moved_by": m.actor,
                                "started_at": m.started_at,
                            }),
                        );
                        insert_audit(conn, &entry).map_err(DbError::from)?;
                    }
                    moves::forget(conn, &m.move_id).map_err(DbError::from)?;
                    released.push(m.move_id);
                }
                Ok(released)
            })
            .await
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

    /// The part of [`Self::move_resources`] that runs under both locks.
    async fn move_locked(
        &self,
        source: &str,
        destination: &str,
        addresses: &[String],
        actor: &str,
        max_bytes: u64,
        move_id: &str,
    ) -> Result<MoveDone, Error> {
        let mut read = Vec::with_capacity(2);
        for (ws, what) in [(source, "from"), (destination, "to")] {
            let latest = self.store.latest(&scope(ws)).await?;
            let Some(row) = latest.filter(|r| !r.is_tombstone()) else {
                return Err(Error::Conflict(format!(
                    "workspace {ws:?} has no state to move {what} (run terraform apply there first); nothing was moved"
                )));
            };
            read.push(self.read_version(ws, row.version, max_bytes).await?);
        }
        let refusal = |why: moves::Refusal| {
            let name = |side| match side {
                moves::Side::Source => source,
                moves::Side::Destination => destination,
            };
            match why {
                moves::Refusal::Missing(list) => Error::Invalid(format!(
                    "not in the state of {source:?}: {}; nothing was moved",
                    moves::listing(&list)
                )),
                moves::Refusal::Present(list) => Error::Conflict(format!(
                    "already in the state of {destination:?}: {}; nothing was moved",
                    moves::listing(&list)
                )),
                moves::Refusal::NotAState(side, why) => Error::Conflict(format!(
                    "the state of {:?} cannot be parsed: {why}; nothing was moved",
                    name(side)
                )),
                moves::Refusal::SerialExhausted(side) => Error::Conflict(format!(
                    "the state of {:?} has the largest serial stategate stores; nothing was moved",
                    name(side)
                )),
            }
        };
        let moved = moves::move_resources(&read[0].1, &read[1].1, addresses).map_err(refusal)?;
        let seen: Vec<i64> = read.iter().map(|(row, _)| row.version).collect();
        let new = |ws: &str, body: Vec<u8>, serial: i64, lineage: Option<String>, facts| {
            let key = self.root.blob_key(&scope(ws));
            // The new state's resources, for the timeline (held whole anyway).
            let resources = crate::store::timeline::summarize_whole(
                crate::tfstate::resource_scan(key.resource_digest_key()),
                &body,
            );
            let version = NewVersion {
                scope: scope(ws),
                plaintext: Bytes::from(body),
                serial: Some(serial),
                lineage,
                actor: actor.to_string(),
                facts,
                audit: None,
                resources,
            };
            (version, key)
        };
        let news = vec![
            new(
                source,
                moved.source,
                moved.source_serial,
                read[0].0.lineage.clone(),
                // Each version says where its resources went or came from: listings
                // count them as moved, not as added or destroyed.
                WriteFacts {
                    moved_to: Some(destination.to_string()),
                    ..Default::default()
                },
            ),
            new(
                destination,
                moved.destination,
                moved.destination_serial,
                read[1].0.lineage.clone(),
                WriteFacts {
                    moved_from: Some(source.to_string()),
                    ..Default::default()
                },
            ),
        ];
        let names = [source.to_string(), destination.to_string()];
        let (id, by, list) = (move_id.to_string(), actor.to_string(), addresses.to_vec());
        let instances = moved.instances;
        let rows = self
            .store
            .write_versions(news, move |conn, current, rows| -> Result<(), Error> {
                for ((ws, now), seen) in names.iter().zip(current).zip(&seen) {
                    // Our lock still holds (not force-unlocked), and nothing was
                    // written since the states were read.
                    check_writer(conn, ws, Some(&id))?;
                    if now.as_ref().map(|r| r.version) != Some(*seen) {
                        return Err(Error::Conflict(format!(
                            "{ws} changed while the move ran; nothing was moved, try again"
                        )));
                    }
                }
                let side = |i: usize| {
                    serde_json::json!({ "workspace": names[i], "version": rows[i].version, "serial": rows[i].serial })
                };
                let entry = audit(
                    &by,
                    &names[0],
                    EVENT_RESOURCES_MOVED,
                    serde_json::json!({
                        "from": side(0),
                        "to": side(1),
                        "addresses": list.iter().take(100).collect::<Vec<_>>(),
                        "address_count": list.len(),
                        "instances": instances,
                    }),
                );
                insert_audit(conn, &entry).map_err(DbError::from)?;
                // Both new states are plain Terraform states (a move refuses an
                // encrypted one), so their posture is known without scanning them.
                for (ws, row) in names.iter().zip(rows) {
                    posture::record(conn, ws, row.version, &crate::tfstate::BodyEncryption::Plaintext)
                        .map_err(DbError::from)?;
                }
                Ok(())
            })
            .await?;
        let side = |ws: &str, row: &VersionRow| MovedSide {
            workspace: ws.to_string(),
            version: row.version,
            serial: row.serial,
        };
        Ok(MoveDone {
            from: side(source, &rows[0]),
            to: side(destination, &rows[1]),
            addresses: addresses.to_vec(),
            instances,
        })
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
                let (decision, held) = judge_lock(conn, &ws, &wanted.id, plan)?;
                match decision {
                    Lock::Take => {
                        lock::put_lock(conn, &ws, &wanted, &credential).map_err(DbError::from)?;
                        lock::clear_waiting(conn, &ws).map_err(DbError::from)?;
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

    /// DELETE by `who`: a tombstone version (history is kept). Refused while someone
    /// holds the lock.
    pub async fn delete(&self, workspace: &str, who: &Credential) -> Result<bool, Error> {
        let ws = workspace.to_string();
        let writer = who.name(workspace);
        let row = self
            .store
            .write_tombstone(
                &scope(workspace),
                &writer,
                Some(audit(
                    &writer,
                    workspace,
                    EVENT_DELETED,
                    serde_json::json!({}),
                )),
                move |conn, _| check_writer(conn, &ws, None),
            )
            .await?;
        Ok(row.is_some())
    }
}

/// The variables that make `terraform init` work with a bare `backend "http" {}`:
/// the address, lock addresses and credential, and optionally OpenTofu's
/// `TF_ENCRYPTION` with a derived passphrase. `workspace env` prints them; drift
/// checks put them into their child's environment.
pub fn client_vars(
    base_url: &str,
    workspace: &str,
    root: &RootKey,
    encryption: bool,
) -> Vec<(&'static str, String)> {
    let address = format!("{base_url}/api/v1/tf/state/{workspace}");
    let mut vars = vec![
        ("TF_HTTP_ADDRESS", address.clone()),
        ("TF_HTTP_LOCK_ADDRESS", address.clone()),
        ("TF_HTTP_UNLOCK_ADDRESS", address),
        ("TF_HTTP_USERNAME", "stategate".to_string()),
        ("TF_HTTP_PASSWORD", root.workspace_bearer(workspace)),
    ];
    if encryption {
        let passphrase = root.workspace_passphrase(workspace);
        let hcl = format!(
            "key_provider \"pbkdf2\" \"stategate\" {{ passphrase = \"{passphrase}\" }}\n\
             method \"aes_gcm\" \"stategate\" {{ keys = key_provider.pbkdf2.stategate }}\n\
             state {{ method = method.aes_gcm.stategate }}\n\
             plan {{ method = method.aes_gcm.stategate }}"
        );
        vars.push(("TF_ENCRYPTION", hcl));
    }
    vars
}

/// Shell `export` lines of [`client_vars`] with the bearer of credential `generation`
/// (no value holds a single quote).
pub fn client_env(
    base_url: &str,
    workspace: &str,
    root: &RootKey,
    generation: u64,
    encryption: bool,
) -> String {
    client_vars(base_url, workspace, root, encryption)
        .into_iter()
        .map(|(name, value)| match name {
            "TF_HTTP_PASSWORD" => (name, root.workspace_bearer_at(workspace, generation)),
            _ => (name, value),
        })
        .map(|(name, value)| format!("export {name}='{value}'\n"))
        .collect()
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

    #[test]
    fn client_env_lines() {
        let root = RootKey::from_bytes([3; 32]);
        let plain = client_env("http://h:1", "prod", &root, 0, false);
        let lines: Vec<&str> = plain.lines().collect();
        assert_eq!(
            lines,
            vec![
                "export TF_HTTP_ADDRESS='http://h:1/api/v1/tf/state/prod'",
                "export TF_HTTP_LOCK_ADDRESS='http://h:1/api/v1/tf/state/prod'",
                "export TF_HTTP_UNLOCK_ADDRESS='http://h:1/api/v1/tf/state/prod'",
                "export TF_HTTP_USERNAME='stategate'",
                &format!(
                    "export TF_HTTP_PASSWORD='{}'",
                    root.workspace_bearer("prod")
                ),
            ]
        );
        let encrypted = client_env("http://h:1", "prod", &root, 0, true);
        let rotated = client_env("http://h:1", "prod", &root, 2, false);
        assert!(rotated.contains(&root.workspace_bearer_at("prod", 2)));
        assert!(!rotated.contains(&root.workspace_bearer("prod")));
        assert!(encrypted.starts_with(&plain));
        let passphrase = root.workspace_passphrase("prod");
        assert!(passphrase.len() >= 16);
        assert!(encrypted.contains(&format!("passphrase = \"{passphrase}\"")));
        assert!(encrypted.contains("method \"aes_gcm\""));
        assert!(!passphrase.contains('\'') && !passphrase.contains('"'));
    }
}
