//! A kubeconfig for a ServiceAccount, its token minted by TokenRequest (as a pod of that
//! ServiceAccount would have it): how the cluster tests and bench run `perennial operator` with
//! exactly the RBAC that `deploy/operator` grants.

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use serde_json::json;

/// Writes `dir/kubeconfig-NAME` for ServiceAccount `namespace/name` on the API server at
/// `server` (CA `ca_pem`), minting its token with `client`.
pub async fn service_account_kubeconfig(
    client: &kube::Client,
    (server, ca_pem): (&str, &[u8]),
    namespace: &str,
    name: &str,
    dir: &Path,
) -> PathBuf {
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(3600), ..Default::default() },
        ..Default::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let minted: TokenRequest = accounts
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|err| panic!("TokenRequest for {namespace}/{name}: {err}"));
    let token = minted.status.expect("a token").token;
    let ca = dir.join("cluster-ca.crt");
    std::fs::write(&ca, ca_pem).expect("ca");
    // In a file ending in a newline, as `kubectl create token NAME > file` writes it: the
    // operator must read it trimmed (kube-rs alone would send the newline and get 401s).
    let token_file = dir.join(format!("token-{name}"));
    std::fs::write(&token_file, format!("{token}\n")).expect("token file");
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": name, "user": {"tokenFile": token_file}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": name}}]
    });
    let path = dir.join(format!("kubeconfig-{name}"));
    std::fs::write(&path, serde_json::to_vec(&kubeconfig).expect("json")).expect("kubeconfig");
    path
}
