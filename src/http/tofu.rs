//! HTTP framing for the OpenTofu/Terraform `http` state backend (`crate::tofu`):
//! checks the workspace credential (a secret by `TofuBackend::authenticate`, or else a
//! verified client certificate by its grant, then `tofu::access::permits` for what the
//! route does: a refusal of either is the same 401, before any body is read), reads the
//! bounded body and shapes the replies.
//! No SQL or blobs here.

use bytes::Bytes;
use pingora::proxy::Session;

use super::body::{error_reply, read_body, stream_body, Failure, Handled, Reply, Reservation};
use super::router::TfAction;
use super::{auth, mtls, App};
use crate::error::Error;
use crate::store::{StateStream, BODY_CHANNEL};
use crate::tofu::access::{permits, shows_sensitive_outputs, Credential, Use};
use crate::tofu::{protocol::decode_content_md5, MAX_LOCK_BODY};

pub(super) async fn handle(
    app: &App,
    session: &mut Session,
    workspace: &str,
    action: TfAction,
) -> Result<Handled, Failure> {
    let tofu = &app.tofu;
    let presented = auth::presented_secret(auth::authorization(session));
    let what = match action {
        TfAction::Outputs => Use::ReadOutputs,
        TfAction::Get => Use::ReadState,
        TfAction::Write { .. } | TfAction::Lock | TfAction::Unlock => Use::Write,
        TfAction::Delete => Use::Delete,
    };
    // A secret, when one is sent, alone decides (a wrong one is refused even beside a
    // valid certificate); only a request without one is judged by its certificate. A
    // LOCK's lookup also reads the lock row and freeze, which answer it if they refuse.
    let (who, seen) = match (presented, &action) {
        (Some(secret), TfAction::Lock) => {
            let (who, seen) = tofu
                .authenticate_lock(workspace, secret)
                .await
                .map_err(Failure::early)?;
            (who, Some(seen))
        }
        (Some(secret), _) => {
            let who = tofu
                .authenticate(workspace, Some(secret), what)
                .await
                .map_err(Failure::early)?;
            (who, None)
        }
        (None, _) => (certificate_credential(app, session, workspace), None),
    };
    let who = who
        .filter(|who| permits(who, what))
        .ok_or_else(|| Failure::early(Error::Unauthenticated))?;
    match action {
        TfAction::Get => get(app, session, workspace).await,
        TfAction::Outputs => outputs(app, session, workspace, &who).await,
        TfAction::Write { lock_id } => write(app, session, workspace, lock_id, &who).await,
        TfAction::Lock => {
            let small = SmallBody::read(app, session, MAX_LOCK_BODY).await?;
            let outcome = tofu.lock(workspace, &small.body, &who, seen).await;
            small.answer(outcome)
        }
        TfAction::Unlock => {
            let small = SmallBody::read(app, session, MAX_LOCK_BODY).await?;
            let outcome = tofu.unlock(workspace, &small.body, &who).await;
            small.answer(outcome)
        }
        TfAction::Delete => {
            let small = SmallBody::read(app, session, 0).await?;
            let outcome = tofu.delete(workspace, &who).await.map(drop);
            small.answer(outcome)
        }
    }
}

/// The credential of the request's verified client certificate for `workspace`, if a
/// grant gives it one.
fn certificate_credential(app: &App, session: &Session, workspace: &str) -> Option<Credential> {
    let identity = mtls::client_identity(session)?;
    app.client_grants.credential(identity, workspace)
}

/// The body of a request other than a write, read whole within its small limit (the
/// lock info, or nothing), with what it holds of the body budget.
struct SmallBody {
    body: Bytes,
    held: Reservation,
}

impl SmallBody {
    async fn read(app: &App, session: &mut Session, limit: u64) -> Result<SmallBody, Failure> {
        let (body, held) = read_body(session, limit, &app.body_budget, app.body_limits)
            .await
            .map_err(Failure::early)?;
        Ok(SmallBody { body, held })
    }

    /// The empty reply of an action that succeeded, or its failure.
    fn answer(self, outcome: Result<(), Error>) -> Result<Handled, Failure> {
        let read = self.body.len();
        outcome.map_err(Failure::after_body(read))?;
        Ok(Handled::done(Reply::empty(), read).holding(self.held))
    }
}

/// GET: the current state, streamed.
async fn get(app: &App, session: &mut Session, workspace: &str) -> Result<Handled, Failure> {
    let (state, read) = match current(app, session, workspace).await? {
        Ok(current) => current,
        Err(missing) => return Ok(missing),
    };
    // A few verified chunks are in flight at a time (a blob of an earlier release is
    // opened whole, as before); counted before any is sent.
    let size = state.row.size.max(0) as u64;
    let held = app
        .body_budget
        .reserve((2 * size).min(super::body::STREAM_RESERVE))
        .map_err(Failure::after_body(read))?;
    Ok(Handled::done(Reply::streamed(size, state.chunks), read).holding(held))
}

/// GET of the outputs-only state: the current state is read whole within its stored
/// size, reserved from the body budget first, and only the synthesized document sent.
async fn outputs(
    app: &App,
    session: &mut Session,
    workspace: &str,
    who: &Credential,
) -> Result<Handled, Failure> {
    let (state, read) = match current(app, session, workspace).await? {
        Ok(current) => current,
        Err(missing) => return Ok(missing),
    };
    let held = app
        .body_budget
        .reserve(state.row.size.max(0) as u64)
        .map_err(Failure::after_body(read))?;
    let body = crate::tofu::outputs::of_stream(workspace, state, shows_sensitive_outputs(who))
        .await
        .map_err(Failure::after_body(read))?;
    Ok(Handled::done(Reply::json(200, body), read).holding(held))
}

/// A read's first step: the request's (empty) body read, then `workspace`'s current
/// state with the bytes read so far, or the reply that it has none yet.
async fn current(
    app: &App,
    session: &mut Session,
    workspace: &str,
) -> Result<Result<(StateStream, usize), Handled>, Failure> {
    let small = SmallBody::read(app, session, 0).await?;
    let read = small.body.len();
    match app.tofu.get_stream(workspace).await {
        Ok(Some(state)) => Ok(Ok((state, read))),
        Ok(None) => {
            let missing = Error::NotFound(format!("workspace {workspace:?} has no state yet"));
            Ok(Err(
                Handled::done(error_reply(&missing), read).holding(small.held)
            ))
        }
        Err(e) => Err(Failure::after_body(read)(e)),
    }
}

/// POST: the body streams into the store as it arrives (never held whole); the lock
/// check runs before the first byte is stored and again in the commit.
async fn write(
    app: &App,
    session: &mut Session,
    workspace: &str,
    lock_id: Option<String>,
    who: &crate::tofu::Credential,
) -> Result<Handled, Failure> {
    let md5 = session
        .req_header()
        .headers
        .get("content-md5")
        .map(|v| {
            v.to_str()
                .map_err(|_| Error::Invalid("Content-MD5 is not valid base64".into()))
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
    let store = app.tofu.write_stream(workspace, lock_id, md5, rx, who);
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
