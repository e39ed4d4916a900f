//! The admin bearer token (docs/http-api.md): mutating admin calls need
//! `Authorization: Bearer <token>` when `admin_token_env` is set. Pure, so
//! the comparison is tested without a server.
//!
//! Both sides are hashed with SHA-256 before a constant-time comparison
//! (`subtle`): the time taken then depends neither on how many leading
//! bytes match nor on the token's length.

use http::HeaderMap;
use sha2::{Digest, Sha256};
use std::fmt;
use subtle::ConstantTimeEq;

/// The configured token, kept only as its digest. `Debug` prints nothing of it.
#[derive(Clone)]
pub struct AdminToken([u8; 32]);

impl AdminToken {
    /// Surrounding whitespace (a trailing newline from a mounted Secret
    /// file) is not part of the token.
    pub fn new(token: &str) -> AdminToken {
        AdminToken(Sha256::digest(token.trim().as_bytes()).into())
    }

    /// True when `headers` carry `Authorization: Bearer <this token>`
    /// (the scheme name in any case, as RFC 9110 allows).
    pub fn authorizes(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers.get(http::header::AUTHORIZATION) else {
            return false;
        };
        let Some((scheme, credentials)) = value.as_bytes().split_first_chunk::<7>() else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case(b"bearer ") {
            return false;
        }
        let offered: [u8; 32] = Sha256::digest(credentials.trim_ascii()).into();
        offered.ct_eq(&self.0).into()
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("AdminToken(********)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_str(value).expect("header value"),
        );
        h
    }

    #[test]
    fn only_the_exact_bearer_token_authorizes() {
        let t = AdminToken::new("s3cret-token\n");
        assert!(t.authorizes(&auth("Bearer s3cret-token")));
        assert!(t.authorizes(&auth("bearer s3cret-token")));
        assert!(t.authorizes(&auth("BEARER  s3cret-token ")));
        assert!(!t.authorizes(&auth("Bearer s3cret-toke")));
        assert!(!t.authorizes(&auth("Bearer s3cret-token2")));
        assert!(!t.authorizes(&auth("Basic s3cret-token")));
        assert!(!t.authorizes(&auth("s3cret-token")));
        assert!(!t.authorizes(&auth("Bearer")));
        assert!(!t.authorizes(&auth("Bearer ")));
        assert!(!t.authorizes(&HeaderMap::new()));
    }

    #[test]
    fn debug_never_shows_the_token() {
        let shown = format!("{:?}", AdminToken::new("s3cret-token"));
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
