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
//! with `approve_apply` keeps its plan file sealed in `<data_dir>/drift/plans` until it
//! is approved (applied once, then deleted) or expires.
//!
//! Submodules: `plan` (pure: the `-json` stream, outcomes, the notify rule), `outcomes`
//! (the `drift_runs` and `drift_outputs_pruned` tables), `runner` (the child process),
//! `webhook` (signed events).

pub mod outcomes;
pub mod plan;
pub mod runner;
pub mod sandbox;
pub mod webhook;
pub mod work;

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
use crate::error::ApiError;
use crate::store::audit::{insert_audit, AuditEntry};
use crate::store::blob::create_private_dir;
use crate::store::DbError;
use crate::tofu::{run_credential, TofuBackend};
pub use outcomes::{Finished, Kind, Run, SCHEMA};
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
/// Where runs' sealed output lives in the blob store: `drift/<run id>-<uuid>.out`.
const OUTPUT_PREFIX: &str = "drift/";
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
/// The scheduler sweeps outputs at least this often, besides at startup and after a run
/// of this process finished (see [`outputs_sweep_due`]). A sweep LISTs all of `drift/`,
/// a paginated LIST on S3, so it is not done every tick; what this process cannot see
/// finishing (another process's runs, a kept plan expiring, a crash's orphan) waits for
/// this, and none of it is urgent: the text merely lingers a little longer.
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
    root: RootKey,
    checks: BTreeMap<String, DriftCheck>,
    settings: DriftSettings,
    /// Where the backend address comes from, looked up at each run (the server records
    /// its address after it built this service).
    config: Config,
    /// `<data_dir>/drift`: `plans/` (sealed kept plans), `work/` (plaintext while in use).
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
    time::OffsetDateTime::now_utc().unix_timestamp()
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

