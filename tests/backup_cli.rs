//! The operator commands as scripts see them, run as the real binary: `backup`,
//! `backup list`, `restore`, `admin audit list --since/--until`, `workspace env`
//! with the recorded address, `admin operator create --role/--workspaces`, `admin
//! operator list` and a token revocation the store cannot record. Results on
//! stdout, no server log lines, errors one line on stderr with exit code 1, and a
//! refused restore writes nothing.

mod common;

use std::path::Path;
use std::process::Command;

const DEK: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const OTHER_DEK: &str = "HxwdHhkaGxwdHh8ICQoLDA0ODxAREhMUFRYXGBkaGxw=";

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn stategate(data: &Path, dek: &str, args: &[&str]) -> Run {
    stategate_with(data, dek, Vec::new(), args)
}

/// [`stategate`] with `env` set too (the index a [`Site`] names).
fn stategate_with(data: &Path, dek: &str, env: Vec<(&str, String)>, args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_stategate"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("STATEGATE_DATA_DIR", data)
        .env("STATEGATE_DEK", dek)
        .envs(env)
        .output()
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Succeeded without a single log line (INFO or otherwise) on stderr.
fn ok(run: &Run, what: &str) {
    assert_eq!(run.code, 0, "{what}: {}", run.stderr);
    for level in [" INFO ", " WARN ", " DEBUG "] {
        assert!(!run.stderr.contains(level), "{what}: {}", run.stderr);
    }
}

/// Failed with exit 1 and one line on stderr containing `needle`.
fn one_line_error(run: &Run, needle: &str, what: &str) {
    assert_eq!(run.code, 1, "{what}: {}", run.stderr);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: {:?}", run.stderr);
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(needle),
        "{what}: {}",
        lines[0]
    );
}

#[test]
fn backup_list_restore_and_their_errors() {
    common::sqlite_only(
        "the CLI's backup of the data dir's SQLite file and `restore --into` a file",
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let run = stategate(&data, DEK, &["admin", "org", "create", "acme"]);
    ok(&run, "org create");

    let run = stategate(&data, DEK, &["backup"]);
    ok(&run, "backup");
    let taken: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    let id = taken["id"].as_str().unwrap().to_string();
    assert!(taken["key"].as_str().unwrap().starts_with("backups/"));

    let run = stategate(&data, DEK, &["backup", "list", "--json"]);
    ok(&run, "backup list");
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
    assert!(run.stdout.contains(&id));

    // Refused: wrong DEK, unknown id, bad id, the live index, an existing file.
    let into = dir.path().join("restored.db");
    let into_arg = into.to_str().unwrap();
    let live = data.join("stategate.db");
    let missing_id = format!("{}-{}", id.split('-').next().unwrap(), "0".repeat(32));
    let refused: Vec<(&str, Vec<&str>, &str)> = vec![
        (
            "wrong DEK",
            vec!["restore", "--into", into_arg],
            "cannot be opened",
        ),
        (
            "unknown id",
            vec!["restore", "--from", &missing_id, "--into", into_arg],
            "does not exist",
        ),
        (
            "bad id",
            vec!["restore", "--from", "yesterday", "--into", into_arg],
            "not a backup id",
        ),
        (
            "live index",
            vec!["restore", "--into", live.to_str().unwrap()],
            "live index",
        ),
    ];
    for (what, args, needle) in refused {
        let dek = if what == "wrong DEK" { OTHER_DEK } else { DEK };
        one_line_error(&stategate(&data, dek, &args), needle, what);
        assert!(!into.exists(), "{what}");
    }

    let run = stategate(&data, DEK, &["restore", "--from", &id, "--into", into_arg]);
    ok(&run, "restore");
    assert!(
        run.stdout.contains("To use it: stop stategate"),
        "{}",
        run.stdout
    );
    let conn = stategate::store::sql::Connection::open(&into).unwrap();
    let orgs: i64 = conn
        .query_row("SELECT count(*) FROM orgs WHERE name = 'acme'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(orgs, 1);
    let run = stategate(&data, DEK, &["restore", "--into", into_arg]);
    one_line_error(&run, "already exists", "existing file");

    // The audit log by time: the org creation is inside [2000, now], not after now.
    let run = stategate(
        &data,
        DEK,
        &["admin", "audit", "list", "--since", "2000-01-01"],
    );
    ok(&run, "audit since");
    assert!(run.stdout.contains("admin.org_created"), "{}", run.stdout);
    let run = stategate(
        &data,
        DEK,
        &["admin", "audit", "list", "--since", "2999-01-01"],
    );
    ok(&run, "audit since the future");
    assert_eq!(run.stdout, "");
    let run = stategate(
        &data,
        DEK,
        &["admin", "audit", "list", "--until", "2000-01-01T00:00:00Z"],
    );
    ok(&run, "audit until");
    assert_eq!(run.stdout, "");
    let run = stategate(
        &data,
        DEK,
        &["admin", "audit", "list", "--since", "last week"],
    );
    assert_eq!(run.code, 2, "clap usage error: {}", run.stderr);
}

#[test]
fn workspace_env_prints_the_address_the_server_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let run = stategate(&data, DEK, &["workspace", "env", "prod"]);
    ok(&run, "env without a record");
    assert!(
        run.stdout
            .contains("'http://127.0.0.1:8080/api/v1/tf/state/prod'"),
        "{}",
        run.stdout
    );
    std::fs::write(data.join("address"), "https://state.example:8443\n").unwrap();
    let run = stategate(&data, DEK, &["workspace", "env", "prod"]);
    ok(&run, "env with a record");
    assert!(
        run.stdout
            .contains("'https://state.example:8443/api/v1/tf/state/prod'"),
        "{}",
        run.stdout
    );
}

/// ADJ_STATE_ENC_KEY of the restore test (the cluster API answers only with one).
const ENC_KEY: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";

/// A real gateway in process over `data` (the data dir the CLI above uses).
struct Serving {
    base: String,
    stop: tokio::sync::watch::Sender<bool>,
}

/// Puts the restored index `restored` in place of `data`'s (stopped) one, as
/// docs/operating.md says: the old file and its `-wal`/`-shm` moved into `aside`.
fn swap_in(data: &Path, restored: &Path, aside: &Path) {
    std::fs::create_dir(aside).unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let from = data.join(format!("stategate.db{suffix}"));
        if from.exists() {
            std::fs::rename(&from, aside.join(format!("stategate.db{suffix}"))).unwrap();
        }
    }
    std::fs::rename(restored, data.join("stategate.db")).unwrap();
}

