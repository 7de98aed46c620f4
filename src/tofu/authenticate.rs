//! Who is asking: the credential a backend request presents (derived bearer, issued
//! token, consumer, run credential, CI identity token) judged against the workspace,
//! in one read that also brings the lock rows a LOCK is judged on.

use super::*;

/// What a credential check reads: the workspace's credentials (`credentials::presented`)
/// and the drift run the secret is a credential of, if any.
pub(super) type Found = (credentials::Presented, Option<String>);

impl TofuBackend {
    /// Which credential of `workspace` `presented` is, if any, for a request that does
    /// `what` (only an outputs read looks at consumers). Every credential is checked
    /// here, in this order, after one short lookup on an idle reader (never the
    /// writer): the workspace's derived bearer at its current generation (constant
    /// time), a drift run's credential (`sgr_`), an issued workspace token (`sgw_`:
    /// found by its hash whether live or not, then judged here, so a revoked, expired
    /// or other workspace's token costs what a wrong one does), and for an outputs
    /// read the derived credentials of the consumers this workspace names. The caller
    /// asks [`access::permits`]; every refusal is the same 401.
    pub async fn authenticate(
        &self,
        workspace: &str,
        presented: Option<Vec<u8>>,
        what: access::Use,
    ) -> Result<Option<Credential>, Error> {
        let Some(secret) = presented else {
            return Ok(None);
        };
        let now = unix_now();
        if ci_identity::is_token_shaped(&secret) {
            return self.authenticate_ci(workspace, &secret, what, now).await;
        }
        let outputs = what == access::Use::ReadOutputs;
        let found = self
            .look_up(workspace, &secret, outputs, now, "credential", |_| Ok(()))
            .await?;
        Ok(self.judge_credential(workspace, &secret, now, found.0))
    }

    /// [`Self::authenticate`] of a LOCK (a write), reading the workspace's lock row and
    /// freeze in the same lookup, whatever the credential turns out to be (so every
    /// refusal costs the same): the LOCK that follows is answered from them when they
    /// refuse it ([`LockSeen`]).
    pub async fn authenticate_lock(
        &self,
        workspace: &str,
        secret: Vec<u8>,
    ) -> Result<(Option<Credential>, LockSeen), Error> {
        let ws = workspace.to_string();
        let now = unix_now();
        if ci_identity::is_token_shaped(&secret) {
            let who = self
                .authenticate_ci(workspace, &secret, access::Use::Write, now)
                .await?;
            let seen = self
                .db
                .read_remembered(format!("ci-lock:{workspace}"), move |c| {
                    LockSeen::read(c, &ws)
                })
                .await?;
            return Ok((who, seen));
        }
        let (found, seen) = self
            .look_up(workspace, &secret, false, now, "lock", move |c| {
                LockSeen::read(c, &ws)
            })
            .await?;
        Ok((self.judge_credential(workspace, &secret, now, found), seen))
    }

    /// [`Self::authenticate`] of a CI job's identity token (`ci_identity`): verified
    /// against its issuer's keys, mapped by its rules, and admitted inside its window
    /// (which writes its first-seen record, so only for a request `what` is permitted).
    pub(super) async fn authenticate_ci(
        &self,
        workspace: &str,
        token: &[u8],
        what: access::Use,
        now: i64,
    ) -> Result<Option<Credential>, Error> {
        let Some(verified) = self.ci.verify(token, now).await else {
            return Ok(None);
        };
        let Some(who) = verified
            .credential(workspace)
            .filter(|who| access::permits(who, what))
        else {
            return Ok(None);
        };
        let admitted = self.ci.admit(&self.db, &verified, now).await?;
        Ok(admitted.then_some(who))
    }

    /// What the credential check reads at `now`, in one short read transaction on an
    /// idle reader (never the writer), with `also` (named `also_name`) of the same
    /// snapshot.
    ///
    /// A secret of neither an issued token's nor a drift run's shape can only be a
    /// derived credential, whose check reads the workspace's generation alone: nothing
    /// the secret or the time selects. That lookup is remembered between commits
    /// (`Db::read_remembered`), so a storm of refused LOCKs, right or wrong secret
    /// alike, reads no rows until something changes.
    pub(super) async fn look_up<T: Clone + crate::store::db::Weigh + Send + 'static>(
        &self,
        workspace: &str,
        secret: &[u8],
        outputs: bool,
        now: i64,
        also_name: &str,
        also: impl Fn(&Connection) -> Result<T, crate::store::sql::Error> + Send + 'static,
    ) -> Result<(Found, T), Error> {
        let ws = workspace.to_string();
        if !outputs
            && !credentials::is_token_shaped(secret)
            && !run_credential::is_run_shaped(secret)
        {
            let (generation, also) = self
                .db
                .read_remembered(format!("{also_name}:{workspace}"), move |c| {
                    Ok((credentials::generation(c, &ws)?, also(c)?))
                })
                .await?;
            let presented = credentials::Presented {
                generation,
                ..Default::default()
            };
            return Ok(((presented, None), also));
        }
        let lookup = secret.to_vec();
        Ok(self
            .db
            .read_snapshot(move |c| {
                let presented = credentials::presented(c, &ws, &lookup, outputs)?;
                let run = run_credential::lookup(c, &ws, &lookup, now)?;
                Ok(((presented, run), also(c)?))
            })
            .await?)
    }

    /// Which credential of `workspace` `secret` is at `now`, from what
    /// [`Self::look_up`] found.
    pub(super) fn judge_credential(
        &self,
        workspace: &str,
        secret: &[u8],
        now: i64,
        (found, run): Found,
    ) -> Option<Credential> {
        let bearer = self.root.workspace_bearer_at(workspace, found.generation);
        if crate::crypto::secrets_equal(secret, bearer.as_bytes()) {
            return Some(Credential::Workspace);
        }
        if let Some(name) = run {
            return Some(Credential::Run(name));
        }
        if let Some((stored, Some(grant))) = found.token {
            if stored.is_live(now) && grant.covers(workspace) {
                self.last_used.touch(&stored.sha256, now);
                let name = stored
                    .name
                    .unwrap_or_else(|| crate::tokens::id_of(&stored.sha256));
                return Some(Credential::Token {
                    name,
                    scope: grant.scope,
                    include_sensitive: grant.include_sensitive,
                });
            }
            return None;
        }
        // A secret no bearer could be needs no derivation: the test depends on the
        // secret alone, never on the workspace.
        if !found.outputs || secret.len() != crate::crypto::BEARER_LEN {
            return None;
        }
        // Exactly MAX_CONSUMERS bearers are derived and compared, whatever the number
        // of consumers (none for a missing workspace) and which one matches: the work,
        // and so the time of a 401, does not tell whether the workspace exists or how
        // many consumers it names. The padding's name is empty, which no workspace is.
        let mut consumer = None;
        let mut named = found.consumers.into_iter();
        for _ in 0..credentials::MAX_CONSUMERS {
            let (name, generation) = named.next().unwrap_or_default();
            let theirs = self.root.workspace_bearer_at(&name, generation);
            let equal = crate::crypto::secrets_equal(secret, theirs.as_bytes());
            if equal && !name.is_empty() {
                consumer = Some(Credential::Consumer { workspace: name });
            }
        }
        consumer
    }
}
