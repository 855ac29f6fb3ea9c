//! A loaded, configured policy and its calls. One live instance per policy, used by one call at
//! a time; after any failed call the instance is dropped and the next call gets a fresh one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use wasmtime::{Store, Trap};

use super::bindings::{Kind, SelectorKind, SplitterKind, TriggerKind, splitter};
use super::engine::{EPOCH_TICK, engine};
use super::error::{LoadError, PolicyError, Step, one_line};
use super::reference::{Limits, OnError};
use super::sandbox::{HostState, PolicyEvents, truncate};
use super::types::{Assignments, Choice, Decision, ModelInfo, SampleBatch, TriggerStats};

/// What a policy is: where it came from and what it cost to load.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyInfo {
    /// `trigger`, `splitter` or `selector`.
    pub kind: &'static str,
    /// The plugin source as the reference gave it.
    pub source: String,
    /// Hex SHA-256 of the component.
    pub digest: String,
    /// Size of the component in bytes.
    pub size: usize,
    /// How long compiling (or loading from the cache) took.
    pub compile_time: Duration,
    /// Compiled code came from the in-memory or on-disk cache.
    pub from_cache: bool,
    pub limits: Limits,
    pub on_error: OnError,
}

/// Longest reason kept from a plugin's answer, in bytes.
const MAX_REASON_BYTES: usize = 1024;

struct Live<K: Kind> {
    store: Store<HostState>,
    instance: K::Instance,
}

/// What the instance is doing, for its deadline.
#[derive(Clone, Copy)]
enum Phase {
    /// Instantiation and `configure`.
    Start,
    /// A decision.
    Call,
}

impl Phase {
    fn timeout_ms(self, limits: &Limits) -> u64 {
        match self {
            Phase::Start => limits.start_timeout_ms,
            Phase::Call => limits.timeout_ms,
        }
    }

    /// The error of a deadline passed, naming the limit.
    fn timed_out(self, limits: &Limits) -> PolicyError {
        let ms = self.timeout_ms(limits);
        match self {
            Phase::Start => PolicyError::StartTimeout { ms },
            Phase::Call => PolicyError::Timeout { ms },
        }
    }
}

/// A loaded and configured policy of kind `K`.
pub struct Policy<K: Kind> {
    info: PolicyInfo,
    pre: K::Pre,
    config: String,
    /// The config's short digest, as the job's status shows it.
    config_digest: String,
    events: Arc<dyn PolicyEvents>,
    live: Mutex<Option<Live<K>>>,
    /// The last call's own time in µs: the component's work and the host's check of its answer,
    /// not a fresh instance's start before it (after a failed call, or an idle one dropped).
    last_call_micros: AtomicU64,
}

pub type TriggerPolicy = Policy<TriggerKind>;
pub type SplitterPolicy = Policy<SplitterKind>;
pub type SelectorPolicy = Policy<SelectorKind>;

impl<K: Kind> Policy<K> {
    /// Instantiates and configures the policy. A rejected config is `PolicyError::Config`.
    pub(super) fn start(
        info: PolicyInfo,
        pre: K::Pre,
        config: String,
        events: Arc<dyn PolicyEvents>,
    ) -> Result<Self, LoadError> {
        let config_digest = perennial_types::config_text_digest(&config);
        let policy = Policy {
            info,
            pre,
            config,
            config_digest,
            events,
            live: Mutex::new(None),
            last_call_micros: AtomicU64::new(0),
        };
        let live = policy.fresh_instance().map_err(|(step, error)| LoadError::new(step, error))?;
        *policy.lock() = Some(live);
        Ok(policy)
    }

    pub fn info(&self) -> &PolicyInfo {
        &self.info
    }

    /// The JSON config this policy was configured with.
    pub fn config(&self) -> &str {
        &self.config
    }

    /// Its config's short digest ([`perennial_types::config_digest`]).
    pub fn config_digest(&self) -> &str {
        &self.config_digest
    }

