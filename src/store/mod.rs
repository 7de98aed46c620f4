//! Storage engine: immutable encrypted blobs plus a version index (SQLite on one node,
//! PostgreSQL shared by several).
//!
//! Writing a version is: seal the content, put it under a fresh key, then commit
//! the version row in one transaction that re-runs the caller's guard (lock
//! holder, conflict rules). That commit is the single point of truth; a blob
//! without a row is garbage. Reading the current version never turns an
//! unreadable blob into "no state": it is an error.

pub mod audit;
pub mod backup;
pub mod blob;
pub mod copy;
pub mod db;
pub mod format;
pub mod history;
pub mod index;
pub mod keyring;
pub mod metered;
pub mod rebuild;
pub mod reseal;
pub mod retention;
pub mod s3;
pub mod sql;
pub mod timeline;

use std::sync::Arc;

use crate::store::sql::{params, Connection, OptionalExtension};
use bytes::Bytes;

use audit::{insert_audit, AuditEntry};
pub use blob::{BlobError, BlobStore, LocalStore};
pub use db::{Db, DbError};

use crate::crypto::SealKey;
pub use format::WriteFacts;
use format::{BlobIdentity, FormatError, Opener, Sealer};
use timeline::{ChangeCounts, KeptSummary, ResourceSummary};

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
    #[error("the request body ended before it was complete; nothing was written")]
    BodyAborted,
    /// A rollback gives restored content a serial above every stored one; there is none.
    #[error("{scope} already has serial {serial}, the largest stategate can store, so a rollback cannot give the restored state a higher one (plans saved before it would not be refused); nothing was written")]
    SerialExhausted { scope: String, serial: i64 },
    #[error("version {version} of {scope} is {size} bytes, more than the {limit} bytes (max_view_bytes) read whole here; Terraform still reads it (`terraform state pull`), or raise max_view_bytes")]
    TooLargeToView {
        scope: String,
        version: i64,
        size: i64,
        limit: u64,
    },
}

impl From<crate::store::sql::Error> for StoreError {
    fn from(e: crate::store::sql::Error) -> Self {
        StoreError::Db(DbError::Sql(e))
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
    /// The credential that wrote it (`tf:<ws>`, `token:<name>`, `cert:<subject>`,
    /// `drift:run-N`, `operator:<name>`): its writer.
    pub actor: String,
    /// The lock's Who/Operation and the version a rollback restored (none in rows of
    /// earlier releases).
    pub facts: WriteFacts,
    /// What it did to resources; `None` when not known (`store::timeline`).
    pub changes: Option<ChangeCounts>,
    /// The data key generation its blob is sealed under (the blob's header names the
    /// same), recorded when the blob is written or resealed so a listing shows it
    /// without reading a blob; `None` for a tombstone and in rows an earlier release
    /// wrote (read from the header then: `StateStore::current_key_generation`).
    pub key_generation: Option<u32>,
}

impl VersionRow {
    pub fn is_tombstone(&self) -> bool {
        self.blob_key.is_none()
    }
}

pub fn now_rfc3339() -> String {
    crate::clock::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .expect("current time formats")
}

/// A Unix time as every page, table and message shows it: `2026-12-01 21:03 UTC`
/// (UTC, to the minute; the exact instant stays in JSON). The UI, the CLI and a
/// freeze's LockInfo all write times through this one format.
pub fn utc_minutes(unix: i64) -> Option<String> {
    let format = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute] UTC");
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()?
        .format(&format)
        .ok()
}

const VERSION_COLUMNS: &str =
    "scope, version, serial, lineage, sha256, size, blob_key, created_at, actor, \
     lock_who, lock_operation, restored_from, res_added, res_changed, res_removed, \
     moved_to, moved_from, key_gen";

fn row_to_version(
    row: &crate::store::sql::Row<'_>,
) -> Result<VersionRow, crate::store::sql::Error> {
    let counts = (
        row.get::<_, Option<i64>>(12)?,
        row.get::<_, Option<i64>>(13)?,
        row.get::<_, Option<i64>>(14)?,
    );
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
        facts: WriteFacts {
            lock_who: row.get(9)?,
            lock_operation: row.get(10)?,
            restored_from: row.get(11)?,
            moved_to: row.get(15)?,
            moved_from: row.get(16)?,
        },
        changes: match counts {
            (Some(added), Some(changed), Some(removed)) => Some(ChangeCounts {
                added,
                changed,
                removed,
            }),
            _ => None,
        },
        // A value no generation can have reads as unknown (the header still says).
        key_generation: row
            .get::<_, Option<i64>>(17)?
            .and_then(|g| u32::try_from(g).ok()),
    })
}

