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
