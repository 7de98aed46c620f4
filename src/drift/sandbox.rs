//! What a drift check's child (`tofu`/`terraform`, its providers, anything the
//! configuration runs) can see of this server: nothing but its own workspace.
//!
//! The environment (`runner::child_env`, an allow-list) is no boundary on its own: a
//! child running as the same user could read `/proc/<server>/environ`,
//! `/proc/<server>/mem`, or simply `<data_dir>/dek`. So:
//!
//! - the server makes itself non-dumpable at startup ([`forbid_dumps`]): another
//!   process of the same (non-root) user cannot open its `/proc` files or ptrace it;
//! - the child runs under bubblewrap ([`Sandbox::wrap`]): a new PID namespace with a
//!   fresh `/proc` (no server process is visible), every capability dropped (CI runs as
//!   root, and root ignores non-dumpable: the sandbox is what protects there), killed
//!   with its parent, a private `/tmp`, every path of `Config::secret_paths` hidden (the
//!   one list of what holds or unlocks a secret: key files, PIN, token store, TLS key,
//!   client secret, configuration, data dir, blob store), the check's own `dir` and its
//!   run's work directory writable and the rest of the filesystem read-only. The
//!   network is kept: the child talks to stategate on loopback and to its providers;
//! - with `drift_settings.run_as`, the child runs as that unprivileged user: bubblewrap
//!   makes the mounts as root, then `setpriv` switches uid and gid (a real
//!   `setresuid`, groups cleared, no capability left) before the program starts; with
//!   `sandbox = "none"` the switch is made before `exec`. Then even a file the list
//!   misses is out of reach when only the server's user may read it.
//!
//! `drift_settings.sandbox = "none"` runs the child directly (logged loudly); with the
//! default `"bubblewrap"` a check whose sandbox cannot be made is an error outcome,
//! never an unsandboxed run.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::config::{Config, DriftSandbox, RunAs, SecretKind};

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
    /// `drift_settings.run_as` looked up (or why it could not be: then nothing runs).
    run_as: Result<Option<RunAs>, String>,
}

/// How to start one sandboxed child: the program (`bwrap`, or the binary itself with
/// `sandbox = "none"`), its arguments, and the user it is started as (`None`: the
/// server's own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub user: Option<(u32, u32)>,
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
    /// The child drops to this uid and gid (through `setpriv`, the program here) after
    /// bubblewrap, still root, made every mount: as that user it could not reach the
    /// work directory inside the server's data dir to bind it.
    drop_to: Option<(PathBuf, u32, u32)>,
}

/// The program that drops the child to `drift_settings.run_as` inside the sandbox
/// (util-linux), looked up on the server's `PATH`.
pub const SETPRIV: &str = "setpriv";

impl Sandbox {
    /// The sandbox `config` asks for, hiding every path of
    /// [`Config::secret_paths`](crate::config::Config::secret_paths): nothing is added
    /// here by hand.
    pub fn from_config(config: &Config) -> Self {
        let (mut hidden_dirs, mut hidden_files) = (Vec::new(), Vec::new());
        for secret in config.secret_paths() {
            match secret.kind {
                SecretKind::Dir => hidden_dirs.push(secret.path),
                SecretKind::File => hidden_files.push(secret.path),
            }
        }
        let run_as = match &config.drift_settings.run_as {
            None => Ok(None),
            Some(user) => RunAs::resolve(user)
                .map(Some)
                .map_err(|why| format!("drift_settings.run_as = {user:?}: {why}")),
        };
        Sandbox {
            kind: config.drift_settings.sandbox,
            hidden_dirs,
            hidden_files,
            run_as,
        }
    }

    pub fn kind(&self) -> DriftSandbox {
        self.kind
    }

    /// The user children run as (`drift_settings.run_as`), when one is set.
    pub fn run_as(&self) -> Option<&RunAs> {
        self.run_as.as_ref().ok().and_then(Option::as_ref)
    }

    /// Why no sandbox can be made right now (`None`: it can, or none is wanted).
    pub fn unavailable(&self) -> Option<String> {
        let bwrap = match self.kind {
            DriftSandbox::None => None,
            DriftSandbox::Bubblewrap => self.bwrap().err(),
        };
        bwrap.or_else(|| self.switch().err())
    }

    /// The uid and gid children must be switched to (`None`: they run as the server's
    /// own user), or why they cannot be.
    fn switch(&self) -> Result<Option<(u32, u32)>, String> {
        let Some(user) = self.run_as.clone()? else {
            return Ok(None);
        };
        // SAFETY: geteuid(2) only reads this process's credentials.
        let euid = unsafe { libc::geteuid() };
        if euid == user.uid {
            return Ok(None);
        }
        if euid != 0 {
            return Err(format!(
                "drift_settings.run_as = {:?}: only a server running as root can start children as another user",
                user.name
            ));
        }
        if self.kind == DriftSandbox::Bubblewrap {
            self.setpriv()?;
        }
        Ok(Some((user.uid, user.gid)))
    }

