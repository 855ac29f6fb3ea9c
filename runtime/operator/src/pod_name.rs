//! A worker pod's name, fixed by what it is: the job (by uid), the stage, the round and the
//! job's retries (a failed stage's next start is another start), all written to the status
//! before the pod is created. A second create of the same start, from an operator process that
//! died with its create in flight and the one after it, or from a leader that has just lost its
//! Lease and the one that took it, then gets 409 AlreadyExists instead of making a second worker.
//! A worker made again after it vanished keeps the name, as a StatefulSet's pod does: while the
//! vanished one is still there (deleting, or its create still in flight) the create finds it and
//! waits for it. The name looks like a `generateName` pod's (`<job>-train-x7k2p`), as Sedna's do.

use sha2::{Digest, Sha256};

/// The API server's `generateName` suffix alphabet (no vowels, no look-alikes).
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// The suffix's length, as `generateName`'s.
const SUFFIX_LEN: usize = 5;
/// How much of `<job>-<kind>-` is kept, as the API server truncates a `generateName`.
const MAX_BASE_LEN: usize = 63 - SUFFIX_LEN;

/// Which start of a stage in a round a worker is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Start<'a> {
    pub job_uid: &'a str,
    pub kind: &'a str,
    pub round: u64,
    /// The job's failed stages since its last completed round.
    pub retries: u32,
}

/// The pod name of `start` for the job named `job_name`.
pub fn worker_pod_name(job_name: &str, start: &Start<'_>) -> String {
    let mut base = format!("{job_name}-{}-", start.kind);
    // Job names are DNS subdomains (ASCII): cutting at any byte is cutting at a character.
    base.truncate(MAX_BASE_LEN);
    let Start { job_uid, kind, round, retries } = start;
    let digest = Sha256::digest(format!("{job_uid}/{kind}/{round}/{retries}"));
    let suffix: String =
        digest.iter().take(SUFFIX_LEN).map(|byte| ALPHABET[*byte as usize % ALPHABET.len()] as char).collect();
    base + &suffix
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(round: u64, retries: u32) -> Start<'static> {
        Start { job_uid: "0f3c-uid", kind: "train", round, retries }
    }

    #[test]
    fn the_same_start_gets_the_same_name_and_any_other_start_another() {
        let name = worker_pod_name("thermal", &start(3, 0));
        assert_eq!(name, worker_pod_name("thermal", &start(3, 0)));
        assert!(name.starts_with("thermal-train-"), "{name}");
        assert_eq!(name.len(), "thermal-train-".len() + SUFFIX_LEN);
        let others = [start(4, 0), start(3, 1), Start { kind: "eval", ..start(3, 0) }];
        let mut names: Vec<String> = others.iter().map(|s| worker_pod_name("thermal", s)).collect();
        names.push(name);
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 4, "{names:?}");
        // Another job of the same name (deleted and made again) has another uid: other names.
        let again = Start { job_uid: "9a1d-uid", ..start(3, 0) };
        assert_ne!(worker_pod_name("thermal", &again), worker_pod_name("thermal", &start(3, 0)));
    }

    #[test]
    fn a_long_job_name_is_cut_as_generate_name_is_and_the_name_stays_a_valid_pod_name() {
        let long = "a".repeat(250);
        let name = worker_pod_name(&long, &start(1, 0));
        assert_eq!(name.len(), 63);
        assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()), "{name}");
    }
}
