//! Events on the jobs, published off the reconcile path. A reconcile queues its events and goes
//! on; one task publishes them in the order they were queued. An Event is for people (`kubectl
//! describe`), never what the operator decides from, so a stage's next pod need not wait for the
//! Events of the last one: with 100 jobs in a round, these were about 16 of the 57 requests a
//! job's round waited for. A full queue (the API server refusing or far behind) drops the event,
//! counted; a failure to publish is said when it starts and when it ends, with its count.
//!
//! A warning goes through kube's `Recorder`, which folds one said again on the unchanged job
//! into a series. A round's events (Normal) are each new, and are created as they are: the
//! `Recorder` would keep each in its series cache for 6 minutes (about 3 a job-round: a fleet's
//! rounds of 6 minutes held in memory, for nothing).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

use super::metrics::Metrics;

/// Events waiting to be published at most; past it, new ones are dropped (counted).
const QUEUE: usize = 10_000;
/// Events allow 1 kB of note.
const NOTE_MAX: usize = 1000;

/// The queue of events to publish.
#[derive(Clone)]
pub struct Events {
    queue: mpsc::Sender<(ObjectReference, Event)>,
    metrics: Arc<Metrics>,
}

impl Events {
    /// Starts the task that publishes as `reporter` (on the current tokio runtime).
    pub fn start(client: kube::Client, reporter: Reporter, metrics: Arc<Metrics>) -> Self {
        let (queue, queued) = mpsc::channel(QUEUE);
        let publisher = Publisher { recorder: Recorder::new(client.clone(), reporter.clone()), client, reporter };
        tokio::spawn(publish_all(publisher, queued, metrics.clone()));
        Events { queue, metrics }
    }

    /// Queues an event on `reference`; never waits. `action` says what it is about (`Round3Train`):
    /// Kubernetes folds the events of one object with the same reason and action into one series
    /// that shows only its first note, so each round and stage gets series of its own.
    pub fn publish(&self, reference: &ObjectReference, warning: bool, reason: &str, action: String, note: String) {
        let event = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.to_owned(),
            note: Some(truncate(note, NOTE_MAX)),
            action,
            secondary: None,
        };
        // Counted before it is sent: the publisher may take it and count it off first.
        self.metrics.events_queued.inc();
        if self.queue.try_send((reference.clone(), event)).is_err() {
            self.metrics.events_queued.dec();
            self.metrics.error("events_dropped");
        }
    }
}

struct Publisher {
    /// Warnings, folded into series.
    recorder: Recorder,
    client: kube::Client,
    reporter: Reporter,
}

impl Publisher {
    async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        match event.type_ {
            EventType::Warning => self.recorder.publish(event, regarding).await,
            EventType::Normal => {
                let namespace = regarding.namespace.as_deref().unwrap_or("default");
                let created = normal_event(&self.reporter, event, regarding, Timestamp::now());
                Api::<K8sEvent>::namespaced(self.client.clone(), namespace)
                    .create(&PostParams::default(), &created)
                    .await
                    .map(drop)
            }
        }
    }
}

/// A Normal event as kube's `Recorder` makes a new one (named after the object and the time).
fn normal_event(reporter: &Reporter, event: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
    let named_after = regarding.name.as_deref().unwrap_or(&reporter.controller);
    K8sEvent {
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        note: event.note.clone(),
        metadata: ObjectMeta {
            namespace: regarding.namespace.clone(),
            name: Some(format!("{named_after}.{:x}", now.as_nanosecond())),
            ..ObjectMeta::default()
        },
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(reporter.instance.clone().unwrap_or_else(|| reporter.controller.clone())),
        related: event.secondary.clone(),
        type_: Some("Normal".into()),
        ..K8sEvent::default()
    }
}

async fn publish_all(
    publisher: Publisher,
    mut queued: mpsc::Receiver<(ObjectReference, Event)>,
    metrics: Arc<Metrics>,
) {
    let mut failing: u64 = 0;
    while let Some((reference, event)) = queued.recv().await {
        let published = publisher.publish(&event, &reference).await;
        metrics.events_queued.dec();
        match published {
            Ok(()) if failing > 0 => {
                tracing::info!("publishing events works again after failing {failing} times");
                failing = 0;
            }
            Ok(()) => {}
            Err(err) => {
                metrics.error("publish_event");
                if failing == 0 {
                    tracing::warn!(reason = event.reason, "publishing an event: {err} (said again when it works)");
                }
                failing += 1;
            }
        }
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rounds_event_says_what_the_recorder_would() {
        let reporter = Reporter { controller: "perennial-operator".into(), instance: Some("op-1".into()) };
        let event = Event {
            type_: EventType::Normal,
            reason: "TrainReady".into(),
            note: Some("round 3".into()),
            action: "Round3Train".into(),
            secondary: None,
        };
        let regarding =
            ObjectReference { namespace: Some("ml".into()), name: Some("job".into()), ..ObjectReference::default() };
        let now = Timestamp::from_second(1_700_000_000).expect("a time");
        let made = normal_event(&reporter, &event, &regarding, now);
        assert_eq!(made.metadata.name.as_deref(), Some(format!("job.{:x}", now.as_nanosecond()).as_str()));
        assert_eq!(made.metadata.namespace.as_deref(), Some("ml"));
        assert_eq!((made.reason.as_deref(), made.action.as_deref()), (Some("TrainReady"), Some("Round3Train")));
        assert_eq!((made.type_.as_deref(), made.note.as_deref()), (Some("Normal"), Some("round 3")));
        assert_eq!(made.reporting_instance.as_deref(), Some("op-1"));
        assert_eq!(made.regarding, Some(regarding));
        assert!(made.series.is_none() && made.event_time.is_some());
    }

    #[test]
    fn a_long_note_is_cut_on_a_character_boundary() {
        assert_eq!(truncate("é".repeat(600), NOTE_MAX).len(), NOTE_MAX);
        assert_eq!(truncate("ab".into(), 1), "a");
        assert_eq!(truncate("aé".into(), 2), "a");
    }
}
