//! The node's one clock, on the ground floor: every judgement of time (expiry, idle
//! time, audit and version times, backup ages) reads it here, so a test that shifts it
//! (a node whose clock stepped) moves all of them, and the clock check of a node
//! sharing a PostgreSQL index can make every expiry-dependent judgement refuse while
//! this clock is not trusted.

use std::sync::atomic::{AtomicI64, Ordering};

/// What a test adds to this process's clock (0 otherwise): a node whose clock stepped.
static SHIFT_MS: AtomicI64 = AtomicI64::new(0);

/// Now, as a time.
pub fn now_utc() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc() + time::Duration::milliseconds(SHIFT_MS.load(Ordering::Relaxed))
}

/// Now, in unix seconds.
pub fn now() -> i64 {
    now_ms().div_euclid(1000)
}

/// Now, in unix milliseconds.
pub fn now_ms() -> i64 {
    i64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000)
        .unwrap_or(i64::MAX)
        .saturating_add(SHIFT_MS.load(Ordering::Relaxed))
}

/// Shifts this process's clock by `ms`, as a clock step on the machine would. For
/// tests only: nothing in the server calls it.
#[doc(hidden)]
pub fn shift_clock_for_tests(ms: i64) {
    SHIFT_MS.store(ms, Ordering::Relaxed);
}

/// Why this node's clock may not be trusted right now (`None`: it may). Set by the
/// clock check of a node sharing a PostgreSQL index (`store::db`), on opening and on
/// every pass after; while set, every judgment that depends on what has expired
/// (tokens, sessions, freezes, leases, housekeeping claims) is refused (503) rather
/// than made by a clock the other nodes do not share.
static DISTRUSTED: std::sync::RwLock<Option<String>> = std::sync::RwLock::new(None);

/// Records the outcome of a clock check: `Some(why)` distrusts this node's clock,
/// `None` trusts it again.
pub fn judge_clock(why: Option<String>) {
    let mut slot = DISTRUSTED
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    match (&*slot, &why) {
        (None, Some(why)) => tracing::error!(
            "{why}; refusing expiry-dependent requests (503) until it is back within bounds"
        ),
        (Some(_), None) => tracing::info!("this node's clock is back within bounds; serving again"),
        _ => {}
    }
    *slot = why;
}

/// Why this node's clock is not trusted, if it is not ([`judge_clock`]).
pub fn clock_distrusted() -> Option<String> {
    DISTRUSTED
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone()
}
