//! The workspace credentials a team manages (issue 21): the generation of each
//! workspace's derived credential (rotation), the grants of issued workspace tokens
//! (`sgw_`, whose secrets are `crate::tokens` of kind `workspace`), and the consumer
//! workspaces allowed to read a workspace's outputs (remote-state sharing). This module
//! owns `tf_credential_generations`, `tf_token_grants` and `tf_consumers`, and holds
//! their SQL; what a credential may do is the pure rule in `access`.
//!
//! - **Generation**: a workspace without a row is at generation 0, whose bearer is the
//!   seed design's `HKDF(DEK, "tf-backend" ‖ ws)`, so nothing a pipeline holds changes
//!   until someone rotates. Rotating bumps the row; the old bearer fails on the next
//!   request (the backend reads the row by primary key on every request, on an idle
//!   reader connection, never through the writer: a CLI on the data dir and the server
//!   see the same row).
//! - **Token grants**: workspace patterns, a scope and whether sensitive outputs are
//!   shown, keyed by the token's hash; the last time a token was used is kept in memory
//!   ([`LastUsed`]) and written in one transaction every [`LAST_USED_FLUSH`] and at
//!   shutdown, so a request never waits for the writer.
//! - **Consumers**: at most [`MAX_CONSUMERS`] workspaces per workspace; each consumer's
//!   own derived credential (at its generation) may read the outputs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::store::sql::{params, Connection, OptionalExtension};

use super::access::Scope;
use crate::error::Error;
use crate::names::{validate_workspace, Pattern};
use crate::store::audit::{insert_audit, AuditEntry};
use crate::store::DbError;
use crate::tokens;

/// The tables; `crate::schema` applies them.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tf_credential_generations (
    workspace   TEXT PRIMARY KEY,
    generation  INTEGER NOT NULL CHECK (generation > 0), -- no row: generation 0
    rotated_at  TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS tf_token_grants (
    token_sha256      TEXT PRIMARY KEY,  -- tokens.sha256 of a token of kind 'workspace'
    patterns          TEXT NOT NULL,     -- JSON array of workspace patterns
    scope             TEXT NOT NULL CHECK (scope IN ('outputs', 'read', 'write')),
    include_sensitive INTEGER NOT NULL DEFAULT 0,
    last_used_unix    INTEGER            -- written in batches (LAST_USED_FLUSH)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS tf_consumers (
    workspace   TEXT NOT NULL,
    consumer    TEXT NOT NULL,
    PRIMARY KEY (workspace, consumer)
) WITHOUT ROWID;
"#;

/// Audit event of a rotation (payload: the new generation, never a secret).
pub const EVENT_ROTATED: &str = "tf.credential_rotated";
/// Audit events of issued workspace tokens (payload: id, name, patterns, scope, expiry).
pub const EVENT_TOKEN_CREATED: &str = "tf.token_created";
pub const EVENT_TOKEN_REVOKED: &str = "tf.token_revoked";
/// Audit event of a change to a workspace's consumers (payload: the new list).
pub const EVENT_CONSUMERS_SET: &str = "tf.consumers_set";

/// Most consumers one workspace may name. An outputs read that presents no other
/// credential derives this many bearers whatever the number named (none for a missing
/// workspace), so a refusal's time tells nothing of the list.
pub const MAX_CONSUMERS: usize = 64;
/// Most workspace patterns one token may carry.
pub const MAX_PATTERNS: usize = 32;
/// Longest token name.
pub const MAX_NAME_LEN: usize = 64;
/// Longest expiry: ten years.
pub const MAX_EXPIRY_DAYS: u64 = 3650;
/// How often the last-used times of tokens reach the database.
pub const LAST_USED_FLUSH: Duration = Duration::from_secs(60);

/// Input that breaks a rule. The messages state the rule, never echo the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("invalid token name: use 1-64 characters from A-Z a-z 0-9 . _ - starting with a letter or digit")]
    Name,
    #[error(
        "invalid workspace patterns: give 1-32 comma-separated patterns of A-Z a-z 0-9 . _ - and *"
    )]
    Patterns,
    #[error("invalid expiry: use a number of days (30d) or hours (12h), at most 3650 days")]
    Expiry,
    #[error("invalid consumers: give at most 64 comma-separated workspace names, not the workspace itself")]
    Consumers,
}

