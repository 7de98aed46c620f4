//! One installation on disk — the data dir, its keys, its index and its blob store —
//! opened one way for `serve` and for every operator command: [`Installation::open`]
//! reads the root key, opens the keyring, the index (with every schema, through
//! `store::index`, which alone knows its kind) and the blob store (proven reachable and
//! writable), and builds the services over them. What differs between callers is the
//! [`Purpose`]: only `serve` may make the key of a new installation; a command needs an
//! index that is there. The config's write policies (downgrade, leases) are the
//! installation's and hold for every purpose.
//!
//! A few commands must answer with less than a whole installation, and have a named
//! opening here instead of a [`Purpose`] (an [`Installation`] always holds a key and a
//! store): the index-only listings ([`listings`]) and admin records ([`records`]),
//! which answer while the store is down; [`client_env`] and [`drift_webhook_secret`]
//! (the key alone); [`backup`] (the index only as its snapshot); [`prune`] (index and store, no key); and [`recovery`], which writes
//! a *new* index where none is. The remaining public steps are for tests.
//!
//! The data dir's server lock lives here too: `serve` holds `<data_dir>/serve.lock`
//! for its whole life (one server per data dir), and a command that writes a new index
//! straight into the data dir (a restore after a lost disk) takes it first, so it never
//! writes under a running server.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use crate::cluster::{Clock, ClusterService};
use crate::config::{Config, KeyServiceKind, StoreKind};
use crate::crypto::pkcs11::{Pkcs11KeyService, Pkcs11Params};
use crate::crypto::service::KeyService;
use crate::crypto::{wrapped, RootKey};
use crate::drift::DriftService;
use crate::keys::{KeySource, Keyring};
use crate::metrics::Metrics;
use crate::operator::Operations;
use crate::store::blob::create_private_dir;
use crate::store::copy::TableCopy;
use crate::store::index::{Index, MigrateTo, NewIndex};
use crate::store::keyring::KeyRow;
use crate::store::rebuild::ScopeKeys;
use crate::store::{s3::S3Store, BlobStore, Db, LocalStore, StateStore};
use crate::tofu::ci_identity::CiIdentities;
use crate::tofu::TofuBackend;
use cryptoki::types::AuthPin;

pub mod records;
pub mod recovery;

/// Why a process opens the installation: what it may create, and how it reads the
/// keyring. The order of the steps differs by purpose on purpose (which refusal a
/// person sees first is part of each command's behaviour).
pub enum Purpose {
    /// `stategate serve`: the key of a new installation is made here, and only when the
    /// installation holds no data; the keyring is reconciled with its copies in the
    /// store, and the key proven against the index's and the store's records.
    Serve(Box<Serving>),
    /// An operator command on an existing installation (`workspace`, `drift`): refused
    /// without an index; the key is read (never made) and its ring attached from the
    /// index's table before the store is opened.
    Command,
    /// `stategate key …`: as [`Purpose::Command`], but the store is opened first and
    /// the keyring reconciled with its copies there (an index restored from before a
    /// rotation or a rewrap still opens).
    Keyring,
}

/// What `serve` brings to [`Installation::open`], read before anything was opened.
pub struct Serving {
    /// The root key `serve` already unwrapped checking the key service
    /// ([`check_key_service`]): the token is asked once per start.
    pub unwrapped: Option<RootKey>,
    /// What cluster leases are timed by (tests pass a `TestClock`).
    pub clock: Arc<dyn Clock>,
    /// The blob store's traffic is counted into these.
    pub metrics: Metrics,
    /// `[[ci_identity]]`'s trusted issuers.
    pub ci_identities: CiIdentities,
}

/// One installation, open: its root key with the keyring attached, its index and blob
/// store (inside the backend), and the services over them. Services a command may not
/// need are built on demand ([`Installation::cluster`], [`Installation::drift`]), so a
/// command reads no configuration it does not use (`ADJ_STATE_ENC_KEY`) and announces
/// no drift sandbox it does not start.
#[derive(Clone)]
pub struct Installation {
    config: Config,
    root: RootKey,
    tofu: TofuBackend,
    clock: Arc<dyn Clock>,
}

/// Every service `serve` runs, over one installation.
pub struct Services {
    pub tofu: TofuBackend,
    pub cluster: ClusterService,
    pub operator: Operations,
    pub drift: DriftService,
    pub keys: Keyring,
}

impl Installation {
    /// Opens the installation `config` names for `purpose` (see [`Purpose`]): a key that
    /// does not open, a ring generation that does not unwrap, or a key whose
    /// fingerprint is not the one the index recorded stops here, before anything is
    /// written. Must run inside a tokio runtime (the store is probed).
    pub async fn open(config: &Config, purpose: Purpose) -> anyhow::Result<Installation> {
        let (root, store, serving) = match purpose {
            Purpose::Serve(serving) => {
                let (root, store) = open_for_serving(config, &serving).await?;
                (root, store, Some(serving))
            }
            Purpose::Command => {
                require_index(config)?;
                let root = load_root_key(config, false)?;
                (root, open_state_store(config).await?, None)
            }
            Purpose::Keyring => {
                require_index(config)?;
                let store = open_state_store(config).await?;
                let root = read_root_key(config, false)?;
                open_keyring(config, &root, &store, true).await?;
                (root, store, None)
            }
        };
        // A policy in the config is the installation's, not the server's: a command's
        // writes are judged as the server judges them. CI identities stay the server's
        // alone (a command takes no tokens).
        let downgrade = crate::tofu::posture::DowngradePolicy::parse(
            &config.tofu.refuse_plaintext_after_encrypted,
        )
        .map_err(anyhow::Error::msg)?;
        let leases = crate::tofu::lock::LeasePolicies::from_config(&config.lock_policy)?;
        let mut tofu = TofuBackend::new(store, root.clone())
            .with_downgrade_policy(downgrade)
            .with_lease_policies(leases);
        let mut clock: Arc<dyn Clock> = Arc::new(crate::cluster::SystemClock);
        if let Some(serving) = serving {
            tofu = tofu.with_ci_identities(serving.ci_identities);
            clock = serving.clock;
        }
        Ok(Installation {
            config: config.clone(),
            root,
            tofu,
            clock,
        })
    }

