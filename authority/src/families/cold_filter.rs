//! One Bloom filter over a family's rows out of memory (`cold_index`), its bits in pages that
//! sit in memory or, beyond the filters' share of the memory budget, in a scratch file on
//! disk (`FilterPageFile`), read back a 4 KiB block at a time. This is what keeps a node's
//! memory set by its configuration while a family that never goes idle builds a history of
//! hundreds of millions of rows (docs/sizing.md): only the page table (~40 bytes per 64 KiB
//! page, 1/1,600 of the filter) stays in memory for a page on disk.
//!
//! Page-blocked: all of a key's probes land in one 4 KiB block (32,768 bits, ~2,048 keys when
//! full), so a lookup in a filter whose page is on disk reads one block, whatever the
//! filter's size. A block holds enough keys that their count varies by ~2% from block to
//! block, so a full filter still answers "maybe" for about 1 in 2,000 absent keys, as an
//! unblocked one does (`blocked_filters_pass_as_few_absent_keys_as_unblocked_ones`);
//! cache-line blocks of 512 bits would pass ~4 times as many.
//!
//! A page on disk is never written over: a page written again takes a new slot, and a slot is
//! freed when the last page table naming it drops it (the index's, or a snapshot cut's), so a
//! cut reads the bits as they were at the cut while the apply path goes on. A key added to a
//! page on disk waits as its hash beside the page until the page is read back and its bits
//! set (`ColdIndex::to_flush`): adds cost no disk read, and a lookup compares the waiting
//! hashes exactly.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bits per key, and probes per key, of every filter.
pub(super) const BITS_PER_KEY: usize = 16;
const PROBES: u64 = 11;

/// Words per page of a filter's bits (64 KiB): the unit a cut shares, an add copies, and the
/// page file stores; a filter of fewer words is one page of its own size. A power of two, as
/// every filter's word count is, so pages divide filters evenly.
pub(super) const PAGE_WORDS: usize = 1 << PAGE_SHIFT;
const PAGE_SHIFT: u32 = 13;
/// Words per block (4 KiB): all of a key's bits are in one, so a lookup reads one from disk.
pub(super) const BLOCK_WORDS: usize = 512;

/// A Bloom filter whose bits are pages shared copy-on-write: a clone clones the pages'
/// references (and the hashes waiting beside pages on disk), not their bits.
#[derive(Clone)]
pub(super) struct Bloom {
    /// The filter's words in order, `page_words(words)` to a page.
    pages: Vec<Page>,
    pub words: usize,
    pub keys: usize,
    pub capacity: usize,
    /// Pages in memory, and hashes waiting beside pages on disk: what `memory_bytes` counts.
    in_memory: usize,
    pending: usize,
}

#[derive(Clone)]
pub(super) enum Page {
    /// Never written: all zeros, in no memory and no slot. A new filter's pages all start so,
    /// since a filter is made on the apply path, and a family's ninth (made at 22 million
    /// rows) is 128 MiB.
    Zero,
    /// In memory, shared with the cuts that hold it until an add copies it.
    Memory(Arc<[u64]>),
    /// In the page file, with the hashes of the keys added since it was written.
    Disk { slot: Arc<Slot>, pending: Vec<u64> },
}

/// What a filter says of a key (`Bloom::probe`).
pub(crate) enum Probe {
    Absent,
    Maybe,
    /// Its page is on disk and no waiting hash is the key's: the block answers.
    Read(BlockRead),
}

/// One block of a page on disk, to read (off the async workers) and probe for a key.
pub(crate) struct BlockRead {
    slot: Arc<Slot>,
    words: usize,
    hash: u64,
}

impl BlockRead {
    /// Whether the key may be in the filter, by its block as the slot holds it: one read
    /// into a buffer on the stack, so a lookup allocates nothing. Blocking.
    pub fn may_contain(&self) -> io::Result<bool> {
        let block_words = page_words(self.words).min(BLOCK_WORDS);
        let mut at = positions(self.words, self.hash).map(locate).peekable();
        let first = at.peek().expect("a key has probes").1;
        let block_first = first - first % block_words;
        let mut block = [0u8; BLOCK_WORDS * 8];
        let block = &mut block[..block_words * 8];
        self.slot.read_block(block_first, block)?;
        Ok(at.all(|(_, word, bit)| {
            assert!(
                (block_first..block_first + block_words).contains(&word),
                "a key's probes left its block"
            );
            let at = (word - block_first) * 8;
            let bytes = block[at..at + 8].try_into().expect("eight bytes");
            u64::from_le_bytes(bytes) & bit != 0
        }))
    }
}