/// A token name: the workspace naming rule with a shorter limit.
pub fn check_name(name: &str) -> Result<String, Invalid> {
    let name = name.trim();
    if name.len() > MAX_NAME_LEN || validate_workspace(name).is_err() {
        return Err(Invalid::Name);
    }
    Ok(name.to_string())
}

/// `prod-*,staging` → its patterns (1 to [`MAX_PATTERNS`]).
pub fn parse_patterns(text: &str) -> Result<Vec<Pattern>, Invalid> {
    let patterns: Vec<Pattern> = text
        .split(',')
        .map(Pattern::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| Invalid::Patterns)?;
    if patterns.is_empty() || patterns.len() > MAX_PATTERNS {
        return Err(Invalid::Patterns);
    }
    Ok(patterns)
}

/// `30d` / `12h` → seconds (positive, at most [`MAX_EXPIRY_DAYS`]).
pub fn parse_expiry(text: &str) -> Result<i64, Invalid> {
    let text = text.trim();
    let (number, unit) = text.split_at(text.len().saturating_sub(1));
    let per = match unit {
        "d" => 86_400,
        "h" => 3_600,
        _ => return Err(Invalid::Expiry),
    };
    let n: u64 = number
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or(Invalid::Expiry)?;
    let seconds = n.checked_mul(per).ok_or(Invalid::Expiry)?;
    if seconds > MAX_EXPIRY_DAYS * 86_400 {
        return Err(Invalid::Expiry);
    }
    i64::try_from(seconds).map_err(|_| Invalid::Expiry)
}

/// `app-a,app-b` → distinct valid workspace names other than `workspace` (empty: none).
pub fn parse_consumers(workspace: &str, text: &str) -> Result<Vec<String>, Invalid> {
    let mut out: Vec<String> = Vec::new();
    for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if validate_workspace(name).is_err() || name == workspace {
            return Err(Invalid::Consumers);
        }
        if !out.iter().any(|n| n == name) {
            out.push(name.to_string());
        }
    }
    if out.len() > MAX_CONSUMERS {
        return Err(Invalid::Consumers);
    }
    Ok(out)
}

/// What an issued token may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub patterns: Vec<Pattern>,
    pub scope: Scope,
    /// Sensitive outputs are in the outputs-only state (a read or write scope sees the
    /// whole state anyway).
    pub include_sensitive: bool,
}

impl Grant {
    pub fn covers(&self, workspace: &str) -> bool {
        self.patterns.iter().any(|p| p.matches(workspace))
    }

    fn patterns_json(&self) -> String {
        let texts: Vec<&str> = self.patterns.iter().map(Pattern::as_str).collect();
        serde_json::to_string(&texts).unwrap_or_else(|_| "[]".into())
    }
}

/// A stored grant that cannot be read grants nothing (no pattern matches, outputs only).
fn grant_from_row(patterns: &str, scope: &str, include_sensitive: bool) -> Grant {
    let parsed: Option<Vec<Pattern>> = serde_json::from_str::<Vec<String>>(patterns)
        .ok()
        .and_then(|texts| texts.iter().map(|t| Pattern::parse(t).ok()).collect());
    match (parsed, Scope::parse(scope)) {
        (Some(patterns), Ok(scope)) => Grant {
            patterns,
            scope,
            include_sensitive,
        },
        _ => Grant {
            patterns: vec![Pattern::nothing()],
            scope: Scope::Outputs,
            include_sensitive: false,
        },
    }
}

/// The current generation of `workspace`'s derived credential (0 without a row).
pub fn generation(conn: &Connection, workspace: &str) -> Result<u64, crate::store::sql::Error> {
    let found: Option<i64> = conn
        .prepare_cached("SELECT generation FROM tf_credential_generations WHERE workspace = ?1")?
        .query_row([workspace], |r| r.get(0))
        .optional()?;
    Ok(found.map_or(0, |g| u64::try_from(g).unwrap_or(0)))
}

/// Moves `workspace` to its next generation; returns it.
pub fn rotate(
    conn: &Connection,
    workspace: &str,
    at: &str,
) -> Result<u64, crate::store::sql::Error> {
    conn.prepare_cached(
        "INSERT INTO tf_credential_generations (workspace, generation, rotated_at)
         VALUES (?1, 1, ?2)
         ON CONFLICT (workspace) DO UPDATE
           SET generation = tf_credential_generations.generation + 1, rotated_at = ?2",
    )?
    .execute(params![workspace, at])?;
    generation(conn, workspace)
}

