//! The on-store blob format: a plaintext header that makes the blob self-describing
//! (so the index can be rebuilt from the store alone), then the sealed state.
//!
//! Today's blobs are `SGB2`, written and read in chunks so a state of any size passes
//! through bounded memory:
//!
//! ```text
//! "SGB2" | u32 BE n | header JSON (n bytes)                      ← AD of every chunk
//! chunk 0 .. chunk k-1: AES-256-GCM(≤ 64 KiB plaintext) ‖ 16-byte tag
//! trailer JSON (m bytes) | u32 BE m | "SGT2"                     ← also AD of chunk k-1
//! ```
//! The chunks are the STREAM construction (Hoang, Reyhanitabar, Rogaway, Vizár 2015;
//! RustCrypto's `StreamBE32`): nonce = 7-byte random prefix (in the header) ‖ u32 BE
//! chunk counter ‖ last-chunk flag, so a dropped, reordered, duplicated or foreign
//! chunk, or a blob cut at a chunk boundary, fails to open. The header (scope,
//! version, chunk size, nonce prefix, created_at, actor, parent) is the associated
//! data of every chunk, so a blob moved to another scope or version fails. What is
//! only known at the end (serial, lineage, sha256 and size of the whole plaintext)
//! is the trailer, in clear for the index rebuild and authenticated as part of the
//! final chunk's associated data. Every chunk but the last holds exactly the chunk
//! size; the last holds 0..=chunk size bytes, so the size fixes the layout.
//!
//! The header names the data key generation that sealed the chunks (`key_gen`,
//! absent for generation 0, which is what every blob of earlier releases is): an
//! optional field of SGB2 rather than a new version, because the header is already the
//! AD of every chunk (so the field is authenticated), a generation-0 blob stays byte
//! for byte today's format, and an earlier release meeting a newer blob fails closed
//! (its chunks do not open under generation 0).
//!
//! `SGB1` blobs (earlier releases) still read: one AEAD message, header as AD.
//! ```text
//! "SGB1" | u32 BE header length | header JSON | nonce | ciphertext | tag
//! ```

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::crypto::off_thread::OffThreadHash;
use crate::crypto::stream::{ChunkAead, PREFIX_LEN, TAG_LEN};
use crate::crypto::{SealError, SealKey};

const MAGIC_V1: &[u8; 4] = b"SGB1";
const MAGIC_V2: &[u8; 4] = b"SGB2";
const TRAILER_MAGIC: &[u8; 4] = b"SGT2";
/// Headers are small; anything larger is not one of ours.
const MAX_HEADER: usize = 64 * 1024;
/// Trailers too (a lineage is at most 256 bytes).
const MAX_TRAILER: usize = 16 * 1024;
/// Plaintext bytes per chunk. 64 KiB is what one body read from the client carries, so
/// a write buffers about one chunk; the 16-byte tag per chunk costs 0.02%.
pub const CHUNK_SIZE: usize = 64 * 1024;

/// Who wrote a version beyond the credential (`actor`): the lock's `Who` and
/// `Operation` when written under a lock (client-supplied, bounded), and the version a
/// rollback or restore brought back. In the header, so authenticated with every chunk
/// and recovered by an index rebuild; optional fields, so SGB2 blobs of earlier
/// releases (which lack them) and earlier readers (which ignore them) keep working.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteFacts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_who: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_operation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<i64>,
    /// A move's version of its source: the workspace its resources went to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_to: Option<String>,
    /// A move's version of its destination: the workspace its new resources came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<String>,
}

/// Longest lock `Who` / `Operation` kept (characters), as the audit log keeps them.
pub const MAX_LOCK_FACT: usize = 256;

impl WriteFacts {
    /// Facts of a write under a lock whose client-supplied LockInfo held `who` and
    /// `operation`: cut to [`MAX_LOCK_FACT`] characters, control characters dropped,
    /// empty ones left out.
    pub fn under_lock(who: &str, operation: &str) -> WriteFacts {
        let clean = |text: &str| {
            let kept: String = text
                .chars()
                .filter(|c| !c.is_control())
                .take(MAX_LOCK_FACT)
                .collect();
            (!kept.is_empty()).then_some(kept)
        };
        WriteFacts {
            lock_who: clean(who),
            lock_operation: clean(operation),
            ..WriteFacts::default()
        }
    }
}

/// What the index knows about a blob (for SGB2: header and trailer together).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobHeader {
    pub scope: String,
    pub version: i64,
    pub serial: Option<i64>,
    pub lineage: Option<String>,
    pub sha256: String,
    pub size: i64,
    pub created_at: String,
    pub actor: String,
    /// Blob key of the committed version this one was written on top of (absent for
    /// the first version, after a tombstone, and in blobs of older releases). The index
    /// rebuild follows these links down from the newest version to tell a committed
    /// blob from an orphan of a failed write without trusting wall clocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(flatten)]
    pub facts: WriteFacts,
    /// The data key generation that sealed it (SGB2: its stream header's; SGB1: 0).
    /// Never serialized here: the stream header carries it, and an SGB1 header is
    /// always generation 0.
    #[serde(skip)]
    pub key_gen: u32,
}

