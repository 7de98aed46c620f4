//! Single sign-on for the web UI: the OpenID Connect authorization code flow with
//! PKCE, over the `openidconnect` crate.
//!
//! - [`Settings`] is `[oidc]` checked whole at startup (pure): the issuer (https, or
//!   http on a loopback address), the redirect (`public_url` + [`CALLBACK_PATH`]), the
//!   client secret (inline or from a file) and the group → role map. A bad key is
//!   refused naming it, before anything is opened.
//! - [`RoleMap::grant_for`] is the one rule from a user's groups to a [`Grant`] (pure,
//!   table-tested): **the highest mapped role wins**; the user gets the workspace
//!   patterns of the mappings at that role (all workspaces if one of them is not
//!   limited); mappings at lower roles add nothing. No mapped group: no grant, and the
//!   login is refused. It runs at every sign-in and every re-check of a session, so a
//!   user taken out of a group loses what it gave within `oidc.revalidate_seconds`.
//! - [`Sso`] runs the flow. The provider's metadata (and keys) are discovered lazily
//!   on the first sign-in and again after [`REDISCOVER_AFTER`]; a provider that cannot
//!   be reached makes sign-in unavailable (the log names `oidc.issuer_url`), never the
//!   server. A started login is a row of the index (`ui::sso_rows`, so the callback
//!   may reach another node): its `state` (by SHA-256), and sealed, its nonce and PKCE
//!   verifier, bound to the browser by a random cookie (only its SHA-256 is kept),
//!   used once, forgotten after [`PENDING_SECONDS`]. The callback takes it out before
//!   anything else, so a replayed or forged callback finds nothing; the ID token is
//!   then checked by the crate: signature (the provider's JWKS), issuer, audience,
//!   expiry and nonce.
//!
//! - A signed-in session is followed ([`Sso::follow`]) with the provider's access and
//!   refresh tokens, sealed in the index under the root key's single sign-on key and
//!   bound to the session: when its last check is older than
//!   `oidc.revalidate_seconds`, the next request (on any node) asks userinfo again
//!   (renewing the access token with the refresh token once it is refused) and maps
//!   the groups it names today ([`Sso::revalidate`]). Of racing requests one asks; the
//!   others wait for its answer. No mapped group, a provider that refuses, or a session
//!   not followed (its row dropped, or sealed under a retired key generation) ends the
//!   session: fail closed. Every session ends after `oidc.session_max_age_seconds`
//!   anyway.
//! - RFC 9207: when the provider's metadata says it sends `iss` on authorization
//!   responses, a callback without it or naming another issuer is refused (mix-up).
//!
//! What a refused sign-in looks like to the browser is the same whatever the reason,
//! but one: a user the provider signed in whose groups map to no role is told so and
//! what to do (ask an admin to map a group, naming the groups claim). The reason
//! ([`Refused`]) goes to the log, never a code or token.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openidconnect::core::{
    CoreAuthDisplay, CoreAuthPrompt, CoreAuthenticationFlow, CoreClaimName, CoreClaimType,
    CoreClientAuthMethod, CoreErrorResponseType, CoreGenderClaim, CoreGrantType, CoreJsonWebKey,
    CoreJweContentEncryptionAlgorithm, CoreJweKeyManagementAlgorithm, CoreJwsSigningAlgorithm,
    CoreResponseMode, CoreResponseType, CoreRevocableToken, CoreRevocationErrorResponse,
    CoreSubjectIdentifierType, CoreTokenIntrospectionResponse, CoreTokenType,
};
use openidconnect::{
    url, AccessToken, AdditionalClaims, AdditionalProviderMetadata, AuthorizationCode, ClientId,
    ClientSecret, CsrfToken, EmptyExtraTokenFields, EndpointMaybeSet, EndpointNotSet, EndpointSet,
    IdTokenFields, IssuerUrl, Nonce, OAuth2TokenResponse, PkceCodeChallenge, PkceCodeVerifier,
    RedirectUrl, RefreshToken, Scope, StandardErrorResponse, StandardTokenResponse,
    SubjectIdentifier, UserInfoClaims,
};
use subtle::ConstantTimeEq;

use super::sso_rows;
use crate::config::{ConfigError, OidcConfig};
use crate::crypto::SealKey;
use crate::operator::roles::{Grant, Pattern, Role, MAX_PATTERNS};
use crate::store::sql::Connection;
use crate::store::{Db, DbError};

/// Where the provider sends the browser back (under `public_url`).
pub const CALLBACK_PATH: &str = "/ui/login/oidc/callback";
/// How long a started sign-in may take at the provider.
pub const PENDING_SECONDS: u64 = 600;
/// The provider's metadata and keys are read again after this (rotated keys).
pub const REDISCOVER_AFTER: Duration = Duration::from_secs(300);
/// Longest wait for the provider (discovery, code exchange).
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request's claim on re-checking a session holds (milliseconds): longer
/// than the three provider calls a check may make, so it lapses only when its node
/// died mid-check.
const CHECK_CLAIM_MS: i64 = 4 * PROVIDER_TIMEOUT.as_millis() as i64;
/// How often a request whose session another request is re-checking looks again.
const CHECK_POLL: Duration = Duration::from_millis(100);
/// Longest `state`, `code` or cookie value looked at.
const MAX_PARAM: usize = 4096;
/// Most groups read from a token (a longer list is cut, never an error).
const MAX_GROUPS: usize = 1024;

/// The claims of an ID token besides the standard ones (the groups claim is one).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct OtherClaims {
    #[serde(flatten)]
    claims: HashMap<String, serde_json::Value>,
}

impl AdditionalClaims for OtherClaims {}

/// The discovery field of RFC 9207 (authorization server issuer identification): a
/// provider that sets it names itself in `iss` on every authorization response, so a
/// response without it, or naming another issuer, is a mix-up and is refused.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct IssParameter {
    #[serde(default)]
    authorization_response_iss_parameter_supported: Option<bool>,
}

impl AdditionalProviderMetadata for IssParameter {}

type ProviderMetadata = openidconnect::ProviderMetadata<
    IssParameter,
    CoreAuthDisplay,
    CoreClientAuthMethod,
    CoreClaimName,
    CoreClaimType,
    CoreGrantType,
    CoreJweContentEncryptionAlgorithm,
    CoreJweKeyManagementAlgorithm,
    CoreJsonWebKey,
    CoreResponseMode,
    CoreResponseType,
    CoreSubjectIdentifierType,
>;

type TokenResponse = StandardTokenResponse<
    IdTokenFields<
        OtherClaims,
        EmptyExtraTokenFields,
        CoreGenderClaim,
        CoreJweContentEncryptionAlgorithm,
        CoreJwsSigningAlgorithm,
    >,
    CoreTokenType,
>;

/// The client as discovery makes it: an authorization endpoint; a token endpoint
/// and userinfo endpoint if the provider names them.
type Client = openidconnect::Client<
    OtherClaims,
    CoreAuthDisplay,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJsonWebKey,
    CoreAuthPrompt,
    StandardErrorResponse<CoreErrorResponseType>,
    TokenResponse,
    CoreTokenIntrospectionResponse,
    CoreRevocableToken,
    CoreRevocationErrorResponse,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// Group → grant, in the order of the configuration (groups sorted by name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleMap(Vec<(String, Grant)>);

