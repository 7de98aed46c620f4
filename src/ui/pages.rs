//! The UI's HTML, from plain values: one function per page, in `layout`'s chrome. maud
//! escapes every value interpolated with `(…)`; nothing here uses `PreEscaped`, so a
//! workspace's `Who`, a lineage, an output or an audit payload is always text.

use maud::{html, Markup};
use serde_json::Value;

use crate::drift::CheckSummary;
use crate::operator::diff::{Change, StateDiff};
use crate::operator::paths::{self, DiffView, Outline};
use crate::operator::roles::Action;
use crate::operator::search::{SearchResults, Truncated};
use crate::operator::{ClusterSummary, LockState, RollbackPreview, WorkspaceSummary};
use crate::store::audit::{event_matches, AuditRow};
use crate::store::VersionRow;

use super::layout::{ago, dash, exact_pattern, layout, size, unix_when, when, ws_href, Chrome};

/// A finished action, reported on the workspace page after its redirect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// Rolled back; the workspace's newest version is now this one.
    RolledBack(i64),
    Unlocked,
    WasNotLocked,
    /// One write the write guard would refuse may now go through.
    WriteAllowed,
}

/// One page of a workspace's versions, newest first.
pub struct VersionsPage<'a> {
    pub rows: &'a [VersionRow],
    pub page: u32,
    pub has_more: bool,
    /// The newest resource changes (the timeline section), newest first.
    pub timeline: &'a [crate::store::timeline::TimelineRow],
}

/// A version's content as the viewer shows it.
pub enum Content {
    /// Pretty-printed JSON and its resources by module and type (masked unless the
    /// operator asked to reveal).
    Json { text: String, outline: Outline },
    /// Not a plain JSON state (e.g. encrypted by the client): only the download.
    NotPlain,
}

/// The audit page's filters, as typed (echoed back into the form and the pager).
#[derive(Debug, Default, Clone)]
pub struct AuditForm {
    pub scope: String,
    pub event: String,
    pub since: String,
    pub until: String,
    /// Show `ui.login*` rows (hidden by default: every page view would be one).
    pub logins: bool,
}

/// How a version page shows its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// Sensitive values masked (the default).
    Masked,
    /// Unmasked, by a reveal ticket (audited).
    Revealed,
    /// Masked: the reveal ticket in the address was used already or expired (a reload).
    RevealUsed,
}

pub fn version_href(workspace: &str, version: i64) -> String {
    format!("{}/versions/{version}", ws_href(workspace))
}

/// A POST button carrying the session's CSRF token (reveals are audited, so never a link).
fn post_button(csrf: &str, action: &str, label: &str) -> Markup {
    html! {
        form.link method="post" action=(action) {
            input type="hidden" name="csrf" value=(csrf);
            button.link type="submit" { (label) }
        }
    }
}

fn lock_summary(lock: &LockState, now: i64) -> Markup {
    html! {
        span.badge.locked { "locked" }
        @if lock.stale { span.badge.stale { "STALE" } }
        " "
        span { (lock.who) }
        " · "
        span.muted { (crate::operator::operation_name(&lock.operation)) }
        " · "
        "locked " (when(&lock.created_at, now))
    }
}

/// The login page; `sso`: the single sign-on provider's name, for its button.
/// A user the single sign-on provider (`provider`) signed in whose groups (read from
/// the claim `groups_claim`) map to no role: what to ask an admin for. Nothing opened.
pub fn sso_no_role(provider: &str, groups_claim: &str) -> Markup {
    let body = html! {
        section.card.login #sso-no-role {
            h1 { "No role for you yet" }
            p.notice.error role="alert" {
                "You signed in with " (provider) ", but none of your groups is given a role in stategate, so there is nothing it may show you. Nothing was changed."
            }
            p {
                "Ask a stategate admin to map one of your groups to a role (under "
                code { "[oidc.roles]" } " in stategate's configuration). Your groups are the "
                code { (groups_claim) } " claim your provider sends; once one is mapped, sign in again."
            }
            p { a href="/ui/login" { "Back to the login page" } }
        }
    };
    layout("No role", None, body)
}

pub fn login(error: Option<&str>, sso: Option<&str>) -> Markup {
    let body = html! {
        section.card.login {
            h1 { "Operator login" }
            @if let Some(e) = error { p.notice.error { (e) } }
            @if let Some(name) = sso {
                // A link, not a form: the provider is another origin, and the UI's
                // `form-action 'self'` would stop a form's redirect there.
                p { a.button href="/ui/login/oidc" { "Sign in with " (name) } }
                p.muted { "or with an operator token:" }
            }
            form method="post" action="/ui/login" {
                label {
                    "Operator token"
                    input type="password" name="token" required autocomplete="off"
                        placeholder="sgo_…" autofocus;
                }
                button type="submit" { "Log in" }
            }
            p.muted {
                "Create one with " code { "stategate admin operator create --email <email>" }
                " (another with " code { "admin operator token create --email <email>" } "). Workspace bearers do not work here."
            }
        }
    };
    layout("Log in", None, body)
}

/// After a single sign-on: the browser arrived from the provider's site, so the
/// session cookie (`SameSite=Strict`) is sent only on a navigation this page starts.
pub fn signed_in(to: &str) -> Markup {
    let refresh = format!("0;url={to}");
    html! {
        (maud::DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="refresh" content=(refresh);
                title { "Signed in · stategate" }
                link rel="stylesheet" href="/ui/static/app.css";
            }
            body { main { p { "Signed in. " a href=(to) { "Continue" } } } }
        }
    }
}

/// The banner of stale locks on the list page: how many, and which.
fn stale_banner(rows: &[WorkspaceSummary]) -> Markup {
    let stale: Vec<&WorkspaceSummary> = rows
        .iter()
        .filter(|w| w.lock.as_ref().is_some_and(|l| l.stale))
        .collect();
    let locked = rows.iter().filter(|w| w.lock.is_some()).count();
    html! {
        @if !stale.is_empty() {
            div.notice.error #stale-locks role="status" {
                strong { (stale.len()) " stale lock" @if stale.len() != 1 { "s" } }
                ": held longer than expected, so the run holding it may have died. "
                @for (i, w) in stale.iter().enumerate() {
                    @if i > 0 { ", " }
                    a href=(format!("{}#lock", ws_href(&w.name))) { (w.name) }
                }
                "."
            }
        }
        @if locked > 0 {
            p.muted #lock-count { (locked) " of " (rows.len()) " workspace" @if rows.len() != 1 { "s" } " locked now." }
        }
    }
}

pub fn workspaces(chrome: &Chrome, rows: &[WorkspaceSummary], filter: &str) -> Markup {
    let body = html! {
        h1 { "Workspaces" }
        (stale_banner(rows))
        form.inline method="get" action="/ui/workspaces" {
            label { "Filter by name" input type="search" name="q" value=(filter); }
            button type="submit" { "Filter" }
            @if !filter.is_empty() { a href="/ui/workspaces" { "Clear" } }
        }
        @if rows.is_empty() {
            div.card.empty {
                @if filter.is_empty() {
                    "No workspaces yet. Point a Terraform/OpenTofu http backend at "
                    code { "/api/v1/tf/state/<name>" } " and apply."
                } @else {
                    "No workspace name contains “" (filter) "”."
                }
            }
        } @else {
            div.table-wrap { table {
                thead { tr {
                    th { "Workspace" } th { "Encryption" } th { "Lock" } th.num { "Version" } th.num.hide-narrow { "Serial" }
                    th.num.hide-narrow { "Size" } th { "Updated" } th { "Written by" }
                } }
                tbody { @for w in rows { tr {
                    td data-label="Workspace" {
                        a href=(ws_href(&w.name)) { (w.name) }
                        @if w.deleted { span.badge.deleted { "deleted" } }
                    }
                    td data-label="Encryption" { @match &w.encryption {
                        Some(p) => (encryption_cell(&w.name, p, w.key_generation)),
                        None => span.muted { "–" },
                    } }
                    td data-label="Lock" {
                        @if let Some(f) = &w.frozen {
                            div.frozen { (freeze_summary(f, chrome.now)) }
                        }
                        @match &w.lock {
                        Some(lock) if w.plans.len() > 1 => {
                            span.badge.locked { "shared" }
                            @if w.plans.iter().any(|p| p.stale) { span.badge.stale { "STALE" } }
                            " " (w.plans.len()) " plans · oldest "
                            (when(&lock.created_at, chrome.now))
                        },
                        Some(lock) => (lock_summary(lock, chrome.now)),
                        None if w.frozen.is_some() => "",
                        None => span.muted { "unlocked" },
                    } }
                    td.num data-label="Version" { (dash(w.version)) }
                    td.num.hide-narrow data-label="Serial" { (dash(w.serial)) }
                    td.num.hide-narrow data-label="Size" { (dash(w.size.map(size))) }
                    td data-label="Updated" { @match &w.updated_at { Some(t) => (when(t, chrome.now)), None => "–" } }
                    td data-label="Written by" { @match &w.written_by { Some(who) => (who), None => span.muted { "–" } } }
                } } }
            } }
        }
    };
    layout("Workspaces", Some(chrome), body)
}

