//! A rail in memory, for tests and single-process demos. It behaves like a careful real rail
//! (idempotent by reference, optional funds limit) and counts what happened per reference, so
//! a test can assert "exactly one payment" after any number of retries and races.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;

use super::adapter::PaymentAdapter;
use super::model::{
    validate_reference, Authorization, Capture, PaymentError, Refund, ReleaseStatus,
    SettlementRecord, SettlementStatus,
};
use crate::money::Money;

/// References one in-memory rail remembers; past it, new authorizations fail.
pub const MAX_REFERENCES: usize = 1_000_000;

/// What happened to one reference. `authorizations` and `captures` count money that moved
/// (holds created, captures made), not calls: a correct kernel keeps both at most 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReferenceCounts {
    pub authorize_calls: u32,
    pub authorizations: u32,
    pub capture_calls: u32,
    pub captures: u32,
    pub releases: u32,
    pub refunds: u32,
}

#[derive(Clone, Debug)]
struct Entry {
    authorization: Authorization,
    status: SettlementStatus,
    capture: Option<Capture>,
    refund: Option<Refund>,
}

#[derive(Debug, Default)]
struct State {
    entries: BTreeMap<String, Entry>,
    counts: BTreeMap<String, ReferenceCounts>,
    /// Units the rail may still hold; `None` is unlimited.
    available_units: Option<u64>,
    next_id: u64,
}

#[derive(Debug, Default)]
pub struct InMemoryRail {
    state: Mutex<State>,
}

impl InMemoryRail {
    pub fn new() -> Self {
        Self::default()
    }

    /// A rail whose payer has `units` in total: authorizing past it is `InsufficientFunds`.
    pub fn with_funds(units: u64) -> Self {
        Self {
            state: Mutex::new(State {
                available_units: Some(units),
                ..State::default()
            }),
        }
    }

    pub fn counts(&self, reference: &str) -> ReferenceCounts {
        self.lock()
            .counts
            .get(reference)
            .copied()
            .unwrap_or_default()
    }

    /// Holds created over all references.
    pub fn total_authorizations(&self) -> u32 {
        self.lock().counts.values().map(|c| c.authorizations).sum()
    }

    pub fn available_units(&self) -> Option<u64> {
        self.lock().available_units
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-made entry: every change below
        // is computed first and stored in one step.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    fn fresh_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{}", self.next_id)
    }

    fn count(&mut self, reference: &str) -> &mut ReferenceCounts {
        self.counts.entry(reference.to_owned()).or_default()
    }

    fn entry(&mut self, reference: &str) -> Result<&mut Entry, PaymentError> {
        self.entries
            .get_mut(reference)
            .ok_or_else(|| PaymentError::RailError(format!("no authorization for {reference}")))
    }

    fn give_back(&mut self, units: u64) {
        if let Some(available) = self.available_units.as_mut() {
            *available = available.saturating_add(units);
        }
    }
}

fn check_amount(amount: &Money) -> Result<(), PaymentError> {
    amount
        .validate()
        .map_err(|e| PaymentError::RailError(e.to_string()))
}

#[async_trait]
impl PaymentAdapter for InMemoryRail {
    async fn authorize(
        &self,
        reference: &str,
        amount: &Money,
    ) -> Result<Authorization, PaymentError> {
        validate_reference(reference)?;
        check_amount(amount)?;
        let mut state = self.lock();
        state.count(reference).authorize_calls += 1;
        if let Some(entry) = state.entries.get(reference) {
            if &entry.authorization.amount != amount {
                return Err(PaymentError::RailError(format!(
                    "reference {reference} is already authorized for {}",
                    entry.authorization.amount
                )));
            }
            return Ok(entry.authorization.clone());
        }
        if state.entries.len() >= MAX_REFERENCES {
            return Err(PaymentError::RailError("in-memory rail is full".into()));
        }
        if let Some(available) = state.available_units {
            let Some(left) = available.checked_sub(amount.units) else {
                return Err(PaymentError::InsufficientFunds);
            };
            state.available_units = Some(left);
        }
        let authorization = Authorization {
            reference: reference.to_owned(),
            authorization_id: state.fresh_id("auth"),
            amount: amount.clone(),
        };
        state.entries.insert(
            reference.to_owned(),
            Entry {
                authorization: authorization.clone(),
                status: SettlementStatus::Authorized,
                capture: None,
                refund: None,
            },
        );
        state.count(reference).authorizations += 1;
        Ok(authorization)
    }

