//! Version history and roll-forward rollback, for any scope (`tf/<ws>`, `cluster/<uuid>`).
//!
//! A rollback never rewrites or deletes history: it reads an old version (verified
//! exactly like the current one: a missing or corrupt blob is an error) and stores
//! its bytes as a NEW version through [`StateStore::write_version`], so the caller's
//! guard (e.g. "nobody holds the lock") and the audit row run in the commit
//! transaction like any other write.

use rusqlite::{params, Connection};

use super::{
    row_to_version, AuditEntry, DbError, NewVersion, StateStore, StoreError, VersionRow,
    WriteGuard, WriteOutcome, VERSION_COLUMNS,
};
use crate::crypto::SealKey;

/// Version rows of a scope, newest first (tombstones included); all when `limit` is `None`.
pub fn history_rows(
    conn: &Connection,
    scope: &str,
    limit: Option<u32>,
) -> Result<Vec<VersionRow>, rusqlite::Error> {
    let limit = limit.map_or(-1, i64::from); // SQLite: a negative LIMIT means none
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {VERSION_COLUMNS} FROM versions WHERE scope = ?1 ORDER BY version DESC LIMIT ?2"
    ))?;
    let rows = stmt.query_map(params![scope, limit], row_to_version)?;
    rows.collect()
}

/// One version row, if it exists.
pub fn version_row(
    conn: &Connection,
    scope: &str,
    version: i64,
) -> Result<Option<VersionRow>, rusqlite::Error> {
    use rusqlite::OptionalExtension;
    conn.prepare_cached(&format!(
        "SELECT {VERSION_COLUMNS} FROM versions WHERE scope = ?1 AND version = ?2"
    ))?
    .query_row(params![scope, version], row_to_version)
    .optional()
}

/// What a rollback asks for. The audit row is `event` with metadata only.
#[derive(Debug, Clone)]
pub struct Rollback {
    pub scope: String,
    /// The version whose content becomes current again.
    pub to_version: i64,
    pub actor: String,
    pub org: Option<String>,
    /// Audit event name, e.g. `tf.rollback`.
    pub event: &'static str,
}

#[derive(Debug)]
pub struct RolledBack {
    /// The version that was current when the rollback ran.
    pub from_version: i64,
    pub to_version: i64,
    /// `Stored` with the new row, or `Unchanged` when the current content already is
    /// that version's (nothing written, no audit row).
    pub outcome: WriteOutcome,
}

impl StateStore {
    /// Version rows of a scope, newest first. Reads SQLite only.
    pub async fn history(
        &self,
        scope: &str,
        limit: Option<u32>,
    ) -> Result<Vec<VersionRow>, StoreError> {
        let scope = scope.to_string();
        Ok(self
            .db
            .read(move |c| history_rows(c, &scope, limit))
            .await?)
    }

    /// The content of one version, verified like [`StateStore::read_current`]: a
    /// missing, tampered or undecryptable blob is an error.
    pub async fn read_version(
        &self,
        scope: &str,
        version: i64,
        key: &SealKey,
    ) -> Result<(VersionRow, Vec<u8>), StoreError> {
        let owned = scope.to_string();
        let row = self
            .db
            .read(move |c| version_row(c, &owned, version))
            .await?
            .ok_or_else(|| StoreError::VersionNotFound {
                scope: scope.to_string(),
                version,
            })?;
        if row.is_tombstone() {
            return Err(StoreError::Tombstone {
                scope: scope.to_string(),
                version,
            });
        }
        let plaintext = self.read_version_blob(&row, key).await?;
        Ok((row, plaintext))
    }

    /// Roll-forward: stores version `to_version`'s bytes (and its serial and lineage) as
    /// a new version. `guard` runs before anything is written and again in the commit
    /// transaction; so does a check that no other write landed since the rollback read
    /// the current version (else [`StoreError::Moved`]).
    pub async fn rollback<E>(
        &self,
        request: Rollback,
        key: &SealKey,
        guard: impl WriteGuard<E>,
    ) -> Result<RolledBack, E>
    where
        E: From<StoreError> + From<DbError> + Send + 'static,
    {
        let from_version = self
            .latest(&request.scope)
            .await
            .map_err(E::from)?
            .map(|r| r.version)
            .ok_or_else(|| {
                E::from(StoreError::VersionNotFound {
                    scope: request.scope.clone(),
                    version: request.to_version,
                })
            })?;
        let (old, plaintext) = self
            .read_version(&request.scope, request.to_version, key)
            .await
            .map_err(E::from)?;
        let audit = AuditEntry {
            actor: request.actor.clone(),
            org: request.org.clone(),
            scope: request.scope.clone(),
            event: request.event,
            // Metadata only, never content. The guard below pins the new version number.
            payload: serde_json::json!({
                "from_version": from_version,
                "to_version": request.to_version,
                "new_version": from_version + 1,
                "serial": old.serial,
            }),
        };
        let new = NewVersion {
            scope: request.scope.clone(),
            plaintext: plaintext.into(),
            serial: old.serial,
            lineage: old.lineage.clone(),
            actor: request.actor.clone(),
            audit: Some(audit),
        };
        let scope = request.scope.clone();
        let outcome = self
            .write_version(new, key, move |conn, latest| {
                guard(conn, latest)?;
                match latest.map(|r| r.version) {
                    Some(v) if v == from_version => Ok(()),
                    found => Err(E::from(StoreError::Moved {
                        scope: scope.clone(),
                        found: found.unwrap_or(0),
                    })),
                }
            })
            .await?;
        Ok(RolledBack {
            from_version,
            to_version: request.to_version,
            outcome,
        })
    }
}
