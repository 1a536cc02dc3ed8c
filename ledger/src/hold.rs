//! Holds: two-phase reservations against one or more accounts of a family (docs/spec.md §3).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::account::AccountKey;
use crate::commit_index::BudgetCommitIndex;
use crate::ids::{AttemptId, CapabilityId, EventId, HoldId};

/// A hold's accounts. Most holds reserve on their grant's account alone, which sits inline in
/// the hold: no allocation per hold.
pub type HoldAccounts = smallvec::SmallVec<[AccountKey; 1]>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum InvocationState {
    Authorized,
    Captured,
    Reversed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MonetaryState {
    None,
    Exposed,
    Released,
    Reconciled,
    Reversed,
}

/// Both state machines of a hold, as journaled before and after each transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldStates {
    pub invocation: InvocationState,
    pub monetary: MonetaryState,
}

/// An event that moved a hold, kept so receipts and reconcilers can name it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldTransition {
    pub event_id: EventId,
    pub commit_index: BudgetCommitIndex,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub hold_id: HoldId,
    pub capability_id: CapabilityId,
    pub grant_index: u32,
    /// The grant account first, then up to 7 ancestor accounts (docs/spec.md §8).
    pub accounts: HoldAccounts,
    pub authorized_exposure_units: u64,
    pub remaining_exposure_units: u64,
    pub released_units: u64,
    pub reversed_units: u64,
    pub realized_units: u64,
    pub unspent_units: u64,
    pub invocation_state: InvocationState,
    pub monetary_state: MonetaryState,
    pub expires_at_ms: Option<u64>,
    pub created_at_ms: u64,
    pub capture_attempt_id: Option<AttemptId>,
    pub authorized: HoldTransition,
    pub captured: Option<HoldTransition>,
    pub last_release: Option<HoldTransition>,
    /// The reverse, cancel, expiry or reconcile that ended the hold.
    pub terminal: Option<HoldTransition>,
    pub terminal_at_ms: Option<u64>,
}

impl Hold {
    pub fn states(&self) -> HoldStates {
        HoldStates {
            invocation: self.invocation_state,
            monetary: self.monetary_state,
        }
    }

    pub fn is_terminal(&self) -> bool {
        self.invocation_state == InvocationState::Reversed
            || self.monetary_state == MonetaryState::Reconciled
    }

    /// Authorized and past its expiry at cluster time `now_ms`. Captured holds never expire.
    pub fn is_expired_at(&self, now_ms: u64) -> bool {
        self.invocation_state == InvocationState::Authorized
            && self.expires_at_ms.is_some_and(|at| at <= now_ms)
    }

    /// `authorized = realized + unspent + released + reversed + remaining` (docs/spec.md §3).
    pub fn assert_conserved(&self) {
        let parts = [
            self.realized_units,
            self.unspent_units,
            self.released_units,
            self.reversed_units,
            self.remaining_exposure_units,
        ];
        let sum = parts
            .iter()
            .try_fold(0u64, |acc, part| acc.checked_add(*part));
        assert_eq!(
            sum,
            Some(self.authorized_exposure_units),
            "hold {}: exposure not conserved: {parts:?} vs authorized {}",
            self.hold_id,
            self.authorized_exposure_units
        );
    }

    /// Nothing can move it any more but, for a captured call with no exposure, a cancel
    /// before dispatch; past retention it may be archived.
    pub fn is_final(&self) -> bool {
        self.is_terminal()
            || (self.invocation_state == InvocationState::Captured
                && self.authorized_exposure_units == 0)
    }

    /// The archive record of this final hold (`Family::compact`). Its ids are shared
    /// (`Arc<str>`), so the clones are reference counts, and a hold a snapshot's cut still
    /// shares is archived without copying it.
    pub(crate) fn archive(&self) -> ArchivedHold {
        assert!(
            self.is_final(),
            "hold {} archived before it was final",
            self.hold_id
        );
        ArchivedHold {
            capability_id: self.capability_id.clone(),
            grant_index: self.grant_index,
            states: self.states(),
            capture_attempt_id: self.capture_attempt_id.clone(),
            captured: self.captured.clone(),
            terminal: self.terminal.clone(),
        }
    }
}

/// A terminal hold after retention: just enough to answer replays and later commands exactly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchivedHold {
    pub capability_id: CapabilityId,
    pub grant_index: u32,
    pub states: HoldStates,
    pub capture_attempt_id: Option<AttemptId>,
    pub captured: Option<HoldTransition>,
    pub terminal: Option<HoldTransition>,
}

/// What a claimed `hold_id` names. The holds are behind `Arc`s so that a copy of a shard of
/// the holds table (the first write to it after a snapshot's cut) copies pointers, not every
/// hold: allocating a copy of each hold was 40% of the CPU of a 1.8 s stall when compaction
/// ran through every shard during a snapshot (docs/benchmarks.md, "Snapshots without a
/// stall"). A hold is copied only when a command touches it while a cut shares it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HoldSlot {
    Live(Arc<Hold>),
    /// A denied authorize claims the id without opening a hold.
    Denied {
        event_id: EventId,
    },
    Archived(Arc<ArchivedHold>),
}

/// A read of one hold (docs/spec.md §7).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HoldView {
    Live(Hold),
    Denied { hold_id: HoldId, event_id: EventId },
    Archived { hold_id: HoldId, hold: ArchivedHold },
}

impl HoldView {
    pub fn states(&self) -> Option<HoldStates> {
        match self {
            Self::Live(hold) => Some(hold.states()),
            Self::Denied { .. } => None,
            Self::Archived { hold, .. } => Some(hold.states),
        }
    }
}
