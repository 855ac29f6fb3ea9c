//! The integration tests of this crate, one binary (each module was its own binary before).

mod support;

mod fetch;
mod host;
mod sedna_trigger;