/// The newest row of a scope (tombstones included). Usable inside a write transaction.
pub fn latest_row(
    conn: &Connection,
    scope: &str,
) -> Result<Option<VersionRow>, crate::store::sql::Error> {
    conn.prepare_cached(&format!(
        "SELECT {VERSION_COLUMNS} FROM versions WHERE scope = ?1 ORDER BY version DESC LIMIT 1"
    ))?
    .query_row([scope], row_to_version)
    .optional()
}

/// The newest row (tombstones included) of every scope that starts with `prefix`.
/// Usable inside any transaction, so a caller can read its own tables beside it.
pub fn latest_rows_under(
    conn: &Connection,
    prefix: &str,
) -> Result<Vec<VersionRow>, crate::store::sql::Error> {
    // A prefix compared as text (no LIKE, so no pattern characters to escape).
    let mut stmt = conn.prepare(&format!(
        "SELECT {VERSION_COLUMNS} FROM versions v
          WHERE substr(v.scope, 1, length(?1)) = ?1
            AND v.version = (SELECT max(version) FROM versions w WHERE w.scope = v.scope)"
    ))?;
    let rows = stmt.query_map([prefix], row_to_version)?.collect();
    rows
}

/// What a state write carries besides the bytes.
pub struct NewVersion {
    pub scope: String,
    pub plaintext: Bytes,
    pub serial: Option<i64>,
    pub lineage: Option<String>,
    pub actor: String,
    pub facts: WriteFacts,
    /// Written in the same transaction when the version is stored.
    pub audit: Option<AuditEntry>,
    /// Its resources, for the timeline (`None`: not known).
    pub resources: Option<ResourceSummary>,
}

/// What a streamed write learns from its body: checked piece by piece as it passes,
/// and at the end, the version's serial, lineage and audit entry.
pub trait BodyCheck<E>: Send + 'static {
    /// The next piece of the body (shared: a check may hand it to another thread).
    fn chunk(&mut self, data: &Bytes) -> Result<(), E>;
    /// The body ended after `size` bytes whose sha256 is `sha256` (hex).
    fn finish(self: Box<Self>, sha256: &str, size: u64) -> Result<BodyMeta, E>;
}

pub struct BodyMeta {
    pub serial: Option<i64>,
    pub lineage: Option<String>,
    /// Written in the same transaction when the version is stored.
    pub audit: Option<AuditEntry>,
    /// Its resources, for the timeline (`None`: not known, e.g. an encrypted state).
    pub resources: Option<ResourceSummary>,
}

/// A streamed state write: the body arrives through a [`BodySource`].
pub struct StreamedVersion<E> {
    pub scope: String,
    pub actor: String,
    /// Known before the body: sealed into the blob header with the actor.
    pub facts: WriteFacts,
    pub check: Box<dyn BodyCheck<E>>,
}

/// The pieces of a body as the HTTP layer receives them: `Ok(Some(piece))`, then
/// `Ok(None)` once the body is complete. A channel closed before that, or an `Err`,
/// aborts the write and leaves nothing behind.
pub type BodyChunks<E> = tokio::sync::mpsc::Receiver<Result<Option<Bytes>, E>>;

/// How many body pieces a streamed write lets the client get ahead of the store.
pub const BODY_CHANNEL: usize = 4;

enum BodySource<E> {
    /// A whole body already in memory, handed to the sealer a slice at a time.
    Whole(Bytes),
    Stream(BodyChunks<E>),
}

/// Slices a whole body is fed in (zero-copy), so sealing it needs no second copy.
const WHOLE_SLICE: usize = 1 << 20;

impl<E: From<StoreError>> BodySource<E> {
    async fn next(&mut self) -> Result<Option<Bytes>, E> {
        match self {
            BodySource::Whole(rest) if rest.is_empty() => Ok(None),
            BodySource::Whole(rest) => Ok(Some(rest.split_to(rest.len().min(WHOLE_SLICE)))),
            BodySource::Stream(rx) => match rx.recv().await {
                Some(piece) => piece,
                None => Err(E::from(StoreError::BodyAborted)),
            },
        }
    }
}

/// A body whose metadata is known up front (buffered writes and rollbacks); with a
/// summarizer, its resources are learnt as it passes (a rollback's restored content).
struct Known(Option<BodyMeta>, Option<Box<dyn timeline::Summarize>>);

impl<E: Send + 'static> BodyCheck<E> for Known {
    fn chunk(&mut self, data: &Bytes) -> Result<(), E> {
        if let Some(scan) = &mut self.1 {
            scan.push(data);
        }
        Ok(())
    }
    fn finish(mut self: Box<Self>, _: &str, _: u64) -> Result<BodyMeta, E> {
        let mut meta = self.0.take().expect("finished once");
        if let Some(scan) = self.1.take() {
            meta.resources = scan.finish();
        }
        Ok(meta)
    }
}

#[derive(Debug)]
pub enum WriteOutcome {
    Stored(VersionRow),
    /// The newest version already has exactly this content (a client retry).
    Unchanged(VersionRow),
}

