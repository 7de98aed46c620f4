//! A PKCS#11 token as the key service: the root key material is stored wrapped
//! (AES-256-GCM on the token, under a non-extractable AES-256 key that never leaves
//! it) and unwrapped at startup. Real HSMs, cloud KMS bridges and SoftHSM2 all speak
//! PKCS#11; `cryptoki` loads the vendor's module.
//!
//! A wrapped value is `IV (12 bytes) ‖ ciphertext ‖ tag (16 bytes)`; the label
//! (`"dek"`, `"data/3"`, …) is the GCM additional data, so a value wrapped for one
//! purpose never opens as another. The IV comes from the OS, not the token: some
//! tokens' generators are slow, and a 96-bit random IV per wrap of a handful of keys
//! is far from GCM's limits.
//!
//! Every failure names what failed — the module, the token, the login, the key — and
//! never the PIN or key bytes: the PIN is held as a `SecretString` and only handed
//! to `C_Login`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::mechanism::aead::GcmParams;
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::types::AuthPin;

use super::service::KeyService;
use super::KeyError;

const IV_LEN: usize = 12;
const TAG_BITS: u64 = 128;
const TAG_LEN: usize = 16;

/// What names a key on a token: the module that drives it, the token's label and the
/// key's label, with the user PIN (read from a file or the environment, never the
/// config file).
pub struct Pkcs11Params {
    pub module: PathBuf,
    pub token_label: String,
    pub key_label: String,
    pub pin: AuthPin,
}

impl std::fmt::Debug for Pkcs11Params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pkcs11Params")
            .field("module", &self.module)
            .field("token_label", &self.token_label)
            .field("key_label", &self.key_label)
            .field("pin", &"<redacted>")
            .finish()
    }
}

/// A logged-in session on the token and the handle of the wrapping key.
pub struct Pkcs11KeyService {
    module: PathBuf,
    token_label: String,
    key_label: String,
    /// One session: PKCS#11 logins are per token and application, and a session
    /// is not to be used by two threads at once.
    session: Mutex<Session>,
    key: ObjectHandle,
}

impl std::fmt::Debug for Pkcs11KeyService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pkcs11KeyService({})", self.describe())
    }
}

/// A PKCS#11 return value in a few words ("Login returned PinIncorrect"), not the
/// specification's paragraph `cryptoki`'s `Display` gives.
fn short(e: &CkError) -> String {
    match e {
        CkError::Pkcs11(rv, function) => format!("{function:?} returned {rv:?}"),
        other => other.to_string(),
    }
}

fn fail(text: String) -> KeyError {
    KeyError::Service(text)
}

