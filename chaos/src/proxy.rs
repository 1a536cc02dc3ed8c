//! The fault-injecting TCP proxy: one per node, in front of it. Peers and clients reach a node
//! only through its proxy (the node advertises the proxy's address), so the harness can cut,
//! blackhole or delay any directed link: partitions (leader in the minority), one-way
//! partitions and bridges. The proxy tells who is calling by finding which node process owns
//! the connecting socket (`/proc`), since every process talks from 127.0.0.1.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Bytes read per chunk; also the unit of delay and of loss.
const CHUNK_BYTES: usize = 16 * 1024;
/// Connections one proxy keeps at once; beyond it new ones are refused.
const MAX_CONNECTIONS: usize = 512;

/// One end of a link: a node, or anything else (the harness's clients).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Party {
    Node(u64),
    Client,
}

/// Which directed links drop their bytes, and how slow the others are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Rules {
    /// `(from, to)`: bytes from `from` to `to` are lost.
    pub blocked: BTreeSet<(Party, Party)>,
    /// Added to every chunk between nodes.
    pub delay_ms: u64,
}

impl Rules {
    pub fn blocks(&self, from: Party, to: Party) -> bool {
        self.blocked.contains(&(from, to))
    }

    /// Both directions between every node of `a` and every node of `b`.
    pub fn cut(&mut self, a: &[u64], b: &[u64]) {
        for x in a {
            for y in b {
                self.blocked.insert((Party::Node(*x), Party::Node(*y)));
                self.blocked.insert((Party::Node(*y), Party::Node(*x)));
            }
        }
    }

    /// Only `from → to` for each pair.
    pub fn cut_one_way(&mut self, from: &[u64], to: &[u64]) {
        for x in from {
            for y in to {
                self.blocked.insert((Party::Node(*x), Party::Node(*y)));
            }
        }
    }

    /// Clients cannot reach `nodes` (nor hear from them).
    pub fn cut_clients(&mut self, nodes: &[u64]) {
        for n in nodes {
            self.blocked.insert((Party::Client, Party::Node(*n)));
            self.blocked.insert((Party::Node(*n), Party::Client));
        }
    }
}

/// Which of a node's ports a proxy fronts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The client port: clients, kernels, and nodes forwarding writes.
    Client,
    /// The peer port: only nodes.
    Peer,
}

/// Tries to find which node dialled a connection before taking it for a client's.
const IDENTIFY_ATTEMPTS: usize = 5;

/// The harness's handle on every proxy: the rules, the node pids, and a generation bumped on
/// each change so connections that lost bytes are closed once the fault is healed.
#[derive(Clone)]
pub struct Network {
    rules: Arc<Mutex<Rules>>,
    pids: Arc<Mutex<BTreeMap<u64, u32>>>,
    changed: watch::Sender<u64>,
}

impl Default for Network {
    fn default() -> Self {
        Self::new()
    }
}

impl Network {
    pub fn new() -> Self {
        let (changed, _) = watch::channel(0);
        Self {
            rules: Arc::new(Mutex::new(Rules::default())),
            pids: Arc::new(Mutex::new(BTreeMap::new())),
            changed,
        }
    }

