//! Hot swap. A slot holds the policy that serves a job's decision. A new policy is loaded
//! beside it (`PolicyHost::load`: fetch, verify, compile, instantiate, configure) and, only if
//! all of that succeeded, `commit` replaces the old one between two calls. A call takes the
//! current policy once, so it runs wholly on the old or wholly on the new one; calls already
//! running finish on the old one.

use std::sync::{Arc, RwLock};

use super::bindings::Kind;
use super::instance::Policy;

pub struct PolicySlot<K: Kind> {
    current: RwLock<Arc<Policy<K>>>,
}

impl<K: Kind> PolicySlot<K> {
    pub fn new(policy: Policy<K>) -> Self {
        PolicySlot { current: RwLock::new(Arc::new(policy)) }
    }

    /// The policy serving now. Use it for one call.
    pub fn current(&self) -> Arc<Policy<K>> {
        self.current.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Makes `next` the serving policy; returns the one it replaced.
    pub fn commit(&self, next: Policy<K>) -> Arc<Policy<K>> {
        let next = Arc::new(next);
        let mut current = self.current.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        std::mem::replace(&mut *current, next)
    }
}
