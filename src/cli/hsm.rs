//! `stategate key wrap`: moves the root key from the plain key file into the wrapped
//! key file a PKCS#11 token opens (`key.service = "pkcs11"`), through
//! `stategate::installation::wrap_key_file`; with `--remove` it then overwrites and
//! removes the plain file. Separate from the keyring's `key` commands so the two
//! merge as two modules.

use clap::Subcommand;

use stategate::config::Config;
use stategate::crypto::wrapped::remove_plain_key_file;
use stategate::installation::{self, Wrapped};

#[derive(Subcommand)]
pub enum HsmKeyCommand {
    /// Wrap the plain key file (dek_file) with the PKCS#11 token of [key.pkcs11] into
    /// key.wrapped_file: written atomically, fsynced, then unwrapped again to prove it.
    /// The server may keep running; restart it with key.service = "pkcs11".
    Wrap {
        /// Then overwrite the plain key file with zeros and remove it.
        #[arg(long)]
        remove: bool,
    },
}

pub fn run(config: &Config, command: HsmKeyCommand) -> anyhow::Result<()> {
    match command {
        HsmKeyCommand::Wrap { remove } => wrap(config, remove),
    }
}

fn wrap(config: &Config, remove: bool) -> anyhow::Result<()> {
    let outcome = installation::wrap_key_file(config)?;
    let wrapped = config.wrapped_key_path();
    let plain = config.dek_path();
    match outcome {
        Wrapped::Written => println!(
            "wrapped the key of {} into {} and unwrapped it again to check",
            plain.display(),
            wrapped.display()
        ),
        Wrapped::AlreadyThere => println!(
            "{} already holds this key (checked by unwrapping it)",
            wrapped.display()
        ),
    }
    if remove {
        remove_plain_key_file(&plain).map_err(|e| {
            anyhow::anyhow!("cannot remove the plain key file {}: {e}", plain.display())
        })?;
        println!("removed the plain key file {}", plain.display());
    } else {
        println!(
            "now remove the plain key file {} (`stategate key wrap --remove` overwrites and removes it) and any copy of it: while it exists, the token protects nothing",
            plain.display()
        );
    }
    Ok(())
}
