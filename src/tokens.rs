//! Every secret stategate issues, in one place: cluster-API tokens (`sgp_`), operator
//! tokens (`sgo_`), web UI session ids (`sgs_`) and issued workspace tokens (`sgw_`,
//! named, with an expiry; what each may do is `tofu::credentials`').
//!
//! One set of rules for all of them:
//! - **Generate**: 32 bytes from the OS (`getrandom`), base64url, behind the kind's
//!   prefix (so a leaked token is easy to grep for and tells what it is).
//! - **Store**: only the hex SHA-256 of the secret, in the `tokens` table this module
//!   owns. The secret has 256 bits of entropy, so a plain hash is enough: a copy of the
//!   database holds no usable credential.
//! - **Look up**: by that hash (the secret never reaches SQL), the stored hash then
//!   compared in constant time; unknown, revoked, expired, another kind's, or issued
//!   under a parent token that is no longer live all answer `None` after the same work.
//! - **List**: ids only (the first 12 hex digits of the hash), never the secret.
//! - **Revoke**: one rule for every kind: the row stays with `revoked_at` set, so the
//!   audit trail and listings can still name a revoked token, and a token issued under
//!   it (a UI session under its operator token) dies with it.
//!
//! Expiry is judged by [`now`] (and [`now_ms`]), the node's one clock, which also
//! records whether the node may trust it ([`clock_distrusted`]: a node sharing a
//! PostgreSQL index whose clock is out of step refuses what depends on expiry).
//!
//! A revocation must also survive a restore from a backup taken before it:
//! [`RevocationLog`] seals a small record of it into the blob store (under
//! `revocations/`, like backups are kept) before the revocation commits, and
//! [`after_restore`] re-applies every record to a restored database and ends every UI
//! session it holds (a session cannot be proven live across a restore).
//!
//! Who owns a token (a principal, an operator) and what it may do stays with the
//! module that issues it (`cluster::identity`, `operator::identity`, `ui::session`);
//! those modules never touch the `tokens` table themselves.

use crate::store::sql::{params, Connection, OptionalExtension};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use base64::Engine;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::crypto::RootKey;
use crate::store::format::{self, BlobHeader};
use crate::store::{BlobError, BlobStore};

/// The `tokens` table, and the move of older databases' (and backups') per-kind token
/// tables into it. The legacy tables are created empty when absent so the copy is one
/// idempotent script, then dropped; every issued token keeps working.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tokens (
    sha256      TEXT PRIMARY KEY,     -- hex SHA-256 of the secret; the secret itself is never stored
    kind        TEXT NOT NULL CHECK (kind IN ('principal', 'operator', 'session', 'workspace')),
    owner_id    INTEGER,              -- principals.id / operators.id, by kind
    parent      TEXT REFERENCES tokens(sha256), -- live only while this token is (a session's operator token)
    name        TEXT,
    created_at  TEXT NOT NULL,
    expires_at  INTEGER,              -- unix seconds; NULL: until revoked
    revoked_at  TEXT                  -- set once, never cleared; the row stays
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS tokens_by_kind ON tokens (kind, owner_id);

-- Before one table held every kind: cluster-API and operator tokens and UI sessions
-- (migrated, then dropped). A session's CSRF token is now derived from its id.
CREATE TABLE IF NOT EXISTS principal_tokens (
    token_sha256 TEXT PRIMARY KEY,
    principal_id INTEGER NOT NULL,
    created_at   TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS operator_tokens (
    token_sha256 TEXT PRIMARY KEY,
    operator_id  INTEGER NOT NULL,
    created_at   TEXT NOT NULL,
    revoked_at   TEXT
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ui_sessions (
    id_sha256    TEXT PRIMARY KEY,
    token_sha256 TEXT NOT NULL,
    csrf         TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    expires_at   INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO tokens (sha256, kind, owner_id, created_at)
    SELECT token_sha256, 'principal', principal_id, created_at FROM principal_tokens;
INSERT OR IGNORE INTO tokens (sha256, kind, owner_id, created_at, revoked_at)
    SELECT token_sha256, 'operator', operator_id, created_at, revoked_at FROM operator_tokens;
INSERT OR IGNORE INTO tokens (sha256, kind, owner_id, parent, created_at, expires_at)
    SELECT s.id_sha256, 'session', t.owner_id, s.token_sha256, s.created_at, s.expires_at
      FROM ui_sessions s JOIN tokens t ON t.sha256 = s.token_sha256 AND t.kind = 'operator';
DROP TABLE principal_tokens;
DROP TABLE operator_tokens;
DROP TABLE ui_sessions;
"#;

/// An earlier release's `tokens` table allows only the first three kinds (a CHECK
/// constraint, which SQLite cannot alter): it is rebuilt with the same rows under
/// [`SCHEMA`]'s definition. Idempotent (a table that allows `workspace` is left alone);
/// runs before the schemas, inside their transaction. The old table is renamed first
/// (so the only reference to it is its own `parent`), and dropped once copied.
pub fn migrate(conn: &Connection) -> Result<(), crate::store::sql::Error> {
    let Some(sql) = conn.table_definition("tokens")? else {
        return Ok(());
    };
    if sql.contains("'workspace'") {
        return Ok(());
    }
    conn.defer_foreign_keys()?;
    conn.execute_batch(
        "ALTER TABLE tokens RENAME TO tokens_v1;
         CREATE TABLE tokens (
            sha256      TEXT PRIMARY KEY,
            kind        TEXT NOT NULL CHECK (kind IN ('principal', 'operator', 'session', 'workspace')),
            owner_id    INTEGER,
            parent      TEXT REFERENCES tokens(sha256),
            name        TEXT,
            created_at  TEXT NOT NULL,
            expires_at  INTEGER,
            revoked_at  TEXT
         ) WITHOUT ROWID;
         INSERT INTO tokens (sha256, kind, owner_id, parent, name, created_at, expires_at, revoked_at)
             SELECT sha256, kind, owner_id, parent, name, created_at, expires_at, revoked_at
               FROM tokens_v1 ORDER BY parent IS NOT NULL;
         DROP TABLE tokens_v1;",
    )
}

/// What a token is for. Each kind has its own prefix; a token of one kind never
/// authenticates as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The cluster API's users (`cluster::identity`).
    Principal,
    /// Operators of the admin API and the web UI (`operator::identity`).
    Operator,
    /// A web UI session, issued under an operator token (`ui::session`).
    Session,
    /// A workspace token for Terraform clients, named, limited by `tofu::credentials`.
    Workspace,
}

impl Kind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Principal => "principal",
            Kind::Operator => "operator",
            Kind::Session => "session",
            Kind::Workspace => "workspace",
        }
    }

    /// What every secret of this kind starts with (unchanged since each kind was introduced).
    pub const fn prefix(self) -> &'static str {
        match self {
            Kind::Principal => "sgp_",
            Kind::Operator => "sgo_",
            Kind::Session => "sgs_",
            Kind::Workspace => "sgw_",
        }
    }

    fn parse(text: &str) -> Option<Kind> {
        [
            Kind::Principal,
            Kind::Operator,
            Kind::Session,
            Kind::Workspace,
        ]
        .into_iter()
        .find(|k| k.as_str() == text)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("a token id is {ID_LEN} hex digits, as `token list` prints it")]
    BadId,
    #[error("no {what} with id {id}")]
    NotFound { what: &'static str, id: String },
    #[error("no randomness available from the OS: {0}")]
    Random(String),
    /// A statement of the index failed.
    #[error("database error: {0}")]
    Sql(#[from] crate::store::sql::Error),
}

/// Hex SHA-256 of a secret: the only form a secret is stored or looked up in.
pub fn hash(secret: &[u8]) -> String {
    hex::encode(Sha256::digest(secret))
}

/// A fresh secret: `prefix` + 43 characters of base64url (32 bytes from the OS).
pub fn generate(prefix: &str) -> Result<String, TokenError> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|e| TokenError::Random(e.to_string()))?;
    Ok(format!("{prefix}{}", BASE64URL.encode(bytes)))
}

