//! The admin commands' opening: the index alone (the data dir's SQLite, made on first
//! use, or the PostgreSQL database `[index]` names; a server may keep running: writes
//! are serialized), so orgs, users and operators can be made before the first `serve`
//! and while the store is down. A change that must outlive a restore from an older
//! backup (a revocation, a narrowed role) is recorded in the blob store before it
//! commits; the key and the store are opened only then. When that cannot be done the
//! change still goes ahead (a leaked token must stop working now), and the result says
//! what a restore would then undo.

use std::future::Future;

use anyhow::Context;

use crate::cluster::identity::{self, AdminError};
use crate::config::Config;
use crate::operator::identity as operators;
use crate::operator::roles::Grant;
use crate::store::blob::create_private_dir;
use crate::store::sql::Connection;
use crate::store::Db;
use crate::tokens;

/// The index, open for the admin commands.
pub struct Records {
    config: Config,
    db: Db,
}

/// A change in force; `unrecorded` says why the store could not record it first (a
/// restore from a backup taken before now would undo it), when it could not.
pub struct Recorded<T> {
    pub done: T,
    pub unrecorded: Option<String>,
}

/// What `set-role` changed: the operator as it stood, which of its grants was set,
/// and what it holds now.
pub struct RoleChanged {
    pub before: operators::Standing,
    pub set: operators::RoleSet,
    pub after: operators::Standing,
}

impl Records {
    /// The data dir (made when missing) and the index in it, with every schema.
    pub fn open(config: &Config) -> anyhow::Result<Records> {
        create_private_dir(&config.data_dir)
            .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
        Ok(Records {
            config: config.clone(),
            db: super::open_database(config)?,
        })
    }

    /// A change and its audit row, in one write transaction.
    pub fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, AdminError> + Send + 'static,
    ) -> impl Future<Output = Result<T, AdminError>> + '_ {
        self.db.write(f)
    }

    /// A listing, on the reader connection.
    pub async fn read<T: Send + 'static>(
        &self,
        f: impl Fn(&Connection) -> Result<T, AdminError> + Send + 'static,
    ) -> Result<T, AdminError> {
        self.db.read(move |c| Ok(f(c))).await?
    }

    /// Disables the user `email` and revokes its tokens (each recorded first); whether
    /// anything changed.
    pub async fn disable_principal(
        &self,
        email: String,
        actor: String,
    ) -> Result<Recorded<bool>, AdminError> {
        let of = email.clone();
        let found = self
            .read(move |c| identity::principal_tokens_to_revoke(c, &of))
            .await?;
        let unrecorded = self.record_revocations(&found).await;
        let done = self
            .write(move |c| identity::disable_principal(c, &email, &actor))
            .await?;
        Ok(Recorded { done, unrecorded })
    }

    /// Revokes the user token `id` (recorded first).
    pub async fn revoke_principal_token(
        &self,
        id: String,
        actor: String,
    ) -> Result<Recorded<()>, AdminError> {
        let named = id.clone();
        self.revoke_token(
            move |c| Ok(identity::principal_token_to_revoke(c, &named)?.0),
            move |c| identity::revoke_principal_token(c, &id, &actor),
        )
        .await
    }

    /// Revokes the operator token `id` (recorded first).
    pub async fn revoke_operator_token(
        &self,
        id: String,
        actor: String,
    ) -> Result<Recorded<()>, AdminError> {
        let named = id.clone();
        self.revoke_token(
            move |c| Ok(operators::operator_token_to_revoke(c, &named)?.0),
            move |c| operators::revoke_operator_token(c, &id, &actor),
        )
        .await
    }

    /// Revokes the one token `find` names by `revoke`, recorded in the store first.
    async fn revoke_token(
        &self,
        find: impl Fn(&Connection) -> Result<tokens::Found, AdminError> + Send + 'static,
        revoke: impl FnOnce(&Connection) -> Result<(), AdminError> + Send + 'static,
    ) -> Result<Recorded<()>, AdminError> {
        let found = self.read(find).await?;
        let unrecorded = self.record_revocations(&[found]).await;
        self.write(revoke).await?;
        Ok(Recorded {
            done: (),
            unrecorded,
        })
    }

    /// Sets the operator `email`'s grant (a single sign-on operator's cap), recorded
    /// first so a restore applies it again.
    pub async fn set_operator_grant(
        &self,
        email: String,
        grant: Grant,
        actor: String,
    ) -> Result<Recorded<RoleChanged>, AdminError> {
        let named = email.clone();
        let before = self.read(move |c| operators::standing(c, &named)).await?;
        let change = operators::grant_narrowing(&before, &grant, &actor);
        let unrecorded = self
            .record(|root, blobs| async move {
                tokens::NarrowingLog::new(blobs, root)
                    .record(&change)
                    .await?;
                Ok(())
            })
            .await;
        let set = self
            .write(move |c| operators::set_operator_grant(c, &email, &grant, &actor))
            .await?;
        let now = before.email.clone();
        let after = self.read(move |c| operators::standing(c, &now)).await?;
        Ok(Recorded {
            done: RoleChanged { before, set, after },
            unrecorded,
        })
    }

    /// Records the revocations of `found` in the blob store, before they commit.
    async fn record_revocations(&self, found: &[tokens::Found]) -> Option<String> {
        self.record(|root, blobs| async move {
            let log = tokens::RevocationLog::new(blobs, root);
            let at = crate::store::now_rfc3339();
            for token in found {
                log.record(token, &at).await?;
            }
            Ok(())
        })
        .await
    }

    /// Runs `record` with the root key and the blob store; why it failed, if it did.
    async fn record<F, Fut>(&self, record: F) -> Option<String>
    where
        F: FnOnce(crate::crypto::RootKey, std::sync::Arc<dyn crate::store::BlobStore>) -> Fut,
        Fut: Future<Output = anyhow::Result<()>>,
    {
        let opened = super::load_root_key(&self.config, false)
            .and_then(|root| Ok((root, super::open_blob_store(&self.config)?)));
        let recorded = match opened {
            Ok((root, blobs)) => record(root, blobs).await,
            Err(e) => Err(e),
        };
        recorded.err().map(|e| format!("{e:#}"))
    }
}