impl RoleMap {
    /// The grant a user in `groups` gets (see the module docs for the rule); `None`
    /// when no group is mapped.
    pub fn grant_for(&self, groups: &[String]) -> Option<Grant> {
        let matched: Vec<&Grant> = self
            .0
            .iter()
            .filter(|(group, _)| groups.iter().any(|g| g == group))
            .map(|(_, grant)| grant)
            .collect();
        let top = matched.iter().map(|g| g.role).max()?;
        let at_top: Vec<&Grant> = matched.into_iter().filter(|g| g.role == top).collect();
        if at_top.iter().any(|g| !g.is_limited()) {
            return Some(Grant {
                role: top,
                patterns: Vec::new(),
            });
        }
        let mut patterns: Vec<Pattern> = Vec::new();
        for pattern in at_top.iter().flat_map(|g| g.patterns.iter()) {
            if !patterns.iter().any(|p| p.as_str() == pattern.as_str()) {
                patterns.push(pattern.clone());
            }
        }
        Some(Grant {
            role: top,
            patterns,
        })
    }
}

/// `[oidc]`, checked.
#[derive(Debug, Clone)]
pub struct Settings {
    pub issuer: IssuerUrl,
    pub client_id: ClientId,
    pub client_secret: Option<ClientSecret>,
    pub redirect: RedirectUrl,
    pub groups_claim: String,
    pub scopes: Vec<String>,
    pub display_name: String,
    pub roles: RoleMap,
    /// Seconds a single sign-on session lasts from sign-in.
    pub session_max_age: i64,
    /// How old a session's last check at the provider may be before it is checked again.
    pub revalidate: Duration,
    /// Read groups from userinfo when the ID token carries no groups claim.
    pub groups_from_userinfo: bool,
}

fn invalid(message: String) -> ConfigError {
    ConfigError::Invalid(message)
}

/// Is `url` https, or http to a loopback host (a provider or UI on this machine)?
fn secure_or_loopback(url: &url::Url) -> bool {
    match url.scheme() {
        "https" => true,
        "http" => match url.host() {
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        },
        _ => false,
    }
}

/// One `[oidc.roles]` entry: `"viewer"`, or `{ role = "…", workspaces = … }`.
fn mapping(group: &str, value: &toml::Value) -> Result<Grant, ConfigError> {
    let key = format!("oidc.roles.{group:?}");
    let bad_role = || {
        invalid(format!(
            "{key}: unknown role (use viewer, operator or admin)"
        ))
    };
    let (role, workspaces) = match value {
        toml::Value::String(role) => (role.as_str(), None),
        toml::Value::Table(table) => {
            if let Some(extra) = table.keys().find(|k| *k != "role" && *k != "workspaces") {
                return Err(invalid(format!(
                    "{key}: unknown key {extra:?} (a mapping has role and workspaces)"
                )));
            }
            let role = match table.get("role") {
                Some(toml::Value::String(r)) => r.as_str(),
                _ => return Err(bad_role()),
            };
            let workspaces = match table.get("workspaces") {
                None => None,
                Some(toml::Value::String(list)) => Some(list.clone()),
                Some(toml::Value::Array(items)) => {
                    let names: Option<Vec<&str>> = items.iter().map(toml::Value::as_str).collect();
                    let names = names.ok_or_else(|| {
                        invalid(format!("{key}.workspaces: a list of workspace patterns"))
                    })?;
                    Some(names.join(","))
                }
                Some(_) => {
                    return Err(invalid(format!(
                        "{key}.workspaces: a workspace pattern or a list of them"
                    )))
                }
            };
            (role, workspaces)
        }
        _ => return Err(bad_role()),
    };
    if Role::parse(role).is_err() || role.trim() != role {
        return Err(bad_role());
    }
    if workspaces.as_deref().is_some_and(|w| w.trim().is_empty()) {
        return Err(invalid(format!(
            "{key}.workspaces: empty (leave it out for every workspace)"
        )));
    }
    Grant::parse(role, workspaces.as_deref()).map_err(|e| invalid(format!("{key}.workspaces: {e}")))
}

impl Settings {
    /// Checks `[oidc]` whole; `read_file` reads `client_secret_file`. The checks run in
    /// the order of the section's keys, so the first mistake is the one reported.
    pub fn from_config(
        oidc: &OidcConfig,
        public_url: Option<&str>,
        read_file: impl Fn(&Path) -> std::io::Result<String>,
    ) -> Result<Settings, ConfigError> {
        check_issuer(oidc)?;
        let client_id = oidc.client_id.trim();
        if client_id.is_empty() {
            return Err(invalid("oidc.client_id is not set".into()));
        }
        let client_secret = client_secret(oidc, read_file)?;
        let redirect = redirect_url(public_url)?;
        let groups_claim = oidc.groups_claim.trim().to_string();
        if groups_claim.is_empty() {
            return Err(invalid("oidc.groups_claim is empty".into()));
        }
        let scopes = scopes(oidc)?;
        let display_name = oidc.display_name.trim();
        if display_name.is_empty() || display_name.chars().count() > 64 {
            return Err(invalid("oidc.display_name: 1-64 characters".into()));
        }
        let roles = role_map(oidc)?;
        check_lifetimes(oidc)?;
        Ok(Settings {
            session_max_age: oidc.session_max_age_seconds as i64,
            revalidate: Duration::from_secs(oidc.revalidate_seconds),
            groups_from_userinfo: oidc.groups_from_userinfo,
            // As written: the provider's metadata must name exactly this issuer, and
            // a parsed URL would gain a trailing slash.
            issuer: IssuerUrl::new(oidc.issuer_url.trim().to_string())
                .map_err(|_| invalid("oidc.issuer_url: not a URL".into()))?,
            client_id: ClientId::new(client_id.to_string()),
            client_secret,
            redirect,
            groups_claim,
            scopes,
            display_name: display_name.to_string(),
            roles: RoleMap(roles),
        })
    }
}

/// `oidc.issuer_url` is an https URL (http only to loopback) without query or fragment.
fn check_issuer(oidc: &OidcConfig) -> Result<(), ConfigError> {
    let issuer = url::Url::parse(oidc.issuer_url.trim()).map_err(|_| {
        invalid("oidc.issuer_url: not a URL (e.g. https://id.example.com/realms/ops)".into())
    })?;
    if !secure_or_loopback(&issuer) {
        return Err(invalid(
            "oidc.issuer_url must be https (http only to a loopback address)".into(),
        ));
    }
    if issuer.query().is_some() || issuer.fragment().is_some() {
        return Err(invalid(
            "oidc.issuer_url: no query or fragment (the issuer exactly as the provider names it)"
                .into(),
        ));
    }
    Ok(())
}

/// The client secret, given inline or in `client_secret_file` (not both), if any.
fn client_secret(
    oidc: &OidcConfig,
    read_file: impl Fn(&Path) -> std::io::Result<String>,
) -> Result<Option<ClientSecret>, ConfigError> {
    Ok(match (&oidc.client_secret, &oidc.client_secret_file) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "oidc.client_secret and oidc.client_secret_file: set one, not both".into(),
            ))
        }
        (Some(secret), None) if secret.is_blank() => {
            return Err(invalid("oidc.client_secret is empty".into()))
        }
        (Some(secret), None) => Some(ClientSecret::new(secret.expose().trim().to_string())),
        (None, Some(path)) => {
            // The file's contents never appear in an error.
            let text = read_file(path).map_err(|e| {
                invalid(format!(
                    "oidc.client_secret_file: cannot read {}: {}",
                    path.display(),
                    e.kind()
                ))
            })?;
            let secret = text.trim();
            if secret.is_empty() {
                return Err(invalid(format!(
                    "oidc.client_secret_file: {} is empty",
                    path.display()
                )));
            }
            Some(ClientSecret::new(secret.to_string()))
        }
        (None, None) => None,
    })
}

