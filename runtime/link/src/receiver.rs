//! The cloud's receiving side of one node's report stream.
//!
//! Built from the node's durable watermark ([`Receiver::new`]), it classifies each `report`:
//! apply it, answer it (a duplicate, a report rejected before), or wait (it is being applied).
//! The shell applies what it is told to, then calls [`Receiver::applied`] or
//! [`Receiver::rejected`] and sends the frames they return; it persists
//! [`Receiver::last_applied`] with each apply, and that is all a restarted cloud needs.
//!
//! Decisions:
//! - Order means increasing, not contiguous. Seqs come from the edge's AUTOINCREMENT, so a row
//!   deleted before it was sent (rejected, unsendable) leaves a gap that will never be filled;
//!   a report above every seq seen so far is applied at once.
//! - The watermark ("last applied", the `welcome`'s `lastAppliedReport`) is the highest seq
//!   below which every report is resolved: applied or rejected. A rejected report is never
//!   applied later, so it counts as handled. With reports still unresolved it is the lowest of
//!   them minus one, which may fall in a gap: "everything ≤ it is durable" is still true.
//! - Acks are cumulative and never above the highest seq received on the current connection
//!   (or the `welcome`'s watermark), so the edge can refuse an ack of something it never sent
//!   rather than delete unsent rows. A report resolved before the edge resent it on this
//!   connection is acknowledged when it is resent.
//! - A reject is answered again if the edge resends the report before the watermark passes it
//!   (the first `reject` may have been lost in a cut).
//! - At most [`WINDOW`] reports are unresolved per node; a report over that is a protocol error
//!   (the edge's own window is never larger), and the shell closes the connection.

use std::collections::{BTreeMap, BTreeSet};

use super::messages::{Message, WINDOW};

/// What to do with a received report.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// New and above everything seen: apply it, then call `applied` or `rejected`.
    Apply,
    /// Already resolved and under the watermark: send this `ack`; do not apply again.
    Duplicate(Message),
    /// Rejected before (the edge may have missed it): send this `reject` again.
    Rejected(Message),
    /// Being applied, or applied while an earlier report is not: its `ack` follows.
    Waiting,
}

/// A report or a resolution the receiver refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReceiveError {
    #[error("report {seq} is over the window of {window} unresolved reports for this node")]
    WindowExceeded { seq: u64, window: usize },
    #[error("report {seq} was resolved, but it is not being applied")]
    NotPending { seq: u64 },
}

/// One node's report stream in the cloud.
#[derive(Clone, Debug)]
pub struct Receiver {
    /// Every report ≤ this is applied or rejected.
    watermark: u64,
    /// The highest seq ever handed out for applying (or the durable watermark).
    highest: u64,
    /// Handed out for applying, not yet resolved.
    pending: BTreeSet<u64>,
    /// Rejected above the watermark, with the reason, to answer a resend.
    rejected: BTreeMap<u64, String>,
    /// The highest seq the edge sent on this connection (or the welcome's watermark): acks and
    /// rejects above it would name rows the edge has not sent yet on this connection.
    ceiling: u64,
    /// The last ack sent on this connection.
    acked: u64,
}

impl Receiver {
    /// The receiver of a node whose reports up to `last_applied` are durable (0: none).
    pub fn new(last_applied: u64) -> Receiver {
        Receiver {
            watermark: last_applied,
            highest: last_applied,
            pending: BTreeSet::new(),
            rejected: BTreeMap::new(),
            ceiling: last_applied,
            acked: last_applied,
        }
    }

    /// Every report ≤ this is applied or rejected: persist it, and send it in the `welcome`.
    pub fn last_applied(&self) -> u64 {
        self.watermark
    }

    /// A new connection from the node: the `welcome`'s `lastAppliedReport`. Reports still being
    /// applied stay so (the edge resends them and is told to wait).
    pub fn connected(&mut self) -> u64 {
        self.ceiling = self.watermark;
        self.acked = self.watermark;
        self.watermark
    }

