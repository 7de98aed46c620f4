//! HTTP framing for the web UI (`crate::ui`): the session cookie first (no session →
//! 303 to the login page, before anything is read or shown; a login first passes
//! `login_guard`: same origin, not throttled, an operator token's shape), then whether
//! the operator's role allows the route (`super::guard`: 403, nothing read), then the form body
//! (bounded, urlencoded) and its CSRF token, then one `Operations` (or, for drift,
//! `DriftService`) call and its page.
//! Every answer carries the UI's security headers. No SQL or blobs here.

use bytes::Bytes;
use maud::Markup;
use pingora::proxy::Session;

use super::body::{read_body, Handled, Reply};
use super::error::{EdgeError, HttpError};
use super::login_guard::{self, LoginRequest, Refusal};
use super::params::{form_number, form_required, WorkspaceName};
use super::router::UiRoute;
use super::App;
use crate::drift::MAX_LIST;
use crate::error::Error;
use crate::operator::diff::mask_state;
use crate::operator::Reveal;
use crate::store::audit::AuditFilter;
use crate::store::WriteOutcome;
use crate::tokens::now;
use crate::ui::access_pages;
use crate::ui::drift_pages::{self, RunsView};
use crate::ui::layout::Chrome;
use crate::ui::pages::{self, AuditForm, Content, Notice, VersionsPage};
use crate::ui::session::{self, UiSession};

/// Largest form body (a token, a version number, a lock ID, a CSRF token).
const MAX_FORM: u64 = 8192;
/// Resource changes the workspace page shows (the newest).
const TIMELINE_ROWS: u32 = 20;

/// Versions per page of the workspace page.
const VERSIONS_PER_PAGE: u32 = 20;
/// The events the audit page hides unless asked: every `ui.login*`.
const LOGIN_EVENTS: &str = "ui.login";

/// Audit rows per page.
const AUDIT_PER_PAGE: u32 = 50;
/// Drift runs listed when no `limit` is given.
const DRIFT_RUNS: u32 = 50;
/// Where a request without a session is sent.
const LOGIN: &str = "/ui/login";

/// Sent with every UI response (`Cache-Control: no-store` is on every local reply).
/// The UI runs no script at all: `script-src 'none'` also keeps a page of ours from
/// ever loading one the pass-through serves from this origin.
const SECURITY_HEADERS: [(&str, &str); 3] = [
    (
        "Content-Security-Policy",
        "default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
];

/// What a UI handler answers, before the security headers.
enum Answer {
    Page(u16, Markup),
    /// A page, setting these cookies.
    PageCookies(u16, Markup, Vec<String>),
    /// 303 to a path of ours, setting these cookies.
    Redirect(String, Vec<String>),
    /// 303 to the single sign-on provider's authorization URL (the only answer that
    /// sends the browser elsewhere), setting these cookies.
    ToProvider(String, Vec<String>),
    /// 429: too many logins; retry after this many seconds (the login page, with
    /// the single sign-on button when there is one).
    Throttled(u64, Option<String>),
    Stylesheet,
    Favicon,
    /// A version's content as a download.
    File {
        name: String,
        body: Vec<u8>,
    },
}

impl Answer {
    fn into_reply(self) -> Reply {
        let mut reply = match self {
            Answer::Page(status, markup) => html(status, markup),
            Answer::PageCookies(status, markup, cookies) => {
                let mut r = html(status, markup);
                for c in cookies {
                    r.headers.push(("Set-Cookie", c));
                }
                r
            }
            Answer::Redirect(to, cookies) | Answer::ToProvider(to, cookies) => {
                let mut r = html(303, maud::html! { a href=(to) { "Continue" } });
                r.headers.push(("Location", to));
                for c in cookies {
                    r.headers.push(("Set-Cookie", c));
                }
                r
            }
            Answer::Throttled(seconds, sso) => {
                let message = format!(
                    "Too many login attempts; try again in {seconds} s. Nothing was checked."
                );
                let mut r = html(429, pages::login(Some(&message), sso.as_deref()));
                r.headers.push(("Retry-After", seconds.to_string()));
                r
            }
            Answer::Stylesheet => Reply {
                content_type: "text/css; charset=utf-8",
                ..Reply::json(200, Bytes::from_static(crate::ui::STYLESHEET.as_bytes()))
            },
            Answer::Favicon => Reply {
                content_type: "image/x-icon",
                ..Reply::json(200, Bytes::from_static(crate::ui::FAVICON))
            },
            Answer::File { name, body } => {
                let mut r = Reply::json(200, body);
                r.headers.push((
                    "Content-Disposition",
                    format!("attachment; filename=\"{name}\""),
                ));
                r
            }
        };
        for (name, value) in SECURITY_HEADERS {
            reply.headers.push((name, value.to_string()));
        }
        reply
    }
}

fn html(status: u16, markup: Markup) -> Reply {
    Reply {
        content_type: "text/html; charset=utf-8",
        ..Reply::json(status, markup.into_string())
    }
}

/// The value of cookie `name`, from any `Cookie` header.
fn cookie(session: &Session, name: &str) -> Option<String> {
    session
        .req_header()
        .headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|header| session::cookie_in(header, name))
        .map(str::to_string)
}

