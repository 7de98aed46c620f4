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

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bytes::Bytes;
use rusqlite::{params, Connection, OptionalExtension};
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
"#;

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

impl From<rusqlite::Error> for RingError {
    fn from(e: rusqlite::Error) -> Self {
        RingError::Db(DbError::Sqlite(e))
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
pub fn read_rows(conn: &Connection) -> Result<Vec<KeyRow>, rusqlite::Error> {
    let exists: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'key_generations'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if exists.is_none() {
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
            (None, Some(wrapped)) if row.generation > 0 => out.generations.push(
                Generation::unwrap(service, row.purpose, row.generation, wrapped)?,
            ),
            _ => {}
        }
    }
    Ok(out)
}

/// The table's rows plus the generations only `copies` (read from the blob store)
/// hold: the table wins for every generation it has.
pub fn merged(rows: Vec<KeyRow>, copies: &[KeyRow]) -> Vec<KeyRow> {
    let mut out: BTreeMap<(Purpose, u32), KeyRow> = copies
        .iter()
        .filter(|c| c.generation > 0 && c.retired_at.is_none())
        .map(|c| ((c.purpose, c.generation), c.clone()))
        .collect();
    for row in rows {
        out.insert((row.purpose, row.generation), row);
    }
    out.into_values().collect()
}

/// Reads the ring from the table on `conn` (plus `copies`) and opens it (the
/// server's reload). A copy that does not unwrap is skipped; a table row that does
/// not is an error.
pub fn load(
    conn: &Connection,
    copies: &[KeyRow],
    service: &dyn KeyService,
) -> Result<RingView, String> {
    let rows = read_rows(conn).map_err(|e| e.to_string())?;
    let in_table: std::collections::HashSet<(Purpose, u32)> =
        rows.iter().map(|r| (r.purpose, r.generation)).collect();
    let usable: Vec<KeyRow> = copies
        .iter()
        .filter(|c| {
            in_table.contains(&(c.purpose, c.generation))
                || c.wrapped.as_ref().is_some_and(|w| {
                    Generation::unwrap(service, c.purpose, c.generation, w).is_ok()
                })
        })
        .cloned()
        .collect();
    view(&merged(rows, &usable), service).map_err(|e| e.to_string())
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
    let rows = db.read(read_rows).await?;
    let copies = read_copies(blobs.as_ref()).await?;
    let mut done = Reconciled::default();
    let known: BTreeMap<(Purpose, u32), &KeyRow> = rows
        .iter()
        .map(|r| ((r.purpose, r.generation), r))
        .collect();
    let mut adopt = Vec::new();
    for copy in &copies {
        let label = copy.purpose.label(copy.generation);
        match known.get(&(copy.purpose, copy.generation)) {
            Some(row) if row.retired_at.is_some() => {
                blobs
                    .delete(&copy_key(copy.purpose, copy.generation))
                    .await?;
                done.ignored.push(label);
            }
            Some(row) if *row != copy => {
                put_copy(blobs.as_ref(), row).await?;
                done.copied.push(label);
            }
            Some(_) => {}
            None => {
                let opens = copy.retired_at.is_none()
                    && copy.generation > 0
                    && copy.wrapped.as_ref().is_some_and(|w| {
                        Generation::unwrap(service.as_ref(), copy.purpose, copy.generation, w)
                            .is_ok()
                    });
                if opens {
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
        if row.retired_at.is_none() && !have.contains(&(row.purpose, row.generation)) {
            put_copy(blobs.as_ref(), row).await?;
            done.copied.push(row.purpose.label(row.generation));
        }
    }
    if !adopt.is_empty() {
        db.write(move |conn| -> Result<(), RingError> {
            for row in &adopt {
                conn.execute(
                    "INSERT OR IGNORE INTO key_generations (purpose, generation, wrapped, created_at)
                     VALUES (?1, ?2, ?3, ?4)",
                    params![row.purpose.as_str(), row.generation, row.wrapped, row.created_at],
                )?;
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
            &AuditEntry {
                actor,
                org: None,
                scope: "keyring".into(),
                event: "key.rotated",
                payload: serde_json::json!({
                    "purpose": row.purpose.as_str(),
                    "generation": row.generation,
                    "key_service": service_name,
                }),
            },
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
    generation: u32,
    actor: &str,
    still_needed: impl FnOnce(&Connection) -> Result<Option<String>, rusqlite::Error> + Send + 'static,
) -> Result<(), RingError> {
    let (db, blobs) = (&store.db, &store.blobs);
    let actor = actor.to_string();
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
            time::OffsetDateTime::now_utc() - at < time::Duration::seconds(RETIRE_AFTER_SECONDS)
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
        let now = super::now_rfc3339();
        conn.execute(
            "INSERT INTO key_generations (purpose, generation, wrapped, created_at, retired_at)
             VALUES ('data', ?1, NULL, ?2, ?2)
             ON CONFLICT (purpose, generation) DO UPDATE SET wrapped = NULL, retired_at = ?2",
            params![generation, now],
        )?;
        insert_audit(
            conn,
            &AuditEntry {
                actor,
                org: None,
                scope: "keyring".into(),
                event: "key.retired",
                payload: serde_json::json!({"purpose": "data", "generation": generation}),
            },
        )?;
        Ok(())
    })
    .await?;
    // After the commit: the copy of a retired generation is no longer kept (a leftover
    // is deleted by the next reconcile; the row keeps it out meanwhile).
    if generation > 0 {
        blobs.delete(&copy_key(Purpose::Data, generation)).await?;
    }
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
        let err = retire(&db, 0, "t", nothing).await.unwrap_err().to_string();
        assert!(err.contains("is the newest"), "{err}");
        rotate(&db, &service, Purpose::Data, "t").await.unwrap();
        rotate(&db, &service, Purpose::Data, "t").await.unwrap();
        let err = retire(&db, 1, "t", nothing).await.unwrap_err().to_string();
        assert!(err.contains("less than"), "{err}");
        age(&db).await;
        let err = retire(&db, 7, "t", nothing).await.unwrap_err().to_string();
        assert!(err.contains("not in the ring"), "{err}");
        let err = retire(&db, 1, "t", |_: &Connection| {
            Ok(Some("3 state versions".into()))
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("still seals 3 state versions"), "{err}");
        let before = db.db.read(read_rows).await.unwrap();
        assert!(before.iter().all(|r| r.retired_at.is_none()));

        retire(&db, 1, "t", nothing).await.unwrap();
        retire(&db, 0, "t", nothing).await.unwrap();
        let (view, _) = reconcile(&db, &service).await.unwrap();
        assert_eq!(numbers(&view), ["data/2"]);
        assert_eq!(view.retired, [(Purpose::Data, 0), (Purpose::Data, 1)]);
        let err = retire(&db, 1, "t", nothing).await.unwrap_err().to_string();
        assert!(err.contains("not in the ring"), "{err}");
        // The retired copy is gone from the store; a rotation never reuses the number.
        assert_eq!(read_copies(blobs.as_ref()).await.unwrap().len(), 1);
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
}
