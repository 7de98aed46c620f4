//! Drift's sealed objects under the keyring (`stategate key status`, `key reseal`):
//! runs' plan text (`drift/<run>-<tag>.out`) and kept plans (`drift/plans/<run>.plan`),
//! both in the blob store, each a `SealKey` message whose associated data names its
//! workspace and run. The census also counts plan files an earlier release kept in
//! `<data_dir>/drift/plans/` (it only reads); a reseal first moves those into the
//! store (`kept`), then reseals them there.
//!
//! Both are read by name, not through the index, so they are resealed in place: the
//! new bytes are opened again under the newest generation before they replace the old
//! (`put` replaces an object atomically). A `kill -9` anywhere leaves the old object or
//! the new one, both of which open while the old generation is in the ring; running it
//! again carries on. Objects are read one at a time (bounded memory; a kept plan has
//! its bound). Tidy may delete an object while it is resealed: after its new bytes are
//! in place, an object tidy has given up on (an output whose run is recorded pruned or
//! no longer names it, a plan used or expired — verdicts that never change back) is
//! deleted again, so a deleted plan or plan text never comes back. (An apply deletes
//! the plan it used before its run is finished; one a reseal put back in between is
//! deleted by the next tidy pass, and it can never be approved again either way.)

use super::*;
use crate::store::reseal::Census;

/// What a drift reseal did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct DriftResealed {
    pub outputs: u64,
    pub plans: u64,
    /// Already under the newest generation.
    pub current: u64,
    /// Objects of no recorded run (tidy's to delete): left alone.
    pub orphans: u64,
}

impl DriftService {
    /// Adds every drift output and kept plan to `census`, by the generation it names.
    pub async fn count_sealed(&self, census: &mut Census) -> Result<(), Error> {
        let blobs = self.inner.tofu.store().blobs().clone();
        for key in self.output_keys().await? {
            match blobs.get(&key).await {
                Ok(Some(sealed)) => {
                    let g = crate::crypto::SealKey::sealed_generation(&sealed);
                    census.generations.entry(g).or_default().drift_outputs += 1;
                }
                Ok(None) => {} // deleted since the LIST (tidy): nothing left to count
                Err(e) => census.unreadable.push(format!("{key}: {e}")),
            }
        }
        for (run, key) in self.kept_plan_keys().await? {
            match self.kept_plan_head(run, 8).await {
                Ok(Some(head)) => {
                    let g = crate::crypto::SealKey::sealed_generation(&head);
                    census.generations.entry(g).or_default().drift_plans += 1;
                }
                Ok(None) => {} // used or expired since the LIST
                Err(e) => census.unreadable.push(format!("{key}: {e}")),
            }
        }
        for path in self.legacy_plan_files() {
            match read_prefix(&path, 8) {
                Ok(head) => {
                    let g = crate::crypto::SealKey::sealed_generation(&head);
                    census.generations.entry(g).or_default().drift_plans += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {} // moved since
                Err(e) => census.unreadable.push(format!("{}: {e}", path.display())),
            }
        }
        Ok(())
    }

    /// Reseals every drift output and kept plan under an older data generation with
    /// the newest (see the module docs). Idempotent; stops at the first error, with
    /// everything before it done.
    pub async fn reseal(&self) -> Result<DriftResealed, Error> {
        self.reseal_racing(|| async {}).await
    }

    /// [`DriftService::reseal`], running `between` after each object is read and
    /// before its new bytes replace it: the tests' seam for a tidy pass racing it.
    #[doc(hidden)]
    pub async fn reseal_racing<F, Fut>(&self, mut between: F) -> Result<DriftResealed, Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let mut out = DriftResealed::default();
        let target = self.inner.root.data_generation();
        let blobs = self.inner.tofu.store().blobs().clone();
        for key in self.output_keys().await? {
            let Some(run) = tidy::output_run(&key) else {
                continue;
            };
            let sealed = blobs
                .get(&key)
                .await
                .map_err(|e| internal(&format!("cannot read drift output {key}"), e))?;
            let Some(sealed) = sealed else {
                continue; // deleted since the LIST
            };
            let Some(fresh) = self
                .resealed("output", run, &sealed, target, &mut out)
                .await?
            else {
                continue;
            };
            between().await;
            blobs
                .put(&key, Bytes::from(fresh))
                .await
                .map_err(|e| internal(&format!("cannot store resealed drift output {key}"), e))?;
            if self.output_given_up(run, &key).await? {
                blobs
                    .delete(&key)
                    .await
                    .map_err(|e| internal("cannot delete a drift output from the store", e))?;
                continue;
            }
            out.outputs += 1;
        }
        self.adopt_plan_files().await;
        for (run, _) in self.kept_plan_keys().await? {
            let sealed = self.read_sealed_plan(run).await.map_err(|e| {
                internal(&format!("cannot read the kept plan of drift run {run}"), e)
            })?;
            let Some(sealed) = sealed else {
                continue; // deleted since the LIST (used or expired)
            };
            let Some(fresh) = self
                .resealed("plan", run, &sealed, target, &mut out)
                .await?
            else {
                continue;
            };
            between().await;
            self.put_kept_plan(run, fresh).await.map_err(|e| {
                internal(
                    &format!("cannot store the resealed plan of drift run {run}"),
                    e,
                )
            })?;
            if self.plan_wanted(run).await? == Some(false) {
                self.delete_kept_plan(run).await?;
                continue;
            }
            out.plans += 1;
        }
        Ok(out)
    }

