//! Where the process's log lines go: stderr, written by a thread of its own. A
//! request's thread only queues its line (the access log has one per request), so a
//! reader of stderr that stalls (a full pipe to a container's log driver) cannot stall
//! requests. When the queue is full, lines are dropped rather than waited for: the
//! audit log, in the index, is the durable record of what happened.

use std::sync::Mutex;

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};

/// Lines queued for stderr at most (about 2 MB of access log).
const QUEUED_LINES: usize = 8192;

/// Flushes the queue when taken and dropped ([`flush`]).
static FLUSH: Mutex<Option<WorkerGuard>> = Mutex::new(None);

/// Installs the global subscriber: `STATEGATE_LOG` if set, else `default_level`.
pub fn init(default_level: &str) {
    let (stderr, guard) = NonBlockingBuilder::default()
        .buffered_lines_limit(QUEUED_LINES)
        .lossy(true)
        .thread_name("stategate-log")
        .finish(std::io::stderr());
    *FLUSH.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STATEGATE_LOG")
                .unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Writes out every queued line; call before the process exits (lines logged after
/// it are dropped).
pub fn flush() {
    let guard = FLUSH.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(guard);
}
