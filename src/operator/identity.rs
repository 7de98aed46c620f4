//! Operators: site-wide identities (workspaces belong to no org) that use the admin
//! API and whose actions the audit log names. Their tokens (`sgo_`) are issued, hashed,
//! looked up and revoked by `crate::tokens` like every other secret (kind `operator`);
//! a revoked token keeps its row (`revoked_at`), so listings show what was revoked.
//! Each operator has a [`Grant`] (a role and optional workspace patterns, `roles`),
//! kept in `operator_grants`; operators from before roles existed become `admin`.
//!
//! A single sign-on operator's grant is rewritten from its groups at every sign-in and
//! re-check, so `set-role` on one sets its **cap** instead (`operator_sso_caps`): what
//! it holds is its groups' grant held under the cap ([`Grant::capped`]), read at every
//! request, for its UI sessions and its API tokens alike, so no re-grant exceeds it.

use crate::store::sql::{params, Connection, OptionalExtension};

use super::roles::{Grant, Pattern, Role};
use crate::cluster::identity::{normalize_email, AdminError, TokenRow};
use crate::store::audit::{insert_audit, AuditEntry};
use crate::tokens::{self, Kind, NewToken};

/// The operator table (their tokens are in `tokens`); `crate::schema` applies it.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS operators (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    email       TEXT NOT NULL UNIQUE,
    created_at  TEXT NOT NULL
);

-- What each operator may do (`operator::roles`). `workspaces`: comma-separated
-- patterns, empty when not limited.
CREATE TABLE IF NOT EXISTS operator_grants (
    operator_id INTEGER PRIMARY KEY REFERENCES operators(id),
    role        TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    workspaces  TEXT NOT NULL DEFAULT ''
);
-- Operators created before roles existed keep what they could do: everything.
INSERT OR IGNORE INTO operator_grants (operator_id, role) SELECT id, 'admin' FROM operators;

-- Operators who sign in to the web UI through single sign-on (`ui::oidc`): one per
-- (issuer, subject), whatever their email says. Their grant is recomputed from
-- their groups at every sign-in.
CREATE TABLE IF NOT EXISTS operator_sso (
    operator_id   INTEGER PRIMARY KEY REFERENCES operators(id),
    issuer        TEXT NOT NULL,
    subject       TEXT NOT NULL,
    last_login_at TEXT NOT NULL,
    UNIQUE (issuer, subject)
);

-- The most a single sign-on operator may hold, whatever its groups give (`set-role`
-- on such an operator sets it): what it holds is its grant held under this one.
CREATE TABLE IF NOT EXISTS operator_sso_caps (
    operator_id INTEGER PRIMARY KEY REFERENCES operators(id),
    role        TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    workspaces  TEXT NOT NULL DEFAULT '',
    set_at      TEXT NOT NULL
);
"#;

/// Prefix of every operator token.
pub const OPERATOR_TOKEN_PREFIX: &str = Kind::Operator.prefix();

/// An authenticated operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub id: i64,
    pub email: String,
    /// What the operator may do; checked by `http::guard` before every operation.
    pub grant: Grant,
}

impl Operator {
    /// How the audit log and version rows name this operator.
    pub fn actor(&self) -> String {
        format!("operator:{}", self.email)
    }
}

/// The operator a presented token belongs to, if it exists and is not revoked.
pub fn operator_by_token(
    conn: &Connection,
    token: &[u8],
) -> Result<Option<Operator>, crate::store::sql::Error> {
    Ok(live_operator_token(conn, token, tokens::now())?.map(|(_, operator)| operator))
}

/// The live operator token presented (its hash) and its operator, at `now`.
pub fn live_operator_token(
    conn: &Connection,
    token: &[u8],
    now: i64,
) -> Result<Option<(String, Operator)>, crate::store::sql::Error> {
    let Some(live) = tokens::live(conn, Kind::Operator, token, now)? else {
        return Ok(None);
    };
    let Some(id) = live.owner_id else {
        return Ok(None);
    };
    Ok(operator_by_id(conn, id)?.map(|operator| (live.sha256, operator)))
}

/// A stored grant. The table's CHECK and `create_operator` admit only valid ones; a
/// row that still does not read (edited by hand) grants nothing rather than everything.
fn stored_grant(role: Option<String>, workspaces: Option<String>) -> Grant {
    let role = role.as_deref().and_then(|r| Role::parse(r).ok());
    match (role, workspaces.as_deref()) {
        (Some(role), Some(list)) => {
            Grant::parse(role.as_str(), Some(list)).unwrap_or_else(|_| Grant {
                role: Role::Viewer,
                patterns: vec![Pattern::nothing()],
            })
        }
        _ => Grant {
            role: Role::Viewer,
            patterns: vec![Pattern::nothing()],
        },
    }
}

