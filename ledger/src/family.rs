//! One budget family: all accounts, holds, events and nonces of a delegation chain, and the
//! single entry point `Family::apply` that every replica runs in log order.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::account::{Account, AccountKey};
use crate::cluster_time::ClusterParams;
use crate::command::{ClientCommand, Command, Operation};
use crate::commit_index::{BudgetCommitIndex, LogPosition};
use crate::decision::{Decision, Outcome};
use crate::error::{LedgerError, PreconditionCode};
use crate::event::{AccountImage, EventRecord};
use crate::hold::{Hold, HoldSlot};
use crate::identity::{Identity, StoredIdentity};
use crate::ids::{EventId, FamilyId, HoldId, NonceId};
use crate::keyed::Keyed;
use crate::limits::MAX_EVENTS_PER_COMMAND;

/// Where and when a command applies: its log position and the clamped cluster time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApplyCtx {
    pub log_id: LogPosition,
    /// Position of the command inside its log entry.
    pub command_position: usize,
    /// Cluster time (SPEC.md §6), never wall-clock time.
    pub now_ms: u64,
    pub params: ClusterParams,
}

impl ApplyCtx {
    /// The budget commit index of the command's first event.
    pub fn base_index(&self) -> BudgetCommitIndex {
        BudgetCommitIndex::new(self.log_id.index, self.command_position, 0)
    }
}

/// A dedupe-table row (SPEC.md §5): an applied command's stored answer, or a tombstone.
/// Boxed, so the table's tree nodes stay small: every command inserts a row in the middle
/// of a leaf, and the table keeps a row per applied event for ever.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum DedupeEntry {
    Applied(Box<AppliedRow>),
    Tombstoned(Box<StoredIdentity>),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AppliedRow {
    pub identity: StoredIdentity,
    pub decision: Decision,
}

/// Work that becomes due once cluster time passes a command's `not_after_ms + retention_ms`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) enum CompactionItem {
    /// Drop a full event from the journal.
    Journal(BudgetCommitIndex),
    /// Shrink an applied identity to its digest, or forget a tombstone.
    Dedupe(Keyed<EventId>),
    /// Replace a terminal hold by its archive record.
    Hold(Keyed<HoldId>),
    /// Forget a nonce whose expiry has passed.
    Nonce(NonceId),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Family {
    pub(crate) family_id: FamilyId,
    pub(crate) accounts: BTreeMap<AccountKey, Account>,
    pub(crate) holds: BTreeMap<HoldId, HoldSlot>,
    pub(crate) dedupe: BTreeMap<EventId, DedupeEntry>,
    /// Boxed: compaction removes the oldest records from the front of the tree's leaves, and
    /// moving a pointer is cheaper than moving a record.
    pub(crate) journal: BTreeMap<BudgetCommitIndex, Box<EventRecord>>,
    /// Consumed nonces and their expiry.
    pub(crate) nonces: BTreeMap<NonceId, u64>,
    /// Authorized holds with an expiry, in `(expires_at_ms, hold_id)` order.
    pub(crate) expiry_index: BTreeSet<(u64, HoldId)>,
    pub(crate) compaction_queue: BTreeSet<(u64, CompactionItem)>,
    pub(crate) live_holds: usize,
    /// Node-local guard that commands arrive in log order; not replicated state.
    #[serde(skip)]
    pub(crate) order_guard: OrderGuard,
}

/// The base index of the last command applied here. Excluded from encoding, digest and
/// equality: a replay must leave the replicated state byte-identical, and a restored family
/// starts checking again from its next command.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OrderGuard(BudgetCommitIndex);

impl PartialEq for OrderGuard {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for OrderGuard {}

/// The events one command appends: positions are handed out in order.
pub(crate) struct Step<'c> {
    pub ctx: &'c ApplyCtx,
    base: BudgetCommitIndex,
    appended: usize,
}

impl<'c> Step<'c> {
    fn new(ctx: &'c ApplyCtx) -> Self {
        Self {
            ctx,
            base: ctx.base_index(),
            appended: 0,
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.ctx.now_ms
    }

    fn next_index(&mut self) -> BudgetCommitIndex {
        assert!(
            self.appended < MAX_EVENTS_PER_COMMAND,
            "a command appended more than 256 events"
        );
        let index = self.base.with_event_position(self.appended);
        self.appended += 1;
        index
    }

    pub fn appended(&self) -> usize {
        self.appended
    }
}

/// The fields of a new event that vary; `Family::append` fills in the rest.
pub(crate) struct NewEvent {
    pub record: EventRecord,
    /// Cluster time after which the event may leave memory (before retention).
    pub keep_until_ms: u64,
}

impl Family {
    pub fn new(family_id: FamilyId) -> Self {
        Self {
            family_id,
            accounts: BTreeMap::new(),
            holds: BTreeMap::new(),
            dedupe: BTreeMap::new(),
            journal: BTreeMap::new(),
            nonces: BTreeMap::new(),
            expiry_index: BTreeSet::new(),
            compaction_queue: BTreeSet::new(),
            live_holds: 0,
            order_guard: OrderGuard::default(),
        }
    }

