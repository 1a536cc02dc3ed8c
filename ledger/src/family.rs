//! One budget family: all accounts, holds, events and nonces of a delegation chain, and the
//! single entry point `Family::apply` that every replica runs in log order.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::account::{Account, AccountKey};
use crate::cluster_time::ClusterParams;
use crate::cold::{ColdFetch, ColdLookup, ColdMeta, ColdRows, MovedRow};
use crate::command::{ClientCommand, Command, Operation};
use crate::commit_index::{BudgetCommitIndex, LogPosition};
use crate::decision::{Decision, Outcome};
use crate::error::{LedgerError, PreconditionCode};
use crate::event::{AccountImage, AfterImages, EventRecord};
use crate::hold::HoldSlot;
use crate::ids::{EventId, FamilyId, HoldId, NonceId};
use crate::journal::Journal;
use crate::limits::MAX_EVENTS_PER_COMMAND;
use crate::tables::compaction_queue::{CompactionItem, CompactionQueue};
use crate::tables::dedupe_table::{AppliedRow, DedupeRow, DedupeTable};
use crate::tables::id_table::{IdTable, RowHash};

pub use crate::tables::compaction_queue::CompactionWork;

/// Where and when a command applies: its log position and the clamped cluster time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApplyCtx {
    pub log_id: LogPosition,
    /// Position of the command inside its log entry.
    pub command_position: usize,
    /// Cluster time (docs/spec.md §6), never wall-clock time.
    pub now_ms: u64,
    pub params: ClusterParams,
    /// Whether the `NoSpace` alarm is raised at this entry (docs/spec.md §5.6). It is
    /// replicated state (raised and cleared through the log), so every replica refuses alike.
    pub no_space: bool,
}

