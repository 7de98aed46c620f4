//! Moving resources from one workspace's state to another's, as
//! `terraform state mv -state-out` would between two local files: the pure part.
//!
//! [`check_addresses`] judges the request (resource addresses, bounded in number and
//! length); [`move_resources`] takes the two current states and returns the two new
//! ones: every resource record named (all its instances) leaves the source and joins
//! the destination, each state keeps its lineage and gets the next serial, and
//! everything else in both is kept. It refuses, changing nothing, when an address is
//! missing from the source or already in the destination, or when either state is not
//! a plain Terraform v4 state (an OpenTofu-encrypted one shows stategate no resources).
//! Taking both locks, reading the states (held whole, bounded by `max_view_bytes`) and
//! committing both versions in one transaction is `TofuBackend::move_resources`.
//!
//! A move in progress is also a row of `tf_moves` (owned here), written in the same
//! transaction that takes its two locks and deleted in the one that releases them: the
//! move's lock ID, its workspaces and the process running it ([`this_process`]), with
//! a heartbeat that process renews. A move whose process is gone (`kill -9` of the CLI
//! or the server, a crash, a reboot) is found by [`gone`], and housekeeping releases
//! its locks (`TofuBackend::release_abandoned_moves`). Releasing undoes nothing: the
//! two new versions were committed together or not at all, and a commit re-checks that
//! the move still holds both locks.
//!
//! The new states keep every byte Terraform wrote except the serial and the resource
//! list's membership: each resource record is spliced in as it was ([`Layout`]). The
//! resource timeline digests each instance's bytes, so a re-serialised record (serde
//! sorts keys, Terraform does not) would read as "changed" in the move's version and
//! again in the next apply's, although nothing changed.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::OnceLock;

use serde_json::{Map, Value};

use crate::store::sql::{params, Connection};

/// The table; `crate::schema` applies it.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tf_moves (
    move_id        TEXT PRIMARY KEY,  -- the lock ID both workspaces are locked with
    source         TEXT NOT NULL,
    destination    TEXT NOT NULL,
    actor          TEXT NOT NULL,
    process        TEXT NOT NULL,     -- this_process() of the process running the move
    heartbeat_unix INTEGER NOT NULL,  -- renewed every HEARTBEAT while the move runs
    started_at     TEXT NOT NULL
) WITHOUT ROWID;
"#;

/// How often a running move renews its heartbeat.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(10);
/// A move whose process cannot be looked at from here (another machine) is gone once
/// its heartbeat is this old (unix seconds).
pub const HEARTBEAT_LAPSES_AFTER: i64 = 60;

/// A move as `tf_moves` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub move_id: String,
    pub source: String,
    pub destination: String,
    pub actor: String,
    pub process: String,
    pub heartbeat_unix: i64,
    pub started_at: String,
}

/// Records a move about to take its locks (in that transaction).
pub fn record(conn: &Connection, m: &Recorded) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached(
        "INSERT INTO tf_moves (move_id, source, destination, actor, process, heartbeat_unix, started_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        m.move_id,
        m.source,
        m.destination,
        m.actor,
        m.process,
        m.heartbeat_unix,
        m.started_at
    ])?;
    Ok(())
}

/// Renews a running move's heartbeat.
pub fn beat(conn: &Connection, move_id: &str, now: i64) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached("UPDATE tf_moves SET heartbeat_unix = ?2 WHERE move_id = ?1")?
        .execute(params![move_id, now])?;
    Ok(())
}

/// Forgets a move whose locks are released (in that transaction).
pub fn forget(conn: &Connection, move_id: &str) -> Result<(), crate::store::sql::Error> {
    conn.prepare_cached("DELETE FROM tf_moves WHERE move_id = ?1")?
        .execute([move_id])?;
    Ok(())
}

/// Every recorded move, oldest first.
pub fn recorded(conn: &Connection) -> Result<Vec<Recorded>, crate::store::sql::Error> {
    conn.prepare(
        "SELECT move_id, source, destination, actor, process, heartbeat_unix, started_at
           FROM tf_moves ORDER BY started_at, move_id",
    )?
    .query_map([], |r| {
        Ok(Recorded {
            move_id: r.get(0)?,
            source: r.get(1)?,
            destination: r.get(2)?,
            actor: r.get(3)?,
            process: r.get(4)?,
            heartbeat_unix: r.get(5)?,
            started_at: r.get(6)?,
        })
    })?
    .collect()
}

