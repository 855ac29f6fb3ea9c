//! Connections the link refuses (a missing, unknown or unreviewable token), kept cheap: each
//! source address may have at most [`MAX_FAILURES`] tokens refused in [`WINDOW`] (more if as many
//! of its connections opened the link: a fleet behind one address, NAT or a load balancer, is
//! not locked out by a few misconfigured nodes among it), after which its connections are dropped
//! on accept (no TLS, no TokenReview) until the window passes. Handshakes that failed otherwise
//! (a timeout, TLS, no upgrade) cost no review and never throttle: under load, honest nodes time
//! out. Refusals are counted (the operator's metrics) and said in one log line per [`SAY_EVERY`]
//! with their count, never a line each.

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
    /// Per source: its window.
    sources: HashMap<IpAddr, Window>,
    /// Refusals and throttled connections not yet said, with the last reason.
    unsaid: (u64, u64, String),
    said: Option<Instant>,
}

/// A source's refused tokens and opened links since its window began.
#[derive(Clone, Copy)]
struct Window {
    refused: u32,
    opened: u32,
    since: Instant,
    /// When a throttled source's last connection was let through anyway.
    probed: Option<Instant>,
}

/// A throttled source still has a connection served this often: its good nodes (behind the same
/// address) reopen their links one by one, each raising its allowance, at the cost of one token
/// review a second at most.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

impl Window {
    fn throttled(&self, now: Instant) -> bool {
        now < self.since + WINDOW && self.refused >= MAX_FAILURES && self.refused > self.opened
    }
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
        let throttled = match state.sources.get_mut(&source) {
            Some(window) if window.throttled(now) => {
                let probe = window.probed.is_none_or(|probed| now >= probed + PROBE_EVERY);
                if probe {
                    window.probed = Some(now);
                }
                !probe
            }
            _ => false,
        };
        if throttled {
            state.unsaid.1 += 1;
            let _ = self.say_if_due(&mut state, now);
            drop(state);
            (self.count)(Refusal::Throttled);
        }
        !throttled
    }

    /// A connection from `source` opened the link at `now`: its token was good.
    pub fn opened(&self, source: IpAddr, now: Instant) {
        let mut state = self.state();
        // Only a source that failed lately is remembered: a fleet's good addresses cost nothing.
        if let Some(window) = state.sources.get_mut(&source) {
            if now >= window.since + WINDOW {
                state.sources.remove(&source);
            } else {
                window.opened = window.opened.saturating_add(1);
            }
        }
    }

    /// A connection from `source` failed its handshake for `reason` at `now`: counted and said;
    /// only a token refused (`token_refused`) counts towards the source's throttle.
    pub fn refused(&self, source: IpAddr, reason: &str, token_refused: bool, now: Instant) {
        let mut state = self.state();
        if token_refused {
            let window = window_of(&mut state.sources, source, now);
            window.refused = window.refused.saturating_add(1);
        }
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

/// The source's window at `now` (a new one once the last has passed), room made for it first.
fn window_of(sources: &mut HashMap<IpAddr, Window>, source: IpAddr, now: Instant) -> &mut Window {
    if sources.len() >= MAX_SOURCES && !sources.contains_key(&source) {
        sources.retain(|_, window| now < window.since + WINDOW);
        if sources.len() >= MAX_SOURCES
            && let Some(oldest) = sources.iter().min_by_key(|(_, window)| window.since).map(|(ip, _)| *ip)
        {
            sources.remove(&oldest);
        }
    }
    let window = sources.entry(source).or_insert(Window { refused: 0, opened: 0, since: now, probed: None });
    if now >= window.since + WINDOW {
        *window = Window { refused: 0, opened: 0, since: now, probed: None };
    }
    window
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
            refusals.refused(bad, "unknown token", true, start);
        }
        let at = |millis: u64| start + Duration::from_millis(millis);
        assert!(refusals.admits(bad, at(1000)), "one connection a second is still let through");
        assert!(!refusals.admits(bad, at(1001)), "throttled after its failures");
        assert!(!refusals.admits(bad, at(1999)), "throttled after its failures");
        assert!(refusals.admits(bad, at(2000)), "the next second's one");
        assert!(refusals.admits(good, at(2000)), "another source is not throttled");
        assert!(refusals.admits(bad, start + WINDOW), "the window passed");
        assert!(refusals.admits(bad, start + WINDOW), "the window passed");
        assert_eq!((refused.load(Ordering::SeqCst), throttled.load(Ordering::SeqCst)), (u64::from(MAX_FAILURES), 2));
    }

    #[test]
    fn a_fleet_behind_one_address_is_not_locked_out_by_its_few_bad_nodes_nor_by_timeouts() {
        let refusals = Refusals::default();
        let nat: IpAddr = "10.0.0.7".parse().unwrap();
        let start = Instant::now();
        // Under load, honest nodes' handshakes time out: that throttles nothing.
        for _ in 0..10 * MAX_FAILURES {
            refusals.refused(nat, "no answer within 10s", false, start);
        }
        assert!(refusals.admits(nat, start), "timeouts are no bad tokens");
        // Its good nodes open links; as many bad tokens as that are let through.
        for _ in 0..100 {
            refusals.refused(nat, "unknown token", true, start);
        }
        assert!(refusals.admits(nat, start), "a throttled source's one connection a second");
        assert!(!refusals.admits(nat, start), "100 bad tokens and no good one: throttled");
        for _ in 0..100 {
            refusals.opened(nat, start);
        }
        assert!(refusals.admits(nat, start), "as many good links as bad tokens: served");
        refusals.refused(nat, "unknown token", true, start);
        assert!(!refusals.admits(nat, start), "one more bad token than good links: throttled again");
        assert!(refusals.admits(nat, start + PROBE_EVERY), "but for its one connection a second");
    }

    #[test]
    fn a_burst_that_stopped_is_summed_up_once_its_minute_is_over() {
        let refusals = Refusals::default();
        let source: IpAddr = "10.0.0.9".parse().unwrap();
        let start = Instant::now();
        // The first refusal is said at once, the next four wait for the minute.
        for _ in 0..5 {
            refusals.refused(source, "unknown token", true, start);
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
            refusals.refused(IpAddr::from(n.to_be_bytes()), "x", true, now);
        }
        assert!(refusals.state().sources.len() <= MAX_SOURCES);
    }
}
