//! `Installation::open` for every purpose: a policy in the config is the
//! installation's, so what a command writes is judged as the server judges it.

use std::sync::Arc;

use stategate::config::Config;
use stategate::error::Error;
use stategate::installation::{Installation, Purpose, Serving};
use stategate::tofu::access::Credential;

mod common;
use common::state;

/// An OpenTofu-encrypted state body (the envelope, no real ciphertext needed).
fn envelope(serial: u64) -> String {
    format!(
        r#"{{"serial":{serial},"lineage":"L","meta":{{"key_provider.pbkdf2.main":"eyJzYWx0IjoiYWJjIn0="}},"encrypted_data":"q83vEjRWeJCrze8SNFZ4kA==","encryption_version":"v0"}}"#
    )
}

fn serving() -> Purpose {
    Purpose::Serve(Box::new(Serving {
        unwrapped: None,
        clock: Arc::new(stategate::cluster::SystemClock),
        metrics: stategate::metrics::Metrics::new(),
        ci_identities: Default::default(),
    }))
}

/// The same plaintext-after-encrypted write `tests/tf_backend.rs` refuses over HTTP
/// (`a_plaintext_write_onto_an_encrypted_state_is_refused_where_the_policy_says`),
/// made through the backend a command opens: refused the same way, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_writes_under_the_installations_downgrade_policy() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config {
        data_dir: dir.path().join("data"),
        ..Config::default()
    };
    config.tofu.refuse_plaintext_after_encrypted = vec!["prod-*".into()];
    let server = Installation::open(&config, serving()).await.unwrap();
    for ws in ["prod-a", "dev-a"] {
        server
            .tofu()
            .write(ws, None, envelope(5).into(), &Credential::Workspace)
            .await
            .unwrap();
    }
    drop(server);

    let command = Installation::open(&config, Purpose::Command).await.unwrap();
    let err = command
        .tofu()
        .write(
            "prod-a",
            None,
            state(6, "L", "").into(),
            &Credential::Workspace,
        )
        .await
        .unwrap_err();
    match &err {
        Error::WriteRefused { message, facts } => {
            assert_eq!(facts["refused"], "plaintext_after_encrypted", "{facts}");
            assert!(message.contains("nothing was written"), "{message}");
        }
        other => panic!("expected the downgrade refusal, got {other:?}"),
    }
    let history = command.store().history("tf/prod-a", None).await.unwrap();
    assert_eq!(history.len(), 1, "nothing was written");
    // A workspace the policy does not name takes the same write.
    command
        .tofu()
        .write(
            "dev-a",
            None,
            state(6, "L", "").into(),
            &Credential::Workspace,
        )
        .await
        .unwrap();
}
