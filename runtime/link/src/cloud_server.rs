//! The cloud's shell of the link: accept nodes, apply their reports in order, send their desired
//! state, keep each connection alive. One connection per node: a new one from the same node
//! ends the old one first, so that a node's reports are never applied by two at once. What to
//! apply, and where it is durable, is the [`CloudSide`]'s (the operator's job status, a test's
//! SQLite); every protocol decision is the core's.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, SemaphorePermit, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;

use super::desired::{DesiredObject, DesiredSender, Kind};
use super::heartbeat::{Heartbeat, HeartbeatAction};
use super::messages::{ARTIFACT_CHUNK_BYTES, Message, PolicyPlatform, check_sha256, encode};
use super::receiver::{Receiver, Verdict};
use super::refusals::Refusals;
use super::scope;
use super::socket::{self, Credential, LinkError, NodeTokens, Reviewer, ServerStream};
use super::until_true;

/// What one node should hold: its jobs and datasets, by `namespace/name`. Each object is shared
/// compact text ([`DesiredObject`]): the operator's copies of a node's state (as the cluster
/// makes it, as the node is sent it, as its session sent it) hold one job once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeDesired {
    pub jobs: BTreeMap<String, DesiredObject>,
    pub datasets: BTreeMap<String, DesiredObject>,
}

/// How a report ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Applied {
    /// Durable, with the node's watermark moved to its seq.
    Applied,
    /// Never to be applied: the reason goes back to the edge and into the log.
    Rejected(String),
    /// Not applied now (the store is unreachable): the connection ends and the edge resends.
    Failed(String),
}

/// Part of an artifact, as [`CloudSide::artifact_chunk`] reads it: its `total` length and at most
/// `max` bytes from the offset asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactPiece {
    pub total: u64,
    pub data: Vec<u8>,
}

/// The most `artifactGet`s one node may have waiting (beside the one being served): its edge
/// asks one chunk at a time per download.
pub const MAX_WAITING_ARTIFACT_GETS: usize = 64;

/// The cloud's durable side of the link.
pub trait CloudSide: Send + Sync + 'static {
    /// The highest report seq of `node` applied durably (0: none).
    fn last_applied_report(&self, node: &str) -> impl Future<Output = Result<u64, String>> + Send;
    /// Applies report `seq` of `node` durably, idempotently (a seq at or under the node's
    /// watermark is already applied), and moves the watermark with it.
    fn apply(&self, node: &str, seq: u64, body: Value) -> impl Future<Output = Applied> + Send;
    /// Report `seq` of `node` (in the node's scope) arrived behind another being applied or
    /// queued, and waits its turn: the side may take it in early, where an earlier one waits for
    /// it (a stage result and the next stage's Ready, written at once). `apply` is still called
    /// for it, in order, and resolves it.
    fn queued(&self, _node: &str, _seq: u64, _body: &Value) {}
    /// The node's desired state, as it changes.
    fn desired(&self, node: &str) -> watch::Receiver<Arc<NodeDesired>>;
    /// What `node` runs policies on, as its hello said (`None`: an older edge, or one that
    /// fetches no artifacts). Called once per accepted connection, before its first desired
    /// state is sent.
    fn node_platform(&self, _node: &str, _platform: Option<&PolicyPlatform>) {}
    /// At most `max` bytes of the artifact named `sha256` (64 lower-case hex digits, checked)
    /// from byte `offset`, and its total length, for `node`; or why it cannot be sent (said to
    /// the edge).
    fn artifact_chunk(
        &self,
        _node: &str,
        _sha256: &str,
        _offset: u64,
        _max: usize,
    ) -> impl Future<Output = Result<ArtifactPiece, String>> + Send {
        async { Err("this cloud serves no policy artifacts".into()) }
    }
    /// An artifact's last chunk was sent to a node: the memory its transfer used may be given
    /// back.
    fn artifact_sent(&self) {}
}

pub struct ServerSettings {
    pub tls: Arc<ServerConfig>,
    /// Replaced when a token Secret changes.
    pub tokens: watch::Receiver<Arc<NodeTokens>>,
    /// Checks a token that is not a static one (the operator's TokenReview); `None`: static
    /// tokens only.
    pub reviewer: Option<Arc<dyn Reviewer>>,
    pub heartbeat_secs: u32,
    /// Refused connections, counted and throttled per source.
    pub refusals: Arc<Refusals>,
}

