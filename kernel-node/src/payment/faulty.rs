//! A rail wrapper that fails on a script, to reproduce the seed's payment failures against the
//! real pipeline: definite declines, outages, and the worst case, a lost acknowledgement (the
//! rail did the work, the kernel heard an error).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use super::adapter::PaymentAdapter;
use super::model::{Authorization, Capture, PaymentError, Refund, ReleaseStatus, SettlementRecord};
use crate::money::Money;

/// Scripted faults queued per operation; a script is a test's, and tests are small.
pub const MAX_SCRIPTED_FAULTS: usize = 1_024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RailOp {
    Authorize,
    Capture,
    Release,
    Refund,
    Lookup,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Fail without reaching the inner rail.
    Fail(PaymentError),
    /// Perform the operation on the inner rail, then report this error instead of its answer.
    LoseAck(PaymentError),
    /// Wait, then perform normally: lets a test line up races.
    Delay(Duration),
    /// Release only: answer `Unconfirmed` without releasing (a rail that says "pending").
    /// On other operations it fails with a `RailError`.
    Pending,
}

#[derive(Debug, Default)]
struct Script {
    faults: BTreeMap<RailOp, VecDeque<Fault>>,
    calls: BTreeMap<RailOp, u32>,
}

/// Wraps any rail; each call takes the next scripted fault for its operation, if any.
pub struct FaultyRail {
    inner: Arc<dyn PaymentAdapter>,
    script: Mutex<Script>,
}

impl FaultyRail {
    pub fn new(inner: Arc<dyn PaymentAdapter>) -> Self {
        Self {
            inner,
            script: Mutex::new(Script::default()),
        }
    }

    /// Queues `fault` for the next call of `op` that has no earlier fault queued.
    pub fn push(&self, op: RailOp, fault: Fault) {
        let mut script = self.lock();
        let queue = script.faults.entry(op).or_default();
        assert!(
            queue.len() < MAX_SCRIPTED_FAULTS,
            "fault script for {op:?} is longer than {MAX_SCRIPTED_FAULTS}"
        );
        queue.push_back(fault);
    }

    /// The next `n` calls of `op` fail with `error` without reaching the rail.
    pub fn fail_next(&self, op: RailOp, n: usize, error: PaymentError) {
        for _ in 0..n {
            self.push(op, Fault::Fail(error.clone()));
        }
    }

    /// The next `n` calls of `op` happen on the rail but answer with a `RailError`.
    pub fn lose_ack_next(&self, op: RailOp, n: usize) {
        for _ in 0..n {
            self.push(
                op,
                Fault::LoseAck(PaymentError::RailError("acknowledgement lost".into())),
            );
        }
    }

    /// Calls made of `op`, faulted or not.
    pub fn calls(&self, op: RailOp) -> u32 {
        self.lock().calls.get(&op).copied().unwrap_or(0)
    }

    /// Faults still queued for `op`.
    pub fn pending(&self, op: RailOp) -> usize {
        self.lock().faults.get(&op).map_or(0, VecDeque::len)
    }

    fn lock(&self) -> MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn next_fault(&self, op: RailOp) -> Option<Fault> {
        let mut script = self.lock();
        *script.calls.entry(op).or_default() += 1;
        script.faults.get_mut(&op).and_then(VecDeque::pop_front)
    }

    /// Runs `call` under the next fault for `op`.
    async fn run<T, F>(&self, op: RailOp, call: F) -> Result<T, PaymentError>
    where
        F: std::future::Future<Output = Result<T, PaymentError>>,
    {
        apply(self.next_fault(op), call).await
    }
}

/// `call` is a future not yet polled: a fault that fails early never reaches the rail.
async fn apply<T, F>(fault: Option<Fault>, call: F) -> Result<T, PaymentError>
where
    F: std::future::Future<Output = Result<T, PaymentError>>,
{
    match fault {
        None => call.await,
        Some(Fault::Fail(error)) => Err(error),
        Some(Fault::LoseAck(error)) => {
            // The rail's answer is dropped whatever it was: the caller cannot know.
            let _ = call.await;
            Err(error)
        }
        Some(Fault::Delay(delay)) => {
            tokio::time::sleep(delay).await;
            call.await
        }
        Some(Fault::Pending) => Err(PaymentError::RailError("pending".into())),
    }
}

