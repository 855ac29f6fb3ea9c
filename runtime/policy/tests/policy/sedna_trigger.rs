//! Sedna's own trigger tests, replayed through `builtin:threshold-trigger` (the real Wasm
//! component), with Sedna's expected answers written here: every case of `TestCondition`,
//! `TestTimerInRange` and `TestTimerAndCondition` in kubeedge/sedna
//! `pkg/localcontroller/trigger/trigger_test.go`. Then the boundary cases where the plugin used
//! to differ from Sedna's `trigger.go` (the 1e-6 tolerance on every operator, both window ends
//! included to the minute, start == end a one-minute window), and the defaults the plugin shares
//! with a manifest.
//!
//! Two adaptations, both because of the plugin's deliberate differences: Sedna's tests name the
//! metric `numOfSamples`, a key of the stats map the test builds; the local controller's stats
//! (and the plugin's) call it `num_of_samples`. And `TestTimerInRange` gives a timer without a
//! condition, which Sedna trains on alone (even with no sample); the plugin requires a
//! condition, so the timer cases are given one that always holds (`num_of_samples >= 0`).

use std::sync::Arc;

use perennial_policy::{PolicyHost, PolicyRef, TriggerKind, TriggerPolicy, TriggerStats, builtin};
use serde_json::{Value, json};

/// A day far from the epoch, at UTC midnight.
const DAY: u64 = 19_000 * 86_400;

struct Plugin {
    host: PolicyHost,
    bytes: &'static [u8],
}

impl Plugin {
    fn new() -> Plugin {
        Plugin { host: PolicyHost::new(None, None).unwrap(), bytes: builtin::component("threshold-trigger").unwrap() }
    }

    fn configure(&self, config: &Value) -> Result<TriggerPolicy, String> {
        let valid = PolicyRef::new("builtin:threshold-trigger").with_config(config.clone()).validate()?;
        let events = Arc::new(perennial_policy::TracingEvents { job: "sedna".into() });
        self.host.load_bytes::<TriggerKind>(&valid, self.bytes, events).map_err(|err| err.to_string())
    }

    fn trigger(&self, config: &Value) -> TriggerPolicy {
        self.configure(config).unwrap_or_else(|err| panic!("{config}: {err}"))
    }

    /// Sedna's `tg.Trigger(stats)`.
    fn trains(&self, config: &Value, stats: &TriggerStats) -> bool {
        let decision = self.trigger(config).decide(stats).unwrap();
        decision.train
    }
}

/// The stats at `minute` past local midnight and `second` into that minute (UTC node).
fn stats(samples: u64, minute: u64, second: u64) -> TriggerStats {
    TriggerStats { pending_train: samples, wall_clock_secs: DAY + minute * 60 + second, ..TriggerStats::default() }
}

fn condition(operator: &str, threshold: f64) -> Value {
    json!({"condition": {"operator": operator, "threshold": threshold, "metric": "num_of_samples"}})
}

/// Go's `t.Format("15:04")` of a time `minute` past midnight, the day wrapping.
fn hhmm(minute: i64) -> String {
    let minute = minute.rem_euclid(24 * 60);
    format!("{:02}:{:02}", minute / 60, minute % 60)
}

/// The times of day the timer tables are replayed at: every 7th minute and the minutes around
/// midnight and the hours, each at a different second of its minute.
fn nows() -> Vec<(u64, u64)> {
    let mut minutes: Vec<u64> = (0..24 * 60).step_by(7).collect();
    minutes.extend([0, 1, 59, 60, 61, 119, 120, 121, 22 * 60, 23 * 60 - 1, 23 * 60, 23 * 60 + 1, 24 * 60 - 1]);
    minutes.sort_unstable();
    minutes.dedup();
    minutes.into_iter().map(|m| (m, (m * 17) % 60)).collect()
}