const SELECT_OPERATOR: &str = "SELECT o.id, o.email, g.role, g.workspaces, o.created_at,
            c.role, c.workspaces, s.operator_id IS NOT NULL
       FROM operators o LEFT JOIN operator_grants g ON g.operator_id = o.id
       LEFT JOIN operator_sso_caps c ON c.operator_id = o.id
       LEFT JOIN operator_sso s ON s.operator_id = o.id";

/// The cap of a row read with [`SELECT_OPERATOR`], if it has one (one that does not
/// read caps everything: [`stored_grant`]).
fn cap_of(r: &crate::store::sql::Row<'_>) -> crate::store::sql::Result<Option<Grant>> {
    let role: Option<String> = r.get(5)?;
    let workspaces: Option<String> = r.get(6)?;
    Ok(role.map(|role| stored_grant(Some(role), workspaces)))
}

fn operator_row(r: &crate::store::sql::Row<'_>) -> crate::store::sql::Result<Operator> {
    let granted = stored_grant(r.get(2)?, r.get(3)?);
    Ok(Operator {
        id: r.get(0)?,
        email: r.get(1)?,
        grant: match cap_of(r)? {
            Some(cap) => granted.capped(&cap),
            None => granted,
        },
    })
}

/// The operator with this id.
pub fn operator_by_id(
    conn: &Connection,
    id: i64,
) -> Result<Option<Operator>, crate::store::sql::Error> {
    conn.prepare_cached(&format!("{SELECT_OPERATOR} WHERE o.id = ?1"))?
        .query_row([id], operator_row)
        .optional()
}

/// One row of `admin operator list`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OperatorRow {
    pub email: String,
    /// What the operator holds now (under its cap, if it has one).
    pub role: String,
    /// Comma-separated patterns; empty when not limited.
    pub workspaces: String,
    pub created_at: String,
    /// Signs in through single sign-on (its grant follows its groups).
    pub sso: bool,
    /// A single sign-on operator's cap (`set-role`), if set.
    pub cap: Option<CapRow>,
}

/// A cap as listed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CapRow {
    pub role: String,
    pub workspaces: String,
}

