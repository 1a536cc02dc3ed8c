//! The retained journal of one family: event records in commit order.
//!
//! Events are appended in strictly increasing commit index (the log order), so the journal is a
//! deque kept sorted by construction: appending is a push at the back, a lookup is a binary search,
//! and records live inline (no allocation per event) in fixed-size chunks (a family retaining
//! millions of events never copies them to grow; see `chunked_deque.rs`). Compaction removes
//! records in due order, which is close to but not exactly commit order, so a removed record leaves
//! an empty slot until every older one is gone; the front is trimmed as soon as it is empty. A slot
//! outlives its record by at most the longest retention of an older record
//! (`MAX_COMMAND_LIFETIME_MS` plus retention), so memory stays bounded.
//!
//! Encoded as a map from commit index to record, empty slots left out, so the encoding (and
//! equality) depends only on the retained records, never on compaction's history.

use std::collections::VecDeque;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::commit_index::BudgetCommitIndex;
use crate::event::EventRecord;
use crate::tables::chunked_deque::ChunkedDeque;
use crate::tables::spare_capacity::release_spare;

/// Two deques of equal length: the commit indices apart from the records, so a binary
/// search reads 8 bytes per step instead of a record's cache line.
#[derive(Clone, Default)]
pub(crate) struct Journal {
    indices: VecDeque<BudgetCommitIndex>,
    records: ChunkedDeque<Option<EventRecord>>,
    /// Slots that still hold a record.
    live: usize,
}

impl Journal {
    /// Appends `record` at `index`, which must be above every index appended before.
    pub fn append(&mut self, index: BudgetCommitIndex, record: EventRecord) {
        if let Some(last) = self.indices.back() {
            assert!(
                index > *last,
                "journal append at {index:?} after {last:?}: commit order broken"
            );
        }
        self.indices.push_back(index);
        self.records.push_back(Some(record));
        self.live += 1;
    }

    /// Where `index` sits. Compaction discards records in due order, close to commit order,
    /// so the one it asks for is nearly always at or near the front: the search gallops from
    /// the front (1, 2, 4, ... slots) and then bisects the last stride, a handful of reads
    /// where a bisection of the whole journal would read a cold line at each of its steps.
    fn position(&self, index: BudgetCommitIndex) -> Option<usize> {
        let len = self.indices.len();
        let (mut low, mut stride) = (0, 1);
        loop {
            let probe = low + stride - 1;
            if probe >= len {
                break;
            }
            match self.indices[probe].cmp(&index) {
                std::cmp::Ordering::Equal => return Some(probe),
                std::cmp::Ordering::Greater => return self.bisect(low, probe, index),
                std::cmp::Ordering::Less => {
                    low = probe + 1;
                    stride *= 2;
                }
            }
        }
        self.bisect(low, len, index)
    }

    /// `index`'s slot within `low..high`, by bisection.
    fn bisect(&self, low: usize, high: usize, index: BudgetCommitIndex) -> Option<usize> {
        let (mut low, mut high) = (low, high);
        while low < high {
            let middle = low + (high - low) / 2;
            match self.indices[middle].cmp(&index) {
                std::cmp::Ordering::Equal => return Some(middle),
                std::cmp::Ordering::Less => low = middle + 1,
                std::cmp::Ordering::Greater => high = middle,
            }
        }
        None
    }

    pub fn get(&self, index: BudgetCommitIndex) -> Option<&EventRecord> {
        self.position(index)
            .and_then(|at| self.records.get(at)?.as_ref())
    }

    /// Drops the record at `index` in place (records are large: moving one out to drop it
    /// costs a copy) and trims empty slots from the front. Whether a record was there and
    /// passed `check`, which sees it first.
    pub fn discard(
        &mut self,
        index: BudgetCommitIndex,
        check: impl FnOnce(&EventRecord) -> bool,
    ) -> bool {
        let Some(at) = self.position(index) else {
            return false;
        };
        let slot = self.records.get_mut(at).expect("every index has a slot");
        let passed = slot.as_ref().is_some_and(check);
        if slot.is_some() {
            *slot = None;
            self.live -= 1;
        }
        // Empty slots are dropped in place: popping one would move a record-sized slot out.
        while self.records.front().is_some_and(Option::is_none) {
            self.records.discard_front();
            self.indices.pop_front();
        }
        release_spare(&mut self.indices);
        passed
    }

    /// Retained records in commit order.
    pub fn records(&self) -> impl Iterator<Item = &EventRecord> {
        self.records.iter().flatten()
    }

    /// Retained records with a commit index above `after` (all of them for `None`), in order.
    pub fn records_after(
        &self,
        after: Option<BudgetCommitIndex>,
    ) -> impl Iterator<Item = &EventRecord> {
        let start = after.map_or(0, |after| self.indices.partition_point(|i| *i <= after));
        self.records.iter_from(start).flatten()
    }

    pub fn len(&self) -> usize {
        self.live
    }
}

impl PartialEq for Journal {
    fn eq(&self, other: &Self) -> bool {
        self.live == other.live && self.records().eq(other.records())
    }
}

impl Eq for Journal {}

impl fmt::Debug for Journal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.records().map(|record| (record.commit_index, record)))
            .finish()
    }
}

