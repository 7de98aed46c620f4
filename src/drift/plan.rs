//! Pure reading of what a drift check's child printed: the `plan -json` stream
//! (`change_summary`, diagnostics), the exit code, and the rules built on them — which
//! outcome a run has and whether an outcome change is worth a notification. (Which lock
//! a killed child left is no guess from its LockInfo: the lock row records the run's
//! credential, `tofu::run_credential`.) No I/O here.

use serde::{Deserialize, Serialize};

/// What a run found. Checks end in the first five; approved applies in the last three.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    InSync,
    Drifted,
    Error,
    SkippedLocked,
    /// The workspace was frozen (`workspace freeze`): nothing was run.
    SkippedFrozen,
    Applied,
    ApplyFailed,
    StalePlan,
}

impl Outcome {
    pub const ALL: [Outcome; 8] = [
        Outcome::InSync,
        Outcome::Drifted,
        Outcome::Error,
        Outcome::SkippedLocked,
        Outcome::SkippedFrozen,
        Outcome::Applied,
        Outcome::ApplyFailed,
        Outcome::StalePlan,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::InSync => "in_sync",
            Outcome::Drifted => "drifted",
            Outcome::Error => "error",
            Outcome::SkippedLocked => "skipped_locked",
            Outcome::SkippedFrozen => "skipped_frozen",
            Outcome::Applied => "applied",
            Outcome::ApplyFailed => "apply_failed",
            Outcome::StalePlan => "stale_plan",
        }
    }

    pub fn parse(text: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == text)
    }

    /// `stategate_drift_status`: 0 in sync, 1 drifted, 2 error. Other outcomes say
    /// nothing about the infrastructure and leave the status where it was.
    pub fn status_value(self) -> Option<i64> {
        match self {
            Outcome::InSync => Some(0),
            Outcome::Drifted => Some(1),
            Outcome::Error => Some(2),
            _ => None,
        }
    }
}

/// `Plan: N to add, N to change, N to destroy.` as numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Changes {
    pub add: i64,
    pub change: i64,
    pub destroy: i64,
}

/// What the `-json` stream said.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanReport {
    /// The `change_summary` message, if the plan got that far.
    pub changes: Option<Changes>,
    /// Error diagnostics, `summary: detail`, in order.
    pub errors: Vec<String>,
    /// The child gave up waiting for the state lock (`-lock-timeout` ran out).
    pub lock_refused: bool,
    /// Human lines: every message's `@message` (and a diagnostic's detail), and any
    /// line that was not JSON, in order.
    pub lines: Vec<String>,
}

/// Terraform's and OpenTofu's summary when `-lock-timeout` runs out.
const LOCK_ERROR: &str = "Error acquiring the state lock";
/// Terraform's refusal of a saved plan whose state moved on.
const STALE_PLAN: &str = "Saved plan is stale";

#[derive(Deserialize)]
struct Message {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(rename = "@message", default)]
    message: String,
    #[serde(default)]
    changes: Option<SummaryChanges>,
    #[serde(default)]
    diagnostic: Option<Diagnostic>,
}

#[derive(Deserialize)]
struct SummaryChanges {
    #[serde(default)]
    add: i64,
    #[serde(default)]
    change: i64,
    #[serde(default)]
    remove: i64,
}

#[derive(Deserialize)]
struct Diagnostic {
    #[serde(default)]
    severity: String,
    #[serde(default)]
    summary: String,
    #[serde(default)]
    detail: String,
}

/// Reads a `plan -json` stream line by line; anything unreadable is kept as text.
pub fn read_stream(stdout: &str) -> PlanReport {
    let mut report = PlanReport::default();
    for line in stdout.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
        let Ok(msg) = serde_json::from_str::<Message>(line) else {
            report.lines.push(line.to_string());
            continue;
        };
        match (msg.kind.as_str(), msg.changes, msg.diagnostic) {
            ("version", _, _) => continue,
            ("change_summary", Some(c), _) => {
                report.changes = Some(Changes {
                    add: c.add,
                    change: c.change,
                    destroy: c.remove,
                })
            }
            ("diagnostic", _, Some(d)) => {
                if d.summary.contains(LOCK_ERROR) {
                    report.lock_refused = true;
                }
                if d.severity == "error" {
                    report.errors.push(if d.detail.is_empty() {
                        d.summary.clone()
                    } else {
                        format!("{}: {}", d.summary, one_line(&d.detail))
                    });
                }
                if !d.detail.is_empty() {
                    report.lines.push(format!("{}\n{}", msg.message, d.detail));
                    continue;
                }
            }
            _ => {}
        }
        report.lines.push(msg.message);
    }
    report
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Exited(i32),
    /// Killed by a signal (no exit code).
    Signalled,
    /// Ran past its timeout; its process group was killed.
    TimedOut,
}

