//! Compact rows that leave memory (docs/spec.md §5.5). When a command's retention ends, its
//! dedupe row is compact (its answer and identity digest), and when a final hold's retention
//! ends, it is archived; from then on only a command or read naming that id looks at the row
//! again, so it leaves the family for the node's store on disk and comes back only as an
//! input to the command that names it. That bounds a family in use by its retention window,
//! not by its age.
//!
//! Which rows leave, and when, is decided here in log order, so it is replicated state: every
//! replica moves the same rows at the same command, whatever its memory budget, and a
//! family encodes (and digests) alike everywhere. The family keeps a count and an
//! order-independent digest of the rows it moved out (`ColdMeta`), so its own digest covers
//! them, and a snapshot's rows can be checked against it as they stream in.
//!
//! The ledger never reads the store. Before a batch the node looks up every id the batch's
//! commands name (`Command::cold_keys`) and hands the answers in (`ColdFetch`); rows moved
//! out during the batch are still here (`ColdRows::moved`). An id that was not looked up in a
//! family with rows out is a fault of the node, and apply stops rather than guess.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hasher};

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::command::Command;
use crate::hold::ArchivedHold;
use crate::ids::{EventId, HoldId};
use crate::tables::dedupe_table::AppliedRow;

const EVENT_KIND: u8 = 0;
const HOLD_KIND: u8 = 1;
/// Room for a typical encoded row (a compact dedupe row or an archived hold).
const ROW_CAPACITY_BYTES: usize = 192;

/// The id of a row out of memory, within its family.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ColdKey {
    Event(EventId),
    Hold(HoldId),
}

impl ColdKey {
    pub fn as_key_ref(&self) -> ColdKeyRef<'_> {
        match self {
            Self::Event(id) => ColdKeyRef::event(id),
            Self::Hold(id) => ColdKeyRef::hold(id),
        }
    }

    /// The key's bytes in the store (within its family): a kind byte, then the id.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.as_key_ref().to_bytes()
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ColdRowError> {
        let (kind, id) = bytes
            .split_first()
            .ok_or_else(|| ColdRowError("an empty key".into()))?;
        let id = std::str::from_utf8(id)
            .map_err(|_| ColdRowError("a key whose id is not UTF-8".into()))?;
        match *kind {
            EVENT_KIND => Ok(Self::Event(EventId::from(id))),
            HOLD_KIND => Ok(Self::Hold(HoldId::from(id))),
            other => Err(ColdRowError(format!("a key of unknown kind {other}"))),
        }
    }
}

/// A `ColdKey` borrowed from the command that names it: how a node looks a batch's ids up
/// without a copy of each.
#[derive(Clone, Copy, Debug)]
pub struct ColdKeyRef<'k> {
    kind: u8,
    id: &'k str,
}

impl<'k> ColdKeyRef<'k> {
    pub fn event(id: &'k EventId) -> Self {
        Self {
            kind: EVENT_KIND,
            id: id.as_str(),
        }
    }

    pub fn hold(id: &'k HoldId) -> Self {
        Self {
            kind: HOLD_KIND,
            id: id.as_str(),
        }
    }

    pub fn to_key(self) -> ColdKey {
        match self.kind {
            EVENT_KIND => ColdKey::Event(EventId::from(self.id)),
            _ => ColdKey::Hold(HoldId::from(self.id)),
        }
    }

    /// `ColdKey::to_bytes`.
    pub fn to_bytes(self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(1 + self.id.len());
        bytes.push(self.kind);
        bytes.extend_from_slice(self.id.as_bytes());
        bytes
    }

    /// The hash of the key's bytes (`ColdKeyHash::of_bytes(&self.to_bytes())`), without them.
    pub fn key_hash(self) -> ColdKeyHash {
        let mut hasher = DefaultHasher::new();
        // A streaming hash: two writes hash as one write of both.
        hasher.write(&[self.kind]);
        hasher.write(self.id.as_bytes());
        ColdKeyHash(hasher.finish())
    }
}

/// A 64-bit hash of a key's bytes: what a node's filters over rows out of memory are probed
/// with, and how a fetch records an id looked up and not stored. The same for the same bytes
/// within one build (the filters are rebuilt at every start; nothing replicated holds it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ColdKeyHash(u64);

impl ColdKeyHash {
    pub fn of_bytes(bytes: &[u8]) -> Self {
        let mut hasher = DefaultHasher::new();
        hasher.write(bytes);
        Self(hasher.finish())
    }

    pub fn value(self) -> u64 {
        self.0
    }
}