impl Bloom {
    /// An empty filter, its pages all `Page::Zero` until a key lands in them.
    pub fn new(capacity: usize) -> Self {
        let words = filter_words(capacity).expect("a filter's capacity fits in memory");
        Self {
            pages: vec![Page::Zero; words / page_words(words)],
            words,
            keys: 0,
            capacity,
            in_memory: 0,
            pending: 0,
        }
    }

    /// A filter of these pages, in memory or in the page file with no hash waiting (a saved
    /// filter read back).
    pub fn from_pages(pages: Vec<Page>, words: usize, keys: usize, capacity: usize) -> Self {
        assert_eq!(
            pages.len() * page_words(words),
            words,
            "a filter's pages hold its words"
        );
        assert!(
            (pages.iter()).all(|page| match page {
                Page::Zero => false,
                Page::Memory(_) => true,
                Page::Disk { pending, .. } => pending.is_empty(),
            }),
            "a filter read back has every page in memory or written whole"
        );
        Self {
            in_memory: (pages.iter())
                .filter(|page| matches!(page, Page::Memory(_)))
                .count(),
            pages,
            words,
            keys,
            capacity,
            pending: 0,
        }
    }

    /// The filter's bits, wherever they are.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.words * 8
    }

    /// What the filter holds in memory: its pages in memory, the hashes waiting beside its
    /// pages on disk, and its page table.
    pub fn memory_bytes(&self) -> usize {
        self.in_memory * page_words(self.words) * 8
            + self.pending * 8
            + self.pages.len() * std::mem::size_of::<Page>()
    }

    /// Pages in memory (not on disk, not `Page::Zero`).
    pub fn pages_in_memory(&self) -> usize {
        self.in_memory
    }

    /// Hashes waiting beside the filter's pages on disk.
    pub fn pending(&self) -> usize {
        self.pending
    }

    pub fn pages(&self) -> &[Page] {
        &self.pages
    }

    /// Sets the key's bits, first copying its page if a cut's copy shares it: one page,
    /// whatever the filter's size. A page on disk keeps the hash beside it instead.
    pub fn insert(&mut self, hash: u64) {
        let mut at = positions(self.words, hash).map(locate).peekable();
        let page = at.peek().expect("a key has probes").0;
        if matches!(self.pages[page], Page::Zero) {
            self.pages[page] =
                Page::Memory(std::iter::repeat_n(0, page_words(self.words)).collect());
            self.in_memory += 1;
        }
        match &mut self.pages[page] {
            Page::Zero => unreachable!("written above"),
            Page::Memory(words) => {
                let words = Arc::make_mut(words);
                for (_, word, bit) in at {
                    words[word] |= bit;
                }
            }
            Page::Disk { pending, .. } => {
                pending.push(hash);
                self.pending += 1;
            }
        }
        self.keys += 1;
    }

    /// Whether the key may be in the filter, or which block on disk tells.
    pub fn probe(&self, hash: u64) -> Probe {
        let mut at = positions(self.words, hash).map(locate).peekable();
        let page = at.peek().expect("a key has probes").0;
        match &self.pages[page] {
            Page::Zero => Probe::Absent,
            Page::Memory(words) => {
                if at.all(|(_, word, bit)| words[word] & bit != 0) {
                    Probe::Maybe
                } else {
                    Probe::Absent
                }
            }
            Page::Disk { pending, .. } if pending.contains(&hash) => Probe::Maybe,
            Page::Disk { slot, .. } => Probe::Read(BlockRead {
                slot: Arc::clone(slot),
                words: self.words,
                hash,
            }),
        }
    }

    /// Page `n`'s words as they are, read from the page file if it is there (blocking).
    pub fn page_words_at(&self, n: usize) -> io::Result<Arc<[u64]>> {
        match &self.pages[n] {
            Page::Zero => Ok(std::iter::repeat_n(0, page_words(self.words)).collect()),
            Page::Memory(words) => Ok(Arc::clone(words)),
            Page::Disk { slot, pending } => {
                let mut words = slot.read_page(page_words(self.words))?;
                set_bits(&mut words, self.words, pending);
                Ok(words.into())
            }
        }
    }

    /// Page `n`, in memory, is now in `slot` (`ColdIndex::evicted`).
    pub fn evicted(&mut self, n: usize, slot: Arc<Slot>) {
        assert!(
            matches!(self.pages[n], Page::Memory(_)),
            "page {n} was evicted twice"
        );
        self.pages[n] = Page::Disk {
            slot,
            pending: Vec::new(),
        };
        self.in_memory -= 1;
    }

    /// Page `n`, on disk, read back as `words` (its slot's words): its waiting hashes are set
    /// and it is in memory again.
    pub fn flushed(&mut self, n: usize, mut words: Vec<u64>) {
        let Page::Disk { pending, .. } = &self.pages[n] else {
            panic!("page {n} was flushed while in memory");
        };
        assert_eq!(
            words.len(),
            page_words(self.words),
            "a page read back whole"
        );
        set_bits(&mut words, self.words, pending);
        self.pending -= pending.len();
        self.pages[n] = Page::Memory(words.into());
        self.in_memory += 1;
    }
}

