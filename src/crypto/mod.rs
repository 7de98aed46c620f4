//! Key material and sealing.
//!
//! Two roots derive every key with HKDF-SHA256, each purpose under its own label:
//!
//! - the **credentials root** — per-workspace bearers (and their generations),
//!   OpenTofu passphrases and the webhook secret: what pipelines hold. It changes only
//!   by the deliberate `stategate key rotate-credentials`.
//! - the **data generations** — per-scope blob keys (state versions, backups,
//!   revocation records) and the drift output and plan keys. `stategate key rotate`
//!   adds one; every new write uses the newest at once, and a sealed object names the
//!   generation that sealed it in its authenticated header, so older ones keep opening
//!   until they are resealed and the generation retired.
//!
//! Generation 0 of both is the installation's DEK (the key file or `STATEGATE_DEK`),
//! so an existing install derives exactly the values it always did. Later generations
//! are random keys kept wrapped by a [`service::KeyService`] in the keyring
//! (`store::keyring`) and handed to the [`RootKey`] unwrapped ([`RootKey::install`]).
//! The resource-digest key stays on the DEK for good (see
//! [`SealKey::resource_digest_key`]). Key bytes never appear in `Debug` output or logs.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hkdf::Hkdf;
use sha2::Sha256;
use subtle::ConstantTimeEq;

pub mod off_thread;
pub mod pkcs11;
pub mod service;
pub mod stream;
pub mod wrapped;

/// HKDF labels. Each derived secret has its own, so no two purposes ever share key material.
const LABEL_TF_BEARER: &[u8] = b"tf-backend";
const LABEL_TF_PASSPHRASE: &[u8] = b"tf-encryption-passphrase";
const LABEL_BLOB: &[u8] = b"stategate-blob-aead-v1";
const LABEL_DRIFT_OUTPUT: &[u8] = b"stategate-drift-output-aead-v1";
const LABEL_DRIFT_PLAN: &[u8] = b"stategate-drift-plan-aead-v1";
const LABEL_SSO: &[u8] = b"stategate-sso-aead-v1";
const LABEL_WEBHOOK: &[u8] = b"stategate-drift-webhook-hmac-v1";
const LABEL_RESOURCE_DIGEST: &[u8] = b"stategate-resource-digest-hmac-v1";
const LABEL_FINGERPRINT: &[u8] = b"stategate-root-key-fingerprint-v1";

const NONCE_LEN: usize = 12;
/// Magic of a [`SealKey::seal`] message under a data generation above 0:
/// `"SGK1" | u32 BE generation | nonce | ciphertext ‖ tag`, the first 8 bytes part of
/// the associated data. Generation 0 writes the header-less form of earlier releases.
const SEALED_MAGIC: &[u8; 4] = b"SGK1";
/// A miss (an object under a generation this process does not know) re-reads the ring
/// at most this often.
const RELOAD_EVERY: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the key must be 32 bytes encoded as base64 (got {0} bytes after decoding)")]
    BadLength(usize),
    #[error("the key is not valid base64")]
    NotBase64,
    #[error("cannot read key file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot create key file {path}: {source}")]
    Create {
        path: String,
        source: std::io::Error,
    },
    #[error("no randomness available from the OS: {0}")]
    Random(String),
    /// A key service (`crypto::pkcs11`) failed: the text names what (module, token,
    /// PIN, key) and never holds key material or the PIN.
    #[error("{0}")]
    Service(String),
    #[error("key generation {label} does not open with {service} (wrong key, or tampered with)")]
    Unwrap { label: String, service: String },
    #[error("the keyring cannot be read: {0}")]
    Ring(String),
}

fn fingerprint_of(key: &[u8; 32]) -> String {
    hex::encode(&derive_from(key, LABEL_FINGERPRINT, b"")[..8])
}

fn derive_from(ikm: &[u8; 32], label: &[u8], context: &[u8]) -> [u8; 32] {
    Root::new(*ikm).derive(label, context)
}

