//! The chunked blob format's AEAD: STREAM (Hoang, Reyhanitabar, Rogaway, Vizár) over
//! AES-256-GCM, each chunk sealed under the nonce `prefix (7 bytes) ‖ counter (u32
//! BE) ‖ last-chunk flag (1 byte)` — byte for byte what `aead::stream::EncryptorBE32`
//! wrote in earlier releases (a test seals with both), so every stored blob opens.
//!
//! It runs on `ring`'s AES-GCM rather than the `aes-gcm` crate because the blob's
//! cipher is on every write's and read's path: on a 5.6 MiB state `ring` seals in
//! about a third of the time (its AES-GCM uses the CPU's wide AES and carry-less
//! multiply instructions; the portable crate does one block at a time). Small
//! messages ([`super::SealKey::seal`]) stay on `aes-gcm`.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};

use super::SealError;

/// Length of a chunk's tag, appended after its ciphertext.
pub const TAG_LEN: usize = 16;
/// Length of the random nonce prefix a blob's header names.
pub const PREFIX_LEN: usize = 7;

/// One blob's chunk cipher: seals (or opens) chunk after chunk, then the last one.
pub struct ChunkAead {
    key: LessSafeKey,
    prefix: [u8; PREFIX_LEN],
    /// The next chunk's position; STREAM refuses to wrap around.
    position: u32,
}

impl ChunkAead {
    pub fn new(key: &[u8; 32], prefix: [u8; PREFIX_LEN]) -> ChunkAead {
        let key = UnboundKey::new(&AES_256_GCM, key).expect("AES-256 takes a 32-byte key");
        ChunkAead {
            key: LessSafeKey::new(key),
            prefix,
            position: 0,
        }
    }

    fn nonce(&self, last: bool) -> Nonce {
        let mut nonce = [0u8; 12];
        nonce[..PREFIX_LEN].copy_from_slice(&self.prefix);
        nonce[PREFIX_LEN..11].copy_from_slice(&self.position.to_be_bytes());
        nonce[11] = u8::from(last);
        Nonce::assume_unique_for_key(nonce)
    }

    /// Refuses a chunk after the last position, which STREAM keeps for the last chunk.
    fn next_position(&self) -> Result<(), SealError> {
        if self.position == u32::MAX {
            return Err(SealError::Authentication);
        }
        Ok(())
    }

    /// Encrypts `chunk` in place (a chunk that is not the last) and returns its tag.
    pub fn seal_next(
        &mut self,
        associated: &[u8],
        chunk: &mut [u8],
    ) -> Result<[u8; TAG_LEN], SealError> {
        self.next_position()?;
        let tag = self
            .key
            .seal_in_place_separate_tag(self.nonce(false), Aad::from(associated), chunk)
            .map_err(|_| SealError::Authentication)?;
        self.position += 1;
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        Ok(out)
    }

