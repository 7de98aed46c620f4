//! What changed between two Terraform/OpenTofu states, by resource address: instances
//! added, removed or changed (with the top-level attributes that differ), and outputs;
//! and the masking every operator view goes through. Pure: it reads parsed JSON
//! documents and never keeps content.
//!
//! Masking follows what Terraform marked: each instance's `sensitive_attributes` paths
//! (only that sub-path is masked, not the attribute enclosing it) and outputs with
//! `"sensitive": true`. Terraform does not mark copies — `terraform_data`'s `output`
//! repeats its sensitive `input` unmarked, and so does anything that reads it — so every
//! string or number *equal* to a marked value is masked too, and every marked string of
//! [`MIN_EMBEDDED`] bytes or more is masked *inside* longer strings (a connection string
//! built from an unmarked copy); a boolean only where it is marked (a `true` elsewhere
//! says nothing on its own). That holds wherever the value appears in the resources,
//! outputs and check results, and in an instance's `index_key`, so an address shown
//! never spells a secret. Attributes whose names look like secrets are masked as well.
//! What it cannot know: a secret Terraform never marked, or a transformed copy (an
//! encoding, a hash, a piece of it) of one it did.
//!
//! Bounded work: one walk over the document to collect the marked values (each path is
//! followed once, at most its own length) and one to replace, each linear in the size
//! of the state: one hash-set lookup per string or number, and one Aho-Corasick scan per
//! string over at most [`MAX_EMBEDDED_PATTERNS`] marked strings of at most 1 MiB
//! together (the longest first; beyond that, values are masked only whole). The states
//! given here are read whole only up to `max_view_bytes` (search: its per-search byte
//! budget), and serde_json refuses documents nested deeper than 128.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;
use serde_json::{Map, Value};

/// What a masked value is shown as.
pub const MASK: &str = "(sensitive)";

/// What the version page says about masking: what it can and cannot know.
pub const MASKING_LIMITS: &str = "Sensitive values are shown as “(sensitive)”: the values \
     Terraform marked sensitive and every copy of them anywhere in this state, also inside a \
     longer text (for values of 8 characters or more). A secret Terraform never marked, or a \
     changed copy of one (encoded, hashed, cut in pieces), cannot be recognised and is shown \
     as it is.";

/// Attribute names whose values are masked even when the provider did not mark them.
const SECRET_LOOKING: &[&str] = &["password", "secret", "token", "private_key", "passphrase"];

/// Top-level fields of a state that are stategate's and Terraform's bookkeeping, never
/// a value from the configuration.
const STATE_METADATA: &[&str] = &["version", "terraform_version", "serial", "lineage"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
    /// For `added` and `removed`: the instance's attributes on the side that has it,
    /// masked (what the UI lists; not part of the API's JSON).
    #[serde(skip)]
    pub values: Vec<(String, Value)>,
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
    /// Set when the diff is of a move's version against the version just before it
    /// (`Operations::diff`): the resources it removed (or added) are the ones that moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved: Option<Moved>,
}

/// A move's version (`workspace move`): its source's lost the moved resources to the
/// other workspace (`{"to": "app"}`), its destination's got them from it
/// (`{"from": "net"}`). Every listing counts and labels them as moved, never as added
/// or destroyed, through this one type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Moved {
    To(String),
    From(String),
}

impl Moved {
    /// The move a version's writer facts record, if it is a move's version.
    pub fn of(facts: &crate::store::WriteFacts) -> Option<Moved> {
        match (&facts.moved_to, &facts.moved_from) {
            (Some(to), _) => Some(Moved::To(to.clone())),
            (None, Some(from)) => Some(Moved::From(from.clone())),
            (None, None) => None,
        }
    }

    /// `moved to app` / `moved from net`.
    pub fn label(&self) -> String {
        match self {
            Moved::To(ws) => format!("moved to {ws}"),
            Moved::From(ws) => format!("moved from {ws}"),
        }
    }

    /// The workspace at the other end of the move.
    pub fn workspace(&self) -> &str {
        match self {
            Moved::To(ws) | Moved::From(ws) => ws,
        }
    }

    /// Whether a resource the move's version `removed` (else: added) is one that moved:
    /// the source's version only removes what moved, the destination's only adds it.
    pub fn covers(&self, removed: bool) -> bool {
        matches!(
            (self, removed),
            (Moved::To(_), true) | (Moved::From(_), false)
        )
    }

    /// [`Self::covers`] for a diff's change (a change in place never is a move).
    pub fn covers_change(&self, change: &Change) -> bool {
        match change {
            Change::Added => self.covers(false),
            Change::Removed => self.covers(true),
            Change::Changed => false,
        }
    }
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

/// Marked strings at least this long (in bytes) are also masked inside longer strings;
/// shorter ones only as whole values (a marked "prod" must not eat every "production").
pub const MIN_EMBEDDED: usize = 8;
/// At most this many marked strings, of at most this many bytes together, are looked
/// for inside longer strings (the longest first); the rest only as whole values. Keeps
/// the search automaton small on any state.
pub const MAX_EMBEDDED_PATTERNS: usize = 10_000;
const MAX_EMBEDDED_BYTES: usize = 1024 * 1024;

/// Every value Terraform marked sensitive in one or more states: the strings and
/// numbers that are masked wherever they appear. (Booleans are masked where they are
/// marked, never by value: a `true` elsewhere says nothing.)
#[derive(Debug, Default, Clone)]
pub struct Secrets {
    strings: HashSet<String>,
    /// serde_json's own text of each number (`5` and `5.0` are different values).
    numbers: HashSet<String>,
    /// Finds marked strings of [`MIN_EMBEDDED`] bytes or more inside other strings.
    embedded: Option<aho_corasick::AhoCorasick>,
}

impl Secrets {
    /// The values `doc` marks: at every instance's `sensitive_attributes` path and in
    /// every sensitive output.
    pub fn of(doc: &Value) -> Secrets {
        Self::of_all(&[doc])
    }

