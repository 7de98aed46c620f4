//! Storage engine: immutable encrypted blobs plus a SQLite version index.
//!
//! Writing a version is: seal the content, put it under a fresh key, then commit
//! the version row in one transaction that re-runs the caller's guard (lock
//! holder, conflict rules). That commit is the single point of truth; a blob
//! without a row is garbage. Reading the current version never turns an
//! unreadable blob into "no state": it is an error.

pub mod audit;
pub mod backup;
pub mod blob;
pub mod db;
pub mod format;
pub mod history;
pub mod metered;
pub mod rebuild;
pub mod retention;
pub mod s3;

use std::sync::Arc;

use bytes::Bytes;
use rusqlite::{params, Connection, OptionalExtension};

use audit::{insert_audit, AuditEntry};
pub use blob::{BlobError, BlobStore, LocalStore};
pub use db::{Db, DbError};

use crate::crypto::SealKey;
use format::{BlobHeader, FormatError};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error("version {version} of {scope} is in the index but its blob is missing")]
    BlobMissing { scope: String, version: i64 },
    #[error("version {version} of {scope} cannot be read: {reason}")]
    BlobUnreadable {
        scope: String,
        version: i64,
        reason: FormatError,
    },
    #[error("could not allocate a version number after several concurrent writes; retry")]
    Contended,
    #[error("cannot seal blob: {0}")]
    Seal(#[from] crate::crypto::SealError),
    #[error("{scope} has no version {version}")]
    VersionNotFound { scope: String, version: i64 },
    #[error("version {version} of {scope} is a tombstone (the state was deleted); pick a version with content")]
    Tombstone { scope: String, version: i64 },
    #[error("{scope} changed while the request ran (now at version {found}); nothing was written, retry")]
    Moved { scope: String, found: i64 },
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Db(DbError::Sqlite(e))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionRow {
    pub scope: String,
    pub version: i64,
    pub serial: Option<i64>,
    pub lineage: Option<String>,
    pub sha256: Option<String>,
    pub size: i64,
    /// `None` for a tombstone.
    pub blob_key: Option<String>,
    pub created_at: String,
    pub actor: String,
}

impl VersionRow {
    pub fn is_tombstone(&self) -> bool {
        self.blob_key.is_none()
    }
}

pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .expect("current time formats")
}

const VERSION_COLUMNS: &str =
    "scope, version, serial, lineage, sha256, size, blob_key, created_at, actor";

fn row_to_version(row: &rusqlite::Row<'_>) -> Result<VersionRow, rusqlite::Error> {
    Ok(VersionRow {
        scope: row.get(0)?,
        version: row.get(1)?,
        serial: row.get(2)?,
        lineage: row.get(3)?,
        sha256: row.get(4)?,
        size: row.get(5)?,
        blob_key: row.get(6)?,
        created_at: row.get(7)?,
        actor: row.get(8)?,
    })
}

/// The newest row of a scope (tombstones included). Usable inside a write transaction.
pub fn latest_row(conn: &Connection, scope: &str) -> Result<Option<VersionRow>, rusqlite::Error> {
    conn.query_row(
        &format!(
            "SELECT {VERSION_COLUMNS} FROM versions WHERE scope = ?1 ORDER BY version DESC LIMIT 1"
        ),
        [scope],
        row_to_version,
    )
    .optional()
}

/// What a state write carries besides the bytes.
pub struct NewVersion {
    pub scope: String,
    pub plaintext: Bytes,
    pub serial: Option<i64>,
    pub lineage: Option<String>,
    pub actor: String,
    /// Written in the same transaction when the version is stored.
    pub audit: Option<AuditEntry>,
}

#[derive(Debug)]
pub enum WriteOutcome {
    Stored(VersionRow),
    /// The newest version already has exactly this content (a client retry).
    Unchanged(VersionRow),
}

/// Runs on the newest row before anything is written and again inside the commit
/// transaction. Returning `Err` rejects the write and changes nothing.
pub trait WriteGuard<E>:
    Fn(&Connection, Option<&VersionRow>) -> Result<(), E> + Send + Sync + 'static
{
}
impl<E, F> WriteGuard<E> for F where
    F: Fn(&Connection, Option<&VersionRow>) -> Result<(), E> + Send + Sync + 'static
{
}