fn internal(public: &str, detail: impl std::fmt::Display) -> ApiError {
    ApiError::Internal {
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

    fn check_of(&self, workspace: &str) -> Result<&DriftCheck, ApiError> {
        crate::names::validate_workspace(workspace)?;
        self.inner.checks.get(workspace).ok_or_else(|| {
            ApiError::NotFound(format!(
                "no drift check is configured for workspace {workspace:?} (add a [[drift]] entry)"
            ))
        })
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> Result<T, rusqlite::Error> + Send + 'static,
    ) -> Result<T, ApiError> {
        Ok(self.inner.tofu.store().db.read(f).await?)
    }

    /// Every configured check with its latest status.
    pub async fn checks(&self) -> Result<Vec<CheckSummary>, ApiError> {
        if self.inner.checks.is_empty() {
            return Ok(Vec::new());
        }
        let (latest, running, last_checks, started) = self
            .read(|c| {
                Ok((
                    outcomes::latest_status(c)?,
                    outcomes::unfinished(c)?,
                    outcomes::latest_checks(c)?,
                    outcomes::last_checks_started(c)?,
                ))
            })
            .await?;
        let now = now_unix();
        Ok(self
            .inner
            .checks
            .values()
            .map(|c| {
                let status = latest.iter().find(|(ws, _, _)| ws == &c.workspace);
                CheckSummary {
                    workspace: c.workspace.clone(),
                    dir: c.dir.clone(),
                    binary: c.binary.0.clone(),
                    interval_seconds: c.interval_seconds,
                    timeout_seconds: c.timeout_seconds,
                    approve_apply: c.approve_apply,
                    status: status.map(|s| s.1),
                    status_at: status.map(|s| s.2.clone()),
                    running: running
                        .iter()
                        .find(|r| r.workspace == c.workspace)
                        .map(|r| r.id),
                    last_check: last_checks
                        .iter()
                        .find(|r| r.workspace == c.workspace)
                        .map(|r| Self::with_approvable(r.clone(), now)),
                    next_due_at: (c.interval_seconds > 0).then(|| {
                        let last = started
                            .iter()
                            .find(|(ws, _)| ws == &c.workspace)
                            .and_then(|(_, at)| unix_of(at));
                        rfc3339_of(now.saturating_add(due_in(last, c.interval_seconds, now).max(0)))
                    }),
                }
            })
            .collect())
    }

    /// Executes an admitted run on its own task (the admin API's and the UI's
    /// "started, look at it later"); returns its id.
    pub fn spawn(&self, started: Started) -> i64 {
        let id = started.id;
        let drift = self.clone();
        tokio::spawn(async move {
            if let Err(e) = drift.execute(started).await {
                tracing::error!(error = %e, "cannot record a drift run");
            }
        });
        id
    }

    /// Whether `run`'s kept plan may be approved now.
    fn approvable(run: &Run, now: i64) -> bool {
        run.kind == Kind::Check
            && run.outcome == Some(Outcome::Drifted)
            && run.applied_by.is_none()
            && run.plan_expires_at.is_some_and(|t| t > now)
    }

    fn with_approvable(mut run: Run, now: i64) -> Run {
        run.approvable = Self::approvable(&run, now);
        run
    }

    /// The newest runs (of one workspace, or all), newest first.
    pub async fn runs(&self, workspace: Option<String>, limit: u32) -> Result<Vec<Run>, ApiError> {
        if let Some(ws) = &workspace {
            crate::names::validate_workspace(ws)?;
        }
        let limit = limit.clamp(1, MAX_LIST);
        let rows = self
            .read(move |c| outcomes::list_runs(c, workspace.as_deref(), limit))
            .await?;
        let now = now_unix();
        Ok(rows
            .into_iter()
            .map(|r| Self::with_approvable(r, now))
            .collect())
    }

    /// One run (404 when unknown).
    pub async fn run(&self, id: i64) -> Result<Run, ApiError> {
        let row = self.read(move |c| outcomes::get_run(c, id)).await?;
        let row = row.ok_or_else(|| ApiError::NotFound(format!("no drift run {id}")))?;
        Ok(Self::with_approvable(row, now_unix()))
    }

    /// A run and its human output. A stored output that cannot be read is an error,
    /// never "no output"; one that is gone because retention deleted it (the tidy pass
    /// recorded so before deleting it) is [`RunOutput::Pruned`], and one gone without
    /// that record is an error too, whatever `keep_outputs` says now.
    pub async fn show(&self, id: i64) -> Result<(Run, RunOutput), ApiError> {
        let run = self.run(id).await?;
        let Some(key) = &run.output_blob else {
            return Ok((run, RunOutput::Absent));
        };
        let found = self
            .inner
            .tofu
            .store()
            .blobs()
            .get(key)
            .await
            .map_err(|e| internal("cannot read the run's output from the store", e))?;
        let Some(sealed) = found else {
            // Looked up after the blob was found missing: retention commits the record
            // before it deletes, so a blob it deleted always has one by now.
            let run_id = run.id;
            return match self.read(move |c| outcomes::pruned(c, run_id)).await? {
                Some(p) => Ok((
                    run,
                    RunOutput::Pruned {
                        keep: p.keep,
                        at: p.at,
                    },
                )),
                None => Err(internal(
                    "the run's output is missing from the store",
                    format!("blob {key}"),
                )),
            };
        };
        let plain = self
            .inner
            .root
            .drift_output_key(&run.workspace)
            .open(&sealed_ad("output", &run.workspace, run.id), &sealed)
            .map_err(|e| internal("the run's output cannot be decrypted", e))?;
        let text = String::from_utf8_lossy(&plain).into_owned();
        Ok((run, RunOutput::Text(text)))
    }

    /// Admits a check of `workspace` now (409 while another run of it is unfinished).
    pub async fn start_check(&self, workspace: &str, trigger: &str) -> Result<Started, ApiError> {
        let check = self.check_of(workspace)?.clone();
        let latest = self
            .inner
            .tofu
            .store()
            .latest(&crate::tofu::scope(workspace))
            .await?
            .filter(|row| !row.is_tombstone());
        let (serial, lineage) = latest.map_or((None, None), |r| (r.serial, r.lineage));
        let (ws, trigger) = (workspace.to_string(), trigger.to_string());
        let id = self
            .inner
            .tofu
            .store()
            .db
            .write(move |c| {
                outcomes::start_run(
                    c,
                    &ws,
                    Kind::Check,
                    &trigger,
                    None,
                    serial,
                    lineage.as_deref(),
                )
                .map_err(DbError::from)
            })
            .await
            .map_err(ApiError::from)?
            .map_err(|outcomes::StartRefused::Busy(running)| {
                ApiError::Conflict(format!(
                    "drift run {running} of workspace {workspace:?} is still going; nothing was started"
                ))
            })?;
        Ok(Started {
            id,
            workspace: workspace.to_string(),
            kind: Kind::Check,
            applies: None,
            check,
        })
    }

    /// Runs a check now and waits for its outcome.
    pub async fn check_now(&self, workspace: &str, trigger: &str) -> Result<Run, ApiError> {
        let started = self.start_check(workspace, trigger).await?;
        self.execute(started).await
    }

    /// Executes an admitted run (check or apply) within the concurrency limit and
    /// records how it ended. Everything that goes wrong becomes the run's outcome.
    pub async fn execute(&self, started: Started) -> Result<Run, ApiError> {
        let _slot = self
            .inner
            .slots
            .acquire()
            .await
            .map_err(|e| internal("the drift runner is shutting down", e))?;
        // The CLI's `drift run` is a process holding the DEK too (`serve` did it at startup).
        if let Err(e) = sandbox::forbid_dumps() {
            tracing::warn!(error = %e, "cannot make this process non-dumpable");
        }
        let (done, output) = match self.issue_credential(&started).await {
            Err(why) => {
                let mut failed = Finished::error(None, why);
                if started.kind == Kind::Apply {
                    failed.outcome = Some(Outcome::ApplyFailed);
                }
                (failed, None)
            }
            Ok(secret) => match started.kind {
                Kind::Check => self.check_body(&started, &secret).await,
                Kind::Apply => self.apply_body(&started, &secret).await,
            },
        };
        self.finish(&started, done, output).await
    }

    /// A credential for this run's child only (`tofu::run_credential`), so the locks it
    /// takes are provably its own; revoked when the run is finished or closed, and
    /// expiring after the run's timeout (plus the abandon margin) whatever happens.
    async fn issue_credential(&self, s: &Started) -> Result<String, String> {
        let (secret, hash) = run_credential::new_secret()?;
        let expires = seconds_after(
            seconds_after(now_unix(), s.check.timeout_seconds),
            ABANDONED_AFTER,
        );
        let (ws, name) = (s.workspace.clone(), run_credential::name_of_run(s.id));
        self.inner
            .tofu
            .store()
            .db
            .write(move |c| {
                run_credential::insert(c, &hash, &ws, &name, expires).map_err(DbError::from)
            })
            .await
            .map_err(|e| format!("cannot issue the run's credential: {e}"))?;
        Ok(secret)
    }

    /// The environment and binary of a check whose child authenticates with `secret`
    /// (its run's credential), or why it cannot run.
    fn prepare(
        &self,
        check: &DriftCheck,
        secret: &str,
    ) -> Result<(PathBuf, Vec<(OsString, OsString)>), String> {
        let dir = &check.dir;
        if !dir.is_dir() {
            return Err(format!(
                "working directory {} does not exist",
                dir.display()
            ));
        }
        let has_config = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read working directory {}: {e}", dir.display()))?
            .filter_map(Result::ok)
            .any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                [".tf", ".tofu", ".tf.json", ".tofu.json"]
                    .iter()
                    .any(|ext| name.ends_with(ext))
            });
        if !has_config {
            return Err(format!(
                "working directory {} has no configuration (no .tf or .tofu files)",
                dir.display()
            ));
        }
        let mut extra: Vec<(String, String)> = crate::tofu::client_vars(
            &crate::address::for_clients(&self.inner.config),
            &check.workspace,
            &self.inner.root,
            check.opentofu_encryption,
        )
        .into_iter()
        .map(|(k, v)| match k {
            // Not the workspace bearer: what the child locks is recorded as this run's.
            "TF_HTTP_PASSWORD" => (k.to_string(), secret.to_string()),
            _ => (k.to_string(), v),
        })
        .collect();
        extra.push(("TF_IN_AUTOMATION".into(), "1".into()));
        extra.push(("TF_INPUT".into(), "0".into()));
        extra.extend(
            check
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.expose().to_string())),
        );
        let env = runner::child_env(std::env::vars_os(), &extra);
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone());
        let binary = runner::resolve_binary(&check.binary.0, path.as_deref())?;
        Ok((binary, env))
    }

    fn lock_timeout(&self) -> String {
        format!(
            "-lock-timeout={}s",
            self.inner.settings.lock_timeout_seconds
        )
    }

    fn work_root(&self) -> PathBuf {
        self.inner.dir.join("work")
    }

    /// Run `run`'s plaintext work directory, deleted when the returned value drops.
    fn work_dir(&self, run: i64) -> Result<work::WorkDir, String> {
        let root = self.work_root();
        work::WorkDir::create(&root, run)
            .map_err(|e| format!("cannot create a work directory in {}: {e}", root.display()))
    }

    /// Runs the check's binary with `args` in its `dir`, in the sandbox (with `work`
    /// writable too), until `deadline`.
    async fn run_child(
        &self,
        check: &DriftCheck,
        binary: &Path,
        args: &[String],
        env: &[(OsString, OsString)],
        deadline: Instant,
        work: &work::WorkDir,
    ) -> Result<runner::ChildOutput, String> {
        let readable: Vec<PathBuf> = check
            .var_files
            .iter()
            .filter(|f| f.is_absolute())
            .cloned()
            .collect();
        let (program, argv) =
            self.inner
                .sandbox
                .wrap(binary, args, &check.dir, Some(work.path()), &readable)?;
        runner::run(&program, &argv, &check.dir, env, deadline)
            .await
            .map_err(|e| format!("cannot start {}: {e}", program.display()))
    }

    fn plans_dir(&self) -> PathBuf {
        self.inner.dir.join("plans")
    }

    fn plan_path(&self, run: i64) -> PathBuf {
        self.plans_dir().join(format!("{run}.plan"))
    }

    /// `init` when the directory was never initialised.
    async fn init_if_needed(
        &self,
        check: &DriftCheck,
        binary: &Path,
        env: &[(OsString, OsString)],
        deadline: Instant,
        work: &work::WorkDir,
    ) -> Result<(), (Finished, Option<String>)> {
        if check.dir.join(".terraform").is_dir() {
            return Ok(());
        }
        let args = ["init", "-input=false", "-no-color"].map(String::from);
        let ended = self
            .run_child(check, binary, &args, env, deadline, work)
            .await;
        match ended {
            Ok(out) if out.ended == Ended::Exited(0) => Ok(()),
            Ok(out) => {
                let text = format!("{}\n{}", out.stdout, out.stderr);
                let why = match out.ended {
                    Ended::TimedOut => "init ran past the check's timeout".to_string(),
                    _ => format!(
                        "init failed: {}",
                        text.lines()
                            .map(str::trim)
                            .find(|l| l.contains("Error"))
                            .unwrap_or("see the output")
                    ),
                };
                Err((Finished::error(out.exit_code(), why), Some(text)))
            }
            Err(why) => Err((Finished::error(None, why), None)),
        }
    }

    async fn check_body(&self, s: &Started, secret: &str) -> (Finished, Option<String>) {
        let check = &s.check;
        let deadline = runner::deadline_after(check.timeout_seconds);
        let (binary, env) = match self.prepare(check, secret) {
            Ok(ready) => ready,
            Err(why) => return (Finished::error(None, why), None),
        };
        if let Some(skipped) = self.skip_if_locked(&s.workspace).await {
            return (skipped, None);
        }
        // Deleted with everything in it (the plaintext plan) when this returns.
        let work = match self.work_dir(s.id) {
            Ok(w) => w,
            Err(why) => return (Finished::error(None, why), None),
        };
        if let Err(failed) = self
            .init_if_needed(check, &binary, &env, deadline, &work)
            .await
        {
            return failed;
        }
        let planfile = work.path().join(format!("check-{}.tfplan", s.id));
        let args = self.plan_args(check, &planfile);
        let out = match self
            .run_child(check, &binary, &args, &env, deadline, &work)
            .await
        {
            Ok(out) => out,
            Err(why) => return (Finished::error(None, why), None),
        };
        let report = plan::read_stream(&out.stdout);
        let (outcome, mut message) = plan::classify_plan(out.ended, &report, &out.stderr);
        message.push_str(&self.clear_child_lock(s, out.ended).await);
        let mut text = plan::render(&report, &out.stderr);
        let mut expires = None;
        if outcome == Outcome::Drifted {
            let show = [
                "show".to_string(),
                "-no-color".into(),
                planfile.display().to_string(),
            ];
            if let Ok(shown) = self
                .run_child(check, &binary, &show, &env, deadline, &work)
                .await
            {
                if shown.ended == Ended::Exited(0) {
                    text = shown.stdout;
                }
            }
            if check.approve_apply {
                match self.keep_plan(s, &planfile).await {
                    Ok(()) => {
                        expires = Some(seconds_after(
                            now_unix(),
                            self.inner.settings.plan_expiry_seconds,
                        ));
                        message.push_str("; plan kept for approval");
                    }
                    Err(why) => message.push_str(&format!("; the plan was not kept: {why}")),
                }
            }
        }
        (
            Finished {
                exit_code: out.exit_code(),
                outcome: Some(outcome),
                message,
                changes: report.changes,
                plan_expires_at: expires,
                output_blob: None,
            },
            Some(text),
        )
    }

    /// A held lock postpones the check without disturbing its holder: the outcome
    /// `skipped_locked` naming the holder (or an error when the lock cannot be read).
    async fn skip_if_locked(&self, workspace: &str) -> Option<Finished> {
        match self.inner.tofu.lock_holder(workspace).await {
            Ok(None) => None,
            Ok(Some(holder)) => {
                let lock = crate::operator::lock_state(&holder, "", 0, i64::MAX);
                Some(Finished {
                    outcome: Some(Outcome::SkippedLocked),
                    message: format!(
                        "the workspace is locked by {:?} ({}, lock {}); nothing was disturbed",
                        lock.who, lock.operation, lock.id
                    ),
                    ..Finished::default()
                })
            }
            Err(e) => Some(Finished::error(None, format!("cannot read the lock: {e}"))),
        }
    }

    /// `plan -detailed-exitcode -lock=true -lock-timeout=… -input=false -json -out=…`
    /// and the check's `-var-file`s.
    fn plan_args(&self, check: &DriftCheck, planfile: &Path) -> Vec<String> {
        let mut args = vec![
            "plan".to_string(),
            "-detailed-exitcode".into(),
            "-lock=true".into(),
            self.lock_timeout(),
            "-input=false".into(),
            "-json".into(),
            format!("-out={}", planfile.display()),
        ];
        args.extend(
            check
                .var_files
                .iter()
                .map(|f| format!("-var-file={}", f.display())),
        );
        args
    }

    /// Seals the saved plan into `plans/<run>.plan` (0600 in a 0700 directory).
    async fn keep_plan(&self, s: &Started, planfile: &Path) -> Result<(), String> {
        let plain = tokio::fs::read(planfile)
            .await
            .map_err(|e| format!("cannot read the plan file: {e}"))?;
        let sealed = self
            .inner
            .root
            .drift_plan_key(&s.workspace)
            .seal(&sealed_ad("plan", &s.workspace, s.id), &plain)
            .map_err(|e| e.to_string())?;
        let plans = self.plans_dir();
        let path = self.plan_path(s.id);
        tokio::task::spawn_blocking(move || {
            create_private_dir(&plans)?;
            write_secret_file(&path, &sealed)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot store the sealed plan: {e}"))
    }

    /// When the child was killed, clears the lock it left (see [`Self::clear_lock_of`]);
    /// the note to append to the run's message, empty when there is nothing to say.
    async fn clear_child_lock(&self, s: &Started, ended: Ended) -> String {
        if !matches!(ended, Ended::TimedOut | Ended::Signalled) {
            return String::new();
        }
        self.clear_lock_of(&s.workspace, s.id)
            .await
            .map(|c| c.note)
            .unwrap_or_default()
    }

    /// Force-clears the workspace lock only if run `run`'s own credential took it
    /// (audited as `tf.lock_forced` by `drift:run-<run>`). Any other lock is left for
    /// an operator and reported ([`LockCleanup::left`]). `None`: no lock is held.
    async fn clear_lock_of(&self, workspace: &str, run: i64) -> Option<LockCleanup> {
        let (holder, credential) = match self.inner.tofu.lock_holder_credential(workspace).await {
            Ok(held) => held?,
            Err(e) => {
                tracing::error!(workspace = %workspace, error = %e, "cannot read the lock a drift run may have left");
                return None;
            }
        };
        let ours = run_credential::name_of_run(run);
        if credential.as_deref() != Some(ours.as_str()) {
            let taker = credential.unwrap_or_else(|| "an unrecorded credential".into());
            tracing::warn!(workspace = %workspace, run, lock_id = %holder.id, taken_by = %taker, "the workspace lock is not this drift run's child's; left alone for an operator");
            return Some(LockCleanup {
                note: format!(
                    "; the workspace lock ({}, taken by {taker}) is not this run's child's and was left alone",
                    holder.id
                ),
                left: Some((holder.id, taker)),
            });
        }
        let note = match self
            .inner
            .tofu
            .force_unlock_taken_by(workspace, &holder.id, &ours)
            .await
        {
            Ok(Some(_)) => {
                tracing::warn!(workspace = %workspace, run, lock_id = %holder.id, "force-cleared the lock a killed drift run left behind (audited as tf.lock_forced)");
                format!(
                    "; the lock it left ({}) was force-cleared (audited as tf.lock_forced)",
                    holder.id
                )
            }
            Ok(None) => return None,
            Err(e) => {
                tracing::error!(workspace = %workspace, error = %e, "cannot clear the lock a killed drift run left behind");
                format!(
                    "; the lock it left ({}) could not be cleared: {e}",
                    holder.id
                )
            }
        };
        Some(LockCleanup { note, left: None })
    }

    /// Approves a drifted check's kept plan: admits an apply run of it, audited as
    /// `drift.apply_approved` by `actor`. Refused for a run that is not a drifted
    /// check, was approved before, kept no plan, or whose plan expired.
    pub async fn approve(&self, check_run: i64, actor: &str) -> Result<Started, ApiError> {
        let run = self.run(check_run).await?;
        let refuse = |why: String| Err(ApiError::Conflict(why));
        if run.kind != Kind::Check || run.outcome != Some(Outcome::Drifted) {
            return refuse(format!(
                "drift run {check_run} is not a drifted check (outcome {}); only a drifted check's plan can be approved",
                run.outcome.map_or("running", Outcome::as_str)
            ));
        }
        if let Some(apply) = run.applied_by {
            return refuse(format!(
                "drift run {check_run} was already approved (apply run {apply}); nothing was done"
            ));
        }
        let Some(expires) = run.plan_expires_at else {
            return refuse(format!(
                "drift run {check_run} kept no plan (approve_apply is off for this check, or keeping it failed)"
            ));
        };
        if expires <= now_unix() || !self.plan_path(check_run).exists() {
            return refuse(format!(
                "the plan of drift run {check_run} has expired; run a new check"
            ));
        }
        let check = self.check_of(&run.workspace)?.clone();
        let (ws, who) = (run.workspace.clone(), actor.to_string());
        let admitted = self
            .inner
            .tofu
            .store()
            .db
            .write(move |c| -> Result<_, ApiError> {
                let started = outcomes::start_run(
                    c,
                    &ws,
                    Kind::Apply,
                    &who,
                    Some(check_run),
                    run.serial,
                    run.lineage.as_deref(),
                );
                let id = match started {
                    Ok(Ok(id)) => id,
                    Ok(Err(outcomes::StartRefused::Busy(other))) => {
                        return Err(ApiError::Conflict(format!(
                            "drift run {other} of workspace {ws:?} is still going; nothing was approved"
                        )))
                    }
                    Err(rusqlite::Error::SqliteFailure(e, _))
                        if e.code == rusqlite::ErrorCode::ConstraintViolation =>
                    {
                        return Err(ApiError::Conflict(format!(
                            "drift run {check_run} was already approved; nothing was done"
                        )))
                    }
                    Err(e) => return Err(DbError::from(e).into()),
                };
                insert_audit(
                    c,
                    &AuditEntry {
                        actor: who.clone(),
                        org: None,
                        scope: crate::tofu::scope(&ws),
                        event: EVENT_APPLY_APPROVED,
                        payload: serde_json::json!({ "check_run": check_run, "apply_run": id }),
                    },
                )
                .map_err(DbError::from)?;
                Ok(id)
            })
            .await?;
        Ok(Started {
            id: admitted,
            workspace: run.workspace,
            kind: Kind::Apply,
            applies: Some(check_run),
            check,
        })
    }

    async fn apply_body(&self, s: &Started, secret: &str) -> (Finished, Option<String>) {
        let check_run = s.applies.unwrap_or_default();
        let kept = self.plan_path(check_run);
        let result = self.apply_kept(s, &kept, secret).await;
        // Used or not, an approved plan is never applied twice: delete it.
        if let Err(e) = tokio::fs::remove_file(&kept).await {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %kept.display(), error = %e, "cannot delete a used drift plan");
            }
        }
        result
    }

    async fn apply_kept(
        &self,
        s: &Started,
        kept: &Path,
        secret: &str,
    ) -> (Finished, Option<String>) {
        let fail = |why: String| (Finished::apply_failed(None, why), None);
        let check = &s.check;
        let deadline = runner::deadline_after(check.timeout_seconds);
        let (binary, env) = match self.prepare(check, secret) {
            Ok(ready) => ready,
            Err(why) => return fail(why),
        };
        let check_run = s.applies.unwrap_or_default();
        let plain = match tokio::fs::read(kept).await {
            Ok(sealed) => match self
                .inner
                .root
                .drift_plan_key(&s.workspace)
                .open(&sealed_ad("plan", &s.workspace, check_run), &sealed)
            {
                Ok(plain) => plain,
                Err(e) => return fail(format!("the kept plan cannot be decrypted: {e}")),
            },
            Err(e) => return fail(format!("the kept plan cannot be read: {e}")),
        };
        // Deleted with the plaintext plan in it when this returns, however it ends.
        let work = match self.work_dir(s.id) {
            Ok(w) => w,
            Err(why) => return fail(why),
        };
        let planfile = work.path().join(format!("apply-{}.tfplan", s.id));
        let written = {
            let path = planfile.clone();
            tokio::task::spawn_blocking(move || write_secret_file(&path, &plain)).await
        };
        if !matches!(written, Ok(Ok(()))) {
            return fail("cannot write the plan for the apply".into());
        }
        if let Err(failed) = self
            .init_if_needed(check, &binary, &env, deadline, &work)
            .await
        {
            return failed;
        }
        let args = vec![
            "apply".to_string(),
            "-input=false".into(),
            "-no-color".into(),
            self.lock_timeout(),
            planfile.display().to_string(),
        ];
        let out = match self
            .run_child(check, &binary, &args, &env, deadline, &work)
            .await
        {
            Ok(out) => out,
            Err(why) => return fail(why),
        };
        let text = format!("{}\n{}", out.stdout, out.stderr);
        let (outcome, mut message) = plan::classify_apply(out.ended, &text);
        message.push_str(&self.clear_child_lock(s, out.ended).await);
        (
            Finished {
                exit_code: out.exit_code(),
                outcome: Some(outcome),
                message,
                ..Finished::default()
            },
            Some(text),
        )
    }

    /// Seals `text` into the blob store; returns its key.
    async fn store_output(&self, s: &Started, text: String) -> Result<String, String> {
        let sealed = self
            .inner
            .root
            .drift_output_key(&s.workspace)
            .seal(
                &sealed_ad("output", &s.workspace, s.id),
                bounded(text).as_bytes(),
            )
            .map_err(|e| e.to_string())?;
        let key = format!(
            "{OUTPUT_PREFIX}{}-{}.out",
            s.id,
            uuid::Uuid::new_v4().simple()
        );
        self.inner
            .tofu
            .store()
            .blobs()
            .put(&key, Bytes::from(sealed))
            .await
            .map_err(|e| e.to_string())?;
        Ok(key)
    }

    /// Records how a run ended; for a check whose outcome changed, sends the event.
    async fn finish(
        &self,
        s: &Started,
        mut done: Finished,
        output: Option<String>,
    ) -> Result<Run, ApiError> {
        if let Some(text) = output {
            match self.store_output(s, text).await {
                Ok(key) => done.output_blob = Some(key),
                Err(e) => {
                    tracing::warn!(run = s.id, error = %e, "cannot store a drift run's output");
                    done.message.push_str("; its output could not be stored");
                }
            }
        }
        let (id, kind, ws, applies) = (s.id, s.kind, s.workspace.clone(), s.applies);
        let recorded = done.clone();
        let (run, previous) = self
            .inner
            .tofu
            .store()
            .db
            .write(move |c| -> Result<_, DbError> {
                outcomes::finish_run(c, id, &recorded)?;
                // The child is gone: its credential ends with the run.
                run_credential::revoke(c, &run_credential::name_of_run(id))?;
                if kind == Kind::Apply {
                    insert_audit(
                        c,
                        &AuditEntry {
                            actor: format!("drift:run-{id}"),
                            org: None,
                            scope: crate::tofu::scope(&ws),
                            event: EVENT_APPLIED,
                            payload: serde_json::json!({
                                "apply_run": id,
                                "check_run": applies,
                                "outcome": recorded.outcome.map(Outcome::as_str),
                            }),
                        },
                    )?;
                }
                let previous = outcomes::previous_status(c, &ws, id)?;
                let run = outcomes::get_run(c, id)?;
                Ok((run, previous))
            })
            .await?;
        self.inner.finished_runs.fetch_add(1, Ordering::Relaxed);
        let run = run.ok_or_else(|| internal("a drift run vanished", id))?;
        let outcome = run.outcome.map_or("-", Outcome::as_str);
        tracing::info!(
            workspace = %run.workspace,
            run = run.id,
            kind = ?run.kind,
            outcome,
            message = run.message.as_deref().unwrap_or(""),
            "drift run finished"
        );
        if let Some(new) = run.outcome.filter(|_| run.kind == Kind::Check) {
            if plan::should_notify(previous, new) {
                self.notify(&run, previous);
            }
        }
        Ok(Self::with_approvable(run, now_unix()))
    }

    /// Logs an outcome change and posts it to the webhooks on a spawned task.
    fn notify(&self, run: &Run, previous: Option<Outcome>) {
        tracing::warn!(
            workspace = %run.workspace,
            run = run.id,
            previous = previous.map_or("none", Outcome::as_str),
            outcome = run.outcome.map_or("-", Outcome::as_str),
            "drift outcome changed"
        );
        if self.inner.notifier.is_empty() {
            return;
        }
        let delivery = self.inner.notifier.send(event_json(run, previous));
        let mut pending = self.inner.pending.lock().unwrap_or_else(|p| p.into_inner());
        // Finished deliveries are kept for `flush_webhooks` to report, up to a bound
        // (a server never flushes).
        if pending.len() >= MAX_PENDING {
            pending.retain(|d| !d.is_finished());
        }
        pending.push(delivery);
    }

    /// Waits until every event sent so far was delivered or given up on (the CLI
    /// calls it before exiting; the server never waits).
    pub async fn flush_webhooks(&self) -> Vec<webhook::Delivery> {
        let pending: Vec<_> =
            std::mem::take(&mut *self.inner.pending.lock().unwrap_or_else(|p| p.into_inner()));
        let mut out = Vec::new();
        for delivery in pending {
            out.extend(delivery.await.unwrap_or_default());
        }
        out
    }

    /// The status a workspace had before run `id` (for the CLI's report).
    pub async fn previous_status(
        &self,
        workspace: &str,
        id: i64,
    ) -> Result<Option<Outcome>, ApiError> {
        let ws = workspace.to_string();
        self.read(move |c| outcomes::previous_status(c, &ws, id))
            .await
    }

    /// Per configured workspace: drift status (0/1/2) and when it was found (Unix).
    pub async fn metric_rows(&self) -> Result<Vec<(String, i64, i64)>, ApiError> {
        let latest = self.read(outcomes::latest_status).await?;
        Ok(latest
            .into_iter()
            .filter(|(ws, _, _)| self.inner.checks.contains_key(ws))
            .filter_map(|(ws, outcome, at)| Some((ws, outcome.status_value()?, unix_of(&at)?)))
            .collect())
    }

    /// Closes runs a stopped process left unfinished, deletes kept plans that expired,
    /// were used, or belong to no run, and deletes output blobs past retention or of
    /// no run (at most [`MAX_TIDY_DELETIONS`] of them per pass).
    pub async fn tidy(&self) -> Result<(), ApiError> {
        self.sweep_work().await;
        self.close_abandoned().await?;
        self.tidy_plans().await?;
        self.sweep_outputs().await
    }

    /// The scheduler's tidy, each tick: [`DriftService::tidy`], but the outputs sweep
    /// (a LIST of the blob store's `drift/`) only when [`outputs_sweep_due`].
    pub async fn tidy_when_due(&self) -> Result<(), ApiError> {
        self.sweep_work().await;
        self.close_abandoned().await?;
        self.tidy_plans().await?;
        let last = *self
            .inner
            .last_sweep
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let finished = self.inner.finished_runs.load(Ordering::Relaxed);
        if outputs_sweep_due(last, finished, Instant::now()) {
            self.sweep_outputs().await?;
        }
        Ok(())
    }

    /// [`DriftService::tidy_outputs`], remembering it was done. A failed sweep counts
    /// too: it is retried when the next one is due, not every tick.
    async fn sweep_outputs(&self) -> Result<(), ApiError> {
        // Read before the LIST: a run finishing during the sweep asks for another.
        let finished_runs = self.inner.finished_runs.load(Ordering::Relaxed);
        let result = self.tidy_outputs().await;
        let mark = SweepMark {
            at: Instant::now(),
            finished_runs,
            more: matches!(result, Ok(true)),
        };
        *self
            .inner
            .last_sweep
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(mark);
        result.map(|_| ())
    }

    /// Deletes the plaintext work files of runs no live process holds ([`work::sweep`]).
    async fn sweep_work(&self) {
        let root = self.work_root();
        let _ = tokio::task::spawn_blocking(move || work::sweep(&root)).await;
    }

    /// Closes runs a stopped process left unfinished (and clears the lock its child
    /// may have left).
    async fn close_abandoned(&self) -> Result<(), ApiError> {
        let now = now_unix();
        let unfinished = self.read(outcomes::unfinished).await?;
        for run in unfinished {
            let (id, ws) = (run.id, run.workspace.clone());
            let timeout = self
                .inner
                .checks
                .get(&ws)
                .map_or(3600, |c| c.timeout_seconds);
            let Some(started) = unix_of(&run.started_at) else {
                continue;
            };
            if now > seconds_after(seconds_after(started, timeout), ABANDONED_AFTER) {
                // The process died with its child: a lock that child took is left.
                let cleanup = self.clear_lock_of(&ws, id).await;
                let note = cleanup.as_ref().map_or("", |c| c.note.as_str());
                let mut done = Finished::error(
                    None,
                    format!("abandoned: the process running it stopped before it finished{note}"),
                );
                if run.kind == Kind::Apply {
                    done.outcome = Some(Outcome::ApplyFailed);
                }
                let left = cleanup.and_then(|c| c.left);
                let workspace = ws.clone();
                let closed = self
                    .inner
                    .tofu
                    .store()
                    .db
                    .write(move |c| -> Result<(), DbError> {
                        outcomes::finish_run(c, id, &done)?;
                        run_credential::revoke(c, &run_credential::name_of_run(id))?;
                        if let Some((lock_id, taken_by)) = left {
                            insert_audit(
                                c,
                                &AuditEntry {
                                    actor: run_credential::name_of_run(id),
                                    org: None,
                                    scope: crate::tofu::scope(&workspace),
                                    event: EVENT_LOCK_LEFT,
                                    payload: serde_json::json!({
                                        "run": id,
                                        "lock_id": lock_id,
                                        "taken_by": taken_by,
                                    }),
                                },
                            )?;
                        }
                        Ok(())
                    })
                    .await;
                if closed.is_ok() {
                    self.inner.finished_runs.fetch_add(1, Ordering::Relaxed);
                }
                tracing::warn!(workspace = %ws, run = id, closed = ?closed.is_ok(), "closed an abandoned drift run");
            }
        }
        Ok(())
    }

    /// Deletes kept plans that expired, were used, or belong to no run.
    async fn tidy_plans(&self) -> Result<(), ApiError> {
        let now = now_unix();
        let Ok(entries) = std::fs::read_dir(self.plans_dir()) else {
            return Ok(());
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name
                .strip_suffix(".plan")
                .and_then(|n| n.parse::<i64>().ok())
            else {
                continue;
            };
            let run = self.read(move |c| outcomes::get_run(c, id)).await?;
            let keep = run.is_some_and(|r| {
                r.applied_by.is_none() && r.plan_expires_at.is_some_and(|t| t > now)
            });
            if !keep {
                match std::fs::remove_file(entry.path()) {
                    Ok(()) => tracing::info!(run = id, "deleted an expired or used drift plan"),
                    Err(e) => tracing::warn!(run = id, error = %e, "cannot delete a drift plan"),
                }
            }
        }
        Ok(())
    }

    /// Deletes the output blobs of runs past retention (all but the newest
    /// `keep_outputs` runs per workspace) and orphans (a crash between storing an output
    /// and recording it), oldest run first, at most [`MAX_TIDY_DELETIONS`]; `true` when
    /// it stopped at that bound. Only keys of the output form under [`OUTPUT_PREFIX`]
    /// are looked at. A retired output's run is recorded as pruned (durably) before its
    /// blob is deleted; an orphan is no run's output, so it needs no record.
    async fn tidy_outputs(&self) -> Result<bool, ApiError> {
        let keep = self.inner.settings.keep_outputs;
        let blobs = self.inner.tofu.store().blobs().clone();
        let listed = blobs
            .list(OUTPUT_PREFIX)
            .await
            .map_err(|e| internal("cannot list drift outputs in the store", e))?;
        let mut outputs: Vec<(i64, String)> = listed
            .into_iter()
            .filter_map(|key| Some((output_run(&key)?, key)))
            .collect();
        outputs.sort();
        let (mut retired, mut orphans) = (0usize, 0usize);
        for batch in outputs.chunks(TIDY_BATCH) {
            let budget = MAX_TIDY_DELETIONS - (retired + orphans);
            if budget == 0 {
                break;
            }
            let ids: Vec<i64> = batch.iter().map(|(id, _)| *id).collect();
            let runs = self
                .read(move |c| {
                    ids.into_iter()
                        .map(|id| {
                            let Some(run) = outcomes::get_run(c, id)? else {
                                return Ok(None);
                            };
                            let newer = outcomes::newer_runs(c, &run.workspace, id, keep)?;
                            Ok(Some((run, newer)))
                        })
                        .collect::<Result<Vec<_>, rusqlite::Error>>()
                })
                .await?;
            let now = now_unix();
            let doomed: Vec<(i64, &str, Sweep)> = batch
                .iter()
                .zip(runs)
                .filter_map(|((id, key), standing)| {
                    let standing =
                        standing.map(|(run, newer)| (Self::with_approvable(run, now), newer));
                    match sweep(key, standing.as_ref().map(|(r, n)| (r, *n)), keep) {
                        Sweep::Keep => None,
                        verdict => Some((*id, key.as_str(), verdict)),
                    }
                })
                .take(budget)
                .collect();
            let pruning: Vec<i64> = doomed
                .iter()
                .filter(|(_, _, verdict)| *verdict == Sweep::Retired)
                .map(|(id, _, _)| *id)
                .collect();
            if !pruning.is_empty() {
                self.inner
                    .tofu
                    .store()
                    .db
                    .write(move |c| {
                        outcomes::record_pruned(c, &pruning, keep).map_err(DbError::from)
                    })
                    .await?;
            }
            for (_, key, verdict) in doomed {
                blobs
                    .delete(key)
                    .await
                    .map_err(|e| internal("cannot delete a drift output from the store", e))?;
                if verdict == Sweep::Retired {
                    retired += 1;
                } else {
                    orphans += 1;
                }
            }
        }
        if retired + orphans > 0 {
            tracing::info!(
                retired,
                orphans,
                keep_outputs = keep,
                "deleted drift outputs past retention or of no run"
            );
        }
        Ok(retired + orphans >= MAX_TIDY_DELETIONS)
    }

    /// The scheduler: runs each check with an interval when it is due (counted from
    /// its last check's start), until `shutdown` changes.
    pub async fn schedule(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            if let Err(e) = self.tidy_when_due().await {
                tracing::warn!(error = %e, "cannot tidy drift runs");
            }
            let now = now_unix();
            let mut next = MAX_TICK.as_secs() as i64;
            for check in self
                .inner
                .checks
                .values()
                .filter(|c| c.interval_seconds > 0)
            {
                let ws = check.workspace.clone();
                let last = match self
                    .read(move |c| outcomes::last_check_started(c, &ws))
                    .await
                {
                    Ok(last) => last.as_deref().and_then(unix_of),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the drift schedule");
                        continue;
                    }
                };
                let due_in = due_in(last, check.interval_seconds, now);
                if due_in > 0 {
                    next = next.min(due_in);
                    continue;
                }
                next = next.min(i64::try_from(check.interval_seconds).unwrap_or(i64::MAX));
                match self.start_check(&check.workspace, "schedule").await {
                    Ok(started) => {
                        self.spawn(started);
                    }
                    Err(e) => {
                        tracing::info!(workspace = %check.workspace, error = %e, "scheduled drift check not started")
                    }
                }
            }
            let wait = Duration::from_secs(next.clamp(1, MAX_TICK.as_secs() as i64) as u64);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    pub fn has_checks(&self) -> bool {
        !self.inner.checks.is_empty()
    }
}

