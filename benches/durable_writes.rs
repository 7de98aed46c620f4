//! Durable state writes per second through the storage engine (seal + fsynced blob +
//! committed row), with group commit versus one fsync per commit, measured in the same run.
//!
//!     cargo bench --bench durable_writes
//!
//! Env: BENCH_WRITES (default 400), BENCH_CONCURRENCY (default 16), BENCH_DIR (default: a
//! temp dir; put it on the disk you care about).

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

fn state(serial: usize, lineage: &str) -> Bytes {
    let resources: Vec<String> = (0..20)
        .map(|i| format!(r#"{{"mode":"managed","type":"terraform_data","name":"r{i}","instances":[{{"attributes":{{"id":"{i:040}"}}}}]}}"#))
        .collect();
    Bytes::from(format!(
        r#"{{"version":4,"terraform_version":"1.15.0","serial":{serial},"lineage":"{lineage}","outputs":{{}},"resources":[{}]}}"#,
        resources.join(",")
    ))
}

async fn run(max_group: usize, writes: usize, concurrency: usize) -> f64 {
    let base = std::env::var("BENCH_DIR")
        .map(std::path::PathBuf::from)
        .ok();
    let dir = match &base {
        Some(b) => tempfile::tempdir_in(b).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let db = Db::open_with_group_limit(&dir.path().join("bench.db"), &[], max_group).unwrap();
    let blobs = Arc::new(LocalStore::open(&dir.path().join("blobs")).unwrap());
    let tofu = Arc::new(TofuBackend::new(
        StateStore::new(db, blobs),
        RootKey::from_bytes([9; 32]),
    ));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let tofu = tofu.clone();
        let per_worker = writes / concurrency;
        tasks.push(tokio::spawn(async move {
            let ws = format!("ws-{worker}");
            for serial in 1..=per_worker {
                tofu.write(&ws, None, state(serial, &ws)).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (writes / concurrency * concurrency) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let writes = env_usize("BENCH_WRITES", 400);
    let concurrency = env_usize("BENCH_CONCURRENCY", 16);
    println!(
        "durable_writes: {writes} writes of a ~3 KiB state, {concurrency} concurrent workspaces"
    );
    let single = run(1, writes, 1).await;
    let baseline = run(1, writes, concurrency).await;
    let grouped = run(stategate::store::db::DEFAULT_MAX_GROUP, writes, concurrency).await;
    println!("  1 writer                              : {single:8.1} writes/s");
    println!(
        "  {concurrency} writers, one fsync per commit      : {baseline:8.1} writes/s (baseline)"
    );
    println!("  {concurrency} writers, group commit              : {grouped:8.1} writes/s");
    println!(
        "  group commit / baseline               : {:8.2}x",
        grouped / baseline
    );
}
