//! The S3 keys stategate can check a pass-through request's signature with: its own
//! store key, and — when it is given Garage's admin API — every other key of the
//! store, looked up by the access key id the request claims.
//!
//! Why: a conditional PUT's failed precondition (`412`) may only be told to a client
//! whose signature stategate has verified (otherwise the answer would tell a stranger,
//! with stategate's authority, whether an object exists). Terraform's `s3` backend
//! signs with the user's own key, which stategate cannot verify unless it knows that
//! key's secret. With a key looked up here the object is also checked *as that key*
//! (its own read permission), so stategate's key needs no grant on the user's bucket.
//!
//! Bounded: ids are checked for shape before any lookup, answers (found or not) are
//! cached for a short time in a map of bounded size, and lookups are rate-limited, so
//! a flood of made-up key ids costs the admin API a few requests a second. A lookup
//! that fails (admin API down, refused) counts as an unknown key: the request gets
//! the answer an unverifiable signature gets, never a 5xx of its own. The admin token
//! and the secrets learned never reach a log or an error body.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::{S3Config, Secret};
use crate::store::s3::S3Store;

/// How long a looked-up key is trusted before it is asked for again (a key deleted or
/// expired at the store stops being accepted within this time).
const KNOWN_FOR: Duration = Duration::from_secs(60);
/// How long "no such key" is remembered.
const UNKNOWN_FOR: Duration = Duration::from_secs(15);
/// At most this many keys remembered; a full map is emptied of expired entries, then
/// of everything (correctness never depends on the cache).
const MAX_CACHED: usize = 1024;
/// At most this many admin API lookups per second, all ids together.
const LOOKUPS_PER_SECOND: u32 = 10;
/// The longest access key id looked up (Garage's are 26 characters).
const MAX_KEY_ID: usize = 128;
/// The largest admin API answer read.
const MAX_ANSWER: usize = 64 * 1024;

/// A key stategate holds the secret of, with a store client that acts as that key.
#[derive(Clone)]
pub struct KnownKey {
    pub access_key_id: String,
    pub secret: Secret,
    pub store: Arc<S3Store>,
}

/// What a lookup of an access key id found.
pub enum Found {
    Key(KnownKey),
    /// The store has no such live key (Garage's admin API said so, or the id cannot be
    /// one): a request signed with it is not valid at the store either.
    NoSuchKey,
    /// stategate cannot tell: no admin API configured, the lookup failed, or the rate
    /// limit was reached.
    CannotTell,
}

/// Where Garage's admin API is and the token that may read keys with it.
pub struct GarageAdmin {
    pub endpoint: String,
    pub token: Secret,
}

pub struct StoreKeys {
    own: KnownKey,
    region: String,
    garage: Option<Lookup>,
}

struct Lookup {
    admin: GarageAdmin,
    http: reqwest::Client,
    /// The store's settings, for a client that acts as a looked-up key.
    base: S3Config,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<String, (Instant, Option<KnownKey>)>,
    window: Option<Instant>,
    lookups_in_window: u32,
}

impl StoreKeys {
    pub fn new(store: &S3Config, garage: Option<GarageAdmin>) -> StoreKeys {
        let own = KnownKey {
            access_key_id: store.access_key_id.clone(),
            secret: store.secret_access_key.clone(),
            store: Arc::new(S3Store::new(store)),
        };
        let garage = garage.map(|admin| Lookup {
            admin,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default(),
            base: store.clone(),
            cache: Mutex::new(Cache::default()),
        });
        StoreKeys {
            own,
            region: store.region.clone(),
            garage,
        }
    }

    /// stategate's own key.
    pub fn own(&self) -> &KnownKey {
        &self.own
    }

    /// The region every key of the store signs for.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// Asks the admin API about stategate's own key, as a lookup would, so a wrong
    /// endpoint, token or scope is found at startup rather than at the first
    /// conditional write. `Err(why)`: what is wrong (never the token).
    pub async fn check_lookup(&self) -> Result<(), String> {
        let Some(lookup) = &self.garage else {
            return Ok(());
        };
        match lookup.fetch(&self.own.access_key_id).await? {
            Some(secret) if secret.expose() == self.own.secret.expose() => Ok(()),
            Some(_) => Err("the admin API's secret for stategate's own key is not the configured one (is it this store's admin API?)".into()),
            None => Err("the admin API does not know stategate's own key (is it this store's admin API?)".into()),
        }
    }

