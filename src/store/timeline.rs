//! The resource timeline: which resource addresses each version added, changed or
//! removed relative to the version before it, so "when did `module.db.aws_db_instance.main`
//! last change, and who did it?" is one indexed query.
//!
//! The store never reads states: the caller's body check (`tfstate::StateScanner`)
//! hands over a [`ResourceSummary`] of the body it streamed — every resource instance's
//! address with a keyed digest of its bytes — and the store compares it with the
//! summary kept for the scope's newest version (`resource_summary_heads` names the
//! version, `resource_instance_digests` holds one row per address), then records the
//! differences (`resource_changes`) and the counts on the version row, in the version's
//! commit. The commit rewrites only the digest rows of the addresses that changed, and
//! the next write finds the summary in the [`SummaryCache`] instead of reading it back:
//! for a 10,000-instance state both are ~0.6 MB of index rows per write otherwise.
//!
//! Bounds: at most [`MAX_ADDRESSES`] instances of at most [`MAX_ADDRESS_LEN`] bytes
//! each per state; a state past them (or one the server cannot read, such as an
//! OpenTofu-encrypted one) records no timeline for its version (counts NULL: unknown),
//! and the next version is compared with nothing known, so it too records none.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::store::sql::ValueRef;
use crate::store::sql::{params, Connection, OptionalExtension};
use serde::Serialize;

/// Most resource instances summarized per state. 50,000 instances of the longest
/// address are 26 MiB held during one write; a real 10,000-resource state takes ~1 MiB.
pub const MAX_ADDRESSES: usize = 50_000;
/// Longest address kept (bytes); a state with a longer one records no timeline.
pub const MAX_ADDRESS_LEN: usize = 512;
/// Bytes of each instance's HMAC-SHA256 digest kept.
pub const DIGEST_LEN: usize = 16;
/// Most timeline rows one query returns.
pub const MAX_TIMELINE_ROWS: u32 = 10_000;

