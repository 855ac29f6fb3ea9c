//! Table tests for the stage machine. Each table is a list of cases (a status, what was
//! observed, the time) with the expected (stage, phase, round), the conditions appended, the
//! actions and the recheck. One table covers the rows of Sedna's state machine
//! (`reference/sedna.md` §2.2); the others cover the faults of §6.1 that the machine fixes.

use std::time::Duration;

use jiff::Timestamp;

use super::machine::backoff;
use super::{
    Action, JobView, Observations, Report, Settings, StageNotice, Step, WorkerObservation, WorkerPhase, WorkerSpec,
    step,
};
use perennial_api::{
    ConditionData, DeployedModel, Input, JobCondition, LifelongLearningJobStatus, MAX_CONDITIONS, Model, Output, Phase,
    Stage, Time, WorkerRef,
};

use Phase::{Completed, Failed, Ready, Running, Starting, Waiting};
use Stage::{Deploy, Eval, Train};

const UID: &str = "7d3f-job-uid";

// ---------------------------------------------------------------------------------------------
// Fixtures

/// `secs` seconds after a fixed instant; most cases run at `at(0)`.
fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn time(secs: i64) -> Option<Time> {
    Some(Time(at(secs)))
}

fn later(t: Timestamp, secs: u64) -> Timestamp {
    Timestamp::from_second(t.as_second() + i64::try_from(secs).unwrap()).unwrap()
}

fn model(name: &str) -> Model {
    Model { format: "pkl".into(), url: format!("s3://kb/{name}/index.pkl"), metrics: None }
}

/// The input each stage's Ready carries.
fn input(stage: Stage) -> Input {
    match stage {
        Train => Input {
            data_url: Some("s3://kb/data/train.txt".into()),
            output_dir: Some("s3://kb/out".into()),
            ..Input::default()
        },
        Eval => Input {
            models: vec![model("trained")],
            data_url: Some("s3://kb/data/eval.txt".into()),
            output_dir: Some("s3://kb/out".into()),
            ..Input::default()
        },
        Deploy => Input { models: vec![model("selected")], ..Input::default() },
    }
}

fn spec(stage: Stage, round: u64, previous_model: Option<Model>) -> WorkerSpec {
    WorkerSpec { stage, round, input: input(stage), previous_model }
}

fn worker_name(stage: Stage, round: u64) -> String {
    format!("job-{}-{round}", stage.worker_kind())
}

fn condition(stage: Stage, phase: Phase, when: i64) -> JobCondition {
    JobCondition {
        type_: phase,
        status: "True".into(),
        stage,
        last_heartbeat_time: time(when),
        last_transition_time: time(when),
        reason: None,
        message: None,
        data: None,
    }
}

/// A status in (stage, phase) of `round` as the machine leaves it: the matching newest
/// condition, the stage's input from Ready on, and from Starting on the worker, started 60 s ago
/// (its node known once Running).
fn status(stage: Stage, phase: Phase, round: u64) -> LifelongLearningJobStatus {
    let worker = matches!(phase, Starting | Running).then(|| WorkerRef {
        name: worker_name(stage, round),
        stage: Some(stage),
        round,
        restarts: 0,
        recreations: 0,
        node: (phase == Running).then(|| "edge-1".into()),
        started_at: time(-60),
    });
    let data = (phase != Waiting).then(|| ConditionData { input: Some(input(stage)), output: None });
    LifelongLearningJobStatus {
        conditions: vec![condition(stage, phase, -60)],
        start_time: time(-3600),
        stage: Some(stage),
        phase: Some(phase),
        round,
        phase_since: time(-60),
        data,
        worker,
        ..LifelongLearningJobStatus::default()
    }
}

/// The model an earlier round deployed.
fn deployed(round: u64) -> DeployedModel {
    DeployedModel { round, url: model("old").url, format: "pkl".into(), metrics: None, since: time(-7200) }
}

fn report(stage: Stage, round: u64, kind: Phase) -> Report {
    Report { job_uid: UID.into(), round, stage: Some(stage), status: Some(kind), ..Report::default() }
}

fn ready(stage: Stage, round: u64) -> Report {
    Report { data: ConditionData { input: Some(input(stage)), output: None }, ..report(stage, round, Ready) }
}

fn completed(stage: Stage, round: u64, models: &[&str]) -> Report {
    let output = Output { models: models.iter().map(|m| model(m)).collect() };
    Report { data: ConditionData { input: None, output: Some(output) }, ..report(stage, round, Completed) }
}

fn failed(stage: Stage, round: u64, why: &str) -> Report {
    Report { reason: Some(why.into()), ..report(stage, round, Failed) }
}

/// Starting, as the step that created the worker left it: its name and node not known yet.
fn just_created(stage: Stage, round: u64) -> LifelongLearningJobStatus {
    let mut status = status(stage, Starting, round);
    if let Some(worker) = status.worker.as_mut() {
        worker.name = String::new();
        worker.node = None;
    }
    status
}

/// The worker of (stage, round) on `edge-1`; it exited 5 s ago if Succeeded or Failed.
fn worker(stage: Stage, round: u64, phase: WorkerPhase) -> WorkerObservation {
    let exited = matches!(phase, WorkerPhase::Succeeded | WorkerPhase::Failed);
    WorkerObservation {
        name: worker_name(stage, round),
        stage,
        round,
        phase,
        restarts: 0,
        node: Some("edge-1".into()),
        finished_at: exited.then(|| at(-5)),
        detail: (phase == WorkerPhase::Failed).then(|| "exit code 1".into()),
    }
}

// ---------------------------------------------------------------------------------------------
// The case and its runner

type ActionCheck = Box<dyn Fn(&[Action]) -> bool>;
type StepCheck = Box<dyn Fn(&Case, &Step)>;

struct Case {
    name: String,
    job: JobView,
    settings: Settings,
    status: LifelongLearningJobStatus,
    observed: Observations,
    now: Timestamp,
    expect: (Stage, Phase, u64),
    /// (stage, type) of the conditions the step appends, in order.
    appended: Vec<(Stage, Phase)>,
    actions: ActionCheck,
    recheck: Option<Duration>,
    /// Anything else about the new status.
    check: StepCheck,
}

/// A case at `at(0)` that expects nothing to happen: same (stage, phase, round), no condition,
/// no action, no recheck.
fn case(name: impl Into<String>, status: LifelongLearningJobStatus) -> Case {
    let expect = (status.stage.unwrap_or(Train), status.phase.unwrap_or(Waiting), status.round);
    Case {
        name: name.into(),
        job: JobView { uid: UID.into(), timeouts: [None; 3] },
        settings: Settings::default(),
        status,
        observed: Observations::default(),
        now: at(0),
        expect,
        appended: Vec::new(),
        actions: Box::new(<[Action]>::is_empty),
        recheck: None,
        check: Box::new(|_, _| {}),
    }
}

impl Case {
    fn report(mut self, report: Report) -> Self {
        self.observed.reports.push(report);
        self
    }

    fn worker(mut self, worker: WorkerObservation) -> Self {
        self.observed.worker = Some(worker);
        self
    }

    fn now(mut self, secs: i64) -> Self {
        self.now = at(secs);
        self
    }

    fn timeout(mut self, stage: Stage, secs: u64) -> Self {
        self.job.timeouts[stage as usize] = Some(Duration::from_secs(secs));
        self
    }

    fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    fn expect(mut self, stage: Stage, phase: Phase, round: u64) -> Self {
        self.expect = (stage, phase, round);
        self
    }

