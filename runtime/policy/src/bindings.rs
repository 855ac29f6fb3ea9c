//! Host bindings of the WIT contract (`wit/policy.wit`), one module per world, sharing the
//! `types` and `host` interfaces.

pub mod trigger_world {
    wasmtime::component::bindgen!({ path: "../../wit", world: "trigger-policy" });
}

pub mod splitter_world {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "splitter-policy",
        with: {
            "perennial:policy/types": super::trigger_world::perennial::policy::types,
            "perennial:policy/host": super::trigger_world::perennial::policy::host,
        },
    });
}

pub mod selector_world {
    wasmtime::component::bindgen!({
        path: "../../wit",
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

/// The three kinds differ only in names; one macro writes their `Kind` impls.
macro_rules! kind {
    ($kind:ident, $name:literal, $world:ident, $pre:ident, $bindings:ident, $exports:ident) => {
        impl Kind for $kind {
            const NAME: &'static str = $name;
            const EXPORT: &'static str = concat!("perennial:policy/", $name, "@0.1.0");
            type Pre = $world::$pre<HostState>;
            type Instance = $world::$bindings;

            fn pre(pre: InstancePre<HostState>) -> wasmtime::Result<Self::Pre> {
                $world::$pre::new(pre)
            }
            fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Self::Instance> {
                pre.instantiate(store)
            }
            fn configure(
                instance: &Self::Instance,
                store: &mut Store<HostState>,
                config: &str,
            ) -> wasmtime::Result<Result<(), String>> {
                instance.$exports().call_configure(store, config)
            }
        }
    };
}

kind!(TriggerKind, "trigger", trigger_world, TriggerPolicyPre, TriggerPolicy, perennial_policy_trigger);
kind!(SplitterKind, "splitter", splitter_world, SplitterPolicyPre, SplitterPolicy, perennial_policy_splitter);
kind!(SelectorKind, "selector", selector_world, SelectorPolicyPre, SelectorPolicy, perennial_policy_selector);
