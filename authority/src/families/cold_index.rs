//! Node-local: which families have rows out of memory (`tally_ledger::cold`), how many, and a
//! filter per family that tells an id that never moved out from one that may have, so a
//! command with a fresh event id costs no disk read (docs/sizing.md). Derived from the
//! store's rows; nothing replicated depends on it. A node saves it with its own snapshots
//! (`ColdIndex::share` copies it at the cut, `write_to` and `read_from` persist it), so a
//! restart loads it instead of re-reading every row; a snapshot received from another node
//! still rebuilds it from its rows.
//!
//! The copy at a cut shares the filters' bits in 64 KiB pages, copied on write: an add after
//! the cut copies only the page its key's bits land in, never a whole filter. The cut pauses
//! the apply path, and the adds after it run there; copying a family's newest filter whole
//! would cost a memcpy there once per snapshot, 128 MiB of it for a family of 50 million rows.
//!
//! A family's filter is a list of Bloom filters (`cold_filter`), each for four times as many
//! keys as the one before, so a family with few rows costs little and a family with 50
//! million is probed nine times. A full filter answers "maybe" for about 1 in 2,000 absent
//! keys, so an absent key passes all of a family's filters well under 1% of the time (the
//! target for disk reads per fresh id). The newest filter is sized ahead of its keys: from 2
//! bytes per row, up to 8 right after one is added.
//!
//! Beyond the filters' share of the memory budget (`to_evict`), the pages of the largest
//! filters go to a scratch file and a lookup reads one 4 KiB block of each such filter it
//! reaches (`Lookup::Read`, on a blocking thread); a page whose hashes waiting beside it pass
//! a limit is read back and they are set (`to_flush`). Both are bounded per round.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Display;
use std::io::{Read, Write};
use std::sync::Arc;

use tally_ledger::limits::MAX_ID_BYTES;
use tally_ledger::{ColdKeyHash, FamilyId};

use super::cold_filter::{filter_words, page_words, write_words, BlockRead, Bloom, Page, Probe};
use super::cold_filter::{page_file_error, FilterPageFile, Slot};
use super::error::RouterError;

/// The first filter's keys; each next one takes `GROWTH` times as many. With these, every
/// filter's size is a power of two (`cold_filter` relies on it).
const FIRST_FILTER_KEYS: usize = 1_024;
const GROWTH: usize = 4;

/// The saved form's format number (`ColdIndex::write_to`): 2 since the filters are blocked
/// (`cold_filter`); a node's own snapshot saved with 1 has its filters rebuilt from its rows.
const FORMAT: u32 = 2;
const UNBLOCKED_FORMAT: u32 = 1;
/// Most filters a saved family may claim: 27 already overflow a 64-bit capacity.
const MAX_FILTERS: usize = 32;
/// Families a reader makes room for before it has read them: a claimed count is not trusted.
const MAX_FAMILIES_RESERVED: usize = 1_024;

#[derive(Default)]
pub(crate) struct ColdIndex {
    /// Hashed, not ordered: every round looks each of its families up, and a B-tree of
    /// string keys cost ~2% of a node's CPU in cache misses (perf, 6,000 commands/s).
    families: HashMap<FamilyId, ColdFamily, foldhash::fast::RandomState>,
    /// The filters' memory (`Bloom::memory_bytes`), summed over families.
    filter_bytes: usize,
    /// Hashes waiting beside pages on disk, over all families (`Bloom::pending`).
    pending: usize,
    /// Where pages beyond the filters' share go, once one does.
    page_file: Option<Arc<FilterPageFile>>,
    /// Ids looked up before a batch, and those the filters passed on to the store.
    lookups: u64,
    passed: u64,
}

/// What a family's filters say of an id (`FamilyFilters::lookup`).
pub(crate) enum Lookup {
    /// No filter may hold it: certain.
    Absent,
    /// A filter in memory may hold it: the store answers.
    Maybe,
    /// No filter in memory holds it; these blocks on disk tell (`BlockRead::may_contain`),
    /// and then `ColdIndex::count_read` counts what they said.
    Read(Vec<BlockRead>),
}

/// A page in memory to write to the page file (`ColdIndex::to_evict`).
pub(crate) struct Eviction {
    family_id: FamilyId,
    filter: usize,
    page: usize,
    words: Arc<[u64]>,
}

impl Eviction {
    pub fn words(&self) -> &[u64] {
        &self.words
    }
}

/// A page on disk to read back and set its waiting hashes in (`ColdIndex::to_flush`).
pub(crate) struct Flush {
    family_id: FamilyId,
    filter: usize,
    page: usize,
    slot: Arc<Slot>,
    words: usize,
}

impl Flush {
    /// The page as its slot holds it. Blocking.
    pub fn read(&self) -> std::io::Result<Vec<u64>> {
        self.slot.read_page(self.words)
    }
}

/// One family's filters, borrowed for a round's lookups (`ColdIndex::family`).
pub(crate) struct FamilyFilters<'i> {
    family: &'i ColdFamily,
    lookups: &'i mut u64,
    passed: &'i mut u64,
}

impl FamilyFilters<'_> {
    /// Whether the key (within the family) that hashes to `hash` may be among the family's
    /// rows, or which blocks on disk tell: `Absent` is certain.
    pub fn lookup(&mut self, hash: ColdKeyHash) -> Lookup {
        let hash = hash.value();
        *self.lookups += 1;
        let mut reads = Vec::new();
        for filter in &self.family.filters {
            match filter.probe(hash) {
                Probe::Absent => {}
                Probe::Maybe => {
                    *self.passed += 1;
                    return Lookup::Maybe;
                }
                Probe::Read(block) => reads.push(block),
            }
        }
        if reads.is_empty() {
            Lookup::Absent
        } else {
            Lookup::Read(reads)
        }
    }
}

/// Shared filters: a copy (`ColdIndex::share`) costs a reference per page of each filter (and
/// the hashes waiting beside pages on disk), and an insert copies first only the page a copy
/// still holds (`Bloom::insert`).
#[derive(Clone, Default)]
struct ColdFamily {
    rows: u64,
    /// Empty while the filters are in the family store (`in_store`).
    filters: Vec<Bloom>,
    /// The rows of the filters the family store holds for the family, if it holds any. Rows
    /// only join a family, so while this is `rows` the store's copy is the filters in memory
    /// and spilling them again writes nothing (a family brought back and let go before its
    /// next compaction, the common case at a long retention).
    stored_rows: Option<u64>,
}

impl ColdFamily {
    /// The filters are in the family store, not in memory (`ColdIndex::to_spill`): only while
    /// the family is passivated, so no round looks an id up in them. A family with rows has
    /// at least one filter in memory otherwise, so no flag is kept.
    fn in_store(&self) -> bool {
        self.rows > 0 && self.filters.is_empty()
    }

    fn memory_bytes(&self) -> usize {
        self.filters.iter().map(Bloom::memory_bytes).sum()
    }

    fn pending(&self) -> usize {
        self.filters.iter().map(Bloom::pending).sum()
    }
}

/// A passivated family's filters on their way to the family store (`ColdIndex::to_spill`):
/// their pages shared with the index, encoded off the async workers.
pub(crate) struct FiltersToSpill(ColdFamily);

impl FiltersToSpill {
    /// The family's part of `ColdIndex::write_to` after its id: what the store keeps.
    /// Blocking: its pages on disk are read back.
    pub fn encode(&self) -> Result<Vec<u8>, RouterError> {
        let mut bytes = Vec::with_capacity(encoded_family_len(self.0.rows));
        write_family(&mut bytes, &self.0, &mut Vec::new())?;
        Ok(bytes)
    }
}

/// A family's filters read back from the family store (`ColdIndex::decode_spilled`).
pub(crate) struct SpilledFilters(ColdFamily);

