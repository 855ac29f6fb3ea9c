//! Leader election over a `coordination.k8s.io/v1` Lease.
//!
//! `perennial operator` runs as two replicas so that losing a node does not stop the jobs, but
//! only one of them may act: two controllers creating pods and writing status for the same job
//! would fight over every object. The replicas share one Lease. The holder rewrites its
//! `renewTime` every `renew_every`; the other replica reads it every `retry_every` and waits.
//! A takeover waits out the lease (`renewTime + leaseDurationSeconds`), so a leader that is only
//! slow keeps its place, and the leader gives up by itself once it has failed to renew for
//! `renew_deadline` (two-thirds of the lease, as client-go's controllers do): a third of the
//! lease before a standby may take over, for the stop to take effect and for clocks that differ.
//! Every write carries the `resourceVersion` that was read, so of two candidates racing for the
//! same expired lease the API server lets exactly one win (the other gets 409).
//!
//! The rule is [`decide`], a pure function of the lease and the clock; [`Elector`] is the thin
//! shell that reads and writes the Lease:
//!
//! ```ignore
//! // Its own thread and client; `on_lost` runs there the moment the Lease is lost (the operator
//! // exits: a busy runtime must not keep acting for a while after).
//! let mut lease = LeaseThread::start(make_client, settings, on_lost)?;
//! lease.acquire().await?; // returns once this replica leads
//! // Held while the controller runs; released on a clean stop (the standby takes over at once);
//! // lost: the controller dropped, exit, come back as the standby.
//! lease.lead(controller).await?;
//! ```
//!
//! Expiry compares the holder's `renewTime` with the reader's clock, as in Kubernetes' own Lease
//! users: node clocks are assumed to be in sync (NTP); a skew of s seconds moves a takeover by s.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

#[cfg(test)]
mod tests;

/// Which Lease, who we are, and the timings. `renew_every` must be well inside `renew_deadline`,
/// so that failed renewals get retried before the leader gives up, and `renew_deadline` well
/// inside `duration`, so that it has given up before anyone may take over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// This replica's name in `holderIdentity` (its pod name): unique among the replicas.
    pub identity: String,
    /// How long a lease lasts without renewal (`leaseDurationSeconds`, whole seconds, at least 1).
    pub duration: Duration,
    /// How long the leader goes on without a renewal before it stops leading, by its own clock.
    pub renew_deadline: Duration,
    /// How often the leader renews.
    pub renew_every: Duration,
    /// How often a follower looks again, and the wait after a failed call or a lost race.
    pub retry_every: Duration,
}

impl LeaseSettings {
    /// The default timings (client-go's): a 15 s lease, renewed every 5 s, given up 10 s after
    /// the last renewal, polled every 2 s.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        LeaseSettings {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            renew_every: Duration::from_secs(5),
            retry_every: Duration::from_secs(2),
        }
    }

    /// `namespace/name`, as errors and logs name the lease.
    pub fn lease(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// What to do with the lease as read. The write-carrying variants hold the spec to write.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// There is no lease: create it, held by me.
    Create(LeaseSpec),
    /// I hold it: write it back with `renewTime` now (the same `acquireTime` and transitions).
    Renew(LeaseSpec),
    /// Nobody holds it, or its holder let it expire: take it (`leaseTransitions` + 1).
    TakeOver(LeaseSpec),
    /// Someone else holds it and it is fresh: look again after `retry_after` (`retry_every`, or
    /// sooner if the lease runs out sooner).
    Follow { holder: String, retry_after: Duration },
}

/// The rule. `lease` is the Lease's spec as read (`None`: no Lease object), `me` this replica's
/// identity. A lease is expired from `renewTime + leaseDurationSeconds` on (inclusive); a lease
/// without `renewTime` counts from `acquireTime`, one with neither is treated as expired (nothing
/// says its holder is alive), and a missing duration is taken as ours.
pub fn decide(lease: Option<&LeaseSpec>, me: &str, now: Timestamp, settings: &LeaseSettings) -> Decision {
    let Some(lease) = lease else {
        return Decision::Create(held_by(&LeaseSpec::default(), me, now, now, 0, settings));
    };
    let transitions = lease.lease_transitions.unwrap_or(0).max(0);
    match lease.holder_identity.as_deref().filter(|holder| !holder.is_empty()) {
        Some(holder) if holder == me => {
            let acquired = lease.acquire_time.as_ref().map_or(now, |time| time.0);
            Decision::Renew(held_by(lease, me, acquired, now, transitions, settings))
        }
        Some(holder) => match expiry(lease, settings) {
            Some(expiry) if now < expiry => {
                let remaining = Duration::try_from(expiry.duration_since(now)).unwrap_or(settings.retry_every);
                Decision::Follow { holder: holder.to_owned(), retry_after: remaining.min(settings.retry_every) }
            }
            _ => Decision::TakeOver(held_by(lease, me, now, now, transitions.saturating_add(1), settings)),
        },
        None => Decision::TakeOver(held_by(lease, me, now, now, transitions.saturating_add(1), settings)),
    }
}

