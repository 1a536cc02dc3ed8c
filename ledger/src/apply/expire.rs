//! `ExpireHolds` (internal, leader-proposed): reverse due Authorized holds in
//! `(expires_at_ms, hold_id)` order, at most 256 per command.

use crate::cluster_time::ClusterParams;
use crate::decision::{Decision, Outcome};
use crate::family::{Family, Step};
use crate::hold::HoldSlot;
use crate::ids::EventId;
use crate::limits::MAX_EXPIRED_PER_COMMAND;

use super::hold_lookup::expire_hold;

impl Family {
    pub(crate) fn expire_due(&mut self, up_to_ms: u64, step: &mut Step<'_>) -> Decision {
        let horizon = up_to_ms.min(step.now_ms());
        let due: Vec<_> = self
            .expiry_index
            .iter()
            .take_while(|(at, _)| *at <= horizon)
            .take(MAX_EXPIRED_PER_COMMAND + 1)
            .cloned()
            .collect();
        let more_due = due.len() > MAX_EXPIRED_PER_COMMAND;
        let mut first_index = None;
        let mut hold_ids = Vec::new();
        for (_, hold_id) in due.into_iter().take(MAX_EXPIRED_PER_COMMAND) {
            let (holds, mut books) = self.split();
            let hold = match holds.get_mut(&hold_id) {
                Some(HoldSlot::Live(hold)) => std::sync::Arc::make_mut(hold),
                other => panic!("expiry index names hold {hold_id}, found {other:?}"),
            };
            let index = expire_hold(hold, &mut books, step);
            first_index.get_or_insert(index);
            hold_ids.push(hold_id);
        }
        let event_id = EventId::new(format!("auto:expire-holds:{up_to_ms}"));
        Family::decided(
            &event_id,
            Outcome::HoldsExpired { hold_ids, more_due },
            first_index,
            step,
        )
    }

    /// The earliest expiry of an Authorized hold: when the leader should propose `ExpireHolds`.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.expiry_index.first().map(|(at, _)| *at)
    }

    /// The earliest time compaction has work under `params`: an idle family needs a command
    /// by then.
    pub fn next_compaction_ms(&self, params: &ClusterParams) -> Option<u64> {
        self.compaction_queue
            .first_key()
            .map(|key| params.compaction_due_ms(key).saturating_add(1))
    }
}
