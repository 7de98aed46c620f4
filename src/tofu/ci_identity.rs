//! A CI pipeline's own OIDC identity token as a workspace credential
//! (`[[ci_identity]]`): GitHub Actions, GitLab CI or any issuer that signs its jobs'
//! tokens, so a pipeline stores no stategate secret.
//!
//! What is trusted: the configured issuer's keys only, read from its discovery document
//! and JWKS over HTTPS (the configured CA, else the built-in and system roots), kept per
//! issuer (at most [`MAX_KEYS`]), read again when a token names a key not held (at most
//! once per [`MIN_REFRESH`]) and, in the background, when an hour old. Nothing of a key
//! is ever taken from the token (`jwk`, `jku`, `x5c` are ignored; `crit` refuses it).
//! Only the asymmetric algorithms of [`algorithm`] are accepted, each with a key of its
//! own type (`alg: none`, HMAC and a key of another type refuse the token). The issuer
//! being unreachable refuses its tokens, never other credentials.
//!
//! What it grants: the rules of its issuer, all of them (the union): each whose claim
//! conditions hold (`*` matches any run of characters; a claim that is missing, not a
//! string, boolean or number, longer than 256 bytes or holding a control character never
//! matches) and one of whose workspace patterns matches gives its scope; the highest
//! scope given is the credential's. A pattern may put in a claim (`ci-{environment}`)
//! only when the claim's value is itself a workspace name without `..`, so a claim never
//! injects a wildcard. No rule → the same refusal as a wrong secret.
//!
//! How long: a token is accepted between its `nbf`/`iat` and its `exp` (with
//! [`LEEWAY`] for clocks). The first request a token is accepted for, while valid,
//! records its SHA-256 in `tf_ci_tokens` (owned here) with `max_run_seconds` from then
//! (or its `exp`, if later): until that time it is still accepted after its `exp`, so an
//! apply that outlives its token finishes, and after it the token is accepted no more
//! (what a lease on its locks relies on, `tofu::lock::Gone::IdentityWindowEnded`). A token first presented after it expired was never recorded and is
//! refused; so is one replayed after its window. The record is written once per token,
//! by an accepted request only (a refusal changes nothing).
//!
//! Who: `ci:<name>:<identity>`, the identity written from the claims by the issuer's
//! `identity` template (printable ASCII only), in lock rows, versions and the audit.
//!
//! What it costs: a token's signature is checked once. A token accepted for a request
//! is kept by its SHA-256 (at most [`MAX_CHECKED`], with what its check established and
//! the generation of its issuer's keys it was checked under), so the same token's later
//! requests skip parsing and the signature check — an RS256 check is a good part of a
//! small request's CPU, and a Terraform run sends each request with the same token.
//! Only the signature's verdict is kept: its times, rules and window are judged again
//! on every request, and once the issuer's keys are read again (a new generation,
//! whatever the JWKS holds) every kept token is checked again under the keys then held,
//! so a key taken out of the JWKS stops its tokens as soon as it would without this.
//! A token refused is never kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use openidconnect::core::{
    CoreJsonWebKey, CoreJsonWebKeySet, CoreJsonWebKeyType, CoreJwsSigningAlgorithm,
};
use openidconnect::JsonWebKey;
use serde_json::{Map, Value};

use super::access::{Credential, Scope};
use crate::config::{CiIdentityConfig, CiRuleConfig};
use crate::names::{glob_match, Pattern};
use crate::store::sql::{params, Connection, OptionalExtension};
use crate::store::{Db, DbError};

/// The first-seen records; `crate::schema` applies it.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tf_ci_tokens (
    token_sha256     TEXT PRIMARY KEY,  -- hex SHA-256 of the token; the token is never stored
    identity         TEXT NOT NULL,
    first_seen_unix  INTEGER NOT NULL,
    until_unix       INTEGER NOT NULL   -- accepted after its exp until then, never later
) WITHOUT ROWID;
-- Whether an identity still has a token accepted (a lease on its locks, `tofu::lock`).
CREATE INDEX IF NOT EXISTS tf_ci_tokens_by_identity ON tf_ci_tokens (identity, until_unix);
"#;

/// Longest token looked at (GitHub's and GitLab's are 1-2 KiB).
pub const MAX_TOKEN_LEN: usize = 8 * 1024;
/// Clock difference tolerated on `exp`, `nbf` and `iat`, in seconds.
pub const LEEWAY: i64 = 15;
/// Longest `max_run_seconds` accepted (a day).
pub const MAX_RUN_LIMIT: u64 = 24 * 3600;
/// Keys kept per issuer; the rest of a JWKS is ignored.
pub const MAX_KEYS: usize = 32;
/// A token naming a key not held reads the JWKS again at most this often.
pub const MIN_REFRESH: Duration = Duration::from_secs(30);
/// Held keys are read again (in the background) when this old.
const KEYS_MAX_AGE: Duration = Duration::from_secs(3600);
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest discovery document or JWKS read.
const MAX_DOCUMENT: usize = 256 * 1024;
const MAX_ISSUERS: usize = 16;
const MAX_RULES: usize = 64;
const MAX_CONDITIONS: usize = 16;
const MAX_CLAIM_LEN: usize = 256;
const MAX_IDENTITY_LEN: usize = 300;
/// Records kept at most (the oldest windows make room first).
const MAX_RECORDS: i64 = 100_000;
/// Records this node remembers (a cache of rows that never change).
const MAX_REMEMBERED: usize = 10_000;
/// Accepted tokens whose signature check this node keeps (each ~3 KiB of claims).
pub const MAX_CHECKED: usize = 1024;

