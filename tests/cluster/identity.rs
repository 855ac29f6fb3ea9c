//! Per-node identity on a real Kubernetes API server: an edge agent proves its node with its
//! pod's projected ServiceAccount token, which the operator checks with TokenReview and binds to
//! the pod's node. Real TLS sockets (`link::socket::connect` against `link::socket::upgrade`),
//! real tokens minted with the TokenRequest API, a real TokenReview.
//!

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use perennial_link::hello;
use perennial_link::socket::{self, LinkError, NodeTokens, Reviewer, client_tls, server_tls};
use perennial_operator::identity::{IdentitySettings, TokenReviewer};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::json;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ClientConfig;

const AGENT: &str = "perennial-edge";
const AUDIENCE: &str = "perennial-link";
const STATIC_NODE: &str = "node-s";
const STATIC_TOKEN: &str = "a-static-node-token";

/// One link listener on loopback (static tokens and `reviewer`), and a client trusting it.
struct Link {
    acceptor: TlsAcceptor,
    client_tls: Arc<ClientConfig>,
}

impl Link {
    fn new() -> Link {
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("key")).expect("CA");
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec!["localhost".to_owned()])
            .expect("params")
            .signed_by(&key, &ca)
            .expect("certificate");
        let server = server_tls(cert.pem().as_bytes(), key.serialize_pem().as_bytes()).expect("server TLS");
        Link { acceptor: TlsAcceptor::from(server), client_tls: client_tls(ca.pem().as_bytes()).expect("client TLS") }
    }

    /// One connection with `token`, its hello claiming `claimed`: the node admitted (the server's
    /// and the client's views agree), or the client's refusal text.
    async fn attempt(&self, reviewer: &dyn Reviewer, token: &str, claimed: &str) -> Result<String, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("wss://localhost:{}/v1/link", listener.local_addr().expect("address").port());
        let tokens = NodeTokens::new([(STATIC_NODE, STATIC_TOKEN)]);
        let server = async {
            let (tcp, _) = listener.accept().await.map_err(|err| err.to_string())?;
            let (node, _, mut ws) =
                socket::upgrade(tcp, &self.acceptor, &tokens, Some(reviewer)).await.map_err(|err| err.to_string())?;
            socket::greet(&node, &mut ws, 0, 15).await.map_err(|err| err.to_string())?;
            Ok::<_, String>((node, ws))
        };
        let greeting = hello(claimed, 0, None);
        let client = socket::connect(&url, None, token, self.client_tls.clone(), &greeting);
        let (served, connected) = tokio::time::timeout(Duration::from_secs(30), async { tokio::join!(server, client) })
            .await
            .expect("the attempt ends within 30 s");
        match connected {
            Ok((_welcomed, _ws)) => {
                let (node, _ws) = served.expect("the server admitted what the client saw admitted");
                Ok(node)
            }
            Err(LinkError::Refused(reason)) => {
                assert!(served.is_err(), "the server refused too");
                Err(reason)
            }
            Err(other) => panic!("not a refusal: {other}"),
        }
    }
}

fn expect_refused(outcome: Result<String, String>, case: &str, says: &[&str]) {
    match outcome {
        Ok(node) => panic!("{case}: admitted as {node}"),
        Err(reason) => {
            for part in says {
                assert!(reason.contains(part), "{case}: the refusal says {part:?}: {reason}");
            }
        }
    }
}

fn settings(namespace: &str, cache_for: Duration) -> IdentitySettings {
    IdentitySettings {
        audience: AUDIENCE.to_owned(),
        namespace: namespace.to_owned(),
        service_account: AGENT.to_owned(),
        cache_for,
    }
}

async fn create_namespace(client: &Client, namespace: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let object = serde_json::from_value(json!({"metadata": {"name": namespace}})).expect("namespace");
    namespaces.create(&PostParams::default(), &object).await.expect("create the namespace");
}

