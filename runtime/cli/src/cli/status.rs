//! `perennial status`: each job's stage, round, samples, deployed model and its metrics, and its
//! policies, from a run's state dir (it may be running).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use perennial_api::{LifelongLearningJobStatus, Phase, PolicyStatus};
use perennial_edge::sqlite::Store;
use perennial_edge::{health, rounds};
use perennial_embedded::{pairing, progress::metrics, state};

#[derive(Args)]
pub struct StatusArgs {
    /// The state dir of `perennial run`.
    #[arg(long, env = "PERENNIAL_STATE_DIR", default_value = ".perennial")]
    state_dir: PathBuf,
    /// A table, or each job and its whole status as JSON.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let path = args.state_dir.join("control.db");
    match std::fs::metadata(&path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "--state-dir {}: no jobs here (no control.db); run `perennial run` first",
            args.state_dir.display()
        ),
        Err(err) => anyhow::bail!("{}: {err}", path.display()),
        Ok(_) => {}
    }
    let control = state::open(&args.state_dir)?;
    let jobs = state::jobs(&control)?;
    // Why each job waits, as the edge says it now (the status may predate its last look).
    let edge = args.state_dir.join("edge.db");
    // An empty file is no store yet; anything else is opened (a folder or a FIFO is said as such).
    let edge = match std::fs::metadata(&edge).is_ok_and(|m| !m.is_file() || m.len() > 0) {
        true => Some(Store::open(&edge)?),
        false => None,
    };
    // What `perennial run` would refuse: said first, since what follows is only control.db's view.
    if let Err(err) = pairing::check_readonly(&args.state_dir, &control, edge.as_ref()) {
        eprintln!("warning: {err}");
    }
    let (waiting, healths, faults) = match &edge {
        Some(edge) => (rounds::waiting_reasons(edge)?, health::all(edge)?, rounds::faults(edge.conn())?),
        None => Default::default(),
    };
    let mut rows = Vec::new();
    for (key, stored) in &jobs {
        let mut status = state::status(&control, key)?;
        // The policies as the edge records them now: serving, failing, their last decisions.
        health::apply_job(&mut status.policies, &healths, key);
        if status.phase == Some(Phase::Waiting)
            && let Some((_, why)) = waiting.iter().find(|(job, _)| job == key)
        {
            status.message = Some(why.clone());
        }
        status.fault = faults.iter().find(|(job, _)| job == key).map(|(_, fault)| fault.clone());
        let dataset =
            format!("{}/{}", key.split_once('/').map_or("default", |(n, _)| n), stored.object.spec.dataset.name);
        let samples = state::dataset_samples(&control, &dataset)?;
        rows.push((key.clone(), status, samples));
    }
    match args.output {
        Output::Json => {
            let all: Vec<serde_json::Value> = rows
                .iter()
                .map(|(key, status, samples)| serde_json::json!({"job": key, "samples": samples, "status": status}))
                .collect();
            println!("{}", serde_json::to_string_pretty(&all).context("status as JSON")?);
        }
        Output::Table => print_table(&rows),
    }
    Ok(())
}

fn print_table(rows: &[(String, LifelongLearningJobStatus, Option<u64>)]) {
    let header = ["JOB", "STAGE", "ROUND", "DONE", "SAMPLES", "DEPLOYED", "METRICS"];
    let mut table: Vec<[String; 7]> = vec![header.map(String::from)];
    for (key, s, samples) in rows {
        let stage = match (s.stage, s.phase) {
            (Some(stage), Some(phase)) => format!("{stage}/{phase}"),
            _ => "-".into(),
        };
        let (deployed, metrics) = match &s.deployed {
            Some(m) => (format!("round {}: {}", m.round, m.url), metrics(m.metrics.as_ref())),
            None => ("-".into(), "-".into()),
        };
        table.push([
            key.clone(),
            stage,
            s.round.to_string(),
            s.rounds_completed.to_string(),
            samples.map_or("-".into(), |n| n.to_string()),
            deployed,
            metrics,
        ]);
    }
    // A cell is cut to a width a terminal shows (a model URL or metrics can be long).
    for cell in table.iter_mut().flatten() {
        *cell = cut(cell, MAX_CELL);
    }
    let widths: Vec<usize> =
        (0..7).map(|c| table.iter().map(|row| row[c].chars().count()).max().unwrap_or(0)).collect();
    for (i, row) in table.iter().enumerate() {
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        println!("{}", line.join("  ").trim_end());
        if i == 0 {
            continue;
        }
        let s = &rows[i - 1].1;
        for (kind, p) in &s.policies {
            print_policy(kind, p);
        }
        if s.retries > 0 {
            println!("  retries: {} in a row", s.retries);
        }
        if let Some(fault) = &s.fault {
            println!("  failing: {fault}");
        }
        if let Some(message) = &s.message {
            let label = if s.phase == Some(Phase::Waiting) { "waiting" } else { "last" };
            println!("  {label}: {message}");
        }
    }
}

/// The widest a table cell is shown.
const MAX_CELL: usize = 120;

/// `text` cut to `max` characters, with an ellipsis when it was longer.
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut kept: String = text.chars().take(max.saturating_sub(1)).collect();
    kept.push('…');
    kept
}

/// A policy's lines: what serves (plugin, component and config digests, health), why it fails
/// or was refused, and its last decision with its own reason.
fn print_policy(kind: &str, p: &PolicyStatus) {
    let digest = p.digest.get(..12).unwrap_or(&p.digest);
    let config = if p.config.is_empty() { String::new() } else { format!(" config:{}", p.config) };
    println!("  {kind:<8} {} sha256:{digest}{config} {:?}", p.plugin, p.health);
    if let Some(message) = &p.message {
        println!("           {message}");
    }
    if let Some(loading) = &p.loading {
        let digest = match loading.digest.get(..12).unwrap_or(&loading.digest) {
            "" => String::new(),
            digest => format!(" sha256:{digest}"),
        };
        println!(
            "           loading {}{digest} since {}: this one serves until it is ready",
            loading.plugin, loading.since
        );
    }
    if let Some(decision) = &p.last_decision {
        println!("           last decision: {}, {} ({})", decision.answer, decision.reason, decision.time);
    }
    if let Some(shadow) = &p.shadow {
        let digest = shadow.digest.get(..12).unwrap_or(&shadow.digest);
        println!(
            "           shadow {} sha256:{digest} config:{}: {} calls, {} agreed, {} disagreed, {} failed, {} skipped",
            shadow.plugin, shadow.config, shadow.calls, shadow.agreed, shadow.disagreed, shadow.failed, shadow.skipped
        );
        if let Some(message) = &shadow.message {
            println!("             {message}");
        }
        if let Some(d) = &shadow.last_disagreement {
            println!(
                "             last disagreement ({}): {}: {} where the policy said {} ({})",
                d.time, d.input, d.shadow_answer, d.answer, d.reason
            );
        }
    }
}
