//! The keyring commands (docs/keys.md): `key status` (objects per data key
//! generation), `key rotate` (a new data generation, used by every new write within a
//! second, no restart), `key reseal` (everything under older generations re-encrypted
//! under the newest), `key retire N` (refused while anything still needs N) and
//! `key rotate-credentials` (the deliberate change of every workspace credential) and
//! `key rewrap` (a new key file, the ring re-wrapped under it), and `key wrap` (the
//! root key moved from the plain key file into the wrapped file a PKCS#11 token opens,
//! `key.service = "pkcs11"`).
//! Each opens the installation through `Installation::open` (the keyring reconciled
//! with its copies in the store) and calls `stategate::keys` (status, rotate, reseal,
//! retire: the admin API's code path too) or `installation` (rewrap, wrap).

use anyhow::bail;
use clap::Subcommand;

use stategate::config::Config;
use stategate::crypto::wrapped::remove_plain_key_file;
use stategate::crypto::Purpose as KeyPurpose;
use stategate::installation::{self, Installation, Purpose, Wrapped};
use stategate::keys::Keyring;

use super::output::{advance, cli_error, json_line, open, operator, progress_bar, table};

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Objects (state versions, backups, revocation records, drift outputs) per data
    /// key generation, and the generations in use.
    Status {
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Add a new data key generation. Every new write uses it as soon as each process
    /// re-reads the ring (within a second; no restart); older objects keep opening.
    Rotate,
    /// Re-encrypt every state version, backup, revocation record, drift output and
    /// kept drift plan under an older data generation with the newest. Resumable and safe to interrupt; the server
    /// may keep running.
    Reseal,
    /// Drop data generation N from the ring (audited). Refused while anything is still
    /// sealed under it, and for the newest generation.
    Retire {
        /// The data key generation (`key status` lists them).
        generation: u32,
    },
    /// Replace the key file with a new random one and re-wrap the whole ring under it
    /// (the "key leaked" runbook). The replaced DEK stays only as the ring's generation
    /// 0 until `reseal`, `retire 0` and `rotate-credentials`. Resumable; safe under kill.
    Rewrap,
    /// Change EVERY workspace credential, OpenTofu passphrase and the webhook secret
    /// (a new credentials root). Breaks every pipeline until it gets its new values.
    RotateCredentials {
        /// Do not ask for the typed confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Wrap the plain key file (dek_file) with the PKCS#11 token of [key.pkcs11] into
    /// key.wrapped_file: written atomically, fsynced, then unwrapped again to prove it.
    /// The server may keep running; restart it with key.service = "pkcs11".
    Wrap {
        /// Then overwrite the plain key file with zeros and remove it.
        #[arg(long)]
        remove: bool,
    },
}

pub fn run(config: &Config, command: KeyCommand) -> anyhow::Result<()> {
    // Wrapping works on the key files alone: no index, no store, no ring (with
    // key.service = "pkcs11" there is no root key to open the ring with before it).
    if let KeyCommand::Wrap { remove } = command {
        return wrap(config, remove);
    }
    let (rt, installation) = open(config, Purpose::Keyring)?;
    rt.block_on(async {
        match command {
            KeyCommand::Status { json } => status(&installation, json).await,
            KeyCommand::Rotate => rotate(&installation, KeyPurpose::Data).await,
            KeyCommand::RotateCredentials { yes } => {
                if !yes && !confirmed_phrase()? {
                    bail!("not confirmed; nothing was changed");
                }
                rotate(&installation, KeyPurpose::Credentials).await
            }
            KeyCommand::Reseal => reseal_all(&installation).await,
            KeyCommand::Wrap { remove } => wrap(config, remove),
            KeyCommand::Retire { generation } => retire(&installation, generation).await,
            KeyCommand::Rewrap => {
                let done = installation::rewrap(
                    config,
                    installation.root(),
                    installation.store(),
                    &operator(),
                )
                .await?;
                json_line(&serde_json::json!({
                    "action": "key.rewrapped",
                    "rewrapped": done.rewrapped,
                    "added": done.added,
                    "key_file": config.dek_path().display().to_string(),
                }))?;
                eprintln!(
                    "the key file {} was replaced and the ring re-wrapped under it. BACK UP THE NEW KEY FILE NOW. \
                     Then `stategate key rotate`, `stategate key reseal`, `stategate key retire 0` and \
                     `stategate key rotate-credentials` (docs/keys.md, \"the key leaked\").",
                    config.dek_path().display()
                );
                Ok(())
            }
        }
    })
}

fn confirmed_phrase() -> anyhow::Result<bool> {
    use std::io::{BufRead, IsTerminal, Write};
    const PHRASE: &str = "rotate every credential";
    if std::io::stdin().is_terminal() {
        eprint!("Every workspace bearer, OpenTofu passphrase and the webhook secret will change.\nType \"{PHRASE}\" to go on: ");
        std::io::stderr().flush()?;
    }
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(answer.trim() == PHRASE)
}

/// The keyring's operations, as the admin API has them (`stategate::keys`).
fn keys(installation: &Installation) -> Keyring {
    installation.keyring(&installation.drift())
}

/// A census's progress on the terminal (hidden for `--json`).
fn census_bar(show: bool) -> indicatif::ProgressBar {
    if show {
        progress_bar("reading blob headers")
    } else {
        indicatif::ProgressBar::hidden()
    }
}

async fn status(installation: &Installation, json: bool) -> anyhow::Result<()> {
    let bar = census_bar(!json);
    let status = keys(installation).status(&advance(&bar)).await;
    bar.finish_and_clear();
    let status = status.map_err(cli_error)?;
    if json {
        return json_line(&status);
    }
    println!(
        "Key service: {}. New writes use data generation {}; credentials generation {}.",
        status.key_service, status.data_generation, status.credentials_generation
    );
    let table_rows: Vec<Vec<String>> = status
        .generations
        .iter()
        .map(|g| {
            let c = &g.counts;
            vec![
                g.generation.to_string(),
                match (g.in_ring, g.writes) {
                    (_, true) => "writes".into(),
                    (true, _) => "in ring".into(),
                    _ => "NOT IN RING".into(),
                },
                c.versions.to_string(),
                c.backups.to_string(),
                c.revocation_records.to_string(),
                c.drift_outputs.to_string(),
                c.drift_plans.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "GEN",
                "STATE",
                "VERSIONS",
                "BACKUPS",
                "REVOCATIONS",
                "DRIFT OUTPUTS",
                "PLANS"
            ],
            &table_rows
        )
    );
    if status.other_root_versions > 0 {
        println!(
            "{} cluster state version(s) are sealed under ADJ_STATE_ENC_KEY, outside the keyring.",
            status.other_root_versions
        );
    }
    for u in &status.unreadable {
        println!("unreadable: {u}");
    }
    Ok(())
}

async fn rotate(installation: &Installation, purpose: KeyPurpose) -> anyhow::Result<()> {
    let rotated = keys(installation)
        .rotate(purpose, &operator())
        .await
        .map_err(cli_error)?;
    json_line(&rotated)?;
    let generation = rotated.generation;
    match purpose {
        KeyPurpose::Data => eprintln!(
            "data generation {generation} added; every process uses it for new writes within a second. \
             Run `stategate key reseal` to re-encrypt what older generations seal."
        ),
        KeyPurpose::Credentials => eprintln!(
            "credentials generation {generation} added: EVERY workspace credential, OpenTofu passphrase \
             and the webhook secret changed. Hand pipelines their new values (`stategate workspace env`), \
             and migrate OpenTofu-encrypted states (docs/keys.md)."
        ),
    }
    Ok(())
}

async fn reseal_all(installation: &Installation) -> anyhow::Result<()> {
    let scopes = installation.scope_keys()?;
    let bar = progress_bar("resealing");
    let done = keys(installation)
        .reseal(&scopes, &operator(), &advance(&bar))
        .await;
    bar.finish_and_clear();
    let done = done.map_err(cli_error)?;
    json_line(&serde_json::to_value(&done)?)?;
    let store = &done.store;
    eprintln!(
        "resealed {} version(s), {} backup(s), {} revocation record(s), {} drift output(s) and {} kept plan(s) under data generation {}; {} already current, {} changed meanwhile (left alone).",
        store.versions, store.backups, store.revocation_records, done.drift_outputs, done.drift_plans, store.generation,
        store.current + done.drift_current, store.raced
    );
    Ok(())
}

async fn retire(installation: &Installation, generation: u32) -> anyhow::Result<()> {
    let bar = census_bar(true);
    let retired = keys(installation)
        .retire(generation, &operator(), &advance(&bar))
        .await;
    bar.finish_and_clear();
    json_line(&retired.map_err(cli_error)?)
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
