//! How long a job's decision records are kept (`spec.decisionRecords`).

use serde::{Deserialize, Serialize};

/// Records kept per job when the job does not say.
pub const DEFAULT_MAX_RECORDS: u32 = 10_000;
/// Age after which a record goes when the job does not say: a week.
pub const DEFAULT_MAX_RECORD_AGE_SECS: u64 = 7 * 24 * 3600;

/// The bound on a job's decision records: the newest `maxCount`, none older than
/// `maxAgeSeconds`. Whichever is reached first removes the oldest records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordRetention {
    /// Records kept per job (default 10000; 0 records nothing).
    #[serde(default = "default_max_count")]
    pub max_count: u32,
    /// Oldest record kept, in seconds (default a week).
    #[serde(default = "default_max_age")]
    #[schemars(range(min = 1))]
    pub max_age_seconds: u64,
}

fn default_max_count() -> u32 {
    DEFAULT_MAX_RECORDS
}

fn default_max_age() -> u64 {
    DEFAULT_MAX_RECORD_AGE_SECS
}

impl Default for RecordRetention {
    fn default() -> Self {
        RecordRetention { max_count: DEFAULT_MAX_RECORDS, max_age_seconds: DEFAULT_MAX_RECORD_AGE_SECS }
    }
}
