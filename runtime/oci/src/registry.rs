//! Push and pull a component. Every request has a timeout and the whole operation one more. A
//! pull (and a resolve) is [`crate::pull`]'s own client: every reply it reads is bounded in size,
//! the component by [`Options::max_bytes`]. A push is oci-client's (the author's tool against
//! their own registry). Errors name the reference and what to do; they are built here from what
//! the registry said, never from a credential.

use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::OciImageManifest;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest as _, Sha256};

use crate::credentials::{Credentials, DockerConfig};
use crate::layout::{self, ComponentInfo, WasmConfig};
use crate::pull::Session;
use perennial_types::policy::OciRef;

/// How long connecting to a registry may take, and waiting for any one read.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach a registry.
#[derive(Clone, Debug)]
pub struct Options {
    /// Plain HTTP for a registry that is not on this machine (one on this machine always is).
    pub plain_http: bool,
    /// `None`: anonymous.
    pub credentials: Option<Credentials>,
    /// Where the credentials came from (or would have), for messages: a file's path.
    pub credentials_from: String,
    /// The credential helper the docker config names for the registry (`credsStore`,
    /// `credHelpers`), for messages: helpers are not run.
    pub credential_helper: Option<String>,
    /// The most a component may be.
    pub max_bytes: u64,
    /// The whole push or pull.
    pub timeout: Duration,
}

impl Options {
    /// Credentials for `oci`'s registry from the docker `config.json` ([`DockerConfig`]), if it
    /// has some; anonymous otherwise.
    pub fn from_docker_config(oci: &OciRef, max_bytes: u64, timeout: Duration) -> Result<Options, String> {
        let config = DockerConfig::load_default()?;
        Ok(Options {
            plain_http: false,
            credentials: config.credentials(&oci.registry)?,
            credentials_from: config.path().display().to_string(),
            credential_helper: config.helper(&oci.registry),
            max_bytes,
            timeout,
        })
    }

    /// For a job: with its login for `oci`'s registry (from its `imagePullSecrets`), preferred
    /// over this machine's docker `config.json` (not even read then); else with that file's.
    pub fn for_job(
        oci: &OciRef,
        auth: Option<&perennial_types::RegistryAuth>,
        max_bytes: u64,
        timeout: Duration,
    ) -> Result<Options, String> {
        match auth.and_then(|auth| auth.login(&oci.registry)) {
            Some(login) => Ok(Options {
                credentials: Some(Credentials {
                    username: login.username.clone(),
                    password: login.password.expose().into(),
                }),
                credentials_from: format!("the Secret {} (the job's imagePullSecrets)", login.secret),
                ..Options::anonymous(max_bytes, timeout)
            }),
            None => Options::from_docker_config(oci, max_bytes, timeout),
        }
    }

    /// Anonymous.
    pub fn anonymous(max_bytes: u64, timeout: Duration) -> Options {
        Options {
            plain_http: false,
            credentials: None,
            credentials_from: String::new(),
            credential_helper: None,
            max_bytes,
            timeout,
        }
    }

    fn auth(&self) -> RegistryAuth {
        match &self.credentials {
            Some(creds) => RegistryAuth::Basic(creds.username.clone(), creds.password.clone()),
            None => RegistryAuth::Anonymous,
        }
    }
}

/// Why a push or pull failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The registry could not be reached, timed out or failed (5xx): a copy already held may serve.
    #[error("{0}")]
    Unreachable(String),
    /// The reference names other content than the pin: `actual` is what the registry has.
    #[error(
        "it names a component with sha256 {actual}, but the reference pins sha256 {expected} (did the tag \
         move?); it is not pulled"
    )]
    Moved { expected: String, actual: String },
    /// A reference pinned by its manifest's digest, whose component is not the `sha256:` pin:
    /// the two pins disagree (a manifest named by digest never changes).
    #[error(
        "its manifest holds the component with sha256 {actual}, but the reference pins sha256 {expected}: the \
         two pins disagree (a manifest named by digest never changes); it is not pulled"
    )]
    PinsDisagree { expected: String, actual: String },
    /// The registry refused access (401, 403): no credentials, or not the right ones.
    #[error("{0}")]
    Denied(String),
    /// Anything else: refused, absent, not a Wasm artifact, too large.
    #[error("{0}")]
    Refused(String),
}

