//! The single sign-on rows every node shares: sign-ins started and not yet finished
//! (`sso_logins`), and the signed-in sessions followed at the provider
//! (`sso_sessions`). This module owns both tables; `ui::oidc` decides what goes in.
//!
//! Being rows, a sign-in started through one node finishes through another, and a
//! session is re-checked at the provider by whichever node its request reaches. What is
//! secret in them (a sign-in's nonce, PKCE verifier and browser binding; a session's
//! provider access and refresh tokens) arrives here sealed by `ui::oidc` under the
//! root key's single sign-on key, bound to the row's key: the index never holds it in
//! clear. Rows are keyed by hashes (of the `state` parameter, of the session id), so
//! the index does not hold those either.
//!
//! Times are unix seconds for sign-ins and unix milliseconds for sessions (a session's
//! re-check interval may be a second). Both tables are bounded: expired rows are swept before each insert, and past the
//! caps a new sign-in is refused ([`MAX_PENDING`]) and the session that ends first is
//! dropped ([`MAX_FOLLOWED`], which ends it at its next request: fail closed).

use crate::store::sql::{make_room, params, Connection, Error, OptionalExtension, Row};

/// Started sign-ins kept at once; past that, new ones are refused until some finish or
/// expire (an unauthenticated client cannot grow the table).
pub const MAX_PENDING: i64 = 4096;
/// Single sign-on sessions followed at once.
pub const MAX_FOLLOWED: i64 = 65536;

/// The tables; `crate::schema` applies them.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS sso_logins (
    state_sha256   TEXT PRIMARY KEY,
    sealed         BLOB NOT NULL,     -- binding hash, nonce, PKCE verifier, return page
    started_unix   INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sso_sessions (
    session_sha256 TEXT PRIMARY KEY,  -- the UI session's id hash (`tokens`)
    subject        TEXT NOT NULL,
    sealed         BLOB NOT NULL,     -- the provider's access and refresh tokens
    checked_ms     INTEGER NOT NULL,  -- last asked at the provider (unix milliseconds)
    ends_ms        INTEGER NOT NULL,
    checking_until INTEGER NOT NULL   -- a node is asking the provider until then (0: none)
) WITHOUT ROWID;
"#;

