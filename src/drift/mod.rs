//! Drift checks as first-class objects: scheduled `plan -detailed-exitcode` runs of
//! configured workspaces (`[[drift]]`), their append-only history, notifications when
//! a workspace's outcome changes, and approval-gated applies of a kept plan.
//!
//! [`DriftService`] is the one code path for the server's scheduler, the CLI (`drift
//! list|show|run|apply`) and the admin API. A check runs the configured binary itself
//! with the workspace's derived backend credentials in its environment (the operator
//! configures no secret twice), `-lock=true` with a short lock timeout so it never
//! fights a real run, in its own process group so a timeout kills everything it
//! started; a lock such a child left behind is force-cleared and audited. Exit 0 is
//! `in_sync`, 2 is `drifted` (a fact about infrastructure, not a failure), anything else
//! `error`; a held lock is `skipped_locked`. The human plan text is sealed into the
//! blob store, kept for the newest `keep_outputs` runs per workspace (the tidy pass
//! deletes older runs' text and orphans, recording each pruned run first so `show`
//! tells pruned text from lost text; the runs themselves stay); a drifted check
//! with `approve_apply` keeps its plan sealed in the same blob store
//! (`drift/plans/<run>.plan`) until it is approved (applied once, then deleted) or
//! expires. Nothing of a run lives only on the node that ran it, so nodes sharing one
//! index and one store approve and apply each other's plans; the index admits one
//! unfinished run per workspace and one apply per check, whichever node asks.
//!
//! This file holds the service, its types and shared helpers; each job has its own
//! file: `queries` (checks, runs, output, metrics), `execute` (running an admitted
//! run's child and recording how it ended), `kept` (kept plans in the store, and
//! moving an earlier release's plan files there), `approve` (approval and the apply of
//! a kept plan), `tidy` (what stopped processes and retention leave), `reseal` (its
//! sealed objects under the keyring), `schedule` (due checks). Below them: `plan` (pure: the
//! `-json` stream, outcomes, the notify rule),
//! `outcomes` (the `drift_runs` and `drift_outputs_pruned` tables), `runner` (the child
//! process), `sandbox` (what the child can see), `work` (plaintext work files),
//! `webhook` (signed events).

mod approve;
mod execute;
mod kept;
pub mod outcomes;
pub mod plan;
mod queries;
mod reseal;
pub mod runner;
pub mod sandbox;
mod schedule;
mod tidy;
pub mod webhook;
pub mod work;

pub use kept::PLAN_PREFIX;
pub use reseal::DriftResealed;
pub use schedule::due_in;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::time::Instant;

use crate::config::{Config, DriftCheck, DriftSettings};
use crate::crypto::{write_secret_file, RootKey};
use crate::error::Error;
use crate::store::audit::{insert_audit, AuditEntry};
use crate::store::{Db, DbError};
use crate::tofu::{run_credential, TofuBackend};
pub use outcomes::{postgres_schema, Finished, Kind, Run, SCHEMA};
use plan::Ended;
pub use plan::{Changes, Outcome};

/// Audit events (payloads are run ids and outcomes, never plan content).
pub const EVENT_APPLY_APPROVED: &str = "drift.apply_approved";
pub const EVENT_APPLIED: &str = "drift.applied";
/// Recovering an abandoned run found a workspace lock its child did not take and left
/// it for an operator (payload: run, lock id, the credential that took it).
pub const EVENT_LOCK_LEFT: &str = "drift.lock_left";
/// The webhook event of an outcome change.
pub const EVENT_OUTCOME_CHANGED: &str = "drift.outcome_changed";

