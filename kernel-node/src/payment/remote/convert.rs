//! Domain ↔ wire conversions of the rail messages. A reply the client cannot read is a
//! `RailError` (the operation may have happened), never a definite answer.

use super::pb;
use crate::money::Money;
use crate::payment::{
    Authorization, Capture, PaymentError, Refund, ReleaseStatus, SettlementRecord, SettlementStatus,
};

pub(crate) fn money_to_pb(money: &Money) -> pb::Money {
    pb::Money {
        units: money.units,
        currency: money.currency.clone(),
    }
}

pub(crate) fn money_from_pb(money: Option<pb::Money>) -> Result<Money, String> {
    let money = money.ok_or("amount missing")?;
    let money = Money {
        units: money.units,
        currency: money.currency,
    };
    money.validate().map_err(|e| e.to_string())?;
    Ok(money)
}

pub(crate) fn failure_to_pb(error: &PaymentError) -> pb::RailFailure {
    use pb::rail_failure::Kind;
    let (kind, message) = match error {
        PaymentError::Declined(message) => (Kind::Declined, message.clone()),
        PaymentError::InsufficientFunds => (Kind::InsufficientFunds, String::new()),
        PaymentError::Unavailable(message) => (Kind::Unavailable, message.clone()),
        PaymentError::RailError(message) => (Kind::RailError, message.clone()),
    };
    pb::RailFailure {
        kind: kind.into(),
        message,
    }
}

/// An unknown kind is not a definite denial: it becomes a `RailError`.
pub(crate) fn failure_from_pb(failure: pb::RailFailure) -> PaymentError {
    use pb::rail_failure::Kind;
    match Kind::try_from(failure.kind) {
        Ok(Kind::Declined) => PaymentError::Declined(failure.message),
        Ok(Kind::InsufficientFunds) => PaymentError::InsufficientFunds,
        Ok(Kind::Unavailable) => PaymentError::Unavailable(failure.message),
        Ok(Kind::RailError) | Ok(Kind::Unspecified) | Err(_) => {
            PaymentError::RailError(failure.message)
        }
    }
}

pub(crate) fn malformed_reply(what: &str) -> PaymentError {
    PaymentError::RailError(format!("unreadable rail reply: {what}"))
}

pub(crate) fn authorization_to_pb(a: &Authorization) -> pb::Authorization {
    pb::Authorization {
        reference: a.reference.clone(),
        authorization_id: a.authorization_id.clone(),
        amount: Some(money_to_pb(&a.amount)),
    }
}

pub(crate) fn authorization_from_pb(a: pb::Authorization) -> Result<Authorization, PaymentError> {
    Ok(Authorization {
        reference: a.reference,
        authorization_id: a.authorization_id,
        amount: money_from_pb(a.amount).map_err(|e| malformed_reply(&e))?,
    })
}

pub(crate) fn capture_to_pb(c: &Capture) -> pb::Capture {
    pb::Capture {
        reference: c.reference.clone(),
        transaction_id: c.transaction_id.clone(),
        amount: Some(money_to_pb(&c.amount)),
    }
}

pub(crate) fn capture_from_pb(c: pb::Capture) -> Result<Capture, PaymentError> {
    Ok(Capture {
        reference: c.reference,
        transaction_id: c.transaction_id,
        amount: money_from_pb(c.amount).map_err(|e| malformed_reply(&e))?,
    })
}

pub(crate) fn refund_to_pb(r: &Refund) -> pb::Refund {
    pb::Refund {
        reference: r.reference.clone(),
        refund_id: r.refund_id.clone(),
        amount: Some(money_to_pb(&r.amount)),
    }
}

pub(crate) fn refund_from_pb(r: pb::Refund) -> Result<Refund, PaymentError> {
    Ok(Refund {
        reference: r.reference,
        refund_id: r.refund_id,
        amount: money_from_pb(r.amount).map_err(|e| malformed_reply(&e))?,
    })
}

pub(crate) fn release_status_to_pb(status: ReleaseStatus) -> pb::ReleaseStatus {
    match status {
        ReleaseStatus::Released => pb::ReleaseStatus::Released,
        ReleaseStatus::AlreadyReleased => pb::ReleaseStatus::AlreadyReleased,
        ReleaseStatus::NotFound => pb::ReleaseStatus::NotFound,
        ReleaseStatus::Unconfirmed => pb::ReleaseStatus::Unconfirmed,
    }
}

/// An unknown status is read as `Unconfirmed`: never claim funds are free without being told.
pub(crate) fn release_status_from_pb(status: i32) -> ReleaseStatus {
    match pb::ReleaseStatus::try_from(status) {
        Ok(pb::ReleaseStatus::Released) => ReleaseStatus::Released,
        Ok(pb::ReleaseStatus::AlreadyReleased) => ReleaseStatus::AlreadyReleased,
        Ok(pb::ReleaseStatus::NotFound) => ReleaseStatus::NotFound,
        Ok(pb::ReleaseStatus::Unconfirmed) | Ok(pb::ReleaseStatus::Unspecified) | Err(_) => {
            ReleaseStatus::Unconfirmed
        }
    }
}

fn settlement_status_to_pb(status: SettlementStatus) -> pb::SettlementStatus {
    match status {
        SettlementStatus::Authorized => pb::SettlementStatus::Authorized,
        SettlementStatus::Captured => pb::SettlementStatus::Captured,
        SettlementStatus::Released => pb::SettlementStatus::Released,
        SettlementStatus::Refunded => pb::SettlementStatus::Refunded,
    }
}

fn settlement_status_from_pb(status: i32) -> Result<SettlementStatus, PaymentError> {
    match pb::SettlementStatus::try_from(status) {
        Ok(pb::SettlementStatus::Authorized) => Ok(SettlementStatus::Authorized),
        Ok(pb::SettlementStatus::Captured) => Ok(SettlementStatus::Captured),
        Ok(pb::SettlementStatus::Released) => Ok(SettlementStatus::Released),
        Ok(pb::SettlementStatus::Refunded) => Ok(SettlementStatus::Refunded),
        Ok(pb::SettlementStatus::Unspecified) | Err(_) => {
            Err(malformed_reply("unknown settlement status"))
        }
    }
}

pub(crate) fn record_to_pb(r: &SettlementRecord) -> pb::SettlementRecord {
    pb::SettlementRecord {
        reference: r.reference.clone(),
        status: settlement_status_to_pb(r.status).into(),
        authorized: Some(money_to_pb(&r.authorized)),
        captured_units: r.captured_units,
        refunded_units: r.refunded_units,
    }
}

pub(crate) fn record_from_pb(r: pb::SettlementRecord) -> Result<SettlementRecord, PaymentError> {
    Ok(SettlementRecord {
        reference: r.reference,
        status: settlement_status_from_pb(r.status)?,
        authorized: money_from_pb(r.authorized).map_err(|e| malformed_reply(&e))?,
        captured_units: r.captured_units,
        refunded_units: r.refunded_units,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_keep_their_definiteness_across_the_wire() {
        for error in [
            PaymentError::Declined("card".into()),
            PaymentError::InsufficientFunds,
            PaymentError::Unavailable("down".into()),
            PaymentError::RailError("lost".into()),
        ] {
            assert_eq!(failure_from_pb(failure_to_pb(&error)), error);
        }
        let unknown = pb::RailFailure {
            kind: 99,
            message: "?".into(),
        };
        assert!(!failure_from_pb(unknown).is_definite_denial());
        assert_eq!(release_status_from_pb(99), ReleaseStatus::Unconfirmed);
    }
}
