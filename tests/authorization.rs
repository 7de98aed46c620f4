//! The authorization property, generated from the router's own table
//! (`stategate::http::router::ROUTES`): for every route × principal (operators of each
//! role, limited to `dev-*` and not, by API token and by UI session; operators signed in
//! by single sign-on; issued workspace tokens of each scope; a workspace's own
//! credential, a consumer's, drift runs'; client certificates in a real TLS handshake;
//! CI jobs' OIDC tokens from a real issuer over HTTPS; no credential) × target (inside
//! and outside the patterns, existing and missing), the answer lets the request through
//! exactly when the permission rules say so — written out here (`operator_may`,
//! `scoped_may`, `expected`), never asked of `operator::roles`, `tofu::access`,
//! `tofu::certificate` or `tofu::ci_identity`, the code under test — every refusal is the
//! same bytes (a 401 and a UI refusal of a request without a session exactly the
//! unauthenticated request's), and a refusal changes nothing in the index or the blob
//! store. Then every path value of
//! every route is sent spelled otherwise (Unicode spaces before and after, full-width
//! digits, a leading zero, `+`, overlong, percent-encoded, NUL), raw in the request
//! line: never let through, the same answer for every principal, nothing changed.
//!
//! The cluster API's routes are held to the same property with its own identities: an
//! admin and a member of the org that owns a cluster and an admin of another org, beside
//! every other credential; only the owning org's admin gets through, and another org's
//! cluster answers the same bytes as a missing one.
//!
//! What each route needs is written out here, not read from `http::guard`; a route of
//! the table without an entry fails the test, so a new route gets a stated rule.

mod common;
#[path = "authorization/issuer.rs"]
mod issuer;
#[path = "authorization/pki.rs"]
mod pki;

use std::sync::Arc;

use common::roles::{role_operators, unfinished_runs, ROLE_OPERATORS, SECRET};
use common::{lock_info, raw_request, state, TestServer};
use stategate::http::error::HttpError;
use stategate::http::router::{Route, Surface, ROUTES};
use stategate::operator::roles::{Action, Target};

/// What a route is aimed at.
#[derive(Clone, Copy, Debug)]
enum Aim {
    /// Nothing beyond a live operator (whoami, logout).
    Nothing,
    Listing,
    Site,
    /// The `{ws}` value.
    Ws,
    /// The `{ws}` and `{to}` values (a move).
    Both,
    /// The `{run}` value's workspace.
    Run,
}

/// What the Terraform backend's routes do (`tofu::access::Use`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Use {
    ReadOutputs,
    ReadState,
    Write,
    Delete,
}

#[derive(Clone, Copy, Debug)]
enum Need {
    /// Served to anyone (health, the login page, the stylesheet).
    Public,
    /// An operator (admin API, UI) with this action on this aim.
    Operator(Option<Action>, Aim),
    /// A workspace credential for this use of the `{ws}` value.
    Backend(Use),
    /// An admin of the org that owns the `{id}` cluster (the cluster API's identities).
    Cluster,
}

/// The rule each route of the table is held to.
fn need(route: &Route) -> Need {
    use Action::*;
    use Aim::*;
    let op = |a, aim| Need::Operator(Some(a), aim);
    match (route.surface, route.method, route.path) {
        (Surface::Health | Surface::Metrics, _, _) => Need::Public,
        (Surface::Cluster, _, _) => Need::Cluster,
        (Surface::Tf, "GET", "/api/v1/tf/outputs/{ws}") => Need::Backend(Use::ReadOutputs),
        (Surface::Tf, "GET", _) => Need::Backend(Use::ReadState),
        (Surface::Tf, "DELETE", "/api/v1/tf/state/{ws}") => Need::Backend(Use::Delete),
        (Surface::Tf, _, _) => Need::Backend(Use::Write),
        (_, _, p) => match p
            .trim_start_matches("/api/v1/admin")
            .trim_start_matches("/ui")
        {
            "/favicon.ico"
            | "/static/app.css"
            | "/login"
            | "/login/oidc"
            | "/login/oidc/callback" => Need::Public,
            "/whoami" | "/logout" => Need::Operator(None, Nothing),
            "" | "/" | "/workspaces" | "/audit" | "/search" | "/freezes" | "/drift" => {
                op(Read, Listing)
            }
            "/clusters" => op(Read, Site),
            "/workspace-tokens"
            | "/workspace-tokens/{token}/revoke"
            | "/keys"
            | "/keys/rotate"
            | "/keys/retire" => op(Administer, Site),
            "/workspaces/{ws}/credential/rotate" | "/workspaces/{ws}/consumers" => {
                op(Administer, Ws)
            }
            // Without `masked=1` the admin API hands out the real values.
            "/workspaces/{ws}/versions/{version}" if route.surface == Surface::Admin => {
                op(Reveal, Ws)
            }
            "/workspaces/{ws}/versions/{version}/reveal"
            | "/workspaces/{ws}/versions/{version}/download" => op(Reveal, Ws),
            "/workspaces/{ws}"
            | "/workspaces/{ws}/versions"
            | "/workspaces/{ws}/timeline"
            | "/workspaces/{ws}/versions/{version}"
            | "/workspaces/{ws}/diff" => op(Read, Ws),
            "/workspaces/{ws}/rollback" if route.method == "GET" => op(Read, Ws),
            "/workspaces/{ws}/rollback"
            | "/workspaces/{ws}/unlock"
            | "/workspaces/{ws}/restore"
            | "/workspaces/{ws}/allow-write"
            | "/workspaces/{ws}/freeze"
            | "/workspaces/{ws}/unfreeze"
            | "/drift/{ws}/run" => op(Operate, Ws),
            "/workspaces/{ws}/move/{to}" => op(Operate, Both),
            "/drift/{run}" => op(Read, Run),
            "/drift/{run}/apply" => op(Operate, Run),
            _ => panic!("{route:?}: no rule stated in tests/authorization.rs"),
        },
    }
}

