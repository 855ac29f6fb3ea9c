//! Perennial: lifelong learning jobs at the edge.
//!
//! This crate is the host side of the system: the policy host that runs the jobs' WebAssembly
//! policies ([`policy`]) and storage access through OpenDAL ([`storage`]).

pub mod policy;
pub mod storage;
