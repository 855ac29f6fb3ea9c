//! Connections the link refuses (a missing, unknown or unreviewable token), kept cheap: each
//! source address may fail at most [`MAX_FAILURES`] times in [`WINDOW`], after which its
//! connections are dropped on accept (no TLS, no TokenReview) until the window passes; refusals
//! are counted (the operator's metrics) and said in one log line per [`SAY_EVERY`] with their
//! count, never a line each.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed handshakes a source may make in [`WINDOW`] before it is throttled.
pub const MAX_FAILURES: u32 = 20;
pub const WINDOW: Duration = Duration::from_secs(60);
/// How often refusals are summed up in the log.
pub const SAY_EVERY: Duration = Duration::from_secs(60);
/// Sources remembered at most (the oldest windows go first past it).
const MAX_SOURCES: usize = 4096;

/// What happened to a connection that did not open the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its token was refused (missing, unknown, or not reviewed as an agent's).
    Refused,
    /// Dropped on accept: its source failed too often lately.
    Throttled,
}

/// Counts refusals per source and in all; told of each to `count` (the operator's metrics).
pub struct Refusals {
    state: Mutex<State>,
    count: Box<dyn Fn(Refusal) + Send + Sync>,
}

struct State {
    /// Per source: failures in its window, and when the window began.
    sources: HashMap<IpAddr, (u32, Instant)>,
    /// Refusals and throttled connections not yet said, with the last reason.
    unsaid: (u64, u64, String),
    said: Option<Instant>,
}

impl Default for Refusals {
    fn default() -> Self {
        Refusals::new(|_| {})
    }
}

impl Refusals {
    pub fn new(count: impl Fn(Refusal) + Send + Sync + 'static) -> Refusals {
        let state = State { sources: HashMap::new(), unsaid: (0, 0, String::new()), said: None };
        Refusals { state: Mutex::new(state), count: Box::new(count) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether a connection from `source` is served at `now`; a throttled one is counted.
    pub fn admits(&self, source: IpAddr, now: Instant) -> bool {
        let mut state = self.state();
        let throttled = state
            .sources
            .get(&source)
            .is_some_and(|(failures, since)| *failures >= MAX_FAILURES && now < *since + WINDOW);
        if throttled {
            state.unsaid.1 += 1;
            let _ = self.say_if_due(&mut state, now);
            drop(state);
            (self.count)(Refusal::Throttled);
        }
        !throttled
    }

    /// A connection from `source` was refused for `reason` at `now`.
    pub fn refused(&self, source: IpAddr, reason: &str, now: Instant) {
        let mut state = self.state();
        if state.sources.len() >= MAX_SOURCES && !state.sources.contains_key(&source) {
            state.sources.retain(|_, (_, since)| now < *since + WINDOW);
            if state.sources.len() >= MAX_SOURCES
                && let Some(oldest) = state.sources.iter().min_by_key(|(_, (_, since))| *since).map(|(ip, _)| *ip)
            {
                state.sources.remove(&oldest);
            }
        }
        let entry = state.sources.entry(source).or_insert((0, now));
        if now >= entry.1 + WINDOW {
            *entry = (0, now);
        }
        entry.0 += 1;
        state.unsaid.0 += 1;
        state.unsaid.2 = format!("{reason} (from {source})");
        let _ = self.say_if_due(&mut state, now);
        drop(state);
        (self.count)(Refusal::Refused);
    }

    /// Sums up what was refused and not yet said, if a line is due: called now and then, so a
    /// burst that stopped is said too, not only when another refusal comes. The line said.
    pub fn say_due(&self, now: Instant) -> Option<String> {
        let mut state = self.state();
        self.say_if_due(&mut state, now)
    }

    /// One line for what was refused since the last one: the first at once, then at most one
    /// every [`SAY_EVERY`].
    fn say_if_due(&self, state: &mut State, now: Instant) -> Option<String> {
        if state.said.is_some_and(|said| now < said + SAY_EVERY) {
            return None;
        }
        let (refused, throttled, last) = std::mem::take(&mut state.unsaid);
        if refused + throttled == 0 {
            return None;
        }
        state.said = Some(now);
        let line = format!("link connections refused: {refused} refused, {throttled} throttled; last: {last}");
        tracing::warn!(refused, throttled, "{line}");
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn a_source_that_keeps_failing_is_throttled_for_a_window_and_counted() {
        let (refused, throttled) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let counts = (refused.clone(), throttled.clone());
        let refusals = Refusals::new(move |kind| {
            let counter = if kind == Refusal::Refused { &counts.0 } else { &counts.1 };
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let (bad, good): (IpAddr, IpAddr) = ("10.0.0.9".parse().unwrap(), "10.0.0.1".parse().unwrap());
        let start = Instant::now();
        for _ in 0..MAX_FAILURES {
            assert!(refusals.admits(bad, start));
            refusals.refused(bad, "unknown token", start);
        }
        assert!(!refusals.admits(bad, start + Duration::from_secs(1)), "throttled after its failures");
        assert!(refusals.admits(good, start + Duration::from_secs(1)), "another source is not");
        assert!(refusals.admits(bad, start + WINDOW), "the window passed");
        assert_eq!((refused.load(Ordering::SeqCst), throttled.load(Ordering::SeqCst)), (u64::from(MAX_FAILURES), 1));
    }

    #[test]
    fn a_burst_that_stopped_is_summed_up_once_its_minute_is_over() {
        let refusals = Refusals::default();
        let source: IpAddr = "10.0.0.9".parse().unwrap();
        let start = Instant::now();
        // The first refusal is said at once, the next four wait for the minute.
        for _ in 0..5 {
            refusals.refused(source, "unknown token", start);
        }
        assert_eq!(refusals.say_due(start + Duration::from_secs(1)), None, "one line a minute at most");
        let said = refusals.say_due(start + SAY_EVERY).expect("the rest said once the minute is over");
        assert!(said.contains("4 refused, 0 throttled") && said.contains("unknown token"), "{said}");
        assert_eq!(refusals.say_due(start + SAY_EVERY * 3), None, "nothing new, nothing said");
    }

    #[test]
    fn sources_remembered_are_bounded() {
        let refusals = Refusals::default();
        let now = Instant::now();
        for n in 0..(MAX_SOURCES as u32 + 10) {
            refusals.refused(IpAddr::from(n.to_be_bytes()), "x", now);
        }
        assert!(refusals.state().sources.len() <= MAX_SOURCES);
    }
}