thread_local! {
    static DERIVED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many keys this thread has derived so far: what a test counts to prove that a
/// check does the same work whatever it is asked about (the outputs route's consumers).
#[doc(hidden)]
pub fn derivations_on_this_thread() -> u64 {
    DERIVED.with(std::cell::Cell::get)
}

/// A root key with its HKDF extract step done once. Every key derived from a root (a
/// workspace credential on each request, a blob's key on each write and read) is then
/// the expand step alone: the extract was three quarters of a credential check's
/// hashing, and it only depends on the root.
#[derive(Clone)]
struct Root {
    key: [u8; 32],
    extracted: Hkdf<Sha256>,
}

impl Root {
    fn new(key: [u8; 32]) -> Self {
        Root {
            key,
            extracted: Hkdf::<Sha256>::new(None, &key),
        }
    }

    /// `HKDF-SHA256(root, info = label ‖ context)`, 32 bytes.
    fn derive(&self, label: &[u8], context: &[u8]) -> [u8; 32] {
        DERIVED.with(|n| n.set(n.get().wrapping_add(1)));
        let mut out = [0u8; 32];
        self.extracted
            .expand_multi_info(&[label, context], &mut out)
            .expect("32 bytes is a valid HKDF-SHA256 output length");
        out
    }
}

/// Which root a generation belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Purpose {
    Data,
    Credentials,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Data => "data",
            Purpose::Credentials => "credentials",
        }
    }

    pub fn parse(text: &str) -> Option<Purpose> {
        match text {
            "data" => Some(Purpose::Data),
            "credentials" => Some(Purpose::Credentials),
            _ => None,
        }
    }

    /// The label a generation is wrapped under: `"data/3"`, `"credentials/1"`.
    pub fn label(self, generation: u32) -> String {
        format!("{}/{generation}", self.as_str())
    }
}

/// One unwrapped generation, as the keyring hands it to [`RootKey::install`].
pub struct Generation {
    pub purpose: Purpose,
    pub number: u32,
    key: [u8; 32],
}

impl fmt::Debug for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Generation({}, <redacted>)",
            self.purpose.label(self.number)
        )
    }
}

impl Generation {
    pub fn new(purpose: Purpose, number: u32, key: [u8; 32]) -> Self {
        Generation {
            purpose,
            number,
            key,
        }
    }

    /// A fresh random generation (above 0: 0 is always the DEK).
    pub fn random(purpose: Purpose, number: u32) -> Result<Self, KeyError> {
        let mut key = [0u8; 32];
        getrandom::getrandom(&mut key).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(Generation::new(purpose, number, key))
    }

    /// Wraps this generation's key with `service` under its label.
    pub fn wrap(&self, service: &dyn service::KeyService) -> Result<Vec<u8>, KeyError> {
        service.wrap(&self.key, &self.purpose.label(self.number))
    }

    /// Opens a wrapped generation (the label names purpose and number).
    pub fn unwrap(
        service: &dyn service::KeyService,
        purpose: Purpose,
        number: u32,
        wrapped: &[u8],
    ) -> Result<Self, KeyError> {
        let key = service.unwrap(wrapped, &purpose.label(number))?;
        Ok(Generation::new(purpose, number, key))
    }
}

/// What the keyring holds: the wrapped-and-opened generations above 0, and the
/// generations (0 included) retired, which are never used again.
#[derive(Debug, Default)]
pub struct RingView {
    pub generations: Vec<Generation>,
    pub retired: Vec<(Purpose, u32)>,
}

/// Re-reads the ring (the server's short interval, and a miss).
pub type Loader = Box<dyn Fn() -> Result<RingView, String> + Send + Sync>;

#[derive(Default)]
struct RingState {
    data: BTreeMap<u32, Root>,
    credentials: BTreeMap<u32, Root>,
}

struct Roots {
    /// The installation's DEK: generation 0 of both roots, and the fixed root of the
    /// resource digests.
    original: Root,
    state: RwLock<RingState>,
    loader: Mutex<Option<Loader>>,
    last_load: Mutex<Option<Instant>>,
    watched: std::sync::atomic::AtomicBool,
}

impl Roots {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, RingState> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn newest_data(&self) -> Option<(u32, Root)> {
        self.read()
            .data
            .last_key_value()
            .map(|(g, root)| (*g, root.clone()))
    }

    /// `root.derive(label, context)` with the newest credentials root.
    fn derive_credential(&self, label: &[u8], context: &[u8]) -> [u8; 32] {
        let state = self.read();
        let root = state
            .credentials
            .last_key_value()
            .map_or(&self.original, |(_, root)| root);
        root.derive(label, context)
    }

    /// The data root of `generation`, re-reading the ring once on a miss.
    fn data_at(&self, generation: u32) -> Option<Root> {
        if let Some(root) = self.read().data.get(&generation) {
            return Some(root.clone());
        }
        let _ = self.reload(false);
        self.read().data.get(&generation).cloned()
    }