/// Most bytes of human plan text kept per run.
const MAX_OUTPUT: usize = 4 * 1024 * 1024;
/// Where runs' sealed output lives in the blob store: `drift/<run id>-<uuid>.out`
/// (kept plans are under it too, in [`PLAN_PREFIX`]: each sweep knows its own keys).
pub const OUTPUT_PREFIX: &str = "drift/";
/// Most output blobs one tidy pass deletes (the next pass goes on).
const MAX_TIDY_DELETIONS: usize = 1000;
/// Output keys whose runs one index read looks up.
const TIDY_BATCH: usize = 256;
/// Most runs one listing returns.
pub const MAX_LIST: u32 = 1000;
/// An unfinished run older than its check's timeout plus this was abandoned by a
/// process that stopped; it is closed as an error so the workspace can run again.
const ABANDONED_AFTER: u64 = 300;
/// Webhook deliveries remembered before finished ones are forgotten.
const MAX_PENDING: usize = 64;
/// The scheduler looks at least this often (new runs from the CLI move the schedule).
const MAX_TICK: Duration = Duration::from_secs(60);
/// The scheduler sweeps outputs and kept plans at least this often, besides at startup
/// and after a run of this process finished (see [`outputs_sweep_due`]). A sweep LISTs
/// all of `drift/` (outputs and kept plans), a paginated LIST on S3, so it is not done
/// every tick; what this process cannot see finishing (another process's runs, a kept plan
/// expiring, a crash's orphan) waits for this, and none of it is urgent: the text or
/// the sealed plan merely lingers a little longer (an expired plan is never approved).
const OUTPUTS_SWEEP_EVERY: Duration = Duration::from_secs(10 * 60);

/// A configured check with its latest status, for `GET /api/v1/admin/drift`.
#[derive(Debug, Clone, Serialize)]
pub struct CheckSummary {
    pub workspace: String,
    pub dir: PathBuf,
    pub binary: String,
    pub interval_seconds: u64,
    pub timeout_seconds: u64,
    pub approve_apply: bool,
    /// The latest in_sync / drifted / error outcome.
    pub status: Option<Outcome>,
    pub status_at: Option<String>,
    /// The unfinished run, if one is going.
    pub running: Option<i64>,
    /// The newest finished check (any outcome, `skipped_locked` included), with its
    /// counts and whether the state moved since.
    pub last_check: Option<Run>,
    /// When the schedule runs it next (RFC 3339; `None`: no interval, on demand only).
    pub next_due_at: Option<String>,
}

/// A run's human output as [`DriftService::show`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutput {
    /// The stored text.
    Text(String),
    /// None was stored: the run is still going, wrote none, or could not store it.
    Absent,
    /// Deleted by retention at `at` (RFC 3339), which then kept only the newest `keep`
    /// runs' text per workspace (as recorded when it was deleted, whatever the setting
    /// is now).
    Pruned { keep: u64, at: String },
}

impl RunOutput {
    pub fn text(&self) -> Option<&str> {
        match self {
            RunOutput::Text(text) => Some(text),
            RunOutput::Absent | RunOutput::Pruned { .. } => None,
        }
    }

    /// What to say instead of the text when retention deleted it.
    pub fn pruned_note(&self) -> Option<String> {
        match self {
            RunOutput::Pruned { keep, at } => Some(format!(
                "plan text pruned by retention at {at} (it kept only the newest {keep} runs per workspace)"
            )),
            RunOutput::Text(_) | RunOutput::Absent => None,
        }
    }

    /// `{"run", "output", "output_pruned"}`, as the admin API and `drift show --json` answer.
    pub fn json(&self, run: &Run) -> serde_json::Value {
        serde_json::json!({
            "run": run,
            "output": self.text(),
            "output_pruned": self.pruned_note(),
        })
    }
}

/// What clearing a run's lock did: the note for its message, and the lock it left
/// because another credential took it (lock id, that credential's name).
struct LockCleanup {
    note: String,
    left: Option<(String, String)>,
}

/// A run that was admitted (its row exists, unfinished) and is ready to execute.
#[derive(Debug, Clone)]
pub struct Started {
    pub id: i64,
    pub workspace: String,
    pub kind: Kind,
    pub applies: Option<i64>,
    check: DriftCheck,
}

/// The drift surface over the same engine `serve` uses.
#[derive(Clone)]
pub struct DriftService {
    inner: Arc<Inner>,
}

