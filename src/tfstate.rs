//! What stategate reads from a Terraform/OpenTofu state body: its serial and lineage.
//!
//! Both APIs store tfstate (the workspace backend and the cluster API), so the parse
//! lives below both. It looks at those two fields only and never at resources: an
//! OpenTofu-encrypted state (the `encrypted_data` envelope) keeps them in clear, so
//! versioning and the conflict rules work on states the server cannot read.

use serde::Deserialize;

use crate::error::ApiError;

/// Longest lineage accepted.
const MAX_LINEAGE_LEN: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateMeta {
    pub serial: i64,
    pub lineage: String,
}

/// Only the fields we need; everything else in the state is skipped without allocation.
#[derive(Deserialize)]
struct StateProbe {
    version: Option<serde::de::IgnoredAny>,
    serial: Option<serde_json::Value>,
    lineage: Option<String>,
    encrypted_data: Option<serde::de::IgnoredAny>,
    encryption_version: Option<String>,
}

/// Accepts a plain tfstate (`version`, `serial`, `lineage`) or OpenTofu's encrypted
/// envelope (`encrypted_data`, `encryption_version`, with serial and lineage in clear).
pub fn parse_state(body: &[u8]) -> Result<StateMeta, ApiError> {
    let bad =
        |why: &str| ApiError::BadRequest(format!("body is not a Terraform/OpenTofu state: {why}"));
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(bad("expected a JSON object"));
    }
    let probe: StateProbe =
        serde_json::from_slice(body).map_err(|e| bad(&format!("invalid JSON ({e})")))?;
    let is_envelope = probe.encrypted_data.is_some() && probe.encryption_version.is_some();
    if probe.version.is_none() && !is_envelope {
        return Err(bad(
            "missing \"version\" (or \"encrypted_data\" for an encrypted state)",
        ));
    }
    let serial = probe
        .serial
        .and_then(|n| n.as_i64())
        .filter(|s| *s >= 0)
        .ok_or_else(|| bad("\"serial\" must be a non-negative integer"))?;
    let lineage = probe
        .lineage
        .filter(|l| !l.is_empty() && l.len() <= MAX_LINEAGE_LEN)
        .ok_or_else(|| bad("\"lineage\" must be a non-empty string"))?;
    Ok(StateMeta { serial, lineage })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_bodies() {
        let ok: &[(&str, i64, &str)] = &[
            (
                r#"{"version":4,"serial":3,"lineage":"abc","resources":[]}"#,
                3,
                "abc",
            ),
            (
                r#"{"serial":7,"lineage":"l","meta":{"key_provider.pbkdf2.k":"x"},"encrypted_data":"ZZ","encryption_version":"v0"}"#,
                7,
                "l",
            ),
            ("  \n{\"version\":4,\"serial\":0,\"lineage\":\"x\"}", 0, "x"),
        ];
        for (body, serial, lineage) in ok {
            let meta = parse_state(body.as_bytes()).unwrap();
            assert_eq!(
                (meta.serial, meta.lineage.as_str()),
                (*serial, *lineage),
                "{body}"
            );
        }
        let bad = [
            "",
            "[]",
            "null",
            "{",
            r#"{"serial":1,"lineage":"x"}"#,
            r#"{"version":4,"lineage":"x"}"#,
            r#"{"version":4,"serial":-1,"lineage":"x"}"#,
            r#"{"version":4,"serial":1.5,"lineage":"x"}"#,
            r#"{"version":4,"serial":1,"lineage":""}"#,
            r#"{"version":4,"serial":1,"lineage":7}"#,
            r#"{"serial":1,"lineage":"x","encrypted_data":"x"}"#,
        ];
        for body in bad {
            assert!(
                matches!(parse_state(body.as_bytes()), Err(ApiError::BadRequest(_))),
                "{body}"
            );
        }
    }
}