    pub fn rules(&self) -> Rules {
        self.rules.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_rules(&self, rules: Rules) {
        *self.rules.lock().unwrap_or_else(|p| p.into_inner()) = rules;
        self.changed.send_modify(|g| *g += 1);
    }

    pub fn heal(&self) {
        self.set_rules(Rules::default());
    }

    pub fn set_pid(&self, node: u64, pid: Option<u32>) {
        let mut pids = self.pids.lock().unwrap_or_else(|p| p.into_inner());
        match pid {
            Some(pid) => pids.insert(node, pid),
            None => pids.remove(&node),
        };
    }

    fn pids(&self) -> BTreeMap<u64, u32> {
        self.pids.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Starts node `node`'s proxy on `listener`, forwarding to `upstream`, which is the
    /// node's client port or its peer port (`side`).
    pub fn spawn_proxy(
        &self,
        node: u64,
        listener: TcpListener,
        upstream: SocketAddr,
        side: Side,
    ) -> JoinHandle<()> {
        let network = self.clone();
        tokio::spawn(async move {
            let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            loop {
                let Ok((socket, peer)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                if open.load(std::sync::atomic::Ordering::Relaxed) >= MAX_CONNECTIONS {
                    continue;
                }
                let network = network.clone();
                let open = open.clone();
                open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::spawn(async move {
                    network.serve(node, socket, peer, upstream, side).await;
                    open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                });
            }
        })
    }

    async fn serve(
        &self,
        node: u64,
        socket: TcpStream,
        peer: SocketAddr,
        upstream: SocketAddr,
        side: Side,
    ) {
        let mut from = Party::Client;
        for attempt in 0..IDENTIFY_ATTEMPTS {
            let pids = self.pids();
            from = tokio::task::spawn_blocking(move || identify(peer, &pids))
                .await
                .unwrap_or(Party::Client);
            if from != Party::Client || side == Side::Client {
                break;
            }
            if attempt + 1 < IDENTIFY_ATTEMPTS {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        if side == Side::Peer && from == Party::Client {
            // Only nodes dial a peer port. A connection whose node was not found (its socket
            // not yet listed in /proc) would otherwise pass as a client's and cross every
            // partition between nodes: close it, and the node dials again.
            return;
        }
        let to = Party::Node(node);
        let mut changed = self.changed.subscribe();
        if self.rules().blocks(from, to) {
            // Blackhole: hold the connection, read nothing, until the rules change.
            let _ = changed.changed().await;
            return;
        }
        let Ok(upstream) = TcpStream::connect(upstream).await else {
            return;
        };
        let _ = socket.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let (mut client_read, mut client_write) = socket.into_split();
        let (mut node_read, mut node_write) = upstream.into_split();
        let mut up = vec![0u8; CHUNK_BYTES];
        let mut down = vec![0u8; CHUNK_BYTES];
        // Once a direction lost bytes its stream is broken: it stays silent until the rules
        // change, and then the connection is closed so both ends reconnect cleanly.
        let mut poisoned = false;
        loop {
            tokio::select! {
                read = client_read.read(&mut up) => {
                    let Ok(n) = read else { return };
                    if n == 0 { return; }
                    if !self.pass(from, to, &mut poisoned).await { continue; }
                    if node_write.write_all(&up[..n]).await.is_err() { return; }
                }
                read = node_read.read(&mut down) => {
                    let Ok(n) = read else { return };
                    if n == 0 { return; }
                    if !self.pass(to, from, &mut poisoned).await { continue; }
                    if client_write.write_all(&down[..n]).await.is_err() { return; }
                }
                change = changed.changed() => {
                    if change.is_err() || poisoned { return; }
                }
            }
        }
    }

    /// Whether a chunk from `from` to `to` goes through (after the link's delay).
    async fn pass(&self, from: Party, to: Party, poisoned: &mut bool) -> bool {
        let rules = self.rules();
        if *poisoned || rules.blocks(from, to) {
            *poisoned = true;
            return false;
        }
        if rules.delay_ms > 0 && from != Party::Client && to != Party::Client {
            tokio::time::sleep(Duration::from_millis(rules.delay_ms)).await;
        }
        true
    }
}

/// Which node process owns the socket at `peer` (the connecting end), from `/proc`.
fn identify(peer: SocketAddr, pids: &BTreeMap<u64, u32>) -> Party {
    let Some(inode) = socket_inode(peer) else {
        return Party::Client;
    };
    let wanted = format!("socket:[{inode}]");
    for (node, pid) in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten().take(65_536) {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == wanted) {
                return Party::Node(*node);
            }
        }
    }
    Party::Client
}

/// The inode of the TCP socket whose local address is `addr`, from `/proc/net/tcp`.
fn socket_inode(addr: SocketAddr) -> Option<String> {
    let SocketAddr::V4(v4) = addr else {
        return None;
    };
    let o = v4.ip().octets();
    let local = format!(
        "{:02X}{:02X}{:02X}{:02X}:{:04X}",
        o[3],
        o[2],
        o[1],
        o[0],
        v4.port()
    );
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&local.as_str()))
            .then(|| fields.get(9).map(|s| (*s).to_owned()))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn forwards_then_blackholes_then_heals() {
        let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let echo_addr = echo.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let network = Network::new();
        let front = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let front_addr = front.local_addr().expect("addr");
        let _proxy = network.spawn_proxy(1, front, echo_addr, Side::Client);

        let mut conn = TcpStream::connect(front_addr).await.expect("connect");
        conn.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        conn.read_exact(&mut buf).await.expect("echo");
        assert_eq!(&buf, b"ping");

        let mut rules = Rules::default();
        rules.cut_clients(&[1]);
        network.set_rules(rules);
        conn.write_all(b"lost").await.expect("write");
        let lost = tokio::time::timeout(Duration::from_millis(300), conn.read(&mut buf)).await;
        assert!(lost.is_err(), "a blocked link delivers nothing");

        network.heal();
        // The poisoned connection is closed on heal; a new one works.
        let closed = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
        let mut conn = TcpStream::connect(front_addr).await.expect("reconnect");
        conn.write_all(b"back").await.expect("write");
        conn.read_exact(&mut buf).await.expect("echo");
        assert_eq!(&buf, b"back");
    }

    #[test]
    fn the_harness_own_sockets_are_clients() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let conn = std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("c");
        let local = conn.local_addr().expect("local");
        assert!(
            socket_inode(local).is_some(),
            "the socket is in /proc/net/tcp"
        );
        let me = BTreeMap::from([(7, std::process::id())]);
        assert_eq!(
            identify(local, &me),
            Party::Node(7),
            "found by its owning pid"
        );
        assert_eq!(identify(local, &BTreeMap::new()), Party::Client);
    }
}
