//! Parses a request line into a typed [`Endpoint`]. Pure: no I/O, no state.
//!
//! Anything that is not one of stategate's own routes is [`Endpoint::Upstream`]:
//! decided by `pass_through` (forwarded to the S3 store, refused, or 404 when no
//! upstream is configured).

use super::error::EdgeError;
use crate::error::Error;
use crate::names::validate_workspace;

const TF_PREFIX: &str = "/api/v1/tf/state/";
/// The outputs-only state (`tofu::outputs`), for `terraform_remote_state`.
const TF_OUTPUTS_PREFIX: &str = "/api/v1/tf/outputs/";
const CLUSTER_PREFIX: &str = "/v1/clusters/";
const ADMIN_PREFIX: &str = "/api/v1/admin/";
const UI_PREFIX: &str = "/ui/";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Health,
    Metrics,
    Tf {
        workspace: String,
        action: TfAction,
    },
    /// The cluster tfstate & lock API. `id` is the raw path segment: it is checked
    /// (UUID, org) only after authentication, so a bad id answers like a missing one.
    Cluster {
        id: String,
        action: ClusterAction,
    },
    /// The operator API (`docs/admin-api.md`). Values are raw: they are checked only
    /// after the operator token, so the check order is auth, then input, then state.
    Admin(AdminAction),
    /// The operator web UI under `/ui/` (`crate::ui`). Values are raw, judged after the
    /// session like the admin API's are after the token.
    Ui(UiRoute),
    /// Not ours.
    Upstream,
}

/// A route of the admin API under `/api/v1/admin/`, with its raw path and query values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAction {
    /// `GET whoami`
    WhoAmI,
    /// `GET workspaces`
    Workspaces,
    /// `GET workspaces/{ws}`
    Workspace { workspace: String },
    /// `GET workspaces/{ws}/versions[?limit=N]`
    Versions {
        workspace: String,
        limit: Option<String>,
    },
    /// `GET workspaces/{ws}/timeline[?address=A&limit=N]`: which versions changed which
    /// resource addresses, and who wrote them
    Timeline {
        workspace: String,
        address: Option<String>,
        limit: Option<String>,
    },
    /// `GET workspaces/{ws}/versions/{n|latest}[?masked=1]`
    Version {
        workspace: String,
        version: String,
        masked: Option<String>,
    },
    /// `GET workspaces/{ws}/diff?from=A&to=B`
    Diff {
        workspace: String,
        from: Option<String>,
        to: Option<String>,
    },
    /// `GET workspaces/{ws}/rollback?to=N`: what the rollback would change
    RollbackPreview {
        workspace: String,
        to: Option<String>,
    },
    /// `POST workspaces/{ws}/rollback` with `{"to": N[, "from": M]}`
    Rollback { workspace: String },
    /// `POST workspaces/{ws}/unlock` with an optional `{"lock_id": "…"}`
    Unlock { workspace: String },
    /// `POST workspaces/{ws}/restore`
    Restore { workspace: String },
    /// `POST workspaces/{ws}/allow-write` with `{"reason": "…"[, "minutes": N]}`: one
    /// write the write guard would refuse may go through
    AllowWrite { workspace: String },
    /// `POST workspaces/{ws}/freeze` with `{"reason": "…"[, "until": T | "for": "2h"]}`
    Freeze { workspace: String },
    /// `POST workspaces/{ws}/unfreeze`
    Unfreeze { workspace: String },
    /// `GET freezes`: every freeze in force
    Freezes,
    /// `POST workspaces/{src}/move/{dst}` with `{"addresses": ["…", …]}`: move
    /// resources from one workspace's state to another's
    Move { workspace: String, to: String },
    /// `GET audit[?scope=&event=&since=&until=&limit=]`
    Audit {
        scope: Option<String>,
        event: Option<String>,
        since: Option<String>,
        until: Option<String>,
        limit: Option<String>,
    },
    /// `GET clusters`
    Clusters,
    /// `GET search?q=`
    Search { q: Option<String> },
    /// `GET drift[?workspace=&limit=]`: configured checks and recent runs
    Drift {
        workspace: Option<String>,
        limit: Option<String>,
    },
    /// `GET drift/{run}`: one run with its plan output
    DriftRun { run: String },
    /// `POST drift/{ws}/run`: start a check now
    DriftCheck { workspace: String },
    /// `POST drift/{run}/apply`: approve a drifted check's kept plan
    DriftApply { run: String },
    /// `POST workspaces/{ws}/credential/rotate`: a new derived credential
    RotateCredential { workspace: String },
    /// `GET workspaces/{ws}/consumers`
    Consumers { workspace: String },
    /// `PUT workspaces/{ws}/consumers` with `{"consumers": ["app-a", …]}`
    SetConsumers { workspace: String },
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
            | AdminAction::SetConsumers { workspace } => Some(workspace),
            _ => None,
        }
    }
}

