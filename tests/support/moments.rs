//! Random moments for the crash and restart tests: a seeded sequence, different on each run of a
//! test, whose seed is printed so that a failing run can be replayed (`PERENNIAL_TEST_SEED`).
//! And a turn for the tests that load the machine most (kill loops, a Python compile): one at a
//! time, so that none of them runs out of its time limits on 2 cores beside another.

/// Held while a test that loads the machine runs.
pub fn heavy_turn() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A xorshift sequence; good enough to pick when to kill.
pub struct Moments(u64);

impl Moments {
    /// A new sequence for the test `what`: its seed from `PERENNIAL_TEST_SEED`, else the clock,
    /// printed either way.
    pub fn new(what: &str) -> Moments {
        let seed = std::env::var("PERENNIAL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
        eprintln!("{what}: seed {seed} (PERENNIAL_TEST_SEED={seed} replays it)");
        Moments(seed | 1)
    }

    /// A number in `0..below`.
    pub fn below(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}