#[derive(Clone)]
pub struct StateStore {
    pub db: Db,
    blobs: Arc<dyn BlobStore>,
    /// Writers of one scope take turns in this process, so they never race for a
    /// version number (the commit still re-checks); writers of other scopes never wait.
    write_turns: Arc<crate::turns::KeyedTurns<String>>,
}

/// How often a version-number race is retried before giving up (only unlocked writers race).
const WRITE_ATTEMPTS: usize = 5;

impl StateStore {
    pub fn new(db: Db, blobs: Arc<dyn BlobStore>) -> Self {
        StateStore {
            db,
            blobs,
            write_turns: Arc::new(crate::turns::KeyedTurns::new()),
        }
    }

    pub fn blobs(&self) -> &Arc<dyn BlobStore> {
        &self.blobs
    }

    pub async fn latest(&self, scope: &str) -> Result<Option<VersionRow>, StoreError> {
        let scope = scope.to_string();
        Ok(self.db.read(move |c| latest_row(c, &scope)).await?)
    }

    /// The current state: `None` only when no version exists or the newest is a tombstone.
    pub async fn read_current(
        &self,
        scope: &str,
        key: &SealKey,
    ) -> Result<Option<(VersionRow, Vec<u8>)>, StoreError> {
        match self.latest(scope).await? {
            None => Ok(None),
            Some(row) if row.is_tombstone() => Ok(None),
            Some(row) => {
                let plaintext = self.read_version_blob(&row, key).await?;
                Ok(Some((row, plaintext)))
            }
        }
    }

    async fn read_version_blob(
        &self,
        row: &VersionRow,
        key: &SealKey,
    ) -> Result<Vec<u8>, StoreError> {
        let blob_key = row.blob_key.as_deref().expect("not a tombstone");
        let blob = self
            .blobs
            .get(blob_key)
            .await?
            .ok_or_else(|| StoreError::BlobMissing {
                scope: row.scope.clone(),
                version: row.version,
            })?;
        format::decode(key, &blob, &row.scope, row.version, row.sha256.as_deref()).map_err(
            |reason| StoreError::BlobUnreadable {
                scope: row.scope.clone(),
                version: row.version,
                reason,
            },
        )
    }

    /// Stores a new version unless `guard` rejects it or the content is unchanged.
    pub async fn write_version<E>(
        &self,
        new: NewVersion,
        key: &SealKey,
        guard: impl WriteGuard<E>,
    ) -> Result<WriteOutcome, E>
    where
        E: From<StoreError> + From<DbError> + Send + 'static,
    {
        let _turn = self.write_turns.wait(new.scope.clone()).await;
        let guard = Arc::new(guard);
        let sha256 = hex::encode(format::sha2_digest(&new.plaintext));
        for _ in 0..WRITE_ATTEMPTS {
            // The newest row and the guard's early verdict, in one read.
            let (latest, verdict) = {
                let guard = guard.clone();
                let scope = new.scope.clone();
                self.db
                    .read(move |c| {
                        let latest = latest_row(c, &scope)?;
                        let verdict = guard(c, latest.as_ref());
                        Ok((latest, verdict))
                    })
                    .await
                    .map_err(E::from)?
            };
            verdict?;
            if let Some(row) = latest.as_ref().filter(|r| !r.is_tombstone()) {
                if row.sha256.as_deref() == Some(sha256.as_str()) {
                    return Ok(WriteOutcome::Unchanged(row.clone()));
                }
            }
            let version = latest.as_ref().map_or(1, |r| r.version + 1);
            let parent = latest.as_ref().and_then(|r| r.blob_key.clone());
            let row = VersionRow {
                scope: new.scope.clone(),
                version,
                serial: new.serial,
                lineage: new.lineage.clone(),
                sha256: Some(sha256.clone()),
                size: new.plaintext.len() as i64,
                blob_key: Some(blob_key_for(&new.scope, version)),
                created_at: now_rfc3339(),
                actor: new.actor.clone(),
            };
            let blob = format::encode(key, &header_for(&row, parent), &new.plaintext)
                .map_err(|e| E::from(StoreError::from(e)))?;
            let blob_key = row.blob_key.clone().expect("new row has a blob");
            self.blobs
                .put(&blob_key, Bytes::from(blob))
                .await
                .map_err(|e| E::from(StoreError::from(e)))?;

            let guard = guard.clone();
            let audit = new.audit.clone();
            let committed = self
                .db
                .write(move |c| -> Result<Option<VersionRow>, E> {
                    let current =
                        latest_row(c, &row.scope).map_err(|e| E::from(DbError::from(e)))?;
                    guard(c, current.as_ref())?;
                    if current.as_ref().map_or(0, |r| r.version) != row.version - 1 {
                        return Ok(None); // another writer took this number: try again
                    }
                    insert_version(c, &row).map_err(|e| E::from(DbError::from(e)))?;
                    if let Some(entry) = &audit {
                        insert_audit(c, entry).map_err(|e| E::from(DbError::from(e)))?;
                    }
                    Ok(Some(row))
                })
                .await;
            match committed {
                Ok(Some(row)) => return Ok(WriteOutcome::Stored(row)),
                Ok(None) => self.discard_blob(&blob_key).await,
                Err(e) => {
                    self.discard_blob(&blob_key).await;
                    return Err(e);
                }
            }
        }
        Err(E::from(StoreError::Contended))
    }