/// How a stored token is named in listings, revocations and the audit log: the first
/// 12 hex digits of its hash (the hash of 32 random bytes; it reveals nothing usable).
pub const ID_LEN: usize = 12;

pub fn id_of(sha256: &str) -> String {
    sha256.chars().take(ID_LEN).collect()
}

/// A token id as typed by an operator: exactly [`ID_LEN`] hex digits (any case).
pub fn parse_id(text: &str) -> Result<String, TokenError> {
    let id = text.trim().to_ascii_lowercase();
    if id.len() == ID_LEN && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(id)
    } else {
        Err(TokenError::BadId)
    }
}

// The clock lives on the ground floor (`crate::clock`); these names stay for the
// modules above that read it through `tokens`.
pub use crate::clock::{clock_distrusted, judge_clock, now, now_ms, shift_clock_for_tests};

/// A token to issue.
#[derive(Debug, Clone, Copy)]
pub struct NewToken<'a> {
    pub kind: Kind,
    pub owner_id: Option<i64>,
    /// The hash of the token this one is issued under: it is live only while that one is.
    pub parent: Option<&'a str>,
    pub expires_at: Option<i64>,
}

/// A token just issued: the secret (the only time it exists in clear) and its hash.
#[derive(Debug)]
pub struct Issued {
    pub secret: String,
    pub sha256: String,
}

impl Issued {
    pub fn id(&self) -> String {
        id_of(&self.sha256)
    }
}

/// Generates a secret of `new.kind` and stores its hash.
pub fn issue(conn: &Connection, new: NewToken<'_>) -> Result<Issued, TokenError> {
    issue_named(conn, new, None)
}

/// [`issue`] with a name the token is listed, revoked and recorded under (a workspace
/// token's; the caller decides what names are unique).
pub fn issue_named(
    conn: &Connection,
    new: NewToken<'_>,
    name: Option<&str>,
) -> Result<Issued, TokenError> {
    let secret = generate(new.kind.prefix())?;
    let sha256 = hash(secret.as_bytes());
    conn.prepare_cached(
        "INSERT INTO tokens (sha256, kind, owner_id, parent, created_at, expires_at, name)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        sha256,
        new.kind.as_str(),
        new.owner_id,
        new.parent,
        crate::store::now_rfc3339(),
        new.expires_at,
        name
    ])?;
    Ok(Issued { secret, sha256 })
}

/// The stored token of `kind` whose secret is `secret`, live or not: its hash, name,
/// expiry and whether it was revoked. For a kind whose refusals must all cost the same
/// (workspace tokens): the caller decides liveness after the same single lookup.
pub fn stored(
    conn: &Connection,
    kind: Kind,
    secret: &[u8],
) -> Result<Option<Stored>, crate::store::sql::Error> {
    let presented = hash(secret);
    let found: Option<Stored> = conn
        .prepare_cached(&format!(
            "SELECT {STORED_COLUMNS} FROM tokens WHERE sha256 = ?1 AND kind = ?2"
        ))?
        .query_row(params![presented, kind.as_str()], Stored::from_row)
        .optional()?;
    // The index found the row by the hash; the comparison that decides is constant time.
    Ok(found.filter(|s| bool::from(s.sha256.as_bytes().ct_eq(presented.as_bytes()))))
}