/// Whether `secret` has a JWT's shape (three base64url parts, a JSON header), within
/// [`MAX_TOKEN_LEN`]: only such a secret is judged here.
pub fn is_token_shaped(secret: &[u8]) -> bool {
    secret.len() <= MAX_TOKEN_LEN
        && secret.starts_with(b"eyJ")
        && secret.iter().filter(|b| **b == b'.').count() == 2
        && secret
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
}

/// The signing algorithms accepted: asymmetric only, by the name a JWS header uses.
pub fn algorithm(name: &str) -> Option<CoreJwsSigningAlgorithm> {
    use CoreJwsSigningAlgorithm as A;
    Some(match name {
        "RS256" => A::RsaSsaPkcs1V15Sha256,
        "RS384" => A::RsaSsaPkcs1V15Sha384,
        "RS512" => A::RsaSsaPkcs1V15Sha512,
        "PS256" => A::RsaSsaPssSha256,
        "PS384" => A::RsaSsaPssSha384,
        "PS512" => A::RsaSsaPssSha512,
        "ES256" => A::EcdsaP256Sha256,
        "ES384" => A::EcdsaP384Sha384,
        _ => return None,
    })
}

/// A `[[ci_identity]]` that cannot be meant. Names the entry and key, states the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ci_identity[{index}].{key}: {rule}")]
pub struct InvalidCiIdentity {
    /// 1-based, as a person counts the entries in the file.
    index: usize,
    key: String,
    rule: String,
}

/// A token's parts, before anything in it is trusted.
struct Parsed<'a> {
    alg: CoreJwsSigningAlgorithm,
    kid: String,
    claims: Map<String, Value>,
    signed: &'a [u8],
    signature: Vec<u8>,
}

#[derive(serde::Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    crit: Option<Value>,
}

fn parse(token: &[u8]) -> Option<Parsed<'_>> {
    if !is_token_shaped(token) {
        return None;
    }
    let mut parts = token.split(|b| *b == b'.');
    let (head, body, signature) = (parts.next()?, parts.next()?, parts.next()?);
    let header: Header = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(head).ok()?).ok()?;
    // A critical extension is one we do not understand, by definition.
    if header.crit.is_some() {
        return None;
    }
    let alg = algorithm(&header.alg)?;
    let kid = header.kid.filter(|k| !k.is_empty() && k.len() <= 256)?;
    let claims = match serde_json::from_slice(&URL_SAFE_NO_PAD.decode(body).ok()?).ok()? {
        Value::Object(map) => map,
        _ => return None,
    };
    let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
    if signature.is_empty() {
        return None;
    }
    Some(Parsed {
        alg,
        kid,
        claims,
        signed: &token[..head.len() + 1 + body.len()],
        signature,
    })
}

/// A claim as text: a string, boolean or number, at most 256 bytes, no control
/// character; anything else is no value at all.
fn claim_text(claims: &Map<String, Value>, name: &str) -> Option<String> {
    let text = match claims.get(name)? {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    (text.len() <= MAX_CLAIM_LEN && !text.chars().any(char::is_control)).then_some(text)
}

/// A time claim in whole seconds.
fn claim_time(claims: &Map<String, Value>, name: &str) -> Option<i64> {
    let n = claims.get(name)?.as_number()?;
    n.as_i64().or_else(|| n.as_f64().map(|f| f as i64))
}

/// Where `claims` put a token at `now`: `Some(true)` within its validity, `Some(false)`
/// expired (accepted only inside its recorded window), `None` never (no `exp`, or not
/// yet valid).
pub fn validity(claims: &Map<String, Value>, now: i64) -> Option<bool> {
    let exp = claim_time(claims, "exp")?;
    for early in ["nbf", "iat"] {
        if claims.contains_key(early) && claim_time(claims, early)? > now.saturating_add(LEEWAY) {
            return None;
        }
    }
    Some(now <= exp.saturating_add(LEEWAY))
}

/// A text with `{claim}` places.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Claim(String),
}

fn valid_claim_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn parse_template(text: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        match rest.find(['{', '}']) {
            None => {
                parts.push(Part::Text(rest.to_string()));
                break;
            }
            Some(at) if rest.as_bytes()[at] == b'}' => {
                return Err("a `}` without its `{`".into());
            }
            Some(at) => {
                if at > 0 {
                    parts.push(Part::Text(rest[..at].to_string()));
                }
                let close = rest[at..].find('}').ok_or("a `{` without its `}`")?;
                let name = &rest[at + 1..at + close];
                if !valid_claim_name(name) {
                    return Err("a `{claim}` names a claim of 1-64 characters A-Z a-z 0-9 _".into());
                }
                parts.push(Part::Claim(name.to_string()));
                rest = &rest[at + close + 1..];
            }
        }
    }
    Ok(parts)
}

/// `{claim}` in a workspace pattern: only a value that is itself a workspace name
/// (no `*`, no leading dot) and holds no `..`.
fn interpolable(value: &str) -> bool {
    crate::names::validate_workspace(value).is_ok() && !value.contains("..")
}

fn render_pattern(template: &[Part], claims: &Map<String, Value>) -> Option<Pattern> {
    let mut out = String::new();
    for part in template {
        match part {
            Part::Text(text) => out.push_str(text),
            Part::Claim(name) => {
                let value = claim_text(claims, name)?;
                if !interpolable(&value) {
                    return None;
                }
                out.push_str(&value);
            }
        }
    }
    Pattern::parse(&out).ok()
}

