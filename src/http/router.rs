//! Parses a request line into a typed [`Endpoint`]. Pure: no I/O, no state.
//!
//! [`ROUTES`] lists every route stategate answers itself (method and path template).
//! A path is matched against that table only, so a route exists exactly when it is
//! listed, and the authorization property test (`tests/authorization.rs`), which walks
//! the table, covers a new route without anyone remembering to add it.
//!
//! Every path and query value is parsed here, once, into a typed value of
//! `super::params` (a [`WorkspaceName`], a [`RunId`], a [`VersionRef`], a bounded
//! count, a flag): `guard` and the handlers receive that value and never read the text
//! again. A value that does not parse is kept as a [`BadParam`] in the admin API and
//! the UI, answered 400 after authentication (auth, then input, then state); the
//! Terraform backend refuses a bad name at once, as it always has (a name reveals
//! nothing); a cluster id that is not a UUID is kept as such and answers like a missing
//! cluster after authentication (docs: the cluster API's contract).
//!
//! Anything that is not one of stategate's own routes is [`Endpoint::Upstream`]:
//! decided by `pass_through` (forwarded to the S3 store, refused, or 404 when no
//! upstream is configured).

use super::error::EdgeError;
use super::params::{self, BadParam, ClusterId, Parsed, RunId, VersionRef, WorkspaceName};
use crate::error::Error;

const TF_PREFIX: &str = "/api/v1/tf/state/";
/// The outputs-only state (`tofu::outputs`), for `terraform_remote_state`.
const TF_OUTPUTS_PREFIX: &str = "/api/v1/tf/outputs/";
const CLUSTER_PREFIX: &str = "/v1/clusters/";
const ADMIN_PREFIX: &str = "/api/v1/admin/";
const UI_PREFIX: &str = "/ui/";

/// Which of stategate's surfaces a route belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    Health,
    Metrics,
    /// The Terraform/OpenTofu backend (`/api/v1/tf/`).
    Tf,
    /// The cluster tfstate & lock API (`/v1/clusters/`).
    Cluster,
    /// The operator API (`/api/v1/admin/`).
    Admin,
    /// The web UI (`/ui/`, and the icon browsers ask for at `/favicon.ico`).
    Ui,
}

impl Surface {
    /// The surface's name where a tool reads the route table (`stategate routes`): the
    /// browser walk takes every `ui` GET page from it.
    pub const fn name(self) -> &'static str {
        match self {
            Surface::Health => "health",
            Surface::Metrics => "metrics",
            Surface::Tf => "tf",
            Surface::Cluster => "cluster",
            Surface::Admin => "admin",
            Surface::Ui => "ui",
        }
    }
}

/// One route: a method and a path template whose `{…}` segments are values —
/// `{ws}`/`{to}` a workspace name, `{run}` a drift run id, `{version}`/`{from}` a
/// version (a number, or `latest` in the admin API's path), `{token}` a workspace
/// token's name or id, `{id}` a cluster id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub surface: Surface,
    pub method: &'static str,
    pub path: &'static str,
    /// The query values the route requires, as a template (`from={version}`); empty
    /// when it requires none.
    pub query: &'static str,
}

impl Route {
    /// The path with each `{…}` segment replaced by `value(name)` (`name` without the
    /// braces): how tests build a request for every route of the table.
    pub fn fill(&self, value: impl Fn(&str) -> String) -> String {
        fill(self.path, '/', &value)
    }

    /// The required query (`None` when there is none), its `{…}` values filled as
    /// [`Route::fill`] does.
    pub fn fill_query(&self, value: impl Fn(&str) -> String) -> Option<String> {
        (!self.query.is_empty()).then(|| {
            self.query
                .split('&')
                .map(|pair| fill(pair, '=', &value))
                .collect::<Vec<_>>()
                .join("&")
        })
    }
}

const fn r(surface: Surface, method: &'static str, path: &'static str) -> Route {
    Route {
        surface,
        method,
        path,
        query: "",
    }
}

fn fill(template: &str, separator: char, value: &impl Fn(&str) -> String) -> String {
    template
        .split(separator)
        .map(|segment| match segment.strip_prefix('{') {
            Some(name) => value(name.trim_end_matches('}')),
            None => segment.to_string(),
        })
        .collect::<Vec<_>>()
        .join(&separator.to_string())
}

/// A route that requires query values.
const fn rq(
    surface: Surface,
    method: &'static str,
    path: &'static str,
    query: &'static str,
) -> Route {
    Route {
        surface,
        method,
        path,
        query,
    }
}

use Surface::{Admin as A, Cluster as C, Health as H, Metrics as M, Tf as T, Ui as U};

/// Every route stategate answers itself. Where two routes share a path, the one a
/// wrong method is told about (405, or a UI form's page) comes last.
pub const ROUTES: &[Route] = &[
    r(H, "GET", "/healthz"),
    r(H, "HEAD", "/healthz"),
    r(M, "GET", "/metrics"),
    r(T, "GET", "/api/v1/tf/state/{ws}"),
    r(T, "POST", "/api/v1/tf/state/{ws}"),
    r(T, "LOCK", "/api/v1/tf/state/{ws}"),
    r(T, "UNLOCK", "/api/v1/tf/state/{ws}"),
    r(T, "DELETE", "/api/v1/tf/state/{ws}"),
    r(T, "POST", "/api/v1/tf/state/{ws}/lock"),
    r(T, "LOCK", "/api/v1/tf/state/{ws}/lock"),
    r(T, "DELETE", "/api/v1/tf/state/{ws}/lock"),
    r(T, "UNLOCK", "/api/v1/tf/state/{ws}/lock"),
    r(T, "GET", "/api/v1/tf/outputs/{ws}"),
    r(C, "GET", "/v1/clusters/{id}/tfstate"),
    r(C, "PUT", "/v1/clusters/{id}/tfstate"),
    r(C, "POST", "/v1/clusters/{id}/lock"),
    r(C, "DELETE", "/v1/clusters/{id}/lock"),
    r(C, "POST", "/v1/clusters/{id}/lock/heartbeat"),
    r(A, "GET", "/api/v1/admin/whoami"),
    r(A, "GET", "/api/v1/admin/workspaces"),
    r(A, "GET", "/api/v1/admin/clusters"),
    r(A, "GET", "/api/v1/admin/search"),
    r(A, "GET", "/api/v1/admin/audit"),
    r(A, "GET", "/api/v1/admin/freezes"),
    r(A, "GET", "/api/v1/admin/workspaces/{ws}"),
    r(A, "GET", "/api/v1/admin/workspaces/{ws}/versions"),
    r(A, "GET", "/api/v1/admin/workspaces/{ws}/timeline"),
    r(A, "GET", "/api/v1/admin/workspaces/{ws}/versions/{version}"),
    rq(
        A,
        "GET",
        "/api/v1/admin/workspaces/{ws}/diff",
        "from={from}&to={version}",
    ),
    rq(
        A,
        "GET",
        "/api/v1/admin/workspaces/{ws}/rollback",
        "to={version}",
    ),
    r(A, "POST", "/api/v1/admin/workspaces/{ws}/rollback"),
    r(A, "POST", "/api/v1/admin/workspaces/{ws}/unlock"),
    r(A, "POST", "/api/v1/admin/workspaces/{ws}/restore"),
    r(A, "POST", "/api/v1/admin/workspaces/{ws}/allow-write"),
    r(A, "POST", "/api/v1/admin/workspaces/{ws}/freeze"),
    r(A, "POST", "/api/v1/admin/workspaces/{ws}/unfreeze"),
    r(A, "POST", "/api/v1/admin/workspaces/{ws}/move/{to}"),
    r(A, "POST", "/api/v1/admin/workspaces/{ws}/credential/rotate"),
    r(A, "GET", "/api/v1/admin/workspaces/{ws}/consumers"),
    r(A, "PUT", "/api/v1/admin/workspaces/{ws}/consumers"),
    r(A, "GET", "/api/v1/admin/workspace-tokens"),
    r(A, "POST", "/api/v1/admin/workspace-tokens"),
    r(A, "POST", "/api/v1/admin/workspace-tokens/{token}/revoke"),
    r(A, "GET", "/api/v1/admin/drift"),
    r(A, "GET", "/api/v1/admin/drift/{run}"),
    r(A, "POST", "/api/v1/admin/drift/{ws}/run"),
    r(A, "POST", "/api/v1/admin/drift/{run}/apply"),
    r(A, "GET", "/api/v1/admin/keys"),
    r(A, "POST", "/api/v1/admin/keys/rotate"),
    r(A, "POST", "/api/v1/admin/keys/retire"),
    r(U, "GET", "/favicon.ico"),
    r(U, "HEAD", "/favicon.ico"),
    r(U, "GET", "/ui/static/app.css"),
    r(U, "POST", "/ui/login"),
    r(U, "GET", "/ui/login"),
    r(U, "GET", "/ui/login/oidc"),
    r(U, "GET", "/ui/login/oidc/callback"),
    r(U, "POST", "/ui/logout"),
    r(U, "GET", "/ui"),
    r(U, "GET", "/ui/"),
    r(U, "GET", "/ui/workspaces"),
    r(U, "GET", "/ui/audit"),
    r(U, "GET", "/ui/clusters"),
    r(U, "GET", "/ui/search"),
    r(U, "GET", "/ui/drift"),
    r(U, "GET", "/ui/drift/{run}"),
    r(U, "POST", "/ui/drift/{ws}/run"),
    r(U, "POST", "/ui/drift/{run}/apply"),
    r(U, "GET", "/ui/workspaces/{ws}"),
    r(U, "GET", "/ui/workspaces/{ws}/versions/{version}"),
    r(U, "POST", "/ui/workspaces/{ws}/versions/{version}/reveal"),
    r(U, "POST", "/ui/workspaces/{ws}/versions/{version}/download"),
    rq(
        U,
        "GET",
        "/ui/workspaces/{ws}/diff",
        "from={from}&to={version}",
    ),
    rq(U, "GET", "/ui/workspaces/{ws}/rollback", "to={version}"),
    r(U, "POST", "/ui/workspaces/{ws}/rollback"),
    r(U, "POST", "/ui/workspaces/{ws}/unlock"),
    r(U, "POST", "/ui/workspaces/{ws}/allow-write"),
    r(U, "POST", "/ui/workspaces/{ws}/freeze"),
    r(U, "POST", "/ui/workspaces/{ws}/unfreeze"),
    r(U, "GET", "/ui/workspace-tokens"),
    r(U, "POST", "/ui/workspace-tokens/{token}/revoke"),
    r(U, "GET", "/ui/keys"),
];

