//! The WAN between the regions: a router in its own network namespace that holds every packet
//! it forwards for the one-way delay between the sender's and the receiver's regions, and
//! drops the packets of a region that is cut off.
//!
//! The kernel's `netem` queueing discipline would do this, but its module is not on this
//! machine, so the delay is done in user space, on IP packets: every veth of the router sends
//! what it receives into the TUN device `tin` (policy routing), this thread reads each packet,
//! keeps it in a FIFO per (source region, destination region) pair until its time, and writes
//! it to the TUN device `tout`, from where the kernel routes it on to its destination's veth.
//! A FIFO per pair with one delay per pair keeps every TCP stream in order, and nothing limits
//! bandwidth (unlike the chaos harness's proxies, which are for faults, not for distance).

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Packets held at once on one (source, destination) pair; one more is dropped and counted,
/// as a router with a full buffer would.
pub const MAX_QUEUED_PER_PAIR: usize = 65_536;

/// Regions the router tells apart (the cut set is a bit mask of them).
pub const MAX_REGIONS: usize = 32;

/// The largest IP packet read from the TUN device (its MTU is 1,500; GSO is off).
const MAX_PACKET_BYTES: usize = 65_536;

/// How long the router waits for a packet when none is due, so that it sees `stop` in time.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// Who is where and how far apart: the region of each address, and the one-way delay of
/// every pair of regions.
#[derive(Clone, Debug)]
pub struct DelayPlan {
    region_of: BTreeMap<Ipv4Addr, usize>,
    /// `one_way[from][to]`.
    one_way: Vec<Vec<Duration>>,
}

impl DelayPlan {
    /// `one_way[from][to]` for `regions` regions; `region_of` places each address.
    pub fn new(region_of: BTreeMap<Ipv4Addr, usize>, one_way: Vec<Vec<Duration>>) -> Self {
        let regions = one_way.len();
        assert!(
            regions <= MAX_REGIONS,
            "the router tells at most {MAX_REGIONS} regions apart"
        );
        assert!(
            one_way.iter().all(|row| row.len() == regions),
            "the delay matrix is square"
        );
        assert!(
            region_of.values().all(|region| *region < regions),
            "every address is in a region of the matrix"
        );
        Self { region_of, one_way }
    }

    /// The (source, destination) regions of an IPv4 packet, if both addresses are known.
    fn route(&self, packet: &[u8]) -> Option<(usize, usize)> {
        if packet.len() < 20 || packet[0] >> 4 != 4 {
            return None;
        }
        let address =
            |at: usize| Ipv4Addr::new(packet[at], packet[at + 1], packet[at + 2], packet[at + 3]);
        let from = *self.region_of.get(&address(12))?;
        let to = *self.region_of.get(&address(16))?;
        Some((from, to))
    }
}

/// What the router did, and the switch that cuts regions off; shared with the bench.
#[derive(Debug, Default)]
pub struct RouterControl {
    /// Bit `r` set: region `r` is cut off (its packets, both ways, are dropped).
    cut: AtomicU32,
    stop: AtomicBool,
    pub forwarded: AtomicU64,
    /// Dropped because a region was cut off.
    pub dropped_cut: AtomicU64,
    /// Dropped because a pair's queue was full, or not IPv4 between known addresses.
    pub dropped_other: AtomicU64,
}

impl RouterControl {
    pub fn cut_off(&self, region: usize) {
        assert!(region < MAX_REGIONS, "region {region} out of range");
        self.cut.fetch_or(1 << region, Ordering::SeqCst);
    }

    pub fn heal(&self) {
        self.cut.store(0, Ordering::SeqCst);
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Whether packets between the two regions are lost: a region cut off loses its links to
    /// every other region, while its own hosts go on talking to each other.
    fn is_cut(&self, from: usize, to: usize) -> bool {
        let cut = self.cut.load(Ordering::Relaxed);
        from != to && (cut & (1 << from) != 0 || cut & (1 << to) != 0)
    }
}

/// The packets waiting, one FIFO per (source, destination) pair.
struct DelayQueues {
    plan: DelayPlan,
    queues: BTreeMap<(usize, usize), VecDeque<(Instant, Vec<u8>)>>,
}

/// What became of a packet offered to the queues.
#[derive(Debug, PartialEq, Eq)]
enum Offered {
    Queued,
    DroppedCut,
    DroppedOther,
}

impl DelayQueues {
    fn new(plan: DelayPlan) -> Self {
        Self {
            plan,
            queues: BTreeMap::new(),
        }
    }

