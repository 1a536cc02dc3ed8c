//! The reconciler against one real in-memory family: passes page through the stale holds, so
//! holds a pass cannot finish never starve the ones behind them.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tally_api::pb;
use tally_client::{ClientError, HoldPage, Outcome};
use tally_ledger::{
    ApplyCtx, ClientCommand, ClusterParams, Command, CommandHeader, Family, FamilyId, GrantLimits,
    HoldFilter, HoldId, HoldView, LogPosition, MonetaryState, Operation,
};

use super::{Reconciler, ReconcilerConfig};
use crate::payment::InMemoryRail;
use crate::pipeline::{wall_clock_ms, BudgetLedger};

const FAMILY: &str = "fam";
const CAPABILITY: &str = "fam";

/// One family applied in memory, one command per log entry, at a cluster time an hour ago
/// (so every hold is stale). `ResolveEvent` of any command naming a hold in `unreachable`
/// answers `Unknown`, as when no quorum answers: those holds cannot be finished.
struct MemoryLedger {
    state: Mutex<(Family, u64)>,
    now_ms: u64,
    unreachable: BTreeSet<HoldId>,
}

impl MemoryLedger {
    fn new(unreachable: &[&str]) -> Self {
        Self {
            state: Mutex::new((Family::new(FAMILY.into()), 0)),
            now_ms: wall_clock_ms() - 3_600_000,
            unreachable: unreachable.iter().map(|h| HoldId::from(*h)).collect(),
        }
    }

    fn apply(&self, command: Command) -> Outcome {
        let mut state = self.state.lock().expect("lock");
        state.1 += 1;
        let ctx = ApplyCtx {
            log_id: LogPosition {
                term: 1,
                index: state.1,
            },
            command_position: 0,
            now_ms: self.now_ms,
            params: ClusterParams::default(),
            no_space: false,
        };
        match state.0.apply(&command, &ctx) {
            Ok(decision) => match decision.outcome {
                tally_ledger::Outcome::Resolved(tally_ledger::Resolution::NotApplied) => {
                    Outcome::NotApplied {
                        event_id: decision.event_id,
                    }
                }
                tally_ledger::Outcome::Resolved(tally_ledger::Resolution::Applied(original)) => {
                    Outcome::Decided(*original)
                }
                _ => Outcome::Decided(decision),
            },
            Err(error) => Outcome::Refused(error),
        }
    }

    fn command(&self, event_id: &str, op: Operation) -> ClientCommand {
        ClientCommand {
            header: CommandHeader {
                family_id: FAMILY.into(),
                capability_id: CAPABILITY.into(),
                grant_index: 0,
                event_id: event_id.into(),
                not_after_ms: self.now_ms + 60_000,
            },
            op,
        }
    }

    /// A hold authorized and captured for 10 units, then left by its kernel.
    fn abandoned_capture(&self, hold: &str) {
        let authorize = self.command(
            &format!("{hold}:authorize"),
            Operation::AuthorizeHold {
                hold_id: hold.into(),
                requested_exposure_units: 10,
                limits: GrantLimits {
                    max_invocations: None,
                    max_cost_per_invocation_units: Some(100),
                    max_total_cost_units: Some(1_000),
                    currency: Some("USD".into()),
                },
                ancestors: vec![],
                hold_timeout_ms: Some(60_000),
            },
        );
        let capture = self.command(
            &format!("{hold}:capture"),
            Operation::CaptureInvocation {
                hold_id: hold.into(),
                attempt_id: format!("attempt-{hold}").as_str().into(),
            },
        );
        for command in [authorize, capture] {
            let outcome = self.apply(Command::Apply(command));
            assert!(matches!(outcome, Outcome::Decided(_)), "{outcome:?}");
        }
    }

    fn monetary_state(&self, hold: &str) -> MonetaryState {
        match self.state.lock().expect("lock").0.get_hold(&hold.into()) {
            Some(HoldView::Live(hold)) => hold.monetary_state,
            other => panic!("{hold}: {other:?}"),
        }
    }
}

#[async_trait]
impl BudgetLedger for MemoryLedger {
    async fn submit(&self, command: ClientCommand) -> Outcome {
        self.apply(Command::Apply(command))
    }

