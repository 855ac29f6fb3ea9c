//! A state dir's two stores hold one history together: `control.db` (the jobs, their stages
//! and rounds) and `edge.db` (which samples went into which round, the cursor in each index).
//! Neither is worth anything without the other: an edge store made anew beside jobs that have
//! run reads their datasets again from the first byte and trains on samples already trained.
//!
//! So `control.db` records the identity of the edge store it runs with, and at every open the
//! two are checked against each other. A lost, emptied or foreign store is refused, naming the
//! jobs it would cost and what to do; it is never silently replaced. The decision is a pure
//! function of what each store holds ([`decide`]); [`open_edge`] reads the stores and acts.

use std::path::Path;

use rusqlite::{OptionalExtension, params};

use perennial_edge::sqlite::{Store, StoreError, store_id};

/// A job's history, as one store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobHistory {
    /// `namespace/name`.
    pub key: String,
    pub uid: String,
    /// The last round started (0: none).
    pub round: u64,
    /// Whether the store holds anything of it worth keeping (a round, or samples read).
    pub started: bool,
}

/// What the two stores hold, as far as their pairing goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// The edge store `control.db` was last run with.
    pub paired_with: Option<String>,
    /// The edge store's identity; `None` when there is no `edge.db` (or it is empty).
    pub edge_id: Option<String>,
    pub control_jobs: Vec<JobHistory>,
    pub edge_jobs: Vec<JobHistory>,
}

/// What to do with a pair that may be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// They are each other's.
    Paired,
    /// Nothing of either is lost by running them together: record the pairing.
    Pair,
}

/// Why the two stores may not be used together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// `control.db` holds jobs that have run, and the edge store does not hold their history.
    EdgeLost { jobs: Vec<JobHistory>, replaced: bool },
    /// The edge store holds jobs that have run, and `control.db` does not know them.
    ControlLost { jobs: Vec<JobHistory> },
    /// The same job at rounds that cannot go together: one store was put back from an older
    /// backup (the edge starts each round, so it is at the control plane's round or one ahead).
    RoundsApart { job: String, control_round: u64, edge_round: u64 },
}

/// Decides whether the two stores belong together.
pub fn decide(view: &View) -> Result<Decision, Mismatch> {
    let started_control: Vec<&JobHistory> = view.control_jobs.iter().filter(|j| j.started).collect();
    let started_edge: Vec<&JobHistory> = view.edge_jobs.iter().filter(|j| j.started).collect();
    let same_job = |a: &JobHistory, b: &JobHistory| a.key == b.key && a.uid == b.uid;
    for control in &view.control_jobs {
        let Some(edge) = view.edge_jobs.iter().find(|edge| same_job(control, edge)) else { continue };
        if edge.round < control.round || edge.round > control.round + 1 {
            let (control_round, edge_round) = (control.round, edge.round);
            return Err(Mismatch::RoundsApart { job: control.key.clone(), control_round, edge_round });
        }
    }
    match (&view.paired_with, &view.edge_id) {
        (Some(paired), Some(edge)) if paired == edge => return Ok(Decision::Paired),
        // Paired once with an edge store that is not this one (or is gone): whatever history
        // either holds belongs to another.
        (Some(_), _) => {
            if !started_control.is_empty() {
                let jobs = started_control.into_iter().cloned().collect();
                return Err(Mismatch::EdgeLost { jobs, replaced: view.edge_id.is_some() });
            }
            if !started_edge.is_empty() {
                return Err(Mismatch::ControlLost { jobs: started_edge.into_iter().cloned().collect() });
            }
        }
        // Never paired (a new control.db, or one from before pairing): each job's history must
        // be in both.
        (None, _) => {
            let lost: Vec<JobHistory> = started_control
                .iter()
                .filter(|c| !view.edge_jobs.iter().any(|e| same_job(c, e)))
                .map(|c| (*c).clone())
                .collect();
            if !lost.is_empty() {
                return Err(Mismatch::EdgeLost { jobs: lost, replaced: view.edge_id.is_some() });
            }
            let unknown: Vec<JobHistory> = started_edge
                .iter()
                .filter(|e| !view.control_jobs.iter().any(|c| same_job(c, e)))
                .map(|e| (*e).clone())
                .collect();
            if !unknown.is_empty() {
                return Err(Mismatch::ControlLost { jobs: unknown });
            }
        }
    }
    Ok(Decision::Pair)
}

