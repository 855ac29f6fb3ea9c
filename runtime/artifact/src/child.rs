//! Running this program's compiling subcommand as a child process at a low priority, and giving
//! freed memory back after a large piece of work. Without the Wasm runtime: the operator runs its
//! compiles for the nodes this way.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

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
pub fn run_low_priority(mut command: Command, stdin: &[u8], priority: Priority) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let exe = std::path::PathBuf::from(command.get_program());
    command.env("RUST_LOG", "warn").stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
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
    let written = child.stdin.take().map(|mut pipe| pipe.write_all(stdin));
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        // Bounded: a message, not a flood.
        let _ = pipe.by_ref().take(64 << 10).read_to_string(&mut stderr);
    }
    let status = child.wait().map_err(|err| format!("the compiler: {err}"))?;
    let message = stderr.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or_default().to_owned();
    match (status.success(), written) {
        (true, Some(Ok(()))) => Ok(()),
        (true, _) => Err("the compiler did not take the component".into()),
        (false, _) => Err(match (status.code(), message.is_empty()) {
            (_, false) => message.trim_start_matches("perennial: ").to_owned(),
            (Some(code), true) => format!("the compiler exited with code {code}"),
            (None, true) => format!("the compiler was killed ({status}): out of memory?"),
        }),
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
