//! A worker's Running is written a moment late. A worker that reports soon after it starts (a
//! short stage, a worker that had little to do) then moves its job in one status write, the
//! result with its Running, instead of two; a long one shows Running a second later than it
//! could. Only a change that is nothing but Starting → Running waits: anything else is written
//! at once and takes a waiting Running along.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use perennial_api::{LifelongLearningJobStatus, Phase, Stage};

/// How long a job's Running alone waits to be written, from when it was first seen.
pub const RUNNING_WRITE_HOLD: Duration = Duration::from_secs(1);

/// When each job's unwritten Running was first seen, by job key (`namespace/name`): one entry a
/// job whose worker runs and whose Running is not written yet.
#[derive(Default)]
pub struct RunningHolds {
    first_seen: Mutex<HashMap<String, (u64, Stage, Instant)>>,
}

impl RunningHolds {
    /// How long the job's Running of this round and stage has waited (zero when first seen now).
    pub fn waited(&self, key: &str, round: u64, stage: Stage) -> Duration {
        let mut first_seen = self.first_seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        let entry = first_seen.entry(key.to_owned()).or_insert((round, stage, now));
        if (entry.0, entry.1) != (round, stage) {
            *entry = (round, stage, now);
        }
        now.duration_since(entry.2)
    }

    /// The job's status was written (or the job is gone): nothing of it waits.
    pub fn forget(&self, key: &str) {
        self.first_seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(key);
    }

    /// Jobs with a Running waiting (for tests and metrics).
    pub fn len(&self) -> usize {
        self.first_seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether the step from `before` to `after` is a worker's Running alone: same round and stage,
/// Starting → Running, with no report taken and nothing to do.
pub fn running_alone(
    before: &LifelongLearningJobStatus,
    after: &LifelongLearningJobStatus,
    reports_taken: bool,
    acts: bool,
) -> bool {
    !reports_taken
        && !acts
        && before.round == after.round
        && before.stage == after.stage
        && before.phase == Some(Phase::Starting)
        && after.phase == Some(Phase::Running)
}

/// The rest of the hold of a Running alone that has waited `waited`; `None`: write it now.
pub fn rest_of_hold(waited: Duration) -> Option<Duration> {
    RUNNING_WRITE_HOLD.checked_sub(waited).filter(|rest| !rest.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(stage: Stage, phase: Phase, round: u64) -> LifelongLearningJobStatus {
        LifelongLearningJobStatus { stage: Some(stage), phase: Some(phase), round, ..Default::default() }
    }

    #[test]
    fn only_starting_to_running_with_nothing_else_waits() {
        let starting = status(Stage::Train, Phase::Starting, 2);
        let running = status(Stage::Train, Phase::Running, 2);
        assert!(running_alone(&starting, &running, false, false));
        assert!(!running_alone(&starting, &running, true, false), "a report taken with it: written at once");
        assert!(!running_alone(&starting, &running, false, true), "something to do: written first");
        let completed = status(Stage::Eval, Phase::Starting, 2);
        assert!(!running_alone(&starting, &completed, false, false), "a stage move");
        let failed = status(Stage::Train, Phase::Failed, 2);
        assert!(!running_alone(&starting, &failed, false, false), "a failure");
        let other_round = status(Stage::Train, Phase::Running, 3);
        assert!(!running_alone(&starting, &other_round, false, false));
        assert!(!running_alone(&running, &running, false, false), "Running already written");
    }

    #[test]
    fn the_hold_counts_from_the_first_sight_of_this_round_and_stage() {
        let holds = RunningHolds::default();
        assert_eq!(holds.waited("ml/a", 1, Stage::Train), Duration::ZERO);
        std::thread::sleep(Duration::from_millis(20));
        let waited = holds.waited("ml/a", 1, Stage::Train);
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        assert!(rest_of_hold(waited).is_some_and(|rest| rest <= RUNNING_WRITE_HOLD - Duration::from_millis(20)));
        // The eval worker's Running is a new wait; another job's is its own.
        assert_eq!(holds.waited("ml/a", 1, Stage::Eval), Duration::ZERO);
        assert_eq!(holds.waited("ml/b", 1, Stage::Eval), Duration::ZERO);
        assert_eq!(holds.len(), 2);
        holds.forget("ml/a");
        holds.forget("ml/b");
        assert!(holds.is_empty());
        assert_eq!(rest_of_hold(RUNNING_WRITE_HOLD), None, "held long enough: written");
    }
}
