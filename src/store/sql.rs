//! The index's SQL connection, whichever database holds the index: SQLite (embedded,
//! the default) or PostgreSQL (`index = "postgres"`, for several nodes).
//!
//! Every table's owner writes its statements once, against this module's
//! [`Connection`], whose API follows rusqlite's (`execute`, `prepare_cached`,
//! `query_row`, `query_map`, `params!`, `optional()`), so the owners hold no
//! `if postgres`. The statements are written in the dialect both databases share:
//! `?N` placeholders (rewritten to `$N` for PostgreSQL), `ON CONFLICT … DO`,
//! `RETURNING`, `CAST(… AS BIGINT)`. What differs beyond that (how a write transaction
//! is taken, a table's DDL types, the append-only triggers, what a migration reads of
//! the catalog) is decided here and in [`crate::store::db`]; which database an
//! installation's index is, and what only one kind does with it (snapshot, copy,
//! checkpoint), in [`crate::store::index`]. Nothing outside `store/` asks.
//!
//! Values cross as [`ValueRef`]s, SQLite's five storage classes. A PostgreSQL
//! parameter is encoded as the type the server inferred for it (an integer into an
//! `INT4`, `INT8` or `BOOL` column alike), and a column is read by its type.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// Result of the index's SQL.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Sqlite(rusqlite::Error),
    #[error("{}", postgres_message(.0))]
    Postgres(#[from] postgres::Error),
    #[error("query returned no rows")]
    NoRows,
    #[error("column {index}: {message}")]
    Column { index: usize, message: String },
    #[error("parameter {index}: {message}")]
    Parameter { index: usize, message: String },
    #[error("{0}")]
    Value(String),
    #[error("a statement of the transaction failed earlier; the transaction was rolled back")]
    Aborted,
}

impl From<String> for Error {
    fn from(message: String) -> Self {
        Error::Value(message)
    }
}

/// The server's own words for a refused statement ("db error" alone says nothing).
fn postgres_message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        },
    }
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        match e {
            rusqlite::Error::QueryReturnedNoRows => Error::NoRows,
            e => Error::Sqlite(e),
        }
    }
}

impl Error {
    /// A constraint of the schema refused the statement: a unique key already taken, a
    /// foreign key, a `CHECK`, or an append-only trigger.
    pub fn is_constraint_violation(&self) -> bool {
        match self {
            Error::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                e.code == rusqlite::ErrorCode::ConstraintViolation
            }
            Error::Postgres(e) => e.code().is_some_and(|code| {
                // Class 23 (integrity constraint violation), and RAISE EXCEPTION.
                code.code().starts_with("23") || code == &postgres::error::SqlState::RAISE_EXCEPTION
            }),
            _ => false,
        }
    }

    /// The connection to the database server is gone (PostgreSQL only): a new one is
    /// needed, and whether the statement took effect is unknown.
    pub fn is_connection_lost(&self) -> bool {
        // Closed, an I/O error, or the server ending the session: class 08 (connection
        // exception) and 57P (operator intervention: shutdown, a failover's restart).
        matches!(self, Error::Postgres(e) if e.is_closed()
            || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
            || e.code().is_some_and(|c| c.code().starts_with("08") || c.code().starts_with("57P")))
    }
}

/// One value, as SQLite stores it (PostgreSQL's are mapped by their type).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ValueRef<'a> {
    Null,
    Integer(i64),
    Real(f64),
    Text(&'a [u8]),
    Blob(&'a [u8]),
}

impl<'a> ValueRef<'a> {
    pub fn as_str(&self) -> Result<&'a str, String> {
        match self {
            ValueRef::Text(t) => std::str::from_utf8(t).map_err(|e| e.to_string()),
            other => Err(format!("expected text, found {}", other.kind())),
        }
    }

    pub fn as_blob(&self) -> Result<&'a [u8], String> {
        match self {
            ValueRef::Blob(b) => Ok(b),
            other => Err(format!("expected a blob, found {}", other.kind())),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ValueRef::Null => "NULL",
            ValueRef::Integer(_) => "an integer",
            ValueRef::Real(_) => "a real",
            ValueRef::Text(_) => "text",
            ValueRef::Blob(_) => "a blob",
        }
    }
}

/// A value a statement can take as a parameter.
pub trait ToSql {
    fn to_sql(&self) -> Result<ValueRef<'_>, String>;
}

impl ToSql for ValueRef<'_> {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(*self)
    }
}

/// A value a column can be read as.
pub trait FromSql: Sized {
    fn column_result(value: ValueRef<'_>) -> Result<Self, String>;
}

/// SQL `NULL` as a parameter.
#[derive(Clone, Copy, Debug)]
pub struct Null;

impl ToSql for Null {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Null)
    }
}

impl<T: ToSql + ?Sized> ToSql for &T {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        (**self).to_sql()
    }
}

impl<T: ToSql + ?Sized> ToSql for Box<T> {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        (**self).to_sql()
    }
}

impl<T: ToSql> ToSql for Option<T> {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        match self {
            Some(v) => v.to_sql(),
            None => Ok(ValueRef::Null),
        }
    }
}

impl ToSql for str {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Text(self.as_bytes()))
    }
}

impl ToSql for String {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Text(self.as_bytes()))
    }
}

impl ToSql for [u8] {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Blob(self))
    }
}

impl ToSql for Vec<u8> {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Blob(self))
    }
}

impl<const N: usize> ToSql for [u8; N] {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Blob(self))
    }
}

impl ToSql for bool {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Integer(i64::from(*self)))
    }
}

impl ToSql for f64 {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Real(*self))
    }
}

macro_rules! integer_sql {
    ($($t:ty)+) => {$(
        impl ToSql for $t {
            fn to_sql(&self) -> Result<ValueRef<'_>, String> {
                i64::try_from(*self)
                    .map(ValueRef::Integer)
                    .map_err(|_| format!("{} does not fit a 64-bit integer", self))
            }
        }
        impl FromSql for $t {
            fn column_result(value: ValueRef<'_>) -> Result<Self, String> {
                match value {
                    ValueRef::Integer(i) => <$t>::try_from(i).map_err(|_| format!("{i} out of range")),
                    other => Err(format!("expected an integer, found {}", other.kind())),
                }
            }
        }
    )+};
}
integer_sql!(i64 i32 i16 u8 u16 u32 u64 usize);

