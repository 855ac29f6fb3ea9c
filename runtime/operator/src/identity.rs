//! Which node an edge agent in the cluster is, without a shared secret on the node: the agent
//! presents its pod's projected ServiceAccount token (its own audience, short-lived, rotated by
//! the kubelet); the operator checks it with the TokenReview API, requires the edge agent's
//! ServiceAccount, and binds it to a node through the pod the token was issued for (the
//! `authentication.kubernetes.io/pod-name` and `pod-uid` extras): that pod, read again, must
//! still be the same pod (uid), and its `spec.nodeName` is the node.
//!
//! The decisions ([`reviewed_pod`], [`pod_node`], [`cache_for`]) are plain functions; the
//! [`TokenReviewer`] only calls the API server and keeps successes briefly, by token digest, so
//! that a reconnect storm does not become a storm of reviews.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::api::PostParams;
use kube::{Api, Client};
use sha2::{Digest, Sha256};

use futures::StreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use perennial_link::socket::{ReviewFuture, Reviewer, RevokedFuture, TokenId};

/// The TokenReview user extra naming the pod a token is bound to (Kubernetes 1.24 and later).
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
/// The TokenReview user extra holding that pod's uid.
pub const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";

/// The link's audience by default: tokens minted for the API server (or anything else) are not
/// accepted.
pub const DEFAULT_AUDIENCE: &str = "perennial-link";

/// How long a review is kept at most.
pub const DEFAULT_CACHE_FOR: Duration = Duration::from_secs(60);

/// A cached review ends this long before its token expires.
const EXPIRY_MARGIN: Duration = Duration::from_secs(10);

/// The most reviews kept at once (one per live agent token; a few per node in a rotation).
const MAX_CACHED: usize = 65_536;

/// How long the API server has for one review and one pod read.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a review waits for the pods' watch to show the token's pod on its node.
const WATCH_WAIT: Duration = Duration::from_secs(3);

/// Whose tokens open the link, and for which audience.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentitySettings {
    /// The audience the agent's projected token is minted for.
    pub audience: String,
    /// The edge agent's namespace (its pods') and ServiceAccount.
    pub namespace: String,
    pub service_account: String,
    /// How long a successful review is kept (less when the token expires sooner).
    pub cache_for: Duration,
}

impl Default for IdentitySettings {
    fn default() -> IdentitySettings {
        IdentitySettings {
            audience: DEFAULT_AUDIENCE.to_owned(),
            namespace: "perennial-edge".to_owned(),
            service_account: "perennial-edge".to_owned(),
            cache_for: DEFAULT_CACHE_FOR,
        }
    }
}

impl IdentitySettings {
    /// The user name the API server gives the agent's ServiceAccount.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.service_account)
    }
}

/// The pod a reviewed token was issued for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundPod {
    pub name: String,
    pub uid: String,
}

/// The pod a TokenReview's answer binds the token to, or why the token does not open the link.
pub fn reviewed_pod(status: Option<&TokenReviewStatus>, settings: &IdentitySettings) -> Result<BoundPod, String> {
    let Some(status) = status else {
        return Err("the token could not be reviewed: the TokenReview came back without a status".to_owned());
    };
    if status.authenticated != Some(true) {
        let why = status.error.as_deref().filter(|e| !e.trim().is_empty()).unwrap_or("no reason given");
        return Err(format!("the token is not valid for the cluster (audience {}): {why}", settings.audience));
    }
    let audiences = status.audiences.as_deref().unwrap_or_default();
    if !audiences.contains(&settings.audience) {
        return Err(format!(
            "the token is not for the link's audience {} (it is for {audiences:?})",
            settings.audience
        ));
    }
    let user = status.user.as_ref();
    let username = user.and_then(|u| u.username.as_deref()).unwrap_or_default();
    let expected = settings.username();
    if username != expected {
        return Err(format!("the token is of {username:?}, not of the edge agent's ServiceAccount {expected}"));
    }
    let extra = |key: &str| match user.and_then(|u| u.extra.as_ref()).and_then(|e| e.get(key)).map(Vec::as_slice) {
        Some([one]) if !one.is_empty() => Some(one.clone()),
        _ => None,
    };
    match (extra(POD_NAME_EXTRA), extra(POD_UID_EXTRA)) {
        (Some(name), Some(uid)) => Ok(BoundPod { name, uid }),
        _ => Err(format!(
            "the token of {expected} is not bound to a pod: the link needs the agent pod's projected token \
             (a serviceAccountToken volume)"
        )),
    }
}

