//! The one place the admin API and the web UI ask whether the authenticated operator
//! may do what a route does (`operator::roles::may`), before any operation runs and
//! before a body is read. Every route names what it needs here, in exhaustive matches
//! (a new route does not compile until it says), so none can forget the check.
//!
//! A refusal is always `Error::NotPermitted` (403, one fixed body) whether the role
//! lacks the action, the workspace is outside the operator's patterns or the thing is
//! site-wide; it changes nothing and is not audited (a warning in the server log names
//! the operator, the route and the workspace, never content). Listings are not refused
//! but filtered: `Operations::list_workspaces`, `search` and `audit` take the
//! operator's `Grant`, and the drift listing is filtered by [`visible_drift`].

use super::params::{RunId, WorkspaceName};
use super::router::{AdminAction, UiRoute};
use super::App;
use crate::drift::{CheckSummary, Run, MAX_LIST};
use crate::error::Error;
use crate::operator::roles::{Action, Grant, Target};
use crate::operator::Operator;

/// The drift checks and the newest `limit` runs (of `workspace`, or of all) that
/// `grant` sees. For an operator limited to patterns the newest [`MAX_LIST`] runs are
/// read and filtered, so a page is short only when fewer visible runs exist there.
pub(super) async fn visible_drift(
    app: &App,
    grant: &Grant,
    workspace: Option<&WorkspaceName>,
    limit: u32,
) -> Result<(Vec<CheckSummary>, Vec<Run>), Error> {
    let mut checks = app.drift.checks().await?;
    checks.retain(|c| grant.sees(&c.workspace));
    let read = if grant.is_limited() && workspace.is_none() {
        MAX_LIST
    } else {
        limit
    };
    let mut runs = app
        .drift
        .runs(workspace.map(|w| w.to_string()), read)
        .await?;
    runs.retain(|r| grant.sees(&r.workspace));
    runs.truncate(limit as usize);
    Ok((checks, runs))
}

/// What a route is aimed at, before it is resolved to a [`Target`]: the values the
/// router parsed, which the handler then uses as they are (never text read again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum On<'a> {
    Workspace(&'a WorkspaceName),
    /// Two workspaces (a move): the action is needed on both.
    Both(&'a WorkspaceName, &'a WorkspaceName),
    /// A drift run: aimed at the run's workspace.
    Run(RunId),
    Listing,
    Site,
}

/// What a route needs; `None`: nothing beyond a live operator (who am I, log out, a
/// page that does not exist).
pub(super) type Need<'a> = Option<(Action, On<'a>)>;

pub(super) fn admin_need(action: &AdminAction) -> Need<'_> {
    use On::*;
    Some(match action {
        AdminAction::WhoAmI => return None,
        AdminAction::Workspaces
        | AdminAction::Audit { .. }
        | AdminAction::Search { .. }
        | AdminAction::Freezes => (Action::Read, Listing),
        AdminAction::Move { workspace, to } => (Action::Operate, Both(workspace, to)),
        AdminAction::Drift { workspace, .. } => match workspace {
            Some(w) => (Action::Read, Workspace(w)),
            None => (Action::Read, Listing),
        },
        AdminAction::Workspace { workspace }
        | AdminAction::Versions { workspace, .. }
        | AdminAction::Timeline { workspace, .. }
        | AdminAction::Diff { workspace, .. }
        | AdminAction::RollbackPreview { workspace, .. } => (Action::Read, Workspace(workspace)),
        AdminAction::Version {
            workspace, masked, ..
        } => {
            // Anything but an explicit masked read hands out the real values.
            let action = if *masked {
                Action::Read
            } else {
                Action::Reveal
            };
            (action, Workspace(workspace))
        }
        AdminAction::Rollback { workspace }
        | AdminAction::Unlock { workspace }
        | AdminAction::Restore { workspace }
        | AdminAction::AllowWrite { workspace }
        | AdminAction::Freeze { workspace }
        | AdminAction::Unfreeze { workspace }
        | AdminAction::DriftCheck { workspace } => (Action::Operate, Workspace(workspace)),
        AdminAction::Clusters => (Action::Read, Site),
        AdminAction::DriftRun { run } => (Action::Read, Run(*run)),
        AdminAction::DriftApply { run } => (Action::Operate, Run(*run)),
        // Credentials hand out access: the admin role only.
        AdminAction::RotateCredential { workspace }
        | AdminAction::Consumers { workspace }
        | AdminAction::SetConsumers { workspace } => (Action::Administer, Workspace(workspace)),
        // A token may name any pattern: only an admin not limited to patterns.
        AdminAction::WorkspaceTokens
        | AdminAction::CreateWorkspaceToken
        | AdminAction::RevokeWorkspaceToken { .. } => (Action::Administer, Site),
        // The keyring seals every workspace: site-wide, an admin not limited to patterns.
        AdminAction::Keys | AdminAction::RotateKey | AdminAction::RetireKey => {
            (Action::Administer, Site)
        }
    })
}