fn notice(n: Notice) -> Markup {
    match n {
        Notice::RolledBack(v) => html! {
            p.notice.ok { "Rolled back: the workspace is now at version " (v) "." }
        },
        Notice::Unlocked => html! {
            div.notice.ok #unlocked {
                p { "The lock was released." }
                p {
                    "If the run that held it was killed, what it changed in the infrastructure was not saved to the state. "
                    "Run " code { "terraform plan" } " in that workspace’s configuration now: it shows what the state is missing, and an "
                    code { "apply" } " records it."
                }
            }
        },
        Notice::WasNotLocked => {
            html! { p.notice.warn { "The workspace was not locked; nothing changed." } }
        }
        Notice::WriteAllowed => html! {
            p.notice.ok { "The next write the write guard would refuse is allowed once (audited)." }
        },
    }
}

/// Shared plan holders: each with its own force-unlock form (a plan holder is freed
/// alone; the others keep planning).
fn plans_panel(chrome: &Chrome, ws: &WorkspaceSummary) -> Markup {
    html! {
        section.card #lock {
            h2 { "Lock: shared by " (ws.plans.len()) " plans" }
            p.muted { "Plans share the lock (they never write state); an apply waits until every plan has unlocked." }
            table { thead { tr { th { "Who" } th { "Held since" } th { "Lock ID" } th { "" } } }
                tbody { @for lock in &ws.plans { tr {
                    td data-label="Who" { (lock.who) @if lock.stale { " " span.badge.stale { "STALE" } } }
                    td data-label="Held since" { (when(&lock.created_at, chrome.now)) }
                    td data-label="Lock ID" { code { (lock.id) } }
                    td { @if chrome.may(Action::Operate, &ws.name) {
                        (force_unlock_form(chrome, &ws.name, &lock.id, " break this plan’s lock"))
                    } }
                } } }
            }
        }
    }
}

fn lock_panel(chrome: &Chrome, ws: &WorkspaceSummary) -> Markup {
    if !ws.plans.is_empty() {
        return plans_panel(chrome, ws);
    }
    let Some(lock) = &ws.lock else {
        return html! { section.card { h2 { "Lock" } p.muted { "Not locked." } } };
    };
    html! {
        section.card #lock {
            h2 { "Lock" @if lock.stale { span.badge.stale { "STALE" } } }
            @if lock.stale {
                p.notice.error #stale { "This lock is stale: it has been held longer than expected, so the run that took it may have died. If it did, break the lock below, then run " code { "terraform plan" } "." }
            }
            dl.facts {
                dt { "Who" } dd { (lock.who) }
                dt { "Operation" } dd { (crate::operator::operation_name(&lock.operation)) }
                dt { "Held since" } dd { (when(&lock.created_at, chrome.now)) }
                dt { "Lock ID" } dd { code { (lock.id) } }
            }
            @if chrome.may(Action::Operate, &ws.name) {
                p {
                    "Force-unlocking breaks " strong { (lock.who) } "’s " (crate::operator::operation_name(&lock.operation))
                    ": if it is still running, its next state write or unlock fails and its changes may need another apply. "
                    "Only do this when that run is dead."
                }
                (force_unlock_form(chrome, &ws.name, &lock.id, " I understand; break this lock"))
            }
        }
    }
}

/// The form that breaks the lock `lock_id` of `workspace` (one plan's, or the
/// exclusive one), behind a box the operator ticks saying `confirm`.
fn force_unlock_form(chrome: &Chrome, workspace: &str, lock_id: &str, confirm: &str) -> Markup {
    html! {
        form.inline method="post" action=(format!("{}/unlock", ws_href(workspace))) {
            input type="hidden" name="csrf" value=(chrome.csrf);
            input type="hidden" name="lock_id" value=(lock_id);
            label.check {
                input type="checkbox" name="confirm" value="yes" required;
                (confirm)
            }
            button.danger type="submit" { "Force unlock" }
        }
    }
}

/// The maintenance freeze (`tofu::freeze`), as the CLI's `freeze`/`unfreeze`: who
/// froze the workspace, why and until when, and the forms to lift or set one.
fn freeze_card(chrome: &Chrome, ws: &WorkspaceSummary) -> Markup {
    let operate = chrome.may(Action::Operate, &ws.name);
    html! {
        section.card #freeze {
            h2 { "Freeze" @if ws.frozen.is_some() { " " span.badge.warn { "FROZEN" } } }
            @if let Some(f) = &ws.frozen {
                dl.facts {
                    dt { "Frozen by" } dd { (f.frozen_by) }
                    dt { "Reason" } dd { (f.reason) }
                    dt { "Since" } dd { (when(&f.created_at, chrome.now)) }
                    dt { "Until" } dd { @match f.until { Some(_) => (unix_when(f.until, chrome.now)), None => "unfrozen" } }
                }
                p.muted {
                    "Every lock and every write without a lock is refused with a lock record that names who froze the workspace, the reason and the end. OpenTofu and Terraform 1.15 or later print it under “Lock Info”; Terraform 1.11 prints the lock it tried to take instead, so its users see only that the state is locked (docs/terraform.md, “Freezes”). A lock held before the freeze keeps working until it is released."
                }
                @if operate {
                    form.inline method="post" action=(format!("{}/unfreeze", ws_href(&ws.name))) {
                        input type="hidden" name="csrf" value=(chrome.csrf);
                        button type="submit" { "Unfreeze" }
                    }
                }
            } @else {
                p.muted { "Not frozen." }
                @if operate {
                    p { "A freeze stops every apply, import and state change (a maintenance window, an incident); drift checks are skipped." }
                    form.inline method="post" action=(format!("{}/freeze", ws_href(&ws.name))) {
                        input type="hidden" name="csrf" value=(chrome.csrf);
                        label { "Reason" input type="text" name="reason" required maxlength=(crate::tofu::freeze::MAX_REASON_CHARS); }
                        label { "For (e.g. 2h, 3d; empty: until unfrozen)" input type="text" name="for" maxlength="12" pattern="[0-9]+[smhd]"; }
                        label.check {
                            input type="checkbox" name="confirm" value="yes" required;
                            " I understand; refuse every lock and write"
                        }
                        button.danger type="submit" { "Freeze" }
                    }
                }
            }
        }
    }
}

/// The one-shot override of the write guard (`tofu::guard`), as the CLI's `allow-write`.
fn allow_write_form(chrome: &Chrome, ws: &str) -> Markup {
    html! {
        section.card #allow-write {
            p {
                "State writes with another lineage, a lower serial, or the current serial with other content are refused. "
                "To let ONE such write through on purpose (" code { "terraform state push -force" } " of an older file, adopting another configuration's state), allow it here, then retry it."
            }
            form.inline method="post" action=(format!("{}/allow-write", ws_href(ws))) {
                input type="hidden" name="csrf" value=(chrome.csrf);
                label { "Reason" input type="text" name="reason" required maxlength=(crate::tofu::guard::MAX_REASON_CHARS); }
                label { "Minutes"
                    input type="number" name="minutes" min="1" max=(crate::tofu::guard::MAX_OVERRIDE_MINUTES)
                        value=(crate::tofu::guard::DEFAULT_OVERRIDE_MINUTES);
                }
                label.check {
                    input type="checkbox" name="confirm" value="yes" required;
                    " I understand; allow one refused write"
                }
                button.danger type="submit" { "Allow one write" }
            }
        }
    }
}

/// Who wrote a version and what it did to resources: the lock's Who and operation,
/// the credential, "rollback of vN", and `+added ~changed -removed` (a move's version:
/// `3 moved to app`, `operator::change_summary`).
fn writer_cell(v: &VersionRow) -> Markup {
    let written_by = crate::operator::written_by(&v.actor, &v.facts);
    html! {
        span.writer { (written_by) }
        @if v.changes.is_some() {
            " " span.changes title="resources added, changed, removed (or moved) against the version before" {
                (crate::operator::change_summary(v).replace(" -", " −"))
            }
        }
    }
}

/// The newest resource changes of a workspace: when each address changed, in which
/// version, by whom (`stategate workspace timeline` has the rest).
fn timeline_section(
    chrome: &Chrome,
    ws: &str,
    rows: &[crate::store::timeline::TimelineRow],
) -> Markup {
    html! {
        h2 #timeline { "Resource timeline" }
        @if rows.is_empty() {
            div.card.empty { "No recorded resource changes." }
        } @else {
            div.table-wrap { table #resource-changes {
                thead { tr {
                    th.num { "Version" } th { "Change" } th { "Address" } th { "Written by" } th { "When" }
                } }
                tbody { @for r in rows { tr {
                    td.num data-label="Version" { a href=(version_href(ws, r.version)) { (r.version) } }
                    td data-label="Change" { span.badge { (crate::operator::timeline_change(r)) } }
                    td data-label="Address" { code { (r.address) } }
                    td data-label="Written by" { (crate::operator::written_by(&r.writer, &r.facts())) }
                    td data-label="When" { (when(&r.created_at, chrome.now)) }
                } } }
            } }
            p.muted { "The newest " (rows.len()) " changes; " code { "stategate workspace timeline " (ws) " [ADDRESS]" } " lists them all." }
        }
    }
}