/// The node of the pod a token is bound to, as that pod reads now (`None`: not found).
pub fn pod_node(pod: Option<&Pod>, bound: &BoundPod, settings: &IdentitySettings) -> Result<String, String> {
    let shown = format!("{}/{}", settings.namespace, bound.name);
    let Some(pod) = pod else {
        return Err(format!("pod {shown}, which the token was issued for, no longer exists"));
    };
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if uid != bound.uid {
        return Err(format!(
            "pod {shown} is not the pod the token was issued for (its uid is {uid}, the token's {}): that pod is gone",
            bound.uid
        ));
    }
    match pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) {
        Some(node) if !node.is_empty() => Ok(node.to_owned()),
        _ => Err(format!("pod {shown}, which the token was issued for, is not on a node")),
    }
}

/// How long a review of `token` may be kept at `now` (seconds since the epoch): `limit`, or
/// less if the token expires sooner (its `exp` claim, less a margin). The token's signature was
/// checked by the review; the claim is only read here.
pub fn cache_for(token: &str, now: u64, limit: Duration) -> Duration {
    let Some(exp) = expiry(token) else { return limit };
    let left = Duration::from_secs(exp.saturating_sub(now));
    left.saturating_sub(EXPIRY_MARGIN).min(limit)
}

/// A JWT's `exp` claim, if it has one.
fn expiry(token: &str) -> Option<u64> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("exp")?.as_u64()
}

/// Checks tokens with the API server's TokenReview, binds them to their pod's node, and keeps
/// each success a short while.
pub struct TokenReviewer {
    client: Client,
    settings: IdentitySettings,
    cache: std::sync::Mutex<HashMap<[u8; 32], (String, Instant)>>,
    /// Tokens the review refused lately, with why: the same bad token again costs no review.
    refused: std::sync::Mutex<HashMap<[u8; 32], (String, Instant)>>,
    /// The pod each admitted token is bound to, for ending its sessions when the pod goes.
    bindings: std::sync::Mutex<HashMap<TokenId, BoundPod>>,
    /// The agents' pods, once [`TokenReviewer::follow_pods`] runs.
    pods: std::sync::OnceLock<AgentPods>,
}

/// The edge agents' namespace's pods, from one watch, and a signal on each change (`true`
/// once the first list is in).
#[derive(Clone)]
struct AgentPods {
    store: Store<Pod>,
    changed: tokio::sync::watch::Receiver<bool>,
}

/// An agent's pod as the review reads it (its metadata and node): its spec, most of a pod, is
/// dropped but for the node. (Agents' pods stay `Pod`s; the workers' have a type of their own.)
fn trim_agent_pod(pod: &mut Pod) {
    super::watches::trim_meta(pod);
    if let Some(spec) = pod.spec.as_mut() {
        *spec = PodSpec { node_name: spec.node_name.take(), ..PodSpec::default() };
    }
}

/// How long a token the review refused is refused without another review.
const REFUSED_FOR: Duration = Duration::from_secs(30);

impl TokenReviewer {
    pub fn new(client: Client, settings: IdentitySettings) -> TokenReviewer {
        let (cache, refused) = (std::sync::Mutex::default(), std::sync::Mutex::default());
        let (bindings, pods) = (std::sync::Mutex::default(), std::sync::OnceLock::new());
        TokenReviewer { client, settings, cache, refused, bindings, pods }
    }

