//! The keyring's lifecycle as operations (docs/keys.md): what each data key
//! generation seals ([`Keyring::status`]), a new generation ([`Keyring::rotate`]),
//! everything re-encrypted under the newest ([`Keyring::reseal`]) and the retirement
//! of one nothing needs any more ([`Keyring::retire`]). The one code path behind
//! `stategate key status|rotate|reseal|retire|rotate-credentials` and the admin API's
//! `keys` routes. The rules are `store::keyring`'s (newest, 5 s after a rotation,
//! "still needed", all in the retire's transaction); the counting is
//! `store::reseal`'s and `drift`'s. Knows no HTTP; never returns or logs key bytes.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Serialize;

use crate::crypto::service::KeyService;
use crate::crypto::{Purpose, RootKey};
use crate::drift::{DriftResealed, DriftService};
use crate::error::Error;
use crate::store::rebuild::ScopeKeys;
use crate::store::reseal::{self, Census, GenerationCounts};
use crate::store::{keyring, StateStore};

/// The key service as of now (`installation::key_source`): asked again for every
/// operation, so a process keeps working after `key rewrap` replaced the key file.
pub type KeySource = Arc<dyn Fn() -> Arc<dyn KeyService> + Send + Sync>;

/// How far a census got: (objects read, state versions in all).
pub type Progress<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// A census that reports nothing (the admin API).
pub fn quietly(_done: usize, _total: usize) {}

/// The keyring of one installation, over its index, blob store and drift artifacts.
#[derive(Clone)]
pub struct Keyring {
    store: StateStore,
    root: RootKey,
    drift: DriftService,
    service: KeySource,
}

/// `key status`: per data generation what it seals, and which generations the ring
/// holds. Generation numbers and counts only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyStatus {
    /// What wraps the ring (`KeyService::describe`: a file path or a token, never a key).
    pub key_service: String,
    /// The data generation new writes use.
    pub data_generation: u32,
    pub credentials_generation: u32,
    /// Every generation in the ring or named by an object, oldest first.
    pub generations: Vec<GenerationStatus>,
    /// Cluster state versions, sealed under `ADJ_STATE_ENC_KEY` (outside the ring).
    pub other_root_versions: u64,
    /// Objects whose generation could not be read (named).
    pub unreadable: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GenerationStatus {
    pub generation: u32,
    /// This process can open it (not retired).
    pub in_ring: bool,
    /// New writes use it.
    pub writes: bool,
    #[serde(flatten)]
    pub counts: GenerationCounts,
}

/// A generation added by [`Keyring::rotate`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rotated {
    /// The audit event it wrote (`key.rotated`).
    pub action: &'static str,
    pub purpose: &'static str,
    pub generation: u32,
    pub key_service: String,
}

/// A generation dropped by [`Keyring::retire`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Retired {
    /// The audit event it wrote (`key.retired`).
    pub action: &'static str,
    pub generation: u32,
}

/// What [`Keyring::reseal`] did: the engine's objects (versions, backups, revocation
/// records) and drift's (outputs, kept plans). Counts and object names only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resealed {
    #[serde(flatten)]
    pub store: reseal::Resealed,
    pub drift_outputs: u64,
    pub drift_plans: u64,
    /// Drift objects of no recorded run (tidy's to delete): left alone.
    pub drift_orphans: u64,
    /// Drift objects already under the newest generation.
    #[serde(skip)]
    pub drift_current: u64,
}

impl Keyring {
    pub fn new(store: StateStore, root: RootKey, drift: DriftService, service: KeySource) -> Self {
        Keyring {
            store,
            root,
            drift,
            service,
        }
    }

    /// Every sealed object counted by the data generation its header names: state
    /// versions, backups and revocation records (`store::reseal`), drift outputs and
    /// kept plans (`drift`).
    pub async fn census(&self, progress: Progress<'_>) -> Result<Census, Error> {
        let mut census = reseal::census(
            &self.store,
            crate::tofu::SCOPE_PREFIX,
            crate::tokens::REVOCATIONS_PREFIX,
            progress,
        )
        .await?;
        self.drift.count_sealed(&mut census).await?;
        Ok(census)
    }

