//! What several test binaries share (tests/support/), each using part of it.

#[path = "../support/embedded.rs"]
pub mod embedded;
#[path = "../support/link.rs"]
pub mod link;
#[path = "../support/many_jobs.rs"]
pub mod many_jobs;
#[path = "../support/moments.rs"]
pub mod moments;
#[path = "../support/plugin_projects.rs"]
pub mod plugin_projects;
#[path = "../support/registry.rs"]
pub mod registry;
#[path = "../support/s3.rs"]
pub mod s3;
