//! The one place a pass-through request (anything that is not one of stategate's
//! routes) is decided: forwarded to the upstream S3 store unchanged, or answered
//! here. In order: what the request touches (`s3_target`, by the upstream's own
//! reading; an unknown `Host` is refused), whether that is off limits
//! (`upstream::Protection`), and for a conditional PUT the atomic guard
//! (`conditional`), which only answers signed requests.

use pingora::http::RequestHeader;
use pingora::proxy::Session;

use super::body::{error_reply, Reply};
use super::conditional::{self, HeldTurn};
use super::s3_target::{self, TargetError};
use super::{upstream, App};
use crate::error::Error;

/// What to do with a pass-through request.
pub enum Decision {
    /// Forward it upstream; a conditional PUT holds its key's turn until it completes.
    Forward { turn: Option<HeldTurn> },
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
    let request = session.req_header();
    let target = match permitted_target(upstream, request, method, path, query) {
        Ok(target) => target,
        Err(refused) => return Decision::Answer(refused),
    };
    let header = |name: &str| request.headers.get(name).and_then(|v| v.to_str().ok());
    let forward = Decision::Forward { turn: None };
    let Some(condition) =
        conditional::precondition(method, header("if-none-match"), header("if-match"))
    else {
        return forward;
    };
    let Some(guard) = app.conditional.as_ref() else {
        return forward;
    };
    decide_conditional(guard, request, &target, &condition, path).await
}

/// What the request touches, read as the upstream reads it, when none of it is off
/// limits; else the S3 error that refuses it (nothing is forwarded).
fn permitted_target(
    upstream: &upstream::Upstream,
    request: &RequestHeader,
    method: &str,
    path: &str,
    query: Option<&str>,
) -> Result<s3_target::Target, Reply> {
    if request.uri.authority().is_some() {
        // An absolute-form target may name another host than `Host`; S3 clients never send one.
        return Err(s3_reply(
            400,
            "InvalidRequest",
            "absolute-form request targets are not accepted; send the path and a Host header",
            path,
        ));
    }
    let headers = &request.headers;
    let host = headers
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok());
    let target = s3_target::resolve(method, path, query, host, headers, &upstream.addressing)
        .map_err(|e| {
            let code = match e {
                TargetError::BadEncoding => "InvalidURI",
                TargetError::NoHost | TargetError::UnknownHost(_) => "InvalidRequest",
            };
            s3_reply(400, code, &e.to_string(), path)
        })?;
    if let Err(upstream::Denied(message)) = upstream.protection.check(&target) {
        return Err(s3_reply(403, "AccessDenied", message, path));
    }
    Ok(target)
}

/// A conditional PUT to a permitted target: forwarded under its key's turn when the
/// condition holds; the precondition's failure told (412) only to a verified signer.
async fn decide_conditional(
    guard: &conditional::ConditionalGuard,
    request: &RequestHeader,
    target: &s3_target::Target,
    condition: &conditional::Precondition,
    path: &str,
) -> Decision {
    // Before any look at the object: the answer must not tell strangers whether it exists.
    if !may_learn_precondition(request) {
        return Decision::Answer(s3_reply(
            403,
            "AccessDenied",
            "conditional writes through stategate must be signed (AWS Signature Version 4)",
            path,
        ));
    }
    let Some((bucket, key)) = target.object() else {
        return Decision::Answer(s3_reply(
            400,
            "InvalidURI",
            "the object of a conditional write must be named unambiguously (no empty, '.' or '..' path segments, no encoded bucket name)",
            path,
        ));
    };
    // Verified before the object is looked at: the look is made as the key that
    // signed (its own read permission), and only such a request may learn a 412.
    let signer = match guard.signer(request).await {
        conditional::Signer::Verified(key) => Some(key),
        conditional::Signer::Unknown => None,
        // The answer a bad signature gets, before the object is looked at.
        conditional::Signer::BadSignature => {
            return Decision::Answer(s3_reply(
                403,
                "AccessDenied",
                "the request is not signed by a key of the store, or its signature does not verify (or does not cover its condition header)",
                path,
            ))
        }
    };
    match guard.enter(bucket, key, condition, signer.as_ref()).await {
        Ok(turn) => Decision::Forward { turn: Some(turn) },
        Err(refusal) => {
            Decision::Answer(refusal_reply(guard, refusal, signer.as_ref(), bucket, path))
        }
    }
}

