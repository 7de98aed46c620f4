//! The error every handler returns. Each variant knows its HTTP status and renders
//! a JSON body that says what is wrong without leaking internals or secrets; the
//! detail of 5xx errors goes to the server log only.

use bytes::Bytes;

use crate::store::{BlobError, DbError, StoreError};

/// The cluster API's degradation signal, byte for byte as the contract spells it.
const NOT_CONFIGURED_BODY: &[u8] = br#"{"error": "state sync not configured"}"#;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
    #[error("authentication required: send the workspace credential as the Basic-auth password or as a Bearer token")]
    Unauthenticated,
    #[error("{0}")]
    Refused(String),
    /// An authenticated operator whose role or workspace patterns do not allow the
    /// request: one fixed body whatever the reason (a missing action, another
    /// workspace, something site-wide), so a refusal tells nothing else.
    #[error("not permitted: your operator role does not allow this; nothing was done")]
    NotPermitted,
    #[error("{0}")]
    NotFound(String),
    #[error("method {method} is not allowed here; allowed: {allowed}")]
    MethodNotAllowed {
        method: String,
        allowed: &'static str,
    },
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: u64 },
    #[error("{0}")]
    Conflict(String),
    /// The client sent its body slower than the configured minimum rate.
    #[error("request body arrived too slowly (see body_read_timeout_seconds and body_min_bytes_per_second); nothing was changed")]
    SlowClient,
    /// Too much request-body memory in use right now: retry shortly.
    #[error("{0}")]
    Busy(String),
    /// Someone else holds the workspace lock: 423 with the holder's LockInfo verbatim
    /// (Terraform prints it, and `-lock-timeout` retries on 423).
    #[error("the workspace is locked by another client")]
    Locked { holder_info: Bytes },
    /// Cluster API: no token, or one nobody holds.
    #[error("authentication required: send an org admin token as `Authorization: Bearer <token>`")]
    TokenRequired,
    /// Admin API: no operator token, a wrong one or a revoked one (one identical body).
    #[error("authentication required: send an operator token as `Authorization: Bearer <token>`")]
    OperatorRequired,
    /// Cluster API: another admin holds the cluster's lease. `holder` is the lease as
    /// the API shows it (`holder_email`, `operation`, `host`, `acquired_at`,
    /// `heartbeat_age_seconds`); the body is those fields plus `error`.
    #[error("{message}")]
    LeaseHeld {
        message: String,
        holder: serde_json::Value,
    },
    /// Cluster API: a pushed state conflicts with the stored one (lineage, serial or
    /// content); the body names the stored serial and lineage.
    #[error("{message}")]
    PushConflict {
        message: String,
        stored_serial: Option<i64>,
        stored_lineage: Option<String>,
    },
    /// Terraform backend: the write guard refused the sent state (another lineage, a
    /// lower serial, or the current serial with different content). `facts` names what
    /// is stored, what was sent and how to proceed (metadata only, never content); the
    /// body is those fields plus `error`.
    #[error("{message}")]
    WriteRefused {
        message: String,
        facts: serde_json::Value,
    },
    /// Cluster API switched off (no `ADJ_STATE_ENC_KEY`): the contract's one
    /// degradation signal, with a fixed body.
    #[error("state sync not configured")]
    NotConfigured,
    /// Retryable: the blob store is unreachable or overloaded.
    #[error("{0}")]
    Unavailable(String),
    /// Not retryable by the client alone; the detail is logged, not sent.
    #[error("{public}")]
    Internal { public: String, detail: String },
}

impl Error {
    pub fn http_status(&self) -> u16 {
        match self {
            Error::Invalid(_) => 400,
            Error::Unauthenticated | Error::TokenRequired | Error::OperatorRequired => 401,
            Error::Refused(_) | Error::NotPermitted => 403,
            Error::NotFound(_) => 404,
            Error::MethodNotAllowed { .. } => 405,
            Error::SlowClient => 408,
            Error::Conflict(_)
            | Error::LeaseHeld { .. }
            | Error::PushConflict { .. }
            | Error::WriteRefused { .. } => 409,
            Error::Busy(_) => 429,
            Error::PayloadTooLarge { .. } => 413,
            Error::Locked { .. } => 423,
            Error::Unavailable(_) | Error::NotConfigured => 503,
            Error::Internal { .. } => 500,
        }
    }

