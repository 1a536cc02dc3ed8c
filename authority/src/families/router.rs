//! The family router: applies committed entries by fanning each round out to one actor per
//! family and awaiting every answer, so `last_applied` is exact and in-flight work is bounded
//! by one round. It is the only sender to family actors and the only one that passivates.

use std::collections::BTreeMap;

use tally_ledger::{ClusterParams, FamilyId, LogPosition};
use tokio::sync::oneshot;

use super::actor_table::{gone, send, ActorTable, Located};
use super::batch::{self, FamilyWork, PendingOutput, Round};
use super::cold_index::ColdIndex;
use super::config::RouterConfig;
use super::entry::{EntryInput, EntryOutput};
use super::error::RouterError;
use super::expiry_index::ExpiryIndex;
use super::family_store::FamilyStore;
use super::hold_index::HoldIndex;
use super::messages::FamilyMsg;
use super::router_state::RouterState;

/// Families a round brings back from the store at a time (`FamilyRouter::slices`).
const MAX_STORED_PER_SLICE: usize = 128;
/// A slice's stored bytes, and a passivation commit's live footprint, are at most the
/// families' share (`max_live_bytes`) over this. A family decodes to a few times its
/// encoding, so a slice's families, decoded beside the live ones before the slice ends and
/// spills them, stay a small part of the share; and a passivation holds its families'
/// states, their encodings and the store's pages for them only a commit at a time.
const STEP_BYTES_DIVISOR: usize = 32;

/// The families' half of the memory budget and what counts against it (`FamilyRouter::
/// memory_use`): the families in memory by their estimate, their filters over rows out of
/// memory, and the rows and run indexes the store keeps in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryUse {
    /// `max_live_bytes`: half of `memory_budget_bytes`.
    pub share_bytes: usize,
    pub families_bytes: usize,
    pub filter_bytes: usize,
    pub store_memory_bytes: usize,
    pub families_in_memory: usize,
    pub families_on_disk: usize,
}

/// The filters' pages beyond their share of the memory budget (`FamilyRouter::filter_pages`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FilterPages {
    /// What the filters may keep in memory before pages go to the page file.
    pub share_bytes: usize,
    /// The page file's length: pages on disk, and slots a cut still names or free.
    pub file_bytes: u64,
    /// Hashes of keys added to pages on disk, waiting to be set in them.
    pub pending_hashes: usize,
    /// Blocks (4 KiB) read for lookups, pages (64 KiB) read back and written, so far.
    pub block_reads: u64,
    pub page_reads: u64,
    pub page_writes: u64,
}

pub struct FamilyRouter {
    pub(super) config: RouterConfig,
    /// Replicated: last applied log id, cluster time, parameters.
    pub(super) state: RouterState,
    /// Replicated: each family's next maintenance time.
    pub(super) expiry: ExpiryIndex,
    /// Node-local: which families are live and which are passivated (in the family store).
    pub(super) actors: ActorTable,
    /// Node-local, derived: which families hold live holds (what `ListHolds` without a
    /// family reads).
    pub(super) holds: HoldIndex,
    /// Node-local, derived from the store: which families have rows out of memory, and the
    /// filters that spare a fresh id a disk read.
    pub(super) cold: ColdIndex,
    /// Set by the first fatal error; from then on the router refuses all work.
    pub(super) halted: Option<String>,
}

impl FamilyRouter {
    /// A router with an empty family store in memory (tests and tools).
    pub fn new(config: RouterConfig) -> Result<Self, RouterError> {
        Self::with_store(config, FamilyStore::in_memory()?)
    }

    /// A router that passivates families into `store` (a node's file on disk).
    pub fn with_store(config: RouterConfig, store: FamilyStore) -> Result<Self, RouterError> {
        Self::from_parts(
            config,
            RouterState::default(),
            ExpiryIndex::default(),
            ActorTable::new(store),
            ColdIndex::default(),
        )
    }