/// Who a blob is, known before its first byte is written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobIdentity {
    pub scope: String,
    pub version: i64,
    pub created_at: String,
    pub actor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(flatten)]
    pub facts: WriteFacts,
}

#[derive(Serialize, Deserialize)]
struct StreamHeader {
    #[serde(flatten)]
    id: BlobIdentity,
    chunk_size: u32,
    nonce_prefix: String,
    /// The data key generation that sealed the chunks (`crypto` keyring). Absent means
    /// 0, so blobs of earlier releases read as generation 0 and a generation-0 blob is
    /// byte for byte what they wrote. Part of the header, so authenticated with every
    /// chunk: changed, the chunks are opened under another key and with another AD.
    #[serde(default, skip_serializing_if = "is_zero")]
    key_gen: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What is known only once the whole body went through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trailer {
    pub serial: Option<i64>,
    pub lineage: Option<String>,
    pub sha256: String,
    pub size: i64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("not a stategate blob (bad magic or header)")]
    NotABlob,
    #[error("blob belongs to {found}, expected {expected}")]
    WrongIdentity { expected: String, found: String },
    #[error("content hash does not match the version index")]
    HashMismatch,
    #[error("blob is truncated or longer than its index entry says")]
    BadLength,
    #[error(transparent)]
    Seal(#[from] SealError),
}

/// Seals a body chunk by chunk as it arrives. Holds at most one chunk of plaintext.
pub struct Sealer {
    aead: ChunkAead,
    /// The data key generation the chunks are sealed under (named in the header).
    key_gen: u32,
    header: Vec<u8>,
    pending: Vec<u8>,
    sha: Sha,
    size: u64,
}

/// The sealer's body hash: pending (a large body's continues on a worker thread,
/// `crypto::off_thread`), or finished, once [`Sealer::digest`] asked for it.
enum Sha {
    Hashing(Box<OffThreadHash<sha2::Sha256>>),
    Done(String),
}

impl Sealer {
    /// A sealer and the blob's first bytes (magic and header).
    pub fn new(key: &SealKey, id: &BlobIdentity) -> Result<(Sealer, Bytes), SealError> {
        let mut prefix = [0u8; PREFIX_LEN];
        getrandom::getrandom(&mut prefix).map_err(|_| SealError::Random)?;
        let (key_gen, aead) = key.write_stream(prefix)?;
        let header = encode_header(&StreamHeader {
            id: id.clone(),
            chunk_size: CHUNK_SIZE as u32,
            nonce_prefix: hex::encode(prefix),
            key_gen,
        });
        let sealer = Sealer {
            aead,
            key_gen,
            header: header.clone(),
            pending: Vec::with_capacity(2 * CHUNK_SIZE),
            sha: Sha::Hashing(Box::default()),
            size: 0,
        };
        Ok((sealer, Bytes::from(header)))
    }

    /// The data key generation this blob is sealed under: what the index records
    /// beside the version (`versions.key_gen`), so listings need not read the header.
    pub fn key_generation(&self) -> u32 {
        self.key_gen
    }

    /// Takes the next piece of plaintext; returns the chunks it completed, sealed
    /// (empty while a chunk is still filling). A full chunk is kept until more data
    /// shows it is not the last.
    pub fn push(&mut self, data: &[u8]) -> Result<Bytes, SealError> {
        if let Sha::Hashing(sha) = &mut self.sha {
            sha.update_slice(data);
        }
        self.seal(data)
    }

    /// As [`Self::push`], for a shared piece (a large body's is hashed on a worker).
    pub fn push_shared(&mut self, data: &Bytes) -> Result<Bytes, SealError> {
        if let Sha::Hashing(sha) = &mut self.sha {
            sha.update(data);
        }
        self.seal(data)
    }

    fn seal(&mut self, data: &[u8]) -> Result<Bytes, SealError> {
        self.size += data.len() as u64;
        self.pending.extend_from_slice(data);
        let full = (self.pending.len().saturating_sub(1)) / CHUNK_SIZE;
        if full == 0 {
            return Ok(Bytes::new());
        }
        // Each chunk is copied once, into its place in the output, and sealed there.
        let mut out = Vec::with_capacity(full * (CHUNK_SIZE + TAG_LEN));
        for i in 0..full {
            let at = out.len();
            out.extend_from_slice(&self.pending[i * CHUNK_SIZE..(i + 1) * CHUNK_SIZE]);
            let tag = self.aead.seal_next(&self.header, &mut out[at..])?;
            out.extend_from_slice(&tag);
        }
        self.pending.drain(..full * CHUNK_SIZE);
        Ok(Bytes::from(out))
    }

