//! Parses a request line into a typed [`Endpoint`]. Pure: no I/O, no state.
//!
//! Anything that is not one of stategate's own routes is [`Endpoint::Upstream`]:
//! decided by `pass_through` (forwarded to the S3 store, refused, or 404 when no
//! upstream is configured).

use crate::error::ApiError;
use crate::names::validate_workspace;

const TF_PREFIX: &str = "/api/v1/tf/state/";
const CLUSTER_PREFIX: &str = "/v1/clusters/";
const ADMIN_PREFIX: &str = "/api/v1/admin/";

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
    /// `POST workspaces/{ws}/rollback` with `{"to": N}`
    Rollback { workspace: String },
    /// `POST workspaces/{ws}/unlock` with an optional `{"lock_id": "…"}`
    Unlock { workspace: String },
    /// `POST workspaces/{ws}/restore`
    Restore { workspace: String },
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
}

impl AdminAction {
    pub fn name(&self) -> &'static str {
        match self {
            AdminAction::WhoAmI => "admin.whoami",
            AdminAction::Workspaces => "admin.workspaces",
            AdminAction::Workspace { .. } => "admin.workspace",
            AdminAction::Versions { .. } => "admin.versions",
            AdminAction::Version { .. } => "admin.version",
            AdminAction::Diff { .. } => "admin.diff",
            AdminAction::Rollback { .. } => "admin.rollback",
            AdminAction::Unlock { .. } => "admin.unlock",
            AdminAction::Restore { .. } => "admin.restore",
            AdminAction::Audit { .. } => "admin.audit",
            AdminAction::Clusters => "admin.clusters",
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
                | AdminAction::DriftCheck { .. }
                | AdminAction::DriftApply { .. }
        )
    }

    /// The workspace a route is about (for the request log line).
    pub fn workspace(&self) -> Option<&str> {
        match self {
            AdminAction::Workspace { workspace }
            | AdminAction::Versions { workspace, .. }
            | AdminAction::Version { workspace, .. }
            | AdminAction::Diff { workspace, .. }
            | AdminAction::Rollback { workspace }
            | AdminAction::Unlock { workspace }
            | AdminAction::Restore { workspace }
            | AdminAction::DriftCheck { workspace } => Some(workspace),
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
    Write { lock_id: Option<String> },
    Lock,
    Unlock,
    Delete,
}

impl TfAction {
    /// A short stable name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            TfAction::Get => "tf.get",
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
            Endpoint::Upstream => "upstream",
        }
    }
}

fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

pub fn route(method: &str, path: &str, query: Option<&str>) -> Result<Endpoint, ApiError> {
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
    let Some(rest) = path.strip_prefix(TF_PREFIX) else {
        return Ok(Endpoint::Upstream);
    };
    let (workspace, is_lock_path) = match rest.split_once('/') {
        None => (rest, false),
        Some((ws, "lock")) => (ws, true),
        Some(_) => {
            return Err(ApiError::NotFound(
                "no such route; the state address is /api/v1/tf/state/<workspace>".into(),
            ))
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
fn route_cluster(method: &str, rest: &str, query: Option<&str>) -> Result<Endpoint, ApiError> {
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
                    return Err(ApiError::BadRequest(
                        "force must be 1 (or true) to break another admin's lock".into(),
                    ))
                }
            },
        },
        ("lock", _) => return Err(not_allowed(method, "POST, DELETE")),
        ("lock/heartbeat", "POST") => ClusterAction::Heartbeat,
        ("lock/heartbeat", _) => return Err(not_allowed(method, "POST")),
        _ => {
            return Err(ApiError::NotFound(
                "no such route; cluster routes are /v1/clusters/<id>/tfstate, /v1/clusters/<id>/lock and /v1/clusters/<id>/lock/heartbeat".into(),
            ))
        }
    };
    Ok(Endpoint::Cluster {
        id: id.to_string(),
        action,
    })
}

/// The admin routes (see [`AdminAction`]); names and numbers are judged by the handler.
fn route_admin(method: &str, rest: &str, query: Option<&str>) -> Result<AdminAction, ApiError> {
    let q = |name| query_param(query, name);
    let segments: Vec<&str> = rest.split('/').collect();
    let ws = |w: &str| w.to_string();
    let (action, allowed) = match segments.as_slice() {
        ["whoami"] => (AdminAction::WhoAmI, "GET"),
        ["workspaces"] => (AdminAction::Workspaces, "GET"),
        ["clusters"] => (AdminAction::Clusters, "GET"),
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
        ["workspaces", w, "rollback"] => (AdminAction::Rollback { workspace: ws(w) }, "POST"),
        ["workspaces", w, "unlock"] => (AdminAction::Unlock { workspace: ws(w) }, "POST"),
        ["workspaces", w, "restore"] => (AdminAction::Restore { workspace: ws(w) }, "POST"),
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
        _ => {
            return Err(ApiError::NotFound(
                "no such admin route; see docs/admin-api.md".into(),
            ))
        }
    };
    if method != allowed {
        return Err(not_allowed(method, allowed));
    }
    Ok(action)
}

fn not_allowed(method: &str, allowed: &'static str) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.chars().take(32).collect(),
        allowed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            ("GET", "/api/v1/admin/workspaces/prod/rollback", 405),
            ("DELETE", "/api/v1/admin/workspaces/prod", 405),
            ("GET", "/api/v1/admin/nope", 404),
            ("GET", "/api/v1/admin/workspaces/prod/versions/1/x", 404),
            ("GET", "/api/v1/admin/", 404),
            ("GET", "/api/v1/admin/drift/prod/run", 405),
            ("POST", "/api/v1/admin/drift/12", 405),
            ("GET", "/api/v1/admin/drift/12/apply", 405),
        ];
        for (method, path, status) in rejected {
            let err = route(method, path, None).unwrap_err();
            assert_eq!(err.http_status(), *status, "{method} {path}");
        }
    }
}