/// The lock a node's session holds while it runs.
type SessionLock = Arc<tokio::sync::Mutex<()>>;

/// A report being applied: its seq and, once done, how it ended.
type Applying<'a> = Pin<Box<dyn Future<Output = (u64, Applied)> + Send + 'a>>;

/// An artifact chunk being read: once read, the frame that answers its `artifactGet`.
type Serving<'a> = Pin<Box<dyn Future<Output = Result<Answer, LinkError>> + Send + 'a>>;

/// One running connection per node: a way to end it, and a lock its session holds.
#[derive(Default)]
struct Nodes {
    by_name: Mutex<HashMap<String, (watch::Sender<bool>, SessionLock)>>,
}

impl Nodes {
    /// Ends `node`'s current connection, and returns this one's end signal and lock.
    fn take_over(&self, node: &str) -> (watch::Receiver<bool>, SessionLock) {
        let mut nodes = self.by_name.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (end, ended) = watch::channel(false);
        let lock = match nodes.insert(node.to_owned(), (end, Arc::default())) {
            Some((old, lock)) => {
                let _ = old.send(true);
                lock
            }
            None => Arc::default(),
        };
        if let Some(entry) = nodes.get_mut(node) {
            entry.1 = lock.clone();
        }
        (ended, lock)
    }
}

/// Accepts nodes on `listener` until `stop` turns true.
pub async fn serve<C: CloudSide>(
    listener: TcpListener,
    settings: ServerSettings,
    side: Arc<C>,
    mut stop: watch::Receiver<bool>,
) {
    let acceptor = TlsAcceptor::from(settings.tls.clone());
    let nodes = Arc::new(Nodes::default());
    let mut sessions = tokio::task::JoinSet::new();
    // Refusals are summed up when due even if no connection comes after a burst.
    let mut say_refusals = tokio::time::interval(Duration::from_secs(10));
    say_refusals.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = say_refusals.tick() => {
                let _ = settings.refusals.say_due(Instant::now());
                continue;
            }
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!("link listener: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = until_true(&mut stop) => break,
        };
        // A source that keeps failing is dropped here: no TLS, no token review for it.
        if !settings.refusals.admits(peer.ip(), Instant::now()) {
            drop(tcp);
            continue;
        }
        let _ = tcp.set_nodelay(true);
        let (acceptor, tokens, side, nodes, stop) =
            (acceptor.clone(), settings.tokens.clone(), side.clone(), nodes.clone(), stop.clone());
        let (reviewer, heartbeat_secs) = (settings.reviewer.clone(), settings.heartbeat_secs);
        let refusals = settings.refusals.clone();
        sessions.spawn(async move {
            let reviewer = reviewer.as_deref();
            let opened = || refusals.opened(peer.ip(), Instant::now());
            match connection(tcp, &acceptor, tokens, reviewer, side.as_ref(), &nodes, heartbeat_secs, stop, &opened)
                .await
            {
                Ok(()) => {}
                // Counted and summed up, not a line each: a flood of bad tokens (or of anything
                // that is no link client) costs no log, and a source of bad tokens is throttled.
                Err(SessionError::Handshake(LinkError::Refused(reason))) => {
                    refusals.refused(peer.ip(), &reason, true, Instant::now())
                }
                Err(SessionError::Handshake(err)) => {
                    refusals.refused(peer.ip(), &err.to_string(), false, Instant::now())
                }
                Err(err) => tracing::warn!(%peer, "link connection ended: {err}"),
            }
        });
        // Reap the finished ones so the set does not grow with every reconnect.
        while sessions.try_join_next().is_some() {}
    }
    sessions.shutdown().await;
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error(transparent)]
    Link(#[from] LinkError),
    /// Before the node was known: TLS, the upgrade, its token.
    #[error(transparent)]
    Handshake(LinkError),
    #[error("node {node}: {message}")]
    Protocol { node: String, message: String },
    #[error("node {node}: report {seq} could not be applied, the edge will resend it: {message}")]
    Failed { node: String, seq: u64, message: String },
    #[error("node {node}: no frame for two heartbeat intervals: the connection is dead")]
    Silent { node: String },
}

