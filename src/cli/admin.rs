//! Admin commands of the binary (`mod admin` in main.rs, not part of the library):
//! orgs, users, tokens, clusters and the audit log of the cluster API. Each opens the
//! database in the data dir (the server may keep running: SQLite has one writer at a
//! time) and calls `cluster::identity` or `store::audit`; nothing here decides policy.
//! Changes go through the writer, listings through the reader connection.

use anyhow::Context;
use rusqlite::Connection;

use stategate::cluster::identity::{self, AdminError, Role};
use stategate::config::Config;
use stategate::server;
use stategate::store::{audit, blob::create_private_dir, Db};

use crate::ops::{json_line, operator, runtime};
use stategate::operator::identity as operators;

/// The database in the data dir (created on first use) and a runtime to drive it.
struct AdminDb {
    rt: tokio::runtime::Runtime,
    db: Db,
}

impl AdminDb {
    fn open(config: &Config) -> anyhow::Result<Self> {
        create_private_dir(&config.data_dir)
            .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
        Ok(AdminDb {
            rt: runtime()?,
            db: server::open_database(config)?,
        })
    }

    /// A change and its audit row, in one write transaction.
    fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, AdminError> + Send + 'static,
    ) -> anyhow::Result<T> {
        self.rt.block_on(self.db.write(f)).map_err(admin_error)
    }

    /// A listing, on the reader connection.
    fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, AdminError> + Send + 'static,
    ) -> anyhow::Result<T> {
        let read = self.rt.block_on(self.db.read(move |c| Ok(f(c))));
        read.map_err(AdminError::from)
            .and_then(|listed| listed)
            .map_err(admin_error)
    }
}

/// The message only: `AdminError`s are written for the operator already.
fn admin_error(e: AdminError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

fn print_token(token: &str) {
    eprintln!("The token below is shown once and stored only as a hash. Keep it now:");
    println!("{token}");
}

pub fn create_org(config: &Config, name: String) -> anyhow::Result<()> {
    AdminDb::open(config)?.write(move |c| identity::create_org(c, &name))
}

pub fn list_orgs(config: &Config) -> anyhow::Result<()> {
    for (name, created_at) in AdminDb::open(config)?.read(identity::list_orgs)? {
        json_line(&serde_json::json!({ "name": name, "created_at": created_at }));
    }
    Ok(())
}

pub fn create_user(config: &Config, org: String, email: String, role: Role) -> anyhow::Result<()> {
    let token =
        AdminDb::open(config)?.write(move |c| identity::create_principal(c, &org, &email, role))?;
    print_token(&token);
    Ok(())
}

pub fn create_token(config: &Config, email: String) -> anyhow::Result<()> {
    let token = AdminDb::open(config)?.write(move |c| identity::create_token(c, &email))?;
    print_token(&token);
    Ok(())
}

pub fn create_cluster(
    config: &Config,
    org: String,
    name: Option<String>,
    id: Option<String>,
) -> anyhow::Result<()> {
    let row = AdminDb::open(config)?
        .write(move |c| identity::create_cluster(c, &org, name.as_deref(), id.as_deref()))?;
    println!("{}", row.id);
    Ok(())
}

pub fn list_clusters(config: &Config, org: Option<String>) -> anyhow::Result<()> {
    let rows = AdminDb::open(config)?.read(move |c| identity::list_clusters(c, org.as_deref()))?;
    for row in rows {
        json_line(&row);
    }
    Ok(())
}

/// The newest `limit` rows, oldest first; `cluster` is a shorthand for its scope.
pub fn list_audit(
    config: &Config,
    mut filter: audit::AuditFilter,
    cluster: Option<String>,
    limit: u32,
) -> anyhow::Result<()> {
    filter.scope = filter.scope.or(cluster.map(|id| {
        let id = uuid::Uuid::parse_str(&id).map_or(id, |u| u.hyphenated().to_string());
        stategate::cluster::scope(&id)
    }));
    let rows =
        AdminDb::open(config)?.read(move |c| Ok(audit::list_audit_filtered(c, &filter, limit)?))?;
    for row in rows {
        json_line(&row);
    }
    Ok(())
}

pub fn set_role(config: &Config, email: String, role: Role) -> anyhow::Result<()> {
    let changed =
        AdminDb::open(config)?.write(move |c| identity::set_role(c, &email, role, &operator()))?;
    if !changed {
        eprintln!(
            "the user already has role {}; nothing changed",
            role.as_str()
        );
    }
    Ok(())
}

pub fn disable_user(config: &Config, email: String) -> anyhow::Result<()> {
    let changed = AdminDb::open(config)?
        .write(move |c| identity::disable_principal(c, &email, &operator()))?;
    if !changed {
        eprintln!("the user is already disabled; nothing changed");
    }
    Ok(())
}

pub fn list_tokens(config: &Config, email: Option<String>) -> anyhow::Result<()> {
    let rows = AdminDb::open(config)?
        .read(move |c| identity::list_principal_tokens(c, email.as_deref()))?;
    rows.iter().for_each(json_line);
    Ok(())
}

pub fn revoke_token(config: &Config, id: String) -> anyhow::Result<()> {
    AdminDb::open(config)?.write(move |c| identity::revoke_principal_token(c, &id, &operator()))
}

pub fn create_operator(config: &Config, email: String) -> anyhow::Result<()> {
    let token = AdminDb::open(config)?
        .write(move |c| operators::create_operator(c, &email, &operator()))?;
    print_token(&token);
    Ok(())
}

pub fn create_operator_token(config: &Config, email: String) -> anyhow::Result<()> {
    let token = AdminDb::open(config)?
        .write(move |c| operators::create_operator_token(c, &email, &operator()))?;
    print_token(&token);
    Ok(())
}

pub fn list_operator_tokens(config: &Config) -> anyhow::Result<()> {
    let rows = AdminDb::open(config)?.read(operators::list_operator_tokens)?;
    rows.iter().for_each(json_line);
    Ok(())
}

pub fn revoke_operator_token(config: &Config, id: String) -> anyhow::Result<()> {
    AdminDb::open(config)?.write(move |c| operators::revoke_operator_token(c, &id, &operator()))
}
