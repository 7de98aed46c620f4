//! Startup and background services: turn a [`Config`] into a running gateway. The
//! installation (data dir, root key, index, blob store) and its services are opened by
//! `crate::installation::Installation::open`, the one way the operator commands open
//! it too; this module
//! wires the application, the pass-through and the pingora services around it.

use std::sync::Arc;

use anyhow::Context;
use pingora::server::configuration::ServerConf;
use pingora::server::{Server, ShutdownWatch};

use crate::config::{Config, StoreKind};
use crate::crypto::RootKey;
use crate::http::conditional::ConditionalGuard;
use crate::http::s3_target::{host_of_url, Addressing};
use crate::http::upstream::{same_server, Endpoint, Protection, Upstream};
use crate::http::{App, Gateway};
use crate::installation::{Installation, Purpose, Services, Serving};
use crate::metrics::Metrics;
use crate::store::retention::Retention;
use crate::store::StateStore;
use crate::tofu::TofuBackend;

/// Builds the application state. Must be called inside a tokio runtime (store checks).
pub async fn build_app(config: &Config) -> anyhow::Result<Arc<App>> {
    build_app_with_clock(config, Arc::new(crate::cluster::SystemClock)).await
}

/// [`build_app`] with the clock cluster leases are timed by (tests pass a `TestClock`).
pub async fn build_app_with_clock(
    config: &Config,
    clock: Arc<dyn crate::cluster::Clock>,
) -> anyhow::Result<Arc<App>> {
    Ok(build(config, clock, None).await?.0)
}

/// The app, and the root key it was built with: `root` when the caller already has it
/// (`serve` unwrapped it once, checking the key service), else loaded (made on first start).
async fn build(
    config: &Config,
    clock: Arc<dyn crate::cluster::Clock>,
    root: Option<crate::crypto::RootKey>,
) -> anyhow::Result<(Arc<App>, crate::crypto::RootKey)> {
    // Read before anything is opened: a grant that cannot be meant refuses startup.
    let client_grants = crate::tofu::certificate::Grants::from_config(&config.tls)?;
    let ci_identities = crate::tofu::ci_identity::CiIdentities::from_config(&config.ci_identity)?;
    // `[oidc]` is checked whole before anything is opened.
    let sso_settings = match &config.oidc {
        None => None,
        Some(oidc) => Some(crate::ui::oidc::Settings::from_config(
            oidc,
            config.public_url.as_deref(),
            |path| std::fs::read_to_string(path),
        )?),
    };
    // The installation: the key read (made only for a new one), the keyring, the
    // index and the store, the key proven; the store's traffic counted.
    let metrics = Metrics::new();
    let installation = Installation::open(
        config,
        Purpose::Serve(Box::new(Serving {
            unwrapped: root,
            clock,
            metrics: metrics.clone(),
            ci_identities,
        })),
    )
    .await?;
    let root = installation.root().clone();
    let Services {
        tofu,
        cluster,
        operator,
        drift,
        keys,
    } = installation.services()?;
    let store_buffer = tofu.store().blobs().write_buffer_bytes();
    let sso = match sso_settings {
        None => None,
        Some(settings) => Some(crate::ui::oidc::Sso::new(
            settings,
            tofu.store().index_handle(),
            root.sso_key(),
        )?),
    };
    let sessions = crate::ui::session::Sessions::new(tofu.store().index_handle());
    let app = Arc::new(App {
        sessions,
        operator,
        drift,
        keys,
        cluster,
        tofu,
        max_state_bytes: config.max_state_bytes,
        body_budget: crate::http::BodyBudget::new(config.max_inflight_body_bytes, store_buffer),
        body_limits: crate::http::BodyLimits {
            timeout: std::time::Duration::from_secs(config.body_read_timeout_seconds),
            min_bytes_per_second: config.body_min_bytes_per_second,
        },
        metrics,
        upstream: upstream_for(config)?,
        conditional: conditional_guard_for(config).await?,
        inflight: crate::drain::Inflight::default(),
        tls: config.tls.cert_file.is_some(),
        metrics_token: config.metrics_token.clone(),
        login_guard: crate::http::login_guard::LoginGuard::new(
            crate::http::login_guard::Limits::default(),
            config.public_url.as_deref(),
        ),
        client_grants,
        sso,
        client_url: crate::address::for_clients(config),
    });
    Ok((app, root))
}

/// Is the pass-through upstream provably the S3 store stategate writes to, so the
/// store's credentials see what the upstream holds? Same scheme and port, and host
/// names that resolve to a common address now. `Err` says why not.
async fn upstream_is_state_store(config: &Config) -> Result<(), String> {
    if config.store.kind != StoreKind::S3 {
        return Err("the store is not S3, so stategate has no credentials for the upstream".into());
    }
    let upstream = config
        .upstream_endpoint()
        .ok_or("no upstream is configured")?;
    let upstream = Endpoint::parse(upstream).map_err(|e| e.to_string())?;
    let store = Endpoint::parse(&config.store.s3.endpoint).map_err(|e| e.to_string())?;
    let resolve = |e: &Endpoint| {
        let target = (e.host.clone(), e.port);
        async move {
            tokio::net::lookup_host(target)
                .await
                .map(|addrs| addrs.map(|a| a.ip()).collect::<Vec<_>>())
                .unwrap_or_default()
        }
    };
    same_server(
        &upstream,
        &resolve(&upstream).await,
        &store,
        &resolve(&store).await,
    )
}

