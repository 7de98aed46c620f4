//! The index and store commands: `prune` (the retention policy now), `index
//! rebuild` (a new index from the blobs alone), `backup`, `backup list` and
//! `restore` (a new index from a backup plus every version after it). Each opens what
//! it needs through `stategate::installation` and calls the engine; a new index is
//! only ever written into a new file, or into the live path when no index and no
//! server is there (with a PostgreSQL index: into an empty database no other
//! stategate uses, `store::index::NewIndex`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Subcommand;

use stategate::config::Config;
use stategate::installation;
use stategate::store::index::{self, Index, MigrateTo};
use stategate::store::retention::Retention;
use stategate::store::{backup, rebuild};
use stategate::tokens;

use super::output::{
    advance, json_line, listing, operator, progress_bar, require_db, runtime, spinner, when,
};

#[derive(Subcommand)]
pub enum IndexCommand {
    /// Rebuild the version index from the blob store alone into a NEW database file
    /// (the live one is never touched), or with index.kind = "postgres" into an empty
    /// PostgreSQL database; prints how to swap it in.
    Rebuild {
        /// Path of the new database file (must not exist, or the live index's path
        /// when it is gone and no server runs on the data dir); with index.kind =
        /// "postgres", the URL of an empty PostgreSQL database.
        #[arg(long)]
        into: PathBuf,
    },
    /// Copy the whole index to the other database, verified table by table: the data
    /// dir's SQLite into an empty PostgreSQL database (`--to postgres URL`), or the
    /// configured PostgreSQL database into a new SQLite file (`--to sqlite PATH`).
    /// Stop every server first; the source is not changed. Then point `[index]` at the
    /// copy.
    Migrate {
        /// The kind of database to copy into: postgres or sqlite.
        #[arg(long, value_parser = ["postgres", "sqlite"])]
        to: String,
        /// The PostgreSQL URL, or the new SQLite file's path.
        target: String,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum BackupCommand {
    /// List the backups in the store, oldest first.
    List {
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub fn run_index(config: &Config, command: IndexCommand) -> anyhow::Result<()> {
    match command {
        IndexCommand::Rebuild { into } => rebuild(config, &into),
        IndexCommand::Migrate { to, target, json } => migrate(config, &to, target, json),
    }
}

pub fn migrate(config: &Config, to: &str, target: String, json: bool) -> anyhow::Result<()> {
    let to = MigrateTo::parse(to, target)?;
    let next = to.next_step(&config.db_path());
    let report = installation::migrate_index(config, to)?;
    let rows: Vec<_> = report
        .iter()
        .map(|t| serde_json::json!({"table": t.table, "rows": t.rows, "sha256": t.digest}))
        .collect();
    listing(
        &rows,
        json,
        "no tables",
        &["TABLE", "ROWS", "SHA-256 (same in both)"],
        |r| {
            vec![
                r["table"].as_str().unwrap_or_default().to_string(),
                r["rows"].to_string(),
                r["sha256"].as_str().unwrap_or_default().to_string(),
            ]
        },
    )?;
    let total: u64 = report.iter().map(|t| t.rows).sum();
    eprintln!(
        "copied and verified {} tables, {total} rows; the source is unchanged. Next: {next}",
        report.len()
    );
    Ok(())
}

pub fn run_backup(config: &Config, command: Option<BackupCommand>) -> anyhow::Result<()> {
    match command {
        None => backup(config),
        Some(BackupCommand::List { json }) => list_backups(config, json),
    }
}

pub fn prune(config: &Config, dry_run: bool, sweep_garbage: bool) -> anyhow::Result<()> {
    require_db(config)?;
    let policy = Retention::from_config(&config.retention);
    let rt = runtime()?;
    rt.block_on(async {
        let store = installation::open_state_store(config).await?;
        let now = stategate::clock::now_utc();
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
            }))?;
        }
        for g in &swept.swept {
            json_line(&serde_json::json!({
                "action": "sweep",
                "dry_run": !swept_for_real,
                "blob": g.key,
                "scope": g.scope,
                "version": g.version,
                "created_at": g.created_at,
            }))?;
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
    if let Some(file) = leftover_index(into) {
        bail!(
            "--into {} is the live index and {} exists; {what} into a new file and swap it in",
            into.display(),
            file.display()
        );
    }
    Ok(())
}

/// What of an index is still at `db`: the database file, or a write-ahead log with
/// frames in it. A clean stop empties the log (`installation::checkpoint_at_stop`), and
/// an empty log and its shared memory belong to no database: [`claim_into`] removes them.
fn leftover_index(db: &Path) -> Option<PathBuf> {
    let [db, wal, _] = index::files(db);
    if db.exists() {
        return Some(db);
    }
    std::fs::metadata(&wal)
        .is_ok_and(|m| m.len() > 0)
        .then_some(wal)
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
    // An empty log left by a clean stop, and its shared memory: a new index must not
    // meet them.
    for file in index::files(into).iter().skip(1) {
        match std::fs::remove_file(file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot remove {}", file.display()))
            }
            _ => {}
        }
    }
    Ok(Some(lock))
}

/// The workspace root with every keyring generation, including those only the
/// store's copies hold (a lost or older index), and the scope keys over it.
fn roots_with_ring(
    config: &Config,
    blobs: &dyn stategate::store::BlobStore,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<(stategate::crypto::RootKey, rebuild::ScopeKeys)> {
    // The ring is attached once, with the store's copies (`load_root_key` would
    // attach it from the index alone first).
    let dek = installation::read_root_key(config, false)?;
    let copies = rt.block_on(stategate::store::keyring::copies(blobs))?;
    installation::attach_ring(config, &dek, copies)?;
    let keys = stategate::schema::scope_keys(dek.clone(), installation::load_cluster_key(config)?);
    Ok((dek, keys))
}

pub fn rebuild(config: &Config, into: &Path) -> anyhow::Result<()> {
    let new = installation::new_index(config, into)?;
    let into = new.file();
    check_into(config, into, "rebuild")?;
    let blobs = installation::open_blob_store(config)?;
    let rt = runtime()?;
    let (dek, keys) = roots_with_ring(config, &*blobs, &rt)?;
    rt.block_on(installation::check_store_key(config, &dek, &*blobs))?;
    let claimed = claim_into(config, into, "rebuild")?;
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
    // What the headers do not say: each workspace version's encryption posture, from
    // its content.
    let postures = rt.block_on(stategate::tofu::posture::recompute(
        into,
        &*blobs,
        &keys,
        &report.rows,
    ))?;
    // The key opened what it rebuilt (or there was nothing to open): the new index
    // records it, so `serve` refuses any other.
    let opened = report
        .rows
        .iter()
        .any(|r| r.scope.starts_with(stategate::tofu::SCOPE_PREFIX));
    if opened || (report.rows.is_empty() && report.skipped.is_empty()) {
        rt.block_on(installation::record_key_in(into, &dek, &*blobs))?;
    }
    new.finish(&stategate::schema::INDEX)?;
    let scopes: std::collections::BTreeSet<&str> =
        report.rows.iter().map(|r| r.scope.as_str()).collect();
    println!(
        "Rebuilt the version index from {} into {}: {} version(s) of {} scope(s).",
        blobs.describe(),
        new.describe(),
        report.rows.len(),
        scopes.len()
    );
    println!(
        "Recomputed the encryption posture of {postures} workspace version(s) from their content."
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
    println!("{}", new.next_step(&config.db_path(), claimed.is_some()));
    Ok(())
}

/// `stategate backup`: a snapshot into the store now, then the oldest beyond `backup.keep` go.
pub fn backup(config: &Config) -> anyhow::Result<()> {
    require_db(config)?;
    let root = installation::load_root_key(config, false)?;
    let blobs = installation::open_blob_store(config)?;
    let rt = runtime()?;
    let bar = spinner("taking a backup");
    let taken = rt.block_on(backup::take_backup_from(
        installation::index_snapshot(config),
        &*blobs,
        &root,
    ));
    bar.finish_and_clear();
    let info = taken?;
    json_line(&info)?;
    let deleted = rt.block_on(backup::keep_newest(&*blobs, config.backup.keep as usize))?;
    for old in &deleted {
        eprintln!(
            "deleted old backup {} (backup.keep = {})",
            old.id, config.backup.keep
        );
    }
    let index = Index::of(config).name();
    eprintln!(
        "backed up {index} into {} as {}",
        blobs.describe(),
        info.key
    );
    Ok(())
}

pub fn list_backups(config: &Config, json: bool) -> anyhow::Result<()> {
    let blobs = installation::open_blob_store(config)?;
    let all = runtime()?.block_on(backup::list_backups(&*blobs))?;
    listing(
        &all,
        json,
        &format!("no backups in {}", blobs.describe()),
        &["BACKUP", "TAKEN", "KEY"],
        |b| vec![b.id.clone(), when(&b.taken_at), b.key.clone()],
    )
}

/// Applies again, in the restore's transaction, each recorded change the snapshot
/// predates (audited by `stategate restore`, through the rule's owner); what was
/// re-applied, for the report.
fn reapply_narrowings(
    conn: &stategate::store::sql::Connection,
    changes: &[tokens::Narrowing],
    taken_unix: i64,
) -> Result<Vec<String>, stategate::store::sql::Error> {
    const ACTOR: &str = "stategate restore";
    let failed = |e: String| stategate::store::sql::Error::Value(e);
    let mut out = Vec::new();
    for change in changes {
        match change.kind.as_str() {
            tokens::NARROWING_GRANT => {
                let applied = stategate::operator::identity::reapply_grant(conn, change, taken_unix, ACTOR)
                    .map_err(|e| failed(e.to_string()))?;
                if let Some(email) = applied {
                    out.push(format!("the role of operator {email} (set {} by {})", change.recorded_at(), change.actor));
                }
            }
            tokens::NARROWING_CONSUMERS => {
                let applied = stategate::tofu::credentials::reapply_consumers(conn, change, taken_unix, ACTOR)
                    .map_err(|e| failed(e.to_string()))?;
                if applied {
                    out.push(format!("the consumers of workspace {} (set {} by {})", change.subject, change.recorded_at(), change.actor));
                }
            }
            other => return Err(failed(format!("a recorded change of an unknown kind ({other:?}): this stategate is older than the one that recorded it"))),
        }
    }
    Ok(out)
}

/// `stategate restore`: a NEW database from a backup plus every version committed after it.
pub fn restore(config: &Config, from: &str, into: &Path) -> anyhow::Result<()> {
    let new = installation::new_index(config, into)?;
    let into = new.file();
    check_into(config, into, "restore")?;
    if into.exists() {
        bail!(
            "{} already exists; restore only ever writes a new file",
            into.display()
        );
    }
    let blobs = installation::open_blob_store(config)?;
    let rt = runtime()?;
    let (dek, keys) = roots_with_ring(config, &*blobs, &rt)?;
    let stored_key = rt.block_on(installation::check_store_key(config, &dek, &*blobs))?;
    let chosen = rt.block_on(backup::pick(&*blobs, Some(from)))?;
    let generation = rt
        .block_on(stategate::store::reseal::blob_generation(
            &*blobs,
            &chosen.key,
        ))
        .map_err(anyhow::Error::msg)?;
    let claimed = claim_into(config, into, "restore")?;
    // Every revocation ever recorded, so none made after the snapshot is undone.
    let revocations = rt.block_on(tokens::RevocationLog::new(blobs.clone(), dek.clone()).load())?;
    // And every recorded role, cap and consumers change: one made after the snapshot
    // is applied again, as a revocation is.
    let narrowings = rt.block_on(tokens::NarrowingLog::new(blobs.clone(), dek.clone()).load())?;
    let taken_unix = chosen.unix_seconds();
    let restored_at = stategate::store::now_rfc3339();
    let mut reapplied = tokens::Reapplied::default();
    let mut narrowed: Vec<String> = Vec::new();
    let bar = progress_bar("adding versions written after the backup");
    let report = rt.block_on(backup::restore(
        &*blobs,
        &dek,
        &keys,
        chosen.clone(),
        into,
        stategate::schema::MIGRATIONS,
        stategate::schema::ALL,
        &advance(&bar),
        &mut |c| {
            // The backup opened with this key: the restored index records it.
            stategate::store::keyring::set_fingerprint(c, &dek.fingerprint())?;
            reapplied = tokens::after_restore(c, &revocations, &restored_at)?;
            narrowed = reapply_narrowings(c, &narrowings, taken_unix)?;
            // The restore itself, with what it re-applied, in the new index's audit log.
            let revoked: Vec<_> = reapplied
                .revoked
                .iter()
                .map(|(kind, id)| serde_json::json!({ "kind": kind, "token": id }))
                .collect();
            stategate::store::audit::insert_audit(
                c,
                &stategate::store::audit::AuditEntry {
                    actor: operator(),
                    org: None,
                    scope: "index".into(),
                    event: "index.restored",
                    payload: serde_json::json!({
                        "backup": chosen.id,
                        "taken_at": chosen.taken_at,
                        "revocations_reapplied": revoked,
                        "sessions_ended": reapplied.sessions_ended,
                        "changes_reapplied": narrowed.len(),
                    }),
                },
            )
        },
    ));
    bar.finish_and_clear();
    let report = report?;
    if stored_key.is_none() {
        rt.block_on(stategate::store::keyring::store_fingerprint(
            &*blobs,
            &dek.fingerprint(),
        ))?;
    }
    // The versions added after the backup: their encryption posture, from their content.
    let postures = rt.block_on(stategate::tofu::posture::recompute(
        into,
        &*blobs,
        &keys,
        &report.added,
    ))?;
    new.finish(&stategate::schema::INDEX)?;
    println!(
        "Restored backup {} (taken {}, sealed under data key generation {}) from {} into {}.",
        chosen.id,
        chosen.taken_at,
        generation.map_or("?".to_string(), |g| g.to_string()),
        blobs.describe(),
        new.describe()
    );
    println!(
        "Added {} version(s) committed after the backup; dropped {} row(s) whose blob was pruned since.",
        report.added.len(),
        report.dropped.len()
    );
    if !report.resealed.is_empty() {
        println!(
            "Pointed {} row(s) at the blob `key reseal` re-encrypted them into after the backup.",
            report.resealed.len()
        );
    }
    for row in &report.added {
        println!(
            "added {} v{} (created {})",
            row.scope, row.version, row.created_at
        );
    }
    println!(
        "Recomputed the encryption posture of {postures} added version(s) from their content."
    );
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
        "Re-applied {} revocation(s) recorded in the store after the backup; ended {} web UI \
         session(s) (operators log in again).",
        reapplied.revoked.len(),
        reapplied.sessions_ended
    );
    for (kind, id) in &reapplied.revoked {
        println!("revoked {kind} token {id} again");
    }
    println!(
        "Re-applied {} role, cap or consumers change(s) recorded in the store after the backup.",
        narrowed.len()
    );
    for what in &narrowed {
        println!("re-applied {what}");
    }
    println!(
        "Not in blobs, so as of the backup: orgs, users, tokens created since, clusters, \
         leases, locks, tombstones and the audit log (changes to them after {} are not \
         restored; revocations, role, cap and consumers changes are).",
        chosen.taken_at
    );
    println!("{}", new.next_step(&config.db_path(), claimed.is_some()));
    Ok(())
}
