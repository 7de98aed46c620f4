//! What stategate reads from a Terraform/OpenTofu state body: its serial and lineage,
//! and, for the resource timeline, each resource instance's address with a keyed
//! digest of its bytes (never its content).
//!
//! Both APIs store tfstate (the workspace backend and the cluster API), so the parse
//! lives below both. Versioning looks at those two fields only: an
//! OpenTofu-encrypted state (the `encrypted_data` envelope) keeps them in clear, so
//! versioning and the conflict rules work on states the server cannot read. A serial
//! is Terraform's uint64 but stored as an i64: one above [`MAX_SERIAL`] is refused
//! (400) with that reason, never stored as something else.

use serde::Deserialize;

use crate::error::Error;

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

/// The largest serial stategate stores. Terraform's serial is a uint64, SQLite's integer
/// an i64: a state above this is refused (400) rather than stored as something else,
/// and a rollback that would need a serial above it is refused (409).
pub const MAX_SERIAL: i64 = i64::MAX;

/// What a state's `serial` field holds, before judging it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SerialField {
    Fits(i64),
    Negative,
    /// An integer above [`MAX_SERIAL`] (valid for Terraform, not representable here).
    TooLarge,
    /// A fraction, an exponent, a string, …
    NotInteger,
}

impl SerialField {
    /// What serde_json read (it keeps integers up to u64 exactly, larger ones as f64).
    fn of_json(value: &serde_json::Value) -> SerialField {
        let Some(n) = value.as_number() else {
            return SerialField::NotInteger;
        };
        if let Some(i) = n.as_i64() {
            return if i < 0 {
                SerialField::Negative
            } else {
                SerialField::Fits(i)
            };
        }
        if n.as_u64().is_some() {
            return SerialField::TooLarge;
        }
        match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() >= 2f64.powi(63) => {
                if f < 0.0 {
                    SerialField::Negative
                } else {
                    SerialField::TooLarge
                }
            }
            _ => SerialField::NotInteger,
        }
    }

    /// The digits the scanner kept of a number (`None`: a fraction, an exponent or too long).
    fn of_digits(text: Option<&str>) -> SerialField {
        match text {
            // serde_json reads "-0" as the float -0.0, which is no integer.
            None | Some("-0") => SerialField::NotInteger,
            Some(t) if t.starts_with('-') => SerialField::Negative,
            Some(t) => t
                .parse::<i64>()
                .map_or(SerialField::TooLarge, SerialField::Fits),
        }
    }
}

/// What a body says about the fields stategate reads, before judging them.
#[derive(Debug, Default)]
struct Probe {
    version: bool,
    /// `Some(_)`: present (and not null).
    serial: Option<SerialField>,
    lineage: Option<String>,
    encrypted_data: bool,
    encryption_version: bool,
    /// The keys of a top-level `meta` object (OpenTofu's key provider addresses),
    /// at most [`MAX_META_KEYS`], each at most [`MAX_CAPTURE`] bytes.
    meta_keys: Vec<String>,
}

/// Most `meta` keys kept: an envelope names one key provider per configured one, and
/// a fallback or two.
const MAX_META_KEYS: usize = 16;

/// How a state body is protected, as far as its clear text says: what a write
/// records per version (`crate::tofu::posture`) without reading the state again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyEncryption {
    Plaintext,
    /// OpenTofu's encrypted envelope; `key_providers` are its `meta` keys
    /// (`key_provider.<type>.<name>`).
    OpenTofu {
        key_providers: Vec<String>,
    },
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

const LOW_BITS: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGH_BITS: u64 = u64::from_ne_bytes([0x80; 8]);

/// How many leading bytes of `data` come before the first one `ends` (eight bytes at
/// a time: `ends_in` marks such bytes of a little-endian word by their high bit, exactly,
/// as [`equal_bytes`] and [`control_bytes`] do; the tail byte by byte). Most of a state
/// is runs of string content and indentation, which this takes without branching per
/// byte.
fn run_length(data: &[u8], ends_in: impl Fn(u64) -> u64, ends: impl Fn(u8) -> bool) -> usize {
    let mut at = 0;
    while let Some(word) = data[at..].first_chunk::<8>() {
        let found = ends_in(u64::from_le_bytes(*word));
        if found != 0 {
            return at + (found.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + data[at..]
        .iter()
        .position(|&b| ends(b))
        .unwrap_or(data.len() - at)
}

/// The high bit of each byte of `word` equal to `byte` (exact: no carry crosses bytes).
fn equal_bytes(word: u64, byte: u8) -> u64 {
    let x = word ^ (LOW_BITS * u64::from(byte));
    !(((x & !HIGH_BITS) + !HIGH_BITS) | x) & HIGH_BITS
}

/// The high bit of each byte of `word` below 0x20, a JSON control character (exact).
fn control_bytes(word: u64) -> u64 {
    !(((word & !HIGH_BITS) + LOW_BITS * 0x60) | word) & HIGH_BITS
}

fn not_a_state(why: &str) -> Error {
    Error::Invalid(format!("body is not a Terraform/OpenTofu state: {why}"))
}

/// Accepts a plain tfstate (`version`, `serial`, `lineage`) or OpenTofu's encrypted
/// envelope (`encrypted_data`, `encryption_version`, with serial and lineage in clear).
pub fn parse_state(body: &[u8]) -> Result<StateMeta, Error> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(not_a_state("expected a JSON object"));
    }
    check_untrusted_json(body).map_err(not_a_state)?;
    let probe: StateProbe =
        serde_json::from_slice(body).map_err(|e| not_a_state(&format!("invalid JSON ({e})")))?;
    judge(Probe {
        version: probe.version.is_some(),
        serial: probe
            .serial
            .filter(|v| !v.is_null())
            .map(|v| SerialField::of_json(&v)),
        lineage: probe.lineage,
        encrypted_data: probe.encrypted_data.is_some(),
        encryption_version: probe.encryption_version.is_some(),
        meta_keys: Vec::new(),
    })
}

fn judge(probe: Probe) -> Result<StateMeta, Error> {
    let is_envelope = probe.encrypted_data && probe.encryption_version;
    if !probe.version && !is_envelope {
        return Err(not_a_state(
            "missing \"version\" (or \"encrypted_data\" for an encrypted state)",
        ));
    }
    let serial = match probe.serial {
        Some(SerialField::Fits(serial)) => serial,
        Some(SerialField::Negative) => return Err(not_a_state("\"serial\" must not be negative")),
        Some(SerialField::TooLarge) => {
            return Err(not_a_state(&format!(
                "\"serial\" is larger than {MAX_SERIAL}, the largest serial stategate can store"
            )))
        }
        Some(SerialField::NotInteger) | None => {
            return Err(not_a_state("\"serial\" must be a non-negative integer"))
        }
    };
    let lineage = probe
        .lineage
        .filter(|l| is_safe_id(l, MAX_LINEAGE_LEN))
        .ok_or_else(|| {
            not_a_state("\"lineage\" must be 1-256 printable ASCII characters (no spaces or control characters)")
        })?;
    Ok(StateMeta { serial, lineage })
}

/// The top-level keys the scanner keeps an eye on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Version,
    Serial,
    Lineage,
    EncryptedData,
    EncryptionVersion,
    /// OpenTofu's key provider metadata: only its keys are kept, never judged.
    Meta,
    /// Read only for the resource timeline (not part of what `parse_state` judges).
    Resources,
    Other,
}

impl Key {
    fn of(name: &[u8]) -> Key {
        match name {
            b"version" => Key::Version,
            b"serial" => Key::Serial,
            b"lineage" => Key::Lineage,
            b"encrypted_data" => Key::EncryptedData,
            b"encryption_version" => Key::EncryptionVersion,
            b"meta" => Key::Meta,
            b"resources" => Key::Resources,
            _ => Key::Other,
        }
    }
}

