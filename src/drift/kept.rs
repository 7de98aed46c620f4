//! Kept plans in the blob store: a drifted check with `approve_apply` seals its saved
//! plan under its workspace's plan key (associated data naming the workspace and the
//! run) and puts it at `drift/plans/<run>.plan`, in the same store as the state and
//! the runs' plan text. Every node sharing the index and the store reads it from
//! there, so a plan kept by one node is approved and applied through any other; the
//! index admits the apply once (`drift_one_apply_per_check`), whichever node asks.
//!
//! Kept plans sit under `drift/` beside the plan text so that the tidy pass's one LIST
//! of `drift/` finds both; each key has its own form ([`plan_run`],
//! `tidy::output_run`), and neither sweep takes the other's objects for its own. A
//! sealed plan is read whole into memory to be opened, so it has a bound
//! ([`MAX_PLAN`]): a larger plan is not kept (the check says why), and a larger object
//! is never read.
//!
//! Earlier releases kept plans as files in `<data_dir>/drift/plans/<run>.plan` (the
//! same sealed bytes). [`DriftService::adopt_plan_files`] moves those into the store,
//! unchanged, when the scheduler starts, on each tidy pass, before an approval and
//! before a reseal; a file whose plan is no longer wanted is deleted instead. Put
//! before delete: a crash between them leaves a copy in both, and the next adoption
//! finds the store's and deletes the file.

use super::*;
use crate::store::blob::BlobStore;

/// Where kept plans live in the blob store: `drift/plans/<run id>.plan`.
pub const PLAN_PREFIX: &str = "drift/plans/";
/// Most bytes of a saved plan that is kept (a zip of the configuration, the prior
/// state and the planned changes; a workspace whose plan is larger is not approvable).
const MAX_PLAN: u64 = 256 * 1024 * 1024;
/// What sealing adds to a plan: a header, a nonce and a tag (fewer bytes than this).
const SEAL_OVERHEAD: u64 = 64;

/// The store key of run `run`'s kept plan.
pub(super) fn plan_key(run: i64) -> String {
    format!("{PLAN_PREFIX}{run}.plan")
}

/// The run a kept plan's store key names (`drift/plans/<run id>.plan`); `None` for any
/// other key, which nothing here touches.
pub(super) fn plan_run(key: &str) -> Option<i64> {
    plan_file_run(key.strip_prefix(PLAN_PREFIX)?)
}

/// The kept plans among listed store keys with their runs, oldest run first.
pub(super) fn kept_plans_in(keys: &[String]) -> Vec<(i64, String)> {
    let mut plans: Vec<(i64, String)> = keys
        .iter()
        .filter_map(|key| Some((plan_run(key)?, key.clone())))
        .collect();
    plans.sort();
    plans
}

/// The run a kept plan's name names (`<run id>.plan`).
fn plan_file_run(name: &str) -> Option<i64> {
    let id = name.strip_suffix(".plan")?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    id.parse().ok()
}

impl DriftService {
    /// Seals the saved plan at `planfile` (in the run's work directory) and puts it in
    /// the store at [`plan_key`]; the reason when it was not kept.
    pub(super) async fn keep_plan(&self, s: &Started, planfile: &Path) -> Result<(), String> {
        let plain = read_plan_file(planfile).await?;
        let sealed = self
            .inner
            .root
            .drift_plan_key(&s.workspace)
            .seal(&sealed_ad("plan", &s.workspace, s.id), &plain)
            .map_err(|e| e.to_string())?;
        self.put_kept_plan(s.id, sealed).await
    }

    /// Puts `sealed` at check run `run`'s [`plan_key`] (replacing what is there).
    pub(super) async fn put_kept_plan(&self, run: i64, sealed: Vec<u8>) -> Result<(), String> {
        self.blobs()
            .put(&plan_key(run), Bytes::from(sealed))
            .await
            .map_err(|e| format!("cannot store the sealed plan: {e}"))
    }

    /// The sealed bytes of check run `run`'s kept plan (`None`: not in the store),
    /// refused past the bound.
    pub(super) async fn read_sealed_plan(&self, run: i64) -> Result<Option<Vec<u8>>, String> {
        read_bounded(
            self.blobs().as_ref(),
            &plan_key(run),
            MAX_PLAN + SEAL_OVERHEAD,
        )
        .await
    }

