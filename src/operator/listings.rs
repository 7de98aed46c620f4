//! The listings that read the index alone: a workspace's versions, its resource
//! timeline and the audit log. One code path for the CLI, which opens only the index
//! for them (so they answer while the blob store is down, and need no key), and for
//! [`super::Operations`] (the admin API and the web UI). Each takes the caller's grant
//! and shows only what it sees, other workspaces' names redacted.

use crate::error::Error;
use crate::names::validate_workspace;
use crate::store::audit::{list_audit_filtered, AuditFilter, AuditRow};
use crate::store::history::history_rows;
use crate::store::timeline::{timeline_rows, TimelineRow, MAX_TIMELINE_ROWS};
use crate::store::{latest_row, Db, VersionRow};

use super::roles::Grant;
use super::{
    audit_scope, check_address, redact, MAX_AUDIT_LIMIT, MAX_AUDIT_SCANNED, MAX_EVENT_KINDS,
};

/// The read-only listings over one installation's index.
#[derive(Clone)]
pub struct Listings {
    db: Db,
}

impl Listings {
    pub fn new(db: Db) -> Self {
        Listings { db }
    }

    /// The resource timeline of `workspace`: which versions added, changed or removed
    /// `address` (its instances and, for a module, what it holds) or any address,
    /// newest first, at most `limit` rows, with who wrote each. An address that is
    /// empty, longer than any stored one or not printable is refused (400); a workspace
    /// with no version is not found.
    pub async fn timeline(
        &self,
        workspace: &str,
        address: Option<&str>,
        limit: u32,
        grant: &Grant,
    ) -> Result<Vec<TimelineRow>, Error> {
        validate_workspace(workspace)?;
        if let Some(address) = address {
            check_address(address)?;
        }
        if limit == 0 || limit > MAX_TIMELINE_ROWS {
            return Err(Error::Invalid(format!(
                "limit must be 1-{MAX_TIMELINE_ROWS}"
            )));
        }
        let scope = crate::tofu::scope(workspace);
        let latest = {
            let scope = scope.clone();
            self.db.read_quick(move |c| latest_row(c, &scope)).await?
        };
        if latest.is_none() {
            return Err(Error::NotFound(format!(
                "workspace {workspace:?} has no versions"
            )));
        }
        let address = address.map(str::to_string);
        let mut rows = self
            .db
            .read(move |c| timeline_rows(c, &scope, address.as_deref(), limit))
            .await?;
        for row in &mut rows {
            redact::timeline_row(row, grant);
        }
        Ok(rows)
    }

    /// The versions of `workspace`, newest first (at most `limit`); a workspace with
    /// no version is not found.
    pub async fn history(
        &self,
        workspace: &str,
        limit: Option<u32>,
        grant: &Grant,
    ) -> Result<Vec<VersionRow>, Error> {
        validate_workspace(workspace)?;
        let scope = crate::tofu::scope(workspace);
        let mut rows = self
            .db
            .read(move |c| history_rows(c, &scope, limit))
            .await?;
        if rows.is_empty() {
            return Err(Error::NotFound(format!(
                "workspace {workspace:?} has no versions"
            )));
        }
        for row in &mut rows {
            redact::write_facts(&mut row.facts, grant);
        }
        Ok(rows)
    }

    /// Audit rows, newest first. An operator limited to workspace patterns sees only
    /// the rows of the workspaces it sees (`tf/<ws>`), nothing site-wide, and in them
    /// no other workspace's name (`redact::audit_row`); the log is read page by page
    /// until `limit` such rows are found or [`MAX_AUDIT_SCANNED`] rows were read (then
    /// the page is short).
    pub async fn audit(
        &self,
        filter: AuditFilter,
        limit: u32,
        grant: &Grant,
    ) -> Result<Vec<AuditRow>, Error> {
        let mut rows = self.audit_rows(filter, limit, grant).await?;
        for row in &mut rows {
            redact::audit_row(row, grant);
        }
        Ok(rows)
    }

    /// [`Self::audit`]'s rows as stored.
    async fn audit_rows(
        &self,
        filter: AuditFilter,
        limit: u32,
        grant: &Grant,
    ) -> Result<Vec<AuditRow>, Error> {
        if !(1..=MAX_AUDIT_LIMIT).contains(&limit) {
            return Err(Error::Invalid(format!("limit must be 1-{MAX_AUDIT_LIMIT}")));
        }
        let mut filter = filter;
        filter.scope = filter.scope.as_deref().map(audit_scope);
        // An event filter no kind in the log answers to would walk the whole log for
        // nothing (without a scope, the listing reads it by id): answer at once.
        if let Some(wanted) = filter.event.clone() {
            let kinds = self.audit_event_kinds().await?;
            let complete = kinds.len() < MAX_EVENT_KINDS as usize;
            if complete
                && !kinds
                    .iter()
                    .any(|k| crate::store::audit::event_matches(k, &wanted))
            {
                return Ok(Vec::new());
            }
        }
        if !grant.is_limited() {
            return Ok(self
                .db
                .read(move |c| list_audit_filtered(c, &filter, limit))
                .await?);
        }
        let grant = grant.clone();
        Ok(self
            .db
            .read(
                move |c| -> Result<Vec<AuditRow>, crate::store::sql::Error> {
                    let visible = |row: &AuditRow| {
                        row.scope
                            .strip_prefix(crate::tofu::SCOPE_PREFIX)
                            .is_some_and(|w| grant.sees(w))
                    };
                    // Each page comes oldest first, like the listing itself; `out` is
                    // newest first until the end.
                    let mut filter = filter.clone();
                    let (mut out, mut scanned) = (Vec::new(), 0u32);
                    while scanned < MAX_AUDIT_SCANNED {
                        let page = list_audit_filtered(c, &filter, MAX_AUDIT_LIMIT)?;
                        let Some(oldest) = page.first().map(|r| r.id) else {
                            break;
                        };
                        scanned += page.len() as u32;
                        let full = page.len() == MAX_AUDIT_LIMIT as usize;
                        out.extend(page.into_iter().rev().filter(visible));
                        if out.len() >= limit as usize || !full {
                            break;
                        }
                        filter.before_id = Some(oldest);
                    }
                    out.truncate(limit as usize);
                    out.reverse();
                    Ok(out)
                },
            )
            .await?)
    }

    /// The event kinds in the audit log, by name (at most [`MAX_EVENT_KINDS`]): the
    /// audit page's choices. Names only, the same for every operator.
    pub async fn audit_event_kinds(&self) -> Result<Vec<String>, Error> {
        Ok(self
            .db
            .read(|c| crate::store::audit::event_kinds(c, MAX_EVENT_KINDS))
            .await?)
    }
}
