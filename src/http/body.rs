//! Request bodies and local replies: the shared body memory budget, bounded body
//! reads, and writing a finished [`Reply`] back to the client. Every local answer
//! (tofu, cluster, pass-through refusals) leaves through [`write_reply`].

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::Session;

use super::error::{EdgeError, HttpError};

/// A finished local response.
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    /// A body sent as it is produced instead of `body`: its length, then its pieces.
    /// An `Err` piece aborts the response (the connection closes short of the declared
    /// length, so the client sees an error, never a short body that looks whole).
    pub stream: Option<(u64, BodyStream)>,
    /// Why the request was refused, for the request's log line (the text the body
    /// carries: public, never a secret). Set by [`error_reply`].
    pub refusal: Option<String>,
}

pub type BodyStream = tokio::sync::mpsc::Receiver<Result<Bytes, crate::store::StoreError>>;

impl Reply {
    pub fn json(status: u16, body: impl Into<Bytes>) -> Reply {
        Reply {
            status,
            body: body.into(),
            content_type: "application/json",
            headers: Vec::new(),
            stream: None,
            refusal: None,
        }
    }

    /// A 200 whose body of `len` bytes is streamed.
    pub fn streamed(len: u64, stream: BodyStream) -> Reply {
        Reply {
            stream: Some((len, stream)),
            ..Reply::json(200, Bytes::new())
        }
    }

    pub fn empty() -> Reply {
        Reply::json(200, Bytes::new())
    }
}

/// How a local handler ended: what to send, how many body bytes it read (for the
/// log line), and whether the connection may be reused.
pub struct Handled {
    pub reply: Reply,
    pub bytes_in: usize,
    /// False when the request body was not consumed: the connection is closed rather
    /// than drained (the body may be huge).
    pub keepalive: bool,
    /// Budget held for the reply body until it has been written.
    pub held: Reservation,
}

impl Handled {
    /// A reply after the whole request body was read.
    pub fn done(reply: Reply, bytes_in: usize) -> Handled {
        Handled {
            reply,
            bytes_in,
            keepalive: true,
            held: Reservation::default(),
        }
    }

    /// Keeps `reservation` until the reply has been written.
    pub fn holding(mut self, reservation: Reservation) -> Handled {
        self.held = reservation;
        self
    }

    /// A reply that leaves the request body unread (answered before or instead of it).
    pub fn unread(reply: Reply) -> Handled {
        Handled {
            reply,
            bytes_in: 0,
            keepalive: false,
            held: Reservation::default(),
        }
    }
}

/// A handler's error, and how far it got with the request body.
pub struct Failure {
    pub error: EdgeError,
    pub bytes_in: usize,
    pub body_consumed: bool,
}

impl Failure {
    /// Refused before the body was read.
    pub fn early(error: impl Into<EdgeError>) -> Failure {
        Failure {
            error: error.into(),
            bytes_in: 0,
            body_consumed: false,
        }
    }

    /// Refused after reading all `bytes_in` bytes of the body.
    pub fn after_body<E: Into<EdgeError>>(bytes_in: usize) -> impl Fn(E) -> Failure {
        move |error| Failure {
            error: error.into(),
            bytes_in,
            body_consumed: true,
        }
    }
}

impl From<Failure> for Handled {
    fn from(f: Failure) -> Handled {
        Handled {
            reply: error_reply(&f.error),
            bytes_in: f.bytes_in,
            keepalive: f.body_consumed,
            held: Reservation::default(),
        }
    }
}

/// The JSON error reply for `e`; server-side failures are logged here, once.
pub fn error_reply(e: &(impl HttpError + std::fmt::Display)) -> Reply {
    let status = e.http_status();
    match e.log_detail() {
        Some(detail) if status >= 500 => tracing::error!(status, error = detail, "request failed"),
        _ => {}
    }
    Reply {
        refusal: Some(e.to_string()),
        ..Reply::json(status, e.body())
    }
}

/// Bounds the memory that bodies take at once, all requests together: a request body
/// reserves its bytes as they arrive (never a size it merely declares), and a state
/// being served reserves its size before it is read from the store. A reservation is
/// held until the reply is written. Accounted in KiB; never waits: when the budget is
/// spent the client is told to retry (429).
pub struct BodyBudget {
    kib: Arc<tokio::sync::Semaphore>,
    total_kib: u32,
    /// The most one streamed write holds: [`STREAM_RESERVE`] for its pipeline plus the
    /// blob store's write buffer (a 5 MiB part on S3).
    stream_hold: u64,
    /// What the blob store's sink collects before it writes out.
    store_write_buffer: u64,
}