    /// The root key, its keyring attached.
    pub fn root(&self) -> &RootKey {
        &self.root
    }

    /// The storage engine: the index and the blob store.
    pub fn store(&self) -> &StateStore {
        self.tofu.store()
    }

    /// The Terraform/OpenTofu backend.
    pub fn tofu(&self) -> &TofuBackend {
        &self.tofu
    }

    /// The cluster API's service; reads `ADJ_STATE_ENC_KEY` (invalid: refused).
    pub fn cluster(&self) -> anyhow::Result<ClusterService> {
        Ok(ClusterService::new(
            self.store().clone(),
            load_cluster_key(&self.config)?,
            &self.config.cluster,
            self.clock.clone(),
        ))
    }

    /// The day-two operations (the CLI's, the admin API's and the UI's).
    pub fn operator(&self) -> anyhow::Result<Operations> {
        Ok(self.operations(self.cluster()?))
    }

    fn operations(&self, cluster: ClusterService) -> Operations {
        Operations::new(
            self.tofu.clone(),
            cluster,
            self.config.locks.stale_after_seconds,
        )
        .with_max_view_bytes(self.config.max_view_bytes)
    }

    /// The drift service (drift outputs and kept plans are its). Each call builds one:
    /// a process wants one, and it logs its sandbox's state when built.
    pub fn drift(&self) -> DriftService {
        DriftService::new(&self.config, self.tofu.clone(), self.root.clone())
    }

    /// The keyring's operations over this installation and `drift`'s artifacts.
    pub fn keyring(&self, drift: &DriftService) -> Keyring {
        keyring(&self.config, &self.root, self.store(), drift.clone())
    }

    /// Both roots by the scope prefix each seals, for `keys::Keyring::reseal`; reads
    /// `ADJ_STATE_ENC_KEY` (cluster scopes are left alone without it).
    pub fn scope_keys(&self) -> anyhow::Result<ScopeKeys> {
        Ok(crate::schema::scope_keys(
            self.root.clone(),
            load_cluster_key(&self.config)?,
        ))
    }

    /// Every service, for `serve`: one cluster service and one drift service shared.
    pub fn services(&self) -> anyhow::Result<Services> {
        let cluster = self.cluster()?;
        let drift = self.drift();
        Ok(Services {
            tofu: self.tofu.clone(),
            operator: self.operations(cluster.clone()),
            keys: self.keyring(&drift),
            cluster,
            drift,
        })
    }
}

/// What `stategate backup` did: the backup taken, the store it went to, and the
/// deletion of the oldest beyond `backup.keep` (its own result: the backup stands
/// either way).
pub struct BackedUp {
    pub info: crate::store::backup::BackupInfo,
    pub store: String,
    pub deleted: anyhow::Result<Vec<crate::store::backup::BackupInfo>>,
}

/// `stategate backup`'s opening: the key and the store, and the index only through its
/// snapshot (the server's backup job takes the same one) — never opened for writing,
/// so a PostgreSQL database no node has opened is refused, not given an index.
pub async fn backup(config: &Config) -> anyhow::Result<BackedUp> {
    require_index(config)?;
    let root = load_root_key(config, false)?;
    let blobs = open_blob_store(config)?;
    let info =
        crate::store::backup::take_backup_from(index_snapshot(config), &*blobs, &root).await?;
    let keep = config.backup.keep as usize;
    let deleted = crate::store::backup::keep_newest(&*blobs, keep)
        .await
        .map_err(anyhow::Error::from);
    Ok(BackedUp {
        info,
        store: blobs.describe(),
        deleted,
    })
}

/// `stategate workspace env`'s opening: the root key alone, and the workspace's
/// credential generation from the index when there is one (a workspace is at
/// generation 0 until rotated; without an index nothing was). The store is not
/// opened: the lines a client needs are derived, never stored. What it returns holds
/// the workspace's credential, for the person who asked.
pub async fn client_env(
    config: &Config,
    workspace: &str,
    opentofu_encryption: bool,
) -> anyhow::Result<String> {
    let root = load_root_key(config, false)?;
    let generation = if Index::of(config).holds_index()? {
        let ws = workspace.to_string();
        open_database(config)?
            .read(move |c| crate::tofu::credentials::generation(c, &ws))
            .await?
    } else {
        0
    };
    Ok(crate::tofu::client_env(
        &crate::address::for_clients(config),
        workspace,
        &root,
        generation,
        opentofu_encryption,
    ))
}

/// `stategate drift webhook-secret`'s opening: the root key alone (the secret is
/// derived from it), so it answers while the store is down.
pub fn drift_webhook_secret(config: &Config) -> anyhow::Result<String> {
    Ok(load_root_key(config, false)?.webhook_secret())
}

/// `stategate prune`'s opening: the index (which must be there) and the store, no key
/// (retention reads rows and blob names, never content); then the policy applied, or
/// with `dry_run` only reported.
pub async fn prune(
    config: &Config,
    policy: crate::store::retention::Retention,
    dry_run: bool,
    sweep_garbage: bool,
) -> anyhow::Result<(
    crate::store::retention::PruneReport,
    crate::store::retention::SweepReport,
)> {
    require_index(config)?;
    let store = open_state_store(config).await?;
    let now = crate::clock::now_utc();
    Ok(store
        .run_retention(policy, now, dry_run, sweep_garbage)
        .await?)
}