/// A stored row or key that does not decode: the node's store is damaged (fatal to the node).
#[derive(Debug, thiserror::Error)]
#[error("a row out of memory does not decode: {0}")]
pub struct ColdRowError(String);

/// A row's body, as stored; `ColdRowRef` writes the same bytes from borrowed parts.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename = "ColdRowBody")]
enum ColdRowBody {
    Applied(AppliedRow),
    Hold(ArchivedHold),
    /// Rules version 2 on: the claim of a denied authorize on its `hold_id` (the event that
    /// claimed it). Last, so the other rows encode as before it existed.
    DeniedHold(EventId),
}

/// A row's body as it is encoded: `ColdRowBody`'s encoding, borrowed.
#[derive(Serialize)]
#[serde(rename = "ColdRowBody")]
enum ColdRowRef<'r> {
    Applied(&'r AppliedRow),
    Hold(&'r ArchivedHold),
    DeniedHold(&'r EventId),
}

/// What a `hold_id` names among the rows out of memory: an archived hold, or the claim of a
/// denied authorize (in memory, `HoldSlot::Archived` and `HoldSlot::Denied`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColdHold {
    Archived(ArchivedHold),
    Denied { event_id: EventId },
}

impl ColdHold {
    /// The read of it (`GetHold`).
    pub fn into_view(self, hold_id: &HoldId) -> crate::hold::HoldView {
        match self {
            Self::Archived(hold) => crate::hold::HoldView::Archived {
                hold_id: hold_id.clone(),
                hold,
            },
            Self::Denied { event_id } => crate::hold::HoldView::Denied {
                hold_id: hold_id.clone(),
                event_id,
            },
        }
    }
}

/// The rows a family moved out, counted and digested. Replicated: part of the family's
/// encoding (left out while empty, so a family that never moved a row encodes as before).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColdMeta {
    pub rows: u64,
    /// The wrapping sum, in four 64-bit lanes, of SHA-256 over each row's key and bytes:
    /// independent of order, so a store read back in key order checks against it.
    #[serde(with = "crate::identity::serde_bytes_array")]
    pub digest: [u8; 32],
}

impl ColdMeta {
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Counts one row in (its key within the family and its bytes).
    pub fn add(&mut self, key: &[u8], row: &[u8]) {
        let mut hasher = Sha256::new();
        hasher.update((key.len() as u64).to_be_bytes());
        hasher.update(key);
        hasher.update(row);
        let hash: [u8; 32] = hasher.finalize().into();
        for lane in 0..4 {
            let at = lane * 8;
            let sum = u64::from_be_bytes(self.digest[at..at + 8].try_into().expect("8 bytes"))
                .wrapping_add(u64::from_be_bytes(
                    hash[at..at + 8].try_into().expect("8 bytes"),
                ));
            self.digest[at..at + 8].copy_from_slice(&sum.to_be_bytes());
        }
        self.rows += 1;
    }

    /// The meta of a family's canonical encoding, read without decoding its tables: how a
    /// node restoring a snapshot checks the rows that stream in after the families.
    pub fn of_family_bytes(bytes: &[u8]) -> Result<Self, rmp_serde::decode::Error> {
        /// `Family`'s encoded fields, skipped, then its meta (absent while empty).
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Peek {
            family_id: IgnoredAny,
            accounts: IgnoredAny,
            holds: IgnoredAny,
            dedupe: IgnoredAny,
            journal: IgnoredAny,
            nonces: IgnoredAny,
            expiry_index: IgnoredAny,
            compaction_queue: IgnoredAny,
            live_holds: IgnoredAny,
            #[serde(default)]
            cold: ColdMeta,
        }
        Ok(rmp_serde::from_slice::<Peek>(bytes)?.cold)
    }
}

/// A row moved out by the last batch: its key within the family and its bytes, for the node
/// to store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MovedRow {
    pub key: Vec<u8>,
    pub row: Vec<u8>,
}

/// What the node looked up for one batch: for every id the batch names, the stored row, or
/// that it is not stored. Almost every id is fresh and told apart by a filter, so "not
/// stored" is kept as the id's hash, not as a map entry with a copy of the id.
#[derive(Clone, Debug, Default)]
pub struct ColdFetch {
    events: BTreeMap<EventId, AppliedRow>,
    holds: BTreeMap<HoldId, ColdHold>,
    /// The hashes of the ids looked up and not stored; sorted when the batch starts.
    absent: Vec<ColdKeyHash>,
}