async fn create_account(client: &Client, namespace: &str, name: &str) {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let object = serde_json::from_value(json!({"metadata": {"name": name}})).expect("service account");
    accounts.create(&PostParams::default(), &object).await.expect("create the ServiceAccount");
}

/// A pod of `account` on `node` (no kubelet: it only has to exist). Returns its uid.
pub async fn create_pod(client: &Client, namespace: &str, name: &str, account: &str, node: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let object = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "serviceAccountName": account,
            "automountServiceAccountToken": false,
            "containers": [{"name": "edge", "image": "ghcr.io/perennial-edge/perennial:0.1.0"}]
        }
    }))
    .expect("pod");
    let pod = pods.create(&PostParams::default(), &object).await.expect("create the pod");
    pod.metadata.uid.expect("the pod has a uid")
}

pub async fn delete_pod(client: &Client, namespace: &str, name: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .expect("delete the pod");
    // No kubelet: the pod goes at once with a grace period of 0; wait until it reads so.
    for _ in 0..100 {
        if pods.get_opt(name).await.expect("read the pod").is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("pod {namespace}/{name} is still there");
}

/// A token of `account` for `audience`, bound to the pod (name, uid) if given: what the
/// kubelet's projected `serviceAccountToken` volume holds.
pub async fn mint(
    client: &Client,
    namespace: &str,
    account: &str,
    audience: Option<&str>,
    pod: Option<(&str, &str)>,
) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            // None: the API server's own audience.
            audiences: audience.map(str::to_owned).into_iter().collect(),
            expiration_seconds: Some(3600),
            bound_object_ref: pod.map(|(name, uid)| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
            }),
        },
        ..TokenRequest::default()
    };
    let minted = accounts.create_token_request(account, &PostParams::default(), &request).await.expect("TokenRequest");
    minted.status.expect("the TokenRequest has a status").token
}

/// The agent's token for node-a admits it as node-a; claiming node-b, another audience, another
/// ServiceAccount, no pod binding, a deleted or replaced pod: refused, each with its reason. A
/// static node token still opens the link.
async fn proves_its_node(client: Client, namespace: &str) {
    create_namespace(&client, namespace).await;
    create_account(&client, namespace, AGENT).await;
    create_account(&client, namespace, "other").await;
    let uid_a = create_pod(&client, namespace, "agent-a", AGENT, "node-a").await;
    let uid_other = create_pod(&client, namespace, "intruder", "other", "node-a").await;
    let link = Link::new();
    // No cache: every attempt is a review (the cache is shown below).
    let reviewer = TokenReviewer::new(client.clone(), settings(namespace, Duration::ZERO));

    let token_a = mint(&client, namespace, AGENT, Some(AUDIENCE), Some(("agent-a", &uid_a))).await;
    assert_eq!(link.attempt(&reviewer, &token_a, "node-a").await, Ok("node-a".to_owned()), "node-a's own token");
    expect_refused(
        link.attempt(&reviewer, &token_a, "node-b").await,
        "node-a's token claiming node-b",
        &["node-b", "authenticated as node `node-a`"],
    );
    let for_api =
        mint(&client, namespace, AGENT, Some("https://kubernetes.default.svc"), Some(("agent-a", &uid_a))).await;
    expect_refused(
        link.attempt(&reviewer, &for_api, "node-a").await,
        "a token for another audience",
        &["401", "not valid for the cluster (audience perennial-link)"],
    );
    let other = mint(&client, namespace, "other", Some(AUDIENCE), Some(("intruder", &uid_other))).await;
    expect_refused(
        link.attempt(&reviewer, &other, "node-a").await,
        "a token of another ServiceAccount",
        &["401", &format!("not of the edge agent's ServiceAccount system:serviceaccount:{namespace}:{AGENT}")],
    );
    let unbound = mint(&client, namespace, AGENT, Some(AUDIENCE), None).await;
    expect_refused(
        link.attempt(&reviewer, &unbound, "node-a").await,
        "a token bound to no pod",
        &["401", "not bound to a pod"],
    );
    expect_refused(
        link.attempt(&reviewer, "not.a-token.at-all", "node-a").await,
        "garbage",
        &["401", "not valid for the cluster"],
    );
    expect_refused(link.attempt(&reviewer, "", "node-a").await, "no token", &["401", "none was sent"]);
    assert_eq!(
        link.attempt(&reviewer, STATIC_TOKEN, STATIC_NODE).await,
        Ok(STATIC_NODE.to_owned()),
        "a static node token (a node outside the cluster) opens the link as before"
    );

    // A short cache: the same token again within it is not reviewed again, so it still opens
    // the link after its pod went (at most that long: the reason for keeping it short).
    let cached = TokenReviewer::new(client.clone(), settings(namespace, Duration::from_secs(60)));
    assert_eq!(link.attempt(&cached, &token_a, "node-a").await, Ok("node-a".to_owned()));

    // The pod is deleted: its token no longer opens the link. (The API server may still call
    // the token authenticated for a while: the operator reads the pod itself.)
    delete_pod(&client, namespace, "agent-a").await;
    expect_refused(
        link.attempt(&reviewer, &token_a, "node-a").await,
        "the token of a deleted pod",
        &["401", &format!("pod {namespace}/agent-a, which the token was issued for, no longer exists")],
    );
    assert_eq!(
        link.attempt(&cached, &token_a, "node-a").await,
        Ok("node-a".to_owned()),
        "a review is kept a while (up to a minute, never past the token's expiry)"
    );
    // A new pod of the same name (another uid) does not revive it.
    create_pod(&client, namespace, "agent-a", AGENT, "node-a").await;
    let replaced = link.attempt(&reviewer, &token_a, "node-a").await;
    let said = replaced.as_ref().err().map(String::as_str).unwrap_or_default();
    assert!(
        said.contains("not the pod the token was issued for") || said.contains("not valid for the cluster"),
        "the token of a replaced pod: {replaced:?}"
    );
}