fn versions_table(chrome: &Chrome, ws: &str, page: &VersionsPage) -> Markup {
    html! {
        @if page.rows.is_empty() {
            div.card.empty { "No versions on this page." }
        } @else {
            div.table-wrap { table #versions {
                thead { tr {
                    th.num { "Version" } th.num { "Serial" } th.hide-narrow { "Lineage" }
                    th.num.hide-narrow { "Size" } th { "Written by" } th { "When" } th { span.sr-only { "Actions" } }
                } }
                tbody { @for (i, v) in page.rows.iter().enumerate() {
                    // The version below it (older), or the one before the page's last.
                    @let previous = page.rows.get(i + 1).map_or(v.version - 1, |p| p.version);
                    (version_row(chrome, ws, v, previous))
                } }
            } }
        }
        div.pager {
            @if page.page > 1 {
                a href=(format!("{}?page={}", ws_href(ws), page.page - 1)) { "← Newer" }
            } @else { span {} }
            @if page.has_more {
                a href=(format!("{}?page={}", ws_href(ws), page.page + 1)) { "Older →" }
            }
        }
    }
}

/// One row of the versions table; `previous`: the version before it (a diff link
/// when it is a version at all).
fn version_row(chrome: &Chrome, ws: &str, v: &VersionRow, previous: i64) -> Markup {
    html! {
        tr {
            td.num data-label="Version" { (v.version) }
            td.num data-label="Serial" { (dash(v.serial)) }
            td.hide-narrow data-label="Lineage" { code { (v.lineage.as_deref().unwrap_or("–")) } }
            td.num.hide-narrow data-label="Size" { (size(v.size)) }
            td data-label="Written by" { (writer_cell(v)) }
            td data-label="When" { (when(&v.created_at, chrome.now)) }
            td.actions-cell data-label="Actions" {
                @if v.is_tombstone() {
                    span.badge.deleted { "deleted" }
                } @else {
                    a href=(version_href(ws, v.version)) { "view" }
                    @if previous >= 1 {
                        " · " a href=(diff_href(ws, previous, v.version)) title=(format!("what changed from version {previous}")) { "diff" }
                    }
                    @if chrome.may(Action::Reveal, ws) {
                        " · "
                        (post_button(chrome.csrf, &format!("{}/download", version_href(ws, v.version)), "download"))
                    }
                }
            }
        }
    }
}

/// How to point Terraform/OpenTofu at this workspace: the backend block (addresses
/// from the server's public address) and where the credential comes from. Never the
/// credential itself.
pub fn connect_panel(ws: &str, base_url: &str, open: bool) -> Markup {
    let address = format!("{}/api/v1/tf/state/{ws}", base_url.trim_end_matches('/'));
    let block = format!(
        "terraform {{\n  backend \"http\" {{\n    address        = \"{address}\"\n    lock_address   = \"{address}\"\n    unlock_address = \"{address}\"\n    username       = \"stategate\"\n    # password: TF_HTTP_PASSWORD (see below)\n  }}\n}}\n"
    );
    html! {
        details.card #connect open[open] {
            summary { h2 { "Connect Terraform" } }
            p { "Put this backend in the configuration’s " code { "terraform" } " block, then run " code { "terraform init" } ":" }
            pre #backend { (block) }
            p { "The password is a credential, never shown here. Either:" }
            ul {
                li {
                    "the workspace credential: on the stategate host run "
                    code #env-command { "stategate workspace env " (ws) }
                    " and " code { "eval" } " its output (it exports " code { "TF_HTTP_ADDRESS" } ", " code { "TF_HTTP_USERNAME" }
                    " and " code { "TF_HTTP_PASSWORD" } "; add " code { "--opentofu-encryption" } " for OpenTofu state encryption), or"
                }
                li { "an issued token for this workspace as " code { "TF_HTTP_PASSWORD" } " (see docs/access.md)." }
            }
            p #opentofu-encryption {
                strong { "OpenTofu client-side encryption" } " (on top of the " (crate::operator::AT_REST_CIPHER)
                " every version is sealed with at rest): run " code { "stategate workspace env " (ws) " --opentofu-encryption" }
                ", which also exports " code { "TF_ENCRYPTION" } " (a pbkdf2 key provider and " code { "aes_gcm" } " with a passphrase derived for this workspace), and use "
                code { "tofu" } " (a state OpenTofu has not encrypted yet takes its migration step first: an "
                code { "unencrypted" } " method as the " code { "fallback" } "). docs/terraform.md (“OpenTofu state encryption”) has the details; the server then sees only "
                code { "serial" } " and " code { "lineage" } ", so it cannot diff or search that state."
            }
        }
    }
}

/// At most this many "Did you mean" names, and the most names compared.
const CLOSE_NAMES: usize = 3;
const CLOSE_NAMES_SCANNED: usize = 10_000;

/// The names among `visible` (the ones the reader may see) a few edits from `name`
/// (a mistyped workspace): at most 1 edit for a name of up to 4 characters, 2 up to 9,
/// 3 beyond; an edit is a character inserted, deleted, replaced or two neighbours
/// swapped. Nearest first, then by name; at most [`CLOSE_NAMES`], from the first
/// [`CLOSE_NAMES_SCANNED`] names; never `name` itself.
pub fn close_names<'a>(name: &str, visible: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let wanted: Vec<char> = name.chars().collect();
    let most = match wanted.len() {
        0..=4 => 1,
        5..=9 => 2,
        _ => 3,
    };
    let mut close: Vec<(usize, &str)> = visible
        .take(CLOSE_NAMES_SCANNED)
        .filter(|v| *v != name && v.chars().count().abs_diff(wanted.len()) <= most)
        .filter_map(|v| {
            let d = edits(&wanted, &v.chars().collect::<Vec<_>>());
            (d <= most).then_some((d, v))
        })
        .collect();
    close.sort_unstable();
    close.dedup();
    close
        .into_iter()
        .take(CLOSE_NAMES)
        .map(|(_, v)| v)
        .collect()
}

/// The optimal string alignment distance between `a` and `b` (Levenshtein with
/// neighbours swapped as one edit). Workspace names are short (`names`' bound).
fn edits(a: &[char], b: &[char]) -> usize {
    let width = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * width];
    for (i, row) in d.chunks_mut(width).enumerate() {
        row[0] = i;
    }
    for (j, cell) in d.iter_mut().take(width).enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[(i - 1) * width + j] + 1)
                .min(d[i * width + j - 1] + 1)
                .min(d[(i - 1) * width + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[(i - 2) * width + j - 2] + 1);
            }
            d[i * width + j] = best;
        }
    }
    d[a.len() * width + b.len()]
}

/// A workspace nothing has been written to yet (or only locked): how to start, and the
/// visible names close to it when it may be a typo (`close`, from [`close_names`]).
pub fn empty_workspace(chrome: &Chrome, ws: &str, base_url: &str, close: &[&str]) -> Markup {
    let body = html! {
        p.muted { a href="/ui/workspaces" { "Workspaces" } " /" }
        h1 { (ws) }
        @if !close.is_empty() {
            p.notice.warn #did-you-mean role="status" {
                "No workspace is called " strong { (ws) } ". Did you mean "
                @for (i, name) in close.iter().enumerate() {
                    @if i > 0 { @if i + 1 == close.len() { " or " } @else { ", " } }
                    a href=(ws_href(name)) { (name) }
                }
                "?"
            }
        }
        div.card.empty #no-versions {
            "Workspace " strong { (ws) } " has no state yet. Connect Terraform to it and run "
            code { "terraform apply" } " (or " code { "terraform state push" } " an existing state); it appears here with its first write."
        }
        (connect_panel(ws, base_url, true))
    };
    layout(ws, Some(chrome), body)
}

fn diff_form(ws: &str, from: Option<i64>, to: Option<i64>) -> Markup {
    html! {
        form.inline #diff method="get" action=(format!("{}/diff", ws_href(ws))) {
            label { "From version" input type="number" name="from" min="1" required value=[from]; }
            label { "To version" input type="number" name="to" min="1" required value=[to]; }
            button type="submit" { "Diff" }
        }
    }
}

fn locked_refusal(lock: &LockState) -> Markup {
    html! {
        p.notice.warn {
            "Rollback is refused while the workspace is locked by " strong { (lock.who) }
            " (" (crate::operator::operation_name(&lock.operation)) ", " (ago(lock.age_seconds)) ")."
        }
    }
}

/// The warning of a preview whose change a freeze would refuse.
fn frozen_refusal(chrome: &Chrome, f: &crate::tofu::freeze::Freeze) -> Markup {
    html! {
        p.notice.warn #frozen-refusal {
            "Rollback is refused while the workspace is frozen by " strong { (f.frozen_by) }
            " (" (f.reason) "), " (freeze_end(f, chrome.now)) ". Unfreeze it on "
            a href=(format!("{}#freeze", ws_href(&f.workspace))) { "the workspace page" }
            " first, or wait."
        }
    }
}

/// When a freeze ends, as every time is shown: `until 2026-12-02 10:00 UTC · in 3 h`,
/// or `until unfrozen`.
fn freeze_end(f: &crate::tofu::freeze::Freeze, now: i64) -> Markup {
    html! {
        @match f.until {
            Some(_) => { "until " (unix_when(f.until, now)) },
            None => "until unfrozen",
        }
    }
}

