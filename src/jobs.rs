//! Claims on background jobs, so that nodes sharing one index run each job's pass on
//! one node at a time (retention, the stale-lock and freeze pass, the drift schedule
//! and its tidying).
//!
//! A claim is a row of `job_claims` (owned here): the job, the node holding it and
//! until when. A node takes a job's claim before each pass when nobody holds it, when
//! the holder's time ran out (its node died or stalled), or when it is its own; it
//! holds it for longer than a pass's interval, so the node that ran the last pass keeps
//! running them while it lives, and another takes over within one claim's time of its
//! death. With SQLite there is one node and it always gets the claim (one small write
//! per pass).
//!
//! *Invariant:* a claim is taken in one statement inside the writer's transaction
//! (on PostgreSQL, under the index's write lock): two nodes never both hold one.

use std::time::Duration;

use crate::store::sql::{params, Connection, OptionalExtension};
use crate::store::{Db, DbError};

/// The table; `crate::schema` applies it.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS job_claims (
    job         TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,    -- the node (`Claims::holder`)
    until_unix  INTEGER NOT NULL  -- the claim lapses at this time (unix seconds)
) WITHOUT ROWID;
"#;

/// Takes `job`'s claim for `holder` until `until` when it is free, lapsed at `now`,
/// or already `holder`'s. Whether `holder` holds it now.
pub fn take(
    conn: &Connection,
    job: &str,
    holder: &str,
    now: i64,
    until: i64,
) -> Result<bool, crate::store::sql::Error> {
    let held: Option<String> = conn
        .prepare_cached(
            "INSERT INTO job_claims (job, holder, until_unix) VALUES (?1, ?2, ?3)
             ON CONFLICT (job) DO UPDATE SET holder = excluded.holder, until_unix = excluded.until_unix
              WHERE job_claims.holder = excluded.holder OR job_claims.until_unix <= ?4
             RETURNING holder",
        )?
        .query_row(params![job, holder, until, now], |r| r.get(0))
        .optional()?;
    Ok(held.is_some())
}

/// Who holds each job's claim and until when (`stategate`'s status pages and tests).
pub fn holders(conn: &Connection) -> Result<Vec<(String, String, i64)>, crate::store::sql::Error> {
    conn.prepare("SELECT job, holder, until_unix FROM job_claims ORDER BY job")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect()
}

/// This node's claims on the index it shares.
#[derive(Clone)]
pub struct Claims {
    db: Db,
    holder: String,
}

impl Claims {
    /// `holder` names this node in the table: its host and a random part, new at every
    /// start (a restarted node waits for its old claims to lapse like any other).
    pub(crate) fn new(db: Db) -> Self {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty() && h.len() <= 64)
            .unwrap_or_else(|| "node".into());
        let holder = format!("{host}/{}", uuid::Uuid::new_v4().simple());
        Claims { db, holder }
    }

    /// This node's claims on `store`'s index.
    pub fn of(store: &crate::store::StateStore) -> Self {
        Claims::new(store.index_handle())
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Whether this node should run `job`'s pass now, holding its claim for `hold`
    /// (longer than the pass's interval). A failure to reach the index is "no": the
    /// pass would fail there too, and runs when the index answers again.
    pub async fn take(&self, job: &'static str, hold: Duration) -> bool {
        if crate::tokens::clock_distrusted().is_some() {
            // A claim's end is judged by clocks: not by one the others do not share.
            return false;
        }
        let holder = self.holder.clone();
        let now = crate::tokens::now();
        let until = now.saturating_add(i64::try_from(hold.as_secs()).unwrap_or(i64::MAX));
        match self
            .db
            .write(move |c| -> Result<bool, DbError> { Ok(take(c, job, &holder, now, until)?) })
            .await
        {
            Ok(taken) => {
                if !taken {
                    tracing::debug!(
                        job,
                        "another node holds this job's claim; this pass is skipped"
                    );
                }
                taken
            }
            Err(e) => {
                tracing::warn!(job, error = %e, "cannot take the job's claim; the pass is skipped");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_held_by_one_node_until_it_lapses() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        // (holder, now, until, taken)
        let steps: &[(&str, i64, i64, bool)] = &[
            ("a", 100, 160, true),  // free
            ("b", 120, 180, false), // a holds it
            ("a", 150, 210, true),  // a renews
            ("b", 209, 269, false), // still a's
            ("b", 210, 270, true),  // a's lapsed: b takes over
            ("a", 220, 280, false), // a is back, b holds it
        ];
        for (i, (holder, now, until, taken)) in steps.iter().enumerate() {
            assert_eq!(
                take(&conn, "retention", holder, *now, *until).unwrap(),
                *taken,
                "step {i}"
            );
        }
        assert_eq!(
            holders(&conn).unwrap(),
            [("retention".to_string(), "b".to_string(), 270)]
        );
        assert!(
            take(&conn, "drift", "a", 220, 280).unwrap(),
            "claims are per job"
        );
    }
}