/// The session cookie's value.
fn cookie_value(session: &Session) -> Option<String> {
    cookie(session, session::COOKIE)
}

/// What a refused login shows, whatever the reason (a wrong, revoked or expired token,
/// a single sign-on refused at any step, a user whose groups map to no role).
const REFUSED_LOGIN: &str = "Login refused: that is not a valid operator token or single sign-on (wrong, revoked, expired, or not given a role). Nothing was changed.";

/// The single sign-on provider's name for the login page, when there is one.
fn sso_name(app: &App) -> Option<&str> {
    app.sso.as_ref().map(|sso| sso.display_name())
}

/// The login page with `message`, as a refused login answers it.
fn refused_login(app: &App, cookies: Vec<String>) -> Answer {
    Answer::PageCookies(
        401,
        pages::login(Some(REFUSED_LOGIN), sso_name(app)),
        cookies,
    )
}

/// Name of the cookie that remembers the page a login should return to. Sent only
/// to the login form's path, and only a UI page (`login_guard::return_path`) is
/// ever stored in it or followed from it.
const RETURN_COOKIE: &str = "sg_return";
/// How long the page to return to is remembered (seconds).
const RETURN_SECONDS: u32 = 600;

fn return_cookie(path: &str, max_age: u32, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{RETURN_COOKIE}={path}; HttpOnly; SameSite=Strict; Path={LOGIN}; Max-Age={max_age}{secure}")
}

/// The page the login should return to, from the request's cookies.
fn return_to(session: &Session) -> Option<String> {
    cookie(session, RETURN_COOKIE)
        .as_deref()
        .and_then(login_guard::return_path)
        .map(str::to_string)
}

/// Where a request without a session goes: the login form, remembering a page it
/// asked for (only a GET of a UI page) so the login can return there.
fn to_login(app: &App, session: &Session) -> Answer {
    let request = session.req_header();
    let remembered = (request.method == http::Method::GET)
        .then(|| request.uri.path_and_query().map(|p| p.as_str()))
        .flatten()
        .and_then(login_guard::return_path)
        .map(|page| return_cookie(page, RETURN_SECONDS, app.tls));
    Answer::Redirect(LOGIN.into(), remembered.into_iter().collect())
}

fn error_page(chrome: Option<&Chrome>, e: impl Into<EdgeError>) -> Answer {
    let e = e.into();
    let status = e.http_status();
    if let Some(detail) = e.log_detail().filter(|_| status >= 500) {
        tracing::error!(status, error = detail, "ui request failed");
    }
    let frozen = match &e {
        EdgeError::Domain(Error::Locked { holder_info }) => {
            crate::tofu::freeze::refusal(holder_info)
        }
        _ => None,
    };
    let (message, holder) = match (&e, frozen) {
        // A freeze's refusal is no lock holder's: say what it is and what to do.
        (_, Some(f)) => (
            format!(
                "The {} ({}). Nothing was changed: wait for the freeze to end, or unfreeze the workspace on its page.",
                f.info, f.who
            ),
            None,
        ),
        (EdgeError::Domain(Error::Locked { holder_info }), None) => {
            let info: serde_json::Value = serde_json::from_slice(holder_info).unwrap_or_default();
            let field = |k: &str| info[k].as_str().unwrap_or("?").chars().take(256).collect();
            let operation: String = field("Operation");
            (
                e.to_string(),
                Some((field("Who"), crate::operator::operation_name(&operation))),
            )
        }
        (other, None) => (operator_words(other), None),
    };
    let holder = holder
        .as_ref()
        .map(|(w, o): &(String, String)| (w.as_str(), o.as_str()));
    Answer::Page(status, pages::error(chrome, status, &message, holder))
}

/// An error as an operator reads it: workspaces by name, not by their internal scope
/// (`tf/prod has no version 9` → `Workspace prod has no version 9.`).
fn operator_words(e: &EdgeError) -> String {
    let text = e.to_string();
    match e {
        EdgeError::MethodNotAllowed { .. } => {
            "This address is not a page; open it from the UI's own links and forms. Nothing was done."
                .into()
        }
        EdgeError::Domain(Error::NotFound(_) | Error::Conflict(_)) => match text.strip_prefix("tf/") {
            Some(rest) => format!("Workspace {rest}."),
            None => text,
        },
        _ => text,
    }
}

pub(super) async fn handle(app: &App, session: &mut Session, route: UiRoute) -> Handled {
    // A request that may carry a body keeps its connection only once the body is read.
    let bodiless = matches!(
        session.req_header().method,
        http::Method::GET | http::Method::HEAD
    );
    let (answer, bytes_in, consumed) = serve(app, session, route).await;
    let reply = answer.into_reply();
    if consumed || bodiless {
        Handled::done(reply, bytes_in)
    } else {
        Handled::unread(reply)
    }
}

