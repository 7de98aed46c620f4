//! A bad configuration as the real binary meets it: `serve` and every operator
//! command refuse to start, exit 1 with one line naming the key or variable, and
//! leave nothing behind (no data dir, no key, no database).

use std::path::Path;
use std::process::Command;

struct Run {
    code: i32,
    stderr: String,
}

fn stategate(data: &Path, env: &[(&str, &str)], args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_stategate"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("STATEGATE_DATA_DIR", data)
        .env("STATEGATE_LISTEN", "127.0.0.1:0")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

#[test]
fn bad_config_and_unknown_variables_stop_every_command_before_it_touches_anything() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let relative = write(
        "relative.toml",
        "[[drift]]\nworkspace = \"prod\"\ndir = \"infra/prod\"\n",
    );
    let endless = write(
        "endless.toml",
        "[[drift]]\nworkspace = \"prod\"\ndir = \"/srv/prod\"\ntimeout_seconds = 9223372036854775807\n",
    );
    /// (config file, extra env, the message on stderr)
    type Case<'a> = (Option<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            Some(&relative),
            vec![],
            "drift[0].dir (the [[drift]] entry for workspace \"prod\") must be an absolute path",
        ),
        (
            Some(&endless),
            vec![],
            "drift[0].timeout_seconds must be at most 604800 (7 days), not 9223372036854775807",
        ),
        (
            None,
            vec![("STATEGATE_LISTNE", "0.0.0.0:9")],
            "unknown environment variable STATEGATE_LISTNE (the closest known one is STATEGATE_LISTEN)",
        ),
        (
            None,
            vec![("STATEGATE_S3_BUKET", "tf")],
            "unknown environment variable STATEGATE_S3_BUKET (the closest known one is STATEGATE_S3_BUCKET)",
        ),
        (
            None,
            vec![("STATEGATE_BACKUP_INTERVAL_SECONDS", "9223372036854775807")],
            "backup.interval_seconds (STATEGATE_BACKUP_INTERVAL_SECONDS) must be at most",
        ),
    ];
    let commands: &[&[&str]] = &[
        &["serve"],
        &["workspace", "list"],
        &["drift", "list"],
        &["admin", "org", "list"],
        &["backup"],
        &["restore", "--into", "/nonexistent/x.db"],
    ];
    for (file, env, needle) in &cases {
        for command in commands {
            let mut args: Vec<&str> = Vec::new();
            if let Some(file) = file {
                args.extend(["--config", file]);
            }
            args.extend(command.iter());
            let run = stategate(&data, env, &args);
            let what = format!("{args:?} {env:?}");
            assert_eq!(run.code, 1, "{what}: {}", run.stderr);
            let lines: Vec<&str> = run.stderr.lines().collect();
            assert_eq!(lines.len(), 1, "{what}: {:?}", run.stderr);
            assert!(
                lines[0].starts_with("error: invalid configuration: ") && lines[0].contains(needle),
                "{what}: {}",
                lines[0]
            );
            // The value of an unknown variable is never echoed (it may be a secret).
            if needle.starts_with("unknown environment variable") {
                for (_, value) in env {
                    assert!(!lines[0].contains(value), "{what}: {}", lines[0]);
                }
            }
            assert!(!data.exists(), "{what}: the data dir was created");
        }
    }
    // The tooling's own variables pass: the same command with them is not refused
    // for them (it fails later, on the missing database, as it always did).
    let tooling = [
        ("STATEGATE_BIN", "/x"),
        ("STATEGATE_TEST_S3_ENDPOINT", "http://x"),
        ("STATEGATE_E2E_REQUIRE_GARAGE", "1"),
        ("STATEGATE_LOG", "warn"),
    ];
    let run = stategate(&data, &tooling, &["workspace", "list"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("no database at"), "{}", run.stderr);
}