    /// Whether keys other than stategate's own can be looked up.
    pub fn looks_up_others(&self) -> bool {
        self.garage.is_some()
    }

    /// The key `access_key_id` names, when stategate holds or can learn its secret.
    pub async fn find(&self, access_key_id: &str) -> Found {
        if access_key_id == self.own.access_key_id {
            return Found::Key(self.own.clone());
        }
        let Some(lookup) = self.garage.as_ref() else {
            return Found::CannotTell;
        };
        if !plausible_key_id(access_key_id) {
            return Found::NoSuchKey;
        }
        let now = Instant::now();
        {
            let mut cache = lock(&lookup.cache);
            if let Some((at, known)) = cache.entries.get(access_key_id) {
                let fresh_for = if known.is_some() {
                    KNOWN_FOR
                } else {
                    UNKNOWN_FOR
                };
                if now.duration_since(*at) < fresh_for {
                    return Found::from(known.clone());
                }
            }
            if !cache.may_look_up(now) {
                return Found::CannotTell;
            }
        }
        let found = match lookup.fetch(access_key_id).await {
            Ok(found) => found,
            Err(why) => {
                // Not cached: the next request asks again (within the rate limit).
                tracing::warn!(
                    key = access_key_id,
                    error = why,
                    "cannot look up an S3 key through Garage's admin API (upstream.garage_admin_endpoint); a conditional write signed with it is checked as stategate's own key"
                );
                return Found::CannotTell;
            }
        };
        let known = found.map(|secret| {
            let config = S3Config {
                access_key_id: access_key_id.to_string(),
                secret_access_key: secret.clone(),
                ..lookup.base.clone()
            };
            KnownKey {
                access_key_id: access_key_id.to_string(),
                secret,
                store: Arc::new(S3Store::new(&config)),
            }
        });
        lock(&lookup.cache).remember(access_key_id, now, known.clone());
        Found::from(known)
    }
}

impl From<Option<KnownKey>> for Found {
    fn from(known: Option<KnownKey>) -> Found {
        known.map_or(Found::NoSuchKey, Found::Key)
    }
}

impl Lookup {
    /// `Ok(None)`: the admin API knows no such (live) key.
    async fn fetch(&self, access_key_id: &str) -> Result<Option<Secret>, String> {
        let url = format!(
            "{}/v2/GetKeyInfo",
            self.admin.endpoint.trim_end_matches('/')
        );
        let answer = self
            .http
            .get(url)
            .query(&[("id", access_key_id), ("showSecretKey", "true")])
            .bearer_auth(self.admin.token.expose())
            .send()
            .await
            .map_err(|e| format!("request failed: {}", e.without_url()))?;
        let status = answer.status();
        if status == reqwest::StatusCode::NOT_FOUND || status == reqwest::StatusCode::BAD_REQUEST {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(format!(
                "the admin API answered {status} (is the token allowed GetKeyInfo?)"
            ));
        }
        let body = read_bounded(answer).await?;
        parse_key_info(&body, access_key_id)
    }
}