    /// The values any of `docs` marks (a value marked in one version of a diff is
    /// masked in the other too).
    pub fn of_all(docs: &[&Value]) -> Secrets {
        let mut found = Secrets::default();
        for doc in docs {
            found.collect_marked(doc);
        }
        found.embedded = found.embedded_finder();
        found
    }

    fn collect_marked(&mut self, doc: &Value) {
        for instance in all_instances(doc) {
            let Some(attrs) = instance.get("attributes") else {
                continue;
            };
            for path in sensitive_paths(instance) {
                if let Some(node) = resolve(attrs, path) {
                    self.collect(node);
                }
            }
        }
        for output in doc["outputs"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(_, o)| o)
        {
            if output["sensitive"] == Value::Bool(true) {
                self.collect(&output["value"]);
            }
        }
    }

    /// One automaton over the long enough marked strings, longest first and bounded
    /// (see [`MAX_EMBEDDED_BYTES`]); leftmost-longest, so overlapping secrets go whole.
    fn embedded_finder(&self) -> Option<aho_corasick::AhoCorasick> {
        let mut long: Vec<&String> = self
            .strings
            .iter()
            .filter(|s| s.len() >= MIN_EMBEDDED)
            .collect();
        long.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        let mut budget = MAX_EMBEDDED_BYTES;
        let patterns: Vec<&String> = long
            .into_iter()
            .take(MAX_EMBEDDED_PATTERNS)
            .filter(|s| match budget.checked_sub(s.len()) {
                Some(left) => {
                    budget = left;
                    true
                }
                None => false,
            })
            .collect();
        if patterns.is_empty() {
            return None;
        }
        aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(patterns)
            .ok()
    }

    pub fn is_empty(&self) -> bool {
        self.strings.is_empty() && self.numbers.is_empty()
    }

    /// Every string and number under `node`.
    fn collect(&mut self, node: &Value) {
        match node {
            Value::String(s) if !s.is_empty() => {
                self.strings.insert(s.clone());
            }
            Value::Number(n) => {
                self.numbers.insert(n.to_string());
            }
            Value::Array(items) => items.iter().for_each(|v| self.collect(v)),
            Value::Object(map) => map.values().for_each(|v| self.collect(v)),
            _ => {}
        }
    }

    /// This scalar as it may be shown, when it is or contains a marked value.
    fn masked(&self, value: &Value) -> Option<Value> {
        match value {
            Value::String(s) if self.strings.contains(s) => Some(Value::from(MASK)),
            Value::String(s) => {
                let finder = self.embedded.as_ref()?;
                finder.is_match(s).then(|| {
                    let mut out = String::with_capacity(s.len());
                    finder.replace_all_with(s, &mut out, |_, _, dst| {
                        dst.push_str(MASK);
                        true
                    });
                    Value::from(out)
                })
            }
            Value::Number(n)
                if !self.numbers.is_empty() && self.numbers.contains(&n.to_string()) =>
            {
                Some(Value::from(MASK))
            }
            _ => None,
        }
    }