/// A page or form of the web UI under `/ui/`, with its raw path and query values.
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
    /// provider's answer
    SsoCallback {
        state: Option<String>,
        code: Option<String>,
        error: Option<String>,
        /// RFC 9207's issuer identification, when the provider sends it.
        iss: Option<String>,
    },
    /// `POST logout` with `csrf`
    Logout,
    /// `GET /ui`, `GET /ui/`, `GET workspaces[?q=]`
    Workspaces { filter: Option<String> },
    /// `GET workspaces/{ws}[?page=N]`; `rolled_back`/`unlocked`/`write_allowed` report
    /// a finished action.
    Workspace {
        workspace: String,
        page: Option<String>,
        rolled_back: Option<String>,
        unlocked: Option<String>,
        write_allowed: Option<String>,
    },
    /// `GET workspaces/{ws}/versions/{n}[?reveal=<ticket>]`: sensitive values masked,
    /// or shown once with a ticket the reveal form's POST redirected with
    /// (`crate::ui::reveal`)
    Version {
        workspace: String,
        version: String,
        reveal: Option<String>,
    },
    /// `POST workspaces/{ws}/versions/{n}/reveal` with `csrf`: unmasked, audited
    Reveal { workspace: String, version: String },
    /// `POST workspaces/{ws}/versions/{n}/download` with `csrf`: the raw state, audited
    Download { workspace: String, version: String },
    /// `GET workspaces/{ws}/diff?from=A&to=B`
    Diff {
        workspace: String,
        from: Option<String>,
        to: Option<String>,
    },
    /// `GET workspaces/{ws}/rollback?to=N`: the diff and the confirmation form
    RollbackPreview {
        workspace: String,
        to: Option<String>,
    },
    /// `POST workspaces/{ws}/rollback` with `csrf`, `to`, `from`, `confirm`
    Rollback { workspace: String },
    /// `POST workspaces/{ws}/unlock` with `csrf`, `lock_id`, `confirm`
    Unlock { workspace: String },
    /// `POST workspaces/{ws}/allow-write` with `csrf`, `reason`, `minutes`, `confirm`:
    /// one write the write guard would refuse may go through
    AllowWrite { workspace: String },
    /// `POST workspaces/{ws}/freeze` with `csrf`, `reason`, `for`, `confirm`
    Freeze { workspace: String },
    /// `POST workspaces/{ws}/unfreeze` with `csrf`
    Unfreeze { workspace: String },
    /// `GET audit[?scope=&event=&since=&until=&logins=&before=]`
    Audit {
        scope: Option<String>,
        event: Option<String>,
        since: Option<String>,
        until: Option<String>,
        /// `1`: show `ui.login*` rows too (hidden by default).
        logins: Option<String>,
        before: Option<String>,
    },
    /// `GET clusters`
    Clusters,
    /// `GET search?q=`
    Search { q: Option<String> },
    /// `GET drift[?workspace=&limit=]`: the configured checks and the newest runs
    Drift {
        workspace: Option<String>,
        limit: Option<String>,
    },
    /// `GET drift/{run}`: one run and its plan text
    DriftRun { run: String },
    /// `POST drift/{ws}/run` with `csrf`: start a check now
    DriftCheck { workspace: String },
    /// `POST drift/{run}/apply` with `csrf`, `confirm`: approve a drifted check's plan
    DriftApply { run: String },
    /// `POST workspace-tokens/{id}/revoke` with `csrf`, `workspace` (the page to return
    /// to), `confirm`: revoke an issued workspace token
    RevokeWorkspaceToken { token: String },
    /// A GET (or HEAD) of a form's URL (a reload, a bookmark, a restored tab): 303 to
    /// the page the form belongs to, never a 405 page.
    PostOnly { page: Box<UiRoute> },
    /// No such page (answered after the session check, so it reveals nothing).
    NotFound,
    /// A page asked for with the wrong method.
    NotAllowed { allowed: &'static str },
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
            UiRoute::RevokeWorkspaceToken { .. } => "ui.revoke_workspace_token",
            UiRoute::NotFound | UiRoute::NotAllowed { .. } => "ui.invalid",
        }
    }

    /// Served without a session (everything else answers 303 to the login page).
    pub fn is_public(&self) -> bool {
        matches!(
            self,
            UiRoute::Stylesheet
                | UiRoute::Favicon
                | UiRoute::LoginForm
                | UiRoute::Login
                | UiRoute::SsoStart
                | UiRoute::SsoCallback { .. }
        )
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
            | UiRoute::DriftCheck { workspace } => Some(workspace),
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
            Endpoint::Admin(action) => action.name(),
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
    if let Some(rest) = path.strip_prefix(CLUSTER_PREFIX) {
        return route_cluster(method, rest, query);
    }
    if let Some(rest) = path.strip_prefix(ADMIN_PREFIX) {
        return route_admin(method, rest, query).map(Endpoint::Admin);
    }
    // Browsers ask every site for its icon; a plain GET of it is ours, not a
    // ListObjects of an S3 bucket named `favicon.ico` (any query still goes upstream).
    if path == "/favicon.ico" && query.is_none() && matches!(method, "GET" | "HEAD") {
        return Ok(Endpoint::Ui(UiRoute::Favicon));
    }
    if path == "/ui" {
        return Ok(Endpoint::Ui(route_ui(method, "", query)));
    }
    if let Some(rest) = path.strip_prefix(UI_PREFIX) {
        return Ok(Endpoint::Ui(route_ui(method, rest, query)));
    }
    if let Some(workspace) = path.strip_prefix(TF_OUTPUTS_PREFIX) {
        if workspace.contains('/') {
            return Err(Error::NotFound(
                "no such route; the outputs address is /api/v1/tf/outputs/<workspace>".into(),
            )
            .into());
        }
        validate_workspace(workspace)?;
        if method != "GET" {
            return Err(not_allowed(method, "GET"));
        }
        return Ok(Endpoint::Tf {
            workspace: workspace.to_string(),
            action: TfAction::Outputs,
        });
    }
    let Some(rest) = path.strip_prefix(TF_PREFIX) else {
        return Ok(Endpoint::Upstream);
    };
    let (workspace, is_lock_path) = match rest.split_once('/') {
        None => (rest, false),
        Some((ws, "lock")) => (ws, true),
        Some(_) => {
            return Err(Error::NotFound(
                "no such route; the state address is /api/v1/tf/state/<workspace>".into(),
            )
            .into())
        }
    };
    validate_workspace(workspace)?;
    let action = match (is_lock_path, method) {
        (false, "GET") => TfAction::Get,
        (false, "POST") => TfAction::Write {
            lock_id: query_param(query, "ID").filter(|id| !id.is_empty()),
        },
        (false, "LOCK") => TfAction::Lock,
        (false, "UNLOCK") => TfAction::Unlock,
        (false, "DELETE") => TfAction::Delete,
        (false, _) => return Err(not_allowed(method, "GET, POST, LOCK, UNLOCK, DELETE")),
        // The GitLab/Gitea convention for proxies that drop WebDAV verbs.
        (true, "POST" | "LOCK") => TfAction::Lock,
        (true, "DELETE" | "UNLOCK") => TfAction::Unlock,
        (true, _) => return Err(not_allowed(method, "POST, DELETE, LOCK, UNLOCK")),
    };
    Ok(Endpoint::Tf {
        workspace: workspace.to_string(),
        action,
    })
}