/// Where the provider sends the browser back: `<public_url>/ui/login/oidc/callback`,
/// so `public_url` must be set, and https (http only to loopback).
fn redirect_url(public_url: Option<&str>) -> Result<RedirectUrl, ConfigError> {
    let public = public_url
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| {
            invalid("[oidc] needs public_url (the provider sends the browser back to <public_url>/ui/login/oidc/callback)".into())
        })?;
    let public_parsed = url::Url::parse(public)
        .map_err(|_| invalid("public_url: not a URL (needed by [oidc])".into()))?;
    if !secure_or_loopback(&public_parsed) {
        return Err(invalid(
            "public_url must be https for [oidc] (http only to a loopback address): the provider sends the sign-in code there".into(),
        ));
    }
    RedirectUrl::new(format!("{}{CALLBACK_PATH}", public.trim_end_matches('/')))
        .map_err(|_| invalid("public_url: not a URL (needed by [oidc])".into()))
}

/// The scopes asked for besides `openid` (always asked), each once.
fn scopes(oidc: &OidcConfig) -> Result<Vec<String>, ConfigError> {
    let mut scopes = Vec::new();
    for scope in &oidc.scopes {
        let ok = !scope.is_empty()
            && scope
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
        if !ok {
            return Err(invalid(
                "oidc.scopes: each scope is one word of printable ASCII".into(),
            ));
        }
        if scope != "openid" && !scopes.contains(scope) {
            scopes.push(scope.clone());
        }
    }
    Ok(scopes)
}

/// `oidc.roles`, each group's grant parsed: at least one, and the union a user in
/// every group of one role would get still a grant.
fn role_map(oidc: &OidcConfig) -> Result<Vec<(String, Grant)>, ConfigError> {
    if oidc.roles.is_empty() {
        return Err(invalid(
            "oidc.roles maps no group to a role, so nobody could sign in (e.g. \"platform-admins\" = \"admin\")".into(),
        ));
    }
    let mut roles = Vec::new();
    for (group, value) in &oidc.roles {
        if group.trim().is_empty() {
            return Err(invalid("oidc.roles: an empty group name".into()));
        }
        roles.push((group.clone(), mapping(group, value)?));
    }
    for role in Role::ALL {
        let patterns: usize = roles
            .iter()
            .filter(|(_, g)| g.role == role)
            .map(|(_, g)| g.patterns.len())
            .sum();
        if patterns > MAX_PATTERNS {
            return Err(invalid(format!(
                "oidc.roles: the {role} mappings name {patterns} workspace patterns together (at most {MAX_PATTERNS})"
            )));
        }
    }
    Ok(roles)
}

/// A sign-on session lasts at most the UI's session lifetime, and is re-checked at
/// least once in it.
fn check_lifetimes(oidc: &OidcConfig) -> Result<(), ConfigError> {
    let lifetime = crate::ui::session::LIFETIME_SECONDS as u64;
    if !(60..=lifetime).contains(&oidc.session_max_age_seconds) {
        return Err(invalid(format!(
            "oidc.session_max_age_seconds: between 60 and {lifetime} (the UI's session lifetime)"
        )));
    }
    if oidc.revalidate_seconds == 0 || oidc.revalidate_seconds > oidc.session_max_age_seconds {
        return Err(invalid(
            "oidc.revalidate_seconds: at least 1 and at most oidc.session_max_age_seconds".into(),
        ));
    }
    Ok(())
}

/// Who signed in, as the provider's verified ID token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub issuer: String,
    pub subject: String,
    /// The `email` claim, unless the token says it is not verified.
    pub email: Option<String>,
    pub groups: Vec<String>,
}

impl Identity {
    /// The operator name (`operators.email`) this user gets: the email, or
    /// `<subject>@<issuer host>` without one.
    pub fn operator_name(&self) -> String {
        if let Some(email) = &self.email {
            if crate::cluster::identity::normalize_email(email).is_ok() {
                return email.trim().to_ascii_lowercase();
            }
        }
        let host = url::Url::parse(&self.issuer)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string))
            .unwrap_or_else(|| "sso".into());
        let subject: String = self
            .subject
            .chars()
            .take(128)
            .map(|c| {
                if c == '@' || c.is_whitespace() || c.is_control() {
                    '_'
                } else {
                    c
                }
            })
            .collect();
        format!("{subject}@{host}").to_ascii_lowercase()
    }
}

/// Why a sign-in was refused (for the log; the browser sees one refusal).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no pending sign-in for this state (forged, replayed or expired)")]
    NoPending,
    #[error("the sign-in was started in another browser (binding cookie mismatch)")]
    Binding,
    #[error("the provider answered with error {0:?}")]
    Provider(String),
    #[error("the callback carries no code")]
    NoCode,
    #[error("the code exchange failed: {0}")]
    Exchange(String),
    #[error("the provider sent no ID token")]
    NoIdToken,
    #[error("the ID token was refused: {0}")]
    IdToken(String),
    #[error("the user's groups map to no role")]
    NoRole,
    #[error("the operator name is taken by another operator")]
    NameTaken,
    #[error("the authorization response names issuer {0:?}, not ours (RFC 9207 mix-up defence)")]
    Issuer(String),
    #[error("the provider advertises RFC 9207 but its authorization response carries no iss")]
    NoIssuer,
    #[error("the userinfo request failed: {0}")]
    UserInfo(String),
    #[error(
        "the session is not followed (dropped, or its provider tokens do not open under this root key)"
    )]
    Untracked,
    #[error("single sign-on is no longer configured")]
    NotConfigured,
    #[error("the index cannot be reached: {0}")]
    Index(String),
}

impl Refused {
    /// A fixed word for the audit log (the message can carry a provider's text).
    pub fn audit_reason(&self) -> &'static str {
        match self {
            Refused::NoRole => "no_role",
            Refused::UserInfo(_) | Refused::Exchange(_) | Refused::IdToken(_) => "provider_refused",
            Refused::Untracked => "untracked",
            Refused::NotConfigured => "not_configured",
            _ => "refused",
        }
    }
}

/// Why a sign-in cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("oidc.issuer_url: the provider's discovery failed: {0}")]
    Discovery(String),
    #[error("too many sign-ins are in progress")]
    Busy,
    #[error("the index cannot keep the sign-in: {0}")]
    Index(String),
}

/// What a started sign-in keeps secret until its callback, sealed in its row.
#[derive(serde::Serialize, serde::Deserialize)]
struct PendingLogin {
    /// Hex SHA-256 of the binding cookie's value.
    binding: String,
    nonce: String,
    verifier: String,
    return_to: Option<String>,
}

/// The provider's tokens of a followed session, sealed in its row.
#[derive(serde::Serialize, serde::Deserialize)]
struct SealedTokens {
    access: String,
    refresh: Option<String>,
}

