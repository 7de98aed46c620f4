//! Who may do what: an operator's role (`viewer`, `operator`, `admin`) and the
//! workspace patterns it is limited to, and the one rule over them, [`may`]. Pure:
//! the rule is decided here once (with a table test) and enforced in one place by the
//! HTTP edge before any operation runs (`http::guard`), for the admin API and the web
//! UI alike. The CLI on the server's own data dir is the root and asks nothing here.
//!
//! The roles nest: a viewer has masked reads, diffs, history, the audit log, search
//! and the drift list; an operator adds force-unlock, rollback, restore, drift runs and
//! approvals; an admin adds unmasked reads (reveal, download) and the management of
//! operators, tokens, backups and the keyring.

use std::fmt;

pub use crate::names::{InvalidPattern, Pattern};

/// Most patterns one operator may be limited to.
pub const MAX_PATTERNS: usize = 32;

/// An operator's role. The order is the nesting: each role can do all the one before can.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Viewer,
    Operator,
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// A role by name; the error names the three there are (never echoes the input).
    pub fn parse(text: &str) -> Result<Role, InvalidGrant> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == text.trim())
            .ok_or(InvalidGrant::Role)
    }

    /// The least role an action needs.
    fn least_for(action: Action) -> Role {
        match action {
            Action::Read => Role::Viewer,
            Action::Operate => Role::Operator,
            Action::Reveal | Action::Administer => Role::Admin,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a route does, as far as permission goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Masked reads: workspaces, versions (masked), diffs, history, rollback previews,
    /// the audit log, search, clusters, drift runs and checks.
    Read,
    /// Changes to a workspace: force-unlock, rollback, restore, allowing one guarded write, drift run and approve.
    Operate,
    /// Unmasked state leaving the server: reveal, download, `versions/{n}` unmasked.
    Reveal,
    /// Credentials, issued workspace tokens and the keyring over HTTP; operators and
    /// backups (the CLI today).
    Administer,
}

/// What an action is aimed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// One workspace: only an operator whose patterns match it.
    Workspace(&'a str),
    /// A listing across workspaces, filtered to what the operator may see
    /// ([`Grant::sees`]): allowed to anyone with the action.
    Listing,
    /// Something that belongs to no workspace (the clusters, the operators): only an
    /// operator not limited to workspace patterns.
    Site,
}

/// Why a role or pattern was refused. The messages state the rule, never the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidGrant {
    #[error("unknown role: use viewer, operator or admin")]
    Role,
    #[error("{0}")]
    Pattern(#[from] InvalidPattern),
    #[error("too many workspace patterns (at most 32)")]
    TooMany,
}

/// What an operator may do: a role, optionally limited to workspace patterns (none:
/// every workspace and the site-wide listings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub role: Role,
    /// Empty: not limited.
    pub patterns: Vec<Pattern>,
}

impl Grant {
    /// Everything (the CLI, and the server's own housekeeping).
    pub const ROOT: Grant = Grant {
        role: Role::Admin,
        patterns: Vec::new(),
    };

