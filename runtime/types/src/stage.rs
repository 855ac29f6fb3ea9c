//! A round's stages and where a stage is (Sedna's condition types).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A stage of a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub enum Stage {
    Train,
    Eval,
    Deploy,
}

impl Stage {
    /// The stage after this one: Train → Eval → Deploy → Train.
    pub fn next(self) -> Stage {
        match self {
            Stage::Train => Stage::Eval,
            Stage::Eval => Stage::Deploy,
            Stage::Deploy => Stage::Train,
        }
    }

    /// Sedna's lower-case name: the worker report's `kind` and the worker-type label.
    pub fn worker_kind(self) -> &'static str {
        match self {
            Stage::Train => "train",
            Stage::Eval => "eval",
            Stage::Deploy => "inference",
        }
    }

    /// Sedna's report `kind` (`deploy` for the inference worker): how worker records name it.
    pub fn report_kind(self) -> &'static str {
        match self {
            Stage::Train => "train",
            Stage::Eval => "eval",
            Stage::Deploy => "deploy",
        }
    }

    pub fn parse(text: &str) -> Option<Stage> {
        match text.to_ascii_lowercase().as_str() {
            "train" => Some(Stage::Train),
            "eval" => Some(Stage::Eval),
            "deploy" | "inference" => Some(Stage::Deploy),
            _ => None,
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// Where a stage is: Sedna's condition types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Phase {
    Waiting,
    Ready,
    Starting,
    Running,
    Completed,
    Failed,
}

impl Phase {
    pub fn parse(text: &str) -> Option<Phase> {
        match text.to_ascii_lowercase().as_str() {
            "waiting" => Some(Phase::Waiting),
            "ready" => Some(Phase::Ready),
            "starting" => Some(Phase::Starting),
            "running" => Some(Phase::Running),
            "completed" => Some(Phase::Completed),
            "failed" => Some(Phase::Failed),
            _ => None,
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}
