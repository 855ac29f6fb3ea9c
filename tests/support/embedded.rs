#![allow(dead_code)] // each test uses part of it
//! Running `perennial run` on a copy of the thermal-comfort example, as a user would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A copy of the example and a state dir, in a temp dir.
pub struct Example {
    pub root: tempfile::TempDir,
    pub manifests: PathBuf,
    pub state: PathBuf,
    /// The compile cache (`PERENNIAL_CACHE_DIR`); the user's default when none.
    pub cache: Option<PathBuf>,
}

impl Example {
    /// Copies `examples/thermal-comfort` (its top folder) and applies `edit` to each manifest's text.
    pub fn new(edit: impl Fn(&str, String) -> String) -> Example {
        let root = tempfile::tempdir().unwrap();
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/thermal-comfort");
        let manifests = root.path().join("thermal-comfort");
        std::fs::create_dir_all(&manifests).unwrap();
        for entry in std::fs::read_dir(&source).unwrap() {
            let path = entry.unwrap().path();
            if !path.is_file() {
                continue;
            }
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            let text = if name.ends_with(".yaml") { edit(&name, text) } else { text };
            std::fs::write(manifests.join(&name), text).unwrap();
        }
        let state = root.path().join("state");
        Example { root, manifests, state, cache: None }
    }

    pub fn output(&self) -> PathBuf {
        self.state.join("output/thermal-comfort")
    }

    /// Adds the metric-select variant (`<copy>/metric-select`, edited too) and returns its folder.
    pub fn add_variant(&self, edit: impl Fn(String) -> String) -> PathBuf {
        let source =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/thermal-comfort/metric-select/job.yaml");
        let folder = self.manifests.join("metric-select");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("job.yaml"), edit(std::fs::read_to_string(source).unwrap())).unwrap();
        folder
    }

    /// `perennial run <copy> --state-dir <state> ARGS`, output captured.
    pub fn start(&self, args: &[&str]) -> Child {
        self.start_with(&[], args)
    }

    /// `perennial run <copy> EXTRA... --state-dir <state> ARGS`, output captured; killed when
    /// the test that started it ends, even by a panic.
    pub fn start_with(&self, extra: &[PathBuf], args: &[&str]) -> Child {
        dies_with_its_test(&mut Command::new(env!("CARGO_BIN_EXE_perennial")))
            .arg("run")
            .arg(&self.manifests)
            .args(extra)
            .arg("--state-dir")
            .arg(&self.state)
            .args(args)
            .envs(self.cache.iter().map(|cache| ("PERENNIAL_CACHE_DIR", cache)))
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start perennial run")
    }

    /// `perennial status --output json`, parsed.
    pub fn status(&self) -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_perennial"))
            .args(["status", "--output", "json", "--state-dir"])
            .arg(&self.state)
            .output()
            .unwrap();
        assert!(out.status.success(), "status: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `perennial decisions JOB --output json --limit 0`, parsed: every record, oldest first.
    pub fn decisions(&self, job: &str) -> Vec<serde_json::Value> {
        let out = Command::new(env!("CARGO_BIN_EXE_perennial"))
            .args(["decisions", job, "--output", "json", "--limit", "0", "--state-dir"])
            .arg(&self.state)
            .output()
            .unwrap();
        assert!(out.status.success(), "decisions: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The job's status as stored now (the run may be going on), if there is one yet.
    pub fn live_status(&self) -> Option<serde_json::Value> {
        self.live_status_of("default/thermal-comfort")
    }

    /// A job's status as stored now, if there is one.
    pub fn live_status_of(&self, job: &str) -> Option<serde_json::Value> {
        let db = rusqlite::Connection::open(self.state.join("control.db")).ok()?;
        db.busy_timeout(Duration::from_secs(5)).ok()?;
        let body: String = db.query_row("SELECT body FROM status WHERE job = ?1", [job], |r| r.get(0)).ok()?;
        serde_json::from_str(&body).ok()
    }

    /// The rows of a round file (header dropped).
    pub fn rows(&self, file: &str) -> Vec<String> {
        let text = std::fs::read_to_string(self.output().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut lines = text.lines();
        let header = lines.next().unwrap_or_default();
        assert!(header.starts_with("time_step,"), "{file} starts with the csv header, not {header:?}");
        lines.map(str::to_owned).collect()
    }
}

/// Waits for `child` to exit, at most `limit`; kills it and fails past that.
pub fn wait_exit(child: &mut Child, limit: Duration) -> std::process::Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            let out = read_all(child);
            panic!(
                "perennial run did not finish in {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    read_all(child)
}

fn read_all(child: &mut Child) -> std::process::Output {
    use std::io::Read;
    let status = child.wait().unwrap();
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_end(&mut stdout).unwrap();
    }
    if let Some(mut err) = child.stderr.take() {
        err.read_to_end(&mut stderr).unwrap();
    }
    std::process::Output { status, stdout, stderr }
}

/// CPU seconds a process has used so far (user and system), from /proc.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    // utime and stime are fields 14 and 15 of stat(5), in clock ticks (100 a second here).
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// `command`, whose process is killed (SIGKILL) when the thread that starts it ends: a test that
/// fails before it stops its `perennial run` leaves none running after the suite.
pub fn dies_with_its_test(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: between fork and exec the closure only calls prctl, which is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}
