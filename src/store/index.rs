//! The index behind one module. Which kind of database holds it (a SQLite file in the
//! data dir, the default; or a PostgreSQL database several nodes share) is decided
//! here, once, from the configuration: [`Index::of`] is the one `match` on
//! `index.kind`, as Garage's `db::open_db` is its one match on the engine. Callers
//! ask plain questions — is there an index, open it with every schema (an earlier
//! release's migrated first), read it on a connection of its own, take a consistent
//! snapshot of it for a backup, copy it whole into the other kind (`index migrate`),
//! checkpoint it at a clean stop, say where it is without its secret, where a rebuild
//! or a restore writes a new one ([`NewIndex`]: a new SQLite file, or an empty
//! PostgreSQL database filled from one) — and never learn which kind answered. Below this module `sql` and `db` speak both dialects;
//! above it, owners write one statement for both (a test holds every module outside
//! `store/` to that: `no_index_kind_outside_the_store`).
//!
//! The tables are not this module's: [`Schema`] is their list as `crate::schema`
//! gives it, passed in, since the engine imports nothing above it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::config::{Config, IndexKind, Secret};
use crate::store::backup::BackupError;
use crate::store::copy::{CopyError, TableCopy};
use crate::store::db::{Db, DbError};
use crate::store::sql::{Connection, Dialect};

/// A change an earlier release's index needs before the schemas apply, defined by its
/// table's owner and idempotent.
pub type Migration = fn(&Connection) -> Result<(), crate::store::sql::Error>;

/// Every table of the index, as the one layer that knows them all lists them
/// (`crate::schema::INDEX`).
pub struct Schema {
    /// Every schema, in apply order, each idempotent (`CREATE … IF NOT EXISTS`).
    pub all: &'static [&'static str],
    /// [`Schema::all`] for PostgreSQL, made when asked (an owner may compose its text).
    pub postgres: fn() -> Result<Vec<String>, String>,
    /// What an earlier release's SQLite index needs before [`Schema::all`] applies.
    pub migrations: &'static [Migration],
    /// Every table, in an order that satisfies the foreign keys, with the order a copy
    /// inserts its rows in (parents before the rows that refer to them).
    pub tables: &'static [(&'static str, &'static str)],
    /// The tables whose `id` the database numbers itself.
    pub identities: &'static [&'static str],
}

impl Schema {
    /// Applies every schema for `conn`'s database, in the caller's transaction (a
    /// copy's new database: no migration, as it holds no earlier release's tables).
    pub fn apply(&self, conn: &Connection) -> Result<(), crate::store::sql::Error> {
        match conn.dialect() {
            Dialect::Sqlite => {
                for schema in self.all {
                    conn.execute_batch(schema)?;
                }
            }
            Dialect::Postgres => {
                for schema in (self.postgres)().map_err(crate::store::sql::Error::Value)? {
                    conn.execute_batch(&schema)?;
                }
            }
        }
        Ok(())
    }

    /// Copies the whole index from `from` into `into`: every schema made on `into` and
    /// every table copied in one write transaction there, then verified table by table
    /// (`store::copy`). What `index migrate` does, and a backup of a PostgreSQL index.
    pub fn copy(&self, from: &Connection, into: &Connection) -> Result<Vec<TableCopy>, CopyError> {
        into.begin_write()?;
        self.apply(into)?;
        let report = crate::store::copy::copy_tables(from, into, self.tables, self.identities)?;
        into.end_transaction(true)?;
        Ok(report)
    }

    /// Opens (creating if needed) the SQLite index at `path` with every migration and
    /// schema applied.
    pub fn open_file(&self, path: &Path) -> Result<Db, DbError> {
        self.migrate_file(path)?;
        Db::open(path, self.all)
    }

    /// Opens the index on PostgreSQL at `url` with every schema applied (no migration
    /// but the columns an owner's PostgreSQL schema adds where they are missing, e.g.
    /// `store::db::postgres_schema`).
    pub fn open_postgres(&self, url: &str, ca_file: Option<&Path>) -> Result<Db, DbError> {
        Db::open_postgres(url, ca_file, &(self.postgres)().map_err(DbError::Task)?)
    }

