//! The pure part of the etcd scheme: the account and hold values, the limit arithmetic (the
//! same checks, in the same order, as Tally's `Account::admit`), and what a step does given the
//! keys it read: write, recognise itself as already applied (a replay), or fail. No I/O here.

use std::fmt;

/// Key of the account of `(capability, grant_index)` in `family`: counters and pinned limits.
pub fn account_key(family: &str, capability: &str, grant_index: u32) -> Vec<u8> {
    format!("tb/a/{family}/{capability}/{grant_index}").into_bytes()
}

/// Key of one hold: its state, which is also what makes every step idempotent.
pub fn hold_key(family: &str, hold_id: &str) -> Vec<u8> {
    format!("tb/h/{family}/{hold_id}").into_bytes()
}

/// A grant's limits, pinned on the account by its first authorize (as in Tally).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_invocations: Option<u32>,
    pub max_cost_per_call_units: Option<u64>,
    pub max_total_cost_units: Option<u64>,
    pub currency: String,
}

/// One account's row. Admission needs only the invocation count and the committed cost
/// (exposed + realized); how many reserved invocations are captured is kept in the hold keys,
/// so a capture need not write (or wait for) the account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub limits: Limits,
    pub invocation_count: u32,
    pub exposed_units: u64,
    pub realized_units: u64,
}

/// Which limit denied an authorize (Tally's `InvocationLimit`, `PerInvocationCostLimit`,
/// `TotalCostLimit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenyRule {
    Invocations,
    PerCallCost,
    TotalCost,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldState {
    /// The authorize was decided and denied: a retry gets the same denial.
    Denied(DenyRule),
    Authorized,
    Captured,
    Reconciled,
}

/// One hold's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    pub state: HoldState,
    pub requested_units: u64,
    pub realized_units: u64,
    pub expires_at_ms: u64,
    /// The attempt that owns the capture, once captured.
    pub attempt: Option<String>,
}

/// A step's decision (what Tally's `Outcome` says for the same step).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Authorized,
    Denied(DenyRule),
    Captured,
    Reconciled {
        realized_units: u64,
        unspent_units: u64,
    },
}

/// Why a step cannot be applied (Tally answers these as conflicts or failed preconditions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepError {
    /// The hold exists from a different authorize.
    HoldReused,
    HoldNotFound,
    HoldExpired,
    NotAuthorized(HoldState),
    /// Another attempt owns the capture.
    AlreadyCaptured(String),
    NotCaptured(HoldState),
    AlreadyReconciled,
    ExposureMismatch {
        named: u64,
        held: u64,
    },
    RealizedAboveExposed,
    LimitsChanged,
    Overflow(&'static str),
    Corrupt(&'static str),
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// What a step does, decided from the values it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Already applied (a retry after a lost answer, or a conflict that was our own write):
    /// nothing to write, and it must not be counted again.
    Replay(Outcome),
    /// Write these; `account` is `None` when the account does not change (a denial, a capture).
    Write {
        account: Option<Account>,
        hold: Hold,
        outcome: Outcome,
    },
}

fn add(a: u64, b: u64, field: &'static str) -> Result<u64, StepError> {
    a.checked_add(b).ok_or(StepError::Overflow(field))
}

fn sub(a: u64, b: u64, field: &'static str) -> Result<u64, StepError> {
    a.checked_sub(b).ok_or(StepError::Overflow(field))
}

impl Account {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            invocation_count: 0,
            exposed_units: 0,
            realized_units: 0,
        }
    }

    /// Tally's admission order: invocation quota, per-call cost, total cost against
    /// `exposed + realized + requested`. `Ok(Some)` is a denial, `Err` an overflow.
    pub fn admit(&self, requested: u64) -> Result<Option<DenyRule>, StepError> {
        if let Some(max) = self.limits.max_invocations {
            if self.invocation_count >= max {
                return Ok(Some(DenyRule::Invocations));
            }
        }
        if let Some(max) = self.limits.max_cost_per_call_units {
            if requested > max {
                return Ok(Some(DenyRule::PerCallCost));
            }
        }
        if let Some(max) = self.limits.max_total_cost_units {
            let committed = add(self.exposed_units, self.realized_units, "committed cost")?;
            if add(committed, requested, "committed + requested")? > max {
                return Ok(Some(DenyRule::TotalCost));
            }
        }
        Ok(None)
    }
}

