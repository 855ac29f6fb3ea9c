//! The edge's ingest against real files, a real SQLite file and the real Wasm splitter.

use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};

use perennial_edge::sqlite::Store;
use perennial_edge::{self as edge, FileState, IngestError, IngestLimits, LocalFile, Split, report};
use perennial_policy::{OnError, PolicyHost, PolicyRef, SplitterKind, SplitterPolicy, TracingEvents, builtin};

const JOB: &str = "default/thermal";

fn splitter(plugin: &str, config: serde_json::Value, on_error: OnError) -> SplitterPolicy {
    let mut reference = PolicyRef::new(plugin).with_config(config);
    reference.on_error = on_error;
    let valid = reference.validate().unwrap();
    let bytes = match &valid.source {
        perennial_policy::Source::Builtin(name) => builtin::component(name).unwrap().to_vec(),
        other => std::fs::read(other.to_string()).unwrap(),
    };
    PolicyHost::new(None, None)
        .unwrap()
        .load_bytes::<SplitterKind>(&valid, &bytes, Arc::new(TracingEvents { job: JOB.into() }))
        .unwrap()
}

fn sedna_split() -> SplitterPolicy {
    splitter("builtin:ratio-split", serde_json::json!({"trainProb": 0.8}), OnError::Fallback)
}

struct Fixture {
    dir: tempfile::TempDir,
    store: Mutex<Store>,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("state.db")).unwrap();
        edge::register_job(&mut store, JOB, "uid-1", &edge::JobSpec::default()).unwrap();
        Fixture { dir, store: Mutex::new(store) }
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap()
    }

    fn index(&self) -> std::path::PathBuf {
        self.dir.path().join("index.txt")
    }

    fn append(&self, text: &str) {
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(self.index()).unwrap();
        file.write_all(text.as_bytes()).unwrap();
    }

    fn ingest(&mut self, policy: &SplitterPolicy, csv: bool) -> Result<edge::Ingested, IngestError> {
        let mut file = LocalFile { path: self.index() };
        let split = Split { policy: Some(policy), train_prob: 0.8, shadow: None };
        edge::ingest(
            &self.store,
            JOB,
            &mut file,
            csv,
            &split,
            IngestLimits { max_line: 64, batch_bytes: 4096, ..IngestLimits::default() },
        )
    }

    fn reopen(self) -> Fixture {
        let Fixture { dir, store } = self;
        drop(store);
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        Fixture { dir, store: Mutex::new(store) }
    }
}

/// Every committed sample sequence number, in order, with its assignment byte.
fn committed(store: &Store) -> Vec<(u64, u8)> {
    edge::batches(store, JOB)
        .unwrap()
        .iter()
        .flat_map(|b| b.assignments.iter().enumerate().map(move |(i, a)| (b.first_seq + i as u64, *a)))
        .collect()
}

fn lines(n: usize, from: usize) -> String {
    (from..from + n).map(|i| format!("images/{i}.jpg {}\n", i % 3)).collect()
}

#[test]
fn a_missing_index_is_a_waiting_state_until_it_appears() {
    let mut f = Fixture::new();
    let policy = sedna_split();
    let waiting = f.ingest(&policy, false).unwrap();
    assert_eq!(waiting.state, FileState::Missing);
    assert_eq!(waiting.samples, 0);
    f.append(&lines(10, 0));
    let read = f.ingest(&policy, false).unwrap();
    assert_eq!((read.state, read.samples, read.batches), (FileState::Present, 10, 1));
    // Sedna's rule on the batch: 8 train, 2 eval.
    assert_eq!(committed(&f.store()).iter().filter(|(_, a)| *a == 0).count(), 8);
}

#[test]
fn partial_lines_wait_crlf_is_handled_and_long_lines_are_refused_by_number() {
    let mut f = Fixture::new();
    let policy = sedna_split();
    f.append("a\r\nb\r\nc");
    assert_eq!(f.ingest(&policy, false).unwrap().samples, 2);
    f.append(&format!("\r\n{}\r\nd\n", "x".repeat(100)));
    let next = f.ingest(&policy, false).unwrap();
    assert_eq!(next.samples, 2, "c and d");
    let index = f.index().display().to_string();
    assert_eq!(next.refused, [format!("{index}: line 4 is 100 bytes, over the limit")]);
    let refused: i64 = f.store().conn().query_row("SELECT refused FROM jobs", [], |r| r.get(0)).unwrap();
    assert_eq!(refused, 1, "refused lines are counted");
    assert_eq!(committed(&f.store()).iter().map(|(seq, _)| *seq).collect::<Vec<_>>(), [0, 1, 2, 3]);
}

#[test]
fn the_csv_header_is_kept_and_not_counted() {
    let mut f = Fixture::new();
    let policy = sedna_split();
    f.append("temperature,humidity,label\n21.5,40,1\n22.0,41,0\n");
    assert_eq!(f.ingest(&policy, true).unwrap().samples, 2);
    assert_eq!(edge::header(&f.store(), JOB).unwrap().as_deref(), Some("temperature,humidity,label"));
}

