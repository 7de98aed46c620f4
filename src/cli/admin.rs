//! The admin commands: operators, and the cluster API's orgs, users, tokens, clusters
//! and the audit log. Each opens the index through `installation::records` (the server
//! may keep running: writes are serialized) and calls `cluster::identity`,
//! `operator::identity` or `store::audit` in one transaction; nothing here decides
//! policy. A revocation or a narrowed role is recorded in the blob store before it
//! commits (`Records`), so a restore from an older backup cannot undo it.

use clap::{Subcommand, ValueEnum};
use stategate::store::sql::Connection;

use stategate::cluster::identity::{self, AdminError, Role};
use stategate::config::Config;
use stategate::installation::{
    self,
    records::{Recorded, Records, RoleChanged},
};
use stategate::operator::identity as operators;
use stategate::operator::roles::Grant;
use stategate::store::audit;

use super::output::{cli_error, listing, operator, print_token, runtime, when, when_opt};

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Organizations (the unit clusters and admins belong to).
    Org {
        #[command(subcommand)]
        command: OrgCommand,
    },
    /// Users (principals): an email in one org with a role.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Bearer tokens of existing users.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Clusters registered to an org.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// The append-only audit log.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Operators: site-wide identities for the admin HTTP API (`/api/v1/admin/`).
    Operator {
        #[command(subcommand)]
        command: OperatorCommand,
    },
}

