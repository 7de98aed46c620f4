//! Every table of the database, and the one way to open it with all of them.
//!
//! Each table is defined beside the rules that use it: `store` owns `versions` and
//! `audit` (`store::db::SCHEMA`; `store::audit::SCHEMA` makes it append-only), `tofu`
//! owns `tf_locks` (`tofu::SCHEMA`), `cluster` owns orgs, principals, tokens, clusters
//! and leases (`cluster::SCHEMA`), `operator` owns operators and their tokens
//! (`operator::SCHEMA`), `ui` owns the web UI's sessions (`ui::SCHEMA`), `drift` owns
//! the drift run history (`drift::SCHEMA`). This module
//! only lists them, so the server, the operator commands, the index rebuild and the
//! tests all create the same database.

use std::path::Path;

use crate::store::{Db, DbError};

/// Every schema, in the order they are applied (all `CREATE … IF NOT EXISTS`).
pub const ALL: &[&str] = &[
    crate::store::db::SCHEMA,
    crate::store::audit::SCHEMA,
    crate::tofu::SCHEMA,
    crate::cluster::SCHEMA,
    crate::operator::SCHEMA,
    crate::ui::SCHEMA,
    crate::drift::SCHEMA,
];

/// Opens (creating if needed) the database at `path` with every schema applied.
pub fn open_db(path: &Path) -> Result<Db, DbError> {
    Db::open(path, ALL)
}
