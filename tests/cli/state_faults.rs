//! What a careless operator or a hostile worker does to a run's state, as the second probe did
//! it (issue #32): a lost or emptied store, reports that repeat with other values, output
//! folders that could never finish a round, a start refused after admission, a worker that
//! lingers after its report, metrics of megabytes, a kernel file where the index was. Each is
//! refused or contained with a message that names what and why, and nothing is trained twice.

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::embedded::{Example, wait_exit};

/// `perennial ARGS`, run to its end.
fn perennial(args: &[&str], state: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The example with round 1 at 150 train samples (quicker rounds).
fn quick_example(edit: impl Fn(&str, String) -> String) -> Example {
    Example::new(move |name, text| edit(name, text.replace("threshold: 200", "threshold: 150")))
}

/// The stored objects' keys (none when there is no control.db).
fn stored_keys(state: &Path) -> Vec<String> {
    let Ok(db) = rusqlite::Connection::open_with_flags(
        state.join("control.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    ) else {
        return Vec::new();
    };
    let Ok(mut statement) = db.prepare("SELECT kind || ' ' || key FROM objects ORDER BY 1") else { return Vec::new() };
    statement.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
}

/// The rows of every train round file, by round.
fn train_rows(example: &Example) -> Vec<(u64, Vec<String>)> {
    let mut rounds = Vec::new();
    for entry in std::fs::read_dir(example.output().join("data/train")).unwrap() {
        let round: u64 = entry.unwrap().file_name().to_str().unwrap().parse().unwrap();
        rounds.push((round, example.rows(&format!("data/train/{round}/data.csv"))));
    }
    rounds.sort();
    rounds
}

fn copy_stores(from: &Path, to: &Path, name: &str) {
    std::fs::create_dir_all(to).unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let file = from.join(format!("{name}{suffix}"));
        if file.exists() {
            std::fs::copy(&file, to.join(format!("{name}{suffix}"))).unwrap();
        }
    }
}

fn remove_store(state: &Path, name: &str) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(state.join(format!("{name}{suffix}")));
    }
}

#[test]
fn a_lost_or_emptied_edge_store_is_refused_never_started_over() {
    let example = quick_example(|_, text| text);
    let out = wait_exit(&mut example.start(&["--rounds", "2"]), Duration::from_secs(180));
    assert!(out.status.success(), "{}", stderr(&out));
    let backup = example.root.path().join("backup");
    copy_stores(&example.state, &backup, "edge.db");

    // Removed, then emptied: each refused at once, naming the store, the job and its round,
    // and what to do; nothing is created in its place, and the job's status is as it was.
    let status_before = example.live_status().unwrap();
    for (what, damage) in [("removed", false), ("emptied", true)] {
        remove_store(&example.state, "edge.db");
        if damage {
            std::fs::write(example.state.join("edge.db"), b"").unwrap();
        }
        let out = wait_exit(&mut example.start(&["--rounds", "3"]), Duration::from_secs(60));
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{what}: {said}");
        for part in ["edge.db is missing or empty", "default/thermal-comfort (round 2)", "backup", "perennial delete"] {
            assert!(said.contains(part), "{what}: {part:?} in {said}");
        }
        assert_eq!(std::fs::metadata(example.state.join("edge.db")).map(|m| m.len()).unwrap_or(0), 0, "{what}");
        assert_eq!(example.live_status().unwrap(), status_before, "{what}: the status changed");
        // `perennial status` says it too, before control.db's view.
        let status = perennial(&["status"], &example.state);
        assert!(stderr(&status).contains("edge.db is missing or empty"), "{what}: {}", stderr(&status));
    }

    // Put back from the backup, the job goes on: round 3 takes no sample of rounds 1 and 2.
    remove_store(&example.state, "edge.db");
    copy_stores(&backup, &example.state, "edge.db");
    let out = wait_exit(&mut example.start(&["--rounds", "3"]), Duration::from_secs(180));
    assert!(out.status.success(), "{}", stderr(&out));
    let rounds = train_rows(&example);
    assert_eq!(rounds.iter().map(|(r, _)| *r).collect::<Vec<_>>(), [1, 2, 3]);
    let earlier: HashSet<&String> = rounds[0].1.iter().chain(&rounds[1].1).collect();
    let again = rounds[2].1.iter().filter(|row| earlier.contains(row)).count();
    assert_eq!(again, 0, "round 3 trained again on {again} samples of rounds 1-2");
}