/// A frozen workspace in the list: the badge, the reason and the end.
fn freeze_summary(f: &crate::tofu::freeze::Freeze, now: i64) -> Markup {
    html! {
        span.badge.warn title=(format!("frozen by {}", f.frozen_by)) { "frozen" }
        " " span { (f.reason) } " · " (freeze_end(f, now))
    }
}

/// Step one of a rollback: pick the version, then see what it would change.
fn rollback_form(ws: &WorkspaceSummary, default_to: Option<i64>) -> Markup {
    html! {
        @if let Some(lock) = &ws.lock { (locked_refusal(lock)) }
        p.muted { "Stores the chosen version’s content as a new version with a fresh serial (above every serial stored before, so plans saved before the rollback are refused as stale; the lineage stays). Nothing is deleted, and Terraform reads it on its next run. You see what changes before you confirm." }
        form.inline #rollback method="get" action=(format!("{}/rollback", ws_href(&ws.name))) {
            label { "Version to restore" input type="number" name="to" min="1" required value=[default_to]; }
            button type="submit" { "Preview rollback" }
        }
    }
}

/// `drift`: the workspace's configured drift check, if it has one. `consumers`: the
/// workspaces that may read its outputs, as `operator::Operations::consumers` gives
/// them to the reader (shown only when it may administer the workspace).
#[allow(clippy::too_many_arguments)]
pub fn workspace(
    chrome: &Chrome,
    ws: &WorkspaceSummary,
    versions: &VersionsPage,
    shown: Option<Notice>,
    drift: Option<&CheckSummary>,
    tokens: Option<&[crate::tofu::credentials::WorkspaceToken]>,
    consumers: Option<&[String]>,
    base_url: &str,
) -> Markup {
    let live: Vec<i64> = versions
        .rows
        .iter()
        .filter(|v| !v.is_tombstone())
        .map(|v| v.version)
        .collect();
    let body = html! {
        p.muted { a href="/ui/workspaces" { "Workspaces" } " /" }
        h1 { (ws.name) @if ws.deleted { span.badge.deleted { "deleted" } } }
        @if let Some(n) = shown { (notice(n)) }
        @if let Some(check) = drift { (super::drift_pages::status_line(chrome, check)) }
        section.card {
            dl.facts {
                dt { "Latest version" } dd { (dash(ws.version)) }
                dt { "Serial" } dd { (dash(ws.serial)) }
                dt { "Size" } dd { (dash(ws.size.map(size))) }
                dt { "Updated" } dd { @match &ws.updated_at { Some(t) => (when(t, chrome.now)), None => "–" } }
                @if let Some(p) = &ws.encryption {
                    dt { "Encryption" } dd #encryption { (encryption_cell(&ws.name, p, ws.key_generation)) }
                }
            }
        }
        (lock_panel(chrome, ws))
        (freeze_card(chrome, ws))
        (connect_panel(&ws.name, base_url, false))
        h2 { "Versions" }
        (versions_table(chrome, &ws.name, versions))
        (timeline_section(chrome, &ws.name, versions.timeline))
        h2 { "Compare two versions" }
        (diff_form(&ws.name, live.get(1).copied(), live.first().copied()))
        @if chrome.may(Action::Operate, &ws.name) {
            h2 { "Roll back" }
            (rollback_form(ws, live.get(1).copied()))
            h2 { "Write guard" }
            (allow_write_form(chrome, &ws.name))
        }
        @if let Some(tokens) = tokens { (token_card(chrome, &ws.name, tokens)) }
        @if let Some(consumers) = consumers {
            @if chrome.may(Action::Administer, &ws.name) { (consumers_card(&ws.name, consumers)) }
        }
    };
    layout(&ws.name, Some(chrome), body)
}

/// The workspaces that may read `ws`'s outputs through the outputs route, each a link
/// (a name hidden from the reader, `operator::redact`, is not one), and how to change
/// them. Read-only: changes go through the CLI or the admin API.
fn consumers_card(ws: &str, consumers: &[String]) -> Markup {
    html! {
        section.card #consumers {
            h2 { "Consumers" }
            p.muted {
                "Workspaces whose credential may read this workspace’s outputs (the outputs route, "
                code { "docs/access.md" } ")."
            }
            @if consumers.is_empty() {
                p { "No workspace reads this workspace’s outputs." }
            } @else {
                ul.consumers { @for c in consumers {
                    li { @if crate::names::validate_workspace(c).is_ok() {
                        a href=(ws_href(c)) { (c) }
                    } @else {
                        span.muted { (c) }
                    } }
                } }
            }
            p.muted {
                "Change them with " code { "stategate workspace consumers set " (ws) " NAME,…" }
                " or the admin API (" code { "PUT /api/v1/admin/workspaces/" (ws) "/consumers" } ")."
                @if consumers.iter().any(|c| c == crate::operator::redact::HIDDEN_WORKSPACE) {
                    " A consumer outside your workspace patterns is kept: you can neither see nor remove it."
                }
            }
        }
    }
}

/// The live workspace tokens whose patterns cover `ws`, each with a revoke form
/// (shown to an admin not limited to patterns, who may revoke them).
fn token_card(
    chrome: &Chrome,
    ws: &str,
    tokens: &[crate::tofu::credentials::WorkspaceToken],
) -> Markup {
    html! {
        section.card #workspace-tokens {
            h2 { "Workspace tokens" }
            p.muted {
                "Issued tokens whose patterns cover this workspace. Create them with "
                code { "stategate workspace token create" } " or the admin API (the access model: "
                code { "docs/access.md" } "). " a href="/ui/workspace-tokens" { "All workspace tokens" } "."
            }
            @if tokens.is_empty() {
                p { "No live token covers this workspace." }
            } @else {
                (super::access_pages::token_table(chrome, tokens, Some(ws)))
            }
        }
    }
}

pub fn version(
    chrome: &Chrome,
    workspace: &str,
    row: &VersionRow,
    content: &Content,
    shown: Shown,
) -> Markup {
    // A move's other workspace as the reader may see it (`operator::redact`).
    let mut row = row.clone();
    crate::operator::redact::write_facts(&mut row.facts, chrome.grant);
    let row = &row;
    let revealed = shown == Shown::Revealed;
    let base = version_href(workspace, row.version);
    let body = html! {
        p.muted { a href="/ui/workspaces" { "Workspaces" } " / " a href=(ws_href(workspace)) { (workspace) } " /" }
        h1 { (workspace) " · version " (row.version) }
        @if row.version > 1 {
            p.actions #compare {
                a href=(diff_href(workspace, row.version - 1, row.version)) { "Diff with previous (v" (row.version - 1) ")" }
            }
        }
        section.card { dl.facts {
            dt { "Serial" } dd { (dash(row.serial)) }
            dt { "Lineage" } dd { code { (row.lineage.as_deref().unwrap_or("–")) } }
            dt { "Size" } dd { (size(row.size)) }
            dt { "Written by" } dd { (writer_cell(row)) }
            dt { "When" } dd { (when(&row.created_at, chrome.now)) }
            dt { "SHA-256" } dd { code { (row.sha256.as_deref().unwrap_or("–")) } }
        } }
        @if chrome.may(Action::Reveal, workspace) {
            div.actions #reveal {
                (post_button(chrome.csrf, &format!("{base}/download"), "Download .tfstate"))
                @if revealed {
                    a href=(base) { "Mask sensitive values" }
                } @else if matches!(content, Content::Json { .. }) {
                    (post_button(chrome.csrf, &format!("{base}/reveal"), "Show sensitive values"))
                }
                span.muted { "Showing or downloading the real values is recorded in the audit log." }
            }
        }
        @match content {
            Content::Json { text, outline } => {
                @if revealed {
                    p.notice.warn { "Sensitive values are shown; this was recorded in the audit log as " code { "state.revealed" } ". Reloading this page masks them again." }
                } @else if shown == Shown::RevealUsed {
                    p.notice.warn #reveal-used { "That reveal was shown once already (or it expired); the values are masked again. Press “Show sensitive values” to reveal them again (recorded in the audit log)." }
                    p.muted #masking { (crate::operator::diff::MASKING_LIMITS) }
                } @else {
                    p.muted #masking { (crate::operator::diff::MASKING_LIMITS) }
                }
                (outline_nav(outline))
                (outline_body(outline))
                details #raw {
                    summary { "The whole state as JSON" }
                    pre #content { (text) }
                }
            }
            Content::NotPlain => p.notice.warn {
                "This version is not a plain JSON state (encrypted by the client?)"
                @if chrome.may(Action::Reveal, workspace) { "; download it to inspect it." } @else { "." }
            },
        }
    };
    layout(&format!("{workspace} v{}", row.version), Some(chrome), body)
}

fn diff_href(workspace: &str, from: i64, to: i64) -> String {
    format!("{}/diff?from={from}&to={to}", ws_href(workspace))
}

