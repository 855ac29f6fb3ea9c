//! The opening of a connection: the edge's `hello` and the cloud's `welcome` or `refused`.
//!
//! The cloud checks, in this order, that the first frame is a `hello`, that the versions meet
//! and that the node named in it is the node the bearer token authenticated (the token, not the
//! hello, is the identity: Sedna trusted a `Node-Name` header, `reference/sedna.md` §6.2 #19).
//! Every refusal is a [`HandshakeError`] whose text is the `refused` frame's reason.

use std::time::Duration;

use super::messages::{MIN_SUPPORTED, Message, PROTOCOL_VERSION, PolicyPlatform, Side, negotiate, negotiate_between};

/// Why a connection was not opened.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("expected a `{expected}` frame first, got `{got}`")]
    Unexpected { expected: &'static str, got: &'static str },
    #[error("{0}")]
    Version(String),
    #[error("hello from node `{hello}` on a connection authenticated as node `{token}`")]
    WrongNode { token: String, hello: String },
    #[error("the operator refused the link: {0}")]
    Refused(String),
    #[error("the operator chose link protocol {chosen}, which this edge agent does not speak ({min}..={max})")]
    UnsupportedChoice { chosen: u32, min: u32, max: u32 },
    #[error("the operator's welcome has a heartbeat interval of 0 seconds")]
    NoHeartbeat,
}

impl HandshakeError {
    /// The frame the cloud sends before closing.
    pub fn refusal(&self) -> Message {
        Message::Refused { reason: self.to_string() }
    }
}

/// The edge's first frame. `policy_platform`: what the node runs policies on; an edge that names
/// it may ask for artifacts.
pub fn hello(node: &str, last_applied_desired: u64, policy_platform: Option<PolicyPlatform>) -> Message {
    Message::Hello { version: PROTOCOL_VERSION, node: node.to_owned(), last_applied_desired, policy_platform }
}

/// A `hello` the cloud accepted.
#[derive(Clone, Debug, PartialEq)]
pub struct Accepted {
    /// The version both speak from now on.
    pub version: u32,
    /// The edge's last durably applied desired seq ([`super::DesiredSender::connected`]).
    pub last_applied_desired: u64,
    /// What the node runs policies on, if its hello said (an older edge's does not); only then
    /// may it ask for artifacts.
    pub policy_platform: Option<PolicyPlatform>,
    /// The frame to send back.
    pub welcome: Message,
}

/// The cloud's answer to the first frame of a connection from `node` (the token's node).
/// `last_applied_report` is the node's receiver's [`super::Receiver::last_applied`].
pub fn accept_hello(
    node: &str,
    first: &Message,
    last_applied_report: u64,
    heartbeat_secs: u32,
) -> Result<Accepted, HandshakeError> {
    let Message::Hello { version, node: claimed, last_applied_desired, policy_platform } = first else {
        return Err(HandshakeError::Unexpected { expected: "hello", got: first.kind() });
    };
    let version = negotiate(Side::Operator, *version).map_err(HandshakeError::Version)?;
    if claimed != node {
        return Err(HandshakeError::WrongNode { token: node.to_owned(), hello: claimed.clone() });
    }
    Ok(Accepted {
        version,
        last_applied_desired: *last_applied_desired,
        policy_platform: policy_platform.clone(),
        welcome: Message::Welcome { version, heartbeat_secs, last_applied_report },
    })
}

/// A `welcome` the edge accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Welcomed {
    pub version: u32,
    pub heartbeat: Duration,
    /// For [`super::Sender::connected`].
    pub last_applied_report: u64,
}

/// The edge's reading of the cloud's first frame.
pub fn read_welcome(first: &Message) -> Result<Welcomed, HandshakeError> {
    read_welcome_between(MIN_SUPPORTED, PROTOCOL_VERSION, first)
}

