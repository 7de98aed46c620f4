//! Per-cluster advisory leases: one row per held lock in `cluster_leases`.
//!
//! A lease is held by a principal; the holder refreshes it with a heartbeat. A lease
//! whose heartbeat is older than the stale threshold may be taken over by another
//! admin's acquire. The decisions are pure functions over the current row and the
//! clock's `now`; the SQL around them always runs inside one write transaction.

use crate::store::sql::{params, Connection, OptionalExtension};
use serde::Deserialize;

use super::clock::rfc3339;
use crate::error::Error;

/// Largest lock request body accepted.
pub const MAX_LOCK_BODY: u64 = 16 * 1024;
/// Longest `host` accepted (display only).
const MAX_HOST_LEN: usize = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    Provision,
    Deprovision,
    StatePush,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Provision => "provision",
            Operation::Deprovision => "deprovision",
            Operation::StatePush => "state-push",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRequest {
    pub operation: Operation,
    pub host: String,
}

#[derive(Deserialize)]
struct LockBody {
    operation: serde_json::Value,
    host: String,
}

/// `{"operation": "provision" | "deprovision" | "state-push", "host": "<hostname>"}`.
/// Unknown extra fields are ignored (a newer CLI may send more).
pub fn parse_lock_request(body: &[u8]) -> Result<LockRequest, Error> {
    let bad = |why: String| Error::Invalid(format!("invalid lock request: {why}"));
    let parsed: LockBody = serde_json::from_slice(body).map_err(|e| {
        bad(format!(
            "expected JSON {{\"operation\": \"provision\" | \"deprovision\" | \"state-push\", \"host\": \"<hostname>\"}} ({e})"
        ))
    })?;
    let operation =
        serde_json::from_value::<Operation>(parsed.operation.clone()).map_err(|_| {
            bad(format!(
                "unknown operation {}; expected \"provision\", \"deprovision\" or \"state-push\"",
                truncate(&parsed.operation.to_string(), 64)
            ))
        })?;
    if parsed.host.len() > MAX_HOST_LEN || parsed.host.chars().any(char::is_control) {
        return Err(bad(format!(
            "\"host\" must be at most {MAX_HOST_LEN} bytes without control characters"
        )));
    }
    Ok(LockRequest {
        operation,
        host: parsed.host,
    })
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A held lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub holder_id: i64,
    pub holder_email: String,
    pub operation: String,
    pub host: String,
    /// Unix seconds.
    pub acquired_at: i64,
    pub heartbeat_at: i64,
}

impl Lease {
    /// Seconds since the last heartbeat (never negative, even if the clock stepped back).
    pub fn heartbeat_age(&self, now: i64) -> i64 {
        (now - self.heartbeat_at).max(0)
    }

    /// Stale = no heartbeat for strictly longer than `stale_after` seconds.
    pub fn is_stale(&self, now: i64, stale_after: i64) -> bool {
        self.heartbeat_age(now) > stale_after
    }

    /// The holder as the API shows it to other callers (and as audit payloads record it).
    pub fn holder_json(&self, now: i64) -> serde_json::Value {
        serde_json::json!({
            "holder_email": self.holder_email,
            "operation": self.operation,
            "host": self.host,
            "acquired_at": rfc3339(self.acquired_at),
            "heartbeat_age_seconds": self.heartbeat_age(now),
        })
    }
}

/// A refusal naming the current holder (409 with [`Lease::holder_json`] and `error`).
pub fn held_by_other(lease: &Lease, now: i64, what: &str) -> Error {
    let message = format!(
        "{what}: the cluster's state lock is held by {} ({} from {}, last heartbeat {}s ago)",
        lease.holder_email,
        lease.operation,
        if lease.host.is_empty() {
            "?"
        } else {
            &lease.host
        },
        lease.heartbeat_age(now)
    );
    Error::LeaseHeld {
        message,
        holder: lease.holder_json(now),
    }
}

