//! The `stategate` command line: clap parsing and dispatch only. The commands live in
//! `ops.rs` (workspace, prune, index), `admin.rs` (the cluster API's identities and
//! audit log) and `drift_ops.rs` (drift checks), all binary-only.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use stategate::cluster::identity::Role;
use stategate::config::Config;
use stategate::server;

mod admin;
mod drift_ops;
mod ops;
mod workspace_ops;

#[derive(Parser)]
#[command(
    name = "stategate",
    version,
    about = "A safe home for OpenTofu/Terraform state"
)]
struct Cli {
    /// TOML config file; every key can also be set by a STATEGATE_* variable.
    #[arg(long, short, global = true, env = "STATEGATE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (with no config: loopback:8080, local store in the data dir).
    Serve,
    /// Workspaces: credentials, list, show, diff, history, rollback, unlock, restore.
    Workspace {
        #[command(subcommand)]
        command: WorkspaceCommand,
    },
    /// Apply the retention policy now (retention.keep_versions / keep_days) and list
    /// garbage blobs. Prints what it deletes as JSON lines. The server may keep running.
    Prune {
        /// Only print what would be deleted.
        #[arg(long)]
        dry_run: bool,
        /// Also delete unreferenced blobs older than an hour. Check first (with
        /// --dry-run) that the database was not restored from an older backup: then
        /// those blobs are committed versions it forgot (`index rebuild` recovers them).
        #[arg(long)]
        sweep_garbage: bool,
    },
    /// Exit 0 when the server answers `GET /healthz` (for container health checks).
    Health {
        /// Default: the configured listener (via loopback when it listens on all addresses).
        #[arg(long)]
        url: Option<String>,
    },
    /// The SQLite version index.
    Index {
        #[command(subcommand)]
        command: IndexCommand,
    },
    /// Back the database (orgs, tokens, clusters, locks, audit, versions) up into the
    /// store now: a consistent snapshot sealed with the DEK, under backups/. The server
    /// may keep running. Keeps the newest backup.keep backups.
    Backup {
        #[command(subcommand)]
        command: Option<BackupCommand>,
    },
    /// Write a NEW database from a backup plus every version committed after it (from
    /// the blobs); prints how to swap it in. The live database is never touched.
    Restore {
        /// A backup id (see `stategate backup list`) or `latest`.
        #[arg(long, default_value = "latest")]
        from: String,
        /// Path of the new database file (must not exist).
        #[arg(long)]
        into: PathBuf,
    },
    /// Drift checks ([[drift]] entries): run history, run one now, approve a kept plan.
    Drift {
        #[command(subcommand)]
        command: DriftCommand,
    },
    /// Operators, orgs, users, tokens, clusters and the audit log. Opens the
    /// database in the data dir directly; the server may keep running.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
}