/// Seconds until a check with `interval` is due, given when its last check started
/// (never: due now). Zero or less: due.
pub fn due_in(last_started: Option<i64>, interval: u64, now: i64) -> i64 {
    let interval = i64::try_from(interval).unwrap_or(i64::MAX);
    last_started.map_or(0, |t| t.saturating_add(interval).saturating_sub(now))
}

/// Whether the scheduler sweeps outputs now, given the last sweep (`None`: none yet)
/// and how many runs this process has finished: at startup, when the last sweep
/// stopped at its bound, when a run finished since (a newer run can retire an older
/// one's text, an apply ends a kept plan's claim), or [`OUTPUTS_SWEEP_EVERY`] after the
/// last one. Otherwise nothing it can see changed, and a sweep would find nothing.
fn outputs_sweep_due(last: Option<SweepMark>, finished_runs: u64, now: Instant) -> bool {
    last.is_none_or(|l| {
        l.more
            || l.finished_runs != finished_runs
            || now.saturating_duration_since(l.at) >= OUTPUTS_SWEEP_EVERY
    })
}

/// The run an output key names (`drift/<run id>-<uuid hex>.out`); `None` for any other
/// key, which the tidy pass leaves alone.
fn output_run(key: &str) -> Option<i64> {
    let rest = key.strip_prefix(OUTPUT_PREFIX)?.strip_suffix(".out")?;
    let (id, tag) = rest.split_once('-')?;
    let all = |s: &str, ok: fn(&u8) -> bool| !s.is_empty() && s.bytes().all(|b| ok(&b));
    if !all(id, u8::is_ascii_digit) || !all(tag, u8::is_ascii_hexdigit) {
        return None;
    }
    id.parse().ok()
}

