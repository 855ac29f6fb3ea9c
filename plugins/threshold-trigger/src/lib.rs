//! `builtin:threshold-trigger`: Sedna's train trigger.
//!
//! Config (the job's `spec.trainSpec.trigger`, as JSON):
//!
//! ```json
//! { "checkPeriodSeconds": 60,
//!   "timer": { "start": "02:00", "end": "24:00" },
//!   "condition": { "operator": ">", "threshold": 500, "metric": "num_of_samples" } }
//! ```
//!
//! It trains when the condition holds AND, if a timer is given, the node's local time is inside
//! the daily window. Both are Sedna's (`pkg/localcontroller/trigger/trigger.go`):
//!
//! - The comparison treats values within 1e-6 of the threshold as equal, for every operator:
//!   `>=` is `equal || value >= threshold`, `>` is `!equal && value > threshold`, and so on.
//! - The window is compared to the minute with both ends included: `02:00`–`20:00` still trains
//!   at 20:00:59, and a window whose start equals its end is that one minute. A start after the
//!   end wraps midnight (`22:00`–`02:00`); `24:00` is accepted as an end (all day long).
//!
//! Deliberate differences: an unknown operator or metric, a malformed time, a missing
//! condition or a negative `checkPeriodSeconds` is refused by `configure` with a message naming
//! the field (Sedna accepts them and then never trains, trains on the timer alone, or ignores
//! them); a missing metric means `num_of_samples`; and `checkPeriodSeconds` (absent or 0: 60) is
//! honoured: the decision asks to be rechecked after that many seconds.

use perennial_guest::{Decision, Stats, Trigger};
use serde::Deserialize;

/// Sedna's default check period.
const DEFAULT_CHECK_PERIOD_SECS: u64 = 60;
/// Sedna's equality tolerance.
const EPSILON: f64 = 1e-6;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    check_period_seconds: Option<u64>,
    timer: Option<TimerConfig>,
    condition: ConditionConfig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TimerConfig {
    start: String,
    end: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConditionConfig {
    operator: String,
    threshold: f64,
    #[serde(default = "default_metric")]
    metric: String,
}

fn default_metric() -> String {
    "num_of_samples".into()
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Operator {
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    Ne,
}

impl Operator {
    /// Sedna's spellings: symbols and two-letter names.
    pub fn parse(text: &str) -> Option<Operator> {
        Some(match text {
            ">" | "gt" => Operator::Gt,
            ">=" | "ge" => Operator::Ge,
            "<" | "lt" => Operator::Lt,
            "<=" | "le" => Operator::Le,
            "=" | "==" | "eq" => Operator::Eq,
            "!=" | "ne" => Operator::Ne,
            _ => return None,
        })
    }

    /// Sedna's comparison: values within 1e-6 of the threshold are equal, for every operator.
    pub fn holds(self, value: f64, threshold: f64) -> bool {
        let equal = (value - threshold).abs() < EPSILON;
        match self {
            Operator::Gt => !equal && value > threshold,
            Operator::Ge => equal || value >= threshold,
            Operator::Lt => !equal && value < threshold,
            Operator::Le => equal || value <= threshold,
            Operator::Eq => equal,
            Operator::Ne => !equal,
        }
    }

    fn symbol(self) -> &'static str {
        match self {
            Operator::Gt => ">",
            Operator::Ge => ">=",
            Operator::Lt => "<",
            Operator::Le => "<=",
            Operator::Eq => "==",
            Operator::Ne => "!=",
        }
    }
}

/// The statistics a condition may test.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Metric {
    /// Sedna's only metric: train samples accumulated since the last round.
    NumOfSamples,
    NumOfEvalSamples,
    TotalSamples,
    RoundsCompleted,
}

const METRICS: &[(&str, Metric)] = &[
    ("num_of_samples", Metric::NumOfSamples),
    ("num_of_eval_samples", Metric::NumOfEvalSamples),
    ("total_samples", Metric::TotalSamples),
    ("rounds_completed", Metric::RoundsCompleted),
];

impl Metric {
    fn value(self, stats: &Stats) -> f64 {
        match self {
            Metric::NumOfSamples => stats.pending_train as f64,
            Metric::NumOfEvalSamples => stats.pending_eval as f64,
            Metric::TotalSamples => stats.total_samples as f64,
            Metric::RoundsCompleted => f64::from(stats.rounds_completed),
        }
    }
}

/// A daily window in minutes since local midnight, both ends included (Sedna compares `HH:MM`
/// strings with `<=`), wrapping midnight when `start > end`; `start == end` is one minute.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    start: u32,
    end: u32,
}

impl Window {
    pub fn new(start: u32, end: u32) -> Window {
        Window { start, end }
    }

