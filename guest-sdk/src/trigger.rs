use std::marker::PhantomData;

use crate::__private::trigger::exports::perennial::policy::trigger as wit;
use crate::Metrics;

/// What a trigger sees when it is asked whether to start a training round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Train samples accumulated since the last round started: Sedna's `num_of_samples`.
    pub pending_train: u64,
    /// Eval samples accumulated since the last round started.
    pub pending_eval: u64,
    /// Samples seen in the dataset so far.
    pub total_samples: u64,
    /// Rounds that have completed.
    pub rounds_completed: u32,
    /// Seconds since the last round started; `None` before the first round.
    pub seconds_since_last_round: Option<u64>,
    /// Wall clock, unix seconds (UTC).
    pub wall_clock_secs: u64,
    /// The node's offset from UTC in seconds.
    pub utc_offset_secs: i32,
    /// Metrics of the deployed model; empty when none is deployed.
    pub deployed_metrics: Metrics,
}

impl Stats {
    /// Minutes since local midnight on the node, 0..1440.
    pub fn local_minute_of_day(&self) -> u32 {
        let local = self.wall_clock_secs as i64 + self.utc_offset_secs as i64;
        (local.rem_euclid(86_400) / 60) as u32
    }
}

/// A trigger's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Start a training round now.
    pub train: bool,
    /// Why, in a few words: shown on the job.
    pub reason: String,
    /// Ask again after this many seconds even if no sample arrives.
    pub recheck_after_secs: Option<u64>,
}

impl Decision {
    /// Start a round now.
    pub fn train(reason: impl Into<String>) -> Self {
        Decision { train: true, reason: reason.into(), recheck_after_secs: None }
    }

    /// Not yet.
    pub fn wait(reason: impl Into<String>) -> Self {
        Decision { train: false, reason: reason.into(), recheck_after_secs: None }
    }

    /// Ask again after `secs` seconds even if no sample arrives.
    pub fn recheck_after(mut self, secs: u64) -> Self {
        self.recheck_after_secs = Some(secs);
        self
    }
}

/// Decides when a training round starts.
pub trait Trigger: Sized + 'static {
    /// Builds the policy from the job's JSON config, or says what is wrong with it,
    /// naming the field.
    fn configure(config: &str) -> Result<Self, String>;

    /// Train now, or wait?
    fn decide(&mut self, stats: &Stats) -> Decision;
}

#[doc(hidden)]
pub struct Export<T>(PhantomData<T>);

impl<T: Trigger> wit::Guest for Export<T> {
    fn configure(config: String) -> Result<(), String> {
        crate::state::set(T::configure(&config)?);
        Ok(())
    }

    fn decide(stats: wit::Stats) -> wit::Decision {
        let stats = Stats {
            pending_train: stats.pending_train,
            pending_eval: stats.pending_eval,
            total_samples: stats.total_samples,
            rounds_completed: stats.rounds_completed,
            seconds_since_last_round: stats.seconds_since_last_round,
            wall_clock_secs: stats.wall_clock_secs,
            utc_offset_secs: stats.utc_offset_secs,
            deployed_metrics: stats.deployed_metrics.into(),
        };
        let decision = crate::state::with(|policy: &mut T| policy.decide(&stats));
        wit::Decision {
            train: decision.train,
            reason: decision.reason,
            recheck_after_secs: decision.recheck_after_secs,
        }
    }
}