/// What a sealed row is bound to: its table and key, so no row opens as another.
fn associated(what: &str, key: &str) -> Vec<u8> {
    [b"stategate sso ", what.as_bytes(), b"\0", key.as_bytes()].concat()
}

/// A sign-in just started: where to send the browser, and the binding cookie's value.
#[derive(Debug)]
pub struct Started {
    pub authorize_url: String,
    pub binding: String,
}

/// What the callback brought, as received.
#[derive(Debug, Default)]
pub struct Callback<'a> {
    pub state: Option<&'a str>,
    pub code: Option<&'a str>,
    pub error: Option<&'a str>,
    /// RFC 9207's `iss`, if the provider sent one.
    pub iss: Option<&'a str>,
    /// The binding cookie's value.
    pub binding: Option<&'a str>,
}

/// A finished sign-in: who, with what grant, and the page to return to.
#[derive(Debug)]
pub struct SignedIn {
    pub identity: Identity,
    pub grant: Grant,
    pub return_to: Option<String>,
    /// What the session is re-checked with ([`Sso::track`]); never stored or logged.
    pub tokens: ProviderTokens,
}

/// The provider's access and refresh tokens of one sign-in (their `Debug` is redacted).
#[derive(Debug)]
pub struct ProviderTokens {
    access: AccessToken,
    refresh: Option<RefreshToken>,
}

impl ProviderTokens {
    fn seal(&self, key: &SealKey, session: &str) -> Result<Vec<u8>, String> {
        let plain = serde_json::to_vec(&SealedTokens {
            access: self.access.secret().clone(),
            refresh: self.refresh.as_ref().map(|r| r.secret().clone()),
        })
        .map_err(|e| e.to_string())?;
        key.seal(&associated("session", session), &plain)
            .map_err(|e| e.to_string())
    }

    fn open(key: &SealKey, session: &str, sealed: &[u8]) -> Option<ProviderTokens> {
        let plain = key.open(&associated("session", session), sealed).ok()?;
        let t: SealedTokens = serde_json::from_slice(&plain).ok()?;
        Some(ProviderTokens {
            access: AccessToken::new(t.access),
            refresh: t.refresh.map(RefreshToken::new),
        })
    }
}

/// This request's claim on checking a session at the provider. If the request goes
/// away before the check is recorded (the client left, the server stops), the claim
/// is released at once, so the session's other requests (on any node) do not wait for
/// it to lapse.
struct Claim {
    db: Db,
    session: String,
    until: i64,
    done: bool,
}

impl Claim {
    /// The check's outcome is recorded (the claim went with it).
    fn finished(mut self) {
        self.done = true;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (db, session, until) = (
            self.db.clone(),
            std::mem::take(&mut self.session),
            self.until,
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let released = db
                    .write(move |c| sso_rows::release_claim(c, &session, until).map_err(DbError::from))
                    .await;
                if let Err(e) = released {
                    tracing::warn!(error = %e, "cannot release a single sign-on check's claim; it lapses by itself");
                }
            });
        }
    }
}

/// A signed-in session to follow ([`Sso::follow`]), recorded in the transaction that
/// opens it.
struct Follow {
    key: SealKey,
    subject: String,
    tokens: ProviderTokens,
    /// Seconds.
    max_age: i64,
}

impl Follow {
    /// Follows the session whose id hashes to `session` from now.
    fn record(
        &self,
        conn: &Connection,
        session: &str,
    ) -> Result<(), crate::cluster::identity::AdminError> {
        let now = crate::tokens::now_ms();
        let sealed = self
            .tokens
            .seal(&self.key, session)
            .map_err(|e| DbError::Task(format!("cannot seal the provider tokens: {e}")))?;
        sso_rows::follow(
            conn,
            session,
            &self.subject,
            &sealed,
            now,
            now.saturating_add(self.max_age.saturating_mul(1000)),
        )?;
        Ok(())
    }
}

/// What re-checking a session at the provider found.
#[derive(Debug)]
pub enum Revalidated {
    /// Checked recently enough: nothing asked.
    Fresh,
    /// Asked now: the grant the user's groups give today (maybe another than before).
    Current(Grant),
    /// The session must end (the reason, for the log and the audit row).
    Ended(Refused),
    /// The index could not be read or written: nothing is known (the request fails,
    /// the session stays).
    Unknown(DbError),
}

struct Discovered {
    client: Arc<Client>,
    /// The provider advertised RFC 9207's `iss` parameter.
    iss_parameter: bool,
    at: Instant,
}

/// The single sign-on service: settings, the provider's discovered metadata, and the
/// index where started sign-ins and followed sessions are kept (`ui::sso_rows`), with
/// the key their secrets are sealed under.
pub struct Sso {
    settings: Settings,
    http: openidconnect::reqwest::Client,
    discovered: tokio::sync::Mutex<Option<Discovered>>,
    db: Db,
    key: SealKey,
}

impl Sso {
    /// `key` is the root key's single sign-on key (`RootKey::sso_key`).
    pub fn new(settings: Settings, db: Db, key: SealKey) -> Result<Sso, ConfigError> {
        let http = openidconnect::reqwest::Client::builder()
            // Following redirects would let a provider's answer point us anywhere.
            .redirect(openidconnect::reqwest::redirect::Policy::none())
            .timeout(PROVIDER_TIMEOUT)
            .build()
            .map_err(|e| invalid(format!("[oidc]: cannot build the HTTP client: {e}")))?;
        Ok(Sso {
            settings,
            http,
            discovered: tokio::sync::Mutex::new(None),
            db,
            key,
        })
    }

    /// The provider's name for the login page's button.
    pub fn display_name(&self) -> &str {
        &self.settings.display_name
    }

    /// The claim the user's groups are read from (`oidc.groups_claim`), which a user
    /// whose groups map to no role is told to ask about.
    pub fn groups_claim(&self) -> &str {
        &self.settings.groups_claim
    }

    /// How long a single sign-on session lasts from sign-in, in seconds.
    pub fn session_max_age(&self) -> i64 {
        self.settings.session_max_age
    }

    /// The client, discovered now if not yet or not recently (an older discovery is
    /// kept when the provider cannot be reached again), and whether the provider
    /// advertises RFC 9207's `iss` parameter.
    async fn client(&self) -> Result<(Arc<Client>, bool), Unavailable> {
        let mut discovered = self.discovered.lock().await;
        if let Some(d) = discovered.as_ref() {
            if d.at.elapsed() < REDISCOVER_AFTER {
                return Ok((d.client.clone(), d.iss_parameter));
            }
        }
        match ProviderMetadata::discover_async(self.settings.issuer.clone(), &self.http).await {
            Ok(metadata) => {
                let iss_parameter = metadata
                    .additional_metadata()
                    .authorization_response_iss_parameter_supported
                    == Some(true);
                let client = Client::from_provider_metadata(
                    metadata,
                    self.settings.client_id.clone(),
                    self.settings.client_secret.clone(),
                )
                .set_redirect_uri(self.settings.redirect.clone());
                let client = Arc::new(client);
                *discovered = Some(Discovered {
                    client: client.clone(),
                    iss_parameter,
                    at: Instant::now(),
                });
                Ok((client, iss_parameter))
            }
            Err(e) => {
                let why = error_chain(&e);
                match discovered.as_ref() {
                    Some(old) => {
                        tracing::warn!(error = %why, "oidc.issuer_url: rediscovery failed; keeping the provider metadata read before");
                        Ok((old.client.clone(), old.iss_parameter))
                    }
                    None => Err(Unavailable::Discovery(why)),
                }
            }
        }
    }