    /// The response body: `{"error": "..."}`, plus the facts a variant carries; the
    /// protocol's own body where one is defined (LockInfo, the not-configured signal).
    pub fn body(&self) -> Bytes {
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
            other => serde_json::json!({ "error": other.to_string() }),
        };
        Bytes::from(json.to_string())
    }

    /// What goes to the server log (may contain internal detail, never secrets).
    pub fn log_detail(&self) -> Option<&str> {
        match self {
            Error::Internal { detail, .. } => Some(detail),
            Error::Unavailable(msg) => Some(msg),
            _ => None,
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Blob(BlobError::Unavailable(detail)) => {
                tracing::warn!(error = %detail, "blob store unavailable");
                Error::Unavailable("the state store is temporarily unavailable; retry".into())
            }
            StoreError::Contended => Error::Unavailable(e.to_string()),
            StoreError::VersionNotFound { .. } => Error::NotFound(e.to_string()),
            StoreError::Tombstone { .. }
            | StoreError::Moved { .. }
            | StoreError::SerialExhausted { .. }
            | StoreError::TooLargeToView { .. } => Error::Conflict(e.to_string()),
            StoreError::BlobMissing { version, .. } | StoreError::BlobUnreadable { version, .. } => {
                Error::Internal {
                    public: format!(
                        "state version {version} exists but cannot be read; refusing to answer \"no state\". See the server log."
                    ),
                    detail: e.to_string(),
                }
            }
            other => Error::Internal {
                public: "internal storage error; see the server log".into(),
                detail: other.to_string(),
            },
        }
    }
}

impl From<crate::names::InvalidName> for Error {
    fn from(e: crate::names::InvalidName) -> Self {
        Error::Invalid(e.to_string())
    }
}

impl From<DbError> for Error {
    fn from(e: DbError) -> Self {
        Error::from(StoreError::Db(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_wire_bodies() {
        let holder = serde_json::json!({
            "holder_email": "a@x",
            "operation": "provision",
            "host": "box",
            "acquired_at": "2026-01-01T00:00:00Z",
            "heartbeat_age_seconds": 40,
        });
        // (error, status, exact body)
        let table: Vec<(Error, u16, &str)> = vec![
            (
                Error::Locked {
                    holder_info: Bytes::from_static(br#"{"ID":"a", "Who":"me"}"#),
                },
                423,
                r#"{"ID":"a", "Who":"me"}"#,
            ),
            (
                Error::NotConfigured,
                503,
                r#"{"error": "state sync not configured"}"#,
            ),
            (
                Error::TokenRequired,
                401,
                r#"{"error":"authentication required: send an org admin token as `Authorization: Bearer <token>`"}"#,
            ),
            (
                Error::LeaseHeld {
                    message: "cannot lock: held".into(),
                    holder,
                },
                409,
                r#"{"acquired_at":"2026-01-01T00:00:00Z","error":"cannot lock: held","heartbeat_age_seconds":40,"holder_email":"a@x","host":"box","operation":"provision"}"#,
            ),
            (
                Error::PushConflict {
                    message: "stale".into(),
                    stored_serial: Some(5),
                    stored_lineage: Some("L".into()),
                },
                409,
                r#"{"error":"stale","stored_lineage":"L","stored_serial":5}"#,
            ),
            (Error::Conflict("taken".into()), 409, r#"{"error":"taken"}"#),
            (
                Error::NotFound("cluster not found".into()),
                404,
                r#"{"error":"cluster not found"}"#,
            ),
        ];
        for (err, status, body) in table {
            assert_eq!(err.http_status(), status, "{err:?}");
            assert_eq!(String::from_utf8_lossy(&err.body()), body, "{err:?}");
        }
    }
}
