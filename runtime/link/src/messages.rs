//! The link's wire messages: one JSON object per WebSocket text frame, tagged by `type`.
//!
//! The cloud (operator) and an edge agent speak these over one connection per node. The edge
//! opens with `hello`, the cloud answers `welcome` or `refused`; then the cloud sends `desired`
//! (the node's jobs and datasets: in full on connect, then changes) and the edge sends `report`s
//! from its outbox. Both directions are acknowledged by sequence number, so that nothing is lost
//! across a cut (Sedna's link had no acks, no version and no keepalive: `reference/sedna.md` §3,
//! §6.2). The bearer token travels in the HTTP upgrade's `Authorization` header, never in a frame.
//!
//! An edge whose `hello` names its policy platform may also fetch artifacts (policies compiled
//! for that platform, each named by the hex SHA-256 of its bytes): it asks with `artifactGet`
//! from an offset, one chunk at a time, and the cloud answers `artifactChunk` or
//! `artifactMissing`. An edge that names no platform never asks (an older cloud would not know
//! the frame).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The link protocol version this build speaks best.
pub const PROTOCOL_VERSION: u32 = 1;

/// The oldest link protocol version this build still speaks.
pub const MIN_SUPPORTED: u32 = 1;

/// The largest frame either side accepts (bytes of JSON text). A report or a desired state
/// larger than this is refused rather than buffered without bound.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// The most reports an edge may have in flight (sent, neither acknowledged nor rejected). The
/// cloud holds at most this many unresolved reports per node and cuts off an edge that sends
/// more, so a node cannot make the cloud buffer without bound.
pub const WINDOW: usize = 256;

/// The most raw bytes one `artifactChunk` carries (its base64 text is a third more, well under
/// [`MAX_FRAME_BYTES`]). The edge asks for the next chunk only once one has arrived, so the
/// cloud holds at most one chunk per node.
pub const ARTIFACT_CHUNK_BYTES: usize = 1 << 20;

/// What an edge node runs policies on, said in its `hello`: the platform the operator compiles
/// its policies for (e.g. `aarch64-unknown-linux-gnu` or `pulley32`), the fingerprint of the
/// engine settings a precompiled policy must match, and whether the agent can compile a policy
/// itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyPlatform {
    pub platform: String,
    pub fingerprint: String,
    pub compiles: bool,
}

/// One frame.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Message {
    /// Edge → cloud, the first frame: the protocol version the edge speaks (its highest), its node
    /// name (it must match the token's node), and the seq of the last desired state it applied
    /// durably (the cloud numbers what it sends next above it, even after the cloud restarted).
    /// `policy_platform`: what the node runs policies on; an edge that sends it may ask for
    /// artifacts (absent from an older edge's hello, and omitted when `None`).
    Hello {
        version: u32,
        node: String,
        last_applied_desired: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        policy_platform: Option<PolicyPlatform>,
    },
    /// Cloud → edge, the answer to `hello`: the version both will speak, the heartbeat interval
    /// both use, and the highest report seq the cloud has durably applied for this node (the edge
    /// deletes those from its outbox and resends the rest, in order).
    Welcome { version: u32, heartbeat_secs: u32, last_applied_report: u64 },
    /// Cloud → edge instead of `welcome`; the cloud closes the connection after it.
    Refused { reason: String },
    /// Cloud → edge: the node's desired jobs and datasets. `full`: these are all of them (the edge
    /// drops whatever is not listed); otherwise a change on top of the previous `desired`. Objects
    /// are opaque here; the edge applies datasets, then jobs, then the removals.
    Desired {
        seq: u64,
        full: bool,
        jobs: Vec<Value>,
        datasets: Vec<Value>,
        removed_jobs: Vec<String>,
        removed_datasets: Vec<String>,
    },
    /// Edge → cloud: the desired state `seq` is applied durably on the edge.
    DesiredAck { seq: u64 },
    /// Edge → cloud: one outbox row.
    Report { seq: u64, body: Value },
    /// Cloud → edge, cumulative: every report with a seq ≤ `seq` is durable in the cloud.
    Ack { seq: u64 },
    /// Cloud → edge: report `seq` will never be applied (e.g. its job is not on this node). Both
    /// sides log it; the edge drops it from its outbox and never resends it.
    Reject { seq: u64, reason: String },
    /// Either way: are you there? Answered by `pong` with the same nonce.
    Ping { nonce: u64 },
    /// The answer to `ping`.
    Pong { nonce: u64 },
    /// Edge → cloud, only from an edge whose hello named its policy platform: send the artifact
    /// `sha256` (64 lower-case hex digits) from byte `offset`. One at a time per download: the
    /// next is asked once the chunk has arrived.
    ArtifactGet { sha256: String, offset: u64 },
    /// Cloud → edge, the answer to `artifactGet`: at most [`ARTIFACT_CHUNK_BYTES`] bytes of the
    /// artifact from `offset` (base64, standard alphabet), and its `total` length.
    ArtifactChunk { sha256: String, offset: u64, total: u64, data: String },
    /// Cloud → edge, the answer to `artifactGet` when the cloud cannot send it, and why.
    ArtifactMissing { sha256: String, reason: String },
}

