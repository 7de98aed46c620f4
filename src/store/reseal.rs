//! Counting what each data key generation seals, and resealing what an older one
//! does under the newest (`stategate key status`, `key reseal`, `key retire`).
//!
//! A version is resealed by streaming its blob through the opener into a sealer of
//! the newest generation, into a NEW blob key (blobs are never overwritten), with the
//! same identity in its header (scope, version, writer facts, parent) so an index
//! rebuild sees the same version. Then one commit points the row at the new blob,
//! only if the row still names the old one (a prune, restore or other reseal that
//! changed it in between wins, and the new blob is deleted as garbage), with its
//! `key.resealed` audit row; the old blob is deleted only after that commit. So a
//! `kill -9` anywhere leaves every committed row naming a blob that opens (at worst an
//! unreferenced blob, swept like any orphan), and running it again carries on where
//! it stopped. Memory is one chunk per version in flight, whatever the state's size.
//!
//! Backups and revocation records are whole objects read by key, not through the
//! index: they are resealed in place (`put` replaces an object atomically in the local
//! store and in S3), only after the new bytes opened under the newest generation.

use std::collections::BTreeMap;

use crate::store::sql::{params, OptionalExtension};
use serde::Serialize;

use super::audit::{insert_audit, AuditEntry};
use super::blob::BlobReader;
use super::format::{self, Opener, Sealer};
use super::rebuild::ScopeKeys;
use super::{blob_key_for, BlobStore, StateStore, StoreError, VersionRow};
use crate::crypto::{RootKey, SealKey};

/// How many version rows are read from the index at once.
const PAGE: i64 = 256;

/// Objects per data key generation, by kind.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct GenerationCounts {
    pub versions: u64,
    pub backups: u64,
    pub revocation_records: u64,
    pub drift_outputs: u64,
    /// Kept drift plans (files in the data dir; counted by the caller).
    pub drift_plans: u64,
}

impl GenerationCounts {
    pub fn total(&self) -> u64 {
        self.versions
            + self.backups
            + self.revocation_records
            + self.drift_outputs
            + self.drift_plans
    }

    /// "3 state versions, 1 backup" — what a refused retire names.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = [
            (self.versions, "state version"),
            (self.backups, "backup"),
            (self.revocation_records, "revocation record"),
            (self.drift_outputs, "drift output"),
            (self.drift_plans, "kept drift plan"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}{}", if *n == 1 { "" } else { "s" }))
        .collect();
        parts.join(", ")
    }
}

/// What `key status` counts: per generation, and what could not be read.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Census {
    pub generations: BTreeMap<u32, GenerationCounts>,
    /// Versions of scopes sealed under another root (cluster states: `ADJ_STATE_ENC_KEY`).
    pub other_root_versions: u64,
    /// Objects whose header could not be read (named, for the operator).
    pub unreadable: Vec<String>,
}

/// The rows with a blob, a page at a time, after `(scope, version)`.
async fn page(
    store: &StateStore,
    after: Option<(String, i64)>,
) -> Result<Vec<VersionRow>, StoreError> {
    let (scope, version) = after.unwrap_or_default();
    Ok(store
        .db
        .read(move |conn| {
            conn.prepare_cached(&format!(
                "SELECT {} FROM versions WHERE blob_key IS NOT NULL AND (scope, version) > (?1, ?2)
                 ORDER BY scope, version LIMIT ?3",
                super::VERSION_COLUMNS
            ))?
            .query_map(params![scope, version, PAGE], super::row_to_version)?
            .collect()
        })
        .await?)
}

/// The data key generation a blob names, reading only its first bytes (`None`: no
/// such blob).
pub async fn blob_generation(blobs: &dyn BlobStore, key: &str) -> Result<Option<u32>, String> {
    let Some(mut reader) = blobs.read(key).await.map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let mut head = Vec::new();
    while let Some(piece) = reader.chunks.recv().await {
        head.extend_from_slice(&piece.map_err(|e| e.to_string())?);
        if let Some(g) = format::key_generation(&head).map_err(|e| e.to_string())? {
            return Ok(Some(g));
        }
        if head.len() > 80 * 1024 {
            break;
        }
    }
    Err("the header is cut short".into())
}