    /// Runs [`Schema::migrations`] in one immediate transaction (two processes opening
    /// the same old index do not both alter it).
    fn migrate_file(&self, path: &Path) -> Result<(), DbError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        // Immediate: the writer's transaction (on drop without a commit, it rolls back).
        conn.begin_write()?;
        for migration in self.migrations {
            migration(&conn)?;
        }
        conn.end_transaction(true)?;
        Ok(())
    }
}

/// What the index could not do, in words for the operator (never a secret: a
/// PostgreSQL index is named by host and database only).
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// `what` failed, for the reason `source` gives.
    #[error("{what}")]
    Failed {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Refused, or a connection that could not be made, before anything was changed.
    #[error("{0}")]
    Refused(String),
    /// A copy that did not complete or did not compare equal: nothing was committed.
    #[error(transparent)]
    Copy(#[from] CopyError),
}

fn failed(what: impl Into<String>) -> impl FnOnce(String) -> IndexError {
    let what = what.into();
    move |e| IndexError::Failed {
        what,
        source: e.into(),
    }
}

fn failed_by<E: std::error::Error + Send + Sync + 'static>(
    what: impl Into<String>,
) -> impl FnOnce(E) -> IndexError {
    let what = what.into();
    move |e| IndexError::Failed {
        what,
        source: Box::new(e),
    }
}

/// Where an installation's index is.
#[derive(Clone)]
enum At {
    /// A SQLite file (in the data dir).
    File(PathBuf),
    /// A PostgreSQL database, by its connection string (which holds the password).
    Postgres { url: Secret },
}

/// This installation's index, where its configuration puts it.
#[derive(Clone)]
pub struct Index {
    at: At,
    /// The PEM roots a PostgreSQL server's certificate is checked against (this
    /// index's, or the one `index migrate` copies into).
    ca_file: Option<PathBuf>,
}

impl Index {
    /// The index the configuration names: `[index]` (`kind`, `url`, `ca_file`), or the
    /// data dir's SQLite file.
    pub fn of(config: &Config) -> Index {
        let at = match (config.index.kind, &config.index.url) {
            (IndexKind::Postgres, Some(url)) => At::Postgres { url: url.clone() },
            // `Config` refuses a PostgreSQL index without a URL before anything opens.
            (IndexKind::Postgres, None) | (IndexKind::Sqlite, _) => At::File(config.db_path()),
        };
        Index {
            at,
            ca_file: config.index.ca_file.clone(),
        }
    }

    /// Whether the installation has an index yet: its SQLite file, or its PostgreSQL
    /// database (always there: the server made it, or `serve` will).
    pub fn exists(&self) -> bool {
        match &self.at {
            At::File(path) => path.exists(),
            At::Postgres { .. } => true,
        }
    }

    /// Whether an index is there to open: the SQLite file, or on PostgreSQL the tables
    /// a node made when it first opened the database (the database alone is not one).
    /// Connects to PostgreSQL; blocking.
    pub fn holds_index(&self) -> Result<bool, IndexError> {
        match &self.at {
            At::File(path) => Ok(path.exists()),
            At::Postgres { .. } => Ok(self.read(has_versions_table)?.unwrap_or(false)),
        }
    }

    /// Where it is, for a person checking what a command resolved: `SQLite <path>`,
    /// or `PostgreSQL <host>/<database>` (never the URL's user or password).
    pub fn describe(&self) -> String {
        match &self.at {
            At::File(path) => format!("SQLite {}", path.display()),
            At::Postgres { url, .. } => {
                let url = url.expose();
                let rest = url.split_once("://").map_or(url, |(_, r)| r);
                let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
                format!("PostgreSQL {}", rest.split('?').next().unwrap_or(rest))
            }
        }
    }

    /// What a backup says it backed up: the file's path, or "the PostgreSQL index".
    pub fn name(&self) -> String {
        match &self.at {
            At::File(path) => path.display().to_string(),
            At::Postgres { .. } => "the PostgreSQL index".into(),
        }
    }

    /// The index with every schema (an earlier release's SQLite file migrated first).
    /// The data dir must exist.
    pub fn open(&self, schema: &Schema) -> Result<Db, IndexError> {
        match &self.at {
            At::File(path) => schema.open_file(path).map_err(failed_by(format!(
                "cannot open database {}",
                path.display()
            ))),
            At::Postgres { url } => schema
                .open_postgres(url.expose(), self.ca_file.as_deref())
                .map_err(failed_by("cannot open the index on PostgreSQL (index.url)")),
        }
    }

