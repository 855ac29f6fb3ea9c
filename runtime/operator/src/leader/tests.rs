//! The rule as a table (every shape of lease against the clock), then the shell against a mock
//! API server that checks the exact sequence of calls, under paused tokio time.

use std::task::Poll;
use std::time::Duration;

use http::{Method, Request, Response};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::client::Body;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower_test::mock::{self, Handle, SendResponse};

use super::{Decision, Elector, LeaderError, LeaseSettings, decide, released};

const ME: &str = "operator-0";
const RIVAL: &str = "operator-1";
const LEASE: &str = "perennial-system/perennial-operator";
const COLLECTION: &str = "/apis/coordination.k8s.io/v1/namespaces/perennial-system/leases";
const ITEM: &str = "/apis/coordination.k8s.io/v1/namespaces/perennial-system/leases/perennial-operator";

// ---------------------------------------------------------------------------------------------
// Fixtures

/// `secs` seconds after a fixed instant; the elector's clock starts at `at(0)`.
fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn time(secs: i64) -> Option<MicroTime> {
    Some(MicroTime(at(secs)))
}

fn settings() -> LeaseSettings {
    LeaseSettings::new("perennial-system", "perennial-operator", ME)
}

/// A spec held by `holder`, acquired at -100 s, renewed at `renewed`, 15 s, `transitions`.
fn spec(holder: Option<&str>, renewed: i64, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: holder.map(str::to_owned),
        lease_duration_seconds: Some(15),
        acquire_time: time(-100),
        renew_time: time(renewed),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

/// What we write when we hold it: acquired at `acquired`, renewed at `now`.
fn mine(acquired: i64, now: i64, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(ME.to_owned()),
        lease_duration_seconds: Some(15),
        acquire_time: time(acquired),
        renew_time: time(now),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

fn follow(retry_after: Duration) -> Decision {
    Decision::Follow { holder: RIVAL.to_owned(), retry_after }
}

// ---------------------------------------------------------------------------------------------
// The rule

#[test]
fn decide_table() {
    let s = settings();
    let micro = Duration::from_micros(1);
    let cases: Vec<(&str, Option<LeaseSpec>, Timestamp, Decision)> = vec![
        ("no lease: create it", None, at(0), Decision::Create(mine(0, 0, 0))),
        ("mine, fresh: renew, acquireTime kept", Some(spec(Some(ME), -3, 4)), at(0), Decision::Renew(mine(-100, 0, 4))),
        (
            "mine, expired (nobody took it): renew, no transition",
            Some(spec(Some(ME), -60, 4)),
            at(0),
            Decision::Renew(mine(-100, 0, 4)),
        ),
        (
            "mine without acquireTime: renew, acquired now",
            Some(LeaseSpec { acquire_time: None, ..spec(Some(ME), -3, 4) }),
            at(0),
            Decision::Renew(mine(0, 0, 4)),
        ),
        (
            "other's, fresh: follow, look again in retry_every",
            Some(spec(Some(RIVAL), -3, 4)),
            at(0),
            follow(s.retry_every),
        ),
        (
            "other's, 1 s left: follow, look again when it runs out",
            Some(spec(Some(RIVAL), -14, 4)),
            at(0),
            follow(Duration::from_secs(1)),
        ),
        (
            "other's, 1 µs before expiry: follow",
            Some(spec(Some(RIVAL), -15, 4)),
            at(0).checked_sub(micro).unwrap(),
            follow(micro),
        ),
        (
            "other's, clock exactly at expiry: take over",
            Some(spec(Some(RIVAL), -15, 4)),
            at(0),
            Decision::TakeOver(mine(0, 0, 5)),
        ),
        (
            "other's, expired: take over, transitions + 1",
            Some(spec(Some(RIVAL), -20, 4)),
            at(0),
            Decision::TakeOver(mine(0, 0, 5)),
        ),
        ("empty holder: take over at once", Some(spec(Some(""), 0, 4)), at(0), Decision::TakeOver(mine(0, 0, 5))),
        ("no holder (released): take over at once", Some(spec(None, 0, 4)), at(0), Decision::TakeOver(mine(0, 0, 5))),
        ("an empty spec: take over", Some(LeaseSpec::default()), at(0), Decision::TakeOver(mine(0, 0, 1))),
        (
            "other's, no renewTime, acquired recently: follow from acquireTime",
            Some(LeaseSpec { renew_time: None, acquire_time: time(-3), ..spec(Some(RIVAL), 0, 4) }),
            at(0),
            follow(s.retry_every),
        ),
        (
            "other's, no renewTime, acquired long ago: take over",
            Some(LeaseSpec { renew_time: None, ..spec(Some(RIVAL), 0, 4) }),
            at(0),
            Decision::TakeOver(mine(0, 0, 5)),
        ),
        (
            "other's, neither renewTime nor acquireTime: take over",
            Some(LeaseSpec { renew_time: None, acquire_time: None, ..spec(Some(RIVAL), 0, 4) }),
            at(0),
            Decision::TakeOver(mine(0, 0, 5)),
        ),
        (
            "other's, its own 60 s duration wins over ours",
            Some(LeaseSpec { lease_duration_seconds: Some(60), ..spec(Some(RIVAL), -20, 4) }),
            at(0),
            follow(s.retry_every),
        ),
        (
            "other's, no duration: ours (15 s) applies",
            Some(LeaseSpec { lease_duration_seconds: None, ..spec(Some(RIVAL), -20, 4) }),
            at(0),
            Decision::TakeOver(mine(0, 0, 5)),
        ),
        (
            "other's, negative duration: expired",
            Some(LeaseSpec { lease_duration_seconds: Some(-5), ..spec(Some(RIVAL), 0, 4) }),
            at(0),
            Decision::TakeOver(mine(0, 0, 5)),
        ),
        (
            "no leaseTransitions: the first takeover makes it 1",
            Some(LeaseSpec { lease_transitions: None, ..spec(Some(RIVAL), -20, 0) }),
            at(0),
            Decision::TakeOver(mine(0, 0, 1)),
        ),
        (
            "a negative leaseTransitions counts as 0",
            Some(spec(Some(RIVAL), -20, -3)),
            at(0),
            Decision::TakeOver(mine(0, 0, 1)),
        ),
        (
            "leaseTransitions at the maximum stays there",
            Some(spec(None, 0, i32::MAX)),
            at(0),
            Decision::TakeOver(mine(0, 0, i32::MAX)),
        ),
        (
            "other fields (preferredHolder) are kept",
            Some(LeaseSpec { preferred_holder: Some(ME.to_owned()), ..spec(Some(RIVAL), -20, 4) }),
            at(0),
            Decision::TakeOver(LeaseSpec { preferred_holder: Some(ME.to_owned()), ..mine(0, 0, 5) }),
        ),
        (
            "a renewTime in the future (clock skew): follow",
            Some(spec(Some(RIVAL), 30, 4)),
            at(0),
            follow(s.retry_every),
        ),
    ];
    for (name, lease, now, expected) in cases {
        assert_eq!(decide(lease.as_ref(), ME, now, &s), expected, "{name}");
    }
}

#[test]
fn duration_is_whole_seconds_at_least_one() {
    for (duration, seconds) in [(Duration::from_secs(15), 15), (Duration::from_millis(15_900), 15), (Duration::ZERO, 1)]
    {
        let s = LeaseSettings { duration, ..settings() };
        let Decision::Create(spec) = decide(None, ME, at(0), &s) else { panic!("no lease: create") };
        assert_eq!(spec.lease_duration_seconds, Some(seconds), "{duration:?}");
    }
}

#[test]
fn a_released_lease_is_taken_over_at_once() {
    let held = mine(-100, -1, 4);
    let free = released(&held, at(0));
    assert_eq!(free, LeaseSpec { holder_identity: None, lease_duration_seconds: Some(1), renew_time: time(0), ..held });
    let rival = LeaseSettings { identity: RIVAL.to_owned(), ..settings() };
    let Decision::TakeOver(taken) = decide(Some(&free), RIVAL, at(0), &rival) else { panic!("take over") };
    assert_eq!((taken.holder_identity.as_deref(), taken.lease_transitions), (Some(RIVAL), Some(5)));
}

// ---------------------------------------------------------------------------------------------
// The shell against a mock API server

/// The API server's side: each call is checked as it arrives, and answered by hand.
struct ApiServer(Handle<Request<Body>, Response<Body>>);

/// One call as it arrived: method, path, the Lease sent (writes), and where to answer.
struct Call {
    method: Method,
    path: String,
    lease: Option<Lease>,
    reply: SendResponse<Response<Body>>,
}

impl ApiServer {
    async fn next(&mut self) -> Call {
        self.next_call().await.expect("the elector made no call")
    }

    /// The next call; `None` once the client is gone.
    async fn next_call(&mut self) -> Option<Call> {
        let (request, reply) = self.0.next_request().await?;
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let body = request.into_body().collect_bytes().await.expect("request body");
        let lease = (!body.is_empty()).then(|| serde_json::from_slice(&body).expect("a Lease in the body"));
        Some(Call { method, path, lease, reply })
    }

    /// Expects `GET` of the lease.
    async fn get(&mut self) -> SendResponse<Response<Body>> {
        let call = self.next().await;
        assert_eq!((call.method, call.path.as_str()), (Method::GET, ITEM));
        call.reply
    }

    /// Expects `POST` (create) of a lease; returns what was sent.
    async fn create(&mut self) -> (Lease, SendResponse<Response<Body>>) {
        let call = self.next().await;
        assert_eq!((call.method, call.path.as_str()), (Method::POST, COLLECTION));
        (call.lease.expect("a Lease to create"), call.reply)
    }

    /// Expects `PUT` (replace) of the lease; returns what was sent.
    async fn replace(&mut self) -> (Lease, SendResponse<Response<Body>>) {
        let call = self.next().await;
        assert_eq!((call.method, call.path.as_str()), (Method::PUT, ITEM));
        (call.lease.expect("a Lease to replace"), call.reply)
    }
}

fn lease(spec: LeaseSpec, resource_version: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("perennial-operator".into()),
            namespace: Some("perennial-system".into()),
            resource_version: Some(resource_version.into()),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
    }
}

fn ok(lease: &Lease) -> Response<Body> {
    Response::new(Body::from(serde_json::to_vec(lease).unwrap()))
}

fn status(code: u16, reason: &str) -> Response<Body> {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("leases \"perennial-operator\": {reason}"), "reason": reason, "code": code,
    });
    Response::builder().status(code).body(Body::from(serde_json::to_vec(&status).unwrap())).unwrap()
}

