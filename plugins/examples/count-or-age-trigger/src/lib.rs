//! An example trigger written as a plugin author would: train after `samples` new train
//! samples or `maxAgeHours` hours since the last round started, whichever comes first.
//!
//! Config: `{"samples": 1000, "maxAgeHours": 24}`. An age-based round needs at least one new
//! sample (there is nothing to learn from otherwise); before the first round only the count
//! applies.

use perennial_guest::{Decision, Stats, Trigger};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    samples: u64,
    max_age_hours: f64,
}

pub struct CountOrAge {
    samples: u64,
    max_age_secs: u64,
}

impl Trigger for CountOrAge {
    fn configure(config: &str) -> Result<Self, String> {
        let config: Config = perennial_guest::parse_config(config)?;
        if config.samples == 0 {
            return Err("samples: must be at least 1".into());
        }
        if !(config.max_age_hours > 0.0 && config.max_age_hours.is_finite()) {
            return Err(format!("maxAgeHours: {} must be a positive number", config.max_age_hours));
        }
        Ok(CountOrAge { samples: config.samples, max_age_secs: (config.max_age_hours * 3600.0) as u64 })
    }

    fn decide(&mut self, stats: &Stats) -> Decision {
        if stats.pending_train >= self.samples {
            return Decision::train(format!("{} new samples (>= {})", stats.pending_train, self.samples));
        }
        let Some(age) = stats.seconds_since_last_round else {
            return Decision::wait(format!("{} of {} samples, first round", stats.pending_train, self.samples));
        };
        if age >= self.max_age_secs && stats.pending_train > 0 {
            perennial_guest::log::info(format!("training on age: {age} s since the last round"));
            return Decision::train(format!("last round {age} s ago (>= {} s)", self.max_age_secs));
        }
        // Come back when the age limit is reached, even if no sample arrives.
        let left = self.max_age_secs.saturating_sub(age).max(1);
        Decision::wait(format!("{} of {} samples, {age} s since the last round", stats.pending_train, self.samples))
            .recheck_after(left)
    }
}

perennial_guest::export_trigger!(CountOrAge);

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> CountOrAge {
        CountOrAge::configure(r#"{"samples": 100, "maxAgeHours": 2}"#).unwrap()
    }

    #[test]
    fn trains_on_count() {
        let decision = policy().decide(&Stats { pending_train: 100, ..Stats::default() });
        assert!(decision.train);
        assert_eq!(decision.reason, "100 new samples (>= 100)");
    }

    #[test]
    fn trains_on_age_when_there_is_something_new() {
        let old = Stats { pending_train: 3, seconds_since_last_round: Some(7200), ..Stats::default() };
        assert!(policy().decide(&old).train);
        assert_eq!(perennial_guest::log::take_captured().len(), 1, "an age-based round is logged");
        let nothing_new = Stats { pending_train: 0, ..old };
        assert!(!policy().decide(&nothing_new).train);
    }

    #[test]
    fn waits_and_asks_to_be_rechecked_when_the_age_limit_falls() {
        let young = Stats { pending_train: 3, seconds_since_last_round: Some(7000), ..Stats::default() };
        let decision = policy().decide(&young);
        assert!(!decision.train);
        assert_eq!(decision.recheck_after_secs, Some(200));
    }

    #[test]
    fn rejects_bad_config() {
        assert!(CountOrAge::configure(r#"{"samples": 0, "maxAgeHours": 1}"#).is_err());
        let err = CountOrAge::configure(r#"{"samples": 10}"#).err().unwrap();
        assert_eq!(err, "maxAgeHours: missing");
    }
}
