//! HTTP framing for the operator API (`crate::operator`, docs/admin-api.md): the
//! operator bearer first, then whether its role allows the route (`super::guard`,
//! before the body is read), then the request's own values (names, numbers, the small
//! JSON body, always an object), then the operation; every answer is JSON and every
//! refusal the shared `{"error": …}`. No SQL or blobs here: each route is one domain
//! call (`Operations`, the drift service, the Terraform backend, the `Keyring`).

use pingora::proxy::Session;
use serde::Deserialize;

use super::body::{read_body, Failure, Handled, Reply};
use super::params::{self, number, required, Parsed};
use super::router::AdminAction;
use super::{auth, App};
use crate::crypto::Purpose;
use crate::drift::{DriftService, Started};
use crate::error::Error;
use crate::keys;
use crate::operator::{diff, rolled_back_json, timeline_json, version_json, Operator, Reveal};
use crate::store::audit::AuditFilter;

/// Largest admin request body (a version number or a lock ID).
const MAX_ADMIN_BODY: u64 = 4096;
/// Largest body of a move: the most addresses, each at its longest and escaped.
const MAX_MOVE_BODY: u64 = (crate::tofu::moves::MAX_ADDRESSES as u64)
    * (2 * crate::tofu::moves::MAX_ADDRESS_BYTES as u64 + 8)
    + 4096;
/// Timeline rows listed when `limit` is not given.
const DEFAULT_TIMELINE: u32 = 1_000;

/// Versions listed when `limit` is not given.
const DEFAULT_VERSIONS: u32 = 100;
/// Audit rows listed when `limit` is not given.
const DEFAULT_AUDIT: u32 = 100;
/// Drift runs listed when `limit` is not given.
const DEFAULT_DRIFT: u32 = 50;

pub(super) async fn handle(
    app: &App,
    session: &mut Session,
    action: Parsed<AdminAction>,
) -> Result<Handled, Failure> {
    let token = auth::presented_secret(auth::authorization(session));
    // 1. the operator (401, one body for missing, wrong and revoked tokens).
    let who = app
        .operator
        .authenticate(token)
        .await
        .map_err(Failure::early)?;
    // 2. the path and query values, parsed once by the router: one that did not parse
    // is a 400 (it says nothing about any workspace), never let through.
    let action = action.map_err(|bad| Failure::early(Error::from(bad)))?;
    // 3. may this operator do this (403, one body for every reason; nothing read yet).
    super::guard::permit(app, &who, action.name(), super::guard::admin_need(&action))
        .await
        .map_err(Failure::early)?;
    let limit = match action {
        AdminAction::Move { .. } => MAX_MOVE_BODY,
        _ if action.takes_body() => MAX_ADMIN_BODY,
        _ => 0,
    };
    let (body, held) = read_body(session, limit, &app.body_budget, app.body_limits)
        .await
        .map_err(Failure::early)?;
    let fail = Failure::after_body(body.len());
    // 4. the body, 5. state: both inside `run`, in that order.
    let reply = run(app, &who, action, &body).await.map_err(&fail)?;
    Ok(Handled::done(reply, body.len()).holding(held))
}

fn ok(value: serde_json::Value) -> Reply {
    Reply::json(200, value.to_string())
}