/// Records what the token `token_sha256` (just issued) may do.
pub fn insert_grant(
    conn: &Connection,
    token_sha256: &str,
    grant: &Grant,
) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached(
        "INSERT INTO tf_token_grants (token_sha256, patterns, scope, include_sensitive)
         VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![
        token_sha256,
        grant.patterns_json(),
        grant.scope.as_str(),
        grant.include_sensitive
    ])?;
    Ok(())
}

/// The grant and last-used time of a token, by its hash.
pub fn grant_of(
    conn: &Connection,
    token_sha256: &str,
) -> Result<Option<(Grant, Option<i64>)>, crate::store::sql::Error> {
    conn.prepare_cached(
        "SELECT patterns, scope, include_sensitive, last_used_unix FROM tf_token_grants
          WHERE token_sha256 = ?1",
    )?
    .query_row([token_sha256], |r| {
        let grant = grant_from_row(&r.get::<_, String>(0)?, &r.get::<_, String>(1)?, r.get(2)?);
        Ok((grant, r.get(3)?))
    })
    .optional()
}

/// Whether the issued workspace token named `name` is provably gone at `now` — every
/// token ever issued under the name revoked or expired (a name reissued to a live token
/// is not gone) — and the last time any of them was used (as written; the pending times
/// of this node are flushed first by the caller). `None`: not gone, or no such token.
pub fn token_end(
    conn: &Connection,
    name: &str,
    now: i64,
) -> Result<Option<(super::lock::Gone, Option<i64>)>, crate::store::sql::Error> {
    let named = tokens::named(conn, tokens::Kind::Workspace, name)?;
    if named.is_empty() || named.iter().any(|t| t.is_live(now)) {
        return Ok(None);
    }
    let why = if named.iter().any(|t| t.revoked) {
        super::lock::Gone::TokenRevoked
    } else {
        super::lock::Gone::TokenExpired
    };
    let mut last_used = None;
    for t in &named {
        let used = grant_of(conn, &t.sha256)?.and_then(|(_, used)| used);
        last_used = last_used.max(used);
    }
    Ok(Some((why, last_used)))
}

/// Writes a batch of last-used times (never moving one back).
pub fn record_last_used(
    conn: &Connection,
    used: &HashMap<String, i64>,
) -> Result<(), crate::store::sql::Error> {
    let mut stmt = conn.prepare_cached(
        "UPDATE tf_token_grants SET last_used_unix = ?2
          WHERE token_sha256 = ?1 AND (last_used_unix IS NULL OR last_used_unix < ?2)",
    )?;
    for (sha256, at) in used {
        stmt.execute(params![sha256, at])?;
    }
    Ok(())
}

/// The consumers `workspace` names, each with its own credential generation.
pub fn consumers_with_generations(
    conn: &Connection,
    workspace: &str,
) -> Result<Vec<(String, u64)>, crate::store::sql::Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT c.consumer, coalesce(g.generation, 0) FROM tf_consumers c
           LEFT JOIN tf_credential_generations g ON g.workspace = c.consumer
          WHERE c.workspace = ?1 ORDER BY c.consumer LIMIT ?2",
    )?;
    let rows = stmt
        .query_map(params![workspace, MAX_CONSUMERS as i64], |r| {
            Ok((r.get(0)?, u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0)))
        })?
        .collect();
    rows
}

/// The consumers `workspace` names.
pub fn consumers(
    conn: &Connection,
    workspace: &str,
) -> Result<Vec<String>, crate::store::sql::Error> {
    Ok(consumers_with_generations(conn, workspace)?
        .into_iter()
        .map(|(c, _)| c)
        .collect())
}

/// Replaces `workspace`'s consumers with `names` (empty: none).
pub fn set_consumers(
    conn: &Connection,
    workspace: &str,
    names: &[String],
) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached("DELETE FROM tf_consumers WHERE workspace = ?1")?
        .execute([workspace])?;
    let mut insert =
        conn.prepare_cached("INSERT INTO tf_consumers (workspace, consumer) VALUES (?1, ?2)")?;
    for name in names {
        insert.execute(params![workspace, name])?;
    }
    Ok(())
}