/// `serve`'s opening: a key that is there is read before anything is opened (one that
/// cannot be used stops startup with nothing touched); a new key only for an
/// installation with no data at all, made after the store proved reachable (a
/// misconfigured store must not leave a fresh key behind); then the keyring and the
/// key's proof against the records.
async fn open_for_serving(
    config: &Config,
    serving: &Serving,
) -> anyhow::Result<(RootKey, StateStore)> {
    let root = match &serving.unwrapped {
        Some(root) => Some(root.clone()),
        None if has_root_key(config) => Some(read_root_key(config, false)?),
        None => {
            // Checked before anything is created, so a refused start leaves nothing.
            require_no_data(config).await?;
            None
        }
    };
    let store = open_state_store(config).await?;
    let store = store.with_blobs(crate::store::metered::MeteredStore::wrap(
        store.blobs().clone(),
        serving.metrics.clone(),
    ));
    let root = match root {
        Some(root) => root,
        None => read_root_key(config, true)?,
    };
    // A generation that does not unwrap stops startup here, before anything is
    // written; so does a key whose fingerprint the index or the store does not record.
    open_keyring(config, &root, &store, true).await?;
    verify_root_key(config, &root, &store).await?;
    Ok((root, store))
}

/// The listings that read the index alone (`workspace history`, `workspace timeline`):
/// the index must be there; no key is read and the blob store is not opened, so they
/// answer while the store is down.
pub fn listings(config: &Config) -> anyhow::Result<crate::operator::Listings> {
    require_index(config)?;
    Ok(crate::operator::Listings::new(open_database(config)?))
}

/// Operator commands work on an existing installation: never create an empty index
/// (on PostgreSQL: never make the tables in a database no node has opened).
fn require_index(config: &Config) -> anyhow::Result<()> {
    let index = Index::of(config);
    if !index.exists() {
        anyhow::bail!(
            "no database at {} (is STATEGATE_DATA_DIR / data_dir right?)",
            config.db_path().display()
        );
    }
    if !index.holds_index()? {
        anyhow::bail!(
            "the PostgreSQL database holds no index yet (no node has opened it): start `stategate serve` on it, or `stategate restore --into` it (is index.url right?)"
        );
    }
    Ok(())
}

/// Loads the DEK from config/env, else from the key file (creating it on first start);
/// with `key.service = "pkcs11"`, from the wrapped key file, opened by the token (on
/// first start a new key is made and only its wrapped form is written). The keyring
/// is attached from the index's table alone; `serve` and the `key` commands use
/// [`read_root_key`] and [`open_keyring`] instead, which reconcile it with the store's
/// copies first.
pub fn load_root_key(config: &Config, create: bool) -> anyhow::Result<RootKey> {
    let key = read_root_key(config, create)?;
    attach_ring(config, &key, Vec::new())?;
    Ok(key)
}

