//! Rebuilding the SQLite version index from the blob store alone (after losing the disk).
//!
//! Every blob under `states/` carries its identity in a header that is also the AEAD's
//! associated data (scope, version, serial, lineage, sha256, size, created_at, actor).
//! The rebuild reads each header, proves the blob opens with the key derived for the
//! scope it claims (and that the content matches its hash), and writes one version row
//! per (scope, version) into a NEW database file. It never touches the live index.
//!
//! What blobs do not carry, a rebuilt index does not have: locks (every workspace
//! starts unlocked), tombstones (a deleted state comes back as its last version), the
//! audit log and the cluster API's orgs, users, tokens, clusters and leases.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::format::{self, BlobHeader};
use super::retention::parse_time;
use super::{insert_version, BlobError, BlobStore, VersionRow, STATES_PREFIX};
use crate::crypto::{RootKey, SealKey};

/// One blob's claim to be a (scope, version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub key: String,
    pub header: BlobHeader,
}

/// A blob left out of the rebuilt index, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub key: String,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct RebuildReport {
    /// The rows written, ordered by (scope, version).
    pub rows: Vec<VersionRow>,
    pub skipped: Vec<Skipped>,
    /// Valid blobs that lost a (scope, version) conflict (orphans of failed writes).
    pub superseded: Vec<Claim>,
}

#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error("{0} already exists; the rebuild only ever writes a new file")]
    Exists(PathBuf),
    #[error("cannot create {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error("cannot write the new index: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

/// The AEAD key of each kind of scope: `tf/…` under the DEK, `cluster/…` under the
/// `ADJ_STATE_ENC_KEY` root (when configured).
pub struct ScopeKeys {
    pub workspaces: RootKey,
    pub clusters: Option<RootKey>,
}

impl ScopeKeys {
    pub fn key_for(&self, scope: &str) -> Result<SealKey, String> {
        if scope.starts_with("tf/") {
            Ok(self.workspaces.blob_key(scope))
        } else if scope.starts_with("cluster/") {
            self.clusters
                .as_ref()
                .map(|root| root.blob_key(scope))
                .ok_or_else(|| {
                    "cluster scope, but ADJ_STATE_ENC_KEY (cluster.state_enc_key) is not configured"
                        .to_string()
                })
        } else {
            Err(format!("unknown kind of scope {scope:?}"))
        }
    }
}

/// Orders claims to the same (scope, version); the greatest wins.
///
/// Why the latest `created_at` wins: a writer allocates version V as "newest + 1",
/// puts the blob, then commits the row. When that attempt does not commit (a crash
/// between put and commit, a failed commit, another writer taking V), the blob stays
/// behind as an orphan claiming V, and the next attempt for this scope, which still
/// sees V-1 as newest, writes a NEW blob for V, created later. Once a blob for V is
/// committed nobody allocates V again. So among blobs claiming V, the committed one
/// is the last one created. (Writers of one scope take turns within a process and
/// header times come from the wall clock; a losing writer in another process deletes
/// its blob at once, so a later-stamped orphan needs that deletion to fail too.)
/// Ties (a copied blob) fall back to the key, so the result is deterministic.
fn claim_rank(claim: &Claim) -> (Option<time::OffsetDateTime>, &str, &str) {
    (
        parse_time(&claim.header.created_at),
        &claim.header.created_at,
        &claim.key,
    )
}

/// Splits claims into one winner per (scope, version), ordered by (scope, version),
/// and the superseded rest.
pub fn resolve_claims(claims: Vec<Claim>) -> (Vec<Claim>, Vec<Claim>) {
    let mut winners: BTreeMap<(String, i64), Claim> = BTreeMap::new();
    let mut superseded = Vec::new();
    for claim in claims {
        let id = (claim.header.scope.clone(), claim.header.version);
        match winners.remove(&id) {
            None => {
                winners.insert(id, claim);
            }
            Some(held) => {
                let (win, lose) = if claim_rank(&claim) > claim_rank(&held) {
                    (claim, held)
                } else {
                    (held, claim)
                };
                winners.insert(id, win);
                superseded.push(lose);
            }
        }
    }
    superseded.sort_by(|a, b| a.key.cmp(&b.key));
    (winners.into_values().collect(), superseded)
}

/// Reads and verifies every blob under `states/`. A blob that is not ours, has no
/// key, does not open or does not match its hash is skipped with a reason.
pub async fn collect_claims(
    blobs: &dyn BlobStore,
    keys: &ScopeKeys,
) -> Result<(Vec<Claim>, Vec<Skipped>), BlobError> {
    let mut claims = Vec::new();
    let mut skipped = Vec::new();
    for key in blobs.list(STATES_PREFIX).await? {
        let Some(blob) = blobs.get(&key).await? else {
            continue; // deleted since the listing
        };
        match verify(&blob, keys) {
            Ok(header) => claims.push(Claim { key, header }),
            Err(reason) => skipped.push(Skipped { key, reason }),
        }
    }
    Ok((claims, skipped))
}

fn verify(blob: &[u8], keys: &ScopeKeys) -> Result<BlobHeader, String> {
    let (header, _) = format::read_header(blob).map_err(|e| e.to_string())?;
    let key = keys.key_for(&header.scope)?;
    let plaintext = format::decode(
        &key,
        blob,
        &header.scope,
        header.version,
        Some(&header.sha256),
    )
    .map_err(|e| format!("{} v{}: {e}", header.scope, header.version))?;
    if plaintext.len() as i64 != header.size {
        return Err(format!(
            "{} v{}: size in the header does not match the content",
            header.scope, header.version
        ));
    }
    Ok(header)
}

