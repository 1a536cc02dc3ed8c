//! etcd as the baseline for `tally-bench compare etcd`: the same tool calls (authorize +
//! capture + reconcile, the same limits, the same idempotency) kept in a 3-member etcd, written
//! as fast as we know how so that Tally's ratio over it is honest.
//!
//! # The scheme
//!
//! * **Keys.** One key per account, `tb/a/{family}/{capability}/{grant}`, holding its pinned
//!   limits, invocation count, exposed and realized units (40-60 bytes, [`scheme::Account`]);
//!   one key per hold, `tb/h/{family}/{hold}`, holding its state, requested and realized units,
//!   expiry and capture attempt ([`scheme::Hold`]). The hold key is what makes every step
//!   idempotent: a retried step finds it and is answered from it (a replay), never counted
//!   twice; the same hold id from a different request is refused (`HoldReused`).
//! * **One round trip a step, optimistic.** A step is one `Txn` (or a share of one, below):
//!   compare the account's
//!   `mod_revision` with the one last seen (`create_revision == 0` when it has not been seen)
//!   and the hold's (`create_revision == 0` for an authorize), then put the new values. The
//!   `Txn`'s else branch reads back the account and the hold, so a lost race costs one more
//!   `Txn` and no extra read. The client caches each account's last-seen revision and value
//!   (updated from every response: a successful `Txn`'s puts all carry its header revision),
//!   so steady state never reads.
//! * **Capture touches only the hold.** Admission needs the invocation count and committed
//!   cost (exposed + realized), which a capture does not change; the reserved/captured split is
//!   in the hold keys. So a capture is a `Txn` on the hold key alone and never conflicts on
//!   the account: one of the three steps stays off the hot key. (Tally keeps the split in the
//!   account row too; leaving it out only favours etcd.)
//! * **Batching in the client, never two `Txn`s on one account.** Steps go through one
//!   batcher per client. With `--etcd-batch 1` each step is its own `Txn`; with more (up to
//!   64: 64 steps on 64 accounts are etcd's default `--max-txn-ops` of 128 compares and puts)
//!   the first step waits up to 1 ms for company, as Tally's `BatchingClient` does, and one
//!   `Txn` carries them all: one compare and put per account touched, one per hold, the limits
//!   checked step by step in queue order (several steps on one account fold into one put). An
//!   account with a `Txn` in flight takes no second one until the first is answered, so this
//!   client's callers never race each other (a race would only burn a Raft round), and a hot
//!   account moves many steps per round instead of one. Conflicts still happen (a stale
//!   cache, another client: the run starts with two clients racing on purpose) and are
//!   retried as above. A `Txn` whose compare fails is re-planned whole, from its reads.
//! * **Durability** is etcd's default: every `Txn` is committed through Raft and fsynced by a
//!   majority before it answers; etcd batches concurrent proposals into one fsync, as Tally
//!   does. Not modelled: hold expiry sweeping (a capture checks the hold's expiry itself;
//!   nothing in the bench expires) and history compaction (off, etcd's default, which spares
//!   etcd that work during the run).
//!
//! Writes go to the leader (found with `Maintenance.Status`) over one HTTP/2 connection, as
//! Tally's client keeps one per node; followers would forward them anyway. After the sweep the
//! bench sums every account key and checks it against the calls made (invocations = calls,
//! exposed = 0, realized = 60 x calls).

pub mod driver;
pub mod members;
pub mod scheme;

/// Prost messages and the tonic client for the subset of etcd's API in `proto/etcd/`.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    pub mod mvccpb {
        include!(concat!(env!("OUT_DIR"), "/mvccpb.rs"));
    }
    pub mod etcdserverpb {
        include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
    }
}