impl FromSql for bool {
    fn column_result(value: ValueRef<'_>) -> Result<Self, String> {
        i64::column_result(value).map(|i| i != 0)
    }
}

impl FromSql for f64 {
    fn column_result(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Real(f) => Ok(f),
            ValueRef::Integer(i) => Ok(i as f64),
            other => Err(format!("expected a number, found {}", other.kind())),
        }
    }
}

impl FromSql for String {
    fn column_result(value: ValueRef<'_>) -> Result<Self, String> {
        value.as_str().map(str::to_string)
    }
}

impl FromSql for Vec<u8> {
    fn column_result(value: ValueRef<'_>) -> Result<Self, String> {
        value.as_blob().map(<[u8]>::to_vec)
    }
}

impl<const N: usize> FromSql for [u8; N] {
    fn column_result(value: ValueRef<'_>) -> Result<Self, String> {
        let blob = value.as_blob()?;
        <[u8; N]>::try_from(blob).map_err(|_| format!("expected {N} bytes, found {}", blob.len()))
    }
}

impl<T: FromSql> FromSql for Option<T> {
    fn column_result(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Null => Ok(None),
            value => T::column_result(value).map(Some),
        }
    }
}

/// A statement's parameters: `params![a, b]`, `[a]`, `[]` or [`params_from_iter`].
pub trait Params {
    fn values(&self) -> Result<Vec<ValueRef<'_>>>;
}

fn values_of<'a>(items: impl Iterator<Item = &'a dyn ToSql>) -> Result<Vec<ValueRef<'a>>> {
    items
        .enumerate()
        .map(|(i, v)| {
            v.to_sql().map_err(|message| Error::Parameter {
                index: i + 1,
                message,
            })
        })
        .collect()
}

impl Params for [&dyn ToSql; 0] {
    fn values(&self) -> Result<Vec<ValueRef<'_>>> {
        Ok(Vec::new())
    }
}

impl Params for &[&dyn ToSql] {
    fn values(&self) -> Result<Vec<ValueRef<'_>>> {
        values_of(self.iter().copied())
    }
}

macro_rules! array_params {
    ($($n:literal)+) => {$(
        impl<T: ToSql> Params for [T; $n] {
            fn values(&self) -> Result<Vec<ValueRef<'_>>> {
                values_of(self.iter().map(|v| v as &dyn ToSql))
            }
        }
    )+};
}
array_params!(1 2 3 4 5 6 7 8);

/// Parameters from an iterator (a statement built for a number of rows).
pub struct ParamsFromIter<T>(Vec<T>);

pub fn params_from_iter<I>(iter: I) -> ParamsFromIter<I::Item>
where
    I: IntoIterator,
    I::Item: ToSql,
{
    ParamsFromIter(iter.into_iter().collect())
}

impl<T: ToSql> Params for ParamsFromIter<T> {
    fn values(&self) -> Result<Vec<ValueRef<'_>>> {
        values_of(self.0.iter().map(|v| v as &dyn ToSql))
    }
}

/// `params![a, b, c]`: a statement's parameters of mixed types.
#[macro_export]
macro_rules! params {
    () => { [] as [&dyn $crate::store::sql::ToSql; 0] };
    ($($param:expr),+ $(,)?) => {
        &[$(&$param as &dyn $crate::store::sql::ToSql),+] as &[&dyn $crate::store::sql::ToSql]
    };
}
pub use crate::params;

/// `Result<T>` → `Result<Option<T>>`: no row is `None`.
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(Error::NoRows) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Which database a connection talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A connection to the index.
pub struct Connection {
    inner: Inner,
}

enum Inner {
    Sqlite(rusqlite::Connection),
    Postgres(Box<PgConn>),
}

impl From<rusqlite::Connection> for Connection {
    fn from(conn: rusqlite::Connection) -> Self {
        Connection {
            inner: Inner::Sqlite(conn),
        }
    }
}

impl Connection {
    /// An in-memory SQLite database (tests, scratch work).
    pub fn open_in_memory() -> Result<Connection> {
        Ok(rusqlite::Connection::open_in_memory()?.into())
    }

    /// A SQLite database file, without the server's settings (`store::db` opens the
    /// application's).
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Connection> {
        Ok(rusqlite::Connection::open(path)?.into())
    }

    /// A connection to PostgreSQL: `url` is a libpq-style connection string or URL.
    /// `sslmode=require` makes it TLS (tried too without `sslmode`), the server's
    /// certificate and name always checked against `ca_file` (PEM) when given, else
    /// the system's roots.
    pub fn connect_postgres(
        url: &str,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Connection, String> {
        PgConn::connect(url, ca_file).map(|pg| Connection {
            inner: Inner::Postgres(Box::new(pg)),
        })
    }

    /// [`Connection::connect_postgres`] for a caller on an async runtime's thread (a
    /// test's, a tool's look into the index): every round trip runs on a scoped thread
    /// of its own, as the client blocks on a runtime of its own, which tokio refuses
    /// inside another. A thread per round trip: not for the server's own work.
    pub fn connect_postgres_from_any_thread(
        url: &str,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Connection, String> {
        let mut pg = on_a_thread_of_its_own(|| PgConn::connect(url, ca_file))?;
        pg.any_thread = true;
        Ok(Connection {
            inner: Inner::Postgres(Box::new(pg)),
        })
    }

    /// A SQLite database file opened with `flags` (e.g. read-only for a snapshot).
    pub fn open_with_flags(
        path: &std::path::Path,
        flags: rusqlite::OpenFlags,
    ) -> Result<Connection> {
        Ok(rusqlite::Connection::open_with_flags(path, flags)?.into())
    }

    /// Sets a SQLite pragma (a file the index is rebuilt or restored into).
    pub fn pragma_update(&self, schema: Option<&str>, name: &str, value: &str) -> Result<()> {
        Ok(self.sqlite_only(name)?.pragma_update(schema, name, value)?)
    }

    /// How long a SQLite statement waits for another connection's lock.
    pub fn busy_timeout(&self, timeout: std::time::Duration) -> Result<()> {
        Ok(self.sqlite_only("busy_timeout")?.busy_timeout(timeout)?)
    }

    /// Closes the connection, reporting what SQLite could not finish (a file's last
    /// writes); a PostgreSQL connection just ends.
    pub fn close(self) -> Result<()> {
        match self.inner {
            Inner::Sqlite(c) => c.close().map_err(|(_, e)| e.into()),
            Inner::Postgres(_) => Ok(()),
        }
    }

    fn sqlite_only(&self, what: &str) -> Result<&rusqlite::Connection> {
        self.as_sqlite()
            .ok_or_else(|| Error::Value(format!("{what} is SQLite's alone")))
    }

    pub fn dialect(&self) -> Dialect {
        match self.inner {
            Inner::Sqlite(_) => Dialect::Sqlite,
            Inner::Postgres(_) => Dialect::Postgres,
        }
    }

    /// The SQLite connection underneath, for what only SQLite has (pragmas, its
    /// backup API); `None` on PostgreSQL.
    pub fn as_sqlite(&self) -> Option<&rusqlite::Connection> {
        match &self.inner {
            Inner::Sqlite(c) => Some(c),
            Inner::Postgres(_) => None,
        }
    }

    pub fn execute(&self, sql: &str, params: impl Params) -> Result<usize> {
        self.prepare(sql)?.execute(params)
    }

    /// Runs statements without parameters, as they are (no placeholder is rewritten).
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match &self.inner {
            Inner::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Inner::Postgres(pg) => pg.batch(sql),
        }
    }

    pub fn prepare(&self, sql: &str) -> Result<Statement<'_>> {
        Ok(Statement {
            inner: match &self.inner {
                Inner::Sqlite(c) => StatementInner::Sqlite(SqliteStatement::Plain(c.prepare(sql)?)),
                Inner::Postgres(pg) => StatementInner::Postgres(pg, pg.prepare(sql)?),
            },
        })
    }