pub const SCHEMA: &str = r#"
-- One row per resource address a version added, changed or removed (issue 23's timeline).
CREATE TABLE IF NOT EXISTS resource_changes (
    scope    TEXT    NOT NULL,
    version  INTEGER NOT NULL,
    address  TEXT    NOT NULL,
    change   TEXT    NOT NULL CHECK (change IN ('added', 'changed', 'removed')),
    PRIMARY KEY (scope, version, address)
) WITHOUT ROWID;

-- "When did this address change": one scope's rows for one address, newest first.
CREATE INDEX IF NOT EXISTS resource_changes_by_address
    ON resource_changes (scope, address, version);

-- The version whose summary (address -> keyed digest) the next write of each scope is
-- compared with: its newest. Absent when that version has none (unknown).
CREATE TABLE IF NOT EXISTS resource_summary_heads (
    scope    TEXT    PRIMARY KEY,
    version  INTEGER NOT NULL
) WITHOUT ROWID;

-- That summary, one row per instance address: a write changes the rows of the
-- addresses it changed, not the whole summary.
CREATE TABLE IF NOT EXISTS resource_instance_digests (
    scope    TEXT    NOT NULL,
    address  TEXT    NOT NULL,
    digest   BLOB    NOT NULL,
    PRIMARY KEY (scope, address)
) WITHOUT ROWID;
"#;

/// Every resource instance of one state: address and a digest of its content, sorted
/// by address, each address once. The addresses share one string, so a 10,000-instance
/// state's summary is a few allocations, not one per address (a large write builds one
/// and drops the one before it).
#[derive(Debug, Clone, Default)]
pub struct ResourceSummary {
    text: String,
    entries: Vec<Entry>,
}

/// One instance: its address is `text[at..at + len]`.
#[derive(Debug, Clone, Copy)]
struct Entry {
    at: usize,
    len: usize,
    digest: [u8; DIGEST_LEN],
}

impl PartialEq for ResourceSummary {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for ResourceSummary {}

/// A summary's entries as a scan (or a read of the index) finds them, in any order.
#[derive(Debug, Default)]
pub struct SummaryBuilder {
    summary: ResourceSummary,
    /// An address past [`MAX_ADDRESS_LEN`] was offered: there will be no summary.
    broken: bool,
}

impl SummaryBuilder {
    /// Adds the address made of `parts` (concatenated) with its digest.
    pub fn push(&mut self, parts: &[&str], digest: [u8; DIGEST_LEN]) {
        let len = parts.iter().map(|p| p.len()).sum();
        if len > MAX_ADDRESS_LEN {
            self.broken = true;
        }
        if self.broken {
            return;
        }
        let at = self.summary.text.len();
        for part in parts {
            self.summary.text.push_str(part);
        }
        self.summary.entries.push(Entry { at, len, digest });
    }

    pub fn len(&self) -> usize {
        self.summary.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.summary.entries.is_empty()
    }

    /// `None` when the entries break a bound or name an address twice (a state
    /// Terraform would not write): such a version records no timeline.
    pub fn build(self) -> Option<ResourceSummary> {
        let mut summary = self.summary;
        if self.broken || summary.entries.len() > MAX_ADDRESSES {
            return None;
        }
        // A stable sort finds the runs already in order (Terraform writes resources
        // sorted, and most instances in index order), so it compares far fewer
        // addresses than an unstable one on a large state.
        let text = &summary.text;
        let address = |e: &Entry| &text[e.at..e.at + e.len];
        summary.entries.sort_by(|a, b| address(a).cmp(address(b)));
        if summary
            .entries
            .windows(2)
            .any(|w| address(&w[0]) == address(&w[1]))
        {
            return None;
        }
        Some(summary)
    }
}

impl ResourceSummary {
    /// `None` when the entries break a bound or name an address twice.
    pub fn from_entries(entries: Vec<(String, [u8; DIGEST_LEN])>) -> Option<Self> {
        if entries.len() > MAX_ADDRESSES {
            return None;
        }
        let mut builder = SummaryBuilder::default();
        for (address, digest) in &entries {
            builder.push(&[address], *digest);
        }
        builder.build()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Each instance's address and digest, in address order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8; DIGEST_LEN])> + '_ {
        self.entries.iter().map(|e| (self.address(e), &e.digest))
    }

    fn address(&self, entry: &Entry) -> &str {
        &self.text[entry.at..entry.at + entry.len]
    }

    /// The digest of `address`, if the state has that instance.
    fn digest_of(&self, address: &str) -> Option<&[u8; DIGEST_LEN]> {
        self.entries
            .binary_search_by(|e| self.address(e).cmp(address))
            .ok()
            .map(|i| &self.entries[i].digest)
    }

    /// What the summary holds in memory, for the cache's bound.
    fn heap_bytes(&self) -> usize {
        self.text.capacity() + self.entries.capacity() * std::mem::size_of::<Entry>()
    }

    /// `u16 length ‖ address ‖ digest`, repeated: the earlier release's
    /// `resource_digests.summary` blob, which [`migrate`] reads.
    #[cfg(test)]
    fn encode(&self) -> Vec<u8> {
        let size = self.iter().map(|(a, _)| 2 + a.len() + DIGEST_LEN).sum();
        let mut out = Vec::with_capacity(size);
        for (address, digest) in self.iter() {
            // Bounded by MAX_ADDRESS_LEN, far below u16::MAX.
            out.extend_from_slice(&(address.len() as u16).to_be_bytes());
            out.extend_from_slice(address.as_bytes());
            out.extend_from_slice(digest);
        }
        out
    }

    /// `None` for bytes the earlier release did not write (then nothing is known).
    fn decode(mut bytes: &[u8]) -> Option<Self> {
        let mut entries = Vec::new();
        while !bytes.is_empty() {
            let len = usize::from(u16::from_be_bytes(bytes.get(..2)?.try_into().ok()?));
            let address = std::str::from_utf8(bytes.get(2..2 + len)?)
                .ok()?
                .to_string();
            let digest = bytes.get(2 + len..2 + len + DIGEST_LEN)?.try_into().ok()?;
            entries.push((address, digest));
            bytes = &bytes[2 + len + DIGEST_LEN..];
        }
        Self::from_entries(entries)
    }
}

/// What a version did to one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    Added,
    Changed,
    Removed,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Changed => "changed",
            Change::Removed => "removed",
        }
    }

    fn parse(text: &str) -> Option<Change> {
        [Change::Added, Change::Changed, Change::Removed]
            .into_iter()
            .find(|c| c.as_str() == text)
    }
}

/// How many addresses a version added, changed and removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ChangeCounts {
    pub added: i64,
    pub changed: i64,
    pub removed: i64,
}

/// What `next` did relative to `prev`, by address (one merge of two sorted lists).
pub fn diff(prev: &ResourceSummary, next: &ResourceSummary) -> Vec<(String, Change)> {
    use std::cmp::Ordering;
    let (mut a, mut b) = (prev.iter().peekable(), next.iter().peekable());
    let mut out = Vec::new();
    loop {
        let change = match (a.peek(), b.peek()) {
            (None, None) => return out,
            (Some((addr, _)), None) => (addr, Change::Removed, true, false),
            (None, Some((addr, _))) => (addr, Change::Added, false, true),
            (Some((x, dx)), Some((y, dy))) => match x.cmp(y) {
                Ordering::Less => (x, Change::Removed, true, false),
                Ordering::Greater => (y, Change::Added, false, true),
                Ordering::Equal if dx == dy => {
                    a.next();
                    b.next();
                    continue;
                }
                Ordering::Equal => (x, Change::Changed, true, true),
            },
        };
        let (address, kind, step_a, step_b) = change;
        out.push((address.to_string(), kind));
        if step_a {
            a.next();
        }
        if step_b {
            b.next();
        }
    }
}

