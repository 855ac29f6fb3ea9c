//! A real OCI registry (Debian's `docker-registry`, the CNCF distribution) on 127.0.0.1, started
//! by the tests: filesystem storage in a temporary folder, anonymous or behind htpasswd. A
//! missing binary fails the test: scripts/test installs it.
#![allow(dead_code)]

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `PERENNIAL_TEST_REGISTRY`, else Debian's path.
fn binary() -> PathBuf {
    let path = std::env::var_os("PERENNIAL_TEST_REGISTRY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/docker-registry"));
    assert!(
        path.is_file(),
        "no OCI registry at {}: `apt-get install docker-registry` (scripts/test does), or set PERENNIAL_TEST_REGISTRY",
        path.display()
    );
    path
}

pub struct Registry {
    /// `127.0.0.1:PORT`.
    pub address: String,
    /// `user`, `password` when private.
    pub login: Option<(String, String)>,
    root: tempfile::TempDir,
    child: Option<Child>,
}

impl Registry {
    /// Anyone may push and pull.
    pub fn start() -> Registry {
        Registry::start_with(None)
    }

    /// Only `user` with `password` may push or pull (htpasswd, bcrypt).
    pub fn start_private(user: &str, password: &str) -> Registry {
        Registry::start_with(Some((user.to_owned(), password.to_owned())))
    }

    fn start_with(login: Option<(String, String)>) -> Registry {
        let root = tempfile::tempdir().expect("a temp dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let address = format!("127.0.0.1:{port}");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {address}\n",
            root.path().join("data").display()
        );
        if let Some((user, password)) = &login {
            let htpasswd = htpasswd(user, password);
            let file = root.path().join("htpasswd");
            std::fs::write(&file, htpasswd).unwrap();
            config.push_str(&format!("auth:\n  htpasswd:\n    realm: perennial-test\n    path: {}\n", file.display()));
        }
        std::fs::write(root.path().join("config.yml"), config).unwrap();
        let mut registry = Registry { address, login, root, child: None };
        registry.resume();
        registry
    }

    /// Starts (again, after [`Registry::stop`]) on the same port and storage.
    pub fn resume(&mut self) {
        let log = std::fs::File::create(self.root.path().join("registry.log")).unwrap();
        let child = dies_with_its_test(&mut Command::new(binary()))
            .arg("serve")
            .arg(self.root.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&self.address).is_err() {
            assert!(Instant::now() < deadline, "the registry did not listen on {}: {}", self.address, self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops it (the registry is down); its storage stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `oci://ADDRESS/REPO`.
    pub fn reference(&self, repo: &str) -> String {
        format!("oci://{}/{repo}", self.address)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.path().join("registry.log")).unwrap_or_default()
    }

    /// A docker config folder (for `DOCKER_CONFIG`) holding this registry's login.
    pub fn docker_config(&self, dir: &Path) -> PathBuf {
        use base64::Engine as _;
        let (user, password) = self.login.as_ref().expect("a private registry");
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        std::fs::create_dir_all(dir).unwrap();
        let json = serde_json::json!({"auths": {self.address.clone(): {"auth": auth}}});
        std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
        dir.to_owned()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The registry is killed when the test process dies (never left behind by a failed test).
fn dies_with_its_test(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: between fork and exec the closure only calls prctl, which is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// An htpasswd line (bcrypt) from apache2-utils' `htpasswd`.
fn htpasswd(user: &str, password: &str) -> String {
    let out = Command::new("htpasswd")
        .args(["-Bbn", user, password])
        .output()
        .expect("htpasswd (apt-get install apache2-utils; scripts/test does)");
    assert!(out.status.success(), "htpasswd: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}
