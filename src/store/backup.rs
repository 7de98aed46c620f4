//! Backups of the index into the blob store, and restoring from them.
//!
//! Blobs carry every state version, but not what only the index knows: orgs, users,
//! tokens, clusters, leases, locks, tombstones and the audit log. A backup is a
//! consistent online snapshot of the whole database as a SQLite file (`VACUUM INTO` on
//! its own connection: a read transaction in WAL mode, never a file copy of a live WAL
//! database; a PostgreSQL index is copied into one in a single repeatable-read
//! snapshot, [`snapshot_by_copy`]), sealed like a blob under a key derived from the
//! DEK for the scope `backup/<id>` (the header naming that scope is the AEAD's
//! associated data, so a snapshot renamed to another id, tampered with, or from
//! another installation does not open), and put under `backups/<id>.sgdb`.
//!
//! A restore writes a NEW database file from a snapshot and then adds every version
//! committed after it, found in the blobs with the index rebuild's own claim
//! collection and verification (`rebuild::collect_claims` / `resolve_claims`), so
//! nothing acknowledged after the snapshot is missing. The caller's `finish` then
//! brings what other modules recorded in the store up to date in the same transaction
//! (the server passes `tokens::after_restore`: revocations made after the snapshot).
//! Everything is checked before the file appears; the live index is never touched.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use crate::store::sql::Connection;
use bytes::Bytes;
use serde::Serialize;
use time::OffsetDateTime;

use super::format::{self, BlobHeader, FormatError};
use super::rebuild::{self, Claim, ScopeKeys, Skipped};
use super::{insert_version, BlobError, BlobStore, VersionRow};
use crate::crypto::{RootKey, SealError};

/// Where backups live in the store (never listed by the index rebuild or the sweep).
pub const BACKUPS_PREFIX: &str = "backups/";
const SUFFIX: &str = ".sgdb";
/// The version every backup blob claims in its header (a backup is never rewritten).
const BACKUP_VERSION: i64 = 1;
const SQLITE_MAGIC: &[u8] = b"SQLite format 3\0";

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("cannot snapshot the database: {0}")]
    Snapshot(crate::store::sql::Error),
    #[error("{0}")]
    Io(String),
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error("cannot seal the snapshot: {0}")]
    Seal(#[from] SealError),
    #[error("no backup in the store (under {BACKUPS_PREFIX})")]
    NoBackups,
    #[error("{0:?} is not a backup id (expected YYYYMMDDTHHMMSSZ-<32 hex>, see `stategate backup list`)")]
    BadId(String),
    #[error("backup {0} does not exist in the store")]
    NotFound(String),
    #[error("backup {id} cannot be opened (wrong DEK, tampered with, or from another installation); nothing was written: {reason}")]
    Unreadable { id: String, reason: FormatError },
    #[error(
        "backup {id} opens but is not a usable stategate database; nothing was written: {reason}"
    )]
    NotADatabase { id: String, reason: String },
    #[error("{0} already exists; restore only ever writes a new file")]
    Exists(PathBuf),
    #[error("cannot write the restored database: {0}")]
    Write(crate::store::sql::Error),
}

/// One backup in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackupInfo {
    pub id: String,
    pub key: String,
    /// When the snapshot was taken (from its id).
    pub taken_at: String,
}

impl BackupInfo {
    fn from_id(id: String) -> Option<Self> {
        let taken = taken_at(&id)?;
        Some(BackupInfo {
            key: format!("{BACKUPS_PREFIX}{id}{SUFFIX}"),
            taken_at: taken
                .format(&time::format_description::well_known::Rfc3339)
                .ok()?,
            id,
        })
    }

    /// Seconds since the epoch at which the snapshot was taken.
    pub fn unix_seconds(&self) -> i64 {
        taken_at(&self.id).map_or(0, OffsetDateTime::unix_timestamp)
    }
}