#[test]
fn a_control_store_lost_beside_an_edge_that_ran_is_refused() {
    let example = quick_example(|_, text| text);
    let out = wait_exit(&mut example.start(&["--rounds", "1"]), Duration::from_secs(180));
    assert!(out.status.success(), "{}", stderr(&out));
    remove_store(&example.state, "control.db");
    // Given the manifests again, the job would be a new one (a new uid) over the edge's history.
    let out = wait_exit(&mut example.start(&["--rounds", "2"]), Duration::from_secs(60));
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("control.db does not know default/thermal-comfort (round 1)"), "{said}");
    assert!(stored_keys(&example.state).is_empty(), "stored although refused: {:?}", stored_keys(&example.state));
}

/// An eval worker that reports five times: a 2 MB report of 95,001 metrics, one of 5,000, then
/// accuracy 0.5, then 0.99, then `failed`; it prints what each got.
const REPEATING_EVAL: &str = r#"
import json, os, sys, urllib.request, urllib.error
sys.dont_write_bytecode = True
model = os.environ["MODEL_URLS"].split(";")[0]
url = f'{os.environ["LC_SERVER"]}/sedna/workers/{os.environ["WORKER_NAME"]}/info'
def post(label, status, metrics):
    body = {"name": os.environ["WORKER_NAME"], "namespace": "default", "ownerName": os.environ["JOB_NAME"],
            "ownerKind": "lifelonglearningjob", "kind": "eval", "status": status,
            "results": [{"format": "json", "url": model, "metrics": metrics}] if status == "completed" else []}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            print(f"{label}: {reply.status}", flush=True)
    except urllib.error.HTTPError as err:
        print(f"{label}: {err.code} {err.read().decode()}", flush=True)
post("huge", "completed", {f"m{i}": i for i in range(95001)})
post("ctrl", "completed", {"\x1b[31mRED\x1b[0m": 1, "line\nbreak": 2})
post("many", "completed", {f"m{i}": 0.5 for i in range(5000)})
post("first", "completed", {"accuracy": 0.5})
post("second", "completed", {"accuracy": 0.99})
post("failed", "failed", None)
"#;

#[test]
fn a_stage_takes_its_first_report_and_metrics_are_bounded() {
    let example = quick_example(|name, text| {
        if name == "job.yaml" {
            text.replace("command: [\"python3\", \"eval.py\"]", "command: [\"python3\", \"repeating_eval.py\"]")
        } else {
            text
        }
    });
    std::fs::write(example.manifests.join("repeating_eval.py"), REPEATING_EVAL).unwrap();
    let out = wait_exit(&mut example.start(&["--rounds", "1"]), Duration::from_secs(180));
    assert!(out.status.success(), "{}", stderr(&out));

    let logs = example.state.join("logs/default/thermal-comfort");
    let eval_log = std::fs::read_dir(&logs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with("0001-eval"))
        .expect("the eval worker's log");
    let said = std::fs::read_to_string(&eval_log).unwrap();
    let got = |label: &str| said.lines().find(|l| l.starts_with(&format!("{label}: "))).unwrap_or_default().to_owned();
    assert!(got("huge").starts_with("huge: 413") && got("huge").contains("at most 256 KiB"), "{said}");
    assert!(got("ctrl").starts_with("ctrl: 400") && got("ctrl").contains("control character"), "{said}");
    assert!(
        got("many").contains("400") && got("many").contains("results[0].metrics: 5000 metrics, at most 64"),
        "{said}"
    );
    assert_eq!(got("first"), "first: 200", "{said}");
    assert!(got("second").starts_with("second: 409") && got("second").contains("already reported completed"), "{said}");
    assert!(got("failed").starts_with("failed: 409"), "{said}");

    // The deploy was decided on the report the stage took, and the status shows it.
    let status = example.status();
    let deployed = &status[0]["status"]["deployed"];
    assert_eq!(deployed["metrics"]["accuracy"], 0.5, "{status:#}");
    let selected: Vec<serde_json::Value> =
        example.decisions("default/thermal-comfort").into_iter().filter(|d| d["kind"] == "selector").collect();
    assert_eq!(selected.len(), 1, "{selected:?}");
    assert_eq!(selected[0]["input"]["candidates"][0]["metrics"]["accuracy"], 0.5, "{selected:?}");
    // And the table shows, whatever the metrics were.
    let table = perennial(&["status"], &example.state);
    assert!(table.status.success(), "{}", stderr(&table));
}

