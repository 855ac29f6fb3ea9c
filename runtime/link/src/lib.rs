//! The cloud–edge link. Its protocol core is plain data and functions (no sockets, no async, no
//! SQLite); the shells (WebSocket over TLS on both ends, the edge's SQLite outbox, the cloud's
//! durable per-node watermark) only move frames and rows. Every decision is made in the core:
//! - [`messages`]: the frames, their JSON, the size cap and version negotiation;
//! - [`handshake`]: `hello` → `welcome` / `refused` (version, node identity);
//! - [`sender`]: the edge's report window over its outbox, acks, rejects, resend after a cut;
//! - [`receiver`]: the cloud's per-node report ordering, duplicates, cumulative acks;
//! - [`desired`]: the node's jobs and datasets, full on connect, then changes, acknowledged;
//! - [`heartbeat`]: ping, pong and declaring a silent connection dead;
//! - [`scope`]: a node reports only on its own jobs and datasets.
//!
//! The shells: [`socket`] (TLS, WebSocket, token, hello), [`cloud_server`] (the operator's
//! listener over a [`cloud_server::CloudSide`]), [`edge_client`] (the agent's connection over
//! its SQLite, [`edge_client::EdgeState`]) and [`artifacts`] (the edge's downloads of the files
//! the operator prepared for its policy platform, by SHA-256: chunked, resumed after a cut,
//! verified).
//!
//! One connection per node. On each connection the edge sends `hello`; the cloud answers
//! `welcome` (with its report watermark) and a full `desired`; then reports flow up from the
//! outbox and desired changes flow down, both acknowledged. A cut (or a restart of either end)
//! loses nothing: the edge resends every report not acknowledged, the cloud sends its full
//! desired state again, and both sides drop what they already have. An edge whose hello names
//! its policy platform also asks for artifacts, one chunk at a time per download, beside all of
//! that; after a cut it asks again from what it has.

pub mod artifacts;
pub mod cloud_server;
pub mod desired;
pub mod edge_client;
pub mod handshake;
pub mod heartbeat;
pub mod messages;
pub mod open_files;
pub mod receiver;
pub mod refusals;
pub mod scope;
pub mod sender;
pub mod socket;
pub mod stop_signal;
#[cfg(test)]
mod tests;

pub use artifacts::{DownloadError, Downloads, sha256_hex};
pub use cloud_server::ArtifactPiece;
pub use desired::{Changes, DESIRED_WINDOW, DesiredError, DesiredReceiver, DesiredSender, Kind, object_key};
pub use handshake::{Accepted, HandshakeError, Welcomed, accept_hello, hello, read_welcome};
pub use heartbeat::{DEFAULT_HEARTBEAT_SECS, Heartbeat, HeartbeatAction};
pub use messages::{
    ARTIFACT_CHUNK_BYTES, FrameError, MAX_FRAME_BYTES, MIN_SUPPORTED, Message, PROTOCOL_VERSION, PolicyPlatform, Side,
    WINDOW, check_sha256, decode, encode, negotiate,
};
pub use receiver::{ReceiveError, Receiver, Verdict};
pub use sender::{Delete, Fetch, SendError, Sender};

/// Waits until `flag` is true (or its sender is gone). The guard `wait_for` returns is dropped
/// here, so callers can await after it.
pub(crate) async fn until_true(flag: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = flag.wait_for(|set| *set).await;
}