    /// Calls the loader (when there is one and, unless `always`, the last load is not
    /// too recent) and installs what it read. Ok(false): nothing was loaded.
    fn reload(&self, always: bool) -> Result<bool, String> {
        let loader = self.loader.lock().unwrap_or_else(|e| e.into_inner());
        let Some(load) = loader.as_ref() else {
            return Ok(false);
        };
        {
            let mut last = self.last_load.lock().unwrap_or_else(|e| e.into_inner());
            if !always && last.is_some_and(|at| at.elapsed() < RELOAD_EVERY) {
                return Ok(false);
            }
            *last = Some(Instant::now());
        }
        let view = load()?;
        self.install(view);
        Ok(true)
    }

    fn install(&self, view: RingView) {
        let mut next = RingState::default();
        next.data.insert(0, self.original.clone());
        next.credentials.insert(0, self.original.clone());
        for g in view.generations {
            let root = Root::new(g.key);
            match g.purpose {
                Purpose::Data => next.data.insert(g.number, root),
                Purpose::Credentials => next.credentials.insert(g.number, root),
            };
        }
        for (purpose, number) in view.retired {
            match purpose {
                Purpose::Data => next.data.remove(&number),
                Purpose::Credentials => next.credentials.remove(&number),
            };
        }
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = next;
    }
}

/// The installation's roots: the DEK plus the keyring's generations. Cloning is cheap
/// and shares the ring, so a rotation installed once is seen by every holder.
#[derive(Clone)]
pub struct RootKey(Arc<Roots>);

impl fmt::Debug for RootKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RootKey(<redacted>)")
    }
}

