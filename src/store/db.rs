//! The index's connections, SQLite or PostgreSQL: the pair every table lives behind
//! (the version index and the audit log are this module's; the APIs bring their own
//! tables, see `crate::schema`).
//!
//! One writer thread owns the only read-write connection. Jobs queue on a channel;
//! the writer takes every job waiting, runs each in its own SAVEPOINT inside one
//! `BEGIN IMMEDIATE` transaction and commits once (group commit), so N concurrent
//! writes cost one fsync while each still sees the effects of the ones before it.
//! Replies go out only after COMMIT returned: a reply means durable.
//! Reads use a few separate connections (WAL lets them run beside the writer), so one
//! long read (a retention scan of a big index) does not hold up every GET.

use std::any::Any;
use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use crate::store::sql::Connection;
use tokio::sync::oneshot;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// A statement of the index (SQLite or PostgreSQL) failed.
    #[error("database error: {0}")]
    Sql(#[from] crate::store::sql::Error),
    #[error("database writer has stopped")]
    WriterGone,
    /// The write transaction could not begin (the database is unreachable): nothing ran.
    #[error("the index could not begin a write transaction: {0}")]
    NotBegun(String),
    #[error("database task failed: {0}")]
    Task(String),
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        DbError::Sql(e.into())
    }
}

/// Most jobs folded into one transaction by default.
pub const DEFAULT_MAX_GROUP: usize = 128;

/// The engine's own tables: the version index and the audit log (`audit.rs`).
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS versions (
    scope       TEXT    NOT NULL,
    version     INTEGER NOT NULL,
    serial      INTEGER,
    lineage     TEXT,
    sha256      TEXT,
    size        INTEGER NOT NULL,
    blob_key    TEXT,            -- NULL marks a tombstone (the state was deleted)
    created_at  TEXT    NOT NULL,
    actor       TEXT    NOT NULL, -- the credential that wrote it (`Credential::name`, `operator:<name>`)
    -- Who else the writer was (NULL in rows of earlier releases; see `migrate`): the
    -- lock's client-supplied Who/Operation, the version a rollback/restore brought back.
    lock_who       TEXT,
    lock_operation TEXT,
    restored_from  INTEGER,
    -- A move's versions: the workspace the resources went to (source) or came from
    -- (destination).
    moved_to       TEXT,
    moved_from     TEXT,
    -- What it did to resources (`store::timeline`); NULL: not known.
    res_added      INTEGER,
    res_changed    INTEGER,
    res_removed    INTEGER,
    -- The data key generation its blob is sealed under (the header names the same);
    -- NULL: a tombstone, or a row an earlier release wrote.
    key_gen        INTEGER,
    PRIMARY KEY (scope, version)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS audit (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at          TEXT NOT NULL,
    actor       TEXT NOT NULL,
    org         TEXT,
    scope       TEXT NOT NULL,
    event       TEXT NOT NULL,
    payload     TEXT NOT NULL
);

-- `admin audit list --scope` walks one scope's rows newest first instead of the whole log.
CREATE INDEX IF NOT EXISTS audit_by_scope ON audit (scope, id);
-- The audit page lists the event kinds present with one seek per kind (a skip scan).
CREATE INDEX IF NOT EXISTS audit_by_event ON audit (event);
"#;

/// The `versions` columns added after the first release, which an earlier release's
/// table gets (NULL in its rows: shown as before).
const ADDED_VERSION_COLUMNS: &[(&str, &str)] = &[
    ("lock_who", "TEXT"),
    ("lock_operation", "TEXT"),
    ("restored_from", "INTEGER"),
    ("res_added", "INTEGER"),
    ("res_changed", "INTEGER"),
    ("res_removed", "INTEGER"),
    ("moved_to", "TEXT"),
    ("moved_from", "TEXT"),
    ("key_gen", "INTEGER"),
];

/// [`SCHEMA`] for PostgreSQL (`crate::schema::postgres`): the same tables, and the
/// columns added since the first release that had a PostgreSQL index (a move's
/// `moved_to`/`moved_from`, the blob's `key_gen`), which an index an earlier release made lacks. PostgreSQL
/// adds a column only where it is missing (`IF NOT EXISTS`), so this is idempotent.
pub fn postgres_schema() -> Result<String, String> {
    Ok(crate::store::sql::postgres_ddl(SCHEMA)? + POSTGRES_ADDED_COLUMNS)
}

const POSTGRES_ADDED_COLUMNS: &str = r#"
ALTER TABLE versions ADD COLUMN IF NOT EXISTS moved_to TEXT COLLATE "C";
ALTER TABLE versions ADD COLUMN IF NOT EXISTS moved_from TEXT COLLATE "C";
ALTER TABLE versions ADD COLUMN IF NOT EXISTS key_gen INTEGER;
"#;

/// Migration (`crate::schema::MIGRATIONS`): adds [`ADDED_VERSION_COLUMNS`] that an
/// earlier release's `versions` lacks. Idempotent; a database without the table is
/// left to [`SCHEMA`].
pub fn migrate(conn: &Connection) -> Result<(), crate::store::sql::Error> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('versions')")?;
    let present: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if present.is_empty() {
        return Ok(());
    }
    for (name, kind) in ADDED_VERSION_COLUMNS {
        if !present.iter().any(|p| p == name) {
            conn.execute_batch(&format!("ALTER TABLE versions ADD COLUMN {name} {kind}"))?;
        }
    }
    Ok(())
}