    pub fn contains(self, minute: u32) -> bool {
        if self.start <= self.end {
            self.start <= minute && minute <= self.end
        } else {
            minute >= self.start || minute <= self.end
        }
    }
}

/// Parses `HH:MM` (00:00 to 23:59, and 24:00 when `allow_24` is set) into minutes.
pub fn parse_hhmm(text: &str, allow_24: bool) -> Option<u32> {
    let (hours, minutes) = text.split_once(':')?;
    // Two ASCII digits each, as a manifest's validation wants: `+2:00` is no time.
    let two_digits = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit());
    if !two_digits(hours) || !two_digits(minutes) {
        return None;
    }
    let hours: u32 = hours.parse().ok()?;
    let minutes: u32 = minutes.parse().ok()?;
    if (hours < 24 && minutes < 60) || (allow_24 && hours == 24 && minutes == 0) {
        Some(hours * 60 + minutes)
    } else {
        None
    }
}

fn format_minutes(minutes: u32) -> String {
    format!("{:02}:{:02}", minutes / 60, minutes % 60)
}

pub struct ThresholdTrigger {
    operator: Operator,
    threshold: f64,
    metric: Metric,
    metric_name: String,
    window: Option<Window>,
    check_period_secs: u64,
}

impl Trigger for ThresholdTrigger {
    fn configure(config: &str) -> Result<Self, String> {
        let config: Config = perennial_guest::parse_config(config)?;
        let condition = config.condition;
        let operator = Operator::parse(&condition.operator).ok_or_else(|| {
            format!(
                "condition.operator: unknown operator {:?}; use one of > >= < <= = == != gt ge lt le eq ne",
                condition.operator
            )
        })?;
        if !condition.threshold.is_finite() {
            return Err("condition.threshold: must be a finite number".into());
        }
        let metric =
            METRICS.iter().find(|(name, _)| *name == condition.metric).map(|(_, metric)| *metric).ok_or_else(|| {
                let known: Vec<&str> = METRICS.iter().map(|(name, _)| *name).collect();
                format!("condition.metric: unknown metric {:?}; use one of {}", condition.metric, known.join(", "))
            })?;
        let window = match config.timer {
            None => None,
            Some(timer) => {
                let start = parse_hhmm(&timer.start, false)
                    .ok_or_else(|| format!("timer.start: {:?} is not a time HH:MM from 00:00 to 23:59", timer.start))?;
                let end = parse_hhmm(&timer.end, true)
                    .ok_or_else(|| format!("timer.end: {:?} is not a time HH:MM from 00:00 to 24:00", timer.end))?;
                Some(Window { start, end })
            }
        };
        // As in a manifest: absent or 0 is Sedna's default; a negative number fails to parse.
        let check_period_secs = match config.check_period_seconds {
            None | Some(0) => DEFAULT_CHECK_PERIOD_SECS,
            Some(secs) => secs,
        };
        Ok(ThresholdTrigger {
            operator,
            threshold: condition.threshold,
            metric,
            metric_name: condition.metric,
            window,
            check_period_secs,
        })
    }

    fn decide(&mut self, stats: &Stats) -> Decision {
        let decision = self.evaluate(stats);
        decision.recheck_after(self.check_period_secs)
    }
}

impl ThresholdTrigger {
    fn evaluate(&self, stats: &Stats) -> Decision {
        if let Some(window) = self.window {
            let now = stats.local_minute_of_day();
            if !window.contains(now) {
                return Decision::wait(format!(
                    "local time {} is outside the window {}-{}",
                    format_minutes(now),
                    format_minutes(window.start),
                    format_minutes(window.end)
                ));
            }
        }
        let value = self.metric.value(stats);
        let symbol = self.operator.symbol();
        if self.operator.holds(value, self.threshold) {
            Decision::train(format!("{} {value} {symbol} {}", self.metric_name, self.threshold))
        } else {
            Decision::wait(format!("{} {value} is not {symbol} {}", self.metric_name, self.threshold))
        }
    }
}

perennial_guest::export_trigger!(ThresholdTrigger);

#[cfg(test)]
mod tests {
    use super::*;

    fn trigger(config: &str) -> ThresholdTrigger {
        ThresholdTrigger::configure(config).unwrap_or_else(|err| panic!("{config}: {err}"))
    }

    fn condition(operator: &str, threshold: f64) -> String {
        format!(
            r#"{{"condition": {{"operator": "{operator}", "threshold": {threshold}, "metric": "num_of_samples"}}}}"#
        )
    }

    fn samples(n: u64) -> Stats {
        Stats { pending_train: n, ..Stats::default() }
    }