    /// The sha256 (hex) and size of the body: call it once everything was pushed.
    pub fn digest(&mut self) -> Result<(String, u64), SealError> {
        let sha = match std::mem::replace(&mut self.sha, Sha::Done(String::new())) {
            Sha::Hashing(sha) => hex::encode(sha.finish()?),
            Sha::Done(sha) => sha,
        };
        self.sha = Sha::Done(sha.clone());
        Ok((sha, self.size))
    }

    /// Seals the last chunk with the trailer bound in; returns the blob's remaining
    /// bytes and the trailer.
    pub fn finish(
        mut self,
        serial: Option<i64>,
        lineage: Option<String>,
    ) -> Result<(Bytes, Trailer), SealError> {
        let (sha256, _) = self.digest()?;
        let trailer = Trailer {
            serial,
            lineage,
            sha256,
            size: self.size as i64,
        };
        let trailer_json = serde_json::to_vec(&trailer).expect("trailer serializes");
        let mut ad = self.header;
        ad.extend_from_slice(&trailer_json);
        let mut chunk = self.pending;
        self.aead.seal_last(&ad, &mut chunk)?;
        chunk.extend_from_slice(&trailer_json);
        chunk.extend_from_slice(&(trailer_json.len() as u32).to_be_bytes());
        chunk.extend_from_slice(TRAILER_MAGIC);
        Ok((Bytes::from(chunk), trailer))
    }
}

fn encode_header(header: &StreamHeader) -> Vec<u8> {
    let json = serde_json::to_vec(header).expect("header serializes");
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(MAGIC_V2);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out
}

/// Plaintext length of a chunked blob's chunk region for a body of `size` bytes.
fn sealed_len(size: u64, chunk: u64) -> u64 {
    let chunks = size.div_ceil(chunk).max(1);
    size + chunks * TAG_LEN as u64
}

/// Opens a blob as its bytes arrive, checking it is exactly the version the index
/// says it is (`scope`, `version`, `size`, `sha256`). Plaintext comes out chunk by
/// chunk as each is verified, except the last, which [`Opener::finish`] returns only
/// once the whole-body hash matched. SGB1 blobs are collected and opened whole.
pub struct Opener {
    key: SealKey,
    scope: String,
    version: i64,
    size: u64,
    sha256: Option<String>,
    buf: Vec<u8>,
    state: OpenState,
    sha: sha2::Sha256,
}

enum OpenState {
    /// Waiting for the magic and header.
    Start,
    /// SGB1: the whole blob is collected.
    Whole,
    Chunks {
        aead: Box<ChunkAead>,
        header: Vec<u8>,
        chunk: usize,
        /// Sealed bytes of the non-final chunks not yet opened.
        body_left: u64,
        /// Sealed length of the final chunk.
        last_len: usize,
    },
}

impl Opener {
    pub fn new(
        key: &SealKey,
        scope: &str,
        version: i64,
        size: u64,
        sha256: Option<String>,
    ) -> Opener {
        Opener {
            key: key.clone(),
            scope: scope.to_string(),
            version,
            size,
            sha256,
            buf: Vec::new(),
            state: OpenState::Start,
            sha: sha2::Sha256::new(),
        }
    }

    /// Feeds the blob's next bytes; returns the plaintext chunks verified so far.
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<Bytes>, FormatError> {
        self.buf.extend_from_slice(data);
        if let OpenState::Start = self.state {
            if !self.start()? {
                return Ok(Vec::new());
            }
        }
        let OpenState::Chunks {
            aead,
            header,
            chunk,
            body_left,
            last_len,
        } = &mut self.state
        else {
            return Ok(Vec::new()); // SGB1: opened whole at the end
        };
        let sealed_chunk = *chunk + TAG_LEN;
        let mut out = Vec::new();
        let mut at = 0;
        while *body_left > 0 && self.buf.len() - at >= sealed_chunk {
            let mut piece = self.buf[at..at + sealed_chunk].to_vec();
            aead.open_next(header, &mut piece)?;
            self.sha.update(&piece);
            out.push(Bytes::from(piece));
            at += sealed_chunk;
            *body_left -= sealed_chunk as u64;
        }
        self.buf.drain(..at);
        if *body_left == 0 && self.buf.len() > *last_len + 8 + MAX_TRAILER {
            return Err(FormatError::BadLength);
        }
        Ok(out)
    }