/// Conditional writes can only be checked with credentials for the upstream; when
/// that is not proven, they are forwarded as they are, and the log says so once.
async fn conditional_guard_for(config: &Config) -> anyhow::Result<Option<ConditionalGuard>> {
    if config.upstream_endpoint().is_none() {
        return Ok(None);
    }
    if !config.upstream.guard_conditional_writes {
        tracing::warn!(
            "conditional writes (If-None-Match/If-Match PUTs) through the pass-through are forwarded unguarded: upstream.guard_conditional_writes is false"
        );
        return Ok(None);
    }
    if let Err(why) = upstream_is_state_store(config).await {
        tracing::warn!(
            "conditional writes (If-None-Match/If-Match PUTs) through the pass-through are forwarded unguarded, atomic only if the upstream enforces them: {why}"
        );
        return Ok(None);
    }
    let seconds = std::time::Duration::from_secs;
    let guard = ConditionalGuard::new(
        &config.store.s3,
        garage_admin_for(config)?,
        seconds(config.upstream.conditional_turn_wait_seconds),
        seconds(config.upstream.conditional_turn_hold_seconds),
    );
    // Said at startup, not found at the first racing `terraform apply`. Not fatal: the
    // store may be down now, and only conditional writes with users' own keys need it.
    if let Err(why) = guard.check_key_lookup().await {
        tracing::warn!(
            error = why,
            "upstream.garage_admin_endpoint / upstream.garage_admin_token_file: stategate cannot look up the store's keys (the token needs the GetKeyInfo scope: garage admin-token create --scope GetKeyInfo); until it can, a conditional write signed with a user's own key that fails its precondition gets 403, not 412"
        );
    }
    Ok(Some(guard))
}

/// Garage's admin API and its token, when configured (both or neither: the
/// configuration checked that). An unreadable or empty token file stops the start.
fn garage_admin_for(
    config: &Config,
) -> anyhow::Result<Option<crate::http::store_keys::GarageAdmin>> {
    let (Some(endpoint), Some(file)) = (
        &config.upstream.garage_admin_endpoint,
        &config.upstream.garage_admin_token_file,
    ) else {
        return Ok(None);
    };
    // Garage's admin tokens are ~60 characters; a larger file is not one.
    let token = crate::installation::read_secret_file(file, 4096).map_err(|e| {
        anyhow::anyhow!(
            "upstream.garage_admin_token_file: cannot read {}: {}",
            file.display(),
            e.kind()
        )
    })?;
    let token = token.trim();
    if token.is_empty() {
        anyhow::bail!(
            "upstream.garage_admin_token_file: {} is empty",
            file.display()
        );
    }
    Ok(Some(crate::http::store_keys::GarageAdmin {
        endpoint: endpoint.clone(),
        token: token.into(),
    }))
}

/// Protection follows the state bucket's name whenever the store is S3, whatever
/// the upstream endpoint is called.
fn protection_for(config: &Config) -> Protection {
    if config.store.kind != StoreKind::S3 {
        return Protection::Off;
    }
    let bucket = config.store.s3.bucket.clone();
    if config.upstream.shares_state_bucket() {
        Protection::SharedBucket {
            bucket,
            prefix: config.store.s3.prefix.clone(),
        }
    } else {
        Protection::ReservedBucket { bucket }
    }
}

/// The names clients reach stategate by: its listen address, loopback, the host of
/// `public_url`, and `upstream.hosts`; plus the store's virtual-host root domains.
fn addressing_for(config: &Config) -> Addressing {
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
        config.listen.ip().to_string(),
    ];
    hosts.extend(config.public_url.as_deref().and_then(host_of_url));
    hosts.extend(config.upstream.hosts.iter().cloned());
    Addressing::new(hosts, &config.upstream.root_domains)
}

fn upstream_for(config: &Config) -> anyhow::Result<Option<Upstream>> {
    let Some(endpoint) = config.upstream_endpoint() else {
        return Ok(None);
    };
    if let Some(old) = config.upstream.protect_state_prefix {
        tracing::warn!(
            protect_state_prefix = old,
            "upstream.protect_state_prefix is deprecated and read as upstream.share_state_bucket = true \
             (user objects allowed in the state bucket outside store.s3.prefix; the prefix is always protected). \
             Remove it to reserve the whole state bucket, or set share_state_bucket = true"
        );
    }
    let protection = protection_for(config);
    let upstream = Upstream::from_config(
        &config.upstream,
        endpoint,
        protection.clone(),
        addressing_for(config),
    )?;
    let protected = match &protection {
        Protection::Off => "nothing (the store is not S3)".to_string(),
        Protection::ReservedBucket { bucket } => format!("bucket {bucket} (reserved)"),
        Protection::SharedBucket { bucket, prefix } => {
            format!("{bucket}/{prefix}* (shared bucket)")
        }
    };
    tracing::info!(endpoint, protected = %protected, "S3 pass-through enabled");
    Ok(Some(upstream))
}

