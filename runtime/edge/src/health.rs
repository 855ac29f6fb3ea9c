//! Each policy's health as the edge sees it: whether its last call failed and why (the job then
//! fell back to the built-in rule, or holds). Kept in the edge's state so that the control
//! plane can show it in the job's status.

use rusqlite::{OptionalExtension, params};

use crate::sqlite::Store;
use perennial_types::{PolicyDecision, PolicyHealth};

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
    /// The serving policy's config, as [`perennial_types::config_digest`] shows it.
    pub config: Option<String>,
    /// Its last decision that acted: the answer, the policy's reason, when (unix seconds).
    pub decision: Option<(String, String, u64)>,
    /// The shadow beside it, and its record.
    pub shadow: Option<perennial_types::ShadowStatus>,
    /// A policy being loaded to replace it: plugin, digest (empty until known), since (unix s).
    pub loading: Option<(String, String, u64)>,
}

/// Records the outcome of a call of the job's `kind` policy; writes only when it changes.
pub fn record(store: &mut Store, job: &str, kind: &str, failure: Option<&str>, now: u64) -> rusqlite::Result<()> {
    let known: Option<(bool, Option<String>)> = store
        .conn()
        .prepare_cached("SELECT failing, message FROM policy_health WHERE job = ?1 AND kind = ?2")?
        .query_row(params![job, kind], |r| Ok((r.get(0)?, r.get(1)?)))
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

/// What serves a job's decision: the plugin, the component's digest, the config's short digest.
#[derive(Clone, Copy, Debug)]
pub struct Serving<'a> {
    pub plugin: &'a str,
    pub digest: &'a str,
    pub config: &'a str,
}

/// Records that `serving` now serves the job's `kind` decision (at start, or after a hot swap),
/// with a clean bill of health; a last decision of another plugin is forgotten.
pub fn swapped(store: &mut Store, job: &str, kind: &str, serving: Serving<'_>, now: u64) -> rusqlite::Result<()> {
    store.conn().execute(
        "INSERT INTO policy_health (job, kind, failing, message, since, plugin, digest, rejected, config)
         VALUES (?1, ?2, 0, NULL, ?3, ?4, ?5, NULL, ?6)
         ON CONFLICT (job, kind) DO UPDATE SET failing = 0, message = NULL, since = excluded.since,
         plugin = excluded.plugin, digest = excluded.digest, rejected = NULL, config = excluded.config,
         loading = NULL, loading_digest = NULL, loading_since = NULL,
         decision = CASE WHEN policy_health.plugin IS excluded.plugin THEN policy_health.decision END,
         reason = CASE WHEN policy_health.plugin IS excluded.plugin THEN policy_health.reason END,
         decided_at = CASE WHEN policy_health.plugin IS excluded.plugin THEN policy_health.decided_at END",
        params![job, kind, now as i64, serving.plugin, serving.digest, serving.config],
    )?;
    Ok(())
}

/// Forgets what was recorded of the job's `kind` policy (it has none now).
pub fn forget(store: &mut Store, job: &str, kind: &str) -> rusqlite::Result<()> {
    store.conn().execute("DELETE FROM policy_health WHERE job = ?1 AND kind = ?2", params![job, kind])?;
    Ok(())
}

/// Records a decision of the job's `kind` policy that acted (`train`, `deploy`, `keep`) with its
/// reason, in the transaction that acts on it.
pub fn decided(
    tx: &rusqlite::Transaction<'_>,
    job: &str,
    kind: &str,
    answer: &str,
    reason: &str,
    now: u64,
) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO policy_health (job, kind, failing, since, decision, reason, decided_at)
         VALUES (?1, ?2, 0, ?5, ?3, ?4, ?5)
         ON CONFLICT (job, kind) DO UPDATE SET decision = excluded.decision, reason = excluded.reason,
         decided_at = excluded.decided_at",
        params![job, kind, answer, reason, now as i64],
    )?;
    Ok(())
}

