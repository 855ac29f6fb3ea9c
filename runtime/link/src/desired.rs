//! The node's desired state (its jobs and datasets) on its way from the cloud to the edge.
//!
//! The cloud keeps, per node, what the node should hold ([`DesiredSender`]); on each connection
//! it sends all of it (`full`), then only what changed, each `desired` with a higher seq. A cut
//! loses nothing: the next connection starts with a full state again, numbered above the edge's
//! `lastAppliedDesired` so that seqs keep increasing even across a cloud restart. Changes made
//! while messages are unacknowledged coalesce (at most [`DESIRED_WINDOW`] in flight, the latest
//! value of each object wins), so a slow edge costs bounded memory; Sedna kept an unbounded queue
//! per node and had no acks (`reference/sedna.md` §3).
//!
//! The edge ([`DesiredReceiver`]) turns each `desired` into the [`Changes`] to commit, then acks.
//! Objects are opaque JSON; both ends key them by `metadata.namespace/metadata.name`
//! ([`object_key`]), which is also what `removedJobs` and `removedDatasets` hold.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use super::messages::Message;

/// The most `desired` messages sent and not yet acknowledged; further changes coalesce.
pub const DESIRED_WINDOW: usize = 16;

/// The two kinds of objects a node holds. Datasets sort first: jobs refer to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Dataset,
    Job,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Dataset => "dataset",
            Kind::Job => "job",
        })
    }
}

/// `namespace/name` of a Kubernetes object's JSON, the key both ends use.
pub fn object_key(object: &Value) -> Option<String> {
    let metadata = object.get("metadata")?;
    let namespace = metadata.get("namespace")?.as_str().filter(|s| !s.is_empty())?;
    let name = metadata.get("name")?.as_str().filter(|s| !s.is_empty())?;
    Some(format!("{namespace}/{name}"))
}

/// A desired-state step refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DesiredError {
    #[error("{kind} object has no metadata.namespace and metadata.name: {object}")]
    NoKey { kind: Kind, object: String },
    #[error("the edge acknowledged desired state {seq}, but only up to {last} was sent")]
    AckUnsent { seq: u64, last: u64 },
    #[error("expected a `desired` frame, got `{0}`")]
    NotDesired(&'static str),
    #[error("desired state {seq} is a change, but this connection has not had a full state yet")]
    DeltaBeforeFull { seq: u64 },
    #[error("desired state {seq} is not after the last one applied ({last})")]
    NotIncreasing { seq: u64, last: u64 },
    #[error("desired state {seq}: {kind} #{index} has no metadata.namespace and metadata.name")]
    ObjectWithoutKey { seq: u64, kind: Kind, index: usize },
}

type Key = (Kind, String);

/// An object of a node's desired state, held as its compact JSON text and shared. Its parsed
/// tree (`serde_json::Value`) took about 7 KiB of the operator's memory for one job (each JSON
/// object a B-tree node of eleven slots), the text about 1 KiB: at fleet size, most of what a
/// node cost besides its connection. Parsed again only to be sent, or to read a field of it.
#[derive(Clone, PartialEq, Eq)]
pub struct DesiredObject(Arc<str>);

impl DesiredObject {
    pub fn new(object: &Value) -> DesiredObject {
        DesiredObject(object.to_string().into())
    }

    /// The object, parsed (a copy).
    pub fn value(&self) -> Value {
        // Made from a `Value`: always valid JSON.
        serde_json::from_str(&self.0).unwrap_or_default()
    }

    /// Its JSON text.
    pub fn text(&self) -> &str {
        &self.0
    }

    /// One field of it, by JSON pointer (`/metadata/uid`).
    pub fn pointer(&self, pointer: &str) -> Option<Value> {
        self.value().pointer(pointer).cloned()
    }
}

impl From<Value> for DesiredObject {
    fn from(object: Value) -> DesiredObject {
        DesiredObject::new(&object)
    }
}

impl From<&Value> for DesiredObject {
    fn from(object: &Value) -> DesiredObject {
        DesiredObject::new(object)
    }
}