    /// Runs `f` on a connection of its own to the index, if there is one (a SQLite
    /// file opened read-only, or the PostgreSQL database on a thread of its own: its
    /// client blocks on a runtime of its own, so never on an async runtime's thread).
    pub fn read<T: Send>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, crate::store::sql::Error> + Send,
    ) -> Result<Option<T>, IndexError> {
        match &self.at {
            At::Postgres { url } => {
                let what = "cannot read the index on PostgreSQL (index.url)";
                let ca_file = self.ca_file.as_deref();
                std::thread::scope(|s| {
                    s.spawn(move || {
                        let conn = Connection::connect_postgres(url.expose(), ca_file)
                            .map_err(failed(what))?;
                        f(&conn).map(Some).map_err(failed_by(what))
                    })
                    .join()
                    .unwrap_or_else(|_| Err(IndexError::Refused(format!("{what}: it panicked"))))
                })
            }
            At::File(path) => {
                if !path.exists() {
                    return Ok(None);
                }
                let conn =
                    Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                        .and_then(|c| {
                            c.busy_timeout(std::time::Duration::from_secs(5))
                                .map(|()| c)
                        })
                        .map_err(failed_by(format!(
                            "cannot open the index {}",
                            path.display()
                        )))?;
                f(&conn).map(Some).map_err(failed_by(format!(
                    "cannot read the index {}",
                    path.display()
                )))
            }
        }
    }

    /// A read-write connection of its own to the index, usable on any thread (an async
    /// runtime's too), for a look into it from outside the server's own work — a test's
    /// rows and counts, whichever kind the configuration names. The SQLite file is
    /// opened as it is (created if missing); a PostgreSQL round trip runs on a thread
    /// of its own.
    pub fn connect(&self) -> Result<Connection, IndexError> {
        match &self.at {
            At::File(path) => Connection::open(path).map_err(failed_by(format!(
                "cannot open the index {}",
                path.display()
            ))),
            At::Postgres { url } => {
                Connection::connect_postgres_from_any_thread(url.expose(), self.ca_file.as_deref())
                    .map_err(failed(
                        "cannot connect to the index on PostgreSQL (index.url)",
                    ))
            }
        }
    }

    /// A reader asked again and again (the keyring's reloads, every second): a
    /// PostgreSQL index keeps one connection, made again if it breaks; a SQLite file
    /// is opened read-only for each read, and a missing one reads as empty.
    pub fn rereader(&self) -> Rereader {
        Rereader {
            index: self.clone(),
            kept: Mutex::new(None),
        }
    }

    /// A consistent snapshot of the index as a SQLite database file's bytes, for a
    /// backup: `VACUUM INTO` of the SQLite file, or a PostgreSQL index copied in one
    /// snapshot into a scratch file in `scratch_dir` and verified ([`Schema::copy`]).
    /// Blocking; each call takes a new one.
    pub fn snapshot(
        &self,
        schema: &'static Schema,
        scratch_dir: &Path,
    ) -> impl Fn() -> Result<Vec<u8>, BackupError> + Send + Sync + 'static {
        use crate::store::backup::{snapshot, snapshot_by_copy};
        let (index, scratch_dir) = (self.clone(), scratch_dir.to_path_buf());
        move || match &index.at {
            At::File(path) => snapshot(path, &scratch_dir),
            At::Postgres { url } => {
                let from = Connection::connect_postgres(url.expose(), index.ca_file.as_deref())
                    .map_err(BackupError::Io)?;
                keep_through_pauses(&from).map_err(|e| BackupError::Io(e.to_string()))?;
                if !has_versions_table(&from).map_err(BackupError::Snapshot)? {
                    return Err(BackupError::Io(
                        "the PostgreSQL database holds no index yet (no node has opened it): nothing to back up".into(),
                    ));
                }
                snapshot_by_copy(&from, &scratch_dir, |from, into| {
                    schema.copy(from, into).map(drop).map_err(|e| e.to_string())
                })
            }
        }
    }

    /// Copies every table of the index into `to` in one transaction (the schema made
    /// there first), then reads both back and compares each table (`store::copy`); on
    /// any difference nothing is committed. Refused while a server uses the source:
    /// for a SQLite file, one holding the data dir (`hold_data_dir` takes the data
    /// dir's lock, `None` while a server holds it); for PostgreSQL, any other
    /// stategate session on the database (`pg_stat_activity`).
    pub fn migrate<G>(
        &self,
        to: MigrateTo,
        schema: &Schema,
        hold_data_dir: impl FnOnce() -> Result<Option<G>, String> + Send,
    ) -> Result<Vec<TableCopy>, IndexError> {
        let refused = IndexError::Refused;
        // Off any async runtime: the PostgreSQL client blocks on a runtime of its own.
        std::thread::scope(|s| {
            s.spawn(|| match (&self.at, to) {
                (At::Postgres { .. }, MigrateTo::Postgres { .. }) => Err(refused(
                    "this installation's index is already on PostgreSQL (index.kind = \"postgres\")".into(),
                )),
                (At::File(path), MigrateTo::Postgres { url }) => {
                    let _held = hold_data_dir()
                        .map_err(failed("cannot take the data dir's lock"))?
                        .ok_or_else(|| refused(
                            "a stategate server is running on this data dir: stop it first, so that no write is left behind".into(),
                        ))?;
                    if !path.exists() {
                        return Err(refused(format!("no index at {}", path.display())));
                    }
                    let from = Connection::open_with_flags(
                        path,
                        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                    )
                    .map_err(failed_by(format!("cannot open the index {}", path.display())))?;
                    let into = Connection::connect_postgres(&url, self.ca_file.as_deref())
                        .map_err(refused)?;
                    keep_through_pauses(&into)
                        .map_err(failed_by("cannot prepare the PostgreSQL session"))?;
                    Ok(schema.copy(&from, &into)?)
                }
                (At::File(_), MigrateTo::Sqlite { .. }) => Err(refused(
                    "this installation's index is SQLite; `--to sqlite` copies a PostgreSQL index".into(),
                )),
                (At::Postgres { url }, MigrateTo::Sqlite { path }) => {
                    if path.exists() {
                        return Err(refused(format!("{} exists: name a new file", path.display())));
                    }
                    let from = Connection::connect_postgres(url.expose(), self.ca_file.as_deref())
                        .map_err(refused)?;
                    keep_through_pauses(&from)
                        .map_err(failed_by("cannot prepare the PostgreSQL session"))?;
                    let others = other_sessions(&from)
                        .map_err(failed_by("cannot list the database's sessions"))?;
                    if others != 0 {
                        return Err(refused(format!(
                            "{others} other stategate sessions use this database: stop every server on it first, so that no write is left behind"
                        )));
                    }
                    // One snapshot of the source for the whole copy.
                    from.begin_read()
                        .map_err(failed_by("cannot begin reading the index"))?;
                    let into = Connection::open(&path)
                        .map_err(failed_by(format!("cannot create {}", path.display())))?;
                    crate::store::db::restrict_to_owner(&path);
                    let report = schema.copy(&from, &into).map_err(IndexError::from);
                    if report.is_err() {
                        let _ = std::fs::remove_file(&path);
                    }
                    report
                }
            })
            .join()
            .unwrap_or_else(|_| Err(refused("the copy panicked".into())))
        })
    }

    /// Where a rebuild or a restore writes the new index, `--into` parsed once for
    /// this installation's kind: for a SQLite index, a new file (checked by the caller,
    /// which knows the data dir's lock); for a PostgreSQL index, an empty PostgreSQL
    /// database by its URL (a new one, or the configured one while it holds no index),
    /// written through a scratch file in `scratch_dir` that [`NewIndex::finish`] copies
    /// into it. Refused before any work when the database holds an index or another
    /// stategate session uses it.
    pub fn new_index(
        &self,
        into: &Path,
        scratch_dir: &Path,
        schema: &Schema,
    ) -> Result<NewIndex, IndexError> {
        let url = into
            .to_str()
            .filter(|t| t.starts_with("postgres://") || t.starts_with("postgresql://"));
        let At::Postgres { url: live } = &self.at else {
            // Never read as a path: an error naming that file would print the password.
            if url.is_some() {
                return Err(IndexError::Refused(
                    "this installation's index is SQLite: --into names a new file; to move \
                     the index to PostgreSQL, use `stategate index migrate --to postgres URL`"
                        .into(),
                ));
            }
            return Ok(NewIndex {
                file: into.to_path_buf(),
                server: None,
            });
        };
        let url = url.ok_or_else(|| {
            IndexError::Refused(
                "this installation's index is on PostgreSQL (index.kind = \"postgres\"): \
                     --into names an empty PostgreSQL database by its URL (postgres://…): a new \
                     one, or the configured one while it holds no index"
                    .into(),
            )
        })?;
        crate::store::blob::create_private_dir(scratch_dir).map_err(failed_by(format!(
            "cannot create {}",
            scratch_dir.display()
        )))?;
        let server = Server {
            url: Secret::from(url.to_string()),
            ca_file: self.ca_file.clone(),
            live: url == live.expose(),
        };
        server.check_empty(schema)?;
        Ok(NewIndex {
            file: scratch_dir.join(format!(".new-index-{}.db", uuid::Uuid::new_v4().simple())),
            server: Some(server),
        })
    }

    /// At a clean stop, once no request is left: copies the whole write-ahead log of a
    /// SQLite index into the database file and empties it (`wal_checkpoint(TRUNCATE)`),
    /// so the database file alone is the index (a lost `stategate.db` can be restored
    /// in place next to an empty log). Nothing to do on PostgreSQL; a failure is logged.
    pub fn checkpoint_at_stop(&self) {
        let At::File(path) = &self.at else { return };
        let done = (|| -> Result<bool, rusqlite::Error> {
            let conn = rusqlite::Connection::open_with_flags(
                path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            conn.busy_timeout(std::time::Duration::from_secs(2))?;
            // (busy, log frames, checkpointed frames): busy = 1 when a reader held it back.
            let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
            Ok(busy == 0)
        })();
        match done {
            Ok(true) => tracing::info!(index = %path.display(), "index checkpointed"),
            Ok(false) => {
                tracing::warn!(index = %path.display(), "the index's write-ahead log could not be emptied at stop (a reader held it); it is replayed at the next start")
            }
            Err(e) => {
                tracing::warn!(index = %path.display(), error = %e, "cannot checkpoint the index at stop; its write-ahead log is replayed at the next start")
            }
        }
    }
}

