//! The edge's shell of the link: connect, resend the outbox, apply the desired state, keep the
//! connection alive, and connect again after any failure. Every decision is the core's
//! ([`Sender`], [`DesiredReceiver`], [`Heartbeat`]); the durable state is the edge's SQLite
//! behind [`EdgeState`]. While the cloud is unreachable the edge goes on from that state and
//! reports wait in the outbox.
//!
//! An agent that says its policy platform in its hello, and has [`Downloads`], also fetches
//! artifacts in its sessions: each request the downloads queue is written as an `artifactGet`,
//! and the operator's answers go back to them.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{Notify, watch};
use tokio_rustls::rustls::ClientConfig;

use super::artifacts::{ArtifactRequest, Downloads};
use super::desired::{Changes, DesiredReceiver};
use super::handshake::hello;
use super::heartbeat::{Heartbeat, HeartbeatAction};
use super::messages::{MAX_FRAME_BYTES, Message, PolicyPlatform};
use super::sender::{Delete, SendError, Sender};
use super::socket::{self, ClientStream, LinkError};
use super::until_true;

/// The edge's durable side of the link (its SQLite store). Calls are short and synchronous.
pub trait EdgeState: Send + 'static {
    /// The highest seq the outbox ever numbered (0 if none).
    fn allocated(&mut self) -> Result<u64, String>;
    /// Up to `limit` outbox rows with a seq above `after`, by seq.
    fn fetch(&mut self, after: u64, limit: usize) -> Result<Vec<(u64, Value)>, String>;
    fn delete(&mut self, delete: Delete) -> Result<(), String>;
    /// Moves every outbox row above `floor`, in order (the cloud holds a watermark from a
    /// replaced database of this node).
    fn renumber_above(&mut self, floor: u64) -> Result<(), String>;
    /// The seq of the last desired state committed.
    fn last_applied_desired(&mut self) -> Result<u64, String>;
    /// The job and dataset keys held now.
    fn held(&mut self) -> Result<(BTreeSet<String>, BTreeSet<String>), String>;
    /// Commits `changes` and their seq in one transaction.
    fn apply_desired(&mut self, changes: &Changes) -> Result<(), String>;
}

/// Where and how to connect.
#[derive(Clone)]
pub struct ClientSettings {
    /// `wss://host:port/path`.
    pub url: String,
    /// The name the link's certificate must carry when the URL's host is not it (an address,
    /// a tunnel, a NodePort); `None`: the URL's host.
    pub server_name: Option<String>,
    pub token: TokenSource,
    pub tls: Arc<ClientConfig>,
    pub node: String,
    /// First wait after a failed connection; it doubles up to `max_backoff`.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// What this node runs policies on, said in the hello; `None`: nothing said (as an older
    /// agent), and no artifacts fetched.
    pub policy_platform: Option<PolicyPlatform>,
    /// Where artifacts are fetched to; the sessions fetch them when `policy_platform` is said.
    pub downloads: Option<Arc<Downloads>>,
}

/// Where the edge's bearer token comes from.
#[derive(Clone, Debug)]
pub enum TokenSource {
    /// A token given once.
    Fixed(String),
    /// A file read again on every (re)connect: a projected ServiceAccount token, which the
    /// kubelet rotates, or a static token an operator may replace.
    File(PathBuf),
}

/// The most a token file may hold, in bytes (a projected ServiceAccount token is about 1 KiB).
pub const MAX_TOKEN_BYTES: u64 = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("token file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("token file {path}: {message}")]
    Invalid { path: String, message: String },
}

impl From<&str> for TokenSource {
    fn from(token: &str) -> TokenSource {
        TokenSource::Fixed(token.to_owned())
    }
}

impl From<String> for TokenSource {
    fn from(token: String) -> TokenSource {
        TokenSource::Fixed(token)
    }
}

