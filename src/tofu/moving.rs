//! Moving resources between two workspaces as one [`TofuBackend`] operation: both
//! locks, both versions in one commit, recorded first so a crash is recovered
//! (rules and SQL in `moves.rs`).

use super::*;

/// What a move did: the new version of each workspace and what moved.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MoveDone {
    pub from: MovedSide,
    pub to: MovedSide,
    pub addresses: Vec<String>,
    /// Resource instances moved (every instance of each address).
    pub instances: usize,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MovedSide {
    pub workspace: String,
    pub version: i64,
    pub serial: Option<i64>,
}

impl TofuBackend {
    /// Moves the resource records `addresses` (every instance of each) from the state
    /// of `source` to the state of `destination`, as `terraform state mv -state-out`
    /// between two files would, by `actor`: takes both workspace locks (in name order,
    /// in one transaction; refused with 423 while either is locked or frozen), reads
    /// both current states whole (each at most `max_bytes`, else 409), writes one new
    /// version of each (next serial, lineage kept) in ONE commit that re-checks both
    /// locks, audited as one `tf.resources_moved` naming both versions, then releases
    /// the locks. Any refusal changes nothing.
    pub async fn move_resources(
        &self,
        source: &str,
        destination: &str,
        addresses: &[String],
        actor: &str,
        max_bytes: u64,
    ) -> Result<MoveDone, Error> {
        crate::names::validate_workspace(source)?;
        crate::names::validate_workspace(destination)?;
        if source == destination {
            return Err(Error::Invalid(
                "the source and the destination are the same workspace; nothing was moved".into(),
            ));
        }
        let addresses = moves::check_addresses(addresses)
            .map_err(|e| Error::Invalid(format!("{e}; nothing was moved")))?;
        let move_id = format!("stategate-move-{}", uuid::Uuid::new_v4());
        let mut order = [source.to_string(), destination.to_string()];
        order.sort();
        let info = serde_json::json!({
            "ID": move_id,
            "Operation": "stategate workspace move",
            "Info": format!("moving {} resources from {source} to {destination}", addresses.len()),
            "Who": actor,
            "Version": "",
            "Created": crate::store::now_rfc3339(),
            "Path": "",
        })
        .to_string();
        let lock = HeldLock {
            id: move_id.clone(),
            info,
        };
        let (taken, by) = (order.clone(), actor.to_string());
        // Recorded in the transaction that takes the locks, before them: no lock of a
        // move exists without the record that lets housekeeping release it.
        let record = moves::Recorded {
            move_id: move_id.clone(),
            source: source.to_string(),
            destination: destination.to_string(),
            actor: actor.to_string(),
            process: moves::this_process().to_string(),
            heartbeat_unix: unix_now(),
            started_at: crate::store::now_rfc3339(),
        };
        self.db
            .write(move |conn| -> Result<(), Error> {
                moves::record(conn, &record).map_err(DbError::from)?;
                for ws in &taken {
                    if let Some(f) = freeze_in_force(conn, ws)? {
                        return Err(frozen(&f));
                    }
                    if let Some(holder) = held_lock(conn, ws).map_err(DbError::from)? {
                        return Err(locked_by(holder));
                    }
                    lock::put_lock(conn, ws, &lock, &by).map_err(DbError::from)?;
                }
                Ok(())
            })
            .await?;
        // In a JoinSet, which aborts the heartbeat when dropped: it stops with this
        // move however the move ends (returned, cancelled with its request, panicked),
        // so no node keeps a dead move looking alive.
        let mut beating = tokio::task::JoinSet::new();
        {
            let (db, id) = (self.db.clone(), move_id.clone());
            beating.spawn(async move {
                loop {
                    tokio::time::sleep(moves::HEARTBEAT).await;
                    let id = id.clone();
                    let beat = db
                        .write(move |c| -> Result<(), DbError> {
                            Ok(moves::beat(c, &id, unix_now())?)
                        })
                        .await;
                    if let Err(e) = beat {
                        tracing::warn!(error = %e, "a move cannot renew its heartbeat");
                    }
                }
            });
        }
        moves::pause_point("locked").await;
        let done = self
            .move_locked(source, destination, &addresses, actor, max_bytes, &move_id)
            .await;
        if done.is_ok() {
            moves::pause_point("committed").await;
        }
        drop(beating);
        let (held, id) = (order, move_id);
        let released = self
            .db
            .write(move |conn| -> Result<(), Error> {
                for ws in &held {
                    if held_lock(conn, ws)
                        .map_err(DbError::from)?
                        .is_some_and(|l| l.id == id)
                    {
                        lock::delete_lock(conn, ws).map_err(DbError::from)?;
                    }
                }
                moves::forget(conn, &id).map_err(DbError::from)?;
                Ok(())
            })
            .await;
        if let Err(e) = released {
            tracing::warn!(source, destination, error = %e, "a move could not release its locks; free them with `stategate workspace unlock`");
        }
        done
    }