/// What an acquire does, given the current lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// Nobody holds it.
    Take,
    /// The caller already holds it: refresh the timestamps.
    Refresh,
    /// Someone else holds it but has not heartbeated within the threshold.
    Steal,
    /// Someone else holds it and is alive.
    Refuse,
}

pub fn decide_acquire(
    current: Option<&Lease>,
    caller_id: i64,
    now: i64,
    stale_after: i64,
) -> Acquire {
    match current {
        None => Acquire::Take,
        Some(lease) if lease.holder_id == caller_id => Acquire::Refresh,
        Some(lease) if lease.is_stale(now, stale_after) => Acquire::Steal,
        Some(_) => Acquire::Refuse,
    }
}

/// What a release does, given the current lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Nothing held: nothing to do (idempotent 200).
    Nothing,
    /// The caller's own lease (or any lease, when forced): delete it.
    Delete,
    /// Another caller's lease, not forced: 409.
    Refuse,
}

pub fn decide_release(current: Option<&Lease>, caller_id: i64, force: bool) -> Release {
    match current {
        None => Release::Nothing,
        Some(_) if force => Release::Delete,
        Some(lease) if lease.holder_id == caller_id => Release::Delete,
        Some(_) => Release::Refuse,
    }
}

pub fn current_lease(
    conn: &Connection,
    cluster_id: &str,
) -> Result<Option<Lease>, crate::store::sql::Error> {
    conn.query_row(
        "SELECT l.holder_id, p.email, l.operation, l.host, l.acquired_at, l.heartbeat_at
           FROM cluster_leases l JOIN principals p ON p.id = l.holder_id
          WHERE l.cluster_id = ?1",
        [cluster_id],
        |r| {
            Ok(Lease {
                holder_id: r.get(0)?,
                holder_email: r.get(1)?,
                operation: r.get(2)?,
                host: r.get(3)?,
                acquired_at: r.get(4)?,
                heartbeat_at: r.get(5)?,
            })
        },
    )
    .optional()
}

/// Takes (or retakes) the lease for `holder_id`, both timestamps set to `now`.
pub fn put_lease(
    conn: &Connection,
    cluster_id: &str,
    holder_id: i64,
    request: &LockRequest,
    now: i64,
) -> Result<(), crate::store::sql::Error> {
    conn.execute(
        "INSERT INTO cluster_leases (cluster_id, holder_id, operation, host, acquired_at, heartbeat_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5)
         ON CONFLICT (cluster_id) DO UPDATE SET holder_id = ?2, operation = ?3, host = ?4,
             acquired_at = ?5, heartbeat_at = ?5",
        params![cluster_id, holder_id, request.operation.as_str(), request.host, now],
    )?;
    Ok(())
}

pub fn touch_lease(
    conn: &Connection,
    cluster_id: &str,
    now: i64,
) -> Result<(), crate::store::sql::Error> {
    conn.execute(
        "UPDATE cluster_leases SET heartbeat_at = ?2 WHERE cluster_id = ?1",
        params![cluster_id, now],
    )?;
    Ok(())
}