    fn appended(mut self, conditions: &[(Stage, Phase)]) -> Self {
        self.appended = conditions.to_vec();
        self
    }

    fn actions(mut self, check: impl Fn(&[Action]) -> bool + 'static) -> Self {
        self.actions = Box::new(check);
        self
    }

    fn recheck(mut self, secs: u64) -> Self {
        self.recheck = Some(Duration::from_secs(secs));
        self
    }

    fn check(mut self, check: impl Fn(&Case, &Step) + 'static) -> Self {
        self.check = Box::new(check);
        self
    }
}

fn run_case(c: &Case) -> Step {
    let name = &c.name;
    let out = step(&c.job, &c.status, &c.observed, c.now, &c.settings);
    let s = &out.status;
    assert_eq!(
        (s.stage, s.phase, s.round),
        (Some(c.expect.0), Some(c.expect.1), c.expect.2),
        "{name}: (stage, phase, round)"
    );
    assert!((c.actions)(&out.actions), "{name}: unexpected actions {:#?}", out.actions);
    assert_eq!(out.recheck_after, c.recheck, "{name}: recheck_after");
    // A worker judged gone is said so (the operator confirms it with a read before acting).
    let made_again = out.actions.iter().any(|a| matches!(a, Action::Event { reason: "WorkerVanished", .. }));
    let failed_gone = s.phase == Some(Phase::Failed)
        && c.status.phase != Some(Phase::Failed)
        && s.message.as_deref().is_some_and(|m| m.contains("vanished"));
    assert_eq!(out.worker_gone, made_again || failed_gone, "{name}: worker_gone");

    // The conditions: the old ones kept (the oldest dropped past the cap; data only on the newest
    // of each stage and type), the new ones appended.
    let (before, after, k) = (&c.status.conditions, &s.conditions, c.appended.len());
    assert_eq!(after.len(), (before.len() + k).min(MAX_CONDITIONS), "{name}: number of conditions");
    let (kept, new) = after.split_at(after.len() - k);
    for (i, (old, now)) in before[before.len() - kept.len()..].iter().zip(kept).enumerate() {
        let newer = after[i + 1..].iter().any(|n| (n.stage, n.type_) == (now.stage, now.type_));
        let data = if newer { None } else { old.data.clone() };
        assert_eq!(now, &JobCondition { data, ..old.clone() }, "{name}: the older conditions are kept as they were");
    }
    let types: Vec<_> = new.iter().map(|n| (n.stage, n.type_)).collect();
    assert_eq!(types, c.appended, "{name}: conditions appended");
    for n in new {
        assert_eq!(n.status, "True", "{name}: condition status");
        assert_eq!(n.last_transition_time, Some(Time(c.now)), "{name}: condition time");
        let message = if n.type_ == Failed { s.message.clone() } else { None };
        assert_eq!(n.message, message, "{name}: a Failed condition says why, the others say nothing");
    }
    if let Some(newest) = after.last() {
        assert_eq!((Some(newest.stage), Some(newest.type_)), (s.stage, s.phase), "{name}: status = newest condition");
    }
    (c.check)(c, &out);
    out
}

fn run(table: Vec<Case>) {
    let mut names = std::collections::HashSet::new();
    for c in &table {
        assert!(names.insert(c.name.clone()), "{}: duplicate case name", c.name);
        run_case(c);
    }
}

/// Runs the cases in turn, each on the status the previous one left; returns the last status.
fn run_chain(table: Vec<Case>) -> LifelongLearningJobStatus {
    let mut status = LifelongLearningJobStatus::default();
    for mut c in table {
        c.status = status;
        status = run_case(&c).status;
    }
    status
}

// Action patterns.

fn stale(a: &[Action]) -> bool {
    matches!(a, [Action::Event { warning: true, reason: "StaleReport", .. }])
}

fn ignored(a: &[Action]) -> bool {
    matches!(a, [Action::Event { warning: true, reason: "ReportIgnored", .. }])
}

fn edge(stage: Stage, round: u64, failed: bool) -> impl Fn(&[Action]) -> bool {
    move |a| matches!(a, [Action::Edge(n)] if *n == StageNotice { stage, round, failed })
}

fn starts(expected: WorkerSpec) -> impl Fn(&[Action]) -> bool {
    move |a| matches!(a, [Action::StartWorker(s)] if *s == expected)
}

/// Deploy replaces the inference worker: stop the old ones, then start the new one.
fn replaces(expected: WorkerSpec) -> impl Fn(&[Action]) -> bool {
    move |a| matches!(a, [Action::StopWorkers { stage: Deploy }, Action::StartWorker(s)] if *s == expected)
}

/// A vanished worker started again (an inference worker replacing any other, as on Ready).
fn restarts(expected: WorkerSpec) -> impl Fn(&[Action]) -> bool {
    move |a| match a {
        [Action::Event { warning: true, reason: "WorkerVanished", .. }, Action::StartWorker(s)] => {
            expected.stage != Deploy && *s == expected
        }
        [
            Action::Event { warning: true, reason: "WorkerVanished", .. },
            Action::StopWorkers { stage: Deploy },
            Action::StartWorker(s),
        ] => expected.stage == Deploy && *s == expected,
        _ => false,
    }
}

/// A failed stage: its workers stopped, a warning.
fn stops(stage: Stage) -> impl Fn(&[Action]) -> bool {
    move |a| matches!(a, [Action::StopWorkers { stage: s }, Action::Event { warning: true, reason: "StageFailed", .. }] if *s == stage)
}

// Status checks.

fn unchanged(c: &Case, out: &Step) {
    assert_eq!(out.status, c.status, "{}: the status must not change", c.name);
}

/// Failed: `retries` in a row, back to Train `wait` seconds from now, the message says `why`.
fn backs_off(retries: u32, wait: u64, why: &'static str) -> impl Fn(&Case, &Step) {
    move |c, out| {
        let s = &out.status;
        assert_eq!(s.retries, retries, "{}: retries", c.name);
        assert_eq!(s.retry_at, Some(Time(later(c.now, wait))), "{}: retry_at", c.name);
        let message = s.message.as_deref().unwrap_or_default();
        assert!(message.contains(why), "{}: message {message:?} should contain {why:?}", c.name);
    }
}

fn worker_ref(out: &Step) -> &WorkerRef {
    out.status.worker.as_ref().expect("status.worker")
}

// ---------------------------------------------------------------------------------------------
// Sedna's table, row by row (§2.2)

