//! The scheduler: runs each check with an interval when it is due, counted from its
//! last check's start.

use super::*;

impl DriftService {
    /// The scheduler: runs each check with an interval when it is due (counted from
    /// its last check's start), until `shutdown` changes.
    pub async fn schedule(
        &self,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
        claims: &crate::jobs::Claims,
    ) {
        // Every node, claim or not: plan files an earlier release kept on this node's
        // disk are approvable through any node only once they are in the store.
        self.adopt_plan_files().await;
        loop {
            // Nodes sharing the index: one schedules (and tidies) at a time; the others
            // look again each tick, and take over when its claim lapses.
            if !claims.take("drift-schedule", 2 * MAX_TICK).await {
                tokio::select! {
                    _ = tokio::time::sleep(MAX_TICK) => continue,
                    _ = shutdown.changed() => return,
                }
            }
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
}

/// Seconds until a check with `interval` is due, given when its last check started
/// (never: due now). Zero or less: due.
pub fn due_in(last_started: Option<i64>, interval: u64, now: i64) -> i64 {
    let interval = i64::try_from(interval).unwrap_or(i64::MAX);
    last_started.map_or(0, |t| t.saturating_add(interval).saturating_sub(now))
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
}
