//! The CNCF Wasm OCI artifact layout (tag-security's "Wasm OCI Artifact layout", as
//! bytecodealliance's `oci-wasm` writes it): a manifest whose config has media type
//! [`CONFIG_MEDIA_TYPE`] and whose one layer is the component, [`LAYER_MEDIA_TYPE`].

use serde::{Deserialize, Serialize};

/// The config's media type.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The component layer's media type.
pub const LAYER_MEDIA_TYPE: &str = "application/wasm";
/// What the older `wasm-to-oci` tool named its layer; pulled too.
pub const LEGACY_LAYER_MEDIA_TYPE: &str = "application/vnd.wasm.content.layer.v1+wasm";

/// The artifact's config.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WasmConfig {
    /// RFC 3339.
    pub created: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// Always `wasm`.
    pub architecture: String,
    /// `wasip2` for a component.
    pub os: String,
    /// The layers' digests (`sha256:HEX`), in the manifest's order.
    pub layer_digests: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<ComponentInfo>,
}

/// What a component exports and imports (interface names).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ComponentInfo {
    pub exports: Vec<String>,
    pub imports: Vec<String>,
    #[serde(default)]
    pub target: Option<String>,
}

impl WasmConfig {
    /// The config of a component whose layer has `layer_digest` (`sha256:HEX`).
    pub fn component(layer_digest: String, component: ComponentInfo) -> Self {
        WasmConfig {
            created: jiff::Timestamp::now().to_string(),
            author: None,
            architecture: "wasm".into(),
            os: "wasip2".into(),
            layer_digests: vec![layer_digest],
            component: Some(component),
        }
    }
}

/// Whether a layer of this media type is a Wasm component.
pub fn is_wasm_layer(media_type: &str) -> bool {
    media_type == LAYER_MEDIA_TYPE || media_type == LEGACY_LAYER_MEDIA_TYPE
}