/// The spec of what the elector sent, with its resourceVersion.
fn sent(lease: &Lease) -> (LeaseSpec, Option<&str>) {
    (lease.spec.clone().expect("a spec"), lease.metadata.resource_version.as_deref())
}

fn start() -> (Elector, ApiServer, Instant) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let elector = Elector::with_clock(Client::new(service, "default"), settings(), at(0));
    (elector, ApiServer(handle), Instant::now())
}

fn spawn_acquire(elector: Elector) -> JoinHandle<(Elector, Result<(), LeaderError>)> {
    tokio::spawn(async move {
        let result = elector.acquire().await;
        (elector, result)
    })
}

/// Runs `acquire` through a create (no lease yet) answered with resourceVersion "1".
async fn acquired(elector: Elector, server: &mut ApiServer) -> Elector {
    let task = spawn_acquire(elector);
    server.get().await.send_response(status(404, "NotFound"));
    let (created, reply) = server.create().await;
    reply.send_response(ok(&lease(created.spec.clone().unwrap(), "1")));
    let (elector, result) = task.await.unwrap();
    result.expect("acquired");
    elector
}

/// (a) No lease: GET answered 404, POST with me as the holder, and we lead.
#[tokio::test(start_paused = true)]
async fn no_lease_is_created() {
    let (elector, mut server, t0) = start();
    let task = spawn_acquire(elector);
    server.get().await.send_response(status(404, "NotFound"));
    let (created, reply) = server.create().await;
    assert_eq!(sent(&created), (mine(0, 0, 0), None));
    assert_eq!(created.metadata.name.as_deref(), Some("perennial-operator"));
    assert_eq!(created.metadata.namespace.as_deref(), Some("perennial-system"));
    reply.send_response(ok(&lease(mine(0, 0, 0), "1")));
    let (_, result) = task.await.unwrap();
    assert!(result.is_ok());
    assert_eq!(t0.elapsed(), Duration::ZERO);
}