/// Authorize `requested` units on the account (`None`: not created yet) for a hold (`None`:
/// absent). A hold that exists with the same request is this authorize already applied.
pub fn authorize(
    account: Option<&Account>,
    hold: Option<&Hold>,
    requested: u64,
    limits: &Limits,
    expires_at_ms: u64,
) -> Result<Step, StepError> {
    if let Some(hold) = hold {
        if hold.requested_units != requested {
            return Err(StepError::HoldReused);
        }
        return Ok(Step::Replay(match hold.state {
            HoldState::Denied(rule) => Outcome::Denied(rule),
            _ => Outcome::Authorized,
        }));
    }
    let current = match account {
        Some(account) if &account.limits != limits => return Err(StepError::LimitsChanged),
        Some(account) => account.clone(),
        None => Account::new(limits.clone()),
    };
    let mut hold = Hold {
        state: HoldState::Authorized,
        requested_units: requested,
        realized_units: 0,
        expires_at_ms,
        attempt: None,
    };
    if let Some(rule) = current.admit(requested)? {
        hold.state = HoldState::Denied(rule);
        return Ok(Step::Write {
            account: None,
            hold,
            outcome: Outcome::Denied(rule),
        });
    }
    let mut next = current;
    next.invocation_count = next
        .invocation_count
        .checked_add(1)
        .ok_or(StepError::Overflow("invocation_count"))?;
    next.exposed_units = add(next.exposed_units, requested, "exposed")?;
    Ok(Step::Write {
        account: Some(next),
        hold,
        outcome: Outcome::Authorized,
    })
}

/// Capture the hold for `attempt`: the dispatch fence. Of several attempts exactly one owns
/// it; the same attempt again is a replay.
pub fn capture(hold: Option<&Hold>, attempt: &str, now_ms: u64) -> Result<Step, StepError> {
    let hold = hold.ok_or(StepError::HoldNotFound)?;
    match hold.state {
        HoldState::Authorized => {}
        HoldState::Captured | HoldState::Reconciled => {
            return match &hold.attempt {
                Some(owner) if owner == attempt => Ok(Step::Replay(Outcome::Captured)),
                Some(owner) => Err(StepError::AlreadyCaptured(owner.clone())),
                None => Err(StepError::Corrupt("a captured hold without its attempt")),
            }
        }
        state @ HoldState::Denied(_) => return Err(StepError::NotAuthorized(state)),
    }
    if now_ms >= hold.expires_at_ms {
        return Err(StepError::HoldExpired);
    }
    let mut next = hold.clone();
    next.state = HoldState::Captured;
    next.attempt = Some(attempt.to_owned());
    Ok(Step::Write {
        account: None,
        hold: next,
        outcome: Outcome::Captured,
    })
}

/// Reconcile a captured hold: its exposure leaves the account, `realized` is spent for good.
pub fn reconcile(
    account: Option<&Account>,
    hold: Option<&Hold>,
    exposed: u64,
    realized: u64,
) -> Result<Step, StepError> {
    let hold = hold.ok_or(StepError::HoldNotFound)?;
    let outcome = Outcome::Reconciled {
        realized_units: realized,
        unspent_units: exposed.saturating_sub(realized),
    };
    match hold.state {
        HoldState::Captured => {}
        HoldState::Reconciled => {
            return if hold.requested_units == exposed && hold.realized_units == realized {
                Ok(Step::Replay(outcome))
            } else {
                Err(StepError::AlreadyReconciled)
            }
        }
        state => return Err(StepError::NotCaptured(state)),
    }
    if exposed != hold.requested_units {
        return Err(StepError::ExposureMismatch {
            named: exposed,
            held: hold.requested_units,
        });
    }
    if realized > exposed {
        return Err(StepError::RealizedAboveExposed);
    }
    let account = account.ok_or(StepError::Corrupt("a captured hold without its account"))?;
    let mut next = account.clone();
    next.exposed_units = sub(next.exposed_units, exposed, "exposed")?;
    next.realized_units = add(next.realized_units, realized, "realized")?;
    let mut hold = hold.clone();
    hold.state = HoldState::Reconciled;
    hold.realized_units = realized;
    Ok(Step::Write {
        account: Some(next),
        hold,
        outcome,
    })
}

// The values on the wire: a version byte, then fixed-width little-endian fields, options as a
// presence byte, strings with a u16 length. 40-60 bytes a value.

const VERSION: u8 = 1;

struct Writer(Vec<u8>);