    /// [`Connection::prepare`] through the connection's cache of prepared statements.
    pub fn prepare_cached(&self, sql: &str) -> Result<Statement<'_>> {
        Ok(Statement {
            inner: match &self.inner {
                Inner::Sqlite(c) => {
                    StatementInner::Sqlite(SqliteStatement::Cached(c.prepare_cached(sql)?))
                }
                Inner::Postgres(pg) => StatementInner::Postgres(pg, pg.prepare(sql)?),
            },
        })
    }

    pub fn query_row<T>(
        &self,
        sql: &str,
        params: impl Params,
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<T> {
        self.prepare(sql)?.query_row(params, f)
    }

    /// Whether the table `name` exists (a database an earlier release made may lack it).
    pub fn table_exists(&self, name: &str) -> Result<bool> {
        let sql = match self.dialect() {
            Dialect::Sqlite => "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            Dialect::Postgres => "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = ?1",
        };
        self.query_row(sql, [name], |r| r.get::<_, i64>(0))
            .map(|n| n > 0)
    }

    /// The columns of the table `name`, in order; none when it does not exist (an
    /// owner's migration asks what an earlier release's table lacks).
    pub fn table_columns(&self, name: &str) -> Result<Vec<String>> {
        let sql = match self.dialect() {
            Dialect::Sqlite => "SELECT name FROM pragma_table_info(?1)",
            Dialect::Postgres => "SELECT column_name FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = ?1 ORDER BY ordinal_position",
        };
        self.prepare(sql)?
            .query_map([name], |r| r.get(0))?
            .collect()
    }

    /// The statement that created the table `name`, where the database keeps it
    /// (SQLite); `None` when the table does not exist, and always on PostgreSQL,
    /// which keeps none (no earlier release's table there needs rebuilding).
    pub fn table_definition(&self, name: &str) -> Result<Option<String>> {
        match self.dialect() {
            Dialect::Sqlite => self
                .query_row(
                    "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?1",
                    [name],
                    |r| r.get(0),
                )
                .optional(),
            Dialect::Postgres => Ok(None),
        }
    }

    /// Checks foreign keys at the commit, not at each statement, for the rest of the
    /// transaction (a migration that renames and rebuilds a table others refer to).
    pub fn defer_foreign_keys(&self) -> Result<()> {
        self.execute_batch(match self.dialect() {
            Dialect::Sqlite => "PRAGMA defer_foreign_keys = ON",
            Dialect::Postgres => "SET CONSTRAINTS ALL DEFERRED",
        })
    }

    /// Starts a (deferred) transaction, rolled back unless committed.
    pub fn transaction(&self) -> Result<Transaction<'_>> {
        self.execute_batch("BEGIN")?;
        Ok(Transaction {
            conn: self,
            done: false,
        })
    }

    /// Begins the writer's transaction. SQLite: `BEGIN IMMEDIATE`, its one write lock.
    /// PostgreSQL: a transaction that first takes [`PG_WRITE_LOCK`], so the writers of
    /// every node sharing the database run one at a time, as on SQLite: each sees
    /// every commit before it (READ COMMITTED, after the lock), and a check made in
    /// the transaction (the lock holder, the successor rule) holds until its commit.
    pub(crate) fn begin_write(&self) -> Result<()> {
        match &self.inner {
            Inner::Sqlite(_) => self.run_cached("BEGIN IMMEDIATE"),
            Inner::Postgres(pg) => {
                // One round trip for both (the simple query protocol): every write
                // group pays for it, on every node.
                pg.batch(&format!(
                    "BEGIN ISOLATION LEVEL READ COMMITTED; SELECT pg_advisory_xact_lock({PG_WRITE_LOCK})"
                ))?;
                pg.state.set(PgTransaction::Write);
                Ok(())
            }
        }
    }

    /// Begins a read transaction: one snapshot for all of its statements.
    pub(crate) fn begin_read(&self) -> Result<()> {
        match &self.inner {
            Inner::Sqlite(_) => self.run_cached("BEGIN"),
            Inner::Postgres(pg) => {
                self.run_cached("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
                pg.state.set(PgTransaction::Read);
                Ok(())
            }
        }
    }

    /// Ends the open transaction: `COMMIT` or `ROLLBACK`. A PostgreSQL transaction in
    /// which a statement failed (and no savepoint undid it) is rolled back and
    /// reported ([`Error::Aborted`]): the server's own `COMMIT` would roll it back
    /// without an error, and a write would be acknowledged that never happened.
    pub(crate) fn end_transaction(&self, commit: bool) -> Result<()> {
        let aborted = match &self.inner {
            Inner::Postgres(pg) => pg.failed.get(),
            Inner::Sqlite(_) => false,
        };
        let outcome = self.run_cached(if commit && !aborted {
            "COMMIT"
        } else {
            "ROLLBACK"
        });
        if let Inner::Postgres(pg) = &self.inner {
            pg.state.set(PgTransaction::None);
            pg.failed.set(false);
        }
        match outcome {
            Ok(()) if commit && aborted => Err(Error::Aborted),
            outcome => outcome,
        }
    }

    /// Starts the savepoint one job of a shared write transaction runs in.
    pub(crate) fn savepoint(&self) -> Result<()> {
        self.run_cached("SAVEPOINT job")
    }

    /// Keeps the job's changes.
    pub(crate) fn release_savepoint(&self) -> Result<()> {
        self.run_cached("RELEASE job")
    }

    /// Undoes the job's changes and goes on with the transaction (on PostgreSQL, no
    /// longer aborted by a statement of the job that failed).
    pub(crate) fn rollback_to_savepoint(&self) -> Result<()> {
        self.run_cached("ROLLBACK TO job")?;
        if let Inner::Postgres(pg) = &self.inner {
            pg.failed.set(false);
        }
        self.run_cached("RELEASE job")
    }

    /// Whether a transaction is open (one a panic left open is rolled back first).
    pub(crate) fn in_transaction(&self) -> bool {
        match &self.inner {
            Inner::Sqlite(c) => !c.is_autocommit(),
            Inner::Postgres(pg) => pg.state.get() != PgTransaction::None,
        }
    }

    /// Whether this is the writer's transaction ([`Connection::begin_write`]), never a
    /// reader's. Code that judges a write both early on a reader and again in its commit
    /// (the write guards, the freeze check) records what it finds only here.
    pub fn in_write_transaction(&self) -> bool {
        match &self.inner {
            Inner::Sqlite(c) => matches!(
                c.transaction_state(Some(rusqlite::MAIN_DB)),
                Ok(rusqlite::TransactionState::Write)
            ),
            Inner::Postgres(pg) => pg.state.get() == PgTransaction::Write,
        }
    }

    /// Runs `f` on every row of `sql` (a query without parameters that may read a whole
    /// table), inside the caller's transaction (PostgreSQL refuses a cursor outside
    /// one). SQLite steps through the rows; a PostgreSQL query's rows would all arrive
    /// at once, so they are fetched [`SCAN_BATCH`] at a time through a cursor: memory
    /// stays bounded whatever the table's size.
    pub fn for_each_row(&self, sql: &str, mut f: impl FnMut(&Row<'_>) -> Result<()>) -> Result<()> {
        let pg = match &self.inner {
            Inner::Sqlite(_) => {
                let mut stmt = self.prepare(sql)?;
                let mut rows = stmt.query([])?;
                while let Some(row) = rows.next()? {
                    f(&row)?;
                }
                return Ok(());
            }
            Inner::Postgres(pg) => pg,
        };
        static CURSORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let cursor = format!(
            "stategate_scan_{}",
            CURSORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        pg.batch(&format!(
            "DECLARE {cursor} NO SCROLL CURSOR FOR {}",
            postgres_statement(sql)
        ))?;
        let fetch = format!("FETCH {SCAN_BATCH} FROM {cursor}");
        let mut scan = || -> Result<()> {
            loop {
                let rows = pg.noted(pg.with_client(|c| c.query(fetch.as_str(), &[])))?;
                if rows.is_empty() {
                    return Ok(());
                }
                for row in &rows {
                    f(&Row {
                        inner: RowInner::Postgres(row),
                    })?;
                }
            }
        };
        let scanned = scan();
        let closed = pg.batch(&format!("CLOSE {cursor}"));
        scanned?;
        closed
    }

    /// A number that changes whenever another connection commits: SQLite's
    /// `PRAGMA data_version`. `None` on PostgreSQL, whose other nodes commit unseen:
    /// nothing read there is remembered.
    pub(crate) fn change_count(&self) -> Result<Option<i64>> {
        match &self.inner {
            Inner::Sqlite(_) => self
                .prepare_cached("PRAGMA data_version")?
                .query_row([], |r| r.get(0))
                .map(Some),
            Inner::Postgres(_) => Ok(None),
        }
    }

    /// Whether the connection is gone for good (PostgreSQL: the server closed it or
    /// the network failed): a new one must be opened.
    pub fn is_broken(&self) -> bool {
        match &self.inner {
            Inner::Sqlite(_) => false,
            Inner::Postgres(pg) => pg.with_client(|c| c.is_closed()),
        }
    }

    /// Runs `sql` (a statement without parameters) through the statement cache.
    pub(crate) fn run_cached(&self, sql: &str) -> Result<()> {
        self.prepare_cached(sql)?.execute([])?;
        Ok(())
    }
}

/// Makes room in a table of short-lived rows before an insert: deletes the rows whose
/// `expiry` column is at or before `now`, then, while `max` or more remain, the ones
/// that expire first (ties by `key`). For the owners of such tables (`ui::reveal`,
/// `ui::sso_rows`); the names are theirs, never input.
pub fn make_room(
    conn: &Connection,
    table: &'static str,
    key: &'static str,
    expiry: &'static str,
    now: i64,
    max: i64,
) -> Result<()> {
    conn.prepare_cached(&format!("DELETE FROM {table} WHERE {expiry} <= ?1"))?
        .execute(params![now])?;
    let rows: i64 = conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))?;
    if rows >= max {
        conn.prepare_cached(&format!(
            "DELETE FROM {table} WHERE {key} IN (
                 SELECT {key} FROM {table} ORDER BY {expiry}, {key} LIMIT ?1)"
        ))?
        .execute(params![rows - max + 1])?;
    }
    Ok(())
}