impl fmt::Debug for DesiredObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The cloud's side: one node's desired state and what the edge was sent of it.
#[derive(Clone, Debug)]
pub struct DesiredSender {
    window: usize,
    /// What the node should hold. Shared with whoever made it (a fleet's operator holds each
    /// job once, not once per copy of a node's state).
    current: BTreeMap<Key, DesiredObject>,
    /// What the node holds once it applied everything sent on this connection.
    sent: BTreeMap<Key, DesiredObject>,
    /// Keys set or removed since the last message (some may have come back to `sent`).
    dirty: BTreeSet<Key>,
    /// The last seq used.
    seq: u64,
    /// The edge applied everything up to this seq.
    acked: u64,
    /// Sent on this connection and not acknowledged.
    unacked: VecDeque<u64>,
    connected: bool,
}

impl Default for DesiredSender {
    fn default() -> Self {
        DesiredSender::new()
    }
}

impl DesiredSender {
    pub fn new() -> DesiredSender {
        DesiredSender::with_window(DESIRED_WINDOW)
    }

    /// At most `window` messages unacknowledged (at least 1).
    pub fn with_window(window: usize) -> DesiredSender {
        DesiredSender {
            window: window.max(1),
            current: BTreeMap::new(),
            sent: BTreeMap::new(),
            dirty: BTreeSet::new(),
            seq: 0,
            acked: 0,
            unacked: VecDeque::new(),
            connected: false,
        }
    }

    /// The node should hold `object` (added or changed). Returns its key.
    pub fn set(&mut self, kind: Kind, object: impl Into<DesiredObject>) -> Result<String, DesiredError> {
        let object = object.into();
        let Some(key) = object_key(&object.value()) else {
            return Err(DesiredError::NoKey { kind, object: truncated(object.text()) });
        };
        self.dirty.insert((kind, key.clone()));
        self.current.insert((kind, key.clone()), object);
        Ok(key)
    }

    /// The node should no longer hold `key`. False if it was not there.
    pub fn remove(&mut self, kind: Kind, key: &str) -> bool {
        let key = (kind, key.to_owned());
        let removed = self.current.remove(&key).is_some();
        if removed {
            self.dirty.insert(key);
        }
        removed
    }

    /// Whether the node should hold `key` (e.g. may it report on this job).
    pub fn contains(&self, kind: Kind, key: &str) -> bool {
        self.current.contains_key(&(kind, key.to_owned()))
    }

    /// A new connection from an edge that applied up to `last_applied_desired`: the full state.
    pub fn connected(&mut self, last_applied_desired: u64) -> Message {
        self.seq = self.seq.max(last_applied_desired) + 1;
        // The hello is the truth: the edge may have lost its database, or the cloud restarted.
        self.acked = last_applied_desired;
        self.sent = self.current.clone();
        self.dirty.clear();
        self.unacked = VecDeque::from([self.seq]);
        self.connected = true;
        let mut message = Message::Desired {
            seq: self.seq,
            full: true,
            jobs: Vec::new(),
            datasets: Vec::new(),
            removed_jobs: Vec::new(),
            removed_datasets: Vec::new(),
        };
        for ((kind, _), object) in &self.current {
            push_object(&mut message, *kind, object);
        }
        message
    }

    pub fn disconnected(&mut self) {
        self.connected = false;
        self.unacked.clear();
    }

