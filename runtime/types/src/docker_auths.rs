//! The `auths` of a docker `config.json` (or of a `.dockercfg`, which is that map alone): each
//! registry's login, as `docker login` and `kubectl create secret docker-registry` write it. One
//! reader for the local docker config (`perennial-oci`) and the pull Secrets the operator reads.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Deserialize;

/// The `auths` map: logins by registry key (`HOST[:PORT]`, or a URL of it).
#[derive(Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct Auths(BTreeMap<String, AuthEntry>);

/// One registry's entry: `auth` (base64 of `user:password`), or `username` and `password`.
#[derive(Clone, Default, Deserialize)]
pub struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// What is wrong with an entry (said after where it is; never its content).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("has an auth that is not base64")]
    NotBase64,
    #[error("has an auth that is not UTF-8")]
    NotUtf8,
    #[error("has an auth that is not base64 of user:password")]
    NotUserPassword,
    #[error("has neither an auth nor a username and password")]
    NoLogin,
}

/// The whole file's `{"auths": ...}` (other keys ignored).
#[derive(Deserialize)]
struct ConfigJson {
    #[serde(default)]
    auths: Auths,
}

impl Auths {
    /// The `auths` of a docker `config.json`'s bytes. serde's error may quote the text: say only
    /// its line and column.
    pub fn of_config_json(bytes: &[u8]) -> Result<Auths, serde_json::Error> {
        serde_json::from_slice::<ConfigJson>(bytes).map(|config| config.auths)
    }

    /// A `.dockercfg`'s bytes (the map alone).
    pub fn of_dockercfg(bytes: &[u8]) -> Result<Auths, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The first entry for `registry` (`HOST[:PORT]`): its key as is, or a URL of it
    /// (`https://HOST/v1/`, as `docker login` writes Docker Hub's).
    pub fn entry(&self, registry: &str) -> Option<&AuthEntry> {
        self.0.iter().find(|(key, _)| registry_of(key) == registry).map(|(_, entry)| entry)
    }

    /// The registries the map has entries for, each once.
    pub fn registries(&self) -> std::collections::BTreeSet<&str> {
        self.0.keys().map(|key| registry_of(key)).collect()
    }
}

impl AuthEntry {
    /// The user and password: `auth` if set, else `username` and `password`.
    pub fn user_and_password(&self) -> Result<(String, String), EntryError> {
        if let Some(auth) = self.auth.as_deref().filter(|auth| !auth.is_empty()) {
            let decoded =
                base64::engine::general_purpose::STANDARD.decode(auth.trim()).map_err(|_| EntryError::NotBase64)?;
            let text = String::from_utf8(decoded).map_err(|_| EntryError::NotUtf8)?;
            let (user, password) = text.split_once(':').ok_or(EntryError::NotUserPassword)?;
            return Ok((user.to_owned(), password.to_owned()));
        }
        match (&self.username, &self.password) {
            (Some(user), Some(password)) => Ok((user.clone(), password.clone())),
            _ => Err(EntryError::NoLogin),
        }
    }
}

/// `HOST[:PORT]` of an `auths` key: the key itself, or the host of a URL.
pub fn registry_of(key: &str) -> &str {
    let key = key.split_once("://").map_or(key, |(_, rest)| rest);
    key.split('/').next().unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logins_by_registry_from_auth_or_user_and_password() {
        let auth = base64::engine::general_purpose::STANDARD.encode("ann:s3cret:with-colon");
        let json = format!(
            r#"{{"auths": {{"127.0.0.1:5000": {{"auth": "{auth}"}}, "https://index.docker.io/v1/": {{"username": "bo", "password": "pw"}}}}, "credsStore": "x"}}"#
        );
        let auths = Auths::of_config_json(json.as_bytes()).expect("a config");
        let login = auths.entry("127.0.0.1:5000").expect("an entry").user_and_password();
        assert_eq!(login, Ok(("ann".into(), "s3cret:with-colon".into())));
        let login = auths.entry("index.docker.io").expect("by the URL's host").user_and_password();
        assert_eq!(login, Ok(("bo".into(), "pw".into())));
        assert!(auths.entry("ghcr.io").is_none());
        assert_eq!(auths.registries().into_iter().collect::<Vec<_>>(), ["127.0.0.1:5000", "index.docker.io"]);
        let cfg = Auths::of_dockercfg(format!(r#"{{"h": {{"auth": "{auth}"}}}}"#).as_bytes()).expect("a dockercfg");
        assert!(cfg.entry("h").is_some());
    }

    #[test]
    fn a_broken_entry_says_what_is_wrong() {
        let entry = |json: &str| serde_json::from_str::<AuthEntry>(json).expect("an entry").user_and_password();
        assert_eq!(entry(r#"{"auth": "!!"}"#), Err(EntryError::NotBase64));
        assert_eq!(entry(r#"{"auth": "/w=="}"#), Err(EntryError::NotUtf8));
        assert_eq!(entry(r#"{"auth": "c2VjcmV0"}"#), Err(EntryError::NotUserPassword));
        assert_eq!(entry(r#"{"username": "u"}"#), Err(EntryError::NoLogin));
        assert!(Auths::of_config_json(br#"{"auths": {"h": 1}}"#).is_err());
    }
}
