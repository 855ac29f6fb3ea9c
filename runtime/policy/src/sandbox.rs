//! The per-instance host state: WASI with nothing granted, a memory cap, captured output, and
//! the `host.log` import, whose lines go to the job's events.

use std::sync::{Arc, Mutex};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::{host, types};

/// Severity of a policy's log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// Where a policy's log lines and output go: the job's log and events.
pub trait PolicyEvents: Send + Sync {
    fn log(&self, level: Level, message: &str);
}

/// Logs a policy's lines with `tracing`, attributed to a job.
pub struct TracingEvents {
    pub job: String,
}

impl PolicyEvents for TracingEvents {
    fn log(&self, level: Level, message: &str) {
        let job = self.job.as_str();
        match level {
            Level::Trace => tracing::trace!(job, "policy: {message}"),
            Level::Debug => tracing::debug!(job, "policy: {message}"),
            Level::Info => tracing::info!(job, "policy: {message}"),
            Level::Warn => tracing::warn!(job, "policy: {message}"),
            Level::Error => tracing::error!(job, "policy: {message}"),
        }
    }
}

/// Lines a policy may log per call; more are dropped and counted.
pub const MAX_LOG_LINES_PER_CALL: u32 = 100;
/// Longest log line kept, in bytes; longer ones are cut.
pub const MAX_LOG_LINE_BYTES: usize = 4096;
/// Output (stdout + stderr) kept per call, in bytes.
const MAX_OUTPUT_BYTES: usize = 64 * 1024;

pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(super) limiter: MemoryLimiter,
    events: Arc<dyn PolicyEvents>,
    log_lines_left: u32,
    log_lines_dropped: u32,
    stdout: CapturedOutput,
    stderr: CapturedOutput,
    /// The lines of the batch being split, taken by the `batch-data.lines` import.
    pub(super) batch: Option<(Vec<u8>, Vec<u32>)>,
}

impl HostState {
    pub fn new(events: Arc<dyn PolicyEvents>, memory_mib: u64) -> Self {
        let stdout = CapturedOutput::default();
        let stderr = CapturedOutput::default();
        // No preopened directories, no environment, no arguments, no network.
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        HostState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(memory_mib),
            events,
            log_lines_left: MAX_LOG_LINES_PER_CALL,
            log_lines_dropped: 0,
            stdout,
            stderr,
            batch: None,
        }
    }

    pub(super) fn begin_call(&mut self) {
        self.log_lines_left = MAX_LOG_LINES_PER_CALL;
        self.log_lines_dropped = 0;
        self.limiter.exceeded = false;
    }

    /// Forwards what the call printed to the job's events; returns the stderr text (where a
    /// panic message lands).
    pub(super) fn end_call(&mut self) -> String {
        self.batch = None;
        if self.log_lines_dropped > 0 {
            let dropped = self.log_lines_dropped;
            self.events.log(
                Level::Warn,
                &format!("{dropped} more log lines dropped (limit {MAX_LOG_LINES_PER_CALL} per call)"),
            );
        }
        for line in self.stdout.take().lines().filter(|l| !l.trim().is_empty()) {
            self.events.log(Level::Info, &format!("stdout: {line}"));
        }
        let stderr = self.stderr.take();
        for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
            self.events.log(Level::Warn, &format!("stderr: {line}"));
        }
        stderr
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl host::Host for HostState {
    fn log(&mut self, level: types::Level, message: String) {
        if self.log_lines_left == 0 {
            self.log_lines_dropped += 1;
            return;
        }
        self.log_lines_left -= 1;
        let level = match level {
            types::Level::Trace => Level::Trace,
            types::Level::Debug => Level::Debug,
            types::Level::Info => Level::Info,
            types::Level::Warn => Level::Warn,
            types::Level::Error => Level::Error,
        };
        self.events.log(level, truncate(&message, MAX_LOG_LINE_BYTES));
    }
}

impl types::Host for HostState {}

impl super::bindings::batch_data::Host for HostState {
    fn lines(&mut self) -> super::bindings::batch_data::PackedLines {
        let (data, ends) = self.batch.take().unwrap_or_default();
        super::bindings::batch_data::PackedLines { data, ends }
    }
}

/// Cuts `text` to at most `max` bytes, on a character boundary.
pub fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Caps the linear memory of a policy instance, all its memories together; growing past the
/// cap traps with a message naming it. Also bounds how many instances, tables and memories a
/// component may create.
pub struct MemoryLimiter {
    max_bytes: usize,
    /// Bytes of linear memory in use across the instance's memories.
    used: usize,
    pub(super) mib: u64,
    /// Set when the cap stopped a growth during the current call.
    pub(super) exceeded: bool,
}

impl MemoryLimiter {
    fn new(mib: u64) -> Self {
        MemoryLimiter { max_bytes: usize::try_from(mib << 20).unwrap_or(usize::MAX), used: 0, mib, exceeded: false }
    }
}

/// Core instances, tables and memories a policy component may create (a Rust component uses a
/// handful).
const MAX_PARTS: usize = 64;

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let total = self.used.saturating_sub(current).saturating_add(desired);
        if total > self.max_bytes {
            self.exceeded = true;
            return Err(wasmtime::format_err!(
                "policy memory limit of {} MiB exceeded (growing to {} bytes)",
                self.mib,
                total
            ));
        }
        self.used = total;
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }

    fn instances(&self) -> usize {
        MAX_PARTS
    }

    fn tables(&self) -> usize {
        MAX_PARTS
    }

    fn memories(&self) -> usize {
        MAX_PARTS
    }
}

/// A stdout or stderr that keeps what the plugin writes, up to a cap, and never traps.
#[derive(Clone, Default)]
struct CapturedOutput(Arc<Mutex<Vec<u8>>>);

impl CapturedOutput {
    fn append(&self, bytes: &[u8]) {
        let mut buffer = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let room = MAX_OUTPUT_BYTES.saturating_sub(buffer.len());
        buffer.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn take(&self) -> String {
        let mut buffer = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let text = String::from_utf8_lossy(&buffer).into_owned();
        buffer.clear();
        text
    }
}

impl IsTerminal for CapturedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CapturedOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for CapturedOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for CapturedOutput {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.append(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