impl TokenSource {
    /// The token now, trimmed; a file is read again (bounded in size).
    pub async fn read(&self) -> Result<String, TokenError> {
        let path = match self {
            TokenSource::Fixed(token) => return Ok(token.trim().to_owned()),
            TokenSource::File(path) => path,
        };
        let shown = || path.display().to_string();
        let file = tokio::fs::File::open(path).await.map_err(|source| TokenError::Read { path: shown(), source })?;
        let mut bytes = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::AsyncReadExt::take(file, MAX_TOKEN_BYTES + 1), &mut bytes)
            .await
            .map_err(|source| TokenError::Read { path: shown(), source })?;
        if bytes.len() as u64 > MAX_TOKEN_BYTES {
            return Err(TokenError::Invalid { path: shown(), message: format!("over {MAX_TOKEN_BYTES} bytes") });
        }
        let token = String::from_utf8(bytes)
            .map_err(|_| TokenError::Invalid { path: shown(), message: "not UTF-8 text".into() })?;
        let token = token.trim();
        if token.is_empty() {
            return Err(TokenError::Invalid { path: shown(), message: "the file is empty".into() });
        }
        Ok(token.to_owned())
    }
}

/// What the shell tells the rest of the agent.
pub trait LinkEvents: Send + Sync {
    /// A desired state was committed: look at the jobs again.
    fn desired_applied(&self, changes: &Changes);
    /// Connected (true) or not.
    fn connected(&self, _up: bool) {}
    /// The operator refused report `seq` for good (it is dropped from the outbox).
    fn rejected(&self, _seq: u64, _reason: &str) {}
}

/// Runs the link until `stop` turns true. `outbox` is notified whenever a report is queued.
pub async fn run<S: EdgeState>(
    settings: ClientSettings,
    state: Arc<Mutex<S>>,
    outbox: Arc<Notify>,
    events: Arc<dyn LinkEvents>,
    mut stop: watch::Receiver<bool>,
) {
    let mut sender = Sender::new();
    let mut backoff = settings.min_backoff;
    while !*stop.borrow() {
        let mut session_stop = stop.clone();
        let mut established = false;
        let ended = tokio::select! {
            ended = session(&settings, &state, &outbox, events.as_ref(), &mut sender, &mut session_stop, &mut established) => ended,
            _ = until_true(&mut stop) => Ok(()),
        };
        sender.disconnected();
        if let Some(downloads) = &settings.downloads {
            downloads.disconnected();
        }
        events.connected(false);
        match ended {
            Ok(()) if *stop.borrow() => break,
            Ok(()) => tracing::warn!(url = settings.url, "the link closed; connecting again"),
            Err(err) => tracing::warn!(url = settings.url, "the link is down: {err}"),
        }
        // A session that was welcomed starts the backoff over: an operator that restarts (or
        // fails over) is reached again in moments, not after a wait doubled by earlier outages.
        // Failed connects in a row still double it.
        if established {
            backoff = settings.min_backoff;
        }
        let wait = jittered(backoff);
        backoff = (backoff * 2).min(settings.max_backoff);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = until_true(&mut stop) => break,
        }
    }
}

/// `wait` less up to a quarter, so that a thousand nodes cut at once do not return at once.
fn jittered(wait: Duration) -> Duration {
    let mut byte = [0u8; 1];
    let _ = getrandom::fill(&mut byte);
    wait - wait / 4 * u32::from(byte[0]) / 255
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("{0}")]
    Protocol(String),
    #[error("edge state: {0}")]
    State(String),
    #[error("no frame from the operator for two heartbeat intervals ({0:?} each): the connection is dead")]
    Silent(Duration),
}

impl From<SendError> for SessionError {
    fn from(err: SendError) -> Self {
        SessionError::Protocol(err.to_string())
    }
}

/// Runs `call` on the state, off the async threads (the jobs thread may hold the store a while).
async fn with_state<S: EdgeState, T: Send + 'static>(
    state: &Arc<Mutex<S>>,
    call: impl FnOnce(&mut S) -> Result<T, String> + Send + 'static,
) -> Result<T, SessionError> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || {
        let mut state = state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        call(&mut state)
    })
    .await
    .map_err(|err| SessionError::State(err.to_string()))?
    .map_err(SessionError::State)
}

