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

/// A `tofu` stand-in that, on `plan`, does what the drift child of issue 37 finding 2
/// did: reads the PIN file, the wrapped key, the OIDC client secret, SoftHSM's
/// configuration, the configuration file and a file only the server's user may read;
/// lists the token directory; and logs into the token with the PIN it was told. It
/// writes `report` (one line per target: `READ <target> <what>`, or `EMPTY <target>`)
/// and `env-dump` in its directory, then plans a change (a kept plan) and, on
/// `apply`, copies the plan it is given to `applied`.
const ATTACKER_TOFU: &str = r#"#!/bin/sh
cmd="$1"; shift
case "$cmd" in
init) mkdir -p .terraform; exit 0 ;;
plan)
  for a in "$@"; do case "$a" in -out=*) out="${a#-out=}" ;; esac; done
  {
  echo "UID $(id -u)"
  for f in "$NOSY_PIN" "$NOSY_WRAPPED" "$NOSY_OIDC" "$NOSY_CONF" "$NOSY_CONFIG" "$NOSY_PRIVATE"; do
    if got="$(cat "$f" 2>&1)" && [ -n "$got" ]; then echo "READ $f $got"; else echo "EMPTY $f $got"; fi
  done
  if got="$(ls -A "$NOSY_TOKENS" 2>/dev/null)" && [ -n "$got" ]; then echo "READ $NOSY_TOKENS $got"; else echo "EMPTY $NOSY_TOKENS"; fi
  if SOFTHSM2_CONF="${SOFTHSM2_CONF:-$NOSY_CONF}" pkcs11-tool --module "$NOSY_MODULE" \
       --token-label stategate --login --pin "$NOSY_PIN_VALUE" --list-objects 2>&1 | grep -q root-wrap; then
    echo "READ token logged in, root-wrap listed"
  else
    echo "EMPTY token"
  fi
  } > report
  env > env-dump
  printf 'PLAN' > "$out"
  echo '{"type":"planned_change","@message":"thing: Plan to update"}'
  echo '{"type":"change_summary","@message":"Plan: 0 to add, 1 to change, 0 to destroy.","changes":{"add":0,"change":1,"remove":0}}'
  exit 2 ;;
show) echo "human text of the saved plan"; exit 0 ;;
apply) for a in "$@"; do last="$a"; done; cat "$last" > applied; exit 0 ;;
esac
exit 1
"#;

/// What one attack by a drift child found: its report, its environment, and the
/// outcomes of the check and of the approved apply of its kept plan.
struct Attack {
    report: String,
    env: String,
    checked: String,
    applied: String,
    applied_plan: String,
    /// Every secret the child must not have seen.
    secrets: Vec<String>,
}

