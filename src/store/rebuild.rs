//! Rebuilding the SQLite version index from the blob store alone (after losing the disk).
//!
//! Every blob under `states/` carries its identity in a header that is also the AEAD's
//! associated data (scope, version, serial, lineage, sha256, size, created_at, actor).
//! The rebuild reads each header, proves the blob opens with the key derived for the
//! scope it claims (and that the content matches its hash), and writes one version row
//! per (scope, version) into a NEW database file. It never touches the live index.
//!
//! Writer facts (the lock's Who/Operation, "rollback of vN") come back from the
//! headers. The resource timeline is recomputed: each kept version's content is read
//! again, summarized by the summarizer its kind of scope names
//! ([`ScopeKeys::with_timeline`]) and compared with the version below it, one scope
//! at a time (one summary held per scope). The oldest version kept of a scope whose
//! history was pruned has no timeline (nothing to compare with), unless it is v1.
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
    /// (scope, version) pairs decided by wall clock among several candidates: check
    /// them with `workspace history` / the superseded blobs before swapping in.
    pub unproven: Vec<(String, i64)>,
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
    Sql(#[from] crate::store::sql::Error),
}

/// The AEAD root of each kind of scope, by the scope's prefix. The kinds are the APIs'
/// (`crate::schema::scope_keys` lists them); the store only matches prefixes.
#[derive(Default)]
pub struct ScopeKeys {
    kinds: Vec<ScopeKind>,
    /// The scope prefixes whose resource timeline a rebuild recomputes, and how.
    timelines: Vec<(&'static str, super::timeline::Summarizer)>,
}

struct ScopeKind {
    prefix: &'static str,
    /// The root, or why this process has none (reported for each such scope).
    root: Result<RootKey, &'static str>,
}

impl ScopeKeys {
    /// Adds a kind of scope: `root` seals the scopes starting with `prefix`; without
    /// one, they are skipped with `missing` as the reason.
    pub fn with(
        mut self,
        prefix: &'static str,
        root: Option<RootKey>,
        missing: &'static str,
    ) -> Self {
        let root = root.ok_or(missing);
        self.kinds.push(ScopeKind { prefix, root });
        self
    }

    /// Scopes starting with `prefix` have a resource timeline, summarized by `summarize`.
    pub fn with_timeline(
        mut self,
        prefix: &'static str,
        summarize: super::timeline::Summarizer,
    ) -> Self {
        self.timelines.push((prefix, summarize));
        self
    }

    fn summarizer_for(&self, scope: &str) -> Option<super::timeline::Summarizer> {
        self.timelines
            .iter()
            .find(|(prefix, _)| scope.starts_with(prefix))
            .map(|(_, s)| *s)
    }

