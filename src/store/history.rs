//! Version history and roll-forward rollback, for any scope (`tf/<ws>`, `cluster/<uuid>`).
//!
//! A rollback never rewrites or deletes history: it reads an old version (verified
//! exactly like the current one: a missing or corrupt blob is an error) and stores
//! its bytes as a NEW version through the same streamed write as a client's, so the
//! caller's guard (e.g. "nobody holds the lock") and the audit row run in the commit
//! transaction like any other write. The old version is read as a stream, never whole:
//! restoring a 1 GiB state takes the memory of a 1 MiB one.

use crate::store::sql::{params, Connection};
use bytes::Bytes;
use sha2::Digest;

use super::{
    row_to_version, AuditEntry, BodyMeta, DbError, Known, StateStore, StoreError, StreamedVersion,
    VersionRow, WriteGuard, WriteOutcome, BODY_CHANNEL, VERSION_COLUMNS,
};
use crate::crypto::SealKey;

/// Version rows of a scope, newest first (tombstones included); all when `limit` is `None`.
pub fn history_rows(
    conn: &Connection,
    scope: &str,
    limit: Option<u32>,
) -> Result<Vec<VersionRow>, crate::store::sql::Error> {
    let limit = limit.map_or(i64::MAX, i64::from); // none: more rows than there can be
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {VERSION_COLUMNS} FROM versions WHERE scope = ?1 ORDER BY version DESC LIMIT ?2"
    ))?;
    let rows = stmt.query_map(params![scope, limit], row_to_version)?;
    rows.collect()
}

/// One version row, if it exists.
pub fn version_row(
    conn: &Connection,
    scope: &str,
    version: i64,
) -> Result<Option<VersionRow>, crate::store::sql::Error> {
    use crate::store::sql::OptionalExtension;
    conn.prepare_cached(&format!(
        "SELECT {VERSION_COLUMNS} FROM versions WHERE scope = ?1 AND version = ?2"
    ))?
    .query_row(params![scope, version], row_to_version)
    .optional()
}

/// What a rollback asks for. The audit row is `event` with metadata only.
#[derive(Debug, Clone)]
pub struct Rollback {
    pub scope: String,
    /// The version whose content becomes current again.
    pub to_version: i64,
    pub actor: String,
    pub org: Option<String>,
    /// Audit event name, e.g. `tf.rollback`.
    pub event: &'static str,
    /// When set, the restored content gets a serial above every one stored for the
    /// scope, written over the bytes this scanner points at (none found: the content
    /// cannot carry a new serial and is restored as it was). The store never reads states.
    pub renumber: Option<Renumber>,
    /// When set, the restored content's resources are learnt as it is written, so the
    /// rollback has a resource timeline like any write (`tfstate::resource_scan`).
    pub summarize: Option<super::timeline::Summarizer>,
}

/// A fresh scanner that finds where a state's serial is (`tfstate::serial_span_scan`).
pub type Renumber = fn() -> Box<dyn SpanScan>;

/// Scans content piece by piece for the bytes of its serial.
pub trait SpanScan: Send {
    fn push(&mut self, piece: &[u8]);
    /// The byte range of the serial, or `None` when the content cannot be renumbered.
    fn finish(self: Box<Self>) -> Option<(u64, u64)>;
}

/// Rewrites the byte range `span` of a stream to the decimal `serial`, piece by piece;
/// every other byte passes unchanged (and uncopied).
struct Splice {
    span: (u64, u64),
    digits: Bytes,
    at: u64,
}

impl Splice {
    fn new(span: (u64, u64), serial: i64) -> Splice {
        Splice {
            span,
            digits: Bytes::from(serial.to_string()),
            at: 0,
        }
    }

    /// What the next piece of the stream becomes (one to three slices of output).
    fn piece(&mut self, data: Bytes) -> Vec<Bytes> {
        let (start, end) = self.span;
        let from = self.at;
        self.at += data.len() as u64;
        if self.at <= start || from >= end {
            return vec![data];
        }
        let cut = |offset: u64| offset.saturating_sub(from).min(data.len() as u64) as usize;
        let (before, after) = (cut(start), cut(end));
        let mut out = vec![data.slice(..before)];
        if from <= start {
            out.push(self.digits.clone());
        }
        out.push(data.slice(after..));
        out.retain(|b| !b.is_empty());
        out
    }
}