/// A 404 whose body is not a Status (a proxy's page) still means "no lease" (kube 5's
/// `is_not_found` alone would not say so).
#[tokio::test(start_paused = true)]
async fn a_plain_404_means_no_lease() {
    let (elector, mut server, _) = start();
    let task = spawn_acquire(elector);
    let page = Response::builder().status(404).body(Body::from(b"404 page not found".to_vec())).unwrap();
    server.get().await.send_response(page);
    let (created, reply) = server.create().await;
    reply.send_response(ok(&lease(created.spec.unwrap(), "1")));
    assert!(task.await.unwrap().1.is_ok());
}

/// (b) Another replica holds a fresh lease: GETs only, every retry_every (sooner as it runs
/// out), and at its expiry a PUT with the resourceVersion read and leaseTransitions + 1.
#[tokio::test(start_paused = true)]
async fn a_fresh_holder_is_followed_then_taken_over_at_expiry() {
    let (elector, mut server, t0) = start();
    let task = spawn_acquire(elector);
    // Renewed at -10 s for 15 s: runs out at +5 s.
    let rival = lease(spec(Some(RIVAL), -10, 3), "41");
    for secs in [0, 2, 4] {
        server.get().await.send_response(ok(&rival));
        assert_eq!(t0.elapsed(), Duration::from_secs(secs), "a follower's look");
        assert!(!task.is_finished());
    }
    server.get().await.send_response(ok(&rival));
    let (taken, reply) = server.replace().await;
    assert_eq!(t0.elapsed(), Duration::from_secs(5), "the takeover waits out the lease, no longer");
    assert_eq!(sent(&taken), (mine(5, 5, 4), Some("41")));
    reply.send_response(ok(&lease(mine(5, 5, 4), "42")));
    assert!(task.await.unwrap().1.is_ok());
}