pub fn counts(changes: &[(String, Change)]) -> ChangeCounts {
    let mut counts = ChangeCounts::default();
    for (_, change) in changes {
        match change {
            Change::Added => counts.added += 1,
            Change::Changed => counts.changed += 1,
            Change::Removed => counts.removed += 1,
        }
    }
    counts
}

/// Scans content piece by piece into its resource summary (`tfstate`'s scanner). The
/// store calls it for content it restores or rebuilds, never reading states itself.
pub trait Summarize: Send {
    fn push(&mut self, piece: &[u8]);
    /// The summary, or `None` when the content has none the server can read.
    fn finish(self: Box<Self>) -> Option<ResourceSummary>;
}

/// A fresh summarizer keyed for one scope (`key` is that scope's
/// `SealKey::resource_digest_key`).
pub type Summarizer = fn(key: [u8; 32]) -> Box<dyn Summarize>;

/// The summary of content held whole (a move's new states), by `summarize`.
pub fn summarize_whole(
    mut summarize: Box<dyn Summarize>,
    content: &[u8],
) -> Option<ResourceSummary> {
    summarize.push(content);
    summarize.finish()
}

/// The summary kept for a scope: (the version it was kept for, the summary or `None`
/// when unknown); `None` when nothing is kept.
pub type KeptSummary = Option<(i64, Option<Arc<ResourceSummary>>)>;

/// The summary kept for `scope`'s newest version, read from the index.
pub fn prior_summary(
    conn: &Connection,
    scope: &str,
) -> Result<KeptSummary, crate::store::sql::Error> {
    let Some(version) = prior_version(conn, scope)? else {
        return Ok(None);
    };
    let mut stmt = conn.prepare_cached(
        "SELECT address, digest FROM resource_instance_digests WHERE scope = ?1 ORDER BY address",
    )?;
    let mut rows = stmt.query([scope])?;
    let mut builder = SummaryBuilder::default();
    while let Some(row) = rows.next()? {
        // A digest of another length was not written here: nothing is known.
        let Ok(digest) = <[u8; DIGEST_LEN]>::try_from(row.get_ref(1)?.as_blob()?) else {
            return Ok(Some((version, None)));
        };
        builder.push(&[row.get_ref(0)?.as_str()?], digest);
        if builder.len() > MAX_ADDRESSES {
            return Ok(Some((version, None)));
        }
    }
    Ok(Some((version, builder.build().map(Arc::new))))
}

/// The version `prior_summary` was kept for, without reading it (the commit's check
/// that nothing replaced it since it was compared).
pub fn prior_version(
    conn: &Connection,
    scope: &str,
) -> Result<Option<i64>, crate::store::sql::Error> {
    conn.prepare_cached("SELECT version FROM resource_summary_heads WHERE scope = ?1")?
        .query_row([scope], |r| r.get(0))
        .optional()
}

/// Records `version`'s changes (the `resource_changes` rows only).
pub fn record_changes(
    conn: &Connection,
    scope: &str,
    version: i64,
    changes: &[(String, Change)],
) -> Result<(), crate::store::sql::Error> {
    insert_rows(
        conn,
        "INSERT INTO resource_changes (scope, version, address, change) VALUES ",
        "(?, ?, ?, ?)",
        changes,
        |(address, change)| {
            [
                ValueRef::Text(scope.as_bytes()),
                ValueRef::Integer(version),
                ValueRef::Text(address.as_bytes()),
                ValueRef::Text(change.as_str().as_bytes()),
            ]
        },
    )
}

/// Rows per statement of [`insert_rows`]: a first version of a 10,000-instance state
/// writes 20,000 rows, and a statement per row costs more in binding and stepping than
/// in the B-tree (SQLite allows 32,766 parameters a statement).
const ROWS_PER_STATEMENT: usize = 64;

