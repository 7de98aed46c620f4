//! The wrapped key file: the root key material as a key service (`pkcs11`) sealed it,
//! so the data dir holds nothing that opens a state without the service.
//!
//! The file is JSON, `{"format": "stategate-wrapped-key/1", "service": "<describe>",
//! "keys": {"dek": "<base64 of the wrapped bytes>"}}`: one entry per label, so a
//! keyring with several generations keeps them in the same file. `service` is only
//! for people reading the file; what opens an entry is the service configured.
//! Written to a fresh temporary file, fsynced, renamed into place and the directory
//! fsynced: a crash leaves the old file or the new one, never half of one.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use super::service::KeyService;
use super::{KeyError, RootKey};

/// The label the root key (the DEK) is wrapped under.
pub const ROOT_LABEL: &str = "dek";

const FORMAT: &str = "stategate-wrapped-key/1";

/// Largest wrapped key file read: a few entries of ~80 bytes each; anything this
/// large is not one.
const MAX_FILE_BYTES: u64 = 64 * 1024;

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileBody {
    format: String,
    service: String,
    keys: BTreeMap<String, String>,
}

/// Seals `key` with `service` under [`ROOT_LABEL`] and proves the result opens again
/// to the same key before it is returned (a token that "encrypts" wrongly is caught
/// before anything is written).
pub fn wrap_root(service: &dyn KeyService, key: &RootKey) -> Result<Vec<u8>, KeyError> {
    let bytes = root_bytes(key);
    let wrapped = service.wrap(&bytes, ROOT_LABEL)?;
    let back = service.unwrap(&wrapped, ROOT_LABEL)?;
    if back != bytes {
        return Err(KeyError::Service(format!(
            "{} returned a wrapped key that does not open to the same key",
            service.describe()
        )));
    }
    Ok(wrapped)
}

/// The DEK opened from the wrapped file at `path` by `service`.
pub fn unwrap_root(service: &dyn KeyService, path: &Path) -> Result<RootKey, KeyError> {
    let wrapped = read_entry(path, ROOT_LABEL)?;
    let bytes = service
        .unwrap(&wrapped, ROOT_LABEL)
        .map_err(|e| KeyError::Service(format!("wrapped key file {}: {e}", path.display())))?;
    Ok(RootKey::from_bytes(bytes))
}

/// The 32 bytes of a root key. `RootKey` keeps its bytes private; its base64 form is
/// the one way out it offers, and this is the only place that needs the raw bytes.
fn root_bytes(key: &RootKey) -> [u8; 32] {
    let raw = BASE64
        .decode(key.to_base64())
        .expect("a root key's own base64 decodes");
    raw.as_slice()
        .try_into()
        .expect("a root key is 32 bytes long")
}

fn bad(path: &Path, why: &str) -> KeyError {
    KeyError::Service(format!("wrapped key file {}: {why}", path.display()))
}

/// The wrapped bytes under `label` in the file at `path` (bounded read).
pub fn read_entry(path: &Path, label: &str) -> Result<Vec<u8>, KeyError> {
    let file = std::fs::File::open(path).map_err(|source| KeyError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|source| KeyError::Read {
            path: path.display().to_string(),
            source,
        })?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(bad(path, "larger than any wrapped key file"));
    }
    let body: FileBody = serde_json::from_str(&text)
        .map_err(|e| bad(path, &format!("not a wrapped key file ({e})")))?;
    if body.format != FORMAT {
        return Err(bad(
            path,
            &format!("format {:?} is not {FORMAT:?}", body.format),
        ));
    }
    let entry = body
        .keys
        .get(label)
        .ok_or_else(|| bad(path, &format!("holds no key labelled {label:?}")))?;
    BASE64
        .decode(entry)
        .map_err(|_| bad(path, &format!("the key labelled {label:?} is not base64")))
}

/// Writes a wrapped key file holding `wrapped` under [`ROOT_LABEL`] at `path`,
/// atomically and durably (mode 0600). Refuses to replace an existing file: the one
/// there may be the only copy of a key.
pub fn write_root_file(
    path: &Path,
    service_description: &str,
    wrapped: &[u8],
) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let body = FileBody {
        format: FORMAT.to_string(),
        service: service_description.to_string(),
        keys: BTreeMap::from([(ROOT_LABEL.to_string(), BASE64.encode(wrapped))]),
    };
    let mut text = serde_json::to_string_pretty(&body).map_err(std::io::Error::other)?;
    text.push('\n');
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the wrapped key path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        drop(file);
        // `link` then `unlink` instead of `rename`: it fails when `path` already
        // exists, so a wrapped key written meanwhile by someone else is never replaced.
        std::fs::hard_link(&tmp, path)?;
        std::fs::remove_file(&tmp)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Overwrites the plain key file at `path` with zeros, fsyncs, removes it and fsyncs
