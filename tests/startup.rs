//! `stategate serve` as an operator starts it, on the real binary: a start that cannot
//! work (a busy port, a second server on the same data dir, a key file that is not a
//! key) ends within seconds with one line naming the cause and the fix, exit code 1,
//! no panic and nothing half-started; "stategate serving" is logged only once the
//! listener accepts connections.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn stategate(data: &Path, listen: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_stategate"));
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("STATEGATE_DATA_DIR", data)
        .env("STATEGATE_LISTEN", listen)
        .env("STATEGATE_BACKUP_INTERVAL_SECONDS", "0")
        .env("STATEGATE_RETENTION_INTERVAL_SECONDS", "0");
    command
}

/// [`stategate`] with the blob store outside the data dir (a lost data dir keeps its
/// store) and `key` as STATEGATE_DEK (`None`: the key file in the data dir).
fn installation(data: &Path, blobs: &Path, key: Option<&str>, listen: &str) -> Command {
    let mut command = stategate(data, listen);
    command.env("STATEGATE_STORE_PATH", blobs);
    if let Some(key) = key {
        command.env("STATEGATE_DEK", key);
    }
    command
}

/// A port nobody listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `serve` that must fail: its exit code, stderr and how long it took.
fn failed_start(data: &Path, listen: &str) -> (i32, String, Duration) {
    failed(stategate(data, listen).arg("serve"))
}

/// A command that must fail: its exit code, stderr and how long it took.
fn failed(command: &mut Command) -> (i32, String, Duration) {
    let started = Instant::now();
    let out = command.stdin(Stdio::null()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stderr).unwrap(),
        started.elapsed(),
    )
}

/// The one line a refused start prints, checked for what every refusal shares.
fn one_error_line(code: i32, stderr: &str, took: Duration) -> String {
    assert_eq!(code, 1, "{stderr}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("stategate serving"), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    errors[0].to_string()
}

/// A running server; killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `serve` and waits for its "stategate serving" line; at that moment the port
/// must already accept connections.
fn serve(data: &Path, port: u16) -> Server {
    serve_with(stategate(data, &format!("127.0.0.1:{port}")), port)
}

/// [`serve`] with the command as given.
fn serve_with(mut command: Command, port: u16) -> Server {
    let mut child = command
        .arg("serve")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let mut seen = String::new();
    let mut lines = BufReader::new(stderr).lines();
    let mut serving = false;
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("stategate serving") {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .unwrap_or_else(|e| panic!("logged serving but not listening: {e}\n{seen}"));
            serving = true;
            break;
        }
    }
    assert!(serving, "serve ended before serving:\n{seen}");
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    server
}

#[test]
fn a_busy_port_refuses_startup_at_once_before_the_data_dir_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let (code, stderr, took) = failed_start(&data, &listen);
    let line = one_error_line(code, &stderr, took);
    assert!(
        line.contains(&format!("cannot listen on {listen}"))
            && line.contains("already in use")
            && line.contains("STATEGATE_LISTEN"),
        "{line}"
    );
    assert!(!data.exists(), "the data dir was created");
}

#[test]
fn a_second_server_on_the_same_data_dir_is_refused_before_it_rewrites_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first_port = free_port();
    let first = serve(&data, first_port);
    let recorded = std::fs::read_to_string(data.join("address")).unwrap();
    assert_eq!(recorded.trim(), format!("http://127.0.0.1:{first_port}"));

    let (code, stderr, took) = failed_start(&data, &format!("127.0.0.1:{}", free_port()));
    let line = one_error_line(code, &stderr, took);
    assert!(
        line.contains("another stategate server")
            && line.contains(&format!("pid {}", first.0.id()))
            && line.contains("STATEGATE_DATA_DIR"),
        "{line}"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("address")).unwrap(),
        recorded,
        "the refused server rewrote the recorded address"
    );
    // The first one still serves.
    std::net::TcpStream::connect(("127.0.0.1", first_port)).unwrap();
}

#[test]
fn a_key_file_that_is_not_a_key_refuses_startup_naming_it_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let key = data.join("dek");
    std::fs::write(&key, "not a key\n").unwrap();
    let (code, stderr, took) = failed_start(&data, "127.0.0.1:0");
    let line = one_error_line(code, &stderr, took);
    assert!(
        line.contains(&format!("cannot use the key file {}", key.display()))
            && line.contains("STATEGATE_DEK"),
        "{line}"
    );
    // Nothing was opened: no index, no recorded address.
    assert!(!data.join("stategate.db").exists());
    assert!(!data.join("address").exists());
}

/// A key no installation here was made with.
const OTHER_DEK: &str = "HxwdHhkaGxwdHh8ICQoLDA0ODxAREhMUFRYXGBkaGxw=";