/// Every operator with its role, by email.
pub fn list_operators(conn: &Connection) -> Result<Vec<OperatorRow>, AdminError> {
    let mut stmt = conn.prepare(&format!("{SELECT_OPERATOR} ORDER BY o.email"))?;
    let rows = stmt
        .query_map([], |r| {
            let op = operator_row(r)?;
            Ok(OperatorRow {
                email: op.email,
                role: op.grant.role.as_str().into(),
                workspaces: op.grant.workspaces(),
                created_at: r.get(4)?,
                sso: r.get(7)?,
                cap: cap_of(r)?.map(|cap| CapRow {
                    role: cap.role.as_str().into(),
                    workspaces: cap.workspaces(),
                }),
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

fn audit(
    conn: &Connection,
    actor: &str,
    event: &'static str,
    payload: serde_json::Value,
) -> Result<(), AdminError> {
    let entry = AuditEntry::new(actor, "operators", event, payload);
    insert_audit(conn, &entry)?;
    Ok(())
}

fn insert_token(conn: &Connection, operator_id: i64) -> Result<tokens::Issued, AdminError> {
    Ok(tokens::issue(
        conn,
        NewToken {
            kind: Kind::Operator,
            owner_id: Some(operator_id),
            parent: None,
            expires_at: None,
        },
    )?)
}

/// Creates an `admin` operator (not limited) and its first token (returned: the only
/// time it exists in clear).
pub fn create_operator(conn: &Connection, email: &str, actor: &str) -> Result<String, AdminError> {
    create_operator_with(conn, email, &Grant::ROOT, actor)
}

/// Creates an operator with `grant` and its first token (returned: the only time it
/// exists in clear).
pub fn create_operator_with(
    conn: &Connection,
    email: &str,
    grant: &Grant,
    actor: &str,
) -> Result<String, AdminError> {
    let email = normalize_email(email)?;
    let inserted: Option<i64> = conn
        .query_row(
            "INSERT INTO operators (email, created_at) VALUES (?1, ?2)
             ON CONFLICT (email) DO NOTHING RETURNING id",
            params![email, crate::store::now_rfc3339()],
            |r| r.get(0),
        )
        .optional()?;
    let Some(id) = inserted else {
        return Err(AdminError::Exists(format!(
            "an operator with email {email:?} already exists (use `admin operator token create` for another token)"
        )));
    };
    conn.execute(
        "INSERT INTO operator_grants (operator_id, role, workspaces) VALUES (?1, ?2, ?3)",
        params![id, grant.role.as_str(), grant.workspaces()],
    )?;
    let token = insert_token(conn, id)?;
    audit(
        conn,
        actor,
        "admin.operator_created",
        serde_json::json!({
            "email": email,
            "role": grant.role.as_str(),
            "workspaces": grant.workspaces(),
        }),
    )?;
    Ok(token.secret)
}

/// What `set-role` changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleSet {
    /// The operator's grant.
    Grant,
    /// A single sign-on operator's cap: its groups never give it more.
    SsoCap,
}

/// Where an operator stands before a `set-role`: read first, so the change can be
/// recorded (`tokens::NarrowingLog`) before it commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    pub id: i64,
    pub email: String,
    /// What it holds now (under its cap, if any).
    pub holds: Grant,
    /// Its single sign-on link, if it signs in that way: `set-role` sets its cap.
    pub sso: Option<(String, String)>,
    /// Its cap now, if it has one.
    pub cap: Option<Grant>,
}

/// The operator `email` names, as [`set_operator_grant`] would find it.
pub fn standing(conn: &Connection, email: &str) -> Result<Standing, AdminError> {
    let email = normalize_email(email)?;
    let (found, cap) = conn
        .query_row(
            &format!("{SELECT_OPERATOR} WHERE o.email = ?1"),
            [&email],
            |r| Ok((operator_row(r)?, cap_of(r)?)),
        )
        .optional()?
        .ok_or_else(|| AdminError::NotFound(format!("no operator with email {email:?}")))?;
    let sso = conn
        .prepare_cached("SELECT issuer, subject FROM operator_sso WHERE operator_id = ?1")?
        .query_row([found.id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(Standing {
        id: found.id,
        email,
        holds: found.grant,
        sso,
        cap,
    })
}

/// Changes an existing operator's role and patterns. It holds at once, also for the
/// operator's open UI sessions and API tokens (every request reads the grant). For a
/// single sign-on operator it sets the cap its groups can never exceed
/// ([`RoleSet::SsoCap`]; a grant set directly would last only until the next re-check
/// at the provider). Audited as `admin.operator_role_set` with what the operator held
/// before and holds now (and, for a cap, the cap before and now).
pub fn set_operator_grant(
    conn: &Connection,
    email: &str,
    grant: &Grant,
    actor: &str,
) -> Result<RoleSet, AdminError> {
    let before = standing(conn, email)?;
    let payload = serde_json::json!({
        "email": before.email,
        "from": grant_json(Some(&before.holds)),
    });
    let sso = before.sso.is_some();
    let cap_before = grant_json(before.cap.as_ref());
    apply_grant(
        conn,
        actor,
        "admin.operator_role_set",
        before.id,
        sso,
        grant,
        cap_before,
        payload,
    )?;
    Ok(if sso { RoleSet::SsoCap } else { RoleSet::Grant })
}

/// Sets `to` as operator `id`'s cap (`sso`: a single sign-on operator, whose groups'
/// grant can never exceed it) or as its grant, then audits `event` with `payload`, the
/// grant the operator now holds (`to`) and, for a cap, the cap before and now.
#[allow(clippy::too_many_arguments)]
fn apply_grant(
    conn: &Connection,
    actor: &str,
    event: &'static str,
    id: i64,
    sso: bool,
    to: &Grant,
    cap_before: serde_json::Value,
    mut payload: serde_json::Value,
) -> Result<(), AdminError> {
    if sso {
        set_cap(conn, id, to)?;
        payload["cap"] = serde_json::json!({ "from": cap_before, "to": grant_json(Some(to)) });
    } else {
        set_grant(conn, id, to)?;
    }
    let now = operator_by_id(conn, id)?.map_or_else(|| to.clone(), |o| o.grant);
    payload["to"] = grant_json(Some(&now));
    audit(conn, actor, event, payload)
}

/// A grant (or cap) as a narrowing record and the `admin.operator_role_*` audit rows
/// show it; `null` for no cap.
pub(crate) fn grant_json(grant: Option<&Grant>) -> serde_json::Value {
    grant.map_or(
        serde_json::Value::Null,
        |g| serde_json::json!({ "role": g.role.as_str(), "workspaces": g.workspaces() }),
    )
}

/// The record of a `set-role` to `grant` on the operator `before` describes, kept in
/// the store before it commits (`tokens::NarrowingLog`) so a restore re-applies it
/// ([`reapply_grant`]). A single sign-on operator is named by its link (its email may
/// change at sign-in) and the record is of its cap.
pub fn grant_narrowing(before: &Standing, grant: &Grant, actor: &str) -> tokens::Narrowing {
    let (subject, from) = match &before.sso {
        Some((issuer, subject)) => (
            format!("sso:{issuer}\n{subject}"),
            grant_json(before.cap.as_ref()),
        ),
        None => (
            format!("email:{}", before.email),
            grant_json(Some(&before.holds)),
        ),
    };
    tokens::Narrowing {
        kind: tokens::NARROWING_GRANT.into(),
        subject,
        from,
        to: grant_json(Some(grant)),
        at_ms: tokens::now_ms(),
        actor: actor.to_string(),
    }
}

/// Brings a restored database up to a recorded `set-role` ([`grant_narrowing`]) when
/// the snapshot (taken at `taken_unix`) predates it (`tokens::Narrowing::needed`).
/// Audited as `admin.operator_role_reapplied` by `actor`. The operator's email when
/// applied; `None` when not needed, or when the operator is not in the snapshot
/// (created after it: created again by hand, as the restore says).
pub fn reapply_grant(
    conn: &Connection,
    change: &tokens::Narrowing,
    taken_unix: i64,
    actor: &str,
) -> Result<Option<String>, AdminError> {
    let bad = || AdminError::Invalid("a recorded role change does not read".into());
    let to = change
        .to
        .get("role")
        .and_then(|r| r.as_str())
        .zip(change.to.get("workspaces").and_then(|w| w.as_str()))
        .and_then(|(role, workspaces)| Grant::parse(role, Some(workspaces)).ok())
        .ok_or_else(bad)?;
    let (id, sso): (Option<i64>, bool) = match change.subject.split_once(':') {
        Some(("sso", link)) => {
            let (issuer, subject) = link.split_once('\n').ok_or_else(bad)?;
            let id = conn
                .prepare_cached(
                    "SELECT operator_id FROM operator_sso WHERE issuer = ?1 AND subject = ?2",
                )?
                .query_row(params![issuer, subject], |r| r.get(0))
                .optional()?;
            (id, true)
        }
        Some(("email", email)) => {
            let id = conn
                .prepare_cached("SELECT id FROM operators WHERE email = ?1")?
                .query_row([email], |r| r.get(0))
                .optional()?;
            (id, false)
        }
        _ => return Err(bad()),
    };
    let Some(before) = id.map(|id| operator_by_id(conn, id)).transpose()?.flatten() else {
        return Ok(None);
    };
    let current = if sso {
        let cap: Option<Grant> = conn
            .prepare_cached(
                "SELECT role, workspaces FROM operator_sso_caps WHERE operator_id = ?1",
            )?
            .query_row([before.id], |r| Ok(stored_grant(r.get(0)?, r.get(1)?)))
            .optional()?;
        grant_json(cap.as_ref())
    } else {
        grant_json(granted(conn, before.id)?.as_ref())
    };
    if !change.needed(&current, taken_unix) {
        return Ok(None);
    }
    let payload = serde_json::json!({
        "email": before.email,
        "from": grant_json(Some(&before.grant)),
        "recorded_at": change.recorded_at(),
        "recorded_by": change.actor,
    });
    let event = "admin.operator_role_reapplied";
    apply_grant(conn, actor, event, before.id, sso, &to, current, payload)?;
    Ok(Some(before.email))
}

/// Sets single sign-on operator `id`'s cap.
fn set_cap(conn: &Connection, id: i64, cap: &Grant) -> Result<(), crate::store::sql::Error> {
    conn.execute(
        "INSERT INTO operator_sso_caps (operator_id, role, workspaces, set_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (operator_id) DO UPDATE SET role = excluded.role,
             workspaces = excluded.workspaces, set_at = excluded.set_at",
        params![id, cap.role.as_str(), cap.workspaces(), crate::store::now_rfc3339()],
    )?;
    Ok(())
}

/// The grant stored for operator `id` before any cap: for a single sign-on operator,
/// what its groups gave at the last sign-in or re-check.
pub fn granted(conn: &Connection, id: i64) -> Result<Option<Grant>, crate::store::sql::Error> {
    conn.prepare_cached("SELECT role, workspaces FROM operator_grants WHERE operator_id = ?1")?
        .query_row([id], |r| Ok(stored_grant(r.get(0)?, r.get(1)?)))
        .optional()
}

/// A user the identity provider vouched for, with the grant its groups map to.
#[derive(Debug, Clone, Copy)]
pub struct SsoUser<'a> {
    pub issuer: &'a str,
    pub subject: &'a str,
    /// The operator name (`operators.email`) to show: their email, or a name made
    /// from the subject.
    pub name: &'a str,
    pub grant: &'a Grant,
}

/// Gives operator `id` `grant` (its role and workspace patterns), replacing the one it had.
pub fn set_grant(
    conn: &Connection,
    id: i64,
    grant: &Grant,
) -> Result<(), crate::store::sql::Error> {
    conn.execute(
        "INSERT INTO operator_grants (operator_id, role, workspaces) VALUES (?1, ?2, ?3)
         ON CONFLICT (operator_id) DO UPDATE SET role = excluded.role, workspaces = excluded.workspaces",
        params![id, grant.role.as_str(), grant.workspaces()],
    )?;
    Ok(())
}

/// The operator a single sign-on user is: the one linked to its (issuer, subject),
/// renamed and given `user.grant` now, or a new one. `None` (nothing changed) when
/// the name is not a valid operator name or belongs to another operator, who is
/// never taken over: an operator made from the CLI, or another user of the provider.
/// A new operator is audited as `admin.operator_created` (method `oidc`).
pub fn sso_operator(conn: &Connection, user: SsoUser<'_>) -> Result<Option<Operator>, AdminError> {
    let Ok(name) = normalize_email(user.name) else {
        return Ok(None);
    };
    let linked: Option<i64> = conn
        .prepare_cached("SELECT operator_id FROM operator_sso WHERE issuer = ?1 AND subject = ?2")?
        .query_row(params![user.issuer, user.subject], |r| r.get(0))
        .optional()?;
    let holder: Option<i64> = conn
        .prepare_cached("SELECT id FROM operators WHERE email = ?1")?
        .query_row([&name], |r| r.get(0))
        .optional()?;
    let now = crate::store::now_rfc3339();
    let (role, workspaces) = (user.grant.role.as_str(), user.grant.workspaces());
    let id = match (linked, holder) {
        (Some(id), Some(other)) if other != id => return Ok(None),
        (None, Some(_)) => return Ok(None),
        (Some(id), _) => {
            conn.execute(
                "UPDATE operators SET email = ?2 WHERE id = ?1",
                params![id, name],
            )?;
            conn.execute(
                "UPDATE operator_sso SET last_login_at = ?2 WHERE operator_id = ?1",
                params![id, now],
            )?;
            id
        }
        (None, None) => {
            let id: i64 = conn.query_row(
                "INSERT INTO operators (email, created_at) VALUES (?1, ?2) RETURNING id",
                params![name, now],
                |r| r.get(0),
            )?;
            conn.execute(
                "INSERT INTO operator_sso (operator_id, issuer, subject, last_login_at)
                 VALUES (?1, ?2, ?3, ?4)",
                params![id, user.issuer, user.subject, now],
            )?;
            audit(
                conn,
                &format!("operator:{name}"),
                "admin.operator_created",
                serde_json::json!({
                    "email": name,
                    "role": role,
                    "workspaces": workspaces,
                    "method": "oidc",
                    "issuer": user.issuer,
                    "subject": user.subject,
                }),
            )?;
            id
        }
    };
    set_grant(conn, id, user.grant)?;
    Ok(operator_by_id(conn, id)?)
}

/// Another token for an existing operator (earlier tokens stay valid).
pub fn create_operator_token(
    conn: &Connection,
    email: &str,
    actor: &str,
) -> Result<String, AdminError> {
    let email = normalize_email(email)?;
    let id: i64 = conn
        .query_row("SELECT id FROM operators WHERE email = ?1", [&email], |r| {
            r.get(0)
        })
        .optional()?
        .ok_or_else(|| AdminError::NotFound(format!("no operator with email {email:?}")))?;
    let token = insert_token(conn, id)?;
    let payload = serde_json::json!({ "email": email, "token_id": token.id() });
    audit(conn, actor, "admin.operator_token_created", payload)?;
    Ok(token.secret)
}

/// Every operator token (ids only, revoked ones included), by operator.
pub fn list_operator_tokens(conn: &Connection) -> Result<Vec<TokenRow>, AdminError> {
    let mut stmt = conn.prepare("SELECT id, email FROM operators")?;
    let emails: std::collections::HashMap<i64, String> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let mut rows: Vec<TokenRow> = tokens::list(conn, Kind::Operator)?
        .into_iter()
        .filter_map(|t| {
            Some(TokenRow {
                id: t.id,
                email: emails.get(&t.owner_id?)?.clone(),
                created_at: t.created_at,
                revoked_at: t.revoked_at,
            })
        })
        .collect();
    rows.sort_by(|a, b| (&a.email, &a.created_at).cmp(&(&b.email, &b.created_at)));
    Ok(rows)
}

/// The unrevoked operator token `id` names and its operator's email: what
/// [`revoke_operator_token`] revokes (the CLI records it in the store first).
pub fn operator_token_to_revoke(
    conn: &Connection,
    id: &str,
) -> Result<(tokens::Found, String), AdminError> {
    let found = tokens::find_unrevoked(conn, Kind::Operator, id, "unrevoked operator token")?;
    let operator = operator_by_id(conn, found.owner_id.unwrap_or_default())?.ok_or_else(|| {
        AdminError::NotFound(format!(
            "no unrevoked operator token with id {}",
            found.id()
        ))
    })?;
    Ok((found, operator.email))
}

/// Revokes an operator token by id: it stops working at once, and so does every UI
/// session opened with it. Audited as `admin.operator_token_revoked`; revoking a
/// revoked token is an error (nothing to do).
pub fn revoke_operator_token(conn: &Connection, id: &str, actor: &str) -> Result<(), AdminError> {
    let (found, email) = operator_token_to_revoke(conn, id)?;
    tokens::revoke(conn, &found.sha256, &crate::store::now_rfc3339())?;
    audit(
        conn,
        actor,
        "admin.operator_token_revoked",
        serde_json::json!({ "email": email, "token_id": found.id() }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::identity::tests::test_db;
    use crate::operator::roles::{Action, Target};
    use crate::store::audit::list_audit;

    #[test]
    fn grants_are_stored_and_operators_from_before_roles_are_admins() {
        let (_dir, conn) = test_db();
        let grant = Grant::parse("viewer", Some("dev-*")).unwrap();
        let token = create_operator_with(&conn, "v@x.io", &grant, "cli:root").unwrap();
        let me = operator_by_token(&conn, token.as_bytes()).unwrap().unwrap();
        assert_eq!(me.grant, grant);
        // An operator created before `operator_grants` existed: no row until the
        // schema runs again (every start), then an admin of everything.
        let old: i64 = conn
            .query_row(
                "INSERT INTO operators (email, created_at) VALUES ('old@x.io', 'then') RETURNING id",
                [],
                |r| r.get(0),
            )
            .unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        let old = operator_by_id(&conn, old).unwrap().unwrap();
        assert_eq!(old.grant, Grant::ROOT);
        // Running it again changes no grant that exists.
        conn.execute_batch(SCHEMA).unwrap();
        assert_eq!(operator_by_id(&conn, me.id).unwrap().unwrap().grant, grant);
        // A grant row that does not read (edited by hand) grants nothing at all.
        conn.execute(
            "UPDATE operator_grants SET workspaces = 'a/b' WHERE operator_id = ?1",
            [me.id],
        )
        .unwrap();
        let broken = operator_by_id(&conn, me.id).unwrap().unwrap().grant;
        assert!(!broken.may(Action::Read, Target::Workspace("dev-1")));
        assert!(!broken.may(Action::Read, Target::Site));
        assert!(!broken.sees("dev-1"));
        let listed = list_operators(&conn).unwrap();
        assert_eq!(
            listed
                .iter()
                .map(|r| (r.email.as_str(), r.role.as_str()))
                .collect::<Vec<_>>(),
            [("old@x.io", "admin"), ("v@x.io", "viewer")]
        );
        let created = list_audit(&conn, Some("operators"), None, 10).unwrap();
        assert_eq!(created[0].payload["role"], "viewer");
        assert_eq!(created[0].payload["workspaces"], "dev-*");
        // Changing a grant holds at once; an unknown operator is an error.
        let to = Grant::parse("operator", Some("prod-*")).unwrap();
        set_operator_grant(&conn, "V@x.io", &to, "cli:root").unwrap();
        assert_eq!(
            operator_by_token(&conn, token.as_bytes())
                .unwrap()
                .unwrap()
                .grant,
            to
        );
        assert!(matches!(
            set_operator_grant(&conn, "who@x.io", &to, "cli:root"),
            Err(AdminError::NotFound(_))
        ));
        let last = list_audit(&conn, Some("operators"), None, 10).unwrap();
        let last = last.last().unwrap();
        assert_eq!(last.event, "admin.operator_role_set");
        assert_eq!(last.payload["to"]["role"], "operator");
    }

    #[test]
    fn sso_users_are_one_operator_per_subject_regranted_at_every_sign_in() {
        let (_dir, conn) = test_db();
        let admin = Grant::ROOT;
        let viewer = Grant::parse("viewer", Some("dev-*")).unwrap();
        let user = |subject, name, grant| SsoUser {
            issuer: "https://id.example.com",
            subject,
            name,
            grant,
        };
        let first = sso_operator(&conn, user("u1", "A@x.io", &admin))
            .unwrap()
            .unwrap();
        assert_eq!((first.email.as_str(), &first.grant), ("a@x.io", &admin));
        // The next sign-in: its groups give less now, and the email changed.
        let again = sso_operator(&conn, user("u1", "a2@x.io", &viewer))
            .unwrap()
            .unwrap();
        assert_eq!(
            (again.id, again.email.as_str(), &again.grant),
            (first.id, "a2@x.io", &viewer)
        );
        // An operator made another way is never taken over, by a new user or a
        // linked one, and nothing changes.
        let root_token = create_operator(&conn, "root@x.io", "cli:root").unwrap();
        let before = list_operators(&conn).unwrap();
        for taken in [
            user("u2", "root@x.io", &admin),
            user("u1", "root@x.io", &admin),
            user("u3", "not an email", &admin),
        ] {
            assert_eq!(sso_operator(&conn, taken).unwrap(), None, "{taken:?}");
        }
        assert_eq!(list_operators(&conn).unwrap(), before);
        let root = operator_by_token(&conn, root_token.as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(root.grant, Grant::ROOT);
        // The same subject at another issuer is someone else.
        let elsewhere = SsoUser {
            issuer: "https://other.example.com",
            ..user("u1", "b@x.io", &viewer)
        };
        let other = sso_operator(&conn, elsewhere).unwrap().unwrap();
        assert_ne!(other.id, first.id);
        let created: Vec<_> = list_audit(&conn, Some("operators"), None, 20)
            .unwrap()
            .into_iter()
            .filter(|r| r.event == "admin.operator_created" && r.payload["method"] == "oidc")
            .map(|r| (r.actor, r.payload["subject"].clone()))
            .collect();
        assert_eq!(
            created,
            [
                ("operator:a@x.io".to_string(), serde_json::json!("u1")),
                ("operator:b@x.io".to_string(), serde_json::json!("u1")),
            ]
        );
    }

    /// Finding 3 of issue 37: `set-role` on a single sign-on operator is a cap its
    /// groups never exceed, at sign-in or re-grant, for its tokens too; audited.
    #[test]
    fn a_single_sign_on_operators_cap_holds_whatever_its_groups_give() {
        let (_dir, conn) = test_db();
        let user = |grant| SsoUser {
            issuer: "https://id.example.com",
            subject: "u1",
            name: "a@x.io",
            grant,
        };
        let admin = Grant::ROOT;
        let first = sso_operator(&conn, user(&admin)).unwrap().unwrap();
        assert_eq!(first.grant, admin);
        let token = create_operator_token(&conn, "a@x.io", "cli:root").unwrap();
        let holds = |conn: &Connection| {
            operator_by_token(conn, token.as_bytes())
                .unwrap()
                .unwrap()
                .grant
        };
        let viewer = Grant::parse("viewer", None).unwrap();
        let before = standing(&conn, "a@x.io").unwrap();
        assert_eq!(
            set_operator_grant(&conn, "a@x.io", &viewer, "cli:root").unwrap(),
            RoleSet::SsoCap
        );
        assert_eq!(holds(&conn), viewer);
        // The next sign-in (or re-check) writes the groups' admin back: still a viewer.
        let again = sso_operator(&conn, user(&admin)).unwrap().unwrap();
        assert_eq!(
            (again.grant.clone(), holds(&conn)),
            (viewer.clone(), viewer.clone())
        );
        assert_eq!(granted(&conn, first.id).unwrap(), Some(admin.clone()));
        // A cap with patterns narrows them too; groups giving less give less.
        let team = Grant::parse("operator", Some("team-a-*")).unwrap();
        set_operator_grant(&conn, "a@x.io", &team, "cli:root").unwrap();
        assert_eq!(holds(&conn), team);
        let dev = Grant::parse("viewer", Some("team-*")).unwrap();
        sso_operator(&conn, user(&dev)).unwrap().unwrap();
        assert_eq!(
            holds(&conn),
            Grant::parse("viewer", Some("team-a-*")).unwrap()
        );
        let row = list_operators(&conn).unwrap().remove(0);
        assert_eq!(
            (
                row.role.as_str(),
                row.workspaces.as_str(),
                row.sso,
                row.cap.map(|c| c.role)
            ),
            ("viewer", "team-a-*", true, Some("operator".to_string()))
        );
        // Audited: who set the cap, from what to what.
        let set: Vec<_> = list_audit(&conn, Some("operators"), None, 20)
            .unwrap()
            .into_iter()
            .filter(|r| r.event == "admin.operator_role_set")
            .collect();
        assert_eq!(set.len(), 2);
        assert_eq!(set[0].actor, "cli:root");
        assert_eq!(
            set[0].payload,
            serde_json::json!({
                "email": "a@x.io",
                "from": { "role": "admin", "workspaces": "" },
                "to": { "role": "viewer", "workspaces": "" },
                "cap": { "from": null, "to": { "role": "viewer", "workspaces": "" } },
            })
        );
        // The record a restore re-applies names the link, not the email.
        let record = grant_narrowing(&before, &viewer, "cli:root");
        assert_eq!(record.subject, "sso:https://id.example.com\nu1");
        assert_eq!(record.from, serde_json::Value::Null);
    }

    /// A recorded `set-role` is applied again to a database that predates it, once.
    #[test]
    fn recorded_role_changes_are_reapplied_to_an_older_snapshot() {
        let (_dir, conn) = test_db();
        let token = create_operator(&conn, "o@x.io", "cli:root").unwrap();
        let viewer = Grant::parse("viewer", Some("dev-*")).unwrap();
        let before = standing(&conn, "o@x.io").unwrap();
        let record = grant_narrowing(&before, &viewer, "cli:root");
        // The snapshot (this database) predates the change: applied, audited.
        assert_eq!(
            reapply_grant(&conn, &record, 0, "stategate restore").unwrap(),
            Some("o@x.io".to_string())
        );
        let me = operator_by_token(&conn, token.as_bytes()).unwrap().unwrap();
        assert_eq!(me.grant, viewer);
        let rows = list_audit(&conn, Some("operators"), None, 20).unwrap();
        let last = rows.last().unwrap();
        assert_eq!(
            (
                last.event.as_str(),
                last.actor.as_str(),
                &last.payload["to"]["role"]
            ),
            (
                "admin.operator_role_reapplied",
                "stategate restore",
                &serde_json::json!("viewer")
            )
        );
        // Holding it already: nothing more.
        assert_eq!(
            reapply_grant(&conn, &record, 0, "stategate restore").unwrap(),
            None
        );
        // A snapshot with a later change than the record (taken after it): kept.
        let operator = Grant::parse("operator", None).unwrap();
        set_operator_grant(&conn, "o@x.io", &operator, "cli:root").unwrap();
        let later = record.at_ms / 1000 + 60;
        assert_eq!(
            reapply_grant(&conn, &record, later, "stategate restore").unwrap(),
            None
        );
        // An operator the snapshot does not have: skipped.
        let elsewhere = tokens::Narrowing {
            subject: "email:new@x.io".into(),
            ..record
        };
        assert_eq!(
            reapply_grant(&conn, &elsewhere, 0, "stategate restore").unwrap(),
            None
        );
    }

    #[test]
    fn operator_lifecycle() {
        let (_dir, conn) = test_db();
        let t1 = create_operator(&conn, "Ops@X", "cli:root").unwrap();
        assert!(t1.starts_with(OPERATOR_TOKEN_PREFIX));
        assert!(matches!(
            create_operator(&conn, "ops@x", "cli:root"),
            Err(AdminError::Exists(_))
        ));
        assert!(matches!(
            create_operator(&conn, "nope", "cli:root"),
            Err(AdminError::Invalid(_))
        ));
        let t2 = create_operator_token(&conn, "ops@x", "cli:root").unwrap();
        assert!(create_operator_token(&conn, "who@x", "cli:root").is_err());
        let me = operator_by_token(&conn, t1.as_bytes()).unwrap().unwrap();
        assert_eq!(
            (me.email.as_str(), me.actor()),
            ("ops@x", "operator:ops@x".to_string())
        );
        // A cluster-API token is not an operator token, and the other way round.
        assert_eq!(operator_by_token(&conn, b"sgo_wrong").unwrap(), None);
        assert_eq!(
            crate::cluster::identity::principal_by_token(&conn, t1.as_bytes()).unwrap(),
            None
        );

        let listed = list_operator_tokens(&conn).unwrap();
        assert_eq!(listed.len(), 2);
        let text = serde_json::to_string(&listed).unwrap();
        assert!(!text.contains(&t1) && !text.contains(&t2));
        let id1 = tokens::id_of(&tokens::hash(t1.as_bytes()));
        revoke_operator_token(&conn, &id1, &me.actor()).unwrap();
        assert!(
            revoke_operator_token(&conn, &id1, &me.actor()).is_err(),
            "already revoked"
        );
        assert!(revoke_operator_token(&conn, "x", &me.actor()).is_err());
        assert_eq!(operator_by_token(&conn, t1.as_bytes()).unwrap(), None);
        assert!(operator_by_token(&conn, t2.as_bytes()).unwrap().is_some());
        let revoked: Vec<bool> = list_operator_tokens(&conn)
            .unwrap()
            .iter()
            .map(|t| t.revoked_at.is_some())
            .collect();
        assert_eq!(revoked.iter().filter(|r| **r).count(), 1);

        let events: Vec<(String, String)> = list_audit(&conn, Some("operators"), None, 10)
            .unwrap()
            .into_iter()
            .map(|r| (r.event, r.actor))
            .collect();
        assert_eq!(
            events,
            [
                ("admin.operator_created".to_string(), "cli:root".to_string()),
                ("admin.operator_token_created".into(), "cli:root".into()),
                (
                    "admin.operator_token_revoked".into(),
                    "operator:ops@x".into()
                ),
            ]
        );
        let all = list_audit(&conn, Some("operators"), None, 10).unwrap();
        assert!(
            !serde_json::to_string(&all).unwrap().contains(&t2),
            "no token in the audit log"
        );
    }
}