/// The highest serial stored for a scope (any version), if any.
fn max_serial(conn: &Connection, scope: &str) -> Result<Option<i64>, crate::store::sql::Error> {
    conn.prepare_cached("SELECT MAX(serial) FROM versions WHERE scope = ?1")?
        .query_row([scope], |r| r.get(0))
}

/// One above the highest of `stored` (the scope's top serial) and `restored`; `None`
/// when that cannot be represented. Checked: a wrapped serial would be older than
/// every plan it is meant to make stale.
pub fn next_serial(stored: Option<i64>, restored: Option<i64>) -> Option<i64> {
    stored.max(restored).unwrap_or(0).checked_add(1)
}

#[derive(Debug)]
pub struct RolledBack {
    /// The version that was current when the rollback ran.
    pub from_version: i64,
    pub to_version: i64,
    /// `Stored` with the new row, or `Unchanged` when the current content already is
    /// that version's (nothing written, no audit row).
    pub outcome: WriteOutcome,
}

impl StateStore {
    /// The serial a rollback gives restored content: one above every serial stored for
    /// `scope` and above `restored`, the restored version's own. Refused
    /// ([`StoreError::SerialExhausted`]) when that would pass `i64::MAX`.
    pub async fn fresh_serial(
        &self,
        scope: &str,
        restored: Option<i64>,
    ) -> Result<i64, StoreError> {
        let owned = scope.to_string();
        let top = self.db.read(move |c| max_serial(c, &owned)).await?;
        next_serial(top, restored).ok_or_else(|| StoreError::SerialExhausted {
            scope: scope.to_string(),
            serial: top.max(restored).unwrap_or(0),
        })
    }

    /// The resource timeline of a scope ([`super::timeline::timeline_rows`]).
    pub async fn timeline(
        &self,
        scope: &str,
        address: Option<&str>,
        limit: u32,
    ) -> Result<Vec<super::timeline::TimelineRow>, StoreError> {
        let scope = scope.to_string();
        let address = address.map(str::to_string);
        Ok(self
            .db
            .read(move |c| super::timeline::timeline_rows(c, &scope, address.as_deref(), limit))
            .await?)
    }

    /// Version rows of a scope, newest first: the index alone (no blob is opened).
    pub async fn history(
        &self,
        scope: &str,
        limit: Option<u32>,
    ) -> Result<Vec<VersionRow>, StoreError> {
        let scope = scope.to_string();
        Ok(self
            .db
            .read(move |c| history_rows(c, &scope, limit))
            .await?)
    }

    /// The content of one version, verified like [`StateStore::read_current`]: a
    /// missing, tampered or undecryptable blob is an error. Held whole, so a version
    /// larger than `max_bytes` is refused before anything is read.
    pub async fn read_version(
        &self,
        scope: &str,
        version: i64,
        key: &SealKey,
        max_bytes: u64,
    ) -> Result<(VersionRow, Vec<u8>), StoreError> {
        let row = self.readable_row(scope, version).await?;
        if u64::try_from(row.size).map_or(true, |size| size > max_bytes) {
            return Err(StoreError::TooLargeToView {
                scope: row.scope,
                version,
                size: row.size,
                limit: max_bytes,
            });
        }
        let plaintext = self.read_version_blob(&row, key).await?;
        Ok((row, plaintext))
    }

    /// A version's row, or why it cannot be read: unknown (404) or a tombstone.
    async fn readable_row(&self, scope: &str, version: i64) -> Result<VersionRow, StoreError> {
        let owned = scope.to_string();
        let row = self
            .db
            .read(move |c| version_row(c, &owned, version))
            .await?
            .ok_or_else(|| StoreError::VersionNotFound {
                scope: scope.to_string(),
                version,
            })?;
        if row.is_tombstone() {
            return Err(StoreError::Tombstone {
                scope: scope.to_string(),
                version,
            });
        }
        Ok(row)
    }