/// Inserts `rows` with `insert` (`INSERT … VALUES `) and one `row` of placeholders per
/// row, [`ROWS_PER_STATEMENT`] rows a statement, the rest one by one (two cached
/// statements whatever the count).
fn insert_rows<'a, R, const N: usize>(
    conn: &Connection,
    insert: &str,
    row: &str,
    rows: &'a [R],
    values: impl Fn(&'a R) -> [ValueRef<'a>; N],
) -> Result<(), crate::store::sql::Error> {
    let mut batches = rows.chunks_exact(ROWS_PER_STATEMENT);
    if rows.len() >= ROWS_PER_STATEMENT {
        let many = format!("{insert}{}", vec![row; ROWS_PER_STATEMENT].join(", "));
        let mut statement = conn.prepare_cached(&many)?;
        for batch in &mut batches {
            let params = batch.iter().flat_map(&values);
            statement.execute(crate::store::sql::params_from_iter(params))?;
        }
    }
    if batches.remainder().is_empty() {
        return Ok(());
    }
    let mut statement = conn.prepare_cached(&format!("{insert}{row}"))?;
    for one in batches.remainder() {
        statement.execute(crate::store::sql::params_from_iter(values(one)))?;
    }
    Ok(())
}

/// Makes `summary` the one the next write of `scope` compares with, replacing whatever
/// was kept (a first version, one compared with nothing known, a rebuild).
pub fn keep_summary(
    conn: &Connection,
    scope: &str,
    version: i64,
    summary: &ResourceSummary,
) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached("DELETE FROM resource_instance_digests WHERE scope = ?1")?
        .execute([scope])?;
    insert_rows(
        conn,
        "INSERT INTO resource_instance_digests (scope, address, digest) VALUES ",
        "(?, ?, ?)",
        &summary.entries,
        |entry| {
            [
                ValueRef::Text(scope.as_bytes()),
                ValueRef::Text(summary.address(entry).as_bytes()),
                ValueRef::Blob(&entry.digest[..]),
            ]
        },
    )?;
    set_head(conn, scope, version)
}

/// Moves the summary kept for `scope` from the version `changes` were computed
/// against to `version`, whose summary is `next`: only the changed addresses' rows are
/// written. The caller has checked that the kept version is the one compared with.
pub fn advance_summary(
    conn: &Connection,
    scope: &str,
    version: i64,
    changes: &[(String, Change)],
    next: &ResourceSummary,
) -> Result<(), crate::store::sql::Error> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO resource_instance_digests (scope, address, digest) VALUES (?1, ?2, ?3)
         ON CONFLICT (scope, address) DO UPDATE SET digest = excluded.digest",
    )?;
    let mut delete = conn.prepare_cached(
        "DELETE FROM resource_instance_digests WHERE scope = ?1 AND address = ?2",
    )?;
    for (address, change) in changes {
        let digest = next.digest_of(address);
        match (change, digest) {
            (Change::Added | Change::Changed, Some(digest)) => {
                upsert.execute(params![scope, address, &digest[..]])?;
            }
            (Change::Removed, None) => {
                delete.execute(params![scope, address])?;
            }
            // Changes not computed against `next`: keep it whole instead.
            _ => return keep_summary(conn, scope, version, next),
        }
    }
    set_head(conn, scope, version)
}

fn set_head(conn: &Connection, scope: &str, version: i64) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached(
        "INSERT INTO resource_summary_heads (scope, version) VALUES (?1, ?2)
         ON CONFLICT (scope) DO UPDATE SET version = excluded.version",
    )?
    .execute(params![scope, version])?;
    Ok(())
}

/// The scope's newest version has no summary: the next write is compared with nothing.
pub fn forget(conn: &Connection, scope: &str) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached("DELETE FROM resource_summary_heads WHERE scope = ?1")?
        .execute([scope])?;
    conn.prepare_cached("DELETE FROM resource_instance_digests WHERE scope = ?1")?
        .execute([scope])?;
    Ok(())
}

/// No scope has a summary kept (a rebuild or restore then keeps the ones it computed).
pub fn forget_all(conn: &Connection) -> Result<(), crate::store::sql::Error> {
    conn.execute_batch("DELETE FROM resource_summary_heads; DELETE FROM resource_instance_digests;")
}

/// The earlier release kept each scope's summary as one blob (`resource_digests`),
/// rewritten whole by every write: its rows become [`keep_summary`]'s, one scope at a
/// time, and the table is dropped. A blob it cannot read keeps nothing for its scope
/// (the next version is compared with nothing known, as for any unknown summary).
pub fn migrate(conn: &Connection) -> Result<(), crate::store::sql::Error> {
    let old: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'resource_digests'",
        [],
        |r| r.get(0),
    )?;
    if old == 0 {
        return Ok(());
    }
    conn.execute_batch(SCHEMA)?;
    let mut stmt = conn.prepare("SELECT scope, version, summary FROM resource_digests")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let (scope, version): (String, i64) = (row.get(0)?, row.get(1)?);
        let bytes: Vec<u8> = row.get(2)?;
        if let Some(summary) = ResourceSummary::decode(&bytes) {
            keep_summary(conn, &scope, version, &summary)?;
        }
    }
    drop(rows);
    drop(stmt);
    conn.execute_batch("DROP TABLE resource_digests")
}