    /// Replaces every string and number under `node` that is or contains a marked value.
    fn mask_copies(&self, node: &mut Value) {
        match node {
            Value::Array(items) => items.iter_mut().for_each(|v| self.mask_copies(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.mask_copies(v)),
            scalar => {
                if let Some(shown) = self.masked(scalar) {
                    *scalar = shown;
                }
            }
        }
    }
}

/// Diffs state `a` (version `va`) against state `b` (version `vb`).
pub fn diff_states(a: &[u8], va: i64, b: &[u8], vb: i64) -> Result<StateDiff, DiffError> {
    let a = parse(a, va)?;
    let b = parse(b, vb)?;
    let (mut ma, mut mb) = (a.clone(), b.clone());
    share_sensitive_paths(&mut ma, &b);
    share_sensitive_paths(&mut mb, &a);
    let secrets = Secrets::of_all(&[&ma, &mb]);
    let (ma, mb) = (mask(ma, &secrets), mask(mb, &secrets));
    let (ra, rb) = (instances(&a, &ma, &secrets), instances(&b, &mb, &secrets));
    let mut resources = Vec::new();
    for (address, before) in &ra {
        match rb.get(address) {
            None => resources.push(ResourceChange {
                values: values(before),
                ..resource(&before.shown, Change::Removed, Vec::new())
            }),
            Some(after) => {
                let changed = changed_attributes(before, after);
                if !changed.is_empty() {
                    resources.push(resource(&after.shown, Change::Changed, changed));
                }
            }
        }
    }
    for (_, after) in rb.iter().filter(|(k, _)| !ra.contains_key(*k)) {
        resources.push(ResourceChange {
            values: values(after),
            ..resource(&after.shown, Change::Added, Vec::new())
        });
    }
    resources.sort_by(|x, y| x.address.cmp(&y.address));
    Ok(StateDiff {
        moved: None,
        resources,
        outputs: diff_outputs(&outputs(&a, &ma), &outputs(&b, &mb)),
    })
}

/// The state with every sensitive value replaced by [`MASK`] (what a viewer shows by default).
pub fn mask_state(state: &[u8], version: i64) -> Result<Value, DiffError> {
    let doc = parse(state, version)?;
    let secrets = Secrets::of(&doc);
    Ok(mask(doc, &secrets))
}

/// `doc` masked: marked paths, secret-looking attributes, sensitive outputs, then
/// every copy of a value in `secrets`.
fn mask(mut doc: Value, secrets: &Secrets) -> Value {
    let Some(top) = doc.as_object_mut() else {
        return doc;
    };
    for (key, value) in top.iter_mut() {
        match key.as_str() {
            "resources" => instances_mut(value).for_each(mask_instance),
            "outputs" => {
                for output in value
                    .as_object_mut()
                    .into_iter()
                    .flat_map(|o| o.values_mut())
                {
                    let sensitive = output["sensitive"] == Value::Bool(true);
                    if let Some(v) = output.get_mut("value").filter(|_| sensitive) {
                        *v = shown(v, true);
                    }
                }
            }
            k if STATE_METADATA.contains(&k) => continue,
            _ => {}
        }
        // Everything else holds values too (attributes, index keys, the paths into a
        // set, which name the element, check results, whatever a later format adds),
        // whatever its shape: every copy of a marked value is masked.
        secrets.mask_copies(value);
    }
    doc
}

/// Masks an instance's marked paths and secret-looking attributes (copies of marked
/// values are masked afterwards, over the whole document).
fn mask_instance(instance: &mut Value) {
    let paths: Vec<Vec<Value>> = sensitive_paths(instance)
        .into_iter()
        .map(<[Value]>::to_vec)
        .collect();
    if let Some(attrs) = instance.get_mut("attributes") {
        for path in &paths {
            mask_path(attrs, path);
        }
        if let Some(map) = attrs.as_object_mut() {
            for (name, value) in map.iter_mut() {
                if looks_secret(name) {
                    *value = shown(value, true);
                }
            }
        }
    }
}

/// One step of a `sensitive_attributes` path, as Terraform writes it:
/// `{"type": "get_attr", "value": name}` or `{"type": "index", "value": {"value": key, "type": …}}`.
#[derive(Debug, Clone, PartialEq)]
enum Step<'a> {
    Name(&'a str),
    Position(usize),
    /// A step this reader does not understand (a set element, a future form).
    Unknown,
}

fn step(raw: &Value) -> Step<'_> {
    let value = &raw["value"];
    match raw["type"].as_str() {
        Some("get_attr") => value.as_str().map_or(Step::Unknown, Step::Name),
        Some("index") => match &value["value"] {
            Value::String(key) => Step::Name(key),
            Value::Number(n) => n
                .as_u64()
                .and_then(|i| usize::try_from(i).ok())
                .map_or(Step::Unknown, Step::Position),
            _ => Step::Unknown,
        },
        // Older writers: a bare name.
        None => value.as_str().map_or(Step::Unknown, Step::Name),
        Some(_) => Step::Unknown,
    }
}

/// A dynamically typed attribute (`terraform_data`'s `input`/`output`, any `any`
/// attribute) is stored as `{"value": …, "type": <cty type>}`; a path goes through it
/// to the value (the wrapper is how the JSON encodes it, not part of the path).
pub(crate) fn is_dynamic_wrapper(node: &Value) -> bool {
    let Some(map) = node.as_object() else {
        return false;
    };
    let cty_type = match map.get("type") {
        Some(Value::String(t)) => ["string", "number", "bool", "dynamic"].contains(&t.as_str()),
        Some(Value::Array(t)) => t
            .first()
            .and_then(Value::as_str)
            .is_some_and(|kind| ["list", "set", "map", "object", "tuple"].contains(&kind)),
        _ => false,
    };
    map.len() == 2 && map.contains_key("value") && cty_type
}

/// How one step applies to a node.
enum Follow {
    /// Go into the child at this key or position.
    Key(String),
    At(usize),
    /// Nothing is there: the path leads nowhere.
    Absent,
    /// The step cannot be followed (a set element, an unknown step, a scalar): all of
    /// this node counts as sensitive.
    Whole,
    /// A dynamic wrapper: go into its value first.
    Unwrap,
}

fn follow(node: &Value, step: &Step<'_>) -> Follow {
    if is_dynamic_wrapper(node) {
        // `{"value": …, "type": …}` could in theory be a plain object too; a step named
        // like one of its keys cannot be told apart, so all of it counts.
        return match step {
            Step::Name("value" | "type") => Follow::Whole,
            _ => Follow::Unwrap,
        };
    }
    match (step, node) {
        (Step::Name(name), Value::Object(map)) if map.contains_key(*name) => {
            Follow::Key((*name).to_string())
        }
        (Step::Position(i), Value::Array(items)) if *i < items.len() => Follow::At(*i),
        (Step::Name(_), Value::Object(_)) | (Step::Position(_), Value::Array(_)) => Follow::Absent,
        _ => Follow::Whole,
    }
}

/// What a path leads to, for reading (`None`: nothing is there). See [`follow`].
fn resolve<'a>(attrs: &'a Value, path: &[Value]) -> Option<&'a Value> {
    let mut node = attrs;
    let mut steps = path.iter().map(step).peekable();
    while let Some(step) = steps.peek() {
        let child = match follow(node, step) {
            Follow::Unwrap => node.get("value"),
            Follow::Key(key) => {
                steps.next();
                node.get(key.as_str())
            }
            Follow::At(i) => {
                steps.next();
                node.get(i)
            }
            Follow::Absent => return None,
            Follow::Whole => return Some(node),
        };
        node = child?;
    }
    Some(match node.get("value") {
        Some(value) if is_dynamic_wrapper(node) => value,
        _ => node,
    })
}

