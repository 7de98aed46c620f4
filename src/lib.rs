//! stategate: a safe home for OpenTofu/Terraform state in front of an S3-compatible store.
//! See ARCHITECTURE.md for the map.

pub mod address;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod crypto;
pub mod drain;
pub mod drift;
pub mod error;
pub mod http;
pub mod installation;
pub mod jobs;
pub mod keys;
pub mod log;
pub mod metrics;
pub mod names;
pub mod operator;
pub mod schema;
pub mod server;
pub mod store;
pub mod tfstate;
pub mod tofu;
pub mod tokens;
pub mod turns;
pub mod ui;

/// What the source-scan tests (boundaries a reviewer would otherwise check by hand, e.g.
/// `http::error`'s and `store::index`'s) read: every `.rs` file under `src/`.
#[cfg(test)]
pub(crate) fn source_files() -> Vec<(std::path::PathBuf, String)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&source_root(), &mut files);
    assert!(files.len() > 20, "found the sources");
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            (f, text)
        })
        .collect()
}

/// `src/` of this crate.
#[cfg(test)]
pub(crate) fn source_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}