pub(super) fn ui_need(route: &UiRoute) -> Need<'_> {
    use On::*;
    Some(match route {
        UiRoute::PostOnly { page } => return ui_need(page),
        UiRoute::Stylesheet
        | UiRoute::Favicon
        | UiRoute::LoginForm
        | UiRoute::Login
        | UiRoute::SsoStart
        | UiRoute::SsoCallback { .. }
        | UiRoute::Logout
        | UiRoute::NotFound
        | UiRoute::NotAllowed { .. }
        | UiRoute::Invalid(_) => return None,
        UiRoute::Workspaces { .. } | UiRoute::Audit { .. } | UiRoute::Search { .. } => {
            (Action::Read, Listing)
        }
        UiRoute::Drift { workspace, .. } => match workspace {
            Some(w) => (Action::Read, Workspace(w)),
            None => (Action::Read, Listing),
        },
        UiRoute::Workspace { workspace, .. }
        | UiRoute::Version { workspace, .. }
        | UiRoute::Diff { workspace, .. }
        | UiRoute::RollbackPreview { workspace, .. } => (Action::Read, Workspace(workspace)),
        UiRoute::Reveal { workspace, .. } | UiRoute::Download { workspace, .. } => {
            (Action::Reveal, Workspace(workspace))
        }
        UiRoute::Rollback { workspace }
        | UiRoute::Unlock { workspace }
        | UiRoute::AllowWrite { workspace }
        | UiRoute::Freeze { workspace }
        | UiRoute::Unfreeze { workspace }
        | UiRoute::DriftCheck { workspace } => (Action::Operate, Workspace(workspace)),
        UiRoute::Clusters => (Action::Read, Site),
        UiRoute::DriftRun { run } => (Action::Read, Run(*run)),
        UiRoute::DriftApply { run } => (Action::Operate, Run(*run)),
        // As the admin API's tokens and keys: an admin not limited to patterns.
        UiRoute::WorkspaceTokens { .. } | UiRoute::RevokeWorkspaceToken { .. } | UiRoute::Keys => {
            (Action::Administer, Site)
        }
    })
}

/// Does `who` get to do what `route` (named `route_name` in the log) needs?
/// `Err(NotPermitted)` if not; nothing is read or changed either way.
pub(super) async fn permit(
    app: &App,
    who: &Operator,
    route_name: &str,
    need: Need<'_>,
) -> Result<(), Error> {
    let Some((action, on)) = need else {
        return Ok(());
    };
    let grant = &who.grant;
    let allowed = match on {
        On::Workspace(w) => grant.may(action, Target::Workspace(w.as_str())),
        On::Both(a, b) => {
            grant.may(action, Target::Workspace(a.as_str()))
                && grant.may(action, Target::Workspace(b.as_str()))
        }
        On::Listing => grant.may(action, Target::Listing),
        On::Site => grant.may(action, Target::Site),
        // The role first (a viewer's approval is refused without a lookup); then the
        // run's workspace. An id that names no run passes here and gets the route's
        // own 404 for that same id, which says nothing about any workspace.
        On::Run(id) => {
            grant.may(action, Target::Listing)
                && match app.drift.run(id.get()).await {
                    Ok(run) => grant.may(action, Target::Workspace(&run.workspace)),
                    Err(Error::NotFound(_)) => true,
                    Err(e) => return Err(e),
                }
        }
    };
    if allowed {
        return Ok(());
    }
    let workspace: String = match on {
        On::Workspace(w) => w.to_string(),
        On::Run(id) => format!("drift run {}", id.get()),
        On::Both(a, b) => format!("{a} -> {b}"),
        On::Listing | On::Site => String::new(),
    };
    tracing::warn!(
        operator = %who.email,
        role = %grant.role,
        route = route_name,
        target = %workspace,
        "operator refused: not permitted"
    );
    Err(Error::NotPermitted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reveals_need_admin_unless_explicitly_masked() {
        let w = WorkspaceName::parse("w").unwrap();
        let version = |masked: bool| AdminAction::Version {
            workspace: w.clone(),
            version: crate::http::params::VersionRef::Number(1),
            masked,
        };
        for (masked, action) in [(true, Action::Read), (false, Action::Reveal)] {
            assert_eq!(
                admin_need(&version(masked)),
                Some((action, On::Workspace(&w))),
                "{masked:?}"
            );
        }
    }

    #[test]
    fn the_keyring_is_site_wide_and_for_admins() {
        for route in [
            AdminAction::Keys,
            AdminAction::RotateKey,
            AdminAction::RetireKey,
        ] {
            assert_eq!(
                admin_need(&route),
                Some((Action::Administer, On::Site)),
                "{route:?}"
            );
        }
    }
}