pub fn delete_lease(conn: &Connection, cluster_id: &str) -> Result<(), crate::store::sql::Error> {
    conn.execute(
        "DELETE FROM cluster_leases WHERE cluster_id = ?1",
        [cluster_id],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: i64, heartbeat_at: i64) -> Lease {
        Lease {
            holder_id: holder,
            holder_email: format!("u{holder}@x"),
            operation: "provision".into(),
            host: "h".into(),
            acquired_at: 0,
            heartbeat_at,
        }
    }

    #[test]
    fn acquire_decisions() {
        // (current lease: holder, heartbeat_at), caller, now, expected; stale after 300 s.
        type Row = (Option<(i64, i64)>, i64, i64, Acquire);
        let table: &[Row] = &[
            (None, 1, 1000, Acquire::Take),
            (Some((1, 1000)), 1, 1000, Acquire::Refresh),
            (Some((1, 0)), 1, 100_000, Acquire::Refresh), // own stale lease: still ours
            (Some((2, 1000)), 1, 1000, Acquire::Refuse),
            (Some((2, 1000)), 1, 1300, Acquire::Refuse), // exactly 300 s: not yet stale
            (Some((2, 1000)), 1, 1301, Acquire::Steal),
            (Some((2, 1000)), 1, 900, Acquire::Refuse), // clock stepped back: age 0
        ];
        for (current, caller, now, expected) in table {
            let current = current.map(|(h, hb)| lease(h, hb));
            assert_eq!(
                decide_acquire(current.as_ref(), *caller, *now, 300),
                *expected,
                "{current:?} caller {caller} at {now}"
            );
        }
    }

    #[test]
    fn release_decisions() {
        let table: &[(Option<i64>, i64, bool, Release)] = &[
            (None, 1, false, Release::Nothing),
            (None, 1, true, Release::Nothing),
            (Some(1), 1, false, Release::Delete),
            (Some(2), 1, false, Release::Refuse),
            (Some(2), 1, true, Release::Delete),
            (Some(1), 1, true, Release::Delete),
        ];
        for (holder, caller, force, expected) in table {
            let current = holder.map(|h| lease(h, 0));
            assert_eq!(decide_release(current.as_ref(), *caller, *force), *expected);
        }
    }

    #[test]
    fn lock_requests() {
        let ok: &[(&str, Operation, &str)] = &[
            (
                r#"{"operation":"provision","host":"a"}"#,
                Operation::Provision,
                "a",
            ),
            (
                r#"{"operation":"deprovision","host":""}"#,
                Operation::Deprovision,
                "",
            ),
            (
                r#"{"host":"box.lan","operation":"state-push","extra":1}"#,
                Operation::StatePush,
                "box.lan",
            ),
        ];
        for (body, op, host) in ok {
            assert_eq!(
                parse_lock_request(body.as_bytes()).unwrap(),
                LockRequest {
                    operation: *op,
                    host: host.to_string()
                }
            );
        }
        let long_host = format!(
            r#"{{"operation":"provision","host":"{}"}}"#,
            "h".repeat(256)
        );
        let bad: &[(&str, &str)] = &[
            ("", "expected JSON"),
            ("not json", "expected JSON"),
            ("[]", "expected JSON"),
            (r#"{"operation":"provision"}"#, "expected JSON"),
            (r#"{"host":"a"}"#, "expected JSON"),
            (
                r#"{"operation":"apply","host":"a"}"#,
                "unknown operation \"apply\"",
            ),
            (
                r#"{"operation":"Provision","host":"a"}"#,
                "unknown operation",
            ),
            (r#"{"operation":7,"host":"a"}"#, "unknown operation 7"),
            (r#"{"operation":"provision","host":7}"#, "expected JSON"),
            (r#"{"operation":"provision","host":"a\u0007"}"#, "control"),
            (&long_host, "at most 255"),
        ];
        for (body, needle) in bad {
            let err = parse_lock_request(body.as_bytes()).unwrap_err();
            assert!(matches!(err, Error::Invalid(_)), "{body}");
            assert!(err.to_string().contains(needle), "{body}: {err}");
        }
    }

    #[test]
    fn holder_body() {
        let l = Lease {
            holder_id: 1,
            holder_email: "a@x".into(),
            operation: "provision".into(),
            host: "box".into(),
            acquired_at: 1_767_225_600,
            heartbeat_at: 1_767_225_660,
        };
        let err = held_by_other(&l, 1_767_225_700, "cannot lock");
        let Error::LeaseHeld { message, holder } = err else {
            panic!("not a held lease: {err:?}");
        };
        assert_eq!(holder["holder_email"], "a@x");
        assert_eq!(holder["operation"], "provision");
        assert_eq!(holder["host"], "box");
        assert_eq!(holder["acquired_at"], "2026-01-01T00:00:00Z");
        assert_eq!(holder["heartbeat_age_seconds"], 40);
        assert!(message.starts_with("cannot lock: "));
    }
}