/// A share of the [`BodyBudget`] that can grow; released on drop.
#[derive(Default)]
pub struct Reservation {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    kib: u32,
}

impl BodyBudget {
    /// `bytes` in all; a streamed write into a store whose sinks buffer
    /// `store_write_buffer` bytes holds up to that much more than its pipeline.
    pub fn new(bytes: u64, store_write_buffer: u64) -> Self {
        let total_kib = bytes.div_ceil(1024).clamp(1, u64::from(u32::MAX >> 3)) as u32;
        BodyBudget {
            kib: Arc::new(tokio::sync::Semaphore::new(total_kib as usize)),
            total_kib,
            stream_hold: STREAM_RESERVE + store_write_buffer,
            store_write_buffer,
        }
    }

    /// Grows `held`, a whole body's reservation, by the sealed copy the blob store
    /// collects while that body is written (at most its write buffer): a whole-body
    /// write holds both at once.
    pub fn hold_store_copy(&self, held: &mut Reservation, body_len: u64) -> Result<(), EdgeError> {
        let copy = body_len.min(self.store_write_buffer);
        self.grow(held, body_len + copy)
    }

    /// Bytes not reserved by any request now (whole KiB).
    pub fn available_bytes(&self) -> u64 {
        self.kib.available_permits() as u64 * 1024
    }

    /// A reservation covering `bytes`.
    pub fn reserve(&self, bytes: u64) -> Result<Reservation, EdgeError> {
        let mut reservation = Reservation::default();
        self.grow(&mut reservation, bytes)?;
        Ok(reservation)
    }

    /// Grows `reservation` to cover `bytes` in all.
    fn grow(&self, reservation: &mut Reservation, bytes: u64) -> Result<(), EdgeError> {
        let want = bytes.div_ceil(1024).min(u64::from(self.total_kib)) as u32;
        if want <= reservation.kib {
            return Ok(());
        }
        let more = self
            .kib
            .clone()
            .try_acquire_many_owned(want - reservation.kib)
            .map_err(|_| {
                EdgeError::Busy("too many large bodies in flight; retry shortly".into())
            })?;
        match &mut reservation.permit {
            Some(permit) => permit.merge(more),
            None => reservation.permit = Some(more),
        }
        reservation.kib = want;
        Ok(())
    }
}

/// How long a client may take to send a body: `timeout` plus one second per
/// `min_bytes_per_second` received, and at most `timeout` between two reads. A
/// client slower than that is cut off with 408 and costs nobody else anything.
/// Only time spent waiting for the client's bytes counts (see [`ClientWait`]).
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    pub timeout: std::time::Duration,
    pub min_bytes_per_second: u64,
}

impl BodyLimits {
    /// The total time a client may have kept us waiting once it sent `received` bytes.
    fn allowance(&self, received: u64) -> Duration {
        let rate = self.min_bytes_per_second.max(1);
        self.timeout + Duration::from_millis(received.saturating_mul(1000) / rate)
    }
}

/// The time a body's reads have spent waiting for the client. Time the server spends
/// not reading (sealing, writing to the store, a full channel under backpressure) is
/// not the client's: its bytes wait in the socket meanwhile, so a wall-clock deadline
/// would cut off a fast client behind a busy server.
#[derive(Debug, Default, Clone, Copy)]
struct ClientWait {
    waited: Duration,
}

impl ClientWait {
    /// How much longer the next read may wait, or `None` if the client is out of time.
    fn remaining(&self, limits: &BodyLimits, received: u64) -> Option<Duration> {
        limits
            .allowance(received)
            .checked_sub(self.waited)
            .filter(|left| !left.is_zero())
    }

    fn record(&mut self, waited: Duration) {
        self.waited += waited;
    }

    /// Awaits one read of the client's bytes within what is left of its allowance
    /// (`None`: out of time), counting the wait.
    async fn read<T>(
        &mut self,
        limits: &BodyLimits,
        received: u64,
        read: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let left = self.remaining(limits, received)?;
        let asked = tokio::time::Instant::now();
        let result = tokio::time::timeout(left, read).await.ok();
        self.record(asked.elapsed());
        result
    }
}