    fn bwrap(&self) -> Result<PathBuf, String> {
        super::runner::resolve_binary(BWRAP, std::env::var_os("PATH").as_deref()).map_err(|why| {
            format!(
                "the drift sandbox cannot run ({why}): install bubblewrap, or set drift_settings.sandbox = \"none\" to run checks unsandboxed (their children can then read this server's secrets)"
            )
        })
    }

    fn setpriv(&self) -> Result<PathBuf, String> {
        super::runner::resolve_binary(SETPRIV, std::env::var_os("PATH").as_deref()).map_err(|why| {
            format!("drift_settings.run_as needs {SETPRIV} (util-linux) in the sandbox: {why}")
        })
    }

    /// Gives a run's work directory to the user children run as (the child writes its
    /// plan there); nothing to do without `run_as`.
    pub fn hand_over(&self, work: &Path) -> std::io::Result<()> {
        match self.switch() {
            Ok(Some((uid, gid))) => std::os::unix::fs::chown(work, Some(uid), Some(gid)),
            Ok(None) => Ok(()),
            Err(why) => Err(std::io::Error::other(why)),
        }
    }

    /// The variables that name the user children run as (`HOME`, `USER`, `LOGNAME`),
    /// for their environment; none without `run_as`.
    pub fn identity_env(&self) -> Vec<(String, String)> {
        self.run_as()
            .map(|user| {
                vec![
                    ("HOME".into(), user.home.display().to_string()),
                    ("USER".into(), user.name.clone()),
                    ("LOGNAME".into(), user.name.clone()),
                ]
            })
            .unwrap_or_default()
    }

