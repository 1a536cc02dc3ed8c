//! Holds (docs/spec.md §3, §7): their state machines, the live hold, its archived form, the
//! `GetHold` view and the `ListHolds` filter.

use tally_ledger::hold::HoldTransition;
use tally_ledger::{
    ArchivedHold, BudgetCommitIndex, FamilyId, Hold, HoldFilter, HoldStates, HoldView,
    InvocationState, MonetaryState,
};

use super::{enum_field, optional_into, required, required_into};
use crate::error::WireError;
use crate::pb;

impl From<InvocationState> for pb::InvocationState {
    fn from(state: InvocationState) -> Self {
        match state {
            InvocationState::Authorized => Self::Authorized,
            InvocationState::Captured => Self::Captured,
            InvocationState::Reversed => Self::Reversed,
        }
    }
}

/// `UNSPECIFIED` has no domain meaning; the raw-number path (`invocation_state`) refuses it.
fn invocation_state(raw: i32, field: &str) -> Result<InvocationState, WireError> {
    match enum_field(raw, field)? {
        pb::InvocationState::Authorized => Ok(InvocationState::Authorized),
        pb::InvocationState::Captured => Ok(InvocationState::Captured),
        pb::InvocationState::Reversed => Ok(InvocationState::Reversed),
        pb::InvocationState::Unspecified => Err(WireError::missing(field)),
    }
}

impl From<MonetaryState> for pb::MonetaryState {
    fn from(state: MonetaryState) -> Self {
        match state {
            MonetaryState::None => Self::None,
            MonetaryState::Exposed => Self::Exposed,
            MonetaryState::Released => Self::Released,
            MonetaryState::Reconciled => Self::Reconciled,
            MonetaryState::Reversed => Self::Reversed,
        }
    }
}

fn monetary_state(raw: i32, field: &str) -> Result<MonetaryState, WireError> {
    match enum_field(raw, field)? {
        pb::MonetaryState::None => Ok(MonetaryState::None),
        pb::MonetaryState::Exposed => Ok(MonetaryState::Exposed),
        pb::MonetaryState::Released => Ok(MonetaryState::Released),
        pb::MonetaryState::Reconciled => Ok(MonetaryState::Reconciled),
        pb::MonetaryState::Reversed => Ok(MonetaryState::Reversed),
        pb::MonetaryState::Unspecified => Err(WireError::missing(field)),
    }
}

impl From<HoldStates> for pb::HoldStates {
    fn from(states: HoldStates) -> Self {
        Self {
            invocation: pb::InvocationState::from(states.invocation).into(),
            monetary: pb::MonetaryState::from(states.monetary).into(),
        }
    }
}

impl TryFrom<pb::HoldStates> for HoldStates {
    type Error = WireError;

    fn try_from(states: pb::HoldStates) -> Result<Self, WireError> {
        Ok(Self {
            invocation: invocation_state(states.invocation, "invocation")?,
            monetary: monetary_state(states.monetary, "monetary")?,
        })
    }
}

impl From<&HoldTransition> for pb::HoldTransition {
    fn from(transition: &HoldTransition) -> Self {
        Self {
            event_id: transition.event_id.to_string(),
            commit_index: transition.commit_index.0,
        }
    }
}

impl From<pb::HoldTransition> for HoldTransition {
    fn from(transition: pb::HoldTransition) -> Self {
        Self {
            event_id: transition.event_id.into(),
            commit_index: BudgetCommitIndex(transition.commit_index),
        }
    }
}

fn optional_transition(transition: Option<pb::HoldTransition>) -> Option<HoldTransition> {
    transition.map(Into::into)
}

/// Without its family, which the hold does not know: `of_family` and the replies set it.
impl From<&Hold> for pb::Hold {
    fn from(hold: &Hold) -> Self {
        Self {
            hold_id: hold.hold_id.to_string(),
            capability_id: hold.capability_id.to_string(),
            grant_index: hold.grant_index,
            accounts: hold.accounts.iter().map(Into::into).collect(),
            authorized_exposure_units: hold.authorized_exposure_units,
            remaining_exposure_units: hold.remaining_exposure_units,
            released_units: hold.released_units,
            reversed_units: hold.reversed_units,
            realized_units: hold.realized_units,
            unspent_units: hold.unspent_units,
            invocation_state: pb::InvocationState::from(hold.invocation_state).into(),
            monetary_state: pb::MonetaryState::from(hold.monetary_state).into(),
            expires_at_ms: hold.expires_at_ms,
            created_at_ms: hold.created_at_ms,
            capture_attempt_id: hold.capture_attempt_id.as_ref().map(ToString::to_string),
            authorized: Some((&hold.authorized).into()),
            captured: hold.captured.as_ref().map(Into::into),
            last_release: hold.last_release.as_ref().map(Into::into),
            terminal: hold.terminal.as_ref().map(Into::into),
            terminal_at_ms: hold.terminal_at_ms,
            family_id: String::new(),
        }
    }
}

