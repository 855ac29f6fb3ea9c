//! The edge's sending side of the report stream: bookkeeping over the durable outbox.
//!
//! The outbox is a SQLite table whose `seq` is an AUTOINCREMENT key: strictly increasing, with
//! gaps where rows were deleted. The shell reads rows when [`Sender::fetch`] says so, hands each
//! to [`Sender::send`] and writes the frame it returns; it deletes rows as [`Delete`] says, after
//! a `welcome`, an `ack` or a `reject`. The sender keeps only seqs (bodies stay in SQLite), so an
//! edge restart loses nothing: a new sender and the cloud's `welcome` say where to resume.
//!
//! Window: at most `window` reports are sent and not yet acknowledged or rejected (a slow or
//! stuck cloud makes the edge wait, it never buffers the outbox in memory). After a reconnect
//! everything not acknowledged is resent in order, from just after the cloud's
//! `last_applied_report`.

use std::collections::VecDeque;

use serde_json::Value;

use super::messages::{Message, WINDOW};

/// Outbox rows the shell may delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delete {
    /// Every row with a seq ≤ this one (`DELETE FROM outbox WHERE seq <= ?`): durable in the cloud.
    Through(u64),
    /// The row with this seq: rejected by the cloud, or unsendable.
    Only(u64),
}

/// What to read from the outbox next: up to `limit` rows with a seq > `after`, by seq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fetch {
    pub after: u64,
    pub limit: usize,
}

/// A step the sender refuses: a bug in the shell, or a cloud breaking the protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("report {seq} was handed to the link while it is down")]
    NotConnected { seq: u64 },
    #[error("report {seq} is not after the last report handed to the link ({last})")]
    NotIncreasing { seq: u64, last: u64 },
    #[error("report {seq} is over the window of {window} reports in flight")]
    WindowFull { seq: u64, window: usize },
    #[error("the operator acknowledged report {seq}, but only reports up to {last} were sent on this connection")]
    AckUnsent { seq: u64, last: u64 },
    #[error("the operator rejected report {seq}, but only reports up to {last} were sent on this connection")]
    RejectUnsent { seq: u64, last: u64 },
    /// The cloud holds a watermark from an earlier outbox of this node (the edge's database was
    /// replaced, and its AUTOINCREMENT started again at 1). Resuming would delete reports the
    /// cloud never saw; the shell must move the outbox's sequence above `cloud` (renumbering the
    /// rows it holds, in order) and connect again.
    #[error(
        "the operator has applied reports up to {cloud}, but this outbox never numbered a report above {allocated}: \
         the edge database was replaced; renumber the outbox above {cloud}"
    )]
    CloudAhead { cloud: u64, allocated: u64 },
}

/// The report stream's state on the edge.
#[derive(Clone, Debug)]
pub struct Sender {
    window: usize,
    /// Every seq ≤ this is durable in the cloud (from `welcome` or `ack`).
    acked: u64,
    /// The last seq handed to [`Sender::send`] or [`Sender::unsendable`] on this connection.
    last_sent: u64,
    /// Sent on this connection, neither acknowledged nor rejected, in seq order.
    in_flight: VecDeque<u64>,
    connected: bool,
}

impl Default for Sender {
    fn default() -> Self {
        Sender::new()
    }
}

impl Sender {
    /// A sender with the protocol's window ([`WINDOW`]); disconnected until a `welcome`.
    pub fn new() -> Sender {
        Sender::with_window(WINDOW)
    }

    /// A sender with a smaller window (clamped to `1..=WINDOW`: the cloud refuses more).
    pub fn with_window(window: usize) -> Sender {
        Sender { window: window.clamp(1, WINDOW), acked: 0, last_sent: 0, in_flight: VecDeque::new(), connected: false }
    }

    /// A `welcome` arrived saying the cloud holds every report ≤ `last_applied_report`.
    /// `allocated` is the highest seq the outbox ever numbered (SQLite's `sqlite_sequence` for the
    /// table, 0 if none). Returns the rows to delete; sending resumes after them, in order.
    pub fn connected(&mut self, last_applied_report: u64, allocated: u64) -> Result<Option<Delete>, SendError> {
        if last_applied_report > allocated {
            return Err(SendError::CloudAhead { cloud: last_applied_report, allocated });
        }
        // A cloud that went back (lost state it had acknowledged) cannot get those rows again:
        // they are deleted. Resume after the higher of the two.
        self.acked = self.acked.max(last_applied_report);
        self.last_sent = self.acked;
        self.in_flight.clear();
        self.connected = true;
        Ok((self.acked > 0).then_some(Delete::Through(self.acked)))
    }