/// Most bytes of summaries [`SummaryCache`] holds (a 10,000-instance summary is ~1 MB
/// in memory).
pub const SUMMARY_CACHE_BYTES: usize = 64 << 20;

/// The summaries the newest versions were stored with, by scope, so the next write
/// compares with them without reading them back from the index. An entry is used only
/// for the (version, sha256) it was stored for: a version row names its content, and a
/// scope's digest key never changes (`SealKey::resource_digest_key`), so an entry is
/// exactly what the index holds for that version, whichever process wrote since. The
/// least recently used entries go first past [`SUMMARY_CACHE_BYTES`].
#[derive(Default)]
pub struct SummaryCache {
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    entries: HashMap<String, Cached>,
    /// Last use -> scope, oldest first.
    by_use: BTreeMap<u64, String>,
    bytes: usize,
    clock: u64,
}

struct Cached {
    version: i64,
    sha256: String,
    summary: Arc<ResourceSummary>,
    bytes: usize,
    used: u64,
}

impl SummaryCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        // The map is consistent after every statement: a panic elsewhere leaves it usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The summary stored for `scope`'s version `version` with content `sha256`.
    pub fn get(&self, scope: &str, version: i64, sha256: &str) -> Option<Arc<ResourceSummary>> {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        let entry = inner.entries.get_mut(scope)?;
        if entry.version != version || entry.sha256 != sha256 {
            return None;
        }
        let (before, summary) = (
            std::mem::replace(&mut entry.used, now),
            entry.summary.clone(),
        );
        inner.by_use.remove(&before);
        inner.by_use.insert(now, scope.to_string());
        Some(summary)
    }

    pub fn put(&self, scope: &str, version: i64, sha256: &str, summary: Arc<ResourceSummary>) {
        let bytes = summary.heap_bytes() + 128;
        let mut inner = self.lock();
        inner.remove(scope);
        if bytes > SUMMARY_CACHE_BYTES {
            return;
        }
        while inner.bytes + bytes > SUMMARY_CACHE_BYTES {
            let Some((_, oldest)) = inner.by_use.pop_first() else {
                break;
            };
            inner.remove(&oldest);
        }
        inner.clock += 1;
        let used = inner.clock;
        inner.by_use.insert(used, scope.to_string());
        inner.bytes += bytes;
        let sha256 = sha256.to_string();
        inner.entries.insert(
            scope.to_string(),
            Cached {
                version,
                sha256,
                summary,
                bytes,
                used,
            },
        );
    }

    pub fn remove(&self, scope: &str) {
        self.lock().remove(scope);
    }
}

impl CacheInner {
    fn remove(&mut self, scope: &str) {
        if let Some(gone) = self.entries.remove(scope) {
            self.by_use.remove(&gone.used);
            self.bytes -= gone.bytes;
        }
    }
}

/// One timeline entry: a change of one address in one version, with who wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelineRow {
    pub version: i64,
    pub address: String,
    pub change: Change,
    pub created_at: String,
    pub writer: String,
    pub lock_who: Option<String>,
    pub lock_operation: Option<String>,
    pub restored_from: Option<i64>,
    /// The version is a move's (`WriteFacts::moved_to` / `moved_from`).
    pub moved_to: Option<String>,
    pub moved_from: Option<String>,
}

impl TimelineRow {
    /// Who else wrote the version, as its row records it.
    pub fn facts(&self) -> crate::store::WriteFacts {
        crate::store::WriteFacts {
            lock_who: self.lock_who.clone(),
            lock_operation: self.lock_operation.clone(),
            restored_from: self.restored_from,
            moved_to: self.moved_to.clone(),
            moved_from: self.moved_from.clone(),
        }
    }
}