/// A transaction on a [`Connection`]: rolled back when dropped uncommitted.
pub struct Transaction<'c> {
    conn: &'c Connection,
    done: bool,
}

impl Transaction<'_> {
    pub fn commit(mut self) -> Result<()> {
        self.done = true;
        self.conn.execute_batch("COMMIT")
    }
}

impl std::ops::Deref for Transaction<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

/// A prepared statement.
pub struct Statement<'c> {
    inner: StatementInner<'c>,
}

enum StatementInner<'c> {
    Sqlite(SqliteStatement<'c>),
    Postgres(&'c PgConn, postgres::Statement),
}

enum SqliteStatement<'c> {
    Plain(rusqlite::Statement<'c>),
    Cached(rusqlite::CachedStatement<'c>),
}

impl<'c> SqliteStatement<'c> {
    fn get(&mut self) -> &mut rusqlite::Statement<'c> {
        match self {
            SqliteStatement::Plain(s) => s,
            SqliteStatement::Cached(s) => s,
        }
    }
}

/// Binds our values to a SQLite statement.
struct SqliteValue<'a>(ValueRef<'a>);

impl rusqlite::ToSql for SqliteValue<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::ValueRef as V;
        Ok(rusqlite::types::ToSqlOutput::Borrowed(match self.0 {
            ValueRef::Null => V::Null,
            ValueRef::Integer(i) => V::Integer(i),
            ValueRef::Real(f) => V::Real(f),
            ValueRef::Text(t) => V::Text(t),
            ValueRef::Blob(b) => V::Blob(b),
        }))
    }
}