    async fn resolve(&self, command: ClientCommand) -> Outcome {
        let hold = match &command.op {
            Operation::CancelCapturedBeforeDispatch { hold_id } => Some(hold_id),
            _ => None,
        };
        if hold.is_some_and(|hold| self.unreachable.contains(hold)) {
            return Outcome::Unknown {
                event_id: command.header.event_id,
                reason: "no quorum answered".into(),
            };
        }
        self.apply(Command::Resolve(command))
    }

    async fn list_holds(
        &self,
        family: Option<&FamilyId>,
        filter: &HoldFilter,
        limit: u32,
    ) -> Result<HoldPage, ClientError> {
        assert_eq!(family, None, "the reconciler reads every family");
        let state = self.state.lock().expect("lock");
        let holds: Vec<_> = (state.0.list_holds(filter, limit as usize).into_iter())
            .map(|hold| (state.0.family_id().clone(), hold))
            .collect();
        // The page as the server builds it and the client decodes it.
        Ok(pb::ListHoldsReply::from_holds(&holds, limit as usize).into_page()?)
    }

    async fn get_hold(
        &self,
        _family: &FamilyId,
        hold_id: &HoldId,
    ) -> Result<Option<HoldView>, ClientError> {
        Ok(self.state.lock().expect("lock").0.get_hold(hold_id))
    }

    fn cluster_id(&self) -> Option<String> {
        None
    }
}

fn reconciler(ledger: &Arc<MemoryLedger>, batch_limit: u32) -> Reconciler {
    Reconciler::new(
        Arc::clone(ledger) as Arc<dyn BudgetLedger>,
        Arc::new(InMemoryRail::new()),
        ReconcilerConfig {
            stale_after_ms: 0,
            batch_limit,
            ..ReconcilerConfig::default()
        },
    )
}

#[tokio::test]
async fn holds_a_pass_cannot_finish_do_not_starve_the_ones_behind_them() {
    // The two oldest holds cannot be finished (their cancel never resolves); a page holds two.
    let ledger = Arc::new(MemoryLedger::new(&["h0", "h1"]));
    for hold in ["h0", "h1", "h2", "h3", "h4"] {
        ledger.abandoned_capture(hold);
    }
    let reconciler = reconciler(&ledger, 2);

    let first = reconciler.run_once().await.expect("pass");
    assert_eq!((first.examined, first.reconciled), (2, 0), "{first:?}");
    assert_eq!(first.errors.len(), 2, "{first:?}");
    let second = reconciler.run_once().await.expect("pass");
    assert_eq!(
        (second.examined, second.reconciled),
        (2, 2),
        "the next page, not the same two again: {second:?}"
    );
    let third = reconciler.run_once().await.expect("pass");
    assert_eq!((third.examined, third.reconciled), (1, 1), "{third:?}");
    for hold in ["h2", "h3", "h4"] {
        assert_eq!(
            ledger.monetary_state(hold),
            MonetaryState::Reconciled,
            "{hold}"
        );
    }
    for hold in ["h0", "h1"] {
        assert_eq!(
            ledger.monetary_state(hold),
            MonetaryState::Exposed,
            "{hold}"
        );
    }
    // The last page was short: the next pass starts again from the oldest.
    let fourth = reconciler.run_once().await.expect("pass");
    assert_eq!((fourth.examined, fourth.errors.len()), (2, 2), "{fourth:?}");
}

#[tokio::test]
async fn a_page_that_ends_exactly_at_the_last_hold_is_followed_by_an_empty_one() {
    let ledger = Arc::new(MemoryLedger::new(&[]));
    for hold in ["h0", "h1"] {
        ledger.abandoned_capture(hold);
    }
    let reconciler = reconciler(&ledger, 2);
    let first = reconciler.run_once().await.expect("pass");
    assert_eq!((first.examined, first.reconciled), (2, 2), "{first:?}");
    let second = reconciler.run_once().await.expect("pass");
    assert_eq!(
        second.examined, 0,
        "nothing after the full page: {second:?}"
    );
    let third = reconciler.run_once().await.expect("pass");
    assert_eq!(
        third.examined, 0,
        "from the oldest again, all finished: {third:?}"
    );
}
