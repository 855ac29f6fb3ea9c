//! A container's `readinessProbe`, run against a local process as the kubelet runs it: an
//! `exec` command (ready on exit 0), an `httpGet` (ready on a status from 200 to 399) or a
//! `tcpSocket` (ready when it accepts), first after `initialDelaySeconds`, then every
//! `periodSeconds`, each attempt cut at `timeoutSeconds`; `successThreshold` successes in a row
//! make the process ready. A container without a probe is ready once its process runs, as on
//! Kubernetes.
//!
//! One difference, said in the README: without `periodSeconds` a probe is repeated every 100 ms
//! here, not every 10 s (nothing else runs on this machine's loopback to spare).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The period when the probe gives none.
pub const DEFAULT_PERIOD: Duration = Duration::from_millis(100);
/// The kubelet's default time limit of one attempt.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// The most an HTTP probe reads of the answer: its status line is all that counts.
const MAX_ANSWER: u64 = 4096;

/// What a probe checks.
#[derive(Clone, Debug, PartialEq)]
pub enum Check {
    /// Runs the command (in the process's folder, with its env); ready on exit 0.
    Exec(Vec<String>),
    /// `GET path` on host:port; ready on 200-399.
    Http { host: String, port: u16, path: String },
    /// Ready when host:port accepts a connection.
    Tcp { host: String, port: u16 },
}

/// A readiness probe, read from a container.
#[derive(Clone, Debug, PartialEq)]
pub struct Readiness {
    pub check: Check,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
}

/// The container's readiness probe, if it has one; the error names the field.
pub fn readiness(container: &Container, field: &str) -> Result<Option<Readiness>, String> {
    let Some(probe) = &container.readiness_probe else { return Ok(None) };
    let field = format!("{field}.readinessProbe");
    let check = check(probe, container, &field)?;
    let seconds = |value: Option<i32>, name: &str, default: Duration| match value {
        None => Ok(default),
        Some(n) if n >= 0 => Ok(Duration::from_secs(n as u64)),
        Some(n) => Err(format!("{field}.{name}: {n} is negative")),
    };
    Ok(Some(Readiness {
        check,
        initial_delay: seconds(probe.initial_delay_seconds, "initialDelaySeconds", Duration::ZERO)?,
        period: seconds(probe.period_seconds, "periodSeconds", DEFAULT_PERIOD)?.max(Duration::from_millis(10)),
        timeout: seconds(probe.timeout_seconds, "timeoutSeconds", DEFAULT_TIMEOUT)?.max(Duration::from_millis(10)),
        success_threshold: probe.success_threshold.unwrap_or(1).max(1) as u32,
    }))
}

fn check(probe: &Probe, container: &Container, field: &str) -> Result<Check, String> {
    let port = |port: &IntOrString, at: &str| -> Result<u16, String> {
        match port {
            IntOrString::Int(n) => u16::try_from(*n).ok().filter(|n| *n > 0),
            IntOrString::String(name) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok()),
        }
        .ok_or_else(|| format!("{field}.{at}.port: {port:?} is not a port number or a named container port"))
    };
    let host = |host: &Option<String>| host.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| "127.0.0.1".into());
    match (&probe.exec, &probe.http_get, &probe.tcp_socket, &probe.grpc) {
        (Some(exec), None, None, None) => match exec.command.clone().unwrap_or_default() {
            command if command.is_empty() => Err(format!("{field}.exec.command: empty")),
            command => Ok(Check::Exec(command)),
        },
        (None, Some(http), None, None) => {
            if http.scheme.as_deref().is_some_and(|s| !s.eq_ignore_ascii_case("http")) {
                return Err(format!("{field}.httpGet.scheme: only HTTP is probed in embedded mode"));
            }
            let path = http.path.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| "/".into());
            Ok(Check::Http { host: host(&http.host), port: port(&http.port, "httpGet")?, path })
        }
        (None, None, Some(tcp), None) => Ok(Check::Tcp { host: host(&tcp.host), port: port(&tcp.port, "tcpSocket")? }),
        (None, None, None, Some(_)) => {
            Err(format!("{field}.grpc: not available in embedded mode; use exec or httpGet"))
        }
        _ => Err(format!("{field}: give exactly one of exec, httpGet and tcpSocket")),
    }
}

