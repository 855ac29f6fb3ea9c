//! Status patches (pure): the JSON merge patch (RFC 7386) from the status read to the status
//! the stage machine made, with the resourceVersion read as a precondition. A concurrent writer
//! makes the API server answer 409 Conflict; the reconciler then reads the job again and steps
//! from what is there, so nothing another writer added is overwritten (Sedna replaces the whole
//! status from a stale cache and loses edge-reported conditions).

use serde_json::{Map, Value, json};

/// The merge patch that turns `old` into `new`: changed members only, removed members `null`,
/// arrays whole (a merge patch cannot edit an array in place).
pub fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = Map::new();
            for (key, value) in new {
                match old.get(key) {
                    Some(before) => {
                        if let Some(change) = merge_diff(before, value) {
                            patch.insert(key.clone(), change);
                        }
                    }
                    None => {
                        patch.insert(key.clone(), value.clone());
                    }
                }
            }
            for key in old.keys().filter(|key| !new.contains_key(*key)) {
                patch.insert(key.clone(), Value::Null);
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        // `null` in a merge patch means "remove": a member that became null is removed.
        _ if old == new => None,
        _ => Some(new.clone()),
    }
}

/// The body of a status patch: the status's changes, under the resourceVersion it was made from.
/// `None` when nothing changed.
pub fn status_patch(resource_version: &str, old: &Value, new: &Value) -> Option<Value> {
    let status = merge_diff(old, new)?;
    Some(json!({"metadata": {"resourceVersion": resource_version}, "status": status}))
}

/// Applies a merge patch (RFC 7386), to check patches against what they were made from.
pub fn merge_apply(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_apply(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_changed_and_removals_as_null() {
        let old = json!({"stage": "Train", "phase": "Waiting", "round": 1, "policies": {"trigger": {"digest": "a"}, "splitter": {"digest": "b"}}, "conditions": [1, 2]});
        let new = json!({"stage": "Train", "phase": "Ready", "round": 1, "policies": {"trigger": {"digest": "c"}}, "conditions": [1, 2, 3]});
        assert_eq!(
            merge_diff(&old, &new),
            Some(
                json!({"phase": "Ready", "policies": {"trigger": {"digest": "c"}, "splitter": null}, "conditions": [1, 2, 3]})
            )
        );
        assert_eq!(merge_diff(&old, &old), None);
        assert_eq!(merge_diff(&json!(null), &json!({"a": 1})), Some(json!({"a": 1})));
    }

    #[test]
    fn a_patch_applied_to_its_source_gives_the_target() {
        let cases = [
            (json!({}), json!({"stage": "Train", "conditions": [{"type": "Waiting"}]})),
            (json!({"a": {"b": 1, "c": [1]}, "d": 2}), json!({"a": {"c": [2]}, "e": {"f": "g"}})),
            (json!({"a": 1}), json!({})),
            (json!({"a": {"b": 1}}), json!({"a": 3})),
        ];
        for (old, new) in cases {
            let mut applied = old.clone();
            if let Some(patch) = merge_diff(&old, &new) {
                merge_apply(&mut applied, &patch);
            }
            assert_eq!(applied, new, "{old} -> {new}");
        }
    }

    #[test]
    fn the_patch_carries_the_resource_version_it_was_made_from() {
        let patch = status_patch("42", &json!({"round": 1}), &json!({"round": 2})).expect("a change");
        assert_eq!(patch, json!({"metadata": {"resourceVersion": "42"}, "status": {"round": 2}}));
        assert_eq!(status_patch("42", &json!({"round": 1}), &json!({"round": 1})), None);
    }
}