/// The values of `path` in `template`'s `{…}` segments, if `path` has its shape.
fn captures<'p>(template: &str, path: &'p str) -> Option<Vec<&'p str>> {
    let (mut t, mut p) = (template.split('/'), path.split('/'));
    let mut values = Vec::new();
    loop {
        match (t.next(), p.next()) {
            (None, None) => return Some(values),
            (Some(want), Some(got)) if want.starts_with('{') => values.push(got),
            (Some(want), Some(got)) if want == got => {}
            _ => return None,
        }
    }
}

/// The route of `surface` for `method` and `path`, or else the last one with that
/// path (the method is then wrong), with the path's values.
fn lookup<'p>(
    surface: Surface,
    method: &str,
    path: &'p str,
) -> Option<(&'static Route, Vec<&'p str>)> {
    let mut other = None;
    for route in ROUTES.iter().filter(|r| r.surface == surface) {
        if let Some(values) = captures(route.path, path) {
            if route.method == method {
                return Some((route, values));
            }
            other = Some((route, values));
        }
    }
    other
}

/// The `i`th value of a template (a template names each one it uses).
fn at<'p>(values: &[&'p str], i: usize) -> &'p str {
    values.get(i).copied().unwrap_or("")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Health,
    Metrics,
    Tf {
        workspace: WorkspaceName,
        action: TfAction,
    },
    /// The cluster tfstate & lock API. An `id` that is not a UUID is judged only after
    /// authentication, so it answers like a missing cluster.
    Cluster {
        id: ClusterId,
        action: ClusterAction,
    },
    /// The operator API (`docs/admin-api.md`). A value that did not parse is answered
    /// only after the operator token: auth, then input, then state.
    Admin(Parsed<AdminAction>),
    /// The operator web UI under `/ui/` (`crate::ui`); a value that did not parse is
    /// [`UiRoute::Invalid`], answered after the session.
    Ui(UiRoute),
    /// Not ours.
    Upstream,
}

/// A route of the admin API under `/api/v1/admin/`, with its parsed values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAction {
    /// `GET whoami`
    WhoAmI,
    /// `GET workspaces`
    Workspaces,
    /// `GET workspaces/{ws}`
    Workspace { workspace: WorkspaceName },
    /// `GET workspaces/{ws}/versions[?limit=N]`
    Versions {
        workspace: WorkspaceName,
        limit: Option<u32>,
    },
    /// `GET workspaces/{ws}/timeline[?address=A&limit=N]`: which versions changed which
    /// resource addresses, and who wrote them
    Timeline {
        workspace: WorkspaceName,
        address: Option<String>,
        limit: Option<u32>,
    },
    /// `GET workspaces/{ws}/versions/{n|latest}[?masked=1]`
    Version {
        workspace: WorkspaceName,
        version: VersionRef,
        masked: bool,
    },
    /// `GET workspaces/{ws}/diff?from=A&to=B`
    Diff {
        workspace: WorkspaceName,
        from: i64,
        to: i64,
    },
    /// `GET workspaces/{ws}/rollback?to=N`: what the rollback would change
    RollbackPreview { workspace: WorkspaceName, to: i64 },
    /// `POST workspaces/{ws}/rollback` with `{"to": N[, "from": M]}`
    Rollback { workspace: WorkspaceName },
    /// `POST workspaces/{ws}/unlock` with an optional `{"lock_id": "…"}`
    Unlock { workspace: WorkspaceName },
    /// `POST workspaces/{ws}/restore`
    Restore { workspace: WorkspaceName },
    /// `POST workspaces/{ws}/allow-write` with `{"reason": "…"[, "minutes": N]}`: one
    /// write the write guard would refuse may go through
    AllowWrite { workspace: WorkspaceName },
    /// `POST workspaces/{ws}/freeze` with `{"reason": "…"[, "until": T | "for": "2h"]}`
    Freeze { workspace: WorkspaceName },
    /// `POST workspaces/{ws}/unfreeze`
    Unfreeze { workspace: WorkspaceName },
    /// `GET freezes`: every freeze in force
    Freezes,
    /// `POST workspaces/{src}/move/{dst}` with `{"addresses": ["…", …]}`: move
    /// resources from one workspace's state to another's
    Move {
        workspace: WorkspaceName,
        to: WorkspaceName,
    },
    /// `GET audit[?scope=&event=&since=&until=&limit=]`: the filters are text the
    /// audit listing reads (no permission is decided on them; the listing is filtered
    /// by the operator's grant)
    Audit {
        scope: Option<String>,
        event: Option<String>,
        since: Option<String>,
        until: Option<String>,
        limit: Option<u32>,
    },
    /// `GET clusters`
    Clusters,
    /// `GET search?q=`
    Search { q: Option<String> },
    /// `GET drift[?workspace=&limit=]`: configured checks and recent runs
    Drift {
        workspace: Option<WorkspaceName>,
        limit: Option<u32>,
    },
    /// `GET drift/{run}`: one run with its plan output
    DriftRun { run: RunId },
    /// `POST drift/{ws}/run`: start a check now
    DriftCheck { workspace: WorkspaceName },
    /// `POST drift/{run}/apply`: approve a drifted check's kept plan
    DriftApply { run: RunId },
    /// `POST workspaces/{ws}/credential/rotate`: a new derived credential
    RotateCredential { workspace: WorkspaceName },
    /// `GET workspaces/{ws}/consumers`
    Consumers { workspace: WorkspaceName },
    /// `PUT workspaces/{ws}/consumers` with `{"consumers": ["app-a", …]}`
    SetConsumers { workspace: WorkspaceName },
    /// `GET workspace-tokens`
    WorkspaceTokens,
    /// `POST workspace-tokens` with `{"name", "workspaces", "scope"[, "expires",
    /// "include_sensitive"]}`
    CreateWorkspaceToken,
    /// `POST workspace-tokens/{name or id}/revoke`
    RevokeWorkspaceToken { token: String },
    /// `GET keys`: what each data key generation seals, and the ring
    Keys,
    /// `POST keys/rotate`: a new data key generation
    RotateKey,
    /// `POST keys/retire` with `{"generation": N}`
    RetireKey,
}

impl AdminAction {
    pub fn name(&self) -> &'static str {
        match self {
            AdminAction::WhoAmI => "admin.whoami",
            AdminAction::Workspaces => "admin.workspaces",
            AdminAction::Workspace { .. } => "admin.workspace",
            AdminAction::Versions { .. } => "admin.versions",
            AdminAction::Timeline { .. } => "admin.timeline",
            AdminAction::Version { .. } => "admin.version",
            AdminAction::Diff { .. } => "admin.diff",
            AdminAction::RollbackPreview { .. } => "admin.rollback_preview",
            AdminAction::Rollback { .. } => "admin.rollback",
            AdminAction::Unlock { .. } => "admin.unlock",
            AdminAction::Restore { .. } => "admin.restore",
            AdminAction::AllowWrite { .. } => "admin.allow_write",
            AdminAction::Freeze { .. } => "admin.freeze",
            AdminAction::Unfreeze { .. } => "admin.unfreeze",
            AdminAction::Freezes => "admin.freezes",
            AdminAction::Move { .. } => "admin.move",
            AdminAction::Audit { .. } => "admin.audit",
            AdminAction::Clusters => "admin.clusters",
            AdminAction::Search { .. } => "admin.search",
            AdminAction::RotateCredential { .. } => "admin.rotate_credential",
            AdminAction::Consumers { .. } => "admin.consumers",
            AdminAction::SetConsumers { .. } => "admin.set_consumers",
            AdminAction::WorkspaceTokens => "admin.workspace_tokens",
            AdminAction::CreateWorkspaceToken => "admin.create_workspace_token",
            AdminAction::RevokeWorkspaceToken { .. } => "admin.revoke_workspace_token",
            AdminAction::Keys => "admin.keys",
            AdminAction::RotateKey => "admin.rotate_key",
            AdminAction::RetireKey => "admin.retire_key",
            AdminAction::Drift { .. } => "admin.drift",
            AdminAction::DriftRun { .. } => "admin.drift_run",
            AdminAction::DriftCheck { .. } => "admin.drift_check",
            AdminAction::DriftApply { .. } => "admin.drift_apply",
        }
    }

    /// Does the route take a (small JSON) request body?
    pub fn takes_body(&self) -> bool {
        matches!(
            self,
            AdminAction::Rollback { .. }
                | AdminAction::Unlock { .. }
                | AdminAction::Restore { .. }
                | AdminAction::AllowWrite { .. }
                | AdminAction::Freeze { .. }
                | AdminAction::Unfreeze { .. }
                | AdminAction::Move { .. }
                | AdminAction::DriftCheck { .. }
                | AdminAction::DriftApply { .. }
                | AdminAction::RotateCredential { .. }
                | AdminAction::SetConsumers { .. }
                | AdminAction::CreateWorkspaceToken
                | AdminAction::RevokeWorkspaceToken { .. }
                | AdminAction::RotateKey
                | AdminAction::RetireKey
        )
    }

    /// The workspace a route is about (for the request log line).
    pub fn workspace(&self) -> Option<&str> {
        match self {
            AdminAction::Workspace { workspace }
            | AdminAction::Versions { workspace, .. }
            | AdminAction::Timeline { workspace, .. }
            | AdminAction::Version { workspace, .. }
            | AdminAction::Diff { workspace, .. }
            | AdminAction::RollbackPreview { workspace, .. }
            | AdminAction::Rollback { workspace }
            | AdminAction::Unlock { workspace }
            | AdminAction::Restore { workspace }
            | AdminAction::AllowWrite { workspace }
            | AdminAction::Freeze { workspace }
            | AdminAction::Unfreeze { workspace }
            | AdminAction::Move { workspace, .. }
            | AdminAction::DriftCheck { workspace }
            | AdminAction::RotateCredential { workspace }
            | AdminAction::Consumers { workspace }
            | AdminAction::SetConsumers { workspace } => Some(workspace.as_str()),
            _ => None,
        }
    }
}