fn read_welcome_between(min: u32, max: u32, first: &Message) -> Result<Welcomed, HandshakeError> {
    match first {
        Message::Welcome { version, heartbeat_secs, last_applied_report } => {
            // The operator chose; the edge only checks it can speak the choice.
            negotiate_between(Side::Edge, min, max, *version).map_err(HandshakeError::Version)?;
            if *version > max {
                return Err(HandshakeError::UnsupportedChoice { chosen: *version, min, max });
            }
            if *heartbeat_secs == 0 {
                return Err(HandshakeError::NoHeartbeat);
            }
            Ok(Welcomed {
                version: *version,
                heartbeat: Duration::from_secs(u64::from(*heartbeat_secs)),
                last_applied_report: *last_applied_report,
            })
        }
        Message::Refused { reason } => Err(HandshakeError::Refused(reason.clone())),
        other => Err(HandshakeError::Unexpected { expected: "welcome", got: other.kind() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello_with(version: u32, node: &str) -> Message {
        Message::Hello { version, node: node.into(), last_applied_desired: 5, policy_platform: None }
    }

    #[test]
    fn the_cloud_answers_a_hello() {
        let welcome = Message::Welcome { version: 1, heartbeat_secs: 15, last_applied_report: 9 };
        let cases: [(Message, Result<Message, &str>); 6] = [
            (hello_with(1, "edge-1"), Ok(welcome.clone())),
            // A newer edge is offered our version; it decides.
            (hello_with(7, "edge-1"), Ok(welcome)),
            (
                hello_with(0, "edge-1"),
                Err("edge speaks link protocol 0, this operator speaks 1..=1; upgrade the edge agent"),
            ),
            (hello_with(1, "edge-2"), Err("hello from node `edge-2` on a connection authenticated as node `edge-1`")),
            (
                Message::Report { seq: 1, body: serde_json::json!({}) },
                Err("expected a `hello` frame first, got `report`"),
            ),
            (Message::Ping { nonce: 1 }, Err("expected a `hello` frame first, got `ping`")),
        ];
        for (first, expected) in cases {
            match (accept_hello("edge-1", &first, 9, 15), expected) {
                (Ok(accepted), Ok(welcome)) => {
                    assert_eq!(accepted.welcome, welcome);
                    assert_eq!(accepted.version, 1);
                    assert_eq!(accepted.last_applied_desired, 5);
                }
                (Err(err), Err(reason)) => {
                    assert_eq!(err.to_string(), reason);
                    assert_eq!(err.refusal(), Message::Refused { reason: reason.into() });
                }
                (got, expected) => panic!("{first:?}: got {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn an_old_edge_is_refused_naming_both_versions() {
        let err = accept_hello("edge-1", &hello_with(0, "edge-1"), 0, 15).unwrap_err();
        let Message::Refused { reason } = err.refusal() else { panic!("not a refusal") };
        assert!(reason.contains("edge speaks link protocol 0"), "{reason}");
        assert!(reason.contains("this operator speaks 1..=1"), "{reason}");
        assert!(reason.contains("upgrade the edge agent"), "{reason}");
        // The edge reads the refusal and says who refused.
        assert_eq!(
            read_welcome(&err.refusal()).unwrap_err().to_string(),
            format!("the operator refused the link: {reason}")
        );
    }

    #[test]
    fn the_edge_reads_the_welcome() {
        let welcome = |version, heartbeat_secs| Message::Welcome { version, heartbeat_secs, last_applied_report: 3 };
        // (edge speaks min..=max, first frame, expected)
        let cases: [(u32, u32, Message, Result<Welcomed, &str>); 6] = [
            (
                1,
                1,
                welcome(1, 15),
                Ok(Welcomed { version: 1, heartbeat: Duration::from_secs(15), last_applied_report: 3 }),
            ),
            (
                2,
                3,
                welcome(1, 15),
                Err("operator speaks link protocol 1, this edge agent speaks 2..=3; upgrade the operator"),
            ),
            (
                1,
                1,
                welcome(2, 15),
                Err("the operator chose link protocol 2, which this edge agent does not speak (1..=1)"),
            ),
            (1, 1, welcome(1, 0), Err("the operator's welcome has a heartbeat interval of 0 seconds")),
            (1, 1, Message::Refused { reason: "bad token".into() }, Err("the operator refused the link: bad token")),
            (1, 1, Message::Ack { seq: 1 }, Err("expected a `welcome` frame first, got `ack`")),
        ];
        for (min, max, first, expected) in cases {
            let got = read_welcome_between(min, max, &first).map_err(|err| err.to_string());
            assert_eq!(got, expected.map_err(str::to_owned), "{min}..={max} {first:?}");
        }
    }

    #[test]
    fn a_hello_round_trips() {
        let accepted = accept_hello("edge-1", &hello("edge-1", 12, None), 40, 15).unwrap();
        assert_eq!(accepted.last_applied_desired, 12);
        let welcomed = read_welcome(&accepted.welcome).unwrap();
        assert_eq!(welcomed.last_applied_report, 40);
        assert_eq!(welcomed.version, PROTOCOL_VERSION);
    }

    #[test]
    fn the_cloud_learns_the_nodes_policy_platform_from_its_hello() {
        let platform =
            PolicyPlatform { platform: "pulley32".into(), fingerprint: "wasmtime-48.0.8".into(), compiles: false };
        // Through the wire, as the cloud reads it.
        let said = crate::decode(&crate::encode(&hello("edge-1", 3, Some(platform.clone()))).unwrap()).unwrap();
        let accepted = accept_hello("edge-1", &said, 0, 15).unwrap();
        assert_eq!(accepted.policy_platform, Some(platform));
        // An edge that says none (or an older edge, whose hello has no such field) gets none.
        let old =
            crate::decode(r#"{"type": "hello", "version": 1, "node": "edge-1", "lastAppliedDesired": 3}"#).unwrap();
        assert_eq!(accept_hello("edge-1", &old, 0, 15).unwrap().policy_platform, None);
        let text = crate::encode(&hello("edge-1", 3, None)).unwrap();
        assert!(!text.contains("policyPlatform"), "{text}");
        assert_eq!(accept_hello("edge-1", &crate::decode(&text).unwrap(), 0, 15).unwrap().policy_platform, None);
    }
}
