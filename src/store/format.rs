//! The on-store blob format: a plaintext header that makes the blob self-describing
//! (so the SQLite index can be rebuilt from the store alone), then the sealed state.
//!
//! ```text
//! "SGB1" | u32 BE header length | header JSON | nonce | ciphertext | tag
//! ```
//! The AEAD associated data is everything before the nonce, so the header (scope,
//! version, serial, lineage, sha256) cannot be altered and a blob copied to another
//! scope or version fails to open.

use serde::{Deserialize, Serialize};

use crate::crypto::{SealError, SealKey};

const MAGIC: &[u8; 4] = b"SGB1";
/// Headers are small; anything larger is not one of ours.
const MAX_HEADER: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobHeader {
    pub scope: String,
    pub version: i64,
    pub serial: Option<i64>,
    pub lineage: Option<String>,
    pub sha256: String,
    pub size: i64,
    pub created_at: String,
    pub actor: String,
    /// Blob key of the committed version this one was written on top of (absent for
    /// the first version, after a tombstone, and in blobs of older releases). The index
    /// rebuild follows these links down from the newest version to tell a committed
    /// blob from an orphan of a failed write without trusting wall clocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("not a stategate blob (bad magic or header)")]
    NotABlob,
    #[error("blob belongs to {found}, expected {expected}")]
    WrongIdentity { expected: String, found: String },
    #[error("content hash does not match the version index")]
    HashMismatch,
    #[error(transparent)]
    Seal(#[from] SealError),
}

pub fn encode(key: &SealKey, header: &BlobHeader, plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
    let header_json = serde_json::to_vec(header).expect("header serializes");
    let mut out = Vec::with_capacity(8 + header_json.len() + plaintext.len() + 28);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header_json.len() as u32).to_be_bytes());
    out.extend_from_slice(&header_json);
    let sealed = key.seal(&out, plaintext)?;
    out.extend_from_slice(&sealed);
    Ok(out)
}

/// Reads the header without decrypting (for index rebuilds).
pub fn read_header(blob: &[u8]) -> Result<(BlobHeader, usize), FormatError> {
    if blob.len() < 8 || &blob[..4] != MAGIC {
        return Err(FormatError::NotABlob);
    }
    let len = u32::from_be_bytes(blob[4..8].try_into().expect("4 bytes")) as usize;
    if len > MAX_HEADER || blob.len() < 8 + len {
        return Err(FormatError::NotABlob);
    }
    let header = serde_json::from_slice(&blob[8..8 + len]).map_err(|_| FormatError::NotABlob)?;
    Ok((header, 8 + len))
}

/// Opens a blob, checking it is exactly the version the index says it is.
pub fn decode(
    key: &SealKey,
    blob: &[u8],
    scope: &str,
    version: i64,
    sha256: Option<&str>,
) -> Result<Vec<u8>, FormatError> {
    let (header, body_at) = read_header(blob)?;
    if header.scope != scope || header.version != version {
        return Err(FormatError::WrongIdentity {
            expected: format!("{scope} v{version}"),
            found: format!("{} v{}", header.scope, header.version),
        });
    }
    let plaintext = key.open(&blob[..body_at], &blob[body_at..])?;
    if let Some(expected) = sha256 {
        if hex::encode(sha2_digest(&plaintext)) != expected {
            return Err(FormatError::HashMismatch);
        }
    }
    Ok(plaintext)
}

pub fn sha2_digest(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::RootKey;

    fn header(scope: &str, version: i64, body: &[u8]) -> BlobHeader {
        BlobHeader {
            parent: None,
            scope: scope.into(),
            version,
            serial: Some(3),
            lineage: Some("l".into()),
            sha256: hex::encode(sha2_digest(body)),
            size: body.len() as i64,
            created_at: "2026-01-01T00:00:00Z".into(),
            actor: "test".into(),
        }
    }

    #[test]
    fn round_trip_and_identity_checks() {
        let root = RootKey::from_bytes([1; 32]);
        let key = root.blob_key("tf/a");
        let body = b"{\"serial\":3}";
        let h = header("tf/a", 2, body);
        let blob = encode(&key, &h, body).unwrap();
        assert_eq!(read_header(&blob).unwrap().0, h);
        assert_eq!(
            decode(&key, &blob, "tf/a", 2, Some(&h.sha256)).unwrap(),
            body
        );
        assert!(matches!(
            decode(&key, &blob, "tf/a", 3, None),
            Err(FormatError::WrongIdentity { .. })
        ));
        assert!(matches!(
            decode(&key, &blob, "tf/a", 2, Some("00")),
            Err(FormatError::HashMismatch)
        ));
        // A header edited to claim another identity fails authentication.
        let forged = encode(&key, &header("tf/a", 9, body), body).unwrap();
        let mut spliced = blob.clone();
        let (_, at) = read_header(&blob).unwrap();
        let (_, forged_at) = read_header(&forged).unwrap();
        spliced.splice(..at, forged[..forged_at].iter().copied());
        assert_eq!(
            decode(&key, &spliced, "tf/a", 9, None),
            Err(FormatError::Seal(SealError::Authentication))
        );
        // Another scope's key cannot open it.
        assert!(decode(&root.blob_key("tf/b"), &blob, "tf/a", 2, None).is_err());
    }

    #[test]
    fn garbage_is_rejected() {
        let key = RootKey::from_bytes([1; 32]).blob_key("s");
        for bad in [
            &b""[..],
            b"SGB1",
            b"SGB1\xff\xff\xff\xff",
            b"XXXX\0\0\0\x02{}",
        ] {
            assert!(decode(&key, bad, "s", 1, None).is_err());
        }
    }
}
