//! Every bound the ledger enforces, in one place, so a reviewer sees all of them together.

/// Longest id (family, capability, hold, event, attempt, nonce), in bytes.
pub const MAX_ID_BYTES: usize = 512;
/// Prefix of event ids the cluster mints itself (expiry events); clients may not use it.
pub const RESERVED_EVENT_ID_PREFIX: &str = "auto:";
/// Ancestor accounts a delegated hold may reserve on (docs/spec.md §8).
pub const MAX_ANCESTORS: usize = 7;
/// Highest grant index a capability may address.
pub const MAX_GRANT_INDEX: u32 = 4_095;
/// Currency codes are short ASCII alphanumerics such as `USD`.
pub const MAX_CURRENCY_BYTES: usize = 16;
/// Longest hold timeout a client may ask for: a week.
pub const MAX_HOLD_TIMEOUT_MS: u64 = 7 * 24 * 3_600_000;
/// Longest nonce lifetime: nonces are remembered until they expire, so this bounds memory.
pub const MAX_NONCE_TTL_MS: u64 = 24 * 3_600_000;
/// Commands per Raft log entry (12 bits of the budget commit index, docs/spec.md §6).
pub const MAX_COMMANDS_PER_ENTRY: usize = 4_096;
/// Events one command may append (8 bits of the budget commit index, docs/spec.md §6).
pub const MAX_EVENTS_PER_COMMAND: usize = 256;
/// Holds reversed by one `ExpireHolds` command (docs/spec.md §4).
pub const MAX_EXPIRED_PER_COMMAND: usize = 256;
/// Compaction steps done after one command, so a backlog never stalls an apply. From rules
/// version 3, the bound of the leader's maintenance (`ExpireHolds`) only.
pub const MAX_COMPACTIONS_PER_COMMAND: usize = 1_024;
/// From rules version 3, compaction steps after one client command. A lowered retention makes
/// a whole retained window due at once (millions of items after 80 s at 12,000 commands/s),
/// and 1,024 steps after each command drained it within a round or two per node: 28 s without
/// an answer and 6 leader changes on a 3-node dev cluster (`scripts/retention-drop`). A
/// command queues at most a few items, so 8 keeps up with any load at twice its pace and
/// spreads a backlog over a minute of commands (slowest commands 0.3–0.9 s a second meanwhile;
/// 16 measured alike, a little slower); idle families drain by maintenance.
pub const MAX_COMPACTIONS_PER_CLIENT_COMMAND: usize = 8;
/// Compaction queue items one push moves from a sorted lane to the queue's tree: however many
/// items a lowered retention leaves due far later than new ones, one push stays a few dozen
/// tree inserts (`tables/compaction_queue.rs`).
pub const MAX_QUEUE_MOVES_PER_PUSH: usize = 64;
/// Open (non-archived) holds per family; beyond it authorize is refused, not denied.
pub const MAX_LIVE_HOLDS_PER_FAMILY: usize = 1 << 20;
/// Rows returned by one list read.
pub const MAX_LIST_LIMIT: usize = 10_000;
/// Log indexes fit in the 44 high bits of the budget commit index.
pub const MAX_LOG_INDEX: u64 = (1 << 44) - 1;
/// How far past cluster time a command's `not_after_ms` may lie: the dedupe table keeps a
/// full event until `not_after_ms + retention_ms`, so this bounds its memory.
pub const MAX_COMMAND_LIFETIME_MS: u64 = 24 * 3_600_000;
