//! A compile that gives way to the control plane. On a machine of few cores, a compiling child
//! slows the operator's rounds whatever its priority (on a 2-vCPU VM, a `SCHED_IDLE` busy loop
//! moved a round's p90 from 140 to 248 ms): so the child is stopped (`SIGSTOP`) while the
//! operator has a call to the API server in flight, and continued once it has had none for
//! [`HOLD_OFF`]. However busy the control plane, the compile still runs [`FORCED_RUN`] in every
//! [`LONGEST_PAUSE`] of pauses it has not made up for by running, so that it ends (a tenth of a
//! core at least).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long after the control plane's last call a paused compile goes on.
pub const HOLD_OFF: Duration = Duration::from_millis(50);
/// The most a compile is paused before it is owed a run...
pub const LONGEST_PAUSE: Duration = Duration::from_secs(9);
/// ... and how long it then runs, busy or not (running as long of its own accord settles it too).
pub const FORCED_RUN: Duration = Duration::from_secs(1);

/// The control plane's work, told by whatever does it (each call to the API server), read by
/// the compiles that give way to it.
#[derive(Debug)]
pub struct GiveWay {
    epoch: Instant,
    /// Milliseconds from `epoch` to the last work, plus one; 0: none yet.
    last_busy: AtomicU64,
    /// Calls in flight.
    in_flight: AtomicUsize,
}

impl Default for GiveWay {
    fn default() -> Self {
        GiveWay { epoch: Instant::now(), last_busy: AtomicU64::new(0), in_flight: AtomicUsize::new(0) }
    }
}

/// A call in flight ([`GiveWay::begin`]); its end is told when dropped.
#[derive(Debug)]
pub struct InFlight(Arc<GiveWay>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.busy();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl GiveWay {
    /// The control plane has work now.
    pub fn busy(&self) {
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        self.last_busy.fetch_max(now, Ordering::Relaxed);
    }

    /// A call starts: busy until the guard is dropped, and [`HOLD_OFF`] after.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.busy();
        InFlight(self.clone())
    }

    /// How long the control plane has had nothing in flight (`None`: it never worked).
    pub fn quiet_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Some(Duration::ZERO);
        }
        match self.last_busy.load(Ordering::Relaxed) {
            0 => None,
            last => Some(self.epoch.elapsed().saturating_sub(Duration::from_millis(last - 1))),
        }
    }
}

/// Whether a compile runs, and what it is owed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    state: State,
    /// When `next` last looked.
    at: Instant,
    /// Paused and run since the compile last had its share.
    paused: Duration,
    ran: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Running,
    Paused,
    /// Running its owed [`FORCED_RUN`], busy or not, until then.
    Forced {
        until: Instant,
    },
}

impl Pace {
    /// A compile that starts running at `now`.
    pub fn new(now: Instant) -> Pace {
        Pace { state: State::Running, at: now, paused: Duration::ZERO, ran: Duration::ZERO }
    }

    /// The pace at `now`, the control plane quiet for `quiet_for` (`None`: it never worked).
    pub fn next(self, now: Instant, quiet_for: Option<Duration>) -> Pace {
        let mut next = self;
        let elapsed = now.saturating_duration_since(self.at);
        next.at = now;
        if self.runs() {
            next.ran += elapsed;
        } else {
            next.paused += elapsed;
        }
        let settled = |pace: Pace| Pace { paused: Duration::ZERO, ran: Duration::ZERO, ..pace };
        if next.ran >= FORCED_RUN {
            // It had its share: what it is owed counts afresh.
            next = settled(next);
        }
        if let State::Forced { until } = self.state {
            if now < until {
                return next;
            }
            next = settled(next);
        }
        let quiet = quiet_for.is_none_or(|quiet| quiet >= HOLD_OFF);
        next.state = if next.paused >= LONGEST_PAUSE {
            State::Forced { until: now + FORCED_RUN }
        } else if quiet {
            State::Running
        } else {
            State::Paused
        };
        next
    }

    pub fn runs(self) -> bool {
        self.state != State::Paused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUSY: Option<Duration> = Some(Duration::ZERO);
    const QUIET: Option<Duration> = Some(HOLD_OFF);

    #[test]
    fn a_compile_pauses_while_the_control_plane_works_and_goes_on_when_it_is_quiet() {
        let start = Instant::now();
        let pace = Pace::new(start);
        assert!(pace.next(start, None).runs(), "no work yet");
        assert!(pace.next(start, QUIET).runs());
        let paused = pace.next(start, BUSY);
        assert!(!paused.runs());
        let later = start + Duration::from_secs(1);
        assert!(!paused.next(later, Some(HOLD_OFF / 2)).runs(), "still within the hold-off");
        assert!(paused.next(later, QUIET).runs());
    }

    #[test]
    fn a_compile_paused_too_long_runs_a_while_busy_or_not_then_gives_way_again() {
        let start = Instant::now();
        let at = |d: Duration| start + d;
        let paused = Pace::new(start).next(start, BUSY);
        assert!(!paused.next(at(LONGEST_PAUSE - Duration::from_millis(1)), BUSY).runs());
        let forced = paused.next(at(LONGEST_PAUSE), BUSY);
        assert!(forced.runs());
        assert!(forced.next(at(LONGEST_PAUSE + FORCED_RUN / 2), BUSY).runs(), "runs its whole time");
        let end = at(LONGEST_PAUSE + FORCED_RUN);
        let after = forced.next(end, BUSY);
        assert!(!after.runs(), "then gives way again");
        assert!(!after.next(end + LONGEST_PAUSE / 2, BUSY).runs(), "and is owed nothing for a while");
        assert!(forced.next(end, QUIET).runs());
    }

    #[test]
    fn quiet_moments_too_short_to_make_up_do_not_cancel_what_a_compile_is_owed() {
        // The control plane quiet for 50 ms in every 55: the compile runs 5 ms a cycle, and is
        // still given its forced run once its pauses add up.
        let start = Instant::now();
        let mut pace = Pace::new(start);
        let mut now = start;
        let mut forced = None;
        for _ in 0..400 {
            // A call: paused; quiet 50 ms later: running, for 5 ms until the next call.
            now += Duration::from_millis(5);
            pace = pace.next(now, BUSY);
            now += Duration::from_millis(50);
            pace = pace.next(now, QUIET);
            if pace.runs() && pace.next(now + Duration::from_millis(1), BUSY).runs() {
                forced = Some(now - start);
                break;
            }
        }
        let forced = forced.expect("never forced to run");
        assert!(forced <= LONGEST_PAUSE + Duration::from_secs(2), "forced only after {forced:?}");
    }

    #[test]
    fn the_work_is_a_call_in_flight_and_the_hold_off_after_it() {
        let give_way = Arc::new(GiveWay::default());
        assert_eq!(give_way.quiet_for(), None);
        let call = give_way.begin();
        std::thread::sleep(HOLD_OFF);
        assert_eq!(give_way.quiet_for(), Some(Duration::ZERO), "a slow call keeps it busy");
        drop(call);
        assert!(give_way.quiet_for().is_some_and(|quiet| quiet < HOLD_OFF));
        std::thread::sleep(HOLD_OFF);
        assert!(give_way.quiet_for().is_some_and(|quiet| quiet >= HOLD_OFF));
    }
}
