//! A registry's credentials from a docker `config.json` (`$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json`): `auths.<registry>.auth` (base64 of `user:password`) or its
//! `username` and `password`. Credential helpers (`credsStore`, `credHelpers`) are not run.

use std::path::{Path, PathBuf};

use perennial_types::docker_auths::{Auths, EntryError, registry_of};
use serde::Deserialize;

/// A user and password for one registry. Its `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("username", &self.username).field("password", &"<hidden>").finish()
    }
}

#[derive(Default, Deserialize)]
struct ConfigFile {
    #[serde(default)]
    auths: Auths,
    /// The credential helper for every registry (`docker-credential-NAME`): not run.
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    /// Each registry's credential helper: not run.
    #[serde(default, rename = "credHelpers")]
    cred_helpers: std::collections::BTreeMap<String, String>,
}

/// A docker `config.json`, read (or found absent).
pub struct DockerConfig {
    path: PathBuf,
    file: ConfigFile,
}

impl DockerConfig {
    /// Where docker keeps it: `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
    pub fn default_path() -> Option<PathBuf> {
        match std::env::var_os("DOCKER_CONFIG").filter(|dir| !dir.is_empty()) {
            Some(dir) => Some(Path::new(&dir).join("config.json")),
            None => std::env::var_os("HOME").map(|home| Path::new(&home).join(".docker").join("config.json")),
        }
    }

    /// The file at [`DockerConfig::default_path`]; none there is no credentials, not an error.
    pub fn load_default() -> Result<DockerConfig, String> {
        match DockerConfig::default_path() {
            Some(path) => DockerConfig::load(&path),
            None => Ok(DockerConfig { path: PathBuf::from("~/.docker/config.json"), file: ConfigFile::default() }),
        }
    }

    /// The file at `path`; none there is no credentials, not an error. The error names the file
    /// and what is wrong with it, never its content.
    pub fn load(path: &Path) -> Result<DockerConfig, String> {
        let file = match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|err| {
                // serde's message may quote the text it could not read: say only where.
                format!("{}: not a docker config.json (line {}, column {})", path.display(), err.line(), err.column())
            })?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => ConfigFile::default(),
            Err(err) => return Err(format!("{}: {err}", path.display())),
        };
        Ok(DockerConfig { path: path.to_owned(), file })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The credentials for `registry` (`HOST[:PORT]`), if the file has some. The key may be the
    /// registry as is, or a URL of it (`https://HOST/v1/`, as `docker login` writes Docker Hub's).
    pub fn credentials(&self, registry: &str) -> Result<Option<Credentials>, String> {
        let Some(entry) = self.file.auths.entry(registry) else { return Ok(None) };
        match entry.user_and_password() {
            Ok((username, password)) => Ok(Some(Credentials { username, password })),
            // An entry with neither (docker's own, when a helper holds the login): none here.
            Err(EntryError::NoLogin) => Ok(None),
            Err(err) => Err(format!("{}: auths.{registry} {err}", self.path.display())),
        }
    }
}

impl DockerConfig {
    /// The credential helper the file names for `registry` (`credHelpers`, else `credsStore`),
    /// which is not run: for messages.
    pub fn helper(&self, registry: &str) -> Option<String> {
        let named = self.file.cred_helpers.iter().find(|(key, _)| registry_of(key) == registry).map(|(_, name)| name);
        named.or(self.file.creds_store.as_ref()).filter(|name| !name.is_empty()).cloned()
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    use super::*;

    fn config(json: &str) -> DockerConfig {
        let dir = std::env::temp_dir().join(format!("perennial-oci-creds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.json", json.len()));
        std::fs::write(&path, json).unwrap();
        DockerConfig::load(&path).unwrap()
    }

    #[test]
    fn credentials_by_registry() {
        let auth = base64::engine::general_purpose::STANDARD.encode("ann:s3cret:with-colon");
        let file = config(&format!(
            r#"{{"auths": {{"127.0.0.1:5000": {{"auth": "{auth}"}}, "https://index.docker.io/v1/": {{"username": "bo", "password": "pw"}}}}}}"#
        ));
        let creds = file.credentials("127.0.0.1:5000").unwrap().unwrap();
        assert_eq!((creds.username.as_str(), creds.password.as_str()), ("ann", "s3cret:with-colon"));
        assert!(!format!("{creds:?}").contains("s3cret"), "Debug hides the password");
        assert_eq!(file.credentials("index.docker.io").unwrap().unwrap().username, "bo");
        assert_eq!(file.credentials("ghcr.io").unwrap(), None);
        assert_eq!(file.helper("ghcr.io"), None);
    }

    #[test]
    fn credential_helpers_are_named() {
        let file = config(r#"{"credsStore": "desktop", "credHelpers": {"ghcr.io": "gh"}, "auths": {}}"#);
        assert_eq!(file.helper("ghcr.io").as_deref(), Some("gh"));
        assert_eq!(file.helper("127.0.0.1:5000").as_deref(), Some("desktop"));
    }

    #[test]
    fn a_bad_file_is_named_and_not_quoted() {
        let dir = std::env::temp_dir().join(format!("perennial-oci-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(&path, r#"{"auths": {"h": {"auth": "c2VjcmV0"} "#).unwrap();
        let err = DockerConfig::load(&path).err().unwrap();
        assert!(err.contains("not a docker config.json") && !err.contains("c2VjcmV0"), "{err}");
        let err = config(r#"{"auths": {"h": {"auth": "!!"}}}"#).credentials("h").unwrap_err();
        assert!(err.ends_with("auths.h has an auth that is not base64"), "{err}");
        assert!(DockerConfig::load(&dir.join("absent.json")).unwrap().credentials("h").unwrap().is_none());
    }
}
