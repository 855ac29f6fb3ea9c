//! The link's parts together, over an in-memory network that loses frames.
//!
//! The simulation drives an edge (outbox, sender, desired receiver) and a cloud (receiver,
//! apply queue, desired sender) the way the shells will, frame by frame through `encode` and
//! `decode`, on a virtual clock. The connection is cut at seeded random points, cleanly or
//! half-open (frames vanish and only the heartbeats notice); the cloud restarts once from its
//! durable watermark, the edge once from its outbox. At the end every report is applied exactly
//! once in increasing order (or rejected and never retried), the outbox is empty and the edge
//! holds exactly the desired state.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use serde_json::{Value, json};

use super::*;

/// A tiny deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True once in `n`.
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

const NODE: &str = "edge-1";
const FOREIGN: &str = "ns/foreign";
const TICK: Duration = Duration::from_millis(100);
const HEARTBEAT_SECS: u32 = 2;

/// One connection: frames in flight each way. A broken (half-open) wire swallows everything.
#[derive(Default)]
struct Wire {
    up: VecDeque<String>,
    down: VecDeque<String>,
    broken: bool,
    lost: usize,
}

impl Wire {
    fn push(queue: &mut VecDeque<String>, broken: bool, lost: &mut usize, message: &Message) {
        let text = encode(message).expect("frames in the simulation are small");
        if broken {
            *lost += 1;
        } else {
            queue.push_back(text);
        }
    }

    fn send_up(&mut self, message: &Message) {
        Wire::push(&mut self.up, self.broken, &mut self.lost, message);
    }

    fn send_down(&mut self, message: &Message) {
        Wire::push(&mut self.down, self.broken, &mut self.lost, message);
    }