/// The manifest a reference resolves to, and its component layer.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// `sha256:HEX`.
    pub manifest_digest: String,
    /// Hex SHA-256 of the component (the layer's digest).
    pub component_sha256: String,
    /// The component's size as the manifest declares it.
    pub component_size: u64,
}

/// A pulled component, verified against its layer digest (and the manifest's, when pinned).
#[derive(Clone, Debug)]
pub struct Pulled {
    pub bytes: Vec<u8>,
    pub manifest_digest: String,
    pub component_sha256: String,
}

/// A pushed component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pushed {
    /// `sha256:HEX`: pin the reference with `@` it.
    pub manifest_digest: String,
    /// Hex SHA-256 of the component: the reference's `sha256:`.
    pub component_sha256: String,
}

fn reference(oci: &OciRef) -> Reference {
    let (registry, repository) = (oci.registry.clone(), oci.repository.clone());
    match (&oci.tag, &oci.digest) {
        (Some(tag), Some(digest)) => Reference::with_tag_and_digest(registry, repository, tag.clone(), digest.clone()),
        (None, Some(digest)) => Reference::with_digest(registry, repository, digest.clone()),
        (Some(tag), None) => Reference::with_tag(registry, repository, tag.clone()),
        (None, None) => Reference::with_tag(registry, repository, "latest".into()),
    }
}

fn client(oci: &OciRef, options: &Options) -> Result<Client, RegistryError> {
    perennial_tls::install_crypto_provider();
    let protocol = if options.plain_http || oci.is_loopback() { ClientProtocol::Http } else { ClientProtocol::Https };
    let config = ClientConfig {
        protocol,
        connect_timeout: Some(CONNECT_TIMEOUT),
        read_timeout: Some(READ_TIMEOUT),
        user_agent: concat!("perennial/", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    };
    Client::try_from(config).map_err(|err| RegistryError::Refused(format!("no HTTP client for {oci}: {err}")))
}

/// What went wrong, said for `oci`: `Unreachable` when a copy held may serve instead.
fn explain(oci: &OciRef, options: &Options, err: &OciDistributionError) -> RegistryError {
    let registry = &oci.registry;
    match err {
        OciDistributionError::RequestError(err) => unanswered(registry, err),
        OciDistributionError::ServerError { code, .. } if *code >= 500 => {
            RegistryError::Unreachable(format!("the registry {registry} failed (HTTP {code})"))
        }
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_)
        | OciDistributionError::ServerError { code: 401 | 403, .. } => denied(oci, options),
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes: Vec<String> = envelope.errors.iter().map(|e| format!("{:?}: {}", e.code, e.message)).collect();
            let denied = envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    oci_client::errors::OciErrorCode::Unauthorized | oci_client::errors::OciErrorCode::Denied
                )
            });
            if denied {
                return explain(
                    oci,
                    options,
                    &OciDistributionError::ServerError { code: 401, url: String::new(), message: String::new() },
                );
            }
            let unknown = envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    oci_client::errors::OciErrorCode::ManifestUnknown
                        | oci_client::errors::OciErrorCode::NameUnknown
                        | oci_client::errors::OciErrorCode::BlobUnknown
                )
            });
            if unknown {
                RegistryError::Refused(format!("{oci} is not in the registry ({})", codes.join("; ")))
            } else {
                RegistryError::Refused(format!("the registry {registry} refused {oci}: {}", codes.join("; ")))
            }
        }
        OciDistributionError::ServerError { code, .. } => {
            RegistryError::Refused(format!("the registry {registry} answered HTTP {code} for {oci}"))
        }
        OciDistributionError::DigestError(err) => {
            RegistryError::Refused(format!("{oci}: what the registry sent does not match its digest ({err})"))
        }
        other => RegistryError::Refused(format!("{oci}: {other}")),
    }
}

