//! Publishers' keys (docs/configuration.md `ingress.keys_from_env`): with keys set, a
//! request must carry one, as Event Grid's topic key (`aeg-sas-key`), a
//! shared access signature made with it (`aeg-sas-token`, what the Azure
//! SDKs' `AzureSasCredential` sends), or `Authorization: Bearer <key>`.
//! Pure, so every form is tested without a server.
//!
//! Keys are compared as SHA-256 digests in constant time (`subtle`), as the
//! admin token is. A signature is checked the way Event Grid checks it:
//! `s` is the base64 HMAC-SHA256, keyed by the base64-decoded topic key, of
//! `r=<resource>&e=<expiry>` exactly as the token spells them, and the
//! expiry must not have passed.

use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::{Digest, Sha256};
use std::fmt;
use subtle::ConstantTimeEq;

pub use crate::event::rules::{KEY_HEADER, TOKEN_HEADER};

/// The configured keys. `Debug` prints how many, nothing of them.
#[derive(Clone)]
pub struct IngressKeys(Vec<Key>);

#[derive(Clone)]
struct Key {
    digest: [u8; 32],
    /// The key base64-decoded, as signatures are keyed; `None` when it is
    /// not base64 (then only the key itself is accepted).
    hmac_key: Option<Vec<u8>>,
}

/// Why a request was refused; the message tells the publisher what to send.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum Denied {
    #[error(
        "this route needs a publisher key (ingress.keys_from_env): send it in `aeg-sas-key`, as `Authorization: Bearer <key>`, or a signature made with it in `aeg-sas-token`"
    )]
    Missing,
    #[error("the publisher key does not match any of ingress.keys_from_env")]
    WrongKey,
    #[error("the aeg-sas-token is not `r=<resource>&e=<expiry>&s=<signature>`")]
    MalformedToken,
    #[error("the aeg-sas-token's signature was not made with any of ingress.keys_from_env")]
    WrongSignature,
    #[error("the aeg-sas-token expired at {0}")]
    Expired(String),
}

impl IngressKeys {
    /// Surrounding whitespace (a trailing newline from a mounted Secret
    /// file) is not part of a key.
    pub fn new<'a>(keys: impl IntoIterator<Item = &'a str>) -> IngressKeys {
        IngressKeys(
            keys.into_iter()
                .map(|k| {
                    let k = k.trim();
                    Key {
                        digest: Sha256::digest(k.as_bytes()).into(),
                        hmac_key: base64_decode(k),
                    }
                })
                .collect(),
        )
    }

    /// Whether `headers` carry a key, or a signature made with one, that is
    /// valid at `now_ms`. Looked for in this order, the first present
    /// decides: `aeg-sas-key`, `aeg-sas-token`, `Authorization: Bearer`
    /// (last, as it is the one an app may mean for someone else).
    pub fn admit(&self, headers: &HeaderMap, now_ms: u64) -> Result<(), Denied> {
        let key = headers.get(KEY_HEADER).map(|v| v.as_bytes());
        if key.is_none()
            && let Some(token) = headers.get(TOKEN_HEADER)
        {
            return self.signed(token.as_bytes(), now_ms);
        }
        let key = key.or_else(|| bearer(headers)).ok_or(Denied::Missing)?;
        let digest: [u8; 32] = Sha256::digest(key.trim_ascii()).into();
        // Every key compared, so the time does not say which matched.
        let hit = self.0.iter().fold(subtle::Choice::from(0), |hit, k| {
            hit | digest.ct_eq(&k.digest)
        });
        if bool::from(hit) {
            Ok(())
        } else {
            Err(Denied::WrongKey)
        }
    }

    fn signed(&self, token: &[u8], now_ms: u64) -> Result<(), Denied> {
        let token = std::str::from_utf8(token).map_err(|_| Denied::MalformedToken)?;
        let (signed, signature) = token.rsplit_once("&s=").ok_or(Denied::MalformedToken)?;
        let expiry = signed
            .split('&')
            .find_map(|kv| kv.strip_prefix("e="))
            .ok_or(Denied::MalformedToken)?;
        if !signed.starts_with("r=") {
            return Err(Denied::MalformedToken);
        }
        let signature = percent_encoding::percent_decode_str(signature)
            .decode_utf8()
            .ok()
            .and_then(|s| base64_decode(&s))
            .ok_or(Denied::MalformedToken)?;
        let expiry = percent_encoding::percent_decode_str(expiry)
            .decode_utf8()
            .map_err(|_| Denied::MalformedToken)?;
        let expires_ms = expiry_ms(&expiry).ok_or(Denied::MalformedToken)?;
        let mut hit = subtle::Choice::from(0);
        for key in self.0.iter().filter_map(|k| k.hmac_key.as_deref()) {
            let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
                continue;
            };
            mac.update(signed.as_bytes());
            hit |= mac.finalize().into_bytes().as_slice().ct_eq(&signature);
        }
        if !bool::from(hit) {
            return Err(Denied::WrongSignature);
        }
        if expires_ms <= now_ms {
            return Err(Denied::Expired(expiry.into_owned()));
        }
        Ok(())
    }
}

impl fmt::Debug for IngressKeys {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "IngressKeys({} keys)", self.0.len())
    }
}

