//! The rail interface. Object-safe (`Arc<dyn PaymentAdapter>`), and idempotent by reference:
//! a retried call with the same reference returns the first answer and never moves money twice.

use std::sync::Arc;

use async_trait::async_trait;

use super::model::{Authorization, Capture, PaymentError, Refund, ReleaseStatus, SettlementRecord};
use crate::money::Money;

#[async_trait]
pub trait PaymentAdapter: Send + Sync {
    /// Holds `amount` under `reference`. Authorizing a reference again returns the existing
    /// authorization (the same amount is required), never a second hold.
    async fn authorize(
        &self,
        reference: &str,
        amount: &Money,
    ) -> Result<Authorization, PaymentError>;

    /// Takes up to the authorized amount. Capturing again with the same amount returns the
    /// first capture.
    async fn capture(&self, reference: &str, amount: &Money) -> Result<Capture, PaymentError>;

    /// Frees an authorization that was not captured.
    async fn release(&self, reference: &str) -> Result<ReleaseStatus, PaymentError>;

    /// Returns captured money; idempotent like the others.
    async fn refund(&self, reference: &str, amount: &Money) -> Result<Refund, PaymentError>;

    /// What the rail knows about `reference`; `None` means it never authorized it.
    async fn lookup(&self, reference: &str) -> Result<Option<SettlementRecord>, PaymentError>;
}

/// So a test can keep a handle on a rail (for its counters) while the kernel owns another.
#[async_trait]
impl<T: PaymentAdapter + ?Sized> PaymentAdapter for Arc<T> {
    async fn authorize(
        &self,
        reference: &str,
        amount: &Money,
    ) -> Result<Authorization, PaymentError> {
        (**self).authorize(reference, amount).await
    }

    async fn capture(&self, reference: &str, amount: &Money) -> Result<Capture, PaymentError> {
        (**self).capture(reference, amount).await
    }

    async fn release(&self, reference: &str) -> Result<ReleaseStatus, PaymentError> {
        (**self).release(reference).await
    }

    async fn refund(&self, reference: &str, amount: &Money) -> Result<Refund, PaymentError> {
        (**self).refund(reference, amount).await
    }

    async fn lookup(&self, reference: &str) -> Result<Option<SettlementRecord>, PaymentError> {
        (**self).lookup(reference).await
    }
}
