//! Job reports waiting their turn on a node's link while an earlier one is applied. The link
//! applies a node's reports one at a time, in order; the stage machine writes a stage result and
//! the next stage's Ready that its edge sends right behind it (`next_follows`) in one status
//! change only if both are in the inbox at once. So each job report queued behind another is
//! offered here, and a Ready that a result handed to the inbox says follows is handed in early
//! (when it is offered, or when the result is handed in, whichever comes last). Its turn then
//! awaits that receipt instead of handing it in again.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde::Deserialize as _;
use serde_json::Value;
use tokio::sync::oneshot;

use super::inbox::Inbox;
use perennial_types::Report;

/// A job report offered before its turn.
struct Offered {
    body: Value,
    namespace: String,
    name: String,
    report: perennial_lifecycle::Report,
    /// Handed to the inbox early: resolves once applied.
    receipt: Option<oneshot::Receiver<()>>,
}

/// Offered reports by node, then seq: at most a link window's a node (each goes at its turn,
/// and a node's new connection drops what its last one left).
#[derive(Default)]
pub struct EarlyReports {
    offered: Mutex<HashMap<String, BTreeMap<u64, Offered>>>,
}

impl EarlyReports {
    /// Report `seq` of `node` waits its turn: kept if it is a job report, and handed to the
    /// inbox now if it is the Ready that the job's waiting result says follows.
    pub fn offer(&self, inbox: &Inbox, node: &str, seq: u64, body: &Value) {
        let Ok(wire) = Report::deserialize(body) else { return }; // policies, a Dataset count
        let Some((namespace, name)) = wire.job.split_once('/') else { return };
        let report = perennial_lifecycle::Report::from(&wire);
        let receipt = inbox.follows(namespace, name, &report).then(|| inbox.deliver(namespace, name, report.clone()));
        let offered =
            Offered { body: body.clone(), namespace: namespace.to_owned(), name: name.to_owned(), report, receipt };
        self.lock().entry(node.to_owned()).or_default().insert(seq, offered);
    }

    /// A result that says its next stage's Ready follows was just handed to the inbox for job
    /// `namespace/name`: that Ready, if `node` already sent it, goes in now.
    pub fn hand_in_follower(&self, inbox: &Inbox, node: &str, namespace: &str, name: &str) {
        let mut offered = self.lock();
        let Some(waiting) = offered.get_mut(node) else { return };
        let follower = waiting.values_mut().find(|o| {
            o.receipt.is_none()
                && (o.namespace.as_str(), o.name.as_str()) == (namespace, name)
                && inbox.follows(namespace, name, &o.report)
        });
        if let Some(follower) = follower {
            follower.receipt = Some(inbox.deliver(namespace, name, follower.report.clone()));
        }
    }

    /// Report `seq` of `node`'s turn: the receipt of its early hand-in, if it had one and is the
    /// same report (an edge that renumbered its outbox may send another under that seq).
    pub fn take(&self, node: &str, seq: u64, body: &Value) -> Option<oneshot::Receiver<()>> {
        let mut all = self.lock();
        let waiting = all.get_mut(node)?;
        let offered = waiting.remove(&seq);
        if waiting.is_empty() {
            all.remove(node);
        }
        let offered = offered?;
        offered.receipt.filter(|_| offered.body == *body)
    }

    /// A new connection of `node`: what its last one offered comes again.
    pub fn forget_node(&self, node: &str) {
        self.lock().remove(node);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, BTreeMap<u64, Offered>>> {
        self.offered.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(stage: &str, status: &str, follows: bool) -> Value {
        let mut body = json!({"job": "ml/job", "jobUid": "u", "round": 2, "phase": stage, "status": status});
        if follows {
            body["nextFollows"] = json!(true);
        }
        body
    }

    fn hand_in(inbox: &Inbox, body: &Value) -> oneshot::Receiver<()> {
        let report = Report::deserialize(body).expect("a job report");
        inbox.deliver("ml", "job", perennial_lifecycle::Report::from(&report))
    }

    #[tokio::test]
    async fn the_ready_goes_in_early_whichever_of_it_and_its_result_comes_first() {
        let (result, ready) = (body("Train", "Completed", true), body("Eval", "Ready", false));
        // The Ready offered once the result is in the inbox: in at once.
        let (inbox, _woken) = Inbox::new();
        let early = EarlyReports::default();
        let _result = hand_in(&inbox, &result);
        early.offer(&inbox, "edge-1", 8, &ready);
        assert_eq!(inbox.peek("ml", "job").len(), 2, "the result and its Ready, for one status change");
        let receipt = early.take("edge-1", 8, &ready).expect("handed in early");
        inbox.applied("ml", "job", 2);
        receipt.await.expect("resolved with the result's write");
        // The Ready offered while the result still waits its turn: in with the result.
        let (inbox, _woken) = Inbox::new();
        early.offer(&inbox, "edge-1", 8, &ready);
        assert!(inbox.peek("ml", "job").is_empty(), "nothing to follow yet");
        let _result = hand_in(&inbox, &result);
        early.hand_in_follower(&inbox, "edge-1", "ml", "job");
        assert_eq!(inbox.peek("ml", "job").len(), 2);
        assert!(early.take("edge-1", 8, &ready).is_some());
    }

    #[test]
    fn other_reports_wait_their_turn_and_a_renumbered_seq_is_not_taken_for_it() {
        let (inbox, _woken) = Inbox::new();
        let early = EarlyReports::default();
        let _older_agent = hand_in(&inbox, &body("Train", "Completed", false));
        early.offer(&inbox, "edge-1", 8, &body("Eval", "Ready", false));
        early.offer(&inbox, "edge-1", 9, &json!({"dataset": "ml/data", "numberOfSamples": 40}));
        assert_eq!(inbox.peek("ml", "job").len(), 1, "no result says it follows");
        assert!(early.take("edge-1", 8, &body("Eval", "Ready", false)).is_none(), "handed in at its turn");
        assert!(early.take("edge-1", 9, &json!({})).is_none());
        // Handed in early, then another report comes under its seq on a new connection.
        let (inbox, _woken) = Inbox::new();
        let _result = hand_in(&inbox, &body("Train", "Completed", true));
        early.offer(&inbox, "edge-1", 8, &body("Eval", "Ready", false));
        assert!(early.take("edge-1", 8, &body("Eval", "Failed", false)).is_none(), "not the report handed in");
        early.offer(&inbox, "edge-2", 3, &body("Eval", "Ready", false));
        early.forget_node("edge-2");
        assert!(early.take("edge-2", 3, &body("Eval", "Ready", false)).is_none(), "forgotten on reconnect");
    }
}