type Completion = Box<dyn FnOnce(Result<(), String>) + Send>;

/// Where the writer runs a job: on its connection, with other jobs in the same
/// transaction (`shared`: in a savepoint of its own) or alone in it (no savepoint: a
/// failed job's transaction is rolled back instead, two statements fewer; on
/// PostgreSQL two round trips fewer for every lone write).
#[derive(Clone, Copy)]
struct Slot<'c> {
    conn: &'c Connection,
    shared: bool,
}

/// What running a job left: whether it failed, and how to complete it once the
/// transaction has ended.
struct Ran {
    failed: bool,
    complete: Completion,
}

/// A write: run in its slot, or told it never ran (`None`: the transaction could not
/// begin), then completed with the commit's outcome.
type Job = Box<dyn FnOnce(Option<Slot<'_>>) -> Ran + Send>;

#[derive(Clone)]
pub struct Db {
    writer: mpsc::Sender<Job>,
    readers: Arc<Readers>,
    stats: Arc<WriterStats>,
}

/// Opens a new connection to a database server in place of one that broke
/// (PostgreSQL; a SQLite connection does not break).
type Reopen = Arc<dyn Fn() -> Result<Connection, DbError> + Send + Sync>;

/// Read-only work shares a few connections: a read takes the first idle one.
struct Readers {
    conns: Vec<Mutex<Reader>>,
    next: std::sync::atomic::AtomicUsize,
    reopen: Option<Reopen>,
    /// Whether a short lookup may run right on the calling (async runtime) thread:
    /// SQLite's yes; the PostgreSQL client blocks on a runtime of its own, which tokio
    /// refuses inside another, so its reads always go to the blocking pool.
    inline: bool,
}

/// A reader connection and the lookups remembered on it ([`Db::read_remembered`]).
struct Reader {
    conn: Connection,
    remembered: Remembered,
}

/// Answers of lookups read on one connection, all read while its `data_version` was
/// `version`: SQLite changes that number on the connection's next read after any other
/// connection commits (this process's writer, or a CLI command on the same data dir),
/// so while it is unchanged every answer here is what a fresh read would return.
#[derive(Default)]
struct Remembered {
    version: Option<i64>,
    answers: HashMap<String, Box<dyn Any + Send>>,
    /// What `answers` weighs ([`Weigh`], plus the keys).
    bytes: usize,
}

/// What the answers remembered on one reader connection may weigh together: past it
/// they are all forgotten (the next lookups read again), so the memory is bounded
/// whatever the answers hold (a LOCK's answer carries the holder's LockInfo, up to
/// 64 KiB).
const REMEMBERED_BYTES: usize = 256 * 1024;
/// What an answer costs besides its weight (the map's entry, the box).
const ANSWER_OVERHEAD: usize = 64;

/// Roughly what a remembered answer holds on the heap, in bytes.
pub trait Weigh {
    fn weight(&self) -> usize;
}

impl Weigh for () {
    fn weight(&self) -> usize {
        0
    }
}

impl Weigh for u64 {
    fn weight(&self) -> usize {
        0
    }
}

impl<T: Weigh> Weigh for Option<T> {
    fn weight(&self) -> usize {
        self.as_ref().map_or(0, Weigh::weight)
    }
}

impl<A: Weigh, B: Weigh> Weigh for (A, B) {
    fn weight(&self) -> usize {
        self.0.weight() + self.1.weight()
    }
}

impl Remembered {
    /// The answer to `key` if it was read since the database last changed; forgets
    /// every answer when it changed.
    fn recall<T: Clone + 'static>(&mut self, now: i64, key: &str) -> Option<T> {
        if self.version != Some(now) {
            self.forget();
            self.version = Some(now);
            return None;
        }
        self.answers.get(key)?.downcast_ref::<T>().cloned()
    }

    fn keep<T: Weigh + Send + 'static>(&mut self, key: &str, answer: T) {
        let cost = answer.weight() + key.len() + ANSWER_OVERHEAD;
        if cost > REMEMBERED_BYTES / 4 {
            return; // one answer never takes most of the room
        }
        if self.bytes + cost > REMEMBERED_BYTES {
            self.forget();
        }
        // A miss came before, so `key` is not there: nothing is replaced uncounted.
        self.bytes += cost;
        self.answers.insert(key.to_string(), Box::new(answer));
    }

    fn forget(&mut self) {
        self.answers.clear();
        self.bytes = 0;
    }
}

/// Reader connections per database: the blocking pool runs reads beside each other,
/// and one slow scan leaves the others free.
const READERS: usize = 4;

/// Prepared statements kept per connection (the write path prepares about ten kinds).
const STATEMENT_CACHE: usize = 64;