/// (c) Two candidates race for an expired lease: our PUT is answered 409, so we do not lead,
/// look again after retry_every and follow the winner.
#[tokio::test(start_paused = true)]
async fn a_lost_race_on_replace_is_not_leadership() {
    let (elector, mut server, t0) = start();
    let task = spawn_acquire(elector);
    server.get().await.send_response(ok(&lease(spec(Some("operator-gone"), -60, 3), "41")));
    let (attempt, reply) = server.replace().await;
    assert_eq!(sent(&attempt), (mine(0, 0, 4), Some("41")));
    reply.send_response(status(409, "Conflict"));
    // The winner's lease, read again after retry_every.
    server.get().await.send_response(ok(&lease(spec(Some(RIVAL), 0, 4), "42")));
    assert_eq!(t0.elapsed(), Duration::from_secs(2));
    // Still following: the next call is another look, not a write.
    server.get().await.send_response(ok(&lease(spec(Some(RIVAL), 0, 4), "42")));
    assert_eq!(t0.elapsed(), Duration::from_secs(4));
    assert!(!task.is_finished(), "acquire must not return after losing the race");
    task.abort();
}

/// The same race on create: the POST is answered 409 AlreadyExists.
#[tokio::test(start_paused = true)]
async fn a_lost_race_on_create_is_not_leadership() {
    let (elector, mut server, t0) = start();
    let task = spawn_acquire(elector);
    server.get().await.send_response(status(404, "NotFound"));
    let (_, reply) = server.create().await;
    reply.send_response(status(409, "AlreadyExists"));
    server.get().await.send_response(ok(&lease(spec(Some(RIVAL), 0, 0), "7")));
    assert_eq!(t0.elapsed(), Duration::from_secs(2));
    server.get().await.send_response(ok(&lease(spec(Some(RIVAL), 0, 0), "7")));
    assert!(!task.is_finished(), "acquire must not return after losing the race");
    task.abort();
}

/// Transient failures (500, a call that never returns) are retried; a refusal (403, no RBAC
/// for leases) is an error naming the lease.
#[tokio::test(start_paused = true)]
async fn acquire_retries_failures_and_stops_on_refusal() {
    let (elector, mut server, t0) = start();
    let task = spawn_acquire(elector);
    server.get().await.send_response(status(500, "InternalError"));
    // At 2 s, never answered: given up at the renew deadline (10 s), when a write that landed
    // would be given up at once anyway.
    let hung = server.get().await;
    assert_eq!(t0.elapsed(), Duration::from_secs(2));
    server.get().await.send_response(status(403, "Forbidden"));
    assert_eq!(t0.elapsed(), Duration::from_secs(14));
    drop(hung);
    let (_, result) = task.await.unwrap();
    let error = result.expect_err("a 403 stops acquire");
    assert!(matches!(&error, LeaderError::Api { lease, .. } if lease == LEASE), "{error:?}");
    assert!(error.to_string().starts_with("lease perennial-system/perennial-operator: "), "{error}");
}