#[derive(Subcommand)]
pub enum OperatorCommand {
    /// Create an operator and print its bearer token ONCE (only its hash is stored).
    Create {
        /// The operator's email.
        #[arg(long)]
        email: String,
        /// viewer (masked reads, diffs, history, audit, search, drift list), operator
        /// (+ force-unlock, rollback, restore, drift run and approve) or admin
        /// (+ reveal and download of unmasked state).
        #[arg(long, default_value = "admin")]
        role: String,
        /// Limit the operator to these workspaces: comma-separated names or patterns
        /// where `*` matches anything (`prod-*,shared`). Default: every workspace.
        #[arg(long)]
        workspaces: Option<String>,
    },
    /// List operators with their role and workspace patterns.
    List {
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Change an operator's role and workspace patterns (holds at once, also for
    /// open UI sessions and its tokens). For a single sign-on operator this sets its
    /// cap: its groups at the provider never give it more (`--role admin` without
    /// `--workspaces` lifts the cap). Recorded in the blob store first, so a restore
    /// from an older backup re-applies it.
    SetRole {
        /// The operator's email.
        #[arg(long)]
        email: String,
        /// viewer, operator or admin.
        #[arg(long)]
        role: String,
        /// Comma-separated names or `*` patterns; default: every workspace.
        #[arg(long)]
        workspaces: Option<String>,
    },
    /// Operator tokens.
    Token {
        #[command(subcommand)]
        command: OperatorTokenCommand,
    },
}

#[derive(Subcommand)]
pub enum OperatorTokenCommand {
    /// Print an additional token for an existing operator ONCE.
    Create {
        /// The operator's email.
        #[arg(long)]
        email: String,
    },
    /// List operator tokens by id (tokens are never shown again).
    List {
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by the id `list` prints; it stops working at once.
    Revoke {
        /// The token id (`list` prints it).
        id: String,
    },
}

#[derive(Subcommand)]
pub enum OrgCommand {
    /// Create an org.
    Create {
        /// The new org's name.
        name: String,
    },
    /// List orgs.
    List {
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum RoleArg {
    Admin,
    Member,
}

#[derive(Subcommand)]
pub enum UserCommand {
    /// Create a user and print its bearer token ONCE (only its hash is stored).
    Create {
        /// The org (its name).
        #[arg(long)]
        org: String,
        /// The user's email.
        #[arg(long)]
        email: String,
        /// admin (every cluster of the org, users) or member (its clusters).
        #[arg(long, value_enum)]
        role: RoleArg,
    },
    /// Change a user's role (audited).
    SetRole {
        /// The user's email.
        #[arg(long)]
        email: String,
        /// admin or member.
        #[arg(long, value_enum)]
        role: RoleArg,
    },
    /// Disable a user: all their tokens stop working at once (audited).
    Disable {
        /// The user's email.
        #[arg(long)]
        email: String,
    },
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Print an additional bearer token for an existing user ONCE.
    Create {
        /// The user's email.
        #[arg(long)]
        email: String,
    },
    /// List users' tokens by id (tokens are never shown again).
    List {
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,

        /// The user's email.
        #[arg(long)]
        email: Option<String>,
    },
    /// Revoke a user's token by the id `list` prints (audited).
    Revoke {
        /// The token id (`list` prints it).
        id: String,
    },
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Register a cluster to an org and print its UUID.
    Create {
        /// The org (its name).
        #[arg(long)]
        org: String,
        /// Display name (the CLI asks for it back before a force-unlock).
        #[arg(long)]
        name: Option<String>,
        /// Re-register an existing UUID (after `index rebuild` restored its states).
        #[arg(long)]
        id: Option<String>,
    },
    /// List clusters.
    List {
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,

        /// The org (its name).
        #[arg(long)]
        org: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum AuditCommand {
    /// Print the newest audit rows, oldest first.
    List {
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,

        /// Only this scope, e.g. `cluster/<uuid>`, `tf/<workspace>` or a bare workspace name.
        #[arg(long, conflicts_with = "cluster")]
        scope: Option<String>,
        /// Only this cluster (same as --scope cluster/<uuid>).
        #[arg(long)]
        cluster: Option<String>,
        /// Only events this begins (or one of their dot-separated parts), e.g.
        /// `cluster.state_lock_stolen`, `tf.lock` (every `tf.lock*`) or `rollback`.
        #[arg(long)]
        event: Option<String>,
        /// Only rows at or after this time (RFC 3339, e.g. 2026-03-01T10:00:00Z, or a date).
        #[arg(long, value_parser = stategate::store::audit::parse_instant)]
        since: Option<time::OffsetDateTime>,
        /// Only rows before this time (RFC 3339 or a date).
        #[arg(long, value_parser = stategate::store::audit::parse_instant)]
        until: Option<time::OffsetDateTime>,
        /// At most this many (the newest; 1-1000, as in the admin API).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
}

impl From<RoleArg> for Role {
    fn from(role: RoleArg) -> Role {
        match role {
            RoleArg::Admin => Role::Admin,
            RoleArg::Member => Role::Member,
        }
    }
}

pub fn run(config: &Config, command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::Org { command } => match command {
            OrgCommand::Create { name } => create_org(config, name),
            OrgCommand::List { json } => list_orgs(config, json),
        },
        AdminCommand::User { command } => match command {
            UserCommand::Create { org, email, role } => {
                create_user(config, org, email, role.into())
            }
            UserCommand::SetRole { email, role } => set_role(config, email, role.into()),
            UserCommand::Disable { email } => disable_user(config, email),
        },
        AdminCommand::Token { command } => match command {
            TokenCommand::Create { email } => create_token(config, email),
            TokenCommand::List { email, json } => list_tokens(config, email, json),
            TokenCommand::Revoke { id } => revoke_token(config, id),
        },
        AdminCommand::Operator { command } => match command {
            OperatorCommand::Create {
                email,
                role,
                workspaces,
            } => create_operator(config, email, &role, workspaces.as_deref()),
            OperatorCommand::List { json } => list_operators(config, json),
            OperatorCommand::SetRole {
                email,
                role,
                workspaces,
            } => set_operator_role(config, email, &role, workspaces.as_deref()),
            OperatorCommand::Token { command } => match command {
                OperatorTokenCommand::Create { email } => create_operator_token(config, email),
                OperatorTokenCommand::List { json } => list_operator_tokens(config, json),
                OperatorTokenCommand::Revoke { id } => revoke_operator_token(config, id),
            },
        },
        AdminCommand::Cluster { command } => match command {
            ClusterCommand::Create { org, name, id } => create_cluster(config, org, name, id),
            ClusterCommand::List { org, json } => list_clusters(config, org, json),
        },
        AdminCommand::Audit {
            command:
                AuditCommand::List {
                    scope,
                    cluster,
                    event,
                    since,
                    until,
                    limit,
                    json,
                },
        } => {
            let filter = audit::AuditFilter {
                scope,
                event,
                since,
                until,
                before_id: None,
                exclude: None,
            };
            list_audit(config, filter, cluster, limit, json)
        }
    }
}

/// The index, opened for the admin commands (`installation::records`), and a runtime
/// to drive it.
struct AdminDb {
    rt: tokio::runtime::Runtime,
    records: Records,
}

impl AdminDb {
    fn open(config: &Config) -> anyhow::Result<Self> {
        Ok(AdminDb {
            rt: runtime()?,
            records: Records::open(config)?,
        })
    }

    /// A change and its audit row, in one write transaction.
    fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, AdminError> + Send + 'static,
    ) -> anyhow::Result<T> {
        self.rt.block_on(self.records.write(f)).map_err(admin_error)
    }

    /// A listing, on the reader connection.
    fn read<T: Send + 'static>(
        &self,
        f: impl Fn(&Connection) -> Result<T, AdminError> + Send + 'static,
    ) -> anyhow::Result<T> {
        self.rt.block_on(self.records.read(f)).map_err(admin_error)
    }

    /// A change the store records first (`Records`); a warning when it could not.
    fn recorded<T>(
        &self,
        change: impl std::future::Future<Output = Result<Recorded<T>, AdminError>>,
        what: &str,
    ) -> anyhow::Result<T> {
        let Recorded { done, unrecorded } = self.rt.block_on(change).map_err(admin_error)?;
        if let Some(why) = unrecorded {
            eprintln!(
                "warning: {what} is in force but could not be recorded in the blob store \
                 ({why}); a restore from a backup taken before now would undo it: take a backup \
                 (`stategate backup`) once the store is reachable"
            );
        }
        Ok(done)
    }
}

/// The message only: `AdminError`s are written for the operator already.
fn admin_error(e: AdminError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

pub fn create_org(config: &Config, name: String) -> anyhow::Result<()> {
    AdminDb::open(config)?.write(move |c| identity::create_org(c, &name))
}

pub fn list_orgs(config: &Config, json: bool) -> anyhow::Result<()> {
    let rows: Vec<serde_json::Value> = AdminDb::open(config)?
        .read(identity::list_orgs)?
        .into_iter()
        .map(|(name, created_at)| serde_json::json!({ "name": name, "created_at": created_at }))
        .collect();
    let text = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    listing(&rows, json, "no orgs yet", &["ORG", "CREATED"], |o| {
        vec![text(o, "name"), when(&text(o, "created_at"))]
    })
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

pub fn list_clusters(config: &Config, org: Option<String>, json: bool) -> anyhow::Result<()> {
    let rows = AdminDb::open(config)?.read(move |c| identity::list_clusters(c, org.as_deref()))?;
    listing(
        &rows,
        json,
        "no clusters",
        &["CLUSTER", "ORG", "NAME", "CREATED"],
        |c| {
            vec![
                c.id.clone(),
                c.org.clone(),
                c.name.clone().unwrap_or_else(|| "-".into()),
                when(&c.created_at),
            ]
        },
    )
}

/// The newest `limit` rows, oldest first; `cluster` is a shorthand for its scope.
pub fn list_audit(
    config: &Config,
    mut filter: audit::AuditFilter,
    cluster: Option<String>,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    // `--scope prod` is the workspace's scope (`operator::audit_scope`, applied by
    // the listing, as in the admin API and the web UI).
    filter.scope = filter.scope.or(cluster.map(|id| {
        let id = uuid::Uuid::parse_str(&id).map_or(id, |u| u.hyphenated().to_string());
        stategate::cluster::scope(&id)
    }));
    let listings = installation::listings(config)?;
    let rows = runtime()?
        .block_on(listings.audit(filter, limit, &Grant::ROOT))
        .map_err(cli_error)?;
    listing(
        &rows,
        json,
        "no audit rows match",
        &["AT", "EVENT", "SCOPE", "ACTOR", "DETAILS"],
        |r| {
            vec![
                when(&r.at),
                r.event.clone(),
                r.scope.clone(),
                r.actor.clone(),
                r.payload.to_string(),
            ]
        },
    )
}

/// The columns of a token listing (principal or operator tokens).
fn token_listing(rows: &[identity::TokenRow], json: bool) -> anyhow::Result<()> {
    listing(
        rows,
        json,
        "no tokens",
        &["TOKEN ID", "EMAIL", "CREATED", "REVOKED"],
        |t| {
            vec![
                t.id.clone(),
                t.email.clone(),
                when(&t.created_at),
                when_opt(t.revoked_at.as_deref()),
            ]
        },
    )
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
    let db = AdminDb::open(config)?;
    let changed = db.recorded(
        db.records.disable_principal(email, operator()),
        "the revocation",
    )?;
    if !changed {
        eprintln!("the user is already disabled; nothing changed");
    }
    Ok(())
}

pub fn list_tokens(config: &Config, email: Option<String>, json: bool) -> anyhow::Result<()> {
    let rows = AdminDb::open(config)?
        .read(move |c| identity::list_principal_tokens(c, email.as_deref()))?;
    token_listing(&rows, json)
}

pub fn revoke_token(config: &Config, id: String) -> anyhow::Result<()> {
    let db = AdminDb::open(config)?;
    db.recorded(
        db.records.revoke_principal_token(id, operator()),
        "the revocation",
    )
}

/// The role and patterns are checked before the database is opened: a bad one creates nothing.
pub fn create_operator(
    config: &Config,
    email: String,
    role: &str,
    workspaces: Option<&str>,
) -> anyhow::Result<()> {
    let grant = Grant::parse(role, workspaces)?;
    let made = format!(
        "created operator {email}, role {}, {}",
        grant.role,
        workspaces.map_or("every workspace".to_string(), |w| format!("workspaces {w}"))
    );
    let token = AdminDb::open(config)?
        .write(move |c| operators::create_operator_with(c, &email, &grant, &operator()))?;
    eprintln!("{made}");
    print_token(&token);
    Ok(())
}

pub fn set_operator_role(
    config: &Config,
    email: String,
    role: &str,
    workspaces: Option<&str>,
) -> anyhow::Result<()> {
    let grant = Grant::parse(role, workspaces)?;
    let db = AdminDb::open(config)?;
    let RoleChanged {
        before,
        set,
        after: grant,
    } = db.recorded(
        db.records.set_operator_grant(email, grant, operator()),
        "the change",
    )?;
    match set {
        operators::RoleSet::Grant => eprintln!(
            "{}: {} of {}",
            before.email,
            grant.holds.role,
            shown(&grant.holds.workspaces())
        ),
        operators::RoleSet::SsoCap => eprintln!(
            "{} signs in through single sign-on: set its cap (its groups at the provider \
             never give it more); it holds {} of {} now",
            before.email,
            grant.holds.role,
            shown(&grant.holds.workspaces())
        ),
    }
    Ok(())
}

/// Patterns as the operator listing shows them.
fn shown(workspaces: &str) -> String {
    if workspaces.is_empty() {
        "(all)".into()
    } else {
        workspaces.to_string()
    }
}

pub fn list_operators(config: &Config, json: bool) -> anyhow::Result<()> {
    let rows = AdminDb::open(config)?.read(operators::list_operators)?;
    listing(
        &rows,
        json,
        "no operators",
        &["EMAIL", "ROLE", "WORKSPACES", "CREATED"],
        |o| {
            vec![
                o.email.clone(),
                match &o.cap {
                    Some(_) => format!("{}(capped)", o.role),
                    None => o.role.clone(),
                },
                shown(&o.workspaces),
                when(&o.created_at),
            ]
        },
    )
}

pub fn create_operator_token(config: &Config, email: String) -> anyhow::Result<()> {
    let token = AdminDb::open(config)?
        .write(move |c| operators::create_operator_token(c, &email, &operator()))?;
    print_token(&token);
    Ok(())
}

pub fn list_operator_tokens(config: &Config, json: bool) -> anyhow::Result<()> {
    let rows = AdminDb::open(config)?.read(operators::list_operator_tokens)?;
    token_listing(&rows, json)
}

pub fn revoke_operator_token(config: &Config, id: String) -> anyhow::Result<()> {
    let db = AdminDb::open(config)?;
    db.recorded(
        db.records.revoke_operator_token(id, operator()),
        "the revocation",
    )
}