const ID_TIME: &[time::format_description::FormatItem<'static>] =
    time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");

/// `20260301T101500Z-<uuid v7>`: sorts by time as text, unique per snapshot.
pub fn new_id(now: OffsetDateTime) -> String {
    let stamp = now.format(ID_TIME).expect("UTC time formats");
    format!("{stamp}-{}", uuid::Uuid::now_v7().simple())
}

fn taken_at(id: &str) -> Option<OffsetDateTime> {
    let (stamp, uuid) = id.split_once('-')?;
    let hex_ok = uuid.len() == 32 && uuid.bytes().all(|b| b.is_ascii_hexdigit());
    let at = time::PrimitiveDateTime::parse(stamp, ID_TIME).ok()?;
    hex_ok.then(|| at.assume_utc())
}

/// Accepts an id or its full key (`backups/<id>.sgdb`), as `backup list` prints both.
pub fn parse_id(text: &str) -> Result<String, BackupError> {
    let id = text.strip_prefix(BACKUPS_PREFIX).unwrap_or(text);
    let id = id.strip_suffix(SUFFIX).unwrap_or(id);
    match taken_at(id) {
        Some(_) => Ok(id.to_string()),
        None => Err(BackupError::BadId(text.to_string())),
    }
}

fn scope_of(id: &str) -> String {
    format!("backup/{id}")
}

/// Seals a database snapshot as the backup `id`.
pub fn seal(root: &RootKey, id: &str, snapshot: &[u8], now: &str) -> Result<Vec<u8>, SealError> {
    let scope = scope_of(id);
    let header = BlobHeader {
        scope: scope.clone(),
        version: BACKUP_VERSION,
        serial: None,
        lineage: None,
        sha256: hex::encode(format::sha2_digest(snapshot)),
        size: snapshot.len() as i64,
        created_at: now.to_string(),
        actor: "stategate backup".into(),
        parent: None,
        facts: Default::default(),
        // What `encode` seals under decides the generation named in the blob.
        key_gen: 0,
    };
    format::encode(&root.blob_key(&scope), &header, snapshot)
}

/// Opens the sealed backup `id`: the key, the header's scope and the content hash must all match.
pub fn open(root: &RootKey, id: &str, sealed: &[u8]) -> Result<Vec<u8>, FormatError> {
    let scope = scope_of(id);
    let header = format::read_header(sealed)?;
    format::decode(
        &root.blob_key(&scope),
        sealed,
        &scope,
        BACKUP_VERSION,
        Some(&header.sha256),
    )
}

/// Removes a scratch file however the function holding it ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn scratch_path(dir: &Path, what: &str) -> PathBuf {
    dir.join(format!(".{what}-{}.tmp", uuid::Uuid::new_v4().simple()))
}