/// (d) Holding: every renew_every a GET, then a PUT with the resourceVersion just read; a GET
/// that shows another holder ends `hold` with Lost.
#[tokio::test(start_paused = true)]
async fn hold_renews_then_sees_another_holder() {
    let (elector, mut server, t0) = start();
    let elector = acquired(elector, &mut server).await;
    let task = tokio::spawn(async move { elector.hold().await });

    server.get().await.send_response(ok(&lease(mine(0, 0, 0), "1")));
    assert_eq!(t0.elapsed(), Duration::from_secs(5));
    let (renewed, reply) = server.replace().await;
    assert_eq!(sent(&renewed), (mine(0, 5, 0), Some("1")), "acquireTime kept, renewTime now");
    reply.send_response(ok(&lease(mine(0, 5, 0), "2")));

    server.get().await.send_response(ok(&lease(mine(0, 5, 0), "2")));
    assert_eq!(t0.elapsed(), Duration::from_secs(10));
    let (renewed, reply) = server.replace().await;
    assert_eq!(sent(&renewed), (mine(0, 10, 0), Some("2")));
    reply.send_response(ok(&lease(mine(0, 10, 0), "3")));

    // Someone else wrote the lease (say an operator edited it by hand).
    server.get().await.send_response(ok(&lease(spec(Some(RIVAL), 14, 1), "4")));
    let lost = task.await.unwrap();
    assert_eq!(t0.elapsed(), Duration::from_secs(15));
    assert!(
        matches!(&lost, LeaderError::Lost { lease, holder } if lease == LEASE && holder.as_deref() == Some(RIVAL)),
        "{lost:?}"
    );
    assert_eq!(lost.to_string(), "lease perennial-system/perennial-operator: leadership lost, now held by operator-1");
}

/// A lease deleted under the leader, or released by someone else: lost, to nobody.
#[tokio::test(start_paused = true)]
async fn hold_loses_a_deleted_or_emptied_lease() {
    for answer in [status(404, "NotFound"), ok(&lease(spec(None, 3, 0), "2"))] {
        let (elector, mut server, _) = start();
        let elector = acquired(elector, &mut server).await;
        let task = tokio::spawn(async move { elector.hold().await });
        server.get().await.send_response(answer);
        let lost = task.await.unwrap();
        assert!(matches!(&lost, LeaderError::Lost { holder: None, .. }), "{lost:?}");
    }
}

/// Renewal failures are retried every retry_every (a 503, a 409 on the write); a success
/// restarts the clock; once no renewal has succeeded for the renew deadline, `hold` gives up at
/// that instant without another call.
#[tokio::test(start_paused = true)]
async fn hold_retries_failed_renewals_until_the_renew_deadline() {
    let (elector, mut server, t0) = start();
    let elector = acquired(elector, &mut server).await;
    let task = tokio::spawn(async move { elector.hold().await });

    server.get().await.send_response(status(503, "ServiceUnavailable"));
    assert_eq!(t0.elapsed(), Duration::from_secs(5));
    server.get().await.send_response(ok(&lease(mine(0, 0, 0), "1")));
    assert_eq!(t0.elapsed(), Duration::from_secs(7));
    let (_, reply) = server.replace().await;
    reply.send_response(status(409, "Conflict"));
    server.get().await.send_response(ok(&lease(mine(0, 0, 0), "1")));
    assert_eq!(t0.elapsed(), Duration::from_secs(9));
    let (renewed, reply) = server.replace().await;
    assert_eq!(sent(&renewed), (mine(0, 9, 0), Some("1")));
    reply.send_response(ok(&lease(mine(0, 9, 0), "2")));

    // Renewed at 9 s: from 14 s every call fails; the last try that fits is at 18 s.
    for secs in [14, 16, 18] {
        server.get().await.send_response(status(500, "InternalError"));
        assert_eq!(t0.elapsed(), Duration::from_secs(secs));
    }
    let lost = task.await.unwrap();
    // Given up 5 s before a standby may take it over at 24 s.
    assert_eq!(t0.elapsed(), Duration::from_secs(19), "9 s + the 10 s renew deadline");
    assert!(matches!(&lost, LeaderError::RenewFailed { lease, .. } if lease == LEASE), "{lost:?}");
    assert!(lost.to_string().contains("not renewed for 10s"), "{lost}");
}

