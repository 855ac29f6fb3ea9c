//! Shadow policies: a candidate named in a policy reference (`shadow:`) is asked the same live
//! questions as the serving policy, after the serving answer is made and acted on, on a thread of
//! its own, and never acts. The serving policy never waits for it: the loop keeps a turn's
//! questions and hands them over together when it waits, and a question beyond the bound (the
//! queue is full) is counted as skipped. Nor does it run beside the serving side: it starts a
//! call only while the loop waits between turns (on 2 cores, a call on the other core measurably
//! slowed the serving call), at a lower priority than the rest of the host. Its time and its
//! faults (a trap, a timeout, memory) are its own: they count as failed in its record. The job's
//! status shows, per kind, its calls, agreements, disagreements and the last disagreement
//! (`status.policies.<kind>.shadow`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::thread::Thread;
use std::time::Duration;

use rusqlite::params;

use crate::decisions::{DecisionKind, SelectInput};
use crate::sqlite::Store;
use perennial_policy::{SampleBatch, SelectorPolicy, SplitterPolicy, TriggerPolicy, TriggerStats};
use perennial_types::{ShadowDisagreement, ShadowStatus};

/// A job's shadow policies, each beside the serving policy of its kind.
#[derive(Clone, Default)]
pub struct Shadows {
    /// The job's name, as each question to them carries it.
    pub job: Arc<str>,
    pub trigger: Option<Arc<TriggerPolicy>>,
    pub splitter: Option<Arc<SplitterPolicy>>,
    pub selector: Option<Arc<SelectorPolicy>>,
}

impl Shadows {
    /// The shadow of `kind`, if the job has one.
    fn of(&self, kind: DecisionKind) -> Option<Shadow> {
        match kind {
            DecisionKind::Trigger => self.trigger.clone().map(Shadow::Trigger),
            DecisionKind::Splitter => self.splitter.clone().map(Shadow::Splitter),
            DecisionKind::Selector => self.selector.clone().map(Shadow::Selector),
        }
    }
}

/// One shadow policy, of whichever kind.
#[derive(Clone)]
enum Shadow {
    Trigger(Arc<TriggerPolicy>),
    Splitter(Arc<SplitterPolicy>),
    Selector(Arc<SelectorPolicy>),
}

impl Shadow {
    fn as_trigger(&self) -> Option<&TriggerPolicy> {
        if let Shadow::Trigger(policy) = self { Some(policy) } else { None }
    }

    fn as_splitter(&self) -> Option<&SplitterPolicy> {
        if let Shadow::Splitter(policy) = self { Some(policy) } else { None }
    }

    fn as_selector(&self) -> Option<&SelectorPolicy> {
        if let Shadow::Selector(policy) = self { Some(policy) } else { None }
    }