/// Depths (open containers) of a v4 state's resource structure: the top-level
/// `resources` array holds resource objects, whose `instances` array holds instances.
const RESOURCES_DEPTH: usize = 2;
const RESOURCE_DEPTH: usize = 3;
const INSTANCES_DEPTH: usize = 4;
const INSTANCE_DEPTH: usize = 5;

/// The fields of a resource object (and of an instance) that make its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Module,
    Mode,
    Type,
    Name,
    Instances,
    IndexKey,
    Other,
}

impl Field {
    fn of(name: &[u8], depth: usize) -> Field {
        match (depth, name) {
            (RESOURCE_DEPTH, b"module") => Field::Module,
            (RESOURCE_DEPTH, b"mode") => Field::Mode,
            (RESOURCE_DEPTH, b"type") => Field::Type,
            (RESOURCE_DEPTH, b"name") => Field::Name,
            (RESOURCE_DEPTH, b"instances") => Field::Instances,
            (INSTANCE_DEPTH, b"index_key") => Field::IndexKey,
            _ => Field::Other,
        }
    }
}

type DigestMac = hmac::Hmac<sha2::Sha256>;
type InstanceDigest = [u8; crate::store::timeline::DIGEST_LEN];

/// The resource timeline's part of a scan: for every instance, its address and an
/// HMAC of its bytes exactly as they stream past (Terraform writes states
/// deterministically, so equal content is equal bytes). Holds one resource's
/// instances and the finished (address, digest) pairs, within
/// [`crate::store::timeline`]'s bounds; past them, or on a shape Terraform does not
/// write, the scan gives no summary at all.
struct ResourceScan {
    mac: DigestMac,
    in_resources: bool,
    in_instances: bool,
    field: Option<Field>,
    module: Option<String>,
    mode: Option<String>,
    kind: Option<String>,
    name: Option<String>,
    /// The instance being read: its MAC so far and its index key (as it appears in
    /// the address: `0`, `"eu"`), a span of `index_keys`.
    current: Option<DigestMac>,
    index_key: Option<(usize, usize)>,
    /// The index keys of the resource being read, one after another (one buffer for
    /// them all, not one string per instance).
    index_keys: Vec<u8>,
    /// Whether the index key being read is a string (else a number).
    index_is_text: bool,
    /// Where the instance's bytes not yet hashed begin (offset in the body).
    hash_from: Option<u64>,
    /// The offset of the instance's closing brace, just read.
    closed_at: Option<u64>,
    instances: Vec<(Option<(usize, usize)>, InstanceDigest)>,
    entries: crate::store::timeline::SummaryBuilder,
    broken: bool,
}

impl ResourceScan {
    fn new(key: [u8; 32]) -> Self {
        use hmac::Mac;
        ResourceScan {
            mac: DigestMac::new_from_slice(&key).expect("HMAC takes a key of any length"),
            in_resources: false,
            in_instances: false,
            field: None,
            module: None,
            mode: None,
            kind: None,
            name: None,
            current: None,
            index_key: None,
            index_keys: Vec::new(),
            index_is_text: false,
            hash_from: None,
            closed_at: None,
            instances: Vec::new(),
            entries: Default::default(),
            broken: false,
        }
    }

    fn start_resource(&mut self) {
        self.module = None;
        self.mode = None;
        self.kind = None;
        self.name = None;
        self.instances.clear();
        self.index_keys.clear();
    }

    /// A resource object ended: one address per instance.
    fn end_resource(&mut self) {
        use crate::store::timeline::MAX_ADDRESSES;
        let (Some(kind), Some(name)) = (self.kind.take(), self.name.take()) else {
            self.broken = true;
            return;
        };
        let mut base = String::new();
        if let Some(module) = self.module.take().filter(|m| !m.is_empty()) {
            base.push_str(&module);
            base.push('.');
        }
        if self.mode.take().as_deref() == Some("data") {
            base.push_str("data.");
        }
        base.push_str(&kind);
        base.push('.');
        base.push_str(&name);
        // Only UTF-8 was put in: a number's digits or JSON-encoded text.
        let keys = std::str::from_utf8(&self.index_keys).unwrap_or_default();
        for (index, digest) in self.instances.drain(..) {
            match index.and_then(|(from, to)| keys.get(from..to)) {
                Some(index) => self.entries.push(&[&base, "[", index, "]"], digest),
                None => self.entries.push(&[&base], digest),
            }
        }
        if self.entries.len() > MAX_ADDRESSES {
            self.broken = true;
        }
        if self.broken {
            self.entries = Default::default(); // nothing will be summarized: hold nothing
        }
    }

    fn hash(&mut self, bytes: &[u8]) {
        use hmac::Mac;
        if let Some(mac) = &mut self.current {
            mac.update(bytes);
        }
    }

    /// The instance whose bytes were all hashed ended.
    fn end_instance(&mut self) {
        use hmac::Mac;
        let Some(mac) = self.current.take() else {
            return;
        };
        let full = mac.finalize().into_bytes();
        let mut digest = [0u8; crate::store::timeline::DIGEST_LEN];
        digest.copy_from_slice(&full[..crate::store::timeline::DIGEST_LEN]);
        self.instances.push((self.index_key.take(), digest));
        if self.instances.len() > crate::store::timeline::MAX_ADDRESSES {
            self.broken = true;
            self.instances = Vec::new();
        }
    }

    fn summary(self) -> Option<crate::store::timeline::ResourceSummary> {
        if self.broken || self.in_resources {
            return None;
        }
        self.entries.build()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Before the top-level object.
    Start,
    /// A value (after `:` or `,` in an array).
    Value,
    /// A value or `]` (just after `[`).
    ValueOrClose,
    /// A key or `}` (just after `{`).
    KeyOrClose,
    /// A key (after `,` in an object).
    Key,
    Colon,
    /// `,` or the closing bracket.
    CommaOrClose,
    /// After the top-level object: whitespace only.
    End,
    InString,
    InNumber,
    InLiteral,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Esc {
    None,
    Backslash,
    Hex(u8, u16),
}

/// What the value being scanned is, when it belongs to a top-level key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Num,
    Null,
    Other,
}

/// The bytes of `body`'s top-level `serial`, when a rollback may rewrite them: `None`
/// unless `body` is a plain state (not OpenTofu's encrypted envelope, whose clear
/// fields the client may authenticate) with an integer serial. A rollback gives
/// restored content a serial above every one stored, so each plan saved before the
/// rollback is refused as stale instead of applying to a state it was not made for.
pub fn serial_span(body: &[u8]) -> Option<(u64, u64)> {
    let mut scanner = StateScanner::new();
    scanner.push(body).ok()?;
    scanner.renumberable_span()
}

/// The store's rollback finds the serial of a state it restores through this scanner,
/// piece by piece, without holding the state (it never reads states itself).
pub fn serial_span_scan() -> Box<dyn crate::store::history::SpanScan> {
    Box::new(StateScanner::new())
}

/// The store's rollback and index rebuild learn a state's resources through this
/// scanner (`store::timeline::Summarizer`), piece by piece.
pub fn resource_scan(digest_key: [u8; 32]) -> Box<dyn crate::store::timeline::Summarize> {
    Box::new(StateScanner::with_resources(digest_key))
}

impl crate::store::timeline::Summarize for StateScanner {
    fn push(&mut self, piece: &[u8]) {
        let _ = StateScanner::push(self, piece);
    }

    fn finish(self: Box<Self>) -> Option<crate::store::timeline::ResourceSummary> {
        self.finish_with_resources()
            .ok()
            .and_then(|(_, summary)| summary)
    }
}

impl crate::store::history::SpanScan for StateScanner {
    fn push(&mut self, piece: &[u8]) {
        // An error marks the scanner failed: `finish` then finds no span.
        let _ = StateScanner::push(self, piece);
    }

