//! Every table of the database, and the one way to open it with all of them.
//!
//! Each table is defined beside the rules that use it: `store` owns `versions` and
//! `audit` (`store::db::SCHEMA`; `store::audit::SCHEMA` makes it append-only), `tofu`
//! owns `tf_locks`, `tf_plan_locks` and `tf_lock_waiters` (`tofu::SCHEMA`) `tf_write_overrides` (`tofu::guard::SCHEMA`), `tf_state_encryption` (`tofu::posture::SCHEMA`), `tf_freezes` (`tofu::freeze::SCHEMA`), `tf_moves` (`tofu::moves::SCHEMA`) and `tf_ci_tokens` (`tofu::ci_identity::SCHEMA`), `cluster` owns orgs, principals, clusters and
//! leases (`cluster::SCHEMA`), `operator` owns operators (`operator::SCHEMA`), `tokens`
//! owns every issued secret: cluster-API and operator tokens and UI sessions
//! (`tokens::SCHEMA`, which also moves older databases' token tables into it), `drift`
//! owns the drift run history (`drift::SCHEMA`), `jobs` the housekeeping claims, `ui`
//! its reveal tickets (`ui::reveal::SCHEMA`) and single sign-on rows
//! (`ui::sso_rows::SCHEMA`). This module
//! only lists them, so the server, the operator commands, the index rebuild and the
//! tests all create the same database.

use std::path::Path;

use crate::crypto::RootKey;
use crate::store::index::Schema;
use crate::store::rebuild::ScopeKeys;
use crate::store::{Db, DbError};

/// Every schema, in the order they are applied (all `CREATE … IF NOT EXISTS`).
pub const ALL: &[&str] = &[
    crate::store::db::SCHEMA,
    crate::store::audit::SCHEMA,
    crate::store::timeline::SCHEMA,
    crate::store::keyring::SCHEMA,
    crate::tofu::SCHEMA,
    crate::tofu::run_credential::SCHEMA,
    crate::tofu::guard::SCHEMA,
    crate::tofu::posture::SCHEMA,
    crate::tofu::freeze::SCHEMA,
    crate::tofu::credentials::SCHEMA,
    crate::tofu::moves::SCHEMA,
    crate::tofu::ci_identity::SCHEMA,
    crate::cluster::SCHEMA,
    crate::operator::SCHEMA,
    crate::tokens::SCHEMA,
    crate::drift::SCHEMA,
    crate::jobs::SCHEMA,
    crate::ui::reveal::SCHEMA,
    crate::ui::sso_rows::SCHEMA,
];

/// The schemas whose owner writes them anew for PostgreSQL (triggers are written
/// differently there); every other one is [`ALL`]'s, spelled by
/// `store::sql::postgres_ddl`.
const POSTGRES_WRITTEN: &[(&str, PostgresDdl)] = &[
    (crate::store::db::SCHEMA, crate::store::db::postgres_schema),
    (crate::store::audit::SCHEMA, || {
        Ok(crate::store::audit::POSTGRES_SCHEMA.into())
    }),
    (
        crate::tofu::posture::SCHEMA,
        crate::tofu::posture::postgres_schema,
    ),
    (crate::drift::SCHEMA, crate::drift::postgres_schema),
];

/// An owner's PostgreSQL DDL, made when the index is opened.
type PostgresDdl = fn() -> Result<String, String>;

/// Every schema of [`ALL`], in the same order, for PostgreSQL.
pub fn postgres() -> Result<Vec<String>, String> {
    ALL.iter()
        .map(
            |schema| match POSTGRES_WRITTEN.iter().find(|(s, _)| s == schema) {
                Some((_, written)) => written(),
                None => crate::store::sql::postgres_ddl(schema),
            },
        )
        .collect()
}

/// Opens the index on PostgreSQL at `url` with every schema applied ([`INDEX`]).
pub fn open_postgres(url: &str, ca_file: Option<&Path>) -> Result<Db, DbError> {
    INDEX.open_postgres(url, ca_file)
}

/// Every table of the index, for `store::index`: what it opens, migrates, copies and
/// snapshots.
pub const INDEX: Schema = Schema {
    all: ALL,
    postgres,
    migrations: MIGRATIONS,
    tables: TABLES,
    identities: IDENTITIES,
};

/// Every table of [`ALL`], in an order that satisfies their foreign keys, with the
/// order a copy inserts its rows in (`store::copy`, `stategate index migrate`):
/// parents before the rows that refer to them.
pub const TABLES: &[(&str, &str)] = &[
    ("versions", "1"),
    ("audit", "id"),
    ("resource_changes", "1"),
    ("resource_summary_heads", "1"),
    ("resource_instance_digests", "1"),
    ("key_generations", "1"),
    ("key_fingerprint", "1"),
    ("tf_locks", "1"),
    ("tf_plan_locks", "1"),
    ("tf_lock_waiters", "1"),
    ("tf_run_credentials", "1"),
    ("tf_write_overrides", "1"),
    ("tf_state_encryption", "1"),
    ("tf_freezes", "1"),
    ("tf_credential_generations", "1"),
    ("tf_token_grants", "1"),
    ("tf_consumers", "1"),
    ("tf_moves", "1"),
    ("tf_ci_tokens", "1"),
    ("orgs", "id"),
    ("principals", "id"),
    ("clusters", "1"),
    ("principals_disabled", "1"),
    ("cluster_leases", "1"),
    ("operators", "id"),
    ("operator_grants", "1"),
    ("operator_sso", "1"),
    ("operator_sso_caps", "1"),
    // A session's parent is an operator token, which has none.
    ("tokens", "parent IS NOT NULL, sha256"),
    // An apply run refers to the check run before it.
    ("drift_runs", "id"),
    ("drift_outputs_pruned", "1"),
    ("job_claims", "1"),
    ("ui_reveal_tickets", "1"),
    ("sso_logins", "1"),
    ("sso_sessions", "1"),
];