/// A page or form of the web UI under `/ui/`, with its parsed values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UiRoute {
    /// `GET static/app.css` (public)
    Stylesheet,
    /// `GET /favicon.ico` (public; outside `/ui/` because browsers ask for it there)
    Favicon,
    /// `GET login` (public)
    LoginForm,
    /// `POST login` with `token` (public)
    Login,
    /// `GET login/oidc` (public): start a single sign-on (303 to the provider)
    SsoStart,
    /// `GET login/oidc/callback?state=&code=` or `?state=&error=` (public): the
    /// provider's answer (opaque values, read by `ui::oidc` alone)
    SsoCallback {
        state: Option<String>,
        code: Option<String>,
        error: Option<String>,
        /// RFC 9207's issuer identification, when the provider sends it.
        iss: Option<String>,
    },
    /// `POST logout` with `csrf`
    Logout,
    /// `GET /ui`, `GET /ui/`, `GET workspaces[?q=]` (`q`: text the names are searched for)
    Workspaces { filter: Option<String> },
    /// `GET workspaces/{ws}[?page=N]`; `rolled_back`/`unlocked`/`write_allowed` report
    /// a finished action (a value that does not parse shows no report).
    Workspace {
        workspace: WorkspaceName,
        page: Option<i64>,
        rolled_back: Option<i64>,
        unlocked: Option<bool>,
        write_allowed: bool,
    },
    /// `GET workspaces/{ws}/versions/{n}[?reveal=<ticket>]`: sensitive values masked,
    /// or shown once with a ticket the reveal form's POST redirected with
    /// (`crate::ui::reveal`)
    Version {
        workspace: WorkspaceName,
        version: i64,
        reveal: Option<String>,
    },
    /// `POST workspaces/{ws}/versions/{n}/reveal` with `csrf`: unmasked, audited
    Reveal {
        workspace: WorkspaceName,
        version: i64,
    },
    /// `POST workspaces/{ws}/versions/{n}/download` with `csrf`: the raw state, audited
    Download {
        workspace: WorkspaceName,
        version: i64,
    },
    /// `GET workspaces/{ws}/diff?from=A&to=B`
    Diff {
        workspace: WorkspaceName,
        from: i64,
        to: i64,
    },
    /// `GET workspaces/{ws}/rollback?to=N`: the diff and the confirmation form
    RollbackPreview { workspace: WorkspaceName, to: i64 },
    /// `POST workspaces/{ws}/rollback` with `csrf`, `to`, `from`, `confirm`
    Rollback { workspace: WorkspaceName },
    /// `POST workspaces/{ws}/unlock` with `csrf`, `lock_id`, `confirm`
    Unlock { workspace: WorkspaceName },
    /// `POST workspaces/{ws}/allow-write` with `csrf`, `reason`, `minutes`, `confirm`:
    /// one write the write guard would refuse may go through
    AllowWrite { workspace: WorkspaceName },
    /// `POST workspaces/{ws}/freeze` with `csrf`, `reason`, `for`, `confirm`
    Freeze { workspace: WorkspaceName },
    /// `POST workspaces/{ws}/unfreeze` with `csrf`
    Unfreeze { workspace: WorkspaceName },
    /// `GET audit[?scope=&event=&since=&until=&logins=&before=]`: the filter form's
    /// text, as the admin API's audit filters
    Audit {
        scope: Option<String>,
        event: Option<String>,
        since: Option<String>,
        until: Option<String>,
        /// `1`: show `ui.login*` rows too (hidden by default).
        logins: Option<String>,
        before: Option<i64>,
    },
    /// `GET clusters`
    Clusters,
    /// `GET search?q=`
    Search { q: Option<String> },
    /// `GET drift[?workspace=&limit=]`: the configured checks and the newest runs
    Drift {
        workspace: Option<WorkspaceName>,
        limit: Option<u32>,
    },
    /// `GET drift/{run}`: one run and its plan text
    DriftRun { run: RunId },
    /// `POST drift/{ws}/run` with `csrf`: start a check now
    DriftCheck { workspace: WorkspaceName },
    /// `POST drift/{run}/apply` with `csrf`, `confirm`: approve a drifted check's plan
    DriftApply { run: RunId },
    /// `GET workspace-tokens`: every issued workspace token
    WorkspaceTokens { revoked: bool },
    /// `POST workspace-tokens/{id}/revoke` with `csrf`, `workspace` (the workspace page
    /// to return to; none: the tokens page), `confirm`: revoke an issued workspace token
    RevokeWorkspaceToken { token: String },
    /// `GET keys`: the key service, generations and what each seals
    Keys,
    /// A GET (or HEAD) of a form's URL (a reload, a bookmark, a restored tab): 303 to
    /// the page the form belongs to, never a 405 page.
    PostOnly { page: Box<UiRoute> },
    /// No such page (answered after the session check, so it reveals nothing).
    NotFound,
    /// A page asked for with the wrong method.
    NotAllowed { allowed: &'static str },
    /// A page whose path or query value did not parse: 400, after the session check.
    Invalid(BadParam),
}

