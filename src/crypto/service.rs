//! The key-service trait (shared with the keyring; the merge keeps one copy).

use super::KeyError;

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