/// The identity a token is recorded under, from the issuer's template: printable
/// ASCII, at most [`MAX_IDENTITY_LEN`] bytes, or none (the token is refused).
fn render_identity(template: &[Part], claims: &Map<String, Value>) -> Option<String> {
    let mut out = String::new();
    for part in template {
        match part {
            Part::Text(text) => out.push_str(text),
            Part::Claim(name) => out.push_str(&claim_text(claims, name)?),
        }
    }
    let printable = out.bytes().all(|b| (0x20..0x7f).contains(&b));
    (printable && !out.is_empty() && out.len() <= MAX_IDENTITY_LEN).then_some(out)
}

/// One rule: every condition holds → `scope` on the workspaces one pattern matches.
#[derive(Debug, Clone)]
struct Rule {
    conditions: Vec<(String, String)>,
    workspaces: Vec<Vec<Part>>,
    scope: Scope,
}

impl Rule {
    fn parse(rule: &CiRuleConfig) -> Result<Rule, (String, String)> {
        let bad = |key: &str, rule: &str| (key.to_string(), rule.to_string());
        if rule.claims.is_empty() || rule.claims.len() > MAX_CONDITIONS {
            return Err(bad(
                "claims",
                "give 1-16 claim conditions (a rule without one would grant every token the issuer signs, for any repository)",
            ));
        }
        for (name, want) in &rule.claims {
            if !valid_claim_name(name) {
                return Err(bad(
                    "claims",
                    "claim names are 1-64 characters A-Z a-z 0-9 _",
                ));
            }
            if want.is_empty() || want.len() > MAX_CLAIM_LEN || want.chars().any(char::is_control) {
                return Err(bad(
                    "claims",
                    "a condition is 1-256 characters without control characters",
                ));
            }
        }
        let scope =
            Scope::parse(&rule.scope).map_err(|_| bad("scope", "use outputs, read or write"))?;
        let pattern_rule = "comma-separated patterns of A-Z a-z 0-9 . _ - * and {claim}";
        let mut workspaces = Vec::new();
        for text in rule.workspaces.split(',') {
            let parts = parse_template(text.trim()).map_err(|why| bad("workspaces", &why))?;
            // A pattern holds with any claim value a workspace name may have.
            let sample: String = parts
                .iter()
                .map(|p| match p {
                    Part::Text(t) => t.as_str(),
                    Part::Claim(_) => "x",
                })
                .collect();
            if Pattern::parse(&sample).is_err() {
                return Err(bad("workspaces", pattern_rule));
            }
            workspaces.push(parts);
        }
        if workspaces.is_empty() || workspaces.len() > 32 {
            return Err(bad("workspaces", pattern_rule));
        }
        Ok(Rule {
            conditions: rule.claims.clone().into_iter().collect(),
            workspaces,
            scope,
        })
    }

    /// The scope this rule gives `claims` on `workspace`, if it gives any.
    fn grant(&self, claims: &Map<String, Value>, workspace: &str) -> Option<Scope> {
        let holds = self.conditions.iter().all(|(name, want)| {
            claim_text(claims, name).is_some_and(|v| glob_match(want.as_bytes(), v.as_bytes()))
        });
        let covers = holds
            && self
                .workspaces
                .iter()
                .any(|t| render_pattern(t, claims).is_some_and(|p| p.matches(workspace)));
        covers.then_some(self.scope)
    }
}

/// The union of `rules`: the highest scope any of them gives.
fn grant(rules: &[Rule], claims: &Map<String, Value>, workspace: &str) -> Option<Scope> {
    rules
        .iter()
        .filter_map(|r| r.grant(claims, workspace))
        .max()
}

/// The keys held for an issuer.
#[derive(Default)]
struct Keys {
    keys: Vec<CoreJsonWebKey>,
    /// One more at every successful JWKS read: a signature checked under an older
    /// generation is checked again.
    generation: u64,
    fetched: Option<Instant>,
    attempted: Option<Instant>,
}

/// One trusted issuer: its settings, rules and keys.
struct Issuer {
    name: String,
    issuer: String,
    audiences: Vec<String>,
    identity: Vec<Part>,
    max_run: i64,
    rules: Vec<Rule>,
    http: reqwest::Client,
    keys: Mutex<Keys>,
    /// One JWKS read at a time.
    refresh: tokio::sync::Mutex<()>,
}

#[derive(serde::Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
}

