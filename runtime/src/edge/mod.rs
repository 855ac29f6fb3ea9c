//! The edge agent core: tailing a job's dataset index, splitting new samples through the
//! job's splitter, and keeping it all in the edge's SQLite state.

pub mod agent;
pub mod index_file;
pub mod ingest;
pub mod jobs;
pub mod lines;
pub mod output;
pub mod report;
pub mod rounds;
pub mod worker_api;

pub use index_file::{FileStat, IndexFile, LocalFile, S3Index};
pub use ingest::{FileState, IngestError, IngestLimits, Ingested, Split, ingest};
pub use jobs::{BatchRow, JobSpec, batches, forget_job, header, job_spec, register_job};