#[test]
fn a_restart_resumes_exactly_where_the_last_commit_left() {
    let mut f = Fixture::new();
    let policy = sedna_split();
    f.append(&lines(500, 0));
    assert_eq!(f.ingest(&policy, false).unwrap().samples, 500);
    f.append(&lines(250, 500));
    f.append("half a li");
    let mut f = f.reopen();
    assert_eq!(f.ingest(&policy, false).unwrap().samples, 250);
    f.append("ne\n");
    let mut f = f.reopen();
    assert_eq!(f.ingest(&policy, false).unwrap().samples, 1);
    let seqs: Vec<u64> = committed(&f.store()).iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (0..751).collect::<Vec<_>>(), "every sample exactly once, in order");
    // Batches hold the byte ranges the lines can be read back from.
    let batches = edge::batches(&f.store(), JOB).unwrap();
    let text = std::fs::read_to_string(f.index()).unwrap();
    let last = batches.last().unwrap();
    assert_eq!(&text[last.start as usize..last.end as usize], "half a line");
}

#[test]
fn a_shrunk_or_replaced_index_starts_over_and_says_so() {
    let mut f = Fixture::new();
    let policy = sedna_split();
    f.append(&lines(20, 0));
    f.ingest(&policy, false).unwrap();
    std::fs::write(f.index(), lines(5, 100)).unwrap();
    let shrunk = f.ingest(&policy, false).unwrap();
    assert!(shrunk.restarted.as_deref().unwrap().contains("shrank from"), "{shrunk:?}");
    assert_eq!(shrunk.samples, 5);
    let seqs: Vec<u64> = committed(&f.store()).iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (20..25).collect::<Vec<_>>(), "old batches forgotten, sequence numbers go on");

    // Replaced by another file at the same path, even a longer one.
    let replacement = f.dir.path().join("new.txt");
    std::fs::write(&replacement, lines(40, 200)).unwrap();
    std::fs::rename(&replacement, f.index()).unwrap();
    let replaced = f.ingest(&policy, false).unwrap();
    assert!(replaced.restarted.as_deref().unwrap().contains("replaced"), "{replaced:?}");
    assert_eq!(replaced.samples, 40);
}

/// The same data under another identity (a state dir copied, so every file has a new inode; a
/// file rewritten with the same lines first) is read on from the cursor: nothing is counted
/// twice, and what is new after it is read once.
#[test]
fn a_copied_or_rewritten_index_with_the_same_samples_is_not_read_again() {
    let mut f = Fixture::new();
    let policy = sedna_split();
    f.append(&lines(30, 0));
    assert_eq!(f.ingest(&policy, false).unwrap().samples, 30);

    // Copied over itself (a new inode), with 5 new lines after the ones read.
    let copy = f.dir.path().join("copy.txt");
    std::fs::write(&copy, lines(35, 0)).unwrap();
    std::fs::rename(&copy, f.index()).unwrap();
    let moved = f.ingest(&policy, false).unwrap();
    assert!(moved.restarted.as_deref().unwrap().contains("holds the samples already read"), "{moved:?}");
    assert_eq!(moved.samples, 5, "only the new lines");
    let seqs: Vec<u64> = committed(&f.store()).iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (0..35).collect::<Vec<_>>());

    // Replaced by a file with other lines where the last batch was: another file, read anew.
    std::fs::write(&copy, lines(40, 500)).unwrap();
    std::fs::rename(&copy, f.index()).unwrap();
    let other = f.ingest(&policy, false).unwrap();
    assert!(other.restarted.as_deref().unwrap().contains("reading it again from the start"), "{other:?}");
    assert_eq!(other.samples, 40);
}

/// An index cut short that still begins with what was read (its last lines removed) is read on
/// from its new end: the samples left were counted already, and the ones cut off are forgotten.
#[test]
fn an_index_cut_short_is_not_read_again() {
    let mut f = Fixture::new();
    let policy = sedna_split();
    for from in [0, 10, 20] {
        f.append(&lines(10, from));
        assert_eq!(f.ingest(&policy, false).unwrap().samples, 10);
    }
    let text = std::fs::read_to_string(f.index()).unwrap();
    let fifteen: usize = text.lines().take(15).map(|l| l.len() + 1).sum();
    std::fs::OpenOptions::new().write(true).open(f.index()).unwrap().set_len(fifteen as u64).unwrap();
    let cut = f.ingest(&policy, false).unwrap();
    assert!(cut.restarted.as_deref().unwrap().contains("begins with the samples already read"), "{cut:?}");
    assert_eq!(cut.samples, 0, "nothing read again");
    let seqs: Vec<u64> = committed(&f.store()).iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (0..10).collect::<Vec<_>>(), "the batches cut into are forgotten");
    f.append(&lines(5, 100));
    assert_eq!(f.ingest(&policy, false).unwrap().samples, 5, "what comes after is read once");
    let seqs: Vec<u64> = committed(&f.store()).iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs[10..], [30, 31, 32, 33, 34]);
}

