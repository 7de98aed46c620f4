//! Startup: turn a [`Config`] into a running gateway. Opens the data dir, the DEK,
//! SQLite and the blob store, proves the store is writable, then serves.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use pingora::server::configuration::ServerConf;
use pingora::server::{Server, ShutdownWatch};

use crate::config::{Config, StoreKind};
use crate::crypto::RootKey;
use crate::http::conditional::ConditionalGuard;
use crate::http::upstream::Upstream;
use crate::http::{App, Gateway};
use crate::metrics::Metrics;
use crate::store::blob::create_private_dir;
use crate::store::{s3::S3Store, BlobStore, Db, LocalStore, StateStore};
use crate::tofu::TofuBackend;

/// Loads the DEK from config/env, else from the key file (creating it on first start).
pub fn load_root_key(config: &Config, create: bool) -> anyhow::Result<RootKey> {
    if let Some(text) = &config.dek {
        return RootKey::from_base64(text.expose()).context("STATEGATE_DEK / dek is invalid");
    }
    let path = config.dek_path();
    if !create && !path.exists() {
        anyhow::bail!(
            "no DEK at {} (run `stategate serve` once to create it, or set STATEGATE_DEK / STATEGATE_DATA_DIR)",
            path.display()
        );
    }
    if let Some(dir) = path.parent() {
        create_private_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let (key, created) = RootKey::load_or_create(&path)?;
    if created {
        tracing::warn!(
            path = %path.display(),
            "created a NEW data-encryption key. BACK IT UP NOW: without it every stored state is unreadable and every workspace credential changes"
        );
        eprintln!(
            "\n*** stategate created a new data-encryption key at {} ***\n*** Back it up: without it every stored state is lost. ***\n",
            path.display()
        );
    }
    Ok(key)
}

pub fn open_blob_store(config: &Config) -> anyhow::Result<Arc<dyn BlobStore>> {
    Ok(match config.store.kind {
        StoreKind::Local => Arc::new(LocalStore::open(&config.local_store_path())?),
        StoreKind::S3 => Arc::new(S3Store::new(&config.store.s3)),
    })
}

/// The storage engine as `serve` opens it: data dir, SQLite (all schemas), the blob
/// store, proven reachable and writable. Also used by the operator commands.
pub async fn open_state_store(config: &Config) -> anyhow::Result<StateStore> {
    create_private_dir(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    let db = Db::open(&config.db_path(), &[crate::cluster::SCHEMA])
        .with_context(|| format!("cannot open database {}", config.db_path().display()))?;
    let blobs = open_blob_store(config)?;
    blobs.check().await.with_context(|| {
        format!(
            "the blob store ({}) is not reachable and writable; check endpoint, bucket and credentials",
            blobs.describe()
        )
    })?;
    tracing::info!(store = %blobs.describe(), data_dir = %config.data_dir.display(), "storage ready");
    Ok(StateStore::new(db, blobs))
}

/// Builds the application state. Must be called inside a tokio runtime (store checks).
pub async fn build_app(config: &Config) -> anyhow::Result<Arc<App>> {
    build_app_with_clock(config, Arc::new(crate::cluster::SystemClock)).await
}

/// [`build_app`] with the clock cluster leases are timed by (tests pass a `TestClock`).
pub async fn build_app_with_clock(
    config: &Config,
    clock: Arc<dyn crate::cluster::Clock>,
) -> anyhow::Result<Arc<App>> {
    // The store is checked first (it also creates the data dir): a misconfigured store
    // must not leave a fresh DEK behind.
    let store = open_state_store(config).await?;
    let root = load_root_key(config, true)?;
    let cluster = crate::cluster::ClusterService::new(store.clone(), &config.cluster, clock)
        .context("ADJ_STATE_ENC_KEY (cluster.state_enc_key) is invalid")?;
    Ok(Arc::new(App {
        cluster,
        tofu: TofuBackend::new(store, root),
        max_state_bytes: config.max_state_bytes,
        body_budget: crate::http::BodyBudget::new(config.max_inflight_body_bytes),
        metrics: Metrics::new(),
        upstream: upstream_for(config)?,
        conditional: conditional_guard_for(config),
        inflight: crate::drain::Inflight::default(),
    }))
}

/// Is the pass-through upstream the S3 store stategate itself writes to (same credentials)?
fn upstream_is_state_store(config: &Config) -> bool {
    config.store.kind == StoreKind::S3
        && config.upstream_endpoint().map(|e| e.trim_end_matches('/'))
            == Some(config.store.s3.endpoint.trim_end_matches('/'))
}

/// Conditional writes can only be checked with credentials for the upstream.
fn conditional_guard_for(config: &Config) -> Option<ConditionalGuard> {
    (config.upstream.guard_conditional_writes && upstream_is_state_store(config))
        .then(|| ConditionalGuard::new(Arc::new(S3Store::new(&config.store.s3))))
}

fn upstream_for(config: &Config) -> anyhow::Result<Option<Upstream>> {
    let Some(endpoint) = config.upstream_endpoint() else {
        return Ok(None);
    };
    // The state bucket's prefix is protected only when the upstream is the state store itself.
    let protected =
        (config.upstream.protect_state_prefix && upstream_is_state_store(config)).then(|| {
            (
                config.store.s3.bucket.clone(),
                config.store.s3.prefix.clone(),
            )
        });
    let upstream = Upstream::from_config(&config.upstream, endpoint, protected)?;
    tracing::info!(endpoint, "S3 pass-through enabled");
    Ok(Some(upstream))
}

/// Runs the server until SIGTERM/SIGINT. Never returns.
pub fn run(config: Config) -> anyhow::Result<()> {
    // The startup runtime only probes the store; pingora brings its own runtimes.
    let app = {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        rt.block_on(build_app(&config))?
    };
    // On SIGTERM pingora stops accepting, then sleeps `grace_period_seconds` before it
    // drops its runtimes; `ExitWhenDrained` ends the process as soon as no request is
    // left, so the sleep is only the bound for requests that do not finish. Runtime
    // shutdown then waits at most a second for blocking work.
    let conf = ServerConf {
        grace_period_seconds: Some(config.shutdown_grace_seconds),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    server.add_service(pingora::services::background::background_service(
        "drain",
        crate::drain::ExitWhenDrained(app.inflight.clone()),
    ));
    if config.retention.interval_seconds > 0 {
        server.add_service(pingora::services::background::background_service(
            "retention",
            RetentionService {
                store: app.tofu.store().clone(),
                policy: config.retention.policy(),
                every: std::time::Duration::from_secs(config.retention.interval_seconds),
            },
        ));
    }
    let mut service = pingora::proxy::http_proxy_service(&server.configuration, Gateway::new(app));
    let listen = config.listen.to_string();
    match (&config.tls.cert_file, &config.tls.key_file) {
        (Some(cert), Some(key)) => service
            .add_tls(&listen, &cert.to_string_lossy(), &key.to_string_lossy())
            .context("cannot load the TLS certificate or key")?,
        _ => service.add_tcp(&listen),
    }
    server.add_service(service);
    tracing::info!(listen = %config.listen, url = %config.base_url(), "stategate serving");
    server.run_forever();
}

/// Serves the gateway on an already-bound listener (tests: bind port 0, no sleeps).
pub async fn serve_listener(
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    shutdown: ShutdownWatch,
) {
    use pingora::apps::HttpServerApp;
    use pingora::protocols::http::ServerSession;
    let conf = Arc::new(ServerConf::default());
    let proxy = Arc::new(pingora::proxy::http_proxy(&conf, Gateway::new(app)));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let proxy = proxy.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut session = ServerSession::new_http1(Box::new(
                pingora::protocols::l4::stream::Stream::from(stream),
            ));
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

pub fn data_dir_exists(path: &Path) -> bool {
    path.is_dir()
}

/// Prunes history and sweeps garbage blobs: once at startup, then every `every`.
struct RetentionService {
    store: StateStore,
    policy: crate::store::retention::Retention,
    every: std::time::Duration,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for RetentionService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let now = time::OffsetDateTime::now_utc();
            // Garbage is only reported here, never deleted (see `run_retention`).
            match self
                .store
                .run_retention(self.policy, now, false, false)
                .await
            {
                Ok((pruned, garbage)) => {
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
                    tracing::warn!(error = %e, "retention pass failed; retrying next interval")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.every) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
            let mut buf = [0u8; 1024];
            let n = conn.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"GET /healthz HTTP/1.1\r\n"));
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