async fn serve(site: &Site) -> Serving {
    let app = stategate::server::build_app(&site.config()).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(stategate::server::serve_listener(listener, app, rx));
    Serving { base, stop }
}

/// A data dir and its index, as the operator's commands and the server see them: the
/// run's index (the data dir's SQLite file, or a new PostgreSQL database on the
/// PostgreSQL pass).
struct Site {
    data: std::path::PathBuf,
    index: stategate::config::IndexConfig,
    _database: Option<common::TestDatabase>,
}

impl Site {
    fn new(dir: &Path) -> Site {
        let (index, database) = common::test_index();
        Site {
            data: dir.join("data"),
            index,
            _database: database,
        }
    }

    fn config(&self) -> stategate::config::Config {
        stategate::config::Config {
            data_dir: self.data.clone(),
            dek: Some(DEK.into()),
            cluster: stategate::config::ClusterConfig {
                state_enc_key: Some(ENC_KEY.into()),
                ..Default::default()
            },
            index: self.index.clone(),
            ..Default::default()
        }
    }

    fn stategate(&self, dek: &str, args: &[&str]) -> Run {
        stategate_with(&self.data, dek, common::index_env(&self.config()), args)
    }

    fn cli(&self, args: &[&str]) -> String {
        let run = self.stategate(DEK, args);
        ok(&run, &args.join(" "));
        run.stdout.trim().to_string()
    }

    /// Where `restore --into` writes a new index beside this one: a new file `name` in `dir`,
    /// or a new empty PostgreSQL database.
    fn new_index(&self, dir: &Path, name: &str) -> String {
        match self.index.kind {
            stategate::config::IndexKind::Sqlite => {
                dir.join(format!("{name}.db")).display().to_string()
            }
            stategate::config::IndexKind::Postgres => common::new_postgres_database().unwrap(),
        }
    }

