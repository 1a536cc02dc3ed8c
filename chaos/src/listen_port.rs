//! Listen addresses for the processes a run starts and restarts.
//!
//! A node killed by a fault comes back on the same address, seconds later. An address taken
//! from the kernel's ephemeral range (binding port 0) is free when it is chosen, but while its
//! node is down the kernel may hand the same port to any outgoing connection as its source
//! port, and a run makes thousands (the proxies, the clients, the kernels); the restarted
//! node then cannot bind, the cluster never converges, and the run fails for a reason that is
//! not the system's. So ports are taken below the ephemeral range, where the kernel never
//! picks a source port.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU16, Ordering};

use anyhow::Context;

/// The kernel's ephemeral range on Linux, read at run time; this default elsewhere.
const DEFAULT_EPHEMERAL_START: u16 = 32_768;
/// The lowest port handed out: above the well-known and the commonly configured services.
const LOWEST_PORT: u16 = 20_000;
/// Candidates tried before giving up.
const MAX_TRIES: u16 = 512;

/// The next candidate's offset in the range, per process (runs in one process never reuse a
/// port while it may still be in use by an earlier one).
static NEXT_OFFSET: AtomicU16 = AtomicU16::new(0);

/// A free address on 127.0.0.1 whose port lies below the kernel's ephemeral range.
pub fn reserved_listen_addr() -> anyhow::Result<SocketAddr> {
    let (low, high) = port_range();
    let span = high - low;
    // Processes started side by side (tests) start at different points of the range.
    let start = (std::process::id() % u32::from(span)) as u16;
    for _ in 0..MAX_TRIES.min(span) {
        let offset = NEXT_OFFSET.fetch_add(1, Ordering::Relaxed);
        let port = low + (start.wrapping_add(offset) % span);
        if let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
            return listener.local_addr().context("read the bound address");
        }
    }
    anyhow::bail!("no free port on 127.0.0.1 in {low}..{high} after {MAX_TRIES} tries")
}

/// `[LOWEST_PORT, start of the ephemeral range)`.
fn port_range() -> (u16, u16) {
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(DEFAULT_EPHEMERAL_START);
    let high = ephemeral_start.max(LOWEST_PORT + 1_000);
    (LOWEST_PORT, high)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_free_loopback_and_below_the_ephemeral_range() {
        let (low, high) = port_range();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let addr = reserved_listen_addr().expect("a free port");
            assert!(addr.ip().is_loopback());
            assert!(
                (low..high).contains(&addr.port()),
                "{addr} outside {low}..{high}"
            );
            assert!(seen.insert(addr.port()), "{addr} handed out twice");
            TcpListener::bind(addr).expect("the address is free to bind");
        }
    }
}