impl ApplyCtx {
    /// The budget commit index of the command's first event.
    pub fn base_index(&self) -> BudgetCommitIndex {
        BudgetCommitIndex::new(self.log_id.index, self.command_position, 0)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Family {
    pub(crate) family_id: FamilyId,
    pub(crate) accounts: BTreeMap<AccountKey, Account>,
    pub(crate) holds: IdTable<HoldId, HoldSlot>,
    pub(crate) dedupe: DedupeTable,
    pub(crate) journal: Journal,
    /// Consumed nonces and their expiry.
    pub(crate) nonces: BTreeMap<NonceId, u64>,
    /// Authorized holds with an expiry, in `(expires_at_ms, hold_id)` order.
    pub(crate) expiry_index: BTreeSet<(u64, HoldId)>,
    /// Compaction work by due time; a command's or tombstone's entry retains its identity.
    pub(crate) compaction_queue: CompactionQueue,
    pub(crate) live_holds: usize,
    /// The rows this family moved out of memory (`cold.rs`): last, and left out of the
    /// encoding while none has moved, so such a family encodes (and digests) as before.
    #[serde(default, skip_serializing_if = "ColdMeta::is_empty")]
    pub(crate) cold: ColdMeta,
    /// Node-local guard that commands arrive in log order; not replicated state.
    #[serde(skip)]
    pub(crate) order_guard: OrderGuard,
    /// Node-local: the rows looked up for this batch and those it moved out.
    #[serde(skip)]
    pub(crate) cold_rows: ColdRows,
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
    /// The client command's own event, once appended: it is compacted with the command.
    own_event: Option<BudgetCommitIndex>,
}

impl<'c> Step<'c> {
    fn new(ctx: &'c ApplyCtx) -> Self {
        Self {
            ctx,
            base: ctx.base_index(),
            appended: 0,
            own_event: None,
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
    pub keep: Keep,
}

/// How long an event stays in the journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keep {
    /// The client command's own event: it leaves with the command's retained field hashes, once
    /// cluster time passes the command's `not_after_ms + retention_ms`.
    WithCommand,
    /// A cluster event (an expiry): until this cluster time, plus retention.
    Until(u64),
}

/// Everything a command writes besides holds and the dedupe table (see `Family::split`).
pub(crate) struct Books<'f> {
    pub family_id: &'f FamilyId,
    pub accounts: &'f mut BTreeMap<AccountKey, Account>,
    pub journal: &'f mut Journal,
    pub expiry_index: &'f mut BTreeSet<(u64, HoldId)>,
    pub compaction_queue: &'f mut CompactionQueue,
    pub live_holds: &'f mut usize,
    /// The family's rows out of memory, for a hold command that names an archived hold.
    pub cold: ColdLookup<'f>,
}

impl Books<'_> {
    /// Appends an event at the next position of this command and schedules its compaction.
    pub fn append(&mut self, step: &mut Step<'_>, mut event: NewEvent) -> BudgetCommitIndex {
        let index = step.next_index();
        event.record.commit_index = index;
        event.record.log_id = step.ctx.log_id;
        event.record.at_ms = step.now_ms();
        match event.keep {
            Keep::WithCommand => {
                assert!(
                    step.own_event.is_none(),
                    "a command appended two events of its own"
                );
                step.own_event = Some(index);
            }
            Keep::Until(keep_until_ms) => {
                let due = keep_until_ms.max(step.now_ms());
                self.schedule(due, step.ctx.params, CompactionItem::Journal(index));
            }
        }
        self.journal.append(index, event.record);
        index
    }

    pub fn schedule(&mut self, keep_until_ms: u64, params: ClusterParams, item: CompactionItem) {
        self.compaction_queue
            .push(params.compaction_key(keep_until_ms), item, None);
    }

    /// The after-images of `keys` changed by `change` and stamped with `index` and `now_ms`;
    /// nothing is written (see `commit_accounts`), so a failing step changes nothing.
    pub fn plan_accounts(
        &self,
        keys: &[AccountKey],
        index: BudgetCommitIndex,
        now_ms: u64,
        change: impl Fn(&Account) -> Result<Account, LedgerError>,
    ) -> Result<AfterImages, LedgerError> {
        let mut images = AfterImages::with_capacity(keys.len());
        for key in keys {
            let account = self.accounts.get(key).unwrap_or_else(|| {
                panic!("family {}: hold account {key:?} has no row", self.family_id)
            });
            images.push(stamped(key, change(account)?, index, now_ms));
        }
        Ok(images)
    }

    /// Writes planned rows (creating those that are new).
    pub fn commit_accounts(&mut self, images: &[AccountImage]) {
        for image in images {
            image.account.assert_consistent(&image.key);
            match self.accounts.get_mut(&image.key) {
                Some(row) => row.take_totals(&image.account),
                None => {
                    self.accounts
                        .insert(image.key.clone(), image.account.clone());
                }
            }
        }
    }
}

/// An account's after-image, stamped with the event that changes it.
pub(crate) fn stamped(
    key: &AccountKey,
    mut account: Account,
    index: BudgetCommitIndex,
    now_ms: u64,
) -> AccountImage {
    account.seq = index;
    account.updated_at_ms = now_ms;
    AccountImage {
        key: key.clone(),
        account,
    }
}

impl Family {
    pub fn new(family_id: FamilyId) -> Self {
        Self {
            family_id,
            accounts: BTreeMap::new(),
            holds: IdTable::default(),
            dedupe: DedupeTable::default(),
            journal: Journal::default(),
            nonces: BTreeMap::new(),
            expiry_index: BTreeSet::new(),
            compaction_queue: CompactionQueue::default(),
            live_holds: 0,
            cold: ColdMeta::default(),
            order_guard: OrderGuard::default(),
            cold_rows: ColdRows::default(),
        }
    }

    /// Starts a batch with the rows the node looked up for it (`Command::cold_keys` of each
    /// command; an empty fetch when the family has no rows out of memory).
    pub fn start_batch(&mut self, fetched: ColdFetch) {
        self.cold_rows.start_batch(fetched);
    }

    /// The rows moved out of memory since the last call (the last batch's), encoded, for
    /// the node to store before the next batch.
    pub fn take_moved_rows(&mut self) -> Vec<MovedRow> {
        self.cold_rows.take_moved()
    }

    /// The count and digest of every row this family moved out of memory.
    pub fn cold_meta(&self) -> ColdMeta {
        self.cold
    }

