//! The drift commands: `drift list|show|run|apply|webhook-secret`. Each is one call
//! into `stategate::drift::DriftService` (the admin API and the server's scheduler
//! call the same functions) plus printing: a table for people, `--json` for scripts.
//! A check started here runs in this process (its child talks to the running server)
//! and waits for its webhooks.

use anyhow::bail;
use clap::Subcommand;

use stategate::config::Config;
use stategate::drift::{DriftService, Run};
use stategate::installation::{self, Purpose};

use super::output::{cli_error, confirmed, json_line, json_lines, operator, table, when};

#[derive(Subcommand)]
pub enum DriftCommand {
    /// Recent drift runs, newest first: outcome, changes, the serial planned against.
    List {
        /// Only the runs of this workspace.
        #[arg(long)]
        workspace: Option<String>,
        /// At most this many (the newest).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One run and its plan output (decrypted from the store).
    Show {
        /// The run id (`drift list` prints it).
        run: i64,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run a workspace's check now, in this process (the server must be reachable),
    /// and wait for it and its webhooks.
    Run {
        /// The workspace (its name in the backend address).
        workspace: String,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Approve a drifted check's kept plan and apply exactly that plan (audited). Asks
    /// for the workspace name back unless --yes. Refused twice, for a run that is not
    /// drifted, and once the plan expired.
    Apply {
        /// The run id (`drift list` prints it).
        run: i64,
        /// Do not ask for the typed confirmation.
        #[arg(long)]
        yes: bool,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the secret webhook receivers verify X-Stategate-Signature with.
    WebhookSecret,
}

pub fn run(config: &Config, command: DriftCommand) -> anyhow::Result<()> {
    match command {
        DriftCommand::List {
            workspace,
            limit,
            json,
        } => list(config, workspace, limit, json),
        DriftCommand::Show { run, json } => show(config, run, json),
        DriftCommand::Run { workspace, json } => run_now(config, &workspace, json),
        DriftCommand::Apply { run, yes, json } => apply(config, run, yes, json),
        DriftCommand::WebhookSecret => webhook_secret(config),
    }
}

struct DriftOps {
    rt: tokio::runtime::Runtime,
    drift: DriftService,
}

impl DriftOps {
    fn open(config: &Config) -> anyhow::Result<DriftOps> {
        let (rt, installation) = super::output::open(config, Purpose::Command)?;
        Ok(DriftOps {
            rt,
            drift: installation.drift(),
        })
    }

    fn run<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, stategate::error::Error>>,
    ) -> anyhow::Result<T> {
        self.rt.block_on(f).map_err(cli_error)
    }
}

fn outcome_text(run: &Run) -> String {
    match (run.outcome, &run.finished_at) {
        (Some(o), _) => o.as_str().to_string(),
        (None, None) => "running".into(),
        (None, Some(_)) => "-".into(),
    }
}

/// `+1 ~2 -0`, or `-` when the plan did not get that far.
fn changes_text(run: &Run) -> String {
    run.changes.map_or("-".into(), |c| {
        format!("+{} ~{} -{}", c.add, c.change, c.destroy)
    })
}

pub fn runs_table(rows: &[Run]) -> String {
    let opt = |v: Option<i64>| v.map_or("-".to_string(), |n| n.to_string());
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let kind = match r.applies {
                Some(check) => format!("apply of {check}"),
                None => "check".into(),
            };
            let outcome = if r.approvable {
                format!("{} (approvable)", outcome_text(r))
            } else {
                outcome_text(r)
            };
            vec![
                r.id.to_string(),
                r.workspace.clone(),
                kind,
                outcome,
                changes_text(r),
                opt(r.serial),
                when(&r.started_at),
                r.trigger.clone(),
                r.message.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table(
        &[
            "RUN",
            "WORKSPACE",
            "KIND",
            "OUTCOME",
            "CHANGES",
            "SERIAL",
            "STARTED",
            "TRIGGER",
            "MESSAGE",
        ],
        &cells,
    )
}

pub fn list(
    config: &Config,
    workspace: Option<String>,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    let o = DriftOps::open(config)?;
    let rows = o.run(o.drift.runs(workspace, limit))?;
    if json {
        json_lines(&rows)?;
    } else if rows.is_empty() {
        eprintln!("no drift runs yet");
    } else {
        print!("{}", runs_table(&rows));
    }
    Ok(())
}

pub fn show(config: &Config, run: i64, json: bool) -> anyhow::Result<()> {
    let o = DriftOps::open(config)?;
    let (row, output) = o.run(o.drift.show(run))?;
    if json {
        return json_line(&output.json(&row));
    }
    eprint!("{}", runs_table(std::slice::from_ref(&row)));
    match (output.text(), output.pruned_note()) {
        (Some(text), _) => print!("{text}"),
        (None, Some(note)) => eprintln!("({note})"),
        (None, None) => eprintln!("(no plan output stored for this run)"),
    }
    Ok(())
}

/// Prints a finished run and waits for its webhook deliveries.
fn report(o: &DriftOps, row: &Run, json: bool) -> anyhow::Result<()> {
    if json {
        json_line(row)?;
    } else {
        print!("{}", runs_table(std::slice::from_ref(row)));
    }
    for d in o.rt.block_on(o.drift.flush_webhooks()) {
        eprintln!(
            "webhook {}: {} after {} attempt(s){}",
            d.url,
            if d.delivered {
                "delivered"
            } else {
                "NOT delivered"
            },
            d.attempts,
            d.status
                .map_or(String::new(), |s| format!(" (last status {s})"))
        );
    }
    Ok(())
}

fn run_now(config: &Config, workspace: &str, json: bool) -> anyhow::Result<()> {
    let o = DriftOps::open(config)?;
    let row = o.run(o.drift.check_now(workspace, &operator()))?;
    report(&o, &row, json)
}

pub fn apply(config: &Config, run: i64, yes: bool, json: bool) -> anyhow::Result<()> {
    let o = DriftOps::open(config)?;
    let (check, output) = o.run(o.drift.show(run))?;
    if !check.approvable {
        // Let the service say exactly why (already approved, not drifted, expired).
        o.run(o.drift.approve(run, &operator()))?;
        bail!("drift run {run} cannot be approved");
    }
    if !yes {
        if let Some(text) = output.text() {
            eprint!("{text}");
        } else if let Some(note) = output.pruned_note() {
            eprintln!("({note})");
        }
        eprintln!(
            "Applying the saved plan of drift run {run} to workspace {} ({}).",
            check.workspace,
            changes_text(&check)
        );
        if !confirmed(&check.workspace, "apply this plan")? {
            bail!("aborted: the name did not match; nothing was applied");
        }
    }
    let started = o.run(o.drift.approve(run, &operator()))?;
    let row = o.run(o.drift.execute(started))?;
    report(&o, &row, json)?;
    match row.outcome {
        Some(stategate::drift::Outcome::Applied) => {
            eprintln!(
                "applied (audited as drift.apply_approved and drift.applied by {})",
                operator()
            );
            Ok(())
        }
        _ => bail!(
            "the apply did not succeed: {}",
            row.message.unwrap_or_default()
        ),
    }
}

pub fn webhook_secret(config: &Config) -> anyhow::Result<()> {
    println!("{}", installation::drift_webhook_secret(config)?);
    Ok(())
}
