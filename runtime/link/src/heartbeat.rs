//! Keepalive for either end of a connection: pure timer logic, the clock passed in.
//!
//! Sedna's link had none, so a half-open connection went unnoticed until the next write
//! (`reference/sedna.md` §6.2 #20). Here each end watches what it *receives*: after one interval
//! of silence it sends a `ping` (any frame answers it, a `pong` at the latest), and after two
//! intervals of silence the connection is dead and the shell closes it. Both ends use the
//! interval of the `welcome`, so a live peer always pings or answers in time; the interval must
//! exceed the worst round trip.
//!
//! Time is a [`Duration`] since any fixed epoch of the shell's choosing (e.g. when the process
//! started), so tests drive the clock by hand.

use std::time::Duration;

/// The cloud's default interval, sent to the edge in the `welcome`.
pub const DEFAULT_HEARTBEAT_SECS: u32 = 15;

/// What the shell does now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatAction {
    Nothing,
    /// Send `ping` with this nonce.
    SendPing(u64),
    /// Nothing received for two intervals: close the connection.
    Dead,
}

/// One connection's keepalive.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    interval: Duration,
    last_received: Duration,
    /// A ping was sent since the last frame arrived.
    pinged: bool,
    /// The latest ping: (nonce, when), to measure the round trip.
    last_ping: Option<(u64, Duration)>,
    next_nonce: u64,
}

impl Heartbeat {
    /// The keepalive of a connection opened at `now` (opening counts as hearing from the peer).
    /// An interval under a millisecond is taken as a millisecond.
    pub fn new(interval: Duration, now: Duration) -> Heartbeat {
        Heartbeat {
            interval: interval.max(Duration::from_millis(1)),
            last_received: now,
            pinged: false,
            last_ping: None,
            next_nonce: 1,
        }
    }

    /// Any frame arrived.
    pub fn received(&mut self, now: Duration) {
        self.last_received = self.last_received.max(now);
        self.pinged = false;
    }

    /// A `pong` arrived: a frame like any other. Returns the round trip if it answers the latest
    /// ping.
    pub fn pong(&mut self, nonce: u64, now: Duration) -> Option<Duration> {
        self.received(now);
        match self.last_ping {
            Some((sent, at)) if sent == nonce => {
                self.last_ping = None;
                Some(now.saturating_sub(at))
            }
            _ => None,
        }
    }

    /// What to do at `now`.
    pub fn poll(&mut self, now: Duration) -> HeartbeatAction {
        let silent = now.saturating_sub(self.last_received);
        if silent >= self.interval * 2 {
            return HeartbeatAction::Dead;
        }
        if silent >= self.interval && !self.pinged {
            let nonce = self.next_nonce;
            self.next_nonce += 1;
            self.pinged = true;
            self.last_ping = Some((nonce, now));
            return HeartbeatAction::SendPing(nonce);
        }
        HeartbeatAction::Nothing
    }