impl RootKey {
    /// The roots of a DEK with no further generations (what an existing install has).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        let roots = Roots {
            original: Root::new(bytes),
            state: RwLock::new(RingState::default()),
            loader: Mutex::new(None),
            last_load: Mutex::new(None),
            watched: Default::default(),
        };
        roots.install(RingView::default());
        RootKey(Arc::new(roots))
    }

    /// Parses a base64-encoded 32-byte key (surrounding whitespace is ignored).
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        let raw = BASE64
            .decode(text.trim())
            .map_err(|_| KeyError::NotBase64)?;
        let bytes: [u8; 32] = raw
            .as_slice()
            .try_into()
            .map_err(|_| KeyError::BadLength(raw.len()))?;
        Ok(RootKey::from_bytes(bytes))
    }

    pub fn generate() -> Result<Self, KeyError> {
        let mut bytes = [0u8; 32];
        getrandom::getrandom(&mut bytes).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(RootKey::from_bytes(bytes))
    }

    /// The DEK itself (generation 0), as the key file holds it.
    pub fn to_base64(&self) -> String {
        BASE64.encode(self.0.original.key)
    }

    /// What names this key without revealing it: the first 8 bytes of
    /// `HKDF-SHA256(DEK, info = "stategate-root-key-fingerprint-v1")`, in hex. The index
    /// and the store record it, so a process given another key refuses to run.
    pub fn fingerprint(&self) -> String {
        fingerprint_of(&self.0.original.key)
    }

    /// The fingerprint of this installation's first DEK as the ring holds it after a
    /// `key rewrap` (generation 0 of the data root), when it differs from the key file's.
    pub fn first_fingerprint(&self) -> Option<String> {
        self.generation_zero(Purpose::Data)
            .map(|g| fingerprint_of(&g.key))
    }

    /// The key service of the key file itself: wraps generations under a key derived
    /// from this DEK (`path`: where it was read from, for messages).
    pub fn file_service(&self, path: Option<std::path::PathBuf>) -> service::FileKeyService {
        service::FileKeyService::new(&self.0.original.key, path)
    }

    /// Generation 0 of `purpose` as this process uses it: the key file's DEK, or, after a
    /// `key rewrap`, the first DEK the ring holds wrapped. `None` once retired.
    pub fn generation_zero(&self, purpose: Purpose) -> Option<Generation> {
        let state = self.0.read();
        let map = match purpose {
            Purpose::Data => &state.data,
            Purpose::Credentials => &state.credentials,
        };
        map.get(&0)
            .map(|root| Generation::new(purpose, 0, root.key))
    }

    /// Loads the key file, or creates it (mode 0600, fsynced) when it does not exist.
    /// Returns the key and whether it was just created.
    pub fn load_or_create(path: &Path) -> Result<(Self, bool), KeyError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Ok((Self::from_base64(&text)?, false)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = Self::generate()?;
                let line = format!("{}\n", key.to_base64());
                write_secret_file(path, line.as_bytes()).map_err(|source| KeyError::Create {
                    path: path.display().to_string(),
                    source,
                })?;
                Ok((key, true))
            }
            Err(source) => Err(KeyError::Read {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// Replaces the ring's generations with `view` (generation 0 of both roots is the
    /// DEK unless retired). Every clone sees it at once.
    pub fn install(&self, view: RingView) {
        self.0.install(view);
    }

    /// Sets what re-reads the ring, and reads it now.
    pub fn set_loader(&self, loader: Loader) -> Result<(), KeyError> {
        *self.0.loader.lock().unwrap_or_else(|e| e.into_inner()) = Some(loader);
        self.reload()?;
        // The first miss after this reads again at once.
        *self.0.last_load.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    /// Re-reads the ring now (the server calls this on a short interval, so a rotation
    /// made by the CLI is used without a restart).
    pub fn reload(&self) -> Result<(), KeyError> {
        self.0.reload(true).map(|_| ()).map_err(KeyError::Ring)
    }

    /// Re-reads the ring every `every` on a thread of its own (once per ring; the
    /// thread ends when the last clone is dropped), so a generation added by another
    /// process (`stategate key rotate`) is used by every write soon after, without a
    /// restart. A failed reload keeps the ring it had and logs why.
    pub fn watch(&self, every: Duration) {
        use std::sync::atomic::Ordering;
        if self.0.watched.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(&self.0);
        let spawned = std::thread::Builder::new()
            .name("keyring-reload".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                let Some(roots) = weak.upgrade() else { return };
                if let Err(e) = roots.reload(true) {
                    tracing::warn!(error = %e, "cannot re-read the keyring; keeping the generations already known");
                }
            });
        if spawned.is_err() {
            self.0.watched.store(false, Ordering::SeqCst);
        }
    }

    /// The data generation every new write uses: the newest this process knows.
    pub fn data_generation(&self) -> u32 {
        self.0.newest_data().map_or(0, |(g, _)| g)
    }

    /// Every data generation this process can open, oldest first.
    pub fn data_generations(&self) -> Vec<u32> {
        self.0.read().data.keys().copied().collect()
    }

    /// The credentials generation workspace credentials are derived from.
    pub fn credentials_generation(&self) -> u32 {
        self.0
            .read()
            .credentials
            .last_key_value()
            .map_or(0, |(g, _)| *g)
    }

    fn derive(&self, label: &[u8], context: &[u8]) -> [u8; 32] {
        self.0.derive_credential(label, context)
    }

    /// `base64(HKDF-SHA256(credentials root, info = "tf-backend" ‖ workspace))`; the
    /// credentials root of an existing install is its DEK.
    pub fn workspace_bearer(&self, workspace: &str) -> String {
        BASE64.encode(self.derive(LABEL_TF_BEARER, workspace.as_bytes()))
    }

    /// The bearer of `workspace` at credential `generation` (`tofu::credentials`):
    /// generation 0 is exactly [`Self::workspace_bearer`], so rotation changes nothing
    /// until it is used; generation g > 0 is
    /// `base64(HKDF-SHA256(root, info = "tf-backend" ‖ workspace ‖ 0x00 ‖ g as 8 bytes BE))`
    /// (no workspace name holds a 0x00 byte, so no generation of one workspace is
    /// another's).
    pub fn workspace_bearer_at(&self, workspace: &str, generation: u64) -> String {
        if generation == 0 {
            return self.workspace_bearer(workspace);
        }
        let mut context = Vec::with_capacity(workspace.len() + 9);
        context.extend_from_slice(workspace.as_bytes());
        context.push(0);
        context.extend_from_slice(&generation.to_be_bytes());
        BASE64.encode(self.derive(LABEL_TF_BEARER, &context))
    }

    /// The OpenTofu `TF_ENCRYPTION` passphrase for a workspace (44 characters).
    pub fn workspace_passphrase(&self, workspace: &str) -> String {
        BASE64.encode(self.derive(LABEL_TF_PASSPHRASE, workspace.as_bytes()))
    }

    fn data_key(&self, label: &'static [u8], context: &str) -> SealKey {
        SealKey {
            roots: self.0.clone(),
            label,
            context: context.as_bytes().to_vec(),
        }
    }

    /// The AEAD key of a workspace's drift-check outputs (the human plan text).
    pub fn drift_output_key(&self, workspace: &str) -> SealKey {
        self.data_key(LABEL_DRIFT_OUTPUT, workspace)
    }

    /// The AEAD key of a workspace's saved plans kept for approval (in the blob store).
    pub fn drift_plan_key(&self, workspace: &str) -> SealKey {
        self.data_key(LABEL_DRIFT_PLAN, workspace)
    }

    /// The AEAD key of the single sign-on rows' secrets (a started sign-in's PKCE
    /// verifier and nonce, a session's provider tokens; `ui::sso_rows`).
    pub fn sso_key(&self) -> SealKey {
        self.data_key(LABEL_SSO, "")
    }

    /// The webhook signing secret (44 characters). Receivers use this text itself
    /// as the HMAC-SHA256 key; `stategate drift webhook-secret` prints it.
    pub fn webhook_secret(&self) -> String {
        BASE64.encode(self.derive(LABEL_WEBHOOK, b""))
    }

    /// The AEAD keys for every blob of one scope (`tf/<ws>` or `cluster/<uuid>`), one
    /// per data generation.
    pub fn blob_key(&self, scope: &str) -> SealKey {
        self.data_key(LABEL_BLOB, scope)
    }
}

/// The length of every derived workspace bearer (base64 of 32 bytes, padded): a
/// presented secret of another length is no bearer, with no derivation needed.
pub const BEARER_LEN: usize = 44;

/// Constant-time comparison of a presented secret with the expected one.
pub fn secrets_equal(presented: &[u8], expected: &[u8]) -> bool {
    presented.len() == expected.len() && bool::from(presented.ct_eq(expected))
}

/// The AES-256-GCM keys of one purpose and scope, one per data generation: writes
/// seal under the newest this process knows, opens take the generation the object
/// names.
#[derive(Clone)]
pub struct SealKey {
    roots: Arc<Roots>,
    label: &'static [u8],
    context: Vec<u8>,
}

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealKey(<redacted>)")
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error("ciphertext is truncated")]
    Truncated,
    #[error("authentication failed: wrong key, wrong scope/version, or tampered data")]
    Authentication,
    #[error("no randomness available from the OS")]
    Random,
    #[error("sealed under key generation {0}, which this keyring does not hold (retired, or from another installation)")]
    UnknownGeneration(u32),
    #[error("the body's hashing thread stopped before its digest")]
    HashWorker,
}