    async fn capture(&self, reference: &str, amount: &Money) -> Result<Capture, PaymentError> {
        validate_reference(reference)?;
        check_amount(amount)?;
        let mut state = self.lock();
        state.count(reference).capture_calls += 1;
        let entry = state.entry(reference)?.clone();
        if let Some(capture) = &entry.capture {
            if &capture.amount != amount {
                return Err(PaymentError::RailError(format!(
                    "reference {reference} was already captured for {}",
                    capture.amount
                )));
            }
            return Ok(capture.clone());
        }
        if entry.status != SettlementStatus::Authorized {
            return Err(PaymentError::RailError(format!(
                "reference {reference} is {}",
                entry.status.as_str()
            )));
        }
        let authorized = &entry.authorization.amount;
        if amount.currency != authorized.currency || amount.units > authorized.units {
            return Err(PaymentError::RailError(format!(
                "capture of {amount} exceeds the authorization of {authorized}"
            )));
        }
        let capture = Capture {
            reference: reference.to_owned(),
            transaction_id: state.fresh_id("txn"),
            amount: amount.clone(),
        };
        state.give_back(authorized.units - amount.units);
        let stored = state.entry(reference)?;
        stored.capture = Some(capture.clone());
        stored.status = SettlementStatus::Captured;
        state.count(reference).captures += 1;
        Ok(capture)
    }

    async fn release(&self, reference: &str) -> Result<ReleaseStatus, PaymentError> {
        validate_reference(reference)?;
        let mut state = self.lock();
        let Some(entry) = state.entries.get_mut(reference) else {
            return Ok(ReleaseStatus::NotFound);
        };
        match entry.status {
            SettlementStatus::Released => Ok(ReleaseStatus::AlreadyReleased),
            SettlementStatus::Authorized => {
                entry.status = SettlementStatus::Released;
                let units = entry.authorization.amount.units;
                state.give_back(units);
                state.count(reference).releases += 1;
                Ok(ReleaseStatus::Released)
            }
            status @ (SettlementStatus::Captured | SettlementStatus::Refunded) => {
                Err(PaymentError::RailError(format!(
                    "reference {reference} is {}; refund it instead",
                    status.as_str()
                )))
            }
        }
    }

    async fn refund(&self, reference: &str, amount: &Money) -> Result<Refund, PaymentError> {
        validate_reference(reference)?;
        check_amount(amount)?;
        let mut state = self.lock();
        let entry = state.entry(reference)?.clone();
        if let Some(refund) = &entry.refund {
            if &refund.amount != amount {
                return Err(PaymentError::RailError(format!(
                    "reference {reference} was already refunded {}",
                    refund.amount
                )));
            }
            return Ok(refund.clone());
        }
        let Some(capture) = entry.capture.as_ref() else {
            return Err(PaymentError::RailError(format!(
                "reference {reference} was never captured"
            )));
        };
        if amount.currency != capture.amount.currency || amount.units > capture.amount.units {
            return Err(PaymentError::RailError(format!(
                "refund of {amount} exceeds the capture of {}",
                capture.amount
            )));
        }
        let refund = Refund {
            reference: reference.to_owned(),
            refund_id: state.fresh_id("refund"),
            amount: amount.clone(),
        };
        state.give_back(amount.units);
        let stored = state.entry(reference)?;
        stored.refund = Some(refund.clone());
        stored.status = SettlementStatus::Refunded;
        state.count(reference).refunds += 1;
        Ok(refund)
    }