#[test]
fn output_folders_that_could_never_finish_a_round_are_refused_at_admission() {
    let example = quick_example(|_, text| text);
    let file = example.root.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let cases: Vec<(String, &str)> = vec![
        ("../x".into(), "has a `..`"),
        ("/a/../b".into(), "has a `..`"),
        ("/".into(), "the filesystem's root, a system folder"),
        ("/etc/perennial-out".into(), "the filesystem's root, a system folder"),
        ("/proc/self".into(), "the filesystem's root, a system folder"),
        ("/tmp".into(), "or one all share"),
        (".".into(), "holds the state dir"),
        (file.display().to_string(), "is not a folder"),
        (file.join("inside").display().to_string(), "is not a folder"),
    ];
    for (output_dir, says) in cases {
        let job = std::fs::read_to_string(example.manifests.join("job.yaml"))
            .unwrap()
            .replace("outputDir: output/thermal-comfort", &format!("outputDir: {output_dir:?}"));
        let bad = example.root.path().join("bad");
        std::fs::create_dir_all(&bad).unwrap();
        for name in ["dataset.yaml", "train.py", "eval.py", "inference.py", "sedna_worker.py"] {
            std::fs::copy(example.manifests.join(name), bad.join(name)).unwrap();
        }
        std::fs::write(bad.join("job.yaml"), job).unwrap();
        let out = perennial(&["run", bad.to_str().unwrap(), "--rounds", "1"], &example.state);
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{output_dir}: {said}");
        assert!(said.contains("spec.outputDir") && said.contains(says), "{output_dir}: {says:?} in {said}");
        assert!(stored_keys(&example.state).is_empty(), "{output_dir}: stored {:?}", stored_keys(&example.state));
    }
    assert!(!Path::new("/.perennial-tmp").exists(), "a run wrote at the filesystem's root");
}

#[test]
fn a_start_refused_after_the_manifests_are_read_stores_nothing() {
    let example = quick_example(|_, text| text);
    // The worker API's port in use.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out =
        perennial(&["run", example.manifests.to_str().unwrap(), "--rounds", "1", "--bind-port", &port], &example.state);
    let said = stderr(&out);
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(said.contains(&format!("127.0.0.1:{port}")), "{said}");
    assert!(stored_keys(&example.state).is_empty(), "stored although refused: {:?}", stored_keys(&example.state));
    assert!(!example.state.exists(), "a refused run left the state dir it made");

    // An S3 dataset without credentials.
    let s3 = example.root.path().join("s3");
    std::fs::create_dir_all(&s3).unwrap();
    for name in ["job.yaml", "train.py", "eval.py", "inference.py", "sedna_worker.py"] {
        std::fs::copy(example.manifests.join(name), s3.join(name)).unwrap();
    }
    let dataset = std::fs::read_to_string(example.manifests.join("dataset.yaml"))
        .unwrap()
        .replace("url: data/thermal-comfort/index.csv", "url: s3://bucket/thermal/index.csv");
    std::fs::write(s3.join("dataset.yaml"), dataset).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(["run", s3.to_str().unwrap(), "--rounds", "1", "--state-dir"])
        .arg(&example.state)
        .env_remove("S3_ENDPOINT_URL")
        .output()
        .unwrap();
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("s3://bucket/thermal/index.csv") && said.contains("S3 needs credentials"), "{said}");
    assert!(stored_keys(&example.state).is_empty(), "stored although refused: {:?}", stored_keys(&example.state));

    // Nothing to run leaves no state dir behind.
    let empty = example.root.path().join("never-made");
    let out = perennial(&["run"], &empty);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("nothing to run"), "{}", stderr(&out));
    assert!(!empty.exists(), "perennial run made {} with nothing to run", empty.display());
}