    /// Marks the state deleted with a tombstone row; history stays for rollback.
    pub async fn write_tombstone<E>(
        &self,
        scope: &str,
        actor: &str,
        audit: Option<AuditEntry>,
        guard: impl WriteGuard<E>,
    ) -> Result<Option<VersionRow>, E>
    where
        E: From<StoreError> + From<DbError> + Send + 'static,
    {
        let scope = scope.to_string();
        let actor = actor.to_string();
        self.db
            .write(move |c| -> Result<Option<VersionRow>, E> {
                let current = latest_row(c, &scope).map_err(|e| E::from(DbError::from(e)))?;
                guard(c, current.as_ref())?;
                let Some(current) = current.filter(|r| !r.is_tombstone()) else {
                    return Ok(None);
                };
                let row = VersionRow {
                    scope: scope.clone(),
                    version: current.version + 1,
                    serial: None,
                    lineage: None,
                    sha256: None,
                    size: 0,
                    blob_key: None,
                    created_at: now_rfc3339(),
                    actor,
                };
                insert_version(c, &row).map_err(|e| E::from(DbError::from(e)))?;
                if let Some(entry) = &audit {
                    insert_audit(c, entry).map_err(|e| E::from(DbError::from(e)))?;
                }
                Ok(Some(row))
            })
            .await
    }

    /// Best effort: an orphan blob is harmless garbage (no row points at it).
    async fn discard_blob(&self, key: &str) {
        if let Err(e) = self.blobs.delete(key).await {
            tracing::warn!(blob = key, error = %e, "could not delete orphan blob; it will be swept later");
        }
    }
}

fn insert_version(conn: &Connection, row: &VersionRow) -> Result<(), rusqlite::Error> {
    conn.execute(
        &format!(
            "INSERT INTO versions ({VERSION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
        ),
        params![
            row.scope,
            row.version,
            row.serial,
            row.lineage,
            row.sha256,
            row.size,
            row.blob_key,
            row.created_at,
            row.actor
        ],
    )?;
    Ok(())
}

fn header_for(row: &VersionRow, parent: Option<String>) -> BlobHeader {
    BlobHeader {
        parent,
        scope: row.scope.clone(),
        version: row.version,
        serial: row.serial,
        lineage: row.lineage.clone(),
        sha256: row.sha256.clone().unwrap_or_default(),
        size: row.size,
        created_at: row.created_at.clone(),
        actor: row.actor.clone(),
    }
}

/// Where every version blob lives in the store (the index rebuild and the sweep list it).
pub const STATES_PREFIX: &str = "states/";

/// `states/<scope hash>/<version>-<random>.blob`: unique per write, never reused.
pub fn blob_key_for(scope: &str, version: i64) -> String {
    let scope_hash = hex::encode(&format::sha2_digest(scope.as_bytes())[..16]);
    format!(
        "{STATES_PREFIX}{scope_hash}/{version:012}-{}.blob",
        uuid::Uuid::new_v4().simple()
    )
}
