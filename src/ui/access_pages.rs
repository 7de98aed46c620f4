//! The access pages an unlimited admin reads: every issued workspace token (with its
//! revoke form) and the key status (what wraps the root key, the data key generations
//! and what each seals). The same values `stategate workspace token list` / `key status`
//! and the admin API print; everything interpolated with maud's escaping `(…)`.

use maud::{html, Markup};

use super::layout::{breakable_path, layout, unix_when, Chrome};
use crate::keys::KeyStatus;
use crate::tofu::credentials::WorkspaceToken;

/// The tokens as a table, each with a revoke form. `workspace`: the workspace page the
/// form returns to; `None`: the tokens page.
pub fn token_table(chrome: &Chrome, tokens: &[WorkspaceToken], workspace: Option<&str>) -> Markup {
    html! {
        div.table-wrap { table #tokens {
            thead { tr {
                th { "Name" } th { "Scope" } th { "Workspaces" } th { "Expires" } th { "Last used" }
                th { span.sr-only { "Actions" } }
            } }
            tbody {
                @for t in tokens {
                    tr {
                        td data-label="Name" { (t.name) br; span.muted { (t.id) } }
                        td data-label="Scope" { (t.scope) @if t.include_sensitive { " + sensitive outputs" } }
                        td data-label="Workspaces" { (t.workspaces.join(", ")) }
                        td data-label="Expires" { (unix_when(t.expires_at, chrome.now)) }
                        td data-label="Last used" { (unix_when(t.last_used, chrome.now)) }
                        td data-label="Revoke" {
                            @if t.revoked_at.is_some() {
                                span.badge { "revoked" }
                            } @else {
                                form.inline method="post" action=(format!("/ui/workspace-tokens/{}/revoke", t.id)) {
                                    input type="hidden" name="csrf" value=(chrome.csrf);
                                    @if let Some(w) = workspace {
                                        input type="hidden" name="workspace" value=(w);
                                    }
                                    label.check {
                                        input type="checkbox" name="confirm" value="yes" required;
                                        " confirm"
                                    }
                                    button.danger type="submit" { "Revoke" }
                                }
                            }
                        }
                    }
                }
            }
        } }
    }
}

/// `/ui/workspace-tokens`: every issued workspace token, live ones first.
pub fn tokens(chrome: &Chrome, tokens: &[WorkspaceToken], revoked: bool) -> Markup {
    let (live, ended): (Vec<_>, Vec<_>) = tokens
        .iter()
        .cloned()
        .partition(|t| t.revoked_at.is_none() && t.expires_at.is_none_or(|e| e > chrome.now));
    let body = html! {
        h1 { "Workspace tokens" }
        @if revoked { p.notice.ok role="status" { "The token was revoked. Its holders get 401 from now on." } }
        p.muted {
            "Tokens a pipeline or a team uses as its Terraform backend password, each for the workspaces its patterns cover. Create them with "
            code { "stategate workspace token create" } " or the admin API; the access model is in "
            code { "docs/access.md" } "."
        }
        @if live.is_empty() {
            p { "No live token." }
        } @else {
            (token_table(chrome, &live, None))
        }
        @if !ended.is_empty() {
            h2 { "Revoked or expired" }
            (token_table(chrome, &ended, None))
        }
    };
    layout("Workspace tokens", Some(chrome), body)
}

/// `/ui/keys`: the key status.
pub fn keys(chrome: &Chrome, status: &KeyStatus) -> Markup {
    let body = html! {
        h1 { "Keys" }
        p {
            "The root key is kept by " strong { (breakable_path(&status.key_service)) } ". New writes are sealed under data key generation "
            strong { (status.data_generation) } "; workspace credentials are derived from generation "
            strong { (status.credentials_generation) } "."
        }
        p.muted {
            "Rotate with " code { "stategate key rotate" } ", re-seal old objects with "
            code { "stategate key reseal" } ", and retire a generation once it seals nothing ("
            code { "docs/keys.md" } ")."
        }
        div.table-wrap { table #generations {
            thead { tr {
                th.num { "Generation" } th { "State" } th.num { "Versions" } th.num { "Backups" }
                th.num { "Revocations" } th.num { "Drift outputs" } th.num { "Kept plans" }
            } }
            tbody { @for g in &status.generations { tr {
                td.num data-label="Generation" { (g.generation) }
                td data-label="State" {
                    @match (g.in_ring, g.writes) {
                        (_, true) => span.badge.ok { "new writes" },
                        (true, false) => span.badge { "in ring" },
                        (false, false) => span.badge.danger { "not in ring" },
                    }
                }
                td.num data-label="Versions" { (g.counts.versions) }
                td.num data-label="Backups" { (g.counts.backups) }
                td.num data-label="Revocations" { (g.counts.revocation_records) }
                td.num data-label="Drift outputs" { (g.counts.drift_outputs) }
                td.num data-label="Kept plans" { (g.counts.drift_plans) }
            } } }
        } }
        @if status.other_root_versions > 0 {
            p { (status.other_root_versions) " cluster state version(s) are sealed under " code { "ADJ_STATE_ENC_KEY" } ", outside the keyring." }
        }
        @if !status.unreadable.is_empty() {
            section.card {
                h2 { "Unreadable objects" }
                p { "Their generation could not be read; " code { "stategate key status" } " names them too." }
                ul { @for u in &status.unreadable { li { code { (u) } } } }
            }
        }
    };
    layout("Keys", Some(chrome), body)
}