/// A consistent copy of the live database at `db_path`, taken online with
/// `VACUUM INTO` on a connection of its own (writers keep going). Blocking.
pub fn snapshot(db_path: &Path, scratch_dir: &Path) -> Result<Vec<u8>, BackupError> {
    let scratch = Scratch(scratch_path(scratch_dir, "backup"));
    let conn = Connection::open_with_flags(db_path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(BackupError::Snapshot)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(BackupError::Snapshot)?;
    conn.execute(
        "VACUUM INTO ?1",
        [scratch
            .0
            .to_str()
            .ok_or_else(|| BackupError::Io(format!("{} is not UTF-8", scratch.0.display())))?],
    )
    .map_err(BackupError::Snapshot)?;
    drop(conn);
    std::fs::read(&scratch.0).map_err(|e| BackupError::Io(format!("cannot read the snapshot: {e}")))
}

/// A consistent copy of an index on a database server (`from`), as a SQLite database
/// file's bytes, the same form as [`snapshot`]'s: `copy` copies every table from
/// `from` into a new file in `scratch_dir` (and verifies it), all read in one
/// snapshot of `from` (a repeatable-read transaction: writers keep going). Blocking.
pub fn snapshot_by_copy(
    from: &Connection,
    scratch_dir: &Path,
    copy: impl FnOnce(&Connection, &Connection) -> Result<(), String>,
) -> Result<Vec<u8>, BackupError> {
    let scratch = Scratch(scratch_path(scratch_dir, "backup"));
    let into = Connection::open(&scratch.0).map_err(BackupError::Snapshot)?;
    super::db::restrict_to_owner(&scratch.0);
    from.begin_read().map_err(BackupError::Snapshot)?;
    let copied = copy(from, &into);
    let _ = from.end_transaction(false);
    copied.map_err(|e| BackupError::Io(format!("cannot copy the index: {e}")))?;
    into.close().map_err(BackupError::Snapshot)?;
    std::fs::read(&scratch.0).map_err(|e| BackupError::Io(format!("cannot read the snapshot: {e}")))
}

/// Takes a snapshot of the SQLite index at `db_path` now and puts it, sealed, into
/// the store.
pub async fn take_backup(
    db_path: &Path,
    scratch_dir: &Path,
    blobs: &dyn BlobStore,
    root: &RootKey,
) -> Result<BackupInfo, BackupError> {
    let (db_path, scratch_dir) = (db_path.to_path_buf(), scratch_dir.to_path_buf());
    take_backup_from(move || snapshot(&db_path, &scratch_dir), blobs, root).await
}

/// Takes a snapshot now (`snapshot`: [`snapshot`] of a SQLite file, or
/// [`snapshot_by_copy`] of a server's index) and puts it, sealed, into the store.
pub async fn take_backup_from(
    snapshot: impl FnOnce() -> Result<Vec<u8>, BackupError> + Send + 'static,
    blobs: &dyn BlobStore,
    root: &RootKey,
) -> Result<BackupInfo, BackupError> {
    let now = crate::clock::now_utc();
    let id = new_id(now);
    let db = tokio::task::spawn_blocking(snapshot)
        .await
        .map_err(|e| BackupError::Io(format!("snapshot task failed: {e}")))??;
    let sealed = seal(root, &id, &db, &super::now_rfc3339())?;
    let info = BackupInfo::from_id(id).expect("new ids parse");
    blobs.put(&info.key, Bytes::from(sealed)).await?;
    Ok(info)
}

/// Every backup in the store, oldest first. Keys that are not backups are ignored.
pub async fn list_backups(blobs: &dyn BlobStore) -> Result<Vec<BackupInfo>, BlobError> {
    let mut found: Vec<BackupInfo> = blobs
        .list(BACKUPS_PREFIX)
        .await?
        .iter()
        .filter_map(|key| {
            let id = key.strip_prefix(BACKUPS_PREFIX)?.strip_suffix(SUFFIX)?;
            BackupInfo::from_id(id.to_string())
        })
        .collect();
    found.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(found)
}

/// Deletes all but the newest `keep` backups (at least one is always kept); returns
/// the ones deleted. A failed delete is retried by the next call.
pub async fn keep_newest(blobs: &dyn BlobStore, keep: usize) -> Result<Vec<BackupInfo>, BlobError> {
    let all = list_backups(blobs).await?;
    let surplus = all.len().saturating_sub(keep.max(1));
    let mut deleted = Vec::new();
    for old in all.into_iter().take(surplus) {
        blobs.delete(&old.key).await?;
        deleted.push(old);
    }
    Ok(deleted)
}

/// (scope, version).
pub type ScopeVersion = (String, i64);

/// What a restore did.
#[derive(Debug, Default)]
pub struct RestoreReport {
    pub backup: Option<BackupInfo>,
    /// Versions committed after the snapshot, added from the blobs.
    pub added: Vec<VersionRow>,
    /// Rows of the snapshot whose blob is gone (pruned after the snapshot): dropped.
    pub dropped: Vec<ScopeVersion>,
    /// Rows of the snapshot whose blob was resealed after it (`stategate key reseal`:
    /// same scope, version and content under a new blob key): pointed at the new blob.
    pub resealed: Vec<ScopeVersion>,
    /// Blobs that could not be verified (as in `index rebuild`).
    pub skipped: Vec<Skipped>,
    /// Valid blobs that lost a (scope, version) conflict.
    pub superseded: Vec<Claim>,
}

/// Which backup to restore: a given id, or the newest.
pub async fn pick(blobs: &dyn BlobStore, from: Option<&str>) -> Result<BackupInfo, BackupError> {
    match from {
        None | Some("latest") => list_backups(blobs)
            .await?
            .pop()
            .ok_or(BackupError::NoBackups),
        Some(text) => {
            let id = parse_id(text)?;
            Ok(BackupInfo::from_id(id).expect("parsed ids are valid"))
        }
    }
}

/// What a restore runs last, in its transaction, on the restored database (after the
/// schemas and the versions): e.g. re-applying what the blob store recorded since.
pub type Finish<'a> =
    &'a mut (dyn FnMut(&Connection) -> Result<(), crate::store::sql::Error> + Send);

/// A change an earlier release's database needs before the schemas apply
/// (`crate::schema::MIGRATIONS`).
pub type Migration = fn(&Connection) -> Result<(), crate::store::sql::Error>;

/// Restores `backup` (sealed under `dek`) into the new file `into` and adds every
/// version committed after it, opened with `keys`, then runs `finish`; a snapshot of
/// an earlier release is brought up to date with `migrations` and `schemas` first, and
/// every version it kept without a resource timeline (an earlier release recorded
/// none) or added after it gets one recomputed from its content, as the index rebuild
/// does. `progress(done, total)` is called as blobs are verified. Nothing is created
/// unless every check passed.
#[allow(clippy::too_many_arguments)]
pub async fn restore(
    blobs: &dyn BlobStore,
    dek: &RootKey,
    keys: &ScopeKeys,
    backup: BackupInfo,
    into: &Path,
    migrations: &[Migration],
    schemas: &[&str],
    progress: &(dyn Fn(usize, usize) + Sync),
    finish: Finish<'_>,
) -> Result<RestoreReport, BackupError> {
    if into.exists() {
        return Err(BackupError::Exists(into.to_path_buf()));
    }
    let sealed = blobs
        .get(&backup.key)
        .await?
        .ok_or_else(|| BackupError::NotFound(backup.id.clone()))?;
    let db = open(dek, &backup.id, &sealed).map_err(|reason| BackupError::Unreadable {
        id: backup.id.clone(),
        reason,
    })?;
    if !db.starts_with(SQLITE_MAGIC) {
        return Err(BackupError::NotADatabase {
            id: backup.id.clone(),
            reason: "not an SQLite file".into(),
        });
    }
    let (claims, skipped) = rebuild::collect_claims_with_progress(blobs, keys, progress).await?;
    let present: HashSet<String> = claims
        .iter()
        .map(|c| c.key.clone())
        .chain(skipped.iter().map(|s| s.key.clone()))
        .collect();
    let resolved = rebuild::resolve_claims(claims);
    let candidates: Vec<VersionRow> = resolved.winners.into_iter().map(rebuild::row_of).collect();
    let dir = match into.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let scratch = Scratch(scratch_path(&dir, "restore"));
    // Owner-only from its first byte: the index holds token hashes, emails and the audit log.
    crate::crypto::write_secret_file(&scratch.0, &db)
        .map_err(|e| BackupError::Io(format!("cannot write {}: {e}", scratch.0.display())))?;
    let (added, dropped, resealed) = complete(
        &scratch.0,
        migrations,
        schemas,
        &candidates,
        &present,
        finish,
    )
    .map_err(|e| match e {
        Completion::Unusable(reason) => BackupError::NotADatabase {
            id: backup.id.clone(),
            reason,
        },
        Completion::Write(e) => BackupError::Write(e),
    })?;
    complete_timeline(&scratch.0, blobs, keys).await?;
    // A hard link never replaces an existing file: the new name appears complete or not at all.
    std::fs::hard_link(&scratch.0, into).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            BackupError::Exists(into.to_path_buf())
        } else {
            BackupError::Io(format!("cannot create {}: {e}", into.display()))
        }
    })?;
    Ok(RestoreReport {
        backup: Some(backup),
        added,
        dropped,
        resealed,
        skipped,
        superseded: resolved.superseded,
    })
}