/// A stored token as [`stored`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub sha256: String,
    pub name: Option<String>,
    pub expires_at: Option<i64>,
    pub revoked: bool,
}

/// The columns [`Stored::from_row`] reads, in its order.
const STORED_COLUMNS: &str = "sha256, name, expires_at, revoked_at IS NOT NULL";

impl Stored {
    fn from_row(r: &crate::store::sql::Row<'_>) -> Result<Stored, crate::store::sql::Error> {
        Ok(Stored {
            sha256: r.get(0)?,
            name: r.get(1)?,
            expires_at: r.get(2)?,
            revoked: r.get(3)?,
        })
    }

    /// Not revoked and not expired at `now` (unix seconds).
    pub fn is_live(&self, now: i64) -> bool {
        !self.revoked && self.expires_at.is_none_or(|at| at > now)
    }
}

/// Every token of `kind` named `name` (as it was issued), revoked or expired ones too.
pub fn named(
    conn: &Connection,
    kind: Kind,
    name: &str,
) -> Result<Vec<Stored>, crate::store::sql::Error> {
    let rows = conn
        .prepare_cached(&format!(
            "SELECT {STORED_COLUMNS} FROM tokens WHERE kind = ?1 AND name = ?2"
        ))?
        .query_map(params![kind.as_str(), name], Stored::from_row)?
        .collect();
    rows
}

/// The unrevoked token of `kind` named `name` (as it was issued), if exactly one is.
pub fn find_unrevoked_by_name(
    conn: &Connection,
    kind: Kind,
    name: &str,
) -> Result<Option<Found>, crate::store::sql::Error> {
    let found: Vec<(String, Option<i64>)> = conn
        .prepare(
            "SELECT sha256, owner_id FROM tokens
              WHERE kind = ?1 AND name = ?2 AND revoked_at IS NULL",
        )?
        .query_map(params![kind.as_str(), name], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    Ok(match found.as_slice() {
        [(sha256, owner_id)] => Some(Found {
            kind,
            sha256: sha256.clone(),
            owner_id: *owner_id,
        }),
        _ => None,
    })
}

/// A live token: its hash and owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Live {
    pub sha256: String,
    pub owner_id: Option<i64>,
    /// The token it was issued under, if any.
    pub parent: Option<String>,
}

/// The live token of `kind` whose secret is `secret`, at `now` (unix seconds): not
/// revoked, not expired, and, when issued under another token, that one live too.
pub fn live(
    conn: &Connection,
    kind: Kind,
    secret: &[u8],
    now: i64,
) -> Result<Option<Live>, crate::store::sql::Error> {
    let presented = hash(secret);
    let found: Option<(String, Option<i64>, Option<String>)> = conn
        .prepare_cached(
            "SELECT t.sha256, t.owner_id, t.parent FROM tokens t
              WHERE t.sha256 = ?1 AND t.kind = ?2 AND t.revoked_at IS NULL
                AND (t.expires_at IS NULL OR t.expires_at > ?3)
                AND (t.parent IS NULL OR EXISTS (
                     SELECT 1 FROM tokens p WHERE p.sha256 = t.parent AND p.revoked_at IS NULL
                        AND (p.expires_at IS NULL OR p.expires_at > ?3)))",
        )?
        .query_row(params![presented, kind.as_str(), now], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    // The index found the row by the hash; the comparison that decides is constant time.
    Ok(found
        .filter(|(stored, _, _)| bool::from(stored.as_bytes().ct_eq(presented.as_bytes())))
        .map(|(sha256, owner_id, parent)| Live {
            sha256,
            owner_id,
            parent,
        }))
}

/// A stored token as listings show it: never the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub id: String,
    /// The full hash (what other modules key their rows on); never shown.
    pub sha256: String,
    pub name: Option<String>,
    pub owner_id: Option<i64>,
    pub created_at: String,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<String>,
}

/// Every token of `kind` (revoked ones included), oldest first.
pub fn list(conn: &Connection, kind: Kind) -> Result<Vec<Listed>, crate::store::sql::Error> {
    let mut stmt = conn.prepare(
        "SELECT sha256, owner_id, created_at, expires_at, revoked_at, name FROM tokens
          WHERE kind = ?1 ORDER BY created_at, sha256",
    )?;
    let rows = stmt
        .query_map([kind.as_str()], |r| {
            let sha256: String = r.get(0)?;
            Ok(Listed {
                id: id_of(&sha256),
                sha256,
                name: r.get(5)?,
                owner_id: r.get(1)?,
                created_at: r.get(2)?,
                expires_at: r.get(3)?,
                revoked_at: r.get(4)?,
            })
        })?
        .collect();
    rows
}

/// An unrevoked token found by its id, about to be revoked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub kind: Kind,
    pub sha256: String,
    pub owner_id: Option<i64>,
}

impl Found {
    pub fn id(&self) -> String {
        id_of(&self.sha256)
    }
}

