//! Makes conditional PUTs through the pass-through atomic, whatever the store does.
//!
//! Terraform's own `backend "s3"` with `use_lockfile = true` takes its lock by PUTting
//! `<key>.tflock` with `If-None-Match: *`. Garage ignores that header (a second
//! writer silently wins), so two applies can both "hold" the lock and lose updates.
//! For a PUT carrying `If-None-Match: *` or `If-Match`, stategate takes a per-key
//! turn, checks the object itself (HEAD as the key that signed the request when
//! stategate knows it — see `store_keys` — else as its own key), answers
//! `412 PreconditionFailed` when the condition fails, and otherwise forwards the PUT
//! while still holding the turn, so no two conditional writes to one key interleave.
//! This is atomic for every client that goes through stategate.
//!
//! Turns are per exact key ([`KeyedTurns`]) and bounded both ways: a writer waits at
//! most `conditional_turn_wait_seconds` for the turn (then 503 SlowDown), and a
//! forwarded PUT whose body has not fully arrived `conditional_turn_hold_seconds`
//! after it got the turn loses it, and its body is cut off before its end reaches
//! the upstream ([`HeldTurn`]), so a stalled client cannot block a key or, late,
//! overwrite what the next writer created.

use std::sync::{Arc, Mutex as SyncMutex};
use std::time::Duration;

use pingora::http::RequestHeader;

use super::sigv4;
use super::store_keys::{Found, GarageAdmin, KnownKey, StoreKeys};
use crate::config::S3Config;
use crate::store::BlobError;
use crate::turns::{KeyedTurns, Turn};

/// The turn of one `(bucket, key)`, held until the forwarded PUT has completed.
pub type KeyTurn = Turn<(String, String)>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Precondition {
    /// `If-None-Match: *`: create only.
    Absent,
    /// `If-Match: <etag>`: replace only that version.
    Matches(String),
}

/// The precondition of a request, if it is a conditional PUT.
pub fn precondition(
    method: &str,
    if_none_match: Option<&str>,
    if_match: Option<&str>,
) -> Option<Precondition> {
    if method != "PUT" {
        return None;
    }
    if if_none_match.map(str::trim) == Some("*") {
        return Some(Precondition::Absent);
    }
    if_match.map(|etag| Precondition::Matches(normalize_etag(etag)))
}

fn normalize_etag(etag: &str) -> String {
    etag.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The condition is false: S3's `412 PreconditionFailed`.
    Failed,
    /// stategate could not find out (no access, store down): refuse rather than guess.
    Unverifiable(String),
    /// Another conditional write to the key held its turn for the whole wait.
    Busy,
}

pub struct ConditionalGuard {
    /// The keys a signature is checked with: a failed condition is only revealed to
    /// requests signed by one of them.
    keys: StoreKeys,
    turns: KeyedTurns<(String, String)>,
    wait: Duration,
    hold: Duration,
}

impl ConditionalGuard {
    /// `wait`: longest wait for a key's turn. `hold`: longest time a forwarded PUT may
    /// take to deliver its body while holding the turn.
    /// `garage`: where to look up the store's other keys (none: only stategate's own
    /// key's signatures are checked).
    pub fn new(
        store: &S3Config,
        garage: Option<GarageAdmin>,
        wait: Duration,
        hold: Duration,
    ) -> Self {
        ConditionalGuard {
            keys: StoreKeys::new(store, garage),
            turns: KeyedTurns::new(),
            wait,
            hold,
        }
    }

    /// Waits for the key's turn and checks the condition, looking at the object as
    /// `signer` (the key that signed the request, when stategate verified it) or else
    /// as stategate's own key. On success the returned turn must be kept until the
    /// forwarded PUT has completed, and told about its body.
    pub async fn enter(
        &self,
        bucket: &str,
        key: &str,
        condition: &Precondition,
        signer: Option<&KnownKey>,
    ) -> Result<HeldTurn, Refusal> {
        let turn = self.take_turn(bucket, key).await?;
        let current = signer
            .unwrap_or(self.keys.own())
            .store
            .head_etag(bucket, key)
            .await
            .map_err(|e| match e {
                BlobError::Unavailable(m) | BlobError::Failed(m) => Refusal::Unverifiable(m),
            })?;
        let holds = match (condition, current) {
            (Precondition::Absent, None) => true,
            (Precondition::Absent, Some(_)) => false,
            (Precondition::Matches(want), Some(etag)) => {
                normalize_etag(&etag) == *want || want == "*"
            }
            (Precondition::Matches(_), None) => false,
        };
        if holds {
            Ok(HeldTurn::start(turn, self.hold))
        } else {
            Err(Refusal::Failed)
        }
    }

