//! The outputs-only state (`GET /api/v1/tf/outputs/<workspace>`): what
//! `terraform_remote_state` needs, and nothing else. Pure: from a state body to a
//! synthesized state document with the same `version`, `terraform_version`, `serial`
//! and `lineage`, the `outputs` (sensitive ones dropped unless asked for) and
//! `resources: []`, which Terraform's `http` backend reads like any other state.
//!
//! Resources are skipped by the parser without being kept (`serde::de::IgnoredAny`), so
//! the memory used is the body (at most the largest state stored, `max_state_bytes`)
//! plus the outputs. An OpenTofu-encrypted state has no readable outputs: refused.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::error::Error;

/// Why no outputs-only state can be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputsError {
    #[error("the state is encrypted by the client (OpenTofu state encryption): its outputs cannot be read by the server")]
    Encrypted,
    #[error("the stored state cannot be read as a Terraform state")]
    Unreadable,
}

#[derive(Deserialize)]
struct Document {
    version: Option<serde_json::Value>,
    terraform_version: Option<serde_json::Value>,
    serial: Option<serde_json::Value>,
    lineage: Option<serde_json::Value>,
    #[serde(default)]
    outputs: BTreeMap<String, Output>,
    encrypted_data: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct Output {
    value: serde_json::Value,
    #[serde(rename = "type")]
    kind: Option<serde_json::Value>,
    #[serde(default)]
    sensitive: bool,
}

/// The outputs-only state of `state`; `sensitive`: keep sensitive outputs.
pub fn synthesize(state: &[u8], sensitive: bool) -> Result<Vec<u8>, OutputsError> {
    let doc: Document = serde_json::from_slice(state).map_err(|_| OutputsError::Unreadable)?;
    if doc.encrypted_data.is_some() {
        return Err(OutputsError::Encrypted);
    }
    let mut outputs = serde_json::Map::new();
    for (name, output) in doc.outputs {
        if output.sensitive && !sensitive {
            continue;
        }
        let mut entry = serde_json::Map::new();
        entry.insert("value".into(), output.value);
        if let Some(kind) = output.kind {
            entry.insert("type".into(), kind);
        }
        if output.sensitive {
            entry.insert("sensitive".into(), serde_json::Value::Bool(true));
        }
        outputs.insert(name, serde_json::Value::Object(entry));
    }
    let out = serde_json::json!({
        "version": doc.version.unwrap_or(serde_json::json!(4)),
        "terraform_version": doc.terraform_version,
        "serial": doc.serial,
        "lineage": doc.lineage,
        "outputs": outputs,
        "resources": [],
        "check_results": null,
    });
    serde_json::to_vec(&out).map_err(|_| OutputsError::Unreadable)
}

/// The outputs-only state of `workspace`'s current state `state` (verified as it is
/// read, whole, within the size its index row records: every state was bounded by
/// `max_state_bytes` when written; the caller reserves that much memory first).
pub async fn of_stream(
    workspace: &str,
    mut state: crate::store::StateStream,
    sensitive: bool,
) -> Result<bytes::Bytes, Error> {
    let size = usize::try_from(state.row.size.max(0)).unwrap_or(usize::MAX);
    let unreadable = |detail: String| Error::Internal {
        public: "the stored state cannot be read; see the server log".into(),
        detail,
    };
    let mut body = Vec::with_capacity(size.min(16 << 20));
    while let Some(chunk) = state.chunks.recv().await {
        let chunk = chunk?;
        if body.len() + chunk.len() > size {
            return Err(unreadable(format!(
                "workspace {workspace:?}: the stored state is larger than its index row says"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    let synthesized = synthesize(&body, sensitive).map_err(|e| match e {
        OutputsError::Encrypted => Error::Conflict(e.to_string()),
        OutputsError::Unreadable => unreadable(format!("workspace {workspace:?}: {e}")),
    })?;
    Ok(bytes::Bytes::from(synthesized))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_outputs_leave_and_sensitive_ones_only_when_asked() {
        let state = br#"{"version":4,"terraform_version":"1.15.0","serial":7,"lineage":"l-1",
            "outputs":{"url":{"value":"https://x","type":"string"},
                       "password":{"value":"hunter2","type":"string","sensitive":true},
                       "list":{"value":[1,2],"type":["list","number"]}},
            "resources":[{"mode":"managed","type":"terraform_data","name":"secret",
                          "instances":[{"attributes":{"input":"resource-secret"}}]}],
            "check_results":null}"#;
        let plain: serde_json::Value =
            serde_json::from_slice(&synthesize(state, false).unwrap()).unwrap();
        assert_eq!(plain["serial"], 7);
        assert_eq!(plain["lineage"], "l-1");
        assert_eq!(plain["version"], 4);
        assert_eq!(plain["terraform_version"], "1.15.0");
        assert_eq!(plain["resources"], serde_json::json!([]));
        assert_eq!(plain["outputs"]["url"]["value"], "https://x");
        assert_eq!(plain["outputs"]["list"]["value"], serde_json::json!([1, 2]));
        assert!(plain["outputs"].get("password").is_none());
        let text = String::from_utf8(synthesize(state, false).unwrap()).unwrap();
        assert!(!text.contains("hunter2") && !text.contains("resource-secret"));
        let with: serde_json::Value =
            serde_json::from_slice(&synthesize(state, true).unwrap()).unwrap();
        assert_eq!(with["outputs"]["password"]["value"], "hunter2");
        assert_eq!(with["outputs"]["password"]["sensitive"], true);
    }

    #[test]
    fn what_cannot_be_served() {
        let envelope = br#"{"serial":1,"lineage":"l","meta":{},"encrypted_data":"AAAA","encryption_version":"v0"}"#;
        assert_eq!(synthesize(envelope, false), Err(OutputsError::Encrypted));
        for bad in [&b""[..], b"[]", b"{", b"{\"outputs\": 3}"] {
            assert_eq!(synthesize(bad, false), Err(OutputsError::Unreadable));
        }
        let empty = synthesize(br#"{"version":4,"serial":0,"lineage":"l"}"#, false).unwrap();
        let empty: serde_json::Value = serde_json::from_slice(&empty).unwrap();
        assert_eq!(empty["outputs"], serde_json::json!({}));
    }
}
