//! pingora glue: the `ProxyHttp` implementation that answers stategate's own
//! routes in `request_filter` and forwards everything else upstream.
//!
//! The rooms: `router` parses a request line, `tofu` and `cluster` frame the two
//! APIs, `admin` and `ui` the operator API and the web UI, `pass_through` decides
//! S3 requests (with `upstream` and `conditional`), `body` reads bounded bodies and
//! writes replies, `edge` bounds every request's head and completes every answer's
//! security headers (the pass-through's bytes never run with the UI's authority),
//! `login_guard` refuses cross-site and too frequent logins, `error` is the one
//! mapping of domain and edge errors to statuses and bodies. None of them touch SQL
//! or blobs; they call the domain modules with plain values.

mod admin;
pub mod auth;
pub mod body;
mod cluster;
pub mod conditional;
pub mod edge;
pub mod error;
mod guard;
pub mod login_guard;
pub mod mtls;
pub mod params;
pub mod pass_through;
pub mod router;
pub mod s3_target;
pub mod sigv4;
pub mod store_keys;
mod tofu;
mod ui;
pub mod upstream;

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};

use crate::metrics::Metrics;
use crate::tofu::TofuBackend;
use body::{error_reply, write_reply, Handled};
pub use body::{BodyBudget, BodyLimits, Reply};
use pass_through::{no_upstream, s3_reply, Decision};
use router::Endpoint;

/// Error type of a conditional PUT aborted because its turn's hold ran out.
const HOLD_EXPIRED: &str = "ConditionalHoldExpired";

/// Everything a request handler needs.
pub struct App {
    pub tofu: TofuBackend,
    pub max_state_bytes: u64,
    /// Memory for request and state bodies, shared by all requests.
    pub body_budget: BodyBudget,
    /// How slowly a client may send a body.
    pub body_limits: BodyLimits,
    pub metrics: Metrics,
    /// Where non-stategate requests are forwarded; `None` answers them 404.
    pub upstream: Option<upstream::Upstream>,
    /// Makes conditional PUTs through the pass-through atomic; `None` forwards them as-is.
    pub conditional: Option<conditional::ConditionalGuard>,
    /// The cluster tfstate & lock API.
    pub cluster: crate::cluster::ClusterService,
    /// Requests in flight, so a stopping server exits as soon as they are done.
    pub inflight: crate::drain::Inflight,
    /// The operator surface (admin API), over the same engine.
    pub operator: crate::operator::Operations,
    /// The listener serves TLS (the UI's session cookie is then `Secure`).
    pub tls: bool,
    /// Drift checks: history, on-demand runs and approvals (admin API), metrics.
    pub drift: crate::drift::DriftService,
    /// The keyring: its census, rotation and retirement (admin API).
    pub keys: crate::keys::Keyring,
    /// The bearer `/metrics` requires; `None` serves it to anyone who can connect.
    pub metrics_token: Option<crate::config::Secret>,
    /// Cross-site refusal and throttling of UI logins.
    pub login_guard: login_guard::LoginGuard,
    /// What a verified client certificate may do (`[[tls.client_grants]]`).
    pub client_grants: crate::tofu::certificate::Grants,
    /// The UI's sessions and reveal tickets.
    pub sessions: crate::ui::session::Sessions,
    /// Single sign-on for the UI (`[oidc]`); `None` when not configured.
    pub sso: Option<crate::ui::oidc::Sso>,
    /// The address Terraform reaches this server at (`address::for_clients`), for the
    /// UI's "Connect Terraform" panel.
    pub client_url: String,
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

/// Per-request facts for the summary log line.
#[derive(Default)]
pub struct RequestCtx {
    route: &'static str,
    workspace: Option<String>,
    /// Set when the request is being forwarded upstream (logged in `logging`).
    proxied_since: Option<Instant>,
    /// Held until the forwarded conditional PUT completes (see `conditional`).
    conditional_turn: Option<conditional::HeldTurn>,
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
        // A client that reads its response slower than the minimum rate is cut off
        // (pingora derives each write's timeout from its size), local or proxied.
        let rate = self.app.body_limits.min_bytes_per_second;
        session.set_min_send_rate(Some(rate.clamp(1, usize::MAX as u64) as usize));
        let header = session.req_header();
        if edge::head_too_large(header) {
            // Before routing: no route buffers or parses an oversized head any further.
            let mut reply = Reply::json(
                431,
                r#"{"error":"request header fields too large (at most 16 KiB per line, 64 KiB in all)"}"#,
            );
            edge::finish_local(&mut reply.headers, self.app.tls);
            ctx.route = "invalid";
            self.app.metrics.observe(ctx.route, 431, 0.0);
            tracing::info!(route = ctx.route, status = 431, "request head too large");
            write_reply(session, reply, false).await?;
            return Ok(true);
        }
        let method = header.method.as_str().to_string();
        let path = header.uri.path().to_string();
        let query = header.uri.query().map(str::to_string);