    /// Follows the agents' pods (one watch of their namespace), so that a session opened with a
    /// pod's token ends when that pod goes. Runs until the returned task is aborted.
    pub fn follow_pods(&self) -> tokio::task::JoinHandle<()> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        let (store, writer) = reflector::store();
        let (listed, changed) = tokio::sync::watch::channel(false);
        if self.pods.set(AgentPods { store, changed }).is_err() {
            return tokio::spawn(async {});
        }
        tokio::spawn(async move {
            // Stored as the review reads them (name, uid, node): not whole pods.
            let pods = watcher(api, watcher::Config::default()).default_backoff();
            let events = pods.modify(trim_agent_pod).reflect(writer);
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::InitDone) => {
                        listed.send_replace(true);
                    }
                    Ok(_) => listed.send_modify(|_| {}),
                    Err(err) => tracing::debug!("the edge agents' pods' watch: {err}"),
                }
            }
        })
    }

    /// Whether `bound` is known gone (the watch listed, and the pod is not there or is another).
    fn gone(pods: &AgentPods, namespace: &str, bound: &BoundPod) -> bool {
        if !*pods.changed.borrow() {
            return false;
        }
        match pods.store.get(&ObjectRef::new(&bound.name).within(namespace)) {
            Some(pod) => pod.metadata.uid.as_deref() != Some(bound.uid.as_str()),
            None => true,
        }
    }

    fn bind(&self, token: &str, bound: BoundPod) {
        let mut bindings = self.bindings.lock().unwrap_or_else(|p| p.into_inner());
        if bindings.len() >= MAX_CACHED {
            // Sessions already started hold their own copy: dropping the map only costs a
            // cached review its pod check.
            bindings.clear();
        }
        bindings.insert(TokenId::of(token), bound);
    }

    fn refused_lately(&self, key: &[u8; 32]) -> Option<String> {
        let refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        refused.get(key).filter(|(_, until)| *until > Instant::now()).map(|(why, _)| why.clone())
    }

    fn keep_refusal(&self, key: [u8; 32], why: &str) {
        let now = Instant::now();
        let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        if refused.len() >= MAX_CACHED {
            refused.retain(|_, (_, until)| *until > now);
        }
        if refused.len() < MAX_CACHED {
            refused.insert(key, (why.to_owned(), now + REFUSED_FOR));
        }
    }

    fn cached(&self, key: &[u8; 32]) -> Option<String> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.get(key).filter(|(_, until)| *until > Instant::now()).map(|(node, _)| node.clone())
    }

    fn keep(&self, key: [u8; 32], node: &str, token: &str) {
        let now_unix =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let keep = cache_for(token, now_unix, self.settings.cache_for);
        if keep.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= MAX_CACHED {
            cache.retain(|_, (_, until)| *until > now);
        }
        if cache.len() >= MAX_CACHED {
            // Still full of live entries: the one ending first goes.
            if let Some(first) = cache.iter().min_by_key(|(_, (_, until))| *until).map(|(k, _)| *k) {
                cache.remove(&first);
            }
        }
        cache.insert(key, (node.to_owned(), now + keep));
    }

    /// The node `token` proves, or why not.
    pub async fn check(&self, token: &str, peer: &str) -> Result<String, String> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(node) = self.cached(&key) {
            // A recent review, unless the watch shows its pod gone since.
            let bound = self.bindings.lock().unwrap_or_else(|p| p.into_inner()).get(&TokenId::of(token)).cloned();
            let gone = match (self.pods.get(), &bound) {
                (Some(pods), Some(bound)) => Self::gone(pods, &self.settings.namespace, bound),
                _ => false,
            };
            if !gone {
                tracing::debug!(peer, node, "link token admitted (a recent review)");
                return Ok(node);
            }
            self.cache.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        }
        if let Some(why) = self.refused_lately(&key) {
            return Err(why);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![self.settings.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let answer = match tokio::time::timeout(CALL_TIMEOUT, reviews.create(&PostParams::default(), &review)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(err)) => {
                tracing::warn!(peer, "TokenReview failed: {err}");
                return Err(format!("the token could not be reviewed (the operator's TokenReview failed: {err})"));
            }
            Err(_) => {
                tracing::warn!(peer, "TokenReview took over {CALL_TIMEOUT:?}");
                return Err(format!("the token could not be reviewed within {CALL_TIMEOUT:?}"));
            }
        };
        let bound =
            reviewed_pod(answer.status.as_ref(), &self.settings).inspect_err(|why| self.keep_refusal(key, why))?;
        // The pod from the watch (a takeover reviews every agent: no read each); read only by a
        // reviewer that does not follow them.
        let pod = match self.pods.get() {
            Some(pods) => Self::watched_pod(pods, &self.settings, &bound).await,
            None => {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.settings.namespace);
                self.read_pod(&pods, &bound, peer).await?
            }
        };
        let node = pod_node(pod.as_ref(), &bound, &self.settings)?;
        tracing::info!(peer, node, pod = bound.name, "link token reviewed: the agent's pod on its node");
        self.keep(key, &node, token);
        self.bind(token, bound);
        Ok(node)
    }

    /// The agent's pod as the watch shows it, once it shows it on its node: a pod newer than
    /// the watch's last event is waited for, at most [`WATCH_WAIT`] (then what it shows).
    async fn watched_pod(pods: &AgentPods, settings: &IdentitySettings, bound: &BoundPod) -> Option<Pod> {
        let key = ObjectRef::new(&bound.name).within(&settings.namespace);
        let mut changed = pods.changed.clone();
        let deadline = tokio::time::Instant::now() + WATCH_WAIT;
        loop {
            let listed = *changed.borrow_and_update();
            let pod = listed.then(|| pods.store.get(&key)).flatten().map(|pod| Pod::clone(&pod));
            if listed && pod_node(pod.as_ref(), bound, settings).is_ok() {
                return pod;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return pod,
            }
        }
    }

    /// The agent's pod, read from the API server (bounded in time).
    async fn read_pod(&self, pods: &Api<Pod>, bound: &BoundPod, peer: &str) -> Result<Option<Pod>, String> {
        match tokio::time::timeout(CALL_TIMEOUT, pods.get_opt(&bound.name)).await {
            Ok(Ok(pod)) => Ok(pod),
            Ok(Err(err)) => {
                tracing::warn!(peer, pod = bound.name, "reading the agent's pod: {err}");
                Err(format!("pod {}/{} could not be read: {err}", self.settings.namespace, bound.name))
            }
            Err(_) => {
                Err(format!("pod {}/{} could not be read within {CALL_TIMEOUT:?}", self.settings.namespace, bound.name))
            }
        }
    }
}