    /// The router of these parts. Families `actors` holds passivated have their filters
    /// moved to the store (`spill_stored_filters`): a restored router's constructor writes to
    /// its store, so restores build it on a blocking thread.
    pub(super) fn from_parts(
        config: RouterConfig,
        state: RouterState,
        expiry: ExpiryIndex,
        actors: ActorTable,
        cold: ColdIndex,
    ) -> Result<Self, RouterError> {
        config.validate()?;
        // Families restored passivated have not been counted; a new router has none.
        let holds = HoldIndex::uncounted(actors.stored().keys());
        let mut router = Self {
            config,
            state,
            expiry,
            actors,
            holds,
            cold,
            halted: None,
        };
        router.spill_stored_filters()?;
        Ok(router)
    }

    /// Applies committed entries in log order and answers every command, per entry, in input
    /// order. Returns only after every family answered. A fatal error halts the router: the
    /// node must stop, since part of the round may have been applied.
    pub async fn apply(
        &mut self,
        entries: Vec<EntryInput>,
    ) -> Result<Vec<EntryOutput>, RouterError> {
        self.check_running()?;
        let mut outputs = Vec::with_capacity(entries.len());
        for round in batch::split_rounds(entries, self.config.max_commands_per_batch) {
            match self.apply_round(round).await {
                Ok(mut answered) => outputs.append(&mut answered),
                Err(error) => return Err(self.halt(error)),
            }
        }
        Ok(outputs)
    }

    async fn apply_round(
        &mut self,
        entries: Vec<EntryInput>,
    ) -> Result<Vec<EntryOutput>, RouterError> {
        // Families used from this index on were used by this round.
        let round_first_index = entries.first().map_or(0, |entry| entry.log_id.index);
        let params_before = self.state.params;
        let Round { mut outputs, work } = batch::plan(&mut self.state, entries)?;
        // A lowered retention (rules version 3) brings every queued compaction forward, in
        // families this round does not touch too: their maintenance times move with it. A
        // time that was a hold expiry moves as well, and costs that family one early
        // maintenance command, which sets its time right.
        let forward_ms = params_before.compaction_brought_forward_ms(&self.state.params);
        if forward_ms > 0 {
            self.expiry.bring_forward(forward_ms);
        }
        for slice in self.slices(work) {
            self.apply_slice(slice, &mut outputs, round_first_index)
                .await?;
        }
        Ok(outputs.into_iter().map(PendingOutput::finish).collect())
    }

    /// The round's work in slices (`slice_work`): a slice's families are passivated over the
    /// budget before the next is read, so a round that touches every family (the first hold
    /// expiry after a long downtime) holds a slice's stored bytes and decoding at a time, not
    /// every family's at once.
    fn slices(&self, work: BTreeMap<FamilyId, FamilyWork>) -> Vec<BTreeMap<FamilyId, FamilyWork>> {
        slice_work(
            work,
            MAX_STORED_PER_SLICE,
            self.step_bytes(),
            |family_id| match self.actors.locate(family_id) {
                Located::Stored(row) => Some(row.bytes),
                Located::Live(_) | Located::Absent => None,
            },
        )
    }

    /// Live families to passivate, in groups whose footprints add up to at most a step
    /// (`STEP_BYTES_DIVISOR`; a larger family alone), one commit each: a spill of many
    /// families (the budget after a restore's first expiry round, `passivate_idle` after a
    /// burst) holds a group's states, encodings and store pages at a time, not all of them.
    pub(super) fn passivation_groups(&self, families: &[FamilyId]) -> Vec<Vec<FamilyId>> {
        let work = families.iter().map(|family_id| (family_id.clone(), ()));
        slice_work(work.collect(), usize::MAX, self.step_bytes(), |family_id| {
            self.actors.live_footprint(family_id)
        })
        .into_iter()
        .filter(|group| !group.is_empty())
        .map(|group| group.into_keys().collect())
        .collect()
    }

    /// The bytes a step of work (a slice, a passivation commit) may hold.
    fn step_bytes(&self) -> usize {
        (self.config.max_live_bytes / STEP_BYTES_DIVISOR).max(1)
    }