/// The answer to a conditional write the guard refused: 412 only for a verified
/// signer; a failure the client may not learn reads like a bad signature.
fn refusal_reply(
    guard: &conditional::ConditionalGuard,
    refusal: conditional::Refusal,
    signer: Option<&super::store_keys::KnownKey>,
    bucket: &str,
    path: &str,
) -> Reply {
    match refusal {
        conditional::Refusal::Failed if signer.is_some() => s3_reply(
            412,
            "PreconditionFailed",
            "At least one of the pre-conditions you specified did not hold",
            path,
        ),
        // Signed with a key stategate cannot check (or not validly): the same answer
        // as a bad signature, so the reply says nothing about the object.
        conditional::Refusal::Failed => {
            let fix = if guard.looks_up_other_keys() {
                "the key is not one the store's admin API knows, or the signature is not valid"
            } else {
                "set upstream.garage_admin_endpoint and upstream.garage_admin_token_file to let stategate check signatures made with the store's other keys"
            };
            tracing::warn!(
                bucket,
                fix,
                "a conditional write failed its precondition, but its signature could not be verified: answered 403, not 412"
            );
            s3_reply(
                403,
                "AccessDenied",
                "stategate could not verify this request's signature with a key it knows; only such requests learn that a precondition failed",
                path,
            )
        }
        conditional::Refusal::Busy => s3_reply(
            503,
            "SlowDown",
            "another conditional write to this key is in progress; retry",
            path,
        ),
        conditional::Refusal::Unverifiable(detail) => {
            let as_key = match signer {
                Some(key) => key.access_key_id.as_str(),
                None => "stategate's own store key",
            };
            tracing::warn!(
                error = %detail,
                bucket,
                key = as_key,
                "cannot check a conditional write: the object could not be read as this key; give it read access to the bucket (garage bucket allow --read <bucket> --key <key>), or let stategate look up the client's own key (upstream.garage_admin_endpoint)"
            );
            s3_reply(
                503,
                "ServiceUnavailable",
                "stategate could not check the write precondition; retry",
                path,
            )
        }
    }
}

/// May this client learn from stategate whether a precondition holds (a 412), which
/// stategate finds out with the store's own credentials? The single call site for
/// that decision up front: the request carries an AWS SigV4 signature (header or
/// presigned query); the upstream still verifies it when the write is forwarded. A
/// failed condition is revealed (412) only after `ConditionalGuard::signer` verified the
/// signature itself.
pub fn may_learn_precondition(request: &RequestHeader) -> bool {
    let signed_header = request
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start().starts_with("AWS4-HMAC-SHA256 ") && v.contains("Signature=")
        });
    let presigned = request.uri.query().is_some_and(|q| {
        form_urlencoded::parse(q.as_bytes())
            .any(|(k, v)| k.eq_ignore_ascii_case("X-Amz-Signature") && !v.is_empty())
    });
    signed_header || presigned
}

pub fn no_upstream() -> Error {
    Error::NotFound(
        "no such route (stategate serves /api/v1/tf/state/<workspace>; no S3 upstream is configured)"
            .into(),
    )
}

/// A local answer in S3's XML error format, for requests on the pass-through.
pub fn s3_reply(status: u16, code: &str, message: &str, path: &str) -> Reply {
    Reply {
        stream: None,
        refusal: None,
        status,
        body: upstream::s3_error(code, message, path),
        content_type: "application/xml",
        headers: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_signed_requests_may_learn_a_precondition() {
        // (Authorization, query, may learn?)
        let table: &[(Option<&str>, Option<&str>, bool)] = &[
            (
                Some("AWS4-HMAC-SHA256 Credential=GK/20261130/garage/s3/aws4_request, SignedHeaders=host, Signature=ab"),
                None,
                true,
            ),
            (
                None,
                Some("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=ab"),
                true,
            ),
            (None, None, false),
            (Some("Bearer x"), None, false),
            (Some("AWS4-HMAC-SHA256"), None, false),
            (Some("AWS GK:sig"), None, false),
            (None, Some("X-Amz-Signature="), false),
            (None, Some("signature=ab"), false),
        ];
        for (auth, query, want) in table {
            let uri = match query {
                Some(q) => format!("/tf/k?{q}"),
                None => "/tf/k".into(),
            };
            let mut req = RequestHeader::build("PUT", uri.as_bytes(), None).unwrap();
            if let Some(a) = auth {
                req.insert_header("authorization", *a).unwrap();
            }
            assert_eq!(may_learn_precondition(&req), *want, "{auth:?} {query:?}");
        }
    }
}
