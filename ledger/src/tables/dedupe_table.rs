//! The dedupe table (docs/spec.md §5): for each `event_id` a family has seen, its stored answer or
//! its tombstone.
//!
//! Every applied command adds a row that is kept for ever (docs/spec.md §5.5). It stays here
//! while its command is retained, then leaves memory for the node's store (`cold.rs`), in
//! about the order rows were added (by due time), so rows sit in a chunked store that is
//! appended at the back and emptied from the front, and the hash table keeps each one's
//! position. Boxing each row instead would cost every command an allocation
//! (a trip into the allocator's bins, since these blocks are never freed to refill its
//! caches) and 16 bytes of allocator header per row for ever. Tombstones are removed when
//! they are compacted, so they stay boxed.
//!
//! Encoded as an id-keyed map of rows, in id order, whatever the store's layout. Decoding
//! appends the applied rows in that id order, so every replica lays the store out alike
//! (nothing reads the layout but this table).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::commit_index::{BudgetCommitIndex, LogPosition};
use crate::decision::{Decision, Outcome};
use crate::ids::EventId;
use crate::tables::chunked_deque::ChunkedDeque;
use crate::tables::compaction_queue::QueueKey;
use crate::tables::id_map::{deserialize_unique_rows, UniqueRows};
use crate::tables::id_table::{IdTable, RowHash};

/// What a row keeps of its command's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RowIdentity {
    #[serde(with = "crate::identity::serde_bytes_array")]
    pub digest: [u8; 32],
    /// The queue item that holds the field hashes until it falls due.
    pub retained: QueueKey,
}

/// An applied command's stored answer (its `Decision` less the id, which is the row's key).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AppliedRow {
    pub identity: RowIdentity,
    pub outcome: Outcome,
    pub commit_index: Option<BudgetCommitIndex>,
    pub log_id: Option<LogPosition>,
}

impl AppliedRow {
    /// The answer as it was first given.
    pub fn decision(&self, event_id: &EventId) -> Decision {
        Decision {
            event_id: event_id.clone(),
            outcome: self.outcome.clone(),
            commit_index: self.commit_index,
            log_id: self.log_id,
            replayed: false,
        }
    }
}