/// `{id}/tfstate`, `{id}/lock`, `{id}/lock/heartbeat` under `/v1/clusters/`.
fn route_cluster(method: &str, rest: &str, query: Option<&str>) -> Result<Endpoint, EdgeError> {
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let action = match (tail, method) {
        ("tfstate", "GET") => ClusterAction::GetState,
        ("tfstate", "PUT") => ClusterAction::PutState,
        ("tfstate", _) => return Err(not_allowed(method, "GET, PUT")),
        ("lock", "POST") => ClusterAction::Lock,
        ("lock", "DELETE") => ClusterAction::Unlock {
            force: match query_param(query, "force").as_deref() {
                None | Some("" | "0" | "false") => false,
                Some("1" | "true") => true,
                Some(_) => {
                    return Err(Error::Invalid(
                        "force must be 1 (or true) to break another admin's lock".into(),
                    ).into())
                }
            },
        },
        ("lock", _) => return Err(not_allowed(method, "POST, DELETE")),
        ("lock/heartbeat", "POST") => ClusterAction::Heartbeat,
        ("lock/heartbeat", _) => return Err(not_allowed(method, "POST")),
        _ => {
            return Err(Error::NotFound(
                "no such route; cluster routes are /v1/clusters/<id>/tfstate, /v1/clusters/<id>/lock and /v1/clusters/<id>/lock/heartbeat".into(),
            ).into())
        }
    };
    Ok(Endpoint::Cluster {
        id: id.to_string(),
        action,
    })
}