fn sqlite_params<'a>(values: &'a [ValueRef<'a>]) -> impl rusqlite::Params + 'a {
    rusqlite::params_from_iter(values.iter().map(|v| SqliteValue(*v)))
}

/// Rows of a query, each mapped as it is read.
pub type MappedRows<'s, T> = Box<dyn Iterator<Item = Result<T>> + 's>;

impl Statement<'_> {
    /// How many columns its rows have.
    pub fn column_count(&mut self) -> usize {
        match &mut self.inner {
            StatementInner::Sqlite(s) => s.get().column_count(),
            StatementInner::Postgres(_, stmt) => stmt.columns().len(),
        }
    }

    /// The names of its columns, in order.
    pub fn column_names(&mut self) -> Vec<String> {
        match &mut self.inner {
            StatementInner::Sqlite(s) => s
                .get()
                .column_names()
                .into_iter()
                .map(str::to_string)
                .collect(),
            StatementInner::Postgres(_, stmt) => stmt
                .columns()
                .iter()
                .map(|c| c.name().to_string())
                .collect(),
        }
    }

    /// How many parameters it takes.
    pub fn parameter_count(&mut self) -> usize {
        match &mut self.inner {
            StatementInner::Sqlite(s) => s.get().parameter_count(),
            StatementInner::Postgres(_, stmt) => stmt.params().len(),
        }
    }

    pub fn execute(&mut self, params: impl Params) -> Result<usize> {
        let values = params.values()?;
        match &mut self.inner {
            StatementInner::Sqlite(s) => Ok(s.get().execute(sqlite_params(&values))?),
            StatementInner::Postgres(pg, stmt) => {
                let params = pg_params(&values);
                let params = params.as_refs();
                let changed = pg.noted(pg.with_client(|c| c.execute(&*stmt, &params)))?;
                Ok(changed as usize)
            }
        }
    }

    /// The first row's mapping; [`Error::NoRows`] when there is none.
    pub fn query_row<T>(
        &mut self,
        params: impl Params,
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut rows = self.query(params)?;
        match rows.next()? {
            Some(row) => f(&row),
            None => Err(Error::NoRows),
        }
    }

    pub fn query_map<'s, T: 's>(
        &'s mut self,
        params: impl Params,
        mut f: impl FnMut(&Row<'_>) -> Result<T> + 's,
    ) -> Result<MappedRows<'s, T>> {
        let mut rows = self.query(params)?;
        Ok(Box::new(std::iter::from_fn(move || match rows.next() {
            Ok(Some(row)) => Some(f(&row)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        })))
    }

    /// The rows, read one at a time (`while let Some(row) = rows.next()? { … }`).
    pub fn query(&mut self, params: impl Params) -> Result<Rows<'_>> {
        let values = params.values()?;
        Ok(Rows {
            inner: match &mut self.inner {
                StatementInner::Sqlite(s) => {
                    RowsInner::Sqlite(s.get().query(sqlite_params(&values))?)
                }
                StatementInner::Postgres(pg, stmt) => {
                    let params = pg_params(&values);
                    let params = params.as_refs();
                    let rows = pg.noted(pg.with_client(|c| c.query(&*stmt, &params)))?;
                    RowsInner::Postgres(rows.into_iter())
                }
            },
            current: None,
        })
    }
}

/// The rows of a query.
pub struct Rows<'s> {
    inner: RowsInner<'s>,
    current: Option<postgres::Row>,
}

enum RowsInner<'s> {
    Sqlite(rusqlite::Rows<'s>),
    Postgres(std::vec::IntoIter<postgres::Row>),
}

impl Rows<'_> {
    #[allow(clippy::should_implement_trait)] // lends each row: not an Iterator
    pub fn next(&mut self) -> Result<Option<Row<'_>>> {
        match &mut self.inner {
            RowsInner::Sqlite(rows) => Ok(rows.next()?.map(|r| Row {
                inner: RowInner::Sqlite(r),
            })),
            RowsInner::Postgres(rows) => {
                self.current = rows.next();
                Ok(self.current.as_ref().map(|r| Row {
                    inner: RowInner::Postgres(r),
                }))
            }
        }
    }
}

/// A column's position (from 0); only `usize`, so a literal `0` needs no suffix.
pub trait RowIndex {
    fn index(self) -> usize;
}

impl RowIndex for usize {
    fn index(self) -> usize {
        self
    }
}

/// One row of a query's answer.
pub struct Row<'a> {
    inner: RowInner<'a>,
}

enum RowInner<'a> {
    Sqlite(&'a rusqlite::Row<'a>),
    Postgres(&'a postgres::Row),
}

impl Row<'_> {
    /// Column `index` (from 0) as `T`.
    pub fn get<I: RowIndex, T: FromSql>(&self, index: I) -> Result<T> {
        let index = index.index();
        let value = self.get_ref(index)?;
        T::column_result(value).map_err(|message| Error::Column { index, message })
    }

    /// Column `index` as it is stored, borrowed from the row.
    pub fn get_ref(&self, index: usize) -> Result<ValueRef<'_>> {
        match &self.inner {
            RowInner::Sqlite(r) => {
                use rusqlite::types::ValueRef as V;
                Ok(match r.get_ref(index)? {
                    V::Null => ValueRef::Null,
                    V::Integer(i) => ValueRef::Integer(i),
                    V::Real(f) => ValueRef::Real(f),
                    V::Text(t) => ValueRef::Text(t),
                    V::Blob(b) => ValueRef::Blob(b),
                })
            }
            RowInner::Postgres(r) => pg_value(r, index),
        }
    }
}

// ---------------------------------------------------------------------------------
// PostgreSQL

