//! pingora glue: the `ProxyHttp` implementation that answers stategate's own
//! routes in `request_filter` and (later) forwards everything else upstream.
//!
//! This layer parses, authenticates, reads bounded bodies and writes responses.
//! It never touches SQL or blobs directly; it calls `tofu` with plain values.

pub mod auth;
mod cluster;
pub mod conditional;
pub mod router;
pub mod upstream;

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::tofu::{protocol::verify_content_md5, TofuBackend, MAX_LOCK_BODY};
use router::{Endpoint, TfAction};

/// Everything a request handler needs.
pub struct App {
    pub tofu: TofuBackend,
    pub max_state_bytes: u64,
    /// Memory for request bodies, shared by all requests.
    pub body_budget: BodyBudget,
    pub metrics: Metrics,
    /// Where non-stategate requests are forwarded; `None` answers them 404.
    pub upstream: Option<upstream::Upstream>,
    /// Makes conditional PUTs through the pass-through atomic; `None` forwards them as-is.
    pub conditional: Option<conditional::ConditionalGuard>,
    /// The cluster tfstate & lock API.
    pub cluster: crate::cluster::ClusterService,
    /// Requests in flight, so a stopping server exits as soon as they are done.
    pub inflight: crate::drain::Inflight,
}

/// The pingora service.
pub struct Gateway {
    app: Arc<App>,
}

impl Gateway {
    pub fn new(app: Arc<App>) -> Self {
        Gateway { app }
    }
}

/// A finished local response.
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
}

impl Reply {
    fn json(status: u16, body: impl Into<Bytes>) -> Reply {
        Reply {
            status,
            body: body.into(),
            content_type: "application/json",
            headers: Vec::new(),
        }
    }

    fn empty() -> Reply {
        Reply::json(200, Bytes::new())
    }
}

/// Per-request facts for the summary log line.
#[derive(Default)]
pub struct RequestCtx {
    route: &'static str,
    workspace: Option<String>,
    /// Set when the request is being forwarded upstream (logged in `logging`).
    proxied_since: Option<Instant>,
    /// Held until the forwarded conditional PUT completes (see `conditional`).
    conditional_turn: Option<tokio::sync::OwnedMutexGuard<()>>,
    _inflight: Option<crate::drain::InflightGuard>,
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> Self::CTX {
        RequestCtx {
            _inflight: Some(self.app.inflight.enter()),
            ..RequestCtx::default()
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        let started = Instant::now();
        let header = session.req_header();
        let method = header.method.as_str().to_string();
        let path = header.uri.path().to_string();
        let query = header.uri.query().map(str::to_string);

        let endpoint = router::route(&method, &path, query.as_deref());
        ctx.route = endpoint.as_ref().map_or("invalid", Endpoint::name);
        match &endpoint {
            Ok(Endpoint::Tf { workspace, .. }) => ctx.workspace = Some(workspace.clone()),
            Ok(Endpoint::Cluster { id, .. }) => ctx.workspace = Some(format!("cluster/{id}")),
            _ => {}
        }
        let (reply, body_in, keepalive) = match endpoint {
            Ok(Endpoint::Upstream) => {
                match self
                    .pass_through(session, ctx, &method, &path, query.as_deref())
                    .await
                {
                    None => {
                        ctx.proxied_since = Some(started);
                        return Ok(false);
                    }
                    Some(reply) => (reply, 0, false),
                }
            }
            Ok(endpoint) => self.handle(session, endpoint).await,
            Err(e) => (error_reply(&e), 0, false),
        };
        let bytes_out = reply.body.len();
        let status = reply.status;
        write_reply(session, reply, keepalive).await?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        self.app.metrics.observe(ctx.route, status, ms / 1000.0);
        tracing::info!(
            method = %method,
            route = ctx.route,
            workspace = ctx.workspace.as_deref().unwrap_or("-"),
            status,
            bytes_in = body_in,
            bytes_out,
            ms = format_args!("{ms:.1}"),
            "request"
        );
        Ok(true)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut Self::CTX,
    ) -> Result<Box<HttpPeer>> {
        let Some(up) = &self.app.upstream else {
            // request_filter answers every request itself when there is no upstream.
            return Err(Error::explain(
                ErrorType::HTTPStatus(404),
                "no upstream configured",
            ));
        };
        let addr = tokio::net::lookup_host((up.host.as_str(), up.port))
            .await
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| {
                Error::explain(
                    ErrorType::ConnectNoRoute,
                    "cannot resolve the upstream S3 host",
                )
            })?;
        let mut peer = HttpPeer::new(addr, up.tls, up.host.clone());
        peer.options.connection_timeout = Some(up.connect_timeout);
        peer.options.total_connection_timeout = Some(up.connect_timeout * 2);
        peer.options.read_timeout = Some(up.read_timeout);
        peer.options.write_timeout = Some(up.read_timeout);
        Ok(Box::new(peer))
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        _ctx: &mut Self::CTX,
    ) -> pingora::proxy::FailToProxy {
        // Only answer if nothing was sent yet; a failure mid-response can only close the connection.
        let code = if session.response_written().is_some() {
            0
        } else {
            let (status, code, message) = match e.esource() {
                ErrorSource::Downstream => (400, "BadRequest", "the request could not be read"),
                _ => (
                    502,
                    "BadGateway",
                    "stategate could not get a response from the upstream S3 endpoint",
                ),
            };
            let path = session.req_header().uri.path().to_string();
            let reply = s3_reply(status, code, message, &path);
            tracing::warn!(error = %e, status, "pass-through failed");
            match write_reply(session, reply, false).await {
                Ok(()) => status,
                Err(_) => 0,
            }
        };
        pingora::proxy::FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Self::CTX) {
        let Some(started) = ctx.proxied_since else {
            return;
        };
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let seconds = started.elapsed().as_secs_f64();
        self.app.metrics.observe("upstream", status, seconds);
        tracing::info!(
            method = %session.req_header().method,
            route = "upstream",
            status,
            bytes_in = session.body_bytes_read(),
            bytes_out = session.body_bytes_sent(),
            ms = format_args!("{:.1}", seconds * 1000.0),
            error = e.map(|e| e.to_string()).unwrap_or_default(),
            "request"
        );
    }
}

