//! A real cluster of `tally-node serve` processes on 127.0.0.1, started for one run and
//! killed (by pid) when dropped, even on failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tally_api::pb::admin_client::AdminClient;
use tally_api::pb::{
    ClockProbeRequest, InitializeRequest, MemberAddress, SetParamsRequest, StatusReply,
    StatusRequest,
};
use tally_tls::{TlsFiles, Transport};

pub struct ProcessCluster {
    /// The operator's and the kernel's certificates of the cluster's own CA.
    pub operator: Transport,
    pub kernel: Transport,
    children: Vec<Child>,
    data_dirs: Vec<PathBuf>,
    pub endpoints: Vec<String>,
    pub metrics: Vec<String>,
    /// Each node's async runtime threads (`node_worker_threads`).
    pub worker_threads: usize,
    members: BTreeMap<u64, MemberAddress>,
}

impl ProcessCluster {
    /// Starts `nodes` nodes from `binary` with data under `dir`, initializes and waits until
    /// every node is healthy.
    pub async fn start(
        binary: &Path,
        dir: &Path,
        nodes: u16,
        base_port: u16,
    ) -> anyhow::Result<Self> {
        Self::start_with(binary, dir, nodes, base_port, &[]).await
    }

    /// [`Self::start`] with extra node settings as `TALLY_*` variables (`("TALLY_MEMORY_BUDGET_BYTES",
    /// "268435456")`), the same on every node.
    pub async fn start_with(
        binary: &Path,
        dir: &Path,
        nodes: u16,
        base_port: u16,
        settings: &[(String, String)],
    ) -> anyhow::Result<Self> {
        let tls_dir = dir.join("tls");
        tally_tls::issue::ensure_dev_certs(&tls_dir, "tally-bench", u64::from(nodes))?;
        let mut cluster = Self {
            operator: Transport::from_dir(&tls_dir, "operator", false)?,
            kernel: Transport::from_dir(&tls_dir, "kernel", false)?,
            children: Vec::new(),
            data_dirs: Vec::new(),
            endpoints: Vec::new(),
            metrics: Vec::new(),
            worker_threads: node_worker_threads(usize::from(nodes)),
            members: BTreeMap::new(),
        };
        for id in 1..=nodes {
            let addr = format!("127.0.0.1:{}", base_port + id);
            let metrics = format!("127.0.0.1:{}", base_port + 100 + id);
            let peer = format!("127.0.0.1:{}", base_port + 200 + id);
            let data: PathBuf = dir.join(format!("node-{id}"));
            let serve = ServeSettings {
                id: u64::from(id),
                worker_threads: cluster.worker_threads,
                listen: &addr,
                peer: &peer,
                metrics: &metrics,
                data_dir: &data,
                cluster_id: "tally-bench",
                tls: TlsFiles::in_dir(&tls_dir, &format!("node-{id}")),
            };
            let child = serve
                .apply(&mut Command::new(binary))
                .env("RUST_LOG", "warn")
                .envs(settings.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", binary.display()))?;
            cluster.children.push(child);
            cluster.data_dirs.push(data);
            cluster.endpoints.push(addr.clone());
            cluster.members.insert(
                u64::from(id),
                MemberAddress {
                    address: addr,
                    peer_address: peer,
                    region: "local".to_owned(),
                },
            );
            cluster.metrics.push(metrics);
        }
        let mut first = connect_within(
            &cluster.operator,
            &cluster.endpoints[0],
            Duration::from_secs(15),
        )
        .await?;
        first
            .initialize(InitializeRequest {
                members: BTreeMap::new(),
                nodes: cluster.members.clone(),
            })
            .await?;
        cluster.wait_healthy(Duration::from_secs(30)).await?;
        Ok(cluster)
    }

    async fn wait_healthy(&self, within: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            let mut healthy = 0;
            for endpoint in &self.endpoints {
                if let Ok(mut admin) = connect(&self.operator, endpoint).await {
                    if let Ok(status) = admin.status(StatusRequest {}).await {
                        healthy += usize::from(status.into_inner().healthy);
                    }
                }
            }
            if healthy == self.endpoints.len() {
                return Ok(());
            }
            anyhow::ensure!(
                start.elapsed() < within,
                "the cluster did not become healthy within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The nodes' process ids and data dirs, in node id order.
    pub fn nodes(&self) -> Vec<(u32, PathBuf)> {
        self.children
            .iter()
            .zip(&self.data_dirs)
            .map(|(child, dir)| (child.id(), dir.clone()))
            .collect()
    }

    /// Sets the cluster's retention through the log (on the leader).
    pub async fn set_retention_ms(&self, retention_ms: u64) -> anyhow::Result<()> {
        let (leader, _) = self.leader_status().await?;
        connect(&self.operator, &leader)
            .await?
            .set_params(SetParamsRequest {
                retention_ms: Some(retention_ms),
                ..SetParamsRequest::default()
            })
            .await?;
        Ok(())
    }

    /// The leader's endpoint and status, asking each node in turn.
    async fn leader_status(&self) -> anyhow::Result<(String, StatusReply)> {
        for endpoint in &self.endpoints {
            let mut admin = connect(&self.operator, endpoint).await?;
            let status = admin.status(StatusRequest {}).await?.into_inner();
            if status.leader_id == Some(status.node_id) {
                return Ok((endpoint.clone(), status));
            }
        }
        anyhow::bail!("no leader")
    }

    /// The median of 2,000 sequential `Admin.ClockProbe` calls to the leader over one mTLS
    /// channel: Tally's own loopback gRPC round trip (TLS, HTTP/2, tonic, no Raft, no disk),
    /// the floor under a command's latency that the 1-caller target counts twice. Printed
    /// after `who`, the line's prefix.
    pub async fn round_trip_p50_ms(&self, who: &str) -> anyhow::Result<f64> {
        let (leader, _) = self.leader_status().await?;
        let admin = connect(&self.operator, &leader).await?;
        let p50_ms = crate::round_trip::sequential_p50_ms(2_000, || {
            let mut admin = admin.clone();
            async move { admin.clock_probe(ClockProbeRequest { sent_at_ms: 0 }).await }
        })
        .await?;
        println!(
            "{who}: loopback gRPC round trip to the leader (Admin.ClockProbe, mTLS) p50 {p50_ms:.3} ms"
        );
        Ok(p50_ms)
    }

    /// The leader's last log index (entries written so far).
    pub async fn leader_last_log(&self) -> anyhow::Result<u64> {
        let (_, status) = self.leader_status().await?;
        Ok(status.last_log_index.unwrap_or(0))
    }
}

/// What every bench node is started with: `serve`, its id, its client, peer and metrics
/// addresses, data dir, cluster id and certificate (as `TALLY_*` variables).
pub struct ServeSettings<'a> {
    pub id: u64,
    /// The node's async runtime threads (`node_worker_threads`).
    pub worker_threads: usize,
    pub listen: &'a str,
    pub peer: &'a str,
    pub metrics: &'a str,
    pub data_dir: &'a Path,
    pub cluster_id: &'a str,
    pub tls: TlsFiles,
}

impl ServeSettings<'_> {
    /// `command` (the node binary, or a launcher followed by it) with `serve` and the settings.
    pub fn apply<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        command
            .arg("serve")
            .envs(self.tls.node_env())
            .env("TALLY_NODE_ID", self.id.to_string())
            .env("TALLY_LISTEN_ADDR", self.listen)
            .env("TALLY_PEER_LISTEN_ADDR", self.peer)
            .env("TALLY_METRICS_ADDR", self.metrics)
            .env("TALLY_DATA_DIR", self.data_dir)
            .env("TALLY_CLUSTER_ID", self.cluster_id)
            // Not the `worker_threads` setting: tokio reads this variable itself, so builds
            // from before that setting (paired runs) get the same runtime.
            .env("TOKIO_WORKER_THREADS", self.worker_threads.to_string())
    }
}

