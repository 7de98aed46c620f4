//! The operator surface: every day-two operation (list, show, reveal, diff, history,
//! rollback and its preview, unlock, restore, freeze, move, search, audit, clusters) as one domain
//! function, called by the CLI (`workspace …`, `admin …`), the admin HTTP API
//! (`http::admin`) and the web UI (`crate::ui`), so they can never disagree. Operators
//! authenticate with their own tokens (`identity`); every change is audited with the
//! operator's identity in the change's transaction, and so is every read that hands out
//! unmasked state (`reveal`, event `state.revealed`). What an operator may do is its
//! `roles::Grant` (a role and optional workspace patterns), checked by the HTTP edge
//! before any of these runs; the listings (`list_workspaces`, `search`, `audit`,
//! `consumers`) take the grant and return only what it sees, other workspaces' names
//! redacted (`redact`). The CLI passes `Grant::ROOT`.
//!
//! Functions take plain values and return plain results or a typed `Error`; lock
//! and lease staleness is judged here, against `locks.stale_after_seconds` and the
//! cluster API's `lease_stale_seconds`.

pub mod diff;
pub mod identity;
pub mod listings;
pub mod paths;
pub mod redact;
pub mod roles;
pub mod search;

use crate::store::sql::Connection;
use serde::Serialize;

use crate::cluster::identity::{list_clusters, AdminError};
use crate::cluster::{lease::current_lease, ClusterService};
use crate::error::Error;
use crate::names::validate_workspace;
use crate::store::audit::{insert_audit, AuditEntry, AuditFilter, AuditRow};
use crate::store::history::RolledBack;
use crate::store::timeline::{TimelineRow, MAX_ADDRESS_LEN};
use crate::store::{latest_row, latest_rows_under, Db, VersionRow};
use crate::tofu::freeze::{all_freezes, Freeze};
use crate::tofu::lock::{all_locks, all_plan_rows, held_lock_since, HeldLock, PlanRow};
use crate::tofu::{MoveDone, TofuBackend};
use diff::StateDiff;
pub use identity::{Operator, SCHEMA};
pub use listings::Listings;
use roles::Grant;
pub use search::{SearchLimits, SearchResults};

/// Longest `Who`/`Operation` shown from a client's LockInfo.
const MAX_LOCK_FIELD: usize = 256;
/// Most audit rows one listing returns.
pub const MAX_AUDIT_LIMIT: u32 = 1000;
/// Most audit rows read to fill one page for an operator limited to workspace patterns.
pub const MAX_AUDIT_SCANNED: u32 = 20 * MAX_AUDIT_LIMIT;
/// The most event kinds the audit page offers (the code writes far fewer).
pub const MAX_EVENT_KINDS: u32 = 200;

/// Audit scopes that are site-wide words, not workspaces.
const SITE_SCOPES: [&str; 2] = ["operators", crate::tofu::credentials::TOKEN_SCOPE];

/// An audit scope as an operator types it: a bare workspace name (`prod`) is that
/// workspace's scope (`tf/prod`); a scope with a `/` (`tf/prod`, a cluster's) or a
/// site-wide word (`operators`, `workspace-tokens`) is taken as it is.
pub fn audit_scope(text: &str) -> String {
    if text.contains('/') || SITE_SCOPES.contains(&text) {
        text.to_string()
    } else {
        crate::tofu::scope(text)
    }
}
/// The audit event of every unmasked read of a workspace's state by an operator.
pub const EVENT_REVEALED: &str = "state.revealed";

/// How a version's real (unmasked) values left the server: the `via` of its
/// `state.revealed` audit row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reveal {
    /// The UI's "Show sensitive values" form.
    UiView,
    /// The UI's download of the raw `.tfstate`.
    UiDownload,
    /// `GET /api/v1/admin/workspaces/{ws}/versions/{n}` without `masked=1`.
    Api,
    /// `stategate workspace show` without `--masked`.
    Cli,
}

impl Reveal {
    pub fn as_str(self) -> &'static str {
        match self {
            Reveal::UiView => "ui.view",
            Reveal::UiDownload => "ui.download",
            Reveal::Api => "api",
            Reveal::Cli => "cli",
        }
    }
}

/// What a rollback would do, shown before it is confirmed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RollbackPreview {
    /// The workspace's newest version now (what the diff starts from).
    pub from_version: i64,
    pub to_version: i64,
    /// Serial the rolled-back version would carry: above every stored one for a plain
    /// state (so plans saved before are stale), the target's own for an OpenTofu-encrypted
    /// state (it cannot be renumbered).
    /// `None` also when no serial can be made ([`Self::refused`]).
    pub to_serial: Option<i64>,
    /// Why the rollback would be refused (409) even with no lock held: no serial above
    /// the stored ones is left to give the restored state, or the downgrade policy
    /// refuses a plaintext version over an encrypted one.
    pub refused: Option<String>,
    /// From the current version to the target; `None` when either is not a plain
    /// JSON state (encrypted by the client): the rollback still works, unseen.
    pub diff: Option<StateDiff>,
    /// Why there is no diff, when there is none.
    pub diff_unavailable: Option<String>,
    /// The holder while locked: the rollback would be refused (423).
    pub lock: Option<LockState>,
    /// The freeze in force: the rollback would be refused (423) until it ends or is
    /// lifted.
    pub frozen: Option<Freeze>,
}

/// A workspace lock as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LockState {
    pub id: String,
    pub who: String,
    pub operation: String,
    pub created_at: String,
    pub age_seconds: i64,
    /// Held for longer than `locks.stale_after_seconds`.
    pub stale: bool,
}

