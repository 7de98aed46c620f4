//! Encryption posture of a workspace's state: is it client-encrypted by OpenTofu (the
//! envelope, whose `meta` names the key providers), plaintext, or mixed across its
//! recent versions — and the optional policy that refuses a silent downgrade (a
//! plaintext write onto a state that is encrypted now).
//!
//! The fact is recorded per version when it is written (`tf_state_encryption`, owned
//! here), in the version's own commit, from what the body scanner saw as the body
//! streamed past (`tfstate::StateScanner::encryption`): nothing is read again to
//! show it. A rollback or restore stores an old version again, so it copies that
//! version's fact ([`copy`]). Versions written before this existed, or rebuilt into a
//! new index, are "unknown" until recomputed ([`recompute`]) or the next write.

use std::collections::{BTreeSet, HashMap};

use crate::store::sql::{params, Connection};
use serde::Serialize;

use crate::names::Pattern;
use crate::tfstate::BodyEncryption;

/// The table, written once: [`SCHEMA`] and [`postgres_schema`] are made of it.
macro_rules! posture_table {
    () => {
        r#"
CREATE TABLE IF NOT EXISTS tf_state_encryption (
    workspace     TEXT    NOT NULL,
    version       INTEGER NOT NULL,
    encrypted     INTEGER NOT NULL,  -- 1: OpenTofu's encrypted envelope, 0: plaintext
    key_providers TEXT    NOT NULL,  -- JSON array of the envelope's meta keys
    PRIMARY KEY (workspace, version)
) WITHOUT ROWID;
"#
    };
}

/// The per-version facts; `crate::schema` applies it.
pub const SCHEMA: &str = concat!(
    posture_table!(),
    r#"
-- A fact goes with its version: whatever deletes a workspace's version row (retention,
-- a restore dropping a row whose blob is gone) deletes its posture in the same
-- statement, so it cannot outlive the version nor describe a later one. 'tf/' is
-- `tofu::SCOPE_PREFIX` (a test holds them together).
CREATE TRIGGER IF NOT EXISTS tf_state_encryption_follows_versions AFTER DELETE ON versions
WHEN substr(old.scope, 1, 3) = 'tf/'
BEGIN
    DELETE FROM tf_state_encryption
     WHERE workspace = substr(old.scope, 4) AND version = old.version;
END;
-- Rows of versions pruned before the trigger existed (one primary-key probe each).
DELETE FROM tf_state_encryption
 WHERE NOT EXISTS (SELECT 1 FROM versions
                    WHERE scope = 'tf/' || tf_state_encryption.workspace
                      AND version = tf_state_encryption.version);
"#
);

/// [`SCHEMA`] for PostgreSQL: the same table (`postgres_ddl` spells it), and the same
/// trigger as a function (a new database has no rows from before it to clear).
pub fn postgres_schema() -> Result<String, String> {
    Ok(crate::store::sql::postgres_ddl(posture_table!())? + POSTGRES_TRIGGER)
}

const POSTGRES_TRIGGER: &str = r#"
CREATE OR REPLACE FUNCTION tf_state_encryption_follows_versions() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF substr(OLD.scope, 1, 3) = 'tf/' THEN
        DELETE FROM tf_state_encryption
         WHERE workspace = substr(OLD.scope, 4) AND version = OLD.version;
    END IF;
    RETURN OLD;
END $$;
CREATE OR REPLACE TRIGGER tf_state_encryption_follows_versions AFTER DELETE ON versions
    FOR EACH ROW EXECUTE FUNCTION tf_state_encryption_follows_versions();
"#;

/// How many of the newest versions the posture looks at.
pub const RECENT_VERSIONS: i64 = 10;

/// Longest key provider name kept (the rest of a longer one is cut).
const MAX_PROVIDER_CHARS: usize = 128;

/// Records what version `version` of `workspace` is. Runs inside the version's commit.
pub fn record(
    conn: &Connection,
    workspace: &str,
    version: i64,
    body: &BodyEncryption,
) -> crate::store::sql::Result<()> {
    let (encrypted, providers) = match body {
        BodyEncryption::Plaintext => (false, Vec::new()),
        BodyEncryption::OpenTofu { key_providers } => (true, clean(key_providers)),
    };
    conn.prepare_cached(
        "INSERT INTO tf_state_encryption (workspace, version, encrypted, key_providers)
         VALUES (?1, ?2, ?3, ?4) ON CONFLICT (workspace, version) DO UPDATE SET
           encrypted = excluded.encrypted, key_providers = excluded.key_providers",
    )?
    .execute(params![
        workspace,
        version,
        encrypted,
        serde_json::to_string(&providers).expect("strings serialize")
    ])?;
    Ok(())
}