    fn finish(self: Box<Self>) -> Option<(u64, u64)> {
        self.renumberable_span()
    }
}

/// Longest string or number the scanner keeps (longer lineages are refused anyway).
const MAX_CAPTURE: usize = 1024;

/// Reads a state body piece by piece and learns its serial and lineage without
/// holding it: a small JSON state machine that accepts exactly what [`parse_state`]
/// accepts (JSON syntax, UTF-8, nesting depth, duplicate and mistyped fields) and
/// gives the same errors, keeping only the top-level values it needs.
pub struct StateScanner {
    expect: Expect,
    /// Open containers, innermost last (`{` or `[`).
    stack: Vec<u8>,
    utf8_carry: Vec<u8>,
    offset: u64,
    probe: Probe,
    seen: Vec<Key>,
    /// The top-level key whose value is being read.
    key: Option<Key>,
    /// The value being read belongs to a top-level key, and what it is.
    kind: Option<Kind>,
    is_key: bool,
    esc: Esc,
    /// A leading surrogate waiting for its trailing half (strict strings only).
    high: Option<u16>,
    strict: bool,
    num: Num,
    literal: &'static [u8],
    literal_at: usize,
    capture: Option<Vec<u8>>,
    /// The buffer of the last capture, kept for the next one: a 10,000-instance state
    /// captures ~60,000 field names, which would otherwise each allocate.
    spare: Vec<u8>,
    overflow: bool,
    failed: bool,
    /// Where the top-level value being read began.
    value_at: u64,
    /// The bytes of the top-level `serial` number, once read.
    serial_span: Option<(u64, u64)>,
    /// The resource timeline's scan, when asked for ([`StateScanner::with_resources`]).
    res: Option<Box<ResourceScan>>,
    /// Inside the top-level `meta` object (its keys are kept in the probe).
    in_meta: bool,
}

impl Default for StateScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl StateScanner {
    pub fn new() -> Self {
        StateScanner {
            expect: Expect::Start,
            stack: Vec::new(),
            utf8_carry: Vec::new(),
            offset: 0,
            probe: Probe::default(),
            seen: Vec::new(),
            key: None,
            kind: None,
            is_key: false,
            esc: Esc::None,
            high: None,
            strict: false,
            num: Num::Int,
            literal: b"",
            literal_at: 0,
            capture: None,
            spare: Vec::new(),
            overflow: false,
            failed: false,
            value_at: 0,
            serial_span: None,
            res: None,
            in_meta: false,
        }
    }

    /// After the whole body was pushed: whether it is OpenTofu's encrypted envelope
    /// (and which key providers its `meta` names) or a plain state.
    pub fn encryption(&self) -> BodyEncryption {
        if self.probe.encrypted_data && self.probe.encryption_version {
            BodyEncryption::OpenTofu {
                key_providers: self.probe.meta_keys.clone(),
            }
        } else {
            BodyEncryption::Plaintext
        }
    }

    /// A scanner that also summarizes the state's resource instances for the resource
    /// timeline, digests keyed with `digest_key` (the scope's
    /// `SealKey::resource_digest_key`).
    pub fn with_resources(digest_key: [u8; 32]) -> Self {
        StateScanner {
            res: Some(Box::new(ResourceScan::new(digest_key))),
            ..StateScanner::new()
        }
    }

    /// After a successful [`Self::finish`]-to-be: the resource summary, or `None` when
    /// not asked for, past a bound, or not readable here (an encrypted state).
    fn resource_summary(&mut self) -> Option<crate::store::timeline::ResourceSummary> {
        let res = self.res.take()?;
        if self.probe.encrypted_data || !self.probe.version {
            return None;
        }
        res.summary()
    }

    /// [`Self::finish`], with the resource summary (see [`Self::with_resources`]).
    pub fn finish_with_resources(
        mut self,
    ) -> Result<(StateMeta, Option<crate::store::timeline::ResourceSummary>), Error> {
        let finished = matches!(self.expect, Expect::End) && !self.failed;
        let summary = if finished {
            self.resource_summary()
        } else {
            None
        };
        let meta = self.finish()?;
        Ok((meta, summary))
    }

    /// Scans the next piece of the body.
    pub fn push(&mut self, data: &[u8]) -> Result<(), Error> {
        if self.failed {
            return Err(not_a_state("invalid JSON"));
        }
        let base = self.offset;
        let result = self.check_utf8(data).and_then(|()| {
            let mut at = 0;
            while at < data.len() {
                // Most of a state is string content and indentation: take a run of
                // plain string bytes, or of whitespace between tokens, at once instead
                // of a byte at a time through the state machine.
                let mut run = self.plain_string_run(&data[at..]);
                if run > 0 {
                    self.keep(&data[at..at + run]);
                } else {
                    run = self.whitespace_run(&data[at..]);
                    if run == 0 {
                        self.byte(data[at])?;
                        if let Some(res) = self.res.as_deref_mut() {
                            if let Some(end) = res.closed_at.take() {
                                // An instance ended at this byte: hash it up to here.
                                let from = res.hash_from.take().unwrap_or(base).max(base);
                                res.hash(&data[(from - base) as usize..=(end - base) as usize]);
                                res.end_instance();
                            }
                        }
                    }
                }
                let step = run.max(1);
                self.offset += step as u64;
                at += step;
            }
            Ok(())
        });
        if let Some(res) = self.res.as_deref_mut() {
            if let Some(from) = res.hash_from {
                // The instance goes on in the next piece.
                let from = from.max(base);
                res.hash(&data[(from - base) as usize..]);
                res.hash_from = Some(self.offset);
            }
        }
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    /// The body ended: the bytes of its top-level serial when a rollback may rewrite
    /// them (see [`serial_span`]) (a plain state, not an encrypted envelope, with an integer serial).
    fn renumberable_span(self) -> Option<(u64, u64)> {
        let plain = self.probe.version && !self.probe.encrypted_data;
        let span = self.serial_span?;
        self.finish().ok()?;
        plain.then_some(span)
    }

    /// The body ended: its serial and lineage, or why it is not a state.
    pub fn finish(mut self) -> Result<StateMeta, Error> {
        if self.failed {
            return Err(not_a_state("invalid JSON"));
        }
        if !self.utf8_carry.is_empty() {
            return Err(not_a_state("not UTF-8"));
        }
        match self.expect {
            Expect::End => judge(std::mem::take(&mut self.probe)),
            Expect::Start => Err(not_a_state("expected a JSON object")),
            _ => Err(self.invalid("EOF while parsing")),
        }
    }

    fn check_utf8(&mut self, data: &[u8]) -> Result<(), Error> {
        let mut joined;
        let bytes = if self.utf8_carry.is_empty() {
            data
        } else {
            joined = std::mem::take(&mut self.utf8_carry);
            joined.extend_from_slice(data);
            &joined[..]
        };
        match std::str::from_utf8(bytes) {
            Ok(_) => Ok(()),
            // Cut in the middle of a character: keep its start for the next piece.
            Err(e) if e.error_len().is_none() => {
                self.utf8_carry = bytes[e.valid_up_to()..].to_vec();
                Ok(())
            }
            Err(_) => Err(not_a_state("not UTF-8")),
        }
    }

    fn invalid(&self, what: &str) -> Error {
        not_a_state(&format!("invalid JSON ({what} at byte {})", self.offset))
    }

    fn byte(&mut self, b: u8) -> Result<(), Error> {
        let expect = self.expect;
        match expect {
            Expect::InString => return self.string_byte(b),
            Expect::InLiteral => {
                if b != self.literal[self.literal_at] {
                    return Err(self.invalid("expected ident"));
                }
                self.literal_at += 1;
                if self.literal_at == self.literal.len() {
                    self.value_done();
                }
                return Ok(());
            }
            // The byte after a number belongs to what follows it.
            Expect::InNumber if self.number_byte(b)? => return Ok(()),
            _ => {}
        }
        if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            return Ok(());
        }
        match self.expect {
            Expect::Start => {
                if b != b'{' {
                    return Err(not_a_state("expected a JSON object"));
                }
                self.open(b)
            }
            Expect::End => Err(self.invalid("trailing characters")),
            Expect::Value => self.value_start(b),
            Expect::ValueOrClose if b == b']' => self.close(b),
            Expect::ValueOrClose => self.value_start(b),
            Expect::KeyOrClose if b == b'}' => self.close(b),
            Expect::KeyOrClose | Expect::Key => {
                if b != b'"' {
                    return Err(self.invalid("key must be a string"));
                }
                let top = self.stack.len() == 1;
                self.start_string(true, top);
                if !top && (self.resource_level().is_some() || self.meta_key_here()) {
                    self.begin_capture(&[]); // a field's name, not strict
                }
                Ok(())
            }
            Expect::Colon => {
                if b != b':' {
                    return Err(self.invalid("expected `:`"));
                }
                self.expect = Expect::Value;
                Ok(())
            }
            Expect::CommaOrClose => match (b, self.stack.last()) {
                (b',', Some(b'{')) => {
                    self.expect = Expect::Key;
                    Ok(())
                }
                (b',', Some(_)) => {
                    self.expect = Expect::Value;
                    Ok(())
                }
                (b'}', Some(b'{')) | (b']', Some(b'[')) => self.close(b),
                _ => Err(self.invalid("expected `,` or a closing bracket")),
            },
            Expect::InString | Expect::InNumber | Expect::InLiteral => unreachable!(),
        }
    }