    #[test]
    fn every_operator_and_alias_at_the_threshold_boundaries() {
        // (operator, threshold, samples, trains)
        let cases: &[(&str, f64, u64, bool)] = &[
            (">", 500.0, 499, false),
            (">", 500.0, 500, false),
            (">", 500.0, 501, true),
            ("gt", 500.0, 501, true),
            ("gt", 500.0, 500, false),
            (">=", 500.0, 499, false),
            (">=", 500.0, 500, true),
            ("ge", 500.0, 500, true),
            ("ge", 500.0, 499, false),
            ("<", 10.0, 9, true),
            ("<", 10.0, 10, false),
            ("lt", 10.0, 9, true),
            ("lt", 10.0, 11, false),
            ("<=", 10.0, 10, true),
            ("<=", 10.0, 11, false),
            ("le", 10.0, 10, true),
            ("=", 7.0, 7, true),
            ("=", 7.0, 8, false),
            ("==", 7.0, 7, true),
            ("eq", 7.0, 7, true),
            ("eq", 7.0000001, 7, true), // within 1e-6
            ("eq", 7.00001, 7, false),
            ("!=", 7.0, 8, true),
            ("!=", 7.0, 7, false),
            ("ne", 7.0, 7, false),
            ("ne", 7.0000001, 7, false),
            ("ne", 7.1, 7, true),
            (">", 0.5, 1, true),
            (">", 0.0, 0, false),
            // Sedna's tolerance: within 1e-6 of the threshold is equal, for every operator.
            (">=", 500.0000005, 500, true),
            ("ge", 500.0000005, 500, true),
            (">", 499.9999995, 500, false),
            ("gt", 499.9999995, 500, false),
            ("<", 500.0000005, 500, false),
            ("lt", 500.0000005, 500, false),
            ("<=", 499.9999995, 500, true),
            ("le", 499.9999995, 500, true),
            (">=", 500.00001, 500, false),
            (">", 499.99999, 500, true),
        ];
        for &(op, threshold, n, expected) in cases {
            let decision = trigger(&condition(op, threshold)).decide(&samples(n));
            assert_eq!(decision.train, expected, "{n} {op} {threshold}: {}", decision.reason);
        }
    }

    #[test]
    fn the_reason_names_the_metric_and_the_comparison() {
        let mut t = trigger(&condition(">", 500.0));
        assert_eq!(t.decide(&samples(501)).reason, "num_of_samples 501 > 500");
        assert_eq!(t.decide(&samples(500)).reason, "num_of_samples 500 is not > 500");
    }

    fn at(hh: u64, mm: u64) -> Stats {
        Stats { pending_train: 1000, wall_clock_secs: 19_000 * 86_400 + hh * 3600 + mm * 60, ..Stats::default() }
    }

    fn windowed(start: &str, end: &str) -> ThresholdTrigger {
        trigger(&format!(
            r#"{{"timer": {{"start": "{start}", "end": "{end}"}}, "condition": {{"operator": ">", "threshold": 500, "metric": "num_of_samples"}}}}"#
        ))
    }

    #[test]
    fn daily_windows_including_wrap_and_24_00() {
        // (start, end, now, inside)
        let cases: &[(&str, &str, (u64, u64), bool)] = &[
            ("02:00", "24:00", (1, 59), false),
            ("02:00", "24:00", (2, 0), true),
            ("02:00", "24:00", (23, 59), true),
            ("02:00", "24:00", (0, 0), false),
            ("00:00", "24:00", (0, 0), true),
            ("00:00", "24:00", (23, 59), true),
            ("09:30", "17:00", (9, 29), false),
            ("09:30", "17:00", (9, 30), true),
            ("09:30", "17:00", (16, 59), true),
            ("09:30", "17:00", (17, 0), true), // both ends included, to the minute
            ("09:30", "17:00", (17, 1), false),
            ("22:00", "02:00", (21, 59), false),
            ("22:00", "02:00", (22, 0), true),
            ("22:00", "02:00", (23, 59), true),
            ("22:00", "02:00", (0, 0), true),
            ("22:00", "02:00", (1, 59), true),
            ("22:00", "02:00", (2, 0), true),
            ("22:00", "02:00", (2, 1), false),
            ("22:00", "02:00", (12, 0), false),
            // start == end: that one minute.
            ("02:00", "02:00", (1, 59), false),
            ("02:00", "02:00", (2, 0), true),
            ("02:00", "02:00", (2, 1), false),
            ("00:00", "00:00", (0, 0), true),
            ("00:00", "00:00", (23, 59), false),
        ];
        for &(start, end, (hh, mm), inside) in cases {
            let decision = windowed(start, end).decide(&at(hh, mm));
            assert_eq!(decision.train, inside, "{start}-{end} at {hh:02}:{mm:02}: {}", decision.reason);
        }
    }

