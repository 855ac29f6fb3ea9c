//! The policy host: runs a job's decisions (trigger, splitter, selector) as sandboxed
//! WebAssembly components behind the WIT contract in `wit/policy.wit`.
//!
//! - [`PolicyRef`]: which plugin, its digest, config, limits and error handling.
//! - [`PolicyHost::load`]: fetch (through OpenDAL), verify the SHA-256, compile once per digest
//!   (in memory and in an on-disk cache), pre-link, instantiate and configure.
//! - [`Policy`]: the calls, each under an epoch deadline and a memory cap; a trap, a timeout or
//!   a bad answer is an error for that call only, and the next call gets a fresh instance.
//! - [`PolicySlot`]: hot swap between two calls.

mod bindings;
pub mod builtin;
mod cache;
#[cfg(feature = "compiler")]
pub mod compiler;
mod engine;
mod error;
mod instance;
pub mod oci;
pub mod platform;
#[cfg(feature = "compiler")]
pub mod precompile;
mod reference {
    //! The policy reference lives with the words both halves share (the operator validates it too).
    pub use perennial_types::policy::*;
}
mod sandbox;
mod slot;
mod types;

pub use perennial_artifact::{artifact, signing};

pub use bindings::{Kind, SelectorKind, SplitterKind, TriggerKind};
pub use cache::default_dir as default_cache_dir;
pub use engine::{
    ArtifactFetch, COMPONENT_READ, CompileMode, EPOCH_TICK, HAS_COMPILER, Inspection, PolicyHost, engine,
    exported_interfaces, lower_this_threads_priority, release_freed_memory, set_compile_mode,
};
pub use error::{LoadError, PolicyError, Step};
pub use instance::{Policy, PolicyInfo, SelectorPolicy, SplitterPolicy, TriggerPolicy};
pub use reference::{BUILTIN_POLICIES, Limits, OnError, PolicyRef, Source, ValidRef, parse_source};
pub use sandbox::{Level, PolicyEvents, TracingEvents};
pub use slot::PolicySlot;
pub use types::{Assignment, Assignments, BatchFull, Choice, Decision, Metrics, ModelInfo, SampleBatch, TriggerStats};