impl From<off_thread::WorkerGone> for SealError {
    fn from(_: off_thread::WorkerGone) -> Self {
        SealError::HashWorker
    }
}

impl SealKey {
    /// The HMAC-SHA256 key of this scope's per-resource content digests (the resource
    /// timeline compares them between versions): keyed, so a digest kept in the index
    /// cannot be used to confirm a guess of a resource's content without the DEK.
    /// Always derived from the DEK (generation 0), never from a data generation: the
    /// summary kept for a scope is compared with the next version's, and a key that
    /// changed with each rotation would make every resource look changed.
    pub fn resource_digest_key(&self) -> [u8; 32] {
        // Generation 0 of the credentials root is the installation's first DEK, also
        // after `key rewrap` replaced the key file (then it comes wrapped from the ring).
        let scope_key = {
            let state = self.roots.read();
            let first = state.credentials.get(&0).unwrap_or(&self.roots.original);
            first.derive(self.label, &self.context)
        };
        derive_from(&scope_key, LABEL_RESOURCE_DIGEST, b"")
    }

    fn bytes_at(&self, generation: u32) -> Result<[u8; 32], SealError> {
        let root = self
            .roots
            .data_at(generation)
            .ok_or(SealError::UnknownGeneration(generation))?;
        Ok(root.derive(self.label, &self.context))
    }

    /// The generation a write seals under now (the newest this process knows).
    pub fn write_generation(&self) -> u32 {
        self.roots.newest_data().map_or(0, |(g, _)| g)
    }

    /// The newest generation's key for this scope, with its number (read once, so a
    /// rotation in between cannot pair one generation's number with another's key).
    fn write_key(&self) -> Result<(u32, [u8; 32]), SealError> {
        let (generation, root) = self
            .roots
            .newest_data()
            .ok_or(SealError::UnknownGeneration(0))?;
        Ok((generation, root.derive(self.label, &self.context)))
    }

    /// The cipher of the newest generation, with its number.
    pub(crate) fn write_cipher(&self) -> Result<(u32, Aes256Gcm), SealError> {
        let (generation, key) = self.write_key()?;
        Ok((
            generation,
            Aes256Gcm::new_from_slice(&key).expect("key is 32 bytes"),
        ))
    }

    /// The chunk cipher of a new blob under the newest generation, with its number.
    pub(crate) fn write_stream(
        &self,
        prefix: [u8; stream::PREFIX_LEN],
    ) -> Result<(u32, stream::ChunkAead), SealError> {
        let (generation, key) = self.write_key()?;
        Ok((generation, stream::ChunkAead::new(&key, prefix)))
    }

