//! The encryption posture (`tofu::posture`) survives the paths that write an index
//! without the write path's body scan, as the real binary runs them: `index rebuild`
//! (from blobs alone) and `restore` (a backup plus the versions written after it)
//! recompute each workspace version's posture from its content, so a plaintext and
//! an OpenTofu-encrypted version read back as what they are, not "unknown".

mod common;

use std::process::Command;

use common::{state, status, TestServer, DEK};

const LINEAGE: &str = "0b1d5c6e-2f7a-4c1e-9d3b-7e8f9a0b1c2d";

fn envelope(serial: u64) -> String {
    format!(
        r#"{{"serial":{serial},"lineage":"{LINEAGE}","meta":{{"key_provider.pbkdf2.main":"eyJzYWx0IjoiIn0="}},"encrypted_data":"q83vEjRWeJCrze8SNFZ4kA==","encryption_version":"v0"}}"#
    )
}

fn cli(server: &TestServer, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_stategate"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("STATEGATE_DATA_DIR", &server.config.data_dir)
        .env("STATEGATE_DEK", DEK)
        .envs(common::index_env(&server.config))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// (workspace, version, encrypted) recorded in the index `conn` is on.
fn postures(conn: &stategate::store::sql::Connection) -> Vec<(String, i64, bool)> {
    let mut stmt = conn
        .prepare("SELECT workspace, version, encrypted FROM tf_state_encryption ORDER BY 1, 2")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows
}

async fn put(server: &TestServer, ws: &str, body: String) {
    let (code, text) = status(server.tf("POST", ws).body(body)).await;
    assert_eq!(code, 200, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_and_restore_recompute_the_posture_of_every_version() {
    let server = TestServer::start().await;
    put(&server, "w", state(1, LINEAGE, "")).await;
    put(&server, "w", envelope(2)).await;
    put(&server, "plain", state(1, "l-plain", "")).await;
    cli(&server, &["backup"]);
    // Written after the backup: only the blobs know these.
    put(&server, "w", envelope(3)).await;
    put(&server, "plain", state(2, "l-plain", "")).await;
    let live = postures(&server.db());
    let want = |w: &str, v, e| (w.to_string(), v, e);
    let all = vec![
        want("plain", 1, false),
        want("plain", 2, false),
        want("w", 1, false),
        want("w", 2, true),
        want("w", 3, true),
    ];
    assert_eq!(live, all, "the write path records every version");

    // (command, output file, posture rows in it)
    // Where a rebuild or restore writes a new index: a new file beside a SQLite index,
    // a new empty database beside a PostgreSQL one.
    let new_index = |name: &str| match server.config.index.kind {
        stategate::config::IndexKind::Sqlite => server
            .dir
            .path()
            .join(format!("{name}.db"))
            .display()
            .to_string(),
        stategate::config::IndexKind::Postgres => common::new_postgres_database().unwrap(),
    };
    let (rebuilt, restored) = (new_index("rebuilt"), new_index("restored"));
    let table: [(Vec<&str>, &str, &str); 2] = [
        (
            vec!["index", "rebuild", "--into", &rebuilt],
            &rebuilt,
            "Recomputed the encryption posture of 5 workspace version(s)",
        ),
        (
            vec!["restore", "--into", &restored],
            &restored,
            // The backup held three; the two added after it are read from their content.
            "Recomputed the encryption posture of 2 added version(s)",
        ),
    ];
    for (args, into, said) in table {
        let out = cli(&server, &args);
        assert!(out.contains(said), "{args:?}: {out}");
        let new = match server.config.index.kind {
            stategate::config::IndexKind::Sqlite => {
                stategate::store::sql::Connection::open(into).unwrap()
            }
            stategate::config::IndexKind::Postgres => {
                let mut config = server.config.clone();
                config.index.url = Some(into.into());
                common::index_connection(&config)
            }
        };
        assert_eq!(postures(&new), all, "{args:?}");
    }
}
