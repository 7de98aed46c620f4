//! Load harness: a real `stategate serve` on 127.0.0.1 with a fresh data dir, driven
//! over HTTP, every figure printed next to the floor this machine measured in the same run.
//!
//!     cargo build --release && cargo bench --bench load            # full run, ~6 min
//!     cargo bench --bench load -- --quick                          # smoke run, < 60 s
//!
//! Options (after `--`): `--quick`; `--bin PATH` (default `$STATEGATE_BIN`, else
//! `target/release/stategate` next to this bench); `--dir DIR` (where the data dirs go;
//! default the temp dir — put it on the disk you care about); `--secs S` per cell;
//! `--phases floor,cycles,get,rss,scale,big,timeline` (default all); `--cells 64x1,8x8`
//! (the cycle phase's clients×workspaces cells to run, `64x1-5ms` the paced one; default
//! all); `--postgres URL` (default `$STATEGATE_BENCH_POSTGRES_URL`; a PostgreSQL where
//! the index phase makes its databases); `--credential bearer,jwt,jwt-job` (what the
//! cycle phase's clients present; default `bearer`, the workspace's derived bearer):
//! `jwt` is a CI identity token per client for the whole cell (the check with the
//! issuer's key and the token's first-seen record already held), `jwt-job` a new token
//! for every cycle (each cycle a new CI job, its first request writing the token's
//! first-seen record). With either, each cell runs with the bearer first, then with each
//! token kind on fresh workspaces of the same server, and a ratio row compares them
//! (`--rounds N`: that sequence N times per cell, each token kind against the bearer of
//! its own round, so a drift of the machine's speed falls on both alike); the
//! server is given a `[[ci_identity]]` issuer, `integration/ci_issuer.py` started with
//! `--python PATH` (default `$STATEGATE_BENCH_PYTHON`, else `python3`, which needs the
//! `cryptography` package): a real issuer on loopback serving discovery and JWKS over
//! HTTPS under its own CA, which the server fetches as it would GitHub's, and which mints
//! the GitHub Actions-shaped RS256 tokens. With `STATEGATE_BENCH_S3_ENDPOINT`,
//! `_BUCKET`, `_ACCESS_KEY_ID`, `_SECRET_ACCESS_KEY` (and `_REGION`, default `garage`) the
//! floor also times raw PUT/GET of 100 KiB objects on that store.
//!
//! Phases:
//! 1. floor: fsynced 100 KiB blob writes/s with 1, 8 and 64 writers (temp file + fsync +
//!    rename + dir fsync, what `LocalStore` does), SQLite commits/s with the pragmas of
//!    `store/db.rs` (WAL, synchronous=FULL), the cycle floor (one LOCK → POST → UNLOCK
//!    cycle's durable steps in sequence, no HTTP and no hashing or sealing), the CPU
//!    floor of a GET (read + AES-256-GCM open + SHA-256 of 100 KiB), raw S3 PUT/GET
//!    latency when a store is given;
//! 2. cycles: LOCK → POST (100 KiB) → UNLOCK with 1, 8, 64 clients over 1 workspace and
//!    over one workspace per client; cycles/s, p50/p99 per request, ratio to the floor;
//! 3. get: GET of 100 KiB and 1 MiB states, 1 and 8 clients;
//! 4. rss: the server's VmHWM after a 1, 64 and 256 MiB state POST + GET (fresh server each);
//! 5. scale: the same write/GET figures with an empty index and with 10,000 workspaces ×
//!    100 versions (1M version rows + 1M audit rows inserted into the server's SQLite
//!    before it starts), and the time of `workspace history` / `admin audit list --scope`;
//! 6. big: LOCK → POST → UNLOCK of a 10,000-instance state (~5.6 MiB, modules, `count`,
//!    `for_each`, data sources) changing 3 instances per write, 1 client and 8 clients on
//!    8 workspaces, beside the POST CPU floor of that state with and without the resource
//!    timeline's summary (what the timeline costs a large state; the old server takes
//!    the same requests);
//! 7. timeline: 1M versions with their resource changes inserted into a stopped
//!    server's index (9,900 workspaces × 100 versions + one of 10,000 versions of a
//!    10,000-instance state), then `store::timeline::timeline_rows` timed (p50/p99) for
//!    `workspace timeline WS [ADDRESS]`, each query plan checked for index use and every
//!    p99 asserted < 20 ms; and the CLI's wall time (needs a binary with the timeline).
//! 8. index: the same 100 KiB cycles with the index in SQLite (one node), in PostgreSQL
//!    (one node) and in PostgreSQL shared by two nodes (clients spread over both, one
//!    local blob directory), and GETs of 100 KiB (1 and 8 clients, first node), each
//!    cell's ratio to SQLite's printed beside it; then
//!    again on two nodes after 1M version rows were put into that PostgreSQL index
//!    (what an index row costs as the index grows). Needs `--postgres`.
//!
//! Every workspace name is fresh per run (`b<run id>-…`) and every data dir is deleted at
//! the end (also when a phase fails), so a run stopped mid-cycle leaves no held lock on
//! anything another run reuses. The server is started with retention disabled
//! (`STATEGATE_RETENTION_INTERVAL_SECONDS=0`) so a background prune does not land in a cell.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::{Client, Method, StatusCode};
use stategate::crypto::RootKey;

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;
const DEK: [u8; 32] = [0x5a; 32];

/// What an interrupted run must still clean up: the servers it started and its root dir.
static LIVE: std::sync::Mutex<(Vec<u32>, Option<PathBuf>)> =
    std::sync::Mutex::new((Vec::new(), None));

/// On Ctrl-C or SIGTERM: kill the servers, delete every data dir, exit 130.
fn clean_up_on_signal() {
    tokio::spawn(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        for pid in &live.0 {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        if let Some(root) = &live.1 {
            let _ = std::fs::remove_dir_all(root);
        }
        eprintln!("interrupted: servers stopped, data dirs removed");
        std::process::exit(130);
    });
}

// ---------------------------------------------------------------------------------------
// Options and report

struct Opts {
    quick: bool,
    bin: PathBuf,
    base: PathBuf,
    secs: f64,
    phases: Vec<String>,
    cells: Option<Vec<String>>,
    postgres: Option<String>,
    /// What the cycle phase's clients present, in the order run (the bearer first).
    credentials: Vec<Cred>,
    /// How many times each cell runs its credential sequence.
    rounds: usize,
    python: PathBuf,
}

/// A credential kind the cycle phase can present (`--credential`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cred {
    /// The workspace's derived bearer (what every other phase presents).
    Bearer,
    /// One CI identity token per client for the whole cell.
    Jwt,
    /// A new CI identity token for every cycle.
    JwtJob,
}

impl Cred {
    fn parse(name: &str) -> Cred {
        match name {
            "bearer" => Cred::Bearer,
            "jwt" => Cred::Jwt,
            "jwt-job" => Cred::JwtJob,
            other => panic!("--credential {other:?}: use bearer, jwt or jwt-job"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Cred::Bearer => "bearer",
            Cred::Jwt => "jwt",
            Cred::JwtJob => "jwt-job",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Cred::Bearer => "workspace bearer",
            Cred::Jwt => "CI identity JWT, one per client",
            Cred::JwtJob => "CI identity JWT, a new one per cycle",
        }
    }
}

impl Opts {
    fn parse() -> Opts {
        let mut quick = false;
        let mut bin = std::env::var_os("STATEGATE_BIN").map(PathBuf::from);
        let mut base = std::env::temp_dir();
        let mut secs = None;
        let mut phases = "floor,cycles,get,rss,scale,big,timeline,index".to_string();
        let mut cells = None;
        let mut postgres = std::env::var("STATEGATE_BENCH_POSTGRES_URL").ok();
        let mut credentials = vec![Cred::Bearer];
        let mut rounds = 1;
        let mut python = std::env::var_os("STATEGATE_BENCH_PYTHON")
            .map_or_else(|| PathBuf::from("python3"), PathBuf::from);
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => quick = true,
                "--bin" => bin = args.next().map(PathBuf::from),
                "--dir" => base = PathBuf::from(args.next().expect("--dir DIR")),
                "--secs" => secs = args.next().and_then(|s| s.parse().ok()),
                "--phases" => phases = args.next().expect("--phases LIST"),
                "--cells" => {
                    let list = args.next().expect("--cells LIST (e.g. 64x1,8x8)");
                    cells = Some(list.split(',').map(str::to_string).collect());
                }
                "--postgres" => postgres = args.next(),
                "--credential" => {
                    let list = args.next().expect("--credential LIST (e.g. jwt,jwt-job)");
                    // The bearer always runs first: the token kinds are stated against it.
                    credentials = vec![Cred::Bearer];
                    for c in list.split(',').map(Cred::parse) {
                        if !credentials.contains(&c) {
                            credentials.push(c);
                        }
                    }
                }
                "--rounds" => {
                    rounds = args
                        .next()
                        .and_then(|n| n.parse().ok())
                        .filter(|n| *n > 0)
                        .expect("--rounds N (1 or more)")
                }
                "--python" => python = PathBuf::from(args.next().expect("--python PATH")),
                "--bench" => {} // cargo bench passes it
                other => panic!("unknown argument {other:?} (see the header of benches/load.rs)"),
            }
        }
        let bin = bin.unwrap_or_else(default_bin);
        assert!(
            bin.exists(),
            "no stategate binary at {} (cargo build --release, or --bin / STATEGATE_BIN)",
            bin.display()
        );
        Opts {
            quick,
            bin,
            base,
            secs: secs.unwrap_or(if quick { 0.7 } else { 4.0 }),
            phases: phases.split(',').map(str::to_string).collect(),
            cells,
            postgres,
            credentials,
            rounds,
            python,
        }
    }

    /// Whether the cycle phase presents CI identity tokens (the server then trusts an issuer).
    fn uses_jwt(&self) -> bool {
        self.credentials.iter().any(|c| *c != Cred::Bearer)
    }

    fn runs(&self, phase: &str) -> bool {
        self.phases.iter().any(|p| p == phase)
    }

    /// Whether the cycle phase runs its `clients`×`workspaces` cell (named `64x1`, or
    /// `64x1-5ms` for a retry other than the default 500 µs).
    fn runs_cell(&self, clients: usize, workspaces: usize, retry_us: u64) -> bool {
        let name = match retry_us {
            500 => format!("{clients}x{workspaces}"),
            us => format!("{clients}x{workspaces}-{}ms", us / 1000),
        };
        self.cells.as_ref().is_none_or(|c| c.contains(&name))
    }

    fn cell(&self) -> Duration {
        Duration::from_secs_f64(self.secs)
    }
}

/// `target/release/stategate` beside the bench executable (`target/release/deps/load-…`).
fn default_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let release = exe.parent().and_then(Path::parent).expect("target dir");
    release.join("stategate")
}

/// Rows of the final table: what, figure, floor, ratio.
#[derive(Default)]
struct Report {
    rows: Vec<[String; 4]>,
}

impl Report {
    fn row(&mut self, what: impl Into<String>, figure: String, floor: String, ratio: String) {
        let row = [what.into(), figure, floor, ratio];
        println!("  {} | {} | {} | {}", row[0], row[1], row[2], row[3]);
        self.rows.push(row);
    }

    fn print(&self) {
        println!("\n| measurement | figure | floor | ratio |\n|---|---|---|---|");
        for r in &self.rows {
            println!("| {} | {} | {} | {} |", r[0], r[1], r[2], r[3]);
        }
    }
}

fn ratio(figure: f64, floor: f64) -> String {
    if floor > 0.0 {
        format!("{:.2}x", figure / floor)
    } else {
        "-".into()
    }
}

/// Latency samples in seconds.
#[derive(Default, Clone)]
struct Samples(Vec<f64>);

