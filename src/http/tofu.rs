//! HTTP framing for the OpenTofu/Terraform `http` state backend (`crate::tofu`):
//! checks the workspace credential, reads the bounded body and shapes the replies.
//! No SQL or blobs here.

use pingora::proxy::Session;

use super::body::{error_reply, read_body, Failure, Handled, Reply};
use super::router::TfAction;
use super::{auth, App};
use crate::error::ApiError;
use crate::tofu::{protocol::verify_content_md5, MAX_LOCK_BODY};

pub(super) async fn handle(
    app: &App,
    session: &mut Session,
    workspace: &str,
    action: TfAction,
) -> Result<Handled, Failure> {
    let tofu = &app.tofu;
    let auth = session
        .req_header()
        .headers
        .get(http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if !auth::is_authorized(auth, &tofu.expected_bearer(workspace)) {
        return Err(Failure::early(ApiError::Unauthorized));
    }
    let limit = match action {
        TfAction::Write { .. } => app.max_state_bytes,
        TfAction::Lock | TfAction::Unlock => MAX_LOCK_BODY,
        TfAction::Get | TfAction::Delete => 0,
    };
    let (body, mut held) = read_body(session, limit, &app.body_budget, app.body_limits)
        .await
        .map_err(Failure::early)?;
    let read = body.len();
    let fail = Failure::after_body(read);
    let reply = match action {
        TfAction::Get => {
            // The stored blob and its plaintext are both in memory while it is served.
            let size = tofu.stored_size(workspace).await.map_err(&fail)?;
            held = app.body_budget.reserve(2 * size).map_err(&fail)?;
            match tofu.get(workspace).await.map_err(&fail)? {
                Some(state) => Reply::json(200, state),
                None => error_reply(&ApiError::NotFound(format!(
                    "workspace {workspace:?} has no state yet"
                ))),
            }
        }
        TfAction::Write { lock_id } => {
            let md5 = session
                .req_header()
                .headers
                .get("content-md5")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            verify_content_md5(md5.as_deref(), &body).map_err(&fail)?;
            tofu.write(workspace, lock_id, body).await.map_err(&fail)?;
            Reply::empty()
        }
        TfAction::Lock => {
            tofu.lock(workspace, &body).await.map_err(&fail)?;
            Reply::empty()
        }
        TfAction::Unlock => {
            tofu.unlock(workspace, &body).await.map_err(&fail)?;
            Reply::empty()
        }
        TfAction::Delete => {
            tofu.delete(workspace).await.map_err(&fail)?;
            Reply::empty()
        }
    };
    Ok(Handled::done(reply, read).holding(held))
}
