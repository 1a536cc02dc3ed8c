//! The last `RECENT_SAMPLES` durations of one span of a write's way through the leader, for the
//! stage breakdown `tally-bench` prints beside openraft's own stages. The commit histogram's
//! fixed buckets (`tally_commit_latency_seconds`) cannot tell 60 µs from 120 µs; a ring of
//! recent samples gives exact percentiles of a recent window in a fixed amount of memory.

use std::sync::Mutex;
use std::time::Duration;

use crate::unpoisoned;

/// Samples kept per span: as many as openraft keeps per stage, so both cover a like window.
pub const RECENT_SAMPLES: usize = 1_024;

/// The spans of a write on the node that serves it, nested: the request handler (decoded
/// request to built reply) holds the proposer's call (coalescing queue, checks, forwarding),
/// which holds Raft's `client_write` (openraft's stages, then the apply's answer).
#[derive(Debug, Default)]
pub struct WriteSpans {
    pub handler: RecentLatency,
    pub propose: RecentLatency,
    pub client_write: RecentLatency,
}

impl WriteSpans {
    /// `(label, span)`, outermost first, as `/metrics` names them.
    pub fn labelled(&self) -> [(&'static str, &RecentLatency); 3] {
        [
            ("handler", &self.handler),
            ("propose", &self.propose),
            ("client_write", &self.client_write),
        ]
    }
}

/// A ring of recent durations, in microseconds.
#[derive(Debug, Default)]
pub struct RecentLatency {
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    micros: Vec<u32>,
    /// Where the next sample goes once the ring is full.
    next: usize,
}

/// Percentiles over the ring's samples, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanPercentiles {
    pub p50: u32,
    pub p90: u32,
    pub p99: u32,
    pub samples: usize,
}

impl RecentLatency {
    /// Records one duration (saturating at `u32::MAX` µs, over an hour).
    pub fn record(&self, elapsed: Duration) {
        let micros = u32::try_from(elapsed.as_micros()).unwrap_or(u32::MAX);
        let mut ring = unpoisoned::lock(&self.ring);
        if ring.micros.len() < RECENT_SAMPLES {
            ring.micros.push(micros);
            return;
        }
        let at = ring.next;
        ring.micros[at] = micros;
        ring.next = (at + 1) % RECENT_SAMPLES;
    }

    /// The recent window's percentiles (nearest rank); `None` before the first sample.
    /// Sorts a copy at scrape time, so recording stays a push.
    pub fn percentiles(&self) -> Option<SpanPercentiles> {
        let mut sorted = unpoisoned::lock(&self.ring).micros.clone();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_unstable();
        let rank = |quantile: f64| {
            let index = (quantile * sorted.len() as f64).ceil() as usize;
            sorted[index.clamp(1, sorted.len()) - 1]
        };
        Some(SpanPercentiles {
            p50: rank(0.5),
            p90: rank(0.9),
            p99: rank(0.99),
            samples: sorted.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_cover_the_last_samples_only() {
        let recent = RecentLatency::default();
        assert_eq!(recent.percentiles(), None);
        for micros in 1..=100 {
            recent.record(Duration::from_micros(micros));
        }
        let p = recent.percentiles().expect("samples");
        assert_eq!((p.p50, p.p90, p.p99, p.samples), (50, 90, 99, 100));
        // A full ring of 1 ms samples pushes every earlier one out.
        for _ in 0..RECENT_SAMPLES {
            recent.record(Duration::from_millis(1));
        }
        let p = recent.percentiles().expect("samples");
        assert_eq!((p.p50, p.p99, p.samples), (1_000, 1_000, RECENT_SAMPLES));
        recent.record(Duration::from_secs(10_000));
        assert_eq!(
            recent.percentiles().expect("samples").samples,
            RECENT_SAMPLES
        );
        assert_eq!(
            recent.percentiles().expect("samples").p99,
            1_000,
            "one slow sample of 1,024 is above p99"
        );
    }
}