impl Readers {
    /// An idle connection right now, for a lookup on the calling thread.
    fn idle_inline(&self) -> Option<std::sync::MutexGuard<'_, Reader>> {
        self.inline.then(|| self.try_idle()).flatten()
    }

    /// An idle connection, if there is one right now.
    fn try_idle(&self) -> Option<std::sync::MutexGuard<'_, Reader>> {
        let mut reader = self.conns.iter().find_map(|conn| conn.try_lock().ok())?;
        self.mend(&mut reader);
        Some(reader)
    }

    /// Replaces a broken connection (the server restarted or failed over) with a new
    /// one; when that fails too, the read fails with the broken one's error.
    fn mend(&self, reader: &mut Reader) {
        if reader.conn.is_broken() {
            self.reconnect(reader);
        }
    }

    /// Opens a new connection in place of `reader`'s (a server's only); whether it did.
    fn reconnect(&self, reader: &mut Reader) -> bool {
        let Some(reopen) = &self.reopen else {
            return false;
        };
        match reopen() {
            Ok(conn) => {
                reader.conn = conn;
                reader.remembered = Remembered::default();
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot reconnect a reader to the index");
                false
            }
        }
    }

    /// Runs `f` on a reader, waiting for one in turn. A read that finds its session
    /// ended by the server (a restart, a failover: a connection idle since then does
    /// not know until it is used) runs once more on a new connection: a read changes
    /// nothing, so running it again is safe, and no request fails for a connection
    /// that broke while it waited.
    fn run<T>(
        &self,
        f: impl Fn(&mut Reader) -> Result<T, crate::store::sql::Error>,
    ) -> Result<T, crate::store::sql::Error> {
        let mut reader = self.acquire();
        match f(&mut reader) {
            Err(e) if e.is_connection_lost() || reader.conn.is_broken() => {
                match self.reconnect(&mut reader) {
                    true => f(&mut reader),
                    false => Err(e),
                }
            }
            read => read,
        }
    }

    /// An idle connection if there is one, else waits for one in turn.
    fn acquire(&self) -> std::sync::MutexGuard<'_, Reader> {
        use std::sync::atomic::Ordering::Relaxed;
        if let Some(idle) = self.try_idle() {
            return idle;
        }
        let i = self.next.fetch_add(1, Relaxed) % self.conns.len();
        let mut reader = self.conns[i]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.mend(&mut reader);
        reader
    }
}

/// Counters of the writer thread: `jobs / commits` is the mean group size.
#[derive(Debug, Default)]
pub struct WriterStats {
    pub commits: std::sync::atomic::AtomicU64,
    pub jobs: std::sync::atomic::AtomicU64,
}

fn open_connection(path: &Path) -> Result<Connection, crate::store::sql::Error> {
    let conn = rusqlite::Connection::open(path)?;
    // Owner-only, before WAL mode creates -wal/-shm (SQLite gives them the db's mode).
    restrict_to_owner(path);
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // FULL: with WAL, NORMAL may lose the last commits on power loss. A 200 must survive that.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn.into())
}

/// Makes a database file readable by this user only (it holds tokens' hashes, sessions,
/// the audit log); a failure is logged, not fatal.
pub(crate) fn restrict_to_owner(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        tracing::warn!(path = %path.display(), error = %e, "cannot make the database owner-only");
    }
}

impl Db {
    /// Opens (creating if needed) the database and applies `schemas`, in order. The
    /// application's database is opened with every schema by `crate::schema::open_db`.
    pub fn open(path: &Path, schemas: &[&str]) -> Result<Db, DbError> {
        Self::open_with_group_limit(path, schemas, DEFAULT_MAX_GROUP)
    }

    /// `max_group = 1` disables group commit (one fsync per write): the benchmark baseline.
    pub fn open_with_group_limit(
        path: &Path,
        schemas: &[&str],
        max_group: usize,
    ) -> Result<Db, DbError> {
        let writer_conn = open_connection(path)?;
        for schema in schemas {
            writer_conn.execute_batch(schema)?;
        }
        // Checkpoints run on their own thread (below), not inside a client's commit:
        // with a large index a checkpoint writes back scattered pages and fsyncs the
        // database file, and that must not land on whichever write crossed the limit.
        if let Some(sqlite) = writer_conn.as_sqlite() {
            sqlite.pragma_update(None, "wal_autocheckpoint", 0)?;
        }
        let checkpoints = spawn_checkpointer(open_connection(path)?)?;
        Self::start(
            writer_conn,
            || Ok(open_connection(path)?),
            max_group,
            Some(checkpoints),
            None,
        )
    }

    /// Opens the index on PostgreSQL at `url` (`ca_file`: the PEM roots its TLS
    /// certificate is checked against) and applies `schemas` in one write transaction,
    /// so nodes starting together apply them one after the other. The same writer
    /// thread and group commit as on SQLite; its transaction takes the index's write
    /// lock first (`sql::Connection::begin_write`), so the writers of every node run
    /// one at a time. A connection that breaks is replaced before its next use.
    pub fn open_postgres(
        url: &str,
        ca_file: Option<&Path>,
        schemas: &[String],
    ) -> Result<Db, DbError> {
        // Off any async runtime (see `Readers::inline`): a thread of its own.
        std::thread::scope(|s| {
            s.spawn(|| Self::open_postgres_here(url, ca_file, schemas))
                .join()
                .unwrap_or_else(|_| Err(DbError::Task("opening the index panicked".into())))
        })
    }