impl Issuer {
    fn parse(index: usize, config: &CiIdentityConfig) -> Result<Issuer, InvalidCiIdentity> {
        let bad = |key: &str, rule: &str| InvalidCiIdentity {
            index,
            key: key.into(),
            rule: rule.into(),
        };
        let name_ok = !config.name.is_empty()
            && config.name.len() <= 32
            && config
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !name_ok {
            return Err(bad("name", "1-32 characters A-Z a-z 0-9 . _ -"));
        }
        let issuer_ok = config.issuer.starts_with("https://")
            && config.issuer.len() <= 512
            && reqwest::Url::parse(&config.issuer).is_ok_and(|u| u.host().is_some());
        if !issuer_ok {
            return Err(bad("issuer", "an https:// URL, exactly the tokens' `iss`"));
        }
        let audiences = config.audience.to_vec();
        if audiences.is_empty()
            || audiences.len() > 16
            || audiences.iter().any(|a| a.is_empty() || a.len() > 512)
        {
            return Err(bad("audience", "1-16 non-empty audiences"));
        }
        let identity = parse_template(&config.identity).map_err(|why| bad("identity", &why))?;
        let printable = identity.iter().all(|p| match p {
            Part::Text(t) => t.bytes().all(|b| (0x20..0x7f).contains(&b)),
            Part::Claim(_) => true,
        });
        if identity.is_empty() || !printable || config.identity.len() > 200 {
            return Err(bad(
                "identity",
                "a template of printable ASCII and {claim}, at most 200 characters",
            ));
        }
        if config.max_run_seconds == 0 || config.max_run_seconds > MAX_RUN_LIMIT {
            return Err(bad("max_run_seconds", "1-86400 seconds"));
        }
        if config.rules.is_empty() || config.rules.len() > MAX_RULES {
            return Err(bad("rules", "give 1-64 rules"));
        }
        let rules = config
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                Rule::parse(rule)
                    .map_err(|(key, rule)| bad(&format!("rules[{}].{key}", i + 1), &rule))
            })
            .collect::<Result<_, _>>()?;
        let mut http = reqwest::Client::builder()
            // Following redirects would let an answer point us anywhere.
            .redirect(reqwest::redirect::Policy::none())
            .https_only(true)
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT);
        match &config.ca_file {
            Some(path) => {
                let pem = std::fs::read(path)
                    .map_err(|e| bad("ca_file", &format!("cannot read {}: {e}", path.display())))?;
                let certs = reqwest::Certificate::from_pem_bundle(&pem)
                    .ok()
                    .filter(|c| !c.is_empty())
                    .ok_or_else(|| bad("ca_file", "not a PEM file of CA certificates"))?;
                http = http.tls_built_in_root_certs(false);
                for cert in certs {
                    http = http.add_root_certificate(cert);
                }
            }
            None => {
                // The built-in roots, and the system's (a private issuer's CA installed there).
                for der in rustls_native_certs::load_native_certs().certs {
                    if let Ok(cert) = reqwest::Certificate::from_der(&der) {
                        http = http.add_root_certificate(cert);
                    }
                }
            }
        }
        let http = http
            .build()
            .map_err(|e| bad("issuer", &format!("cannot build the HTTP client: {e}")))?;
        Ok(Issuer {
            name: config.name.clone(),
            issuer: config.issuer.clone(),
            audiences,
            identity,
            max_run: config.max_run_seconds as i64,
            rules,
            http,
            keys: Mutex::new(Keys::default()),
            refresh: tokio::sync::Mutex::new(()),
        })
    }

    /// The key `kid` if held, with the generation of the keys it is one of.
    fn held(&self, kid: &str) -> Option<(CoreJsonWebKey, u64)> {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.keys
            .iter()
            .find(|k| k.key_id().is_some_and(|id| id.as_str() == kid))
            .map(|key| (key.clone(), keys.generation))
    }

    fn generation(&self) -> u64 {
        self.keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .generation
    }

    /// Reads the keys again, in the background, when those held are an hour old.
    fn refresh_if_stale(self: &Arc<Self>) {
        let stale = {
            let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            keys.fetched.is_some_and(|at| at.elapsed() > KEYS_MAX_AGE)
                && keys.attempted.is_none_or(|at| at.elapsed() > MIN_REFRESH)
        };
        if stale {
            let issuer = Arc::clone(self);
            tokio::spawn(async move {
                if let Ok(_turn) = issuer.refresh.try_lock() {
                    issuer.refresh_keys().await;
                }
            });
        }
    }

    /// The key `kid` and its generation: held, or after one JWKS read (at most one per
    /// [`MIN_REFRESH`]).
    async fn key(self: &Arc<Self>, kid: &str) -> Option<(CoreJsonWebKey, u64)> {
        if let Some(key) = self.held(kid) {
            self.refresh_if_stale();
            return Some(key);
        }
        let _turn = self.refresh.lock().await;
        if let Some(key) = self.held(kid) {
            return Some(key);
        }
        let recent = {
            let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            keys.attempted.is_some_and(|at| at.elapsed() < MIN_REFRESH)
        };
        if recent {
            return None;
        }
        self.refresh_keys().await;
        self.held(kid)
    }

    /// Reads the JWKS again; on failure the keys held stay (an outage of the issuer
    /// does not end runs whose keys are known).
    async fn refresh_keys(&self) {
        self.keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .attempted = Some(Instant::now());
        match self.fetch_keys().await {
            Ok(fetched) => self.hold_keys(fetched),
            Err(why) => tracing::warn!(
                issuer = %self.name,
                "ci_identity: cannot read the issuer's keys ({why}); its tokens are refused until they can be read"
            ),
        }
    }

    /// Holds `fetched` as the issuer's keys, a new generation.
    fn hold_keys(&self, fetched: Vec<CoreJsonWebKey>) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.keys = fetched;
        keys.generation = keys.generation.wrapping_add(1);
        keys.fetched = Some(Instant::now());
    }

    async fn fetch_keys(&self) -> Result<Vec<CoreJsonWebKey>, String> {
        let discovery_url = format!(
            "{}/.well-known/openid-configuration",
            self.issuer.trim_end_matches('/')
        );
        let discovery: Discovery = self.get_json(&discovery_url).await?;
        if discovery.issuer != self.issuer {
            return Err("the discovery document names another issuer".into());
        }
        if !discovery.jwks_uri.starts_with("https://") {
            return Err("the discovery document's jwks_uri is not https".into());
        }
        let set: CoreJsonWebKeySet = self.get_json(&discovery.jwks_uri).await?;
        Ok(set
            .keys()
            .iter()
            .filter(|k| k.key_id().is_some() && *k.key_type() != CoreJsonWebKeyType::Symmetric)
            .take(MAX_KEYS)
            .cloned()
            .collect())
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, String> {
        let mut answer = self
            .http
            .get(url)
            .header(http::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if !answer.status().is_success() {
            return Err(format!("GET {url}: {}", answer.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = answer
            .chunk()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?
        {
            if body.len() + chunk.len() > MAX_DOCUMENT {
                return Err(format!("GET {url}: larger than {MAX_DOCUMENT} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|e| format!("GET {url}: {e}"))
    }

    fn audience_accepted(&self, claims: &Map<String, Value>) -> bool {
        let ours = |a: &Value| {
            a.as_str()
                .is_some_and(|a| self.audiences.iter().any(|o| o == a))
        };
        match claims.get("aud") {
            Some(Value::Array(list)) => list.iter().take(16).any(ours),
            Some(one) => ours(one),
            None => false,
        }
    }
}

/// A token whose signature, issuer, audience and times held at `now`.
pub struct Verified {
    issuer: Arc<Issuer>,
    claims: Arc<Map<String, Value>>,
    /// `ci:<name>:<identity>` without the `ci:`.
    identity: String,
    /// Hex SHA-256 of the token.
    hash: String,
    /// Within its own validity (else only its recorded window admits it).
    fresh: bool,
    /// The generation of the issuer's keys its signature was checked under.
    generation: u64,
}

/// What the signature check of an accepted token established (see "What it costs").
#[derive(Clone)]
struct Checked {
    issuer: Arc<Issuer>,
    claims: Arc<Map<String, Value>>,
    identity: String,
    generation: u64,
}

impl Verified {
    /// The credential the issuer's rules give this token on `workspace`, if any.
    pub fn credential(&self, workspace: &str) -> Option<Credential> {
        grant(&self.issuer.rules, &self.claims, workspace).map(|scope| Credential::Ci {
            identity: self.identity.clone(),
            scope,
        })
    }
}

/// The trusted issuers and what this node remembers of first-seen records.
#[derive(Default)]
pub struct CiIdentities {
    issuers: Vec<Arc<Issuer>>,
    /// Token hash → end of its window: rows that never change once written.
    remembered: Mutex<HashMap<String, i64>>,
    /// Token hash → its signature check, for tokens accepted (at most [`MAX_CHECKED`]).
    checked: Mutex<HashMap<String, Checked>>,
}

impl CiIdentities {
    /// Reads `[[ci_identity]]` (the CA files too), refusing the first entry that cannot
    /// be meant. Fetches nothing: keys are read on first use.
    pub fn from_config(configs: &[CiIdentityConfig]) -> Result<CiIdentities, InvalidCiIdentity> {
        if configs.len() > MAX_ISSUERS {
            return Err(InvalidCiIdentity {
                index: MAX_ISSUERS + 1,
                key: "issuer".into(),
                rule: format!("at most {MAX_ISSUERS} issuers"),
            });
        }
        let mut issuers: Vec<Arc<Issuer>> = Vec::new();
        for (i, config) in configs.iter().enumerate() {
            let issuer = Issuer::parse(i + 1, config)?;
            for other in &issuers {
                let (key, same) = if other.issuer == issuer.issuer {
                    ("issuer", true)
                } else {
                    ("name", other.name == issuer.name)
                };
                if same {
                    return Err(InvalidCiIdentity {
                        index: i + 1,
                        key: key.into(),
                        rule: "each issuer and each name once (put all of an issuer's rules in one entry)".into(),
                    });
                }
            }
            issuers.push(Arc::new(issuer));
        }
        Ok(CiIdentities {
            issuers,
            remembered: Mutex::default(),
            checked: Mutex::default(),
        })
    }

    pub fn len(&self) -> usize {
        self.issuers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.issuers.is_empty()
    }

    /// The token, if a configured issuer signed it for one of its audiences and it is
    /// valid at `now` or expired (its window is judged by [`Self::admit`]).
    pub async fn verify(&self, token: &[u8], now: i64) -> Option<Verified> {
        if !is_token_shaped(token) {
            return None;
        }
        let hash = crate::tokens::hash(token);
        if let Some(verified) = self.checked_before(&hash, now) {
            return Some(verified);
        }
        let parsed = parse(token)?;
        let iss = parsed.claims.get("iss")?.as_str()?;
        let issuer = self.issuers.iter().find(|i| i.issuer == iss)?;
        if !issuer.audience_accepted(&parsed.claims) {
            return None;
        }
        let fresh = validity(&parsed.claims, now)?;
        let identity = render_identity(&issuer.identity, &parsed.claims)?;
        let (key, generation) = issuer.key(&parsed.kid).await?;
        // Checks the key's type and `use`/`alg` against the token's algorithm first.
        key.verify_signature(&parsed.alg, parsed.signed, &parsed.signature)
            .ok()?;
        Some(Verified {
            issuer: Arc::clone(issuer),
            identity: format!("{}:{identity}", issuer.name),
            hash,
            claims: Arc::new(parsed.claims),
            fresh,
            generation,
        })
    }

    /// A token accepted before, whose signature was checked under the issuer's keys
    /// still held: verified without its signature, its times judged at `now` again.
    fn checked_before(&self, hash: &str, now: i64) -> Option<Verified> {
        let checked = self
            .checked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(hash)
            .cloned()?;
        if checked.generation != checked.issuer.generation() {
            return None;
        }
        checked.issuer.refresh_if_stale();
        let fresh = validity(&checked.claims, now)?;
        Some(Verified {
            issuer: checked.issuer,
            claims: checked.claims,
            identity: checked.identity,
            hash: hash.to_string(),
            fresh,
            generation: checked.generation,
        })
    }

    /// Keeps an accepted token's signature check (see "What it costs").
    fn keep(&self, token: &Verified) {
        let mut checked = self.checked.lock().unwrap_or_else(|p| p.into_inner());
        if checked
            .get(&token.hash)
            .is_some_and(|c| c.generation == token.generation)
        {
            return;
        }
        if checked.len() >= MAX_CHECKED {
            checked.clear();
        }
        checked.insert(
            token.hash.clone(),
            Checked {
                issuer: Arc::clone(&token.issuer),
                claims: Arc::clone(&token.claims),
                identity: token.identity.clone(),
                generation: token.generation,
            },
        );
    }

    /// Is `token` inside its window at `now`? A fresh token is (and its first-seen
    /// record is written now if this is its first accepted request); an expired one
    /// only when its record says so. Call it only for a request about to be let
    /// through: it may write.
    pub async fn admit(&self, db: &Db, token: &Verified, now: i64) -> Result<bool, DbError> {
        let until = match self.recall(&token.hash) {
            Some(until) => until,
            None => match self.first_admit(db, token, now).await? {
                Some(until) => until,
                None => return Ok(false),
            },
        };
        let admitted = token.fresh || now < until;
        if admitted {
            self.keep(token);
        }
        Ok(admitted)
    }

    /// The end of `token`'s window, recorded now if it is fresh and has none (its
    /// first accepted request); none for an expired token never recorded.
    async fn first_admit(
        &self,
        db: &Db,
        token: &Verified,
        now: i64,
    ) -> Result<Option<i64>, DbError> {
        let hash = token.hash.clone();
        let until = if token.fresh {
            let identity = token.identity.clone();
            // Never before the token's own expiry: a fresh token is accepted whatever
            // its record says, so the record's end is when it is accepted no more.
            let expires =
                claim_time(&token.claims, "exp").map_or(now, |exp| exp.saturating_add(LEEWAY));
            let until = now.saturating_add(token.issuer.max_run).max(expires);
            db.write(move |c| record(c, &hash, &identity, now, until))
                .await?
        } else {
            match db.read_quick(move |c| recorded_until(c, &hash)).await? {
                Some(until) => until,
                None => return Ok(None),
            }
        };
        self.remember(&token.hash, until);
        Ok(Some(until))
    }

    fn recall(&self, hash: &str) -> Option<i64> {
        let remembered = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
        remembered.get(hash).copied()
    }

    fn remember(&self, hash: &str, until: i64) {
        let mut remembered = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
        if remembered.len() >= MAX_REMEMBERED {
            remembered.clear();
        }
        remembered.insert(hash.to_string(), until);
    }
}

/// Writes the first-seen record of a token (kept when one is there: the first one
/// counts) and returns the end of its window.
pub fn record(
    conn: &Connection,
    hash: &str,
    identity: &str,
    now: i64,
    until: i64,
) -> Result<i64, DbError> {
    if let Some(until) = recorded_until(conn, hash)? {
        return Ok(until);
    }
    crate::store::sql::make_room(
        conn,
        "tf_ci_tokens",
        "token_sha256",
        "until_unix",
        now,
        MAX_RECORDS,
    )?;
    conn.prepare_cached(
        "INSERT INTO tf_ci_tokens (token_sha256, identity, first_seen_unix, until_unix)
         VALUES (?1, ?2, ?3, ?4) ON CONFLICT (token_sha256) DO NOTHING",
    )?
    .execute(params![hash, identity, now, until])?;
    Ok(recorded_until(conn, hash)?.unwrap_or(until))
}

/// The latest end of the windows of `identity`'s recorded tokens (`<issuer>:<identity>`,
/// as `ci:` credentials name it), if any is recorded: after it, no token of the
/// identity is accepted. Records are swept once their window is over, so none left
/// means none is accepted either.
pub fn identity_accepted_until(
    conn: &Connection,
    identity: &str,
) -> Result<Option<i64>, crate::store::sql::Error> {
    conn.prepare_cached("SELECT max(until_unix) FROM tf_ci_tokens WHERE identity = ?1")?
        .query_row([identity], |r| r.get(0))
}

/// The end of a recorded token's window.
pub fn recorded_until(
    conn: &Connection,
    hash: &str,
) -> Result<Option<i64>, crate::store::sql::Error> {
    conn.prepare_cached("SELECT until_unix FROM tf_ci_tokens WHERE token_sha256 = ?1")?
        .query_row([hash], |r| r.get(0))
        .optional()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claims(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    fn rule(conditions: &[(&str, &str)], workspaces: &str, scope: &str) -> CiRuleConfig {
        CiRuleConfig {
            claims: conditions
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            workspaces: workspaces.into(),
            scope: scope.into(),
        }
    }

    fn rules(list: &[CiRuleConfig]) -> Vec<Rule> {
        list.iter().map(|r| Rule::parse(r).unwrap()).collect()
    }

    #[test]
    fn rules_are_a_union_of_claim_conditions() {
        let rules = rules(&[
            rule(&[("repository", "acme/infra")], "*", "read"),
            rule(
                &[("repository", "acme/infra"), ("ref", "refs/heads/main")],
                "prod-*",
                "write",
            ),
            rule(&[("ref_protected", "true")], "staging-*", "write"),
            rule(
                &[("repository", "acme/*"), ("environment", "*")],
                "ci-{environment}",
                "write",
            ),
        ]);
        let main = claims(json!({"repository": "acme/infra", "ref": "refs/heads/main"}));
        let branch = claims(json!({"repository": "acme/infra", "ref": "refs/heads/feature"}));
        let other = claims(json!({"repository": "evil/infra", "ref": "refs/heads/main"}));
        let protected = claims(json!({"project_path": "g/p", "ref_protected": true}));
        let env = |e: &str| claims(json!({"repository": "acme/app", "environment": e}));
        // (claims, workspace, scope)
        let table: Vec<(&Map<String, Value>, &str, Option<Scope>)> = vec![
            (&main, "prod-web", Some(Scope::Write)),
            (&main, "dev", Some(Scope::Read)),
            (&branch, "prod-web", Some(Scope::Read)),
            (&other, "prod-web", None),
            (&protected, "staging-a", Some(Scope::Write)),
            (&protected, "prod-a", None),
        ];
        for (c, ws, want) in table {
            assert_eq!(grant(&rules, c, ws), want, "{c:?} {ws}");
        }
        // A claim put into a pattern: only a workspace name's characters, no wildcard.
        let e = |v: &str, ws: &str| grant(&rules, &env(v), ws);
        assert_eq!(e("prod", "ci-prod"), Some(Scope::Write));
        assert_eq!(e("prod", "ci-staging"), None);
        for hostile in ["*", "p*", "..", "a..b", ".x", "a/b", "a b", "a\nb", "", "ü"] {
            for ws in ["ci-p", "ci-prod", "ci-a..b", "ci-x", "ci-", "ci-ab"] {
                assert_eq!(e(hostile, ws), None, "{hostile:?} {ws}");
            }
        }
        // A literal `*` in a claim matches a condition only as itself.
        let star = claims(json!({"repository": "*", "ref": "*"}));
        assert_eq!(grant(&rules, &star, "prod-web"), None);
        // Control characters: never a value.
        let ctl = claims(json!({"repository": "acme/infra", "ref": "refs/heads/main\u{7}"}));
        assert_eq!(grant(&rules, &ctl, "prod-web"), Some(Scope::Read));
    }

    #[test]
    fn bad_rules_are_refused() {
        for (r, key) in [
            (rule(&[], "*", "read"), "claims"),
            (rule(&[("a-b", "x")], "*", "read"), "claims"),
            (rule(&[("a", "")], "*", "read"), "claims"),
            (rule(&[("a", "x\ny")], "*", "read"), "claims"),
            (rule(&[("a", "x")], "*", "admin"), "scope"),
            (rule(&[("a", "x")], "", "read"), "workspaces"),
            (rule(&[("a", "x")], "ci-{env", "read"), "workspaces"),
            (rule(&[("a", "x")], "ci-}", "read"), "workspaces"),
            (rule(&[("a", "x")], "ci/{env}", "read"), "workspaces"),
            (rule(&[("a", "x")], "{e-x}", "read"), "workspaces"),
        ] {
            assert_eq!(Rule::parse(&r).unwrap_err().0, key, "{r:?}");
        }
    }

    #[test]
    fn identities_are_printable_and_bounded() {
        let t = parse_template("{repository}@{ref}#run {run_id}").unwrap();
        let c =
            claims(json!({"repository": "acme/infra", "ref": "refs/heads/main", "run_id": 812}));
        assert_eq!(
            render_identity(&t, &c).as_deref(),
            Some("acme/infra@refs/heads/main#run 812")
        );
        let missing = claims(json!({"repository": "acme/infra"}));
        assert_eq!(render_identity(&t, &missing), None);
        for hostile in ["a\u{1b}[31m", "é", "a\u{202e}b", &"x".repeat(400)] {
            let c = claims(json!({"repository": hostile, "ref": "r", "run_id": 1}));
            assert_eq!(render_identity(&t, &c), None, "{hostile:?}");
        }
    }

    #[test]
    fn validity_by_the_clock() {
        let now = 1_000_000;
        // (claims, validity)
        let table = [
            (json!({"exp": now + 60}), Some(true)),
            (json!({"exp": now - LEEWAY}), Some(true)),
            (json!({"exp": now - LEEWAY - 1}), Some(false)),
            (json!({}), None),
            (json!({"exp": "soon"}), None),
            (json!({"exp": now + 60, "nbf": now + LEEWAY + 1}), None),
            (json!({"exp": now + 60, "nbf": now + LEEWAY}), Some(true)),
            (json!({"exp": now + 60, "iat": now + 600}), None),
            (json!({"exp": now + 60, "iat": "x"}), None),
            (json!({"exp": (now + 60) as f64 + 0.5}), Some(true)),
        ];
        for (c, want) in table {
            assert_eq!(validity(&claims(c.clone()), now), want, "{c}");
        }
    }

    #[test]
    fn only_asymmetric_algorithms_and_well_formed_tokens() {
        let enc = |v: Value| URL_SAFE_NO_PAD.encode(v.to_string());
        let body = enc(json!({"iss": "https://i", "exp": 1}));
        let token = |header: Value, sig: &str| format!("{}.{body}.{sig}", enc(header));
        for alg in [
            "none", "HS256", "HS384", "HS512", "EdDSA", "ES512", "rs256", "",
        ] {
            let t = token(json!({"alg": alg, "kid": "k"}), "c2ln");
            assert!(parse(t.as_bytes()).is_none(), "{alg}");
        }
        assert!(parse(token(json!({"alg": "RS256", "kid": "k"}), "c2ln").as_bytes()).is_some());
        for bad in [
            token(json!({"alg": "RS256"}), "c2ln"),
            token(json!({"alg": "RS256", "kid": ""}), "c2ln"),
            token(json!({"alg": "RS256", "kid": "k", "crit": ["b64"]}), "c2ln"),
            token(json!({"alg": "RS256", "kid": "k"}), ""),
            format!(
                "{}.{}.c2ln",
                enc(json!({"alg": "RS256", "kid": "k"})),
                enc(json!([1]))
            ),
            format!(
                "{}.{}.c2ln.x",
                enc(json!({"alg": "RS256", "kid": "k"})),
                body
            ),
        ] {
            assert!(parse(bad.as_bytes()).is_none(), "{bad}");
        }
        let long = format!("eyJ{}.a.b", "A".repeat(MAX_TOKEN_LEN));
        assert!(!is_token_shaped(long.as_bytes()));
        assert!(!is_token_shaped(b"sgw_abc"));
        assert!(!is_token_shaped(b"eyJ.a.b c"));
    }

    #[test]
    fn first_seen_records_keep_the_first_window() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        assert_eq!(recorded_until(&conn, "h").unwrap(), None);
        assert_eq!(record(&conn, "h", "gh:a", 100, 200).unwrap(), 200);
        // Presented again later (another node, a retry): the first window stands.
        assert_eq!(record(&conn, "h", "gh:a", 150, 250).unwrap(), 200);
        assert_eq!(recorded_until(&conn, "h").unwrap(), Some(200));
        assert_eq!(identity_accepted_until(&conn, "gh:a").unwrap(), Some(200));
        assert_eq!(record(&conn, "h2", "gh:a", 160, 180).unwrap(), 180);
        assert_eq!(
            identity_accepted_until(&conn, "gh:a").unwrap(),
            Some(200),
            "the latest window of the identity's tokens"
        );
        assert_eq!(identity_accepted_until(&conn, "gh:other").unwrap(), None);
        // Swept once its window is over.
        assert_eq!(record(&conn, "g", "gh:b", 201, 300).unwrap(), 300);
        assert_eq!(recorded_until(&conn, "h").unwrap(), None);
        assert_eq!(identity_accepted_until(&conn, "gh:a").unwrap(), None);
    }

    /// An issuer whose ES256 key (made here with ring) is held as after a JWKS read,
    /// and a signer of its tokens.
    fn held_issuer() -> (CiIdentities, impl Fn(&Value) -> String) {
        use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
        let config: CiIdentityConfig = toml::from_str(
            r#"
name = "gh"
issuer = "https://issuer.test"
audience = "https://stategate.test"
identity = "{repository}#run {run_id}"
max_run_seconds = 600
[[rules]]
claims = { repository = "acme/infra" }
workspaces = "prod-*"
scope = "write"
"#,
        )
        .unwrap();
        let ci = CiIdentities::from_config(&[config]).unwrap();
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        // The public point: 0x04 ‖ x ‖ y.
        let point = pair.public_key().as_ref().to_vec();
        let jwk: CoreJsonWebKey = serde_json::from_value(json!({
            "kty": "EC", "crv": "P-256", "kid": "k1", "use": "sig", "alg": "ES256",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        }))
        .unwrap();
        ci.issuers[0].hold_keys(vec![jwk]);
        let sign = move |claims: &Value| {
            let head = URL_SAFE_NO_PAD.encode(json!({"alg": "ES256", "kid": "k1"}).to_string());
            let body = URL_SAFE_NO_PAD.encode(claims.to_string());
            let signed = format!("{head}.{body}");
            let sig = pair.sign(&rng, signed.as_bytes()).unwrap();
            format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
        };
        (ci, sign)
    }

    #[tokio::test]
    async fn an_accepted_tokens_signature_is_checked_once_per_key_generation() {
        let (ci, sign) = held_issuer();
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db"), &[SCHEMA]).unwrap();
        let now = 1_000_000;
        let claims = |run: u32, exp: i64| {
            json!({"iss": "https://issuer.test", "aud": "https://stategate.test",
                   "repository": "acme/infra", "run_id": run, "iat": now, "exp": exp})
        };
        let token = sign(&claims(1, now + 300));
        let hash = crate::tokens::hash(token.as_bytes());

        // Verified but not yet accepted: nothing is kept.
        let first = ci.verify(token.as_bytes(), now).await.unwrap();
        assert!(first.credential("prod-web").is_some());
        assert!(ci.checked_before(&hash, now).is_none());
        assert!(ci.admit(&db, &first, now).await.unwrap());

        // Accepted: the same token is verified without its signature, its times and
        // rules judged again at each request.
        let again = ci.checked_before(&hash, now + 10).expect("kept");
        assert!(again.fresh);
        assert_eq!(again.identity, "gh:acme/infra#run 1");
        assert!(again.credential("prod-web").is_some());
        assert!(again.credential("dev").is_none(), "the rules still decide");
        let later = now + 300 + LEEWAY + 1;
        let expired = ci.verify(token.as_bytes(), later).await.unwrap();
        assert!(!expired.fresh, "past its exp: only its window admits it");
        assert!(
            ci.admit(&db, &expired, later).await.unwrap(),
            "inside its window"
        );
        let after = now + 600 + 1;
        let gone = ci.verify(token.as_bytes(), after).await.unwrap();
        assert!(
            !ci.admit(&db, &gone, after).await.unwrap(),
            "past its window"
        );

        // Another token, even with the same claims and a bad signature, is checked in full.
        let forged = format!("{}.{}", token.rsplit_once('.').unwrap().0, "AAAA");
        assert!(ci.verify(forged.as_bytes(), now).await.is_none());

        // The keys read again (a new generation): every kept token is checked again,
        // under the keys then held — here without the key it was signed with.
        ci.issuers[0].hold_keys(Vec::new());
        assert!(ci.checked_before(&hash, now).is_none());
        assert!(ci.verify(token.as_bytes(), now).await.is_none());

        // A token refused is never kept: expired and never recorded.
        let (ci, sign) = held_issuer();
        let stale = sign(&claims(2, now - 60));
        let verified = ci.verify(stale.as_bytes(), now).await.unwrap();
        assert!(!ci.admit(&db, &verified, now).await.unwrap());
        assert!(ci
            .checked_before(&crate::tokens::hash(stale.as_bytes()), now)
            .is_none());
    }
}