/// How one write attempt ended (a short-lived return value: its size does not matter).
#[allow(clippy::large_enum_variant)]
enum Attempt {
    Done(WriteOutcome),
    /// Another writer took the version number (newest is now `found`).
    Raced(i64),
}

/// Runs on the newest row before anything is written and again inside the commit
/// transaction (only when that attempt will insert, unless the content turns out
/// unchanged; the early run is on a reader connection, outside any transaction).
/// Returning `Err` rejects the write and changes nothing.
pub trait WriteGuard<E>:
    Fn(&Connection, Option<&VersionRow>) -> Result<(), E> + Send + Sync + 'static
{
}
impl<E, F> WriteGuard<E> for F where
    F: Fn(&Connection, Option<&VersionRow>) -> Result<(), E> + Send + Sync + 'static
{
}

/// A state being read: its row, then its plaintext in verified pieces. An `Err`
/// piece means the blob failed verification part way: the reader must abort.
pub struct StateStream {
    pub row: VersionRow,
    pub chunks: tokio::sync::mpsc::Receiver<Result<Bytes, StoreError>>,
}

#[derive(Clone)]
pub struct StateStore {
    /// The index. Not for callers: the `versions` table's SQL is this module's. The
    /// domain services take their own handle from it once, at construction, for their
    /// own tables ([`Self::index_handle`]).
    db: Db,
    blobs: Arc<dyn BlobStore>,
    /// Writers of one scope take turns in this process, so they never race for a
    /// version number (the commit still re-checks); writers of other scopes never wait.
    write_turns: Arc<crate::turns::KeyedTurns<String>>,
    /// The summary each scope's newest version was stored with (`store::timeline`).
    summaries: Arc<timeline::SummaryCache>,
}

/// How often a version-number race is retried before giving up (only unlocked writers race).
const WRITE_ATTEMPTS: usize = 5;

impl StateStore {
    pub fn new(db: Db, blobs: Arc<dyn BlobStore>) -> Self {
        StateStore {
            db,
            blobs,
            write_turns: Arc::new(crate::turns::KeyedTurns::new()),
            summaries: Arc::default(),
        }
    }

    pub fn blobs(&self) -> &Arc<dyn BlobStore> {
        &self.blobs
    }

    /// The same index over another blob store (a metering or fault-injecting wrapper).
    pub fn with_blobs(&self, blobs: Arc<dyn BlobStore>) -> StateStore {
        StateStore::new(self.db.clone(), blobs)
    }

    /// The database handle for a domain service's own tables (`tofu`: locks,
    /// `cluster`: identities and leases, `operator`: operators, tokens and the audit
    /// log's reads, `drift`: its runs), taken once when the service is built.
    pub(crate) fn index_handle(&self) -> Db {
        self.db.clone()
    }

    /// Measures this node's clock against the index again ([`Db::check_clock`]).
    pub async fn check_clock(&self) -> Result<(), DbError> {
        self.db.check_clock().await
    }

