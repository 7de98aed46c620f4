//! Request bodies and local replies: the shared body memory budget, bounded body
//! reads, and writing a finished [`Reply`] back to the client. Every local answer
//! (tofu, cluster, pass-through refusals) leaves through [`write_reply`].

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::Session;

use crate::error::ApiError;

/// A finished local response.
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
}

impl Reply {
    pub fn json(status: u16, body: impl Into<Bytes>) -> Reply {
        Reply {
            status,
            body: body.into(),
            content_type: "application/json",
            headers: Vec::new(),
        }
    }

    pub fn empty() -> Reply {
        Reply::json(200, Bytes::new())
    }
}

/// How a local handler ended: what to send, how many body bytes it read (for the
/// log line), and whether the connection may be reused.
pub struct Handled {
    pub reply: Reply,
    pub bytes_in: usize,
    /// False when the request body was not consumed: the connection is closed rather
    /// than drained (the body may be huge).
    pub keepalive: bool,
}

impl Handled {
    /// A reply after the whole request body was read.
    pub fn done(reply: Reply, bytes_in: usize) -> Handled {
        Handled {
            reply,
            bytes_in,
            keepalive: true,
        }
    }

    /// A reply that leaves the request body unread (answered before or instead of it).
    pub fn unread(reply: Reply) -> Handled {
        Handled {
            reply,
            bytes_in: 0,
            keepalive: false,
        }
    }
}

/// A handler's error, and how far it got with the request body.
pub struct Failure {
    pub error: ApiError,
    pub bytes_in: usize,
    pub body_consumed: bool,
}

impl Failure {
    /// Refused before the body was read.
    pub fn early(error: ApiError) -> Failure {
        Failure {
            error,
            bytes_in: 0,
            body_consumed: false,
        }
    }

    /// Refused after reading all `bytes_in` bytes of the body.
    pub fn after_body(bytes_in: usize) -> impl Fn(ApiError) -> Failure {
        move |error| Failure {
            error,
            bytes_in,
            body_consumed: true,
        }
    }
}

impl From<Failure> for Handled {
    fn from(f: Failure) -> Handled {
        Handled {
            reply: error_reply(&f.error),
            bytes_in: f.bytes_in,
            keepalive: f.body_consumed,
        }
    }
}

/// The JSON error reply for `e`; server-side failures are logged here, once.
pub fn error_reply(e: &ApiError) -> Reply {
    let status = e.http_status();
    match e.log_detail() {
        Some(detail) if status >= 500 => tracing::error!(status, error = detail, "request failed"),
        _ => {}
    }
    Reply::json(status, e.body())
}

/// Bounds the memory that request bodies take at once, all requests together: a body
/// reserves its declared size (or the route's limit, if it has none) before it is read,
/// and holds the reservation until its reply is built. Accounted in KiB.
pub struct BodyBudget {
    kib: Arc<tokio::sync::Semaphore>,
    total_kib: u32,
}

/// A body's share of the [`BodyBudget`], released on drop.
pub type BodyReservation = tokio::sync::OwnedSemaphorePermit;

impl BodyBudget {
    pub fn new(bytes: u64) -> Self {
        let total_kib = bytes.div_ceil(1024).clamp(1, u64::from(u32::MAX >> 3)) as u32;
        BodyBudget {
            kib: Arc::new(tokio::sync::Semaphore::new(total_kib as usize)),
            total_kib,
        }
    }

    /// Never waits: when the budget is spent the client is told to retry (429).
    fn reserve(&self, bytes: u64) -> Result<BodyReservation, ApiError> {
        let kib = bytes.div_ceil(1024).clamp(1, u64::from(self.total_kib)) as u32;
        self.kib.clone().try_acquire_many_owned(kib).map_err(|_| {
            ApiError::Busy("too many large request bodies in flight; retry shortly".into())
        })
    }
}

/// Reads the request body, refusing more than `limit` bytes without buffering past it.
/// Answers `Expect: 100-continue` once the request has passed the checks before it.
pub async fn read_body(
    session: &mut Session,
    limit: u64,
    budget: &BodyBudget,
) -> Result<(Bytes, BodyReservation), ApiError> {
    let headers = &session.req_header().headers;
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let reservation = budget.reserve(declared.unwrap_or(limit).min(limit))?;
    let expects_continue = headers
        .get(http::header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    if expects_continue {
        session
            .as_downstream_mut()
            .write_continue_response()
            .await
            .map_err(|e| ApiError::BadRequest(format!("connection failed: {e}")))?;
    }
    // Reserve at most 1 MiB up front: a declared length is a claim, not bytes received.
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0).min(limit).min(1 << 20) as usize);
    while let Some(chunk) = session.read_request_body().await.map_err(|_| {
        ApiError::BadRequest("request body could not be read (connection closed?)".into())
    })? {
        if body.len() as u64 + chunk.len() as u64 > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body.freeze(), reservation))
}

/// Writes a local response. When the request body was not consumed, the connection
/// is closed afterwards rather than drained (the body may be huge).
pub async fn write_reply(session: &mut Session, reply: Reply, keepalive: bool) -> Result<()> {
    let mut header = ResponseHeader::build(reply.status, Some(4))?;
    header.insert_header(http::header::CONTENT_TYPE, reply.content_type)?;
    header.insert_header(http::header::CONTENT_LENGTH, reply.body.len().to_string())?;
    header.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    for (name, value) in reply.headers {
        header.insert_header(name, value)?;
    }
    if !keepalive {
        session.set_keepalive(None);
        header.insert_header(http::header::CONNECTION, "close")?;
    }
    let is_head = session.req_header().method == http::Method::HEAD;
    let empty = reply.body.is_empty() || is_head;
    session
        .write_response_header(Box::new(header), empty)
        .await?;
    if !empty {
        session.write_response_body(Some(reply.body), true).await?;
    }
    Ok(())
}
