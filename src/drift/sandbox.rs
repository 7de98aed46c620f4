//! What a drift check's child (`tofu`/`terraform`, its providers, anything the
//! configuration runs) can see of this server: nothing but its own workspace.
//!
//! The scrubbed environment (`runner::child_env`) is no boundary on its own: a child
//! running as the same user could read `/proc/<server>/environ` (the DEK,
//! `ADJ_STATE_ENC_KEY`), `/proc/<server>/mem`, or simply `<data_dir>/dek`. So:
//!
//! - the server makes itself non-dumpable at startup ([`forbid_dumps`]): another
//!   process of the same (non-root) user cannot open its `/proc` files or ptrace it;
//! - the child runs under bubblewrap ([`Sandbox::wrap`]): a new PID namespace with a
//!   fresh `/proc` (no server process is visible), every capability dropped (CI runs as
//!   root, and root ignores non-dumpable: the sandbox is what protects there), killed
//!   with its parent, a private `/tmp`, the data dir, the local blob store, the DEK
//!   file, the config file and the TLS key hidden, the check's own `dir` and its run's
//!   work directory writable and the rest of the filesystem read-only. The network is
//!   kept: the child talks to stategate on loopback and to its providers' APIs.
//!
//! `drift_settings.sandbox = "none"` runs the child directly (logged loudly); with the
//! default `"bubblewrap"` a check whose sandbox cannot be made is an error outcome,
//! never an unsandboxed run.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::config::{Config, DriftSandbox};

/// The sandbox program, looked up on the server's `PATH`.
pub const BWRAP: &str = "bwrap";

/// Makes this process non-dumpable: processes of the same user can no longer read its
/// `/proc/<pid>/environ`, `mem` or `maps`, nor ptrace it (root still can; see the
/// module docs). Children start dumpable again (it is reset at `exec`).
pub fn forbid_dumps() -> std::io::Result<()> {
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) changes a flag of this process; no memory is
    // passed or shared.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether this process may be dumped (`PR_GET_DUMPABLE`).
pub fn is_dumpable() -> bool {
    // SAFETY: prctl(PR_GET_DUMPABLE) only reads a flag of this process.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) != 0 }
}

/// How children are confined, and what of the server they must never see.
#[derive(Debug, Clone)]
pub struct Sandbox {
    kind: DriftSandbox,
    /// Directories replaced by an empty tmpfs.
    hidden_dirs: Vec<PathBuf>,
    /// Files replaced by an empty one.
    hidden_files: Vec<PathBuf>,
}

/// The filesystem a sandboxed child gets, every path absolute and resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Mounts {
    /// The check's `dir` (and its run's work directory): read-write, in this order
    /// around the hidden directories (the work directory lives in the data dir).
    dir: PathBuf,
    work: Option<PathBuf>,
    /// Read-only again after `/tmp` was made private (the binary, `-var-file`s).
    readable: Vec<PathBuf>,
    hidden_dirs: Vec<PathBuf>,
    hidden_files: Vec<PathBuf>,
}

impl Sandbox {
    /// The sandbox `config` asks for, hiding its data dir, local blob store, DEK file,
    /// config file and TLS key.
    pub fn from_config(config: &Config) -> Self {
        let mut hidden_files = vec![config.dek_path()];
        hidden_files.extend(config.loaded_from.clone());
        hidden_files.extend(config.tls.key_file.clone());
        Sandbox {
            kind: config.drift_settings.sandbox,
            hidden_dirs: vec![config.data_dir.clone(), config.local_store_path()],
            hidden_files,
        }
    }

    pub fn kind(&self) -> DriftSandbox {
        self.kind
    }

    /// Why no sandbox can be made right now (`None`: it can, or none is wanted).
    pub fn unavailable(&self) -> Option<String> {
        match self.kind {
            DriftSandbox::None => None,
            DriftSandbox::Bubblewrap => self.bwrap().err(),
        }
    }

    fn bwrap(&self) -> Result<PathBuf, String> {
        super::runner::resolve_binary(BWRAP, std::env::var_os("PATH").as_deref()).map_err(|why| {
            format!(
                "the drift sandbox cannot run ({why}): install bubblewrap, or set drift_settings.sandbox = \"none\" to run checks unsandboxed (their children can then read this server's secrets)"
            )
        })
    }

    /// The program and arguments that run `program args…` in `dir` inside the sandbox,
    /// with `dir` and `work` writable and `readable` visible (besides the read-only
    /// rest of the filesystem). Refused when `dir` lies inside a hidden directory.
    pub fn wrap(
        &self,
        program: &Path,
        args: &[String],
        dir: &Path,
        work: Option<&Path>,
        readable: &[PathBuf],
    ) -> Result<(PathBuf, Vec<OsString>), String> {
        let direct = || {
            let args = args.iter().map(OsString::from).collect();
            Ok((program.to_path_buf(), args))
        };
        if self.kind == DriftSandbox::None {
            return direct();
        }
        let bwrap = self.bwrap()?;
        let resolve = |p: &Path| std::fs::canonicalize(p).ok();
        let dir = resolve(dir)
            .ok_or_else(|| format!("working directory {} cannot be resolved", dir.display()))?;
        let hidden_dirs: Vec<PathBuf> =
            self.hidden_dirs.iter().filter_map(|d| resolve(d)).collect();
        if let Some(secret) = hidden_dirs.iter().find(|h| dir.starts_with(h)) {
            return Err(format!(
                "working directory {} is inside {}, which drift children must not see; move it out",
                dir.display(),
                secret.display()
            ));
        }
        let mounts = Mounts {
            dir,
            work: work.and_then(resolve),
            readable: std::iter::once(program)
                .chain(readable.iter().map(PathBuf::as_path))
                .filter_map(resolve)
                .collect(),
            hidden_dirs,
            hidden_files: self
                .hidden_files
                .iter()
                .filter_map(|f| resolve(f))
                .collect(),
        };
        let mut argv = bwrap_args(&mounts);
        argv.push("--".into());
        argv.push(program.into());
        argv.extend(args.iter().map(OsString::from));
        Ok((bwrap, argv))
    }
}