    /// Whether both are the very same policy.
    fn same(&self, other: &Shadow) -> bool {
        match (self, other) {
            (Shadow::Trigger(a), Shadow::Trigger(b)) => Arc::ptr_eq(a, b),
            (Shadow::Splitter(a), Shadow::Splitter(b)) => Arc::ptr_eq(a, b),
            (Shadow::Selector(a), Shadow::Selector(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Drops its live instance (the shadows' thread does, when it is idle).
    fn release(&self) {
        match self {
            Shadow::Trigger(policy) => policy.reset(),
            Shadow::Splitter(policy) => policy.reset(),
            Shadow::Selector(policy) => policy.reset(),
        }
    }
}

/// What the serving policy was asked, and what it answered.
pub enum Question {
    Trigger { stats: TriggerStats, train: bool },
    Split { batch: SampleBatch, assignments: Vec<u8> },
    Select { input: SelectInput, deploy: Option<u32> },
}

impl Question {
    pub fn kind(&self) -> DecisionKind {
        match self {
            Question::Trigger { .. } => DecisionKind::Trigger,
            Question::Split { .. } => DecisionKind::Splitter,
            Question::Select { .. } => DecisionKind::Selector,
        }
    }
}

/// How a shadow's answer compared with the serving one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compared {
    Agreed,
    Disagreed(ShadowDisagreement),
    Failed(String),
}

/// Asks the shadow the question, and compares its answer with the serving one. `None` when the
/// shadow is not of the question's kind.
fn ask(shadow: &Shadow, question: Question, now: u64) -> Option<Compared> {
    let differs = |input: String, answer: String, shadow_answer: String, reason: String| {
        let time = jiff::Timestamp::from_second(now as i64).map(|t| t.to_string()).unwrap_or_default();
        Compared::Disagreed(ShadowDisagreement { input, answer, shadow_answer, reason, time })
    };
    let word = |train: bool| if train { "train" } else { "wait" }.to_owned();
    Some(match question {
        Question::Trigger { stats, train } => match shadow.as_trigger()?.decide(&stats) {
            Ok(decision) if decision.train == train => Compared::Agreed,
            Ok(decision) => differs(
                format!("pendingTrain {}, pendingEval {}", stats.pending_train, stats.pending_eval),
                word(train),
                word(decision.train),
                decision.reason,
            ),
            Err(err) => Compared::Failed(err.to_string()),
        },
        Question::Split { batch, assignments } => {
            let (first, count) = (batch.first_seq(), batch.len() as u64);
            match shadow.as_splitter()?.split(batch) {
                Ok(theirs) if theirs.as_bytes() == assignments.as_slice() => Compared::Agreed,
                Ok(theirs) => {
                    let moved = theirs.as_bytes().iter().zip(&assignments).filter(|(a, b)| a != b).count();
                    let counts = |bytes: &[u8]| {
                        let n = |v: u8| bytes.iter().filter(|b| **b == v).count();
                        format!("train {}, eval {}, skip {}", n(0), n(1), n(2))
                    };
                    differs(
                        format!("samples {first}..{}", first + count),
                        counts(&assignments),
                        counts(theirs.as_bytes()),
                        format!("{moved} samples assigned otherwise"),
                    )
                }
                Err(err) => Compared::Failed(err.to_string()),
            }
        }
        Question::Select { input, deploy } => {
            match shadow.as_selector()?.select(input.deployed.as_ref(), &input.candidates) {
                Ok(choice) if choice.deploy == deploy => Compared::Agreed,
                Ok(choice) => {
                    let name = |d: Option<u32>| d.map_or("keep".to_owned(), |i| format!("deploy {i}"));
                    differs(
                        format!("{} candidates", input.candidates.len()),
                        name(deploy),
                        name(choice.deploy),
                        choice.reason,
                    )
                }
                Err(err) => Compared::Failed(err.to_string()),
            }
        }
    })
}

/// Questions waiting for the shadows before the next is skipped (a turn over a hundred busy
/// jobs asks a few hundred).
pub const QUEUE: usize = 256;
/// Batches waiting for a shadow splitter, in bytes, before the next is skipped.
pub const QUEUED_BATCH_BYTES: usize = 16 << 20;

struct Asked {
    job: Arc<str>,
    shadow: Shadow,
    question: Question,
    now: u64,
    /// The memory its batch holds (a split's).
    bytes: usize,
}

/// What the two sides share: questions skipped since the thread last wrote them down (by job
/// and kind), the questions and the bytes of the batches waiting, and whether the loop is in a
/// turn.
#[derive(Default)]
struct Shared {
    skipped: Mutex<HashMap<(String, DecisionKind), u64>>,
    queued: AtomicUsize,
    queued_bytes: AtomicUsize,
    loop_busy: AtomicBool,
    /// The shadows' thread, woken when the loop starts to wait.
    worker: OnceLock<Thread>,
}

/// How long the shadows' thread sleeps at most before it looks again whether the loop waits (it
/// is woken when it does; this only bounds a wake-up lost to a race).
const BUSY_RECHECK: Duration = Duration::from_millis(50);

impl Shared {
    /// Returns once the loop is waiting between turns.
    fn until_the_loop_waits(&self) {
        while self.loop_busy.load(Ordering::Acquire) {
            std::thread::park_timeout(BUSY_RECHECK);
        }
    }
}

/// The loop's side of the shadows' thread. Dropping it lets the thread answer what is left and
/// end.
pub struct ShadowQueue {
    /// A whole turn's questions at once: one hand-off per turn, not one per decision.
    sender: Sender<Vec<Asked>>,
    /// This turn's questions, handed over when the loop waits.
    turn: RefCell<Vec<Asked>>,
    shared: Arc<Shared>,
}

impl Drop for ShadowQueue {
    fn drop(&mut self) {
        self.loop_waits();
    }
}

/// The shadows' thread's side.
pub struct ShadowWorker {
    receiver: Receiver<Vec<Asked>>,
    shared: Arc<Shared>,
}

/// A queue and the worker that serves it (run [`ShadowWorker::serve`] on a thread of its own).
pub fn queue() -> (ShadowQueue, ShadowWorker) {
    // Unbounded in turns, bounded in questions: each turn handed over holds at least one of the
    // `QUEUE` questions that may wait.
    let (sender, receiver) = std::sync::mpsc::channel();
    let shared = Arc::new(Shared::default());
    (ShadowQueue { sender, turn: RefCell::default(), shared: shared.clone() }, ShadowWorker { receiver, shared })
}

impl ShadowQueue {
    /// The loop starts a turn: no shadow call starts until it waits again.
    pub fn loop_busy(&self) {
        self.shared.loop_busy.store(true, Ordering::Release);
    }

    /// The loop waits between turns: the shadows answer what they were asked.
    pub fn loop_waits(&self) {
        self.shared.loop_busy.store(false, Ordering::Release);
        let turn = std::mem::take(&mut *self.turn.borrow_mut());
        if !turn.is_empty() && self.sender.send(turn).is_err() {
            // The thread is gone (it ended with a panic): what waited is not answered.
            self.shared.queued.store(0, Ordering::Relaxed);
            self.shared.queued_bytes.store(0, Ordering::Relaxed);
        }
        if let Some(worker) = self.shared.worker.get() {
            worker.unpark();
        }
    }

    /// Keeps the question for the job's shadow of its kind, if it has one, until the loop waits;
    /// never waits. Skipped when [`QUEUE`] questions wait, or the batches waiting hold
    /// [`QUEUED_BATCH_BYTES`].
    pub fn ask(&self, shadows: &Shadows, question: Question, now: u64) {
        let kind = question.kind();
        let Some(shadow) = shadows.of(kind) else { return };
        let bytes = match &question {
            Question::Split { batch, .. } => batch.byte_len(),
            _ => 0,
        };
        let (queued, queued_bytes) = (&self.shared.queued, &self.shared.queued_bytes);
        let fits = queued.load(Ordering::Relaxed) < QUEUE
            && (bytes == 0 || queued_bytes.load(Ordering::Relaxed) + bytes <= QUEUED_BATCH_BYTES);
        if fits {
            queued.fetch_add(1, Ordering::Relaxed);
            queued_bytes.fetch_add(bytes, Ordering::Relaxed);
            self.turn.borrow_mut().push(Asked { job: shadows.job.clone(), shadow, question, now, bytes });
        } else {
            let mut skipped = self.shared.skipped.lock().unwrap_or_else(|p| p.into_inner());
            *skipped.entry((shadows.job.to_string(), kind)).or_default() += 1;
        }
    }
}

/// How soon the shadows' thread tries again to hand its counts over while the loop holds the store.
const HAND_OVER_RETRY: Duration = Duration::from_millis(5);

impl ShadowWorker {
    /// Asks each shadow its questions and hands over how it compared, until the queue's last
    /// sender is gone. A call starts only while the loop waits between turns. The thread runs
    /// at a lower priority (nice 10: on a busy node the shadow takes only what the rest of the
    /// host leaves), and it never waits for the store's lock, which the loop holds while it
    /// decides: a preempted low-priority holder would hold the loop up. Its counts wait here
    /// until the lock is free.
    pub fn serve(self, store: &Mutex<Store>) {
        perennial_policy::lower_this_threads_priority();
        let _ = self.shared.worker.set(std::thread::current());
        // The shadows asked since the queue was last empty: their instances are dropped then
        // (here, never by the loop, which would wait for a call in progress).
        let mut used: Vec<Shadow> = Vec::new();
        let mut unwritten = Unwritten::default();
        loop {
            let turn = match self.receiver.try_recv() {
                Ok(turn) => turn,
                Err(TryRecvError::Empty) => {
                    used.drain(..).for_each(|shadow| shadow.release());
                    let next = if unwritten.is_empty() {
                        self.receiver.recv().map_err(|_| RecvTimeoutError::Disconnected)
                    } else {
                        self.receiver.recv_timeout(HAND_OVER_RETRY)
                    };
                    match next {
                        Ok(turn) => turn,
                        Err(RecvTimeoutError::Timeout) => {
                            unwritten.try_hand_over(store, &self.shared);
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                Err(TryRecvError::Disconnected) => break,
            };
            for asked in turn {
                if !used.iter().any(|shadow| shadow.same(&asked.shadow)) {
                    used.push(asked.shadow.clone());
                }
                self.shared.until_the_loop_waits();
                self.shared.queued.fetch_sub(1, Ordering::Relaxed);
                self.shared.queued_bytes.fetch_sub(asked.bytes, Ordering::Relaxed);
                let kind = asked.question.kind();
                if let Some(compared) = ask(&asked.shadow, asked.question, asked.now) {
                    unwritten.add(asked.job, kind, Tally::of(compared));
                }
                unwritten.try_hand_over(store, &self.shared);
            }
        }
        // The loop has stopped: nothing waits for the lock any more.
        let mut store = crate::sqlite::lock(store);
        unwritten.hand_over(&mut store, &self.shared);
    }
}

/// Shadows' counts not yet handed over to the store's recorder.
#[derive(Default)]
struct Unwritten(HashMap<(Arc<str>, DecisionKind), Tally>);

impl Unwritten {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn add(&mut self, job: Arc<str>, kind: DecisionKind, tally: Tally) {
        self.0.entry((job, kind)).or_default().add(tally);
    }

    /// Hands the counts over if the store is free; keeps them otherwise.
    fn try_hand_over(&mut self, store: &Mutex<Store>, shared: &Shared) {
        let mut store = match store.try_lock() {
            Ok(store) => store,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        self.hand_over(&mut store, shared);
    }

    /// Adds the counts, and the questions skipped meanwhile, to the store's recorder (written
    /// with its next transaction).
    fn hand_over(&mut self, store: &mut Store, shared: &Shared) {
        for ((job, kind), tally) in self.0.drain() {
            store.recorder.shadow(&job, kind, tally);
        }
        let skipped = std::mem::take(&mut *shared.skipped.lock().unwrap_or_else(|p| p.into_inner()));
        for ((job, kind), count) in skipped {
            store.recorder.shadow(&job, kind, Tally { skipped: count, ..Tally::default() });
        }
    }
}

/// Counts not yet written to a shadow's row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub calls: u64,
    pub agreed: u64,
    pub disagreed: u64,
    pub failed: u64,
    pub skipped: u64,
    pub message: Option<String>,
    pub last_disagreement: Option<ShadowDisagreement>,
}

impl Tally {
    fn of(compared: Compared) -> Tally {
        let mut tally = Tally { calls: 1, ..Tally::default() };
        match compared {
            Compared::Agreed => tally.agreed = 1,
            Compared::Disagreed(last) => (tally.disagreed, tally.last_disagreement) = (1, Some(last)),
            Compared::Failed(why) => (tally.failed, tally.message) = (1, Some(why)),
        }
        tally
    }

    pub fn add(&mut self, other: Tally) {
        self.calls += other.calls;
        self.agreed += other.agreed;
        self.disagreed += other.disagreed;
        self.failed += other.failed;
        self.skipped += other.skipped;
        self.message = other.message.or(self.message.take());
        self.last_disagreement = other.last_disagreement.or(self.last_disagreement.take());
    }

    /// Adds the tally to the shadow's row (none: the shadow was removed since).
    pub fn write(&self, tx: &rusqlite::Transaction<'_>, job: &str, kind: DecisionKind) -> rusqlite::Result<()> {
        let last = self.last_disagreement.as_ref().and_then(|d| serde_json::to_string(d).ok());
        tx.prepare_cached(
            "UPDATE shadows SET calls = calls + ?3, agreed = agreed + ?4, disagreed = disagreed + ?5,
                 failed = failed + ?6, skipped = skipped + ?7, message = COALESCE(?8, message),
                 last_disagreement = COALESCE(?9, last_disagreement)
             WHERE job = ?1 AND kind = ?2",
        )?
        .execute(params![
            job,
            kind.as_str(),
            self.calls as i64,
            self.agreed as i64,
            self.disagreed as i64,
            self.failed as i64,
            self.skipped as i64,
            self.message,
            last
        ])?;
        Ok(())
    }
}

/// What a job's shadow of a kind is now: loaded (plugin, digest, config digest), refused with
/// why, or none.
pub enum Loaded<'a> {
    Serving { plugin: &'a str, digest: &'a str, config: &'a str },
    Refused { plugin: &'a str, why: &'a str },
    None,
}

/// Records the job's shadow of `kind` (at start, or after a swap): a new one (another digest or
/// config) starts its counts from zero; the same one keeps them.
pub fn loaded(store: &mut Store, job: &str, kind: DecisionKind, shadow: Loaded<'_>) -> rusqlite::Result<()> {
    let conn = store.conn();
    match shadow {
        Loaded::Serving { plugin, digest, config } => {
            conn.execute(
                "INSERT INTO shadows (job, kind, plugin, digest, config) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (job, kind) DO UPDATE SET plugin = excluded.plugin, digest = excluded.digest,
                     config = excluded.config, message = NULL,
                     calls = CASE WHEN shadows.digest = excluded.digest AND shadows.config = excluded.config
                                  THEN shadows.calls ELSE 0 END,
                     agreed = CASE WHEN shadows.digest = excluded.digest AND shadows.config = excluded.config
                                  THEN shadows.agreed ELSE 0 END,
                     disagreed = CASE WHEN shadows.digest = excluded.digest AND shadows.config = excluded.config
                                  THEN shadows.disagreed ELSE 0 END,
                     failed = CASE WHEN shadows.digest = excluded.digest AND shadows.config = excluded.config
                                  THEN shadows.failed ELSE 0 END,
                     skipped = CASE WHEN shadows.digest = excluded.digest AND shadows.config = excluded.config
                                  THEN shadows.skipped ELSE 0 END,
                     last_disagreement = CASE WHEN shadows.digest = excluded.digest
                                  AND shadows.config = excluded.config THEN shadows.last_disagreement END",
                params![job, kind.as_str(), plugin, digest, config],
            )?;
        }
        Loaded::Refused { plugin, why } => {
            conn.execute(
                "INSERT INTO shadows (job, kind, plugin, digest, config, message) VALUES (?1, ?2, ?3, '', '', ?4)
                 ON CONFLICT (job, kind) DO UPDATE SET plugin = excluded.plugin, digest = '', config = '',
                     message = excluded.message, calls = 0, agreed = 0, disagreed = 0, failed = 0, skipped = 0,
                     last_disagreement = NULL",
                params![job, kind.as_str(), plugin, format!("not loaded: {why}")],
            )?;
        }
        Loaded::None => {
            conn.execute("DELETE FROM shadows WHERE job = ?1 AND kind = ?2", params![job, kind.as_str()])?;
        }
    }
    Ok(())
}

/// Every job's shadows as their status shows them: (job, kind, status).
pub fn all(conn: &rusqlite::Connection) -> rusqlite::Result<Vec<(String, String, ShadowStatus)>> {
    let mut statement = conn.prepare(
        "SELECT job, kind, plugin, digest, config, calls, agreed, disagreed, failed, skipped, message,
                last_disagreement
         FROM shadows ORDER BY job, kind",
    )?;
    let rows = statement.query_map([], |r| {
        let last: Option<String> = r.get(11)?;
        let count = |i: usize| r.get::<_, i64>(i).map(|n| n.max(0) as u64);
        Ok((
            r.get(0)?,
            r.get(1)?,
            ShadowStatus {
                plugin: r.get(2)?,
                digest: r.get(3)?,
                config: r.get(4)?,
                calls: count(5)?,
                agreed: count(6)?,
                disagreed: count(7)?,
                failed: count(8)?,
                skipped: count(9)?,
                message: r.get(10)?,
                last_disagreement: last.and_then(|text| serde_json::from_str(&text).ok()),
            },
        ))
    })?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Job `ml/a`'s shadows: a trigger and a splitter (built-ins).
    fn shadows_of_a() -> Shadows {
        fn load<K: perennial_policy::Kind>(name: &str, config: serde_json::Value) -> Arc<perennial_policy::Policy<K>> {
            let reference = perennial_policy::PolicyRef::new(format!("builtin:{name}")).with_config(config);
            let bytes = perennial_policy::builtin::component(name).unwrap();
            let events = Arc::new(perennial_policy::TracingEvents { job: "ml/a".into() });
            let host = perennial_policy::PolicyHost::new(None, None).unwrap();
            Arc::new(host.load_bytes::<K>(&reference.validate().unwrap(), bytes, events).unwrap())
        }
        Shadows {
            job: "ml/a".into(),
            trigger: Some(load(
                "threshold-trigger",
                serde_json::json!({"condition": {"operator": ">", "threshold": 9}}),
            )),
            splitter: Some(load("ratio-split", serde_json::json!({"trainProb": 0.8}))),
            selector: None,
        }
    }

    #[test]
    fn a_kind_without_a_shadow_is_not_handed_over() {
        let (queue, _worker) = queue(); // nobody serves it
        let only_trigger = Shadows { splitter: None, ..shadows_of_a() };
        let batch = SampleBatch::from_lines(0, &["a"]).unwrap();
        for _ in 0..QUEUE + 1 {
            queue.ask(&only_trigger, Question::Split { batch: batch.clone(), assignments: vec![0] }, 0);
        }
        assert!(skipped(&queue).is_empty(), "nothing queued, nothing skipped");
        assert_eq!(queue.shared.queued_bytes.load(Ordering::Relaxed), 0);
    }

    fn skipped(queue: &ShadowQueue) -> HashMap<(String, DecisionKind), u64> {
        queue.shared.skipped.lock().unwrap().clone()
    }

    #[test]
    fn the_loop_never_waits_a_full_queue_skips_and_counts() {
        let (queue, _worker) = queue(); // nobody serves it
        let shadows = shadows_of_a();
        for pending in 0..QUEUE as u64 + 6 {
            let stats = TriggerStats { pending_train: pending, ..TriggerStats::default() };
            queue.ask(&shadows, Question::Trigger { stats, train: false }, 0);
            if pending == 100 {
                // A turn handed over and not yet answered still counts as waiting.
                queue.loop_waits();
                queue.loop_busy();
            }
        }
        assert_eq!(skipped(&queue), HashMap::from([(("ml/a".to_owned(), DecisionKind::Trigger), 6)]));
    }

    #[test]
    fn batches_waiting_are_bounded_in_bytes() {
        let (queue, _worker) = queue();
        let line = "x".repeat(1 << 20);
        let batch = SampleBatch::from_lines(0, &[line.as_str(); 6]).unwrap(); // 6 MiB
        let shadows = shadows_of_a();
        for _ in 0..3 {
            let question = Question::Split { batch: batch.clone(), assignments: vec![0; 6] };
            queue.ask(&shadows, question, 0);
        }
        // Two fit in 16 MiB; the third is skipped, and its bytes are not counted as waiting.
        assert_eq!(skipped(&queue), HashMap::from([(("ml/a".to_owned(), DecisionKind::Splitter), 1)]));
        assert_eq!(queue.shared.queued_bytes.load(Ordering::Relaxed), 2 * batch.byte_len());
    }

    /// A store in a temporary directory, where job `ml/a` has a trigger shadow.
    fn store_with_a_trigger_shadow() -> (tempfile::TempDir, Mutex<Store>) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("edge.db")).unwrap();
        crate::register_job(&mut store, "ml/a", "uid", &crate::JobSpec::default()).unwrap();
        let config = Loaded::Serving { plugin: "builtin:threshold-trigger", digest: "d", config: "c" };
        loaded(&mut store, "ml/a", DecisionKind::Trigger, config).unwrap();
        (dir, Mutex::new(store))
    }

    #[test]
    fn the_shadows_thread_answers_while_the_loop_holds_the_store() {
        let (_dir, store) = store_with_a_trigger_shadow();
        let (queue, worker) = queue();
        let (asked, shadows) = (QUEUE as u64 + 64, shadows_of_a());
        std::thread::scope(|scope| {
            let held = store.lock().unwrap(); // the loop, deciding all along
            scope.spawn(|| worker.serve(&store));
            for pending in 0..asked {
                // A turn of one question, then a wait (with the store held all along).
                queue.loop_busy();
                let stats = TriggerStats { pending_train: pending, ..TriggerStats::default() };
                queue.ask(&shadows, Question::Trigger { stats, train: pending > 9 }, 0);
                queue.loop_waits();
                std::thread::sleep(Duration::from_millis(2));
            }
            // More than the queue holds went through: the thread did not stop at the lock.
            assert!(skipped(&queue).is_empty(), "skipped while the store was held: {:?}", skipped(&queue));
            drop(held);
            drop(queue);
        });
        let mut store = store.into_inner().unwrap();
        store.flush_records().unwrap();
        let (_, _, status) = all(store.conn()).unwrap().pop().unwrap();
        assert_eq!((status.calls, status.agreed, status.skipped), (asked, asked, 0));
    }

    #[test]
    fn a_shadow_answers_only_while_the_loop_waits() {
        let (_dir, store) = store_with_a_trigger_shadow();
        let calls = || {
            let mut store = store.lock().unwrap();
            store.flush_records().unwrap();
            all(store.conn()).unwrap().pop().unwrap().2.calls
        };
        let (queue, worker) = queue();
        let shadows = shadows_of_a();
        std::thread::scope(|scope| {
            // A turn's question is handed over when the loop waits; the next turn starts before
            // the thread has taken it: the thread holds a question, and must not call yet.
            queue.loop_busy();
            let stats = TriggerStats { pending_train: 3, ..TriggerStats::default() };
            queue.ask(&shadows, Question::Trigger { stats, train: false }, 0);
            queue.loop_waits();
            queue.loop_busy();
            scope.spawn(|| worker.serve(&store));
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(calls(), 0, "a shadow called while the loop was in a turn");
            queue.loop_waits();
            let waited = std::time::Instant::now();
            while calls() == 0 {
                assert!(waited.elapsed() < Duration::from_secs(10), "the shadow never answered once the loop waited");
                std::thread::sleep(Duration::from_millis(10));
            }
            queue.loop_busy();
            drop(queue); // the loop stops: the thread ends even in a turn
        });
        assert_eq!(calls(), 1);
    }

    #[test]
    fn counts_add_up_and_keep_the_latest_fault_and_disagreement() {
        let mut tally = Tally::of(Compared::Agreed);
        tally.add(Tally::of(Compared::Failed("timed out after 100 ms".into())));
        let last = ShadowDisagreement { answer: "wait".into(), shadow_answer: "train".into(), ..Default::default() };
        tally.add(Tally::of(Compared::Disagreed(last.clone())));
        tally.add(Tally { skipped: 2, ..Tally::default() });
        assert_eq!((tally.calls, tally.agreed, tally.failed, tally.disagreed, tally.skipped), (3, 1, 1, 1, 2));
        assert_eq!(tally.message.as_deref(), Some("timed out after 100 ms"));
        assert_eq!(tally.last_disagreement, Some(last));
    }
}
