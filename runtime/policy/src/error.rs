use std::fmt;

/// Why a policy could not be loaded or could not answer a call.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PolicyError {
    #[error("policy reference: {0}")]
    Reference(String),
    #[error("fetching {plugin}: {message}")]
    Fetch { plugin: String, message: String },
    #[error("{plugin} has sha256 {actual}, but the reference says {expected}")]
    Digest { plugin: String, expected: String, actual: String },
    #[error("{plugin} is not a valid WebAssembly component: {message}")]
    Compile { plugin: String, message: String },
    #[error("{plugin} is refused: {message}")]
    Artifact { plugin: String, message: String },
    #[error("{plugin} cannot run here: {message}")]
    Precompiled { plugin: String, message: String },
    #[error("{plugin} is not a {kind} policy of perennial:policy@0.1.0: {message}")]
    WrongWorld { plugin: String, kind: &'static str, message: String },
    #[error("the plugin rejected its config: {0}")]
    Config(String),
    #[error("timed out after {ms} ms (limits.timeoutMs)")]
    Timeout { ms: u64 },
    #[error("did not start within {ms} ms (limits.startTimeoutMs)")]
    StartTimeout { ms: u64 },
    #[error("exceeded its memory limit of {mib} MiB (limits.memoryMiB)")]
    Memory { mib: u64 },
    #[error("panicked: {0}")]
    Panic(String),
    #[error("trapped: {0}")]
    Trap(String),
    #[error("bad answer: {0}")]
    BadAnswer(String),
}

/// The steps of loading (preparing) a policy; a failed load names the step it failed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Reference,
    Fetch,
    Verify,
    Compile,
    Instantiate,
    Configure,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Reference => "reference",
            Step::Fetch => "fetch",
            Step::Verify => "verify",
            Step::Compile => "compile",
            Step::Instantiate => "instantiate",
            Step::Configure => "configure",
        })
    }
}

/// A failed load: the step and the cause. The policy that was serving (if any) keeps serving.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("loading the policy failed at step `{step}`: {error}")]
pub struct LoadError {
    pub step: Step,
    pub error: PolicyError,
}

impl LoadError {
    pub fn new(step: Step, error: PolicyError) -> Self {
        LoadError { step, error }
    }
}

/// Folds a multi-line message (wasmtime's parse errors print byte arrays over many lines) into
/// one line.
pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
