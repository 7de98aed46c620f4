//! The MD5 of a streamed state body, for its `Content-MD5` check. A large body's MD5
//! costs as much CPU as its scan, and both are on the write's path before the reply:
//! past [`INLINE_BYTES`] the hasher moves to a worker thread of its own, which hashes
//! the pieces (shared, not copied) while the request's thread scans them, so on more
//! than one core a large write waits for the longer of the two, not their sum. Small
//! bodies stay on the request's thread, where a thread would cost more than it saves.

use std::sync::mpsc;

use bytes::Bytes;
use md5::Digest;

use crate::error::Error;

/// Bodies up to this size are hashed on the request's thread.
pub const INLINE_BYTES: u64 = 1024 * 1024;
/// Pieces queued for the worker; a request's thread that gets this far ahead waits.
const QUEUED_PIECES: usize = 16;

pub struct BodyMd5 {
    state: State,
}

enum State {
    Inline {
        hasher: md5::Md5,
        seen: u64,
    },
    Worker {
        pieces: mpsc::SyncSender<Bytes>,
        digest: mpsc::Receiver<[u8; 16]>,
    },
}

impl Default for BodyMd5 {
    fn default() -> Self {
        BodyMd5 {
            state: State::Inline {
                hasher: md5::Md5::default(),
                seen: 0,
            },
        }
    }
}

impl BodyMd5 {
    pub fn update(&mut self, piece: &Bytes) {
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
                // A worker that is gone (it cannot fail, but if it did) sends no
                // digest, and `finish` refuses the write.
                let _ = pieces.send(piece.clone());
            }
        }
    }

    /// The body's MD5, once every piece was passed to [`Self::update`].
    pub fn finish(self) -> Result<[u8; 16], Error> {
        match self.state {
            State::Inline { hasher, .. } => Ok(hasher.finalize().into()),
            State::Worker { pieces, digest } => {
                drop(pieces); // the worker hashes what is queued, then answers
                digest.recv().map_err(|_| Error::Internal {
                    public: "internal error; nothing was written".into(),
                    detail: "the body's MD5 worker stopped before its digest".into(),
                })
            }
        }
    }
}

/// `hasher` continued on a thread of its own; where none can be started, it stays
/// inline.
fn to_worker(hasher: md5::Md5) -> State {
    let (pieces, queue) = mpsc::sync_channel::<Bytes>(QUEUED_PIECES);
    let (answer, digest) = mpsc::sync_channel(1);
    let kept = hasher.clone();
    let spawned = std::thread::Builder::new()
        .name("body-md5".into())
        .spawn(move || {
            let mut hasher = hasher;
            for piece in queue {
                hasher.update(&piece);
            }
            let _ = answer.send(hasher.finalize().into());
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

    #[test]
    fn the_digest_is_the_bodys_md5_however_large_and_however_cut() {
        let body: Vec<u8> = (0..3 * INLINE_BYTES as usize + 17)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        for (len, piece) in [
            (0, 1),
            (100, 7),
            (body.len(), 65_536),
            (body.len(), 1_000_003),
        ] {
            let mut md5 = BodyMd5::default();
            for part in body[..len].chunks(piece) {
                md5.update(&Bytes::copy_from_slice(part));
            }
            let expected: [u8; 16] = md5::Md5::digest(&body[..len]).into();
            assert_eq!(
                md5.finish().unwrap(),
                expected,
                "{len} bytes in pieces of {piece}"
            );
        }
    }
}