/// One row of `workspace list`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkspaceSummary {
    pub name: String,
    /// Newest version (a tombstone when `deleted`); `None` when only a lock exists.
    pub version: Option<i64>,
    pub serial: Option<i64>,
    pub size: Option<i64>,
    pub updated_at: Option<String>,
    /// Who wrote the newest version, in words ([`written_by`]); `None` when only a lock
    /// exists.
    pub written_by: Option<String>,
    pub deleted: bool,
    /// The exclusive holder, or (while plans share the lock) one entry standing for
    /// them all: the oldest plan's, its `Info` naming every holder.
    pub lock: Option<LockState>,
    /// Every shared plan holder, oldest first (empty under an exclusive lock).
    pub plans: Vec<LockState>,
    /// The maintenance freeze in force, if any (`workspace freeze`).
    pub frozen: Option<Freeze>,
    /// Client-side encryption of its recent versions (`tofu::posture`); `None`
    /// without a live state.
    pub encryption: Option<crate::tofu::posture::Posture>,
    /// The data key generation its newest version is sealed under at rest (AES-256-GCM,
    /// [`at_rest`]), as the index recorded it with the version (listings read no
    /// blob); `None` without a live version, and, in a listing, for a version an
    /// earlier release wrote ([`Operations::workspace`] reads that one's header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_generation: Option<u32>,
}

/// The cipher every version is sealed with at rest (`store::format`, whatever the client
/// did).
pub const AT_REST_CIPHER: &str = "AES-256-GCM";

/// At-rest encryption in words, for the UI and the CLI: `AES-256-GCM, key generation 2`,
/// or the cipher alone where the generation was not read.
pub fn at_rest(generation: Option<u32>) -> String {
    match generation {
        Some(g) => format!("{AT_REST_CIPHER}, key generation {g}"),
        None => AT_REST_CIPHER.to_string(),
    }
}

impl WorkspaceSummary {
    /// A workspace known only by its lock (no version yet); the caller sets the lock.
    fn only_locked(name: String) -> Self {
        WorkspaceSummary {
            name,
            version: None,
            serial: None,
            size: None,
            updated_at: None,
            written_by: None,
            deleted: false,
            lock: None,
            plans: Vec::new(),
            frozen: None,
            encryption: None,
            key_generation: None,
        }
    }
}

/// A cluster with its lease, for `GET /api/v1/admin/clusters`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterSummary {
    pub id: String,
    pub org: String,
    pub name: Option<String>,
    pub created_at: String,
    pub version: Option<i64>,
    pub serial: Option<i64>,
    pub lease: Option<serde_json::Value>,
}

/// What a freeze did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FreezeDone {
    pub freeze: Freeze,
    /// `until` for people (`until 2026-12-02 10:00 UTC`, or `until unfrozen`).
    pub until_text: String,
    /// The lock held when the freeze was made: left alone, the freeze applies once it
    /// is released.
    pub lock_held: Option<LockState>,
}

/// What an operator unlock did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unlocked {
    /// `false` when the workspace was not locked (nothing changed, nothing audited).
    pub unlocked: bool,
    pub holder: Option<LockState>,
}

/// A resource address as a query names it: 1-512 bytes, printable, no control
/// characters (the message states the rule, never echoes the input).
pub fn check_address(address: &str) -> Result<(), Error> {
    let ok = !address.is_empty()
        && address.len() <= MAX_ADDRESS_LEN
        && !address.chars().any(char::is_control);
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "address must be 1-{MAX_ADDRESS_LEN} bytes without control characters, e.g. module.db.aws_db_instance.main"
        )))
    }
}

/// One version row as listings show it: `writer` is the credential that wrote it
/// (`actor`, kept for scripts of earlier releases), with the lock's `lock_who` and
/// `lock_operation`, `restored_from` for a rollback, `changes` (added/changed/removed
/// resource counts, `null` when not known) and `written_by`, all of it in words.
pub fn version_json(row: &VersionRow) -> serde_json::Value {
    serde_json::json!({
        "version": row.version,
        "serial": row.serial,
        "lineage": row.lineage,
        "size": row.size,
        "sha256": row.sha256,
        "created_at": row.created_at,
        "tombstone": row.is_tombstone(),
        "actor": row.actor,
        "writer": row.actor,
        "lock_who": row.facts.lock_who,
        "lock_operation": row.facts.lock_operation,
        "restored_from": row.facts.restored_from,
        "changes": version_changes(row),
        "moved": diff::Moved::of(&row.facts),
        "written_by": written_by(&row.actor, &row.facts),
    })
}

/// One resource of a diff as the admin API and the CLI's `--json` show it: address,
/// change and changed attributes; what a move's version moved is `"change": "moved"`
/// with `"moved": {"to": "app"}` (or `{"from": …}`).
pub fn resource_change_json(d: &StateDiff, r: &diff::ResourceChange) -> serde_json::Value {
    // `attributes` only for a change in place, as `ResourceChange` serializes.
    let mut line = serde_json::to_value(r).unwrap_or_default();
    if let Some(m) = d.moved.as_ref().filter(|m| m.covers_change(&r.change)) {
        line["change"] = "moved".into();
        line["moved"] = serde_json::to_value(m).unwrap_or_default();
    }
    line
}

/// What a version did to resources, as every listing counts it: `moved` counts the
/// resources a move's version moved (to or from the workspace its `moved` names), which
/// are then neither `added` nor `removed`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct VersionChanges {
    pub added: i64,
    pub changed: i64,
    pub removed: i64,
    pub moved: i64,
}

/// [`VersionChanges`] of a version row (`None`: not known).
pub fn version_changes(row: &VersionRow) -> Option<VersionChanges> {
    let c = row.changes?;
    let mut out = VersionChanges {
        added: c.added,
        changed: c.changed,
        removed: c.removed,
        moved: 0,
    };
    match diff::Moved::of(&row.facts) {
        Some(m) if m.covers(true) => (out.moved, out.removed) = (c.removed, 0),
        Some(_) => (out.moved, out.added) = (c.added, 0),
        None => {}
    }
    Some(out)
}