/// Async runtime threads for each of `nodes` nodes sharing this host: its cores split between
/// them (at least one), unless `TOKIO_WORKER_THREADS` is set for the bench. A node's default
/// is one per core, and three such nodes on two cores wake each other's idle workers: one
/// worker each cost ~16% less CPU per command at 2,000 commands/s and ran 6–7% faster at
/// full speed (docs/benchmarks.md "Cores shared by co-located nodes").
pub fn node_worker_threads(nodes: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
    worker_threads_for(
        cores,
        nodes,
        std::env::var("TOKIO_WORKER_THREADS").ok().as_deref(),
    )
}

fn worker_threads_for(cores: usize, nodes: usize, overridden: Option<&str>) -> usize {
    match overridden.and_then(|value| value.parse::<usize>().ok()) {
        Some(threads) if threads > 0 => threads,
        _ => (cores / nodes.max(1)).max(1),
    }
}

/// The tally-node binary to start: `given`, else the one next to this program; an error that
/// says how to build it when it is missing.
pub fn node_binary(given: Option<&Path>, build: &str) -> anyhow::Result<PathBuf> {
    let binary = match given {
        Some(binary) => binary.to_path_buf(),
        None => std::env::current_exe()?.with_file_name("tally-node"),
    };
    anyhow::ensure!(
        binary.exists(),
        "{} not found: build it ({build})",
        binary.display()
    );
    Ok(binary)
}

/// The first base from 27,500 whose node, metrics and peer ports (base+1..3, base+101..103,
/// base+201..203) are free.
pub fn free_base_port() -> anyhow::Result<u16> {
    let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    (0..100u16)
        .map(|i| 27_500 + 300 * i)
        .find(|base| (1..=3).all(|id| [0, 100, 200].iter().all(|off| free(base + off + id))))
        .ok_or_else(|| anyhow::anyhow!("no free base port from 27,500 up: pass --base-port"))
}

/// Processes take a moment to listen: retry until `within`.
pub(crate) async fn connect_within(
    transport: &Transport,
    endpoint: &str,
    within: Duration,
) -> anyhow::Result<AdminClient<tonic::transport::Channel>> {
    let start = Instant::now();
    loop {
        match connect(transport, endpoint).await {
            Ok(client) => return Ok(client),
            Err(error) if start.elapsed() > within => return Err(error),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

pub(crate) async fn connect(
    transport: &Transport,
    endpoint: &str,
) -> anyhow::Result<AdminClient<tonic::transport::Channel>> {
    Ok(AdminClient::new(
        transport.endpoint(endpoint)?.connect().await?,
    ))
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::worker_threads_for;

    #[test]
    fn co_located_nodes_split_the_cores_unless_told_otherwise() {
        assert_eq!(worker_threads_for(2, 3, None), 1, "never none");
        assert_eq!(worker_threads_for(8, 3, None), 2);
        assert_eq!(worker_threads_for(16, 1, None), 16);
        assert_eq!(
            worker_threads_for(2, 3, Some("4")),
            4,
            "the bench's own override"
        );
        assert_eq!(
            worker_threads_for(2, 3, Some("0")),
            1,
            "0 is tokio's error, not ours"
        );
        assert_eq!(worker_threads_for(8, 2, Some("many")), 4);
    }
}