    async fn lookup(&self, reference: &str) -> Result<Option<SettlementRecord>, PaymentError> {
        validate_reference(reference)?;
        let state = self.lock();
        Ok(state.entries.get(reference).map(|entry| SettlementRecord {
            reference: reference.to_owned(),
            status: entry.status,
            authorized: entry.authorization.amount.clone(),
            captured_units: entry.capture.as_ref().map_or(0, |c| c.amount.units),
            refunded_units: entry.refund.as_ref().map_or(0, |r| r.amount.units),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payment::MAX_REFERENCE_BYTES;

    fn usd(units: u64) -> Money {
        Money::new(units, "USD")
    }

    #[tokio::test]
    async fn authorize_is_idempotent_by_reference() {
        let rail = InMemoryRail::new();
        let first = rail.authorize("req-1", &usd(100)).await.expect("first");
        let again = rail.authorize("req-1", &usd(100)).await.expect("retry");
        assert_eq!(first, again);
        let counts = rail.counts("req-1");
        assert_eq!((counts.authorize_calls, counts.authorizations), (2, 1));
        assert!(matches!(
            rail.authorize("req-1", &usd(101)).await,
            Err(PaymentError::RailError(_))
        ));
        assert_eq!(rail.total_authorizations(), 1);
        let other = rail.authorize("req-2", &usd(100)).await.expect("other");
        assert_ne!(other.authorization_id, first.authorization_id);
        assert_eq!(rail.total_authorizations(), 2);
    }

    #[tokio::test]
    async fn capture_and_refund_are_idempotent_and_bounded() {
        let rail = InMemoryRail::new();
        assert!(
            rail.capture("req-1", &usd(10)).await.is_err(),
            "nothing authorized"
        );
        rail.authorize("req-1", &usd(100)).await.expect("authorize");
        assert!(
            rail.capture("req-1", &usd(101)).await.is_err(),
            "over-capture"
        );
        let capture = rail.capture("req-1", &usd(60)).await.expect("capture");
        assert_eq!(rail.capture("req-1", &usd(60)).await, Ok(capture));
        assert!(rail.capture("req-1", &usd(70)).await.is_err());
        assert_eq!(rail.counts("req-1").captures, 1);
        assert!(rail.refund("req-1", &usd(61)).await.is_err());
        let refund = rail.refund("req-1", &usd(60)).await.expect("refund");
        assert_eq!(rail.refund("req-1", &usd(60)).await, Ok(refund));
        let record = rail.lookup("req-1").await.expect("lookup").expect("known");
        assert_eq!(record.status, SettlementStatus::Refunded);
        assert_eq!((record.captured_units, record.refunded_units), (60, 60));
        assert_eq!(rail.lookup("req-9").await, Ok(None));
    }

    #[tokio::test]
    async fn release_statuses() {
        let rail = InMemoryRail::new();
        assert_eq!(rail.release("req-1").await, Ok(ReleaseStatus::NotFound));
        rail.authorize("req-1", &usd(100)).await.expect("authorize");
        assert_eq!(rail.release("req-1").await, Ok(ReleaseStatus::Released));
        assert_eq!(
            rail.release("req-1").await,
            Ok(ReleaseStatus::AlreadyReleased)
        );
        assert_eq!(rail.counts("req-1").releases, 1);
        assert!(rail.capture("req-1", &usd(1)).await.is_err(), "released");
        rail.authorize("req-2", &usd(5)).await.expect("authorize");
        rail.capture("req-2", &usd(5)).await.expect("capture");
        assert!(matches!(
            rail.release("req-2").await,
            Err(PaymentError::RailError(_))
        ));
    }

    #[tokio::test]
    async fn funds_run_out_and_come_back() {
        let rail = InMemoryRail::with_funds(150);
        rail.authorize("a", &usd(100)).await.expect("fits");
        assert_eq!(
            rail.authorize("b", &usd(100)).await,
            Err(PaymentError::InsufficientFunds)
        );
        assert!(PaymentError::InsufficientFunds.is_definite_denial());
        rail.release("a").await.expect("release");
        assert_eq!(rail.available_units(), Some(150));
        rail.authorize("b", &usd(100)).await.expect("fits again");
        rail.capture("b", &usd(40)).await.expect("partial capture");
        assert_eq!(rail.available_units(), Some(110));
    }

    #[tokio::test]
    async fn references_are_bounded() {
        let rail = InMemoryRail::new();
        let long = "r".repeat(MAX_REFERENCE_BYTES + 1);
        assert!(rail.authorize(&long, &usd(1)).await.is_err());
        assert!(rail.authorize("", &usd(1)).await.is_err());
        assert!(rail.authorize("ok", &Money::new(1, "U S")).await.is_err());
    }

    #[test]
    fn only_declined_and_insufficient_funds_are_definite() {
        assert!(PaymentError::Declined("no".into()).is_definite_denial());
        assert!(PaymentError::InsufficientFunds.is_definite_denial());
        assert!(!PaymentError::Unavailable("down".into()).is_definite_denial());
        assert!(!PaymentError::RailError("lost ack".into()).is_definite_denial());
    }
}
