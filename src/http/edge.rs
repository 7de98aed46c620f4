//! What every request and every answer meets at the edge, whatever its route: the
//! bound on a request's head (431 before routing), and the response headers that keep
//! a browser from running anything but the UI's own pages with the UI's authority.
//!
//! The pass-through serves bytes anyone with write access to any user bucket chose
//! (or a presigned URL hands out), from the same origin as `/ui/`. A cookie path
//! isolates nothing within one origin, so every answer that is not a UI page carries
//! `Content-Security-Policy: sandbox`: the browser gives the document an opaque origin
//! and runs no scripts, forms, plugins or popups in it, so it can neither read the
//! UI's pages nor post to them. `nosniff` stops a browser from guessing HTML out of an
//! object served as something else. The UI's own pages carry their own stricter
//! policy (`http::ui`), and under TLS every answer carries HSTS.

use pingora::http::{RequestHeader, ResponseHeader};

/// Longest request header line accepted (`name: value`), like nginx's large buffers.
pub const MAX_HEADER_LINE: usize = 16 * 1024;
/// Longest request head accepted: the request target and every header line together.
pub const MAX_REQUEST_HEAD: usize = 64 * 1024;

/// The policy of every answer that is not one of the UI's pages (see the module doc).
pub const SANDBOX_POLICY: &str = "sandbox";
/// `Strict-Transport-Security` under TLS: one year, this host only (a homelab host
/// often shares its domain with services that have no TLS).
pub const HSTS: &str = "max-age=31536000";

const CSP: &str = "Content-Security-Policy";
const NOSNIFF: (&str, &str) = ("X-Content-Type-Options", "nosniff");
const STS: &str = "Strict-Transport-Security";

/// Is the request's head larger than a server should buffer and parse: one header
/// line over [`MAX_HEADER_LINE`], or target and headers over [`MAX_REQUEST_HEAD`]?
pub fn head_too_large(request: &RequestHeader) -> bool {
    let mut total = request.raw_path().len();
    for (name, value) in request.headers.iter() {
        // As sent: `name: value\r\n`.
        let line = name.as_str().len() + 2 + value.len();
        if line > MAX_HEADER_LINE {
            return true;
        }
        total += line + 2;
    }
    total > MAX_REQUEST_HEAD
}

/// Completes the headers of a local answer: the sandbox policy and `nosniff` unless
/// the answer set its own (the UI's pages do), and HSTS under TLS.
pub fn finish_local(headers: &mut Vec<(&'static str, String)>, tls: bool) {
    let has = |headers: &[(&str, String)], name: &str| {
        headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
    };
    if !has(headers, CSP) {
        headers.push((CSP, SANDBOX_POLICY.into()));
    }
    if !has(headers, NOSNIFF.0) {
        headers.push((NOSNIFF.0, NOSNIFF.1.into()));
    }
    if tls {
        headers.push((STS, HSTS.into()));
    }
}

/// Neutralises an upstream's answer before it reaches the client. The sandbox policy
/// is added beside any the upstream sent (a browser enforces every policy it gets, so
/// none the upstream sends can loosen it); `nosniff` replaces whatever was there; a
/// `Set-Cookie` is dropped, so no upstream answer can plant a cookie on the UI's
/// origin (S3 clients do not use cookies).
pub fn finish_proxied(response: &mut ResponseHeader, tls: bool) -> pingora::Result<()> {
    response.append_header(CSP, SANDBOX_POLICY)?;
    response.insert_header(NOSNIFF.0, NOSNIFF.1)?;
    response.remove_header(&http::header::SET_COOKIE);
    if tls {
        response.insert_header(STS, HSTS)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str, headers: &[(&str, String)]) -> RequestHeader {
        let mut r = RequestHeader::build("GET", path.as_bytes(), None).unwrap();
        for (name, value) in headers {
            r.append_header(name.to_string(), value.as_str()).unwrap();
        }
        r
    }

    #[test]
    fn request_heads_are_bounded_per_line_and_in_total() {
        let line = |n: usize| "x".repeat(n);
        // (target length, header value lengths, too large?)
        let table: &[(usize, &[usize], bool)] = &[
            (10, &[], false),
            (10, &[100, 200], false),
            // `x-h: ` + value: exactly the line limit, then one byte over it.
            (10, &[MAX_HEADER_LINE - 5], false),
            (10, &[MAX_HEADER_LINE - 4], true),
            (10, &[200 * 1024], true),
            // Many lines each under the limit, over the total together.
            (10, &[15 * 1024; 4], false),
            (10, &[15 * 1024; 5], true),
            // The request target counts toward the total.
            (MAX_REQUEST_HEAD - 100, &[200], true),
        ];
        for &(target, values, want) in table {
            let path = format!("/{}", line(target - 1));
            let headers: Vec<_> = values.iter().map(|&n| ("x-h", line(n))).collect();
            assert_eq!(
                head_too_large(&request(&path, &headers)),
                want,
                "{target} {values:?}"
            );
        }
    }

    #[test]
    fn local_answers_get_the_sandbox_unless_they_set_a_policy() {
        let mut plain = Vec::new();
        finish_local(&mut plain, false);
        assert_eq!(
            plain,
            vec![
                (CSP, "sandbox".to_string()),
                ("X-Content-Type-Options", "nosniff".to_string())
            ]
        );
        let ui_policy = "default-src 'self'";
        let mut ui = vec![
            ("Content-Security-Policy", ui_policy.to_string()),
            ("X-Content-Type-Options", "nosniff".to_string()),
        ];
        finish_local(&mut ui, true);
        assert_eq!(ui.len(), 3, "{ui:?}");
        assert_eq!(ui[0].1, ui_policy);
        assert_eq!(ui[2], (STS, HSTS.to_string()));
    }

    #[test]
    fn upstream_answers_are_sandboxed_whatever_they_say() {
        let mut r = ResponseHeader::build(200, None).unwrap();
        r.insert_header("content-type", "text/html").unwrap();
        r.insert_header(CSP, "script-src *").unwrap();
        r.insert_header("x-content-type-options", "sniff-away")
            .unwrap();
        r.insert_header("set-cookie", "sg_session=planted; Path=/ui")
            .unwrap();
        finish_proxied(&mut r, true).unwrap();
        let all = |name: &str| -> Vec<String> {
            r.headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(all(CSP), vec!["script-src *", "sandbox"]);
        assert_eq!(all("x-content-type-options"), vec!["nosniff"]);
        assert!(all("set-cookie").is_empty());
        assert_eq!(all(STS), vec![HSTS]);
        let mut plain = ResponseHeader::build(200, None).unwrap();
        finish_proxied(&mut plain, false).unwrap();
        assert!(plain.headers.get(STS).is_none());
    }
}
