//! The domain error: what went wrong in a domain call (`tofu`, `cluster`, `operator`,
//! `drift`, `store`, ...), in domain words. It knows nothing of HTTP: the one mapping
//! to a status code and a response body is `http::error`, and the CLI's mapping to
//! a message is `cli::output`. Messages say what is wrong without leaking internals
//! or secrets; the detail of an internal failure is kept apart for the server log.

use bytes::Bytes;

use crate::store::keyring::RingError;
use crate::store::{BlobError, DbError, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input is malformed or breaks a rule; nothing was done.
    #[error("{0}")]
    Invalid(String),
    /// Terraform backend: no workspace credential, or a wrong one.
    #[error("authentication required: no valid workspace credential was presented")]
    Unauthenticated,
    /// Authenticated, but this principal may not do this (the reason is the message).
    #[error("{0}")]
    Refused(String),
    /// An authenticated operator whose role or workspace patterns do not allow the
    /// request: one fixed message whatever the reason (a missing action, another
    /// workspace, something site-wide), so a refusal tells nothing else.
    #[error("not permitted: your operator role does not allow this; nothing was done")]
    NotPermitted,
    #[error("{0}")]
    NotFound(String),
    /// A state larger than the configured limit.
    #[error("the state is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("{0}")]
    Conflict(String),
    /// Someone else holds the workspace lock; `holder_info` is the holder's LockInfo
    /// verbatim.
    #[error("the workspace is locked by another client")]
    Locked { holder_info: Bytes },
    /// Cluster API: no org admin token, or one nobody holds.
    #[error("authentication required: no valid org admin token was presented")]
    TokenRequired,
    /// Operator surfaces: no operator token, a wrong one or a revoked one (one
    /// identical refusal).
    #[error("authentication required: no valid operator token was presented")]
    OperatorRequired,
    /// Cluster API: another admin holds the cluster's lease. `holder` is the lease as
    /// the API shows it (`holder_email`, `operation`, `host`, `acquired_at`,
    /// `heartbeat_age_seconds`).
    #[error("{message}")]
    LeaseHeld {
        message: String,
        holder: serde_json::Value,
    },
    /// Cluster API: a pushed state conflicts with the stored one (lineage, serial or
    /// content); names the stored serial and lineage.
    #[error("{message}")]
    PushConflict {
        message: String,
        stored_serial: Option<i64>,
        stored_lineage: Option<String>,
    },
    /// Terraform backend: the write guard refused the sent state (another lineage, a
    /// lower serial, or the current serial with different content). `facts` names what
    /// is stored, what was sent and how to proceed (metadata only, never content).
    #[error("{message}")]
    WriteRefused {
        message: String,
        facts: serde_json::Value,
    },
    /// Cluster API switched off (no `ADJ_STATE_ENC_KEY`).
    #[error("state sync not configured")]
    NotConfigured,
    /// Retryable: the blob store is unreachable or overloaded.
    #[error("{0}")]
    Unavailable(String),
    /// Not retryable by the client alone; `detail` is logged, `public` is shown.
    #[error("{public}")]
    Internal { public: String, detail: String },
}

impl Error {
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
            StoreError::Db(DbError::NotBegun(ref detail)) => {
                tracing::warn!(error = %detail, "the index could not begin a write");
                Error::Unavailable("the index is temporarily unavailable; retry".into())
            }
            StoreError::Db(DbError::Sql(ref sql)) if sql.is_connection_lost() => {
                tracing::warn!(error = %sql, "the index's database is unreachable");
                Error::Unavailable("the index is temporarily unavailable; retry".into())
            }
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

impl From<crate::crypto::off_thread::WorkerGone> for Error {
    fn from(_: crate::crypto::off_thread::WorkerGone) -> Self {
        Error::Internal {
            public: "internal error; nothing was written".into(),
            detail: "the body's hashing thread stopped before its digest".into(),
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

impl From<RingError> for Error {
    fn from(e: RingError) -> Self {
        match e {
            // A keyring rule said no (the newest, too soon after a rotation, still
            // needed, not in the ring): the message names why; nothing was changed.
            RingError::Refused(why) => Error::Conflict(why),
            RingError::Db(e) => Error::from(e),
            RingError::Blob(e) => Error::from(StoreError::Blob(e)),
            RingError::Key(e) => Error::Internal {
                public: "the key service failed; see the server log".into(),
                detail: e.to_string(),
            },
        }
    }
}
