//! Time for leases. Everything that decides "is this lease stale?" asks a [`Clock`],
//! so tests advance a [`TestClock`] instead of sleeping for minutes.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use time::OffsetDateTime;

/// Seconds since the Unix epoch, UTC.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> i64;
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> i64 {
        crate::clock::now()
    }
}

/// A clock that only moves when told to. Clones share the same time.
#[derive(Debug, Clone)]
pub struct TestClock(Arc<AtomicI64>);

impl TestClock {
    /// Starts at `start` (Unix seconds).
    pub fn at(start: i64) -> Self {
        TestClock(Arc::new(AtomicI64::new(start)))
    }

    pub fn advance(&self, seconds: i64) {
        self.0.fetch_add(seconds, Ordering::SeqCst);
    }

    pub fn set(&self, now: i64) {
        self.0.store(now, Ordering::SeqCst);
    }
}

impl Default for TestClock {
    /// 2026-01-01T00:00:00Z.
    fn default() -> Self {
        TestClock::at(1_767_225_600)
    }
}

impl Clock for TestClock {
    fn now(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// `2026-01-01T00:00:00Z` (RFC 3339, UTC, whole seconds).
pub fn rfc3339(unix: i64) -> String {
    let t = OffsetDateTime::from_unix_timestamp(unix).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    t.format(&time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second]Z"
    ))
    .expect("a UTC date formats")
}

/// `Thu, 01 Jan 2026 00:00:00 GMT` (the HTTP date of RFC 9110), from an RFC 3339 timestamp.
pub fn http_date(rfc3339_text: &str) -> Option<String> {
    let t = OffsetDateTime::parse(rfc3339_text, &time::format_description::well_known::Rfc3339)
        .ok()?
        .to_offset(time::UtcOffset::UTC);
    t.format(&time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    ))
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_clock_moves_only_when_told() {
        let clock = TestClock::at(100);
        let shared = clock.clone();
        assert_eq!(clock.now(), 100);
        shared.advance(301);
        assert_eq!(clock.now(), 401);
        clock.set(5);
        assert_eq!(shared.now(), 5);
    }

    #[test]
    fn formats() {
        let table: &[(i64, &str)] = &[
            (0, "1970-01-01T00:00:00Z"),
            (1_767_225_600, "2026-01-01T00:00:00Z"),
            (1_767_225_661, "2026-01-01T00:01:01Z"),
        ];
        for (unix, text) in table {
            assert_eq!(rfc3339(*unix), *text);
        }
        let dates: &[(&str, Option<&str>)] = &[
            (
                "2026-01-01T00:00:00Z",
                Some("Thu, 01 Jan 2026 00:00:00 GMT"),
            ),
            (
                "2026-11-30T04:12:09.123456Z",
                Some("Mon, 30 Nov 2026 04:12:09 GMT"),
            ),
            (
                "2026-11-30T05:12:09+01:00",
                Some("Mon, 30 Nov 2026 04:12:09 GMT"),
            ),
            ("yesterday", None),
        ];
        for (input, expected) in dates {
            assert_eq!(http_date(input).as_deref(), *expected, "{input}");
        }
    }
}