    fn open_postgres_here(
        url: &str,
        ca_file: Option<&Path>,
        schemas: &[String],
    ) -> Result<Db, DbError> {
        let reopen: Reopen = {
            let (url, ca_file) = (url.to_string(), ca_file.map(Path::to_path_buf));
            Arc::new(move || {
                Connection::connect_postgres(&url, ca_file.as_deref()).map_err(DbError::Task)
            })
        };
        let writer_conn = reopen()?;
        let fsync: String = writer_conn.query_row("SHOW fsync", [], |r| r.get(0))?;
        if fsync != "on" {
            return Err(DbError::Task(
                "PostgreSQL runs with fsync = off: a commit it acknowledges may not survive a crash, so stategate will not use it".into(),
            ));
        }
        judge_clock(clock_skew(&writer_conn, crate::clock::now_ms)?)
            .map_err(|why| DbError::Task(format!("{why}, and start again")))?;
        writer_conn.begin_write()?;
        for schema in schemas {
            writer_conn.execute_batch(schema)?;
        }
        writer_conn.end_transaction(true)?;
        Self::start(
            writer_conn,
            &*reopen,
            DEFAULT_MAX_GROUP,
            None,
            Some(reopen.clone()),
        )
    }

    /// The reader connections (`open_reader`) and the writer thread on `writer_conn`,
    /// for either database. Lookups run inline only on SQLite (see `Readers::inline`).
    fn start(
        writer_conn: Connection,
        open_reader: impl Fn() -> Result<Connection, DbError>,
        max_group: usize,
        checkpoints: Option<mpsc::SyncSender<()>>,
        reopen: Option<Reopen>,
    ) -> Result<Db, DbError> {
        let inline = writer_conn.dialect() == crate::store::sql::Dialect::Sqlite;
        let conns = (0..READERS)
            .map(|_| {
                open_reader().map(|conn| {
                    Mutex::new(Reader {
                        conn,
                        remembered: Remembered::default(),
                    })
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (tx, rx) = mpsc::channel::<Job>();
        let stats = Arc::new(WriterStats::default());
        std::thread::Builder::new()
            .name(
                if inline {
                    "sqlite-writer"
                } else {
                    "postgres-writer"
                }
                .into(),
            )
            .spawn({
                let (stats, reopen) = (stats.clone(), reopen.clone());
                move || {
                    writer_loop(
                        writer_conn,
                        rx,
                        max_group.max(1),
                        &stats,
                        checkpoints,
                        reopen,
                    )
                }
            })
            .map_err(|e| DbError::Task(e.to_string()))?;
        Ok(Db {
            writer: tx,
            readers: Arc::new(Readers {
                conns,
                next: Default::default(),
                reopen,
                inline,
            }),
            stats,
        })
    }

    /// Measures this node's clock against a PostgreSQL index's again and records the
    /// verdict (`tokens::judge_clock`): past [`CLOCK_SKEW_MAX_MS`] the node distrusts
    /// its clock, back within it trusts it again. Every node runs it, at least every
    /// [`CLOCK_CHECK_EVERY`], since a clock can step at any time after the index was
    /// opened. A SQLite index shares the machine's one clock: nothing to compare.
    pub async fn check_clock(&self) -> Result<(), DbError> {
        if self.readers.inline {
            return Ok(());
        }
        let skew = self
            .read(|conn| clock_skew(conn, crate::clock::now_ms))
            .await?;
        crate::clock::judge_clock(judge_clock(skew).err());
        Ok(())
    }

    /// Runs `f` inside the writer's transaction; resolves after the commit is durable.
    /// When `f` returns `Err`, its changes are rolled back and nothing else is affected.
    pub async fn write<T, E>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<DbError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel::<Result<T, E>>();
        let job: Job = Box::new(move |slot| {
            let outcome = slot.map(|Slot { conn, shared }| match shared {
                true => run_in_savepoint(conn, f),
                false => f(conn),
            });
            let failed = matches!(outcome, Some(Err(_)));
            let complete: Completion = Box::new(move |committed: Result<(), String>| {
                let result = match (committed, outcome) {
                    (_, Some(Err(e))) => Err(e),
                    (Ok(()), Some(Ok(value))) => Ok(value),
                    (Err(msg), Some(Ok(_))) => {
                        Err(E::from(DbError::Task(format!("commit failed: {msg}"))))
                    }
                    (committed, None) => Err(E::from(DbError::NotBegun(
                        committed.err().unwrap_or_default(),
                    ))),
                };
                let _ = reply.send(result);
            });
            Ran { failed, complete }
        });
        self.writer
            .send(job)
            .map_err(|_| E::from(DbError::WriterGone))?;
        answer.await.map_err(|_| E::from(DbError::WriterGone))?
    }

    pub fn writer_stats(&self) -> &WriterStats {
        &self.stats
    }

    /// Runs a short read-only lookup (a few index pages: the newest row of a scope, a
    /// lock row) right here when a reader connection is idle, else like [`Db::read`].
    /// On a request's path this saves two thread handoffs, which cost more than the
    /// lookup itself; anything that may scan goes through [`Db::read`].
    pub async fn read_quick<T: Send + 'static>(
        &self,
        f: impl Fn(&Connection) -> Result<T, crate::store::sql::Error> + Send + 'static,
    ) -> Result<T, DbError> {
        self.on_reader(true, move |reader| f(&reader.conn)).await
    }

    /// [`Db::read_snapshot`] of a lookup whose answer depends on the database alone
    /// (never on the time or on a caller's secret): the answer read last on the same
    /// connection under `key` when no commit happened since, else a fresh read. Costs
    /// one `PRAGMA data_version` when remembered (a LOCK refused while another client
    /// holds the lock is answered without reading its rows again). `key` names the
    /// lookup and everything it reads by, e.g. `"lock:<workspace>"`.
    pub async fn read_remembered<T: Clone + Weigh + Send + 'static>(
        &self,
        key: String,
        f: impl Fn(&Connection) -> Result<T, crate::store::sql::Error> + Send + 'static,
    ) -> Result<T, DbError> {
        self.on_reader(true, move |reader| {
            // Read before the snapshot: a commit in between leaves an answer newer
            // than its version, which is only read again, never kept too long.
            let Some(version) = reader.conn.change_count()? else {
                return in_read_transaction(&reader.conn, &f);
            };
            if let Some(answer) = reader.remembered.recall(version, &key) {
                return Ok(answer);
            }
            let answer = in_read_transaction(&reader.conn, &f)?;
            reader.remembered.keep(&key, answer.clone());
            Ok(answer)
        })
        .await
    }

    /// [`Db::read_quick`] with all of `f`'s statements in one read transaction: one
    /// snapshot, and one shared lock and WAL read mark instead of one per statement.
    pub async fn read_snapshot<T: Send + 'static>(
        &self,
        f: impl Fn(&Connection) -> Result<T, crate::store::sql::Error> + Send + 'static,
    ) -> Result<T, DbError> {
        self.read_quick(move |conn| in_read_transaction(conn, &f))
            .await
    }

