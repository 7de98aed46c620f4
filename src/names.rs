//! The one naming rule for the names people choose: workspaces (in URLs, scopes and
//! derived credentials) and orgs (in scopes and the audit log), and the workspace
//! patterns that grants are limited to (`prod-*`); and the rule for the reason an
//! operator gives (a freeze's, a write override's).
//!
//! A name is 1–N characters of `[A-Za-z0-9._-]` starting with a letter or digit:
//! nothing percent-encoded, no slash, no leading dot, so a name can never mean a path.
//! Pure; never touches storage or HTTP (callers turn [`InvalidName`] into their error).

/// Longest workspace name accepted.
pub const MAX_WORKSPACE_LEN: usize = 128;
/// Longest org name accepted.
pub const MAX_ORG_LEN: usize = 64;

/// Longest reason kept (characters): it travels in LockInfos and audit rows.
pub const MAX_REASON_CHARS: usize = 500;

/// `text` trimmed, if it is a reason an operator may give: 1 to [`MAX_REASON_CHARS`]
/// characters, none of them a control character (it is shown in terminals and pages).
pub fn reason(text: &str) -> Option<&str> {
    let reason = text.trim();
    let fits = !reason.is_empty() && reason.chars().count() <= MAX_REASON_CHARS;
    (fits && !reason.chars().any(char::is_control)).then_some(reason)
}

/// A name that breaks the rule. The message states the rule, never echoes the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} name: use 1-{max} characters from A-Z a-z 0-9 . _ - starting with a letter or digit")]
pub struct InvalidName {
    kind: &'static str,
    max: usize,
}

pub fn validate_workspace(name: &str) -> Result<(), InvalidName> {
    validate("workspace", MAX_WORKSPACE_LEN, name)
}

pub fn validate_org(name: &str) -> Result<(), InvalidName> {
    validate("org", MAX_ORG_LEN, name)
}

fn validate(kind: &'static str, max: usize, name: &str) -> Result<(), InvalidName> {
    let valid = !name.is_empty()
        && name.len() <= max
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if valid {
        Ok(())
    } else {
        Err(InvalidName { kind, max })
    }
}

/// Longest workspace pattern accepted (a workspace name's limit).
const MAX_PATTERN_LEN: usize = MAX_WORKSPACE_LEN;

/// A workspace pattern that breaks the rule. The message states the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid workspace pattern: use 1-128 characters from A-Z a-z 0-9 . _ - and * (any characters), starting with a letter, a digit or *")]
pub struct InvalidPattern;

/// A workspace pattern: a workspace name in which `*` matches any run of characters
/// (`prod-*`, `*-eu`, `*`). No other wildcard exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    pub fn parse(text: &str) -> Result<Pattern, InvalidPattern> {
        let text = text.trim();
        let bytes = text.as_bytes();
        let valid = !bytes.is_empty()
            && bytes.len() <= MAX_PATTERN_LEN
            && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'*')
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || b"._-*".contains(b));
        if valid {
            Ok(Pattern(text.to_string()))
        } else {
            Err(InvalidPattern)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A pattern no workspace matches (names are never empty): what a stored grant
    /// that cannot be read is limited to.
    pub(crate) fn nothing() -> Pattern {
        Pattern(String::new())
    }

    /// Does every name `other` matches match this pattern too? Decided by matching
    /// `other`'s text, its `*` taken as a character this pattern's `*` absorbs: when
    /// that matches, so does every name `other` matches (sound; it may say no to a
    /// few patterns that are in fact covered, which only ever narrows).
    pub fn covers(&self, other: &Pattern) -> bool {
        glob_match(self.0.as_bytes(), other.0.as_bytes())
    }

    /// Does `workspace` match? `*` matches any run of characters, everything else itself.
    pub fn matches(&self, workspace: &str) -> bool {
        glob_match(self.0.as_bytes(), workspace.as_bytes())
    }
}

/// `*`-only glob matching, linear backtracking over the last `*` (no recursion).
pub(crate) fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|b| *b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_trimmed_bounded_and_printable() {
        let longest = "é".repeat(MAX_REASON_CHARS);
        let too_long = "x".repeat(MAX_REASON_CHARS + 1);
        let table: &[(&str, Option<&str>)] = &[
            ("  rotating the DB ", Some("rotating the DB")),
            (&longest, Some(&longest)),
            ("", None),
            (" \t ", None),
            (&too_long, None),
            ("line\nbreak", None),
            ("bell\u{7}", None),
            ("esc\u{1b}[31m", None),
        ];
        for (given, want) in table {
            assert_eq!(reason(given), *want, "{given:?}");
        }
    }

    #[test]
    fn the_rule() {
        // (name, valid as a workspace, valid as an org)
        let long_org = "a".repeat(MAX_ORG_LEN + 1);
        let long_ws = "a".repeat(MAX_WORKSPACE_LEN + 1);
        let table: &[(&str, bool, bool)] = &[
            ("acme", true, true),
            ("Acme-2.prod_x", true, true),
            ("my_ws.v2-x", true, true),
            ("0", true, true),
            ("", false, false),
            ("-acme", false, false),
            (".hidden", false, false),
            ("..", false, false),
            ("ac me", false, false),
            ("acme/x", false, false),
            ("a%2Fb", false, false),
            ("a\u{1}b", false, false),
            ("ü", false, false),
            (&long_org, true, false),
            (&long_ws, false, false),
        ];
        for (name, workspace, org) in table {
            assert_eq!(validate_workspace(name).is_ok(), *workspace, "{name:?}");
            assert_eq!(validate_org(name).is_ok(), *org, "{name:?}");
        }
        assert_eq!(
            validate_workspace("").unwrap_err().to_string(),
            "invalid workspace name: use 1-128 characters from A-Z a-z 0-9 . _ - starting with a letter or digit"
        );
        assert!(validate_org("")
            .unwrap_err()
            .to_string()
            .starts_with("invalid org name: use 1-64 characters"));
    }
}