/// Writes serial 1 of workspace `w` through the running server's Terraform backend,
/// authenticated with the workspace credential `key` derives.
fn write_state(port: u16, key: &str) {
    use std::io::{Read, Write};
    let bearer = stategate::crypto::RootKey::from_base64(key)
        .unwrap()
        .workspace_bearer("w");
    let body = r#"{"version":4,"terraform_version":"1.9.0","serial":1,"lineage":"l-1","outputs":{},"resources":[]}"#;
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        conn,
        "POST /api/v1/tf/state/w HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {bearer}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// A command that must succeed: its stdout.
fn succeeds(command: &mut Command) -> String {
    let out = command.stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// Every file below `root` with its content, sorted.
fn files_with_content(root: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let content = std::fs::read(&path).unwrap();
                out.push((path, content));
            }
        }
    }
    out.sort();
    out
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The fingerprint the index at `db` recorded.
fn recorded_fingerprint(db: &Path) -> Option<String> {
    let conn = stategate::store::sql::Connection::open(db).unwrap();
    stategate::store::keyring::recorded_fingerprint(&conn).unwrap()
}

/// Issue 38, item 1: after a lost data dir and `index rebuild`, `serve` without the old
/// key used to make a new one and serve (every credential 401, every read 500). Now the
/// rebuilt index and the store name the key's fingerprint: a start without a key, or
/// with another one, is refused naming it, and no key is made; the right key serves.
#[test]
fn a_lost_data_dir_rebuilt_from_the_store_refuses_a_new_or_foreign_key() {
    common::sqlite_only("`index rebuild` into the data dir's SQLite file");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let blobs = dir.path().join("blobs");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let key = {
        // First start: no data anywhere, so a key is made (in the data dir).
        let _server = serve_with(installation(&data, &blobs, None, &listen), port);
        write_state(port, &std::fs::read_to_string(data.join("dek")).unwrap());
        std::fs::read_to_string(data.join("dek")).unwrap()
    };
    let key = key.trim().to_string();
    let fingerprint = stategate::crypto::RootKey::from_base64(&key)
        .unwrap()
        .fingerprint();
    assert_eq!(
        recorded_fingerprint(&data.join("stategate.db")).as_deref(),
        Some(fingerprint.as_str())
    );

    // The disk is lost: the store alone says a key is missing.
    std::fs::remove_dir_all(&data).unwrap();
    let (code, stderr, took) = failed(installation(&data, &blobs, None, &listen).arg("serve"));
    let line = one_error_line(code, &stderr, took);
    assert!(
        line.contains("there is no root key")
            && line.contains("the store (")
            && line.contains(&fingerprint)
            && line.contains("STATEGATE_DEK"),
        "{line}"
    );
    assert!(!data.join("dek").exists(), "a new key was made");
    assert!(!data.join("stategate.db").exists(), "an index was made");

    // The rebuild, with the key from the environment (as the docs say).
    let live = data.join("stategate.db");
    let out = succeeds(installation(&data, &blobs, Some(&key), &listen).args([
        "index",
        "rebuild",
        "--into",
        live.to_str().unwrap(),
    ]));
    assert!(out.contains("start stategate"), "{out}");
    assert_eq!(mode(&live), 0o600, "the rebuilt index is owner-only");
    assert_eq!(
        recorded_fingerprint(&live).as_deref(),
        Some(fingerprint.as_str())
    );

    // `serve` without the key: refused, and no key is made.
    let (code, stderr, took) = failed(installation(&data, &blobs, None, &listen).arg("serve"));
    let line = one_error_line(code, &stderr, took);
    assert!(
        line.contains("there is no root key")
            && line.contains("its index holds data")
            && line.contains(&fingerprint),
        "{line}"
    );
    assert!(!data.join("dek").exists(), "a new key was made");
    // A command without the key says to give it back, never to make one.
    let (code, stderr, took) =
        failed(installation(&data, &blobs, None, &listen).args(["workspace", "list"]));
    let line = one_error_line(code, &stderr, took);
    assert!(
        line.contains("no root key") && line.contains("restore the key file"),
        "{line}"
    );

    // With another key: `serve` and a command are refused, naming both fingerprints.
    let other = stategate::crypto::RootKey::from_base64(OTHER_DEK)
        .unwrap()
        .fingerprint();
    let store_before = files_with_content(&blobs);
    for args in [&["serve"][..], &["workspace", "env", "w"][..]] {
        let (code, stderr, took) =
            failed(installation(&data, &blobs, Some(OTHER_DEK), &listen).args(args));
        let line = one_error_line(code, &stderr, took);
        assert!(
            line.contains("another root key")
                && line.contains(&format!("records key fingerprint {fingerprint}"))
                && line.contains(&other),
            "{args:?}: {line}"
        );
    }
    assert_eq!(
        files_with_content(&blobs),
        store_before,
        "a refused key changed the store"
    );

    // The right key serves what was written before the loss.
    let _server = serve_with(installation(&data, &blobs, Some(&key), &listen), port);
}