    /// Who signed this request, as far as stategate can tell: a key it knows the secret
    /// of (its own, or one looked up at the store) whose SigV4 signature verifies and
    /// covers the condition header; a known key whose signature does not; or a key it
    /// does not know. Only a verified request may learn that its condition failed
    /// (412): otherwise the answer would tell whoever sent it, with stategate's
    /// authority, whether an object exists.
    pub async fn signer(&self, request: &RequestHeader) -> Signer {
        let Some(claimed) = sigv4::claimed_key(request.uri.query(), &request.headers) else {
            return Signer::Unknown;
        };
        let known = match self.keys.find(&claimed).await {
            Found::Key(known) => known,
            Found::NoSuchKey => return Signer::BadSignature,
            Found::CannotTell => return Signer::Unknown,
        };
        let key = sigv4::Credentials {
            access_key_id: &known.access_key_id,
            secret: known.secret.expose(),
            region: self.keys.region(),
        };
        let now = crate::clock::now_utc().unix_timestamp();
        let verdict = sigv4::verify_covering(
            request.method.as_str(),
            request.uri.path(),
            request.uri.query(),
            &request.headers,
            &[key],
            now,
            &["if-none-match", "if-match"],
        );
        if verdict.is_verified() {
            Signer::Verified(known)
        } else {
            Signer::BadSignature
        }
    }

    /// [`StoreKeys::check_lookup`].
    pub async fn check_key_lookup(&self) -> Result<(), String> {
        self.keys.check_lookup().await
    }

    /// Whether keys other than stategate's own are looked up at the store.
    pub fn looks_up_other_keys(&self) -> bool {
        self.keys.looks_up_others()
    }

    async fn take_turn(&self, bucket: &str, key: &str) -> Result<KeyTurn, Refusal> {
        self.turns
            .acquire((bucket.to_string(), key.to_string()), self.wait)
            .await
            .map_err(|_| Refusal::Busy)
    }
}

/// What [`ConditionalGuard::signer`] found.
pub enum Signer {
    /// Signed by this key, verified.
    Verified(KnownKey),
    /// Claims a key stategate knows, but the signature does not verify (or does not
    /// cover the condition header), or a key the store's admin API says does not exist:
    /// refused like any bad signature, nothing looked at.
    BadSignature,
    /// A key stategate does not know the secret of (or no signature it can parse).
    Unknown,
}

/// A key's turn held by a forwarded conditional PUT, for at most the hold time
/// unless its body has fully arrived by then. Dropping it (the request ended) gives
/// the turn up.
pub struct HeldTurn {
    hold: Arc<SyncMutex<Hold>>,
    limit: Duration,
    timer: tokio::task::JoinHandle<()>,
}

struct Hold {
    turn: Option<KeyTurn>,
    body_done: bool,
    expired: bool,
}

/// The hold ran out before the body was complete: the request must be aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldExpired;

impl HeldTurn {
    fn start(turn: KeyTurn, limit: Duration) -> HeldTurn {
        let hold = Arc::new(SyncMutex::new(Hold {
            turn: Some(turn),
            body_done: false,
            expired: false,
        }));
        let timer = tokio::spawn({
            let hold = hold.clone();
            async move {
                tokio::time::sleep(limit).await;
                let released = {
                    let mut h = lock(&hold);
                    if h.body_done {
                        None
                    } else {
                        h.expired = true;
                        h.turn.take()
                    }
                };
                if released.is_some() {
                    tracing::warn!(
                        seconds = limit.as_secs(),
                        "a conditional PUT did not deliver its body in time; its turn is given up and the request aborted"
                    );
                }
            }
        });
        HeldTurn { hold, limit, timer }
    }

