//! The operator's own calls to the API server, counted by verb and resource as the API server
//! counts them (`apiserver_request_total`): what a round costs the cluster, read on the
//! operator's `/metrics` without the API server's (which count every client's calls).

use http::Method;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The API server's verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`.
    pub verb: String,
    /// `pods`, `lifelonglearningjobs/status`, `events`...
    pub resource: String,
}

/// The counters (`perennial_operator_api_requests_total`).
#[derive(Clone, Debug, Default)]
pub struct ApiRequests {
    pub counts: Family<RequestLabels, Counter>,
}

impl ApiRequests {
    /// Counts one request the client sends.
    pub fn sent(&self, method: &Method, path: &str, query: Option<&str>) {
        let (verb, resource) = classify(method, path, query);
        self.counts.get_or_create(&RequestLabels { verb: verb.into(), resource }).inc();
    }
}

/// (verb, resource[/subresource]) of a request, as the API server names them; a path outside the
/// resource API (`/version`, `/apis`) is `(non-resource)`.
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => &[][..],
    };
    // namespaces/NS/RESOURCE...; `namespaces` and `namespaces/NS` are the namespaces themselves.
    let rest = match rest {
        ["namespaces", _namespace, resource, more @ ..] => {
            let mut all = vec![*resource];
            all.extend_from_slice(more);
            all
        }
        other => other.to_vec(),
    };
    let (resource, named) = match rest.as_slice() {
        // Named as the API server's `get` of it.
        [] => ("(non-resource)".to_owned(), true),
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, subresource, ..] => (format!("{resource}/{subresource}"), true),
    };
    let watching =
        query.is_some_and(|q| q.split('&').any(|pair| matches!(pair, "watch=true" | "watch=1" | "watch=True")));
    let verb = match *method {
        Method::GET if watching => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_named_as_the_api_server_names_them() {
        let cases = [
            (
                Method::PATCH,
                "/apis/sedna.io/v1alpha1/namespaces/ml/lifelonglearningjobs/j/status",
                None,
                "patch",
                "lifelonglearningjobs/status",
            ),
            (
                Method::GET,
                "/apis/sedna.io/v1alpha1/namespaces/ml/lifelonglearningjobs/j",
                None,
                "get",
                "lifelonglearningjobs",
            ),
            (Method::POST, "/api/v1/namespaces/ml/pods", None, "create", "pods"),
            (Method::DELETE, "/api/v1/namespaces/ml/pods", Some("labelSelector=a%3Db"), "deletecollection", "pods"),
            (Method::DELETE, "/api/v1/namespaces/ml/pods/p", None, "delete", "pods"),
            (Method::GET, "/api/v1/pods", Some("labelSelector=x&watch=true&resourceVersion=5"), "watch", "pods"),
            (Method::GET, "/api/v1/pods", Some("labelSelector=x"), "list", "pods"),
            (Method::POST, "/apis/events.k8s.io/v1/namespaces/ml/events", None, "create", "events"),
            (Method::PUT, "/apis/coordination.k8s.io/v1/namespaces/s/leases/l", None, "update", "leases"),
            (Method::GET, "/api/v1/namespaces/ml", None, "get", "namespaces"),
            (Method::GET, "/version", None, "get", "(non-resource)"),
        ];
        for (method, path, query, verb, resource) in cases {
            assert_eq!(classify(&method, path, query), (verb, resource.to_owned()), "{method} {path}");
        }
    }
}
