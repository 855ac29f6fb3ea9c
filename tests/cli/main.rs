//! The integration tests of this crate, one binary (each module was its own binary before).

mod support;

mod decisions;
mod deploy_env;
mod edge_crash;
mod edge_jobs;
mod edge_link;
mod embedded_crash;
mod embedded_run;
mod fetch;
mod getting_started;
mod hostile;
mod oci;
mod plugin;
mod plugin_authors;
mod plugin_metadata;
mod plugin_swap;
mod precompiled;
mod state_faults;