/// The unrevoked token of `kind` named by `id` (as listings print it). `what` names
/// the kind in the error ("operator token"). An id matching several is not found.
pub fn find_unrevoked(
    conn: &Connection,
    kind: Kind,
    id: &str,
    what: &'static str,
) -> Result<Found, TokenError> {
    let id = parse_id(id)?;
    let found: Vec<(String, Option<i64>)> = conn
        .prepare(
            "SELECT sha256, owner_id FROM tokens
              WHERE kind = ?1 AND substr(sha256, 1, 12) = ?2 AND revoked_at IS NULL",
        )?
        .query_map(params![kind.as_str(), id], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    match found.as_slice() {
        [(sha256, owner_id)] => Ok(Found {
            kind,
            sha256: sha256.clone(),
            owner_id: *owner_id,
        }),
        _ => Err(TokenError::NotFound { what, id }),
    }
}

/// The one revoke rule: sets `revoked_at` on the token (the row stays); `false` when
/// it was revoked already or does not exist. Tokens issued under it die with it.
pub fn revoke(conn: &Connection, sha256: &str, at: &str) -> Result<bool, crate::store::sql::Error> {
    let changed = conn
        .prepare_cached(
            "UPDATE tokens SET revoked_at = ?1 WHERE sha256 = ?2 AND revoked_at IS NULL",
        )?
        .execute(params![at, sha256])?;
    Ok(changed > 0)
}

/// The unrevoked tokens of `kind` that `owner_id` holds (to revoke them all).
pub fn unrevoked_of(
    conn: &Connection,
    kind: Kind,
    owner_id: i64,
) -> Result<Vec<Found>, crate::store::sql::Error> {
    let mut stmt = conn.prepare(
        "SELECT sha256 FROM tokens WHERE kind = ?1 AND owner_id = ?2 AND revoked_at IS NULL",
    )?;
    let rows = stmt
        .query_map(params![kind.as_str(), owner_id], |r| {
            Ok(Found {
                kind,
                sha256: r.get(0)?,
                owner_id: Some(owner_id),
            })
        })?
        .collect();
    rows
}

/// Deletes the tokens of `kind` that expired before `now`: an expired row authenticates
/// nothing and names nothing the audit log needs (sessions are not named there).
pub fn sweep_expired(
    conn: &Connection,
    kind: Kind,
    now: i64,
) -> Result<usize, crate::store::sql::Error> {
    conn.prepare_cached("DELETE FROM tokens WHERE kind = ?1 AND expires_at <= ?2")?
        .execute(params![kind.as_str(), now])
}

/// Where revocation records live in the store (never listed by the rebuild or the sweep).
pub const REVOCATIONS_PREFIX: &str = "revocations/";
const RECORD_VERSION: i64 = 1;

/// One revocation as kept in the store: which token and when. The hash of a secret is
/// no credential; the record is sealed anyway, under a DEK-derived key bound to it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Revocation {
    pub kind: String,
    pub sha256: String,
    pub revoked_at: String,
}

/// A record's scope and key from its name (a token hash, or a narrowing's name).
fn record_scope(name: &str) -> String {
    format!("revocation/{name}")
}

fn record_key(name: &str) -> String {
    format!("{REVOCATIONS_PREFIX}{name}.sgr")
}

/// A record's scope and key are made from a token hash: 64 lowercase hex digits.
fn is_token_hash(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error("cannot seal the revocation record: {0}")]
    Seal(#[from] crate::crypto::SealError),
    #[error("revocation record {key} cannot be opened (wrong DEK or tampered with): {reason}")]
    Unreadable { key: String, reason: String },
}

/// Where revocations are recorded so a restore cannot undo them: the blob store, under
/// the DEK. [`Self::record`] runs before the revocation's commit.
#[derive(Clone)]
pub struct RevocationLog {
    blobs: std::sync::Arc<dyn BlobStore>,
    root: RootKey,
}

/// Seals `record` as JSON under `scope`'s key and puts it at `key` (durable when this
/// returns): the one shape of the store's revocation and narrowing records.
async fn put_record<T: serde::Serialize>(
    blobs: &dyn BlobStore,
    root: &RootKey,
    key: &str,
    scope: &str,
    record: &T,
    at: &str,
    actor: &str,
) -> Result<(), RecordError> {
    let body = serde_json::to_vec(record).map_err(|e| RecordError::Unreadable {
        key: key.to_string(),
        reason: e.to_string(),
    })?;
    let header = BlobHeader {
        scope: scope.to_string(),
        version: RECORD_VERSION,
        serial: None,
        lineage: None,
        sha256: hex::encode(format::sha2_digest(&body)),
        size: body.len() as i64,
        created_at: at.to_string(),
        actor: actor.into(),
        parent: None,
        facts: Default::default(),
        // What `encode` seals under decides the generation named in the blob.
        key_gen: 0,
    };
    let sealed = format::encode(&root.blob_key(scope), &header, &body)?;
    blobs.put(key, Bytes::from(sealed)).await?;
    Ok(())
}

/// Every record in the store whose name (its key less prefix and `.sgr`) `ours`
/// accepts, opened under `root`. A record that does not open, or whose content
/// `names_another` finds does not match its name, is an error: a restore must not go
/// on believing less was recorded than was.
async fn open_records<T: serde::de::DeserializeOwned>(
    blobs: &dyn BlobStore,
    root: &RootKey,
    ours: impl Fn(&str) -> bool,
    names_another: impl Fn(&str, &T) -> Option<&'static str>,
) -> Result<Vec<T>, RecordError> {
    let mut out = Vec::new();
    for key in blobs.list(REVOCATIONS_PREFIX).await? {
        let Some(name) = key
            .strip_prefix(REVOCATIONS_PREFIX)
            .and_then(|k| k.strip_suffix(".sgr"))
            .filter(|n| ours(n))
        else {
            continue; // another kind of record, or not ours
        };
        let Some(sealed) = blobs.get(&key).await? else {
            continue; // deleted since the listing
        };
        let unreadable = |reason: String| RecordError::Unreadable {
            key: key.clone(),
            reason,
        };
        let scope = record_scope(name);
        let header = format::read_header(&sealed).map_err(|e| unreadable(e.to_string()))?;
        let body = format::decode(
            &root.blob_key(&scope),
            &sealed,
            &scope,
            RECORD_VERSION,
            Some(&header.sha256),
        )
        .map_err(|e| unreadable(e.to_string()))?;
        let record: T = serde_json::from_slice(&body).map_err(|e| unreadable(e.to_string()))?;
        if let Some(why) = names_another(name, &record) {
            return Err(unreadable(why.into()));
        }
        out.push(record);
    }
    Ok(out)
}

