//! Durable state writes per second through the storage engine (seal + fsynced blob +
//! committed row), with group commit versus one commit per write, measured in the same run.
//!
//!     cargo bench --bench durable_writes
//!
//! Env: BENCH_WRITES (default 400), BENCH_CONCURRENCY (default 16), BENCH_DIR (default: the
//! temp dir; put it on the disk you care about — the gain depends on what an fsync costs there).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use stategate::crypto::RootKey;
use stategate::store::{Db, LocalStore, StateStore};
use stategate::tofu::TofuBackend;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn bench_dir() -> tempfile::TempDir {
    match std::env::var("BENCH_DIR") {
        Ok(base) => tempfile::tempdir_in(base).unwrap(),
        Err(_) => tempfile::tempdir().unwrap(),
    }
}

fn state(serial: usize, lineage: &str) -> Bytes {
    let resources: Vec<String> = (0..20)
        .map(|i| {
            format!(
                r#"{{"mode":"managed","type":"terraform_data","name":"r{i}","instances":[{{"attributes":{{"id":"{i:040}"}}}}]}}"#
            )
        })
        .collect();
    Bytes::from(format!(
        r#"{{"version":4,"terraform_version":"1.15.0","serial":{serial},"lineage":"{lineage}","outputs":{{}},"resources":[{}]}}"#,
        resources.join(",")
    ))
}

/// Writes/s and the mean number of writes per SQLite commit.
async fn run(max_group: usize, writes: usize, concurrency: usize) -> (f64, f64) {
    let dir = bench_dir();
    let db = Db::open_with_group_limit(
        &dir.path().join("bench.db"),
        stategate::schema::ALL,
        max_group,
    )
    .unwrap();
    let blobs = Arc::new(LocalStore::open(&dir.path().join("blobs")).unwrap());
    let tofu = Arc::new(TofuBackend::new(
        StateStore::new(db.clone(), blobs),
        RootKey::from_bytes([9; 32]),
    ));
    let per_worker = writes / concurrency;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let tofu = tofu.clone();
        tasks.push(tokio::spawn(async move {
            let ws = format!("ws-{worker}");
            for serial in 1..=per_worker {
                tofu.write(
                    &ws,
                    None,
                    state(serial, &ws),
                    &stategate::tofu::Credential::Workspace,
                )
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rate = (per_worker * concurrency) as f64 / started.elapsed().as_secs_f64();
    let stats = db.writer_stats();
    let per_commit = stats.jobs.load(Relaxed) as f64 / stats.commits.load(Relaxed).max(1) as f64;
    (rate, per_commit)
}

/// Median latency of one fsync of a small new file, to read the figures against.
fn fsync_micros() -> f64 {
    use std::io::Write;
    let dir = bench_dir();
    let mut samples: Vec<f64> = (0..50)
        .map(|i| {
            let mut f = std::fs::File::create(dir.path().join(format!("probe-{i}"))).unwrap();
            f.write_all(&[0u8; 4096]).unwrap();
            let t = Instant::now();
            f.sync_all().unwrap();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let writes = env_usize("BENCH_WRITES", 400);
    let n = env_usize("BENCH_CONCURRENCY", 16);
    println!("durable_writes: {writes} writes of a ~3 KiB state, {n} concurrent workspaces");
    println!(
        "  fsync of a 4 KiB file (median)      : {:9.1} µs",
        fsync_micros()
    );
    let (single, _) = run(1, writes, 1).await;
    let (baseline, _) = run(1, writes, n).await;
    let (grouped, per_commit) = run(stategate::store::db::DEFAULT_MAX_GROUP, writes, n).await;
    println!("  1 writer                            : {single:9.1} writes/s");
    println!("  {n} writers, one commit per write    : {baseline:9.1} writes/s (baseline)");
    println!(
        "  {n} writers, group commit           : {grouped:9.1} writes/s ({per_commit:.1} writes per commit)"
    );
    println!(
        "  group commit / baseline             : {:9.2}x",
        grouped / baseline
    );
}