    /// The last call's own time in µs: from the host's entry into the component to its answer,
    /// checked; not the start of a fresh instance that came before it.
    pub fn last_call_micros(&self) -> u64 {
        self.last_call_micros.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Option<Live<K>>> {
        // A panic in the host while a call held the lock leaves an instance in an unknown
        // state: drop it, so the next call gets a fresh one.
        self.live.lock().unwrap_or_else(|poisoned| {
            let mut live = poisoned.into_inner();
            *live = None;
            live
        })
    }

    fn deadline_ticks(&self, phase: Phase) -> u64 {
        // One more tick than the timeout spans, since the current tick is already under way.
        phase.timeout_ms(&self.info.limits).div_ceil(EPOCH_TICK.as_millis() as u64) + 1
    }

    /// A fresh instance, instantiated and configured within `limits.startTimeoutMs` (a start
    /// is rare, and a large component's, a Python one's, takes far longer than a call).
    fn fresh_instance(&self) -> Result<Live<K>, (Step, PolicyError)> {
        let mut store = Store::new(engine(), HostState::new(self.events.clone(), self.info.limits.memory_mib));
        store.limiter(|state| &mut state.limiter);
        store.set_epoch_deadline(self.deadline_ticks(Phase::Start));
        store.data_mut().begin_call();
        let instance = K::instantiate(&self.pre, &mut store);
        let instance = match instance {
            Ok(instance) => instance,
            Err(err) => {
                let stderr = store.data_mut().end_call();
                return Err((Step::Instantiate, self.classify(Phase::Start, err, &stderr, &store)));
            }
        };
        let configured = K::configure(&instance, &mut store, &self.config);
        let stderr = store.data_mut().end_call();
        match configured {
            Ok(Ok(())) => Ok(Live { store, instance }),
            Ok(Err(message)) => {
                Err((Step::Configure, PolicyError::Config(truncate(&message, MAX_REASON_BYTES).to_owned())))
            }
            Err(err) => Err((Step::Configure, self.classify(Phase::Start, err, &stderr, &store))),
        }
    }

    /// Runs one call on the live instance (made fresh if the last call failed), then checks the
    /// answer. Any error drops the instance.
    fn call<R, T>(
        &self,
        prepare: impl FnOnce(&mut HostState),
        call: impl FnOnce(&mut Store<HostState>, &K::Instance) -> wasmtime::Result<R>,
        check: impl FnOnce(R) -> Result<T, String>,
    ) -> Result<T, PolicyError> {
        let mut live = self.lock();
        if live.is_none() {
            *live = Some(self.fresh_instance().map_err(|(_, error)| error)?);
        }
        let Some(current) = live.as_mut() else { unreachable!("set above") };
        let started = Instant::now();
        current.store.set_epoch_deadline(self.deadline_ticks(Phase::Call));
        let state = current.store.data_mut();
        state.begin_call();
        prepare(state);
        let result = call(&mut current.store, &current.instance);
        let stderr = current.store.data_mut().end_call();
        let outcome = match result {
            Ok(answer) => check(answer).map_err(PolicyError::BadAnswer),
            Err(err) => Err(self.classify(Phase::Call, err, &stderr, &current.store)),
        };
        self.last_call_micros.store(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        if let Err(err) = &outcome {
            *live = None;
            self.events.log(super::sandbox::Level::Error, &format!("policy {} call failed: {err}", self.info.kind));
        }
        outcome
    }

    fn classify(&self, phase: Phase, err: wasmtime::Error, stderr: &str, store: &Store<HostState>) -> PolicyError {
        if store.data().limiter.exceeded {
            return PolicyError::Memory { mib: store.data().limiter.mib };
        }
        if matches!(err.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
            return phase.timed_out(&self.info.limits);
        }
        if let Some(message) = panic_message(stderr) {
            return PolicyError::Panic(message);
        }
        let mut message = one_line(&format!("{err:#}"));
        if let Some(last) = stderr.lines().rev().find(|l| !l.trim().is_empty()) {
            message.push_str(&format!(" (stderr: {})", truncate(last, 512)));
        }
        PolicyError::Trap(message)
    }

    /// Drops the live instance; the next call starts a fresh one.
    pub fn reset(&self) {
        *self.lock() = None;
    }
}

/// The message of a Rust panic as the standard library prints it to stderr:
/// `thread '...' panicked at src/lib.rs:3:5:\nMESSAGE`.
fn panic_message(stderr: &str) -> Option<String> {
    let start = stderr.find("panicked at ")?;
    let rest = &stderr[start + "panicked at ".len()..];
    let mut lines = rest.lines();
    let location = lines.next()?.trim_end_matches(':');
    let message = lines.next().unwrap_or("").trim();
    Some(format!("{} (at {location})", truncate(message, 512)))
}

impl Policy<TriggerKind> {
    /// Train now, or wait?
    pub fn decide(&self, stats: &TriggerStats) -> Result<Decision, PolicyError> {
        let stats = stats.to_wit();
        self.call(
            |_| {},
            |store, instance| instance.perennial_policy_trigger().call_decide(store, &stats),
            |decision| {
                Ok(Decision {
                    train: decision.train,
                    reason: truncate(&decision.reason, MAX_REASON_BYTES).to_owned(),
                    recheck_after_secs: decision.recheck_after_secs,
                })
            },
        )
    }
}

impl Policy<SplitterKind> {
    /// One assignment per sample of `batch`, checked for length and values.
    pub fn split(&self, batch: SampleBatch) -> Result<Assignments, PolicyError> {
        let count = batch.len();
        let request = splitter::Batch {
            first_seq: batch.first_seq,
            count: u32::try_from(count)
                .map_err(|_| PolicyError::BadAnswer("a batch holds at most 2^32 samples".into()))?,
        };
        let lines = (batch.data, batch.ends);
        self.call(
            move |state| state.batch = Some(lines),
            |store, instance| instance.perennial_policy_splitter().call_split(store, request),
            |bytes| Assignments::check(bytes, count),
        )
    }
}

impl Policy<SelectorKind> {
    /// Which candidate to deploy, if any, against the deployed model.
    pub fn select(&self, deployed: Option<&ModelInfo>, candidates: &[ModelInfo]) -> Result<Choice, PolicyError> {
        let deployed = deployed.map(ModelInfo::to_wit);
        let wit_candidates: Vec<_> = candidates.iter().map(ModelInfo::to_wit).collect();
        self.call(
            |_| {},
            |store, instance| {
                instance.perennial_policy_selector().call_select(store, deployed.as_ref(), &wit_candidates)
            },
            |choice| {
                if let Some(index) = choice.deploy
                    && index as usize >= candidates.len()
                {
                    return Err(format!("select chose candidate {index} of {}", candidates.len()));
                }
                let mut choice = Choice::from(choice);
                choice.reason = truncate(&choice.reason, MAX_REASON_BYTES).to_owned();
                Ok(choice)
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::panic_message;

    #[test]
    fn panic_messages_are_read_from_stderr() {
        let stderr =
            "thread '<unnamed>' panicked at plugins/x/src/lib.rs:12:5:\nboom here\nnote: run with `RUST_BACKTRACE=1`\n";
        assert_eq!(panic_message(stderr).as_deref(), Some("boom here (at plugins/x/src/lib.rs:12:5)"));
        assert_eq!(panic_message("nothing"), None);
    }
}
