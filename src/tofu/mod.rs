//! The OpenTofu/Terraform HTTP state backend: GET, POST (?ID=), LOCK, UNLOCK, DELETE.
//!
//! Handlers take plain values (workspace, lock id, body bytes) and return plain
//! results; HTTP framing lives in `http`. One file per job of [`TofuBackend`]:
//! `authenticate` (who is asking), `writing` (the write path, DELETE, rollback,
//! restore), `locking` (LOCK, UNLOCK, force-unlock, leases), `freezing`, `moving`, and
//! `client_env`. The rules and each table's SQL live beside them: `lock`, `guard`,
//! `freeze`, `moves`, `posture`, `credentials`, `ci_identity`, `run_credential`. This
//! file holds the service, its audit events and the workspace scope. Every check that
//! decides whether a write may proceed runs again inside the commit transaction.

pub mod access;
pub mod certificate;
pub mod ci_identity;
pub mod credentials;
pub mod freeze;
pub mod guard;
pub mod lock;
pub mod moves;
pub mod outputs;
pub mod posture;
pub mod protocol;
pub mod run_credential;

mod authenticate;
mod client_env;
mod freezing;
mod locking;
mod moving;
mod writing;

pub use client_env::{client_env, client_vars};
pub use freezing::Frozen;
use freezing::*;
use locking::*;
pub use locking::{ExpiredLock, LockSeen};
pub use moving::{MoveDone, MovedSide};
use writing::*;

use std::sync::{Arc, Mutex};

use crate::store::sql::Connection;
use bytes::Bytes;

use crate::crypto::off_thread::OffThreadHash;
use crate::crypto::RootKey;
use crate::error::Error;
use crate::store::db::in_write_transaction;
use crate::store::history::{Rollback, RolledBack};
use crate::store::{
    audit::{insert_audit, AuditEntry},
    BodyCheck, BodyChunks, BodyMeta, DbError, NewVersion, StateStore, StateStream, StoreError,
    StreamedVersion, WriteOutcome,
};
use crate::store::{VersionRow, WriteFacts};
pub use access::Credential;
use freeze::Freeze;
use guard::{decide_successor, Override, Refusal, Sent, Successor};
pub use lock::SCHEMA;
use lock::{
    decide_lock, decide_unlock, decide_write, held_lock, holders, HeldLock, Holders, Lock, Unlock,
};
use protocol::{parse_lock_info, UnlockRequest};

/// Largest LockInfo body accepted.
pub const MAX_LOCK_BODY: u64 = 64 * 1024;

#[derive(Clone)]
pub struct TofuBackend {
    store: StateStore,
    /// For this module's own table (`tf_locks`); versions go through `store`.
    db: crate::store::Db,
    root: RootKey,
    /// When each issued workspace token was last used, until the next flush.
    last_used: credentials::LastUsed,
    /// `tofu.refuse_plaintext_after_encrypted` (`posture`).
    downgrade: Arc<posture::DowngradePolicy>,
    /// The CI issuers whose job tokens are credentials (`[[ci_identity]]`).
    ci: Arc<ci_identity::CiIdentities>,
    /// Leases on the locks of gone credentials (`[[lock_policy]]`).
    leases: Arc<lock::LeasePolicies>,
}

/// Audit event of an operator rollback (payload: versions and serial, never content).
pub const EVENT_ROLLBACK: &str = "tf.rollback";

/// What every workspace's version-index scope starts with: the one rule, which SQL that
/// joins workspaces to their versions binds as a parameter instead of repeating it.
pub const SCOPE_PREFIX: &str = "tf/";

/// Version-index scope of a workspace's state.
pub fn scope(workspace: &str) -> String {
    format!("{SCOPE_PREFIX}{workspace}")
}

