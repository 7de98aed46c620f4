//! The index and store commands: `prune` (the retention policy now), `index
//! rebuild` (a new index from the blobs alone), `backup`, `backup list` and
//! `restore` (a new index from a backup plus every version after it). Each opens what
//! it needs through `stategate::installation` and calls the engine; a new index is
//! only ever written into a new file, or into the live path when no index and no
//! server is there (with a PostgreSQL index: into an empty database no other
//! stategate uses, `store::index::NewIndex`).

use std::path::{Path, PathBuf};

use clap::Subcommand;

use stategate::config::Config;
use stategate::installation;
use stategate::store::index::{Index, MigrateTo};
use stategate::store::retention::Retention;

use super::output::{advance, json_line, listing, operator, progress_bar, runtime, spinner, when};

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
    let policy = Retention::from_config(&config.retention);
    let rt = runtime()?;
    rt.block_on(async {
        let bar = spinner("applying the retention policy");
        let done = installation::prune(config, policy, dry_run, sweep_garbage).await;
        bar.finish_and_clear();
        let (pruned, swept) = done?;
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

pub fn rebuild(config: &Config, into: &Path) -> anyhow::Result<()> {
    let rt = runtime()?;
    let bar = progress_bar("verifying blobs");
    let rebuilt = installation::recovery::rebuild(config, into, &rt, &advance(&bar));
    bar.finish_and_clear();
    let installation::recovery::Rebuilt {
        report,
        postures,
        store,
        index,
        next_step,
    } = rebuilt?;
    let scopes: std::collections::BTreeSet<&str> =
        report.rows.iter().map(|r| r.scope.as_str()).collect();
    println!(
        "Rebuilt the version index from {store} into {index}: {} version(s) of {} scope(s).",
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
    println!("{next_step}");
    Ok(())
}

/// `stategate backup`: a snapshot into the store now, then the oldest beyond `backup.keep` go.
pub fn backup(config: &Config) -> anyhow::Result<()> {
    let rt = runtime()?;
    let bar = spinner("taking a backup");
    let taken = rt.block_on(installation::backup(config));
    bar.finish_and_clear();
    let taken = taken?;
    json_line(&taken.info)?;
    for old in &taken.deleted? {
        eprintln!(
            "deleted old backup {} (backup.keep = {})",
            old.id, config.backup.keep
        );
    }
    let index = Index::of(config).name();
    eprintln!(
        "backed up {index} into {} as {}",
        taken.store, taken.info.key
    );
    Ok(())
}

pub fn list_backups(config: &Config, json: bool) -> anyhow::Result<()> {
    let (store, all) = runtime()?.block_on(installation::recovery::backups(config))?;
    listing(
        &all,
        json,
        &format!("no backups in {store}"),
        &["BACKUP", "TAKEN", "KEY"],
        |b| vec![b.id.clone(), when(&b.taken_at), b.key.clone()],
    )
}

/// `stategate restore`: a NEW database from a backup plus every version committed after it.
pub fn restore(config: &Config, from: &str, into: &Path) -> anyhow::Result<()> {
    let rt = runtime()?;
    let bar = progress_bar("adding versions written after the backup");
    let restored =
        installation::recovery::restore(config, from, into, &operator(), &rt, &advance(&bar));
    bar.finish_and_clear();
    let installation::recovery::Restored {
        backup: chosen,
        generation,
        report,
        postures,
        reapplied,
        narrowed,
        store,
        index,
        next_step,
    } = restored?;
    println!(
        "Restored backup {} (taken {}, sealed under data key generation {}) from {store} into {index}.",
        chosen.id,
        chosen.taken_at,
        generation.map_or("?".to_string(), |g| g.to_string()),
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
    println!("{next_step}");
    Ok(())
}
