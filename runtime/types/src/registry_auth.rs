//! A job's registry logins for its `oci://` policies: what the operator found in the Secrets the
//! job's pod templates name in `imagePullSecrets`, sent to the job's node over the link with the
//! job's config. Only the entries for the registries the job's references name; never stored by
//! the edge; never shown (`Debug` hides each password, and nothing here has a `Display`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The logins, by registry (`HOST[:PORT]`, as an `oci://` reference names it), and why a Secret
/// the job names gave none (never its content), for the messages of a pull that fails.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistryAuth {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub logins: BTreeMap<String, RegistryLogin>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// The registries whose login the job had and this node did not keep (the job as read back
    /// from the edge's state): a pull refused for want of it may take the copy kept by digest,
    /// until the link brings the login again.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub withheld: BTreeSet<String>,
    /// Of those, the Secret (`namespace/name`) each withheld login came from: a copy kept by
    /// digest serves only a pull as the Secret that kept it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub withheld_from: BTreeMap<String, String>,
}

impl RegistryAuth {
    pub fn is_empty(&self) -> bool {
        self.logins.is_empty() && self.problems.is_empty() && self.withheld.is_empty() && self.withheld_from.is_empty()
    }

    /// What a node keeps of it: the registries of its logins, as withheld, and the Secrets they
    /// came from; no user, no password.
    pub fn kept_form(&self) -> RegistryAuth {
        let mut withheld = self.withheld.clone();
        withheld.extend(self.logins.keys().cloned());
        let mut withheld_from = self.withheld_from.clone();
        withheld_from.extend(self.logins.iter().map(|(registry, login)| (registry.clone(), login.secret.clone())));
        RegistryAuth { withheld, withheld_from, ..RegistryAuth::default() }
    }

    /// The login for `registry`, if a Secret gave one.
    pub fn login(&self, registry: &str) -> Option<&RegistryLogin> {
        self.logins.get(registry)
    }
}

/// A user and password for one registry, and the Secret they came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryLogin {
    /// `namespace/name` of the Secret, for messages.
    pub secret: String,
    pub username: String,
    pub password: Password,
}

/// A password: serialized as it is (for the link), shown as `<hidden>`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Password(String);

impl Password {
    pub fn new(password: impl Into<String>) -> Password {
        Password(password.into())
    }

    /// The password itself: for the registry's request only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<hidden>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_travels_and_is_never_shown() {
        let login =
            RegistryLogin { secret: "ml/regcred".into(), username: "ann".into(), password: Password::new("pw-9") };
        let auth = RegistryAuth { logins: BTreeMap::from([("127.0.0.1:5000".into(), login)]), ..Default::default() };
        let shown = format!("{auth:?} {auth:#?}");
        assert!(!shown.contains("pw-9") && shown.contains("<hidden>") && shown.contains("ml/regcred"), "{shown}");
        let wire = serde_json::to_value(&auth).unwrap();
        assert_eq!(wire["logins"]["127.0.0.1:5000"]["password"], "pw-9");
        assert_eq!(serde_json::from_value::<RegistryAuth>(wire).unwrap(), auth);
        assert!(RegistryAuth::default().is_empty());
        let kept = auth.kept_form();
        assert_eq!(kept.withheld, BTreeSet::from(["127.0.0.1:5000".to_owned()]));
        assert_eq!(kept.withheld_from, BTreeMap::from([("127.0.0.1:5000".to_owned(), "ml/regcred".to_owned())]));
        let kept_text = serde_json::to_string(&kept).unwrap();
        assert!(kept.logins.is_empty() && !kept_text.contains("pw-9") && !kept_text.contains("ann"), "{kept_text}");
    }
}