    /// Classifies report `seq`.
    pub fn receive(&mut self, seq: u64) -> Result<Verdict, ReceiveError> {
        if seq > self.highest {
            if self.pending.len() >= WINDOW {
                return Err(ReceiveError::WindowExceeded { seq, window: WINDOW });
            }
            self.pending.insert(seq);
            self.highest = seq;
            self.ceiling = seq;
            return Ok(Verdict::Apply);
        }
        self.ceiling = self.ceiling.max(seq);
        if seq <= self.watermark {
            self.acked = self.acked.max(self.watermark.min(self.ceiling));
            return Ok(Verdict::Duplicate(Message::Ack { seq: self.acked }));
        }
        if let Some(reason) = self.rejected.get(&seq) {
            return Ok(Verdict::Rejected(Message::Reject { seq, reason: reason.clone() }));
        }
        // Pending, or applied and waiting on an earlier one. A seq in a gap that was never sent
        // cannot arrive from an edge that sends in order; it lands here and is acknowledged with
        // the others, which is harmless.
        Ok(Verdict::Waiting)
    }

    /// Report `seq` is applied durably (the watermark persisted with it). Returns the `ack` to
    /// send, if the watermark moved.
    pub fn applied(&mut self, seq: u64) -> Result<Vec<Message>, ReceiveError> {
        self.resolve(seq)?;
        Ok(self.ack().into_iter().collect())
    }

    /// Report `seq` will never be applied. Returns the `reject` (unless the edge has not resent
    /// it on this connection yet: it is answered when it comes) and the `ack`, if any.
    pub fn rejected(&mut self, seq: u64, reason: &str) -> Result<Vec<Message>, ReceiveError> {
        self.resolve(seq)?;
        let mut frames = Vec::new();
        if seq <= self.ceiling {
            // Before the ack: an ack covering `seq` would make the edge drop it silently.
            frames.push(Message::Reject { seq, reason: reason.to_owned() });
        }
        if seq > self.watermark {
            self.rejected.insert(seq, reason.to_owned());
        }
        frames.extend(self.ack());
        Ok(frames)
    }

    /// Reports handed out and not resolved, lowest first.
    pub fn pending(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        self.pending.iter().copied()
    }

    fn resolve(&mut self, seq: u64) -> Result<(), ReceiveError> {
        if !self.pending.remove(&seq) {
            return Err(ReceiveError::NotPending { seq });
        }
        let watermark = self.pending.first().map_or(self.highest, |lowest| lowest - 1);
        if watermark > self.watermark {
            self.watermark = watermark;
            self.rejected = self.rejected.split_off(&(watermark + 1));
        }
        Ok(())
    }

