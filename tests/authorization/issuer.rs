//! A CI job-token issuer on loopback over real HTTPS (rustls, a certificate of the
//! test's CA for 127.0.0.1): its discovery document at
//! `/.well-known/openid-configuration` and its JWKS, what a `[[ci_identity]]` issuer
//! reads (integration/ci_issuer.py is the same for the real binary). It signs tokens
//! as GitHub Actions does (ES256 here), with the claims it is given.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;

use super::pki::{provider, Ca, JwtKey};

pub struct Issuer {
    /// `https://127.0.0.1:PORT/ci`: the tokens' `iss`, exactly.
    pub url: String,
    key: JwtKey,
}

impl Issuer {
    /// Serves until the test process ends, a thread per connection (a client that
    /// stalls holds up only its own, for at most 10 s).
    pub fn start(ca: &Ca) -> Issuer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let url = format!("https://{}/ci", listener.local_addr().expect("its address"));
        let key = JwtKey::new("ci-key-1");
        let discovery = serde_json::json!({
            "issuer": url,
            "jwks_uri": format!("{url}/jwks"),
        })
        .to_string();
        let jwks = serde_json::json!({"keys": [key.jwk()]}).to_string();
        let (chain, private) = ca.issue(100, "issuer", &["localhost"], true).rustls();
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_no_client_auth()
                .with_single_cert(chain, private)
                .expect("the issuer's certificate"),
        );
        let documents = Arc::new((discovery, jwks));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(tcp) = conn else { continue };
                let (config, documents) = (config.clone(), documents.clone());
                std::thread::spawn(move || serve(tcp, config, &documents.0, &documents.1));
            }
        });
        Issuer { url, key }
    }

    /// A job token with these claims besides `iss`.
    pub fn token(&self, mut claims: serde_json::Value) -> String {
        claims["iss"] = self.url.clone().into();
        self.key.sign(&claims)
    }
}

/// Answers one connection's one request: the discovery document, the JWKS, or 404.
fn serve(tcp: std::net::TcpStream, config: Arc<rustls::ServerConfig>, discovery: &str, jwks: &str) {
    let _ = tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let Ok(tls) = rustls::ServerConnection::new(config) else {
        return;
    };
    let mut stream = rustls::StreamOwned::new(tls, tcp);
    let Some(path) = request_path(&mut stream) else {
        return;
    };
    let body = match path.as_str() {
        "/ci/.well-known/openid-configuration" => Some(discovery),
        "/ci/jwks" => Some(jwks),
        _ => None,
    };
    let answer = match body {
        Some(b) => format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
            b.len()
        ),
        None => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into(),
    };
    let _ = stream.write_all(answer.as_bytes());
    stream.conn.send_close_notify();
    let _ = stream.flush();
}

/// The path of one request's head (read to its blank line, at most 16 KiB).
fn request_path(stream: &mut impl Read) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 || stream.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let line = String::from_utf8_lossy(&head);
    line.split_whitespace().nth(1).map(str::to_string)
}
