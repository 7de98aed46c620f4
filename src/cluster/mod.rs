//! The cluster tfstate & lock API (contract and client docs: `docs/cluster-api.md`).
//!
//! Org-scoped admin routes around a provisioning CLI's `tofu` runs: acquire the
//! cluster's lease, pull state, heartbeat, push state, release. State versions live on
//! the same engine as the workspace backend (immutable sealed blobs + index rows,
//! scope `cluster/<uuid>`, sealed under a key derived from `ADJ_STATE_ENC_KEY`);
//! leases are rows in `cluster_leases`. Every rule that decides whether a push may be
//! stored (lock holder, lineage, serial, content) runs again inside the commit
//! transaction through the engine's `WriteGuard`.
//!
//! Handlers take plain values (the presented token, the cluster id, body bytes) and
//! return plain results; HTTP framing lives in `http::cluster`.

pub mod clock;
pub mod identity;
pub mod lease;

use std::sync::Arc;

use crate::store::sql::Connection;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::config::ClusterConfig;
use crate::crypto::RootKey;
use crate::error::Error;
use crate::store::audit::{insert_audit, AuditEntry};
use crate::store::{DbError, NewVersion, StateStore, VersionRow, WriteOutcome};
use crate::tfstate::parse_state;
pub use clock::{Clock, SystemClock, TestClock};
pub use identity::{Principal, Role, SCHEMA};
use lease::{current_lease, held_by_other, Acquire, Release};

/// Largest tfstate plaintext a PUT may carry (10 MiB; exactly 10 MiB is accepted).
pub const MAX_STATE_BYTES: u64 = 10 * 1024 * 1024;

/// The same body for a missing cluster, another org's cluster and a malformed id.
pub const NOT_FOUND_MESSAGE: &str = "cluster not found";

pub const EVENT_PUSHED: &str = "cluster.state_pushed";
pub const EVENT_ACQUIRED: &str = "cluster.state_lock_acquired";
pub const EVENT_RELEASED: &str = "cluster.state_lock_released";
pub const EVENT_STOLEN: &str = "cluster.state_lock_stolen";
pub const EVENT_BROKEN: &str = "cluster.state_lock_broken";

/// What every cluster's version-index scope starts with.
pub const SCOPE_PREFIX: &str = "cluster/";

/// Version-index scope of a cluster's state.
pub fn scope(cluster_id: &str) -> String {
    format!("{SCOPE_PREFIX}{cluster_id}")
}

fn not_found() -> Error {
    Error::NotFound(NOT_FOUND_MESSAGE.into())
}

fn db_err(e: crate::store::sql::Error) -> Error {
    Error::from(DbError::from(e))
}

/// A caller cleared to act on one cluster: authenticated, an admin of the cluster's
/// org, and the feature is configured.
#[derive(Clone)]
pub struct Authorized {
    pub principal: Principal,
    /// Canonical (lowercase, hyphenated) UUID.
    pub cluster_id: String,
    key: RootKey,
}

impl Authorized {
    fn scope(&self) -> String {
        scope(&self.cluster_id)
    }

    fn audit(&self, event: &'static str, payload: serde_json::Value) -> AuditEntry {
        AuditEntry::new(self.principal.email.clone(), self.scope(), event, payload)
            .in_org(self.principal.org.clone())
    }
}

/// The current state of a cluster as GET returns it.
#[derive(Debug, Clone)]
pub struct StoredState {
    pub row: VersionRow,
    pub body: Vec<u8>,
}

impl StoredState {
    /// The documented response headers naming the stored version.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let row = &self.row;
        let mut out = Vec::with_capacity(5);
        if let Some(serial) = row.serial {
            out.push(("X-Stategate-Serial", serial.to_string()));
        }
        if let Some(lineage) = &row.lineage {
            out.push(("X-Stategate-Lineage", header_safe(lineage)));
        }
        out.push(("X-Stategate-Version", row.version.to_string()));
        if let Some(sha) = &row.sha256 {
            out.push(("ETag", format!("\"{sha}\"")));
        }
        if let Some(date) = clock::http_date(&row.created_at) {
            out.push(("Last-Modified", date));
        }
        out
    }
}

