//! The operator's workspace commands of the binary (`mod workspace_ops` in main.rs):
//! `workspace list|show|diff|unlock|restore`. Each is one call into
//! `stategate::operator::Operations` (the admin HTTP API calls the same functions)
//! plus printing: a table for people, `--json` lines for scripts. Every failure is one
//! line on stderr and a non-zero exit.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;

use anyhow::bail;

use stategate::config::Config;
use stategate::error::ApiError;
use stategate::operator::diff::{Change, StateDiff};
use stategate::operator::{rolled_back_json, LockState, Operations, WorkspaceSummary};
use stategate::server;

use crate::ops::{json_line, operator, runtime};

/// The operations over this installation's engine, and the runtime that drives them.
pub struct Ops {
    pub rt: tokio::runtime::Runtime,
    pub ops: Operations,
}

impl Ops {
    pub fn open(config: &Config) -> anyhow::Result<Ops> {
        if !config.db_path().exists() {
            bail!(
                "no database at {} (is STATEGATE_DATA_DIR / data_dir right?)",
                config.db_path().display()
            );
        }
        let root = server::load_root_key(config, false)?;
        let cluster_key = server::load_cluster_key(config)?;
        let rt = runtime()?;
        let store = rt.block_on(server::open_state_store(config))?;
        let clusters = stategate::cluster::ClusterService::new(
            store.clone(),
            cluster_key,
            &config.cluster,
            Arc::new(stategate::cluster::SystemClock),
        );
        let tofu = stategate::tofu::TofuBackend::new(store, root);
        let ops = Operations::new(tofu, clusters, config.locks.stale_after_seconds)
            .with_max_view_bytes(config.max_view_bytes);
        Ok(Ops { rt, ops })
    }

    fn run<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> anyhow::Result<T> {
        self.rt.block_on(f).map_err(cli_error)
    }
}

/// The operator-facing message of an error (the detail a server would only log).
pub fn cli_error(e: ApiError) -> anyhow::Error {
    match e {
        ApiError::Locked { holder_info } => anyhow::anyhow!(
            "the workspace is locked, nothing was written; wait for the run to finish (or force-unlock it). Lock holder: {}",
            String::from_utf8_lossy(&holder_info)
        ),
        ApiError::Internal { detail, .. } => anyhow::anyhow!("{detail}"),
        other => anyhow::anyhow!("{other}"),
    }
}

/// `45s`, `12m`, `3h`, `2d`.
pub fn age(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn lock_text(lock: &LockState) -> String {
    let stale = if lock.stale { " STALE" } else { "" };
    format!(
        "{} {} {}{stale}",
        lock.who,
        lock.operation,
        age(lock.age_seconds)
    )
}

/// Left-aligned columns, two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
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
                w.updated_at.clone().unwrap_or_else(|| "-".into()),
                w.lock.as_ref().map_or("-".into(), lock_text),
            ]
        })
        .collect();
    table(
        &["WORKSPACE", "VERSION", "SERIAL", "SIZE", "UPDATED", "LOCK"],
        &cells,
    )
}

pub fn list(config: &Config, json: bool) -> anyhow::Result<()> {
    let o = Ops::open(config)?;
    let rows = o.run(o.ops.list_workspaces())?;
    if json {
        rows.iter().for_each(json_line);
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

pub fn diff_text(d: &StateDiff) -> String {
    let sign = |c: &Change| match c {
        Change::Added => '+',
        Change::Removed => '-',
        Change::Changed => '~',
    };
    let mut out = String::new();
    for r in &d.resources {
        out.push_str(&format!("{} {}\n", sign(&r.change), r.address));
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
    let d = o.run(o.ops.diff(workspace, from, to))?;
    if json {
        for r in &d.resources {
            json_line(
                &serde_json::json!({ "kind": "resource", "address": r.address, "change": r.change, "attributes": r.attributes }),
            );
        }
        for out in &d.outputs {
            json_line(
                &serde_json::json!({ "kind": "output", "name": out.name, "change": out.change, "before": out.before, "after": out.after }),
            );
        }
    } else if d.is_empty() {
        println!("no differences between version {from} and version {to}");
    } else {
        print!("{}", diff_text(&d));
    }
    Ok(())
}

/// Asks for the workspace name back before `action` (from a terminal or a pipe);
/// anything else aborts.
pub fn confirmed(workspace: &str, action: &str) -> anyhow::Result<bool> {
    if std::io::stdin().is_terminal() {
        eprint!("Type the workspace name ({workspace}) to {action}: ");
        std::io::stderr().flush()?;
    }
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(answer.trim() == workspace)
}

pub fn unlock(config: &Config, workspace: &str, yes: bool, json: bool) -> anyhow::Result<()> {
    let o = Ops::open(config)?;
    let Some(holder) = o.run(o.ops.lock(workspace))? else {
        if json {
            json_line(&serde_json::json!({ "unlocked": false, "holder": null }));
        }
        eprintln!("workspace {workspace} is not locked; nothing to do");
        return Ok(());
    };
    eprintln!(
        "workspace {workspace} is locked by {:?} ({}, lock {}, held {}{}).",
        holder.who,
        holder.operation,
        holder.id,
        age(holder.age_seconds),
        if holder.stale { ", STALE" } else { "" }
    );
    eprintln!("Unlocking lets another run write while that run may still be going.");
    if !yes && !confirmed(workspace, "force-unlock it")? {
        bail!("aborted: the name did not match; nothing was changed");
    }
    let done = o.run(
        o.ops
            .unlock(workspace, Some(holder.id.clone()), &operator()),
    )?;
    if json {
        json_line(&done);
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
        json_line(&rolled_back_json(&done));
    }
    let current = rolled_back_json(&done);
    eprintln!(
        "workspace {workspace} restored: version {} holds the content of version {} (audited as tf.restored)",
        current["current"]["version"], done.to_version
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_tables() {
        for (s, text) in [
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (7200, "2h"),
            (172_800, "2d"),
        ] {
            assert_eq!(age(s), text);
        }
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
                deleted: false,
                lock: Some(lock),
            },
            WorkspaceSummary {
                name: "gone".into(),
                version: Some(4),
                serial: None,
                size: Some(0),
                updated_at: Some("t".into()),
                deleted: true,
                lock: None,
            },
        ];
        let text = workspace_table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("WORKSPACE  VERSION"), "{text}");
        assert!(
            lines[1].ends_with("me@box OperationTypeApply 66m STALE"),
            "{text}"
        );
        assert!(lines[2].contains("4 (deleted)"), "{text}");
    }
}