/// A PostgreSQL connection with its prepared statements (the server keeps them per
/// connection; a statement is prepared once per distinct SQL text).
struct PgConn {
    /// `None` only while it is dropped (see `Drop`).
    client: RefCell<Option<postgres::Client>>,
    statements: RefCell<HashMap<String, postgres::Statement>>,
    state: Cell<PgTransaction>,
    /// A statement failed in the open transaction and no savepoint undid it.
    failed: Cell<bool>,
    /// The server's process for this session, while it is one of [`own_sessions`].
    backend: Option<i32>,
    /// Every round trip on a scoped thread of its own
    /// ([`Connection::connect_postgres_from_any_thread`]).
    any_thread: bool,
}

/// Runs `f` on a scoped thread and returns what it returns (its panic goes on).
fn on_a_thread_of_its_own<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// The server-side processes of this process's own open PostgreSQL sessions.
static OWN_SESSIONS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// The server-side process ids (`pg_backend_pid`) of this process's own open
/// PostgreSQL sessions, so that a check for *another* stategate on a database (`index
/// migrate`, a rebuild or a restore into one) does not count the command's own, such
/// as the keyring's kept connection.
pub fn own_sessions() -> Vec<i32> {
    OWN_SESSIONS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PgTransaction {
    None,
    Read,
    Write,
}

/// The `application_name` of every connection stategate makes (unless the URL names
/// one): `pg_stat_activity` shows which sessions are stategate's.
pub const APPLICATION_NAME: &str = "stategate";

/// The transaction-scoped advisory lock every PostgreSQL write transaction takes
/// first (any fixed number; "stategate" in ASCII, folded into 63 bits).
pub const PG_WRITE_LOCK: i64 = 0x7374_6174_6567_6174;

/// The client owns a runtime of its own, which tokio refuses to drop on an async
/// runtime's thread (a `Db` may be dropped inside a task): it is dropped on a thread
/// of its own there.
impl Drop for PgConn {
    fn drop(&mut self) {
        if let Some(pid) = self.backend {
            let mut own = OWN_SESSIONS.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(at) = own.iter().position(|p| *p == pid) {
                own.swap_remove(at);
            }
        }
        self.statements.get_mut().clear();
        if let Some(client) = self.client.get_mut().take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                let _ = std::thread::Builder::new()
                    .name("postgres-close".into())
                    .spawn(move || drop(client));
            }
        }
    }
}

/// How long a connection may take to open, unless the URL says (`connect_timeout`):
/// a database address that drops packets (a primary gone mid-failover) fails the
/// request instead of holding it for the system's TCP timeout of minutes.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long sent data may go unacknowledged before the connection is given up, unless
/// the URL says (`tcp_user_timeout`): a request on a connection to a server that
/// vanished without closing it (a partition, a powered-off host) fails after this, not
/// after the kernel's retransmissions (15 minutes).
const TCP_USER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long the server lets a session sit idle inside a transaction before it ends
/// it, unless the URL's `options` set `idle_in_transaction_session_timeout`. A node
/// frozen in the middle of a write (a paused VM, a partition) holds the index's write
/// lock, and every other node's writes wait for it: the server ends that session and
/// frees the lock after this. stategate's own transactions never pause this long.
pub const IDLE_IN_TRANSACTION: std::time::Duration = std::time::Duration::from_secs(60);

/// The connection waits [`CONNECT_TIMEOUT`] and [`TCP_USER_TIMEOUT`] bound, where the
/// URL sets none of its own.
fn bound_waits(config: &mut postgres::Config) {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
}

/// Rows a PostgreSQL scan fetches at once ([`Connection::for_each_row`]).
const SCAN_BATCH: usize = 1000;

/// Distinct statements kept prepared per connection; past it the cache starts over
/// (statements built for a number of rows are distinct texts).
const PG_STATEMENT_CACHE: usize = 512;

impl PgConn {
    fn connect(url: &str, ca_file: Option<&std::path::Path>) -> Result<PgConn, String> {
        let mut config: postgres::Config = url
            .parse()
            .map_err(|e| format!("index.url is not a PostgreSQL connection string: {e}"))?;
        // How `index migrate` tells that a server is using the database.
        if config.get_application_name().is_none() {
            config.application_name(APPLICATION_NAME);
        }
        bound_waits(&mut config);
        let mut client = match config.get_ssl_mode() {
            postgres::config::SslMode::Disable => config.connect(postgres::NoTls),
            _ => config.connect(tls_connector(ca_file)?),
        }
        .map_err(|e| format!("cannot connect to PostgreSQL: {e}"))?;
        // A reply is sent after COMMIT returns: it must mean the commit is on disk,
        // whatever the server's or the role's default says. Notices ("already exists,
        // skipping") are not worth a log line.
        let mut settings =
            "SET synchronous_commit = on; SET client_min_messages = warning".to_string();
        if !config
            .get_options()
            .is_some_and(|o| o.contains("idle_in_transaction_session_timeout"))
        {
            settings += &format!(
                "; SET idle_in_transaction_session_timeout = {}",
                IDLE_IN_TRANSACTION.as_millis()
            );
        }
        // One round trip for all of them, on every connection opened.
        client
            .batch_execute(&settings)
            .map_err(|e| format!("PostgreSQL refused the session settings ({settings}): {e}"))?;
        // Best effort: a session not listed only makes a check more cautious.
        let backend = client
            .query_one("SELECT pg_backend_pid()", &[])
            .ok()
            .and_then(|row| row.try_get::<_, i32>(0).ok());
        if let Some(pid) = backend {
            OWN_SESSIONS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(pid);
        }
        Ok(PgConn {
            client: RefCell::new(Some(client)),
            statements: RefCell::new(HashMap::new()),
            state: Cell::new(PgTransaction::None),
            failed: Cell::new(false),
            backend,
            any_thread: false,
        })
    }

    /// `f` on the client: here, or on a thread of its own for a connection made for
    /// any thread.
    fn with_client<T: Send>(&self, f: impl FnOnce(&mut postgres::Client) -> T + Send) -> T {
        let mut client = self.client();
        let client: &mut postgres::Client = &mut client;
        if self.any_thread {
            on_a_thread_of_its_own(move || f(client))
        } else {
            f(client)
        }
    }