/// bubblewrap's options for `mounts`, in the order they must apply: later mounts land
/// on top of earlier ones, so the secrets are hidden after everything that could
/// contain them was mounted, and the work directory (inside the data dir) comes back
/// after the data dir was hidden.
fn bwrap_args(m: &Mounts) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut opt = |flag: &str, paths: &[&Path]| {
        a.push(flag.into());
        a.extend(paths.iter().map(|p| p.as_os_str().to_os_string()));
    };
    opt("--ro-bind", &[Path::new("/"), Path::new("/")]);
    opt("--dev", &[Path::new("/dev")]);
    opt("--proc", &[Path::new("/proc")]);
    opt("--tmpfs", &[Path::new("/tmp")]);
    opt("--bind", &[&m.dir, &m.dir]);
    for path in &m.readable {
        opt("--ro-bind", &[path, path]);
    }
    for dir in &m.hidden_dirs {
        opt("--tmpfs", &[dir]);
    }
    if let Some(work) = &m.work {
        opt("--bind", &[work, work]);
    }
    for file in &m.hidden_files {
        opt("--ro-bind", &[Path::new("/dev/null"), file]);
    }
    for flag in [
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
    ] {
        opt(flag, &[]);
    }
    opt("--cap-drop", &[Path::new("ALL")]);
    opt("--chdir", &[&m.dir]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_can_be_made_non_dumpable() {
        forbid_dumps().unwrap();
        assert!(!is_dumpable());
    }

    #[test]
    fn secrets_are_hidden_after_everything_that_could_contain_them() {
        let p = PathBuf::from;
        let mounts = Mounts {
            dir: p("/srv/infra"),
            work: Some(p("/data/drift/work/7")),
            readable: vec![p("/tmp/x/tofu")],
            hidden_dirs: vec![p("/data"), p("/blobs")],
            hidden_files: vec![p("/etc/stategate.toml"), p("/keys/dek")],
        };
        let args: Vec<String> = bwrap_args(&mounts)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let at = |needle: &[&str]| {
            args.windows(needle.len())
                .position(|w| w == needle)
                .unwrap_or_else(|| panic!("{needle:?} in {args:?}"))
        };
        let root = at(&["--ro-bind", "/", "/"]);
        let tmp = at(&["--tmpfs", "/tmp"]);
        let dir = at(&["--bind", "/srv/infra", "/srv/infra"]);
        let binary = at(&["--ro-bind", "/tmp/x/tofu", "/tmp/x/tofu"]);
        let data = at(&["--tmpfs", "/data"]);
        let work = at(&["--bind", "/data/drift/work/7", "/data/drift/work/7"]);
        let config = at(&["--ro-bind", "/dev/null", "/etc/stategate.toml"]);
        let dek = at(&["--ro-bind", "/dev/null", "/keys/dek"]);
        at(&["--tmpfs", "/blobs"]);
        assert!(root < tmp && tmp < dir && tmp < binary, "{args:?}");
        assert!(dir < data && data < work, "{args:?}");
        assert!(work < config && work < dek, "{args:?}");
        for flag in [
            "--unshare-pid",
            "--die-with-parent",
            "--new-session",
            "--proc",
        ] {
            assert!(args.iter().any(|a| a == flag), "{flag}");
        }
        at(&["--cap-drop", "ALL"]);
        at(&["--chdir", "/srv/infra"]);
        assert!(
            !args
                .iter()
                .any(|a| a == "--unshare-net" || a == "--share-net"),
            "the network is kept"
        );
    }

    #[test]
    fn a_check_dir_inside_the_data_dir_is_refused_and_none_runs_directly() {
        let data = tempfile::tempdir().unwrap();
        let inside = data.path().join("infra");
        std::fs::create_dir(&inside).unwrap();
        let config = Config {
            data_dir: data.path().to_path_buf(),
            ..Config::default()
        };
        let sandbox = Sandbox::from_config(&config);
        if sandbox.unavailable().is_none() {
            let refused = sandbox
                .wrap(Path::new("/bin/sh"), &[], &inside, None, &[])
                .unwrap_err();
            assert!(refused.contains("must not see"), "{refused}");
        }
        let mut config = config;
        config.drift_settings.sandbox = DriftSandbox::None;
        let (program, args) = Sandbox::from_config(&config)
            .wrap(Path::new("/bin/sh"), &["-c".into()], &inside, None, &[])
            .unwrap();
        assert_eq!(
            (program, args),
            (PathBuf::from("/bin/sh"), vec![OsString::from("-c")])
        );
    }
}