    /// Puts the restored index `restored` in place of the (stopped) live one: the file
    /// swapped in as docs/operating.md says, or `index.url` set to the restored database.
    fn swap_in(&mut self, restored: &str, aside: &Path) {
        match self.index.kind {
            stategate::config::IndexKind::Sqlite => swap_in(&self.data, Path::new(restored), aside),
            stategate::config::IndexKind::Postgres => self.index.url = Some(restored.into()),
        }
    }
}

impl Serving {
    fn http() -> reqwest::Client {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
    }

    /// The admin API's answer to an operator token.
    async fn admin(&self, token: &str) -> u16 {
        let url = format!("{}/api/v1/admin/workspaces", self.base);
        let r = Self::http()
            .get(url)
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        r.status().as_u16()
    }

    /// The admin API's answer to an operator token at `path` (under `/api/v1/admin/`).
    async fn admin_at(&self, token: &str, path: &str) -> u16 {
        let url = format!("{}/api/v1/admin/{path}", self.base);
        let r = Self::http()
            .get(url)
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        r.status().as_u16()
    }

    /// The cluster API's answer to a user token.
    async fn cluster(&self, cluster: &str, token: &str) -> u16 {
        let url = format!("{}/v1/clusters/{cluster}/tfstate", self.base);
        let r = Self::http()
            .get(url)
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        r.status().as_u16()
    }

    /// A UI login: the session cookie's value.
    async fn login(&self, token: &str) -> String {
        let r = Self::http()
            .post(format!("{}/ui/login", self.base))
            .form(&[("token", token)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 303);
        let cookie = r.headers()["set-cookie"].to_str().unwrap();
        let value = cookie.strip_prefix("sg_session=").unwrap();
        value.split(';').next().unwrap().to_string()
    }

    /// Is the UI session behind this cookie value live (a page, not a redirect to login)?
    async fn session_live(&self, cookie: &str) -> bool {
        let r = Self::http()
            .get(format!("{}/ui/workspaces", self.base))
            .header("Cookie", format!("sg_session={cookie}"))
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            200 => true,
            303 => false,
            other => panic!("unexpected {other}"),
        }
    }
}

/// Issue 20, item 8: a revocation made after the newest backup survives a restore.
/// Backup → revoke an operator token and a user token → restore → swap in: both get
/// 401, the revoked operator's UI session is gone (every session opened before the
/// restore ends), and the tokens nobody revoked still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_does_not_undo_revocations_made_after_the_backup() {
    let dir = tempfile::tempdir().unwrap();
    let mut site = Site::new(dir.path());
    let revoked_op = site.cli(&["admin", "operator", "create", "--email", "gone@x"]);
    let kept_op = site.cli(&["admin", "operator", "create", "--email", "kept@x"]);
    site.cli(&["admin", "org", "create", "acme"]);
    let revoked_user = site.cli(&[
        "admin", "user", "create", "--org", "acme", "--email", "u@x", "--role", "member",
    ]);
    let kept_user = site.cli(&["admin", "token", "create", "--email", "u@x"]);
    let cluster = site.cli(&["admin", "cluster", "create", "--org", "acme"]);

    let before = serve(&site).await;
    let revoked_session = before.login(&revoked_op).await;
    let kept_session = before.login(&kept_op).await;
    site.cli(&["backup"]);

    let id = |token: &str| stategate::tokens::id_of(&stategate::tokens::hash(token.as_bytes()));
    site.cli(&["admin", "operator", "token", "revoke", &id(&revoked_op)]);
    site.cli(&["admin", "token", "revoke", &id(&revoked_user)]);
    assert_eq!(before.admin(&revoked_op).await, 401);
    assert!(!before.session_live(&revoked_session).await);
    assert_eq!(before.cluster(&cluster, &revoked_user).await, 401);

    let restored = site.new_index(dir.path(), "restored");
    let out = site.cli(&["restore", "--into", &restored]);
    assert!(out.contains("Re-applied 2 revocation(s)"), "{out}");
    before.stop.send(true).unwrap();
    site.swap_in(&restored, &dir.path().join("aside"));

    let after = serve(&site).await;
    // (case, status, expected)
    let table = [
        (
            "revoked operator token",
            after.admin(&revoked_op).await,
            401,
        ),
        ("kept operator token", after.admin(&kept_op).await, 200),
        (
            "revoked user token",
            after.cluster(&cluster, &revoked_user).await,
            401,
        ),
    ];
    for (case, got, want) in table {
        assert_eq!(got, want, "{case}");
    }
    let kept = after.cluster(&cluster, &kept_user).await;
    assert_ne!(kept, 401, "kept user token");
    assert!(
        !after.session_live(&revoked_session).await,
        "revoked session"
    );
    assert!(
        !after.session_live(&kept_session).await,
        "no session opened before the restore outlives it"
    );
    // Logging in again works, and the listing still names the revoked tokens.
    assert!(after.session_live(&after.login(&kept_op).await).await);
    let listed = site.cli(&["admin", "operator", "token", "list", "--json"]);
    let revoked: Vec<serde_json::Value> = listed
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|t| t["revoked_at"].is_string())
        .collect();
    assert_eq!(revoked.len(), 1, "{listed}");
    assert_eq!(revoked[0]["id"], id(&revoked_op));
    after.stop.send(true).unwrap();
}