    /// How long the body may take; also the longest silence allowed between its pieces.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Called for each piece of the forwarded body, before it goes upstream. Once the
    /// body's end has passed, the turn is kept until the upstream answered; once the
    /// hold has run out, no further piece (in particular not the end) may go upstream.
    pub fn body_progress(&self, end_of_body: bool) -> Result<(), HoldExpired> {
        let mut h = lock(&self.hold);
        if h.expired {
            return Err(HoldExpired);
        }
        h.body_done |= end_of_body;
        Ok(())
    }
}

impl Drop for HeldTurn {
    fn drop(&mut self) {
        self.timer.abort();
        let turn = lock(&self.hold).turn.take();
        drop(turn);
    }
}

/// Never held across an await; a poisoned lock still holds consistent flags.
fn lock(hold: &SyncMutex<Hold>) -> std::sync::MutexGuard<'_, Hold> {
    hold.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preconditions() {
        // (method, If-None-Match, If-Match, expected)
        type Row<'a> = (
            &'a str,
            Option<&'a str>,
            Option<&'a str>,
            Option<Precondition>,
        );
        let table: &[Row] = &[
            ("PUT", Some("*"), None, Some(Precondition::Absent)),
            (
                "PUT",
                Some(" * "),
                Some("\"x\""),
                Some(Precondition::Absent),
            ),
            (
                "PUT",
                None,
                Some("\"abc\""),
                Some(Precondition::Matches("abc".into())),
            ),
            (
                "PUT",
                None,
                Some("W/\"abc\""),
                Some(Precondition::Matches("abc".into())),
            ),
            ("PUT", Some("\"abc\""), None, None),
            ("PUT", None, None, None),
            ("GET", Some("*"), None, None),
            ("POST", Some("*"), None, None),
        ];
        for (method, inm, im, expected) in table {
            assert_eq!(
                &precondition(method, *inm, *im),
                expected,
                "{method} {inm:?} {im:?}"
            );
        }
    }

    /// A guard whose store is never contacted (the tests stop before the HEAD).
    fn guard(wait: Duration, hold: Duration) -> ConditionalGuard {
        let config = crate::config::S3Config {
            endpoint: "http://127.0.0.1:9".into(),
            bucket: "tf".into(),
            access_key_id: "k".into(),
            secret_access_key: "s".into(),
            ..Default::default()
        };
        ConditionalGuard::new(&config, None, wait, hold)
    }

    #[tokio::test(start_paused = true)]
    async fn turns_are_per_exact_key_and_the_wait_is_bounded() {
        let g = guard(Duration::from_secs(10), Duration::from_secs(30));
        let first = g.take_turn("tf", "locks/a&b.tflock").await.unwrap();
        // A key that only shares a prefix (what a decoder stopping at `&` would see) is free.
        let other = g.take_turn("tf", "locks/a").await.unwrap();
        let started = tokio::time::Instant::now();
        assert_eq!(
            g.take_turn("tf", "locks/a&b.tflock").await.err(),
            Some(Refusal::Busy)
        );
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        drop((first, other));
        assert!(g.take_turn("tf", "locks/a&b.tflock").await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_loses_the_turn_and_cannot_finish() {
        let g = guard(Duration::from_secs(10), Duration::from_secs(30));
        let held = HeldTurn::start(g.take_turn("tf", "k").await.unwrap(), g.hold);
        assert_eq!(held.body_progress(false), Ok(()));
        tokio::time::sleep(Duration::from_secs(31)).await;
        // The next writer gets the turn although the first request still exists…
        let next = g.take_turn("tf", "k").await;
        assert!(next.is_ok());
        // …and the first one's body can no longer complete.
        assert_eq!(held.body_progress(true), Err(HoldExpired));
        drop(next);
        drop(held);
        assert_eq!(g.turns.active_keys(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_complete_body_keeps_the_turn_until_the_request_ends() {
        let g = guard(Duration::from_secs(10), Duration::from_secs(30));
        let held = HeldTurn::start(g.take_turn("tf", "k").await.unwrap(), g.hold);
        assert_eq!(held.body_progress(true), Ok(()));
        tokio::time::sleep(Duration::from_secs(60)).await;
        // The upstream is still answering: the turn is not given up.
        assert_eq!(g.take_turn("tf", "k").await.err(), Some(Refusal::Busy));
        drop(held);
        assert!(g.take_turn("tf", "k").await.is_ok());
    }
}
