//! Where the operator looks: every namespace (one cluster-wide watch per kind), or only the
//! namespaces it is given (`--namespace a,b`). Several namespaces are watched one by one (an
//! install with Roles in those namespaces cannot list cluster-wide) and merged into one stream
//! that reads as a single watch, so that one store and one Controller serve them all.
//!
//! The merge: until every namespace has listed, each namespace's objects are held here; then
//! they go out as one list (`Init`, `InitApply`..., `InitDone`), so the store is complete for
//! all of them at once. After that, changes pass through, and a namespace whose watch lists
//! again (a restarted watch) has its objects applied and the ones it no longer lists deleted,
//! leaving the other namespaces' objects in the store alone.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;

use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt as _};
use k8s_openapi::NamespaceResourceScope;
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// The namespaces watched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace: one watch per kind (a ClusterRole).
    #[default]
    All,
    /// These only, each watched on its own (Roles in each).
    Namespaces(Vec<String>),
}

type Events<K> = BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

impl Scope {
    /// From `--namespace`: names trimmed, blanks and repeats dropped; none left means all.
    pub fn new<S: AsRef<str>>(names: &[S]) -> Scope {
        let mut kept: Vec<String> = Vec::new();
        for name in names.iter().map(|n| n.as_ref().trim()).filter(|n| !n.is_empty()) {
            if !kept.iter().any(|k| k == name) {
                kept.push(name.to_owned());
            }
        }
        if kept.is_empty() { Scope::All } else { Scope::Namespaces(kept) }
    }

    /// For logs: `all`, or the names joined by commas.
    pub fn describe(&self) -> String {
        match self {
            Scope::All => "all".to_owned(),
            Scope::Namespaces(names) => names.join(","),
        }
    }

    /// The keys a resourceVersion is complete per: the one watch's (`""`), or each namespace's.
    pub fn version_keys(&self) -> Vec<String> {
        match self {
            Scope::All => vec![String::new()],
            Scope::Namespaces(names) => names.clone(),
        }
    }

    /// Which of [`Scope::version_keys`] an object's version counts for.
    pub fn version_key<K: Resource>(&self, object: &K) -> String {
        match self {
            Scope::All => String::new(),
            Scope::Namespaces(_) => object.meta().namespace.clone().unwrap_or_default(),
        }
    }

    /// The watch of `K` over this scope, each namespace's retried with backoff on its own.
    /// `store` is the store these events fill (a namespace listed again deletes from it what
    /// it no longer lists).
    pub fn watch<K>(&self, client: &Client, config: watcher::Config, store: Store<K>) -> Events<K>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + Sync
            + 'static,
    {
        let names = match self {
            Scope::All => return watcher(Api::<K>::all(client.clone()), config).default_backoff().boxed(),
            Scope::Namespaces(names) if names.len() == 1 => {
                return watcher(Api::<K>::namespaced(client.clone(), &names[0]), config).default_backoff().boxed();
            }
            Scope::Namespaces(names) => names.clone(),
        };
        let watches = names.iter().enumerate().map(|(index, namespace)| {
            let api = Api::<K>::namespaced(client.clone(), namespace);
            watcher(api, config.clone()).default_backoff().map_ok(move |event| (index, event)).boxed()
        });
        let watches: Vec<_> = watches.collect();
        let mut merge = Merge::new(names);
        stream::select_all(watches)
            .flat_map(move |event| {
                let out = match event {
                    Ok((index, event)) => merge.on(index, event, |namespace| in_namespace(&store, namespace)),
                    Err(err) => vec![Err(err)],
                };
                stream::iter(out)
            })
            .boxed()
    }
}

fn in_namespace<K: Resource<DynamicType = ()> + Clone>(store: &Store<K>, namespace: &str) -> Vec<K> {
    store.state().iter().filter(|o| o.meta().namespace.as_deref() == Some(namespace)).map(|o| (**o).clone()).collect()
}

/// The merge of several namespaces' watches into one (see the module's comment).
pub struct Merge<K> {
    namespaces: Vec<String>,
    /// Before every namespace has listed: each one's objects by name, and whether it listed.
    held: Option<Vec<(HashMap<String, K>, bool)>>,
    /// After: the names a namespace listing again has listed so far.
    relisting: Vec<Option<HashSet<String>>>,
}

impl<K: Resource + Clone> Merge<K> {
    pub fn new(namespaces: Vec<String>) -> Merge<K> {
        let count = namespaces.len();
        let held = Some((0..count).map(|_| (HashMap::new(), false)).collect());
        Merge { namespaces, held, relisting: vec![None; count] }
    }

