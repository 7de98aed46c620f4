//! The write path: a state POST streamed through its checks (lineage, serial, the
//! lock it is made under, the downgrade policy) into one version commit, and DELETE,
//! rollback and restore, each checking the lock again inside its transaction.

use super::*;

/// The payload of `tf.state_written`: metadata, and the lock it was written under with
/// the client's own Who/Operation (bounded) when there was one.
pub(super) fn written_payload(
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

/// What a streamed state write checks as its body passes.
pub(super) struct StateCheck {
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
pub(super) struct Pending {
    seen: Option<VersionRow>,
    /// Whether `seen` was recorded as encrypted (`posture`; `None`: not recorded).
    seen_encrypted: Option<bool>,
    overridable: bool,
    sent: Option<Sent>,
}

pub(super) fn pending(slot: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    // A panic elsewhere cannot leave this half-written: every field is set whole.
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The 409 of a write the guard refuses: what is stored, what was sent and how to
/// proceed (serials and lineages only, never content).
pub(super) fn refused(workspace: &str, current: &VersionRow, sent: &Sent, why: Refusal) -> Error {
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
pub(super) fn refused_downgrade(workspace: &str, current: &VersionRow, sent: &Sent) -> Error {
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
    downgrade_refusal(
        message,
        current,
        serde_json::json!({ "serial": sent.serial, "lineage": sent.lineage, "encryption": "plaintext" }),
        format!(
            "run with the workspace's encryption configuration (TF_ENCRYPTION / the encryption block) so the state is written encrypted. If decrypting it is intended (a deliberate migration to plaintext), an operator can allow one such write for {} minutes: `stategate workspace allow-write {workspace} --reason \"...\"` or POST /api/v1/admin/workspaces/{workspace}/allow-write; then retry.",
            guard::DEFAULT_OVERRIDE_MINUTES
        ),
    )
}

/// The 409 of a change the downgrade policy refuses, a write's or a rollback's: what is
/// stored, what was sent, how to proceed (never content).
fn downgrade_refusal(
    message: String,
    current: &VersionRow,
    sent: serde_json::Value,
    how_to_proceed: String,
) -> Error {
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
            "sent": sent,
            "how_to_proceed": how_to_proceed,
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
pub(super) fn guard_write(
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
    let downgraded = refuses_downgrade(
        conn,
        downgrade,
        workspace,
        row,
        Some(posture::is_encrypted(&sent.encryption)),
    )
    .map_err(DbError::from)?;
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
    pass_on_override(
        conn,
        workspace,
        writer,
        why.map_or(REFUSED_DOWNGRADE, Refusal::as_str),
        serde_json::json!({ "serial": row.serial, "lineage": row.lineage }),
        serde_json::json!({ "serial": sent.serial, "lineage": sent.lineage }),
        || match why {
            Some(why) => refused(workspace, row, sent, why),
            None => refused_downgrade(workspace, row, sent),
        },
    )?;
    record(conn)
}

/// The downgrade policy's decision on a successor of `current` (a state write, or a
/// rollback storing an old version again — one rule for both): refused when the policy
/// covers `workspace`, `current` is live and recorded encrypted, and the successor is
/// plaintext. The posture is read only where the policy applies.
pub(super) fn refuses_downgrade(
    conn: &Connection,
    policy: &posture::DowngradePolicy,
    workspace: &str,
    current: &VersionRow,
    successor_encrypted: Option<bool>,
) -> crate::store::sql::Result<bool> {
    let current_encrypted = if !current.is_tombstone() && policy.applies(workspace) {
        posture::of_version(conn, workspace, current.version)?
    } else {
        None
    };
    Ok(posture::is_refused_downgrade(
        policy,
        workspace,
        current_encrypted,
        successor_encrypted,
    ))
}

/// Would rolling back from `current` to `to_version` be refused by the downgrade policy
/// ([`refuses_downgrade`] on the target's recorded posture, read only where the policy
/// covers the workspace)? The override is not counted here.
pub(super) fn rollback_downgrades(
    conn: &Connection,
    policy: &posture::DowngradePolicy,
    workspace: &str,
    current: &VersionRow,
    to_version: i64,
) -> crate::store::sql::Result<bool> {
    if current.is_tombstone() || !policy.applies(workspace) {
        return Ok(false);
    }
    let target = posture::of_version(conn, workspace, to_version)?;
    refuses_downgrade(conn, policy, workspace, current, target)
}

/// A change the guard refuses (`refused` names why) goes through only on an operator
/// override in force, else `refusal()`. Inside the commit (a write transaction) the
/// override is used up and audited as `tf.write_override_used` by `actor` with the
/// change; a look before the commit leaves it in place (the commit decides again).
/// `stored` and `sent` are metadata for the audit row, never content.
pub(super) fn pass_on_override(
    conn: &Connection,
    workspace: &str,
    actor: &str,
    refused: &str,
    stored: serde_json::Value,
    sent: serde_json::Value,
    refusal: impl FnOnce() -> Error,
) -> Result<(), Error> {
    let grant = guard::active_override(conn, workspace, unix_now()).map_err(DbError::from)?;
    let Some(grant) = grant else {
        return Err(refusal());
    };
    if !in_write_transaction(conn) {
        return Ok(());
    }
    guard::delete_override(conn, workspace).map_err(DbError::from)?;
    let entry = audit(
        actor,
        workspace,
        EVENT_OVERRIDE_USED,
        serde_json::json!({
            "refused": refused,
            "granted_by": grant.granted_by,
            "reason": grant.reason,
            "stored": stored,
            "sent": sent,
        }),
    );
    insert_audit(conn, &entry).map_err(DbError::from)?;
    Ok(())
}

/// The 409 of a rollback to a plaintext version over an encrypted current state where
/// the downgrade policy applies: the same refusal as a write's, with the command that
/// lets one through in the message itself (the CLI shows only the message).
pub(super) fn refused_rollback_downgrade(
    workspace: &str,
    current: &VersionRow,
    to_version: i64,
) -> Error {
    let message = rollback_downgrade_message(workspace, current.version, to_version);
    tracing::warn!(
        workspace,
        refused = REFUSED_DOWNGRADE,
        to_version,
        "rollback to a plaintext version over an encrypted state refused"
    );
    downgrade_refusal(
        message,
        current,
        serde_json::json!({ "version": to_version, "encryption": "plaintext" }),
        rollback_downgrade_how(workspace),
    )
}

/// What to do about a rollback the downgrade policy refuses.
fn rollback_downgrade_how(workspace: &str) -> String {
    format!(
        "If decrypting it is intended, an operator can allow one such change for {} minutes: `stategate workspace allow-write {workspace} --reason \"...\"` or POST /api/v1/admin/workspaces/{workspace}/allow-write; then roll back again. Otherwise roll back to an encrypted version.",
        guard::DEFAULT_OVERRIDE_MINUTES
    )
}

/// The refusal's message, shown by the rollback and by its preview alike.
fn rollback_downgrade_message(workspace: &str, current_version: i64, to_version: i64) -> String {
    format!(
        "refused: workspace {workspace:?} holds an OpenTofu-encrypted state (version {current_version}) and version {to_version} is plaintext; nothing was rolled back. tofu.refuse_plaintext_after_encrypted covers this workspace, so a rollback may not store its state in clear any more than a write may. {}",
        rollback_downgrade_how(workspace)
    )
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
                // The rule of `refuses_downgrade`, on the posture the early look read.
                let downgraded = self.downgrade
                    && !row.is_tombstone()
                    && posture::is_downgrade(
                        pending.seen_encrypted,
                        Some(posture::is_encrypted(&sent.encryption)),
                    );
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

/// May a write carrying `lock_id` proceed: the lock holder's (a freeze never breaks a
/// held lock), or without a lock only while nobody holds it and no freeze is in force.
pub(super) fn check_writer(
    conn: &Connection,
    workspace: &str,
    lock_id: Option<&str>,
) -> Result<(), Error> {
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

/// Operator writes (rollback, restore) wait for nobody: refused (423 + holder's
/// LockInfo) while anyone holds the workspace lock, and (423 + the freeze's LockInfo)
/// while it is frozen.
pub(super) fn ensure_unlocked(conn: &Connection, workspace: &str) -> Result<(), Error> {
    check_writer(conn, workspace, None)
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

impl TofuBackend {
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
        let who = actor.to_string();
        let policy = self.downgrade.clone();
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
                if let Some(row) = latest {
                    // Judged as a write of the target's content would be; the target's
                    // posture is read only where the policy covers the workspace.
                    if rollback_downgrades(conn, &policy, &ws, row, to_version)
                        .map_err(DbError::from)?
                    {
                        pass_on_override(
                            conn,
                            &ws,
                            &who,
                            REFUSED_DOWNGRADE,
                            serde_json::json!({ "version": row.version, "serial": row.serial, "lineage": row.lineage }),
                            serde_json::json!({ "rollback_to": to_version }),
                            || refused_rollback_downgrade(&ws, row, to_version),
                        )?;
                    }
                }
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

    /// Why rolling `workspace` back from `latest` to `to_version` would be refused by
    /// the downgrade policy now (the rollback's own message), for its preview; `None`
    /// when it would pass, an allow-write override in force included. Reads only.
    pub async fn rollback_refusal(
        &self,
        workspace: &str,
        latest: &VersionRow,
        to_version: i64,
    ) -> Result<Option<String>, Error> {
        if !self.downgrade.applies(workspace) {
            return Ok(None);
        }
        let (ws, row, policy) = (
            workspace.to_string(),
            latest.clone(),
            self.downgrade.clone(),
        );
        let refused = self
            .db
            .read(move |c| {
                Ok(rollback_downgrades(c, &policy, &ws, &row, to_version)?
                    && guard::active_override(c, &ws, unix_now())?.is_none())
            })
            .await?;
        Ok(refused.then(|| rollback_downgrade_message(workspace, latest.version, to_version)))
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
        let to_version = live.version;
        let request = Rollback {
            scope,
            to_version,
            actor: actor.to_string(),
            org: None,
            event: EVENT_RESTORED,
            // Plans saved before the rollback must not apply to what it restores.
            renumber: Some(crate::tfstate::serial_span_scan),
            summarize: Some(crate::tfstate::resource_scan),
        };
        self.store
            .rollback(request, &key, move |conn, latest| {
                ensure_unlocked(conn, &ws)?;
                // Nothing for the downgrade policy to judge: the current version is a
                // tombstone (a write onto one is not judged either) and what comes back
                // is the state that was current before the delete. Its posture carries
                // over, so the next write is judged against it.
                if in_write_transaction(conn) {
                    let new = latest.map_or(0, |r| r.version) + 1;
                    posture::copy(conn, &ws, to_version, new).map_err(DbError::from)?;
                }
                Ok(())
            })
            .await
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
    pub(super) async fn lock_facts(
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
