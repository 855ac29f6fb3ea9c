//! `builtin:metric-select`: deploy the candidate with the best value of a named metric, if it
//! beats the deployed model.
//!
//! Config: `{"metric": "accuracy", "better": "higher", "minDelta": 0.0}`.
//!
//! - `metric` (required): the metric to compare.
//! - `better`: `higher` (default) or `lower` is better.
//! - `minDelta` (default 0): how much the best candidate must improve on the deployed model.
//!   It is deployed when its improvement is above zero and at least `minDelta`.
//!
//! A candidate whose metric is missing or NaN is never deployed; when no candidate has a
//! usable value, nothing is deployed and the reason says so. When no model is deployed yet,
//! or the deployed one has no usable value, the best candidate is deployed.

use perennial_guest::{Choice, Model, Selector};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    metric: String,
    #[serde(default)]
    better: Better,
    #[serde(default)]
    min_delta: f64,
}

#[derive(Deserialize, Default, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Better {
    #[default]
    Higher,
    Lower,
}

pub struct MetricSelect {
    metric: String,
    better: Better,
    min_delta: f64,
}

impl MetricSelect {
    fn value(&self, model: &Model) -> Option<f64> {
        model.metrics.get(&self.metric).filter(|v| !v.is_nan())
    }

    /// How much `candidate` improves on `baseline` (positive is better).
    fn improvement(&self, candidate: f64, baseline: f64) -> f64 {
        match self.better {
            Better::Higher => candidate - baseline,
            Better::Lower => baseline - candidate,
        }
    }
}

impl Selector for MetricSelect {
    fn configure(config: &str) -> Result<Self, String> {
        let config: Config = perennial_guest::parse_config(config)?;
        if config.metric.trim().is_empty() {
            return Err("metric: must name a metric".into());
        }
        if !config.min_delta.is_finite() || config.min_delta < 0.0 {
            return Err(format!("minDelta: {} must be a number >= 0", config.min_delta));
        }
        Ok(MetricSelect { metric: config.metric, better: config.better, min_delta: config.min_delta })
    }

    fn select(&mut self, deployed: Option<&Model>, candidates: &[Model]) -> Choice {
        let metric = &self.metric;
        if candidates.is_empty() {
            return Choice::keep("no evaluated model");
        }
        let mut best: Option<(usize, f64)> = None;
        for (index, candidate) in candidates.iter().enumerate() {
            if let Some(value) = self.value(candidate)
                && best.is_none_or(|(_, best_value)| self.improvement(value, best_value) > 0.0)
            {
                best = Some((index, value));
            }
        }
        let Some((index, value)) = best else {
            return Choice::keep(format!("no candidate has a usable {metric} (missing or NaN)"));
        };
        let Some(baseline) = deployed.and_then(|model| self.value(model)) else {
            let why = if deployed.is_some() { "the deployed model has no usable value" } else { "no model deployed" };
            return Choice::deploy(index, format!("{metric} {value}; {why}"));
        };
        let improvement = self.improvement(value, baseline);
        if improvement > 0.0 && improvement >= self.min_delta {
            Choice::deploy(index, format!("{metric} {value} beats deployed {baseline} by {improvement:.6}"))
        } else {
            Choice::keep(format!(
                "best {metric} {value} does not beat deployed {baseline} by minDelta {}",
                self.min_delta
            ))
        }
    }
}

perennial_guest::export_selector!(MetricSelect);

#[cfg(test)]
mod tests {
    use super::*;

    fn model(metrics: &[(&str, f64)]) -> Model {
        Model { url: "/m".into(), format: "pkl".into(), metrics: metrics.iter().map(|(k, v)| (*k, *v)).collect() }
    }

    fn acc(value: f64) -> Model {
        model(&[("accuracy", value)])
    }

    #[test]
    fn selection_table() {
        let higher = r#"{"metric": "accuracy"}"#;
        let delta = r#"{"metric": "accuracy", "minDelta": 0.05}"#;
        let lower = r#"{"metric": "accuracy", "better": "lower"}"#;
        // (config, deployed, candidates, expected choice)
        type Case = (&'static str, Option<Model>, Vec<Model>, Option<usize>);
        let cases: Vec<Case> = vec![
            (higher, None, vec![], None),
            (higher, None, vec![acc(0.5)], Some(0)),
            (higher, None, vec![acc(0.5), acc(0.9), acc(0.7)], Some(1)),
            (higher, Some(acc(0.8)), vec![acc(0.5), acc(0.9)], Some(1)),
            (higher, Some(acc(0.9)), vec![acc(0.9)], None),
            (higher, Some(acc(0.95)), vec![acc(0.9)], None),
            (delta, Some(acc(0.8)), vec![acc(0.84)], None),
            (delta, Some(acc(0.8)), vec![acc(0.86)], Some(0)),
            (lower, Some(acc(0.3)), vec![acc(0.2), acc(0.1), acc(0.4)], Some(1)),
            (lower, Some(acc(0.1)), vec![acc(0.2)], None),
            (higher, Some(acc(0.5)), vec![model(&[("loss", 0.1)])], None),
            (higher, Some(acc(0.5)), vec![acc(f64::NAN)], None),
            (higher, Some(acc(0.5)), vec![acc(f64::NAN), acc(0.6)], Some(1)),
            (higher, Some(model(&[])), vec![acc(0.1)], Some(0)),
            (higher, Some(acc(f64::NAN)), vec![acc(0.1)], Some(0)),
            (higher, None, vec![acc(0.7), acc(0.7)], Some(0)),
        ];
        for (config, deployed, candidates, expected) in cases {
            let choice = MetricSelect::configure(config).unwrap().select(deployed.as_ref(), &candidates);
            assert_eq!(choice.deploy, expected, "{config} {deployed:?} {candidates:?}: {}", choice.reason);
        }
    }

    #[test]
    fn reasons_say_why() {
        let mut s = MetricSelect::configure(r#"{"metric": "accuracy", "minDelta": 0.05}"#).unwrap();
        assert_eq!(
            s.select(Some(&acc(0.8)), &[acc(0.82)]).reason,
            "best accuracy 0.82 does not beat deployed 0.8 by minDelta 0.05"
        );
        assert_eq!(s.select(None, &[acc(f64::NAN)]).reason, "no candidate has a usable accuracy (missing or NaN)");
        assert_eq!(s.select(None, &[acc(0.6)]).reason, "accuracy 0.6; no model deployed");
    }

    #[test]
    fn configure_rejects_bad_configs() {
        let cases: &[(&str, &str)] = &[
            (r#"{}"#, "metric: missing"),
            (r#"{"metric": ""}"#, "metric: must name a metric"),
            (r#"{"metric": "a", "minDelta": -1}"#, "minDelta: -1 must be a number >= 0"),
            (r#"{"metric": "a", "better": "bigger"}"#, r#"better: "bigger" is not one of"#),
        ];
        for (config, expected) in cases {
            let err = MetricSelect::configure(config).err().unwrap_or_else(|| panic!("{config} accepted"));
            assert!(err.contains(expected), "{config}: {err}");
        }
    }
}
