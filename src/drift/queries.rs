//! What the drift surface reads: configured checks with their status, runs, a run's
//! output (sealed text, `Absent`, or `Pruned` as retention recorded it), metrics rows.

use super::*;

impl DriftService {
    /// Every configured check with its latest status.
    pub async fn checks(&self) -> Result<Vec<CheckSummary>, Error> {
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

    /// Whether `run`'s kept plan may be approved now.
    fn approvable(run: &Run, now: i64) -> bool {
        run.kind == Kind::Check
            && run.outcome == Some(Outcome::Drifted)
            && run.applied_by.is_none()
            && run.plan_expires_at.is_some_and(|t| t > now)
    }

    pub(super) fn with_approvable(mut run: Run, now: i64) -> Run {
        run.approvable = Self::approvable(&run, now);
        run
    }

    /// The newest runs (of one workspace, or all), newest first.
    pub async fn runs(&self, workspace: Option<String>, limit: u32) -> Result<Vec<Run>, Error> {
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
    pub async fn run(&self, id: i64) -> Result<Run, Error> {
        let row = self.read(move |c| outcomes::get_run(c, id)).await?;
        let row = row.ok_or_else(|| Error::NotFound(format!("no drift run {id}")))?;
        Ok(Self::with_approvable(row, now_unix()))
    }

    /// A run and its human output. A stored output that cannot be read is an error,
    /// never "no output"; one that is gone because retention deleted it (the tidy pass
    /// recorded so before deleting it) is [`RunOutput::Pruned`], and one gone without
    /// that record is an error too, whatever `keep_outputs` says now.
    pub async fn show(&self, id: i64) -> Result<(Run, RunOutput), Error> {
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

    /// The status a workspace had before run `id` (for the CLI's report).
    pub async fn previous_status(
        &self,
        workspace: &str,
        id: i64,
    ) -> Result<Option<Outcome>, Error> {
        let ws = workspace.to_string();
        self.read(move |c| outcomes::previous_status(c, &ws, id))
            .await
    }

    /// Per configured workspace: drift status (0/1/2) and when it was found (Unix).
    pub async fn metric_rows(&self) -> Result<Vec<(String, i64, i64)>, Error> {
        let latest = self.read(outcomes::latest_status).await?;
        Ok(latest
            .into_iter()
            .filter(|(ws, _, _)| self.inner.checks.contains_key(ws))
            .filter_map(|(ws, outcome, at)| Some((ws, outcome.status_value()?, unix_of(&at)?)))
            .collect())
    }
}
