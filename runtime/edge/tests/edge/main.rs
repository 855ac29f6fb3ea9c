//! The integration tests of this crate, one binary (each module was its own binary before).

mod support;

mod ingest;
mod link_shells;
mod rounds;
mod s3_index;
mod worker_api;