/// Masks what `path` leads to (the same walk as [`resolve`]), and only that: the
/// attribute around it, the other keys of its object and a wrapper's `type` stay visible.
fn mask_path(attrs: &mut Value, path: &[Value]) {
    let mut node = attrs;
    let mut steps = path.iter().map(step).peekable();
    while let Some(step) = steps.peek() {
        let child = match follow(node, step) {
            Follow::Unwrap => node.get_mut("value"),
            Follow::Key(key) => {
                steps.next();
                node.get_mut(key.as_str())
            }
            Follow::At(i) => {
                steps.next();
                node.get_mut(i)
            }
            Follow::Absent => return,
            Follow::Whole => break,
        };
        match child {
            Some(child) => node = child,
            None => return,
        }
    }
    if steps.peek().is_none() && is_dynamic_wrapper(node) {
        match node.get_mut("value") {
            Some(value) => node = value,
            None => return, // a wrapper has one
        }
    }
    *node = shown(node, true);
}

fn resource(address: &str, change: Change, attributes: Vec<AttributeChange>) -> ResourceChange {
    ResourceChange {
        address: address.to_string(),
        change,
        attributes,
        values: Vec::new(),
    }
}

/// An instance's masked attributes, by name.
fn values(instance: &Instance) -> Vec<(String, Value)> {
    instance
        .masked
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
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

/// [`address`] as it may be shown: an index key equal to a marked value is masked.
pub(crate) fn shown_address(resource: &Value, instance: &Value, secrets: &Secrets) -> String {
    match instance
        .get("index_key")
        .and_then(|key| secrets.masked(key))
    {
        Some(shown) => address(resource, &serde_json::json!({ "index_key": shown })),
        None => address(resource, instance),
    }
}

fn all_instances(doc: &Value) -> impl Iterator<Item = &Value> {
    doc["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["instances"].as_array())
        .flatten()
}

fn instances_mut(resources: &mut Value) -> impl Iterator<Item = &mut Value> {
    resources
        .as_array_mut()
        .into_iter()
        .flatten()
        .filter_map(|r| r.get_mut("instances").and_then(Value::as_array_mut))
        .flatten()
}

/// One resource instance of a diffed state: its real attributes (compared) and masked
/// ones (shown), and its address as shown.
struct Instance<'a> {
    shown: String,
    real: &'a Map<String, Value>,
    masked: &'a Map<String, Value>,
}

/// What an instance without an attributes object has.
static NO_ATTRIBUTES: std::sync::LazyLock<Map<String, Value>> = std::sync::LazyLock::new(Map::new);

/// Each instance by its real address (unique, even when two shown ones look alike).
fn instances<'a>(
    doc: &'a Value,
    masked: &'a Value,
    secrets: &Secrets,
) -> BTreeMap<String, Instance<'a>> {
    let mut out = BTreeMap::new();
    let pairs = doc["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(masked["resources"].as_array().into_iter().flatten());
    for (resource, masked_resource) in pairs {
        let real = resource["instances"].as_array().into_iter().flatten();
        let shown = masked_resource["instances"]
            .as_array()
            .into_iter()
            .flatten();
        for (instance, masked_instance) in real.zip(shown) {
            let attrs = |i: &'a Value| i["attributes"].as_object().unwrap_or(&NO_ATTRIBUTES);
            out.insert(
                address(resource, instance),
                Instance {
                    shown: shown_address(resource, instance, secrets),
                    real: attrs(instance),
                    masked: attrs(masked_instance),
                },
            );
        }
    }
    out
}

/// Adds to each instance of `doc` the sensitive paths the instance of the same
/// address has in `other`: a path marked in either version is masked in both.
fn share_sensitive_paths(doc: &mut Value, other: &Value) {
    let mut marked: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for resource in other["resources"].as_array().into_iter().flatten() {
        for instance in resource["instances"].as_array().into_iter().flatten() {
            if let Some(paths) = instance["sensitive_attributes"].as_array() {
                if !paths.is_empty() {
                    marked.insert(address(resource, instance), paths.clone());
                }
            }
        }
    }
    if marked.is_empty() {
        return;
    }
    for resource in doc
        .get_mut("resources")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        // What the address is made of (not the instances: no copy of the content).
        let head: Map<String, Value> = ["module", "mode", "type", "name"]
            .iter()
            .filter_map(|k| Some((k.to_string(), resource.get(*k)?.clone())))
            .collect();
        let head = Value::Object(head);
        for instance in resource
            .get_mut("instances")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let Some(extra) = marked.get(&address(&head, instance)) else {
                continue;
            };
            let Some(instance) = instance.as_object_mut() else {
                continue;
            };
            match instance.get_mut("sensitive_attributes") {
                Some(Value::Array(paths)) => paths.extend(extra.iter().cloned()),
                _ => {
                    instance.insert("sensitive_attributes".into(), Value::Array(extra.clone()));
                }
            }
        }
    }
}

/// Sensitive paths of an instance: a list of paths, each a list of steps (a bare step
/// is accepted as a one-step path).
fn sensitive_paths(instance: &Value) -> Vec<&[Value]> {
    instance["sensitive_attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|path| match path {
            Value::Array(steps) if !steps.is_empty() => Some(steps.as_slice()),
            step @ Value::Object(_) => Some(std::slice::from_ref(step)),
            _ => None,
        })
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