/// See [`Index::rereader`].
pub struct Rereader {
    index: Index,
    kept: Mutex<Option<Connection>>,
}

impl Rereader {
    /// Runs `f` on the index (an empty in-memory database when the SQLite file is not
    /// there yet), off the caller's thread for PostgreSQL: a load may be asked for on
    /// an async runtime's thread, where the PostgreSQL client cannot block.
    pub fn read<T: Send>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, String> + Send,
    ) -> Result<T, String> {
        match &self.index.at {
            At::Postgres { url } => std::thread::scope(|s| {
                s.spawn(|| {
                    let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
                    if kept.as_ref().is_none_or(|c| c.is_broken()) {
                        *kept = Some(Connection::connect_postgres(
                            url.expose(),
                            self.index.ca_file.as_deref(),
                        )?);
                    }
                    let conn = kept.as_ref().ok_or("no connection to the index")?;
                    f(conn)
                })
                .join()
                .unwrap_or_else(|_| Err("reading the index panicked".into()))
            }),
            At::File(path) if !path.exists() => {
                f(&Connection::open_in_memory().map_err(|e| e.to_string())?)
            }
            At::File(path) => {
                let conn = Connection::open_with_flags(
                    path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .map_err(|e| e.to_string())?;
                conn.busy_timeout(std::time::Duration::from_secs(5))
                    .map_err(|e| e.to_string())?;
                f(&conn)
            }
        }
    }
}

