//! A compile that gives way to the control plane. On a machine of few cores, a compiling child
//! slows the operator's rounds whatever its priority (on a 2-vCPU VM, a `SCHED_IDLE` busy loop
//! moved a round's p90 from 140 to 248 ms): so the child is stopped (`SIGSTOP`) while the
//! operator has work, and continued once it has had none for [`HOLD_OFF`]. When the work never
//! stops for long, the compile still gets [`FORCED_RUN`] after each [`LONGEST_PAUSE`], so that it
//! ends (about a tenth of a core), however busy the fleet.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long after the control plane's last call a paused compile goes on.
pub const HOLD_OFF: Duration = Duration::from_millis(50);
/// The longest a compile is kept paused in one go...
pub const LONGEST_PAUSE: Duration = Duration::from_secs(9);
/// ... and how long it then runs, busy or not.
pub const FORCED_RUN: Duration = Duration::from_secs(1);

/// The control plane's last moment of work, told by whatever does it (each call to the API
/// server), read by the compiles that give way to it.
#[derive(Debug)]
pub struct GiveWay {
    epoch: Instant,
    /// Milliseconds from `epoch` to the last work, plus one; 0: none yet.
    last_busy: AtomicU64,
}

impl Default for GiveWay {
    fn default() -> Self {
        GiveWay { epoch: Instant::now(), last_busy: AtomicU64::new(0) }
    }
}

impl GiveWay {
    /// The control plane has work now.
    pub fn busy(&self) {
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        self.last_busy.fetch_max(now, Ordering::Relaxed);
    }

    /// How long since the control plane's last work (`None`: never any).
    pub fn quiet_for(&self) -> Option<Duration> {
        match self.last_busy.load(Ordering::Relaxed) {
            0 => None,
            last => Some(self.epoch.elapsed().saturating_sub(Duration::from_millis(last - 1))),
        }
    }
}

/// Whether a compile runs, and since when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    Running,
    /// Stopped since `since`, while the control plane works.
    Paused {
        since: Instant,
    },
    /// Running after a pause of [`LONGEST_PAUSE`], busy or not, until `since` + [`FORCED_RUN`].
    Forced {
        since: Instant,
    },
}

impl Pace {
    /// The next pace at `now`, the control plane quiet for `quiet_for` (`None`: it never worked).
    pub fn next(self, now: Instant, quiet_for: Option<Duration>) -> Pace {
        let quiet = quiet_for.is_none_or(|quiet| quiet >= HOLD_OFF);
        match self {
            Pace::Running if quiet => Pace::Running,
            Pace::Running => Pace::Paused { since: now },
            Pace::Paused { .. } if quiet => Pace::Running,
            Pace::Paused { since } if now.duration_since(since) >= LONGEST_PAUSE => Pace::Forced { since: now },
            Pace::Paused { since } => Pace::Paused { since },
            Pace::Forced { since } if now.duration_since(since) < FORCED_RUN => Pace::Forced { since },
            Pace::Forced { .. } if quiet => Pace::Running,
            Pace::Forced { .. } => Pace::Paused { since: now },
        }
    }

    pub fn runs(self) -> bool {
        !matches!(self, Pace::Paused { .. })
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
        assert_eq!(Pace::Running.next(start, None), Pace::Running, "no work yet");
        assert_eq!(Pace::Running.next(start, QUIET), Pace::Running);
        let paused = Pace::Running.next(start, BUSY);
        assert_eq!(paused, Pace::Paused { since: start });
        assert!(!paused.runs());
        let later = start + Duration::from_secs(1);
        assert_eq!(paused.next(later, Some(HOLD_OFF / 2)), paused, "still within the hold-off");
        assert_eq!(paused.next(later, QUIET), Pace::Running);
    }

    #[test]
    fn a_compile_paused_too_long_runs_a_while_busy_or_not_then_gives_way_again() {
        let start = Instant::now();
        let paused = Pace::Paused { since: start };
        let at = |d: Duration| start + d;
        assert_eq!(paused.next(at(LONGEST_PAUSE - Duration::from_millis(1)), BUSY), paused);
        let forced = paused.next(at(LONGEST_PAUSE), BUSY);
        assert_eq!(forced, Pace::Forced { since: at(LONGEST_PAUSE) });
        assert!(forced.runs());
        assert_eq!(forced.next(at(LONGEST_PAUSE + FORCED_RUN / 2), BUSY), forced, "runs its whole time");
        let end = at(LONGEST_PAUSE + FORCED_RUN);
        assert_eq!(forced.next(end, BUSY), Pace::Paused { since: end }, "then gives way again");
        assert_eq!(forced.next(end, QUIET), Pace::Running);
    }

    #[test]
    fn the_last_work_is_the_latest_told() {
        let give_way = GiveWay::default();
        assert_eq!(give_way.quiet_for(), None);
        give_way.busy();
        assert!(give_way.quiet_for().is_some_and(|quiet| quiet < Duration::from_secs(1)));
        std::thread::sleep(HOLD_OFF);
        assert!(give_way.quiet_for().is_some_and(|quiet| quiet >= HOLD_OFF));
    }
}