/// Issue 37: a narrowing made after the newest backup survives a restore, like a
/// revocation. Backup → `set-role` an admin to viewer, narrow a limited operator's
/// patterns, cap a single sign-on operator, remove a consumer → restore → swap in:
/// each still holds (the tokens get 403 where they got 200/404), audited as
/// re-applied by the restore; an operator nobody narrowed keeps what it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_does_not_undo_narrowings_made_after_the_backup() {
    let dir = tempfile::tempdir().unwrap();
    let mut site = Site::new(dir.path());
    let demoted = site.cli(&["admin", "operator", "create", "--email", "d@x"]);
    let kept = site.cli(&["admin", "operator", "create", "--email", "k@x"]);
    let limited = site.cli(&[
        "admin",
        "operator",
        "create",
        "--email",
        "l@x",
        "--role",
        "operator",
        "--workspaces",
        "team-*",
    ]);
    let sso = site.cli(&["admin", "operator", "create", "--email", "s@x"]);
    site.cli(&["workspace", "consumers", "set", "prod", "app-a,app-b"]);
    // Linked as a single sign-on would have linked it (its grant follows its groups).
    common::index_connection(&site.config())
        .execute(
            "INSERT INTO operator_sso (operator_id, issuer, subject, last_login_at)
             SELECT id, 'https://id.example.com', 's1', 'then' FROM operators WHERE email = 's@x'",
            [],
        )
        .unwrap();

    let before = serve(&site).await;
    site.cli(&["backup"]);
    // (token, path, status before the narrowing)
    let checks = [
        (&demoted, "keys", 200, 403),
        (&kept, "keys", 200, 200),
        (&limited, "workspaces/team-b-1", 404, 403),
        (&limited, "workspaces/team-a-1", 404, 404),
        (&sso, "keys", 200, 403),
    ];
    for (token, path, was, _) in &checks {
        assert_eq!(before.admin_at(token, path).await, *was, "{path} before");
    }
    site.cli(&[
        "admin", "operator", "set-role", "--email", "d@x", "--role", "viewer",
    ]);
    site.cli(&[
        "admin",
        "operator",
        "set-role",
        "--email",
        "l@x",
        "--role",
        "operator",
        "--workspaces",
        "team-a-*",
    ]);
    let capped = site.stategate(
        DEK,
        &[
            "admin", "operator", "set-role", "--email", "s@x", "--role", "viewer",
        ],
    );
    ok(&capped, "set-role on a single sign-on operator");
    assert!(capped.stderr.contains("set its cap"), "{}", capped.stderr);
    site.cli(&["workspace", "consumers", "set", "prod", "app-a"]);
    for (token, path, _, now) in &checks {
        assert_eq!(before.admin_at(token, path).await, *now, "{path} narrowed");
    }

    let restored = site.new_index(dir.path(), "restored");
    let out = site.cli(&["restore", "--into", &restored]);
    assert!(
        out.contains("Re-applied 4 role, cap or consumers change(s)"),
        "{out}"
    );
    before.stop.send(true).unwrap();
    site.swap_in(&restored, &dir.path().join("aside"));

    let after = serve(&site).await;
    for (token, path, _, now) in &checks {
        assert_eq!(
            after.admin_at(token, path).await,
            *now,
            "{path} after the restore"
        );
    }
    assert_eq!(
        site.cli(&["workspace", "consumers", "list", "prod"]),
        "app-a"
    );
    let listed = site.cli(&["admin", "operator", "list", "--json"]);
    let s_row = listed
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["email"] == "s@x")
        .unwrap();
    assert_eq!(
        (&s_row["role"], &s_row["cap"]["role"]),
        (&serde_json::json!("viewer"), &serde_json::json!("viewer")),
        "{listed}"
    );
    // Audited as the restore's: the operators' three, the workspace's one.
    let audit = site.cli(&["admin", "audit", "list", "--json"]);
    let reapplied: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["actor"] == "stategate restore")
        .collect();
    assert_eq!(
        reapplied
            .iter()
            .filter(|r| r["event"] == "admin.operator_role_reapplied")
            .count(),
        3,
        "{audit}"
    );
    assert_eq!(
        reapplied
            .iter()
            .filter(|r| r["event"] == "tf.consumers_set")
            .count(),
        1,
        "{audit}"
    );
    // A second restore from the same backup re-applies the same, no more.
    let again = site.new_index(dir.path(), "again");
    let out = site.cli(&["restore", "--into", &again]);
    assert!(
        out.contains("Re-applied 4 role, cap or consumers change(s)"),
        "{out}"
    );
    after.stop.send(true).unwrap();
}