    fn client(&self) -> std::cell::RefMut<'_, postgres::Client> {
        std::cell::RefMut::map(self.client.borrow_mut(), |c| {
            c.as_mut()
                .expect("the client is taken only when the connection drops")
        })
    }

    fn prepare(&self, sql: &str) -> Result<postgres::Statement> {
        if let Some(stmt) = self.statements.borrow().get(sql) {
            return Ok(stmt.clone());
        }
        let text = postgres_statement(sql);
        let stmt = self.noted(self.with_client(|c| c.prepare(&text)))?;
        let mut cache = self.statements.borrow_mut();
        if cache.len() >= PG_STATEMENT_CACHE {
            cache.clear();
        }
        cache.insert(sql.to_string(), stmt.clone());
        Ok(stmt)
    }

    fn batch(&self, sql: &str) -> Result<()> {
        self.noted(self.with_client(|c| c.batch_execute(sql)))?;
        Ok(())
    }

    /// Notes a statement that failed inside a transaction: PostgreSQL has aborted it
    /// (every later statement fails, and its COMMIT would roll back without an error),
    /// until a rollback to a savepoint.
    fn noted<T>(
        &self,
        result: std::result::Result<T, postgres::Error>,
    ) -> std::result::Result<T, postgres::Error> {
        if result.is_err() && self.state.get() != PgTransaction::None {
            self.failed.set(true);
        }
        result
    }
}

fn tls_connector(
    ca_file: Option<&std::path::Path>,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    if let Some(path) = ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("index.ca_file {}: {e}", path.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("index.ca_file {}: {e}", path.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("index.ca_file {}: {e}", path.display()))?;
        }
    } else {
        let found = rustls_native_certs::load_native_certs();
        for cert in found.certs {
            let _ = roots.add(cert);
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// A statement as PostgreSQL reads it: [`postgres_placeholders`], and SQLite's index
/// hints (`INDEXED BY name`, which only steer SQLite's planner) left out.
fn postgres_statement(sql: &str) -> String {
    let mut out = postgres_placeholders(sql);
    while let Some(at) = out.find(" INDEXED BY ") {
        let name_start = at + " INDEXED BY ".len();
        let name_len = out[name_start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(out.len() - name_start);
        out.replace_range(at..name_start + name_len, "");
    }
    out
}

/// `?N` → `$N`, and a bare `?` → the next number, outside quoted strings and
/// identifiers: the one rewrite between the dialects' statements.
fn postgres_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut chars = sql.chars().peekable();
    let mut quote: Option<char> = None;
    let mut next = 0usize;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => {
                quote = None;
                out.push(c);
            }
            (Some(_), c) => out.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                out.push(c);
            }
            (None, '?') => {
                let mut digits = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(*d);
                    chars.next();
                }
                if digits.is_empty() {
                    next += 1;
                    digits = next.to_string();
                } else if let Ok(n) = digits.parse::<usize>() {
                    next = next.max(n);
                }
                out.push('$');
                out.push_str(&digits);
            }
            (None, c) => out.push(c),
        }
    }
    out
}

/// An owner's SQLite DDL as PostgreSQL DDL, for the differences that are only of
/// spelling: `INTEGER` is `BIGINT` (SQLite's integers are 64-bit), a rowid key is an
/// identity column, `BLOB` is `BYTEA`, `WITHOUT ROWID` is dropped, `INSERT OR IGNORE`
/// is `ON CONFLICT DO NOTHING`, and text compares bytewise (`COLLATE "C"`), as in
/// SQLite: a listing's order and a prefix's range are the same on both. A schema with
/// triggers is written for PostgreSQL by its owner (`crate::schema::postgres`); one
/// reaching here is refused.
pub fn postgres_ddl(sqlite: &str) -> Result<String, String> {
    if sqlite.contains("CREATE TRIGGER") || sqlite.contains("RAISE(") {
        return Err("a trigger needs its owner's PostgreSQL DDL".into());
    }
    let mut out = String::with_capacity(sqlite.len() + 256);
    for statement in sqlite.split_inclusive(';') {
        let mut text = statement.to_string();
        if let Some(at) = text.find("INSERT OR IGNORE INTO") {
            text.replace_range(at..at + "INSERT OR IGNORE INTO".len(), "INSERT INTO");
            let end = text.rfind(';').unwrap_or(text.len());
            text.insert_str(end, " ON CONFLICT DO NOTHING");
        }
        out.push_str(&text);
    }
    let words: &[(&str, &str)] = &[
        (
            "INTEGER PRIMARY KEY AUTOINCREMENT",
            "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
        ),
        (") WITHOUT ROWID", ")"),
        (" INTEGER", " BIGINT"),
        (" BLOB", " BYTEA"),
        (" TEXT", " TEXT COLLATE \"C\""),
    ];
    for (from, to) in words {
        out = out.replace(from, to);
    }
    Ok(out)
}

/// A value encoded as the type PostgreSQL inferred for its parameter.
#[derive(Debug)]
struct PgValue<'a>(ValueRef<'a>);