/// The operator's RBAC from deploy/ suffices: a client holding a token of the
/// `perennial-operator` ServiceAccount (its ClusterRole, and deploy/edge's Role in the agents'
/// namespace) reviews the agent's token and reads its pod. `kubeconfig` is the admin's (the cluster's address and CA).
async fn rbac_suffices(client: Client, namespace: &str, kubeconfig: &Path) {
    crate::harness::cluster().install();
    let operator_token = mint(&client, "perennial-system", "perennial-operator", None, None).await;
    let admin = kube::config::Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(admin, &kube::config::KubeConfigOptions::default())
        .await
        .expect("the kubeconfig's cluster");
    config.auth_info = kube::config::AuthInfo { token: Some(operator_token.into()), ..Default::default() };
    let operator = Client::try_from(config).expect("the operator's client");

    create_namespace(&client, namespace).await;
    // What deploy/edge grants the operator in the agents' namespace, in this test's one.
    let grants = std::fs::read_to_string(crate::harness::repo().join("deploy/edge/operator-rbac.yaml"))
        .expect("deploy/edge/operator-rbac.yaml")
        .replace("namespace: perennial-edge", &format!("namespace: {namespace}"));
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), grants).expect("write");
    crate::harness::cluster().kubectl_ok(&["apply", "-f", &file.path().display().to_string()]);
    create_account(&client, namespace, AGENT).await;
    let uid = create_pod(&client, namespace, "agent-a", AGENT, "node-a").await;
    let token = mint(&client, namespace, AGENT, Some(AUDIENCE), Some(("agent-a", &uid))).await;
    // As the operator runs it: the agents' pods followed (a watch; no pod is read by name).
    let reviewer = TokenReviewer::new(operator.clone(), settings(namespace, Duration::ZERO));
    let _following = reviewer.follow_pods();
    let link = Link::new();
    assert_eq!(
        link.attempt(&reviewer, &token, "node-a").await,
        Ok("node-a".to_owned()),
        "reviewed and bound with the operator's own RBAC"
    );
    // And without it (no grants): the refusal says why, without the token.
    let tester = kubeconfig.with_file_name("kubeconfig-tester");
    if tester.exists() {
        let tester = kube::config::Kubeconfig::read_from(&tester).expect("read the tester kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(tester, &kube::config::KubeConfigOptions::default())
            .await
            .expect("the tester's config");
        let reviewer =
            TokenReviewer::new(Client::try_from(config).expect("client"), settings(namespace, Duration::ZERO));
        let refused = link.attempt(&reviewer, &token, "node-a").await;
        expect_refused(refused.clone(), "a reviewer without RBAC", &["401", "could not be reviewed", "forbidden"]);
        assert!(!refused.unwrap_err().contains(&token), "the refusal never holds the token");
    }
}