async fn read_bounded(mut answer: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = answer
        .chunk()
        .await
        .map_err(|e| format!("reading the answer failed: {}", e.without_url()))?
    {
        if body.len() + chunk.len() > MAX_ANSWER {
            return Err("the admin API's answer is too large".into());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The secret of a `GetKeyInfo` answer, when it is about `access_key_id` and the key
/// has not expired.
fn parse_key_info(body: &[u8], access_key_id: &str) -> Result<Option<Secret>, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct KeyInfo {
        access_key_id: String,
        secret_access_key: Option<String>,
        #[serde(default)]
        expired: bool,
    }
    let info: KeyInfo = serde_json::from_slice(body)
        .map_err(|_| "the admin API's answer is not a GetKeyInfo answer".to_string())?;
    if info.access_key_id != access_key_id {
        return Err("the admin API answered about another key".into());
    }
    if info.expired {
        return Ok(None);
    }
    match info.secret_access_key {
        Some(secret) if !secret.is_empty() => Ok(Some(Secret::from(secret))),
        _ => Err("the admin API did not return the key's secret".into()),
    }
}

/// An access key id worth asking about: printable ASCII letters and digits only, of a
/// bounded length (nothing that could change the lookup's URL).
fn plausible_key_id(id: &str) -> bool {
    (1..=MAX_KEY_ID).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

impl Cache {
    /// Counts a lookup against the rate limit; false when the second's budget is spent.
    fn may_look_up(&mut self, now: Instant) -> bool {
        match self.window {
            Some(start) if now.duration_since(start) < Duration::from_secs(1) => {
                if self.lookups_in_window >= LOOKUPS_PER_SECOND {
                    return false;
                }
                self.lookups_in_window += 1;
            }
            _ => {
                self.window = Some(now);
                self.lookups_in_window = 1;
            }
        }
        true
    }

    fn remember(&mut self, access_key_id: &str, now: Instant, known: Option<KnownKey>) {
        if self.entries.len() >= MAX_CACHED {
            self.entries
                .retain(|_, (at, _)| now.duration_since(*at) < KNOWN_FOR);
            if self.entries.len() >= MAX_CACHED {
                self.entries.clear();
            }
        }
        self.entries.insert(access_key_id.to_string(), (now, known));
    }
}

/// Never held across an await; a poisoned map still holds consistent entries.
fn lock(cache: &Mutex<Cache>) -> std::sync::MutexGuard<'_, Cache> {
    cache.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_key_ids_are_looked_up() {
        for (id, ok) in [
            ("GK31c2f218a2e44f485b94239e", true),
            ("AKIAIOSFODNN7EXAMPLE", true),
            ("", false),
            ("GK1&showSecretKey=false", false),
            ("GK1/../v2/ListKeys", false),
            ("GK1 ", false),
            ("ＧＫ1", false),
            (&"G".repeat(129), false),
        ] {
            assert_eq!(plausible_key_id(id), ok, "{id:?}");
        }
    }

    #[test]
    fn key_info_answers() {
        let id = "GK1";
        let table: &[(&str, Result<Option<&str>, ()>)] = &[
            (
                r#"{"accessKeyId":"GK1","secretAccessKey":"s3cr3t","name":"u"}"#,
                Ok(Some("s3cr3t")),
            ),
            (
                r#"{"accessKeyId":"GK1","secretAccessKey":"s3cr3t","expired":true}"#,
                Ok(None),
            ),
            // Another key's answer, no secret, an empty one, not JSON: never a key.
            (r#"{"accessKeyId":"GK2","secretAccessKey":"x"}"#, Err(())),
            (r#"{"accessKeyId":"GK1","secretAccessKey":null}"#, Err(())),
            (r#"{"accessKeyId":"GK1","secretAccessKey":""}"#, Err(())),
            ("<html>", Err(())),
        ];
        for (body, want) in table {
            let got = parse_key_info(body.as_bytes(), id);
            match (got, want) {
                (Ok(Some(s)), Ok(Some(w))) => assert_eq!(s.expose(), *w),
                (Ok(None), Ok(None)) | (Err(_), Err(())) => {}
                (got, want) => panic!("{body}: {:?} vs {want:?}", got.map(|s| s.is_some())),
            }
        }
    }

    #[test]
    fn lookups_are_rate_limited_per_second() {
        let mut cache = Cache::default();
        let start = Instant::now();
        let allowed = (0..50).filter(|_| cache.may_look_up(start)).count();
        assert_eq!(allowed, LOOKUPS_PER_SECOND as usize);
        assert!(cache.may_look_up(start + Duration::from_millis(1001)));
    }

    #[test]
    fn the_cache_stays_bounded() {
        let mut cache = Cache::default();
        let now = Instant::now();
        for i in 0..(MAX_CACHED * 3) {
            cache.remember(&format!("GK{i}"), now, None);
            assert!(cache.entries.len() <= MAX_CACHED);
        }
    }
}