/// Issue 38, items 1 and 5: a clean stop empties the index's write-ahead log, so a lost
/// `stategate.db` is restored in place beside the leftover `-wal`/`-shm`; the restored
/// index is owner-only, its audit log has the restore, and it records the key: a start
/// without it, or with another, is refused.
#[test]
fn a_restore_in_place_after_a_clean_stop_is_audited_and_keeps_the_key() {
    common::sqlite_only("a restore in place beside the SQLite file's leftover -wal/-shm");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let blobs = dir.path().join("blobs");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut server = serve_with(installation(&data, &blobs, None, &listen), port);
    let key = std::fs::read_to_string(data.join("dek")).unwrap();
    let key = key.trim().to_string();
    write_state(port, &key);
    succeeds(installation(&data, &blobs, None, &listen).arg("backup"));
    // A clean stop (SIGTERM): the log is emptied.
    // SAFETY: a signal to the child this test started.
    assert_eq!(
        unsafe { libc::kill(server.0.id() as i32, libc::SIGTERM) },
        0
    );
    assert!(server.0.wait().unwrap().success());
    let live = data.join("stategate.db");
    let wal = data.join("stategate.db-wal");
    assert_eq!(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0), 0);

    // The index file is lost; its empty log and shared memory are left.
    std::fs::remove_file(&live).unwrap();
    let out = succeeds(installation(&data, &blobs, None, &listen).args([
        "restore",
        "--into",
        live.to_str().unwrap(),
    ]));
    assert!(out.contains("It is the index of"), "{out}");
    assert_eq!(mode(&live), 0o600, "the restored index is owner-only");
    let conn = stategate::store::sql::Connection::open(&live).unwrap();
    let restored: i64 = conn
        .query_row(
            "SELECT count(*) FROM audit WHERE event = 'index.restored'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(restored, 1, "the restore is in the audit log");
    drop(conn);
    let fingerprint = stategate::crypto::RootKey::from_base64(&key)
        .unwrap()
        .fingerprint();
    assert_eq!(
        recorded_fingerprint(&live).as_deref(),
        Some(fingerprint.as_str())
    );

    // Another key is refused; so is a start whose key file went missing.
    let (code, stderr, took) =
        failed(installation(&data, &blobs, Some(OTHER_DEK), &listen).arg("serve"));
    let line = one_error_line(code, &stderr, took);
    assert!(line.contains("another root key"), "{line}");
    std::fs::rename(data.join("dek"), dir.path().join("dek.saved")).unwrap();
    let (code, stderr, took) = failed(installation(&data, &blobs, None, &listen).arg("serve"));
    let line = one_error_line(code, &stderr, took);
    assert!(line.contains("there is no root key"), "{line}");
    assert!(!data.join("dek").exists(), "a new key was made");
    // With its key back, it serves the restored index.
    std::fs::rename(dir.path().join("dek.saved"), data.join("dek")).unwrap();
    let _server = serve_with(installation(&data, &blobs, None, &listen), port);
}

/// Issue 38, item 4: forgetting `--config` made a command work on the default data dir,
/// creating a new empty installation there. Now a command refuses a default data dir
/// that does not exist (only `serve` makes an installation), and `--show-installation`
/// prints what a command resolved before it runs.
#[test]
fn a_command_says_which_installation_it_works_on_and_makes_none() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let default = home.join(".local/share/stategate");
    let bare = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_stategate"));
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &home);
        command
    };
    for args in [
        &["admin", "org", "create", "acme"][..],
        &["workspace", "list"][..],
    ] {
        let (code, stderr, took) = failed(&mut bare(args));
        let line = one_error_line(code, &stderr, took);
        assert!(
            line.contains(&format!(
                "there is no stategate installation at {}",
                default.display()
            )) && line.contains("--config"),
            "{args:?}: {line}"
        );
        assert!(!default.exists(), "{args:?} made a data dir");
    }

    // Named, it works, and says where.
    let data = dir.path().join("data");
    let out = bare(&["--show-installation", "admin", "org", "create", "acme"])
        .env("STATEGATE_DATA_DIR", &data)
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    for line in [
        "config: none (defaults and STATEGATE_* variables)".to_string(),
        format!("data dir: {}", data.display()),
        format!("index: SQLite {}", data.join("stategate.db").display()),
        format!("store: local directory {}", data.join("blobs").display()),
        "address: http://127.0.0.1:8080".to_string(),
        "server: not running on this data dir".to_string(),
    ] {
        assert!(stderr.lines().any(|l| l == line), "{line:?} in {stderr}");
    }
}
