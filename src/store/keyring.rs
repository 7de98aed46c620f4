//! Where the keyring's generations are kept: the `key_generations` table (owned
//! here), so a backup of the index carries the ring, and a sealed copy of each
//! generation in the blob store under `keyring/`, so an index rebuild or a restore of
//! an older backup into a lost data dir still finds every generation.
//!
//! Both copies hold only the *wrapped* key (`crypto::service::KeyService`, the label
//! `data/N` / `credentials/N` as associated data), never key bytes. On conflict the
//! table wins: a generation the table holds (live, or retired — then it is never
//! used again) is taken from the table and its blob copy rewritten or deleted to match;
//! a blob copy adds only a generation the table does not know (a restore of a backup
//! older than the rotation), and only when it unwraps under this installation's key
//! service under its own label. Generation 0 of each root is the DEK itself, so it
//! has no wrapped copy; a row for it only records its retirement.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::store::sql::{params, Connection, OptionalExtension};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::audit::{insert_audit, AuditEntry};
use super::{BlobError, BlobStore, DbError, StateStore};
use crate::crypto::service::KeyService;
use crate::crypto::{Generation, KeyError, Purpose, RingView};

pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS key_generations (
    purpose     TEXT NOT NULL CHECK (purpose IN ('data', 'credentials')),
    generation  INTEGER NOT NULL CHECK (generation >= 0 AND generation < 4294967296),
    wrapped     BLOB,            -- the key wrapped by the key service; NULL once retired
    created_at  TEXT NOT NULL,
    retired_at  TEXT,
    PRIMARY KEY (purpose, generation),
    CHECK (wrapped IS NOT NULL OR retired_at IS NOT NULL)
);
CREATE TABLE IF NOT EXISTS key_fingerprint (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    fingerprint TEXT NOT NULL,   -- crypto::RootKey::fingerprint of the root key
    recorded_at TEXT NOT NULL
);
"#;

/// The store's record of the root key's fingerprint (beside the ring's copies, never
/// listed by the rebuild or the sweep): what an index rebuild or a start on a lost data
/// dir checks the key against.
pub const FINGERPRINT_COPY: &str = "keyring/root-key.fingerprint";

/// The root key's fingerprint the index recorded; `None` for an index that has none
/// yet (new, or of an earlier release).
pub fn recorded_fingerprint(conn: &Connection) -> Result<Option<String>, crate::store::sql::Error> {
    if !conn.table_exists("key_fingerprint")? {
        return Ok(None);
    }
    conn.query_row(
        "SELECT fingerprint FROM key_fingerprint WHERE id = 1",
        [],
        |r| r.get(0),
    )
    .optional()
}

/// Records `fingerprint` unless the index has one; returns the one it holds after
/// (nodes starting together on one PostgreSQL index: the first one wins).
pub fn record_fingerprint(
    conn: &Connection,
    fingerprint: &str,
) -> Result<String, crate::store::sql::Error> {
    conn.execute(
        "INSERT INTO key_fingerprint (id, fingerprint, recorded_at) VALUES (1, ?1, ?2)
         ON CONFLICT (id) DO NOTHING",
        params![fingerprint, crate::store::now_rfc3339()],
    )?;
    conn.query_row(
        "SELECT fingerprint FROM key_fingerprint WHERE id = 1",
        [],
        |r| r.get(0),
    )
}

/// Replaces the index's record: a new index written with a proven key (restore,
/// rebuild), or `key rewrap` replacing the key file.
pub fn set_fingerprint(
    conn: &Connection,
    fingerprint: &str,
) -> Result<(), crate::store::sql::Error> {
    conn.execute(
        "INSERT INTO key_fingerprint (id, fingerprint, recorded_at) VALUES (1, ?1, ?2)
         ON CONFLICT (id) DO UPDATE SET fingerprint = excluded.fingerprint,
                                        recorded_at = excluded.recorded_at",
        params![fingerprint, crate::store::now_rfc3339()],
    )?;
    Ok(())
}

/// Whether the index holds anything a root key sealed or wraps: versions, keyring
/// generations, a recorded fingerprint (tokens are plain hashes: an operator made
/// before the first start is no reason to refuse a new key).
pub fn index_has_data(conn: &Connection) -> Result<bool, crate::store::sql::Error> {
    for table in ["versions", "key_generations", "key_fingerprint"] {
        if conn.table_exists(table)?
            && conn
                .query_row(&format!("SELECT 1 FROM {table} LIMIT 1"), [], |_| Ok(()))
                .optional()?
                .is_some()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The newest version of a scope under `prefix` that has a blob (what proves a key
/// against an index of an earlier release, which recorded no fingerprint).
pub fn newest_sealed(
    conn: &Connection,
    prefix: &str,
) -> Result<Option<super::VersionRow>, crate::store::sql::Error> {
    conn.query_row(
        &format!(
            "SELECT {} FROM versions WHERE blob_key IS NOT NULL AND substr(scope, 1, ?2) = ?1
             ORDER BY created_at DESC LIMIT 1",
            super::VERSION_COLUMNS
        ),
        params![prefix, prefix.len() as i64],
        super::row_to_version,
    )
    .optional()
}

/// The fingerprint the store recorded ([`FINGERPRINT_COPY`]), if any.
pub async fn stored_fingerprint(blobs: &dyn BlobStore) -> Result<Option<String>, BlobError> {
    Ok(blobs
        .get(FINGERPRINT_COPY)
        .await?
        .map(|body| String::from_utf8_lossy(&body).trim().to_string()))
}

/// Writes the store's record of the fingerprint.
pub async fn store_fingerprint(blobs: &dyn BlobStore, fingerprint: &str) -> Result<(), BlobError> {
    blobs
        .put(FINGERPRINT_COPY, Bytes::from(format!("{fingerprint}\n")))
        .await
}

/// How long after a rotation a retire is refused: every process re-reads the ring
/// within `installation::RING_RELOAD` (1 s), so after this none writes under an older one.
pub const RETIRE_AFTER_SECONDS: i64 = 5;

/// Where the blob copies live (never listed by the index rebuild or the sweep).
pub const KEYRING_PREFIX: &str = "keyring/";

#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("{0}")]
    Refused(String),
}

impl From<crate::store::sql::Error> for RingError {
    fn from(e: crate::store::sql::Error) -> Self {
        RingError::Db(DbError::Sql(e))
    }
}

/// One generation as stored (wrapped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRow {
    #[serde(with = "purpose_text")]
    pub purpose: Purpose,
    pub generation: u32,
    #[serde(with = "wrapped_text")]
    pub wrapped: Option<Vec<u8>>,
    pub created_at: String,
    #[serde(default)]
    pub retired_at: Option<String>,
    /// In the store's record of a retirement only: proof that this installation's key
    /// service wrote it ([`retirement`]); a record without a valid one is ignored.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "wrapped_text"
    )]
    pub proof: Option<Vec<u8>>,
}