/// One connection, from `hello` to its end.
async fn session<S: EdgeState>(
    settings: &ClientSettings,
    state: &Arc<Mutex<S>>,
    outbox: &Notify,
    events: &dyn LinkEvents,
    sender: &mut Sender,
    stop: &mut watch::Receiver<bool>,
    established: &mut bool,
) -> Result<(), SessionError> {
    let mut desired = DesiredReceiver::new(with_state(state, |s| s.last_applied_desired()).await?);
    let greeting = hello(&settings.node, desired.last_applied(), settings.policy_platform.clone());
    // Read on every connect: the kubelet rotates a projected token.
    let token = settings.token.read().await?;
    let (welcomed, mut ws) =
        socket::connect(&settings.url, settings.server_name.as_deref(), &token, settings.tls.clone(), &greeting)
            .await?;
    let allocated = with_state(state, |s| s.allocated()).await?;
    let resume = match sender.connected(welcomed.last_applied_report, allocated) {
        Err(SendError::CloudAhead { cloud, .. }) => {
            tracing::warn!("the operator holds reports of an earlier database of this node: renumbering the outbox");
            with_state(state, move |s| s.renumber_above(cloud)).await?;
            return Err(SessionError::Protocol("outbox renumbered above the operator's watermark".into()));
        }
        resumed => resumed?,
    };
    if let Some(delete) = resume {
        with_state(state, move |s| s.delete(delete)).await?;
    }
    desired.connected();
    // Only an edge that said its platform may ask (an older operator would not know the frame).
    let artifacts = settings.downloads.as_deref().filter(|_| settings.policy_platform.is_some());
    if let Some(downloads) = artifacts {
        downloads.connected();
    }
    *established = true;
    events.connected(true);
    tracing::info!(url = settings.url, node = settings.node, "link up");
    let epoch = Instant::now();
    let mut heartbeat = Heartbeat::new(welcomed.heartbeat, epoch.elapsed());
    let write_limit = welcomed.heartbeat * 2;
    loop {
        send_outbox(state, sender, &mut ws, write_limit).await?;
        let next_poll = tokio::time::Instant::from_std(epoch + heartbeat.next_poll());
        tokio::select! {
            frame = socket::recv(&mut ws) => {
                let Some(frame) = frame? else { return Ok(()) };
                heartbeat.received(epoch.elapsed());
                if let Some(frame) = artifact_answer(frame, artifacts).await?
                    && let Some(answer) = handle(frame, state, sender, &mut desired, &mut heartbeat, epoch, events).await?
                {
                    write(&mut ws, &answer, write_limit).await?;
                }
            }
            request = next_artifact_request(artifacts) => {
                let ArtifactRequest { sha256, offset } = request;
                write(&mut ws, &Message::ArtifactGet { sha256, offset }, write_limit).await?;
            }
            _ = outbox.notified() => {}
            _ = tokio::time::sleep_until(next_poll) => match heartbeat.poll(epoch.elapsed()) {
                HeartbeatAction::SendPing(nonce) => write(&mut ws, &Message::Ping { nonce }, write_limit).await?,
                HeartbeatAction::Dead => return Err(SessionError::Silent(welcomed.heartbeat)),
                HeartbeatAction::Nothing => {}
            },
            _ = until_true(stop) => {
                let _ = ws.close(None).await;
                return Ok(());
            }
        }
    }
}

/// One frame from the cloud; returns the answer to write, if any.
async fn handle<S: EdgeState>(
    frame: Message,
    state: &Arc<Mutex<S>>,
    sender: &mut Sender,
    desired: &mut DesiredReceiver,
    heartbeat: &mut Heartbeat,
    epoch: Instant,
    events: &dyn LinkEvents,
) -> Result<Option<Message>, SessionError> {
    match frame {
        Message::Ack { seq } => {
            if let Some(delete) = sender.ack(seq)? {
                with_state(state, move |s| s.delete(delete)).await?;
            }
            Ok(None)
        }
        Message::Reject { seq, reason } => {
            tracing::warn!(seq, "the operator refused a report; it is dropped: {reason}");
            events.rejected(seq, &reason);
            let delete = sender.reject(seq)?;
            with_state(state, move |s| s.delete(delete)).await?;
            Ok(None)
        }
        frame @ Message::Desired { .. } => {
            let held = with_state(state, |s| s.held()).await?;
            let changes = desired
                .receive(&frame, &held.0, &held.1)
                .map_err(|err| SessionError::Protocol(format!("desired state: {err}")))?;
            let committed = changes.clone();
            with_state(state, move |s| s.apply_desired(&committed)).await?;
            events.desired_applied(&changes);
            Ok(Some(desired.applied(changes.seq)))
        }
        Message::Ping { nonce } => Ok(Some(Message::Pong { nonce })),
        Message::Pong { nonce } => {
            heartbeat.pong(nonce, epoch.elapsed());
            Ok(None)
        }
        other => Err(SessionError::Protocol(format!("the operator sent a {} frame mid-connection", other.kind()))),
    }
}

