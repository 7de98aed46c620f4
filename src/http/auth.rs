//! Extracting the presented credential from `Authorization`.
//!
//! The workspace bearer is accepted as the HTTP Basic password (any username) or
//! as `Authorization: Bearer <token>`. Comparison is constant-time and a failure
//! never says which part was wrong.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use crate::crypto::secrets_equal;

/// Longest Authorization header we look at.
const MAX_AUTH_HEADER: usize = 4096;
/// Longest one carrying a CI job's identity token (`tofu::ci_identity`, at most
/// `MAX_TOKEN_LEN` bytes), which may be Basic-encoded.
const MAX_JWT_AUTH_HEADER: usize = 12 * 1024;

/// The raw `Authorization` header of a request, if any.
pub fn authorization(session: &pingora::proxy::Session) -> Option<&[u8]> {
    session
        .req_header()
        .headers
        .get(http::header::AUTHORIZATION)
        .map(|v| v.as_bytes())
}

/// The secret in an `Authorization` header, if it is a well-formed Basic or Bearer credential.
pub fn presented_secret(header: Option<&[u8]>) -> Option<Vec<u8>> {
    let header = std::str::from_utf8(header?).ok()?;
    if header.len() > MAX_JWT_AUTH_HEADER {
        return None;
    }
    let secret = secret_of(header)?;
    let within =
        header.len() <= MAX_AUTH_HEADER || crate::tofu::ci_identity::is_token_shaped(&secret);
    within.then_some(secret)
}

fn secret_of(header: &str) -> Option<Vec<u8>> {
    let (scheme, value) = header.trim().split_once(' ')?;
    let value = value.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return (!value.is_empty()).then(|| value.as_bytes().to_vec());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = BASE64.decode(value).ok()?;
        let colon = decoded.iter().position(|b| *b == b':')?;
        return Some(decoded[colon + 1..].to_vec());
    }
    None
}

pub fn is_authorized(header: Option<&[u8]>, expected: &str) -> bool {
    match presented_secret(header) {
        Some(secret) => secrets_equal(&secret, expected.as_bytes()),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials() {
        let basic = |s: &str| format!("Basic {}", BASE64.encode(s));
        let table: Vec<(Option<String>, bool)> = vec![
            (Some("Bearer s3cret".into()), true),
            (Some("bearer  s3cret ".into()), true),
            (Some(basic("stategate:s3cret")), true),
            (Some(basic("anyone:s3cret")), true),
            (Some(basic(":s3cret")), true),
            (Some(basic("stategate:wrong")), false),
            (Some(basic("s3cret")), false),
            (Some("Bearer".into()), false),
            (Some("Bearer wrong".into()), false),
            (Some("Token s3cret".into()), false),
            (Some("Basic !!!".into()), false),
            (Some(format!("Bearer {}", "x".repeat(5000))), false),
            (None, false),
        ];
        for (header, ok) in table {
            assert_eq!(
                is_authorized(header.as_deref().map(str::as_bytes), "s3cret"),
                ok,
                "{header:?}"
            );
        }
    }
}
