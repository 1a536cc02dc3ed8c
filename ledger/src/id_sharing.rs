//! Ids shared while a family decodes. A family built by `apply` keeps one string per id: the
//! command's hold id is the same `Arc` in the hold's row, its expiry and compaction entries and
//! its events, and the footprint estimate (`footprint.rs`) is calibrated on that. Decoding
//! would give every occurrence its own string: a family read back from the family store or a
//! snapshot took 2.3× its estimate (a restore's first hold expiry, docs/sizing.md). Within
//! [`decoding_with_shared_ids`] each id decoded on this thread is looked up among the ids
//! this decode already made, and shares their string.
//!
//! Thread-local, so the ledger stays pure (no I/O, nothing global between decodes): the table
//! lives for one decode and is dropped when it ends.

use std::cell::RefCell;
use std::sync::Arc;

use foldhash::fast::RandomState;
use hashbrown::HashSet;

/// foldhash, as the id tables use. With SipHash a decode took 26% longer than before ids were
/// shared; with foldhash, and one allocation per distinct id instead of two per occurrence, a
/// median 0.79× as long (`cargo bench -p tally-ledger --bench apply -- decode`, 7 pairs).
type Seen = HashSet<Arc<str>, RandomState>;

thread_local! {
    static SEEN: RefCell<Option<Seen>> = const { RefCell::new(None) };
}

/// Runs `decode` with ids that repeat sharing one string. Nested calls share the outer table.
pub fn decoding_with_shared_ids<T>(decode: impl FnOnce() -> T) -> T {
    /// Drops the table when the outermost decode ends, even by a panic.
    struct Scope {
        outermost: bool,
    }
    impl Drop for Scope {
        fn drop(&mut self) {
            if self.outermost {
                SEEN.with(|seen| seen.borrow_mut().take());
            }
        }
    }
    let outermost = SEEN.with(|seen| {
        let mut seen = seen.borrow_mut();
        let outermost = seen.is_none();
        if outermost {
            *seen = Some(Seen::default());
        }
        outermost
    });
    let _scope = Scope { outermost };
    decode()
}

/// The string for an id being decoded: within a decode, the one already made for equal text.
pub(crate) fn shared(text: &str) -> Arc<str> {
    SEEN.with(|seen| match seen.borrow_mut().as_mut() {
        // One hash and one probe for a new id as for a repeated one.
        Some(seen) => seen
            .get_or_insert_with(text, |text: &str| Arc::from(text))
            .clone(),
        None => Arc::from(text),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_ids_share_a_string_only_within_a_decode() {
        let (a, b) = decoding_with_shared_ids(|| (shared("hold-1"), shared("hold-1")));
        assert!(Arc::ptr_eq(&a, &b), "one decode shares equal ids");
        assert!(
            !Arc::ptr_eq(&shared("hold-1"), &shared("hold-1")),
            "none outside"
        );
        let other = decoding_with_shared_ids(|| shared("hold-1"));
        assert!(!Arc::ptr_eq(&a, &other), "each decode starts empty");
        let (outer, inner) = decoding_with_shared_ids(|| {
            let outer = shared("x");
            (outer, decoding_with_shared_ids(|| shared("x")))
        });
        assert!(
            Arc::ptr_eq(&outer, &inner),
            "a nested decode shares the outer table"
        );
        SEEN.with(|seen| {
            assert!(
                seen.borrow().is_none(),
                "the table is gone after the decode"
            )
        });
    }

    #[test]
    fn a_panicking_decode_leaves_no_table_behind() {
        let caught = std::panic::catch_unwind(|| {
            decoding_with_shared_ids(|| {
                shared("x");
                panic!("decode failed");
            })
        });
        assert!(caught.is_err());
        SEEN.with(|seen| assert!(seen.borrow().is_none(), "dropped by the unwind"));
    }
}