/// Terraform's lock operation as a person says it (`OperationTypeApply` → `apply`,
/// `OperationTypeInvalid` → `unknown operation`); anything else as sent. The UI, the CLI
/// and history's "written by" all say it this way.
pub fn operation_name(operation: &str) -> String {
    match operation.strip_prefix("OperationType") {
        Some("Invalid") => "unknown operation".into(),
        Some(rest) if !rest.is_empty() => rest.to_lowercase(),
        _ => operation.to_string(),
    }
}

/// Who wrote a version, in words: `ci@runner-3 (apply) via token:ci`,
/// `operator:alice · rollback of v2`, `drift:run-7`, or just the credential.
pub fn written_by(writer: &str, facts: &crate::store::WriteFacts) -> String {
    let mut out = match &facts.lock_who {
        Some(who) => format!("{who} via {writer}"),
        None => writer.to_string(),
    };
    if let Some(operation) = &facts.lock_operation {
        out = match &facts.lock_who {
            Some(who) => format!("{who} ({}) via {writer}", operation_name(operation)),
            None => format!("{out} ({})", operation_name(operation)),
        };
    }
    if let Some(from) = facts.restored_from {
        out.push_str(&format!(" · rollback of v{from}"));
    }
    out
}

/// `+2 ~1 -0` (added, changed, removed resources), a move's version as
/// `3 moved to app` (`+0 ~0 -0 · 3 moved to app` if it did anything else too), or `-`
/// when not known.
pub fn change_summary(row: &VersionRow) -> String {
    let Some(c) = version_changes(row) else {
        return "-".to_string();
    };
    let counts = format!("+{} ~{} -{}", c.added, c.changed, c.removed);
    match diff::Moved::of(&row.facts) {
        Some(m) if c.added == 0 && c.changed == 0 && c.removed == 0 => {
            format!("{} {}", c.moved, m.label())
        }
        Some(m) => format!("{counts} · {} {}", c.moved, m.label()),
        None => counts,
    }
}

/// What a timeline row's version did to its address, in words: `added`, `changed`,
/// `removed`, or `moved to app` / `moved from net` for what a move moved.
pub fn timeline_change(row: &TimelineRow) -> String {
    match timeline_moved(row) {
        Some(m) => m.label(),
        None => row.change.as_str().to_string(),
    }
}

/// The move that moved a timeline row's address, if its version is a move's and the
/// address is one it moved.
pub fn timeline_moved(row: &TimelineRow) -> Option<diff::Moved> {
    use crate::store::timeline::Change;
    let removed = match row.change {
        Change::Added => false,
        Change::Removed => true,
        Change::Changed => return None,
    };
    diff::Moved::of(&row.facts()).filter(|m| m.covers(removed))
}

/// One timeline row as listings show it (with `written_by` in words); an address a move
/// moved is `"change": "moved"` with `"moved": {"to": "app"}` (or `{"from": …}`).
pub fn timeline_json(row: &TimelineRow) -> serde_json::Value {
    let mut value = serde_json::to_value(row).unwrap_or_default();
    if let Some(m) = timeline_moved(row) {
        value["change"] = "moved".into();
        value["moved"] = serde_json::to_value(&m).unwrap_or_default();
    }
    value["written_by"] = written_by(&row.writer, &row.facts()).into();
    value
}

/// What a rollback or restore wrote.
pub fn rolled_back_json(done: &RolledBack) -> serde_json::Value {
    let (written, row) = match &done.outcome {
        crate::store::WriteOutcome::Stored(row) => (true, row),
        crate::store::WriteOutcome::Unchanged(row) => (false, row),
    };
    serde_json::json!({
        "written": written,
        "from_version": done.from_version,
        "to_version": done.to_version,
        "current": version_json(row),
    })
}

pub fn admin_error(e: AdminError) -> Error {
    match e {
        AdminError::Invalid(m) => Error::Invalid(m),
        AdminError::NotFound(m) => Error::NotFound(m),
        AdminError::Exists(m) => Error::Conflict(m),
        AdminError::Db(e) => Error::from(e),
        AdminError::Random(detail) => Error::Internal {
            public: "cannot create a token now; see the server log".into(),
            detail,
        },
    }
}

