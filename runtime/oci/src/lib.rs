//! Policies as OCI artifacts: Wasm components pushed to and pulled from any OCI registry in the
//! CNCF Wasm OCI artifact layout (what `wkg`, Spin and wasmCloud push and pull), with
//! credentials from a docker `config.json`.
//!
//! - [`layout`]: the artifact's media types and its config.
//! - [`credentials`]: a registry's user and password from a docker `config.json`.
//! - [`pull`]: the pull path's own registry client, every reply read with a size bound.
//! - [`registry`]: push and pull, bounded in size and time, with errors that say what to do and
//!   never carry a credential.

pub mod credentials;
pub mod layout;
pub mod pull;
pub mod registry;

pub use credentials::{Credentials, DockerConfig};
pub use perennial_types::policy::OciRef;
pub use registry::{Options, Pulled, Pushed, RegistryError, Resolved, pull, push, resolve};