    /// The next change to send, if connected, the window has room and something changed.
    pub fn next_change(&mut self) -> Option<Message> {
        if !self.connected || self.unacked.len() >= self.window {
            return None;
        }
        let mut message = Message::Desired {
            seq: self.seq + 1,
            full: false,
            jobs: Vec::new(),
            datasets: Vec::new(),
            removed_jobs: Vec::new(),
            removed_datasets: Vec::new(),
        };
        let mut changed = false;
        for key in std::mem::take(&mut self.dirty) {
            match self.current.get(&key) {
                Some(object) if self.sent.get(&key) != Some(object) => {
                    push_object(&mut message, key.0, object);
                    self.sent.insert(key, object.clone());
                    changed = true;
                }
                None if self.sent.remove(&key).is_some() => {
                    if let Message::Desired { removed_jobs, removed_datasets, .. } = &mut message {
                        match key.0 {
                            Kind::Job => removed_jobs.push(key.1),
                            Kind::Dataset => removed_datasets.push(key.1),
                        }
                    }
                    changed = true;
                }
                // Set back to what was sent, or added and removed again: nothing to say.
                _ => {}
            }
        }
        if !changed {
            return None;
        }
        self.seq += 1;
        self.unacked.push_back(self.seq);
        Some(message)
    }

    /// A `desiredAck`: the edge applied everything up to `seq` (in order, so cumulative).
    pub fn ack(&mut self, seq: u64) -> Result<(), DesiredError> {
        if seq > self.seq {
            return Err(DesiredError::AckUnsent { seq, last: self.seq });
        }
        while self.unacked.front().is_some_and(|&sent| sent <= seq) {
            self.unacked.pop_front();
        }
        self.acked = self.acked.max(seq);
        Ok(())
    }

    /// The edge applied everything up to this seq.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// The edge holds exactly what it should: connected, everything sent and acknowledged.
    pub fn in_sync(&self) -> bool {
        self.connected && self.unacked.is_empty() && self.sent == self.current
    }
}

/// Adds `object` to a `desired` message (parsed: the message is sent and dropped).
fn push_object(message: &mut Message, kind: Kind, object: &DesiredObject) {
    if let Message::Desired { jobs, datasets, .. } = message {
        match kind {
            Kind::Job => jobs.push(object.value()),
            Kind::Dataset => datasets.push(object.value()),
        }
    }
}

/// The start of an object's JSON, for an error message.
fn truncated(text: &str) -> String {
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// What one `desired` asks the edge to commit, in one transaction, in this order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changes {
    pub seq: u64,
    /// Added or changed, by key.
    pub datasets: Vec<(String, Value)>,
    pub jobs: Vec<(String, Value)>,
    /// To delete: listed by the cloud, or (for a full state) held but not listed.
    pub removed_jobs: Vec<String>,
    pub removed_datasets: Vec<String>,
}

/// The edge's side: the seq it applied last (durable in its SQLite) and whether this
/// connection has had its full state.
#[derive(Clone, Debug)]
pub struct DesiredReceiver {
    last_applied: u64,
    had_full: bool,
}

impl DesiredReceiver {
    pub fn new(last_applied: u64) -> DesiredReceiver {
        DesiredReceiver { last_applied, had_full: false }
    }

    /// For the `hello`.
    pub fn last_applied(&self) -> u64 {
        self.last_applied
    }

    /// A new connection: the cloud starts it with a full state.
    pub fn connected(&mut self) {
        self.had_full = false;
    }

    /// The changes `frame` asks for, given the keys the edge holds now. A full state removes what
    /// it does not list. Commit them with the seq, then call [`DesiredReceiver::applied`].
    pub fn receive(
        &self,
        frame: &Message,
        held_jobs: &BTreeSet<String>,
        held_datasets: &BTreeSet<String>,
    ) -> Result<Changes, DesiredError> {
        let Message::Desired { seq, full, jobs, datasets, removed_jobs, removed_datasets } = frame else {
            return Err(DesiredError::NotDesired(frame.kind()));
        };
        let seq = *seq;
        if !full && !self.had_full {
            return Err(DesiredError::DeltaBeforeFull { seq });
        }
        if seq <= self.last_applied {
            return Err(DesiredError::NotIncreasing { seq, last: self.last_applied });
        }
        let keyed = |kind: Kind, objects: &[Value]| -> Result<Vec<(String, Value)>, DesiredError> {
            objects
                .iter()
                .enumerate()
                .map(|(index, object)| {
                    let key = object_key(object).ok_or(DesiredError::ObjectWithoutKey { seq, kind, index })?;
                    Ok((key, object.clone()))
                })
                .collect()
        };
        let datasets = keyed(Kind::Dataset, datasets)?;
        let jobs = keyed(Kind::Job, jobs)?;
        let removals = |listed: &[(String, Value)], removed: &[String], held: &BTreeSet<String>| -> Vec<String> {
            let mut out: BTreeSet<String> = removed.iter().filter(|key| held.contains(*key)).cloned().collect();
            if *full {
                let listed: BTreeSet<&String> = listed.iter().map(|(key, _)| key).collect();
                out.extend(held.iter().filter(|key| !listed.contains(key)).cloned());
            }
            out.into_iter().collect()
        };
        Ok(Changes {
            seq,
            removed_jobs: removals(&jobs, removed_jobs, held_jobs),
            removed_datasets: removals(&datasets, removed_datasets, held_datasets),
            datasets,
            jobs,
        })
    }