/// The version's resources as a list of links: module → type → instance.
fn outline_nav(outline: &Outline) -> Markup {
    html! {
        nav.card.outline #outline aria-label="Resources" {
            h2 { "Resources (" (outline.instances()) ")" }
            @if outline.modules.is_empty() { p.muted { "No resources." } }
            ul {
                @for (module, types) in &outline.modules { li {
                    strong { @if module.is_empty() { "root module" } @else { code { (module) } } }
                    ul { @for (kind, instances) in types { li {
                        code { (kind) }
                        ul { @for i in instances { li { a href=(format!("#{}", i.anchor)) { code { (i.address) } } } } }
                    } } }
                } }
            }
            @if !outline.outputs.is_empty() { p { a href="#outputs" { "Outputs (" (outline.outputs.len()) ")" } } }
        }
    }
}

/// Each instance's attributes by path, under its anchor; then the outputs.
fn outline_body(outline: &Outline) -> Markup {
    html! {
        @for types in outline.modules.values() {
            @for instances in types.values() {
                @for i in instances {
                    section.card.resource id=(i.anchor) {
                        h3 { code { (i.address) } }
                        ul.paths {
                            @for (path, value) in &i.rows { li { code.path { (path) } ": " span.value { (value) } } }
                            @if i.more > 0 { li.muted { "… and " (i.more) " more (see the JSON below)" } }
                        }
                    }
                }
            }
        }
        @if !outline.outputs.is_empty() {
            section.card.resource #outputs {
                h3 { "Outputs" }
                ul.paths { @for (path, value) in &outline.outputs { li { code.path { (path) } ": " span.value { (value) } } } }
            }
        }
    }
}

/// A workspace's encryption in the words the CLI uses too: at rest (always; with the
/// key generation where it is known: the index's, or the header's on the workspace page) and OpenTofu's client-side encryption
/// (`tofu::posture`), with where to read how to turn it on when it is not on.
fn encryption_cell(ws: &str, p: &crate::tofu::posture::Posture, generation: Option<u32>) -> Markup {
    html! {
        span.at-rest { "At rest: " (crate::operator::at_rest(generation)) }
        br;
        span.client-side {
            "OpenTofu encryption: " (p.client_side())
            @if p.state != "encrypted" {
                " · " a href=(format!("{}#opentofu-encryption", ws_href(ws))) { "how to turn it on" }
            }
        }
    }
}

/// An item's badge: `moved to app` for what a move moved, else its change.
fn item_badge(item: &paths::Item, view: &DiffView) -> Markup {
    match view.moved.as_ref().filter(|_| item.moved) {
        Some(m) => html! { span.badge.moved { (m.label()) } },
        None => change_badge(&item.change),
    }
}

fn change_badge(change: &Change) -> Markup {
    match change {
        Change::Added => html! { span.badge.added { "added" } },
        Change::Removed => html! { span.badge.removed { "removed" } },
        Change::Changed => html! { span.badge.changed { "changed" } },
    }
}

pub fn diff(chrome: &Chrome, workspace: &str, from: i64, to: i64, d: &StateDiff) -> Markup {
    let body = html! {
        p.muted { a href="/ui/workspaces" { "Workspaces" } " / " a href=(ws_href(workspace)) { (workspace) } " /" }
        h1 { (workspace) " · version " (from) " → " (to) }
        (diff_form(workspace, Some(from), Some(to)))
        (diff_sections(workspace, from, to, d))
    };
    layout(&format!("{workspace} diff"), Some(chrome), body)
}

/// `+1 ~2 −0` of resource instances (and how many outputs changed).
fn diff_counts(view: &DiffView) -> Markup {
    let c = view.counts;
    html! {
        p.counts #counts {
            span.add title="resource instances added" { "+" (c.add) " to add" }
            span.change title="resource instances changed" { "~" (c.change) " to change" }
            span.destroy title="resource instances removed" { "−" (c.destroy) " to destroy" }
            @if let Some(m) = &view.moved {
                span.moved #moved title="resource instances a move took between workspaces: neither added nor destroyed" {
                    (c.moved) " " (m.label())
                }
            }
            @if !view.outputs.is_empty() {
                span.muted { (view.outputs.len()) " output" @if view.outputs.len() != 1 { "s" } " changed" }
            }
        }
    }
}

/// One item's rows: `path: before → after`, before struck through, after highlighted.
fn path_rows(item: &paths::Item) -> Markup {
    html! {
        @if item.hidden {
            p.muted.small { "A sensitive value changed; both sides are masked." }
        }
        @if !item.rows.is_empty() {
            ul.paths {
                @for r in &item.rows { li {
                    code.path { (r.path) } ": "
                    @match (&r.before, &r.after) {
                        (Some(b), Some(a)) => { del { (b) } " → " ins { (a) } },
                        (Some(b), None) => { del { (b) } " " span.muted.small { "(gone)" } },
                        (None, Some(a)) => { ins { (a) } },
                        (None, None) => "–",
                    }
                } }
                @if item.more > 0 { li.muted { "… and " (item.more) " more" } }
            }
        }
    }
}

/// Resources and outputs that differ from version `from` to version `to`, by path.
fn diff_sections(workspace: &str, from: i64, to: i64, d: &StateDiff) -> Markup {
    let view = DiffView::of(d);
    html! {
        @if view.is_empty() {
            div.card.empty { "No differences in resources or outputs." }
        } @else {
            (diff_counts(&view))
        }
        @if !view.resources.is_empty() {
            h2 { "Resources" }
            @for r in &view.resources {
                @let shown_in = if r.change == Change::Removed { from } else { to };
                section.card.resource id=(r.anchor) {
                    h3 {
                        code { (r.address) } (item_badge(r, &view))
                        " " a.small href=(format!("{}#{}", version_href(workspace, shown_in), r.anchor)) { "in v" (shown_in) }
                    }
                    (path_rows(r))
                }
            }
        }
        @if !view.outputs.is_empty() {
            h2 { "Outputs" }
            @for o in &view.outputs {
                section.card.resource id=(o.anchor) {
                    h3 { code { (o.address) } (change_badge(&o.change)) }
                    (path_rows(o))
                }
            }
        }
    }
}

/// Step two of a rollback: what it changes (current → target), then the typed confirmation.
pub fn rollback_preview(chrome: &Chrome, name: &str, p: &RollbackPreview) -> Markup {
    let body = html! {
        p.muted { a href="/ui/workspaces" { "Workspaces" } " / " a href=(ws_href(name)) { (name) } " /" }
        h1 { (name) " · roll back to version " (p.to_version) }
        p {
            "The workspace is at version " strong { (p.from_version) } ". Rolling back stores version "
            (p.to_version) "’s content as version " (p.from_version + 1) " with serial " (dash(p.to_serial))
            " (above every serial stored before, so plans saved before the rollback are refused as stale; an OpenTofu-encrypted state keeps its own)"
            " — nothing is written if that is the current content already. These are the changes from version "
            (p.from_version) " to what it would become:"
        }
        @match (&p.diff, &p.diff_unavailable) {
            (Some(d), _) => (diff_sections(name, p.from_version, p.to_version, d)),
            (None, why) => p.notice.warn {
                "No preview: " (why.as_deref().unwrap_or("the versions cannot be compared")) ". The rollback itself still works."
            },
        }
        @if chrome.may(Action::Operate, name) {
            h2 { "Confirm" }
            @if let Some(lock) = &p.lock { (locked_refusal(lock)) }
            @if let Some(f) = &p.frozen { (frozen_refusal(chrome, f)) }
            @if let Some(why) = &p.refused { p.notice.warn #rollback-refused { "This rollback would be refused: " (why) } }
            form.inline #confirm-rollback method="post" action=(format!("{}/rollback", ws_href(name))) {
                input type="hidden" name="csrf" value=(chrome.csrf);
                input type="hidden" name="to" value=(p.to_version);
                input type="hidden" name="from" value=(p.from_version);
                label {
                    span { "Type " code { (name) } " to confirm" }
                    input type="text" name="confirm" required autocomplete="off"
                        pattern=(exact_pattern(name));
                }
                button.danger type="submit" disabled[p.lock.is_some() || p.frozen.is_some() || p.refused.is_some()] { "Roll back to version " (p.to_version) }
                a href=(ws_href(name)) { "Cancel" }
            }
            p.muted { "If anything writes to the workspace before you confirm, the rollback is refused and nothing changes; look again." }
        } @else {
            p.muted { "Your operator role does not allow a rollback here." }
        }
    };
    layout(&format!("{name} rollback"), Some(chrome), body)
}

fn truncation(r: &SearchResults) -> Option<String> {
    let l = &r.limits;
    Some(match r.truncated? {
        Truncated::Workspaces => format!(
            "Stopped after {} workspaces (the limit per search); later workspaces were not searched.",
            l.max_workspaces
        ),
        Truncated::Bytes => format!(
            "Reached the limit of {} of state read per search; some workspaces were not searched.",
            size(l.max_bytes)
        ),
        Truncated::Hits => format!(
            "Showing the first {} matches (the limit per search); refine the query.",
            l.max_hits
        ),
    })
}

