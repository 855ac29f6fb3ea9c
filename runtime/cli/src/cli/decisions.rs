//! `perennial decisions JOB`: the job's recorded policy decisions, with what each policy saw,
//! from the state dir of `perennial run` or `perennial edge`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use perennial_edge::decisions::{self, DecisionKind, Query, Record};
use perennial_edge::replay;
use perennial_edge::sqlite::Store;

#[derive(Args)]
pub struct DecisionsArgs {
    /// The job: NAMESPACE/NAME, or NAME in `default`.
    job: String,
    /// The state dir of `perennial run` or `perennial edge`.
    #[arg(long, env = "PERENNIAL_STATE_DIR", default_value = ".perennial")]
    state_dir: PathBuf,
    #[command(flatten)]
    filter: Filter,
    /// At most this many, the newest (0: all).
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// A table, or the records as JSON.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// Which records: of one kind, since when.
#[derive(Args)]
pub struct Filter {
    /// Only this kind's decisions.
    #[arg(long, value_enum)]
    pub kind: Option<Kind>,
    /// Only decisions since then: a time (2026-12-01T10:00:00Z) or a span back from now (90m, 2h, 3d).
    #[arg(long)]
    pub since: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    Trigger,
    Splitter,
    Selector,
}

impl From<Kind> for DecisionKind {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::Trigger => DecisionKind::Trigger,
            Kind::Splitter => DecisionKind::Splitter,
            Kind::Selector => DecisionKind::Selector,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

impl Filter {
    pub fn query(&self, limit: Option<usize>) -> anyhow::Result<Query> {
        let since_ms = self.since.as_deref().map(since_ms).transpose()?;
        Ok(Query { kind: self.kind.map(DecisionKind::from), since_ms, limit })
    }
}

/// `--since`: a timestamp, or a span back from now.
fn since_ms(text: &str) -> anyhow::Result<u64> {
    if let Ok(time) = text.parse::<jiff::Timestamp>() {
        return Ok(time.as_millisecond().max(0) as u64);
    }
    let span: jiff::Span = text.parse().map_err(|err| {
        anyhow::anyhow!("--since {text:?}: neither a time (2026-12-01T10:00:00Z) nor a span (90m, 2h, 3d): {err}")
    })?;
    let then = jiff::Timestamp::now()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .checked_sub(span)
        .with_context(|| format!("--since {text:?}: too far back"))?;
    Ok(then.timestamp().as_millisecond().max(0) as u64)
}

/// The job's key as the store has it.
pub fn job_key(job: &str) -> String {
    if job.contains('/') { job.to_owned() } else { format!("default/{job}") }
}

/// The edge state of a state dir; it must exist.
pub fn open_edge_store(state_dir: &Path) -> anyhow::Result<Store> {
    let path = state_dir.join("edge.db");
    if !path.exists() {
        bail!(
            "--state-dir {}: no edge.db here; give the state dir of `perennial run` or `perennial edge`",
            state_dir.display()
        );
    }
    Ok(Store::open(&path)?)
}

/// The job's records, or an error that names the jobs that have some.
pub fn records(store: &Store, job: &str, query: &Query) -> anyhow::Result<Vec<Record>> {
    let records = decisions::read(store.conn(), job, query)?;
    if records.is_empty()
        && decisions::read(store.conn(), job, &Query { limit: Some(1), ..Query::default() })?.is_empty()
    {
        let known = decisions::jobs(store.conn())?;
        let known = if known.is_empty() { "none has".to_owned() } else { format!("these have: {}", known.join(", ")) };
        bail!("job {job}: no decisions recorded ({known})");
    }
    Ok(records)
}

pub fn run(args: DecisionsArgs) -> anyhow::Result<()> {
    let store = open_edge_store(&args.state_dir)?;
    let job = job_key(&args.job);
    let limit = (args.limit > 0).then_some(args.limit);
    let records = records(&store, &job, &args.filter.query(limit)?)?;
    match args.output {
        Output::Json => {
            let all: Vec<serde_json::Value> = records.iter().map(as_json).collect();
            println!("{}", serde_json::to_string_pretty(&all).context("the records as JSON")?);
        }
        Output::Table => print_table(&records),
    }
    Ok(())
}

/// A record as JSON: its fields, the time as RFC 3339, a split's assignments as one string.
fn as_json(record: &Record) -> serde_json::Value {
    let mut value = serde_json::to_value(record).unwrap_or_default();
    if let Some(object) = value.as_object_mut() {
        object.insert("time".into(), replay::time(record.at_ms).into());
        object.insert("lastTime".into(), replay::time(record.last_ms).into());
        if let Some(assignments) = &record.assignments {
            let letters: String = assignments.iter().map(|a| ['t', 'e', 's'][usize::from(*a).min(2)]).collect();
            object.insert("assignments".into(), letters.into());
        }
    }
    value
}

fn print_table(records: &[Record]) {
    let header = ["ID", "TIME", "KIND", "ROUND", "POLICY", "ANSWER", "CALL µS", "INPUT", "REASON"];
    let mut table: Vec<Vec<String>> = vec![header.map(String::from).to_vec()];
    for record in records {
        let time = match record.repeats {
            0 | 1 => replay::time(record.at_ms),
            n => format!("{} (x{n} to {})", replay::time(record.at_ms), replay::time(record.last_ms)),
        };
        let digest = record.policy.digest.get(..12).unwrap_or(&record.policy.digest);
        let policy = match digest {
            "" => format!("{} config:{}", record.policy.plugin, record.policy.config),
            digest => format!("{} sha256:{digest} config:{}", record.policy.plugin, record.policy.config),
        };
        table.push(vec![
            record.id.to_string(),
            time,
            record.kind.to_string(),
            record.round.to_string(),
            policy,
            record.short_answer(),
            record.micros.to_string(),
            input(record),
            record.reason.clone(),
        ]);
    }
    let widths: Vec<usize> =
        (0..header.len()).map(|c| table.iter().map(|row| row[c].chars().count()).max().unwrap_or(0)).collect();
    for row in &table {
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        println!("{}", line.join("  ").trim_end());
    }
}

/// What the policy saw, in a few words.
fn input(record: &Record) -> String {
    let field = |name: &str| record.input.get(name).map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    match record.kind {
        DecisionKind::Trigger => format!("pendingTrain={} pendingEval={}", field("pendingTrain"), field("pendingEval")),
        DecisionKind::Splitter => format!(
            "batch {} seq {}+{} bytes {}..{}",
            field("batch"),
            field("firstSeq"),
            field("count"),
            field("start"),
            field("end")
        ),
        DecisionKind::Selector => {
            let candidates = record.input.get("candidates").and_then(|c| c.as_array()).map_or(0, Vec::len);
            let deployed = if record.input.get("deployed").is_some_and(|d| !d.is_null()) { "a model" } else { "none" };
            format!("{candidates} candidates, deployed {deployed}")
        }
    }
}
