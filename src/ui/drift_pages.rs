//! The drift pages, from the plain values `drift::DriftService` returns: the configured
//! checks with their status and the newest runs, one run with its plan text, the
//! approval form of a drifted check's kept plan, and the drift line of a workspace
//! page. Like `pages`, everything is interpolated with maud's escaping `(…)`; plan
//! text and messages come from a child process and are always text.

use maud::{html, Markup};

use super::layout::{
    dash, exact_pattern, layout, layout_refreshing, unix_seconds, when, ws_href, Chrome,
};
use crate::drift::{Changes, CheckSummary, Kind, Outcome, Run, RunOutput};
use crate::operator::roles::Action;

/// How often a page showing a run that is still going reloads itself (seconds).
const REFRESH_WHILE_RUNNING: u32 = 2;

pub fn run_href(id: i64) -> String {
    format!("/ui/drift/{id}")
}

fn drift_href(workspace: &str) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("workspace", workspace);
    format!("/ui/drift?{}", q.finish())
}

/// An outcome as a coloured badge.
fn outcome_badge(outcome: Option<Outcome>) -> Markup {
    let Some(o) = outcome else {
        return html! { span.badge.running { "running" } };
    };
    let class = match o {
        Outcome::InSync | Outcome::Applied => "ok",
        Outcome::Drifted => "warn",
        Outcome::Error | Outcome::ApplyFailed | Outcome::StalePlan => "bad",
        Outcome::SkippedLocked | Outcome::SkippedFrozen => "quiet",
    };
    html! { span class=(format!("badge outcome {class}")) { (o.as_str()) } }
}

fn changes_text(c: Option<Changes>) -> String {
    c.map_or_else(
        || "–".into(),
        |c| {
            format!(
                "{} to add, {} to change, {} to destroy",
                c.add, c.change, c.destroy
            )
        },
    )
}

/// A future time as `in 5 min` (absolute on hover); past or now: `due now`.
fn until(rfc3339: &str, now: i64) -> Markup {
    match unix_seconds(rfc3339).and_then(|t| Some((t, super::layout::utc(t)?))) {
        Some((t, (iso, shown))) if t > now => {
            let rel = super::layout::ago(t - now);
            html! { time datetime=(iso) { "in " (rel.trim_end_matches(" ago")) " · " span.abs { (shown) } } }
        }
        Some((_, (iso, shown))) => {
            html! { time datetime=(iso) { "due now · " span.abs { (shown) } } }
        }
        None => html! { span.muted { (rfc3339) } },
    }
}

/// `state moved` when a newer state may void the run's finding; after an approved
/// apply of its plan the state moved because of that apply, which is said instead.
fn state_moved_badge(run: &Run) -> Markup {
    html! {
        @if let Some(apply) = run.applied_by {
            " " a href=(run_href(apply)) title="The state moved because this plan was applied; the next check shows whether the drift is gone." {
                span.badge.ok { "fix applied by #" (apply) }
            }
        } @else if run.state_moved {
            span.badge.warn title="The workspace has a newer state than the one this check planned against: its finding may no longer hold." { "state moved" }
        }
    }
}

/// A check's status: its newest finished check's outcome, or `never run`.
fn check_status(check: &CheckSummary) -> Markup {
    html! {
        @match &check.last_check {
            Some(run) => {
                (outcome_badge(run.outcome))
                (state_moved_badge(run))
                @if matches!(run.outcome, Some(Outcome::SkippedLocked | Outcome::SkippedFrozen)) {
                    @if let Some(status) = check.status {
                        " " span.muted { "(last known: " (status.as_str()) ")" }
                    }
                }
                @if run.approvable { " " span.badge.warn { "awaiting approval" } }
            }
            None => span.badge.quiet { "never run" },
        }
        @if let Some(id) = check.running {
            " " a href=(run_href(id)) { span.badge.running { "running" } }
        }
    }
}

/// The drift line of a workspace page that has a configured check.
pub fn status_line(chrome: &Chrome, check: &CheckSummary) -> Markup {
    html! {
        p.drift-line #drift-status {
            "Drift: " (check_status(check))
            @if let Some(run) = &check.last_check {
                " · checked "
                @match &run.finished_at { Some(t) => (when(t, chrome.now)), None => "–" }
                " · " a href=(run_href(run.id)) { "run #" (run.id) }
            }
            " · " a href=(drift_href(&check.workspace)) { "drift checks and runs" }
        }
    }
}

