//! A new index written from the store: `rebuild` (from the blobs alone) and `restore`
//! (from a backup plus every version committed after it). Both open the installation
//! for this one purpose — no index is there to open, so [`super::Installation::open`]
//! cannot: the root key is read with every keyring generation the store's copies hold
//! (the lost or older index may lack some), proven against the store's record, and the
//! new index goes into a new file, or into the live path only when none is there and
//! the data dir's lock proves no server runs (`super::hold_without_server`).
//!
//! Blocking: each drives the runtime it is given, and must not run inside one (a
//! PostgreSQL target is written through a blocking client).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::config::Config;
use crate::crypto::RootKey;
use crate::store::backup::{self, BackupInfo, RestoreReport};
use crate::store::index;
use crate::store::rebuild::{self, RebuildReport, ScopeKeys};
use crate::store::sql::{Connection, Error as SqlError};
use crate::store::BlobStore;
use crate::tokens;

use super::DataDirLock;

/// The backups in the store, oldest first, and the store as a person reads it
/// (`stategate backup list`): the store alone, so it answers when the index is lost
/// and a backup is to be chosen.
pub async fn backups(config: &Config) -> anyhow::Result<(String, Vec<BackupInfo>)> {
    let blobs = super::open_blob_store(config)?;
    Ok((blobs.describe(), backup::list_backups(&*blobs).await?))
}

/// What a rebuild did, for the command to report.
pub struct Rebuilt {
    pub report: RebuildReport,
    /// Workspace versions whose encryption posture was recomputed from their content.
    pub postures: usize,
    /// The blob store read, and the new index written, as a person reads them.
    pub store: String,
    pub index: String,
    /// How to swap the new index in (or that it is in place already).
    pub next_step: String,
}

/// What a restore did, for the command to report.
pub struct Restored {
    pub backup: BackupInfo,
    /// The data key generation the backup is sealed under, when its header says.
    pub generation: Option<u32>,
    pub report: RestoreReport,
    /// Added versions whose encryption posture was recomputed from their content.
    pub postures: usize,
    /// Revocations recorded after the backup, applied again.
    pub reapplied: tokens::Reapplied,
    /// Role, cap and consumers changes recorded after the backup, applied again.
    pub narrowed: Vec<String>,
    pub store: String,
    pub index: String,
    pub next_step: String,
}