/// `results`: `None` before anything was searched.
pub fn search(chrome: &Chrome, query: &str, results: Option<&SearchResults>) -> Markup {
    let body = html! {
        h1 { "Search resources" }
        form.inline method="get" action="/ui/search" {
            label {
                "Resource address, type or name"
                input type="search" name="q" value=(query) required placeholder="aws_instance, module.db";
            }
            button type="submit" { "Search" }
        }
        p.muted { "Searches the newest version of every workspace by resource address (module, type, name, index). Values are never shown." }
        @if let Some(r) = results {
            @if let Some(why) = truncation(r) { p.notice.warn #truncated { (why) } }
            p.muted {
                (r.hits.len()) " match" @if r.hits.len() != 1 { "es" } " in " (r.workspaces_scanned)
                " workspace" @if r.workspaces_scanned != 1 { "s" } " searched (" (size(r.bytes_read)) " read)."
            }
            @if !r.not_searchable.is_empty() {
                p.muted { "Not searchable (not a plain JSON state): " (r.not_searchable.join(", ")) }
            }
            @if !r.unreadable.is_empty() {
                p.notice.error { "Could not be read (see the server log): " (r.unreadable.join(", ")) }
            }
            @if r.hits.is_empty() {
                div.card.empty { "No resource address contains “" (r.query) "”." }
            } @else {
                div.table-wrap { table #results {
                    thead { tr { th { "Workspace" } th { "Resource" } th.hide-narrow { "Type" } th.num { "Version" } } }
                    tbody { @for h in &r.hits { tr {
                        td data-label="Workspace" { a href=(ws_href(&h.workspace)) { (h.workspace) } }
                        td data-label="Resource" { a href=(format!("{}#{}", version_href(&h.workspace, h.version), paths::anchor(&h.address))) { code { (h.address) } } }
                        td.hide-narrow data-label="Type" { code { (h.kind) } @if h.mode == "data" { " " span.muted { "(data)" } } }
                        td.num data-label="Version" { (h.version) }
                    } } }
                } }
            }
        }
    };
    layout("Search", Some(chrome), body)
}

/// The audit page: its filters as typed, one page of rows (newest first), the event
/// kinds in the log to choose from, and the link to older rows if there are any.
pub struct AuditView<'a> {
    pub form: &'a AuditForm,
    pub rows: &'a [AuditRow],
    pub kinds: &'a [String],
    pub older: Option<&'a str>,
    /// The time fields that did not read as a time (the page then lists no rows).
    pub invalid: &'a [InvalidField],
}

/// A field of the audit form whose text is not a time (`since`, `until`).
pub struct InvalidField {
    pub field: &'static str,
}

impl InvalidField {
    fn label(&self) -> &'static str {
        match self.field {
            "since" => "Since",
            _ => "Until",
        }
    }
}

pub fn audit(chrome: &Chrome, view: &AuditView) -> Markup {
    let form = view.form;
    let scope = (!form.scope.is_empty()).then(|| crate::operator::audit_scope(&form.scope));
    let matched: Vec<&String> = view
        .kinds
        .iter()
        .filter(|k| !form.event.is_empty() && event_matches(k, &form.event))
        .collect();
    let bad = |field: &str| view.invalid.iter().any(|f| f.field == field);
    let filtered = !(form.scope.is_empty()
        && form.event.is_empty()
        && form.since.is_empty()
        && form.until.is_empty());
    let body = html! {
        h1 { "Audit log" }
        form.inline #audit-filter method="get" action="/ui/audit" role="search" aria-label="Filter the audit log" {
            label { "Scope" input type="text" name="scope" value=(form.scope) placeholder="prod or tf/prod" aria-describedby="audit-help"; }
            label { "Event" input type="text" name="event" value=(form.event) placeholder="rollback, tf.lock" list="event-kinds" aria-describedby="audit-help"; }
            datalist #event-kinds { @for k in view.kinds { option value=(k) {} } }
            label { "Since" input type="text" name="since" value=(form.since) placeholder="2026-03-01" aria-invalid=[bad("since").then_some("true")] aria-describedby=[bad("since").then_some("audit-invalid")]; }
            label { "Until" input type="text" name="until" value=(form.until) placeholder="2026-03-02T10:00:00Z" aria-invalid=[bad("until").then_some("true")] aria-describedby=[bad("until").then_some("audit-invalid")]; }
            label.check { input type="checkbox" name="logins" value="1" checked[form.logins]; " Show logins" }
            button type="submit" { "Filter" }
            a href="/ui/audit" { "Clear" }
        }
        p.muted.small #audit-help {
            "Event finds the names it begins, or whose part after a dot it begins: "
            code { "rollback" } " finds " code { "tf.rollback" } ", " code { "tf.lock" } " every " code { "tf.lock…" } "; "
            "and names with its words in another form: " code { "moved" } " finds " code { "tf.resources_moved" } ", "
            code { "freeze" } " finds " code { "tf.unfrozen" } ". "
            "Scope is a workspace name (" code { "prod" } " is " code { "tf/prod" } ") or a scope such as " code { "operators" } ". "
            @if !form.logins && form.event.is_empty() { "Logins (" code { "ui.login" } ") are hidden." }
        }
        @if !view.invalid.is_empty() {
            div.notice.error #audit-invalid role="alert" {
                @for f in view.invalid {
                    p {
                        strong { (f.label()) } " “" (field_text(form, f.field)) "” is not a time. "
                        "Give a date such as " code { "2026-03-01" } " (midnight UTC) or an RFC 3339 time such as "
                        code { "2026-03-01T10:00:00Z" } ", or leave it blank."
                    }
                }
            }
        } @else if view.rows.is_empty() {
            div.card.empty #no-match role="status" {
                p { "No audit rows match." }
                @if filtered || !form.logins {
                    ul.hints {
                        @if let Some(scope) = &scope {
                            @if *scope != form.scope { li { "Scope “" (form.scope) "” was read as " code { (scope) } "." } }
                        }
                        @if !form.event.is_empty() {
                            @if matched.is_empty() {
                                li { "No event in the log begins with “" (form.event) "” (nor any part of one after a dot), nor has its words. Pick one from the Event list." }
                            } @else {
                                li { "“" (form.event) "” finds " @for (i, k) in matched.iter().enumerate() { @if i > 0 { ", " } code { (k) } } "; none of those is in the rows the other filters leave." }
                            }
                        }
                        @if !form.since.is_empty() || !form.until.is_empty() { li { "The time window may leave every row out: times are UTC." } }
                        @if !form.logins && form.event.is_empty() { li { "Logins are hidden: tick “Show logins” to see them." } }
                        @if filtered { li { a href="/ui/audit" { "Clear the filters" } } }
                    }
                }
            }
        } @else {
            div.table-wrap { table.cards #audit {
                thead { tr {
                    th scope="col" { "When" } th scope="col" { "Event" } th scope="col" { "Actor" } th scope="col" { "Scope" } th scope="col" { "Details" }
                } }
                tbody { @for r in view.rows { tr {
                    td.nowrap data-label="When" { (when(&r.at, chrome.now)) }
                    td.nowrap data-label="Event" { code { (r.event) } }
                    td data-label="Actor" { (r.actor) }
                    td data-label="Scope" {
                        @match audit_workspace(&r.scope) {
                            Some(ws) => a href=(ws_href(ws)) { code { (r.scope) } },
                            None => code { (r.scope) },
                        }
                        @if let Some(org) = &r.org { " " span.muted { "(" (org) ")" } }
                    }
                    td.details data-label="Details" { (audit_details(r, chrome.now)) }
                } } }
            } }
        }
        div.pager {
            span {}
            @if let Some(href) = view.older { a href=(href) { "Older →" } }
        }
    };
    layout("Audit", Some(chrome), body)
}

/// The text typed in the audit form's time field `field`.
fn field_text<'f>(form: &'f AuditForm, field: &str) -> &'f str {
    match field {
        "since" => &form.since,
        _ => &form.until,
    }
}

/// The workspace an audit scope is (`tf/<name>`), if it is a readable name.
fn audit_workspace(scope: &str) -> Option<&str> {
    scope
        .strip_prefix(crate::tofu::SCOPE_PREFIX)
        .filter(|w| crate::names::validate_workspace(w).is_ok())
}

/// Payload keys whose whole-number value is a version of the row's workspace (or of
/// the `workspace` beside it).
const VERSION_KEYS: [&str; 7] = [
    "version",
    "from",
    "to",
    "from_version",
    "to_version",
    "restored_from",
    "new_version",
];

/// An audit payload in words: `key value · key value`, nested keys joined with `.`,
/// versions linked to their workspace (the row's, or the `workspace` beside them) and
/// the fields the event kind declares as workspaces (`store::audit::EVENTS`) linked
/// when they are names (a name hidden from the reader is not one). Text only (maud
/// escapes every value).
fn audit_details(row: &AuditRow, now: i64) -> Markup {
    let ws = audit_workspace(&row.scope);
    let mut pairs = Vec::new();
    flatten_payload("", &row.payload, &mut pairs);
    let names: Vec<&str> = crate::store::audit::event_kind(&row.event)
        .map(|k| k.names)
        .unwrap_or_default()
        .iter()
        .filter(|(_, n)| *n == crate::store::audit::Names::Workspaces)
        .map(|(path, _)| *path)
        .collect();
    html! {
        @if pairs.is_empty() {
            span.muted { "–" }
        }
        @for (i, (key, value)) in pairs.iter().enumerate() {
            @if i > 0 { span.sep aria-hidden="true" { " · " } }
            span.detail {
                @if !key.is_empty() { span.key { (key.replace('_', " ")) } " " }
                (detail_value(key, value, version_workspace(&row.payload, key, ws), names.contains(&key.as_str()), now))
            }
        }
    }
}