    pub(crate) fn cold_lookup(&self) -> ColdLookup<'_> {
        ColdLookup {
            meta: &self.cold,
            rows: &self.cold_rows,
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
            // Only the expiry of a touched hold may have been appended (docs/spec.md §4).
            assert!(
                step.appended() <= 1 && step.own_event.is_none(),
                "an erroring command appended more than an expiry"
            );
        }
        if result.is_err() && step.appended() == 0 {
            return result;
        }
        let maintenance = matches!(command, Command::ExpireHolds { .. });
        self.compact_due(
            ctx.now_ms,
            ctx.params.max_compactions(maintenance),
            &ctx.params,
        );
        result
    }

    fn apply_client(
        &mut self,
        cmd: &ClientCommand,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        cmd.validate()?;
        // The id is hashed once: a fresh command files its row with the hash found here.
        let (row_hash, row) = self.dedupe.find(&cmd.header.event_id);
        let row = row.or_else(|| {
            self.cold_lookup()
                .event(&cmd.header.event_id)
                .map(DedupeRow::Applied)
        });
        match row {
            Some(row) => self.answer_again(row, cmd, step),
            None => self.apply_fresh(cmd, step, row_hash),
        }
    }

    /// A command whose `event_id` has a row: a replay, or a conflict (docs/spec.md §5.2–5.4).
    fn answer_again(
        &self,
        entry: DedupeRow<'_>,
        cmd: &ClientCommand,
        step: &Step<'_>,
    ) -> Result<Decision, LedgerError> {
        match entry {
            DedupeRow::Tombstoned(stored) => {
                self.same_command(stored, CompactionItem::Tombstone, cmd)?;
                Err(LedgerError::precondition(
                    PreconditionCode::EventAborted,
                    "event aborted: ResolveEvent made it final that this command never applies",
                ))
            }
            DedupeRow::Applied(row) => {
                self.same_command(&row.identity, CompactionItem::Command, cmd)?;
                let decision = row.decision(&cmd.header.event_id);
                self.replay(cmd, decision, step.now_ms())
            }
        }
    }

    /// A command seen for the first time: its decision, its dedupe row filed under `row_hash`
    /// (where `DedupeTable::find` found none).
    fn apply_fresh(
        &mut self,
        cmd: &ClientCommand,
        step: &mut Step<'_>,
        row_hash: RowHash,
    ) -> Result<Decision, LedgerError> {
        self.check_fresh(cmd, step.now_ms())?;
        // Only a fresh command is refused: a replay answers its recorded decision and
        // ResolveEvent never reaches here, so lost acknowledgements stay resolvable.
        if step.ctx.no_space && cmd.op.opens_exposure() {
            return Err(LedgerError::no_space(cmd.op.name()));
        }
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
        self.remember(cmd, &decision, step, row_hash);
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

    /// Stores the row of a command that applied; queues the compaction of its field hashes
    /// and own event.
    fn remember(
        &mut self,
        cmd: &ClientCommand,
        decision: &Decision,
        step: &Step<'_>,
        row_hash: RowHash,
    ) {
        let key = step
            .ctx
            .params
            .compaction_key(cmd.header.not_after_ms.max(step.now_ms()));
        let identity = self.retain(cmd, key, CompactionItem::Command, step.own_event);
        let row = AppliedRow {
            identity,
            outcome: decision.outcome.clone(),
            commit_index: decision.commit_index,
            log_id: decision.log_id,
        };
        self.dedupe
            .insert_applied(row_hash, cmd.header.event_id.clone(), row);
    }

    /// The holds, and everything else a command writes, borrowed apart: a hold command looks
    /// its hold up once and changes it in place while it writes accounts and the journal.
    pub(crate) fn split(&mut self) -> (&mut IdTable<HoldId, HoldSlot>, Books<'_>) {
        let books = Books {
            family_id: &self.family_id,
            accounts: &mut self.accounts,
            journal: &mut self.journal,
            expiry_index: &mut self.expiry_index,
            compaction_queue: &mut self.compaction_queue,
            live_holds: &mut self.live_holds,
            cold: ColdLookup {
                meta: &self.cold,
                rows: &self.cold_rows,
            },
        };
        (&mut self.holds, books)
    }

    pub(crate) fn books(&mut self) -> Books<'_> {
        self.split().1
    }

    /// Appends an event at the next position of this command and schedules its compaction.
    pub(crate) fn append(&mut self, step: &mut Step<'_>, event: NewEvent) -> BudgetCommitIndex {
        self.books().append(step, event)
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