    /// Starts a sign-in: the provider's authorization URL (code flow, PKCE S256,
    /// `state` and nonce) and the value of the cookie that binds it to this browser.
    pub async fn start(&self, return_to: Option<String>) -> Result<Started, Unavailable> {
        let (client, _) = self.client().await?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = client
            .authorize_url(
                CoreAuthenticationFlow::AuthorizationCode,
                CsrfToken::new_random,
                Nonce::new_random,
            )
            .set_pkce_challenge(challenge);
        for scope in &self.settings.scopes {
            request = request.add_scope(Scope::new(scope.clone()));
        }
        let (url, state, nonce) = request.url();
        let binding = CsrfToken::new_random().secret().clone();
        let state = crate::tokens::hash(state.secret().as_bytes());
        let plain = serde_json::to_vec(&PendingLogin {
            binding: crate::tokens::hash(binding.as_bytes()),
            nonce: nonce.secret().clone(),
            verifier: verifier.secret().clone(),
            return_to,
        })
        .map_err(|e| Unavailable::Index(e.to_string()))?;
        let sealed = self
            .key
            .seal(&associated("login", &state), &plain)
            .map_err(|e| Unavailable::Index(e.to_string()))?;
        let now = crate::tokens::now();
        let stored = self
            .db
            .write(move |c| {
                sso_rows::insert_login(c, &state, &sealed, now, now - PENDING_SECONDS as i64)
                    .map_err(DbError::from)
            })
            .await
            .map_err(|e| Unavailable::Index(e.to_string()))?;
        if !stored {
            return Err(Unavailable::Busy);
        }
        Ok(Started {
            authorize_url: url.to_string(),
            binding,
        })
    }

    /// Finishes a sign-in from the provider's callback: the pending sign-in is taken
    /// out first (one use, whatever follows), then the binding cookie, the code
    /// exchange (with the PKCE verifier), the ID token and the group mapping.
    pub async fn finish(&self, callback: Callback<'_>) -> Result<SignedIn, Refused> {
        let state = bounded(callback.state).ok_or(Refused::NoPending)?;
        let login = self.take_login(state).await?;
        let binding = bounded(callback.binding).ok_or(Refused::Binding)?;
        let bound = crate::tokens::hash(binding.as_bytes());
        if !bool::from(bound.as_bytes().ct_eq(login.binding.as_bytes())) {
            return Err(Refused::Binding);
        }
        // Discovered before the sign-in started; refreshed only if that was long ago.
        let (client, iss_parameter) = self
            .client()
            .await
            .map_err(|e| Refused::Exchange(e.to_string()))?;
        // RFC 9207: checked before the error and the code are looked at, so a response
        // of another provider is refused whatever it says.
        match callback.iss {
            Some(iss) if iss != self.settings.issuer.as_str() => {
                return Err(Refused::Issuer(iss.chars().take(256).collect()))
            }
            None if iss_parameter => return Err(Refused::NoIssuer),
            _ => {}
        }
        if let Some(error) = callback.error {
            let error: String = error
                .chars()
                .filter(|c| c.is_ascii_graphic())
                .take(64)
                .collect();
            return Err(Refused::Provider(error));
        }
        let code = bounded(callback.code).ok_or(Refused::NoCode)?;
        let response = client
            .exchange_code(AuthorizationCode::new(code.to_string()))
            .map_err(|e| Refused::Exchange(error_chain(&e)))?
            .set_pkce_verifier(PkceCodeVerifier::new(login.verifier))
            .request_async(&self.http)
            .await
            .map_err(|e| Refused::Exchange(error_chain(&e)))?;
        let id_token = response
            .extra_fields()
            .id_token()
            .ok_or(Refused::NoIdToken)?;
        let claims = id_token
            .claims(&client.id_token_verifier(), &Nonce::new(login.nonce))
            .map_err(|e| Refused::IdToken(e.to_string()))?;
        let email = match claims.email_verified() {
            Some(false) => None,
            _ => claims.email().map(|e| e.as_str().to_string()),
        };
        let tokens = ProviderTokens {
            access: response.access_token().clone(),
            refresh: response.refresh_token().cloned(),
        };
        let in_token = claims
            .additional_claims()
            .claims
            .get(&self.settings.groups_claim);
        let groups = match in_token {
            None if self.settings.groups_from_userinfo => {
                let subject = claims.subject().clone();
                let info = self.user_info(&client, &tokens.access, subject).await?;
                groups_of(
                    info.additional_claims()
                        .claims
                        .get(&self.settings.groups_claim),
                )
            }
            claim => groups_of(claim),
        };
        let identity = Identity {
            issuer: claims.issuer().as_str().to_string(),
            subject: claims.subject().as_str().to_string(),
            email,
            groups,
        };
        let grant = self
            .settings
            .roles
            .grant_for(&identity.groups)
            .ok_or(Refused::NoRole)?;
        Ok(SignedIn {
            identity,
            grant,
            return_to: login.return_to,
            tokens,
        })
    }

    /// The userinfo claims of `subject` (the crate checks the answer names it).
    async fn user_info(
        &self,
        client: &Client,
        access: &AccessToken,
        subject: SubjectIdentifier,
    ) -> Result<UserInfoClaims<OtherClaims, CoreGenderClaim>, Refused> {
        client
            .user_info(access.clone(), Some(subject))
            .map_err(|e| Refused::UserInfo(error_chain(&e)))?
            .request_async(&self.http)
            .await
            .map_err(|e| Refused::UserInfo(error_chain(&e)))
    }

    /// Takes the sign-in `state` names out of the index (one use), if it is not too
    /// old and opens under this root key.
    async fn take_login(&self, state: &str) -> Result<PendingLogin, Refused> {
        let state = crate::tokens::hash(state.as_bytes());
        let expired_before = crate::tokens::now() - PENDING_SECONDS as i64;
        let key = state.clone();
        let sealed = self
            .db
            .write(move |c| sso_rows::take_login(c, &key, expired_before).map_err(DbError::from))
            .await
            .map_err(|e| Refused::Index(e.to_string()))?
            .ok_or(Refused::NoPending)?;
        let plain = self
            .key
            .open(&associated("login", &state), &sealed)
            .map_err(|_| Refused::NoPending)?;
        serde_json::from_slice(&plain).map_err(|_| Refused::NoPending)
    }

    /// Opens the UI session of a user the provider signed in, with `grant`
    /// (`session::open_sso`), and follows it ([`Follow::record`]) in the same write
    /// transaction, so every node knows it from the start. `None`, with nothing stored,
    /// when the user's name belongs to another operator.
    pub async fn open_session(
        &self,
        identity: Identity,
        grant: Grant,
        tokens: ProviderTokens,
        now: i64,
    ) -> Result<Option<super::session::Opened>, crate::error::Error> {
        let lifetime = self.session_max_age();
        let follow = self.follow(identity.subject.clone(), tokens);
        self.db
            .write(move |conn| {
                let name = identity.operator_name();
                let user = crate::operator::identity::SsoUser {
                    issuer: &identity.issuer,
                    subject: &identity.subject,
                    name: &name,
                    grant: &grant,
                };
                let email = identity.email.as_deref();
                let opened = super::session::open_sso(conn, user, email, lifetime, now)?;
                if let Some(opened) = &opened {
                    follow.record(conn, &opened.session.sha256)?;
                }
                Ok(opened)
            })
            .await
            .map_err(crate::operator::admin_error)
    }

