//! Read-your-writes over the API server's cache. A job's pods are listed from the API server's
//! watch cache (`resourceVersion=0`: no etcd read, however many pods the namespace holds),
//! which may not show yet a pod this operator created a moment ago. Each pod it creates is
//! remembered until a list shows it, and added to the lists that do not, so that the stage
//! machine never takes a pod still in flight for a vanished one and creates it twice.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

/// How long a created pod is remembered at most: far past any cache lag.
const REMEMBER: Duration = Duration::from_secs(60);

/// The pods this operator created, by job uid, until a list shows them.
#[derive(Default)]
pub struct WrittenPods {
    created: Mutex<HashMap<String, Vec<(Pod, Instant)>>>,
}

impl WrittenPods {
    /// Remembers `pod` (the API server's answer to its creation) for job `uid`.
    pub fn created(&self, uid: &str, pod: Pod) {
        let mut created = self.created.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        created.entry(uid.to_owned()).or_default().push((pod, Instant::now()));
    }

    /// `listed` (from the cache, at `version`: the list's resourceVersion) with the pods created
    /// for `uid` that it does not show yet.
    pub fn with_created(&self, uid: &str, listed: Vec<Pod>, version: Option<&str>) -> Vec<Pod> {
        let mut created = self.created.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(remembered) = created.get_mut(uid) else { return listed };
        let (pods, still) = merge(listed, version, std::mem::take(remembered), Instant::now());
        if still.is_empty() {
            created.remove(uid);
        } else {
            *remembered = still;
        }
        pods
    }

    /// Forgets a job (deleted).
    pub fn forget(&self, uid: &str) {
        self.created.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(uid);
    }
}

/// The listed pods plus the remembered ones they lack; and what stays remembered: not listed
/// yet, not older than [`REMEMBER`], and created after the list's version (a list at or past a
/// pod's creation that lacks it says it is gone: deleted since).
fn merge(
    mut listed: Vec<Pod>,
    version: Option<&str>,
    remembered: Vec<(Pod, Instant)>,
    now: Instant,
) -> (Vec<Pod>, Vec<(Pod, Instant)>) {
    let number = |v: Option<&str>| v.and_then(|v| v.parse::<u64>().ok());
    let list_version = number(version);
    let mut still = Vec::new();
    for (pod, at) in remembered {
        let shown = listed.iter().any(|p| p.metadata.uid.is_some() && p.metadata.uid == pod.metadata.uid);
        let passed = matches!(
            (list_version, number(pod.metadata.resource_version.as_deref())),
            (Some(list), Some(created)) if list >= created
        );
        if shown || passed || now.duration_since(at) > REMEMBER {
            continue;
        }
        listed.push(pod.clone());
        still.push((pod, at));
    }
    (listed, still)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> Pod {
        let metadata = serde_json::json!({"name": format!("p-{uid}"), "uid": uid, "resourceVersion": "100"});
        serde_json::from_value(serde_json::json!({ "metadata": metadata })).unwrap()
    }

    fn uids(pods: &[Pod]) -> Vec<String> {
        pods.iter().map(|p| p.metadata.uid.clone().unwrap_or_default()).collect()
    }

    #[test]
    fn a_created_pod_is_seen_until_the_cache_shows_it_then_forgotten() {
        let written = WrittenPods::default();
        written.created("job", pod("b"));
        // The cache lags (its list predates the creation): the new pod is added.
        assert_eq!(uids(&written.with_created("job", vec![pod("a")], Some("99"))), ["a", "b"]);
        // The cache caught up: listed once, and forgotten.
        assert_eq!(uids(&written.with_created("job", vec![pod("a"), pod("b")], Some("101"))), ["a", "b"]);
        assert_eq!(uids(&written.with_created("job", vec![pod("a")], Some("102"))), ["a"], "not brought back");
        assert_eq!(uids(&written.with_created("other", vec![], None)), Vec::<String>::new());
    }

    #[test]
    fn a_list_past_the_creation_that_lacks_the_pod_says_it_is_gone() {
        let written = WrittenPods::default();
        written.created("job", pod("b"));
        assert_eq!(uids(&written.with_created("job", vec![], Some("100"))), Vec::<String>::new());
        assert_eq!(uids(&written.with_created("job", vec![], Some("99"))), Vec::<String>::new(), "forgotten");
    }

    #[test]
    fn a_remembered_pod_expires() {
        let now = Instant::now();
        let old = now.checked_sub(REMEMBER + Duration::from_secs(1)).unwrap_or(now);
        let (pods, still) = merge(vec![], None, vec![(pod("x"), old), (pod("y"), now)], now);
        assert_eq!(uids(&pods), ["y"]);
        assert_eq!(still.len(), 1);
    }
}