impl Reviewer for TokenReviewer {
    fn review<'a>(&'a self, token: &'a str, peer: &'a str) -> ReviewFuture<'a> {
        Box::pin(self.check(token, peer))
    }

    fn revoked(&self, token: &TokenId) -> RevokedFuture {
        let bound = self.bindings.lock().unwrap_or_else(|p| p.into_inner()).get(token).cloned();
        let (Some(bound), Some(pods)) = (bound, self.pods.get().cloned()) else {
            return Box::pin(std::future::pending());
        };
        let namespace = self.settings.namespace.clone();
        Box::pin(async move {
            let mut changed = pods.changed.clone();
            loop {
                if Self::gone(&pods, &namespace, &bound) {
                    return format!("the agent pod {namespace}/{} that its token was bound to is gone", bound.name);
                }
                if changed.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::authentication::v1::UserInfo;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn settings() -> IdentitySettings {
        IdentitySettings::default()
    }

    fn status(authenticated: bool, audiences: &[&str], user: &str, extras: &[(&str, &[&str])]) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
            error: (!authenticated).then(|| "token has been invalidated".to_owned()),
            user: Some(UserInfo {
                username: Some(user.to_owned()),
                extra: Some(
                    extras
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..UserInfo::default()
            }),
        }
    }

    const AGENT: &str = "system:serviceaccount:perennial-edge:perennial-edge";
    const BOUND: &[(&str, &[&str])] = &[(POD_NAME_EXTRA, &["edge-x1"]), (POD_UID_EXTRA, &["uid-1"])];

    #[test]
    fn a_review_binds_the_agents_token_to_its_pod_or_says_why_not() {
        let ok = || -> Result<BoundPod, &str> { Ok(BoundPod { name: "edge-x1".into(), uid: "uid-1".into() }) };
        let cases: Vec<(&str, Option<TokenReviewStatus>, Result<BoundPod, &str>)> = vec![
            ("the agent's pod-bound token", Some(status(true, &["perennial-link"], AGENT, BOUND)), ok()),
            ("one audience among others", Some(status(true, &["other", "perennial-link"], AGENT, BOUND)), ok()),
            ("no status", None, Err("without a status")),
            (
                "not authenticated",
                Some(status(false, &[], "", &[])),
                Err("not valid for the cluster (audience perennial-link): token has been invalidated"),
            ),
            ("another audience", Some(status(true, &["api"], AGENT, BOUND)), Err("not for the link's audience")),
            ("an audience-agnostic answer", Some(status(true, &[], AGENT, BOUND)), Err("not for the link's audience")),
            (
                "another ServiceAccount",
                Some(status(true, &["perennial-link"], "system:serviceaccount:perennial-edge:default", BOUND)),
                Err("not of the edge agent's ServiceAccount system:serviceaccount:perennial-edge:perennial-edge"),
            ),
            (
                "the same name in another namespace",
                Some(status(true, &["perennial-link"], "system:serviceaccount:other:perennial-edge", BOUND)),
                Err("not of the edge agent's ServiceAccount"),
            ),
            (
                "a token not bound to a pod",
                Some(status(true, &["perennial-link"], AGENT, &[])),
                Err("not bound to a pod"),
            ),
            (
                "a pod name without its uid",
                Some(status(true, &["perennial-link"], AGENT, &[(POD_NAME_EXTRA, &["edge-x1"])])),
                Err("not bound to a pod"),
            ),
            (
                "two pod names",
                Some(status(
                    true,
                    &["perennial-link"],
                    AGENT,
                    &[(POD_NAME_EXTRA, &["a", "b"]), (POD_UID_EXTRA, &["uid-1"])],
                )),
                Err("not bound to a pod"),
            ),
        ];
        for (case, status, want) in cases {
            let got = reviewed_pod(status.as_ref(), &settings());
            match (got, want) {
                (Ok(pod), Ok(want)) => assert_eq!(pod, want, "{case}"),
                (Err(reason), Err(want)) => assert!(reason.contains(want), "{case}: {reason}"),
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    fn pod(uid: &str, node: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta { name: Some("edge-x1".into()), uid: Some(uid.into()), ..ObjectMeta::default() },
            spec: Some(PodSpec { node_name: node.map(str::to_owned), ..PodSpec::default() }),
            ..Pod::default()
        }
    }

    #[test]
    fn the_node_is_the_bound_pods_while_it_is_the_same_pod() {
        let bound = BoundPod { name: "edge-x1".into(), uid: "uid-1".into() };
        let cases: Vec<(&str, Option<Pod>, Result<&str, &str>)> = vec![
            ("the pod on its node", Some(pod("uid-1", Some("node-a"))), Ok("node-a")),
            (
                "the pod is gone",
                None,
                Err("pod perennial-edge/edge-x1, which the token was issued for, no longer exists"),
            ),
            (
                "a new pod of the same name",
                Some(pod("uid-2", Some("node-a"))),
                Err("its uid is uid-2, the token's uid-1"),
            ),
            ("not scheduled", Some(pod("uid-1", None)), Err("is not on a node")),
            ("an empty node name", Some(pod("uid-1", Some(""))), Err("is not on a node")),
        ];
        for (case, pod, want) in cases {
            let got = pod_node(pod.as_ref(), &bound, &settings());
            match (got, want) {
                (Ok(node), Ok(want)) => assert_eq!(node, want, "{case}"),
                (Err(reason), Err(want)) => assert!(reason.contains(want), "{case}: {reason}"),
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    fn jwt(claims: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.sig", b64(r#"{"alg":"RS256"}"#), b64(claims))
    }

    #[test]
    fn a_review_is_kept_a_minute_at_most_and_never_past_its_tokens_expiry() {
        let minute = Duration::from_secs(60);
        let cases = [
            ("expires in an hour", jwt(r#"{"exp":4600}"#), minute),
            ("expires in 40 s", jwt(r#"{"exp":1040}"#), Duration::from_secs(30)),
            ("expires in 5 s", jwt(r#"{"exp":1005}"#), Duration::ZERO),
            ("expired", jwt(r#"{"exp":900}"#), Duration::ZERO),
            ("no exp claim", jwt(r#"{"sub":"x"}"#), minute),
            ("not a JWT", "opaque-token".to_owned(), minute),
            ("a payload that is not base64", "a.!!!.c".to_owned(), minute),
        ];
        for (case, token, want) in cases {
            assert_eq!(cache_for(&token, 1000, minute), want, "{case}");
        }
    }
}