/// The registry refused access: said with where credentials were looked for, and the user's
/// name if some were sent (never the password).
pub(crate) fn denied(oci: &OciRef, options: &Options) -> RegistryError {
    let (registry, repository) = (&oci.registry, &oci.repository);
    let from = shown(&options.credentials_from);
    RegistryError::Denied(match (&options.credentials, &options.credential_helper) {
        (None, None) => format!(
            "the registry {registry} refused access to the repository {repository}: it is private (or absent), \
             and {from} has no credentials for {registry} (`docker login {registry}` writes them)"
        ),
        (None, Some(helper)) => format!(
            "the registry {registry} refused access to the repository {repository}: it is private (or absent), \
             and {from} has no credentials for {registry}: it names the credential helper {helper:?} \
             (credsStore/credHelpers), and credential helpers are not supported: write the registry's `auths` \
             entry (`podman login --authfile {from} {registry}` does)"
        ),
        (Some(creds), _) => format!(
            "the registry {registry} refused the credentials of user {:?} (from {from}) for the repository \
             {repository}",
            creds.username
        ),
    })
}

pub(crate) fn shown(path: &str) -> &str {
    if path.is_empty() { "no docker config.json" } else { path }
}

/// A request to `registry` that got no answer (a timeout, no connection, a broken one):
/// `Unreachable`, so that a copy held may serve instead.
pub(crate) fn unanswered(registry: &str, err: &reqwest::Error) -> RegistryError {
    let what = if err.is_timeout() {
        "timed out".to_owned()
    } else if err.is_connect() {
        format!("cannot be reached ({})", cause(err))
    } else {
        cause(err)
    };
    RegistryError::Unreachable(format!("the registry {registry} {what}"))
}

/// An error and its causes on one line (reqwest's own says only "error sending request").
pub(crate) fn cause(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(next) = source {
        text.push_str(": ");
        text.push_str(&next.to_string());
        source = next.source();
    }
    text
}

async fn bounded<T>(
    oci: &OciRef,
    options: &Options,
    work: impl std::future::Future<Output = Result<T, RegistryError>>,
) -> Result<T, RegistryError> {
    match tokio::time::timeout(options.timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(RegistryError::Unreachable(format!(
            "the registry {} did not finish within {} s for {oci}",
            oci.registry,
            options.timeout.as_secs()
        ))),
    }
}

/// The manifest `oci` names and its component layer; refuses what is not a Wasm artifact.
pub async fn resolve(oci: &OciRef, options: &Options) -> Result<Resolved, RegistryError> {
    let mut session = Session::new(oci, options)?;
    bounded(oci, options, resolve_with(&mut session, oci)).await
}

#[derive(serde::Deserialize)]
struct Manifest {
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Vec<Descriptor>,
    /// An index's (a multi-platform image's), not an artifact's.
    #[serde(default)]
    manifests: Option<serde_json::Value>,
}

#[derive(serde::Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    #[serde(default)]
    digest: String,
    #[serde(default)]
    size: i64,
}

async fn resolve_with(session: &mut Session<'_>, oci: &OciRef) -> Result<Resolved, RegistryError> {
    let bytes = session.manifest().await?;
    let manifest_digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    if let Some(pinned) = &oci.digest
        && *pinned != manifest_digest
    {
        return Err(RegistryError::Refused(format!(
            "{oci}: what the registry sent as the manifest has digest {manifest_digest}, not the one pinned"
        )));
    }
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|err| {
        RegistryError::Refused(format!(
            "{oci}: what the registry sent is not an OCI image manifest (line {}, column {})",
            err.line(),
            err.column()
        ))
    })?;
    if manifest.manifests.is_some() {
        return Err(RegistryError::Refused(format!(
            "{oci} is an image index (several platforms' manifests), not a Wasm component artifact"
        )));
    }
    let layers: Vec<&Descriptor> = manifest.layers.iter().filter(|l| layout::is_wasm_layer(&l.media_type)).collect();
    let config_type = manifest.config.as_ref().map_or("none", |c| c.media_type.as_str());
    let [layer] = layers.as_slice() else {
        let types: Vec<String> = manifest.layers.iter().take(10).map(|l| format!("{:?}", l.media_type)).collect();
        return Err(RegistryError::Refused(format!(
            "{oci} is not a Wasm component artifact: it needs one layer of type {} (config {}); it has {} \
             (config {config_type:?})",
            layout::LAYER_MEDIA_TYPE,
            layout::CONFIG_MEDIA_TYPE,
            if types.is_empty() { "no layers".to_owned() } else { types.join(", ") },
        )));
    };
    let component_sha256 = layer
        .digest
        .strip_prefix("sha256:")
        .filter(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| {
            let digest: String = layer.digest.chars().take(80).collect();
            RegistryError::Refused(format!("{oci}: its layer's digest {digest:?} is not sha256"))
        })?
        .to_ascii_lowercase();
    let component_size = u64::try_from(layer.size)
        .map_err(|_| RegistryError::Refused(format!("{oci}: its layer's size {} is not a size", layer.size)))?;
    Ok(Resolved { manifest_digest, component_sha256, component_size })
}