/// After a lost disk the natural move is `restore --into <data_dir>/stategate.db`: it
/// is allowed when neither the index (nor its log) nor a server is there, and refused
/// otherwise without writing anything.
#[test]
fn restore_into_a_lost_data_dir_only_when_no_index_and_no_server_is_there() {
    common::sqlite_only("`restore --into <data_dir>/stategate.db` beside a leftover -wal");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let blobs = dir.path().join("blobs");
    let cmd = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_stategate"));
        c.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("STATEGATE_DATA_DIR", &data)
            .env("STATEGATE_STORE_PATH", &blobs)
            .env("STATEGATE_LISTEN", "127.0.0.1:0")
            .env("STATEGATE_BACKUP_INTERVAL_SECONDS", "0")
            .env("STATEGATE_DEK", DEK);
        c
    };
    let run = |args: &[&str]| {
        let out = cmd(args).output().unwrap();
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8(out.stdout).unwrap(),
            stderr: String::from_utf8(out.stderr).unwrap(),
        }
    };
    ok(&run(&["admin", "org", "create", "acme"]), "org create");
    ok(&run(&["backup"]), "backup");
    let live = data.join("stategate.db");
    let live_arg = live.to_str().unwrap().to_string();
    let restore = ["restore", "--into", live_arg.as_str()];

    // The index is there: refused, nothing changed.
    let before = std::fs::read(&live).unwrap();
    one_line_error(&run(&restore), "is the live index and", "index present");
    assert_eq!(std::fs::read(&live).unwrap(), before);

    // The disk is lost (the key comes from the environment, the blobs live elsewhere).
    std::fs::remove_dir_all(&data).unwrap();
    let done = run(&restore);
    ok(&done, "restore into the lost data dir");
    assert!(
        done.stdout.contains("It is the index of") && !done.stdout.contains("To use it"),
        "{}",
        done.stdout
    );
    let orgs: i64 = stategate::store::sql::Connection::open(&live)
        .unwrap()
        .query_row("SELECT count(*) FROM orgs WHERE name = 'acme'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(orgs, 1);

    // A leftover log of the old index: refused (it would be replayed into the new one).
    std::fs::remove_file(&live).unwrap();
    std::fs::write(data.join("stategate.db-wal"), b"old log").unwrap();
    one_line_error(&run(&restore), "stategate.db-wal exists", "old log present");
    assert!(!live.exists());
    std::fs::remove_file(data.join("stategate.db-wal")).unwrap();

    // A live server on the data dir whose index went missing under it: refused.
    let mut server = cmd(&["serve"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !data.join("address").exists() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "server did not start"
        );
        assert!(server.try_wait().unwrap().is_none(), "server exited");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for file in ["stategate.db", "stategate.db-wal", "stategate.db-shm"] {
        let _ = std::fs::remove_file(data.join(file));
    }
    one_line_error(
        &run(&restore),
        "a stategate server is running on",
        "server running",
    );
    assert!(!live.exists());
    server.kill().unwrap();
    server.wait().unwrap();
    ok(&run(&restore), "restore once the server is gone");
    assert!(live.exists());
}

/// Every listing is a table for a person by default — times as `2026-12-01 18:21
/// UTC`, never the stored RFC 3339 with nanoseconds — and JSON lines with `--json`.
#[test]
fn listings_are_tables_with_readable_times_and_json_lines_for_scripts() {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::new(dir.path());
    for args in [
        &["admin", "org", "create", "acme"][..],
        &[
            "admin",
            "user",
            "create",
            "--org",
            "acme",
            "--email",
            "a@acme.example",
            "--role",
            "admin",
        ],
        &["admin", "operator", "create", "--email", "op@acme.example"],
        &[
            "admin", "cluster", "create", "--org", "acme", "--name", "edge",
        ],
        &["backup"],
    ] {
        ok(&site.stategate(DEK, args), &format!("{args:?}"));
    }
    // (listing, its header's first column, the JSON field holding a time)
    let listings: &[(&[&str], &str, &str)] = &[
        (&["admin", "org", "list"], "ORG", "created_at"),
        (&["admin", "token", "list"], "TOKEN ID", "created_at"),
        (
            &["admin", "operator", "token", "list"],
            "TOKEN ID",
            "created_at",
        ),
        (&["admin", "cluster", "list"], "CLUSTER", "created_at"),
        (&["admin", "audit", "list"], "AT", "at"),
        (&["backup", "list"], "BACKUP", "taken_at"),
    ];
    for (args, first_column, time_field) in listings {
        let json_args: Vec<&str> = args.iter().copied().chain(["--json"]).collect();
        let scripted = site.stategate(DEK, &json_args);
        ok(&scripted, &format!("{json_args:?}"));
        let rows: Vec<serde_json::Value> = scripted
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{args:?}: {l}: {e}")))
            .collect();
        assert!(!rows.is_empty(), "{args:?}");
        let table = site.stategate(DEK, args);
        ok(&table, &format!("{args:?}"));
        let lines: Vec<&str> = table.stdout.lines().collect();
        assert!(
            lines[0].starts_with(first_column),
            "{args:?}: {}",
            table.stdout
        );
        assert_eq!(lines.len(), rows.len() + 1, "{args:?}: {}", table.stdout);
        for row in &rows {
            let stored = row[*time_field].as_str().unwrap();
            assert!(stored.ends_with('Z'), "{args:?}: {stored}");
            let shown = format!("{} {} UTC", &stored[..10], &stored[11..16]);
            assert!(
                table.stdout.contains(&shown),
                "{args:?}: {shown} in\n{}",
                table.stdout
            );
            assert!(!table.stdout.contains(stored), "{args:?}: {}", table.stdout);
        }
    }
}

#[test]
fn operator_create_takes_a_role_and_patterns_and_refuses_bad_ones_creating_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::new(dir.path());
    let create = |args: &[&str]| {
        let mut all = vec!["admin", "operator", "create"];
        all.extend_from_slice(args);
        site.stategate(DEK, &all)
    };
    let run = create(&["--email", "old@x.io"]);
    ok(&run, "create without a role");
    assert!(run.stdout.trim().starts_with("sgo_"), "{}", run.stdout);
    let run = create(&[
        "--email",
        "v@x.io",
        "--role",
        "viewer",
        "--workspaces",
        "dev-*, stage",
    ]);
    ok(&run, "create a limited viewer");
    for (args, needle) in [
        (
            &["--email", "a@x.io", "--role", "root"][..],
            "unknown role: use viewer, operator or admin",
        ),
        (
            &["--email", "a@x.io", "--role", "Viewer"][..],
            "unknown role",
        ),
        (
            &[
                "--email",
                "a@x.io",
                "--role",
                "viewer",
                "--workspaces",
                "prod/x",
            ][..],
            "invalid workspace pattern",
        ),
        (
            &[
                "--email",
                "a@x.io",
                "--role",
                "viewer",
                "--workspaces",
                "dev-*,,x",
            ][..],
            "invalid workspace pattern",
        ),
        (
            &[
                "--email",
                "a@x.io",
                "--role",
                "viewer",
                "--workspaces",
                "a?",
            ][..],
            "invalid workspace pattern",
        ),
    ] {
        let run = create(args);
        one_line_error(&run, needle, &format!("{args:?}"));
        assert!(run.stdout.is_empty(), "{args:?}: no token printed");
    }
    let run = site.stategate(DEK, &["admin", "operator", "list", "--json"]);
    ok(&run, "operator list");
    let rows: Vec<serde_json::Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let shown: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["email"].as_str().unwrap(),
                r["role"].as_str().unwrap(),
                r["workspaces"].as_str().unwrap(),
            )
        })
        .collect();
    // Nothing was created by the refused commands.
    assert_eq!(
        shown,
        [
            ("old@x.io", "admin", ""),
            ("v@x.io", "viewer", "dev-*,stage")
        ]
    );
    // The operator from before gets a role; a bad one changes nothing.
    let set = |args: &[&str]| {
        let mut all = vec!["admin", "operator", "set-role", "--email", "old@x.io"];
        all.extend_from_slice(args);
        site.stategate(DEK, &all)
    };
    one_line_error(&set(&["--role", "boss"]), "unknown role", "set-role boss");
    ok(
        &set(&["--role", "operator", "--workspaces", "prod-*"]),
        "set-role",
    );
    let run = site.stategate(DEK, &["admin", "operator", "list"]);
    ok(&run, "operator list as a table");
    let table: Vec<Vec<&str>> = run
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        table[0],
        ["EMAIL", "ROLE", "WORKSPACES", "CREATED"],
        "{}",
        run.stdout
    );
    assert_eq!(
        table[1][..3],
        ["old@x.io", "operator", "prod-*"],
        "{}",
        run.stdout
    );
    assert_eq!(
        table[2][..3],
        ["v@x.io", "viewer", "dev-*,stage"],
        "{}",
        run.stdout
    );
    let audit = site.stategate(DEK, &["admin", "audit", "list", "--scope", "operators"]);
    ok(&audit, "audit list");
    assert_eq!(
        audit.stdout.matches("admin.operator_created").count(),
        2,
        "{}",
        audit.stdout
    );
}

