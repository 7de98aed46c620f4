//! The `stategate` command line: the clap types of the top level and the dispatch
//! into one module per command group — `workspace`, `drift`, `admin`, `index`
//! (prune, index rebuild, backup, restore), `key` (the keyring) — with what they share in `output`. The
//! commands open the installation through `stategate::installation`, as `serve` does,
//! and call the engine; nothing here decides policy or writes SQL.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use stategate::config::Config;
use stategate::server;

mod admin;
mod drift;
mod index;
mod key;
mod output;
mod workspace;

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
    /// Print the installation this command works on (config file, data dir, index,
    /// store, address, key, server) to stderr before it runs.
    #[arg(long, global = true)]
    show_installation: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (with no config: loopback:8080, local store in the data dir).
    Serve,
    /// Workspaces: credentials, list, show, diff, history, rollback, unlock, restore, allow-write,
    /// freeze, unfreeze, freezes, move.
    Workspace {
        #[command(subcommand)]
        command: workspace::WorkspaceCommand,
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
    /// The version index (the data dir's SQLite, or the PostgreSQL database `[index]`
    /// names): rebuild it from the store, migrate it to the other kind.
    Index {
        #[command(subcommand)]
        command: index::IndexCommand,
    },
    /// Back the database (orgs, tokens, clusters, locks, audit, versions) up into the
    /// store now: a consistent snapshot sealed with the DEK, under backups/. The server
    /// may keep running. Keeps the newest backup.keep backups.
    Backup {
        #[command(subcommand)]
        command: Option<index::BackupCommand>,
    },
    /// Write a NEW database from a backup plus every version committed after it (from
    /// the blobs); prints how to swap it in. The live database is never touched.
    Restore {
        /// A backup id (see `stategate backup list`) or `latest`.
        #[arg(long, default_value = "latest")]
        from: String,
        /// Path of the new database file (must not exist); with index.kind =
        /// "postgres", the URL of an empty PostgreSQL database.
        #[arg(long)]
        into: PathBuf,
    },
    /// Drift checks ([[drift]] entries): run history, run one now, approve a kept plan.
    Drift {
        #[command(subcommand)]
        command: drift::DriftCommand,
    },
    /// The keyring: rotate the data key, reseal, status, retire a generation, the
    /// deliberate rotation of every workspace credential, and wrapping the root key
    /// with a PKCS#11 token (docs/keys.md).
    Key {
        #[command(subcommand)]
        command: key::KeyCommand,
    },
    /// Operators, orgs, users, tokens, clusters and the audit log. Opens the index
    /// directly (the data dir's SQLite, or the PostgreSQL database `[index]` names);
    /// the server may keep running.
    Admin {
        #[command(subcommand)]
        command: admin::AdminCommand,
    },
    /// Print the route table (every route stategate answers itself: surface, method,
    /// path and query templates) as JSON. For tests that walk every route, so a new
    /// page is covered without anyone listing it; hidden, as no operator needs it.
    #[command(hide = true)]
    Routes,
}

/// Parses the command line and runs it. Errors end the process with one line on
/// stderr and exit code 1 (clap's own usage errors exit 2).
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The server logs its work; operator commands print their results, and only
    // warnings log (no "storage ready" lines between them). STATEGATE_LOG overrides.
    let default_level = match cli.command {
        Command::Serve => "info",
        _ => "warn",
    };
    stategate::log::init(default_level);
    let outcome = run(cli);
    // The log lines first, then the final error line after them.
    stategate::log::flush();
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", output::one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // The route table is the binary's own: no configuration or installation is read.
    if matches!(cli.command, Command::Routes) {
        return print_routes();
    }
    let config = Config::load(cli.config.as_deref()).context("invalid configuration")?;
    // Named: by a config file, or by STATEGATE_DATA_DIR. Otherwise it is the per-user
    // default, which is where a forgotten --config lands.
    let named = cli.config.is_some() || std::env::var_os("STATEGATE_DATA_DIR").is_some();
    if cli.show_installation {
        eprintln!(
            "config: {}",
            cli.config.as_deref().map_or_else(
                || "none (defaults and STATEGATE_* variables)".to_string(),
                |p| p.display().to_string()
            )
        );
        for (what, value) in stategate::installation::describe(&config) {
            let default = if what == "data dir" && !named {
                " (the default: no --config, STATEGATE_CONFIG or STATEGATE_DATA_DIR)"
            } else {
                ""
            };
            eprintln!("{what}: {value}{default}");
        }
    }
    // Only `serve` makes a new installation: an operator command on a data dir that
    // does not exist, which nothing named, is a forgotten --config.
    let makes_installation = matches!(cli.command, Command::Serve | Command::Health { .. });
    if !makes_installation && !named && !config.data_dir.exists() {
        anyhow::bail!(
            "there is no stategate installation at {} (the default data dir: neither --config, \
             STATEGATE_CONFIG nor STATEGATE_DATA_DIR names one); pass the installation's \
             --config, or start a new one with `stategate serve`",
            config.data_dir.display()
        );
    }
    match cli.command {
        Command::Serve => server::run(config),
        Command::Health { url } => server::probe_health(&config, url.as_deref()),
        Command::Workspace { command } => workspace::run(&config, command),
        Command::Prune {
            dry_run,
            sweep_garbage,
        } => index::prune(&config, dry_run, sweep_garbage),
        Command::Index { command } => index::run_index(&config, command),
        Command::Backup { command } => index::run_backup(&config, command),
        Command::Restore { from, into } => index::restore(&config, &from, &into),
        Command::Admin { command } => admin::run(&config, command),
        Command::Drift { command } => drift::run(&config, command),
        Command::Key { command } => key::run(&config, command),
        Command::Routes => print_routes(),
    }
}

/// `stategate routes`: `http::router::ROUTES` as one JSON array.
fn print_routes() -> anyhow::Result<()> {
    let routes: Vec<serde_json::Value> = stategate::http::router::ROUTES
        .iter()
        .map(|r| {
            serde_json::json!({
                "surface": r.surface.name(),
                "method": r.method,
                "path": r.path,
                "query": r.query,
            })
        })
        .collect();
    println!("{}", serde_json::Value::from(routes));
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every argument and subcommand says what it is for in `--help` (a flag whose
    /// meaning a user must guess from its name is a doc bug).
    #[test]
    fn every_argument_and_command_has_a_description() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} <{id}>"));
                }
            }
            for sub in cmd.get_subcommands() {
                let name = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(name.clone());
                }
                walk(sub, &name, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "stategate", &mut missing);
        assert!(
            missing.is_empty(),
            "{} arguments or commands have no help text:\n{}",
            missing.len(),
            missing.join("\n")
        );
    }
}