/// A probe's progress on one running process.
#[derive(Debug)]
pub struct ProbeState {
    readiness: Readiness,
    next_at: Instant,
    successes: u32,
    attempt: Option<Receiver<bool>>,
    ready: bool,
}

impl ProbeState {
    /// A fresh state for a process started at `started` (and at each restart).
    pub fn new(readiness: Readiness, started: Instant) -> ProbeState {
        let next_at = started + readiness.initial_delay;
        ProbeState { readiness, next_at, successes: 0, attempt: None, ready: false }
    }

    pub fn ready(&self) -> bool {
        self.ready
    }

    /// Takes a finished attempt's answer and starts the next attempt when due, on a thread of
    /// its own (an attempt may take up to its timeout). Returns whether readiness changed.
    pub fn poll(&mut self, cwd: &Path, env: &[(String, String)]) -> bool {
        let before = self.ready;
        if let Some(attempt) = &self.attempt {
            match attempt.try_recv() {
                Ok(success) => {
                    self.attempt = None;
                    self.successes = if success { self.successes + 1 } else { 0 };
                    self.ready = self.successes >= self.readiness.success_threshold;
                }
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => self.attempt = None,
            }
        }
        if !self.ready && self.attempt.is_none() && Instant::now() >= self.next_at {
            self.next_at = Instant::now() + self.readiness.period;
            let (answer, attempt) = mpsc::channel();
            let (check, timeout) = (self.readiness.check.clone(), self.readiness.timeout);
            let (cwd, env) = (cwd.to_owned(), env.to_vec());
            let spawned = std::thread::Builder::new().name("readiness-probe".into()).spawn(move || {
                let _ = answer.send(attempt_once(&check, timeout, &cwd, &env));
            });
            if spawned.is_ok() {
                self.attempt = Some(attempt);
            }
        }
        self.ready != before
    }
}

/// One attempt of `check`, within `timeout`.
pub fn attempt_once(check: &Check, timeout: Duration, cwd: &Path, env: &[(String, String)]) -> bool {
    match check {
        Check::Exec(command) => exec(command, timeout, cwd, env),
        Check::Http { host, port, path } => http(host, *port, path, timeout),
        Check::Tcp { host, port } => {
            address(host, *port).is_some_and(|a| TcpStream::connect_timeout(&a, timeout).is_ok())
        }
    }
}

