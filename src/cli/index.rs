//! Operator commands of the binary (`mod ops` in main.rs, not part of the library):
//! `workspace env|history|rollback`, `prune`, `index rebuild`, `backup`, `restore`. Each opens what it needs
//! the way `serve` does (`server::open_state_store`, `open_database`, `load_root_key`)
//! and calls the engine; nothing here decides policy.

use std::path::Path;

use anyhow::bail;

use stategate::address;
use stategate::config::Config;
use stategate::installation;
use stategate::names::validate_workspace;
use stategate::server;
use stategate::store::retention::Retention;
use stategate::store::{backup, history, rebuild, WriteOutcome};

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Operator commands work on an existing installation: never create an empty index.
fn require_db(config: &Config) -> anyhow::Result<()> {
    let path = config.db_path();
    if !path.exists() {
        bail!(
            "no database at {} (is STATEGATE_DATA_DIR / data_dir right?)",
            path.display()
        );
    }
    Ok(())
}

/// One JSON object per line on stdout: what the listing commands print.
pub fn json_line(value: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string(value).expect("JSON values serialize")
    );
}

/// A progress bar on stderr for long work; drawn only when stderr is a terminal
/// (indicatif hides it otherwise), so piped output stays clean.
fn progress_bar(what: &'static str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} blobs ({eta})")
            .expect("valid template"),
    );
    bar.set_message(what);
    bar
}

/// A spinner for work without a count (a snapshot, a retention pass).
fn spinner(what: &'static str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(what);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// `progress(done, total)` for the engine, moving `bar`.
fn advance(bar: &indicatif::ProgressBar) -> impl Fn(usize, usize) + Sync + '_ {
    move |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    }
}

/// Who an operator command acts as, for version rows and the audit log.
pub fn operator() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    format!("operator:{user}")
}

/// `export` lines that make `terraform init` work with a bare `backend "http" {}`.
pub fn env(config: &Config, workspace: &str, opentofu_encryption: bool) -> anyhow::Result<()> {
    validate_workspace(workspace)?;
    let root = server::load_root_key(config, false)?;
    let lines = stategate::tofu::client_env(
        &address::for_clients(config),
        workspace,
        &root,
        opentofu_encryption,
    );
    print!("{lines}");
    Ok(())
}

pub fn history(config: &Config, workspace: &str, limit: Option<u32>) -> anyhow::Result<()> {
    validate_workspace(workspace)?;
    require_db(config)?;
    let rt = runtime()?;
    let db = server::open_database(config)?;
    let scope = stategate::tofu::scope(workspace);
    let rows = rt.block_on(db.read(move |c| history::history_rows(c, &scope, limit)))?;
    if rows.is_empty() {
        eprintln!("workspace {workspace} has no versions");
    }
    for row in &rows {
        json_line(&stategate::operator::version_json(row));
    }
    Ok(())
}

