//! The workspace commands: `workspace env|history|timeline|rollback|list|show|diff|
//! unlock|restore|allow-write|freeze|unfreeze|freezes|move|credential|token|consumers`. Each is one call into the engine — `stategate::operator::Operations`
//! (the admin HTTP API and the web UI call the same functions) or `TofuBackend` —
//! plus printing: a table for people, `--json` lines for scripts. Every failure is one
//! line on stderr and a non-zero exit.

use std::io::Write;

use anyhow::bail;
use clap::Subcommand;

use stategate::config::Config;
use stategate::error::Error;
use stategate::installation::{self, Purpose};
use stategate::names::validate_workspace;
use stategate::operator::diff::{Change, StateDiff};
use stategate::operator::{rolled_back_json, LockState, Operations, WorkspaceSummary};
use stategate::store::WriteOutcome;

use super::output::{
    age, cli_error, confirmed, count, json_line, json_lines, listing, operator, runtime, table,
    when, when_opt,
};

#[derive(Subcommand)]
pub enum WorkspaceCommand {
    /// Print `export` lines that make `terraform init` work with a bare `backend "http" {}`.
    Env {
        /// The workspace (its name in the backend address).
        workspace: String,
        /// Also print TF_ENCRYPTION for OpenTofu state encryption (pbkdf2 + aes_gcm).
        #[arg(long)]
        opentofu_encryption: bool,
    },
    /// The workspace's versions, newest first, with who wrote each (the credential,
    /// the lock's Who and Operation, "rollback of vN") and what it did to resources
    /// (+added ~changed -removed). Reads the index only (no blob).
    History {
        /// The workspace (its name in the backend address).
        workspace: String,
        /// At most this many (the newest).
        #[arg(long)]
        limit: Option<u32>,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Which versions added, changed or removed resources, newest first, with who wrote
    /// them: of ADDRESS (e.g. `module.db.aws_db_instance.main`; its instances and, for a
    /// module, what it holds) or of every address. Reads the index only (no blob).
    Timeline {
        /// The workspace (its name in the backend address).
        workspace: String,
        /// A resource or module address; every address when omitted.
        address: Option<String>,
        /// At most this many rows (the newest; default 1000, at most 10000).
        #[arg(long, default_value_t = 1000)]
        limit: u32,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
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
        /// The workspace (its name in the backend address).
        workspace: String,
        /// The version number (see `workspace history`); the current one when omitted.
        #[arg(long)]
        version: Option<i64>,
        /// Replace sensitive values (and secret-looking attributes) with "(sensitive)".
        #[arg(long)]
        masked: bool,
    },
    /// What changed from version A to version B: resources by address (changed
    /// attributes listed, sensitive values masked) and outputs.
    Diff {
        /// The workspace (its name in the backend address).
        workspace: String,
        /// The older version number.
        from: i64,
        /// The newer version number.
        to: i64,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Force-unlock (audited as tf.lock_forced, once per holder freed): prints the
    /// holders and asks for the workspace name back unless --yes. While several plans
    /// share the lock, name one with --lock-id or free them all with --all. An
    /// unlocked workspace: says so, exit 0.
    Unlock {
        /// The workspace (its name in the backend address).
        workspace: String,
        /// Free only the holder with this lock ID (one plan holder, or the exclusive
        /// holder); another ID changes nothing.
        #[arg(long, conflicts_with = "all")]
        lock_id: Option<String>,
        /// Free every holder: every plan sharing the lock, or the exclusive holder.
        #[arg(long)]
        all: bool,
        /// Do not ask for the typed confirmation.
        #[arg(long)]
        yes: bool,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Undo a DELETE: the last version with content becomes current again as a new
    /// version (audited as tf.restored).
    Restore {
        /// The workspace (its name in the backend address).
        workspace: String,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Make an old version current again by storing its content as a NEW version
    /// (history is kept). Refused while the workspace is locked.
    Rollback {
        /// The workspace (its name in the backend address).
        workspace: String,
        /// The version whose content to restore (see `workspace history`).
        #[arg(long)]
        to: i64,
    },
    /// Allow ONE state write that the write guard refuses (another lineage, a lower
    /// serial, or the same serial with different content) — e.g. `state push -force`
    /// of an older state or a deliberate re-initialisation. Expires after --minutes;
    /// used up by that write; audited as tf.write_allowed (and tf.write_override_used).
    AllowWrite {
        /// The workspace (its name in the backend address).
        workspace: String,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: String,
        /// How long the permission lasts (1-60).
        #[arg(long, default_value_t = stategate::tofu::guard::DEFAULT_OVERRIDE_MINUTES)]
        minutes: u32,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Freeze a workspace (a maintenance window, an incident): every LOCK and every
    /// write without a lock is refused with the reason and who froze it, until
    /// `unfreeze` or the end given; drift checks are skipped. A lock held now is not
    /// broken: the freeze applies once it is released. Audited as tf.frozen.
    Freeze {
        /// The workspace (its name in the backend address).
        workspace: String,
        /// Why (Terraform prints it to whoever is refused; kept in the audit log).
        #[arg(long)]
        reason: String,
        /// When the freeze ends (RFC 3339, e.g. 2026-12-02T10:00Z).
        #[arg(long, conflicts_with = "for_")]
        until: Option<String>,
        /// How long the freeze lasts (90m, 2h, 3d).
        #[arg(long = "for")]
        for_: Option<String>,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Lift a workspace's freeze (audited as tf.unfrozen). Not frozen: says so, exit 0.
    Unfreeze {
        /// The workspace (its name in the backend address).
        workspace: String,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Every freeze in force: workspace, who, until, reason.
    Freezes {
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Move resources (every instance of each resource address) from SRC's state to
    /// DST's, as `terraform state mv -state-out` between two files would: both locks
    /// are taken (name order), one new version of each is written in one commit (next
    /// serial, lineage kept), audited once as tf.resources_moved. Move the resource
    /// blocks in the configurations too. Refused, changing nothing, when either is
    /// locked or frozen, an address is missing in SRC or present in DST, or a state
    /// is not a plain Terraform state.
    Move {
        /// The workspace the resources leave (SRC).
        source: String,
        /// The workspace the resources join (DST).
        destination: String,
        /// Resource addresses such as module.db.aws_db_instance.main (at most 1000).
        #[arg(required = true)]
        addresses: Vec<String>,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The workspace's derived credential (what `workspace env` prints).
    Credential {
        #[command(subcommand)]
        command: CredentialCommand,
    },
    /// Issued workspace tokens (`sgw_…`): scoped (outputs, read, write), for workspace
    /// patterns, with an expiry; accepted as the Basic password or as a Bearer token.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// The consumer workspaces whose own credential may read this workspace's outputs
    /// (`/api/v1/tf/outputs/<workspace>`, for `terraform_remote_state`).
    Consumers {
        #[command(subcommand)]
        command: ConsumersCommand,
    },
}

#[derive(Subcommand)]
pub enum CredentialCommand {
    /// A new derived credential: the old one fails from the next request on (audited
    /// as tf.credential_rotated); `workspace env` prints the new one. Other workspaces
    /// are unchanged.
    Rotate {
        /// The workspace (its name in the backend address).
        workspace: String,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Issue a token; its secret is printed once (stored only as a hash).
    Create {
        /// A unique name among live tokens (kept in the audit log and lock records as `token:<name>`).
        #[arg(long)]
        name: String,
        /// Comma-separated workspace patterns (`prod-*,staging`; `*` matches any run of characters).
        #[arg(long)]
        workspaces: String,
        /// outputs (the outputs-only state), read (GET the state) or write (GET, LOCK, POST, UNLOCK).
        #[arg(long)]
        scope: String,
        /// Expires after this long: 30d, 12h (at most 3650d). Default: until revoked.
        #[arg(long)]
        expires: Option<String>,
        /// Keep sensitive outputs in the outputs-only state (read and write scopes see them anyway).
        #[arg(long)]
        include_sensitive: bool,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Every workspace token (revoked ones too), never a secret.
    List {
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by its name or id: refused from the next request on, and recorded
    /// in the blob store so a restore cannot bring it back.
    Revoke {
        /// The token's name or id (`workspace token list` prints both).
        name_or_id: String,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum ConsumersCommand {
    /// Replace the consumers of WORKSPACE with a comma-separated list.
    Set {
        /// The workspace (its name in the backend address).
        workspace: String,
        /// Comma-separated consumer workspace names (they may read this workspace's outputs).
        consumers: String,
    },
    /// The consumers of WORKSPACE, one per line.
    List {
        /// The workspace (its name in the backend address).
        workspace: String,
    },
    /// Remove every consumer of WORKSPACE.
    Clear {
        /// The workspace (its name in the backend address).
        workspace: String,
    },
}

pub fn run(config: &Config, command: WorkspaceCommand) -> anyhow::Result<()> {
    match command {
        WorkspaceCommand::Env {
            workspace,
            opentofu_encryption,
        } => env(config, &workspace, opentofu_encryption),
        WorkspaceCommand::History {
            workspace,
            limit,
            json,
        } => history(config, &workspace, limit, json),
        WorkspaceCommand::Timeline {
            workspace,
            address,
            limit,
            json,
        } => timeline(config, &workspace, address.as_deref(), limit, json),
        WorkspaceCommand::Rollback { workspace, to } => rollback(config, &workspace, to),
        WorkspaceCommand::List { json } => list(config, json),
        WorkspaceCommand::Show {
            workspace,
            version,
            masked,
        } => show(config, &workspace, version, masked),
        WorkspaceCommand::Diff {
            workspace,
            from,
            to,
            json,
        } => diff(config, &workspace, from, to, json),
        WorkspaceCommand::Unlock {
            workspace,
            lock_id,
            all,
            yes,
            json,
        } => unlock(config, &workspace, lock_id, all, yes, json),
        WorkspaceCommand::Restore { workspace, json } => restore(config, &workspace, json),
        WorkspaceCommand::AllowWrite {
            workspace,
            reason,
            minutes,
            json,
        } => allow_write(config, &workspace, minutes, &reason, json),
        WorkspaceCommand::Freeze {
            workspace,
            reason,
            until,
            for_,
            json,
        } => freeze(config, &workspace, &reason, until, for_, json),
        WorkspaceCommand::Unfreeze { workspace, json } => unfreeze(config, &workspace, json),
        WorkspaceCommand::Freezes { json } => freezes(config, json),
        WorkspaceCommand::Move {
            source,
            destination,
            addresses,
            json,
        } => move_resources(config, &source, &destination, &addresses, json),
        WorkspaceCommand::Credential {
            command: CredentialCommand::Rotate { workspace, json },
        } => rotate(config, &workspace, json),
        WorkspaceCommand::Token { command } => token(config, command),
        WorkspaceCommand::Consumers { command } => consumers(config, command),
    }
}

/// The backend over the installation, for the credential commands.
fn with_backend<T>(
    config: &Config,
    f: impl AsyncFnOnce(stategate::tofu::TofuBackend) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let (rt, installation) = super::output::open(config, Purpose::Command)?;
    rt.block_on(f(installation.tofu().clone()))
}

pub fn rotate(config: &Config, workspace: &str, json: bool) -> anyhow::Result<()> {
    validate_workspace(workspace)?;
    let generation = with_backend(config, async |tofu| {
        tofu.rotate_credential(workspace, &operator())
            .await
            .map_err(cli_error)
    })?;
    if json {
        return json_line(&serde_json::json!({ "workspace": workspace, "generation": generation }));
    }
    eprintln!(
        "workspace {workspace}: credential rotated (generation {generation}). The old credential \
         is refused from now on; `stategate workspace env {workspace}` prints the new one."
    );
    Ok(())
}

fn token(config: &Config, command: TokenCommand) -> anyhow::Result<()> {
    use stategate::tofu::credentials::{self, Grant, NewWorkspaceToken};
    match command {
        TokenCommand::Create {
            name,
            workspaces,
            scope,
            expires,
            include_sensitive,
            json,
        } => {
            // Every input is checked before the database is opened.
            let grant = Grant {
                patterns: credentials::parse_patterns(&workspaces)?,
                scope: stategate::tofu::access::Scope::parse(&scope)?,
                include_sensitive,
            };
            let expires_in = expires
                .as_deref()
                .map(credentials::parse_expiry)
                .transpose()?;
            let new = NewWorkspaceToken {
                name: credentials::check_name(&name)?,
                grant,
                expires_in,
            };
            let (secret, listed) = with_backend(config, async |tofu| {
                tofu.create_token(new, &operator()).await.map_err(cli_error)
            })?;
            if json {
                let mut value = serde_json::to_value(&listed)?;
                value["secret"] = serde_json::Value::String(secret);
                return json_line(&value);
            }
            eprintln!(
                "token {} (id {}): scope {} on {}",
                listed.name,
                listed.id,
                listed.scope,
                listed.workspaces.join(",")
            );
            super::output::print_token(&secret);
            Ok(())
        }
        TokenCommand::List { json } => {
            let rows = with_backend(config, async |tofu| {
                tofu.list_tokens().await.map_err(cli_error)
            })?;
            let unix = |t: Option<i64>| {
                t.and_then(|t| time::OffsetDateTime::from_unix_timestamp(t).ok())
                    .and_then(|t| {
                        t.format(&time::format_description::well_known::Rfc3339)
                            .ok()
                    })
                    .map_or_else(|| "-".to_string(), |t| super::output::when(&t))
            };
            super::output::listing(
                &rows,
                json,
                "no workspace tokens",
                &[
                    "ID",
                    "NAME",
                    "SCOPE",
                    "WORKSPACES",
                    "CREATED",
                    "EXPIRES",
                    "LAST USED",
                    "REVOKED",
                ],
                |t| {
                    vec![
                        t.id.clone(),
                        t.name.clone(),
                        if t.include_sensitive {
                            format!("{}+sensitive", t.scope)
                        } else {
                            t.scope.to_string()
                        },
                        t.workspaces.join(","),
                        super::output::when(&t.created_at),
                        unix(t.expires_at),
                        unix(t.last_used),
                        when_opt(t.revoked_at.as_deref()),
                    ]
                },
            )
        }
        TokenCommand::Revoke { name_or_id, json } => {
            let done = with_backend(config, async |tofu| {
                tofu.revoke_token(&name_or_id, &operator())
                    .await
                    .map_err(cli_error)
            })?;
            if !done.recorded {
                eprintln!(
                    "warning: the revocation is in force but could not be recorded in the blob store; \
                     a restore from a backup taken before now would undo it: take a backup once the store is reachable"
                );
            }
            if json {
                return json_line(&done);
            }
            eprintln!("token {} (id {}) revoked", done.name, done.id);
            Ok(())
        }
    }
}

fn consumers(config: &Config, command: ConsumersCommand) -> anyhow::Result<()> {
    let (workspace, names) = match &command {
        ConsumersCommand::Set {
            workspace,
            consumers,
        } => (
            workspace,
            Some(stategate::tofu::credentials::parse_consumers(
                workspace, consumers,
            )?),
        ),
        ConsumersCommand::Clear { workspace } => (workspace, Some(Vec::new())),
        ConsumersCommand::List { workspace } => (workspace, None),
    };
    validate_workspace(workspace)?;
    let listed = with_backend(config, async |tofu| {
        match names {
            Some(names) => tofu.set_consumers(workspace, names, &operator()).await,
            None => tofu.consumers(workspace).await,
        }
        .map_err(cli_error)
    })?;
    for name in &listed {
        println!("{name}");
    }
    if listed.is_empty() {
        eprintln!("workspace {workspace} has no consumers");
    }
    Ok(())
}

pub fn env(config: &Config, workspace: &str, opentofu_encryption: bool) -> anyhow::Result<()> {
    validate_workspace(workspace)?;
    let lines = runtime()?.block_on(installation::client_env(
        config,
        workspace,
        opentofu_encryption,
    ))?;
    print!("{lines}");
    Ok(())
}

pub fn history(
    config: &Config,
    workspace: &str,
    limit: Option<u32>,
    json: bool,
) -> anyhow::Result<()> {
    validate_workspace(workspace)?;
    let listings = installation::listings(config)?;
    let listed = runtime()?.block_on(listings.history(
        workspace,
        limit,
        &stategate::operator::roles::Grant::ROOT,
    ));
    let rows = none_when_not_found(listed)?;
    if json {
        if rows.is_empty() {
            eprintln!("workspace {workspace} has no versions");
        }
        let rows: Vec<serde_json::Value> =
            rows.iter().map(stategate::operator::version_json).collect();
        return json_lines(&rows);
    }
    if rows.is_empty() {
        eprintln!("workspace {workspace} has no versions");
        return Ok(());
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let (serial, changes) = if row.is_tombstone() {
                ("deleted".to_string(), "-".to_string())
            } else {
                (
                    row.serial.map_or("-".into(), |s| s.to_string()),
                    stategate::operator::change_summary(row),
                )
            };
            vec![
                format!("v{}", row.version),
                serial,
                when(&row.created_at),
                stategate::operator::written_by(&row.actor, &row.facts),
                changes,
                row.size.to_string(),
            ]
        })
        .collect();
    let header = ["VERSION", "SERIAL", "WRITTEN", "WRITER", "CHANGES", "SIZE"];
    print!("{}", table(&header, &cells));
    Ok(())
}

pub fn timeline(
    config: &Config,
    workspace: &str,
    address: Option<&str>,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    validate_workspace(workspace)?;
    if let Some(address) = address {
        stategate::operator::check_address(address).map_err(cli_error)?;
    }
    if limit == 0 || limit > stategate::store::timeline::MAX_TIMELINE_ROWS {
        bail!(
            "--limit must be 1-{}",
            stategate::store::timeline::MAX_TIMELINE_ROWS
        );
    }
    let listings = installation::listings(config)?;
    let listed = runtime()?.block_on(listings.timeline(
        workspace,
        address,
        limit,
        &stategate::operator::roles::Grant::ROOT,
    ));
    let rows = none_when_not_found(listed)?;
    if json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(stategate::operator::timeline_json)
            .collect();
        return json_lines(&rows);
    }
    let empty = match address {
        Some(a) => format!("no recorded change of {a} in workspace {workspace}"),
        None => format!("no recorded resource changes in workspace {workspace}"),
    };
    listing(
        &rows,
        false,
        &empty,
        &["VERSION", "WRITTEN", "CHANGE", "ADDRESS", "WRITER"],
        |row| {
            vec![
                format!("v{}", row.version),
                when(&row.created_at),
                stategate::operator::timeline_change(row),
                row.address.clone(),
                stategate::operator::written_by(&row.writer, &row.facts()),
            ]
        },
    )
}

/// A listing of a workspace with no version is empty here: the commands say so on
/// stderr and exit 0, as they always have.
fn none_when_not_found<T>(listed: Result<Vec<T>, Error>) -> anyhow::Result<Vec<T>> {
    match listed {
        Err(Error::NotFound(_)) => Ok(Vec::new()),
        other => other.map_err(cli_error),
    }
}

pub fn rollback(config: &Config, workspace: &str, to: i64) -> anyhow::Result<()> {
    validate_workspace(workspace)?;
    let (rt, installation) = super::output::open(config, Purpose::Command)?;
    rt.block_on(async {
        let done = installation
            .tofu()
            .rollback(workspace, to, &operator())
            .await
            .map_err(cli_error)?;
        match done.outcome {
            WriteOutcome::Stored(row) => {
                json_line(&stategate::operator::version_json(&row))?;
                eprintln!(
                    "workspace {workspace}: version {} now holds the content of version {to} (was version {}).",
                    row.version, done.from_version
                );
                if let Some(serial) = row.serial {
                    eprintln!(
                        "It carries serial {serial}, above every serial stored before, so a plan file \
                         saved before this rollback is refused as stale (an OpenTofu-encrypted state \
                         keeps its old serial: discard such plan files yourself)."
                    );
                }
            }
            WriteOutcome::Unchanged(row) => eprintln!(
                "workspace {workspace}: the current version {} already has the content of version {to}; nothing written.",
                row.version
            ),
        }
        Ok(())
    })
}

/// The operations over this installation's engine, and the runtime that drives them.
pub struct Ops {
    pub rt: tokio::runtime::Runtime,
    pub ops: Operations,
}

impl Ops {
    pub fn open(config: &Config) -> anyhow::Result<Ops> {
        let (rt, installation) = super::output::open(config, Purpose::Command)?;
        Ok(Ops {
            rt,
            ops: installation.operator()?,
        })
    }

    fn run<T>(&self, f: impl std::future::Future<Output = Result<T, Error>>) -> anyhow::Result<T> {
        self.rt.block_on(f).map_err(cli_error)
    }
}

fn lock_text(lock: &LockState) -> String {
    let stale = if lock.stale { " STALE" } else { "" };
    format!(
        "{} {} {}{stale}",
        lock.who,
        stategate::operator::operation_name(&lock.operation),
        age(lock.age_seconds)
    )
}

/// Shared plan holders: how many, and each holder as [`lock_text`] shows one.
fn plans_text(plans: &[LockState]) -> String {
    let each: Vec<String> = plans.iter().map(lock_text).collect();
    format!("{} plans (shared): {}", plans.len(), each.join("; "))
}

/// A freeze as the tables show it: `frozen until 2026-12-02 10:00 UTC (reason)`, or
/// `frozen until unfrozen (reason)`.
fn freeze_text(f: &stategate::tofu::freeze::Freeze) -> String {
    format!("frozen {} ({})", f.until_text(), f.reason)
}

pub fn workspace_table(rows: &[WorkspaceSummary]) -> String {
    let opt = |v: Option<i64>| v.map_or("-".to_string(), |n| n.to_string());
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|w| {
            vec![
                w.name.clone(),
                opt(w.version) + if w.deleted { " (deleted)" } else { "" },
                opt(w.serial),
                opt(w.size),
                when_opt(w.updated_at.as_deref()),
                w.written_by.clone().unwrap_or_else(|| "-".into()),
                // At rest every version is sealed; the client may encrypt it too.
                match w.encryption {
                    Some(_) => stategate::operator::at_rest(w.key_generation),
                    None => "-".into(),
                },
                w.encryption
                    .as_ref()
                    .map_or("-".into(), |p| p.client_side()),
                {
                    let lock = match (w.lock.as_ref(), w.plans.as_slice()) {
                        (Some(lock), []) => Some(lock_text(lock)),
                        (_, plans) if !plans.is_empty() => Some(plans_text(plans)),
                        _ => None,
                    };
                    // A freeze is shown where a lock is: it refuses the same things.
                    match (w.frozen.as_ref().map(freeze_text), lock) {
                        (Some(f), Some(l)) => format!("{f}; {l}"),
                        (Some(f), None) => f,
                        (None, Some(l)) => l,
                        (None, None) => "-".into(),
                    }
                },
            ]
        })
        .collect();
    table(
        &[
            "WORKSPACE",
            "VERSION",
            "SERIAL",
            "SIZE",
            "UPDATED",
            "WRITTEN BY",
            "AT REST",
            "OPENTOFU ENCRYPTION",
            "LOCK",
        ],
        &cells,
    )
}

pub fn list(config: &Config, json: bool) -> anyhow::Result<()> {
    let o = Ops::open(config)?;
    let rows = o.run(
        o.ops
            .list_workspaces(&stategate::operator::roles::Grant::ROOT),
    )?;
    if json {
        json_lines(&rows)?;
    } else if rows.is_empty() {
        eprintln!("no workspaces yet");
    } else {
        print!("{}", workspace_table(&rows));
    }
    Ok(())
}

pub fn show(
    config: &Config,
    workspace: &str,
    version: Option<i64>,
    masked: bool,
) -> anyhow::Result<()> {
    let o = Ops::open(config)?;
    let (row, content) = if masked {
        o.run(o.ops.show(workspace, version))?
    } else {
        // The real values leave the server: audited as `state.revealed`.
        let via = stategate::operator::Reveal::Cli;
        o.run(o.ops.reveal(workspace, version, &operator(), via))?
    };
    let content = if masked {
        let doc = stategate::operator::diff::mask_state(&content, row.version)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        serde_json::to_vec_pretty(&doc)?
    } else {
        content
    };
    let mut out = std::io::stdout().lock();
    out.write_all(&content)?;
    if !content.ends_with(b"\n") {
        out.write_all(b"\n")?;
    }
    eprintln!(
        "workspace {workspace}: version {} (serial {})",
        row.version,
        row.serial.map_or("-".into(), |s| s.to_string())
    );
    Ok(())
}

fn value_text(v: &Option<serde_json::Value>) -> String {
    v.as_ref().map_or("(absent)".into(), |v| v.to_string())
}

/// A diff as text: `+`/`-`/`~` per resource, and `>` with `(moved to app)` (or
/// `from`) for what a move's version moved.
pub fn diff_text(d: &StateDiff) -> String {
    let sign = |c: &Change| match c {
        Change::Added => '+',
        Change::Removed => '-',
        Change::Changed => '~',
    };
    let mut out = String::new();
    for r in &d.resources {
        match d.moved.as_ref().filter(|m| m.covers_change(&r.change)) {
            Some(m) => out.push_str(&format!("> {} ({})\n", r.address, m.label())),
            None => out.push_str(&format!("{} {}\n", sign(&r.change), r.address)),
        }
        for a in &r.attributes {
            out.push_str(&format!(
                "    {}: {} -> {}\n",
                a.name,
                value_text(&a.before),
                value_text(&a.after)
            ));
        }
    }
    for o in &d.outputs {
        out.push_str(&format!(
            "{} output.{}: {} -> {}\n",
            sign(&o.change),
            o.name,
            value_text(&o.before),
            value_text(&o.after)
        ));
    }
    out
}

pub fn diff(
    config: &Config,
    workspace: &str,
    from: i64,
    to: i64,
    json: bool,
) -> anyhow::Result<()> {
    let o = Ops::open(config)?;
    let root = stategate::operator::roles::Grant::ROOT;
    let d = o.run(o.ops.diff(workspace, from, to, &root))?;
    if json {
        for r in &d.resources {
            let mut line = stategate::operator::resource_change_json(&d, r);
            line["kind"] = "resource".into();
            line["attributes"] = serde_json::to_value(&r.attributes)?;
            json_line(&line)?;
        }
        for out in &d.outputs {
            json_line(
                &serde_json::json!({ "kind": "output", "name": out.name, "change": out.change, "before": out.before, "after": out.after }),
            )?;
        }
    } else if d.is_empty() {
        println!("no differences between version {from} and version {to}");
    } else {
        print!("{}", diff_text(&d));
    }
    Ok(())
}

pub fn unlock(
    config: &Config,
    workspace: &str,
    lock_id: Option<String>,
    all: bool,
    yes: bool,
    json: bool,
) -> anyhow::Result<()> {
    let o = Ops::open(config)?;
    let Some(shown) = o.run(o.ops.lock(workspace))? else {
        if json {
            json_line(&serde_json::json!({ "unlocked": false, "holder": null }))?;
        }
        eprintln!("workspace {workspace} is not locked; nothing to do");
        return Ok(());
    };
    // Every holder: the plans sharing the lock, or the exclusive one.
    let plans = o.run(o.ops.workspace(workspace))?.plans;
    let holders = if plans.is_empty() { vec![shown] } else { plans };
    let describe = |h: &stategate::operator::LockState| {
        format!(
            "{:?} ({}, lock {}, held {}{})",
            h.who,
            h.operation,
            h.id,
            age(h.age_seconds),
            if h.stale { ", STALE" } else { "" }
        )
    };
    if let [holder] = holders.as_slice() {
        eprintln!("workspace {workspace} is locked by {}.", describe(holder));
    } else {
        eprintln!(
            "workspace {workspace} is locked by {} plans sharing it:",
            holders.len()
        );
        for h in &holders {
            eprintln!("  {}", describe(h));
        }
    }
    // `None`: every holder.
    let expected: Option<String> = match (&lock_id, all, holders.as_slice()) {
        (Some(id), _, _) if !holders.iter().any(|h| &h.id == id) => {
            bail!("no holder of {workspace}'s lock has the lock ID {id:?}; nothing was changed")
        }
        (Some(id), _, _) => Some(id.clone()),
        (None, true, _) => None,
        (None, false, [holder]) => Some(holder.id.clone()),
        (None, false, _) => bail!(
            "several plans share {workspace}'s lock: choose one with --lock-id ID, or free them all with --all; nothing was changed"
        ),
    };
    eprintln!("Unlocking lets another run write while that run may still be going.");
    if !yes && !confirmed(workspace, "force-unlock it")? {
        bail!("aborted: the name did not match; nothing was changed");
    }
    let done = o.run(o.ops.unlock(workspace, expected, &operator()))?;
    if json {
        json_line(&done)?;
    }
    if done.unlocked {
        eprintln!(
            "workspace {workspace} unlocked (audited as tf.lock_forced by {})",
            operator()
        );
    } else {
        eprintln!("workspace {workspace} was unlocked meanwhile; nothing to do");
    }
    Ok(())
}

pub fn restore(config: &Config, workspace: &str, json: bool) -> anyhow::Result<()> {
    let o = Ops::open(config)?;
    let done = o.run(o.ops.restore(workspace, &operator()))?;
    if json {
        json_line(&rolled_back_json(&done))?;
    }
    let current = rolled_back_json(&done);
    eprintln!(
        "workspace {workspace} restored: version {} holds the content of version {} (audited as tf.restored)",
        current["current"]["version"], done.to_version
    );
    Ok(())
}

/// `workspace allow-write`: one write the write guard would refuse may go through.
pub fn allow_write(
    config: &Config,
    workspace: &str,
    minutes: u32,
    reason: &str,
    json: bool,
) -> anyhow::Result<()> {
    let o = Ops::open(config)?;
    let grant = o.run(o.ops.allow_write(workspace, minutes, reason, &operator()))?;
    if json {
        json_line(&grant)?;
    }
    eprintln!(
        "workspace {workspace}: the next write the write guard would refuse (another lineage, a lower serial, the same serial with other content) is allowed once within {minutes} minutes (audited as tf.write_allowed by {})",
        grant.granted_by
    );
    Ok(())
}

/// `workspace freeze`: every lock and unlocked write refused until unfrozen or the end.
pub fn freeze(
    config: &Config,
    workspace: &str,
    reason: &str,
    until: Option<String>,
    for_: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    let o = Ops::open(config)?;
    let done = o.run(o.ops.freeze(
        workspace,
        reason,
        until.as_deref(),
        for_.as_deref(),
        &operator(),
    ))?;
    if json {
        json_line(&done)?;
    }
    eprintln!(
        "workspace {workspace} frozen {} (audited as tf.frozen by {}): every lock and every write without a lock is refused with the reason",
        done.freeze.until_text(),
        done.freeze.frozen_by
    );
    if let Some(lock) = &done.lock_held {
        eprintln!(
            "lock held by {:?} ({}, lock {}); the freeze applies when it is released (the lock is not broken)",
            lock.who, lock.operation, lock.id
        );
    }
    Ok(())
}

/// `workspace unfreeze`.
pub fn unfreeze(config: &Config, workspace: &str, json: bool) -> anyhow::Result<()> {
    let o = Ops::open(config)?;
    let lifted = o.run(o.ops.unfreeze(workspace, &operator()))?;
    if json {
        json_line(&serde_json::json!({ "unfrozen": lifted.is_some(), "freeze": lifted }))?;
    }
    match lifted {
        Some(_) => eprintln!("workspace {workspace} unfrozen (audited as tf.unfrozen)"),
        None => eprintln!("workspace {workspace} is not frozen; nothing to do"),
    }
    Ok(())
}

/// `workspace freezes`: a table, or JSON lines.
pub fn freezes(config: &Config, json: bool) -> anyhow::Result<()> {
    let o = Ops::open(config)?;
    let rows = o.run(o.ops.freezes(&stategate::operator::roles::Grant::ROOT))?;
    if json {
        json_lines(&rows)?;
    } else if rows.is_empty() {
        eprintln!("no workspace is frozen");
    } else {
        let cells: Vec<Vec<String>> = rows
            .iter()
            .map(|f| {
                vec![
                    f.workspace.clone(),
                    f.frozen_by.clone(),
                    f.until_text(),
                    f.reason.clone(),
                ]
            })
            .collect();
        print!(
            "{}",
            table(&["WORKSPACE", "FROZEN BY", "UNTIL", "REASON"], &cells)
        );
    }
    Ok(())
}

/// `workspace move SRC DST ADDRESS…`.
pub fn move_resources(
    config: &Config,
    source: &str,
    destination: &str,
    addresses: &[String],
    json: bool,
) -> anyhow::Result<()> {
    let o = Ops::open(config)?;
    let done = o.run(
        o.ops
            .move_resources(source, destination, addresses, &operator()),
    )?;
    if json {
        json_line(&done)?;
    }
    eprintln!(
        "moved {} ({}) from {source} (now version {}) to {destination} (now version {}); audited as tf.resources_moved. Move their blocks in the configurations too.",
        count(done.addresses.len(), "resource", "resources"),
        count(done.instances, "instance", "instances"),
        done.from.version,
        done.to.version
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_listing_marks_stale_locks_and_tombstones() {
        // `age` itself is tabled in `output`'s tests.
        let lock = LockState {
            id: "L".into(),
            who: "me@box".into(),
            operation: "OperationTypeApply".into(),
            created_at: "t".into(),
            age_seconds: 4000,
            stale: true,
        };
        let rows = vec![
            WorkspaceSummary {
                name: "prod".into(),
                version: Some(3),
                serial: Some(2),
                size: Some(10),
                updated_at: Some("t".into()),
                written_by: Some("me@box (apply) via tf:a".into()),
                deleted: false,
                lock: Some(lock),
                plans: Vec::new(),
                frozen: None,
                encryption: Some(stategate::tofu::posture::posture_unknown()),
                key_generation: None,
            },
            WorkspaceSummary {
                name: "gone".into(),
                version: Some(4),
                serial: None,
                size: Some(0),
                updated_at: Some("t".into()),
                written_by: Some("me@box (apply) via tf:a".into()),
                deleted: true,
                lock: None,
                plans: Vec::new(),
                frozen: None,
                encryption: None,
                key_generation: None,
            },
        ];
        let text = workspace_table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("WORKSPACE  VERSION"), "{text}");
        assert!(lines[1].ends_with("me@box apply 66m STALE"), "{text}");
        assert!(lines[2].contains("4 (deleted)"), "{text}");
        // Who wrote the newest version, in words; the lock's operation too (issue 38,
        // item 12: `workspace list` printed `OperationTypeApply`, no writer).
        assert!(lines[0].contains("UPDATED  WRITTEN BY"), "{text}");
        assert!(lines[1].contains(" me@box (apply) via tf:a "), "{text}");
        assert!(!text.contains("OperationType"), "{text}");
        // Encryption sits before the lock, at rest and client-side apart (issue 38,
        // item 11: "plaintext" read as "stored unencrypted"); a deleted state has none.
        assert!(
            lines[0].contains("AT REST      OPENTOFU ENCRYPTION  LOCK"),
            "{text}"
        );
        assert!(lines[1].contains(" AES-256-GCM  unknown "), "{text}");
        assert!(!text.contains("plaintext"), "{text}");
        let mut encrypted = rows[0].clone();
        encrypted.encryption = Some(stategate::tofu::posture::Posture {
            state: "encrypted",
            current: "encrypted",
            key_providers: vec!["pbkdf2.main".into()],
            known: 3,
        });
        encrypted.key_generation = Some(2);
        let text = workspace_table(&[encrypted.clone()]);
        assert!(
            text.contains(" AES-256-GCM, key generation 2  yes (pbkdf2.main) "),
            "{text}"
        );
        encrypted.encryption = Some(stategate::tofu::posture::Posture {
            state: "plaintext",
            current: "plaintext",
            key_providers: Vec::new(),
            known: 3,
        });
        let text = workspace_table(&[encrypted]);
        assert!(
            text.contains(" AES-256-GCM, key generation 2  no "),
            "{text}"
        );
    }

    /// Issue 38, item 10: a frozen workspace is not "-" in the LOCK column: the freeze,
    /// its end as every time in a table and its reason, beside a lock still held.
    #[test]
    fn workspace_listing_shows_freezes_where_locks_are() {
        let freeze = |until| stategate::tofu::freeze::Freeze {
            workspace: "prod".into(),
            frozen_by: "cli:alice".into(),
            reason: "incident 42".into(),
            created_at: "2026-12-02T08:00:00Z".into(),
            until,
        };
        let mut row = WorkspaceSummary {
            name: "prod".into(),
            version: Some(3),
            serial: Some(2),
            size: Some(10),
            updated_at: Some("t".into()),
            written_by: None,
            deleted: false,
            lock: None,
            plans: Vec::new(),
            frozen: Some(freeze(Some(1_796_205_600))),
            encryption: None,
            key_generation: None,
        };
        let text = workspace_table(std::slice::from_ref(&row));
        assert!(
            text.lines()
                .nth(1)
                .is_some_and(|l| l.ends_with("frozen until 2026-12-02 10:00 UTC (incident 42)")),
            "{text}"
        );
        row.frozen = Some(freeze(None));
        row.lock = Some(LockState {
            id: "L".into(),
            who: "me@box".into(),
            operation: "OperationTypeApply".into(),
            created_at: "t".into(),
            age_seconds: 60,
            stale: false,
        });
        let text = workspace_table(&[row]);
        assert!(
            text.contains("frozen until unfrozen (incident 42); me@box apply 60s"),
            "{text}"
        );
    }
}
