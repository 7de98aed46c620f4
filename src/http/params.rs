//! The one reading of every value a request names: the router parses each path segment
//! and query value here, once, into a typed value ([`WorkspaceName`], [`RunId`],
//! [`VersionRef`], a bounded count, a flag); `guard` and the handlers receive that
//! value and never read the text again, so the permission check and the operation
//! cannot disagree about what was asked for.
//!
//! One spelling per value: ASCII only, nothing trimmed, numbers as plain digits (no
//! sign, no leading zero, at most 18 digits), names by `crate::names`. Query values are
//! percent-decoded once (by the router); path segments not at all (a name never holds
//! `%`). A value that does not parse is a [`BadParam`]: the admin API and the UI answer
//! it 400 after authentication, never let it through.

use crate::error::Error;

/// A value that did not parse. The message states the rule, never echoes the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadParam(String);

impl BadParam {
    fn new(message: impl Into<String>) -> BadParam {
        BadParam(message.into())
    }
}

impl std::fmt::Display for BadParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<BadParam> for Error {
    fn from(bad: BadParam) -> Error {
        Error::Invalid(bad.0)
    }
}

pub type Parsed<T> = Result<T, BadParam>;

/// A workspace name that obeys `crate::names` (ASCII, no path meaning).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkspaceName(String);