        let endpoint = router::route(&method, &path, query.as_deref());
        ctx.route = endpoint.as_ref().map_or("invalid", Endpoint::name);
        match &endpoint {
            Ok(Endpoint::Tf { workspace, .. }) => ctx.workspace = Some(workspace.to_string()),
            Ok(Endpoint::Cluster { id, .. }) => ctx.workspace = Some(format!("cluster/{id}")),
            Ok(Endpoint::Admin(Ok(action))) => {
                ctx.workspace = action.workspace().map(str::to_string)
            }
            Ok(Endpoint::Ui(route)) => ctx.workspace = route.workspace().map(str::to_string),
            _ => {}
        }
        let handled = match endpoint {
            Ok(Endpoint::Upstream) => {
                match pass_through::decide(&self.app, session, &method, &path, query.as_deref())
                    .await
                {
                    Decision::Forward { turn } => {
                        if let Some(turn) = &turn {
                            // A client that goes silent is cut off, not only a slow one.
                            session.set_read_timeout(Some(turn.limit()));
                        }
                        ctx.conditional_turn = turn;
                        ctx.proxied_since = Some(started);
                        return Ok(false);
                    }
                    Decision::Answer(reply) => Handled::unread(reply),
                }
            }
            Ok(endpoint) => self.handle(session, endpoint).await,
            Err(e) => Handled::unread(error_reply(&e)),
        };
        let Handled {
            mut reply,
            bytes_in,
            keepalive,
            held,
        } = handled;
        edge::finish_local(&mut reply.headers, self.app.tls);
        let bytes_out = reply.body.len();
        let status = reply.status;
        // A refusal's reason in the log as in the body: a client such as Terraform shows
        // only the status ("Unexpected HTTP response code 400"), so the operator reads
        // the why here.
        let refusal = reply.refusal.take();
        write_reply(session, reply, keepalive).await?;
        drop(held);
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        self.app.metrics.observe(ctx.route, status, ms / 1000.0);
        tracing::info!(
            method = %method,
            route = ctx.route,
            workspace = ctx.workspace.as_deref().unwrap_or("-"),
            status,
            bytes_in,
            bytes_out,
            ms = format_args!("{ms:.1}"),
            refusal = refusal.as_deref(),
            "request"
        );
        Ok(true)
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        if let Some(turn) = &ctx.conditional_turn {
            turn.body_progress(end_of_stream).map_err(|_| {
                pingora::Error::explain(
                    ErrorType::Custom(HOLD_EXPIRED),
                    "the conditional PUT's body did not arrive in time",
                )
            })?;
        }
        Ok(())
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut Self::CTX,
    ) -> Result<Box<HttpPeer>> {
        let Some(up) = &self.app.upstream else {
            // request_filter answers every request itself when there is no upstream.
            return Err(pingora::Error::explain(
                ErrorType::HTTPStatus(404),
                "no upstream configured",
            ));
        };
        let addr = tokio::net::lookup_host((up.host.as_str(), up.port))
            .await
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| {
                pingora::Error::explain(
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
                _ if e.etype() == &ErrorType::Custom(HOLD_EXPIRED) => (
                    408,
                    "RequestTimeout",
                    "the body of a conditional write did not arrive in time; the write was not made",
                ),
                ErrorSource::Downstream if e.etype() == &ErrorType::ReadTimedout => (
                    408,
                    "RequestTimeout",
                    "the request body did not arrive in time",
                ),
                ErrorSource::Downstream => (400, "BadRequest", "the request could not be read"),
                _ => (
                    502,
                    "BadGateway",
                    "stategate could not get a response from the upstream S3 endpoint",
                ),
            };
            let path = session.req_header().uri.path().to_string();
            let mut reply = s3_reply(status, code, message, &path);
            edge::finish_local(&mut reply.headers, self.app.tls);
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

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        _ctx: &mut Self::CTX,
    ) -> Result<()> {
        // Only forwarded answers pass here: local ones leave through `write_reply`.
        edge::finish_proxied(upstream_response, self.app.tls)
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

impl Gateway {
    /// The metrics text, with lock and lease ages read at scrape time (an alert on a
    /// stale lock needs the age now, not at the last request).
    async fn metrics_text(&self) -> Vec<u8> {
        match self.app.operator.held_locks().await {
            Ok((locks, leases)) => self.app.metrics.set_held_locks(&locks, &leases),
            Err(e) => tracing::warn!(error = %e, "cannot read lock ages for /metrics"),
        }
        match self.app.drift.metric_rows().await {
            Ok(rows) => self.app.metrics.set_drift(&rows),
            Err(e) => tracing::warn!(error = %e, "cannot read drift outcomes for /metrics"),
        }
        match self.app.tofu.store().totals().await {
            Ok((versions, bytes)) => self.app.metrics.set_stored(versions, bytes),
            Err(e) => tracing::warn!(error = %e, "cannot count versions for /metrics"),
        }
        self.app.metrics.render()
    }

    /// May this request read `/metrics`: no token configured, or it presents that bearer.
    fn may_scrape(&self, session: &Session) -> bool {
        self.app
            .metrics_token
            .as_ref()
            .is_none_or(|token| auth::is_authorized(auth::authorization(session), token.expose()))
    }

    async fn handle(&self, session: &mut Session, endpoint: Endpoint) -> Handled {
        match endpoint {
            // A node whose clock cannot be trusted is not healthy: a load balancer
            // takes it out, and an operator reads why.
            Endpoint::Health => match crate::tokens::clock_distrusted() {
                None => Handled::done(Reply::json(200, r#"{"status":"ok"}"#), 0),
                Some(why) => {
                    let body = serde_json::json!({ "status": "unavailable", "reason": why });
                    Handled::done(Reply::json(503, body.to_string()), 0)
                }
            },
            Endpoint::Metrics if !self.may_scrape(session) => {
                // The same answer for a missing and a wrong bearer; nothing is read.
                let mut reply = error_reply(&crate::error::Error::Unauthenticated);
                reply.headers.push((
                    "WWW-Authenticate",
                    "Bearer realm=\"stategate metrics\"".into(),
                ));
                Handled::done(reply, 0)
            }
            Endpoint::Metrics => Handled::done(
                Reply {
                    stream: None,
                    refusal: None,
                    status: 200,
                    body: self.metrics_text().await.into(),
                    content_type: "text/plain; version=0.0.4",
                    headers: Vec::new(),
                },
                0,
            ),
            // Decided in `request_filter` (`pass_through`); kept total without a panic.
            Endpoint::Upstream => Handled::unread(error_reply(&no_upstream())),
            // Every other route judges what has expired (tokens, sessions, freezes,
            // leases, lock ages) by this node's clock: refused, whoever asks, while
            // that clock is out of bounds (`/healthz` says why).
            _ if crate::tokens::clock_distrusted().is_some() => {
                Handled::unread(error_reply(&crate::error::Error::Unavailable(
                    "this node's clock is out of step with the index; retry on another node".into(),
                )))
            }
            Endpoint::Admin(action) => admin::handle(&self.app, session, action)
                .await
                .unwrap_or_else(Handled::from),
            Endpoint::Ui(route) => ui::handle(&self.app, session, route).await,
            Endpoint::Cluster { id, action } => cluster::handle(&self.app, session, id, action)
                .await
                .unwrap_or_else(Handled::from),
            Endpoint::Tf { workspace, action } => {
                tofu::handle(&self.app, session, &workspace, action)
                    .await
                    .unwrap_or_else(Handled::from)
            }
        }
    }
}