impl postgres::types::ToSql for PgValue<'_> {
    fn to_sql(
        &self,
        ty: &postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>>
    {
        use postgres::types::{ToSql as P, Type};
        match self.0 {
            ValueRef::Null => Ok(postgres::types::IsNull::Yes),
            ValueRef::Integer(i) => match *ty {
                Type::INT8 => P::to_sql(&i, ty, out),
                Type::INT4 => P::to_sql(&i32::try_from(i)?, ty, out),
                Type::INT2 => P::to_sql(&i16::try_from(i)?, ty, out),
                Type::BOOL => P::to_sql(&(i != 0), ty, out),
                Type::FLOAT8 => P::to_sql(&(i as f64), ty, out),
                Type::TEXT | Type::VARCHAR => P::to_sql(&i.to_string(), ty, out),
                _ => Err(format!("an integer cannot be a {ty} parameter").into()),
            },
            ValueRef::Real(f) => match *ty {
                Type::FLOAT8 => P::to_sql(&f, ty, out),
                Type::FLOAT4 => P::to_sql(&(f as f32), ty, out),
                _ => Err(format!("a real cannot be a {ty} parameter").into()),
            },
            ValueRef::Text(t) => match *ty {
                Type::INT8 | Type::INT4 | Type::INT2 => {
                    Err(format!("text cannot be a {ty} parameter").into())
                }
                _ => P::to_sql(&std::str::from_utf8(t)?, ty, out),
            },
            ValueRef::Blob(b) => P::to_sql(&b, ty, out),
        }
    }

    fn accepts(_: &postgres::types::Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

fn pg_params<'a>(values: &'a [ValueRef<'a>]) -> Vec<PgValue<'a>> {
    values.iter().map(|v| PgValue(*v)).collect()
}

trait PgParams {
    fn as_refs(&self) -> Vec<&(dyn postgres::types::ToSql + Sync)>;
}

impl PgParams for Vec<PgValue<'_>> {
    fn as_refs(&self) -> Vec<&(dyn postgres::types::ToSql + Sync)> {
        self.iter().map(|v| v as _).collect()
    }
}

/// Column `index` of a PostgreSQL row, by its type.
fn pg_value(row: &postgres::Row, index: usize) -> Result<ValueRef<'_>> {
    use postgres::types::Type;
    let column = row.columns().get(index).ok_or(Error::Column {
        index,
        message: "no such column".into(),
    })?;
    let ty = column.type_().clone();
    let wrong = |e: postgres::Error| Error::Column {
        index,
        message: e.to_string(),
    };
    let value = match ty {
        Type::INT8 => row
            .try_get::<_, Option<i64>>(index)
            .map_err(wrong)?
            .map(ValueRef::Integer),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(index)
            .map_err(wrong)?
            .map(|i| ValueRef::Integer(i.into())),
        Type::INT2 => row
            .try_get::<_, Option<i16>>(index)
            .map_err(wrong)?
            .map(|i| ValueRef::Integer(i.into())),
        Type::BOOL => row
            .try_get::<_, Option<bool>>(index)
            .map_err(wrong)?
            .map(|b| ValueRef::Integer(b.into())),
        Type::FLOAT8 => row
            .try_get::<_, Option<f64>>(index)
            .map_err(wrong)?
            .map(ValueRef::Real),
        Type::FLOAT4 => row
            .try_get::<_, Option<f32>>(index)
            .map_err(wrong)?
            .map(|f| ValueRef::Real(f.into())),
        Type::BYTEA => row
            .try_get::<_, Option<&[u8]>>(index)
            .map_err(wrong)?
            .map(ValueRef::Blob),
        _ => row
            .try_get::<_, Option<&str>>(index)
            .map_err(|e| Error::Column {
                index,
                message: format!("{ty} is not read (cast it to BIGINT, TEXT or BYTEA): {e}"),
            })?
            .map(|s| ValueRef::Text(s.as_bytes())),
    };
    Ok(value.unwrap_or(ValueRef::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection's waits are bounded by default, and the URL's own bounds win.
    #[test]
    fn connection_waits_are_bounded_unless_the_url_says() {
        use std::time::Duration;
        let cases = [
            ("postgres://h/db", CONNECT_TIMEOUT, TCP_USER_TIMEOUT),
            (
                "postgres://h/db?connect_timeout=3",
                Duration::from_secs(3),
                TCP_USER_TIMEOUT,
            ),
            (
                "host=h dbname=db tcp_user_timeout=5",
                CONNECT_TIMEOUT,
                Duration::from_secs(5),
            ),
        ];
        for (url, connect, user) in cases {
            let mut config: postgres::Config = url.parse().unwrap();
            bound_waits(&mut config);
            assert_eq!(config.get_connect_timeout(), Some(&connect), "{url}");
            assert_eq!(config.get_tcp_user_timeout(), Some(&user), "{url}");
        }
    }

    #[test]
    fn placeholders_become_numbered_outside_quotes() {
        let cases = [
            (
                "SELECT a FROM t WHERE k = ?1",
                "SELECT a FROM t WHERE k = $1",
            ),
            ("VALUES (?1, ?2, ?1)", "VALUES ($1, $2, $1)"),
            ("VALUES (?, ?)", "VALUES ($1, $2)"),
            (
                "SELECT '?1', \"a?\" WHERE x = ?12",
                "SELECT '?1', \"a?\" WHERE x = $12",
            ),
            ("SELECT 'it''s ?' , ?3", "SELECT 'it''s ?' , $3"),
        ];
        for (sqlite, postgres) in cases {
            assert_eq!(postgres_placeholders(sqlite), postgres, "{sqlite}");
        }
        assert_eq!(
            postgres_statement("SELECT a FROM t INDEXED BY t_by_a WHERE a = ?1"),
            "SELECT a FROM t WHERE a = $1"
        );
    }

    #[test]
    fn sqlite_ddl_is_spelled_for_postgres() {
        let ddl = "CREATE TABLE IF NOT EXISTS t (
    id   INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL, -- a comment
    data BLOB
);
CREATE TABLE IF NOT EXISTS u (k TEXT PRIMARY KEY, n INTEGER) WITHOUT ROWID;
INSERT OR IGNORE INTO u (k, n) SELECT name, id FROM t;";
        let pg = postgres_ddl(ddl).unwrap();
        assert_eq!(
            pg,
            "CREATE TABLE IF NOT EXISTS t (
    id   BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    name TEXT COLLATE \"C\" NOT NULL, -- a comment
    data BYTEA
);
CREATE TABLE IF NOT EXISTS u (k TEXT COLLATE \"C\" PRIMARY KEY, n BIGINT);
INSERT INTO u (k, n) SELECT name, id FROM t ON CONFLICT DO NOTHING;"
        );
        assert!(postgres_ddl(
            "CREATE TRIGGER x BEFORE DELETE ON t BEGIN SELECT RAISE(ABORT, 'no'); END;"
        )
        .is_err());
    }

    #[test]
    fn values_round_trip_through_sqlite() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (i INTEGER, s TEXT, b BLOB, n INTEGER)")
            .unwrap();
        let blob = [1u8, 2, 3];
        conn.execute(
            "INSERT INTO t VALUES (?1, ?2, ?3, ?4)",
            params![42u32, "x", blob, None::<i64>],
        )
        .unwrap();
        let (i, s, b, n): (u32, String, Vec<u8>, Option<i64>) = conn
            .query_row("SELECT i, s, b, n FROM t", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .unwrap();
        assert_eq!((i, s.as_str(), b.as_slice(), n), (42, "x", &blob[..], None));
        let none = conn
            .query_row("SELECT i FROM t WHERE s = ?1", ["y"], |r| {
                r.get::<_, i64>(0)
            })
            .optional()
            .unwrap();
        assert_eq!(none, None);
        let too_big = conn.execute("INSERT INTO t (i) VALUES (?1)", [u64::MAX]);
        assert!(matches!(too_big, Err(Error::Parameter { index: 1, .. })));
    }
}