#[test]
fn sedna_rows() {
    run(vec![
        // (no condition) → (Train, Waiting)
        case("(none) → Train Waiting, edge told", LifelongLearningJobStatus::default())
            .expect(Train, Waiting, 0)
            .appended(&[(Train, Waiting)])
            .actions(edge(Train, 0, false))
            .check(|c, out| assert_eq!(out.status.start_time, Some(Time(c.now)), "{}: startTime", c.name)),
        // (S, Waiting), no report → nothing: the edge acts
        case("Train Waiting, no report → nothing", status(Train, Waiting, 1)).check(unchanged),
        case("Eval Waiting, no report → nothing", status(Eval, Waiting, 1)).check(unchanged),
        case("Deploy Waiting, no report → nothing", status(Deploy, Waiting, 1)).check(unchanged),
        // (Train|Eval, Ready), no worker → create it from the Ready input
        case("Train Ready, no worker → StartWorker(Train)", status(Train, Ready, 1))
            .expect(Train, Starting, 1)
            .appended(&[(Train, Starting)])
            .actions(starts(spec(Train, 1, None)))
            .check(|c, out| {
                let w = worker_ref(out);
                let got = (w.stage, w.round, w.restarts, w.started_at.clone());
                assert_eq!(got, (Some(Train), 1, 0, Some(Time(c.now))), "{}: status.worker", c.name);
            }),
        case(
            "Eval Ready, no worker → StartWorker(Eval), no previous model",
            LifelongLearningJobStatus { last_trained: Some(model("train-1")), ..status(Eval, Ready, 1) },
        )
        .expect(Eval, Starting, 1)
        .appended(&[(Eval, Starting)])
        .actions(starts(spec(Eval, 1, None))),
        case(
            "Train Ready with a last_trained model → previous_model",
            LifelongLearningJobStatus { last_trained: Some(model("train-1")), ..status(Train, Ready, 2) },
        )
        .expect(Train, Starting, 2)
        .appended(&[(Train, Starting)])
        .actions(starts(spec(Train, 2, Some(model("train-1"))))),
        case("Train Ready, only the previous round's worker → StartWorker", status(Train, Ready, 2))
            .worker(worker(Train, 1, WorkerPhase::Running))
            .expect(Train, Starting, 2)
            .appended(&[(Train, Starting)])
            .actions(starts(spec(Train, 2, None))),
        // (Train|Eval, Ready), the worker exists → no second one
        case("Train Ready, worker Pending → no second StartWorker", status(Train, Ready, 1))
            .worker(worker(Train, 1, WorkerPhase::Pending))
            .expect(Train, Starting, 1)
            .appended(&[(Train, Starting)])
            .check(|c, out| assert_eq!(worker_ref(out).name, worker_name(Train, 1), "{}: worker name", c.name)),
        case("Eval Ready, worker Pending → no second StartWorker", status(Eval, Ready, 1))
            .worker(worker(Eval, 1, WorkerPhase::Pending))
            .expect(Eval, Starting, 1)
            .appended(&[(Eval, Starting)]),
        // Sedna appends one condition per sync; ours goes on to Running in the same step.
        case("Eval Ready, worker Running → Starting and Running at once", status(Eval, Ready, 1))
            .worker(worker(Eval, 1, WorkerPhase::Running))
            .expect(Eval, Running, 1)
            .appended(&[(Eval, Starting), (Eval, Running)]),
        // (Deploy, Ready) → replace the inference worker; Starting, not Completed (fault 8)
        case("Deploy Ready → StopWorkers, StartWorker(Deploy), Deploy Starting", status(Deploy, Ready, 1))
            .expect(Deploy, Starting, 1)
            .appended(&[(Deploy, Starting)])
            .actions(replaces(spec(Deploy, 1, None)))
            .check(|c, out| {
                assert_eq!(out.status.deployed, None, "{}: nothing deployed yet", c.name);
                assert_eq!(out.status.rounds_completed, 0, "{}: rounds_completed", c.name);
            }),
        case(
            "Deploy Ready, the previous round's inference worker Running → replaced",
            LifelongLearningJobStatus { deployed: Some(deployed(1)), ..status(Deploy, Ready, 2) },
        )
        .worker(worker(Deploy, 1, WorkerPhase::Running))
        .expect(Deploy, Starting, 2)
        .appended(&[(Deploy, Starting)])
        .actions(replaces(spec(Deploy, 2, None)))
        .check(|c, out| assert_eq!(out.status.deployed, Some(deployed(1)), "{}: deployed", c.name)),
        // (S, Starting|Running) + Running → (S, Running), the node recorded
        case("Train Starting + worker Running → Running, node recorded", status(Train, Starting, 1))
            .worker(worker(Train, 1, WorkerPhase::Running))
            .expect(Train, Running, 1)
            .appended(&[(Train, Running)])
            .check(|c, out| assert_eq!(worker_ref(out).node.as_deref(), Some("edge-1"), "{}: node", c.name)),
        case("Eval Starting + worker Running → Running, node recorded", status(Eval, Starting, 1))
            .worker(WorkerObservation { node: Some("edge-7".into()), ..worker(Eval, 1, WorkerPhase::Running) })
            .expect(Eval, Running, 1)
            .appended(&[(Eval, Running)])
            .check(|c, out| assert_eq!(worker_ref(out).node.as_deref(), Some("edge-7"), "{}: node", c.name)),
        case("Train Running + worker Running → nothing", status(Train, Running, 1))
            .worker(worker(Train, 1, WorkerPhase::Running))
            .check(unchanged),
        case("Train Starting + worker Pending → nothing", status(Train, Starting, 1))
            .worker(WorkerObservation { node: None, ..worker(Train, 1, WorkerPhase::Pending) })
            .check(unchanged),
        // A pod's name is known once it is created: it is recorded with the next change that is
        // written anyway (running), not in a status write of its own.
        case("Train Starting, pod just created + worker Pending → nothing", just_created(Train, 1))
            .worker(worker(Train, 1, WorkerPhase::Pending))
            .check(unchanged),
        case("Train Starting, pod just created + worker Running → Running, named", just_created(Train, 1))
            .worker(worker(Train, 1, WorkerPhase::Running))
            .expect(Train, Running, 1)
            .appended(&[(Train, Running)])
            .check(|c, out| {
                let worker = worker_ref(out);
                assert_eq!(
                    (worker.name.as_str(), worker.node.as_deref()),
                    (worker_name(Train, 1).as_str(), Some("edge-1")),
                    "{}",
                    c.name
                )
            }),
        // (S, Starting|Running) + Succeeded: wait for the result, then fail; never an empty
        // Completed (fault 4)
        case("Train Running + Succeeded, no result yet → waits for it", status(Train, Running, 1))
            .worker(worker(Train, 1, WorkerPhase::Succeeded))
            .recheck(25),
        case("Eval Starting + Succeeded, no result yet → waits for it", status(Eval, Starting, 1))
            .worker(worker(Eval, 1, WorkerPhase::Succeeded))
            .recheck(25),
        case("Train Running + Succeeded, grace over → Failed", status(Train, Running, 1))
            .worker(worker(Train, 1, WorkerPhase::Succeeded))
            .now(25)
            .expect(Train, Failed, 1)
            .appended(&[(Train, Failed)])
            .actions(stops(Train))
            .recheck(10)
            .check(backs_off(1, 10, "exited without reporting a result")),
        case("Eval Running + Succeeded long ago → Failed", status(Eval, Running, 1))
            .worker(worker(Eval, 1, WorkerPhase::Succeeded))
            .now(600)
            .expect(Eval, Failed, 1)
            .appended(&[(Eval, Failed)])
            .actions(stops(Eval))
            .recheck(10)
            .check(backs_off(1, 10, "exited without reporting a result")),
        // (S, Starting|Running) + Failed → (S, Failed), backing off (fault 7)
        case("Train Running + worker Failed → Failed", status(Train, Running, 1))
            .worker(worker(Train, 1, WorkerPhase::Failed))
            .expect(Train, Failed, 1)
            .appended(&[(Train, Failed)])
            .actions(stops(Train))
            .recheck(10)
            .check(backs_off(1, 10, "exit code 1")),
        case("Eval Starting + worker Failed → Failed", status(Eval, Starting, 1))
            .worker(worker(Eval, 1, WorkerPhase::Failed))
            .expect(Eval, Failed, 1)
            .appended(&[(Eval, Failed)])
            .actions(stops(Eval))
            .recheck(10)
            .check(backs_off(1, 10, "exit code 1")),
        case("Deploy Starting + worker Failed → Failed", status(Deploy, Starting, 1))
            .worker(worker(Deploy, 1, WorkerPhase::Failed))
            .expect(Deploy, Failed, 1)
            .appended(&[(Deploy, Failed)])
            .actions(stops(Deploy))
            .recheck(10)
            .check(backs_off(1, 10, "exit code 1")),
        // (S, Starting|Running) + missing → started again, counted; past the limit Failed.
        // Sedna stays stuck forever (fault 6).
        case("Train Running, worker missing → StartWorker again", status(Train, Running, 1))
            .actions(restarts(spec(Train, 1, None)))
            .check(|c, out| assert_eq!(worker_ref(out).restarts, 1, "{}: restarts", c.name)),
        case("Deploy Starting, worker missing → StartWorker again", status(Deploy, Starting, 1))
            .actions(restarts(spec(Deploy, 1, None)))
            .check(|c, out| assert_eq!(worker_ref(out).restarts, 1, "{}: restarts", c.name)),
        case("Eval Starting, worker missing a 4th time (limit 3) → Failed", {
            let mut s = status(Eval, Starting, 1);
            s.worker.as_mut().unwrap().restarts = 3;
            s
        })
        .expect(Eval, Failed, 1)
        .appended(&[(Eval, Failed)])
        .actions(stops(Eval))
        .recheck(10)
        .check(backs_off(1, 10, "vanished 4 times")),
        // (S, Completed) → (next(S), Waiting), the edge told
        case("Train Completed → Eval Waiting", status(Train, Completed, 1))
            .expect(Eval, Waiting, 1)
            .appended(&[(Eval, Waiting)])
            .actions(edge(Eval, 1, false))
            .check(|c, out| assert_eq!(out.status.worker, None, "{}: worker", c.name)),
        case("Eval Completed → Deploy Waiting", status(Eval, Completed, 1))
            .expect(Deploy, Waiting, 1)
            .appended(&[(Deploy, Waiting)])
            .actions(edge(Deploy, 1, false)),
        case("Deploy Completed → Train Waiting, the round done", {
            let mut s = LifelongLearningJobStatus { retries: 2, rounds_completed: 4, ..status(Deploy, Completed, 5) };
            s.worker = status(Deploy, Starting, 5).worker;
            s
        })
        .expect(Train, Waiting, 5)
        .appended(&[(Train, Waiting)])
        .actions(edge(Train, 5, false))
        .check(|c, out| {
            let s = &out.status;
            assert_eq!((s.rounds_completed, s.retries), (5, 0), "{}: rounds_completed, retries", c.name);
            let want = DeployedModel {
                round: 5,
                url: model("selected").url,
                format: "pkl".into(),
                metrics: None,
                since: Some(Time(c.now)),
            };
            assert_eq!(s.deployed, Some(want), "{}: deployed", c.name);
            assert_eq!(s.worker, None, "{}: worker", c.name);
        }),
        // (S, Failed) → (Train, Waiting), but after the backoff (fault 7)
        case(
            "Train Failed before retry_at → nothing, recheck the rest",
            LifelongLearningJobStatus { retries: 1, retry_at: time(7), ..status(Train, Failed, 1) },
        )
        .recheck(7)
        .check(unchanged),
        case(
            "Eval Failed at retry_at → Train Waiting, the round failed",
            LifelongLearningJobStatus { retries: 1, retry_at: time(0), ..status(Eval, Failed, 1) },
        )
        .expect(Train, Waiting, 1)
        .appended(&[(Train, Waiting)])
        .actions(edge(Train, 1, true))
        .check(|c, out| {
            let s = &out.status;
            assert_eq!((s.retry_at.clone(), s.retries), (None, 1), "{}: retry_at, retries", c.name);
            assert_eq!(s.worker, None, "{}: worker", c.name);
        }),
        case(
            "Deploy Failed after retry_at → Train Waiting, the round failed",
            LifelongLearningJobStatus { retries: 2, retry_at: time(-30), ..status(Deploy, Failed, 3) },
        )
        .expect(Train, Waiting, 3)
        .appended(&[(Train, Waiting)])
        .actions(edge(Train, 3, true)),
    ]);
}