/// Who sends a request.
#[derive(Clone, Debug)]
enum Principal {
    None,
    /// An operator: its role and patterns (as `ROLE_OPERATORS` gives them), its API
    /// token and its UI session cookie.
    Operator {
        email: &'static str,
        role: &'static str,
        patterns: Option<&'static str>,
        token: String,
        cookie: String,
    },
    /// An issued workspace token limited to `dev-*`, of this scope.
    Token {
        scope: Use,
        secret: String,
    },
    /// `dev-a`'s own derived credential.
    Workspace {
        secret: String,
    },
    /// `dev-c`'s own derived credential; `dev-c` is a consumer of `dev-a`'s outputs.
    Consumer {
        secret: String,
    },
    /// A drift run's credential for `dev-a`: `live`, or expired or revoked (the run
    /// finished), which must open nothing.
    Run {
        live: bool,
        what: &'static str,
        secret: String,
    },
    /// A cluster API principal: `admin` of `org`, or a member.
    OrgMember {
        org: &'static str,
        admin: bool,
        token: String,
    },
    /// A client certificate the fixture's CA issued, presented in a TLS handshake with
    /// the server's TLS listener at `addr`: `tf-runner` (granted write on `dev-*`,
    /// outputs on `prod-*`) or `stranger` (no grant, though its common name is
    /// `tf-runner`: a certificate with SANs is known by those only); with `secret`, a
    /// wrong bearer secret beside it, which alone decides.
    Certificate {
        subject: &'static str,
        secret: Option<String>,
        addr: String,
        tls: Arc<rustls::ClientConfig>,
    },
    /// A CI job's OIDC token from the fixture's issuer (`granted`: its claims and times
    /// are those the issuer's rules give write on `dev-*` and read on `prod-*`).
    Ci {
        what: &'static str,
        granted: bool,
        token: String,
    },
    /// An operator signed in by single sign-on: its role and patterns as its groups map
    /// them, and its UI session cookie (sent at other surfaces too, cookie and bearer).
    Sso {
        who: &'static str,
        role: &'static str,
        patterns: Option<&'static str>,
        cookie: String,
    },
}

impl Principal {
    fn label(&self) -> String {
        match self {
            Principal::None => "nobody".into(),
            Principal::Operator { email, .. } => (*email).into(),
            Principal::Token { scope, .. } => format!("token({scope:?}, dev-*)"),
            Principal::Workspace { .. } => "dev-a's credential".into(),
            Principal::Consumer { .. } => "dev-c's credential (a consumer of dev-a)".into(),
            Principal::Run { what, .. } => format!("{what} drift run credential of dev-a"),
            Principal::OrgMember { org, admin, .. } => {
                format!("{} of org {org}", if *admin { "admin" } else { "member" })
            }
            Principal::Certificate {
                subject, secret, ..
            } => match secret {
                Some(_) => format!("certificate {subject} with a wrong secret"),
                None => format!("certificate {subject}"),
            },
            Principal::Ci { what, .. } => format!("CI token {what}"),
            Principal::Sso { who, .. } => format!("single sign-on session of {who}"),
        }
    }

    /// The request head's credential lines for `surface`.
    fn headers(&self, surface: Surface) -> String {
        match (self, surface) {
            (Principal::Operator { cookie, .. }, Surface::Ui) => {
                format!("Cookie: sg_session={cookie}\r\n")
            }
            (Principal::Operator { token, .. }, _) => format!("Authorization: Bearer {token}\r\n"),
            (
                Principal::Token { secret, .. }
                | Principal::Workspace { secret }
                | Principal::Consumer { secret }
                | Principal::Run { secret, .. }
                | Principal::OrgMember { token: secret, .. },
                _,
            ) => {
                format!("Authorization: Bearer {secret}\r\n")
            }
            (Principal::Ci { token, .. }, _) => format!("Authorization: Bearer {token}\r\n"),
            (Principal::Certificate { secret, .. }, _) => secret
                .as_ref()
                .map(|s| format!("Authorization: Bearer {s}\r\n"))
                .unwrap_or_default(),
            (Principal::Sso { cookie, .. }, Surface::Ui) => {
                format!("Cookie: sg_session={cookie}\r\n")
            }
            // A session is the UI's only: elsewhere neither its cookie nor its id as a
            // bearer secret may open anything.
            (Principal::Sso { cookie, .. }, _) => {
                format!("Cookie: sg_session={cookie}\r\nAuthorization: Bearer {cookie}\r\n")
            }
            (Principal::None, _) => String::new(),
        }
    }
}

/// One raw HTTP/1.1 exchange over TLS with the client certificate of `tls`, as
/// `common::raw_request` does in the clear: the request line is sent as written.
async fn tls_request(
    addr: &str,
    tls: Arc<rustls::ClientConfig>,
    head: String,
    body: Option<Vec<u8>>,
) -> (u16, String) {
    use std::io::{Read, Write};
    let addr = addr.to_string();
    tokio::task::spawn_blocking(move || {
        let tcp = std::net::TcpStream::connect(&addr).expect("the TLS listener");
        // A server that never answers fails the test rather than holding CI up.
        tcp.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .expect("a read timeout");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("a name");
        let conn = rustls::ClientConnection::new(tls, name).expect("a TLS client");
        let mut stream = rustls::StreamOwned::new(conn, tcp);
        // A certificate refused in the handshake: no answer at all.
        if stream.write_all(head.as_bytes()).is_err() {
            return (0, String::new());
        }
        if let Some(body) = body {
            // The server may answer (and close) before reading it.
            let _ = stream.write_all(&body);
        }
        let mut out = Vec::new();
        // A close without close_notify still leaves the answer in `out`.
        let _ = stream.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).to_string();
        (common::status_line_code(&text), text)
    })
    .await
    .expect("the TLS exchange")
}