pub fn rollback(config: &Config, workspace: &str, to: i64) -> anyhow::Result<()> {
    validate_workspace(workspace)?;
    require_db(config)?;
    let root = server::load_root_key(config, false)?;
    let rt = runtime()?;
    rt.block_on(async {
        let store = server::open_state_store(config).await?;
        let backend = stategate::tofu::TofuBackend::new(store, root);
        let done = backend
            .rollback(workspace, to, &operator())
            .await
            .map_err(crate::workspace_ops::cli_error)?;
        match done.outcome {
            WriteOutcome::Stored(row) => {
                json_line(&stategate::operator::version_json(&row));
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

pub fn prune(config: &Config, dry_run: bool, sweep_garbage: bool) -> anyhow::Result<()> {
    require_db(config)?;
    let policy = Retention::from_config(&config.retention);
    let rt = runtime()?;
    rt.block_on(async {
        let store = server::open_state_store(config).await?;
        let now = time::OffsetDateTime::now_utc();
        let bar = spinner("applying the retention policy");
        let (pruned, swept) = store
            .run_retention(policy, now, dry_run, sweep_garbage)
            .await?;
        bar.finish_and_clear();
        let swept_for_real = sweep_garbage && !dry_run;
        for p in &pruned.pruned {
            json_line(&serde_json::json!({
                "action": "prune",
                "dry_run": dry_run,
                "scope": p.scope,
                "version": p.version,
                "created_at": p.created_at,
            }));
        }
        for g in &swept.swept {
            json_line(&serde_json::json!({
                "action": "sweep",
                "dry_run": !swept_for_real,
                "blob": g.key,
                "scope": g.scope,
                "version": g.version,
                "created_at": g.created_at,
            }));
        }
        for key in &swept.unrecognized {
            eprintln!("left alone (not a readable stategate blob, no row references it): {key}");
        }
        for e in pruned.blob_errors.iter().chain(&swept.errors) {
            eprintln!("could not delete blob (a later sweep retries): {e}");
        }
        eprintln!(
            "{} {} version(s) (keep_versions={}, keep_days={}); {} {} unreferenced blob(s); \
             {} unreferenced blob(s) younger than 1 hour left alone{}",
            if dry_run { "would prune" } else { "pruned" },
            pruned.pruned.len(),
            policy.keep_versions,
            policy.keep_days,
            if swept_for_real { "deleted" } else { "found" },
            swept.swept.len(),
            swept.young,
            if dry_run {
                " (dry run: nothing deleted)"
            } else {
                ""
            },
        );
        if !swept.swept.is_empty() && !swept_for_real {
            eprintln!(
                "unreferenced blobs are kept: they are crash leftovers, or committed versions of a \
                 database restored from an older backup (`stategate index rebuild --into NEW.db` \
                 recovers those). Delete them with --sweep-garbage once you have checked."
            );
        }
        Ok(())
    })
}

/// Whether `--into` names the live index (also via another spelling of its directory).
fn is_live(config: &Config, into: &Path) -> bool {
    let live = config.db_path();
    into == live
        || matches!(
            (into.parent().map(std::fs::canonicalize), live.parent().map(std::fs::canonicalize)),
            (Some(Ok(a)), Some(Ok(b))) if a == b && into.file_name() == live.file_name()
        )
}

/// `--into` names a new file. The live index's path is allowed only when it is gone
/// (a lost disk) and no server holds the data dir. This is the check without side
/// effects, run before any work; [`claim_into`] takes the lock before writing.
fn check_into(config: &Config, into: &Path, what: &str) -> anyhow::Result<()> {
    if !is_live(config, into) {
        return Ok(());
    }
    if let Some(file) = installation::index_files(into).iter().find(|f| f.exists()) {
        bail!(
            "--into {} is the live index and {} exists; {what} into a new file and swap it in",
            into.display(),
            file.display()
        );
    }
    Ok(())
}

/// For the live index's path: the data dir's lock, proving no server runs there and
/// keeping one from starting until the new file is complete (`None` for a new file
/// elsewhere).
fn claim_into(
    config: &Config,
    into: &Path,
    what: &str,
) -> anyhow::Result<Option<installation::DataDirLock>> {
    if !is_live(config, into) {
        return Ok(None);
    }
    let Some(lock) = installation::hold_without_server(config)? else {
        bail!(
            "--into {} is the live index and a stategate server is running on {}; {what} into a new file and swap it in",
            into.display(),
            config.data_dir.display()
        );
    };
    // Again under the lock: a server that ran meanwhile may have created the index.
    check_into(config, into, what)?;
    Ok(Some(lock))
}

fn scope_keys(config: &Config) -> anyhow::Result<rebuild::ScopeKeys> {
    Ok(stategate::schema::scope_keys(
        server::load_root_key(config, false)?,
        server::load_cluster_key(config)?,
    ))
}

/// How to put a new database file in place of the live one (nothing to do when it was
/// written there).
fn print_swap(config: &Config, into: &Path, in_place: bool) {
    if in_place {
        println!(
            "It is the index of {} already (no server was running there): start stategate.",
            config.data_dir.display()
        );
        return;
    }
    println!(
        "To use it: stop stategate; move {live}, {live}-wal and {live}-shm aside (keep them); \
         mv {} {live}; start stategate.",
        into.display(),
        live = config.db_path().display()
    );
}

pub fn rebuild(config: &Config, into: &Path) -> anyhow::Result<()> {
    check_into(config, into, "rebuild")?;
    let keys = scope_keys(config)?;
    let blobs = server::open_blob_store(config)?;
    let claimed = claim_into(config, into, "rebuild")?;
    let rt = runtime()?;
    let bar = progress_bar("verifying blobs");
    let report = rt.block_on(rebuild::rebuild_index_with_progress(
        &*blobs,
        &keys,
        into,
        stategate::schema::ALL,
        &advance(&bar),
    ));
    bar.finish_and_clear();
    let report = report?;
    let scopes: std::collections::BTreeSet<&str> =
        report.rows.iter().map(|r| r.scope.as_str()).collect();
    println!(
        "Rebuilt the version index from {} into {}: {} version(s) of {} scope(s).",
        blobs.describe(),
        into.display(),
        report.rows.len(),
        scopes.len()
    );
    for s in &report.skipped {
        println!("skipped {}: {}", s.key, s.reason);
    }
    for c in &report.superseded {
        println!(
            "superseded {} ({} v{}, created {}): an orphan of a write that never committed",
            c.key, c.header.scope, c.header.version, c.header.created_at
        );
    }
    for (scope, version) in &report.unproven {
        println!(
            "unproven {scope} v{version}: several blobs claim it and none is linked from the version above; the newest by clock was kept (check the superseded blobs above)"
        );
    }
    // Only a missing cluster root gives this reason.
    if report
        .skipped
        .iter()
        .any(|s| s.reason.contains("ADJ_STATE_ENC_KEY"))
    {
        println!("Cluster scopes were skipped: set ADJ_STATE_ENC_KEY to rebuild them too.");
    }
    println!(
        "Not stored in blobs, so NOT in the new index: locks (every workspace starts unlocked), \
         tombstones (a deleted state shows its last version again), the audit log, operators \
         and their tokens, web UI sessions, drift run history, and the cluster API's orgs, \
         users, tokens, clusters and leases. `stategate restore` (from a backup) has them."
    );
    print_swap(config, into, claimed.is_some());
    Ok(())
}

/// `stategate backup`: a snapshot into the store now, then the oldest beyond `backup.keep` go.
pub fn backup(config: &Config) -> anyhow::Result<()> {
    require_db(config)?;
    let root = server::load_root_key(config, false)?;
    let blobs = server::open_blob_store(config)?;
    let rt = runtime()?;
    let bar = spinner("taking a backup");
    let taken = rt.block_on(backup::take_backup(
        &config.db_path(),
        &config.data_dir,
        &*blobs,
        &root,
    ));
    bar.finish_and_clear();
    let info = taken?;
    json_line(&info);
    let deleted = rt.block_on(backup::keep_newest(&*blobs, config.backup.keep as usize))?;
    for old in &deleted {
        eprintln!(
            "deleted old backup {} (backup.keep = {})",
            old.id, config.backup.keep
        );
    }
    eprintln!(
        "backed up {} into {} as {}",
        config.db_path().display(),
        blobs.describe(),
        info.key
    );
    Ok(())
}

pub fn list_backups(config: &Config) -> anyhow::Result<()> {
    let blobs = server::open_blob_store(config)?;
    let all = runtime()?.block_on(backup::list_backups(&*blobs))?;
    if all.is_empty() {
        eprintln!("no backups in {}", blobs.describe());
    }
    for info in &all {
        json_line(info);
    }
    Ok(())
}

/// `stategate restore`: a NEW database from a backup plus every version committed after it.
pub fn restore(config: &Config, from: &str, into: &Path) -> anyhow::Result<()> {
    check_into(config, into, "restore")?;
    if into.exists() {
        bail!(
            "{} already exists; restore only ever writes a new file",
            into.display()
        );
    }
    let dek = server::load_root_key(config, false)?;
    let keys = stategate::schema::scope_keys(dek.clone(), server::load_cluster_key(config)?);
    let blobs = server::open_blob_store(config)?;
    let rt = runtime()?;
    let chosen = rt.block_on(backup::pick(&*blobs, Some(from)))?;
    let claimed = claim_into(config, into, "restore")?;
    let bar = progress_bar("adding versions written after the backup");
    let report = rt.block_on(backup::restore(
        &*blobs,
        &dek,
        &keys,
        chosen.clone(),
        into,
        stategate::schema::ALL,
        &advance(&bar),
    ));
    bar.finish_and_clear();
    let report = report?;
    println!(
        "Restored backup {} (taken {}) from {} into {}.",
        chosen.id,
        chosen.taken_at,
        blobs.describe(),
        into.display()
    );
    println!(
        "Added {} version(s) committed after the backup; dropped {} row(s) whose blob was pruned since.",
        report.added.len(),
        report.dropped.len()
    );
    for row in &report.added {
        println!(
            "added {} v{} (created {})",
            row.scope, row.version, row.created_at
        );
    }
    for s in &report.skipped {
        println!("skipped {}: {}", s.key, s.reason);
    }
    for c in &report.superseded {
        println!(
            "superseded {} ({} v{}): an orphan of a write that never committed",
            c.key, c.header.scope, c.header.version
        );
    }
    println!(
        "Not in blobs, so as of the backup: orgs, users, tokens, clusters, leases, locks, \
         tombstones and the audit log (changes to them after {} are not restored).",
        chosen.taken_at
    );
    print_swap(config, into, claimed.is_some());
    Ok(())
}
