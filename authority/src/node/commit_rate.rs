//! How fast this node's proposed commands are answered while it has a queue: the rate half of
//! load shedding (docs/spec.md §5.6: a leader sheds new commands when more are in flight than
//! it commits within the deadline at its current rate). Commands, not entries: entries grow
//! with the load (the coalescer puts whatever waits into one), so a burst is a few entries but
//! many commands, and it is the commands that take apply time.
//!
//! The rate is counted over whole windows of [`WINDOW`] during which commands waited
//! throughout. A window in which the queue emptied says how much was asked, not how much the
//! leader can commit (one caller at a time commits at its own pace), so it gives no rate, and
//! the rule then does not apply: a burst after a quiet spell is judged by its age alone. A
//! window in which commands waited throughout and none was answered gives a rate of zero.

use std::time::{Duration, Instant};

/// The span a rate is counted over.
pub const WINDOW: Duration = Duration::from_secs(1);

/// A rate is used for at most this long after its window ended: an older one may describe a
/// leader that has since caught up or fallen behind.
const FRESH_FOR: Duration = Duration::from_secs(2);

/// Answers counted over the current window, and the rate of the last busy one.
#[derive(Debug)]
pub struct CommitRate {
    window_start: Instant,
    answered: u64,
    /// The queue was empty at some moment of the current window.
    emptied: bool,
    last: Option<Measured>,
}

/// The rate of one window during which proposals waited throughout.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Measured {
    per_s: f64,
    ended: Instant,
}

impl CommitRate {
    /// A tracker whose first window starts at `now` with an empty queue.
    pub fn new(now: Instant) -> Self {
        Self {
            window_start: now,
            answered: 0,
            emptied: true,
            last: None,
        }
    }

    /// `count` commands were answered at `now`, leaving `pending` others waiting.
    pub fn answered(&mut self, now: Instant, count: usize, pending: usize) {
        self.roll(now, pending + count);
        self.answered += count as u64;
        if pending == 0 {
            self.emptied = true;
        }
    }

    /// Closes the windows that ended by `now`; `pending` commands wait at `now`, as they did
    /// since the last call.
    pub fn roll(&mut self, now: Instant, pending: usize) {
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed < WINDOW {
            return;
        }
        self.last = if self.emptied {
            None
        } else {
            // Answers over the window's whole span; a call after a silence closes a window
            // longer than `WINDOW`, in which nothing was answered after its first second.
            let seconds = elapsed.as_secs_f64();
            Some(Measured {
                per_s: self.answered as f64 / seconds,
                ended: now,
            })
        };
        self.window_start = now;
        self.answered = 0;
        self.emptied = pending == 0;
    }

    /// Commands answered per second over the last window in which commands waited
    /// throughout, if it ended within [`FRESH_FOR`] of `now`.
    pub fn per_s(&self, now: Instant) -> Option<f64> {
        let last = self.last?;
        (now.saturating_duration_since(last.ended) <= FRESH_FOR).then_some(last.per_s)
    }
}

/// How long a command proposed now would wait behind `pending` others at `per_s` answers a
/// second: `None` when nothing is being answered (it would wait for ever).
pub fn expected_wait(pending: usize, per_s: f64) -> Option<Duration> {
    (per_s > 0.0).then(|| Duration::from_secs_f64(pending as f64 / per_s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_window_with_a_queue_throughout_gives_its_rate() {
        let t0 = Instant::now();
        let mut rate = CommitRate::new(t0);
        // The queue fills and stays: the window after the one it filled in is busy throughout,
        // with 500 commands answered in its second, two an entry.
        rate.roll(t0 + ms(1_000), 1_000);
        for i in 0..250u64 {
            rate.answered(t0 + ms(1_000 + i * 4), 2, 900);
        }
        assert_eq!(rate.per_s(t0 + ms(1_999)), None, "the window is still open");
        rate.roll(t0 + ms(2_000), 900);
        let per_s = rate.per_s(t0 + ms(2_000)).expect("a busy window");
        assert!((per_s - 500.0).abs() < 1e-6, "{per_s}");
        // Used while fresh, then not.
        assert_eq!(rate.per_s(t0 + ms(4_000)), Some(per_s));
        assert_eq!(rate.per_s(t0 + ms(4_001)), None);
    }

    #[test]
    fn a_window_in_which_the_queue_emptied_gives_no_rate() {
        let t0 = Instant::now();
        let mut rate = CommitRate::new(t0);
        // One caller at a time: every answer empties the queue.
        for i in 0..100u64 {
            rate.roll(t0 + ms(i * 10), 0);
            rate.answered(t0 + ms(i * 10 + 5), 1, 0);
        }
        rate.roll(t0 + ms(1_000), 0);
        assert_eq!(rate.per_s(t0 + ms(1_000)), None);
        // The next window starts empty too: still no rate after it, however slow.
        rate.roll(t0 + ms(2_000), 5);
        assert_eq!(rate.per_s(t0 + ms(2_000)), None);
    }

    #[test]
    fn a_queue_that_waits_a_whole_window_unanswered_gives_zero() {
        let t0 = Instant::now();
        let mut rate = CommitRate::new(t0);
        // A window that ends with proposals waiting starts the next one busy.
        rate.roll(t0 + ms(1_000), 300);
        assert_eq!(rate.per_s(t0 + ms(1_000)), None, "the first window emptied");
        rate.roll(t0 + ms(2_000), 300);
        assert_eq!(rate.per_s(t0 + ms(2_000)), Some(0.0));
        assert_eq!(
            expected_wait(300, 0.0),
            None,
            "nothing answered: no end to the wait"
        );
    }

    #[test]
    fn a_silence_spreads_the_answers_over_the_whole_span() {
        let t0 = Instant::now();
        let mut rate = CommitRate::new(t0);
        rate.roll(t0 + ms(1_000), 50);
        rate.answered(t0 + ms(1_100), 100, 50);
        // Nothing more until 4 s: 100 answers over 3 s.
        rate.roll(t0 + ms(4_000), 50);
        let per_s = rate.per_s(t0 + ms(4_000)).expect("busy");
        assert!((per_s - 100.0 / 3.0).abs() < 1e-6, "{per_s}");
    }

    #[test]
    fn the_wait_is_the_queue_over_the_rate() {
        assert_eq!(expected_wait(2_000, 1_000.0), Some(Duration::from_secs(2)));
        assert_eq!(expected_wait(0, 1_000.0), Some(Duration::ZERO));
    }
}