    pub fn key_for(&self, scope: &str) -> Result<SealKey, String> {
        let kind = self
            .kinds
            .iter()
            .find(|k| scope.starts_with(k.prefix))
            .ok_or_else(|| format!("unknown kind of scope {scope:?}"))?;
        match &kind.root {
            Ok(root) => Ok(root.blob_key(scope)),
            Err(missing) => Err(missing.to_string()),
        }
    }
}

/// Splits claims into one winner per (scope, version), ordered by (scope, version).
///
/// Several blobs can claim one (scope, version): a writer allocates V as "newest + 1",
/// puts the blob, then commits the row, and an attempt that does not commit (a crash
/// between put and commit, a failed commit, another writer taking V) leaves its blob
/// behind as an orphan claiming V. Which one was committed is proven by the version
/// above it: every blob names, in its authenticated header, the blob it was written on
/// top of (`parent`), and a blob for V+1 can only commit on top of the committed V.
/// So the chain is followed down from the newest version of each scope. Where there is
/// no such link (the newest version, a gap left by pruning or a tombstone, blobs of
/// older releases), the latest `created_at` is the best remaining evidence (a retry is
/// created after the attempt it replaces), and such choices among several candidates
/// are reported as `unproven`, since wall clocks can go backwards.
pub fn resolve_claims(claims: Vec<Claim>) -> Resolution {
    let mut by_id: BTreeMap<(String, i64), Vec<Claim>> = BTreeMap::new();
    for claim in claims {
        let id = (claim.header.scope.clone(), claim.header.version);
        by_id.entry(id).or_default().push(claim);
    }
    let mut out = Resolution::default();
    let mut winners = Vec::new();
    // Walk each scope from its newest version down, remembering the winner above.
    let mut above: Option<(String, i64, Option<String>)> = None;
    for ((scope, version), mut candidates) in by_id.into_iter().rev() {
        let linked = match &above {
            Some((s, v, Some(parent))) if *s == scope && *v == version + 1 => {
                candidates.iter().position(|c| &c.key == parent)
            }
            _ => None,
        };
        let pick = linked.unwrap_or_else(|| {
            if candidates.len() > 1 {
                out.unproven.push((scope.clone(), version));
            }
            (0..candidates.len())
                .max_by(|&a, &b| claim_rank(&candidates[a]).cmp(&claim_rank(&candidates[b])))
                .expect("at least one claim")
        });
        let winner = candidates.swap_remove(pick);
        above = Some((scope, version, winner.header.parent.clone()));
        winners.push(winner);
        out.superseded.extend(candidates);
    }
    winners.reverse();
    out.winners = winners;
    out.unproven.reverse();
    out.superseded.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// The outcome of [`resolve_claims`].
#[derive(Debug, Default)]
pub struct Resolution {
    /// One claim per (scope, version), ordered by (scope, version).
    pub winners: Vec<Claim>,
    /// Valid blobs that lost a (scope, version) conflict, sorted by key.
    pub superseded: Vec<Claim>,
    /// (scope, version) pairs with several candidates and no parent link to decide
    /// between them: the latest `created_at` won.
    pub unproven: Vec<(String, i64)>,
}

/// Clock order for claims no parent link decides; ties (a copied blob) fall back to
/// the key, so the result is deterministic.
fn claim_rank(claim: &Claim) -> (Option<time::OffsetDateTime>, &str, &str) {
    (
        parse_time(&claim.header.created_at),
        &claim.header.created_at,
        &claim.key,
    )
}

/// Reads and verifies every blob under `states/`. A blob that is not ours, has no
/// key, does not open or does not match its hash is skipped with a reason.
pub async fn collect_claims(
    blobs: &dyn BlobStore,
    keys: &ScopeKeys,
) -> Result<(Vec<Claim>, Vec<Skipped>), BlobError> {
    collect_claims_with_progress(blobs, keys, &|_, _| {}).await
}

/// [`collect_claims`], calling `progress(done, total)` as blobs are read (for a progress bar).
pub async fn collect_claims_with_progress(
    blobs: &dyn BlobStore,
    keys: &ScopeKeys,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(Vec<Claim>, Vec<Skipped>), BlobError> {
    let mut claims = Vec::new();
    let mut skipped = Vec::new();
    let listed = blobs.list(STATES_PREFIX).await?;
    let total = listed.len();
    for (done, key) in listed.into_iter().enumerate() {
        progress(done, total);
        let Some(blob) = blobs.get(&key).await? else {
            continue; // deleted since the listing
        };
        match verify(&blob, keys) {
            Ok(header) => claims.push(Claim { key, header }),
            Err(reason) => skipped.push(Skipped { key, reason }),
        }
    }
    progress(total, total);
    Ok((claims, skipped))
}

fn verify(blob: &[u8], keys: &ScopeKeys) -> Result<BlobHeader, String> {
    let header = format::read_header(blob).map_err(|e| e.to_string())?;
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

pub(crate) fn row_of(claim: Claim) -> VersionRow {
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
        facts: h.facts,
        changes: None,
        key_generation: Some(h.key_gen),
    }
}

/// Creates `into` (which must not exist) with `schemas` (all of them: `crate::schema::ALL`) and `rows`, in one
/// transaction, in rollback-journal mode: the result is a single self-contained file
/// (no `-wal` beside it) that can be moved into place.
pub fn write_index(into: &Path, schemas: &[&str], rows: &[VersionRow]) -> Result<(), RebuildError> {
    use std::os::unix::fs::OpenOptionsExt;
    // Owner-only from the start: an index holds what the versions say about each state.
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
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
    let conn = crate::store::sql::Connection::open(into)?;
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
    conn.close()?;
    Ok(())
}

/// One version's resource changes: (scope, version, changes).
type VersionChanges = (String, i64, Vec<(String, super::timeline::Change)>);

/// What a rebuild recomputed of the resource timeline: each version's changes, and the
/// summary of each scope's newest version (what the next write compares with).
#[derive(Default)]
pub(crate) struct Recomputed {
    pub(crate) changes: Vec<VersionChanges>,
    pub(crate) newest: Vec<(String, i64, super::timeline::ResourceSummary)>,
}

/// Reads each row's content again (rows are ordered by scope, version) and compares
/// its resources with the version below it; sets each row's counts (the restore's
/// too, for the versions a snapshot has no timeline for).
pub(crate) async fn recompute_timeline(
    blobs: &dyn BlobStore,
    keys: &ScopeKeys,
    rows: &mut [VersionRow],
) -> Result<Recomputed, RebuildError> {
    use super::timeline::{counts, diff, ResourceSummary};
    let mut out = Recomputed::default();
    // (scope, version, summary) of the previous row, when it had one.
    let mut below: Option<(String, i64, Option<ResourceSummary>)> = None;
    for row in rows.iter_mut() {
        // Unreadable here (no timeline for the scope's kind, no key, no blob): nothing
        // known, so the next version is compared with nothing either.
        let summary = match (
            keys.summarizer_for(&row.scope),
            keys.key_for(&row.scope),
            row.blob_key.as_deref(),
        ) {
            (Some(summarize), Ok(key), Some(blob_key)) => match blobs.get(blob_key).await? {
                Some(blob) => {
                    format::decode(&key, &blob, &row.scope, row.version, row.sha256.as_deref())
                        .ok()
                        .and_then(|plain| {
                            let mut scan = summarize(key.resource_digest_key());
                            scan.push(&plain);
                            scan.finish()
                        })
                }
                None => None,
            },
            _ => None,
        };
        let base = match below.take() {
            Some((scope, _, prev)) if scope == row.scope => prev,
            // The first version kept of a scope: v1 is compared with nothing there.
            _ if row.version == 1 => Some(ResourceSummary::default()),
            _ => None,
        };
        if let (Some(base), Some(next)) = (&base, &summary) {
            let changes = diff(base, next);
            row.changes = Some(counts(&changes));
            out.changes.push((row.scope.clone(), row.version, changes));
        }
        below = Some((row.scope.clone(), row.version, summary));
        // The newest row of its scope so far.
        if let Some((scope, version, Some(summary))) = &below {
            if out.newest.last().is_some_and(|(s, _, _)| s == scope) {
                out.newest.pop();
            }
            out.newest.push((scope.clone(), *version, summary.clone()));
        } else if out.newest.last().is_some_and(|(s, _, _)| *s == row.scope) {
            out.newest.pop();
        }
    }
    Ok(out)
}

/// Writes the recomputed timeline into the new index `into` (after [`write_index`]).
fn write_timeline(into: &Path, timeline: &Recomputed) -> Result<(), RebuildError> {
    let conn = crate::store::sql::Connection::open(into)?;
    conn.pragma_update(None, "journal_mode", "DELETE")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    let tx = conn.transaction()?;
    for (scope, version, changes) in &timeline.changes {
        super::timeline::record_changes(&tx, scope, *version, changes)?;
    }
    super::timeline::forget_all(&tx)?;
    for (scope, version, summary) in &timeline.newest {
        super::timeline::keep_summary(&tx, scope, *version, summary)?;
    }
    tx.commit()?;
    conn.close()?;
    Ok(())
}

/// Rebuilds the version index from `blobs` into the new file `into`.
pub async fn rebuild_index(
    blobs: &dyn BlobStore,
    keys: &ScopeKeys,
    into: &Path,
    schemas: &[&str],
) -> Result<RebuildReport, RebuildError> {
    rebuild_index_with_progress(blobs, keys, into, schemas, &|_, _| {}).await
}

/// [`rebuild_index`], reporting `progress(done, total)` as blobs are verified.
pub async fn rebuild_index_with_progress(
    blobs: &dyn BlobStore,
    keys: &ScopeKeys,
    into: &Path,
    schemas: &[&str],
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<RebuildReport, RebuildError> {
    if into.exists() {
        return Err(RebuildError::Exists(into.to_path_buf()));
    }
    let (claims, skipped) = collect_claims_with_progress(blobs, keys, progress).await?;
    let resolved = resolve_claims(claims);
    let mut rows: Vec<VersionRow> = resolved.winners.into_iter().map(row_of).collect();
    let timeline = recompute_timeline(blobs, keys, &mut rows).await?;
    write_index(into, schemas, &rows)?;
    write_timeline(into, &timeline)?;
    Ok(RebuildReport {
        rows,
        skipped,
        superseded: resolved.superseded,
        unproven: resolved.unproven,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(key: &str, scope: &str, version: i64, created_at: &str) -> Claim {
        linked(key, scope, version, created_at, None)
    }

    fn linked(
        key: &str,
        scope: &str,
        version: i64,
        created_at: &str,
        parent: Option<&str>,
    ) -> Claim {
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
                parent: parent.map(str::to_string),
                facts: Default::default(),
                key_gen: 0,
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
            let r = resolve_claims(claims);
            let w: Vec<&str> = r.winners.iter().map(|c| c.key.as_str()).collect();
            let s: Vec<&str> = r.superseded.iter().map(|c| c.key.as_str()).collect();
            assert_eq!((w, s), (winners, superseded), "{name}");
        }
    }

    #[test]
    fn parent_links_beat_wall_clocks() {
        let early = "2026-03-01T10:00:00Z";
        let late = "2026-03-01T11:00:00Z";
        // (name, claims, winners, superseded, unproven versions of tf/a)
        type Case = (
            &'static str,
            Vec<Claim>,
            Vec<&'static str>,
            Vec<&'static str>,
            Vec<i64>,
        );
        let cases: Vec<Case> = vec![
            (
                "the clock went backwards: the committed v2 is older, v3 names it",
                vec![
                    linked("v1", "tf/a", 1, early, None),
                    linked("v2-committed", "tf/a", 2, early, Some("v1")),
                    linked("v2-orphan", "tf/a", 2, late, Some("v1")),
                    linked("v3", "tf/a", 3, early, Some("v2-committed")),
                ],
                vec!["v1", "v2-committed", "v3"],
                vec!["v2-orphan"],
                vec![],
            ),
            (
                "the chain runs down several levels",
                vec![
                    linked("v1-orphan", "tf/a", 1, late, None),
                    linked("v1", "tf/a", 1, early, None),
                    linked("v2-orphan", "tf/a", 2, late, Some("v1-orphan")),
                    linked("v2", "tf/a", 2, early, Some("v1")),
                    linked("v3", "tf/a", 3, early, Some("v2")),
                ],
                vec!["v1", "v2", "v3"],
                vec!["v1-orphan", "v2-orphan"],
                vec![],
            ),
            (
                "the newest version has no link: clock, reported as unproven",
                vec![
                    linked("v1", "tf/a", 1, early, None),
                    linked("v2-a", "tf/a", 2, early, Some("v1")),
                    linked("v2-b", "tf/a", 2, late, Some("v1")),
                ],
                vec!["v1", "v2-b"],
                vec!["v2-a"],
                vec![2],
            ),
            (
                "a gap (pruned or tombstoned v2) breaks the chain",
                vec![
                    linked("v1-a", "tf/a", 1, early, None),
                    linked("v1-b", "tf/a", 1, late, None),
                    linked("v3", "tf/a", 3, early, None),
                ],
                vec!["v1-b", "v3"],
                vec!["v1-a"],
                vec![1],
            ),
            (
                "a link to a missing blob falls back to the clock",
                vec![
                    linked("v1-a", "tf/a", 1, early, None),
                    linked("v1-b", "tf/a", 1, late, None),
                    linked("v2", "tf/a", 2, early, Some("gone")),
                ],
                vec!["v1-b", "v2"],
                vec!["v1-a"],
                vec![1],
            ),
            (
                "links never cross scopes",
                vec![
                    linked("a1", "tf/a", 1, early, None),
                    linked("a1-late", "tf/a", 1, late, None),
                    linked("b1", "tf/b", 1, early, Some("a1")),
                ],
                vec!["a1-late", "b1"],
                vec!["a1"],
                vec![1],
            ),
        ];
        for (name, claims, winners, superseded, unproven) in cases {
            let r = resolve_claims(claims);
            let w: Vec<&str> = r.winners.iter().map(|c| c.key.as_str()).collect();
            let s: Vec<&str> = r.superseded.iter().map(|c| c.key.as_str()).collect();
            let u: Vec<i64> = r
                .unproven
                .iter()
                .filter(|(scope, _)| scope == "tf/a")
                .map(|(_, v)| *v)
                .collect();
            assert_eq!((w, s, u), (winners, superseded, unproven), "{name}");
        }
    }

    #[test]
    fn keys_by_scope_kind() {
        let keys = ScopeKeys::default()
            .with("a/", Some(RootKey::from_bytes([1; 32])), "no a key")
            .with("b/", None, "no b key");
        assert!(keys.key_for("a/prod").is_ok());
        assert_eq!(keys.key_for("b/x").unwrap_err(), "no b key");
        assert!(keys.key_for("other/x").is_err());
        assert!(keys.key_for("a").is_err(), "a bare kind name is no scope");
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