// ---------------------------------------------------------------------------------------------
// Fault 3: reports are checked against (uid, round, stage, phase); a stale one changes nothing

#[test]
fn stale_reports_are_ignored() {
    let failed_1 = || LifelongLearningJobStatus { retries: 1, retry_at: time(5), ..status(Train, Failed, 1) };
    run(vec![
        case("another job's uid", status(Train, Running, 1))
            .worker(worker(Train, 1, WorkerPhase::Running))
            .report(Report { job_uid: "another-uid".into(), ..completed(Train, 1, &["train-1"]) }),
        case("an old round's Failed while Running (Sedna restarted the job)", status(Train, Running, 2))
            .worker(worker(Train, 2, WorkerPhase::Running))
            .report(failed(Train, 1, "OOMKilled")),
        case("an old round's Failed while Waiting", status(Eval, Waiting, 2)).report(failed(Eval, 1, "no data")),
        case("an old round's Completed while Running", status(Train, Running, 2))
            .worker(worker(Train, 2, WorkerPhase::Running))
            .report(completed(Train, 1, &["train-1"])),
        case("a Failed for another stage", status(Train, Running, 1))
            .worker(worker(Train, 1, WorkerPhase::Running))
            .report(failed(Eval, 1, "eval failed")),
        case("a Ready for another stage", status(Eval, Waiting, 1)).report(ready(Deploy, 1)),
        case("a duplicate Train Completed in Eval Running", status(Eval, Running, 1))
            .worker(worker(Eval, 1, WorkerPhase::Running))
            .report(completed(Train, 1, &["train-1"])),
        case("a duplicate Eval Completed in Deploy Waiting", status(Deploy, Waiting, 1)).report(completed(
            Eval,
            1,
            &["eval-1"],
        )),
        case("a duplicate Deploy Completed after the round", status(Train, Waiting, 1)).report(completed(
            Deploy,
            1,
            &[],
        )),
        case("a duplicate Train Completed in the next Train Waiting", status(Train, Waiting, 1)).report(completed(
            Train,
            1,
            &["train-1"],
        )),
        case("a result after the stage failed", failed_1()).report(completed(Train, 1, &["train-1"])).recheck(5),
        case("a second Failed for a failed stage (not counted twice)", failed_1())
            .report(failed(Train, 1, "again"))
            .recheck(5),
        case("a Ready while Failed (the edge waits for the notice)", failed_1()).report(ready(Train, 2)).recheck(5),
        case("a Ready while Running", status(Eval, Running, 1))
            .worker(worker(Eval, 1, WorkerPhase::Running))
            .report(ready(Eval, 1)),
        case("the next round's Train Ready while Train Running", status(Train, Running, 1))
            .worker(worker(Train, 1, WorkerPhase::Running))
            .report(ready(Train, 2)),
        case("a Deploy Completed while Deploy Starting (the worker decides)", status(Deploy, Starting, 1))
            .worker(WorkerObservation { node: None, ..worker(Deploy, 1, WorkerPhase::Pending) })
            .report(completed(Deploy, 1, &[])),
        case("a report of a non-report phase (Running)", status(Train, Running, 1))
            .worker(worker(Train, 1, WorkerPhase::Running))
            .report(report(Train, 1, Running)),
    ]
    .into_iter()
    .map(|c| c.actions(stale).check(unchanged))
    .chain([case("a report without a stage", status(Train, Waiting, 1))
        .report(Report { stage: None, ..ready(Train, 2) })
        .actions(ignored)
        .check(unchanged)])
    .collect());
}