impl Samples {
    fn push(&mut self, d: Duration) {
        self.0.push(d.as_secs_f64());
    }
    fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }
    fn pct(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let mut v = self.0.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1]
    }
    fn ms(&self) -> String {
        format!(
            "p50 {:.2} / p99 {:.2} ms",
            self.pct(50.0) * 1e3,
            self.pct(99.0) * 1e3
        )
    }
}

// ---------------------------------------------------------------------------------------
// Floors

/// What `LocalStore::put` does for a new blob: temp file, write, fsync, rename, dir fsync.
fn durable_write(dir: &Path, name: &str, data: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".tmp-{name}"));
    let mut file = std::fs::File::create_new(&tmp)?;
    file.write_all(data)?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Fsynced 100 KiB blob writes per second with `writers` threads, each in its own
/// directory (a workspace's blobs share one directory in `LocalStore`), and the CPU
/// seconds each write took (user + kernel: the file's creation, the copy, the fsyncs).
fn fsync_floor(base: &Path, writers: usize, cell: Duration) -> (f64, f64) {
    let root = tempfile::tempdir_in(base).unwrap();
    let data = vec![0xa5u8; 100 * KIB];
    let done = AtomicU64::new(0);
    let cpu = cpu_seconds_of("/proc/self/stat");
    let started = Instant::now();
    std::thread::scope(|s| {
        for w in 0..writers {
            let dir = root.path().join(format!("w{w}"));
            std::fs::create_dir(&dir).unwrap();
            let (data, done) = (&data, &done);
            s.spawn(move || {
                let mut i = 0u64;
                while started.elapsed() < cell {
                    durable_write(&dir, &format!("{i:012}.blob"), data).unwrap();
                    done.fetch_add(1, Relaxed);
                    i += 1;
                }
            });
        }
    });
    let writes = done.load(Relaxed) as f64;
    let cpu = cpu_seconds_of("/proc/self/stat") - cpu;
    (
        writes / started.elapsed().as_secs_f64(),
        cpu / writes.max(1.0),
    )
}

/// A database in `dir` with the engine's tables and the pragmas of `store/db.rs`.
fn floor_db(dir: &Path) -> stategate::store::sql::Connection {
    let conn = stategate::store::sql::Connection::open(dir.join("floor.db")).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    conn.execute_batch(stategate::store::db::SCHEMA).unwrap();
    conn
}

/// A row shaped like a state write's, numbered `?1`.
const FLOOR_VERSION_ROW: &str =
    "INSERT INTO versions (scope, version, serial, lineage, sha256, size, blob_key, created_at, actor)
     VALUES ('tf/floor', ?1, ?1, 'l', 'x', 102400, 'k', 'now', 'bench')";

/// `sql` (bound to `n`) in its own durable transaction, as the engine's writer commits.
fn commit_one(conn: &stategate::store::sql::Connection, sql: &str, n: i64) {
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    conn.execute(sql, [n]).unwrap();
    conn.execute_batch("COMMIT").unwrap();
}

/// Runs `once(n)` for n = 0, 1, … until `cell` has passed; returns runs per second.
fn per_second(cell: Duration, mut once: impl FnMut(i64)) -> f64 {
    let started = Instant::now();
    let mut n = 0i64;
    while started.elapsed() < cell {
        once(n);
        n += 1;
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// Serial SQLite commits per second, each one INSERT into a table shaped like `versions`,
/// with the pragmas of `store/db.rs`.
fn sqlite_floor(base: &Path, cell: Duration) -> f64 {
    let dir = tempfile::tempdir_in(base).unwrap();
    let conn = floor_db(dir.path());
    per_second(cell, |n| commit_one(&conn, FLOOR_VERSION_ROW, n))
}

/// One LOCK → POST → UNLOCK cycle's durable steps and nothing else, in sequence, one
/// writer: a lock-row commit, a blob write (`durable_write`), a version-row commit and a
/// lock-row delete commit, with the pragmas of `store/db.rs`. No HTTP, no hashing, no
/// sealing: what any server that keeps every 200 durable must wait for per cycle.
fn cycle_floor(base: &Path, cell: Duration) -> f64 {
    let dir = tempfile::tempdir_in(base).unwrap();
    let conn = floor_db(dir.path());
    conn.execute_batch("CREATE TABLE locks (workspace TEXT PRIMARY KEY, info TEXT NOT NULL)")
        .unwrap();
    let blobs = dir.path().join("blobs");
    std::fs::create_dir(&blobs).unwrap();
    let data = vec![0xa5u8; 100 * KIB];
    per_second(cell, |n| {
        commit_one(
            &conn,
            "INSERT INTO locks VALUES ('floor', 'lock ' || ?1)",
            n,
        );
        durable_write(&blobs, &format!("{n:012}.blob"), &data).unwrap();
        commit_one(&conn, FLOOR_VERSION_ROW, n);
        commit_one(
            &conn,
            "DELETE FROM locks WHERE workspace = 'floor' AND ?1 >= 0",
            n,
        );
    })
}

/// The CPU a GET of 100 KiB cannot avoid: read the blob from the page cache, AES-256-GCM
/// open, SHA-256 of the plaintext. Per second, one thread.
fn get_cpu_floor(base: &Path, cell: Duration) -> f64 {
    use aes_gcm::aead::{Aead, KeyInit};
    use sha2::Digest;
    let dir = tempfile::tempdir_in(base).unwrap();
    let cipher = aes_gcm::Aes256Gcm::new(&[7u8; 32].into());
    let nonce = aes_gcm::Nonce::from([1u8; 12]);
    let sealed = cipher.encrypt(&nonce, &vec![b'x'; 100 * KIB][..]).unwrap();
    let path = dir.path().join("blob");
    std::fs::write(&path, &sealed).unwrap();
    per_second(cell, |_| {
        let blob = std::fs::read(&path).unwrap();
        let plain = cipher.decrypt(&nonce, &blob[..]).unwrap();
        std::hint::black_box(sha2::Sha256::digest(&plain));
    })
}

/// The CPU a state POST of 100 KiB cannot avoid, with stategate's own code: verify
/// Terraform's Content-MD5, scan the state for serial and lineage, SHA-256 and seal it
/// (AES-256-GCM chunks) — no I/O. With the load generator's share, it bounds how many
/// cycles per second the machine's cores can carry at all (the `ceiling` rows). Without
/// `md5`: the part that must finish before the blob can be fsynced (the trailer holds
/// the serial and lineage; Content-MD5 could be checked beside the fsync).
fn post_cpu_floor(cell: Duration, md5: bool) -> f64 {
    post_cpu_of(&state(100 * KIB, 1, "lineage-floor"), cell, md5, false)
}

/// [`post_cpu_floor`] of `body`; with `resources`, the scan also takes the resource
/// timeline's summary (every instance's address and keyed digest, as the server's
/// write path does since issue 23), so the two figures give that summary's own cost.
fn post_cpu_of(body: &[u8], cell: Duration, md5: bool, resources: bool) -> f64 {
    use stategate::store::format::{BlobIdentity, Sealer};
    let key = RootKey::from_bytes(DEK).blob_key("tf/floor");
    let id = BlobIdentity {
        scope: "tf/floor".into(),
        version: 1,
        created_at: "2026-01-01T00:00:00Z".into(),
        actor: "bench".into(),
        parent: None,
        facts: Default::default(),
    };
    per_second(cell, |_| {
        if md5 {
            std::hint::black_box(content_md5(body));
        }
        let meta = if resources {
            let mut scanner =
                stategate::tfstate::StateScanner::with_resources(key.resource_digest_key());
            scanner.push(body).unwrap();
            let (meta, summary) = scanner.finish_with_resources().unwrap();
            assert!(summary.is_some_and(|s| !s.is_empty()), "a summary");
            meta
        } else {
            let mut scanner = stategate::tfstate::StateScanner::new();
            scanner.push(body).unwrap();
            scanner.finish().unwrap()
        };
        let (mut sealer, head) = Sealer::new(&key, &id).unwrap();
        let sealed = sealer.push(body).unwrap();
        let (tail, _) = sealer
            .finish(Some(meta.serial), Some(meta.lineage))
            .unwrap();
        std::hint::black_box((head, sealed, tail));
    })
}

/// Raw PUT and GET of 100 KiB objects straight on the S3 store given in the environment.
async fn s3_floor(report: &mut Report, cell: Duration) {
    let var = |k: &str| std::env::var(format!("STATEGATE_BENCH_S3_{k}")).ok();
    let (Some(endpoint), Some(bucket), Some(id), Some(secret)) = (
        var("ENDPOINT"),
        var("BUCKET"),
        var("ACCESS_KEY_ID"),
        var("SECRET_ACCESS_KEY"),
    ) else {
        println!("  (no STATEGATE_BENCH_S3_* store given: raw S3 floor skipped)");
        return;
    };
    let region = var("REGION").unwrap_or_else(|| "garage".into());
    let creds = aws_credential_types::Credentials::new(id, secret, None, None, "bench");
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(aws_sdk_s3::config::Region::new(region))
        .credentials_provider(creds)
        .force_path_style(true)
        .build();
    let s3 = aws_sdk_s3::Client::from_conf(conf);
    let data = Bytes::from(vec![0xa5u8; 100 * KIB]);
    let (mut put, mut get) = (Samples::default(), Samples::default());
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < cell {
        let key = format!("bench-floor/{}-{i}", std::process::id());
        let t = Instant::now();
        s3.put_object()
            .bucket(&bucket)
            .key(&key)
            .body(data.clone().into())
            .send()
            .await
            .expect("S3 PUT");
        put.push(t.elapsed());
        let t = Instant::now();
        let body = s3
            .get_object()
            .bucket(&bucket)
            .key(&key)
            .send()
            .await
            .expect("S3 GET");
        let got = body.body.collect().await.expect("S3 GET body").into_bytes();
        get.push(t.elapsed());
        assert_eq!(got.len(), data.len());
        let _ = s3.delete_object().bucket(&bucket).key(&key).send().await;
        i += 1;
    }
    report.row("raw S3 PUT 100 KiB", put.ms(), "-".into(), "-".into());
    report.row("raw S3 GET 100 KiB", get.ms(), "-".into(), "-".into());
}

struct Floors {
    fsync: Vec<(usize, f64)>,
    /// CPU seconds per fsynced blob write, by writer count (as `fsync`).
    write_cpu: Vec<(usize, f64)>,
    sqlite: f64,
    /// [`cycle_floor`]: cycles/s of the durable steps alone, one writer.
    cycle: f64,
    get_cpu: f64,
    /// [`post_cpu_floor`]: POST bodies/s one core can check, hash and seal.
    post_cpu: f64,
    /// The same without Content-MD5: what must precede the blob's fsync.
    post_cpu_serial: f64,
}

impl Floors {
    /// The fsync floor with `writers` writers (the nearest measured count at or below).
    fn fsync_for(&self, writers: usize) -> f64 {
        nearest_at_or_below(&self.fsync, writers)
    }

    /// CPU seconds of one fsynced blob write with `writers` writers.
    fn write_cpu_for(&self, writers: usize) -> f64 {
        nearest_at_or_below(&self.write_cpu, writers)
    }
}

/// The figure measured with the nearest writer count at or below `writers`.
fn nearest_at_or_below(by_writers: &[(usize, f64)], writers: usize) -> f64 {
    by_writers
        .iter()
        .rfind(|(w, _)| *w <= writers)
        .map_or(0.0, |(_, r)| *r)
}

async fn floors(opts: &Opts, report: &mut Report) -> Floors {
    println!("\n== floor (this disk, this CPU, same run)");
    let (mut fsync, mut write_cpu) = (Vec::new(), Vec::new());
    for writers in [1, 8, 64] {
        let (rate, cpu) = fsync_floor(&opts.base, writers, opts.cell());
        report.row(
            format!("floor: fsynced 100 KiB blob writes, {writers} writer(s)"),
            format!("{rate:.0}/s ({:.0} µs CPU each)", cpu * 1e6),
            "-".into(),
            "-".into(),
        );
        fsync.push((writers, rate));
        write_cpu.push((writers, cpu));
    }
    let sqlite = sqlite_floor(&opts.base, opts.cell());
    report.row(
        "floor: SQLite commits (WAL, synchronous=FULL), serial",
        format!("{sqlite:.0}/s"),
        "-".into(),
        "-".into(),
    );
    let cycle = cycle_floor(&opts.base, opts.cell());
    report.row(
        "floor: one cycle's durable steps in sequence (commit, blob write, commit, commit), 1 writer",
        format!("{cycle:.0}/s"),
        format!("{:.0} fsyncs/s (1 writer)", fsync[0].1),
        ratio(cycle, fsync[0].1),
    );
    let get_cpu = get_cpu_floor(&opts.base, opts.cell());
    report.row(
        "floor: GET CPU (read + AES-GCM open + SHA-256 of 100 KiB), 1 thread",
        format!("{get_cpu:.0}/s"),
        "-".into(),
        "-".into(),
    );
    let post_cpu = post_cpu_floor(opts.cell(), true);
    let post_cpu_serial = post_cpu_floor(opts.cell(), false);
    report.row(
        "floor: POST CPU (Content-MD5 + state scan + SHA-256 + AES-GCM seal of 100 KiB), 1 thread",
        format!("{post_cpu:.0}/s ({post_cpu_serial:.0}/s without Content-MD5)"),
        "-".into(),
        "-".into(),
    );
    s3_floor(report, opts.cell()).await;
    Floors {
        fsync,
        write_cpu,
        sqlite,
        cycle,
        get_cpu,
        post_cpu,
        post_cpu_serial,
    }
}

// ---------------------------------------------------------------------------------------
// The server

struct Server {
    child: Child,
    url: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    /// `stategate serve` on a free loopback port with `data_dir` (created if missing).
    async fn start(opts: &Opts, data_dir: &Path) -> Server {
        Self::start_with(opts, data_dir, &[]).await
    }

    /// [`Server::start`] with more `STATEGATE_*` variables (the index, the store path).
    async fn start_with(opts: &Opts, data_dir: &Path, env: &[(&str, String)]) -> Server {
        std::fs::create_dir_all(data_dir).unwrap();
        let port = free_port();
        let log = std::fs::File::create(data_dir.join("server.log")).unwrap();
        let child = Command::new(&opts.bin)
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("STATEGATE_LISTEN", format!("127.0.0.1:{port}"))
            .env("STATEGATE_DATA_DIR", data_dir)
            .env("STATEGATE_DEK", RootKey::from_bytes(DEK).to_base64())
            .env("STATEGATE_MAX_STATE_BYTES", (300 * MIB).to_string())
            .env(
                "STATEGATE_MAX_INFLIGHT_BODY_BYTES",
                (2048 * MIB).to_string(),
            )
            .env("STATEGATE_RETENTION_INTERVAL_SECONDS", "0")
            .env("STATEGATE_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start stategate serve");
        LIVE.lock().unwrap().0.push(child.id());
        let server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let client = Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = client.get(format!("{}/healthz", server.url)).send().await {
                if r.status().is_success() {
                    return server;
                }
            }
            assert!(
                Instant::now() < deadline,
                "server did not come up; see {}/server.log",
                data_dir.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A line of /proc/<pid>/status in KiB (`VmHWM`, `VmRSS`).
    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// User + system CPU seconds the server has used so far (/proc/<pid>/stat).
    fn cpu_seconds(&self) -> f64 {
        cpu_seconds_of(&format!("/proc/{}/stat", self.pid()))
    }

    /// SIGTERM (a clean stop checkpoints SQLite), SIGKILL after 10 s.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// utime + stime of a /proc/<pid>/stat file, in seconds (clock ticks are 100 Hz on Linux).
fn cpu_seconds_of(stat: &str) -> f64 {
    let text = std::fs::read_to_string(stat).unwrap_or_default();
    // Fields after the `(comm)`; utime and stime are the 14th and 15th of the line.
    let rest = text.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (tick(11) + tick(12)) / 100.0
}

// ---------------------------------------------------------------------------------------
// A CI identity issuer

/// The audience the harness's tokens carry and its `[[ci_identity]]` accepts.
const CI_AUDIENCE: &str = "https://stategate.bench";

/// Runs `integration/ci_issuer.py`'s issuer (argv: its directory, the audience) and
/// mints on request: a line `COUNT RUN` on stdin answers COUNT tokens, one a line, with
/// GitHub Actions' claims for `acme/infra` on `refs/heads/main`, `run_id` `RUN-k`, an
/// hour of validity (a cell's tokens must not expire in it).
const ISSUER_DRIVER: &str = r#"
import json, sys
from pathlib import Path
from ci_issuer import Issuer
issuer = Issuer(Path(sys.argv[1]))
print(json.dumps({"issuer": issuer.url("gh"), "ca_file": str(issuer.ca_file)}), flush=True)
for line in sys.stdin:
    count, run = line.split()
    for k in range(int(count)):
        print(issuer.mint("gh", issuer.github(sys.argv[2], run_id=f"{run}-{k}", lifetime=3600)))
    sys.stdout.flush()
"#;

/// A real OIDC issuer on loopback (the integration tests' own, in its Python process):
/// its discovery document and JWKS over HTTPS under its own CA, which the server reads
/// as it reads GitHub's, and RS256 tokens it signs.
struct CiIssuer {
    child: Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    url: String,
    ca_file: PathBuf,
}

impl CiIssuer {
    fn start(opts: &Opts) -> CiIssuer {
        use std::io::BufRead as _;
        let dir = opts.base.join("ci-issuer");
        let mut child = Command::new(&opts.python)
            .args(["-u", "-c", ISSUER_DRIVER])
            .arg(&dir)
            .arg(CI_AUDIENCE)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/integration"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "start the CI issuer with {} (--python): {e}",
                    opts.python.display()
                )
            });
        LIVE.lock().unwrap().0.push(child.id());
        let stdin = child.stdin.take().expect("issuer stdin");
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("issuer stdout"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("the issuer's first line");
        let started: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| {
            panic!("the CI issuer did not start (needs the `cryptography` package): {line:?}")
        });
        CiIssuer {
            child,
            stdin,
            stdout,
            url: started["issuer"].as_str().expect("issuer URL").to_string(),
            ca_file: PathBuf::from(started["ca_file"].as_str().expect("CA file")),
        }
    }

    /// `count` tokens of distinct runs `run-0` … (the server records each by its hash).
    fn mint(&mut self, count: usize, run: &str) -> Vec<String> {
        use std::io::BufRead as _;
        writeln!(self.stdin, "{count} {run}").expect("ask the issuer");
        self.stdin.flush().expect("ask the issuer");
        (0..count)
            .map(|_| {
                let mut line = String::new();
                self.stdout.read_line(&mut line).expect("a minted token");
                let token = line.trim().to_string();
                assert!(token.starts_with("eyJ"), "not a token: {token:?}");
                token
            })
            .collect()
    }

    /// The server's configuration: this issuer, and one rule granting `write` on every
    /// workspace of the run to `acme/infra`'s main branch (the GitHub claims minted).
    fn config(&self, run: &str) -> String {
        format!(
            r#"[[ci_identity]]
name = "github"
issuer = "{}"
audience = "{CI_AUDIENCE}"
ca_file = "{}"
identity = "{{repository}}@{{ref}}#run {{run_id}}"
max_run_seconds = 3600

[[ci_identity.rules]]
claims = {{ repository = "acme/infra", ref = "refs/heads/main" }}
workspaces = "{run}-*"
scope = "write"
"#,
            self.url,
            self.ca_file.display()
        )
    }
}

impl Drop for CiIssuer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// Requests

fn run_id() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            % 0xffff_ffff
    )
}

