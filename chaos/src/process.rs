//! One node process: started from the chaos-node binary with its env, killed (SIGKILL),
//! paused (SIGSTOP/SIGCONT) and restarted from its data dir, by pid. Dropping it kills it,
//! even when the harness panics; `PR_SET_PDEATHSIG` kills it if the harness itself dies.

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot start node {node} from {binary}: {source}")]
    Spawn {
        node: u64,
        binary: String,
        source: std::io::Error,
    },
    #[error("cannot open node {node}'s log {path}: {source}")]
    Log {
        node: u64,
        path: String,
        source: std::io::Error,
    },
}

/// How a node process is started.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub id: u64,
    pub binary: PathBuf,
    /// Where the node listens.
    pub listen: String,
    /// What it advertises: its proxy.
    pub advertise: String,
    /// Where its peer port (Raft) listens, and the proxy in front of it.
    pub peer_listen: String,
    pub peer_advertise: String,
    /// Its node certificate, key and the cluster's CA.
    pub tls: tally_tls::TlsFiles,
    pub data_dir: PathBuf,
    pub log_file: PathBuf,
    pub cluster_id: String,
    /// Its region (`cluster::region_of`), in its configuration and the membership.
    pub region: String,
    pub snapshot_every_entries: u64,
    pub max_live_families: usize,
}

pub struct NodeProcess {
    pub spec: NodeSpec,
    child: Option<Child>,
    paused: bool,
    /// Failpoints the running process was started with.
    pub armed: Option<String>,
}

impl NodeProcess {
    pub fn new(spec: NodeSpec) -> Self {
        Self {
            spec,
            child: None,
            paused: false,
            armed: None,
        }
    }

    /// Starts the process (restart = the same data dir), with `failpoints` armed if given.
    pub fn start(&mut self, failpoints: Option<&str>) -> Result<u32, ProcessError> {
        self.kill();
        let spec = &self.spec;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log_file)
            .map_err(|source| ProcessError::Log {
                node: spec.id,
                path: spec.log_file.display().to_string(),
                source,
            })?;
        let log_err = log.try_clone().map_err(|source| ProcessError::Log {
            node: spec.id,
            path: spec.log_file.display().to_string(),
            source,
        })?;
        let mut command = Command::new(&spec.binary);
        command
            .arg("serve")
            .envs(spec.tls.node_env())
            .env("TALLY_NODE_ID", spec.id.to_string())
            .env("TALLY_LISTEN_ADDR", &spec.listen)
            .env("TALLY_ADVERTISE_ADDR", &spec.advertise)
            .env("TALLY_PEER_LISTEN_ADDR", &spec.peer_listen)
            .env("TALLY_PEER_ADVERTISE_ADDR", &spec.peer_advertise)
            .env("TALLY_DATA_DIR", &spec.data_dir)
            .env("TALLY_CLUSTER_ID", &spec.cluster_id)
            .env("TALLY_REGION", &spec.region)
            .env(
                "TALLY_SNAPSHOT_EVERY_ENTRIES",
                spec.snapshot_every_entries.to_string(),
            )
            .env(
                "TALLY_MAX_LIVE_FAMILIES",
                spec.max_live_families.to_string(),
            )
            // No filter page stays in memory: every lookup of a family with rows out of
            // memory reads its filters' blocks from the page file, under the faults.
            .env("TALLY_FILTER_MEMORY_BYTES", "0")
            // Info from the state machine, so an installed snapshot shows in the log.
            .env("RUST_LOG", "warn,tally_authority::raft::state_machine=info")
            .env_remove("FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        if let Some(points) = failpoints {
            command.env("FAILPOINTS", points);
        }
        // SAFETY: prctl is async-signal-safe and touches only the child's own state.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command.spawn().map_err(|source| ProcessError::Spawn {
            node: spec.id,
            binary: spec.binary.display().to_string(),
            source,
        })?;
        let pid = child.id();
        self.child = Some(child);
        self.paused = false;
        self.armed = failpoints.map(str::to_owned);
        Ok(pid)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is alive (reaps it if it exited, e.g. aborted at a failpoint).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.paused {
                signal(child.id(), libc::SIGCONT);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    pub fn pause(&mut self) {
        if let Some(pid) = self.pid() {
            signal(pid, libc::SIGSTOP);
            self.paused = true;
        }
    }

    pub fn resume(&mut self) {
        if let Some(pid) = self.pid() {
            signal(pid, libc::SIGCONT);
        }
        self.paused = false;
    }

    /// Lines of this node's log (all its runs) that contain `needle`; 0 if unreadable.
    pub fn log_mentions(&self, needle: &str) -> usize {
        const MAX_LOG_BYTES: u64 = 256 * 1024 * 1024;
        let too_big =
            std::fs::metadata(&self.spec.log_file).map_or(true, |m| m.len() > MAX_LOG_BYTES);
        if too_big {
            return 0;
        }
        std::fs::read_to_string(&self.spec.log_file).map_or(0, |text| {
            text.lines().filter(|l| l.contains(needle)).count()
        })
    }

    pub fn data_dir(&self) -> &Path {
        &self.spec.data_dir
    }
}

fn signal(pid: u32, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) on a pid this process started and has not reaped.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
