//! One-time reveal tickets: how an audited reveal survives POST-redirect-GET.
//!
//! The reveal form (a CSRF POST) is answered with a 303 to the version page carrying a
//! fresh ticket (`?reveal=<ticket>`); that GET takes the ticket (once) and shows the
//! unmasked values, and only then is `state.revealed` audited. So the address bar holds
//! a GET URL a browser can reload, and a reload (or the URL copied into another tab or
//! browser) finds the ticket used up and shows the masked page with a button to reveal
//! again: nothing is ever revealed without a POST of this session's form.
//!
//! A ticket is bound to the session (the SHA-256 of its id, as `tokens` keeps it), the
//! workspace and the version, and lives [`TICKET_SECONDS`]. Tickets are rows of
//! `ui_reveal_tickets` (this module owns the table), so the GET may reach another node
//! than the POST did; only the ticket's SHA-256 is stored. At most [`MAX_TICKETS`] are
//! pending; beyond that the oldest is dropped. A ticket is no secret of the state, but
//! it is random (32 bytes from the OS) so it cannot be guessed.

use subtle::ConstantTimeEq;

use crate::store::sql::{make_room, params, Connection, OptionalExtension};
use crate::tokens::TokenError;

/// How long a ticket waits for its GET.
pub const TICKET_SECONDS: i64 = 60;
/// Pending tickets kept at most (all sessions together).
pub const MAX_TICKETS: i64 = 1024;
/// The prefix of a ticket (`crate::tokens::generate`).
const PREFIX: &str = "sgv_";

/// The table; `crate::schema` applies it.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS ui_reveal_tickets (
    ticket_sha256  TEXT PRIMARY KEY,
    session_sha256 TEXT NOT NULL,     -- the UI session's id hash (`tokens`)
    workspace      TEXT NOT NULL,
    version        INTEGER NOT NULL,
    expires_unix   INTEGER NOT NULL
) WITHOUT ROWID;
"#;

/// A new ticket for the session whose id hashes to `session`, for `workspace`'s
/// `version`. Run in the writer's transaction.
pub fn issue(
    conn: &Connection,
    session: &str,
    workspace: &str,
    version: i64,
    now: i64,
) -> Result<String, TokenError> {
    let ticket = crate::tokens::generate(PREFIX)?;
    make_room(
        conn,
        "ui_reveal_tickets",
        "ticket_sha256",
        "expires_unix",
        now,
        MAX_TICKETS,
    )?;
    conn.prepare_cached(
        "INSERT INTO ui_reveal_tickets (ticket_sha256, session_sha256, workspace, version, expires_unix)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        crate::tokens::hash(ticket.as_bytes()),
        session,
        workspace,
        version,
        now + TICKET_SECONDS
    ])?;
    Ok(ticket)
}

/// Uses up `ticket`: true when it was issued to this session for this version and
/// has not expired. A ticket presented anywhere else is used up as well (it was
/// seen outside its page), and so is one of another session. Run in the writer's
/// transaction, so two nodes given the same ticket reveal at most once.
pub fn take(
    conn: &Connection,
    ticket: &str,
    session: &str,
    workspace: &str,
    version: i64,
    now: i64,
) -> Result<bool, TokenError> {
    let taken: Option<(String, String, i64, i64)> = conn
        .prepare_cached(
            "DELETE FROM ui_reveal_tickets WHERE ticket_sha256 = ?1
             RETURNING session_sha256, workspace, version, expires_unix",
        )?
        .query_row(params![crate::tokens::hash(ticket.as_bytes())], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    Ok(match taken {
        Some((owner, w, v, expires)) => {
            expires > now
                && bool::from(owner.as_bytes().ct_eq(session.as_bytes()))
                && w == workspace
                && v == version
        }
        None => false,
    })
}

impl super::session::Sessions {
    /// A new reveal ticket ([`issue`]) for the session whose id hashes to `session`,
    /// in a write transaction of its own.
    pub async fn issue_reveal(
        &self,
        session: &str,
        workspace: &str,
        version: i64,
        now: i64,
    ) -> Result<String, crate::error::Error> {
        let (session, workspace) = (session.to_string(), workspace.to_string());
        self.write(move |conn| Ok(issue(conn, &session, &workspace, version, now)?))
            .await
    }

    /// Uses up a reveal ticket ([`take`]) in a write transaction of its own: true when
    /// it lets this session's GET of this version through.
    pub async fn take_reveal(
        &self,
        ticket: &str,
        session: &str,
        workspace: &str,
        version: i64,
        now: i64,
    ) -> Result<bool, crate::error::Error> {
        let (ticket, session, workspace) = (
            ticket.to_string(),
            session.to_string(),
            workspace.to_string(),
        );
        self.write(move |conn| Ok(take(conn, &ticket, &session, &workspace, version, now)?))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::db::schema_db as db;

    #[test]
    fn a_ticket_reveals_once_for_its_own_session_and_version_only() {
        let conn = db();
        let now = 1_000_000;
        let later = now + TICKET_SECONDS;
        // (session, workspace, version, at, revealed)
        let table = [
            ("s1", "prod", 1, now, true),
            ("s2", "prod", 1, now, false),
            ("s1", "dev", 1, now, false),
            ("s1", "prod", 2, now, false),
            ("s1", "prod", 1, later, false),
        ];
        for (session, ws, version, at, want) in table {
            let ticket = issue(&conn, "s1", "prod", 1, now).unwrap();
            assert!(ticket.starts_with(PREFIX));
            assert_eq!(
                take(&conn, &ticket, session, ws, version, at).unwrap(),
                want,
                "{session} {ws} {version}"
            );
            // Used up whatever the answer: a reload reveals nothing.
            assert!(!take(&conn, &ticket, "s1", "prod", 1, now).unwrap());
        }
        assert!(!take(&conn, "sgv_unknown", "s1", "prod", 1, now).unwrap());
        // Only the ticket's hash is stored.
        let stored: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM ui_reveal_tickets WHERE ticket_sha256 LIKE 'sgv_%'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(stored, 0);
    }

    #[test]
    fn pending_tickets_are_bounded_and_expired_ones_swept() {
        let conn = db();
        let now = 1_000_000;
        let first = issue(&conn, "s", "prod", 1, now).unwrap();
        for i in 0..MAX_TICKETS {
            issue(&conn, "s", "prod", 1, now + i % 30 + 1).unwrap();
        }
        let count = |c: &Connection| -> i64 {
            c.query_row("SELECT COUNT(*) FROM ui_reveal_tickets", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(count(&conn), MAX_TICKETS);
        assert!(
            !take(&conn, &first, "s", "prod", 1, now).unwrap(),
            "the oldest was dropped"
        );
        issue(&conn, "s", "prod", 1, now + 1000).unwrap();
        assert_eq!(count(&conn), 1, "expired tickets are swept");
    }
}
