//! The one place a pass-through request (anything that is not one of stategate's
//! routes) is decided: forwarded to the upstream S3 store unchanged, or answered
//! here. Uses `upstream` (where to and what is off limits) and `conditional` (the
//! atomic conditional-PUT guard).

use pingora::proxy::Session;

use super::body::{error_reply, Reply};
use super::conditional::{self, KeyTurn};
use super::{upstream, App};
use crate::error::ApiError;

/// What to do with a pass-through request.
pub enum Decision {
    /// Forward it upstream; a conditional PUT holds its key's turn until it completes.
    Forward { turn: Option<KeyTurn> },
    /// Answer it here.
    Answer(Reply),
}

pub async fn decide(
    app: &App,
    session: &Session,
    method: &str,
    path: &str,
    query: Option<&str>,
) -> Decision {
    let Some(upstream) = &app.upstream else {
        return Decision::Answer(error_reply(&no_upstream()));
    };
    if upstream.is_protected(path, query) {
        return Decision::Answer(s3_reply(
            403,
            "AccessDenied",
            "this prefix holds stategate's state blobs and is not reachable through the pass-through",
            path,
        ));
    }
    let headers = &session.req_header().headers;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let forward = Decision::Forward { turn: None };
    let Some(condition) =
        conditional::precondition(method, header("if-none-match"), header("if-match"))
    else {
        return forward;
    };
    let Some(guard) = app.conditional.as_ref() else {
        return forward;
    };
    let Some((bucket, key)) = conditional::bucket_and_key(path) else {
        return forward;
    };
    match guard.enter(&bucket, &key, &condition).await {
        Ok(turn) => Decision::Forward { turn: Some(turn) },
        Err(conditional::Refusal::Failed) => Decision::Answer(s3_reply(
            412,
            "PreconditionFailed",
            "At least one of the pre-conditions you specified did not hold",
            path,
        )),
        Err(conditional::Refusal::Unverifiable(detail)) => {
            tracing::warn!(error = %detail, "cannot check a conditional write");
            Decision::Answer(s3_reply(
                503,
                "ServiceUnavailable",
                "stategate could not check the write precondition; retry",
                path,
            ))
        }
    }
}

pub fn no_upstream() -> ApiError {
    ApiError::NotFound(
        "no such route (stategate serves /api/v1/tf/state/<workspace>; no S3 upstream is configured)"
            .into(),
    )
}

/// A local answer in S3's XML error format, for requests on the pass-through.
pub fn s3_reply(status: u16, code: &str, message: &str, path: &str) -> Reply {
    Reply {
        status,
        body: upstream::s3_error(code, message, path),
        content_type: "application/xml",
        headers: Vec::new(),
    }
}