// ---------------------------------------------------------------------------------------------
// Reports carry (uid, round, stage): Train Ready opens round+1, the other reports are for the
// current round

#[test]
fn report_rounds() {
    run(vec![
        case("Train Ready for round+1 → round 4 starts", status(Train, Waiting, 3))
            .report(ready(Train, 4))
            .expect(Train, Starting, 4)
            .appended(&[(Train, Ready), (Train, Starting)])
            .actions(starts(spec(Train, 4, None)))
            .check(|c, out| {
                let data = out.status.data.as_ref().and_then(|d| d.input.clone());
                assert_eq!(data, Some(input(Train)), "{}: status.data.input", c.name);
                assert_eq!(worker_ref(out).round, 4, "{}: worker round", c.name);
            }),
        case("Train Ready for the current round → stale", status(Train, Waiting, 3))
            .report(ready(Train, 3))
            .actions(stale)
            .check(unchanged),
        case("Train Ready two rounds ahead → stale", status(Train, Waiting, 3))
            .report(ready(Train, 5))
            .actions(stale)
            .check(unchanged),
        case("Eval Ready for the current round → started", status(Eval, Waiting, 3))
            .report(ready(Eval, 3))
            .expect(Eval, Starting, 3)
            .appended(&[(Eval, Ready), (Eval, Starting)])
            .actions(starts(spec(Eval, 3, None))),
        case("Eval Ready for round+1 → stale", status(Eval, Waiting, 3))
            .report(ready(Eval, 4))
            .actions(stale)
            .check(unchanged),
        case("Deploy Ready for the current round → replaced", status(Deploy, Waiting, 3))
            .report(ready(Deploy, 3))
            .expect(Deploy, Starting, 3)
            .appended(&[(Deploy, Ready), (Deploy, Starting)])
            .actions(replaces(spec(Deploy, 3, None))),
        case("Deploy Ready for round-1 → stale", status(Deploy, Waiting, 3))
            .report(ready(Deploy, 2))
            .actions(stale)
            .check(unchanged),
        case("the first sync with round 1's Train Ready", LifelongLearningJobStatus::default())
            .report(ready(Train, 1))
            .expect(Train, Starting, 1)
            .appended(&[(Train, Waiting), (Train, Ready), (Train, Starting)])
            .actions(|a| {
                matches!(a, [Action::Edge(StageNotice { stage: Train, round: 0, failed: false }), Action::StartWorker(s)]
                    if *s == spec(Train, 1, None))
            }),
        case("a stale report does not hide the good one after it", status(Train, Waiting, 3))
            .report(ready(Train, 3))
            .report(ready(Train, 4))
            .expect(Train, Starting, 4)
            .appended(&[(Train, Ready), (Train, Starting)])
            .actions(|a| {
                matches!(a, [Action::Event { reason: "StaleReport", .. }, Action::StartWorker(s)]
                    if *s == spec(Train, 4, None))
            }),
        case("Eval Failed for the current round while Running → Failed", status(Eval, Running, 3))
            .worker(worker(Eval, 3, WorkerPhase::Running))
            .report(failed(Eval, 3, "eval data missing"))
            .expect(Eval, Failed, 3)
            .appended(&[(Eval, Failed)])
            .actions(stops(Eval))
            .recheck(10)
            .check(backs_off(1, 10, "eval data missing")),
        // The edge's selector failed: nothing was replaced, the serving worker is not stopped.
        case("Deploy Failed from the edge while Waiting → Failed, no StopWorkers", status(Deploy, Waiting, 3))
            .report(failed(Deploy, 3, "selector failed"))
            .expect(Deploy, Failed, 3)
            .appended(&[(Deploy, Failed)])
            .actions(|a| matches!(a, [Action::Event { warning: true, reason: "StageFailed", .. }]))
            .recheck(10)
            .check(backs_off(1, 10, "selector failed")),
    ]);
}

// ---------------------------------------------------------------------------------------------
// Fault 4: Train and Eval complete on the worker's result (with a model), in one step; Deploy
// may be completed by the edge when its selector chose nothing

