//! The crash test: `perennial edge` as a child process, killed with SIGKILL at random moments
//! 100 times while a generator appends samples. After all that: every sample was assigned
//! exactly once, every round file is whole and holds exactly its round's train samples, and
//! round numbers went up one by one.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rusqlite::Connection;

const JOB: &str = "default/crash";
const KILLS: usize = 100;

struct Dirs {
    _root: tempfile::TempDir,
    index: PathBuf,
    output: PathBuf,
    state: PathBuf,
    jobs: PathBuf,
}

fn setup() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let index = root.path().join("data/index.txt");
    std::fs::create_dir_all(index.parent().unwrap()).unwrap();
    let output = root.path().join("output");
    let state = root.path().join("state");
    let jobs = root.path().join("jobs.json");
    let config = serde_json::json!([{
        "name": JOB,
        "uid": "uid-crash",
        "spec": {"datasetUrl": index, "datasetFormat": "txt", "outputDir": output, "trainProb": 0.8},
        "splitter": {"plugin": "builtin:ratio-split", "config": {"trainProb": 0.8}},
        "trigger": {"plugin": "builtin:threshold-trigger",
                    "config": {"checkPeriodSeconds": 1, "condition": {"operator": ">=", "threshold": 150}}}
    }]);
    std::fs::write(&jobs, config.to_string()).unwrap();
    Dirs { index, output, state, jobs, _root: root }
}

fn start_agent(dirs: &Dirs) -> Child {
    Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(["edge", "--bind-address", "127.0.0.1", "--bind-port", "0", "--poll-ms", "50"])
        .arg("--state-dir")
        .arg(&dirs.state)
        .arg("--jobs")
        .arg(&dirs.jobs)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start perennial edge")
}

fn db(dirs: &Dirs) -> Option<Connection> {
    let path = dirs.state.join("edge.db");
    if !path.exists() {
        return None;
    }
    let conn = Connection::open(path).ok()?;
    conn.busy_timeout(Duration::from_secs(5)).ok()?;
    Some(conn)
}

/// The samples the agent has taken so far (0 before its first start).
fn consumed(dirs: &Dirs) -> i64 {
    db(dirs)
        .and_then(|conn| conn.query_row("SELECT cursor_samples FROM jobs WHERE name = ?1", [JOB], |r| r.get(0)).ok())
        .unwrap_or(0)
}