fn row_of(claim: Claim) -> VersionRow {
    let h = claim.header;
    VersionRow {
        scope: h.scope,
        version: h.version,
        serial: h.serial,
        lineage: h.lineage,
        sha256: Some(h.sha256),
        size: h.size,
        blob_key: Some(claim.key),
        created_at: h.created_at,
        actor: h.actor,
    }
}

/// Creates `into` (which must not exist) with `schemas` (all of them: `crate::schema::ALL`) and `rows`, in one
/// transaction, in rollback-journal mode: the result is a single self-contained file
/// (no `-wal` beside it) that can be moved into place.
pub fn write_index(into: &Path, schemas: &[&str], rows: &[VersionRow]) -> Result<(), RebuildError> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(into)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(RebuildError::Exists(into.to_path_buf()))
        }
        Err(source) => {
            return Err(RebuildError::Create {
                path: into.to_path_buf(),
                source,
            })
        }
    }
    let mut conn = rusqlite::Connection::open(into)?;
    conn.pragma_update(None, "journal_mode", "DELETE")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    let tx = conn.transaction()?;
    for schema in schemas {
        tx.execute_batch(schema)?;
    }
    for row in rows {
        insert_version(&tx, row)?;
    }
    tx.commit()?;
    conn.close().map_err(|(_, e)| e)?;
    Ok(())
}

/// Rebuilds the version index from `blobs` into the new file `into`.
pub async fn rebuild_index(
    blobs: &dyn BlobStore,
    keys: &ScopeKeys,
    into: &Path,
    schemas: &[&str],
) -> Result<RebuildReport, RebuildError> {
    if into.exists() {
        return Err(RebuildError::Exists(into.to_path_buf()));
    }
    let (claims, skipped) = collect_claims(blobs, keys).await?;
    let (winners, superseded) = resolve_claims(claims);
    let rows: Vec<VersionRow> = winners.into_iter().map(row_of).collect();
    write_index(into, schemas, &rows)?;
    Ok(RebuildReport {
        rows,
        skipped,
        superseded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(key: &str, scope: &str, version: i64, created_at: &str) -> Claim {
        Claim {
            key: key.into(),
            header: BlobHeader {
                scope: scope.into(),
                version,
                serial: Some(version),
                lineage: Some("l".into()),
                sha256: "00".into(),
                size: 1,
                created_at: created_at.into(),
                actor: "t".into(),
            },
        }
    }

    #[test]
    fn latest_created_claim_wins_each_scope_version() {
        // (claims, winning keys in (scope, version) order, superseded keys sorted)
        let t1 = "2026-03-01T10:00:00Z";
        let t2 = "2026-03-01T10:00:00.5Z"; // later by half a second, sorts before t1 as text
        let t3 = "2026-03-01T11:00:00Z";
        type Case = (
            &'static str,
            Vec<Claim>,
            Vec<&'static str>,
            Vec<&'static str>,
        );
        let cases: Vec<Case> = vec![
            ("no claims", vec![], vec![], vec![]),
            (
                "distinct versions all win",
                vec![claim("b", "tf/a", 2, t1), claim("a", "tf/a", 1, t1)],
                vec!["a", "b"],
                vec![],
            ),
            (
                "orphan created before the committed blob loses",
                vec![
                    claim("orphan", "tf/a", 2, t1),
                    claim("committed", "tf/a", 2, t3),
                ],
                vec!["committed"],
                vec!["orphan"],
            ),
            (
                "order of discovery does not matter",
                vec![
                    claim("committed", "tf/a", 2, t3),
                    claim("orphan", "tf/a", 2, t1),
                ],
                vec!["committed"],
                vec!["orphan"],
            ),
            (
                "times compare as times, not text",
                vec![claim("x", "tf/a", 1, t2), claim("y", "tf/a", 1, t1)],
                vec!["x"],
                vec!["y"],
            ),
            (
                "three claims: two orphans lose",
                vec![
                    claim("o1", "tf/a", 5, t1),
                    claim("win", "tf/a", 5, t3),
                    claim("o2", "tf/a", 5, t2),
                ],
                vec!["win"],
                vec!["o1", "o2"],
            ),
            (
                "same version in different scopes is no conflict",
                vec![claim("p", "tf/a", 1, t1), claim("q", "cluster/x", 1, t3)],
                vec!["q", "p"],
                vec![],
            ),
            (
                "a tie falls back to the key, deterministically",
                vec![claim("k2", "tf/a", 1, t1), claim("k1", "tf/a", 1, t1)],
                vec!["k2"],
                vec!["k1"],
            ),
            (
                "an unparsable time loses to a real one",
                vec![claim("bad", "tf/a", 1, "zzz"), claim("good", "tf/a", 1, t1)],
                vec!["good"],
                vec!["bad"],
            ),
        ];
        for (name, claims, winners, superseded) in cases {
            let (w, s) = resolve_claims(claims);
            let w: Vec<&str> = w.iter().map(|c| c.key.as_str()).collect();
            let s: Vec<&str> = s.iter().map(|c| c.key.as_str()).collect();
            assert_eq!((w, s), (winners, superseded), "{name}");
        }
    }

    #[test]
    fn keys_by_scope_kind() {
        let keys = ScopeKeys {
            workspaces: RootKey::from_bytes([1; 32]),
            clusters: None,
        };
        assert!(keys.key_for("tf/prod").is_ok());
        assert!(keys
            .key_for("cluster/x")
            .unwrap_err()
            .contains("ADJ_STATE_ENC_KEY"));
        assert!(keys.key_for("other/x").is_err());
    }

    #[test]
    fn write_index_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.db");
        write_index(&path, &[super::super::db::SCHEMA], &[]).unwrap();
        assert!(matches!(
            write_index(&path, &[], &[]),
            Err(RebuildError::Exists(_))
        ));
        assert!(!dir.path().join("new.db-wal").exists());
    }
}
