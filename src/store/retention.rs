//! Retention: pruning old versions and sweeping garbage blobs, for every scope.
//!
//! Policy (per scope): keep the newest `keep_versions` versions plus every version
//! created within the last `keep_days`; the newest version of a scope is never pruned
//! (it is the current state or tombstone, and it keeps the version counter moving
//! forward so a version number is never reused).
//!
//! Order of deletion: the version row first (committed), then its blob. A blob
//! without a row is garbage that the sweep removes later; a row without its blob
//! would be an error on read, so it is never created here.
//!
//! The sweep deletes blobs under `states/` that no row references and whose header
//! says they were written more than [`GARBAGE_MIN_AGE`] ago: a write puts its blob
//! before it commits the row, so a young unreferenced blob may be a write in flight.

use std::collections::HashSet;

use serde::Serialize;
use time::{Duration, OffsetDateTime};

use super::audit::{insert_audit, AuditEntry};
use super::{format, StateStore, StoreError, STATES_PREFIX};
use crate::config::RetentionConfig;

/// How many versions and days of history to keep per scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub keep_versions: u64,
    pub keep_days: u64,
}

impl Retention {
    pub fn from_config(config: &RetentionConfig) -> Self {
        Retention {
            keep_versions: config.keep_versions,
            keep_days: config.keep_days,
        }
    }
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            keep_versions: 100,
            keep_days: 30,
        }
    }
}

/// An unreferenced blob younger than this may belong to a write in flight.
pub const GARBAGE_MIN_AGE: Duration = Duration::hours(1);

/// Audit event written (per scope, with the pruning) when versions are pruned.
pub const EVENT_PRUNED: &str = "store.pruned";

pub fn parse_time(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()
}

/// The versions of one scope the policy lets go, ascending. `rows` is every
/// `(version, created_at)` of the scope in any order; a version whose time is unknown
/// (`None`) is kept. Pure, so the policy is testable with any `now`.
pub fn select_prunable(
    rows: &[(i64, Option<OffsetDateTime>)],
    policy: Retention,
    now: OffsetDateTime,
) -> Vec<i64> {
    let mut newest_first = rows.to_vec();
    newest_first.sort_by_key(|row| std::cmp::Reverse(row.0));
    // A window too large to represent keeps everything.
    let days = i64::try_from(policy.keep_days).unwrap_or(i64::MAX);
    let cutoff = days
        .checked_mul(86_400)
        .and_then(|secs| now.checked_sub(Duration::seconds(secs)));
    let Some(cutoff) = cutoff else {
        return Vec::new();
    };
    let mut out: Vec<i64> = newest_first
        .iter()
        .enumerate()
        .filter(|(rank, (_, created))| {
            let protected_by_count = *rank == 0 || (*rank as u64) < policy.keep_versions;
            // Inside the window (or in the future, or unknown): kept.
            let old = matches!(created, Some(t) if *t < cutoff);
            !protected_by_count && old
        })
        .map(|(_, (version, _))| *version)
        .collect();
    out.sort_unstable();
    out
}

/// One pruned (or, in a dry run, prunable) version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrunedVersion {
    pub scope: String,
    pub version: i64,
    pub created_at: String,
    /// `None` for a tombstone.
    pub blob_key: Option<String>,
}

#[derive(Debug, Default)]
pub struct PruneReport {
    pub pruned: Vec<PrunedVersion>,
    /// Blobs whose rows were deleted but which could not be deleted themselves:
    /// harmless garbage, removed by a later sweep.
    pub blob_errors: Vec<String>,
}

/// An unreferenced blob the sweep removed (or would remove, in a dry run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GarbageBlob {
    pub key: String,
    pub scope: String,
    pub version: i64,
    pub created_at: String,
}

#[derive(Debug, Default)]
pub struct SweepReport {
    pub swept: Vec<GarbageBlob>,
    /// Unreferenced but younger than the minimum age (possibly a write in flight).
    pub young: usize,
    /// Unreferenced objects under `states/` that are not readable stategate blobs
    /// (or carry no parsable time): reported, never deleted.
    pub unrecognized: Vec<String>,
    pub errors: Vec<String>,
}

