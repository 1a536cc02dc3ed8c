//! Wall-clock time for stamping entries, and the clock-offset rule of docs/spec.md §6: a node whose
//! clock differs from a majority of its peers by more than `max_clock_offset_ms` refuses to
//! lead and reports itself unhealthy (CockroachDB's rule).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; a clock before 1970 reads as 0.
pub fn wall_clock_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// This node's clock: the wall clock plus a configured offset. The offset is 0 in production;
/// tests set it to make one node's clock disagree with its peers' (docs/spec.md §6).
#[derive(Debug, Default)]
pub struct NodeClock {
    offset_ms: AtomicI64,
}

impl NodeClock {
    pub fn new(offset_ms: i64) -> Self {
        Self {
            offset_ms: AtomicI64::new(offset_ms),
        }
    }

    pub fn now_ms(&self) -> u64 {
        let now = wall_clock_ms() as i64 + self.offset_ms.load(Ordering::Relaxed);
        now.max(0) as u64
    }

    pub fn set_offset_ms(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::Relaxed);
    }
}

/// One peer's clock as probed: the offset estimate is the peer's reading minus the midpoint of
/// the probe's round trip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockSample {
    pub sent_ms: u64,
    pub peer_ms: u64,
    pub received_ms: u64,
}

impl ClockSample {
    pub fn offset_ms(&self) -> i64 {
        let midpoint = self.sent_ms / 2 + self.received_ms / 2;
        self.peer_ms as i64 - midpoint as i64
    }

    /// Half the probe's round trip: the peer read its clock somewhere within it, so the true
    /// offset is within this of [`Self::offset_ms`].
    pub fn uncertainty_ms(&self) -> u64 {
        self.received_ms.saturating_sub(self.sent_ms) / 2
    }

    /// Whether the probe's round trip was short enough to judge the peer by: its uncertainty
    /// at most half of `max_offset_ms`. A longer one (a stalled node at either end) counts
    /// neither way, so that a stall can neither make a healthy clock look off nor let any
    /// offset pass.
    pub fn is_conclusive(&self, max_offset_ms: u64) -> bool {
        self.uncertainty_ms() <= max_offset_ms / 2
    }

    /// Whether the peer's clock may be within `max_offset_ms` of this node's: only a sample
    /// whose whole uncertainty lies beyond the bound shows the clocks apart (CockroachDB
    /// counts a remote clock out of bounds the same way). Judged by the estimate alone, a
    /// probe that waited 2.5 s on a node busy installing a snapshot read as 1.3 s off and
    /// handed leadership away from a healthy clock. Meaningful for a conclusive sample.
    pub fn may_agree_within(&self, max_offset_ms: u64) -> bool {
        let off_at_least = self
            .offset_ms()
            .unsigned_abs()
            .saturating_sub(self.uncertainty_ms());
        off_at_least <= max_offset_ms
    }
}

/// What one probe says of a peer's clock: `Some(true)` it may agree, `Some(false)` it is off
/// or the peer did not answer (`None` sample), `None` the probe was too slow to judge by
/// (`ClockSample::is_conclusive`).
pub fn verdict(sample: Option<&ClockSample>, max_offset_ms: u64) -> Option<bool> {
    match sample {
        None => Some(false),
        Some(s) if s.is_conclusive(max_offset_ms) => Some(s.may_agree_within(max_offset_ms)),
        Some(_) => None,
    }
}

/// This node's verdicts on its peers' clocks: how many members agree with it (itself
/// included) and how many were judged (itself included; a probe too slow to judge by is not).
fn judged(samples: &[Option<ClockSample>], max_offset_ms: u64) -> (usize, usize) {
    let verdicts = samples
        .iter()
        .filter_map(|s| verdict(s.as_ref(), max_offset_ms));
    verdicts.fold((1, 1), |(agreeing, judged), agrees| {
        (agreeing + usize::from(agrees), judged + 1)
    })
}

