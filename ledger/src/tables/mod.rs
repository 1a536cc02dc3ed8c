//! The in-memory containers the budget rules keep their state in: hash tables keyed by ids,
//! chunked queues, the dedupe table and the compaction queue, and the field hashes of a
//! command's identity. They know nothing of budgets; the rules in `apply/` and `family.rs`
//! decide what goes in them. Nothing here touches a disk: these are the hot state's containers,
//! not the node's on-disk state store.

pub(crate) mod chunked_deque;
pub(crate) mod chunked_tree;
pub(crate) mod compaction_queue;
pub(crate) mod dedupe_table;
pub mod id_map;
pub mod id_table;
pub(crate) mod identity_fields;
pub(crate) mod spare_capacity;