#[derive(Debug, thiserror::Error)]
pub enum PairingError {
    #[error("{0}")]
    Mismatch(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{path}: {source}")]
    Sql { path: String, source: rusqlite::Error },
}

impl Mismatch {
    /// The refusal as a user reads it: which store, which jobs, what to do.
    pub fn explain(&self, state_dir: &Path) -> String {
        let dir = state_dir.display();
        let list = |jobs: &[JobHistory]| {
            jobs.iter()
                .map(|j| if j.round > 0 { format!("{} (round {})", j.key, j.round) } else { j.key.clone() })
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Mismatch::EdgeLost { jobs, replaced } => format!(
                "{dir}/edge.db {} does not hold the history of {} that {dir}/control.db has run: which samples \
                 went into which round is lost, and going on would train again on samples already trained. Put \
                 back the edge.db (with edge.db-wal) that goes with this control.db from a backup, or start \
                 over with `perennial delete JOB --state-dir {dir}` for each job (move its output folder away \
                 first to keep its files: the new rounds write over them), then `perennial run` again",
                if *replaced {
                    "is not the edge store that control.db was run with (one of the two was made anew or replaced):"
                } else {
                    "is missing or empty:"
                },
                list(jobs)
            ),
            Mismatch::RoundsApart { job, control_round, edge_round } => {
                let older = if edge_round < control_round { "edge.db" } else { "control.db" };
                format!(
                    "{dir}/control.db has job {job} at round {control_round} and {dir}/edge.db at round \
                     {edge_round}: {older} is older than the other (put back from an older backup?), and going on \
                     would write round files again or wait forever. Put back the {older} that goes with the other \
                     store, or start the job over with `perennial delete {job} --state-dir {dir}`"
                )
            }
            Mismatch::ControlLost { jobs } => format!(
                "{dir}/control.db does not know {}, which {dir}/edge.db has run: control.db was removed, emptied or \
                 replaced. Put back control.db (with control.db-wal) from a backup, or move edge.db away to start \
                 every job over (their files stay in their output folders)",
                list(jobs)
            ),
        }
    }
}

/// What `control.db` holds: its jobs (a status with a round: they have run) and its pairing.
fn control_view(control: &Store) -> Result<(Option<String>, Vec<JobHistory>), rusqlite::Error> {
    let paired: Option<String> =
        control.conn().query_row("SELECT value FROM meta WHERE key = 'edge_store'", [], |r| r.get(0)).optional()?;
    let mut statement = control.conn().prepare(
        "SELECT o.key, o.uid, s.body FROM objects o LEFT JOIN status s ON s.job = o.key
         WHERE o.kind = 'LifelongLearningJob' ORDER BY o.key",
    )?;
    let jobs = statement
        .query_map([], |r| {
            let status: Option<String> = r.get(2)?;
            let status: perennial_api::LifelongLearningJobStatus =
                status.and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default();
            Ok(JobHistory {
                key: r.get(0)?,
                uid: r.get(1)?,
                round: status.round,
                started: status.round > 0 || status.rounds_completed > 0,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok((paired, jobs))
}

/// What the edge store holds: its identity and its jobs (a round, or samples read: they have run).
fn edge_view(edge: &Store) -> Result<(Option<String>, Vec<JobHistory>), rusqlite::Error> {
    let id = store_id(edge.conn())?;
    let mut statement = edge.conn().prepare("SELECT name, uid, round, batches FROM jobs ORDER BY name")?;
    let jobs = statement
        .query_map([], |r| {
            let (round, batches): (i64, i64) = (r.get(2)?, r.get(3)?);
            Ok(JobHistory {
                key: r.get(0)?,
                uid: r.get(1)?,
                round: u64::try_from(round).unwrap_or(0),
                started: round > 0 || batches > 0,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok((id, jobs))
}

/// Opens the state dir's edge store if it belongs with `control` (pairing them if they were
/// never paired); refuses it, naming what is lost and what to do, if not. A missing `edge.db`
/// is created only when nothing is lost by it.
pub fn open_edge(state_dir: &Path, control: &mut Store) -> Result<Store, PairingError> {
    let path = state_dir.join("edge.db");
    let control_sql = |source| PairingError::Sql { path: state_dir.join("control.db").display().to_string(), source };
    let edge_sql = |source| PairingError::Sql { path: path.display().to_string(), source };
    let (paired_with, control_jobs) = control_view(control).map_err(control_sql)?;
    let exists = std::fs::metadata(&path).is_ok_and(|m| m.len() > 0);
    let edge = if exists { Some(Store::open(&path)?) } else { None };
    let (edge_id, edge_jobs) = match &edge {
        Some(edge) => edge_view(edge).map_err(edge_sql)?,
        None => (None, Vec::new()),
    };
    let view = View { paired_with, edge_id, control_jobs, edge_jobs };
    let decision = decide(&view).map_err(|mismatch| PairingError::Mismatch(mismatch.explain(state_dir)))?;
    let edge = match edge {
        Some(edge) => edge,
        None => Store::open(&path)?,
    };
    if decision == Decision::Pair {
        let id = store_id(edge.conn()).map_err(edge_sql)?.unwrap_or_default();
        // Another edge store than the one paired before (nothing of the old one's is lost: it
        // had no history): its outbox numbers reports from 1 again.
        let another = view.paired_with.as_ref().is_some_and(|paired| *paired != id);
        let tx = control.write().map_err(control_sql)?;
        if another {
            tx.execute("UPDATE link SET applied_seq = 0 WHERE id = 1", []).map_err(control_sql)?;
        }
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ('edge_store', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![id],
        )
        .map_err(control_sql)?;
        tx.commit().map_err(control_sql)?;
    }
    Ok(edge)
}

/// Whether the state dir's stores belong together, without changing either (for readers such
/// as `perennial status`): the refusal `perennial run` would give, if it would.
pub fn check_readonly(state_dir: &Path, control: &Store, edge: Option<&Store>) -> Result<(), PairingError> {
    let control_sql = |source| PairingError::Sql { path: state_dir.join("control.db").display().to_string(), source };
    let (paired_with, control_jobs) = control_view(control).map_err(control_sql)?;
    let (edge_id, edge_jobs) = match edge {
        Some(edge) => edge_view(edge)
            .map_err(|source| PairingError::Sql { path: state_dir.join("edge.db").display().to_string(), source })?,
        None => (None, Vec::new()),
    };
    decide(&View { paired_with, edge_id, control_jobs, edge_jobs })
        .map(drop)
        .map_err(|mismatch| PairingError::Mismatch(mismatch.explain(state_dir)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(key: &str, uid: &str, round: u64, started: bool) -> JobHistory {
        JobHistory { key: key.into(), uid: uid.into(), round, started }
    }

    #[test]
    fn pairs_are_decided_by_what_each_store_holds() {
        let ran = job("default/a", "u1", 2, true);
        let new = job("default/a", "u1", 0, false);
        let edge = |id: &str| Some(id.to_owned());
        let cases: Vec<(&str, View, Result<Decision, &str>)> = vec![
            ("paired", View { paired_with: edge("e"), edge_id: edge("e"), ..View::default() }, Ok(Decision::Paired)),
            ("a new state dir", View::default(), Ok(Decision::Pair)),
            (
                "edge.db removed after two rounds",
                View { paired_with: edge("e"), control_jobs: vec![ran.clone()], ..View::default() },
                Err("edge lost"),
            ),
            (
                "edge.db emptied (made anew, another id)",
                View { paired_with: edge("e"), edge_id: edge("f"), control_jobs: vec![ran.clone()], ..View::default() },
                Err("edge lost"),
            ),
            (
                "edge.db replaced, no job has run yet: nothing lost",
                View { paired_with: edge("e"), edge_id: edge("f"), control_jobs: vec![new.clone()], ..View::default() },
                Ok(Decision::Pair),
            ),
            (
                "control.db removed, edge.db has run a job",
                View { edge_id: edge("e"), edge_jobs: vec![ran.clone()], ..View::default() },
                Err("control lost"),
            ),
            (
                "another state dir's edge.db",
                View {
                    paired_with: edge("e"),
                    edge_id: edge("f"),
                    control_jobs: vec![new.clone()],
                    edge_jobs: vec![job("default/b", "u9", 4, true)],
                },
                Err("control lost"),
            ),
            (
                "never paired (before pairing), both hold the job",
                View {
                    edge_id: edge("e"),
                    control_jobs: vec![ran.clone()],
                    edge_jobs: vec![ran.clone()],
                    ..View::default()
                },
                Ok(Decision::Pair),
            ),
            (
                "never paired, the edge holds the job under another uid",
                View {
                    edge_id: edge("e"),
                    control_jobs: vec![ran.clone()],
                    edge_jobs: vec![job("default/a", "u0", 2, true)],
                    ..View::default()
                },
                Err("edge lost"),
            ),
            (
                "edge.db put back from an older backup",
                View {
                    paired_with: edge("e"),
                    edge_id: edge("e"),
                    control_jobs: vec![job("default/a", "u1", 3, true)],
                    edge_jobs: vec![job("default/a", "u1", 1, true)],
                },
                Err("rounds apart"),
            ),
            (
                "control.db put back from an older backup",
                View {
                    paired_with: edge("e"),
                    edge_id: edge("e"),
                    control_jobs: vec![job("default/a", "u1", 1, true)],
                    edge_jobs: vec![job("default/a", "u1", 4, true)],
                },
                Err("rounds apart"),
            ),
            (
                "the edge one round ahead (its Train Ready on its way)",
                View {
                    paired_with: edge("e"),
                    edge_id: edge("e"),
                    control_jobs: vec![job("default/a", "u1", 2, true)],
                    edge_jobs: vec![job("default/a", "u1", 3, true)],
                },
                Ok(Decision::Paired),
            ),
        ];
        for (case, view, expected) in cases {
            let got = decide(&view).map_err(|m| match m {
                Mismatch::EdgeLost { .. } => "edge lost",
                Mismatch::ControlLost { .. } => "control lost",
                Mismatch::RoundsApart { .. } => "rounds apart",
            });
            assert_eq!(got, expected, "{case}");
        }
    }

    #[test]
    fn a_refusal_names_the_store_the_jobs_and_what_to_do() {
        let mismatch = Mismatch::EdgeLost { jobs: vec![job("default/a", "u1", 2, true)], replaced: false };
        let text = mismatch.explain(Path::new("/s"));
        for part in
            ["/s/edge.db is missing or empty", "default/a (round 2)", "/s/control.db", "backup", "perennial delete"]
        {
            assert!(text.contains(part), "{part:?} in {text}");
        }
    }
}