    /// The plaintext of check run `run`'s kept plan (of `workspace`), or why not.
    pub(super) async fn open_kept_plan(
        &self,
        workspace: &str,
        run: i64,
    ) -> Result<zeroize::Zeroizing<Vec<u8>>, String> {
        let sealed = self
            .read_sealed_plan(run)
            .await
            .map_err(|e| format!("the kept plan cannot be read: {e}"))?
            .ok_or("the kept plan is not in the store (deleted as used or expired)")?;
        self.inner
            .root
            .drift_plan_key(workspace)
            .open(&sealed_ad("plan", workspace, run), &sealed)
            .map(zeroize::Zeroizing::new)
            .map_err(|e| format!("the kept plan cannot be decrypted: {e}"))
    }

    /// Whether the store holds check run `run`'s kept plan.
    pub(super) async fn kept_plan_exists(&self, run: i64) -> Result<bool, Error> {
        let found = self
            .blobs()
            .read(&plan_key(run))
            .await
            .map_err(|e| internal("cannot read a kept drift plan from the store", e))?;
        Ok(found.is_some())
    }

    /// Deletes check run `run`'s kept plan from the store (gone already is fine).
    pub(super) async fn delete_kept_plan(&self, run: i64) -> Result<(), Error> {
        self.blobs()
            .delete(&plan_key(run))
            .await
            .map_err(|e| internal("cannot delete a kept drift plan from the store", e))
    }

    /// Every kept plan in the store with its run, oldest run first.
    pub(super) async fn kept_plan_keys(&self) -> Result<Vec<(i64, String)>, Error> {
        Ok(kept_plans_in(&self.list_objects(PLAN_PREFIX).await?))
    }

    /// The first `n` bytes of check run `run`'s kept plan (fewer when it is shorter;
    /// `None`: not in the store), for counting generations without reading it whole.
    pub(super) async fn kept_plan_head(
        &self,
        run: i64,
        n: usize,
    ) -> Result<Option<Vec<u8>>, String> {
        read_head(self.blobs().as_ref(), &plan_key(run), n).await
    }

    /// Whether a kept plan of check run `run` is still wanted now ([`tidy::plan_kept`]),
    /// looked up in one read of the index. A run this index does not know (another
    /// index over the same store, or one rebuilt without its drift history) is not
    /// judged here: `None`.
    pub(super) async fn plan_wanted(&self, run: i64) -> Result<Option<bool>, Error> {
        let standing = self
            .read(move |c| {
                let Some(check) = outcomes::get_run(c, run)? else {
                    return Ok(None);
                };
                let apply_going = match check.applied_by {
                    Some(apply) => {
                        outcomes::get_run(c, apply)?.is_some_and(|a| a.finished_at.is_none())
                    }
                    None => false,
                };
                Ok(Some((check, apply_going)))
            })
            .await?;
        Ok(standing.map(|(check, apply_going)| tidy::plan_kept(&check, apply_going, now_unix())))
    }

    /// `<data_dir>/drift/plans`: where earlier releases kept plans as files.
    fn legacy_plans_dir(&self) -> PathBuf {
        self.inner.dir.join("plans")
    }

    /// The plan files an earlier release kept (`<run>.plan`) and not yet moved into
    /// the store; none when there is no such directory.
    pub(super) fn legacy_plan_files(&self) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(self.legacy_plans_dir()) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| plan_file_run(&e.file_name().to_string_lossy()).is_some())
            .map(|e| e.path())
            .collect();
        files.sort();
        files
    }

    /// Moves the plans an earlier release kept as files into the store (see the module
    /// docs); files whose plans are no longer wanted, or of no run, are deleted, and so
    /// is the directory once empty. What fails is logged and left for the next call.
    pub(super) async fn adopt_plan_files(&self) {
        let dir = self.legacy_plans_dir();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return; // none (the usual case), or unreadable: nothing to adopt
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            match plan_file_run(&name) {
                Some(run) => {
                    if let Err(e) = self.adopt_plan_file(run, &path).await {
                        tracing::warn!(run, error = %e, "cannot move a kept drift plan file into the store; tried again later");
                    }
                }
                // A reseal's temporary copy an earlier release left when it stopped.
                None if name.ends_with(".plan.resealing") => remove_plan_file(&path),
                None => {}
            }
        }
        if std::fs::remove_dir(&dir).is_ok() {
            tracing::info!(dir = %dir.display(), "kept drift plans are in the store now; removed the old plans directory");
        }
    }

    /// Puts one legacy plan file's sealed bytes at its run's key (unless the store has
    /// them already) when the plan is still wanted, then deletes the file.
    async fn adopt_plan_file(&self, run: i64, path: &Path) -> Result<(), String> {
        let wanted = self.plan_wanted(run).await.map_err(|e| e.to_string())?;
        if wanted == Some(true)
            && !self
                .kept_plan_exists(run)
                .await
                .map_err(|e| e.to_string())?
        {
            let sealed = read_plan_file(path).await?;
            self.put_kept_plan(run, sealed).await?;
            tracing::info!(run, "moved a kept drift plan file into the store");
        }
        remove_plan_file(path);
        Ok(())
    }
}

