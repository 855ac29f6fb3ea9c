//! The policy: where each new sample goes. Every `evalEvery`-th sample of the job goes to eval,
//! the others to train; empty lines are skipped. By sequence number, so the split does not
//! depend on how samples are batched.

use perennial_guest::{Assignment, Batch, Splitter};
use serde::Deserialize;

/// The job's config for this policy: `{"evalEvery": 5}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    #[serde(default = "default_eval_every")]
    eval_every: u64,
}

fn default_eval_every() -> u64 {
    5
}

pub struct Policy {
    eval_every: u64,
}

impl Splitter for Policy {
    fn configure(config: &str) -> Result<Self, String> {
        let config: Config = perennial_guest::parse_config(config)?;
        if config.eval_every < 2 {
            return Err("evalEvery: must be at least 2".into());
        }
        Ok(Policy { eval_every: config.eval_every })
    }

    fn split(&mut self, batch: &Batch) -> Vec<Assignment> {
        (0..batch.len())
            .map(|i| match batch.line(i).trim() {
                "" => Assignment::Skip,
                _ if batch.seq(i) % self.eval_every == 0 => Assignment::Eval,
                _ => Assignment::Train,
            })
            .collect()
    }
}

perennial_guest::export_splitter!(Policy);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nth_sample_goes_to_eval() {
        let mut policy = Policy::configure(r#"{"evalEvery": 2}"#).unwrap();
        let batch = Batch::from_lines(10, &["a", "b", "", "d"]);
        let expected = [Assignment::Eval, Assignment::Train, Assignment::Skip, Assignment::Train];
        assert_eq!(policy.split(&batch), expected);
    }

    #[test]
    fn a_bad_config_names_the_field() {
        assert!(Policy::configure(r#"{"evalEvery": "two"}"#).err().unwrap().starts_with("evalEvery: "));
    }
}
