//! Key-wrapping services: what seals the keyring's generations at rest and opens them
//! at startup. The file service (today's key file) is here; a PKCS#11 token lives in
//! its own module against the same trait.

use std::path::PathBuf;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};

use super::{derive_from, KeyError, NONCE_LEN};

/// What unwraps the root key material at startup: the key file (today), or a key
/// service such as a PKCS#11 token. Implementations never log key bytes.
pub trait KeyService: Send + Sync + std::fmt::Debug {
    /// Seals 32 bytes of key material; `label` (e.g. "data/3", "credentials") is bound as AD.
    fn wrap(&self, key: &[u8; 32], label: &str) -> Result<Vec<u8>, KeyError>;
    /// Opens what `wrap` sealed under the same label; a wrong label or key fails.
    fn unwrap(&self, wrapped: &[u8], label: &str) -> Result<[u8; 32], KeyError>;
    /// For status output and errors: "file /path" / "pkcs11 token 'x' key 'y'". No secrets.
    fn describe(&self) -> String;
}

/// HKDF label of the file service's wrapping key.
const LABEL_WRAP: &[u8] = b"stategate-keyring-wrap-v1";
/// Prefix of the associated data of every wrapped generation.
const WRAP_AD: &[u8] = b"stategate-keyring:";

/// The key file (or `STATEGATE_DEK`) as the key service: generations are wrapped with
/// AES-256-GCM under `HKDF(DEK, "stategate-keyring-wrap-v1")`, the label as AD.
pub struct FileKeyService {
    wrap_key: [u8; 32],
    /// While `key rewrap` replaces the key file (`<key file>.next` exists), what the
    /// other key file wraps opens too: a kill between writing the new file, rewrapping
    /// the ring and renaming the file over the old one leaves a ring every process opens.
    also_unwraps: Option<[u8; 32]>,
    /// Where the DEK came from, for messages ("file /path" or "STATEGATE_DEK").
    source: String,
}

impl std::fmt::Debug for FileKeyService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileKeyService({}, <redacted>)", self.source)
    }
}

impl FileKeyService {
    /// The service of `dek`, read from `path` (`None`: from the configuration / env).
    pub fn new(dek: &[u8; 32], path: Option<PathBuf>) -> Self {
        FileKeyService {
            wrap_key: derive_from(dek, LABEL_WRAP, b""),
            also_unwraps: None,
            source: match path {
                Some(p) => format!("file {}", p.display()),
                None => "STATEGATE_DEK (dek)".to_string(),
            },
        }
    }

    /// During a rewrap: wraps under `next` (the key file being written), and opens what
    /// either key file wrapped.
    pub fn with_next(self, next: FileKeyService) -> Self {
        FileKeyService {
            also_unwraps: Some(self.wrap_key),
            wrap_key: next.wrap_key,
            source: format!("{} (rewrap under way)", self.source),
        }
    }

    fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new_from_slice(&self.wrap_key).expect("key is 32 bytes")
    }
}

fn ad(label: &str) -> Vec<u8> {
    let mut out = WRAP_AD.to_vec();
    out.extend_from_slice(label.as_bytes());
    out
}

impl KeyService for FileKeyService {
    fn wrap(&self, key: &[u8; 32], label: &str) -> Result<Vec<u8>, KeyError> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::getrandom(&mut nonce).map_err(|e| KeyError::Random(e.to_string()))?;
        let sealed = self
            .cipher()
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: key,
                    aad: &ad(label),
                },
            )
            .map_err(|_| KeyError::Unwrap {
                label: label.to_string(),
                service: self.describe(),
            })?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    fn unwrap(&self, wrapped: &[u8], label: &str) -> Result<[u8; 32], KeyError> {
        let fail = || KeyError::Unwrap {
            label: label.to_string(),
            service: self.describe(),
        };
        if wrapped.len() != NONCE_LEN + 32 + 16 {
            return Err(fail());
        }
        let (nonce, body) = wrapped.split_at(NONCE_LEN);
        let open = |key: &[u8; 32]| {
            Aes256Gcm::new_from_slice(key)
                .expect("key is 32 bytes")
                .decrypt(
                    Nonce::from_slice(nonce),
                    Payload {
                        msg: body,
                        aad: &ad(label),
                    },
                )
                .ok()
        };
        let plain = open(&self.wrap_key)
            .or_else(|| self.also_unwraps.as_ref().and_then(open))
            .ok_or_else(fail)?;
        plain.as_slice().try_into().map_err(|_| fail())
    }

    fn describe(&self) -> String {
        self.source.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_binds_label_and_key() {
        let service = FileKeyService::new(&[5; 32], Some("/k".into()));
        let other = FileKeyService::new(&[6; 32], None);
        let material = [9u8; 32];
        let wrapped = service.wrap(&material, "data/1").unwrap();
        assert_eq!(service.unwrap(&wrapped, "data/1").unwrap(), material);
        let mut tampered = wrapped.clone();
        tampered[NONCE_LEN] ^= 1;
        let cases: &[(&FileKeyService, &[u8], &str)] = &[
            (&service, &wrapped, "data/2"),
            (&service, &wrapped, "credentials/1"),
            (&other, &wrapped, "data/1"),
            (&service, &tampered, "data/1"),
            (&service, &wrapped[..20], "data/1"),
            (&service, b"", "data/1"),
        ];
        for (svc, bytes, label) in cases {
            let err = svc.unwrap(bytes, label).unwrap_err().to_string();
            assert!(err.contains(label), "{err}");
        }
        // Fresh nonce each time; no key bytes in Debug.
        assert_ne!(service.wrap(&material, "data/1").unwrap(), wrapped);
        assert!(!format!("{service:?}").contains("9, 9"));
        assert_eq!(service.describe(), "file /k");

        // During a rewrap both key files open, only the next one wraps.
        let during =
            FileKeyService::new(&[5; 32], None).with_next(FileKeyService::new(&[6; 32], None));
        assert_eq!(during.unwrap(&wrapped, "data/1").unwrap(), material);
        let new = during.wrap(&material, "data/1").unwrap();
        assert_eq!(other.unwrap(&new, "data/1").unwrap(), material);
        assert!(service.unwrap(&new, "data/1").is_err());
    }
}
