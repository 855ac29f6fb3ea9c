//! Write Perennial policy plugins in Rust.
//!
//! A policy makes one kind of decision for a lifelong learning job:
//!
//! | kind | trait | export macro | decides |
//! |---|---|---|---|
//! | trigger | [`Trigger`] | [`export_trigger!`] | when to start a training round |
//! | splitter | [`Splitter`] | [`export_splitter!`] | where each new sample goes: train, eval or skip |
//! | selector | [`Selector`] | [`export_selector!`] | which evaluated model to deploy, if any |
//!
//! Implement the trait, call the export macro once, and build the crate for `wasm32-wasip2`:
//! the result is a WebAssembly component that `perennial` loads with
//! `file:///absolute/path/to/plugin.wasm`. The WIT contract (`perennial:policy@0.1.0`, in this
//! crate's `wit/policy.wit`) stays hidden behind these types.
//!
//! `perennial plugin new trigger NAME --lang rust` starts such a project, with this crate
//! vendored in as `vendor/perennial-guest`.
//!
//! # A complete minimal plugin
//!
//! `Cargo.toml`:
//!
//! ```toml
//! [package]
//! name = "every-n-trigger"
//! version = "0.1.0"
//! edition = "2024"
//!
//! [lib]
//! crate-type = ["cdylib", "rlib"]
//!
//! [dependencies]
//! # As `perennial plugin new` vendors it (from crates.io: `perennial-guest = "0.1"`).
//! perennial-guest = { path = "vendor/perennial-guest", version = "0.1" }
//! serde = { version = "1", features = ["derive"] }
//! ```
//!
//! `src/lib.rs`:
//!
//! ```
//! use perennial_guest::{Decision, Stats, Trigger};
//!
//! /// Train as soon as `n` new train samples are waiting.
//! pub struct EveryN {
//!     n: u64,
//! }
//!
//! #[derive(serde::Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Config {
//!     n: u64,
//! }
//!
//! impl Trigger for EveryN {
//!     fn configure(config: &str) -> Result<Self, String> {
//!         let config: Config = perennial_guest::parse_config(config)?;
//!         if config.n == 0 {
//!             return Err("n: must be at least 1".into());
//!         }
//!         Ok(EveryN { n: config.n })
//!     }
//!
//!     fn decide(&mut self, stats: &Stats) -> Decision {
//!         if stats.pending_train >= self.n {
//!             Decision::train(format!("{} new samples", stats.pending_train))
//!         } else {
//!             perennial_guest::log::debug("not enough samples yet");
//!             Decision::wait(format!("{} of {} samples", stats.pending_train, self.n))
//!         }
//!     }
//! }
//!
//! perennial_guest::export_trigger!(EveryN);
//!
//! // Native tests: plain `cargo test` on the host, no WebAssembly involved.
//! let mut policy = EveryN::configure(r#"{"n": 3}"#).unwrap();
//! assert!(!policy.decide(&Stats { pending_train: 2, ..Stats::default() }).train);
//! assert!(policy.decide(&Stats { pending_train: 3, ..Stats::default() }).train);
//! assert!(EveryN::configure(r#"{"n": 0}"#).is_err());
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2` and try it:
//! `perennial plugin call target/wasm32-wasip2/release/every_n_trigger.wasm
//! --config '{"n": 3}' --trigger '{"pendingTrain": 5}'` (a path, or `file://` with an absolute
//! one).
//!
//! # Sandbox
//!
//! A policy has no filesystem, no network and no environment; its wall-clock time per call
//! and its memory are capped by the job. It logs through [`log`]; anything it prints to
//! stdout or stderr is captured and attributed to the job too.

// Lets the generated bindings name this crate the way a plugin crate does.
extern crate self as perennial_guest;

mod config;
pub mod log;
mod metrics;
mod selector;
mod splitter;
mod state;
mod trigger;

pub use config::parse_config;
pub use log::Level;
pub use metrics::{Metric, Metrics};
pub use selector::{Choice, Model, Selector};
pub use splitter::{Assignment, Batch, Splitter};
pub use trigger::{Decision, Stats, Trigger};

/// Used by the export macros; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::selector::Export as SelectorExport;
    pub use crate::splitter::Export as SplitterExport;
    pub use crate::trigger::Export as TriggerExport;
    pub use wit_bindgen;

    pub mod trigger {
        wit_bindgen::generate!({
            path: "wit",
            world: "trigger-policy",
            pub_export_macro: true,
            export_macro_name: "export",
            default_bindings_module: "::perennial_guest::__private::trigger",
            runtime_path: "::perennial_guest::__private::wit_bindgen::rt",
        });
    }

    pub mod splitter {
        wit_bindgen::generate!({
            path: "wit",
            world: "splitter-policy",
            pub_export_macro: true,
            export_macro_name: "export",
            default_bindings_module: "::perennial_guest::__private::splitter",
            runtime_path: "::perennial_guest::__private::wit_bindgen::rt",
            with: {
                "perennial:policy/types@0.1.0": crate::__private::trigger::perennial::policy::types,
                "perennial:policy/host@0.1.0": crate::__private::trigger::perennial::policy::host,
            },
        });
    }

    pub mod selector {
        wit_bindgen::generate!({
            path: "wit",
            world: "selector-policy",
            pub_export_macro: true,
            export_macro_name: "export",
            default_bindings_module: "::perennial_guest::__private::selector",
            runtime_path: "::perennial_guest::__private::wit_bindgen::rt",
            with: {
                "perennial:policy/types@0.1.0": crate::__private::trigger::perennial::policy::types,
                "perennial:policy/host@0.1.0": crate::__private::trigger::perennial::policy::host,
            },
        });
    }

    pub use trigger::perennial::policy::{host as wit_host, types as wit_types};
}

/// Exports a [`Trigger`] implementation as this component's trigger policy.
///
/// Call it once per crate, at the top level: `perennial_guest::export_trigger!(MyTrigger);`
#[macro_export]
macro_rules! export_trigger {
    ($policy:ty) => {
        // Exports exist only in the component; a native build (tests) has just the type.
        #[cfg(target_arch = "wasm32")]
        type __PerennialTriggerExport = $crate::__private::TriggerExport<$policy>;
        #[cfg(target_arch = "wasm32")]
        $crate::__private::trigger::export!(
            __PerennialTriggerExport with_types_in $crate::__private::trigger
        );
    };
}

/// Exports a [`Splitter`] implementation as this component's splitter policy.
///
/// Call it once per crate, at the top level: `perennial_guest::export_splitter!(MySplitter);`
#[macro_export]
macro_rules! export_splitter {
    ($policy:ty) => {
        // Exports exist only in the component; a native build (tests) has just the type.
        #[cfg(target_arch = "wasm32")]
        type __PerennialSplitterExport = $crate::__private::SplitterExport<$policy>;
        #[cfg(target_arch = "wasm32")]
        $crate::__private::splitter::export!(
            __PerennialSplitterExport with_types_in $crate::__private::splitter
        );
    };
}

/// Exports a [`Selector`] implementation as this component's selector policy.
///
/// Call it once per crate, at the top level: `perennial_guest::export_selector!(MySelector);`
#[macro_export]
macro_rules! export_selector {
    ($policy:ty) => {
        // Exports exist only in the component; a native build (tests) has just the type.
        #[cfg(target_arch = "wasm32")]
        type __PerennialSelectorExport = $crate::__private::SelectorExport<$policy>;
        #[cfg(target_arch = "wasm32")]
        $crate::__private::selector::export!(
            __PerennialSelectorExport with_types_in $crate::__private::selector
        );
    };
}