/// The workspace a version at `key` belongs to: the `workspace` beside it in the same
/// object when there is one (a move's `to.version`), else the row's.
fn version_workspace<'a>(payload: &'a Value, key: &str, row: Option<&'a str>) -> Option<&'a str> {
    let Some((parent, _)) = key.rsplit_once('.') else {
        return row;
    };
    let beside = parent
        .split('.')
        .try_fold(payload, |v, k| v.get(k))
        .and_then(|v| v.get("workspace"));
    match beside {
        Some(Value::String(w)) => {
            Some(w.as_str()).filter(|w| crate::names::validate_workspace(w).is_ok())
        }
        Some(_) => None,
        None => row,
    }
}

/// The leaves of a payload as (dotted key, value); an array of plain values stays one
/// leaf. Bounded by the payload, which the server wrote.
fn flatten_payload<'a>(prefix: &str, value: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten_payload(&key, v, out);
            }
        }
        other => out.push((prefix.to_string(), other)),
    }
}

/// Payload keys whose whole-number value is a Unix time (a freeze's end), shown as
/// every time is.
const UNIX_TIME_KEYS: [&str; 1] = ["until"];

/// One payload value; `names`: the event kind declares it as workspaces.
fn detail_value(key: &str, value: &Value, ws: Option<&str>, names: bool, now: i64) -> Markup {
    let leaf = key.rsplit('.').next().unwrap_or(key);
    let workspace_link = |name: &str| -> Markup {
        if names && crate::names::validate_workspace(name).is_ok() {
            html! { a href=(ws_href(name)) { (name) } }
        } else {
            html! { (name) }
        }
    };
    match value {
        Value::Number(n) => match (n.as_i64(), ws) {
            (Some(t), _) if UNIX_TIME_KEYS.contains(&leaf) => unix_when(Some(t), now),
            (Some(v), Some(ws)) if v > 0 && VERSION_KEYS.contains(&leaf) => {
                html! { a href=(version_href(ws, v)) { "v" (v) } }
            }
            _ => html! { (n) },
        },
        Value::String(text) if text.is_empty() => html! { span.muted { "none" } },
        Value::String(text) if leaf == "operation" => {
            html! { (crate::operator::operation_name(text)) }
        }
        Value::String(text) => workspace_link(text),
        Value::Bool(b) => html! { (if *b { "yes" } else { "no" }) },
        Value::Null => html! { span.muted { "none" } },
        Value::Array(items) => html! {
            @if items.is_empty() { span.muted { "none" } }
            @for (i, item) in items.iter().enumerate() {
                @if i > 0 { ", " }
                @match item {
                    Value::String(text) => (workspace_link(text)),
                    other => (other.to_string()),
                }
            }
        },
        Value::Object(_) => html! { (value.to_string()) },
    }
}

fn lease_cell(lease: &Value) -> Markup {
    let text = |k: &str| lease[k].as_str().unwrap_or("").to_string();
    html! {
        span.badge.locked { "leased" }
        @if lease["stale"] == Value::Bool(true) { span.badge.stale { "STALE" } }
        " " (text("holder_email")) " · " span.muted { (text("operation")) }
        @if !text("host").is_empty() { " · " span.muted { (text("host")) } }
        @if let Some(s) = lease["held_seconds"].as_i64() { " · held " (ago(s).trim_end_matches(" ago")) }
    }
}

pub fn clusters(chrome: &Chrome, rows: &[ClusterSummary]) -> Markup {
    let body = html! {
        h1 { "Clusters" }
        @if rows.is_empty() {
            div.card.empty { "No clusters. Create one with " code { "stategate admin cluster create" } "." }
        } @else {
            div.table-wrap { table {
                thead { tr {
                    th { "Org" } th { "Cluster" } th { "Lease" } th.num { "Version" } th.num { "Serial" }
                } }
                tbody { @for c in rows { tr {
                    td data-label="Org" { (c.org) }
                    td data-label="Cluster" { (c.name.as_deref().unwrap_or("–")) br; code.muted { (c.id) } }
                    td data-label="Lease" { @match &c.lease { Some(l) => (lease_cell(l)), None => span.muted { "free" } } }
                    td.num data-label="Version" { (dash(c.version)) }
                    td.num data-label="Serial" { (dash(c.serial)) }
                } } }
            } }
        }
    };
    layout("Clusters", Some(chrome), body)
}

