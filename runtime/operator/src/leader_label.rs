//! The leader's label on its own pod, which the link's Service selects.
//!
//! Every replica is Ready (alive, its credentials accepted), so that a Deployment of two rolls
//! out and a rolling update goes on; the edge nodes still reach the leader only, because the
//! Service selects `perennial.io/role: leader` and only the leader's pod has it. A replica takes
//! the label off its own pod before it is Ready (a container restarted in the old leader's pod
//! must not keep it); the new leader takes it off any other pod (an old leader cut off from the
//! API server) before putting it on its own, once its link listens.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

/// The label's key; the Service of deploy/operator selects its value [`LEADER`].
pub const ROLE: &str = "perennial.io/role";
pub const LEADER: &str = "leader";

/// This replica's pod, as the kubelet started it (`POD_NAMESPACE`, `POD_NAME`).
#[derive(Clone)]
pub struct OwnPod {
    pods: Api<Pod>,
    name: String,
}

impl OwnPod {
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> OwnPod {
        OwnPod { pods: Api::namespaced(client, namespace), name: name.to_owned() }
    }

    /// Takes the label off this pod (a standby, or a leader stepping down).
    pub async fn step_down(&self) -> Result<(), kube::Error> {
        set_role(&self.pods, &self.name, None).await
    }

    /// Takes the label off every other pod that has it, then puts it on this one.
    pub async fn lead(&self) -> Result<(), kube::Error> {
        let selector = format!("{ROLE}={LEADER}");
        let labelled = self.pods.list_metadata(&ListParams::default().labels(&selector)).await?;
        for pod in labelled.items {
            match pod.metadata.name {
                Some(name) if name != self.name => {
                    tracing::info!(pod = %name, "taking the leader's label off a former leader's pod");
                    set_role(&self.pods, &name, None).await?;
                }
                _ => {}
            }
        }
        set_role(&self.pods, &self.name, Some(LEADER)).await
    }
}

async fn set_role(pods: &Api<Pod>, name: &str, role: Option<&str>) -> Result<(), kube::Error> {
    // A merge patch of the one label: a null removes it, and other labels are left alone.
    let patch = json!({"metadata": {"labels": {ROLE: role}}});
    match pods.patch_metadata(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        // A pod already gone has no label to take off.
        Err(kube::Error::Api(status)) if status.code == 404 && role.is_none() => Ok(()),
        Err(err) => Err(err),
    }
}