/// The answer, the body bytes read and whether the body was consumed.
async fn serve(app: &App, session: &mut Session, route: UiRoute) -> (Answer, usize, bool) {
    match route {
        UiRoute::Stylesheet => return (Answer::Stylesheet, 0, false),
        UiRoute::Favicon => return (Answer::Favicon, 0, false),
        _ => {}
    }
    let now = now();
    let cookie = cookie_value(session);
    let current = match &cookie {
        None => None,
        Some(c) => match app.sessions.find(c, now).await {
            Ok(found) => found,
            Err(e) => return (error_page(None, e), 0, false),
        },
    };
    let current = match current {
        Some(me) if me.sso => {
            match crate::ui::oidc::recheck_session(app.sso.as_ref(), &app.sessions, me).await {
                Ok(me) => me,
                Err(e) => return (error_page(None, e), 0, false),
            }
        }
        other => other,
    };
    match (&route, current) {
        (UiRoute::LoginForm, Some(_)) => (redirect("/ui/"), 0, false),
        (UiRoute::LoginForm, None) => (
            Answer::Page(200, pages::login(None, sso_name(app))),
            0,
            false,
        ),
        (UiRoute::Login, _) => login(app, session, now).await,
        (UiRoute::SsoStart, _) => (sso_start(app, session).await, 0, false),
        (UiRoute::SsoCallback { .. }, _) => {
            let UiRoute::SsoCallback {
                state,
                code,
                error,
                iss,
            } = route
            else {
                return (
                    error_page(None, Error::NotFound("no such page".into())),
                    0,
                    false,
                );
            };
            let callback = CallbackQuery {
                state,
                code,
                error,
                iss,
            };
            (sso_callback(app, session, callback, now).await, 0, false)
        }
        (_, None) => (to_login(app, session), 0, false),
        (_, Some(me)) => {
            let chrome = Chrome {
                email: &me.operator.email,
                csrf: &me.csrf,
                grant: &me.operator.grant,
                now,
            };
            // May this operator do this? Before the form is read (403, one page for
            // every reason; nothing changes).
            let need = super::guard::ui_need(&route);
            if let Err(e) = super::guard::permit(app, &me.operator, route.name(), need).await {
                return (error_page(Some(&chrome), e), 0, false);
            }
            if !route.takes_form() {
                let answer = page(app, &chrome, &me, route)
                    .await
                    .unwrap_or_else(|e| error_page(Some(&chrome), e));
                return (answer, 0, false);
            }
            // A form another site's page posted (its Origin or Sec-Fetch-Site says so)
            // is refused before it is read, even with the right CSRF token: the
            // token is the defence, this is the second one.
            if !same_origin(app, session) {
                let refused = Error::Refused(
                    "this form was not sent by this UI (another site's page posted it); nothing was changed".into(),
                );
                return (error_page(Some(&chrome), refused), 0, false);
            }
            let form = match read_form(app, session).await {
                Ok(form) => form,
                Err(e) => return (error_page(Some(&chrome), e), 0, false),
            };
            let read = form.len;
            if !session::csrf_matches(&me, form.get("csrf")) {
                let refused = Error::Refused(
                    "this form is stale or was not sent by this UI (CSRF token mismatch); nothing was changed".into(),
                );
                return (error_page(Some(&chrome), refused), read, true);
            }
            let answer = action(app, &me, cookie.as_deref(), route, &form)
                .await
                .unwrap_or_else(|e| error_page(Some(&chrome), e));
            (answer, read, true)
        }
    }
}

fn redirect(to: &str) -> Answer {
    Answer::Redirect(to.to_string(), Vec::new())
}

/// A decoded form body (the first value of each name).
struct Form {
    fields: Vec<(String, String)>,
    len: usize,
}

impl Form {
    fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn read_form(app: &App, session: &mut Session) -> Result<Form, EdgeError> {
    let (body, _held) = read_body(session, MAX_FORM, &app.body_budget, app.body_limits).await?;
    Ok(Form {
        fields: form_urlencoded::parse(&body).into_owned().collect(),
        len: body.len(),
    })
}

/// Was this request sent from this server's own pages (`login_guard`'s rule)?
fn same_origin(app: &App, session: &Session) -> bool {
    let headers = &session.req_header().headers;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    app.login_guard.same_origin(LoginRequest {
        origin: header("origin"),
        sec_fetch_site: header("sec-fetch-site"),
        host: header("host"),
    })
}

async fn login(app: &App, session: &mut Session, now: i64) -> (Answer, usize, bool) {
    // Before the body is read or the token looked at: a login from another site's
    // page, or one too many, is refused here and costs the writer nothing.
    let headers = &session.req_header().headers;
    let header = |name: http::header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let request = LoginRequest {
        origin: header(http::header::ORIGIN),
        sec_fetch_site: headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()),
        host: header(http::header::HOST),
    };
    let client = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip());
    match app
        .login_guard
        .admit(request, client, std::time::Instant::now())
    {
        Ok(()) => {}
        Err(Refusal::CrossSite) => return (error_page(None, cross_site()), 0, false),
        Err(Refusal::Throttled { retry_after }) => {
            return (
                Answer::Throttled(retry_after, sso_name(app).map(str::to_string)),
                0,
                false,
            );
        }
    }
    let form = match read_form(app, session).await {
        Ok(form) => form,
        Err(e) => return (error_page(None, e), 0, false),
    };
    let token = form.get("token").unwrap_or("").trim().as_bytes().to_vec();
    // A token that cannot be an operator token is refused like a wrong one, without a lookup.
    let opened = if !login_guard::plausible_operator_token(&token) {
        Ok(None)
    } else {
        app.sessions.log_in(token, now).await
    };
    let answer = match opened {
        Ok(Some(opened)) => {
            let mut cookies = vec![session::set_cookie(&opened.cookie_value, app.tls)];
            let to = return_to(session);
            if to.is_some() {
                cookies.push(return_cookie("", 0, app.tls));
            }
            Answer::Redirect(to.unwrap_or_else(|| "/ui/".into()), cookies)
        }
        Ok(None) => refused_login(app, Vec::new()),
        Err(e) => error_page(None, e),
    };
    (answer, form.len, true)
}