    /// Frames in flight are lost.
    fn cut(&mut self) {
        self.lost += self.up.len() + self.down.len();
        self.up.clear();
        self.down.clear();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Conn {
    Down,
    Opening,
    Up,
}

/// The edge: its durable state (the outbox, the held desired state) and the in-memory link.
struct Edge {
    // Durable.
    outbox: BTreeMap<u64, Value>,
    allocated: u64,
    jobs: BTreeMap<String, Value>,
    datasets: BTreeMap<String, Value>,
    last_applied_desired: u64,
    // In memory.
    sender: Sender,
    desired: DesiredReceiver,
    heartbeat: Option<Heartbeat>,
    conn: Conn,
    redial_at: Duration,
    // Observations.
    rejected: BTreeSet<u64>,
}

impl Edge {
    fn new() -> Edge {
        Edge {
            outbox: BTreeMap::new(),
            allocated: 0,
            jobs: BTreeMap::new(),
            datasets: BTreeMap::new(),
            last_applied_desired: 0,
            sender: Sender::with_window(32),
            desired: DesiredReceiver::new(0),
            heartbeat: None,
            conn: Conn::Down,
            redial_at: Duration::ZERO,
            rejected: BTreeSet::new(),
        }
    }

    /// A process restart: only the durable state survives.
    fn restart(&mut self, now: Duration) {
        self.sender = Sender::with_window(32);
        self.desired = DesiredReceiver::new(self.last_applied_desired);
        self.heartbeat = None;
        self.conn = Conn::Down;
        self.redial_at = now + Duration::from_secs(1);
    }

    fn disconnected(&mut self, now: Duration, rng: &mut Rng) {
        self.sender.disconnected();
        self.heartbeat = None;
        self.conn = Conn::Down;
        self.redial_at = now + TICK * (1 + rng.below(10) as u32);
    }

    fn dial(&mut self, wire: &mut Wire, now: Duration) {
        self.conn = Conn::Opening;
        // Until the welcome says the interval, the edge's own default guards the handshake.
        self.heartbeat = Some(Heartbeat::new(Duration::from_secs(u64::from(HEARTBEAT_SECS)), now));
        wire.send_up(&handshake::hello(NODE, self.desired.last_applied(), None));
    }

    /// A new outbox row; sometimes a number is used by a row deleted before it is sent (a gap).
    fn enqueue(&mut self, body: Value, rng: &mut Rng) {
        if rng.one_in(10) {
            self.allocated += 1 + rng.below(3);
        }
        self.allocated += 1;
        self.outbox.insert(self.allocated, body);
    }

    fn delete(&mut self, delete: Delete) {
        match delete {
            Delete::Through(seq) => self.outbox = self.outbox.split_off(&(seq + 1)),
            Delete::Only(seq) => {
                self.outbox.remove(&seq);
            }
        }
    }

    fn on_frame(&mut self, text: &str, wire: &mut Wire, now: Duration) {
        let message = decode(text).expect("frames from the cloud decode");
        if let Some(heartbeat) = &mut self.heartbeat {
            heartbeat.received(now);
        }
        if self.conn == Conn::Opening {
            let welcomed = read_welcome(&message).expect("the cloud welcomes this edge");
            if let Some(delete) = self.sender.connected(welcomed.last_applied_report, self.allocated).unwrap() {
                self.delete(delete);
            }
            self.desired.connected();
            self.heartbeat = Some(Heartbeat::new(welcomed.heartbeat, now));
            self.conn = Conn::Up;
            return;
        }
        match message {
            Message::Ack { seq } => {
                if let Some(delete) = self.sender.ack(seq).unwrap() {
                    self.delete(delete);
                }
            }
            Message::Reject { seq, reason } => {
                assert_eq!(reason, format!("job {FOREIGN} is not on node {NODE}"));
                let delete = self.sender.reject(seq).unwrap();
                self.delete(delete);
                self.rejected.insert(seq);
            }
            frame @ Message::Desired { .. } => {
                let held_jobs = self.jobs.keys().cloned().collect();
                let held_datasets = self.datasets.keys().cloned().collect();
                let changes = self.desired.receive(&frame, &held_jobs, &held_datasets).unwrap();
                // One transaction: the objects and the seq.
                self.datasets.extend(changes.datasets);
                self.jobs.extend(changes.jobs);
                for key in changes.removed_jobs {
                    self.jobs.remove(&key);
                }
                for key in changes.removed_datasets {
                    self.datasets.remove(&key);
                }
                self.last_applied_desired = changes.seq;
                wire.send_up(&self.desired.applied(changes.seq));
            }
            Message::Ping { nonce } => wire.send_up(&Message::Pong { nonce }),
            Message::Pong { nonce } => {
                if let Some(heartbeat) = &mut self.heartbeat {
                    heartbeat.pong(nonce, now);
                }
            }
            other => panic!("the edge got an unexpected `{}`", other.kind()),
        }
    }

    /// Fills the window from the outbox, as the shell does after every event.
    fn send(&mut self, wire: &mut Wire) {
        while let Some(Fetch { after, limit }) = self.sender.fetch() {
            let rows: Vec<(u64, Value)> =
                self.outbox.range(after + 1..).take(limit).map(|(seq, body)| (*seq, body.clone())).collect();
            if rows.is_empty() {
                break;
            }
            for (seq, body) in rows {
                assert!(!self.rejected.contains(&seq), "report {seq} was sent again after its reject");
                wire.send_up(&self.sender.send(seq, body).unwrap());
            }
        }
    }
}

/// The cloud, for this one node: durable state (what was applied, the watermark, the API
/// server's objects) and the in-memory link.
struct Cloud {
    // Durable.
    watermark: u64,
    applied: Vec<u64>,
    truth: BTreeMap<(Kind, String), Value>,
    // In memory.
    receiver: Receiver,
    applying: VecDeque<u64>,
    desired: DesiredSender,
    heartbeat: Option<Heartbeat>,
    conn: Conn,
    // Observations.
    rejected: BTreeSet<u64>,
    verdicts: BTreeMap<&'static str, usize>,
}

impl Cloud {
    fn new() -> Cloud {
        Cloud {
            watermark: 0,
            applied: Vec::new(),
            truth: BTreeMap::new(),
            receiver: Receiver::new(0),
            applying: VecDeque::new(),
            desired: DesiredSender::new(),
            heartbeat: None,
            conn: Conn::Down,
            rejected: BTreeSet::new(),
            verdicts: BTreeMap::new(),
        }
    }

    /// A process restart: the receiver from the durable watermark, the desired state from the
    /// API server (the informers list again); reports being applied are lost.
    fn restart(&mut self) {
        self.receiver = Receiver::new(self.watermark);
        self.applying.clear();
        self.desired = DesiredSender::new();
        for ((kind, _), object) in &self.truth {
            self.desired.set(*kind, object.clone()).unwrap();
        }
        self.heartbeat = None;
        self.conn = Conn::Down;
    }

    fn disconnected(&mut self) {
        self.desired.disconnected();
        self.heartbeat = None;
        self.conn = Conn::Down;
    }

    /// A new connection from the node replaces the old one.
    fn accept(&mut self, now: Duration) {
        if self.conn != Conn::Down {
            self.disconnected();
        }
        self.conn = Conn::Opening;
        self.heartbeat = Some(Heartbeat::new(Duration::from_secs(u64::from(HEARTBEAT_SECS)), now));
    }

    /// The operator's informers saw an object change.
    fn change(&mut self, rng: &mut Rng, generation: u64) {
        let kind = if rng.one_in(3) { Kind::Dataset } else { Kind::Job };
        let name = format!("o{}", rng.below(6));
        let key = (kind, format!("ns/{name}"));
        if rng.one_in(4) {
            self.truth.remove(&key);
            self.desired.remove(kind, &key.1);
        } else {
            let object = json!({"metadata": {"namespace": "ns", "name": name}, "spec": {"generation": generation}});
            self.truth.insert(key, object.clone());
            self.desired.set(kind, object).unwrap();
        }
    }

    fn on_frame(&mut self, text: &str, wire: &mut Wire, now: Duration) {
        let message = decode(text).expect("frames from the edge decode");
        if let Some(heartbeat) = &mut self.heartbeat {
            heartbeat.received(now);
        }
        if self.conn == Conn::Opening {
            let last_applied_report = self.receiver.connected();
            let accepted =
                accept_hello(NODE, &message, last_applied_report, HEARTBEAT_SECS).expect("the edge is welcome");
            wire.send_down(&accepted.welcome);
            wire.send_down(&self.desired.connected(accepted.last_applied_desired));
            self.conn = Conn::Up;
            return;
        }
        match message {
            Message::Report { seq, body } => {
                let verdict = self.receiver.receive(seq).unwrap();
                match self.tally(verdict) {
                    Verdict::Apply if body["job"] == FOREIGN => {
                        // The shell checks the job is on the node before handing the report on.
                        self.rejected.insert(seq);
                        for frame in
                            self.receiver.rejected(seq, &format!("job {FOREIGN} is not on node {NODE}")).unwrap()
                        {
                            wire.send_down(&frame);
                        }
                    }
                    Verdict::Apply => self.applying.push_back(seq),
                    Verdict::Duplicate(frame) | Verdict::Rejected(frame) => wire.send_down(&frame),
                    Verdict::Waiting => {}
                }
            }
            Message::DesiredAck { seq } => self.desired.ack(seq).unwrap(),
            Message::Ping { nonce } => wire.send_down(&Message::Pong { nonce }),
            Message::Pong { nonce } => {
                if let Some(heartbeat) = &mut self.heartbeat {
                    heartbeat.pong(nonce, now);
                }
            }
            other => panic!("the cloud got an unexpected `{}`", other.kind()),
        }
    }

    fn tally(&mut self, verdict: Verdict) -> Verdict {
        let name = match verdict {
            Verdict::Apply => "apply",
            Verdict::Duplicate(_) => "duplicate",
            Verdict::Rejected(_) => "rejected",
            Verdict::Waiting => "waiting",
        };
        *self.verdicts.entry(name).or_default() += 1;
        verdict
    }

    /// Applies up to `count` reports, in the order handed out; each apply writes the watermark in
    /// the same transaction.
    fn apply(&mut self, count: u64, wire: &mut Wire) {
        for _ in 0..count {
            let Some(seq) = self.applying.pop_front() else { break };
            self.applied.push(seq);
            let frames = self.receiver.applied(seq).unwrap();
            self.watermark = self.receiver.last_applied();
            if self.conn == Conn::Up {
                for frame in frames {
                    wire.send_down(&frame);
                }
            }
        }
    }

    fn send(&mut self, wire: &mut Wire) {
        if self.conn == Conn::Up {
            while let Some(frame) = self.desired.next_change() {
                wire.send_down(&frame);
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// Both ends see the close; frames in flight are lost.
    Close,
    /// Frames vanish; only the heartbeats notice.
    HalfOpen,
    CloudRestart,
    EdgeRestart,
}

#[derive(Debug, Default)]
struct Outcome {
    ticks: u64,
    lost_frames: usize,
    half_open_detected: Vec<Duration>,
    reconnects: usize,
    verdicts: BTreeMap<&'static str, usize>,
}

fn simulate(seed: u64, reports: u64, cuts: usize) -> Outcome {
    let mut rng = Rng(seed);
    let mut edge = Edge::new();
    let mut cloud = Cloud::new();
    let mut wire = Wire::default();
    let mut outcome = Outcome::default();

    // Reports arrive ~1.5 per tick, so production lasts ~reports/1.5 ticks; events fall in it.
    let span = reports * 2 / 3;
    let mut events: BTreeMap<u64, Event> = BTreeMap::new();
    while events.len() < cuts {
        let kind = if rng.one_in(2) { Event::Close } else { Event::HalfOpen };
        events.insert(1 + rng.below(span), kind);
    }
    let mut at = 1 + rng.below(span);
    while events.contains_key(&at) {
        at += 1;
    }
    events.insert(at, Event::CloudRestart);
    while events.contains_key(&at) {
        at = 1 + rng.below(span);
    }
    events.insert(at, Event::EdgeRestart);

    let mut produced = 0u64;
    let mut generation = 0u64;
    let mut half_open_since: Option<Duration> = None;
    let mut stalled_until = 0;
    let mut foreign = BTreeSet::new();
    let mut expected = Vec::new();

    for tick in 0..1_000_000u64 {
        let now = TICK * tick as u32;
        outcome.ticks = tick;

        // The world: new reports, object changes, scheduled events.
        for _ in 0..rng.below(4) {
            if produced == reports {
                break;
            }
            produced += 1;
            let job = if rng.one_in(50) { FOREIGN.to_owned() } else { format!("ns/j{}", rng.below(5)) };
            edge.enqueue(json!({"job": job, "n": produced}), &mut rng);
            if job == FOREIGN {
                foreign.insert(edge.allocated);
            } else {
                expected.push(edge.allocated);
            }
        }
        if rng.one_in(20) {
            generation += 1;
            cloud.change(&mut rng, generation);
        }
        match events.remove(&tick) {
            Some(Event::Close) => {
                half_open_since = None;
                wire.cut();
                edge.disconnected(now, &mut rng);
                cloud.disconnected();
            }
            Some(Event::HalfOpen) => {
                wire.cut();
                wire.broken = true;
                half_open_since.get_or_insert(now);
            }
            Some(Event::CloudRestart) => {
                half_open_since = None;
                wire.cut();
                cloud.restart();
                edge.disconnected(now, &mut rng);
            }
            Some(Event::EdgeRestart) => {
                half_open_since = None;
                wire.cut();
                edge.restart(now);
                cloud.disconnected();
            }
            None => {}
        }

        // Dialing: a new connection replaces whatever the cloud thought it had.
        if edge.conn == Conn::Down && now >= edge.redial_at {
            wire.cut();
            wire = Wire { lost: wire.lost, ..Wire::default() };
            half_open_since = None;
            cloud.accept(now);
            edge.dial(&mut wire, now);
            outcome.reconnects += 1;
        }

        // The network delivers some frames each way, in order (a closed end reads nothing).
        for _ in 0..rng.below(9) {
            if cloud.conn == Conn::Down {
                break;
            }
            let Some(text) = wire.up.pop_front() else { break };
            cloud.on_frame(&text, &mut wire, now);
        }
        for _ in 0..rng.below(9) {
            if edge.conn == Conn::Down {
                break;
            }
            let Some(text) = wire.down.pop_front() else { break };
            edge.on_frame(&text, &mut wire, now);
        }

        // The API server is sometimes slow for a while: reports pile up, the edge's window fills.
        if rng.one_in(150) {
            stalled_until = tick + rng.below(60);
        }
        if tick >= stalled_until {
            cloud.apply(rng.below(6), &mut wire);
        }
        if edge.conn == Conn::Up {
            edge.send(&mut wire);
        }
        cloud.send(&mut wire);

        // Keepalive on both ends. Dead closes the connection; on a working wire the close would
        // reach the other end, but a working wire must never be declared dead.
        if let Some(heartbeat) = &mut edge.heartbeat {
            match heartbeat.poll(now) {
                HeartbeatAction::SendPing(nonce) => wire.send_up(&Message::Ping { nonce }),
                HeartbeatAction::Dead => {
                    assert!(wire.broken, "the edge declared a working connection dead at {now:?}");
                    if let Some(since) = half_open_since.take() {
                        outcome.half_open_detected.push(now - since);
                    }
                    edge.disconnected(now, &mut rng);
                }
                HeartbeatAction::Nothing => {}
            }
        }
        if let Some(heartbeat) = &mut cloud.heartbeat {
            match heartbeat.poll(now) {
                HeartbeatAction::SendPing(nonce) => wire.send_down(&Message::Ping { nonce }),
                HeartbeatAction::Dead => {
                    assert!(wire.broken, "the cloud declared a working connection dead at {now:?}");
                    if let Some(since) = half_open_since.take() {
                        outcome.half_open_detected.push(now - since);
                    }
                    cloud.disconnected();
                }
                HeartbeatAction::Nothing => {}
            }
        }

        let settled = produced == reports
            && events.is_empty()
            && edge.conn == Conn::Up
            && edge.outbox.is_empty()
            && cloud.applying.is_empty()
            && cloud.desired.in_sync();
        if settled {
            break;
        }
    }
    outcome.lost_frames = wire.lost;
    outcome.verdicts = cloud.verdicts.clone();

    assert!(events.is_empty(), "the simulation ran out of ticks before its events");
    assert_eq!(produced, reports);
    // Every report applied exactly once, in increasing seq order; rejected ones never.
    assert!(cloud.applied.windows(2).all(|pair| pair[0] < pair[1]), "applied out of order or twice");
    assert_eq!(cloud.applied, expected, "applied reports");
    assert_eq!(cloud.rejected, foreign, "rejected reports");
    assert!(edge.rejected.is_subset(&foreign));
    // The outbox ends empty: everything acknowledged or rejected.
    assert!(edge.outbox.is_empty(), "{} reports left in the outbox", edge.outbox.len());
    // Everything is resolved, so the watermark is the last report.
    let last = expected.iter().chain(&foreign).max().copied().unwrap_or(0);
    assert_eq!(cloud.receiver.last_applied(), last);
    // The edge holds exactly the desired state.
    let want = |kind: Kind| -> BTreeMap<String, Value> {
        cloud.truth.iter().filter(|((k, _), _)| *k == kind).map(|((_, key), v)| (key.clone(), v.clone())).collect()
    };
    assert_eq!(edge.jobs, want(Kind::Job));
    assert_eq!(edge.datasets, want(Kind::Dataset));
    assert_eq!(edge.last_applied_desired, cloud.desired.acked());
    outcome
}

#[test]
fn ten_thousand_reports_survive_cuts_and_restarts() {
    let outcome = simulate(0x5eed_1234_abcd_0001, 10_000, 20);
    // The run exercised what it claims to.
    assert!(outcome.lost_frames > 0, "{outcome:?}");
    assert!(outcome.reconnects >= 15, "{outcome:?}");
    for verdict in ["apply", "duplicate", "waiting"] {
        assert!(outcome.verdicts.get(verdict).is_some_and(|&n| n > 0), "no {verdict}: {outcome:?}");
    }
    println!("{outcome:?}");
    // A half-open connection is declared dead within two heartbeat intervals (polled each tick).
    let limit = Duration::from_secs(2 * u64::from(HEARTBEAT_SECS)) + TICK;
    assert!(!outcome.half_open_detected.is_empty(), "{outcome:?}");
    for detected in &outcome.half_open_detected {
        assert!(*detected <= limit, "half-open connection noticed after {detected:?}: {outcome:?}");
    }
}

#[test]
fn other_seeds() {
    for seed in 1..=8u64 {
        simulate(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 2_000, 20);
    }
}

/// An edge on protocol 0 meets this operator: refused, naming both versions, and the edge says
/// the operator refused it.
#[test]
fn an_old_edge_is_refused() {
    let hello =
        encode(&Message::Hello { version: 0, node: NODE.into(), last_applied_desired: 0, policy_platform: None })
            .unwrap();
    let first = decode(&hello).unwrap();
    let err = accept_hello(NODE, &first, 0, HEARTBEAT_SECS).unwrap_err();
    let refused = decode(&encode(&err.refusal()).unwrap()).unwrap();
    assert_eq!(
        refused,
        Message::Refused {
            reason: "edge speaks link protocol 0, this operator speaks 1..=1; upgrade the edge agent".into()
        }
    );
    let edge_side = read_welcome(&refused).unwrap_err();
    assert_eq!(
        edge_side.to_string(),
        "the operator refused the link: edge speaks link protocol 0, this operator speaks 1..=1; upgrade the edge agent"
    );
}

/// A report the cloud rejects leaves the outbox at once and is not sent again, even after a
/// reconnect, while the reports around it are applied.
#[test]
fn a_rejected_report_is_dropped_without_retry() {
    let mut wire = Wire::default();
    let mut edge = Edge::new();
    let mut cloud = Cloud::new();
    let mut rng = Rng(7);
    let now = Duration::ZERO;
    for (seq, job) in [(1, "ns/a"), (2, FOREIGN), (3, "ns/b")] {
        edge.outbox.insert(seq, json!({"job": job}));
        edge.allocated = seq;
    }
    assert_eq!(edge.outbox.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3]);

    let exchange = |edge: &mut Edge, cloud: &mut Cloud, wire: &mut Wire| {
        for _ in 0..10 {
            edge.send(wire);
            while let Some(text) = wire.up.pop_front() {
                cloud.on_frame(&text, wire, now);
            }
            cloud.send(wire);
            while let Some(text) = wire.down.pop_front() {
                edge.on_frame(&text, wire, now);
            }
        }
    };
    cloud.accept(now);
    edge.dial(&mut wire, now);
    exchange(&mut edge, &mut cloud, &mut wire);
    // 2 rejected at once; 1 and 3 wait in the apply queue.
    assert_eq!(edge.rejected, BTreeSet::from([2]));
    assert_eq!(edge.outbox.keys().copied().collect::<Vec<_>>(), vec![1, 3]);
    assert_eq!(cloud.applying, [1, 3]);

    // A cut, a reconnect: 1 and 3 are resent (and wait), 2 is not.
    wire.cut();
    edge.disconnected(now, &mut rng);
    cloud.disconnected();
    cloud.accept(now);
    edge.dial(&mut wire, now);
    exchange(&mut edge, &mut cloud, &mut wire);
    cloud.apply(2, &mut wire);
    exchange(&mut edge, &mut cloud, &mut wire);
    assert!(edge.outbox.is_empty());
    assert_eq!(cloud.applied, [1, 3]);
    assert_eq!(cloud.receiver.last_applied(), 3);
}

/// The edge's database was replaced (its AUTOINCREMENT restarted) but the cloud remembers the
/// old outbox: the edge refuses to resume rather than delete reports the cloud never saw.
#[test]
fn a_replaced_edge_database_is_noticed() {
    let mut sender = Sender::new();
    let welcome = accept_hello(NODE, &handshake::hello(NODE, 0, None), 5_000, HEARTBEAT_SECS).unwrap().welcome;
    let welcomed = read_welcome(&welcome).unwrap();
    let err = sender.connected(welcomed.last_applied_report, 12).unwrap_err();
    assert_eq!(err, SendError::CloudAhead { cloud: 5_000, allocated: 12 });
    assert!(sender.fetch().is_none());
}

#[test]
fn xorshift_is_deterministic() {
    let mut a = Rng(42);
    let mut b = Rng(42);
    let first: Vec<u64> = (0..5).map(|_| a.next()).collect();
    assert_eq!(first, (0..5).map(|_| b.next()).collect::<Vec<_>>());
    assert_eq!(first.iter().collect::<BTreeSet<_>>().len(), 5);
}
