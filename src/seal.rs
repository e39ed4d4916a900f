//! Encrypted hand-off objects (`handoff.encryption_key_env`; a leaf, as
//! `config` parses the keys and `handoff` uses them): a hand-off
//! object holds what the app sent, its `Authorization` and `Cookie`
//! headers included, since they are needed to deliver it. With keys set,
//! an object is sealed with AES-256-GCM before it leaves the process, so
//! whoever can read the bucket reads nothing, and whoever can write there
//! cannot forge an object that a courier adopts.
//!
//! `[magic "CHE1"][key id: 8][nonce: 12][ciphertext][tag: 16]`: the
//! plaintext is the whole `CHO1` object; the key id is the first 8 bytes of
//! SHA-256 of the key (so that an adopter names the key it lacks, and tries
//! only one); the nonce is random (96 bits: at most a few thousand objects
//! per key per deploy, far below GCM's bound for random nonces); the
//! associated data is the object's name, so an object renamed, or copied
//! under another name, fails as a forgery does. ring's AEAD, as rustls
//! already links it, rather than a second crypto library.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};

pub(crate) const MAGIC: &[u8; 4] = b"CHE1";
const ID_LEN: usize = 8;
const HEAD: usize = 4 + ID_LEN + NONCE_LEN;
const TAG: usize = 16;
/// Bytes a sealed object adds to its plaintext.
pub const OVERHEAD: usize = HEAD + TAG;
/// What the associated data starts with: a key used for anything else
/// cannot open a hand-off object, nor the other way round.
const DOMAIN: &[u8] = b"courier handoff v1\0";

/// One AES-256 key; never printed.
#[derive(Clone)]
pub struct Key {
    id: [u8; ID_LEN],
    key: [u8; 32],
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key(id {})", hex(&self.id))
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.id == other.id
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum KeyError {
    #[error("is not base64")]
    Base64,
    #[error("decodes to {0} bytes, not 32 (generate one with `openssl rand -base64 32`)")]
    Length(usize),
}

impl Key {
    /// A key as the environment holds it: 32 bytes in standard base64.
    pub fn parse(text: &str) -> Result<Key, KeyError> {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| KeyError::Base64)?;
        let key: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| KeyError::Length(bytes.len()))?;
        let digest = Sha256::digest(key);
        let mut id = [0u8; ID_LEN];
        id.copy_from_slice(&digest[..ID_LEN]);
        Ok(Key { id, key })
    }

    fn aead(&self) -> LessSafeKey {
        // 32 bytes is AES-256's key length: the only way this fails.
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.key).expect("a 32-byte key"))
    }
}

/// Why a sealed object is not opened.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum OpenError {
    #[error("it is encrypted, and this courier has no handoff.encryption_key_env to open it with")]
    NoKeys,
    #[error("it is encrypted with a key this courier does not have (key id {0})")]
    UnknownKey(String),
    #[error("it fails authentication: altered, renamed, or not written by a courier with this key")]
    Forged,
    #[error(
        "it is not encrypted, and this courier's hand-offs are: refused, as anyone who can write to the bucket could have written it"
    )]
    Plain,
}

fn aad(name: &str) -> Vec<u8> {
    [DOMAIN, name.as_bytes()].concat()
}

/// `plain` sealed for the object `name` with `key`.
pub fn seal(key: &Key, name: &str, mut plain: Vec<u8>) -> Vec<u8> {
    let mut nonce = [0u8; NONCE_LEN];
    // The system's random source fails only when the kernel has none.
    SystemRandom::new()
        .fill(&mut nonce)
        .expect("the system's random source");
    let tag = key
        .aead()
        .seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(name)),
            &mut plain,
        )
        .expect("AES-GCM seals any length below 64 GiB");
    let mut out = Vec::with_capacity(OVERHEAD + plain.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&key.id);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&plain);
    out.extend_from_slice(tag.as_ref());
    out
}

pub fn is_sealed(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// The plaintext of the object `name`: `bytes` opened with the key it
/// names when it is sealed; as it is when it is not and no keys are set.
pub fn open(keys: &[Key], name: &str, mut bytes: Vec<u8>) -> Result<Vec<u8>, OpenError> {
    if !is_sealed(&bytes) {
        return if keys.is_empty() {
            Ok(bytes)
        } else {
            Err(OpenError::Plain)
        };
    }
    if keys.is_empty() {
        return Err(OpenError::NoKeys);
    }
    if bytes.len() < OVERHEAD {
        return Err(OpenError::Forged);
    }
    let id = &bytes[4..4 + ID_LEN];
    let key = keys
        .iter()
        .find(|k| k.id == id)
        .ok_or_else(|| OpenError::UnknownKey(hex(id)))?;
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&bytes[4 + ID_LEN..HEAD]);
    let len = key
        .aead()
        .open_within(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(name)),
            &mut bytes,
            HEAD..,
        )
        .map_err(|_| OpenError::Forged)?
        .len();
    bytes.truncate(len);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn key(b: u8) -> Key {
        Key::parse(&base64::engine::general_purpose::STANDARD.encode([b; 32])).expect("key")
    }

    #[test]
    fn a_sealed_object_opens_with_its_key_and_name_only() {
        let (a, b) = (key(1), key(2));
        let plain = b"CHO1 some events".to_vec();
        let sealed = seal(&a, "x-1.cho", plain.clone());
        assert!(is_sealed(&sealed));
        assert_eq!(sealed.len(), plain.len() + OVERHEAD);
        assert!(
            !sealed.windows(4).any(|w| w == b"some"),
            "no plaintext shows"
        );
        assert_eq!(
            open(&[b.clone(), a.clone()], "x-1.cho", sealed.clone()),
            Ok(plain.clone()),
            "rotation: any configured key opens what it sealed"
        );
        assert_eq!(
            open(std::slice::from_ref(&b), "x-1.cho", sealed.clone()),
            Err(OpenError::UnknownKey(hex(&a.id)))
        );
        assert_eq!(open(&[], "x-1.cho", sealed.clone()), Err(OpenError::NoKeys));
        assert_eq!(
            open(std::slice::from_ref(&a), "y-1.cho", sealed.clone()),
            Err(OpenError::Forged),
            "renamed"
        );
        for i in [4 + ID_LEN, HEAD, sealed.len() - 1] {
            let mut flipped = sealed.clone();
            flipped[i] ^= 1;
            assert_eq!(
                open(std::slice::from_ref(&a), "x-1.cho", flipped),
                Err(OpenError::Forged),
                "bit {i}"
            );
        }
        assert_eq!(
            open(std::slice::from_ref(&a), "x-1.cho", b"CHE1short".to_vec()),
            Err(OpenError::Forged)
        );
        assert_eq!(
            open(std::slice::from_ref(&a), "x-1.cho", plain.clone()),
            Err(OpenError::Plain)
        );
        assert_eq!(open(&[], "x-1.cho", plain.clone()), Ok(plain));
        assert_ne!(
            seal(&a, "x-1.cho", b"same".to_vec()),
            seal(&a, "x-1.cho", b"same".to_vec()),
            "fresh nonces"
        );
    }

    #[test]
    fn keys_are_32_bytes_of_base64_and_never_printed() {
        assert_eq!(Key::parse("not base64!"), Err(KeyError::Base64));
        assert_eq!(Key::parse("AAAA"), Err(KeyError::Length(3)));
        let k = key(7);
        assert!(!format!("{k:?}").contains("BwcH"), "{k:?}");
    }
}
