//! The calls that act on an admission ticket: `Complete`, `Abort` and the Rust-only
//! `DispatchAdmitted`. Each carries a proof of possession by the key the ticket was issued to,
//! so a ticket copied off the wire settles or frees nothing in a thief's hands.

use super::possession::{self, Method, Possession, PossessionError, Signable, SignedFields};
use super::request::Arguments;
use super::ticket::SignedTicket;
use super::wall_clock_ms;
use crate::keys::KeyPair;
use crate::money::Money;

/// The ticket's bytes as the kernel handed them out (tickets decode strictly, so re-encoding
/// gives the bytes the caller holds).
fn ticket_field(ticket: &SignedTicket, out: &mut SignedFields) -> Result<(), PossessionError> {
    let bytes = ticket
        .to_bytes()
        .map_err(|e| PossessionError::Encode(format!("ticket: {e}")))?;
    out.field("ticket", &bytes)
}

/// Settle an admitted call at `min(actual_cost, charged)`.
#[derive(Clone, Debug)]
pub struct CompleteCall {
    pub ticket: SignedTicket,
    pub actual_cost: Option<Money>,
    pub possession: Option<Possession>,
}

/// End an admitted call that did not (`before_dispatch`) or may have run.
#[derive(Clone, Debug)]
pub struct AbortCall {
    pub ticket: SignedTicket,
    pub before_dispatch: bool,
    pub possession: Option<Possession>,
}

/// Run an admitted call on this node's registered tool server.
#[derive(Clone, Debug)]
pub struct DispatchCall {
    pub ticket: SignedTicket,
    pub arguments: Arguments,
    pub possession: Option<Possession>,
}

impl CompleteCall {
    pub fn new(ticket: SignedTicket, actual_cost: Option<Money>) -> Self {
        Self {
            ticket,
            actual_cost,
            possession: None,
        }
    }
}

impl AbortCall {
    pub fn new(ticket: SignedTicket, before_dispatch: bool) -> Self {
        Self {
            ticket,
            before_dispatch,
            possession: None,
        }
    }
}

impl DispatchCall {
    pub fn new(ticket: SignedTicket, arguments: impl Into<Arguments>) -> Self {
        Self {
            ticket,
            arguments: arguments.into(),
            possession: None,
        }
    }
}

impl Signable for CompleteCall {
    fn write_fields(&self, out: &mut SignedFields) -> Result<(), PossessionError> {
        ticket_field(&self.ticket, out)?;
        out.flag(self.actual_cost.is_some());
        if let Some(cost) = &self.actual_cost {
            out.u64(cost.units);
            out.field("actual_cost.currency", cost.currency.as_bytes())?;
        }
        Ok(())
    }
}

impl Signable for AbortCall {
    fn write_fields(&self, out: &mut SignedFields) -> Result<(), PossessionError> {
        ticket_field(&self.ticket, out)?;
        out.flag(self.before_dispatch);
        Ok(())
    }
}

impl Signable for DispatchCall {
    fn write_fields(&self, out: &mut SignedFields) -> Result<(), PossessionError> {
        ticket_field(&self.ticket, out)?;
        out.field("arguments_json", self.arguments.text().as_bytes())
    }
}

/// A ticket call with its fixed method: signing needs no method argument to get wrong.
pub trait TicketCall: Signable + Sized {
    const METHOD: Method;

    fn possession(&self) -> Option<&Possession>;

    fn possession_mut(&mut self) -> &mut Option<Possession>;

    /// Signs the call as it stands, dated `signed_at_ms`. Sign last: a later change voids it.
    fn sign_at(mut self, holder: &KeyPair, signed_at_ms: u64) -> Result<Self, PossessionError> {
        let proof = possession::sign(holder, Self::METHOD, signed_at_ms, &self)?;
        *self.possession_mut() = Some(proof);
        Ok(self)
    }

    /// [`Self::sign_at`] now.
    fn signed(self, holder: &KeyPair) -> Result<Self, PossessionError> {
        self.sign_at(holder, wall_clock_ms())
    }
}

impl TicketCall for CompleteCall {
    const METHOD: Method = Method::Complete;

    fn possession(&self) -> Option<&Possession> {
        self.possession.as_ref()
    }

    fn possession_mut(&mut self) -> &mut Option<Possession> {
        &mut self.possession
    }
}

impl TicketCall for AbortCall {
    const METHOD: Method = Method::Abort;

    fn possession(&self) -> Option<&Possession> {
        self.possession.as_ref()
    }

    fn possession_mut(&mut self) -> &mut Option<Possession> {
        &mut self.possession
    }
}

impl TicketCall for DispatchCall {
    const METHOD: Method = Method::DispatchAdmitted;

    fn possession(&self) -> Option<&Possession> {
        self.possession.as_ref()
    }

    fn possession_mut(&mut self) -> &mut Option<Possession> {
        &mut self.possession
    }
}