/// Sets the bits of each hash in `words`, the page of a filter of `filter_words` they land in.
fn set_bits(words: &mut [u64], filter_words: usize, hashes: &[u64]) {
    for &hash in hashes {
        for (_, word, bit) in positions(filter_words, hash).map(locate) {
            words[word] |= bit;
        }
    }
}

/// The 64-bit words of a filter for `capacity` keys, unless that overflows.
pub(super) fn filter_words(capacity: usize) -> Option<usize> {
    Some(capacity.checked_mul(BITS_PER_KEY)?.div_ceil(64))
}

/// The words per page of a filter of `words` words: `PAGE_WORDS`, or all of a smaller one.
pub(super) fn page_words(words: usize) -> usize {
    assert!(words.is_power_of_two(), "a filter of {words} words");
    words.min(PAGE_WORDS)
}

/// Bit `at` of a filter as its page, its word in the page and its mask. A filter smaller
/// than `PAGE_WORDS` has only words below it, so all of them land in its one page.
fn locate(at: usize) -> (usize, usize, u64) {
    let word = at >> 6;
    (word >> PAGE_SHIFT, word & (PAGE_WORDS - 1), 1 << (at & 63))
}

/// The bit positions of `hash` in a filter of `words` 64-bit words: a block chosen by bits
/// 15–31 and 47–63 of the hash, then double hashing inside it over bits 0–14 of each 32-bit
/// half (the step is odd and the block's size a power of two, so the probes are distinct and
/// a mask replaces eleven divisions). Borrows nothing, so inserting costs no list.
fn positions(words: usize, hash: u64) -> impl Iterator<Item = usize> {
    assert!(words.is_power_of_two(), "a filter of {words} words");
    let block_words = words.min(BLOCK_WORDS);
    let block_bits = (block_words * 64) as u64;
    let blocks = (words / block_words) as u64;
    let block = (((hash >> 15) & 0x1_ffff) | ((hash >> 47) << 17)) & (blocks - 1);
    let base = block * block_bits;
    let (low, step) = (hash & 0xffff_ffff, (hash >> 32) | 1);
    (0..PROBES)
        .map(move |i| (base + (low.wrapping_add(i.wrapping_mul(step)) & (block_bits - 1))) as usize)
}

/// The node's scratch file of filter pages: slots of one page (64 KiB) each, written once and
/// freed when no page table names them, reused before the file grows. Unnamed (made with
/// `O_TMPFILE` or unlinked at once), so a crash leaves nothing behind: the filters are
/// derived state, saved whole with the node's snapshots.
pub(crate) struct FilterPageFile {
    file: File,
    slots: Mutex<SlotAllocation>,
    /// Blocks read for lookups, pages read back and pages written.
    block_reads: AtomicU64,
    page_reads: AtomicU64,
    page_writes: AtomicU64,
}

#[derive(Default)]
struct SlotAllocation {
    free: Vec<u64>,
    next: u64,
}

/// One page's place in the page file, freed on drop.
pub(crate) struct Slot {
    file: Arc<FilterPageFile>,
    index: u64,
}

impl Slot {
    /// The block of `len` words from word `first` of the page, for a lookup. Blocking.
    fn read_block(&self, first: usize, out: &mut [u8]) -> io::Result<()> {
        self.file.block_reads.fetch_add(1, Ordering::Relaxed);
        self.read_into(first, out)
    }

    /// The page's first `len` words (all of it: a filter's page is `page_words` long), to
    /// set its waiting hashes in. Blocking.
    pub fn read_page(&self, len: usize) -> io::Result<Vec<u64>> {
        self.file.page_reads.fetch_add(1, Ordering::Relaxed);
        let mut bytes = vec![0u8; len * 8];
        self.read_into(0, &mut bytes)?;
        Ok(bytes
            .chunks_exact(8)
            .map(|word| u64::from_le_bytes(word.try_into().expect("chunks of eight bytes")))
            .collect())
    }