/// Compared on the real values (a changed secret is listed), shown masked.
fn changed_attributes(before: &Instance, after: &Instance) -> Vec<AttributeChange> {
    let mut names: Vec<&String> = before.real.keys().chain(after.real.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|n| before.real.get(*n) != after.real.get(*n))
        .map(|n| AttributeChange {
            name: n.clone(),
            before: before.masked.get(n).cloned(),
            after: after.masked.get(n).cloned(),
        })
        .collect()
}

/// Each output's real value, its value as shown and whether it is marked sensitive.
fn outputs(doc: &Value, masked: &Value) -> BTreeMap<String, (Value, Value, bool)> {
    doc["outputs"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, o)| {
            let shown = masked["outputs"][name]["value"].clone();
            let sensitive = o["sensitive"] == Value::Bool(true);
            (name.clone(), (o["value"].clone(), shown, sensitive))
        })
        .collect()
}

/// Compared on the real values; an output marked sensitive in either version is
/// masked in both.
fn diff_outputs(
    a: &BTreeMap<String, (Value, Value, bool)>,
    b: &BTreeMap<String, (Value, Value, bool)>,
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
            let sensitive = before.is_some_and(|o| o.2) || after.is_some_and(|o| o.2);
            let show = |o: &(Value, Value, bool)| {
                if sensitive {
                    shown(&o.0, true)
                } else {
                    o.1.clone()
                }
            };
            Some(OutputChange {
                name: name.clone(),
                change,
                before: before.map(show),
                after: after.map(show),
            })
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A version-4 state document holding `resources` and `outputs`.
    pub(crate) fn state(resources: Value, outputs: Value) -> Vec<u8> {
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

    /// A `terraform_data` instance as Terraform 1.15 writes it: dynamic `input` and
    /// `output` wrapped as `{"value", "type"}`, paths in cty form.
    fn data(name: &str, key: Option<Value>, value: Value, paths: Value) -> Value {
        let mut instance = json!({
            "schema_version": 0,
            "attributes": {
                "id": format!("id-{name}"),
                "input": {"value": value, "type": "dynamic-ish"},
                "output": {"value": value, "type": "dynamic-ish"},
                "triggers_replace": null
            },
            "sensitive_attributes": paths,
        });
        // The type descriptor as Terraform writes it for this value.
        let ty = match &value {
            Value::String(_) => json!("string"),
            Value::Number(_) => json!("number"),
            Value::Array(_) => json!(["tuple", []]),
            _ => json!(["object", {}]),
        };
        instance["attributes"]["input"]["type"] = ty.clone();
        instance["attributes"]["output"]["type"] = ty;
        if let Some(key) = key {
            instance["index_key"] = key;
        }
        res("terraform_data", name, json!([instance]))
    }

    fn get_attr(name: &str) -> Value {
        json!({"type": "get_attr", "value": name})
    }

    fn index(key: Value) -> Value {
        let ty = if key.is_number() { "number" } else { "string" };
        json!({"type": "index", "value": {"value": key, "type": ty}})
    }

    /// Every value Terraform marks, and every exact copy of it, is masked; the rest of
    /// the document (and the parts of an object that are not marked) stays visible.
    #[test]
    fn masking_follows_marked_paths_and_copies_of_marked_values() {
        let secret = "TOP-S3CRET-77";
        // (case, resources, outputs, must not appear, must still appear)
        type Case<'a> = (&'a str, Value, Value, Vec<&'a str>, Vec<&'a str>);
        let table: Vec<Case> = vec![
            (
                "input marked, output and a reader's copies unmarked (real Terraform)",
                json!([
                    data("db", None, json!(secret), json!([[get_attr("input")]])),
                    data("copy", None, json!(secret), json!([])),
                ]),
                json!({"plain": {"value": "visible"}}),
                vec![secret],
                vec!["id-db", "id-copy", "visible", r#""type":"string""#],
            ),
            (
                "one field of an object: only that field",
                json!([data(
                    "nested",
                    None,
                    json!({"user": "admin", "pass": "NESTED-9f2", "port": 5432}),
                    json!([[get_attr("input"), get_attr("pass")]]),
                )]),
                json!({}),
                vec!["NESTED-9f2"],
                vec![r#""user":"admin""#, r#""port":5432"#],
            ),
            (
                "a list element and a map value by index",
                json!([
                    data(
                        "list",
                        None,
                        json!(["a", "L1ST-S3CRET", 7]),
                        json!([[get_attr("input"), index(json!(1))]])
                    ),
                    data(
                        "map",
                        None,
                        json!({"k1": "v", "k2": "M4P-S3CRET"}),
                        json!([[get_attr("input"), index(json!("k2"))]])
                    ),
                ]),
                json!({}),
                vec!["L1ST-S3CRET", "M4P-S3CRET"],
                vec![r#"["a","(sensitive)",7]"#, r#""k1":"v""#],
            ),
            (
                "a marked number is masked where it is copied; a marked bool where it is",
                json!([
                    data(
                        "num",
                        None,
                        json!({"n": 31337, "b": true}),
                        json!([
                            [get_attr("input"), get_attr("n")],
                            [get_attr("input"), get_attr("b")]
                        ])
                    ),
                    res(
                        "t",
                        "other",
                        json!([{"attributes": {"port": 31337, "enabled": true, "count": 3}}])
                    ),
                ]),
                json!({}),
                vec!["31337"],
                // A copy of a marked boolean is not recognised: `true` says nothing alone.
                vec![
                    r#"{"b":"(sensitive)","n":"(sensitive)"}"#,
                    r#"{"b":true,"n":"(sensitive)"}"#,
                    r#""enabled":true"#,
                    r#""count":3"#,
                ],
            ),
            (
                "sensitive outputs: theirs and every copy of them",
                json!([res(
                    "t",
                    "cfg",
                    json!([{"attributes": {"content": "0UT-S3CRET", "note": "keep"}}])
                )]),
                json!({
                    "pw": {"value": "0UT-S3CRET", "sensitive": true},
                    "copy": {"value": ["0UT-S3CRET", "fine"]},
                    "obj": {"value": {"a": "0BJ-S3CRET", "n": 12}, "sensitive": true},
                    "reader": {"value": "0BJ-S3CRET"},
                }),
                vec!["0UT-S3CRET", "0BJ-S3CRET"],
                vec!["keep", "fine"],
            ),
            (
                "a step that cannot be followed (a set element) masks all of its node",
                json!([res(
                    "t",
                    "set",
                    json!([{
                        "attributes": {"members": ["S3T-A", "S3T-B"], "name": "grp"},
                        "sensitive_attributes": [[get_attr("members"), index(json!("S3T-A"))]],
                    }])
                )]),
                json!({}),
                vec!["S3T-A", "S3T-B"],
                vec!["grp"],
            ),
            (
                "a wrapper-shaped object whose `type` key is marked: all of it",
                json!([res(
                    "t",
                    "w",
                    json!([{
                        "attributes": {"cfg": {"value": "shown?", "type": "string"}, "id": "w1"},
                        "sensitive_attributes": [[get_attr("cfg"), get_attr("type")]],
                    }])
                )]),
                json!({}),
                vec!["shown?", r#""type":"string""#],
                vec!["w1"],
            ),
            (
                "a marked value of 8 bytes or more inside an unmarked string",
                json!([
                    data("db", None, json!(secret), json!([[get_attr("input")]])),
                    res(
                        "t",
                        "conn",
                        json!([{"attributes": {
                            "url": format!("postgres://app:{secret}@db/app"),
                            "twice": format!("{secret}{secret}!"),
                            "list": [format!("x{secret}")],
                        }}])
                    ),
                ]),
                json!({"dsn": {"value": format!("dsn={secret}")}}),
                vec![secret],
                vec![
                    r#""url":"postgres://app:(sensitive)@db/app""#,
                    r#""twice":"(sensitive)(sensitive)!""#,
                    r#"["x(sensitive)"]"#,
                    r#""dsn":{"value":"dsn=(sensitive)"}"#,
                ],
            ),
            (
                "a short marked value is masked only where it is the whole value",
                json!([
                    data("short", None, json!("abc123"), json!([[get_attr("input")]])),
                    res(
                        "t",
                        "o",
                        json!([{"attributes": {"name": "abc123-bucket", "same": "abc123"}}])
                    ),
                ]),
                json!({}),
                vec![],
                vec![r#""name":"abc123-bucket""#, r#""same":"(sensitive)""#],
            ),
            (
                "overlapping marked values: each one whole is gone",
                json!([
                    data(
                        "one",
                        None,
                        json!("AAAABBBBCCCC"),
                        json!([[get_attr("input")]])
                    ),
                    data(
                        "two",
                        None,
                        json!("BBBBCCCCDDDD"),
                        json!([[get_attr("input")]])
                    ),
                    res(
                        "t",
                        "o",
                        json!([{"attributes": {"s": "xAAAABBBBCCCCDDDDx", "t": "yBBBBCCCCDDDD"}}])
                    ),
                ]),
                json!({}),
                vec!["AAAABBBBCCCC", "BBBBCCCCDDDD"],
                vec![r#""t":"y(sensitive)""#],
            ),
            (
                "check results repeating a marked value",
                json!([data(
                    "db",
                    None,
                    json!(secret),
                    json!([[get_attr("input")]])
                )]),
                json!({}),
                vec![secret],
                vec!["failure_messages"],
            ),
            (
                "empty and null marked values stay as they are; a missing path masks nothing",
                json!([res(
                    "t",
                    "e",
                    json!([{
                        "attributes": {"a": "", "b": null, "c": "see-me"},
                        "sensitive_attributes": [[get_attr("a")], [get_attr("b")], [get_attr("gone")], [get_attr("c"), get_attr("deeper")]],
                    }])
                )]),
                json!({}),
                vec!["see-me"],
                vec![r#""a":"""#, r#""b":null"#],
            ),
            (
                "a secret-looking attribute name, unmarked",
                json!([res(
                    "t",
                    "n",
                    json!([{"attributes": {"id": "1", "token": "T0P", "empty_password": ""}}])
                )]),
                json!({"ip": {"value": "10.0.0.1"}}),
                vec!["T0P"],
                vec!["10.0.0.1", r#""empty_password":"""#],
            ),
        ];
        for (case, resources, outputs, hidden, visible) in table {
            let mut doc = json!({"version": 4, "serial": 9, "lineage": "lin-1",
                "terraform_version": "1.15.5", "resources": resources, "outputs": outputs});
            if case.starts_with("check results") {
                doc["check_results"] = json!([{"objects": [{"failure_messages": [secret]}]}]);
            }
            let masked = mask_state(doc.to_string().as_bytes(), 9).unwrap();
            let text = masked.to_string();
            for h in &hidden {
                assert!(!text.contains(h), "{case}: {h} in {text}");
            }
            for v in visible
                .iter()
                .chain(&[r#""serial":9"#, r#""lineage":"lin-1""#])
            {
                assert!(text.contains(v), "{case}: {v} not in {text}");
            }
            if !hidden.is_empty() {
                assert!(text.contains(MASK), "{case}");
            }
        }
    }

    /// Past the embedded-search bound (1 MiB of marked strings), every marked value is
    /// still masked whole, the longest ones also inside other strings, and the work
    /// stays one pass.
    #[test]
    fn many_marked_values_stay_bounded() {
        let n = 1500;
        let secret = |i: usize| format!("{i:04}-{}", "s".repeat(995));
        let marked: Vec<Value> = (0..n)
            .map(|i| {
                data(
                    &format!("m{i}"),
                    None,
                    json!(secret(i)),
                    json!([[get_attr("input")]]),
                )
            })
            .collect();
        let mut resources = marked;
        resources.push(res(
            "t",
            "copies",
            json!([{"attributes": {
                "whole": (0..n).map(secret).collect::<Vec<_>>(),
                "inside": format!("<{}>", secret(0)),
            }}]),
        ));
        let body = state(Value::Array(resources), json!({})).to_vec();
        let secrets = Secrets::of(&serde_json::from_slice(&body).unwrap());
        let finder = secrets.embedded.as_ref().unwrap();
        assert!(
            finder.patterns_len() <= MAX_EMBEDDED_BYTES / 1000,
            "{}",
            finder.patterns_len()
        );
        let text = mask_state(&body, 1).unwrap().to_string();
        assert!(!text.contains(&"s".repeat(995)), "a marked value survived");
        assert!(text.contains("\"inside\":\"<(sensitive)>\""));
    }

    /// Hostile shapes are masked as far as they can be read and never panic.
    #[test]
    fn masking_survives_malformed_states() {
        let bodies = [
            json!({"resources": "x", "outputs": []}),
            json!({"resources": [1, {"instances": 2}, {"instances": [3, {"attributes": 4}]}]}),
            json!({"resources": [{"instances": [{"attributes": {"a": "S"},
                "sensitive_attributes": [1, [], [{"type": "index", "value": {"value": -1}}],
                    [{"type": "get_attr", "value": 5}], [{"type": "weird"}], [get_attr("a"), index(json!(99))]]}]}]}),
            json!({"outputs": {"o": 1, "p": {"sensitive": true}, "q": {"value": "not-marked", "sensitive": "yes"}}}),
            json!({"outputs": {"p": {"value": "S", "sensitive": true}}, "resources": [{"instances": [
                {"index_key": "S", "attributes": {"x": "S"}}]}]}),
        ];
        // Whatever the shape, a copy of a marked value is masked.
        let odd = json!({"resources": "ODD-S3CRET-1", "outputs": {"p": {"value": "ODD-S3CRET-1", "sensitive": true}},
            "check_results": [{"x": ["ODD-S3CRET-1"]}]});
        let text = mask_state(odd.to_string().as_bytes(), 1)
            .unwrap()
            .to_string();
        assert!(!text.contains("ODD-S3CRET-1"), "{text}");
        for body in bodies {
            let bytes = body.to_string().into_bytes();
            let text = mask_state(&bytes, 1).unwrap().to_string();
            assert!(!text.contains(r#""S""#), "{text}");
            let _ = diff_states(&bytes, 1, &state(json!([]), json!({})), 2).unwrap();
            let _ = diff_states(&state(json!([]), json!({})), 1, &bytes, 2).unwrap();
        }
    }

    /// The diff compares real values and shows masked ones: copies of a marked value in
    /// either version, a path marked in either version, and index keys equal to one.
    #[test]
    fn diffs_mask_copies_and_paths_marked_in_either_version() {
        let marked = json!([[get_attr("input")]]);
        let a = state(
            json!([
                data("db", None, json!("OLD-S3CRET"), marked.clone()),
                data(
                    "nested",
                    None,
                    json!({"user": "u1", "pass": "P-OLD"}),
                    json!([[get_attr("input"), get_attr("pass")]])
                ),
                data("keyed", Some(json!("KEY-S3CRET")), json!("x"), json!([])),
            ]),
            json!({"s": {"value": "OLD-S3CRET", "sensitive": true}, "was": {"value": "W-S3CRET", "sensitive": true}}),
        );
        let b = state(
            json!([
                // Version b no longer marks the input; a marked it.
                data("db", None, json!("NEW-S3CRET"), json!([])),
                data(
                    "nested",
                    None,
                    json!({"user": "u2", "pass": "P-NEW"}),
                    json!([])
                ),
                data("keyed", Some(json!("KEY-S3CRET")), json!("y"), json!([])),
                data("reader", None, json!("NEW-S3CRET"), json!([])),
                res(
                    "t",
                    "k",
                    json!([{"index_key": "OUT-KEY", "attributes": {}}])
                ),
            ]),
            json!({"s": {"value": "NEW-S3CRET", "sensitive": true}, "was": {"value": "W-NOW"}}),
        );
        let b = {
            // A key that is a marked value in b: the address is shown with it masked.
            let mut doc: Value = serde_json::from_slice(&b).unwrap();
            doc["outputs"]["k"] = json!({"value": "OUT-KEY", "sensitive": true});
            doc["resources"][1]["instances"][0]["sensitive_attributes"] =
                json!([[get_attr("input"), get_attr("pass")]]);
            doc.to_string().into_bytes()
        };
        let d = diff_states(&a, 1, &b, 2).unwrap();
        let text = serde_json::to_string(&d).unwrap();
        for secret in [
            "OLD-S3CRET",
            "NEW-S3CRET",
            "P-OLD",
            "P-NEW",
            "W-S3CRET",
            "W-NOW",
            "OUT-KEY",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        let summary: Vec<(&str, &Change)> = d
            .resources
            .iter()
            .map(|r| (r.address.as_str(), &r.change))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("t.k[\"(sensitive)\"]", &Change::Added),
                ("terraform_data.db", &Change::Changed),
                ("terraform_data.keyed[\"KEY-S3CRET\"]", &Change::Changed),
                ("terraform_data.nested", &Change::Changed),
                ("terraform_data.reader", &Change::Added),
            ],
            "an unmarked key stays visible"
        );
        // Only the marked field is masked; the field next to it shows its change.
        let nested = &d.resources[3].attributes;
        assert_eq!(nested[0].name, "input");
        assert_eq!(
            nested[0].before,
            Some(json!({"value": {"user": "u1", "pass": MASK}, "type": ["object", {}]}))
        );
        assert_eq!(
            nested[0].after,
            Some(json!({"value": {"user": "u2", "pass": MASK}, "type": ["object", {}]}))
        );
        let db = &d.resources[1].attributes;
        assert_eq!(
            db.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
            ["input", "output"],
            "a changed secret is listed"
        );
        assert_eq!(db[1].after, Some(json!({"value": MASK, "type": "string"})));
        let was = d.outputs.iter().find(|o| o.name == "was").unwrap();
        assert_eq!(
            (was.before.clone(), was.after.clone()),
            (Some(json!(MASK)), Some(json!(MASK)))
        );
    }

    /// Every string and number under `v`, with the path to it.
    fn leaves<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
        match v {
            Value::Array(items) => items.iter().for_each(|i| leaves(i, out)),
            Value::Object(map) => map.values().for_each(|i| leaves(i, out)),
            Value::String(s) if s.is_empty() => {}
            Value::String(_) | Value::Number(_) => out.push(v),
            _ => {}
        }
    }

    /// A random path into `v` that exists, as Terraform writes it, and what it leads to.
    fn some_path(v: &Value, picks: &[usize]) -> (Vec<Value>, Value) {
        let (mut node, mut path) = (v, Vec::new());
        for pick in picks {
            // Terraform's paths go through a dynamic attribute's wrapper.
            if is_dynamic_wrapper(node) {
                node = &node["value"];
            }
            match node {
                Value::Object(map) if !map.is_empty() => {
                    let (k, child) = map.iter().nth(pick % map.len()).unwrap();
                    path.push(get_attr(k));
                    node = child;
                }
                Value::Array(items) if !items.is_empty() => {
                    let i = pick % items.len();
                    path.push(index(json!(i)));
                    node = &items[i];
                }
                _ => break,
            }
        }
        if is_dynamic_wrapper(node) {
            node = &node["value"];
        }
        (path, node.clone())
    }

    fn value_tree() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            "[a-z]{0,6}".prop_map(Value::from),
            (0u32..50).prop_map(Value::from),
            any::<bool>().prop_map(Value::from),
            Just(Value::Null),
        ];
        leaf.prop_recursive(4, 40, 5, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z]{1,4}", inner.clone(), 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
                inner.prop_map(|v| json!({"value": v, "type": ["object", {}]})),
            ]
        })
    }

    proptest::proptest! {
        /// Whatever the attributes look like and whichever path Terraform marks, no
        /// string or number under it survives anywhere in the masked state (not in the
        /// attributes, not in a second resource's copy, not in an output), and the
        /// state's bookkeeping is untouched.
        #[test]
        fn no_marked_value_survives_masking(
            attrs in proptest::collection::btree_map("[a-z]{1,4}", value_tree(), 1..5),
            picks in proptest::collection::vec(0usize..8, 1..6),
            copy_at in 0usize..4,
        ) {
            let attrs = Value::Object(attrs.into_iter().collect());
            let (path, marked) = some_path(&attrs, &picks);
            let mut secrets = Vec::new();
            leaves(&marked, &mut secrets);
            let copy = secrets.get(copy_at).cloned().cloned().unwrap_or(Value::Null);
            let doc = json!({"version": 4, "serial": 3, "lineage": "l", "resources": [
                res("t", "marked", json!([{"attributes": attrs, "sensitive_attributes": [path]}])),
                res("t", "copy", json!([{"attributes": {"c": copy, "n": [copy]}}])),
            ], "outputs": {"o": {"value": copy}}});
            let bytes = doc.to_string().into_bytes();
            let masked = mask_state(&bytes, 1).unwrap();
            let mut shown = Vec::new();
            for r in 0..2 {
                leaves(&masked["resources"][r]["instances"][0]["attributes"], &mut shown);
            }
            leaves(&masked["outputs"], &mut shown);
            for s in &secrets {
                proptest::prop_assert!(!shown.contains(s), "{} survived in {}", s, masked);
            }
            proptest::prop_assert_eq!(&masked["serial"], &json!(3));
            // Nor does a diff from a version where both resources had no attributes
            // (every attribute listed as changed, its new value shown masked).
            let mut before = doc.clone();
            before["resources"][0]["instances"][0]["attributes"] = json!({});
            before["resources"][1]["instances"][0]["attributes"] = json!({});
            before["outputs"] = json!({});
            let before = before.to_string().into_bytes();
            let d = diff_states(&before, 1, &bytes, 2).unwrap();
            let values: Vec<Value> = d
                .resources
                .iter()
                .flat_map(|r| r.attributes.iter().flat_map(|a| [&a.before, &a.after]))
                .chain(d.outputs.iter().flat_map(|o| [&o.before, &o.after]))
                .flatten()
                .cloned()
                .collect();
            let values = Value::Array(values);
            let mut in_diff = Vec::new();
            leaves(&values, &mut in_diff);
            for s in &secrets {
                proptest::prop_assert!(!in_diff.contains(s), "{} in {}", s, values);
            }
        }
    }
}