/// Plays the control plane and the workers: after Train Ready, a train worker "runs" (its model
/// file and its result), then Eval Ready gets an evaluated model, then Deploy, then the next
/// round, each stage change as the control plane would make it.
fn next_round(dirs: &Dirs) {
    let Some(conn) = db(dirs) else { return };
    let Ok((round, stage, phase)) =
        conn.query_row("SELECT round, stage, phase FROM jobs WHERE name = ?1", [JOB], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
        })
    else {
        return;
    };
    let model = |stage: &str| {
        let path = dirs.output.join(format!("{stage}/{round}/index.pkl"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // Large enough that a torn copy would show.
        std::fs::write(&path, model_bytes(stage, round)).unwrap();
        let body = serde_json::json!([{"format": "pkl", "url": path, "metrics": {"accuracy": round}}]).to_string();
        let _ = conn.execute(
            "INSERT OR REPLACE INTO results (job, round, stage, body) VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![JOB, round, stage, body],
        );
    };
    let next = match (stage.as_str(), phase.as_str()) {
        ("Train", "Ready") => {
            model("train");
            "Eval"
        }
        ("Eval", "Ready") => {
            model("eval");
            "Deploy"
        }
        ("Deploy", "Ready" | "Completed" | "Failed") => "Train",
        _ => return,
    };
    let _ = conn.execute("UPDATE jobs SET stage = ?2, phase = 'Waiting' WHERE name = ?1", rusqlite::params![JOB, next]);
}

fn model_bytes(stage: &str, round: i64) -> Vec<u8> {
    format!("{stage}-model-{round}|").repeat(20_000 + round as usize).into_bytes()
}

fn seeded(seed: &mut u64) -> u64 {
    // xorshift: reproducible "random" moments.
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

fn sample(i: usize) -> String {
    format!("images/{i:08}.jpg {}", i % 5)
}

#[test]
fn killed_100_times_while_samples_arrive_nothing_is_lost_or_doubled() {
    let dirs = setup();
    let written = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let generator = {
        let (index, written, stop) = (dirs.index.clone(), written.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(index).unwrap();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                // A burst, written in two pieces so that the agent sometimes sees half a line.
                let burst: String = (i..i + 13).map(|n| format!("{}\n", sample(n))).collect();
                let (head, tail) = burst.split_at(burst.len() / 2 + 3);
                file.write_all(head.as_bytes()).unwrap();
                file.flush().unwrap();
                file.write_all(tail.as_bytes()).unwrap();
                file.flush().unwrap();
                i += 13;
                written.store(i, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(7));
            }
        })
    };

    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for life in 0..KILLS {
        let before = consumed(&dirs);
        let mut agent = start_agent(&dirs);
        if life % 2 == 1 {
            // Every other life is killed only once it has taken samples: on a loaded machine a
            // start alone can outlast the moments below, and then no life would do any work.
            let deadline = Instant::now() + Duration::from_secs(10);
            while consumed(&dirs) <= before && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        std::thread::sleep(Duration::from_millis(20 + seeded(&mut seed) % 180));
        agent.kill().unwrap(); // SIGKILL
        agent.wait().unwrap();
        next_round(&dirs);
    }
    stop.store(true, Ordering::Relaxed);
    generator.join().unwrap();
    let total = written.load(Ordering::Relaxed) as i64;
    // The killed agents did the work, not just the last one.
    let (consumed, rounds): (i64, i64) = db(&dirs)
        .unwrap()
        .query_row("SELECT cursor_samples, round FROM jobs WHERE name = ?1", [JOB], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    eprintln!("{KILLS} kills: {consumed} of {total} samples consumed, {rounds} rounds started");
    assert!(consumed > total / 2 && rounds >= 2, "{consumed} of {total}, {rounds} rounds");

    // One last run, left to catch up and settle, then killed too.
    let mut agent = start_agent(&dirs);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        next_round(&dirs);
        let consumed: i64 = db(&dirs)
            .and_then(|c| c.query_row("SELECT cursor_samples FROM jobs WHERE name = ?1", [JOB], |r| r.get(0)).ok())
            .unwrap_or(0);
        if consumed == total {
            break;
        }
        assert!(Instant::now() < deadline, "the agent did not catch up: {consumed} of {total}");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    agent.kill().unwrap();
    agent.wait().unwrap();

    verify(&dirs, total);
}

fn verify(dirs: &Dirs, total: i64) {
    let conn = db(dirs).unwrap();
    let index = std::fs::read_to_string(&dirs.index).unwrap();

    // Every sample exactly once, in order, and each batch's bytes hold its samples.
    let mut statement = conn
        .prepare("SELECT first_seq, start, end, assignments, train_round FROM batches WHERE job = ?1 ORDER BY batch")
        .unwrap();
    // (first_seq, start, end, assignments, train_round)
    type Batch = (i64, i64, i64, Vec<u8>, Option<i64>);
    let batches: Vec<Batch> = statement
        .query_map([JOB], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut next_seq = 0i64;
    let mut train_by_round: std::collections::BTreeMap<i64, Vec<String>> = Default::default();
    for (first_seq, start, end, assignments, train_round) in &batches {
        assert_eq!(*first_seq, next_seq, "no gap, no overlap");
        let lines: Vec<&str> = index[*start as usize..*end as usize].lines().collect();
        assert_eq!(lines.len(), assignments.len());
        for (offset, (line, assignment)) in lines.iter().zip(assignments).enumerate() {
            assert_eq!(
                *line,
                sample((*first_seq as usize) + offset),
                "sample {} is where it was read",
                first_seq + offset as i64
            );
            if let (0, Some(round)) = (assignment, train_round) {
                train_by_round.entry(*round).or_default().push(line.to_string());
            }
        }
        next_seq += assignments.len() as i64;
    }
    assert_eq!(next_seq, total, "every appended sample was assigned");

    // Rounds 1..=R, each file whole and holding exactly its round's train samples.
    let round: i64 = conn.query_row("SELECT round FROM jobs WHERE name = ?1", [JOB], |r| r.get(0)).unwrap();
    assert!(round >= 2, "several rounds ran: {round}");
    assert_eq!(train_by_round.keys().copied().collect::<Vec<_>>(), (1..=round).collect::<Vec<_>>());
    for (r, expected) in &train_by_round {
        let file = std::fs::read_to_string(dirs.output.join(format!("data/train/{r}/data.txt"))).unwrap();
        assert!(file.ends_with('\n'), "round {r}: whole");
        assert_eq!(file.lines().collect::<Vec<_>>(), *expected, "round {r}");
    }

    // Each stage reported once per round, in order: Train, Eval, Deploy, Train, ...
    let mut statement = conn.prepare("SELECT body FROM outbox ORDER BY seq").unwrap();
    let reports: Vec<(i64, String)> = statement
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|body| {
            let report: serde_json::Value = serde_json::from_str(&body.unwrap()).unwrap();
            (
                report["round"].as_i64().unwrap(),
                format!("{}/{}", report["phase"].as_str().unwrap(), report["status"].as_str().unwrap()),
            )
        })
        .collect();
    let expected: Vec<(i64, String)> = (1..=round)
        .flat_map(|r| [(r, "Train/Ready"), (r, "Eval/Ready"), (r, "Deploy/Ready")])
        .map(|(r, s)| (r, s.to_owned()))
        .take(reports.len())
        .collect();
    assert_eq!(reports, expected, "reports once each, in order");
    assert!(reports.iter().filter(|(_, s)| s == "Train/Ready").count() as i64 == round);

    // The deployed model is whole: exactly the model of the last committed deploy, or of a
    // deploy whose copy finished just before the last kill and was not committed yet.
    let deployed = reports.iter().filter(|(_, s)| s == "Deploy/Ready").map(|(r, _)| *r).max();
    if let Some(r) = deployed {
        let bytes = std::fs::read(dirs.output.join("deploy/index.pkl")).unwrap();
        assert!(
            bytes == model_bytes("eval", r) || bytes == model_bytes("eval", r + 1),
            "deploy/index.pkl is a whole model"
        );
    }
    assert!(deployed.unwrap_or(0) >= 2, "several deploys happened");
}