/// `TestCondition`: stats `{numOfSamples: 500}`, no timer.
#[test]
fn sedna_test_condition() {
    let plugin = Plugin::new();
    // (operator, threshold, expected): Sedna's table, in Sedna's order.
    let cases: &[(&str, f64, bool)] = &[
        ("gt", 499.0, true),
        (">", 499.0, true),
        ("gt", 500.0, false),
        (">", 500.0, false),
        ("ge", 501.0, false),
        (">=", 501.0, false),
        ("ge", 500.0, true),
        (">=", 500.0, true),
        ("eq", 500.0, true),
        ("=", 500.0, true),
        ("=", 501.0, false),
        ("!=", 500.0, false),
        ("!=", 501.0, true),
        ("lt", 501.0, true),
        ("<", 501.0, true),
        ("lt", 500.0, false),
        ("<", 500.0, false),
        ("le", 501.0, true),
        ("<=", 501.0, true),
        ("le", 500.0, true),
        ("<=", 500.0, true),
        ("le", 499.0, false),
        ("<=", 499.0, false),
    ];
    assert_eq!(cases.len(), 23);
    for &(operator, threshold, expected) in cases {
        let trains = plugin.trains(&condition(operator, threshold), &stats(500, 12 * 60, 0));
        assert_eq!(trains, expected, "500 {operator} {threshold}");
    }
}

/// `TestTimerInRange`: a window around now, given as offsets in hours from now.
#[test]
fn sedna_test_timer_in_range() {
    let plugin = Plugin::new();
    // (start, end, expected) in hours from now: Sedna's table.
    let cases: &[(i64, i64, bool)] = &[(-1, 1, true), (-2, -1, false), (1, 2, false), (1, -1, false), (2, 1, true)];
    for (now, second) in nows() {
        for &(start, end, expected) in cases {
            let (start, end) = (hhmm(now as i64 + start * 60), hhmm(now as i64 + end * 60));
            let config = json!({
                "timer": {"start": start, "end": end},
                "condition": {"operator": ">=", "threshold": 0, "metric": "num_of_samples"},
            });
            let trains = plugin.trains(&config, &stats(0, now, second));
            assert_eq!(trains, expected, "{start}-{end} at {}:{second:02}", hhmm(now as i64));
        }
    }
}

/// `TestTimerAndCondition`: stats `{numOfSamples: 500}` and a window around now.
#[test]
fn sedna_test_timer_and_condition() {
    let plugin = Plugin::new();
    // (start, end in hours from now, operator, threshold, expected): Sedna's table.
    let cases: &[(i64, i64, &str, f64, bool)] =
        &[(-1, 1, "ge", 500.0, true), (-1, 1, "ge", 600.0, false), (-2, -1, "ge", 500.0, false)];
    for (now, second) in nows() {
        for &(start, end, operator, threshold, expected) in cases {
            let (start, end) = (hhmm(now as i64 + start * 60), hhmm(now as i64 + end * 60));
            let config = json!({
                "timer": {"start": start, "end": end},
                "condition": {"operator": operator, "threshold": threshold, "metric": "num_of_samples"},
            });
            let trains = plugin.trains(&config, &stats(500, now, second));
            assert_eq!(
                trains,
                expected,
                "{start}-{end} at {}:{second:02}, 500 {operator} {threshold}",
                hhmm(now as i64)
            );
        }
    }
}

/// Sedna's `isEqual := math.Abs(realValue-bt.Threshold) < 1e-6` applies to every operator.
#[test]
fn the_tolerance_applies_to_every_operator_and_alias() {
    let plugin = Plugin::new();
    // (operator, threshold, expected at 500 samples): what Sedna's trigger.go answers.
    let cases: &[(&str, f64, bool)] = &[
        (">=", 500.0000005, true),
        ("ge", 500.0000005, true),
        (">", 499.9999995, false),
        ("gt", 499.9999995, false),
        ("<", 500.0000005, false),
        ("lt", 500.0000005, false),
        ("<=", 499.9999995, true),
        ("le", 499.9999995, true),
        ("=", 500.0000005, true),
        ("==", 499.9999995, true),
        ("eq", 500.0000005, true),
        ("!=", 500.0000005, false),
        ("ne", 499.9999995, false),
        // Beyond the tolerance, plain comparison.
        (">=", 500.00001, false),
        (">", 499.99999, true),
        ("<", 500.00001, true),
        ("<=", 499.99999, false),
        ("eq", 500.00001, false),
        ("ne", 500.00001, true),
    ];
    for &(operator, threshold, expected) in cases {
        let trains = plugin.trains(&condition(operator, threshold), &stats(500, 12 * 60, 0));
        assert_eq!(trains, expected, "500 {operator} {threshold}");
    }
}