/// Runs the server until SIGTERM/SIGINT. Never returns.
pub fn run(config: Config) -> anyhow::Result<()> {
    // Before any secret is loaded: no process of the same user may read this one's
    // environment or memory (`/proc/<pid>/environ`, `mem`), a drift child included.
    crate::drift::sandbox::forbid_dumps().context("cannot make the server non-dumpable")?;
    // The listener's certificate, key and client CA are read before the installation
    // is touched: a file that cannot be used refuses startup, naming its key.
    let tls = listener_tls(&config.tls)?;
    // The address is proven free before anything is opened: pingora binds only when its
    // services start, and on a busy port retries for 30 s and then panics, leaving a
    // process that serves nothing.
    check_listen(config.listen)?;
    // A key service that cannot give the key stops startup before the data dir is
    // created or touched.
    // The key it unwrapped (if any) is the one every part of this process uses: the
    // token is asked once per start.
    let unwrapped = crate::installation::check_key_service(&config)?;
    // Held until the process ends (the end of `serve` exits the process): a restore into the
    // data dir checks it to prove no server is running there.
    let _serving = crate::installation::hold_for_serving(&config)?;
    let (app, root) = build_on_startup_runtime(&config, unwrapped)?;
    crate::address::record_and_log(&config);
    if config.tls.client_ca.is_some() {
        tracing::info!(
            grants = app.client_grants.len(),
            required = config.tls.client_cert_required,
            "client certificates are verified against tls.client_ca"
        );
    }
    let mut server = pingora_server(&config);
    add_background_services(&mut server, &config, &app, &root);
    add_gateway(&mut server, &config, app, tls);
    // `run_forever`, with the log's queue written out before the exit (a fast shutdown
    // on SIGINT does not pass through the drain, which flushes too).
    server.run(pingora::server::RunArgs::default());
    crate::installation::checkpoint_at_stop(&config);
    crate::log::flush();
    std::process::exit(0)
}

/// The app and its root key, built on a small runtime of its own: startup only probes
/// the store there; pingora brings its own runtimes.
fn build_on_startup_runtime(
    config: &Config,
    unwrapped: Option<RootKey>,
) -> anyhow::Result<(Arc<App>, RootKey)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(build(
        config,
        Arc::new(crate::cluster::SystemClock),
        unwrapped,
    ))
}

/// The pingora server, bootstrapped. On SIGTERM pingora stops accepting, then sleeps
/// `grace_period_seconds` before it drops its runtimes; `ExitWhenDrained` ends the
/// process as soon as no request is left, so the sleep is only the bound for requests
/// that do not finish. Runtime shutdown then waits at most a second for blocking work.
fn pingora_server(config: &Config) -> Server {
    let conf = ServerConf {
        threads: config.serve_threads(),
        grace_period_seconds: Some(config.shutdown_grace_seconds),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    server
}

/// Every background service: the drain and the clock check on every node; the
/// housekeeping jobs, each pass on the node holding its claim; the flush of tokens'
/// last use.
fn add_background_services(server: &mut Server, config: &Config, app: &Arc<App>, root: &RootKey) {
    server.add_service(pingora::services::background::background_service(
        "drain",
        crate::drain::ExitWhenDrained(app.inflight.clone(), {
            let config = config.clone();
            Box::new(move || crate::installation::checkpoint_at_stop(&config))
        }),
    ));
    // Every node measures its clock against a shared index, not one node for all.
    server.add_service(pingora::services::background::background_service(
        "clock",
        ClockService(app.tofu.store().clone()),
    ));
    // Nodes sharing a PostgreSQL index run each housekeeping pass on one node at a time.
    let claims = crate::jobs::Claims::of(app.tofu.store());
    add_housekeeping(server, config, app, root, &claims);
    server.add_service(pingora::services::background::background_service(
        "token-last-used",
        LastUsedService {
            tofu: app.tofu.clone(),
            // Held from now on, so the process does not exit before the last flush.
            holding: std::sync::Mutex::new(Some(app.inflight.enter())),
        },
    ));
    if app.drift.has_checks() {
        server.add_service(pingora::services::background::background_service(
            "drift",
            DriftScheduler(app.drift.clone(), claims),
        ));
    }
}

/// The housekeeping jobs a node runs under their claims: retention and backup when
/// configured, stale locks, and lock leases when a policy has one.
fn add_housekeeping(
    server: &mut Server,
    config: &Config,
    app: &Arc<App>,
    root: &RootKey,
    claims: &crate::jobs::Claims,
) {
    if config.retention.interval_seconds > 0 {
        server.add_service(pingora::services::background::background_service(
            "retention",
            RetentionService {
                store: app.tofu.store().clone(),
                policy: Retention::from_config(&config.retention),
                every: std::time::Duration::from_secs(config.retention.interval_seconds),
                metrics: app.metrics.clone(),
                claims: claims.clone(),
            },
        ));
    }
    if config.backup.interval_seconds > 0 {
        server.add_service(pingora::services::background::background_service(
            "backup",
            BackupService {
                snapshot: std::sync::Arc::new(crate::installation::index_snapshot(config)),
                claims: claims.clone(),
                store: app.tofu.store().clone(),
                root: root.clone(),
                keep: config.backup.keep as usize,
                every: std::time::Duration::from_secs(config.backup.interval_seconds),
                metrics: app.metrics.clone(),
            },
        ));
    }
    server.add_service(pingora::services::background::background_service(
        "stale-locks",
        StaleLockService {
            ops: app.operator.clone(),
            tofu: app.tofu.clone(),
            every: (config.retention.interval_seconds > 0)
                .then(|| std::time::Duration::from_secs(config.retention.interval_seconds)),
            claims: claims.clone(),
        },
    ));
    if let Some(every) = LeaseService::every(app.tofu.lease_policies()) {
        server.add_service(pingora::services::background::background_service(
            "lock-leases",
            LeaseService {
                tofu: app.tofu.clone(),
                metrics: app.metrics.clone(),
                every,
                claims: claims.clone(),
            },
        ));
    }
}

/// The gateway on `listen` (TLS when configured), and the line that says it listens.
fn add_gateway(
    server: &mut Server,
    config: &Config,
    app: Arc<App>,
    tls: Option<pingora::listeners::tls::TlsSettings>,
) {
    let mut service = pingora::proxy::http_proxy_service(&server.configuration, Gateway::new(app));
    let listen = config.listen.to_string();
    match tls {
        Some(settings) => service.add_tls_with_settings(&listen, None, settings),
        None => service.add_tcp(&listen),
    }
    server.add_service(service);
    server.add_service(pingora::services::background::background_service(
        "listening",
        AnnounceWhenListening {
            listen: config.listen,
            url: config.base_url(),
        },
    ));
}

/// Binds `listen` once and lets it go: a busy address (another stategate, another
/// program) or one this host does not have refuses startup with one line naming the
/// setting.
fn check_listen(listen: std::net::SocketAddr) -> anyhow::Result<()> {
    match std::net::TcpListener::bind(listen) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => anyhow::bail!(
            "cannot listen on {listen}: the address is already in use (another stategate server, \
             or another program); stop it, or set listen / STATEGATE_LISTEN to a free address"
        ),
        Err(e) => Err(e).with_context(|| {
            format!("cannot listen on {listen}; set listen / STATEGATE_LISTEN to an address of this host")
        }),
    }
}