impl UiRoute {
    pub fn name(&self) -> &'static str {
        match self {
            UiRoute::Stylesheet => "ui.static",
            UiRoute::Favicon => "ui.favicon",
            UiRoute::PostOnly { .. } => "ui.post_only",
            UiRoute::LoginForm => "ui.login_form",
            UiRoute::Login => "ui.login",
            UiRoute::SsoStart => "ui.sso_start",
            UiRoute::SsoCallback { .. } => "ui.sso_callback",
            UiRoute::Logout => "ui.logout",
            UiRoute::Workspaces { .. } => "ui.workspaces",
            UiRoute::Workspace { .. } => "ui.workspace",
            UiRoute::Version { .. } => "ui.version",
            UiRoute::Reveal { .. } => "ui.reveal",
            UiRoute::Download { .. } => "ui.download",
            UiRoute::Diff { .. } => "ui.diff",
            UiRoute::RollbackPreview { .. } => "ui.rollback_preview",
            UiRoute::Rollback { .. } => "ui.rollback",
            UiRoute::Unlock { .. } => "ui.unlock",
            UiRoute::AllowWrite { .. } => "ui.allow_write",
            UiRoute::Freeze { .. } => "ui.freeze",
            UiRoute::Unfreeze { .. } => "ui.unfreeze",
            UiRoute::Audit { .. } => "ui.audit",
            UiRoute::Clusters => "ui.clusters",
            UiRoute::Search { .. } => "ui.search",
            UiRoute::Drift { .. } => "ui.drift",
            UiRoute::DriftRun { .. } => "ui.drift_run",
            UiRoute::DriftCheck { .. } => "ui.drift_check",
            UiRoute::DriftApply { .. } => "ui.drift_apply",
            UiRoute::WorkspaceTokens { .. } => "ui.workspace_tokens",
            UiRoute::RevokeWorkspaceToken { .. } => "ui.revoke_workspace_token",
            UiRoute::Keys => "ui.keys",
            UiRoute::NotFound | UiRoute::NotAllowed { .. } | UiRoute::Invalid(_) => "ui.invalid",
        }
    }

    /// A form POST (bounded `application/x-www-form-urlencoded` body).
    pub fn takes_form(&self) -> bool {
        matches!(
            self,
            UiRoute::Login
                | UiRoute::Logout
                | UiRoute::Reveal { .. }
                | UiRoute::Download { .. }
                | UiRoute::Rollback { .. }
                | UiRoute::Unlock { .. }
                | UiRoute::AllowWrite { .. }
                | UiRoute::Freeze { .. }
                | UiRoute::Unfreeze { .. }
                | UiRoute::DriftCheck { .. }
                | UiRoute::DriftApply { .. }
                | UiRoute::RevokeWorkspaceToken { .. }
        )
    }

    /// The workspace a route is about (for the request log line).
    pub fn workspace(&self) -> Option<&str> {
        match self {
            UiRoute::Workspace { workspace, .. }
            | UiRoute::Version { workspace, .. }
            | UiRoute::Reveal { workspace, .. }
            | UiRoute::Download { workspace, .. }
            | UiRoute::Diff { workspace, .. }
            | UiRoute::RollbackPreview { workspace, .. }
            | UiRoute::Rollback { workspace }
            | UiRoute::Unlock { workspace }
            | UiRoute::AllowWrite { workspace }
            | UiRoute::Freeze { workspace }
            | UiRoute::Unfreeze { workspace }
            | UiRoute::DriftCheck { workspace } => Some(workspace.as_str()),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterAction {
    /// `GET /v1/clusters/{id}/tfstate`
    GetState,
    /// `PUT /v1/clusters/{id}/tfstate`
    PutState,
    /// `POST /v1/clusters/{id}/lock`
    Lock,
    /// `POST /v1/clusters/{id}/lock/heartbeat`
    Heartbeat,
    /// `DELETE /v1/clusters/{id}/lock[?force=1]`
    Unlock { force: bool },
}

impl ClusterAction {
    pub fn name(&self) -> &'static str {
        match self {
            ClusterAction::GetState => "cluster.get_state",
            ClusterAction::PutState => "cluster.put_state",
            ClusterAction::Lock => "cluster.lock",
            ClusterAction::Heartbeat => "cluster.heartbeat",
            ClusterAction::Unlock { force: false } => "cluster.unlock",
            ClusterAction::Unlock { force: true } => "cluster.force_unlock",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TfAction {
    Get,
    /// GET of the outputs-only state.
    Outputs,
    Write {
        lock_id: Option<String>,
    },
    Lock,
    Unlock,
    Delete,
}

impl TfAction {
    /// A short stable name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            TfAction::Get => "tf.get",
            TfAction::Outputs => "tf.outputs",
            TfAction::Write { .. } => "tf.write",
            TfAction::Lock => "tf.lock",
            TfAction::Unlock => "tf.unlock",
            TfAction::Delete => "tf.delete",
        }
    }
}

impl Endpoint {
    pub fn name(&self) -> &'static str {
        match self {
            Endpoint::Health => "healthz",
            Endpoint::Metrics => "metrics",
            Endpoint::Tf { action, .. } => action.name(),
            Endpoint::Cluster { action, .. } => action.name(),
            Endpoint::Admin(Ok(action)) => action.name(),
            Endpoint::Admin(Err(_)) => "admin.invalid",
            Endpoint::Ui(route) => route.name(),
            Endpoint::Upstream => "upstream",
        }
    }
}

fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

pub fn route(method: &str, path: &str, query: Option<&str>) -> Result<Endpoint, EdgeError> {
    if path == "/healthz" {
        return match method {
            "GET" | "HEAD" => Ok(Endpoint::Health),
            _ => Err(not_allowed(method, "GET, HEAD")),
        };
    }
    if path == "/metrics" {
        return match method {
            "GET" => Ok(Endpoint::Metrics),
            _ => Err(not_allowed(method, "GET")),
        };
    }
    if path.starts_with(CLUSTER_PREFIX) {
        return route_cluster(method, path, query);
    }
    if path.starts_with(ADMIN_PREFIX) {
        return route_admin(method, path, query).map(Endpoint::Admin);
    }
    // Browsers ask every site for its icon; a plain GET of it is ours, not a
    // ListObjects of an S3 bucket named `favicon.ico` (any query still goes upstream).
    if path == "/favicon.ico" && query.is_none() && matches!(method, "GET" | "HEAD") {
        return Ok(Endpoint::Ui(UiRoute::Favicon));
    }
    if path == "/ui" || path.starts_with(UI_PREFIX) {
        return Ok(Endpoint::Ui(route_ui(method, path, query)));
    }
    if path.starts_with(TF_OUTPUTS_PREFIX) || path.starts_with(TF_PREFIX) {
        return route_tf(method, path, query);
    }
    Ok(Endpoint::Upstream)
}

/// The Terraform backend's routes, found in [`ROUTES`] as every other surface's are:
/// a path or method the table does not list is never answered as a backend action.
fn route_tf(method: &str, path: &str, query: Option<&str>) -> Result<Endpoint, EdgeError> {
    let outputs = path.starts_with(TF_OUTPUTS_PREFIX);
    let Some((route, values)) = lookup(Surface::Tf, method, path) else {
        return Err(Error::NotFound(if outputs {
            "no such route; the outputs address is /api/v1/tf/outputs/<workspace>".into()
        } else {
            "no such route; the state address is /api/v1/tf/state/<workspace>".into()
        })
        .into());
    };
    // The backend's name check has always come first (before the method): a name
    // reveals nothing.
    let workspace = WorkspaceName::parse(at(&values, 0)).map_err(Error::from)?;
    let allowed = tf_methods(route.path);
    if route.method != method {
        return Err(not_allowed(method, allowed));
    }
    let action = match (route.path, route.method) {
        ("/api/v1/tf/outputs/{ws}", "GET") => TfAction::Outputs,
        ("/api/v1/tf/state/{ws}", "GET") => TfAction::Get,
        ("/api/v1/tf/state/{ws}", "POST") => TfAction::Write {
            lock_id: query_param(query, "ID").filter(|id| !id.is_empty()),
        },
        ("/api/v1/tf/state/{ws}", "LOCK") => TfAction::Lock,
        ("/api/v1/tf/state/{ws}", "UNLOCK") => TfAction::Unlock,
        ("/api/v1/tf/state/{ws}", "DELETE") => TfAction::Delete,
        // The GitLab/Gitea convention for proxies that drop WebDAV verbs.
        ("/api/v1/tf/state/{ws}/lock", "POST" | "LOCK") => TfAction::Lock,
        ("/api/v1/tf/state/{ws}/lock", "DELETE" | "UNLOCK") => TfAction::Unlock,
        // A route listed without an action here (`every_listed_route_routes` fails).
        _ => return Err(not_allowed(method, allowed)),
    };
    Ok(Endpoint::Tf { workspace, action })
}

/// The methods a backend path template accepts, as a 405 names them (held to the
/// table by `tf_methods_are_the_tables`).
fn tf_methods(template: &str) -> &'static str {
    match template {
        "/api/v1/tf/state/{ws}" => "GET, POST, LOCK, UNLOCK, DELETE",
        "/api/v1/tf/state/{ws}/lock" => "POST, DELETE, LOCK, UNLOCK",
        _ => "GET",
    }
}

/// `{id}/tfstate`, `{id}/lock`, `{id}/lock/heartbeat` under `/v1/clusters/`.
fn route_cluster(method: &str, path: &str, query: Option<&str>) -> Result<Endpoint, EdgeError> {
    let Some((route, values)) = lookup(Surface::Cluster, method, path) else {
        return Err(Error::NotFound(
            "no such route; cluster routes are /v1/clusters/<id>/tfstate, /v1/clusters/<id>/lock and /v1/clusters/<id>/lock/heartbeat".into(),
        ).into());
    };
    let action = match (route.path, method) {
        ("/v1/clusters/{id}/tfstate", "GET") => ClusterAction::GetState,
        ("/v1/clusters/{id}/tfstate", "PUT") => ClusterAction::PutState,
        ("/v1/clusters/{id}/tfstate", _) => return Err(not_allowed(method, "GET, PUT")),
        ("/v1/clusters/{id}/lock", "POST") => ClusterAction::Lock,
        ("/v1/clusters/{id}/lock", "DELETE") => ClusterAction::Unlock {
            force: match query_param(query, "force").as_deref() {
                None | Some("" | "0" | "false") => false,
                Some("1" | "true") => true,
                Some(_) => {
                    return Err(Error::Invalid(
                        "force must be 1 (or true) to break another admin's lock".into(),
                    )
                    .into())
                }
            },
        },
        ("/v1/clusters/{id}/lock", _) => return Err(not_allowed(method, "POST, DELETE")),
        ("/v1/clusters/{id}/lock/heartbeat", "POST") => ClusterAction::Heartbeat,
        _ => return Err(not_allowed(method, "POST")),
    };
    Ok(Endpoint::Cluster {
        id: ClusterId::parse(at(&values, 0)),
        action,
    })
}

fn no_admin_route() -> EdgeError {
    Error::NotFound("no such admin route; see docs/admin-api.md".into()).into()
}

/// The admin routes (see [`AdminAction`]): the route by its path and method (404,
/// 405 before authentication: routes are public knowledge), its values parsed.
fn route_admin(
    method: &str,
    path: &str,
    query: Option<&str>,
) -> Result<Parsed<AdminAction>, EdgeError> {
    let Some((route, values)) = lookup(Surface::Admin, method, path) else {
        return Err(no_admin_route());
    };
    if route.method != method {
        return Err(not_allowed(method, route.method));
    }
    admin_action(route, &values, query).ok_or_else(no_admin_route)
}

/// The action of an admin route of [`ROUTES`]; `None` for a route it does not know (a
/// test holds every listed route to one).
fn admin_action(route: &Route, v: &[&str], query: Option<&str>) -> Option<Parsed<AdminAction>> {
    use AdminAction as Do;
    let q = |name| query_param(query, name);
    let ws = |i| WorkspaceName::parse(at(v, i));
    let count = |name, max| params::count(name, q(name).as_deref(), max);
    let required = |name| params::required(name, q(name).as_deref());
    let run = || RunId::parse(at(v, 0));
    let build = || -> Parsed<Option<AdminAction>> {
        Ok(Some(match (route.method, route.path) {
            ("GET", "/api/v1/admin/whoami") => Do::WhoAmI,
            ("GET", "/api/v1/admin/workspaces") => Do::Workspaces,
            ("GET", "/api/v1/admin/clusters") => Do::Clusters,
            ("GET", "/api/v1/admin/search") => Do::Search { q: q("q") },
            ("GET", "/api/v1/admin/audit") => Do::Audit {
                scope: q("scope"),
                event: q("event"),
                since: q("since"),
                until: q("until"),
                limit: count("limit", crate::operator::MAX_AUDIT_LIMIT)?,
            },
            ("GET", "/api/v1/admin/freezes") => Do::Freezes,
            ("GET", "/api/v1/admin/workspaces/{ws}") => Do::Workspace { workspace: ws(0)? },
            ("GET", "/api/v1/admin/workspaces/{ws}/versions") => Do::Versions {
                workspace: ws(0)?,
                limit: count("limit", u32::MAX)?,
            },
            ("GET", "/api/v1/admin/workspaces/{ws}/timeline") => Do::Timeline {
                workspace: ws(0)?,
                address: q("address"),
                limit: count("limit", u32::MAX)?,
            },
            ("GET", "/api/v1/admin/workspaces/{ws}/versions/{version}") => Do::Version {
                workspace: ws(0)?,
                version: VersionRef::parse(at(v, 1))?,
                masked: params::flag("masked", q("masked").as_deref())?,
            },
            ("GET", "/api/v1/admin/workspaces/{ws}/diff") => Do::Diff {
                workspace: ws(0)?,
                from: required("from")?,
                to: required("to")?,
            },
            ("GET", "/api/v1/admin/workspaces/{ws}/rollback") => Do::RollbackPreview {
                workspace: ws(0)?,
                to: required("to")?,
            },
            ("POST", "/api/v1/admin/workspaces/{ws}/rollback") => {
                Do::Rollback { workspace: ws(0)? }
            }
            ("POST", "/api/v1/admin/workspaces/{ws}/unlock") => Do::Unlock { workspace: ws(0)? },
            ("POST", "/api/v1/admin/workspaces/{ws}/restore") => Do::Restore { workspace: ws(0)? },
            ("POST", "/api/v1/admin/workspaces/{ws}/allow-write") => {
                Do::AllowWrite { workspace: ws(0)? }
            }
            ("POST", "/api/v1/admin/workspaces/{ws}/freeze") => Do::Freeze { workspace: ws(0)? },
            ("POST", "/api/v1/admin/workspaces/{ws}/unfreeze") => {
                Do::Unfreeze { workspace: ws(0)? }
            }
            ("POST", "/api/v1/admin/workspaces/{ws}/move/{to}") => Do::Move {
                workspace: ws(0)?,
                to: ws(1)?,
            },
            ("POST", "/api/v1/admin/workspaces/{ws}/credential/rotate") => {
                Do::RotateCredential { workspace: ws(0)? }
            }
            ("GET", "/api/v1/admin/workspaces/{ws}/consumers") => {
                Do::Consumers { workspace: ws(0)? }
            }
            ("PUT", "/api/v1/admin/workspaces/{ws}/consumers") => {
                Do::SetConsumers { workspace: ws(0)? }
            }
            ("GET", "/api/v1/admin/workspace-tokens") => Do::WorkspaceTokens,
            ("POST", "/api/v1/admin/workspace-tokens") => Do::CreateWorkspaceToken,
            ("POST", "/api/v1/admin/workspace-tokens/{token}/revoke") => Do::RevokeWorkspaceToken {
                token: params::token_ref(at(v, 0))?,
            },
            ("GET", "/api/v1/admin/drift") => Do::Drift {
                workspace: params::workspace_filter(q("workspace").as_deref())?,
                limit: count("limit", crate::drift::MAX_LIST)?,
            },
            ("GET", "/api/v1/admin/drift/{run}") => Do::DriftRun { run: run()? },
            ("POST", "/api/v1/admin/drift/{ws}/run") => Do::DriftCheck { workspace: ws(0)? },
            ("POST", "/api/v1/admin/drift/{run}/apply") => Do::DriftApply { run: run()? },
            ("GET", "/api/v1/admin/keys") => Do::Keys,
            ("POST", "/api/v1/admin/keys/rotate") => Do::RotateKey,
            ("POST", "/api/v1/admin/keys/retire") => Do::RetireKey,
            _ => return Ok(None),
        }))
    };
    build().transpose()
}

