//! Pass-through behaviour against misbehaving upstreams. The upstream here is a raw
//! TCP listener we script byte by byte, because a real S3 server cannot be made to
//! reset mid-body or hang on demand; the happy path runs against real Garage in
//! `s3_garage.rs`.

mod common;

use std::time::{Duration, Instant};

use common::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Accepts one connection, records the request head, then plays `script`.
async fn scripted_upstream(
    script: &'static [u8],
    hang: bool,
) -> (String, tokio::task::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = sock.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        if hang {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        let _ = sock.write_all(script).await;
        let _ = sock.shutdown().await;
        String::from_utf8_lossy(&head).to_string()
    });
    (endpoint, task)
}

async fn server_for(endpoint: String, read_timeout: u64) -> TestServer {
    TestServer::start_with(move |c| {
        c.upstream.endpoint = Some(endpoint);
        c.upstream.read_timeout_seconds = read_timeout;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_forwarded_unchanged_and_upstream_errors_pass_back() {
    let (endpoint, upstream) = scripted_upstream(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\nContent-Length: 46\r\n\r\n<Error><Code>SlowDown</Code></Error>\n\n\n\n\n\n\n\n\n\n",
        false,
    )
    .await;
    let s = server_for(endpoint, 5).await;
    let auth = "AWS4-HMAC-SHA256 Credential=GKx/20261130/garage/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc";
    let resp = reqwest::Client::new()
        .get(format!(
            "{}/bucket/dir/key.txt?list-type=2&prefix=a%2Fb",
            s.base
        ))
        .header("Authorization", auth)
        .header("x-amz-date", "20261130T000000Z")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert!(resp.text().await.unwrap().contains("<Code>SlowDown</Code>"));
    let head = upstream.await.unwrap();
    let host = s.base.trim_start_matches("http://");
    assert!(
        head.starts_with("GET /bucket/dir/key.txt?list-type=2&prefix=a%2Fb HTTP/1.1\r\n"),
        "{head}"
    );
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.contains(&format!("host: {host}\r\n")),
        "Host must be kept: {head}"
    );
    assert!(head.contains(auth), "Authorization must be kept: {head}");
    assert!(lower.contains("x-amz-date: 20261130t000000z"), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_reset_mid_body_is_an_error_not_a_short_success() {
    let (endpoint, _upstream) = scripted_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly-a-few-bytes",
        false,
    )
    .await;
    let s = server_for(endpoint, 5).await;
    let started = Instant::now();
    let result = async {
        let resp = reqwest::Client::new()
            .get(format!("{}/bucket/key", s.base))
            .send()
            .await?;
        resp.bytes().await
    }
    .await;
    assert!(
        result.is_err(),
        "a truncated body must not look complete: {result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // The gateway itself is unaffected.
    let health = reqwest::get(format!("{}/healthz", s.base)).await.unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_upstream_times_out_with_a_502() {
    let (endpoint, _upstream) = scripted_upstream(b"", true).await;
    let s = server_for(endpoint, 1).await;
    let started = Instant::now();
    let resp = reqwest::Client::new()
        .get(format!("{}/bucket/key", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    assert!(resp
        .text()
        .await
        .unwrap()
        .contains("<Error><Code>BadGateway</Code>"));
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_html_object_is_served_sandboxed_whatever_its_headers_say() {
    // An object a bucket writer chose: HTML with a script, its own lax policy, a
    // sniffing permission and a cookie for the UI's path.
    const PAGE: &[u8] = b"<html><script>fetch('/ui/')</script></html>";
    let (endpoint, upstream) = scripted_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Security-Policy: script-src *\r\nX-Content-Type-Options: sniff\r\nSet-Cookie: sg_session=planted; Path=/ui\r\nContent-Length: 43\r\n\r\n<html><script>fetch('/ui/')</script></html>",
        false,
    )
    .await;
    let s = server_for(endpoint, 5).await;
    let resp = reqwest::Client::new()
        .get(format!("{}/user-bucket/x.html", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let all = |name: &str| -> Vec<String> {
        resp.headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    };
    // A browser enforces every policy it gets: the sandbox holds beside the upstream's.
    assert_eq!(
        all("content-security-policy"),
        vec!["script-src *", "sandbox"]
    );
    assert_eq!(all("x-content-type-options"), vec!["nosniff"]);
    assert!(
        all("set-cookie").is_empty(),
        "no cookie planted on the UI's origin"
    );
    assert!(all("strict-transport-security").is_empty(), "plain HTTP");
    assert_eq!(
        all("content-type"),
        vec!["text/html"],
        "the bytes are unchanged"
    );
    assert_eq!(&resp.bytes().await.unwrap()[..], PAGE);
    upstream.await.unwrap();
}