/// The record of a change of `workspace`'s consumers from `before` to `after`, kept
/// in the store before it commits so a restore re-applies it ([`reapply_consumers`]).
pub fn consumers_narrowing(
    workspace: &str,
    before: &[String],
    after: &[String],
    actor: &str,
) -> tokens::Narrowing {
    let sorted = |list: &[String]| {
        let mut list = list.to_vec();
        list.sort();
        serde_json::json!(list)
    };
    tokens::Narrowing {
        kind: tokens::NARROWING_CONSUMERS.into(),
        subject: workspace.to_string(),
        from: sorted(before),
        to: sorted(after),
        at_ms: tokens::now_ms(),
        actor: actor.to_string(),
    }
}

/// Brings a restored database up to a recorded consumers change when the snapshot
/// (taken at `taken_unix`) predates it (`tokens::Narrowing::needed`), audited as
/// `tf.consumers_set` by `actor` with the record's time and author. Whether it was
/// applied.
pub fn reapply_consumers(
    conn: &Connection,
    change: &tokens::Narrowing,
    taken_unix: i64,
    actor: &str,
) -> Result<bool, Error> {
    let workspace = change.subject.as_str();
    validate_workspace(workspace)?;
    let names: Vec<String> = serde_json::from_value(change.to.clone())
        .map_err(|_| Error::Invalid("a recorded consumers change does not read".into()))?;
    let names =
        parse_consumers(workspace, &names.join(",")).map_err(|e| Error::Invalid(e.to_string()))?;
    let current = serde_json::json!(consumers(conn, workspace).map_err(db_error)?);
    if !change.needed(&current, taken_unix) {
        return Ok(false);
    }
    set_consumers(conn, workspace, &names).map_err(db_error)?;
    let entry = AuditEntry::new(
        actor,
        super::scope(workspace),
        EVENT_CONSUMERS_SET,
        serde_json::json!({
            "consumers": names,
            "reapplied": { "recorded_at": change.recorded_at(), "recorded_by": change.actor },
        }),
    );
    insert_audit(conn, &entry).map_err(db_error)?;
    Ok(true)
}

/// What one request's credential check reads, in one short lookup on a reader: the
/// workspace's generation, the issued token the secret may be (found by its hash, live
/// or not, so every refusal costs the same), and for an outputs read the consumers.
#[derive(Debug, Default)]
pub struct Presented {
    pub generation: u64,
    pub token: Option<(tokens::Stored, Option<Grant>)>,
    pub consumers: Vec<(String, u64)>,
    /// An outputs read: the consumers are checked (see `TofuBackend::judge_credential`).
    pub outputs: bool,
}

/// Whether `secret` has an issued workspace token's shape (its prefix), so that its
/// check looks the token up.
pub fn is_token_shaped(secret: &[u8]) -> bool {
    secret.starts_with(tokens::Kind::Workspace.prefix().as_bytes())
}

pub fn presented(
    conn: &Connection,
    workspace: &str,
    secret: &[u8],
    outputs: bool,
) -> Result<Presented, crate::store::sql::Error> {
    let generation = generation(conn, workspace)?;
    let token = if is_token_shaped(secret) {
        let stored = tokens::stored(conn, tokens::Kind::Workspace, secret)?;
        // The grant is looked up whether or not the token exists: the same work.
        let key = stored
            .as_ref()
            .map_or_else(|| tokens::hash(secret), |s| s.sha256.clone());
        let grant = grant_of(conn, &key)?.map(|(g, _)| g);
        stored.map(|s| (s, grant))
    } else {
        None
    };
    let consumers = if outputs {
        consumers_with_generations(conn, workspace)?
    } else {
        Vec::new()
    };
    Ok(Presented {
        generation,
        token,
        consumers,
        outputs,
    })
}

/// The last time each token was used, in memory until [`LastUsed::take`] hands the
/// batch to the writer. Bounded by the number of live tokens.
#[derive(Debug, Clone, Default)]
pub struct LastUsed(Arc<Mutex<HashMap<String, i64>>>);