struct Answer {
    status: u16,
    /// The body, with the UI session's own CSRF token and email left in (compared per
    /// principal only).
    body: String,
    location: Option<String>,
}

async fn send(
    server: &TestServer,
    p: &Principal,
    route: &Route,
    path: &str,
    query: Option<&str>,
) -> Answer {
    let target = match query {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    // A body no route accepts, so a request let through stops at its input and the
    // fixture stays as it was (a UI form has no CSRF token either).
    let body = (route.method != "GET" && route.method != "HEAD").then(|| b"x".to_vec());
    let length = body.as_ref().map_or(0, Vec::len);
    let head = format!(
        "{} {target} HTTP/1.1\r\nHost: localhost\r\n{}Content-Length: {length}\r\nConnection: close\r\n\r\n",
        route.method,
        p.headers(route.surface),
    );
    let (status, text) = match p {
        Principal::Certificate { addr, tls, .. } => {
            tls_request(addr, tls.clone(), head, body).await
        }
        _ => raw_request(&server.base, &head, body).await,
    };
    let (headers, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let location = headers
        .lines()
        .find_map(|l| {
            l.strip_prefix("location: ")
                .or_else(|| l.strip_prefix("Location: "))
        })
        .map(str::to_string);
    Answer {
        status,
        body: body.to_string(),
        location,
    }
}

/// Was the request let through the credential and permission checks?
fn let_through(route: &Route, a: &Answer) -> bool {
    match route.surface {
        Surface::Ui => {
            !(a.status == 403 && a.body.contains("not permitted"))
                && a.location.as_deref() != Some("/ui/login")
                && a.status != 401
        }
        // Another org's cluster answers exactly like a missing one (the contract).
        Surface::Cluster => {
            a.status != 401
                && a.status != 403
                && !(a.status == 404 && a.body.contains("cluster not found"))
        }
        _ => a.status != 401 && a.status != 403,
    }
}

/// The run fixture: dev-a's run is 2, prod-x's 1; 999 names none.
fn run_workspace(run: &str) -> Option<&'static str> {
    match run {
        "1" => Some("prod-x"),
        "2" => Some("dev-a"),
        _ => None,
    }
}

/// The role rules as docs/web-ui.md states them, written out here rather than asked
/// of `operator::roles` (the code under test): a viewer reads, an operator also
/// operates, only an admin reveals and administers; an operator limited to patterns
/// (the fixture's are only `dev-*`) reaches the workspaces they match, every listing
/// (filtered), and nothing site-wide.
fn operator_may(role: &str, patterns: Option<&str>, action: Action, target: Target) -> bool {
    let least = match action {
        Action::Read => "viewer",
        Action::Operate => "operator",
        Action::Reveal | Action::Administer => "admin",
    };
    if common::roles::rank(role) < common::roles::rank(least) {
        return false;
    }
    match (target, patterns) {
        (_, None) | (Target::Listing, _) => true,
        (Target::Workspace(w), Some("dev-*")) => w.starts_with("dev-"),
        (Target::Site, Some(_)) => false,
        (_, Some(other)) => panic!("the fixture has no operator limited to {other}"),
    }
}

/// Is an operator of `role` limited to `patterns` let through a route needing `action`
/// on `aim`, aimed at (ws, to, run)?
fn operator_through(
    role: &str,
    patterns: Option<&str>,
    action: Option<Action>,
    aim: Aim,
    (ws, to, run): (&str, &str, &str),
) -> bool {
    let Some(action) = action else {
        return true;
    };
    let may = |target| operator_may(role, patterns, action, target);
    match aim {
        Aim::Nothing => true,
        Aim::Listing => may(Target::Listing),
        Aim::Site => may(Target::Site),
        Aim::Ws => may(Target::Workspace(ws)),
        Aim::Both => may(Target::Workspace(ws)) && may(Target::Workspace(to)),
        Aim::Run => {
            may(Target::Listing) && run_workspace(run).is_none_or(|w| may(Target::Workspace(w)))
        }
    }
}

/// What a workspace credential of `scope` may do (docs/access.md, the scopes table):
/// `outputs` < `read` < `write`, and none of them DELETEs.
fn scoped_may(scope: Use, use_: Use) -> bool {
    use_ != Use::Delete && (use_ == Use::ReadOutputs || use_ <= scope)
}

/// Is `p` expected through `route` aimed at these values?
fn expected(route: &Route, p: &Principal, ws: &str, to: &str, run: &str) -> bool {
    match (need(route), p) {
        (Need::Public, _) => true,
        // Only an admin of the org that owns the cluster; another org's cluster answers
        // like a missing one.
        (Need::Cluster, Principal::OrgMember { org, admin, .. }) => {
            let owner = match ws {
                ACME_CLUSTER => Some("acme"),
                GLOBEX_CLUSTER => Some("globex"),
                _ => None,
            };
            *admin && owner == Some(*org)
        }
        (Need::Cluster, _) => false,
        (Need::Operator(action, aim), Principal::Operator { role, patterns, .. }) => {
            operator_through(role, *patterns, action, aim, (ws, to, run))
        }
        // A single sign-on session is a UI session like a token login's, with the grant
        // its groups gave (docs/web-ui.md); it is no credential anywhere else.
        (Need::Operator(action, aim), Principal::Sso { role, patterns, .. }) => {
            route.surface == Surface::Ui
                && operator_through(role, *patterns, action, aim, (ws, to, run))
        }
        (Need::Operator(..), _) => false,
        (Need::Backend(use_), Principal::Token { scope, .. }) => {
            ws.starts_with("dev-") && scoped_may(*scope, use_)
        }
        // docs/access.md, "Client certificates": the first grant for one of its names
        // whose pattern matches decides, its scope limits it like a token's, and no
        // certificate deletes. A wrong secret beside it alone decides (refused).
        (
            Need::Backend(use_),
            Principal::Certificate {
                subject: "tf-runner",
                secret: None,
                ..
            },
        ) => {
            let scope = if ws.starts_with("dev-") {
                Some(Use::Write)
            } else if ws.starts_with("prod-") {
                Some(Use::ReadOutputs)
            } else {
                None
            };
            scope.is_some_and(|scope| scoped_may(scope, use_))
        }
        // docs/ci.md: the rules' union (write on `dev-*`, read on `prod-*` for
        // acme/infra), never DELETE; a token of another repository, or first shown
        // after it expired, opens nothing.
        (Need::Backend(use_), Principal::Ci { granted: true, .. }) => {
            let scope = if ws.starts_with("dev-") {
                Some(Use::Write)
            } else if ws.starts_with("prod-") {
                Some(Use::ReadState)
            } else {
                None
            };
            scope.is_some_and(|scope| scoped_may(scope, use_))
        }
        (Need::Backend(_), Principal::Workspace { .. }) => ws == "dev-a",
        // A run's credential is its workspace's while the run lives, then nothing.
        (Need::Backend(_), Principal::Run { live, .. }) => *live && ws == "dev-a",
        // A consumer reads the outputs of what it consumes, nothing else of it.
        (Need::Backend(use_), Principal::Consumer { .. }) => {
            use_ == Use::ReadOutputs && ws == "dev-a"
        }
        (Need::Backend(_), _) => false,
    }
}

/// The values each route is aimed at: (ws, to, run) for every combination its template
/// uses, inside and outside `dev-*`, existing and missing.
fn targets(route: &Route) -> Vec<(&'static str, &'static str, &'static str)> {
    let p = route.path;
    if p.contains("{to}") {
        return vec![
            ("dev-a", "dev-b", "2"),
            ("dev-a", "prod-x", "2"),
            ("prod-x", "dev-a", "2"),
        ];
    }
    if p.contains("{ws}") {
        return ["dev-a", "dev-nope", "prod-x", "prod-nope"]
            .map(|w| (w, "dev-b", "2"))
            .to_vec();
    }
    if p.contains("{run}") {
        return ["2", "1", "999"].map(|r| ("dev-a", "dev-b", r)).to_vec();
    }
    if p.contains("{id}") {
        // acme's, globex's, one nobody made, and a value that is no cluster id (the
        // cluster id is carried in the `ws` slot).
        return [
            ACME_CLUSTER,
            GLOBEX_CLUSTER,
            MISSING_CLUSTER,
            "not-a-cluster",
        ]
        .map(|id| (id, "dev-b", "2"))
        .to_vec();
    }
    vec![("dev-a", "dev-b", "2")]
}

fn fill(route: &Route, ws: &str, to: &str, run: &str) -> (String, Option<String>) {
    let value = |name: &str| match name {
        "id" => ws.to_string(),
        "ws" => ws.to_string(),
        "to" => to.to_string(),
        "run" => run.to_string(),
        "version" => "1".into(),
        "from" => "2".into(),
        "token" => "nobody".into(),
        other => panic!("no value for {{{other}}}"),
    };
    (route.fill(value), route.fill_query(value))
}

/// Other spellings of `good`, each as raw request-line text.
fn spellings(good: &str) -> Vec<String> {
    let full_width: String = good
        .chars()
        .map(|c| match c {
            '0'..='9' => char::from_u32(c as u32 - '0' as u32 + 0xFF10).unwrap_or(c),
            'a'..='z' => char::from_u32(c as u32 - 'a' as u32 + 0xFF41).unwrap_or(c),
            c => c,
        })
        .collect();
    let encoded: String = good.bytes().map(|b| format!("%{b:02X}")).collect();
    vec![
        format!("\u{3000}{good}"),
        format!("{good}\u{3000}"),
        format!("\u{a0}{good}"),
        format!("\u{2003}{good}"),
        format!("\u{85}{good}"),
        format!("{good}\u{a0}"),
        full_width,
        format!("0{good}"),
        format!("+{good}"),
        format!("{good}{}", "9".repeat(200)),
        encoded,
        format!("%20{good}"),
        format!("{good}%00"),
    ]
}

/// A query value as a form decoder reads it (`+` a space, `%XX` a byte), written out
/// with the `form_urlencoded` crate rather than asked of the router.
fn decoded_query_value(raw: &str) -> String {
    form_urlencoded::parse(format!("v={raw}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// Does `text` name something a route would take as the same value kind (then it is a
/// different value, not another spelling: `0dev-a` is a name of its own)? Written out
/// here, not asked of `http::params` (the code under test).
fn also_valid(placeholder: &str, text: &str) -> bool {
    let b = text.as_bytes();
    match placeholder {
        "run" | "version" | "from" => {
            (1..=18).contains(&b.len()) && b[0] != b'0' && b.iter().all(u8::is_ascii_digit)
        }
        _ => {
            (1..=128).contains(&b.len())
                && b[0].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c))
        }
    }
}

/// The cluster API's fixture: acme's cluster (with a pushed state), globex's, and an id
/// nobody made.
const ACME_CLUSTER: &str = "0a0a0a0a-0000-4000-8000-00000000a0a0";
const GLOBEX_CLUSTER: &str = "0b0b0b0b-0000-4000-8000-00000000b0b0";
const MISSING_CLUSTER: &str = "0c0c0c0c-0000-4000-8000-00000000c0c0";

/// The fixture's server and principals, and what must live as long as they do: the
/// certificate files and the TLS listener's shutdown signal.
struct Fixture {
    server: TestServer,
    principals: Vec<Principal>,
    _keep: (tempfile::TempDir, tokio::sync::watch::Sender<bool>),
}

/// The single sign-on configuration: its provider is never asked (the sessions are
/// opened as the login callback opens them and were checked at the provider just now).
const OIDC: &str = r#"
issuer_url = "https://id.example.test"
client_id = "stategate"
session_max_age_seconds = 3600
revalidate_seconds = 3600
[roles]
platform = "admin"
auditors = "viewer"
team-dev = { role = "operator", workspaces = "dev-*" }
"#;
const PUBLIC_URL: &str = "https://stategate.test";

async fn fixture() -> Fixture {
    let files = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = files.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let ca = pki::Ca::new("stategate test CA");
    let ci_issuer = issuer::Issuer::start(&ca);
    let listener_cert = ca.issue(2, "stategate", &["localhost"], true);
    let ca_file = file("ca.pem", &ca.pem);
    let tls = stategate::config::TlsConfig {
        cert_file: Some(file("server.pem", &listener_cert.cert_pem)),
        key_file: Some(file("server.key", &listener_cert.key_pem)),
        client_ca: Some(ca_file.clone()),
        client_grants: [("dev-*", "write"), ("prod-*", "outputs")]
            .map(|(workspaces, scope)| stategate::config::ClientGrant {
                subject: "tf-runner".into(),
                workspaces: workspaces.into(),
                scope: scope.into(),
            })
            .to_vec(),
        ..Default::default()
    };
    let ci: stategate::config::CiIdentityConfig = toml::from_str(&format!(
        r#"
name = "github"
issuer = "{}"
audience = "{PUBLIC_URL}"
ca_file = "{}"
identity = "{{repository}}@{{ref}}"
max_run_seconds = 900
[[rules]]
claims = {{ repository = "acme/infra" }}
workspaces = "dev-*"
scope = "write"
[[rules]]
claims = {{ repository = "acme/infra" }}
workspaces = "prod-*"
scope = "read"
"#,
        ci_issuer.url,
        ca_file.display()
    ))
    .unwrap();
    let oidc: stategate::config::OidcConfig = toml::from_str(OIDC).unwrap();
    let server = TestServer::start_with(|config| {
        config.cluster.state_enc_key = Some("ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=".into());
        config.tls = tls;
        config.ci_identity = vec![ci];
        config.public_url = Some(PUBLIC_URL.into());
        config.oidc = Some(oidc.clone());
    })
    .await;
    // The same gateway over TLS, as `run` builds its listener: client certificates are
    // verified in the handshake against `tls.client_ca`.
    let acceptor = stategate::server::tls_acceptor(&server.config.tls).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls_addr = listener.local_addr().unwrap().to_string();
    let (stop, stopping) = tokio::sync::watch::channel(false);
    tokio::spawn(stategate::server::serve_tls_listener(
        listener,
        server.app.clone(),
        acceptor,
        stopping,
    ));
    let http = reqwest::Client::new();
    for ws in ["prod-x", "dev-a"] {
        for serial in 1..=2 {
            let resources = format!(
                r#"{{"mode":"managed","type":"null_resource","name":"one","provider":"p","instances":[{{"attributes":{{"password":"{SECRET}","n":{serial}}}}}]}}"#
            );
            let (code, text) = common::status(
                server
                    .tf("POST", ws)
                    .body(state(serial, "lin-1", &resources)),
            )
            .await;
            assert_eq!(code, 200, "{text}");
        }
        // Held locks: a force-unlock or rollback let through still stops at them.
        let (code, _) =
            common::status(server.tf("LOCK", ws).body(lock_info(&format!("L-{ws}")))).await;
        assert_eq!(code, 200);
    }
    unfinished_runs(&server, &["prod-x", "dev-a"]);
    let tokens = role_operators(&server).await;
    let mut principals = vec![Principal::None];
    let now = stategate::tokens::now();
    for ((email, role, patterns), token) in ROLE_OPERATORS.iter().zip(tokens) {
        let secret = token.clone().into_bytes();
        let opened = server
            .app
            .operator
            .admin_write(move |c| stategate::ui::session::open(c, &secret, now))
            .await
            .unwrap()
            .expect("a session");
        principals.push(Principal::Operator {
            email,
            role,
            patterns: *patterns,
            token,
            cookie: opened.cookie_value,
        });
    }
    let admin = match principals.last() {
        Some(Principal::Operator { token, .. }) => token.clone(),
        _ => unreachable!(),
    };
    for (scope, name) in [
        (Use::ReadOutputs, "outputs"),
        (Use::ReadState, "read"),
        (Use::Write, "write"),
    ] {
        let resp = http
            .post(format!("{}/api/v1/admin/workspace-tokens", server.base))
            .bearer_auth(&admin)
            .body(serde_json::json!({"name": format!("t-{name}"), "workspaces": "dev-*", "scope": name}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 201);
        let made: serde_json::Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
        principals.push(Principal::Token {
            scope,
            secret: made["secret"].as_str().unwrap().to_string(),
        });
    }
    principals.push(Principal::Workspace {
        secret: server.bearer("dev-a"),
    });
    let resp = http
        .put(format!(
            "{}/api/v1/admin/workspaces/dev-a/consumers",
            server.base
        ))
        .bearer_auth(&admin)
        .body(serde_json::json!({"consumers": ["dev-c"]}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200, "consumers of dev-a");
    principals.push(Principal::Consumer {
        secret: server.bearer("dev-c"),
    });
    let far = 4_000_000_000;
    for (what, live, name, expires) in [
        ("a live", true, "drift:run-801", far),
        ("an expired", false, "drift:run-802", 1),
        ("a revoked", false, "drift:run-803", far),
    ] {
        let (secret, hash) = stategate::tofu::run_credential::new_secret().unwrap();
        stategate::tofu::run_credential::insert(&server.db(), &hash, "dev-a", name, expires)
            .unwrap();
        principals.push(Principal::Run { live, what, secret });
    }
    stategate::tofu::run_credential::revoke(&server.db(), "drift:run-803").unwrap();
    principals.extend(cluster_principals(&server).await);
    principals.extend(certificate_principals(&ca, &tls_addr).await);
    principals.extend(ci_principals(&ci_issuer));
    principals.extend(sso_principals(&server, &oidc).await);
    Fixture {
        server,
        principals,
        _keep: (files, stop),
    }
}

/// A TLS client presenting `identity`, trusting only the fixture's CA.
fn tls_client(ca: &pki::Ca, identity: &pki::Issued) -> Arc<rustls::ClientConfig> {
    let (chain, key) = identity.rustls();
    Arc::new(
        rustls::ClientConfig::builder_with_provider(pki::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(ca.roots())
            .with_client_auth_cert(chain, key)
            .unwrap(),
    )
}

/// `tf-runner` (granted), `tf-runner` beside a wrong secret, `stranger` (no grant; its
/// CN names the grant's subject, its SAN does not); first, proof that the listener
/// verifies: another CA's certificate gets no answer.
async fn certificate_principals(ca: &pki::Ca, addr: &str) -> Vec<Principal> {
    let other = pki::Ca::new("another CA");
    let foreign = tls_client(ca, &other.issue(9, "tf-runner", &["tf-runner"], false));
    let head =
        "GET /api/v1/tf/outputs/dev-a HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let (status, _) = tls_request(addr, foreign, head.into(), None).await;
    assert_eq!(
        status, 0,
        "another CA's certificate was let into the handshake"
    );
    let runner = tls_client(ca, &ca.issue(3, "tf-runner", &["tf-runner"], false));
    let stranger = tls_client(ca, &ca.issue(4, "tf-runner", &["stranger"], false));
    let cert =
        |subject, secret: Option<&str>, tls: &Arc<rustls::ClientConfig>| Principal::Certificate {
            subject,
            secret: secret.map(str::to_string),
            addr: addr.to_string(),
            tls: tls.clone(),
        };
    vec![
        cert("tf-runner", None, &runner),
        cert(
            "tf-runner",
            Some("sgw_0000000000000000000000000000000000000000000"),
            &runner,
        ),
        cert("stranger", None, &stranger),
    ]
}

/// acme/infra's job token (the rules give it write on `dev-*`, read on `prod-*`),
/// another repository's, and one of acme/infra's first shown after it expired.
fn ci_principals(ci_issuer: &issuer::Issuer) -> Vec<Principal> {
    let now = stategate::tokens::now();
    let token = |repository: &str, issued: i64, expires: i64| {
        ci_issuer.token(serde_json::json!({
            "sub": format!("repo:{repository}:ref:refs/heads/main"),
            "repository": repository,
            "ref": "refs/heads/main",
            "aud": PUBLIC_URL,
            "iat": issued,
            "nbf": issued,
            "exp": expires,
        }))
    };
    vec![
        Principal::Ci {
            what: "of acme/infra",
            granted: true,
            token: token("acme/infra", now - 5, now + 900),
        },
        Principal::Ci {
            what: "of acme/other",
            granted: false,
            token: token("acme/other", now - 5, now + 900),
        },
        Principal::Ci {
            what: "of acme/infra, expired before its first use",
            granted: false,
            token: token("acme/infra", now - 3600, now - 1800),
        },
    ]
}

/// Operators signed in by single sign-on, one per mapped group: their sessions are
/// opened as the login callback opens them once the provider has vouched for the user
/// (`ui::session::open_sso` with the grant `[oidc.roles]` gives the groups, and the
/// session followed in `sso_sessions` as checked just now), not through a running
/// provider: the callback's own exchange is integration/test_oidc.py's. The provider's
/// tokens sealed in the row are never opened: the next check is an hour away.
async fn sso_principals(
    server: &TestServer,
    oidc: &stategate::config::OidcConfig,
) -> Vec<Principal> {
    use stategate::ui::{oidc::Settings, session, sso_rows};
    let settings = Settings::from_config(oidc, Some(PUBLIC_URL), |_| {
        Err(std::io::ErrorKind::NotFound.into())
    })
    .unwrap();
    let mut out = Vec::new();
    for (who, group, role, patterns) in [
        ("sso-admin@x.io", "platform", "admin", None),
        ("sso-dev@x.io", "team-dev", "operator", Some("dev-*")),
        ("sso-viewer@x.io", "auditors", "viewer", None),
    ] {
        let grant = settings
            .roles
            .grant_for(&[group.to_string()])
            .expect("a mapped group");
        let issuer = oidc.issuer_url.clone();
        let opened = server
            .app
            .operator
            .admin_write(move |c| {
                let user = stategate::operator::identity::SsoUser {
                    issuer: &issuer,
                    subject: who,
                    name: who,
                    grant: &grant,
                };
                let now = stategate::tokens::now();
                let opened = session::open_sso(c, user, Some(who), 3600, now)?.expect("a session");
                let now_ms = stategate::tokens::now_ms();
                sso_rows::follow(
                    c,
                    &opened.session.sha256,
                    who,
                    b"sealed provider tokens",
                    now_ms,
                    now_ms + 3_600_000,
                )?;
                Ok(opened)
            })
            .await
            .unwrap();
        out.push(Principal::Sso {
            who,
            role,
            patterns,
            cookie: opened.cookie_value,
        });
    }
    out
}

/// Everything a request could change: the index's counts (`CHANGE_COUNTS`) and the
/// blob store's files.
fn changes(db: &stategate::store::sql::Connection, blobs: &std::path::Path) -> (Vec<i64>, usize) {
    fn files(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir).map_or(0, |entries| {
            entries
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => files(&e.path()),
                    _ => 1,
                })
                .sum()
        })
    }
    (common::roles::snapshot_of(db), files(blobs))
}

/// acme's admin (who pushes acme's state here) and member, globex's admin; the two
/// orgs' clusters.
async fn cluster_principals(server: &TestServer) -> Vec<Principal> {
    use stategate::cluster::identity::{self, Role};
    let conn = server.db();
    let mut out = Vec::new();
    for (org, cluster) in [("acme", ACME_CLUSTER), ("globex", GLOBEX_CLUSTER)] {
        identity::create_org(&conn, org).unwrap();
        identity::create_cluster(&conn, org, None, Some(cluster)).unwrap();
    }
    for (org, email, admin) in [
        ("acme", "a@acme.example", true),
        ("acme", "m@acme.example", false),
        ("globex", "g@globex.example", true),
    ] {
        let role = if admin { Role::Admin } else { Role::Member };
        let token = identity::create_principal(&conn, org, email, role).unwrap();
        out.push(Principal::OrgMember { org, admin, token });
    }
    let Principal::OrgMember { token, .. } = &out[0] else {
        unreachable!()
    };
    let http = reqwest::Client::new();
    let url = |tail: &str| format!("{}/v1/clusters/{ACME_CLUSTER}/{tail}", server.base);
    let lock = http
        .post(url("lock"))
        .bearer_auth(token)
        .body(r#"{"operation": "provision", "host": "ci"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(lock.status(), 200);
    let push = http
        .put(url("tfstate"))
        .bearer_auth(token)
        .body(state(1, "cluster-lin", ""))
        .send()
        .await
        .unwrap();
    assert_eq!(push.status(), 200, "{:?}", push.text().await);
    out
}

#[tokio::test]
async fn every_route_answers_as_the_permission_rules_say() {
    let Fixture {
        server,
        principals,
        _keep,
    } = fixture().await;
    let started = std::time::Instant::now();
    // Each rule is stated (a route without one panics here, before any request).
    for route in ROUTES {
        need(route);
    }
    let admin_refusal =
        String::from_utf8(stategate::error::Error::NotPermitted.body().to_vec()).unwrap();
    let (mut through, mut refused) = (0, 0);
    let mut ui_refusals: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    let mut cluster_misses = std::collections::BTreeSet::new();
    // The backend first: the admin API's (refused) changes never reach its credentials.
    let mut order: Vec<&Route> = ROUTES.iter().filter(|r| r.surface == Surface::Tf).collect();
    order.extend(ROUTES.iter().filter(|r| r.surface != Surface::Tf));
    let db = server.db();
    let blobs = server.config.local_store_path();
    let mut baseline = changes(&db, &blobs);
    for route in order {
        if matches!(need(route), Need::Public) {
            continue;
        }
        // Operators (by token, by session, by single sign-on), one token, the granted
        // certificate and CI token at the admin API and the UI; the workspace
        // credentials, certificates, CI tokens, single sign-on sessions, one operator
        // and nobody at the backend. Nobody asks first (its answer is what every
        // unauthenticated refusal must be).
        let asking: Vec<&Principal> = principals
            .iter()
            .filter(|p| match (route.surface, p) {
                // Every credential of every kind at the cluster API.
                (Surface::Cluster, _) => true,
                (Surface::Tf, Principal::Operator { email, .. }) => *email == "admin@x.io",
                (Surface::Tf, _) => true,
                (_, Principal::Token { scope, .. }) => *scope == Use::Write,
                (
                    _,
                    Principal::Certificate {
                        subject, secret, ..
                    },
                ) => *subject == "tf-runner" && secret.is_none(),
                (_, Principal::Ci { granted, .. }) => *granted,
                (
                    _,
                    Principal::Workspace { .. }
                    | Principal::Consumer { .. }
                    | Principal::Run { .. },
                ) => false,
                _ => true,
            })
            .collect();
        assert!(matches!(asking.first(), Some(Principal::None)));
        for (ws, to, run) in targets(route) {
            let (path, query) = fill(route, ws, to, run);
            let mut unauthenticated: Option<Answer> = None;
            for p in &asking {
                let a = send(&server, p, route, &path, query.as_deref()).await;
                let what = format!(
                    "{} {} {path} {query:?} as {}",
                    route.method,
                    route.path,
                    p.label()
                );
                let want = expected(route, p, ws, to, run);
                let got = let_through(route, &a);
                assert_eq!(got, want, "{what}: {} {}", a.status, a.body);
                assert!(
                    !a.body.contains(SECRET) || want,
                    "{what}: a secret in a refusal"
                );
                if got {
                    through += 1;
                    baseline = changes(&db, &blobs);
                    continue;
                }
                refused += 1;
                assert_eq!(
                    changes(&db, &blobs),
                    baseline,
                    "{what}: a refusal changed something"
                );
                let Some(bare) = &unauthenticated else {
                    unauthenticated = Some(a);
                    continue;
                };
                // A credential that is refused (401) is refused exactly as no credential
                // is; at the UI, anything but a session is no session at all.
                let sessionless = !matches!(p, Principal::Operator { .. } | Principal::Sso { .. });
                if a.status == 401 || (route.surface == Surface::Ui && sessionless) {
                    assert_eq!(
                        (a.status, &a.body, &a.location),
                        (bare.status, &bare.body, &bare.location),
                        "{what}: refused otherwise than without a credential"
                    );
                }
                match (route.surface, a.status) {
                    (Surface::Admin, 403) => assert_eq!(a.body, admin_refusal, "{what}"),
                    (Surface::Ui, 403) => {
                        ui_refusals.entry(p.label()).or_default().insert(a.body);
                    }
                    // Another org's cluster and a missing one: the same bytes.
                    (Surface::Cluster, 404) => {
                        cluster_misses.insert(a.body);
                    }
                    _ => {}
                }
            }
        }
    }
    for (who, bodies) in &ui_refusals {
        assert_eq!(bodies.len(), 1, "{who}: UI refusals differ: {bodies:#?}");
    }
    assert_eq!(
        cluster_misses.len(),
        1,
        "another org's cluster and a missing one answer differently: {cluster_misses:#?}"
    );
    assert!(
        through > 200 && refused > 200,
        "{through} let through, {refused} refused"
    );
    eprintln!(
        "{through} let through, {refused} refused in {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn no_other_spelling_of_a_value_is_let_through() {
    let Fixture {
        server,
        principals,
        _keep,
    } = fixture().await;
    let started = std::time::Instant::now();
    // A limited operator and the unlimited admin at the admin API and the UI (and the
    // limited single sign-on operator at the UI); a `dev-*` write token, dev-a's own
    // credential, the granted certificate and CI token at the backend.
    let asking = |surface: Surface| -> Vec<&Principal> {
        principals
            .iter()
            .filter(|p| match (surface, p) {
                (Surface::Tf, Principal::Token { scope, .. }) => *scope == Use::Write,
                (Surface::Tf, Principal::Workspace { .. }) => true,
                (
                    Surface::Tf,
                    Principal::Certificate {
                        subject: "tf-runner",
                        secret: None,
                        ..
                    },
                ) => true,
                (Surface::Tf, Principal::Ci { granted, .. }) => *granted,
                (Surface::Ui, Principal::Sso { who, .. }) => *who == "sso-dev@x.io",
                (Surface::Tf, _) => false,
                (_, Principal::Operator { email, .. }) => {
                    ["operator-dev@x.io", "admin@x.io"].contains(email)
                }
                _ => false,
            })
            .collect()
    };
    let db = server.db();
    let blobs = server.config.local_store_path();
    let mut sent = 0;
    for route in ROUTES {
        let before = changes(&db, &blobs);
        for placeholder in ["ws", "to", "run", "version", "from", "token", "id"] {
            let braced = format!("{{{placeholder}}}");
            let in_query = route.query.contains(&braced);
            if !route.path.contains(&braced) && !in_query {
                continue;
            }
            // Aimed outside `dev-*`: prod-x, its run, its version 1.
            let good = match placeholder {
                "run" | "version" => "1",
                "from" => "2",
                "token" => "nobody",
                "id" => "3f2b8c1e-8d4a-4c55-9a53-0c1d2e3f4a5b",
                _ => "prod-x",
            };
            for bad in spellings(good) {
                // A query value is form-decoded (`%31` is `1`): a spelling that decodes
                // to the good value is that value, not another spelling of it.
                if in_query && decoded_query_value(&bad) == good {
                    continue;
                }
                let value = |name: &str| {
                    if name == placeholder {
                        return bad.clone();
                    }
                    match name {
                        "ws" | "to" => "prod-x".to_string(),
                        "run" | "version" => "1".into(),
                        "from" => "2".into(),
                        "token" => "nobody".into(),
                        _ => "3f2b8c1e-8d4a-4c55-9a53-0c1d2e3f4a5b".into(),
                    }
                };
                let (path, query) = (route.fill(value), route.fill_query(value));
                let mut answers = std::collections::BTreeSet::new();
                for p in asking(route.surface) {
                    let a = send(&server, p, route, &path, query.as_deref()).await;
                    sent += 1;
                    let what = format!("{} {path:?} as {}", route.method, p.label());
                    assert!(!a.body.contains(SECRET), "{what}: {}", a.body);
                    let judged = if in_query {
                        decoded_query_value(&bad)
                    } else {
                        bad.clone()
                    };
                    if also_valid(placeholder, &judged) || placeholder == "id" {
                        // A value of its own (`0prod-x`), or a cluster id (answered
                        // like a missing cluster): judged as that value is.
                        continue;
                    }
                    // Another spelling: never through. The admin API and the backend
                    // answer one 400 whoever asks, the UI its 400 page.
                    assert_eq!(a.status, 400, "{what}: {}", a.body);
                    if route.surface != Surface::Ui {
                        answers.insert(a.body);
                    }
                }
                assert!(
                    answers.len() <= 1,
                    "{} {path:?}: answers differ: {answers:#?}",
                    route.method
                );
            }
        }
        assert_eq!(
            changes(&db, &blobs),
            before,
            "{} {}: changed something",
            route.method,
            route.path
        );
    }
    eprintln!("{sent} requests in {:?}", started.elapsed());
}
