//! The `tally-kernel serve` process as its supervisors run it: Docker, Kubernetes and systemd
//! stop a container or unit with SIGTERM, and the node must then stop gracefully (in-flight
//! calls answered, exit status 0) on that signal itself, with no shell in between to turn it
//! into SIGINT.

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tally_kernel::KeyPair;
use tally_tls::issue::ensure_dev_certs;

/// Kills the process if a failed assertion leaves it running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("address")
        .port()
}

fn healthcheck(tls_dir: &std::path::Path, endpoint: &str) -> bool {
    Command::new(env!("CARGO_BIN_EXE_tally-kernel"))
        .args([
            "healthcheck",
            "--endpoint",
            endpoint,
            "--timeout-ms",
            "2000",
        ])
        .arg("--tls-dir")
        .arg(tls_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("tally-kernel runs")
        .success()
}

#[test]
fn serve_stops_gracefully_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    ensure_dev_certs(dir.path(), "serve-process", 1).expect("certificates");
    let port = free_port();
    let config = dir.path().join("kernel.toml");
    let mut file = std::fs::File::create(&config).expect("config");
    write!(
        file,
        r#"listen_addr = "127.0.0.1:{port}"
tls_dir = "{dir}"
key_seed = "{seed}"
trusted_issuers = ["{issuer}"]
cluster_endpoints = ["127.0.0.1:1"]
cluster_tls_dir = "{dir}"

[reconciler]
enabled = false
"#,
        dir = dir.path().display(),
        seed = KeyPair::generate().seed_base64(),
        issuer = KeyPair::generate().public_key().to_base64(),
    )
    .expect("write config");
    let mut node = Running(
        Command::new(env!("CARGO_BIN_EXE_tally-kernel"))
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tally-kernel serve starts"),
    );
    let endpoint = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !healthcheck(dir.path(), &endpoint) {
        assert!(
            node.0.try_wait().expect("status").is_none(),
            "tally-kernel serve exited before serving"
        );
        assert!(Instant::now() < deadline, "not serving after 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }

    let sent = Command::new("kill")
        .args(["-TERM", &node.0.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success(), "SIGTERM sent");
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = node.0.try_wait().expect("status") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "still running 15 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = node.0.stderr.take() {
        std::io::Read::read_to_string(&mut pipe, &mut stderr).expect("stderr");
    }
    assert!(
        status.success(),
        "a graceful stop exits 0: {status:?}\n{stderr}"
    );
    assert!(!healthcheck(dir.path(), &endpoint), "the port is closed");
}