#[allow(clippy::too_many_arguments)]
async fn connection<C: CloudSide>(
    tcp: TcpStream,
    acceptor: &TlsAcceptor,
    mut tokens: watch::Receiver<Arc<NodeTokens>>,
    reviewer: Option<&dyn Reviewer>,
    side: &C,
    nodes: &Nodes,
    heartbeat_secs: u32,
    mut stop: watch::Receiver<bool>,
    opened: &(dyn Fn() + Sync),
) -> Result<(), SessionError> {
    let known = tokens.borrow_and_update().clone();
    // The one-time steps are boxed: their state (a TLS handshake, a review) would otherwise stay
    // part of the session's future, held per node for the connection's life.
    let (node, credential, mut ws) =
        Box::pin(socket::upgrade(tcp, acceptor, &known, reviewer)).await.map_err(SessionError::Handshake)?;
    opened();
    // Whether the tokens can still change (their source may be gone: then they stay as read).
    // A static token is checked again whenever they do: a revoked one ends its session. A
    // reviewed token (a projected ServiceAccount token, short-lived and rotated by the kubelet)
    // is followed by its reviewer: the session ends once the agent pod it was bound to is gone
    // (a token rotated meanwhile is reviewed when the edge reconnects).
    let mut tokens_followed = matches!(credential, Credential::Static(_));
    let mut revoked = match (&credential, reviewer) {
        (Credential::Reviewed(token), Some(reviewer)) => reviewer.revoked(token),
        _ => Box::pin(std::future::pending()),
    };
    let (mut ended, lock) = nodes.take_over(&node);
    // The node's previous connection finishes the report it is applying, then lets go.
    let _exclusive = lock.lock_owned().await;
    let protocol = |message: String| SessionError::Protocol { node: node.clone(), message };
    let watermark =
        Box::pin(side.last_applied_report(&node)).await.map_err(|err| protocol(format!("its watermark: {err}")))?;
    let accepted = Box::pin(socket::greet(&node, &mut ws, watermark, heartbeat_secs)).await?;
    tracing::info!(
        node,
        watermark,
        platform = accepted.policy_platform.as_ref().map(|p| p.platform.as_str()),
        "link up"
    );
    side.node_platform(&node, accepted.policy_platform.as_ref());
    // Only an edge that said its platform may ask for artifacts.
    let fetches_artifacts = accepted.policy_platform.is_some();
    let mut receiver = Receiver::new(watermark);
    receiver.connected();
    let mut desired_source = side.desired(&node);
    let mut current = desired_source.borrow_and_update().clone();
    let mut desired = DesiredSender::new();
    sync_desired(&mut desired, &NodeDesired::default(), &current, &node);
    let interval = Duration::from_secs(u64::from(heartbeat_secs.max(1)));
    write(&mut ws, &desired.connected(accepted.last_applied_desired), interval * 2, &node).await?;
    let epoch = Instant::now();
    let mut heartbeat = Heartbeat::new(interval, epoch.elapsed());
    // Reports to apply, in order, one at a time; while one is being applied (a status write
    // may take a while) frames are still read and pings answered.
    let mut queued: VecDeque<(u64, Value)> = VecDeque::new();
    let mut applying: Option<Applying<'_>> = None;
    // Artifact chunks to send, one read at a time (the edge asks for a download's next chunk
    // once one has arrived), while reports, pings and desired changes go on.
    let mut artifact_gets: VecDeque<(String, u64)> = VecDeque::new();
    let mut serving: Option<Serving<'_>> = None;
    let outcome = loop {
        while let Some(change) = desired.next_change() {
            write(&mut ws, &change, interval * 2, &node).await?;
        }
        if applying.is_none()
            && let Some((seq, body)) = queued.pop_front()
        {
            let in_scope = scope::check(&body, &current);
            let node = node.as_str();
            applying = Some(Box::pin(async move {
                match in_scope {
                    Ok(()) => (seq, side.apply(node, seq, body).await),
                    Err(why) => (seq, Applied::Rejected(why)),
                }
            }));
        }
        if serving.is_none()
            && let Some((sha256, offset)) = artifact_gets.pop_front()
        {
            serving = Some(Box::pin(serve_artifact(side, node.as_str(), sha256, offset)));
        }
        let next_poll = tokio::time::Instant::from_std(epoch + heartbeat.next_poll());
        tokio::select! {
            answer = async { serving.as_mut().expect("guarded by the branch's condition").await }, if serving.is_some() => {
                serving = None;
                // Sent before the next chunk is read: the edge asks for one at a time.
                let Answer { text, last, _sending } = answer?;
                write_text(&mut ws, text, interval * 2, &node).await?;
                if last {
                    side.artifact_sent();
                }
            }
            done = async { applying.as_mut().expect("guarded by the branch's condition").await }, if applying.is_some() => {
                applying = None;
                let (seq, outcome) = done;
                let answers = match outcome {
                    Applied::Applied => receiver.applied(seq),
                    Applied::Rejected(reason) => {
                        tracing::warn!(node, seq, "report refused: {reason}");
                        receiver.rejected(seq, &reason)
                    }
                    Applied::Failed(message) => {
                        break Err(SessionError::Failed { node: node.clone(), seq, message });
                    }
                }
                .map_err(|err| protocol(err.to_string()))?;
                for answer in &answers {
                    write(&mut ws, answer, interval * 2, &node).await?;
                }
            }
            frame = socket::recv(&mut ws) => {
                let Some(frame) = frame? else { break Ok(()) };
                heartbeat.received(epoch.elapsed());
                match frame {
                    Message::Report { seq, body } => match receiver.receive(seq).map_err(|err| protocol(err.to_string()))? {
                        Verdict::Apply => {
                            // It waits its turn behind another: offered now.
                            let waits = applying.is_some() || !queued.is_empty();
                            if waits && scope::check(&body, &current).is_ok() {
                                side.queued(&node, seq, &body);
                            }
                            queued.push_back((seq, body));
                        }
                        Verdict::Duplicate(answer) | Verdict::Rejected(answer) => {
                            write(&mut ws, &answer, interval * 2, &node).await?
                        }
                        Verdict::Waiting => {}
                    },
                    Message::DesiredAck { seq } => desired.ack(seq).map_err(|err| protocol(err.to_string()))?,
                    Message::Ping { nonce } => write(&mut ws, &Message::Pong { nonce }, interval * 2, &node).await?,
                    Message::Pong { nonce } => {
                        heartbeat.pong(nonce, epoch.elapsed());
                    }
                    Message::ArtifactGet { sha256, offset } => {
                        match admit_artifact_get(fetches_artifacts, &sha256, artifact_gets.len()) {
                            Ok(()) => artifact_gets.push_back((sha256, offset)),
                            Err(why) => break Err(protocol(why)),
                        }
                    }
                    other => break Err(protocol(format!("a {} frame mid-connection", other.kind()))),
                }
            }
            changed = tokens.changed(), if tokens_followed => {
                if changed.is_err() {
                    tokens_followed = false;
                } else if let Credential::Static(token) = &credential
                    && !tokens.borrow_and_update().admits(token, &node)
                {
                    break Err(protocol("its token was revoked: the session ends".to_owned()));
                }
            }
            changed = desired_source.changed() => {
                if changed.is_err() {
                    break Ok(());
                }
                let next = desired_source.borrow_and_update().clone();
                sync_desired(&mut desired, &current, &next, &node);
                current = next;
            }
            _ = tokio::time::sleep_until(next_poll) => match heartbeat.poll(epoch.elapsed()) {
                HeartbeatAction::SendPing(nonce) => write(&mut ws, &Message::Ping { nonce }, interval * 2, &node).await?,
                HeartbeatAction::Dead => break Err(SessionError::Silent { node: node.clone() }),
                HeartbeatAction::Nothing => {}
            },
            _ = until_true(&mut ended) => {
                tracing::info!(node, "a new connection from the node replaces this one");
                break Ok(());
            }
            why = &mut revoked => break Err(protocol(format!("{why}: the session ends"))),
            _ = until_true(&mut stop) => break Ok(()),
        }
    };
    // A peer that does not take the close is not waited for: the node's lock goes with us.
    let _ = Box::pin(tokio::time::timeout(Duration::from_secs(1), ws.close(None))).await;
    outcome
}