impl Writer {
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn opt_u64(&mut self, v: Option<u64>) {
        self.0.push(u8::from(v.is_some()));
        self.u64(v.unwrap_or(0));
    }
    fn str(&mut self, s: &str) {
        let len = u16::try_from(s.len()).expect("short strings only");
        self.0.extend_from_slice(&len.to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], StepError> {
        if self.0.len() < n {
            return Err(StepError::Corrupt("value too short"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, StepError> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64, StepError> {
        let bytes: [u8; 8] = self.take(8)?.try_into().expect("eight bytes");
        Ok(u64::from_le_bytes(bytes))
    }
    fn opt_u64(&mut self) -> Result<Option<u64>, StepError> {
        let present = self.u8()? != 0;
        let value = self.u64()?;
        Ok(present.then_some(value))
    }
    fn str(&mut self) -> Result<String, StepError> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().expect("two bytes"));
        String::from_utf8(self.take(usize::from(len))?.to_vec())
            .map_err(|_| StepError::Corrupt("a string is not UTF-8"))
    }
    fn version(&mut self) -> Result<(), StepError> {
        if self.u8()? != VERSION {
            return Err(StepError::Corrupt("unknown value version"));
        }
        Ok(())
    }
}

impl Account {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(64));
        w.0.push(VERSION);
        w.opt_u64(self.limits.max_invocations.map(u64::from));
        w.opt_u64(self.limits.max_cost_per_call_units);
        w.opt_u64(self.limits.max_total_cost_units);
        w.str(&self.limits.currency);
        w.u64(u64::from(self.invocation_count));
        w.u64(self.exposed_units);
        w.u64(self.realized_units);
        w.0
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, StepError> {
        let mut r = Reader(bytes);
        r.version()?;
        let max_invocations = r
            .opt_u64()?
            .map(|v| u32::try_from(v).map_err(|_| StepError::Corrupt("max_invocations")))
            .transpose()?;
        let limits = Limits {
            max_invocations,
            max_cost_per_call_units: r.opt_u64()?,
            max_total_cost_units: r.opt_u64()?,
            currency: r.str()?,
        };
        let invocation_count =
            u32::try_from(r.u64()?).map_err(|_| StepError::Corrupt("invocation_count"))?;
        Ok(Self {
            limits,
            invocation_count,
            exposed_units: r.u64()?,
            realized_units: r.u64()?,
        })
    }
}

fn state_code(state: HoldState) -> u8 {
    match state {
        HoldState::Authorized => 1,
        HoldState::Captured => 2,
        HoldState::Reconciled => 3,
        HoldState::Denied(DenyRule::Invocations) => 10,
        HoldState::Denied(DenyRule::PerCallCost) => 11,
        HoldState::Denied(DenyRule::TotalCost) => 12,
    }
}

fn state_from(code: u8) -> Result<HoldState, StepError> {
    Ok(match code {
        1 => HoldState::Authorized,
        2 => HoldState::Captured,
        3 => HoldState::Reconciled,
        10 => HoldState::Denied(DenyRule::Invocations),
        11 => HoldState::Denied(DenyRule::PerCallCost),
        12 => HoldState::Denied(DenyRule::TotalCost),
        _ => return Err(StepError::Corrupt("unknown hold state")),
    })
}

impl Hold {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(48));
        w.0.push(VERSION);
        w.0.push(state_code(self.state));
        w.u64(self.requested_units);
        w.u64(self.realized_units);
        w.u64(self.expires_at_ms);
        w.0.push(u8::from(self.attempt.is_some()));
        w.str(self.attempt.as_deref().unwrap_or(""));
        w.0
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, StepError> {
        let mut r = Reader(bytes);
        r.version()?;
        let state = state_from(r.u8()?)?;
        let requested_units = r.u64()?;
        let realized_units = r.u64()?;
        let expires_at_ms = r.u64()?;
        let has_attempt = r.u8()? != 0;
        let attempt = r.str()?;
        Ok(Self {
            state,
            requested_units,
            realized_units,
            expires_at_ms,
            attempt: has_attempt.then_some(attempt),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(calls: Option<u32>, per_call: Option<u64>, total: Option<u64>) -> Limits {
        Limits {
            max_invocations: calls,
            max_cost_per_call_units: per_call,
            max_total_cost_units: total,
            currency: "USD".into(),
        }
    }

    fn written(step: Step) -> (Option<Account>, Hold, Outcome) {
        match step {
            Step::Write {
                account,
                hold,
                outcome,
            } => (account, hold, outcome),
            Step::Replay(outcome) => panic!("expected a write, got a replay of {outcome:?}"),
        }
    }

    #[test]
    fn limits_are_checked_in_tallys_order_against_exposed_plus_realized() {
        let mut account = Account::new(limits(Some(1), Some(100), Some(150)));
        assert_eq!(account.admit(100), Ok(None));
        assert_eq!(account.admit(101), Ok(Some(DenyRule::PerCallCost)));
        account.realized_units = 60;
        account.exposed_units = 40;
        assert_eq!(account.admit(50), Ok(None), "100 + 50 is exactly the total");
        assert_eq!(account.admit(51), Ok(Some(DenyRule::TotalCost)));
        account.invocation_count = 1;
        assert_eq!(
            account.admit(500),
            Ok(Some(DenyRule::Invocations)),
            "the quota is checked first"
        );
        account.exposed_units = u64::MAX;
        account.invocation_count = 0;
        assert_eq!(
            account.admit(1),
            Err(StepError::Overflow("committed cost")),
            "an overflow is an error, not a wrap"
        );
    }

    #[test]
    fn a_call_moves_the_account_and_the_hold_and_a_denial_changes_no_account() {
        let pinned = limits(Some(2), Some(100), Some(250));
        let (account, hold, outcome) = written(authorize(None, None, 100, &pinned, 10).unwrap());
        let account = account.expect("the first authorize creates the account");
        assert_eq!(outcome, Outcome::Authorized);
        assert_eq!((account.invocation_count, account.exposed_units), (1, 100));
        let (none, captured, _) = written(capture(Some(&hold), "a1", 5).unwrap());
        assert_eq!(none, None, "a capture leaves the account alone");
        let (account, reconciled, outcome) =
            written(reconcile(Some(&account), Some(&captured), 100, 60).unwrap());
        let account = account.unwrap();
        assert_eq!((account.exposed_units, account.realized_units), (0, 60));
        assert_eq!(
            outcome,
            Outcome::Reconciled {
                realized_units: 60,
                unspent_units: 40
            }
        );
        assert_eq!(reconciled.state, HoldState::Reconciled);
        // The third authorize meets the quota of 2 first (60 + 100 + 100 > 250 would deny too).
        let (account, _, _) = written(authorize(Some(&account), None, 100, &pinned, 10).unwrap());
        let account = account.unwrap();
        let (unchanged, denied, outcome) =
            written(authorize(Some(&account), None, 100, &pinned, 10).unwrap());
        assert_eq!(unchanged, None);
        assert_eq!(outcome, Outcome::Denied(DenyRule::Invocations));
        assert_eq!(denied.state, HoldState::Denied(DenyRule::Invocations));
        let other = limits(Some(3), Some(100), Some(250));
        assert_eq!(
            authorize(Some(&account), None, 1, &other, 10),
            Err(StepError::LimitsChanged)
        );
    }

    #[test]
    fn an_applied_step_is_recognised_and_not_counted_again() {
        let pinned = limits(None, Some(100), None);
        let (account, hold, _) = written(authorize(None, None, 100, &pinned, 10).unwrap());
        let account = account.unwrap();
        // The authorize's answer was lost; the retry reads the hold it wrote.
        assert_eq!(
            authorize(Some(&account), Some(&hold), 100, &pinned, 10),
            Ok(Step::Replay(Outcome::Authorized))
        );
        assert_eq!(
            authorize(Some(&account), Some(&hold), 99, &pinned, 10),
            Err(StepError::HoldReused)
        );
        let (_, captured, _) = written(capture(Some(&hold), "a1", 5).unwrap());
        assert_eq!(
            capture(Some(&captured), "a1", 5),
            Ok(Step::Replay(Outcome::Captured))
        );
        assert_eq!(
            capture(Some(&captured), "a2", 5),
            Err(StepError::AlreadyCaptured("a1".into()))
        );
        assert_eq!(capture(Some(&hold), "a1", 10), Err(StepError::HoldExpired));
        assert_eq!(
            reconcile(Some(&account), Some(&hold), 100, 60),
            Err(StepError::NotCaptured(HoldState::Authorized))
        );
        let (after, reconciled, _) =
            written(reconcile(Some(&account), Some(&captured), 100, 60).unwrap());
        let after = after.unwrap();
        assert!(matches!(
            reconcile(Some(&after), Some(&reconciled), 100, 60),
            Ok(Step::Replay(_))
        ));
        assert_eq!(
            reconcile(Some(&after), Some(&reconciled), 100, 50),
            Err(StepError::AlreadyReconciled)
        );
        assert_eq!(
            capture(Some(&reconciled), "a1", 5),
            Ok(Step::Replay(Outcome::Captured)),
            "a capture retried after its reconcile is still its own"
        );
    }

    #[test]
    fn values_round_trip_and_garbage_is_refused() {
        let account = Account {
            limits: limits(Some(7), None, Some(u64::MAX)),
            invocation_count: 3,
            exposed_units: 300,
            realized_units: 12,
        };
        assert_eq!(Account::decode(&account.encode()), Ok(account.clone()));
        let hold = Hold {
            state: HoldState::Denied(DenyRule::TotalCost),
            requested_units: 100,
            realized_units: 0,
            expires_at_ms: 42,
            attempt: Some("attempt-3".into()),
        };
        assert_eq!(Hold::decode(&hold.encode()), Ok(hold.clone()));
        let bytes = account.encode();
        assert!(Account::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(Hold::decode(&[9, 1]).is_err());
    }
}
