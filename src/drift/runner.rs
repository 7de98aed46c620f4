//! Running `tofu`/`terraform` as a child: its own process group (so a timeout kills
//! it with every provider plugin and script it started), an allow-listed environment
//! (nothing of the server's but what Terraform needs from the host) plus the derived
//! backend variables and the check's `env`, bounded output capture, and a deadline.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use super::plan::Ended;

/// Most bytes kept of each of a child's stdout and stderr (the rest is drained unread).
const MAX_CAPTURE: usize = 8 * 1024 * 1024;
/// After the child exits, how long its pipes may stay open (held by a grandchild)
/// before the rest of its process group is killed.
const PIPE_GRACE: Duration = Duration::from_secs(2);

/// The furthest deadline a check gets: a timeout beyond it is as good as none (about
/// 30 years), and `Instant` arithmetic never overflows on any configured value.
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 86_400);

/// `seconds` from now, capped at [`FAR_FUTURE`]: no configured timeout can make the
/// deadline computation panic (`Instant + Duration` overflows on huge values).
pub fn deadline_after(seconds: u64) -> Instant {
    deadline_from(Instant::now(), seconds)
}

fn deadline_from(now: Instant, seconds: u64) -> Instant {
    let wanted = Duration::from_secs(seconds).min(FAR_FUTURE);
    now.checked_add(wanted).unwrap_or(now)
}

/// What a child did.
#[derive(Debug)]
pub struct ChildOutput {
    pub ended: Ended,
    pub stdout: String,
    pub stderr: String,
}

impl ChildOutput {
    pub fn exit_code(&self) -> Option<i64> {
        match self.ended {
            Ended::Exited(code) => Some(i64::from(code)),
            _ => None,
        }
    }
}

/// Finds the program: a path (with a `/`) must exist, a bare name is looked up on `PATH`.
pub fn resolve_binary(name: &str, path_var: Option<&std::ffi::OsStr>) -> Result<PathBuf, String> {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        return if executable(&p) {
            Ok(p)
        } else {
            Err(format!(
                "binary {name:?} does not exist or is not executable"
            ))
        };
    }
    path_var
        .map(std::env::split_paths)
        .into_iter()
        .flatten()
        .map(|dir| dir.join(name))
        .find(|p| executable(p))
        .ok_or_else(|| format!("binary {name:?} was not found on PATH"))
}

/// The server's variables a child inherits: what `tofu`/`terraform` and their
/// providers need from the host (the search path, home, locale, temporary directory,
/// proxies, CA bundle, the CLI configuration and plugin cache). Nothing else: every
/// other variable, whoever set it (`STATEGATE_*`, `ADJ_STATE_ENC_KEY`, `SOFTHSM2_CONF`,
/// `AWS_*`, `TF_VAR_*`), stays with the server; a check gets more only through its
/// own `env`.
pub const INHERITED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "TMPDIR",
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "no_proxy",
    "NO_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "TF_CLI_CONFIG_FILE",
    "TF_PLUGIN_CACHE_DIR",
    "TF_PLUGIN_CACHE_MAY_BREAK_DEPENDENCY_LOCK_FILE",
    "TF_REGISTRY_DISCOVERY_RETRY",
    "TF_REGISTRY_CLIENT_TIMEOUT",
    "CHECKPOINT_DISABLE",
];

/// Families of inherited variables (the locale's `LC_*`).
const INHERITED_PREFIXES: &[&str] = &["LC_"];