impl LastUsed {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        // A panic elsewhere leaves at worst a lost timestamp.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn touch(&self, sha256: &str, at: i64) {
        let mut map = self.map();
        match map.get_mut(sha256) {
            Some(t) => *t = (*t).max(at),
            None => {
                map.insert(sha256.to_string(), at);
            }
        }
    }

    /// A not yet written time, for listings.
    pub fn pending(&self, sha256: &str) -> Option<i64> {
        self.map().get(sha256).copied()
    }

    pub fn take(&self) -> HashMap<String, i64> {
        std::mem::take(&mut *self.map())
    }

    /// Puts back a batch that could not be written (newer times win).
    pub fn put_back(&self, batch: HashMap<String, i64>) {
        for (sha256, at) in batch {
            self.touch(&sha256, at);
        }
    }
}

/// An issued workspace token as listings show it (never the secret).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkspaceToken {
    pub id: String,
    pub name: String,
    pub workspaces: Vec<String>,
    pub scope: &'static str,
    pub include_sensitive: bool,
    pub created_at: String,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<String>,
    /// Unix seconds, to within [`LAST_USED_FLUSH`] (and what the server has not yet
    /// written when listed through it).
    pub last_used: Option<i64>,
}

impl WorkspaceToken {
    /// Do the token's patterns cover `workspace`?
    pub fn covers(&self, workspace: &str) -> bool {
        self.workspaces
            .iter()
            .any(|p| Pattern::parse(p).is_ok_and(|p| p.matches(workspace)))
    }
}

/// A workspace token to issue.
#[derive(Debug, Clone)]
pub struct NewWorkspaceToken {
    pub name: String,
    pub grant: Grant,
    /// Seconds from now; `None`: until revoked.
    pub expires_in: Option<i64>,
}

/// What revoking a token did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Revoked {
    pub id: String,
    pub name: String,
    /// Whether the revocation was recorded in the blob store (so a restore from an
    /// older backup cannot undo it). `false`: in force, but take a backup.
    pub recorded: bool,
}

/// The audit scope of workspace-token events that name no one workspace.
pub const TOKEN_SCOPE: &str = "workspace-tokens";

fn token_audit(actor: &str, event: &'static str, payload: serde_json::Value) -> AuditEntry {
    AuditEntry::new(actor, TOKEN_SCOPE, event, payload)
}

fn db_error(e: crate::store::sql::Error) -> Error {
    Error::from(DbError::from(e))
}

impl super::TofuBackend {
    /// The current generation of `workspace`'s derived credential.
    pub async fn credential_generation(&self, workspace: &str) -> Result<u64, Error> {
        validate_workspace(workspace)?;
        let ws = workspace.to_string();
        Ok(self.db.read_quick(move |c| generation(c, &ws)).await?)
    }

    /// The `export` lines of `workspace env`, with the current credential.
    pub async fn client_env(
        &self,
        base_url: &str,
        workspace: &str,
        encryption: bool,
    ) -> Result<String, Error> {
        let generation = self.credential_generation(workspace).await?;
        Ok(super::client_env(
            base_url, workspace, &self.root, generation, encryption,
        ))
    }

    /// Rotates `workspace`'s derived credential: the old bearer fails from the next
    /// request on; audited as `tf.credential_rotated` by `actor` (the new generation,
    /// never a secret). Returns the new generation.
    pub async fn rotate_credential(&self, workspace: &str, actor: &str) -> Result<u64, Error> {
        validate_workspace(workspace)?;
        let ws = workspace.to_string();
        let actor = actor.to_string();
        self.db
            .write(move |conn| -> Result<u64, Error> {
                let generation =
                    rotate(conn, &ws, &crate::store::now_rfc3339()).map_err(db_error)?;
                let entry = AuditEntry::new(
                    actor,
                    super::scope(&ws),
                    EVENT_ROTATED,
                    serde_json::json!({ "generation": generation }),
                );
                insert_audit(conn, &entry).map_err(db_error)?;
                Ok(generation)
            })
            .await
    }

