//! Values the admin API and the web UI read from a query string or a form: one rule
//! for what a workspace name and a version number look like in a request, so both
//! answer the same input with the same error.

use crate::error::Error;

pub(super) fn workspace(name: &str) -> Result<&str, Error> {
    crate::names::validate_workspace(name)?;
    Ok(name)
}

/// A positive whole number; an empty value (a form field left blank) is absent.
pub(super) fn number(name: &str, value: Option<&str>) -> Result<Option<i64>, Error> {
    value
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse::<i64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| Error::Invalid(format!("{name} must be a positive whole number")))
        })
        .transpose()
}

pub(super) fn required(name: &str, value: Option<&str>) -> Result<i64, Error> {
    number(name, value)?.ok_or_else(|| Error::Invalid(format!("{name} is required")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        let cases: &[(Option<&str>, Option<Option<i64>>)] = &[
            (None, Some(None)),
            (Some(""), Some(None)),
            (Some("  "), Some(None)),
            (Some("7"), Some(Some(7))),
            (Some(" 7 "), Some(Some(7))),
            (Some("0"), None),
            (Some("-3"), None),
            (Some("1.5"), None),
            (Some("x"), None),
            (Some("99999999999999999999"), None),
        ];
        for (input, expected) in cases {
            assert_eq!(number("n", *input).ok(), *expected, "{input:?}");
        }
        assert!(required("version", None).is_err());
        assert_eq!(required("version", Some("3")).unwrap(), 3);
    }
}
