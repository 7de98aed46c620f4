//! The storage engine without the gateway (the run's real index — SQLite, or
//! PostgreSQL on the PostgreSQL pass — and real local blobs), for retention and
//! rebuild tests: a store whose deletes are watched, and helpers that write versions
//! and plant orphan blobs with explicit times.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use stategate::config::Config;
use stategate::crypto::RootKey;
use stategate::store::blob::{BlobReader, BlobSink};
use stategate::store::format::{self, BlobHeader};
use stategate::store::history::history_rows;
use stategate::store::index::Index;
use stategate::store::{
    BlobError, BlobStore, LocalStore, NewVersion, StateStore, StoreError, VersionRow, WriteOutcome,
};
use time::OffsetDateTime;

/// A local store that records, at every delete, whether a version row still pointed
/// at the blob (it must not: rows go first), and can be told to fail deletes.
pub struct WatchedStore {
    inner: LocalStore,
    index: Index,
    pub deleted_while_referenced: Mutex<Vec<String>>,
    pub deletes: Mutex<Vec<String>>,
    pub fail_deletes: AtomicBool,
}

#[async_trait]
impl BlobStore for WatchedStore {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), BlobError> {
        self.inner.put(key, data).await
    }
    async fn create(&self, key: &str) -> Result<Box<dyn BlobSink>, BlobError> {
        self.inner.create(key).await
    }
    async fn get(&self, key: &str) -> Result<Option<Bytes>, BlobError> {
        self.inner.get(key).await
    }
    async fn read(&self, key: &str) -> Result<Option<BlobReader>, BlobError> {
        self.inner.read(key).await
    }
    async fn delete(&self, key: &str) -> Result<(), BlobError> {
        let conn = self.index.connect().unwrap();
        let refs: i64 = conn
            .query_row(
                "SELECT count(*) FROM versions WHERE blob_key = ?1",
                [key],
                |r| r.get(0),
            )
            .unwrap();
        if refs > 0 {
            self.deleted_while_referenced
                .lock()
                .unwrap()
                .push(key.to_string());
        }
        if self.fail_deletes.load(Ordering::SeqCst) {
            return Err(BlobError::Unavailable("test: store down".into()));
        }
        self.deletes.lock().unwrap().push(key.to_string());
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, BlobError> {
        self.inner.list(prefix).await
    }
    fn describe(&self) -> String {
        "watched local store".into()
    }
    fn write_buffer_bytes(&self) -> u64 {
        self.inner.write_buffer_bytes()
    }
}

pub struct Engine {
    pub dir: tempfile::TempDir,
    pub store: StateStore,
    /// The same database, for what tests set up beside the store (identities).
    pub db: stategate::store::Db,
    pub blobs: Arc<WatchedStore>,
    /// The SQLite file (there only on the SQLite pass).
    pub db_path: std::path::PathBuf,
    pub index: Index,
    pub root: RootKey,
    /// Last: the PostgreSQL pass's database goes after the engine.
    _database: Option<super::TestDatabase>,
}

/// An engine on this run's index ([`super::test_index`]), dropped with it.
pub fn engine() -> Engine {
    let (index, database) = super::test_index();
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        data_dir: dir.path().to_path_buf(),
        index,
        ..Config::default()
    };
    let db_path = config.db_path();
    let index = Index::of(&config);
    let db = index.open(&stategate::schema::INDEX).unwrap();
    let blobs = Arc::new(WatchedStore {
        inner: LocalStore::open(&dir.path().join("blobs")).unwrap(),
        index: index.clone(),
        deleted_while_referenced: Mutex::new(Vec::new()),
        deletes: Mutex::new(Vec::new()),
        fail_deletes: AtomicBool::new(false),
    });
    Engine {
        store: StateStore::new(db.clone(), blobs.clone()),
        db,
        blobs,
        db_path,
        index,
        _database: database,
        root: RootKey::from_bytes([7; 32]),
        dir,
    }
}

pub const CLUSTER_KEY: [u8; 32] = [9; 32];

/// Writes one version (no guard) sealed under the key its scope kind uses.
pub async fn write(
    store: &StateStore,
    scope: &str,
    body: &[u8],
    serial: Option<i64>,
) -> VersionRow {
    let root = if scope.starts_with("cluster/") {
        RootKey::from_bytes(CLUSTER_KEY)
    } else {
        RootKey::from_bytes([7; 32])
    };
    let new = NewVersion {
        scope: scope.into(),
        plaintext: Bytes::copy_from_slice(body),
        serial,
        lineage: Some("lin".into()),
        actor: "test".into(),
        facts: Default::default(),
        audit: None,
        resources: None,
    };
    match store
        .write_version(new, &root.blob_key(scope), |_, _| Ok::<(), StoreError>(()))
        .await
        .unwrap()
    {
        WriteOutcome::Stored(row) => row,
        WriteOutcome::Unchanged(row) => panic!("unchanged at v{}", row.version),
    }
}

impl Engine {
    /// A connection of its own to the engine's index (usable on an async thread).
    pub fn conn(&self) -> stategate::store::sql::Connection {
        self.index.connect().unwrap()
    }

    pub fn set_created(&self, scope: &str, version: i64, at: OffsetDateTime) {
        let text = at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        let n = self
            .conn()
            .execute(
                "UPDATE versions SET created_at = ?1 WHERE scope = ?2 AND version = ?3",
                stategate::store::sql::params![text, scope, version],
            )
            .unwrap();
        assert_eq!(n, 1);
    }

    pub fn versions(&self, scope: &str) -> Vec<i64> {
        history_rows(&self.conn(), scope, None)
            .unwrap()
            .into_iter()
            .rev()
            .map(|r| r.version)
            .collect()
    }

    pub fn blob_exists(&self, key: &str) -> bool {
        self.dir.path().join("blobs").join(key).exists()
    }

    /// Puts a blob no row references, claiming (scope, version), written at `at`.
    pub async fn put_orphan(&self, scope: &str, version: i64, at: OffsetDateTime) -> String {
        let body = b"{\"orphan\":true}";
        let header = BlobHeader {
            scope: scope.into(),
            version,
            serial: Some(99),
            lineage: Some("lin".into()),
            sha256: hex::encode(format::sha2_digest(body)),
            size: body.len() as i64,
            created_at: at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap(),
            actor: "test".into(),
            parent: None,
            facts: Default::default(),
            key_gen: 0,
        };
        let blob = format::encode(&self.root.blob_key(scope), &header, body).unwrap();
        let key = stategate::store::blob_key_for(scope, version);
        self.blobs.put(&key, Bytes::from(blob)).await.unwrap();
        key
    }
}