#[derive(Subcommand)]
enum DriftCommand {
    /// Recent drift runs, newest first: outcome, changes, the serial planned against.
    List {
        #[arg(long)]
        workspace: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One run and its plan output (decrypted from the store).
    Show {
        run: i64,
        #[arg(long)]
        json: bool,
    },
    /// Run a workspace's check now, in this process (the server must be reachable),
    /// and wait for it and its webhooks.
    Run {
        workspace: String,
        #[arg(long)]
        json: bool,
    },
    /// Approve a drifted check's kept plan and apply exactly that plan (audited). Asks
    /// for the workspace name back unless --yes. Refused twice, for a run that is not
    /// drifted, and once the plan expired.
    Apply {
        run: i64,
        #[arg(long)]
        yes: bool,
        #[arg(long)]
        json: bool,
    },
    /// Print the secret webhook receivers verify X-Stategate-Signature with.
    WebhookSecret,
}

#[derive(Subcommand)]
enum BackupCommand {
    /// List the backups in the store, oldest first (JSON lines).
    List,
}

#[derive(Subcommand)]
enum AdminCommand {
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
enum OperatorCommand {
    /// Create an operator and print its bearer token ONCE (only its hash is stored).
    Create {
        #[arg(long)]
        email: String,
    },
    /// Operator tokens.
    Token {
        #[command(subcommand)]
        command: OperatorTokenCommand,
    },
}

#[derive(Subcommand)]
enum OperatorTokenCommand {
    /// Print an additional token for an existing operator ONCE.
    Create {
        #[arg(long)]
        email: String,
    },
    /// List operator tokens by id (JSON lines; tokens are never shown again).
    List,
    /// Revoke a token by the id `list` prints; it stops working at once.
    Revoke { id: String },
}

#[derive(Subcommand)]
enum OrgCommand {
    /// Create an org.
    Create { name: String },
    /// List orgs (JSON lines).
    List,
}

#[derive(Clone, Copy, ValueEnum)]
enum RoleArg {
    Admin,
    Member,
}

#[derive(Subcommand)]
enum UserCommand {
    /// Create a user and print its bearer token ONCE (only its hash is stored).
    Create {
        #[arg(long)]
        org: String,
        #[arg(long)]
        email: String,
        #[arg(long, value_enum)]
        role: RoleArg,
    },
    /// Change a user's role (audited).
    SetRole {
        #[arg(long)]
        email: String,
        #[arg(long, value_enum)]
        role: RoleArg,
    },
    /// Disable a user: all their tokens stop working at once (audited).
    Disable {
        #[arg(long)]
        email: String,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Print an additional bearer token for an existing user ONCE.
    Create {
        #[arg(long)]
        email: String,
    },
    /// List users' tokens by id (JSON lines; tokens are never shown again).
    List {
        #[arg(long)]
        email: Option<String>,
    },
    /// Revoke a user's token by the id `list` prints (audited).
    Revoke { id: String },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Register a cluster to an org and print its UUID.
    Create {
        #[arg(long)]
        org: String,
        /// Display name (the CLI asks for it back before a force-unlock).
        #[arg(long)]
        name: Option<String>,
        /// Re-register an existing UUID (after `index rebuild` restored its states).
        #[arg(long)]
        id: Option<String>,
    },
    /// List clusters (JSON lines).
    List {
        #[arg(long)]
        org: Option<String>,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Print the newest audit rows, oldest first (JSON lines).
    List {
        /// Only this scope, e.g. `cluster/<uuid>` or `tf/<workspace>`.
        #[arg(long, conflicts_with = "cluster")]
        scope: Option<String>,
        /// Only this cluster (same as --scope cluster/<uuid>).
        #[arg(long)]
        cluster: Option<String>,
        /// Only this event, e.g. `cluster.state_lock_stolen`.
        #[arg(long)]
        event: Option<String>,
        /// Only rows at or after this time (RFC 3339, e.g. 2026-03-01T10:00:00Z, or a date).
        #[arg(long, value_parser = stategate::store::audit::parse_instant)]
        since: Option<time::OffsetDateTime>,
        /// Only rows before this time (RFC 3339 or a date).
        #[arg(long, value_parser = stategate::store::audit::parse_instant)]
        until: Option<time::OffsetDateTime>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
}

#[derive(Subcommand)]
enum WorkspaceCommand {
    /// Print `export` lines that make `terraform init` work with a bare `backend "http" {}`.
    Env {
        workspace: String,
        /// Also print TF_ENCRYPTION for OpenTofu state encryption (pbkdf2 + aes_gcm).
        #[arg(long)]
        opentofu_encryption: bool,
    },
    /// Print the workspace's versions, newest first (JSON lines). Reads SQLite only.
    History {
        workspace: String,
        /// At most this many (the newest).
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Every workspace: latest version, serial, size, update time, lock holder (with a
    /// STALE flag past locks.stale_after_seconds), deleted or not.
    List {
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print a version's state content (default: the current one). An unreadable
    /// version is an error, never empty output. Without --masked the real values are
    /// printed and the read is audited as `state.revealed`.
    Show {
        workspace: String,
        #[arg(long)]
        version: Option<i64>,
        /// Replace sensitive values (and secret-looking attributes) with "(sensitive)".
        #[arg(long)]
        masked: bool,
    },
    /// What changed from version A to version B: resources by address (changed
    /// attributes listed, sensitive values masked) and outputs.
    Diff {
        workspace: String,
        from: i64,
        to: i64,
        #[arg(long)]
        json: bool,
    },
    /// Force-unlock (audited as tf.lock_forced): prints the holder and asks for the
    /// workspace name back unless --yes. An unlocked workspace: says so, exit 0.
    Unlock {
        workspace: String,
        #[arg(long)]
        yes: bool,
        #[arg(long)]
        json: bool,
    },
    /// Undo a DELETE: the last version with content becomes current again as a new
    /// version (audited as tf.restored).
    Restore {
        workspace: String,
        #[arg(long)]
        json: bool,
    },
    /// Make an old version current again by storing its content as a NEW version
    /// (history is kept). Refused while the workspace is locked.
    Rollback {
        workspace: String,
        /// The version whose content to restore (see `workspace history`).
        #[arg(long)]
        to: i64,
    },
}

#[derive(Subcommand)]
enum IndexCommand {
    /// Rebuild the version index from the blob store alone into a NEW database file
    /// (the live one is never touched); prints how to swap it in.
    Rebuild {
        /// Path of the new database file (must not exist).
        #[arg(long)]
        into: PathBuf,
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

/// Errors end the process with one line on stderr and exit code 1 (clap's own usage
/// errors exit 2).
fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The server logs its work; operator commands print their results, and only
    // warnings log (no "storage ready" lines between them). STATEGATE_LOG overrides.
    let default_level = match cli.command {
        Command::Serve => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STATEGATE_LOG")
                .unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line ("outer: inner: root").
fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace('\n', " ")
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let config = Config::load(cli.config.as_deref()).context("invalid configuration")?;
    match cli.command {
        Command::Serve => server::run(config),
        Command::Health { url } => server::probe_health(&config, url.as_deref()),
        Command::Workspace { command } => match command {
            WorkspaceCommand::Env {
                workspace,
                opentofu_encryption,
            } => ops::env(&config, &workspace, opentofu_encryption),
            WorkspaceCommand::History { workspace, limit } => {
                ops::history(&config, &workspace, limit)
            }
            WorkspaceCommand::Rollback { workspace, to } => ops::rollback(&config, &workspace, to),
            WorkspaceCommand::List { json } => workspace_ops::list(&config, json),
            WorkspaceCommand::Show {
                workspace,
                version,
                masked,
            } => workspace_ops::show(&config, &workspace, version, masked),
            WorkspaceCommand::Diff {
                workspace,
                from,
                to,
                json,
            } => workspace_ops::diff(&config, &workspace, from, to, json),
            WorkspaceCommand::Unlock {
                workspace,
                yes,
                json,
            } => workspace_ops::unlock(&config, &workspace, yes, json),
            WorkspaceCommand::Restore { workspace, json } => {
                workspace_ops::restore(&config, &workspace, json)
            }
        },
        Command::Prune {
            dry_run,
            sweep_garbage,
        } => ops::prune(&config, dry_run, sweep_garbage),
        Command::Index {
            command: IndexCommand::Rebuild { into },
        } => ops::rebuild(&config, &into),
        Command::Backup { command: None } => ops::backup(&config),
        Command::Backup {
            command: Some(BackupCommand::List),
        } => ops::list_backups(&config),
        Command::Restore { from, into } => ops::restore(&config, &from, &into),
        Command::Admin { command } => run_admin(&config, command),
        Command::Drift { command } => match command {
            DriftCommand::List {
                workspace,
                limit,
                json,
            } => drift_ops::list(&config, workspace, limit, json),
            DriftCommand::Show { run, json } => drift_ops::show(&config, run, json),
            DriftCommand::Run { workspace, json } => drift_ops::run(&config, &workspace, json),
            DriftCommand::Apply { run, yes, json } => drift_ops::apply(&config, run, yes, json),
            DriftCommand::WebhookSecret => drift_ops::webhook_secret(&config),
        },
    }
}

fn run_admin(config: &Config, command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::Org { command } => match command {
            OrgCommand::Create { name } => admin::create_org(config, name),
            OrgCommand::List => admin::list_orgs(config),
        },
        AdminCommand::User { command } => match command {
            UserCommand::Create { org, email, role } => {
                admin::create_user(config, org, email, role.into())
            }
            UserCommand::SetRole { email, role } => admin::set_role(config, email, role.into()),
            UserCommand::Disable { email } => admin::disable_user(config, email),
        },
        AdminCommand::Token { command } => match command {
            TokenCommand::Create { email } => admin::create_token(config, email),
            TokenCommand::List { email } => admin::list_tokens(config, email),
            TokenCommand::Revoke { id } => admin::revoke_token(config, id),
        },
        AdminCommand::Operator { command } => match command {
            OperatorCommand::Create { email } => admin::create_operator(config, email),
            OperatorCommand::Token { command } => match command {
                OperatorTokenCommand::Create { email } => {
                    admin::create_operator_token(config, email)
                }
                OperatorTokenCommand::List => admin::list_operator_tokens(config),
                OperatorTokenCommand::Revoke { id } => admin::revoke_operator_token(config, id),
            },
        },
        AdminCommand::Cluster { command } => match command {
            ClusterCommand::Create { org, name, id } => {
                admin::create_cluster(config, org, name, id)
            }
            ClusterCommand::List { org } => admin::list_clusters(config, org),
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
                },
        } => {
            let filter = stategate::store::audit::AuditFilter {
                scope,
                event,
                since,
                until,
                before_id: None,
            };
            admin::list_audit(config, filter, cluster, limit)
        }
    }
}