/// The outcome of a check's plan, and the one-line message that explains it.
pub fn classify_plan(ended: Ended, report: &PlanReport, stderr: &str) -> (Outcome, String) {
    let first_error = || {
        report
            .errors
            .first()
            .cloned()
            .or_else(|| last_line(stderr))
            .unwrap_or_default()
    };
    match ended {
        Ended::TimedOut => (
            Outcome::Error,
            "the check ran past its timeout; its process group was killed".into(),
        ),
        _ if report.lock_refused || stderr.contains(LOCK_ERROR) => (
            Outcome::SkippedLocked,
            "the workspace lock is held (the child's -lock-timeout ran out); nothing was disturbed"
                .into(),
        ),
        Ended::Exited(0) => (Outcome::InSync, "no changes".into()),
        Ended::Exited(2) => {
            let c = report.changes.unwrap_or_default();
            (
                Outcome::Drifted,
                format!(
                    "{} to add, {} to change, {} to destroy",
                    c.add, c.change, c.destroy
                ),
            )
        }
        Ended::Exited(code) => (
            Outcome::Error,
            format!("plan exited with code {code}: {}", first_error()),
        ),
        Ended::Signalled => (
            Outcome::Error,
            format!("plan was killed by a signal: {}", first_error()),
        ),
    }
}

/// The outcome of an approved apply of a saved plan.
/// The counts of Terraform's `Apply complete! Resources: 1 added, 2 changed, 1 destroyed.`
/// (the last such line; `None` when the apply printed none).
pub fn apply_changes(output: &str) -> Option<Changes> {
    let line = output
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("Apply complete! Resources: "))?;
    let mut changes = Changes::default();
    let mut seen = 0;
    for part in line.trim_end_matches('.').split(',') {
        let mut words = part.split_whitespace();
        let n: i64 = words.next()?.parse().ok()?;
        match words.next()? {
            "added" => changes.add = n,
            "changed" => changes.change = n,
            "destroyed" => changes.destroy = n,
            // OpenTofu's "imported"/"forgotten" are not in the three counts.
            _ => continue,
        }
        seen += 1;
    }
    (seen > 0).then_some(changes)
}

pub fn classify_apply(ended: Ended, output: &str) -> (Outcome, String) {
    match ended {
        Ended::TimedOut => (
            Outcome::ApplyFailed,
            "the apply ran past its timeout; its process group was killed".into(),
        ),
        _ if output.contains(STALE_PLAN) => (
            Outcome::StalePlan,
            "Terraform refused the saved plan: the state changed since the check (\"Saved plan is stale\"); nothing was applied, run a new check".into(),
        ),
        Ended::Exited(0) => (Outcome::Applied, "the saved plan was applied".into()),
        _ if output.contains(LOCK_ERROR) => (
            Outcome::ApplyFailed,
            "the workspace lock is held by another run; nothing was applied".into(),
        ),
        Ended::Exited(code) => (
            Outcome::ApplyFailed,
            format!(
                "apply exited with code {code}: {}",
                last_error_line(output).unwrap_or_default()
            ),
        ),
        Ended::Signalled => (Outcome::ApplyFailed, "apply was killed by a signal".into()),
    }
}

fn last_line(text: &str) -> Option<String> {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
}

fn last_error_line(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .find(|l| l.starts_with("Error:") || l.starts_with("│ Error:"))
        .map(str::to_string)
        .or_else(|| last_line(text))
}

/// Is a change from the workspace's previous check outcome to `new` worth an event?
/// `previous` is the last check that said something about the infrastructure (in sync,
/// drifted or error); skipped checks and applies are never compared.
pub fn should_notify(previous: Option<Outcome>, new: Outcome) -> bool {
    if new.status_value().is_none() {
        return false;
    }
    match previous {
        None => new != Outcome::InSync,
        Some(previous) => previous != new,
    }
}