/// An error page; `holder`: the lock holder's (Who, Operation) when a lock refused it.
pub fn error(
    chrome: Option<&Chrome>,
    status: u16,
    message: &str,
    holder: Option<(&str, &str)>,
) -> Markup {
    let body = html! {
        h1 { "Error " (status) }
        p.notice.error { (message) }
        @if let Some((who, operation)) = holder {
            p { "The workspace is locked by " strong { (who) } " (" (operation) "). Nothing was changed." }
        }
        p { a href="/ui/" { "Back to workspaces" } }
    };
    layout("Error", chrome, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_names_are_a_few_edits_away_nearest_first_and_bounded() {
        let visible = [
            "prod-network",
            "prod-networks",
            "prod-compute",
            "staging-network",
            "dev",
            "dew",
            "devs",
            "prod-netwrok",
        ];
        // (typed, suggested)
        let table: &[(&str, &[&str])] = &[
            // A swap is one edit; the name itself is never suggested.
            ("prod-netwrok", &["prod-network", "prod-networks"]),
            ("prod-network", &["prod-networks", "prod-netwrok"]),
            (
                "prd-network",
                &["prod-network", "prod-networks", "prod-netwrok"],
            ),
            ("dve", &["dev"]),
            ("de", &["dev", "dew"]),
            ("dvs", &["devs"]),
            ("prod-unrelated", &[]),
            ("staging-networx", &["staging-network"]),
            ("", &[]),
        ];
        for (typed, want) in table {
            assert_eq!(
                &close_names(typed, visible.iter().copied()),
                want,
                "{typed}"
            );
        }
        let many: Vec<String> = (0..20_000).map(|i| format!("ws-{i}")).collect();
        assert_eq!(
            close_names("ws-1x", many.iter().map(String::as_str)).len(),
            3
        );
        let page = empty_workspace(
            &Chrome {
                email: "e",
                csrf: "c",
                grant: &crate::operator::roles::Grant::ROOT,
                now: 0,
            },
            "prod-netwrok",
            "https://sg",
            &["prod-network", "<b>"],
        )
        .into_string();
        assert!(
            page.contains(
                r#"Did you mean <a href="/ui/workspaces/prod-network">prod-network</a> or <a"#
            ),
            "{page}"
        );
        assert!(
            page.contains("&lt;b&gt;") && !page.contains("<b>"),
            "{page}"
        );
    }

    #[test]
    fn an_sso_user_without_a_role_is_told_to_ask_for_a_group_mapping_not_a_token() {
        let page = sso_no_role("Corp <SSO>", "roles&groups").into_string();
        for want in [
            "Corp &lt;SSO&gt;",
            "<code>roles&amp;groups</code> claim",
            "Ask a stategate admin to map one of your groups to a role",
            "<code>[oidc.roles]</code>",
            r#"href="/ui/login""#,
        ] {
            assert!(page.contains(want), "{want} not on {page}");
        }
        assert!(!page.to_lowercase().contains("token"), "{page}");
    }

    #[test]
    fn audit_event_filters_match_a_name_or_a_part() {
        for (event, filter, want) in [
            ("tf.rollback", "rollback", true),
            ("tf.rollback", "tf.roll", true),
            ("tf.lock_forced", "tf.lock", true),
            ("tf.lock_forced", "lock", true),
            ("tf.lock_forced", "forced", true),
            ("cluster.state_lock_broken", "lock", true),
            ("cluster.state_lock_broken", "forced", false),
            ("tf.resources_moved", "move", true),
            ("tf.move_abandoned", "moved", true),
            ("tf.frozen", "freeze", true),
            ("tf.unfrozen", "freeze", true),
            ("tf.freeze_expired", "frozen", true),
            ("tf.frozen", "unfreeze", false),
            ("ui.login", "ui.login", true),
            ("ui.login", "UI", true),
            ("tf.resources_moved", "Move", true),
            ("tf.unfrozen", "FREEZE", true),
            ("tf.frozen", "UNFREEZE", false),
        ] {
            assert_eq!(event_matches(event, filter), want, "{event} {filter}");
        }
    }

    #[test]
    fn audit_details_are_words_with_links() {
        let row = |scope: &str, event: &str, payload: Value| AuditRow {
            id: 1,
            at: "2026-12-01T21:03:07Z".into(),
            actor: "cli:ops".into(),
            org: None,
            scope: scope.into(),
            event: event.into(),
            payload,
        };
        // (scope, event, payload, html the details must hold, html they must not)
        let table = [
            (
                "tf/prod",
                "tf.rollback",
                serde_json::json!({"to_version": 2, "new_version": 5, "serial": 9}),
                vec![
                    r#"<span class="key">to version</span> <a href="/ui/workspaces/prod/versions/2">v2</a>"#,
                    r#"<a href="/ui/workspaces/prod/versions/5">v5</a>"#,
                    r#"<span class="key">serial</span> 9"#,
                ],
                vec!["{", "versions/9"],
            ),
            (
                "tf/prod",
                "tf.resources_moved",
                serde_json::json!({"from": {"workspace": "prod", "version": 3}, "to": {"workspace": "dev", "version": 5}, "addresses": ["a.b", "c.d"]}),
                vec![
                    r#"<a href="/ui/workspaces/prod">prod</a>"#,
                    r#"<a href="/ui/workspaces/dev">dev</a>"#,
                    r#"<a href="/ui/workspaces/prod/versions/3">v3</a>"#,
                    r#"<a href="/ui/workspaces/dev/versions/5">v5</a>"#,
                    "a.b, c.d",
                ],
                vec!["[", "&quot;", "prod/versions/5"],
            ),
            // A name the reader may not see is no name: never a link, and neither is
            // the version beside it; a field the kind does not declare is not linked.
            (
                "tf/prod",
                "tf.resources_moved",
                serde_json::json!({"from": {"workspace": "prod", "version": 3}, "to": {"workspace": crate::operator::redact::HIDDEN_WORKSPACE, "version": 5}, "destination": "dev"}),
                vec![
                    r#"<a href="/ui/workspaces/prod">prod</a>"#,
                    "&lt;hidden workspace&gt;",
                    r#"<span class="key">to.version</span> 5"#,
                ],
                vec!["versions/5", "/ui/workspaces/dev"],
            ),
            (
                "tf/prod",
                "tf.consumers_set",
                serde_json::json!({"consumers": ["app", crate::operator::redact::HIDDEN_WORKSPACE]}),
                vec![r#"<a href="/ui/workspaces/app">app</a>, &lt;hidden workspace&gt;"#],
                vec!["href=\"/ui/workspaces/&lt;"],
            ),
            (
                "operators",
                "admin.operator_created",
                serde_json::json!({"email": "a@x.io", "grant": {"role": "viewer"}, "sso": false, "version": 3}),
                vec![
                    "grant.role</span> viewer",
                    "sso</span> no",
                    "version</span> 3",
                ],
                vec!["href"],
            ),
            (
                "tf/prod",
                "tf.rollback",
                serde_json::json!({}),
                vec!["–"],
                vec!["key"],
            ),
            // A freeze's end reads as every time does, not as Unix seconds.
            (
                "tf/prod",
                "tf.frozen",
                serde_json::json!({"reason": "window", "until": 1_796_205_600, "replaced": {"until": null}}),
                vec![
                    r#"<time datetime="2026-12-02T10:00:00Z"><span class="abs">2026-12-02 10:00 UTC</span> · in 93 min</time>"#,
                    "replaced.until</span> <span class=\"muted\">none</span>",
                ],
                vec!["1796205600"],
            ),
            (
                "tf/prod",
                "tf.resources_moved",
                serde_json::json!({"from": {"workspace": "../../x"}}),
                vec!["../../x"],
                vec!["href"],
            ),
        ];
        for (scope, event, payload, has, lacks) in table {
            let html =
                audit_details(&row(scope, event, payload.clone()), 1_796_200_000).into_string();
            for want in has {
                assert!(html.contains(want), "{payload}: {want} not in {html}");
            }
            for not in lacks {
                assert!(!html.contains(not), "{payload}: {not} in {html}");
            }
        }
    }

    #[test]
    fn values_are_escaped_everywhere() {
        let evil = "<script>alert(1)</script>\"'&";
        let chrome = Chrome {
            email: evil,
            csrf: evil,
            grant: &crate::operator::roles::Grant::ROOT,
            now: 0,
        };
        let lock = LockState {
            id: evil.into(),
            who: evil.into(),
            operation: evil.into(),
            created_at: evil.into(),
            age_seconds: 1,
            stale: true,
        };
        let ws = WorkspaceSummary {
            name: "prod".into(),
            version: Some(1),
            serial: Some(1),
            size: Some(1),
            updated_at: Some(evil.into()),
            written_by: Some(evil.into()),
            deleted: false,
            lock: Some(lock),
            plans: Vec::new(),
            frozen: None,
            encryption: None,
            key_generation: None,
        };
        let row = VersionRow {
            scope: "tf/prod".into(),
            version: 1,
            serial: Some(1),
            lineage: Some(evil.into()),
            sha256: Some(evil.into()),
            size: 1,
            blob_key: Some("k".into()),
            created_at: evil.into(),
            actor: evil.into(),
            facts: crate::store::WriteFacts {
                lock_who: Some(evil.into()),
                lock_operation: Some(evil.into()),
                restored_from: Some(1),
                moved_to: Some(evil.into()),
                moved_from: None,
            },
            changes: Some(Default::default()),
            key_generation: None,
        };
        let rows = [row.clone()];
        let timeline = [crate::store::timeline::TimelineRow {
            version: 1,
            address: evil.into(),
            change: crate::store::timeline::Change::Added,
            created_at: evil.into(),
            writer: evil.into(),
            lock_who: Some(evil.into()),
            lock_operation: Some(evil.into()),
            restored_from: None,
            moved_to: None,
            moved_from: Some(evil.into()),
        }];
        let page = VersionsPage {
            rows: &rows,
            page: 1,
            has_more: false,
            timeline: &timeline,
        };
        let audit_row = AuditRow {
            id: 1,
            at: evil.into(),
            actor: evil.into(),
            org: Some(evil.into()),
            scope: evil.into(),
            event: evil.into(),
            payload: serde_json::json!({ "x": evil }),
        };
        let form = AuditForm {
            scope: evil.into(),
            since: evil.into(),
            until: evil.into(),
            ..AuditForm::default()
        };
        let preview = RollbackPreview {
            from_version: 2,
            to_version: 1,
            to_serial: Some(1),
            refused: None,
            frozen: Some(crate::tofu::freeze::Freeze {
                workspace: evil.into(),
                frozen_by: evil.into(),
                reason: evil.into(),
                created_at: evil.into(),
                until: Some(1_796_205_600),
            }),
            diff: Some(StateDiff {
                resources: vec![crate::operator::diff::ResourceChange {
                    address: evil.into(),
                    change: Change::Changed,
                    values: Vec::new(),
                    attributes: vec![crate::operator::diff::AttributeChange {
                        name: evil.into(),
                        before: Some(Value::from(evil)),
                        after: None,
                    }],
                }],
                outputs: Vec::new(),
                moved: Some(crate::operator::diff::Moved::To(evil.into())),
            }),
            diff_unavailable: None,
            lock: ws.lock.clone(),
        };
        let mut found = SearchResults::new(evil, crate::operator::SearchLimits::default());
        found.hits.push(crate::operator::search::SearchHit {
            workspace: "prod".into(),
            version: 1,
            address: evil.into(),
            kind: evil.into(),
            mode: evil.into(),
        });
        found.not_searchable.push(evil.into());
        found.unreadable.push(evil.into());
        let evil_token = crate::tofu::credentials::WorkspaceToken {
            id: evil.into(),
            name: evil.into(),
            workspaces: vec![evil.into()],
            scope: "read",
            include_sensitive: false,
            created_at: evil.into(),
            expires_at: None,
            revoked_at: None,
            last_used: None,
        };
        let pages = [
            rollback_preview(&chrome, evil, &preview),
            search(&chrome, evil, Some(&found)),
            login(Some(evil), Some(evil)),
            signed_in(evil),
            workspaces(&chrome, std::slice::from_ref(&ws), evil),
            workspace(
                &chrome,
                &ws,
                &page,
                None,
                None,
                Some(std::slice::from_ref(&evil_token)),
                Some(&[evil.to_string(), "app".to_string()]),
                evil,
            ),
            version(
                &chrome,
                "prod",
                &row,
                &Content::Json {
                    text: evil.into(),
                    outline: Outline::of(&serde_json::json!({"resources": [
                        {"type": evil, "name": evil, "module": evil, "instances": [{"index_key": evil, "attributes": {evil: evil}}]}
                    ], "outputs": {evil: {"value": evil}}})),
                },
                Shown::Revealed,
            ),
            audit(
                &chrome,
                &AuditView {
                    form: &form,
                    rows: std::slice::from_ref(&audit_row),
                    kinds: &[evil.to_string()],
                    older: Some(evil),
                    invalid: &[],
                },
            ),
            audit(
                &chrome,
                &AuditView {
                    form: &form,
                    rows: &[],
                    kinds: &[],
                    older: None,
                    invalid: &[
                        InvalidField { field: "since" },
                        InvalidField { field: "until" },
                    ],
                },
            ),
            error(Some(&chrome), 423, evil, Some((evil, evil))),
        ];
        for (i, page) in pages.iter().enumerate() {
            let html = page.clone().into_string();
            assert!(!html.contains("<script>"), "page {i}: {html}");
            assert!(html.contains("&lt;script&gt;"), "page {i}");
        }
    }
}