enum Completion {
    Unusable(String),
    Write(crate::store::sql::Error),
}

/// Brings the snapshot at `path` up to date: checks it, applies `schemas` (an older
/// snapshot gains newer tables and the audit triggers), makes it a self-contained
/// rollback-journal file, points rows whose blob was resealed since at the verified
/// blob holding the same version and content, drops rows whose blob is gone and adds
/// the versions newer than the snapshot's newest of each scope, then runs `finish`.
/// Returns (added, dropped, resealed).
#[allow(clippy::type_complexity)]
fn complete(
    path: &Path,
    migrations: &[Migration],
    schemas: &[&str],
    candidates: &[VersionRow],
    present: &HashSet<String>,
    finish: Finish<'_>,
) -> Result<(Vec<VersionRow>, Vec<ScopeVersion>, Vec<ScopeVersion>), Completion> {
    let unusable = |e: crate::store::sql::Error| Completion::Unusable(e.to_string());
    let conn = Connection::open(path).map_err(unusable)?;
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(unusable)?;
    if check != "ok" {
        return Err(Completion::Unusable(format!("integrity check: {check}")));
    }
    let existing = snapshot_rows(&conn).map_err(unusable)?;
    let write = Completion::Write;
    conn.pragma_update(None, "journal_mode", "DELETE")
        .map_err(write)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(write)?;
    let tx = conn.transaction().map_err(write)?;
    for migration in migrations {
        migration(&tx).map_err(write)?;
    }
    for schema in schemas {
        tx.execute_batch(schema).map_err(write)?;
    }
    let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
    let mut dropped = Vec::new();
    let mut resealed = Vec::new();
    let verified: BTreeMap<(&str, i64), &VersionRow> = candidates
        .iter()
        .map(|r| ((r.scope.as_str(), r.version), r))
        .collect();
    for (scope, version, blob_key, sha256) in &existing {
        let v = newest.entry(scope.as_str()).or_insert(*version);
        *v = (*v).max(*version);
        if blob_key.as_ref().is_none_or(|k| present.contains(k)) {
            continue;
        }
        let same = verified
            .get(&(scope.as_str(), *version))
            .filter(|r| r.sha256.is_some() && r.sha256 == *sha256);
        if let Some(row) = same {
            tx.execute(
                "UPDATE versions SET blob_key = ?3, key_gen = ?4 WHERE scope = ?1 AND version = ?2",
                crate::store::sql::params![scope, version, row.blob_key, row.key_generation],
            )
            .map_err(write)?;
            resealed.push((scope.clone(), *version));
        } else {
            tx.execute(
                "DELETE FROM versions WHERE scope = ?1 AND version = ?2",
                crate::store::sql::params![scope, version],
            )
            .map_err(write)?;
            dropped.push((scope.clone(), *version));
        }
    }
    let mut added = Vec::new();
    for row in candidates {
        if newest
            .get(row.scope.as_str())
            .is_some_and(|&v| row.version <= v)
        {
            continue;
        }
        insert_version(&tx, row).map_err(write)?;
        added.push(row.clone());
    }
    finish(&tx).map_err(write)?;
    tx.commit().map_err(write)?;
    conn.close().map_err(write)?;
    Ok((added, dropped, resealed))
}