/// Records version `to` of `workspace` as whatever version `from` was recorded as
/// (a rollback stores `from`'s content again); nothing when `from` is not recorded.
pub fn copy(
    conn: &Connection,
    workspace: &str,
    from: i64,
    to: i64,
) -> crate::store::sql::Result<()> {
    conn.prepare_cached(
        "INSERT INTO tf_state_encryption (workspace, version, encrypted, key_providers)
         SELECT workspace, ?3, encrypted, key_providers FROM tf_state_encryption
          WHERE workspace = ?1 AND version = ?2
         ON CONFLICT (workspace, version) DO UPDATE SET
           encrypted = excluded.encrypted, key_providers = excluded.key_providers",
    )?
    .execute(params![workspace, from, to])?;
    Ok(())
}

/// Recomputes the posture of `rows` (the versions a rebuild or restore wrote into the
/// new index at `into`) from their content, which the blobs hold: nothing else
/// remembers it. Workspace versions only, tombstones and rows already recorded (a
/// restored snapshot's) skipped, one blob held at a time; a blob that does not open
/// or is not a state stays "unknown" (the rebuild reported it). Returns how many were
/// recorded. One transaction.
pub async fn recompute(
    into: &std::path::Path,
    blobs: &dyn crate::store::BlobStore,
    keys: &crate::store::rebuild::ScopeKeys,
    rows: &[crate::store::VersionRow],
) -> Result<usize, crate::store::rebuild::RebuildError> {
    let mut facts = Vec::new();
    {
        let conn = crate::store::index::open_new_file(into)?;
        for row in rows {
            let (Some(workspace), Some(blob_key)) = (
                row.scope.strip_prefix(crate::tofu::SCOPE_PREFIX),
                row.blob_key.as_deref(),
            ) else {
                continue;
            };
            if of_version(&conn, workspace, row.version)?.is_some() {
                continue;
            }
            let (Ok(key), Some(blob)) = (keys.key_for(&row.scope), blobs.get(blob_key).await?)
            else {
                continue;
            };
            let Ok(plain) = crate::store::format::decode(
                &key,
                &blob,
                &row.scope,
                row.version,
                row.sha256.as_deref(),
            ) else {
                continue;
            };
            let mut scan = crate::tfstate::StateScanner::new();
            if scan.push(&plain).is_err() {
                continue;
            }
            let body = scan.encryption();
            if scan.finish().is_ok() {
                facts.push((workspace.to_string(), row.version, body));
            }
        }
    }
    let conn = crate::store::index::open_new_file(into)?;
    let tx = conn.transaction()?;
    for (workspace, version, body) in &facts {
        record(&tx, workspace, *version, body)?;
    }
    tx.commit()?;
    Ok(facts.len())
}

/// Provider names for display: `key_provider.pbkdf2.main` → `pbkdf2.main`, control
/// characters dropped, bounded; sorted and unique.
fn clean(names: &[String]) -> Vec<String> {
    let set: BTreeSet<String> = names
        .iter()
        .map(|n| {
            n.strip_prefix("key_provider.")
                .unwrap_or(n)
                .chars()
                .filter(|c| !c.is_control())
                .take(MAX_PROVIDER_CHARS)
                .collect::<String>()
        })
        .filter(|n| !n.is_empty())
        .collect();
    set.into_iter().collect()
}

/// What one version is, when recorded.
pub fn of_version(
    conn: &Connection,
    workspace: &str,
    version: i64,
) -> crate::store::sql::Result<Option<bool>> {
    use crate::store::sql::OptionalExtension;
    conn.prepare_cached(
        "SELECT encrypted FROM tf_state_encryption WHERE workspace = ?1 AND version = ?2",
    )?
    .query_row(params![workspace, version], |r| r.get(0))
    .optional()
}

/// The posture of one workspace's recent versions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Posture {
    /// `encrypted`, `plaintext`, `mixed` (both among the recent versions) or `unknown`
    /// (none of them recorded).
    pub state: &'static str,
    /// The newest version: `encrypted`, `plaintext` or `unknown`.
    pub current: &'static str,
    /// The key providers the recent encrypted versions name (`pbkdf2.main`), sorted.
    pub key_providers: Vec<String>,
    /// How many of the recent versions are recorded.
    pub known: u32,
}