    /// How to run `program args…` in `dir` inside the sandbox, with `dir` and `work`
    /// writable and `readable` visible (besides the read-only rest of the filesystem),
    /// as `drift_settings.run_as` when set. Refused when `dir` lies inside a hidden
    /// directory.
    pub fn wrap(
        &self,
        program: &Path,
        args: &[String],
        dir: &Path,
        work: Option<&Path>,
        readable: &[PathBuf],
    ) -> Result<Launch, String> {
        let user = self.switch()?;
        if self.kind == DriftSandbox::None {
            return Ok(Launch {
                program: program.to_path_buf(),
                args: args.iter().map(OsString::from).collect(),
                user,
            });
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
        let drop_to = match user {
            Some((uid, gid)) => Some((self.setpriv()?, uid, gid)),
            None => None,
        };
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
            drop_to,
        };
        let mut argv = bwrap_args(&mounts);
        argv.push("--".into());
        if let Some((setpriv, uid, gid)) = &mounts.drop_to {
            argv.push(setpriv.into());
            argv.extend(
                [
                    format!("--reuid={uid}"),
                    format!("--regid={gid}"),
                    "--clear-groups".into(),
                    "--inh-caps=-all".into(),
                    "--no-new-privs".into(),
                    "--".into(),
                ]
                .map(OsString::from),
            );
        }
        argv.push(program.into());
        argv.extend(args.iter().map(OsString::from));
        Ok(Launch {
            program: bwrap,
            args: argv,
            user: None,
        })
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
    // A private /tmp every user may write to, as the real one (the child may be run_as).
    let tmp = Path::new("/tmp");
    opt("--perms", &[Path::new("1777")]);
    opt("--tmpfs", &[tmp]);
    // What is bound back inside the private /tmp (a check's dir or binary kept there)
    // gets its parents made by bubblewrap with the real ones' modes, often 0700: a
    // `run_as` user must be able to pass them (their names are all it learns).
    let passable = |target: &Path, a: &mut Vec<OsString>| {
        if m.drop_to.is_none() {
            return;
        }
        let mut parents: Vec<&Path> = target
            .ancestors()
            .skip(1)
            .filter(|p| p.starts_with(tmp) && *p != tmp)
            .collect();
        parents.reverse();
        for parent in parents {
            a.extend(["--perms".into(), "0755".into(), "--dir".into()]);
            a.push(parent.as_os_str().to_os_string());
        }
    };
    passable(&m.dir, &mut a);
    for path in &m.readable {
        passable(path, &mut a);
    }
    let mut opt = |flag: &str, paths: &[&Path]| {
        a.push(flag.into());
        a.extend(paths.iter().map(|p| p.as_os_str().to_os_string()));
    };
    opt("--bind", &[&m.dir, &m.dir]);
    for path in &m.readable {
        opt("--ro-bind", &[path, path]);
    }
    for dir in &m.hidden_dirs {
        opt("--tmpfs", &[dir]);
    }
    if let Some(work) = &m.work {
        if m.drop_to.is_some() {
            // bubblewrap makes the work directory's parents inside the hidden (tmpfs)
            // data dir with the real ones' 0700: the user must be able to pass them.
            let inside = |a: &&Path| m.hidden_dirs.iter().any(|h| a.starts_with(h) && *a != h);
            let mut parents: Vec<&Path> = work.ancestors().skip(1).filter(inside).collect();
            parents.reverse();
            for parent in parents {
                opt("--perms", &[Path::new("0755")]);
                opt("--dir", &[parent]);
            }
        }
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
    if m.drop_to.is_some() {
        // Only what `setpriv` needs to become the user; switching from root to it
        // clears them (and no_new_privs, which bubblewrap sets, keeps them cleared).
        opt("--cap-add", &[Path::new("CAP_SETUID")]);
        opt("--cap-add", &[Path::new("CAP_SETGID")]);
    }
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

    /// A check kept under `/tmp` (a CI checkout there) run as another user: bubblewrap
    /// makes the parents of what is bound back into the private `/tmp` with the real
    /// ones' modes, so each is made passable (0755) first, or the child cannot reach its
    /// own directory or binary (exit 126).
    #[test]
    fn what_is_bound_back_into_the_private_tmp_is_reachable_by_a_run_as_user() {
        let p = PathBuf::from;
        let args = |drop_to| -> Vec<String> {
            bwrap_args(&Mounts {
                dir: p("/tmp/ci/checkout/infra"),
                work: None,
                readable: vec![p("/tmp/ci/bin/tofu"), p("/usr/bin/tofu")],
                hidden_dirs: vec![],
                hidden_files: vec![],
                drop_to,
            })
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
        };
        let dropped = args(Some((p("/usr/bin/setpriv"), 65534, 65534)));
        let at = |needle: &[&str]| {
            dropped
                .windows(needle.len())
                .position(|w| w == needle)
                .unwrap_or_else(|| panic!("{needle:?} in {dropped:?}"))
        };
        let tmp = at(&["--tmpfs", "/tmp"]);
        let ci = at(&["--perms", "0755", "--dir", "/tmp/ci"]);
        let checkout = at(&["--perms", "0755", "--dir", "/tmp/ci/checkout"]);
        let bin = at(&["--perms", "0755", "--dir", "/tmp/ci/bin"]);
        let dir = at(&["--bind", "/tmp/ci/checkout/infra", "/tmp/ci/checkout/infra"]);
        let binary = at(&["--ro-bind", "/tmp/ci/bin/tofu", "/tmp/ci/bin/tofu"]);
        assert!(
            tmp < ci && ci < checkout && checkout < dir && bin < binary,
            "{dropped:?}"
        );
        assert!(
            !dropped
                .iter()
                .any(|a| a == "/usr" || a == "/tmp/ci/checkout/infra/.."),
            "only parents inside /tmp: {dropped:?}"
        );
        // The server's own user needs none of it.
        assert!(!args(None).iter().any(|a| a == "0755"));
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
            drop_to: None,
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

    /// With `run_as`, only what the switch needs is kept (and cleared by it), and the
    /// work directory's parents inside the hidden data dir become passable.
    #[test]
    fn run_as_keeps_only_the_switch_and_opens_the_way_to_the_work_directory() {
        let p = PathBuf::from;
        let mut mounts = Mounts {
            dir: p("/srv/infra"),
            work: Some(p("/data/drift/work/7")),
            hidden_dirs: vec![p("/data")],
            ..Mounts::default()
        };
        let args = |m: &Mounts| -> Vec<String> {
            bwrap_args(m)
                .into_iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let plain = args(&mounts);
        assert!(
            !plain.iter().any(|a| a == "--cap-add" || a == "--dir"),
            "{plain:?}"
        );
        mounts.drop_to = Some((p("/usr/bin/setpriv"), 990, 990));
        let switched = args(&mounts);
        let at = |needle: &[&str]| {
            switched
                .windows(needle.len())
                .position(|w| w == needle)
                .unwrap_or_else(|| panic!("{needle:?} in {switched:?}"))
        };
        let data = at(&["--tmpfs", "/data"]);
        let drift = at(&["--perms", "0755", "--dir", "/data/drift"]);
        let work = at(&["--perms", "0755", "--dir", "/data/drift/work"]);
        let bind = at(&["--bind", "/data/drift/work/7", "/data/drift/work/7"]);
        assert!(data < drift && drift < work && work < bind, "{switched:?}");
        let drop = at(&["--cap-drop", "ALL"]);
        assert!(drop < at(&["--cap-add", "CAP_SETUID"]));
        assert!(drop < at(&["--cap-add", "CAP_SETGID"]));
        assert_eq!(switched.iter().filter(|a| *a == "--cap-add").count(), 2);
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
        let launch = Sandbox::from_config(&config)
            .wrap(Path::new("/bin/sh"), &["-c".into()], &inside, None, &[])
            .unwrap();
        assert_eq!(
            launch,
            Launch {
                program: PathBuf::from("/bin/sh"),
                args: vec![OsString::from("-c")],
                user: None
            }
        );
    }
}