/// The environment a child starts with: the allowed part of the server's own
/// ([`INHERITED_ENV`]), then `extra` (the derived backend variables and the check's
/// `env`; a later entry of a name replaces an earlier one).
pub fn child_env(
    inherited: impl Iterator<Item = (OsString, OsString)>,
    extra: &[(String, String)],
) -> Vec<(OsString, OsString)> {
    let allowed = |name: &str| {
        INHERITED_ENV.contains(&name) || INHERITED_PREFIXES.iter().any(|p| name.starts_with(p))
    };
    let mut env: Vec<(OsString, OsString)> = inherited
        .filter(|(k, _)| k.to_str().is_some_and(allowed))
        .filter(|(k, _)| !extra.iter().any(|(e, _)| k.to_string_lossy() == e.as_str()))
        .collect();
    for (i, (k, v)) in extra.iter().enumerate() {
        if !extra[i + 1..].iter().any(|(later, _)| later == k) {
            env.push((OsString::from(k), OsString::from(v)));
        }
    }
    env
}

async fn capture(mut pipe: impl tokio::io::AsyncRead + Unpin) -> String {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = MAX_CAPTURE.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// SIGKILL to the whole process group `pgid` (the child's pid: it leads its group).
fn kill_group(pgid: u32) {
    if let Ok(pgid) = i32::try_from(pgid) {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory involved.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

/// Kills a process group when dropped while armed.
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            kill_group(pgid);
        }
    }
}