/// A revocation is recorded in the store before it commits (`installation::records`),
/// silently; when the store cannot take it the token is revoked all the same (a leaked
/// token must stop working now) and the command says what a restore would undo.
#[test]
fn a_revocation_the_store_cannot_record_still_holds_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let email = "ops@example.org";
    let run = stategate(
        &data,
        DEK,
        &["admin", "operator", "create", "--email", email],
    );
    ok(&run, "operator create");
    let run = stategate(
        &data,
        DEK,
        &["admin", "operator", "token", "create", "--email", email],
    );
    ok(&run, "second token");
    let ids = |data: &Path| -> Vec<(String, bool)> {
        let run = stategate(data, DEK, &["admin", "operator", "token", "list", "--json"]);
        ok(&run, "token list");
        run.stdout
            .lines()
            .map(|l| {
                let row: serde_json::Value = serde_json::from_str(l).unwrap();
                (
                    row["id"].as_str().unwrap().to_string(),
                    row["revoked_at"].is_string(),
                )
            })
            .collect()
    };
    let listed = ids(&data);
    assert_eq!(listed.len(), 2, "{listed:?}");

    let run = stategate(
        &data,
        DEK,
        &["admin", "operator", "token", "revoke", &listed[0].0],
    );
    ok(&run, "revoke, recorded");
    assert!(!run.stderr.contains("warning"), "{}", run.stderr);
    assert!(
        std::fs::read_dir(data.join("blobs")).unwrap().count() > 0,
        "the revocation is recorded in the store"
    );

    // The store cannot be opened (its directory is a file now).
    std::fs::remove_dir_all(data.join("blobs")).unwrap();
    std::fs::write(data.join("blobs"), b"").unwrap();
    let run = stategate(
        &data,
        DEK,
        &["admin", "operator", "token", "revoke", &listed[1].0],
    );
    ok(&run, "revoke, not recorded");
    assert!(
        run.stderr.starts_with(
            "warning: the revocation is in force but could not be recorded in the blob store"
        ) && run.stderr.contains("`stategate backup`"),
        "{}",
        run.stderr
    );
    assert!(ids(&data).iter().all(|(_, revoked)| *revoked));
}
