//! What refusing hostile input costs: for each class of bad manifest, `perennial run FILE` as a
//! user runs it, its wall time to exit 2 and its peak memory (the child's max RSS from wait4).
//! `cargo bench -p perennial --bench hostile`; prints one line per class (min and max of 5 runs).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const JOB: &str = "apiVersion: sedna.io/v1alpha1
kind: LifelongLearningJob
metadata: {name: demo}
spec:
  dataset: {name: d, trainProb: 0.5}
  trainSpec:
    template: {spec: {containers: [{name: t, image: i, command: [\"true\"]}]}}
    trigger: {condition: {operator: '>', threshold: 1, metric: num_of_samples}}
  evalSpec: {template: {spec: {containers: [{name: e, image: i, command: [\"true\"]}]}}}
  deploySpec: {template: {spec: {containers: [{name: d, image: i, command: [\"true\"]}]}}}
  outputDir: out
";

/// Runs `perennial run FILE` on a fresh state dir: its exit code, wall time and max RSS (KiB).
#[allow(clippy::zombie_processes)] // reaped by wait4, which also gives its peak memory
fn refuse(file: &Path, state: &Path) -> (Option<i32>, Duration, i64) {
    let started = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_perennial"))
        .arg("run")
        .arg(file)
        .arg("--state-dir")
        .arg(state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start perennial run");
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4(2) on our own child, with valid pointers for its status and usage.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    (code, started.elapsed(), usage.ru_maxrss)
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let big_comment = format!("{JOB}# {}\n", "x".repeat(3 * 1024 * 1024));
    // Every one read before the last is refused (it has no apiVersion).
    let many_documents = "---\n# nothing\n".repeat(20_000) + "---\nx: 1\n";
    let classes: Vec<(&str, String)> = vec![
        ("a job whose Dataset is missing", JOB.to_owned()),
        ("a file over 3 MiB", big_comment),
        ("200 KB of nested brackets", format!("x: {}{}\n", "[".repeat(100_000), "]".repeat(100_000))),
        (
            "mappings nested 100 deep",
            format!("x:\n{}", (0..100).map(|i| format!("{}a:\n", " ".repeat(i + 1))).collect::<String>()),
        ),
        ("an unknown field (typo)", JOB.replace("trigger: {", "trigger: {checkPeriodSecond: 5, ")),
        ("a key given twice", JOB.replace("outputDir: out", "outputDir: out\n  outputDir: again")),
        ("a .nan", JOB.replace("trainProb: 0.5", "trainProb: .nan")),
        ("20,000 documents, the last one bad", many_documents),
        ("alias expansion (billion laughs)", {
            let mut text = String::from("a: &a [x, x, x, x, x, x, x, x, x]\n");
            for i in 0..8 {
                let prev = if i == 0 { "a".to_owned() } else { format!("a{}", i - 1) };
                text.push_str(&format!(
                    "a{i}: &a{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
                ));
            }
            text
        }),
    ];
    println!("{:<50} {:>18} {:>20}", "refused input", "time to exit 2", "peak RSS");
    for (i, (class, text)) in classes.iter().enumerate() {
        let file = dir.path().join(format!("bad{i}.yaml"));
        std::fs::write(&file, text).unwrap();
        let mut times = Vec::new();
        let mut rss = Vec::new();
        for run in 0..5 {
            let state = dir.path().join(format!("state-{i}-{run}"));
            let (code, time, max_rss) = refuse(&file, &state);
            assert_eq!(code, Some(2), "{class}: exit {code:?}");
            times.push(time);
            rss.push(max_rss);
        }
        let (tmin, tmax) = (times.iter().min().unwrap(), times.iter().max().unwrap());
        let (rmin, rmax) = (rss.iter().min().unwrap(), rss.iter().max().unwrap());
        println!(
            "{class:<50} {:>7.1}-{:<7.1} ms {:>7.1}-{:<7.1} MiB",
            tmin.as_secs_f64() * 1e3,
            tmax.as_secs_f64() * 1e3,
            *rmin as f64 / 1024.0,
            *rmax as f64 / 1024.0
        );
    }
}