    /// The connection is gone: whatever was in flight is sent again after the next `welcome`.
    pub fn disconnected(&mut self) {
        self.connected = false;
        self.in_flight.clear();
        self.last_sent = self.acked;
    }

    /// The rows to read next, if the window has room.
    pub fn fetch(&self) -> Option<Fetch> {
        let room = self.window - self.in_flight.len();
        (self.connected && room > 0).then_some(Fetch { after: self.last_sent, limit: room })
    }

    /// Outbox row `seq` is being sent: the frame to write.
    pub fn send(&mut self, seq: u64, body: Value) -> Result<Message, SendError> {
        if !self.connected {
            return Err(SendError::NotConnected { seq });
        }
        if seq <= self.last_sent {
            return Err(SendError::NotIncreasing { seq, last: self.last_sent });
        }
        if self.in_flight.len() >= self.window {
            return Err(SendError::WindowFull { seq, window: self.window });
        }
        self.last_sent = seq;
        self.in_flight.push_back(seq);
        Ok(Message::Report { seq, body })
    }

    /// Outbox row `seq` cannot be sent (its frame is over the size cap): it is skipped and
    /// deleted, like a rejected report, so that it does not block the rows after it.
    pub fn unsendable(&mut self, seq: u64) -> Result<Delete, SendError> {
        if seq <= self.last_sent {
            return Err(SendError::NotIncreasing { seq, last: self.last_sent });
        }
        self.last_sent = seq;
        Ok(Delete::Only(seq))
    }

    /// An `ack`: every report ≤ `seq` is durable in the cloud. `None` when it says nothing new.
    pub fn ack(&mut self, seq: u64) -> Result<Option<Delete>, SendError> {
        // The cloud acks only what it received on this connection (see the receiver), so an ack
        // above what was sent is a broken cloud; believing it would delete unsent rows.
        if seq > self.last_sent {
            return Err(SendError::AckUnsent { seq, last: self.last_sent });
        }
        while self.in_flight.front().is_some_and(|&sent| sent <= seq) {
            self.in_flight.pop_front();
        }
        if seq <= self.acked {
            return Ok(None);
        }
        self.acked = seq;
        Ok(Some(Delete::Through(seq)))
    }

    /// A `reject`: report `seq` will never be applied; it leaves the window and the outbox.
    pub fn reject(&mut self, seq: u64) -> Result<Delete, SendError> {
        if seq > self.last_sent {
            return Err(SendError::RejectUnsent { seq, last: self.last_sent });
        }
        // Not in flight: already acked, or rejected twice; deleting again is harmless.
        if let Ok(at) = self.in_flight.binary_search(&seq) {
            self.in_flight.remove(at);
        }
        Ok(Delete::Only(seq))
    }

    /// Every report ≤ this is durable in the cloud.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Reports sent and awaiting an `ack` or a `reject`, oldest first.
    pub fn in_flight(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        self.in_flight.iter().copied()
    }