impl Message {
    /// The frame's `type`, for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Welcome { .. } => "welcome",
            Message::Refused { .. } => "refused",
            Message::Desired { .. } => "desired",
            Message::DesiredAck { .. } => "desiredAck",
            Message::Report { .. } => "report",
            Message::Ack { .. } => "ack",
            Message::Reject { .. } => "reject",
            Message::Ping { .. } => "ping",
            Message::Pong { .. } => "pong",
            Message::ArtifactGet { .. } => "artifactGet",
            Message::ArtifactChunk { .. } => "artifactChunk",
            Message::ArtifactMissing { .. } => "artifactMissing",
        }
    }
}

/// Which end of the link is speaking, for messages that tell a human what to upgrade.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Operator,
    Edge,
}

impl Side {
    fn peer(self) -> Side {
        match self {
            Side::Operator => Side::Edge,
            Side::Edge => Side::Operator,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Side::Operator => "operator",
            Side::Edge => "edge",
        }
    }

    fn program(self) -> &'static str {
        match self {
            Side::Operator => "operator",
            Side::Edge => "edge agent",
        }
    }
}

/// The version to speak with a peer whose highest version is `theirs`, for this build.
pub fn negotiate(ours: Side, theirs: u32) -> Result<u32, String> {
    negotiate_between(ours, MIN_SUPPORTED, PROTOCOL_VERSION, theirs)
}

/// The version to speak when we speak `min..=max` and the peer's highest is `theirs`: the highest
/// both speak. A peer newer than us is not refused here: we offer our `max` and the newer peer,
/// which knows both ranges, decides. A peer older than our `min` is refused, naming both.
pub fn negotiate_between(ours: Side, min: u32, max: u32, theirs: u32) -> Result<u32, String> {
    if theirs < min {
        let peer = ours.peer();
        return Err(format!(
            "{} speaks link protocol {theirs}, this {} speaks {min}..={max}; upgrade the {}",
            peer.name(),
            ours.program(),
            peer.program()
        ));
    }
    Ok(theirs.min(max))
}

/// Whether `sha256` names an artifact: 64 lower-case hex digits. The error names what was given
/// (its first 80 characters: a peer's string is not logged without bound).
pub fn check_sha256(sha256: &str) -> Result<(), String> {
    if sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Ok(());
    }
    let shown: String = sha256.chars().take(80).collect();
    let more = if shown.len() < sha256.len() { "…" } else { "" };
    Err(format!("`{shown}{more}` is not a SHA-256 digest (64 lower-case hex digits)"))
}

/// A frame that could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("link frame of {bytes} bytes is over the {max} byte limit")]
    TooLarge { bytes: usize, max: usize },
    #[error("link frame is not JSON text: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("link frame has no string `type` field")]
    NoType,
    #[error("link frame of unknown type `{0}`")]
    UnknownType(String),
    #[error("invalid `{kind}` link frame: {source}")]
    Invalid {
        kind: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The JSON text of one frame; refused if over [`MAX_FRAME_BYTES`] (the peer would refuse it).
pub fn encode(message: &Message) -> Result<String, FrameError> {
    // Serializing these types cannot fail (string keys only); the error arm is for completeness.
    let text =
        serde_json::to_string(message).map_err(|source| FrameError::Invalid { kind: message.kind().into(), source })?;
    if text.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge { bytes: text.len(), max: MAX_FRAME_BYTES });
    }
    Ok(text)
}

/// The message in one frame's text. The size is checked before parsing anything.
pub fn decode(text: &str) -> Result<Message, FrameError> {
    if text.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge { bytes: text.len(), max: MAX_FRAME_BYTES });
    }
    serde_json::from_str(text).map_err(|err| explain(text, err))
}