/// A stored value as a header value. Lineages are printable ASCII since they are
/// validated on write; one stored before that rule is percent-encoded rather than
/// breaking every later GET of the cluster.
fn header_safe(text: &str) -> String {
    if text.bytes().all(|b| b.is_ascii_graphic() && b != b'%') {
        return text.to_string();
    }
    text.bytes()
        .map(|b| {
            if b.is_ascii_graphic() && b != b'%' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The conflict rules of PUT against the newest stored version. Pure; runs before the
/// blob upload and again inside the commit transaction.
pub fn check_push(
    stored: Option<&VersionRow>,
    serial: i64,
    lineage: &str,
    sha256: &str,
) -> Result<(), Error> {
    let Some(stored) = stored.filter(|r| !r.is_tombstone()) else {
        return Ok(()); // nothing stored yet
    };
    let stored_serial = stored.serial.unwrap_or(-1);
    let stored_lineage = stored.lineage.as_deref().unwrap_or("");
    let conflict = |message: String| Error::PushConflict {
        message,
        stored_serial: stored.serial,
        stored_lineage: stored.lineage.clone(),
    };
    if stored_lineage != lineage {
        return Err(conflict(format!(
            "lineage mismatch: the stored state has lineage {stored_lineage:?}, the pushed state {lineage:?}; nothing was stored"
        )));
    }
    if stored_serial > serial {
        return Err(conflict(format!(
            "stale state: the stored serial {stored_serial} is newer than the pushed serial {serial}; pull, re-apply and push again"
        )));
    }
    if stored_serial == serial && stored.sha256.as_deref() != Some(sha256) {
        return Err(conflict(format!(
            "serial {serial} is already stored with different content; a changed state needs a higher serial"
        )));
    }
    Ok(()) // higher serial, or the identical content again (an idempotent retry)
}

/// Does `principal_id` hold the lease of `cluster_id`? Usable inside a write transaction.
fn check_holder(
    conn: &Connection,
    cluster_id: &str,
    principal_id: i64,
    now: i64,
    what: &str,
) -> Result<(), Error> {
    match current_lease(conn, cluster_id).map_err(db_err)? {
        Some(lease) if lease.holder_id == principal_id => Ok(()),
        Some(lease) => Err(held_by_other(&lease, now, what)),
        None => Err(Error::Conflict(format!(
            "{what}: you do not hold this cluster's state lock (it was never taken, released or broken); acquire it with POST /v1/clusters/<id>/lock first"
        ))),
    }
}

#[derive(Clone)]
pub struct ClusterService {
    store: StateStore,
    /// For this module's own tables (identities, leases); versions go through `store`.
    db: crate::store::Db,
    /// `None` when `ADJ_STATE_ENC_KEY` is not configured: every route answers 503.
    key: Option<RootKey>,
    clock: Arc<dyn Clock>,
    stale_after: i64,
    heartbeat_seconds: u64,
}

impl ClusterService {
    /// `key`: the `ADJ_STATE_ENC_KEY` root (`installation::load_cluster_key`); `None` turns
    /// the API off (503 after authentication).
    pub fn new(
        store: StateStore,
        key: Option<RootKey>,
        config: &ClusterConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        ClusterService {
            db: store.index_handle(),
            store,
            key,
            clock,
            stale_after: i64::try_from(config.lease_stale_seconds).unwrap_or(i64::MAX),
            heartbeat_seconds: config.heartbeat_seconds,
        }
    }

    pub fn store(&self) -> &StateStore {
        &self.store
    }

    pub fn is_configured(&self) -> bool {
        self.key.is_some()
    }

    /// Advice for clients: how often to heartbeat (sent as a response header on lock).
    pub fn heartbeat_seconds(&self) -> u64 {
        self.heartbeat_seconds
    }

    /// A lease without heartbeat for longer than this may be taken over.
    pub fn stale_seconds(&self) -> i64 {
        self.stale_after
    }

    /// Auth, org scoping, role, then the feature flag, in the contract's order:
    /// no/unknown token → 401; a cluster that is missing, malformed or another org's →
    /// 404 (one identical body, one identical lookup); a member → 403; no key → 503.
    pub async fn authorize(
        &self,
        token: Option<Vec<u8>>,
        cluster_id: Option<uuid::Uuid>,
    ) -> Result<Authorized, Error> {
        let Some(token) = token else {
            return Err(Error::TokenRequired);
        };
        // An id that is not a UUID still costs the same lookup as a missing one (no
        // cluster is registered under the empty id).
        let canonical = cluster_id.map(|u| u.hyphenated().to_string());
        let lookup = canonical.clone().unwrap_or_default();
        let (principal, in_org) = self
            .db
            .read(move |conn| {
                let Some(principal) = identity::principal_by_token(conn, &token)? else {
                    return Ok((None, false));
                };
                let in_org = identity::cluster_in_org(conn, &lookup, principal.org_id)?;
                Ok((Some(principal), in_org))
            })
            .await?;
        let Some(principal) = principal else {
            return Err(Error::TokenRequired);
        };
        let cluster_id = match canonical {
            Some(id) if in_org => id,
            _ => return Err(not_found()),
        };
        if principal.role != Role::Admin {
            return Err(Error::Refused(format!(
                "{} is a member of org {:?}, not an admin: cluster state and locks need an org admin",
                principal.email, principal.org
            )));
        }
        let Some(key) = self.key.clone() else {
            return Err(Error::NotConfigured);
        };
        Ok(Authorized {
            principal,
            cluster_id,
            key,
        })
    }

    /// The current state; `None` when nothing was pushed yet (never when it exists but is unreadable).
    pub async fn get_state(&self, who: &Authorized) -> Result<Option<StoredState>, Error> {
        let scope = who.scope();
        let current = self
            .store
            .read_current(&scope, &who.key.blob_key(&scope))
            .await?;
        Ok(current.map(|(row, body)| StoredState { row, body }))
    }

    /// PUT step 2, before the body is read: the caller must hold the lock.
    pub async fn require_holder(&self, who: &Authorized) -> Result<(), Error> {
        let id = who.cluster_id.clone();
        let me = who.principal.id;
        let now = self.clock.now();
        self.db
            .read(move |conn| Ok(check_holder(conn, &id, me, now, "push rejected")))
            .await??;
        Ok(())
    }

    /// PUT steps 3-5: size, parse, then the lock and conflict rules inside the commit.
    /// Returns the pushed serial (also for an idempotent no-op).
    pub async fn put_state(&self, who: &Authorized, body: Bytes) -> Result<i64, Error> {
        if body.len() as u64 > MAX_STATE_BYTES {
            return Err(Error::TooLarge {
                limit: MAX_STATE_BYTES,
            });
        }
        let meta = parse_state(&body)?;
        let scope = who.scope();
        let sha256 = hex::encode(Sha256::digest(&body));
        let new = NewVersion {
            scope: scope.clone(),
            serial: Some(meta.serial),
            lineage: Some(meta.lineage.clone()),
            actor: who.principal.email.clone(),
            audit: Some(who.audit(
                EVENT_PUSHED,
                serde_json::json!({ "serial": meta.serial, "size": body.len() }),
            )),
            plaintext: body,
            facts: Default::default(),
            resources: None,
        };
        let id = who.cluster_id.clone();
        let me = who.principal.id;
        let clock = self.clock.clone();
        let (serial, lineage) = (meta.serial, meta.lineage);
        let outcome = self
            .store
            .write_version(new, &who.key.blob_key(&scope), move |conn, latest| {
                check_holder(conn, &id, me, clock.now(), "push rejected")?;
                check_push(latest, serial, &lineage, &sha256)
            })
            .await?;
        if let WriteOutcome::Unchanged(_) = outcome {
            tracing::debug!(cluster = %who.cluster_id, serial, "identical push: no-op");
        }
        Ok(serial)
    }

    /// Acquire (or refresh, or take over a stale) lease. Returns `acquired_at` (RFC 3339).
    pub async fn lock(&self, who: &Authorized, body: &[u8]) -> Result<String, Error> {
        let request = lease::parse_lock_request(body)?;
        let now = self.clock.now();
        let stale_after = self.stale_after;
        let who = who.clone();
        self.db
            .write(move |conn| -> Result<String, Error> {
                let id = &who.cluster_id;
                let current = current_lease(conn, id).map_err(db_err)?;
                let decision =
                    lease::decide_acquire(current.as_ref(), who.principal.id, now, stale_after);
                let audit = match (decision, &current) {
                    (Acquire::Refuse, Some(holder)) => {
                        return Err(held_by_other(holder, now, "cannot acquire the lock"))
                    }
                    (Acquire::Steal, Some(previous)) => who.audit(
                        EVENT_STOLEN,
                        serde_json::json!({
                            "operation": request.operation.as_str(),
                            "host": request.host,
                            "previous_holder": previous.holder_json(now),
                        }),
                    ),
                    _ => who.audit(
                        EVENT_ACQUIRED,
                        serde_json::json!({
                            "operation": request.operation.as_str(),
                            "host": request.host,
                            "refreshed": decision == Acquire::Refresh,
                        }),
                    ),
                };
                lease::put_lease(conn, id, who.principal.id, &request, now).map_err(db_err)?;
                insert_audit(conn, &audit).map_err(db_err)?;
                Ok(clock::rfc3339(now))
            })
            .await
    }

    /// Holder only: extends the lease. Anyone else (or nobody holding) → 409, lock lost.
    pub async fn heartbeat(&self, who: &Authorized) -> Result<(), Error> {
        let now = self.clock.now();
        let id = who.cluster_id.clone();
        let me = who.principal.id;
        self.db
            .write(move |conn| -> Result<(), Error> {
                check_holder(conn, &id, me, now, "lock lost")?;
                lease::touch_lease(conn, &id, now).map_err(db_err)
            })
            .await
    }

    /// Holder-only idempotent release; with `force`, any org admin breaks any lease (audited).
    pub async fn unlock(&self, who: &Authorized, force: bool) -> Result<(), Error> {
        let now = self.clock.now();
        let who = who.clone();
        self.db
            .write(move |conn| -> Result<(), Error> {
                let id = &who.cluster_id;
                let current = current_lease(conn, id).map_err(db_err)?;
                match (lease::decide_release(current.as_ref(), who.principal.id, force), current) {
                    (Release::Nothing, _) | (_, None) => Ok(()),
                    (Release::Refuse, Some(holder)) => Err(held_by_other(
                        &holder,
                        now,
                        "cannot release another admin's lock (an org admin can break it with ?force=1)",
                    )),
                    (Release::Delete, Some(previous)) => {
                        lease::delete_lease(conn, id).map_err(db_err)?;
                        let audit = if force {
                            who.audit(
                                EVENT_BROKEN,
                                serde_json::json!({ "previous_holder": previous.holder_json(now) }),
                            )
                        } else {
                            who.audit(
                                EVENT_RELEASED,
                                serde_json::json!({
                                    "operation": previous.operation,
                                    "host": previous.host,
                                }),
                            )
                        };
                        insert_audit(conn, &audit).map_err(db_err)
                    }
                }
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(serial: i64, lineage: &str, sha: &str) -> VersionRow {
        VersionRow {
            scope: "cluster/x".into(),
            version: 3,
            serial: Some(serial),
            lineage: Some(lineage.into()),
            sha256: Some(sha.into()),
            size: 10,
            blob_key: Some("k".into()),
            created_at: "2026-01-01T00:00:00Z".into(),
            actor: "a@x".into(),
            facts: Default::default(),
            changes: None,
            key_generation: None,
        }
    }

    #[test]
    fn push_rules() {
        let tombstone = VersionRow {
            blob_key: None,
            sha256: None,
            serial: None,
            lineage: None,
            ..row(0, "", "")
        };
        // stored, pushed (serial, lineage, sha), accepted (or refused as a push conflict)
        type Row<'a> = (Option<VersionRow>, (i64, &'a str, &'a str), bool);
        let table: Vec<Row> = vec![
            (None, (0, "L", "a"), true),
            (Some(tombstone), (0, "other", "a"), true),
            (Some(row(5, "L", "a")), (6, "L", "b"), true),
            (Some(row(5, "L", "a")), (5, "L", "a"), true), // idempotent retry
            (Some(row(5, "L", "a")), (5, "L", "b"), false),
            (Some(row(5, "L", "a")), (4, "L", "c"), false),
            (Some(row(5, "L", "a")), (4, "L", "a"), false),
            (Some(row(5, "L", "a")), (6, "M", "b"), false),
            (Some(row(5, "L", "a")), (5, "M", "a"), false),
        ];
        for (stored, (serial, lineage, sha), expected) in table {
            let got = match check_push(stored.as_ref(), serial, lineage, sha) {
                Ok(()) => true,
                Err(Error::PushConflict { .. }) => false,
                Err(other) => panic!("not a push conflict: {other:?}"),
            };
            assert_eq!(got, expected, "{stored:?} <- {serial} {lineage} {sha}");
        }
        let err = check_push(Some(&row(5, "L", "a")), 6, "M", "b").unwrap_err();
        let Error::PushConflict {
            message,
            stored_serial,
            ..
        } = err
        else {
            panic!("not a push conflict: {err:?}");
        };
        assert!(message.contains("lineage mismatch"));
        assert_eq!(stored_serial, Some(5));
    }

    #[test]
    fn version_headers() {
        let state = StoredState {
            row: row(7, "lin-1", "abc"),
            body: b"{}".to_vec(),
        };
        assert_eq!(
            state.headers(),
            vec![
                ("X-Stategate-Serial", "7".to_string()),
                ("X-Stategate-Lineage", "lin-1".to_string()),
                ("X-Stategate-Version", "3".to_string()),
                ("ETag", "\"abc\"".to_string()),
                ("Last-Modified", "Thu, 01 Jan 2026 00:00:00 GMT".to_string()),
            ]
        );
        // A lineage stored before lineages were validated still makes a valid header.
        for (stored, sent) in [
            ("a\nb", "a%0Ab"),
            ("a b%", "a%20b%25"),
            ("caf\u{e9}", "caf%C3%A9"),
            ("plain-1", "plain-1"),
        ] {
            assert_eq!(header_safe(stored), sent);
            assert!(http::HeaderValue::from_str(&header_safe(stored)).is_ok());
        }
    }

    #[test]
    fn not_found_body() {
        // One refusal for a missing cluster, another org's cluster and a malformed id.
        assert!(matches!(not_found(), Error::NotFound(m) if m == "cluster not found"));
    }
}