impl ColdFetch {
    /// Records the store's answer for `key`: its bytes, or `None`.
    pub fn record(&mut self, key: ColdKey, bytes: Option<&[u8]>) -> Result<(), ColdRowError> {
        let Some(bytes) = bytes else {
            self.record_absent(key.as_key_ref().key_hash());
            return Ok(());
        };
        match (key, decode_body(bytes)?) {
            (ColdKey::Event(id), ColdRowBody::Applied(row)) => {
                self.events.insert(id, row).map(drop)
            }
            (ColdKey::Hold(id), ColdRowBody::Hold(hold)) => {
                self.holds.insert(id, ColdHold::Archived(hold)).map(drop)
            }
            (ColdKey::Hold(id), ColdRowBody::DeniedHold(event_id)) => self
                .holds
                .insert(id, ColdHold::Denied { event_id })
                .map(drop),
            (key, _) => return Err(another_kind(&key)),
        };
        Ok(())
    }

    /// Records that the id whose key hashes to `hash` (`ColdKeyRef::key_hash`) is not stored.
    pub fn record_absent(&mut self, hash: ColdKeyHash) {
        self.absent.push(hash);
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.holds.is_empty() && self.absent.is_empty()
    }

    /// Every id `commands` name, recorded as not stored: for benchmarks and tools that
    /// apply only fresh ids to a family whose rows out of memory they dropped.
    pub fn absent<'c>(commands: impl IntoIterator<Item = &'c Command>) -> Self {
        let mut fetch = Self::default();
        for key in commands.into_iter().flat_map(Command::cold_key_refs) {
            fetch.record_absent(key.key_hash());
        }
        fetch
    }

    /// Whether the id of `key` was looked up and found not stored (after `seal`).
    fn is_absent(&self, key: ColdKeyRef<'_>) -> bool {
        self.absent.binary_search(&key.key_hash()).is_ok()
    }

    fn seal(&mut self) {
        self.absent.sort_unstable();
    }
}

fn decode_body(bytes: &[u8]) -> Result<ColdRowBody, ColdRowError> {
    rmp_serde::from_slice(bytes).map_err(|error| ColdRowError(error.to_string()))
}

fn another_kind(key: &ColdKey) -> ColdRowError {
    ColdRowError(format!("{key:?} holds another kind of row"))
}

/// The node-local side of a family's rows out of memory: what was looked up for the current
/// batch and what the current (or, between batches, the last) batch moved out. Never
/// encoded, digested or compared.
#[derive(Clone, Debug, Default)]
pub(crate) struct ColdRows {
    fetched: ColdFetch,
    moved_events: BTreeMap<EventId, AppliedRow>,
    moved_holds: BTreeMap<HoldId, ColdHold>,
    moved: Vec<MovedRow>,
}

impl PartialEq for ColdRows {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ColdRows {}

/// Looks rows up for apply: among the rows moved out by this batch, then among those the node
/// fetched. Cheap to copy; built from the family's meta and node-local rows.
#[derive(Clone, Copy)]
pub(crate) struct ColdLookup<'f> {
    pub meta: &'f ColdMeta,
    pub rows: &'f ColdRows,
}

impl<'f> ColdLookup<'f> {
    pub fn event(&self, event_id: &EventId) -> Option<&'f AppliedRow> {
        let rows = self.rows;
        let key = ColdKeyRef::event(event_id);
        self.find(
            event_id,
            key,
            &rows.moved_events,
            &rows.fetched.events,
            "event",
        )
    }

    pub fn hold(&self, hold_id: &HoldId) -> Option<&'f ColdHold> {
        let rows = self.rows;
        let key = ColdKeyRef::hold(hold_id);
        self.find(hold_id, key, &rows.moved_holds, &rows.fetched.holds, "hold")
    }

    /// The row of `id` among those this batch moved, then those the node fetched. An id the
    /// node did not look up is fine only if every row out moved during this batch.
    fn find<K: Ord + std::fmt::Display, V>(
        &self,
        id: &K,
        key: ColdKeyRef<'_>,
        moved: &'f BTreeMap<K, V>,
        fetched: &'f BTreeMap<K, V>,
        what: &str,
    ) -> Option<&'f V> {
        if self.meta.is_empty() {
            return None;
        }
        if let Some(row) = moved.get(id).or_else(|| fetched.get(id)) {
            return Some(row);
        }
        if self.rows.fetched.is_absent(key) {
            return None;
        }
        assert_eq!(
            self.meta.rows,
            self.rows.moved_count(),
            "{what} {id} was not looked up among the rows out of memory before the batch"
        );
        None
    }
}

impl ColdRows {
    /// Starts a batch: the rows of the last one are in the node's store by now.
    pub fn start_batch(&mut self, mut fetched: ColdFetch) {
        fetched.seal();
        self.fetched = fetched;
        self.moved_events.clear();
        self.moved_holds.clear();
        self.moved.clear();
    }