/// The root key as [`load_root_key`] finds it, without its keyring: [`open_keyring`]
/// attaches it after reconciling the table with the store's copies, so an index
/// restored from a backup made before `key rewrap` (its ring wrapped under the replaced
/// key file) opens with the store's re-wrapped copies instead of stopping.
pub fn read_root_key(config: &Config, create: bool) -> anyhow::Result<RootKey> {
    if config.key.service == KeyServiceKind::Pkcs11 {
        // The token gives the DEK; the ring's generations are then wrapped under it as
        // with a key file (`key_service`).
        return load_wrapped_root_key(config, create);
    }
    if let Some(text) = &config.dek {
        return RootKey::from_base64(text.expose()).context("STATEGATE_DEK / dek is invalid");
    }
    let path = config.dek_path();
    if !create && !path.exists() {
        anyhow::bail!(
            "no root key at {}: give stategate this installation's key (restore the key file from your backup, or set dek_file / STATEGATE_DEK_FILE or STATEGATE_DEK; docs/keys.md). Only a new installation gets a new key, on its first `stategate serve`",
            path.display()
        );
    }
    if let Some(dir) = path.parent() {
        create_private_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let (key, created) = RootKey::load_or_create(&path).map_err(|e| {
        anyhow::anyhow!(
            "cannot use the key file {}: {e}; restore it from your backup of the key, or point \
             dek_file / STATEGATE_DEK_FILE (or STATEGATE_DEK) at this installation's key",
            path.display()
        )
    })?;
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

/// Whether this installation has a root key to read (`dek`, or the key file — the
/// wrapped one with `key.service = "pkcs11"`); a path that cannot even be looked at
/// counts as there, so reading it names the problem.
fn has_root_key(config: &Config) -> bool {
    let there = |path: std::path::PathBuf| path.try_exists().unwrap_or(true);
    match config.key.service {
        _ if config.dek.is_some() => true,
        // A plain key file alone is refused with its own message (`key wrap` first).
        KeyServiceKind::Pkcs11 => there(config.wrapped_key_path()) || there(config.dek_path()),
        KeyServiceKind::File => there(config.dek_path()),
    }
}

/// Largest PIN file read (a PIN is a few dozen characters at most).
const MAX_PIN_FILE_BYTES: u64 = 4096;

/// The configured PKCS#11 key service, opened: module loaded, token found, logged in,
/// key found. Every failure names what failed (never the PIN); nothing is written.
fn open_key_service(config: &Config) -> anyhow::Result<Pkcs11KeyService> {
    let p = config
        .key
        .pkcs11
        .as_ref()
        .context("key.service is \"pkcs11\" but [key.pkcs11] is not set")?;
    // Every copy of the PIN made here is zeroed when dropped: the file's bytes in a
    // `Zeroizing` buffer, the PIN itself in cryptoki's `AuthPin` (a `SecretString`),
    // built from a borrowed `&str` so its one allocation is exact (a `String` with
    // spare capacity would be reallocated by `into_boxed_str`, leaving a copy behind).
    let pin: AuthPin = match (&p.pin, &p.pin_file) {
        (Some(pin), _) => AuthPin::from(pin.expose()),
        (None, Some(path)) => {
            let text = read_secret_file(path, MAX_PIN_FILE_BYTES)
                .with_context(|| format!("cannot read key.pkcs11.pin_file {}", path.display()))?;
            AuthPin::from(text.trim_end_matches(['\r', '\n']))
        }
        (None, None) => anyhow::bail!(
            "the PKCS#11 user PIN is not set: key.pkcs11.pin_file or STATEGATE_KEY_PKCS11_PIN"
        ),
    };
    let params = Pkcs11Params {
        module: p.module.clone(),
        token_label: p.token_label.clone(),
        key_label: p.key_label.clone(),
        pin,
    };
    Ok(Pkcs11KeyService::open(&params)?)
}

/// Proves the key service can give the root key, before `serve` touches the data dir:
/// the token opens and, when there is a wrapped key, unwraps it. Writes nothing.
/// Returns that key, so `serve` hands the one unwrap to everything that seals (the
/// app, the backup service) instead of asking the token again for each; `None` with
/// the plain key file (read later as before) or before the first start made a key.
pub fn check_key_service(config: &Config) -> anyhow::Result<Option<RootKey>> {
    if config.key.service != KeyServiceKind::Pkcs11 {
        return Ok(None);
    }
    if config.wrapped_key_path().exists() {
        let key = load_wrapped_root_key(config, false)?;
        attach_ring(config, &key, Vec::new())?;
        return Ok(Some(key));
    }
    open_key_service(config)?;
    Ok(None)
}

fn load_wrapped_root_key(config: &Config, create: bool) -> anyhow::Result<RootKey> {
    let service = open_key_service(config)?;
    let path = config.wrapped_key_path();
    let plain = config.dek_path();
    if path.exists() {
        let key = wrapped::unwrap_root(&service, &path)?;
        if plain.exists() {
            // A plain copy beside the wrapped one defeats the token. Refuse outright
            // only when the two differ: then one of them is not this installation's.
            let (copy, _) = RootKey::load_or_create(&plain)?;
            if copy.to_base64() != key.to_base64() {
                anyhow::bail!(
                    "the plain key file {} is not the key wrapped in {}; remove the one that does not belong to this installation",
                    plain.display(),
                    path.display()
                );
            }
            tracing::warn!(
                plain = %plain.display(),
                "the plain key file is still there beside the wrapped key: remove it (`stategate key wrap --remove` does it safely)"
            );
        }
        tracing::info!(service = %service.describe(), "root key unwrapped");
        return Ok(key);
    }
    if plain.exists() {
        anyhow::bail!(
            "key.service is \"pkcs11\" but there is no wrapped key at {}; the plain key file {} is there: run `stategate key wrap` first",
            path.display(),
            plain.display()
        );
    }
    if !create {
        anyhow::bail!(
            "no wrapped key at {} (run `stategate serve` once to create one, or `stategate key wrap` to wrap an existing key file)",
            path.display()
        );
    }
    let key = RootKey::generate()?;
    let sealed = wrapped::wrap_root(&service, &key)?;
    if let Some(dir) = path.parent() {
        create_private_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    wrapped::write_root_file(&path, &service.describe(), &sealed)
        .with_context(|| format!("cannot write the wrapped key file {}", path.display()))?;
    tracing::warn!(
        path = %path.display(),
        service = %service.describe(),
        "created a NEW data-encryption key, stored only wrapped by the token. BACK UP the wrapped file AND the token's key: without both every stored state is unreadable"
    );
    Ok(key)
}

/// What `stategate key wrap` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Wrapped {
    /// A new wrapped key file was written and read back to the same key.
    Written,
    /// The wrapped key file already held the same key.
    AlreadyThere,
}

/// Wraps the plain key file (`dek_file`) with the configured token into the wrapped
/// key file: written atomically and fsynced, then read back and unwrapped to prove it
/// opens to the same key before anything else happens. The plain file is left alone
/// (removing it is the caller's second step). Refuses when the wrapped file already
/// holds a different key.
pub fn wrap_key_file(config: &Config) -> anyhow::Result<Wrapped> {
    if config.key.service != KeyServiceKind::Pkcs11 {
        anyhow::bail!(
            "key.service is \"file\": set key.service = \"pkcs11\" and [key.pkcs11] (module, token_label, key_label, pin_file) first"
        );
    }
    let plain = config.dek_path();
    if !plain.exists() {
        anyhow::bail!("no plain key file at {} to wrap", plain.display());
    }
    let (key, _) = RootKey::load_or_create(&plain)?;
    let service = open_key_service(config)?;
    let path = config.wrapped_key_path();
    if path.exists() {
        let there = wrapped::unwrap_root(&service, &path)?;
        if there.to_base64() != key.to_base64() {
            anyhow::bail!(
                "{} already holds a different key than {}; move one of them away first",
                path.display(),
                plain.display()
            );
        }
        return Ok(Wrapped::AlreadyThere);
    }
    let sealed = wrapped::wrap_root(&service, &key)?;
    wrapped::write_root_file(&path, &service.describe(), &sealed)
        .with_context(|| format!("cannot write the wrapped key file {}", path.display()))?;
    let back = wrapped::unwrap_root(&service, &path)?;
    if back.to_base64() != key.to_base64() {
        anyhow::bail!(
            "the wrapped key file {} does not open to the key in {}; it was left in place for inspection, the plain file is untouched",
            path.display(),
            plain.display()
        );
    }
    Ok(Wrapped::Written)
}

/// The key service of this installation: what wraps the keyring's generations. Today
/// the key file itself (or `STATEGATE_DEK`), read again on every call, so a process
/// keeps opening the ring after `key rewrap` replaced the file under it; while a rewrap
/// is under way (`<key file>.next` exists) what either file wraps opens.
pub fn key_service(config: &Config, root: &RootKey) -> Arc<dyn KeyService> {
    key_source(config, root)()
}

/// [`key_service`] as the keyring's operations ask for it (`keys::Keyring`): each call
/// finds the key service as it is then.
pub fn key_source(config: &Config, root: &RootKey) -> KeySource {
    let root = root.clone();
    if config.dek.is_some() {
        return Arc::new(move || Arc::new(root.file_service(None)));
    }
    let path = config.dek_path();
    Arc::new(move || {
        Arc::new(file_service(&path).unwrap_or_else(|| root.file_service(Some(path.clone()))))
    })
}

/// The keyring's operations over this installation (`stategate key …`, the admin
/// API's `keys` routes): its index and blob store, its drift artifacts, its key service.
pub fn keyring(
    config: &Config,
    root: &RootKey,
    store: &StateStore,
    drift: DriftService,
) -> Keyring {
    Keyring::new(store.clone(), root.clone(), drift, key_source(config, root))
}

/// The key file at `path` as the key service (with `<path>.next` during a rewrap);
/// `None` when it cannot be read now.
fn file_service(path: &Path) -> Option<crate::crypto::service::FileKeyService> {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|t| RootKey::from_base64(&t).ok())
            .map(|k| k.file_service(Some(path.to_path_buf())))
    };
    let service = read(path)?;
    Some(match read(&crate::config::next_key_path(path)) {
        Some(next) => service.with_next(next),
        None => service,
    })
}