/// Audit events of the workspace backend (payloads are metadata, never state content).
pub const EVENT_WRITTEN: &str = "tf.state_written";
pub const EVENT_DELETED: &str = "tf.state_deleted";
pub const EVENT_LOCKED: &str = "tf.lock_acquired";
pub const EVENT_UNLOCKED: &str = "tf.lock_released";
/// An unlock without the holder's ID: Terraform's `force-unlock`, or an operator's.
pub const EVENT_FORCE_UNLOCKED: &str = "tf.lock_forced";
/// An operator undid a DELETE by rolling the last live version forward.
pub const EVENT_RESTORED: &str = "tf.restored";
/// An operator allowed one write the guard would refuse (payload: reason, expiry).
pub const EVENT_WRITE_ALLOWED: &str = "tf.write_allowed";
/// A write the guard would have refused went through on an operator's override
/// (payload: why it was refused, stored and sent serial/lineage, who allowed it).
pub const EVENT_OVERRIDE_USED: &str = "tf.write_override_used";

/// An operator froze a workspace (payload: reason, until, whom it replaced).
pub const EVENT_FROZEN: &str = "tf.frozen";
/// An operator lifted a freeze (payload: the freeze lifted).
pub const EVENT_UNFROZEN: &str = "tf.unfrozen";
/// A freeze's `until` passed and stategate noticed (actor [`HOUSEKEEPING`]).
pub const EVENT_FREEZE_EXPIRED: &str = "tf.freeze_expired";
/// An operator moved resources from one workspace to another (one event, naming both
/// new versions; recorded under the source's scope).
pub const EVENT_RESOURCES_MOVED: &str = "tf.resources_moved";
/// The actor of what stategate does by itself (a freeze's expiry).
pub const HOUSEKEEPING: &str = "stategate";
/// The locks of a move whose process is gone were released (actor [`HOUSEKEEPING`]).
pub const EVENT_MOVE_ABANDONED: &str = "tf.move_abandoned";
/// A lease released the idle lock of a gone credential (actor [`HOUSEKEEPING`];
/// payload: the holder, the credential that took it, why it is gone, idle time, lease).
pub const EVENT_LOCK_EXPIRED: &str = "tf.lock_expired";

/// An audit row of `workspace` by `actor`, the name of the credential that acted
/// ([`Credential::name`]) or the operator.
fn audit(
    actor: &str,
    workspace: &str,
    event: &'static str,
    payload: serde_json::Value,
) -> AuditEntry {
    AuditEntry::new(actor, scope(workspace), event, payload)
}

fn unix_now() -> i64 {
    crate::tokens::now()
}

impl TofuBackend {
    pub fn new(store: StateStore, root: RootKey) -> Self {
        TofuBackend {
            db: store.index_handle(),
            store,
            root,
            last_used: credentials::LastUsed::default(),
            downgrade: Arc::default(),
            ci: Arc::default(),
            leases: Arc::default(),
        }
    }

    /// Releases, in housekeeping, the idle locks of gone credentials on the
    /// workspaces `policies` names (`[[lock_policy]]`, [`Self::expire_leased_locks`]).
    pub fn with_lease_policies(mut self, policies: lock::LeasePolicies) -> Self {
        self.leases = Arc::new(policies);
        self
    }

    /// The lease policies in force.
    pub fn lease_policies(&self) -> &lock::LeasePolicies {
        &self.leases
    }

    /// Accepts the job tokens of these CI issuers (`[[ci_identity]]`).
    pub fn with_ci_identities(mut self, ci: ci_identity::CiIdentities) -> Self {
        self.ci = Arc::new(ci);
        self
    }

    /// Refuses plaintext writes onto encrypted current states of the workspaces
    /// `policy` names (`tofu.refuse_plaintext_after_encrypted`).
    pub fn with_downgrade_policy(mut self, policy: posture::DowngradePolicy) -> Self {
        self.downgrade = Arc::new(policy);
        self
    }

    pub fn store(&self) -> &StateStore {
        &self.store
    }
}