/// The spec that gives the lease up: no holder, a one-second duration (for readers that look at
/// it), the rest kept. The other replica's next look takes it over.
pub fn released(lease: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(MicroTime(now)),
        ..lease.clone()
    }
}

/// `base` (other fields such as `preferredHolder` kept) held by `me`.
fn held_by(
    base: &LeaseSpec,
    me: &str,
    acquired: Timestamp,
    now: Timestamp,
    transitions: i32,
    settings: &LeaseSettings,
) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(settings.duration_seconds()),
        acquire_time: Some(MicroTime(acquired)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..base.clone()
    }
}

/// When the lease runs out; `None` if it says neither when it was renewed nor acquired.
fn expiry(lease: &LeaseSpec, settings: &LeaseSettings) -> Option<Timestamp> {
    let last = lease.renew_time.as_ref().or(lease.acquire_time.as_ref())?.0;
    let seconds = lease.lease_duration_seconds.unwrap_or_else(|| settings.duration_seconds());
    let length = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    Some(last.saturating_add(length).unwrap_or(Timestamp::MAX))
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The API server refused the lease outright (no RBAC for leases, an invalid object):
    /// retrying would not help.
    #[error("lease {lease}: {source}")]
    Api {
        lease: String,
        #[source]
        source: kube::Error,
    },
    /// The lease shows another holder (or none: released or deleted under us).
    #[error("lease {lease}: leadership lost, now held by {}", holder.as_deref().unwrap_or("nobody"))]
    Lost { lease: String, holder: Option<String> },
    /// Renewals failed until the renew deadline: the other replica may take over soon.
    #[error("lease {lease}: not renewed for {}s, giving up leadership (last error: {last_error})", since.as_secs())]
    RenewFailed { lease: String, since: Duration, last_error: String },
}

/// Makes the Lease's client, on the Lease's own thread (its connections and tasks live there).
pub type MakeClient = Box<dyn FnOnce() -> Result<kube::Client, String> + Send>;

/// Run on the Lease's thread the moment a held Lease is lost, before the loss is sent on: the
/// operator exits there, so that it stops acting even while its own runtime is too busy to
/// hear of the loss (the standby may take over `duration - renew_deadline` later).
pub type OnLost = Box<dyn FnOnce(&LeaderError) + Send>;

/// The Lease, taken and held on a thread of its own, with its own runtime and client: nothing
/// the operator's runtime does can delay a renewal. (A kube Controller polls every reconcile
/// inside one task: at a takeover of 10,000 jobs it held its worker for seconds at a time, and a
/// renewal polled beside it woke past the Lease's end; a task of its own on the same runtime was
/// not enough, as a busy worker may be the one that drives the runtime's timers.)
pub struct LeaseThread {
    acquired: tokio::sync::oneshot::Receiver<Result<(), LeaderError>>,
    lost: tokio::sync::oneshot::Receiver<LeaderError>,
    release: Option<tokio::sync::oneshot::Sender<tokio::sync::oneshot::Sender<()>>>,
    lease: String,
}