    /// Where `row`'s content keeps its serial, found by reading it as a stream.
    async fn serial_span(
        &self,
        row: &VersionRow,
        key: &SealKey,
        renumber: Renumber,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        let mut scan = renumber();
        let mut stream = self.stream_version_blob(row.clone(), key).await?;
        while let Some(piece) = stream.chunks.recv().await {
            scan.push(&piece?);
        }
        Ok(scan.finish())
    }

    /// The sha256 (hex) `row`'s content has once `splice` rewrote its serial.
    async fn spliced_sha256(
        &self,
        row: &VersionRow,
        key: &SealKey,
        mut splice: Splice,
    ) -> Result<String, StoreError> {
        let mut hash = sha2::Sha256::new();
        let mut stream = self.stream_version_blob(row.clone(), key).await?;
        while let Some(piece) = stream.chunks.recv().await {
            for out in splice.piece(piece?) {
                hash.update(&out);
            }
        }
        Ok(hex::encode(hash.finalize()))
    }

    /// `row`'s content as a write body (a task reads it piece by piece, `splice`
    /// rewriting its serial); a read failure ends the body with that error.
    async fn body_of<E>(
        &self,
        row: &VersionRow,
        key: &SealKey,
        mut splice: Option<Splice>,
    ) -> Result<super::BodyChunks<E>, StoreError>
    where
        E: From<StoreError> + Send + 'static,
    {
        let mut stream = self.stream_version_blob(row.clone(), key).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(BODY_CHANNEL);
        tokio::spawn(async move {
            while let Some(piece) = stream.chunks.recv().await {
                let pieces = match (piece, splice.as_mut()) {
                    (Ok(piece), Some(splice)) => splice.piece(piece),
                    (Ok(piece), None) => vec![piece],
                    (Err(e), _) => {
                        let _ = tx.send(Err(E::from(e))).await;
                        return;
                    }
                };
                for out in pieces {
                    if tx.send(Ok(Some(out))).await.is_err() {
                        return; // the write ended (refused or unchanged)
                    }
                }
            }
            let _ = tx.send(Ok(None)).await;
        });
        Ok(rx)
    }