fn exec(command: &[String], timeout: Duration, cwd: &Path, env: &[(String, String)]) -> bool {
    let Some((program, args)) = command.split_first() else { return false };
    let mut run = Command::new(program);
    run.args(args).current_dir(cwd).envs(env.iter().cloned());
    let Ok(mut child) = run.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn() else {
        return false;
    };
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.success(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}

fn http(host: &str, port: u16, path: &str, timeout: Duration) -> bool {
    let Some(address) = address(host, port) else { return false };
    let Ok(mut stream) = TcpStream::connect_timeout(&address, timeout) else { return false };
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    let request = format!("GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nUser-Agent: perennial-probe\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = stream.take(MAX_ANSWER).read_to_end(&mut answer);
    let head = String::from_utf8_lossy(&answer);
    let code = head.lines().next().and_then(|line| line.split_whitespace().nth(1)).and_then(|c| c.parse::<u16>().ok());
    code.is_some_and(|code| (200..400).contains(&code))
}

fn address(host: &str, port: u16) -> Option<SocketAddr> {
    (host, port).to_socket_addrs().ok()?.next()
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use serde_json::json;

    use super::*;

    fn container(probe: serde_json::Value) -> Container {
        serde_json::from_value(json!({"name": "w", "ports": [{"name": "serve", "containerPort": 8080}],
            "readinessProbe": probe}))
        .expect("a container")
    }

    #[test]
    fn probes_are_read_as_the_kubelet_reads_them() {
        let read = |probe| readiness(&container(probe), "spec.deploySpec.template.spec.containers[0]");
        let http =
            read(json!({"httpGet": {"path": "/healthz", "port": "serve"}, "periodSeconds": 2})).unwrap().unwrap();
        assert_eq!(http.check, Check::Http { host: "127.0.0.1".into(), port: 8080, path: "/healthz".into() });
        assert_eq!((http.period, http.timeout, http.success_threshold), (Duration::from_secs(2), DEFAULT_TIMEOUT, 1));
        let exec = read(json!({"exec": {"command": ["test", "-f", "ready"]}})).unwrap().unwrap();
        assert_eq!(exec.check, Check::Exec(vec!["test".into(), "-f".into(), "ready".into()]));
        assert_eq!(exec.period, DEFAULT_PERIOD);
        let tcp = read(json!({"tcpSocket": {"port": 9000}, "initialDelaySeconds": 1})).unwrap().unwrap();
        assert_eq!(
            (tcp.check, tcp.initial_delay),
            (Check::Tcp { host: "127.0.0.1".into(), port: 9000 }, Duration::from_secs(1))
        );
        assert_eq!(readiness(&serde_json::from_value(json!({"name": "w"})).unwrap(), "c").unwrap(), None);

        for (probe, says) in [
            (json!({"httpGet": {"port": "nope"}}), "readinessProbe.httpGet.port"),
            (json!({"httpGet": {"port": 80, "scheme": "HTTPS"}}), "readinessProbe.httpGet.scheme"),
            (json!({"exec": {"command": []}}), "readinessProbe.exec.command: empty"),
            (json!({"grpc": {"port": 9000}}), "readinessProbe.grpc"),
            (json!({}), "exactly one of exec, httpGet and tcpSocket"),
            (json!({"exec": {"command": ["true"]}, "periodSeconds": -1}), "readinessProbe.periodSeconds: -1"),
        ] {
            let err = read(probe.clone()).expect_err("refused");
            assert!(err.contains(says) && err.starts_with("spec.deploySpec"), "{probe}: {err}");
        }
    }

    #[test]
    fn an_attempt_succeeds_only_on_what_the_kubelet_takes_for_ready() {
        let dir = tempfile::tempdir().unwrap();
        let second = Duration::from_secs(1);
        let exec = |command: &[&str]| {
            attempt_once(&Check::Exec(command.iter().map(|s| s.to_string()).collect()), second, dir.path(), &[])
        };
        assert!(exec(&["true"]));
        assert!(!exec(&["false"]));
        assert!(!exec(&["/nonexistent/probe"]));
        assert!(!attempt_once(
            &Check::Exec(vec!["sleep".into(), "5".into()]),
            Duration::from_millis(50),
            dir.path(),
            &[]
        ));

        // An HTTP server answering each connection with the next status.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            for code in [200, 302, 503] {
                let (mut stream, _) = listener.accept().unwrap();
                let mut request = [0u8; 512];
                let _ = stream.read(&mut request);
                let _ = write!(stream, "HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n");
            }
        });
        let http = Check::Http { host: "127.0.0.1".into(), port, path: "/ready".into() };
        assert!(attempt_once(&http, second, dir.path(), &[]), "200 is ready");
        assert!(attempt_once(&http, second, dir.path(), &[]), "302 is ready");
        assert!(!attempt_once(&http, second, dir.path(), &[]), "503 is not");
        server.join().unwrap();
        assert!(!attempt_once(&Check::Tcp { host: "127.0.0.1".into(), port }, second, dir.path(), &[]), "closed");
    }

    #[test]
    fn a_process_is_ready_after_its_threshold_of_successes_and_not_before_its_delay() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ready");
        let readiness = Readiness {
            check: Check::Exec(vec!["test".into(), "-f".into(), marker.display().to_string()]),
            initial_delay: Duration::ZERO,
            period: Duration::from_millis(10),
            timeout: Duration::from_secs(1),
            success_threshold: 2,
        };
        let mut state = ProbeState::new(readiness, Instant::now());
        // Polls for `within`; whether it became ready.
        let poll_for = |state: &mut ProbeState, within: Duration| {
            let until = Instant::now() + within;
            while Instant::now() < until && !state.ready() {
                state.poll(dir.path(), &[]);
                std::thread::sleep(Duration::from_millis(5));
            }
            state.ready()
        };
        assert!(!poll_for(&mut state, Duration::from_millis(300)), "no marker: never ready");
        std::fs::write(&marker, "").unwrap();
        assert!(poll_for(&mut state, Duration::from_secs(5)), "then two successes in a row: ready");
        assert!(state.successes >= 2);

        let late =
            Readiness { initial_delay: Duration::from_secs(60), success_threshold: 1, ..state.readiness.clone() };
        let mut late = ProbeState::new(late, Instant::now());
        assert!(!poll_for(&mut late, Duration::from_millis(100)), "not probed before initialDelaySeconds");
    }
}
