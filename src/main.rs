//! The `stategate` command line.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use stategate::config::Config;
use stategate::server;

mod ops;

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
    /// Workspace credentials, history and rollback.
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
    /// Orgs, users, tokens, clusters and the audit log of the cluster API. Opens the
    /// database in the data dir directly; the server may keep running.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
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
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Print an additional bearer token for an existing user ONCE.
    Create {
        #[arg(long)]
        email: String,
    },
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

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STATEGATE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = Config::load(cli.config.as_deref()).context("invalid configuration")?;
    match cli.command {
        Command::Serve => server::run(config),
        Command::Health { url } => server::probe_health(&config, url.as_deref()),
        Command::Admin { command } => admin(&config, command),
        Command::Workspace {
            command: WorkspaceCommand::History { workspace, limit },
        } => ops::history(&config, &workspace, limit),
        Command::Workspace {
            command: WorkspaceCommand::Rollback { workspace, to },
        } => ops::rollback(&config, &workspace, to),
        Command::Prune {
            dry_run,
            sweep_garbage,
        } => ops::prune(&config, dry_run, sweep_garbage),
        Command::Index {
            command: IndexCommand::Rebuild { into },
        } => ops::rebuild(&config, &into),
        Command::Workspace {
            command:
                WorkspaceCommand::Env {
                    workspace,
                    opentofu_encryption,
                },
        } => {
            stategate::http::router::validate_workspace(&workspace)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let root = server::load_root_key(&config, false)?;
            print!(
                "{}",
                stategate::tofu::client_env(
                    &config.base_url(),
                    &workspace,
                    &root,
                    opentofu_encryption
                )
            );
            Ok(())
        }
    }
}

/// Runs one admin command against the database in the data dir.
fn admin(config: &Config, command: AdminCommand) -> anyhow::Result<()> {
    use stategate::cluster::identity::{self, AdminError, Role};
    stategate::store::blob::create_private_dir(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let db = stategate::store::Db::open(&config.db_path(), &[stategate::cluster::SCHEMA])
        .with_context(|| format!("cannot open database {}", config.db_path().display()))?;
    let result: Result<(), AdminError> = rt.block_on(async {
        match command {
            AdminCommand::Org {
                command: OrgCommand::Create { name },
            } => {
                db.write(move |c| identity::create_org(c, &name)).await?;
            }
            AdminCommand::Org {
                command: OrgCommand::List,
            } => {
                for (name, created_at) in db.write(identity::list_orgs).await? {
                    json_line(&serde_json::json!({ "name": name, "created_at": created_at }));
                }
            }
            AdminCommand::User {
                command: UserCommand::Create { org, email, role },
            } => {
                let role = match role {
                    RoleArg::Admin => Role::Admin,
                    RoleArg::Member => Role::Member,
                };
                let token = db
                    .write(move |c| identity::create_principal(c, &org, &email, role))
                    .await?;
                print_token(&token);
            }
            AdminCommand::Token {
                command: TokenCommand::Create { email },
            } => {
                let token = db.write(move |c| identity::create_token(c, &email)).await?;
                print_token(&token);
            }
            AdminCommand::Cluster {
                command: ClusterCommand::Create { org, name, id },
            } => {
                let row = db
                    .write(move |c| {
                        identity::create_cluster(c, &org, name.as_deref(), id.as_deref())
                    })
                    .await?;
                println!("{}", row.id);
            }
            AdminCommand::Cluster {
                command: ClusterCommand::List { org },
            } => {
                let rows = db
                    .write(move |c| identity::list_clusters(c, org.as_deref()))
                    .await?;
                for row in rows {
                    json_line(&row);
                }
            }
            AdminCommand::Audit {
                command:
                    AuditCommand::List {
                        scope,
                        cluster,
                        event,
                        limit,
                    },
            } => {
                let scope = scope.or(cluster.map(|id| {
                    let id = uuid::Uuid::parse_str(&id).map_or(id, |u| u.hyphenated().to_string());
                    stategate::cluster::scope(&id)
                }));
                let rows = db
                    .write(move |c| {
                        identity::list_audit(c, scope.as_deref(), event.as_deref(), limit)
                    })
                    .await?;
                for row in rows {
                    json_line(&row);
                }
            }
        }
        Ok(())
    });
    result.map_err(|e| anyhow::anyhow!("{e}"))
}

fn print_token(token: &str) {
    eprintln!("The token below is shown once and stored only as a hash. Keep it now:");
    println!("{token}");
}

fn json_line(value: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string(value).expect("JSON values serialize")
    );
}