    async fn apply_slice(
        &mut self,
        work: BTreeMap<FamilyId, FamilyWork>,
        outputs: &mut [PendingOutput],
        round_first_index: u64,
    ) -> Result<(), RouterError> {
        // Passivated families come back from the store first, off the async workers, so no
        // actor and no ledger code ever waits on the disk.
        let stored: Vec<FamilyId> = work
            .keys()
            .filter(|family_id| self.actors.is_stored(family_id))
            .cloned()
            .collect();
        let mut fetched = self.fetch_stored(stored).await?;
        let mut cold = self.fetch_cold(&work).await?;
        let mut pending = Vec::with_capacity(work.len());
        for (family_id, family_work) in work {
            let actor =
                self.actors
                    .activate(&family_id, family_work.last_used_index, &mut fetched)?;
            let (reply, answer) = oneshot::channel();
            let message = FamilyMsg::Apply {
                commands: family_work.commands,
                cold: cold.remove(&family_id).unwrap_or_default(),
                reply,
            };
            send(&family_id, &actor, message)?;
            pending.push((family_id, family_work.slots, answer));
        }
        let mut pristine = Vec::new();
        let mut moved = Vec::new();
        for (family_id, slots, answer) in pending {
            let applied = match answer.await {
                Ok(Ok(applied)) => applied,
                Ok(Err(reason)) => return Err(RouterError::FamilyFailed { family_id, reason }),
                Err(_) => return Err(gone(&family_id)),
            };
            assert_eq!(
                applied.results.len(),
                slots.len(),
                "family {family_id} answered a different number of commands than it was sent"
            );
            for ((entry, position), result) in slots.into_iter().zip(applied.results) {
                outputs[entry].fill(position, result);
            }
            self.expiry.set(&family_id, applied.maintenance_due_ms);
            if (applied.maintenance_due_ms).is_some_and(|due| due <= self.state.cluster_time_ms) {
                // Maintenance left work due now (a compaction backlog, done a bounded slice
                // per apply): the next rounds bring the family back, so it counts as in use.
                // Spilled instead, a family larger than the share was encoded and decoded
                // again each round (a restore's hot family: 337 MB of encoding beside its
                // decoded state, measured).
                self.actors.mark_used(&family_id, round_first_index);
            }
            self.holds.applied(&family_id, applied.has_live_holds);
            self.actors
                .set_footprint(&family_id, applied.footprint_bytes);
            self.check_cold_count(&family_id, applied.cold_rows, applied.moved.len())?;
            if applied.pristine {
                pristine.push(family_id);
            } else if !applied.moved.is_empty() {
                moved.push((family_id, applied.moved));
            }
        }
        // Before the next round can name them, and before any family is passivated.
        self.store_moved(moved).await?;
        self.keep_filters_in_their_share().await?;
        self.actors.forget(&pristine).await;
        let spill_before = round_first_index.saturating_sub(self.config.min_idle_entries_to_spill);
        // What rows out of memory keep in memory (filters, rows waiting for disk, the runs'
        // block indexes) counts against the families' share; a family's filters leave
        // memory with it.
        let over = self.actors.over_limit(
            self.config.max_live_actors,
            (self.config.max_live_bytes).saturating_sub(self.actors.store().cold_memory_bytes()),
            self.cold.filter_bytes(),
            |family_id| self.cold.family_filter_bytes(family_id),
            spill_before,
        );
        self.passivate(&over).await?;
        Ok(())
    }

    /// Families whose next hold expiry or compaction is at or before `now_ms`, earliest first:
    /// the leader proposes `Command::ExpireHolds` for them.
    pub fn due_families(&self, now_ms: u64, limit: usize) -> Vec<FamilyId> {
        self.expiry.due(now_ms, limit)
    }

    /// A family's next maintenance time, if it has one.
    pub fn maintenance_due_ms(&self, family_id: &FamilyId) -> Option<u64> {
        self.expiry.due_at(family_id)
    }

