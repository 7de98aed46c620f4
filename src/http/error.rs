//! The one mapping from errors to HTTP: the status code and the response body of
//! every domain [`Error`], and [`EdgeError`], what only the HTTP edge can run into
//! (a method a route does not take, a body too large or too slow, the body budget
//! spent). Only `http/` knows HTTP status codes: a domain module returns an
//! [`Error`] in its own words and this module decides what the client sees. Bodies
//! say what is wrong without leaking internals or secrets; the detail of a 5xx goes
//! to the server log only (see [`super::body::error_reply`]).

use bytes::Bytes;

use crate::error::Error;
use crate::store::{DbError, StoreError};

/// The cluster API's degradation signal, byte for byte as the contract spells it.
const NOT_CONFIGURED_BODY: &[u8] = br#"{"error": "state sync not configured"}"#;

/// How each refused credential is told where to send one (the header is HTTP's).
const WORKSPACE_CREDENTIAL_REQUIRED: &str = "authentication required: send the workspace credential as the Basic-auth password or as a Bearer token";
const ORG_TOKEN_REQUIRED: &str =
    "authentication required: send an org admin token as `Authorization: Bearer <token>`";
const OPERATOR_TOKEN_REQUIRED: &str =
    "authentication required: send an operator token as `Authorization: Bearer <token>`";

/// A request's failure as the edge sees it: a domain error, or one that only the
/// framing of an HTTP request can produce (the domain cannot express these).
#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error(transparent)]
    Domain(#[from] Error),
    #[error("method {method} is not allowed here; allowed: {allowed}")]
    MethodNotAllowed {
        method: String,
        allowed: &'static str,
    },
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: u64 },
    /// The client sent its body slower than the configured minimum rate.
    #[error("request body arrived too slowly (see body_read_timeout_seconds and body_min_bytes_per_second); nothing was changed")]
    SlowClient,
    /// Too much request-body memory in use right now: retry shortly.
    #[error("{0}")]
    Busy(String),
}

impl From<StoreError> for EdgeError {
    fn from(e: StoreError) -> Self {
        EdgeError::Domain(Error::from(e))
    }
}

impl From<DbError> for EdgeError {
    fn from(e: DbError) -> Self {
        EdgeError::Domain(Error::from(e))
    }
}

impl From<crate::names::InvalidName> for EdgeError {
    fn from(e: crate::names::InvalidName) -> Self {
        EdgeError::Domain(Error::from(e))
    }
}

/// An error as an HTTP answer: its status and its body.
pub trait HttpError {
    fn http_status(&self) -> u16;
    /// The response body: `{"error": "..."}`, plus the facts a variant carries; the
    /// protocol's own body where one is defined (LockInfo, the not-configured signal).
    fn body(&self) -> Bytes;
    /// What goes to the server log (may contain internal detail, never secrets).
    fn log_detail(&self) -> Option<&str>;
}

impl HttpError for Error {
    fn http_status(&self) -> u16 {
        match self {
            Error::Invalid(_) => 400,
            Error::Unauthenticated | Error::TokenRequired | Error::OperatorRequired => 401,
            Error::Refused(_) | Error::NotPermitted => 403,
            Error::NotFound(_) => 404,
            Error::Conflict(_)
            | Error::LeaseHeld { .. }
            | Error::PushConflict { .. }
            | Error::WriteRefused { .. } => 409,
            Error::TooLarge { .. } => 413,
            Error::Locked { .. } => 423,
            Error::Unavailable(_) | Error::NotConfigured => 503,
            Error::Internal { .. } => 500,
        }
    }

    fn body(&self) -> Bytes {
        let json = match self {
            Error::Locked { holder_info } => return holder_info.clone(),
            Error::NotConfigured => return Bytes::from_static(NOT_CONFIGURED_BODY),
            Error::LeaseHeld {
                message,
                holder: facts,
            }
            | Error::WriteRefused { message, facts } => {
                let mut body = facts.clone();
                if let Some(fields) = body.as_object_mut() {
                    fields.insert("error".into(), message.as_str().into());
                }
                body
            }
            Error::PushConflict {
                message,
                stored_serial,
                stored_lineage,
            } => serde_json::json!({
                "error": message,
                "stored_serial": stored_serial,
                "stored_lineage": stored_lineage,
            }),
            Error::Unauthenticated => error_json(WORKSPACE_CREDENTIAL_REQUIRED),
            Error::TokenRequired => error_json(ORG_TOKEN_REQUIRED),
            Error::OperatorRequired => error_json(OPERATOR_TOKEN_REQUIRED),
            Error::TooLarge { limit } => error_json(&too_large(*limit)),
            other => error_json(&other.to_string()),
        };
        Bytes::from(json.to_string())
    }