/// The tables whose `id` the database numbers (an identity column on PostgreSQL).
pub const IDENTITIES: &[&str] = &["audit", "orgs", "principals", "operators", "drift_runs"];

/// The kinds of scope the `versions` table holds, with the root each one's blobs are
/// sealed under: workspaces under the DEK, clusters under `ADJ_STATE_ENC_KEY` (when
/// configured). The index rebuild and backup verification open blobs with these.
pub fn scope_keys(workspaces: RootKey, clusters: Option<RootKey>) -> ScopeKeys {
    ScopeKeys::default()
        .with(crate::tofu::SCOPE_PREFIX, Some(workspaces), "no DEK")
        .with(
            crate::cluster::SCOPE_PREFIX,
            clusters,
            "cluster scope, but ADJ_STATE_ENC_KEY (cluster.state_enc_key) is not configured",
        )
        .with_timeline(crate::tofu::SCOPE_PREFIX, crate::tfstate::resource_scan)
}

/// Changes a database of an earlier release needs before [`ALL`] applies, each
/// defined by its table's owner and idempotent.
pub const MIGRATIONS: &[Migration] = &[
    crate::tofu::lock::migrate,
    crate::tokens::migrate,
    crate::store::db::migrate,
    crate::store::timeline::migrate,
    crate::drift::outcomes::migrate,
];

/// One migration: changes a table of an earlier release in place.
pub use crate::store::index::Migration;

/// Opens (creating if needed) the SQLite index at `path` with every migration and
/// schema applied ([`INDEX`]).
pub fn open_db(path: &Path) -> Result<Db, DbError> {
    INDEX.open_file(path)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A new index file with every schema applied, in a temp dir the caller keeps
    /// alive: for unit tests elsewhere that want real tables.
    pub(crate) fn test_index() -> (tempfile::TempDir, crate::store::sql::Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        drop(open_db(&path).unwrap());
        let conn = crate::store::sql::Connection::open(&path).unwrap();
        (dir, conn)
    }

    /// A database of the release before `tf_locks.credential`: `open_db` migrates it
    /// (its held lock kept, recording no credential), and opening it again is a no-op.
    #[test]
    fn an_earlier_releases_database_is_migrated_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stategate.db");
        let old = crate::store::sql::Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE tf_locks (workspace TEXT PRIMARY KEY, lock_id TEXT NOT NULL, info TEXT NOT NULL, created_at TEXT NOT NULL) WITHOUT ROWID;
             INSERT INTO tf_locks VALUES ('prod', 'a', '{}', 't');",
        )
        .unwrap();
        drop(old);
        for _ in 0..2 {
            drop(open_db(&path).unwrap());
            let conn = crate::store::sql::Connection::open(&path).unwrap();
            let held = crate::tofu::lock::held_lock_credential(&conn, "prod").unwrap();
            assert_eq!(held.map(|(l, c)| (l.id, c)), Some(("a".into(), None)));
        }
    }

    /// Every schema has PostgreSQL DDL (a trigger only in one its owner wrote).
    #[test]
    fn every_schema_has_postgres_ddl() {
        let pg = postgres().unwrap();
        assert_eq!(pg.len(), ALL.len());
        for ddl in &pg {
            assert!(
                !ddl.contains("WITHOUT ROWID") && !ddl.contains("RAISE(") && !ddl.contains(" BLOB"),
                "{ddl}"
            );
        }
    }

    /// [`TABLES`] names every table the schemas make, each once.
    #[test]
    fn every_table_is_listed_for_a_copy() {
        let conn = crate::store::db::schema_db();
        let mut made: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut listed: Vec<String> = TABLES.iter().map(|(t, _)| t.to_string()).collect();
        listed.sort();
        made.sort();
        assert_eq!(listed, made);
    }

    #[test]
    fn every_kind_of_scope_has_its_root() {
        let (dek, cluster) = (RootKey::from_bytes([1; 32]), RootKey::from_bytes([2; 32]));
        let keys = scope_keys(dek.clone(), Some(cluster.clone()));
        let (ws, cl) = (crate::tofu::scope("prod"), crate::cluster::scope("c1"));
        // Sealed with the kind's key, opened with the root it must come from.
        let sealed = |scope: &str| keys.key_for(scope).unwrap().seal(b"ad", b"x").unwrap();
        assert!(dek.blob_key(&ws).open(b"ad", &sealed(&ws)).is_ok());
        assert!(cluster.blob_key(&cl).open(b"ad", &sealed(&cl)).is_ok());
        assert!(dek.blob_key(&cl).open(b"ad", &sealed(&cl)).is_err());
        let without = scope_keys(dek, None);
        assert!(without
            .key_for(&cl)
            .unwrap_err()
            .contains("ADJ_STATE_ENC_KEY"));
        assert!(without.key_for("other/x").is_err());
    }
}