    fn offer(&mut self, packet: Vec<u8>, now: Instant, control: &RouterControl) -> Offered {
        let Some((from, to)) = self.plan.route(&packet) else {
            return Offered::DroppedOther;
        };
        if control.is_cut(from, to) {
            return Offered::DroppedCut;
        }
        let queue = self.queues.entry((from, to)).or_default();
        if queue.len() >= MAX_QUEUED_PER_PAIR {
            return Offered::DroppedOther;
        }
        queue.push_back((now + self.plan.one_way[from][to], packet));
        Offered::Queued
    }

    /// Every packet due at `now`, each pair's in order; packets of a pair cut off since they
    /// were queued are dropped (counted in `dropped`).
    fn take_due(
        &mut self,
        now: Instant,
        control: &RouterControl,
        dropped: &mut u64,
    ) -> Vec<Vec<u8>> {
        let mut due = Vec::new();
        for (&(from, to), queue) in &mut self.queues {
            while queue.front().is_some_and(|(at, _)| *at <= now) {
                let (_, packet) = queue.pop_front().expect("a front was seen");
                if control.is_cut(from, to) {
                    *dropped += 1;
                } else {
                    due.push(packet);
                }
            }
        }
        due
    }

    /// When the next packet falls due, if any waits.
    fn next_due(&self) -> Option<Instant> {
        self.queues
            .values()
            .filter_map(|queue| queue.front().map(|(at, _)| *at))
            .min()
    }
}

/// A TUN device (IP packets, no extra header) opened in the calling thread's network
/// namespace.
pub fn open_tun(name: &str) -> anyhow::Result<File> {
    const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        flags: libc::c_short,
        pad: [u8; 22],
    }
    anyhow::ensure!(name.len() < 16, "interface name {name} is too long");
    // SAFETY: a NUL-terminated path, flags the call documents; the result is checked.
    let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_NONBLOCK) };
    anyhow::ensure!(
        fd >= 0,
        "cannot open /dev/net/tun: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let file = unsafe { File::from_raw_fd(fd) };
    let mut request = IfReq {
        name: [0; 16],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        pad: [0; 22],
    };
    request.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads an `ifreq` (name, then flags), which `IfReq` lays out.
    let status = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut request) };
    anyhow::ensure!(
        status >= 0,
        "cannot create the TUN device {name}: {}",
        std::io::Error::last_os_error()
    );
    Ok(file)
}

/// Forwards packets from `inbound` to `outbound` after their delay until `control` says stop.
/// Runs on its own thread; the TUN devices were opened in the router's namespace.
pub fn run(mut inbound: File, mut outbound: File, plan: DelayPlan, control: Arc<RouterControl>) {
    let mut queues = DelayQueues::new(plan);
    let mut buffer = vec![0u8; MAX_PACKET_BYTES];
    while !control.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let wait = queues.next_due().map_or(IDLE_WAIT, |due| {
            due.saturating_duration_since(now).min(IDLE_WAIT)
        });
        wait_readable(&inbound, wait);
        loop {
            match inbound.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => {
                    let counter = match queues.offer(buffer[..n].to_vec(), Instant::now(), &control)
                    {
                        Offered::Queued => None,
                        Offered::DroppedCut => Some(&control.dropped_cut),
                        Offered::DroppedOther => Some(&control.dropped_other),
                    };
                    if let Some(counter) = counter {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => {
                    eprintln!("tally-bench regions: the delay router stopped reading: {error}");
                    return;
                }
            }
        }
        let mut dropped = 0;
        for packet in queues.take_due(Instant::now(), &control, &mut dropped) {
            // A full TUN queue drops the packet, as a busy link would; TCP sends it again.
            if outbound.write(&packet).is_ok() {
                control.forwarded.fetch_add(1, Ordering::Relaxed);
            } else {
                control.dropped_other.fetch_add(1, Ordering::Relaxed);
            }
        }
        control.dropped_cut.fetch_add(dropped, Ordering::Relaxed);
    }
}

