//! One installation on disk — the data dir, its keys, its index and its blob store —
//! opened the same way for `serve` and for every operator command.
//!
//! The data dir's server lock lives here too: `serve` holds `<data_dir>/serve.lock`
//! shared for its whole life, and a command that writes a new index straight into the
//! data dir (a restore after a lost disk) takes it exclusively first, so it never
//! writes under a running server.

use std::os::fd::AsRawFd;
use std::path::Path;

use anyhow::Context;

use crate::config::Config;
use crate::store::blob::create_private_dir;

/// A held `flock` on `<data_dir>/serve.lock`; released when dropped (or the process ends).
#[derive(Debug)]
pub struct DataDirLock {
    _file: std::fs::File,
}

/// Which lock a caller wants.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Servers: many may hold it at once (stategate never refused a second server).
    Shared,
    /// A command writing the index: only when no server holds the data dir.
    Exclusive,
}

fn lock_path(config: &Config) -> std::path::PathBuf {
    config.data_dir.join("serve.lock")
}

/// `Ok(None)`: someone holds a conflicting lock right now (never waits).
fn try_lock(config: &Config, mode: Mode) -> anyhow::Result<Option<DataDirLock>> {
    create_private_dir(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    let path = lock_path(config);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let op = match mode {
        Mode::Shared => libc::LOCK_SH,
        Mode::Exclusive => libc::LOCK_EX,
    } | libc::LOCK_NB;
    // SAFETY: `flock` on a file descriptor this function owns for as long as the call.
    if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
        return Ok(Some(DataDirLock { _file: file }));
    }
    let err = std::io::Error::last_os_error();
    if err.kind() == std::io::ErrorKind::WouldBlock {
        return Ok(None);
    }
    Err(err).with_context(|| format!("cannot lock {}", path.display()))
}

/// The lock `serve` holds for its whole life. Refused while a restore writes the index.
pub fn hold_for_serving(config: &Config) -> anyhow::Result<DataDirLock> {
    try_lock(config, Mode::Shared)?.with_context(|| {
        format!(
            "a restore is writing a new index into {}; start stategate when it has finished",
            config.data_dir.display()
        )
    })
}

/// The data dir, proven free of servers: `None` while any `stategate serve` holds it.
pub fn hold_without_server(config: &Config) -> anyhow::Result<Option<DataDirLock>> {
    try_lock(config, Mode::Exclusive)
}

/// The index files SQLite keeps beside `db` (its write-ahead log and shared memory):
/// a new index must not meet an old log.
pub fn index_files(db: &Path) -> [std::path::PathBuf; 3] {
    let with = |suffix: &str| {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        std::path::PathBuf::from(name)
    };
    [db.to_path_buf(), with("-wal"), with("-shm")]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_share_the_data_dir_and_shut_out_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            data_dir: dir.path().join("data"),
            ..Config::default()
        };
        let first = hold_for_serving(&config).unwrap();
        let second = hold_for_serving(&config).unwrap();
        assert!(hold_without_server(&config).unwrap().is_none());
        drop(first);
        assert!(hold_without_server(&config).unwrap().is_none());
        drop(second);
        let writer = hold_without_server(&config).unwrap().expect("no server left");
        let err = hold_for_serving(&config).unwrap_err().to_string();
        assert!(err.contains("a restore is writing"), "{err}");
        assert!(hold_without_server(&config).unwrap().is_none());
        drop(writer);
        hold_for_serving(&config).unwrap();
    }

    #[test]
    fn index_files_are_the_database_its_log_and_its_shared_memory() {
        let [db, wal, shm] = index_files(Path::new("/d/stategate.db"));
        assert_eq!(db, Path::new("/d/stategate.db"));
        assert_eq!(wal, Path::new("/d/stategate.db-wal"));
        assert_eq!(shm, Path::new("/d/stategate.db-shm"));
    }
}