/// One address's changes: the address itself, its instances (`[`) and what a module
/// holds (`.`), as three ranges of the (scope, address, version) index, each cut to the
/// newest `?3` before they are merged (the address itself is read newest first straight
/// off the index), then joined with their versions. Named `INDEXED BY`: in one `OR`
/// the planner walked the whole scope in version order instead, which on a workspace
/// with a long history is a walk over all of its changes. Public for the load
/// harness's query-plan check on a 1M-version index.
pub const BY_ADDRESS_SQL: &str = "SELECT c.version, c.address, c.change, v.created_at, v.actor, v.lock_who, v.lock_operation, v.restored_from, v.moved_to, v.moved_from
     FROM (SELECT * FROM (SELECT version, address, change FROM resource_changes INDEXED BY resource_changes_by_address
                           WHERE scope = ?1 AND address = ?2 ORDER BY version DESC LIMIT ?3) exact
           UNION ALL
           SELECT * FROM (SELECT version, address, change FROM resource_changes INDEXED BY resource_changes_by_address
                           WHERE scope = ?1 AND address >= ?2 || '[' AND address < ?2 || '\\'
                           ORDER BY version DESC LIMIT ?3) instances
           UNION ALL
           SELECT * FROM (SELECT version, address, change FROM resource_changes INDEXED BY resource_changes_by_address
                           WHERE scope = ?1 AND address >= ?2 || '.' AND address < ?2 || '/'
                           ORDER BY version DESC LIMIT ?3) inside) c
     JOIN versions v ON v.scope = ?1 AND v.version = c.version
    ORDER BY c.version DESC LIMIT ?3";

/// Every address's changes, newest version first.
pub const ALL_SQL: &str = "SELECT c.version, c.address, c.change, v.created_at, v.actor, v.lock_who, v.lock_operation, v.restored_from, v.moved_to, v.moved_from
     FROM resource_changes c JOIN versions v ON v.scope = c.scope AND v.version = c.version
    WHERE c.scope = ?1
    ORDER BY c.version DESC, c.address DESC LIMIT ?2";