/// How long pingora may take to bind the listener after the check above proved the
/// address free; past it someone took the address in between, and the process ends.
const BIND_DEADLINE: std::time::Duration = std::time::Duration::from_secs(20);

/// Logs "stategate serving" once this process has a listening socket on the port
/// (pingora binds when its services start, after everything else was said), with the
/// port it got when `listen` asked for port 0. A listener that is not there within
/// [`BIND_DEADLINE`] ends the process with one error line rather than leaving one that
/// serves nothing.
struct AnnounceWhenListening {
    listen: std::net::SocketAddr,
    url: String,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for AnnounceWhenListening {
    async fn start(&self, _shutdown: ShutdownWatch) {
        let since = std::time::Instant::now();
        loop {
            let ports = tokio::task::spawn_blocking(own_listening_ports)
                .await
                .unwrap_or_default();
            let port = match self.listen.port() {
                0 => ports.first().copied(),
                wanted => ports.contains(&wanted).then_some(wanted),
            };
            if let Some(port) = port {
                let listen = std::net::SocketAddr::new(self.listen.ip(), port);
                // Port 0 asked for any port: the address names the one it got.
                let url = match self.url.strip_suffix(":0") {
                    Some(base) if self.listen.port() == 0 => format!("{base}:{port}"),
                    _ => self.url.clone(),
                };
                tracing::info!(listen = %listen, url = %url, "stategate serving");
                return;
            }
            if since.elapsed() > BIND_DEADLINE {
                tracing::error!(
                    listen = %self.listen,
                    "cannot listen on {}: another process took the address during startup; stop it, or set listen / STATEGATE_LISTEN to a free address",
                    self.listen
                );
                crate::log::flush();
                std::process::exit(1);
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// The TCP ports this process listens on (Linux: its socket descriptors matched against
/// `/proc/net/tcp{,6}` rows in state LISTEN); empty when they cannot be read.
fn own_listening_ports() -> Vec<u16> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let link = std::fs::read_link(entry.ok()?.path()).ok()?;
            let link = link.to_str()?;
            Some(
                link.strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let (Some(local), Some(&"0A"), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            if !inodes.contains(*inode) {
                continue;
            }
            if let Some(port) = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            {
                ports.push(port);
            }
        }
    }
    ports
}

/// The TLS settings of the listener, or `None` for plain HTTP. The certificate and key
/// are loaded here once to prove they work (pingora would panic on them later), and
/// with `tls.client_ca` the listener verifies client certificates during the handshake:
/// one that does not chain to the CA, or is outside its validity period, ends the
/// handshake; none at all is allowed unless `tls.client_cert_required`.
fn listener_tls(
    tls: &crate::config::TlsConfig,
) -> anyhow::Result<Option<pingora::listeners::tls::TlsSettings>> {
    use pingora::listeners::tls::TlsSettings;
    let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) else {
        return Ok(None);
    };
    let (cert, key) = (cert.to_string_lossy(), key.to_string_lossy());
    pingora::tls::install_default_crypto_provider();
    let unusable = || {
        format!("tls.cert_file / tls.key_file: cannot load the TLS certificate {cert} or key {key}")
    };
    let (chain, private) = pingora::tls::load_certs_and_key_files(&cert, &key)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(unusable)?
        .with_context(unusable)?;
    pingora::tls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .with_context(unusable)?;
    let Some(verifier) = client_cert_verifier(tls)? else {
        return Ok(Some(
            TlsSettings::intermediate(&cert, &key).with_context(unusable)?,
        ));
    };
    let mut settings =
        TlsSettings::with_callbacks(Box::new(crate::http::mtls::VerifiedClientNames))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    settings
        .set_certificate_chain_file(&cert)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(unusable)?;
    settings
        .set_private_key_file(&key)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(unusable)?;
    settings.set_client_cert_verifier(verifier);
    Ok(Some(settings))
}

/// The verifier of client certificates under `tls.client_ca`, if it is set.
fn client_cert_verifier(
    tls: &crate::config::TlsConfig,
) -> anyhow::Result<Option<Arc<dyn pingora::tls::ClientCertVerifier>>> {
    let Some(ca) = &tls.client_ca else {
        return Ok(None);
    };
    let unusable = || {
        format!(
            "tls.client_ca: cannot use {} as the client CA",
            ca.display()
        )
    };
    let mut roots = pingora::tls::RootCertStore::empty();
    pingora::tls::load_ca_file_into_store(ca, &mut roots)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(unusable)?;
    if roots.is_empty() {
        anyhow::bail!("tls.client_ca: {} holds no certificate", ca.display());
    }
    let mut builder = pingora::tls::WebPkiClientVerifier::builder(Arc::new(roots));
    if let Some(crl) = &tls.client_crl {
        // Only the client's own certificate is looked up: an intermediate is revoked by
        // taking it out of `tls.client_ca`. A certificate whose issuer has no list here
        // is refused (an unknown status is not a good one).
        builder = builder
            .with_crls(revocation_lists(crl)?.into_iter().map(Into::into))
            .only_check_end_entity_revocation();
    }
    let builder = if tls.client_cert_required {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    Ok(Some(builder.build().with_context(unusable)?))
}

/// The DER of every `X509 CRL` in the PEM file `path`; anything else in it, or none at
/// all, refuses startup naming `tls.client_crl` (the lists are parsed by rustls).
fn revocation_lists(path: &std::path::Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let unusable = || {
        format!(
            "tls.client_crl: cannot use {} as revocation lists",
            path.display()
        )
    };
    let text = std::fs::read(path).with_context(unusable)?;
    let mut lists = Vec::new();
    for pem in x509_parser::pem::Pem::iter_from_buffer(&text) {
        let pem = pem.with_context(unusable)?;
        if pem.label != "X509 CRL" {
            anyhow::bail!(
                "tls.client_crl: {} holds a {:?} block; only X509 CRL blocks belong there",
                path.display(),
                pem.label
            );
        }
        x509_parser::parse_x509_crl(&pem.contents)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(unusable)?;
        lists.push(pem.contents);
    }
    if lists.is_empty() {
        anyhow::bail!("tls.client_crl: {} holds no X509 CRL", path.display());
    }
    Ok(lists)
}

/// Serves the gateway on an already-bound listener (tests: bind port 0, no sleeps).
pub async fn serve_listener(
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    shutdown: ShutdownWatch,
) {
    serve_accepted(listener, app, None, shutdown).await;
}

/// The TLS acceptor `run` gives its listener for `tls` (certificate, key, and with
/// `tls.client_ca` the client-certificate verifier and the handshake callback that
/// attaches a verified certificate's names), for [`serve_tls_listener`].
pub fn tls_acceptor(
    tls: &crate::config::TlsConfig,
) -> anyhow::Result<pingora::listeners::tls::Acceptor> {
    let settings = listener_tls(tls)?
        .context("tls.cert_file and tls.key_file are needed for a TLS listener")?;
    // `build` panics on files it cannot load: `listener_tls` has just loaded them.
    Ok(settings.build())
}

/// [`serve_listener`] over TLS (tests: a client certificate reaches the backend only
/// through a real handshake, as in production). A failed handshake closes the
/// connection, as pingora's own listener does.
pub async fn serve_tls_listener(
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    acceptor: pingora::listeners::tls::Acceptor,
    shutdown: ShutdownWatch,
) {
    serve_accepted(listener, app, Some(Arc::new(acceptor)), shutdown).await;
}

async fn serve_accepted(
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    tls: Option<Arc<pingora::listeners::tls::Acceptor>>,
    shutdown: ShutdownWatch,
) {
    use pingora::apps::HttpServerApp;
    use pingora::protocols::http::ServerSession;
    let conf = Arc::new(ServerConf::default());
    let proxy = Arc::new(pingora::proxy::http_proxy(&conf, Gateway::new(app)));
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let proxy = proxy.clone();
        let shutdown = shutdown.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            use pingora::protocols::{GetSocketDigest, SocketDigest};
            use std::os::fd::AsRawFd;
            let mut stream = pingora::protocols::l4::stream::Stream::from(stream);
            // As pingora's own listener does: the client's address (the login throttle's key).
            let digest = SocketDigest::from_raw_fd(stream.as_raw_fd());
            let _ = digest.peer_addr.set(Some(peer.into()));
            stream.set_socket_digest(digest);
            let stream: pingora::protocols::Stream = match &tls {
                None => Box::new(stream),
                Some(acceptor) => match acceptor.tls_handshake(stream).await {
                    Ok(tls) => Box::new(tls),
                    Err(_) => return,
                },
            };
            let mut session = ServerSession::new_http1(stream);
            session.set_keepalive(Some(60));
            let mut reused = proxy.process_new_http(session, &shutdown).await;
            while let Some((stream, _)) = reused.map(|r| r.consume()) {
                let mut session = ServerSession::new_http1(stream);
                session.set_keepalive(Some(60));
                reused = proxy.process_new_http(session, &shutdown).await;
            }
        });
    }
}

/// `stategate health`: a blocking HTTP/1.1 `GET /healthz` on this server's listener (or
/// on `url`), so container images need no curl. An `https` URL (the default with TLS on
/// the listener) is only checked for accepting TCP connections: no TLS client here.
pub fn probe_health(config: &Config, url: Option<&str>) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
    let url = url.map_or_else(|| local_health_url(config), str::to_string);
    let uri: http::Uri = url
        .parse()
        .with_context(|| format!("invalid URL {url:?}"))?;
    let https = uri.scheme_str() == Some("https");
    let host = uri.host().with_context(|| format!("no host in {url:?}"))?;
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host.trim_matches(['[', ']']), port))
        .with_context(|| format!("cannot resolve {host}"))?
        .next()
        .with_context(|| format!("{host} has no address"))?;
    let mut conn = std::net::TcpStream::connect_timeout(&addr, TIMEOUT)
        .with_context(|| format!("cannot connect to {addr}"))?;
    if https {
        return Ok(());
    }
    conn.set_read_timeout(Some(TIMEOUT))?;
    conn.set_write_timeout(Some(TIMEOUT))?;
    let path = match uri.path() {
        "" | "/" => "/healthz",
        path => path,
    };
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut head = Vec::new();
    conn.take(1024)
        .read_to_end(&mut head)
        .with_context(|| format!("no answer from {url}"))?;
    let status = String::from_utf8_lossy(&head);
    let status = status.lines().next().unwrap_or_default();
    anyhow::ensure!(
        status.split(' ').nth(1) == Some("200"),
        "{url} answered {status:?}"
    );
    Ok(())
}

