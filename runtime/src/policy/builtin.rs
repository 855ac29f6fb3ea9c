//! The built-in policies, compiled from `plugins/` by the build and embedded in the binary.

include!(concat!(env!("OUT_DIR"), "/plugins.rs"));

/// The component of built-in `name`.
pub fn component(name: &str) -> Option<&'static [u8]> {
    BUILTINS.iter().find(|(builtin, _)| *builtin == name).map(|(_, bytes)| *bytes)
}

/// Names of the built-ins, for error messages and listings.
pub fn names() -> Vec<&'static str> {
    BUILTINS.iter().map(|(name, _)| *name).collect()
}

/// Path of any plugin built from `plugins/` (built-ins, the example, the test plugins), by
/// crate name. For tests and benchmarks.
pub fn built_plugin_path(crate_name: &str) -> Option<&'static str> {
    ALL_PLUGINS.iter().find(|(name, _)| *name == crate_name).map(|(_, path)| *path)
}
