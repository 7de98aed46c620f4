//! Makes conditional PUTs through the pass-through atomic, whatever the store does.
//!
//! Terraform's own `backend "s3"` with `use_lockfile = true` takes its lock by PUTting
//! `<key>.tflock` with `If-None-Match: *`. Garage ignores that header (a second
//! writer silently wins), so two applies can both "hold" the lock and lose updates.
//! For a PUT carrying `If-None-Match: *` or `If-Match`, stategate takes a per-key
//! turn, checks the object itself (HEAD with its own credentials), answers
//! `412 PreconditionFailed` when the condition fails, and otherwise forwards the PUT
//! while still holding the turn, so no two conditional writes to one key interleave.
//! This is atomic for every client that goes through stategate.

use std::sync::Arc;

use crate::store::s3::S3Store;
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
}

pub struct ConditionalGuard {
    store: Arc<S3Store>,
    turns: KeyedTurns<(String, String)>,
}

impl ConditionalGuard {
    pub fn new(store: Arc<S3Store>) -> Self {
        ConditionalGuard {
            store,
            turns: KeyedTurns::new(),
        }
    }

    /// Waits for the key's turn and checks the condition. On success the returned turn
    /// must be held until the forwarded PUT has completed.
    pub async fn enter(
        &self,
        bucket: &str,
        key: &str,
        condition: &Precondition,
    ) -> Result<KeyTurn, Refusal> {
        let turn = self.turns.wait((bucket.to_string(), key.to_string())).await;
        let current = self
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
            Ok(turn)
        } else {
            Err(Refusal::Failed)
        }
    }
}

/// `/bucket/key…` of a path-style request, with the key percent-decoded.
pub fn bucket_and_key(path: &str) -> Option<(String, String)> {
    let (bucket, key) = path.trim_start_matches('/').split_once('/')?;
    let key = super::upstream::percent_decode(key);
    (!bucket.is_empty() && !key.is_empty()).then(|| (bucket.to_string(), key))
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

    #[test]
    fn bucket_keys() {
        assert_eq!(
            bucket_and_key("/b/dir/state.tflock"),
            Some(("b".into(), "dir/state.tflock".into()))
        );
        assert_eq!(
            bucket_and_key("/b/a%20b%2Bc"),
            Some(("b".into(), "a b+c".into()))
        );
        assert_eq!(bucket_and_key("/b/"), None);
        assert_eq!(bucket_and_key("/b"), None);
    }
}