/// Pulls the component `oci` names: when `expected` (hex SHA-256) is given, refuses other
/// content before reading it ([`RegistryError::Moved`]; [`RegistryError::PinsDisagree`] when the
/// reference is pinned by its manifest's digest too).
pub async fn pull(oci: &OciRef, expected: Option<&str>, options: &Options) -> Result<Pulled, RegistryError> {
    let mut session = Session::new(oci, options)?;
    bounded(oci, options, async {
        let resolved = resolve_with(&mut session, oci).await?;
        if let Some(expected) = expected
            && !expected.eq_ignore_ascii_case(&resolved.component_sha256)
        {
            let (expected, actual) = (expected.to_ascii_lowercase(), resolved.component_sha256);
            return Err(if oci.digest.is_some() {
                RegistryError::PinsDisagree { expected, actual }
            } else {
                RegistryError::Moved { expected, actual }
            });
        }
        let size = resolved.component_size;
        if size > options.max_bytes {
            return Err(RegistryError::Refused(format!(
                "{oci}: the component is {size} bytes, more than the {} a policy may be",
                options.max_bytes
            )));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        let mut hasher = Sha256::new();
        session
            .blob(&format!("sha256:{}", resolved.component_sha256), options.max_bytes, |chunk| {
                hasher.update(chunk);
                bytes.extend_from_slice(chunk);
            })
            .await?;
        let actual = hex::encode(hasher.finalize());
        if actual != resolved.component_sha256 {
            return Err(RegistryError::Refused(format!(
                "{oci}: the component read has sha256 {actual}, not its layer's {}",
                resolved.component_sha256
            )));
        }
        Ok(Pulled { bytes, manifest_digest: resolved.manifest_digest, component_sha256: actual })
    })
    .await
}

/// Pushes `component` to `oci` (its tag) in the Wasm OCI layout; `info` goes in the config.
pub async fn push(
    oci: &OciRef,
    component: Vec<u8>,
    info: ComponentInfo,
    options: &Options,
) -> Result<Pushed, RegistryError> {
    if oci.digest.is_some() {
        return Err(RegistryError::Refused(format!("{oci}: push to a tag (oci://HOST/REPO:TAG), not a digest")));
    }
    let client = client(oci, options)?;
    let image = reference(oci);
    let component_sha256 = hex::encode(Sha256::digest(&component));
    let config = WasmConfig::component(format!("sha256:{component_sha256}"), info);
    let config = Config {
        data: serde_json::to_vec(&config).map_err(|err| RegistryError::Refused(err.to_string()))?.into(),
        media_type: layout::CONFIG_MEDIA_TYPE.into(),
        annotations: None,
    };
    let layers =
        [ImageLayer { data: component.into(), media_type: layout::LAYER_MEDIA_TYPE.into(), annotations: None }];
    let manifest = OciImageManifest::build(&layers, &config, None);
    let manifest_bytes = serde_json::to_vec(&manifest).map_err(|err| RegistryError::Refused(err.to_string()))?;
    let manifest_digest = format!("sha256:{}", hex::encode(Sha256::digest(&manifest_bytes)));
    bounded(oci, options, async {
        client
            .push(&image, &layers, config, &options.auth(), Some(manifest))
            .await
            .map_err(|err| explain(oci, options, &err))?;
        // What the registry now serves under the tag: the digest to pin.
        let served = client
            .fetch_manifest_digest(&image, &options.auth())
            .await
            .map_err(|err| explain(oci, options, &err))?;
        if served != manifest_digest {
            tracing::debug!(%served, computed = %manifest_digest, "the registry serves the manifest under another digest");
        }
        Ok(Pushed { manifest_digest: served, component_sha256 })
    })
    .await
}