/// A pkcs11 installation (SoftHSM2 through `SOFTHSM2_CONF`) whose PIN file, wrapped
/// key and OIDC client secret file live outside the data dir, serving; a drift check
/// whose child attacks (`ATTACKER_TOFU`) is run with `stategate drift run`, and its
/// kept plan applied with `stategate drift apply`. `run_as`: `drift_settings.run_as`.
fn drift_attack(run_as: Option<&str>) -> Attack {
    use std::os::unix::fs::PermissionsExt;
    // Not under /tmp: the sandbox's private /tmp would hide it all, proving nothing (a
    // checkout under /tmp, as some CI runners make, works in /var/tmp instead).
    let target_tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let base = if target_tmp.starts_with("/tmp") {
        std::path::Path::new("/var/tmp")
    } else {
        target_tmp
    };
    let dir = tempfile::tempdir_in(base).unwrap();
    // Reachable by an unprivileged `run_as` user (the check's dir must be).
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let hsm = Hsm::new(&dir.path().join("hsm"));
    hsm.token("stategate", "root-wrap");
    let tokens = dir.path().join("hsm/tokens");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("dek"), format!("{DEK}\n")).unwrap();
    let secrets = dir.path().join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o755)).unwrap();
    let pin_file = secrets.join("pin");
    std::fs::write(&pin_file, format!("{PIN}\n")).unwrap();
    let wrapped = secrets.join("root.wrapped");
    let oidc_secret = secrets.join("oidc-client-secret");
    std::fs::write(&oidc_secret, "oidc-client-secret-value\n").unwrap();
    // Not a configured path: only the server's user may read it (`run_as` keeps it out).
    let private = secrets.join("private");
    std::fs::write(&private, "private-to-the-server-user\n").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    for f in [&pin_file, &oidc_secret] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let check = dir.path().join("infra");
    std::fs::create_dir_all(&check).unwrap();
    std::fs::set_permissions(&check, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(check.join("main.tf"), "").unwrap();
    let tofu = check.join("tofu");
    std::fs::write(&tofu, ATTACKER_TOFU).unwrap();
    std::fs::set_permissions(&tofu, std::fs::Permissions::from_mode(0o755)).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("stategate.toml");
    let run_as = run_as.map_or(String::new(), |u| format!("run_as = \"{u}\"\n"));
    std::fs::write(
        &config,
        format!(
            r#"listen = "127.0.0.1:{port}"
public_url = "http://127.0.0.1:{port}"
data_dir = "{data}"
[key]
service = "pkcs11"
wrapped_file = "{wrapped}"
[key.pkcs11]
module = "{MODULE}"
token_label = "stategate"
key_label = "root-wrap"
pin_file = "{pin}"
[oidc]
issuer_url = "https://idp.example"
client_id = "stategate"
client_secret_file = "{oidc}"
[oidc.roles]
sre = "operator"
[drift_settings]
{run_as}[[drift]]
workspace = "prod"
dir = "{check}"
binary = "{tofu}"
interval_seconds = 0
approve_apply = true
[drift.env]
NOSY_PIN = "{pin}"
NOSY_WRAPPED = "{wrapped}"
NOSY_OIDC = "{oidc}"
NOSY_CONF = "{conf}"
NOSY_CONFIG = "{config}"
NOSY_PRIVATE = "{private}"
NOSY_TOKENS = "{tokens}"
NOSY_MODULE = "{MODULE}"
NOSY_PIN_VALUE = "{PIN}"
"#,
            data = data.display(),
            wrapped = wrapped.display(),
            pin = pin_file.display(),
            oidc = oidc_secret.display(),
            check = check.display(),
            tofu = tofu.display(),
            conf = hsm.conf.display(),
            config = config.display(),
            private = private.display(),
            tokens = tokens.display(),
        ),
    )
    .unwrap();
    // What reaches the server's environment and must not reach the child's.
    let env: Vec<(&str, String)> = vec![
        ("STATEGATE_CONFIG", config.display().to_string()),
        ("SOFTHSM2_CONF", hsm.conf.display().to_string()),
        ("AWS_SECRET_ACCESS_KEY", "aws-secret-of-the-server".into()),
        ("HOME", "/root".into()),
    ];
    let run = stategate(&env, &["key", "wrap", "--remove"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let mut serve = Command::new(env!("CARGO_BIN_EXE_stategate"))
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let up = (0..300).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    if !up {
        let _ = serve.kill();
        let out = serve.wait_with_output().unwrap();
        panic!("serve: {}", String::from_utf8_lossy(&out.stderr));
    }
    let json = |run: &Run| -> serde_json::Value {
        assert_eq!(run.code, 0, "{}", run.stderr);
        serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
    };
    let checked = json(&stategate(&env, &["drift", "run", "prod", "--json"]));
    assert_eq!(checked["outcome"], "drifted", "{checked}");
    assert!(
        checked.to_string().contains("plan kept for approval"),
        "{checked}"
    );
    let id = checked["id"].as_i64().unwrap().to_string();
    let applied = json(&stategate(
        &env,
        &["drift", "apply", &id, "--yes", "--json"],
    ));
    let _ = serve.kill();
    let _ = serve.wait();
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    Attack {
        report: read(check.join("report")),
        env: read(check.join("env-dump")),
        checked: checked["outcome"].as_str().unwrap_or_default().into(),
        applied: applied["outcome"].as_str().unwrap_or_default().into(),
        applied_plan: read(check.join("applied")),
        secrets: vec![
            PIN.into(),
            read(wrapped),
            "oidc-client-secret-value".into(),
            "directories.tokendir".into(),
            "private-to-the-server-user".into(),
            "aws-secret-of-the-server".into(),
            DEK.into(),
        ],
    }
}

/// Issue 37 finding 2: a drift child read the PIN file and the wrapped key (outside
/// the data dir), found SoftHSM through the inherited `SOFTHSM2_CONF`, logged into the
/// token and could unwrap the root key. Now every path `Config::secret_paths` lists is
/// empty to it, its environment is an allow-list, and the same check still plans and
/// its kept plan is still applied.
#[test]
fn a_drift_child_gets_nothing_of_the_token_and_its_check_still_plans_and_applies() {
    let attack = drift_attack(None);
    let Attack {
        report,
        env,
        secrets,
        ..
    } = &attack;
    assert_eq!(
        (attack.checked.as_str(), attack.applied.as_str()),
        ("drifted", "applied"),
        "{report}"
    );
    assert_eq!(attack.applied_plan, "PLAN");
    let read: Vec<&str> = report.lines().filter(|l| l.starts_with("READ")).collect();
    // The one file left: not configured anywhere, readable by the server's own user
    // (`run_as` is what keeps it out, below).
    assert!(
        read.iter().all(|l| l.contains("/secrets/private ")),
        "the child read {read:?}\n{report}"
    );
    assert_eq!(report.matches("EMPTY").count(), 7, "{report}");
    assert!(report.contains("EMPTY token"), "{report}");
    for secret in secrets.iter().filter(|s| !s.contains("private")) {
        assert!(!report.contains(secret.as_str()), "{secret:?}:\n{report}");
        // The PIN is in the check's own `env` (NOSY_PIN_VALUE): the token stays shut
        // even to a child that knows it.
        if secret != PIN {
            assert!(!env.contains(secret.as_str()), "{secret:?}:\n{env}");
        }
    }
    for name in ["SOFTHSM2_CONF=", "AWS_", "STATEGATE_", "ADJ_STATE_ENC_KEY"] {
        assert!(
            !env.lines().any(|l| l.starts_with(name)),
            "{name} reached the child:\n{env}"
        );
    }
    assert!(
        env.lines().any(|l| l.starts_with("TF_HTTP_PASSWORD=sgr_")),
        "{env}"
    );
    assert!(env
        .lines()
        .any(|l| l == "NOSY_MODULE=/usr/lib/softhsm/libsofthsm2.so"));
}

/// With `drift_settings.run_as` the child is that user (a real uid, no capability):
/// besides the hidden secrets, a file only the server's user may read is out of its
/// reach too; the check still plans and applies.
#[test]
fn a_drift_child_run_as_an_unprivileged_user_reads_nothing_of_the_servers_user() {
    // SAFETY: geteuid(2) only reads this process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: switching to another user needs root");
        return;
    }
    let attack = drift_attack(Some("nobody"));
    let report = &attack.report;
    assert_eq!(
        (attack.checked.as_str(), attack.applied.as_str()),
        ("drifted", "applied"),
        "{report}"
    );
    assert_eq!(attack.applied_plan, "PLAN");
    let nobody = stategate::config::RunAs::resolve("nobody").unwrap();
    assert!(
        report.contains(&format!("UID {}\n", nobody.uid)),
        "{report}"
    );
    assert!(!report.contains("READ"), "{report}");
    for secret in &attack.secrets {
        assert!(!report.contains(secret.as_str()), "{secret:?}:\n{report}");
    }
    assert!(
        attack.env.lines().any(|l| l == "USER=nobody"),
        "{}",
        attack.env
    );
}
