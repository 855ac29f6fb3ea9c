//! The policy: which evaluated model to deploy. Deploy the candidate with the highest `metric`
//! when it beats the deployed model by at least `minDelta` (a model without the metric, or with a
//! value that is not a number, NaN or infinite, is never chosen).

use perennial_guest::{Choice, Model, Selector};
use serde::Deserialize;

/// The job's config for this policy: `{"metric": "accuracy", "minDelta": 0.0}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    #[serde(default = "default_metric")]
    metric: String,
    #[serde(default)]
    min_delta: f64,
}

fn default_metric() -> String {
    "accuracy".into()
}

pub struct Policy {
    metric: String,
    min_delta: f64,
}

impl Selector for Policy {
    fn configure(config: &str) -> Result<Self, String> {
        let config: Config = perennial_guest::parse_config(config)?;
        if !(config.min_delta >= 0.0 && config.min_delta.is_finite()) {
            return Err(format!("minDelta: {} must be a number of at least 0", config.min_delta));
        }
        Ok(Policy { metric: config.metric, min_delta: config.min_delta })
    }

    fn select(&mut self, deployed: Option<&Model>, candidates: &[Model]) -> Choice {
        let best = candidates
            .iter()
            .enumerate()
            .filter_map(|(i, model)| Some((i, model.metrics.get(&self.metric).filter(|v| v.is_finite())?)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let Some((index, score)) = best else {
            return Choice::keep(format!("no candidate has a finite {}", self.metric));
        };
        // A deployed model without a finite value is beaten by any candidate that has one.
        match deployed.and_then(|model| model.metrics.get(&self.metric)).filter(|v| v.is_finite()) {
            Some(current) if score < current + self.min_delta => Choice::keep(format!(
                "best {} {score:.4} does not beat the deployed {current:.4} by {}",
                self.metric, self.min_delta
            )),
            _ => Choice::deploy(index, format!("{} {score:.4}", self.metric)),
        }
    }
}

perennial_guest::export_selector!(Policy);

#[cfg(test)]
mod tests {
    use super::*;
    use perennial_guest::Metrics;

    fn model(url: &str, accuracy: f64) -> Model {
        Model { url: url.into(), format: "pkl".into(), metrics: [("accuracy", accuracy)].into_iter().collect::<Metrics>() }
    }

    #[test]
    fn deploys_the_best_candidate_that_beats_the_deployed_one() {
        let mut policy = Policy::configure(r#"{"metric": "accuracy", "minDelta": 0.01}"#).unwrap();
        let deployed = model("m0", 0.90);
        let candidates = [model("m1", 0.905), model("m2", 0.95)];
        assert_eq!(policy.select(Some(&deployed), &candidates).deploy, Some(1));
        assert_eq!(policy.select(Some(&deployed), &candidates[..1]).deploy, None);
    }

    #[test]
    fn never_picks_a_nan_or_infinite_or_missing_metric() {
        let mut policy = Policy::configure("{}").unwrap();
        let missing = Model { url: "m3".into(), format: "pkl".into(), metrics: Metrics::default() };
        let candidates = [model("m1", f64::NAN), model("m2", 0.95), missing, model("m4", f64::INFINITY)];
        assert_eq!(policy.select(None, &candidates).deploy, Some(1));
        assert_eq!(policy.select(Some(&model("m0", 0.5)), &candidates[..1]).deploy, None, "NaN alone: keep");
        assert_eq!(policy.select(Some(&model("m0", f64::NAN)), &candidates[1..2]).deploy, Some(0));
    }

    #[test]
    fn a_bad_config_names_the_field() {
        assert!(Policy::configure(r#"{"minDelta": "x"}"#).err().unwrap().starts_with("minDelta: "));
    }
}
