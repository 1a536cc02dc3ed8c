//! An amount in a currency's smallest units. Grants, payments and receipts all speak it, so a
//! currency mismatch is caught where the two values meet instead of being converted silently.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Same bound as the ledger's (`tally_ledger::limits::MAX_CURRENCY_BYTES`): a token's limits
/// end up in ledger commands.
pub const MAX_CURRENCY_BYTES: usize = tally_ledger::limits::MAX_CURRENCY_BYTES;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("currency {0:?} must be 1-{MAX_CURRENCY_BYTES} ASCII letters or digits")]
pub struct MoneyError(pub String);

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Money {
    pub units: u64,
    pub currency: String,
}

impl Money {
    pub fn new(units: u64, currency: &str) -> Self {
        Self {
            units,
            currency: currency.to_owned(),
        }
    }

    pub fn validate(&self) -> Result<(), MoneyError> {
        validate_currency(&self.currency)
    }
}

pub fn validate_currency(currency: &str) -> Result<(), MoneyError> {
    let ok = !currency.is_empty()
        && currency.len() <= MAX_CURRENCY_BYTES
        && currency.bytes().all(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(MoneyError(currency.chars().take(32).collect()))
    }
}

impl fmt::Debug for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.units, self.currency)
    }
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.units, self.currency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn currencies_are_validated() {
        assert_eq!(Money::new(1, "USD").validate(), Ok(()));
        assert!(Money::new(1, "").validate().is_err());
        assert!(Money::new(1, "US D").validate().is_err());
        assert!(Money::new(1, &"X".repeat(MAX_CURRENCY_BYTES + 1))
            .validate()
            .is_err());
    }
}
