//! Running this program's compiling subcommand as a child process at a low priority (and, for
//! the operator's, giving way to its control plane), and giving freed memory back after a large
//! piece of work. Without the Wasm runtime: the operator runs its compiles for the nodes this way.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::give_way::{GiveWay, Pace};

/// How often a compile that gives way looks at the control plane's work.
const PACE_EVERY: Duration = Duration::from_millis(5);

/// What the compiling subcommand prints (a line on its standard output) once it has fetched the
/// component: a compile gives way only from then on, so that a pause never runs out the fetch's
/// timeouts.
pub const FETCHED: &str = "fetched ";

/// How far below the parent a compiling child runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// `nice` 10: beside the decisions of running jobs, which a compile may be waited for by.
    Low,
    /// Linux's `SCHED_IDLE`: only on a core nothing else wants (the operator's compiles for its
    /// nodes, which no reconcile waits for).
    Idle,
}

/// Runs `command` (this program's compiling subcommand) as a child at `priority` that dies with
/// its parent, `stdin` on its standard input. The error is the child's last line on standard
/// error, or how it ended.
pub fn run_low_priority(command: Command, stdin: &[u8], priority: Priority) -> Result<(), String> {
    run_child(command, stdin, priority, None).map(drop)
}

/// [`run_low_priority`] at [`Priority::Idle`], the child stopped whenever `give_way` says the
/// control plane has work (see [`crate::give_way`]); how long it was stopped.
pub fn run_giving_way(command: Command, stdin: &[u8], give_way: &GiveWay) -> Result<Duration, String> {
    run_child(command, stdin, Priority::Idle, Some(give_way))
}

fn run_child(
    mut command: Command,
    stdin: &[u8],
    priority: Priority,
    give_way: Option<&GiveWay>,
) -> Result<Duration, String> {
    use std::os::unix::process::CommandExt;
    let exe = std::path::PathBuf::from(command.get_program());
    let stdout = if give_way.is_some() { Stdio::piped() } else { Stdio::null() };
    command.env("RUST_LOG", "warn").stdin(Stdio::piped()).stdout(stdout).stderr(Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec: prctl, setpriority and
    // sched_setscheduler.
    unsafe {
        command.pre_exec(move || {
            #[cfg(target_os = "linux")]
            {
                // The child dies with its parent: no orphan compile.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                match priority {
                    Priority::Low => {
                        libc::setpriority(libc::PRIO_PROCESS, 0, 10);
                    }
                    Priority::Idle => {
                        libc::setpriority(libc::PRIO_PROCESS, 0, 19);
                        let param = libc::sched_param { sched_priority: 0 };
                        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
                    }
                }
            }
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|err| format!("cannot start the compiler {}: {err}", exe.display()))?;
    let (ended, fetched) = (AtomicBool::new(false), AtomicBool::new(false));
    let pid = child.id();
    let (written, stderr, paused) = std::thread::scope(|scope| {
        let pacing = give_way.map(|give_way| scope.spawn(|| pace(pid, give_way, &fetched, &ended)));
        if let Some(pipe) = child.stdout.take() {
            scope.spawn(|| watch_for_fetched(pipe, &fetched));
        }
        let written = child.stdin.take().map(|mut pipe| pipe.write_all(stdin));
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            // Bounded: a message, not a flood.
            let _ = pipe.by_ref().take(64 << 10).read_to_string(&mut stderr);
        }
        // The pacing stops before the child is reaped: its pid is never another process's then.
        if give_way.is_some() {
            wait_unreaped(pid);
        }
        ended.store(true, Ordering::Relaxed);
        let paused = pacing.and_then(|pacing| pacing.join().ok()).unwrap_or_default();
        (written, stderr, paused)
    });
    let status = child.wait().map_err(|err| format!("the compiler: {err}"))?;
    let message = stderr.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or_default().to_owned();
    match (status.success(), written) {
        (true, Some(Ok(()))) => Ok(paused),
        (true, _) => Err("the compiler did not take the component".into()),
        (false, _) => Err(match (status.code(), message.is_empty()) {
            (_, false) => message.trim_start_matches("perennial: ").to_owned(),
            (Some(code), true) => format!("the compiler exited with code {code}"),
            (None, true) => format!("the compiler was killed ({status}): out of memory?"),
        }),
    }
}

/// Waits until the child `pid` has ended, leaving it to be reaped.
fn wait_unreaped(pid: u32) {
    #[cfg(target_os = "linux")]
    loop {
        // SAFETY: `info` is a valid siginfo_t for waitid to fill; `pid` is our unreaped child.
        let ended = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT)
        };
        if ended == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// Reads the child's standard output to its end, telling when it said [`FETCHED`].
fn watch_for_fetched(pipe: std::process::ChildStdout, fetched: &AtomicBool) {
    use std::io::BufRead as _;
    let mut lines = std::io::BufReader::new(pipe);
    let mut line = Vec::new();
    // Each line bounded; the rest of the output read and dropped (the child never blocks on it).
    while lines.by_ref().take(4096).read_until(b'\n', &mut line).is_ok_and(|read| read > 0) {
        if line.starts_with(FETCHED.as_bytes()) {
            fetched.store(true, Ordering::Relaxed);
        }
        line.clear();
    }
}

/// Stops and continues the child `pid` as [`Pace`] says once it has `fetched`, until it
/// `ended`; how long it was stopped. It is left running.
fn pace(pid: u32, give_way: &GiveWay, fetched: &AtomicBool, ended: &AtomicBool) -> Duration {
    let mut pace = Pace::new(Instant::now());
    let mut paused = Duration::ZERO;
    let signal = |signal| {
        // SAFETY: kill has no memory preconditions; `pid` is our child, not yet reaped while
        // `ended` is false (a zombie takes the signal harmlessly).
        #[cfg(target_os = "linux")]
        unsafe {
            libc::kill(pid as libc::pid_t, signal);
        }
    };
    while !ended.load(Ordering::Relaxed) {
        let quiet_for = if fetched.load(Ordering::Relaxed) { give_way.quiet_for() } else { None };
        let next = pace.next(Instant::now(), quiet_for);
        match (pace.runs(), next.runs()) {
            (true, false) => signal(libc::SIGSTOP),
            (false, true) => signal(libc::SIGCONT),
            _ => {}
        }
        pace = next;
        std::thread::sleep(PACE_EVERY);
        if !pace.runs() {
            paused += PACE_EVERY;
        }
    }
    // Not stopped for good if its wait failed (the child not reaped yet: still ours).
    if !pace.runs() {
        signal(libc::SIGCONT);
    }
    paused
}

/// Has glibc map every allocation of 256 KiB and more on its own, and unmap it when freed: its
/// default threshold rises to the largest buffer freed (up to 32 MiB), after which such buffers
/// (an artifact's chunks and their base64, a megabyte each) come from the heaps of the threads
/// that made them and stay there in pieces. For a process that moves large buffers for long.
pub fn map_large_buffers_apart() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it has no memory preconditions.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}