/// Records a policy that was not swapped in, and why (the previous one serves on).
pub fn rejected(store: &mut Store, job: &str, kind: &str, reason: &str, now: u64) -> rusqlite::Result<()> {
    store.conn().execute(
        "INSERT INTO policy_health (job, kind, failing, message, since, rejected) VALUES (?1, ?2, 0, NULL, ?3, ?4)
         ON CONFLICT (job, kind) DO UPDATE SET rejected = excluded.rejected,
         loading = NULL, loading_digest = NULL, loading_since = NULL",
        params![job, kind, now as i64, reason],
    )?;
    Ok(())
}

/// Records that `plugin` is being loaded to replace the job's `kind` policy (its digest once
/// known: said again then, since kept), until [`swapped`] or [`rejected`] ends it.
pub fn loading(store: &mut Store, job: &str, kind: &str, plugin: &str, digest: &str, now: u64) -> rusqlite::Result<()> {
    store.conn().execute(
        "INSERT INTO policy_health (job, kind, failing, since, loading, loading_digest, loading_since)
         VALUES (?1, ?2, 0, ?5, ?3, ?4, ?5)
         ON CONFLICT (job, kind) DO UPDATE SET loading = excluded.loading, loading_digest = excluded.loading_digest,
         loading_since = CASE WHEN policy_health.loading IS excluded.loading
             THEN COALESCE(policy_health.loading_since, excluded.loading_since) ELSE excluded.loading_since END",
        params![job, kind, plugin, digest, now as i64],
    )?;
    Ok(())
}

/// Ends whatever the job's status still shows loading: called when a swap commits, which is the
/// newest one asked for, so no load of the job is under way. A kind the swap did not load (an edit
/// reverted before the commit) or a file reloaded with the same content would otherwise show
/// "loading" for ever.
pub fn loads_ended(store: &mut Store, job: &str) -> rusqlite::Result<()> {
    store.conn().execute(
        "UPDATE policy_health SET loading = NULL, loading_digest = NULL, loading_since = NULL
         WHERE job = ?1 AND loading IS NOT NULL",
        params![job],
    )?;
    Ok(())
}

/// Forgets every load under way: at the agent's start, none is.
pub fn clear_loading(store: &mut Store) -> rusqlite::Result<()> {
    store.conn().execute(
        "UPDATE policy_health SET loading = NULL, loading_digest = NULL, loading_since = NULL WHERE loading IS NOT NULL",
        [],
    )?;
    Ok(())
}

/// Records a policy of a job that could not start (nothing of it serves yet), and why: its
/// status names the plugin and the reason.
pub fn not_started(
    store: &mut Store,
    job: &str,
    kind: &str,
    plugin: &str,
    reason: &str,
    now: u64,
) -> rusqlite::Result<()> {
    store.conn().execute(
        "INSERT INTO policy_health (job, kind, failing, message, since, plugin, rejected) VALUES (?1, ?2, 0, NULL, ?3, ?4, ?5)
         ON CONFLICT (job, kind) DO UPDATE SET rejected = excluded.rejected,
         plugin = COALESCE(policy_health.plugin, excluded.plugin),
         loading = NULL, loading_digest = NULL, loading_since = NULL",
        params![job, kind, now as i64, plugin, reason],
    )?;
    Ok(())
}

/// Forgets the job's rejected policies: its manifest as now accepted is what serves or is being
/// swapped in.
pub fn clear_rejected(store: &mut Store, job: &str) -> rusqlite::Result<()> {
    store.conn().execute("UPDATE policy_health SET rejected = NULL WHERE job = ?1", [job])?;
    Ok(())
}

