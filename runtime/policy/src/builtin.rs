//! The built-in policies, compiled from `plugins/` by the build and embedded in the binary.

include!(concat!(env!("OUT_DIR"), "/plugins.rs"));

/// The component of built-in `name` (none in a build without the compiler, which embeds only
/// their names).
pub fn component(name: &str) -> Option<&'static [u8]> {
    BUILTINS.iter().find(|(builtin, _)| *builtin == name).map(|(_, bytes)| *bytes).filter(|bytes| !bytes.is_empty())
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

#[cfg(test)]
mod tests {
    /// The names a reference may use (checked where no component is at hand, e.g. by the
    /// operator) are exactly the components embedded here.
    #[test]
    fn every_builtin_name_has_its_component() {
        let mut embedded = super::names();
        embedded.sort_unstable();
        let mut named = perennial_types::BUILTIN_POLICIES.to_vec();
        named.sort_unstable();
        assert_eq!(embedded, named);
    }
}
