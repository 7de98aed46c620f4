//! Diffs and states as an operator reads them: every value by its attribute path
//! (`tags.tier: "private" → "app"`), nested objects and lists flattened, the cty type
//! of a dynamically typed attribute (`{"value": …, "type": [...]}`) dropped, counts on
//! top, and each resource instance with a stable anchor so search hits, diff rows and a
//! version's outline point at the same place.
//!
//! Pure, and downstream of masking: it reads only what `diff` returns (a [`StateDiff`],
//! whose values are masked) or a state `diff::mask_state` masked, so it can show no value
//! masking hid. Bounded: at most [`MAX_ROWS`] rows per resource, the rest counted.

use std::collections::BTreeMap;

use serde_json::Value;

use super::diff::{is_dynamic_wrapper, Change, StateDiff, MASK};

/// Rows shown per resource (or output); beyond that they are counted, not listed.
pub const MAX_ROWS: usize = 500;

/// One value that differs, by path; `None`: absent on that side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathChange {
    pub path: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// One resource instance (or output) of a diff, as rows by path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub address: String,
    pub anchor: String,
    pub change: Change,
    /// Changed: the paths that differ. Added/removed: every path of the side that exists.
    pub rows: Vec<PathChange>,
    /// Rows beyond [`MAX_ROWS`], not listed.
    pub more: usize,
    /// A changed value Terraform marked sensitive: it differs, but both sides are masked.
    pub hidden: bool,
    /// Added or removed by a move (the view's `moved` says where to or from).
    pub moved: bool,
}

/// `+add ~change −destroy` of resource instances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub add: usize,
    pub change: usize,
    pub destroy: usize,
    /// Resource instances a move's version moved (neither added nor destroyed).
    pub moved: usize,
}

/// A diff by path: counts, resources, outputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiffView {
    pub counts: Counts,
    pub resources: Vec<Item>,
    pub outputs: Vec<Item>,
    /// The diff is a move's version against the version before it.
    pub moved: Option<super::diff::Moved>,
}

impl DiffView {
    pub fn of(d: &StateDiff) -> DiffView {
        let mut view = DiffView {
            moved: d.moved.clone(),
            ..DiffView::default()
        };
        for r in &d.resources {
            let moved = d.moved.as_ref().is_some_and(|m| m.covers_change(&r.change));
            match r.change {
                _ if moved => view.counts.moved += 1,
                Change::Added => view.counts.add += 1,
                Change::Removed => view.counts.destroy += 1,
                Change::Changed => view.counts.change += 1,
            }
            let mut rows = Vec::new();
            let mut hidden = false;
            match r.change {
                Change::Changed => {
                    for a in &r.attributes {
                        let (changed, masked) = changed_paths(&a.name, &a.before, &a.after);
                        hidden |= masked;
                        rows.extend(changed);
                    }
                }
                Change::Added => rows.extend(
                    r.values
                        .iter()
                        .flat_map(|(name, v)| flatten_at(name, v))
                        .map(|(path, v)| PathChange {
                            path,
                            before: None,
                            after: Some(v),
                        }),
                ),
                Change::Removed => rows.extend(
                    r.values
                        .iter()
                        .flat_map(|(name, v)| flatten_at(name, v))
                        .map(|(path, v)| PathChange {
                            path,
                            before: Some(v),
                            after: None,
                        }),
                ),
            }
            view.resources.push(Item {
                moved,
                ..item(
                    &r.address,
                    anchor(&r.address),
                    r.change.clone(),
                    rows,
                    hidden,
                )
            });
        }
        for o in &d.outputs {
            let name = format!("output.{}", o.name);
            let (rows, hidden) = changed_paths(&name, &o.before, &o.after);
            view.outputs
                .push(item(&name, anchor(&name), o.change.clone(), rows, hidden));
        }
        view
    }

    pub fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.outputs.is_empty()
    }
}

fn item(
    address: &str,
    anchor: String,
    change: Change,
    mut rows: Vec<PathChange>,
    hidden: bool,
) -> Item {
    let more = rows.len().saturating_sub(MAX_ROWS);
    rows.truncate(MAX_ROWS);
    Item {
        address: address.to_string(),
        anchor,
        change,
        rows,
        more,
        hidden,
        moved: false,
    }
}

