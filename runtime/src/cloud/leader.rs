//! Leader election: being written.
