//! What changed between two Terraform/OpenTofu states, by resource address: instances
//! added, removed or changed (with the top-level attributes that differ), and outputs.
//! Pure: it reads two parsed JSON documents and never keeps content. Values that are
//! marked sensitive (`sensitive_attributes`, sensitive outputs) or whose names look
//! like secrets are replaced by [`MASK`] before anything leaves this module.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};

/// What a masked value is shown as.
pub const MASK: &str = "(sensitive)";

/// Attribute names whose values are masked even when the provider did not mark them.
const SECRET_LOOKING: &[&str] = &["password", "secret", "token", "private_key", "passphrase"];

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Added,
    Removed,
    Changed,
}

/// One attribute that differs (values masked where sensitive; `None` = absent).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttributeChange {
    pub name: String,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResourceChange {
    pub address: String,
    pub change: Change,
    /// For `changed` only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<AttributeChange>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutputChange {
    pub name: String,
    pub change: Change,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct StateDiff {
    pub resources: Vec<ResourceChange>,
    pub outputs: Vec<OutputChange>,
}

impl StateDiff {
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.outputs.is_empty()
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DiffError {
    #[error(
        "version {0} is not a plain JSON state (encrypted by the client?); it cannot be diffed"
    )]
    NotPlainState(i64),
}

/// Each resource instance by address: its attributes and the names of its sensitive ones.
type Instances = BTreeMap<String, (Map<String, Value>, Vec<String>)>;

/// Diffs state `a` (version `va`) against state `b` (version `vb`).
pub fn diff_states(a: &[u8], va: i64, b: &[u8], vb: i64) -> Result<StateDiff, DiffError> {
    let a = parse(a, va)?;
    let b = parse(b, vb)?;
    let (ra, rb) = (instances(&a), instances(&b));
    let mut resources = Vec::new();
    for (address, before) in &ra {
        match rb.get(address) {
            None => resources.push(resource(address, Change::Removed, Vec::new())),
            Some(after) => {
                let changed = changed_attributes(before, after);
                if !changed.is_empty() {
                    resources.push(resource(address, Change::Changed, changed));
                }
            }
        }
    }
    for address in rb.keys().filter(|k| !ra.contains_key(*k)) {
        resources.push(resource(address, Change::Added, Vec::new()));
    }
    resources.sort_by(|x, y| x.address.cmp(&y.address));
    Ok(StateDiff {
        resources,
        outputs: diff_outputs(&outputs(&a), &outputs(&b)),
    })
}

/// The state with every sensitive value replaced by [`MASK`] (what a viewer shows by default).
pub fn mask_state(state: &[u8], version: i64) -> Result<Value, DiffError> {
    let mut doc = parse(state, version)?;
    if let Some(resources) = doc.get_mut("resources").and_then(Value::as_array_mut) {
        for instance in resources
            .iter_mut()
            .filter_map(|r| r.get_mut("instances").and_then(Value::as_array_mut))
            .flatten()
        {
            let sensitive = sensitive_names(instance);
            if let Some(attrs) = instance
                .get_mut("attributes")
                .and_then(Value::as_object_mut)
            {
                mask_attributes(attrs, &sensitive);
            }
        }
    }
    if let Some(outputs) = doc.get_mut("outputs").and_then(Value::as_object_mut) {
        for output in outputs.values_mut() {
            if output["sensitive"] == Value::Bool(true) {
                output["value"] = Value::from(MASK);
            }
        }
    }
    Ok(doc)
}

fn resource(address: &str, change: Change, attributes: Vec<AttributeChange>) -> ResourceChange {
    ResourceChange {
        address: address.to_string(),
        change,
        attributes,
    }
}

fn parse(bytes: &[u8], version: i64) -> Result<Value, DiffError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(doc) if doc.get("resources").is_some() || doc.get("outputs").is_some() => Ok(doc),
        _ => Err(DiffError::NotPlainState(version)),
    }
}

/// `module.m.data.aws_x.name["key"]`: Terraform's own address of an instance.
pub(crate) fn address(resource: &Value, instance: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("?").to_string();
    let mut out = String::new();
    if let Some(module) = resource.get("module").and_then(Value::as_str) {
        out.push_str(module);
        out.push('.');
    }
    if resource.get("mode").and_then(Value::as_str) == Some("data") {
        out.push_str("data.");
    }
    out.push_str(&format!(
        "{}.{}",
        text(&resource["type"]),
        text(&resource["name"])
    ));
    match instance.get("index_key") {
        Some(Value::String(key)) => out.push_str(&format!("[{}]", Value::from(key.as_str()))),
        Some(Value::Number(n)) => out.push_str(&format!("[{n}]")),
        _ => {}
    }
    out
}