/// The `/healthz` URL of the configured listener, via loopback when it listens on all
/// addresses.
fn local_health_url(config: &Config) -> String {
    let ip = match config.listen.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    let scheme = if config.tls.cert_file.is_some() {
        "https"
    } else {
        "http"
    };
    let addr = std::net::SocketAddr::new(ip, config.listen.port());
    format!("{scheme}://{addr}/healthz")
}

/// Releases (audited) the locks of moves whose process is gone, warns about workspace
/// locks held longer than `locks.stale_after_seconds`, with their holder (never frees
/// them), and removes (audited) freezes whose end passed: at startup, then every
/// retention interval.
struct StaleLockService {
    ops: crate::operator::Operations,
    tofu: TofuBackend,
    every: Option<std::time::Duration>,
    claims: crate::jobs::Claims,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for StaleLockService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            // On every node, claim or not: releasing is idempotent, and a restarted
            // node must not wait for its old claim to lapse before freeing them.
            self.release_abandoned_moves().await;
            if self
                .claims
                .take("stale-locks", claim_time(self.every))
                .await
            {
                self.pass().await;
            }
            let Some(every) = self.every else { return };
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Runs `pass` now and then every `every`, on the node that holds job `name`'s claim
/// (one node of several does each pass), until shutdown.
async fn every_claimed<F: std::future::Future<Output = ()>>(
    claims: &crate::jobs::Claims,
    name: &'static str,
    every: std::time::Duration,
    shutdown: &mut ShutdownWatch,
    pass: impl Fn() -> F,
) {
    loop {
        if claims.take(name, claim_time(Some(every))).await {
            pass().await;
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// How long a node holds a job's claim: past the next pass, so the node that runs them
/// keeps them, and short enough that another takes over soon after it dies.
fn claim_time(every: Option<std::time::Duration>) -> std::time::Duration {
    every.unwrap_or_default() + std::time::Duration::from_secs(60)
}

impl StaleLockService {
    async fn release_abandoned_moves(&self) {
        if crate::tokens::clock_distrusted().is_some() {
            // A heartbeat's age is judged by this node's clock.
            return;
        }
        match self.tofu.release_abandoned_moves().await {
            Ok(released) => {
                for lock_id in released {
                    tracing::warn!(lock_id = %lock_id, "released the locks of a move whose process is gone (audited as tf.move_abandoned)");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot release the locks of abandoned moves"),
        }
    }

    async fn pass(&self) {
        {
            match self.ops.stale_locks().await {
                Ok(stale) => {
                    for (workspace, lock) in stale {
                        tracing::warn!(
                            workspace = %workspace,
                            who = ?lock.who,
                            operation = ?lock.operation,
                            lock_id = ?lock.id,
                            held_seconds = lock.age_seconds,
                            "stale workspace lock; if its run is dead, free it with `stategate workspace unlock`"
                        );
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot check for stale locks"),
            }
            // Housekeeping notices freezes whose `until` passed (removed, audited).
            if let Err(e) = self.ops.freezes(&crate::operator::roles::Grant::ROOT).await {
                tracing::warn!(error = %e, "cannot expire ended freezes");
            }
        }
    }
}

/// Releases the idle locks of gone credentials on the workspaces a `[[lock_policy]]`
/// names (`TofuBackend::expire_leased_locks`, audited as `tf.lock_expired`), every half
/// of the shortest lease (at least every second, at most every minute), on the node
/// holding the job's claim. Only when a policy is configured.
struct LeaseService {
    tofu: TofuBackend,
    metrics: Metrics,
    every: std::time::Duration,
    claims: crate::jobs::Claims,
}

impl LeaseService {
    fn every(policies: &crate::tofu::lock::LeasePolicies) -> Option<std::time::Duration> {
        let half = u64::try_from(policies.shortest()? / 2).unwrap_or(0);
        Some(std::time::Duration::from_secs(half.clamp(1, 60)))
    }

    async fn pass(&self) {
        if crate::tokens::clock_distrusted().is_some() {
            // Idle time and expiry are judged by this node's clock.
            return;
        }
        match self.tofu.expire_leased_locks().await {
            Ok(expired) => {
                for lock in expired {
                    self.metrics.lock_expired(lock.why.label());
                    tracing::warn!(
                        workspace = %lock.workspace,
                        lock_id = %lock.lock_id,
                        taken_by = %lock.taken_by,
                        why = lock.why.as_str(),
                        idle_seconds = lock.idle_seconds,
                        shared = lock.shared,
                        "released the idle lock of a credential that is gone (audited as tf.lock_expired)"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot release the expired leases of locks"),
        }
    }
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for LeaseService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        every_claimed(
            &self.claims,
            "lock-leases",
            self.every,
            &mut shutdown,
            || self.pass(),
        )
        .await
    }
}

/// Measures this node's clock against a PostgreSQL index every
/// `store::db::CLOCK_CHECK_EVERY` (`Db::check_clock`): past the bound the node refuses
/// what depends on expiry and `/healthz` says why, until a pass finds it back.
struct ClockService(StateStore);

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for ClockService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(crate::store::db::CLOCK_CHECK_EVERY) => {}
                _ = shutdown.changed() => return,
            }
            if let Err(e) = self.0.check_clock().await {
                tracing::warn!(error = %e, "cannot compare this node's clock with the index's");
            }
        }
    }
}

/// Writes the last-used times of issued workspace tokens every
/// `tofu::credentials::LAST_USED_FLUSH` and once more when the server stops (holding
/// an in-flight guard until then, so the drain waits for that flush).
struct LastUsedService {
    tofu: TofuBackend,
    holding: std::sync::Mutex<Option<crate::drain::InflightGuard>>,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for LastUsedService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let stopping = tokio::select! {
                _ = tokio::time::sleep(crate::tofu::credentials::LAST_USED_FLUSH) => false,
                _ = shutdown.changed() => true,
            };
            if let Err(e) = self.tofu.flush_last_used().await {
                tracing::warn!(error = %e, "cannot record when workspace tokens were last used");
            }
            if stopping {
                let guard = self
                    .holding
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .take();
                drop(guard);
                return;
            }
        }
    }
}

/// Runs the configured drift checks on their intervals (`drift::DriftService::schedule`).
struct DriftScheduler(crate::drift::DriftService, crate::jobs::Claims);

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for DriftScheduler {
    async fn start(&self, shutdown: ShutdownWatch) {
        self.0.schedule(shutdown, &self.1).await
    }
}

/// Prunes history and sweeps garbage blobs: once at startup, then every `every`.
struct RetentionService {
    store: StateStore,
    policy: Retention,
    every: std::time::Duration,
    metrics: Metrics,
    claims: crate::jobs::Claims,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for RetentionService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        every_claimed(&self.claims, "retention", self.every, &mut shutdown, || {
            self.pass()
        })
        .await
    }
}

impl RetentionService {
    async fn pass(&self) {
        {
            let now = crate::clock::now_utc();
            // Garbage is only reported here, never deleted (see `run_retention`).
            match self
                .store
                .run_retention(self.policy, now, false, false)
                .await
            {
                Ok((pruned, garbage)) => {
                    let result = crate::metrics::RetentionResult {
                        pruned_versions: pruned.pruned.len() as u64,
                        swept_blobs: 0,
                        unreferenced_blobs: garbage.swept.len() as u64,
                        errors: (pruned.blob_errors.len() + garbage.errors.len()) as u64,
                    };
                    let unix = crate::clock::now_utc().unix_timestamp() as f64;
                    self.metrics.record_retention(result, unix);
                    tracing::info!(
                        pruned_versions = pruned.pruned.len(),
                        unreferenced_blobs = garbage.swept.len(),
                        unrecognized_blobs = garbage.unrecognized.len(),
                        blob_errors = pruned.blob_errors.len() + garbage.errors.len(),
                        "retention pass done"
                    );
                    if !garbage.swept.is_empty() {
                        tracing::warn!(
                            count = garbage.swept.len(),
                            "blobs older than an hour that no version row references: crash leftovers, \
                             or committed versions of a database restored from an older backup. \
                             Check with `stategate prune --dry-run`, recover with `stategate index rebuild`, \
                             delete with `stategate prune --sweep-garbage`"
                        );
                    }
                }
                Err(e) => {
                    self.metrics.retention_failed();
                    tracing::warn!(error = %e, "retention pass failed; retrying next interval")
                }
            }
        }
    }
}

/// A snapshot of the index, for a backup (`installation::index_snapshot`).
type IndexSnapshot =
    std::sync::Arc<dyn Fn() -> Result<Vec<u8>, crate::store::backup::BackupError> + Send + Sync>;

/// Backs the index up into the store every `every` (the first one when the newest
/// backup in the store is that old), keeping the newest `keep`. Of several nodes on
/// one index, the one holding the job's claim does.
struct BackupService {
    snapshot: IndexSnapshot,
    claims: crate::jobs::Claims,
    store: StateStore,
    root: RootKey,
    keep: usize,
    every: std::time::Duration,
    metrics: Metrics,
}

impl BackupService {
    /// Time until the next backup is due, from the newest one in the store.
    async fn first_wait(&self) -> std::time::Duration {
        let newest = match crate::store::backup::list_backups(&**self.store.blobs()).await {
            Ok(all) => all.last().map(|b| b.unix_seconds()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list backups; taking one now");
                None
            }
        };
        let Some(newest) = newest else {
            return std::time::Duration::ZERO;
        };
        self.metrics.record_backup(newest);
        let age = crate::clock::now_utc().unix_timestamp() - newest;
        self.every
            .saturating_sub(std::time::Duration::from_secs(age.max(0) as u64))
    }

    async fn once(&self) {
        if !self
            .claims
            .take("backup", claim_time(Some(self.every)))
            .await
        {
            return;
        }
        let blobs = &**self.store.blobs();
        let snapshot = self.snapshot.clone();
        match crate::store::backup::take_backup_from(move || snapshot(), blobs, &self.root).await {
            Ok(info) => {
                self.metrics.record_backup(info.unix_seconds());
                tracing::info!(backup = %info.id, "index backed up into the store");
                match crate::store::backup::keep_newest(blobs, self.keep).await {
                    Ok(gone) if !gone.is_empty() => {
                        tracing::info!(
                            deleted = gone.len(),
                            keep = self.keep,
                            "old backups deleted"
                        )
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot delete old backups; retrying next time")
                    }
                }
            }
            Err(e) => {
                self.metrics.backup_failed();
                tracing::warn!(error = %e, "backup failed; retrying next interval");
            }
        }
    }
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for BackupService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut wait = self.first_wait().await;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => return,
            }
            self.once().await;
            wait = self.every;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(upstream: Option<&str>) -> Config {
        let mut c = Config::default();
        c.store.kind = StoreKind::S3;
        c.store.s3.endpoint = "http://127.0.0.1:3900".into();
        c.store.s3.bucket = "tf".into();
        c.upstream.endpoint = upstream.map(str::to_string);
        c
    }

    #[test]
    fn protection_follows_the_bucket_name_whatever_the_upstream_is_called() {
        let reserved = Protection::ReservedBucket {
            bucket: "tf".into(),
        };
        let shared = Protection::SharedBucket {
            bucket: "tf".into(),
            prefix: "stategate/".into(),
        };
        for upstream in [
            None,
            Some("http://127.0.0.1:3900"),
            Some("http://localhost:3900/"),
            Some("http://garage.internal:3900"),
        ] {
            let mut c = s3(upstream);
            assert_eq!(protection_for(&c), reserved, "{upstream:?}");
            c.upstream.share_state_bucket = true;
            assert_eq!(protection_for(&c), shared, "{upstream:?}");
            c.upstream.share_state_bucket = false;
            c.upstream.protect_state_prefix = Some(false);
            assert_eq!(protection_for(&c), shared, "{upstream:?}");
        }
        let mut local = Config::default();
        local.upstream.endpoint = Some("http://127.0.0.1:3900".into());
        assert_eq!(protection_for(&local), Protection::Off);
    }

    #[tokio::test]
    async fn the_guard_needs_the_upstream_proven_to_be_the_store() {
        // (upstream endpoint, proven the store?)
        let table = [
            (None, true),
            (Some("http://127.0.0.1:3900"), true),
            (Some("http://localhost:3900"), true),
            (Some("http://127.0.0.1:3901"), false),
            (Some("https://127.0.0.1:3900"), false),
            (Some("http://192.0.2.1:3900"), false),
        ];
        for (upstream, proven) in table {
            let got = upstream_is_state_store(&s3(upstream)).await;
            assert_eq!(got.is_ok(), proven, "{upstream:?}: {got:?}");
        }
        let mut local = Config::default();
        local.upstream.endpoint = Some("http://127.0.0.1:3900".into());
        let why = upstream_is_state_store(&local).await.unwrap_err();
        assert!(why.contains("not S3"), "{why}");
        assert!(conditional_guard_for(&local).await.unwrap().is_none());
    }

    #[test]
    fn clients_may_use_every_name_of_stategate() {
        let mut c = s3(None);
        c.listen = "0.0.0.0:8080".parse().unwrap();
        c.public_url = Some("https://StateGate.example:8443/".into());
        c.upstream.hosts = vec!["alias.lan".into()];
        c.upstream.root_domains = vec!["s3.lan".into()];
        let a = addressing_for(&c);
        let reads = |host: &str| {
            crate::http::s3_target::resolve(
                "GET",
                "/b/k",
                None,
                Some(host),
                &http::HeaderMap::new(),
                &a,
            )
            .is_ok()
        };
        for host in [
            "localhost:8080",
            "127.0.0.1",
            "[::1]:8080",
            "0.0.0.0:8080",
            "stategate.example",
            "alias.lan",
            "s3.lan",
            "b.s3.lan",
        ] {
            assert!(reads(host), "{host}");
        }
        for host in ["10.0.0.5:8080", "example", "b.alias.lan"] {
            assert!(!reads(host), "{host}");
        }
    }

    use std::io::{Read, Write};

    #[test]
    fn health_url_of_the_listener() {
        for (listen, tls, want) in [
            ("0.0.0.0:8080", false, "http://127.0.0.1:8080/healthz"),
            ("[::]:9000", false, "http://[::1]:9000/healthz"),
            ("10.1.2.3:80", false, "http://10.1.2.3:80/healthz"),
            ("0.0.0.0:8443", true, "https://127.0.0.1:8443/healthz"),
        ] {
            let mut config = Config {
                listen: listen.parse().unwrap(),
                ..Config::default()
            };
            config.tls.cert_file = tls.then(|| "cert.pem".into());
            assert_eq!(local_health_url(&config), want, "{listen} tls={tls}");
        }
    }

    /// A one-connection server answering `reply`; returns its URL.
    fn answer_once(reply: &'static str) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            // The request head may arrive in several reads on a loaded machine.
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).unwrap();
                assert!(n > 0, "connection closed before the request head ended");
                head.extend_from_slice(&buf[..n]);
            }
            assert!(head.starts_with(b"GET /healthz HTTP/1.1\r\n"));
            conn.write_all(reply.as_bytes()).unwrap();
        });
        url
    }

    #[test]
    fn probe_health_needs_a_200() {
        let config = Config::default();
        let ok = answer_once("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        probe_health(&config, Some(&ok)).unwrap();
        let bad = answer_once("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n");
        let err = probe_health(&config, Some(&bad)).unwrap_err().to_string();
        assert!(err.contains("503"), "{err}");

        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}/healthz", l.local_addr().unwrap())
        };
        let err = probe_health(&config, Some(&closed))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot connect"), "{err}");
        assert!(probe_health(&config, Some("not a url")).is_err());
    }
}
