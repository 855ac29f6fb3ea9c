//! The operator: the kube controller over the stage machine.

pub mod leader;