/// A small JSON object; an empty body is `{}`. Only an object: serde would also fill a
/// struct from an array of its fields in order (`[0]` for `{"generation": 0}`).
fn json_body<T: for<'de> Deserialize<'de>>(body: &[u8], expected: &str) -> Result<T, Error> {
    let invalid = || Error::Invalid(format!("expected a JSON body {expected}"));
    let body = match body.iter().find(|b| !b.is_ascii_whitespace()) {
        None => b"{}" as &[u8],
        Some(b'{') => body,
        Some(_) => return Err(invalid()),
    };
    serde_json::from_slice(body).map_err(|_| invalid())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackBody {
    to: Option<i64>,
    /// The current version the caller saw (e.g. in the preview); 409 if it moved.
    from: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UnlockBody {
    lock_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmptyBody {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AllowWriteBody {
    reason: Option<String>,
    minutes: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FreezeBody {
    reason: Option<String>,
    until: Option<String>,
    #[serde(rename = "for")]
    for_: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsumersBody {
    consumers: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetireKeyBody {
    generation: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MoveBody {
    addresses: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTokenBody {
    name: String,
    /// Comma-separated patterns, or a list of them.
    workspaces: Patterns,
    scope: String,
    expires: Option<String>,
    #[serde(default)]
    include_sensitive: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Patterns {
    Text(String),
    List(Vec<String>),
}

const NEW_TOKEN_BODY: &str = r#"{"name": "ci", "workspaces": "prod-*", "scope": "outputs|read|write", "expires": "30d" (optional), "include_sensitive": false (optional)}"#;

fn new_token(body: &[u8]) -> Result<crate::tofu::credentials::NewWorkspaceToken, Error> {
    use crate::tofu::credentials::{self, Grant, NewWorkspaceToken};
    let parsed: NewTokenBody = json_body(body, NEW_TOKEN_BODY)?;
    let bad = |e: &dyn std::fmt::Display| Error::Invalid(e.to_string());
    let patterns = match parsed.workspaces {
        Patterns::Text(text) => text,
        Patterns::List(list) => list.join(","),
    };
    Ok(NewWorkspaceToken {
        name: credentials::check_name(&parsed.name).map_err(|e| bad(&e))?,
        grant: Grant {
            patterns: credentials::parse_patterns(&patterns).map_err(|e| bad(&e))?,
            scope: crate::tofu::access::Scope::parse(&parsed.scope).map_err(|e| bad(&e))?,
            include_sensitive: parsed.include_sensitive,
        },
        expires_in: parsed
            .expires
            .as_deref()
            .map(credentials::parse_expiry)
            .transpose()
            .map_err(|e| bad(&e))?,
    })
}

/// Runs one admin API action for `who`.
///
/// Long because: one arm per action of the route table, each a call with plain values;
/// splitting the match would only move the dispatch.
async fn run(app: &App, who: &Operator, action: AdminAction, body: &[u8]) -> Result<Reply, Error> {
    let ops = &app.operator;
    let actor = who.actor();
    Ok(match action {
        AdminAction::WhoAmI => ok(serde_json::json!({
            "email": who.email,
            "role": who.grant.role.as_str(),
            "workspaces": who.grant.patterns.iter().map(|p| p.as_str()).collect::<Vec<_>>(),
        })),
        AdminAction::Workspaces => ok(serde_json::json!({
            "stale_after_seconds": ops.stale_after(),
            "workspaces": ops.list_workspaces(&who.grant).await?,
        })),
        AdminAction::Workspace { workspace: w } => {
            ok(serde_json::to_value(ops.workspace(&w).await?).unwrap_or_default())
        }
        AdminAction::Versions {
            workspace: w,
            limit,
        } => {
            let limit = limit.unwrap_or(DEFAULT_VERSIONS);
            let rows = ops.history(&w, Some(limit), &who.grant).await?;
            ok(serde_json::json!({ "versions": rows.iter().map(version_json).collect::<Vec<_>>() }))
        }
        AdminAction::Timeline {
            workspace: w,
            address,
            limit,
        } => {
            let limit = limit.unwrap_or(DEFAULT_TIMELINE);
            let rows = ops
                .timeline(&w, address.as_deref(), limit, &who.grant)
                .await?;
            ok(serde_json::json!({ "changes": rows.iter().map(timeline_json).collect::<Vec<_>>() }))
        }
        AdminAction::Version {
            workspace: w,
            version,
            masked,
        } => {
            let (w, version) = (w.as_str(), version.number());
            let (row, content) = if masked {
                let (row, content) = ops.show(w, version).await?;
                let shown = diff::mask_state(&content, row.version)
                    .map_err(|e| Error::Conflict(e.to_string()))?;
                (row, shown.to_string().into_bytes())
            } else {
                // The real values leave the server: audited as `state.revealed`.
                ops.reveal(w, version, &actor, Reveal::Api).await?
            };
            let mut reply = Reply::json(200, content);
            reply
                .headers
                .push(("X-Stategate-Version", row.version.to_string()));
            reply
        }
        AdminAction::Diff {
            workspace: w,
            from,
            to,
        } => {
            let d = ops.diff(&w, from, to, &who.grant).await?;
            let resources: Vec<serde_json::Value> = d
                .resources
                .iter()
                .map(|r| crate::operator::resource_change_json(&d, r))
                .collect();
            let mut out = serde_json::json!({ "from": from, "to": to, "resources": resources, "outputs": d.outputs });
            if let Some(m) = &d.moved {
                out["moved"] = serde_json::to_value(m).unwrap_or_default();
            }
            ok(out)
        }
        AdminAction::RollbackPreview { workspace: w, to } => {
            ok(serde_json::to_value(ops.rollback_preview(&w, to).await?).unwrap_or_default())
        }
        AdminAction::Rollback { workspace: w } => {
            let w = w.as_str();
            let parsed: RollbackBody = json_body(
                body,
                r#"{"to": <version>, "from": <current version, optional>}"#,
            )?;
            let to = required("to", parsed.to.map(|n| n.to_string()).as_deref())?;
            let from = number("from", parsed.from.map(|n| n.to_string()).as_deref())?;
            ok(rolled_back_json(&ops.rollback(w, to, from, &actor).await?))
        }
        AdminAction::Unlock { workspace: w } => {
            let w = w.as_str();
            let parsed: UnlockBody =
                json_body(body, r#"{"lock_id": "<the ID you were shown>"} or nothing"#)?;
            if parsed
                .lock_id
                .as_deref()
                .is_some_and(|id| !crate::tfstate::is_safe_id(id, 256))
            {
                return Err(Error::Invalid("lock_id must be printable ASCII".into()));
            }
            ok(
                serde_json::to_value(ops.unlock(w, parsed.lock_id, &actor).await?)
                    .unwrap_or_default(),
            )
        }
        AdminAction::Restore { workspace: w } => {
            let w = w.as_str();
            let _: EmptyBody = json_body(body, "{} or nothing")?;
            ok(rolled_back_json(&ops.restore(w, &actor).await?))
        }
        AdminAction::AllowWrite { workspace: w } => {
            let w = w.as_str();
            let parsed: AllowWriteBody =
                json_body(body, r#"{"reason": "<why>", "minutes": <1-60, optional>}"#)?;
            let minutes = parsed
                .minutes
                .unwrap_or(crate::tofu::guard::DEFAULT_OVERRIDE_MINUTES);
            let reason = parsed.reason.unwrap_or_default();
            ok(
                serde_json::to_value(ops.allow_write(w, minutes, &reason, &actor).await?)
                    .unwrap_or_default(),
            )
        }
        AdminAction::Freeze { workspace: w } => {
            let w = w.as_str();
            let parsed: FreezeBody = json_body(
                body,
                r#"{"reason": "<why>", "until": "<RFC 3339, optional>" or "for": "<2h, optional>"}"#,
            )?;
            let done = ops
                .freeze(
                    w,
                    parsed.reason.as_deref().unwrap_or(""),
                    parsed.until.as_deref(),
                    parsed.for_.as_deref(),
                    &actor,
                )
                .await?;
            ok(serde_json::to_value(done).unwrap_or_default())
        }
        AdminAction::Unfreeze { workspace: w } => {
            let w = w.as_str();
            let _: EmptyBody = json_body(body, "{} or nothing")?;
            let lifted = ops.unfreeze(w, &actor).await?;
            ok(serde_json::json!({ "unfrozen": lifted.is_some(), "freeze": lifted }))
        }
        AdminAction::Freezes => {
            ok(serde_json::json!({ "freezes": ops.freezes(&who.grant).await? }))
        }
        AdminAction::Move { workspace: w, to } => {
            let (w, to) = (w.as_str(), to.as_str());
            let parsed: MoveBody = json_body(body, r#"{"addresses": ["<resource address>", …]}"#)?;
            ok(
                serde_json::to_value(ops.move_resources(w, to, &parsed.addresses, &actor).await?)
                    .unwrap_or_default(),
            )
        }
        AdminAction::Audit {
            scope,
            event,
            since,
            until,
            limit,
        } => {
            let filter = AuditFilter {
                scope,
                event,
                since: params::instant("since", since.as_deref())?,
                until: params::instant("until", until.as_deref())?,
                before_id: None,
                exclude: None,
            };
            let limit = limit.unwrap_or(DEFAULT_AUDIT);
            ok(serde_json::json!({ "audit": ops.audit(filter, limit, &who.grant).await? }))
        }
        AdminAction::Clusters => ok(serde_json::json!({ "clusters": ops.clusters().await? })),
        AdminAction::Search { q } => ok(serde_json::to_value(
            ops.search(q.as_deref().unwrap_or(""), &who.grant).await?,
        )
        .unwrap_or_default()),
        AdminAction::Drift {
            workspace: w,
            limit,
        } => {
            let limit = limit.unwrap_or(DEFAULT_DRIFT);
            let (checks, runs) =
                super::guard::visible_drift(app, &who.grant, w.as_ref(), limit).await?;
            ok(serde_json::json!({ "checks": checks, "runs": runs }))
        }
        AdminAction::DriftRun { run } => {
            let (run, output) = app.drift.show(run.get()).await?;
            ok(output.json(&run))
        }
        AdminAction::DriftCheck { workspace: w } => {
            let w = w.as_str();
            let _: EmptyBody = json_body(body, "{} or nothing")?;
            let started = app.drift.start_check(w, &actor).await?;
            accepted(&app.drift, started)
        }
        AdminAction::DriftApply { run } => {
            let _: EmptyBody = json_body(body, "{} or nothing")?;
            let started = app.drift.approve(run.get(), &actor).await?;
            accepted(&app.drift, started)
        }
        AdminAction::RotateCredential { workspace: w } => {
            let w = w.as_str();
            let _: EmptyBody = json_body(body, "{} or nothing")?;
            let generation = app.tofu.rotate_credential(w, &actor).await?;
            ok(serde_json::json!({ "workspace": w, "generation": generation }))
        }
        AdminAction::Consumers { workspace: w } => {
            let w = w.as_str();
            ok(
                serde_json::json!({ "workspace": w, "consumers": ops.consumers(w, &who.grant).await? }),
            )
        }
        AdminAction::SetConsumers { workspace: w } => {
            let w = w.as_str();
            let parsed: ConsumersBody = json_body(body, r#"{"consumers": ["app-a", "app-b"]}"#)?;
            let consumers = ops
                .set_consumers(w, parsed.consumers, &actor, &who.grant)
                .await?;
            ok(serde_json::json!({ "workspace": w, "consumers": consumers }))
        }
        AdminAction::WorkspaceTokens => {
            ok(serde_json::json!({ "tokens": app.tofu.list_tokens().await? }))
        }
        AdminAction::CreateWorkspaceToken => {
            let (secret, listed) = app.tofu.create_token(new_token(body)?, &actor).await?;
            let mut value = serde_json::to_value(listed).unwrap_or_default();
            value["secret"] = serde_json::Value::String(secret);
            Reply::json(201, value.to_string())
        }
        AdminAction::RevokeWorkspaceToken { token } => {
            let _: EmptyBody = json_body(body, "{} or nothing")?;
            ok(
                serde_json::to_value(app.tofu.revoke_token(&token, &actor).await?)
                    .unwrap_or_default(),
            )
        }
        AdminAction::Keys => {
            ok(serde_json::to_value(app.keys.status(&keys::quietly).await?).unwrap_or_default())
        }
        AdminAction::RotateKey => {
            let _: EmptyBody = json_body(body, "{} or nothing")?;
            let rotated = app.keys.rotate(Purpose::Data, &actor).await?;
            ok(serde_json::to_value(rotated).unwrap_or_default())
        }
        AdminAction::RetireKey => {
            let parsed: RetireKeyBody = json_body(body, r#"{"generation": <data generation>}"#)?;
            let retired = app
                .keys
                .retire(parsed.generation, &actor, &keys::quietly)
                .await?;
            ok(serde_json::to_value(retired).unwrap_or_default())
        }
    })
}

/// 202 for a drift run admitted and now executing on its own task (poll `GET drift/{run}`).
fn accepted(drift: &DriftService, started: Started) -> Reply {
    let body = serde_json::json!({
        "run": started.id,
        "workspace": started.workspace,
        "kind": started.kind,
        "applies": started.applies,
        "status": "running",
    });
    drift.spawn(started);
    Reply::json(202, body.to_string())
}