/// Gives every version of the restored database at `path` that has no resource
/// timeline (a snapshot of an earlier release, which recorded none, and the versions
/// added after the snapshot) the one recomputed from the blobs, keeps what the
/// snapshot recorded (it was computed against versions that may since have been
/// pruned), and makes each scope's newest summary the one the next write compares
/// with. One durable transaction.
async fn complete_timeline(
    path: &Path,
    blobs: &dyn BlobStore,
    keys: &ScopeKeys,
) -> Result<(), BackupError> {
    let mut rows = {
        let conn = Connection::open(path).map_err(BackupError::Write)?;
        let mut stmt = conn
            .prepare(&format!(
                "SELECT {} FROM versions ORDER BY scope, version",
                super::VERSION_COLUMNS
            ))
            .map_err(BackupError::Write)?;
        let rows = stmt
            .query_map([], super::row_to_version)
            .and_then(|r| r.collect::<Result<Vec<_>, _>>())
            .map_err(BackupError::Write)?;
        rows
    };
    let recorded: HashSet<(String, i64)> = rows
        .iter()
        .filter(|r| r.changes.is_some())
        .map(|r| (r.scope.clone(), r.version))
        .collect();
    let timeline = rebuild::recompute_timeline(blobs, keys, &mut rows)
        .await
        .map_err(|e| match e {
            rebuild::RebuildError::Blob(e) => BackupError::Blob(e),
            rebuild::RebuildError::Sql(e) => BackupError::Write(e),
            other => BackupError::Io(other.to_string()),
        })?;
    let mut conn = Connection::open(path).map_err(BackupError::Write)?;
    let write = |conn: &mut Connection| -> Result<(), crate::store::sql::Error> {
        conn.pragma_update(None, "synchronous", "FULL")?;
        let tx = conn.transaction()?;
        for (scope, version, changes) in &timeline.changes {
            if recorded.contains(&(scope.clone(), *version)) {
                continue;
            }
            super::timeline::record_changes(&tx, scope, *version, changes)?;
            let counts = super::timeline::counts(changes);
            tx.execute(
                "UPDATE versions SET res_added = ?3, res_changed = ?4, res_removed = ?5
                  WHERE scope = ?1 AND version = ?2",
                crate::store::sql::params![
                    scope,
                    version,
                    counts.added,
                    counts.changed,
                    counts.removed
                ],
            )?;
        }
        super::timeline::forget_all(&tx)?;
        for (scope, version, summary) in &timeline.newest {
            super::timeline::keep_summary(&tx, scope, *version, summary)?;
        }
        tx.commit()
    };
    write(&mut conn).map_err(BackupError::Write)?;
    conn.close().map_err(BackupError::Write)
}