    /// Rows moved out by this batch (or, between batches, the last one), stored or not.
    fn moved_count(&self) -> u64 {
        (self.moved_events.len() + self.moved_holds.len()) as u64
    }

    /// The encoded rows moved out since the last call, for the node to store; the decoded
    /// ones stay for reads until the next batch.
    pub fn take_moved(&mut self) -> Vec<MovedRow> {
        std::mem::take(&mut self.moved)
    }

    pub fn moved_event(&self, event_id: &EventId) -> Option<&AppliedRow> {
        self.moved_events.get(event_id)
    }

    pub fn moved_hold(&self, hold_id: &HoldId) -> Option<&ColdHold> {
        self.moved_holds.get(hold_id)
    }

    /// Moves an applied row out, counting it in `meta`.
    pub fn move_event(&mut self, meta: &mut ColdMeta, event_id: EventId, row: AppliedRow) {
        self.push(
            meta,
            ColdKey::Event(event_id.clone()),
            &ColdRowRef::Applied(&row),
        );
        self.moved_events.insert(event_id, row);
    }

    /// Moves an archived hold out, counting it in `meta`.
    pub fn move_hold(&mut self, meta: &mut ColdMeta, hold_id: HoldId, hold: ArchivedHold) {
        self.push(
            meta,
            ColdKey::Hold(hold_id.clone()),
            &ColdRowRef::Hold(&hold),
        );
        self.moved_holds.insert(hold_id, ColdHold::Archived(hold));
    }

    /// Moves a denied authorize's claim on `hold_id` out, counting it in `meta`.
    pub fn move_denied_hold(&mut self, meta: &mut ColdMeta, hold_id: HoldId, event_id: EventId) {
        self.push(
            meta,
            ColdKey::Hold(hold_id.clone()),
            &ColdRowRef::DeniedHold(&event_id),
        );
        self.moved_holds
            .insert(hold_id, ColdHold::Denied { event_id });
    }

    fn push(&mut self, meta: &mut ColdMeta, key: ColdKey, body: &ColdRowRef<'_>) {
        let key = key.to_bytes();
        // Sized up front: growing from empty took six allocations for a ~150-byte row.
        let mut row = Vec::with_capacity(ROW_CAPACITY_BYTES);
        // Plain ids, integers and enums: a row always encodes.
        rmp_serde::encode::write(&mut row, body).expect("a row out of memory always encodes");
        meta.add(&key, &row);
        self.moved.push(MovedRow { key, row });
    }
}

impl Command {
    /// Every id this command may look up among a family's rows out of memory: its event id
    /// (a replay, a conflict, a resolve) and the hold it names. Apply asserts each lookup was
    /// answered, so this list and the ledger's lookups cannot drift apart silently.
    pub fn cold_keys(&self) -> Vec<ColdKey> {
        self.cold_key_refs().map(ColdKeyRef::to_key).collect()
    }

    /// `cold_keys`, borrowed from the command.
    pub fn cold_key_refs(&self) -> impl Iterator<Item = ColdKeyRef<'_>> {
        let (event, hold) = match self {
            Self::Apply(cmd) | Self::Resolve(cmd) => (
                Some(ColdKeyRef::event(&cmd.header.event_id)),
                cmd.op.hold_id().map(ColdKeyRef::hold),
            ),
            Self::ExpireHolds { .. } => (None, None),
        };
        event.into_iter().chain(hold)
    }
}

/// A family's rows out of memory kept in a map: how tests, benchmarks and tools drive a
/// family the way a node does (look up what a command names, apply, keep what moved out).
#[derive(Clone, Debug, Default)]
pub struct ColdRowsInMemory {
    rows: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl ColdRowsInMemory {
    /// What a node would hand `family` for a batch of `commands`.
    pub fn fetch_for<'c>(
        &self,
        family: &crate::family::Family,
        commands: impl IntoIterator<Item = &'c Command>,
    ) -> ColdFetch {
        let mut fetch = ColdFetch::default();
        if family.cold_meta().is_empty() {
            return fetch;
        }
        for key in commands.into_iter().flat_map(Command::cold_keys) {
            let bytes = self.rows.get(&key.to_bytes()).map(Vec::as_slice);
            fetch
                .record(key, bytes)
                .expect("rows kept in memory decode");
        }
        fetch
    }

    /// Keeps the rows `family`'s last batch moved out.
    pub fn absorb(&mut self, family: &mut crate::family::Family) {
        for moved in family.take_moved_rows() {
            let previous = self.rows.insert(moved.key, moved.row);
            assert!(previous.is_none(), "a row moved out of memory twice");
        }
    }