/// A whole session (the link's server, as the operator runs it) opened with an agent pod's token
/// ends once that pod is deleted, and the token opens no new one.
async fn session_ends_with_its_pod(client: Client, namespace: &str) {
    create_namespace(&client, namespace).await;
    create_account(&client, namespace, AGENT).await;
    let uid = create_pod(&client, namespace, "agent-a", AGENT, "node-a").await;
    let token = mint(&client, namespace, AGENT, Some(AUDIENCE), Some(("agent-a", &uid))).await;
    let reviewer = Arc::new(TokenReviewer::new(client.clone(), settings(namespace, Duration::from_secs(60))));
    let _following = reviewer.follow_pods();
    let pki = crate::link_support::pki();
    let dir = tempfile::tempdir().expect("tempdir");
    let cloud = Arc::new(crate::link_support::TestCloud::new(&dir.path().join("cloud.db"), Default::default()));
    let (_tokens, tokens) = tokio::sync::watch::channel(Arc::new(NodeTokens::default()));
    let settings = perennial_link::cloud_server::ServerSettings {
        tls: server_tls(pki.cert_pem.as_bytes(), pki.key_pem.as_bytes()).expect("server TLS"),
        tokens,
        reviewer: Some(reviewer.clone()),
        // Long: the session must not end for want of pongs (this client answers none).
        heartbeat_secs: 300,
        refusals: Arc::new(perennial_link::refusals::Refusals::new(|_| {})),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("wss://localhost:{}/v1/link", listener.local_addr().expect("address").port());
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(perennial_link::cloud_server::serve(listener, settings, cloud, stopped));
    let tls = client_tls(pki.ca_pem.as_bytes()).expect("client TLS");
    let (_welcomed, mut ws) =
        socket::connect(&url, None, &token, tls.clone(), &hello("node-a", 0, None)).await.expect("admitted");
    // Open: frames (its desired state) and then quiet, not an end.
    let open =
        tokio::time::timeout(Duration::from_secs(2), async { while let Ok(Some(_)) = socket::recv(&mut ws).await {} })
            .await;
    assert!(open.is_err(), "the session stays open while its pod is there");

    delete_pod(&client, namespace, "agent-a").await;
    let ended =
        tokio::time::timeout(Duration::from_secs(10), async { while let Ok(Some(_)) = socket::recv(&mut ws).await {} })
            .await;
    assert!(ended.is_ok(), "the session of a deleted agent pod ends within 10 s");
    // And the cached review does not let it back in.
    let again = socket::connect(&url, None, &token, tls, &hello("node-a", 0, None)).await;
    assert!(again.is_err(), "the token of a deleted pod opens no new session");
}

fn fresh(prefix: &str) -> String {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).expect("random");
    format!("{prefix}-{}", hex::encode(bytes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_projected_token_proves_its_node_and_nothing_else() {
    let client = crate::harness::cluster().client().await;
    proves_its_node(client, &fresh("identity")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_when_the_agent_pod_whose_token_opened_it_is_deleted() {
    let client = crate::harness::cluster().client().await;
    session_ends_with_its_pod(client, &fresh("identity-session")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_rbac_suffices_for_token_reviews() {
    let cluster = crate::harness::cluster();
    rbac_suffices(cluster.client().await, &fresh("identity-rbac"), &cluster.kubeconfig).await;
}
