//! The pass-through's refusals and the conditional-write guard, in process. The
//! upstream is a TCP listener that records every request it receives (so a test can
//! prove a refused request never reached it) and answers HEAD with 404 and anything
//! else with 200; the same attacks against real Garage, with controls sent straight
//! to Garage, are in `s3_garage.rs`.
//!
//! stategate only builds protection and the guard for an S3 store; here the store is
//! local and the test installs the same `Protection` / `ConditionalGuard` values that
//! `serve` builds for an S3 store, pointed at the recording upstream.

mod common;

use std::time::Duration;

use common::{raw_request, status_line_code, TestServer};
use stategate::config::S3Config;
use stategate::http::conditional::ConditionalGuard;
use stategate::http::upstream::Protection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// What the recording upstream saw.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// A request head arrived: its request line.
    Head(String),
    /// The connection ended: the request line and whether its whole body arrived.
    End { line: String, complete: bool },
}

struct Upstream {
    endpoint: String,
    seen: mpsc::UnboundedReceiver<Seen>,
}

impl Upstream {
    async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (tx, seen) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                tokio::spawn(serve_one(sock, tx.clone()));
            }
        });
        Upstream { endpoint, seen }
    }

    /// The next thing seen, waiting at most 10 s.
    async fn next(&mut self) -> Seen {
        tokio::time::timeout(Duration::from_secs(10), self.seen.recv())
            .await
            .expect("the upstream saw nothing in 10 s")
            .unwrap()
    }

    /// Request lines seen so far (heads only), without waiting.
    fn heads_so_far(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(seen) = self.seen.try_recv() {
            if let Seen::Head(line) = seen {
                out.push(line);
            }
        }
        out
    }
}

async fn serve_one(mut sock: TcpStream, tx: mpsc::UnboundedSender<Seen>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match sock.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let line = head.lines().next().unwrap_or_default().to_string();
    let _ = tx.send(Seen::Head(line.clone()));
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = buf.len() - head_end;
    while body < length {
        match sock.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body += n,
        }
    }
    let complete = body >= length;
    let _ = tx.send(Seen::End {
        line: line.clone(),
        complete,
    });
    if !complete {
        return;
    }
    let reply: &[u8] = if line.starts_with("HEAD ") {
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    } else {
        b"HTTP/1.1 200 OK\r\nETag: \"e1\"\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    };
    let _ = sock.write_all(reply).await;
    let _ = sock.shutdown().await;
}

const SIGNED: &str = "Authorization: AWS4-HMAC-SHA256 Credential=GK1/20261130/garage/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature=0123abcd\r\nx-amz-date: 20261130T000000Z\r\n";