fn instances(doc: &Value) -> Instances {
    let mut out = Instances::new();
    for resource in doc["resources"].as_array().into_iter().flatten() {
        for instance in resource["instances"].as_array().into_iter().flatten() {
            let attrs = instance["attributes"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            out.insert(
                address(resource, instance),
                (attrs, sensitive_names(instance)),
            );
        }
    }
    out
}

/// Top-level attribute names under `sensitive_attributes` (a list of paths, each a
/// list of steps `{"type": "get_attr", "value": name}`; a bare step is accepted too).
fn sensitive_names(instance: &Value) -> Vec<String> {
    let first_step = |path: &Value| match path {
        Value::Array(steps) => steps.first().cloned(),
        step @ Value::Object(_) => Some(step.clone()),
        _ => None,
    };
    instance["sensitive_attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(first_step)
        .filter_map(|step| step["value"].as_str().map(str::to_string))
        .collect()
}

fn looks_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_LOOKING.iter().any(|s| name.contains(s))
}

/// `value` as it may be shown: [`MASK`] when sensitive (empty values stay visible).
fn shown(value: &Value, sensitive: bool) -> Value {
    let empty = value.is_null() || value == &Value::String(String::new());
    if sensitive && !empty {
        Value::from(MASK)
    } else {
        value.clone()
    }
}

fn mask_attributes(attrs: &mut Map<String, Value>, sensitive: &[String]) {
    for (name, value) in attrs.iter_mut() {
        *value = shown(value, sensitive.contains(name) || looks_secret(name));
    }
}

/// Compared on the real values (a changed secret is listed), shown masked.
fn changed_attributes(
    (before, s1): &(Map<String, Value>, Vec<String>),
    (after, s2): &(Map<String, Value>, Vec<String>),
) -> Vec<AttributeChange> {
    let mut names: Vec<&String> = before.keys().chain(after.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|n| before.get(*n) != after.get(*n))
        .map(|n| {
            let sensitive = s1.contains(n) || s2.contains(n) || looks_secret(n);
            AttributeChange {
                name: n.clone(),
                before: before.get(n).map(|v| shown(v, sensitive)),
                after: after.get(n).map(|v| shown(v, sensitive)),
            }
        })
        .collect()
}

/// Each output's value and whether it is sensitive.
fn outputs(doc: &Value) -> BTreeMap<String, (Value, bool)> {
    doc["outputs"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, o)| {
            (
                name.clone(),
                (o["value"].clone(), o["sensitive"] == Value::Bool(true)),
            )
        })
        .collect()
}

