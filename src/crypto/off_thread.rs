//! A digest of a streamed body that moves to a thread of its own once the body is
//! large. A write hashes its body twice — the `Content-MD5` check and the version's
//! SHA-256 — and both are on the write's path before the reply, beside the scan and
//! the seal on the request's thread. Past [`INLINE_BYTES`] each hasher continues on a
//! worker that hashes the pieces (shared, not copied) while the request's thread scans
//! and seals them, so on more than one core a large write waits for the longest of
//! them, not their sum. Small bodies stay on the request's thread, where a thread
//! would cost more than it saves.

use std::sync::mpsc;

use bytes::Bytes;
use sha2::Digest;

/// Bodies up to this size are hashed on the request's thread.
pub const INLINE_BYTES: u64 = 1024 * 1024;
/// Pieces queued for the worker; a request's thread that gets this far ahead waits.
const QUEUED_PIECES: usize = 16;

/// The worker stopped before it answered (it cannot fail; if it did, the write is
/// refused rather than stored under a digest nobody computed).
#[derive(Debug)]
pub struct WorkerGone;

pub struct OffThreadHash<D: Digest> {
    state: State<D>,
}

enum State<D: Digest> {
    Inline {
        hasher: D,
        seen: u64,
    },
    Worker {
        pieces: mpsc::SyncSender<Bytes>,
        digest: mpsc::Receiver<sha2::digest::Output<D>>,
    },
}

impl<D> Default for OffThreadHash<D>
where
    D: Digest + Default + Clone + Send + 'static,
{
    fn default() -> Self {
        OffThreadHash {
            state: State::Inline {
                hasher: D::default(),
                seen: 0,
            },
        }
    }
}

impl<D> OffThreadHash<D>
where
    D: Digest + Default + Clone + Send + 'static,
{
    pub fn update(&mut self, piece: &Bytes) {
        self.update_with(piece, || piece.clone());
    }

    /// As [`Self::update`], for bytes that are not shared (copied only when a worker
    /// hashes them).
    pub fn update_slice(&mut self, piece: &[u8]) {
        self.update_with(piece, || Bytes::copy_from_slice(piece));
    }

    fn update_with(&mut self, piece: &[u8], shared: impl FnOnce() -> Bytes) {
        match &mut self.state {
            State::Inline { hasher, seen } => {
                hasher.update(piece);
                *seen += piece.len() as u64;
                if *seen > INLINE_BYTES {
                    let hasher = std::mem::take(hasher);
                    self.state = to_worker(hasher);
                }
            }
            State::Worker { pieces, .. } => {
                // A worker that is gone sends no digest, and `finish` says so.
                let _ = pieces.send(shared());
            }
        }
    }

    /// The body's digest, once every piece was passed to [`Self::update`]. A worker
    /// still hashing what is queued is waited for on this thread.
    pub fn finish(self) -> Result<sha2::digest::Output<D>, WorkerGone> {
        match self.state {
            State::Inline { hasher, .. } => Ok(hasher.finalize()),
            State::Worker { pieces, digest } => {
                drop(pieces); // the worker hashes what is queued, then answers
                digest.recv().map_err(|_| WorkerGone)
            }
        }
    }
}

/// `hasher` continued on a thread of its own; where none can be started, it stays
/// inline.
fn to_worker<D>(hasher: D) -> State<D>
where
    D: Digest + Default + Clone + Send + 'static,
{
    let (pieces, queue) = mpsc::sync_channel::<Bytes>(QUEUED_PIECES);
    let (answer, digest) = mpsc::sync_channel(1);
    let kept = hasher.clone();
    let spawned = std::thread::Builder::new()
        .name("body-hash".into())
        .spawn(move || {
            let mut hasher = hasher;
            for piece in queue {
                hasher.update(&piece);
            }
            let _ = answer.send(hasher.finalize());
        });
    match spawned {
        Ok(_) => State::Worker { pieces, digest },
        Err(_) => State::Inline {
            hasher: kept,
            seen: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> Vec<u8> {
        (0..3 * INLINE_BYTES as usize + 17)
            .map(|i| (i * 31 % 251) as u8)
            .collect()
    }

    #[test]
    fn the_digest_is_the_bodys_however_large_and_however_cut() {
        let body = body();
        for (len, piece) in [
            (0, 1),
            (100, 7),
            (body.len(), 65_536),
            (body.len(), 1_000_003),
        ] {
            let mut md5 = OffThreadHash::<md5::Md5>::default();
            let mut sha = OffThreadHash::<sha2::Sha256>::default();
            for part in body[..len].chunks(piece) {
                md5.update(&Bytes::copy_from_slice(part));
                sha.update_slice(part);
            }
            assert_eq!(
                md5.finish().unwrap(),
                md5::Md5::digest(&body[..len]),
                "{len} bytes in pieces of {piece}"
            );
            assert_eq!(
                sha.finish().unwrap(),
                sha2::Sha256::digest(&body[..len]),
                "{len} bytes in pieces of {piece}"
            );
        }
    }
}