/// `stategate key rewrap`: a new random key file replaces the current one, and the
/// ring is re-wrapped under it, the replaced DEK kept only as the ring's generation 0
/// (so what it sealed and what it derived keep working until `key reseal`,
/// `key retire 0` and `key rotate-credentials`). Safe under kill -9 at any point:
///
/// 1. the new key is written to `<key file>.next` (0600, fsynced; kept if already
///    there, so a rerun carries on with the same key);
/// 2. the table and the store's copies are re-wrapped under it in one transaction
///    (every process opens what either file wraps while `.next` exists);
/// 3. every generation is checked to open under the new file alone;
/// 4. `.next` is renamed over the key file (atomic) and the directory fsynced.
pub async fn rewrap(
    config: &Config,
    root: &RootKey,
    store: &StateStore,
    actor: &str,
) -> anyhow::Result<crate::store::keyring::Rewrapped> {
    if config.key.service == KeyServiceKind::Pkcs11 {
        anyhow::bail!(
            "key.service is \"pkcs11\": `key rewrap` replaces a plain key file, and the token's wrapped key is not one; nothing was changed (docs/keys.md, \"the key leaked\")"
        );
    }
    if config.dek.is_some() {
        anyhow::bail!(
            "the DEK comes from STATEGATE_DEK / dek: `key rewrap` replaces a key file. Put the DEK in a key file (dek_file) first; nothing was changed"
        );
    }
    let path = config.dek_path();
    let next_path = config.next_dek_path();
    let next = match std::fs::read_to_string(&next_path) {
        Ok(text) => RootKey::from_base64(&text).with_context(|| {
            format!("{} (an interrupted rewrap) is invalid", next_path.display())
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = RootKey::generate()?;
            crate::crypto::write_secret_file(
                &next_path,
                format!("{}\n", key.to_base64()).as_bytes(),
            )
            .with_context(|| format!("cannot write {}", next_path.display()))?;
            key
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", next_path.display())),
    };
    let old = key_service(config, root);
    let new: Arc<dyn KeyService> = Arc::new(next.file_service(Some(path.clone())));
    let zero = [
        crate::crypto::Purpose::Data,
        crate::crypto::Purpose::Credentials,
    ]
    .into_iter()
    .filter_map(|p| root.generation_zero(p))
    .collect();
    let done = crate::store::keyring::rewrap(store, &old, &new, zero, actor).await?;
    crate::store::keyring::opens_under(store, &new)
        .await
        .context("a generation does not open under the new key file (a rotation raced the rewrap?); run `stategate key rewrap` again")?;
    // The records name the new key before it replaces the old one (until then a
    // process accepts either, see `accepted_fingerprints`).
    let fp = next.fingerprint();
    store
        .index_handle()
        .write({
            let fp = fp.clone();
            move |c| {
                crate::store::keyring::set_fingerprint(c, &fp).map_err(crate::store::DbError::from)
            }
        })
        .await?;
    crate::store::keyring::store_fingerprint(store.blobs().as_ref(), &fp)
        .await
        .context("cannot record the new key's fingerprint in the store")?;
    std::fs::rename(&next_path, &path).with_context(|| {
        format!(
            "cannot move {} over {}",
            next_path.display(),
            path.display()
        )
    })?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("cannot fsync {}", dir.display()))?;
    }
    Ok(done)
}

/// Gives `root` the keyring: the `key_generations` rows of the data dir's database
/// (re-read on every [`RootKey::reload`] and on a miss), plus `copies`, the
/// generations kept in the blob store (`store::keyring::copies`), for a data dir whose
/// index is older than the ring or lost. A generation that does not unwrap stops here.
fn attach_ring(config: &Config, root: &RootKey, copies: Vec<KeyRow>) -> anyhow::Result<()> {
    let fixed = key_service(config, root);
    // Asked again on every reload: one kept connection to a shared index.
    let index = Index::of(config).rereader();
    let describe = fixed.describe();
    // The key file is read again on every load (see `key_service`); the root itself is
    // not captured (it owns this loader), only what it wraps with when the file is gone.
    let key_file = config.dek.is_none().then(|| config.dek_path());
    root.set_loader(Box::new(move || {
        let service: Arc<dyn KeyService> = match key_file.as_deref().and_then(file_service) {
            Some(s) => Arc::new(s),
            None => fixed.clone(),
        };
        index.read(|conn| crate::store::keyring::load(conn, &copies, service.as_ref()))
    }))
    .with_context(|| format!("cannot open the keyring with {describe}"))?;
    check_recorded_key(config, root)?;
    root.watch(RING_RELOAD);
    Ok(())
}

/// Where this process's root key came from, for messages.
fn key_origin(config: &Config) -> String {
    match config.key.service {
        _ if config.dek.is_some() => "STATEGATE_DEK / dek".into(),
        KeyServiceKind::Pkcs11 => format!(
            "the wrapped key file {} opened by the PKCS#11 token",
            config.wrapped_key_path().display()
        ),
        KeyServiceKind::File => format!("the key file {}", config.dek_path().display()),
    }
}

/// The fingerprints a record may hold for `root` to be this installation's key: its
/// own; the key a `key rewrap` under way is moving to (`<key file>.next`); and the
/// first DEK, which the ring keeps as generation 0 after a rewrap (an index from before
/// it records that one).
fn accepted_fingerprints(config: &Config, root: &RootKey) -> Vec<String> {
    let mut out = vec![root.fingerprint()];
    out.extend(root.first_fingerprint());
    if config.dek.is_none() && config.key.service == KeyServiceKind::File {
        let next = std::fs::read_to_string(config.next_dek_path())
            .ok()
            .and_then(|t| RootKey::from_base64(&t).ok());
        out.extend(next.map(|k| k.fingerprint()));
    }
    out
}