/// A new index a rebuild or a restore writes ([`Index::new_index`]).
pub struct NewIndex {
    /// The SQLite file the rebuild or restore writes: the new index itself, or a
    /// scratch file in the data dir that [`NewIndex::finish`] copies into `server`.
    file: PathBuf,
    server: Option<Server>,
}

/// An empty PostgreSQL database a new index goes into.
struct Server {
    url: Secret,
    ca_file: Option<PathBuf>,
    /// The installation's own database (`index.url`).
    live: bool,
}

impl NewIndex {
    /// The SQLite file the rebuild or the restore writes (must not exist yet).
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Where the new index ends up, for a person (a PostgreSQL database by host and
    /// database only).
    pub fn describe(&self) -> String {
        match &self.server {
            None => self.file.display().to_string(),
            Some(server) => Index {
                at: At::Postgres {
                    url: server.url.clone(),
                },
                ca_file: None,
            }
            .describe(),
        }
    }

    /// Once the file is complete: into PostgreSQL, the file is copied into the
    /// database in one transaction and verified table by table ([`Schema::copy`]; on
    /// any difference nothing is committed), refused if the database gained an index
    /// or a stategate session meanwhile; the scratch file is removed either way. A new
    /// SQLite file is already the index: nothing to do.
    pub fn finish(&self, schema: &Schema) -> Result<Vec<TableCopy>, IndexError> {
        let Some(server) = &self.server else {
            return Ok(Vec::new());
        };
        on_own_thread(|| {
            let from =
                Connection::open_with_flags(&self.file, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                    .map_err(failed_by(format!(
                        "cannot open the new index {}",
                        self.file.display()
                    )))?;
            let into = server.connect()?;
            keep_through_pauses(&into)
                .map_err(failed_by("cannot prepare the PostgreSQL session"))?;
            server.check_alone(&into)?;
            Ok(schema.copy(&from, &into)?)
        })
    }

    /// What the operator does next (`live`: the data dir's SQLite file; `in_place`:
    /// the rebuild or restore wrote there, as no server was running).
    pub fn next_step(&self, live: &Path, in_place: bool) -> String {
        match &self.server {
            Some(server) if server.live => "It is this installation's index already (index.url; no stategate session used it): start the nodes.".into(),
            Some(_) => format!(
                "To use it: stop every node; set index.url to {} on each (STATEGATE_INDEX_URL); start them.",
                self.describe()
            ),
            None if in_place => format!(
                "It is the index of {} already (no server was running there): start stategate.",
                live.parent().unwrap_or(live).display()
            ),
            None => format!(
                "To use it: stop stategate; move {live}, {live}-wal and {live}-shm aside (keep them); \
                 mv {} {live}; start stategate.",
                self.file.display(),
                live = live.display()
            ),
        }
    }
}

/// A scratch file is removed however the rebuild or the restore ended (it holds the
/// index: token hashes, the audit log).
impl Drop for NewIndex {
    fn drop(&mut self) {
        if self.server.is_some() {
            for file in files(&self.file) {
                let _ = std::fs::remove_file(file);
            }
            let mut journal = self.file.as_os_str().to_owned();
            journal.push("-journal");
            let _ = std::fs::remove_file(PathBuf::from(journal));
        }
    }
}

impl Server {
    fn connect(&self) -> Result<Connection, IndexError> {
        Connection::connect_postgres(self.url.expose(), self.ca_file.as_deref())
            .map_err(IndexError::Refused)
    }

    /// Refused while another stategate session uses the database (a node would write
    /// beside the copy).
    fn check_alone(&self, conn: &Connection) -> Result<(), IndexError> {
        let others =
            other_sessions(conn).map_err(failed_by("cannot list the database's sessions"))?;
        if others != 0 {
            return Err(IndexError::Refused(format!(
                "{others} other stategate sessions use {}: stop every node on it first",
                self.name()
            )));
        }
        Ok(())
    }

    /// Refused when the database holds an index already (a row in any table) or
    /// another stategate session uses it; nothing is written.
    fn check_empty(&self, schema: &Schema) -> Result<(), IndexError> {
        on_own_thread(|| {
            let conn = self.connect()?;
            self.check_alone(&conn)?;
            let failed = |e: crate::store::sql::Error| IndexError::Failed {
                what: format!("cannot read {}", self.name()),
                source: Box::new(e),
            };
            let mut held = Vec::new();
            for (table, _) in schema.tables {
                if conn.table_exists(table).map_err(failed)? {
                    let rows: i64 = conn
                        .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
                        .map_err(failed)?;
                    if rows > 0 {
                        held.push(format!("{table} ({rows} rows)"));
                    }
                }
            }
            if !held.is_empty() {
                return Err(IndexError::Refused(format!(
                    "{} holds an index already ({}): a rebuild or a restore writes only into an empty database; name a new one",
                    self.name(),
                    held.join(", ")
                )));
            }
            Ok(())
        })
    }

    fn name(&self) -> String {
        format!(
            "the database {}",
            Index {
                at: At::Postgres {
                    url: self.url.clone()
                },
                ca_file: None,
            }
            .describe()
        )
    }
}

/// Runs `f` on a thread of its own: the PostgreSQL client blocks on a runtime of its
/// own, so never on an async runtime's thread.
fn on_own_thread<T: Send>(
    f: impl FnOnce() -> Result<T, IndexError> + Send,
) -> Result<T, IndexError> {
    std::thread::scope(|s| {
        s.spawn(f)
            .join()
            .unwrap_or_else(|_| Err(IndexError::Refused("the index's thread panicked".into())))
    })
}

/// Where `stategate index migrate` copies the index to.
pub enum MigrateTo {
    /// From the data dir's SQLite file into an empty PostgreSQL database.
    Postgres { url: String },
    /// From the configured PostgreSQL database into a new SQLite file.
    Sqlite { path: PathBuf },
}

impl MigrateTo {
    /// `--to KIND TARGET` as the command line gives it: `postgres URL` or `sqlite PATH`.
    pub fn parse(kind: &str, target: String) -> Result<MigrateTo, IndexError> {
        match kind {
            "postgres" => Ok(MigrateTo::Postgres { url: target }),
            "sqlite" => Ok(MigrateTo::Sqlite {
                path: PathBuf::from(target),
            }),
            _ => Err(IndexError::Refused(
                "--to names the kind of index to copy into: postgres or sqlite".into(),
            )),
        }
    }

    /// What the operator does next to use the copy (`live`: the data dir's SQLite file).
    pub fn next_step(&self, live: &Path) -> String {
        match self {
            MigrateTo::Postgres { .. } => "set [index] kind = \"postgres\" and url (or STATEGATE_INDEX, STATEGATE_INDEX_URL) on every node, then start them".to_string(),
            MigrateTo::Sqlite { path } => format!(
                "remove any old {live} with its -wal and -shm files (an old WAL must never meet the new file), \
                 move {} to {live}, set [index] kind = \"sqlite\" (remove index.url), then start the server",
                path.display(),
                live = live.display()
            ),
        }
    }
}

/// The files SQLite keeps for the index at `db` (the database, its write-ahead log and
/// shared memory): a new index must not meet an old log.
pub fn files(db: &Path) -> [PathBuf; 3] {
    let with = |suffix: &str| {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    [db.to_path_buf(), with("-wal"), with("-shm")]
}

/// A connection to a new index file a rebuild or a restore just wrote, for what the
/// owners of other tables add to it before it is used (every commit synchronous).
pub fn open_new_file(path: &Path) -> Result<Connection, crate::store::sql::Error> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

/// `index migrate` and a backup hold one transaction open while they read and compare
/// a whole table on the other side: the server must not end the session for pausing
/// (`sql::IDLE_IN_TRANSACTION` guards against frozen nodes, not against this).
fn keep_through_pauses(conn: &Connection) -> Result<(), crate::store::sql::Error> {
    conn.execute_batch("SET idle_in_transaction_session_timeout = 0")
}

/// Whether a PostgreSQL database holds an index (a node has opened it).
fn has_versions_table(conn: &Connection) -> Result<bool, crate::store::sql::Error> {
    conn.query_row("SELECT to_regclass('versions') IS NOT NULL", [], |r| {
        r.get(0)
    })
}

/// How many stategate sessions of other processes use this PostgreSQL database (this
/// command's own, e.g. the keyring's kept connection, are not another's).
fn other_sessions(conn: &Connection) -> Result<i64, crate::store::sql::Error> {
    // Integers this process's own connections reported: no text of anyone else's.
    let own: String = crate::store::sql::own_sessions()
        .iter()
        .map(|pid| format!(" AND pid <> {pid}"))
        .collect();
    conn.query_row(
        &format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = ?1 AND pid <> pg_backend_pid(){own}"
        ),
        [crate::store::sql::APPLICATION_NAME],
        |r| r.get(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boundary, checked on the source: outside `store/`, production code holds no
    /// SQL text only one kind of index understands (catalog reads, pragmas, session
    /// settings, PostgreSQL's functions) and no branch on the kind (the configured
    /// kind, a connection's dialect, the database drivers and their SQLite-only
    /// calls). `config.rs` defines `index.kind` and refuses a contradictory
    /// `[index]`; what the kind means is this module's. Each owner's DDL stays with
    /// its table (`crate::schema` lists both spellings); tests below a file's
    /// `#[cfg(test)]` may build what they check.
    #[test]
    fn no_index_kind_outside_the_store() {
        /// SQL one kind alone understands.
        const ONE_KIND_SQL: &[&str] = &[
            "sqlite_master",
            "sqlite_schema",
            "PRAGMA",
            "pragma_",
            "VACUUM",
            "wal_checkpoint",
            "pg_",
            "to_regclass",
            "current_database",
            "current_schema",
            "information_schema",
            "setval(",
            "idle_in_transaction",
            "SHOW ",
            "SET CONSTRAINTS",
        ];
        /// What chooses, or only works on, one kind.
        const KIND_BRANCH: &[&str] = &[
            "IndexKind",
            "index.kind",
            "Dialect",
            ".dialect()",
            "rusqlite",
            "postgres::",
            "connect_postgres",
            "as_sqlite",
            "open_with_flags",
            "pragma_update",
            "busy_timeout",
            "Connection::open(",
            "open_in_memory",
            "MigrateTo::Postgres",
            "MigrateTo::Sqlite",
        ];
        use crate::source_rules::production;
        let src = crate::source_root();
        let store = src.join("store");
        for (file, text) in crate::source_files()
            .iter()
            .filter(|(f, _)| !f.starts_with(&store))
        {
            let config = file == &src.join("config.rs");
            for (n, line) in production(text) {
                let code = line.trim_start();
                if code.starts_with("//") {
                    continue;
                }
                let at = format!("{}:{}", file.display(), n + 1);
                for word in ONE_KIND_SQL {
                    assert!(
                        !code.contains(word),
                        "{at} holds one kind's SQL ({word}): {line}"
                    );
                }
                for word in KIND_BRANCH
                    .iter()
                    .filter(|w| !config || !w.contains("ndex"))
                {
                    assert!(
                        !code.contains(word),
                        "{at} knows the index kind ({word}): {line}"
                    );
                }
            }
        }
        // The scan sees what it looks for (run on this module's own text).
        let this = std::fs::read_to_string(store.join("index.rs")).unwrap();
        let this: Vec<&str> = production(&this).into_iter().map(|(_, l)| l).collect();
        let this = this.join("\n");
        assert!(this.contains("IndexKind::Postgres") && this.contains("pg_stat_activity"));
        assert!(!this.contains("fn no_index_kind_outside_the_store"));
    }

    #[test]
    fn files_are_the_database_its_log_and_its_shared_memory() {
        let [db, wal, shm] = files(Path::new("/d/stategate.db"));
        assert_eq!(db, Path::new("/d/stategate.db"));
        assert_eq!(wal, Path::new("/d/stategate.db-wal"));
        assert_eq!(shm, Path::new("/d/stategate.db-shm"));
    }

    /// `--into` is read once for the installation's kind, before anything is opened: a
    /// file for SQLite (a PostgreSQL URL refused without echoing it), a URL for
    /// PostgreSQL (a path refused).
    #[test]
    fn a_new_index_is_a_file_or_a_database_by_its_url() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config {
            data_dir: dir.path().join("data"),
            ..Config::default()
        };
        let new = |config: &Config, into: &str| {
            Index::of(config).new_index(Path::new(into), dir.path(), &crate::schema::INDEX)
        };
        let file = new(&config, "/x/new.db").ok().unwrap();
        assert_eq!(file.file(), Path::new("/x/new.db"));
        assert_eq!(file.describe(), "/x/new.db");
        let err = new(&config, "postgres://u:hunter2@db/x")
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("index migrate") && !err.contains("hunter2"),
            "{err}"
        );
        config.index.kind = IndexKind::Postgres;
        config.index.url = Some("postgres://u:hunter2@db/sg".into());
        let err = new(&config, "/x/new.db").err().unwrap().to_string();
        assert!(
            err.contains("by its URL") && !err.contains("hunter2"),
            "{err}"
        );
    }

    #[test]
    fn a_postgres_index_is_described_without_its_secret() {
        let mut config = Config::default();
        assert!(Index::of(&config).describe().starts_with("SQLite "));
        config.index.kind = IndexKind::Postgres;
        config.index.url = Some("postgres://u:hunter2@db:5432/sg?sslmode=require".into());
        let index = Index::of(&config);
        assert_eq!(index.describe(), "PostgreSQL db:5432/sg");
        assert_eq!(index.name(), "the PostgreSQL index");
        assert!(index.exists());
    }
}
