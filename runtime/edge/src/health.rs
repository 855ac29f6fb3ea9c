//! Each policy's health as the edge sees it: whether its last call failed and why (the job then
//! fell back to the built-in rule, or holds). Kept in the edge's state so that the control
//! plane can show it in the job's status.

use rusqlite::{OptionalExtension, params};

use crate::sqlite::Store;
use perennial_types::{PolicyHealth, PolicyStatus};

/// A policy's health: `None` when serving, the failure otherwise; after a hot swap, the plugin
/// and digest serving; a rejected swap, with why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    pub job: String,
    pub kind: String,
    pub failure: Option<String>,
    pub plugin: Option<String>,
    pub digest: Option<String>,
    pub rejected: Option<String>,
}

/// Records the outcome of a call of the job's `kind` policy; writes only when it changes.
pub fn record(store: &mut Store, job: &str, kind: &str, failure: Option<&str>, now: u64) -> rusqlite::Result<()> {
    let known: Option<(bool, Option<String>)> = store
        .conn()
        .query_row("SELECT failing, message FROM policy_health WHERE job = ?1 AND kind = ?2", params![job, kind], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    let now_state = (failure.is_some(), failure.map(str::to_owned));
    if known.as_ref() == Some(&now_state) || (known.is_none() && failure.is_none()) {
        return Ok(());
    }
    store.conn().execute(
        "INSERT INTO policy_health (job, kind, failing, message, since) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (job, kind) DO UPDATE SET failing = excluded.failing, message = excluded.message,
         since = excluded.since",
        params![job, kind, now_state.0, now_state.1, now as i64],
    )?;
    Ok(())
}

/// Records that `plugin` (`digest`) now serves the job's `kind` decision (a hot swap), with a
/// clean bill of health.
pub fn swapped(store: &mut Store, job: &str, kind: &str, plugin: &str, digest: &str, now: u64) -> rusqlite::Result<()> {
    store.conn().execute(
        "INSERT INTO policy_health (job, kind, failing, message, since, plugin, digest, rejected)
         VALUES (?1, ?2, 0, NULL, ?3, ?4, ?5, NULL)
         ON CONFLICT (job, kind) DO UPDATE SET failing = 0, message = NULL, since = excluded.since,
         plugin = excluded.plugin, digest = excluded.digest, rejected = NULL",
        params![job, kind, now as i64, plugin, digest],
    )?;
    Ok(())
}

/// Records a policy that was not swapped in, and why (the previous one serves on).
pub fn rejected(store: &mut Store, job: &str, kind: &str, reason: &str, now: u64) -> rusqlite::Result<()> {
    store.conn().execute(
        "INSERT INTO policy_health (job, kind, failing, message, since, rejected) VALUES (?1, ?2, 0, NULL, ?3, ?4)
         ON CONFLICT (job, kind) DO UPDATE SET rejected = excluded.rejected",
        params![job, kind, now as i64, reason],
    )?;
    Ok(())
}

/// Folds a recorded health into the job's status entry for its kind (plugin and digest after a
/// swap, the rejection or the failure as the message). Both control planes show it so.
pub fn apply_to(policies: &mut std::collections::BTreeMap<String, PolicyStatus>, found: &Health) {
    let policy = policies.entry(found.kind.clone()).or_default();
    if let (Some(plugin), Some(digest)) = (&found.plugin, &found.digest) {
        (policy.plugin, policy.digest) = (plugin.clone(), digest.clone());
    }
    (policy.health, policy.message) = match (&found.rejected, &found.failure) {
        (Some(why), _) => (PolicyHealth::LoadFailed, Some(format!("rejected {why}; the previous one serves"))),
        (None, Some(why)) => (PolicyHealth::Failing, Some(why.clone())),
        (None, None) => (PolicyHealth::Serving, None),
    };
}

/// Every recorded health.
pub fn all(store: &Store) -> rusqlite::Result<Vec<Health>> {
    let mut statement = store.conn().prepare(
        "SELECT job, kind, failing, message, plugin, digest, rejected FROM policy_health ORDER BY job, kind",
    )?;
    let rows = statement.query_map([], |r| {
        let failing: bool = r.get(2)?;
        let message: Option<String> = r.get(3)?;
        Ok(Health {
            job: r.get(0)?,
            kind: r.get(1)?,
            failure: failing.then(|| message.unwrap_or_default()),
            plugin: r.get(4)?,
            digest: r.get(5)?,
            rejected: r.get(6)?,
        })
    })?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_and_the_recovery_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("edge.db")).unwrap();
        record(&mut store, "default/a", "trigger", None, 1).unwrap();
        assert!(all(&store).unwrap().is_empty(), "serving needs no row");
        record(&mut store, "default/a", "trigger", Some("timed out after 100 ms"), 2).unwrap();
        let failing = Health {
            job: "default/a".into(),
            kind: "trigger".into(),
            failure: Some("timed out after 100 ms".into()),
            ..Health::default()
        };
        assert_eq!(all(&store).unwrap(), [failing]);
        record(&mut store, "default/a", "trigger", None, 3).unwrap();
        assert_eq!(all(&store).unwrap()[0].failure, None);
    }
}