/// The refusal of a login from another site's page, whatever it tried.
fn cross_site() -> Error {
    Error::Refused(
        "this login was not sent from this server's own login page; nothing was done".into(),
    )
}

/// The client's address, for the login throttle.
fn client_ip(session: &Session) -> Option<std::net::IpAddr> {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip())
}

/// Name of the cookie that binds a started single sign-on to this browser. `Lax`:
/// it must come back on the provider's cross-site redirect to the callback; sent
/// only under the sign-on paths.
const SSO_COOKIE: &str = "sg_sso";

fn sso_cookie(value: &str, max_age: u64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{SSO_COOKIE}={value}; HttpOnly; SameSite=Lax; Path=/ui/login/oidc; Max-Age={max_age}{secure}")
}

/// `GET /ui/login/oidc`: from our own login page only, throttled like a login, then
/// 303 to the provider with the binding cookie.
async fn sso_start(app: &App, session: &Session) -> Answer {
    let Some(sso) = &app.sso else {
        return error_page(None, Error::NotFound("no such page".into()));
    };
    let headers = &session.req_header().headers;
    let header = |name: http::header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let request = LoginRequest {
        origin: header(http::header::ORIGIN),
        sec_fetch_site: headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()),
        host: header(http::header::HOST),
    };
    match app
        .login_guard
        .admit(request, client_ip(session), std::time::Instant::now())
    {
        Ok(()) => {}
        Err(Refusal::CrossSite) => return error_page(None, cross_site()),
        Err(Refusal::Throttled { retry_after }) => {
            return Answer::Throttled(retry_after, Some(sso.display_name().to_string()))
        }
    }
    match sso.start(return_to(session)).await {
        Ok(started) => {
            let mut cookies = vec![sso_cookie(
                &started.binding,
                crate::ui::oidc::PENDING_SECONDS,
                app.tls,
            )];
            if return_to(session).is_some() {
                cookies.push(return_cookie("", 0, app.tls));
            }
            Answer::ToProvider(started.authorize_url, cookies)
        }
        Err(e) => {
            tracing::error!(error = %e, "single sign-on cannot start");
            Answer::Page(
                503,
                pages::login(
                    Some("Single sign-on is not available right now (the server could not reach the identity provider). Try again later, or log in with an operator token."),
                    Some(sso.display_name()),
                ),
            )
        }
    }
}

/// The callback's query values.
struct CallbackQuery {
    state: Option<String>,
    code: Option<String>,
    error: Option<String>,
    iss: Option<String>,
}

/// `GET /ui/login/oidc/callback`: it comes from the provider's site, so there is no
/// same-origin check, and no throttle either: it costs a lookup in memory unless it
/// names a sign-in that a (throttled) start made, and it uses that one up. Then
/// `ui::oidc` checks everything; a session is opened only for a verified user whose
/// groups map to a role. Every refusal is the same page; the reason is logged (never a
/// code or token).
async fn sso_callback(app: &App, session: &Session, query: CallbackQuery, now: i64) -> Answer {
    let Some(sso) = &app.sso else {
        return error_page(None, Error::NotFound("no such page".into()));
    };
    let binding = cookie(session, SSO_COOKIE);
    let clear = sso_cookie("", 0, app.tls);
    let finished = sso
        .finish(crate::ui::oidc::Callback {
            state: query.state.as_deref(),
            code: query.code.as_deref(),
            error: query.error.as_deref(),
            iss: query.iss.as_deref(),
            binding: binding.as_deref(),
        })
        .await;
    let signed = match finished {
        Ok(signed) => signed,
        Err(why) => {
            tracing::info!(reason = %why, "single sign-on refused");
            // The provider signed the user in; only the role is missing: say what to do.
            if matches!(why, crate::ui::oidc::Refused::NoRole) {
                return Answer::PageCookies(
                    403,
                    pages::sso_no_role(sso.display_name(), sso.groups_claim()),
                    vec![clear],
                );
            }
            return refused_login(app, vec![clear]);
        }
    };
    let lifetime = sso.session_max_age();
    let opened = sso
        .open_session(signed.identity, signed.grant, signed.tokens, now)
        .await;
    match opened {
        Ok(Some(opened)) => {
            let to = signed.return_to.unwrap_or_else(|| "/ui/".into());
            Answer::PageCookies(
                200,
                pages::signed_in(&to),
                vec![
                    session::set_cookie_for(&opened.cookie_value, lifetime, app.tls),
                    clear,
                ],
            )
        }
        Ok(None) => {
            tracing::info!(
                reason = %crate::ui::oidc::Refused::NameTaken,
                "single sign-on refused"
            );
            refused_login(app, vec![clear])
        }
        Err(e) => error_page(None, e),
    }
}

