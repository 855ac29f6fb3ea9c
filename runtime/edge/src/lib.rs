//! The edge agent core: tailing a job's dataset index, splitting new samples through the job's
//! splitter, starting rounds with its trigger, writing round files, deploying what its selector
//! chooses, and taking the workers' reports, all in the edge's SQLite state.
//!
//! The rest of the system meets it through one small interface, the same for the embedded mode
//! and the cloud link:
//!
//! - in: [`register_job`] / [`forget_job`] (job and dataset updates), [`rounds::apply_notice`] (the
//!   stage the control plane moved the job to, with its round), [`worker_api::issue_worker_name`] (a worker the
//!   control plane is about to start);
//! - out: [`report::pending`] / [`report::acknowledge`] (the durable outbox of reports, each
//!   with the job's uid and round), [`report::dataset_updates`] (sample counts for
//!   `Dataset.status`).

pub mod agent;
pub mod decisions;
pub mod faults;
pub mod health;
pub mod index_file;
pub mod ingest;
pub mod jobs;
pub mod lines;
pub mod link_state;
pub mod model_copy;
pub mod output;
pub mod replay;
pub mod report;
pub mod rounds;
pub mod serve;
pub mod shadow;
pub mod sqlite;
pub mod state_lock;
pub mod status_report;
pub mod worker_api;

pub use index_file::{FileStat, IndexFile, LocalFile, S3Index};
pub use ingest::{FileState, IngestError, IngestLimits, Ingested, Split, ingest};
pub use jobs::{BatchRow, DEFAULT_EVAL_SET_SIZE, JobSpec, batches, forget_job, header, job_spec, register_job};
