//! Fail-closed receipt logging. The receipt log is a node's audit trail, so a node whose log
//! stopped taking appends must not go on deciding calls nobody can audit: after the first
//! failed append it refuses every new call (before any hold) until it is restarted with a
//! working log, and says so through gRPC health and `/metrics`. A call already under way runs
//! to its end, since unwinding a dispatched call is the one thing the pipeline never does.
//! There is no automatic reopening: whether the disk is healthy again is an operator's call.

use tokio::sync::watch;

/// Longest failure text kept (it goes into every refusal).
pub const MAX_FAILURE_BYTES: usize = 512;

#[derive(Debug)]
pub struct ReceiptGate {
    /// The first append failure, once there was one. A watch channel so the server can flip
    /// its health status the moment it happens.
    failure: watch::Sender<Option<String>>,
}

impl Default for ReceiptGate {
    fn default() -> Self {
        Self {
            failure: watch::channel(None).0,
        }
    }
}

impl ReceiptGate {
    /// Closes the gate for good; the first failure is the one reported.
    pub fn trip(&self, failure: &str) {
        let failure = tally_api::text::bounded(failure, MAX_FAILURE_BYTES);
        self.failure.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(failure.to_owned());
            true
        });
    }

    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.failure.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_closes_the_gate_and_is_the_one_reported() {
        let gate = ReceiptGate::default();
        let mut watching = gate.subscribe();
        assert_eq!(gate.failure(), None);
        gate.trip(&"é".repeat(MAX_FAILURE_BYTES));
        let first = gate.failure().expect("closed");
        assert!(first.len() <= MAX_FAILURE_BYTES);
        assert!(watching.has_changed().expect("open channel"));
        watching.mark_unchanged();
        gate.trip("a later failure");
        assert_eq!(gate.failure(), Some(first));
        assert!(!watching.has_changed().expect("open channel"));
    }
}
