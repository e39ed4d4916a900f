//! Standard Webhooks signatures (<https://www.standardwebhooks.com>), pure:
//! the secret format and the `v1` signature, kept apart from the tower layer
//! that applies them so that both the config checks and the layer share one
//! definition, and so the arithmetic is tested against the reference library.
//!
//! A secret is written `whsec_<base64>` as Standard Webhooks (and Svix) print
//! them. Like the reference `standardwebhooks` library, the `whsec_` prefix
//! is optional and the base64 padding may be left out; unlike it, characters
//! outside the base64 alphabet are refused rather than skipped, so that a
//! mangled secret is a config error instead of a silently different key.
//! Surrounding whitespace (a trailing newline from a mounted file) is trimmed.

use base64::Engine;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;

/// The prefix Standard Webhooks puts before the base64 key.
pub const PREFIX: &str = "whsec_";

/// Standard base64 that accepts the padding or its absence, as the
/// reference library does.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why an environment value is not a signing secret. The messages never
/// repeat the value: it is a secret even when malformed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("is empty: expected whsec_ followed by base64")]
    Empty,
    #[error("is not valid base64 after the optional whsec_ prefix")]
    NotBase64,
}

/// The HMAC key of one signing secret. `Debug` prints no key bytes, so
/// settings can be debug-printed without leaking it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("Secret(********)")
    }
}

impl Secret {
    /// Decodes `whsec_<base64>` (or bare base64).
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let text = text.trim();
        let b64 = text.strip_prefix(PREFIX).unwrap_or(text);
        let key = LENIENT.decode(b64).map_err(|_| SecretError::NotBase64)?;
        if key.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Secret(key))
    }

    /// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.
    pub fn sign(&self, id: &[u8], timestamp: u64, body: &[u8]) -> String {
        // A key of any length is valid for HMAC, so this cannot fail; the
        // fallback only keeps the type honest.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            return String::new();
        };
        mac.update(id);
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// The `webhook-signature` value: one `v1,` signature per secret, separated
/// by spaces, so a receiver holding either key of a rotation accepts it.
pub fn signature_header(secrets: &[Secret], id: &[u8], timestamp: u64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| s.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Only for tests elsewhere in the crate: the bare key encoded as a secret.
#[cfg(test)]
pub fn encode(key: &[u8]) -> String {
    format!("{PREFIX}{}", STANDARD.encode(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected values computed with the reference Python library
    /// (`standardwebhooks` 1.1.0, tests/py/requirements.txt), not with this
    /// code:
    /// `Webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").sign("msg_p5jXN8AQM9LWM0D4loKWxJek",
    /// datetime.fromtimestamp(1614265330, tz=timezone.utc), '{"test": 2432232314}')`.
    const VECTOR_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const VECTOR_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const VECTOR_TS: u64 = 1614265330;
    const VECTOR_BODY: &str = r#"{"test": 2432232314}"#;
    const VECTOR_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn vector_sig(secret: &str) -> String {
        Secret::parse(secret).expect("valid secret").sign(
            VECTOR_ID.as_bytes(),
            VECTOR_TS,
            VECTOR_BODY.as_bytes(),
        )
    }

    #[test]
    fn signs_like_the_reference_library() {
        assert_eq!(vector_sig(VECTOR_SECRET), VECTOR_SIG);
    }

    #[test]
    fn prefix_and_padding_are_optional() {
        assert_eq!(vector_sig("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), VECTOR_SIG);
        assert_eq!(
            vector_sig(" whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"),
            VECTOR_SIG
        );
        // 2 key bytes: "AQI=" padded, "AQI" unpadded.
        assert_eq!(Secret::parse("whsec_AQI="), Secret::parse("whsec_AQI"));
        assert_eq!(Secret::parse("whsec_AQI"), Ok(Secret(vec![1, 2])));
    }

    #[test]
    fn bad_secrets_are_refused_without_echoing_them() {
        assert_eq!(Secret::parse("whsec_"), Err(SecretError::Empty));
        assert_eq!(Secret::parse(""), Err(SecretError::Empty));
        assert_eq!(
            Secret::parse("whsec_not*base64"),
            Err(SecretError::NotBase64)
        );
        assert_eq!(Secret::parse("whsec_a b"), Err(SecretError::NotBase64));
        let e = SecretError::NotBase64.to_string();
        assert!(!e.contains("not*base64"));
        assert_eq!(format!("{:?}", Secret(vec![1, 2])), "Secret(********)");
    }

    #[test]
    fn one_signature_per_secret_in_order() {
        let a = Secret::parse(VECTOR_SECRET).expect("valid");
        let b = Secret::parse(&encode(b"another key")).expect("valid");
        let h = signature_header(
            &[a.clone(), b.clone()],
            VECTOR_ID.as_bytes(),
            VECTOR_TS,
            VECTOR_BODY.as_bytes(),
        );
        let parts: Vec<&str> = h.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], VECTOR_SIG);
        assert_ne!(parts[1], VECTOR_SIG);
        assert!(parts[1].starts_with("v1,"));
        // Any change of id, time or body changes the signature.
        let base = a.sign(b"id", 1, b"body");
        assert_ne!(a.sign(b"id", 2, b"body"), base);
        assert_ne!(a.sign(b"id", 1, b"bodY"), base);
        assert_ne!(a.sign(b"iD", 1, b"body"), base);
    }
}