    /// Runs a read-only query on a reader connection off the async runtime.
    pub async fn read<T: Send + 'static>(
        &self,
        f: impl Fn(&Connection) -> Result<T, crate::store::sql::Error> + Send + 'static,
    ) -> Result<T, DbError> {
        self.on_reader(false, move |reader| f(&reader.conn)).await
    }

    /// Runs `f` on a reader: right here when `inline` and one is idle (and the
    /// database allows it, see `Readers::inline`), else on the blocking pool, waiting
    /// for a reader in turn.
    async fn on_reader<T: Send + 'static>(
        &self,
        inline: bool,
        f: impl Fn(&mut Reader) -> Result<T, crate::store::sql::Error> + Send + 'static,
    ) -> Result<T, DbError> {
        if inline {
            if let Some(mut reader) = self.readers.idle_inline() {
                return f(&mut reader).map_err(DbError::from);
            }
        }
        let readers = self.readers.clone();
        tokio::task::spawn_blocking(move || readers.run(f).map_err(DbError::from))
            .await
            .map_err(|e| DbError::Task(e.to_string()))?
    }
}

/// How far this node's clock may be from the index's before a warning, and before the
/// node refuses to start. Nodes sharing an index judge by their own clocks what
/// expires (tokens, UI sessions, reveal tickets, housekeeping claims, lock ages): a
/// node behind the others would accept a token they refuse, one ahead would take over
/// a claim still held. Housekeeping claims outlast their pass by a minute, so a skew
/// under half that never makes a job run twice.
const CLOCK_SKEW_WARN_MS: i64 = 1_000;
pub const CLOCK_SKEW_MAX_MS: i64 = 30_000;
/// How often a node sharing a PostgreSQL index measures its clock against it again.
pub const CLOCK_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// The PostgreSQL server's clock minus this node's (`now_ms`: Unix milliseconds), in
/// milliseconds: the server's time against the middle of the round trip that read it.
pub fn clock_skew(
    conn: &Connection,
    now_ms: impl Fn() -> i64,
) -> Result<i64, crate::store::sql::Error> {
    let before = now_ms();
    let server: i64 = conn.query_row(
        "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        [],
        |r| r.get(0),
    )?;
    let after = now_ms();
    Ok(server.saturating_sub(before / 2 + after / 2))
}

/// Refuses a node whose clock is more than [`CLOCK_SKEW_MAX_MS`] from the index's
/// (`skew_ms`: the server's minus this node's), saying why, and warns past
/// [`CLOCK_SKEW_WARN_MS`].
fn judge_clock(skew_ms: i64) -> Result<(), String> {
    let off = skew_ms.unsigned_abs();
    if off <= CLOCK_SKEW_WARN_MS.unsigned_abs() {
        return Ok(());
    }
    let side = if skew_ms > 0 { "behind" } else { "ahead of" };
    let how = format!(
        "this node's clock is {:.1} s {side} PostgreSQL's",
        off as f64 / 1000.0
    );
    if off > CLOCK_SKEW_MAX_MS.unsigned_abs() {
        return Err(format!(
            "{how}: nodes sharing an index judge tokens, sessions and housekeeping claims by their clocks, so they must agree within {} s; synchronize this machine's clock (NTP)",
            CLOCK_SKEW_MAX_MS / 1000
        ));
    }
    tracing::warn!(
        skew_ms,
        "{how}: synchronize this machine's clock (NTP); nodes sharing an index judge what expires by their clocks"
    );
    Ok(())
}

/// Whether `conn` is in a write transaction: the writer's, where every job runs
/// (`BEGIN IMMEDIATE`), never a reader's, whose transactions only read. Code that judges
/// a write both early on a reader and again in its commit (the write guards, the freeze
/// check) records what it finds only here.
pub fn in_write_transaction(conn: &Connection) -> bool {
    conn.in_write_transaction()
}