/// Whether an `artifactGet` is served: only to an edge whose hello named its policy platform, for
/// a digest, with at most [`MAX_WAITING_ARTIFACT_GETS`] waiting.
fn admit_artifact_get(fetches_artifacts: bool, sha256: &str, waiting: usize) -> Result<(), String> {
    if !fetches_artifacts {
        return Err("an artifactGet frame, though its hello named no policy platform".into());
    }
    check_sha256(sha256).map_err(|err| format!("artifactGet: {err}"))?;
    if waiting >= MAX_WAITING_ARTIFACT_GETS {
        return Err(format!("over {MAX_WAITING_ARTIFACT_GETS} artifactGet frames waiting"));
    }
    Ok(())
}

/// The artifact chunks read, encoded or being sent at once, over every connection: each holds a
/// few MiB until it is sent (its bytes, their base64, the frame's text), so a fleet fetching a
/// new policy at once costs the process at most this many.
pub const ARTIFACT_SENDS_AT_ONCE: usize = 16;

static ARTIFACT_SENDS: Semaphore = Semaphore::const_new(ARTIFACT_SENDS_AT_ONCE);

/// An `artifactGet`'s answer, encoded, and its place among [`ARTIFACT_SENDS_AT_ONCE`] until sent.
struct Answer {
    text: String,
    /// The artifact's last chunk.
    last: bool,
    _sending: SemaphorePermit<'static>,
}