    /// Jobs the index's one writer thread has run since it started: what a request
    /// that must not queue there (a refused LOCK) can be checked against.
    pub fn writer_jobs(&self) -> u64 {
        self.db
            .writer_stats()
            .jobs
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many versions the index holds and their total size in bytes (for `/metrics`).
    pub async fn totals(&self) -> Result<(i64, i64), StoreError> {
        Ok(self
            .db
            .read(|c| {
                c.query_row(
                    "SELECT count(*), CAST(coalesce(sum(size), 0) AS BIGINT) FROM versions",
                    [],
                    |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
                )
            })
            .await?)
    }

    pub async fn latest(&self, scope: &str) -> Result<Option<VersionRow>, StoreError> {
        let scope = scope.to_string();
        Ok(self.db.read_quick(move |c| latest_row(c, &scope)).await?)
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

    /// The current state as a stream: `None` only when no version exists or the newest
    /// is a tombstone. Returns once the blob's header and first chunk verified, so a
    /// blob that is missing or unreadable from the start is an error here.
    pub async fn stream_current(
        &self,
        scope: &str,
        key: &SealKey,
    ) -> Result<Option<StateStream>, StoreError> {
        match self.latest(scope).await? {
            None => Ok(None),
            Some(row) if row.is_tombstone() => Ok(None),
            Some(row) => Ok(Some(self.stream_version_blob(row, key).await?)),
        }
    }

    /// Streams the version `row` names, `row` having been looked up earlier (a reader
    /// that raced `key reseal` gets the resealed blob, see `stream_version_blob`).
    pub async fn stream_row(
        &self,
        row: VersionRow,
        key: &SealKey,
    ) -> Result<StateStream, StoreError> {
        self.stream_version_blob(row, key).await
    }

    async fn read_version_blob(
        &self,
        row: &VersionRow,
        key: &SealKey,
    ) -> Result<Vec<u8>, StoreError> {
        let mut stream = self.stream_version_blob(row.clone(), key).await?;
        let mut plaintext = Vec::with_capacity(row.size.clamp(0, 1 << 30) as usize);
        while let Some(piece) = stream.chunks.recv().await {
            plaintext.extend_from_slice(&piece?);
        }
        Ok(plaintext)
    }

    async fn stream_version_blob(
        &self,
        row: VersionRow,
        key: &SealKey,
    ) -> Result<StateStream, StoreError> {
        let blob_key = row.blob_key.as_deref().expect("not a tombstone");
        let missing = || StoreError::BlobMissing {
            scope: row.scope.clone(),
            version: row.version,
        };
        let (row, mut reader) = match self.blobs.read(blob_key).await? {
            Some(reader) => (row, reader),
            None => {
                // `key reseal` repoints a row at a new blob and then deletes the old
                // one: a reader that looked the row up before the repoint finds the old
                // blob gone. Re-read the row once; only a row that still names a
                // missing blob is an error.
                let (scope, version) = (row.scope.clone(), row.version);
                let again = self
                    .db
                    .read_quick(move |c| history::version_row(c, &scope, version))
                    .await?;
                match again {
                    Some(fresh) if fresh.blob_key.is_some() && fresh.blob_key != row.blob_key => {
                        let key_now = fresh.blob_key.clone().expect("checked");
                        let reader = self.blobs.read(&key_now).await?.ok_or_else(missing)?;
                        (fresh, reader)
                    }
                    _ => return Err(missing()),
                }
            }
        };
        let unreadable = {
            let (scope, version) = (row.scope.clone(), row.version);
            move |reason| StoreError::BlobUnreadable {
                scope: scope.clone(),
                version,
                reason,
            }
        };
        let mut opener = Some(Opener::new(
            key,
            &row.scope,
            row.version,
            row.size.max(0) as u64,
            row.sha256.clone(),
        ));
        // Nothing goes out before the header and the first chunk verified.
        let mut ready = Vec::new();
        while ready.is_empty() && opener.is_some() {
            match reader.chunks.recv().await {
                Some(piece) => {
                    let open = opener.as_mut().expect("open");
                    ready = open.push(&piece?).map_err(&unreadable)?;
                }
                None => {
                    let open = opener.take().expect("open");
                    ready.push(open.finish().map_err(&unreadable)?);
                }
            }
        }
        let (tx, chunks) = tokio::sync::mpsc::channel(blob::READ_AHEAD);
        tokio::spawn(async move {
            for piece in ready {
                if tx.send(Ok(piece)).await.is_err() {
                    return;
                }
            }
            let Some(mut open) = opener else { return };
            loop {
                let pieces = match reader.chunks.recv().await {
                    Some(Ok(piece)) => open.push(&piece).map_err(&unreadable),
                    Some(Err(e)) => Err(StoreError::from(e)),
                    None => {
                        let last = open.finish().map_err(&unreadable);
                        let _ = tx.send(last).await;
                        return;
                    }
                };
                match pieces {
                    Ok(pieces) => {
                        for piece in pieces {
                            if tx.send(Ok(piece)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
        });
        Ok(StateStream { row, chunks })
    }

    /// Stores a new version unless `guard` rejects it or the content is unchanged.
    /// The whole body is in memory (the cluster API, rollbacks); a version-number
    /// race is retried.
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
            let streamed = StreamedVersion {
                scope: new.scope.clone(),
                actor: new.actor.clone(),
                facts: new.facts.clone(),
                check: Box::new(Known(
                    Some(BodyMeta {
                        serial: new.serial,
                        lineage: new.lineage.clone(),
                        audit: new.audit.clone(),
                        resources: new.resources.clone(),
                    }),
                    None,
                )),
            };
            let body = BodySource::Whole(new.plaintext.clone());
            let attempt = self
                .write_attempt(streamed, body, key, guard.clone(), Some(&sha256))
                .await?;
            if let Attempt::Done(outcome) = attempt {
                return Ok(outcome);
            }
        }
        Err(E::from(StoreError::Contended))
    }

    /// Stores a new version from a body that arrives in pieces: each is checked,
    /// hashed, sealed and written to the store as it comes, never held whole. The
    /// guard runs before the first byte is stored and again in the commit; an
    /// identical retry (same sha256 as the newest version) stores nothing.
    pub async fn write_stream<E>(
        &self,
        new: StreamedVersion<E>,
        body: BodyChunks<E>,
        key: &SealKey,
        guard: impl WriteGuard<E>,
    ) -> Result<WriteOutcome, E>
    where
        E: From<StoreError> + From<DbError> + Send + 'static,
    {
        self.write_streamed(new, body, key, None, guard).await
    }

    /// [`Self::write_stream`]; with `known_sha256` (the body's, when the caller knows it
    /// before reading it), content identical to the newest version is found before
    /// anything is read or stored.
    async fn write_streamed<E>(
        &self,
        new: StreamedVersion<E>,
        body: BodyChunks<E>,
        key: &SealKey,
        known_sha256: Option<String>,
        guard: impl WriteGuard<E>,
    ) -> Result<WriteOutcome, E>
    where
        E: From<StoreError> + From<DbError> + Send + 'static,
    {
        let _turn = self.write_turns.wait(new.scope.clone()).await;
        let scope = new.scope.clone();
        let source = BodySource::Stream(body);
        match self
            .write_attempt(new, source, key, Arc::new(guard), known_sha256.as_deref())
            .await?
        {
            Attempt::Done(outcome) => Ok(outcome),
            // The body is gone, so a race cannot be retried here (only a delete can race
            // a writer, as writers of one scope take turns).
            Attempt::Raced(found) => Err(E::from(StoreError::Moved { scope, found })),
        }
    }

    async fn write_attempt<E, G>(
        &self,
        new: StreamedVersion<E>,
        mut body: BodySource<E>,
        key: &SealKey,
        guard: Arc<G>,
        known_sha256: Option<&str>,
    ) -> Result<Attempt, E>
    where
        E: From<StoreError> + From<DbError> + Send + 'static,
        G: WriteGuard<E>,
    {
        // The newest row, the guard's early verdict and the resources the newest
        // version is known to have, in one read.
        let (latest, verdict, prior) = {
            let guard = guard.clone();
            let scope = new.scope.clone();
            let summaries = self.summaries.clone();
            self.db
                .read_quick(move |c| {
                    let latest = latest_row(c, &scope)?;
                    let verdict = guard(c, latest.as_ref());
                    let prior = match &verdict {
                        Ok(()) => kept_summary(c, &summaries, &scope, latest.as_ref())?,
                        Err(_) => None,
                    };
                    Ok((latest, verdict, prior))
                })
                .await
                .map_err(E::from)?
        };
        verdict?;
        let live = latest.as_ref().filter(|r| !r.is_tombstone());
        if let (Some(row), Some(sha)) = (live, known_sha256) {
            if row.sha256.as_deref() == Some(sha) {
                return Ok(Attempt::Done(WriteOutcome::Unchanged(row.clone())));
            }
        }
        let id = successor_identity(&new.scope, &new.actor, &new.facts, latest.as_ref());
        let version = id.version;
        let blob_key = blob_key_for(&new.scope, version);
        let (mut meta, trailer, generation) = self
            .store_blob(&blob_key, &id, key, new.check, &mut body)
            .await?;
        // Compared outside the writer thread; the commit checks the base still holds.
        let changes = timeline_changes(latest.as_ref(), &prior, meta.resources.as_ref());
        let resources = meta.resources.take().map(Arc::new);
        let kept = resources.clone();
        let row = VersionRow {
            scope: id.scope,
            version,
            serial: meta.serial,
            lineage: meta.lineage,
            sha256: Some(trailer.sha256),
            size: trailer.size,
            blob_key: Some(blob_key.clone()),
            created_at: id.created_at,
            actor: id.actor,
            facts: id.facts,
            changes: None,
            key_generation: Some(generation),
        };
        let audit = meta.audit;
        let committed = self
            .db
            .write(move |c| -> Result<Attempt, E> {
                let current = latest_row(c, &row.scope).map_err(|e| E::from(DbError::from(e)))?;
                // A raced attempt stores nothing, so it is settled before the guard runs:
                // a guard that passes here is followed by the insert, and may record its
                // decision in this transaction (e.g. use up a one-shot permission).
                let found = current.as_ref().map_or(0, |r| r.version);
                if found != row.version - 1 {
                    return Ok(Attempt::Raced(found)); // another writer took this number
                }
                guard(c, current.as_ref())?;
                if let Some(live) = current.as_ref().filter(|r| !r.is_tombstone()) {
                    if live.sha256 == row.sha256 {
                        return Ok(Attempt::Done(WriteOutcome::Unchanged(live.clone())));
                    }
                }
                let mut row = row;
                let db = |e| E::from(DbError::from(e));
                row.changes =
                    record_timeline(c, &row, changes, resources.as_deref()).map_err(db)?;
                insert_version(c, &row).map_err(db)?;
                if let Some(entry) = &audit {
                    insert_audit(c, entry).map_err(db)?;
                }
                Ok(Attempt::Done(WriteOutcome::Stored(row)))
            })
            .await;
        match &committed {
            Ok(Attempt::Done(WriteOutcome::Stored(row))) => match (kept, &row.sha256) {
                (Some(summary), Some(sha)) => {
                    self.summaries.put(&row.scope, row.version, sha, summary)
                }
                _ => self.summaries.remove(&row.scope),
            },
            _ => self.discard_blob(&blob_key).await,
        }
        committed
    }

    /// Streams `body` through `check` and the sealer into a new blob under `blob_key`;
    /// on any failure nothing is left under the key. With the data key generation the
    /// blob is sealed under, for its row.
    async fn store_blob<E>(
        &self,
        blob_key: &str,
        id: &BlobIdentity,
        key: &SealKey,
        mut check: Box<dyn BodyCheck<E>>,
        body: &mut BodySource<E>,
    ) -> Result<(BodyMeta, format::Trailer, u32), E>
    where
        E: From<StoreError> + Send + 'static,
    {
        let store_err = |e: BlobError| E::from(StoreError::from(e));
        let (mut sealer, head) = Sealer::new(key, id).map_err(|e| E::from(StoreError::from(e)))?;
        let generation = sealer.key_generation();
        let mut sink = self.blobs.create(blob_key).await.map_err(store_err)?;
        let sealed = async {
            sink.write(head).await.map_err(store_err)?;
            while let Some(piece) = body.next().await? {
                check.chunk(&piece)?;
                let sealed = sealer
                    .push_shared(&piece)
                    .map_err(|e| E::from(StoreError::from(e)))?;
                if !sealed.is_empty() {
                    sink.write(sealed).await.map_err(store_err)?;
                }
            }
            let (sha256, size) = sealer.digest().map_err(|e| E::from(StoreError::from(e)))?;
            let meta = check.finish(&sha256, size)?;
            let (tail, trailer) = sealer
                .finish(meta.serial, meta.lineage.clone())
                .map_err(|e| E::from(StoreError::from(e)))?;
            sink.write(tail).await.map_err(store_err)?;
            Ok::<_, E>((meta, trailer, generation))
        }
        .await;
        match sealed {
            Ok(done) => {
                sink.finish().await.map_err(store_err)?;
                Ok(done)
            }
            Err(e) => {
                sink.abort().await;
                Err(e)
            }
        }
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
                let mut row = VersionRow {
                    scope: scope.clone(),
                    version: current.version + 1,
                    serial: None,
                    lineage: None,
                    sha256: None,
                    size: 0,
                    blob_key: None,
                    created_at: now_rfc3339(),
                    actor,
                    facts: WriteFacts::default(),
                    changes: None,
                    key_generation: None,
                };
                let db = |e| E::from(DbError::from(e));
                // A deletion removes every resource the state is known to have had.
                let prior = timeline::prior_summary(c, &scope).map_err(db)?;
                let changes = timeline_changes(Some(&current), &prior, Some(&Default::default()));
                row.changes = record_timeline(c, &row, changes, None).map_err(db)?;
                insert_version(c, &row).map_err(db)?;
                if let Some(entry) = &audit {
                    insert_audit(c, entry).map_err(|e| E::from(DbError::from(e)))?;
                }
                Ok(Some(row))
            })
            .await
    }

    /// New versions of several scopes, all committed in ONE transaction or none: each
    /// body (whole, in memory) is sealed into its own new blob, then one write
    /// transaction checks that no scope moved since its newest row was read, runs
    /// `guard` over the newest rows and the rows about to be inserted (it may record
    /// its decision, e.g. one audit row for all of them, in that transaction), and
    /// inserts every row. Scopes must be distinct; their turns are taken in name order,
    /// so two such writes never wait for each other in a circle. Nothing is audited
    /// here: the guard writes what describes the change. Any failure stores nothing
    /// (the blobs written are discarded).
    pub async fn write_versions<E>(
        &self,
        news: Vec<(NewVersion, SealKey)>,
        guard: impl Fn(&Connection, &[Option<VersionRow>], &[VersionRow]) -> Result<(), E>
            + Send
            + Sync
            + 'static,
    ) -> Result<Vec<VersionRow>, E>
    where
        E: From<StoreError> + From<DbError> + Send + 'static,
    {
        let turns = self
            .take_turns_in_name_order(&news)
            .await
            .map_err(E::from)?;
        let latest = self.newest_rows(&news).await.map_err(E::from)?;
        let mut written = Vec::with_capacity(news.len());
        let committed = match self.seal_versions(news, latest, &mut written).await {
            Ok((rows, timelines)) => self.commit_versions(rows, timelines, guard).await,
            Err(e) => Err(e),
        };
        drop(turns);
        match committed {
            Ok(rows) => Ok(rows),
            Err(e) => {
                for key in &written {
                    self.discard_blob(key).await;
                }
                Err(e)
            }
        }
    }

    /// The write turns of every scope of `news`, taken in name order so two multi-scope
    /// writes never wait for each other in a circle; refused when a scope repeats.
    async fn take_turns_in_name_order(
        &self,
        news: &[(NewVersion, SealKey)],
    ) -> Result<Vec<crate::turns::Turn>, StoreError> {
        let mut scopes: Vec<String> = news.iter().map(|(n, _)| n.scope.clone()).collect();
        scopes.sort();
        scopes.dedup();
        if scopes.len() != news.len() {
            return Err(StoreError::Contended);
        }
        let mut turns = Vec::with_capacity(scopes.len());
        for scope in scopes {
            turns.push(self.write_turns.wait(scope).await);
        }
        Ok(turns)
    }

    /// The newest row of each scope of `news` and the resources it is known to hold,
    /// read under the turns (the commit checks again that none moved).
    async fn newest_rows(
        &self,
        news: &[(NewVersion, SealKey)],
    ) -> Result<Vec<(Option<VersionRow>, KeptSummary)>, DbError> {
        let wanted: Vec<String> = news.iter().map(|(n, _)| n.scope.clone()).collect();
        self.db
            .read_quick(move |c| {
                wanted
                    .iter()
                    .map(|scope| Ok((latest_row(c, scope)?, timeline::prior_summary(c, scope)?)))
                    .collect::<Result<Vec<_>, crate::store::sql::Error>>()
            })
            .await
    }

    /// Seals each body into its own new blob (each key pushed to `written` as soon as
    /// it exists, so a failure later discards it): the rows to insert and each one's
    /// timeline. Stops at the first failure.
    async fn seal_versions<E>(
        &self,
        news: Vec<(NewVersion, SealKey)>,
        latest: Vec<(Option<VersionRow>, KeptSummary)>,
        written: &mut Vec<String>,
    ) -> Result<(Vec<VersionRow>, Vec<SealedTimeline>), E>
    where
        E: From<StoreError> + From<DbError> + Send + 'static,
    {
        let mut rows = Vec::with_capacity(news.len());
        let mut timelines = Vec::with_capacity(news.len());
        for ((new, key), (before, prior)) in news.into_iter().zip(latest) {
            let id = successor_identity(&new.scope, &new.actor, &new.facts, before.as_ref());
            let version = id.version;
            let blob_key = blob_key_for(&new.scope, version);
            let check: Box<dyn BodyCheck<E>> = Box::new(Known(
                Some(BodyMeta {
                    serial: new.serial,
                    lineage: new.lineage.clone(),
                    audit: None,
                    resources: new.resources.clone(),
                }),
                None,
            ));
            let mut body = BodySource::Whole(new.plaintext.clone());
            let (mut meta, trailer, generation) = self
                .store_blob(&blob_key, &id, &key, check, &mut body)
                .await?;
            written.push(blob_key.clone());
            let changes = timeline_changes(before.as_ref(), &prior, meta.resources.as_ref());
            timelines.push((changes, meta.resources.take()));
            rows.push(VersionRow {
                scope: id.scope,
                version,
                serial: meta.serial,
                lineage: meta.lineage,
                sha256: Some(trailer.sha256),
                size: trailer.size,
                blob_key: Some(blob_key),
                created_at: id.created_at,
                actor: id.actor,
                facts: id.facts,
                changes: None,
                key_generation: Some(generation),
            });
        }
        Ok((rows, timelines))
    }

    /// The one write transaction of a multi-scope write: no scope moved since its
    /// newest row was read, `guard` accepts (and records its decision), and every row
    /// is inserted with its timeline; or nothing is.
    async fn commit_versions<E>(
        &self,
        mut inserted: Vec<VersionRow>,
        timelines: Vec<SealedTimeline>,
        guard: impl Fn(&Connection, &[Option<VersionRow>], &[VersionRow]) -> Result<(), E>
            + Send
            + Sync
            + 'static,
    ) -> Result<Vec<VersionRow>, E>
    where
        E: From<StoreError> + From<DbError> + Send + 'static,
    {
        self.db
            .write(move |c| -> Result<Vec<VersionRow>, E> {
                let mut current = Vec::with_capacity(inserted.len());
                for row in &inserted {
                    let now = latest_row(c, &row.scope).map_err(|e| E::from(DbError::from(e)))?;
                    let found = now.as_ref().map_or(0, |r| r.version);
                    if found != row.version - 1 {
                        return Err(E::from(StoreError::Moved {
                            scope: row.scope.clone(),
                            found,
                        }));
                    }
                    current.push(now);
                }
                guard(c, &current, &inserted)?;
                let db = |e| E::from(DbError::from(e));
                for (row, (changes, resources)) in inserted.iter_mut().zip(timelines) {
                    row.changes =
                        record_timeline(c, row, changes, resources.as_ref()).map_err(db)?;
                    insert_version(c, row).map_err(db)?;
                }
                Ok(inserted)
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

/// What a new version did to resources, compared with what the newest version is known
/// to hold: (the version compared with, or 0 for "no live state before"; the changes).
/// `None` when either side is unknown (then no timeline is recorded for it).
type TimelineChanges = Option<(i64, Vec<(String, timeline::Change)>)>;

/// A sealed version's timeline, kept for its commit: the changes against the version
/// before it and the resources it holds.
type SealedTimeline = (TimelineChanges, Option<ResourceSummary>);

fn timeline_changes(
    latest: Option<&VersionRow>,
    prior: &KeptSummary,
    next: Option<&ResourceSummary>,
) -> TimelineChanges {
    let next = next?;
    match latest.filter(|r| !r.is_tombstone()) {
        // Nothing live before it (a first version, after a deletion): all added.
        None => Some((0, timeline::diff(&ResourceSummary::default(), next))),
        Some(live) => match prior {
            Some((version, Some(base))) if *version == live.version => {
                Some((*version, timeline::diff(base, next)))
            }
            _ => None,
        },
    }
}

/// In the version's commit: records `changes` (unless the summary they were compared
/// with was replaced since) and keeps `resources` for the next write; returns the
/// counts for the version row (`None`: not known).
fn record_timeline(
    conn: &Connection,
    row: &VersionRow,
    changes: TimelineChanges,
    resources: Option<&ResourceSummary>,
) -> Result<Option<ChangeCounts>, crate::store::sql::Error> {
    let kept = timeline::prior_version(conn, &row.scope)?;
    let changes = changes.filter(|(base, _)| *base == 0 || kept == Some(*base));
    let counts = changes.as_ref().map(|(_, c)| timeline::counts(c));
    let (scope, version) = (row.scope.as_str(), row.version);
    match (changes, resources) {
        // Compared with the summary kept: only the changed addresses' rows move.
        (Some((base, changes)), Some(next)) if base != 0 => {
            timeline::record_changes(conn, scope, version, &changes)?;
            timeline::advance_summary(conn, scope, version, &changes, next)?;
        }
        (Some((_, changes)), Some(next)) => {
            timeline::record_changes(conn, scope, version, &changes)?;
            timeline::keep_summary(conn, scope, version, next)?;
        }
        (Some((_, changes)), None) => {
            timeline::record_changes(conn, scope, version, &changes)?;
            timeline::forget(conn, scope)?;
        }
        (None, Some(next)) => timeline::keep_summary(conn, scope, version, next)?,
        (None, None) => timeline::forget(conn, scope)?,
    }
    Ok(counts)
}

/// The summary kept for `scope`'s newest version, from `cache` when it holds the one
/// `latest` was stored with, else from the index (and then cached).
fn kept_summary(
    conn: &Connection,
    cache: &timeline::SummaryCache,
    scope: &str,
    latest: Option<&VersionRow>,
) -> Result<KeptSummary, crate::store::sql::Error> {
    let live = latest.filter(|r| !r.is_tombstone());
    let Some((version, sha)) = live.and_then(|r| Some((r.version, r.sha256.as_deref()?))) else {
        return Ok(None); // nothing live: the next version is compared with nothing
    };
    if let Some(summary) = cache.get(scope, version, sha) {
        return Ok(Some((version, Some(summary))));
    }
    let prior = timeline::prior_summary(conn, scope)?;
    if let Some((kept, Some(summary))) = &prior {
        if *kept == version {
            cache.put(scope, version, sha, summary.clone());
        }
    }
    Ok(prior)
}

fn insert_version(conn: &Connection, row: &VersionRow) -> Result<(), crate::store::sql::Error> {
    let counts = row.changes.unwrap_or_default();
    let known = row.changes.is_some();
    conn.prepare_cached(&format!(
        "INSERT INTO versions ({VERSION_COLUMNS})
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)"
    ))?
    .execute(params![
        row.scope,
        row.version,
        row.serial,
        row.lineage,
        row.sha256,
        row.size,
        row.blob_key,
        row.created_at,
        row.actor,
        row.facts.lock_who,
        row.facts.lock_operation,
        row.facts.restored_from,
        known.then_some(counts.added),
        known.then_some(counts.changed),
        known.then_some(counts.removed),
        row.facts.moved_to,
        row.facts.moved_from,
        row.key_generation,
    ])?;
    Ok(())
}

/// Where every version blob lives in the store (the index rebuild and the sweep list it).
pub const STATES_PREFIX: &str = "states/";

/// Who the version written now on top of `latest` is: the next number of `scope`, by
/// `actor`, with `latest`'s blob as its parent (none for the first version).
fn successor_identity(
    scope: &str,
    actor: &str,
    facts: &WriteFacts,
    latest: Option<&VersionRow>,
) -> BlobIdentity {
    BlobIdentity {
        scope: scope.to_string(),
        version: latest.map_or(1, |r| r.version + 1),
        created_at: now_rfc3339(),
        actor: actor.to_string(),
        parent: latest.and_then(|r| r.blob_key.clone()),
        facts: facts.clone(),
    }
}

/// `states/<scope hash>/<version>-<random>.blob`: unique per write, never reused.
pub fn blob_key_for(scope: &str, version: i64) -> String {
    let scope_hash = hex::encode(&format::sha2_digest(scope.as_bytes())[..16]);
    format!(
        "{STATES_PREFIX}{scope_hash}/{version:012}-{}.blob",
        uuid::Uuid::new_v4().simple()
    )
}
