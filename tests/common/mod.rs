//! In-process test server: the real gateway on 127.0.0.1:0 over a temp data dir.
#![allow(dead_code)]

pub mod drift;
pub mod engine;
pub mod roles;

use std::sync::Arc;

use stategate::config::Config;
use stategate::crypto::RootKey;
use stategate::http::App;
use stategate::server;

pub struct TestServer {
    pub base: String,
    pub app: Arc<App>,
    pub config: Config,
    pub root: RootKey,
    pub dir: tempfile::TempDir,
    _shutdown: tokio::sync::watch::Sender<bool>,
    /// Last: the PostgreSQL pass's database goes after everything else of the server.
    _database: Option<TestDatabase>,
}

/// Whether this run puts the index on PostgreSQL: `STATEGATE_TEST_INDEX=postgres`
/// (the second pass of `scripts/test-all.sh`); unset or `sqlite`, the data dir's file.
pub fn postgres_pass() -> bool {
    match std::env::var("STATEGATE_TEST_INDEX").as_deref() {
        Err(_) | Ok("" | "sqlite") => false,
        Ok("postgres") => true,
        Ok(other) => panic!("STATEGATE_TEST_INDEX={other}: expected sqlite or postgres"),
    }
}

/// The index every [`TestServer`] and [`engine::engine`] opens in this run: the data
/// dir's SQLite file, or (on the PostgreSQL pass) a new empty database of its own,
/// which the pass requires, dropped with the returned guard.
pub fn test_index() -> (stategate::config::IndexConfig, Option<TestDatabase>) {
    if !postgres_pass() {
        return (stategate::config::IndexConfig::default(), None);
    }
    let base = std::env::var("STATEGATE_TEST_POSTGRES_URL").expect(
        "STATEGATE_TEST_INDEX=postgres needs STATEGATE_TEST_POSTGRES_URL \
         (scripts/test-all.sh starts one; see docs/testing.md)",
    );
    let (name, url) = create_database(&base);
    let index = stategate::config::IndexConfig {
        kind: stategate::config::IndexKind::Postgres,
        url: Some(url.into()),
        ca_file: None,
    };
    (index, Some(TestDatabase { base, name }))
}