/// A train worker that trains, reports, then stays (writes its pid first).
const LINGERING_TRAIN: &str = r#"
import os, runpy, sys, time
sys.dont_write_bytecode = True
sys.argv = ["train.py"]
runpy.run_path("train.py", run_name="__main__")
with open(os.path.join(os.environ["PERENNIAL_STATE_DIR"], "lingering.pids"), "a") as f:
    f.write(f"{os.getpid()}\n")
time.sleep(600)
"#;

fn alive(pid: u32) -> bool {
    // A zombie is gone as far as work goes.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

#[test]
fn a_worker_that_reports_and_never_exits_is_stopped_when_its_stage_is_done() {
    let example = quick_example(|name, text| {
        if name == "job.yaml" {
            text.replace("command: [\"python3\", \"train.py\"]", "command: [\"python3\", \"lingering_train.py\"]")
        } else {
            text
        }
    });
    std::fs::write(example.manifests.join("lingering_train.py"), LINGERING_TRAIN).unwrap();
    let mut run = example.start(&[]);
    let pids = example.state.join("lingering.pids");
    let deadline = Instant::now() + Duration::from_secs(120);
    let pid: u32 = loop {
        assert!(Instant::now() < deadline, "round 1's train worker never reported");
        assert!(run.try_wait().unwrap().is_none(), "the run ended early");
        if let Some(pid) = std::fs::read_to_string(&pids).ok().and_then(|t| t.lines().next()?.parse().ok()) {
            break pid;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // Its stage is done once it reported: it has the finish grace (10 s) and the stop grace (5 s).
    let reported = Instant::now();
    while alive(pid) {
        assert!(reported.elapsed() < Duration::from_secs(25), "the train worker {pid} outlived its stage");
        assert!(run.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = example.live_status().unwrap();
    assert!(
        status["round"].as_u64() >= Some(1) && status["stage"] != "Train"
            || status["roundsCompleted"].as_u64() >= Some(1),
        "{status:#}"
    );
    run.kill().unwrap();
    run.wait().unwrap();
}

#[test]
fn a_kernel_file_where_the_index_was_is_never_read_as_the_index() {
    let example = quick_example(|_, text| text);
    let out = wait_exit(&mut example.start(&["--rounds", "1"]), Duration::from_secs(180));
    assert!(out.status.success(), "{}", stderr(&out));
    let index = example.state.join("data/thermal-comfort/index.csv");
    let batches = |state: &Path| -> i64 {
        let db = rusqlite::Connection::open(state.join("edge.db")).unwrap();
        db.query_row("SELECT count(*) FROM batches", [], |r| r.get(0)).unwrap()
    };
    let cursor = |state: &Path| -> i64 {
        let db = rusqlite::Connection::open(state.join("edge.db")).unwrap();
        db.query_row("SELECT cursor_offset FROM jobs", [], |r| r.get(0)).unwrap()
    };

    // The job without its generator (it would write into the kernel's file), the index
    // replaced by /proc/self/mem (an empty "regular file") while the run goes on.
    let quiet: PathBuf = example.root.path().join("quiet");
    std::fs::create_dir_all(&quiet).unwrap();
    for name in ["dataset.yaml", "job.yaml", "train.py", "eval.py", "inference.py", "sedna_worker.py"] {
        std::fs::copy(example.manifests.join(name), quiet.join(name)).unwrap();
    }
    // At the start, a kernel file where the index is refuses the run, naming it.
    let aside = index.with_extension("aside");
    std::fs::rename(&index, &aside).unwrap();
    std::os::unix::fs::symlink("/proc/self/mem", &index).unwrap();
    let out = perennial(&["run", quiet.to_str().unwrap(), "--rounds", "2"], &example.state);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("is in /proc, /sys or /dev"), "{}", stderr(&out));
    std::fs::remove_file(&index).unwrap();
    std::fs::rename(&aside, &index).unwrap();

    // While the run goes on, the index replaced by /proc/self/mem (an empty "regular file").
    let log = example.root.path().join("run.log");
    let mut run = Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(["run", quiet.to_str().unwrap(), "--poll-ms", "200", "--state-dir"])
        .arg(&example.state)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log).unwrap().contains("worker report API on") {
        assert!(Instant::now() < deadline, "the run never started: {}", std::fs::read_to_string(&log).unwrap());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::rename(&index, &aside).unwrap();
    std::os::unix::fs::symlink("/proc/self/mem", &index).unwrap();
    while !std::fs::read_to_string(&log).unwrap().contains("not a data file") {
        assert!(
            Instant::now() < deadline,
            "the kernel file was never said: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Where the job was in the real index (it may have read the lines the generator wrote last).
    let (read_to, batches_before) = (cursor(&example.state), batches(&example.state));
    // The real index put back: read on from where it was, not again from its first byte.
    std::fs::remove_file(&index).unwrap();
    std::fs::rename(&aside, &index).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    run.kill().unwrap();
    run.wait().unwrap();
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(!said.contains("reading it again from the start"), "{said}");
    assert_eq!(cursor(&example.state), read_to, "{said}");
    assert_eq!(batches(&example.state), batches_before, "batches read again: {said}");
    let errors = said.lines().filter(|l| l.contains("ERROR") && l.contains("not a data file")).count();
    assert_eq!(errors, 1, "said once (then counted), not in a loop: {said}");
}

/// An eval worker whose model is 2 GiB (sparse: a marker at each end) and whose report repeats
/// with another accuracy, then as `failed`.
const BIG_MODEL_EVAL: &str = r#"
import json, os, sys, urllib.request, urllib.error
sys.dont_write_bytecode = True
output = os.environ["OUTPUT_URL"]
round_ = os.path.basename(output.rstrip("/"))
os.makedirs(output, exist_ok=True)
model = os.path.join(output, "model.bin")
with open(model, "wb") as f:
    f.write(f"round-{round_}".encode())
    f.truncate(2 << 30)
    f.seek((2 << 30) - 16)
    f.write(f"end-{round_}".encode().ljust(16, b"."))
url = f'{os.environ["LC_SERVER"]}/sedna/workers/{os.environ["WORKER_NAME"]}/info'
def post(status, accuracy):
    body = {"name": os.environ["WORKER_NAME"], "namespace": "default", "ownerName": os.environ["JOB_NAME"],
            "ownerKind": "lifelonglearningjob", "kind": "eval", "status": status,
            "results": [{"format": "bin", "url": model, "metrics": {"accuracy": accuracy}}] if status == "completed" else []}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            print(f"{status} {accuracy}: {reply.status}", flush=True)
    except urllib.error.HTTPError as err:
        print(f"{status} {accuracy}: {err.code}", flush=True)
post("completed", 0.5)
post("completed", 0.99)
post("failed", None)
"#;

/// kill -9 at 50 random moments across rounds whose eval reports a 2 GiB model and then repeats
/// its report with other values: no sample is trained twice, no round is decided on a report the
/// stage did not take, and the deployed model is always whole.
#[test]
fn killed_at_random_while_big_models_deploy_and_reports_repeat_nothing_is_lost_or_doubled() {
    let _turn = crate::support::moments::heavy_turn();
    let example = quick_example(|name, text| {
        if name == "job.yaml" {
            text.replace("command: [\"python3\", \"eval.py\"]", "command: [\"python3\", \"big_model_eval.py\"]")
        } else {
            text
        }
    });
    std::fs::write(example.manifests.join("big_model_eval.py"), BIG_MODEL_EVAL).unwrap();
    let mut moments = crate::support::moments::Moments::new("kill -9 with big models");
    for _ in 0..50 {
        let mut run = example.start(&[]);
        std::thread::sleep(Duration::from_millis(200 + moments.below(1800)));
        let _ = run.kill(); // SIGKILL
        run.wait().unwrap();
    }
    let rounds = example.live_status().and_then(|s| s["roundsCompleted"].as_u64()).unwrap_or(0) + 2;
    let out = wait_exit(&mut example.start(&["--rounds", &rounds.to_string()]), Duration::from_secs(300));
    assert!(out.status.success(), "after the kills: {}", stderr(&out));
    let status = &example.status()[0]["status"];
    assert_eq!(status["roundsCompleted"], rounds, "{status:#}");

    // Decided on the report each stage took (0.5), never on the repeat (0.99).
    let decisions = example.decisions("default/thermal-comfort");
    let selected: Vec<&serde_json::Value> = decisions.iter().filter(|d| d["kind"] == "selector").collect();
    assert!(selected.len() as u64 >= rounds, "{} selector decisions for {rounds} rounds", selected.len());
    for decision in &selected {
        for candidate in decision["input"]["candidates"].as_array().unwrap() {
            assert_eq!(candidate["metrics"]["accuracy"], 0.5, "decided on an ignored report: {decision}");
        }
    }
    assert_eq!(status["deployed"]["metrics"]["accuracy"], 0.5, "{status:#}");

    // The deployed model is whole: its length, and the markers of the round it came from.
    let path = example.output().join("deploy/index.pkl");
    let round = status["deployed"]["round"].as_u64().unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(len, 2 << 30, "the deployed model is cut short");
    let mut file = std::fs::File::open(&path).unwrap();
    let mut head = vec![0u8; format!("round-{round}").len()];
    file.read_exact(&mut head).unwrap();
    assert_eq!(head, format!("round-{round}").as_bytes());
    file.seek(SeekFrom::Start(len - 16)).unwrap();
    let mut tail = [0u8; 16];
    file.read_exact(&mut tail).unwrap();
    assert_eq!(String::from_utf8_lossy(&tail), format!("{:.<16}", format!("end-{round}")));

    // No sample trained twice: each round's rows against the lines the index holds.
    let index = std::fs::read_to_string(example.state.join("data/thermal-comfort/index.csv")).unwrap();
    let mut left: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for line in index.lines().skip(1) {
        *left.entry(line).or_default() += 1;
    }
    let db = rusqlite::Connection::open(example.state.join("edge.db")).unwrap();
    let mut kept =
        db.prepare("SELECT DISTINCT train_round FROM batches WHERE train_round IS NOT NULL ORDER BY 1").unwrap();
    let kept: Vec<i64> = kept.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
    for round in kept {
        for row in example.rows(&format!("data/train/{round}/data.csv")) {
            let copies = left.get_mut(row.as_str()).unwrap_or_else(|| panic!("sample {row} is not in the index"));
            assert!(*copies > 0, "sample {row} trained more often than the index holds it (again in round {round})");
            *copies -= 1;
        }
    }
    let tmp: Vec<_> = std::fs::read_dir(example.output().join(".perennial-tmp")).unwrap().flatten().collect();
    assert!(tmp.is_empty(), "temporary files left behind: {tmp:?}");
}

/// A store put back from an older backup than the other is refused, naming both rounds; starting
/// the job over as the refusal says runs it again (not a job that waits forever).
#[test]
fn an_older_store_put_back_is_refused_and_starting_over_works() {
    let example = quick_example(|_, text| text);
    let out = wait_exit(&mut example.start(&["--rounds", "1"]), Duration::from_secs(180));
    assert!(out.status.success(), "{}", stderr(&out));
    let backup = example.root.path().join("backup");
    copy_stores(&example.state, &backup, "edge.db");
    let out = wait_exit(&mut example.start(&["--rounds", "2"]), Duration::from_secs(180));
    assert!(out.status.success(), "{}", stderr(&out));
    let round_2 = example.rows("data/train/2/data.csv");

    remove_store(&example.state, "edge.db");
    copy_stores(&backup, &example.state, "edge.db");
    let out = wait_exit(&mut example.start(&["--rounds", "3"]), Duration::from_secs(60));
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("at round 2") && said.contains("at round 1") && said.contains("edge.db is older"), "{said}");
    assert_eq!(example.rows("data/train/2/data.csv"), round_2, "a past round's file rewritten");

    // As the refusal says: delete the job, run it again.
    remove_store(&example.state, "edge.db");
    let deleted = perennial(&["delete", "default/thermal-comfort"], &example.state);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    std::fs::rename(example.output(), example.root.path().join("kept-output")).unwrap();
    let out = wait_exit(&mut example.start(&["--rounds", "1"]), Duration::from_secs(180));
    assert!(out.status.success(), "the job started over never completed a round: {}", stderr(&out));
    assert_eq!(example.status()[0]["status"]["roundsCompleted"], 1);
}

/// edge.db removed while the run goes on: the run stops at once and says so, rather than write
/// its rounds into a file no one reads again.
#[test]
fn a_store_removed_under_a_running_run_stops_it() {
    let example = quick_example(|_, text| text);
    let mut run = example.start(&[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while example.live_status().is_none() {
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    remove_store(&example.state, "edge.db");
    let out = wait_exit(&mut run, Duration::from_secs(30));
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("edge.db was removed or replaced while this run used it"), "{said}");
}

/// Ctrl-C (or SIGTERM) while a policy still loads at the start (here its registry takes the
/// connection and never answers: a fetch gives up only after minutes) stops the run at once,
/// and nothing of the manifests given is kept.
#[test]
fn a_stop_while_the_policies_load_ends_the_start_at_once_and_keeps_nothing() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = silent.local_addr().unwrap();
    // Connections taken and held, unanswered, for the test's life.
    std::thread::spawn(move || silent.incoming().flatten().collect::<Vec<_>>());
    let root = tempfile::tempdir().unwrap();
    let (manifests, state) = (root.path().join("jobs"), root.path().join("state"));
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::create_dir_all(state.join("data/silent")).unwrap();
    std::fs::write(state.join("data/silent/index.txt"), "").unwrap();
    let policy = format!("{{plugin: \"oci://{address}/policies/trigger:v1\", sha256: {}}}", "a".repeat(64));
    let job = crate::support::plugin_projects::never_training_job("silent", Some(&policy));
    std::fs::write(manifests.join("silent.yaml"), job).unwrap();
    let mut run = crate::support::embedded::dies_with_its_test(&mut Command::new(env!("CARGO_BIN_EXE_perennial")))
        .arg("run")
        .arg(&manifests)
        .arg("--state-dir")
        .arg(&state)
        .env("PERENNIAL_CACHE_DIR", root.path().join("cache"))
        .env("DOCKER_CONFIG", root.path().join("no-docker-config"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The fetch has begun (the registry holds its connection) well before this.
    std::thread::sleep(Duration::from_secs(3));
    let asked = Instant::now();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let out = wait_exit(&mut run, Duration::from_secs(30));
    let stopped_in = asked.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(stopped_in < Duration::from_secs(5), "stopped only after {stopped_in:?}: {err}");
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("stopped (Ctrl-C or SIGTERM) while the jobs' policies loaded"), "{err}");
    let status = perennial(&["status", "--output", "json"], &state);
    let listed = String::from_utf8_lossy(&status.stdout);
    assert!(!listed.contains("silent"), "nothing of the manifests is kept: {listed}");
}