/// Reads the request body, refusing more than `limit` bytes without buffering past it,
/// reserving budget for each chunk as it arrives and cutting off clients slower than
/// `limits`. Answers `Expect: 100-continue` once the request has passed the checks
/// before it. The reservation must be held until the body is no longer needed.
pub async fn read_body(
    session: &mut Session,
    limit: u64,
    budget: &BodyBudget,
    limits: BodyLimits,
) -> Result<(Bytes, Reservation), EdgeError> {
    let declared = begin_body(session, limit, limits).await?;
    let mut wait = ClientWait::default();
    let mut reservation = Reservation::default();
    // Allocate at most 1 MiB up front: a declared length is a claim, not bytes received.
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0).min(limit).min(1 << 20) as usize);
    while let Some(chunk) = next_piece(session, limits, &mut wait, body.len() as u64).await? {
        let total = body.len() as u64 + chunk.len() as u64;
        if total > limit {
            return Err(EdgeError::PayloadTooLarge { limit });
        }
        budget.grow(&mut reservation, total)?;
        body.extend_from_slice(&chunk);
    }
    Ok((body.freeze(), reservation))
}

/// Budget a streamed body holds while it passes, besides the blob store's write buffer:
/// the pieces in the channel and the one being sealed (a served state: the pieces read
/// ahead and the ones verified).
pub const STREAM_RESERVE: u64 = 1 << 20;

/// Feeds the request body into `tx` piece by piece as it arrives (then `Ok(None)`),
/// with the same limits as [`read_body`]; a failure is sent as an `Err` so the writer
/// discards what it stored. Reserves budget for the bytes as they arrive, like
/// [`read_body`], but never more than a streamed write can hold at once (its pipeline
/// and the store's write buffer, see [`BodyBudget::new`]): older pieces are gone by then. Returns the bytes read and whether the
/// whole body was consumed.
pub async fn stream_body(
    session: &mut Session,
    limit: u64,
    budget: &BodyBudget,
    limits: BodyLimits,
    tx: tokio::sync::mpsc::Sender<Result<Option<Bytes>, EdgeError>>,
) -> (usize, bool) {
    let mut read = 0u64;
    let result = async {
        let mut held = Reservation::default();
        begin_body(session, limit, limits).await?;
        let mut wait = ClientWait::default();
        while let Some(chunk) = next_piece(session, limits, &mut wait, read).await? {
            read += chunk.len() as u64;
            if read > limit {
                return Err(EdgeError::PayloadTooLarge { limit });
            }
            budget.grow(&mut held, read.min(budget.stream_hold))?;
            if tx.send(Ok(Some(chunk))).await.is_err() {
                return Ok(false); // the writer stopped (and answers why)
            }
        }
        let _ = tx.send(Ok(None)).await;
        Ok(true)
    }
    .await;
    match result {
        Ok(consumed) => (read as usize, consumed),
        Err(e) => {
            let _ = tx.send(Err(e)).await;
            (read as usize, false)
        }
    }
}

/// Checks a declared length against `limit` and answers `Expect: 100-continue`.
async fn begin_body(
    session: &mut Session,
    limit: u64,
    limits: BodyLimits,
) -> Result<Option<u64>, EdgeError> {
    let headers = &session.req_header().headers;
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(EdgeError::PayloadTooLarge { limit });
    }
    let expects_continue = headers
        .get(http::header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    if expects_continue {
        session
            .as_downstream_mut()
            .write_continue_response()
            .await
            .map_err(|e| crate::error::Error::Invalid(format!("connection failed: {e}")))?;
    }
    session.set_read_timeout(Some(limits.timeout));
    Ok(declared)
}

/// The next piece of the body (`None` at its end), cutting off slow clients.
async fn next_piece(
    session: &mut Session,
    limits: BodyLimits,
    wait: &mut ClientWait,
    received: u64,
) -> Result<Option<Bytes>, EdgeError> {
    match wait
        .read(&limits, received, session.read_request_body())
        .await
    {
        None => Err(EdgeError::SlowClient),
        Some(Err(e)) if e.etype() == &pingora::ErrorType::ReadTimedout => {
            Err(EdgeError::SlowClient)
        }
        Some(Err(_)) => Err(crate::error::Error::Invalid(
            "request body could not be read (connection closed?)".into(),
        )
        .into()),
        Some(Ok(chunk)) => Ok(chunk),
    }
}