    /// A role and its patterns as given at `operator create` (`--role`, `--workspaces
    /// a,b`): checked whole, so a bad one creates nothing.
    pub fn parse(role: &str, workspaces: Option<&str>) -> Result<Grant, InvalidGrant> {
        let role = Role::parse(role)?;
        let patterns = match workspaces.map(str::trim) {
            None | Some("") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|p| Pattern::parse(p).map_err(InvalidGrant::from))
                .collect::<Result<Vec<_>, _>>()?,
        };
        if patterns.len() > MAX_PATTERNS {
            return Err(InvalidGrant::TooMany);
        }
        Ok(Grant { role, patterns })
    }

    /// The patterns as stored and shown (`a,b`; empty when not limited). The pattern
    /// nothing matches is `(none)`, which would not read back as a pattern, so such a
    /// grant could never be stored as "not limited".
    pub fn workspaces(&self) -> String {
        self.patterns
            .iter()
            .map(|p| match p.as_str() {
                "" => "(none)",
                p => p,
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn is_limited(&self) -> bool {
        !self.patterns.is_empty()
    }

    /// Does the operator see `workspace` at all (in listings, search, the audit log)?
    pub fn sees(&self, workspace: &str) -> bool {
        !self.is_limited() || self.patterns.iter().any(|p| p.matches(workspace))
    }

    pub fn may(&self, action: Action, target: Target<'_>) -> bool {
        may(self.role, &self.patterns, action, target)
    }

    /// This grant held under `cap` (a single sign-on operator's local cap, which the
    /// provider's groups never exceed): the lower role, and only workspaces both
    /// allow. Where both are limited, a pattern is kept when the other side has one
    /// that covers it ([`Pattern::covers`]): never more than both allow, perhaps less
    /// (nothing at all when no pattern of one lies inside the other's).
    pub fn capped(&self, cap: &Grant) -> Grant {
        let role = self.role.min(cap.role);
        let patterns = match (self.is_limited(), cap.is_limited()) {
            (_, false) => self.patterns.clone(),
            (false, true) => cap.patterns.clone(),
            (true, true) => {
                let inside = |p: &&Pattern, of: &[Pattern]| of.iter().any(|o| o.covers(p));
                let mut kept: Vec<Pattern> = Vec::new();
                for p in self
                    .patterns
                    .iter()
                    .filter(|p| inside(p, &cap.patterns))
                    .chain(cap.patterns.iter().filter(|p| inside(p, &self.patterns)))
                {
                    if !kept.contains(p) {
                        kept.push(p.clone());
                    }
                }
                if kept.is_empty() {
                    kept.push(Pattern::nothing());
                }
                kept
            }
        };
        Grant { role, patterns }
    }
}

/// The rule: does an operator with `role`, limited to `patterns` (empty: not limited),
/// get to do `action` on `target`?
pub fn may(role: Role, patterns: &[Pattern], action: Action, target: Target<'_>) -> bool {
    if role < Role::least_for(action) {
        return false;
    }
    match target {
        Target::Workspace(w) => patterns.is_empty() || patterns.iter().any(|p| p.matches(w)),
        Target::Listing => true,
        Target::Site => patterns.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::glob_match;

    fn pats(list: &[&str]) -> Vec<Pattern> {
        list.iter().map(|p| Pattern::parse(p).unwrap()).collect()
    }

    #[test]
    fn the_rule() {
        use Action::*;
        use Role::{Admin as A, Operator as O, Viewer as V};
        let ws = Target::Workspace;
        let all: &[&str] = &[];
        let prod: &[&str] = &["prod-*"];
        // (role, patterns, action, target, allowed)
        let table: &[(Role, &[&str], Action, Target, bool)] = &[
            (V, all, Read, ws("prod-x"), true),
            (V, all, Read, Target::Listing, true),
            (V, all, Read, Target::Site, true),
            (V, all, Operate, ws("prod-x"), false),
            (V, all, Reveal, ws("prod-x"), false),
            (V, all, Administer, Target::Site, false),
            (O, all, Read, ws("prod-x"), true),
            (O, all, Operate, ws("prod-x"), true),
            (O, all, Reveal, ws("prod-x"), false),
            (O, all, Administer, Target::Site, false),
            (A, all, Read, ws("prod-x"), true),
            (A, all, Operate, ws("prod-x"), true),
            (A, all, Reveal, ws("prod-x"), true),
            (A, all, Administer, Target::Site, true),
            // Limited to prod-*: other workspaces and site-wide things are refused
            // exactly like an action the role lacks; listings are allowed (filtered).
            (V, prod, Read, ws("prod-x"), true),
            (V, prod, Read, ws("dev-x"), false),
            (V, prod, Read, ws("prod"), false),
            (V, prod, Read, Target::Listing, true),
            (V, prod, Read, Target::Site, false),
            (V, prod, Operate, ws("prod-x"), false),
            (O, prod, Operate, ws("prod-x"), true),
            (O, prod, Operate, ws("dev-x"), false),
            (O, prod, Reveal, ws("prod-x"), false),
            (A, prod, Reveal, ws("prod-x"), true),
            (A, prod, Reveal, ws("dev-x"), false),
            (A, prod, Read, Target::Site, false),
            (A, prod, Administer, Target::Site, false),
            (A, &["dev-*", "stage"], Operate, ws("stage"), true),
            (A, &["dev-*", "stage"], Operate, ws("stage-2"), false),
            (A, &["*"], Read, ws("anything"), true),
            (A, &["*"], Read, Target::Site, false),
        ];
        for (role, patterns, action, target, allowed) in table {
            assert_eq!(
                may(*role, &pats(patterns), *action, *target),
                *allowed,
                "{role} {patterns:?} {action:?} {target:?}"
            );
        }
    }

    #[test]
    fn patterns() {
        // (pattern, workspace, matches)
        let table = [
            ("prod-*", "prod-x", true),
            ("prod-*", "prod-", true),
            ("prod-*", "prod", false),
            ("prod-*", "xprod-x", false),
            ("*-eu", "db-eu", true),
            ("*-eu", "db-eu-2", false),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "abc", true),
            ("a*b*c", "acb", false),
            ("*", "x", true),
            ("**", "x", true),
            ("exact", "exact", true),
            ("exact", "Exact", false),
            ("a.b", "aXb", false),
        ];
        for (p, w, want) in table {
            assert_eq!(Pattern::parse(p).unwrap().matches(w), want, "{p} {w}");
        }
        for bad in ["", " ", "-x", ".x", "a/b", "a?", "a[b]", "a b", "ü", "a,b"] {
            assert_eq!(Pattern::parse(bad), Err(InvalidPattern), "{bad:?}");
        }
        assert!(Pattern::parse(&"a".repeat(129)).is_err());
        // A pathological pattern stays linear-ish (no exponential backtracking).
        let p = Pattern::parse(&"*a".repeat(40)).unwrap();
        assert!(!p.matches(&"a".repeat(39)));
    }

    /// The linear matcher agrees with the obvious recursive one on every pattern over
    /// `a b *` and every name over `a b` up to 5 characters.
    #[test]
    fn glob_matches_the_reference_everywhere_small() {
        fn reference(p: &[u8], t: &[u8]) -> bool {
            match p.split_first() {
                None => t.is_empty(),
                Some((b'*', rest)) => (0..=t.len()).any(|i| reference(rest, &t[i..])),
                Some((c, rest)) => t.first() == Some(c) && reference(rest, &t[1..]),
            }
        }
        fn all(alphabet: &[u8], max: usize) -> Vec<Vec<u8>> {
            let mut out = vec![Vec::new()];
            let mut last = vec![Vec::new()];
            for _ in 0..max {
                last = last
                    .iter()
                    .flat_map(|w| {
                        alphabet.iter().map(move |c| {
                            let mut w = w.clone();
                            w.push(*c);
                            w
                        })
                    })
                    .collect();
                out.extend(last.iter().cloned());
            }
            out
        }
        let (patterns, texts) = (all(b"ab*", 5), all(b"ab", 5));
        for p in &patterns {
            for t in &texts {
                assert_eq!(glob_match(p, t), reference(p, t), "{p:?} {t:?}");
            }
        }
    }

    /// The effective grant of a capped single sign-on operator: never more than the
    /// groups give, nor than the cap allows, whichever way round.
    #[test]
    fn a_cap_is_never_exceeded() {
        let g = |role: &str, w: Option<&str>| Grant::parse(role, w).unwrap();
        // (groups' grant, cap, effective role, effective patterns)
        let table: &[(Grant, Grant, Role, &str)] = &[
            (g("admin", None), g("viewer", None), Role::Viewer, ""),
            (g("viewer", None), g("admin", None), Role::Viewer, ""),
            (
                g("admin", None),
                g("operator", Some("team-a-*")),
                Role::Operator,
                "team-a-*",
            ),
            (
                g("operator", Some("team-a-*")),
                g("admin", None),
                Role::Operator,
                "team-a-*",
            ),
            (
                g("admin", Some("team-*")),
                g("admin", Some("team-a-*")),
                Role::Admin,
                "team-a-*",
            ),
            (
                g("admin", Some("team-a-*")),
                g("admin", Some("team-*")),
                Role::Admin,
                "team-a-*",
            ),
            (
                g("admin", Some("team-a-*,prod")),
                g("viewer", Some("*-*,dev")),
                Role::Viewer,
                "team-a-*",
            ),
            (
                g("admin", Some("a*b")),
                g("admin", Some("a*")),
                Role::Admin,
                "a*b",
            ),
        ];
        for (groups, cap, role, patterns) in table {
            let got = groups.capped(cap);
            assert_eq!(
                (got.role, got.workspaces().as_str()),
                (*role, *patterns),
                "{groups:?} {cap:?}"
            );
        }
        // No pattern of one inside the other's: nothing at all, never everything.
        let none = g("admin", Some("prod-*")).capped(&g("admin", Some("dev-*")));
        assert!(none.is_limited());
        for w in ["prod-x", "dev-x", "x", "prod-dev-x"] {
            assert!(
                !none.sees(w) && !none.may(Action::Read, Target::Workspace(w)),
                "{w}"
            );
        }
        assert!(!none.may(Action::Read, Target::Site));
        // Whatever the two are, the effective grant allows nothing either refuses.
        let grants = [
            g("admin", None),
            g("viewer", Some("team-*")),
            g("operator", Some("team-a-*,prod")),
            g("admin", Some("*-x,a*b")),
            g("operator", Some("*")),
        ];
        let names = [
            "team-a-x", "team-b", "prod", "prod-x", "a-x", "ab", "axb", "q",
        ];
        let actions = [
            Action::Read,
            Action::Operate,
            Action::Reveal,
            Action::Administer,
        ];
        for a in &grants {
            for b in &grants {
                let c = a.capped(b);
                for action in actions {
                    for target in names
                        .iter()
                        .map(|n| Target::Workspace(n))
                        .chain([Target::Site, Target::Listing])
                    {
                        if c.may(action, target) {
                            assert!(
                                a.may(action, target) && b.may(action, target),
                                "{a:?} {b:?} {action:?} {target:?}"
                            );
                        }
                    }
                }
                for n in names {
                    assert!(!c.sees(n) || (a.sees(n) && b.sees(n)), "{a:?} {b:?} {n}");
                }
            }
        }
    }

    #[test]
    fn grants_parse_whole_or_not_at_all() {
        let g = Grant::parse("viewer", Some("dev-*, stage")).unwrap();
        assert_eq!(
            (g.role, g.workspaces()),
            (Role::Viewer, "dev-*,stage".into())
        );
        assert!(g.sees("dev-1") && g.sees("stage") && !g.sees("prod"));
        assert_eq!(Grant::parse("admin", None).unwrap(), Grant::ROOT);
        assert_eq!(Grant::parse("admin", Some("")).unwrap(), Grant::ROOT);
        assert_eq!(Grant::parse("root", None), Err(InvalidGrant::Role));
        assert_eq!(
            Grant::parse("Viewer ", None).err(),
            Some(InvalidGrant::Role)
        );
        assert_eq!(
            Grant::parse("viewer", Some("dev-*,prod/x")),
            Err(InvalidGrant::Pattern(InvalidPattern))
        );
        assert_eq!(
            Grant::parse("viewer", Some("dev-*,,x")),
            Err(InvalidGrant::Pattern(InvalidPattern))
        );
        let many = vec!["a"; MAX_PATTERNS + 1].join(",");
        assert_eq!(
            Grant::parse("viewer", Some(&many)),
            Err(InvalidGrant::TooMany)
        );
        // The error states the rule and never echoes what was given.
        let e = Grant::parse("viewer", Some("<script>"))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("script"), "{e}");
    }
}