    /// Issues a workspace token; returns its secret (the only time it exists in clear)
    /// and its listing. A name an unrevoked token already has is refused (409).
    pub async fn create_token(
        &self,
        new: NewWorkspaceToken,
        actor: &str,
    ) -> Result<(String, WorkspaceToken), Error> {
        let name = check_name(&new.name).map_err(|e| Error::Invalid(e.to_string()))?;
        let actor = actor.to_string();
        let expires_at = new.expires_in.map(|s| tokens::now().saturating_add(s));
        let grant = new.grant;
        let issued = self
            .db
            .write(move |conn| -> Result<(tokens::Issued, Grant, String), Error> {
                if tokens::find_unrevoked_by_name(conn, tokens::Kind::Workspace, &name)
                    .map_err(db_error)?
                    .is_some()
                {
                    return Err(Error::Conflict(
                        "a live workspace token has this name already: revoke it or choose another name".into(),
                    ));
                }
                let issued = tokens::issue_named(
                    conn,
                    tokens::NewToken {
                        kind: tokens::Kind::Workspace,
                        owner_id: None,
                        parent: None,
                        expires_at,
                    },
                    Some(&name),
                )
                .map_err(|e| match e {
                    tokens::TokenError::Sql(e) => db_error(e),
                    other => Error::Internal {
                        public: "cannot issue a token; see the server log".into(),
                        detail: other.to_string(),
                    },
                })?;
                insert_grant(conn, &issued.sha256, &grant).map_err(db_error)?;
                let payload = serde_json::json!({
                    "id": issued.id(),
                    "name": name,
                    "workspaces": grant.patterns.iter().map(Pattern::as_str).collect::<Vec<_>>(),
                    "scope": grant.scope.as_str(),
                    "include_sensitive": grant.include_sensitive,
                    "expires_at": expires_at,
                });
                insert_audit(conn, &token_audit(&actor, EVENT_TOKEN_CREATED, payload))
                    .map_err(db_error)?;
                Ok((issued, grant, name))
            })
            .await?;
        let (issued, grant, name) = issued;
        let listed = WorkspaceToken {
            id: issued.id(),
            name,
            workspaces: grant
                .patterns
                .iter()
                .map(|p| p.as_str().to_string())
                .collect(),
            scope: grant.scope.as_str(),
            include_sensitive: grant.include_sensitive,
            created_at: crate::store::now_rfc3339(),
            expires_at,
            revoked_at: None,
            last_used: None,
        };
        Ok((issued.secret, listed))
    }

    /// Every workspace token, revoked ones included, oldest first.
    pub async fn list_tokens(&self) -> Result<Vec<WorkspaceToken>, Error> {
        let rows = self
            .db
            .read(|c| {
                let mut out = Vec::new();
                for t in tokens::list(c, tokens::Kind::Workspace)? {
                    let (grant, last_used) = grant_of(c, &t.sha256)?
                        .unwrap_or_else(|| (grant_from_row("", "", false), None));
                    out.push((t, grant, last_used));
                }
                Ok(out)
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|(t, grant, stored)| {
                let pending = self.last_used.pending(&t.sha256);
                WorkspaceToken {
                    name: t.name.unwrap_or_else(|| t.id.clone()),
                    id: t.id,
                    workspaces: grant
                        .patterns
                        .iter()
                        .map(|p| p.as_str().to_string())
                        .collect(),
                    scope: grant.scope.as_str(),
                    include_sensitive: grant.include_sensitive,
                    created_at: t.created_at,
                    expires_at: t.expires_at,
                    revoked_at: t.revoked_at,
                    last_used: stored.max(pending),
                }
            })
            .collect())
    }