/// Where the pages of filters read back go (`ColdIndex::read_back_room`): memory while
/// `room_bytes` lasts, then the page file, if there is one.
pub(crate) struct PageRoom {
    room_bytes: usize,
    file: Option<Arc<FilterPageFile>>,
}

impl PageRoom {
    /// Every page in memory: a snapshot's index, whose families go to the store one by one.
    pub fn unlimited() -> Self {
        Self {
            room_bytes: usize::MAX,
            file: None,
        }
    }

    /// The page read back, in memory or written to the page file. Blocking in the latter case.
    fn place(&mut self, words: Arc<[u64]>) -> Result<Page, RouterError> {
        let bytes = words.len() * 8;
        match &self.file {
            Some(file) if self.room_bytes < bytes => {
                let slot = (file.write(&words))
                    .map_err(|error| page_file_error("write a page to", error))?;
                Ok(Page::Disk {
                    slot,
                    pending: Vec::new(),
                })
            }
            _ => {
                self.room_bytes = self.room_bytes.saturating_sub(bytes);
                Ok(Page::Memory(words))
            }
        }
    }
}

impl ColdIndex {
    /// Rows `family_id` has out of memory.
    pub fn rows(&self, family_id: &FamilyId) -> u64 {
        self.families.get(family_id).map_or(0, |family| family.rows)
    }