fn unix_seconds(rfc3339: &str) -> Option<i64> {
    time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

/// The lock as shown: the client's own `Who`/`Operation` (bounded), its age and staleness.
pub fn lock_state(lock: &HeldLock, created_at: &str, now: i64, stale_after: i64) -> LockState {
    let info: serde_json::Value = serde_json::from_str(&lock.info).unwrap_or_default();
    let field = |name: &str| -> String {
        info[name]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(MAX_LOCK_FIELD)
            .collect()
    };
    let age = unix_seconds(created_at).map_or(0, |t| (now - t).max(0));
    LockState {
        id: lock.id.clone(),
        who: field("Who"),
        operation: field("Operation"),
        created_at: created_at.to_string(),
        age_seconds: age,
        stale: age > stale_after,
    }
}

/// Every workspace (with versions or a lock), by name. One read transaction.
pub fn workspace_rows(
    conn: &Connection,
    now: i64,
    stale_after: i64,
) -> Result<Vec<WorkspaceSummary>, crate::store::sql::Error> {
    let mut out = std::collections::BTreeMap::<String, WorkspaceSummary>::new();
    for row in latest_rows_under(conn, crate::tofu::SCOPE_PREFIX)? {
        let Some(name) = row.scope.strip_prefix(crate::tofu::SCOPE_PREFIX) else {
            continue;
        };
        out.insert(
            name.to_string(),
            WorkspaceSummary {
                name: name.to_string(),
                version: Some(row.version),
                serial: row.serial,
                size: Some(row.size),
                updated_at: Some(row.created_at.clone()),
                written_by: Some(written_by(&row.actor, &row.facts)),
                deleted: row.is_tombstone(),
                lock: None,
                plans: Vec::new(),
                frozen: None,
                encryption: None,
                // As the index recorded it (no blob read); unknown for a tombstone
                // and in a row an earlier release wrote.
                key_generation: row.key_generation.filter(|_| !row.is_tombstone()),
            },
        );
    }
    for (name, lock, created_at) in all_locks(conn)? {
        let state = lock_state(&lock, &created_at, now, stale_after);
        out.entry(name.clone())
            .or_insert_with(|| WorkspaceSummary::only_locked(name))
            .lock = Some(state);
    }
    let mut plans = std::collections::BTreeMap::<String, Vec<PlanRow>>::new();
    for (name, row) in all_plan_rows(conn)? {
        plans.entry(name).or_default().push(row);
    }
    for (name, rows) in plans {
        let locks: Vec<HeldLock> = rows.iter().map(|r| r.lock.clone()).collect();
        let ws = out
            .entry(name.clone())
            .or_insert_with(|| WorkspaceSummary::only_locked(name));
        ws.plans = rows
            .iter()
            .map(|r| lock_state(&r.lock, &r.created_at, now, stale_after))
            .collect();
        if ws.lock.is_none() {
            ws.lock = Some(lock_state(
                &crate::tofu::lock::plans_summary(&locks),
                &rows[0].created_at,
                now,
                stale_after,
            ));
        }
    }
    for f in all_freezes(conn)?.into_iter().filter(|f| f.in_force(now)) {
        if let Some(ws) = out.get_mut(&f.workspace) {
            ws.frozen = Some(f);
        }
    }
    let live: std::collections::HashMap<String, i64> = out
        .values()
        .filter(|w| !w.deleted)
        .filter_map(|w| Some((w.name.clone(), w.version?)))
        .collect();
    let mut postures = crate::tofu::posture::postures(conn, &live)?;
    for name in live.keys() {
        let posture = postures
            .remove(name)
            .unwrap_or_else(crate::tofu::posture::posture_unknown);
        if let Some(ws) = out.get_mut(name) {
            ws.encryption = Some(posture);
        }
    }
    Ok(out.into_values().collect())
}

/// The operations, over the same engine `serve` uses.
#[derive(Clone)]
pub struct Operations {
    tofu: TofuBackend,
    /// For the operator's own reads and changes (operators, tokens, the audit log, and
    /// reads joining the other modules' functions in one transaction).
    db: Db,
    clusters: ClusterService,
    stale_after: i64,
    search_limits: SearchLimits,
    /// Largest version read whole for a view, a diff or a search (`max_view_bytes`).
    max_view_bytes: u64,
}

impl Operations {
    pub fn new(tofu: TofuBackend, clusters: ClusterService, stale_after_seconds: u64) -> Self {
        Operations {
            db: tofu.store().index_handle(),
            tofu,
            clusters,
            stale_after: i64::try_from(stale_after_seconds).unwrap_or(i64::MAX),
            search_limits: SearchLimits::default(),
            max_view_bytes: crate::config::Config::default().max_view_bytes,
        }
    }

    /// Versions larger than `bytes` are refused by show, reveal, diff and the rollback
    /// preview instead of read whole (search has its own byte budget).
    pub fn with_max_view_bytes(mut self, bytes: u64) -> Self {
        self.max_view_bytes = bytes;
        self
    }

    /// The same operations with other bounds per search.
    pub fn with_search_limits(mut self, limits: SearchLimits) -> Self {
        self.search_limits = limits;
        self
    }

    pub fn search_limits(&self) -> SearchLimits {
        self.search_limits
    }

    pub fn stale_after(&self) -> i64 {
        self.stale_after
    }

    fn now() -> i64 {
        crate::tokens::now()
    }

    /// The operator a bearer token belongs to. No token, a wrong one and a revoked one
    /// all get the same 401.
    pub async fn authenticate(&self, token: Option<Vec<u8>>) -> Result<Operator, Error> {
        let token = token.ok_or(Error::OperatorRequired)?;
        let found = self
            .db
            .read(move |c| identity::operator_by_token(c, &token))
            .await?;
        found.ok_or(Error::OperatorRequired)
    }

    /// `f` in one write transaction, its error in domain words: for tests and tools
    /// that set up operators. A surface calls a domain function that owns its
    /// transaction instead (`http/` may not call this: `http_opens_no_transaction`).
    pub async fn admin_write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, AdminError> + Send + 'static,
    ) -> Result<T, Error> {
        self.db.write(f).await.map_err(admin_error)
    }

    /// Every workspace `grant` sees (an operator limited to `dev-*` never learns that
    /// `prod-x` exists); [`Grant::ROOT`] for the CLI and housekeeping.
    pub async fn list_workspaces(&self, grant: &Grant) -> Result<Vec<WorkspaceSummary>, Error> {
        let (now, stale) = (Self::now(), self.stale_after);
        let mut rows = self.db.read(move |c| workspace_rows(c, now, stale)).await?;
        rows.retain(|w| grant.sees(&w.name));
        Ok(rows)
    }

    /// One workspace's summary (404 when it has neither versions nor a lock).
    /// With the data key generation of its newest version: the index's, or, for a row
    /// an earlier release wrote, its blob's header (best effort: a blob whose header
    /// cannot be read is logged and leaves it unknown; reading the version says what
    /// is wrong).
    pub async fn workspace(&self, workspace: &str) -> Result<WorkspaceSummary, Error> {
        validate_workspace(workspace)?;
        let mut found = self
            .list_workspaces(&Grant::ROOT)
            .await?
            .into_iter()
            .find(|w| w.name == workspace)
            .ok_or_else(|| Error::NotFound(format!("workspace {workspace:?} has no versions")))?;
        if !found.deleted && found.version.is_some() && found.key_generation.is_none() {
            let scope = crate::tofu::scope(workspace);
            match self.tofu.store().current_key_generation(&scope).await {
                Ok(g) => found.key_generation = g,
                Err(e) => {
                    tracing::warn!(workspace, error = %e, "cannot read the key generation of the newest version")
                }
            }
        }
        Ok(found)
    }

    /// The resource timeline of `workspace` ([`Listings::timeline`]).
    pub async fn timeline(
        &self,
        workspace: &str,
        address: Option<&str>,
        limit: u32,
        grant: &Grant,
    ) -> Result<Vec<TimelineRow>, Error> {
        self.listings()
            .timeline(workspace, address, limit, grant)
            .await
    }

    /// The versions of `workspace`, newest first ([`Listings::history`]).
    pub async fn history(
        &self,
        workspace: &str,
        limit: Option<u32>,
        grant: &Grant,
    ) -> Result<Vec<VersionRow>, Error> {
        self.listings().history(workspace, limit, grant).await
    }

    /// The listings that read the index alone, as the CLI opens them.
    fn listings(&self) -> Listings {
        Listings::new(self.db.clone())
    }

    /// A version's content (the newest when `version` is `None`). A deleted workspace,
    /// an unknown or pruned version are errors; an unreadable one is a 500, never empty.
    /// Not audited: callers show it masked (`diff::mask_state`) or go through [`Self::reveal`].
    pub async fn show(
        &self,
        workspace: &str,
        version: Option<i64>,
    ) -> Result<(VersionRow, Vec<u8>), Error> {
        validate_workspace(workspace)?;
        let version = match version {
            Some(v) => v,
            None => {
                let latest = self
                    .tofu
                    .store()
                    .latest(&crate::tofu::scope(workspace))
                    .await?;
                match latest {
                    None => {
                        return Err(Error::NotFound(format!(
                            "workspace {workspace:?} has no versions"
                        )))
                    }
                    Some(row) => row.version,
                }
            }
        };
        self.tofu
            .read_version(workspace, version, self.max_view_bytes)
            .await
    }

    /// A version's unmasked content, for `who`. The `state.revealed` audit row (scope
    /// `tf/<ws>`, payload `{version, via}`: never a value) commits before the content is
    /// returned, so no row means no content; a refused read (unknown, pruned, deleted,
    /// unreadable) audits nothing.
    pub async fn reveal(
        &self,
        workspace: &str,
        version: Option<i64>,
        who: &str,
        via: Reveal,
    ) -> Result<(VersionRow, Vec<u8>), Error> {
        let (row, body) = self.show(workspace, version).await?;
        let entry = AuditEntry::new(
            who,
            crate::tofu::scope(workspace),
            EVENT_REVEALED,
            serde_json::json!({ "version": row.version, "via": via.as_str() }),
        );
        self.db
            .write(move |c| insert_audit(c, &entry).map_err(crate::store::db::DbError::from))
            .await?;
        Ok((row, body))
    }

    /// What changed from version `from` to version `to` (a move's other workspace named
    /// as `grant` sees it).
    pub async fn diff(
        &self,
        workspace: &str,
        from: i64,
        to: i64,
        grant: &Grant,
    ) -> Result<StateDiff, Error> {
        validate_workspace(workspace)?;
        let (a, a_body) = self
            .tofu
            .read_version(workspace, from, self.max_view_bytes)
            .await?;
        let (b, b_body) = self
            .tofu
            .read_version(workspace, to, self.max_view_bytes)
            .await?;
        let mut d = diff::diff_states(&a_body, a.version, &b_body, b.version)
            .map_err(|e| Error::Conflict(e.to_string()))?;
        // What a move's version did, against the version just before it: only moves.
        if a.version.checked_add(1) == Some(b.version) {
            d.moved = diff::Moved::of(&b.facts);
        }
        redact::diff(&mut d, grant);
        Ok(d)
    }

    /// Rolls back to version `to`. `expected_from`: the current version the operator
    /// was shown (the preview's); if another write landed since, nothing is written (409).
    pub async fn rollback(
        &self,
        workspace: &str,
        to: i64,
        expected_from: Option<i64>,
        who: &str,
    ) -> Result<RolledBack, Error> {
        validate_workspace(workspace)?;
        self.tofu
            .rollback_from(workspace, to, expected_from, who)
            .await
    }

    /// The serial a rollback to `target` gives the workspace (as `StateStore::rollback`),
    /// or why none can be made (the rollback would be refused the same way).
    async fn serial_after_rollback(
        &self,
        workspace: &str,
        target: &VersionRow,
        body: &[u8],
    ) -> Result<Result<Option<i64>, String>, Error> {
        if crate::tfstate::serial_span(body).is_none() {
            return Ok(Ok(target.serial));
        }
        let scope = crate::tofu::scope(workspace);
        match self.tofu.store().fresh_serial(&scope, target.serial).await {
            Ok(next) => Ok(Ok(Some(next))),
            Err(e @ crate::store::StoreError::SerialExhausted { .. }) => Ok(Err(e.to_string())),
            Err(e) => Err(e.into()),
        }
    }

    /// What rolling back to `to` would change (current → `to`), and the lock or freeze
    /// that would refuse it. Reads only; nothing is audited.
    pub async fn rollback_preview(
        &self,
        workspace: &str,
        to: i64,
    ) -> Result<RollbackPreview, Error> {
        validate_workspace(workspace)?;
        let latest = self
            .tofu
            .store()
            .latest(&crate::tofu::scope(workspace))
            .await?
            .ok_or_else(|| Error::NotFound(format!("workspace {workspace:?} has no versions")))?;
        let (target, target_body) = self
            .tofu
            .read_version(workspace, to, self.max_view_bytes)
            .await?;
        let current = if latest.is_tombstone() {
            Err(format!(
                "version {} is a deletion; the rollback brings the state back",
                latest.version
            ))
        } else {
            let (row, body) = self
                .tofu
                .read_version(workspace, latest.version, self.max_view_bytes)
                .await?;
            Ok((row, body))
        };
        let (diff, diff_unavailable) = match current {
            Ok((row, body)) => {
                match diff::diff_states(&body, row.version, &target_body, target.version) {
                    Ok(d) => (Some(d), None),
                    Err(e) => (None, Some(e.to_string())),
                }
            }
            Err(why) => (None, Some(why)),
        };
        let serial = self
            .serial_after_rollback(workspace, &target, &target_body)
            .await?;
        let downgrade = self
            .tofu
            .rollback_refusal(workspace, &latest, target.version)
            .await?;
        Ok(RollbackPreview {
            from_version: latest.version,
            to_version: target.version,
            to_serial: serial.clone().ok().flatten(),
            refused: serial.err().or(downgrade),
            diff,
            diff_unavailable,
            lock: self.lock(workspace).await?,
            frozen: self.tofu.freeze_of(workspace).await?,
        })
    }

    /// Resources whose address contains `query`, across every workspace's newest version
    /// (bounded by [`Self::search_limits`]; see [`search`]). A version that cannot be
    /// read is listed as unreadable (and logged), not skipped silently. Only the
    /// workspaces `grant` sees are searched.
    pub async fn search(&self, query: &str, grant: &Grant) -> Result<SearchResults, Error> {
        let limits = self.search_limits;
        let needle = search::needle(query)?;
        let mut workspaces: Vec<WorkspaceSummary> = self
            .list_workspaces(grant)
            .await?
            .into_iter()
            .filter(|w| !w.deleted && w.version.is_some())
            .collect();
        workspaces.sort_by(|a, b| a.name.cmp(&b.name));
        let mut out = SearchResults::new(query, limits);
        for ws in workspaces {
            let (Some(version), Some(size)) = (ws.version, ws.size) else {
                continue;
            };
            if out.admit(size) {
                match self
                    .tofu
                    .read_version(&ws.name, version, limits.max_bytes as u64)
                    .await
                {
                    Ok((row, body)) => out.scan(&ws.name, row.version, &body, &needle),
                    Err(e) => {
                        tracing::error!(workspace = %ws.name, version, error = e.log_detail().unwrap_or_default(), "search cannot read a version");
                        out.unreadable.push(ws.name.clone());
                    }
                }
            }
            if out.done() {
                break;
            }
        }
        Ok(out)
    }

    pub async fn restore(&self, workspace: &str, who: &str) -> Result<RolledBack, Error> {
        validate_workspace(workspace)?;
        self.tofu.restore(workspace, who).await
    }

    /// Lets one write that the write guard would refuse (another lineage, a lower
    /// serial, the same serial with other content) through to `workspace` within
    /// `minutes`, audited as `tf.write_allowed` by `who`; used up by that write.
    pub async fn allow_write(
        &self,
        workspace: &str,
        minutes: u32,
        reason: &str,
        who: &str,
    ) -> Result<crate::tofu::guard::Override, Error> {
        validate_workspace(workspace)?;
        self.tofu.allow_write(workspace, minutes, reason, who).await
    }

    /// Freezes `workspace` for `reason` until `until` (RFC 3339) or for `for_` (`2h`),
    /// or until unfrozen, audited as `tf.frozen` by `who`. While frozen every LOCK and
    /// every unlocked write is refused (423, the reason in the LockInfo); a lock held
    /// now is not broken and is returned (the freeze applies once it is released).
    pub async fn freeze(
        &self,
        workspace: &str,
        reason: &str,
        until: Option<&str>,
        for_: Option<&str>,
        who: &str,
    ) -> Result<FreezeDone, Error> {
        validate_workspace(workspace)?;
        let end = crate::tofu::freeze::parse_end(until, for_, Self::now())
            .map_err(|e| Error::Invalid(format!("{e}; nothing was frozen")))?;
        let done = self.tofu.freeze(workspace, reason, end, who).await?;
        let (now, stale) = (Self::now(), self.stale_after);
        Ok(FreezeDone {
            until_text: done.freeze.until_text(),
            freeze: done.freeze,
            lock_held: done
                .held
                .map(|(lock, at)| lock_state(&lock, &at, now, stale)),
        })
    }

    /// Lifts the freeze of `workspace` (audited as `tf.unfrozen` by `who`); `None`
    /// when it was not frozen (nothing changed).
    pub async fn unfreeze(&self, workspace: &str, who: &str) -> Result<Option<Freeze>, Error> {
        validate_workspace(workspace)?;
        self.tofu.unfreeze(workspace, who).await
    }

    /// Every freeze in force that `grant` sees, by workspace. Freezes found expired
    /// are removed and their expiry audited (as the housekeeping does).
    pub async fn freezes(&self, grant: &Grant) -> Result<Vec<Freeze>, Error> {
        let mut all = self.tofu.freezes().await?;
        all.retain(|f| grant.sees(&f.workspace));
        Ok(all)
    }

    /// The consumers `workspace` names, those `grant` does not see as
    /// [`redact::HIDDEN_WORKSPACE`].
    pub async fn consumers(&self, workspace: &str, grant: &Grant) -> Result<Vec<String>, Error> {
        let all = self.tofu.consumers(workspace).await?;
        Ok(redact::workspaces(all, grant))
    }

    /// Replaces the consumers of `workspace` with `names`, audited as
    /// `tf.consumers_set` by `who`. The consumers `grant` does not see are kept (it
    /// can neither see nor remove them; [`redact::HIDDEN_WORKSPACE`] in `names`, as a
    /// listing showed them, is passed over); the answer is [`Self::consumers`]'.
    pub async fn set_consumers(
        &self,
        workspace: &str,
        names: Vec<String>,
        who: &str,
        grant: &Grant,
    ) -> Result<Vec<String>, Error> {
        // What a listing showed it, sent back as it was: the hidden ones are kept anyway.
        let mut names = names;
        names.retain(|n| n != redact::HIDDEN_WORKSPACE);
        let limited = grant.clone();
        let set = self
            .tofu
            .set_consumers_keeping(workspace, names, who, move |c| !limited.sees(c))
            .await?;
        Ok(redact::workspaces(set, grant))
    }

    /// Moves resources (`addresses`, every instance of each) from `source`'s state to
    /// `destination`'s under both locks, in one commit, audited once as
    /// `tf.resources_moved` by `who`. Both states are read whole, each at most
    /// `max_view_bytes`.
    pub async fn move_resources(
        &self,
        source: &str,
        destination: &str,
        addresses: &[String],
        who: &str,
    ) -> Result<MoveDone, Error> {
        self.tofu
            .move_resources(source, destination, addresses, who, self.max_view_bytes)
            .await
    }

    /// The current holder, as `unlock` shows it before asking.
    pub async fn lock(&self, workspace: &str) -> Result<Option<LockState>, Error> {
        validate_workspace(workspace)?;
        let ws = workspace.to_string();
        let (now, stale) = (Self::now(), self.stale_after);
        let held = self.db.read(move |c| held_lock_since(c, &ws)).await?;
        Ok(held.map(|(lock, at)| lock_state(&lock, &at, now, stale)))
    }

    /// Force-unlock, audited as `tf.lock_forced` with `who`. Unlocked → nothing happens
    /// and nothing is audited. `expected`: the lock ID the operator saw.
    pub async fn unlock(
        &self,
        workspace: &str,
        expected: Option<String>,
        who: &str,
    ) -> Result<Unlocked, Error> {
        let shown = self.lock(workspace).await?;
        let freed = self.tofu.force_unlock(workspace, expected, who).await?;
        Ok(Unlocked {
            unlocked: freed.is_some(),
            holder: match (freed, shown) {
                (Some(lock), Some(state)) if lock.id == state.id => Some(state),
                (Some(lock), _) => Some(lock_state(&lock, "", Self::now(), self.stale_after)),
                (None, _) => None,
            },
        })
    }

    /// Audit rows as `grant` sees them ([`Listings::audit`]).
    pub async fn audit(
        &self,
        filter: AuditFilter,
        limit: u32,
        grant: &Grant,
    ) -> Result<Vec<AuditRow>, Error> {
        self.listings().audit(filter, limit, grant).await
    }

    /// The event kinds in the audit log ([`Listings::audit_event_kinds`]).
    pub async fn audit_event_kinds(&self) -> Result<Vec<String>, Error> {
        self.listings().audit_event_kinds().await
    }

    /// Every cluster with its latest version and its lease (age, staleness).
    pub async fn clusters(&self) -> Result<Vec<ClusterSummary>, Error> {
        let now = Self::now();
        let stale = self.clusters.stale_seconds();
        let rows = self
            .db
            .read(
                move |c| -> Result<Result<Vec<ClusterSummary>, Error>, crate::store::sql::Error> {
                    let clusters = match list_clusters(c, None) {
                        Ok(rows) => rows,
                        Err(e) => return Ok(Err(admin_error(e))),
                    };
                    let mut out = Vec::with_capacity(clusters.len());
                    for cluster in clusters {
                        let latest = latest_row(c, &crate::cluster::scope(&cluster.id))?;
                        let lease = current_lease(c, &cluster.id)?.map(|l| {
                            let mut shown = l.holder_json(now);
                            shown["held_seconds"] = (now - l.acquired_at).max(0).into();
                            shown["stale"] = l.is_stale(now, stale).into();
                            shown
                        });
                        out.push(ClusterSummary {
                            id: cluster.id,
                            org: cluster.org,
                            name: cluster.name,
                            created_at: cluster.created_at,
                            version: latest.as_ref().map(|r| r.version),
                            serial: latest.and_then(|r| r.serial),
                            lease,
                        });
                    }
                    Ok(Ok(out))
                },
            )
            .await
            .map_err(Error::from)?;
        rows
    }

    /// Seconds each workspace lock and each cluster lease has been held (for `/metrics`).
    pub async fn held_locks(&self) -> Result<(Vec<(String, i64)>, Vec<(String, i64)>), Error> {
        let locks = self
            .list_workspaces(&Grant::ROOT)
            .await?
            .into_iter()
            .filter_map(|w| w.lock.map(|l| (w.name, l.age_seconds)))
            .collect();
        let leases = self
            .clusters()
            .await?
            .into_iter()
            .filter_map(|c| Some((c.id, c.lease?["held_seconds"].as_i64()?)))
            .collect();
        Ok((locks, leases))
    }

    /// Locks held longer than the stale threshold (logged by `serve` as warnings).
    pub async fn stale_locks(&self) -> Result<Vec<(String, LockState)>, Error> {
        Ok(self
            .list_workspaces(&Grant::ROOT)
            .await?
            .into_iter()
            .flat_map(|w| {
                // Each plan holder on its own; else the exclusive holder.
                let held = if w.plans.is_empty() {
                    w.lock.into_iter().collect()
                } else {
                    w.plans
                };
                let name = w.name;
                held.into_iter()
                    .filter(|l| l.stale)
                    .map(move |l| (name.clone(), l))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 38, item 9: the words and counts every listing (the CLI's history and
    /// timeline, their `--json`, the admin API, the UI) takes from these functions: a
    /// move's version counts what moved as moved, to or from the other workspace.
    #[test]
    fn a_moves_versions_count_and_read_as_moved() {
        use crate::store::timeline::{Change, ChangeCounts};
        let row = |added, removed, facts: crate::store::WriteFacts| VersionRow {
            scope: "tf/net".into(),
            version: 3,
            serial: Some(4),
            lineage: None,
            sha256: None,
            size: 1,
            blob_key: Some("k".into()),
            created_at: "t".into(),
            actor: "operator:ops".into(),
            facts,
            changes: Some(ChangeCounts {
                added,
                changed: 0,
                removed,
            }),
            key_generation: None,
        };
        let to = |ws: &str| crate::store::WriteFacts {
            moved_to: Some(ws.into()),
            ..Default::default()
        };
        let from = |ws: &str| crate::store::WriteFacts {
            moved_from: Some(ws.into()),
            ..Default::default()
        };
        let source = row(0, 3, to("app"));
        assert_eq!(change_summary(&source), "3 moved to app");
        assert_eq!(
            serde_json::to_value(version_changes(&source)).unwrap(),
            serde_json::json!({"added": 0, "changed": 0, "removed": 0, "moved": 3})
        );
        assert_eq!(
            version_json(&source)["moved"],
            serde_json::json!({"to": "app"})
        );
        let destination = row(2, 0, from("net"));
        assert_eq!(change_summary(&destination), "2 moved from net");
        // Anything a move's version did besides is still counted as it was.
        assert_eq!(
            change_summary(&row(1, 3, to("app"))),
            "+1 ~0 -0 · 3 moved to app"
        );
        let plain = row(1, 2, Default::default());
        assert_eq!(change_summary(&plain), "+1 ~0 -2");
        assert_eq!(version_json(&plain)["moved"], serde_json::Value::Null);
        assert_eq!(
            change_summary(&VersionRow {
                changes: None,
                ..plain
            }),
            "-"
        );

        let entry = |change, facts: crate::store::WriteFacts| TimelineRow {
            version: 3,
            address: "t.a[0]".into(),
            change,
            created_at: "t".into(),
            writer: "operator:ops".into(),
            lock_who: None,
            lock_operation: None,
            restored_from: None,
            moved_to: facts.moved_to,
            moved_from: facts.moved_from,
        };
        let moved = entry(Change::Removed, to("app"));
        assert_eq!(timeline_change(&moved), "moved to app");
        let json = timeline_json(&moved);
        assert_eq!(
            (&json["change"], &json["moved"]),
            (
                &serde_json::json!("moved"),
                &serde_json::json!({"to": "app"})
            )
        );
        assert_eq!(
            timeline_change(&entry(Change::Added, from("net"))),
            "moved from net"
        );
        // Not what the move moved: a source never gains, nothing moves in place.
        assert_eq!(timeline_change(&entry(Change::Added, to("app"))), "added");
        assert_eq!(
            timeline_change(&entry(Change::Changed, to("app"))),
            "changed"
        );
        assert_eq!(
            timeline_json(&entry(Change::Changed, to("app")))["change"],
            "changed"
        );
    }

    #[test]
    fn a_bare_workspace_name_is_its_audit_scope() {
        for (typed, want) in [
            ("prod", "tf/prod"),
            ("tf/prod", "tf/prod"),
            ("cluster/3f2a", "cluster/3f2a"),
            ("operators", "operators"),
            ("workspace-tokens", "workspace-tokens"),
            ("tf", "tf/tf"),
        ] {
            assert_eq!(audit_scope(typed), want, "{typed}");
        }
    }

    #[test]
    fn lock_states() {
        let lock = |info: &str| HeldLock {
            id: "L".into(),
            info: info.into(),
        };
        let long = "w".repeat(1000);
        // (LockInfo, created_at, now, stale_after) → (who, operation, age, stale)
        let at = "2026-01-01T00:00:00Z";
        let t0 = unix_seconds(at).unwrap();
        let info = r#"{"Who":"me@box","Operation":"OperationTypeApply"}"#;
        type Expected<'a> = (String, &'a str, i64, bool);
        let table: Vec<(String, &str, i64, i64, Expected)> = vec![
            (
                info.into(),
                at,
                t0 + 10,
                60,
                ("me@box".into(), "OperationTypeApply", 10, false),
            ),
            (
                info.into(),
                at,
                t0 + 61,
                60,
                ("me@box".into(), "OperationTypeApply", 61, true),
            ),
            (
                info.into(),
                at,
                t0 + 60,
                60,
                ("me@box".into(), "OperationTypeApply", 60, false),
            ),
            (
                info.into(),
                at,
                t0 - 5,
                60,
                ("me@box".into(), "OperationTypeApply", 0, false),
            ),
            (
                "not json".into(),
                "garbage",
                t0,
                60,
                (String::new(), "", 0, false),
            ),
            (
                format!(r#"{{"Who":"{long}"}}"#),
                at,
                t0,
                60,
                ("w".repeat(256), "", 0, false),
            ),
        ];
        for (info, created, now, stale_after, (who, op, age, stale)) in table {
            let s = lock_state(&lock(&info), created, now, stale_after);
            assert_eq!(
                (s.who, s.operation.as_str(), s.age_seconds, s.stale),
                (who, op, age, stale),
                "{info} {now}"
            );
        }
    }
}