/// One raw request (exact path and Host, no client-side normalization).
async fn send(
    s: &TestServer,
    method: &str,
    target: &str,
    host: &str,
    extra: &str,
    body: &str,
) -> (u16, String) {
    let base = &s.base;
    raw_request(
        base,
        &format!(
            "{method} {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
        None,
    )
    .await
}

fn host_of(s: &TestServer) -> String {
    s.base.trim_start_matches("http://").to_string()
}

async fn server(
    upstream: &Upstream,
    protection: Protection,
    adjust: impl FnOnce(&mut stategate::config::Config),
) -> TestServer {
    let endpoint = upstream.endpoint.clone();
    TestServer::start_with_app(
        move |c| {
            c.upstream.endpoint = Some(endpoint);
            c.upstream.root_domains = vec!["s3.lan".into()];
            adjust(c);
        },
        move |app| app.upstream.as_mut().unwrap().protection = protection,
    )
    .await
}

/// A server whose conditional guard checks objects at the recording upstream.
async fn guarded(upstream: &Upstream, wait_seconds: u64, hold_seconds: u64) -> TestServer {
    let endpoint = upstream.endpoint.clone();
    let store = S3Config {
        endpoint: upstream.endpoint.clone(),
        bucket: "tf".into(),
        access_key_id: "GK1".into(),
        secret_access_key: "secret".into(),
        ..S3Config::default()
    };
    TestServer::start_with_app(
        move |c| {
            c.upstream.endpoint = Some(endpoint);
            c.upstream.root_domains = vec!["s3.lan".into()];
        },
        move |app| {
            app.conditional = Some(ConditionalGuard::new(
                &store,
                None,
                Duration::from_secs(wait_seconds),
                Duration::from_secs(hold_seconds),
            ))
        },
    )
    .await
}

/// (method, request target, Host; `{me}` is stategate's own address, extra headers)
type Attack<'a> = (&'a str, &'a str, &'a str, &'a str);

/// Every attack is answered here with `status` and `code`, and never reaches the upstream.
async fn refused(
    s: &TestServer,
    upstream: &mut Upstream,
    attacks: &[Attack<'_>],
    status: u16,
    code: &str,
) {
    let me = host_of(s);
    for (method, target, host, extra) in attacks {
        let host = host.replace("{me}", &me);
        let (got, text) = send(s, method, target, &host, extra, "").await;
        assert_eq!(
            got, status,
            "{method} {target} Host: {host} {extra}\n{text}"
        );
        assert!(text.contains(&format!("<Code>{code}</Code>")), "{text}");
        assert_eq!(
            upstream.heads_so_far(),
            Vec::<String>::new(),
            "{method} {target} reached the upstream"
        );
    }
}

/// Every request is forwarded unchanged and answered by the upstream.
async fn forwarded(s: &TestServer, upstream: &mut Upstream, requests: &[Attack<'_>]) {
    let me = host_of(s);
    for (method, target, host, extra) in requests {
        let host = host.replace("{me}", &me);
        let (got, text) = send(s, method, target, &host, extra, "").await;
        // The upstream answers HEAD with 404, anything else with 200.
        let expected = if *method == "HEAD" { 404 } else { 200 };
        assert_eq!(got, expected, "{method} {target} Host: {host}\n{text}");
        assert_eq!(
            upstream.next().await,
            Seen::Head(format!("{method} {target} HTTP/1.1")),
            "{method} {target}"
        );
        let _ = upstream.next().await; // its end
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_is_not_ours_is_refused_rather_than_guessed() {
    let mut up = Upstream::start().await;
    let s = server(&up, Protection::Off, |c| {
        c.public_url = Some("https://stategate.lan:8443".into());
        c.upstream.hosts = vec!["alias.lan".into()];
    })
    .await;
    refused(
        &s,
        &mut up,
        &[
            ("GET", "/b/k", "evil.example", ""),
            ("GET", "/b/k", "10.9.8.7:8080", ""),
            ("GET", "/b/k", "s3.lan.evil", ""),
            ("GET", "/b/k", "127.0.0.1:1, evil", ""),
        ],
        400,
        "InvalidRequest",
    )
    .await;
    let (_, text) = send(&s, "GET", "/b/k", "evil.example", "", "").await;
    assert!(
        text.contains("upstream.hosts") && text.contains("upstream.root_domains"),
        "{text}"
    );
    forwarded(
        &s,
        &mut up,
        &[
            ("GET", "/b/k", "{me}", ""),
            ("GET", "/b/k", "localhost", ""),
            ("GET", "/b/k", "STATEGATE.lan:8443", ""),
            ("GET", "/b/k", "alias.lan", ""),
            ("GET", "/b/k", "s3.lan", ""),
            ("GET", "/k", "b.s3.lan", ""),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reserved_state_bucket_is_unreachable_in_every_addressing_form() {
    let mut up = Upstream::start().await;
    let protection = Protection::ReservedBucket {
        bucket: "tf".into(),
    };
    let s = server(&up, protection, |_| {}).await;
    refused(
        &s,
        &mut up,
        &[
            ("GET", "/tf/stategate/states/a.blob", "{me}", ""),
            ("DELETE", "/tf//stategate/states/a.blob", "{me}", ""),
            ("POST", "/tf//?delete", "{me}", ""),
            ("GET", "/tf?list-type=2", "{me}", ""),
            ("GET", "/tf?versions", "{me}", ""),
            ("GET", "/tf?uploads&prefix=x", "{me}", ""),
            ("PUT", "/tf?lifecycle", "{me}", ""),
            ("DELETE", "/tf", "{me}", ""),
            ("GET", "/TF/x", "{me}", ""),
            ("GET", "/%74f/x", "{me}", ""),
            ("GET", "/tf%2Fstategate%2Fx", "{me}", ""),
            ("GET", "/stategate/states/a.blob", "tf.s3.lan", ""),
            ("GET", "/?list-type=2", "TF.s3.lan:8080", ""),
            (
                "PUT",
                "/other/copy",
                "{me}",
                "x-amz-copy-source: tf/stategate/states/a.blob\r\n",
            ),
            (
                "PUT",
                "/other/copy?partNumber=1&uploadId=u",
                "{me}",
                "x-amz-copy-source: /tf%2Fstategate%2Fa?versionId=1\r\n",
            ),
            (
                "PUT",
                "/other/copy",
                "{me}",
                "x-amz-copy-source: TF/user.txt\r\n",
            ),
        ],
        403,
        "AccessDenied",
    )
    .await;
    forwarded(
        &s,
        &mut up,
        &[
            ("GET", "/other/stategate/x", "{me}", ""),
            ("GET", "/", "{me}", ""),
            ("GET", "/stategate/x", "other.s3.lan", ""),
            (
                "PUT",
                "/other/copy",
                "{me}",
                "x-amz-copy-source: other/tf/x\r\n",
            ),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_state_bucket_keeps_its_prefix_listings_and_copies() {
    let mut up = Upstream::start().await;
    let protection = Protection::SharedBucket {
        bucket: "tf".into(),
        prefix: "stategate/".into(),
    };
    let s = server(&up, protection, |_| {}).await;
    refused(
        &s,
        &mut up,
        &[
            // Key normalization: the slashes Garage and MinIO trim, encoded slashes, case.
            ("GET", "/tf//stategate/states/a.blob", "{me}", ""),
            ("DELETE", "/tf//stategate/states/a.blob", "{me}", ""),
            ("GET", "/tf/stategate%2Fstates/a.blob", "{me}", ""),
            ("GET", "/tf/%2Fstategate/states/a.blob", "{me}", ""),
            ("GET", "/tf/docs/../stategate/x", "{me}", ""),
            ("GET", "/tf/StateGate/x", "{me}", ""),
            ("GET", "/stategate/states/a.blob", "tf.s3.lan", ""),
            // Bulk delete, however addressed.
            ("POST", "/tf?delete", "{me}", ""),
            ("POST", "/tf//?delete", "{me}", ""),
            ("POST", "/?delete", "tf.s3.lan", ""),
            // Listings that could show the prefix.
            ("GET", "/tf", "{me}", ""),
            ("GET", "/tf?list-type=2", "{me}", ""),
            ("GET", "/tf?list-type=2&start-after=stategate/", "{me}", ""),
            ("GET", "/tf?marker=stategate/", "{me}", ""),
            ("GET", "/tf?list-type=2&prefix=state", "{me}", ""),
            ("GET", "/tf?list-type=2&Prefix=docs/", "{me}", ""),
            ("GET", "/tf?versions", "{me}", ""),
            ("GET", "/tf?uploads", "{me}", ""),
            ("GET", "/?list-type=2", "tf.s3.lan", ""),
            // Bucket-level writes.
            ("PUT", "/tf?lifecycle", "{me}", ""),
            ("PUT", "/tf?policy", "{me}", ""),
            ("DELETE", "/tf", "{me}", ""),
            ("POST", "/tf", "{me}", ""),
            // Copies out of and over the prefix.
            (
                "PUT",
                "/tf/docs/x",
                "{me}",
                "x-amz-copy-source: tf/stategate/states/a.blob\r\n",
            ),
            (
                "PUT",
                "/other/x",
                "{me}",
                "x-amz-copy-source: /tf//stategate/states/a.blob?versionId=1\r\n",
            ),
            (
                "PUT",
                "/other/x?partNumber=1&uploadId=u",
                "{me}",
                "x-amz-copy-source: tf%2Fstategate%2Fstates%2Fa.blob\r\n",
            ),
            (
                "PUT",
                "/tf/stategate/states/a.blob",
                "{me}",
                "x-amz-copy-source: tf/docs/x\r\n",
            ),
        ],
        403,
        "AccessDenied",
    )
    .await;
    forwarded(
        &s,
        &mut up,
        &[
            ("GET", "/tf/docs/x", "{me}", ""),
            ("PUT", "/tf/stategate", "{me}", ""),
            ("GET", "/tf?list-type=2&prefix=docs%2F", "{me}", ""),
            ("GET", "/tf?versions&prefix=docs/", "{me}", ""),
            ("GET", "/?list-type=2&prefix=docs/", "tf.s3.lan", ""),
            ("HEAD", "/tf", "{me}", ""),
            ("GET", "/tf?location", "{me}", ""),
            (
                "PUT",
                "/tf/docs/y",
                "{me}",
                "x-amz-copy-source: tf/docs/x\r\n",
            ),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsigned_conditional_write_learns_nothing() {
    let mut up = Upstream::start().await;
    let s = guarded(&up, 10, 30).await;
    for (target, extra) in [
        ("/tf/locks/a.tflock", "If-None-Match: *\r\n"),
        ("/tf/locks/a.tflock", "If-Match: \"e1\"\r\n"),
        (
            "/tf/locks/a.tflock",
            "If-None-Match: *\r\nAuthorization: AWS4-HMAC-SHA256\r\n",
        ),
        (
            "/tf/locks/a.tflock",
            "If-None-Match: *\r\nAuthorization: Bearer x\r\n",
        ),
    ] {
        let (status, text) = send(&s, "PUT", target, &host_of(&s), extra, "lock").await;
        assert_eq!(status, 403, "{extra}: {text}");
        assert!(
            text.contains("<Code>AccessDenied</Code>") && text.contains("signed"),
            "{text}"
        );
        // Refused before the object was looked at.
        assert_eq!(up.heads_so_far(), Vec::<String>::new());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_checks_the_exact_object_the_upstream_writes() {
    let mut up = Upstream::start().await;
    let s = guarded(&up, 10, 30).await;
    let me = host_of(&s);
    // (request target, Host, the object the guard must look at)
    let table = [
        (
            "/tf/locks/a%26b.tflock",
            me.as_str(),
            "HEAD /tf/locks/a%26b.tflock HTTP/1.1",
        ),
        (
            "/tf/locks/a&b.tflock",
            me.as_str(),
            "HEAD /tf/locks/a%26b.tflock HTTP/1.1",
        ),
        (
            "/tf/locks/a+b.tflock",
            me.as_str(),
            "HEAD /tf/locks/a%2Bb.tflock HTTP/1.1",
        ),
        (
            "/locks/v.tflock",
            "tf.s3.lan",
            "HEAD /tf/locks/v.tflock HTTP/1.1",
        ),
    ];
    for (target, host, head) in table {
        let extra = format!("{SIGNED}If-None-Match: *\r\n");
        let (status, text) = send(&s, "PUT", target, host, &extra, "lock").await;
        assert_eq!(status, 200, "{target}: {text}");
        assert_eq!(up.next().await, Seen::Head(head.into()), "{target}");
        let _ = up.next().await;
        assert_eq!(
            up.next().await,
            Seen::Head(format!("PUT {target} HTTP/1.1"))
        );
        let _ = up.next().await;
    }
    // A key the upstream may read two ways cannot be guarded: refused, not guessed.
    let extra = format!("{SIGNED}If-None-Match: *\r\n");
    let (status, text) = send(&s, "PUT", "/tf//locks/x.tflock", &me, &extra, "lock").await;
    assert_eq!(status, 400, "{text}");
    assert_eq!(up.heads_so_far(), Vec::<String>::new());
}

/// Starts a signed conditional PUT that declares 10 body bytes and sends 3, and
/// returns once the upstream has it (so it holds the key's turn).
async fn stalled_put(s: &TestServer, up: &mut Upstream, target: &str) -> TcpStream {
    let mut sock = TcpStream::connect(host_of(s)).await.unwrap();
    let head = format!(
        "PUT {target} HTTP/1.1\r\nHost: {}\r\n{SIGNED}If-None-Match: *\r\nContent-Length: 10\r\n\r\nabc",
        host_of(s)
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    assert!(matches!(up.next().await, Seen::Head(l) if l.starts_with("HEAD ")));
    let _ = up.next().await;
    assert_eq!(
        up.next().await,
        Seen::Head(format!("PUT {target} HTTP/1.1"))
    );
    sock
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_writer_makes_others_wait_a_bounded_time_on_its_key_only() {
    let mut up = Upstream::start().await;
    let s = guarded(&up, 1, 30).await;
    let _stalled = stalled_put(&s, &mut up, "/tf/locks/k.tflock").await;
    let extra = format!("{SIGNED}If-None-Match: *\r\n");
    let started = std::time::Instant::now();
    let (status, text) = send(
        &s,
        "PUT",
        "/tf/locks/k.tflock",
        &host_of(&s),
        &extra,
        "lock",
    )
    .await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("<Code>SlowDown</Code>"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // Another key, even one sharing the prefix, never waits for it.
    let (status, text) = send(&s, "PUT", "/tf/locks/k", &host_of(&s), &extra, "lock").await;
    assert_eq!(status, 200, "{text}");
}

/// Both of a key's PUTs reached the upstream; only the second writer's body completed.
async fn only_the_second_put_completed(up: &mut Upstream, target: &str) {
    let mut ends = Vec::new();
    while ends.len() < 2 {
        if let Seen::End { line, complete } = up.next().await {
            if line == format!("PUT {target} HTTP/1.1") {
                ends.push(complete);
            }
        }
    }
    ends.sort();
    assert_eq!(ends, vec![false, true]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_writer_loses_its_turn_and_its_write() {
    let mut up = Upstream::start().await;
    let s = guarded(&up, 10, 1).await;
    let target = "/tf/locks/k.tflock";
    let mut stalled = stalled_put(&s, &mut up, target).await;
    // The next writer gets the turn once the silent one's hold has run out.
    let extra = format!("{SIGNED}If-None-Match: *\r\n");
    let (status, text) = send(&s, "PUT", target, &host_of(&s), &extra, "lock").await;
    assert_eq!(status, 200, "{text}");
    // The silent writer is told, without sending anything more.
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stalled.read_to_end(&mut answer));
    read.await
        .expect("the silent writer got no answer")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(status_line_code(&answer), 408, "{answer}");
    assert!(answer.contains("<Code>RequestTimeout</Code>"), "{answer}");
    only_the_second_put_completed(&mut up, target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_writer_loses_its_turn_and_its_late_body_never_lands() {
    let mut up = Upstream::start().await;
    let s = guarded(&up, 10, 1).await;
    let target = "/tf/locks/k.tflock";
    let mut slow = stalled_put(&s, &mut up, target).await;
    // Seven more bytes, one every 250 ms: never silent for the 1 s limit, but the
    // whole body takes longer than the hold.
    let trickle = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.tick().await;
        for byte in b"defghij" {
            tick.tick().await;
            if slow.write_all(&[*byte]).await.is_err() {
                break;
            }
        }
        let mut answer = Vec::new();
        let _ = slow.read_to_end(&mut answer).await;
        String::from_utf8_lossy(&answer).to_string()
    });
    let extra = format!("{SIGNED}If-None-Match: *\r\n");
    let (status, text) = send(&s, "PUT", target, &host_of(&s), &extra, "lock").await;
    assert_eq!(status, 200, "{text}");
    let answer = trickle.await.unwrap();
    assert_eq!(status_line_code(&answer), 408, "{answer}");
    only_the_second_put_completed(&mut up, target).await;
}
