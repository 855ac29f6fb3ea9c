//! The operator's Prometheus metrics and its `/metrics`, `/healthz` and `/readyz` endpoints.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::client::ApiHealth;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// What failed: `patch_status`, `create_pod`, `delete_pods`, `read_job`, `read_pods`, `read_dataset`,
    /// `publish_event`, `events_dropped`...
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub stage: String,
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// `refused` (a bad token) or `throttled` (dropped on accept: its source failed too often).
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    /// `train`, `eval` or `inference`.
    pub worker: String,
}

/// The counters, shared by every reconcile.
pub struct Metrics {
    pub reconciles: Counter,
    pub errors: Family<ErrorLabels, Counter>,
    pub transitions: Family<TransitionLabels, Counter>,
    pub pods_created: Family<PodLabels, Counter>,
    pub link_refusals: Family<RefusalLabels, Counter>,
    /// Status writes kept until the job watch shows them ([`crate::written::WrittenJobs`]): a
    /// few while jobs change, none once the operator idles.
    pub written_jobs_kept: Gauge,
    /// Events queued and not yet published ([`crate::events::Events`]).
    pub events_queued: Gauge,
    registry: Registry,
    /// Set once the controller runs (the leader) or waits as a standby: the process is healthy.
    healthy: AtomicBool,
    /// Doing its part, leader or standby (a standby's pod no longer has the leader's label): a
    /// Deployment of two replicas rolls out, and a rolling update goes on.
    ready: AtomicBool,
    /// The leader, serving (its edge link open): `/leaderz`, for a load balancer outside
    /// Kubernetes (in it, the Service selects the leader's pod by its label).
    serving: AtomicBool,
    /// What the API server's answers say of the operator's credentials.
    api: Arc<ApiHealth>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("perennial_operator");
        let reconciles = Counter::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let transitions = Family::<TransitionLabels, Counter>::default();
        let pods_created = Family::<PodLabels, Counter>::default();
        let link_refusals = Family::<RefusalLabels, Counter>::default();
        let written_jobs_kept = Gauge::default();
        let events_queued = Gauge::default();
        registry.register("reconciles", "Reconciles of LifelongLearningJobs", reconciles.clone());
        registry.register("errors", "Errors by kind", errors.clone());
        registry.register("stage_transitions", "Stage transitions (conditions written)", transitions.clone());
        registry.register("pods_created", "Worker pods created", pods_created.clone());
        registry.register(
            "link_refusals",
            "Edge link connections refused (a bad token) or throttled (their source failed too often)",
            link_refusals.clone(),
        );
        registry.register(
            "written_jobs_kept",
            "Job status writes kept until the job watch shows them",
            written_jobs_kept.clone(),
        );
        registry.register("events_queued", "Events queued, not yet published", events_queued.clone());
        Metrics {
            reconciles,
            errors,
            transitions,
            pods_created,
            link_refusals,
            written_jobs_kept,
            events_queued,
            registry,
            healthy: AtomicBool::new(true),
            ready: AtomicBool::new(false),
            serving: AtomicBool::new(false),
            api: Arc::default(),
        }
    }
}

impl Metrics {
    /// Metrics whose health includes what `api` sees of the client's calls.
    pub fn with_api(api: Arc<ApiHealth>) -> Metrics {
        let mut metrics = Metrics::default();
        metrics.registry.register(
            "api_requests",
            "Requests sent to the API server, by verb and resource",
            api.requests.counts.clone(),
        );
        Metrics { api, ..metrics }
    }

    pub fn link_refusal(&self, outcome: &str) {
        self.link_refusals.get_or_create(&RefusalLabels { outcome: outcome.into() }).inc();
    }

    pub fn error(&self, kind: &str) {
        self.errors.get_or_create(&ErrorLabels { kind: kind.into() }).inc();
    }

    pub fn transition(&self, stage: &str, phase: &str) {
        self.transitions.get_or_create(&TransitionLabels { stage: stage.into(), phase: phase.into() }).inc();
    }

    pub fn pod_created(&self, worker: &str) {
        self.pods_created.get_or_create(&PodLabels { worker: worker.into() }).inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Relaxed);
    }
}

/// `/metrics`, `/healthz` (alive), `/readyz` (doing its part: leader or standby) and `/leaderz`
/// (the leader, serving).
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(render))
        .route("/healthz", get(health))
        .route("/readyz", get(readiness))
        .route("/leaderz", get(leadership))
        .with_state(metrics)
}

async fn readiness(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    if metrics.api.refused() {
        (StatusCode::SERVICE_UNAVAILABLE, "the API server refuses the operator's credentials (401)\n")
    } else if metrics.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}

async fn leadership(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    if metrics.serving.load(Ordering::Relaxed) && !metrics.api.refused() {
        (StatusCode::OK, "leader\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not the serving leader\n")
    }
}

async fn render(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], metrics.render())
}

async fn health(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    if metrics.api.refused_too_long() {
        (StatusCode::SERVICE_UNAVAILABLE, "the API server has refused the operator's credentials for a minute\n")
    } else if metrics.healthy.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unhealthy\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_replica_is_ready_and_only_the_serving_leader_leads() {
        let metrics = Arc::new(Metrics::default());
        let alive = || async { health(State(metrics.clone())).await.into_response().status() };
        let ready = || async { readiness(State(metrics.clone())).await.into_response().status() };
        let leads = || async { leadership(State(metrics.clone())).await.into_response().status() };
        assert_eq!(alive().await, StatusCode::OK, "a starting replica is alive");
        assert_eq!(ready().await, StatusCode::SERVICE_UNAVAILABLE, "not ready before it stood down");
        metrics.set_ready(true);
        assert_eq!(ready().await, StatusCode::OK, "a standby is ready");
        assert_eq!(leads().await, StatusCode::SERVICE_UNAVAILABLE, "a standby does not lead");
        metrics.set_serving(true);
        assert_eq!(leads().await, StatusCode::OK);
    }

    #[tokio::test]
    async fn refused_credentials_are_not_ready_and_not_alive_after_a_minute() {
        let api = Arc::new(ApiHealth::default());
        let metrics = Arc::new(Metrics::with_api(api.clone()));
        metrics.set_ready(true);
        metrics.set_serving(true);
        let ready = || async { readiness(State(metrics.clone())).await.into_response().status() };
        let leads = || async { leadership(State(metrics.clone())).await.into_response().status() };
        api.answered(401);
        assert_eq!(ready().await, StatusCode::SERVICE_UNAVAILABLE, "every call refused: not ready");
        assert_eq!(leads().await, StatusCode::SERVICE_UNAVAILABLE);
        api.answered(200);
        assert_eq!(ready().await, StatusCode::OK, "accepted again");
    }

    #[test]
    fn counters_render_as_prometheus_text() {
        let api = Arc::new(ApiHealth::default());
        api.requests.sent(&http::Method::POST, "/api/v1/namespaces/ml/pods", None);
        let metrics = Metrics::with_api(api);
        metrics.reconciles.inc();
        metrics.error("create_pod");
        metrics.transition("Train", "Starting");
        metrics.pod_created("train");
        let text = metrics.render();
        for line in [
            "perennial_operator_reconciles_total 1",
            "perennial_operator_errors_total{kind=\"create_pod\"} 1",
            "perennial_operator_stage_transitions_total{stage=\"Train\",phase=\"Starting\"} 1",
            "perennial_operator_pods_created_total{worker=\"train\"} 1",
            "perennial_operator_api_requests_total{verb=\"create\",resource=\"pods\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