/// The next artifact request to write; never, in a session that fetches no artifacts.
async fn next_artifact_request(artifacts: Option<&Downloads>) -> ArtifactRequest {
    match artifacts {
        Some(downloads) => downloads.next_request().await,
        None => std::future::pending().await,
    }
}

/// Hands the operator's answer to an `artifactGet` to the downloads (which may queue the next
/// request); any other frame is given back.
async fn artifact_answer(frame: Message, artifacts: Option<&Downloads>) -> Result<Option<Message>, SessionError> {
    match (frame, artifacts) {
        (Message::ArtifactChunk { sha256, offset, total, data }, Some(downloads)) => {
            downloads.chunk(&sha256, offset, total, &data).await
        }
        (Message::ArtifactMissing { sha256, reason }, Some(downloads)) => downloads.missing(&sha256, &reason).await,
        (frame @ (Message::ArtifactChunk { .. } | Message::ArtifactMissing { .. }), None) => {
            return Err(SessionError::Protocol(format!(
                "the operator sent an {} frame, though this edge asks for no artifacts",
                frame.kind()
            )));
        }
        (frame, _) => return Ok(Some(frame)),
    }
    Ok(None)
}

/// Sends outbox rows while the window has room.
async fn send_outbox<S: EdgeState>(
    state: &Arc<Mutex<S>>,
    sender: &mut Sender,
    ws: &mut ClientStream,
    write_limit: Duration,
) -> Result<(), SessionError> {
    while let Some(fetch) = sender.fetch() {
        let rows = with_state(state, move |s| s.fetch(fetch.after, fetch.limit)).await?;
        if rows.is_empty() {
            return Ok(());
        }
        for (seq, body) in rows {
            // The frame's envelope is a few dozen bytes beside the body.
            if serde_json::to_string(&body).map_or(true, |text| text.len() + 64 > MAX_FRAME_BYTES) {
                tracing::error!(seq, "a report is over the link's {MAX_FRAME_BYTES}-byte frame cap; it is dropped");
                let delete = sender.unsendable(seq)?;
                with_state(state, move |s| s.delete(delete)).await?;
                continue;
            }
            let frame = sender.send(seq, body)?;
            write(ws, &frame, write_limit).await?;
        }
    }
    Ok(())
}

/// Writes a frame; a peer that does not take it within `limit` is gone (a half-open connection
/// fills the send buffer, and the heartbeat could not fire meanwhile).
async fn write(ws: &mut ClientStream, frame: &Message, limit: Duration) -> Result<(), SessionError> {
    match tokio::time::timeout(limit, socket::send(ws, frame)).await {
        Ok(sent) => Ok(sent?),
        Err(_) => Err(SessionError::Silent(limit / 2)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_token_file_is_read_again_on_each_connect() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        let source = TokenSource::File(path.clone());
        let missing = source.read().await.expect_err("no file yet");
        assert!(missing.to_string().starts_with(&format!("token file {}: ", path.display())), "{missing}");
        std::fs::write(&path, "first\n").expect("write");
        assert_eq!(source.read().await.expect("read"), "first");
        // The kubelet rotates a projected token: the next connect sends the new one.
        std::fs::write(&path, "second").expect("write");
        assert_eq!(source.read().await.expect("read"), "second");
        std::fs::write(&path, " \n").expect("write");
        assert!(source.read().await.expect_err("empty").to_string().ends_with("the file is empty"));
        std::fs::write(&path, vec![b'a'; MAX_TOKEN_BYTES as usize + 1]).expect("write");
        assert!(source.read().await.expect_err("too big").to_string().contains("over 16384 bytes"));
        assert_eq!(TokenSource::from(" fixed \n").read().await.expect("fixed"), "fixed");
    }
}