/// The paths under `name` whose values differ; `true` when the value differs but
/// masking made both sides look the same (one row then says so at `name`).
fn changed_paths(
    name: &str,
    before: &Option<Value>,
    after: &Option<Value>,
) -> (Vec<PathChange>, bool) {
    let flat = |v: &Option<Value>| -> BTreeMap<String, String> {
        v.as_ref()
            .map(|v| flatten_at(name, v).into_iter().collect())
            .unwrap_or_default()
    };
    let (a, b) = (flat(before), flat(after));
    let mut paths: Vec<&String> = a.keys().chain(b.keys()).collect();
    paths.sort();
    paths.dedup();
    let rows: Vec<PathChange> = paths
        .into_iter()
        .filter(|p| a.get(*p) != b.get(*p))
        .map(|p| PathChange {
            path: p.clone(),
            before: a.get(p).cloned(),
            after: b.get(p).cloned(),
        })
        .collect();
    if !rows.is_empty() {
        return (rows, false);
    }
    // Compared on the real values it differs, but what may be shown is equal: the
    // difference is in a masked value. Show the masked paths (both sides masked).
    let masked: Vec<PathChange> = a
        .iter()
        .filter(|(_, v)| v.contains(MASK))
        .map(|(p, v)| PathChange {
            path: p.clone(),
            before: Some(v.clone()),
            after: b.get(p).cloned(),
        })
        .collect();
    if !masked.is_empty() {
        return (masked, true);
    }
    let row = PathChange {
        path: name.to_string(),
        before: before.as_ref().map(|_| quoted(MASK)),
        after: after.as_ref().map(|_| quoted(MASK)),
    };
    (vec![row], true)
}

fn quoted(s: &str) -> String {
    Value::from(s).to_string()
}

/// `value` flattened under `name`: each leaf by its path, as JSON text.
pub fn flatten_at(name: &str, value: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    walk(name.to_string(), value, &mut out);
    out
}

/// Every attribute of an instance's (masked) `attributes` object, flattened.
pub fn flatten_attributes(attributes: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(map) = attributes.as_object() {
        for (k, v) in map {
            walk(key_path("", k), v, &mut out);
        }
    }
    out
}

fn walk(path: String, value: &Value, out: &mut Vec<(String, String)>) {
    if out.len() > MAX_ROWS * 4 {
        return; // beyond what is shown; the caller counts only what it lists
    }
    let value = match value.get("value") {
        Some(inner) if is_dynamic_wrapper(value) => inner,
        _ => value,
    };
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                walk(key_path(&path, k), v, out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                walk(format!("{path}[{i}]"), v, out);
            }
        }
        leaf => out.push((path, leaf.to_string())),
    }
}

/// `a.b` for a plain key, `a["x y"]` otherwise (a key with dots or spaces stays one step).
fn key_path(prefix: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !key.starts_with(|c: char| c.is_ascii_digit());
    match (prefix.is_empty(), plain) {
        (true, true) => key.to_string(),
        (false, true) => format!("{prefix}.{key}"),
        (_, false) => format!("{prefix}[{}]", Value::from(key)),
    }
}

/// The HTML id of a resource instance's address (the same on every page): letters,
/// digits, `_`, `-` and `.` kept, every other byte as `_xx`, so two addresses never
/// share one.
pub fn anchor(address: &str) -> String {
    let mut out = String::from("r-");
    for b in address.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' => out.push(b as char),
            other => out.push_str(&format!("_{other:02x}")),
        }
    }
    out
}

/// One resource instance of a (masked) state, for a version's outline and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub address: String,
    pub anchor: String,
    pub rows: Vec<(String, String)>,
    pub more: usize,
}

/// A version's resources grouped module → type (then name, in the instance address).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outline {
    /// `(module or "" for the root) → (type, with "data." for data sources) → instances`.
    pub modules: BTreeMap<String, BTreeMap<String, Vec<Instance>>>,
    /// The outputs, flattened (`output.name…`).
    pub outputs: Vec<(String, String)>,
}

impl Outline {
    /// `masked`: a state as `diff::mask_state` returns it, or one the operator
    /// revealed (audited by `Operations::reveal`).
    pub fn of(masked: &Value) -> Outline {
        let mut outline = Outline::default();
        for resource in masked["resources"].as_array().into_iter().flatten() {
            let module = resource["module"].as_str().unwrap_or("").to_string();
            let data = resource["mode"].as_str() == Some("data");
            let kind = format!(
                "{}{}",
                if data { "data." } else { "" },
                resource["type"].as_str().unwrap_or("?")
            );
            for instance in resource["instances"].as_array().into_iter().flatten() {
                let address = super::diff::address(resource, instance);
                let mut rows = flatten_attributes(&instance["attributes"]);
                let more = rows.len().saturating_sub(MAX_ROWS);
                rows.truncate(MAX_ROWS);
                outline
                    .modules
                    .entry(module.clone())
                    .or_default()
                    .entry(kind.clone())
                    .or_default()
                    .push(Instance {
                        anchor: anchor(&address),
                        address,
                        rows,
                        more,
                    });
            }
        }
        for (name, o) in masked["outputs"].as_object().into_iter().flatten() {
            let path = format!("output.{}", key_path("", name));
            outline.outputs.extend(flatten_at(&path, &o["value"]));
        }
        outline
    }