    /// Parses the magic and header once they are all there; false while they are not.
    fn start(&mut self) -> Result<bool, FormatError> {
        if self.buf.len() < 8 {
            return Ok(false);
        }
        let magic = &self.buf[..4];
        if magic == MAGIC_V1 {
            self.state = OpenState::Whole;
            return Ok(true);
        }
        if magic != MAGIC_V2 {
            return Err(FormatError::NotABlob);
        }
        let len = header_len(&self.buf)?;
        if self.buf.len() < 8 + len {
            return Ok(false);
        }
        let parsed: StreamHeader =
            serde_json::from_slice(&self.buf[8..8 + len]).map_err(|_| FormatError::NotABlob)?;
        check_identity(
            &parsed.id.scope,
            parsed.id.version,
            &self.scope,
            self.version,
        )?;
        let chunk = parsed.chunk_size as usize;
        let mut prefix = [0u8; PREFIX_LEN];
        hex::decode_to_slice(&parsed.nonce_prefix, &mut prefix)
            .map_err(|_| FormatError::NotABlob)?;
        if chunk == 0 || chunk > 16 << 20 {
            return Err(FormatError::NotABlob);
        }
        let aead = self.key.stream_at(parsed.key_gen, prefix)?;
        let sealed = sealed_len(self.size, chunk as u64);
        let last_plain = self.size - (self.size.div_ceil(chunk as u64).max(1) - 1) * chunk as u64;
        let last_len = last_plain as usize + TAG_LEN;
        self.state = OpenState::Chunks {
            aead: Box::new(aead),
            header: self.buf[..8 + len].to_vec(),
            chunk,
            body_left: sealed - last_len as u64,
            last_len,
        };
        self.buf.drain(..8 + len);
        Ok(true)
    }