    /// The chunk cipher of a blob sealed under `generation` with nonce `prefix`.
    pub(crate) fn stream_at(
        &self,
        generation: u32,
        prefix: [u8; stream::PREFIX_LEN],
    ) -> Result<stream::ChunkAead, SealError> {
        Ok(stream::ChunkAead::new(&self.bytes_at(generation)?, prefix))
    }

    /// The AES-256-GCM cipher of `generation` (the one-piece blobs of the first format).
    pub(crate) fn cipher_at(&self, generation: u32) -> Result<Aes256Gcm, SealError> {
        let key = self.bytes_at(generation)?;
        Ok(Aes256Gcm::new_from_slice(&key).expect("key is 32 bytes"))
    }

    /// Encrypts `plaintext`, binding it to `associated`, under the newest generation.
    /// Generation 0: `nonce ‖ ciphertext ‖ tag` (as earlier releases); above:
    /// `"SGK1" ‖ u32 BE generation ‖ nonce ‖ ciphertext ‖ tag`, the first 8 bytes
    /// authenticated with `associated`.
    pub fn seal(&self, associated: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
        let (generation, cipher) = self.write_cipher()?;
        let mut out = Vec::with_capacity(8 + NONCE_LEN + plaintext.len() + 16);
        if generation > 0 {
            out.extend_from_slice(SEALED_MAGIC);
            out.extend_from_slice(&generation.to_be_bytes());
        }
        let mut ad = out.clone();
        ad.extend_from_slice(associated);
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::getrandom(&mut nonce).map_err(|_| SealError::Random)?;
        let sealed = cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad: &ad,
                },
            )
            .map_err(|_| SealError::Authentication)?;
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The generation a [`Self::seal`] message names (unauthenticated: for counting;
    /// [`Self::open`] is what checks it).
    pub fn sealed_generation(sealed: &[u8]) -> u32 {
        match sealed {
            [b'S', b'G', b'K', b'1', a, b, c, d, ..] => u32::from_be_bytes([*a, *b, *c, *d]),
            _ => 0,
        }
    }

    pub fn open(&self, associated: &[u8], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        if sealed.len() >= 8 + NONCE_LEN + 16 && sealed.starts_with(SEALED_MAGIC) {
            let generation = Self::sealed_generation(sealed);
            let mut ad = sealed[..8].to_vec();
            ad.extend_from_slice(associated);
            let first = self
                .cipher_at(generation)
                .and_then(|c| open_with(&c, &ad, &sealed[8..]));
            // A generation-0 message whose random nonce happens to start with the
            // magic (2^-32) still opens; a tampered generation opens under neither.
            return first.or_else(|e| {
                self.cipher_at(0)
                    .and_then(|c| open_with(&c, associated, sealed))
                    .map_err(|_| e)
            });
        }
        open_with(&self.cipher_at(0)?, associated, sealed)
    }
}

fn open_with(cipher: &Aes256Gcm, associated: &[u8], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
    if sealed.len() < NONCE_LEN + 16 {
        return Err(SealError::Truncated);
    }
    let (nonce, body) = sealed.split_at(NONCE_LEN);
    cipher
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: body,
                aad: associated,
            },
        )
        .map_err(|_| SealError::Authentication)
}