/// A renewal call that hangs does not extend leadership: `hold` gives up at the deadline.
#[tokio::test(start_paused = true)]
async fn hold_gives_up_on_a_hung_renewal_at_the_deadline() {
    let (elector, mut server, t0) = start();
    let elector = acquired(elector, &mut server).await;
    let task = tokio::spawn(async move { elector.hold().await });
    let _hung = server.get().await;
    let lost = task.await.unwrap();
    assert_eq!(t0.elapsed(), Duration::from_secs(10), "the renew deadline, not the lease's end");
    assert!(matches!(&lost, LeaderError::RenewFailed { last_error, .. } if last_error == "timed out"), "{lost:?}");
}

/// Release: the holder writes no holder and a one-second lease, conditional on the
/// resourceVersion; a replica that does not hold the lease writes nothing.
#[tokio::test(start_paused = true)]
async fn release_frees_only_our_own_lease() {
    let (elector, mut server, _) = start();
    let elector = acquired(elector, &mut server).await;
    let task = tokio::spawn(async move {
        elector.release().await;
        elector
    });
    server.get().await.send_response(ok(&lease(mine(0, 0, 2), "5")));
    let (freed, reply) = server.replace().await;
    assert_eq!(sent(&freed), (released(&mine(0, 0, 2), at(0)), Some("5")));
    assert_eq!(freed.spec.as_ref().and_then(|spec| spec.holder_identity.as_deref()), None);
    reply.send_response(ok(&freed));
    let elector = task.await.unwrap();

    let task = tokio::spawn(async move { elector.release().await });
    server.get().await.send_response(ok(&lease(spec(Some(RIVAL), 0, 3), "6")));
    task.await.unwrap();
    assert!(!matches!(server.0.poll_request(), Poll::Ready(Some(_))), "no write after seeing another holder");
}

/// Timings some ten times shorter than a real lease's, for real-time tests: a 3 s lease given up
/// `renew_deadline` after the last renewal, renewed every 200 ms.
fn fast(renew_deadline: Duration) -> LeaseSettings {
    LeaseSettings {
        duration: Duration::from_secs(3),
        renew_deadline,
        renew_every: Duration::from_millis(200),
        retry_every: Duration::from_millis(100),
        ..settings()
    }
}

/// A [`super::LeaseThread`] on `settings` that has taken the Lease (a create), the API server
/// it calls, and the Lease as created.
async fn lease_thread_leading(
    settings: LeaseSettings,
    on_lost: super::OnLost,
) -> (super::LeaseThread, ApiServer, Lease) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let make: super::MakeClient = Box::new(move || Ok(Client::new(service, "default")));
    let mut keeper = super::LeaseThread::start(make, settings, on_lost).expect("the lease's thread");
    let mut server = ApiServer(handle);
    let acquiring = tokio::spawn(async move {
        let taken = keeper.acquire().await;
        (keeper, taken)
    });
    server.get().await.send_response(status(404, "NotFound"));
    let (created, reply) = server.create().await;
    let current = lease(created.spec.clone().expect("a spec"), "1");
    reply.send_response(ok(&current));
    let (keeper, taken) = acquiring.await.expect("join");
    taken.expect("acquired");
    (keeper, server, current)
}

/// Blocks both of the runtime's workers for `busy` (the work run while leading, and a
/// neighbour as busy), the API server meanwhile answering each call with `answer`; returns
/// `lead`'s outcome once the work ended (or the Lease was lost).
async fn lead_while_busy(
    keeper: super::LeaseThread,
    server: &mut ApiServer,
    busy: Duration,
    mut answer: impl FnMut(Call),
) -> Result<(), LeaderError> {
    let neighbour = tokio::spawn(async move { std::thread::sleep(busy) });
    let mut leading = tokio::spawn(keeper.lead(async move { std::thread::sleep(busy) }));
    let outcome = loop {
        tokio::select! {
            biased;
            outcome = &mut leading => break outcome.expect("join"),
            call = server.next_call() => match call {
                Some(call) => answer(call),
                // No more calls: the Lease's thread is done.
                None => break leading.await.expect("join"),
            },
        }
    };
    neighbour.await.expect("join");
    outcome
}

