//! The root key wrapped by a real PKCS#11 token (SoftHSM2, in a temp dir through
//! SOFTHSM2_CONF), as the real binary meets it: `key wrap` moves the plain key into
//! the wrapped file and proves it; every command then unwraps it through the token
//! (the derived credentials are exactly those of the plain key); and a wrong PIN,
//! key label, token, module, token key or a damaged wrapped file stops the command
//! with a message naming what failed, writing nothing, with no key bytes or PIN in
//! its output. Tokens are made with `softhsm2-util` and `pkcs11-tool`
//! (scripts/setup-test-deps.sh installs both).

use std::path::{Path, PathBuf};
use std::process::Command;

const MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";
const DEK: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const PIN: &str = "71829304";

/// A SoftHSM2 installation of its own: config file and token directory.
struct Hsm {
    conf: PathBuf,
}

impl Hsm {
    fn new(dir: &Path) -> Hsm {
        let tokens = dir.join("tokens");
        std::fs::create_dir_all(&tokens).unwrap();
        let conf = dir.join("softhsm2.conf");
        std::fs::write(
            &conf,
            format!(
                "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
                tokens.display()
            ),
        )
        .unwrap();
        Hsm { conf }
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = Command::new(program)
            .args(args)
            .env("SOFTHSM2_CONF", &self.conf)
            .output()
            .unwrap_or_else(|e| panic!("{program} (scripts/setup-test-deps.sh installs it): {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A token `label` with user PIN [`PIN`] and a non-extractable AES-256 key `key`.
    fn token(&self, label: &str, key: &str) {
        self.run(
            "softhsm2-util",
            &[
                "--init-token",
                "--free",
                "--label",
                label,
                "--so-pin",
                "5647382910",
                "--pin",
                PIN,
            ],
        );
        self.run(
            "pkcs11-tool",
            &[
                "--module",
                MODULE,
                "--token-label",
                label,
                "--login",
                "--pin",
                PIN,
                "--keygen",
                "--key-type",
                "AES:32",
                "--label",
                key,
            ],
        );
    }
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn stategate(env: &[(&str, String)], args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_stategate"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("STATEGATE_LISTEN", "127.0.0.1:0")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Every file under `dir` with its bytes: what "nothing was written" compares.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_wrapped_key_opens_only_through_the_right_token_and_failures_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let hsm = Hsm::new(&dir.path().join("hsm"));
    hsm.token("stategate", "root-wrap");
    // Another token with a key of the same label: a different key.
    hsm.token("other", "root-wrap");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let plain = data.join("dek");
    std::fs::write(&plain, format!("{DEK}\n")).unwrap();
    let pin_file = dir.path().join("pin");
    std::fs::write(&pin_file, format!("{PIN}\n")).unwrap();
    let wrapped = data.join("stategate.key.wrapped");
    let base = |pin: &Path| -> Vec<(&'static str, String)> {
        vec![
            ("SOFTHSM2_CONF", hsm.conf.display().to_string()),
            ("STATEGATE_DATA_DIR", data.display().to_string()),
            ("STATEGATE_KEY_SERVICE", "pkcs11".into()),
            ("STATEGATE_KEY_PKCS11_MODULE", MODULE.into()),
            ("STATEGATE_KEY_PKCS11_TOKEN_LABEL", "stategate".into()),
            ("STATEGATE_KEY_PKCS11_KEY_LABEL", "root-wrap".into()),
            ("STATEGATE_KEY_PKCS11_PIN_FILE", pin.display().to_string()),
        ]
    };
    let good = base(&pin_file);
    let expected_bearer = stategate::crypto::RootKey::from_base64(DEK)
        .unwrap()
        .workspace_bearer("prod");
    let clean = |run: &Run| {
        for secret in [DEK, PIN, expected_bearer.as_str()] {
            assert!(!run.stderr.contains(secret), "{secret} in {}", run.stderr);
        }
    };

    // Before wrapping, a pkcs11 installation with only the plain file refuses to start.
    let before = stategate(&good, &["workspace", "env", "prod"]);
    assert_eq!(before.code, 1, "{}", before.stderr);
    assert!(
        before.stderr.contains("run `stategate key wrap`"),
        "{}",
        before.stderr
    );

    // Wrap: the file holds no key bytes; a second run finds the same key there.
    let run = stategate(&good, &["key", "wrap"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("now remove the plain key file"),
        "{}",
        run.stdout
    );
    clean(&run);
    let text = std::fs::read_to_string(&wrapped).unwrap();
    assert!(!text.contains(DEK) && text.contains("pkcs11 token 'stategate' key 'root-wrap'"));
    let run = stategate(&good, &["key", "wrap"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("already holds this key"),
        "{}",
        run.stdout
    );
    assert_eq!(std::fs::read_to_string(&wrapped).unwrap(), text);

    // With the plain file still there (the same key) it works, warning to remove it.
    let run = stategate(&good, &["workspace", "env", "prod"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("plain key file is still there"),
        "{}",
        run.stderr
    );
    let run = stategate(&good, &["key", "wrap", "--remove"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!plain.exists());

    // Through the token alone, the credentials are those of the original key.
    let run = stategate(&good, &["workspace", "env", "prod"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains(&expected_bearer),
        "the unwrapped key derives other credentials: {}",
        run.stdout
    );
    clean(&run);
    // The PIN may come from the environment instead of a file.
    let mut from_env: Vec<(&str, String)> = good
        .iter()
        .filter(|(k, _)| *k != "STATEGATE_KEY_PKCS11_PIN_FILE")
        .cloned()
        .collect();
    from_env.push(("STATEGATE_KEY_PKCS11_PIN", PIN.into()));
    let run = stategate(&from_env, &["workspace", "env", "prod"]);
    assert!(
        run.code == 0 && run.stdout.contains(&expected_bearer),
        "{}",
        run.stderr
    );

    // Every failure: exit 1, the message names what failed, nothing is written —
    // neither by an operator command nor by `serve` on a data dir it has not made yet.
    let wrong_pin = dir.path().join("wrong-pin");
    std::fs::write(&wrong_pin, "00000000\n").unwrap();
    let tampered = dir.path().join("tampered.wrapped");
    let mut body: serde_json::Value = serde_json::from_str(&text).unwrap();
    let entry = body["keys"]["dek"].as_str().unwrap().to_string();
    let flipped = if entry.starts_with('A') { "B" } else { "A" };
    body["keys"]["dek"] = format!("{flipped}{}", &entry[1..]).into();
    std::fs::write(&tampered, body.to_string()).unwrap();
    let empty_conf = dir.path().join("empty.conf");
    std::fs::write(
        &empty_conf,
        format!(
            "directories.tokendir = {}\n",
            dir.path().join("no-tokens").display()
        ),
    )
    .unwrap();
    let set = |env: &[(&'static str, String)], key: &'static str, value: String| {
        let mut env: Vec<(&'static str, String)> =
            env.iter().filter(|(k, _)| *k != key).cloned().collect();
        env.push((key, value));
        env
    };
    let not_a_module = env!("CARGO_BIN_EXE_stategate").to_string();
    // (what is wrong, env, the message)
    type Case<'a> = (&'a str, Vec<(&'static str, String)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "wrong PIN",
            base(&wrong_pin),
            "PKCS#11 login to token 'stategate' refused: wrong PIN",
        ),
        (
            "missing key",
            set(
                &good,
                "STATEGATE_KEY_PKCS11_KEY_LABEL",
                "no-such-key".into(),
            ),
            "no secret key labelled 'no-such-key' on PKCS#11 token 'stategate'",
        ),
        (
            "missing token",
            set(&good, "STATEGATE_KEY_PKCS11_TOKEN_LABEL", "gone".into()),
            "no PKCS#11 token labelled 'gone'",
        ),
        (
            "missing module",
            set(
                &good,
                "STATEGATE_KEY_PKCS11_MODULE",
                "/nonexistent/libpkcs11.so".into(),
            ),
            "PKCS#11 module /nonexistent/libpkcs11.so does not exist",
        ),
        (
            "not a module",
            set(&good, "STATEGATE_KEY_PKCS11_MODULE", not_a_module.clone()),
            "cannot load PKCS#11 module",
        ),
        (
            "unreachable token store",
            set(&good, "SOFTHSM2_CONF", empty_conf.display().to_string()),
            "did not initialise (is the token or its service reachable",
        ),
        (
            "another token's key",
            set(&good, "STATEGATE_KEY_PKCS11_TOKEN_LABEL", "other".into()),
            "pkcs11 token 'other' key 'root-wrap' could not unwrap the key for 'dek'",
        ),
        (
            "damaged wrapped file",
            set(
                &good,
                "STATEGATE_KEY_WRAPPED_FILE",
                tampered.display().to_string(),
            ),
            "could not unwrap the key for 'dek'",
        ),
        (
            "missing PIN file",
            base(&dir.path().join("no-pin")),
            "cannot read key.pkcs11.pin_file",
        ),
    ];
    let everything = snapshot(&data);
    for (what, env, message) in &cases {
        let run = stategate(env, &["workspace", "env", "prod"]);
        assert_eq!(run.code, 1, "{what}: {}", run.stderr);
        assert!(run.stderr.contains(message), "{what}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{what}: {}", run.stdout);
        clean(&run);
        // `serve` on a fresh data dir stops before making it.
        let fresh = dir.path().join("fresh");
        let mut env = set(env, "STATEGATE_DATA_DIR", fresh.display().to_string());
        if !env.iter().any(|(k, _)| *k == "STATEGATE_KEY_WRAPPED_FILE") {
            env.push(("STATEGATE_KEY_WRAPPED_FILE", wrapped.display().to_string()));
        }
        let run = stategate(&env, &["serve"]);
        assert_eq!(run.code, 1, "{what}: serve: {}", run.stderr);
        assert!(
            run.stderr.contains(message),
            "{what}: serve: {}",
            run.stderr
        );
        assert!(!fresh.exists(), "{what}: serve made its data dir");
        clean(&run);
        assert_eq!(snapshot(&data), everything, "{what}: something was written");
    }

    // A plain key file that is not the wrapped key refuses, naming both files.
    std::fs::write(&plain, "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\n").unwrap();
    let run = stategate(&good, &["workspace", "env", "prod"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("is not the key wrapped in"),
        "{}",
        run.stderr
    );
    let run = stategate(&good, &["key", "wrap"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("already holds a different key"),
        "{}",
        run.stderr
    );
    assert_eq!(std::fs::read_to_string(&wrapped).unwrap(), text);
}

#[test]
fn wrapping_needs_the_pkcs11_service_and_a_plain_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let run = stategate(
        &[("STATEGATE_DATA_DIR", data.display().to_string())],
        &["key", "wrap"],
    );
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("key.service is \"file\""),
        "{}",
        run.stderr
    );
    let hsm = Hsm::new(&dir.path().join("hsm"));
    hsm.token("t", "k");
    let pin = dir.path().join("pin");
    std::fs::write(&pin, PIN).unwrap();
    let env = vec![
        ("SOFTHSM2_CONF", hsm.conf.display().to_string()),
        ("STATEGATE_DATA_DIR", data.display().to_string()),
        ("STATEGATE_KEY_SERVICE", "pkcs11".to_string()),
        ("STATEGATE_KEY_PKCS11_MODULE", MODULE.to_string()),
        ("STATEGATE_KEY_PKCS11_TOKEN_LABEL", "t".to_string()),
        ("STATEGATE_KEY_PKCS11_KEY_LABEL", "k".to_string()),
        ("STATEGATE_KEY_PKCS11_PIN_FILE", pin.display().to_string()),
    ];
    let run = stategate(&env, &["key", "wrap"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("no plain key file at"),
        "{}",
        run.stderr
    );
    assert!(!data.exists(), "a refused wrap made the data dir");
    // An operator command on an installation without any key says how to make one.
    let run = stategate(&env, &["workspace", "env", "prod"]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("no wrapped key at"), "{}", run.stderr);
    assert!(!data.exists());
}