/// `tofu · every 1 h · apply by approval`
fn check_settings(c: &CheckSummary) -> String {
    let binary = std::path::Path::new(&c.binary)
        .file_name()
        .map_or_else(|| c.binary.clone(), |n| n.to_string_lossy().into_owned());
    let every = match c.interval_seconds {
        0 => "on demand".to_string(),
        s => format!(
            "every {}",
            super::layout::ago(s as i64).trim_end_matches(" ago")
        ),
    };
    let approval = if c.approve_apply {
        " · apply by approval"
    } else {
        ""
    };
    format!("{binary} · {every}{approval}")
}

/// Only for an operator allowed to run checks there (the server refuses the others).
fn run_check_button(chrome: &Chrome, check: &CheckSummary) -> Markup {
    if !chrome.may(Action::Operate, &check.workspace) {
        return html! {};
    }
    html! {
        form.link method="post" action=(format!("/ui/drift/{}/run", check.workspace)) {
            input type="hidden" name="csrf" value=(chrome.csrf);
            button.link type="submit" disabled[check.running.is_some()] { "Run check now" }
        }
    }
}

fn checks_table(chrome: &Chrome, checks: &[CheckSummary]) -> Markup {
    let now = chrome.now;
    html! {
        div.table-wrap { table #checks {
            thead { tr {
                th { "Workspace" } th { "Status" } th { "Last check" } th.hide-narrow { "Changes" }
                th { "Next due" } th { span.sr-only { "Actions" } }
            } }
            tbody { @for c in checks { tr {
                td data-label="Workspace" {
                    a href=(ws_href(&c.workspace)) { (c.workspace) }
                    br;
                    span.muted.small title=(c.dir.display().to_string()) { (check_settings(c)) }
                }
                td data-label="Status" { (check_status(c)) }
                td.nowrap data-label="Last check" { @match &c.last_check {
                    Some(run) => {
                        a href=(run_href(run.id)) { "#" (run.id) } " "
                        @match &run.finished_at { Some(t) => (when(t, now)), None => "–" }
                    }
                    None => span.muted { "–" },
                } }
                td.hide-narrow data-label="Changes" { (changes_text(c.last_check.as_ref().and_then(|r| r.changes))) }
                td.nowrap data-label="Next due" { @match &c.next_due_at {
                    Some(t) => (until(t, now)),
                    None => span.muted title="interval_seconds = 0" { "on demand" },
                } }
                td.nowrap { (run_check_button(chrome, c)) }
            } } }
        } }
    }
}

/// A run's relation to its check or apply.
fn run_note(run: &Run) -> Markup {
    html! {
        @if let Some(check) = run.applies {
            "applies " a href=(run_href(check)) { "#" (check) }
        } @else if run.approvable {
            span.badge.warn { "awaiting approval" }
        }
        (state_moved_badge(run))
    }
}

fn runs_table(chrome: &Chrome, runs: &[Run]) -> Markup {
    html! {
        div.table-wrap { table #runs {
            thead { tr {
                th.num { "Run" } th { "Workspace" } th.hide-narrow { "Kind" } th { "Outcome" }
                th.hide-narrow { "Trigger" } th { "Started" } th.hide-narrow { "Changes" } th { span.sr-only { "Notes" } }
            } }
            tbody { @for r in runs { tr {
                td.num data-label="Run" { a href=(run_href(r.id)) { "#" (r.id) } }
                td data-label="Workspace" { a href=(drift_href(&r.workspace)) { (r.workspace) } }
                td.hide-narrow data-label="Kind" { (kind_text(r.kind)) }
                td data-label="Outcome" { (outcome_badge(r.outcome)) }
                td.hide-narrow data-label="Trigger" { (r.trigger) }
                td.nowrap data-label="Started" { (when(&r.started_at, chrome.now)) }
                td.hide-narrow data-label="Changes" { (changes_text(r.changes)) }
                td { (run_note(r)) }
            } } }
        } }
    }
}

fn kind_text(kind: Kind) -> &'static str {
    match kind {
        Kind::Check => "check",
        Kind::Apply => "apply",
    }
}

/// The runs listing's state: the workspace filter as typed, the limit, and whether
/// there may be more.
pub struct RunsView<'a> {
    pub workspace: &'a str,
    pub limit: u32,
    pub more: Option<String>,
}

