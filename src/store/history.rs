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
    /// When set, the restored content gets a serial above every one stored for the
    /// scope, written into it by this function (`None` from it: the content cannot
    /// carry a new serial and is restored as it was). The store never reads states.
    pub renumber: Option<Renumber>,
}

/// Writes `serial` into a state's content, or `None` when it cannot (see
/// `tfstate::with_serial`).
pub type Renumber = fn(&[u8], i64) -> Option<Vec<u8>>;

/// The highest serial stored for a scope (any version), if any.
fn max_serial(conn: &Connection, scope: &str) -> Result<Option<i64>, rusqlite::Error> {
    conn.prepare_cached("SELECT MAX(serial) FROM versions WHERE scope = ?1")?
        .query_row([scope], |r| r.get(0))
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
    /// The serial a rollback gives restored content: one above every serial stored for
    /// `scope` and above `restored`, the restored version's own.
    pub async fn fresh_serial(
        &self,
        scope: &str,
        restored: Option<i64>,
    ) -> Result<i64, StoreError> {
        let owned = scope.to_string();
        let top = self.db.read(move |c| max_serial(c, &owned)).await?;
        Ok(top.max(restored).unwrap_or(0) + 1)
    }

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
        let latest = self
            .latest(&request.scope)
            .await
            .map_err(E::from)?
            .ok_or_else(|| {
                E::from(StoreError::VersionNotFound {
                    scope: request.scope.clone(),
                    version: request.to_version,
                })
            })?;
        let from_version = latest.version;
        let (old, plaintext) = self
            .read_version(&request.scope, request.to_version, key)
            .await
            .map_err(E::from)?;
        let (plaintext, serial) = match request.renumber {
            None => (plaintext, old.serial),
            Some(renumber) => {
                // This content under the current serial is what a repeated rollback
                // finds: then nothing is written, as for any identical content.
                let as_current = latest
                    .serial
                    .and_then(|s| renumber(&plaintext, s).map(|body| (body, s)))
                    .filter(|(body, _)| {
                        Some(hex::encode(super::format::sha2_digest(body))) == latest.sha256
                    });
                match as_current {
                    Some((body, s)) => (body, Some(s)),
                    None if latest.sha256 == old.sha256 => (plaintext, old.serial),
                    None => {
                        let next = self
                            .fresh_serial(&request.scope, old.serial)
                            .await
                            .map_err(E::from)?;
                        match renumber(&plaintext, next) {
                            Some(body) => (body, Some(next)),
                            None => (plaintext, old.serial),
                        }
                    }
                }
            }
        };
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
                "serial": serial,
                "restored_serial": old.serial,
            }),
        };
        let new = NewVersion {
            scope: request.scope.clone(),
            plaintext: plaintext.into(),
            serial,
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