impl Pkcs11KeyService {
    /// Loads the module, finds the token by label, logs in with the PIN and finds the
    /// one AES-256 secret key with `key_label` that may encrypt and decrypt. Any step
    /// failing is an error naming it; nothing is written anywhere.
    pub fn open(params: &Pkcs11Params) -> Result<Self, KeyError> {
        let module = params.module.display().to_string();
        if !params.module.is_file() {
            return Err(fail(format!(
                "PKCS#11 module {module} does not exist or is not a file"
            )));
        }
        let ctx = Pkcs11::new(&params.module)
            .map_err(|e| fail(format!("cannot load PKCS#11 module {module}: {e}")))?;
        match ctx.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)) {
            // A second service in the same process (tests, `key wrap`'s check) shares it.
            Ok(()) | Err(CkError::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => {}
            Err(e) => {
                return Err(fail(format!(
                    "PKCS#11 module {module} did not initialise (is the token or its service reachable, and the module's own configuration readable?): {}",
                    short(&e)
                )))
            }
        }
        let slots = ctx.get_slots_with_token().map_err(|e| {
            fail(format!(
                "PKCS#11 module {module}: cannot list tokens: {}",
                short(&e)
            ))
        })?;
        let mut seen = Vec::new();
        let mut found = None;
        for slot in slots {
            let Ok(info) = ctx.get_token_info(slot) else {
                continue;
            };
            let label = info.label().trim_end().to_string();
            if label == params.token_label {
                found = Some(slot);
                break;
            }
            seen.push(format!("'{label}'"));
        }
        let slot = found.ok_or_else(|| {
            fail(format!(
                "no PKCS#11 token labelled '{}' in module {module} (tokens present: {})",
                params.token_label,
                if seen.is_empty() {
                    "none".to_string()
                } else {
                    seen.join(", ")
                }
            ))
        })?;
        let token = &params.token_label;
        let session = ctx.open_ro_session(slot).map_err(|e| {
            fail(format!(
                "cannot open a session on PKCS#11 token '{token}': {}",
                short(&e)
            ))
        })?;
        match session.login(UserType::User, Some(&params.pin)) {
            Ok(()) | Err(CkError::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => {}
            Err(CkError::Pkcs11(RvError::PinIncorrect, _)) => {
                return Err(fail(format!(
                    "PKCS#11 login to token '{token}' refused: wrong PIN (CKR_PIN_INCORRECT)"
                )))
            }
            Err(e) => {
                return Err(fail(format!(
                    "PKCS#11 login to token '{token}' refused: {}",
                    short(&e)
                )))
            }
        }
        let key_label = &params.key_label;
        let keys = session
            .find_objects(&[
                Attribute::Class(ObjectClass::SECRET_KEY),
                Attribute::Label(key_label.as_bytes().to_vec()),
            ])
            .map_err(|e| {
                fail(format!(
                    "cannot search token '{token}' for key '{key_label}': {}",
                    short(&e)
                ))
            })?;
        let key = match keys.as_slice() {
            [one] => *one,
            [] => {
                return Err(fail(format!(
                    "no secret key labelled '{key_label}' on PKCS#11 token '{token}'"
                )))
            }
            more => {
                return Err(fail(format!(
                    "{} secret keys are labelled '{key_label}' on PKCS#11 token '{token}'; the label must name one",
                    more.len()
                )))
            }
        };
        check_key(&session, key, token, key_label)?;
        Ok(Pkcs11KeyService {
            module: params.module.clone(),
            token_label: params.token_label.clone(),
            key_label: params.key_label.clone(),
            session: Mutex::new(session),
            key,
        })
    }

    /// The module this service loaded.
    pub fn module(&self) -> &Path {
        &self.module
    }

    fn session(&self) -> std::sync::MutexGuard<'_, Session> {
        // A poisoned lock only means another thread panicked mid-call; the session
        // itself holds no half-done state between calls.
        self.session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The key must be AES, 32 bytes, allowed to encrypt and decrypt. An extractable key
/// works but defeats the point of a token; it is warned about, not refused, so a
/// vendor whose defaults differ still starts.
fn check_key(
    session: &Session,
    key: ObjectHandle,
    token: &str,
    key_label: &str,
) -> Result<(), KeyError> {
    let attrs = session
        .get_attributes(
            key,
            &[
                AttributeType::KeyType,
                AttributeType::ValueLen,
                AttributeType::Encrypt,
                AttributeType::Decrypt,
                AttributeType::Extractable,
            ],
        )
        .map_err(|e| {
            fail(format!(
                "cannot read the attributes of key '{key_label}' on token '{token}': {}",
                short(&e)
            ))
        })?;
    let (mut aes, mut len, mut enc, mut dec, mut extractable) = (false, 0u64, false, false, false);
    for attr in attrs {
        match attr {
            Attribute::KeyType(t) => aes = t == KeyType::AES,
            Attribute::ValueLen(n) => len = n.into(),
            Attribute::Encrypt(b) => enc = b,
            Attribute::Decrypt(b) => dec = b,
            Attribute::Extractable(b) => extractable = b,
            _ => {}
        }
    }
    if !aes || len != 32 {
        return Err(fail(format!(
            "key '{key_label}' on token '{token}' is not an AES-256 key (AES: {aes}, {len} bytes)"
        )));
    }
    if !enc || !dec {
        return Err(fail(format!(
            "key '{key_label}' on token '{token}' may not both encrypt and decrypt (CKA_ENCRYPT {enc}, CKA_DECRYPT {dec})"
        )));
    }
    if extractable {
        tracing::warn!(
            token,
            key = key_label,
            "the PKCS#11 wrapping key is extractable (CKA_EXTRACTABLE); create it with CKA_EXTRACTABLE=false so it cannot leave the token"
        );
    }
    Ok(())
}

impl KeyService for Pkcs11KeyService {
    fn wrap(&self, key: &[u8; 32], label: &str) -> Result<Vec<u8>, KeyError> {
        let mut iv = [0u8; IV_LEN];
        getrandom::getrandom(&mut iv).map_err(|e| KeyError::Random(e.to_string()))?;
        let mut iv_param = iv;
        let params = GcmParams::new(&mut iv_param, label.as_bytes(), TAG_BITS.into())
            .map_err(|e| fail(format!("{}: bad GCM parameters: {e}", self.describe())))?;
        let sealed = self
            .session()
            .encrypt(&Mechanism::AesGcm(params), self.key, key)
            .map_err(|e| {
                fail(format!(
                    "{} could not wrap the key for '{label}': {}",
                    self.describe(),
                    short(&e)
                ))
            })?;
        let mut out = iv.to_vec();
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    fn unwrap(&self, wrapped: &[u8], label: &str) -> Result<[u8; 32], KeyError> {
        let refused = || {
            fail(format!(
                "{} could not unwrap the key for '{label}': wrong token key, wrong label or a damaged wrapped file",
                self.describe()
            ))
        };
        if wrapped.len() != IV_LEN + 32 + TAG_LEN {
            return Err(refused());
        }
        let (iv, body) = wrapped.split_at(IV_LEN);
        let mut iv: [u8; IV_LEN] = iv.try_into().map_err(|_| refused())?;
        let params =
            GcmParams::new(&mut iv, label.as_bytes(), TAG_BITS.into()).map_err(|_| refused())?;
        let plain = self
            .session()
            .decrypt(&Mechanism::AesGcm(params), self.key, body)
            .map_err(|e| match e {
                // Authentication failed: the usual "wrong key / label / tampered".
                CkError::Pkcs11(RvError::EncryptedDataInvalid, _)
                | CkError::Pkcs11(RvError::EncryptedDataLenRange, _) => refused(),
                other => fail(format!(
                    "{} could not unwrap the key for '{label}': {}",
                    self.describe(),
                    short(&other)
                )),
            })?;
        let mut plain = plain;
        let out: Result<[u8; 32], _> = plain.as_slice().try_into();
        // The token's copy of the key material is not left in freed memory.
        plain.iter_mut().for_each(|b| *b = 0);
        std::hint::black_box(&plain);
        out.map_err(|_| refused())
    }

    fn describe(&self) -> String {
        format!(
            "pkcs11 token '{}' key '{}'",
            self.token_label, self.key_label
        )
    }
}