pub fn drift(chrome: &Chrome, checks: &[CheckSummary], runs: &[Run], view: &RunsView) -> Markup {
    let body = html! {
        h1 { "Drift" }
        p.muted {
            "A drift check is a scheduled " code { "plan -detailed-exitcode" } " of a workspace: "
            "in_sync (exit 0), drifted (exit 2: the infrastructure no longer matches the code), "
            "error, skipped_locked (someone held the lock) or skipped_frozen (the workspace was frozen)."
        }
        @if checks.is_empty() {
            div.card.empty #no-checks {
                "No drift checks are configured. Add a " code { "[[drift]]" } " entry (" code { "workspace" } ", "
                code { "dir" } ", " code { "binary" } ", " code { "interval_seconds" } ") to the configuration file and restart stategate; "
                "see “Drift checks” in docs/drift.md."
            }
        } @else {
            (checks_table(chrome, checks))
        }
        h2 { "Recent runs" }
        form.inline method="get" action="/ui/drift" {
            label { "Workspace" input type="text" name="workspace" value=(view.workspace) placeholder="prod"; }
            button type="submit" { "Filter" }
            @if !view.workspace.is_empty() { a href="/ui/drift" { "Clear" } }
        }
        @if runs.is_empty() {
            div.card.empty {
                @if view.workspace.is_empty() { "No drift runs yet." } @else { "No drift runs of “" (view.workspace) "”." }
            }
        } @else {
            (runs_table(chrome, runs))
        }
        div.pager {
            span.muted { "The newest " (view.limit) " runs." }
            @if let Some(href) = &view.more { a href=(href) { "Show more →" } }
        }
    };
    layout("Drift", Some(chrome), body)
}

/// Why a drifted check's plan cannot be approved (it is not `approvable`).
fn not_approvable(run: &Run, now: i64) -> Option<String> {
    if run.kind != Kind::Check || run.outcome != Some(Outcome::Drifted) || run.approvable {
        return None;
    }
    Some(match (run.applied_by, run.plan_expires_at) {
        (Some(apply), _) => format!("This plan was approved already (apply run #{apply})."),
        (None, None) => {
            "No plan was kept for approval (approve_apply is off for this check, or keeping it failed).".into()
        }
        (None, Some(t)) if t <= now => "The kept plan has expired; run a new check.".into(),
        (None, Some(_)) => "The kept plan cannot be approved now.".into(),
    })
}

fn approve_form(chrome: &Chrome, run: &Run) -> Markup {
    let ws = &run.workspace;
    html! {
        h2 { "Approve and apply" }
        p {
            "Applies exactly this saved plan to " strong { (ws) } " with its derived backend credentials, "
            "as a new apply run audited as " code { "drift.apply_approved" } " by you. "
            "Terraform refuses the plan if the state moved on since the check."
        }
        @if run.state_moved {
            p.notice.warn { "The workspace’s state changed since this check planned; Terraform will most likely refuse this plan as stale. Run a new check instead." }
        }
        form.inline #approve method="post" action=(format!("/ui/drift/{}/apply", run.id)) {
            input type="hidden" name="csrf" value=(chrome.csrf);
            label {
                span { "Type " code { (ws) } " to confirm" }
                input type="text" name="confirm" required autocomplete="off" pattern=(exact_pattern(ws));
            }
            button.danger type="submit" { "Approve and apply" }
        }
    }
}

