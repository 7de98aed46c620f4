//! Copies a whole index from one database to another (SQLite to PostgreSQL and back:
//! `stategate index migrate`), then proves the copy: every table's rows, read back
//! from both in the same order, hash the same.
//!
//! It knows tables only by name and columns by what the source returns: which tables
//! there are, in an order that satisfies their foreign keys, is `crate::schema`'s.

use sha2::{Digest, Sha256};

use crate::store::sql::{params_from_iter, Connection, ValueRef};

/// What one table's copy found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCopy {
    pub table: String,
    pub rows: u64,
    /// SHA-256 of every row, in the order of all its columns, as read from the
    /// destination after the copy (the same as the source's).
    pub digest: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("the destination is not empty: table {table} has {rows} rows (migrate into a new, empty database)")]
    NotEmpty { table: String, rows: i64 },
    #[error("table {table}: the copy differs from the source ({what})")]
    Differs { table: String, what: String },
    #[error(transparent)]
    Sql(#[from] crate::store::sql::Error),
}

/// Copies `tables` (name, and the order its rows are inserted in, parents before the
/// rows that refer to them) from `from` into `to`, whose schema exists and whose
/// tables are empty, inside the caller's transaction on `to`; then reads both back and
/// compares. `identities` are the tables whose `id` the destination numbers itself
/// (PostgreSQL identity columns): their next number is moved past the copied ones.
pub fn copy_tables(
    from: &Connection,
    to: &Connection,
    tables: &[(&str, &str)],
    identities: &[&str],
) -> Result<Vec<TableCopy>, CopyError> {
    for (table, _) in tables {
        let rows: i64 = to.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?;
        if rows > 0 {
            return Err(CopyError::NotEmpty {
                table: table.to_string(),
                rows,
            });
        }
    }
    let mut report = Vec::new();
    for (table, insert_order) in tables {
        let columns = columns(from, table)?;
        let list = columns.join(", ");
        let placeholders = (1..=columns.len())
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut insert = to.prepare(&format!(
            "INSERT INTO {table} ({list}) VALUES ({placeholders})"
        ))?;
        let mut copied = 0u64;
        from.for_each_row(
            &format!("SELECT {list} FROM {table} ORDER BY {insert_order}"),
            |row| {
                let values = (0..columns.len())
                    .map(|i| row.get_ref(i))
                    .collect::<Result<Vec<ValueRef<'_>>, _>>()?;
                insert.execute(params_from_iter(values))?;
                copied += 1;
                Ok(())
            },
        )?;
        let source = digest(from, table, &columns)?;
        let copy = digest(to, table, &columns)?;
        if source != copy {
            return Err(CopyError::Differs {
                table: table.to_string(),
                what: format!(
                    "{} rows read from the source, {} from the copy, digests {} and {}",
                    source.0, copy.0, source.1, copy.1
                ),
            });
        }
        if copied != copy.0 {
            return Err(CopyError::Differs {
                table: table.to_string(),
                what: format!("{copied} rows copied, {} read back", copy.0),
            });
        }
        report.push(TableCopy {
            table: table.to_string(),
            rows: copy.0,
            digest: copy.1,
        });
    }
    if to.dialect() == crate::store::sql::Dialect::Postgres {
        for table in identities {
            to.query_row(
                &format!(
                    "SELECT setval(pg_get_serial_sequence('{table}', 'id'), \
                     GREATEST((SELECT max(id) FROM {table}), 1), (SELECT max(id) FROM {table}) IS NOT NULL)"
                ),
                [],
                |_| Ok(()),
            )?;
        }
    }
    Ok(report)
}

/// The columns of `table` as the source returns them.
fn columns(conn: &Connection, table: &str) -> Result<Vec<String>, crate::store::sql::Error> {
    let mut stmt = conn.prepare(&format!("SELECT * FROM {table} LIMIT 0"))?;
    Ok(stmt.column_names())
}

/// Every column, in order: a total order both databases sort alike (text bytewise).
fn order(columns: &[String]) -> String {
    (1..=columns.len())
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// (rows, SHA-256) of `table`'s rows in [`order`], each value tagged by its kind.
fn digest(
    conn: &Connection,
    table: &str,
    columns: &[String],
) -> Result<(u64, String), crate::store::sql::Error> {
    let list = columns.join(", ");
    let sql = format!("SELECT {list} FROM {table} ORDER BY {}", order(columns));
    let (mut hash, mut n) = (Sha256::new(), 0u64);
    conn.for_each_row(&sql, |row| {
        for i in 0..columns.len() {
            match row.get_ref(i)? {
                ValueRef::Null => hash.update([0]),
                ValueRef::Integer(v) => {
                    hash.update([1]);
                    hash.update(v.to_be_bytes());
                }
                ValueRef::Real(v) => {
                    hash.update([2]);
                    hash.update(v.to_be_bytes());
                }
                ValueRef::Text(t) => {
                    hash.update([3]);
                    hash.update((t.len() as u64).to_be_bytes());
                    hash.update(t);
                }
                ValueRef::Blob(b) => {
                    hash.update([4]);
                    hash.update((b.len() as u64).to_be_bytes());
                    hash.update(b);
                }
            }
        }
        n += 1;
        Ok(())
    })?;
    Ok((n, hex::encode(hash.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(rows: &[(i64, &str, Option<&[u8]>)]) -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL, data BLOB)",
        )
        .unwrap();
        for (id, name, data) in rows {
            conn.execute(
                "INSERT INTO t VALUES (?1, ?2, ?3)",
                crate::store::sql::params![id, name, data],
            )
            .unwrap();
        }
        conn
    }

    #[test]
    fn a_copy_is_read_back_and_compared() {
        let from = db(&[(2, "b", None), (1, "a", Some(b"\x00\xff"))]);
        let to = db(&[]);
        let report = copy_tables(&from, &to, &[("t", "id")], &[]).unwrap();
        assert_eq!(report.len(), 1);
        assert_eq!(report[0].rows, 2);
        assert_eq!(
            report[0].digest,
            digest(&from, "t", &columns(&from, "t").unwrap()).unwrap().1
        );
        // Into a database that is not empty: refused, nothing copied.
        let err = copy_tables(&from, &to, &[("t", "id")], &[]).unwrap_err();
        assert!(matches!(err, CopyError::NotEmpty { rows: 2, .. }), "{err}");
        // The digest sees a changed value.
        let changed = db(&[(2, "b", None), (1, "a", Some(b"\x00\xfe"))]);
        assert_ne!(
            digest(&from, "t", &columns(&from, "t").unwrap()).unwrap(),
            digest(&changed, "t", &columns(&changed, "t").unwrap()).unwrap()
        );
    }
}
