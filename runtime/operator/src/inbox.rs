//! Edge reports waiting to be applied to their job's status. The link hands a report in and
//! gets a receipt that resolves once the status that applied it has been written, so that the
//! edge's outbox is acknowledged only for what is durable in the API server. A report that is
//! never applied (the operator stopped) is resent by the edge and, being keyed by (uid, round,
//! stage), applied once; one resent while the first still waits joins it.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::runtime::reflector::ObjectRef;
use tokio::sync::{mpsc, oneshot};

use perennial_api::LifelongLearningJob;
use perennial_lifecycle::Report;

struct Waiting {
    report: Report,
    /// One receipt per delivery: an edge that resent the report after a timed-out wait holds
    /// the same report twice, applied once.
    applied: Vec<oneshot::Sender<()>>,
}

/// Reports by job (`namespace/name`), oldest first, and the trigger that wakes the job's
/// reconcile.
pub struct Inbox {
    waiting: Mutex<HashMap<(String, String), Vec<Waiting>>>,
    wake: mpsc::UnboundedSender<ObjectRef<LifelongLearningJob>>,
}

impl Inbox {
    /// The inbox and the stream of jobs to reconcile for it (`Controller::reconcile_on`).
    pub fn new() -> (Inbox, mpsc::UnboundedReceiver<ObjectRef<LifelongLearningJob>>) {
        let (wake, woken) = mpsc::unbounded_channel();
        (Inbox { waiting: Mutex::default(), wake }, woken)
    }

    /// Hands in a report for the job `namespace/name`; the receipt resolves once it is applied.
    pub fn deliver(&self, namespace: &str, name: &str, report: Report) -> oneshot::Receiver<()> {
        let (applied, receipt) = oneshot::channel();
        let key = (namespace.to_owned(), name.to_owned());
        let mut waiting = self.lock();
        let reports = waiting.entry(key).or_default();
        match reports.iter_mut().find(|w| w.report == report) {
            Some(same) => same.applied.push(applied),
            None => reports.push(Waiting { report, applied: vec![applied] }),
        }
        drop(waiting);
        let _ = self.wake.send(ObjectRef::new(name).within(namespace));
        receipt
    }

    /// The job's waiting reports, oldest first (they stay until `applied`).
    pub fn peek(&self, namespace: &str, name: &str) -> Vec<Report> {
        let waiting = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        waiting.get(&key).map(|reports| reports.iter().map(|w| w.report.clone()).collect()).unwrap_or_default()
    }

    /// The first `count` reports of the job are in a written status: their receipts resolve.
    pub fn applied(&self, namespace: &str, name: &str, count: usize) {
        let mut waiting = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(reports) = waiting.get_mut(&key) {
            for done in reports.drain(..count.min(reports.len())) {
                for receipt in done.applied {
                    let _ = receipt.send(());
                }
            }
            if reports.is_empty() {
                waiting.remove(&key);
            }
        }
    }

    /// The job is gone: its waiting reports are dropped (their receipts never resolve; the edge
    /// forgets the job).
    pub fn forget(&self, namespace: &str, name: &str) {
        self.lock().remove(&(namespace.to_owned(), name.to_owned()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Vec<Waiting>>> {
        self.waiting.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(round: u64) -> Report {
        Report { job_uid: "u".into(), round, ..Report::default() }
    }

    #[tokio::test]
    async fn receipts_resolve_in_order_once_applied() {
        let (inbox, mut woken) = Inbox::new();
        let mut first = inbox.deliver("ns", "job", report(1));
        let second = inbox.deliver("ns", "job", report(2));
        assert_eq!(woken.recv().await, Some(ObjectRef::new("job").within("ns")));
        assert_eq!(inbox.peek("ns", "job").iter().map(|r| r.round).collect::<Vec<_>>(), vec![1, 2]);
        inbox.applied("ns", "job", 1);
        assert_eq!(first.try_recv(), Ok(()));
        assert_eq!(inbox.peek("ns", "job").len(), 1);
        inbox.applied("ns", "job", 5);
        assert_eq!(second.await, Ok(()));
        assert!(inbox.peek("ns", "job").is_empty());
        assert!(inbox.peek("ns", "other").is_empty());
    }

    #[tokio::test]
    async fn a_report_delivered_again_while_it_waits_is_applied_once_and_both_answered() {
        let (inbox, _woken) = Inbox::new();
        let first = inbox.deliver("ns", "job", report(1));
        let again = inbox.deliver("ns", "job", report(1));
        assert_eq!(inbox.peek("ns", "job").len(), 1, "one copy for the stage machine");
        inbox.applied("ns", "job", 1);
        assert_eq!((first.await, again.await), (Ok(()), Ok(())));
    }

    #[tokio::test]
    async fn a_forgotten_job_drops_its_reports_unacknowledged() {
        let (inbox, _woken) = Inbox::new();
        let receipt = inbox.deliver("ns", "job", report(1));
        inbox.forget("ns", "job");
        assert!(receipt.await.is_err(), "not applied: the edge must not drop it from its outbox");
    }
}