/// The work run while leading keeps both of the runtime's workers busy for three lease
/// durations without a pause (a Controller polling a takeover's burst of reconciles): the Lease,
/// held on a thread of its own with its own client, is renewed all along, and released once the
/// work ends. (Renewed beside the work, or by a task of the same runtime, it was not renewed
/// once.) Real time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_leader_still_renews_its_lease_on_time() {
    let (keeper, mut server, mut current) = lease_thread_leading(fast(Duration::from_secs(2)), Box::new(|_| {})).await;
    let busy = Duration::from_secs(3);
    let started = Instant::now();
    // Each read answered with the lease as last written, each write taken.
    let mut renewals_while_busy = 0;
    let mut released = false;
    let outcome = lead_while_busy(keeper, &mut server, busy, |call| match call.lease {
        None => call.reply.send_response(ok(&current)),
        Some(written) => {
            let version = current.metadata.resource_version.as_deref().unwrap_or("0");
            let next = (version.parse::<u64>().unwrap_or(0) + 1).to_string();
            let spec = written.spec.clone().expect("a spec");
            if spec.holder_identity.as_deref() == Some(ME) && started.elapsed() < busy {
                renewals_while_busy += 1;
            }
            released |= spec.holder_identity.as_deref() != Some(ME);
            current = lease(spec, &next);
            call.reply.send_response(ok(&current));
        }
    })
    .await;
    assert!(outcome.is_ok(), "leadership kept while the work was busy: {outcome:?}");
    assert!(renewals_while_busy >= 5, "renewed every 200 ms while busy, not {renewals_while_busy} times");
    assert!(released, "released once the work ended");
}

/// The Lease cannot be renewed while the work keeps both of the runtime's workers busy: the
/// loss is acted on (the operator exits there) from the Lease's own thread at the renew
/// deadline, before the lease runs out and a standby may take it, not once the busy runtime
/// gets to hear of it. Real time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_acted_on_at_the_renew_deadline_however_busy_the_leader() {
    let lost_at = std::sync::Arc::new(std::sync::Mutex::new(None));
    let record = lost_at.clone();
    let on_lost: super::OnLost = Box::new(move |lost| {
        *record.lock().unwrap() = Some((std::time::Instant::now(), lost.to_string()));
    });
    // A 3 s lease given up 0.6 s after the last renewal.
    let (keeper, mut server, _) = lease_thread_leading(fast(Duration::from_millis(600)), on_lost).await;
    let taken = std::time::Instant::now();
    let _ = lead_while_busy(keeper, &mut server, Duration::from_secs(4), |call| {
        call.reply.send_response(status(500, "InternalError"));
    })
    .await;
    let (at, why) = lost_at.lock().unwrap().clone().expect("the loss acted on");
    let after = at.duration_since(taken);
    // Well before the lease's end at 3 s: at the renew deadline, 0.6 s, and a loaded machine's delay.
    assert!(after < Duration::from_millis(2500), "acted on {after:?} after the Lease was taken: {why}");
    assert!(why.contains("not renewed"), "{why}");
}

/// Stopped while its create of the Lease is in flight (a SIGTERM while waiting to lead): the
/// thread stops taking it and gives back what the create took, so the other replica need not
/// wait the lease out; `stop` returns once it is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_taking_the_lease_gives_back_what_a_write_in_flight_took() {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let make: super::MakeClient = Box::new(move || Ok(Client::new(service, "default")));
    let keeper =
        super::LeaseThread::start(make, fast(Duration::from_secs(2)), Box::new(|_| {})).expect("the lease's thread");
    let mut server = ApiServer(handle);
    server.get().await.send_response(status(404, "NotFound"));
    // The create landed, but its answer is slow to come: the stop does not wait for it.
    let (created, _unanswered) = server.create().await;
    let stopping = tokio::spawn(keeper.stop());
    let landed = lease(created.spec.clone().expect("a spec"), "1");
    let asked_back = tokio::time::timeout(Duration::from_secs(1), server.get()).await;
    asked_back.expect("the Lease read again at once to give it back").send_response(ok(&landed));
    let (freed, reply) = server.replace().await;
    assert_eq!(freed.spec.as_ref().and_then(|spec| spec.holder_identity.as_deref()), None, "given back: {freed:?}");
    assert_eq!(freed.metadata.resource_version.as_deref(), Some("1"), "conditional on the version read");
    reply.send_response(ok(&freed));
    tokio::time::timeout(Duration::from_secs(2), stopping).await.expect("stop returns once given back").expect("join");
}