impl StateStore {
    /// The data key generation the newest version of `scope` is sealed under, read from
    /// its blob's first bytes without decrypting (`None`: no version, or a tombstone).
    /// A blob that is missing or whose header is cut short is an error naming why.
    pub async fn current_key_generation(&self, scope: &str) -> Result<Option<u32>, String> {
        let Some(row) = self.latest(scope).await.map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let Some(key) = row.blob_key else {
            return Ok(None);
        };
        match blob_generation(self.blobs().as_ref(), &key).await? {
            Some(g) => Ok(Some(g)),
            None => Err(format!(
                "the blob of version {} of {scope} is missing",
                row.version
            )),
        }
    }
}

/// Counts every version's blob by the generation it names (scopes not starting with
/// `data_scopes` are under another root and only counted), plus the backups and the
/// whole objects under `records` (revocation records).
pub async fn census(
    store: &StateStore,
    data_scopes: &str,
    records: &str,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Census, StoreError> {
    let mut census = Census::default();
    let (total, _) = store.totals().await?;
    let mut done = 0usize;
    let mut after = None;
    loop {
        let rows = page(store, after.clone()).await?;
        let Some(last) = rows.last() else { break };
        after = Some((last.scope.clone(), last.version));
        for row in &rows {
            done += 1;
            progress(done, total.max(0) as usize);
            if !row.scope.starts_with(data_scopes) {
                census.other_root_versions += 1;
                continue;
            }
            let key = row.blob_key.as_deref().unwrap_or_default();
            match blob_generation(store.blobs.as_ref(), key).await {
                Ok(Some(g)) => census.generations.entry(g).or_default().versions += 1,
                Ok(None) => census
                    .unreadable
                    .push(format!("{} v{}: blob missing", row.scope, row.version)),
                Err(e) => census
                    .unreadable
                    .push(format!("{} v{}: {e}", row.scope, row.version)),
            }
        }
    }
    for (prefix, kind) in [
        (super::backup::BACKUPS_PREFIX, Kind::Backup),
        (records, Kind::Revocation),
    ] {
        for key in store.blobs.list(prefix).await? {
            match blob_generation(store.blobs.as_ref(), &key).await {
                Ok(Some(g)) => kind.add(census.generations.entry(g).or_default()),
                Ok(None) => {}
                Err(e) => census.unreadable.push(format!("{key}: {e}")),
            }
        }
    }
    Ok(census)
}

#[derive(Clone, Copy)]
enum Kind {
    Backup,
    Revocation,
}

impl Kind {
    fn add(self, counts: &mut GenerationCounts) {
        match self {
            Kind::Backup => counts.backups += 1,
            Kind::Revocation => counts.revocation_records += 1,
        }
    }
}

/// What a reseal did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Resealed {
    /// The generation everything was resealed under.
    pub generation: u32,
    pub versions: u64,
    pub backups: u64,
    pub revocation_records: u64,
    /// Already under the newest generation (or under another root).
    pub current: u64,
    /// Versions whose row changed while they were resealed (pruned, restored): left alone.
    pub raced: u64,
    /// Old blobs that could not be deleted after their commit (unreferenced now; the
    /// garbage sweep removes them).
    pub leftovers: Vec<String>,
}