/// The prunable versions of `scope` as the index says right now.
fn prunable_in(
    conn: &crate::store::sql::Connection,
    scope: &str,
    policy: Retention,
    now: OffsetDateTime,
) -> Result<Vec<PrunedVersion>, crate::store::sql::Error> {
    let mut stmt =
        conn.prepare("SELECT version, created_at, blob_key FROM versions WHERE scope = ?1")?;
    let rows = stmt
        .query_map([scope], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let times: Vec<(i64, Option<OffsetDateTime>)> =
        rows.iter().map(|(v, t, _)| (*v, parse_time(t))).collect();
    let victims: HashSet<i64> = select_prunable(&times, policy, now).into_iter().collect();
    let mut out: Vec<PrunedVersion> = rows
        .into_iter()
        .filter(|(v, _, _)| victims.contains(v))
        .map(|(version, created_at, blob_key)| PrunedVersion {
            scope: scope.to_string(),
            version,
            created_at,
            blob_key,
        })
        .collect();
    out.sort_by_key(|p| p.version);
    Ok(out)
}

impl StateStore {
    /// Applies the retention policy to every scope. With `dry_run`, only reports.
    pub async fn prune(
        &self,
        policy: Retention,
        now: OffsetDateTime,
        dry_run: bool,
    ) -> Result<PruneReport, StoreError> {
        // Only a scope with more than one version can lose any (the newest is kept).
        let scopes: Vec<String> = self
            .db
            .read(|c| {
                let mut stmt = c.prepare(
                    "SELECT scope FROM versions GROUP BY scope HAVING count(*) > 1 ORDER BY scope",
                )?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                rows.collect()
            })
            .await?;
        let mut report = PruneReport::default();
        for scope in scopes {
            let victims = if dry_run {
                let scope = scope.clone();
                self.db
                    .read(move |c| prunable_in(c, &scope, policy, now))
                    .await?
            } else {
                // Selected again inside the write transaction, so the decision and the
                // deletion see the same rows.
                let scope = scope.clone();
                self.db
                    .write(move |c| -> Result<Vec<PrunedVersion>, StoreError> {
                        let victims = prunable_in(c, &scope, policy, now)?;
                        if victims.is_empty() {
                            return Ok(victims);
                        }
                        let mut delete =
                            c.prepare("DELETE FROM versions WHERE scope = ?1 AND version = ?2")?;
                        for v in &victims {
                            delete.execute(crate::store::sql::params![scope, v.version])?;
                        }
                        insert_audit(
                            c,
                            &AuditEntry::new(
                                "stategate:retention",
                                scope.clone(),
                                EVENT_PRUNED,
                                serde_json::json!({
                                    "count": victims.len(),
                                    "oldest_version": victims.first().map(|v| v.version),
                                    "newest_version": victims.last().map(|v| v.version),
                                    "keep_versions": policy.keep_versions,
                                    "keep_days": policy.keep_days,
                                }),
                            ),
                        )?;
                        Ok(victims)
                    })
                    .await?
            };
            if !dry_run {
                // The rows are committed: only now may the blobs go.
                for key in victims.iter().filter_map(|v| v.blob_key.as_deref()) {
                    if let Err(e) = self.blobs.delete(key).await {
                        tracing::warn!(blob = key, error = %e, "pruned version's blob not deleted; the sweep will remove it");
                        report.blob_errors.push(format!("{key}: {e}"));
                    }
                }
            }
            report.pruned.extend(victims);
        }
        Ok(report)
    }

    /// Deletes blobs under `states/` that no version row references and that were
    /// written at least `min_age` before `now`. With `dry_run`, only reports.
    pub async fn sweep_garbage(
        &self,
        now: OffsetDateTime,
        min_age: Duration,
        dry_run: bool,
    ) -> Result<SweepReport, StoreError> {
        // List first, then read the index: a blob committed in between is in both; one
        // put but not yet committed is unreferenced but young, so the age rule keeps it.
        let keys = self.blobs.list(STATES_PREFIX).await?;
        let referenced: HashSet<String> = self
            .db
            .read(|c| {
                let mut stmt =
                    c.prepare("SELECT blob_key FROM versions WHERE blob_key IS NOT NULL")?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                rows.collect()
            })
            .await?;
        let mut report = SweepReport::default();
        for key in keys.into_iter().filter(|k| !referenced.contains(k)) {
            // Orphans are rare (a crash or failed commit), so reading each whole is fine.
            let Some(blob) = self.blobs.get(&key).await? else {
                continue; // deleted meanwhile
            };
            let header = match format::read_header(&blob) {
                Ok(header) => header,
                Err(_) => {
                    report.unrecognized.push(key);
                    continue;
                }
            };
            match parse_time(&header.created_at) {
                Some(created) if now - created >= min_age => {}
                Some(_) => {
                    report.young += 1;
                    continue;
                }
                None => {
                    report.unrecognized.push(key);
                    continue;
                }
            }
            if !dry_run {
                if let Err(e) = self.blobs.delete(&key).await {
                    report.errors.push(format!("{key}: {e}"));
                    continue;
                }
            }
            report.swept.push(GarbageBlob {
                key,
                scope: header.scope,
                version: header.version,
                created_at: header.created_at,
            });
        }
        Ok(report)
    }

    /// One retention pass: prune, then look for garbage blobs. Unreferenced blobs are
    /// deleted only with `sweep`: a readable blob that no row references is usually a
    /// crash orphan, but after the database was restored from an older backup it is a
    /// committed version the index has forgotten, and the only copy of it. So the
    /// automatic pass only reports them; an operator sweeps after checking.
    pub async fn run_retention(
        &self,
        policy: Retention,
        now: OffsetDateTime,
        dry_run: bool,
        sweep: bool,
    ) -> Result<(PruneReport, SweepReport), StoreError> {
        let pruned = self.prune(policy, now, dry_run).await?;
        let swept = self
            .sweep_garbage(now, GARBAGE_MIN_AGE, dry_run || !sweep)
            .await?;
        Ok((pruned, swept))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const NOW: OffsetDateTime = datetime!(2026-06-01 12:00 UTC);

    fn days_ago(d: i64) -> Option<OffsetDateTime> {
        Some(NOW - Duration::days(d))
    }

    #[test]
    fn selection_follows_the_policy() {
        struct Case {
            name: &'static str,
            keep_versions: u64,
            keep_days: u64,
            rows: Vec<(i64, Option<OffsetDateTime>)>,
            pruned: Vec<i64>,
        }
        // versions 1..=n created n-1 .. 0 days ago (version n is from today)
        let daily = |n: i64| -> Vec<(i64, Option<OffsetDateTime>)> {
            (1..=n).map(|v| (v, days_ago(n - v))).collect()
        };
        let cases = vec![
            Case {
                name: "empty scope",
                keep_versions: 2,
                keep_days: 1,
                rows: vec![],
                pruned: vec![],
            },
            Case {
                name: "a single ancient version is the newest: kept",
                keep_versions: 0,
                keep_days: 0,
                rows: vec![(7, days_ago(5000))],
                pruned: vec![],
            },
            Case {
                name: "count and window both protect",
                keep_versions: 3,
                keep_days: 5,
                rows: daily(10), // v10..v8 by count, v10..v5 by days (v5 is exactly 5 days old)
                pruned: vec![1, 2, 3, 4],
            },
            Case {
                name: "window boundary is inclusive (exactly keep_days old is kept)",
                keep_versions: 1,
                keep_days: 3,
                rows: vec![(1, days_ago(4)), (2, days_ago(3)), (3, days_ago(0))],
                pruned: vec![1],
            },
            Case {
                name: "count protects old versions outside the window",
                keep_versions: 4,
                keep_days: 1,
                rows: vec![
                    (1, days_ago(90)),
                    (2, days_ago(80)),
                    (3, days_ago(70)),
                    (4, days_ago(60)),
                    (5, days_ago(50)),
                ],
                pruned: vec![1],
            },
            Case {
                name: "window protects beyond the count",
                keep_versions: 1,
                keep_days: 30,
                rows: vec![(1, days_ago(31)), (2, days_ago(29)), (3, days_ago(1))],
                pruned: vec![1],
            },
            Case {
                name: "keep nothing: everything but the newest goes",
                keep_versions: 0,
                keep_days: 0,
                rows: vec![(1, days_ago(2)), (2, days_ago(1)), (3, days_ago(1))],
                pruned: vec![1, 2],
            },
            Case {
                name: "unknown times and future times are kept",
                keep_versions: 0,
                keep_days: 1,
                rows: vec![
                    (1, None),
                    (2, Some(NOW + Duration::days(3))),
                    (3, days_ago(9)),
                    (4, days_ago(9)),
                ],
                pruned: vec![3],
            },
            Case {
                name: "input order does not matter; the newest is by version number",
                keep_versions: 1,
                keep_days: 0,
                rows: vec![(3, days_ago(50)), (1, days_ago(10)), (2, days_ago(20))],
                pruned: vec![1, 2],
            },
            Case {
                name: "huge windows keep everything",
                keep_versions: 0,
                keep_days: u64::MAX,
                rows: daily(3),
                pruned: vec![],
            },
            Case {
                name: "default policy on 150 daily versions",
                keep_versions: 100,
                keep_days: 30,
                rows: daily(150),
                pruned: (1..=50).collect(),
            },
        ];
        for case in cases {
            let policy = Retention {
                keep_versions: case.keep_versions,
                keep_days: case.keep_days,
            };
            assert_eq!(
                select_prunable(&case.rows, policy, NOW),
                case.pruned,
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn the_configured_policy() {
        let config = RetentionConfig {
            keep_versions: 5,
            keep_days: 2,
            interval_seconds: 0,
        };
        assert_eq!(
            Retention::from_config(&config),
            Retention {
                keep_versions: 5,
                keep_days: 2
            }
        );
        // The unconfigured defaults agree.
        assert_eq!(
            Retention::from_config(&RetentionConfig::default()),
            Retention::default()
        );
    }

    #[test]
    fn times_parse_as_the_engine_writes_them() {
        let t = parse_time(&crate::store::now_rfc3339()).unwrap();
        assert!((OffsetDateTime::now_utc() - t).abs() < Duration::minutes(1));
        assert_eq!(parse_time("yesterday"), None);
    }
}