fn diff_outputs(
    a: &BTreeMap<String, (Value, bool)>,
    b: &BTreeMap<String, (Value, bool)>,
) -> Vec<OutputChange> {
    let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|name| {
            let (before, after) = (a.get(name), b.get(name));
            let change = match (before, after) {
                (None, Some(_)) => Change::Added,
                (Some(_), None) => Change::Removed,
                (Some(x), Some(y)) if x.0 != y.0 => Change::Changed,
                _ => return None,
            };
            let sensitive = before.is_some_and(|o| o.1) || after.is_some_and(|o| o.1);
            Some(OutputChange {
                name: name.clone(),
                change,
                before: before.map(|o| shown(&o.0, sensitive)),
                after: after.map(|o| shown(&o.0, sensitive)),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn state(resources: Value, outputs: Value) -> Vec<u8> {
        json!({"version": 4, "serial": 1, "lineage": "l", "resources": resources, "outputs": outputs})
            .to_string()
            .into_bytes()
    }

    fn res(kind: &str, name: &str, instances: Value) -> Value {
        json!({"mode": "managed", "type": kind, "name": name, "instances": instances})
    }

    #[test]
    fn addresses() {
        // (resource, instance, address)
        let table = [
            (
                res("null_resource", "a", json!([])),
                json!({}),
                "null_resource.a",
            ),
            (
                json!({"mode": "data", "type": "x", "name": "y", "module": "module.m"}),
                json!({"index_key": 2}),
                "module.m.data.x.y[2]",
            ),
            (
                res("t", "n", json!([])),
                json!({"index_key": "k\"1"}),
                "t.n[\"k\\\"1\"]",
            ),
        ];
        for (resource, instance, expected) in table {
            assert_eq!(address(&resource, &instance), expected);
        }
    }

    #[test]
    fn diffs() {
        let one = |attrs: Value| json!([{"attributes": attrs}]);
        let a = state(
            json!([
                res("t", "kept", one(json!({"id": "1", "x": 1}))),
                res(
                    "t",
                    "changed",
                    one(json!({"id": "2", "x": 1, "gone": true}))
                ),
                res("t", "removed", one(json!({"id": "3"}))),
                res(
                    "t",
                    "secret",
                    json!([{"attributes": {"id": "4", "v": "S3CRET-OLD"},
                    "sensitive_attributes": [[{"type": "get_attr", "value": "v"}]]}])
                ),
            ]),
            json!({"o": {"value": 1}, "s": {"value": "OUT-A", "sensitive": true}, "old": {"value": 0}}),
        );
        let b = state(
            json!([
                res("t", "kept", one(json!({"id": "1", "x": 1}))),
                res("t", "changed", one(json!({"id": "2", "x": 2, "new": "y"}))),
                res(
                    "t",
                    "added",
                    one(json!({"id": "5", "admin_password": "hunter2"}))
                ),
                res(
                    "t",
                    "secret",
                    json!([{"attributes": {"id": "4", "v": "S3CRET-NEW"},
                    "sensitive_attributes": [{"type": "get_attr", "value": "v"}]}])
                ),
            ]),
            json!({"o": {"value": 2}, "s": {"value": "OUT-B", "sensitive": true}, "new": {"value": 1}}),
        );
        let d = diff_states(&a, 1, &b, 2).unwrap();
        let summary: Vec<(String, Change, Vec<String>)> = d
            .resources
            .iter()
            .map(|r| {
                (
                    r.address.clone(),
                    r.change.clone(),
                    r.attributes.iter().map(|a| a.name.clone()).collect(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("t.added".into(), Change::Added, vec![]),
                (
                    "t.changed".into(),
                    Change::Changed,
                    vec!["gone".into(), "new".into(), "x".into()]
                ),
                ("t.removed".into(), Change::Removed, vec![]),
                ("t.secret".into(), Change::Changed, vec!["v".into()]),
            ],
        );
        let v = &d.resources[3].attributes[0];
        assert_eq!(
            (v.before.clone(), v.after.clone()),
            (Some(json!(MASK)), Some(json!(MASK)))
        );
        let x = &d.resources[1].attributes[2];
        assert_eq!(
            (x.before.clone(), x.after.clone()),
            (Some(json!(1)), Some(json!(2)))
        );
        let outputs: Vec<(&str, Change, Option<Value>, Option<Value>)> = d
            .outputs
            .iter()
            .map(|o| {
                (
                    o.name.as_str(),
                    o.change.clone(),
                    o.before.clone(),
                    o.after.clone(),
                )
            })
            .collect();
        assert_eq!(
            outputs,
            vec![
                ("new", Change::Added, None, Some(json!(1))),
                ("o", Change::Changed, Some(json!(1)), Some(json!(2))),
                ("old", Change::Removed, Some(json!(0)), None),
                ("s", Change::Changed, Some(json!(MASK)), Some(json!(MASK))),
            ]
        );
        let text = serde_json::to_string(&d).unwrap();
        for secret in ["hunter2", "S3CRET", "OUT-"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(diff_states(&a, 1, &a, 1).unwrap().is_empty());
    }

    #[test]
    fn masking_and_refusals() {
        let s = state(
            json!([res(
                "t",
                "n",
                json!([{"attributes": {"id": "1", "token": "T0P", "empty_password": ""},
                "sensitive_attributes": []}])
            )]),
            json!({"pw": {"value": "P4SS", "sensitive": true}, "ip": {"value": "10.0.0.1"}}),
        );
        let masked = mask_state(&s, 3).unwrap().to_string();
        assert!(
            !masked.contains("T0P") && !masked.contains("P4SS"),
            "{masked}"
        );
        assert!(masked.contains("10.0.0.1") && masked.contains(MASK));
        // (input, is it refused)
        let table: &[(&[u8], bool)] = &[
            (b"not json", true),
            (
                br#"{"meta":{"key_provider.pbkdf2":"x"},"encrypted_data":"..."}"#,
                true,
            ),
            (b"[]", true),
            (br#"{"resources":[]}"#, false),
        ];
        for (input, refused) in table {
            assert_eq!(
                mask_state(input, 7).is_err(),
                *refused,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        assert_eq!(
            mask_state(b"x", 7).unwrap_err(),
            DiffError::NotPlainState(7)
        );
    }
}