#[test]
fn results() {
    run(vec![
        case("Train result while Running → Completed → Eval Waiting at once", status(Train, Running, 1))
            .worker(worker(Train, 1, WorkerPhase::Running))
            .report(completed(Train, 1, &["train-1"]))
            .expect(Eval, Waiting, 1)
            .appended(&[(Train, Completed), (Eval, Waiting)])
            .actions(edge(Eval, 1, false))
            .check(|c, out| {
                assert_eq!(out.status.last_trained, Some(model("train-1")), "{}: last_trained", c.name);
                let n = out.status.conditions.len();
                let data = out.status.conditions[n - 2].data.as_deref().unwrap_or_default();
                assert!(data.contains(&model("train-1").url), "{}: the Completed condition's data {data}", c.name);
                assert_eq!(out.status.worker, None, "{}: worker", c.name);
            }),
        // The operator holds a Running alone a moment: the result then comes with it.
        case("Train result while Starting, the worker seen Running → Running, Completed, Eval Waiting", {
            status(Train, Starting, 1)
        })
        .worker(worker(Train, 1, WorkerPhase::Running))
        .report(completed(Train, 1, &["train-1"]))
        .expect(Eval, Waiting, 1)
        .appended(&[(Train, Running), (Train, Completed), (Eval, Waiting)])
        .actions(edge(Eval, 1, false)),
        // The worker exited before its result came, its Running never written: still in order.
        case("Train result while Starting, the worker Succeeded → Running, Completed, Eval Waiting", {
            status(Train, Starting, 1)
        })
        .worker(worker(Train, 1, WorkerPhase::Succeeded))
        .report(completed(Train, 1, &["train-1"]))
        .expect(Eval, Waiting, 1)
        .appended(&[(Train, Running), (Train, Completed), (Eval, Waiting)])
        .actions(edge(Eval, 1, false)),
        // Without a report the worker is followed as before: a timeout fails it from Starting.
        case("Starting, the worker Running past its timeout, no report → Failed, no Running", {
            status(Train, Starting, 1)
        })
        .worker(worker(Train, 1, WorkerPhase::Running))
        .timeout(Train, 120)
        .now(60)
        .expect(Train, Failed, 1)
        .appended(&[(Train, Failed)])
        .actions(stops(Train))
        .recheck(10),
        case(
            "Eval result while Starting, the worker Running → Running, Completed, Deploy Waiting",
            status(Eval, Starting, 1),
        )
        .worker(worker(Eval, 1, WorkerPhase::Running))
        .report(completed(Eval, 1, &["eval-1"]))
        .expect(Deploy, Waiting, 1)
        .appended(&[(Eval, Running), (Eval, Completed), (Deploy, Waiting)])
        .actions(edge(Deploy, 1, false)),
        case("Train result while Starting → Eval Waiting", status(Train, Starting, 1))
            .report(completed(Train, 1, &["train-1"]))
            .expect(Eval, Waiting, 1)
            .appended(&[(Train, Completed), (Eval, Waiting)])
            .actions(edge(Eval, 1, false))
            .check(|c, out| assert_eq!(out.status.last_trained, Some(model("train-1")), "{}: last_trained", c.name)),
        // Sedna's race: the exit seen with the result → one Completed, with the data.
        case("Train result with the worker already Succeeded → one Completed", status(Train, Running, 1))
            .worker(worker(Train, 1, WorkerPhase::Succeeded))
            .report(completed(Train, 1, &["train-1"]))
            .expect(Eval, Waiting, 1)
            .appended(&[(Train, Completed), (Eval, Waiting)])
            .actions(edge(Eval, 1, false)),
        case(
            "Eval result → Deploy Waiting, last_trained kept",
            LifelongLearningJobStatus { last_trained: Some(model("train-1")), ..status(Eval, Running, 1) },
        )
        .worker(worker(Eval, 1, WorkerPhase::Running))
        .report(completed(Eval, 1, &["eval-1"]))
        .expect(Deploy, Waiting, 1)
        .appended(&[(Eval, Completed), (Deploy, Waiting)])
        .actions(edge(Deploy, 1, false))
        .check(|c, out| assert_eq!(out.status.last_trained, Some(model("train-1")), "{}: last_trained", c.name)),
        // The edge prepares the eval set as it relays the train result (`next_follows`): both in
        // one batch make one status change, the eval worker started.
        case("Train result and the edge's Eval Ready in one batch → Eval Starting", status(Train, Running, 1))
            .worker(worker(Train, 1, WorkerPhase::Running))
            .report(Report { next_follows: true, ..completed(Train, 1, &["train-1"]) })
            .report(ready(Eval, 1))
            .expect(Eval, Starting, 1)
            .appended(&[(Train, Completed), (Eval, Waiting), (Eval, Ready), (Eval, Starting)])
            .actions(|a| {
                matches!(a, [Action::Edge(n), Action::StartWorker(s)]
                    if *n == StageNotice { stage: Eval, round: 1, failed: false } && *s == spec(Eval, 1, None))
            })
            .check(|c, out| assert_eq!(out.status.last_trained, Some(model("train-1")), "{}: last_trained", c.name)),
        // The edge moved on by itself: a result the machine did not take leaves its Eval Ready
        // untaken too.
        case("A train result after the stage failed, and its Eval Ready → both ignored", {
            let mut failed = status(Train, Failed, 1);
            failed.retry_at = time(30);
            failed
        })
        .report(Report { next_follows: true, ..completed(Train, 1, &["train-1"]) })
        .report(ready(Eval, 1))
        .actions(|a| {
            matches!(a, [Action::Event { reason: "StaleReport", .. }, Action::Event { reason: "StaleReport", .. }])
        })
        .recheck(30)
        .check(unchanged),
        case("Train Completed without a model → ignored", status(Train, Running, 1))
            .worker(worker(Train, 1, WorkerPhase::Running))
            .report(completed(Train, 1, &[]))
            .actions(ignored)
            .check(unchanged),
        case("Eval Completed without output → ignored", status(Eval, Running, 1))
            .worker(worker(Eval, 1, WorkerPhase::Running))
            .report(report(Eval, 1, Completed))
            .actions(ignored)
            .check(unchanged),
        // The edge's selector chose nothing: the round is done, the old model keeps serving.
        case("Deploy Completed from the edge while Waiting → the round done, deployed unchanged", {
            let eval_data =
                ConditionData { input: Some(input(Eval)), output: Some(Output { models: vec![model("eval-3")] }) };
            LifelongLearningJobStatus {
                deployed: Some(deployed(2)),
                rounds_completed: 2,
                retries: 1,
                data: Some(eval_data),
                ..status(Deploy, Waiting, 3)
            }
        })
        .report(completed(Deploy, 3, &[]))
        .expect(Train, Waiting, 3)
        .appended(&[(Deploy, Completed), (Train, Waiting)])
        .actions(edge(Train, 3, false))
        .check(|c, out| {
            let s = &out.status;
            assert_eq!(s.deployed, Some(deployed(2)), "{}: deployed", c.name);
            assert_eq!((s.rounds_completed, s.retries), (3, 0), "{}: rounds_completed, retries", c.name);
        }),
    ]);
}

// ---------------------------------------------------------------------------------------------
// Fault 8: Deploy completes when the new inference worker runs, and fails when it cannot

#[test]
fn deploy_follows_the_inference_worker() {
    let deploying = || LifelongLearningJobStatus {
        deployed: Some(deployed(2)),
        rounds_completed: 2,
        retries: 1,
        ..status(Deploy, Starting, 3)
    };
    let kept = |c: &Case, out: &Step| {
        assert_eq!(out.status.deployed, Some(deployed(2)), "{}: deployed unchanged", c.name);
        assert_eq!(out.status.rounds_completed, 2, "{}: rounds_completed", c.name);
    };
    run(vec![
        case("inference worker Running → Completed → Train Waiting, deployed", deploying())
            .worker(worker(Deploy, 3, WorkerPhase::Running))
            .expect(Train, Waiting, 3)
            .appended(&[(Deploy, Completed), (Train, Waiting)])
            .actions(edge(Train, 3, false))
            .check(|c, out| {
                let s = &out.status;
                let want = DeployedModel {
                    round: 3,
                    url: model("selected").url,
                    format: "pkl".into(),
                    metrics: None,
                    since: Some(Time(c.now)),
                };
                assert_eq!(s.deployed, Some(want), "{}: deployed", c.name);
                assert_eq!((s.rounds_completed, s.retries), (3, 0), "{}: rounds_completed, retries", c.name);
                assert_eq!(s.worker, None, "{}: worker", c.name);
            }),
        case("inference worker Pending → waits", deploying())
            .worker(WorkerObservation { node: None, ..worker(Deploy, 3, WorkerPhase::Pending) })
            .check(unchanged),
        case("inference worker crash-looping (4 restarts) → Failed", deploying())
            .worker(WorkerObservation { restarts: 4, ..worker(Deploy, 3, WorkerPhase::Running) })
            .expect(Deploy, Failed, 3)
            .appended(&[(Deploy, Failed)])
            .actions(stops(Deploy))
            .recheck(20)
            .check(move |c, out| {
                kept(c, out);
                backs_off(2, 20, "crash-looping (4 restarts)")(c, out);
            }),
        case("inference worker Failed → Failed", deploying())
            .worker(worker(Deploy, 3, WorkerPhase::Failed))
            .expect(Deploy, Failed, 3)
            .appended(&[(Deploy, Failed)])
            .actions(stops(Deploy))
            .recheck(20)
            .check(kept),
        // The shell observes the current round's worker only; the old one counts as missing.
        case("only the old round's inference worker → started again, not Completed", deploying())
            .worker(worker(Deploy, 2, WorkerPhase::Running))
            .actions(restarts(spec(Deploy, 3, None)))
            .check(kept),
    ]);
}

// ---------------------------------------------------------------------------------------------
// Fault 6: crash loops and stage timeouts fail the stage