    /// `out.len()` bytes from word `first` of the page.
    fn read_into(&self, first: usize, out: &mut [u8]) -> io::Result<()> {
        assert!(
            first * 8 + out.len() <= PAGE_WORDS * 8,
            "a read past its slot"
        );
        let offset = self.index * (PAGE_WORDS * 8) as u64 + (first * 8) as u64;
        self.file.file.read_exact_at(out, offset)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut slots = self
            .file
            .slots
            .lock()
            .expect("the slot list is never poisoned");
        slots.free.push(self.index);
    }
}

impl FilterPageFile {
    /// A new, unnamed page file in `dir` (the system's temporary directory without one).
    pub fn create(dir: Option<&Path>) -> io::Result<Arc<Self>> {
        let file = match dir {
            Some(dir) => tempfile::tempfile_in(dir)?,
            None => tempfile::tempfile()?,
        };
        Ok(Arc::new(Self {
            file,
            slots: Mutex::default(),
            block_reads: AtomicU64::new(0),
            page_reads: AtomicU64::new(0),
            page_writes: AtomicU64::new(0),
        }))
    }

    /// Writes a page to a free slot. Blocking.
    pub fn write(self: &Arc<Self>, words: &[u64]) -> io::Result<Arc<Slot>> {
        assert!(words.len() <= PAGE_WORDS, "a page of {} words", words.len());
        let index = {
            let mut slots = self.slots.lock().expect("the slot list is never poisoned");
            slots.free.pop().unwrap_or_else(|| {
                slots.next += 1;
                slots.next - 1
            })
        };
        // Taken before the write, so a failed write frees the slot again.
        let slot = Arc::new(Slot {
            file: Arc::clone(self),
            index,
        });
        let mut bytes = Vec::with_capacity(words.len() * 8);
        words
            .iter()
            .for_each(|word| bytes.extend_from_slice(&word.to_le_bytes()));
        self.file
            .write_all_at(&bytes, index * (PAGE_WORDS * 8) as u64)?;
        self.page_writes.fetch_add(1, Ordering::Relaxed);
        Ok(slot)
    }

    /// The file's length: its slots, in use or free.
    pub fn bytes(&self) -> u64 {
        let slots = self.slots.lock().expect("the slot list is never poisoned");
        slots.next * (PAGE_WORDS * 8) as u64
    }

    /// `(blocks read for lookups, pages read back, pages written)` so far.
    pub fn io_counts(&self) -> (u64, u64, u64) {
        (
            self.block_reads.load(Ordering::Relaxed),
            self.page_reads.load(Ordering::Relaxed),
            self.page_writes.load(Ordering::Relaxed),
        )
    }
}

/// A failed read or write of the page file: the node's disk failed under it (fatal, as any
/// store error).
pub(super) fn page_file_error(what: &str, error: io::Error) -> super::error::RouterError {
    super::error::RouterError::Store(format!("could not {what} the filters' page file: {error}"))
}

