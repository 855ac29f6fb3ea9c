//! What the cluster bench and the fleet simulator read of the processes they measure: a
//! process's CPU seconds and RSS (`/proc`), the load average, the API server's
//! `apiserver_request_total` (its `/metrics`), the operator's own request counts, and the CPU of
//! kube-apiserver and etcd (their pid files in the `up` state directory).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

/// utime + stime of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / per_second)
}

/// VmRSS of a process, in MiB (NaN if it cannot be read).
pub fn rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// RssAnon of a process, in MiB: the memory it holds, without the pages of its files (its
/// program's code, read in as it first runs each part) that VmRSS also counts.
#[allow(dead_code)]
pub fn rss_anon_mib(pid: u32) -> f64 {
    status_mib(pid, "RssAnon:")
}

fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// CPU seconds used so far by kube-apiserver and etcd, if their pid files are in `state`.
pub fn control_plane_cpu(state: &Path) -> Option<(f64, f64)> {
    let of = |file: &str| {
        let pid = std::fs::read_to_string(state.join(file)).ok()?;
        cpu_seconds(pid.trim().parse().ok()?)
    };
    Some((of("kube-apiserver.pid")?, of("etcd.pid")?))
}

/// `apiserver_request_total` by "VERB resource[/subresource]".
pub async fn apiserver_requests(client: &kube::Client) -> BTreeMap<String, f64> {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
    let text = tokio::time::timeout(Duration::from_secs(30), client.request_text(request))
        .await
        .expect("GET /metrics in time")
        .expect("GET /metrics");
    let mut counts = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let labels = parse_labels(labels);
        let get = |key: &str| labels.get(key).map(String::as_str).unwrap_or_default();
        let resource = match get("subresource") {
            "" => get("resource").to_owned(),
            sub => format!("{}/{sub}", get("resource")),
        };
        let key = format!("{} {}", get("verb"), if resource.is_empty() { "(non-resource)" } else { &resource });
        *counts.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    counts
}

/// The operator's `perennial_operator_api_requests_total`, by "verb resource".
pub async fn operator_requests(http: &reqwest::Client, metrics_port: u16) -> BTreeMap<String, f64> {
    let url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let text = match http.get(&url).timeout(Duration::from_secs(10)).send().await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let mut counts = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("perennial_operator_api_requests_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let labels = parse_labels(labels);
        let get = |key: &str| labels.get(key).map(String::as_str).unwrap_or_default().to_owned();
        *counts.entry(format!("{} {}", get("verb"), get("resource"))).or_insert(0.0) +=
            value.parse::<f64>().unwrap_or(0.0);
    }
    counts
}

/// One unlabelled metric of the operator on `metrics_port` (`None`: not read).
#[allow(dead_code)] // the fleet's, not the cluster bench's
pub async fn operator_metric(http: &reqwest::Client, metrics_port: u16, name: &str) -> Option<f64> {
    let url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let text = http.get(&url).timeout(Duration::from_secs(10)).send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `a - b`, key by key, keeping what grew.
pub fn grown(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    a.iter().map(|(k, v)| (k.clone(), v - b.get(k).copied().unwrap_or(0.0))).filter(|(_, v)| *v > 0.0).collect()
}

/// A Prometheus sample's labels.
pub fn parse_labels(text: &str) -> HashMap<String, String> {
    let inner = text.split_once('{').map_or("", |(_, rest)| rest.trim_end_matches('}'));
    let mut labels = HashMap::new();
    let mut rest = inner;
    while let Some((key, after)) = rest.split_once("=\"") {
        let Some(end) = after.find('"') else { break };
        labels.insert(key.trim_start_matches(',').to_owned(), after[..end].to_owned());
        rest = &after[end + 1..];
    }
    labels
}