/// Runs `f`'s statements in one deferred read transaction on a reader connection.
fn in_read_transaction<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, crate::store::sql::Error>,
) -> Result<T, crate::store::sql::Error> {
    if conn.in_transaction() {
        // Left open by a lookup that did not finish (a panic): start from a clean state.
        conn.end_transaction(false)?;
    }
    conn.begin_read()?;
    let outcome = f(conn);
    // A read transaction changes nothing: ending it cannot lose anything.
    let ended = conn.end_transaction(false);
    let value = outcome?;
    ended?;
    Ok(value)
}

/// Runs one job of a group in a savepoint so its failure rolls back only its own
/// changes.
fn run_in_savepoint<T, E: From<DbError>>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, E>,
) -> Result<T, E> {
    conn.savepoint().map_err(|e| E::from(DbError::from(e)))?;
    let outcome = f(conn);
    let end = match outcome {
        // RELEASE fails when a statement of the job failed and its code went on (on
        // PostgreSQL that aborts the transaction): undone then, as a failed job is,
        // so the group's other jobs go on.
        Ok(_) => conn.release_savepoint().inspect_err(|_| {
            let _ = conn.rollback_to_savepoint();
        }),
        Err(_) => conn.rollback_to_savepoint(),
    };
    end.map_err(|e| E::from(DbError::from(e)))?;
    outcome
}

/// How long the checkpointer lets commits gather before it copies them into the
/// database file: one checkpoint (two fsyncs) then covers many commits, about as often
/// as SQLite's own 1000-page autocheckpoint would run under load.
const CHECKPOINT_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

/// Starts the thread that copies committed WAL frames into the database file
/// (`PRAGMA wal_checkpoint(PASSIVE)`: it never blocks the writer or a reader). It runs
/// a while after commits happened and ends when the writer does (the sender drops).
fn spawn_checkpointer(conn: Connection) -> Result<mpsc::SyncSender<()>, DbError> {
    let (tx, rx) = mpsc::sync_channel::<()>(1);
    std::thread::Builder::new()
        .name("sqlite-checkpoint".into())
        .spawn(move || {
            while rx.recv().is_ok() {
                std::thread::sleep(CHECKPOINT_DELAY);
                while rx.try_recv().is_ok() {}
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    tracing::warn!(error = %e, "WAL checkpoint failed; it is retried after the next commit");
                }
            }
        })
        .map_err(|e| DbError::Task(e.to_string()))?;
    Ok(tx)
}

fn writer_loop(
    mut conn: Connection,
    jobs: mpsc::Receiver<Job>,
    max_group: usize,
    stats: &WriterStats,
    checkpoints: Option<mpsc::SyncSender<()>>,
    reopen: Option<Reopen>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < max_group {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut begun = conn.begin_write();
        if let (Err(e), Some(reopen)) = (&begun, &reopen) {
            // The server ended the session (a restart, a failover; or a commit broke it)
            // since the last group: this group runs on a new connection rather than failing.
            if e.is_connection_lost() || conn.is_broken() {
                match reopen() {
                    Ok(new) => {
                        conn = new;
                        begun = conn.begin_write();
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot reconnect the writer to the index")
                    }
                }
            }
        }
        if let Err(e) = begun {
            let msg = e.to_string();
            tracing::error!(error = %msg, "cannot begin write transaction");
            for job in batch {
                // Run nothing; every job learns it never ran (retryable).
                (job(None).complete)(Err(msg.clone()));
            }
            continue;
        }
        stats.jobs.fetch_add(batch.len() as u64, Relaxed);
        stats.commits.fetch_add(1, Relaxed);
        let slot = Slot {
            conn: &conn,
            shared: batch.len() > 1,
        };
        let ran: Vec<Ran> = batch.into_iter().map(|job| job(Some(slot))).collect();
        let committed = if !slot.shared && ran.iter().all(|r| r.failed) {
            // A lone job that failed: its transaction is undone, as its savepoint
            // would have been (the job reports its own error).
            conn.end_transaction(false).map_err(|e| e.to_string())
        } else {
            let committed = conn.end_transaction(true).map_err(|e| e.to_string());
            if let Err(msg) = &committed {
                tracing::error!(error = %msg, "commit failed; rolling back the group");
                let _ = conn.end_transaction(false);
            }
            committed
        };
        for r in ran {
            (r.complete)(committed.clone());
        }
        // Full means a checkpoint is already due.
        if let Some(checkpoints) = &checkpoints {
            let _ = checkpoints.try_send(());
        }
    }
}

/// An in-memory database with every table (`crate::schema::ALL`), for tests of
/// queries and their plans.
#[cfg(test)]
pub(crate) fn schema_db() -> Connection {
    let conn = Connection::open_in_memory().unwrap();
    for schema in crate::schema::ALL {
        conn.execute_batch(schema).unwrap();
    }
    conn
}