#[test]
fn crash_loops_and_timeouts() {
    run(vec![
        case("Train worker Running with 4 restarts (limit 3) → Failed", status(Train, Running, 1))
            .worker(WorkerObservation { restarts: 4, ..worker(Train, 1, WorkerPhase::Running) })
            .expect(Train, Failed, 1)
            .appended(&[(Train, Failed)])
            .actions(stops(Train))
            .recheck(10)
            .check(backs_off(1, 10, "crash-looping (4 restarts)")),
        case("Train worker Running with 3 restarts (= limit) → keeps running", status(Train, Running, 1))
            .worker(WorkerObservation { restarts: 3, ..worker(Train, 1, WorkerPhase::Running) })
            .check(|c, out| assert_eq!(worker_ref(out).restarts, 3, "{}: restarts", c.name)),
        case("Eval worker Pending (back-off) with 5 restarts → Failed", status(Eval, Starting, 1))
            .worker(WorkerObservation { restarts: 5, ..worker(Eval, 1, WorkerPhase::Pending) })
            .expect(Eval, Failed, 1)
            .appended(&[(Eval, Failed)])
            .actions(stops(Eval))
            .recheck(10)
            .check(backs_off(1, 10, "(5 restarts)")),
        case("restart_limit 0: the first restart fails the stage", status(Train, Running, 1))
            .settings(Settings { restart_limit: 0, ..Settings::default() })
            .worker(WorkerObservation { restarts: 1, ..worker(Train, 1, WorkerPhase::Running) })
            .expect(Train, Failed, 1)
            .appended(&[(Train, Failed)])
            .actions(stops(Train))
            .recheck(10),
        // Stage timeouts, counted from status.worker.started_at (60 s ago).
        case("Train timeout 120 s not reached → recheck the rest", status(Train, Running, 1))
            .timeout(Train, 120)
            .worker(worker(Train, 1, WorkerPhase::Running))
            .recheck(60)
            .check(unchanged),
        case("Train timeout 120 s reached → Failed", status(Train, Running, 1))
            .timeout(Train, 120)
            .worker(worker(Train, 1, WorkerPhase::Running))
            .now(60)
            .expect(Train, Failed, 1)
            .appended(&[(Train, Failed)])
            .actions(stops(Train))
            .recheck(10)
            .check(backs_off(1, 10, "longer than 120s")),
        case("Deploy timeout 30 s passed while Pending → Failed", status(Deploy, Starting, 1))
            .timeout(Deploy, 30)
            .worker(worker(Deploy, 1, WorkerPhase::Pending))
            .expect(Deploy, Failed, 1)
            .appended(&[(Deploy, Failed)])
            .actions(stops(Deploy))
            .recheck(10)
            .check(backs_off(1, 10, "longer than 30s")),
        case("Eval's timeout does not apply to Train", status(Train, Running, 1))
            .timeout(Eval, 10)
            .worker(worker(Train, 1, WorkerPhase::Running))
            .check(unchanged),
        case("timeout nearer than the result grace → recheck at the timeout", status(Eval, Running, 1))
            .timeout(Eval, 70)
            .worker(worker(Eval, 1, WorkerPhase::Succeeded))
            .recheck(10),
        case("timeout counts from the first start, not the re-creation", {
            let mut s = status(Train, Running, 1);
            s.worker.as_mut().unwrap().restarts = 1;
            s
        })
        .timeout(Train, 120)
        .actions(restarts(spec(Train, 1, None)))
        .recheck(60)
        .check(|c, out| {
            let w = worker_ref(out);
            assert_eq!((w.restarts, w.started_at.clone()), (2, time(-60)), "{}: restarts, started_at", c.name);
        }),
        case("Train Ready with a timeout → the clock starts with the worker", status(Train, Ready, 1))
            .timeout(Train, 120)
            .expect(Train, Starting, 1)
            .appended(&[(Train, Starting)])
            .actions(starts(spec(Train, 1, None)))
            .recheck(120),
    ]);
}

// ---------------------------------------------------------------------------------------------
// Fault 7: the backoff doubles from 10 s up to 360 s

#[test]
fn backoff_doubles_to_360s() {
    let sedna = Settings::default();
    let table = [
        (0, 10),
        (1, 10),
        (2, 20),
        (3, 40),
        (4, 80),
        (5, 160),
        (6, 320),
        (7, 360),
        (8, 360),
        (9, 360),
        (10, 360),
        (u32::MAX, 360),
    ];
    for (failures, secs) in table {
        assert_eq!(backoff(&sedna, failures), Duration::from_secs(secs), "backoff after {failures} failures");
    }
    let small = Settings { backoff_base: Duration::from_secs(1), backoff_max: Duration::from_secs(5), ..sedna };
    for (failures, secs) in [(1, 1), (2, 2), (3, 4), (4, 5), (5, 5)] {
        assert_eq!(backoff(&small, failures), Duration::from_secs(secs), "1 s..5 s: backoff after {failures} failures");
    }
}

/// The machine counts failures in a row and waits the backoff of the count.
#[test]
fn failures_in_a_row_back_off() {
    let table = [(0, 10), (1, 20), (2, 40), (3, 80), (4, 160), (5, 320), (6, 360), (9, 360)];
    run(table
        .into_iter()
        .map(|(retries, wait)| {
            case(
                format!("{retries} failures before, Eval worker Failed → waits {wait}s"),
                LifelongLearningJobStatus { retries, ..status(Eval, Running, 1) },
            )
            .worker(worker(Eval, 1, WorkerPhase::Failed))
            .expect(Eval, Failed, 1)
            .appended(&[(Eval, Failed)])
            .actions(stops(Eval))
            .recheck(wait)
            .check(backs_off(retries + 1, wait, "exit code 1"))
        })
        .collect());
}

// ---------------------------------------------------------------------------------------------
// A round step by step, and fault 5: the conditions are capped

/// The conditions of a round, from its Train Waiting to its Deploy Completed.
const ROUND: [(Stage, Phase); 14] = [
    (Train, Waiting),
    (Train, Ready),
    (Train, Starting),
    (Train, Running),
    (Train, Completed),
    (Eval, Waiting),
    (Eval, Ready),
    (Eval, Starting),
    (Eval, Running),
    (Eval, Completed),
    (Deploy, Waiting),
    (Deploy, Ready),
    (Deploy, Starting),
    (Deploy, Completed),
];

/// Sedna's 13 a round (§8): the same but for (Deploy, Starting), as Sedna completes Deploy on
/// creating the pod.
const SEDNA_ROUND: [(Stage, Phase); 13] = [
    (Train, Waiting),
    (Train, Ready),
    (Train, Starting),
    (Train, Running),
    (Train, Completed),
    (Eval, Waiting),
    (Eval, Ready),
    (Eval, Starting),
    (Eval, Running),
    (Eval, Completed),
    (Deploy, Waiting),
    (Deploy, Ready),
    (Deploy, Completed),
];

fn first_sync() -> Case {
    case("first sync", LifelongLearningJobStatus::default())
        .appended(&[(Train, Waiting)])
        .actions(edge(Train, 0, false))
}

/// The steps of round `r` from its Train Waiting, one observation each, from `t` seconds on.
/// The status is filled in by `run_chain`.
fn round_steps(r: u64, t: i64) -> Vec<Case> {
    let previous = (r > 1).then(|| model(&format!("train-{}", r - 1)));
    let at_step =
        |what: &str, i: i64| case(format!("round {r}: {what}"), LifelongLearningJobStatus::default()).now(t + i);
    vec![
        at_step("Train Ready", 0)
            .report(ready(Train, r))
            .expect(Train, Starting, r)
            .appended(&[(Train, Ready), (Train, Starting)])
            .actions(starts(spec(Train, r, previous))),
        at_step("train worker Running", 1)
            .worker(worker(Train, r, WorkerPhase::Running))
            .expect(Train, Running, r)
            .appended(&[(Train, Running)]),
        at_step("train result", 2)
            .worker(worker(Train, r, WorkerPhase::Running))
            .report(completed(Train, r, &[&format!("train-{r}")]))
            .expect(Eval, Waiting, r)
            .appended(&[(Train, Completed), (Eval, Waiting)])
            .actions(edge(Eval, r, false)),
        at_step("Eval Ready", 3)
            .report(ready(Eval, r))
            .expect(Eval, Starting, r)
            .appended(&[(Eval, Ready), (Eval, Starting)])
            .actions(starts(spec(Eval, r, None))),
        at_step("eval worker Running", 4)
            .worker(worker(Eval, r, WorkerPhase::Running))
            .expect(Eval, Running, r)
            .appended(&[(Eval, Running)]),
        at_step("eval result", 5)
            .worker(worker(Eval, r, WorkerPhase::Running))
            .report(completed(Eval, r, &[&format!("eval-{r}")]))
            .expect(Deploy, Waiting, r)
            .appended(&[(Eval, Completed), (Deploy, Waiting)])
            .actions(edge(Deploy, r, false)),
        at_step("Deploy Ready", 6)
            .report(ready(Deploy, r))
            .expect(Deploy, Starting, r)
            .appended(&[(Deploy, Ready), (Deploy, Starting)])
            .actions(replaces(spec(Deploy, r, None))),
        at_step("inference worker Running", 7)
            .worker(worker(Deploy, r, WorkerPhase::Running))
            .expect(Train, Waiting, r)
            .appended(&[(Deploy, Completed), (Train, Waiting)])
            .actions(edge(Train, r, false))
            .check(move |c, out| {
                let s = &out.status;
                let got = s.deployed.as_ref().map(|d| (d.round, d.url.clone()));
                assert_eq!(got, Some((r, model("selected").url)), "{}: deployed", c.name);
                assert_eq!(s.rounds_completed, r, "{}: rounds_completed", c.name);
                assert_eq!(s.last_trained, Some(model(&format!("train-{r}"))), "{}: last_trained", c.name);
            }),
    ]
}