#[test]
fn a_failing_splitter_falls_back_to_sednas_rule_or_holds() {
    let hostile = builtin::built_plugin_path("hostile-splitter").unwrap();
    let mut f = Fixture::new();
    f.append(&lines(10, 0));
    let falling_back = splitter(hostile, serde_json::json!({"behaviour": "wrong-length"}), OnError::Fallback);
    let read = f.ingest(&falling_back, false).unwrap();
    assert!(read.fell_back.is_some());
    assert_eq!(committed(&f.store()).iter().filter(|(_, a)| *a == 0).count(), 8, "trainProb 0.8 on 10");

    let holding = splitter(hostile, serde_json::json!({"behaviour": "bad-byte"}), OnError::Hold);
    f.append(&lines(10, 10));
    let err = f.ingest(&holding, false).unwrap_err();
    assert!(matches!(err, IngestError::Held(_)), "{err}");
    assert_eq!(committed(&f.store()).len(), 10, "nothing of the held batch was committed");
    // A healthy splitter then takes the same samples, once.
    assert_eq!(f.ingest(&sedna_split(), false).unwrap().samples, 10);
    assert_eq!(committed(&f.store()).len(), 20);
}

#[test]
fn a_job_recreated_under_the_same_name_starts_fresh() {
    let mut f = Fixture::new();
    f.append(&lines(10, 0));
    f.ingest(&sedna_split(), false).unwrap();
    edge::register_job(&mut f.store(), JOB, "uid-1", &edge::JobSpec { train_prob: 0.5, ..edge::JobSpec::default() })
        .unwrap();
    assert_eq!(committed(&f.store()).len(), 10, "a spec update keeps the state");
    edge::register_job(&mut f.store(), JOB, "uid-2", &edge::JobSpec::default()).unwrap();
    assert!(committed(&f.store()).is_empty());
    assert_eq!(f.ingest(&sedna_split(), false).unwrap().samples, 10);
}

#[test]
fn the_dataset_sample_count_is_kept_for_its_status() {
    let mut f = Fixture::new();
    let spec = edge::JobSpec { dataset: "default/thermal-data".into(), ..edge::JobSpec::default() };
    edge::register_job(&mut f.store(), JOB, "uid-1", &spec).unwrap();
    f.append(&lines(7, 0));
    f.ingest(&sedna_split(), false).unwrap();
    assert_eq!(report::dataset_updates(&f.store()).unwrap(), [("default/thermal-data".to_owned(), 7)]);
    report::dataset_reported(&mut f.store(), "default/thermal-data", 7).unwrap();
    assert!(report::dataset_updates(&f.store()).unwrap().is_empty());
    f.append(&lines(3, 7));
    f.ingest(&sedna_split(), false).unwrap();
    assert_eq!(report::dataset_updates(&f.store()).unwrap(), [("default/thermal-data".to_owned(), 10)]);
}

/// A job that comes to a running loop (as the link's desired state adds them) is woken by the
/// change notification on its index, not only by the stat fallback: new samples are committed
/// well within the fallback's period.
#[test]
fn a_job_added_to_the_running_loop_is_woken_by_the_change_notification() {
    use perennial_edge::agent::{self, JobConfig, LoopSettings, Wake};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    let f = Fixture::new();
    f.append("");
    let output = f.dir.path().join("output");
    let job: JobConfig = serde_json::from_value(serde_json::json!({
        "name": JOB, "uid": "uid-1",
        "spec": {"datasetUrl": f.index(), "datasetFormat": "txt", "outputDir": output, "trainProb": 0.8},
        "trigger": {"plugin": "builtin:threshold-trigger",
                    "config": {"checkPeriodSeconds": 60, "condition": {"operator": ">=", "threshold": 1000}}}
    }))
    .unwrap();
    let store = Arc::new(Mutex::new(Store::open(&f.dir.path().join("state.db")).unwrap()));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let policies = rt.block_on(agent::load_policies(&PolicyHost::new(None, None).unwrap(), &job)).unwrap();
    let output_dir = output.display().to_string();
    let op = {
        let _guard = rt.enter();
        let output = edge::output::output_operator(&output_dir, None).unwrap();
        opendal::blocking::Operator::new(output).unwrap()
    };
    let runner = agent::JobRunner {
        job,
        policies,
        index: Box::new(LocalFile { path: f.index() }),
        output: op,
        copy_model: perennial_edge::model_copy::model_copier(rt.handle().clone(), None, output_dir, vec![]),
        // The stat fallback is a minute away: only the change notification can be this quick.
        settings: LoopSettings { poll: Duration::from_secs(60), ..LoopSettings::default() },
    };
    let wakes = agent::Wakes::new();
    let wake = wakes.sender();
    let stop = Arc::new(AtomicBool::new(false));
    let jobs = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || agent::run_jobs(&store, &mut Vec::new(), &stop, wakes, &|| {}, None))
    };
    wake.send(Wake::Add(Box::new(runner))).unwrap();
    // Its first look (the index empty), then the loop waits.
    std::thread::sleep(Duration::from_millis(500));
    f.append(&lines(10, 0));
    let appended = Instant::now();
    while committed(&store.lock().unwrap()).len() < 10 {
        assert!(appended.elapsed() < Duration::from_secs(10), "the new samples were not seen at once");
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    jobs.join().unwrap();
}