/// The web UI's routes (see [`UiRoute`]): a path that is no page is [`UiRoute::NotFound`],
/// a wrong method [`UiRoute::NotAllowed`] (or, for a GET of a form,
/// [`UiRoute::PostOnly`]), a value that does not parse [`UiRoute::Invalid`]; all
/// answered after the session check, so none reveals anything.
fn route_ui(method: &str, path: &str, query: Option<&str>) -> UiRoute {
    let Some((route, values)) = lookup(Surface::Ui, method, path) else {
        return UiRoute::NotFound;
    };
    let parsed = match ui_route(route, &values, query) {
        None => return UiRoute::NotFound,
        Some(parsed) => parsed,
    };
    if route.method != method {
        if route.method == "POST" && matches!(method, "GET" | "HEAD") {
            return match parsed {
                Ok(form) => match form_page(&form) {
                    Some(page) => UiRoute::PostOnly {
                        page: Box::new(page),
                    },
                    None => UiRoute::NotAllowed {
                        allowed: route.method,
                    },
                },
                Err(bad) => UiRoute::Invalid(bad),
            };
        }
        return UiRoute::NotAllowed {
            allowed: route.method,
        };
    }
    parsed.unwrap_or_else(UiRoute::Invalid)
}

/// The page or form of a UI route of [`ROUTES`]; `None` for a route it does not know
/// (a test holds every listed route to one).
fn ui_route(route: &Route, v: &[&str], query: Option<&str>) -> Option<Parsed<UiRoute>> {
    use UiRoute as Ui;
    let q = |name| query_param(query, name);
    let ws = |i| WorkspaceName::parse(at(v, i));
    let number = |name| params::number(name, q(name).as_deref());
    let required = |name| params::required(name, q(name).as_deref());
    let version = || params::positive("version", at(v, 1));
    let run = || RunId::parse(at(v, 0));
    let build = || -> Parsed<Option<UiRoute>> {
        Ok(Some(match (route.method, route.path) {
            ("GET", "/favicon.ico") | ("HEAD", "/favicon.ico") => Ui::Favicon,
            ("GET", "/ui/static/app.css") => Ui::Stylesheet,
            ("POST", "/ui/login") => Ui::Login,
            ("GET", "/ui/login") => Ui::LoginForm,
            ("GET", "/ui/login/oidc") => Ui::SsoStart,
            ("GET", "/ui/login/oidc/callback") => Ui::SsoCallback {
                state: q("state"),
                code: q("code"),
                error: q("error"),
                iss: q("iss"),
            },
            ("POST", "/ui/logout") => Ui::Logout,
            ("GET", "/ui" | "/ui/" | "/ui/workspaces") => Ui::Workspaces { filter: q("q") },
            ("GET", "/ui/audit") => Ui::Audit {
                scope: q("scope"),
                event: q("event"),
                since: q("since"),
                until: q("until"),
                logins: q("logins"),
                before: number("before")?,
            },
            ("GET", "/ui/clusters") => Ui::Clusters,
            ("GET", "/ui/workspace-tokens") => Ui::WorkspaceTokens {
                revoked: q("token_revoked").as_deref() == Some("1"),
            },
            ("GET", "/ui/keys") => Ui::Keys,
            ("GET", "/ui/search") => Ui::Search { q: q("q") },
            ("GET", "/ui/drift") => Ui::Drift {
                workspace: params::workspace_filter(q("workspace").as_deref())?,
                limit: params::count("limit", q("limit").as_deref(), crate::drift::MAX_LIST)?,
            },
            ("GET", "/ui/drift/{run}") => Ui::DriftRun { run: run()? },
            ("POST", "/ui/drift/{ws}/run") => Ui::DriftCheck { workspace: ws(0)? },
            ("POST", "/ui/drift/{run}/apply") => Ui::DriftApply { run: run()? },
            ("GET", "/ui/workspaces/{ws}") => Ui::Workspace {
                workspace: ws(0)?,
                page: number("page")?,
                // Reports of a finished action: a value that does not parse shows none.
                rolled_back: number("rolled_back").ok().flatten(),
                unlocked: match q("unlocked").as_deref() {
                    Some("1") => Some(true),
                    Some("0") => Some(false),
                    _ => None,
                },
                write_allowed: q("write_allowed").as_deref() == Some("1"),
            },
            ("GET", "/ui/workspaces/{ws}/versions/{version}") => Ui::Version {
                workspace: ws(0)?,
                version: version()?,
                reveal: q("reveal"),
            },
            ("POST", "/ui/workspaces/{ws}/versions/{version}/reveal") => Ui::Reveal {
                workspace: ws(0)?,
                version: version()?,
            },
            ("POST", "/ui/workspaces/{ws}/versions/{version}/download") => Ui::Download {
                workspace: ws(0)?,
                version: version()?,
            },
            ("GET", "/ui/workspaces/{ws}/diff") => Ui::Diff {
                workspace: ws(0)?,
                from: required("from")?,
                to: required("to")?,
            },
            ("GET", "/ui/workspaces/{ws}/rollback") => Ui::RollbackPreview {
                workspace: ws(0)?,
                to: required("to")?,
            },
            ("POST", "/ui/workspaces/{ws}/rollback") => Ui::Rollback { workspace: ws(0)? },
            ("POST", "/ui/workspaces/{ws}/unlock") => Ui::Unlock { workspace: ws(0)? },
            ("POST", "/ui/workspaces/{ws}/allow-write") => Ui::AllowWrite { workspace: ws(0)? },
            ("POST", "/ui/workspaces/{ws}/freeze") => Ui::Freeze { workspace: ws(0)? },
            ("POST", "/ui/workspaces/{ws}/unfreeze") => Ui::Unfreeze { workspace: ws(0)? },
            ("POST", "/ui/workspace-tokens/{token}/revoke") => Ui::RevokeWorkspaceToken {
                token: params::token_ref(at(v, 0))?,
            },
            _ => return Ok(None),
        }))
    };
    build().transpose()
}

/// The page a form route's form is on (where a GET of the form's URL is sent).
fn form_page(form: &UiRoute) -> Option<UiRoute> {
    let workspace_page = |w: &WorkspaceName| UiRoute::Workspace {
        workspace: w.clone(),
        page: None,
        rolled_back: None,
        unlocked: None,
        write_allowed: false,
    };
    Some(match form {
        UiRoute::Logout => UiRoute::Workspaces { filter: None },
        UiRoute::Reveal { workspace, version } | UiRoute::Download { workspace, version } => {
            UiRoute::Version {
                workspace: workspace.clone(),
                version: *version,
                reveal: None,
            }
        }
        UiRoute::Rollback { workspace }
        | UiRoute::Unlock { workspace }
        | UiRoute::AllowWrite { workspace } => workspace_page(workspace),
        UiRoute::DriftCheck { workspace } => UiRoute::Drift {
            workspace: Some(workspace.clone()),
            limit: None,
        },
        UiRoute::DriftApply { run } => UiRoute::DriftRun { run: *run },
        _ => return None,
    })
}

