//! Drift fixtures shared by `tests/drift.rs` and `tests/ui.rs`: a shell script standing
//! in for `tofu`, and a check of it.

use std::path::{Path, PathBuf};

use stategate::config::{DriftBinary, DriftCheck};

/// A `tofu` stand-in: plan reads `input` in its directory ("same" = no changes) and
/// writes a plan file naming it; show prints it; apply copies the plan to `applied`.
pub const FAKE_TOFU: &str = r#"#!/bin/sh
cmd="$1"; shift
case "$cmd" in
init) mkdir -p .terraform; exit 0 ;;
plan)
  for a in "$@"; do case "$a" in -out=*) out="${a#-out=}" ;; esac; done
  printf 'PLAN-%s' "$(cat input)" > "$out"
  if [ "$(cat input)" = same ]; then
    echo '{"type":"change_summary","@message":"No changes.","changes":{"add":0,"change":0,"remove":0}}'
    exit 0
  fi
  echo '{"type":"planned_change","@message":"thing: Plan to update"}'
  echo '{"type":"change_summary","@message":"Plan: 0 to add, 1 to change, 0 to destroy.","changes":{"add":0,"change":1,"remove":0}}'
  exit 2 ;;
show) echo "human text of the saved plan $2"; exit 0 ;;
apply) for a in "$@"; do last="$a"; done; cat "$last" > applied; exit 0 ;;
esac
exit 1
"#;

pub fn fake_tofu(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("fake-tofu");
    std::fs::write(&path, FAKE_TOFU).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A check's directory (an empty `main.tf`, and `input` holding `input`: "same" plans
/// no changes) with the fake binary in it, and the binary's path.
pub fn check_dir(input: &str) -> (tempfile::TempDir, String) {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::write(scratch.path().join("main.tf"), "").unwrap();
    std::fs::write(scratch.path().join("input"), input).unwrap();
    let tofu = fake_tofu(scratch.path()).display().to_string();
    (scratch, tofu)
}

pub fn check(workspace: &str, dir: &Path, binary: &str) -> DriftCheck {
    DriftCheck {
        workspace: workspace.into(),
        dir: dir.to_path_buf(),
        binary: DriftBinary(binary.into()),
        var_files: Vec::new(),
        env: Default::default(),
        interval_seconds: 0,
        timeout_seconds: 30,
        approve_apply: true,
        opentofu_encryption: false,
    }
}

/// A `tofu` stand-in that, on `plan`, tries to read the server's secrets: the
/// environment and memory of its parent and of `$NOSY_PID` (the server), and
/// `$NOSY_DATA/dek` / `stategate.db`. It writes `report` in its directory: one line per
/// target, `READ <target>` followed by what it got, or `DENIED <target>`; and `PPID …`.
pub const NOSY_TOFU: &str = r#"#!/bin/sh
cmd="$1"; shift
case "$cmd" in
init) mkdir -p .terraform; exit 0 ;;
plan)
  {
  echo "PPID $PPID"
  for f in /proc/$PPID/environ /proc/$NOSY_PID/environ /proc/$NOSY_PID/cmdline \
           /proc/$NOSY_PID/maps "$NOSY_DATA/dek" "$NOSY_DATA/stategate.db"; do
    if got="$(head -c 65536 "$f" 2>/dev/null | od -An -c)" && [ -n "$got" ]; then
      echo "READ $f"; head -c 65536 "$f" 2>/dev/null | tr '\0' '\n'; echo
    else
      echo "DENIED $f"
    fi
  done
  for pid in $PPID $NOSY_PID; do
    addr="$(head -n1 /proc/$pid/maps 2>/dev/null | cut -d- -f1)"
    if [ -n "$addr" ] && got="$(dd if=/proc/$pid/mem bs=4096 count=1 skip=$((0x$addr)) iflag=skip_bytes 2>/dev/null | od -An -c)" && [ -n "$got" ]; then
      echo "READ /proc/$pid/mem"
    else
      echo "DENIED /proc/$pid/mem"
    fi
  done
  } > report
  echo '{"type":"change_summary","@message":"No changes.","changes":{"add":0,"change":0,"remove":0}}'
  exit 0 ;;
esac
exit 1
"#;

pub fn nosy_tofu(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("nosy-tofu");
    std::fs::write(&path, NOSY_TOFU).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}
