//! Executing an admitted run: the run's credential, the sandboxed child (`init`,
//! `plan`, `show`), keeping a drifted plan sealed in the blob store (`kept`), clearing
//! exactly the lock a killed child took, storing the output and recording how the run
//! ended (with its event).

use super::*;

impl DriftService {
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

    /// Admits a check of `workspace` now (409 while another run of it is unfinished).
    pub async fn start_check(&self, workspace: &str, trigger: &str) -> Result<Started, Error> {
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
            .map_err(Error::from)?
            .map_err(|outcomes::StartRefused::Busy(running)| {
                Error::Conflict(format!(
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
    pub async fn check_now(&self, workspace: &str, trigger: &str) -> Result<Run, Error> {
        let started = self.start_check(workspace, trigger).await?;
        self.execute(started).await
    }

    /// Executes an admitted run (check or apply) within the concurrency limit and
    /// records how it ended. Everything that goes wrong becomes the run's outcome.
    pub async fn execute(&self, started: Started) -> Result<Run, Error> {
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
    pub(super) fn prepare(
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
        // Who the child is first (`run_as`): the check's own `env` may still say otherwise.
        let mut extra: Vec<(String, String)> = self.inner.sandbox.identity_env();
        extra.extend(
            crate::tofu::client_vars(
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
            }),
        );
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

    pub(super) fn lock_timeout(&self) -> String {
        format!(
            "-lock-timeout={}s",
            self.inner.settings.lock_timeout_seconds
        )
    }

    pub(super) fn work_root(&self) -> PathBuf {
        self.inner.dir.join("work")
    }

    /// Run `run`'s plaintext work directory, deleted when the returned value drops.
    pub(super) fn work_dir(&self, run: i64) -> Result<work::WorkDir, String> {
        let root = self.work_root();
        let work = work::WorkDir::create(&root, run)
            .map_err(|e| format!("cannot create a work directory in {}: {e}", root.display()))?;
        self.inner.sandbox.hand_over(work.path()).map_err(|e| {
            format!(
                "cannot give the work directory {} to the user children run as: {e}",
                work.path().display()
            )
        })?;
        Ok(work)
    }

    /// Runs the check's binary with `args` in its `dir`, in the sandbox (with `work`
    /// writable too), until `deadline`.
    pub(super) async fn run_child(
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
        let launch =
            self.inner
                .sandbox
                .wrap(binary, args, &check.dir, Some(work.path()), &readable)?;
        runner::run(
            &launch.program,
            &launch.args,
            &check.dir,
            env,
            launch.user,
            deadline,
        )
        .await
        .map_err(|e| format!("cannot start {}: {e}", launch.program.display()))
    }

    /// `init` when the directory was never initialised.
    pub(super) async fn init_if_needed(
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
        if let Some(skipped) = self.skip_if_frozen(&s.workspace).await {
            return (skipped, None);
        }
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
                // The child's own `-lock-timeout` says only that the lock was held, not
                // by whom (`skip_if_locked` records the holder it reads).
                locked_by: None,
            },
            Some(text),
        )
    }

    /// A freeze postpones the check: the outcome `skipped_frozen` naming who froze the
    /// workspace and why (nothing is run, no lock is asked for).
    async fn skip_if_frozen(&self, workspace: &str) -> Option<Finished> {
        match self.inner.tofu.freeze_of(workspace).await {
            Ok(None) => None,
            Ok(Some(f)) => Some(Finished {
                outcome: Some(Outcome::SkippedFrozen),
                message: format!(
                    "the workspace is frozen by {} ({}): {}; nothing was run",
                    f.frozen_by,
                    f.until_text(),
                    f.reason
                ),
                ..Finished::default()
            }),
            Err(e) => Some(Finished::error(
                None,
                format!("cannot read the freeze: {e}"),
            )),
        }
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
                    // Recorded as a field too: pages show the holder from it, never
                    // by reading the message back.
                    locked_by: Some(lock.who.trim().to_string()).filter(|w| !w.is_empty()),
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

    /// When the child was killed, clears the lock it left (see [`Self::clear_lock_of`]);
    /// the note to append to the run's message, empty when there is nothing to say.
    pub(super) async fn clear_child_lock(&self, s: &Started, ended: Ended) -> String {
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
    pub(super) async fn clear_lock_of(&self, workspace: &str, run: i64) -> Option<LockCleanup> {
        let ours = run_credential::name_of_run(run);
        // Its own lock first: a plan lock may be shared with others' plans.
        let held = match self.inner.tofu.lock_taken_by(workspace, &ours).await {
            Ok(Some(own)) => Ok(Some((own, Some(ours.clone())))),
            Ok(None) => self.inner.tofu.lock_holder_credential(workspace).await,
            Err(e) => Err(e),
        };
        let (holder, credential) = match held {
            Ok(held) => held?,
            Err(e) => {
                tracing::error!(workspace = %workspace, error = %e, "cannot read the lock a drift run may have left");
                return None;
            }
        };
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
    ) -> Result<Run, Error> {
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
            .db
            .write(move |c| -> Result<_, DbError> {
                outcomes::finish_run(c, id, &recorded)?;
                // The child is gone: its credential ends with the run.
                run_credential::revoke(c, &run_credential::name_of_run(id))?;
                if kind == Kind::Apply {
                    insert_audit(
                        c,
                        &AuditEntry::new(
                            format!("drift:run-{id}"),
                            crate::tofu::scope(&ws),
                            EVENT_APPLIED,
                            serde_json::json!({
                                "apply_run": id,
                                "check_run": applies,
                                "outcome": recorded.outcome.map(Outcome::as_str),
                            }),
                        ),
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
}