/// A valid state of about `size` bytes; `serial` makes every write's content differ.
fn state(size: usize, serial: u64, lineage: &str) -> Bytes {
    let head = format!(
        r#"{{"version":4,"terraform_version":"1.15.0","serial":{serial},"lineage":"{lineage}","outputs":{{}},"resources":[{{"mode":"managed","type":"terraform_data","name":"pad","provider":"provider[\"terraform.io/builtin/terraform\"]","instances":[{{"attributes":{{"id":""#
    );
    let tail = r#""}}]}]}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(head.as_bytes());
    body.extend((0..pad).map(|i| b'a' + (i % 26) as u8));
    body.extend_from_slice(tail.as_bytes());
    Bytes::from(body)
}

/// A realistic large Terraform state: `instances` resource instances in the shapes
/// Terraform writes (root resources, `count`, `for_each`, a `for_each` module, data
/// sources), pretty-printed as Terraform does, each instance with a handful of
/// attributes, ~450 bytes. Every instance has an 8-digit `revision` attribute whose
/// offsets are kept, so a write can change a few of them in place (what the resource
/// timeline must then find among all the others).
struct BigState {
    /// The `resources` array's elements (between `[` and `]`).
    resources: Vec<u8>,
    /// Offset in `resources` of each instance's revision digits.
    revisions: Vec<usize>,
}

/// Instances a write of a [`BigState`] changes.
const BIG_EDITS: usize = 3;

impl BigState {
    fn new(instances: usize) -> BigState {
        let mut out = BigState {
            resources: Vec::with_capacity(instances * 480),
            revisions: Vec::with_capacity(instances),
        };
        let mut left = instances;
        let l = &mut left;
        out.group(l, "", "managed", "aws_vpc", "main", 1, None);
        out.group(
            l,
            "module.net",
            "managed",
            "aws_subnet",
            "private",
            100,
            Some(false),
        );
        out.group(l, "", "data", "aws_ami", "base", 1, None);
        let mut m = 0;
        while *l > 0 {
            let module = format!("module.svc[\"svc-{m:03}\"]");
            out.group(
                l,
                &module,
                "managed",
                "aws_instance",
                "web",
                200,
                Some(false),
            );
            out.group(
                l,
                &module,
                "managed",
                "aws_security_group_rule",
                "ingress",
                100,
                Some(true),
            );
            out.group(l, &module, "managed", "aws_route53_record", "a", 1, None);
            out.group(
                l,
                &module,
                "data",
                "aws_iam_policy_document",
                "assume",
                1,
                None,
            );
            m += 1;
            if m == 20 {
                out.group(
                    l,
                    "",
                    "managed",
                    "aws_s3_object",
                    "obj",
                    usize::MAX,
                    Some(true),
                );
            }
        }
        assert_eq!(out.revisions.len(), instances);
        out
    }

    /// One resource of up to `n` instances (index keys: `None` = single, `Some(false)`
    /// = `count`, `Some(true)` = `for_each`), fewer when `left` runs out.
    #[allow(clippy::too_many_arguments)]
    fn group(
        &mut self,
        left: &mut usize,
        module: &str,
        mode: &str,
        kind: &str,
        name: &str,
        n: usize,
        keys: Option<bool>,
    ) {
        let n = n.min(*left);
        if n == 0 {
            return;
        }
        *left -= n;
        let r = &mut self.resources;
        if !r.is_empty() {
            r.extend_from_slice(b",");
        }
        let module_line = if module.is_empty() {
            String::new()
        } else {
            format!(
                "\n      \"module\": {},",
                serde_json::to_string(module).unwrap()
            )
        };
        r.extend_from_slice(
            format!(
                "\n    {{{module_line}\n      \"mode\": \"{mode}\",\n      \"type\": \"{kind}\",\n      \"name\": \"{name}\",\n      \"provider\": \"provider[\\\"registry.terraform.io/hashicorp/aws\\\"]\",\n      \"instances\": ["
            )
            .as_bytes(),
        );
        for i in 0..n {
            if i > 0 {
                r.extend_from_slice(b",");
            }
            let key = match keys {
                None => String::new(),
                Some(false) => format!("\n          \"index_key\": {i},"),
                Some(true) => format!("\n          \"index_key\": \"{name}-{i:05}\","),
            };
            let id = self.revisions.len();
            let head = format!(
                "\n        {{{key}\n          \"schema_version\": 1,\n          \"attributes\": {{\n            \"arn\": \"arn:aws:{kind}:eu-west-1:123456789012:{name}/{id:08x}\",\n            \"id\": \"{kind}-{id:08x}\",\n            \"instance_type\": \"t3.micro\",\n            \"private_ip\": \"10.{}.{}.{}\",\n            \"revision\": \"",
                id >> 16,
                (id >> 8) & 0xff,
                id & 0xff
            );
            r.extend_from_slice(head.as_bytes());
            self.revisions.push(r.len());
            r.extend_from_slice(b"00000000");
            r.extend_from_slice(
                format!(
                    "\",\n            \"tags\": {{\n              \"Name\": \"{name}-{id}\",\n              \"env\": \"prod\"\n            }}\n          }},\n          \"sensitive_attributes\": [],\n          \"dependencies\": [\n            \"module.net.aws_subnet.private\"\n          ]\n        }}"
                )
                .as_bytes(),
            );
        }
        r.extend_from_slice(b"\n      ]\n    }");
    }

