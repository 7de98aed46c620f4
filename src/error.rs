//! The error every handler returns. Each variant knows its HTTP status and renders
//! a JSON body that says what is wrong without leaking internals or secrets; the
//! detail of 5xx errors goes to the server log only.

use bytes::Bytes;

use crate::store::{BlobError, DbError, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("authentication required: send the workspace credential as the Basic-auth password or as a Bearer token")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
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
    /// Too much request-body memory in use right now: retry shortly.
    #[error("{0}")]
    Busy(String),
    /// A rejection whose body is defined by the protocol (e.g. the lock holder's LockInfo).
    #[error("rejected with status {status}")]
    WithBody { status: u16, body: Bytes },
    /// Retryable: the blob store is unreachable or overloaded.
    #[error("{0}")]
    Unavailable(String),
    /// Not retryable by the client alone; the detail is logged, not sent.
    #[error("{public}")]
    Internal { public: String, detail: String },
}

impl ApiError {
    pub fn http_status(&self) -> u16 {
        match self {
            ApiError::BadRequest(_) => 400,
            ApiError::Unauthorized => 401,
            ApiError::Forbidden(_) => 403,
            ApiError::NotFound(_) => 404,
            ApiError::MethodNotAllowed { .. } => 405,
            ApiError::Conflict(_) => 409,
            ApiError::Busy(_) => 429,
            ApiError::PayloadTooLarge { .. } => 413,
            ApiError::WithBody { status, .. } => *status,
            ApiError::Unavailable(_) => 503,
            ApiError::Internal { .. } => 500,
        }
    }

    /// The response body: protocol-defined for `WithBody`, else `{"error": "..."}`.
    pub fn body(&self) -> Bytes {
        match self {
            ApiError::WithBody { body, .. } => body.clone(),
            other => Bytes::from(serde_json::json!({ "error": other.to_string() }).to_string()),
        }
    }

    /// What goes to the server log (may contain internal detail, never secrets).
    pub fn log_detail(&self) -> Option<&str> {
        match self {
            ApiError::Internal { detail, .. } => Some(detail),
            ApiError::Unavailable(msg) => Some(msg),
            _ => None,
        }
    }

    pub fn json(status: u16, value: serde_json::Value) -> ApiError {
        ApiError::WithBody {
            status,
            body: Bytes::from(value.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Blob(BlobError::Unavailable(detail)) => {
                tracing::warn!(error = %detail, "blob store unavailable");
                ApiError::Unavailable("the state store is temporarily unavailable; retry".into())
            }
            StoreError::Contended => ApiError::Unavailable(e.to_string()),
            StoreError::VersionNotFound { .. } => ApiError::NotFound(e.to_string()),
            StoreError::Tombstone { .. } | StoreError::Moved { .. } => {
                ApiError::Conflict(e.to_string())
            }
            StoreError::BlobMissing { version, .. } | StoreError::BlobUnreadable { version, .. } => {
                ApiError::Internal {
                    public: format!(
                        "state version {version} exists but cannot be read; refusing to answer \"no state\". See the server log."
                    ),
                    detail: e.to_string(),
                }
            }
            other => ApiError::Internal {
                public: "internal storage error; see the server log".into(),
                detail: other.to_string(),
            },
        }
    }
}

impl From<crate::names::InvalidName> for ApiError {
    fn from(e: crate::names::InvalidName) -> Self {
        ApiError::BadRequest(e.to_string())
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        ApiError::from(StoreError::Db(e))
    }
}
