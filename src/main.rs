//! The `stategate` command line.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use stategate::config::Config;
use stategate::server;

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
    /// Workspace credentials.
    Workspace {
        #[command(subcommand)]
        command: WorkspaceCommand,
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