    /// What following a signed-in session needs: recorded with
    /// [`Follow::record`] in the transaction that opens the session, so every node
    /// follows it from the start; it ends at logout ([`sso_rows::forget`]), when a
    /// check ends it, or after `session_max_age`.
    fn follow(&self, subject: String, tokens: ProviderTokens) -> Follow {
        Follow {
            key: self.key.clone(),
            subject,
            tokens,
            max_age: self.settings.session_max_age,
        }
    }

    /// Is the single sign-on session whose token hash is `session` still what its
    /// grant says? Checked recently: [`Revalidated::Fresh`]. Otherwise this request
    /// claims the check in the index (on another node or here, a racing request of the
    /// same session waits for the one that claimed it) and asks the provider now
    /// (userinfo with the access token, and once the access token is refused, with one
    /// the refresh token gets); the groups it names today are mapped again. A session
    /// not followed, refused by the provider, or whose user has no mapped group any
    /// more ends (fail closed); its row is deleted then.
    pub async fn revalidate(&self, session: &str) -> Revalidated {
        let revalidate = i64::try_from(self.settings.revalidate.as_millis()).unwrap_or(i64::MAX);
        loop {
            let now = crate::tokens::now_ms();
            let stale_before = now.saturating_sub(revalidate);
            let key = session.to_string();
            let found = self
                .db
                .read_quick(move |c| sso_rows::followed(c, &key, now))
                .await;
            let followed = match found {
                Ok(Some(f)) => f,
                Ok(None) => return Revalidated::Ended(Refused::Untracked),
                Err(e) => return Revalidated::Unknown(e),
            };
            if followed.checked_ms > stale_before {
                return Revalidated::Fresh;
            }
            if followed.checking_until > now {
                // Another request is asking the provider: its answer is this one's.
                tokio::time::sleep(CHECK_POLL).await;
                continue;
            }
            let key = session.to_string();
            let until = now.saturating_add(CHECK_CLAIM_MS);
            let claimed = self
                .db
                .write(move |c| {
                    sso_rows::claim_check(c, &key, stale_before, now, until).map_err(DbError::from)
                })
                .await;
            match claimed {
                Ok(Some(row)) => {
                    let claim = Claim {
                        db: self.db.clone(),
                        session: session.to_string(),
                        until,
                        done: false,
                    };
                    let checked = self.check(session, row).await;
                    claim.finished();
                    return checked;
                }
                // Claimed by another, checked, or ended since it was read: look again.
                Ok(None) => continue,
                Err(e) => return Revalidated::Unknown(e),
            }
        }
    }

    /// Asks the provider about the claimed session `row` and records the answer: the
    /// renewed tokens and the time, or the session's end.
    async fn check(&self, session: &str, row: sso_rows::Followed) -> Revalidated {
        let found = match ProviderTokens::open(&self.key, session, &row.sealed) {
            Some(mut tokens) => self.ask(&row.subject, &mut tokens).await.and_then(|grant| {
                let sealed = tokens.seal(&self.key, session).map_err(Refused::Index)?;
                Ok((grant, sealed))
            }),
            None => Err(Refused::Untracked),
        };
        let key = session.to_string();
        let now = crate::tokens::now_ms();
        match found {
            Ok((grant, sealed)) => {
                let recorded = self
                    .db
                    .write(move |c| sso_rows::checked(c, &key, &sealed, now).map_err(DbError::from))
                    .await;
                match recorded {
                    Ok(()) => Revalidated::Current(grant),
                    Err(e) => Revalidated::Unknown(e),
                }
            }
            Err(why) => {
                let forgotten = self
                    .db
                    .write(move |c| sso_rows::forget(c, &key).map_err(DbError::from))
                    .await;
                match forgotten {
                    Ok(()) => Revalidated::Ended(why),
                    Err(e) => Revalidated::Unknown(e),
                }
            }
        }
    }

    /// The grant the provider's answer gives `subject` today; `tokens` are renewed
    /// when the access token was refused.
    async fn ask(&self, subject: &str, tokens: &mut ProviderTokens) -> Result<Grant, Refused> {
        let (client, _) = self
            .client()
            .await
            .map_err(|e| Refused::UserInfo(e.to_string()))?;
        let subject = SubjectIdentifier::new(subject.to_string());
        let info = match self
            .user_info(&client, &tokens.access, subject.clone())
            .await
        {
            Ok(info) => info,
            Err(first) => {
                let Some(refresh) = tokens.refresh.clone() else {
                    return Err(first);
                };
                let response = client
                    .exchange_refresh_token(&refresh)
                    .map_err(|e| Refused::Exchange(error_chain(&e)))?
                    .request_async(&self.http)
                    .await
                    .map_err(|e| Refused::Exchange(error_chain(&e)))?;
                *tokens = ProviderTokens {
                    access: response.access_token().clone(),
                    // A provider that rotates refresh tokens sends a new one.
                    refresh: response.refresh_token().cloned().or(Some(refresh)),
                };
                self.user_info(&client, &tokens.access, subject).await?
            }
        };
        let groups = groups_of(
            info.additional_claims()
                .claims
                .get(&self.settings.groups_claim),
        );
        self.settings
            .roles
            .grant_for(&groups)
            .ok_or(Refused::NoRole)
    }
}

/// A single sign-on session, re-checked at the provider when its last check is older
/// than `oidc.revalidate_seconds` ([`Sso::revalidate`]): with the grant the user's
/// groups give today (a change is audited), or `None` when it has ended (revoked and
/// audited before anything else happens). `sso` is `None` when `[oidc]` is not
/// configured (any more): the session ends.
pub async fn recheck_session(
    sso: Option<&Sso>,
    sessions: &super::session::Sessions,
    me: super::session::UiSession,
) -> Result<Option<super::session::UiSession>, crate::error::Error> {
    let checked = match sso {
        Some(sso) => sso.revalidate(&me.sha256).await,
        None => Revalidated::Ended(Refused::NotConfigured),
    };
    match checked {
        Revalidated::Fresh => Ok(Some(me)),
        Revalidated::Unknown(e) => Err(e.into()),
        Revalidated::Current(grant) => sessions.regrant(me, grant).await,
        Revalidated::Ended(why) => {
            tracing::info!(reason = %why, operator = %me.operator.email, "single sign-on session ended");
            sessions.end_sso(me, why.audit_reason()).await?;
            Ok(None)
        }
    }
}

/// A callback value worth looking at: present, not empty, not absurdly long.
fn bounded(value: Option<&str>) -> Option<&str> {
    value.filter(|v| !v.is_empty() && v.len() <= MAX_PARAM)
}

/// The groups a claim lists: an array of strings (others skipped) or one string.
fn groups_of(claim: Option<&serde_json::Value>) -> Vec<String> {
    match claim {
        Some(serde_json::Value::String(one)) => vec![one.clone()],
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .take(MAX_GROUPS)
            .collect(),
        _ => Vec::new(),
    }
}