    /// Releases the locks of every move whose process is gone ([`moves::gone`]: killed
    /// or crashed, on this machine at once, elsewhere once its heartbeat lapsed), each
    /// audited as `tf.move_abandoned` on its workspace by [`HOUSEKEEPING`]; returns
    /// their lock IDs. Nothing a move committed is undone: its two versions were
    /// committed together or not at all. Housekeeping runs it at start and on every
    /// pass.
    pub async fn release_abandoned_moves(&self) -> Result<Vec<String>, Error> {
        // Judged on a reader first: a pass with no abandoned move (nearly every pass, on
        // every node) takes no write lock; the writer judges its candidates again.
        let now = unix_now();
        let recorded = self.db.read(moves::recorded).await?;
        let abandoned: Vec<String> = recorded
            .into_iter()
            .filter(|m| moves::gone(&m.process, m.heartbeat_unix, now))
            .map(|m| m.move_id)
            .collect();
        if abandoned.is_empty() {
            return Ok(Vec::new());
        }
        self.db
            .write(move |conn| -> Result<Vec<String>, Error> {
                let now = unix_now();
                let mut released = Vec::new();
                for m in moves::recorded(conn).map_err(DbError::from)? {
                    if !abandoned.contains(&m.move_id)
                        || !moves::gone(&m.process, m.heartbeat_unix, now)
                    {
                        continue;
                    }
                    for ws in [&m.source, &m.destination] {
                        let ours = held_lock(conn, ws)
                            .map_err(DbError::from)?
                            .is_some_and(|l| l.id == m.move_id);
                        if !ours {
                            continue;
                        }
                        lock::delete_lock(conn, ws).map_err(DbError::from)?;
                        // Each workspace's row names only that workspace.
                        let entry = audit(
                            HOUSEKEEPING,
                            ws,
                            EVENT_MOVE_ABANDONED,
                            serde_json::json!({
                                "lock_id": m.move_id,
                                "moved_by": m.actor,
                                "started_at": m.started_at,
                            }),
                        );
                        insert_audit(conn, &entry).map_err(DbError::from)?;
                    }
                    moves::forget(conn, &m.move_id).map_err(DbError::from)?;
                    released.push(m.move_id);
                }
                Ok(released)
            })
            .await
    }

    /// The part of [`Self::move_resources`] that runs under both locks: both newest
    /// states read, the resources moved between them, and both new versions committed
    /// in one transaction that checks the locks and that neither state changed since.
    pub(super) async fn move_locked(
        &self,
        source: &str,
        destination: &str,
        addresses: &[String],
        actor: &str,
        max_bytes: u64,
        move_id: &str,
    ) -> Result<MoveDone, Error> {
        let from = self.state_to_move(source, "from", max_bytes).await?;
        let to = self.state_to_move(destination, "to", max_bytes).await?;
        let moved = moves::move_resources(&from.1, &to.1, addresses)
            .map_err(|why| move_refusal(source, destination, why))?;
        let instances = moved.instances;
        let seen = [from.0.version, to.0.version];
        let news = vec![
            self.moved_version(
                source,
                moved.source,
                moved.source_serial,
                from.0.lineage,
                actor,
                // Each version says where its resources went or came from: listings
                // count them as moved, not as added or destroyed.
                WriteFacts {
                    moved_to: Some(destination.to_string()),
                    ..Default::default()
                },
            ),
            self.moved_version(
                destination,
                moved.destination,
                moved.destination_serial,
                to.0.lineage,
                actor,
                WriteFacts {
                    moved_from: Some(source.to_string()),
                    ..Default::default()
                },
            ),
        ];
        let record = MoveRecord {
            names: [source.to_string(), destination.to_string()],
            seen,
            move_id: move_id.to_string(),
            actor: actor.to_string(),
            addresses: addresses.to_vec(),
            instances,
        };
        let rows = self
            .store
            .write_versions(news, move |conn, current, rows| {
                record.commit(conn, current, rows)
            })
            .await?;
        let side = |ws: &str, row: &VersionRow| MovedSide {
            workspace: ws.to_string(),
            version: row.version,
            serial: row.serial,
        };
        Ok(MoveDone {
            from: side(source, &rows[0]),
            to: side(destination, &rows[1]),
            addresses: addresses.to_vec(),
            instances,
        })
    }