    /// Passivates every live family that received no command in the last
    /// `older_than_entries` log entries (`0`: every live family). Returns how many.
    pub async fn passivate_idle(&mut self, older_than_entries: u64) -> Result<usize, RouterError> {
        self.check_running()?;
        let Some(newest_idle) = self
            .state
            .last_applied_index()
            .checked_sub(older_than_entries)
        else {
            return Ok(0);
        };
        let idle = self.actors.idle_before(newest_idle + 1);
        match self.passivate(&idle).await {
            Ok(()) => Ok(idle.len()),
            Err(error) => Err(self.halt(error)),
        }
    }

    pub fn last_applied(&self) -> Option<LogPosition> {
        self.state.last_applied
    }

    pub fn cluster_time_ms(&self) -> u64 {
        self.state.cluster_time_ms
    }

    pub fn params(&self) -> ClusterParams {
        self.state.params
    }

    /// The raised alarms (docs/spec.md §5.6), as of the last applied entry.
    pub fn alarms(&self) -> &super::alarms::Alarms {
        &self.state.alarms
    }

    /// The regions the cluster prefers its leader in, best first (empty: no preference).
    pub fn preferred_leader_regions(&self) -> &[String] {
        &self.state.preferred_leader_regions
    }

    pub fn config(&self) -> RouterConfig {
        self.config
    }

    /// Metric: families with a running actor.
    pub fn live_actors(&self) -> usize {
        self.actors.live_count()
    }

    /// Metric: families passivated into the family store.
    pub fn passivated_families(&self) -> usize {
        self.actors.stored_count()
    }

    /// Metric: the passivated families' encoded state, in bytes (on disk, in the store).
    pub fn passivated_bytes(&self) -> usize {
        self.actors.stored_bytes_total()
    }

    /// What counts against the families' share of the memory budget, read at one moment:
    /// what `/metrics` and `Admin.Status` both show.
    pub fn memory_use(&self) -> MemoryUse {
        MemoryUse {
            share_bytes: self.config.max_live_bytes,
            families_bytes: self.live_footprint_bytes(),
            filter_bytes: self.cold_filter_bytes(),
            store_memory_bytes: self.store().cold_memory_bytes(),
            families_in_memory: self.live_actors(),
            families_on_disk: self.passivated_families(),
        }
    }

    /// Metric: the live families' estimated heap bytes (`Family::footprint_bytes`), what
    /// `max_live_bytes` bounds.
    pub fn live_footprint_bytes(&self) -> usize {
        self.actors.live_footprint_bytes()
    }

    /// Metric: rows out of memory, over all families (in the family store).
    pub fn cold_rows(&self) -> u64 {
        self.cold.total_rows()
    }

    /// Metric: the memory of the filters over rows out of memory.
    pub fn cold_filter_bytes(&self) -> usize {
        self.cold.filter_bytes()
    }

    /// Metric: `(ids looked up among rows out of memory, ids the filters sent to the store)`.
    pub fn cold_lookups(&self) -> (u64, u64) {
        self.cold.lookups()
    }

    /// Metrics: the filters' pages beyond their share, in the page file (`cold_filter`).
    pub fn filter_pages(&self) -> FilterPages {
        let (file_bytes, (block_reads, page_reads, page_writes)) = self.cold.page_file_use();
        FilterPages {
            share_bytes: self.filter_share_bytes(),
            file_bytes,
            pending_hashes: self.cold.pending(),
            block_reads,
            page_reads,
            page_writes,
        }
    }

    /// The family store (its file size, reads and cache, for metrics).
    pub fn store(&self) -> &FamilyStore {
        self.actors.store()
    }

    pub fn family_count(&self) -> usize {
        self.actors.live_count() + self.actors.stored_count()
    }

    pub fn is_live(&self, family_id: &FamilyId) -> bool {
        self.actors.is_live(family_id)
    }

    /// Families known to hold live holds (the hold index; see `hold_index.rs`).
    pub fn families_with_live_holds(&self) -> Vec<FamilyId> {
        self.holds.holding().iter().cloned().collect()
    }

    /// Families restored from a snapshot whose holds are not counted yet: a cross-family
    /// `ListHolds` reads them too, until `rebuild_hold_index` counts them.
    pub fn families_uncounted(&self) -> usize {
        self.holds.uncounted_families().len()
    }