    /// When [`Heartbeat::poll`] next has something to do (unless a frame arrives first).
    pub fn next_poll(&self) -> Duration {
        let after = if self.pinged { self.interval * 2 } else { self.interval };
        self.last_received + after
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HeartbeatAction::{Dead, Nothing, SendPing};

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[derive(Debug)]
    enum Step {
        Poll(u64, HeartbeatAction),
        Received(u64),
        Pong(u64, u64, Option<Duration>),
        NextPoll(u64),
    }
    use Step::{NextPoll, Poll, Pong, Received};

    #[test]
    fn table() {
        // Interval 1000 ms, connection opened at 0.
        let cases: Vec<(&str, Vec<Step>)> = vec![
            ("quiet within an interval", vec![NextPoll(1000), Poll(0, Nothing), Poll(999, Nothing)]),
            (
                "one ping per silence",
                vec![Poll(1000, SendPing(1)), Poll(1500, Nothing), NextPoll(2000), Poll(1999, Nothing)],
            ),
            ("dead at two intervals of silence", vec![Poll(1000, SendPing(1)), Poll(2000, Dead), Poll(2500, Dead)]),
            ("dead even if polled late, without a ping first", vec![Poll(5000, Dead)]),
            (
                "a pong keeps it alive and measures the round trip",
                vec![
                    Poll(1000, SendPing(1)),
                    Pong(1, 1030, Some(ms(30))),
                    NextPoll(2030),
                    Poll(2029, Nothing),
                    Poll(2030, SendPing(2)),
                ],
            ),
            (
                "any frame keeps it alive; a stale pong does too but measures nothing",
                vec![
                    Poll(1000, SendPing(1)),
                    Received(1900),
                    Poll(2000, Nothing),
                    Poll(2900, SendPing(2)),
                    Pong(1, 3000, None),
                    Poll(3999, Nothing),
                    Poll(4000, SendPing(3)),
                    Pong(3, 4100, Some(ms(100))),
                ],
            ),
            (
                "a busy connection never pings",
                (1..=10).flat_map(|i| [Received(i * 600), Poll(i * 600 + 599, Nothing)]).collect(),
            ),
            ("time going back is no silence", vec![Received(5000), Poll(4000, Nothing), Poll(6000, SendPing(1))]),
        ];
        for (name, steps) in cases {
            let mut heartbeat = Heartbeat::new(ms(1000), ms(0));
            for step in steps {
                match step {
                    Poll(at, expected) => assert_eq!(heartbeat.poll(ms(at)), expected, "{name}: at {at}"),
                    Received(at) => heartbeat.received(ms(at)),
                    Pong(nonce, at, rtt) => assert_eq!(heartbeat.pong(nonce, ms(at)), rtt, "{name}: pong at {at}"),
                    NextPoll(at) => assert_eq!(heartbeat.next_poll(), ms(at), "{name}"),
                }
            }
        }
    }

    /// A half-open connection: the peer is gone, nothing arrives. Polled as the shell does (at
    /// `next_poll`), or on a fine tick, it is dead within two intervals of the last frame.
    #[test]
    fn a_half_open_connection_is_dead_within_two_intervals() {
        for interval in [1, 7, 1000, 15_000] {
            let interval = ms(interval);
            let last_frame = ms(12_345);
            let mut heartbeat = Heartbeat::new(interval, ms(0));
            heartbeat.received(last_frame);

            // At the deadlines the shell sleeps to.
            let mut now;
            let mut pings = 0;
            loop {
                now = heartbeat.next_poll();
                match heartbeat.poll(now) {
                    SendPing(_) => pings += 1,
                    Dead => break,
                    Nothing => panic!("woken for nothing at {now:?}"),
                }
            }
            assert_eq!(now - last_frame, interval * 2);
            assert_eq!(pings, 1);

            // On a 1 ms tick.
            let mut heartbeat = Heartbeat::new(interval, last_frame);
            let mut now = last_frame;
            while heartbeat.poll(now) != Dead {
                now += ms(1);
            }
            assert!(now - last_frame <= interval * 2, "{interval:?}: dead after {:?}", now - last_frame);
        }
    }

    /// A live peer that answers every ping within the interval is never declared dead.
    #[test]
    fn a_live_peer_is_never_dead() {
        for rtt in [0, 1, 500, 999] {
            let mut heartbeat = Heartbeat::new(ms(1000), ms(0));
            let mut answer: Option<(u64, u64)> = None;
            for now in 0..100_000 {
                if let Some((nonce, at)) = answer
                    && at <= now
                {
                    heartbeat.pong(nonce, ms(now));
                    answer = None;
                }
                match heartbeat.poll(ms(now)) {
                    SendPing(nonce) => answer = Some((nonce, now + rtt)),
                    Dead => panic!("rtt {rtt}: dead at {now}"),
                    Nothing => {}
                }
            }
        }
    }

    #[test]
    fn a_zero_interval_is_a_millisecond() {
        let mut heartbeat = Heartbeat::new(Duration::ZERO, ms(0));
        assert_eq!(heartbeat.poll(ms(0)), Nothing);
        assert_eq!(heartbeat.poll(ms(1)), SendPing(1));
        assert_eq!(heartbeat.poll(ms(2)), Dead);
    }
}