/// `Authorization: Bearer <credentials>`, the scheme in any case.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(http::header::AUTHORIZATION)?.as_bytes();
    let (scheme, credentials) = value.split_first_chunk::<7>()?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then_some(credentials)
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

/// A token's expiry in ms since the epoch. The Azure SDKs write it as
/// Python's `str(datetime)` (`2026-11-23 13:00:00+00:00`, with or without a
/// fraction or an offset) or as RFC 3339; a time without an offset is UTC.
fn expiry_ms(s: &str) -> Option<u64> {
    crate::clock::rfc3339::parse_ms_utc_default(s.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_headers as headers;
    use base64::Engine;

    const KEY: &str = "c2VjcmV0LXRvcGljLWtleS0wMTIzNDU2Nzg5MDEyMzQ1Njc4OQ==";

    /// What the Azure SDK's `generate_sas` makes (its `_helpers.py`).
    fn sas(key: &str, resource: &str, expiry: &str) -> String {
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let unsigned = format!("r={}&e={}", enc(resource), enc(expiry));
        let raw = base64::engine::general_purpose::STANDARD
            .decode(key)
            .expect("base64 key");
        let mut mac = Hmac::<Sha256>::new_from_slice(&raw).expect("hmac");
        mac.update(unsigned.as_bytes());
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        format!("{unsigned}&s={}", enc(&sig))
    }

    const NOW: u64 = 1_795_000_000_000; // 2026-11-18

    #[test]
    fn a_key_in_either_header_is_admitted_and_any_other_is_not() {
        let keys = IngressKeys::new(["old-key", &format!("{KEY}\n")]);
        for h in [
            headers(&[("aeg-sas-key", KEY)]),
            headers(&[("aeg-sas-key", "old-key")]),
            headers(&[("authorization", &format!("Bearer {KEY}"))]),
            headers(&[("authorization", "bearer old-key")]),
        ] {
            assert_eq!(keys.admit(&h, NOW), Ok(()), "{h:?}");
        }
        assert_eq!(keys.admit(&HeaderMap::new(), NOW), Err(Denied::Missing));
        assert_eq!(
            keys.admit(&headers(&[("authorization", &format!("Basic {KEY}"))]), NOW),
            Err(Denied::Missing)
        );
        assert_eq!(
            keys.admit(&headers(&[("aeg-sas-key", "old-ke")]), NOW),
            Err(Denied::WrongKey)
        );
        assert_eq!(
            keys.admit(
                &headers(&[("aeg-sas-key", "nope"), ("authorization", "Bearer old-key")]),
                NOW
            ),
            Err(Denied::WrongKey),
            "aeg-sas-key is the one that counts"
        );
    }

    #[test]
    fn a_signature_made_with_a_key_is_admitted_until_it_expires() {
        let keys = IngressKeys::new([KEY]);
        let resource = "http://127.0.0.1:8080/shop?apiVersion=2018-01-01";
        for expiry in [
            "2026-11-23 13:00:00+00:00",
            "2026-11-23 13:00:00.250000+00:00",
            "2026-11-23 13:00:00",
            "2026-11-23T14:00:00+01:00",
            "2026-11-23T13:00:00Z",
        ] {
            let token = sas(KEY, resource, expiry);
            let h = headers(&[("aeg-sas-token", &token)]);
            assert_eq!(keys.admit(&h, NOW), Ok(()), "{expiry}");
            assert_eq!(
                expiry_ms(expiry).map(|ms| ms / 1000),
                Some(1_795_438_800),
                "{expiry}"
            );
            assert!(
                matches!(keys.admit(&h, 1_795_438_800_500), Err(Denied::Expired(_))),
                "{expiry}"
            );
        }
        // A valid token wins over an Authorization meant for someone else.
        let token = sas(KEY, resource, "2026-11-23 13:00:00");
        let both = headers(&[
            ("aeg-sas-token", &token),
            ("authorization", "Bearer theirs"),
        ]);
        assert_eq!(keys.admit(&both, NOW), Ok(()));
        let other = base64::engine::general_purpose::STANDARD.encode("another key");
        let forged = sas(&other, resource, "2026-11-23 13:00:00");
        assert_eq!(
            keys.admit(&headers(&[("aeg-sas-token", &forged)]), NOW),
            Err(Denied::WrongSignature)
        );
        // The expiry is signed: moving it breaks the signature.
        let token = sas(KEY, resource, "2026-11-23 13:00:00");
        let moved = token.replace("e=2026", "e=2027");
        assert_ne!(moved, token);
        assert_eq!(
            keys.admit(&headers(&[("aeg-sas-token", &moved)]), NOW),
            Err(Denied::WrongSignature)
        );
        for bad in [
            "",
            "r=x&e=y",
            "r=x&s=abc",
            "e=2026-11-23&s=abc",
            "r=x&e=soon&s=AAAA",
            "r=x&e=2026-01-01%2000%3A00%3A00%2B9999999999999999%3A00&s=AAAA",
            "r=x&e=2026-01-01%2000%3A00%3A00%2B24%3A00&s=AAAA",
        ] {
            assert_eq!(
                keys.admit(&headers(&[("aeg-sas-token", bad)]), NOW),
                Err(Denied::MalformedToken),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn debug_never_shows_a_key() {
        let shown = format!("{:?}", IngressKeys::new([KEY]));
        assert!(!shown.contains(KEY), "{shown}");
    }
}
