//! The operator web UI under `/ui/`: server-rendered pages for workspaces, versions
//! (masked, with an audited reveal and download as POST forms), diffs, rollback (a
//! preview of its diff, then a typed confirmation), force-unlock, search across
//! workspaces, the audit log and clusters, and drift (checks, runs with their plan
//! text, "run check now" and the approval of a drifted check's kept plan). It is a
//! client of `operator::Operations` and `drift::DriftService`, the same functions the
//! admin API and the CLI call, so the three can never disagree; every change it makes
//! is audited with the operator's identity by those functions.
//!
//! `oidc` is single sign-on (OpenID Connect code flow with PKCE; the group → role
//! rule), over `sso_rows` (its started sign-ins and followed sessions, index rows every
//! node shares); `session` keeps logins server-side (as `crate::tokens` of kind
//! `session`; no SQL here); `pages`, `drift_pages` and `access_pages` (tokens, keys) turn plain values into HTML (maud
//! escapes every value it is given), over `layout` (chrome, page layout, time and size
//! formatting), which imports neither; `reveal` keeps the one-time tickets (index rows)
//! that carry an audited reveal across its POST-redirect-GET; `http::ui` is the
//! pingora glue (cookies, forms, CSRF, security headers).

pub mod access_pages;
pub mod drift_pages;
pub mod layout;
pub mod oidc;
pub mod pages;
pub mod reveal;
pub mod session;
pub mod sso_rows;

/// The hand-written stylesheet, served at `/ui/static/app.css`.
pub const STYLESHEET: &str = include_str!("app.css");

/// The site icon (16×16), served at `/favicon.ico`.
pub const FAVICON: &[u8] = include_bytes!("favicon.ico");