/// Whether this node's clock is within `max_offset_ms` of a majority of the cluster (itself
/// included, with offset 0), over the peers a probe could judge ([`verdict`]).
pub fn within_majority(samples: &[Option<ClockSample>], max_offset_ms: u64) -> bool {
    let (agreeing, judged) = judged(samples, max_offset_ms);
    agreeing * 2 > judged
}

/// Whether this node and the peers whose probes were conclusive *and agreed* make a majority of
/// all the members (this node and one sample per peer): stronger than [`within_majority`], which
/// leaves a probe too slow to judge by out of the count (and holds before the first round).
/// What a leader needs before it moves cluster time more than a step on its own clock
/// (`cluster_time_keeper.rs`).
pub fn confirmed_by_majority(samples: &[Option<ClockSample>], max_offset_ms: u64) -> bool {
    let (agreeing, _) = judged(samples, max_offset_ms);
    agreeing * 2 > samples.len() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(offset: i64) -> Option<ClockSample> {
        Some(ClockSample {
            sent_ms: 1_000,
            peer_ms: (1_010 + offset) as u64,
            received_ms: 1_020,
        })
    }

    #[test]
    fn only_conclusive_agreement_of_a_majority_confirms_a_clock() {
        assert!(
            confirmed_by_majority(&[], 500),
            "a single node confirms itself"
        );
        assert!(confirmed_by_majority(&[sample(0), None], 500));
        assert!(confirmed_by_majority(&[sample(0), sample(900)], 500));
        assert!(
            !confirmed_by_majority(&[None, None], 500),
            "unanswered probes confirm nothing"
        );
        assert!(!confirmed_by_majority(&[sample(900), sample(900)], 500));
        assert!(!confirmed_by_majority(&[sample(0), None, None, None], 500));
    }

    #[test]
    fn a_node_agreeing_with_a_majority_is_healthy() {
        assert!(within_majority(&[sample(0), sample(900)], 500));
        assert!(
            within_majority(&[], 500),
            "a single node agrees with itself"
        );
    }

    /// A slow probe cannot tell a clock 1.2 s off from one a few ms off: its uncertainty
    /// (half the round trip) spans both, so it counts neither way; a quick probe with the
    /// same estimate counts against the node, and one whose uncertainty reaches back inside
    /// the bound does not.
    #[test]
    fn only_a_probe_whose_uncertainty_excludes_the_bound_shows_the_clocks_apart() {
        let probe = |sent_ms, peer_ms, received_ms| ClockSample {
            sent_ms,
            peer_ms,
            received_ms,
        };
        let slow = probe(10_000, 12_700, 13_000);
        assert_eq!((slow.offset_ms(), slow.uncertainty_ms()), (1_200, 1_500));
        assert!(!slow.is_conclusive(500));
        assert_eq!(verdict(Some(&slow), 500), None, "too slow to judge by");
        assert_eq!(
            verdict(None, 500),
            Some(false),
            "a silent peer does not vouch"
        );
        assert!(within_majority(&[Some(slow), Some(slow)], 500));
        let skewed = sample(2_000).expect("a sample");
        assert!(
            !within_majority(&[Some(slow), Some(skewed)], 500),
            "a slow probe does not outvote a quick one that shows the clocks apart"
        );
        let near = probe(10_000, 10_850, 10_400);
        assert_eq!((near.offset_ms(), near.uncertainty_ms()), (650, 200));
        assert!(near.is_conclusive(500) && near.may_agree_within(500));
        assert_eq!(verdict(Some(&near), 500), Some(true));
        let quick = probe(10_000, 11_210, 10_020);
        assert_eq!((quick.offset_ms(), quick.uncertainty_ms()), (1_200, 10));
        assert!(!quick.may_agree_within(500));
        assert_eq!(verdict(Some(&quick), 500), Some(false));
        assert!(!within_majority(&[Some(quick), Some(quick)], 500));
    }

    #[test]
    fn a_node_off_from_most_peers_is_not() {
        assert!(!within_majority(&[sample(-700), sample(900)], 500));
        assert!(
            !within_majority(&[None, sample(900)], 500),
            "silent peers do not vouch"
        );
        assert!(!within_majority(
            &[sample(600), sample(600), sample(0), None],
            500
        ));
    }
}
