//! Worker launchers: what a stage's worker is started with (Sedna's env, from the stage
//! machine's [`WorkerSpec`](perennial_lifecycle::WorkerSpec)), and the local-process launcher of
//! the embedded mode. (Pods come with the operator.)

pub mod env;
pub mod local;
pub mod pod;
pub mod probe;
pub mod reaper;
pub mod template;

pub use env::{WorkerContext, sedna_env};
pub use local::{LocalWorkers, ProcessSpec, RestartPolicy};
pub use probe::Readiness;
pub use reaper::Reaper;
pub use template::{LocalCommand, expand, local_command};