/// `scope`'s changes, newest version first (addresses in order within a version): of
/// `address` and its instances (`address[...]`) and everything inside it when it is a
/// module (`address.…`), or of every address; at most `limit` rows. Found through the
/// table's indexes (the query-plan test in `store::db`).
pub fn timeline_rows(
    conn: &Connection,
    scope: &str,
    address: Option<&str>,
    limit: u32,
) -> Result<Vec<TimelineRow>, crate::store::sql::Error> {
    let limit = limit.min(MAX_TIMELINE_ROWS);
    let map = |r: &crate::store::sql::Row<'_>| {
        let change: String = r.get(2)?;
        Ok(TimelineRow {
            version: r.get(0)?,
            address: r.get(1)?,
            // The table's CHECK admits only these three.
            change: Change::parse(&change).unwrap_or(Change::Changed),
            created_at: r.get(3)?,
            writer: r.get(4)?,
            lock_who: r.get(5)?,
            lock_operation: r.get(6)?,
            restored_from: r.get(7)?,
            moved_to: r.get(8)?,
            moved_from: r.get(9)?,
        })
    };
    let mut rows: Vec<TimelineRow> = match address {
        Some(address) => {
            let mut stmt = conn.prepare_cached(BY_ADDRESS_SQL)?;
            let rows = stmt.query_map(params![scope, address, limit], map)?;
            rows.collect::<Result<_, _>>()?
        }
        None => {
            let mut stmt = conn.prepare_cached(ALL_SQL)?;
            let rows = stmt.query_map(params![scope, limit], map)?;
            rows.collect::<Result<_, _>>()?
        }
    };
    rows.sort_by(|a, b| b.version.cmp(&a.version).then(a.address.cmp(&b.address)));
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(entries: &[(&str, u8)]) -> ResourceSummary {
        ResourceSummary::from_entries(
            entries
                .iter()
                .map(|(a, d)| (a.to_string(), [*d; DIGEST_LEN]))
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn diff_names_each_added_changed_and_removed_address() {
        // (previous, next, expected changes)
        type Case<'a> = (
            &'a [(&'a str, u8)],
            &'a [(&'a str, u8)],
            &'a [(&'a str, Change)],
        );
        let table: &[Case] = &[
            (&[], &[], &[]),
            (&[], &[("a", 1)], &[("a", Change::Added)]),
            (&[("a", 1)], &[], &[("a", Change::Removed)]),
            (&[("a", 1)], &[("a", 1)], &[]),
            (&[("a", 1)], &[("a", 2)], &[("a", Change::Changed)]),
            (
                &[("a", 1), ("b[0]", 1), ("b[1]", 1), ("d", 4)],
                &[("b[0]", 1), ("b[1]", 9), ("c", 3), ("d", 4)],
                &[
                    ("a", Change::Removed),
                    ("b[1]", Change::Changed),
                    ("c", Change::Added),
                ],
            ),
        ];
        for (prev, next, expected) in table {
            let got = diff(&summary(prev), &summary(next));
            let expected: Vec<(String, Change)> =
                expected.iter().map(|(a, c)| (a.to_string(), *c)).collect();
            assert_eq!(got, expected, "{prev:?} -> {next:?}");
        }
    }

    /// Both timeline queries find their rows through an index (no SCAN of either
    /// table), so they cost the same on a 1M-version index as on a small one.
    #[test]
    fn timeline_queries_use_an_index() {
        let conn = crate::store::db::schema_db();
        let sqls = [
            BY_ADDRESS_SQL,
            ALL_SQL,
            "SELECT address, digest FROM resource_instance_digests WHERE scope = ?1 ORDER BY address",
            "SELECT version FROM resource_summary_heads WHERE scope = ?1",
        ];
        for sql in sqls {
            let plan = crate::store::db::query_plan(&conn, sql);
            // No table is scanned (`SCAN exact`, `instances`, `inside` walk one range's
            // rows, already found through the index and limited).
            let range = |step: &String| {
                ["SCAN exact", "SCAN instances", "SCAN inside"]
                    .iter()
                    .any(|r| step.starts_with(r))
            };
            assert!(
                plan.iter()
                    .all(|step| !step.starts_with("SCAN") || range(step)),
                "{sql}: {plan:?}"
            );
            assert!(
                plan.iter().any(|s| s.starts_with("SEARCH c")
                    || s.starts_with("SEARCH resource_changes USING INDEX")
                    || s.starts_with("SEARCH resource_instance_digests")
                    || s.starts_with("SEARCH resource_summary_heads")),
                "{sql}: {plan:?}"
            );
        }
        // One address is read off the (scope, address, version) index, each range too.
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {BY_ADDRESS_SQL}"))
            .unwrap();
        let plan: Vec<String> = stmt
            .query_map(params!["tf/a", "x", 10], |r| r.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let by_address = |s: &&String| {
            s.starts_with("SEARCH resource_changes USING INDEX resource_changes_by_address")
        };
        assert_eq!(plan.iter().filter(by_address).count(), 3, "{plan:?}");
        assert!(
            plan.iter().any(|s| s.contains("(scope=? AND address=?)")),
            "{plan:?}"
        );
        assert!(timeline_rows(&conn, "tf/a", Some("x"), 10)
            .unwrap()
            .is_empty());
        assert!(timeline_rows(&conn, "tf/a", None, 10).unwrap().is_empty());
    }

    #[test]
    fn summaries_are_bounded_and_round_trip() {
        let s = summary(&[("module.x.aws_instance.web[\"a\"]", 7), ("b", 1)]);
        assert_eq!(ResourceSummary::decode(&s.encode()), Some(s.clone()));
        assert_eq!(s.iter().next().unwrap().0, "b", "sorted by address");
        // A duplicate address, too many, or too long: no summary at all.
        let dup = vec![("a".to_string(), [1; DIGEST_LEN]); 2];
        assert_eq!(ResourceSummary::from_entries(dup), None);
        let long = vec![("a".repeat(MAX_ADDRESS_LEN + 1), [1; DIGEST_LEN])];
        assert_eq!(ResourceSummary::from_entries(long), None);
        let many = (0..=MAX_ADDRESSES)
            .map(|i| (i.to_string(), [0; DIGEST_LEN]))
            .collect();
        assert_eq!(ResourceSummary::from_entries(many), None);
        // Bytes it did not write decode to nothing known.
        for bad in [&[0u8][..], &[0, 5, b'a'], &[0, 1, b'a', 1, 2]] {
            assert_eq!(ResourceSummary::decode(bad), None, "{bad:?}");
        }
    }

    /// The summary a write keeps is the same whether the commit rewrites the changed
    /// addresses' rows or all of them, for every kind of change.
    #[test]
    fn advancing_the_kept_summary_matches_keeping_it_whole() {
        let conn = crate::store::db::schema_db();
        let steps: &[&[(&str, u8)]] = &[
            &[("a", 1), ("b[0]", 1), ("b[1]", 1)],
            &[("a", 2), ("b[0]", 1), ("c", 3)],
            &[],
            &[("z", 9)],
        ];
        keep_summary(&conn, "tf/a", 1, &summary(steps[0])).unwrap();
        for (i, pair) in steps.windows(2).enumerate() {
            let (prev, next) = (summary(pair[0]), summary(pair[1]));
            let changes = diff(&prev, &next);
            let version = i as i64 + 2;
            advance_summary(&conn, "tf/a", version, &changes, &next).unwrap();
            assert_eq!(
                prior_summary(&conn, "tf/a").unwrap(),
                Some((version, Some(Arc::new(next))))
            );
        }
        // A change `next` contradicts (a caller's mistake) keeps `next` whole.
        let next = summary(&[("q", 1)]);
        advance_summary(&conn, "tf/a", 9, &[("q".into(), Change::Removed)], &next).unwrap();
        assert_eq!(
            prior_summary(&conn, "tf/a").unwrap(),
            Some((9, Some(Arc::new(next))))
        );
        forget(&conn, "tf/a").unwrap();
        assert_eq!(prior_summary(&conn, "tf/a").unwrap(), None);
    }

    /// Many rows go in batches and the rest one by one: every count around a batch's
    /// size reads back exactly, digests and changes alike.
    #[test]
    fn many_rows_are_kept_and_recorded_whole() {
        let conn = crate::store::db::schema_db();
        for n in [
            0,
            1,
            ROWS_PER_STATEMENT - 1,
            ROWS_PER_STATEMENT,
            2 * ROWS_PER_STATEMENT + 5,
        ] {
            let names: Vec<String> = (0..n).map(|i| format!("r.x[{i:04}]")).collect();
            let entries: Vec<(&str, u8)> = names.iter().map(|a| (a.as_str(), 7)).collect();
            let whole = summary(&entries);
            let scope = format!("tf/n{n}");
            keep_summary(&conn, &scope, 1, &whole).unwrap();
            assert_eq!(
                prior_summary(&conn, &scope).unwrap(),
                Some((1, Some(Arc::new(whole.clone()))))
            );
            let changes = diff(&ResourceSummary::default(), &whole);
            record_changes(&conn, &scope, 1, &changes).unwrap();
            let rows: Vec<(String, String)> = conn
                .prepare("SELECT address, change FROM resource_changes WHERE scope = ?1 ORDER BY address")
                .unwrap()
                .query_map([&scope], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let expected: Vec<(String, String)> = names
                .iter()
                .map(|a| (a.clone(), "added".to_string()))
                .collect();
            assert_eq!(rows, expected, "{n} rows");
        }
    }

    /// The earlier release's one-blob-per-scope summaries become rows: a readable blob
    /// is the same summary after, an unreadable one keeps nothing, and the old table is
    /// gone (so migrating again is a no-op).
    #[test]
    fn the_earlier_releases_summary_blobs_become_rows() {
        let conn = Connection::open_in_memory().unwrap();
        let kept = summary(&[("module.m.x[\"k\"]", 4), ("a", 1)]);
        conn.execute_batch(
            "CREATE TABLE resource_digests (scope TEXT PRIMARY KEY, version INTEGER NOT NULL, summary BLOB NOT NULL) WITHOUT ROWID;",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO resource_digests VALUES ('tf/a', 7, ?1), ('tf/b', 2, x'0005')",
            [kept.encode()],
        )
        .unwrap();
        for _ in 0..2 {
            migrate(&conn).unwrap();
            assert_eq!(
                prior_summary(&conn, "tf/a").unwrap(),
                Some((7, Some(Arc::new(kept.clone()))))
            );
            assert_eq!(prior_summary(&conn, "tf/b").unwrap(), None);
        }
        let old: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'resource_digests'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(old, 0);
    }

    #[test]
    fn the_summary_cache_answers_only_for_the_version_it_was_stored_for() {
        let cache = SummaryCache::default();
        let s = Arc::new(summary(&[("a", 1)]));
        cache.put("tf/a", 3, "sha-3", s.clone());
        assert_eq!(cache.get("tf/a", 3, "sha-3"), Some(s.clone()));
        // Another version, the same number with other content (a restored index), another scope.
        assert_eq!(cache.get("tf/a", 4, "sha-3"), None);
        assert_eq!(cache.get("tf/a", 3, "sha-x"), None);
        assert_eq!(cache.get("tf/b", 3, "sha-3"), None);
        cache.remove("tf/a");
        assert_eq!(cache.get("tf/a", 3, "sha-3"), None);
        // Bounded: filling it past its bytes drops the least recently used first.
        let big = Arc::new(
            ResourceSummary::from_entries(
                (0..50_000)
                    .map(|i| (format!("{i:0>450}"), [0; DIGEST_LEN]))
                    .collect(),
            )
            .unwrap(),
        );
        cache.put("tf/old", 1, "s", big.clone());
        cache.put("tf/hot", 1, "s", big.clone());
        assert!(cache.get("tf/old", 1, "s").is_some());
        cache.put("tf/new", 1, "s", big.clone());
        assert!(
            cache.get("tf/hot", 1, "s").is_none(),
            "least recently used is dropped"
        );
        assert!(cache.get("tf/old", 1, "s").is_some());
        assert!(cache.get("tf/new", 1, "s").is_some());
        assert!(cache.lock().bytes <= SUMMARY_CACHE_BYTES);
    }
}