fn not_allowed(method: &str, allowed: &'static str) -> EdgeError {
    EdgeError::MethodNotAllowed {
        method: method.chars().take(32).collect(),
        allowed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::error::HttpError;

    fn tf(ws: &str, action: TfAction) -> Endpoint {
        Endpoint::Tf {
            workspace: ws.into(),
            action,
        }
    }

    #[test]
    fn routes() {
        let table: Vec<(&str, &str, Option<&str>, Endpoint)> = vec![
            ("GET", "/healthz", None, Endpoint::Health),
            ("GET", "/metrics", None, Endpoint::Metrics),
            (
                "GET",
                "/api/v1/tf/state/prod",
                None,
                tf("prod", TfAction::Get),
            ),
            (
                "POST",
                "/api/v1/tf/state/prod",
                None,
                tf("prod", TfAction::Write { lock_id: None }),
            ),
            (
                "POST",
                "/api/v1/tf/state/prod",
                Some("ID=a%2Db&x=1"),
                tf(
                    "prod",
                    TfAction::Write {
                        lock_id: Some("a-b".into()),
                    },
                ),
            ),
            (
                "POST",
                "/api/v1/tf/state/prod",
                Some("ID="),
                tf("prod", TfAction::Write { lock_id: None }),
            ),
            (
                "LOCK",
                "/api/v1/tf/state/prod",
                None,
                tf("prod", TfAction::Lock),
            ),
            (
                "UNLOCK",
                "/api/v1/tf/state/prod",
                None,
                tf("prod", TfAction::Unlock),
            ),
            (
                "DELETE",
                "/api/v1/tf/state/prod",
                None,
                tf("prod", TfAction::Delete),
            ),
            (
                "POST",
                "/api/v1/tf/state/prod/lock",
                None,
                tf("prod", TfAction::Lock),
            ),
            (
                "DELETE",
                "/api/v1/tf/state/prod/lock",
                None,
                tf("prod", TfAction::Unlock),
            ),
            (
                "GET",
                "/api/v1/tf/outputs/prod",
                None,
                tf("prod", TfAction::Outputs),
            ),
            (
                "LOCK",
                "/api/v1/tf/state/my_ws.v2-x/lock",
                None,
                tf("my_ws.v2-x", TfAction::Lock),
            ),
            ("GET", "/bucket/key", None, Endpoint::Upstream),
            ("PUT", "/", None, Endpoint::Upstream),
        ];
        for (method, path, query, expected) in table {
            assert_eq!(
                route(method, path, query).unwrap(),
                expected,
                "{method} {path}"
            );
        }
    }

    #[test]
    fn cluster_routes() {
        let id = "3f2b8c1e-8d4a-4c55-9a53-0c1d2e3f4a5b";
        let cluster = |id: &str, action| Endpoint::Cluster {
            id: id.into(),
            action,
        };
        let table: Vec<(&str, String, Option<&str>, Endpoint)> = vec![
            (
                "GET",
                format!("/v1/clusters/{id}/tfstate"),
                None,
                cluster(id, ClusterAction::GetState),
            ),
            (
                "PUT",
                format!("/v1/clusters/{id}/tfstate"),
                None,
                cluster(id, ClusterAction::PutState),
            ),
            (
                "POST",
                format!("/v1/clusters/{id}/lock"),
                None,
                cluster(id, ClusterAction::Lock),
            ),
            (
                "POST",
                format!("/v1/clusters/{id}/lock/heartbeat"),
                None,
                cluster(id, ClusterAction::Heartbeat),
            ),
            (
                "DELETE",
                format!("/v1/clusters/{id}/lock"),
                None,
                cluster(id, ClusterAction::Unlock { force: false }),
            ),
            (
                "DELETE",
                format!("/v1/clusters/{id}/lock"),
                Some("force=1"),
                cluster(id, ClusterAction::Unlock { force: true }),
            ),
            (
                "DELETE",
                format!("/v1/clusters/{id}/lock"),
                Some("force=true&x=y"),
                cluster(id, ClusterAction::Unlock { force: true }),
            ),
            (
                "DELETE",
                format!("/v1/clusters/{id}/lock"),
                Some("force=0"),
                cluster(id, ClusterAction::Unlock { force: false }),
            ),
            // Ids are not judged here: a non-UUID answers 404 only after authentication.
            (
                "GET",
                "/v1/clusters/not-a-uuid/tfstate".into(),
                None,
                cluster("not-a-uuid", ClusterAction::GetState),
            ),
            (
                "GET",
                "/v1/clusters//tfstate".into(),
                None,
                cluster("", ClusterAction::GetState),
            ),
            ("GET", "/v1/clusters".into(), None, Endpoint::Upstream),
        ];
        for (method, path, query, expected) in table {
            assert_eq!(
                route(method, &path, query).unwrap(),
                expected,
                "{method} {path}"
            );
        }
        let rejected: Vec<(&str, String, Option<&str>, u16)> = vec![
            ("POST", format!("/v1/clusters/{id}/tfstate"), None, 405),
            ("DELETE", format!("/v1/clusters/{id}/tfstate"), None, 405),
            ("GET", format!("/v1/clusters/{id}/lock"), None, 405),
            ("PUT", format!("/v1/clusters/{id}/lock"), None, 405),
            (
                "GET",
                format!("/v1/clusters/{id}/lock/heartbeat"),
                None,
                405,
            ),
            (
                "DELETE",
                format!("/v1/clusters/{id}/lock"),
                Some("force=yes"),
                400,
            ),
            ("GET", format!("/v1/clusters/{id}"), None, 404),
            ("GET", format!("/v1/clusters/{id}/"), None, 404),
            ("GET", format!("/v1/clusters/{id}/tfstate/x"), None, 404),
            ("POST", format!("/v1/clusters/{id}/lock/x"), None, 404),
            ("GET", "/v1/clusters/".into(), None, 404),
        ];
        for (method, path, query, status) in rejected {
            let err = route(method, &path, query).unwrap_err();
            assert_eq!(err.http_status(), status, "{method} {path}: {err}");
        }
    }

    #[test]
    fn rejections() {
        let long = format!("/api/v1/tf/state/{}", "a".repeat(1024));
        let table: Vec<(&str, &str, u16)> = vec![
            ("GET", "/api/v1/tf/state/", 400),
            ("GET", "/api/v1/tf/state/..", 400),
            ("GET", "/api/v1/tf/state/%2e%2e", 400),
            ("GET", "/api/v1/tf/state/a%2Fb", 400),
            ("GET", "/api/v1/tf/state/.hidden", 400),
            ("GET", "/api/v1/tf/state/a b", 400),
            ("GET", "/api/v1/tf/state/a\u{1}b", 400),
            ("GET", "/api/v1/tf/state/ü", 400),
            ("GET", &long, 400),
            ("GET", "/api/v1/tf/state/a/b", 404),
            ("GET", "/api/v1/tf/state/a/lock/x", 404),
            ("PUT", "/api/v1/tf/state/a", 405),
            ("PATCH", "/api/v1/tf/state/a", 405),
            ("GET", "/api/v1/tf/state/a/lock", 405),
            ("GET", "/api/v1/tf/outputs/", 400),
            ("GET", "/api/v1/tf/outputs/..", 400),
            ("GET", "/api/v1/tf/outputs/a/b", 404),
            ("POST", "/api/v1/tf/outputs/a", 405),
            ("LOCK", "/api/v1/tf/outputs/a", 405),
            ("UNLOCK", "/api/v1/tf/outputs/a", 405),
            ("DELETE", "/api/v1/tf/outputs/a", 405),
            ("PUT", "/api/v1/tf/outputs/a", 405),
            ("POST", "/healthz", 405),
        ];
        for (method, path, status) in table {
            let err = route(method, path, None).unwrap_err();
            assert_eq!(err.http_status(), status, "{method} {path}: {err}");
        }
    }

    #[test]
    fn admin_routes() {
        let admin = |a| Endpoint::Admin(Ok(a));
        let w = || WorkspaceName::from("prod");
        let table: Vec<(&str, &str, Option<&str>, Endpoint)> = vec![
            (
                "GET",
                "/api/v1/admin/whoami",
                None,
                admin(AdminAction::WhoAmI),
            ),
            (
                "GET",
                "/api/v1/admin/workspaces",
                None,
                admin(AdminAction::Workspaces),
            ),
            (
                "GET",
                "/api/v1/admin/clusters",
                None,
                admin(AdminAction::Clusters),
            ),
            (
                "GET",
                "/api/v1/admin/audit",
                Some("scope=tf%2Fprod&limit=5&since=2026-03-01"),
                admin(AdminAction::Audit {
                    scope: Some("tf/prod".into()),
                    event: None,
                    since: Some("2026-03-01".into()),
                    until: None,
                    limit: Some(5),
                }),
            ),
            (
                "GET",
                "/api/v1/admin/workspaces/prod",
                None,
                admin(AdminAction::Workspace { workspace: w() }),
            ),
            (
                "GET",
                "/api/v1/admin/workspaces/prod/versions",
                Some("limit=2"),
                admin(AdminAction::Versions {
                    workspace: w(),
                    limit: Some(2),
                }),
            ),
            (
                "GET",
                "/api/v1/admin/workspaces/prod/versions/latest",
                Some("masked=1"),
                admin(AdminAction::Version {
                    workspace: w(),
                    version: "latest".into(),
                    masked: true,
                }),
            ),
            (
                "GET",
                "/api/v1/admin/workspaces/prod/diff",
                Some("from=1&to=2"),
                admin(AdminAction::Diff {
                    workspace: w(),
                    from: 1,
                    to: 2,
                }),
            ),
            (
                "POST",
                "/api/v1/admin/workspaces/prod/rollback",
                None,
                admin(AdminAction::Rollback { workspace: w() }),
            ),
            (
                "GET",
                "/api/v1/admin/workspaces/prod/rollback",
                Some("to=2"),
                admin(AdminAction::RollbackPreview {
                    workspace: w(),
                    to: 2,
                }),
            ),
            (
                "POST",
                "/api/v1/admin/workspaces/prod/allow-write",
                None,
                admin(AdminAction::AllowWrite { workspace: w() }),
            ),
            (
                "POST",
                "/api/v1/admin/workspaces/prod/freeze",
                None,
                admin(AdminAction::Freeze { workspace: w() }),
            ),
            (
                "POST",
                "/api/v1/admin/workspaces/prod/unfreeze",
                None,
                admin(AdminAction::Unfreeze { workspace: w() }),
            ),
            (
                "GET",
                "/api/v1/admin/freezes",
                None,
                admin(AdminAction::Freezes),
            ),
            (
                "POST",
                "/api/v1/admin/workspaces/prod/move/dev",
                None,
                admin(AdminAction::Move {
                    workspace: w(),
                    to: "dev".into(),
                }),
            ),
            (
                "GET",
                "/api/v1/admin/search",
                Some("q=module.db"),
                admin(AdminAction::Search {
                    q: Some("module.db".into()),
                }),
            ),
            (
                "POST",
                "/api/v1/admin/workspaces/prod/unlock",
                None,
                admin(AdminAction::Unlock { workspace: w() }),
            ),
            (
                "POST",
                "/api/v1/admin/workspaces/prod/restore",
                None,
                admin(AdminAction::Restore { workspace: w() }),
            ),
            (
                "GET",
                "/api/v1/admin/drift",
                Some("workspace=prod&limit=5"),
                admin(AdminAction::Drift {
                    workspace: Some("prod".into()),
                    limit: Some(5),
                }),
            ),
            (
                "GET",
                "/api/v1/admin/drift/12",
                None,
                admin(AdminAction::DriftRun { run: "12".into() }),
            ),
            (
                "POST",
                "/api/v1/admin/drift/prod/run",
                None,
                admin(AdminAction::DriftCheck { workspace: w() }),
            ),
            (
                "POST",
                "/api/v1/admin/drift/12/apply",
                None,
                admin(AdminAction::DriftApply { run: "12".into() }),
            ),
            ("GET", "/api/v1/admin/keys", None, admin(AdminAction::Keys)),
            (
                "POST",
                "/api/v1/admin/keys/rotate",
                None,
                admin(AdminAction::RotateKey),
            ),
            (
                "POST",
                "/api/v1/admin/keys/retire",
                None,
                admin(AdminAction::RetireKey),
            ),
            // Names are parsed here but answered only after the operator token.
            (
                "GET",
                "/api/v1/admin/workspaces/..",
                None,
                Endpoint::Admin(Err(WorkspaceName::parse("..").unwrap_err())),
            ),
        ];
        for (method, path, query, expected) in table {
            assert_eq!(
                route(method, path, query).unwrap(),
                expected,
                "{method} {path}"
            );
        }
        let rejected: &[(&str, &str, u16)] = &[
            ("POST", "/api/v1/admin/workspaces", 405),
            ("PUT", "/api/v1/admin/workspaces/prod/rollback", 405),
            ("GET", "/api/v1/admin/workspaces/prod/allow-write", 405),
            ("GET", "/api/v1/admin/workspaces/prod/freeze", 405),
            ("GET", "/api/v1/admin/workspaces/prod/move/dev", 405),
            ("POST", "/api/v1/admin/freezes", 405),
            ("POST", "/api/v1/admin/workspaces/prod/move", 404),
            ("POST", "/api/v1/admin/search", 405),
            ("DELETE", "/api/v1/admin/workspaces/prod", 405),
            ("GET", "/api/v1/admin/nope", 404),
            ("GET", "/api/v1/admin/workspaces/prod/versions/1/x", 404),
            ("GET", "/api/v1/admin/", 404),
            ("GET", "/api/v1/admin/drift/prod/run", 405),
            ("POST", "/api/v1/admin/drift/12", 405),
            ("GET", "/api/v1/admin/drift/12/apply", 405),
            ("POST", "/api/v1/admin/keys", 405),
            ("GET", "/api/v1/admin/keys/rotate", 405),
            ("GET", "/api/v1/admin/keys/retire", 405),
            ("DELETE", "/api/v1/admin/keys/retire", 405),
            ("POST", "/api/v1/admin/keys/rewrap", 404),
            ("POST", "/api/v1/admin/keys/reseal", 404),
            ("POST", "/api/v1/admin/keys/retire/1", 404),
        ];
        for (method, path, status) in rejected {
            let err = route(method, path, None).unwrap_err();
            assert_eq!(err.http_status(), *status, "{method} {path}");
        }
    }

    #[test]
    fn ui_routes() {
        let w = || WorkspaceName::from("prod");
        let table: Vec<(&str, &str, Option<&str>, UiRoute)> = vec![
            ("GET", "/ui", None, UiRoute::Workspaces { filter: None }),
            (
                "GET",
                "/ui/",
                Some("q=pr"),
                UiRoute::Workspaces {
                    filter: Some("pr".into()),
                },
            ),
            (
                "GET",
                "/ui/workspaces",
                None,
                UiRoute::Workspaces { filter: None },
            ),
            ("GET", "/ui/static/app.css", None, UiRoute::Stylesheet),
            ("GET", "/ui/login", None, UiRoute::LoginForm),
            ("POST", "/ui/login", None, UiRoute::Login),
            ("GET", "/ui/login/oidc", None, UiRoute::SsoStart),
            (
                "POST",
                "/ui/login/oidc",
                None,
                UiRoute::NotAllowed { allowed: "GET" },
            ),
            (
                "GET",
                "/ui/login/oidc/callback",
                Some("state=s%2B1&code=c&iss=x"),
                UiRoute::SsoCallback {
                    state: Some("s+1".into()),
                    code: Some("c".into()),
                    error: None,
                    iss: Some("x".into()),
                },
            ),
            (
                "POST",
                "/ui/login/oidc/callback",
                Some("state=s&code=c"),
                UiRoute::NotAllowed { allowed: "GET" },
            ),
            ("GET", "/ui/login/oidc/x", None, UiRoute::NotFound),
            ("POST", "/ui/logout", None, UiRoute::Logout),
            (
                "GET",
                "/ui/logout",
                None,
                UiRoute::PostOnly {
                    page: Box::new(UiRoute::Workspaces { filter: None }),
                },
            ),
            (
                "GET",
                "/ui/workspaces/prod",
                Some("page=2&rolled_back=7"),
                UiRoute::Workspace {
                    workspace: w(),
                    page: Some(2),
                    rolled_back: Some(7),
                    unlocked: None,
                    write_allowed: false,
                },
            ),
            (
                "GET",
                "/ui/workspaces/prod/versions/3",
                Some("reveal=1"),
                UiRoute::Version {
                    workspace: w(),
                    version: 3,
                    reveal: Some("1".into()),
                },
            ),
            (
                "POST",
                "/ui/workspaces/prod/versions/3/reveal",
                None,
                UiRoute::Reveal {
                    workspace: w(),
                    version: 3,
                },
            ),
            (
                "GET",
                "/ui/workspaces/prod/versions/3/reveal",
                None,
                UiRoute::PostOnly {
                    page: Box::new(UiRoute::Version {
                        workspace: w(),
                        version: 3,
                        reveal: None,
                    }),
                },
            ),
            (
                "POST",
                "/ui/workspaces/prod/versions/3/download",
                None,
                UiRoute::Download {
                    workspace: w(),
                    version: 3,
                },
            ),
            (
                "GET",
                "/ui/workspaces/prod/versions/3/download",
                None,
                UiRoute::PostOnly {
                    page: Box::new(UiRoute::Version {
                        workspace: w(),
                        version: 3,
                        reveal: None,
                    }),
                },
            ),
            (
                "GET",
                "/ui/search",
                Some("q=aws_instance"),
                UiRoute::Search {
                    q: Some("aws_instance".into()),
                },
            ),
            (
                "GET",
                "/ui/workspaces/prod/diff",
                Some("from=1&to=2"),
                UiRoute::Diff {
                    workspace: w(),
                    from: 1,
                    to: 2,
                },
            ),
            (
                "POST",
                "/ui/workspaces/prod/rollback",
                None,
                UiRoute::Rollback { workspace: w() },
            ),
            (
                "GET",
                "/ui/workspaces/prod/rollback",
                Some("to=2"),
                UiRoute::RollbackPreview {
                    workspace: w(),
                    to: 2,
                },
            ),
            (
                "PUT",
                "/ui/workspaces/prod/rollback",
                None,
                UiRoute::NotAllowed { allowed: "POST" },
            ),
            (
                "POST",
                "/ui/workspaces/prod/unlock",
                None,
                UiRoute::Unlock { workspace: w() },
            ),
            (
                "POST",
                "/ui/workspaces/prod/freeze",
                None,
                UiRoute::Freeze { workspace: w() },
            ),
            (
                "POST",
                "/ui/workspaces/prod/unfreeze",
                None,
                UiRoute::Unfreeze { workspace: w() },
            ),
            (
                "GET",
                "/ui/workspaces/prod/freeze",
                None,
                UiRoute::NotAllowed { allowed: "POST" },
            ),
            (
                "GET",
                "/ui/audit",
                Some("scope=tf%2Fprod&before=9"),
                UiRoute::Audit {
                    scope: Some("tf/prod".into()),
                    event: None,
                    since: None,
                    until: None,
                    logins: None,
                    before: Some(9),
                },
            ),
            ("GET", "/ui/clusters", None, UiRoute::Clusters),
            (
                "GET",
                "/ui/workspace-tokens",
                Some("token_revoked=1"),
                UiRoute::WorkspaceTokens { revoked: true },
            ),
            (
                "GET",
                "/ui/workspace-tokens",
                None,
                UiRoute::WorkspaceTokens { revoked: false },
            ),
            ("GET", "/ui/keys", None, UiRoute::Keys),
            (
                "POST",
                "/ui/keys",
                None,
                UiRoute::NotAllowed { allowed: "GET" },
            ),
            (
                "POST",
                "/ui/clusters",
                None,
                UiRoute::NotAllowed { allowed: "GET" },
            ),
            (
                "GET",
                "/ui/drift",
                Some("workspace=prod&limit=100"),
                UiRoute::Drift {
                    workspace: Some(w()),
                    limit: Some(100),
                },
            ),
            (
                "GET",
                "/ui/drift/12",
                None,
                UiRoute::DriftRun { run: "12".into() },
            ),
            (
                "POST",
                "/ui/drift/prod/run",
                None,
                UiRoute::DriftCheck { workspace: w() },
            ),
            (
                "POST",
                "/ui/drift/12/apply",
                None,
                UiRoute::DriftApply { run: "12".into() },
            ),
            (
                "GET",
                "/ui/drift/12/apply",
                None,
                UiRoute::PostOnly {
                    page: Box::new(UiRoute::DriftRun { run: "12".into() }),
                },
            ),
            (
                "GET",
                "/ui/drift/prod/run",
                None,
                UiRoute::PostOnly {
                    page: Box::new(UiRoute::Drift {
                        workspace: Some(w()),
                        limit: None,
                    }),
                },
            ),
            (
                "POST",
                "/ui/drift/12",
                None,
                UiRoute::NotAllowed { allowed: "GET" },
            ),
            ("GET", "/ui/nope", None, UiRoute::NotFound),
            (
                "HEAD",
                "/ui/workspaces/prod/unlock",
                None,
                UiRoute::PostOnly {
                    page: Box::new(UiRoute::Workspace {
                        workspace: w(),
                        page: None,
                        rolled_back: None,
                        unlocked: None,
                        write_allowed: false,
                    }),
                },
            ),
            ("GET", "/favicon.ico", None, UiRoute::Favicon),
            ("GET", "/ui/workspaces/prod/x", None, UiRoute::NotFound),
            ("GET", "/ui/drift/12/x", None, UiRoute::NotFound),
        ];
        for (method, path, query, expected) in table {
            assert_eq!(
                route(method, path, query).unwrap(),
                Endpoint::Ui(expected),
                "{method} {path}"
            );
        }
        // Not the UI: a bucket cannot be called "ui", but "uix" can.
        assert_eq!(route("GET", "/uix/key", None).unwrap(), Endpoint::Upstream);
        // Only a plain GET/HEAD of the icon is ours; the bucket's listing, its keys and
        // writes go upstream as before.
        for (method, path, query) in [
            ("GET", "/favicon.ico", Some("list-type=2")),
            ("PUT", "/favicon.ico", None),
            ("GET", "/favicon.ico/key", None),
        ] {
            assert_eq!(
                route(method, path, query).unwrap(),
                Endpoint::Upstream,
                "{method} {path}"
            );
        }
    }

    /// A sample value for each `{…}` of a template.
    fn sample(name: &str) -> String {
        match name {
            "ws" | "to" | "token" => "prod".into(),
            "run" | "version" => "12".into(),
            "from" => "1".into(),
            "id" => "3f2b8c1e-8d4a-4c55-9a53-0c1d2e3f4a5b".into(),
            other => panic!("no sample for {{{other}}}"),
        }
    }

    /// Every route of the table is routed, to its own surface and with its method
    /// accepted, and none is shadowed by another one.
    #[test]
    fn every_listed_route_routes() {
        let mut names = std::collections::HashSet::new();
        for route in ROUTES {
            let path = route.fill(sample);
            let query = route.fill_query(sample);
            let endpoint = super::route(route.method, &path, query.as_deref())
                .unwrap_or_else(|e| panic!("{route:?}: {e}"));
            let surface = match &endpoint {
                Endpoint::Health => Surface::Health,
                Endpoint::Metrics => Surface::Metrics,
                Endpoint::Tf { .. } => Surface::Tf,
                Endpoint::Cluster { .. } => Surface::Cluster,
                Endpoint::Admin(Ok(_)) => Surface::Admin,
                Endpoint::Ui(
                    UiRoute::NotFound
                    | UiRoute::NotAllowed { .. }
                    | UiRoute::Invalid(_)
                    | UiRoute::PostOnly { .. },
                ) => panic!("{route:?}: {endpoint:?}"),
                Endpoint::Ui(_) => Surface::Ui,
                Endpoint::Admin(Err(_)) | Endpoint::Upstream => {
                    panic!("{route:?}: {endpoint:?}")
                }
            };
            assert_eq!(surface, route.surface, "{route:?}");
            // Each admin and UI route is its own action (the Terraform backend's two
            // lock addresses are one action each).
            if matches!(surface, Surface::Admin | Surface::Ui)
                && !matches!(route.path, "/ui" | "/ui/" | "/favicon.ico")
            {
                assert!(
                    names.insert(endpoint.name()),
                    "{route:?} routes to {} as another route does",
                    endpoint.name()
                );
            }
        }
    }

    /// The Terraform backend, the cluster API, health and metrics are found through the
    /// table (`lookup`), after a prefix: probed with every method and path shape, each
    /// one answered as a route is in the table, so no match beside it can answer more.
    #[test]
    fn the_table_lists_every_backend_and_cluster_route() {
        let methods = [
            "GET", "HEAD", "PUT", "POST", "DELETE", "LOCK", "UNLOCK", "PATCH", "OPTIONS",
        ];
        let id = sample("id");
        let probes = [
            "/api/v1/tf/state/prod".to_string(),
            "/api/v1/tf/state/prod/lock".into(),
            "/api/v1/tf/state/prod/unlock".into(),
            "/api/v1/tf/outputs/prod".into(),
            "/api/v1/tf/outputs/prod/lock".into(),
            format!("/v1/clusters/{id}/tfstate"),
            format!("/v1/clusters/{id}/lock"),
            format!("/v1/clusters/{id}/lock/heartbeat"),
            format!("/v1/clusters/{id}/unlock"),
            format!("/v1/clusters/{id}"),
            "/healthz".into(),
            "/metrics".into(),
        ];
        for path in &probes {
            for method in methods {
                if let Ok(
                    Endpoint::Tf { .. }
                    | Endpoint::Cluster { .. }
                    | Endpoint::Health
                    | Endpoint::Metrics,
                ) = super::route(method, path, None)
                {
                    assert!(
                        ROUTES
                            .iter()
                            .any(|r| r.method == method && r.fill(sample) == *path),
                        "{method} {path} is routed but not listed in ROUTES"
                    );
                }
            }
        }
    }

    /// The methods a backend 405 names are exactly the table's for that path.
    #[test]
    fn tf_methods_are_the_tables() {
        let mut templates: Vec<&str> = ROUTES
            .iter()
            .filter(|r| r.surface == Surface::Tf)
            .map(|r| r.path)
            .collect();
        templates.dedup();
        for template in templates {
            let mut listed: Vec<&str> = ROUTES
                .iter()
                .filter(|r| r.surface == Surface::Tf && r.path == template)
                .map(|r| r.method)
                .collect();
            let mut named: Vec<&str> = tf_methods(template).split(", ").collect();
            listed.sort_unstable();
            named.sort_unstable();
            assert_eq!(named, listed, "{template}");
        }
    }

    /// Every other spelling of a value is refused where it is parsed: a run id, a
    /// version, a name, a count, a flag (finding 1 of the security review: a run id
    /// with a Unicode space before it reached another workspace's run).
    #[test]
    fn values_have_one_spelling() {
        let mutations = |good: &str| {
            vec![
                format!("\u{3000}{good}"),
                format!("{good}\u{3000}"),
                format!("\u{a0}{good}"),
                format!("\u{2003}{good}"),
                format!("{good}\u{85}"),
                format!(" {good}"),
                format!("+{good}"),
                format!("0{good}"),
                format!("{good}\0"),
                format!("%{:02X}{}", good.as_bytes()[0], &good[1..]),
                good.chars()
                    .map(|c| match c {
                        '0'..='9' => char::from_u32(c as u32 - '0' as u32 + 0xFF10).unwrap_or(c),
                        c => c,
                    })
                    .collect(),
                good.repeat(200),
            ]
        };
        for route in ROUTES.iter().filter(|r| r.path.contains('{')) {
            for (placeholder, good) in [
                ("ws", "prod"),
                ("to", "prod"),
                ("token", "prod"),
                ("run", "12"),
                ("version", "12"),
            ] {
                if !route.path.contains(&format!("{{{placeholder}}}")) {
                    continue;
                }
                for bad in mutations(good).into_iter().filter(|bad| bad != good) {
                    let path = route.fill(|name| {
                        if name == placeholder {
                            bad.clone()
                        } else {
                            sample(name)
                        }
                    });
                    let query = route.fill_query(sample);
                    let routed = super::route(route.method, &path, query.as_deref());
                    let refused = match &routed {
                        Err(e) => e.http_status() == 400,
                        Ok(Endpoint::Admin(Err(_))) | Ok(Endpoint::Ui(UiRoute::Invalid(_))) => true,
                        // `0prod` and `prodprod…` are names too (the name rule's own);
                        // numbers have no second spelling.
                        Ok(_) => {
                            matches!(placeholder, "ws" | "to" | "token")
                                && bad == format!("0{good}")
                        }
                    };
                    assert!(refused, "{} {path:?}: {routed:?}", route.method);
                }
            }
        }
        // Query values too.
        for (path, query) in [
            ("/api/v1/admin/workspaces/prod/versions", "limit=%E3%80%805"),
            ("/api/v1/admin/workspaces/prod/versions", "limit=+5"),
            ("/api/v1/admin/workspaces/prod/versions", "limit=05"),
            ("/api/v1/admin/workspaces/prod/diff", "from=1&to=%EF%BC%92"),
            ("/api/v1/admin/workspaces/prod/versions/1", "masked=yes"),
            ("/api/v1/admin/drift", "workspace=%E3%80%80prod"),
            ("/api/v1/admin/drift", "workspace=prod%00"),
            ("/api/v1/admin/drift", "limit=1001"),
        ] {
            assert!(
                matches!(
                    super::route("GET", path, Some(query)),
                    Ok(Endpoint::Admin(Err(_)))
                ),
                "{path}?{query}"
            );
        }
        for (path, query) in [
            ("/ui/drift", "workspace=%C2%A0prod"),
            ("/ui/workspaces/prod/rollback", "to=%202"),
            ("/ui/workspaces/prod", "page=-1"),
        ] {
            assert!(
                matches!(
                    super::route("GET", path, Some(query)),
                    Ok(Endpoint::Ui(UiRoute::Invalid(_)))
                ),
                "{path}?{query}"
            );
        }
    }
}
