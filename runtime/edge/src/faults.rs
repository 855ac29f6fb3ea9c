//! Errors that repeat, said once and then counted. A job whose index cannot be read (replaced by
//! a folder, overwritten in place) meets the same error at every turn; it is logged when it
//! first happens, again with its count at most every [`SAY_AGAIN`], and when it ends, and the
//! job's status shows it with its count and first time.

use std::time::{Duration, Instant};

/// The longest a repeating fault goes unsaid in the log.
pub const SAY_AGAIN: Duration = Duration::from_secs(600);
/// How often the count a status shows is brought up to date (each update is a write).
const COUNT_SHOWN_EVERY: Duration = Duration::from_secs(30);

/// Where in a turn a fault happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// Reading new samples from the index.
    Ingest,
    /// The edge's step for the job's stage (a round's files, the deploy copy).
    Step,
}

impl Site {
    fn name(self) -> &'static str {
        match self {
            Site::Ingest => "ingest",
            Site::Step => "stage step",
        }
    }
}

/// One fault that repeats.
#[derive(Clone, Debug)]
struct Fault {
    site: Site,
    message: String,
    count: u64,
    /// When it first happened (unix seconds).
    since: u64,
    said: Instant,
    /// The count the status shows, and when it was updated.
    shown: (u64, Instant),
}

/// What to log for a noted outcome.
#[derive(Debug, PartialEq, Eq)]
pub enum Say {
    /// A new fault (or a new message at its site).
    First(String),
    /// A fault still happening, with its count so far.
    Still(String),
    /// The fault at this site ended after this many times.
    Ended(String),
    Nothing,
}

/// A job's faults, at most one per site.
#[derive(Debug, Default)]
pub struct Faults {
    open: Vec<Fault>,
    /// Whether the missing index was said (it is a wait, not a fault: said once).
    pub missing_said: bool,
    /// Whether the job's hold (the edge lacks its history) was said: once, not every turn.
    pub held_said: bool,
}

impl Faults {
    /// Notes the outcome at `site` at `now` (unix seconds): `Some(message)` a fault, `None` a
    /// success. Returns what to log.
    pub fn note(&mut self, site: Site, fault: Option<&str>, now: u64) -> Say {
        let at = self.open.iter().position(|f| f.site == site);
        match (fault, at) {
            (None, None) => Say::Nothing,
            (None, Some(i)) => {
                let fault = self.open.remove(i);
                Say::Ended(format!(
                    "{} works again after failing {} times: {}",
                    site.name(),
                    fault.count,
                    fault.message
                ))
            }
            (Some(message), Some(i)) if self.open[i].message == message => {
                let fault = &mut self.open[i];
                fault.count += 1;
                if fault.shown.1.elapsed() >= COUNT_SHOWN_EVERY {
                    fault.shown = (fault.count, Instant::now());
                }
                if fault.said.elapsed() < SAY_AGAIN {
                    return Say::Nothing;
                }
                fault.said = Instant::now();
                Say::Still(format!("{message} (still: {} times since {})", fault.count, time(fault.since)))
            }
            (Some(message), at) => {
                let fault = Fault {
                    site,
                    message: message.to_owned(),
                    count: 1,
                    since: now,
                    said: Instant::now(),
                    shown: (1, Instant::now()),
                };
                match at {
                    Some(i) => self.open[i] = fault,
                    None => self.open.push(fault),
                }
                Say::First(message.to_owned())
            }
        }
    }

    /// The open faults as a status shows them: `message (N times since T)`, `; ` between two.
    pub fn summary(&self) -> Option<String> {
        let shown: Vec<String> = self
            .open
            .iter()
            .map(|f| match f.shown.0 {
                1 => format!("{} (since {})", f.message, time(f.since)),
                n => format!("{} ({n} times since {})", f.message, time(f.since)),
            })
            .collect();
        (!shown.is_empty()).then(|| shown.join("; "))
    }
}

fn time(unix: u64) -> String {
    jiff::Timestamp::from_second(unix as i64).map(|t| t.to_string()).unwrap_or_else(|_| unix.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeating_fault_is_said_once_counted_and_its_end_said() {
        let mut faults = Faults::default();
        assert_eq!(faults.note(Site::Ingest, None, 100), Say::Nothing);
        assert_eq!(faults.note(Site::Ingest, Some("is a folder"), 100), Say::First("is a folder".into()));
        for _ in 0..1000 {
            assert_eq!(faults.note(Site::Ingest, Some("is a folder"), 101), Say::Nothing);
        }
        assert_eq!(faults.summary().as_deref(), Some("is a folder (since 1970-01-01T00:01:40Z)"));
        // Another site's fault is its own; a new message at a site is said.
        assert!(matches!(faults.note(Site::Step, Some("bytes changed"), 102), Say::First(_)));
        assert!(matches!(faults.note(Site::Ingest, Some("gone"), 103), Say::First(_)));
        assert_eq!(faults.summary().unwrap().split("; ").count(), 2);
        assert_eq!(
            faults.note(Site::Ingest, None, 104),
            Say::Ended("ingest works again after failing 1 times: gone".into())
        );
        assert_eq!(faults.summary().as_deref(), Some("bytes changed (since 1970-01-01T00:01:42Z)"));
    }

    #[test]
    fn the_count_shown_is_brought_up_to_date_now_and_then() {
        let mut faults = Faults::default();
        faults.note(Site::Ingest, Some("x"), 0);
        faults.open[0].shown.1 -= COUNT_SHOWN_EVERY;
        faults.note(Site::Ingest, Some("x"), 0);
        assert_eq!(faults.summary().as_deref(), Some("x (2 times since 1970-01-01T00:00:00Z)"));
        faults.open[0].said -= SAY_AGAIN;
        assert_eq!(
            faults.note(Site::Ingest, Some("x"), 0),
            Say::Still("x (still: 3 times since 1970-01-01T00:00:00Z)".into())
        );
    }
}