    /// Bytes of a whole state.
    fn len(&self) -> usize {
        self.body(1, "lineage", &self.resources).len()
    }

    /// Write `serial` changes [`BIG_EDITS`] instances' revision to `serial`, spread
    /// over the state.
    fn edit(&self, resources: &mut [u8], serial: u64) {
        let n = self.revisions.len() as u64;
        for e in 0..BIG_EDITS as u64 {
            let at = self.revisions[((serial * 7919 + e * 104_729) % n) as usize];
            resources[at..at + 8]
                .copy_from_slice(format!("{:08}", serial % 100_000_000).as_bytes());
        }
    }

    fn body(&self, serial: u64, lineage: &str, resources: &[u8]) -> Bytes {
        let head = format!(
            "{{\n  \"version\": 4,\n  \"terraform_version\": \"1.15.0\",\n  \"serial\": {serial},\n  \"lineage\": \"{lineage}\",\n  \"outputs\": {{}},\n  \"resources\": ["
        );
        let tail = b"\n  ],\n  \"check_results\": null\n}\n";
        let mut body = Vec::with_capacity(head.len() + resources.len() + tail.len());
        body.extend_from_slice(head.as_bytes());
        body.extend_from_slice(resources);
        body.extend_from_slice(tail);
        Bytes::from(body)
    }
}

fn content_md5(body: &[u8]) -> String {
    use base64::Engine;
    use md5::Digest;
    base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(body))
}

#[derive(Clone)]
struct Api {
    client: Client,
    url: String,
    root: RootKey,
    /// A CI identity token presented instead of the workspace's bearer, as Terraform
    /// sends `TF_HTTP_PASSWORD` (HTTP Basic).
    token: Option<Arc<str>>,
}

impl Api {
    fn new(url: &str) -> Api {
        Api {
            client: Client::builder()
                .pool_max_idle_per_host(256)
                .build()
                .unwrap(),
            url: url.to_string(),
            root: RootKey::from_bytes(DEK),
            token: None,
        }
    }

    fn request(&self, method: &str, ws: &str, query: &str) -> reqwest::RequestBuilder {
        let request = self.client.request(
            Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}/api/v1/tf/state/{ws}{query}", self.url),
        );
        match &self.token {
            Some(token) => request.basic_auth("ci", Some(&**token)),
            None => request.bearer_auth(self.root.workspace_bearer(ws)),
        }
    }

    async fn send(&self, method: &str, ws: &str, query: &str, body: Bytes) -> (StatusCode, Bytes) {
        let r = self
            .request(method, ws, query)
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {ws}: {e}"));
        let status = r.status();
        (status, r.bytes().await.unwrap_or_default())
    }

    /// A state write as Terraform's http backend sends it (`Content-MD5`, JSON type). The
    /// MD5 is the caller's, so a timed POST does not include the client hashing.
    async fn send_state(
        &self,
        ws: &str,
        query: &str,
        body: Bytes,
        md5: String,
    ) -> (StatusCode, Bytes) {
        let r = self
            .request("POST", ws, query)
            .header("content-type", "application/json")
            .header("content-md5", md5)
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {ws}: {e}"));
        let status = r.status();
        (status, r.bytes().await.unwrap_or_default())
    }

    async fn post(&self, ws: &str, body: Bytes) {
        let md5 = content_md5(&body);
        let (status, text) = self.send_state(ws, "", body, md5).await;
        assert_eq!(status, StatusCode::OK, "POST {ws}: {text:?}");
    }

    async fn get(&self, ws: &str) -> usize {
        let r = self.request("GET", ws, "").send().await.expect("GET");
        assert_eq!(r.status(), StatusCode::OK, "GET {ws}");
        r.bytes().await.expect("GET body").len()
    }
}

#[derive(Default)]
struct CycleStats {
    cycles: u64,
    refused: u64,
    lock: Samples,
    post: Samples,
    unlock: Samples,
    /// [`Body::Big`]: each workspace's first (untimed) write, every instance added.
    first: Samples,
    elapsed: f64,
}

/// What each cycle POSTs.
#[derive(Clone)]
enum Body {
    /// [`state`] of this many bytes: one resource instance, new content every write.
    Pad(usize),
    /// A [`BigState`]: every write changes a few attributes of a few instances.
    Big(Arc<BigState>),
}

impl Body {
    fn size(&self) -> usize {
        match self {
            Body::Pad(size) => *size,
            Body::Big(big) => big.len(),
        }
    }
}

/// What the clients of [`cycles`] present.
#[derive(Clone)]
enum Presented {
    /// The workspace's derived bearer.
    Bearer,
    /// Client `i` presents token `i` in every request of the cell.
    PerClient(Arc<Vec<String>>),
    /// Each cycle takes a token of its own from the pool (kept across its refused
    /// LOCKs' retries, as one CI job keeps its token).
    PerCycle(Arc<std::sync::Mutex<Vec<String>>>),
}

