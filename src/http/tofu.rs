//! HTTP framing for the OpenTofu/Terraform `http` state backend (`crate::tofu`):
//! checks the workspace credential, reads the bounded body and shapes the replies.
//! No SQL or blobs here.

use pingora::proxy::Session;

use super::body::{error_reply, read_body, stream_body, Failure, Handled, Reply};
use super::router::TfAction;
use super::{auth, App};
use crate::error::ApiError;
use crate::store::BODY_CHANNEL;
use crate::tofu::{protocol::decode_content_md5, MAX_LOCK_BODY};

pub(super) async fn handle(
    app: &App,
    session: &mut Session,
    workspace: &str,
    action: TfAction,
) -> Result<Handled, Failure> {
    let tofu = &app.tofu;
    if !auth::is_authorized(
        auth::authorization(session),
        &tofu.expected_bearer(workspace),
    ) {
        return Err(Failure::early(ApiError::Unauthorized));
    }
    let limit = match action {
        TfAction::Write { lock_id } => return write(app, session, workspace, lock_id).await,
        TfAction::Lock | TfAction::Unlock => MAX_LOCK_BODY,
        TfAction::Get | TfAction::Delete => 0,
    };
    let (body, mut held) = read_body(session, limit, &app.body_budget, app.body_limits)
        .await
        .map_err(Failure::early)?;
    let read = body.len();
    let fail = Failure::after_body(read);
    let reply = match action {
        TfAction::Get => match tofu.get_stream(workspace).await.map_err(&fail)? {
            Some(state) => {
                // A few verified chunks are in flight at a time (a blob of an earlier
                // release is opened whole, as before); counted before any is sent.
                let size = state.row.size.max(0) as u64;
                held = app
                    .body_budget
                    .reserve((2 * size).min(super::body::STREAM_RESERVE))
                    .map_err(&fail)?;
                Reply::streamed(size, state.chunks)
            }
            None => error_reply(&ApiError::NotFound(format!(
                "workspace {workspace:?} has no state yet"
            ))),
        },
        TfAction::Write { .. } => unreachable!("handled above"),
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

/// POST: the body streams into the store as it arrives (never held whole); the lock
/// check runs before the first byte is stored and again in the commit.
async fn write(
    app: &App,
    session: &mut Session,
    workspace: &str,
    lock_id: Option<String>,
) -> Result<Handled, Failure> {
    let md5 = session
        .req_header()
        .headers
        .get("content-md5")
        .map(|v| {
            v.to_str()
                .map_err(|_| ApiError::BadRequest("Content-MD5 is not valid base64".into()))
        })
        .transpose()
        .and_then(|v| v.map(decode_content_md5).transpose())
        .map_err(Failure::early)?;
    let (tx, rx) = tokio::sync::mpsc::channel(BODY_CHANNEL);
    let feed = stream_body(
        session,
        app.max_state_bytes,
        &app.body_budget,
        app.body_limits,
        tx,
    );
    let store = app.tofu.write_stream(workspace, lock_id, md5, rx);
    let ((read, consumed), outcome) = tokio::join!(feed, store);
    match outcome {
        Ok(_) => Ok(Handled::done(Reply::empty(), read)),
        Err(error) => Err(Failure {
            error,
            bytes_in: read,
            body_consumed: consumed,
        }),
    }
}
