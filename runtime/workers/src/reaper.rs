//! The reaper: whatever a worker started dies with the run, however the run ends.
//!
//! Each worker runs in a process group of its own. Without a reaper, its direct child dies with
//! the run (`PR_SET_PDEATHSIG`); but a process the worker started (`bash -c "python3 train.py;
//! ..."`) is a grandchild, which the kernel would leave running after a `kill -9` of the run: it
//! would go on training and writing the round's files beside the next run. So `perennial run`
//! starts one small helper, `perennial reap`, in a process group of its own, and tells it over
//! a pipe each worker group it starts (`+PGID`) and each one that is gone (`-PGID`). The pipe's
//! write end is the run's alone (close-on-exec): when the run ends, however it ends, the helper
//! reads end-of-file, kills every group still listed, and exits. With a reaper, workers are
//! started without `PR_SET_PDEATHSIG` (so with `posix_spawn`, not a fork of the run): the only
//! moment neither covers is the microseconds between a worker's start and its line here.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The run's side: where it tells the helper about worker groups.
#[derive(Debug)]
pub struct Reaper {
    to_helper: Option<std::io::PipeWriter>,
    helper: Child,
}

impl Reaper {
    /// Starts `program reap` (the `perennial` binary itself).
    pub fn start(program: &Path) -> std::io::Result<Reaper> {
        let (from_run, to_helper) = std::io::pipe()?;
        let mut command = Command::new(program);
        command.arg("reap").stdin(Stdio::from(from_run)).stdout(Stdio::null());
        // Its own group: a Ctrl-C sent to the run's group must not end it before the workers.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let helper = command.spawn()?;
        Ok(Reaper { to_helper: Some(to_helper), helper })
    }

    /// A worker group started.
    pub fn started(&mut self, pgid: u32) {
        if let Some(pipe) = &mut self.to_helper {
            let _ = writeln!(pipe, "+{pgid}");
        }
    }

    /// A worker group ended (all of it killed): its number may be reused.
    pub fn ended(&mut self, pgid: u32) {
        if let Some(pipe) = &mut self.to_helper {
            let _ = writeln!(pipe, "-{pgid}");
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // Closing our end is the helper's signal; it exits once it has killed what is left.
        self.to_helper = None;
        let _ = self.helper.wait();
    }
}

/// The helper's side (`perennial reap`): reads `+PGID` / `-PGID` lines until end-of-file, then
/// sends SIGKILL to every group still listed. Returns the groups it killed.
pub fn serve(from_run: impl Read) -> Vec<u32> {
    let mut groups = BTreeSet::new();
    for line in BufReader::new(from_run).lines() {
        let Ok(line) = line else { break };
        let (sign, number) = line.split_at(line.len().min(1));
        match (sign, number.parse::<u32>()) {
            ("+", Ok(pgid)) if pgid > 1 => {
                groups.insert(pgid);
            }
            ("-", Ok(pgid)) => {
                groups.remove(&pgid);
            }
            _ => {}
        }
    }
    for pgid in &groups {
        if let Ok(pgid) = libc::pid_t::try_from(*pgid) {
            // SAFETY: kill(2) with a negated group id the run created; no memory is involved.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
    groups.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Running (a killed process may linger as a zombie until its new parent reaps it).
    fn alive(pid: i32) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
        state.is_some_and(|state| state != 'Z' && state != 'X')
    }

    #[test]
    fn at_end_of_input_every_group_still_listed_is_killed() {
        // Two groups, each a shell with a grandchild; the second is said to have ended.
        let mut groups = Vec::new();
        for _ in 0..2 {
            let mut command = Command::new("sh");
            command.args(["-c", "sleep 300 & echo $!; wait"]).stdout(Stdio::piped());
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
            let mut child = command.spawn().unwrap();
            let mut line = String::new();
            BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
            groups.push((child, line.trim().parse::<i32>().unwrap()));
        }
        let (first, second) = (groups[0].0.id(), groups[1].0.id());
        let said = format!("+{first}\n+{second}\n-{second}\nnonsense\n+1\n");
        assert_eq!(serve(said.as_bytes()), vec![first]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(groups[0].1) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(groups[0].1), "the listed group's grandchild is killed");
        assert!(alive(groups[1].1), "an ended group is left alone");
        for (mut child, grandchild) in groups {
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
                libc::kill(grandchild, libc::SIGKILL);
            }
            let _ = child.wait();
        }
    }
}