/// LOCK → POST (`body`) → UNLOCK cycles by `clients` tasks for `cell`; client `i` uses
/// workspace `i % workspaces`, presenting `presented`. A LOCK refused (423: another
/// client holds it) is retried after `retry`.
/// With [`Body::Big`], each workspace first gets one untimed write of the whole state
/// (every instance added: its time is `CycleStats::first`), so the timed cycles
/// change a few instances each, as applies of a large configuration do.
async fn cycles(
    apis: &[Api],
    prefix: &str,
    (clients, workspaces): (usize, usize),
    body: Body,
    cell: Duration,
    retry: Duration,
    presented: &Presented,
) -> CycleStats {
    // Like Terraform, each write sends the workspace's current serial + 1 and its lineage
    // (the write guard refuses anything else); the lock orders the clients of one workspace.
    let serials: Arc<Vec<std::sync::atomic::AtomicU64>> =
        Arc::new((0..workspaces).map(|_| Default::default()).collect());
    let mut first = Samples::default();
    if let Body::Big(big) = &body {
        for (w, serial) in serials.iter().enumerate() {
            let ws = format!("{prefix}-w{w}");
            let content = big.body(1, &format!("lineage-{prefix}-w{w}"), &big.resources);
            let t = Instant::now();
            apis[0].post(&ws, content).await;
            first.push(t.elapsed());
            serial.store(1, Relaxed);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        // Over several nodes, each client talks to one of them (as behind a balancer).
        let mut api = apis[c % apis.len()].clone();
        if let Presented::PerClient(tokens) = presented {
            api.token = Some(tokens[c].as_str().into());
        }
        let presented = presented.clone();
        let (stop, serials, body) = (stop.clone(), serials.clone(), body.clone());
        let w = c % workspaces;
        let ws = format!("{prefix}-w{w}");
        let lineage = format!("lineage-{prefix}-w{w}");
        tasks.push(tokio::spawn(async move {
            let mut st = CycleStats::default();
            // This client's copy of the big state's resources, edited a little per write.
            let mut resources = match &body {
                Body::Big(big) => big.resources.clone(),
                Body::Pad(_) => Vec::new(),
            };
            let mut new_job = true;
            while !stop.load(Relaxed) {
                if let (Presented::PerCycle(pool), true) = (&presented, new_job) {
                    let token = pool.lock().unwrap().pop().expect(
                        "the minted tokens ran out (the pool is twice the bearer's cycles)",
                    );
                    api.token = Some(token.into());
                    new_job = false;
                }
                let id = uuid::Uuid::new_v4().to_string();
                let info = Bytes::from(format!(
                    r#"{{"ID":"{id}","Operation":"OperationTypeApply","Info":"","Who":"bench@load","Version":"1.15.0","Created":"2026-01-01T00:00:00Z","Path":""}}"#
                ));
                let t = Instant::now();
                let (status, text) = api.send("LOCK", &ws, "", info.clone()).await;
                match status {
                    StatusCode::OK => st.lock.push(t.elapsed()),
                    StatusCode::LOCKED => {
                        st.refused += 1;
                        tokio::time::sleep(retry).await;
                        continue;
                    }
                    other => panic!("LOCK {ws}: {other} {text:?}"),
                }
                let serial = serials[w].fetch_add(1, Relaxed) + 1;
                let body = match &body {
                    Body::Pad(size) => state(*size, serial, &lineage),
                    Body::Big(big) => {
                        big.edit(&mut resources, serial);
                        big.body(serial, &lineage, &resources)
                    }
                };
                let md5 = content_md5(&body);
                let t = Instant::now();
                let (status, text) = api.send_state(&ws, &format!("?ID={id}"), body, md5).await;
                assert_eq!(status, StatusCode::OK, "POST {ws}: {text:?}");
                st.post.push(t.elapsed());
                let t = Instant::now();
                let (status, text) = api.send("UNLOCK", &ws, "", info).await;
                assert_eq!(status, StatusCode::OK, "UNLOCK {ws}: {text:?}");
                st.unlock.push(t.elapsed());
                st.cycles += 1;
                new_job = true;
            }
            st
        }));
    }
    tokio::time::sleep(cell).await;
    stop.store(true, Relaxed);
    let mut all = CycleStats::default();
    for t in tasks {
        let st = t.await.expect("client task");
        all.cycles += st.cycles;
        all.refused += st.refused;
        all.lock.extend(st.lock);
        all.post.extend(st.post);
        all.unlock.extend(st.unlock);
    }
    all.elapsed = started.elapsed().as_secs_f64();
    all.first = first;
    all
}

struct GetStats {
    rate: f64,
    lat: Samples,
}

async fn gets(api: &Api, ws: &str, clients: usize, expect: usize, cell: Duration) -> GetStats {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (api, stop, ws) = (api.clone(), stop.clone(), ws.to_string());
        tasks.push(tokio::spawn(async move {
            let mut lat = Samples::default();
            while !stop.load(Relaxed) {
                let t = Instant::now();
                assert_eq!(api.get(&ws).await, expect);
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    tokio::time::sleep(cell).await;
    stop.store(true, Relaxed);
    let mut lat = Samples::default();
    for t in tasks {
        lat.extend(t.await.expect("GET task"));
    }
    GetStats {
        rate: lat.0.len() as f64 / started.elapsed().as_secs_f64(),
        lat,
    }
}

// ---------------------------------------------------------------------------------------
// Phases

/// A CI identity token's first request (untimed): reads the issuer's keys when none are
/// held, and writes the token's first-seen record.
async fn warm_token(api: &Api, ws: &str, token: &str) {
    let api = Api {
        token: Some(token.into()),
        ..api.clone()
    };
    let r = api.request("GET", ws, "").send().await.expect("GET");
    // No state yet: 404 once the token is accepted (a refused one is a 401).
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "the CI token was not accepted"
    );
}

async fn cycle_phase(
    opts: &Opts,
    server: &Server,
    run: &str,
    floors: Option<&Floors>,
    mut issuer: Option<&mut CiIssuer>,
    report: &mut Report,
) {
    println!("\n== LOCK → POST (100 KiB) → UNLOCK cycles");
    let api = &Api::new(&server.url);
    // Refused LOCKs are retried after 500 µs, far sooner than any real client (Terraform
    // waits 1 s, then doubles): with 64 clients on one workspace the refusals' rate is
    // then set by how fast the server answers them, so a server that refuses faster
    // gets more of them, and they and the load generator's share of the cores slow the
    // holder. The same cell with a 5 ms retry shows the holder's cycle at a refusal
    // rate the clients set.
    let cells: &[(usize, usize, u64)] = &[
        (1, 1, 500),
        (8, 1, 500),
        (8, 8, 500),
        (64, 1, 500),
        (64, 1, 5000),
        (64, 64, 500),
    ];
    for (i, &(clients, workspaces, retry_us)) in cells.iter().enumerate() {
        if !opts.runs_cell(clients, workspaces, retry_us) {
            continue;
        }
        // The cell's bearer run: what each token kind is stated against.
        let mut bearer: Option<(f64, f64, u64)> = None;
        let sequence = (0..opts.rounds).flat_map(|r| opts.credentials.iter().map(move |c| (r, *c)));
        for (round, cred) in sequence {
            // Fresh workspaces per credential kind and round; the bearer's first keep
            // their old names.
            let prefix = match (round, cred) {
                (0, Cred::Bearer) => format!("{run}-c{i}"),
                (r, other) => format!("{run}-c{i}-{}{r}", other.name()),
            };
            let presented = match (cred, issuer.as_deref_mut()) {
                (Cred::Bearer, _) => Presented::Bearer,
                (Cred::Jwt, Some(issuer)) => {
                    let tokens = issuer.mint(clients, &prefix);
                    for (c, token) in tokens.iter().enumerate() {
                        warm_token(api, &format!("{prefix}-w{}", c % workspaces), token).await;
                    }
                    Presented::PerClient(Arc::new(tokens))
                }
                (Cred::JwtJob, Some(issuer)) => {
                    // The key is held (a token of its own fetched it); the cycles' tokens are new.
                    let warm = issuer.mint(1, &format!("{prefix}-warm"));
                    warm_token(api, &format!("{prefix}-warm"), &warm[0]).await;
                    let cycles = bearer.map_or(opts.secs as u64 * 1000, |b| b.2);
                    let pool = issuer.mint(2 * cycles as usize + 2 * clients + 64, &prefix);
                    Presented::PerCycle(Arc::new(std::sync::Mutex::new(pool)))
                }
                (_, None) => unreachable!("a CI issuer is started for --credential jwt"),
            };
            let (server_cpu, own_cpu) = (server.cpu_seconds(), cpu_seconds_of("/proc/self/stat"));
            let st = cycles(
                std::slice::from_ref(api),
                &prefix,
                (clients, workspaces),
                Body::Pad(100 * KIB),
                opts.cell(),
                Duration::from_micros(retry_us),
                &presented,
            )
            .await;
            let server_cpu = server.cpu_seconds() - server_cpu;
            let own_cpu = cpu_seconds_of("/proc/self/stat") - own_cpu;
            let rate = st.cycles as f64 / st.elapsed;
            let server_per_cycle = server_cpu * 1e6 / st.cycles.max(1) as f64;
            let presenting = match (opts.uses_jwt(), opts.rounds) {
                (false, _) => String::new(),
                (true, 1) => format!(", {}", cred.describe()),
                (true, _) => format!(", {}, round {}", cred.describe(), round + 1),
            };
            let floor = floors.map_or(0.0, |f| f.fsync_for(clients.min(workspaces)));
            // One client can go no faster than the durable steps of a cycle in sequence.
            let steps = match floors {
                Some(f) if clients == 1 => format!("; {} of the cycle floor", ratio(rate, f.cycle)),
                _ => String::new(),
            };
            let paced = match retry_us {
                500 => String::new(),
                us => format!(", refused LOCKs retried after {} ms", us / 1000),
            };
            report.row(
            format!("cycles, {clients} client(s), {workspaces} workspace(s){paced}{presenting}"),
            format!(
                "{rate:.0}/s (LOCK {}; POST {}; UNLOCK {}; {} LOCKs refused; CPU/cycle: server {server_per_cycle:.0} µs, load generator {:.0} µs{steps})",
                st.lock.ms(),
                st.post.ms(),
                st.unlock.ms(),
                st.refused,
                own_cpu * 1e6 / st.cycles.max(1) as f64,
            ),
            format!("{floor:.0} fsyncs/s ({} writer(s))", clients.min(workspaces).min(64)),
            ratio(rate, floor),
        );
            match (cred, bearer) {
            (Cred::Bearer, _) => bearer = Some((rate, server_per_cycle, st.cycles)),
            (_, Some((bearer_rate, bearer_cpu, _))) => report.row(
                format!("… {} vs workspace bearer: {clients} client(s), {workspaces} workspace(s){paced}", presenting.trim_start_matches(", ")),
                format!(
                    "{rate:.0} vs {bearer_rate:.0} cycles/s; server CPU/cycle {server_per_cycle:.0} vs {bearer_cpu:.0} µs ({})",
                    ratio(server_per_cycle, bearer_cpu)
                ),
                "cycles/s of the bearer".into(),
                ratio(rate, bearer_rate),
            ),
            (_, None) => {}
        }
            if cred != Cred::Bearer || round > 0 {
                continue;
            }
            if let (Some(f), 1) = (floors, clients) {
                // One client waits for each cycle's durable steps in turn, and before the
                // blob's fsync the body must be scanned, hashed and sealed: no server can
                // make one client's cycle shorter than both.
                let ceiling = 1.0 / (1.0 / f.cycle + 1.0 / f.post_cpu_serial);
                report.row(
                "ceiling: 1 client if a cycle were only its durable steps and its POST's CPU floor before the fsync",
                format!(
                    "{ceiling:.0}/s ({:.0} µs durable steps + {:.0} µs scan, SHA-256 and seal)",
                    1e6 / f.cycle,
                    1e6 / f.post_cpu_serial
                ),
                format!("{floor:.0} fsyncs/s"),
                ratio(ceiling, floor),
            );
            }
            if let (Some(f), true) = (floors, workspaces > 1) {
                // Every cycle needs its POST's CPU floor and its blob write's CPU on some
                // core, and the load generator (on the same cores here) its measured share:
                // no server can go faster. (Commits are left out: group commit shares them.)
                let generator = own_cpu / st.cycles.max(1) as f64;
                let write = f.write_cpu_for(workspaces);
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
                let ceiling = cores / (1.0 / f.post_cpu + write + generator);
                report.row(
                format!("ceiling: {clients} clients if the server spent only the POST CPU floor and a blob write's CPU per cycle"),
                format!(
                    "{ceiling:.0}/s ({cores:.0} cores; {:.0} µs POST floor + {:.0} µs blob write + {:.0} µs load generator per cycle)",
                    1e6 / f.post_cpu,
                    write * 1e6,
                    generator * 1e6
                ),
                format!("{floor:.0} fsyncs/s"),
                ratio(ceiling, floor),
            );
            }
        }
    }
}

/// What the shared-plan cell measured: plan cycles (LOCK → GET → UNLOCK) by the plan
/// holders, apply cycles (LOCK → POST → UNLOCK) by the one applier.
#[derive(Default)]
struct SharedStats {
    plans: CycleStats,
    apply: CycleStats,
}

/// `holders` plan clients (LOCK with `OperationTypePlan` → GET → UNLOCK, again and
/// again) and one applier (LOCK → POST → UNLOCK, its refused LOCKs retried after
/// `retry`) on one workspace for `cell`: shared holders' lock cost, and whether an
/// apply still gets in between plans.
async fn shared_cycles(
    api: &Api,
    ws: &str,
    holders: usize,
    cell: Duration,
    retry: Duration,
) -> SharedStats {
    let lineage = format!("lineage-{ws}");
    api.post(ws, state(10 * KIB, 1, &lineage)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let lock_info = |op: &str| {
        let id = uuid::Uuid::new_v4().to_string();
        Bytes::from(format!(
            r#"{{"ID":"{id}","Operation":"{op}","Info":"","Who":"bench@load","Version":"1.15.0","Created":"2026-01-01T00:00:00Z","Path":""}}"#
        ))
    };
    let mut plans = Vec::new();
    for _ in 0..holders {
        let (api, stop, ws) = (api.clone(), stop.clone(), ws.to_string());
        plans.push(tokio::spawn(async move {
            let mut st = CycleStats::default();
            // A refused LOCK is retried with the same LockInfo, as Terraform's
            // -lock-timeout does (a waiting apply is known by its ID).
            let mut refused: Option<Bytes> = None;
            while !stop.load(Relaxed) {
                let info = refused
                    .take()
                    .unwrap_or_else(|| lock_info("OperationTypePlan"));
                let t = Instant::now();
                let (status, text) = api.send("LOCK", &ws, "", info.clone()).await;
                match status {
                    StatusCode::OK => st.lock.push(t.elapsed()),
                    StatusCode::LOCKED => {
                        st.refused += 1;
                        refused = Some(info);
                        tokio::time::sleep(retry).await;
                        continue;
                    }
                    other => panic!("plan LOCK {ws}: {other} {text:?}"),
                }
                let t = Instant::now();
                api.get(&ws).await;
                st.post.push(t.elapsed());
                let t = Instant::now();
                let (status, text) = api.send("UNLOCK", &ws, "", info).await;
                assert_eq!(status, StatusCode::OK, "plan UNLOCK {ws}: {text:?}");
                st.unlock.push(t.elapsed());
                st.cycles += 1;
            }
            st
        }));
    }
    let applier = {
        let (api, stop, ws) = (api.clone(), stop.clone(), ws.to_string());
        tokio::spawn(async move {
            let mut st = CycleStats::default();
            let mut serial = 1;
            let mut refused: Option<Bytes> = None;
            while !stop.load(Relaxed) {
                let id_info = refused
                    .take()
                    .unwrap_or_else(|| lock_info("OperationTypeApply"));
                let id = serde_json::from_slice::<serde_json::Value>(&id_info).unwrap()["ID"]
                    .as_str()
                    .unwrap()
                    .to_string();
                let t = Instant::now();
                let (status, text) = api.send("LOCK", &ws, "", id_info.clone()).await;
                match status {
                    StatusCode::OK => st.lock.push(t.elapsed()),
                    StatusCode::LOCKED => {
                        st.refused += 1;
                        refused = Some(id_info);
                        tokio::time::sleep(retry).await;
                        continue;
                    }
                    other => panic!("apply LOCK {ws}: {other} {text:?}"),
                }
                serial += 1;
                let body = state(10 * KIB, serial, &lineage);
                let md5 = content_md5(&body);
                let t = Instant::now();
                let (status, text) = api.send_state(&ws, &format!("?ID={id}"), body, md5).await;
                assert_eq!(status, StatusCode::OK, "POST {ws}: {text:?}");
                st.post.push(t.elapsed());
                let t = Instant::now();
                let (status, text) = api.send("UNLOCK", &ws, "", id_info).await;
                assert_eq!(status, StatusCode::OK, "UNLOCK {ws}: {text:?}");
                st.unlock.push(t.elapsed());
                st.cycles += 1;
            }
            st
        })
    };
    tokio::time::sleep(cell).await;
    stop.store(true, Relaxed);
    let mut all = SharedStats::default();
    for t in plans {
        let st = t.await.expect("plan task");
        all.plans.cycles += st.cycles;
        all.plans.refused += st.refused;
        all.plans.lock.extend(st.lock);
        all.plans.post.extend(st.post);
        all.plans.unlock.extend(st.unlock);
    }
    all.apply = applier.await.expect("apply task");
    let elapsed = started.elapsed().as_secs_f64();
    all.plans.elapsed = elapsed;
    all.apply.elapsed = elapsed;
    all
}

/// The cell of 8 concurrent plan holders and one apply on one workspace (`--cells 8p+1`).
async fn shared_plan_phase(opts: &Opts, server: &Server, run: &str, report: &mut Report) {
    if opts
        .cells
        .as_ref()
        .is_some_and(|c| !c.iter().any(|c| c == "8p+1"))
    {
        return;
    }
    println!(
        "\n== shared plan locks: 8 plans (LOCK → GET → UNLOCK) and 1 apply (LOCK → POST → UNLOCK)"
    );
    let api = Api::new(&server.url);
    let st = shared_cycles(
        &api,
        &format!("{run}-shared"),
        8,
        opts.cell(),
        Duration::from_micros(500),
    )
    .await;
    report.row(
        "shared plan locks: 8 plan holders + 1 apply, 1 workspace",
        format!(
            "plans {:.0}/s (LOCK {}; GET {}; UNLOCK {}; {} refused); apply {:.0}/s (LOCK {}; POST 10 KiB {}; UNLOCK {}; {} LOCKs refused)",
            st.plans.cycles as f64 / st.plans.elapsed,
            st.plans.lock.ms(),
            st.plans.post.ms(),
            st.plans.unlock.ms(),
            st.plans.refused,
            st.apply.cycles as f64 / st.apply.elapsed,
            st.apply.lock.ms(),
            st.apply.post.ms(),
            st.apply.unlock.ms(),
            st.apply.refused,
        ),
        String::new(),
        String::new(),
    );
}

async fn get_phase(
    opts: &Opts,
    api: &Api,
    run: &str,
    floors: Option<&Floors>,
    report: &mut Report,
) {
    println!("\n== GET");
    for size in [100 * KIB, MIB] {
        let ws = format!("{run}-get{}", size / KIB);
        let body = state(size, 1, "lineage-get");
        api.post(&ws, body.clone()).await;
        for clients in [1, 8] {
            let st = gets(api, &ws, clients, body.len(), opts.cell()).await;
            // The CPU floor is per 100 KiB; scale it by size for the 1 MiB row.
            let floor = floors.map_or(0.0, |f| f.get_cpu * (100 * KIB) as f64 / size as f64);
            report.row(
                format!("GET {} KiB, {clients} client(s)", size / KIB),
                format!("{:.0}/s ({})", st.rate, st.lat.ms()),
                format!("{floor:.0}/s CPU floor, 1 thread"),
                ratio(st.rate, floor),
            );
        }
    }
}

async fn rss_phase(opts: &Opts, report: &mut Report) {
    println!("\n== peak RSS of the server (VmHWM), fresh server per size");
    let sizes: &[usize] = if opts.quick { &[1, 16] } else { &[1, 64, 256] };
    for &mib in sizes {
        let dir = tempfile::tempdir_in(&opts.base).unwrap();
        let server = Server::start(opts, dir.path()).await;
        let api = Api::new(&server.url);
        let idle = server.status_kib("VmHWM");
        let body = state(mib * MIB, 1, "lineage-rss");
        let t = Instant::now();
        api.post("rss", body.clone()).await;
        let post_time = t.elapsed();
        let after_post = server.status_kib("VmHWM");
        let len = body.len();
        drop(body);
        let t = Instant::now();
        assert_eq!(api.get("rss").await, len);
        let get_time = t.elapsed();
        let after_get = server.status_kib("VmHWM");
        report.row(
            format!("peak RSS, {mib} MiB state POST + GET"),
            format!(
                "{:.0} MiB (idle {:.0}, after POST {:.0}; POST {:.2} s, GET {:.2} s)",
                after_get as f64 / 1024.0,
                idle as f64 / 1024.0,
                after_post as f64 / 1024.0,
                post_time.as_secs_f64(),
                get_time.as_secs_f64()
            ),
            "96 MiB (issue 9 bound at 256 MiB)".into(),
            ratio(after_get as f64 / 1024.0, 96.0),
        );
        server.stop();
    }
}

/// Inserts `workspaces × versions` version rows and as many audit rows straight into the
/// server's database (the server is stopped). Rows point at `blob_key` (never read).
fn populate(db: &Path, workspaces: usize, versions: usize, blob_key: &str) -> Duration {
    let t = Instant::now();
    let conn = stategate::store::sql::Connection::open(db).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    let tx = conn.transaction().unwrap();
    {
        let mut v = tx
            .prepare(
                "INSERT INTO versions (scope, version, serial, lineage, sha256, size, blob_key, created_at, actor)
                 VALUES (?1, ?2, ?2, 'fill-lineage', ?3, 102400, ?4, '2026-01-01T00:00:00Z', ?5)",
            )
            .unwrap();
        let mut a = tx
            .prepare(
                "INSERT INTO audit (at, actor, org, scope, event, payload)
                 VALUES ('2026-01-01T00:00:00Z', ?1, NULL, ?2, 'tf.state_written', ?3)",
            )
            .unwrap();
        for w in 0..workspaces {
            let ws = format!("fill-{w:05}");
            let scope = format!("tf/{ws}");
            let actor = format!("tf:{ws}");
            for version in 1..=versions as i64 {
                let sha = format!("{:064x}", (w as u128) << 32 | version as u128);
                v.execute(stategate::store::sql::params![
                    scope, version, sha, blob_key, actor
                ])
                .unwrap();
                let payload =
                    format!(r#"{{"serial":{version},"lineage":"fill-lineage","size":102400}}"#);
                a.execute(stategate::store::sql::params![actor, scope, payload])
                    .unwrap();
            }
        }
    }
    tx.commit().unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    t.elapsed()
}

/// Median wall time of `stategate <args>` against `data_dir`, `runs` times.
fn time_cli(opts: &Opts, data_dir: &Path, args: &[&str], runs: usize) -> (f64, usize) {
    let mut times = Samples::default();
    let mut lines = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let out = Command::new(&opts.bin)
            .args(args)
            .env_clear()
            .env("STATEGATE_DATA_DIR", data_dir)
            .env("STATEGATE_DEK", RootKey::from_bytes(DEK).to_base64())
            .env("STATEGATE_LOG", "warn")
            .output()
            .expect("run stategate");
        times.push(t.elapsed());
        assert!(
            out.status.success(),
            "stategate {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        lines = out
            .stdout
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count();
    }
    (times.pct(50.0) * 1e3, lines)
}

/// Median time of a query on a read-only connection to the index, `runs` times.
fn time_query(
    db: &Path,
    runs: usize,
    f: impl Fn(&stategate::store::sql::Connection) -> usize,
) -> (f64, usize) {
    let conn = stategate::store::sql::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let mut times = Samples::default();
    let mut n = 0;
    for _ in 0..runs {
        let t = Instant::now();
        n = f(&conn);
        times.push(t.elapsed());
    }
    (times.pct(50.0) * 1e3, n)
}

/// One write/GET probe: 1-client cycles and 1-client GETs of 100 KiB.
/// One probe round: 1-client cycles (cycles, POST latencies) then GETs of 100 KiB.
#[derive(Default)]
struct Probe {
    cycles: u64,
    secs: f64,
    post: Samples,
    get: Samples,
}

impl Probe {
    fn rate(&self) -> f64 {
        self.cycles as f64 / self.secs
    }
}

async fn probe(api: &Api, prefix: &str, round: usize, cell: Duration, into: &mut Probe) {
    let st = cycles(
        std::slice::from_ref(api),
        &format!("{prefix}-r{round}"),
        (1, 1),
        Body::Pad(100 * KIB),
        cell,
        Duration::from_micros(500),
        &Presented::Bearer,
    )
    .await;
    let ws = format!("{prefix}-get");
    let body = state(100 * KIB, 1, "lineage-probe");
    if round == 0 {
        api.post(&ws, body.clone()).await;
    }
    let g = gets(api, &ws, 1, body.len(), cell).await;
    into.cycles += st.cycles;
    into.secs += st.elapsed;
    into.post.extend(st.post);
    into.get.extend(g.lat);
}

/// A latency on the full index next to the same on the empty one (p50 is the ratio).
fn latency_row(report: &mut Report, what: &str, full: &Samples, empty: &Samples) {
    let ms = |s: &Samples, p: f64| s.pct(p) * 1e3;
    report.row(
        format!("scale: {what} vs empty"),
        format!(
            "{:.2} ms vs {:.2} ms (p99 {:.2} vs {:.2})",
            ms(full, 50.0),
            ms(empty, 50.0),
            ms(full, 99.0),
            ms(empty, 99.0)
        ),
        "within 10%".into(),
        ratio(full.pct(50.0), empty.pct(50.0)),
    );
}

/// Rounds each server is probed in, alternating: drift in the machine's load (other
/// processes, the page cache) then lands on both sides alike.
const SCALE_ROUNDS: usize = 4;

async fn scale_phase(opts: &Opts, run: &str, report: &mut Report) {
    let (workspaces, versions) = if opts.quick {
        (1_000, 100)
    } else {
        (10_000, 100)
    };
    println!("\n== scale: empty index vs {workspaces} workspaces × {versions} versions");
    let dir = tempfile::tempdir_in(&opts.base).unwrap();
    let (empty_dir, full_dir) = (dir.path().join("empty"), dir.path().join("full"));
    // A real blob for the filler rows to point at, written by the server that gets them.
    let seed = Server::start(opts, &full_dir).await;
    Api::new(&seed.url)
        .post(&format!("{run}-seed"), state(100 * KIB, 1, "lineage-seed"))
        .await;
    seed.stop();
    let blob_key: String = {
        let conn = stategate::store::sql::Connection::open(full_dir.join("stategate.db")).unwrap();
        conn.query_row(
            "SELECT blob_key FROM versions WHERE blob_key IS NOT NULL LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    let took = populate(
        &full_dir.join("stategate.db"),
        workspaces,
        versions,
        &blob_key,
    );
    println!(
        "  populated {} version rows (+ as many audit rows) in {:.1} s",
        workspaces * versions,
        took.as_secs_f64()
    );
    let (empty_server, full_server) = (
        Server::start(opts, &empty_dir).await,
        Server::start(opts, &full_dir).await,
    );
    let (empty_api, full_api) = (Api::new(&empty_server.url), Api::new(&full_server.url));
    let cell = opts.cell().div_f64(SCALE_ROUNDS as f64);
    let (mut empty, mut full) = (Probe::default(), Probe::default());
    for round in 0..SCALE_ROUNDS {
        probe(&empty_api, &format!("{run}-e"), round, cell, &mut empty).await;
        probe(&full_api, &format!("{run}-f"), round, cell, &mut full).await;
    }
    empty_server.stop();
    full_server.stop();
    let data = full_dir;
    let rows = format!("{}k rows", workspaces * versions / 1000);
    report.row(
        format!("scale: 1-client cycles, {rows} vs empty"),
        format!("{:.0}/s vs {:.0}/s", full.rate(), empty.rate()),
        "within 10%".into(),
        ratio(full.rate(), empty.rate()),
    );
    latency_row(
        report,
        &format!("POST p50, {rows}"),
        &full.post,
        &empty.post,
    );
    latency_row(
        report,
        &format!("GET 100 KiB p50, {rows}"),
        &full.get,
        &empty.get,
    );
    let ws = format!("fill-{:05}", workspaces / 2);
    let (ms, lines) = time_cli(opts, &data, &["workspace", "history", &ws, "--json"], 5);
    assert_eq!(lines, versions, "history lists every version");
    report.row(
        format!("scale: `workspace history` ({versions} versions), {rows}, CLI wall time"),
        format!("{ms:.1} ms"),
        "20 ms".into(),
        ratio(ms, 20.0),
    );
    let db = data.join("stategate.db");
    let scope = format!("tf/{ws}");
    let (ms, n) = time_query(&db, 20, |c| {
        stategate::store::history::history_rows(c, &scope, None)
            .unwrap()
            .len()
    });
    assert_eq!(n, versions);
    report.row(
        format!("scale: history query alone, {rows}"),
        format!("{ms:.2} ms"),
        "20 ms".into(),
        ratio(ms, 20.0),
    );
    let (ms, n) = time_query(&db, 5, |c| {
        stategate::store::audit::list_audit(c, Some(&scope), None, 100)
            .unwrap()
            .len()
    });
    assert_eq!(n, versions);
    report.row(
        format!("scale: audit list --scope (100 rows), {rows}"),
        format!("{ms:.2} ms"),
        "20 ms".into(),
        ratio(ms, 20.0),
    );
    let (ms, _) = time_cli(
        opts,
        &data,
        &["admin", "audit", "list", "--scope", &scope, "--json"],
        3,
    );
    report.row(
        format!("scale: `admin audit list --scope`, {rows}, CLI wall time"),
        format!("{ms:.1} ms"),
        "20 ms".into(),
        ratio(ms, 20.0),
    );
}

/// LOCK → POST → UNLOCK cycles of a 10,000-instance state (~5.6 MiB) where each write
/// changes [`BIG_EDITS`] instances, with 1 client and with 8 clients on 8 workspaces:
/// what the resource timeline (a keyed digest per instance, the comparison with the
/// previous version's summary, its rows) costs on a large state. The old server takes
/// the same requests, so the same phase measures a release without the timeline.
async fn big_phase(opts: &Opts, run: &str, report: &mut Report) {
    let instances = if opts.quick { 2_000 } else { 10_000 };
    let big = Arc::new(BigState::new(instances));
    let size = Body::Big(big.clone()).size();
    let mib = size as f64 / MIB as f64;
    println!("\n== LOCK → POST ({instances} resource instances, {mib:.1} MiB) → UNLOCK cycles");
    let sample = big.body(1, "lineage-floor", &big.resources);
    let plain = post_cpu_of(&sample, opts.cell(), true, false);
    let summarized = post_cpu_of(&sample, opts.cell(), true, true);
    report.row(
        format!("floor: POST CPU of the {instances}-instance state (Content-MD5 + scan + SHA-256 + seal), 1 thread"),
        format!(
            "{:.2} ms ({:.2} ms with the timeline's summary: +{:.2} ms)",
            1e3 / plain,
            1e3 / summarized,
            1e3 / summarized - 1e3 / plain
        ),
        "-".into(),
        "-".into(),
    );
    let dir = tempfile::tempdir_in(&opts.base).unwrap();
    let server = Server::start(opts, dir.path()).await;
    let api = &Api::new(&server.url);
    for (i, &(clients, workspaces)) in [(1usize, 1usize), (8, 8)].iter().enumerate() {
        let (server_cpu, own_cpu) = (server.cpu_seconds(), cpu_seconds_of("/proc/self/stat"));
        let st = cycles(
            std::slice::from_ref(api),
            &format!("{run}-big{i}"),
            (clients, workspaces),
            Body::Big(big.clone()),
            opts.cell(),
            Duration::from_micros(500),
            &Presented::Bearer,
        )
        .await;
        // The first writes are not in the cell's rate, but their CPU is in both counters.
        let server_cpu = server.cpu_seconds() - server_cpu;
        let own_cpu = cpu_seconds_of("/proc/self/stat") - own_cpu;
        let rate = st.cycles as f64 / st.elapsed;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        // Every cycle needs the POST CPU floor on some core: no server goes faster.
        let ceiling = plain * clients.min(workspaces).min(cores as usize) as f64;
        report.row(
            format!("big: cycles, {clients} client(s), {workspaces} workspace(s), {instances} instances ({mib:.1} MiB), {BIG_EDITS} changed per write"),
            format!(
                "{rate:.1}/s (LOCK {}; POST {}; UNLOCK {}; first write, all added: {}; CPU per cycle incl. first writes: server {:.1} ms, load generator {:.1} ms)",
                st.lock.ms(),
                st.post.ms(),
                st.unlock.ms(),
                st.first.ms(),
                server_cpu * 1e3 / (st.cycles + workspaces as u64).max(1) as f64,
                own_cpu * 1e3 / (st.cycles + workspaces as u64).max(1) as f64,
            ),
            format!("{ceiling:.1}/s POST CPU floor × {:.0} core(s)", ceiling / plain),
            ratio(rate, ceiling),
        );
    }
    println!(
        "  server peak RSS after the big cycles: {:.0} MiB",
        server.status_kib("VmHWM") as f64 / 1024.0
    );
    server.stop();
}

/// Addresses of the small workspaces of [`timeline_phase`]: 20 instances.
fn small_address(i: usize) -> String {
    match i {
        0 => "module.db.aws_db_instance.main".into(),
        1 => "aws_vpc.main".into(),
        2..=11 => format!("aws_instance.web[{}]", i - 2),
        _ => format!("module.app.aws_s3_bucket.b[\"bucket-{}\"]", i - 12),
    }
}

/// Address `i` of the hot workspace of [`timeline_phase`] (10,000 instances across a
/// `for_each` module, `count` and `for_each`); 0 is the one changed in every version.
fn hot_address(i: usize) -> String {
    match i {
        0 => "module.db.aws_db_instance.main".into(),
        1..=3000 => format!("aws_s3_object.obj[\"obj-{:05}\"]", i - 1),
        _ => {
            let j = i - 3001;
            let module = format!("module.svc[\"svc-{:03}\"]", j / 350);
            match j % 350 {
                k @ 0..=199 => format!("{module}.aws_instance.web[{k}]"),
                k => format!("{module}.aws_security_group_rule.ingress[\"rule-{k:03}\"]"),
            }
        }
    }
}

/// Fills `db` (a server's index, the server stopped) with a resource timeline of
/// `small × 100` versions of 20-instance workspaces (v1 adds all, every later version
/// changes 2, every 10th also adds one and removes one) and one hot workspace of `hot`
/// versions of a 10,000-instance state (v1 adds all, every later version changes 3
/// spread over the state and `module.db.aws_db_instance.main`), version rows included,
/// in one transaction through the real schema. Returns (versions, change rows).
fn populate_timeline(db: &Path, small: usize, hot: usize) -> (usize, usize) {
    let conn = stategate::store::sql::Connection::open(db).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    let tx = conn.transaction().unwrap();
    let (mut versions, mut rows) = (0, 0);
    {
        let mut v = tx
            .prepare(
                "INSERT INTO versions (scope, version, serial, lineage, sha256, size, blob_key, created_at, actor,
                                       lock_who, lock_operation, res_added, res_changed, res_removed)
                 VALUES (?1, ?2, ?2, 'fill-lineage', ?3, 102400, NULL, '2026-01-01T00:00:00Z', 'tf:fill',
                         'ci@runner-3', 'OperationTypeApply', ?4, ?5, ?6)",
            )
            .unwrap();
        let mut c = tx
            .prepare(
                "INSERT INTO resource_changes (scope, version, address, change) VALUES (?1, ?2, ?3, ?4)",
            )
            .unwrap();
        let mut version = |scope: &str, n: i64, changes: &[(String, &str)]| {
            let count = |k: &str| changes.iter().filter(|(_, c)| *c == k).count() as i64;
            let sha = format!("{:064x}", versions);
            v.execute(stategate::store::sql::params![
                scope,
                n,
                sha,
                count("added"),
                count("changed"),
                count("removed")
            ])
            .unwrap();
            for (address, change) in changes {
                c.execute(stategate::store::sql::params![scope, n, address, change])
                    .unwrap();
            }
            versions += 1;
            rows += changes.len();
        };
        for w in 0..small {
            let scope = format!("tf/tl-{w:05}");
            let all: Vec<(String, &str)> = (0..20).map(|i| (small_address(i), "added")).collect();
            version(&scope, 1, &all);
            for n in 2..=100i64 {
                let mut changes = vec![
                    (small_address(n as usize % 20), "changed"),
                    (small_address((n as usize * 7 + 3) % 20), "changed"),
                ];
                if n % 10 == 0 {
                    changes.push((format!("aws_iam_role.r{n}"), "added"));
                    if n > 10 {
                        changes.push((format!("aws_iam_role.r{}", n - 10), "removed"));
                    }
                }
                changes.sort();
                changes.dedup_by(|a, b| a.0 == b.0);
                version(&scope, n, &changes);
            }
        }
        let all: Vec<(String, &str)> = (0..10_000).map(|i| (hot_address(i), "added")).collect();
        version("tf/tl-hot", 1, &all);
        for n in 2..=hot as i64 {
            let mut changes: Vec<(String, &str)> = (0..3u64)
                .map(|e| {
                    (
                        hot_address(1 + ((n as u64 * 7919 + e * 104_729) % 9_999) as usize),
                        "changed",
                    )
                })
                .collect();
            changes.push((hot_address(0), "changed"));
            changes.sort();
            changes.dedup_by(|a, b| a.0 == b.0);
            version("tf/tl-hot", n, &changes);
        }
    }
    tx.commit().unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    (versions, rows)
}

/// p50/p99 (ms) of `queries` timeline queries on a read-only connection, the `i`th
/// asking `ask(i)` = (scope, address); every answer must have `expect(rows)`.
fn time_timeline(
    db: &Path,
    queries: usize,
    ask: impl Fn(usize) -> (String, Option<String>),
    expect: impl Fn(usize) -> bool,
) -> Samples {
    let conn = stategate::store::sql::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let mut times = Samples::default();
    for i in 0..queries {
        let (scope, address) = ask(i);
        let t = Instant::now();
        let rows =
            stategate::store::timeline::timeline_rows(&conn, &scope, address.as_deref(), 1_000)
                .unwrap();
        times.push(t.elapsed());
        assert!(
            expect(rows.len()),
            "{scope} {address:?}: {} rows",
            rows.len()
        );
    }
    times
}

/// Timeline queries on a 1M-version index (issue 23: < 20 ms): `workspace timeline WS`
/// and `workspace timeline WS ADDRESS` (the CLI's default limit, 1,000 rows), p50/p99
/// over many queries through `store::timeline::timeline_rows`, on small workspaces and
/// on one hot workspace with a 10,000-instance state; each query plan must use an index
/// (no SCAN) on this index too; and the CLI's wall time. Asserts every p99 < 20 ms.
async fn timeline_phase(opts: &Opts, report: &mut Report) {
    let (small, hot) = if opts.quick {
        (990, 1_000)
    } else {
        (9_900, 10_000)
    };
    println!("\n== timeline queries: {small} workspaces × 100 versions + 1 × {hot} versions of 10,000 instances");
    let dir = tempfile::tempdir_in(&opts.base).unwrap();
    // The server creates the data dir and its index (every table), then stops.
    Server::start(opts, dir.path()).await.stop();
    let db = dir.path().join("stategate.db");
    let t = Instant::now();
    let (versions, rows) = populate_timeline(&db, small, hot);
    println!(
        "  populated {versions} versions and {rows} resource changes in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    {
        let conn = stategate::store::sql::Connection::open(&db).unwrap();
        for sql in [
            stategate::store::timeline::BY_ADDRESS_SQL,
            stategate::store::timeline::ALL_SQL,
        ] {
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            type Param = Box<dyn stategate::store::sql::ToSql>;
            let params: Vec<Param> = match stmt.parameter_count() {
                3 => vec![
                    Box::new("tf/tl-hot".to_string()),
                    Box::new(hot_address(0)),
                    Box::new(1000i64),
                ],
                _ => vec![Box::new("tf/tl-hot".to_string()), Box::new(1000i64)],
            };
            let plan: Vec<String> = stmt
                .query_map(stategate::store::sql::params_from_iter(params), |r| {
                    r.get::<_, String>(3)
                })
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert!(
                plan.iter()
                    .all(|s| !s.starts_with("SCAN") || s.starts_with("SCAN (subquery-")),
                "{sql}: {plan:?}"
            );
            println!("  plan: {}", plan.join("; "));
        }
    }
    let queries = if opts.quick { 50 } else { 300 };
    let ws = |i: usize| format!("tf/tl-{:05}", (i * 7_919) % small);
    let cells: Vec<(String, Samples)> = vec![
        (
            "`timeline WS`, 100-version workspaces (every change, ~240 rows)".into(),
            time_timeline(&db, queries, |i| (ws(i), None), |n| n > 200),
        ),
        (
            "`timeline WS ADDRESS`, 100-version workspaces (one instance, ~10 rows)".into(),
            time_timeline(
                &db,
                queries,
                |i| (ws(i), Some(small_address(2 + i % 10))),
                |n| n >= 1,
            ),
        ),
        (
            "`timeline WS ADDRESS`, 100-version workspaces (a module, `module.app`)".into(),
            time_timeline(&db, queries, |i| (ws(i), Some("module.app".into())), |n| n >= 8),
        ),
        (
            format!("`timeline WS`, hot workspace ({hot} versions; newest 1,000 rows)"),
            time_timeline(&db, queries, |_| ("tf/tl-hot".into(), None), |n| n == 1_000),
        ),
        (
            format!("`timeline WS ADDRESS`, hot workspace, the instance changed in all {hot} versions (newest 1,000)"),
            time_timeline(
                &db,
                queries,
                |_| ("tf/tl-hot".into(), Some(hot_address(0))),
                |n| n == 1_000,
            ),
        ),
        (
            "`timeline WS ADDRESS`, hot workspace, one module of 350 instances".into(),
            time_timeline(
                &db,
                queries,
                |i| ("tf/tl-hot".into(), Some(format!("module.svc[\"svc-{:03}\"]", i % 20))),
                |n| n >= 350,
            ),
        ),
        (
            "`timeline WS ADDRESS`, hot workspace, one instance".into(),
            time_timeline(
                &db,
                queries,
                |i| ("tf/tl-hot".into(), Some(hot_address(1 + (i * 31) % 9_999))),
                |n| n >= 1,
            ),
        ),
    ];
    let label = format!("{}k versions", versions / 1000);
    let mut slow = Vec::new();
    for (what, s) in &cells {
        let p99 = s.pct(99.0) * 1e3;
        report.row(
            format!("timeline: {what}, {label}, query alone"),
            s.ms(),
            "20 ms".into(),
            ratio(p99, 20.0),
        );
        if p99 >= 20.0 {
            slow.push(format!("{what}: p99 {p99:.1} ms"));
        }
    }
    for (args, what) in [
        (
            vec!["workspace", "timeline", "tl-00042", "--json"],
            "`workspace timeline WS`, 100 versions",
        ),
        (
            vec!["workspace", "timeline", "tl-hot", "--json"],
            "`workspace timeline WS`, hot workspace",
        ),
        (
            vec![
                "workspace",
                "timeline",
                "tl-hot",
                "module.db.aws_db_instance.main",
                "--json",
            ],
            "`workspace timeline WS ADDRESS`, hot workspace",
        ),
    ] {
        let (ms, lines) = time_cli(opts, dir.path(), &args, 5);
        report.row(
            format!("timeline: {what}, {label}, CLI wall time"),
            format!("{ms:.1} ms ({lines} rows)"),
            "-".into(),
            "-".into(),
        );
    }
    assert!(slow.is_empty(), "timeline queries over 20 ms: {slow:?}");
}

fn machine_facts(opts: &Opts) {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let fs = Command::new("df")
        .args(["-T", &opts.base.display().to_string()])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .nth(1)
                .unwrap_or("")
                .split_whitespace()
                .nth(1)
                .unwrap_or("?")
                .to_string()
        })
        .unwrap_or_default();
    let version = Command::new(&opts.bin)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!(
        "machine: {cpus} CPUs, data dirs under {} ({fs}), load average {}; {version} ({})",
        opts.base.display(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        opts.bin.display()
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mut opts = Opts::parse();
    // Every data dir of the run lives under one root, removed at the end or on a signal.
    let root = tempfile::Builder::new()
        .prefix("stategate-load-")
        .tempdir_in(&opts.base)
        .expect("create the run's root dir");
    opts.base = root.path().to_path_buf();
    LIVE.lock().unwrap().1 = Some(opts.base.clone());
    clean_up_on_signal();
    let run = format!("b{}", run_id());
    let started = Instant::now();
    println!(
        "stategate load harness ({}; {:.1} s per cell; run {run})",
        if opts.quick { "quick" } else { "full" },
        opts.secs
    );
    machine_facts(&opts);
    let mut report = Report::default();
    let floors = if opts.runs("floor") {
        Some(floors(&opts, &mut report).await)
    } else {
        None
    };
    if opts.runs("cycles") || opts.runs("get") {
        let dir = tempfile::tempdir_in(&opts.base).unwrap();
        // With CI identity tokens the same server trusts a real issuer, so the bearer
        // and the tokens are measured on one server, one after the other.
        let mut issuer = (opts.uses_jwt() && opts.runs("cycles")).then(|| CiIssuer::start(&opts));
        let server = match &issuer {
            Some(issuer) => {
                let config = opts.base.join("ci-identity.toml");
                std::fs::write(&config, issuer.config(&run)).unwrap();
                let env = [("STATEGATE_CONFIG", config.display().to_string())];
                Server::start_with(&opts, dir.path(), &env).await
            }
            None => Server::start(&opts, dir.path()).await,
        };
        let api = Api::new(&server.url);
        if opts.runs("cycles") {
            cycle_phase(
                &opts,
                &server,
                &run,
                floors.as_ref(),
                issuer.as_mut(),
                &mut report,
            )
            .await;
            shared_plan_phase(&opts, &server, &run, &mut report).await;
        }
        if opts.runs("get") {
            get_phase(&opts, &api, &run, floors.as_ref(), &mut report).await;
        }
        println!(
            "  server peak RSS after cycles and GETs: {:.0} MiB",
            server.status_kib("VmHWM") as f64 / 1024.0
        );
        server.stop();
    }
    if opts.runs("rss") {
        rss_phase(&opts, &mut report).await;
    }
    if opts.runs("scale") {
        scale_phase(&opts, &run, &mut report).await;
    }
    if opts.runs("big") {
        big_phase(&opts, &run, &mut report).await;
    }
    if opts.runs("timeline") {
        timeline_phase(&opts, &mut report).await;
    }
    if opts.runs("index") {
        index_phase(&opts, &run, &mut report).await;
    }
    report.print();
    if let Some(f) = &floors {
        println!(
            "(floors: fsync {:?} writes/s by writer count; SQLite {:.0} commits/s)",
            f.fsync, f.sqlite
        );
    }
    machine_facts(&opts);
    println!("total {:.0} s", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------
// The index: SQLite against PostgreSQL, one node and two

/// A new database on the PostgreSQL at `base` (a URL naming any database); its URL.
fn new_postgres_database(base: &str) -> String {
    let name = format!("bench_{}", uuid::Uuid::new_v4().simple());
    let (base, made) = (base.to_string(), name.clone());
    // Off the async runtime: the PostgreSQL client blocks on a runtime of its own.
    let base = std::thread::spawn(move || {
        let admin = stategate::store::sql::Connection::connect_postgres(&base, None).unwrap();
        admin
            .execute_batch(&format!("CREATE DATABASE {made}"))
            .unwrap();
        base
    })
    .join()
    .unwrap();
    let (path, query) = base
        .split_once('?')
        .map_or((base.as_str(), None), |(p, q)| (p, Some(q)));
    let (prefix, _) = path.rsplit_once('/').expect("a URL with a database name");
    match query {
        Some(q) => format!("{prefix}/{name}?{q}"),
        None => format!("{prefix}/{name}"),
    }
}

async fn index_phase(opts: &Opts, run: &str, report: &mut Report) {
    println!("\n== the index: SQLite, PostgreSQL, PostgreSQL shared by two nodes");
    let Some(base) = opts.postgres.clone() else {
        println!("  (no --postgres URL / STATEGATE_BENCH_POSTGRES_URL: skipped)");
        return;
    };
    let cells: &[(usize, usize)] = if opts.quick {
        &[(1, 1), (8, 8)]
    } else {
        &[(1, 1), (8, 8), (16, 16)]
    };
    let setups: &[(&str, usize, bool, bool)] = &[
        ("SQLite, 1 node", 1, false, false),
        ("PostgreSQL, 1 node", 1, true, false),
        ("PostgreSQL, 2 nodes", 2, true, false),
        (
            "PostgreSQL, 2 nodes, 1M versions in the index",
            2,
            true,
            true,
        ),
    ];
    let mut sqlite_rates = Vec::new();
    let mut sqlite_gets = Vec::new();
    for (s, &(label, nodes, postgres, bulk)) in setups.iter().enumerate() {
        let dir = tempfile::tempdir_in(&opts.base).unwrap();
        let store = dir.path().join("blobs");
        let mut env = vec![("STATEGATE_STORE_PATH", store.display().to_string())];
        let url = postgres.then(|| new_postgres_database(&base));
        if let Some(url) = &url {
            env.push(("STATEGATE_INDEX", "postgres".into()));
            env.push(("STATEGATE_INDEX_URL", url.clone()));
        }
        let mut servers = Vec::new();
        for n in 0..nodes {
            servers
                .push(Server::start_with(opts, &dir.path().join(format!("node-{n}")), &env).await);
        }
        if let (true, Some(url)) = (bulk, &url) {
            let url = url.clone();
            let t = Instant::now();
            std::thread::spawn(move || {
                let c = stategate::store::sql::Connection::connect_postgres(&url, None).unwrap();
                c.execute_batch(
                    "INSERT INTO versions (scope, version, serial, lineage, sha256, size, blob_key, created_at, actor)
                     SELECT 'tf/bulk-' || (g / 100), g % 100 + 1, g % 100 + 1, 'l', 'x', 1, NULL, 'then', 'bench'
                       FROM generate_series(0, 999999) g;
                     ANALYZE versions;",
                )
                .unwrap();
            })
            .join()
            .unwrap();
            println!(
                "  (1M version rows put into the index in {:.1} s)",
                t.elapsed().as_secs_f64()
            );
        }
        let apis: Vec<Api> = servers.iter().map(|s| Api::new(&s.url)).collect();
        for (i, &(clients, workspaces)) in cells.iter().enumerate() {
            let st = cycles(
                &apis,
                &format!("{run}-ix{s}-{i}"),
                (clients, workspaces),
                Body::Pad(100 * KIB),
                opts.cell(),
                Duration::from_micros(500),
                &Presented::Bearer,
            )
            .await;
            let rate = st.cycles as f64 / st.elapsed;
            if s == 0 {
                sqlite_rates.push(rate);
            }
            // The floor of these rows: SQLite's rate on one node, same cell, same run.
            let sqlite = sqlite_rates.get(i).copied().unwrap_or(0.0);
            report.row(
                format!("index: {label}, {clients} client(s) × {workspaces} workspace(s)"),
                format!(
                    "{rate:.0} cycles/s (LOCK {}; POST {}; UNLOCK {})",
                    st.lock.ms(),
                    st.post.ms(),
                    st.unlock.ms()
                ),
                format!("SQLite, 1 node: {sqlite:.0}/s"),
                ratio(rate, sqlite),
            );
        }
        // The read path: a GET's lookup of the newest version (PostgreSQL's through
        // the blocking pool), then the blob, on the first node.
        let ws = format!("{run}-ix{s}-get");
        let body = state(100 * KIB, 1, "lineage-ix-get");
        apis[0].post(&ws, body.clone()).await;
        for (i, clients) in [1, 8].into_iter().enumerate() {
            let st = gets(&apis[0], &ws, clients, body.len(), opts.cell()).await;
            if s == 0 {
                sqlite_gets.push(st.rate);
            }
            let sqlite = sqlite_gets.get(i).copied().unwrap_or(0.0);
            report.row(
                format!("index: {label}, GET 100 KiB, {clients} client(s)"),
                format!("{:.0}/s ({})", st.rate, st.lat.ms()),
                format!("SQLite, 1 node: {sqlite:.0}/s"),
                ratio(st.rate, sqlite),
            );
        }
        for server in servers {
            server.stop();
        }
    }
}