/// (scope, version, blob_key, sha256) of every row of the snapshot.
#[allow(clippy::type_complexity)]
fn snapshot_rows(
    conn: &Connection,
) -> Result<Vec<(String, i64, Option<String>, Option<String>)>, crate::store::sql::Error> {
    let mut stmt = conn.prepare("SELECT scope, version, blob_key, sha256 FROM versions")?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect();
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_garbage_is_refused() {
        let now = time::macros::datetime!(2026-03-01 10:15:00 UTC);
        let id = new_id(now);
        assert!(id.starts_with("20260301T101500Z-"), "{id}");
        let info = BackupInfo::from_id(id.clone()).unwrap();
        assert_eq!(info.taken_at, "2026-03-01T10:15:00Z");
        assert_eq!(info.unix_seconds(), now.unix_timestamp());
        assert_eq!(parse_id(&id).unwrap(), id);
        assert_eq!(parse_id(&info.key).unwrap(), id);
        for bad in [
            "",
            "latest-ish",
            "20260301T101500Z",
            "20260301T101500Z-xyz",
            "20261301T101500Z-0123456789abcdef0123456789abcdef",
            "../20260301T101500Z-0123456789abcdef0123456789abcdef",
        ] {
            assert!(parse_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sealed_snapshots_open_only_as_themselves_under_the_same_dek() {
        let root = RootKey::from_bytes([7; 32]);
        let id = new_id(OffsetDateTime::now_utc());
        let other_id = new_id(OffsetDateTime::now_utc());
        let body = b"SQLite format 3\0 pretend";
        let sealed = seal(&root, &id, body, "2026-03-01T10:15:00Z").unwrap();
        assert_eq!(open(&root, &id, &sealed).unwrap(), body);
        // (case, key, id, blob)
        let mut flipped = sealed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        let wrong_dek = RootKey::from_bytes([8; 32]);
        let cases: Vec<(&str, &RootKey, &str, &[u8])> = vec![
            ("wrong DEK", &wrong_dek, &id, &sealed),
            ("renamed to another id", &root, &other_id, &sealed),
            ("one bit flipped", &root, &id, &flipped),
            ("truncated", &root, &id, &sealed[..sealed.len() / 2]),
            ("not a blob", &root, &id, b"SQLite format 3\0"),
        ];
        for (case, key, id, blob) in cases {
            assert!(open(key, id, blob).is_err(), "{case}");
        }
    }
}