fn no_upstream() -> ApiError {
    ApiError::NotFound(
        "no such route (stategate serves /api/v1/tf/state/<workspace>; no S3 upstream is configured)"
            .into(),
    )
}

/// A local answer in S3's XML error format, for requests on the pass-through.
fn s3_reply(status: u16, code: &str, message: &str, path: &str) -> Reply {
    Reply {
        status,
        body: upstream::s3_error(code, message, path),
        content_type: "application/xml",
        headers: Vec::new(),
    }
}

impl Gateway {
    /// Decides a request that is not one of stategate's routes: `None` forwards it
    /// upstream unchanged, `Some` answers it here.
    async fn pass_through(
        &self,
        session: &Session,
        ctx: &mut RequestCtx,
        method: &str,
        path: &str,
        query: Option<&str>,
    ) -> Option<Reply> {
        let Some(upstream) = &self.app.upstream else {
            return Some(error_reply(&no_upstream()));
        };
        if upstream.is_protected(path, query) {
            return Some(s3_reply(
                403,
                "AccessDenied",
                "this prefix holds stategate's state blobs and is not reachable through the pass-through",
                path,
            ));
        }
        let headers = &session.req_header().headers;
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let condition =
            conditional::precondition(method, header("if-none-match"), header("if-match"))?;
        let guard = self.app.conditional.as_ref()?;
        let (bucket, key) = conditional::bucket_and_key(path)?;
        match guard.enter(&bucket, &key, &condition).await {
            Ok(turn) => {
                ctx.conditional_turn = Some(turn);
                None
            }
            Err(conditional::Refusal::Failed) => Some(s3_reply(
                412,
                "PreconditionFailed",
                "At least one of the pre-conditions you specified did not hold",
                path,
            )),
            Err(conditional::Refusal::Unverifiable(detail)) => {
                tracing::warn!(error = %detail, "cannot check a conditional write");
                Some(s3_reply(
                    503,
                    "ServiceUnavailable",
                    "stategate could not check the write precondition; retry",
                    path,
                ))
            }
        }
    }

    /// Returns the reply, the request body size read, and whether the connection may be reused.
    async fn handle(&self, session: &mut Session, endpoint: Endpoint) -> (Reply, usize, bool) {
        match endpoint {
            Endpoint::Health => (Reply::json(200, r#"{"status":"ok"}"#), 0, true),
            Endpoint::Metrics => (
                Reply {
                    status: 200,
                    body: self.app.metrics.render().into(),
                    content_type: "text/plain; version=0.0.4",
                    headers: Vec::new(),
                },
                0,
                true,
            ),
            // Decided in `request_filter` (`pass_through`); kept total without a panic.
            Endpoint::Upstream => (error_reply(&no_upstream()), 0, false),
            Endpoint::Cluster { id, action } => {
                cluster::handle(
                    &self.app.cluster,
                    &self.app.body_budget,
                    session,
                    &id,
                    action,
                )
                .await
            }
            Endpoint::Tf { workspace, action } => {
                match self.handle_tf(session, &workspace, action).await {
                    Ok((reply, read)) => (reply, read, true),
                    Err((e, read, body_consumed)) => (error_reply(&e), read, body_consumed),
                }
            }
        }
    }

    async fn handle_tf(
        &self,
        session: &mut Session,
        workspace: &str,
        action: TfAction,
    ) -> Result<(Reply, usize), (ApiError, usize, bool)> {
        let tofu = &self.app.tofu;
        let auth = session
            .req_header()
            .headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        if !auth::is_authorized(auth, &tofu.expected_bearer(workspace)) {
            return Err((ApiError::Unauthorized, 0, false));
        }
        let limit = match action {
            TfAction::Write { .. } => self.app.max_state_bytes,
            TfAction::Lock | TfAction::Unlock => MAX_LOCK_BODY,
            TfAction::Get | TfAction::Delete => 0,
        };
        let (body, _reserved) = read_body(session, limit, &self.app.body_budget)
            .await
            .map_err(|e| (e, 0, false))?;
        let read = body.len();
        let fail = |e: ApiError| (e, read, true);
        let reply = match action {
            TfAction::Get => match tofu.get(workspace).await.map_err(fail)? {
                Some(state) => Reply::json(200, state),
                None => error_reply(&ApiError::NotFound(format!(
                    "workspace {workspace:?} has no state yet"
                ))),
            },
            TfAction::Write { lock_id } => {
                let md5 = session
                    .req_header()
                    .headers
                    .get("content-md5")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                verify_content_md5(md5.as_deref(), &body).map_err(fail)?;
                tofu.write(workspace, lock_id, body).await.map_err(fail)?;
                Reply::empty()
            }
            TfAction::Lock => {
                tofu.lock(workspace, &body).await.map_err(fail)?;
                Reply::empty()
            }
            TfAction::Unlock => {
                tofu.unlock(workspace, &body).await.map_err(fail)?;
                Reply::empty()
            }
            TfAction::Delete => {
                tofu.delete(workspace).await.map_err(fail)?;
                Reply::empty()
            }
        };
        Ok((reply, read))
    }
}

fn error_reply(e: &ApiError) -> Reply {
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
async fn read_body(
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
async fn write_reply(session: &mut Session, reply: Reply, keepalive: bool) -> Result<()> {
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
