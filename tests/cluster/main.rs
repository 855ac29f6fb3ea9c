//! The cluster half against a real Kubernetes API server (`PERENNIAL_TEST_KUBECONFIG`): the
//! CRDs and `deploy/operator` applied with kubectl, `perennial operator` run as its
//! ServiceAccount, a linked `perennial edge`, whole rounds with the test playing the kubelet and
//! the workers, leader failover, deletion. `scripts/test` finds or starts an API server for it
//! (the docs' Contributing page says how, and how to use any cluster). Without a cluster the suite fails: it is never
//! skipped in silence.

// The fleet simulator, as the fleet bench runs it, and what it reads of the processes.
#[allow(dead_code)]
#[path = "../support/fleet.rs"]
mod fleet_sim;
#[allow(dead_code)]
#[path = "../support/measure.rs"]
mod measure;
// The rcgen CA of the link tests (its test cloud is not used here).
#[allow(dead_code)]
#[path = "../support/link.rs"]
mod link_support;
// Its moments only (the heavy tests' turn is the cli suite's).
#[allow(dead_code)]
#[path = "../support/moments.rs"]
mod moments;
#[path = "../support/registry.rs"]
mod registry;
#[path = "../support/sedna_worker.rs"]
mod sedna_worker;
#[path = "../support/service_account.rs"]
mod service_account;

mod absent;
mod artifacts;
mod failover;
mod fleet;
mod flood;
mod harness;
mod helm;
mod identity;
mod install;
mod oci;
mod pull_secrets;
mod rbac;
mod restart;
mod rollout;
mod rounds;
mod stack;
mod vanished;
mod walkthrough;
