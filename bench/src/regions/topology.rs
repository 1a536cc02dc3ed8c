//! The hosts of the regions bench: one network namespace per node and one per region's
//! callers, each joined by a veth pair to a router namespace whose delay router
//! (`delay_router`) stands for the WAN. Addresses are 10.77.<host>.1, the router's side of each
//! link 10.77.<host>.254: they exist only inside these namespaces. Everything is removed when
//! the topology is dropped, and namespaces a killed run left behind are removed at start.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::delay_router::{self, DelayPlan, RouterControl};

/// Every namespace and interface of the bench starts with this, so a later run finds and
/// removes what a killed one left.
const PREFIX: &str = "tallyrg";

/// The routing table that sends what the router's veths receive into the delay router.
const DELAY_TABLE: &str = "100";

/// One host: a namespace with one address, in a region.
#[derive(Clone, Debug)]
pub struct Host {
    pub namespace: String,
    pub address: Ipv4Addr,
    pub region: usize,
}

pub struct Topology {
    pub hosts: Vec<Host>,
    router_namespace: String,
    pub control: Arc<RouterControl>,
    router: Option<JoinHandle<()>>,
}

/// Runs `ip` with `args`; its error output in the error.
fn ip(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run `ip` (Debian's iproute2): {e}"))?;
    anyhow::ensure!(
        output.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// Writes a sysctl inside `namespace` (the /proc/sys/net a process sees is its namespace's).
fn sysctl_in(namespace: &str, key: &str, value: &str) -> anyhow::Result<()> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    ip(&[
        "netns",
        "exec",
        namespace,
        "sh",
        "-c",
        &format!("echo {value} > {path}"),
    ])
}

/// Why this machine cannot build the topology, if it cannot: the bench says so and stops.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root (CAP_NET_ADMIN)".into());
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun is missing (the delay router is a TUN device)".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("`ip` is missing: apt-get install iproute2".into());
    }
    None
}

/// Moves the calling thread into `namespace`; sockets it opens from then on are there.
pub fn enter(namespace: &str) -> anyhow::Result<()> {
    let path = format!("/run/netns/{namespace}");
    let file = std::fs::File::open(&path).map_err(|e| anyhow::anyhow!("open {path}: {e}"))?;
    use std::os::fd::AsRawFd;
    // SAFETY: a valid namespace fd; CLONE_NEWNET changes only this thread's network namespace.
    let status = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    anyhow::ensure!(
        status == 0,
        "cannot enter {namespace}: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// Runs `work` on a thread of its own inside `namespace`, on a single-threaded runtime (its
/// sockets are all opened there).
pub fn run_in<T, F, Fut>(namespace: &str, work: F) -> JoinHandle<anyhow::Result<T>>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let namespace = namespace.to_owned();
    std::thread::spawn(move || {
        enter(&namespace)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(work())
    })
}

/// Removes the namespaces a previous run left behind.
fn remove_leftovers() -> anyhow::Result<()> {
    let output = Command::new("ip").args(["netns", "list"]).output()?;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if name.starts_with(PREFIX) {
            ip(&["netns", "delete", name])?;
        }
    }
    Ok(())
}

impl Topology {
    /// One host per entry of `regions` (the host's region), joined through the delay router
    /// with `one_way[from][to]` between regions.
    pub fn build(regions: &[usize], one_way: Vec<Vec<Duration>>) -> anyhow::Result<Self> {
        assert!(regions.len() < 250, "one /24 per host under 10.77/16");
        remove_leftovers()?;
        let router_namespace = format!("{PREFIX}-router");
        ip(&["netns", "add", &router_namespace])?;
        let mut topology = Self {
            hosts: Vec::new(),
            router_namespace: router_namespace.clone(),
            control: Arc::new(RouterControl::default()),
            router: None,
        };
        sysctl_in(&router_namespace, "net.ipv4.ip_forward", "1")?;
        for key in [
            "net.ipv4.conf.all.rp_filter",
            "net.ipv4.conf.default.rp_filter",
        ] {
            sysctl_in(&router_namespace, key, "0")?;
        }
        for (index, region) in regions.iter().enumerate() {
            let host = topology.add_host(index + 1, *region)?;
            topology.hosts.push(host);
        }
        let plan = DelayPlan::new(
            topology
                .hosts
                .iter()
                .map(|host| (host.address, host.region))
                .collect::<BTreeMap<_, _>>(),
            one_way,
        );
        topology.start_router(plan)?;
        Ok(topology)
    }

    fn add_host(&self, number: usize, region: usize) -> anyhow::Result<Host> {
        let namespace = format!("{PREFIX}-h{number}");
        let (inside, outside) = (format!("{PREFIX}h{number}"), format!("{PREFIX}r{number}"));
        let address = Ipv4Addr::new(10, 77, number as u8, 1);
        let gateway = Ipv4Addr::new(10, 77, number as u8, 254);
        let router = self.router_namespace.as_str();
        ip(&["netns", "add", &namespace])?;
        ip(&[
            "link", "add", &inside, "type", "veth", "peer", "name", &outside,
        ])?;
        ip(&["link", "set", &inside, "netns", &namespace])?;
        ip(&["link", "set", &outside, "netns", router])?;
        ip(&["-n", &namespace, "link", "set", "lo", "up"])?;
        ip(&[
            "-n",
            &namespace,
            "addr",
            "add",
            &format!("{address}/24"),
            "dev",
            &inside,
        ])?;
        ip(&["-n", &namespace, "link", "set", &inside, "up"])?;
        ip(&[
            "-n",
            &namespace,
            "route",
            "add",
            "default",
            "via",
            &gateway.to_string(),
        ])?;
        ip(&[
            "-n",
            router,
            "addr",
            "add",
            &format!("{gateway}/24"),
            "dev",
            &outside,
        ])?;
        ip(&["-n", router, "link", "set", &outside, "up"])?;
        ip(&[
            "-n",
            router,
            "rule",
            "add",
            "iif",
            &outside,
            "lookup",
            DELAY_TABLE,
        ])?;
        Ok(Host {
            namespace,
            address,
            region,
        })
    }

    /// Opens the TUN devices inside the router's namespace and starts forwarding.
    fn start_router(&mut self, plan: DelayPlan) -> anyhow::Result<()> {
        let (opened_tx, opened_rx) = std::sync::mpsc::channel();
        let (namespace, control) = (self.router_namespace.clone(), self.control.clone());
        self.router = Some(std::thread::spawn(move || {
            let opened = enter(&namespace).and_then(|()| {
                Ok((
                    delay_router::open_tun("tin")?,
                    delay_router::open_tun("tout")?,
                ))
            });
            match opened {
                Ok((inbound, outbound)) => {
                    let _ = opened_tx.send(Ok(()));
                    delay_router::run(inbound, outbound, plan, control);
                }
                Err(error) => {
                    let _ = opened_tx.send(Err(error));
                }
            }
        }));
        opened_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("the delay router's thread ended"))??;
        let router = self.router_namespace.as_str();
        for device in ["tin", "tout"] {
            ip(&["-n", router, "link", "set", device, "up"])?;
        }
        sysctl_in(router, "net.ipv4.conf.tout.rp_filter", "0")?;
        ip(&[
            "-n",
            router,
            "route",
            "add",
            "default",
            "dev",
            "tin",
            "table",
            DELAY_TABLE,
        ])?;
        Ok(())
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.control.stop();
        if let Some(router) = self.router.take() {
            let _ = router.join();
        }
        for host in &self.hosts {
            let _ = ip(&["netns", "delete", &host.namespace]);
        }
        let _ = ip(&["netns", "delete", &self.router_namespace]);
    }
}