fn text(value: Option<String>) -> Option<String> {
    value
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The read-only pages.
///
/// Long because: one arm per page of the route table, each a call with plain values;
/// splitting the match would only move the dispatch.
async fn page(
    app: &App,
    chrome: &Chrome<'_>,
    me: &UiSession,
    route: UiRoute,
) -> Result<Answer, EdgeError> {
    let ops = &app.operator;
    let ok = |markup| Ok(Answer::Page(200, markup));
    match route {
        UiRoute::Workspaces { filter } => {
            let filter = filter.unwrap_or_default();
            let needle = filter.trim().to_lowercase();
            let rows: Vec<_> = ops
                .list_workspaces(chrome.grant)
                .await?
                .into_iter()
                .filter(|w| w.name.to_lowercase().contains(&needle))
                .collect();
            ok(pages::workspaces(chrome, &rows, &filter))
        }
        UiRoute::Workspace {
            workspace: w,
            page,
            rolled_back,
            unlocked,
            write_allowed,
        } => {
            let w = w.as_str();
            let summary = match ops.workspace(w).await {
                Ok(summary) => summary,
                // A name nothing wrote to yet: how to connect Terraform (still a 404).
                // With names close to it the reader may see, "Did you mean".
                Err(Error::NotFound(_)) => {
                    let visible = ops.list_workspaces(chrome.grant).await?;
                    let close = pages::close_names(w, visible.iter().map(|s| s.name.as_str()));
                    return Ok(Answer::Page(
                        404,
                        pages::empty_workspace(chrome, w, &app.client_url, &close),
                    ));
                }
                Err(e) => return Err(e.into()),
            };
            let page = page
                .and_then(|p| u32::try_from(p).ok())
                .unwrap_or(1)
                .min(100_000);
            let skip = (page - 1) * VERSIONS_PER_PAGE;
            let rows = match ops
                .history(w, Some(skip + VERSIONS_PER_PAGE + 1), chrome.grant)
                .await
            {
                Ok(rows) => rows,
                Err(Error::NotFound(_)) => Vec::new(), // only a lock so far
                Err(e) => return Err(e.into()),
            };
            let has_more = rows.len() > (skip + VERSIONS_PER_PAGE) as usize;
            let rows: Vec<_> = rows
                .into_iter()
                .skip(skip as usize)
                .take(VERSIONS_PER_PAGE as usize)
                .collect();
            let shown = match (rolled_back, unlocked) {
                (Some(v), _) => Some(Notice::RolledBack(v)),
                (_, Some(true)) => Some(Notice::Unlocked),
                (_, Some(false)) => Some(Notice::WasNotLocked),
                _ if write_allowed => Some(Notice::WriteAllowed),
                _ => None,
            };
            let timeline = match ops.timeline(w, None, TIMELINE_ROWS, chrome.grant).await {
                Ok(rows) => rows,
                Err(Error::NotFound(_)) => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            let versions = VersionsPage {
                rows: &rows,
                page,
                has_more,
                timeline: &timeline,
            };
            let drift = app
                .drift
                .checks()
                .await?
                .into_iter()
                .find(|c| c.workspace == w);
            let site = crate::operator::roles::Target::Site;
            let tokens = if chrome
                .grant
                .may(crate::operator::roles::Action::Administer, site)
            {
                let mut all = app.tofu.list_tokens().await?;
                all.retain(|t| t.revoked_at.is_none() && t.covers(w));
                Some(all)
            } else {
                None
            };
            // Who may read its outputs: for whoever may administer it (the guard's
            // rule for the consumers routes), names it may not see redacted.
            let consumers = if chrome.may(crate::operator::roles::Action::Administer, w) {
                Some(ops.consumers(w, chrome.grant).await?)
            } else {
                None
            };
            ok(pages::workspace(
                chrome,
                &summary,
                &versions,
                shown,
                drift.as_ref(),
                tokens.as_deref(),
                consumers.as_deref(),
                &app.client_url,
            ))
        }
        UiRoute::Version {
            workspace: w,
            version,
            reveal,
        } => {
            let v = version;
            if let Some(ticket) = reveal.filter(|t| !t.is_empty()) {
                return version_with_ticket(app, chrome, me, &w, v, &ticket).await;
            }
            let w = w.as_str();
            let (row, body) = ops.show(w, Some(v)).await?;
            let content = json_content(mask_state(&body, row.version).ok());
            ok(pages::version(
                chrome,
                w,
                &row,
                &content,
                pages::Shown::Masked,
            ))
        }
        UiRoute::PostOnly { page } => Ok(redirect(&page_href(&page)?)),
        UiRoute::RollbackPreview { workspace: w, to } => {
            let preview = ops.rollback_preview(&w, to).await?;
            ok(pages::rollback_preview(chrome, &w, &preview))
        }
        UiRoute::Search { q } => {
            let query = q.unwrap_or_default();
            if query.trim().is_empty() {
                return ok(pages::search(chrome, "", None));
            }
            let results = ops.search(&query, chrome.grant).await?;
            ok(pages::search(chrome, &query, Some(&results)))
        }
        UiRoute::Diff {
            workspace: w,
            from,
            to,
        } => {
            let d = ops.diff(&w, from, to, chrome.grant).await?;
            ok(pages::diff(chrome, &w, from, to, &d))
        }
        UiRoute::Audit {
            scope,
            event,
            since,
            until,
            logins,
            before,
        } => {
            let form = AuditForm {
                scope: text(scope).unwrap_or_default(),
                event: text(event).unwrap_or_default(),
                since: text(since).unwrap_or_default(),
                until: text(until).unwrap_or_default(),
                logins: text(logins).is_some(),
            };
            // A field left blank is no filter; one that does not read as a time is the
            // page again, as typed, saying which field and what it takes (400).
            let instant = |t: &str| {
                (!t.is_empty())
                    .then(|| crate::store::audit::parse_instant(t))
                    .transpose()
            };
            let (since, until) = match (instant(&form.since), instant(&form.until)) {
                (Ok(since), Ok(until)) => (since, until),
                (since, until) => {
                    let invalid: Vec<pages::InvalidField> = [("since", since), ("until", until)]
                        .into_iter()
                        .filter(|(_, parsed)| parsed.is_err())
                        .map(|(field, _)| pages::InvalidField { field })
                        .collect();
                    let kinds = ops.audit_event_kinds().await?;
                    let view = pages::AuditView {
                        form: &form,
                        rows: &[],
                        kinds: &kinds,
                        older: None,
                        invalid: &invalid,
                    };
                    return Ok(Answer::Page(400, pages::audit(chrome, &view)));
                }
            };
            let filter = AuditFilter {
                scope: text(Some(form.scope.clone())),
                event: text(Some(form.event.clone())),
                since,
                until,
                before_id: before,
                // Logins flood the log: hidden unless asked for, by the box or by
                // filtering on their event.
                exclude: (!form.logins && form.event.is_empty()).then(|| LOGIN_EVENTS.into()),
            };
            let mut rows = ops.audit(filter, AUDIT_PER_PAGE, chrome.grant).await?;
            rows.reverse();
            let older = (rows.len() == AUDIT_PER_PAGE as usize)
                .then(|| rows.last().map(|r| older_href(&form, r.id)))
                .flatten();
            let kinds = ops.audit_event_kinds().await?;
            let view = pages::AuditView {
                form: &form,
                rows: &rows,
                kinds: &kinds,
                older: older.as_deref(),
                invalid: &[],
            };
            ok(pages::audit(chrome, &view))
        }
        UiRoute::Clusters => ok(pages::clusters(chrome, &ops.clusters().await?)),
        UiRoute::WorkspaceTokens { revoked } => ok(access_pages::tokens(
            chrome,
            &app.tofu.list_tokens().await?,
            revoked,
        )),
        UiRoute::Keys => ok(access_pages::keys(
            chrome,
            &app.keys.status(&crate::keys::quietly).await?,
        )),
        UiRoute::Drift {
            workspace: filter,
            limit,
        } => {
            let limit = limit.unwrap_or(DRIFT_RUNS);
            let (checks, runs) =
                super::guard::visible_drift(app, chrome.grant, filter.as_ref(), limit).await?;
            let shown = filter.map(|w| w.to_string()).unwrap_or_default();
            let more = (runs.len() == limit as usize && limit < MAX_LIST)
                .then(|| drift_more_href(&shown, (limit * 2).min(MAX_LIST)));
            let view = RunsView {
                workspace: &shown,
                limit,
                more,
            };
            ok(drift_pages::drift(chrome, &checks, &runs, &view))
        }
        UiRoute::DriftRun { run } => {
            let (run, output) = app.drift.show(run.get()).await?;
            ok(drift_pages::run(chrome, &run, &output))
        }
        UiRoute::NotFound => Err(Error::NotFound("no such page".into()).into()),
        UiRoute::Invalid(bad) => Err(Error::from(bad).into()),
        UiRoute::NotAllowed { allowed } => Err(EdgeError::MethodNotAllowed {
            method: "this method".into(),
            allowed,
        }),
        // Public or form routes never get here.
        UiRoute::Stylesheet
        | UiRoute::Favicon
        | UiRoute::LoginForm
        | UiRoute::Login
        | UiRoute::SsoStart
        | UiRoute::SsoCallback { .. }
        | UiRoute::Logout
        | UiRoute::Reveal { .. }
        | UiRoute::Download { .. }
        | UiRoute::Rollback { .. }
        | UiRoute::Unlock { .. }
        | UiRoute::AllowWrite { .. }
        | UiRoute::Freeze { .. }
        | UiRoute::Unfreeze { .. }
        | UiRoute::DriftCheck { .. }
        | UiRoute::DriftApply { .. }
        | UiRoute::RevokeWorkspaceToken { .. } => {
            Err(Error::NotFound("no such page".into()).into())
        }
    }
}

/// A state document as the viewer shows it; `None`: not a plain JSON state.
fn json_content(doc: Option<serde_json::Value>) -> Content {
    match doc {
        Some(doc) => Content::Json {
            text: serde_json::to_string_pretty(&doc).unwrap_or_default(),
            outline: crate::operator::paths::Outline::of(&doc),
        },
        None => Content::NotPlain,
    }
}

fn drift_more_href(workspace: &str, limit: u32) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    if !workspace.is_empty() {
        q.append_pair("workspace", workspace);
    }
    q.append_pair("limit", &limit.to_string());
    format!("/ui/drift?{}", q.finish())
}

fn older_href(form: &AuditForm, before: i64) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in [
        ("scope", &form.scope),
        ("event", &form.event),
        ("since", &form.since),
        ("until", &form.until),
    ] {
        if !v.is_empty() {
            q.append_pair(k, v);
        }
    }
    if form.logins {
        q.append_pair("logins", "1");
    }
    q.append_pair("before", &before.to_string());
    format!("/ui/audit?{}", q.finish())
}