impl LeaseThread {
    /// Starts the thread, which takes the Lease as soon as it may.
    pub fn start(make_client: MakeClient, settings: LeaseSettings, on_lost: OnLost) -> std::io::Result<LeaseThread> {
        debug_assert!(
            settings.renew_every < settings.renew_deadline && settings.renew_deadline < settings.duration,
            "renewals inside the renew deadline, inside the lease: {settings:?}"
        );
        let (acquired_tx, acquired) = tokio::sync::oneshot::channel();
        let (lost_tx, lost) = tokio::sync::oneshot::channel();
        let (release, release_rx) = tokio::sync::oneshot::channel::<tokio::sync::oneshot::Sender<()>>();
        let lease = settings.lease();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        std::thread::Builder::new().name("lease".into()).spawn(move || {
            runtime.block_on(async move {
                let client = match make_client() {
                    Ok(client) => client,
                    Err(why) => {
                        let error = LeaderError::RenewFailed {
                            lease: settings.lease(),
                            since: Duration::ZERO,
                            last_error: format!("the Lease's client: {why}"),
                        };
                        let _ = acquired_tx.send(Err(error));
                        return;
                    }
                };
                let elector = Elector::new(client, settings);
                let mut release_rx = release_rx;
                // Asked to stop while taking it: whatever the write in flight did, give it back.
                let taken = tokio::select! {
                    taken = elector.acquire() => taken,
                    asked = &mut release_rx => {
                        elector.release().await;
                        if let Ok(done) = asked {
                            let _ = done.send(());
                        }
                        return;
                    }
                };
                let won = taken.is_ok();
                if acquired_tx.send(taken).is_err() {
                    // Nobody waits to lead any more (the process is stopping): give it back.
                    if won {
                        elector.release().await;
                    }
                    return;
                }
                if !won {
                    return;
                }
                tokio::select! {
                    lost = elector.hold() => {
                        on_lost(&lost);
                        let _ = lost_tx.send(lost);
                    }
                    asked = release_rx => {
                        elector.release().await;
                        if let Ok(done) = asked {
                            let _ = done.send(());
                        }
                    }
                }
            });
        })?;
        Ok(LeaseThread { acquired, lost, release: Some(release), lease })
    }

    /// Waits until this replica holds the Lease (see [`Elector::acquire`]).
    pub async fn acquire(&mut self) -> Result<(), LeaderError> {
        let lease = self.lease.clone();
        (&mut self.acquired).await.unwrap_or_else(|_| Err(ended(lease)))
    }

    /// Runs `work` while this replica leads (after [`LeaseThread::acquire`]). Returns once
    /// `work` ends, the Lease released; or, `work` dropped, why the Lease was lost.
    pub async fn lead(mut self, work: impl std::future::Future<Output = ()>) -> Result<(), LeaderError> {
        tokio::select! {
            () = work => {
                self.give_back().await;
                Ok(())
            }
            lost = &mut self.lost => Err(lost.unwrap_or_else(|_| ended(self.lease.clone()))),
        }
    }

    /// Stops taking the Lease (a stop before this replica leads), and gives it back if a write
    /// in flight took it: the other replica need not wait it out. Returns once given back, or
    /// after [`GIVE_BACK_WAIT`].
    pub async fn stop(mut self) {
        self.give_back().await;
    }

    async fn give_back(&mut self) {
        let (done, released) = tokio::sync::oneshot::channel();
        if let Some(release) = self.release.take()
            && release.send(done).is_ok()
        {
            let _ = tokio::time::timeout(GIVE_BACK_WAIT, released).await;
        }
    }
}

/// How long a stop waits for the Lease to be given back: well inside a pod's 30 s of grace.
const GIVE_BACK_WAIT: Duration = Duration::from_secs(5);

/// The Lease's thread ended without a word (it panicked).
fn ended(lease: String) -> LeaderError {
    LeaderError::RenewFailed { lease, since: Duration::ZERO, last_error: "the Lease's thread ended".into() }
}

/// Takes, keeps and gives up the lease. `acquire`, then `hold` while acting, `release` on a
/// clean stop (run on a thread of its own by [`LeaseThread`]).
pub struct Elector {
    api: Api<Lease>,
    settings: LeaseSettings,
    /// Tests: the wall clock is this timestamp plus tokio's (pausable) time since the instant.
    /// `None`: the system clock.
    epoch: Option<(Timestamp, Instant)>,
    /// The instant matching the `renewTime` of our last successful write; `None` when not leading.
    renewed: Mutex<Option<Instant>>,
}

/// How a call went wrong, for deciding whether to go on.
enum Failure {
    /// 409: someone else wrote the lease between our read and our write.
    Race,
    /// Retrying will not help.
    Fatal(kube::Error),
    /// Anything else (network, 5xx, timeouts): try again.
    Transient(String),
}

impl Failure {
    fn from_kube(error: kube::Error) -> Self {
        match &error {
            // kube 5's `is_conflict`/`is_already_exists` match on the reason only; check the code too.
            kube::Error::Api(status) if status.code == 409 || status.is_conflict() || status.is_already_exists() => {
                Failure::Race
            }
            kube::Error::Api(status) if matches!(status.code, 400 | 401 | 403 | 405 | 415 | 422) => {
                Failure::Fatal(error)
            }
            _ => Failure::Transient(error.to_string()),
        }
    }