/// One run; `output`: its stored plan or apply text.
pub fn run(chrome: &Chrome, run: &Run, output: &RunOutput) -> Markup {
    let now = chrome.now;
    let running = run.finished_at.is_none();
    let skipped = matches!(
        run.outcome,
        Some(Outcome::SkippedLocked | Outcome::SkippedFrozen)
    );
    let body = html! {
        p.muted {
            a href="/ui/drift" { "Drift" } " / " a href=(drift_href(&run.workspace)) { (run.workspace) } " /"
        }
        h1 { "Drift " (kind_text(run.kind)) " #" (run.id) " · " (run.workspace) " " (outcome_badge(run.outcome)) }
        @if running {
            p.notice.warn #running { "This run is still going; the page reloads every " (REFRESH_WHILE_RUNNING) " seconds." }
        }
        @if let Some(apply) = run.applied_by {
            p.notice.ok #applied { "This plan was approved and applied by " a href=(run_href(apply)) { "apply run #" (apply) } "; the next check shows whether the drift is gone." }
        } @else if run.state_moved && !run.approvable && !skipped {
            p.notice.warn { "The workspace’s state changed since this check planned; its finding may no longer hold." }
        }
        section.card { dl.facts #run-facts {
            dt { "Workspace" } dd { a href=(ws_href(&run.workspace)) { (run.workspace) } }
            dt { "Kind" } dd { (kind_text(run.kind)) }
            dt { "Outcome" } dd { @match run.outcome { Some(o) => (o.as_str()), None => "running" } }
            dt { "Trigger" } dd { (run.trigger) }
            dt { "Started" } dd { (when(&run.started_at, now)) }
            dt { "Finished" } dd { @match &run.finished_at { Some(t) => (when(t, now)), None => "–" } }
            dt { "Exit code" } dd { (dash(run.exit_code)) }
            dt { "Changes" } dd { (changes_text(run.changes)) }
            @match run.outcome {
                Some(Outcome::SkippedLocked) => {
                    dt { "Not planned" } dd #skipped {
                        "Skipped because the workspace was locked"
                        // The holder as recorded (`Run::locked_by`); a run an earlier
                        // release wrote has none, and its message, shown below, names it.
                        @if let Some(who) = run.locked_by.as_deref().map(str::trim).filter(|w| !w.is_empty()) {
                            " by " strong { (who) }
                        }
                        "; nothing was disturbed. The next check runs as scheduled, or run one now."
                    }
                }
                Some(Outcome::SkippedFrozen) => {
                    dt { "Not planned" } dd #skipped { "Skipped because the workspace was frozen; nothing was disturbed." }
                }
                _ => {
                    dt { "Planned against" } dd {
                        "serial " (dash(run.serial)) ", lineage " code { (run.lineage.as_deref().unwrap_or("–")) }
                    }
                }
            }
            @if let Some(check) = run.applies {
                dt { "Applies" } dd { a href=(run_href(check)) { "check #" (check) } }
            }
            @if let Some(apply) = run.applied_by {
                dt { "Approved" } dd { a href=(run_href(apply)) { "apply run #" (apply) } }
            }
            @if let Some(t) = run.plan_expires_at.filter(|_| run.applied_by.is_none()) {
                dt { "Plan kept until" } dd { (expiry(t, now)) }
            }
            dt { "Message" } dd #message { (run.message.as_deref().unwrap_or("–")) }
        } }
        @if run.approvable && chrome.may(Action::Operate, &run.workspace) {
            (approve_form(chrome, run))
        } @else if let Some(why) = not_approvable(run, now) {
            p.notice.warn #not-approvable { (why) }
        }
        h2 { "Output" }
        @match output {
            RunOutput::Text(text) => pre #output { (text) },
            RunOutput::Pruned { .. } => p.muted #output-pruned { (output.pruned_note().unwrap_or_default()) },
            RunOutput::Absent => p.muted { @if running { "Not finished yet." } @else { "No output was stored for this run." } },
        }
    };
    let title = format!("drift run {}", run.id);
    layout_refreshing(
        &title,
        Some(chrome),
        running.then_some(REFRESH_WHILE_RUNNING),
        body,
    )
}