/// Turns serde's error for a tagged enum into one that says which frame type was wrong, or that
/// the type itself was missing or unknown.
fn explain(text: &str, err: serde_json::Error) -> FrameError {
    let Ok(value) = serde_json::from_str::<Value>(text) else { return FrameError::NotJson(err) };
    let Some(kind) = value.get("type").and_then(Value::as_str) else { return FrameError::NoType };
    const KNOWN: [&str; 13] = [
        "hello",
        "welcome",
        "refused",
        "desired",
        "desiredAck",
        "report",
        "ack",
        "reject",
        "ping",
        "pong",
        "artifactGet",
        "artifactChunk",
        "artifactMissing",
    ];
    if KNOWN.contains(&kind) {
        FrameError::Invalid { kind: kind.to_owned(), source: err }
    } else {
        FrameError::UnknownType(kind.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const SHA: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    /// Every message and its exact JSON: the wire format is a contract with other builds.
    #[test]
    fn wire_format() {
        let cases = [
            (
                Message::Hello { version: 1, node: "edge-1".into(), last_applied_desired: 7, policy_platform: None },
                json!({"type": "hello", "version": 1, "node": "edge-1", "lastAppliedDesired": 7}),
            ),
            (
                Message::Hello {
                    version: 1,
                    node: "edge-1".into(),
                    last_applied_desired: 7,
                    policy_platform: Some(PolicyPlatform {
                        platform: "aarch64-unknown-linux-gnu".into(),
                        fingerprint: "wasmtime-48.0.8-3f2a".into(),
                        compiles: false,
                    }),
                },
                json!({"type": "hello", "version": 1, "node": "edge-1", "lastAppliedDesired": 7,
                       "policyPlatform": {"platform": "aarch64-unknown-linux-gnu",
                                          "fingerprint": "wasmtime-48.0.8-3f2a", "compiles": false}}),
            ),
            (
                Message::Welcome { version: 1, heartbeat_secs: 15, last_applied_report: 41 },
                json!({"type": "welcome", "version": 1, "heartbeatSecs": 15, "lastAppliedReport": 41}),
            ),
            (Message::Refused { reason: "no".into() }, json!({"type": "refused", "reason": "no"})),
            (
                Message::Desired {
                    seq: 8,
                    full: true,
                    jobs: vec![json!({"metadata": {"name": "j"}})],
                    datasets: vec![],
                    removed_jobs: vec!["default/old".into()],
                    removed_datasets: vec![],
                },
                json!({"type": "desired", "seq": 8, "full": true, "jobs": [{"metadata": {"name": "j"}}],
                       "datasets": [], "removedJobs": ["default/old"], "removedDatasets": []}),
            ),
            (Message::DesiredAck { seq: 8 }, json!({"type": "desiredAck", "seq": 8})),
            (
                Message::Report { seq: 42, body: json!({"phase": "Train", "status": "Ready"}) },
                json!({"type": "report", "seq": 42, "body": {"phase": "Train", "status": "Ready"}}),
            ),
            (Message::Ack { seq: 42 }, json!({"type": "ack", "seq": 42})),
            (
                Message::Reject { seq: 43, reason: "job default/x is not on node edge-1".into() },
                json!({"type": "reject", "seq": 43, "reason": "job default/x is not on node edge-1"}),
            ),
            (Message::Ping { nonce: 3 }, json!({"type": "ping", "nonce": 3})),
            (Message::Pong { nonce: 3 }, json!({"type": "pong", "nonce": 3})),
            (
                Message::ArtifactGet { sha256: SHA.into(), offset: 1 << 20 },
                json!({"type": "artifactGet", "sha256": SHA, "offset": 1 << 20}),
            ),
            (
                Message::ArtifactChunk { sha256: SHA.into(), offset: 0, total: 3, data: "AQID".into() },
                json!({"type": "artifactChunk", "sha256": SHA, "offset": 0, "total": 3, "data": "AQID"}),
            ),
            (
                Message::ArtifactMissing { sha256: SHA.into(), reason: "no such policy".into() },
                json!({"type": "artifactMissing", "sha256": SHA, "reason": "no such policy"}),
            ),
        ];
        for (message, expected) in cases {
            let text = encode(&message).unwrap();
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), expected, "{}", message.kind());
            assert_eq!(expected["type"], message.kind());
            assert_eq!(decode(&text).unwrap(), message);
        }
    }

    #[test]
    fn negotiation() {
        use Side::{Edge, Operator};
        // (ours, our range, theirs, expected)
        type Case = (Side, u32, u32, u32, Result<u32, &'static str>);
        let cases: [Case; 7] = [
            (Operator, 1, 1, 1, Ok(1)),
            (Operator, 1, 1, 0, Err("edge speaks link protocol 0, this operator speaks 1..=1; upgrade the edge agent")),
            // A newer edge: the operator offers its highest and the edge decides.
            (Operator, 1, 1, 3, Ok(1)),
            (Operator, 1, 3, 2, Ok(2)),
            (Edge, 2, 3, 1, Err("operator speaks link protocol 1, this edge agent speaks 2..=3; upgrade the operator")),
            (Edge, 1, 3, 1, Ok(1)),
            (Edge, 1, 1, 1, Ok(1)),
        ];
        for (ours, min, max, theirs, expected) in cases {
            let got = negotiate_between(ours, min, max, theirs);
            assert_eq!(
                got.as_ref().map_err(String::as_str),
                expected.as_ref().map_err(|e| *e),
                "{ours:?} {min}..={max} vs {theirs}"
            );
        }
        assert_eq!(negotiate(Operator, PROTOCOL_VERSION), Ok(PROTOCOL_VERSION));
        assert_eq!(
            negotiate(Operator, 0).unwrap_err(),
            "edge speaks link protocol 0, this operator speaks 1..=1; upgrade the edge agent"
        );
    }

    #[test]
    fn bad_frames_say_what_is_wrong() {
        let cases = [
            ("not json", "link frame is not JSON text: expected ident at line 1 column 2"),
            ("[1]", "link frame has no string `type` field"),
            (r#"{"seq": 1}"#, "link frame has no string `type` field"),
            (r#"{"type": 5}"#, "link frame has no string `type` field"),
            (r#"{"type": "gossip"}"#, "link frame of unknown type `gossip`"),
            (r#"{"type": "ack"}"#, "invalid `ack` link frame: missing field `seq`"),
            (r#"{"type": "artifactGet", "sha256": "ab"}"#, "invalid `artifactGet` link frame: missing field `offset`"),
            (r#"{"type": "ack", "seq": -1}"#, "invalid `ack` link frame: invalid value: integer `-1`, expected u64"),
            (
                r#"{"type": "hello", "version": 1, "node": 7, "lastAppliedDesired": 0}"#,
                "invalid `hello` link frame: invalid type: integer `7`, expected a string",
            ),
            (
                r#"{"type": "desired", "seq": 1, "full": true, "jobs": [], "datasets": [], "removedJobs": []}"#,
                "invalid `desired` link frame: missing field `removedDatasets`",
            ),
        ];
        for (text, expected) in cases {
            let err = decode(text).unwrap_err();
            assert!(err.to_string().starts_with(expected), "{text}: got {err}");
        }
    }

    #[test]
    fn an_old_edges_hello_without_a_policy_platform_still_parses() {
        let old = decode(r#"{"type": "hello", "version": 1, "node": "edge-1", "lastAppliedDesired": 3}"#).unwrap();
        assert_eq!(
            old,
            Message::Hello { version: 1, node: "edge-1".into(), last_applied_desired: 3, policy_platform: None }
        );
        // And a hello without one says nothing of it on the wire.
        let text = encode(&old).unwrap();
        assert!(!text.contains("policyPlatform"), "{text}");
        let bad = decode(r#"{"type": "hello", "version": 1, "node": "e", "lastAppliedDesired": 3, "policyPlatform": {"platform": "x"}}"#)
            .unwrap_err();
        assert!(bad.to_string().starts_with("invalid `hello` link frame: missing field `fingerprint`"), "{bad}");
    }

    #[test]
    fn artifact_names_are_sha256_digests() {
        assert_eq!(check_sha256(SHA), Ok(()));
        let cases = [
            ("", "`` is not a SHA-256 digest (64 lower-case hex digits)"),
            (&SHA[..63], "is not a SHA-256 digest"),
            ("E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855", "`E3B0C442"),
            ("../../../../etc/passwd00000000000000000000000000000000000000000000", "`../../../../etc/passwd"),
        ];
        for (given, said) in cases {
            let err = check_sha256(given).unwrap_err();
            assert!(err.contains(said), "{given}: {err}");
        }
        let long = "a".repeat(10_000);
        assert!(check_sha256(&long).unwrap_err().len() < 200, "a long string is not repeated in full");
    }

    #[test]
    fn unknown_fields_are_ignored() {
        // A later minor version may add fields; an older peer reads what it knows.
        let message = decode(r#"{"type": "ack", "seq": 4, "extra": true}"#).unwrap();
        assert_eq!(message, Message::Ack { seq: 4 });
    }

    #[test]
    fn frames_over_the_cap_are_refused() {
        let big = "x".repeat(MAX_FRAME_BYTES);
        let message = Message::Report { seq: 1, body: Value::String(big) };
        let err = encode(&message).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { max: MAX_FRAME_BYTES, .. }), "{err}");

        // Decoding refuses before parsing: a frame one byte over the limit, even if not JSON.
        let text = " ".repeat(MAX_FRAME_BYTES + 1);
        let err = decode(&text).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("link frame of {} bytes is over the {MAX_FRAME_BYTES} byte limit", MAX_FRAME_BYTES + 1)
        );

        // Exactly at the limit is fine.
        let pad = MAX_FRAME_BYTES - r#"{"type":"refused","reason":""}"#.len();
        let message = Message::Refused { reason: "r".repeat(pad) };
        let text = encode(&message).unwrap();
        assert_eq!(text.len(), MAX_FRAME_BYTES);
        assert_eq!(decode(&text).unwrap(), message);
    }
}
