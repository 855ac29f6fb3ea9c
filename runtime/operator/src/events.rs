//! Events on the jobs, published off the reconcile path. A reconcile queues its events and goes
//! on; one task publishes them in the order they were queued. An Event is for people (`kubectl
//! describe`), never what the operator decides from, so a stage's next pod need not wait for the
//! Events of the last one: with 100 jobs in a round, these were about 16 of the 57 requests a
//! job's round waited for. A full queue (the API server refusing or far behind) drops the event,
//! counted; a failure to publish is said when it starts and when it ends, with its count.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
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
    /// Starts the task that publishes with `recorder` (on the current tokio runtime).
    pub fn start(recorder: Recorder, metrics: Arc<Metrics>) -> Self {
        let (queue, queued) = mpsc::channel(QUEUE);
        tokio::spawn(publish_all(recorder, queued, metrics.clone()));
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
        if self.queue.try_send((reference.clone(), event)).is_err() {
            self.metrics.error("events_dropped");
        }
    }
}

async fn publish_all(recorder: Recorder, mut queued: mpsc::Receiver<(ObjectReference, Event)>, metrics: Arc<Metrics>) {
    let mut failing: u64 = 0;
    while let Some((reference, event)) = queued.recv().await {
        match recorder.publish(&event, &reference).await {
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
    fn a_long_note_is_cut_on_a_character_boundary() {
        assert_eq!(truncate("é".repeat(600), NOTE_MAX).len(), NOTE_MAX);
        assert_eq!(truncate("ab".into(), 1), "a");
        assert_eq!(truncate("aé".into(), 2), "a");
    }
}