    pub async fn status(&self, progress: Progress<'_>) -> Result<KeyStatus, Error> {
        let census = self.census(progress).await?;
        let live = self.root.data_generations();
        let writes = self.root.data_generation();
        let mut numbers: BTreeSet<u32> = live.iter().copied().collect();
        numbers.extend(census.generations.keys());
        let generations = numbers
            .into_iter()
            .map(|g| GenerationStatus {
                generation: g,
                in_ring: live.contains(&g),
                writes: g == writes,
                counts: census.generations.get(&g).cloned().unwrap_or_default(),
            })
            .collect();
        Ok(KeyStatus {
            key_service: (self.service)().describe(),
            data_generation: writes,
            credentials_generation: self.root.credentials_generation(),
            generations,
            other_root_versions: census.other_root_versions,
            unreadable: census.unreadable,
        })
    }

    /// Adds a generation of `purpose` (audited `key.rotated` as `actor`). This process
    /// uses it at once; every other one within a second (its ring re-read).
    pub async fn rotate(&self, purpose: Purpose, actor: &str) -> Result<Rotated, Error> {
        let service = (self.service)();
        let generation = keyring::rotate(&self.store, &service, purpose, actor).await?;
        self.reload();
        Ok(Rotated {
            action: "key.rotated",
            purpose: purpose.as_str(),
            generation,
            key_service: service.describe(),
        })
    }

    /// Re-encrypts everything an older data generation seals under the newest this
    /// process knows: state versions (each under its scope's root in `scopes`; a scope
    /// whose root has no generations is always current), backups and revocation
    /// records (`store::reseal`, audited as `actor`), then drift outputs and kept plans.
    /// Resumable: stops at the first error with everything before it done.
    pub async fn reseal(
        &self,
        scopes: &ScopeKeys,
        actor: &str,
        progress: Progress<'_>,
    ) -> Result<Resealed, Error> {
        let store = reseal::reseal(
            &self.store,
            scopes,
            &self.root,
            (crate::tokens::REVOCATIONS_PREFIX, "revocation/"),
            actor,
            progress,
        )
        .await?;
        let DriftResealed {
            outputs,
            plans,
            current,
            orphans,
        } = self.drift.reseal().await?;
        Ok(Resealed {
            store,
            drift_outputs: outputs,
            drift_plans: plans,
            drift_orphans: orphans,
            drift_current: current,
        })
    }

    /// Drops data generation `generation` from the ring (audited `key.retired` as
    /// `actor`). Refused, with nothing changed, while anything counted still names it
    /// (the refusal says what), while any object's generation cannot be read, for the
    /// newest generation, for one not in the ring and within
    /// `keyring::RETIRE_AFTER_SECONDS` of a rotation.
    pub async fn retire(
        &self,
        generation: u32,
        actor: &str,
        progress: Progress<'_>,
    ) -> Result<Retired, Error> {
        let census = self.census(progress).await?;
        if !census.unreadable.is_empty() {
            tracing::warn!(unreadable = ?census.unreadable, generation, "key retire refused: objects whose generation cannot be read");
            return Err(Error::Conflict(format!(
                "{} object(s) could not be read, so what data generation {generation} still seals is not known (`key status` names them); nothing was changed",
                census.unreadable.len()
            )));
        }
        let needed = census
            .generations
            .get(&generation)
            .filter(|c| c.total() > 0)
            .map(GenerationCounts::describe);
        let service = (self.service)();
        keyring::retire(&self.store, &service, generation, actor, move |_| {
            Ok(needed)
        })
        .await?;
        self.reload();
        Ok(Retired {
            action: "key.retired",
            generation,
        })
    }

    /// Re-reads the ring now. The change is committed already: a failure only delays
    /// its use here until the next periodic re-read, so it is logged, not returned.
    fn reload(&self) {
        if let Err(e) = self.root.reload() {
            tracing::warn!(error = %e, "cannot re-read the keyring now; the periodic re-read will");
        }
    }
}