/// The steps of SQLite's plan for `sql` (`EXPLAIN QUERY PLAN`, every parameter NULL):
/// `SEARCH …` through an index, `SCAN …` of a whole table.
#[cfg(test)]
pub(crate) fn query_plan(conn: &Connection, sql: &str) -> Vec<String> {
    let conn = conn.as_sqlite().expect("a SQLite plan");
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    let nulls = vec![rusqlite::types::Null; stmt.parameter_count()];
    stmt.query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The remembered lookups below answer a number.
    impl Weigh for i64 {
        fn weight(&self) -> usize {
            0
        }
    }
    use crate::store::sql::OptionalExtension;

    #[derive(Debug)]
    enum TestError {
        Db(DbError),
        Rejected,
    }
    impl From<DbError> for TestError {
        fn from(e: DbError) -> Self {
            TestError::Db(e)
        }
    }

    /// A node's clock within a second of the index's passes quietly, within the bound
    /// with a warning, beyond it (either way) is refused with both the skew and the fix.
    #[test]
    fn a_node_whose_clock_is_far_from_the_index_is_refused() {
        for (skew_ms, refused) in [
            (0, false),
            (-900, false),
            (5_000, false),
            (-CLOCK_SKEW_MAX_MS, false),
            (CLOCK_SKEW_MAX_MS + 1, true),
            (-120_000, true),
        ] {
            let judged = judge_clock(skew_ms);
            assert_eq!(judged.is_err(), refused, "{skew_ms}");
            if let Err(e) = judged {
                let msg = e.to_string();
                assert!(msg.contains("NTP"), "{msg}");
                let side = if skew_ms > 0 { "behind" } else { "ahead of" };
                assert!(msg.contains(side), "{msg}");
            }
        }
    }

    /// The queries a request or an operator listing runs must find their rows through an
    /// index (SEARCH), never read a whole table (SCAN): their cost must not grow with
    /// the number of workspaces and versions (issue 9, "scale with the index").
    #[test]
    fn per_request_queries_use_an_index() {
        let conn = schema_db();
        let queries = [
            "SELECT * FROM versions WHERE scope = ?1 ORDER BY version DESC LIMIT 1",
            "SELECT * FROM versions WHERE scope = ?1 ORDER BY version DESC LIMIT ?2",
            "SELECT * FROM versions WHERE scope = ?1 AND version = ?2",
            "SELECT * FROM tf_locks WHERE workspace = ?1",
            "SELECT * FROM tf_plan_locks WHERE workspace = ?1",
            "SELECT * FROM tf_lock_waiters WHERE workspace = ?1",
            // every LOCK and every unlocked write (tofu::freeze)
            "SELECT * FROM tf_freezes WHERE workspace = ?1",
            "SELECT * FROM audit WHERE scope = ?1 AND (?2 IS NULL OR event = ?2) ORDER BY id DESC LIMIT ?3",
        ];
        for sql in queries {
            let plan = query_plan(&conn, sql);
            assert!(
                plan.iter().all(|step| step.starts_with("SEARCH")),
                "{sql}: {plan:?}"
            );
        }
    }

    /// An earlier release's `versions` gets the writer and timeline columns on open,
    /// its rows keeping NULLs (shown as before: no lock facts, changes not known); a
    /// second open changes nothing.
    #[test]
    fn an_earlier_releases_versions_table_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stategate.db");
        let old = Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE versions (scope TEXT NOT NULL, version INTEGER NOT NULL, serial INTEGER,
                lineage TEXT, sha256 TEXT, size INTEGER NOT NULL, blob_key TEXT,
                created_at TEXT NOT NULL, actor TEXT NOT NULL, PRIMARY KEY (scope, version)) WITHOUT ROWID;
             INSERT INTO versions VALUES ('tf/prod', 1, 1, 'l', 'ab', 2, 'k', 't', 'tf:prod');",
        )
        .unwrap();
        drop(old);
        for _ in 0..2 {
            drop(crate::schema::open_db(&path).unwrap());
            let conn = Connection::open(&path).unwrap();
            let rows = crate::store::history::history_rows(&conn, "tf/prod", None).unwrap();
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0].actor, "tf:prod");
            assert_eq!(rows[0].facts, crate::store::WriteFacts::default());
            assert_eq!(rows[0].changes, None);
            // No key generation recorded: read from the blob's header where needed.
            assert_eq!(rows[0].key_generation, None);
        }
    }

    /// Remembered answers are bounded by what they weigh, not by how many there are: an
    /// answer too heavy is never kept, and a full connection forgets them all.
    #[test]
    fn remembered_answers_are_bounded_by_weight() {
        #[derive(Clone)]
        struct Heavy(usize);
        impl Weigh for Heavy {
            fn weight(&self) -> usize {
                self.0
            }
        }
        let mut r = Remembered::default();
        assert!(
            r.recall::<Heavy>(1, "a").is_none(),
            "first sight of version 1"
        );
        r.keep("huge", Heavy(REMEMBERED_BYTES));
        assert!(r.recall::<Heavy>(1, "huge").is_none(), "too heavy to keep");
        let each = REMEMBERED_BYTES / 8;
        for i in 0..20 {
            r.keep(&format!("k{i}"), Heavy(each));
            assert!(r.bytes <= REMEMBERED_BYTES, "after {i}: {} bytes", r.bytes);
            assert!(
                r.recall::<Heavy>(1, &format!("k{i}")).is_some(),
                "just kept {i}"
            );
        }
        assert!(r.answers.len() < 8, "older answers were forgotten");
        assert!(
            r.recall::<Heavy>(2, "k19").is_none(),
            "a new version forgets everything"
        );
        assert_eq!((r.answers.len(), r.bytes), (0, 0));
    }

    /// Only the writer's transaction counts as one that records: not a reader's read
    /// transaction (`read_snapshot`), not autocommit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_writers_transaction_is_a_write_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db"), &["CREATE TABLE t (x INTEGER)"]).unwrap();
        let seen = |c: &Connection| {
            c.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))?;
            Ok(in_write_transaction(c))
        };
        assert!(!db.read_quick(seen).await.unwrap(), "autocommit reader");
        assert!(
            !db.read_snapshot(seen).await.unwrap(),
            "reader's read transaction"
        );
        assert!(!db.read(seen).await.unwrap(), "reader on the pool");
        let in_writer = db
            .write(move |c| -> Result<bool, DbError> { Ok(seen(c)?) })
            .await
            .unwrap();
        assert!(in_writer, "the writer's transaction");
    }

    /// A remembered lookup is read again after any commit: by this process's writer,
    /// or by a connection of its own (what a CLI command on the same data dir is);
    /// without one it is not read at all, and each key keeps its own answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_remembered_lookup_is_read_again_after_any_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let db = Db::open(&path, &["CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)"]).unwrap();
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let look = |key: &str| {
            let (db, reads, k) = (db.clone(), reads.clone(), key.to_string());
            async move {
                db.read_remembered(format!("v:{k}"), move |c| {
                    reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    c.query_row("SELECT v FROM t WHERE k = ?1", [&k], |r| r.get::<_, i64>(0))
                        .optional()
                })
                .await
                .unwrap()
            }
        };
        let reads_now = || reads.load(std::sync::atomic::Ordering::SeqCst);
        let other = Connection::open(&path).unwrap();
        // (commit before the lookup, key, expected answer, whether it reads the table)
        let steps: [(Option<&str>, &str, Option<i64>, bool); 8] = [
            (None, "a", None, true),
            (None, "a", None, false),
            (Some("writer:a=1"), "a", Some(1), true),
            (None, "a", Some(1), false),
            (None, "b", None, true),
            (Some("other:a=2"), "a", Some(2), true),
            (None, "a", Some(2), false),
            (Some("other:b=5"), "b", Some(5), true),
        ];
        for (i, (commit, key, expected, reads_table)) in steps.into_iter().enumerate() {
            if let Some(commit) = commit {
                let (who, kv) = commit.split_once(':').unwrap();
                let (k, v) = kv.split_once('=').unwrap();
                let (k, v) = (k.to_string(), v.parse::<i64>().unwrap());
                let sql = "INSERT INTO t VALUES (?1, ?2) ON CONFLICT (k) DO UPDATE SET v = ?2";
                if who == "writer" {
                    db.write(move |c| -> Result<(), DbError> {
                        c.execute(sql, crate::store::sql::params![k, v])?;
                        Ok(())
                    })
                    .await
                    .unwrap();
                } else {
                    other
                        .execute(sql, crate::store::sql::params![k, v])
                        .unwrap();
                }
            }
            let before = reads_now();
            assert_eq!(look(key).await, expected, "step {i}");
            assert_eq!(
                reads_now() > before,
                reads_table,
                "step {i}: read the table?"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn grouped_jobs_are_isolated_by_savepoints() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(
            &dir.path().join("t.db"),
            &["CREATE TABLE t (x INTEGER PRIMARY KEY)"],
        )
        .unwrap();
        let mut tasks = Vec::new();
        for i in 0..50i64 {
            let db = db.clone();
            tasks.push(tokio::spawn(async move {
                db.write(move |c| -> Result<(), TestError> {
                    c.execute("INSERT INTO t VALUES (?1)", [i])
                        .map_err(DbError::from)?;
                    if i % 2 == 1 {
                        return Err(TestError::Rejected); // rolled back, others unaffected
                    }
                    Ok(())
                })
                .await
            }));
        }
        let mut ok = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(()) => ok += 1,
                Err(TestError::Rejected) => {}
                Err(TestError::Db(e)) => panic!("{e}"),
            }
        }
        assert_eq!(ok, 25);
        let count: i64 = db
            .read(|c| c.query_row("SELECT count(*) FROM t WHERE x % 2 = 0", [], |r| r.get(0)))
            .await
            .unwrap();
        let odd: i64 = db
            .read(|c| c.query_row("SELECT count(*) FROM t WHERE x % 2 = 1", [], |r| r.get(0)))
            .await
            .unwrap();
        assert_eq!((count, odd), (25, 0));
    }

    /// Commits reach the database file through the checkpointer thread (the writer's
    /// own autocheckpoint is off): without it the WAL would grow without end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_checkpointer_copies_commits_into_the_database_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let db = Db::open(&path, &["CREATE TABLE t (x BLOB)"]).unwrap();
        let before = std::fs::metadata(&path).unwrap().len();
        for _ in 0..64 {
            db.write(|c| -> Result<(), DbError> {
                c.execute("INSERT INTO t VALUES (zeroblob(16384))", [])?;
                Ok(())
            })
            .await
            .unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::fs::metadata(&path).unwrap().len() < before + 64 * 16384 {
            assert!(
                std::time::Instant::now() < deadline,
                "commits never reached the database file"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}