    /// Encrypts the last chunk in place and appends its tag.
    pub fn seal_last(self, associated: &[u8], chunk: &mut Vec<u8>) -> Result<(), SealError> {
        let tag = self
            .key
            .seal_in_place_separate_tag(self.nonce(true), Aad::from(associated), chunk)
            .map_err(|_| SealError::Authentication)?;
        chunk.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Opens a sealed chunk that is not the last (ciphertext ‖ tag) in place, leaving
    /// its plaintext.
    pub fn open_next(&mut self, associated: &[u8], sealed: &mut Vec<u8>) -> Result<(), SealError> {
        self.next_position()?;
        self.open(false, associated, sealed)?;
        self.position += 1;
        Ok(())
    }

    /// Opens the last sealed chunk in place, leaving its plaintext.
    pub fn open_last(self, associated: &[u8], sealed: &mut Vec<u8>) -> Result<(), SealError> {
        self.open(true, associated, sealed)
    }

    fn open(&self, last: bool, associated: &[u8], sealed: &mut Vec<u8>) -> Result<(), SealError> {
        if sealed.len() < TAG_LEN {
            return Err(SealError::Truncated);
        }
        let plain = self
            .key
            .open_in_place(self.nonce(last), Aad::from(associated), sealed)
            .map_err(|_| SealError::Authentication)?
            .len();
        sealed.truncate(plain);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aes_gcm::aead::stream::{DecryptorBE32, EncryptorBE32};
    use aes_gcm::aead::KeyInit;
    use aes_gcm::Aes256Gcm;

    const KEY: [u8; 32] = [7; 32];
    const PREFIX: [u8; PREFIX_LEN] = [1, 2, 3, 4, 5, 6, 7];

    fn chunks() -> Vec<Vec<u8>> {
        (0..5)
            .map(|c| (0..1000 + c * 17).map(|i| (i * 31 + c) as u8).collect())
            .collect()
    }

    /// What earlier releases wrote: `aead::stream::EncryptorBE32` over `aes-gcm`.
    fn sealed_by_earlier_releases(ad: &[u8]) -> Vec<Vec<u8>> {
        let cipher = Aes256Gcm::new_from_slice(&KEY).unwrap();
        let mut enc = EncryptorBE32::from_aead(cipher, PREFIX.as_slice().into());
        let mut all = chunks();
        let last = all.pop().unwrap();
        let mut out: Vec<Vec<u8>> = all
            .into_iter()
            .map(|mut c| {
                enc.encrypt_next_in_place(ad, &mut c).unwrap();
                c
            })
            .collect();
        let mut last = last;
        enc.encrypt_last_in_place(ad, &mut last).unwrap();
        out.push(last);
        out
    }

    #[test]
    fn seals_byte_for_byte_as_the_stream_of_earlier_releases() {
        let ad = b"header";
        let mut aead = ChunkAead::new(&KEY, PREFIX);
        let mut all = chunks();
        let mut last = all.pop().unwrap();
        let mut ours: Vec<Vec<u8>> = all
            .into_iter()
            .map(|mut c| {
                let tag = aead.seal_next(ad, &mut c).unwrap();
                c.extend_from_slice(&tag);
                c
            })
            .collect();
        aead.seal_last(ad, &mut last).unwrap();
        ours.push(last);
        assert_eq!(ours, sealed_by_earlier_releases(ad));

        // And what they sealed opens here, and what is sealed here opens there.
        let mut aead = ChunkAead::new(&KEY, PREFIX);
        let mut theirs = sealed_by_earlier_releases(ad);
        let mut last = theirs.pop().unwrap();
        for (mut sealed, plain) in theirs.into_iter().zip(chunks()) {
            aead.open_next(ad, &mut sealed).unwrap();
            assert_eq!(sealed, plain);
        }
        aead.open_last(ad, &mut last).unwrap();
        assert_eq!(last, *chunks().last().unwrap());
        let cipher = Aes256Gcm::new_from_slice(&KEY).unwrap();
        let mut dec = DecryptorBE32::from_aead(cipher, PREFIX.as_slice().into());
        let mut last = ours.pop().unwrap();
        for mut sealed in ours {
            dec.decrypt_next_in_place(ad, &mut sealed).unwrap();
        }
        dec.decrypt_last_in_place(ad, &mut last).unwrap();
    }

    #[test]
    fn a_chunk_opens_only_at_its_place_under_its_data_and_whole() {
        let ad = b"header";
        let sealed = sealed_by_earlier_releases(ad);
        // (chunk index, open it as last?, associated data, cut the tag short?)
        let cases: &[(usize, bool, &[u8], bool)] = &[
            (1, false, ad, false),       // second chunk at the first position
            (0, true, ad, false),        // a middle chunk passed off as the last
            (4, false, ad, false),       // the last chunk passed off as a middle one
            (0, false, b"other", false), // another blob's header
            (0, false, ad, true),        // truncated
        ];
        for &(index, as_last, data, cut) in cases {
            let mut piece = sealed[index].clone();
            if cut {
                piece.truncate(TAG_LEN - 1);
            }
            let aead = ChunkAead::new(&KEY, PREFIX);
            let opened = if as_last {
                aead.open_last(data, &mut piece)
            } else {
                let mut aead = aead;
                aead.open_next(data, &mut piece)
            };
            assert!(opened.is_err(), "{index} {as_last} {cut}");
        }
        let mut flipped = sealed[0].clone();
        flipped[3] ^= 1;
        assert!(ChunkAead::new(&KEY, PREFIX)
            .open_next(ad, &mut flipped)
            .is_err());
    }
}