    fn describe(&self) -> String {
        match self {
            Failure::Race => "someone else wrote the lease first (409)".to_owned(),
            Failure::Fatal(error) => error.to_string(),
            Failure::Transient(message) => message.clone(),
        }
    }
}

/// One acquire round's result.
enum Attempt {
    Won { at: Instant, transitions: i32 },
    Follow { holder: String, retry_after: Duration },
}

/// One renew round's result.
enum Renewal {
    Renewed(Instant),
    Lost(Option<String>),
}

impl Elector {
    pub fn new(client: kube::Client, settings: LeaseSettings) -> Self {
        Elector { api: Api::namespaced(client, &settings.namespace), settings, epoch: None, renewed: Mutex::new(None) }
    }

    /// For tests under paused tokio time: the wall clock starts at `start` and moves with
    /// tokio's clock, so lease expiry is deterministic.
    #[cfg(test)]
    pub(crate) fn with_clock(client: kube::Client, settings: LeaseSettings, start: Timestamp) -> Self {
        Elector { epoch: Some((start, Instant::now())), ..Elector::new(client, settings) }
    }

    /// Waits until this replica holds the lease. Errors only when the API server refuses the
    /// lease outright (e.g. no RBAC for leases); failed calls and lost races are retried.
    pub async fn acquire(&self) -> Result<(), LeaderError> {
        let lease = self.settings.lease();
        let mut following: Option<String> = None;
        loop {
            // Past the renew deadline, a write that lands would be given up at once.
            let attempt = tokio::time::timeout(self.settings.renew_deadline, self.try_acquire())
                .await
                .unwrap_or_else(|_| Err(Failure::Transient("timed out".to_owned())));
            let wait = match attempt {
                Ok(Attempt::Won { at, transitions }) => {
                    self.set_renewed(Some(at));
                    tracing::info!(lease, identity = %self.settings.identity, transitions, "became the leader");
                    return Ok(());
                }
                Ok(Attempt::Follow { holder, retry_after }) => {
                    if following.as_deref() != Some(holder.as_str()) {
                        tracing::info!(lease, holder, "following the leader");
                        following = Some(holder);
                    }
                    retry_after
                }
                Err(Failure::Race) => {
                    tracing::debug!(lease, "another replica wrote the lease first; looking again");
                    self.settings.retry_every
                }
                Err(Failure::Fatal(source)) => return Err(LeaderError::Api { lease, source }),
                Err(Failure::Transient(error)) => {
                    tracing::warn!(lease, error, "leader election: lease call failed; retrying");
                    self.settings.retry_every
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Keeps the lease while this replica acts: renews it every `renew_every` and returns why
    /// it stopped leading, when another holder shows up (or the lease is released or deleted) or
    /// when no renewal has succeeded for `renew_deadline` (failed calls are retried until then).
    /// Call after `acquire`; on return the caller must stop acting.
    pub async fn hold(&self) -> LeaderError {
        let lease = self.settings.lease();
        let mut renewed = self.renewed().unwrap_or_else(Instant::now);
        let mut next = renewed + self.settings.renew_every;
        let mut last_error = "none".to_owned();
        loop {
            // Our lease runs out at `renewed + duration` by our own clock: stop leading a third of
            // it before, for the stop to take effect and for a standby whose clock runs ahead.
            let deadline = renewed + self.settings.renew_deadline.min(self.settings.duration);
            tokio::time::sleep_until(next.min(deadline)).await;
            if Instant::now() >= deadline {
                self.set_renewed(None);
                tracing::warn!(lease, last_error, "leader election: could not renew the lease in time");
                let since = self.settings.renew_deadline.min(self.settings.duration);
                return LeaderError::RenewFailed { lease, since, last_error };
            }
            let renewal = tokio::time::timeout_at(deadline, self.try_renew())
                .await
                .unwrap_or_else(|_| Err(Failure::Transient("timed out".to_owned())));
            match renewal {
                Ok(Renewal::Renewed(at)) => {
                    renewed = at;
                    self.set_renewed(Some(at));
                    next = at + self.settings.renew_every;
                }
                Ok(Renewal::Lost(holder)) => {
                    self.set_renewed(None);
                    tracing::warn!(lease, holder, "leader election: lost the lease");
                    return LeaderError::Lost { lease, holder };
                }
                Err(failure) => {
                    last_error = failure.describe();
                    tracing::warn!(lease, error = last_error, "leader election: renewal failed; retrying");
                    next = Instant::now() + self.settings.retry_every;
                }
            }
        }
    }

    /// Gives the lease up (if we hold it) so the other replica takes over at its next look
    /// rather than after the lease expires. Failures are logged: the lease then simply expires.
    pub async fn release(&self) {
        let lease = self.settings.lease();
        self.set_renewed(None);
        let outcome = tokio::time::timeout(self.settings.duration, self.try_release())
            .await
            .unwrap_or_else(|_| Err(Failure::Transient("timed out".to_owned())));
        match outcome {
            Ok(true) => tracing::info!(lease, "released the lease"),
            Ok(false) => tracing::debug!(lease, "not the holder: nothing to release"),
            Err(failure) => {
                tracing::warn!(lease, error = failure.describe(), "could not release the lease; it will expire")
            }
        }
    }

    async fn try_acquire(&self) -> Result<Attempt, Failure> {
        let current = self.read().await?;
        let (now, at) = self.now();
        let spec = current.as_ref().map(|lease| lease.spec.clone().unwrap_or_default());
        match decide(spec.as_ref(), &self.settings.identity, now, &self.settings) {
            Decision::Follow { holder, retry_after } => Ok(Attempt::Follow { holder, retry_after }),
            Decision::Create(spec) | Decision::Renew(spec) | Decision::TakeOver(spec) => {
                let transitions = spec.lease_transitions.unwrap_or(0);
                self.write(current, spec).await?;
                Ok(Attempt::Won { at, transitions })
            }
        }
    }

    async fn try_renew(&self) -> Result<Renewal, Failure> {
        let Some(current) = self.read().await? else {
            return Ok(Renewal::Lost(None));
        };
        let (now, at) = self.now();
        let spec = current.spec.clone().unwrap_or_default();
        match decide(Some(&spec), &self.settings.identity, now, &self.settings) {
            Decision::Renew(spec) => {
                self.write(Some(current), spec).await?;
                Ok(Renewal::Renewed(at))
            }
            // Anything but "I hold it" means we do not.
            Decision::Follow { holder, .. } => Ok(Renewal::Lost(Some(holder))),
            Decision::Create(_) | Decision::TakeOver(_) => {
                Ok(Renewal::Lost(spec.holder_identity.filter(|holder| !holder.is_empty())))
            }
        }
    }

    async fn try_release(&self) -> Result<bool, Failure> {
        let Some(current) = self.read().await? else { return Ok(false) };
        let spec = current.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(false);
        }
        let (now, _) = self.now();
        self.write(Some(current), released(&spec, now)).await?;
        Ok(true)
    }

    /// The Lease, or `None` if there is none.
    async fn read(&self) -> Result<Option<Lease>, Failure> {
        match self.api.get(&self.settings.name).await {
            Ok(lease) => Ok(Some(lease)),
            // kube 5's `is_not_found` ignores the code when the reason is missing; check both.
            Err(kube::Error::Api(status)) if status.code == 404 || status.is_not_found() => Ok(None),
            Err(error) => Err(Failure::from_kube(error)),
        }
    }

    /// Creates the Lease (`current` is `None`) or replaces it, conditional on the
    /// `resourceVersion` read: a write after someone else's fails with 409.
    async fn write(&self, current: Option<Lease>, spec: LeaseSpec) -> Result<(), Failure> {
        let params = PostParams { field_manager: Some("perennial-operator".to_owned()), ..PostParams::default() };
        let written = match current {
            None => {
                let metadata = ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    namespace: Some(self.settings.namespace.clone()),
                    ..ObjectMeta::default()
                };
                self.api.create(&params, &Lease { metadata, spec: Some(spec) }).await
            }
            Some(current) => {
                if current.metadata.resource_version.as_deref().is_none_or(str::is_empty) {
                    // An unconditional write could overwrite a rival's: never send one.
                    return Err(Failure::Transient("the lease as read has no resourceVersion".to_owned()));
                }
                let lease = Lease { spec: Some(spec), ..current };
                self.api.replace(&self.settings.name, &params, &lease).await
            }
        };
        written.map(drop).map_err(Failure::from_kube)
    }

    /// The wall-clock time for `renewTime`, and the matching monotonic instant.
    fn now(&self) -> (Timestamp, Instant) {
        let at = Instant::now();
        let now = match self.epoch {
            Some((start, since)) => start.saturating_add(at - since).unwrap_or(Timestamp::MAX),
            None => Timestamp::now(),
        };
        (now, at)
    }

    fn renewed(&self) -> Option<Instant> {
        *self.renewed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_renewed(&self, at: Option<Instant>) {
        *self.renewed.lock().unwrap_or_else(PoisonError::into_inner) = at;
    }
}