/// Records a started sign-in; `false` (nothing stored) when [`MAX_PENDING`] are
/// pending. Sign-ins started before `expired_before` are swept first.
pub fn insert_login(
    conn: &Connection,
    state_sha256: &str,
    sealed: &[u8],
    now: i64,
    expired_before: i64,
) -> Result<bool, Error> {
    conn.prepare_cached("DELETE FROM sso_logins WHERE started_unix <= ?1")?
        .execute(params![expired_before])?;
    let pending: i64 = conn.query_row("SELECT COUNT(*) FROM sso_logins", [], |r| r.get(0))?;
    if pending >= MAX_PENDING {
        return Ok(false);
    }
    conn.prepare_cached(
        "INSERT INTO sso_logins (state_sha256, sealed, started_unix) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![state_sha256, sealed, now])?;
    Ok(true)
}

/// Takes the sign-in out (one use, whatever follows): its sealed part, if it was
/// started after `expired_before`.
pub fn take_login(
    conn: &Connection,
    state_sha256: &str,
    expired_before: i64,
) -> Result<Option<Vec<u8>>, Error> {
    let taken: Option<(Vec<u8>, i64)> = conn
        .prepare_cached(
            "DELETE FROM sso_logins WHERE state_sha256 = ?1 RETURNING sealed, started_unix",
        )?
        .query_row(params![state_sha256], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(taken
        .filter(|(_, started)| *started > expired_before)
        .map(|(sealed, _)| sealed))
}

/// A followed session as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Followed {
    pub subject: String,
    pub sealed: Vec<u8>,
    pub checked_ms: i64,
    pub checking_until: i64,
}

impl Followed {
    /// A row of `subject, sealed, checked_ms, checking_until`.
    fn from_row(r: &Row<'_>) -> Result<Followed, Error> {
        Ok(Followed {
            subject: r.get(0)?,
            sealed: r.get(1)?,
            checked_ms: r.get(2)?,
            checking_until: r.get(3)?,
        })
    }
}

/// Follows the session whose id hashes to `session` from `now` until `ends` (unix
/// milliseconds; replacing a row of the same session). Ended sessions are swept
/// first; past [`MAX_FOLLOWED`] the one that ends first is dropped.
pub fn follow(
    conn: &Connection,
    session: &str,
    subject: &str,
    sealed: &[u8],
    now: i64,
    ends: i64,
) -> Result<(), Error> {
    make_room(
        conn,
        "sso_sessions",
        "session_sha256",
        "ends_ms",
        now,
        MAX_FOLLOWED,
    )?;
    conn.prepare_cached(
        "INSERT INTO sso_sessions (session_sha256, subject, sealed, checked_ms, ends_ms, checking_until)
         VALUES (?1, ?2, ?3, ?4, ?5, 0)
         ON CONFLICT (session_sha256) DO UPDATE SET subject = excluded.subject,
             sealed = excluded.sealed, checked_ms = excluded.checked_ms,
             ends_ms = excluded.ends_ms, checking_until = 0",
    )?
    .execute(params![session, subject, sealed, now, ends])?;
    Ok(())
}

/// Stops following a session (logout, or it ended).
pub fn forget(conn: &Connection, session: &str) -> Result<(), Error> {
    conn.prepare_cached("DELETE FROM sso_sessions WHERE session_sha256 = ?1")?
        .execute(params![session])?;
    Ok(())
}

/// The session, if it is followed and has not ended at `now`.
pub fn followed(conn: &Connection, session: &str, now: i64) -> Result<Option<Followed>, Error> {
    conn.prepare_cached(
        "SELECT subject, sealed, checked_ms, checking_until FROM sso_sessions
         WHERE session_sha256 = ?1 AND ends_ms > ?2",
    )?
    .query_row(params![session, now], Followed::from_row)
    .optional()
}

/// Claims the check of a session last checked at or before `stale_before`, for this
/// caller until `until`, unless another holds the claim at `now`: the row as it was
/// when claimed, `None` when there is nothing to claim (fresh, claimed, or gone).
/// One statement, so of racing requests (on any node) one asks the provider.
pub fn claim_check(
    conn: &Connection,
    session: &str,
    stale_before: i64,
    now: i64,
    until: i64,
) -> Result<Option<Followed>, Error> {
    conn.prepare_cached(
        "UPDATE sso_sessions SET checking_until = ?4
         WHERE session_sha256 = ?1 AND checked_ms <= ?2 AND checking_until <= ?3
           AND ends_ms > ?3
         RETURNING subject, sealed, checked_ms, checking_until",
    )?
    .query_row(
        params![session, stale_before, now, until],
        Followed::from_row,
    )
    .optional()
}

/// Releases a claim whose check did not finish (its request went away), so the
/// session's other requests do not wait for the claim to lapse.
pub fn release_claim(conn: &Connection, session: &str, until: i64) -> Result<(), Error> {
    conn.prepare_cached(
        "UPDATE sso_sessions SET checking_until = 0
         WHERE session_sha256 = ?1 AND checking_until = ?2",
    )?
    .execute(params![session, until])?;
    Ok(())
}

/// Records a check that found the session still granted: the (maybe renewed) sealed
/// tokens, checked at `now`, the claim released.
pub fn checked(conn: &Connection, session: &str, sealed: &[u8], now: i64) -> Result<(), Error> {
    conn.prepare_cached(
        "UPDATE sso_sessions SET sealed = ?2, checked_ms = ?3, checking_until = 0
         WHERE session_sha256 = ?1",
    )?
    .execute(params![session, sealed, now])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::db::schema_db as db;

    fn count(conn: &Connection, table: &str) -> i64 {
        conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn pending_sign_ins_are_used_once_bounded_and_expire() {
        let conn = db();
        let now = 1_000_000;
        assert!(insert_login(&conn, "s1", b"one", now, now - 600).unwrap());
        // (state, taken at, expired before, found)
        assert_eq!(
            take_login(&conn, "s1", now - 600).unwrap(),
            Some(b"one".to_vec())
        );
        assert_eq!(
            take_login(&conn, "s1", now - 600).unwrap(),
            None,
            "used once"
        );
        assert_eq!(take_login(&conn, "nope", now - 600).unwrap(), None);
        assert!(insert_login(&conn, "old", b"x", now, now - 600).unwrap());
        assert_eq!(
            take_login(&conn, "old", now).unwrap(),
            None,
            "too old: refused, and gone"
        );
        assert_eq!(count(&conn, "sso_logins"), 0);

        for i in 0..MAX_PENDING {
            assert!(insert_login(&conn, &format!("s{i}"), b"x", now, now - 600).unwrap());
        }
        assert!(
            !insert_login(&conn, "one-more", b"x", now, now - 600).unwrap(),
            "full: refused"
        );
        assert_eq!(count(&conn, "sso_logins"), MAX_PENDING);
        // Once they are old, they are swept to make room.
        assert!(insert_login(&conn, "later", b"x", now + 601, now + 1).unwrap());
        assert_eq!(count(&conn, "sso_logins"), 1);
    }

    #[test]
    fn one_claim_per_stale_session_and_a_check_releases_it() {
        let conn = db();
        let now = 1_000_000;
        follow(&conn, "sess", "alice", b"t0", now, now + 3600).unwrap();
        // Fresh: nothing to claim.
        assert_eq!(
            claim_check(&conn, "sess", now - 1, now, now + 45).unwrap(),
            None
        );
        // Stale: one claim; a second claimer (another node) gets none until it lapses.
        let later = now + 300;
        let claimed = claim_check(&conn, "sess", later - 60, later, later + 45).unwrap();
        assert_eq!(claimed.map(|f| f.sealed), Some(b"t0".to_vec()));
        assert_eq!(
            claim_check(&conn, "sess", later - 60, later, later + 45).unwrap(),
            None
        );
        assert_eq!(
            followed(&conn, "sess", later)
                .unwrap()
                .map(|f| f.checking_until),
            Some(later + 45)
        );
        let lapsed = later + 45;
        assert!(claim_check(&conn, "sess", lapsed - 60, lapsed, lapsed + 45)
            .unwrap()
            .is_some());
        // Released only by the claim it was (a later claimer's stays).
        release_claim(&conn, "sess", later + 45).unwrap();
        assert_eq!(
            followed(&conn, "sess", lapsed)
                .unwrap()
                .unwrap()
                .checking_until,
            lapsed + 45
        );
        release_claim(&conn, "sess", lapsed + 45).unwrap();
        assert_eq!(
            followed(&conn, "sess", lapsed)
                .unwrap()
                .unwrap()
                .checking_until,
            0
        );
        checked(&conn, "sess", b"t1", lapsed).unwrap();
        let row = followed(&conn, "sess", lapsed).unwrap().unwrap();
        assert_eq!(
            (row.sealed, row.checked_ms, row.checking_until),
            (b"t1".to_vec(), lapsed, 0)
        );
        // An ended session is not followed, nor claimable.
        assert_eq!(followed(&conn, "sess", now + 3600).unwrap(), None);
        assert_eq!(
            claim_check(&conn, "sess", now + 3600, now + 3600, now + 3700).unwrap(),
            None
        );
        forget(&conn, "sess").unwrap();
        assert_eq!(count(&conn, "sso_sessions"), 0);
    }

    #[test]
    fn followed_sessions_are_bounded_and_ended_ones_swept() {
        let conn = db();
        let now = 1_000_000;
        follow(&conn, "ended", "a", b"x", now - 100, now - 1).unwrap();
        follow(&conn, "ends-first", "a", b"x", now, now + 10).unwrap();
        assert_eq!(count(&conn, "sso_sessions"), 1, "the ended one is swept");
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
             INSERT INTO sso_sessions SELECT 's' || i, 'a', x'00', ?2, ?3, 0 FROM n",
            params![MAX_FOLLOWED - 1, now, now + 3600],
        )
        .unwrap();
        follow(&conn, "new", "a", b"x", now, now + 3600).unwrap();
        assert_eq!(count(&conn, "sso_sessions"), MAX_FOLLOWED);
        assert_eq!(followed(&conn, "ends-first", now).unwrap(), None, "dropped");
        assert!(followed(&conn, "new", now).unwrap().is_some());
    }
}
