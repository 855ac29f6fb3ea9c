//! Host bindings of the WIT contract (`wit/policy.wit`), one module per world, sharing the
//! `types` and `host` interfaces.

pub mod trigger_world {
    wasmtime::component::bindgen!({ path: "../wit", world: "trigger-policy" });
}

pub mod splitter_world {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "splitter-policy",
        with: {
            "perennial:policy/types": super::trigger_world::perennial::policy::types,
            "perennial:policy/host": super::trigger_world::perennial::policy::host,
        },
    });
}

pub mod selector_world {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "selector-policy",
        with: {
            "perennial:policy/types": super::trigger_world::perennial::policy::types,
            "perennial:policy/host": super::trigger_world::perennial::policy::host,
        },
    });
}

pub use selector_world::exports::perennial::policy::selector;
pub use splitter_world::exports::perennial::policy::splitter;
pub use splitter_world::perennial::policy::batch_data;
pub use trigger_world::exports::perennial::policy::trigger;
pub use trigger_world::perennial::policy::{host, types};

use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::sandbox::HostState;

/// One kind of policy: its world, and how to instantiate and configure it.
pub trait Kind: Send + Sync + 'static {
    /// `trigger`, `splitter` or `selector`.
    const NAME: &'static str;
    /// The exported interface that marks a component as this kind.
    const EXPORT: &'static str;
    type Pre: Clone + Send + Sync + 'static;
    type Instance: Send + 'static;

    fn pre(pre: InstancePre<HostState>) -> wasmtime::Result<Self::Pre>;
    fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Self::Instance>;
    fn configure(
        instance: &Self::Instance,
        store: &mut Store<HostState>,
        config: &str,
    ) -> wasmtime::Result<Result<(), String>>;
}

pub enum TriggerKind {}
pub enum SplitterKind {}
pub enum SelectorKind {}

impl Kind for TriggerKind {
    const NAME: &'static str = "trigger";
    const EXPORT: &'static str = "perennial:policy/trigger@0.1.0";
    type Pre = trigger_world::TriggerPolicyPre<HostState>;
    type Instance = trigger_world::TriggerPolicy;

    fn pre(pre: InstancePre<HostState>) -> wasmtime::Result<Self::Pre> {
        trigger_world::TriggerPolicyPre::new(pre)
    }
    fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Self::Instance> {
        pre.instantiate(store)
    }
    fn configure(
        i: &Self::Instance,
        store: &mut Store<HostState>,
        config: &str,
    ) -> wasmtime::Result<Result<(), String>> {
        i.perennial_policy_trigger().call_configure(store, config)
    }
}

impl Kind for SplitterKind {
    const NAME: &'static str = "splitter";
    const EXPORT: &'static str = "perennial:policy/splitter@0.1.0";
    type Pre = splitter_world::SplitterPolicyPre<HostState>;
    type Instance = splitter_world::SplitterPolicy;

    fn pre(pre: InstancePre<HostState>) -> wasmtime::Result<Self::Pre> {
        splitter_world::SplitterPolicyPre::new(pre)
    }
    fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Self::Instance> {
        pre.instantiate(store)
    }
    fn configure(
        i: &Self::Instance,
        store: &mut Store<HostState>,
        config: &str,
    ) -> wasmtime::Result<Result<(), String>> {
        i.perennial_policy_splitter().call_configure(store, config)
    }
}

impl Kind for SelectorKind {
    const NAME: &'static str = "selector";
    const EXPORT: &'static str = "perennial:policy/selector@0.1.0";
    type Pre = selector_world::SelectorPolicyPre<HostState>;
    type Instance = selector_world::SelectorPolicy;

    fn pre(pre: InstancePre<HostState>) -> wasmtime::Result<Self::Pre> {
        selector_world::SelectorPolicyPre::new(pre)
    }
    fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Self::Instance> {
        pre.instantiate(store)
    }
    fn configure(
        i: &Self::Instance,
        store: &mut Store<HostState>,
        config: &str,
    ) -> wasmtime::Result<Result<(), String>> {
        i.perennial_policy_selector().call_configure(store, config)
    }
}