impl WorkspaceName {
    pub fn parse(text: &str) -> Parsed<WorkspaceName> {
        crate::names::validate_workspace(text).map_err(|e| BadParam::new(e.to_string()))?;
        Ok(WorkspaceName(text.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for WorkspaceName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for WorkspaceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A drift run's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunId(i64);

impl RunId {
    pub fn parse(text: &str) -> Parsed<RunId> {
        positive("run", text).map(RunId)
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

/// A cluster's id as a path names it: a UUID in any spelling `uuid` reads, or none (a
/// cluster id that is not a UUID answers like a missing cluster, after authentication:
/// the cluster API's contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterId(Option<uuid::Uuid>);

impl ClusterId {
    pub fn parse(text: &str) -> ClusterId {
        ClusterId(uuid::Uuid::parse_str(text).ok())
    }

    pub fn uuid(self) -> Option<uuid::Uuid> {
        self.0
    }
}

impl std::fmt::Display for ClusterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(id) => write!(f, "{}", id.hyphenated()),
            None => f.write_str("(not a uuid)"),
        }
    }
}

/// A version of a workspace: a number, or (admin API) `latest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionRef {
    Latest,
    Number(i64),
}

impl VersionRef {
    pub fn parse(text: &str) -> Parsed<VersionRef> {
        match text {
            "latest" => Ok(VersionRef::Latest),
            n => positive("version", n).map(VersionRef::Number),
        }
    }

    /// `None` for the newest version.
    pub fn number(self) -> Option<i64> {
        match self {
            VersionRef::Latest => None,
            VersionRef::Number(n) => Some(n),
        }
    }
}

/// Longest whole number accepted: 18 digits always fit an `i64`.
const MAX_DIGITS: usize = 18;

/// A positive whole number written one way: 1-18 ASCII digits, the first not `0`.
pub fn positive(name: &str, text: &str) -> Parsed<i64> {
    let digits = text.as_bytes();
    let plain = !digits.is_empty()
        && digits.len() <= MAX_DIGITS
        && digits[0] != b'0'
        && digits.iter().all(u8::is_ascii_digit);
    plain
        .then(|| text.parse::<i64>().ok())
        .flatten()
        .ok_or_else(|| BadParam::new(format!("{name} must be a positive whole number")))
}

/// An optional positive number; an empty value (a form field left blank) is absent.
pub fn number(name: &str, value: Option<&str>) -> Parsed<Option<i64>> {
    match value {
        None | Some("") => Ok(None),
        Some(v) => positive(name, v).map(Some),
    }
}

pub fn required(name: &str, value: Option<&str>) -> Parsed<i64> {
    number(name, value)?.ok_or_else(|| BadParam::new(format!("{name} is required")))
}

/// An optional count of at most `max` (`u32::MAX`: only what fits).
pub fn count(name: &str, value: Option<&str>, max: u32) -> Parsed<Option<u32>> {
    number(name, value)?
        .map(|n| {
            u32::try_from(n)
                .ok()
                .filter(|n| *n <= max)
                .ok_or_else(|| match max {
                    u32::MAX => BadParam::new(format!("{name} is too large")),
                    _ => BadParam::new(format!("{name} must be 1-{max}")),
                })
        })
        .transpose()
}

/// `1`/`true` or `0`/`false`/empty/absent.
pub fn flag(name: &str, value: Option<&str>) -> Parsed<bool> {
    match value {
        None | Some("" | "0" | "false") => Ok(false),
        Some("1" | "true") => Ok(true),
        Some(_) => Err(BadParam::new(format!("{name} must be 1 or 0"))),
    }
}

/// An optional workspace name (a filter); an empty value is absent.
pub fn workspace_filter(value: Option<&str>) -> Parsed<Option<WorkspaceName>> {
    match value {
        None | Some("") => Ok(None),
        Some(w) => WorkspaceName::parse(w).map(Some),
    }
}

/// A workspace token named in a path: its name or its id, both of the name rule.
pub fn token_ref(text: &str) -> Parsed<String> {
    crate::names::validate_workspace(text)
        .map(|()| text.to_string())
        .map_err(|_| BadParam::new("a workspace token is named by its name or its id"))
}

/// A number typed into a form; as [`number`], after dropping surrounding ASCII
/// whitespace.
pub fn form_number(name: &str, value: Option<&str>) -> Result<Option<i64>, Error> {
    let value = value.map(|v| v.trim_matches(|c: char| c.is_ascii_whitespace()));
    Ok(number(name, value)?)
}

pub fn form_required(name: &str, value: Option<&str>) -> Result<i64, Error> {
    form_number(name, value)?.ok_or_else(|| Error::Invalid(format!("{name} is required")))
}

/// An audit filter's instant (`since`, `until`) as `store::audit::parse_instant` reads
/// it; a value that does not read is a 400 naming the filter.
pub fn instant(name: &str, text: Option<&str>) -> Result<Option<time::OffsetDateTime>, Error> {
    text.map(|t| {
        crate::store::audit::parse_instant(t)
            .map_err(|why| Error::Invalid(format!("{name}: {why}")))
    })
    .transpose()
}

/// Typed values from literal text in tests (a literal that does not parse fails the test).
#[cfg(test)]
mod literals {
    use super::*;

    impl From<&str> for WorkspaceName {
        fn from(text: &str) -> WorkspaceName {
            WorkspaceName::parse(text).expect("a valid workspace name")
        }
    }

    impl From<&str> for RunId {
        fn from(text: &str) -> RunId {
            RunId::parse(text).expect("a valid run id")
        }
    }

    impl From<&str> for VersionRef {
        fn from(text: &str) -> VersionRef {
            VersionRef::parse(text).expect("a valid version")
        }
    }

    impl From<&str> for ClusterId {
        fn from(text: &str) -> ClusterId {
            ClusterId::parse(text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_have_one_spelling() {
        let cases: &[(Option<&str>, Option<Option<i64>>)] = &[
            (None, Some(None)),
            (Some(""), Some(None)),
            (Some("7"), Some(Some(7))),
            (Some("120"), Some(Some(120))),
            (
                Some("999999999999999999"),
                Some(Some(999_999_999_999_999_999)),
            ),
            // Rejected: every other way of writing a number, and what is not one.
            (Some("  "), None),
            (Some(" 7 "), None),
            (Some("7 "), None),
            (Some("\u{3000}7"), None),
            (Some("\u{a0}7"), None),
            (Some("7\u{85}"), None),
            (Some("\u{2003}7"), None),
            (Some("\u{ff17}"), None),
            (Some("+7"), None),
            (Some("07"), None),
            (Some("0"), None),
            (Some("-3"), None),
            (Some("1.5"), None),
            (Some("1e3"), None),
            (Some("0x10"), None),
            (Some("x"), None),
            (Some("7\0"), None),
            (Some("1000000000000000000"), None),
            (Some("99999999999999999999"), None),
        ];
        for (input, expected) in cases {
            assert_eq!(number("n", *input).ok(), *expected, "{input:?}");
        }
        assert!(required("version", None).is_err());
        assert_eq!(required("version", Some("3")).unwrap(), 3);
        assert_eq!(
            RunId::parse("\u{3000}2"),
            Err(BadParam::new("run must be a positive whole number"))
        );
        assert_eq!(RunId::parse("2").map(RunId::get), Ok(2));
        assert_eq!(VersionRef::parse("latest"), Ok(VersionRef::Latest));
        assert!(VersionRef::parse("Latest").is_err());
        assert!(VersionRef::parse(" latest").is_err());
        assert_eq!(count("limit", Some("5"), 10), Ok(Some(5)));
        assert_eq!(
            count("limit", Some("11"), 10),
            Err(BadParam::new("limit must be 1-10"))
        );
        assert_eq!(
            count("limit", Some("4294967296"), u32::MAX),
            Err(BadParam::new("limit is too large"))
        );
        assert_eq!(flag("masked", Some("1")), Ok(true));
        assert!(flag("masked", Some(" 1")).is_err());
        assert_eq!(form_required("to", Some(" 3 ")).unwrap(), 3);
        assert!(form_required("to", Some("\u{3000}3")).is_err());
    }

    #[test]
    fn names_are_ascii_and_untrimmed() {
        assert_eq!(WorkspaceName::parse("prod-a").unwrap().as_str(), "prod-a");
        for bad in [
            "",
            " prod",
            "prod ",
            "\u{3000}prod",
            "prod\u{a0}",
            "pr%6Fd",
            "prod\0",
            "ｐrod",
            "..",
        ] {
            assert!(WorkspaceName::parse(bad).is_err(), "{bad:?}");
        }
        assert!(WorkspaceName::parse(&"a".repeat(129)).is_err());
        assert_eq!(workspace_filter(Some("")), Ok(None));
        assert!(workspace_filter(Some(" dev-a")).is_err());
        assert!(token_ref("ci\u{3000}").is_err());
    }
}