/// The admin routes (see [`AdminAction`]); names and numbers are judged by the handler.
fn route_admin(method: &str, rest: &str, query: Option<&str>) -> Result<AdminAction, EdgeError> {
    let q = |name| query_param(query, name);
    let segments: Vec<&str> = rest.split('/').collect();
    let ws = |w: &str| w.to_string();
    let (action, allowed) = match segments.as_slice() {
        ["whoami"] => (AdminAction::WhoAmI, "GET"),
        ["workspaces"] => (AdminAction::Workspaces, "GET"),
        ["clusters"] => (AdminAction::Clusters, "GET"),
        ["search"] => (AdminAction::Search { q: q("q") }, "GET"),
        ["audit"] => (
            AdminAction::Audit {
                scope: q("scope"),
                event: q("event"),
                since: q("since"),
                until: q("until"),
                limit: q("limit"),
            },
            "GET",
        ),
        ["workspaces", w] => (AdminAction::Workspace { workspace: ws(w) }, "GET"),
        ["workspaces", w, "versions"] => (
            AdminAction::Versions {
                workspace: ws(w),
                limit: q("limit"),
            },
            "GET",
        ),
        ["workspaces", w, "timeline"] => (
            AdminAction::Timeline {
                workspace: ws(w),
                address: q("address"),
                limit: q("limit"),
            },
            "GET",
        ),
        ["workspaces", w, "versions", v] => (
            AdminAction::Version {
                workspace: ws(w),
                version: v.to_string(),
                masked: q("masked"),
            },
            "GET",
        ),
        ["workspaces", w, "diff"] => (
            AdminAction::Diff {
                workspace: ws(w),
                from: q("from"),
                to: q("to"),
            },
            "GET",
        ),
        ["workspaces", w, "rollback"] if method == "GET" => (
            AdminAction::RollbackPreview {
                workspace: ws(w),
                to: q("to"),
            },
            "GET",
        ),
        ["workspaces", w, "rollback"] => (AdminAction::Rollback { workspace: ws(w) }, "POST"),
        ["workspaces", w, "unlock"] => (AdminAction::Unlock { workspace: ws(w) }, "POST"),
        ["workspaces", w, "restore"] => (AdminAction::Restore { workspace: ws(w) }, "POST"),
        ["workspaces", w, "allow-write"] => (AdminAction::AllowWrite { workspace: ws(w) }, "POST"),
        ["workspaces", w, "freeze"] => (AdminAction::Freeze { workspace: ws(w) }, "POST"),
        ["workspaces", w, "unfreeze"] => (AdminAction::Unfreeze { workspace: ws(w) }, "POST"),
        ["workspaces", w, "move", to] => (
            AdminAction::Move {
                workspace: ws(w),
                to: ws(to),
            },
            "POST",
        ),
        ["freezes"] => (AdminAction::Freezes, "GET"),
        ["workspaces", w, "credential", "rotate"] => {
            (AdminAction::RotateCredential { workspace: ws(w) }, "POST")
        }
        ["workspaces", w, "consumers"] if method == "GET" => {
            (AdminAction::Consumers { workspace: ws(w) }, "GET")
        }
        ["workspaces", w, "consumers"] => (AdminAction::SetConsumers { workspace: ws(w) }, "PUT"),
        ["workspace-tokens"] if method == "GET" => (AdminAction::WorkspaceTokens, "GET"),
        ["workspace-tokens"] => (AdminAction::CreateWorkspaceToken, "POST"),
        ["workspace-tokens", t, "revoke"] => (
            AdminAction::RevokeWorkspaceToken {
                token: t.to_string(),
            },
            "POST",
        ),
        ["drift"] => (
            AdminAction::Drift {
                workspace: q("workspace"),
                limit: q("limit"),
            },
            "GET",
        ),
        ["drift", run] => (
            AdminAction::DriftRun {
                run: run.to_string(),
            },
            "GET",
        ),
        ["drift", w, "run"] => (AdminAction::DriftCheck { workspace: ws(w) }, "POST"),
        ["drift", run, "apply"] => (
            AdminAction::DriftApply {
                run: run.to_string(),
            },
            "POST",
        ),
        ["keys"] => (AdminAction::Keys, "GET"),
        ["keys", "rotate"] => (AdminAction::RotateKey, "POST"),
        ["keys", "retire"] => (AdminAction::RetireKey, "POST"),
        _ => {
            return Err(Error::NotFound("no such admin route; see docs/admin-api.md".into()).into())
        }
    };
    if method != allowed {
        return Err(not_allowed(method, allowed));
    }
    Ok(action)
}