    /// The fatal error that halted the router, if any.
    pub fn halted(&self) -> Option<&str> {
        self.halted.as_deref()
    }

    /// Stops every actor and waits for them, keeping nothing (the state lives in snapshots).
    pub async fn shutdown(mut self) {
        let live: Vec<FamilyId> = self.actors.live().map(|(id, _)| id.clone()).collect();
        self.actors.forget(&live).await;
    }

    pub(super) fn check_running(&self) -> Result<(), RouterError> {
        match &self.halted {
            Some(reason) => Err(RouterError::Halted(reason.clone())),
            None => Ok(()),
        }
    }

    fn halt(&mut self, error: RouterError) -> RouterError {
        if error.is_fatal() && self.halted.is_none() {
            self.halted = Some(error.to_string());
        }
        error
    }
}

/// Splits work into slices, in family order, that each bring back at most `max_families`
/// stored families and at most `max_bytes` of their stored bytes (or one family larger than
/// that); `stored_bytes` says which families are stored, and their size. Families not stored
/// join the slice at hand. Families are independent, so the slicing changes no answer.
fn slice_work<W>(
    work: BTreeMap<FamilyId, W>,
    max_families: usize,
    max_bytes: usize,
    stored_bytes: impl Fn(&FamilyId) -> Option<usize>,
) -> Vec<BTreeMap<FamilyId, W>> {
    assert!(max_families > 0, "a slice must take at least one family");
    let mut slices = vec![BTreeMap::new()];
    let (mut stored_in_last, mut bytes_in_last) = (0, 0);
    for (family_id, family_work) in work {
        if let Some(bytes) = stored_bytes(&family_id) {
            let full = stored_in_last == max_families
                || (stored_in_last > 0 && bytes_in_last + bytes > max_bytes);
            if full {
                slices.push(BTreeMap::new());
                (stored_in_last, bytes_in_last) = (0, 0);
            }
            stored_in_last += 1;
            bytes_in_last += bytes;
        }
        (slices.last_mut())
            .expect("there is always a last slice")
            .insert(family_id, family_work);
    }
    slices
}

impl Drop for FamilyRouter {
    /// Actors do not stop when their references drop; a router going away stops them.
    fn drop(&mut self) {
        self.actors.stop_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Families `a`..`h`: the even ones stored with `bytes` each, the odd ones live or new.
    fn work() -> BTreeMap<FamilyId, ()> {
        ["a", "b", "c", "d", "e", "f", "g", "h"]
            .into_iter()
            .map(|id| (FamilyId::from(id), ()))
            .collect()
    }

    fn stored(bytes: usize) -> impl Fn(&FamilyId) -> Option<usize> {
        move |family_id| (family_id.as_str().as_bytes()[0] % 2 == 1).then_some(bytes)
    }

    fn names(slices: &[BTreeMap<FamilyId, ()>]) -> Vec<String> {
        (slices.iter())
            .map(|slice| slice.keys().map(FamilyId::as_str).collect())
            .collect()
    }

    #[test]
    fn slices_are_bounded_by_stored_families_and_by_their_bytes() {
        // a, c, e, g are stored ('a' is odd in ASCII).
        assert_eq!(
            names(&slice_work(work(), 2, 1_000, stored(10))),
            ["abcd", "efgh"]
        );
        assert_eq!(
            names(&slice_work(work(), 128, 25, stored(10))),
            ["abcd", "efgh"],
            "two stored families of 10 bytes fit in 25, a third does not"
        );
        assert_eq!(
            names(&slice_work(work(), 128, 5, stored(10))),
            ["ab", "cd", "ef", "gh"],
            "a family larger than the bound takes a slice of its own"
        );
        assert_eq!(
            names(&slice_work(work(), 128, 1 << 20, stored(10))),
            ["abcdefgh"]
        );
        assert_eq!(
            names(&slice_work(work(), 1, 1 << 20, |_| None)),
            ["abcdefgh"],
            "families not stored never start a slice"
        );
    }
}