/// Runs `program args…` in `dir` with exactly `env`, as `user` (uid, gid: switched
/// with `setgid`/`setuid`, supplementary groups dropped, before `exec`) when given,
/// until it exits or `deadline`. At the deadline the child's whole process group is
/// killed.
pub async fn run(
    program: &Path,
    args: &[impl AsRef<std::ffi::OsStr>],
    dir: &Path,
    env: &[(OsString, OsString)],
    user: Option<(u32, u32)>,
    deadline: Instant,
) -> std::io::Result<ChildOutput> {
    let mut command = tokio::process::Command::new(program);
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    let mut child = command
        .args(args)
        .current_dir(dir)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pgid = child.id().unwrap_or(0);
    // Dropped before the end (the caller's future cancelled, the runtime stopping):
    // the whole group goes, not only the leader `kill_on_drop` would end.
    let mut guard = GroupGuard(Some(pgid));
    let stdout = tokio::spawn(capture(child.stdout.take().expect("piped")));
    let stderr = tokio::spawn(capture(child.stderr.take().expect("piped")));
    let ended = match tokio::time::timeout_at(deadline, child.wait()).await {
        Ok(status) => {
            let status = status?;
            match status.code() {
                Some(code) => Ended::Exited(code),
                None => Ended::Signalled,
            }
        }
        Err(_) => {
            kill_group(pgid);
            let _ = child.wait().await;
            Ended::TimedOut
        }
    };
    // A grandchild may still hold the pipes open: give it a moment, then end it.
    let collect = async { (stdout.await, stderr.await) };
    tokio::pin!(collect);
    let (out, err) = match tokio::time::timeout(PIPE_GRACE, &mut collect).await {
        Ok(both) => both,
        Err(_) => {
            kill_group(pgid);
            collect.await
        }
    };
    guard.0 = None;
    Ok(ChildOutput {
        ended,
        stdout: out.unwrap_or_default(),
        stderr: err.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 37 finding 2: the environment was a deny-list, so `SOFTHSM2_CONF` (and
    /// anything else the server had) reached the child. It is an allow-list now.
    #[test]
    fn the_child_inherits_only_what_terraform_needs() {
        use std::os::unix::ffi::OsStringExt;
        let mut inherited: Vec<(OsString, OsString)> = [
            ("PATH", "/bin"),
            ("HOME", "/root"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C"),
            ("TF_CLI_CONFIG_FILE", "/etc/tfrc"),
            ("https_proxy", "http://proxy:3128"),
            ("SSL_CERT_FILE", "/etc/ca.pem"),
            ("STATEGATE_DEK", "secret"),
            ("ADJ_STATE_ENC_KEY", "secret"),
            ("TF_HTTP_PASSWORD", "old"),
            ("TF_ENCRYPTION", "old"),
            ("AWS_PROFILE", "old"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("SOFTHSM2_CONF", "/etc/softhsm2.conf"),
            ("TF_VAR_db_password", "secret"),
            ("TF_LOG", "trace"),
            ("PKCS11_PIN", "secret"),
            ("LD_PRELOAD", "/tmp/evil.so"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .into();
        inherited.push((OsString::from_vec(b"PATH\xff".to_vec()), "x".into()));
        let env = child_env(
            inherited.into_iter(),
            &[
                ("HOME".into(), "/home/nobody".into()),
                ("TF_HTTP_PASSWORD".into(), "derived".into()),
                ("AWS_PROFILE".into(), "new".into()),
                ("HOME".into(), "/srv/check-home".into()),
            ],
        );
        let get = |k: &str| {
            env.iter()
                .filter(|(n, _)| n == k)
                .map(|(_, v)| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        for (kept, value) in [
            ("PATH", "/bin"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C"),
            ("TF_CLI_CONFIG_FILE", "/etc/tfrc"),
            ("https_proxy", "http://proxy:3128"),
            ("SSL_CERT_FILE", "/etc/ca.pem"),
            ("TF_HTTP_PASSWORD", "derived"),
            ("AWS_PROFILE", "new"),
            ("HOME", "/srv/check-home"),
        ] {
            assert_eq!(get(kept), vec![value], "{kept}");
        }
        let names: Vec<String> = env
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 9, "nothing else: {names:?}");
    }

    #[test]
    fn no_timeout_overflows_the_deadline() {
        let now = Instant::now();
        let table: &[(u64, Duration)] = &[
            (0, Duration::ZERO),
            (600, Duration::from_secs(600)),
            (i64::MAX as u64, FAR_FUTURE),
            (u64::MAX, FAR_FUTURE),
        ];
        for (seconds, after) in table {
            assert_eq!(deadline_from(now, *seconds) - now, *after, "{seconds}");
        }
        assert!(deadline_after(u64::MAX) > Instant::now());
    }

    #[test]
    fn binaries_resolve_on_path_or_as_paths() {
        let path = std::env::var_os("PATH");
        assert!(resolve_binary("sh", path.as_deref()).is_ok());
        assert!(resolve_binary("/bin/sh", None).is_ok());
        let missing = resolve_binary("no-such-tofu-xyz", path.as_deref()).unwrap_err();
        assert!(missing.contains("not found on PATH"), "{missing}");
        let missing = resolve_binary("/nonexistent/tofu", None).unwrap_err();
        assert!(missing.contains("does not exist"), "{missing}");
    }

    /// Alive: exists and is not a zombie waiting to be reaped.
    fn alive(pid: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|s| !s.trim_start().starts_with('Z'))
        })
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("grandchild");
        let script = format!("sleep 30 & echo $! > {}; wait", pid_file.display());
        let started = std::time::Instant::now();
        let out = run(
            Path::new("/bin/sh"),
            &["-c".into(), script],
            dir.path(),
            &child_env(std::env::vars_os(), &[]),
            None,
            Instant::now() + Duration::from_millis(500),
        )
        .await
        .unwrap();
        assert_eq!(out.ended, Ended::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(3));
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let pid = pid.trim();
        // SIGKILL was sent to the group; the kernel ends the grandchild promptly.
        let gone = (0..200).any(|_| {
            let dead = !alive(pid);
            if !dead {
                std::thread::sleep(Duration::from_millis(10));
            }
            dead
        });
        assert!(gone, "the background grandchild {pid} was killed too");
    }

    #[tokio::test]
    async fn exit_codes_and_output_are_captured() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(
            Path::new("/bin/sh"),
            &["-c", "echo out; echo err >&2; exit 2"],
            dir.path(),
            &child_env(std::env::vars_os(), &[]),
            None,
            Instant::now() + Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!(out.ended, Ended::Exited(2));
        assert_eq!(
            (out.stdout.as_str(), out.stderr.as_str()),
            ("out\n", "err\n")
        );
    }
}
