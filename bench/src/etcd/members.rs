//! A 3-member etcd on 127.0.0.1, started for one run and killed (by pid) when dropped, even on
//! failure; and `scripts/etcd-install` when `etcd` is not on PATH.
//!
//! Flags set, and why (everything else is etcd's default, fsync included):
//! * `--quota-backend-bytes 8589934592` (8 GiB, etcd's documented maximum): the default 2 GiB
//!   can fill during a long sweep without compaction, and a full quota stops writes. It limits
//!   nothing per request.
//! * `--logger zap --log-level warn`: no per-request logging costs; the logs go to
//!   `DATA/mN.log`, shown when a member fails to start.
//! * `--snapshot-count` stays at 3.4's default, 100,000 entries; `--auto-compaction-*` stays off.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

use super::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use super::pb::etcdserverpb::StatusRequest;

pub const MEMBERS: usize = 3;

/// Where `etcd` is, installing it with `scripts/etcd-install` unless `skip_install`; the
/// error says why not.
pub fn find_or_install(skip_install: bool) -> Result<PathBuf, String> {
    if let Some(path) = on_path("etcd") {
        return Ok(path);
    }
    if skip_install {
        return Err("`etcd` is not on PATH and --skip-install was given".into());
    }
    let bench_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = bench_dir
        .parent()
        .unwrap_or(bench_dir)
        .join("scripts/etcd-install");
    if !script.exists() {
        return Err(format!(
            "`etcd` is not on PATH and {} is missing",
            script.display()
        ));
    }
    println!("etcd: not on PATH, running {}", script.display());
    let output = Command::new(&script)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !output.status.success() {
        let why = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "{} failed: {}",
            script.display(),
            why.trim().replace('\n', "; ")
        ));
    }
    on_path("etcd").ok_or_else(|| "etcd-install succeeded but `etcd` is not on PATH".into())
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    })
}

/// The binary's `etcd --version` first line.
pub fn version(binary: &Path) -> String {
    Command::new(binary)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|text| text.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown version".into())
}

pub struct EtcdCluster {
    children: Vec<Child>,
    logs: Vec<PathBuf>,
    /// `127.0.0.1:port` client addresses, one per member.
    pub endpoints: Vec<String>,
}

impl EtcdCluster {
    /// Starts the members with data under `dir` (on the disk under test) and waits until all
    /// of them agree on a leader.
    pub async fn start(binary: &Path, dir: &Path) -> anyhow::Result<Self> {
        let ports = free_ports(2 * MEMBERS)?;
        let (clients, peers) = ports.split_at(MEMBERS);
        let initial_cluster = peers
            .iter()
            .enumerate()
            .map(|(i, port)| format!("m{}=http://127.0.0.1:{port}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("tally-bench-{}", std::process::id());
        let mut cluster = Self {
            children: Vec::new(),
            logs: Vec::new(),
            endpoints: Vec::new(),
        };
        for i in 0..MEMBERS {
            let name = format!("m{}", i + 1);
            let client_url = format!("http://127.0.0.1:{}", clients[i]);
            let peer_url = format!("http://127.0.0.1:{}", peers[i]);
            let log = dir.join(format!("{name}.log"));
            let log_file = File::create(&log)?;
            let child = Command::new(binary)
                .args(["--name", &name])
                .arg("--data-dir")
                .arg(dir.join(&name))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial_cluster])
                .args(["--initial-cluster-token", &token])
                .args(["--initial-cluster-state", "new"])
                .args(["--quota-backend-bytes", "8589934592"])
                .args(["--logger", "zap", "--log-level", "warn"])
                .args(["--log-outputs", "stderr"])
                .stdin(Stdio::null())
                .stdout(log_file.try_clone()?)
                .stderr(log_file)
                .spawn()
                .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", binary.display()))?;
            cluster.children.push(child);
            cluster.logs.push(log);
            cluster.endpoints.push(format!("127.0.0.1:{}", clients[i]));
        }
        if let Err(error) = cluster.wait_for_leader(Duration::from_secs(30)).await {
            anyhow::bail!("{error}; {}", cluster.log_tails());
        }
        Ok(cluster)
    }

    async fn wait_for_leader(&mut self, within: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            for (i, child) in self.children.iter_mut().enumerate() {
                if let Some(status) = child.try_wait()? {
                    anyhow::bail!("etcd member m{} exited ({status})", i + 1);
                }
            }
            if self.leader().await.is_ok() {
                return Ok(());
            }
            anyhow::ensure!(
                start.elapsed() < within,
                "etcd did not elect a leader within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The leader's client address, once every member answers and names the same leader.
    pub async fn leader(&self) -> anyhow::Result<String> {
        let mut leaders = Vec::new();
        let mut leader_endpoint = None;
        for endpoint in &self.endpoints {
            let mut maintenance = MaintenanceClient::new(channel(endpoint).await?);
            let status = maintenance.status(StatusRequest {}).await?.into_inner();
            let member = status.header.map_or(0, |h| h.member_id);
            anyhow::ensure!(status.leader != 0, "{endpoint} knows no leader yet");
            if status.leader == member {
                leader_endpoint = Some(endpoint.clone());
            }
            leaders.push(status.leader);
        }
        anyhow::ensure!(
            leaders.windows(2).all(|w| w[0] == w[1]),
            "members disagree on the leader"
        );
        leader_endpoint.ok_or_else(|| anyhow::anyhow!("no member says it leads"))
    }

    fn log_tails(&self) -> String {
        self.logs
            .iter()
            .map(|log| {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(3).collect();
                format!(
                    "{}: {}",
                    log.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// A channel to one member: TCP_NODELAY as Tally's client, and a per-call timeout so a stuck
/// call surfaces as an error and is retried.
pub async fn channel(endpoint: &str) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{endpoint}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect()
        .await?)
}

/// `count` distinct ports the kernel has free now (all held open until all are picked).
fn free_ports(count: usize) -> std::io::Result<Vec<u16>> {
    let listeners = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