    /// The filters of `family_id`, if it has rows out of memory (one map lookup for all of
    /// a round's ids of the family).
    pub fn family(&mut self, family_id: &FamilyId) -> Option<FamilyFilters<'_>> {
        let Self {
            families,
            lookups,
            passed,
            ..
        } = self;
        let family = families.get(family_id)?;
        assert!(
            !family.in_store(),
            "family {family_id}'s filters were looked up while in the family store"
        );
        Some(FamilyFilters {
            family,
            lookups,
            passed,
        })
    }

    /// Counts a row the family moved out (and the store now holds) in.
    pub fn add(&mut self, family_id: &FamilyId, key: &[u8]) {
        let family = match self.families.get_mut(family_id) {
            Some(family) => family,
            None => self.families.entry(family_id.clone()).or_default(),
        };
        assert!(
            !family.in_store(),
            "family {family_id} moved a row out while its filters were in the family store"
        );
        let full = family
            .filters
            .last()
            .is_none_or(|filter| filter.keys >= filter.capacity);
        if full {
            let capacity =
                (family.filters.last()).map_or(FIRST_FILTER_KEYS, |last| last.capacity * GROWTH);
            let filter = Bloom::new(capacity);
            self.filter_bytes += filter.memory_bytes();
            family.filters.push(filter);
        }
        let newest = (family.filters.last_mut()).expect("a filter with room was just ensured");
        let (bytes, pending) = (newest.memory_bytes(), newest.pending());
        newest.insert(ColdKeyHash::of_bytes(key).value());
        self.filter_bytes = self.filter_bytes + newest.memory_bytes() - bytes;
        self.pending = self.pending + newest.pending() - pending;
        family.rows += 1;
    }

    /// A copy of the index as it is now, for a snapshot cut: the snapshot holds the state at
    /// one log index, so rows moved out after the cut must not reach its copy, while the
    /// apply path (paused for the cut) goes on adding to this one. Costs a reference per page
    /// of each filter, not the filters' bytes: an add after the cut copies only the pages it
    /// writes that the copy still shares (one of 64 KiB), so the apply path never copies a
    /// whole filter for a cut; pages on disk stay in their slots for as long as the copy
    /// names them. The copy's lookup counters start at zero.
    pub fn share(&self) -> ColdIndex {
        ColdIndex {
            families: self.families.clone(),
            filter_bytes: self.filter_bytes,
            pending: self.pending,
            page_file: self.page_file.clone(),
            lookups: 0,
            passed: 0,
        }
    }

    /// Saves the index (with a node's own snapshot), little-endian: the format number (u32),
    /// the family count (u64), then per family in family-id order its id's length (u32) and
    /// bytes, its rows (u64) and filter count (u32), and per filter its capacity, keys and
    /// word count (u64 each) and then its words (u64 each). The families whose filters are in
    /// the family store are read with `in_store` (the store's view at the same cut); their
    /// bytes are checked for the length and rows the index expects before they are copied.
    pub fn write_to(
        &self,
        out: &mut impl Write,
        in_store: impl Fn(&FamilyId) -> Result<Vec<u8>, RouterError>,
    ) -> Result<(), RouterError> {
        let mut families: Vec<_> = self.families.iter().collect();
        families.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut head = Vec::with_capacity(12);
        head.extend_from_slice(&FORMAT.to_le_bytes());
        head.extend_from_slice(&(families.len() as u64).to_le_bytes());
        out.write_all(&head).map_err(io_error)?;
        let mut buf = Vec::new();
        for (family_id, family) in families {
            let id = family_id.as_str().as_bytes();
            buf.clear();
            buf.extend_from_slice(&length_u32(id.len())?.to_le_bytes());
            buf.extend_from_slice(id);
            out.write_all(&buf).map_err(io_error)?;
            if !family.in_store() {
                write_family(out, family, &mut buf)?;
                continue;
            }
            let bytes = in_store(family_id)?;
            let rows = (bytes.first_chunk::<8>()).map(|rows| u64::from_le_bytes(*rows));
            if bytes.len() != encoded_family_len(family.rows) || rows != Some(family.rows) {
                return Err(RouterError::Store(format!(
                    "the family store holds {} bytes of filters for family {family_id}, not \
                     the {} of its {} rows",
                    bytes.len(),
                    encoded_family_len(family.rows),
                    family.rows
                )));
            }
            out.write_all(&bytes).map_err(io_error)?;
        }
        Ok(())
    }

    /// Copies of the filters of those of `families` that have them in memory and whose copy
    /// in the family store is missing or older, to write there; `spilled` then drops them
    /// from memory.
    pub fn to_spill(&self, families: &[FamilyId]) -> Vec<(FamilyId, FiltersToSpill)> {
        (families.iter())
            .filter_map(|family_id| {
                let family = self.families.get(family_id)?;
                let write = !family.in_store() && family.stored_rows != Some(family.rows);
                write.then(|| (family_id.clone(), FiltersToSpill(family.clone())))
            })
            .collect()
    }

    /// Drops the filters of those of `families` that have rows from memory: the family store
    /// holds them now (written by `to_spill`'s copies, or current already). Only for
    /// passivated families: a round reloads them first.
    pub fn spilled(&mut self, families: &[FamilyId]) {
        for family_id in families {
            let Some(family) = self.families.get_mut(family_id) else {
                continue;
            };
            assert!(
                !family.in_store(),
                "family {family_id}'s filters spilled twice"
            );
            self.filter_bytes -= family.memory_bytes();
            self.pending -= family.pending();
            family.filters = Vec::new();
            family.stored_rows = Some(family.rows);
        }
    }

    /// Those of `families` whose filters are in the family store.
    pub fn in_store<'f>(&self, families: impl IntoIterator<Item = &'f FamilyId>) -> Vec<FamilyId> {
        (families.into_iter())
            .filter(|family_id| {
                self.families
                    .get(*family_id)
                    .is_some_and(ColdFamily::in_store)
            })
            .cloned()
            .collect()
    }

    /// Decodes a family's filters as the family store holds them, checking all of it: pages
    /// in memory while `room` lasts, the rest written to its page file as they are decoded.
    /// Blocking when a page goes to the page file.
    pub fn decode_spilled(
        family_id: &FamilyId,
        mut input: impl Read,
        room: &mut PageRoom,
    ) -> Result<SpilledFilters, RouterError> {
        let family = read_family(&mut input, family_id, room)?;
        let mut after = [0u8; 1];
        let more = (input.read(&mut after))
            .map_err(|error| read_error(&format!("the end of family {family_id:?}"), error))?;
        if more > 0 {
            return Err(invalid(format_args!(
                "bytes after the filters of family {family_id:?}"
            )));
        }
        Ok(SpilledFilters(family))
    }

    /// Where the filters of those of `families` that have them in the family store go when
    /// read back (`decode_spilled`): memory up to `share_bytes` less what the filters hold
    /// now, then the page file (made with `create` if they would not all fit). So bringing
    /// back a family with a long history never holds its filters whole in memory, to be
    /// written out 64 pages a round afterwards.
    pub fn read_back_room(
        &mut self,
        families: &[FamilyId],
        share_bytes: usize,
        create: impl FnOnce() -> std::io::Result<Arc<FilterPageFile>>,
    ) -> Result<PageRoom, RouterError> {
        let room_bytes = share_bytes.saturating_sub(self.filter_bytes);
        let needed: usize = (families.iter())
            .filter_map(|family_id| self.families.get(family_id))
            .filter(|family| family.in_store())
            .map(|family| encoded_family_len(family.rows))
            .sum();
        let file = (needed > room_bytes)
            .then(|| self.page_file(create))
            .transpose()?;
        Ok(PageRoom { room_bytes, file })
    }

    /// Takes a family's filters back into memory (`decode_spilled`) before a round looks ids
    /// up in them. Refused unless they are the filters of the rows the index counts.
    pub fn reload(
        &mut self,
        family_id: &FamilyId,
        spilled: SpilledFilters,
    ) -> Result<(), RouterError> {
        let family = (self.families.get_mut(family_id))
            .filter(|family| family.in_store())
            .unwrap_or_else(|| panic!("filters of family {family_id} reloaded, but not spilled"));
        let SpilledFilters(loaded) = spilled;
        if loaded.rows != family.rows {
            return Err(RouterError::Store(format!(
                "the family store holds filters of {} rows for family {family_id}, which has {}",
                loaded.rows, family.rows
            )));
        }
        self.filter_bytes += loaded.memory_bytes();
        *family = ColdFamily {
            stored_rows: Some(loaded.rows),
            ..loaded
        };
        Ok(())
    }

    /// Loads an index `write_to` saved, checking all of it: an input that does not decode,
    /// or that no index could have written, is refused (`RouterError::Snapshot`), and no
    /// more is allocated than the input delivers. Reads no further than the index.
    #[cfg(test)]
    pub fn read_from(input: &mut impl Read) -> Result<ColdIndex, RouterError> {
        let format = read_u32(input, "the format number")?;
        Self::read_after_format(format, input, |_, family| Ok(family))
    }

    /// Loads an index `write_to` saved, or `None` if it was saved by a build before the
    /// filters were blocked (format 1): its bits are in another layout, so the caller
    /// rebuilds the filters from the rows (`add`). Such an input is read to its end.
    ///
    /// Each family's filters go to `spill` as they are read (to be written to the family
    /// store), and the index keeps only the family's rows, its filters marked in the store:
    /// the reader holds one family's filters at a time, never every family's. A restored
    /// router starts with every family passivated, so this is where they belong.
    pub fn read_any_spilling(
        input: &mut impl Read,
        mut spill: impl FnMut(FamilyId, FiltersToSpill) -> Result<(), RouterError>,
    ) -> Result<Option<ColdIndex>, RouterError> {
        let format = read_u32(input, "the format number")?;
        if format == UNBLOCKED_FORMAT {
            std::io::copy(input, &mut std::io::sink())
                .map_err(|error| read_error("an unblocked index", error))?;
            return Ok(None);
        }
        let cold = Self::read_after_format(format, input, |family_id, family| {
            let rows = family.rows;
            spill(family_id.clone(), FiltersToSpill(family))?;
            Ok(ColdFamily {
                rows,
                filters: Vec::new(),
                stored_rows: Some(rows),
            })
        })?;
        Ok(Some(cold))
    }

    fn read_after_format(
        format: u32,
        input: &mut impl Read,
        mut keep: impl FnMut(&FamilyId, ColdFamily) -> Result<ColdFamily, RouterError>,
    ) -> Result<ColdIndex, RouterError> {
        if format != FORMAT {
            return Err(invalid(format_args!(
                "format number {format}, expected {FORMAT}"
            )));
        }
        let count = read_u64(input, "the family count")?;
        let reserve = usize::try_from(count).map_or(MAX_FAMILIES_RESERVED, |count| {
            count.min(MAX_FAMILIES_RESERVED)
        });
        let mut families = HashMap::with_capacity_and_hasher(reserve, Default::default());
        let mut filter_bytes = 0;
        let mut previous: Option<FamilyId> = None;
        for n in 0..count {
            let family_id = read_family_id(input, n)?;
            if let Some(previous) = &previous {
                if previous.as_str() >= family_id.as_str() {
                    return Err(invalid(format_args!(
                        "family ids out of order: {family_id:?} after {previous:?}"
                    )));
                }
            }
            let family = read_family(input, &family_id, &mut PageRoom::unlimited())?;
            let family = keep(&family_id, family)?;
            filter_bytes += family.memory_bytes();
            families.insert(family_id.clone(), family);
            previous = Some(family_id);
        }
        Ok(ColdIndex {
            families,
            filter_bytes,
            pending: 0,
            page_file: None,
            lookups: 0,
            passed: 0,
        })
    }

    /// The families with rows out of memory and their counts, in family-id order.
    pub fn counts(&self) -> BTreeMap<FamilyId, u64> {
        (self.families.iter())
            .map(|(family_id, family)| (family_id.clone(), family.rows))
            .collect()
    }

    /// Rows out of memory, over all families.
    pub fn total_rows(&self) -> u64 {
        self.families.values().map(|family| family.rows).sum()
    }

    /// The filters' memory, counted against the node's memory budget: their pages in
    /// memory, the hashes waiting beside pages on disk and the page tables.
    pub fn filter_bytes(&self) -> usize {
        self.filter_bytes
    }

    /// The memory of one family's filters (0 while they are in the family store).
    pub fn family_filter_bytes(&self, family_id: &FamilyId) -> usize {
        (self.families.get(family_id)).map_or(0, ColdFamily::memory_bytes)
    }

    /// The page file's length (0 before a page went to disk) and its `(blocks read for
    /// lookups, pages read back, pages written)` so far.
    pub fn page_file_use(&self) -> (u64, (u64, u64, u64)) {
        (self.page_file.as_ref()).map_or((0, (0, 0, 0)), |file| (file.bytes(), file.io_counts()))
    }

    /// Counts what the blocks a `Lookup::Read` named said.
    pub fn count_read(&mut self, passed: bool) {
        self.passed += u64::from(passed);
    }

    /// The page file, made with `create` when first needed.
    pub fn page_file(
        &mut self,
        create: impl FnOnce() -> std::io::Result<Arc<FilterPageFile>>,
    ) -> Result<Arc<FilterPageFile>, RouterError> {
        if self.page_file.is_none() {
            let file = create().map_err(|error| page_file_error("create", error))?;
            self.page_file = Some(file);
        }
        Ok(Arc::clone(self.page_file.as_ref().expect("made above")))
    }

    /// Pages to write to the page file, at most `max_pages`, once the filters' memory is
    /// over `cap_bytes`: enough to bring it to three quarters of it (so a round that adds a
    /// page does not write one). The largest filters first: a lookup reads a block of each of
    /// a family's filters on disk it reaches, so a page of a larger filter serves fewer of
    /// them, and the filter being filled is a family's largest, three quarters of its bytes,
    /// so with it alone on disk a fresh id reads one block. Its pages also gather the rows
    /// that land in them as waiting hashes, read back and written again to set them, but at
    /// hundreds of hashes a page that costs less than the block reads a smaller filter's
    /// pages would (measured with full filters first on a 4 MiB share: 2.5 blocks read per
    /// id looked up instead of 0.4, for a seventh of the pages read back). Of two alike in
    /// size, a full one first: it never changes.
    pub fn to_evict(&self, cap_bytes: usize, max_pages: usize) -> Vec<Eviction> {
        if self.filter_bytes <= cap_bytes {
            return Vec::new();
        }
        let mut excess = self.filter_bytes - cap_bytes / 4 * 3;
        let mut filters: Vec<(bool, usize, &FamilyId, usize, &Bloom)> = (self.families.iter())
            .flat_map(|(family_id, family)| {
                (family.filters.iter().enumerate())
                    .filter(|(_, filter)| filter.pages_in_memory() > 0)
                    .map(move |(n, filter)| {
                        let filling = filter.keys < filter.capacity;
                        (filling, filter.words, family_id, n, filter)
                    })
            })
            .collect();
        filters.sort_unstable_by(|a, b| {
            (b.1.cmp(&a.1).then(a.0.cmp(&b.0)))
                .then(a.2.cmp(b.2))
                .then(a.3.cmp(&b.3))
        });
        let mut evictions = Vec::new();
        for (_, words, family_id, filter, bloom) in filters {
            let page_bytes = page_words(words) * 8;
            for (page, at) in bloom.pages().iter().enumerate() {
                let Page::Memory(words) = at else { continue };
                if excess == 0 || evictions.len() >= max_pages {
                    return evictions;
                }
                evictions.push(Eviction {
                    family_id: family_id.clone(),
                    filter,
                    page,
                    words: Arc::clone(words),
                });
                excess = excess.saturating_sub(page_bytes);
            }
        }
        evictions
    }

    /// The pages `to_evict` chose are in these slots now: they leave memory.
    pub fn evicted(&mut self, written: Vec<(Eviction, Arc<Slot>)>) {
        for (eviction, slot) in written {
            let filter = self.filter_mut(&eviction.family_id, eviction.filter);
            assert!(
                matches!(&filter.pages()[eviction.page], Page::Memory(words) if Arc::ptr_eq(words, &eviction.words)),
                "page {} of filter {} of family {} changed while it was written",
                eviction.page,
                eviction.filter,
                eviction.family_id
            );
            let bytes = filter.memory_bytes();
            filter.evicted(eviction.page, slot);
            let freed = bytes - filter.memory_bytes();
            self.filter_bytes -= freed;
        }
    }

    /// Pages on disk to read back, at most `max_pages`, once more than half of `limit`
    /// hashes wait beside pages on disk: those with the most first.
    pub fn to_flush(&self, limit: usize, max_pages: usize) -> Vec<Flush> {
        if self.pending <= limit / 2 {
            return Vec::new();
        }
        let mut pages: Vec<(usize, Flush)> = Vec::new();
        for (family_id, family) in &self.families {
            let waiting = (family.filters.iter().enumerate()).filter(|(_, f)| f.pending() > 0);
            for (filter, bloom) in waiting {
                for (page, at) in bloom.pages().iter().enumerate() {
                    let Page::Disk { slot, pending } = at else {
                        continue;
                    };
                    if pending.is_empty() {
                        continue;
                    }
                    let flush = Flush {
                        family_id: family_id.clone(),
                        filter,
                        page,
                        slot: Arc::clone(slot),
                        words: page_words(bloom.words),
                    };
                    pages.push((pending.len(), flush));
                }
            }
        }
        pages.sort_unstable_by_key(|(pending, _)| std::cmp::Reverse(*pending));
        pages.truncate(max_pages);
        pages.into_iter().map(|(_, flush)| flush).collect()
    }

    /// The pages `to_flush` chose, read back: their waiting hashes are set and they are in
    /// memory again.
    pub fn flushed(&mut self, read: Vec<(Flush, Vec<u64>)>) {
        for (flush, words) in read {
            let filter = self.filter_mut(&flush.family_id, flush.filter);
            let (bytes, pending) = (filter.memory_bytes(), filter.pending());
            filter.flushed(flush.page, words);
            let (bytes_now, pending_now) = (filter.memory_bytes(), filter.pending());
            self.filter_bytes = self.filter_bytes + bytes_now - bytes;
            self.pending -= pending - pending_now;
        }
    }

    /// Hashes waiting beside pages on disk.
    pub fn pending(&self) -> usize {
        self.pending
    }

    fn filter_mut(&mut self, family_id: &FamilyId, filter: usize) -> &mut Bloom {
        let family = (self.families.get_mut(family_id))
            .unwrap_or_else(|| panic!("family {family_id} left the index with a page on its way"));
        &mut family.filters[filter]
    }

    /// `(ids looked up, ids the filters sent to the store)` so far.
    pub fn lookups(&self) -> (u64, u64) {
        (self.lookups, self.passed)
    }
}

