//! Client-facing fault injection for tests: lose a request before it is proposed, or lose the
//! reply after the command committed, for chosen event ids. Compiled with the `testing` feature
//! only; production builds hold `inert::ServiceFaults`. Both failures reach the client as an
//! error without a Tally detail, exactly as a reset connection would: indefinite.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tally_ledger::{Command, EventId};

#[derive(Debug, Default)]
pub struct ServiceFaults {
    /// Set while any fault is armed, so the request path takes no lock in production.
    armed: AtomicBool,
    state: Mutex<FaultState>,
}

#[derive(Debug, Default)]
struct FaultState {
    /// Client commands with these ids are dropped before proposing, every time, until healed.
    drop_requests: BTreeSet<EventId>,
    /// The next reply carrying one of these ids is dropped after commit (once per id).
    drop_replies: BTreeSet<EventId>,
}

impl ServiceFaults {
    fn with<T>(&self, f: impl FnOnce(&mut FaultState) -> T) -> T {
        f(&mut self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    pub fn drop_requests_for(&self, event_id: EventId) {
        self.with(|s| s.drop_requests.insert(event_id));
        self.armed.store(true, Ordering::Release);
    }

    pub fn drop_reply_after_commit(&self, event_id: EventId) {
        self.with(|s| s.drop_replies.insert(event_id));
        self.armed.store(true, Ordering::Release);
    }

    pub fn heal(&self) {
        self.with(|s| *s = FaultState::default());
        self.armed.store(false, Ordering::Release);
    }

    /// Whether this request is lost before proposing (resolves are never dropped).
    pub fn drops_request(&self, commands: &[Command]) -> bool {
        if !self.armed.load(Ordering::Acquire) {
            return false;
        }
        self.with(|s| {
            !s.drop_requests.is_empty()
                && commands.iter().any(|c| matches!(c, Command::Apply(cmd) if s.drop_requests.contains(&cmd.header.event_id)))
        })
    }

    /// Whether this reply is lost after commit; consumes the fault.
    pub fn drops_reply(&self, commands: &[Command]) -> bool {
        if !self.armed.load(Ordering::Acquire) {
            return false;
        }
        self.with(|s| {
            let hit: Vec<EventId> = commands
                .iter()
                .filter_map(|c| match c {
                    Command::Apply(cmd) if s.drop_replies.contains(&cmd.header.event_id) => {
                        Some(cmd.header.event_id.clone())
                    }
                    _ => None,
                })
                .collect();
            for id in &hit {
                s.drop_replies.remove(id);
            }
            !hit.is_empty()
        })
    }
}