    fn open(&mut self, b: u8) -> Result<(), Error> {
        self.stack.push(b);
        if self.stack.len() > MAX_JSON_DEPTH {
            return Err(not_a_state("nested too deeply"));
        }
        self.expect = if b == b'{' {
            Expect::KeyOrClose
        } else {
            Expect::ValueOrClose
        };
        Ok(())
    }

    /// A key read now is one of the top-level `meta` object's own keys.
    fn meta_key_here(&self) -> bool {
        self.in_meta && self.stack.len() == 2
    }

    fn close(&mut self, _b: u8) -> Result<(), Error> {
        self.stack.pop();
        if self.stack.len() == 1 {
            self.in_meta = false;
        }
        match self.stack.len() {
            0 => self.expect = Expect::End,
            _ => self.value_done(),
        }
        if let Some(res) = self.res.as_deref_mut() {
            match self.stack.len() {
                1 => res.in_resources = false,
                RESOURCE_DEPTH => res.in_instances = false,
                _ => {}
            }
        }
        Ok(())
    }

    /// The depth of the resource structure the scanner is directly inside: a resource
    /// object's fields ([`RESOURCE_DEPTH`]) or an instance's ([`INSTANCE_DEPTH`]).
    fn resource_level(&self) -> Option<usize> {
        let res = self.res.as_deref()?;
        match self.stack.len() {
            RESOURCE_DEPTH if res.in_resources && !res.broken => Some(RESOURCE_DEPTH),
            INSTANCE_DEPTH if res.in_instances && !res.broken => Some(INSTANCE_DEPTH),
            _ => None,
        }
    }

    /// A value begins somewhere in the resource structure: notes where the
    /// structure's parts start and which field values to keep.
    fn resource_value_start_at(&mut self, depth: usize, b: u8) {
        let key = self.key;
        let offset = self.offset;
        let Some(res) = self.res.as_deref_mut() else {
            return;
        };
        if res.broken {
            return;
        }
        let field = res.field;
        match (depth, b) {
            (1, b'[') if key == Some(Key::Resources) => res.in_resources = true,
            (1, _) => {}
            (RESOURCES_DEPTH, b'{') if res.in_resources => res.start_resource(),
            (RESOURCES_DEPTH, _) if res.in_resources => res.broken = true,
            (RESOURCE_DEPTH, b'[') if res.in_resources && field == Some(Field::Instances) => {
                res.in_instances = true
            }
            (RESOURCE_DEPTH, b'"') if res.in_resources => {
                if matches!(
                    field,
                    Some(Field::Module | Field::Mode | Field::Type | Field::Name)
                ) {
                    self.begin_capture(&[]);
                }
            }
            (INSTANCES_DEPTH, b'{') if res.in_instances => {
                res.current = Some(res.mac.clone());
                res.index_key = None;
                res.hash_from = Some(offset);
            }
            (INSTANCES_DEPTH, _) if res.in_instances => res.broken = true,
            (INSTANCE_DEPTH, b'"' | b'-' | b'0'..=b'9')
                if res.in_instances && field == Some(Field::IndexKey) =>
            {
                res.index_is_text = b == b'"';
                let digit = [b];
                self.begin_capture(if b == b'"' { &[] } else { &digit });
            }
            _ => {}
        }
    }

    /// A value (or key) ended inside the resource structure, at `depth`.
    fn resource_value_done(&mut self, depth: usize, is_key: bool) {
        let captured = self.capture.take();
        let kept = captured.as_deref().filter(|_| !self.overflow);
        let Some(res) = self.res.as_deref_mut() else {
            self.recycle(captured);
            return;
        };
        if res.broken {
            self.recycle(captured);
            return;
        }
        if is_key {
            if (depth == RESOURCE_DEPTH && res.in_resources)
                || (depth == INSTANCE_DEPTH && res.in_instances)
            {
                res.field = Some(kept.map_or(Field::Other, |name| Field::of(name, depth)));
            }
            self.recycle(captured);
            return;
        }
        let text = || std::str::from_utf8(kept?).ok().map(str::to_string);
        match depth {
            RESOURCE_DEPTH if res.in_resources => match res.field.take() {
                Some(Field::Module) => res.module = text(),
                Some(Field::Mode) => res.mode = text(),
                Some(Field::Type) => res.kind = text(),
                Some(Field::Name) => res.name = text(),
                _ => {}
            },
            INSTANCE_DEPTH if res.in_instances && res.field.take() == Some(Field::IndexKey) => {
                // As Terraform writes it in an address: a number as is, text quoted.
                let from = res.index_keys.len();
                let key = kept.and_then(|k| std::str::from_utf8(k).ok());
                res.index_key = match (key, res.index_is_text) {
                    (Some(key), true) => serde_json::to_writer(&mut res.index_keys, key).ok(),
                    (Some(digits), false) => {
                        res.index_keys.extend_from_slice(digits.as_bytes());
                        Some(())
                    }
                    (None, _) => None,
                }
                .map(|()| (from, res.index_keys.len()));
            }
            INSTANCES_DEPTH if res.in_instances => {
                res.field = None;
                res.closed_at = Some(self.offset);
            }
            RESOURCES_DEPTH if res.in_resources => {
                res.field = None;
                res.end_resource();
            }
            _ => {}
        }
        self.recycle(captured);
    }

    /// Starts capturing a value, `first` already read, in the spare buffer.
    fn begin_capture(&mut self, first: &[u8]) {
        let mut buffer = std::mem::take(&mut self.spare);
        buffer.clear();
        buffer.extend_from_slice(first);
        let done = self.capture.replace(buffer);
        self.recycle(done);
        self.overflow = false;
    }

    /// A capture that is done with: its buffer is kept for the next one.
    fn recycle(&mut self, done: Option<Vec<u8>>) {
        if let Some(buffer) = done {
            self.spare = buffer;
        }
    }

    /// The capture in progress is dropped (its buffer kept for the next one).
    fn drop_capture(&mut self) {
        let done = self.capture.take();
        self.recycle(done);
    }