/// This process, as a move records it: `boot/pid-namespace/pid/start`, where `boot` is
/// the machine's boot id and `start` the process's start time since boot, so a pid
/// reused after a restart or a reboot is another process. Empty where `/proc` does
/// not tell (then only the heartbeat judges).
pub fn this_process() -> &'static str {
    static ME: OnceLock<String> = OnceLock::new();
    ME.get_or_init(|| {
        let pid = std::process::id();
        match (machine(), process_start(pid)) {
            (Some((boot, ns)), Some(start)) => format!("{boot}/{ns}/{pid}/{start}"),
            _ => String::new(),
        }
    })
}

/// The boot id and the pid namespace of this process: pids compare only within both.
fn machine() -> Option<(String, String)> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let (boot, ns) = (boot.trim().to_string(), ns.to_string_lossy().into_owned());
    let clean = |s: &str| !s.is_empty() && !s.contains('/');
    (clean(&boot) && clean(&ns)).then_some((boot, ns))
}

/// When process `pid` started (clock ticks since boot), if it is running.
fn process_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (in parentheses, which may hold anything): state is
    // field 3, the start time field 22.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19).map(str::to_string)
}

/// Whether the process that runs a move recorded as `process`, with its heartbeat at
/// `heartbeat_unix`, is gone at `now`: on this machine (same boot, same pid namespace)
/// when no process with that pid and start time runs; elsewhere when the heartbeat
/// lapsed.
pub fn gone(process: &str, heartbeat_unix: i64, now: i64) -> bool {
    let mine: Vec<&str> = this_process().split('/').collect();
    let theirs: Vec<&str> = process.split('/').collect();
    if let ([boot, ns, _, _], [their_boot, their_ns, pid, start]) =
        (mine.as_slice(), theirs.as_slice())
    {
        if boot == their_boot && ns == their_ns {
            let running = pid
                .parse::<u32>()
                .ok()
                .and_then(process_start)
                .is_some_and(|s| s == *start);
            return !running;
        }
    }
    now.saturating_sub(heartbeat_unix) > HEARTBEAT_LAPSES_AFTER
}

/// A named point of a move where a test holds it (`STATEGATE_TEST_MOVE_PAUSE=<point>`)
/// until it is killed there; nothing otherwise.
pub async fn pause_point(point: &str) {
    if std::env::var("STATEGATE_TEST_MOVE_PAUSE").is_ok_and(|p| p == point) {
        eprintln!("stategate: move paused at {point}");
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        }
    }
}

/// Most addresses one move names.
pub const MAX_ADDRESSES: usize = 1000;
/// Longest address (bytes).
pub const MAX_ADDRESS_BYTES: usize = 1024;
/// Most addresses a refusal lists (the rest are counted).
const LISTED: usize = 20;