struct Inner {
    tofu: TofuBackend,
    /// The index, for drift's own tables (`drift_runs` and its records) and the
    /// transactions that join them with `tofu`'s and `store`'s functions.
    db: Db,
    root: RootKey,
    checks: BTreeMap<String, DriftCheck>,
    settings: DriftSettings,
    /// Where the backend address comes from, looked up at each run (the server records
    /// its address after it built this service).
    config: Config,
    /// `<data_dir>/drift`: `work/` (plaintext while in use), and `plans/` where an
    /// earlier release kept sealed plans (moved into the store by `kept`).
    dir: PathBuf,
    slots: tokio::sync::Semaphore,
    /// What children run in.
    sandbox: sandbox::Sandbox,
    notifier: webhook::Notifier,
    /// Webhook deliveries still going.
    pending: std::sync::Mutex<Vec<tokio::task::JoinHandle<Vec<webhook::Delivery>>>>,
    /// Runs this process finished (each may put an older run's output past retention).
    finished_runs: AtomicU64,
    /// What the last outputs sweep left, for the scheduler's [`outputs_sweep_due`].
    last_sweep: std::sync::Mutex<Option<SweepMark>>,
}

/// An outputs sweep that was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SweepMark {
    /// When it ended.
    at: Instant,
    /// [`Inner::finished_runs`] when it started (its LIST saw those runs' outputs).
    finished_runs: u64,
    /// It stopped at [`MAX_TIDY_DELETIONS`]: more may be waiting.
    more: bool,
}

fn now_unix() -> i64 {
    crate::clock::now_utc().unix_timestamp()
}