    /// A value begins; at the top level of the object, notes what it is.
    fn value_start(&mut self, b: u8) -> Result<(), Error> {
        let top = self.stack.len() == 1;
        let in_structure = self.res.is_some();
        let kind = match b {
            b'"' => Kind::Str,
            b'-' | b'0'..=b'9' => Kind::Num,
            b'n' => Kind::Null,
            _ => Kind::Other,
        };
        if top {
            self.kind = Some(kind);
            self.value_at = self.offset;
            self.in_meta = b == b'{' && self.key == Some(Key::Meta);
        }
        let key = if top { self.key } else { None };
        let opened = match b {
            b'{' | b'[' => self.open(b),
            b'"' => {
                let capture = matches!(key, Some(Key::Lineage | Key::EncryptionVersion));
                self.start_string(false, capture);
                Ok(())
            }
            b'-' | b'0'..=b'9' => {
                self.expect = Expect::InNumber;
                self.num = match b {
                    b'-' => Num::Minus,
                    b'0' => Num::Zero,
                    _ => Num::Int,
                };
                self.capture = (key == Some(Key::Serial)).then(|| vec![b]);
                Ok(())
            }
            b't' | b'f' | b'n' => {
                self.expect = Expect::InLiteral;
                self.literal = match b {
                    b't' => b"true",
                    b'f' => b"false",
                    _ => b"null",
                };
                self.literal_at = 1;
                Ok(())
            }
            _ => Err(self.invalid("expected value")),
        };
        if in_structure && opened.is_ok() {
            // Where the value begins, before `open` deepened the stack. Nothing deeper
            // than an instance's own fields is the structure's (most of a state's
            // values are, inside `attributes`).
            let depth = self.stack.len() - usize::from(matches!(b, b'{' | b'['));
            if depth <= INSTANCE_DEPTH {
                self.resource_value_start_at(depth, b);
            }
        }
        opened
    }

    /// A value (or a key) ended; decides what comes next.
    fn value_done(&mut self) {
        if self.is_key && self.meta_key_here() && self.probe.meta_keys.len() < MAX_META_KEYS {
            if let (Some(name), false) = (&self.capture, self.overflow) {
                if let Ok(name) = std::str::from_utf8(name) {
                    self.probe.meta_keys.push(name.to_string());
                }
            }
        }
        if self.res.is_some() && (2..=INSTANCE_DEPTH).contains(&self.stack.len()) {
            let (depth, is_key) = (self.stack.len(), self.is_key);
            self.resource_value_done(depth, is_key);
        }
        if self.is_key {
            self.is_key = false;
            if self.stack.len() == 1 {
                self.key = Some(match (&self.capture, self.overflow) {
                    (Some(name), false) => Key::of(name),
                    _ => Key::Other,
                });
            }
            self.drop_capture();
            self.expect = Expect::Colon;
            return;
        }
        self.expect = Expect::CommaOrClose;
        if self.stack.len() == 1 {
            if let (Some(key), Some(kind)) = (self.key.take(), self.kind.take()) {
                self.note(key, kind);
            }
            self.drop_capture();
        }
    }

    /// Records a top-level field (errors are kept for [`StateScanner::finish`] via the probe).
    fn note(&mut self, key: Key, kind: Kind) {
        if matches!(key, Key::Other | Key::Resources | Key::Meta) {
            return; // not judged: `parse_state` ignores them, duplicates included
        }
        if self.seen.contains(&key) {
            self.failed = true; // a duplicate field, as serde refuses
            return;
        }
        self.seen.push(key);
        let text = self.capture.take().filter(|_| !self.overflow);
        let present = kind != Kind::Null;
        match key {
            Key::Version => self.probe.version = present,
            Key::EncryptedData => self.probe.encrypted_data = present,
            Key::Serial if present => {
                if kind == Kind::Num {
                    self.serial_span = Some((self.value_at, self.offset));
                }
                self.probe.serial = Some(match kind {
                    Kind::Num => {
                        let digits = text.and_then(|t| String::from_utf8(t).ok());
                        SerialField::of_digits(digits.as_deref())
                    }
                    _ => SerialField::NotInteger,
                });
            }
            Key::Lineage if present => match (kind, text) {
                (Kind::Str, Some(t)) => self.probe.lineage = String::from_utf8(t).ok(),
                (Kind::Str, None) => self.probe.lineage = Some("x".repeat(MAX_CAPTURE)),
                _ => self.failed = true, // not a string: serde's type error
            },
            Key::EncryptionVersion if present => match kind {
                Kind::Str => self.probe.encryption_version = true,
                _ => self.failed = true,
            },
            _ => {}
        }
    }

    fn start_string(&mut self, is_key: bool, capture: bool) {
        self.expect = Expect::InString;
        self.is_key = is_key;
        self.esc = Esc::None;
        self.high = None;
        // serde decodes what it deserializes (top-level keys, lineage) strictly.
        self.strict = capture;
        if capture {
            self.begin_capture(&[]);
        } else {
            self.drop_capture();
        }
        self.overflow = false;
    }

    /// How many leading bytes of `data` are plain string content (inside a string, no
    /// escape pending): everything before the next quote, backslash or control byte.
    fn plain_string_run(&self, data: &[u8]) -> usize {
        if self.expect != Expect::InString || self.esc != Esc::None || self.high.is_some() {
            return 0;
        }
        run_length(
            data,
            |word| equal_bytes(word, b'"') | equal_bytes(word, b'\\') | control_bytes(word),
            |b| b == b'"' || b == b'\\' || b < 0x20,
        )
    }

    /// How many leading bytes of `data` are whitespace between tokens (which `byte`
    /// would skip one by one); none inside a string, number or literal, where they end
    /// or break the token and must go through `byte`.
    fn whitespace_run(&self, data: &[u8]) -> usize {
        if matches!(
            self.expect,
            Expect::InString | Expect::InNumber | Expect::InLiteral
        ) {
            return 0;
        }
        let blank = |word| {
            equal_bytes(word, b' ')
                | equal_bytes(word, b'\n')
                | equal_bytes(word, b'\t')
                | equal_bytes(word, b'\r')
        };
        run_length(
            data,
            |word| !blank(word) & HIGH_BITS,
            |b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'),
        )
    }

    fn keep(&mut self, bytes: &[u8]) {
        if let Some(buf) = &mut self.capture {
            if buf.len() + bytes.len() > MAX_CAPTURE {
                self.overflow = true;
            } else {
                buf.extend_from_slice(bytes);
            }
        }
    }

    fn string_byte(&mut self, b: u8) -> Result<(), Error> {
        match self.esc {
            Esc::Backslash => {
                let decoded = match b {
                    b'"' => b'"',
                    b'\\' => b'\\',
                    b'/' => b'/',
                    b'b' => 8,
                    b'f' => 12,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => {
                        self.esc = Esc::Hex(0, 0);
                        return Ok(());
                    }
                    _ => return Err(self.invalid("invalid escape")),
                };
                if self.high.is_some() {
                    return Err(self.invalid("lone leading surrogate in hex escape"));
                }
                self.esc = Esc::None;
                self.keep(&[decoded]);
                Ok(())
            }
            Esc::Hex(n, acc) => {
                let digit = (b as char)
                    .to_digit(16)
                    .ok_or_else(|| self.invalid("invalid escape"))?;
                let acc = acc << 4 | digit as u16;
                if n < 3 {
                    self.esc = Esc::Hex(n + 1, acc);
                    return Ok(());
                }
                self.esc = Esc::None;
                self.code_unit(acc)
            }
            Esc::None => match b {
                b'\\' => {
                    self.esc = Esc::Backslash;
                    Ok(())
                }
                _ if self.high.is_some() => {
                    Err(self.invalid("lone leading surrogate in hex escape"))
                }
                b'"' => {
                    self.value_done();
                    Ok(())
                }
                0..=0x1f => Err(self.invalid("control character while parsing a string")),
                _ => {
                    self.keep(&[b]);
                    Ok(())
                }
            },
        }
    }

