//! Perennial: lifelong learning jobs at the edge.
//!
//! This crate is the host side of the system: the policy host that runs the jobs' WebAssembly
//! policies ([`policy`]), storage access through OpenDAL ([`storage`]), the edge's SQLite state
//! ([`store`]) and the edge agent core ([`edge`]).

pub mod api;
#[cfg(feature = "cloud")]
pub mod cloud;
pub mod edge;
pub mod embedded;
pub mod lifecycle;
pub mod link;
pub mod policy;
pub mod state_lock;
pub mod storage;
pub mod store;
pub mod tls;
pub mod workers;