/// An error and its causes, on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(roles: &str) -> OidcConfig {
        let text = format!(
            "issuer_url = \"https://id.example.com/realms/ops\"\nclient_id = \"stategate\"\nclient_secret = \"s3cret\"\n[roles]\n{roles}"
        );
        toml::from_str(&text).unwrap()
    }

    fn settings(c: &OidcConfig, public: Option<&str>) -> Result<Settings, String> {
        Settings::from_config(c, public, |_| Ok("from-file\n".into())).map_err(|e| e.to_string())
    }

    const PUBLIC: Option<&str> = Some("https://sg.example.com/");

    #[test]
    fn config_is_checked_whole_naming_the_key() {
        let good = settings(&config("\"sre\" = \"operator\""), PUBLIC).unwrap();
        assert_eq!(
            good.redirect.as_str(),
            "https://sg.example.com/ui/login/oidc/callback"
        );
        assert_eq!(good.scopes, ["email", "profile"]);
        assert_eq!(good.issuer.as_str(), "https://id.example.com/realms/ops");
        assert_eq!(good.groups_claim, "groups");
        assert_eq!(good.session_max_age, 8 * 3600);
        assert_eq!(good.revalidate, Duration::from_secs(300));
        assert!(!good.groups_from_userinfo);
        // (what is changed, part of the refusal; None: accepted)
        type Edit = fn(&mut OidcConfig);
        let table: &[(&str, Edit, Option<&str>)] = &[
            (
                "http issuer",
                |c| c.issuer_url = "http://id.example.com".into(),
                Some("oidc.issuer_url must be https"),
            ),
            (
                "loopback http issuer",
                |c| c.issuer_url = "http://127.0.0.1:4000".into(),
                None,
            ),
            (
                "localhost http issuer",
                |c| c.issuer_url = "http://localhost:4000/".into(),
                None,
            ),
            (
                "ipv6 loopback issuer",
                |c| c.issuer_url = "http://[::1]:4000".into(),
                None,
            ),
            (
                "not a url",
                |c| c.issuer_url = "id.example.com".into(),
                Some("oidc.issuer_url: not a URL"),
            ),
            (
                "ftp issuer",
                |c| c.issuer_url = "ftp://id.example.com".into(),
                Some("oidc.issuer_url must be https"),
            ),
            (
                "query",
                |c| c.issuer_url = "https://id.example.com/?a=1".into(),
                Some("oidc.issuer_url: no query"),
            ),
            (
                "no client id",
                |c| c.client_id = " ".into(),
                Some("oidc.client_id is not set"),
            ),
            (
                "both secrets",
                |c| c.client_secret_file = Some("/s".into()),
                Some("set one, not both"),
            ),
            (
                "empty secret",
                |c| c.client_secret = Some("".into()),
                Some("oidc.client_secret is empty"),
            ),
            ("public client", |c| c.client_secret = None, None),
            (
                "secret file",
                |c| {
                    c.client_secret = None;
                    c.client_secret_file = Some("/s".into());
                },
                None,
            ),
            (
                "blank claim",
                |c| c.groups_claim = " ".into(),
                Some("oidc.groups_claim is empty"),
            ),
            (
                "bad scope",
                |c| c.scopes = vec!["a b".into()],
                Some("oidc.scopes"),
            ),
            (
                "long name",
                |c| c.display_name = "x".repeat(65),
                Some("oidc.display_name"),
            ),
            (
                "no roles",
                |c| c.roles.clear(),
                Some("oidc.roles maps no group"),
            ),
            (
                "session too short",
                |c| c.session_max_age_seconds = 59,
                Some("oidc.session_max_age_seconds"),
            ),
            (
                "session past the UI's lifetime",
                |c| c.session_max_age_seconds = 12 * 3600 + 1,
                Some("oidc.session_max_age_seconds"),
            ),
            (
                "session of 12 hours",
                |c| c.session_max_age_seconds = 12 * 3600,
                None,
            ),
            (
                "never revalidated",
                |c| c.revalidate_seconds = 0,
                Some("oidc.revalidate_seconds"),
            ),
            (
                "revalidated after the session ends",
                |c| {
                    c.session_max_age_seconds = 600;
                    c.revalidate_seconds = 601;
                },
                Some("oidc.revalidate_seconds"),
            ),
            (
                "revalidated every second",
                |c| c.revalidate_seconds = 1,
                None,
            ),
        ];
        for (what, edit, want) in table {
            let mut c = config("\"sre\" = \"operator\"");
            edit(&mut c);
            let got = settings(&c, PUBLIC);
            match want {
                None => assert!(got.is_ok(), "{what}: {got:?}"),
                Some(part) => {
                    let e = got.expect_err(what);
                    assert!(e.contains(part), "{what}: {e}");
                    assert!(!e.contains("s3cret"), "{what}: the secret leaked: {e}");
                }
            }
        }
        let from_file = {
            let mut c = config("\"sre\" = \"operator\"");
            c.client_secret = None;
            c.client_secret_file = Some("/s".into());
            settings(&c, PUBLIC).unwrap()
        };
        assert_eq!(from_file.client_secret.unwrap().secret(), "from-file");
        let unreadable = {
            let mut c = config("\"sre\" = \"operator\"");
            c.client_secret = None;
            c.client_secret_file = Some("/nope".into());
            Settings::from_config(&c, PUBLIC, |_| {
                Err(std::io::Error::from(std::io::ErrorKind::NotFound))
            })
            .unwrap_err()
            .to_string()
        };
        assert!(
            unreadable.contains("oidc.client_secret_file"),
            "{unreadable}"
        );
        // public_url: required, https or loopback.
        let c = config("\"sre\" = \"operator\"");
        for (public, want) in [
            (None, Some("[oidc] needs public_url")),
            (Some(" "), Some("[oidc] needs public_url")),
            (
                Some("http://sg.example.com"),
                Some("public_url must be https"),
            ),
            (Some("sg.example.com"), Some("public_url: not a URL")),
            (Some("http://127.0.0.1:8080"), None),
        ] {
            match (settings(&c, public), want) {
                (Ok(_), None) => {}
                (Err(e), Some(part)) => assert!(e.contains(part), "{public:?}: {e}"),
                (got, _) => panic!("{public:?}: {got:?}"),
            }
        }
    }

    #[test]
    fn role_mappings_are_refused_naming_the_group() {
        // (roles table, part of the refusal; None: accepted)
        let table: &[(&str, Option<&str>)] = &[
            ("\"dev\" = \"viewer\"", None),
            (
                "\"team-a\" = { role = \"operator\", workspaces = \"team-a-*\" }",
                None,
            ),
            (
                "\"team-a\" = { role = \"operator\", workspaces = [\"a-*\", \"b\"] }",
                None,
            ),
            (
                "\"team-a\" = { role = \"operator\", workspaces = \"a-*,b\" }",
                None,
            ),
            (
                "\"dev\" = \"root\"",
                Some("oidc.roles.\"dev\": unknown role"),
            ),
            (
                "\"dev\" = \"Viewer\"",
                Some("oidc.roles.\"dev\": unknown role"),
            ),
            (
                "\"dev\" = \" viewer\"",
                Some("oidc.roles.\"dev\": unknown role"),
            ),
            ("\"dev\" = 3", Some("oidc.roles.\"dev\": unknown role")),
            (
                "\"dev\" = { workspaces = \"a\" }",
                Some("oidc.roles.\"dev\": unknown role"),
            ),
            (
                "\"dev\" = { role = \"viewer\", scope = \"a\" }",
                Some("unknown key \"scope\""),
            ),
            (
                "\"dev\" = { role = \"viewer\", workspaces = \"a/b\" }",
                Some("oidc.roles.\"dev\".workspaces"),
            ),
            (
                "\"dev\" = { role = \"viewer\", workspaces = \"\" }",
                Some("oidc.roles.\"dev\".workspaces: empty"),
            ),
            (
                "\"dev\" = { role = \"viewer\", workspaces = [1] }",
                Some("oidc.roles.\"dev\".workspaces"),
            ),
            (
                "\"dev\" = { role = \"viewer\", workspaces = 1 }",
                Some("oidc.roles.\"dev\".workspaces"),
            ),
            ("\"\" = \"viewer\"", Some("an empty group name")),
        ];
        for (roles, want) in table {
            let got = settings(&config(roles), PUBLIC);
            match want {
                None => assert!(got.is_ok(), "{roles}: {got:?}"),
                Some(part) => {
                    let e = got.expect_err(roles);
                    assert!(e.contains(part), "{roles}: {e}");
                }
            }
        }
        // Too many patterns for one role, all mappings together.
        let many: String = (0..33)
            .map(|i| format!("\"g{i}\" = {{ role = \"viewer\", workspaces = \"w{i}\" }}\n"))
            .collect();
        let e = settings(&config(&many), PUBLIC).unwrap_err();
        assert!(e.contains("at most 32"), "{e}");
    }

    #[test]
    fn the_highest_mapped_role_wins() {
        let c = config(
            "\"platform-admins\" = \"admin\"\n\"sre\" = \"operator\"\n\"dev\" = \"viewer\"\n\
             \"team-a\" = { role = \"operator\", workspaces = \"team-a-*\" }\n\
             \"team-b\" = { role = \"operator\", workspaces = [\"team-b-*\", \"team-a-*\"] }\n\
             \"audit\" = { role = \"viewer\", workspaces = \"prod-*\" }",
        );
        let map = settings(&c, PUBLIC).unwrap().roles;
        let g = |role: &str, w: Option<&str>| Some(Grant::parse(role, w).unwrap());
        // (groups, grant)
        let table: &[(&[&str], Option<Grant>)] = &[
            (&[], None),
            (&["nobody", "Dev", "dev "], None),
            (&["dev"], g("viewer", None)),
            (&["audit"], g("viewer", Some("prod-*"))),
            // Unlimited at the top role beats limited ones at it.
            (&["audit", "dev"], g("viewer", None)),
            (&["dev", "sre"], g("operator", None)),
            (&["platform-admins", "dev", "team-a"], g("admin", None)),
            // A limited higher role wins over an unlimited lower one.
            (&["dev", "team-a"], g("operator", Some("team-a-*"))),
            // Patterns of the mappings at the top role are joined, once each.
            (
                &["team-a", "team-b"],
                g("operator", Some("team-a-*,team-b-*")),
            ),
            (
                &["team-b", "team-a", "audit"],
                g("operator", Some("team-a-*,team-b-*")),
            ),
            (&["team-a", "sre"], g("operator", None)),
        ];
        for (groups, want) in table {
            let groups: Vec<String> = groups.iter().map(|s| s.to_string()).collect();
            assert_eq!(&map.grant_for(&groups), want, "{groups:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_check_whose_request_went_away_releases_its_claim() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db"), &[sso_rows::SCHEMA]).unwrap();
        let claimed = |until: i64| {
            let db = db.clone();
            async move {
                db.write(move |c| {
                    sso_rows::follow(c, "s", "alice", b"x", 0, i64::MAX)?;
                    sso_rows::claim_check(c, "s", 0, 1, until).map_err(DbError::from)
                })
                .await
                .unwrap()
                .is_some()
            }
        };
        let until_of = || {
            let db = db.clone();
            async move {
                db.read(|c| sso_rows::followed(c, "s", 1))
                    .await
                    .unwrap()
                    .unwrap()
                    .checking_until
            }
        };
        // (finished, released)
        for (finished, released) in [(true, false), (false, true)] {
            assert!(claimed(1000).await);
            let claim = Claim {
                db: db.clone(),
                session: "s".into(),
                until: 1000,
                done: false,
            };
            if finished {
                claim.finished();
            } else {
                drop(claim);
            }
            let mut seen = until_of().await;
            for _ in 0..100 {
                if seen == 0 || !released {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                seen = until_of().await;
            }
            assert_eq!(seen == 0, released, "finished {finished}");
            db.write(|c| sso_rows::forget(c, "s").map_err(DbError::from))
                .await
                .unwrap();
        }
    }

    #[test]
    fn sealed_provider_tokens_open_only_for_their_own_session() {
        let key = crate::crypto::RootKey::from_bytes([7; 32]).sso_key();
        let other = crate::crypto::RootKey::from_bytes([8; 32]).sso_key();
        let tokens = ProviderTokens {
            access: AccessToken::new("at-secret".into()),
            refresh: Some(RefreshToken::new("rt-secret".into())),
        };
        let sealed = tokens.seal(&key, "s1").unwrap();
        assert!(!String::from_utf8_lossy(&sealed).contains("secret"));
        let opened = ProviderTokens::open(&key, "s1", &sealed).unwrap();
        assert_eq!(opened.access.secret(), "at-secret");
        assert_eq!(opened.refresh.unwrap().secret(), "rt-secret");
        // (session, key, opens)
        for (session, key, opens) in [("s2", &key, false), ("s1", &other, false)] {
            assert_eq!(ProviderTokens::open(key, session, &sealed).is_some(), opens);
        }
        // A sign-in's sealed row is no session's, whatever its key.
        let login = key.seal(&associated("login", "s1"), b"{}").unwrap();
        assert!(ProviderTokens::open(&key, "s1", &login).is_none());
    }

    #[test]
    fn groups_claims_and_operator_names() {
        use serde_json::json;
        let table = [
            (json!(["a", "b"]), vec!["a", "b"]),
            (json!("a"), vec!["a"]),
            (json!(["a", 1, null, {"x": 1}]), vec!["a"]),
            (json!(1), vec![]),
            (json!({"a": true}), vec![]),
        ];
        for (claim, want) in table {
            assert_eq!(groups_of(Some(&claim)), want, "{claim}");
        }
        assert!(groups_of(None).is_empty());
        let many = serde_json::Value::Array((0..5000).map(|i| json!(i.to_string())).collect());
        assert_eq!(groups_of(Some(&many)).len(), MAX_GROUPS);

        let who = |subject: &str, email: Option<&str>| Identity {
            issuer: "https://ID.example.com/realms/x".into(),
            subject: subject.into(),
            email: email.map(str::to_string),
            groups: vec![],
        };
        assert_eq!(
            who("u1", Some("Alice@Example.com")).operator_name(),
            "alice@example.com"
        );
        assert_eq!(who("u1", None).operator_name(), "u1@id.example.com");
        assert_eq!(
            who("a@b c", Some("not an email")).operator_name(),
            "a_b_c@id.example.com"
        );
    }
}