/// Reseals every version, backup and revocation record under an older data generation
/// under the newest this process knows (see the module docs): versions with the key
/// `keys` gives their scope (a scope under a root without generations, such as a
/// cluster's, is always current), backups and the whole objects under `records` with
/// `data_root`. Idempotent; stops at the first error, with everything before it done.
pub async fn reseal(
    store: &StateStore,
    keys: &ScopeKeys,
    data_root: &RootKey,
    records: (&str, &str),
    actor: &str,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Resealed, StoreError> {
    let mut out = Resealed {
        generation: data_root.data_generation(),
        ..Resealed::default()
    };
    let (total, _) = store.totals().await?;
    let mut done = 0usize;
    let mut after = None;
    loop {
        let rows = page(store, after.clone()).await?;
        let Some(last) = rows.last() else { break };
        after = Some((last.scope.clone(), last.version));
        for row in rows {
            done += 1;
            progress(done, total.max(0) as usize);
            // A scope whose root this process lacks (a cluster scope without
            // ADJ_STATE_ENC_KEY) is not under the keyring: left alone.
            let Ok(key) = keys.key_for(&row.scope) else {
                out.current += 1;
                continue;
            };
            let target = key.write_generation();
            let old = row.blob_key.clone().unwrap_or_default();
            let generation = match blob_generation(store.blobs.as_ref(), &old).await {
                Ok(Some(g)) => g,
                Ok(None) => {
                    return Err(StoreError::BlobMissing {
                        scope: row.scope.clone(),
                        version: row.version,
                    })
                }
                Err(e) => return Err(StoreError::Blob(super::BlobError::Failed(e))),
            };
            if generation >= target {
                out.current += 1;
                continue;
            }
            match reseal_version(store, &key, &row, generation, actor).await {
                Ok(Outcome::Done(leftover)) => {
                    out.versions += 1;
                    out.leftovers.extend(leftover);
                }
                Ok(Outcome::Raced) => out.raced += 1,
                // The blob went away under the reseal because the row did (a prune).
                Err(e) if !still_names(store, &row.scope, row.version, &old).await? => {
                    tracing::debug!(scope = %row.scope, version = row.version, error = %e, "version changed while resealed");
                    out.raced += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
    out.backups = reseal_whole(
        store.blobs.as_ref(),
        data_root,
        super::backup::BACKUPS_PREFIX,
        "backup/",
    )
    .await?;
    out.revocation_records =
        reseal_whole(store.blobs.as_ref(), data_root, records.0, records.1).await?;
    Ok(out)
}

/// Does the row of (scope, version) still name blob `key`?
async fn still_names(
    store: &StateStore,
    scope: &str,
    version: i64,
    key: &str,
) -> Result<bool, StoreError> {
    let (scope, key) = (scope.to_string(), key.to_string());
    Ok(store
        .db
        .read(move |conn| {
            conn.query_row(
                "SELECT 1 FROM versions WHERE scope = ?1 AND version = ?2 AND blob_key = ?3",
                params![scope, version, key],
                |_| Ok(()),
            )
            .optional()
        })
        .await?
        .is_some())
}

enum Outcome {
    /// Committed; the old blob's key when it could not be deleted.
    Done(Option<String>),
    Raced,
}

/// Reseals one version under the newest generation: a new blob is written beside the
/// old one, the row is switched to it (audited) only if it still names the old one,
/// and whichever blob lost is deleted.
async fn reseal_version(
    store: &StateStore,
    key: &SealKey,
    row: &VersionRow,
    from: u32,
    actor: &str,
) -> Result<Outcome, StoreError> {
    let old = row.blob_key.clone().unwrap_or_default();
    let new = blob_key_for(&row.scope, row.version);
    let sealed_under = write_resealed(store, key, row, &old, &new).await?;
    let switch = Switch {
        old: old.clone(),
        new: new.clone(),
        from,
        to: key.write_generation(),
        sealed_under,
    };
    let committed = switch_row(store, row, switch, actor).await?;
    let garbage = if committed { &old } else { &new };
    let left = match store.blobs.delete(garbage).await {
        Ok(()) => None,
        Err(e) => {
            tracing::warn!(blob = %garbage, error = %e, "cannot delete a blob the reseal replaced; the garbage sweep will");
            Some(garbage.clone())
        }
    };
    Ok(if committed {
        Outcome::Done(left)
    } else {
        Outcome::Raced
    })
}

/// The error of a version whose blob cannot be read as a sealed state.
fn unreadable(row: &VersionRow, reason: format::FormatError) -> StoreError {
    StoreError::BlobUnreadable {
        scope: row.scope.clone(),
        version: row.version,
        reason,
    }
}

/// Streams blob `old` of `row`, verified chunk by chunk, into a new blob `new` sealed
/// under `key`'s write generation with the same identity; the generation it was sealed
/// under. Fails (leaving nothing under `new`) unless the whole state's hash is the one
/// the row records.
async fn write_resealed(
    store: &StateStore,
    key: &SealKey,
    row: &VersionRow,
    old: &str,
    new: &str,
) -> Result<u32, StoreError> {
    let missing = || StoreError::BlobMissing {
        scope: row.scope.clone(),
        version: row.version,
    };
    let mut reader: BlobReader = store.blobs.read(old).await?.ok_or_else(missing)?;
    let mut opener = Opener::new(
        key,
        &row.scope,
        row.version,
        row.size.max(0) as u64,
        row.sha256.clone(),
    );
    let (identity, pending) = read_identity(&mut reader, row).await?;
    let (mut sealer, first) = Sealer::new(key, &identity)?;
    // Dropped unfinished on any error below: nothing appears under `new`.
    let mut sink = store.blobs.create(new).await?;
    sink.write(first).await?;
    let mut next = pending.into_iter();
    loop {
        let piece = match next.next() {
            Some(piece) => piece,
            None => match reader.chunks.recv().await {
                Some(piece) => piece?,
                None => break,
            },
        };
        let mut sealed = Vec::new();
        for plain in opener.push(&piece).map_err(|e| unreadable(row, e))? {
            sealed.extend_from_slice(&sealer.push(&plain)?);
        }
        if !sealed.is_empty() {
            sink.write(bytes::Bytes::from(sealed)).await?;
        }
    }
    let last = opener.finish().map_err(|e| unreadable(row, e))?;
    let mut tail = sealer.push(&last)?.to_vec();
    let sealed_under = sealer.key_generation();
    let (end, trailer) = sealer.finish(row.serial, row.lineage.clone())?;
    tail.extend_from_slice(&end);
    if row.sha256.as_deref().is_some_and(|s| s != trailer.sha256) {
        return Err(unreadable(row, format::FormatError::HashMismatch));
    }
    sink.write(bytes::Bytes::from(tail)).await?;
    sink.finish().await?;
    Ok(sealed_under)
}

/// The blob's identity from its header, and the chunks read to find it (still to be
/// opened: the header is part of the first).
async fn read_identity(
    reader: &mut BlobReader,
    row: &VersionRow,
) -> Result<(format::BlobIdentity, Vec<bytes::Bytes>), StoreError> {
    let mut head = Vec::new();
    let mut pending = Vec::new();
    loop {
        let Some(piece) = reader.chunks.recv().await else {
            return Err(unreadable(row, format::FormatError::NotABlob));
        };
        let piece = piece?;
        head.extend_from_slice(&piece);
        pending.push(piece);
        if let Some(id) = format::stream_identity(&head).map_err(|e| unreadable(row, e))? {
            return Ok((id, pending));
        }
    }
}

/// A version's switch from its old blob to the resealed one.
struct Switch {
    old: String,
    new: String,
    /// The generation the old blob was sealed under, and the one asked for.
    from: u32,
    to: u32,
    /// The generation the new blob is sealed under (recorded in the row).
    sealed_under: u32,
}

/// Points `row` at the new blob in one write transaction, audited (`key.resealed`),
/// only if it still names the old one (a prune or another reseal may have raced):
/// whether it did.
async fn switch_row(
    store: &StateStore,
    row: &VersionRow,
    switch: Switch,
    actor: &str,
) -> Result<bool, StoreError> {
    let (scope, version, actor) = (row.scope.clone(), row.version, actor.to_string());
    store
        .db
        .write(move |conn| -> Result<bool, StoreError> {
            let still: Option<i64> = conn
                .query_row(
                    "SELECT 1 FROM versions WHERE scope = ?1 AND version = ?2 AND blob_key = ?3",
                    params![scope, version, switch.old],
                    |r| r.get(0),
                )
                .optional()?;
            if still.is_none() {
                return Ok(false);
            }
            // The row names the new blob's generation with the new blob.
            conn.execute(
                "UPDATE versions SET blob_key = ?4, key_gen = ?5
                  WHERE scope = ?1 AND version = ?2 AND blob_key = ?3",
                params![scope, version, switch.old, switch.new, switch.sealed_under],
            )?;
            insert_audit(
                conn,
                &AuditEntry::new(
                    actor,
                    scope.clone(),
                    "key.resealed",
                    serde_json::json!({
                        "version": version,
                        "from_generation": switch.from,
                        "to_generation": switch.to,
                    }),
                ),
            )?;
            Ok(true)
        })
        .await
}

/// Reseals every whole object under `prefix` whose header scope starts with `scope`
/// (backups, revocation records), in place. Returns how many it resealed.
async fn reseal_whole(
    blobs: &dyn BlobStore,
    root: &RootKey,
    prefix: &str,
    scope: &str,
) -> Result<u64, StoreError> {
    let target = root.data_generation();
    let mut n = 0;
    for name in blobs.list(prefix).await? {
        let Some(sealed) = blobs.get(&name).await? else {
            continue;
        };
        let bad = |e: format::FormatError| {
            StoreError::Blob(super::BlobError::Failed(format!("{name}: {e}")))
        };
        let header = format::read_header(&sealed).map_err(bad)?;
        if !header.scope.starts_with(scope)
            || format::key_generation(&sealed).map_err(bad)? >= Some(target)
        {
            continue;
        }
        let key = root.blob_key(&header.scope);
        let plain = format::decode(
            &key,
            &sealed,
            &header.scope,
            header.version,
            Some(&header.sha256),
        )
        .map_err(bad)?;
        let resealed = format::encode(&key, &header, &plain)?;
        format::decode(
            &key,
            &resealed,
            &header.scope,
            header.version,
            Some(&header.sha256),
        )
        .map_err(bad)?;
        blobs.put(&name, bytes::Bytes::from(resealed)).await?;
        n += 1;
    }
    Ok(n)
}
