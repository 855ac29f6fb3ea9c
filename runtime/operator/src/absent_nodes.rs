//! Jobs whose edge node has no link to this operator: said on the job, so that a job waiting for
//! a node that never connects (a Dataset's `nodeName` with a typo, an agent not installed or
//! failing) does not wait without a word. A node is absent once it has held jobs with no session
//! for [`GRACE`] (an agent restarting or reconnecting is not absent); each of its jobs is said
//! once (a Warning Event, shown by `kubectl describe`), and again only after the node has come
//! and gone again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Resource as _;
use kube::runtime::reflector::ObjectRef;
use perennial_api::LifelongLearningJob;

use super::events::Events;
use super::link::NodeBook;
use super::watches::Stores;

/// How long a node may hold jobs without a session before its jobs say so.
pub const GRACE: Duration = Duration::from_secs(30);
/// How often the nodes are looked at.
const EVERY: Duration = Duration::from_secs(5);

/// What was said, and since when each node has been absent.
#[derive(Default)]
pub struct AbsentNodes {
    since: HashMap<String, Instant>,
    said: HashSet<(String, String)>,
}

impl AbsentNodes {
    /// Given the nodes without a session now (node -> the keys of its jobs), the (node, job)
    /// pairs to say at `now`.
    pub fn due(&mut self, absent: &BTreeMap<String, Vec<String>>, now: Instant) -> Vec<(String, String)> {
        // A node that came back is forgotten: if it goes again, its jobs are said again.
        self.since.retain(|node, _| absent.contains_key(node));
        self.said.retain(|(node, job)| absent.get(node).is_some_and(|jobs| jobs.contains(job)));
        let mut due = Vec::new();
        for (node, jobs) in absent {
            let since = *self.since.entry(node.clone()).or_insert(now);
            if now.duration_since(since) < GRACE {
                continue;
            }
            for job in jobs {
                if self.said.insert((node.clone(), job.clone())) {
                    due.push((node.clone(), job.clone()));
                }
            }
        }
        due
    }
}

/// Says on each job whose node is absent that it waits for it, until the operator stops leading.
pub async fn say_absent_nodes(book: Arc<NodeBook>, stores: Stores, events: Events) {
    let mut absent_nodes = AbsentNodes::default();
    loop {
        tokio::time::sleep(EVERY).await;
        for (node, key) in absent_nodes.due(&book.without_session(), Instant::now()) {
            let Some((namespace, name)) = key.split_once('/') else { continue };
            let Some(job) = stores.jobs.get(&ObjectRef::<LifelongLearningJob>::new(name).within(namespace)) else {
                continue;
            };
            let note = format!(
                "edge node {node} has not connected to this operator's link: the job waits for it. Install the \
                 agent there (docs: Install an edge node), or read its log (journalctl -u perennial-edge, or its \
                 pod's), or fix the Dataset's nodeName if {node} is not the node meant"
            );
            events.publish(&job.object_ref(&()), true, "NodeNotConnected", "Link".into(), note);
            tracing::warn!(node, job = key, "the job's edge node has not connected to the link");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn absent(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        pairs.iter().map(|(node, jobs)| (node.to_string(), jobs.iter().map(|j| j.to_string()).collect())).collect()
    }

    #[test]
    fn a_node_absent_past_its_grace_has_each_job_said_once_and_again_after_it_came_and_went() {
        let mut nodes = AbsentNodes::default();
        let start = Instant::now();
        let gone = absent(&[("edge-9", &["ml/a", "ml/b"])]);
        assert!(nodes.due(&gone, start).is_empty(), "not within its grace (an agent restarting)");
        assert!(nodes.due(&gone, start + GRACE / 2).is_empty());
        let said = nodes.due(&gone, start + GRACE);
        assert_eq!(said, [("edge-9".to_string(), "ml/a".to_string()), ("edge-9".to_string(), "ml/b".to_string())]);
        assert!(nodes.due(&gone, start + GRACE * 10).is_empty(), "each job once");
        // A new job on the absent node is said at once: the node's grace is long over.
        let more = absent(&[("edge-9", &["ml/a", "ml/b", "ml/c"])]);
        assert_eq!(nodes.due(&more, start + GRACE * 11), [("edge-9".to_string(), "ml/c".to_string())]);
        // The node connects, then goes again: a new grace, then said again.
        assert!(nodes.due(&absent(&[]), start + GRACE * 12).is_empty());
        assert!(nodes.due(&more, start + GRACE * 13).is_empty());
        assert_eq!(nodes.due(&more, start + GRACE * 14).len(), 3);
    }
}