/// Why an address list is refused (400; nothing read or changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadAddresses {
    #[error("name at least one resource address to move")]
    Empty,
    #[error("at most {MAX_ADDRESSES} addresses per move")]
    TooMany,
    #[error("address {0} is longer than {MAX_ADDRESS_BYTES} bytes")]
    TooLong(usize),
    #[error("address {0} is not a resource address (module.NAME… [data.]TYPE.NAME)")]
    Malformed(usize),
    #[error("address {0} names one instance; name the resource (moving TYPE.NAME moves all its instances)")]
    Instance(usize),
    #[error("address {0} is given twice")]
    Duplicate(usize),
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The length of a `[…]` instance key at the start of `s` (a number or a quoted
/// string with `\` escapes), or `None` when there is none well formed.
fn key_len(s: &str) -> Option<usize> {
    let rest = s.strip_prefix('[')?;
    let inner = if let Some(quoted) = rest.strip_prefix('"') {
        let mut escaped = false;
        let mut end = None;
        for (i, c) in quoted.char_indices() {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        end? + 2
    } else {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        (digits > 0).then_some(digits)?
    };
    rest[inner..].starts_with(']').then_some(inner + 2)
}

/// Is `a` a resource address: `module.NAME[KEY]?.`… then `[data.]TYPE.NAME`?
fn resource_address(a: &str) -> Result<(), bool> {
    let mut rest = a;
    while let Some(after) = rest.strip_prefix("module.") {
        let name_len = after.find(['.', '[']).ok_or(false)?;
        if !is_ident(&after[..name_len]) {
            return Err(false);
        }
        let mut next = &after[name_len..];
        if next.starts_with('[') {
            next = &next[key_len(next).ok_or(false)?..];
        }
        rest = next.strip_prefix('.').ok_or(false)?;
    }
    let rest = rest.strip_prefix("data.").unwrap_or(rest);
    let (kind, name) = rest.split_once('.').ok_or(false)?;
    if let Some(open) = name.find('[') {
        // `TYPE.NAME[0]`: an instance of a resource.
        let whole = is_ident(kind) && is_ident(&name[..open]) && key_len(&name[open..]).is_some();
        return Err(whole);
    }
    if is_ident(kind) && is_ident(name) {
        Ok(())
    } else {
        Err(false)
    }
}

/// The addresses, trimmed, if they are a move request stategate accepts.
pub fn check_addresses(list: &[String]) -> Result<Vec<String>, BadAddresses> {
    if list.is_empty() {
        return Err(BadAddresses::Empty);
    }
    if list.len() > MAX_ADDRESSES {
        return Err(BadAddresses::TooMany);
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(list.len());
    for (i, a) in list.iter().enumerate() {
        let n = i + 1;
        let a = a.trim();
        if a.len() > MAX_ADDRESS_BYTES {
            return Err(BadAddresses::TooLong(n));
        }
        match resource_address(a) {
            Ok(()) => {}
            Err(true) => return Err(BadAddresses::Instance(n)),
            Err(false) => return Err(BadAddresses::Malformed(n)),
        }
        if !seen.insert(a.to_string()) {
            return Err(BadAddresses::Duplicate(n));
        }
        out.push(a.to_string());
    }
    Ok(out)
}

/// Which of the two states a refusal is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Source,
    Destination,
}

/// Why a move is refused by what the states hold (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not a plain Terraform v4 state (encrypted, another format, not JSON).
    NotAState(Side, &'static str),
    /// These addresses are not in the source.
    Missing(Vec<String>),
    /// These addresses are already in the destination.
    Present(Vec<String>),
    /// The state's serial cannot be increased.
    SerialExhausted(Side),
}

/// Up to [`LISTED`] addresses, and how many more.
pub fn listing(addresses: &[String]) -> String {
    let shown: Vec<&str> = addresses.iter().take(LISTED).map(String::as_str).collect();
    let more = addresses.len().saturating_sub(LISTED);
    if more > 0 {
        format!("{} (and {more} more)", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// The two new states.
#[derive(Debug, Clone, PartialEq)]
pub struct Moved {
    pub source: Vec<u8>,
    pub source_serial: i64,
    pub destination: Vec<u8>,
    pub destination_serial: i64,
    /// Resource instances moved (all instances of the named resources).
    pub instances: usize,
}

/// A plain v4 state taken apart: its other top-level keys, serial and resources, and
/// where those sit in its bytes (`None`: a shape the splice does not handle, such as
/// no `resources` array; then the state is written back through serde).
struct Opened<'a> {
    doc: Map<String, Value>,
    serial: i64,
    resources: Vec<Value>,
    raw: Option<(&'a [u8], Layout)>,
}

/// Where a state's serial and resource records are in its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    serial: Range<usize>,
    /// The whole `resources` array, brackets included.
    resources: Range<usize>,
    /// Each record, `{` to `}`.
    records: Vec<Range<usize>>,
}

impl Layout {
    /// The layout of `body`, a JSON object serde_json has already parsed (so only
    /// well-formed JSON reaches this walk, and its nesting is within serde_json's limit).
    fn of(body: &[u8]) -> Option<Layout> {
        let mut serial = None;
        let mut resources = None;
        let mut i = skip_ws(body, 0);
        if body.get(i) != Some(&b'{') {
            return None;
        }
        i = skip_ws(body, i + 1);
        while body.get(i) == Some(&b'"') {
            let key_end = skip_string(body, i)?;
            let key: String = serde_json::from_slice(&body[i..key_end]).ok()?;
            i = skip_ws(body, key_end);
            if body.get(i) != Some(&b':') {
                return None;
            }
            let start = skip_ws(body, i + 1);
            let end = skip_value(body, start, 0)?;
            match key.as_str() {
                "serial" => serial = Some(start..end),
                "resources" => resources = Some(start..end),
                _ => {}
            }
            i = skip_ws(body, end);
            if body.get(i) == Some(&b',') {
                i = skip_ws(body, i + 1);
            }
        }
        let resources = resources?;
        if body.get(resources.start) != Some(&b'[') {
            return None;
        }
        let mut records = Vec::new();
        let mut j = skip_ws(body, resources.start + 1);
        while j < resources.end - 1 {
            let end = skip_value(body, j, 0)?;
            records.push(j..end);
            j = skip_ws(body, end);
            if body.get(j) == Some(&b',') {
                j = skip_ws(body, j + 1);
            }
        }
        Some(Layout {
            serial: serial?,
            resources,
            records,
        })
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Past the string that starts at `i` (its opening quote).
fn skip_string(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        match b.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// Past the value that starts at `i`. `depth` bounds the walk as serde_json bounds
/// its parse (128), so no input can exhaust the stack.
fn skip_value(b: &[u8], i: usize, depth: usize) -> Option<usize> {
    let close = match b.get(i)? {
        b'"' => return skip_string(b, i),
        b'{' => b'}',
        b'[' => b']',
        _ => {
            let mut j = i;
            while !matches!(
                b.get(j),
                None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            ) {
                j += 1;
            }
            return Some(j);
        }
    };
    if depth > 128 {
        return None;
    }
    let mut j = skip_ws(b, i + 1);
    if b.get(j) == Some(&close) {
        return Some(j + 1);
    }
    loop {
        if close == b'}' {
            j = skip_ws(b, skip_string(b, j)?);
            if b.get(j) != Some(&b':') {
                return None;
            }
            j = skip_ws(b, j + 1);
        }
        j = skip_ws(b, skip_value(b, j, depth + 1)?);
        match b.get(j)? {
            b',' => j = skip_ws(b, j + 1),
            c if *c == close => return Some(j + 1),
            _ => return None,
        }
    }
}

/// `body` with its serial replaced by `serial` and its resource list by `records`, laid
/// out as Terraform lays out a state (two-space indent, a record per element).
fn splice(body: &[u8], layout: &Layout, serial: i64, records: &[&[u8]]) -> Vec<u8> {
    let mut list = Vec::new();
    if records.is_empty() {
        list.extend_from_slice(b"[]");
    } else {
        list.extend_from_slice(b"[\n    ");
        list.extend_from_slice(&records.join(&b",\n    "[..]));
        list.extend_from_slice(b"\n  ]");
    }
    let serial = serial.to_string().into_bytes();
    let mut edits = [
        (layout.serial.clone(), serial),
        (layout.resources.clone(), list),
    ];
    edits.sort_by_key(|(range, _)| range.start);
    let mut out = Vec::with_capacity(body.len());
    let mut at = 0;
    for (range, bytes) in edits {
        out.extend_from_slice(&body[at..range.start]);
        out.extend_from_slice(&bytes);
        at = range.end;
    }
    out.extend_from_slice(&body[at..]);
    out
}

/// A plain v4 state: its top-level object, serial and resources.
fn open_state(body: &[u8], side: Side) -> Result<Opened<'_>, Refusal> {
    let not = |why| Refusal::NotAState(side, why);
    let doc: Value = serde_json::from_slice(body).map_err(|_| not("it is not JSON"))?;
    let Value::Object(mut doc) = doc else {
        return Err(not("it is not a JSON object"));
    };
    if doc.contains_key("encrypted_data") {
        return Err(not(
            "it is encrypted by OpenTofu, so stategate cannot see its resources",
        ));
    }
    if doc.get("version").and_then(Value::as_i64) != Some(4) {
        return Err(not("it is not a version 4 state"));
    }
    if !doc.get("lineage").is_some_and(Value::is_string) {
        return Err(not("it has no lineage"));
    }
    let serial = doc
        .get("serial")
        .and_then(Value::as_i64)
        .ok_or(not("it has no serial"))?;
    let resources = match doc.remove("resources") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(not("its resources are not a list")),
    };
    let raw = Layout::of(body)
        .filter(|l| l.records.len() == resources.len())
        .map(|l| (body, l));
    Ok(Opened {
        doc,
        serial,
        resources,
        raw,
    })
}

/// The address Terraform prints for a resource record of a state.
fn address_of(resource: &Value) -> Option<String> {
    let text = |name: &str| resource.get(name).and_then(Value::as_str);
    let (kind, name) = (text("type")?, text("name")?);
    let data = match text("mode") {
        Some("data") => "data.",
        _ => "",
    };
    Some(match text("module").filter(|m| !m.is_empty()) {
        Some(module) => format!("{module}.{data}{kind}.{name}"),
        None => format!("{data}{kind}.{name}"),
    })
}

fn close_state(
    mut doc: Map<String, Value>,
    next: i64,
    resources: Vec<Value>,
    side: Side,
) -> Result<Vec<u8>, Refusal> {
    doc.insert("serial".into(), Value::from(next));
    doc.insert("resources".into(), Value::Array(resources));
    let mut body = serde_json::to_vec_pretty(&Value::Object(doc))
        .map_err(|_| Refusal::NotAState(side, "it cannot be written back"))?;
    body.push(b'\n');
    Ok(body)
}

/// Moves the resource records `addresses` (checked by [`check_addresses`]) from the
/// state `source` to the state `destination`.
pub fn move_resources(
    source: &[u8],
    destination: &[u8],
    addresses: &[String],
) -> Result<Moved, Refusal> {
    let src = open_state(source, Side::Source)?;
    let dst = open_state(destination, Side::Destination)?;
    let wanted: BTreeSet<&str> = addresses.iter().map(String::as_str).collect();
    let in_dst: BTreeSet<String> = dst.resources.iter().filter_map(address_of).collect();
    let present: Vec<String> = addresses
        .iter()
        .filter(|a| in_dst.contains(a.as_str()))
        .cloned()
        .collect();
    let moves: Vec<bool> = src
        .resources
        .iter()
        .map(|r| address_of(r).is_some_and(|a| wanted.contains(a.as_str())))
        .collect();
    let found: BTreeSet<String> = src
        .resources
        .iter()
        .zip(&moves)
        .filter(|(_, moves)| **moves)
        .filter_map(|(r, _)| address_of(r))
        .collect();
    let missing: Vec<String> = addresses
        .iter()
        .filter(|a| !found.contains(a.as_str()))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(Refusal::Missing(missing));
    }
    if !present.is_empty() {
        return Err(Refusal::Present(present));
    }
    let instances = src
        .resources
        .iter()
        .zip(&moves)
        .filter(|(_, moves)| **moves)
        .map(|(r, _)| {
            r.get("instances")
                .and_then(Value::as_array)
                .map_or(0, Vec::len)
        })
        .sum();
    let source_serial = next_serial(src.serial, Side::Source)?;
    let destination_serial = next_serial(dst.serial, Side::Destination)?;
    let (source, destination) = match spliced(&src, &dst, &moves, source_serial, destination_serial)
    {
        Some(both) => both,
        None => {
            let mut joined = dst.resources;
            let mut kept = Vec::new();
            for (record, moves) in src.resources.into_iter().zip(moves) {
                if moves {
                    joined.push(record);
                } else {
                    kept.push(record);
                }
            }
            (
                close_state(src.doc, source_serial, kept, Side::Source)?,
                close_state(dst.doc, destination_serial, joined, Side::Destination)?,
            )
        }
    };
    Ok(Moved {
        source,
        source_serial,
        destination,
        destination_serial,
        instances,
    })
}

fn next_serial(serial: i64, side: Side) -> Result<i64, Refusal> {
    serial.checked_add(1).ok_or(Refusal::SerialExhausted(side))
}

/// Both new states with every record's bytes kept ([`splice`]), or `None` when either
/// state's shape is not one the splice handles or its result would not read back as
/// the same records (then serde writes them).
fn spliced(
    src: &Opened<'_>,
    dst: &Opened<'_>,
    moves: &[bool],
    source_serial: i64,
    destination_serial: i64,
) -> Option<(Vec<u8>, Vec<u8>)> {
    let ((src_body, src_layout), (dst_body, dst_layout)) = (src.raw.as_ref()?, dst.raw.as_ref()?);
    let record = |k: usize| &src_body[src_layout.records[k].clone()];
    let kept: Vec<&[u8]> = (0..moves.len())
        .filter(|&k| !moves[k])
        .map(record)
        .collect();
    let mut joined: Vec<&[u8]> = dst_layout
        .records
        .iter()
        .map(|r| &dst_body[r.clone()])
        .collect();
    joined.extend((0..moves.len()).filter(|&k| moves[k]).map(record));
    let source = splice(src_body, src_layout, source_serial, &kept);
    let destination = splice(dst_body, dst_layout, destination_serial, &joined);
    let reads_back = |body: &[u8], serial: i64, records: usize| {
        serde_json::from_slice::<Value>(body).is_ok_and(|v| {
            v["serial"].as_i64() == Some(serial)
                && v["resources"].as_array().map(Vec::len) == Some(records)
        })
    };
    (reads_back(&source, source_serial, kept.len())
        && reads_back(&destination, destination_serial, joined.len()))
    .then_some((source, destination))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A move of this very process runs; one of a pid that is not running, or of this
    /// pid but another start (a reused pid), or of another boot of this machine, is
    /// gone at once; one of another machine only once its heartbeat lapsed.
    #[test]
    fn a_move_is_gone_when_its_process_is() {
        let me = this_process();
        assert!(!me.is_empty(), "/proc tells who this process is");
        let now = 1_000_000;
        assert!(!gone(me, 0, now), "this process runs");
        let parts: Vec<&str> = me.split('/').collect();
        let with = |i: usize, v: &str| {
            let mut p = parts.clone();
            p[i] = v;
            p.join("/")
        };
        assert!(gone(&with(3, "1"), now, now), "another start of this pid");
        assert!(gone(&with(2, "4194304"), now, now), "no such pid");
        let elsewhere = with(0, "another-boot");
        assert!(!gone(&elsewhere, now - HEARTBEAT_LAPSES_AFTER, now));
        assert!(gone(&elsewhere, now - HEARTBEAT_LAPSES_AFTER - 1, now));
        assert!(gone("", now - HEARTBEAT_LAPSES_AFTER - 1, now));
        assert!(
            !gone("", now, now),
            "an unknown process judged by its heartbeat"
        );
    }

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn addresses() {
        use BadAddresses::*;
        let ok = [
            "terraform_data.a",
            "data.http.x",
            "module.net.aws_vpc.main",
            "module.net[0].aws_vpc.main",
            "module.net[\"eu.west\"].module.sub.data.x_y.z-1",
            "module.a[\"q\\\"uote\"].t.n",
            "  aws_s3_bucket.b  ",
        ];
        for a in ok {
            assert_eq!(
                check_addresses(&list(&[a])),
                Ok(vec![a.trim().to_string()]),
                "{a}"
            );
        }
        let table: Vec<(Vec<String>, BadAddresses)> = vec![
            (vec![], Empty),
            (vec!["a.b".to_string(); MAX_ADDRESSES + 1], TooMany),
            (list(&["a.b", "a.b"]), Duplicate(2)),
            (
                vec![format!("t.{}", "n".repeat(MAX_ADDRESS_BYTES))],
                TooLong(1),
            ),
            (list(&["a.b", "terraform_data"]), Malformed(2)),
            (list(&[""]), Malformed(1)),
            (list(&["module.net"]), Malformed(1)),
            (list(&["module.net.aws_vpc"]), Malformed(1)),
            (list(&["a.b.c"]), Malformed(1)),
            (list(&["1a.b"]), Malformed(1)),
            (list(&["a.b c"]), Malformed(1)),
            (list(&["module.[0].a.b"]), Malformed(1)),
            (list(&["module.x[\"open].a.b"]), Malformed(1)),
            (list(&["module.x[].a.b"]), Malformed(1)),
            (list(&["data.a"]), Malformed(1)),
            (list(&["a.b[0]"]), Instance(1)),
            (list(&["module.m.a.b[\"k\"]"]), Instance(1)),
        ];
        for (input, expected) in table {
            assert_eq!(check_addresses(&input), Err(expected.clone()), "{input:?}");
        }
    }

    fn state(serial: i64, lineage: &str, resources: Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "version": 4, "terraform_version": "1.15.0", "serial": serial, "lineage": lineage,
            "outputs": {"o": {"value": 1, "type": "number"}}, "resources": resources, "check_results": null
        }))
        .unwrap()
    }

    fn resource(module: Option<&str>, mode: &str, kind: &str, name: &str, n: usize) -> Value {
        let mut r = serde_json::json!({
            "mode": mode, "type": kind, "name": name, "provider": "provider[\"terraform.io/builtin/terraform\"]",
            "instances": (0..n).map(|i| serde_json::json!({"index_key": i, "attributes": {"id": format!("{name}-{i}")}})).collect::<Vec<_>>(),
        });
        if let Some(m) = module {
            r["module"] = Value::from(m);
        }
        r
    }

    /// A state as Terraform writes it: its own key order (not sorted), two-space indent.
    fn terraform_written(serial: i64, lineage: &str, records: &[&str]) -> Vec<u8> {
        let list = if records.is_empty() {
            "[]".to_string()
        } else {
            format!("[\n    {}\n  ]", records.join(",\n    "))
        };
        format!(
            "{{\n  \"version\": 4,\n  \"terraform_version\": \"1.15.5\",\n  \"serial\": {serial},\n  \"lineage\": \"{lineage}\",\n  \"outputs\": {{}},\n  \"resources\": {list},\n  \"check_results\": null\n}}\n"
        )
        .into_bytes()
    }

    fn record(name: &str, value: &str) -> String {
        format!(
            "{{\n      \"mode\": \"managed\",\n      \"type\": \"terraform_data\",\n      \"name\": \"{name}\",\n      \"provider\": \"provider[\\\"terraform.io/builtin/terraform\\\"]\",\n      \"instances\": [\n        {{\n          \"schema_version\": 0,\n          \"attributes\": {{\n            \"id\": \"{value}\",\n            \"input\": {{\"value\": \"a \\\"quoted\\\" ]}} value\", \"type\": \"string\"}}\n          }},\n          \"sensitive_attributes\": [],\n          \"identity_schema_version\": 0\n        }}\n      ]\n    }}"
        )
    }

    /// What a move did to a state's resource summary, as the timeline and the version's
    /// counts see it.
    fn changes(before: &[u8], after: &[u8]) -> Vec<(String, crate::store::timeline::Change)> {
        let summary = |body: &[u8]| {
            crate::store::timeline::summarize_whole(crate::tfstate::resource_scan([7; 32]), body)
                .expect("a summary")
        };
        crate::store::timeline::diff(&summary(before), &summary(after))
    }

    #[test]
    fn a_move_keeps_every_records_bytes_so_only_the_moved_resource_changes() {
        use crate::store::timeline::Change;
        let (a, b, c) = (record("a", "1"), record("b", "2"), record("c", "3"));
        let src = terraform_written(5, "SRC", &[&a, &b]);
        for dst in [
            terraform_written(2, "DST", &[&c]),
            terraform_written(1, "DST", &[]),
        ] {
            let moved = move_resources(&src, &dst, &list(&["terraform_data.a"])).unwrap();
            assert_eq!(
                moved.source,
                terraform_written(6, "SRC", &[&b]),
                "the source is Terraform's bytes less the record, with the next serial"
            );
            let mut joined: Vec<&str> = Vec::new();
            let before: Value = serde_json::from_slice(&dst).unwrap();
            if !before["resources"].as_array().unwrap().is_empty() {
                joined.push(&c);
            }
            joined.push(&a);
            let next = before["serial"].as_i64().unwrap() + 1;
            assert_eq!(moved.destination, terraform_written(next, "DST", &joined));
            assert_eq!(
                changes(&src, &moved.source),
                vec![("terraform_data.a".to_string(), Change::Removed)],
                "b is untouched: not 'changed'"
            );
            assert_eq!(
                changes(&dst, &moved.destination),
                vec![("terraform_data.a".to_string(), Change::Added)]
            );
        }
    }

    #[test]
    fn the_layout_walk_finds_records_in_any_json_and_refuses_what_it_cannot_splice() {
        let body = br#"{"serial":3,"x":{"resources":[1]},"resources":[ {"a":"]\"}"} , [], "s" ],"y":[{}]}"#;
        let l = Layout::of(body).unwrap();
        assert_eq!(&body[l.serial.clone()], b"3");
        let records: Vec<&[u8]> = l.records.iter().map(|r| &body[r.clone()]).collect();
        assert_eq!(records, vec![&br#"{"a":"]\"}"}"#[..], b"[]", b"\"s\""]);
        for unspliceable in [
            &b"[]"[..],
            b"{\"serial\":1}",
            b"{\"serial\":1,\"resources\":null}",
        ] {
            assert_eq!(Layout::of(unspliceable), None);
        }
        // Nesting past serde_json's own limit is refused, not recursed into.
        let deep = format!(
            "{{\"serial\":1,\"resources\":[{}1{}]}}",
            "[".repeat(200),
            "]".repeat(200)
        );
        assert_eq!(Layout::of(deep.as_bytes()), None);
    }

    #[test]
    fn moves_whole_resources_and_keeps_everything_else() {
        let a = resource(None, "managed", "terraform_data", "a", 2);
        let b = resource(Some("module.m[\"k\"]"), "managed", "terraform_data", "b", 1);
        let d = resource(None, "data", "terraform_data", "a", 1);
        let keep = resource(None, "managed", "terraform_data", "keep", 1);
        let src = state(7, "SRC", serde_json::json!([a, b, d, keep]));
        let dst = state(
            3,
            "DST",
            serde_json::json!([resource(None, "managed", "x", "y", 1)]),
        );
        let moved = move_resources(
            &src,
            &dst,
            &list(&["terraform_data.a", "module.m[\"k\"].terraform_data.b"]),
        )
        .unwrap();
        assert_eq!(
            (
                moved.source_serial,
                moved.destination_serial,
                moved.instances
            ),
            (8, 4, 3)
        );
        let s: Value = serde_json::from_slice(&moved.source).unwrap();
        let t: Value = serde_json::from_slice(&moved.destination).unwrap();
        assert_eq!(s["lineage"], "SRC");
        assert_eq!(t["lineage"], "DST");
        assert_eq!(s["outputs"]["o"]["value"], 1);
        assert_eq!(
            s["resources"],
            serde_json::json!([d, keep]),
            "the data source of the same name stays"
        );
        assert_eq!(
            t["resources"],
            serde_json::json!([resource(None, "managed", "x", "y", 1), a, b])
        );
    }

    #[test]
    fn refusals() {
        let src = state(
            1,
            "S",
            serde_json::json!([
                resource(None, "managed", "t", "a", 1),
                resource(None, "managed", "t", "b", 1)
            ]),
        );
        let dst = state(
            1,
            "D",
            serde_json::json!([resource(None, "managed", "t", "b", 1)]),
        );
        let full = state(
            i64::MAX,
            "S",
            serde_json::json!([resource(None, "managed", "t", "a", 1)]),
        );
        let enc = br#"{"serial":1,"lineage":"x","meta":{},"encrypted_data":"AA==","encryption_version":"v0"}"#;
        type Row<'a> = (&'a [u8], &'a [u8], Vec<String>, Refusal);
        let table: Vec<Row> = vec![
            (
                &src,
                &dst,
                list(&["t.a", "t.zz"]),
                Refusal::Missing(list(&["t.zz"])),
            ),
            (
                &src,
                &dst,
                list(&["t.a", "t.b"]),
                Refusal::Present(list(&["t.b"])),
            ),
            (
                enc,
                &dst,
                list(&["t.a"]),
                Refusal::NotAState(
                    Side::Source,
                    "it is encrypted by OpenTofu, so stategate cannot see its resources",
                ),
            ),
            (
                &src,
                enc,
                list(&["t.a"]),
                Refusal::NotAState(
                    Side::Destination,
                    "it is encrypted by OpenTofu, so stategate cannot see its resources",
                ),
            ),
            (
                b"nope",
                &dst,
                list(&["t.a"]),
                Refusal::NotAState(Side::Source, "it is not JSON"),
            ),
            (
                b"[]",
                &dst,
                list(&["t.a"]),
                Refusal::NotAState(Side::Source, "it is not a JSON object"),
            ),
            (
                br#"{"version":3,"serial":1,"lineage":"x"}"#,
                &dst,
                list(&["t.a"]),
                Refusal::NotAState(Side::Source, "it is not a version 4 state"),
            ),
            (
                &full,
                &dst,
                list(&["t.a"]),
                Refusal::SerialExhausted(Side::Source),
            ),
        ];
        for (s, d, addresses, expected) in table {
            assert_eq!(
                move_resources(s, d, &addresses),
                Err(expected.clone()),
                "{expected:?}"
            );
        }
    }

    #[test]
    fn listings_are_bounded() {
        let many: Vec<String> = (0..25).map(|i| format!("t.n{i}")).collect();
        assert!(listing(&many).ends_with("t.n19 (and 5 more)"));
        assert_eq!(listing(&list(&["t.a", "t.b"])), "t.a, t.b");
    }
}