/// The web UI's routes (see [`UiRoute`]); names and numbers are judged by the handler.
fn route_ui(method: &str, rest: &str, query: Option<&str>) -> UiRoute {
    let q = |name| query_param(query, name);
    let segments: Vec<&str> = rest.split('/').collect();
    let ws = |w: &str| w.to_string();
    let (route, allowed) = match segments.as_slice() {
        ["static", "app.css"] => (UiRoute::Stylesheet, "GET"),
        ["login"] if method == "POST" => (UiRoute::Login, "POST"),
        ["login"] => (UiRoute::LoginForm, "GET"),
        ["login", "oidc"] => (UiRoute::SsoStart, "GET"),
        ["login", "oidc", "callback"] => (
            UiRoute::SsoCallback {
                state: q("state"),
                code: q("code"),
                error: q("error"),
                iss: q("iss"),
            },
            "GET",
        ),
        ["logout"] => (UiRoute::Logout, "POST"),
        [""] | ["workspaces"] => (UiRoute::Workspaces { filter: q("q") }, "GET"),
        ["audit"] => (
            UiRoute::Audit {
                scope: q("scope"),
                event: q("event"),
                since: q("since"),
                until: q("until"),
                logins: q("logins"),
                before: q("before"),
            },
            "GET",
        ),
        ["clusters"] => (UiRoute::Clusters, "GET"),
        ["search"] => (UiRoute::Search { q: q("q") }, "GET"),
        ["drift"] => (
            UiRoute::Drift {
                workspace: q("workspace"),
                limit: q("limit"),
            },
            "GET",
        ),
        ["drift", run] => (
            UiRoute::DriftRun {
                run: run.to_string(),
            },
            "GET",
        ),
        ["drift", w, "run"] => (UiRoute::DriftCheck { workspace: ws(w) }, "POST"),
        ["drift", run, "apply"] => (
            UiRoute::DriftApply {
                run: run.to_string(),
            },
            "POST",
        ),
        ["workspaces", w] => (
            UiRoute::Workspace {
                workspace: ws(w),
                page: q("page"),
                rolled_back: q("rolled_back"),
                unlocked: q("unlocked"),
                write_allowed: q("write_allowed"),
            },
            "GET",
        ),
        ["workspaces", w, "versions", v] => (
            UiRoute::Version {
                workspace: ws(w),
                version: v.to_string(),
                reveal: q("reveal"),
            },
            "GET",
        ),
        ["workspaces", w, "versions", v, "reveal"] => (
            UiRoute::Reveal {
                workspace: ws(w),
                version: v.to_string(),
            },
            "POST",
        ),
        ["workspaces", w, "versions", v, "download"] => (
            UiRoute::Download {
                workspace: ws(w),
                version: v.to_string(),
            },
            "POST",
        ),
        ["workspaces", w, "diff"] => (
            UiRoute::Diff {
                workspace: ws(w),
                from: q("from"),
                to: q("to"),
            },
            "GET",
        ),
        ["workspaces", w, "rollback"] if method == "GET" => (
            UiRoute::RollbackPreview {
                workspace: ws(w),
                to: q("to"),
            },
            "GET",
        ),
        ["workspaces", w, "rollback"] => (UiRoute::Rollback { workspace: ws(w) }, "POST"),
        ["workspaces", w, "unlock"] => (UiRoute::Unlock { workspace: ws(w) }, "POST"),
        ["workspaces", w, "allow-write"] => (UiRoute::AllowWrite { workspace: ws(w) }, "POST"),
        ["workspaces", w, "freeze"] => (UiRoute::Freeze { workspace: ws(w) }, "POST"),
        ["workspaces", w, "unfreeze"] => (UiRoute::Unfreeze { workspace: ws(w) }, "POST"),
        ["workspace-tokens", t, "revoke"] => (
            UiRoute::RevokeWorkspaceToken {
                token: t.to_string(),
            },
            "POST",
        ),
        _ => return UiRoute::NotFound,
    };
    if method != allowed {
        if allowed == "POST" && matches!(method, "GET" | "HEAD") {
            if let Some(page) = form_page(&route) {
                return UiRoute::PostOnly {
                    page: Box::new(page),
                };
            }
        }
        return UiRoute::NotAllowed { allowed };
    }
    route
}