impl Serialize for Journal {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.live))?;
        for (index, record) in self.indices.iter().zip(self.records.iter()) {
            if let Some(record) = record {
                map.serialize_entry(index, record)?;
            }
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Journal {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct JournalVisitor;

        impl<'de> Visitor<'de> for JournalVisitor {
            type Value = Journal;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from commit index to event record, in commit order")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Journal, A::Error> {
                let mut journal = Journal::default();
                while let Some((index, record)) =
                    map.next_entry::<BudgetCommitIndex, EventRecord>()?
                {
                    if journal.indices.back().is_some_and(|last| index <= *last) {
                        return Err(serde::de::Error::custom(format!(
                            "journal entry {index:?} is out of commit order"
                        )));
                    }
                    journal.append(index, record);
                }
                Ok(journal)
            }
        }

        deserializer.deserialize_map(JournalVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;

    fn record(index: u64) -> EventRecord {
        EventRecord {
            event_id: format!("e{index}").into(),
            kind: EventKind::ConsumeNonce,
            commit_index: BudgetCommitIndex(index),
            log_id: Default::default(),
            at_ms: 0,
            capability_id: "cap".into(),
            grant_index: 0,
            hold_id: None,
            attempt_id: None,
            nonce_id: None,
            allowed: true,
            deny_reason: None,
            exposure_units: 0,
            realized_units: 0,
            limits: None,
            hold_before: None,
            hold_after: None,
            after_images: Default::default(),
        }
    }

    fn journal(indices: &[u64]) -> Journal {
        let mut journal = Journal::default();
        for index in indices {
            journal.append(BudgetCommitIndex(*index), record(*index));
        }
        journal
    }

    fn retained(journal: &Journal) -> Vec<u64> {
        journal.records().map(|r| r.commit_index.0).collect()
    }

    #[test]
    fn removal_out_of_order_keeps_order_and_trims_the_front() {
        let mut j = journal(&[10, 20, 30, 40]);
        assert!(j.discard(BudgetCommitIndex(30), |r| r.commit_index.0 == 30));
        assert!(!j.discard(BudgetCommitIndex(30), |_| true), "removed once");
        assert!(!j.discard(BudgetCommitIndex(25), |_| true), "never there");
        assert_eq!(retained(&j), [10, 20, 40]);
        assert_eq!(
            (j.len(), j.indices.len()),
            (3, 4),
            "a hole behind 10 and 20"
        );
        assert!(
            !j.discard(BudgetCommitIndex(10), |_| false),
            "dropped though the check fails"
        );
        j.discard(BudgetCommitIndex(20), |_| true);
        assert_eq!(j.indices.len(), 1, "the front holes are trimmed");
        assert!(j.get(BudgetCommitIndex(40)).is_some());
        assert!(j.get(BudgetCommitIndex(20)).is_none());
    }

    #[test]
    fn every_index_is_found_wherever_it_sits() {
        for len in 0..40u64 {
            let indices: Vec<u64> = (0..len).map(|i| 10 * i + 10).collect();
            let j = journal(&indices);
            for (at, index) in indices.iter().enumerate() {
                assert_eq!(j.position(BudgetCommitIndex(*index)), Some(at), "len {len}");
                assert_eq!(j.position(BudgetCommitIndex(index + 5)), None, "len {len}");
            }
            assert_eq!(j.position(BudgetCommitIndex(5)), None, "before the front");
        }
    }

    #[test]
    fn records_after_starts_strictly_after_the_index() {
        let mut j = journal(&[10, 20, 30, 40]);
        j.discard(BudgetCommitIndex(30), |_| true);
        let after = |i: Option<u64>| -> Vec<u64> {
            j.records_after(i.map(BudgetCommitIndex))
                .map(|r| r.commit_index.0)
                .collect()
        };
        assert_eq!(after(None), [10, 20, 40]);
        assert_eq!(after(Some(10)), [20, 40]);
        assert_eq!(after(Some(25)), [40]);
        assert_eq!(after(Some(40)), Vec::<u64>::new());
    }

    #[test]
    fn encoding_and_equality_ignore_holes() {
        let mut holed = journal(&[10, 20, 30]);
        holed.discard(BudgetCommitIndex(20), |_| true);
        let clean = journal(&[10, 30]);
        assert_eq!(holed, clean);
        let bytes = rmp_serde::to_vec(&holed).expect("encodes");
        assert_eq!(bytes, rmp_serde::to_vec(&clean).expect("encodes"));
        let back: Journal = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(retained(&back), [10, 30]);
    }

    #[test]
    #[should_panic(expected = "commit order broken")]
    fn appending_out_of_order_is_a_bug() {
        journal(&[20, 10]);
    }

    #[test]
    fn decoding_refuses_out_of_order_entries() {
        let mut map = std::collections::BTreeMap::new();
        map.insert(BudgetCommitIndex(10), record(10));
        let mut bytes = rmp_serde::to_vec(&map).expect("encodes");
        // Two entries, the second one older than the first.
        let later = rmp_serde::to_vec(&(BudgetCommitIndex(5), record(5))).expect("encodes");
        bytes[0] = 0x82;
        bytes.extend_from_slice(&later[1..]);
        assert!(rmp_serde::from_slice::<Journal>(&bytes).is_err());
    }
}