    /// One `\uXXXX` escape: checked for surrogate pairs where serde checks them.
    fn code_unit(&mut self, unit: u16) -> Result<(), Error> {
        if !self.strict {
            if self.capture.is_some() {
                // A resource field, kept as read (a lone surrogate as U+FFFD).
                let c = char::from_u32(u32::from(unit)).unwrap_or('\u{FFFD}');
                let mut utf8 = [0u8; 4];
                self.keep(c.encode_utf8(&mut utf8).as_bytes());
            }
            return Ok(());
        }
        let c = match (self.high.take(), unit) {
            (None, 0xD800..=0xDBFF) => {
                self.high = Some(unit);
                return Ok(());
            }
            (None, 0xDC00..=0xDFFF) => {
                return Err(self.invalid("lone trailing surrogate in hex escape"))
            }
            (None, _) => char::from_u32(u32::from(unit)),
            (Some(high), 0xDC00..=0xDFFF) => char::from_u32(
                0x10000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(unit) - 0xDC00),
            ),
            (Some(_), _) => return Err(self.invalid("lone leading surrogate in hex escape")),
        };
        let mut utf8 = [0u8; 4];
        let c = c.ok_or_else(|| self.invalid("invalid escape"))?;
        self.keep(c.encode_utf8(&mut utf8).as_bytes());
        Ok(())
    }