/// Writes a local response. When the request body was not consumed, the connection
/// is closed afterwards rather than drained (the body may be huge).
pub async fn write_reply(session: &mut Session, reply: Reply, keepalive: bool) -> Result<()> {
    let mut header = ResponseHeader::build(reply.status, Some(4))?;
    header.insert_header(http::header::CONTENT_TYPE, reply.content_type)?;
    let len = reply
        .stream
        .as_ref()
        .map_or(reply.body.len() as u64, |s| s.0);
    header.insert_header(http::header::CONTENT_LENGTH, len.to_string())?;
    header.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    for (name, value) in reply.headers {
        if name.eq_ignore_ascii_case("set-cookie") {
            // One header per cookie (RFC 6265); they must not replace each other.
            header.append_header(name, value)?;
        } else {
            header.insert_header(name, value)?;
        }
    }
    if !keepalive {
        session.set_keepalive(None);
        header.insert_header(http::header::CONNECTION, "close")?;
    }
    let is_head = session.req_header().method == http::Method::HEAD;
    let empty = len == 0 || is_head;
    session
        .write_response_header(Box::new(header), empty)
        .await?;
    if empty {
        return Ok(());
    }
    let Some((len, mut stream)) = reply.stream else {
        session.write_response_body(Some(reply.body), true).await?;
        return Ok(());
    };
    let mut sent = 0u64;
    while let Some(piece) = stream.recv().await {
        let piece = piece.map_err(|e| {
            // Logged once here; the client only sees the connection close early.
            let e = crate::error::Error::from(e);
            tracing::error!(
                error = e.log_detail().unwrap_or_default(),
                "state read failed mid-response; connection closed"
            );
            pingora::Error::explain(
                ErrorType::InternalError,
                "state failed verification mid-response",
            )
        })?;
        sent += piece.len() as u64;
        session
            .write_response_body(Some(piece), sent == len)
            .await?;
    }
    if sent != len {
        return Err(pingora::Error::explain(
            ErrorType::InternalError,
            "state ended short of its length",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: BodyLimits = BodyLimits {
        timeout: Duration::from_secs(2),
        min_bytes_per_second: 1000,
    };

    #[test]
    fn only_time_waiting_for_the_client_counts_against_its_allowance() {
        // (waits for the client in ms, bytes received, time left for the next read in ms)
        let cases: &[(&[u64], u64, Option<u64>)] = &[
            (&[], 0, Some(2000)),
            (&[1500], 0, Some(500)),
            (&[2000], 0, None),
            // Every 1000 bytes received buy one more second.
            (&[1500, 1000], 1000, Some(500)),
            (&[1500, 1000], 500, None),
            (&[10, 10, 10], 3000, Some(4970)),
        ];
        for &(waits, received, left) in cases {
            let mut wait = ClientWait::default();
            for &ms in waits {
                wait.record(Duration::from_millis(ms));
            }
            assert_eq!(
                wait.remaining(&LIMITS, received),
                left.map(Duration::from_millis),
                "{waits:?} {received}"
            );
        }
    }

    #[test]
    fn a_whole_body_write_holds_its_store_copy_too() {
        const KIB: u64 = 1024;
        // (budget, store write buffer, body, KiB taken by another request,
        //  held afterwards in KiB or None = refused)
        let cases: &[(u64, u64, u64, u64, Option<u64>)] = &[
            // The copy is the body's size up to the store's buffer.
            (1024, 256, 100, 0, Some(200)),
            (1024, 256, 400, 0, Some(656)),
            // What does not fit beside other requests is refused (429), not overdrawn.
            (1024, 256, 400, 500, None),
            // Alone, a body that fits the budget is never refused for its copy.
            (1024, 256, 900, 0, Some(1024)),
        ];
        for &(budget, buffer, body, taken, held) in cases {
            let b = BodyBudget::new(budget * KIB, buffer * KIB);
            let _other = b.reserve(taken * KIB).unwrap();
            let mut r = b.reserve(body * KIB).unwrap();
            let got = b
                .hold_store_copy(&mut r, body * KIB)
                .ok()
                .map(|()| r.kib as u64);
            assert_eq!(got, held, "{budget} {buffer} {body} {taken}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_busy_between_reads_does_not_use_up_the_clients_time() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut wait = ClientWait::default();
        let mut received = 0;
        for _ in 0..10 {
            // The client's piece is there at once...
            tx.send(vec![0u8; 100]).unwrap();
            let piece = wait.read(&LIMITS, received, rx.recv()).await;
            received += piece.flatten().expect("in time").len() as u64;
            // ...then the server spends far longer than the whole allowance sealing
            // and writing it.
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        // A client that then goes silent is cut off once its own allowance is used up.
        let started = tokio::time::Instant::now();
        assert!(wait.read(&LIMITS, received, rx.recv()).await.is_none());
        assert_eq!(started.elapsed(), LIMITS.allowance(received));
        assert_eq!(wait.remaining(&LIMITS, received), None);
    }
}