fn unix_of(rfc3339: &str) -> Option<i64> {
    time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

/// A Unix time as RFC 3339 (the far future when out of range).
fn rfc3339_of(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .unwrap_or(time::macros::datetime!(9999-12-31 23:59:59 UTC))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn internal(public: &str, detail: impl std::fmt::Display) -> Error {
    Error::Internal {
        public: public.into(),
        detail: format!("{public}: {detail}"),
    }
}

/// `unix` plus `seconds`, saturating: no configured duration overflows a timestamp.
fn seconds_after(unix: i64, seconds: u64) -> i64 {
    unix.saturating_add(i64::try_from(seconds).unwrap_or(i64::MAX))
}

/// Keeps the first `MAX_OUTPUT` bytes (on a character boundary).
fn bounded(mut text: String) -> String {
    if text.len() > MAX_OUTPUT {
        let mut end = MAX_OUTPUT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("\n… (output truncated)\n");
    }
    text
}

/// The associated data a run's sealed output or plan is bound to.
fn sealed_ad(what: &str, workspace: &str, run: i64) -> Vec<u8> {
    format!("stategate-drift-{what}:{workspace}:{run}").into_bytes()
}

impl DriftService {
    /// The service for `config`'s checks, over `tofu` (whose DEK is `root`).
    pub fn new(config: &Config, tofu: TofuBackend, root: RootKey) -> Self {
        Self::with_backoff(config, tofu, root, Duration::from_secs(1))
    }

    /// [`DriftService::new`] with the first webhook retry wait (tests use a short one).
    pub fn with_backoff(
        config: &Config,
        tofu: TofuBackend,
        root: RootKey,
        backoff: Duration,
    ) -> Self {
        let settings = config.drift_settings.clone();
        let notifier = webhook::Notifier::new(
            settings.webhooks.clone(),
            root.webhook_secret(),
            settings.webhook_attempts,
            Duration::from_secs(settings.webhook_timeout_seconds),
            backoff,
        );
        let sandbox = sandbox::Sandbox::from_config(config);
        if !config.drift.is_empty() {
            match (sandbox.kind(), sandbox.unavailable()) {
                (crate::config::DriftSandbox::None, _) => tracing::warn!(
                    "drift_settings.sandbox = \"none\": drift children run unsandboxed and can read this server's secrets (the DEK, the data dir)"
                ),
                (_, Some(why)) => tracing::error!("{why}; every drift check fails until then"),
                (_, None) => {}
            }
        }
        // Plaintext a stopped process left (it died holding a plan).
        work::sweep(&config.data_dir.join("drift").join("work"));
        DriftService {
            inner: Arc::new(Inner {
                sandbox,
                db: tofu.store().index_handle(),
                tofu,
                checks: config
                    .drift
                    .iter()
                    .map(|c| (c.workspace.clone(), c.clone()))
                    .collect(),
                slots: tokio::sync::Semaphore::new(settings.max_concurrent as usize),
                config: config.clone(),
                dir: config.data_dir.join("drift"),
                settings,
                notifier,
                root,
                pending: Default::default(),
                finished_runs: AtomicU64::new(0),
                last_sweep: Default::default(),
            }),
        }
    }

    /// The secret webhook receivers verify signatures with.
    pub fn webhook_secret(&self) -> String {
        self.inner.root.webhook_secret()
    }

    fn check_of(&self, workspace: &str) -> Result<&DriftCheck, Error> {
        crate::names::validate_workspace(workspace)?;
        self.inner.checks.get(workspace).ok_or_else(|| {
            Error::NotFound(format!(
                "no drift check is configured for workspace {workspace:?} (add a [[drift]] entry)"
            ))
        })
    }

    /// The blob store drift's outputs and kept plans live in.
    fn blobs(&self) -> &Arc<dyn crate::store::blob::BlobStore> {
        self.inner.tofu.store().blobs()
    }

    /// Every object of the store under `prefix` (one LIST, paginated on S3).
    async fn list_objects(&self, prefix: &str) -> Result<Vec<String>, Error> {
        self.blobs()
            .list(prefix)
            .await
            .map_err(|e| internal(&format!("cannot list {prefix} in the store"), e))
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl Fn(&crate::store::sql::Connection) -> Result<T, crate::store::sql::Error>
            + Send
            + 'static,
    ) -> Result<T, Error> {
        Ok(self.inner.db.read(f).await?)
    }

    pub fn has_checks(&self) -> bool {
        !self.inner.checks.is_empty()
    }
}

/// The webhook event of a check whose outcome changed.
pub fn event_json(run: &Run, previous: Option<Outcome>) -> serde_json::Value {
    serde_json::json!({
        "event": EVENT_OUTCOME_CHANGED,
        "workspace": run.workspace,
        "run": run.id,
        "outcome": run.outcome,
        "previous": previous,
        "message": run.message,
        "changes": run.changes,
        "serial": run.serial,
        "lineage": run.lineage,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
    })
}

impl Finished {
    fn error(exit_code: Option<i64>, message: String) -> Self {
        Finished {
            exit_code,
            outcome: Some(Outcome::Error),
            message,
            ..Finished::default()
        }
    }

    fn apply_failed(exit_code: Option<i64>, message: String) -> Self {
        Finished {
            exit_code,
            outcome: Some(Outcome::ApplyFailed),
            message,
            ..Finished::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pruned_output_says_so() {
        let pruned = RunOutput::Pruned {
            keep: 5,
            at: "2026-11-30T22:00:00Z".into(),
        };
        assert_eq!(pruned.text(), None);
        assert_eq!(
            pruned.pruned_note().unwrap(),
            "plan text pruned by retention at 2026-11-30T22:00:00Z (it kept only the newest 5 runs per workspace)"
        );
        assert_eq!(RunOutput::Text("x".into()).text(), Some("x"));
        assert_eq!(RunOutput::Absent.pruned_note(), None);
    }

    #[test]
    fn outputs_are_bounded_on_a_character_boundary() {
        assert_eq!(bounded("short".into()), "short");
        let long = "é".repeat(MAX_OUTPUT);
        let cut = bounded(long);
        assert!(cut.len() < MAX_OUTPUT + 64 && cut.ends_with("(output truncated)\n"));
    }
}