    /// The newest version of workspace `ws` and its state, the move's side `what`;
    /// refused when it has none (or a tombstone).
    async fn state_to_move(
        &self,
        ws: &str,
        what: &str,
        max_bytes: u64,
    ) -> Result<(VersionRow, Vec<u8>), Error> {
        let latest = self.store.latest(&scope(ws)).await?;
        let Some(row) = latest.filter(|r| !r.is_tombstone()) else {
            return Err(Error::Conflict(format!(
                "workspace {ws:?} has no state to move {what} (run terraform apply there first); nothing was moved"
            )));
        };
        self.read_version(ws, row.version, max_bytes).await
    }

    /// One of a move's two new versions, with the resources it holds for the timeline
    /// (the body is whole in memory anyway) and the key it is sealed with.
    fn moved_version(
        &self,
        ws: &str,
        body: Vec<u8>,
        serial: i64,
        lineage: Option<String>,
        actor: &str,
        facts: WriteFacts,
    ) -> (NewVersion, crate::crypto::SealKey) {
        let key = self.root.blob_key(&scope(ws));
        let resources = crate::store::timeline::summarize_whole(
            crate::tfstate::resource_scan(key.resource_digest_key()),
            &body,
        );
        let version = NewVersion {
            scope: scope(ws),
            plaintext: Bytes::from(body),
            serial: Some(serial),
            lineage,
            actor: actor.to_string(),
            facts,
            audit: None,
            resources,
        };
        (version, key)
    }
}

/// Why a move was refused, in the words of the workspaces it names.
fn move_refusal(source: &str, destination: &str, why: moves::Refusal) -> Error {
    let name = |side| match side {
        moves::Side::Source => source,
        moves::Side::Destination => destination,
    };
    match why {
        moves::Refusal::Missing(list) => Error::Invalid(format!(
            "not in the state of {source:?}: {}; nothing was moved",
            moves::listing(&list)
        )),
        moves::Refusal::Present(list) => Error::Conflict(format!(
            "already in the state of {destination:?}: {}; nothing was moved",
            moves::listing(&list)
        )),
        moves::Refusal::NotAState(side, why) => Error::Conflict(format!(
            "the state of {:?} cannot be parsed: {why}; nothing was moved",
            name(side)
        )),
        moves::Refusal::SerialExhausted(side) => Error::Conflict(format!(
            "the state of {:?} has the largest serial stategate stores; nothing was moved",
            name(side)
        )),
    }
}

/// What a move's commit checks and records: its two workspaces, the versions it read,
/// its lock, who moved what.
struct MoveRecord {
    names: [String; 2],
    seen: [i64; 2],
    move_id: String,
    actor: String,
    addresses: Vec<String>,
    instances: usize,
}

impl MoveRecord {
    /// The guard of the move's commit (`StateStore::write_versions`): the move's lock
    /// still holds both workspaces and neither was written since it was read; then
    /// one audit row and both versions' posture.
    fn commit(
        &self,
        conn: &Connection,
        current: &[Option<VersionRow>],
        rows: &[VersionRow],
    ) -> Result<(), Error> {
        for ((ws, now), seen) in self.names.iter().zip(current).zip(&self.seen) {
            // Our lock still holds (not force-unlocked), and nothing was
            // written since the states were read.
            check_writer(conn, ws, Some(&self.move_id))?;
            if now.as_ref().map(|r| r.version) != Some(*seen) {
                return Err(Error::Conflict(format!(
                    "{ws} changed while the move ran; nothing was moved, try again"
                )));
            }
        }
        let side = |i: usize| serde_json::json!({ "workspace": self.names[i], "version": rows[i].version, "serial": rows[i].serial });
        let entry = audit(
            &self.actor,
            &self.names[0],
            EVENT_RESOURCES_MOVED,
            serde_json::json!({
                "from": side(0),
                "to": side(1),
                "addresses": self.addresses.iter().take(100).collect::<Vec<_>>(),
                "address_count": self.addresses.len(),
                "instances": self.instances,
            }),
        );
        insert_audit(conn, &entry).map_err(DbError::from)?;
        // Both new states are plain Terraform states (a move refuses an
        // encrypted one), so their posture is known without scanning them.
        for (ws, row) in self.names.iter().zip(rows) {
            posture::record(
                conn,
                ws,
                row.version,
                &crate::tfstate::BodyEncryption::Plaintext,
            )
            .map_err(DbError::from)?;
        }
        Ok(())
    }
}