/// The new index from the blob store alone into `into` (`index rebuild --into`):
/// every version the key opens, each one's posture from its content, and the key's
/// fingerprint when it opened what it rebuilt (so `serve` refuses any other).
pub fn rebuild(
    config: &Config,
    into: &Path,
    rt: &tokio::runtime::Runtime,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> anyhow::Result<Rebuilt> {
    let new = super::new_index(config, into)?;
    let into = new.file();
    check_into(config, into, "rebuild")?;
    let blobs = super::open_blob_store(config)?;
    let (dek, keys) = roots_with_ring(config, &*blobs, rt)?;
    rt.block_on(super::check_store_key(config, &dek, &*blobs))?;
    let claimed = claim_into(config, into, "rebuild")?;
    let report = rt.block_on(rebuild::rebuild_index_with_progress(
        &*blobs,
        &keys,
        into,
        crate::schema::ALL,
        progress,
    ))?;
    // What the headers do not say: each workspace version's encryption posture.
    let postures = rt.block_on(crate::tofu::posture::recompute(
        into,
        &*blobs,
        &keys,
        &report.rows,
    ))?;
    // The key opened what it rebuilt (or there was nothing to open).
    let opened = report
        .rows
        .iter()
        .any(|r| r.scope.starts_with(crate::tofu::SCOPE_PREFIX));
    if opened || (report.rows.is_empty() && report.skipped.is_empty()) {
        rt.block_on(super::record_key_in(into, &dek, &*blobs))?;
    }
    new.finish(&crate::schema::INDEX)?;
    Ok(Rebuilt {
        report,
        postures,
        store: blobs.describe(),
        index: new.describe(),
        next_step: new.next_step(&config.db_path(), claimed.is_some()),
    })
}

/// The new index from backup `from` (an id, or `latest`: `store::backup::pick`) plus
/// every version committed after it, into `into` (`restore --into`). In the new
/// index's one transaction: the key's fingerprint, every revocation and every role,
/// cap or consumers change recorded in the store after the backup applied again, and
/// the restore itself audited as `index.restored` by `actor`.
pub fn restore(
    config: &Config,
    from: &str,
    into: &Path,
    actor: &str,
    rt: &tokio::runtime::Runtime,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> anyhow::Result<Restored> {
    let new = super::new_index(config, into)?;
    let into = new.file();
    check_into(config, into, "restore")?;
    if into.exists() {
        bail!(
            "{} already exists; restore only ever writes a new file",
            into.display()
        );
    }
    let blobs = super::open_blob_store(config)?;
    let (dek, keys) = roots_with_ring(config, &*blobs, rt)?;
    let stored_key = rt.block_on(super::check_store_key(config, &dek, &*blobs))?;
    let chosen = rt.block_on(backup::pick(&*blobs, Some(from)))?;
    let generation = rt
        .block_on(crate::store::reseal::blob_generation(&*blobs, &chosen.key))
        .map_err(anyhow::Error::msg)?;
    let claimed = claim_into(config, into, "restore")?;
    let recorded = rt.block_on(Recorded::load(&blobs, &dek))?;
    let mut applied = (tokens::Reapplied::default(), Vec::new());
    let report = rt.block_on(backup::restore(
        &*blobs,
        &dek,
        &keys,
        chosen.clone(),
        into,
        crate::schema::MIGRATIONS,
        crate::schema::ALL,
        progress,
        &mut |c| {
            // The backup opened with this key: the restored index records it.
            crate::store::keyring::set_fingerprint(c, &dek.fingerprint())?;
            applied = recorded.apply(c, &chosen, actor)?;
            Ok(())
        },
    ))?;
    if stored_key.is_none() {
        rt.block_on(crate::store::keyring::store_fingerprint(
            &*blobs,
            &dek.fingerprint(),
        ))?;
    }
    // The versions added after the backup: their encryption posture, from their content.
    let postures = rt.block_on(crate::tofu::posture::recompute(
        into,
        &*blobs,
        &keys,
        &report.added,
    ))?;
    new.finish(&crate::schema::INDEX)?;
    let (reapplied, narrowed) = applied;
    Ok(Restored {
        backup: chosen,
        generation,
        report,
        postures,
        reapplied,
        narrowed,
        store: blobs.describe(),
        index: new.describe(),
        next_step: new.next_step(&config.db_path(), claimed.is_some()),
    })
}

/// What the store recorded so that a restore does not undo it: every revocation, and
/// every role, cap and consumers change (one made after the snapshot is applied again).
struct Recorded {
    revocations: Vec<tokens::Revocation>,
    narrowings: Vec<tokens::Narrowing>,
}

impl Recorded {
    async fn load(blobs: &std::sync::Arc<dyn BlobStore>, dek: &RootKey) -> anyhow::Result<Self> {
        Ok(Recorded {
            revocations: tokens::RevocationLog::new(blobs.clone(), dek.clone())
                .load()
                .await?,
            narrowings: tokens::NarrowingLog::new(blobs.clone(), dek.clone())
                .load()
                .await?,
        })
    }

    /// In the restore's transaction: both applied again, and the restore audited with
    /// what it re-applied.
    fn apply(
        &self,
        c: &Connection,
        chosen: &BackupInfo,
        actor: &str,
    ) -> Result<(tokens::Reapplied, Vec<String>), SqlError> {
        let restored_at = crate::store::now_rfc3339();
        let reapplied = tokens::after_restore(c, &self.revocations, &restored_at)?;
        let narrowed = reapply_narrowings(c, &self.narrowings, chosen.unix_seconds())?;
        let revoked: Vec<_> = reapplied
            .revoked
            .iter()
            .map(|(kind, id)| serde_json::json!({ "kind": kind, "token": id }))
            .collect();
        crate::store::audit::insert_audit(
            c,
            &crate::store::audit::AuditEntry::new(
                actor,
                "index",
                "index.restored",
                serde_json::json!({
                    "backup": chosen.id,
                    "taken_at": chosen.taken_at,
                    "revocations_reapplied": revoked,
                    "sessions_ended": reapplied.sessions_ended,
                    "changes_reapplied": narrowed.len(),
                }),
            ),
        )?;
        Ok((reapplied, narrowed))
    }
}

/// Applies again, in the restore's transaction, each recorded change the snapshot
/// predates (audited by `stategate restore`, through the rule's owner); what was
/// re-applied, for the report.
fn reapply_narrowings(
    conn: &Connection,
    changes: &[tokens::Narrowing],
    taken_unix: i64,
) -> Result<Vec<String>, SqlError> {
    const ACTOR: &str = "stategate restore";
    let failed = |e: String| SqlError::Value(e);
    let mut out = Vec::new();
    for change in changes {
        match change.kind.as_str() {
            tokens::NARROWING_GRANT => {
                let applied = crate::operator::identity::reapply_grant(conn, change, taken_unix, ACTOR)
                    .map_err(|e| failed(e.to_string()))?;
                if let Some(email) = applied {
                    out.push(format!("the role of operator {email} (set {} by {})", change.recorded_at(), change.actor));
                }
            }
            tokens::NARROWING_CONSUMERS => {
                let applied = crate::tofu::credentials::reapply_consumers(conn, change, taken_unix, ACTOR)
                    .map_err(|e| failed(e.to_string()))?;
                if applied {
                    out.push(format!("the consumers of workspace {} (set {} by {})", change.subject, change.recorded_at(), change.actor));
                }
            }
            other => return Err(failed(format!("a recorded change of an unknown kind ({other:?}): this stategate is older than the one that recorded it"))),
        }
    }
    Ok(out)
}

/// The workspace root with every keyring generation, including those only the
/// store's copies hold (a lost or older index), and the scope keys over it.
fn roots_with_ring(
    config: &Config,
    blobs: &dyn BlobStore,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<(RootKey, ScopeKeys)> {
    // The ring is attached once, with the store's copies (`load_root_key` would
    // attach it from the index alone first).
    let dek = super::read_root_key(config, false)?;
    let copies = rt.block_on(crate::store::keyring::copies(blobs))?;
    super::attach_ring(config, &dek, copies)?;
    let keys = crate::schema::scope_keys(dek.clone(), super::load_cluster_key(config)?);
    Ok((dek, keys))
}

/// Whether `--into` names the live index (also via another spelling of its directory).
fn is_live(config: &Config, into: &Path) -> bool {
    let live = config.db_path();
    into == live
        || matches!(
            (into.parent().map(std::fs::canonicalize), live.parent().map(std::fs::canonicalize)),
            (Some(Ok(a)), Some(Ok(b))) if a == b && into.file_name() == live.file_name()
        )
}

/// `--into` names a new file. The live index's path is allowed only when it is gone
/// (a lost disk) and no server holds the data dir. This is the check without side
/// effects, run before any work; [`claim_into`] takes the lock before writing.
fn check_into(config: &Config, into: &Path, what: &str) -> anyhow::Result<()> {
    if !is_live(config, into) {
        return Ok(());
    }
    if let Some(file) = leftover_index(into) {
        bail!(
            "--into {} is the live index and {} exists; {what} into a new file and swap it in",
            into.display(),
            file.display()
        );
    }
    Ok(())
}

/// What of an index is still at `db`: the database file, or a write-ahead log with
/// frames in it. A clean stop empties the log (`super::checkpoint_at_stop`), and an
/// empty log and its shared memory belong to no database: [`claim_into`] removes them.
fn leftover_index(db: &Path) -> Option<PathBuf> {
    let [db, wal, _] = index::files(db);
    if db.exists() {
        return Some(db);
    }
    std::fs::metadata(&wal)
        .is_ok_and(|m| m.len() > 0)
        .then_some(wal)
}

/// For the live index's path: the data dir's lock, proving no server runs there and
/// keeping one from starting until the new file is complete (`None` for a new file
/// elsewhere).
fn claim_into(config: &Config, into: &Path, what: &str) -> anyhow::Result<Option<DataDirLock>> {
    if !is_live(config, into) {
        return Ok(None);
    }
    let Some(lock) = super::hold_without_server(config)? else {
        bail!(
            "--into {} is the live index and a stategate server is running on {}; {what} into a new file and swap it in",
            into.display(),
            config.data_dir.display()
        );
    };
    // Again under the lock: a server that ran meanwhile may have created the index.
    check_into(config, into, what)?;
    // An empty log left by a clean stop, and its shared memory: a new index must not
    // meet them.
    for file in index::files(into).iter().skip(1) {
        match std::fs::remove_file(file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot remove {}", file.display()))
            }
            _ => {}
        }
    }
    Ok(Some(lock))
}