/// The refusal of a key whose fingerprint is not the one `place` recorded.
fn foreign_key(config: &Config, root: &RootKey, place: &str, recorded: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "this installation was made with another root key: {place} records key fingerprint \
         {recorded}, and {} holds a key with fingerprint {}; nothing was changed. Give \
         stategate the installation's key: dek_file / STATEGATE_DEK_FILE, STATEGATE_DEK, or \
         the [key.pkcs11] token (docs/keys.md)",
        key_origin(config),
        root.fingerprint()
    )
}

/// Runs `f` on a connection of its own to the index, if there is one
/// (`store::index::Index::read`).
fn read_index<T: Send>(
    config: &Config,
    f: impl FnOnce(&crate::store::sql::Connection) -> Result<T, crate::store::sql::Error> + Send,
) -> anyhow::Result<Option<T>> {
    Ok(Index::of(config).read(f)?)
}

/// Refuses a root key other than the one the index recorded (every command and
/// `serve`, through [`attach_ring`]); an index with no record passes.
fn check_recorded_key(config: &Config, root: &RootKey) -> anyhow::Result<()> {
    let recorded = read_index(config, crate::store::keyring::recorded_fingerprint)?.flatten();
    match recorded {
        Some(fp) if !accepted_fingerprints(config, root).contains(&fp) => {
            Err(foreign_key(config, root, "its index", &fp))
        }
        _ => Ok(()),
    }
}

/// The store's record of the key's fingerprint, refused when it names another key.
async fn check_store_key(
    config: &Config,
    root: &RootKey,
    blobs: &dyn BlobStore,
) -> anyhow::Result<Option<String>> {
    let stored = crate::store::keyring::stored_fingerprint(blobs)
        .await
        .context("cannot read the key's fingerprint in the store")?;
    match stored {
        Some(fp) if !accepted_fingerprints(config, root).contains(&fp) => Err(foreign_key(
            config,
            root,
            &format!("the store ({})", blobs.describe()),
            &fp,
        )),
        other => Ok(other),
    }
}

/// Before `serve` makes a new root key, and before it creates or opens anything:
/// refused unless the installation holds no data at all (no versions, keyring rows or
/// fingerprint in the index; no versions and no fingerprint in the store). A
/// lost key file beside existing data is a missing key, never a new installation.
async fn require_no_data(config: &Config) -> anyhow::Result<()> {
    use crate::store::keyring::{index_has_data, recorded_fingerprint, stored_fingerprint};
    let in_index = read_index(config, index_has_data)?.unwrap_or(false);
    let recorded = read_index(config, recorded_fingerprint)?.flatten();
    let (in_store, stored, described) = if config.store.kind == StoreKind::Local
        && !config.local_store_path().exists()
    {
        (false, None, String::new())
    } else {
        let blobs = open_blob_store(config)?;
        // The check `open_state_store` makes, with its message, before anything else.
        blobs.check().await.with_context(|| {
                format!(
                    "the blob store ({}) is not reachable and writable; check endpoint, bucket and credentials",
                    blobs.describe()
                )
            })?;
        let listed = blobs
            .list(crate::store::STATES_PREFIX)
            .await
            .context("cannot list the blob store")?;
        let stored = stored_fingerprint(blobs.as_ref())
            .await
            .context("cannot read the key's fingerprint in the store")?;
        (!listed.is_empty(), stored, blobs.describe())
    };
    if !in_index && !in_store && stored.is_none() && recorded.is_none() {
        return Ok(());
    }
    let place = if in_index || recorded.is_some() {
        "its index holds data".to_string()
    } else {
        format!("the store ({described}) holds its data")
    };
    anyhow::bail!(
        "there is no root key ({}), but this installation is not new: {place}{}. A new key \
         would open none of it, so none was made. Give stategate the installation's key: \
         restore the key file from your backup, or set dek_file / STATEGATE_DEK_FILE or \
         STATEGATE_DEK (docs/keys.md)",
        key_origin(config),
        recorded
            .or(stored)
            .map_or(String::new(), |fp| format!(" (key fingerprint {fp})"))
    )
}

/// What proving a key against the data found.
enum Proof {
    /// It opened the newest workspace version.
    Opened,
    /// There is nothing to open: no versions in the index or the store.
    Nothing,
    /// Not proven either way (why).
    Unproven(String),
}

/// Opens the newest workspace version with `root` (its header and first chunk).
async fn prove_key(root: &RootKey, store: &StateStore) -> anyhow::Result<Proof> {
    let newest = store
        .index_handle()
        .read(|c| crate::store::keyring::newest_sealed(c, crate::tofu::SCOPE_PREFIX))
        .await?;
    let Some(row) = newest else {
        let in_store = !store
            .blobs()
            .list(crate::store::STATES_PREFIX)
            .await?
            .is_empty();
        return Ok(if in_store {
            Proof::Unproven(
                "the index has no version but the store has some (rebuild the index: `stategate index rebuild`)".into(),
            )
        } else {
            Proof::Nothing
        });
    };
    let (scope, version) = (row.scope.clone(), row.version);
    Ok(match store.stream_row(row, &root.blob_key(&scope)).await {
        Ok(_) => Proof::Opened,
        Err(e) => Proof::Unproven(format!("{scope} v{version} does not open with it: {e}")),
    })
}