/// Gives the heap's free pages back to the system (glibc keeps them otherwise): after a compile
/// or a large transfer, the process's RSS is what it holds, not what it once held.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that says it fetched, then works for 0.2 s, while the control plane is busy for
    /// `busy_for`: how long it took, and how long it was paused.
    fn while_busy(script: &str, busy_for: Duration) -> (Duration, Duration) {
        let give_way = std::sync::Arc::new(GiveWay::default());
        let started = Instant::now();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while started.elapsed() < busy_for {
                    let _call = give_way.begin();
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
            let mut command = Command::new("sh");
            command.args(["-c", script]);
            let paused = run_giving_way(command, &[], &give_way).expect("the child ran");
            (started.elapsed(), paused)
        })
    }

    #[test]
    fn a_child_giving_way_waits_while_the_control_plane_works_and_ends_once_it_is_quiet() {
        let busy_for = Duration::from_millis(1500);
        let (took, paused) = while_busy("echo fetched x; sleep 0.2", busy_for);
        assert!(took >= busy_for, "ended after {took:?}, within the control plane's work");
        assert!(took < busy_for + Duration::from_secs(3), "not continued once quiet: {took:?}");
        assert!(paused >= busy_for / 2, "paused {paused:?}");
    }

    #[test]
    fn a_child_is_not_paused_before_it_has_fetched() {
        // Its fetch has timeouts of its own: a pause must not run them out.
        let (took, paused) = while_busy("sleep 0.2", Duration::from_millis(1500));
        assert!(took < Duration::from_millis(1400) && paused.is_zero(), "took {took:?}, paused {paused:?}");
    }

    #[test]
    fn a_child_with_nothing_to_give_way_to_runs_at_once() {
        let started = Instant::now();
        let mut command = Command::new("sh");
        command.args(["-c", "echo fetched x; sleep 0.2"]);
        run_giving_way(command, &[], &GiveWay::default()).expect("the child ran");
        assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
        let mut failing = Command::new("sh");
        failing.args(["-c", "echo 'perennial: no such plugin' >&2; exit 3"]);
        let err = run_giving_way(failing, &[], &GiveWay::default()).expect_err("exit 3");
        assert_eq!(err, "no such plugin", "the child's last line, as run_low_priority says it");
    }
}
