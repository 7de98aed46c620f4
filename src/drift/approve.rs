//! Approval-gated applies: approving a drifted check's kept plan admits an apply run
//! (audited in the same transaction); executing it applies exactly that plan, once.
//!
//! The plan is read from the blob store (`kept`), so any node sharing the index and
//! the store approves and applies what another kept. Once is the index's to enforce,
//! not the node's: the admitting transaction inserts the apply row, and
//! `drift_one_apply_per_check` (and one unfinished run per workspace) refuses a second
//! one, whichever node and however close together they ask. The expiry is checked in
//! that transaction too, so a plan the tidy pass has given up on as expired is never
//! approved after it was deleted.

use super::*;

impl DriftService {
    /// Approves a drifted check's kept plan: admits an apply run of it, audited as
    /// `drift.apply_approved` by `actor`. Refused for a run that is not a drifted
    /// check, was approved before, kept no plan, or whose plan expired.
    pub async fn approve(&self, check_run: i64, actor: &str) -> Result<Started, Error> {
        let run = self.run(check_run).await?;
        let refuse = |why: String| Err(Error::Conflict(why));
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
        // A plan an earlier release kept as a file is approvable too.
        self.adopt_plan_files().await;
        if expires <= now_unix() || !self.kept_plan_exists(check_run).await? {
            return refuse(expired(check_run));
        }
        if let Some(f) = self.inner.tofu.freeze_of(&run.workspace).await? {
            return refuse(format!(
                "workspace {:?} is frozen by {} ({}): {}; nothing was approved",
                run.workspace,
                f.frozen_by,
                f.until_text(),
                f.reason
            ));
        }
        let check = self.check_of(&run.workspace)?.clone();
        let (ws, who) = (run.workspace.clone(), actor.to_string());
        let admitted = self
            .inner
            .db
            .write(move |c| -> Result<_, Error> {
                // Again where it counts: tidy deletes a plan once it is past its expiry.
                if expires <= now_unix() {
                    return Err(Error::Conflict(expired(check_run)));
                }
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
                        return Err(Error::Conflict(format!(
                            "drift run {other} of workspace {ws:?} is still going; nothing was approved"
                        )))
                    }
                    Err(e) if e.is_constraint_violation() => {
                        return Err(Error::Conflict(format!(
                            "drift run {check_run} was already approved; nothing was done"
                        )))
                    }
                    Err(e) => return Err(DbError::from(e).into()),
                };
                insert_audit(
                    c,
                    &AuditEntry::new(who.clone(), crate::tofu::scope(&ws), EVENT_APPLY_APPROVED, serde_json::json!({ "check_run": check_run, "apply_run": id })),
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

    pub(super) async fn apply_body(&self, s: &Started, secret: &str) -> (Finished, Option<String>) {
        let check_run = s.applies.unwrap_or_default();
        let result = self.apply_kept(s, secret).await;
        // Used or not, an approved plan is not kept: delete it (the index refuses a
        // second approval anyway; what this fails to delete, tidy deletes once this
        // run is finished).
        if let Err(e) = self.delete_kept_plan(check_run).await {
            tracing::warn!(run = check_run, error = %e, "cannot delete a used drift plan");
        }
        result
    }

    async fn apply_kept(&self, s: &Started, secret: &str) -> (Finished, Option<String>) {
        let fail = |why: String| (Finished::apply_failed(None, why), None);
        let check = &s.check;
        let deadline = runner::deadline_after(check.timeout_seconds);
        let (binary, env) = match self.prepare(check, secret) {
            Ok(ready) => ready,
            Err(why) => return fail(why),
        };
        let check_run = s.applies.unwrap_or_default();
        let plain = match self.open_kept_plan(&s.workspace, check_run).await {
            Ok(plain) => plain,
            Err(why) => return fail(why),
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
        // Still 0600: readable by the user children run as (`run_as`) and no other.
        if let Err(e) = self.inner.sandbox.hand_over(&planfile) {
            return fail(format!(
                "cannot give the plan to the user children run as: {e}"
            ));
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
                changes: plan::apply_changes(&out.stdout),
                ..Finished::default()
            },
            Some(text),
        )
    }
}

/// Why a plan is not approvable any more.
fn expired(check_run: i64) -> String {
    format!("the plan of drift run {check_run} has expired; run a new check")
}