/// One family's rows, filter count and filters, as `ColdIndex::write_to` writes them after its
/// id (and the family store keeps them).
/// `buf` is scratch space the caller keeps across families: it grows to one page of the
/// largest filter (64 KiB at most), once, not once per family.
fn write_family(
    out: &mut impl Write,
    family: &ColdFamily,
    buf: &mut Vec<u8>,
) -> Result<(), RouterError> {
    buf.clear();
    buf.extend_from_slice(&family.rows.to_le_bytes());
    buf.extend_from_slice(&length_u32(family.filters.len())?.to_le_bytes());
    out.write_all(buf).map_err(io_error)?;
    for filter in &family.filters {
        buf.clear();
        for field in [filter.capacity, filter.keys, filter.words] {
            buf.extend_from_slice(&(field as u64).to_le_bytes());
        }
        out.write_all(buf).map_err(io_error)?;
        write_words(out, filter, buf).map_err(io_error)?;
    }
    Ok(())
}

/// The length of `write_family`'s bytes for a family of `rows` rows: its filters follow from
/// its rows (each full but the last, each `GROWTH` times the one before).
fn encoded_family_len(rows: u64) -> usize {
    let (mut len, mut left, mut capacity) = (8 + 4, rows, FIRST_FILTER_KEYS);
    while left > 0 {
        let words = filter_words(capacity).expect("a filter's capacity fits in memory");
        len += 3 * 8 + words * 8;
        left = left.saturating_sub(capacity as u64);
        capacity *= GROWTH;
    }
    len
}

/// One family's rows and filters, after its id (`ColdIndex::read_from`).
fn read_family(
    input: &mut impl Read,
    family_id: &FamilyId,
    room: &mut PageRoom,
) -> Result<ColdFamily, RouterError> {
    let whose = format!("family {family_id:?}");
    let rows = read_u64(input, &format!("the rows of {whose}"))?;
    if rows == 0 {
        return Err(invalid(format_args!("{whose} has no rows")));
    }
    let count = read_u32(input, &format!("the filter count of {whose}"))? as usize;
    if !(1..=MAX_FILTERS).contains(&count) {
        return Err(invalid(format_args!(
            "{whose} has {count} filters, expected 1 to {MAX_FILTERS}"
        )));
    }
    let mut filters = Vec::with_capacity(count);
    let mut keys_sum: u64 = 0;
    let mut expected = Some(FIRST_FILTER_KEYS);
    for n in 0..count {
        let which = format!("filter {n} of {whose}");
        let filter = read_filter(input, expected, n + 1 == count, &which, room)?;
        keys_sum = keys_sum.saturating_add(filter.keys as u64);
        expected = filter.capacity.checked_mul(GROWTH);
        filters.push(filter);
    }
    if keys_sum != rows {
        return Err(invalid(format_args!(
            "the filters of {whose} hold {keys_sum} keys, but it has {rows} rows"
        )));
    }
    Ok(ColdFamily {
        rows,
        filters,
        stored_rows: None,
    })
}

