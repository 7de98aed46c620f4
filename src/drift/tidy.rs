//! The tidy pass: plaintext work files no live run holds, runs a stopped process left
//! (and the lock only their own child took), expired or used kept plans in the blob
//! store (and files of them an earlier release left, moved into the store), and output
//! blobs past retention or of no run.
//!
//! Kept plans (`drift/plans/`) and outputs (`drift/<run>-<tag>.out`) are swept from
//! one LIST of the store's `drift/`, when [`outputs_sweep_due`]; an expired plan
//! lingering a few minutes is harmless, as approval checks the expiry in the index.

use super::*;

impl DriftService {
    /// Closes runs a stopped process left unfinished, deletes kept plans that expired
    /// or were used, and deletes output blobs past retention or of no run (at most
    /// [`MAX_TIDY_DELETIONS`] of them per pass).
    pub async fn tidy(&self) -> Result<(), Error> {
        self.sweep_work().await;
        self.adopt_plan_files().await;
        self.close_abandoned().await?;
        self.sweep_outputs().await
    }

    /// The scheduler's tidy, each tick: [`DriftService::tidy`], but the store sweep
    /// (a LIST of the blob store's `drift/`) only when [`outputs_sweep_due`].
    pub async fn tidy_when_due(&self) -> Result<(), Error> {
        self.sweep_work().await;
        self.adopt_plan_files().await;
        self.close_abandoned().await?;
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

    /// [`DriftService::sweep_store`], remembering it was done. A failed sweep counts
    /// too: it is retried when the next one is due, not every tick.
    async fn sweep_outputs(&self) -> Result<(), Error> {
        // Read before the LIST: a run finishing during the sweep asks for another.
        let finished_runs = self.inner.finished_runs.load(Ordering::Relaxed);
        let result = self.sweep_store().await;
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

    /// One LIST of the store's `drift/`: [`DriftService::tidy_plans`] on the kept
    /// plans in it, [`DriftService::tidy_outputs`] on the outputs; `true` when either
    /// stopped at its bound.
    async fn sweep_store(&self) -> Result<bool, Error> {
        let listed = self.list_objects(OUTPUT_PREFIX).await?;
        let plans_more = self.tidy_plans(kept::kept_plans_in(&listed)).await?;
        let outputs_more = self.tidy_outputs(listed).await?;
        Ok(plans_more || outputs_more)
    }

    /// Deletes the plaintext work files of runs no live process holds ([`work::sweep`]).
    async fn sweep_work(&self) {
        let root = self.work_root();
        let _ = tokio::task::spawn_blocking(move || work::sweep(&root)).await;
    }

    /// Closes runs a stopped process left unfinished (and clears the lock its child
    /// may have left).
    async fn close_abandoned(&self) -> Result<(), Error> {
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
                    .db
                    .write(move |c| -> Result<(), DbError> {
                        outcomes::finish_run(c, id, &done)?;
                        run_credential::revoke(c, &run_credential::name_of_run(id))?;
                        if let Some((lock_id, taken_by)) = left {
                            insert_audit(
                                c,
                                &AuditEntry::new(
                                    run_credential::name_of_run(id),
                                    crate::tofu::scope(&workspace),
                                    EVENT_LOCK_LEFT,
                                    serde_json::json!({
                                        "run": id,
                                        "lock_id": lock_id,
                                        "taken_by": taken_by,
                                    }),
                                ),
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

    /// Deletes the kept plans in the store that are no longer wanted
    /// ([`plan_kept`]: used, or expired unapproved), oldest run first, at most
    /// [`MAX_TIDY_DELETIONS`]; `true` when it stopped at that bound. A plan of a run
    /// this index does not know is left alone, as outputs are.
    async fn tidy_plans(&self, plans: Vec<(i64, String)>) -> Result<bool, Error> {
        let mut deleted = 0usize;
        for (run, _) in plans {
            if deleted >= MAX_TIDY_DELETIONS {
                return Ok(true);
            }
            if self.plan_wanted(run).await? == Some(false) {
                self.delete_kept_plan(run).await?;
                tracing::info!(run, "deleted an expired or used drift plan");
                deleted += 1;
            }
        }
        Ok(false)
    }

    /// Deletes the output blobs of runs past retention (all but the newest
    /// `keep_outputs` runs per workspace) and orphans (a crash between storing an output
    /// and recording it), oldest run first, at most [`MAX_TIDY_DELETIONS`]; `true` when
    /// it stopped at that bound. Only keys of the output form under [`OUTPUT_PREFIX`]
    /// are looked at. A retired output's run is recorded as pruned (durably) before its
    /// blob is deleted; an orphan is no run's output, so it needs no record. `listed`:
    /// the keys under [`OUTPUT_PREFIX`].
    async fn tidy_outputs(&self, listed: Vec<String>) -> Result<bool, Error> {
        let keep = self.inner.settings.keep_outputs;
        let blobs = self.inner.tofu.store().blobs().clone();
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
                    ids.iter()
                        .map(|&id| {
                            let Some(run) = outcomes::get_run(c, id)? else {
                                return Ok(None);
                            };
                            let newer = outcomes::newer_runs(c, &run.workspace, id, keep)?;
                            Ok(Some((run, newer)))
                        })
                        .collect::<Result<Vec<_>, crate::store::sql::Error>>()
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
pub(super) fn output_run(key: &str) -> Option<i64> {
    let rest = key.strip_prefix(OUTPUT_PREFIX)?.strip_suffix(".out")?;
    let (id, tag) = rest.split_once('-')?;
    let all = |s: &str, ok: fn(&u8) -> bool| !s.is_empty() && s.bytes().all(|b| ok(&b));
    if !all(id, u8::is_ascii_digit) || !all(tag, u8::is_ascii_hexdigit) {
        return None;
    }
    id.parse().ok()
}

/// Whether `run` is finished without naming output `key`: a finished row never
/// changes, so it never will (the key is an orphan).
pub(super) fn never_names(run: &Run, key: &str) -> bool {
    run.finished_at.is_some() && run.output_blob.as_deref() != Some(key)
}

/// Whether a kept plan of check `run` is still wanted at `now`: the run is still going
/// (it records the plan it kept when it finishes), or it kept one that is neither
/// approved nor expired, or the apply that approved it is still going (`apply_going`:
/// it reads the plan first). Once `false`, never `true` again: a finished row never
/// changes, an apply ends once, and an expired plan is never approved (the approving
/// transaction checks the expiry).
pub(super) fn plan_kept(run: &Run, apply_going: bool, now: i64) -> bool {
    if run.finished_at.is_none() {
        return true;
    }
    match run.applied_by {
        Some(_) => apply_going,
        None => run.plan_expires_at.is_some_and(|t| t > now),
    }
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
        Some((run, _)) if never_names(run, key) => Sweep::Orphan,
        // Its run is still going: the key is recorded when it finishes.
        Some(_) => Sweep::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            locked_by: None,
            approvable,
            state_moved: false,
        }
    }

    #[test]
    fn a_kept_plan_is_wanted_while_its_run_or_its_apply_goes_and_until_it_expires() {
        let now = 1000;
        let check = |finished: bool, expires: Option<i64>, applied_by: Option<i64>| Run {
            plan_expires_at: expires,
            applied_by,
            ..run_of(None, finished, false)
        };
        /// The check: finished, its plan's expiry, its apply; the apply going; wanted.
        type Case = (bool, Option<i64>, Option<i64>, bool, bool);
        let table: &[Case] = &[
            // Still going: the plan it kept is recorded when it finishes.
            (false, None, None, false, true),
            (true, Some(now + 1), None, false, true),
            (true, Some(now), None, false, false),
            (true, Some(now - 50), None, false, false),
            // Kept no plan (approve_apply off, or keeping it failed).
            (true, None, None, false, false),
            // Approved: the apply reads it first, then it is done with.
            (true, Some(now + 1), Some(13), true, true),
            (true, Some(now - 50), Some(13), true, true),
            (true, Some(now + 1), Some(13), false, false),
        ];
        for (finished, expires, applied_by, apply_going, want) in table {
            let run = check(*finished, *expires, *applied_by);
            assert_eq!(
                plan_kept(&run, *apply_going, now),
                *want,
                "finished={finished} expires={expires:?} applied_by={applied_by:?} apply_going={apply_going}"
            );
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
}
