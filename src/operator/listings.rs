//! The listings that read the index alone: a workspace's versions and its resource
//! timeline. One code path for the CLI, which opens only the index for them (so they
//! answer while the blob store is down, and need no key), and for [`super::Operations`]
//! (the admin API and the web UI). Each takes the caller's grant and names the
//! workspaces a move went to or came from as that grant sees them.

use crate::error::Error;
use crate::names::validate_workspace;
use crate::store::history::history_rows;
use crate::store::timeline::{timeline_rows, TimelineRow, MAX_TIMELINE_ROWS};
use crate::store::{latest_row, Db, VersionRow};

use super::roles::Grant;
use super::{check_address, redact};

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
}
