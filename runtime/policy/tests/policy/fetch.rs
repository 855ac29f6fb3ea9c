//! Fetching plugins through OpenDAL from a real S3 protocol server on 127.0.0.1.

use std::sync::Arc;

use crate::support::s3::S3Server;
use perennial_policy::{PolicyError, PolicyHost, PolicyRef, Step, TracingEvents, TriggerKind, TriggerStats, builtin};
use perennial_storage::S3Credentials;
use sha2::Digest as _;

fn events() -> Arc<TracingEvents> {
    Arc::new(TracingEvents { job: "fetch-test".into() })
}

fn trigger_ref(plugin: &str, sha256: Option<String>) -> PolicyRef {
    let mut reference =
        PolicyRef::new(plugin).with_config(serde_json::json!({"condition": {"operator": ">=", "threshold": 3}}));
    reference.sha256 = sha256;
    reference
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_is_fetched_from_s3_and_its_digest_checked() {
    let server = S3Server::start().await;
    let bytes = builtin::component("threshold-trigger").unwrap();
    server.put("policies", "triggers/threshold.wasm", bytes);
    let digest = hex::encode(sha2::Sha256::digest(bytes));
    let host = PolicyHost::new(None, Some(server.credentials())).unwrap();

    let policy = host
        .load::<TriggerKind>(&trigger_ref("s3://policies/triggers/threshold.wasm", Some(digest.clone())), events())
        .await
        .unwrap();
    assert_eq!(policy.info().digest, digest);
    assert!(policy.decide(&TriggerStats { pending_train: 3, ..TriggerStats::default() }).unwrap().train);

    // Another object under the same digest claim is refused at `verify`.
    server.put("policies", "triggers/other.wasm", builtin::component("first-select").unwrap());
    let err = host
        .load::<TriggerKind>(&trigger_ref("s3://policies/triggers/other.wasm", Some(digest.clone())), events())
        .await
        .err()
        .unwrap();
    assert_eq!(err.step, Step::Verify);

    // A missing object, and wrong credentials, fail at `fetch` and name the URL.
    let missing = host
        .load::<TriggerKind>(&trigger_ref("s3://policies/nope.wasm", Some(digest.clone())), events())
        .await
        .err()
        .unwrap();
    assert_eq!(missing.step, Step::Fetch);
    assert!(missing.to_string().contains("s3://policies/nope.wasm"), "{missing}");

    let wrong = S3Credentials { secret_access_key: "not-the-secret-7f3a".into(), ..server.credentials() };
    let denied = PolicyHost::new(None, Some(wrong))
        .unwrap()
        .load::<TriggerKind>(&trigger_ref("s3://policies/triggers/threshold.wasm", Some(digest)), events())
        .await
        .err()
        .unwrap();
    assert_eq!(denied.step, Step::Fetch);
    assert!(!denied.to_string().contains("not-the-secret-7f3a"), "the secret is not in the message: {denied}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_plugin_without_credentials_or_digest_is_refused() {
    let host = PolicyHost::new(None, None).unwrap();
    let no_digest = host.load::<TriggerKind>(&trigger_ref("s3://policies/x.wasm", None), events()).await.err().unwrap();
    assert_eq!(no_digest.step, Step::Reference);
    assert!(matches!(no_digest.error, PolicyError::Reference(ref m) if m.starts_with("sha256: required")));

    let no_creds = host
        .load::<TriggerKind>(&trigger_ref("s3://policies/x.wasm", Some("ab".repeat(32))), events())
        .await
        .err()
        .unwrap();
    assert_eq!(no_creds.step, Step::Fetch);
    assert!(no_creds.to_string().contains("S3 needs credentials"), "{no_creds}");
}