/// `serve`'s proof that `root` is this installation's key: refused when the index or
/// the store recorded another key's fingerprint; where neither has a record yet (a
/// new installation, or one of an earlier release), the fingerprint is recorded in
/// both once the key opens the newest version, or when there is no version at all. An
/// earlier release's data that the key does not open is never refused (it may be a
/// damaged blob): the log says so, and nothing is recorded.
async fn verify_root_key(
    config: &Config,
    root: &RootKey,
    store: &StateStore,
) -> anyhow::Result<()> {
    use crate::store::keyring::{record_fingerprint, recorded_fingerprint, store_fingerprint};
    let ours = root.fingerprint();
    let index = store.index_handle();
    let recorded = index.read(recorded_fingerprint).await?;
    if let Some(fp) = &recorded {
        if !accepted_fingerprints(config, root).contains(fp) {
            return Err(foreign_key(config, root, "its index", fp));
        }
    }
    let stored = check_store_key(config, root, store.blobs().as_ref()).await?;
    if recorded.is_none() && stored.is_none() {
        match prove_key(root, store).await? {
            Proof::Opened | Proof::Nothing => {}
            Proof::Unproven(why) => {
                tracing::warn!(
                    fingerprint = %ours,
                    "the root key is not recorded for this installation yet and could not be proven against its data ({why}); \
                     it is recorded once it opens a version. If this is not the installation's key, stop now and give it the right one"
                );
                return Ok(());
            }
        }
    }
    if recorded.is_none() {
        let fp = stored.clone().unwrap_or_else(|| ours.clone());
        let held = index
            .write(move |c| record_fingerprint(c, &fp).map_err(crate::store::DbError::from))
            .await?;
        if !accepted_fingerprints(config, root).contains(&held) {
            return Err(foreign_key(config, root, "its index", &held));
        }
        tracing::info!(fingerprint = %held, "recorded the root key's fingerprint in the index");
    }
    if stored.is_none() {
        let fp = recorded.unwrap_or(ours);
        store_fingerprint(store.blobs().as_ref(), &fp)
            .await
            .context("cannot record the key's fingerprint in the store")?;
    }
    Ok(())
}

/// After a new index was written at `into` with `root` proven against the data (a
/// rebuild that opened versions with it): records its fingerprint there, and in the
/// store when the store has none.
async fn record_key_in(into: &Path, root: &RootKey, blobs: &dyn BlobStore) -> anyhow::Result<()> {
    let fp = root.fingerprint();
    let conn = crate::store::index::open_new_file(into)
        .with_context(|| format!("cannot open the new index {}", into.display()))?;
    crate::store::keyring::set_fingerprint(&conn, &fp)
        .with_context(|| format!("cannot record the key's fingerprint in {}", into.display()))?;
    drop(conn);
    if crate::store::keyring::stored_fingerprint(blobs)
        .await?
        .is_none()
    {
        crate::store::keyring::store_fingerprint(blobs, &fp)
            .await
            .context("cannot record the key's fingerprint in the store")?;
    }
    Ok(())
}

/// How often a process re-reads the keyring (a rotation reaches every writer within it).
pub const RING_RELOAD: std::time::Duration = std::time::Duration::from_secs(1);

/// The keyring with its blob-store copies: reconciles the table and the copies when
/// `repair` (the server, the `key` commands: see `store::keyring`), then attaches both.
pub async fn open_keyring(
    config: &Config,
    root: &RootKey,
    store: &StateStore,
    repair: bool,
) -> anyhow::Result<()> {
    let service = key_service(config, root);
    if repair {
        let (_, done) = crate::store::keyring::reconcile(store, &service)
            .await
            .with_context(|| format!("cannot open the keyring with {}", service.describe()))?;
        if !done.adopted.is_empty() || !done.copied.is_empty() {
            tracing::info!(adopted = ?done.adopted, copied = ?done.copied, "keyring reconciled with its copies in the store");
        }
    }
    let copies = crate::store::keyring::copies(store.blobs().as_ref())
        .await
        .context("cannot list the keyring's copies in the store")?;
    attach_ring(config, root, copies)
}

/// The key cluster states are sealed under (`ADJ_STATE_ENC_KEY`); `None`, also for a
/// blank value, means the cluster API is not configured.
fn load_cluster_key(config: &Config) -> anyhow::Result<Option<RootKey>> {
    config
        .cluster
        .state_enc_key
        .as_ref()
        .filter(|k| !k.is_blank())
        .map(|k| RootKey::from_base64(k.expose()))
        .transpose()
        .context("ADJ_STATE_ENC_KEY (cluster.state_enc_key) is invalid")
}

fn open_blob_store(config: &Config) -> anyhow::Result<Arc<dyn BlobStore>> {
    Ok(match config.store.kind {
        StoreKind::Local => Arc::new(LocalStore::open(&config.local_store_path())?),
        StoreKind::S3 => Arc::new(S3Store::new(&config.store.s3)),
    })
}

