//! Log lines from a policy, attributed by the host to the job and the policy.
//!
//! In a native test (`cargo test` on the host) the lines are kept instead: read them with
//! [`take_captured`].

/// Severity of a log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// Writes one line to the job's log.
pub fn log(level: Level, message: &str) {
    imp::log(level, message)
}

pub fn trace(message: impl AsRef<str>) {
    log(Level::Trace, message.as_ref())
}
pub fn debug(message: impl AsRef<str>) {
    log(Level::Debug, message.as_ref())
}
pub fn info(message: impl AsRef<str>) {
    log(Level::Info, message.as_ref())
}
pub fn warn(message: impl AsRef<str>) {
    log(Level::Warn, message.as_ref())
}
pub fn error(message: impl AsRef<str>) {
    log(Level::Error, message.as_ref())
}

/// The lines logged on this thread since the last call (native builds only).
#[cfg(not(target_arch = "wasm32"))]
pub fn take_captured() -> Vec<(Level, String)> {
    imp::CAPTURED.with(|lines| std::mem::take(&mut *lines.borrow_mut()))
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::Level;
    use crate::__private::wit_host;
    use crate::__private::wit_types::Level as WitLevel;

    pub fn log(level: Level, message: &str) {
        let level = match level {
            Level::Trace => WitLevel::Trace,
            Level::Debug => WitLevel::Debug,
            Level::Info => WitLevel::Info,
            Level::Warn => WitLevel::Warn,
            Level::Error => WitLevel::Error,
        };
        wit_host::log(level, message);
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use super::Level;
    use std::cell::RefCell;

    thread_local! {
        pub static CAPTURED: RefCell<Vec<(Level, String)>> = const { RefCell::new(Vec::new()) };
    }

    pub fn log(level: Level, message: &str) {
        CAPTURED.with(|lines| lines.borrow_mut().push((level, message.to_owned())));
    }
}