    /// The changes of `seq` are committed: the `desiredAck` to send.
    pub fn applied(&mut self, seq: u64) -> Message {
        self.last_applied = self.last_applied.max(seq);
        self.had_full = true;
        Message::DesiredAck { seq }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(name: &str, generation: u64) -> Value {
        json!({"metadata": {"namespace": "ns", "name": name, "generation": generation}})
    }

    fn desired(
        seq: u64,
        full: bool,
        jobs: &[Value],
        datasets: &[Value],
        removed_jobs: &[&str],
        removed_datasets: &[&str],
    ) -> Message {
        Message::Desired {
            seq,
            full,
            jobs: jobs.to_vec(),
            datasets: datasets.to_vec(),
            removed_jobs: removed_jobs.iter().map(|s| s.to_string()).collect(),
            removed_datasets: removed_datasets.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn an_object_is_held_as_its_text_and_sent_as_it_was() {
        let job = json!({"metadata": {"namespace": "ml", "name": "a"}, "config": {"trigger": null, "n": 3}});
        let held = DesiredObject::from(&job);
        assert_eq!(held.value(), job, "parsed back whole, nulls included");
        assert_eq!(held.text(), job.to_string());
        assert_eq!(held.pointer("/config/n"), Some(json!(3)));
        assert_eq!(held, DesiredObject::new(&job.clone()), "the same object: equal");
        assert_ne!(held, DesiredObject::new(&json!({"metadata": {"namespace": "ml", "name": "b"}})));
        let mut sender = DesiredSender::new();
        sender.set(Kind::Job, held).expect("a key");
        let Message::Desired { jobs, .. } = sender.connected(0) else { panic!("not a desired") };
        assert_eq!(jobs, [job]);
    }

    #[test]
    fn keys() {
        let cases = [
            (json!({"metadata": {"namespace": "a", "name": "b"}}), Some("a/b")),
            (json!({"metadata": {"name": "b"}}), None),
            (json!({"metadata": {"namespace": "", "name": "b"}}), None),
            (json!({"metadata": {"namespace": "a", "name": 3}}), None),
            (json!({"name": "b"}), None),
            (json!("a/b"), None),
        ];
        for (object, key) in cases {
            assert_eq!(object_key(&object).as_deref(), key, "{object}");
        }
    }

    #[test]
    fn sender_table() {
        #[derive(Debug)]
        enum Step {
            Set(Kind, Value),
            Remove(Kind, &'static str),
            Connect(u64),
            Cut,
            Next(Option<Message>),
            Ack(u64, Result<(), DesiredError>),
            InSync(bool),
        }
        use Kind::{Dataset, Job};
        use Step::{Ack, Connect, Cut, InSync, Next, Remove, Set};

        let cases: Vec<(&str, usize, Vec<Step>)> = vec![
            ("nothing is sent before a connection", 4, vec![Set(Job, obj("a", 1)), Next(None), InSync(false)]),
            (
                "a connection opens with everything, above the edge's seq",
                4,
                vec![
                    Set(Job, obj("b", 1)),
                    Set(Dataset, obj("d", 1)),
                    Set(Job, obj("a", 1)),
                    Connect(41),
                    Next(None),
                    Ack(42, Ok(())),
                    InSync(true),
                ],
            ),
            (
                "then only what changed, with increasing seqs",
                4,
                vec![
                    Set(Job, obj("a", 1)),
                    Set(Job, obj("b", 1)),
                    Connect(0),
                    Set(Job, obj("a", 2)),
                    Remove(Job, "ns/b"),
                    Set(Dataset, obj("d", 1)),
                    Next(Some(desired(2, false, &[obj("a", 2)], &[obj("d", 1)], &["ns/b"], &[]))),
                    Next(None),
                    Remove(Dataset, "ns/d"),
                    Next(Some(desired(3, false, &[], &[], &[], &["ns/d"]))),
                    InSync(false),
                    Ack(3, Ok(())),
                    InSync(true),
                ],
            ),
            (
                "no-op changes say nothing (an informer resync)",
                4,
                vec![
                    Set(Job, obj("a", 1)),
                    Connect(0),
                    Set(Job, obj("a", 1)),
                    Set(Job, obj("x", 1)),
                    Remove(Job, "ns/x"),
                    Remove(Job, "ns/nope"),
                    Next(None),
                ],
            ),
            (
                "changes coalesce while the window is full",
                2,
                vec![
                    Connect(0),
                    Set(Job, obj("a", 1)),
                    Next(Some(desired(2, false, &[obj("a", 1)], &[], &[], &[]))),
                    Set(Job, obj("a", 2)),
                    Next(None),
                    Set(Job, obj("a", 3)),
                    Ack(1, Ok(())),
                    Next(Some(desired(3, false, &[obj("a", 3)], &[], &[], &[]))),
                ],
            ),
            (
                "a reconnect sends the full state again, numbered above both",
                4,
                vec![
                    Set(Job, obj("a", 1)),
                    Connect(0),
                    Set(Job, obj("b", 1)),
                    Next(Some(desired(2, false, &[obj("b", 1)], &[], &[], &[]))),
                    Cut,
                    Set(Job, obj("c", 1)),
                    Next(None),
                    Connect(1),
                    Next(None),
                    Ack(3, Ok(())),
                    InSync(true),
                ],
            ),
            (
                "an ack of something never sent is refused; old acks are harmless",
                4,
                vec![
                    Connect(5),
                    Ack(7, Err(DesiredError::AckUnsent { seq: 7, last: 6 })),
                    Ack(2, Ok(())),
                    InSync(false),
                ],
            ),
        ];
        for (name, window, steps) in cases {
            let mut sender = DesiredSender::with_window(window);
            for step in steps {
                match step {
                    Set(kind, object) => {
                        sender.set(kind, object).unwrap();
                    }
                    Remove(kind, key) => {
                        sender.remove(kind, key);
                    }
                    Connect(edge) => {
                        let Message::Desired { seq, full, jobs, datasets, removed_jobs, removed_datasets } =
                            sender.connected(edge)
                        else {
                            panic!("{name}: not a desired")
                        };
                        assert!(full, "{name}");
                        assert!(seq > edge, "{name}");
                        let expect = |kind| {
                            sender
                                .current
                                .iter()
                                .filter(|((k, _), _)| *k == kind)
                                .map(|(_, v)| v.value())
                                .collect::<Vec<_>>()
                        };
                        assert_eq!(jobs, expect(Job), "{name}");
                        assert_eq!(datasets, expect(Dataset), "{name}");
                        assert!(removed_jobs.is_empty() && removed_datasets.is_empty(), "{name}");
                    }
                    Cut => sender.disconnected(),
                    Next(expected) => assert_eq!(sender.next_change(), expected, "{name}"),
                    Ack(seq, expected) => assert_eq!(sender.ack(seq), expected, "{name}: ack {seq}"),
                    InSync(expected) => assert_eq!(sender.in_sync(), expected, "{name}"),
                }
            }
        }
    }

    #[test]
    fn an_object_without_a_key_is_refused() {
        let mut sender = DesiredSender::new();
        let err = sender.set(Kind::Job, json!({"metadata": {"name": "a"}})).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"job object has no metadata.namespace and metadata.name: {"metadata":{"name":"a"}}"#
        );
    }

    #[test]
    fn receiver_table() {
        let held = |keys: &[&str]| keys.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        struct Case {
            name: &'static str,
            last_applied: u64,
            had_full: bool,
            frame: Message,
            held_jobs: BTreeSet<String>,
            expected: Result<Changes, DesiredError>,
        }
        let cases = vec![
            Case {
                name: "a full state replaces what is held",
                last_applied: 3,
                had_full: false,
                frame: desired(4, true, &[obj("a", 2), obj("b", 1)], &[obj("d", 1)], &[], &[]),
                held_jobs: held(&["ns/a", "ns/old"]),
                expected: Ok(Changes {
                    seq: 4,
                    datasets: vec![("ns/d".into(), obj("d", 1))],
                    jobs: vec![("ns/a".into(), obj("a", 2)), ("ns/b".into(), obj("b", 1))],
                    removed_jobs: vec!["ns/old".into()],
                    removed_datasets: vec![],
                }),
            },
            Case {
                name: "a change touches only what it names (and removes only what is held)",
                last_applied: 4,
                had_full: true,
                frame: desired(5, false, &[obj("b", 2)], &[], &["ns/a", "ns/gone"], &[]),
                held_jobs: held(&["ns/a", "ns/b"]),
                expected: Ok(Changes {
                    seq: 5,
                    jobs: vec![("ns/b".into(), obj("b", 2))],
                    removed_jobs: vec!["ns/a".into()],
                    ..Changes::default()
                }),
            },
            Case {
                name: "a change before the connection's full state is refused",
                last_applied: 4,
                had_full: false,
                frame: desired(5, false, &[], &[], &[], &[]),
                held_jobs: held(&[]),
                expected: Err(DesiredError::DeltaBeforeFull { seq: 5 }),
            },
            Case {
                name: "seqs must increase",
                last_applied: 4,
                had_full: true,
                frame: desired(4, false, &[], &[], &[], &[]),
                held_jobs: held(&[]),
                expected: Err(DesiredError::NotIncreasing { seq: 4, last: 4 }),
            },
            Case {
                name: "an object without a key is refused, named by position",
                last_applied: 0,
                had_full: false,
                frame: desired(1, true, &[obj("a", 1), json!({"spec": {}})], &[], &[], &[]),
                held_jobs: held(&[]),
                expected: Err(DesiredError::ObjectWithoutKey { seq: 1, kind: Kind::Job, index: 1 }),
            },
            Case {
                name: "not a desired frame",
                last_applied: 0,
                had_full: false,
                frame: Message::Ping { nonce: 1 },
                held_jobs: held(&[]),
                expected: Err(DesiredError::NotDesired("ping")),
            },
        ];
        for case in cases {
            let receiver = DesiredReceiver { last_applied: case.last_applied, had_full: case.had_full };
            assert_eq!(
                receiver.receive(&case.frame, &case.held_jobs, &BTreeSet::new()),
                case.expected,
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn the_receiver_wants_a_full_state_on_each_connection() {
        let mut receiver = DesiredReceiver::new(7);
        let none = BTreeSet::new();
        receiver.connected();
        assert!(receiver.receive(&desired(8, false, &[], &[], &[], &[]), &none, &none).is_err());
        let changes = receiver.receive(&desired(8, true, &[], &[], &[], &[]), &none, &none).unwrap();
        assert_eq!(receiver.applied(changes.seq), Message::DesiredAck { seq: 8 });
        assert!(receiver.receive(&desired(9, false, &[], &[], &[], &[]), &none, &none).is_ok());
        receiver.connected();
        assert_eq!(
            receiver.receive(&desired(9, false, &[], &[], &[], &[]), &none, &none),
            Err(DesiredError::DeltaBeforeFull { seq: 9 })
        );
        assert_eq!(receiver.last_applied(), 8);
    }
}
