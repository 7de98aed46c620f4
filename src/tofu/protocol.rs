//! Pure parsing for the HTTP backend protocol: LockInfo, unlock requests, Content-MD5.
//! (State bodies are parsed by `crate::tfstate`, shared with the cluster API.)

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde::Deserialize;

use crate::error::Error;

/// Longest lock ID accepted.
const MAX_ID_LEN: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    pub id: String,
    /// The JSON exactly as the client sent it; returned verbatim to contenders.
    pub raw: String,
}

#[derive(Deserialize)]
struct LockProbe {
    #[serde(rename = "ID")]
    id: Option<String>,
}

pub fn parse_lock_info(body: &[u8]) -> Result<LockInfo, Error> {
    let text = std::str::from_utf8(body)
        .map_err(|_| Error::Invalid("LockInfo must be UTF-8 JSON".into()))?;
    if !text.trim_start().starts_with('{') {
        return Err(Error::Invalid("LockInfo must be a JSON object".into()));
    }
    crate::tfstate::check_untrusted_json(body)
        .map_err(|why| Error::Invalid(format!("LockInfo is {why}")))?;
    let probe: LockProbe = serde_json::from_str(text)
        .map_err(|e| Error::Invalid(format!("LockInfo is not valid JSON ({e})")))?;
    let id = probe
        .id
        .ok_or_else(|| Error::Invalid("LockInfo has no \"ID\"".into()))?;
    if !crate::tfstate::is_safe_id(&id, MAX_ID_LEN) {
        return Err(Error::Invalid(format!(
            "LockInfo \"ID\" must be 1-{MAX_ID_LEN} printable ASCII characters"
        )));
    }
    Ok(LockInfo {
        id,
        raw: text.to_string(),
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnlockRequest {
    /// Terraform's force-unlock sends no body at all.
    Force,
    Id(String),
}

impl UnlockRequest {
    pub fn parse(body: &[u8]) -> Result<Self, Error> {
        if body.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(UnlockRequest::Force);
        }
        Ok(UnlockRequest::Id(parse_lock_info(body)?.id))
    }
}

/// Decodes a `Content-MD5` header (base64 of the body's MD5).
pub fn decode_content_md5(header: &str) -> Result<Vec<u8>, Error> {
    BASE64
        .decode(header.trim())
        .map_err(|_| Error::Invalid("Content-MD5 is not valid base64".into()))
}

/// Compares the body's MD5 with the one the client declared.
pub fn check_md5(expected: &[u8], actual: &[u8]) -> Result<(), Error> {
    if expected != actual {
        return Err(Error::Invalid(
            "Content-MD5 does not match the body (corrupted in transit?); nothing was written"
                .into(),
        ));
    }
    Ok(())
}

/// Verifies a `Content-MD5` header (base64 of the body's MD5) when the client sent one.
pub fn verify_content_md5(header: Option<&str>, body: &[u8]) -> Result<(), Error> {
    use md5::Digest;
    let Some(header) = header else { return Ok(()) };
    let expected = BASE64
        .decode(header.trim())
        .map_err(|_| Error::Invalid("Content-MD5 is not valid base64".into()))?;
    if expected.as_slice() != md5::Md5::digest(body).as_slice() {
        return Err(Error::Invalid(
            "Content-MD5 does not match the body (corrupted in transit?); nothing was written"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_info() {
        let info = parse_lock_info(br#"{"ID":"abc","Operation":"OperationTypeApply","Who":"me"}"#)
            .unwrap();
        assert_eq!(info.id, "abc");
        assert!(info.raw.contains("OperationTypeApply"));
        for bad in [
            &b""[..],
            b"{}",
            br#"{"ID":""}"#,
            br#"{"ID":5}"#,
            b"[1]",
            b"\xff",
            b"{",
            br#"{"ID":"a\nb"}"#,
            br#"{"ID":"a\u0000b"}"#,
            br#"{"ID":"a\u001b[2J"}"#,
            br#"{"ID":"a b"}"#,
        ] {
            assert!(parse_lock_info(bad).is_err(), "{bad:?}");
        }
        assert!(parse_lock_info(format!(r#"{{"ID":"{}"}}"#, "x".repeat(300)).as_bytes()).is_err());
        let deep = format!(r#"{{"ID":"x","Info":{}}}"#, "[".repeat(60_000));
        assert!(parse_lock_info(deep.as_bytes()).is_err());
    }

    #[test]
    fn unlock_requests() {
        assert_eq!(UnlockRequest::parse(b"").unwrap(), UnlockRequest::Force);
        assert_eq!(UnlockRequest::parse(b" \n").unwrap(), UnlockRequest::Force);
        assert_eq!(
            UnlockRequest::parse(br#"{"ID":"x"}"#).unwrap(),
            UnlockRequest::Id("x".into())
        );
        assert!(UnlockRequest::parse(b"{}").is_err());
    }

    #[test]
    fn content_md5() {
        use md5::Digest;
        let body = b"hello";
        let good = BASE64.encode(md5::Md5::digest(body));
        assert!(verify_content_md5(None, body).is_ok());
        assert!(verify_content_md5(Some(&good), body).is_ok());
        assert!(verify_content_md5(Some(&good), b"hellO").is_err());
        assert!(verify_content_md5(Some("***"), body).is_err());
    }
}