#[derive(Clone, Default)]
pub(crate) struct DedupeTable {
    slots: IdTable<EventId, Slot>,
    /// Applied rows in the order they were stored; a slot names its row by position,
    /// counted from the first row ever stored. A row taken out leaves `None` until every row
    /// before it is gone too.
    applied: ChunkedDeque<Option<AppliedRow>>,
    /// Rows dropped from the front of `applied`: the position of its first element.
    applied_base: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Slot {
    Applied(usize),
    Tombstoned(Box<RowIdentity>),
}

/// A row as read: an applied command's answer or a tombstone. Its encoding is a row's in
/// snapshots; `DecodedRow` reads it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename = "DedupeEntry")]
pub(crate) enum DedupeRow<'t> {
    Applied(&'t AppliedRow),
    Tombstoned(&'t RowIdentity),
}

/// A row as decoded from a snapshot: `DedupeRow`'s encoding, owned.
#[derive(Deserialize)]
#[serde(rename = "DedupeEntry")]
enum DecodedRow {
    Applied(AppliedRow),
    Tombstoned(Box<RowIdentity>),
}

impl DedupeTable {
    fn row<'t>(&'t self, slot: &'t Slot) -> DedupeRow<'t> {
        match slot {
            Slot::Applied(at) => DedupeRow::Applied(
                self.applied
                    .get(*at - self.applied_base)
                    .and_then(Option::as_ref)
                    .expect("an applied slot names a stored row"),
            ),
            Slot::Tombstoned(identity) => DedupeRow::Tombstoned(identity),
        }
    }

    pub fn get(&self, event_id: &EventId) -> Option<DedupeRow<'_>> {
        self.slots.get(event_id).map(|slot| self.row(slot))
    }

    /// The row of `event_id`, and where its row goes if it has none (see `insert_applied`).
    #[inline]
    pub fn find(&self, event_id: &EventId) -> (RowHash, Option<DedupeRow<'_>>) {
        let (hash, slot) = self.slots.find(event_id);
        (hash, slot.map(|slot| self.row(slot)))
    }

    /// Stores the row of a command `find` found no row for, with the hash it returned.
    #[inline]
    pub fn insert_applied(&mut self, hash: RowHash, event_id: EventId, row: AppliedRow) {
        self.slots.insert_absent(
            hash,
            event_id,
            Slot::Applied(self.applied_base + self.applied.len()),
        );
        self.applied.push_back(Some(row));
    }

    /// Takes an applied row out (it is leaving memory, `cold.rs`). A tombstone or no row is
    /// a broken invariant: compaction only moves the rows of applied commands.
    pub fn take_applied(&mut self, event_id: &EventId) -> AppliedRow {
        let at = match self.slots.remove(event_id) {
            Some(Slot::Applied(at)) => at,
            other => panic!("event {event_id:?}: moving its applied row out, found {other:?}"),
        };
        let row = self
            .applied
            .get_mut(at - self.applied_base)
            .and_then(Option::take)
            .unwrap_or_else(|| panic!("event {event_id:?}: its slot names no stored row"));
        while self.applied.front().is_some_and(Option::is_none) {
            self.applied.discard_front();
            self.applied_base += 1;
        }
        row
    }

    /// Stores a tombstone under a new id; `false` (and nothing changed) if the id has a row.
    pub fn insert_tombstone(&mut self, event_id: EventId, identity: RowIdentity) -> bool {
        let (hash, row) = self.slots.find(&event_id);
        if row.is_some() {
            return false;
        }
        self.file_tombstone(hash, event_id, Box::new(identity));
        true
    }

    fn file_tombstone(&mut self, hash: RowHash, event_id: EventId, identity: Box<RowIdentity>) {
        self.slots
            .insert_absent(hash, event_id, Slot::Tombstoned(identity));
    }

    /// Removes a tombstone. An applied row is only ever moved out (`take_applied`): asking to
    /// remove one is a broken invariant (and a family that panicked is discarded, so the row
    /// taken out is never missed).
    pub fn remove_tombstone(&mut self, event_id: &EventId) -> Option<RowIdentity> {
        match self.slots.remove(event_id)? {
            Slot::Tombstoned(identity) => Some(*identity),
            Slot::Applied(_) => panic!("event {event_id:?}: an applied row cannot be removed"),
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Rows in id order (sorts them: for encoding and reports, not the apply path).
    fn sorted(&self) -> Vec<(&EventId, DedupeRow<'_>)> {
        self.slots
            .sorted()
            .into_iter()
            .map(|(id, slot)| (id, self.row(slot)))
            .collect()
    }
}

impl PartialEq for DedupeTable {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
            && self
                .slots
                .iter_unordered()
                .all(|(id, slot)| other.get(id) == Some(self.row(slot)))
    }
}

impl Eq for DedupeTable {}

impl fmt::Debug for DedupeTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.sorted()).finish()
    }
}

impl Serialize for DedupeTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (id, row) in self.sorted() {
            map.serialize_entry(id, &row)?;
        }
        map.end()
    }
}

impl UniqueRows<EventId, DecodedRow> for DedupeTable {
    fn insert_new(&mut self, event_id: EventId, row: DecodedRow) -> Result<(), EventId> {
        let (hash, found) = self.slots.find(&event_id);
        if found.is_some() {
            return Err(event_id);
        }
        match row {
            DecodedRow::Applied(row) => self.insert_applied(hash, event_id, row),
            DecodedRow::Tombstoned(identity) => self.file_tombstone(hash, event_id, identity),
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for DedupeTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_unique_rows(deserializer)
    }
}