/// The page a form route's form is on (where a GET of the form's URL is sent).
fn form_page(form: &UiRoute) -> Option<UiRoute> {
    let workspace_page = |w: &String| UiRoute::Workspace {
        workspace: w.clone(),
        page: None,
        rolled_back: None,
        unlocked: None,
        write_allowed: None,
    };
    Some(match form {
        UiRoute::Logout => UiRoute::Workspaces { filter: None },
        UiRoute::Reveal { workspace, version } | UiRoute::Download { workspace, version } => {
            UiRoute::Version {
                workspace: workspace.clone(),
                version: version.clone(),
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
        UiRoute::DriftApply { run } => UiRoute::DriftRun { run: run.clone() },
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
        let admin = |a| Endpoint::Admin(a);
        let w = || "prod".to_string();
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
                    limit: Some("5".into()),
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
                    limit: Some("2".into()),
                }),
            ),
            (
                "GET",
                "/api/v1/admin/workspaces/prod/versions/latest",
                Some("masked=1"),
                admin(AdminAction::Version {
                    workspace: w(),
                    version: "latest".into(),
                    masked: Some("1".into()),
                }),
            ),
            (
                "GET",
                "/api/v1/admin/workspaces/prod/diff",
                Some("from=1&to=2"),
                admin(AdminAction::Diff {
                    workspace: w(),
                    from: Some("1".into()),
                    to: Some("2".into()),
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
                    to: Some("2".into()),
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
                    limit: Some("5".into()),
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
            // Names are judged after the operator token, not here.
            (
                "GET",
                "/api/v1/admin/workspaces/..",
                None,
                admin(AdminAction::Workspace {
                    workspace: "..".into(),
                }),
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
        let w = || "prod".to_string();
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
                    page: Some("2".into()),
                    rolled_back: Some("7".into()),
                    unlocked: None,
                    write_allowed: None,
                },
            ),
            (
                "GET",
                "/ui/workspaces/prod/versions/3",
                Some("reveal=1"),
                UiRoute::Version {
                    workspace: w(),
                    version: "3".into(),
                    reveal: Some("1".into()),
                },
            ),
            (
                "POST",
                "/ui/workspaces/prod/versions/3/reveal",
                None,
                UiRoute::Reveal {
                    workspace: w(),
                    version: "3".into(),
                },
            ),
            (
                "GET",
                "/ui/workspaces/prod/versions/3/reveal",
                None,
                UiRoute::PostOnly {
                    page: Box::new(UiRoute::Version {
                        workspace: w(),
                        version: "3".into(),
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
                    version: "3".into(),
                },
            ),
            (
                "GET",
                "/ui/workspaces/prod/versions/3/download",
                None,
                UiRoute::PostOnly {
                    page: Box::new(UiRoute::Version {
                        workspace: w(),
                        version: "3".into(),
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
                    from: Some("1".into()),
                    to: Some("2".into()),
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
                    to: Some("2".into()),
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
                    before: Some("9".into()),
                },
            ),
            ("GET", "/ui/clusters", None, UiRoute::Clusters),
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
                    limit: Some("100".into()),
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
                        write_allowed: None,
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
}