    pub fn family_id(&self) -> &FamilyId {
        &self.family_id
    }

    /// Applies one command at its log position. Every replica calls this with the same
    /// commands in the same order and gets the same answers and the same state.
    pub fn apply(&mut self, command: &Command, ctx: &ApplyCtx) -> Result<Decision, LedgerError> {
        if command.family_id() != &self.family_id {
            return Err(LedgerError::invalid(
                "family_id",
                format!(
                    "command for {} routed to family {}",
                    command.family_id(),
                    self.family_id
                ),
            ));
        }
        let base = ctx.base_index();
        assert!(
            base > self.order_guard.0,
            "family {}: command at {base:?} applied after {:?}: log order broken",
            self.family_id,
            self.order_guard.0
        );
        self.order_guard.0 = base;
        let mut step = Step::new(ctx);
        let result = match command {
            Command::Apply(cmd) => self.apply_client(cmd, &mut step),
            Command::Resolve(original) => self.resolve(original, &mut step),
            Command::ExpireHolds { up_to_ms, .. } => Ok(self.expire_due(*up_to_ms, &mut step)),
        };
        if result.is_err() {
            // Only the expiry of a touched hold may have been appended (SPEC.md §4).
            assert!(
                step.appended() <= 1,
                "an erroring command appended more than an expiry"
            );
        }
        if result.is_err() && step.appended() == 0 {
            return result;
        }
        self.compact_due(ctx.now_ms);
        result
    }

    fn apply_client(
        &mut self,
        cmd: &ClientCommand,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        cmd.validate()?;
        let identity = Identity::of(cmd);
        if let Some(entry) = self.dedupe.get(&cmd.header.event_id) {
            return match entry {
                DedupeEntry::Tombstoned(stored) => {
                    stored
                        .compare(&identity)
                        .map_err(LedgerError::conflict_fields)?;
                    Err(LedgerError::precondition(
                        PreconditionCode::EventAborted,
                        "event aborted: ResolveEvent made it final that this command never applies",
                    ))
                }
                DedupeEntry::Applied(row) => {
                    row.identity
                        .compare(&identity)
                        .map_err(LedgerError::conflict_fields)?;
                    let decision = row.decision.clone();
                    self.replay(cmd, decision, step.now_ms())
                }
            };
        }
        self.check_fresh(cmd, step.now_ms())?;
        let decision = match &cmd.op {
            Operation::AuthorizeHold { .. } => self.authorize_hold(cmd, step)?,
            Operation::CaptureInvocation {
                hold_id,
                attempt_id,
            } => self.capture(cmd, hold_id, attempt_id, step)?,
            Operation::CancelCapturedBeforeDispatch { hold_id } => {
                self.cancel_captured(cmd, hold_id, step)?
            }
            Operation::ReverseHold {
                hold_id,
                exposure_units,
            } => self.reverse_hold(cmd, hold_id, *exposure_units, step)?,
            Operation::ReleaseHold {
                hold_id,
                released_exposure_units,
            } => self.release_hold(cmd, hold_id, *released_exposure_units, step)?,
            Operation::ReconcileHold {
                hold_id,
                exposed_cost_units,
                realized_spend_units,
            } => self.reconcile_hold(
                cmd,
                hold_id,
                *exposed_cost_units,
                *realized_spend_units,
                step,
            )?,
            Operation::TryIncrement { .. }
            | Operation::TryChargeCost { .. }
            | Operation::ReverseChargeCost { .. }
            | Operation::ReduceChargeCost { .. }
            | Operation::SettleChargeCost { .. } => self.legacy(cmd, step)?,
            Operation::ConsumeNonce {
                nonce_id,
                expires_at_ms,
            } => self.consume_nonce(cmd, nonce_id, *expires_at_ms, step)?,
        };
        self.remember(cmd, identity, &decision, step);
        Ok(decision)
    }

