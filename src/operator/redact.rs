//! What a reader limited to workspace patterns is shown of the names of workspaces it
//! may not see: `<hidden workspace>` in their place, in every listing that names other
//! workspaces (audit rows, consumers). Audit rows are redacted by what their event kind
//! declares in `store::audit::EVENTS`, not event by event: a field the table names is
//! redacted whatever the event, and a kind the table does not know has its whole
//! payload hidden from a limited reader. A reader not limited sees everything as stored.

use serde_json::Value;

use crate::store::audit::{event_kind, AuditRow, Names};
use crate::tofu::access::named_workspace;

use super::roles::Grant;

/// What a limited reader is shown in place of a workspace it does not see.
pub const HIDDEN_WORKSPACE: &str = "<hidden workspace>";
/// What a limited reader is shown in place of a pattern that may match one.
pub const HIDDEN_PATTERN: &str = "<hidden pattern>";
/// The payload of an event kind without a declaration, as a limited reader sees it.
const HIDDEN_DETAILS: &str = "not shown to operators limited to workspace patterns";

/// `row` as `grant` may see it: its scope, actor and every payload field its event kind
/// declares ([`Names`]) with the workspaces `grant` does not see replaced.
pub fn audit_row(row: &mut AuditRow, grant: &Grant) {
    if !grant.is_limited() {
        return;
    }
    if let Some(w) = row.scope.strip_prefix(crate::tofu::SCOPE_PREFIX) {
        if !grant.sees(w) {
            row.scope = crate::tofu::scope(HIDDEN_WORKSPACE);
        }
    }
    row.actor = credential(&row.actor, grant);
    let Some(kind) = event_kind(&row.event) else {
        row.payload = serde_json::json!({ "details": HIDDEN_DETAILS });
        return;
    };
    for (path, names) in kind.names {
        if let Some(value) = field(&mut row.payload, path) {
            redact(value, *names, grant);
        }
    }
}

/// `names` (workspaces) as `grant` may see them: those it sees in order, then one
/// [`HIDDEN_WORKSPACE`] for each other (where one stood would tell how it sorts).
pub fn workspaces(names: Vec<String>, grant: &Grant) -> Vec<String> {
    let (mut shown, hidden): (Vec<String>, Vec<String>) =
        names.into_iter().partition(|n| grant.sees(n));
    shown.extend(hidden.iter().map(|_| HIDDEN_WORKSPACE.to_string()));
    shown
}

/// A version's writer facts as `grant` may see them: the workspace a move's version
/// names (where its resources went or came from) replaced when `grant` does not see it.
pub fn write_facts(facts: &mut crate::store::WriteFacts, grant: &Grant) {
    for name in [&mut facts.moved_to, &mut facts.moved_from]
        .into_iter()
        .flatten()
    {
        if !grant.sees(name) {
            *name = HIDDEN_WORKSPACE.to_string();
        }
    }
}

/// [`write_facts`] of a timeline row.
pub fn timeline_row(row: &mut crate::store::timeline::TimelineRow, grant: &Grant) {
    for name in [&mut row.moved_to, &mut row.moved_from]
        .into_iter()
        .flatten()
    {
        if !grant.sees(name) {
            *name = HIDDEN_WORKSPACE.to_string();
        }
    }
}

/// A diff's move as `grant` may see it (the other workspace's name).
pub fn diff(d: &mut super::diff::StateDiff, grant: &Grant) {
    use super::diff::Moved;
    if let Some(Moved::To(name) | Moved::From(name)) = &mut d.moved {
        if !grant.sees(name) {
            *name = HIDDEN_WORKSPACE.to_string();
        }
    }
}

/// The value at a dotted path into nested objects, if there is one.
fn field<'a>(payload: &'a mut Value, path: &str) -> Option<&'a mut Value> {
    path.split('.')
        .try_fold(payload, |value, key| value.as_object_mut()?.get_mut(key))
}

fn redact(value: &mut Value, names: Names, grant: &Grant) {
    let one = |text: &str| -> String {
        match names {
            Names::Workspaces if grant.sees(text) => text.to_string(),
            Names::Workspaces => HIDDEN_WORKSPACE.into(),
            Names::Patterns => pattern(text, grant),
            Names::Credential => credential(text, grant),
        }
    };
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
        // Patterns as stored for operators: one text, comma-separated.
        Value::String(text) if names == Names::Patterns => {
            *text = text.split(',').map(one).collect::<Vec<_>>().join(",");
        }
        Value::String(text) => *text = one(text),
        Value::Array(items) => {
            for item in items.iter_mut() {
                match item {
                    Value::String(text) => *text = one(text),
                    Value::Null => {}
                    other => *other = Value::String(HIDDEN_WORKSPACE.into()),
                }
            }
            // The hidden ones last (stable): where one stood would tell how it sorts.
            items.sort_by_key(|v| v.as_str().is_some_and(|t| t.contains("<hidden ")));
        }
        // A declared field holds names, never an object: show nothing of one.
        Value::Object(_) => *value = Value::String(HIDDEN_WORKSPACE.into()),
    }
}

/// A credential's recorded name (`tf:<workspace>`), its workspace hidden unless seen.
fn credential(name: &str, grant: &Grant) -> String {
    match named_workspace(name) {
        Some((prefix, w)) if !grant.sees(w) => format!("{prefix}{HIDDEN_WORKSPACE}"),
        _ => name.to_string(),
    }
}