impl pb::Hold {
    /// A hold of `family_id`, as a list read returns it.
    pub fn of_family(family_id: &FamilyId, hold: &Hold) -> Self {
        Self {
            family_id: family_id.to_string(),
            ..hold.into()
        }
    }
}

impl TryFrom<pb::Hold> for Hold {
    type Error = WireError;

    fn try_from(hold: pb::Hold) -> Result<Self, WireError> {
        let accounts: Vec<pb::AccountKey> = hold.accounts;
        Ok(Self {
            hold_id: hold.hold_id.into(),
            capability_id: hold.capability_id.into(),
            grant_index: hold.grant_index,
            accounts: accounts.into_iter().map(Into::into).collect(),
            authorized_exposure_units: hold.authorized_exposure_units,
            remaining_exposure_units: hold.remaining_exposure_units,
            released_units: hold.released_units,
            reversed_units: hold.reversed_units,
            realized_units: hold.realized_units,
            unspent_units: hold.unspent_units,
            invocation_state: invocation_state(hold.invocation_state, "invocation_state")?,
            monetary_state: monetary_state(hold.monetary_state, "monetary_state")?,
            expires_at_ms: hold.expires_at_ms,
            created_at_ms: hold.created_at_ms,
            capture_attempt_id: hold.capture_attempt_id.map(Into::into),
            authorized: required(hold.authorized, "authorized")?.into(),
            captured: optional_transition(hold.captured),
            last_release: optional_transition(hold.last_release),
            terminal: optional_transition(hold.terminal),
            terminal_at_ms: hold.terminal_at_ms,
        })
    }
}

impl From<&ArchivedHold> for pb::ArchivedHold {
    fn from(hold: &ArchivedHold) -> Self {
        Self {
            capability_id: hold.capability_id.to_string(),
            grant_index: hold.grant_index,
            states: Some(hold.states.into()),
            capture_attempt_id: hold.capture_attempt_id.as_ref().map(ToString::to_string),
            captured: hold.captured.as_ref().map(Into::into),
            terminal: hold.terminal.as_ref().map(Into::into),
        }
    }
}

impl TryFrom<pb::ArchivedHold> for ArchivedHold {
    type Error = WireError;

    fn try_from(hold: pb::ArchivedHold) -> Result<Self, WireError> {
        Ok(Self {
            capability_id: hold.capability_id.into(),
            grant_index: hold.grant_index,
            states: required_into(hold.states, "states")?,
            capture_attempt_id: hold.capture_attempt_id.map(Into::into),
            captured: optional_transition(hold.captured),
            terminal: optional_transition(hold.terminal),
        })
    }
}

impl From<&HoldView> for pb::HoldView {
    fn from(view: &HoldView) -> Self {
        use pb::hold_view::View;
        let view = match view {
            HoldView::Live(hold) => View::Live(hold.into()),
            HoldView::Denied { hold_id, event_id } => View::Denied(pb::DeniedHold {
                hold_id: hold_id.to_string(),
                event_id: event_id.to_string(),
            }),
            HoldView::Archived { hold_id, hold } => View::Archived(pb::ArchivedHoldView {
                hold_id: hold_id.to_string(),
                hold: Some(hold.into()),
            }),
        };
        Self { view: Some(view) }
    }
}

impl TryFrom<pb::HoldView> for HoldView {
    type Error = WireError;

    fn try_from(view: pb::HoldView) -> Result<Self, WireError> {
        use pb::hold_view::View;
        Ok(match required(view.view, "view")? {
            View::Live(hold) => HoldView::Live(Hold::try_from(hold).map_err(|e| e.at("live"))?),
            View::Denied(denied) => HoldView::Denied {
                hold_id: denied.hold_id.into(),
                event_id: denied.event_id.into(),
            },
            View::Archived(archived) => HoldView::Archived {
                hold_id: archived.hold_id.into(),
                hold: required_into(archived.hold, "archived.hold")?,
            },
        })
    }
}

/// `ListHolds`'s filter: an unset or `UNSPECIFIED` state means "any state".
impl TryFrom<&pb::ListHoldsRequest> for HoldFilter {
    type Error = WireError;

    fn try_from(request: &pb::ListHoldsRequest) -> Result<Self, WireError> {
        let state = match request.state {
            None | Some(0) => None,
            Some(raw) => Some(invocation_state(raw, "state")?),
        };
        Ok(Self {
            state,
            created_before_ms: request.created_before_ms,
            with_remaining_exposure: request.with_remaining_exposure,
            after: request.after.clone().map(Into::into),
        })
    }
}

impl pb::GetHoldReply {
    pub fn from_view(family_id: &FamilyId, view: Option<&HoldView>) -> Self {
        let mut view = view.map(pb::HoldView::from);
        if let Some(pb::HoldView {
            view: Some(pb::hold_view::View::Live(hold)),
        }) = &mut view
        {
            hold.family_id = family_id.to_string();
        }
        Self { hold: view }
    }

    pub fn into_view(self) -> Result<Option<HoldView>, WireError> {
        optional_into(self.hold, "hold")
    }
}