/// The storage engine as `serve` opens it: data dir, the index (all schemas), the blob
/// store, proven reachable and writable. Also used by the operator commands.
pub async fn open_state_store(config: &Config) -> anyhow::Result<StateStore> {
    create_private_dir(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    let db = open_database(config)?;
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

/// This installation's index with every schema (`crate::schema::INDEX`). The data dir
/// must exist.
fn open_database(config: &Config) -> anyhow::Result<Db> {
    Ok(Index::of(config).open(&crate::schema::INDEX)?)
}

/// A consistent snapshot of this installation's index, as a SQLite database file's
/// bytes, for a backup (`store::index::Index::snapshot`; scratch files go into the data
/// dir). Blocking; each call takes a new one.
pub fn index_snapshot(
    config: &Config,
) -> impl Fn() -> Result<Vec<u8>, crate::store::backup::BackupError> + Send + Sync + 'static {
    Index::of(config).snapshot(&crate::schema::INDEX, &config.data_dir)
}

/// Copies every table of this installation's index into `to`, verified table by table
/// (`store::index::Index::migrate`); refused while a server uses the source (for the
/// data dir's SQLite file, the data dir's lock proves none does).
pub fn migrate_index(config: &Config, to: MigrateTo) -> anyhow::Result<Vec<TableCopy>> {
    let hold = || hold_without_server(config).map_err(|e| format!("{e:#}"));
    Ok(Index::of(config).migrate(to, &crate::schema::INDEX, hold)?)
}

/// Where a rebuild or a restore writes the new index: `--into`, parsed once for this
/// installation's kind (`store::index::Index::new_index`: a new SQLite file, or an
/// empty PostgreSQL database written through a scratch file in the data dir).
fn new_index(config: &Config, into: &Path) -> anyhow::Result<NewIndex> {
    Ok(Index::of(config).new_index(into, &config.data_dir, &crate::schema::INDEX)?)
}

/// A held `flock` on `<data_dir>/serve.lock`; released when dropped (or the process ends).
#[derive(Debug)]
pub struct DataDirLock {
    _file: std::fs::File,
}

/// Who holds the data dir, written into the lock file under the lock so that a refused
/// process can say who is in its way.
#[derive(Clone, Copy)]
enum Holder {
    /// `stategate serve`, for its whole life: one server per data dir (a second one
    /// would rewrite the recorded address and share the SQLite index behind its back).
    Server,
    /// A command writing a new index into the live path (restore, rebuild, migrate).
    Writer,
}

fn lock_path(config: &Config) -> std::path::PathBuf {
    config.data_dir.join("serve.lock")
}

/// `Ok(None)`: someone holds the lock right now (never waits).
fn try_lock(config: &Config, holder: Holder) -> anyhow::Result<Option<DataDirLock>> {
    use std::io::Write;
    create_private_dir(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    let path = lock_path(config);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: `flock` on a file descriptor this function owns for as long as the call.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(err).with_context(|| format!("cannot lock {}", path.display()));
    }
    let role = match holder {
        Holder::Server => "serve",
        Holder::Writer => "index-writer",
    };
    // Best effort: the lock itself is what excludes; the text only names the holder.
    let _ = file
        .set_len(0)
        .and_then(|()| writeln!(file, "{role} {}", std::process::id()));
    Ok(Some(DataDirLock { _file: file }))
}

/// Who holds the lock, from what it wrote there: `(role, pid)`.
fn lock_holder(config: &Config) -> Option<(String, String)> {
    let text = std::fs::read_to_string(lock_path(config)).ok()?;
    let (role, pid) = text.trim().split_once(' ')?;
    Some((role.to_string(), pid.to_string()))
}

/// The lock `serve` holds for its whole life: refused while another server runs on the
/// same data dir, or a restore writes the index there.
pub fn hold_for_serving(config: &Config) -> anyhow::Result<DataDirLock> {
    if let Some(lock) = try_lock(config, Holder::Server)? {
        return Ok(lock);
    }
    let dir = config.data_dir.display();
    match lock_holder(config) {
        Some((role, pid)) if role == "index-writer" => anyhow::bail!(
            "a restore or rebuild (pid {pid}) is writing a new index into {dir}; start stategate when it has finished"
        ),
        Some((_, pid)) => anyhow::bail!(
            "another stategate server (pid {pid}) is running on the data dir {dir}; stop it, or give this one its own data_dir / STATEGATE_DATA_DIR"
        ),
        None => anyhow::bail!(
            "another stategate process holds the data dir {dir} ({}); stop it first",
            lock_path(config).display()
        ),
    }
}

/// The data dir, proven free of servers: `None` while any `stategate serve` holds it.
fn hold_without_server(config: &Config) -> anyhow::Result<Option<DataDirLock>> {
    try_lock(config, Holder::Writer)
}

/// At a clean stop, once no request is left: the index's last words on disk
/// (`store::index::Index::checkpoint_at_stop`); a failure is logged.
pub fn checkpoint_at_stop(config: &Config) {
    Index::of(config).checkpoint_at_stop()
}

/// What a command resolved as its installation, for a person to check before it acts
/// (`stategate --show-installation …`): the data dir, the index, the blob store, the
/// address clients are told, and whether a server runs on the data dir. Opens and
/// creates nothing; shows no secret (a PostgreSQL URL by host and database only).
pub fn describe(config: &Config) -> Vec<(&'static str, String)> {
    let index = Index::of(config).describe();
    let store = match config.store.kind {
        StoreKind::Local => format!("local directory {}", config.local_store_path().display()),
        StoreKind::S3 => format!(
            "s3 bucket {:?} at {} (prefix {:?})",
            config.store.s3.bucket, config.store.s3.endpoint, config.store.s3.prefix
        ),
    };
    let server = match running_server(config) {
        Some(pid) => format!("running (pid {pid})"),
        None => "not running on this data dir".into(),
    };
    vec![
        ("data dir", config.data_dir.display().to_string()),
        ("index", index),
        ("store", store),
        ("address", crate::address::for_clients(config)),
        ("key", key_origin(config)),
        ("server", server),
    ]
}

/// The pid of the `stategate serve` holding the data dir right now, if one does (the
/// lock file is only read, never created).
fn running_server(config: &Config) -> Option<String> {
    let file = std::fs::File::open(lock_path(config)).ok()?;
    // SAFETY: `flock` on a file descriptor this function owns for as long as the call.
    let free = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0;
    if free {
        return None;
    }
    match lock_holder(config) {
        Some((role, pid)) if role == "serve" => Some(pid),
        _ => None,
    }
}

/// A file that holds a secret (a PIN, an admin token), read whole into a buffer that is
/// zeroed when dropped, at most `max` bytes of it (a longer file is cut there). Its
/// contents never appear in an error.
pub fn read_secret_file(
    path: &std::path::Path,
    max: u64,
) -> std::io::Result<zeroize::Zeroizing<String>> {
    use std::io::Read;
    let mut text = zeroize::Zeroizing::new(String::with_capacity(max as usize));
    std::fs::File::open(path)?
        .take(max)
        .read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_server_per_data_dir_and_no_writer_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            data_dir: dir.path().join("data"),
            ..Config::default()
        };
        let first = hold_for_serving(&config).unwrap();
        let err = hold_for_serving(&config).unwrap_err().to_string();
        assert!(
            err.contains("another stategate server")
                && err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        assert!(hold_without_server(&config).unwrap().is_none());
        drop(first);
        let writer = hold_without_server(&config)
            .unwrap()
            .expect("no server left");
        let err = hold_for_serving(&config).unwrap_err().to_string();
        assert!(err.contains("is writing a new index"), "{err}");
        assert!(hold_without_server(&config).unwrap().is_none());
        drop(writer);
        hold_for_serving(&config).unwrap();
    }
}