/// The human text of a run without `show` output: what the stream said.
pub fn render(report: &PlanReport, stderr: &str) -> String {
    let mut out = report.lines.join("\n");
    if !stderr.trim().is_empty() {
        out.push_str("\n\n--- stderr ---\n");
        out.push_str(stderr.trim_end());
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRIFTED: &str = r#"{"@level":"info","@message":"Terraform 1.15.5","type":"version","terraform":"1.15.5","ui":"1.3"}
{"@level":"info","@message":"terraform_data.a: Plan to update","type":"planned_change","change":{"action":"update"}}
{"@level":"info","@message":"Plan: 1 to add, 2 to change, 3 to destroy.","changes":{"add":1,"change":2,"import":0,"remove":3,"operation":"plan"},"type":"change_summary"}
"#;

    const LOCKED: &str = r#"{"@level":"error","@message":"Error: Error acquiring the state lock","type":"diagnostic","diagnostic":{"severity":"error","summary":"Error acquiring the state lock","detail":"Error message: HTTP remote state already locked"}}"#;

    #[test]
    fn change_summary_and_diagnostics_are_read() {
        let table: &[(&str, Option<Changes>, bool, usize)] = &[
            (
                DRIFTED,
                Some(Changes {
                    add: 1,
                    change: 2,
                    destroy: 3,
                }),
                false,
                0,
            ),
            (LOCKED, None, true, 1),
            ("not json at all\n", None, false, 0),
            ("", None, false, 0),
            (
                r#"{"type":"change_summary","changes":{"add":0,"change":0,"remove":0}}"#,
                Some(Changes::default()),
                false,
                0,
            ),
            (
                r#"{"type":"diagnostic","@message":"Warning: x","diagnostic":{"severity":"warning","summary":"x"}}"#,
                None,
                false,
                0,
            ),
        ];
        for (input, changes, locked, errors) in table {
            let r = read_stream(input);
            assert_eq!(r.changes, *changes, "{input}");
            assert_eq!(r.lock_refused, *locked, "{input}");
            assert_eq!(r.errors.len(), *errors, "{input}");
        }
        let r = read_stream(DRIFTED);
        assert_eq!(
            r.lines,
            vec![
                "terraform_data.a: Plan to update",
                "Plan: 1 to add, 2 to change, 3 to destroy."
            ]
        );
        assert_eq!(
            read_stream("garbage\n").lines,
            vec!["garbage".to_string()],
            "non-JSON lines are kept"
        );
        assert!(read_stream(LOCKED).errors[0].contains("already locked"));
    }

    #[test]
    fn outcomes_from_exit_codes() {
        let drifted = read_stream(DRIFTED);
        let locked = read_stream(LOCKED);
        let none = PlanReport::default();
        let table: &[(Ended, &PlanReport, &str, Outcome)] = &[
            (Ended::Exited(0), &none, "", Outcome::InSync),
            (Ended::Exited(2), &drifted, "", Outcome::Drifted),
            (Ended::Exited(1), &none, "Error: boom", Outcome::Error),
            (Ended::Exited(1), &locked, "", Outcome::SkippedLocked),
            (
                Ended::Exited(1),
                &none,
                "Error: Error acquiring the state lock",
                Outcome::SkippedLocked,
            ),
            (Ended::TimedOut, &drifted, "", Outcome::Error),
            (Ended::Signalled, &none, "", Outcome::Error),
        ];
        for (ended, report, stderr, want) in table {
            assert_eq!(
                classify_plan(*ended, report, stderr).0,
                *want,
                "{ended:?} {stderr}"
            );
        }
        assert_eq!(
            classify_plan(Ended::Exited(2), &drifted, "").1,
            "1 to add, 2 to change, 3 to destroy"
        );
        assert!(classify_plan(Ended::Exited(1), &none, "Error: boom\n")
            .1
            .contains("Error: boom"));
    }

    #[test]
    fn apply_counts_are_read_from_terraforms_last_summary_line() {
        type Counts = Option<(i64, i64, i64)>;
        let table: &[(&str, Counts)] = &[
            (
                "x\nApply complete! Resources: 1 added, 2 changed, 1 destroyed.\n",
                Some((1, 2, 1)),
            ),
            (
                "Apply complete! Resources: 0 added, 0 changed, 0 destroyed.",
                Some((0, 0, 0)),
            ),
            (
                "Apply complete! Resources: 1 imported, 3 added, 0 changed, 0 destroyed.",
                Some((3, 0, 0)),
            ),
            ("Error: nope", None),
            ("Apply complete! Resources: many added.", None),
            ("", None),
        ];
        for (text, want) in table {
            let got = apply_changes(text).map(|c| (c.add, c.change, c.destroy));
            assert_eq!(got, *want, "{text}");
        }
    }

    #[test]
    fn apply_outcomes() {
        let stale = "Error: Saved plan is stale\n\nThe given plan file can no longer be applied";
        let table: &[(Ended, &str, Outcome)] = &[
            (Ended::Exited(0), "Apply complete!", Outcome::Applied),
            (Ended::Exited(1), stale, Outcome::StalePlan),
            (Ended::Exited(1), "Error: nope", Outcome::ApplyFailed),
            (Ended::TimedOut, "", Outcome::ApplyFailed),
        ];
        for (ended, output, want) in table {
            assert_eq!(classify_apply(*ended, output).0, *want, "{output}");
        }
        assert!(classify_apply(Ended::Exited(1), stale)
            .1
            .contains("Saved plan is stale"));
    }

    #[test]
    fn notify_only_on_a_change_of_what_the_infrastructure_is() {
        use Outcome::*;
        let table: &[(Option<Outcome>, Outcome, bool)] = &[
            (None, InSync, false),
            (None, Drifted, true),
            (None, Error, true),
            (Some(InSync), InSync, false),
            (Some(InSync), Drifted, true),
            (Some(Drifted), Drifted, false),
            (Some(Drifted), InSync, true),
            (Some(InSync), Error, true),
            (Some(Error), Error, false),
            (Some(Error), InSync, true),
            (Some(InSync), SkippedLocked, false),
            (Some(Drifted), Applied, false),
        ];
        for (previous, new, want) in table {
            assert_eq!(
                should_notify(*previous, *new),
                *want,
                "{previous:?} -> {new:?}"
            );
        }
    }

    #[test]
    fn outcome_names_round_trip() {
        for o in Outcome::ALL {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
            assert_eq!(
                serde_json::to_value(o).unwrap(),
                serde_json::json!(o.as_str())
            );
        }
        assert_eq!(Outcome::parse("nope"), None);
    }
}