    /// The blob ended: opens the final chunk with the trailer bound in, checks the
    /// trailer and the whole-body hash, and returns the final plaintext.
    pub fn finish(mut self) -> Result<Bytes, FormatError> {
        let state = std::mem::replace(&mut self.state, OpenState::Start);
        let (aead, mut ad, last_len) = match state {
            OpenState::Start => return Err(FormatError::NotABlob),
            OpenState::Whole => {
                let plaintext = decode_v1(&self, &self.buf)?;
                return Ok(Bytes::from(plaintext));
            }
            OpenState::Chunks {
                aead,
                header,
                body_left,
                last_len,
                ..
            } => {
                if body_left > 0 {
                    return Err(FormatError::BadLength);
                }
                (aead, header, last_len)
            }
        };
        let trailer_json = split_trailer(&self.buf)?;
        if self.buf.len() != last_len + trailer_json.len() + 8 {
            return Err(FormatError::BadLength);
        }
        let trailer: Trailer =
            serde_json::from_slice(trailer_json).map_err(|_| FormatError::NotABlob)?;
        if trailer.size != self.size as i64 {
            return Err(FormatError::BadLength);
        }
        ad.extend_from_slice(trailer_json);
        let mut last = self.buf[..last_len].to_vec();
        aead.open_last(&ad, &mut last)?;
        self.sha.update(&last);
        let digest = hex::encode(self.sha.finalize_reset());
        if digest != trailer.sha256 || self.sha256.as_ref().is_some_and(|s| *s != digest) {
            return Err(FormatError::HashMismatch);
        }
        Ok(Bytes::from(last))
    }
}

fn header_len(blob: &[u8]) -> Result<usize, FormatError> {
    let len = u32::from_be_bytes(blob[4..8].try_into().expect("4 bytes")) as usize;
    if len > MAX_HEADER {
        return Err(FormatError::NotABlob);
    }
    Ok(len)
}

/// The trailer JSON at the end of `tail` (which ends where the blob ends).
fn split_trailer(tail: &[u8]) -> Result<&[u8], FormatError> {
    let n = tail.len();
    if n < 8 || &tail[n - 4..] != TRAILER_MAGIC {
        return Err(FormatError::BadLength);
    }
    let len = u32::from_be_bytes(tail[n - 8..n - 4].try_into().expect("4 bytes")) as usize;
    if len > MAX_TRAILER || len + 8 > n {
        return Err(FormatError::BadLength);
    }
    Ok(&tail[n - 8 - len..n - 8])
}

fn check_identity(
    scope: &str,
    version: i64,
    want_scope: &str,
    want_version: i64,
) -> Result<(), FormatError> {
    if scope != want_scope || version != want_version {
        return Err(FormatError::WrongIdentity {
            expected: format!("{want_scope} v{want_version}"),
            found: format!("{scope} v{version}"),
        });
    }
    Ok(())
}

fn decode_v1(opener: &Opener, blob: &[u8]) -> Result<Vec<u8>, FormatError> {
    let (header, body_at) = read_header_v1(blob)?;
    check_identity(&header.scope, header.version, &opener.scope, opener.version)?;
    let key_cipher = &opener.key.cipher_at(0)?;
    let sealed = &blob[body_at..];
    if sealed.len() < 12 + TAG_LEN {
        return Err(SealError::Truncated.into());
    }
    use aes_gcm::aead::{Aead, Payload};
    let (nonce, body) = sealed.split_at(12);
    let plaintext = key_cipher
        .decrypt(
            aes_gcm::Nonce::from_slice(nonce),
            Payload {
                msg: body,
                aad: &blob[..body_at],
            },
        )
        .map_err(|_| SealError::Authentication)?;
    if let Some(expected) = &opener.sha256 {
        if hex::encode(sha2_digest(&plaintext)) != *expected {
            return Err(FormatError::HashMismatch);
        }
    }
    Ok(plaintext)
}

fn read_header_v1(blob: &[u8]) -> Result<(BlobHeader, usize), FormatError> {
    let len = header_len(blob)?;
    if blob.len() < 8 + len {
        return Err(FormatError::NotABlob);
    }
    let header = serde_json::from_slice(&blob[8..8 + len]).map_err(|_| FormatError::NotABlob)?;
    Ok((header, 8 + len))
}

/// Reads a whole blob's identity without decrypting (for index rebuilds): the header,
/// and for SGB2 the trailer. Nothing here is trusted until [`decode`] opened the blob.
pub fn read_header(blob: &[u8]) -> Result<BlobHeader, FormatError> {
    if blob.len() < 8 {
        return Err(FormatError::NotABlob);
    }
    if &blob[..4] == MAGIC_V1 {
        return Ok(read_header_v1(blob)?.0);
    }
    if &blob[..4] != MAGIC_V2 {
        return Err(FormatError::NotABlob);
    }
    let len = header_len(blob)?;
    if blob.len() < 8 + len {
        return Err(FormatError::NotABlob);
    }
    let header: StreamHeader =
        serde_json::from_slice(&blob[8..8 + len]).map_err(|_| FormatError::NotABlob)?;
    let trailer: Trailer = serde_json::from_slice(split_trailer(&blob[8 + len..])?)
        .map_err(|_| FormatError::NotABlob)?;
    Ok(BlobHeader {
        scope: header.id.scope,
        version: header.id.version,
        serial: trailer.serial,
        lineage: trailer.lineage,
        sha256: trailer.sha256,
        size: trailer.size,
        created_at: header.id.created_at,
        actor: header.id.actor,
        parent: header.id.parent,
        facts: header.id.facts,
        key_gen: header.key_gen,
    })
}

/// The data key generation a blob's header names, from its first bytes (`None`: not
/// all of the header is there yet). SGB1 blobs are generation 0. Unauthenticated: for
/// counting (`stategate key status`); opening the blob is what checks it.
pub fn key_generation(prefix: &[u8]) -> Result<Option<u32>, FormatError> {
    if prefix.len() < 8 {
        return Ok(None);
    }
    if &prefix[..4] == MAGIC_V1 {
        return Ok(Some(0));
    }
    if &prefix[..4] != MAGIC_V2 {
        return Err(FormatError::NotABlob);
    }
    Ok(v2_header(prefix)?.map(|h| h.key_gen))
}

/// The identity in an SGB2 blob's header, from its first bytes (`None`: not all of
/// the header is there yet). Unauthenticated until the blob is opened; the reseal
/// copies it into the blob it writes, so nothing but the key generation changes.
pub fn stream_identity(prefix: &[u8]) -> Result<Option<BlobIdentity>, FormatError> {
    if prefix.len() < 8 {
        return Ok(None);
    }
    if &prefix[..4] == MAGIC_V1 {
        let Ok((header, _)) = read_header_v1(prefix) else {
            return Ok(None);
        };
        return Ok(Some(BlobIdentity {
            scope: header.scope,
            version: header.version,
            created_at: header.created_at,
            actor: header.actor,
            parent: header.parent,
            facts: header.facts,
        }));
    }
    if &prefix[..4] != MAGIC_V2 {
        return Err(FormatError::NotABlob);
    }
    Ok(v2_header(prefix)?.map(|h| h.id))
}

/// The SGB2 header at the start of `prefix`, whose magic the caller checked (`None`:
/// not all of the header is there yet).
fn v2_header(prefix: &[u8]) -> Result<Option<StreamHeader>, FormatError> {
    let len = header_len(prefix)?;
    if prefix.len() < 8 + len {
        return Ok(None);
    }
    serde_json::from_slice(&prefix[8..8 + len])
        .map(Some)
        .map_err(|_| FormatError::NotABlob)
}

/// Opens a whole blob, checking it is exactly the version the index says it is.
pub fn decode(
    key: &SealKey,
    blob: &[u8],
    scope: &str,
    version: i64,
    sha256: Option<&str>,
) -> Result<Vec<u8>, FormatError> {
    let claimed = read_header(blob)?;
    let mut opener = Opener::new(
        key,
        scope,
        version,
        claimed.size.max(0) as u64,
        sha256.map(str::to_string),
    );
    let mut out = Vec::with_capacity(claimed.size.clamp(0, 1 << 30) as usize);
    for piece in opener.push(blob)? {
        out.extend_from_slice(&piece);
    }
    out.extend_from_slice(&opener.finish()?);
    Ok(out)
}

/// Seals a whole body as one SGB2 blob with `header`'s identity, serial and lineage
/// (its sha256 and size are computed from `plaintext`). For tools and tests.
pub fn encode(key: &SealKey, header: &BlobHeader, plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
    let id = BlobIdentity {
        scope: header.scope.clone(),
        version: header.version,
        created_at: header.created_at.clone(),
        actor: header.actor.clone(),
        parent: header.parent.clone(),
        facts: header.facts.clone(),
    };
    let (mut sealer, head) = Sealer::new(key, &id)?;
    let mut out = head.to_vec();
    out.extend_from_slice(&sealer.push(plaintext)?);
    let (tail, _) = sealer.finish(header.serial, header.lineage.clone())?;
    out.extend_from_slice(&tail);
    Ok(out)
}

pub fn sha2_digest(data: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::RootKey;

    /// The SGB1 encoder of earlier releases, kept to prove their blobs still read.
    fn encode_v1(key: &SealKey, header: &BlobHeader, plaintext: &[u8]) -> Vec<u8> {
        let header_json = serde_json::to_vec(header).unwrap();
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC_V1);
        out.extend_from_slice(&(header_json.len() as u32).to_be_bytes());
        out.extend_from_slice(&header_json);
        let sealed = key.seal(&out, plaintext).unwrap();
        out.extend_from_slice(&sealed);
        out
    }