fn expiry(unix: i64, now: i64) -> Markup {
    let rfc = time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string());
    if unix <= now {
        html! { span title=(rfc) { "expired" } }
    } else {
        until(&rfc, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_with(outcome: Option<Outcome>, evil: &str) -> Run {
        Run {
            id: 7,
            workspace: "prod".into(),
            kind: Kind::Check,
            trigger: evil.into(),
            applies: None,
            started_at: evil.into(),
            finished_at: Some(evil.into()),
            exit_code: Some(2),
            outcome,
            message: Some(evil.into()),
            changes: Some(Changes {
                add: 1,
                change: 2,
                destroy: 3,
            }),
            serial: Some(4),
            lineage: Some(evil.into()),
            output_blob: None,
            plan_expires_at: Some(i64::MAX),
            applied_by: None,
            locked_by: Some(evil.into()),
            approvable: true,
            state_moved: true,
        }
    }

    #[test]
    fn a_skipped_run_says_why_and_who_held_the_lock_not_what_it_planned_against() {
        let chrome = Chrome {
            email: "e",
            csrf: "c",
            grant: &crate::operator::roles::Grant::ROOT,
            now: 0,
        };
        let by_service = r#"the workspace is locked by "ana@box \"<b>\"" (OperationTypeApply, lock L1); nothing was disturbed"#;
        let by_child =
            "the workspace lock is held (the child's -lock-timeout ran out); nothing was disturbed";
        // (outcome, message, recorded holder, on the page, not on the page)
        type Row<'a> = (
            Outcome,
            &'a str,
            Option<&'a str>,
            &'a [&'a str],
            &'a [&'a str],
        );
        let table: &[Row] = &[
            (
                Outcome::SkippedLocked,
                by_service,
                Some(r#"ana@box "<b>""#),
                &["Skipped because the workspace was locked by <strong>ana@box &quot;&lt;b&gt;&quot;</strong>;"],
                &["Planned against", "serial 4", "state changed since"],
            ),
            // The holder comes from the recorded field, never from the message: a
            // message naming someone else does not change who is shown.
            (
                Outcome::SkippedLocked,
                r#"the workspace is locked by "mallory" (x)"#,
                Some("ana"),
                &["locked by <strong>ana</strong>;"],
                &["<strong>mallory"],
            ),
            (
                Outcome::SkippedLocked,
                by_child,
                None,
                &["Skipped because the workspace was locked; nothing was disturbed."],
                &["Planned against", " by <strong>"],
            ),
            // A run an earlier release wrote: no recorded holder, so none in bold, and
            // its message (which names the holder) still on the page.
            (
                Outcome::SkippedLocked,
                by_service,
                None,
                &[
                    "Skipped because the workspace was locked; nothing was disturbed.",
                    "the workspace is locked by &quot;ana@box",
                ],
                &[" by <strong>"],
            ),
            // An empty or blank recorded name says nothing.
            (
                Outcome::SkippedLocked,
                by_child,
                Some("  "),
                &["Skipped because the workspace was locked; nothing was disturbed."],
                &[" by <strong>"],
            ),
            (
                Outcome::SkippedFrozen,
                "frozen",
                None,
                &["Skipped because the workspace was frozen"],
                &["Planned against"],
            ),
            (Outcome::InSync, "no changes", None, &["Planned against", "serial 4"], &["Skipped"]),
        ];
        for (outcome, message, holder, has, lacks) in table {
            let r = Run {
                message: Some((*message).into()),
                locked_by: holder.map(str::to_string),
                approvable: false,
                ..run_with(Some(*outcome), "x")
            };
            let page = run(&chrome, &r, &RunOutput::Absent).into_string();
            for want in *has {
                assert!(
                    page.contains(want),
                    "{outcome:?} {holder:?}: {want} not on {page}"
                );
            }
            for not in *lacks {
                assert!(
                    !page.contains(not),
                    "{outcome:?} {holder:?}: {not} on {page}"
                );
            }
        }
    }

    #[test]
    fn drift_values_are_escaped_and_approval_needs_the_typed_name() {
        let evil = "<script>alert(1)</script>";
        let chrome = Chrome {
            email: evil,
            csrf: evil,
            grant: &crate::operator::roles::Grant::ROOT,
            now: 0,
        };
        let r = run_with(Some(Outcome::Drifted), evil);
        let check = CheckSummary {
            workspace: "prod".into(),
            dir: evil.into(),
            binary: evil.into(),
            interval_seconds: 60,
            timeout_seconds: 60,
            approve_apply: true,
            status: Some(Outcome::Drifted),
            status_at: Some(evil.into()),
            running: None,
            last_check: Some(r.clone()),
            next_due_at: Some(evil.into()),
        };
        let view = RunsView {
            workspace: evil,
            limit: 50,
            more: Some(evil.into()),
        };
        for page in [
            run(&chrome, &r, &RunOutput::Text(evil.into())),
            drift(
                &chrome,
                std::slice::from_ref(&check),
                std::slice::from_ref(&r),
                &view,
            ),
            status_line(&chrome, &check),
        ] {
            let html = page.into_string();
            assert!(!html.contains("<script>"), "{html}");
            assert!(html.contains("&lt;script&gt;"));
        }
        assert!(drift(&chrome, &[check], &[], &view)
            .into_string()
            .contains("script&gt; · every 60s · apply by approval"));
        let page = run(&chrome, &r, &RunOutput::Absent).into_string();
        assert!(page.contains(r#"id="approve""#) && page.contains(r#"pattern="prod""#));
        assert!(page.contains("state changed since this check planned"));
    }

    #[test]
    fn only_an_approvable_run_has_the_form_and_others_say_why() {
        let approved = Run {
            approvable: false,
            applied_by: Some(9),
            ..run_with(Some(Outcome::Drifted), "x")
        };
        let no_plan = Run {
            approvable: false,
            plan_expires_at: None,
            ..run_with(Some(Outcome::Drifted), "x")
        };
        let expired = Run {
            approvable: false,
            plan_expires_at: Some(5),
            ..run_with(Some(Outcome::Drifted), "x")
        };
        let in_sync = Run {
            approvable: false,
            ..run_with(Some(Outcome::InSync), "x")
        };
        let running = Run {
            approvable: false,
            finished_at: None,
            ..run_with(None, "x")
        };
        let chrome = Chrome {
            email: "a",
            csrf: "c",
            grant: &crate::operator::roles::Grant::ROOT,
            now: 10,
        };
        for (r, says) in [
            (&approved, Some("approved already (apply run #9)")),
            (&no_plan, Some("No plan was kept")),
            (&expired, Some("expired; run a new check")),
            (&in_sync, None),
            (&running, None),
        ] {
            let html = run(&chrome, r, &RunOutput::Absent).into_string();
            assert!(!html.contains(r#"id="approve""#), "{r:?}");
            match says {
                Some(text) => assert!(html.contains(text), "{text}: {html}"),
                None => assert!(!html.contains("not-approvable")),
            }
        }
        let html = run(&chrome, &running, &RunOutput::Absent).into_string();
        assert!(
            html.contains(r#"http-equiv="refresh""#),
            "a running run reloads"
        );
        assert!(!run(&chrome, &in_sync, &RunOutput::Absent)
            .into_string()
            .contains("http-equiv"));
    }

    #[test]
    fn the_output_section_says_what_became_of_the_text() {
        let chrome = Chrome {
            email: "a",
            csrf: "c",
            grant: &crate::operator::roles::Grant::ROOT,
            now: 10,
        };
        let done = Run {
            approvable: false,
            ..run_with(Some(Outcome::Drifted), "x")
        };
        let table = [
            (
                RunOutput::Text("Plan: 1 to change".into()),
                "Plan: 1 to change",
            ),
            (
                RunOutput::Pruned {
                    keep: 7,
                    at: "2026-11-30T22:00:00Z".into(),
                },
                "plan text pruned by retention at 2026-11-30T22:00:00Z (it kept only the newest 7 runs per workspace)",
            ),
            (RunOutput::Absent, "No output was stored for this run."),
        ];
        for (output, says) in table {
            let html = run(&chrome, &done, &output).into_string();
            assert!(html.contains(says), "{output:?}: {html}");
        }
    }

    #[test]
    fn an_approved_apply_is_said_instead_of_state_moved() {
        let chrome = Chrome {
            email: "a",
            csrf: "c",
            grant: &crate::operator::roles::Grant::ROOT,
            now: 10,
        };
        let applied = Run {
            approvable: false,
            applied_by: Some(9),
            ..run_with(Some(Outcome::Drifted), "x")
        };
        let check = CheckSummary {
            workspace: "prod".into(),
            dir: "d".into(),
            binary: "tofu".into(),
            interval_seconds: 60,
            timeout_seconds: 60,
            approve_apply: true,
            status: Some(Outcome::Drifted),
            status_at: None,
            running: None,
            last_check: Some(applied.clone()),
            next_due_at: None,
        };
        let view = RunsView {
            workspace: "",
            limit: 50,
            more: None,
        };
        for html in [
            status_line(&chrome, &check).into_string(),
            drift(
                &chrome,
                std::slice::from_ref(&check),
                std::slice::from_ref(&applied),
                &view,
            )
            .into_string(),
            run(&chrome, &applied, &RunOutput::Absent).into_string(),
        ] {
            assert!(
                html.contains("applied by #9") || html.contains("apply run #9"),
                "{html}"
            );
            assert!(
                !html.contains(">state moved<") && !html.contains("state changed since"),
                "{html}"
            );
        }
        // Without an approval, a moved state is still pointed out.
        let moved = Run {
            approvable: false,
            ..run_with(Some(Outcome::Drifted), "x")
        };
        assert!(status_line(
            &chrome,
            &CheckSummary {
                last_check: Some(moved),
                ..check
            }
        )
        .into_string()
        .contains("state moved"));
    }

    #[test]
    fn an_empty_configuration_says_how_to_configure_drift() {
        let chrome = Chrome {
            email: "a",
            csrf: "c",
            grant: &crate::operator::roles::Grant::ROOT,
            now: 0,
        };
        let view = RunsView {
            workspace: "",
            limit: 50,
            more: None,
        };
        let html = drift(&chrome, &[], &[], &view).into_string();
        assert!(html.contains("No drift checks are configured"));
        assert!(html.contains("[[drift]]") && html.contains("Drift checks"));
    }
}