fn trace(status: &LifelongLearningJobStatus) -> Vec<(Stage, Phase)> {
    status.conditions.iter().map(|c| (c.stage, c.type_)).collect()
}

#[test]
fn a_round_step_by_step() {
    let mut table = vec![first_sync()];
    table.extend(round_steps(1, 10));
    let end = run_chain(table);

    let mut want = ROUND.to_vec();
    want.push((Train, Waiting));
    assert_eq!(trace(&end), want, "round 1: the conditions");

    // 14 a round: Sedna's 13 and (Deploy, Starting) before Deploy Completed.
    let mut sedna = SEDNA_ROUND.to_vec();
    sedna.insert(12, (Deploy, Starting));
    assert_eq!(ROUND.to_vec(), sedna, "a round: Sedna's conditions plus (Deploy, Starting)");

    // The Ready conditions carry the input, the result-carrying Completed the output.
    let data = |i: usize| end.conditions[i].data.clone().unwrap_or_default();
    assert!(data(1).contains("train.txt"), "round 1: Train Ready's data {}", data(1));
    assert!(data(4).contains(&model("train-1").url), "round 1: Train Completed's data {}", data(4));
    assert!(data(9).contains(&model("eval-1").url), "round 1: Eval Completed's data {}", data(9));
    assert!(data(11).contains(&model("selected").url), "round 1: Deploy Ready's data {}", data(11));
}

/// The status after a first sync and three rounds, step by step (each step checked by `run_case`).
fn three_rounds() -> LifelongLearningJobStatus {
    let mut table = vec![first_sync()];
    for r in 1..=3 {
        table.extend(round_steps(r, 100 * i64::try_from(r).unwrap()));
    }
    run_chain(table)
}

#[test]
fn only_the_newest_condition_of_each_stage_and_type_keeps_its_data() {
    // Three rounds: the newest MAX_CONDITIONS conditions, and of the Ready and Completed ones
    // (those with data) only the last round's hold it.
    let end = three_rounds();
    let with_data: Vec<_> = end
        .conditions
        .iter()
        .filter(|c| c.data.is_some())
        .map(|c| (c.stage, c.type_, c.data.clone().unwrap()))
        .collect();
    let kinds: Vec<_> = with_data.iter().map(|(stage, type_, _)| (*stage, *type_)).collect();
    assert_eq!(
        kinds,
        [(Train, Ready), (Train, Completed), (Eval, Ready), (Eval, Completed), (Deploy, Ready)],
        "one of each, in order"
    );
    assert!(with_data[1].2.contains(&model("train-3").url), "round 3's Train result: {}", with_data[1].2);
    let size = serde_json::to_string(&end.conditions).unwrap().len();
    assert!(size < 4_000, "three rounds' conditions stored in {size} bytes");
}

#[test]
fn conditions_are_capped() {
    // Three rounds step by step: 1 + 3 × 14 = 43 conditions, the newest 16 kept (`run_case`
    // checks every step drops only the oldest).
    let end = three_rounds();
    let mut all = vec![(Train, Waiting)];
    for _ in 0..3 {
        all.extend_from_slice(&ROUND[1..]);
        all.push((Train, Waiting));
    }
    assert_eq!(all.len(), 43, "three rounds: conditions before the cap");
    assert_eq!(
        trace(&end),
        all[43 - MAX_CONDITIONS..].to_vec(),
        "three rounds: the newest {MAX_CONDITIONS} conditions"
    );
    let newest = end.conditions.last().and_then(|c| c.last_transition_time.clone());
    assert_eq!(newest, Some(Time(at(307))), "three rounds: the newest condition is the last step's");

    // A full list: one more transition drops the oldest.
    let mut full = status(Train, Completed, 1);
    full.conditions = (0..MAX_CONDITIONS - 1).map(|i| condition(Eval, Running, -1000 + i as i64)).collect();
    full.conditions.push(condition(Train, Completed, -60));
    run(vec![
        case("a full list: one more condition drops the oldest", full)
            .expect(Eval, Waiting, 1)
            .appended(&[(Eval, Waiting)])
            .actions(edge(Eval, 1, false)),
    ]);
}

// ---------------------------------------------------------------------------------------------
// Bugs found by these tables, fixed

/// In Train Waiting the job's round is the finished one (Train Ready opens round+1), so a
/// Train Failed for that finished round passes the round check and fails the job: Sedna's
/// fault 3 (a late Failed restarts the job) remains in this state.
#[test]
fn a_late_train_failed_in_train_waiting_is_stale() {
    run(vec![
        case(
            "round 1 deployed, Train Waiting: a late Train Failed of round 1",
            LifelongLearningJobStatus { rounds_completed: 1, deployed: Some(deployed(1)), ..status(Train, Waiting, 1) },
        )
        .report(failed(Train, 1, "OOMKilled"))
        .actions(stale)
        .check(unchanged),
        case(
            "round 1 failed and retried, Train Waiting: its relayed Failed arrives late",
            LifelongLearningJobStatus { retries: 1, ..status(Train, Waiting, 1) },
        )
        .report(failed(Train, 1, "exit code 1"))
        .actions(stale)
        .check(unchanged),
    ]);
}

/// Restarts in place add to the re-creations: a worker re-created 3 times whose new pod then
/// restarts in place once has restarted 4 times.
#[test]
fn restarts_in_place_add_to_recreations() {
    let recreated = |n| {
        let mut s = status(Train, Running, 1);
        let worker = s.worker.as_mut().unwrap();
        worker.restarts = n;
        worker.recreations = n;
        s
    };
    run(vec![
        case("re-created 3 times, then 1 restart in place (4 > 3) → Failed", recreated(3))
            .worker(WorkerObservation { restarts: 1, ..worker(Train, 1, WorkerPhase::Running) })
            .expect(Train, Failed, 1)
            .appended(&[(Train, Failed)])
            .actions(stops(Train))
            .recheck(10),
        case("re-created 2 times, then 2 restarts in place (4 > 3) → Failed", recreated(2))
            .worker(WorkerObservation { restarts: 2, ..worker(Train, 1, WorkerPhase::Running) })
            .expect(Train, Failed, 1)
            .appended(&[(Train, Failed)])
            .actions(stops(Train))
            .recheck(10),
    ]);
}