/// The answer to an `artifactGet`: a chunk of at most [`ARTIFACT_CHUNK_BYTES`], or why not.
async fn serve_artifact<C: CloudSide>(side: &C, node: &str, sha256: String, offset: u64) -> Result<Answer, LinkError> {
    let sending = ARTIFACT_SENDS.acquire().await.map_err(|err| LinkError::WebSocket(err.to_string()))?;
    let (text, last) = match side.artifact_chunk(node, &sha256, offset, ARTIFACT_CHUNK_BYTES).await {
        // A megabyte's base64 and JSON: made off the runtime's threads, which run the reconciles.
        Ok(ArtifactPiece { total, mut data }) => {
            data.truncate(ARTIFACT_CHUNK_BYTES);
            let last = offset + data.len() as u64 >= total;
            let text = tokio::task::spawn_blocking(move || {
                let data = base64::engine::general_purpose::STANDARD.encode(&data);
                encode(&Message::ArtifactChunk { sha256, offset, total, data })
            })
            .await
            .map_err(|err| LinkError::WebSocket(format!("an artifact chunk's encoding stopped: {err}")))??;
            (text, last)
        }
        Err(reason) => {
            tracing::warn!(node, sha256, offset, "an artifact the node asked for is not sent: {reason}");
            (encode(&Message::ArtifactMissing { sha256, reason })?, false)
        }
    };
    Ok(Answer { text, last, _sending: sending })
}

/// Moves the sender from `before` to `after`.
fn sync_desired(sender: &mut DesiredSender, before: &NodeDesired, after: &NodeDesired, node: &str) {
    for (kind, was, now) in [(Kind::Job, &before.jobs, &after.jobs), (Kind::Dataset, &before.datasets, &after.datasets)]
    {
        for key in was.keys().filter(|key| !now.contains_key(*key)) {
            sender.remove(kind, key);
        }
        for (key, object) in now.iter().filter(|(key, object)| was.get(*key) != Some(object)) {
            if let Err(err) = sender.set(kind, object.clone()) {
                tracing::error!(node, key, "not sent to the node: {err}");
            }
        }
    }
}

async fn write(ws: &mut ServerStream, frame: &Message, limit: Duration, node: &str) -> Result<(), SessionError> {
    write_text(ws, encode(frame).map_err(LinkError::from)?, limit, node).await
}

async fn write_text(ws: &mut ServerStream, text: String, limit: Duration, node: &str) -> Result<(), SessionError> {
    // Boxed: a send's state is not kept in the session's future between sends.
    match Box::pin(tokio::time::timeout(limit, socket::send_text(ws, text))).await {
        Ok(sent) => Ok(sent?),
        Err(_) => Err(SessionError::Silent { node: node.to_owned() }),
    }
}