/// The state-changing forms (CSRF already checked).
///
/// Long because: one arm per form of the route table (see [`page`]).
async fn action(
    app: &App,
    me: &UiSession,
    cookie: Option<&str>,
    route: UiRoute,
    form: &Form,
) -> Result<Answer, Error> {
    let ops = &app.operator;
    let actor = me.operator.actor();
    match route {
        UiRoute::Logout => {
            if let Some(c) = cookie {
                app.sessions.log_out(c, &me.sha256).await?;
            }
            Ok(Answer::Redirect(
                LOGIN.into(),
                vec![session::clear_cookie(app.tls)],
            ))
        }
        UiRoute::Reveal {
            workspace: w,
            version: v,
        } => {
            // POST-redirect-GET: the values are shown (and audited) by the GET this
            // ticket lets through once, so the address bar holds a reloadable page.
            let w = w.as_str();
            // An unknown, pruned or unreadable version is refused here, as before.
            ops.show(w, Some(v)).await?;
            let ticket = app.sessions.issue_reveal(&me.sha256, w, v, now()).await?;
            let mut q = form_urlencoded::Serializer::new(String::new());
            q.append_pair("reveal", &ticket);
            Ok(redirect(&format!(
                "{}?{}#content",
                pages::version_href(w, v),
                q.finish()
            )))
        }
        UiRoute::Download {
            workspace: w,
            version: v,
        } => {
            let w = w.as_str();
            let (row, body) = ops.reveal(w, Some(v), &actor, Reveal::UiDownload).await?;
            Ok(Answer::File {
                name: format!("{w}-v{}.tfstate", row.version),
                body,
            })
        }
        UiRoute::Rollback { workspace: w } => {
            let w = w.as_str();
            let to = form_required("to", form.get("to"))?;
            let from = form_number("from", form.get("from"))?;
            if form.get("confirm").map(str::trim) != Some(w) {
                return Err(Error::Invalid(
                    "type the workspace name exactly to confirm the rollback; nothing was changed"
                        .into(),
                ));
            }
            let done = ops.rollback(w, to, from, &actor).await?;
            let (WriteOutcome::Stored(row) | WriteOutcome::Unchanged(row)) = &done.outcome;
            Ok(redirect(&format!(
                "/ui/workspaces/{w}?rolled_back={}",
                row.version
            )))
        }
        UiRoute::Unlock { workspace: w } => {
            let w = w.as_str();
            if form.get("confirm") != Some("yes") {
                return Err(Error::Invalid(
                    "tick the confirmation to break the lock; nothing was changed".into(),
                ));
            }
            let lock_id = form
                .get("lock_id")
                .filter(|id| !id.is_empty())
                .map(str::to_string);
            if lock_id
                .as_deref()
                .is_some_and(|id| !crate::tfstate::is_safe_id(id, 256))
            {
                return Err(Error::Invalid("lock_id must be printable ASCII".into()));
            }
            let done = ops.unlock(w, lock_id, &actor).await?;
            let flag = if done.unlocked { 1 } else { 0 };
            Ok(redirect(&format!("/ui/workspaces/{w}?unlocked={flag}")))
        }
        // The same call as the admin API's and the CLI's allow-write.
        UiRoute::AllowWrite { workspace: w } => {
            let w = w.as_str();
            if form.get("confirm") != Some("yes") {
                return Err(Error::Invalid(
                    "tick the confirmation to allow the write; nothing was changed".into(),
                ));
            }
            let minutes = match form_number("minutes", form.get("minutes"))? {
                None => crate::tofu::guard::DEFAULT_OVERRIDE_MINUTES,
                Some(n) => u32::try_from(n).map_err(|_| {
                    Error::Invalid(crate::tofu::guard::BadOverride::Minutes.to_string())
                })?,
            };
            ops.allow_write(w, minutes, form.get("reason").unwrap_or(""), &actor)
                .await?;
            Ok(redirect(&format!("/ui/workspaces/{w}?write_allowed=1")))
        }
        // The same calls as the admin API's and the CLI's freeze and unfreeze.
        UiRoute::Freeze { workspace: w } => {
            let w = w.as_str();
            if form.get("confirm") != Some("yes") {
                return Err(Error::Invalid(
                    "tick the confirmation to freeze the workspace; nothing was changed".into(),
                ));
            }
            ops.freeze(
                w,
                form.get("reason").unwrap_or(""),
                None,
                form.get("for"),
                &actor,
            )
            .await?;
            Ok(redirect(&format!("/ui/workspaces/{w}#freeze")))
        }
        UiRoute::Unfreeze { workspace: w } => {
            let w = w.as_str();
            ops.unfreeze(w, &actor).await?;
            Ok(redirect(&format!("/ui/workspaces/{w}#freeze")))
        }
        // The same two calls as the admin API's `drift/{ws}/run` and `drift/{run}/apply`.
        UiRoute::DriftCheck { workspace: w } => {
            let w = w.as_str();
            let started = app.drift.start_check(w, &actor).await?;
            Ok(redirect(&drift_pages::run_href(app.drift.spawn(started))))
        }
        UiRoute::DriftApply { run } => {
            let id = run.get();
            let check = app.drift.run(id).await?;
            if form.get("confirm").map(str::trim) != Some(check.workspace.as_str()) {
                return Err(Error::Invalid(
                    "type the workspace name exactly to approve the plan; nothing was approved"
                        .into(),
                ));
            }
            let started = app.drift.approve(id, &actor).await?;
            Ok(redirect(&drift_pages::run_href(app.drift.spawn(started))))
        }
        // The same call as the admin API's and the CLI's `token revoke`.
        UiRoute::RevokeWorkspaceToken { token } => {
            // The page to return to: a workspace's, or (none) the tokens page.
            let back = match form.get("workspace") {
                None | Some("") => None,
                Some(w) => Some(WorkspaceName::parse(w)?),
            };
            if form.get("confirm") != Some("yes") {
                return Err(Error::Invalid(
                    "tick the confirmation to revoke the token; nothing was changed".into(),
                ));
            }
            app.tofu.revoke_token(&token, &actor).await?;
            Ok(redirect(&match back {
                Some(w) => format!("/ui/workspaces/{w}?token_revoked=1"),
                None => "/ui/workspace-tokens?token_revoked=1".into(),
            }))
        }
        _ => Err(Error::NotFound("no such form".into())),
    }
}

