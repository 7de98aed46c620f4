//! One-time reveal tickets: how an audited reveal survives POST-redirect-GET.
//!
//! The reveal form (a CSRF POST) is answered with a 303 to the version page carrying a
//! fresh ticket (`?reveal=<ticket>`); that GET takes the ticket (once) and shows the
//! unmasked values, and only then is `state.revealed` audited. So the address bar holds
//! a GET URL a browser can reload, and a reload (or the URL copied into another tab or
//! browser) finds the ticket used up and shows the masked page with a button to reveal
//! again: nothing is ever revealed without a POST of this session's form.
//!
//! A ticket is bound to the session (by its CSRF token), the workspace and the version,
//! lives [`TICKET_SECONDS`], and is kept in memory only (a restart drops them: the
//! operator presses the button again). At most [`MAX_TICKETS`] are pending; beyond that
//! the oldest is dropped. A ticket is no secret of the state, but it is random (32 bytes
//! from the OS) so it cannot be guessed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

/// How long a ticket waits for its GET.
pub const TICKET_SECONDS: u64 = 60;
/// Pending tickets kept at most (all sessions together).
pub const MAX_TICKETS: usize = 1024;
/// The prefix of a ticket (`crate::tokens::generate`).
const PREFIX: &str = "sgv_";

struct Pending {
    session: String,
    workspace: String,
    version: i64,
    expires: Instant,
}

/// The pending tickets of this process.
#[derive(Default)]
pub struct RevealTickets {
    pending: Mutex<HashMap<String, Pending>>,
}

impl RevealTickets {
    /// A new ticket for this session (`csrf`), workspace and version.
    pub fn issue(
        &self,
        csrf: &str,
        workspace: &str,
        version: i64,
        now: Instant,
    ) -> Result<String, crate::tokens::TokenError> {
        let ticket = crate::tokens::generate(PREFIX)?;
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.retain(|_, p| p.expires > now);
        while pending.len() >= MAX_TICKETS {
            let Some(oldest) = pending
                .iter()
                .min_by_key(|(_, p)| p.expires)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            pending.remove(&oldest);
        }
        pending.insert(
            ticket.clone(),
            Pending {
                session: csrf.to_string(),
                workspace: workspace.to_string(),
                version,
                expires: now + Duration::from_secs(TICKET_SECONDS),
            },
        );
        Ok(ticket)
    }

    /// Uses up `ticket`: true when it was issued to this session for this version and
    /// has not expired. A ticket presented anywhere else is used up as well (it was
    /// seen outside its page), and so is one of another session.
    pub fn take(
        &self,
        ticket: &str,
        csrf: &str,
        workspace: &str,
        version: i64,
        now: Instant,
    ) -> bool {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        match pending.remove(ticket) {
            Some(p) => {
                p.expires > now
                    && bool::from(p.session.as_bytes().ct_eq(csrf.as_bytes()))
                    && p.workspace == workspace
                    && p.version == version
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_reveals_once_for_its_own_session_and_version_only() {
        let t = RevealTickets::default();
        let now = Instant::now();
        let later = now + Duration::from_secs(TICKET_SECONDS + 1);
        // (session, workspace, version, at, revealed)
        let table = [
            ("s1", "prod", 1, now, true),
            ("s2", "prod", 1, now, false),
            ("s1", "dev", 1, now, false),
            ("s1", "prod", 2, now, false),
            ("s1", "prod", 1, later, false),
        ];
        for (session, ws, version, at, want) in table {
            let ticket = t.issue("s1", "prod", 1, now).unwrap();
            assert!(ticket.starts_with(PREFIX));
            assert_eq!(
                t.take(&ticket, session, ws, version, at),
                want,
                "{session} {ws} {version}"
            );
            // Used up whatever the answer: a reload reveals nothing.
            assert!(!t.take(&ticket, "s1", "prod", 1, now));
        }
        assert!(!t.take("sgv_unknown", "s1", "prod", 1, now));
    }

    #[test]
    fn pending_tickets_are_bounded() {
        let t = RevealTickets::default();
        let now = Instant::now();
        let first = t.issue("s", "prod", 1, now).unwrap();
        for i in 0..MAX_TICKETS {
            t.issue("s", "prod", 1, now + Duration::from_millis(i as u64 + 1))
                .unwrap();
        }
        assert!(t.pending.lock().unwrap().len() <= MAX_TICKETS);
        assert!(
            !t.take(&first, "s", "prod", 1, now),
            "the oldest was dropped"
        );
    }
}
