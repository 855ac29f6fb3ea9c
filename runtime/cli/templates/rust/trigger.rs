//! The policy: when to start a training round. Train once `samples` new train samples are
//! waiting, or `maxAgeHours` after the last round when at least one is.

use perennial_guest::{Decision, Stats, Trigger};
use serde::Deserialize;

/// The job's config for this policy: `{"samples": 100, "maxAgeHours": 24}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    #[serde(default = "default_samples")]
    samples: u64,
    #[serde(default = "default_max_age_hours")]
    max_age_hours: u64,
}

fn default_samples() -> u64 {
    100
}

fn default_max_age_hours() -> u64 {
    24
}

pub struct Policy {
    samples: u64,
    max_age_secs: u64,
}

impl Trigger for Policy {
    fn configure(config: &str) -> Result<Self, String> {
        // Errors name the field: "samples: expected an integer, got \"x\"".
        let config: Config = perennial_guest::parse_config(config)?;
        if config.samples == 0 {
            return Err("samples: must be at least 1".into());
        }
        if config.max_age_hours == 0 {
            return Err("maxAgeHours: must be at least 1".into());
        }
        Ok(Policy { samples: config.samples, max_age_secs: config.max_age_hours * 3600 })
    }

    fn decide(&mut self, stats: &Stats) -> Decision {
        if stats.pending_train >= self.samples {
            return Decision::train(format!("{} new samples (at least {})", stats.pending_train, self.samples));
        }
        if let Some(age) = stats.seconds_since_last_round
            && age >= self.max_age_secs
            && stats.pending_train > 0
        {
            return Decision::train(format!("the last round is {} h old", age / 3600));
        }
        perennial_guest::log::debug(format!("{} of {} samples", stats.pending_train, self.samples));
        Decision::wait(format!("{} of {} new samples", stats.pending_train, self.samples)).recheck_after(600)
    }
}

perennial_guest::export_trigger!(Policy);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trains_once_enough_samples_wait() {
        let mut policy = Policy::configure(r#"{"samples": 3}"#).unwrap();
        assert!(!policy.decide(&Stats { pending_train: 2, ..Stats::default() }).train);
        assert!(policy.decide(&Stats { pending_train: 3, ..Stats::default() }).train);
    }

    #[test]
    fn trains_when_the_last_round_is_old() {
        let mut policy = Policy::configure(r#"{"samples": 100, "maxAgeHours": 1}"#).unwrap();
        let old = Stats { pending_train: 1, seconds_since_last_round: Some(3600), ..Stats::default() };
        assert!(policy.decide(&old).train);
    }

    #[test]
    fn a_bad_config_names_the_field() {
        assert!(Policy::configure(r#"{"samples": 0}"#).err().unwrap().starts_with("samples: "));
        assert!(Policy::configure(r#"{"sample": 3}"#).err().unwrap().contains("sample: unknown field"));
    }
}