    /// Returns false when `b` is not part of the number (which then ended).
    fn number_byte(&mut self, b: u8) -> Result<bool, Error> {
        let next = match (self.num, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, b'1'..=b'9') => Num::Int,
            (Num::Int, b'0'..=b'9') => Num::Int,
            (Num::Zero | Num::Int, b'.') => Num::Dot,
            (Num::Dot | Num::Frac, b'0'..=b'9') => Num::Frac,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::E,
            (Num::E, b'+' | b'-') => Num::ESign,
            (Num::E | Num::ESign | Num::Exp, b'0'..=b'9') => Num::Exp,
            (Num::Zero, b'0'..=b'9') => return Err(self.invalid("invalid number")),
            (Num::Zero | Num::Int | Num::Frac | Num::Exp, _) => {
                // serial must be an integer: a fraction or exponent makes it a float.
                if !matches!(self.num, Num::Zero | Num::Int) {
                    self.drop_capture();
                }
                self.value_done();
                return Ok(false);
            }
            _ => return Err(self.invalid("invalid number")),
        };
        self.num = next;
        self.keep(&[b]);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_at_a_time_runs_stop_where_byte_at_a_time_runs_do() {
        let in_string = StateScanner {
            expect: Expect::InString,
            ..StateScanner::new()
        };
        let between = StateScanner::new();
        let string_ends = |b: u8| b == b'"' || b == b'\\' || b < 0x20;
        let blank = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        // Every byte value at every offset of runs shorter and longer than a word, after
        // plain content and after blanks, and with bytes past the stop that would fool
        // a borrow-propagating test.
        for len in [0usize, 1, 7, 8, 9, 15, 16, 23] {
            for stop in 0..=255u8 {
                for tail in [b'a', 0x00, 0x1f, b'"', 0xff] {
                    let mut text = vec![b'x'; len];
                    text.push(stop);
                    text.extend_from_slice(&[tail; 9]);
                    let expect = text
                        .iter()
                        .position(|&b| string_ends(b))
                        .unwrap_or(text.len());
                    assert_eq!(in_string.plain_string_run(&text), expect, "{text:?}");
                    let mut blanks = b" \n\t\r".repeat(len).to_vec();
                    blanks.truncate(len);
                    blanks.push(stop);
                    blanks.extend_from_slice(&[tail; 9]);
                    let expect = blanks
                        .iter()
                        .position(|&b| !blank(b))
                        .unwrap_or(blanks.len());
                    assert_eq!(between.whitespace_run(&blanks), expect, "{blanks:?}");
                }
            }
            assert_eq!(in_string.plain_string_run(&vec![0xc3; len]), len);
            assert_eq!(between.whitespace_run(&vec![b' '; len]), len);
        }
    }

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
                matches!(parse_state(body.as_bytes()), Err(Error::Invalid(_))),
                "{body}"
            );
        }
        let long = format!(
            r#"{{"version":4,"serial":1,"lineage":"{}"}}"#,
            "a".repeat(257)
        );
        assert!(parse_state(long.as_bytes()).is_err());
    }

    /// Terraform's serial is a uint64; stategate keeps an i64. What does not fit is
    /// refused with a message saying why, the same whole and streamed.
    #[test]
    fn serials_that_cannot_be_stored_are_refused_clearly() {
        // (serial as written, accepted serial or the words the refusal contains)
        let table: &[(&str, Result<i64, &str>)] = &[
            ("0", Ok(0)),
            ("9223372036854775807", Ok(i64::MAX)),
            (
                "9223372036854775808",
                Err("larger than 9223372036854775807"),
            ),
            (
                "18446744073709551615",
                Err("larger than 9223372036854775807"),
            ),
            (
                "18446744073709551616",
                Err("larger than 9223372036854775807"),
            ),
            (
                "99999999999999999999999",
                Err("larger than 9223372036854775807"),
            ),
            ("-1", Err("must not be negative")),
            ("-9223372036854775808", Err("must not be negative")),
            ("-9223372036854775809", Err("must not be negative")),
            ("-0", Err("non-negative integer")),
            ("1.5", Err("non-negative integer")),
            ("3.0", Err("non-negative integer")),
            ("\"3\"", Err("non-negative integer")),
            ("null", Err("non-negative integer")),
        ];
        for (serial, expected) in table {
            let body = format!(r#"{{"version":4,"serial":{serial},"lineage":"l"}}"#);
            for (how, got) in [
                ("whole", parse_state(body.as_bytes())),
                ("streamed", scan(body.as_bytes(), 3)),
            ] {
                match (got, expected) {
                    (Ok(meta), Ok(want)) => assert_eq!(meta.serial, *want, "{serial} {how}"),
                    (Err(Error::Invalid(msg)), Err(words)) => {
                        assert!(msg.contains(words), "{serial} {how}: {msg}")
                    }
                    (got, _) => panic!("{serial} {how}: {got:?}"),
                }
            }
        }
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

    /// Addresses (and digests) of `body`'s resource instances, scanned in pieces of `piece`.
    fn summarize(body: &[u8], piece: usize) -> Option<Vec<(String, [u8; 16])>> {
        let mut scanner = StateScanner::with_resources([9; 32]);
        for part in body.chunks(piece.max(1)) {
            scanner.push(part).ok()?;
        }
        let (_, summary) = scanner.finish_with_resources().ok()?;
        let summary = summary?;
        // Re-encoded through the store's own form to read the entries back.
        Some(summary_entries(&summary))
    }

    fn summary_entries(s: &crate::store::timeline::ResourceSummary) -> Vec<(String, [u8; 16])> {
        let prev = crate::store::timeline::ResourceSummary::default();
        let changes = crate::store::timeline::diff(&prev, s);
        // Digests are compared through `diff` below; here only the addresses.
        changes.into_iter().map(|(a, _)| (a, [0; 16])).collect()
    }

    const RESOURCES: &str = r#"{"version":4,"serial":3,"lineage":"l","outputs":{"o":{"value":"x"}},
      "resources":[
        {"mode":"managed","type":"null_resource","name":"one","provider":"p","instances":[
          {"schema_version":0,"attributes":{"id":"1","triggers":{"k":"v"}}}]},
        {"module":"module.net","mode":"managed","type":"aws_subnet","name":"s","instances":[
          {"index_key":0,"attributes":{"id":"a"}},{"index_key":1,"attributes":{"id":"b"}}]},
        {"mode":"data","type":"aws_ami","name":"ubuntu","instances":[{"attributes":{"id":"ami"}}]},
        {"instances":[{"index_key":"blue \"x\"","attributes":{}}],"name":"web","type":"aws_instance","mode":"managed","module":"module.app[\"eu\"]"},
        {"mode":"managed","type":"none_left","name":"n","instances":[]}
      ]}"#;

    /// Every instance gets its Terraform address (modules, data sources, count and
    /// for_each keys, any field order), however the body is cut.
    #[test]
    fn resource_addresses_however_the_body_is_cut() {
        let expected = vec![
            "data.aws_ami.ubuntu",
            "module.app[\"eu\"].aws_instance.web[\"blue \\\"x\\\"\"]",
            "module.net.aws_subnet.s[0]",
            "module.net.aws_subnet.s[1]",
            "null_resource.one",
        ];
        for piece in [1, 2, 3, 5, 64, RESOURCES.len()] {
            let got: Vec<String> = summarize(RESOURCES.as_bytes(), piece)
                .unwrap()
                .into_iter()
                .map(|(a, _)| a)
                .collect();
            assert_eq!(got, expected, "pieces of {piece}");
        }
    }

    /// The digest of an instance depends on its bytes only: the same state cut
    /// differently gives the same summary; one changed attribute changes exactly that
    /// instance's digest; another key gives other digests.
    #[test]
    fn resource_digests_follow_each_instances_bytes() {
        let full = |body: &str, key: [u8; 32], piece: usize| {
            let mut scanner = StateScanner::with_resources(key);
            for part in body.as_bytes().chunks(piece) {
                scanner.push(part).unwrap();
            }
            scanner.finish_with_resources().unwrap().1.unwrap()
        };
        let a = full(RESOURCES, [9; 32], 7);
        assert_eq!(a, full(RESOURCES, [9; 32], 1));
        assert_eq!(a, full(RESOURCES, [9; 32], RESOURCES.len()));
        let changed = RESOURCES.replace(r#""id":"b""#, r#""id":"c""#);
        let b = full(&changed, [9; 32], 5);
        let diff: Vec<_> = crate::store::timeline::diff(&a, &b);
        assert_eq!(
            diff,
            vec![(
                "module.net.aws_subnet.s[1]".to_string(),
                crate::store::timeline::Change::Changed
            )]
        );
        assert_ne!(a, full(RESOURCES, [8; 32], 7), "digests are keyed");
    }

    /// What gives no summary: an encrypted envelope, a state with a resource Terraform
    /// would not write, a duplicate address; a plain scanner never summarizes. The
    /// serial and lineage are read as always.
    #[test]
    fn no_summary_where_none_can_be_trusted() {
        let none = [
            r#"{"serial":7,"lineage":"l","encrypted_data":"ZZ","encryption_version":"v0","resources":[]}"#,
            r#"{"version":4,"serial":1,"lineage":"l","resources":[{"mode":"managed","instances":[{}]}]}"#,
            r#"{"version":4,"serial":1,"lineage":"l","resources":[7]}"#,
            r#"{"version":4,"serial":1,"lineage":"l","resources":[{"type":"t","name":"n","instances":[5]}]}"#,
            r#"{"version":4,"serial":1,"lineage":"l","resources":[{"type":"t","name":"n","instances":[{}]},{"type":"t","name":"n","instances":[{}]}]}"#,
        ];
        for body in none {
            assert_eq!(summarize(body.as_bytes(), 3), None, "{body}");
            assert!(scan(body.as_bytes(), 3).is_ok(), "{body}");
        }
        let empty = r#"{"version":4,"serial":1,"lineage":"l"}"#;
        assert_eq!(summarize(empty.as_bytes(), 2), Some(vec![]));
        let mut plain = StateScanner::new();
        plain.push(RESOURCES.as_bytes()).unwrap();
        assert_eq!(plain.finish_with_resources().unwrap().1, None);
        // A duplicate top-level "resources" is no error (parse_state ignores it).
        let twice = r#"{"version":4,"serial":1,"lineage":"l","resources":[],"resources":[]}"#;
        agrees(twice.as_bytes());
        assert!(parse_state(twice.as_bytes()).is_ok());
    }

    /// Scans `body` in pieces of `piece` bytes.
    fn scan(body: &[u8], piece: usize) -> Result<StateMeta, Error> {
        let mut scanner = StateScanner::new();
        for part in body.chunks(piece.max(1)) {
            scanner.push(part)?;
        }
        scanner.finish()
    }

    /// The scanner agrees with `parse_state` on `body`, however it is cut.
    fn agrees(body: &[u8]) {
        let whole = parse_state(body).ok();
        for piece in [1, 2, 3, 7, 64, body.len().max(1)] {
            assert_eq!(
                scan(body, piece).ok(),
                whole,
                "{} (pieces of {piece})",
                String::from_utf8_lossy(&body[..body.len().min(120)])
            );
        }
    }

    /// `body` with its serial rewritten to `serial` at [`serial_span`] (what the
    /// store's rollback does piece by piece).
    fn with_serial(body: &[u8], serial: i64) -> Option<Vec<u8>> {
        let (start, end) = serial_span(body)?;
        let mut out = body[..start as usize].to_vec();
        out.extend_from_slice(serial.to_string().as_bytes());
        out.extend_from_slice(&body[end as usize..]);
        Some(out)
    }

    #[test]
    fn with_serial_changes_only_the_top_level_serial() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                r#"{"version":4,"serial":3,"lineage":"l","outputs":{"serial":{"value":3}}}"#,
                Some(r#"{"version":4,"serial":17,"lineage":"l","outputs":{"serial":{"value":3}}}"#),
            ),
            (
                "{\n  \"lineage\": \"l\",\n  \"serial\" :  12 ,\n  \"version\": 4\n}\n",
                Some("{\n  \"lineage\": \"l\",\n  \"serial\" :  17 ,\n  \"version\": 4\n}\n"),
            ),
            // OpenTofu's encrypted envelope: left alone.
            (
                r#"{"serial":3,"lineage":"l","encrypted_data":"x","encryption_version":"v0"}"#,
                None,
            ),
            // Not a state, or no usable serial.
            (r#"{"version":4,"serial":1.5,"lineage":"l"}"#, None),
            (r#"{"version":4,"serial":"3","lineage":"l"}"#, None),
            (r#"{"version":4,"lineage":"l"}"#, None),
            (r#"{"version":4,"serial":3,"lineage":"l""#, None),
            ("not json", None),
        ];
        for (body, expected) in cases {
            let got = with_serial(body.as_bytes(), 17);
            assert_eq!(got.as_deref(), expected.map(str::as_bytes), "{body}");
            if let Some(out) = got {
                assert_eq!(parse_state(&out).unwrap().serial, 17);
            }
        }
    }

    #[test]
    fn scanner_agrees_with_parse_state() {
        let table: &[&str] = &[
            r#"{"version":4,"serial":3,"lineage":"abc","resources":[]}"#,
            r#"{"serial":7,"lineage":"l","meta":{"k":"x"},"encrypted_data":"ZZ","encryption_version":"v0"}"#,
            " \n\t{\"version\":4,\"serial\":0,\"lineage\":\"x\"} \r\n",
            r#"{"version":null,"serial":1,"lineage":"x"}"#,
            r#"{"version":4,"serial":null,"lineage":"x"}"#,
            r#"{"version":4,"serial":1,"lineage":null}"#,
            r#"{"version":4,"serial":-0,"lineage":"x"}"#,
            r#"{"version":4,"serial":1.0,"lineage":"x"}"#,
            r#"{"version":4,"serial":1e2,"lineage":"x"}"#,
            r#"{"version":4,"serial":01,"lineage":"x"}"#,
            r#"{"version":4,"serial":9223372036854775807,"lineage":"x"}"#,
            r#"{"version":4,"serial":9223372036854775808,"lineage":"x"}"#,
            r#"{"version":4,"serial":"3","lineage":"x"}"#,
            r#"{"version":4,"serial":true,"lineage":"x"}"#,
            r#"{"version":4,"serial":[1],"lineage":"x"}"#,
            r#"{"version":4,"serial":1,"serial":2,"lineage":"x"}"#,
            r#"{"version":4,"serial":1,"lineage":"x","lineage":"y"}"#,
            r#"{"version":4,"version":4,"serial":1,"lineage":"x"}"#,
            r#"{"version":4,"serial":1,"lineage":"x","other":1,"other":2}"#,
            r#"{"ver\u0073ion":4,"ser\u0069al":5,"line\u0061ge":"a\u0062c"}"#,
            r#"{"version":4,"serial":1,"lineage":"a\"b"}"#,
            r#"{"version":4,"serial":1,"lineage":"a\/b"}"#,
            r#"{"version":4,"serial":1,"lineage":"\ud83d\ude00"}"#,
            r#"{"version":4,"serial":1,"lineage":"\ud83d"}"#,
            r#"{"version":4,"serial":1,"lineage":"\ude00x"}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":"\ud83d"}"#,
            r#"{"version":4,"serial":1,"lineage":"x","\ud83d":1}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":"\q"}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":"\u12"}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":{"serial":-5,"lineage":7}}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":[1,2,{"a":[true,false,null]}]}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":[1,]}"#,
            r#"{"version":4,"serial":1,"lineage":"x",}"#,
            r#"{"version":4,"serial":1,"lineage":"x"} x"#,
            r#"{"version":4,"serial":1,"lineage":"x"}{}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":tru}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":-}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":1.}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":.5}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":1e}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":-1.5e+3}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":1E-3}"#,
            r#"{"version":4,"serial":1,"lineage":"x" "o":1}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o" 1}"#,
            r#"{"version":4,"serial":1,"lineage":"x",1:1}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":[}"#,
            r#"{"version":4,"serial":1,"lineage":"x","o":{]}"#,
            r#"{"serial":1,"lineage":"x","encrypted_data":null,"encryption_version":"v"}"#,
            r#"{"serial":1,"lineage":"x","encrypted_data":{},"encryption_version":null}"#,
            r#"{"serial":1,"lineage":"x","encrypted_data":1,"encryption_version":2}"#,
            r#"{"serial":1,"lineage":"x","encrypted_data":[1],"encryption_version":"v"}"#,
            "{\"version\":4,\"serial\":1,\"lineage\":\"x\",\"o\":\"a\tb\"}",
            "{\"version\":4,\"serial\":1,\"lineage\":\"x\",\"o\":\"caf\u{e9} \u{1F600}\"}",
            "{\"version\":4,\"serial\":1,\"lineage\":\"x\"}\u{c}",
            "\u{c}{\"version\":4,\"serial\":1,\"lineage\":\"x\"}",
            "{}",
            "",
            "   ",
            "{",
            "[]",
            "null",
        ];
        for body in table {
            agrees(body.as_bytes());
        }
        let long = |n: usize| {
            format!(
                r#"{{"version":4,"serial":1,"lineage":"{}"}}"#,
                "a".repeat(n)
            )
        };
        for n in [256, 257, MAX_CAPTURE, MAX_CAPTURE + 1, 5000] {
            agrees(long(n).as_bytes());
        }
        let deep = |n: usize| {
            format!(
                r#"{{"version":4,"serial":1,"lineage":"l","o":{}{}}}"#,
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        agrees(deep(MAX_JSON_DEPTH - 1).as_bytes());
        agrees(deep(MAX_JSON_DEPTH).as_bytes());
        let mut bad_utf8 = br#"{"version":4,"serial":1,"lineage":"l","o":""#.to_vec();
        bad_utf8.extend_from_slice(b"\xc3\x28\"}");
        agrees(&bad_utf8);
        let mut cut_utf8 = br#"{"version":4,"serial":1,"lineage":"l","o":"\xc3"#.to_vec();
        cut_utf8.truncate(cut_utf8.len());
        agrees(&cut_utf8);
    }

    proptest::proptest! {
        /// Bodies built from JSON-ish fragments: the scanner and serde always agree.
        #[test]
        fn scanner_matches_parse_state_on_generated_bodies(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "{", "}", "[", "]", ",", ":", " ", "\"", "\\", "\\u0041", "\\ud83d", "\\n",
                "\"version\"", "\"serial\"", "\"lineage\"", "\"encrypted_data\"",
                "\"encryption_version\"", "\"x\"", "\"abc-1\"", "4", "-0", "1.5", "1e3",
                "12", "true", "null", "é", "\u{1}", "\n", "\t", "\r", "\n    ",
            ]), 0..40),
            piece in 1usize..9,
        ) {
            let body = parts.concat();
            proptest::prop_assert_eq!(scan(body.as_bytes(), piece).ok(), parse_state(body.as_bytes()).ok(), "{}", body);
        }

        /// Valid states with varied fields agree too (the generator above rarely is one).
        #[test]
        fn scanner_matches_parse_state_on_states(
            serial in proptest::prop_oneof![proptest::strategy::Just("3".to_string()), "-?[0-9]{1,20}(\\.[0-9])?"],
            lineage in "[a-z0-9\\\\\" -]{0,10}",
            extra in "[a-z\"\\\\]{0,6}",
            envelope in proptest::bool::ANY,
            piece in 1usize..9,
        ) {
            let body = if envelope {
                format!(r#"{{"serial":{serial},"lineage":"{lineage}","meta":{{"{extra}":1}},"encrypted_data":"eA==","encryption_version":"v0"}}"#)
            } else {
                format!(r#"{{"version":4,"{extra}":[],"serial":{serial},"lineage":"{lineage}","resources":[{{"x":"{extra}"}}]}}"#)
            };
            proptest::prop_assert_eq!(scan(body.as_bytes(), piece).ok(), parse_state(body.as_bytes()).ok(), "{}", body);
        }
    }

    #[test]
    fn the_scanner_tells_an_envelope_and_its_key_providers_from_a_plain_state() {
        // OpenTofu's envelope as `encryption/base.go` marshals it (meta values are
        // base64 JSON), with serial and lineage in clear; pieces of every size.
        let envelope = r#"{"serial":3,"lineage":"l-1","meta":{"key_provider.pbkdf2.main":"eyJzYWx0IjoiYWJjIn0=","key_provider.pbkdf2.old":"e30="},"encrypted_data":"ZW5j","encryption_version":"v0"}"#;
        let rows: &[(&str, BodyEncryption)] = &[
            (
                envelope,
                BodyEncryption::OpenTofu {
                    key_providers: vec![
                        "key_provider.pbkdf2.main".into(),
                        "key_provider.pbkdf2.old".into(),
                    ],
                },
            ),
            (
                r#"{"serial":3,"lineage":"l","meta":{},"encrypted_data":"x","encryption_version":"v0"}"#,
                BodyEncryption::OpenTofu {
                    key_providers: vec![],
                },
            ),
            // Nested keys of meta's values are not provider names.
            (
                r#"{"meta":{"a":{"b":1}},"serial":3,"lineage":"l","encrypted_data":"x","encryption_version":"v0"}"#,
                BodyEncryption::OpenTofu {
                    key_providers: vec!["a".into()],
                },
            ),
            (
                r#"{"version":4,"serial":3,"lineage":"l","resources":[]}"#,
                BodyEncryption::Plaintext,
            ),
            // A plain state with a `meta` of its own is still plain.
            (
                r#"{"version":4,"serial":3,"lineage":"l","meta":{"k":"v"}}"#,
                BodyEncryption::Plaintext,
            ),
        ];
        for (body, want) in rows {
            for step in [1, 7, body.len()] {
                let mut s = StateScanner::with_resources([1; 32]);
                for piece in body.as_bytes().chunks(step) {
                    s.push(piece).unwrap();
                }
                assert_eq!(&s.encryption(), want, "{body} by {step}");
                s.finish().unwrap();
            }
            parse_state(body.as_bytes()).unwrap();
        }
        // Bounded: at most MAX_META_KEYS names are kept.
        let many: Vec<String> = (0..40).map(|i| format!("\"k{i}\":1")).collect();
        let body = format!(
            r#"{{"serial":1,"lineage":"l","meta":{{{}}},"encrypted_data":"x","encryption_version":"v0"}}"#,
            many.join(",")
        );
        let mut s = StateScanner::new();
        s.push(body.as_bytes()).unwrap();
        match s.encryption() {
            BodyEncryption::OpenTofu { key_providers } => {
                assert_eq!(key_providers.len(), MAX_META_KEYS)
            }
            other => panic!("{other:?}"),
        }
    }
}