/// Writes a filter's words, little-endian, a page at a time (reading its pages on disk).
/// `buf` is scratch space the caller keeps across filters.
pub(super) fn write_words(
    out: &mut impl Write,
    filter: &Bloom,
    buf: &mut Vec<u8>,
) -> io::Result<()> {
    for n in 0..filter.pages.len() {
        let words = filter.page_words_at(n)?;
        buf.clear();
        words
            .iter()
            .for_each(|word| buf.extend_from_slice(&word.to_le_bytes()));
        out.write_all(buf)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use tally_ledger::ColdKeyHash;

    use super::*;

    fn hash(key: &str) -> u64 {
        ColdKeyHash::of_bytes(key.as_bytes()).value()
    }

    fn maybe(filter: &Bloom, hash: u64) -> bool {
        match filter.probe(hash) {
            Probe::Absent => false,
            Probe::Maybe => true,
            Probe::Read(block) => block.may_contain().expect("the block reads"),
        }
    }

    /// A full filter, blocked in 4 KiB, passes about as many absent keys as the unblocked
    /// formula says: (1 - e^(-11/16))^11 ≈ 4.6e-4.
    #[test]
    fn blocked_filters_pass_as_few_absent_keys_as_unblocked_ones() {
        let capacity = 1 << 18;
        let mut filter = Bloom::new(capacity);
        for n in 0..capacity {
            filter.insert(hash(&format!("key-{n}")));
        }
        assert!((0..capacity).all(|n| maybe(&filter, hash(&format!("key-{n}")))));
        let tries = 400_000;
        let passed = (0..tries)
            .filter(|n| maybe(&filter, hash(&format!("absent-{n}"))))
            .count();
        let rate = passed as f64 / tries as f64;
        assert!(
            (2.5e-4..7e-4).contains(&rate),
            "{passed} of {tries} absent keys passed ({rate:.2e})"
        );
    }

    /// Every probe of a key is in one block of one page.
    #[test]
    fn a_key_probes_one_block() {
        for words in [256, 1 << 10, 1 << 13, 1 << 16, 1 << 22] {
            for n in 0..1_000 {
                let blocks: BTreeSet<usize> = positions(words, hash(&format!("k{n}")))
                    .map(|at| (at >> 6) / words.min(BLOCK_WORDS))
                    .collect();
                assert_eq!(blocks.len(), 1, "{words} words, key {n}");
            }
        }
    }

    /// A new filter's pages take no memory until a key lands in one; a key writes one.
    #[test]
    fn a_new_filter_writes_its_pages_as_keys_land() {
        let mut filter = Bloom::new(1 << 20);
        assert_eq!((filter.bytes(), filter.pages.len()), (2 << 20, 32));
        let table = 32 * std::mem::size_of::<Page>();
        assert_eq!(filter.memory_bytes(), table, "no page in memory");
        let hash = hash("a key");
        assert!(!maybe(&filter, hash));
        filter.insert(hash);
        assert!(maybe(&filter, hash));
        let written = locate(positions(filter.words, hash).next().unwrap()).0;
        for (n, page) in filter.pages.iter().enumerate() {
            assert_eq!(matches!(page, Page::Memory(_)), n == written, "page {n}");
        }
        assert_eq!(filter.memory_bytes(), table + PAGE_WORDS * 8);
        assert!(filter
            .page_words_at(written ^ 1)
            .unwrap()
            .iter()
            .all(|&w| w == 0));
        let mut small = Bloom::new(1_024);
        small.insert(hash);
        assert_eq!(small.pages.len(), 1);
        assert_eq!(small.page_words_at(0).unwrap().len(), 256);
    }

    /// Pages written to the file answer as they did in memory; keys added while a page is on
    /// disk wait beside it and are found; a flush sets them; a clone keeps the slot it holds
    /// and the file reuses a slot only once no page table names it.
    #[test]
    fn pages_on_disk_answer_as_in_memory_and_slots_are_reused_only_when_free() {
        let file = FilterPageFile::create(None).expect("a page file");
        let mut filter = Bloom::new(1 << 16);
        let before: Vec<u64> = (0..30_000).map(|n| hash(&format!("a{n}"))).collect();
        before.iter().for_each(|&h| filter.insert(h));
        let saved: Vec<Arc<[u64]>> = (0..filter.pages.len())
            .map(|n| filter.page_words_at(n).unwrap())
            .collect();
        for (n, words) in saved.iter().enumerate() {
            let slot = file.write(words).expect("written");
            filter.evicted(n, slot);
        }
        assert_eq!(filter.in_memory, 0);
        assert!(filter.memory_bytes() < 1_024, "{}", filter.memory_bytes());
        assert!(before.iter().all(|&h| maybe(&filter, h)));
        let after: Vec<u64> = (0..20_000).map(|n| hash(&format!("b{n}"))).collect();
        after.iter().for_each(|&h| filter.insert(h));
        assert_eq!(filter.pending(), 20_000);
        assert!(after.iter().all(|&h| maybe(&filter, h)));
        let absent = (0..50_000)
            .filter(|n| maybe(&filter, hash(&format!("c{n}"))))
            .count();
        assert!(absent < 250, "{absent} absent keys passed");
        let cut = filter.clone();
        let slots_before = file.bytes();
        let words = cut.page_words_at(0).unwrap().to_vec();
        let unflushed = match &filter.pages[0] {
            Page::Disk { slot, .. } => slot.read_page(PAGE_WORDS).unwrap(),
            Page::Zero | Page::Memory(_) => unreachable!("page 0 was evicted"),
        };
        filter.flushed(0, unflushed);
        assert_eq!(filter.page_words_at(0).unwrap().to_vec(), words);
        // The cut still names page 0's slot: a new write takes a new one.
        file.write(&words).expect("written");
        assert!(file.bytes() > slots_before);
        drop(cut);
        let grown = file.bytes();
        file.write(&words).expect("written");
        assert_eq!(file.bytes(), grown, "a freed slot is reused");
        assert!(before.iter().chain(&after).all(|&h| maybe(&filter, h)));
        let (blocks, pages, writes) = file.io_counts();
        assert_eq!(
            (pages, writes),
            (2, 4),
            "a read for the cut, one for the flush"
        );
        assert!(blocks > 50_000, "lookups read blocks: {blocks}");
    }
}