/// A pattern is shown when everything it can match is seen: a plain name the reader
/// sees, or one of the reader's own patterns.
fn pattern(text: &str, grant: &Grant) -> String {
    let text = text.trim();
    let shown = if text.contains('*') {
        grant.patterns.iter().any(|p| p.as_str() == text)
    } else {
        grant.sees(text)
    };
    if shown || text.is_empty() {
        text.to_string()
    } else {
        HIDDEN_PATTERN.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::audit::EVENTS;
    use serde_json::json;

    fn row(event: &str, scope: &str, actor: &str, payload: Value) -> AuditRow {
        AuditRow {
            id: 1,
            at: "2026-12-01T00:00:00Z".into(),
            actor: actor.into(),
            org: None,
            scope: scope.into(),
            event: event.into(),
            payload,
        }
    }

    /// Sets the value at a dotted path, making the objects on the way.
    fn put(payload: &mut Value, path: &str, value: Value) {
        let mut at = payload;
        let mut keys = path.split('.').peekable();
        while let Some(key) = keys.next() {
            let map = at.as_object_mut().unwrap();
            if keys.peek().is_none() {
                map.insert(key.into(), value);
                return;
            }
            at = map.entry(key).or_insert_with(|| json!({}));
        }
    }

    /// Every declared kind, each declared field holding a hidden and a seen name (as
    /// one text and as an array): the limited reader's bytes never hold the hidden one
    /// and still hold the seen one and the other fields; the unlimited reader's row is
    /// as stored.
    #[test]
    fn every_event_kind_redacts_what_it_declares() {
        let limited = Grant::parse("viewer", Some("team-a-*")).unwrap();
        for kind in EVENTS {
            for as_array in [false, true] {
                let mut payload = json!({ "note": "kept", "count": 3 });
                for (path, names) in kind.names {
                    let (hidden, seen) = match names {
                        Names::Workspaces => ("prod-x", "team-a-1"),
                        Names::Patterns => ("prod-x", "team-a-*"),
                        Names::Credential => ("tf:prod-x", "tf:team-a-1"),
                    };
                    let value = match (as_array, names) {
                        (true, _) => json!([hidden, seen]),
                        (false, Names::Patterns) => json!(format!("{hidden},{seen}")),
                        (false, _) => json!(hidden),
                    };
                    put(&mut payload, path, value);
                }
                let stored = row(kind.name, "tf/team-a-1", "tf:prod-x", payload);
                let mut shown = stored.clone();
                audit_row(&mut shown, &Grant::ROOT);
                assert_eq!(shown, stored, "{}", kind.name);
                audit_row(&mut shown, &limited);
                let bytes = serde_json::to_string(&serde_json::to_value(&shown).unwrap()).unwrap();
                assert!(!bytes.contains("prod-x"), "{}: {bytes}", kind.name);
                assert!(bytes.contains(r#""note":"kept""#), "{}: {bytes}", kind.name);
                assert_eq!(shown.scope, "tf/team-a-1");
                for (path, names) in kind.names {
                    let value = field(&mut shown.payload, path).unwrap().to_string();
                    if as_array || *names == Names::Patterns {
                        assert!(value.contains("team-a-"), "{} {path}: {value}", kind.name);
                    }
                    let hidden = match names {
                        Names::Patterns => HIDDEN_PATTERN,
                        _ => HIDDEN_WORKSPACE,
                    };
                    assert!(value.contains(hidden), "{} {path}: {value}", kind.name);
                }
            }
        }
    }

    #[test]
    fn an_undeclared_kind_hides_its_payload_and_scopes_and_actors_are_redacted() {
        let limited = Grant::parse("viewer", Some("team-a-*")).unwrap();
        let mut r = row(
            "tf.something_new",
            "tf/prod-x",
            "consumer:prod-x",
            json!({ "workspace": "prod-x" }),
        );
        audit_row(&mut r, &limited);
        let bytes = serde_json::to_value(&r).unwrap().to_string();
        assert!(!bytes.contains("prod-x"), "{bytes}");
        assert_eq!(r.scope, "tf/<hidden workspace>");
        assert_eq!(r.actor, "consumer:<hidden workspace>");
        // Seen names, tokens and operators stay as they are; a declared field that
        // holds something other than names shows nothing of it.
        let mut r = row(
            "tf.consumers_set",
            "tf/team-a-1",
            "token:ci",
            json!({ "consumers": ["team-a-2", {"x": "prod-x"}, 7] }),
        );
        audit_row(&mut r, &limited);
        assert_eq!(r.actor, "token:ci");
        assert_eq!(
            r.payload,
            json!({ "consumers": ["team-a-2", HIDDEN_WORKSPACE, HIDDEN_WORKSPACE] })
        );
        assert_eq!(
            workspaces(vec!["team-a-2".into(), "prod-x".into()], &limited),
            ["team-a-2", HIDDEN_WORKSPACE]
        );
        for (text, shown) in [
            ("team-a-*", "team-a-*"),
            ("team-a-1", "team-a-1"),
            ("team-*", HIDDEN_PATTERN),
            ("*", HIDDEN_PATTERN),
            ("prod-x", HIDDEN_PATTERN),
        ] {
            assert_eq!(pattern(text, &limited), shown, "{text}");
        }
    }
}