    #[test]
    fn the_window_uses_the_nodes_local_time() {
        let mut t = windowed("09:00", "10:00");
        // 07:30 UTC is 09:30 at UTC+2 and 02:30 at UTC-5.
        let utc = at(7, 30);
        assert!(!t.decide(&utc).train);
        assert!(t.decide(&Stats { utc_offset_secs: 2 * 3600, ..utc.clone() }).train);
        assert!(!t.decide(&Stats { utc_offset_secs: -5 * 3600, ..utc }).train);
    }

    #[test]
    fn window_and_condition_are_both_required() {
        let mut t = windowed("02:00", "24:00");
        assert!(!t.decide(&Stats { pending_train: 500, ..at(3, 0) }).train);
        let outside = t.decide(&Stats { pending_train: 10_000, ..at(1, 0) });
        assert!(!outside.train);
        assert_eq!(outside.reason, "local time 01:00 is outside the window 02:00-24:00");
    }

    #[test]
    fn check_period_is_honoured() {
        let mut default = trigger(&condition(">", 1.0));
        assert_eq!(default.decide(&samples(0)).recheck_after_secs, Some(60));
        let mut custom = trigger(
            r#"{"checkPeriodSeconds": 30, "condition": {"operator": ">", "threshold": 1, "metric": "num_of_samples"}}"#,
        );
        assert_eq!(custom.decide(&samples(5)).recheck_after_secs, Some(30));
        // 0 means "not set", as in a manifest: Sedna's 60.
        let mut zero = trigger(r#"{"checkPeriodSeconds": 0, "condition": {"operator": ">", "threshold": 1}}"#);
        assert_eq!(zero.decide(&samples(5)).recheck_after_secs, Some(60));
    }

    #[test]
    fn configure_rejects_what_sedna_silently_accepts() {
        let cases: &[(&str, &str)] = &[
            (
                r#"{"condition": {"operator": "~", "threshold": 1, "metric": "num_of_samples"}}"#,
                "condition.operator: unknown operator \"~\"",
            ),
            (
                r#"{"condition": {"operator": ">", "threshold": 1, "metric": "accuracy"}}"#,
                "condition.metric: unknown metric \"accuracy\"",
            ),
            (r#"{"condition": {"operator": ">", "metric": "num_of_samples"}}"#, "condition.threshold: missing"),
            (r#"{"condition": {"operator": ">", "threshold": "x"}}"#, "condition.threshold: expected a number"),
            (
                r#"{"timer": {"start": "2:00", "end": "24:00"}, "condition": {"operator": ">", "threshold": 1}}"#,
                "timer.start: \"2:00\" is not a time",
            ),
            (
                r#"{"timer": {"start": "24:00", "end": "23:00"}, "condition": {"operator": ">", "threshold": 1}}"#,
                "timer.start: \"24:00\"",
            ),
            (
                r#"{"timer": {"start": "02:00", "end": "25:00"}, "condition": {"operator": ">", "threshold": 1}}"#,
                "timer.end: \"25:00\"",
            ),
            (
                r#"{"timer": {"start": "+2:00", "end": "23:00"}, "condition": {"operator": ">", "threshold": 1}}"#,
                "timer.start: \"+2:00\"",
            ),
            (
                r#"{"timer": {"start": "02:00", "end": "2:+0"}, "condition": {"operator": ">", "threshold": 1}}"#,
                "timer.end: \"2:+0\"",
            ),
            (
                r#"{"timer": {"start": "02:00", "end": "02:60"}, "condition": {"operator": ">", "threshold": 1}}"#,
                "timer.end: \"02:60\"",
            ),
            (r#"{"timer": {"start": "02:00"}, "condition": {"operator": ">", "threshold": 1}}"#, "timer.end: missing"),
            (
                r#"{"checkPeriodSeconds": -5, "condition": {"operator": ">", "threshold": 1}}"#,
                "checkPeriodSeconds: invalid value",
            ),
            (r#"{"condition": {"operator": ">", "threshold": 1}, "extra": 1}"#, "extra: unknown field"),
            (r#"{}"#, "condition: missing"),
            (r#"not json"#, "config: not JSON (expected ident"),
        ];
        for (config, expected) in cases {
            match ThresholdTrigger::configure(config) {
                Ok(_) => panic!("{config} was accepted"),
                Err(err) => assert!(err.contains(expected), "{config}: got {err:?}, want {expected:?}"),
            }
        }
    }

    #[test]
    fn metric_defaults_to_num_of_samples() {
        let mut t = trigger(r#"{"condition": {"operator": ">=", "threshold": 3}}"#);
        assert!(t.decide(&samples(3)).train);
    }
}