/// A family's id: its length, at most `MAX_ID_BYTES`, then as many bytes of UTF-8.
fn read_family_id(input: &mut impl Read, n: u64) -> Result<FamilyId, RouterError> {
    let what = format!("the id of family {n}");
    let length = read_u32(input, &what)? as usize;
    if length > MAX_ID_BYTES {
        return Err(invalid(format_args!(
            "{what} is {length} bytes long, over {MAX_ID_BYTES}"
        )));
    }
    let mut bytes = vec![0; length];
    input
        .read_exact(&mut bytes)
        .map_err(|error| read_error(&what, error))?;
    let id = String::from_utf8(bytes).map_err(|_| invalid(format_args!("{what} is not UTF-8")))?;
    Ok(FamilyId::from(id))
}

/// The filter at `which`, whose capacity must be `expected` (`None`: past any that fits in
/// memory), and which must be full unless it is the family's `last`.
fn read_filter(
    input: &mut impl Read,
    expected: Option<usize>,
    last: bool,
    which: &str,
    room: &mut PageRoom,
) -> Result<Bloom, RouterError> {
    let capacity = read_u64(input, &format!("the capacity of {which}"))?;
    let keys = read_u64(input, &format!("the keys of {which}"))?;
    let words = read_u64(input, &format!("the word count of {which}"))?;
    let Some(capacity) = expected.filter(|&expected| capacity == expected as u64) else {
        let expected = expected.map_or("none: too many filters".into(), |e| e.to_string());
        return Err(invalid(format_args!(
            "{which} is for {capacity} keys, expected {expected}"
        )));
    };
    let expected_words = filter_words(capacity).filter(|&expected| words == expected as u64);
    let Some(words) = expected_words else {
        return Err(invalid(format_args!(
            "{which} claims {words} words for {capacity} keys"
        )));
    };
    if keys > capacity as u64 {
        return Err(invalid(format_args!(
            "{which} holds {keys} keys, over its capacity of {capacity}"
        )));
    }
    let keys = keys as usize;
    if (!last && keys != capacity) || (last && keys == 0) {
        return Err(invalid(format_args!(
            "{which} holds {keys} of {capacity} keys: only the last filter may have room, \
             and none may be empty"
        )));
    }
    let pages = read_pages(input, words, which, room)?;
    Ok(Bloom::from_pages(pages, words, keys, capacity))
}

/// `words` little-endian words (a power of two), read a page at a time into the filter's
/// pages: a page is allocated only once its bytes arrived, so a claimed count the input does
/// not back fails before it allocates.
fn read_pages(
    input: &mut impl Read,
    words: usize,
    which: &str,
    room: &mut PageRoom,
) -> Result<Vec<Page>, RouterError> {
    let page_words = page_words(words);
    let count = words / page_words;
    let mut pages: Vec<Page> = Vec::new();
    let mut buf = vec![0; page_words * 8];
    while pages.len() < count {
        input
            .read_exact(&mut buf)
            .map_err(|error| read_error(&format!("the words of {which}"), error))?;
        if pages.len() == pages.capacity() {
            // Doubling, but never past the claimed count: the filter keeps no slack.
            let target = (pages.capacity() * 2).clamp(1, count);
            pages.reserve_exact(target - pages.len());
        }
        let decoded = buf
            .chunks_exact(8)
            .map(|word| u64::from_le_bytes(word.try_into().expect("chunks of eight bytes")));
        pages.push(room.place(decoded.collect())?);
    }
    Ok(pages)
}

fn read_u32(input: &mut impl Read, what: &str) -> Result<u32, RouterError> {
    let mut bytes = [0; 4];
    input
        .read_exact(&mut bytes)
        .map_err(|error| read_error(what, error))?;
    Ok(u32::from_le_bytes(bytes))
}

fn read_u64(input: &mut impl Read, what: &str) -> Result<u64, RouterError> {
    let mut bytes = [0; 8];
    input
        .read_exact(&mut bytes)
        .map_err(|error| read_error(what, error))?;
    Ok(u64::from_le_bytes(bytes))
}

/// A length the format stores in a u32 (an id's bytes, a family's filters).
fn length_u32(length: usize) -> Result<u32, RouterError> {
    u32::try_from(length).map_err(|_| invalid(format_args!("a length of {length} over a u32")))
}

fn invalid(message: impl Display) -> RouterError {
    RouterError::Snapshot(format!("cold index: {message}"))
}

fn read_error(what: &str, error: std::io::Error) -> RouterError {
    invalid(format_args!("reading {what}: {error}"))
}

fn io_error(error: std::io::Error) -> RouterError {
    invalid(format_args!("writing: {error}"))
}

#[cfg(test)]
mod tests {
    use super::super::cold_filter::{BITS_PER_KEY, PAGE_WORDS};
    use super::*;