/// A plan file's bytes, refused past [`MAX_PLAN`] (plus sealing) without reading more.
async fn read_plan_file(path: &Path) -> Result<Vec<u8>, String> {
    use tokio::io::AsyncReadExt;
    let max = MAX_PLAN + SEAL_OVERHEAD;
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| format!("cannot read the plan file: {e}"))?;
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| format!("cannot read the plan file: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(format!("the plan is larger than {MAX_PLAN} bytes"));
    }
    Ok(bytes)
}

fn remove_plan_file(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot delete an old kept drift plan file")
        }
    }
}

/// Object `key` whole, refused when it is longer than `max` (by its length, before any
/// byte is read, and again as it arrives); `None`: no such object.
async fn read_bounded(
    blobs: &dyn BlobStore,
    key: &str,
    max: u64,
) -> Result<Option<Vec<u8>>, String> {
    let Some(mut reader) = blobs.read(key).await.map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let too_long = || format!("it is longer than {max} bytes");
    if reader.len > max {
        return Err(too_long());
    }
    let mut out = Vec::with_capacity(reader.len as usize);
    while let Some(piece) = reader.chunks.recv().await {
        let piece = piece.map_err(|e| e.to_string())?;
        if (out.len() + piece.len()) as u64 > max {
            return Err(too_long());
        }
        out.extend_from_slice(&piece);
    }
    Ok(Some(out))
}

/// The first `n` bytes of object `key` (fewer when it is shorter); the rest is not
/// read. `None`: no such object.
async fn read_head(blobs: &dyn BlobStore, key: &str, n: usize) -> Result<Option<Vec<u8>>, String> {
    let Some(mut reader) = blobs.read(key).await.map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let mut head = Vec::with_capacity(n);
    while head.len() < n {
        let Some(piece) = reader.chunks.recv().await else {
            break;
        };
        let piece = piece.map_err(|e| e.to_string())?;
        head.extend_from_slice(&piece[..piece.len().min(n - head.len())]);
    }
    Ok(Some(head))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_of_the_plan_form_name_a_run() {
        let table: &[(&str, Option<i64>)] = &[
            ("drift/plans/12.plan", Some(12)),
            ("drift/plans/0.plan", Some(0)),
            ("drift/plans/12", None),
            ("drift/plans/.plan", None),
            ("drift/plans/+12.plan", None),
            ("drift/plans/-12.plan", None),
            ("drift/plans/12.plan.resealing", None),
            ("drift/plans/a/12.plan", None),
            ("drift/12.plan", None),
            ("drift/12-abc.out", None),
            ("drift/plans/12-abc.out", None),
            ("drift-plans/12.plan", None),
            ("drift/plans/99999999999999999999.plan", None),
        ];
        for (key, want) in table {
            assert_eq!(plan_run(key), *want, "{key}");
        }
        assert_eq!(plan_key(12), "drift/plans/12.plan");
        assert_eq!(plan_run(&plan_key(i64::MAX)), Some(i64::MAX));
        assert_eq!(
            tidy::output_run(&plan_key(12)),
            None,
            "the outputs sweep never takes a kept plan for plan text"
        );
    }

    #[tokio::test]
    async fn reads_are_bounded_and_heads_are_short() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::blob::LocalStore::open(dir.path()).unwrap();
        store
            .put("k/x", Bytes::from(vec![7u8; 300 * 1024]))
            .await
            .unwrap();
        let whole = read_bounded(&store, "k/x", 300 * 1024).await.unwrap();
        assert_eq!(whole.unwrap().len(), 300 * 1024);
        let refused = read_bounded(&store, "k/x", 300 * 1024 - 1)
            .await
            .unwrap_err();
        assert!(refused.contains("longer than"), "{refused}");
        assert_eq!(read_bounded(&store, "k/none", 10).await.unwrap(), None);
        assert_eq!(
            read_head(&store, "k/x", 8).await.unwrap().unwrap(),
            vec![7u8; 8]
        );
        store.put("k/s", Bytes::from_static(b"abc")).await.unwrap();
        assert_eq!(read_head(&store, "k/s", 8).await.unwrap().unwrap(), b"abc");
        assert_eq!(read_head(&store, "k/none", 8).await.unwrap(), None);
    }
}