    fn id(scope: &str, version: i64) -> BlobIdentity {
        BlobIdentity {
            scope: scope.into(),
            version,
            created_at: "2026-01-01T00:00:00Z".into(),
            actor: "test".into(),
            parent: Some("states/x/1.blob".into()),
            facts: WriteFacts::default(),
        }
    }

    fn body(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn key() -> SealKey {
        RootKey::from_bytes([1; 32]).blob_key("tf/a")
    }

    /// Seals `plain` fed in `piece`-byte writes.
    fn seal(plain: &[u8], piece: usize) -> (Vec<u8>, Trailer) {
        let (mut sealer, header) = Sealer::new(&key(), &id("tf/a", 2)).unwrap();
        let mut out = header.to_vec();
        for part in plain.chunks(piece.max(1)) {
            out.extend_from_slice(&sealer.push(part).unwrap());
        }
        let (tail, trailer) = sealer.finish(Some(3), Some("l".into())).unwrap();
        out.extend_from_slice(&tail);
        (out, trailer)
    }

    /// Opens `blob` fed in `piece`-byte reads, as the index row for tf/a v2 says.
    fn open(blob: &[u8], size: usize, piece: usize) -> Result<Vec<u8>, FormatError> {
        let sha = hex::encode(sha2_digest(&body(size)));
        let mut opener = Opener::new(&key(), "tf/a", 2, size as u64, Some(sha));
        let mut out = Vec::new();
        for part in blob.chunks(piece.max(1)) {
            for p in opener.push(part)? {
                out.extend_from_slice(&p);
            }
        }
        out.extend_from_slice(&opener.finish()?);
        Ok(out)
    }

    const C: usize = CHUNK_SIZE;

    #[test]
    fn round_trip_across_chunk_boundaries() {
        for size in [0, 1, C - 1, C, C + 1, 2 * C, 3 * C + 5] {
            let plain = body(size);
            for (write, read) in [(size + 1, size + 100), (7_001, 65_537), (C, 1_000)] {
                let (blob, trailer) = seal(&plain, write);
                assert_eq!(trailer.size, size as i64);
                assert_eq!(blob.len() as u64, {
                    let header = read_header(&blob).unwrap();
                    assert_eq!((header.serial, header.size), (Some(3), size as i64));
                    blob.len() as u64
                });
                assert_eq!(
                    open(&blob, size, read).unwrap(),
                    plain,
                    "{size} {write} {read}"
                );
                let whole = decode(&key(), &blob, "tf/a", 2, Some(&trailer.sha256)).unwrap();
                assert_eq!(whole, plain);
            }
        }
    }

    /// Byte offsets of the sealed chunks of a blob made by `seal`.
    fn chunk_at(blob: &[u8], i: usize) -> std::ops::Range<usize> {
        let start = 8 + header_len(blob).unwrap() + i * (C + TAG_LEN);
        start..start + C + TAG_LEN
    }

    #[test]
    fn tampering_is_detected() {
        let size = 3 * C + 10;
        let (blob, _) = seal(&body(size), C);
        let (other, _) = seal(&body(size), C); // same key, scope and version, other nonces
        let fails = |name: &str, bad: Vec<u8>| {
            assert!(open(&bad, size, 10_000).is_err(), "{name}");
            assert!(decode(&key(), &bad, "tf/a", 2, None).is_err(), "{name}");
        };
        let (c0, c1, c3) = (chunk_at(&blob, 0), chunk_at(&blob, 1), chunk_at(&blob, 3));
        // Reordered chunks.
        let mut swapped = blob.clone();
        swapped[c0.clone()].copy_from_slice(&blob[c1.clone()]);
        swapped[c1.clone()].copy_from_slice(&blob[c0.clone()]);
        fails("reorder", swapped);
        // A chunk spliced in from another blob of the same version.
        let mut spliced = blob.clone();
        spliced[c1.clone()].copy_from_slice(&other[c1.clone()]);
        fails("splice", spliced);
        // A flipped bit in the middle.
        let mut flipped = blob.clone();
        flipped[c1.start + 100] ^= 1;
        fails("bit flip", flipped);
        // Truncated at a chunk boundary, with the trailer kept: the row's size no
        // longer fits, and a non-final chunk cannot pass as the last one.
        let mut cut = blob[..c3.start].to_vec();
        cut.extend_from_slice(&blob[c3.start + 10 + TAG_LEN..]);
        fails("cut at boundary", cut.clone());
        assert!(
            open(&cut, 3 * C, 10_000).is_err(),
            "a shorter blob does not pass as a shorter state"
        );
        fails("cut in the trailer", blob[..blob.len() - 3].to_vec());
        fails("cut mid-chunk", blob[..c1.start + 5].to_vec());
        fails("extra bytes", [blob.clone(), b"x".to_vec()].concat());
        // A trailer edited to claim another serial (same length) fails the last chunk.
        let at = blob.len() - 8 - read_trailer_len(&blob);
        let tail = String::from_utf8(blob[at..].to_vec()).unwrap();
        let mut forged = blob[..at].to_vec();
        forged.extend_from_slice(tail.replace("\"serial\":3", "\"serial\":4").as_bytes());
        assert_eq!(read_header(&forged).unwrap().serial, Some(4));
        fails("trailer tamper", forged);
    }

    fn read_trailer_len(blob: &[u8]) -> usize {
        split_trailer(blob).unwrap().len()
    }

    #[test]
    fn identity_is_bound() {
        let (blob, _) = seal(&body(C + 3), 1_000);
        let err = |scope: &str, version: i64| {
            let mut opener = Opener::new(&key(), scope, version, (C + 3) as u64, None);
            opener.push(&blob).err()
        };
        assert!(matches!(
            err("tf/b", 2),
            Some(FormatError::WrongIdentity { .. })
        ));
        assert!(matches!(
            err("tf/a", 3),
            Some(FormatError::WrongIdentity { .. })
        ));
        // A header edited to claim another version fails authentication.
        let text = String::from_utf8(blob[8..64].to_vec()).unwrap();
        let mut forged = blob.clone();
        forged[8..64].copy_from_slice(text.replace("\"version\":2", "\"version\":7").as_bytes());
        let mut opener = Opener::new(&key(), "tf/a", 7, (C + 3) as u64, None);
        assert_eq!(
            opener.push(&forged).err(),
            Some(FormatError::Seal(SealError::Authentication))
        );
        // Another scope's key cannot open it.
        let wrong = RootKey::from_bytes([1; 32]).blob_key("tf/b");
        assert!(decode(&wrong, &blob, "tf/a", 2, None).is_err());
        // The index's hash must match.
        assert_eq!(
            decode(&key(), &blob, "tf/a", 2, Some("00")),
            Err(FormatError::HashMismatch)
        );
    }

    /// Writer facts ride in the authenticated header: they come back from a blob, a
    /// blob without them (an earlier release's) reads with none, a reader that does
    /// not know them still opens the blob, and changing them breaks it.
    #[test]
    fn writer_facts_are_authenticated_header_fields_old_blobs_lack() {
        let plain = body(70_000);
        let mut header = BlobHeader {
            parent: None,
            scope: "tf/a".into(),
            version: 2,
            serial: Some(3),
            lineage: Some("l".into()),
            sha256: hex::encode(sha2_digest(&plain)),
            size: plain.len() as i64,
            created_at: "2026-01-01T00:00:00Z".into(),
            actor: "token:ci".into(),
            facts: WriteFacts {
                lock_who: Some("ci@runner-3".into()),
                lock_operation: Some("OperationTypeApply".into()),
                restored_from: Some(1),
                moved_to: Some("dev".into()),
                moved_from: None,
            },
            key_gen: 0,
        };
        let blob = encode(&key(), &header, &plain).unwrap();
        assert_eq!(read_header(&blob).unwrap(), header);
        assert_eq!(decode(&key(), &blob, "tf/a", 2, None).unwrap(), plain);
        // An earlier release's reader: the same header without the new fields.
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct EarlierIdentity {
            scope: String,
            version: i64,
            created_at: String,
            actor: String,
            chunk_size: u32,
            nonce_prefix: String,
        }
        let len = header_len(&blob).unwrap();
        let earlier: EarlierIdentity = serde_json::from_slice(&blob[8..8 + len]).unwrap();
        assert_eq!(earlier.actor, "token:ci");
        // Tampering with a fact (same length) breaks authentication.
        let text = String::from_utf8_lossy(&blob[8..8 + len]).into_owned();
        let at = 8 + text.find("runner-3").unwrap() + 7;
        let mut forged = blob.clone();
        forged[at] = b'4';
        assert!(decode(&key(), &forged, "tf/a", 2, None).is_err());
        // A blob written without facts reads with none.
        header.facts = WriteFacts::default();
        let plain_blob = encode(&key(), &header, &plain).unwrap();
        assert_eq!(
            read_header(&plain_blob).unwrap().facts,
            WriteFacts::default()
        );
        assert!(!String::from_utf8_lossy(&plain_blob[..200]).contains("lock_who"));
        // Lock facts are bounded and cleaned.
        let long = WriteFacts::under_lock(&"w".repeat(1000), "\u{7}");
        assert_eq!(long.lock_who.map(|w| w.len()), Some(MAX_LOCK_FACT));
        assert_eq!(long.lock_operation, None);
    }

    #[test]
    fn sgb1_blobs_of_earlier_releases_still_read() {
        let plain = body(1000);
        let header = BlobHeader {
            parent: None,
            scope: "tf/a".into(),
            version: 2,
            serial: Some(3),
            lineage: Some("l".into()),
            sha256: hex::encode(sha2_digest(&plain)),
            size: plain.len() as i64,
            created_at: "2026-01-01T00:00:00Z".into(),
            actor: "test".into(),
            facts: WriteFacts::default(),
            key_gen: 0,
        };
        let blob = encode_v1(&key(), &header, &plain);
        assert_eq!(read_header(&blob).unwrap(), header);
        assert_eq!(open(&blob, 1000, 7).unwrap(), plain);
        assert_eq!(
            decode(&key(), &blob, "tf/a", 2, Some(&header.sha256)).unwrap(),
            plain
        );
        assert!(matches!(
            decode(&key(), &blob, "tf/a", 3, None),
            Err(FormatError::WrongIdentity { .. })
        ));
        assert_eq!(
            decode(&key(), &blob, "tf/a", 2, Some("00")),
            Err(FormatError::HashMismatch)
        );
    }

    #[test]
    fn garbage_is_rejected() {
        for bad in [
            &b""[..],
            b"SGB1",
            b"SGB2",
            b"SGB1\xff\xff\xff\xff",
            b"SGB2\xff\xff\xff\xff",
            b"SGB2\0\0\0\x02{}",
            b"XXXX\0\0\0\x02{}",
        ] {
            assert!(decode(&key(), bad, "s", 1, None).is_err());
        }
    }
    /// Replaces the header JSON of an SGB2 blob (fixing its length prefix).
    fn with_header(blob: &[u8], edit: impl Fn(&str) -> String) -> Vec<u8> {
        let len = header_len(blob).unwrap();
        let json = std::str::from_utf8(&blob[8..8 + len]).unwrap();
        let edited = edit(json);
        let mut out = MAGIC_V2.to_vec();
        out.extend_from_slice(&(edited.len() as u32).to_be_bytes());
        out.extend_from_slice(edited.as_bytes());
        out.extend_from_slice(&blob[8 + len..]);
        out
    }

    #[test]
    fn the_key_generation_is_named_in_the_authenticated_header() {
        use crate::crypto::{Generation, Purpose, RingView};
        let plain = body(C + 10);
        let (old, _) = seal(&plain, 4096);
        // Generation 0 writes exactly what earlier releases wrote: no field.
        assert!(!String::from_utf8_lossy(&old[..200]).contains("key_gen"));
        assert_eq!(key_generation(&old).unwrap(), Some(0));
        assert_eq!(key_generation(&old[..10]).unwrap(), None);

        let root = RootKey::from_bytes([1; 32]);
        root.install(RingView {
            generations: vec![
                Generation::new(Purpose::Data, 1, [2; 32]),
                Generation::new(Purpose::Data, 2, [3; 32]),
            ],
            retired: vec![],
        });
        let k = root.blob_key("tf/a");
        let (mut sealer, head) = Sealer::new(&k, &id("tf/a", 2)).unwrap();
        // What the index records with the version is what the header names, and what
        // a rebuild reads back from the whole blob.
        assert_eq!(sealer.key_generation(), 2);
        let mut new = head.to_vec();
        new.extend_from_slice(&sealer.push(&plain).unwrap());
        new.extend_from_slice(&sealer.finish(Some(3), Some("l".into())).unwrap().0);
        assert_eq!(key_generation(&new).unwrap(), Some(2));
        assert_eq!(read_header(&new).unwrap().key_gen, 2);
        assert_eq!(read_header(&old).unwrap().key_gen, 0);
        let sha = hex::encode(sha2_digest(&plain));
        let open_with = |k: &SealKey, blob: &[u8]| decode(k, blob, "tf/a", 2, Some(&sha));
        assert_eq!(open_with(&k, &new).unwrap(), plain);
        // The old blob opens under the rotated ring, by the generation it names.
        assert_eq!(open_with(&k, &old).unwrap(), plain);
        // A ring without generation 2 names it; a tampered generation does not open.
        assert_eq!(
            open_with(&key(), &new),
            Err(FormatError::Seal(SealError::UnknownGeneration(2)))
        );
        for edit in [
            |j: &str| j.replace("\"key_gen\":2", "\"key_gen\":1"),
            |j: &str| j.replace(",\"key_gen\":2", ""),
            |j: &str| j.replace("\"key_gen\":2", "\"key_gen\":02"),
        ] {
            let tampered = with_header(&new, edit);
            assert_ne!(tampered, new);
            assert!(open_with(&k, &tampered).is_err());
        }
        let upgraded = with_header(&old, |j| j.replace('}', ",\"key_gen\":2}"));
        assert!(open_with(&k, &upgraded).is_err());
    }
}