#[async_trait]
impl PaymentAdapter for FaultyRail {
    async fn authorize(
        &self,
        reference: &str,
        amount: &Money,
    ) -> Result<Authorization, PaymentError> {
        self.run(RailOp::Authorize, self.inner.authorize(reference, amount))
            .await
    }

    async fn capture(&self, reference: &str, amount: &Money) -> Result<Capture, PaymentError> {
        self.run(RailOp::Capture, self.inner.capture(reference, amount))
            .await
    }

    async fn release(&self, reference: &str) -> Result<ReleaseStatus, PaymentError> {
        match self.next_fault(RailOp::Release) {
            Some(Fault::Pending) => Ok(ReleaseStatus::Unconfirmed),
            fault => apply(fault, self.inner.release(reference)).await,
        }
    }

    async fn refund(&self, reference: &str, amount: &Money) -> Result<Refund, PaymentError> {
        self.run(RailOp::Refund, self.inner.refund(reference, amount))
            .await
    }

    async fn lookup(&self, reference: &str) -> Result<Option<SettlementRecord>, PaymentError> {
        self.run(RailOp::Lookup, self.inner.lookup(reference)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payment::InMemoryRail;

    fn usd(units: u64) -> Money {
        Money::new(units, "USD")
    }

    fn rails() -> (Arc<InMemoryRail>, FaultyRail) {
        let rail = Arc::new(InMemoryRail::new());
        (rail.clone(), FaultyRail::new(rail))
    }

    #[tokio::test]
    async fn scripted_failures_do_not_reach_the_rail() {
        let (rail, faulty) = rails();
        faulty.fail_next(RailOp::Authorize, 2, PaymentError::Declined("card".into()));
        for _ in 0..2 {
            let error = faulty
                .authorize("req-1", &usd(10))
                .await
                .expect_err("scripted");
            assert!(error.is_definite_denial());
        }
        assert_eq!(rail.counts("req-1").authorize_calls, 0);
        faulty
            .authorize("req-1", &usd(10))
            .await
            .expect("script used up");
        assert_eq!(faulty.calls(RailOp::Authorize), 3);
        assert_eq!(rail.counts("req-1").authorizations, 1);
        assert_eq!(faulty.pending(RailOp::Authorize), 0);
    }

    #[tokio::test]
    async fn lost_ack_performs_then_errs_and_a_retry_finds_the_same_authorization() {
        let (rail, faulty) = rails();
        faulty.lose_ack_next(RailOp::Authorize, 1);
        let error = faulty
            .authorize("req-1", &usd(10))
            .await
            .expect_err("ack lost");
        assert!(!error.is_definite_denial());
        assert_eq!(rail.counts("req-1").authorizations, 1, "the rail did it");
        let retry = faulty.authorize("req-1", &usd(10)).await.expect("retry");
        assert_eq!(retry.reference, "req-1");
        assert_eq!(rail.counts("req-1").authorizations, 1, "no second hold");
        let record = faulty.lookup("req-1").await.expect("lookup");
        assert_eq!(
            record.map(|r| r.status),
            Some(crate::payment::SettlementStatus::Authorized)
        );
    }

    #[tokio::test]
    async fn per_operation_scripts_and_pending_release() {
        let (rail, faulty) = rails();
        faulty
            .authorize("req-1", &usd(10))
            .await
            .expect("authorize");
        faulty.push(RailOp::Release, Fault::Pending);
        faulty.fail_next(RailOp::Capture, 1, PaymentError::Unavailable("down".into()));
        assert_eq!(
            faulty.release("req-1").await,
            Ok(ReleaseStatus::Unconfirmed)
        );
        assert_eq!(rail.counts("req-1").releases, 0, "pending did not release");
        assert!(matches!(
            faulty.capture("req-1", &usd(10)).await,
            Err(PaymentError::Unavailable(_))
        ));
        faulty.push(RailOp::Capture, Fault::Delay(Duration::from_millis(1)));
        faulty
            .capture("req-1", &usd(10))
            .await
            .expect("delayed capture");
        assert_eq!(rail.counts("req-1").captures, 1);
        assert_eq!(faulty.calls(RailOp::Release), 1);
        assert_eq!(faulty.calls(RailOp::Capture), 2);
    }
}