    /// A new command must still be in time, and must not ask to stay in memory for ever.
    fn check_fresh(&self, cmd: &ClientCommand, now_ms: u64) -> Result<(), LedgerError> {
        let not_after_ms = cmd.header.not_after_ms;
        if not_after_ms < now_ms {
            return Err(LedgerError::precondition(
                PreconditionCode::CommandExpired,
                format!(
                    "command expired: not_after_ms {not_after_ms} is before cluster time {now_ms}"
                ),
            ));
        }
        if not_after_ms - now_ms > crate::limits::MAX_COMMAND_LIFETIME_MS {
            return Err(LedgerError::invalid(
                "not_after_ms",
                format!(
                    "is more than {} ms after cluster time {now_ms}",
                    crate::limits::MAX_COMMAND_LIFETIME_MS
                ),
            ));
        }
        Ok(())
    }

    fn remember(
        &mut self,
        cmd: &ClientCommand,
        identity: Identity,
        decision: &Decision,
        step: &Step<'_>,
    ) {
        let key = Keyed::new(cmd.header.event_id.clone());
        let due = cmd.header.not_after_ms.max(step.now_ms());
        self.schedule(due, step.ctx.params, CompactionItem::Dedupe(key.clone()));
        let entry = DedupeEntry::Applied(Box::new(AppliedRow {
            identity: StoredIdentity::Full(Box::new(identity)),
            decision: decision.clone(),
        }));
        let previous = self.dedupe.insert(key.id().clone(), entry);
        assert!(previous.is_none(), "an event id was applied twice");
    }

    /// Appends an event at the next position of this command and schedules its compaction.
    pub(crate) fn append(&mut self, step: &mut Step<'_>, mut event: NewEvent) -> BudgetCommitIndex {
        let index = step.next_index();
        event.record.commit_index = index;
        event.record.log_id = step.ctx.log_id;
        event.record.at_ms = step.now_ms();
        let due = event.keep_until_ms.max(step.now_ms());
        self.schedule(due, step.ctx.params, CompactionItem::Journal(index));
        let previous = self.journal.insert(index, Box::new(event.record));
        assert!(previous.is_none(), "commit index {index:?} used twice");
        index
    }

    pub(crate) fn schedule(
        &mut self,
        keep_until_ms: u64,
        params: ClusterParams,
        item: CompactionItem,
    ) {
        let due = keep_until_ms.saturating_add(params.retention_ms);
        self.compaction_queue.insert((due, item));
    }

    /// Writes planned account rows, stamping `seq` and time, and returns their after-images.
    pub(crate) fn commit_accounts(
        &mut self,
        planned: Vec<(AccountKey, Account)>,
        index: BudgetCommitIndex,
        now_ms: u64,
    ) -> Vec<AccountImage> {
        planned
            .into_iter()
            .map(|(key, mut account)| {
                account.seq = index;
                account.updated_at_ms = now_ms;
                account.assert_consistent(&key);
                self.accounts.insert(key.clone(), account.clone());
                AccountImage { key, account }
            })
            .collect()
    }

    /// Computes the new rows of `keys` with `change`; nothing is written if any step fails.
    pub(crate) fn plan_accounts(
        &self,
        keys: &[AccountKey],
        change: impl Fn(&Account) -> Result<Account, LedgerError>,
    ) -> Result<Vec<(AccountKey, Account)>, LedgerError> {
        keys.iter()
            .map(|key| {
                let account = self.accounts.get(key).unwrap_or_else(|| {
                    panic!("family {}: hold account {key:?} has no row", self.family_id)
                });
                Ok((key.clone(), change(account)?))
            })
            .collect()
    }

    pub(crate) fn live_hold(&self, hold_id: &HoldId) -> &Hold {
        match self.holds.get(hold_id) {
            Some(HoldSlot::Live(hold)) => hold,
            other => panic!("hold {hold_id} expected live, found {other:?}"),
        }
    }

    pub(crate) fn live_hold_mut(&mut self, hold_id: &HoldId) -> &mut Hold {
        match self.holds.get_mut(hold_id) {
            Some(HoldSlot::Live(hold)) => hold,
            other => panic!("hold {hold_id} expected live, found {other:?}"),
        }
    }

    /// A blank decision for `event_id` at `index`.
    pub(crate) fn decided(
        event_id: &EventId,
        outcome: Outcome,
        index: Option<BudgetCommitIndex>,
        step: &Step<'_>,
    ) -> Decision {
        Decision {
            event_id: event_id.clone(),
            outcome,
            commit_index: index,
            log_id: index.map(|_| step.ctx.log_id),
            replayed: false,
        }
    }
}
