//! A dataset index on S3: stat + ranged reads from the last offset, against a real S3 server on
//! 127.0.0.1; round files for a remote txt dataset come with `dataIndex.txt`.

use std::sync::{Arc, Mutex};

use crate::support::s3::S3Server;
use perennial_edge::rounds::{self, Clock, Index, Outcome, OutputDir};
use perennial_edge::sqlite::Store;
use perennial_edge::{self as edge, IngestLimits, JobSpec, S3Index, Split};
use perennial_policy::{PolicyHost, PolicyRef, TracingEvents, TriggerKind, builtin};

const JOB: &str = "default/s3-job";

fn lines(from: usize, n: usize) -> String {
    (from..from + n).map(|i| format!("images/{i}.jpg {}\n", i % 2)).collect()
}

#[test]
fn an_s3_index_is_tailed_by_ranged_reads_and_round_files_carry_a_data_index() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(S3Server::start());
    let _guard = rt.enter();
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&dir.path().join("edge.db")).unwrap();
    edge::register_job(&mut store, JOB, "uid", &JobSpec::default()).unwrap();
    let store = Mutex::new(store);
    let url = "s3://datasets/thermal/index.txt";
    let mut index = S3Index::open(url, Some(&server.credentials())).unwrap();
    let split = Split { policy: None, train_prob: 0.8, shadow: None };
    let ingest = |store: &Mutex<Store>, index: &mut S3Index| {
        edge::ingest(store, JOB, index, false, &split, IngestLimits::default()).unwrap()
    };

    // Missing, then present, then grown (an S3 "append" rewrites the object).
    assert_eq!(ingest(&store, &mut index).state, edge::FileState::Missing);
    server.put("datasets", "thermal/index.txt", lines(0, 10).as_bytes());
    assert_eq!(ingest(&store, &mut index).samples, 10);
    let grown = format!("{}{}half", lines(0, 10), lines(10, 5));
    server.put("datasets", "thermal/index.txt", grown.as_bytes());
    assert_eq!(ingest(&store, &mut index).samples, 5, "only the new complete lines");
    let seqs: Vec<u64> = edge::batches(&store.lock().unwrap(), JOB).unwrap().iter().map(|b| b.first_seq).collect();
    assert_eq!(seqs, [0, 10]);

    // A round: the train file and, for a remote txt dataset, dataIndex.txt (base URL, then files).
    let output = dir.path().join("output");
    let op = opendal::blocking::Operator::new(edge::output::output_operator(output.to_str().unwrap(), None).unwrap())
        .unwrap();
    let valid = PolicyRef::new("builtin:threshold-trigger")
        .with_config(serde_json::json!({"condition": {"operator": ">", "threshold": 0}}))
        .validate()
        .unwrap();
    let trigger = PolicyHost::new(None, None)
        .unwrap()
        .load_bytes::<TriggerKind>(
            &valid,
            builtin::component("threshold-trigger").unwrap(),
            Arc::new(TracingEvents { job: JOB.into() }),
        )
        .unwrap();
    let mut index_ref = Index { file: &mut index, csv: false, url, max_line: 1 << 20 };
    let out = OutputDir { url: output.to_str().unwrap(), op: &op };
    let clock = Clock { now: 1_700_000_000, utc_offset_secs: 0 };
    let Outcome::Reported(report) =
        rounds::train_waiting(&store, JOB, &mut index_ref, &out, &trigger, clock, None).unwrap()
    else {
        panic!("the trigger fires on any sample");
    };
    let input = report.input.unwrap();
    assert_eq!(
        input.data_index_url.as_deref(),
        Some(format!("{}/data/train/1/dataIndex.txt", output.display()).as_str())
    );
    let data = std::fs::read_to_string(output.join("data/train/1/data.txt")).unwrap();
    assert_eq!(data.lines().count(), 12, "trainProb 0.8 of the 15 samples, counted over the stream");
    let data_index = std::fs::read_to_string(output.join("data/train/1/dataIndex.txt")).unwrap();
    let mut data_index = data_index.lines();
    assert_eq!(data_index.next(), Some("s3://datasets/thermal"));
    // Sample k trains when ⌊0.8(k+1)⌋ > ⌊0.8k⌋: sample 0 goes to eval, sample 1 is the first to train.
    assert_eq!(data_index.next(), Some("images/1.jpg"));
    assert_eq!(data_index.count(), 11);

    // A shrunk index starts over.
    server.put("datasets", "thermal/index.txt", lines(100, 3).as_bytes());
    let shrunk = ingest(&store, &mut index);
    assert!(shrunk.restarted.as_deref().unwrap().contains("shrank"), "{shrunk:?}");
    assert_eq!(shrunk.samples, 3);
}