    pub fn instances(&self) -> usize {
        self.modules
            .values()
            .flat_map(|types| types.values())
            .map(Vec::len)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::diff::diff_states;
    use crate::operator::diff::tests::state;
    use serde_json::json;

    fn one(kind: &str, name: &str, attributes: Value, sensitive: Value) -> Value {
        json!([{"mode": "managed", "type": kind, "name": name,
                "instances": [{"attributes": attributes, "sensitive_attributes": sensitive}]}])
    }

    #[test]
    fn values_are_flattened_by_path_without_the_type_schema() {
        // (value, rows)
        let table: Vec<(Value, Vec<(&str, &str)>)> = vec![
            (json!("x"), vec![("a", r#""x""#)]),
            (json!(5), vec![("a", "5")]),
            (json!(null), vec![("a", "null")]),
            (json!({}), vec![("a", "{}")]),
            (json!([]), vec![("a", "[]")]),
            (
                json!({"tier": "app", "n": [1, {"k": true}]}),
                vec![
                    ("a.n[0]", "1"),
                    ("a.n[1].k", "true"),
                    ("a.tier", r#""app""#),
                ],
            ),
            (
                json!({"x y": 1, "a.b": 2}),
                vec![(r#"a["a.b"]"#, "2"), (r#"a["x y"]"#, "1")],
            ),
            // terraform_data's dynamically typed input: the cty type is dropped.
            (
                json!({"value": {"tier": "app"}, "type": ["object", {"tier": "string"}]}),
                vec![("a.tier", r#""app""#)],
            ),
            (
                json!({"value": "s", "type": "string"}),
                vec![("a", r#""s""#)],
            ),
        ];
        for (value, want) in table {
            let got = flatten_at("a", &value);
            let want: Vec<(String, String)> = want
                .iter()
                .map(|(p, v)| (p.to_string(), v.to_string()))
                .collect();
            assert_eq!(got, want, "{value}");
        }
    }

    #[test]
    fn a_diff_reads_by_path_with_counts() {
        let tags =
            |tier: &str| json!({"id": "i-1", "tags": {"tier": tier, "team": "net"}, "size": 2});
        let a = state(
            json!([
                {"mode": "managed", "type": "aws_vpc", "name": "main", "instances": [{"attributes": tags("private")}]},
                {"mode": "managed", "type": "aws_eip", "name": "old", "instances": [{"attributes": {"ip": "1.2.3.4"}}]},
            ]),
            json!({"o": {"value": {"x": 1}}}),
        );
        let b = state(
            json!([
                {"mode": "managed", "type": "aws_vpc", "name": "main", "instances": [{"attributes": tags("app")}]},
                {"mode": "managed", "type": "aws_s3_bucket", "name": "new", "module": "module.logs",
                 "instances": [{"index_key": "k", "attributes": {"bucket": "b", "tags": {"a": "1"}}}]},
            ]),
            json!({"o": {"value": {"x": 2}}}),
        );
        let view = DiffView::of(&diff_states(&a, 1, &b, 2).unwrap());
        assert_eq!(
            view.counts,
            Counts {
                add: 1,
                change: 1,
                destroy: 1,
                moved: 0,
            }
        );
        let by: BTreeMap<&str, &Item> = view
            .resources
            .iter()
            .map(|i| (i.address.as_str(), i))
            .collect();
        let row = |p: &str, b: Option<&str>, a: Option<&str>| PathChange {
            path: p.into(),
            before: b.map(String::from),
            after: a.map(String::from),
        };
        assert_eq!(
            by["aws_vpc.main"].rows,
            [row("tags.tier", Some(r#""private""#), Some(r#""app""#))]
        );
        assert_eq!(
            by[r#"module.logs.aws_s3_bucket.new["k"]"#].rows,
            [
                row("bucket", None, Some(r#""b""#)),
                row("tags.a", None, Some(r#""1""#))
            ]
        );
        assert_eq!(
            by["aws_eip.old"].rows,
            [row("ip", Some(r#""1.2.3.4""#), None)]
        );
        assert_eq!(
            view.outputs[0].rows,
            [row("output.o.x", Some("1"), Some("2"))]
        );
    }

    /// A move's version against the one before it counts what moved as moved, on the
    /// side the move took (removed from its source, added to its destination), never
    /// as added or destroyed; anything else it did is counted as before.
    #[test]
    fn a_moves_version_counts_what_moved_as_moved() {
        use crate::operator::diff::Moved;
        let r = |name: &str| json!({"mode": "managed", "type": "t", "name": name, "instances": [{"attributes": {"id": name}}]});
        let full = state(json!([r("a"), r("b"), r("keep")]), json!({}));
        let less = state(json!([r("keep")]), json!({}));
        let mut out = diff_states(&full, 1, &less, 2).unwrap();
        out.moved = Some(Moved::To("app".into()));
        let view = DiffView::of(&out);
        assert_eq!(
            view.counts,
            Counts {
                moved: 2,
                ..Counts::default()
            }
        );
        assert!(view.resources.iter().all(|i| i.moved), "{view:?}");
        let mut back = diff_states(&less, 1, &full, 2).unwrap();
        back.moved = Some(Moved::From("net".into()));
        assert_eq!(
            DiffView::of(&back).counts,
            Counts {
                moved: 2,
                ..Counts::default()
            }
        );
        // The source's move does not cover additions (nor a change in place).
        back.moved = Some(Moved::To("app".into()));
        let view = DiffView::of(&back);
        assert_eq!(
            view.counts,
            Counts {
                add: 2,
                ..Counts::default()
            }
        );
        assert!(view.resources.iter().all(|i| !i.moved));
        assert_eq!(Moved::To("app".into()).label(), "moved to app");
        assert_eq!(Moved::From("net".into()).label(), "moved from net");
        assert_eq!(
            serde_json::to_value(Moved::To("app".into())).unwrap(),
            json!({"to": "app"})
        );
    }

    #[test]
    fn no_sensitive_value_reaches_a_row_and_a_hidden_change_says_so() {
        let secret = "hunter2-very-secret";
        let input = |pass: &str| json!({"value": {"user": "u", "pass": pass}, "type": ["object", {"user": "string", "pass": "string"}]});
        let marked = json!([[{"type": "get_attr", "value": "input"}, {"type": "get_attr", "value": "pass"}]]);
        let a = state(
            one(
                "terraform_data",
                "db",
                json!({"input": input(secret), "output": input(secret)}),
                marked.clone(),
            ),
            json!({}),
        );
        let b = state(
            json!([
                {"mode": "managed", "type": "terraform_data", "name": "db",
                 "instances": [{"attributes": {"input": input("other-secret-value"), "output": input("other-secret-value")}, "sensitive_attributes": marked}]},
                {"mode": "managed", "type": "terraform_data", "name": "copy",
                 "instances": [{"attributes": {"input": format!("postgres://u:{secret}@db")}}]},
            ]),
            json!({"s": {"value": secret, "sensitive": true}}),
        );
        let view = DiffView::of(&diff_states(&a, 1, &b, 2).unwrap());
        let all = format!("{view:?}");
        assert!(
            !all.contains(secret) && !all.contains("other-secret-value"),
            "{all}"
        );
        let db = view
            .resources
            .iter()
            .find(|i| i.address == "terraform_data.db")
            .unwrap();
        assert!(db.hidden, "{db:?}");
        assert!(db.rows.iter().any(|r| r.path == "input.pass"), "{db:?}");
        assert!(all.contains("postgres://u:(sensitive)@db"), "{all}");
    }

    #[test]
    fn anchors_are_stable_and_distinct() {
        let table = [
            ("aws_vpc.main", "r-aws_5fvpc.main"),
            (r#"a.b["x y"]"#, "r-a.b_5b_22x_20y_22_5d"),
            (r#"a.b["x_y"]"#, "r-a.b_5b_22x_5fy_22_5d"),
        ];
        for (address, want) in table {
            assert_eq!(anchor(address), want);
        }
    }

    #[test]
    fn an_outline_groups_by_module_and_type_from_the_masked_state() {
        let doc = json!({"resources": [
            {"mode": "managed", "type": "null_resource", "name": "a", "instances": [{"index_key": 0, "attributes": {"id": "1"}}, {"index_key": 1, "attributes": {"id": "2"}}]},
            {"mode": "data", "type": "aws_ami", "name": "x", "module": "module.m", "instances": [{"attributes": {"id": "ami"}}]},
        ], "outputs": {"o": {"value": [1]}}});
        let o = Outline::of(&doc);
        assert_eq!(o.instances(), 3);
        let root = &o.modules[""]["null_resource"];
        assert_eq!(root[1].address, "null_resource.a[1]");
        assert_eq!(root[1].rows, [("id".to_string(), r#""2""#.to_string())]);
        assert_eq!(
            o.modules["module.m"]["data.aws_ami"][0].address,
            "module.m.data.aws_ami.x"
        );
        assert_eq!(o.outputs, [("output.o[0]".to_string(), "1".to_string())]);
    }
}