/// Folds a recorded health into the job's status entry for its kind (plugin and digest after a
/// swap, the rejection or the failure as the message). Both control planes show it so.
pub fn apply_to(policies: &mut perennial_types::PolicyStatuses, found: &Health) {
    let policy = policies.entry(found.kind.clone()).or_default();
    if let Some(plugin) = &found.plugin {
        policy.plugin = perennial_types::policy::shown_plugin(plugin).into_owned();
    }
    if let Some(digest) = &found.digest {
        policy.digest = digest.clone();
    }
    if let Some(config) = &found.config {
        policy.config = config.clone();
    }
    if let Some((answer, reason, at)) = &found.decision {
        let time = jiff::Timestamp::from_second(*at as i64).map(|t| t.to_string()).unwrap_or_default();
        policy.last_decision = Some(PolicyDecision { answer: answer.clone(), reason: reason.clone(), time });
    }
    if found.shadow.is_some() {
        policy.shadow = found.shadow.clone();
    }
    policy.loading = found.loading.as_ref().map(|(plugin, digest, since)| perennial_types::PolicyLoading {
        plugin: perennial_types::policy::shown_plugin(plugin).into_owned(),
        digest: digest.clone(),
        since: jiff::Timestamp::from_second(*since as i64).map(|t| t.to_string()).unwrap_or_default(),
    });
    (policy.health, policy.message) = match (&found.rejected, &found.failure) {
        // Nothing loaded yet (a job that could not start): nothing serves instead.
        (Some(why), _) if found.digest.is_none() => {
            (PolicyHealth::LoadFailed, Some(format!("not loaded: {why}; the job waits for it")))
        }
        (Some(why), _) => (PolicyHealth::LoadFailed, Some(format!("rejected {why}; the previous one serves"))),
        (None, Some(why)) => (PolicyHealth::Failing, Some(why.clone())),
        (None, None) => (PolicyHealth::Serving, None),
    };
}

/// A job's policies as its status shows them: `policies` with the job's recorded healths folded
/// in, and without the kinds that have no plugin (Sedna's split, computed natively).
pub fn apply_job(policies: &mut perennial_types::PolicyStatuses, healths: &[Health], job: &str) {
    // The edge's record holds every shadow there is: one no longer in it was removed (or
    // promoted), and its line goes at once.
    for policy in policies.values_mut() {
        policy.shadow = None;
    }
    for found in healths.iter().filter(|found| found.job == job) {
        apply_to(policies, found);
    }
    policies.retain(|_, policy| !policy.plugin.is_empty());
}

/// Every recorded health.
pub fn all(store: &Store) -> rusqlite::Result<Vec<Health>> {
    let mut statement = store.conn().prepare(
        "SELECT job, kind, failing, message, plugin, digest, rejected, config, decision, reason, decided_at,
         loading, loading_digest, loading_since
         FROM policy_health ORDER BY job, kind",
    )?;
    let rows = statement.query_map([], |r| {
        let failing: bool = r.get(2)?;
        let message: Option<String> = r.get(3)?;
        let decision: Option<String> = r.get(8)?;
        let reason: Option<String> = r.get(9)?;
        let at: Option<i64> = r.get(10)?;
        let loading: Option<String> = r.get(11)?;
        let loading_digest: Option<String> = r.get(12)?;
        let loading_since: Option<i64> = r.get(13)?;
        Ok(Health {
            job: r.get(0)?,
            kind: r.get(1)?,
            failure: failing.then(|| message.unwrap_or_default()),
            plugin: r.get(4)?,
            digest: r.get(5)?,
            rejected: r.get(6)?,
            config: r.get(7)?,
            decision: decision.map(|answer| (answer, reason.unwrap_or_default(), at.unwrap_or(0).max(0) as u64)),
            shadow: None,
            loading: loading
                .map(|plugin| (plugin, loading_digest.unwrap_or_default(), loading_since.unwrap_or(0).max(0) as u64)),
        })
    })?;
    let mut healths: Vec<Health> = rows.collect::<rusqlite::Result<_>>()?;
    for (job, kind, shadow) in crate::shadow::all(store.conn())? {
        match healths.iter_mut().find(|h| h.job == job && h.kind == kind) {
            Some(health) => health.shadow = Some(shadow),
            None => healths.push(Health { job, kind, shadow: Some(shadow), ..Health::default() }),
        }
    }
    Ok(healths)
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