    pub fn is_connected(&self) -> bool {
        self.connected
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// One step of a sender's life, as the shell would drive it.
    #[derive(Debug)]
    enum Step {
        Welcome(u64),
        Cut,
        Send(u64),
        Unsendable(u64),
        Ack(u64),
        Reject(u64),
    }
    use Step::{Ack, Cut, Reject, Send, Unsendable, Welcome};

    /// What a step answered.
    #[derive(Debug, PartialEq)]
    enum Out {
        Ok,
        Del(Option<Delete>),
        Err(SendError),
    }

    fn run(window: usize, allocated: u64, steps: &[Step]) -> (Sender, Vec<Out>) {
        let mut sender = Sender::with_window(window);
        let outs = steps
            .iter()
            .map(|step| match *step {
                Welcome(w) => match sender.connected(w, allocated) {
                    Ok(delete) => Out::Del(delete),
                    Err(err) => Out::Err(err),
                },
                Cut => {
                    sender.disconnected();
                    Out::Ok
                }
                Send(seq) => match sender.send(seq, json!({"n": seq})) {
                    Ok(frame) => {
                        assert_eq!(frame, Message::Report { seq, body: json!({"n": seq}) });
                        Out::Ok
                    }
                    Err(err) => Out::Err(err),
                },
                Unsendable(seq) => sender.unsendable(seq).map_or_else(Out::Err, |d| Out::Del(Some(d))),
                Ack(seq) => sender.ack(seq).map_or_else(Out::Err, Out::Del),
                Reject(seq) => sender.reject(seq).map_or_else(Out::Err, |d| Out::Del(Some(d))),
            })
            .collect();
        (sender, outs)
    }

    const NONE: Out = Out::Del(None);

    fn through(seq: u64) -> Out {
        Out::Del(Some(Delete::Through(seq)))
    }

    fn only(seq: u64) -> Out {
        Out::Del(Some(Delete::Only(seq)))
    }

    #[test]
    fn table() {
        struct Case {
            name: &'static str,
            window: usize,
            steps: Vec<Step>,
            outs: Vec<Out>,
            in_flight: Vec<u64>,
            fetch: Option<Fetch>,
        }
        let cases = vec![
            Case {
                name: "nothing is sent before a welcome",
                window: 4,
                steps: vec![Send(1)],
                outs: vec![Out::Err(SendError::NotConnected { seq: 1 })],
                in_flight: vec![],
                fetch: None,
            },
            Case {
                name: "a fresh edge and a fresh cloud",
                window: 4,
                steps: vec![Welcome(0), Send(1), Send(2)],
                outs: vec![NONE, Out::Ok, Out::Ok],
                in_flight: vec![1, 2],
                fetch: Some(Fetch { after: 2, limit: 2 }),
            },
            Case {
                name: "the welcome deletes what the cloud holds and resumes after it",
                window: 4,
                steps: vec![Welcome(7)],
                outs: vec![through(7)],
                in_flight: vec![],
                fetch: Some(Fetch { after: 7, limit: 4 }),
            },
            Case {
                name: "gaps are fine, going back is not",
                window: 4,
                steps: vec![Welcome(0), Send(3), Send(9), Send(9), Send(4)],
                outs: vec![
                    NONE,
                    Out::Ok,
                    Out::Ok,
                    Out::Err(SendError::NotIncreasing { seq: 9, last: 9 }),
                    Out::Err(SendError::NotIncreasing { seq: 4, last: 9 }),
                ],
                in_flight: vec![3, 9],
                fetch: Some(Fetch { after: 9, limit: 2 }),
            },
            Case {
                name: "the window fills and no fetch is asked",
                window: 2,
                steps: vec![Welcome(0), Send(1), Send(2), Send(3)],
                outs: vec![NONE, Out::Ok, Out::Ok, Out::Err(SendError::WindowFull { seq: 3, window: 2 })],
                in_flight: vec![1, 2],
                fetch: None,
            },
            Case {
                name: "acks are cumulative and free the window",
                window: 3,
                steps: vec![Welcome(0), Send(1), Send(2), Send(5), Ack(2)],
                outs: vec![NONE, Out::Ok, Out::Ok, Out::Ok, through(2)],
                in_flight: vec![5],
                fetch: Some(Fetch { after: 5, limit: 2 }),
            },
            Case {
                name: "an ack in a gap covers what is below it",
                window: 3,
                steps: vec![Welcome(0), Send(2), Send(6), Ack(4)],
                outs: vec![NONE, Out::Ok, Out::Ok, through(4)],
                in_flight: vec![6],
                fetch: Some(Fetch { after: 6, limit: 2 }),
            },
            Case {
                name: "an old or repeated ack says nothing new",
                window: 3,
                steps: vec![Welcome(0), Send(1), Send(2), Ack(2), Ack(1), Ack(2)],
                outs: vec![NONE, Out::Ok, Out::Ok, through(2), NONE, NONE],
                in_flight: vec![],
                fetch: Some(Fetch { after: 2, limit: 3 }),
            },
            Case {
                name: "an ack of something never sent is refused (it would delete unsent rows)",
                window: 3,
                steps: vec![Welcome(0), Send(1), Ack(2)],
                outs: vec![NONE, Out::Ok, Out::Err(SendError::AckUnsent { seq: 2, last: 1 })],
                in_flight: vec![1],
                fetch: Some(Fetch { after: 1, limit: 2 }),
            },
            Case {
                name: "a reject drops one report from the middle of the window",
                window: 3,
                steps: vec![Welcome(0), Send(1), Send(2), Send(3), Reject(2)],
                outs: vec![NONE, Out::Ok, Out::Ok, Out::Ok, only(2)],
                in_flight: vec![1, 3],
                fetch: Some(Fetch { after: 3, limit: 1 }),
            },
            Case {
                name: "a rejected report is not resent after a reconnect",
                window: 3,
                // The shell deleted row 2 on the reject, so the fetch after the welcome skips it.
                steps: vec![Welcome(0), Send(1), Send(2), Reject(2), Cut, Welcome(0), Send(1), Send(3)],
                outs: vec![NONE, Out::Ok, Out::Ok, only(2), Out::Ok, NONE, Out::Ok, Out::Ok],
                in_flight: vec![1, 3],
                fetch: Some(Fetch { after: 3, limit: 1 }),
            },
            Case {
                name: "a repeated reject is harmless; a reject of something never sent is refused",
                window: 3,
                steps: vec![Welcome(0), Send(1), Reject(1), Reject(1), Reject(4)],
                outs: vec![NONE, Out::Ok, only(1), only(1), Out::Err(SendError::RejectUnsent { seq: 4, last: 1 })],
                in_flight: vec![],
                fetch: Some(Fetch { after: 1, limit: 3 }),
            },
            Case {
                name: "a cut sends everything unacked again, in order",
                window: 4,
                steps: vec![Welcome(0), Send(1), Send(2), Send(3), Ack(1), Cut, Welcome(2), Send(3)],
                outs: vec![NONE, Out::Ok, Out::Ok, Out::Ok, through(1), Out::Ok, through(2), Out::Ok],
                in_flight: vec![3],
                fetch: Some(Fetch { after: 3, limit: 3 }),
            },
            Case {
                name: "nothing is fetched while cut",
                window: 4,
                steps: vec![Welcome(0), Send(1), Cut],
                outs: vec![NONE, Out::Ok, Out::Ok],
                in_flight: vec![],
                fetch: None,
            },
            Case {
                name: "a cloud that went back cannot get deleted rows again",
                window: 4,
                steps: vec![Welcome(0), Send(1), Send(2), Ack(2), Cut, Welcome(1)],
                outs: vec![NONE, Out::Ok, Out::Ok, through(2), Out::Ok, through(2)],
                in_flight: vec![],
                fetch: Some(Fetch { after: 2, limit: 4 }),
            },
            Case {
                name: "an unsendable row is skipped and deleted",
                window: 4,
                steps: vec![Welcome(0), Send(1), Unsendable(2), Send(3), Unsendable(3)],
                outs: vec![NONE, Out::Ok, only(2), Out::Ok, Out::Err(SendError::NotIncreasing { seq: 3, last: 3 })],
                in_flight: vec![1, 3],
                fetch: Some(Fetch { after: 3, limit: 2 }),
            },
            Case {
                name: "a cloud ahead of this outbox is refused",
                window: 4,
                steps: vec![Welcome(500)],
                outs: vec![Out::Err(SendError::CloudAhead { cloud: 500, allocated: 100 })],
                in_flight: vec![],
                fetch: None,
            },
        ];
        for case in cases {
            let (sender, outs) = run(case.window, 100, &case.steps);
            assert_eq!(outs, case.outs, "{}", case.name);
            assert_eq!(sender.in_flight().collect::<Vec<_>>(), case.in_flight, "{}", case.name);
            assert_eq!(sender.fetch(), case.fetch, "{}", case.name);
        }
    }

    #[test]
    fn the_window_is_clamped() {
        assert_eq!(Sender::with_window(0).window, 1);
        assert_eq!(Sender::with_window(10_000).window, WINDOW);
        assert_eq!(Sender::new().window, WINDOW);
    }
}
