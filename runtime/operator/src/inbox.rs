//! Edge reports waiting to be applied to their job's status. The link hands a report in and
//! gets a receipt that resolves once the status that applied it has been written, so that the
//! edge's outbox is acknowledged only for what is durable in the API server. A report that is
//! never applied (the operator stopped) is resent by the edge and, being keyed by (uid, round,
//! stage), applied once; one resent while the first still waits joins it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::runtime::reflector::ObjectRef;
use tokio::sync::{mpsc, oneshot};

use perennial_api::LifelongLearningJob;
use perennial_lifecycle::Report;

struct Waiting {
    report: Report,
    /// One receipt per delivery: an edge that resent the report after a timed-out wait holds
    /// the same report twice, applied once.
    applied: Vec<oneshot::Sender<()>>,
    arrived: Instant,
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
            None => reports.push(Waiting { report, applied: vec![applied], arrived: Instant::now() }),
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

    /// Whether `report` is the next stage's Ready that the job's last waiting report (a stage
    /// result with `next_follows`) waits for.
    pub fn follows(&self, namespace: &str, name: &str, report: &Report) -> bool {
        let waiting = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let Some(last) = waiting.get(&key).and_then(|reports| reports.last()).map(|w| &w.report) else {
            return false;
        };
        last.next_follows
            && (last.job_uid.as_str(), last.round) == (report.job_uid.as_str(), report.round)
            && last.stage.map(|stage| stage.next()) == report.stage
            && report.status == Some(perennial_api::Phase::Ready)
    }

    /// How long the job's oldest waiting report has waited (zero when none does).
    pub fn waited(&self, namespace: &str, name: &str) -> Duration {
        let waiting = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        waiting.get(&key).and_then(|reports| reports.first()).map_or(Duration::ZERO, |w| w.arrived.elapsed())
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

    #[test]
    fn only_the_ready_a_waiting_result_says_follows_is_taken_in_early() {
        use perennial_api::{Phase, Stage};
        let (inbox, _woken) = Inbox::new();
        let at = |stage, status| Report { stage: Some(stage), status: Some(status), ..report(3) };
        let eval_ready = at(Stage::Eval, Phase::Ready);
        assert!(!inbox.follows("ns", "job", &eval_ready), "nothing waits");
        let _older = inbox.deliver("ns", "job", at(Stage::Train, Phase::Completed));
        assert!(!inbox.follows("ns", "job", &eval_ready), "a result from an older agent");
        inbox.applied("ns", "job", 1);
        let _result = inbox.deliver("ns", "job", Report { next_follows: true, ..at(Stage::Train, Phase::Completed) });
        assert!(inbox.follows("ns", "job", &eval_ready));
        assert!(!inbox.follows("ns", "other", &eval_ready), "another job");
        assert!(!inbox.follows("ns", "job", &Report { round: 4, ..eval_ready.clone() }), "another round");
        assert!(!inbox.follows("ns", "job", &Report { job_uid: "v".into(), ..eval_ready.clone() }), "another uid");
        assert!(!inbox.follows("ns", "job", &at(Stage::Deploy, Phase::Ready)), "not the next stage");
        assert!(!inbox.follows("ns", "job", &at(Stage::Eval, Phase::Failed)), "not a Ready");
    }

    #[tokio::test]
    async fn a_forgotten_job_drops_its_reports_unacknowledged() {
        let (inbox, _woken) = Inbox::new();
        let receipt = inbox.deliver("ns", "job", report(1));
        inbox.forget("ns", "job");
        assert!(receipt.await.is_err(), "not applied: the edge must not drop it from its outbox");
    }
}
