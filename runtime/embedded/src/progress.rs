//! What `perennial run` shows: on a terminal, a live line per job (samples, stage, round, the
//! deployed model's metrics, with `indicatif`); otherwise plain lines. Either way, a line per
//! completed round saying what was deployed and its metrics.

use std::io::Write;
use std::sync::OnceLock;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::controller::ControlledJob;
use perennial_api::LifelongLearningJobStatus;

pub struct Progress {
    bars: Option<(MultiProgress, Vec<ProgressBar>)>,
}

impl Progress {
    /// Live lines when `terminal`, plain lines otherwise.
    pub fn new(terminal: bool, jobs: &[ControlledJob]) -> Progress {
        if !terminal {
            return Progress { bars: None };
        }
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10));
        let _ = LIVE.set(multi.clone());
        let style = ProgressStyle::with_template("{spinner} {prefix:.bold} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        let bars = jobs
            .iter()
            .map(|job| {
                let bar = multi.add(ProgressBar::new_spinner());
                bar.set_style(style.clone());
                bar.set_prefix(job.key.clone());
                bar
            })
            .collect();
        Progress { bars: Some((multi, bars)) }
    }

    /// Refreshes the live lines.
    pub fn tick(&self, jobs: &[ControlledJob]) {
        if let Some((_, bars)) = &self.bars {
            for (bar, job) in bars.iter().zip(jobs) {
                bar.set_message(summary(job));
                bar.tick();
            }
        }
    }

    /// Says what changed for a job: a line per stage change (plain mode) and per completed round.
    pub fn changed(&self, job: &ControlledJob, before: &LifelongLearningJobStatus) {
        let after = &job.status;
        if after.rounds_completed > before.rounds_completed {
            self.line(round_line(job));
        } else if self.bars.is_none() && (after.stage, after.phase) != (before.stage, before.phase) {
            tracing::info!(job = job.key, round = after.round, "{}", summary(job));
        }
    }

    fn line(&self, text: String) {
        match &self.bars {
            Some((multi, _)) => {
                let _ = multi.println(text);
            }
            None => println!("{text}"),
        }
    }

    /// Clears the live lines.
    pub fn finish(&self) {
        if let Some((_, bars)) = &self.bars {
            for bar in bars {
                bar.finish_and_clear();
            }
        }
    }
}

/// `round 2 · Eval/Running · 1,234 samples · deployed: round 1 accuracy=0.72`
fn summary(job: &ControlledJob) -> String {
    if job.deleted {
        return "deleted; its workers were stopped".into();
    }
    let s = &job.status;
    let stage = match (s.stage, s.phase) {
        (Some(stage), Some(phase)) => format!("{stage}/{phase}"),
        _ => "starting".into(),
    };
    let deployed = match &s.deployed {
        Some(model) => format!("deployed: round {} {}", model.round, metrics(model.metrics.as_ref())),
        None => "nothing deployed yet".into(),
    };
    let why = match (s.phase, &s.message) {
        (Some(perennial_api::Phase::Waiting | perennial_api::Phase::Failed), Some(message)) => format!(" · {message}"),
        _ => String::new(),
    };
    format!("round {} · {stage} · {} samples · {deployed}{why}", s.round, job.samples)
}

/// The line for a completed round.
fn round_line(job: &ControlledJob) -> String {
    let s = &job.status;
    match &s.deployed {
        Some(model) if model.round == s.round => {
            format!("{} round {}: deployed {} ({})", job.key, s.round, model.url, metrics(model.metrics.as_ref()))
        }
        Some(model) => format!(
            "{} round {}: kept the model of round {} ({}): {}",
            job.key,
            s.round,
            model.round,
            metrics(model.metrics.as_ref()),
            s.message.as_deref().unwrap_or("no model chosen")
        ),
        None => format!("{} round {}: nothing deployed: {}", job.key, s.round, s.message.as_deref().unwrap_or("")),
    }
}

/// `accuracy=0.72 samples=140`: a model's numeric metrics.
pub fn metrics(metrics: Option<&serde_json::Value>) -> String {
    let Some(serde_json::Value::Object(map)) = metrics else { return "no metrics".into() };
    let parts: Vec<String> = map
        .iter()
        .filter_map(|(name, value)| {
            let v = value.as_f64()?;
            Some(if v.fract() == 0.0 && v.abs() < 1e15 { format!("{name}={v}") } else { format!("{name}={v:.4}") })
        })
        .collect();
    if parts.is_empty() { "no metrics".into() } else { parts.join(" ") }
}

/// The live lines, while they are shown: log lines are written above them, not through them.
static LIVE: OnceLock<MultiProgress> = OnceLock::new();

/// Stderr for log lines that keeps the live lines whole (a `tracing` writer).
pub struct LogWriter;

/// One log line, written when complete.
pub struct LogLine(Vec<u8>);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogLine;

    fn make_writer(&'a self) -> LogLine {
        LogLine(Vec::new())
    }
}

impl Write for LogLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogLine {
    fn drop(&mut self) {
        let line = std::mem::take(&mut self.0);
        let write = || {
            let _ = std::io::stderr().write_all(&line);
        };
        match LIVE.get() {
            Some(multi) => multi.suspend(write),
            None => write(),
        }
    }
}
