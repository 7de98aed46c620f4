//! Plaintext work files: a run's saved plan exists in clear only while a child needs
//! it (`plan -out=`, `show`, `apply`), in `<data_dir>/drift/work/<run id>/` (0700).
//!
//! The directory is held under an exclusive `flock` by the process executing the run
//! and removed when the run ends (success, failure, timeout, or the task being
//! dropped). A process killed mid-run (SIGKILL, power loss) cannot remove it, but the
//! kernel releases its lock: [`sweep`] (at startup and on every tidy pass, by the
//! server and the CLI alike) deletes every work directory whose lock it can take, and
//! any loose file an earlier release left there (`apply-N.tfplan`). A directory still
//! locked belongs to a live run of another process (`drift run` next to `serve`) and
//! is left to it.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::store::blob::create_private_dir;

/// A run's work directory, locked while this value lives, deleted when dropped.
#[derive(Debug)]
pub struct WorkDir {
    path: PathBuf,
    /// Holds the lock; closed after the directory is gone.
    lock: Option<File>,
}

impl WorkDir {
    /// Creates (or takes over, after a crash) `<work>/<run>` and locks it.
    pub fn create(work: &Path, run: i64) -> std::io::Result<WorkDir> {
        let path = work.join(run.to_string());
        create_private_dir(&path)?;
        let lock = File::open(&path)?;
        if !try_lock(&lock)? {
            return Err(std::io::Error::other(format!(
                "{} is in use by another process",
                path.display()
            )));
        }
        // A directory left by a crashed process of this run: start empty.
        for entry in std::fs::read_dir(&path)?.filter_map(Result::ok) {
            remove_entry(&entry.path());
        }
        Ok(WorkDir {
            path,
            lock: Some(lock),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::error!(path = %self.path.display(), error = %e, "cannot delete a drift run's plaintext work directory");
            }
        }
        drop(self.lock.take());
    }
}

/// Takes `file`'s exclusive `flock` without waiting: `false` when another open file
/// (of this process or another) holds it. Released when `file` is closed, or by the
/// kernel when its process dies, however it dies.
fn try_lock(file: &File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock(2) on a descriptor `file` owns for the whole call; no memory passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

fn remove_entry(path: &Path) {
    let removed = if path.is_dir() && !path.is_symlink() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    if let Err(e) = removed {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::error!(path = %path.display(), error = %e, "cannot delete a plaintext drift work file");
        }
    }
}

/// Deletes everything in `work` no live run holds: directories whose lock is free
/// (their process stopped) and loose files. Returns how many entries it deleted.
pub fn sweep(work: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(work) else {
        return 0;
    };
    let mut deleted = 0;
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() && !path.is_symlink() {
            let Ok(dir) = File::open(&path) else {
                continue;
            };
            if !try_lock(&dir).unwrap_or(false) {
                continue; // a live run's
            }
            remove_entry(&path);
            drop(dir);
        } else {
            remove_entry(&path);
        }
        deleted += 1;
    }
    if deleted > 0 {
        tracing::warn!(
            dir = %work.display(),
            deleted,
            "deleted plaintext drift work files a stopped process left"
        );
    }
    deleted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_work_dir_is_gone_when_dropped_and_kept_while_held() {
        let root = tempfile::tempdir().unwrap();
        let work = root.path().join("work");
        let held = WorkDir::create(&work, 7).unwrap();
        std::fs::write(held.path().join("apply-7.tfplan"), "PLAN").unwrap();
        // A crash's leftovers: an unlocked run directory and a loose plan file.
        std::fs::create_dir_all(work.join("3")).unwrap();
        std::fs::write(work.join("3/check-3.tfplan"), "PLAN").unwrap();
        std::fs::write(work.join("apply-2.tfplan"), "PLAN").unwrap();
        assert_eq!(sweep(&work), 2);
        assert!(
            held.path().join("apply-7.tfplan").exists(),
            "a live run's is kept"
        );
        assert!(
            WorkDir::create(&work, 7).is_err(),
            "one holder per run directory"
        );
        let path = held.path().to_path_buf();
        drop(held);
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
    }
}