impl RevocationLog {
    pub fn new(blobs: std::sync::Arc<dyn BlobStore>, root: RootKey) -> Self {
        RevocationLog { blobs, root }
    }

    /// Seals and puts the record of `found`'s revocation (durable when this returns).
    pub async fn record(&self, found: &Found, at: &str) -> Result<(), RecordError> {
        let record = Revocation {
            kind: found.kind.as_str().to_string(),
            sha256: found.sha256.clone(),
            revoked_at: at.to_string(),
        };
        let scope = record_scope(&found.sha256);
        let key = record_key(&found.sha256);
        put_record(
            &*self.blobs,
            &self.root,
            &key,
            &scope,
            &record,
            at,
            "stategate revocation",
        )
        .await
    }

    /// Every revocation recorded in the store. A record that does not open under this
    /// DEK, or whose content does not name the token its key names, is an error: a
    /// restore must not go on believing fewer tokens are revoked than were.
    pub async fn load(&self) -> Result<Vec<Revocation>, RecordError> {
        open_records(
            &*self.blobs,
            &self.root,
            is_token_hash,
            |name, r: &Revocation| {
                (r.sha256 != name || Kind::parse(&r.kind).is_none())
                    .then_some("the record names another token")
            },
        )
        .await
    }
}

/// A narrowing (or any change of what someone may do that the index alone holds: an
/// operator's grant or single sign-on cap, a workspace's consumers) as kept in the
/// store, so a restore from an older backup re-applies it like a revocation. The
/// owner of the rule writes `subject`, `from` and `to` and re-applies them
/// (`operator::identity`, `tofu::credentials`); this module only seals and reads.
/// One record per (kind, subject): the newest change replaces the one before.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Narrowing {
    /// Whose rule: [`NARROWING_GRANT`] or [`NARROWING_CONSUMERS`].
    pub kind: String,
    /// What it is about: an operator, a workspace (the owner's words).
    pub subject: String,
    /// What held before the change and after it (the owner's words).
    pub from: serde_json::Value,
    pub to: serde_json::Value,
    /// When it was recorded (unix milliseconds), just before its commit.
    pub at_ms: i64,
    /// Who made it (the audit log's actor).
    pub actor: String,
}

/// An operator's grant or single sign-on cap (`operator::identity`).
pub const NARROWING_GRANT: &str = "operator_grant";
/// A workspace's consumers (`tofu::credentials`).
pub const NARROWING_CONSUMERS: &str = "consumers";

impl Narrowing {
    /// Does a restored database whose value is `current` (from a snapshot taken at
    /// `taken_unix`) need this change again? Not when it holds it already; yes when
    /// it holds what the change replaced (the snapshot was taken before it
    /// committed), or when the change was recorded after the snapshot was taken.
    /// Otherwise the snapshot holds a later change than this record: it stays.
    pub fn needed(&self, current: &serde_json::Value, taken_unix: i64) -> bool {
        current != &self.to
            && (current == &self.from || self.at_ms >= taken_unix.saturating_mul(1000))
    }

    /// When it was recorded, as RFC 3339 (for the audit row and the report).
    pub fn recorded_at(&self) -> String {
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.at_ms) * 1_000_000)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_default()
    }
}

/// The name a narrowing is kept under: a hash of its kind and subject, so the newest
/// change of one subject replaces the one before. Under [`REVOCATIONS_PREFIX`] (and
/// scope `revocation/…`) so `key reseal` and `key status` treat it as a revocation
/// record; [`RevocationLog::load`] skips it (not a token hash).
fn narrowing_name(kind: &str, subject: &str) -> String {
    let mut joined = kind.as_bytes().to_vec();
    joined.push(0);
    joined.extend_from_slice(subject.as_bytes());
    format!("narrowing-{}", hash(&joined))
}

/// Where narrowings are recorded so a restore cannot undo them: beside the
/// revocations, under the DEK. [`Self::record`] runs before the change's commit.
#[derive(Clone)]
pub struct NarrowingLog {
    blobs: std::sync::Arc<dyn BlobStore>,
    root: RootKey,
}

impl NarrowingLog {
    pub fn new(blobs: std::sync::Arc<dyn BlobStore>, root: RootKey) -> Self {
        NarrowingLog { blobs, root }
    }

    /// Seals and puts `change` (durable when this returns), replacing the record of
    /// the subject's change before.
    pub async fn record(&self, change: &Narrowing) -> Result<(), RecordError> {
        let name = narrowing_name(&change.kind, &change.subject);
        let key = record_key(&name);
        let scope = record_scope(&name);
        let at = change.recorded_at();
        put_record(
            &*self.blobs,
            &self.root,
            &key,
            &scope,
            change,
            &at,
            "stategate narrowing",
        )
        .await
    }

    /// Every narrowing recorded in the store. One that does not open under this DEK,
    /// or is kept under another subject's name, is an error (as for revocations).
    pub async fn load(&self) -> Result<Vec<Narrowing>, RecordError> {
        let ours = |name: &str| name.strip_prefix("narrowing-").is_some_and(is_token_hash);
        let mut out = open_records(&*self.blobs, &self.root, ours, |name, c: &Narrowing| {
            (narrowing_name(&c.kind, &c.subject) != name)
                .then_some("the record names another subject")
        })
        .await?;
        out.sort_by_key(|c| c.at_ms);
        Ok(out)
    }
}