    fn log_detail(&self) -> Option<&str> {
        Error::log_detail(self)
    }
}

impl HttpError for EdgeError {
    fn http_status(&self) -> u16 {
        match self {
            EdgeError::Domain(e) => e.http_status(),
            EdgeError::MethodNotAllowed { .. } => 405,
            EdgeError::SlowClient => 408,
            EdgeError::PayloadTooLarge { .. } => 413,
            EdgeError::Busy(_) => 429,
        }
    }

    fn body(&self) -> Bytes {
        match self {
            EdgeError::Domain(e) => e.body(),
            EdgeError::PayloadTooLarge { limit } => {
                Bytes::from(error_json(&too_large(*limit)).to_string())
            }
            other => Bytes::from(error_json(&other.to_string()).to_string()),
        }
    }

    fn log_detail(&self) -> Option<&str> {
        match self {
            EdgeError::Domain(e) => e.log_detail(),
            _ => None,
        }
    }
}

fn error_json(message: &str) -> serde_json::Value {
    serde_json::json!({ "error": message })
}

/// A body or state over the limit reads the same whichever side refused it.
fn too_large(limit: u64) -> String {
    format!("request body is larger than the limit of {limit} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every domain variant and every edge variant, with its status; the match makes
    /// a new variant fail to compile here until it is given one.
    #[test]
    fn every_variant_maps_to_its_status() {
        let domain = |e: &Error| match e {
            Error::Invalid(_)
            | Error::Unauthenticated
            | Error::Refused(_)
            | Error::NotPermitted
            | Error::NotFound(_)
            | Error::TooLarge { .. }
            | Error::Conflict(_)
            | Error::Locked { .. }
            | Error::TokenRequired
            | Error::OperatorRequired
            | Error::LeaseHeld { .. }
            | Error::PushConflict { .. }
            | Error::WriteRefused { .. }
            | Error::NotConfigured
            | Error::Unavailable(_)
            | Error::Internal { .. } => (),
        };
        let table: Vec<(EdgeError, u16)> = vec![
            (Error::Invalid("x".into()).into(), 400),
            (Error::Unauthenticated.into(), 401),
            (Error::TokenRequired.into(), 401),
            (Error::OperatorRequired.into(), 401),
            (Error::Refused("x".into()).into(), 403),
            (Error::NotPermitted.into(), 403),
            (Error::NotFound("x".into()).into(), 404),
            (Error::Conflict("x".into()).into(), 409),
            (
                Error::LeaseHeld {
                    message: "x".into(),
                    holder: serde_json::json!({}),
                }
                .into(),
                409,
            ),
            (
                Error::PushConflict {
                    message: "x".into(),
                    stored_serial: None,
                    stored_lineage: None,
                }
                .into(),
                409,
            ),
            (
                Error::WriteRefused {
                    message: "x".into(),
                    facts: serde_json::json!({}),
                }
                .into(),
                409,
            ),
            (Error::TooLarge { limit: 1 }.into(), 413),
            (
                Error::Locked {
                    holder_info: Bytes::new(),
                }
                .into(),
                423,
            ),
            (Error::NotConfigured.into(), 503),
            (Error::Unavailable("x".into()).into(), 503),
            (
                Error::Internal {
                    public: "x".into(),
                    detail: "y".into(),
                }
                .into(),
                500,
            ),
            (
                EdgeError::MethodNotAllowed {
                    method: "GET".into(),
                    allowed: "PUT",
                },
                405,
            ),
            (EdgeError::SlowClient, 408),
            (EdgeError::PayloadTooLarge { limit: 1 }, 413),
            (EdgeError::Busy("x".into()), 429),
        ];
        for (err, status) in &table {
            if let EdgeError::Domain(e) = err {
                domain(e);
                assert_eq!(e.http_status(), *status, "{e:?}");
            }
            assert_eq!(err.http_status(), *status, "{err:?}");
        }
        // Every domain variant is in the table (16 of them, the match above lists each).
        let domain_rows = table
            .iter()
            .filter(|(e, _)| matches!(e, EdgeError::Domain(_)))
            .count();
        assert_eq!(domain_rows, 16);
    }

    /// The boundary, checked on the source: outside `http/` nothing names the mapping
    /// or the edge error, and no match arm yields a status code; `error.rs` has none.
    #[test]
    fn only_http_knows_http_statuses() {
        /// `=> 404`-like arms: a status chosen by a match.
        fn status_arm(line: &str) -> bool {
            line.match_indices("=>").any(|(i, _)| {
                let rest = line[i + 2..].trim_start().as_bytes();
                rest.len() >= 3
                    && (b'1'..=b'5').contains(&rest[0])
                    && rest[1..3].iter().all(u8::is_ascii_digit)
                    && rest
                        .get(3)
                        .is_none_or(|c| !c.is_ascii_alphanumeric() && *c != b'_')
            })
        }
        let http = crate::source_root().join("http");
        for (file, text) in crate::source_files()
            .iter()
            .filter(|(f, _)| !f.starts_with(&http))
        {
            for (n, line) in text.lines().enumerate() {
                let at = format!("{}:{}", file.display(), n + 1);
                for word in ["http_status", "HttpError", "EdgeError"] {
                    assert!(!line.contains(word), "{at} names {word}: {line}");
                }
                assert!(!status_arm(line), "{at} maps to a status: {line}");
            }
        }
        let domain = std::fs::read_to_string(crate::source_root().join("error.rs")).unwrap();
        assert!(!domain.contains("u16"), "error.rs holds no status");
        assert!(
            status_arm("Error::X => 404,") && !status_arm("x => 4000") && !status_arm("x => 40")
        );
    }

    #[test]
    fn wire_bodies() {
        let holder = serde_json::json!({
            "holder_email": "a@x",
            "operation": "provision",
            "host": "box",
            "acquired_at": "2026-01-01T00:00:00Z",
            "heartbeat_age_seconds": 40,
        });
        // (error, exact body)
        let table: Vec<(EdgeError, &str)> = vec![
            (
                Error::Locked {
                    holder_info: Bytes::from_static(br#"{"ID":"a", "Who":"me"}"#),
                }
                .into(),
                r#"{"ID":"a", "Who":"me"}"#,
            ),
            (
                Error::NotConfigured.into(),
                r#"{"error": "state sync not configured"}"#,
            ),
            (
                Error::TokenRequired.into(),
                r#"{"error":"authentication required: send an org admin token as `Authorization: Bearer <token>`"}"#,
            ),
            (
                Error::OperatorRequired.into(),
                r#"{"error":"authentication required: send an operator token as `Authorization: Bearer <token>`"}"#,
            ),
            (
                Error::Unauthenticated.into(),
                r#"{"error":"authentication required: send the workspace credential as the Basic-auth password or as a Bearer token"}"#,
            ),
            (
                Error::LeaseHeld {
                    message: "cannot lock: held".into(),
                    holder,
                }
                .into(),
                r#"{"acquired_at":"2026-01-01T00:00:00Z","error":"cannot lock: held","heartbeat_age_seconds":40,"holder_email":"a@x","host":"box","operation":"provision"}"#,
            ),
            (
                Error::PushConflict {
                    message: "stale".into(),
                    stored_serial: Some(5),
                    stored_lineage: Some("L".into()),
                }
                .into(),
                r#"{"error":"stale","stored_lineage":"L","stored_serial":5}"#,
            ),
            (
                Error::Conflict("taken".into()).into(),
                r#"{"error":"taken"}"#,
            ),
            (
                Error::NotFound("cluster not found".into()).into(),
                r#"{"error":"cluster not found"}"#,
            ),
            (
                Error::TooLarge { limit: 10 }.into(),
                r#"{"error":"request body is larger than the limit of 10 bytes"}"#,
            ),
            (
                EdgeError::PayloadTooLarge { limit: 10 },
                r#"{"error":"request body is larger than the limit of 10 bytes"}"#,
            ),
            (
                EdgeError::MethodNotAllowed {
                    method: "POST".into(),
                    allowed: "GET",
                },
                r#"{"error":"method POST is not allowed here; allowed: GET"}"#,
            ),
            (
                EdgeError::SlowClient,
                r#"{"error":"request body arrived too slowly (see body_read_timeout_seconds and body_min_bytes_per_second); nothing was changed"}"#,
            ),
            (
                Error::Internal {
                    public: "see the log".into(),
                    detail: "secret path".into(),
                }
                .into(),
                r#"{"error":"see the log"}"#,
            ),
        ];
        for (err, body) in table {
            assert_eq!(String::from_utf8_lossy(&err.body()), body, "{err:?}");
        }
    }
}
