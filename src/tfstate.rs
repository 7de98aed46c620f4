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

/// Deepest nesting of arrays and objects accepted in a body. Terraform's own decoder
/// gives up at 10,000, so a deeper state could be stored but never read back; real
/// states stay far below this.
pub const MAX_JSON_DEPTH: usize = 1_000;

/// Checks what serde skips without looking: the whole body is UTF-8 and nests at most
/// [`MAX_JSON_DEPTH`] deep. One pass over the bytes, no allocation.
pub fn check_untrusted_json(body: &[u8]) -> Result<(), &'static str> {
    std::str::from_utf8(body).map_err(|_| "not UTF-8")?;
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in body {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return Err("nested too deeply");
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Lineages and lock IDs are echoed in headers, logs and the audit log: printable
/// ASCII only (Terraform and OpenTofu use UUIDs).
pub fn is_safe_id(text: &str, max_len: usize) -> bool {
    !text.is_empty() && text.len() <= max_len && text.bytes().all(|b| b.is_ascii_graphic())
}

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
    check_untrusted_json(body).map_err(bad)?;
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
        .filter(|l| is_safe_id(l, MAX_LINEAGE_LEN))
        .ok_or_else(|| {
            bad("\"lineage\" must be 1-256 printable ASCII characters (no spaces or control characters)")
        })?;
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
            // Lineages are echoed in headers and logs: printable ASCII only.
            "{\"version\":4,\"serial\":1,\"lineage\":\"a\\nb\"}",
            "{\"version\":4,\"serial\":1,\"lineage\":\"a\\u0000b\"}",
            "{\"version\":4,\"serial\":1,\"lineage\":\"a\\u001b[31m\"}",
            "{\"version\":4,\"serial\":1,\"lineage\":\"a\\u007f\"}",
            r#"{"version":4,"serial":1,"lineage":"a b"}"#,
            r#"{"version":4,"serial":1,"lineage":"caf\u00e9"}"#,
        ];
        for body in bad {
            assert!(
                matches!(parse_state(body.as_bytes()), Err(ApiError::BadRequest(_))),
                "{body}"
            );
        }
        let long = format!(
            r#"{{"version":4,"serial":1,"lineage":"{}"}}"#,
            "a".repeat(257)
        );
        assert!(parse_state(long.as_bytes()).is_err());
    }

    #[test]
    fn untrusted_json_bounds() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let ok_deep = deep(MAX_JSON_DEPTH);
        let too_deep = deep(MAX_JSON_DEPTH + 1);
        let quoted = format!(r#"{{"s":"{}"}}"#, "[{".repeat(5_000));
        let escaped = format!(r#"{{"s":"\"{}"}}"#, "[".repeat(5_000));
        // (body, accepted)
        let table: &[(&[u8], bool)] = &[
            (b"{}", true),
            (ok_deep.as_bytes(), true),
            (too_deep.as_bytes(), false),
            (quoted.as_bytes(), true),
            (escaped.as_bytes(), true),
            (b"{\"a\":\"\xff\"}", false),
            (b"{\"a\":\"\\\\\"}", true),
        ];
        for (body, accepted) in table {
            assert_eq!(
                check_untrusted_json(body).is_ok(),
                *accepted,
                "{}",
                String::from_utf8_lossy(&body[..body.len().min(40)])
            );
        }
        let state = format!(
            r#"{{"version":4,"serial":1,"lineage":"l","outputs":{}}}"#,
            deep(MAX_JSON_DEPTH + 5)
        );
        assert!(parse_state(state.as_bytes()).is_err());
        let mut bad_utf8 = br#"{"version":4,"serial":1,"lineage":"l","outputs":{"o":""#.to_vec();
        bad_utf8.extend_from_slice(b"\xc3\x28\"}}");
        assert!(parse_state(&bad_utf8).is_err());
    }
}