/// A database the PostgreSQL pass made for one test: dropped when the test is done
/// with it, whatever still holds a session there (hundreds of tests would otherwise
/// leave hundreds of databases, some 8 MB each, on the server).
pub struct TestDatabase {
    /// The server's URL, naming the database the test's was made from.
    base: String,
    name: String,
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let (base, name) = (self.base.clone(), self.name.clone());
        // Off the test's async runtime, as the PostgreSQL client blocks on its own; a
        // failure leaves the database behind and fails no test.
        let dropped = std::thread::spawn(move || {
            stategate::store::sql::Connection::connect_postgres(&base, None)
                .map_err(|e| e.to_string())
                .and_then(|admin| {
                    admin
                        .execute_batch(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .map_err(|e| e.to_string())
                })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("the test's database stays: {e}");
        }
    }
}

/// Marks a test about the SQLite file itself (its backups as files, its rebuild, its
/// WAL), run through the CLI on a data dir of its own: the switch moves only
/// [`TestServer`]'s and the engine's index, so it runs on SQLite in both passes. `why`
/// is the one-line reason, printed on the PostgreSQL pass.
pub fn sqlite_only(why: &str) {
    if postgres_pass() {
        eprintln!("on SQLite in the PostgreSQL pass too: {why}");
    }
}

pub const DEK: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

impl TestServer {
    pub async fn start() -> TestServer {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> TestServer {
        Self::start_with_clock(adjust, Arc::new(stategate::cluster::SystemClock)).await
    }

    /// With an injected clock (lease staleness without sleeping).
    pub async fn start_with_clock(
        adjust: impl FnOnce(&mut Config),
        clock: Arc<dyn stategate::cluster::Clock>,
    ) -> TestServer {
        Self::start_full(adjust, clock, |_| {}).await
    }

    /// With the built [`App`] changed before it serves (e.g. pass-through protection
    /// that `serve` only builds for an S3 store).
    pub async fn start_with_app(
        adjust: impl FnOnce(&mut Config),
        adjust_app: impl FnOnce(&mut App),
    ) -> TestServer {
        Self::start_full(
            adjust,
            Arc::new(stategate::cluster::SystemClock),
            adjust_app,
        )
        .await
    }

    async fn start_full(
        adjust: impl FnOnce(&mut Config),
        clock: Arc<dyn stategate::cluster::Clock>,
        adjust_app: impl FnOnce(&mut App),
    ) -> TestServer {
        let (index, database) = test_index();
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config {
            data_dir: dir.path().join("data"),
            dek: Some(DEK.into()),
            index,
            ..Config::default()
        };
        adjust(&mut config);
        let mut app = server::build_app_with_clock(&config, clock).await.unwrap();
        adjust_app(Arc::get_mut(&mut app).expect("the app is not shared yet"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(server::serve_listener(listener, app.clone(), rx));
        TestServer {
            base,
            app,
            config,
            root: RootKey::from_base64(DEK).unwrap(),
            dir,
            _shutdown: tx,
            _database: database,
        }
    }

    pub fn url(&self, workspace: &str) -> String {
        format!("{}/api/v1/tf/state/{workspace}", self.base)
    }

    pub fn bearer(&self, workspace: &str) -> String {
        self.root.workspace_bearer(workspace)
    }

    /// A request to a workspace with its correct credential as Basic auth.
    pub fn tf(&self, method: &str, workspace: &str) -> reqwest::RequestBuilder {
        reqwest::Client::new()
            .request(method.parse().unwrap(), self.url(workspace))
            .basic_auth("stategate", Some(self.bearer(workspace)))
    }

    /// A request to a workspace with `password` as Basic auth, or with no credential:
    /// the hostile rows' request.
    pub fn tf_as(
        &self,
        method: &str,
        workspace: &str,
        password: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let req = reqwest::Client::new().request(method.parse().unwrap(), self.url(workspace));
        match password {
            Some(p) => req.basic_auth("stategate", Some(p)),
            None => req,
        }
    }

    /// A new operator token for `email` (an operator that exists already).
    pub async fn operator_token(&self, email: &'static str) -> String {
        self.app
            .operator
            .admin_write(move |c| {
                stategate::operator::identity::create_operator_token(c, email, "test")
            })
            .await
            .unwrap()
    }

    /// Revokes an operator token by its value.
    pub async fn revoke_operator_token(&self, token: &str) {
        let id = stategate::tokens::id_of(&stategate::tokens::hash(token.as_bytes()));
        self.app
            .operator
            .admin_write(move |c| {
                stategate::operator::identity::revoke_operator_token(c, &id, "test")
            })
            .await
            .unwrap();
    }

    /// A connection of its own to this server's index, whichever kind it is (usable
    /// on the test's async thread): raw SQL here is in the shared dialect.
    pub fn db(&self) -> stategate::store::sql::Connection {
        index_connection(&self.config)
    }

    pub fn count(&self, sql: &str) -> i64 {
        self.db().query_row(sql, [], |r| r.get(0)).unwrap()
    }

    /// Every blob file in the local store. A directory's spare (the empty file the next
    /// write there claims) is not a blob; one with content fails the test.
    /// The store's files that requests wrote: not the root key's fingerprint, which
    /// the installation records when it is first opened.
    pub fn blob_files(&self) -> Vec<std::path::PathBuf> {
        let store = self.config.local_store_path();
        let fingerprint = store.join(stategate::store::keyring::FINGERPRINT_COPY);
        let mut files = files_under(&store);
        files.retain(|f| *f != fingerprint);
        files.retain(|f| {
            let spare = f.file_name().is_some_and(|n| n == ".tmp-spare");
            assert!(
                !spare || std::fs::metadata(f).map_or(0, |m| m.len()) == 0,
                "spare {f:?} has content"
            );
            !spare
        });
        files
    }
}

/// Every file below `root`, sorted.
/// The variable `name` that points a test at a real component (Garage, PostgreSQL),
/// started by `scripts/test-all.sh`. Unset: the test says so and is passed over
/// (`None`), unless `CI` or `require` is set, where the component must be there and
/// the test fails.
pub fn real_component(name: &str, require: &str, what: &str) -> Option<String> {
    if let Ok(value) = std::env::var(name) {
        return Some(value);
    }
    let required = std::env::var_os("CI").is_some() || std::env::var_os(require).is_some();
    assert!(
        !required,
        "{name} not set but a real {what} is required here"
    );
    eprintln!("{name} not set: skipping the {what} test (run scripts/test-all.sh)");
    None
}

/// A connection of its own to the index `config` names (see [`TestServer::db`]).
pub fn index_connection(config: &Config) -> stategate::store::sql::Connection {
    stategate::store::index::Index::of(config)
        .connect()
        .unwrap()
}

/// The variables that point a `stategate` command at the index `config` names (none
/// for the data dir's SQLite file), for a test that runs the binary beside a server.
pub fn index_env(config: &Config) -> Vec<(&'static str, String)> {
    match (config.index.kind, &config.index.url) {
        (stategate::config::IndexKind::Postgres, Some(url)) => vec![
            ("STATEGATE_INDEX", "postgres".into()),
            ("STATEGATE_INDEX_URL", url.expose().into()),
        ],
        _ => Vec::new(),
    }
}

/// A backup of the index `config` names, as `serve` takes one (a PostgreSQL index
/// copied into a SQLite snapshot); its scratch files in the data dir.
pub async fn take_backup(
    config: &Config,
    blobs: &dyn stategate::store::BlobStore,
    root: &RootKey,
) -> stategate::store::backup::BackupInfo {
    let snapshot = stategate::store::index::Index::of(config)
        .snapshot(&stategate::schema::INDEX, &config.data_dir);
    stategate::store::backup::take_backup_from(snapshot, blobs, root)
        .await
        .unwrap()
}

/// A new empty database on the test server; `None` (said) when there is no server.
pub fn new_postgres_database() -> Option<String> {
    let base = real_component(
        "STATEGATE_TEST_POSTGRES_URL",
        "STATEGATE_TEST_REQUIRE_POSTGRES",
        "PostgreSQL",
    )?;
    Some(create_database(&base).1)
}

/// A new empty database on the server `base` names: its name and URL.
fn create_database(base: &str) -> (String, String) {
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    // Off the test's async runtime: the PostgreSQL client blocks on a runtime of its own.
    let made = name.clone();
    let base2 = base.to_string();
    std::thread::spawn(move || {
        let admin = stategate::store::sql::Connection::connect_postgres(&base2, None).unwrap();
        admin
            .execute_batch(&format!("CREATE DATABASE {made}"))
            .unwrap();
    })
    .join()
    .unwrap();
    let url = with_database(base, &name);
    (name, url)
}

/// `url` naming database `name` instead (its query, e.g. `?sslmode=disable`, kept).
pub fn with_database(url: &str, name: &str) -> String {
    let (path, query) = url
        .split_once('?')
        .map_or((url, None), |(p, q)| (p, Some(q)));
    let (prefix, _) = path.rsplit_once('/').expect("a URL with a database name");
    match query {
        Some(q) => format!("{prefix}/{name}?{q}"),
        None => format!("{prefix}/{name}"),
    }
}

pub fn files_under(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// `at` as the index writes its times: RFC 3339 in UTC, to the second.
pub fn rfc3339(at: time::OffsetDateTime) -> String {
    at.to_offset(time::UtcOffset::UTC)
        .replace_nanosecond(0)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

pub fn state(serial: u64, lineage: &str, resources: &str) -> String {
    format!(
        r#"{{"version":4,"terraform_version":"1.15.0","serial":{serial},"lineage":"{lineage}","outputs":{{}},"resources":[{resources}],"check_results":null}}"#
    )
}

pub fn lock_info(id: &str) -> String {
    format!(
        r#"{{"ID":"{id}","Operation":"OperationTypeApply","Info":"","Who":"tester@host","Version":"1.15.0","Created":"2026-11-30T00:00:00Z","Path":""}}"#
    )
}

/// Sends one raw HTTP/1.1 request (no client-side path normalization): `head`, then
/// `body` written concurrently with reading the answer (the server may answer and stop
/// reading early). Returns the status code and the whole response text.
pub async fn raw_request(base: &str, head: &str, body: Option<Vec<u8>>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = sock.into_split();
    wr.write_all(head.as_bytes()).await.unwrap();
    let writer = tokio::spawn(async move {
        if let Some(body) = body {
            let _ = wr.write_all(&body).await;
        }
        wr
    });
    let mut out = Vec::new();
    // A reset after an early answer still leaves that answer in `out`.
    let _ = rd.read_to_end(&mut out).await;
    drop(writer.await);
    let text = String::from_utf8_lossy(&out).to_string();
    (status_line_code(&text), text)
}

/// The status code of a raw HTTP response text (0 if there is none).
pub fn status_line_code(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Sends a request; returns its status code and body text.
pub async fn status(req: reqwest::RequestBuilder) -> (u16, String) {
    let resp = req.send().await.unwrap();
    let code = resp.status().as_u16();
    (code, resp.text().await.unwrap())
}

/// Polls `done` every 5 ms until it holds; fails after `within`, naming `what`.
pub async fn wait_until(what: &str, within: std::time::Duration, done: impl Fn() -> bool) {
    let patience = std::time::Instant::now() + within;
    while !done() {
        assert!(
            std::time::Instant::now() < patience,
            "waited {within:?} for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A gateway and the admin API token of one operator (made with the default role):
/// the setup the freeze and timeline tests share.
pub struct AdminEnv {
    pub server: TestServer,
    pub token: String,
}

impl AdminEnv {
    pub async fn start(email: &'static str) -> AdminEnv {
        let server = TestServer::start().await;
        let token = server
            .app
            .operator
            .admin_write(move |c| stategate::operator::identity::create_operator(c, email, "test"))
            .await
            .unwrap();
        AdminEnv { server, token }
    }

    /// One admin API call as this operator: (status, body).
    pub async fn admin(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, String) {
        let url = format!("{}/api/v1/admin/{path}", self.server.base);
        let mut req = reqwest::Client::new()
            .request(method.parse().unwrap(), url)
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.body(b.to_string());
        }
        status(req).await
    }
}

/// A web UI session of the operator whose token is `token`: a client that sends the
/// session's cookie and follows no redirect.
pub async fn ui_session(base: &str, token: &str) -> reqwest::Client {
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = plain
        .post(format!("{base}/ui/login"))
        .form(&[("token", token)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303, "the login is refused");
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    let session = cookie.split(';').next().unwrap().to_string();
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("cookie", session.parse().unwrap());
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .default_headers(headers)
        .build()
        .unwrap()
}
