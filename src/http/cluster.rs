//! HTTP framing for the cluster API (`crate::cluster`): pulls the bearer token out of
//! `Authorization`, orders the checks as the contract does, reads bounded bodies and
//! shapes replies. No SQL or blobs here.

use pingora::proxy::Session;

use super::body::{error_reply, read_body, Failure, Handled, Reply};
use super::params::ClusterId;
use super::router::ClusterAction;
use super::{auth, App};
use crate::cluster::{lease::MAX_LOCK_BODY, MAX_STATE_BYTES};
use crate::error::Error;

pub(super) async fn handle(
    app: &App,
    session: &mut Session,
    id: ClusterId,
    action: ClusterAction,
) -> Result<Handled, Failure> {
    let svc = &app.cluster;
    // Rejections before the body is read (`Failure::early`) close the connection
    // instead of draining it.
    let token = auth::presented_secret(auth::authorization(session));
    // 1. auth, org, role (401/404/403), then the feature flag (503).
    let who = svc
        .authorize(token, id.uuid())
        .await
        .map_err(Failure::early)?;
    let limit = match action {
        ClusterAction::PutState => {
            // 2. the lock holder, before a byte of a possibly huge body is read.
            svc.require_holder(&who).await.map_err(Failure::early)?;
            // 3. the 10 MiB cap: a declared Content-Length over it is refused unread.
            MAX_STATE_BYTES
        }
        _ => MAX_LOCK_BODY,
    };
    let (body, mut held) = read_body(session, limit, &app.body_budget, app.body_limits)
        .await
        .map_err(Failure::early)?;
    let read = body.len();
    let fail = Failure::after_body(read);
    let reply = match action {
        ClusterAction::GetState => match svc.get_state(&who).await.map_err(&fail)? {
            Some(state) => {
                // Bounded by the 10 MiB cap; counted while it is being sent.
                held = app
                    .body_budget
                    .reserve(state.body.len() as u64)
                    .map_err(Failure::after_body(read))?;
                Reply {
                    stream: None,
                    refusal: None,
                    status: 200,
                    headers: state.headers(),
                    body: state.body.into(),
                    content_type: "application/json",
                }
            }
            None => error_reply(&Error::NotFound(
                "no state has been pushed to this cluster yet".into(),
            )),
        },
        ClusterAction::PutState => {
            app.body_budget
                .hold_store_copy(&mut held, read as u64)
                .map_err(Failure::after_body(read))?;
            // 4. parse serial/lineage (400), 5. conflict rules inside the commit.
            let serial = svc.put_state(&who, body).await.map_err(&fail)?;
            Reply::json(200, serde_json::json!({ "serial": serial }).to_string())
        }
        ClusterAction::Lock => {
            let acquired_at = svc.lock(&who, &body).await.map_err(&fail)?;
            let mut reply = Reply::json(
                200,
                serde_json::json!({ "acquired_at": acquired_at }).to_string(),
            );
            reply.headers.push((
                "X-Stategate-Heartbeat-Seconds",
                svc.heartbeat_seconds().to_string(),
            ));
            reply.headers.push((
                "X-Stategate-Lease-Stale-Seconds",
                svc.stale_seconds().to_string(),
            ));
            reply
        }
        ClusterAction::Heartbeat => {
            svc.heartbeat(&who).await.map_err(&fail)?;
            Reply::empty()
        }
        ClusterAction::Unlock { force } => {
            svc.unlock(&who, force).await.map_err(&fail)?;
            Reply::empty()
        }
    };
    Ok(Handled::done(reply, read).holding(held))
}