    /// Roll-forward: stores version `to_version`'s bytes (and its serial and lineage) as
    /// a new version. `guard` runs before anything is written and again in the commit
    /// (with the newest row), and the write is refused if another write landed since
    /// the rollback began. With `renumber`, the restored content gets a fresh serial
    /// ([`Self::fresh_serial`]); a repeated rollback writes nothing. The old version is
    /// read as a stream (up to three times: to find its serial, to see whether the
    /// current version already is it, and to write it), never held whole.
    pub async fn rollback<E>(
        &self,
        request: Rollback,
        key: &SealKey,
        guard: impl WriteGuard<E>,
    ) -> Result<RolledBack, E>
    where
        E: From<StoreError> + From<DbError> + Send + 'static,
    {
        let latest = self
            .latest(&request.scope)
            .await
            .map_err(E::from)?
            .ok_or_else(|| {
                E::from(StoreError::VersionNotFound {
                    scope: request.scope.clone(),
                    version: request.to_version,
                })
            })?;
        let from_version = latest.version;
        let old = self
            .readable_row(&request.scope, request.to_version)
            .await
            .map_err(E::from)?;
        // The current version already has this content: nothing will be written, so
        // there is no serial to find.
        let renumber = request.renumber.filter(|_| latest.sha256 != old.sha256);
        let span = match renumber {
            Some(renumber) => self
                .serial_span(&old, key, renumber)
                .await
                .map_err(E::from)?,
            None => None,
        };
        // The serial to give it, how to write it into the content, and the content's
        // sha256 when known up front (then identical content is found before any write).
        let (serial, splice, known_sha256) = match span {
            None => (old.serial, None, old.sha256.clone()),
            Some(span) => {
                // This content under the current serial is what a repeated rollback
                // finds: then nothing is written, as for any identical content.
                let as_current = match latest.serial {
                    Some(s) if s >= 0 => {
                        let sha = self
                            .spliced_sha256(&old, key, Splice::new(span, s))
                            .await
                            .map_err(E::from)?;
                        (Some(&sha) == latest.sha256.as_ref()).then_some(s)
                    }
                    _ => None,
                };
                match as_current {
                    Some(s) => (Some(s), Some(Splice::new(span, s)), latest.sha256.clone()),
                    None => {
                        let next = self
                            .fresh_serial(&request.scope, old.serial)
                            .await
                            .map_err(E::from)?;
                        (Some(next), Some(Splice::new(span, next)), None)
                    }
                }
            }
        };
        let audit = AuditEntry {
            actor: request.actor.clone(),
            org: request.org.clone(),
            scope: request.scope.clone(),
            event: request.event,
            // Metadata only, never content. The guard below pins the new version number.
            payload: serde_json::json!({
                "from_version": from_version,
                "to_version": request.to_version,
                "new_version": from_version + 1,
                "serial": serial,
                "restored_serial": old.serial,
            }),
        };
        let new = StreamedVersion {
            scope: request.scope.clone(),
            actor: request.actor.clone(),
            facts: super::WriteFacts {
                restored_from: Some(request.to_version),
                ..Default::default()
            },
            check: Box::new(Known(
                Some(BodyMeta {
                    serial,
                    lineage: old.lineage.clone(),
                    audit: Some(audit),
                    resources: None,
                }),
                request
                    .summarize
                    .map(|summarize| summarize(key.resource_digest_key())),
            )),
        };
        let body = self.body_of(&old, key, splice).await.map_err(E::from)?;
        let scope = request.scope.clone();
        let outcome = self
            .write_streamed(new, body, key, known_sha256, move |conn, latest| {
                guard(conn, latest)?;
                match latest.map(|r| r.version) {
                    Some(v) if v == from_version => Ok(()),
                    found => Err(E::from(StoreError::Moved {
                        scope: scope.clone(),
                        found: found.unwrap_or(0),
                    })),
                }
            })
            .await?;
        Ok(RolledBack {
            from_version,
            to_version: request.to_version,
            outcome,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_serials_never_wrap() {
        // (top stored serial, restored version's serial, fresh serial)
        let table = [
            (None, None, Some(1)),
            (Some(4), Some(2), Some(5)),
            (Some(2), Some(4), Some(5)),
            (None, Some(0), Some(1)),
            (Some(i64::MAX - 1), Some(3), Some(i64::MAX)),
            (Some(i64::MAX), Some(3), None),
            (Some(3), Some(i64::MAX), None),
        ];
        for (stored, restored, fresh) in table {
            assert_eq!(
                next_serial(stored, restored),
                fresh,
                "{stored:?} {restored:?}"
            );
        }
    }

    /// Cut into pieces of every size, a spliced stream is the content with exactly the
    /// span replaced, wherever the span falls relative to the cuts.
    #[test]
    fn splice_rewrites_only_the_span_across_every_cut() {
        let body = br#"{"version":4,"serial":7,"lineage":"l","outputs":{}}"#;
        let start = body.windows(3).position(|w| w == b":7,").unwrap() as u64 + 1;
        let cases = [((start, start + 1), 12345i64), ((0, 1), 0), ((50, 51), 99)];
        for ((from, to), serial) in cases {
            let (a, b) = (from as usize, to as usize);
            let mut expected = body[..a].to_vec();
            expected.extend_from_slice(serial.to_string().as_bytes());
            expected.extend_from_slice(&body[b..]);
            for size in 1..=body.len() {
                let mut splice = Splice::new((from, to), serial);
                let out: Vec<u8> = body
                    .chunks(size)
                    .flat_map(|piece| splice.piece(Bytes::copy_from_slice(piece)))
                    .flat_map(|b| b.to_vec())
                    .collect();
                assert_eq!(out, expected, "span {from}..{to}, pieces of {size}");
            }
        }
    }
}
