//! Key material and sealing.
//!
//! Everything secret is derived from one 32-byte data-encryption key (DEK) with
//! HKDF-SHA256, so nothing but the DEK itself needs to be stored or backed up:
//! per-workspace bearers, OpenTofu passphrases and per-scope blob keys are all
//! recomputed on demand. The DEK never appears in `Debug` output or logs.

use std::fmt;
use std::io::Write;
use std::path::Path;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hkdf::Hkdf;
use sha2::Sha256;
use subtle::ConstantTimeEq;

pub mod pkcs11;
pub mod service;
pub mod wrapped;

/// HKDF labels. Each derived secret has its own, so no two purposes ever share key material.
const LABEL_TF_BEARER: &[u8] = b"tf-backend";
const LABEL_TF_PASSPHRASE: &[u8] = b"tf-encryption-passphrase";
const LABEL_BLOB: &[u8] = b"stategate-blob-aead-v1";
const LABEL_DRIFT_OUTPUT: &[u8] = b"stategate-drift-output-aead-v1";
const LABEL_DRIFT_PLAN: &[u8] = b"stategate-drift-plan-aead-v1";
const LABEL_WEBHOOK: &[u8] = b"stategate-drift-webhook-hmac-v1";
const LABEL_RESOURCE_DIGEST: &[u8] = b"stategate-resource-digest-hmac-v1";

const NONCE_LEN: usize = 12;

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
}

/// A 32-byte root key. Cloning is cheap and deliberate: handlers hold their own copy.
#[derive(Clone)]
pub struct RootKey([u8; 32]);

impl fmt::Debug for RootKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RootKey(<redacted>)")
    }
}

impl RootKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        RootKey(bytes)
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
        Ok(RootKey(bytes))
    }

    pub fn generate() -> Result<Self, KeyError> {
        let mut bytes = [0u8; 32];
        getrandom::getrandom(&mut bytes).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(RootKey(bytes))
    }

    pub fn to_base64(&self) -> String {
        BASE64.encode(self.0)
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

    fn derive(&self, label: &[u8], context: &[u8]) -> [u8; 32] {
        let hk = Hkdf::<Sha256>::new(None, &self.0);
        let mut info = Vec::with_capacity(label.len() + context.len());
        info.extend_from_slice(label);
        info.extend_from_slice(context);
        let mut out = [0u8; 32];
        hk.expand(&info, &mut out)
            .expect("32 bytes is a valid HKDF-SHA256 output length");
        out
    }

    /// `base64(HKDF-SHA256(DEK, info = "tf-backend" ‖ workspace))`.
    pub fn workspace_bearer(&self, workspace: &str) -> String {
        BASE64.encode(self.derive(LABEL_TF_BEARER, workspace.as_bytes()))
    }

    /// The bearer of `workspace` at credential `generation` (`tofu::credentials`):
    /// generation 0 is exactly [`Self::workspace_bearer`], so rotation changes nothing
    /// until it is used; generation g > 0 is
    /// `base64(HKDF-SHA256(DEK, info = "tf-backend" ‖ workspace ‖ 0x00 ‖ g as 8 bytes BE))`
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

    /// The AEAD key of a workspace's drift-check outputs (the human plan text).
    pub fn drift_output_key(&self, workspace: &str) -> SealKey {
        SealKey(self.derive(LABEL_DRIFT_OUTPUT, workspace.as_bytes()))
    }

    /// The AEAD key of a workspace's saved plan files kept for approval.
    pub fn drift_plan_key(&self, workspace: &str) -> SealKey {
        SealKey(self.derive(LABEL_DRIFT_PLAN, workspace.as_bytes()))
    }

    /// The webhook signing secret (44 characters). Receivers use this text itself
    /// as the HMAC-SHA256 key; `stategate drift webhook-secret` prints it.
    pub fn webhook_secret(&self) -> String {
        BASE64.encode(self.derive(LABEL_WEBHOOK, b""))
    }

    /// The AEAD key for every blob of one scope (`tf/<ws>` or `cluster/<uuid>`).
    pub fn blob_key(&self, scope: &str) -> SealKey {
        SealKey(self.derive(LABEL_BLOB, scope.as_bytes()))
    }
}

/// Constant-time comparison of a presented secret with the expected one.
pub fn secrets_equal(presented: &[u8], expected: &[u8]) -> bool {
    presented.len() == expected.len() && bool::from(presented.ct_eq(expected))
}

/// A derived AES-256-GCM key for one scope.
pub struct SealKey([u8; 32]);

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
}

impl SealKey {
    /// The HMAC-SHA256 key of this scope's per-resource content digests (the resource
    /// timeline compares them between versions): keyed, so a digest kept in the index
    /// cannot be used to confirm a guess of a resource's content without the DEK.
    pub fn resource_digest_key(&self) -> [u8; 32] {
        let hk = Hkdf::<Sha256>::new(None, &self.0);
        let mut out = [0u8; 32];
        hk.expand(LABEL_RESOURCE_DIGEST, &mut out)
            .expect("32 bytes is a valid HKDF-SHA256 output length");
        out
    }

    /// The AES-256-GCM cipher for this key (the chunked blob format drives it itself).
    pub(crate) fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new_from_slice(&self.0).expect("key is 32 bytes")
    }

    /// Encrypts `plaintext`, binding it to `associated`; output is `nonce ‖ ciphertext ‖ tag`.
    pub fn seal(&self, associated: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
        let cipher = Aes256Gcm::new_from_slice(&self.0).expect("key is 32 bytes");
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::getrandom(&mut nonce).map_err(|_| SealError::Random)?;
        let sealed = cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad: associated,
                },
            )
            .map_err(|_| SealError::Authentication)?;
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    pub fn open(&self, associated: &[u8], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        if sealed.len() < NONCE_LEN + 16 {
            return Err(SealError::Truncated);
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let cipher = Aes256Gcm::new_from_slice(&self.0).expect("key is 32 bytes");
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
            BASE64.encode(k.drift_output_key("a").0),
            BASE64.encode(k.drift_plan_key("a").0),
            BASE64.encode(k.blob_key("a").0),
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
}