/// its directory. On a copy-on-write or journalling file system the old blocks may
/// survive the overwrite; that is said in the docs, and is why the plain file should
/// be treated as leaked if the disk is not trusted.
pub fn remove_plain_key_file(path: &Path) -> std::io::Result<()> {
    let len = std::fs::metadata(path)?.len();
    let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
    file.write_all(&vec![0u8; len as usize])?;
    file.sync_all()?;
    drop(file);
    std::fs::remove_file(path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A local service for the file format's tests: XOR with a byte, then that byte
    /// and the label as a check suffix. Not a cipher; only the format is under test here (the real
    /// token is in tests/hsm.rs).
    #[derive(Debug)]
    struct Toy(u8);

    impl KeyService for Toy {
        fn wrap(&self, key: &[u8; 32], label: &str) -> Result<Vec<u8>, KeyError> {
            let mut out: Vec<u8> = key.iter().map(|b| b ^ self.0).collect();
            out.push(self.0);
            out.extend_from_slice(label.as_bytes());
            Ok(out)
        }
        fn unwrap(&self, wrapped: &[u8], label: &str) -> Result<[u8; 32], KeyError> {
            if wrapped.len() != 33 + label.len()
                || wrapped[32] != self.0
                || &wrapped[33..] != label.as_bytes()
            {
                return Err(KeyError::Service("toy: refused".into()));
            }
            let mut out = [0u8; 32];
            for (o, b) in out.iter_mut().zip(wrapped) {
                *o = b ^ self.0;
            }
            Ok(out)
        }
        fn describe(&self) -> String {
            format!("toy {}", self.0)
        }
    }

    #[test]
    fn a_wrapped_file_round_trips_and_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stategate.key.wrapped");
        let key = RootKey::from_bytes([3; 32]);
        let wrapped = wrap_root(&Toy(9), &key).unwrap();
        write_root_file(&path, "toy 9", &wrapped).unwrap();
        let opened = unwrap_root(&Toy(9), &path).unwrap();
        assert_eq!(opened.to_base64(), key.to_base64());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&key.to_base64()), "{text}");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // An existing file is never replaced, and no temporary file is left behind.
        let err = write_root_file(&path, "toy 9", &wrapped).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }

    #[test]
    fn damaged_or_foreign_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w");
        let good = BASE64.encode(Toy(9).wrap(&[3; 32], ROOT_LABEL).unwrap());
        let rows: &[(String, &str)] = &[
            (String::new(), "not a wrapped key file"),
            ("{}".into(), "not a wrapped key file"),
            (
                format!(r#"{{"format":"other/1","service":"x","keys":{{"dek":"{good}"}}}}"#),
                "is not",
            ),
            (
                format!(r#"{{"format":"{FORMAT}","service":"x","keys":{{"data/1":"{good}"}}}}"#),
                "holds no key labelled \"dek\"",
            ),
            (
                format!(r#"{{"format":"{FORMAT}","service":"x","keys":{{"dek":"!!"}}}}"#),
                "not base64",
            ),
            (
                format!(
                    r#"{{"format":"{FORMAT}","service":"x","keys":{{"dek":"{good}"}},"pin":"1"}}"#
                ),
                "not a wrapped key file",
            ),
            ("x".repeat(MAX_FILE_BYTES as usize + 1), "larger than"),
        ];
        for (body, want) in rows {
            std::fs::write(&path, body).unwrap();
            let err = unwrap_root(&Toy(9), &path).unwrap_err().to_string();
            assert!(err.contains(want) && err.contains("/w"), "{want}: {err}");
        }
        // The right file under the wrong service key is refused too, naming the file.
        std::fs::write(
            &path,
            format!(r#"{{"format":"{FORMAT}","service":"x","keys":{{"dek":"{good}"}}}}"#),
        )
        .unwrap();
        assert!(unwrap_root(&Toy(9), &path).is_ok());
        let err = unwrap_root(&Toy(1), &path).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("toy: refused"), "{err}");
        let err = std::fs::remove_file(&path).and_then(|_| {
            unwrap_root(&Toy(9), &path)
                .map(|_| ())
                .map_err(std::io::Error::other)
        });
        assert!(err.unwrap_err().to_string().contains("cannot read"));
    }

    #[test]
    fn removing_the_plain_file_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dek");
        std::fs::write(&path, "c2VjcmV0\n").unwrap();
        remove_plain_key_file(&path).unwrap();
        assert!(!path.exists());
        assert!(remove_plain_key_file(&path).is_err());
    }
}