/// Whether a run's stored output is past retention: at least `keep` newer runs of its
/// workspace exist, and it is not a kept plan that may still be approved (whoever
/// approves reads the text first).
fn output_retired(newer_runs: u64, keep: u64, approvable: bool) -> bool {
    !approvable && newer_runs >= keep
}

/// What the tidy pass does with an output blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sweep {
    Keep,
    /// Its run's output, past retention.
    Retired,
    /// Not its run's output, and its run is finished: it can never be recorded.
    Orphan,
}

/// The verdict on output blob `key`, given the run its key names with the number of
/// newer runs in its workspace (`None`: this index has no such run).
fn sweep(key: &str, run: Option<(&Run, u64)>, keep: u64) -> Sweep {
    match run {
        // Not this index's run (another index over the same store, or one rebuilt
        // without its drift history): nothing here can tell it is garbage.
        None => Sweep::Keep,
        Some((run, newer)) if run.output_blob.as_deref() == Some(key) => {
            if output_retired(newer, keep, run.approvable) {
                Sweep::Retired
            } else {
                Sweep::Keep
            }
        }
        // A finished row never changes, so it will never name this key.
        Some((run, _)) if run.finished_at.is_some() => Sweep::Orphan,
        // Its run is still going: the key is recorded when it finishes.
        Some(_) => Sweep::Keep,
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
    fn checks_are_due_an_interval_after_the_last_start() {
        let table: &[(Option<i64>, u64, i64, i64)] = &[
            (None, 60, 1000, 0),
            (Some(1000), 60, 1000, 60),
            (Some(1000), 60, 1059, 1),
            (Some(1000), 60, 1060, 0),
            (Some(1000), 60, 5000, -3940),
            (Some(1000), u64::MAX, 1000, i64::MAX - 1000),
        ];
        for (last, interval, now, want) in table {
            assert_eq!(
                due_in(*last, *interval, *now),
                *want,
                "{last:?} {interval} {now}"
            );
        }
    }

    #[test]
    fn only_keys_of_the_output_form_name_a_run() {
        let table: &[(&str, Option<i64>)] = &[
            ("drift/12-0123abcdef.out", Some(12)),
            ("drift/1-f.out", Some(1)),
            ("drift/12-0123abcdef", None),
            ("drift/12.out", None),
            ("drift/-abc.out", None),
            ("drift/+12-abc.out", None),
            ("drift/12-xyz.out", None),
            ("drift/12-.out", None),
            ("drift/plans/12-abc.out", None),
            ("states/12-abc.out", None),
            ("drift/99999999999999999999-abc.out", None),
        ];
        for (key, want) in table {
            assert_eq!(output_run(key), *want, "{key}");
        }
    }

    fn run_of(output_blob: Option<&str>, finished: bool, approvable: bool) -> Run {
        Run {
            id: 12,
            workspace: "prod".into(),
            kind: Kind::Check,
            trigger: "schedule".into(),
            applies: None,
            started_at: "t".into(),
            finished_at: finished.then(|| "t".into()),
            exit_code: None,
            outcome: None,
            message: None,
            changes: None,
            serial: None,
            lineage: None,
            output_blob: output_blob.map(Into::into),
            plan_expires_at: None,
            applied_by: None,
            approvable,
            state_moved: false,
        }
    }

    #[test]
    fn outputs_past_retention_and_orphans_of_finished_runs_are_swept() {
        let key = "drift/12-abc.out";
        let other = "drift/12-def.out";
        /// The run's recorded output, finished, approvable, newer runs, keep, verdict.
        type Case<'a> = (Option<&'a str>, bool, bool, u64, u64, Sweep);
        let table: &[Case] = &[
            (Some(key), true, false, 2, 3, Sweep::Keep),
            (Some(key), true, false, 3, 3, Sweep::Retired),
            (Some(key), true, false, 50, 3, Sweep::Retired),
            (Some(key), true, true, 50, 3, Sweep::Keep),
            (Some(key), true, false, 0, 1, Sweep::Keep),
            (Some(other), true, false, 0, 3, Sweep::Orphan),
            (None, true, false, 0, 3, Sweep::Orphan),
            (None, false, false, 50, 3, Sweep::Keep),
        ];
        for (recorded, finished, approvable, newer, keep, want) in table {
            let run = run_of(*recorded, *finished, *approvable);
            assert_eq!(
                sweep(key, Some((&run, *newer)), *keep),
                *want,
                "{recorded:?} finished={finished} approvable={approvable} newer={newer} keep={keep}"
            );
        }
        assert_eq!(
            sweep(key, None, 1),
            Sweep::Keep,
            "a run this index does not know"
        );
    }

    #[test]
    fn outputs_are_swept_at_startup_after_runs_after_a_bounded_pass_and_every_interval() {
        let at = Instant::now();
        let mark = |finished_runs, more| {
            Some(SweepMark {
                at,
                finished_runs,
                more,
            })
        };
        let (soon, late) = (at + MAX_TICK, at + OUTPUTS_SWEEP_EVERY);
        let table: &[(Option<SweepMark>, u64, Instant, bool)] = &[
            (None, 0, at, true),
            (None, 7, soon, true),
            (mark(3, false), 3, at, false),
            (mark(3, false), 3, soon, false),
            (mark(3, false), 3, late - Duration::from_secs(1), false),
            (mark(3, false), 3, late, true),
            (mark(3, false), 4, soon, true),
            (mark(3, true), 3, soon, true),
            (mark(3, false), 3, at - Duration::from_secs(5), false),
        ];
        for (i, (last, finished, now, want)) in table.iter().enumerate() {
            assert_eq!(
                outputs_sweep_due(*last, *finished, *now),
                *want,
                "case {i}: {last:?} finished={finished}"
            );
        }
    }

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