    /// Revokes the unrevoked workspace token named `name_or_id` (its name, or its id as
    /// listings print it): recorded in the blob store first (`tokens::RevocationLog`),
    /// then revoked and audited as `tf.token_revoked` in one transaction.
    pub async fn revoke_token(&self, name_or_id: &str, actor: &str) -> Result<Revoked, Error> {
        let wanted = name_or_id.trim().to_string();
        let found = self
            .db
            .read(move |c| {
                if let Some(found) =
                    tokens::find_unrevoked_by_name(c, tokens::Kind::Workspace, &wanted)?
                {
                    return Ok(Some(found));
                }
                match tokens::find_unrevoked(c, tokens::Kind::Workspace, &wanted, "token") {
                    Ok(found) => Ok(Some(found)),
                    Err(tokens::TokenError::Sql(e)) => Err(e),
                    Err(_) => Ok(None),
                }
            })
            .await?
            .ok_or_else(|| {
                Error::NotFound("no live workspace token with this name or id".into())
            })?;
        let at = crate::store::now_rfc3339();
        let log = tokens::RevocationLog::new(self.store.blobs().clone(), self.root.clone());
        let recorded = match log.record(&found, &at).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, token = %found.id(), "the revocation is in force but could not be recorded in the blob store; take a backup once the store is reachable");
                false
            }
        };
        let actor = actor.to_string();
        let sha256 = found.sha256.clone();
        let name = self
            .db
            .write(move |conn| -> Result<String, Error> {
                let listed = tokens::list(conn, tokens::Kind::Workspace).map_err(db_error)?;
                let name = listed
                    .iter()
                    .find(|t| t.sha256 == sha256)
                    .and_then(|t| t.name.clone())
                    .unwrap_or_else(|| tokens::id_of(&sha256));
                if !tokens::revoke(conn, &sha256, &at).map_err(db_error)? {
                    return Err(Error::NotFound(
                        "no live workspace token with this name or id".into(),
                    ));
                }
                let payload = serde_json::json!({ "id": tokens::id_of(&sha256), "name": name });
                insert_audit(conn, &token_audit(&actor, EVENT_TOKEN_REVOKED, payload))
                    .map_err(db_error)?;
                Ok(name)
            })
            .await?;
        Ok(Revoked {
            id: found.id(),
            name,
            recorded,
        })
    }

    /// The consumers `workspace` names.
    pub async fn consumers(&self, workspace: &str) -> Result<Vec<String>, Error> {
        validate_workspace(workspace)?;
        let ws = workspace.to_string();
        Ok(self.db.read(move |c| consumers(c, &ws)).await?)
    }

    /// Replaces the consumers of `workspace` (an empty list clears them), audited as
    /// `tf.consumers_set` by `actor`.
    pub async fn set_consumers(
        &self,
        workspace: &str,
        names: Vec<String>,
        actor: &str,
    ) -> Result<Vec<String>, Error> {
        self.set_consumers_keeping(workspace, names, actor, |_| false)
            .await
    }

    /// [`Self::set_consumers`], keeping (after `names`, in the same transaction) the
    /// consumers named now that `keep` says to: those an operator limited to workspace
    /// patterns does not see, and so can neither name nor remove.
    pub async fn set_consumers_keeping(
        &self,
        workspace: &str,
        names: Vec<String>,
        actor: &str,
        keep: impl Fn(&str) -> bool + Send + 'static,
    ) -> Result<Vec<String>, Error> {
        validate_workspace(workspace)?;
        let given = parse_consumers(workspace, &names.join(","))
            .map_err(|e| Error::Invalid(e.to_string()))?;
        // What the list becomes: the given names and, of those there now, the ones the
        // caller keeps (a limited admin's hidden consumers). The same rule in the
        // transaction, over the list it reads there.
        let ending = |given: &[String], now: Vec<String>, keep: &dyn Fn(&str) -> bool| {
            let mut names = given.to_vec();
            for kept in now {
                if keep(&kept) && !names.contains(&kept) {
                    names.push(kept);
                }
            }
            if names.len() > MAX_CONSUMERS {
                return Err(Error::Invalid(Invalid::Consumers.to_string()));
            }
            Ok(names)
        };
        let ws = workspace.to_string();
        let before = self.db.read(move |c| consumers(c, &ws)).await?;
        // Recorded in the store before it commits (`tokens::NarrowingLog`), so a
        // restore from an older backup does not give a removed consumer its read back;
        // the record is the list that will be saved, and a refused change records nothing.
        let after = ending(&given, before.clone(), &keep)?;
        let change = consumers_narrowing(workspace, &before, &after, actor);
        let log = tokens::NarrowingLog::new(self.store.blobs().clone(), self.root.clone());
        if let Err(e) = log.record(&change).await {
            tracing::warn!(error = %e, workspace, "the consumers change is in force but could not be recorded in the blob store; take a backup once the store is reachable");
        }
        let ws = workspace.to_string();
        let actor = actor.to_string();
        self.db
            .write(move |conn| -> Result<Vec<String>, Error> {
                let names = ending(&given, consumers(conn, &ws).map_err(db_error)?, &keep)?;
                set_consumers(conn, &ws, &names).map_err(db_error)?;
                let entry = AuditEntry::new(
                    actor,
                    super::scope(&ws),
                    EVENT_CONSUMERS_SET,
                    serde_json::json!({ "consumers": names }),
                );
                insert_audit(conn, &entry).map_err(db_error)?;
                Ok(names)
            })
            .await
    }

    /// Writes the last-used times gathered since the last flush (one transaction).
    pub async fn flush_last_used(&self) -> Result<(), Error> {
        let batch = self.last_used.take();
        if batch.is_empty() {
            return Ok(());
        }
        let kept = batch.clone();
        let written = self
            .db
            .write(move |conn| record_last_used(conn, &batch).map_err(db_error))
            .await;
        if written.is_err() {
            self.last_used.put_back(kept);
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::schema::tests::test_index as db;

    #[test]
    fn input_rules() {
        assert_eq!(parse_expiry("30d"), Ok(30 * 86_400));
        assert_eq!(parse_expiry("12h"), Ok(12 * 3_600));
        assert_eq!(parse_expiry("3650d"), Ok(3650 * 86_400));
        for bad in [
            "",
            "d",
            "0d",
            "-1d",
            "30",
            "30m",
            "3651d",
            "99999999999999999999d",
            "1.5d",
        ] {
            assert_eq!(parse_expiry(bad), Err(Invalid::Expiry), "{bad:?}");
        }
        assert_eq!(parse_patterns("prod-*, staging").unwrap().len(), 2);
        let many = vec!["a"; MAX_PATTERNS + 1].join(",");
        for bad in ["", ",", "prod/*", "a,,b", "../x", &many[..]] {
            assert_eq!(parse_patterns(bad), Err(Invalid::Patterns), "{bad:?}");
        }
        assert_eq!(check_name(" ci "), Ok("ci".into()));
        for bad in ["", ".x", "a b", "ü", &"a".repeat(MAX_NAME_LEN + 1)[..]] {
            assert_eq!(check_name(bad), Err(Invalid::Name), "{bad:?}");
        }
        assert_eq!(
            parse_consumers("prod", "app-a, app-b,app-a").unwrap(),
            vec!["app-a".to_string(), "app-b".to_string()]
        );
        assert_eq!(parse_consumers("prod", "").unwrap(), Vec::<String>::new());
        let many: Vec<String> = (0..=MAX_CONSUMERS).map(|i| format!("w{i}")).collect();
        for bad in ["prod", "a/b", ".x", &many.join(",")[..]] {
            assert_eq!(
                parse_consumers("prod", bad),
                Err(Invalid::Consumers),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn generations_start_at_zero_and_rotate_per_workspace() {
        let (_dir, conn) = db();
        assert_eq!(generation(&conn, "prod").unwrap(), 0);
        assert_eq!(rotate(&conn, "prod", "t1").unwrap(), 1);
        assert_eq!(rotate(&conn, "prod", "t2").unwrap(), 2);
        assert_eq!(generation(&conn, "prod").unwrap(), 2);
        assert_eq!(generation(&conn, "dev").unwrap(), 0);
    }

    #[test]
    fn grants_consumers_and_last_used() {
        let (_dir, conn) = db();
        let grant = Grant {
            patterns: parse_patterns("prod-*").unwrap(),
            scope: Scope::Read,
            include_sensitive: true,
        };
        insert_grant(&conn, "h1", &grant).unwrap();
        assert!(grant.covers("prod-eu") && !grant.covers("dev"));
        assert_eq!(grant_of(&conn, "h1").unwrap(), Some((grant.clone(), None)));
        let used = LastUsed::default();
        used.touch("h1", 10);
        used.touch("h1", 5);
        assert_eq!(used.pending("h1"), Some(10));
        record_last_used(&conn, &used.take()).unwrap();
        record_last_used(&conn, &HashMap::from([("h1".to_string(), 3)])).unwrap();
        assert_eq!(grant_of(&conn, "h1").unwrap().unwrap().1, Some(10));
        assert_eq!(used.pending("h1"), None);
        // A row that cannot be read grants nothing.
        conn.execute(
            "INSERT INTO tf_token_grants (token_sha256, patterns, scope) VALUES ('h2', 'junk', 'write')",
            [],
        )
        .unwrap();
        let (broken, _) = grant_of(&conn, "h2").unwrap().unwrap();
        assert!(!broken.covers("prod") && broken.scope == Scope::Outputs);

        set_consumers(&conn, "prod", &["app-a".into(), "app-b".into()]).unwrap();
        rotate(&conn, "app-b", "t").unwrap();
        assert_eq!(
            consumers_with_generations(&conn, "prod").unwrap(),
            vec![("app-a".into(), 0), ("app-b".into(), 1)]
        );
        set_consumers(&conn, "prod", &[]).unwrap();
        assert!(consumers(&conn, "prod").unwrap().is_empty());
    }
}
