//! `perennial run` killed with SIGKILL in the middle of rounds (in Train, in Eval, in Deploy),
//! then started again: the interrupted round resumes and completes, no sample is consumed twice,
//! the round files already written are never rewritten, and no worker outlives the kill.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::support::embedded::{Example, wait_exit};

fn stage_index(stage: &str) -> u64 {
    match stage {
        "Train" => 0,
        "Eval" => 1,
        _ => 2,
    }
}

#[test]
fn killed_mid_round_it_resumes_and_consumes_nothing_twice() {
    let example = Example::new(|_, text| text.replace("threshold: 200", "threshold: 150"));
    let mut written: HashMap<String, Vec<u8>> = HashMap::new();
    for (round, stage) in [(1, "Train"), (2, "Eval"), (3, "Deploy")] {
        let mut run = example.start(&[]);
        let deadline = Instant::now() + Duration::from_secs(90);
        // Kill as soon as the job is in (or past) that stage of that round, worker started.
        loop {
            assert!(Instant::now() < deadline, "never reached {stage} of round {round}");
            if run.try_wait().unwrap().is_some() {
                let out = wait_exit(&mut run, Duration::from_secs(1));
                panic!("perennial run exited early ({:?}): {}", out.status, String::from_utf8_lossy(&out.stderr));
            }
            if let Some(s) = example.live_status() {
                let at = (s["round"].as_u64().unwrap_or(0), stage_index(s["stage"].as_str().unwrap_or("Train")));
                let busy = matches!(s["phase"].as_str(), Some("Starting" | "Running"));
                if at > (round, stage_index(stage)) || at == (round, stage_index(stage)) && busy {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(3));
        }
        run.kill().unwrap(); // SIGKILL
        run.wait().unwrap();
        // The generator died with it: the dataset stops growing (it appends every second).
        let index = example.state.join("data/thermal-comfort/index.csv");
        std::thread::sleep(Duration::from_millis(300));
        let size = std::fs::metadata(&index).unwrap().len();
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(std::fs::metadata(&index).unwrap().len(), size, "a child process outlived the kill");
        // What was written before the kill.
        for entry in walk(&example.output().join("data")) {
            let bytes = std::fs::read(&entry).unwrap();
            written.entry(entry.display().to_string()).or_insert(bytes);
        }
    }

    let mut run = example.start(&["--rounds", "4"]);
    let out = wait_exit(&mut run, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let status = example.status();
    let s = &status[0]["status"];
    assert_eq!(s["roundsCompleted"], 4, "{s}");
    // Round numbers went up one by one; every round trained, evaluated and deployed once.
    let mut seen = HashSet::new();
    for round in 1..=4 {
        let train = example.rows(&format!("data/train/{round}/data.csv"));
        assert!(!train.is_empty(), "round {round} trained on nothing");
        for row in train {
            assert!(seen.insert(row.clone()), "sample {row} was consumed twice (again in round {round})");
        }
        assert!(example.output().join(format!("eval/{round}/model.json")).exists(), "round {round} not evaluated");
    }
    assert!(!example.output().join("data/train/5").exists() || s["round"] == 5);
    // Round files written before a kill were never rewritten.
    for (path, before) in &written {
        assert_eq!(&std::fs::read(path).unwrap(), before, "{path} was rewritten after a restart");
    }
    let deployed = std::fs::read(example.output().join("deploy/index.pkl")).unwrap();
    assert_eq!(deployed, std::fs::read(example.output().join("eval/4/model.json")).unwrap());

    // Each decision that acted has its record, once, whatever the kills interrupted: a round
    // started, a batch split, a model chosen.
    let records = example.decisions("thermal-comfort");
    let rounds_of = |kind: &str, acted: &dyn Fn(&serde_json::Value) -> bool| -> Vec<i64> {
        records.iter().filter(|r| r["kind"] == kind && acted(r)).map(|r| r["round"].as_i64().unwrap()).collect()
    };
    let started = s["round"].as_i64().unwrap();
    assert_eq!(rounds_of("trigger", &|r| r["answer"]["train"] == true), (0..started).collect::<Vec<_>>());
    assert_eq!(rounds_of("selector", &|_| true), [1, 2, 3, 4]);
    let splits: Vec<&serde_json::Value> = records.iter().filter(|r| r["kind"] == "splitter").collect();
    let db = rusqlite::Connection::open(example.state.join("edge.db")).unwrap();
    let batches: i64 = db.query_row("SELECT COUNT(*) FROM batches", [], |r| r.get(0)).unwrap();
    assert_eq!(splits.len() as i64, batches, "one split record per committed batch");
    let mut next_seq = 0;
    for split in splits {
        assert_eq!(split["input"]["firstSeq"].as_u64().unwrap(), next_seq, "{split}");
        next_seq += split["input"]["count"].as_u64().unwrap();
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return files };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
    }
    files
}

#[test]
fn ctrl_c_stops_the_workers_and_the_next_run_resumes() {
    let example = Example::new(|_, text| text.replace("threshold: 200", "threshold: 150"));
    let mut run = example.start(&[]);
    let deadline = Instant::now() + Duration::from_secs(90);
    while example.live_status().is_none_or(|s| s["roundsCompleted"].as_u64().unwrap_or(0) < 1) {
        assert!(Instant::now() < deadline, "round 1 never completed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let out = wait_exit(&mut run, Duration::from_secs(15));
    assert!(out.status.success(), "Ctrl-C is a clean stop: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    // The generator and the inference worker were stopped with it.
    let index = example.state.join("data/thermal-comfort/index.csv");
    let size = std::fs::metadata(&index).unwrap().len();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(std::fs::metadata(&index).unwrap().len(), size, "the generator outlived Ctrl-C");

    let before = &example.status()[0]["status"];
    let rounds = before["roundsCompleted"].as_u64().unwrap();
    let deployed = before["deployed"]["round"].as_u64().unwrap();
    let target = (rounds + 1).to_string();
    let mut run = example.start(&["--rounds", &target]);
    let out = wait_exit(&mut run, Duration::from_secs(90));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = &example.status()[0]["status"];
    assert_eq!(s["roundsCompleted"].as_u64(), Some(rounds + 1), "{s}");
    // The deployed model's inference worker was started again on resume (a second log for it).
    let prefix = format!("{deployed:04}-inference-");
    let logs = std::fs::read_dir(example.state.join("logs/default/thermal-comfort"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with(&prefix))
        .count();
    let deploying =
        before["stage"] == "Deploy" && ["Ready", "Starting", "Running"].contains(&before["phase"].as_str().unwrap());
    if !deploying {
        assert_eq!(logs, 2, "the inference worker of round {deployed} was not started again on resume");
    }
}

/// A worker that runs its program through a shell (`bash -c "python3 ...; echo"`) leaves a
/// grandchild that the kernel does not kill with the run: the run's reaper does, on kill -9
/// as on a clean stop.
#[test]
fn what_a_worker_started_dies_with_a_killed_run() {
    let example = Example::new(|_, text| text);
    let pid_file = example.root.path().join("grandchild.pid");
    let pid = pid_file.display();
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: shell, namespace: default}}\nspec:\n  containers:\n    - name: shell\n      image: none\n      command: [\"sh\", \"-c\", \"sleep 300 & echo $! > {pid}.tmp && mv {pid}.tmp {pid}; wait\"]\n"
    );
    // Beside the example's job and its data generator.
    std::fs::write(example.manifests.join("shell.yaml"), manifest).unwrap();
    let mut run = example.start(&[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let grandchild: i32 = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            break text.trim().parse().unwrap();
        }
        assert!(Instant::now() < deadline, "the pod never started its grandchild");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(running(grandchild), "the grandchild runs");
    run.kill().unwrap(); // SIGKILL
    run.wait().unwrap();
    // The reaper acts at once; the bound is for a loaded machine (CI's plugin builds beside it).
    let deadline = Instant::now() + Duration::from_secs(15);
    while running(grandchild) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let outlived = running(grandchild);
    if outlived {
        // SAFETY: kill(2) on the pid the test's own pod wrote; no memory is involved.
        unsafe { libc::kill(grandchild, libc::SIGKILL) };
    }
    assert!(!outlived, "the worker's grandchild outlived kill -9 of the run");
}

/// Running (a killed process may linger as a zombie until its new parent reaps it).
fn running(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    state.is_some_and(|state| state != 'Z' && state != 'X')
}

/// A small tmpfs of its own, unmounted when dropped: a disk that can be filled.
struct SmallDisk {
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    /// Mounts one (this needs root: CI runs as root). `PERENNIAL_TEST_NO_TMPFS=1` skips the test
    /// where no tmpfs can be mounted, saying so; otherwise a failed mount fails the test.
    fn mount(megabytes: u64) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        std::fs::create_dir(&path).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(&path)
            .output()
            .expect("run mount");
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr);
            assert!(
                std::env::var_os("PERENNIAL_TEST_NO_TMPFS").is_some(),
                "cannot mount a tmpfs for the disk-full test ({why}); run as root, or set PERENNIAL_TEST_NO_TMPFS=1 to skip it"
            );
            eprintln!("skipped: no tmpfs ({why})");
            return None;
        }
        Some(SmallDisk { path, _dir: dir })
    }

    /// Writes a file until the disk is full.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let filler = self.path.join("filler");
        let mut file = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 1 << 20];
        while file.write_all(&chunk).is_ok() {}
        while file.write_all(&chunk[..4096]).is_ok() {}
        let _ = file.write_all(&chunk[..1]);
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// kill -9 at random moments while the state dir's disk is full and after it is freed, 50
/// times: the job always resumes, completes its rounds, and consumes nothing twice.
#[test]
fn killed_while_the_disk_is_full_it_resumes_and_completes_its_rounds() {
    let _turn = crate::support::moments::heavy_turn();
    let Some(disk) = SmallDisk::mount(64) else { return };
    let mut example = Example::new(|_, text| text.replace("threshold: 200", "threshold: 150"));
    example.state = disk.path.join("state");
    let mut moments = crate::support::moments::Moments::new("disk-full cycles");
    for _ in 0..50 {
        let mut run = example.start(&[]);
        std::thread::sleep(Duration::from_millis(100 + moments.below(900)));
        let filler = disk.fill();
        std::thread::sleep(Duration::from_millis(moments.below(600)));
        let _ = run.kill(); // SIGKILL (it may have stopped by itself on a full disk)
        run.wait().unwrap();
        std::fs::remove_file(filler).unwrap();
    }
    let rounds = example.live_status().and_then(|s| s["roundsCompleted"].as_u64()).unwrap_or(0) + 2;
    let mut run = example.start(&["--rounds", &rounds.to_string()]);
    let out = wait_exit(&mut run, Duration::from_secs(240));
    assert!(out.status.success(), "after the disk-full kills: {}", String::from_utf8_lossy(&out.stderr));
    let s = &example.status()[0]["status"];
    assert_eq!(s["roundsCompleted"], rounds, "{s}");
    // The rounds that kept their samples. A round that failed on the full disk (a worker's
    // write, the deploy's copy) gave its samples back to the next one, as Sedna's retry does,
    // and only its files stay behind; so round numbers may skip.
    let db = rusqlite::Connection::open(example.state.join("edge.db")).unwrap();
    let mut kept =
        db.prepare("SELECT DISTINCT train_round FROM batches WHERE train_round IS NOT NULL ORDER BY 1").unwrap();
    let kept: Vec<i64> = kept.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
    assert!(kept.len() as u64 >= rounds, "{rounds} rounds completed, but only rounds {kept:?} kept samples");
    // A sample is a line of the index where it stands: no round takes a line more often than
    // the index holds it (a generator killed with the run and started again by the next may
    // have written a burst twice, as a sensor may; each copy is a sample of its own).
    let index = std::fs::read_to_string(example.state.join("data/thermal-comfort/index.csv")).unwrap();
    let mut left: HashMap<&str, usize> = HashMap::new();
    for line in index.lines().skip(1) {
        *left.entry(line).or_default() += 1;
    }
    for &round in &kept[..rounds as usize] {
        for row in example.rows(&format!("data/train/{round}/data.csv")) {
            let copies = left.get_mut(row.as_str()).unwrap_or_else(|| panic!("sample {row} is not in the index"));
            assert!(
                *copies > 0,
                "sample {row} was consumed more often than the index holds it (again in round {round})"
            );
            *copies -= 1;
        }
        assert!(example.output().join(format!("eval/{round}/model.json")).exists(), "round {round} not evaluated");
    }
    // What interrupted writes left was cleared when the job started again.
    let left: Vec<_> = std::fs::read_dir(example.output().join(".perennial-tmp")).unwrap().flatten().collect();
    assert!(left.is_empty(), "temporary files left behind: {left:?}");
}