mod purpose_text {
    use super::Purpose;
    pub fn serialize<S: serde::Serializer>(p: &Purpose, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(p.as_str())
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Purpose, D::Error> {
        let text: String = serde::Deserialize::deserialize(d)?;
        Purpose::parse(&text).ok_or_else(|| serde::de::Error::custom("unknown purpose"))
    }
}

mod wrapped_text {
    use super::{Engine, BASE64};
    pub fn serialize<S: serde::Serializer>(w: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match w {
            Some(bytes) => s.serialize_some(&BASE64.encode(bytes)),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        let text: Option<String> = serde::Deserialize::deserialize(d)?;
        text.map(|t| BASE64.decode(t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

fn copy_key(purpose: Purpose, generation: u32) -> String {
    format!("{KEYRING_PREFIX}{}-{generation}.sgk", purpose.as_str())
}

fn parse_copy_key(key: &str) -> Option<(Purpose, u32)> {
    let name = key.strip_prefix(KEYRING_PREFIX)?.strip_suffix(".sgk")?;
    let (purpose, generation) = name.split_once('-')?;
    Some((Purpose::parse(purpose)?, generation.parse().ok()?))
}

/// Every row of the table; a database without the table (an earlier release not yet
/// opened by this one) has none.
pub fn read_rows(conn: &Connection) -> Result<Vec<KeyRow>, crate::store::sql::Error> {
    if !conn.table_exists("key_generations")? {
        return Ok(Vec::new());
    }
    let mut stmt = conn.prepare(
        "SELECT purpose, generation, wrapped, created_at, retired_at FROM key_generations
         ORDER BY purpose, generation",
    )?;
    let rows = stmt.query_map([], |r| {
        let purpose: String = r.get(0)?;
        Ok((
            purpose,
            r.get::<_, i64>(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (purpose, generation, wrapped, created_at, retired_at) = row?;
        // The CHECKs hold these; a row that breaks them is not ours to use.
        let (Some(purpose), Ok(generation)) = (Purpose::parse(&purpose), u32::try_from(generation))
        else {
            continue;
        };
        out.push(KeyRow {
            purpose,
            generation,
            wrapped,
            created_at,
            retired_at,
            proof: None,
        });
    }
    Ok(out)
}

/// Opens every live generation of `rows` with `service`. A generation that does not
/// unwrap is an error naming it and the service: nothing may be written under a ring
/// this process cannot fully read.
pub fn view(rows: &[KeyRow], service: &dyn KeyService) -> Result<RingView, KeyError> {
    let mut out = RingView::default();
    for row in rows {
        match (&row.retired_at, &row.wrapped) {
            (Some(_), _) => out.retired.push((row.purpose, row.generation)),
            // Generation 0 has a row of its own only after `key rewrap` replaced the key
            // file: then it is the first DEK, wrapped like every other generation.
            (None, Some(wrapped)) => out.generations.push(Generation::unwrap(
                service,
                row.purpose,
                row.generation,
                wrapped,
            )?),
            _ => {}
        }
    }
    Ok(out)
}

/// The table's rows plus the generations only `copies` (read from the blob store)
/// hold: the table wins for every generation it has, except that a retirement (kept
/// in the store as a copy without a key) wins over everything: a restore of an index
/// older than a retire never makes the generation usable again.
pub fn merged(rows: Vec<KeyRow>, copies: &[KeyRow]) -> Vec<KeyRow> {
    let mut out: BTreeMap<(Purpose, u32), KeyRow> = copies
        .iter()
        .map(|c| ((c.purpose, c.generation), c.clone()))
        .collect();
    for row in rows {
        let key = (row.purpose, row.generation);
        if out.get(&key).is_some_and(|c| c.retired_at.is_some()) && row.retired_at.is_none() {
            continue;
        }
        out.insert(key, row);
    }
    out.into_values().collect()
}

/// The store's record of a retirement: the row without its key, with a proof that
/// the key service wrote it (32 zero bytes wrapped under a label naming the
/// generation and the instant). Whoever can write the store but holds no key can
/// therefore not retire a generation (a denial of service) by forging a record.
fn retirement(
    service: &dyn KeyService,
    purpose: Purpose,
    generation: u32,
    at: &str,
) -> Result<KeyRow, KeyError> {
    Ok(KeyRow {
        purpose,
        generation,
        wrapped: None,
        created_at: at.to_string(),
        retired_at: Some(at.to_string()),
        proof: Some(service.wrap(&[0; 32], &retirement_label(purpose, generation, at))?),
    })
}

fn retirement_label(purpose: Purpose, generation: u32, at: &str) -> String {
    format!("retired {} at {at}", purpose.label(generation))
}

/// Whether `copy` is a record of a retirement that `service` wrote (see [`retirement`]).
fn genuine_retirement(service: &dyn KeyService, copy: &KeyRow) -> bool {
    let (Some(at), Some(proof)) = (&copy.retired_at, &copy.proof) else {
        return false;
    };
    service
        .unwrap(proof, &retirement_label(copy.purpose, copy.generation, at))
        .is_ok_and(|zero| zero == [0; 32])
}

/// Reads the ring from the table on `conn` (plus `copies`) and opens it (the
/// server's reload). A copy that does not unwrap is skipped; a table row that does
/// not is an error.
pub fn load(
    conn: &Connection,
    copies: &[KeyRow],
    service: &dyn KeyService,
) -> Result<RingView, String> {
    let mut rows = read_rows(conn).map_err(|e| e.to_string())?;
    prefer_copies_that_open(&mut rows, copies, service);
    let in_table: std::collections::HashSet<(Purpose, u32)> =
        rows.iter().map(|r| (r.purpose, r.generation)).collect();
    let usable: Vec<KeyRow> = copies
        .iter()
        .filter(|c| match c.retired_at {
            Some(_) => genuine_retirement(service, c),
            None => in_table.contains(&(c.purpose, c.generation)) || opens(service, c),
        })
        .cloned()
        .collect();
    view(&merged(rows, &usable), service).map_err(|e| e.to_string())
}

/// Whether `row` holds a key `service` unwraps under the row's own label.
fn opens(service: &dyn KeyService, row: &KeyRow) -> bool {
    row.retired_at.is_none()
        && row
            .wrapped
            .as_ref()
            .is_some_and(|w| Generation::unwrap(service, row.purpose, row.generation, w).is_ok())
}

/// A live table row `service` cannot unwrap gives way to the store's copy of the same
/// generation when that one opens: an index restored from a backup made before
/// `key rewrap` holds the ring wrapped under the key file the rewrap replaced, while
/// the store's copies were re-wrapped under the new one (the same keys: a generation's
/// number is never reused). Returns the rows replaced. A row neither opens stays, and
/// opening the ring then fails naming it.
fn prefer_copies_that_open(
    rows: &mut [KeyRow],
    copies: &[KeyRow],
    service: &dyn KeyService,
) -> Vec<KeyRow> {
    let mut replaced = Vec::new();
    for row in rows.iter_mut() {
        if row.retired_at.is_some() || opens(service, row) {
            continue;
        }
        let same = |c: &&KeyRow| c.purpose == row.purpose && c.generation == row.generation;
        if let Some(copy) = copies.iter().filter(same).find(|c| opens(service, c)) {
            *row = copy.clone();
            replaced.push(copy.clone());
        }
    }
    replaced
}

/// The generations kept in the blob store (see [`load`]).
pub async fn copies(blobs: &dyn BlobStore) -> Result<Vec<KeyRow>, BlobError> {
    read_copies(blobs).await
}

async fn put_copy(blobs: &dyn BlobStore, row: &KeyRow) -> Result<(), BlobError> {
    let body = serde_json::to_vec(row).expect("a key row serializes");
    blobs
        .put(&copy_key(row.purpose, row.generation), Bytes::from(body))
        .await
}

/// The blob copies that parse (others are skipped: not ours, or damaged).
async fn read_copies(blobs: &dyn BlobStore) -> Result<Vec<KeyRow>, BlobError> {
    let mut out = Vec::new();
    for key in blobs.list(KEYRING_PREFIX).await? {
        let Some((purpose, generation)) = parse_copy_key(&key) else {
            continue;
        };
        let Some(body) = blobs.get(&key).await? else {
            continue;
        };
        match serde_json::from_slice::<KeyRow>(&body) {
            Ok(row) if row.purpose == purpose && row.generation == generation => out.push(row),
            _ => tracing::warn!(key = %key, "skipping a keyring copy that does not parse"),
        }
    }
    Ok(out)
}

/// What [`reconcile`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// Generations only the blob copies knew, now in the table too.
    pub adopted: Vec<String>,
    /// Blob copies (re)written from the table.
    pub copied: Vec<String>,
    /// Blob copies the table does not want (retired, or not opening): deleted or skipped.
    pub ignored: Vec<String>,
}

/// Brings the table and the blob copies together (see the module docs for which wins)
/// and returns the ring, opened. Run at startup by `serve` and by the `key` commands.
pub async fn reconcile(
    store: &StateStore,
    service: &Arc<dyn KeyService>,
) -> Result<(RingView, Reconciled), RingError> {
    let (db, blobs) = (&store.db, &store.blobs);
    let mut rows = db.read(read_rows).await?;
    let copies = read_copies(blobs.as_ref()).await?;
    let mut done = Reconciled::default();
    // Before the table wins below: a row wrapped under a replaced key file must not
    // overwrite the store's re-wrapped copy (then only the old file would open it).
    let rewrapped = prefer_copies_that_open(&mut rows, &copies, service.as_ref());
    done.adopted.extend(
        rewrapped
            .iter()
            .map(|r| format!("{} (re-wrapped copy)", r.purpose.label(r.generation))),
    );
    let known: BTreeMap<(Purpose, u32), &KeyRow> = rows
        .iter()
        .map(|r| ((r.purpose, r.generation), r))
        .collect();
    let mut adopt = Vec::new();
    for copy in &copies {
        let label = copy.purpose.label(copy.generation);
        let row = known.get(&(copy.purpose, copy.generation));
        let forged = copy.retired_at.is_some() && !genuine_retirement(service.as_ref(), copy);
        if forged {
            tracing::warn!(generation = %label, service = %service.describe(),
                "a keyring retirement record in the store was not written with this key service; ignored");
        }
        match row {
            // A retirement the table does not know (a restore of an older index):
            // re-applied, never undone.
            _ if copy.retired_at.is_some()
                && !forged
                && row.is_none_or(|row| row.retired_at.is_none()) =>
            {
                adopt.push(copy.clone());
                done.adopted.push(format!("{label} (retired)"));
            }
            Some(row) if row.retired_at.is_some() => {
                if forged || copy.retired_at != row.retired_at {
                    let at = row.retired_at.as_deref().unwrap_or_default();
                    put_copy(
                        blobs.as_ref(),
                        &retirement(service.as_ref(), row.purpose, row.generation, at)?,
                    )
                    .await?;
                    done.copied.push(label);
                }
            }
            Some(row) if *row != copy => {
                put_copy(blobs.as_ref(), row).await?;
                done.copied.push(label);
            }
            Some(_) => {}
            None if forged => done.ignored.push(label),
            None => {
                if opens(service.as_ref(), copy) {
                    adopt.push(copy.clone());
                    done.adopted.push(label);
                } else {
                    tracing::warn!(generation = %label, service = %service.describe(),
                        "a keyring copy in the store does not open with this key service; ignored");
                    done.ignored.push(label);
                }
            }
        }
    }
    let have: std::collections::HashSet<(Purpose, u32)> =
        copies.iter().map(|c| (c.purpose, c.generation)).collect();
    for row in &rows {
        if !have.contains(&(row.purpose, row.generation)) {
            let copy = match &row.retired_at {
                Some(at) => retirement(service.as_ref(), row.purpose, row.generation, at)?,
                None => row.clone(),
            };
            put_copy(blobs.as_ref(), &copy).await?;
            done.copied.push(row.purpose.label(row.generation));
        }
    }
    if !adopt.is_empty() || !rewrapped.is_empty() {
        db.write(move |conn| -> Result<(), RingError> {
            for row in &rewrapped {
                conn.execute(
                    "UPDATE key_generations SET wrapped = ?3
                      WHERE purpose = ?1 AND generation = ?2 AND retired_at IS NULL",
                    params![row.purpose.as_str(), row.generation, row.wrapped],
                )?;
            }
            for row in &adopt {
                match &row.retired_at {
                    Some(at) => conn.execute(
                        "INSERT INTO key_generations (purpose, generation, wrapped, created_at, retired_at)
                         VALUES (?1, ?2, NULL, ?3, ?3)
                         ON CONFLICT (purpose, generation) DO UPDATE SET wrapped = NULL, retired_at = ?3",
                        params![row.purpose.as_str(), row.generation, at],
                    )?,
                    None => conn.execute(
                        "INSERT INTO key_generations (purpose, generation, wrapped, created_at)
                         VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                        params![row.purpose.as_str(), row.generation, row.wrapped, row.created_at],
                    )?,
                };
            }
            Ok(())
        })
        .await?;
    }
    let rows = db.read(read_rows).await?;
    Ok((view(&rows, service.as_ref())?, done))
}

/// Adds a new random generation of `purpose` (numbered one above every generation it
/// ever had): the blob copy first, then the row with its audit row
/// (`key.rotated`, no key bytes). Returns its number. Every process holding the ring
/// uses it once it re-reads the table (the server does every few seconds).
pub async fn rotate(
    store: &StateStore,
    service: &Arc<dyn KeyService>,
    purpose: Purpose,
    actor: &str,
) -> Result<u32, RingError> {
    let (db, blobs) = (&store.db, &store.blobs);
    let rows = db.read(read_rows).await?;
    let next = rows
        .iter()
        .filter(|r| r.purpose == purpose)
        .map(|r| r.generation)
        .max()
        .unwrap_or(0)
        .checked_add(1)
        .ok_or_else(|| RingError::Refused("no generation number left".into()))?;
    let generation = Generation::random(purpose, next)?;
    let row = KeyRow {
        purpose,
        generation: next,
        wrapped: Some(generation.wrap(service.as_ref())?),
        created_at: super::now_rfc3339(),
        retired_at: None,
        proof: None,
    };
    // The copy first: a crash after it leaves a generation the next reconcile adopts
    // (unused, harmless); a row without its copy is never there.
    put_copy(blobs.as_ref(), &row).await?;
    let (actor, service_name) = (actor.to_string(), service.describe());
    db.write(move |conn| -> Result<(), RingError> {
        let taken: Option<i64> = conn
            .query_row(
                "SELECT 1 FROM key_generations WHERE purpose = ?1 AND generation = ?2",
                params![row.purpose.as_str(), row.generation],
                |r| r.get(0),
            )
            .optional()?;
        if taken.is_some() {
            return Err(RingError::Refused(format!(
                "generation {} was added by someone else at the same time; nothing was changed, retry",
                row.purpose.label(row.generation)
            )));
        }
        conn.execute(
            "INSERT INTO key_generations (purpose, generation, wrapped, created_at)
             VALUES (?1, ?2, ?3, ?4)",
            params![row.purpose.as_str(), row.generation, row.wrapped, row.created_at],
        )?;
        insert_audit(
            conn,
            &AuditEntry::new(actor, "keyring", "key.rotated", serde_json::json!({
                    "purpose": row.purpose.as_str(),
                    "generation": row.generation,
                    "key_service": service_name,
                })),
        )?;
        Ok(())
    })
    .await?;
    Ok(next)
}

/// Drops data generation `generation` from the ring, audited (`key.retired`), after
/// `still_needed` (run inside the same transaction) found nothing under it. Refused
/// for the newest generation (what writes use) and for one not in the ring.
pub async fn retire(
    store: &StateStore,
    service: &Arc<dyn KeyService>,
    generation: u32,
    actor: &str,
    still_needed: impl FnOnce(&Connection) -> Result<Option<String>, crate::store::sql::Error>
        + Send
        + 'static,
) -> Result<(), RingError> {
    let (db, blobs) = (&store.db, &store.blobs);
    let actor = actor.to_string();
    let now = super::now_rfc3339();
    // Made before the commit: a key service that fails here leaves nothing changed.
    let record = retirement(service.as_ref(), Purpose::Data, generation, &now)?;
    db.write(move |conn| -> Result<(), RingError> {
        let rows = read_rows(conn)?;
        let data: Vec<&KeyRow> = rows.iter().filter(|r| r.purpose == Purpose::Data).collect();
        let retired = |g: u32| data.iter().any(|r| r.generation == g && r.retired_at.is_some());
        let live: Vec<u32> = std::iter::once(0)
            .chain(data.iter().map(|r| r.generation))
            .filter(|g| !retired(*g))
            .collect();
        if !live.contains(&generation) {
            return Err(RingError::Refused(format!(
                "data generation {generation} is not in the ring (live: {live:?}); nothing was changed"
            )));
        }
        if live.iter().max() == Some(&generation) {
            return Err(RingError::Refused(format!(
                "data generation {generation} is the newest: every write uses it. Run `stategate key rotate` first; nothing was changed"
            )));
        }
        // A process that has not re-read the ring since the newest generation was
        // added may still be writing under an older one: wait until every one has.
        let newest_at = data
            .iter()
            .filter(|r| r.retired_at.is_none())
            .max_by_key(|r| r.generation)
            .and_then(|r| super::audit::parse_instant(&r.created_at).ok());
        if newest_at.is_some_and(|at| {
            crate::clock::now_utc() - at < time::Duration::seconds(RETIRE_AFTER_SECONDS)
        }) {
            return Err(RingError::Refused(format!(
                "the newest generation was added less than {RETIRE_AFTER_SECONDS} s ago; a server may not have started using it yet. Retry in a moment; nothing was changed"
            )));
        }
        if let Some(what) = still_needed(conn)? {
            return Err(RingError::Refused(format!(
                "data generation {generation} still seals {what}; run `stategate key reseal` (backups and drift artifacts age out), then retry. Nothing was changed"
            )));
        }
        conn.execute(
            "INSERT INTO key_generations (purpose, generation, wrapped, created_at, retired_at)
             VALUES ('data', ?1, NULL, ?2, ?2)
             ON CONFLICT (purpose, generation) DO UPDATE SET wrapped = NULL, retired_at = ?2",
            params![generation, now],
        )?;
        insert_audit(
            conn,
            &AuditEntry::new(actor, "keyring", "key.retired", serde_json::json!({"purpose": "data", "generation": generation})),
        )?;
        Ok(())
    })
    .await?;
    // After the commit: the copy of the retired generation is replaced by the record of
    // its retirement (no key), which a restore of an older index re-applies. A crash
    // before this leaves the old copy; the next reconcile replaces it from the row.
    put_copy(blobs.as_ref(), &record).await?;
    Ok(())
}

/// What [`rewrap`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Rewrapped {
    /// Generations whose wrapped key (row and copy) is now under the new key service.
    pub rewrapped: Vec<String>,
    /// Generations 0 (the DEK being replaced) now kept wrapped as ring entries.
    pub added: Vec<String>,
}

/// Re-wraps every live generation of the ring, in the table and in the store, from
/// `old` to `new` (the key service of the key file about to replace the current one),
/// and adds generation 0 of each root (`zero`: the DEK being replaced, unless retired)
/// as a wrapped entry, so what it seals keeps opening once the key file no longer
/// holds it. One transaction for the table (audited `key.rewrapped`), then the copies.
/// Idempotent: a row already under `new` is re-wrapped again, a generation 0 already
/// in the table is left as it is. Fails, changing nothing in the table, when some row
/// opens under neither service.
pub async fn rewrap(
    store: &StateStore,
    old: &Arc<dyn KeyService>,
    new: &Arc<dyn KeyService>,
    zero: Vec<Generation>,
    actor: &str,
) -> Result<Rewrapped, RingError> {
    let (db, blobs) = (&store.db, &store.blobs);
    let (old2, new2, actor) = (old.clone(), new.clone(), actor.to_string());
    let done = db
        .write(move |conn| -> Result<Rewrapped, RingError> {
            let rows = read_rows(conn)?;
            let mut done = Rewrapped::default();
            for row in &rows {
                let (None, Some(wrapped)) = (&row.retired_at, &row.wrapped) else {
                    continue;
                };
                let generation =
                    Generation::unwrap(old2.as_ref(), row.purpose, row.generation, wrapped)
                        .or_else(|_| {
                            Generation::unwrap(new2.as_ref(), row.purpose, row.generation, wrapped)
                        })?;
                conn.execute(
                    "UPDATE key_generations SET wrapped = ?3 WHERE purpose = ?1 AND generation = ?2",
                    params![
                        row.purpose.as_str(),
                        row.generation,
                        generation.wrap(new2.as_ref())?
                    ],
                )?;
                done.rewrapped.push(row.purpose.label(row.generation));
            }
            for generation in zero.iter().filter(|g| g.number == 0) {
                if rows
                    .iter()
                    .any(|r| r.purpose == generation.purpose && r.generation == 0)
                {
                    continue;
                }
                conn.execute(
                    "INSERT INTO key_generations (purpose, generation, wrapped, created_at)
                     VALUES (?1, 0, ?2, ?3)",
                    params![
                        generation.purpose.as_str(),
                        generation.wrap(new2.as_ref())?,
                        super::now_rfc3339()
                    ],
                )?;
                done.added.push(generation.purpose.label(0));
            }
            insert_audit(
                conn,
                &AuditEntry::new(actor, "keyring", "key.rewrapped", serde_json::json!({
                        "rewrapped": done.rewrapped,
                        "added": done.added,
                        "key_service": new2.describe(),
                    })),
            )?;
            Ok(done)
        })
        .await?;
    // The copies follow the table (a crash here: the next reconcile rewrites them).
    for row in db.read(read_rows).await? {
        let copy = match &row.retired_at {
            Some(at) => retirement(new.as_ref(), row.purpose, row.generation, at)?,
            None => row,
        };
        put_copy(blobs.as_ref(), &copy).await?;
    }
    Ok(done)
}

/// Every live generation of the table opens under `service` alone (what `key rewrap`
/// checks before the new key file replaces the old one).
pub async fn opens_under(
    store: &StateStore,
    service: &Arc<dyn KeyService>,
) -> Result<(), RingError> {
    let rows = store.db.read(read_rows).await?;
    view(&rows, service.as_ref())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::RootKey;
    use crate::store::LocalStore;

    fn setup() -> (
        tempfile::TempDir,
        StateStore,
        Arc<dyn BlobStore>,
        Arc<dyn KeyService>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::Db::open(
            &dir.path().join("db"),
            &[
                crate::store::db::SCHEMA,
                crate::store::audit::SCHEMA,
                SCHEMA,
            ],
        )
        .unwrap();
        let blobs: Arc<dyn BlobStore> =
            Arc::new(LocalStore::open(&dir.path().join("blobs")).unwrap());
        let service: Arc<dyn KeyService> =
            Arc::new(RootKey::from_bytes([4; 32]).file_service(None));
        (dir, StateStore::new(db, blobs.clone()), blobs, service)
    }

    /// Makes the newest generation look older than the retire grace.
    async fn age(db: &StateStore) {
        db.db
            .write(|c| -> Result<(), RingError> {
                c.execute(
                    "UPDATE key_generations SET created_at = '2020-01-01T00:00:00Z'",
                    [],
                )?;
                Ok(())
            })
            .await
            .unwrap();
    }

    fn numbers(view: &RingView) -> Vec<String> {
        view.generations
            .iter()
            .map(|g| g.purpose.label(g.number))
            .collect()
    }

    #[tokio::test]
    async fn the_table_and_the_blob_copies_reconcile_and_the_table_wins() {
        let (_dir, db, blobs, service) = setup();
        assert_eq!(rotate(&db, &service, Purpose::Data, "t").await.unwrap(), 1);
        assert_eq!(rotate(&db, &service, Purpose::Data, "t").await.unwrap(), 2);
        assert_eq!(
            rotate(&db, &service, Purpose::Credentials, "t")
                .await
                .unwrap(),
            1
        );
        let (view, done) = reconcile(&db, &service).await.unwrap();
        assert_eq!(numbers(&view), ["credentials/1", "data/1", "data/2"]);
        assert_eq!(done, Reconciled::default());

        // A restore of an older index: the table lost data/2; the copy brings it back.
        db.db
            .write(|c| -> Result<(), RingError> {
                c.execute("DELETE FROM key_generations WHERE generation = 2", [])?;
                Ok(())
            })
            .await
            .unwrap();
        let (view, done) = reconcile(&db, &service).await.unwrap();
        assert_eq!(numbers(&view), ["credentials/1", "data/1", "data/2"]);
        assert_eq!(done.adopted, ["data/2"]);

        // A copy that differs from the table is rewritten from it; a lost copy is put back.
        let rows = db.db.read(read_rows).await.unwrap();
        let mut forged = rows[1].clone();
        forged.wrapped = Some(vec![0; 60]);
        put_copy(blobs.as_ref(), &forged).await.unwrap();
        blobs.delete(&copy_key(Purpose::Data, 2)).await.unwrap();
        let (view, done) = reconcile(&db, &service).await.unwrap();
        assert_eq!(numbers(&view).len(), 3);
        assert_eq!(done.copied, ["data/1", "data/2"]);
        let copies = read_copies(blobs.as_ref()).await.unwrap();
        assert_eq!(copies.len(), 3);

        // A copy from another key service (another installation) is never adopted.
        let other: Arc<dyn KeyService> = Arc::new(RootKey::from_bytes([5; 32]).file_service(None));
        let foreign = KeyRow {
            purpose: Purpose::Data,
            generation: 9,
            wrapped: Some(
                Generation::random(Purpose::Data, 9)
                    .unwrap()
                    .wrap(other.as_ref())
                    .unwrap(),
            ),
            created_at: "x".into(),
            retired_at: None,
            proof: None,
        };
        put_copy(blobs.as_ref(), &foreign).await.unwrap();
        // ... nor one relabelled: data/1's wrapped key under the name data/8.
        let mut moved = rows[1].clone();
        moved.generation = 8;
        put_copy(blobs.as_ref(), &moved).await.unwrap();
        let (view, done) = reconcile(&db, &service).await.unwrap();
        assert_eq!(numbers(&view).len(), 3);
        assert_eq!(done.ignored, ["data/8", "data/9"]);

        // The whole ring under the wrong service stops with a clear error.
        let err = reconcile(&db, &other).await.unwrap_err().to_string();
        assert!(err.contains("does not open with"), "{err}");
    }

    #[tokio::test]
    async fn retire_refuses_the_newest_the_unknown_and_the_needed() {
        let (_dir, db, blobs, service) = setup();
        let nothing = |_: &Connection| Ok(None);
        let err = retire(&db, &service, 0, "t", nothing)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("is the newest"), "{err}");
        rotate(&db, &service, Purpose::Data, "t").await.unwrap();
        rotate(&db, &service, Purpose::Data, "t").await.unwrap();
        let err = retire(&db, &service, 1, "t", nothing)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("less than"), "{err}");
        age(&db).await;
        let err = retire(&db, &service, 7, "t", nothing)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("not in the ring"), "{err}");
        let err = retire(&db, &service, 1, "t", |_: &Connection| {
            Ok(Some("3 state versions".into()))
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("still seals 3 state versions"), "{err}");
        let before = db.db.read(read_rows).await.unwrap();
        assert!(before.iter().all(|r| r.retired_at.is_none()));

        retire(&db, &service, 1, "t", nothing).await.unwrap();
        retire(&db, &service, 0, "t", nothing).await.unwrap();
        let (view, _) = reconcile(&db, &service).await.unwrap();
        assert_eq!(numbers(&view), ["data/2"]);
        assert_eq!(view.retired, [(Purpose::Data, 0), (Purpose::Data, 1)]);
        let err = retire(&db, &service, 1, "t", nothing)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("not in the ring"), "{err}");
        // The retired copies hold no key any more, only the record of the retirement;
        // a rotation never reuses the number.
        let copies = read_copies(blobs.as_ref()).await.unwrap();
        let live: Vec<u32> = copies
            .iter()
            .filter(|c| c.wrapped.is_some())
            .map(|c| c.generation)
            .collect();
        assert_eq!(live, [2]);
        assert!(copies
            .iter()
            .filter(|c| c.generation < 2)
            .all(|c| c.wrapped.is_none() && c.retired_at.is_some()));
        assert_eq!(rotate(&db, &service, Purpose::Data, "t").await.unwrap(), 3);
        let events: Vec<String> = db
            .db
            .read(|c| {
                c.prepare("SELECT event FROM audit ORDER BY id")?
                    .query_map([], |r| r.get(0))?
                    .collect()
            })
            .await
            .unwrap();
        assert_eq!(
            events,
            [
                "key.rotated",
                "key.rotated",
                "key.retired",
                "key.retired",
                "key.rotated"
            ]
        );
    }

    #[tokio::test]
    async fn a_retirement_survives_a_restore_of_an_older_index() {
        let (_dir, db, blobs, service) = setup();
        rotate(&db, &service, Purpose::Data, "t").await.unwrap();
        rotate(&db, &service, Purpose::Data, "t").await.unwrap();
        age(&db).await;
        let before_retire = db.db.read(read_rows).await.unwrap();
        retire(&db, &service, 1, "t", |_: &Connection| Ok(None))
            .await
            .unwrap();
        // A restore puts back the index from before the retire: data/1 live again in
        // the table. The store's record wins, in the loader and in the reconcile.
        let restored = before_retire.clone();
        db.db
            .write(move |c| -> Result<(), RingError> {
                c.execute("DELETE FROM key_generations", [])?;
                for r in &restored {
                    c.execute(
                        "INSERT INTO key_generations (purpose, generation, wrapped, created_at)
                         VALUES (?1, ?2, ?3, ?4)",
                        params![r.purpose.as_str(), r.generation, r.wrapped, r.created_at],
                    )?;
                }
                Ok(())
            })
            .await
            .unwrap();
        let copies = read_copies(blobs.as_ref()).await.unwrap();
        let conn = crate::store::sql::Connection::open(_dir.path().join("db")).unwrap();
        let loaded = load(&conn, &copies, service.as_ref()).unwrap();
        assert_eq!(numbers(&loaded), ["data/2"]);
        let (view, done) = reconcile(&db, &service).await.unwrap();
        assert_eq!(numbers(&view), ["data/2"]);
        assert_eq!(done.adopted, ["data/1 (retired)"]);
        let rows = db.db.read(read_rows).await.unwrap();
        let one = rows.iter().find(|r| r.generation == 1).unwrap();
        assert!(one.wrapped.is_none() && one.retired_at.is_some());
        // A lost index altogether: the record alone keeps it retired.
        let loaded = load(
            &crate::store::sql::Connection::open_in_memory().unwrap(),
            &copies,
            service.as_ref(),
        )
        .unwrap();
        assert_eq!(numbers(&loaded), ["data/2"]);
        assert!(loaded.retired.contains(&(Purpose::Data, 1)));
    }

    #[tokio::test]
    async fn a_retirement_record_the_key_service_did_not_write_is_ignored() {
        let (dir, db, blobs, service) = setup();
        for _ in 0..3 {
            rotate(&db, &service, Purpose::Data, "t").await.unwrap();
        }
        age(&db).await;
        retire(&db, &service, 1, "t", |_: &Connection| Ok(None))
            .await
            .unwrap();
        let genuine = read_copies(blobs.as_ref())
            .await
            .unwrap()
            .into_iter()
            .find(|c| c.generation == 1)
            .unwrap();
        assert!(genuine_retirement(service.as_ref(), &genuine));
        reconcile(&db, &service).await.unwrap(); // the copies follow `age`'s rows
        let other: Arc<dyn KeyService> = Arc::new(RootKey::from_bytes([5; 32]).file_service(None));
        let unproved = KeyRow {
            proof: None,
            ..genuine.clone()
        };
        let moved = KeyRow {
            generation: 2,
            ..genuine.clone()
        };
        let later = KeyRow {
            retired_at: Some("2030-01-01T00:00:00Z".into()),
            ..genuine.clone()
        };
        // The instant is bound too: data/1's own proof under a changed instant fails.
        assert!(!genuine_retirement(service.as_ref(), &later));
        let foreign = retirement(other.as_ref(), Purpose::Data, 2, "2030-01-01T00:00:00Z").unwrap();
        // Each forgery, written by whoever can write the store but holds no key, over
        // the copy of live data/2: the ring keeps it, the table is unchanged, and the
        // copy is put back from the table.
        for (what, mut forged) in [
            ("no proof", unproved),
            ("data/1's proof", moved),
            ("another service", foreign),
            ("data/1's proof, another instant", later),
        ] {
            forged.generation = 2;
            put_copy(blobs.as_ref(), &forged).await.unwrap();
            let rows_before = db.db.read(read_rows).await.unwrap();
            let copies = read_copies(blobs.as_ref()).await.unwrap();
            let conn = crate::store::sql::Connection::open(dir.path().join("db")).unwrap();
            let loaded = load(&conn, &copies, service.as_ref()).unwrap();
            assert_eq!(numbers(&loaded), ["data/2", "data/3"], "{what}");
            let (view, done) = reconcile(&db, &service).await.unwrap();
            assert_eq!(numbers(&view), ["data/2", "data/3"], "{what}");
            assert_eq!(done.copied, ["data/2"], "{what}");
            assert_eq!(db.db.read(read_rows).await.unwrap(), rows_before, "{what}");
            let copy = read_copies(blobs.as_ref()).await.unwrap();
            let two = copy.iter().find(|c| c.generation == 2).unwrap();
            assert!(two.retired_at.is_none() && two.wrapped.is_some(), "{what}");
        }
        // With the index lost, a forged record alone retires nothing either.
        let mut forged = genuine.clone();
        forged.generation = 2;
        put_copy(blobs.as_ref(), &forged).await.unwrap();
        let copies = read_copies(blobs.as_ref()).await.unwrap();
        let loaded = load(
            &crate::store::sql::Connection::open_in_memory().unwrap(),
            &copies,
            service.as_ref(),
        )
        .unwrap();
        assert!(!loaded.retired.contains(&(Purpose::Data, 2)));
        assert!(loaded.retired.contains(&(Purpose::Data, 1)));
        // A record from before proofs existed is re-written with one from the table.
        put_copy(
            blobs.as_ref(),
            &KeyRow {
                proof: None,
                ..genuine
            },
        )
        .await
        .unwrap();
        let (_, done) = reconcile(&db, &service).await.unwrap();
        assert!(done.copied.contains(&"data/1".to_string()), "{done:?}");
        let copies = read_copies(blobs.as_ref()).await.unwrap();
        let one = copies.iter().find(|c| c.generation == 1).unwrap();
        assert!(genuine_retirement(service.as_ref(), one));
    }

    #[tokio::test]
    async fn rewrap_moves_every_generation_to_the_new_service_and_keeps_generation_zero() {
        let (_dir, db, blobs, old) = setup();
        rotate(&db, &old, Purpose::Data, "t").await.unwrap();
        rotate(&db, &old, Purpose::Credentials, "t").await.unwrap();
        let new: Arc<dyn KeyService> = Arc::new(RootKey::from_bytes([8; 32]).file_service(None));
        let zero = || {
            vec![
                Generation::new(Purpose::Data, 0, [4; 32]),
                Generation::new(Purpose::Credentials, 0, [4; 32]),
            ]
        };
        let done = rewrap(&db, &old, &new, zero(), "t").await.unwrap();
        assert_eq!(done.rewrapped, ["credentials/1", "data/1"]);
        assert_eq!(done.added, ["data/0", "credentials/0"]);
        // Idempotent: a rerun (after a kill) re-wraps from either, adds nothing twice.
        let again = rewrap(&db, &old, &new, zero(), "t").await.unwrap();
        assert_eq!(again.rewrapped.len(), 4);
        assert!(again.added.is_empty());
        opens_under(&db, &new).await.unwrap();
        assert!(opens_under(&db, &old).await.is_err());
        let rows = db.db.read(read_rows).await.unwrap();
        let (view, _) = reconcile(&db, &new).await.unwrap();
        assert_eq!(
            numbers(&view),
            ["credentials/0", "credentials/1", "data/0", "data/1"]
        );
        // Not a table row nor a store copy opens under the old service any more.
        for copy in read_copies(blobs.as_ref())
            .await
            .unwrap()
            .iter()
            .chain(&rows)
        {
            let w = copy.wrapped.as_ref().unwrap();
            assert!(Generation::unwrap(old.as_ref(), copy.purpose, copy.generation, w).is_err());
            assert!(Generation::unwrap(new.as_ref(), copy.purpose, copy.generation, w).is_ok());
        }
    }
}
