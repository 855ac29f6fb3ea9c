//! The stage machine: a pure function over (job, status, observations, now) that returns the new
//! status and the actions to take. No I/O: the operator and the embedded mode run it over what
//! they observed (reports from the edge, the current stage's worker) and carry out its actions.
//!
//! It is Sedna's Train → Eval → Deploy loop (`reference/sedna.md` §2.2) with its faults fixed:
//! - every report carries (job uid, round, stage) and a stale one is ignored, with an event;
//! - Train and Eval complete on the worker's result, never on a bare exit (no empty Completed);
//! - Deploy completes when the new inference worker runs, not when it is created;
//! - a worker that vanished is started again, counted, and a crash loop (restarts over the
//!   limit) fails the stage; a stage may have a timeout;
//! - a failure goes back to Train after a backoff (10 s doubling to 360 s), counted in
//!   `status.retries`, and its round's samples return to the next round;
//! - the conditions list is capped; the status says the round and the deployed model.

mod machine;
#[cfg(test)]
mod tests;

pub use machine::{
    Action, JobView, Observations, Report, Settings, StageNotice, Step, WorkerObservation, WorkerPhase, WorkerSpec,
    step,
};