/// Sedna compares `HH:MM` strings with `start <= now && now <= end` (or `start <= now || now <=
/// end` when start > end): both ends are included to the minute.
#[test]
fn the_window_includes_both_end_minutes() {
    let plugin = Plugin::new();
    // (start, end, now as (hour, minute, second), expected): what Sedna's trigger.go answers.
    type Case<'a> = (&'a str, &'a str, (u64, u64, u64), bool);
    let cases: &[Case] = &[
        ("02:00", "20:00", (1, 59, 59), false),
        ("02:00", "20:00", (2, 0, 0), true),
        ("02:00", "20:00", (20, 0, 0), true),
        ("02:00", "20:00", (20, 0, 59), true),
        ("02:00", "20:00", (20, 1, 0), false),
        ("22:00", "02:00", (21, 59, 59), false),
        ("22:00", "02:00", (22, 0, 0), true),
        ("22:00", "02:00", (0, 0, 0), true),
        ("22:00", "02:00", (2, 0, 59), true),
        ("22:00", "02:00", (2, 1, 0), false),
        // start == end: that one minute.
        ("12:00", "12:00", (11, 59, 59), false),
        ("12:00", "12:00", (12, 0, 0), true),
        ("12:00", "12:00", (12, 0, 59), true),
        ("12:00", "12:00", (12, 1, 0), false),
        ("00:00", "00:00", (0, 0, 30), true),
        ("00:00", "00:00", (23, 59, 59), false),
        // 24:00 sorts after every HH:MM a clock shows.
        ("02:00", "24:00", (23, 59, 59), true),
        ("02:00", "24:00", (0, 0, 0), false),
        ("00:00", "24:00", (0, 0, 0), true),
        ("00:00", "23:59", (23, 59, 59), true),
    ];
    for &(start, end, (h, m, s), expected) in cases {
        let config = json!({
            "timer": {"start": start, "end": end},
            "condition": {"operator": ">", "threshold": 500, "metric": "num_of_samples"},
        });
        let trains = plugin.trains(&config, &stats(501, h * 60 + m, s));
        assert_eq!(trains, expected, "{start}-{end} at {h:02}:{m:02}:{s:02}");
    }
}

/// The defaults the plugin shares with a manifest (spec.trainSpec.trigger), and what both refuse.
#[test]
fn defaults_and_refusals_agree_with_a_manifest() {
    let plugin = Plugin::new();
    let recheck = |config: Value| plugin.trigger(&config).decide(&stats(0, 0, 0)).unwrap().recheck_after_secs;
    let cond = json!({"operator": ">", "threshold": 1, "metric": "num_of_samples"});
    assert_eq!(recheck(json!({"condition": cond})), Some(60), "absent: 60");
    assert_eq!(recheck(json!({"checkPeriodSeconds": 0, "condition": cond})), Some(60), "0: 60");
    assert_eq!(recheck(json!({"checkPeriodSeconds": 15, "condition": cond})), Some(15));
    let negative = plugin.configure(&json!({"checkPeriodSeconds": -1, "condition": cond})).err().unwrap();
    assert!(negative.contains("checkPeriodSeconds"), "{negative}");
    // A condition without a metric tests num_of_samples.
    let no_metric = json!({"condition": {"operator": ">=", "threshold": 3}});
    assert!(plugin.trains(&no_metric, &stats(3, 0, 0)));
    assert!(!plugin.trains(&no_metric, &stats(2, 0, 0)));
    // No condition: refused (Sedna trains on the timer alone, even with no sample).
    let timer_only = plugin.configure(&json!({"timer": {"start": "00:00", "end": "24:00"}})).err().unwrap();
    assert!(timer_only.contains("condition: missing"), "{timer_only}");
}