/// A version page asked for with a reveal ticket: the unmasked values (audited as
/// `state.revealed`) when the ticket is this session's for this version and unused,
/// else the masked page saying so. The operator must still be allowed to reveal.
async fn version_with_ticket(
    app: &App,
    chrome: &Chrome<'_>,
    me: &UiSession,
    name: &WorkspaceName,
    v: i64,
    ticket: &str,
) -> Result<Answer, EdgeError> {
    let w = name.as_str();
    let ops = &app.operator;
    let taken = app
        .sessions
        .take_reveal(ticket, &me.sha256, w, v, now())
        .await?;
    let need = Some((
        crate::operator::roles::Action::Reveal,
        super::guard::On::Workspace(name),
    ));
    if taken {
        super::guard::permit(app, &me.operator, "ui.reveal", need).await?;
        let (row, body) = ops
            .reveal(w, Some(v), &me.operator.actor(), Reveal::UiView)
            .await?;
        let doc = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .filter(|d| d.get("resources").is_some() || d.get("outputs").is_some());
        let content = json_content(doc);
        return Ok(Answer::Page(
            200,
            pages::version(chrome, w, &row, &content, pages::Shown::Revealed),
        ));
    }
    let (row, body) = ops.show(w, Some(v)).await?;
    let content = json_content(mask_state(&body, row.version).ok());
    Ok(Answer::Page(
        200,
        pages::version(chrome, w, &row, &content, pages::Shown::RevealUsed),
    ))
}

/// The address of a page a form belongs to (names checked, so a redirect never
/// carries text that is not a UI path).
fn page_href(page: &UiRoute) -> Result<String, EdgeError> {
    Ok(match page {
        UiRoute::Workspace { workspace: w, .. } => crate::ui::layout::ws_href(w),
        UiRoute::Version {
            workspace: w,
            version,
            ..
        } => pages::version_href(w, *version),
        UiRoute::Drift {
            workspace: Some(w), ..
        } => {
            let mut q = form_urlencoded::Serializer::new(String::new());
            q.append_pair("workspace", w);
            format!("/ui/drift?{}", q.finish())
        }
        UiRoute::DriftRun { run } => drift_pages::run_href(run.get()),
        _ => "/ui/".into(),
    })
}
