//! Who is calling: orgs, principals (email, org, role) and their bearer tokens, and
//! the clusters registered to each org.
//!
//! Tokens are issued, stored (as hashes), looked up and revoked by `crate::tokens`
//! (kind `principal`, prefix `sgp_`); this module says whom they belong to. Every
//! function here takes a plain `&Connection`: the server runs them through `Db`, the
//! admin CLI the same way, and unit tests on an in-memory database.

use crate::store::sql::{params, Connection, OptionalExtension};

use crate::store::audit::{insert_audit, AuditEntry};
use crate::store::DbError;
use crate::tokens::{self, Kind, NewToken, TokenError};

/// Tables of the cluster API (identities here, leases in `lease.rs`); `crate::schema` applies them.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS orgs (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL UNIQUE,
    created_at  TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS principals (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    email       TEXT NOT NULL UNIQUE,
    org_id      INTEGER NOT NULL REFERENCES orgs(id),
    role        TEXT NOT NULL CHECK (role IN ('admin', 'member')),
    created_at  TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS clusters (
    id          TEXT PRIMARY KEY,        -- lowercase hyphenated UUID
    org_id      INTEGER NOT NULL REFERENCES orgs(id),
    name        TEXT,
    created_at  TEXT NOT NULL
) WITHOUT ROWID;

-- Disabled principals: their tokens stop working; the row (and the audit trail) stays.
CREATE TABLE IF NOT EXISTS principals_disabled (
    principal_id INTEGER PRIMARY KEY REFERENCES principals(id),
    disabled_at  TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS cluster_leases (
    cluster_id   TEXT PRIMARY KEY REFERENCES clusters(id),
    holder_id    INTEGER NOT NULL REFERENCES principals(id),
    operation    TEXT NOT NULL,
    host         TEXT NOT NULL,
    acquired_at  INTEGER NOT NULL,       -- Unix seconds, from the server's clock
    heartbeat_at INTEGER NOT NULL
) WITHOUT ROWID;
"#;

/// Prefix of every principal token (makes leaked tokens easy to grep for).
pub const TOKEN_PREFIX: &str = Kind::Principal.prefix();

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Admin,
    Member,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Member => "member",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "admin" => Some(Role::Admin),
            "member" => Some(Role::Member),
            _ => None,
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub id: i64,
    pub email: String,
    pub org_id: i64,
    pub org: String,
    pub role: Role,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClusterRow {
    pub id: String,
    pub org: String,
    pub name: Option<String>,
    pub created_at: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Exists(String),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("no randomness available from the OS: {0}")]
    Random(String),
}

impl From<crate::store::sql::Error> for AdminError {
    fn from(e: crate::store::sql::Error) -> Self {
        AdminError::Db(DbError::Sql(e))
    }
}

impl From<TokenError> for AdminError {
    fn from(e: TokenError) -> Self {
        match e {
            TokenError::BadId => AdminError::Invalid(e.to_string()),
            TokenError::NotFound { .. } => AdminError::NotFound(e.to_string()),
            TokenError::Random(detail) => AdminError::Random(detail),
            TokenError::Sql(e) => AdminError::from(e),
        }
    }
}

/// The principal a token belongs to. Looked up by hash: the token never reaches SQL.
pub fn principal_by_token(
    conn: &Connection,
    token: &[u8],
) -> Result<Option<Principal>, crate::store::sql::Error> {
    let Some(id) =
        tokens::live(conn, Kind::Principal, token, tokens::now())?.and_then(|live| live.owner_id)
    else {
        return Ok(None);
    };
    conn.prepare_cached(
        "SELECT p.id, p.email, p.org_id, o.name, p.role
           FROM principals p
           JOIN orgs o ON o.id = p.org_id
          WHERE p.id = ?1
            AND NOT EXISTS (SELECT 1 FROM principals_disabled d WHERE d.principal_id = p.id)",
    )?
    .query_row([id], |r| {
        let role: String = r.get(4)?;
        Ok(Principal {
            id: r.get(0)?,
            email: r.get(1)?,
            org_id: r.get(2)?,
            org: r.get(3)?,
            role: Role::parse(&role).unwrap_or(Role::Member),
        })
    })
    .optional()
}

/// Is `cluster_id` registered to `org_id`? One indexed lookup whether the cluster is
/// missing or belongs to another org: both answer `false` after the same work.
pub fn cluster_in_org(
    conn: &Connection,
    cluster_id: &str,
    org_id: i64,
) -> Result<bool, crate::store::sql::Error> {
    conn.query_row(
        "SELECT count(*) FROM clusters WHERE id = ?1 AND org_id = ?2",
        params![cluster_id, org_id],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}

/// A plausible email address, lowercased. Not a full RFC 5322 check: one `@`, no
/// whitespace or control characters, something on both sides, at most 254 bytes.
pub fn normalize_email(email: &str) -> Result<String, AdminError> {
    let email = email.trim().to_ascii_lowercase();
    let ok = email.len() <= 254
        && email.split('@').count() == 2
        && email.split('@').all(|part| !part.is_empty())
        && !email.chars().any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(email)
    } else {
        Err(AdminError::Invalid(format!(
            "invalid email address {email:?}"
        )))
    }
}

fn org_id(conn: &Connection, name: &str) -> Result<i64, AdminError> {
    conn.query_row("SELECT id FROM orgs WHERE name = ?1", [name], |r| r.get(0))
        .optional()?
        .ok_or_else(|| AdminError::NotFound(format!("no org named {name:?}")))
}

/// An audit row of an admin-CLI change in `org`.
fn admin_audit(
    conn: &Connection,
    org: &str,
    scope: String,
    event: &'static str,
    payload: serde_json::Value,
) -> Result<(), AdminError> {
    audit_as(conn, "admin-cli", org, scope, event, payload)
}

pub fn create_org(conn: &Connection, name: &str) -> Result<(), AdminError> {
    crate::names::validate_org(name)
        .map_err(|e| AdminError::Invalid(format!("{e} (got {name:?})")))?;
    let inserted = conn.execute(
        "INSERT INTO orgs (name, created_at) VALUES (?1, ?2) ON CONFLICT (name) DO NOTHING",
        params![name, crate::store::now_rfc3339()],
    )?;
    if inserted == 0 {
        return Err(AdminError::Exists(format!("org {name:?} already exists")));
    }
    admin_audit(
        conn,
        name,
        format!("org/{name}"),
        "admin.org_created",
        serde_json::json!({}),
    )
}

pub fn list_orgs(conn: &Connection) -> Result<Vec<(String, String)>, AdminError> {
    let mut stmt = conn.prepare("SELECT name, created_at FROM orgs ORDER BY name")?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

fn insert_token(conn: &Connection, principal_id: i64) -> Result<String, AdminError> {
    let issued = tokens::issue(
        conn,
        NewToken {
            kind: Kind::Principal,
            owner_id: Some(principal_id),
            parent: None,
            expires_at: None,
        },
    )?;
    Ok(issued.secret)
}

/// Creates a principal and its first token. Returns the token: the only time it exists in clear.
pub fn create_principal(
    conn: &Connection,
    org: &str,
    email: &str,
    role: Role,
) -> Result<String, AdminError> {
    let email = normalize_email(email)?;
    let org_id = org_id(conn, org)?;
    let inserted: Option<i64> = conn
        .query_row(
            "INSERT INTO principals (email, org_id, role, created_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (email) DO NOTHING RETURNING id",
            params![email, org_id, role.as_str(), crate::store::now_rfc3339()],
            |r| r.get(0),
        )
        .optional()?;
    let Some(principal) = inserted else {
        return Err(AdminError::Exists(format!(
            "a user with email {email:?} already exists (use `admin token create` for another token)"
        )));
    };
    let token = insert_token(conn, principal)?;
    admin_audit(
        conn,
        org,
        format!("org/{org}"),
        "admin.user_created",
        serde_json::json!({ "email": email, "role": role.as_str() }),
    )?;
    Ok(token)
}

/// An additional token for an existing principal (earlier tokens stay valid).
pub fn create_token(conn: &Connection, email: &str) -> Result<String, AdminError> {
    let email = normalize_email(email)?;
    let (id, org): (i64, String) = conn
        .query_row(
            "SELECT p.id, o.name FROM principals p JOIN orgs o ON o.id = p.org_id WHERE p.email = ?1",
            [&email],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?
        .ok_or_else(|| AdminError::NotFound(format!("no user with email {email:?}")))?;
    let token = insert_token(conn, id)?;
    admin_audit(
        conn,
        &org,
        format!("org/{org}"),
        "admin.token_created",
        serde_json::json!({ "email": email }),
    )?;
    Ok(token)
}

/// Registers a cluster. `id` re-registers a known UUID (e.g. after `index rebuild`
/// restored its state versions); otherwise a new one is generated.
pub fn create_cluster(
    conn: &Connection,
    org: &str,
    name: Option<&str>,
    id: Option<&str>,
) -> Result<ClusterRow, AdminError> {
    let id = match id {
        Some(given) => uuid::Uuid::parse_str(given)
            .map_err(|_| AdminError::Invalid(format!("cluster id {given:?} is not a UUID")))?,
        None => uuid::Uuid::new_v4(),
    };
    if let Some(name) = name {
        if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
            return Err(AdminError::Invalid(
                "cluster name must be 1-128 printable characters".into(),
            ));
        }
    }
    let org_id = org_id(conn, org)?;
    let row = ClusterRow {
        id: id.hyphenated().to_string(),
        org: org.to_string(),
        name: name.map(str::to_string),
        created_at: crate::store::now_rfc3339(),
    };
    conn.execute(
        "INSERT INTO clusters (id, org_id, name, created_at) VALUES (?1, ?2, ?3, ?4)",
        params![row.id, org_id, row.name, row.created_at],
    )?;
    admin_audit(
        conn,
        org,
        super::scope(&row.id),
        "admin.cluster_created",
        serde_json::json!({ "name": row.name }),
    )?;
    Ok(row)
}

pub fn list_clusters(conn: &Connection, org: Option<&str>) -> Result<Vec<ClusterRow>, AdminError> {
    if let Some(org) = org {
        org_id(conn, org)?; // a typo is an error, not an empty list
    }
    let mut stmt = conn.prepare(
        "SELECT c.id, o.name, c.name, c.created_at FROM clusters c JOIN orgs o ON o.id = c.org_id
          WHERE CAST(?1 AS TEXT) IS NULL OR o.name = ?1 ORDER BY o.name, c.created_at, c.id",
    )?;
    let rows = stmt
        .query_map([org], |r| {
            Ok(ClusterRow {
                id: r.get(0)?,
                org: r.get(1)?,
                name: r.get(2)?,
                created_at: r.get(3)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// A stored token as listings show it: never the token, only its id.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TokenRow {
    pub id: String,
    pub email: String,
    pub created_at: String,
    /// A revoked token keeps its row (`tokens`' one revoke rule), so it is listed with this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
}

/// An audit row of a change in `org`, by `actor`.
fn audit_as(
    conn: &Connection,
    actor: &str,
    org: &str,
    scope: String,
    event: &'static str,
    payload: serde_json::Value,
) -> Result<(), AdminError> {
    insert_audit(
        conn,
        &AuditEntry::new(actor, scope, event, payload).in_org(org),
    )?;
    Ok(())
}

fn principal_by_email(conn: &Connection, email: &str) -> Result<(i64, String, String), AdminError> {
    let email = normalize_email(email)?;
    conn.query_row(
        "SELECT p.id, o.name, p.role FROM principals p JOIN orgs o ON o.id = p.org_id WHERE p.email = ?1",
        [&email],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .optional()?
    .ok_or_else(|| AdminError::NotFound(format!("no user with email {email:?}")))
}

/// Changes a user's role; audited as `admin.user_role_changed` by `actor`. Returns
/// `false` (nothing written) when the user already has it.
pub fn set_role(
    conn: &Connection,
    email: &str,
    role: Role,
    actor: &str,
) -> Result<bool, AdminError> {
    let (id, org, old) = principal_by_email(conn, email)?;
    if old == role.as_str() {
        return Ok(false);
    }
    conn.execute(
        "UPDATE principals SET role = ?1 WHERE id = ?2",
        params![role.as_str(), id],
    )?;
    let payload =
        serde_json::json!({ "email": normalize_email(email)?, "from": old, "to": role.as_str() });
    audit_as(
        conn,
        actor,
        &org,
        format!("org/{org}"),
        "admin.user_role_changed",
        payload,
    )?;
    Ok(true)
}

/// The unrevoked tokens of the user `email`: what [`disable_principal`] revokes (the
/// CLI records them in the store first).
pub fn principal_tokens_to_revoke(
    conn: &Connection,
    email: &str,
) -> Result<Vec<tokens::Found>, AdminError> {
    let (id, _, _) = principal_by_email(conn, email)?;
    Ok(tokens::unrevoked_of(conn, Kind::Principal, id)?)
}

/// Disables a user: every token of theirs is revoked at once (so a restore that brings
/// back an older `principals_disabled` still knows them revoked; leases they hold stay
/// until broken or stale). Audited as `admin.user_disabled`. `false` when already disabled.
pub fn disable_principal(conn: &Connection, email: &str, actor: &str) -> Result<bool, AdminError> {
    let (id, org, _) = principal_by_email(conn, email)?;
    let inserted = conn.execute(
        "INSERT INTO principals_disabled (principal_id, disabled_at) VALUES (?1, ?2)
         ON CONFLICT (principal_id) DO NOTHING",
        params![id, crate::store::now_rfc3339()],
    )?;
    if inserted == 0 {
        return Ok(false);
    }
    let at = crate::store::now_rfc3339();
    for token in tokens::unrevoked_of(conn, Kind::Principal, id)? {
        tokens::revoke(conn, &token.sha256, &at)?;
    }
    let payload = serde_json::json!({ "email": normalize_email(email)? });
    audit_as(
        conn,
        actor,
        &org,
        format!("org/{org}"),
        "admin.user_disabled",
        payload,
    )?;
    Ok(true)
}

/// Users' tokens (ids only, revoked ones included), optionally of one user.
pub fn list_principal_tokens(
    conn: &Connection,
    email: Option<&str>,
) -> Result<Vec<TokenRow>, AdminError> {
    let email = email.map(normalize_email).transpose()?;
    let emails = principal_emails(conn)?;
    let mut rows: Vec<TokenRow> = tokens::list(conn, Kind::Principal)?
        .into_iter()
        .filter_map(|t| {
            let owner = emails.get(&t.owner_id?)?;
            Some(TokenRow {
                id: t.id,
                email: owner.clone(),
                created_at: t.created_at,
                revoked_at: t.revoked_at,
            })
        })
        .filter(|t| email.as_ref().is_none_or(|e| *e == t.email))
        .collect();
    rows.sort_by(|a, b| (&a.email, &a.created_at).cmp(&(&b.email, &b.created_at)));
    Ok(rows)
}

fn principal_emails(
    conn: &Connection,
) -> Result<std::collections::HashMap<i64, String>, crate::store::sql::Error> {
    let mut stmt = conn.prepare("SELECT id, email FROM principals")?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect();
    rows
}

/// The unrevoked user token `id` names, with its user's email and org: what
/// [`revoke_principal_token`] revokes (the CLI records it in the store first).
pub fn principal_token_to_revoke(
    conn: &Connection,
    id: &str,
) -> Result<(tokens::Found, String, String), AdminError> {
    let found = tokens::find_unrevoked(conn, Kind::Principal, id, "user token")?;
    let owner = found.owner_id.unwrap_or_default();
    let (email, org): (String, String) = conn
        .query_row(
            "SELECT p.email, o.name FROM principals p JOIN orgs o ON o.id = p.org_id WHERE p.id = ?1",
            [owner],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?
        .ok_or_else(|| AdminError::NotFound(format!("no user token with id {}", found.id())))?;
    Ok((found, email, org))
}

/// Revokes one user token by id (the row stays, with `revoked_at`); audited as
/// `admin.token_revoked`.
pub fn revoke_principal_token(conn: &Connection, id: &str, actor: &str) -> Result<(), AdminError> {
    let (found, email, org) = principal_token_to_revoke(conn, id)?;
    tokens::revoke(conn, &found.sha256, &crate::store::now_rfc3339())?;
    let payload = serde_json::json!({ "email": email, "token_id": found.id() });
    audit_as(
        conn,
        actor,
        &org,
        format!("org/{org}"),
        "admin.token_revoked",
        payload,
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::audit::list_audit;

    /// A temp database with every real schema, as the server opens it.
    pub(crate) fn test_db() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        drop(crate::schema::open_db(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        (dir, conn)
    }

    #[test]
    fn tokens_are_random_prefixed_and_hashed() {
        let (_dir, conn) = test_db();
        create_org(&conn, "acme").unwrap();
        let a = create_principal(&conn, "acme", "a@x", Role::Member).unwrap();
        let b = create_token(&conn, "a@x").unwrap();
        assert_ne!(a, b);
        assert!(
            a.starts_with(TOKEN_PREFIX) && a.len() == TOKEN_PREFIX.len() + 43,
            "{a}"
        );
        assert_eq!(Kind::Principal.prefix(), TOKEN_PREFIX);
        assert_eq!(tokens::hash(a.as_bytes()).len(), 64);
        assert_ne!(tokens::hash(a.as_bytes()), tokens::hash(b.as_bytes()));
    }

    #[test]
    fn emails() {
        let emails: &[(&str, Option<&str>)] = &[
            ("Alice@Example.COM", Some("alice@example.com")),
            (" bob@x ", Some("bob@x")),
            ("bob", None),
            ("@x", None),
            ("a@", None),
            ("a@b@c", None),
            ("a b@c", None),
            ("a\u{7}@c", None),
        ];
        for (email, expected) in emails {
            assert_eq!(
                normalize_email(email).ok().as_deref(),
                *expected,
                "{email:?}"
            );
        }
    }

    #[test]
    fn a_known_cluster_id_can_be_registered_again() {
        // After `index rebuild` restored a cluster's versions, its UUID is registered again.
        let (_dir, conn) = test_db();
        create_org(&conn, "acme").unwrap();
        let known = "1b4e28ba-2fa1-11d2-883f-0016d3cca427";
        let row = create_cluster(&conn, "acme", None, Some(&known.to_uppercase())).unwrap();
        assert_eq!(row.id, known);
        assert!(create_cluster(&conn, "acme", None, Some("not-a-uuid")).is_err());
        assert!(
            create_cluster(&conn, "acme", None, Some(known)).is_err(),
            "taken"
        );
    }

    #[test]
    fn identity_lifecycle() {
        let (_dir, conn) = test_db();
        create_org(&conn, "acme").unwrap();
        assert!(matches!(
            create_org(&conn, "acme"),
            Err(AdminError::Exists(_))
        ));
        assert!(matches!(
            create_org(&conn, "ac/me"),
            Err(AdminError::Invalid(_))
        ));
        assert!(matches!(
            create_principal(&conn, "nope", "a@x", Role::Admin),
            Err(AdminError::NotFound(_))
        ));
        let token = create_principal(&conn, "acme", "Alice@X", Role::Admin).unwrap();
        assert!(matches!(
            create_principal(&conn, "acme", "alice@x", Role::Member),
            Err(AdminError::Exists(_))
        ));
        let p = principal_by_token(&conn, token.as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(
            (p.email.as_str(), p.org.as_str(), p.role),
            ("alice@x", "acme", Role::Admin)
        );
        let second = create_token(&conn, "alice@x").unwrap();
        assert_eq!(
            principal_by_token(&conn, second.as_bytes()).unwrap(),
            Some(p.clone())
        );
        assert_eq!(principal_by_token(&conn, b"sgp_wrong").unwrap(), None);
        // Only hashes are stored.
        let stored: Vec<String> = conn
            .prepare("SELECT sha256 FROM tokens WHERE kind = 'principal'")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(!stored.iter().any(|s| s == &token || s == &second));
        assert!(stored.contains(&tokens::hash(token.as_bytes())));

        create_org(&conn, "other").unwrap();
        let c = create_cluster(&conn, "acme", Some("prod"), None).unwrap();
        assert!(uuid::Uuid::parse_str(&c.id).is_ok());
        assert!(cluster_in_org(&conn, &c.id, p.org_id).unwrap());
        let other_id: i64 = conn
            .query_row("SELECT id FROM orgs WHERE name = 'other'", [], |r| r.get(0))
            .unwrap();
        assert!(!cluster_in_org(&conn, &c.id, other_id).unwrap());
        assert_eq!(list_clusters(&conn, Some("acme")).unwrap(), vec![c.clone()]);
        assert!(list_clusters(&conn, Some("other")).unwrap().is_empty());
        assert!(list_clusters(&conn, Some("typo")).is_err());
        assert_eq!(list_clusters(&conn, None).unwrap().len(), 1);

        let events: Vec<String> = list_audit(&conn, None, None, 100)
            .unwrap()
            .into_iter()
            .map(|r| r.event)
            .collect();
        assert_eq!(
            events,
            [
                "admin.org_created",
                "admin.user_created",
                "admin.token_created",
                "admin.org_created",
                "admin.cluster_created"
            ]
        );
        let last = list_audit(&conn, Some(&format!("cluster/{}", c.id)), None, 1).unwrap();
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].payload, serde_json::json!({"name": "prod"}));
        assert_eq!(
            list_audit(&conn, None, Some("admin.org_created"), 1).unwrap()[0].scope,
            "org/other"
        );
    }

    #[test]
    fn roles_disabling_and_token_revocation() {
        let (_dir, conn) = test_db();
        create_org(&conn, "acme").unwrap();
        let t1 = create_principal(&conn, "acme", "a@x", Role::Member).unwrap();
        let t2 = create_token(&conn, "a@x").unwrap();
        assert!(set_role(&conn, "A@x", Role::Admin, "operator:o@x").unwrap());
        assert!(!set_role(&conn, "a@x", Role::Admin, "operator:o@x").unwrap());
        let p = principal_by_token(&conn, t1.as_bytes()).unwrap().unwrap();
        assert_eq!(p.role, Role::Admin);
        assert!(set_role(&conn, "nobody@x", Role::Admin, "o").is_err());

        let listed = list_principal_tokens(&conn, Some("a@x")).unwrap();
        assert_eq!(listed.len(), 2);
        let id1 = tokens::id_of(&tokens::hash(t1.as_bytes()));
        assert!(listed.iter().any(|t| t.id == id1));
        assert!(!serde_json::to_string(&listed).unwrap().contains(&t1));
        // (id, accepted)
        for (id, ok) in [
            ("zz", false),
            ("0123456789ab", false),
            (id1.as_str(), true),
            (id1.as_str(), false),
        ] {
            assert_eq!(
                revoke_principal_token(&conn, id, "operator:o@x").is_ok(),
                ok,
                "{id}"
            );
        }
        assert_eq!(principal_by_token(&conn, t1.as_bytes()).unwrap(), None);
        assert!(principal_by_token(&conn, t2.as_bytes()).unwrap().is_some());
        // The revoked token keeps its row: listings (and so the audit trail) still name it.
        let listed = list_principal_tokens(&conn, Some("a@x")).unwrap();
        let revoked: Vec<&str> = listed
            .iter()
            .filter(|t| t.revoked_at.is_some())
            .map(|t| t.id.as_str())
            .collect();
        assert_eq!((listed.len(), revoked), (2, vec![id1.as_str()]));

        assert!(disable_principal(&conn, "a@x", "operator:o@x").unwrap());
        assert!(!disable_principal(&conn, "a@x", "operator:o@x").unwrap());
        assert_eq!(principal_by_token(&conn, t2.as_bytes()).unwrap(), None);

        let audited: Vec<(String, String)> = list_audit(&conn, None, None, 3)
            .unwrap()
            .into_iter()
            .map(|r| (r.event, r.actor))
            .collect();
        let by = |e: &str| (e.to_string(), "operator:o@x".to_string());
        assert_eq!(
            audited,
            [
                by("admin.user_role_changed"),
                by("admin.token_revoked"),
                by("admin.user_disabled")
            ]
        );
    }
}