    /// The cumulative ack the edge has not had yet on this connection.
    fn ack(&mut self) -> Option<Message> {
        let ack = self.watermark.min(self.ceiling);
        (ack > self.acked).then(|| {
            self.acked = ack;
            Message::Ack { seq: ack }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    enum Step {
        Connect,
        Receive(u64),
        Applied(u64),
        Rejected(u64),
    }
    use Step::{Applied, Connect, Receive, Rejected};

    #[derive(Debug, PartialEq)]
    enum Out {
        Welcome(u64),
        Verdict(Verdict),
        Frames(Vec<Message>),
        Err(ReceiveError),
    }

    fn ack(seq: u64) -> Message {
        Message::Ack { seq }
    }

    fn reject(seq: u64) -> Message {
        Message::Reject { seq, reason: format!("no {seq}") }
    }

    fn apply() -> Out {
        Out::Verdict(Verdict::Apply)
    }

    fn waiting() -> Out {
        Out::Verdict(Verdict::Waiting)
    }

    fn frames(frames: &[Message]) -> Out {
        Out::Frames(frames.to_vec())
    }

    fn run(durable: u64, steps: &[Step]) -> (Receiver, Vec<Out>) {
        let mut receiver = Receiver::new(durable);
        let outs = steps
            .iter()
            .map(|step| match *step {
                Connect => Out::Welcome(receiver.connected()),
                Receive(seq) => receiver.receive(seq).map_or_else(Out::Err, Out::Verdict),
                Applied(seq) => receiver.applied(seq).map_or_else(Out::Err, Out::Frames),
                Rejected(seq) => receiver.rejected(seq, &format!("no {seq}")).map_or_else(Out::Err, Out::Frames),
            })
            .collect();
        (receiver, outs)
    }

    #[test]
    fn table() {
        struct Case {
            name: &'static str,
            durable: u64,
            steps: Vec<Step>,
            outs: Vec<Out>,
            last_applied: u64,
        }
        let cases = vec![
            Case {
                name: "in order: apply, then ack",
                durable: 0,
                steps: vec![Connect, Receive(1), Applied(1), Receive(2), Applied(2)],
                outs: vec![Out::Welcome(0), apply(), frames(&[ack(1)]), apply(), frames(&[ack(2)])],
                last_applied: 2,
            },
            Case {
                name: "gaps are applied at once: in order means increasing",
                durable: 3,
                steps: vec![Connect, Receive(7), Applied(7), Receive(100), Applied(100)],
                outs: vec![Out::Welcome(3), apply(), frames(&[ack(7)]), apply(), frames(&[ack(100)])],
                last_applied: 100,
            },
            Case {
                name: "a duplicate is acked again, not applied",
                durable: 5,
                steps: vec![Connect, Receive(4), Receive(5)],
                outs: vec![
                    Out::Welcome(5),
                    Out::Verdict(Verdict::Duplicate(ack(5))),
                    Out::Verdict(Verdict::Duplicate(ack(5))),
                ],
                last_applied: 5,
            },
            Case {
                name: "acks wait for the earliest unresolved report",
                durable: 0,
                steps: vec![Connect, Receive(1), Receive(2), Receive(3), Applied(2), Applied(3), Applied(1)],
                outs: vec![Out::Welcome(0), apply(), apply(), apply(), frames(&[]), frames(&[]), frames(&[ack(3)])],
                last_applied: 3,
            },
            Case {
                name: "a partial resolution acks up to just below the earliest unresolved (gaps included)",
                durable: 0,
                steps: vec![Connect, Receive(1), Receive(4), Receive(9), Applied(1), Applied(4)],
                outs: vec![Out::Welcome(0), apply(), apply(), apply(), frames(&[ack(3)]), frames(&[ack(8)])],
                last_applied: 8,
            },
            Case {
                name: "a reject is sent before the ack that covers it",
                durable: 0,
                steps: vec![Connect, Receive(1), Rejected(1), Receive(2), Receive(3), Rejected(3), Applied(2)],
                outs: vec![
                    Out::Welcome(0),
                    apply(),
                    frames(&[reject(1), ack(1)]),
                    apply(),
                    apply(),
                    frames(&[reject(3)]),
                    frames(&[ack(3)]),
                ],
                last_applied: 3,
            },
            Case {
                name: "a resent report that is still being applied waits",
                durable: 0,
                steps: vec![Connect, Receive(1), Receive(2), Connect, Receive(1), Receive(2), Applied(1), Applied(2)],
                outs: vec![
                    Out::Welcome(0),
                    apply(),
                    apply(),
                    Out::Welcome(0),
                    waiting(),
                    waiting(),
                    frames(&[ack(1)]),
                    frames(&[ack(2)]),
                ],
                last_applied: 2,
            },
            Case {
                name: "acks never run ahead of what the edge resent on this connection",
                durable: 0,
                // 1..3 handed out on the first connection; the edge has resent only 1 when they resolve.
                steps: vec![
                    Connect,
                    Receive(1),
                    Receive(2),
                    Receive(3),
                    Connect,
                    Receive(1),
                    Applied(1),
                    Applied(2),
                    Applied(3),
                    Receive(2),
                    Receive(3),
                ],
                outs: vec![
                    Out::Welcome(0),
                    apply(),
                    apply(),
                    apply(),
                    Out::Welcome(0),
                    waiting(),
                    frames(&[ack(1)]),
                    frames(&[]),
                    frames(&[]),
                    Out::Verdict(Verdict::Duplicate(ack(2))),
                    Out::Verdict(Verdict::Duplicate(ack(3))),
                ],
                last_applied: 3,
            },
            Case {
                name: "a reject the edge may have missed is answered again until the watermark passes it",
                durable: 0,
                steps: vec![
                    Connect,
                    Receive(1),
                    Receive(2),
                    Rejected(2),
                    Connect,
                    Receive(1),
                    Receive(2),
                    Applied(1),
                    Receive(2),
                ],
                outs: vec![
                    Out::Welcome(0),
                    apply(),
                    apply(),
                    frames(&[reject(2)]),
                    Out::Welcome(0),
                    waiting(),
                    Out::Verdict(Verdict::Rejected(reject(2))),
                    frames(&[ack(2)]),
                    Out::Verdict(Verdict::Duplicate(ack(2))),
                ],
                last_applied: 2,
            },
            Case {
                name: "a reject resolved before the edge resent it is sent when it comes",
                durable: 0,
                steps: vec![Connect, Receive(1), Receive(2), Connect, Receive(1), Rejected(2), Receive(2)],
                outs: vec![
                    Out::Welcome(0),
                    apply(),
                    apply(),
                    Out::Welcome(0),
                    waiting(),
                    frames(&[]),
                    Out::Verdict(Verdict::Rejected(reject(2))),
                ],
                last_applied: 0,
            },
            Case {
                name: "a restarted cloud knows only its durable watermark",
                durable: 10,
                steps: vec![Connect, Receive(9), Receive(11), Applied(11)],
                outs: vec![Out::Welcome(10), Out::Verdict(Verdict::Duplicate(ack(10))), apply(), frames(&[ack(11)])],
                last_applied: 11,
            },
            Case {
                name: "resolving what is not pending is refused",
                durable: 0,
                steps: vec![Connect, Receive(1), Applied(1), Applied(1), Rejected(5)],
                outs: vec![
                    Out::Welcome(0),
                    apply(),
                    frames(&[ack(1)]),
                    Out::Err(ReceiveError::NotPending { seq: 1 }),
                    Out::Err(ReceiveError::NotPending { seq: 5 }),
                ],
                last_applied: 1,
            },
        ];
        for case in cases {
            let (receiver, outs) = run(case.durable, &case.steps);
            assert_eq!(outs, case.outs, "{}", case.name);
            assert_eq!(receiver.last_applied(), case.last_applied, "{}", case.name);
        }
    }

    #[test]
    fn an_edge_over_the_window_is_cut_off() {
        let mut receiver = Receiver::new(0);
        receiver.connected();
        for seq in 1..=WINDOW as u64 {
            assert_eq!(receiver.receive(seq), Ok(Verdict::Apply));
        }
        let over = WINDOW as u64 + 1;
        assert_eq!(receiver.receive(over), Err(ReceiveError::WindowExceeded { seq: over, window: WINDOW }));
        // Resends of pending ones are not new: they wait.
        assert_eq!(receiver.receive(1), Ok(Verdict::Waiting));
        // Once one resolves there is room again.
        assert_eq!(receiver.applied(1), Ok(vec![Message::Ack { seq: 1 }]));
        assert_eq!(receiver.receive(over), Ok(Verdict::Apply));
        assert_eq!(receiver.pending().len(), WINDOW);
    }

    #[test]
    fn rejects_are_forgotten_once_the_watermark_passes() {
        let mut receiver = Receiver::new(0);
        receiver.connected();
        for seq in 1..=5 {
            receiver.receive(seq).unwrap();
        }
        for seq in 2..=5 {
            receiver.rejected(seq, "no").unwrap();
        }
        assert_eq!(receiver.rejected.len(), 4);
        assert_eq!(receiver.applied(1).unwrap(), vec![Message::Ack { seq: 5 }]);
        assert!(receiver.rejected.is_empty());
    }
}