/// What [`after_restore`] changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reapplied {
    /// Tokens live in the snapshot whose revocation, recorded in the store, was re-applied.
    pub revoked: Vec<(String, String)>,
    /// UI sessions ended because no session can be proven live across a restore.
    pub sessions_ended: usize,
}

/// Brings a restored database's tokens up to the store's record: every recorded
/// revocation is applied again (with its original time), and every UI session still
/// open in the snapshot is ended (`at`): a session revoked (logged out) after the
/// snapshot left no record, so none can be trusted. Runs in the restore's transaction.
pub fn after_restore(
    conn: &Connection,
    records: &[Revocation],
    at: &str,
) -> Result<Reapplied, crate::store::sql::Error> {
    let mut out = Reapplied::default();
    for record in records {
        if revoke(conn, &record.sha256, &record.revoked_at)? {
            out.revoked
                .push((record.kind.clone(), id_of(&record.sha256)));
        }
    }
    out.sessions_ended = conn.execute(
        "UPDATE tokens SET revoked_at = ?1 WHERE kind = 'session' AND revoked_at IS NULL",
        [at],
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::schema::tests::test_index as db;

    fn new(kind: Kind, owner: i64) -> NewToken<'static> {
        NewToken {
            kind,
            owner_id: Some(owner),
            parent: None,
            expires_at: None,
        }
    }

    #[test]
    fn secrets_are_random_prefixed_and_only_their_hash_is_stored() {
        let (_dir, conn) = db();
        for kind in [
            Kind::Principal,
            Kind::Operator,
            Kind::Session,
            Kind::Workspace,
        ] {
            let a = issue(&conn, new(kind, 1)).unwrap();
            let b = issue(&conn, new(kind, 1)).unwrap();
            assert_ne!(a.secret, b.secret);
            assert!(a.secret.starts_with(kind.prefix()), "{}", a.secret);
            assert_eq!(a.secret.len(), kind.prefix().len() + 43);
            assert_eq!(a.sha256, hash(a.secret.as_bytes()));
            let stored: Vec<String> = conn
                .prepare("SELECT sha256 || coalesce(name, '') FROM tokens")
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert!(stored.contains(&a.sha256));
            assert!(!stored.iter().any(|s| s.contains(&a.secret)));
        }
    }

    #[test]
    fn lookups_answer_only_live_tokens_of_their_kind() {
        let (_dir, conn) = db();
        let now = 1_000_000;
        let op = issue(&conn, new(Kind::Operator, 7)).unwrap();
        let revoked = issue(&conn, new(Kind::Operator, 7)).unwrap();
        revoke(&conn, &revoked.sha256, "2026-01-01T00:00:00Z").unwrap();
        fn session(parent: &str, expires_at: i64) -> NewToken<'_> {
            NewToken {
                kind: Kind::Session,
                owner_id: Some(7),
                parent: Some(parent),
                expires_at: Some(expires_at),
            }
        }
        let s_live = issue(&conn, session(&op.sha256, now + 10)).unwrap();
        let s_expired = issue(&conn, session(&op.sha256, now)).unwrap();
        let s_orphan = issue(&conn, session(&revoked.sha256, now + 10)).unwrap();
        let principal = issue(&conn, new(Kind::Principal, 3)).unwrap();
        // (case, kind, secret, live owner)
        let table: Vec<(&str, Kind, &[u8], Option<i64>)> = vec![
            ("operator", Kind::Operator, op.secret.as_bytes(), Some(7)),
            ("revoked", Kind::Operator, revoked.secret.as_bytes(), None),
            ("wrong", Kind::Operator, b"sgo_wrong", None),
            ("empty", Kind::Operator, b"", None),
            (
                "another kind",
                Kind::Operator,
                principal.secret.as_bytes(),
                None,
            ),
            (
                "principal",
                Kind::Principal,
                principal.secret.as_bytes(),
                Some(3),
            ),
            (
                "operator as principal",
                Kind::Principal,
                op.secret.as_bytes(),
                None,
            ),
            (
                "the hash itself",
                Kind::Operator,
                op.sha256.as_bytes(),
                None,
            ),
            ("session", Kind::Session, s_live.secret.as_bytes(), Some(7)),
            (
                "expired session",
                Kind::Session,
                s_expired.secret.as_bytes(),
                None,
            ),
            (
                "parent revoked",
                Kind::Session,
                s_orphan.secret.as_bytes(),
                None,
            ),
        ];
        for (case, kind, secret, owner) in table {
            let found = live(&conn, kind, secret, now).unwrap();
            assert_eq!(found.and_then(|l| l.owner_id), owner, "{case}");
        }
        // Revoking the parent ends what was issued under it.
        assert!(revoke(&conn, &op.sha256, "2026-01-01T00:00:00Z").unwrap());
        assert!(!revoke(&conn, &op.sha256, "2026-01-02T00:00:00Z").unwrap());
        assert_eq!(
            live(&conn, Kind::Session, s_live.secret.as_bytes(), now).unwrap(),
            None
        );
        // Expired rows are swept; revoked rows stay (listed with their time).
        assert_eq!(sweep_expired(&conn, Kind::Session, now).unwrap(), 1);
        let ops = list(&conn, Kind::Operator).unwrap();
        assert_eq!(ops.len(), 2);
        assert!(ops
            .iter()
            .all(|t| t.revoked_at.as_deref() == Some("2026-01-01T00:00:00Z")));
    }

    #[test]
    fn revocation_by_id() {
        let (_dir, conn) = db();
        let a = issue(&conn, new(Kind::Operator, 1)).unwrap();
        let p = issue(&conn, new(Kind::Principal, 1)).unwrap();
        let upper = a.id().to_ascii_uppercase();
        let pid = p.id();
        // (case, kind, id, found)
        let table: Vec<(&str, Kind, &str, bool)> = vec![
            ("too short", Kind::Operator, "abc", false),
            ("not hex", Kind::Operator, "zzzzzzzzzzzz", false),
            ("unknown", Kind::Operator, "0123456789ab", false),
            ("another kind", Kind::Operator, &pid[..], false),
            ("any case", Kind::Operator, &upper[..], true),
            ("own kind", Kind::Principal, &pid[..], true),
        ];
        for (case, kind, id, ok) in table {
            let found = find_unrevoked(&conn, kind, id, "token");
            assert_eq!(found.is_ok(), ok, "{case}");
        }
        let found = find_unrevoked(&conn, Kind::Operator, &a.id(), "token").unwrap();
        assert_eq!(found.sha256, a.sha256);
        revoke(&conn, &found.sha256, "t").unwrap();
        assert!(
            find_unrevoked(&conn, Kind::Operator, &a.id(), "token").is_err(),
            "revoked already"
        );
    }

    #[test]
    fn older_databases_keep_their_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE principal_tokens (token_sha256 TEXT PRIMARY KEY, principal_id INTEGER NOT NULL, created_at TEXT NOT NULL) WITHOUT ROWID;
             CREATE TABLE operator_tokens (token_sha256 TEXT PRIMARY KEY, operator_id INTEGER NOT NULL, created_at TEXT NOT NULL, revoked_at TEXT) WITHOUT ROWID;
             CREATE TABLE ui_sessions (id_sha256 TEXT PRIMARY KEY, token_sha256 TEXT NOT NULL, csrf TEXT NOT NULL, created_at TEXT NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID;",
        )
        .unwrap();
        let (p, o, r) = (hash(b"sgp_p"), hash(b"sgo_o"), hash(b"sgo_r"));
        conn.execute("INSERT INTO principal_tokens VALUES (?1, 4, 't0')", [&p])
            .unwrap();
        conn.execute(
            "INSERT INTO operator_tokens VALUES (?1, 5, 't1', NULL)",
            [&o],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO operator_tokens VALUES (?1, 5, 't2', 't3')",
            [&r],
        )
        .unwrap();
        let (s_live, s_orphan) = (hash(b"sgs_live"), hash(b"sgs_orphan"));
        conn.execute(
            "INSERT INTO ui_sessions VALUES (?1, ?2, 'csrf_x', 't4', 100)",
            [&s_live, &o],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO ui_sessions VALUES (?1, ?2, 'csrf_y', 't4', 100)",
            [&s_orphan, &r],
        )
        .unwrap();
        drop(conn);
        for _ in 0..2 {
            drop(crate::schema::open_db(&path).unwrap()); // idempotent
        }
        let conn = Connection::open(&path).unwrap();
        let now = 0;
        assert_eq!(
            live(&conn, Kind::Principal, b"sgp_p", now)
                .unwrap()
                .unwrap()
                .owner_id,
            Some(4)
        );
        assert_eq!(
            live(&conn, Kind::Operator, b"sgo_o", now)
                .unwrap()
                .unwrap()
                .owner_id,
            Some(5)
        );
        assert_eq!(live(&conn, Kind::Operator, b"sgo_r", now).unwrap(), None);
        // Sessions stay open until their expiry, and only while their operator token lives.
        assert_eq!(
            live(&conn, Kind::Session, b"sgs_live", 99)
                .unwrap()
                .unwrap()
                .owner_id,
            Some(5)
        );
        assert_eq!(live(&conn, Kind::Session, b"sgs_live", 100).unwrap(), None);
        assert_eq!(live(&conn, Kind::Session, b"sgs_orphan", 99).unwrap(), None);
        let legacy: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name IN ('principal_tokens', 'operator_tokens', 'ui_sessions')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(legacy, 0);
    }

    /// A `tokens` table of the release before workspace tokens (its CHECK allows three
    /// kinds): `open_db` rebuilds it with every row kept, then a workspace token can be
    /// issued; opening again changes nothing.
    #[test]
    fn an_earlier_tokens_table_learns_the_workspace_kind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE tokens (
                sha256 TEXT PRIMARY KEY,
                kind TEXT NOT NULL CHECK (kind IN ('principal', 'operator', 'session')),
                owner_id INTEGER, parent TEXT REFERENCES tokens(sha256), name TEXT,
                created_at TEXT NOT NULL, expires_at INTEGER, revoked_at TEXT) WITHOUT ROWID;",
        )
        .unwrap();
        let (o, s) = (hash(b"sgo_o"), hash(b"sgs_s"));
        conn.execute(
            "INSERT INTO tokens (sha256, kind, owner_id, created_at) VALUES (?1, 'operator', 5, 't')",
            [&o],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO tokens (sha256, kind, owner_id, parent, created_at, expires_at) VALUES (?1, 'session', 5, ?2, 't', 100)",
            [&s, &o],
        )
        .unwrap();
        drop(conn);
        for _ in 0..2 {
            drop(crate::schema::open_db(&path).unwrap());
        }
        let conn = Connection::open(&path).unwrap();
        assert_eq!(
            live(&conn, Kind::Operator, b"sgo_o", 0)
                .unwrap()
                .unwrap()
                .owner_id,
            Some(5)
        );
        assert!(live(&conn, Kind::Session, b"sgs_s", 99).unwrap().is_some());
        let issued = issue_named(&conn, new(Kind::Workspace, 0), Some("ci")).unwrap();
        let found = stored(&conn, Kind::Workspace, issued.secret.as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(found.name.as_deref(), Some("ci"));
        assert!(found.is_live(0));
        assert_eq!(
            stored(&conn, Kind::Operator, issued.secret.as_bytes()).unwrap(),
            None
        );
        let index: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'tokens_by_kind'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(index, 1);
    }

    #[tokio::test]
    async fn revocations_recorded_in_the_store_are_applied_after_a_restore() {
        let (_dir, conn) = db();
        let store_dir = tempfile::tempdir().unwrap();
        let blobs: std::sync::Arc<dyn BlobStore> =
            std::sync::Arc::new(crate::store::LocalStore::open(store_dir.path()).unwrap());
        let log = RevocationLog::new(blobs.clone(), RootKey::from_bytes([3; 32]));
        let op = issue(&conn, new(Kind::Operator, 1)).unwrap();
        let kept = issue(&conn, new(Kind::Operator, 1)).unwrap();
        let session = issue(
            &conn,
            NewToken {
                kind: Kind::Session,
                owner_id: Some(1),
                parent: Some(&kept.sha256),
                expires_at: Some(i64::MAX),
            },
        )
        .unwrap();
        let found = find_unrevoked(&conn, Kind::Operator, &op.id(), "t").unwrap();
        log.record(&found, "2026-05-01T00:00:00Z").await.unwrap();
        let records = log.load().await.unwrap();
        assert_eq!(records.len(), 1);
        // The snapshot still has it live: the restore revokes it, with its recorded time.
        let done = after_restore(&conn, &records, "2026-05-02T00:00:00Z").unwrap();
        assert_eq!(done.revoked, vec![("operator".into(), op.id())]);
        assert_eq!(done.sessions_ended, 1);
        assert_eq!(
            live(&conn, Kind::Operator, op.secret.as_bytes(), 0).unwrap(),
            None
        );
        assert!(live(&conn, Kind::Operator, kept.secret.as_bytes(), 0)
            .unwrap()
            .is_some());
        assert_eq!(
            live(&conn, Kind::Session, session.secret.as_bytes(), 0).unwrap(),
            None
        );
        let again = after_restore(&conn, &records, "2026-05-03T00:00:00Z").unwrap();
        assert_eq!(again, Reapplied::default());

        // A record under another DEK, or moved to another token's name, stops the restore.
        let other = RevocationLog::new(blobs.clone(), RootKey::from_bytes([4; 32]));
        assert!(other.load().await.is_err(), "another DEK");
        let sealed = blobs.get(&record_key(&op.sha256)).await.unwrap().unwrap();
        blobs.put(&record_key(&kept.sha256), sealed).await.unwrap();
        assert!(log.load().await.is_err(), "renamed");
    }

    /// Narrowings are kept beside revocations, the newest per subject, sealed like
    /// them; the revocation log does not read them; `needed` is the re-apply rule.
    #[tokio::test]
    async fn narrowings_are_kept_newest_per_subject_and_reapplied_only_when_needed() {
        let store_dir = tempfile::tempdir().unwrap();
        let blobs: std::sync::Arc<dyn BlobStore> =
            std::sync::Arc::new(crate::store::LocalStore::open(store_dir.path()).unwrap());
        let root = RootKey::from_bytes([3; 32]);
        let log = NarrowingLog::new(blobs.clone(), root.clone());
        let change = |subject: &str, from: &[&str], to: &[&str], at_ms| Narrowing {
            kind: NARROWING_CONSUMERS.into(),
            subject: subject.into(),
            from: serde_json::json!(from),
            to: serde_json::json!(to),
            at_ms,
            actor: "cli:root".into(),
        };
        log.record(&change("prod", &["a", "b"], &["a"], 1_000))
            .await
            .unwrap();
        log.record(&change("prod", &["a"], &["c"], 2_000))
            .await
            .unwrap();
        log.record(&change("dev", &["x"], &[], 1_500))
            .await
            .unwrap();
        let loaded = log.load().await.unwrap();
        assert_eq!(
            loaded
                .iter()
                .map(|c| (c.subject.as_str(), c.at_ms))
                .collect::<Vec<_>>(),
            [("dev", 1_500), ("prod", 2_000)]
        );
        assert_eq!(
            RevocationLog::new(blobs.clone(), root.clone())
                .load()
                .await
                .unwrap(),
            vec![]
        );
        // (current value in the snapshot, snapshot taken at (s), needed)
        let c = change("prod", &["a"], &["c"], 2_000);
        for (current, taken, want) in [
            (serde_json::json!(["c"]), 0, false),  // holds it already
            (serde_json::json!(["a"]), 10, true),  // holds what it replaced
            (serde_json::json!(["z"]), 1, true),   // recorded after the snapshot
            (serde_json::json!(["z"]), 10, false), // a later change than the record
        ] {
            assert_eq!(c.needed(&current, taken), want, "{current} {taken}");
        }
        // Another DEK, or a record moved under another subject's name: an error.
        assert!(
            NarrowingLog::new(blobs.clone(), RootKey::from_bytes([4; 32]))
                .load()
                .await
                .is_err()
        );
        let name = |s| {
            format!(
                "{REVOCATIONS_PREFIX}{}.sgr",
                narrowing_name(NARROWING_CONSUMERS, s)
            )
        };
        let sealed = blobs.get(&name("prod")).await.unwrap().unwrap();
        blobs.put(&name("dev"), sealed).await.unwrap();
        assert!(log.load().await.is_err(), "renamed");
    }
}
