//! Unauthenticated link connections are not amplified (issue #35): a source that keeps failing
//! is throttled on accept (no TLS, no TokenReview), the same bad token is not reviewed twice in a
//! row, the refusals are counted in the operator's metrics and summed up in its log, not a line
//! each.

use std::time::Duration;

use crate::harness::{operator_counter, until};
use crate::stack::World;

/// The operator's counter of link refusals with `outcome`, from its `/metrics`.
async fn refusals(metrics_port: u16, outcome: &str) -> u64 {
    operator_counter(metrics_port, &format!("perennial_operator_link_refusals_total{{outcome=\"{outcome}\"}}")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bad_tokens_costs_a_few_reviews_and_no_log_line_each() {
    let world = World::new("flood").await;
    let operator = world.start_operator("replica-a");
    until("the link open", Duration::from_secs(60), || async {
        let ready = reqwest::get(format!("http://127.0.0.1:{}/leaderz", operator.metrics_port)).await.ok()?;
        ready.status().is_success().then_some(())
    })
    .await;
    let ca = std::fs::read(world.root.path().join("ca.pem")).expect("ca");
    let tls = perennial_link::socket::client_tls(&ca).expect("tls");
    let url = format!("wss://localhost:{}/v1/link", operator.link_port);
    const ATTEMPTS: u64 = 200;
    let flooding = std::time::Instant::now();
    for n in 0..ATTEMPTS {
        // A token the API server cannot review (not a ServiceAccount's), a new one each time.
        let token = format!("eyJhbGciOiJSUzI1NiJ9.bogus-{n}.sig");
        let hello = perennial_link::hello("node-x", 0, None);
        let refused = tokio::time::timeout(
            Duration::from_secs(5),
            perennial_link::socket::connect(&url, None, &token, tls.clone(), &hello),
        )
        .await;
        assert!(!matches!(refused, Ok(Ok(_))), "a bogus token opened the link");
    }
    let (refused, throttled) =
        (refusals(operator.metrics_port, "refused").await, refusals(operator.metrics_port, "throttled").await);
    assert_eq!(refused + throttled, ATTEMPTS, "each attempt counted once");
    // A throttled source still gets one connection a second through (its good nodes reconnect).
    let probes = flooding.elapsed().as_secs_f64() / perennial_link::refusals::PROBE_EVERY.as_secs_f64();
    assert!(
        refused <= u64::from(perennial_link::refusals::MAX_FAILURES) + probes.ceil() as u64 + 1,
        "{refused} refused after review in {:?}: the source was not throttled",
        flooding.elapsed()
    );
    let log = operator.process.log_text();
    let lines = log.lines().filter(|l| l.contains("link connections refused")).count();
    assert!((1..=2).contains(&lines), "{lines} log lines for {ATTEMPTS} refusals:\n{log}");
    let said_each = log.lines().filter(|l| !l.contains("DEBUG") && l.contains("link refused")).count();
    assert_eq!(said_each, 0, "a line per refusal:\n{log}");
    assert!(log.contains("last: the token is not valid for the cluster"), "the reason is said:\n{log}");
}