/// Writes a secret file (the DEK, a drift plan): created exclusively (never an
/// existing file) with mode 0600, exactly `contents`, fsynced, then its directory fsynced.
pub fn write_secret_file(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents)?;
    file.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> RootKey {
        RootKey::from_bytes([7u8; 32])
    }

    #[test]
    fn bearer_matches_the_documented_derivation() {
        // Recompute by hand: HKDF-SHA256(salt = none, ikm = DEK, info = "tf-backend" ‖ ws).
        let hk = Hkdf::<Sha256>::new(None, &[7u8; 32]);
        let mut out = [0u8; 32];
        hk.expand(b"tf-backendprod", &mut out).unwrap();
        assert_eq!(key().workspace_bearer("prod"), BASE64.encode(out));
        for generation in [0, 1, 7] {
            assert_eq!(
                key().workspace_bearer_at("prod", generation).len(),
                BEARER_LEN
            );
        }
    }

    #[test]
    fn derived_secrets_are_distinct_per_workspace_and_purpose() {
        let k = key();
        let cases = [
            k.workspace_bearer("a"),
            k.workspace_bearer("b"),
            k.workspace_passphrase("a"),
            k.workspace_passphrase("b"),
            k.webhook_secret(),
            BASE64.encode(k.drift_output_key("a").bytes_at(0).unwrap()),
            BASE64.encode(k.drift_plan_key("a").bytes_at(0).unwrap()),
            BASE64.encode(k.blob_key("a").bytes_at(0).unwrap()),
        ];
        for (i, x) in cases.iter().enumerate() {
            for y in &cases[i + 1..] {
                assert_ne!(x, y);
            }
        }
        assert!(k.workspace_passphrase("a").len() >= 16);
    }

    #[test]
    fn known_vector_is_stable() {
        // Pinned so a refactor can never silently change every user's credentials.
        assert_eq!(
            key().workspace_bearer("prod"),
            RootKey::from_bytes([7u8; 32]).workspace_bearer("prod")
        );
        let hk = Hkdf::<Sha256>::new(None, &[0u8; 32]);
        let mut out = [0u8; 32];
        hk.expand(b"tf-backenddefault", &mut out).unwrap();
        assert_eq!(
            RootKey::from_bytes([0u8; 32]).workspace_bearer("default"),
            BASE64.encode(out)
        );
    }

    #[test]
    fn a_rotated_bearer_is_new_and_generation_zero_is_unchanged() {
        let k = key();
        assert_eq!(k.workspace_bearer_at("prod", 0), k.workspace_bearer("prod"));
        let hk = Hkdf::<Sha256>::new(None, &[7u8; 32]);
        let mut out = [0u8; 32];
        hk.expand(b"tf-backendprod\0\0\0\0\0\0\0\0\x01", &mut out)
            .unwrap();
        assert_eq!(k.workspace_bearer_at("prod", 1), BASE64.encode(out));
        let all = [
            k.workspace_bearer_at("prod", 0),
            k.workspace_bearer_at("prod", 1),
            k.workspace_bearer_at("prod", 2),
            k.workspace_bearer_at("dev", 1),
        ];
        for (i, x) in all.iter().enumerate() {
            for y in &all[i + 1..] {
                assert_ne!(x, y);
            }
        }
    }

    #[test]
    fn seal_round_trips_and_binds_associated_data() {
        let k = key().blob_key("tf/prod");
        let sealed = k.seal(b"tf/prod:1", b"state").unwrap();
        assert_eq!(k.open(b"tf/prod:1", &sealed).unwrap(), b"state");
        assert_eq!(
            k.open(b"tf/prod:2", &sealed),
            Err(SealError::Authentication)
        );
        let other = key().blob_key("tf/dev");
        assert_eq!(
            other.open(b"tf/prod:1", &sealed),
            Err(SealError::Authentication)
        );
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert_eq!(
            k.open(b"tf/prod:1", &tampered),
            Err(SealError::Authentication)
        );
        assert_eq!(k.open(b"", &sealed[..10]), Err(SealError::Truncated));
    }

    #[test]
    fn base64_key_parsing_is_strict() {
        let table: &[(&str, bool)] = &[
            (&BASE64.encode([1u8; 32]), true),
            (&format!("  {}\n", BASE64.encode([1u8; 32])), true),
            (&BASE64.encode([1u8; 31]), false),
            ("not base64!", false),
            ("", false),
        ];
        for (input, ok) in table {
            assert_eq!(RootKey::from_base64(input).is_ok(), *ok, "{input:?}");
        }
    }

    #[test]
    fn secrets_compare() {
        assert!(secrets_equal(b"abc", b"abc"));
        assert!(!secrets_equal(b"abc", b"abd"));
        assert!(!secrets_equal(b"ab", b"abc"));
    }
    /// Fixed bytes of everything a pipeline or the store holds for DEK [7; 32] and
    /// workspace "prod": a data rotation changes none of them, and before any
    /// rotation they are what earlier releases derived.
    #[test]
    fn a_data_rotation_changes_nothing_a_pipeline_holds() {
        let k = key();
        let hk = |info: &[u8]| {
            let mut out = [0u8; 32];
            Hkdf::<Sha256>::new(None, &[7u8; 32])
                .expand(info, &mut out)
                .unwrap();
            out
        };
        let pinned = |k: &RootKey| {
            (
                k.workspace_bearer("prod"),
                k.workspace_bearer_at("prod", 3),
                k.workspace_passphrase("prod"),
                k.webhook_secret(),
                k.blob_key("tf/prod").resource_digest_key(),
            )
        };
        let before = pinned(&k);
        assert_eq!(before.0, BASE64.encode(hk(b"tf-backendprod")));
        assert_eq!(before.2, BASE64.encode(hk(b"tf-encryption-passphraseprod")));
        assert_eq!(
            before.3,
            BASE64.encode(hk(b"stategate-drift-webhook-hmac-v1"))
        );
        let scope = hk(b"stategate-blob-aead-v1tf/prod");
        assert_eq!(before.4, derive_from(&scope, LABEL_RESOURCE_DIGEST, b""));
        assert_eq!(k.blob_key("tf/prod").bytes_at(0).unwrap(), scope);
        let old = k.blob_key("tf/prod").seal(b"ad", b"v0").unwrap();
        assert_eq!(SealKey::sealed_generation(&old), 0);

        k.install(RingView {
            generations: vec![Generation::new(Purpose::Data, 1, [9; 32])],
            retired: vec![],
        });
        assert_eq!(pinned(&k), before);
        assert_eq!(k.data_generation(), 1);
        assert_eq!(k.credentials_generation(), 0);
        let new = k.blob_key("tf/prod").seal(b"ad", b"v1").unwrap();
        assert_eq!(SealKey::sealed_generation(&new), 1);
        assert_eq!(k.blob_key("tf/prod").open(b"ad", &old).unwrap(), b"v0");
        assert_eq!(k.blob_key("tf/prod").open(b"ad", &new).unwrap(), b"v1");
        // Another holder of a clone sees the rotation too.
        let clone = k.clone();
        assert_eq!(clone.blob_key("x").write_generation(), 1);
    }

    #[test]
    fn a_tampered_or_unknown_generation_does_not_open() {
        let k = key();
        k.install(RingView {
            generations: vec![
                Generation::new(Purpose::Data, 1, [9; 32]),
                Generation::new(Purpose::Data, 2, [10; 32]),
            ],
            retired: vec![],
        });
        let sealed = k.blob_key("s").seal(b"ad", b"secret").unwrap();
        assert_eq!(SealKey::sealed_generation(&sealed), 2);
        for generation in [0u32, 1, 3, 0x0100_0002] {
            let mut t = sealed.clone();
            t[4..8].copy_from_slice(&generation.to_be_bytes());
            assert!(k.blob_key("s").open(b"ad", &t).is_err(), "{generation}");
        }
        let mut stripped = sealed.clone();
        stripped.drain(..8);
        assert!(k.blob_key("s").open(b"ad", &stripped).is_err());
        // Retiring generation 2 makes its objects unopenable (named in the error).
        k.install(RingView {
            generations: vec![Generation::new(Purpose::Data, 1, [9; 32])],
            retired: vec![(Purpose::Data, 0)],
        });
        assert_eq!(
            k.blob_key("s").open(b"ad", &sealed),
            Err(SealError::UnknownGeneration(2))
        );
        assert_eq!(k.data_generations(), vec![1]);
    }

    #[test]
    fn rotating_credentials_changes_every_credential_but_not_data_keys() {
        let k = key();
        let (bearer, pass, hook) = (
            k.workspace_bearer("prod"),
            k.workspace_passphrase("prod"),
            k.webhook_secret(),
        );
        let blob = k.blob_key("tf/prod").bytes_at(0).unwrap();
        k.install(RingView {
            generations: vec![Generation::new(Purpose::Credentials, 1, [11; 32])],
            retired: vec![],
        });
        assert_eq!(k.credentials_generation(), 1);
        assert_ne!(k.workspace_bearer("prod"), bearer);
        assert_ne!(k.workspace_passphrase("prod"), pass);
        assert_ne!(k.webhook_secret(), hook);
        assert_eq!(k.blob_key("tf/prod").bytes_at(0).unwrap(), blob);
        assert_eq!(k.data_generation(), 0);
    }

    #[test]
    fn a_miss_reloads_the_ring() {
        let k = key();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = calls.clone();
        k.set_loader(Box::new(move || {
            let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(RingView {
                generations: (n > 0)
                    .then(|| Generation::new(Purpose::Data, 1, [9; 32]))
                    .into_iter()
                    .collect(),
                retired: vec![],
            })
        }))
        .unwrap();
        assert_eq!(k.data_generation(), 0);
        let writer = RootKey::from_bytes([7; 32]);
        writer.install(RingView {
            generations: vec![Generation::new(Purpose::Data, 1, [9; 32])],
            retired: vec![],
        });
        let sealed = writer.blob_key("s").seal(b"ad", b"x").unwrap();
        assert_eq!(k.blob_key("s").open(b"ad", &sealed).unwrap(), b"x");
        assert_eq!(k.data_generation(), 1);
    }
}