/// Waits until `file` has a packet or `wait` passes (to the microsecond: `ppoll`).
fn wait_readable(file: &File, wait: Duration) {
    let mut poll = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = libc::timespec {
        tv_sec: wait.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(wait.subsec_nanos() as i32),
    };
    // SAFETY: one valid pollfd and a valid timespec; no signal mask.
    unsafe {
        libc::ppoll(&mut poll, 1, &timeout, std::ptr::null());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(from: [u8; 4], to: [u8; 4], tag: u8) -> Vec<u8> {
        let mut bytes = vec![0u8; 24];
        bytes[0] = 0x45;
        bytes[12..16].copy_from_slice(&from);
        bytes[16..20].copy_from_slice(&to);
        bytes[20] = tag;
        bytes
    }

    fn plan() -> DelayPlan {
        let ms = Duration::from_millis;
        DelayPlan::new(
            [([10, 0, 0, 1], 0), ([10, 0, 0, 2], 0), ([10, 0, 1, 1], 1)]
                .into_iter()
                .map(|(ip, region)| (Ipv4Addr::from(ip), region))
                .collect(),
            vec![vec![ms(1), ms(15)], vec![ms(15), ms(1)]],
        )
    }

    #[test]
    fn a_packet_waits_for_its_pairs_delay_and_each_pair_keeps_its_order() {
        let control = RouterControl::default();
        let mut queues = DelayQueues::new(plan());
        let start = Instant::now();
        let far = |tag| packet([10, 0, 0, 1], [10, 0, 1, 1], tag);
        let near = packet([10, 0, 0, 1], [10, 0, 0, 2], 9);
        assert_eq!(queues.offer(far(1), start, &control), Offered::Queued);
        assert_eq!(queues.offer(far(2), start, &control), Offered::Queued);
        assert_eq!(queues.offer(near.clone(), start, &control), Offered::Queued);
        let mut dropped = 0;
        let ms = Duration::from_millis;
        assert_eq!(
            queues.take_due(start + ms(1), &control, &mut dropped),
            vec![near],
            "only the packet within the region is due after 1 ms"
        );
        assert_eq!(queues.next_due(), Some(start + ms(15)));
        assert!(queues
            .take_due(start + ms(14), &control, &mut dropped)
            .is_empty());
        assert_eq!(
            queues.take_due(start + ms(15), &control, &mut dropped),
            vec![far(1), far(2)],
            "the far pair's packets come out at 15 ms, in the order they went in"
        );
        assert_eq!(dropped, 0);
        assert_eq!(queues.next_due(), None);
    }

    #[test]
    fn a_cut_region_loses_packets_both_ways_even_those_already_queued_until_healed() {
        let control = RouterControl::default();
        let mut queues = DelayQueues::new(plan());
        let start = Instant::now();
        let out = packet([10, 0, 0, 1], [10, 0, 1, 1], 1);
        let back = packet([10, 0, 1, 1], [10, 0, 0, 1], 2);
        let within = packet([10, 0, 0, 1], [10, 0, 0, 2], 3);
        assert_eq!(queues.offer(out.clone(), start, &control), Offered::Queued);
        control.cut_off(1);
        assert_eq!(
            queues.offer(back.clone(), start, &control),
            Offered::DroppedCut
        );
        control.cut_off(0);
        assert_eq!(
            queues.offer(within.clone(), start, &control),
            Offered::Queued,
            "hosts of a region cut off still reach each other"
        );
        control.heal();
        control.cut_off(1);
        let mut dropped = 0;
        let later = start + Duration::from_secs(1);
        assert_eq!(queues.take_due(later, &control, &mut dropped), vec![within]);
        assert_eq!(dropped, 1, "the packet queued before the cut is lost too");
        control.heal();
        assert_eq!(queues.offer(back.clone(), start, &control), Offered::Queued);
        assert_eq!(queues.take_due(later, &control, &mut dropped), vec![back]);
    }

    #[test]
    fn unknown_addresses_and_non_ipv4_packets_are_dropped_and_a_full_pair_drops_the_next() {
        let control = RouterControl::default();
        let mut queues = DelayQueues::new(plan());
        let now = Instant::now();
        let stranger = packet([10, 9, 9, 9], [10, 0, 0, 1], 0);
        assert_eq!(queues.offer(stranger, now, &control), Offered::DroppedOther);
        let mut ipv6 = packet([10, 0, 0, 1], [10, 0, 0, 2], 0);
        ipv6[0] = 0x60;
        assert_eq!(queues.offer(ipv6, now, &control), Offered::DroppedOther);
        assert_eq!(
            queues.offer(vec![0x45; 8], now, &control),
            Offered::DroppedOther
        );
        for _ in 0..MAX_QUEUED_PER_PAIR {
            let p = packet([10, 0, 0, 1], [10, 0, 0, 2], 0);
            assert_eq!(queues.offer(p, now, &control), Offered::Queued);
        }
        let p = packet([10, 0, 0, 1], [10, 0, 0, 2], 0);
        assert_eq!(queues.offer(p, now, &control), Offered::DroppedOther);
    }
}