    /// What namespace `index`'s `event` turns into; `stored(namespace)`: that namespace's
    /// objects in the store now.
    pub fn on(
        &mut self,
        index: usize,
        event: watcher::Event<K>,
        stored: impl FnOnce(&str) -> Vec<K>,
    ) -> Vec<Result<watcher::Event<K>, watcher::Error>> {
        use watcher::Event::*;
        if let Some(held) = &mut self.held {
            let Some((objects, listed)) = held.get_mut(index) else { return Vec::new() };
            match event {
                Init => objects.clear(),
                InitApply(object) | Apply(object) => {
                    objects.insert(object.name_any(), object);
                }
                Delete(object) => {
                    objects.remove(&object.name_any());
                }
                InitDone => *listed = true,
            }
            if !held.iter().all(|(_, listed)| *listed) {
                return Vec::new();
            }
            // Every namespace listed: one list of them all.
            let held = self.held.take().unwrap_or_default();
            let objects = held.into_iter().flat_map(|(objects, _)| objects.into_values());
            let mut out = vec![Ok(Init)];
            out.extend(objects.map(|object| Ok(InitApply(object))));
            out.push(Ok(InitDone));
            return out;
        }
        let Some(relisting) = self.relisting.get_mut(index) else { return Vec::new() };
        match event {
            Init => {
                *relisting = Some(HashSet::new());
                Vec::new()
            }
            InitApply(object) => {
                relisting.get_or_insert_with(HashSet::new).insert(object.name_any());
                vec![Ok(Apply(object))]
            }
            InitDone => {
                let listed = relisting.take().unwrap_or_default();
                let gone = stored(&self.namespaces[index]).into_iter().filter(|o| !listed.contains(&o.name_any()));
                gone.map(|object| Ok(Delete(object))).collect()
            }
            other => vec![Ok(other)],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use watcher::Event::*;

    fn object(namespace: &str, name: &str) -> ConfigMap {
        let metadata = serde_json::json!({"name": name, "namespace": namespace});
        serde_json::from_value(serde_json::json!({ "metadata": metadata })).expect("a ConfigMap")
    }

    /// Each output event as `kind namespace/name`.
    fn said(events: Vec<Result<watcher::Event<ConfigMap>, watcher::Error>>) -> Vec<String> {
        let key = |o: &ConfigMap| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any());
        events
            .into_iter()
            .map(|event| match event.expect("no error") {
                Init => "Init".to_owned(),
                InitDone => "InitDone".to_owned(),
                InitApply(o) => format!("InitApply {}", key(&o)),
                Apply(o) => format!("Apply {}", key(&o)),
                Delete(o) => format!("Delete {}", key(&o)),
            })
            .collect()
    }

    #[test]
    fn blanks_and_repeats_are_dropped_and_none_left_is_every_namespace() {
        assert_eq!(Scope::new(&["a", " b", "", "a"]), Scope::Namespaces(vec!["a".into(), "b".into()]));
        assert_eq!(Scope::new::<&str>(&[]), Scope::All);
        assert_eq!(Scope::new(&[" "]), Scope::All);
        assert_eq!(Scope::new(&["a", "b"]).describe(), "a,b");
    }

    #[test]
    fn the_store_gets_one_list_once_every_namespace_has_listed() {
        let mut merge = Merge::new(vec!["a".into(), "b".into()]);
        let none = |_: &str| Vec::new();
        assert!(said(merge.on(0, Init, none)).is_empty());
        assert!(said(merge.on(0, InitApply(object("a", "1")), none)).is_empty());
        assert!(said(merge.on(0, InitDone, none)).is_empty(), "b has not listed yet");
        // Changes in a listed namespace meanwhile are held with its list.
        assert!(said(merge.on(0, Apply(object("a", "2")), none)).is_empty());
        assert!(said(merge.on(0, Delete(object("a", "1")), none)).is_empty());
        assert!(said(merge.on(1, Init, none)).is_empty());
        assert!(said(merge.on(1, InitApply(object("b", "3")), none)).is_empty());
        let mut listed = said(merge.on(1, InitDone, none));
        listed[1..3].sort();
        assert_eq!(listed, ["Init", "InitApply a/2", "InitApply b/3", "InitDone"]);
        // Then changes pass through.
        assert_eq!(said(merge.on(1, Apply(object("b", "4")), none)), ["Apply b/4"]);
        assert_eq!(said(merge.on(0, Delete(object("a", "2")), none)), ["Delete a/2"]);
    }

    #[test]
    fn a_namespace_listed_again_deletes_only_its_own_objects_it_no_longer_lists() {
        let mut merge = Merge::new(vec!["a".into(), "b".into()]);
        for index in [0, 1] {
            merge.on(index, Init, |_| Vec::new());
            merge.on(index, InitDone, |_| Vec::new());
        }
        assert!(said(merge.on(0, Init, |_| Vec::new())).is_empty(), "nothing reset");
        assert_eq!(said(merge.on(0, InitApply(object("a", "kept")), |_| Vec::new())), ["Apply a/kept"]);
        let stored = |namespace: &str| {
            assert_eq!(namespace, "a", "only the namespace listed again is looked at");
            vec![object("a", "kept"), object("a", "gone")]
        };
        assert_eq!(said(merge.on(0, InitDone, stored)), ["Delete a/gone"]);
    }
}