/// The posture of a workspace none of whose recent versions is recorded.
pub fn posture_unknown() -> Posture {
    Posture::unknown()
}

impl Posture {
    fn unknown() -> Posture {
        Posture {
            state: "unknown",
            current: "unknown",
            key_providers: Vec::new(),
            known: 0,
        }
    }

    /// Whether OpenTofu encrypts the state client-side, in the words the UI and the CLI
    /// both use: `yes (pbkdf2.main)`, `no`, `mixed (recent versions)`, `unknown`. ("no"
    /// is not "stored unencrypted": every version is sealed at rest all the same.)
    pub fn client_side(&self) -> String {
        match self.state {
            "encrypted" if self.key_providers.is_empty() => "yes".to_string(),
            "encrypted" => format!("yes ({})", self.key_providers.join(", ")),
            "plaintext" => "no".to_string(),
            "mixed" => "mixed (recent versions)".to_string(),
            _ => "unknown".to_string(),
        }
    }
}

/// The posture of every workspace in `latest` (name → its newest version number),
/// each judged over its newest [`RECENT_VERSIONS`] versions. One primary-key range
/// read per workspace: the cost follows the workspaces listed, not the versions kept.
pub fn postures(
    conn: &Connection,
    latest: &HashMap<String, i64>,
) -> crate::store::sql::Result<HashMap<String, Posture>> {
    let mut stmt = conn.prepare_cached(
        "SELECT version, encrypted, key_providers FROM tf_state_encryption
          WHERE workspace = ?1 AND version > ?2 AND version <= ?3",
    )?;
    let mut out = HashMap::new();
    for (workspace, &newest) in latest {
        let rows = stmt.query_map(params![workspace, newest - RECENT_VERSIONS, newest], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, bool>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?;
        let (mut enc, mut plain, mut known) = (false, false, 0u32);
        let mut providers = BTreeSet::new();
        let mut current = None;
        for row in rows {
            let (version, encrypted, names) = row?;
            if encrypted {
                enc = true;
                let names: Vec<String> = serde_json::from_str(&names).unwrap_or_default();
                providers.extend(names);
            } else {
                plain = true;
            }
            known += 1;
            if version == newest {
                current = Some(encrypted);
            }
        }
        if known == 0 {
            continue;
        }
        let state = match (enc, plain) {
            (true, true) => "mixed",
            (true, false) => "encrypted",
            _ => "plaintext",
        };
        let posture = Posture {
            state,
            current: match current {
                Some(true) => "encrypted",
                Some(false) => "plaintext",
                None => "unknown",
            },
            key_providers: providers.into_iter().collect(),
            known,
        };
        out.insert(workspace.clone(), posture);
    }
    Ok(out)
}

/// The posture of one workspace whose newest version is `newest` (`None`: no state).
pub fn posture(
    conn: &Connection,
    workspace: &str,
    newest: Option<i64>,
) -> crate::store::sql::Result<Posture> {
    let Some(newest) = newest else {
        return Ok(Posture::unknown());
    };
    let latest = HashMap::from([(workspace.to_string(), newest)]);
    Ok(postures(conn, &latest)?
        .remove(workspace)
        .unwrap_or_else(Posture::unknown))
}

/// `tofu.refuse_plaintext_after_encrypted`: the workspaces (patterns) on which a
/// plaintext write, or a rollback to a plaintext version, onto an encrypted current
/// state is refused.
#[derive(Debug, Clone, Default)]
pub struct DowngradePolicy(Vec<Pattern>);

impl DowngradePolicy {
    /// Parses the configured patterns; the error names the one that is not a pattern.
    pub fn parse(patterns: &[String]) -> Result<DowngradePolicy, String> {
        patterns
            .iter()
            .map(|p| {
                Pattern::parse(p)
                    .map_err(|e| format!("tofu.refuse_plaintext_after_encrypted: {p:?}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(DowngradePolicy)
    }

    pub fn applies(&self, workspace: &str) -> bool {
        self.0.iter().any(|p| p.matches(workspace))
    }
}

/// Would this successor of the current state be a downgrade the policy refuses — a
/// state write, or a rollback storing an old version again? `current_encrypted` is
/// what the newest live version was recorded as, `successor_encrypted` what the new
/// one is (`None`: not recorded, which never refuses, as an unjudgeable row never
/// refuses in `guard::decide_successor`).
pub fn is_refused_downgrade(
    policy: &DowngradePolicy,
    workspace: &str,
    current_encrypted: Option<bool>,
    successor_encrypted: Option<bool>,
) -> bool {
    policy.applies(workspace) && is_downgrade(current_encrypted, successor_encrypted)
}

/// The rule itself, for a caller that already knows the policy covers the workspace.
pub fn is_downgrade(current_encrypted: Option<bool>, successor_encrypted: Option<bool>) -> bool {
    current_encrypted == Some(true) && successor_encrypted == Some(false)
}

/// Whether a body is OpenTofu's encrypted envelope, as the rule above takes it.
pub fn is_encrypted(body: &BodyEncryption) -> bool {
    matches!(body, BodyEncryption::OpenTofu { .. })
}

#[cfg(test)]
mod tests {
    #[test]
    fn postgresql_gets_the_same_table() {
        let ddl = postgres_schema().unwrap();
        for column in [
            "workspace     TEXT COLLATE \"C\"    NOT NULL",
            "version       BIGINT NOT NULL",
            "encrypted     BIGINT NOT NULL",
            "key_providers TEXT COLLATE \"C\"    NOT NULL",
        ] {
            assert!(ddl.contains(column), "{column} in {ddl}");
        }
        assert!(!ddl.contains("WITHOUT ROWID"), "{ddl}");
        assert!(ddl.contains("EXECUTE FUNCTION tf_state_encryption_follows_versions()"));
    }

    use super::*;

    /// Every schema (the posture's trigger is on `versions`).
    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        for schema in crate::schema::ALL {
            c.execute_batch(schema).unwrap();
        }
        c
    }

    fn version_row(c: &Connection, scope: &str, version: i64) {
        c.execute(
            "INSERT INTO versions (scope, version, size, blob_key, created_at, actor)
             VALUES (?1, ?2, 1, 'k', '2026-01-01T00:00:00Z', 't')",
            params![scope, version],
        )
        .unwrap();
    }

    fn recorded(c: &Connection) -> Vec<(String, i64)> {
        let mut stmt = c
            .prepare("SELECT workspace, version FROM tf_state_encryption ORDER BY 1, 2")
            .unwrap();
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        rows
    }

    #[test]
    fn a_deleted_version_takes_its_posture_with_it() {
        let c = db();
        for (ws, v) in [("a", 1), ("a", 2), ("a", 3), ("b", 1)] {
            version_row(&c, &crate::tofu::scope(ws), v);
            record(&c, ws, v, &BodyEncryption::Plaintext).unwrap();
        }
        // A non-workspace scope whose tail looks like a workspace is not one.
        version_row(&c, "cluster/a", 1);
        // (deleted (scope, version), posture rows left)
        type Row = (Vec<(String, i64)>, Vec<(&'static str, i64)>);
        let rows: Vec<Row> = vec![
            (
                vec![("cluster/a".into(), 1)],
                vec![("a", 1), ("a", 2), ("a", 3), ("b", 1)],
            ),
            (
                vec![(crate::tofu::scope("a"), 1)],
                vec![("a", 2), ("a", 3), ("b", 1)],
            ),
            (
                vec![(crate::tofu::scope("a"), 2), (crate::tofu::scope("b"), 1)],
                vec![("a", 3)],
            ),
        ];
        for (deleted, left) in rows {
            for (scope, v) in &deleted {
                c.execute(
                    "DELETE FROM versions WHERE scope = ?1 AND version = ?2",
                    params![scope, v],
                )
                .unwrap();
            }
            let want: Vec<(String, i64)> = left.iter().map(|(w, v)| (w.to_string(), *v)).collect();
            assert_eq!(recorded(&c), want, "after deleting {deleted:?}");
        }
        // Rows of versions deleted before the trigger existed go when the schema is applied.
        c.execute_batch("DROP TRIGGER tf_state_encryption_follows_versions")
            .unwrap();
        c.execute("DELETE FROM versions WHERE scope = 'tf/a'", [])
            .unwrap();
        assert_eq!(recorded(&c), [("a".to_string(), 3)]);
        c.execute_batch(SCHEMA).unwrap();
        assert_eq!(recorded(&c), Vec::<(String, i64)>::new());
    }

    fn enc(names: &[&str]) -> BodyEncryption {
        BodyEncryption::OpenTofu {
            key_providers: names.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn posture_is_judged_over_the_recent_versions() {
        let c = db();
        let plain = BodyEncryption::Plaintext;
        // (workspace, versions written oldest first, state, current, providers)
        type Row<'a> = (&'a str, Vec<BodyEncryption>, &'a str, &'a str, Vec<&'a str>);
        let rows: Vec<Row> = vec![
            (
                "a",
                vec![enc(&["key_provider.pbkdf2.k"]); 3],
                "encrypted",
                "encrypted",
                vec!["pbkdf2.k"],
            ),
            (
                "b",
                vec![plain.clone(), plain.clone()],
                "plaintext",
                "plaintext",
                vec![],
            ),
            (
                "c",
                vec![plain.clone(), enc(&["key_provider.aws_kms.x"])],
                "mixed",
                "encrypted",
                vec!["aws_kms.x"],
            ),
            (
                "d",
                vec![enc(&["key_provider.pbkdf2.k"]), plain.clone()],
                "mixed",
                "plaintext",
                vec!["pbkdf2.k"],
            ),
            // A plaintext version older than the recent window no longer counts.
            (
                "e",
                std::iter::once(plain.clone())
                    .chain(std::iter::repeat_n(
                        enc(&["key_provider.pbkdf2.new"]),
                        RECENT_VERSIONS as usize,
                    ))
                    .collect(),
                "encrypted",
                "encrypted",
                vec!["pbkdf2.new"],
            ),
        ];
        let mut latest = HashMap::new();
        for (ws, versions, ..) in &rows {
            for (i, v) in versions.iter().enumerate() {
                record(&c, ws, i as i64 + 1, v).unwrap();
            }
            latest.insert(ws.to_string(), versions.len() as i64);
        }
        // A workspace whose newest version was never recorded is unknown now.
        latest.insert("b2".into(), 3);
        record(&c, "b2", 1, &plain).unwrap();
        let all = postures(&c, &latest).unwrap();
        for (ws, _, state, current, providers) in &rows {
            let p = &all[*ws];
            assert_eq!((p.state, p.current), (*state, *current), "{ws}");
            assert_eq!(p.key_providers, *providers, "{ws}");
        }
        assert_eq!(all["b2"].current, "unknown");
        assert_eq!(posture(&c, "zzz", Some(4)).unwrap().state, "unknown");
        assert_eq!(posture(&c, "a", None).unwrap().state, "unknown");
        assert_eq!(all["a"].client_side(), "yes (pbkdf2.k)");
        assert_eq!(of_version(&c, "d", 2).unwrap(), Some(false));
        assert_eq!(of_version(&c, "d", 9).unwrap(), None);
    }

    #[test]
    fn posture_reads_use_the_primary_key() {
        let c = db();
        for sql in [
            "SELECT version, encrypted, key_providers FROM tf_state_encryption WHERE workspace = ?1 AND version > ?2 AND version <= ?3",
            "SELECT encrypted FROM tf_state_encryption WHERE workspace = ?1 AND version = ?2",
        ] {
            let plan = crate::store::db::query_plan(&c, sql).join(" / ");
            assert!(plan.starts_with("SEARCH"), "{sql}: {plan}");
        }
    }

    #[test]
    fn the_downgrade_policy_refuses_only_plaintext_onto_an_encrypted_current_state() {
        let policy = DowngradePolicy::parse(&["prod-*".into()]).unwrap();
        let plain = BodyEncryption::Plaintext;
        // (workspace, current recorded, sent, refused)
        let rows = [
            ("prod-a", Some(true), plain.clone(), true),
            ("prod-a", Some(true), enc(&["k"]), false),
            ("prod-a", Some(false), plain.clone(), false),
            ("prod-a", None, plain.clone(), false),
            ("dev-a", Some(true), plain.clone(), false),
        ];
        for (ws, current, sent, refused) in rows {
            assert_eq!(
                is_refused_downgrade(&policy, ws, current, Some(is_encrypted(&sent))),
                refused,
                "{ws} {current:?} {sent:?}"
            );
        }
        // A rollback's target whose posture is not recorded is not judged.
        assert!(!is_refused_downgrade(&policy, "prod-a", Some(true), None));
        let err = DowngradePolicy::parse(&["prod/*".into()]).unwrap_err();
        assert!(
            err.contains("prod/*") && err.contains("refuse_plaintext"),
            "{err}"
        );
    }
}