    /// Whether tidy has given up on output `key` of `run` (it may have deleted it while
    /// it was resealed): the run is recorded pruned, or it finished without naming `key`.
    async fn output_given_up(&self, run: i64, key: &str) -> Result<bool, Error> {
        let key = key.to_string();
        self.read(move |c| {
            if outcomes::pruned(c, run)?.is_some() {
                return Ok(true);
            }
            Ok(outcomes::get_run(c, run)?.is_some_and(|r| tidy::never_names(&r, &key)))
        })
        .await
    }

    /// `sealed` (a drift `what`, "output" or "plan", of `run`) sealed again under
    /// generation `target`; `None` when it already is, or its run is not recorded
    /// (counted in `out`).
    async fn resealed(
        &self,
        what: &str,
        run: i64,
        sealed: &[u8],
        target: u32,
        out: &mut DriftResealed,
    ) -> Result<Option<Vec<u8>>, Error> {
        if crate::crypto::SealKey::sealed_generation(sealed) >= target {
            out.current += 1;
            return Ok(None);
        }
        let Some(workspace) = self.run_workspace(run).await? else {
            out.orphans += 1;
            return Ok(None);
        };
        let root = &self.inner.root;
        let key = match what {
            "plan" => root.drift_plan_key(&workspace),
            _ => root.drift_output_key(&workspace),
        };
        reseal_message(&key, &sealed_ad(what, &workspace, run), sealed)
            .map(Some)
            .map_err(|e| internal(&format!("cannot reseal drift {what} of run {run}"), e))
    }

    /// Every output object's key in the store (only keys of the output form: kept
    /// plans are under `drift/` too).
    async fn output_keys(&self) -> Result<Vec<String>, Error> {
        Ok(self
            .list_objects(OUTPUT_PREFIX)
            .await?
            .into_iter()
            .filter(|key| tidy::output_run(key).is_some())
            .collect())
    }

    async fn run_workspace(&self, run: i64) -> Result<Option<String>, Error> {
        Ok(self
            .read(move |c| outcomes::get_run(c, run))
            .await?
            .map(|r| r.workspace))
    }
}

/// Opens `sealed` and seals its plaintext again under the newest generation, proving
/// the new message opens before it is returned.
fn reseal_message(
    key: &crate::crypto::SealKey,
    associated: &[u8],
    sealed: &[u8],
) -> Result<Vec<u8>, crate::crypto::SealError> {
    let plain = zeroize::Zeroizing::new(key.open(associated, sealed)?);
    let fresh = key.seal(associated, &plain)?;
    key.open(associated, &fresh)?;
    Ok(fresh)
}

/// The first `n` bytes of a file (fewer when it is shorter).
fn read_prefix(path: &Path, n: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut head = Vec::with_capacity(n);
    std::fs::File::open(path)?
        .take(n as u64)
        .read_to_end(&mut head)?;
    Ok(head)
}