    impl FamilyFilters<'_> {
        /// What the router's lookup ends in: the blocks on disk read here.
        fn may_contain(&mut self, hash: ColdKeyHash) -> bool {
            match self.lookup(hash) {
                Lookup::Absent => false,
                Lookup::Maybe => true,
                Lookup::Read(blocks) => {
                    (blocks.iter()).any(|block| block.may_contain().expect("the block reads"))
                }
            }
        }
    }

    /// Every key added is found; keys never added are almost all told apart, across the
    /// growth from one filter to many.
    #[test]
    fn added_keys_are_always_found_and_absent_ones_rarely_pass() {
        let mut index = ColdIndex::default();
        let fam = FamilyId::from("fam");
        let keys = 20_000;
        for n in 0..keys {
            index.add(&fam, format!("event-{n}").as_bytes());
        }
        assert_eq!(index.rows(&fam), keys);
        assert!(index.families[&fam].filters.len() >= 3, "the filters grew");
        let hash = |key: String| ColdKeyHash::of_bytes(key.as_bytes());
        let mut filters = index.family(&fam).expect("the family has rows");
        for n in 0..keys {
            assert!(filters.may_contain(hash(format!("event-{n}"))));
        }
        let passed = (0..100_000)
            .filter(|n| filters.may_contain(hash(format!("fresh-{n}"))))
            .count();
        assert!(
            passed < 300,
            "{passed} of 100,000 fresh ids passed the filters"
        );
        assert_eq!(index.lookups(), (120_000, 20_000 + passed as u64));
        assert!(index.family(&FamilyId::from("other")).is_none());
        assert_eq!(index.counts(), BTreeMap::from([(fam, keys)]));
        assert!(index.filter_bytes() >= keys as usize * BITS_PER_KEY / 8);
    }

    fn hash(key: &str) -> ColdKeyHash {
        ColdKeyHash::of_bytes(key.as_bytes())
    }

    fn index_of(families: &[(&str, u64)]) -> ColdIndex {
        let mut index = ColdIndex::default();
        for &(family_id, keys) in families {
            let family_id = FamilyId::from(family_id);
            for n in 0..keys {
                index.add(&family_id, format!("{family_id}-key-{n}").as_bytes());
            }
        }
        index
    }

    fn encode(index: &ColdIndex) -> Vec<u8> {
        let mut bytes = Vec::new();
        index
            .write_to(&mut bytes, |_| unreachable!("no filters in the store"))
            .expect("writes to memory");
        bytes
    }

    fn decode(bytes: &[u8]) -> Result<ColdIndex, RouterError> {
        ColdIndex::read_from(&mut &bytes[..])
    }

    /// The refusal's message, which must name what was wrong.
    fn refusal(bytes: &[u8]) -> String {
        match decode(bytes) {
            Ok(_) => panic!("a bad index was accepted"),
            Err(RouterError::Snapshot(message)) => message,
            Err(other) => panic!("refused as {other:?}"),
        }
    }

    fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }

    /// Where the first family's id starts (after the format number, the family count and
    /// the id's length).
    const FIRST_ID: usize = 4 + 8 + 4;

    /// Where the first family's rows, and its first filter (capacity, keys, word count),
    /// start, for an id of `id_len` bytes.
    fn first_family_fields(id_len: usize) -> (usize, usize) {
        let rows = FIRST_ID + id_len;
        (rows, rows + 8 + 4)
    }

    /// The words of a family's first filter: 1,024 keys at 16 bits.
    const FIRST_WORDS: usize = FIRST_FILTER_KEYS * BITS_PER_KEY / 64;

    /// Saved and loaded, an index answers every lookup as before and saves to the same bytes.
    #[test]
    fn written_index_reads_back_identical() {
        let sizes = [
            ("big", 1_024 + 4_096 + 700),
            ("one", 1),
            ("full", 1_024),
            ("two", 1_025),
        ];
        let mut index = index_of(&sizes);
        assert!(index.families[&FamilyId::from("big")].filters.len() >= 3);
        let bytes = encode(&index);
        let mut back = decode(&bytes).expect("reads back");
        assert_eq!(back.counts(), index.counts());
        assert_eq!(back.total_rows(), index.total_rows());
        assert_eq!(back.filter_bytes(), index.filter_bytes());
        assert_eq!(back.lookups(), (0, 0));
        for (family_id, keys) in sizes {
            let family_id = FamilyId::from(family_id);
            let mut original = index.family(&family_id).expect("has rows");
            let mut read = back.family(&family_id).expect("has rows");
            for n in 0..keys {
                let key = hash(&format!("{family_id}-key-{n}"));
                assert!(original.may_contain(key) && read.may_contain(key));
            }
            for n in 0..50_000 {
                let key = hash(&format!("{family_id}-absent-{n}"));
                assert_eq!(read.may_contain(key), original.may_contain(key), "{n}");
            }
        }
        assert!(back.family(&FamilyId::from("other")).is_none());
        assert_eq!(encode(&back), bytes, "saved again, the same bytes");
    }

    /// A saved index read spilling hands each family's filters over once, in id order, as
    /// the store would hold them, and keeps none: every family counts its rows with its
    /// filters in the store, and reloaded from those bytes they answer as saved.
    #[test]
    fn an_index_read_spilling_keeps_only_the_rows() {
        let sizes = [("a", 5_000), ("b", 10), ("c", 1_025)];
        let index = index_of(&sizes);
        let bytes = encode(&index);
        let mut handed = Vec::new();
        let mut back = ColdIndex::read_any_spilling(&mut &bytes[..], |family_id, filters| {
            handed.push((family_id, filters.encode()?));
            Ok(())
        })
        .expect("reads")
        .expect("a blocked index");
        let ids: Vec<FamilyId> = sizes.iter().map(|(id, _)| FamilyId::from(*id)).collect();
        assert_eq!(
            handed.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            ids.iter().collect::<Vec<_>>()
        );
        for (family_id, encoded) in &handed {
            let expected = index.to_spill(std::slice::from_ref(family_id));
            assert!(
                *encoded == expected[0].1.encode().expect("encodes"),
                "{family_id}'s filters handed over as the store keeps them"
            );
        }
        assert_eq!(back.filter_bytes(), 0, "no filter kept in memory");
        assert_eq!(back.counts(), index.counts());
        assert_eq!(back.in_store(&ids), ids);
        assert!(
            back.to_spill(&ids).is_empty(),
            "the store's copies are current"
        );
        let from_store = |family_id: &FamilyId| {
            Ok((handed.iter().find(|(id, _)| id == family_id))
                .expect("handed over")
                .1
                .clone())
        };
        let mut written = Vec::new();
        back.write_to(&mut written, from_store).expect("writes");
        assert!(
            written == bytes,
            "saved again from the store, the same bytes"
        );
        for (family_id, encoded) in &handed {
            let filters = ColdIndex::decode_spilled(
                family_id,
                encoded.as_slice(),
                &mut PageRoom::unlimited(),
            )
            .expect("decodes");
            back.reload(family_id, filters).expect("reloads");
        }
        assert_eq!(back.filter_bytes(), index.filter_bytes());

        let refused = ColdIndex::read_any_spilling(&mut &bytes[..], |_, _| {
            Err(RouterError::Store("full".into()))
        });
        assert!(
            matches!(refused, Err(RouterError::Store(_))),
            "the store's error stops it"
        );
    }

    /// A shared copy keeps the index as it was: later adds reach only the original.
    /// A family's filters leave memory for the store and come back identical; a snapshot
    /// writes them from the store byte for byte as from memory, and refuses store bytes that
    /// are not the filters of the family's rows.
    #[test]
    fn spilled_filters_write_and_reload_as_they_were() {
        let (a, b, c) = (
            FamilyId::from("a"),
            FamilyId::from("b"),
            FamilyId::from("c"),
        );
        let mut index = index_of(&[("a", 5_000), ("b", 10)]);
        let before = encode(&index);
        let bytes_before = index.filter_bytes();
        assert_eq!(
            index.family_filter_bytes(&a) + index.family_filter_bytes(&b),
            bytes_before
        );
        let copies = index.to_spill(&[a.clone(), b.clone(), c.clone()]);
        let stored: BTreeMap<FamilyId, Vec<u8>> = (copies.into_iter())
            .map(|(family_id, filters)| (family_id, filters.encode().expect("encodes")))
            .collect();
        assert_eq!(stored.keys().collect::<Vec<_>>(), [&a, &b], "c has no rows");
        assert_eq!(stored[&a].len(), encoded_family_len(5_000));
        index.spilled(&[a.clone(), b.clone()]);
        assert_eq!(index.filter_bytes(), 0, "no filter left in memory");
        assert_eq!(index.family_filter_bytes(&a), 0);
        assert_eq!(index.in_store([&a, &b, &c]), [a.clone(), b.clone()]);
        assert!(
            index.to_spill(std::slice::from_ref(&a)).is_empty(),
            "spilled already"
        );
        assert_eq!(
            index.counts(),
            index_of(&[("a", 5_000), ("b", 10)]).counts()
        );

        let from_store = |family_id: &FamilyId| Ok(stored[family_id].clone());
        let mut written = Vec::new();
        index.write_to(&mut written, from_store).expect("writes");
        assert!(written == before, "written from the store as from memory");
        let swapped =
            |family_id: &FamilyId| Ok(stored[if *family_id == a { &b } else { &a }].clone());
        let refused = index.write_to(&mut Vec::new(), swapped);
        assert!(matches!(refused, Err(RouterError::Store(_))), "{refused:?}");

        let mut long = stored[&b].clone();
        long.push(0);
        assert!(
            ColdIndex::decode_spilled(&b, long.as_slice(), &mut PageRoom::unlimited()).is_err(),
            "a byte after them"
        );
        let b_as_a =
            ColdIndex::decode_spilled(&a, stored[&b].as_slice(), &mut PageRoom::unlimited())
                .expect("decodes");
        assert!(
            index.reload(&a, b_as_a).is_err(),
            "10 rows are not a's 5,000"
        );
        for family_id in [&a, &b] {
            let filters = ColdIndex::decode_spilled(
                family_id,
                stored[family_id].as_slice(),
                &mut PageRoom::unlimited(),
            )
            .expect("decodes");
            index.reload(family_id, filters).expect("reloads");
        }
        assert_eq!(index.filter_bytes(), bytes_before);
        assert!(index.in_store([&a, &b]).is_empty());
        assert!(encode(&index) == before, "the same filters back");
        let mut filters = index.family(&a).expect("a has rows");
        assert!((0..5_000).all(|n| filters.may_contain(hash(&format!("a-key-{n}")))));

        // Let go again with no row added: the store's copies are current, nothing is written.
        assert!(index.to_spill(&[a.clone(), b.clone()]).is_empty());
        index.spilled(&[a.clone(), b.clone(), c.clone()]);
        assert_eq!(index.filter_bytes(), 0);
        let mut again = Vec::new();
        index.write_to(&mut again, from_store).expect("writes");
        assert!(
            again == before,
            "the copies in the store still serve the snapshot"
        );
        let filters =
            ColdIndex::decode_spilled(&a, stored[&a].as_slice(), &mut PageRoom::unlimited())
                .expect("decodes");
        index.reload(&a, filters).expect("reloads");
        index.add(&a, b"a-key-new");
        let copies = index.to_spill(std::slice::from_ref(&a));
        assert_eq!(
            copies.len(),
            1,
            "a row joined a: its copy in the store is old"
        );
        assert_eq!(copies[0].1.encode().unwrap()[..8], 5_001u64.to_le_bytes());
    }

    #[test]
    fn share_is_a_cut() {
        let mut index = index_of(&[("a", 1_000), ("b", 10)]);
        let a = FamilyId::from("a");
        let c = FamilyId::from("c");
        index.family(&a).expect("has rows").may_contain(hash("x"));
        let mut copy = index.share();
        let (counts, bytes, filter_bytes) = (copy.counts(), encode(&copy), copy.filter_bytes());
        assert_eq!(counts, index.counts());
        assert_eq!(filter_bytes, index.filter_bytes());
        assert_eq!(copy.lookups(), (0, 0));
        let shared = |index: &ColdIndex| in_memory(&index.families[&a].filters[0], 0);
        assert!(Arc::ptr_eq(&shared(&copy), &shared(&index)));
        // Keys the copy tells apart now; added to the original, into the shared filter and
        // past it into a new one, and into a new family.
        let mut copy_a = copy.family(&a).expect("has rows");
        let late: Vec<String> = (0..)
            .map(|n| format!("late-{n}"))
            .filter(|key| !copy_a.may_contain(hash(key)))
            .take(2_000)
            .collect();
        for key in &late {
            index.add(&a, key.as_bytes());
            index.add(&c, key.as_bytes());
        }
        assert!(index.filter_bytes() > filter_bytes, "the original grew");
        assert!(
            !Arc::ptr_eq(&shared(&copy), &shared(&index)),
            "copied on write"
        );
        assert_eq!(copy.counts(), counts);
        assert_eq!(copy.filter_bytes(), filter_bytes);
        assert!(copy.family(&c).is_none());
        let mut copy_a = copy.family(&a).expect("has rows");
        assert!(late.iter().all(|key| !copy_a.may_contain(hash(key))));
        let mut index_a = index.family(&a).expect("has rows");
        assert!(late.iter().all(|key| index_a.may_contain(hash(key))));
        assert_eq!(encode(&copy), bytes, "the copy's filters did not change");
    }

    /// The newest filter of `family_id`.
    fn newest<'i>(index: &'i ColdIndex, family_id: &FamilyId) -> &'i Bloom {
        (index.families[family_id].filters.last()).expect("a family has filters")
    }

    /// Page `n` of `filter`, which must be in memory.
    fn in_memory(filter: &Bloom, n: usize) -> Arc<[u64]> {
        match &filter.pages()[n] {
            Page::Memory(words) => Arc::clone(words),
            Page::Zero | Page::Disk { .. } => panic!("page {n} is not in memory"),
        }
    }

    /// After a cut, an add into a filter of many pages copies only the page its key's bits
    /// land in: the others stay shared with the copy, whose answers do not change.
    #[test]
    fn an_add_after_share_copies_only_the_page_it_writes() {
        // Past the filters for 1,024 to 262,144 keys, into one for 1,048,576 keys (262,144
        // words, 32 pages), with keys enough that every one of its pages was written.
        let before: u64 = [1_024, 4_096, 16_384, 65_536, 262_144].iter().sum();
        let mut index = index_of(&[("big", before + 2_000), ("small", 10)]);
        let big = FamilyId::from("big");
        let filter = newest(&index, &big);
        assert_eq!((filter.capacity, filter.keys), (1 << 20, 2_000));
        assert_eq!((filter.words, filter.pages().len()), (1 << 18, 32));
        for n in 0..filter.pages().len() {
            let page = in_memory(filter, n);
            assert_eq!(page.len(), PAGE_WORDS);
            assert_eq!(Arc::strong_count(&page), 2, "page {n} written, not shared");
        }
        let mut copy = index.share();
        let (bytes, filter_bytes) = (encode(&copy), copy.filter_bytes());
        // A key the copy tells apart, added to the original only.
        let key = (0..)
            .map(|n| format!("late-{n}"))
            .find(|key| !copy.family(&big).expect("has rows").may_contain(hash(key)))
            .expect("a key absent from the copy");
        index.add(&big, key.as_bytes());
        let (mine, theirs) = (newest(&index, &big), newest(&copy, &big));
        let copied: Vec<usize> = (0..mine.pages().len())
            .filter(|&n| !Arc::ptr_eq(&in_memory(mine, n), &in_memory(theirs, n)))
            .collect();
        assert_eq!(copied.len(), 1, "one page copied: {copied:?}");
        let filters = (index.families[&big].filters.iter()).zip(&copy.families[&big].filters);
        for (mine, theirs) in filters.take(5) {
            let shared = (0..mine.pages().len())
                .all(|n| Arc::ptr_eq(&in_memory(mine, n), &in_memory(theirs, n)));
            assert!(shared, "the full filters are still shared");
        }
        let may_contain = |index: &mut ColdIndex| {
            let mut filters = index.family(&big).expect("has rows");
            filters.may_contain(hash(&key))
        };
        assert!(may_contain(&mut index) && !may_contain(&mut copy));
        assert_eq!(index.rows(&big), before + 2_001);
        assert_eq!(copy.rows(&big), before + 2_000);
        assert_eq!(copy.filter_bytes(), filter_bytes);
        assert_eq!(encode(&copy), bytes, "the copy's filters did not change");
    }

    /// A family read back into less room than its filters take keeps what fits in memory and
    /// writes the rest to the page file as it decodes them: the index never holds more than
    /// the room (and page tables), every key is still found, absent ones rarely pass, and it
    /// saves to the same bytes. With room enough, no page file is made.
    #[test]
    fn filters_read_back_beyond_their_room_go_straight_to_disk() {
        let sizes = [("big", 150_000), ("small", 3_000)];
        let mut index = index_of(&sizes);
        let roomy = index_of(&sizes);
        let (big, small) = (FamilyId::from("big"), FamilyId::from("small"));
        let all = index.filter_bytes();
        let stored: BTreeMap<FamilyId, Vec<u8>> = (index.to_spill(&[big.clone(), small.clone()]))
            .into_iter()
            .map(|(family_id, filters)| (family_id, filters.encode().expect("encodes")))
            .collect();
        index.spilled(&[big.clone(), small.clone()]);
        assert_eq!(index.filter_bytes(), 0);

        let none = || -> std::io::Result<Arc<FilterPageFile>> { panic!("no page file needed") };
        let room = index
            .read_back_room(std::slice::from_ref(&small), all, none)
            .expect("room");
        assert!(room.file.is_none());

        let share = all / 4;
        let mut room = (index.read_back_room(&[big.clone(), small.clone()], share, || {
            FilterPageFile::create(None)
        }))
        .expect("a page file");
        for family_id in [&big, &small] {
            let filters =
                ColdIndex::decode_spilled(family_id, stored[family_id].as_slice(), &mut room)
                    .expect("decodes");
            index.reload(family_id, filters).expect("reloads");
        }
        let tables: usize = (index.families.values())
            .flat_map(|family| &family.filters)
            .map(|filter| std::mem::size_of_val(filter.pages()))
            .sum();
        assert!(
            index.filter_bytes() <= share + tables,
            "{} bytes in memory, room for {share}",
            index.filter_bytes()
        );
        let (_, (_, _, written)) = index.page_file_use();
        assert!(written > 0, "pages went to the page file");
        assert_eq!(encode(&index), encode(&roomy), "saved alike");
        let passed = absent_passed_with_every_key_found(&mut index, &big, 150_000, 20_000);
        assert!(passed < 100, "{passed} of 20,000 absent keys passed");
    }

    /// Checks that `family`'s filters find each of its `keys` keys (`index_of`'s names), and
    /// counts how many of `absent` keys never added pass them.
    fn absent_passed_with_every_key_found(
        index: &mut ColdIndex,
        family: &FamilyId,
        keys: u64,
        absent: u64,
    ) -> usize {
        let mut filters = index.family(family).expect("has rows");
        let found = (0..keys).all(|n| filters.may_contain(hash(&format!("{family}-key-{n}"))));
        assert!(found, "every key of {family} found");
        (0..absent)
            .filter(|n| filters.may_contain(hash(&format!("absent-{n}"))))
            .count()
    }

    /// Writes the pages `to_evict` chooses to `file`, as the router does.
    fn evict(index: &mut ColdIndex, file: &Arc<FilterPageFile>, cap: usize) -> usize {
        let evictions = index.to_evict(cap, usize::MAX);
        let count = evictions.len();
        let written = (evictions.into_iter())
            .map(|eviction| {
                let slot = file.write(eviction.words()).expect("written");
                (eviction, slot)
            })
            .collect();
        index.evicted(written);
        count
    }

    /// Beyond their share the largest filters' pages go to the page file: every key is still
    /// found (reading blocks), absent ones still rarely pass, the index saves to the same
    /// bytes, and keys added to pages on disk wait as hashes until flushed into them, after
    /// which it saves as an index that never left memory. A cut taken with pages on disk
    /// saves as it was however the index changes after.
    #[test]
    fn pages_beyond_the_share_go_to_disk_and_answer_alike() {
        let file = FilterPageFile::create(None).expect("a page file");
        let sizes = [("big", 150_000), ("small", 3_000)];
        let mut index = index_of(&sizes);
        let roomy = index_of(&sizes);
        let big = FamilyId::from("big");
        let all = index.filter_bytes();
        let cap = all / 4;
        let evicted = evict(&mut index, &file, cap);
        assert!(evicted > 0);
        assert!(
            index.filter_bytes() <= cap / 4 * 3,
            "{} over",
            index.filter_bytes()
        );
        assert_eq!(
            evict(&mut index, &file, cap),
            0,
            "under the share: nothing more"
        );
        assert_eq!(encode(&index), encode(&roomy), "saved alike");
        let small = FamilyId::from("small");
        assert!(
            (index.families[&small].filters.iter())
                .all(|filter| matches!(filter.pages()[0], Page::Memory(_))),
            "the smallest filters stay in memory"
        );
        let passed = absent_passed_with_every_key_found(&mut index, &big, 150_000, 100_000);
        assert!(passed < 500, "{passed} of 100,000 absent ids passed");
        let (blocks, _, writes) = file.io_counts();
        assert!(
            blocks > 100_000,
            "absent ids read a block of each filter on disk: {blocks}"
        );
        assert_eq!(writes, evicted as u64);

        let cut = index.share();
        let saved_cut = encode(&cut);
        let mut roomy = roomy;
        for n in 150_000..170_000 {
            let key = format!("big-key-{n}");
            index.add(&big, key.as_bytes());
            roomy.add(&big, key.as_bytes());
        }
        assert!(index.pending() > 0, "keys wait beside pages on disk");
        let mut filters = index.family(&big).expect("has rows");
        assert!((0..170_000).all(|n| filters.may_contain(hash(&format!("big-key-{n}")))));
        assert_eq!(encode(&index), encode(&roomy), "waiting keys saved as set");
        let bytes = index.filter_bytes();
        let flushes = index.to_flush(2, 8);
        assert!((1..=8).contains(&flushes.len()), "{} pages", flushes.len());
        let read = (flushes.into_iter())
            .map(|flush| {
                let words = flush.read().expect("read back");
                (flush, words)
            })
            .collect();
        let pending = index.pending();
        index.flushed(read);
        assert!(index.pending() < pending);
        assert!(index.filter_bytes() > bytes, "pages back in memory");
        assert_eq!(
            encode(&index),
            encode(&roomy),
            "flushed pages hold their keys"
        );
        assert_eq!(encode(&cut), saved_cut, "the cut saves as it was");
        assert!(
            index.to_flush(usize::MAX, 8).is_empty(),
            "below the limit: none"
        );
    }

    /// Cut anywhere, an index is refused, never a panic.
    #[test]
    fn truncated_index_is_refused() {
        let bytes = encode(&index_of(&[("a", 3), ("b", 5)]));
        assert!(decode(&bytes).is_ok());
        for end in (0..bytes.len()).step_by(7).chain([bytes.len() - 1]) {
            let message = refusal(&bytes[..end]);
            assert!(message.contains("reading"), "cut at {end}: {message}");
        }
    }

    #[test]
    fn wrong_format_number_is_refused() {
        let mut bytes = encode(&index_of(&[("a", 3)]));
        bytes[..4].copy_from_slice(&3u32.to_le_bytes());
        assert!(refusal(&bytes).contains("format number 3"));
    }

    #[test]
    fn family_ids_out_of_order_or_repeated_are_refused() {
        let bytes = encode(&index_of(&[("a", 3), ("b", 3)]));
        assert_eq!(bytes[FIRST_ID], b'a');
        for id in [b'c', b'b'] {
            let mut bytes = bytes.clone();
            bytes[FIRST_ID] = id;
            assert!(refusal(&bytes).contains("out of order"));
        }
    }

    #[test]
    fn filter_with_wrong_word_count_is_refused() {
        let mut bytes = encode(&index_of(&[("a", 3)]));
        let (_, filter) = first_family_fields(1);
        let words = filter + 16;
        assert_eq!(bytes[words..words + 8], (FIRST_WORDS as u64).to_le_bytes());
        put_u64(&mut bytes, words, FIRST_WORDS as u64 - 1);
        assert!(refusal(&bytes).contains("words for 1024 keys"));
    }

    #[test]
    fn keys_that_do_not_sum_to_rows_are_refused() {
        let mut bytes = encode(&index_of(&[("a", 3)]));
        let (rows, filter) = first_family_fields(1);
        put_u64(&mut bytes, rows, 4);
        assert!(refusal(&bytes).contains("hold 3 keys, but it has 4 rows"));
        // Nor a capacity the index could not have written.
        let mut bytes = encode(&index_of(&[("a", 3)]));
        put_u64(&mut bytes, filter, 2_048);
        assert!(refusal(&bytes).contains("for 2048 keys"));
    }

    /// A claimed count the input does not back fails at once, without allocating it.
    #[test]
    fn giant_claims_on_short_input_are_refused() {
        let mut bytes = encode(&index_of(&[("a", 3)]));
        let (_, filter) = first_family_fields(1);
        put_u64(&mut bytes, filter + 16, u64::MAX);
        assert!(refusal(&bytes).contains("words"));
        // A family count no input holds.
        let mut bytes = encode(&index_of(&[("a", 3)]));
        put_u64(&mut bytes, 4, u64::MAX);
        assert!(refusal(&bytes).contains("reading the id of family 1"));
        // Words claimed past the input (8 TiB of them): the reader stops at the end.
        let short = [0xffu8; 100];
        let result = read_pages(
            &mut &short[..],
            1 << 40,
            "a filter",
            &mut PageRoom::unlimited(),
        );
        assert!(matches!(result, Err(RouterError::Snapshot(m)) if m.contains("the words of")));
    }
}