    /// Applies one command as a batch of its own, as a node would.
    pub fn apply(
        &mut self,
        family: &mut crate::family::Family,
        command: &Command,
        ctx: &crate::family::ApplyCtx,
    ) -> Result<crate::decision::Decision, crate::error::LedgerError> {
        let fetch = self.fetch_for(family, [command]);
        family.start_batch(fetch);
        let result = family.apply(command, ctx);
        self.absorb(family);
        result
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The stored row of `key`, if any.
    pub fn get(&self, key: &ColdKey) -> Option<&[u8]> {
        self.rows.get(&key.to_bytes()).map(Vec::as_slice)
    }

    /// Every row, counted and digested as a family's meta is.
    pub fn meta(&self) -> ColdMeta {
        let mut meta = ColdMeta::default();
        for (key, row) in &self.rows {
            meta.add(key, row);
        }
        meta
    }
}

/// A read of `event_id` finished the way a node finishes it: `found` is what the family in
/// memory answered (`Family::get_event`), `stored` the node's stored row for the id, looked
/// up only when the family did not know it.
pub fn event_read_with_stored(
    found: crate::event::EventLookup,
    event_id: &EventId,
    stored: Option<&[u8]>,
) -> Result<crate::event::EventLookup, ColdRowError> {
    use crate::event::EventLookup;
    match (found, stored) {
        (EventLookup::Unknown, Some(bytes)) => match decode_body(bytes)? {
            ColdRowBody::Applied(row) => Ok(EventLookup::Applied {
                decision: row.decision(event_id),
                record: None,
            }),
            ColdRowBody::Hold(_) | ColdRowBody::DeniedHold(_) => {
                Err(another_kind(&ColdKey::Event(event_id.clone())))
            }
        },
        (found, _) => Ok(found),
    }
}

/// A read of `hold_id` finished the way a node finishes it (see `event_read_with_stored`).
pub fn hold_read_with_stored(
    found: Option<crate::hold::HoldView>,
    hold_id: &HoldId,
    stored: Option<&[u8]>,
) -> Result<Option<crate::hold::HoldView>, ColdRowError> {
    match (found, stored) {
        (None, Some(bytes)) => match decode_body(bytes)? {
            ColdRowBody::Hold(hold) => Ok(Some(ColdHold::Archived(hold).into_view(hold_id))),
            ColdRowBody::DeniedHold(event_id) => {
                Ok(Some(ColdHold::Denied { event_id }.into_view(hold_id)))
            }
            ColdRowBody::Applied(_) => Err(another_kind(&ColdKey::Hold(hold_id.clone()))),
        },
        (found, _) => Ok(found),
    }
}

impl ColdRowsInMemory {
    /// `GetEvent` as a node answers it: the family, then the stored rows.
    pub fn get_event(
        &self,
        family: &crate::family::Family,
        event_id: &EventId,
    ) -> crate::event::EventLookup {
        let stored = self.get(&ColdKey::Event(event_id.clone()));
        event_read_with_stored(family.get_event(event_id), event_id, stored)
            .expect("rows kept in memory decode")
    }

    /// `GetHold` as a node answers it: the family, then the stored rows.
    pub fn get_hold(
        &self,
        family: &crate::family::Family,
        hold_id: &HoldId,
    ) -> Option<crate::hold::HoldView> {
        let stored = self.get(&ColdKey::Hold(hold_id.clone()));
        hold_read_with_stored(family.get_hold(hold_id), hold_id, stored)
            .expect("rows kept in memory decode")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key's hash is the hash of its bytes, however it is computed, for both kinds and ids
    /// of any length; and a hold and an event with the same id hash apart.
    #[test]
    fn a_borrowed_key_hashes_as_its_bytes() {
        for id in ["", "e", "event-1", &"x".repeat(300), "\u{0}\u{1}é"] {
            for key in [
                ColdKey::Event(EventId::from(id)),
                ColdKey::Hold(HoldId::from(id)),
            ] {
                let bytes = key.to_bytes();
                assert_eq!(key.as_key_ref().key_hash(), ColdKeyHash::of_bytes(&bytes));
                assert_eq!(key.as_key_ref().to_key(), key);
                assert_eq!(ColdKey::from_bytes(&bytes).expect("decodes"), key);
            }
            assert_ne!(
                ColdKeyRef::event(&EventId::from(id)).key_hash(),
                ColdKeyRef::hold(&HoldId::from(id)).key_hash()
            );
        }
    }
}
