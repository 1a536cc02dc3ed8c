//! Tally's gRPC wire (package `tally.v1`): the generated prost messages and tonic
//! clients/servers, and the conversions between them and the pure ledger's types. Protobuf
//! types stop here: the ledger never sees them (docs/architecture.md, "Workspace").

pub mod convert;
pub mod error;
pub mod raft;
pub mod status;
pub mod text;

/// Generated prost messages and tonic clients/servers of package `tally.v1`
/// (e.g. `pb::budget_server::BudgetServer`, `pb::raft_client::RaftClient`).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/tally.v1.rs"));
}

pub use convert::error::RemoteError;
pub use error::WireError;
pub use raft::{decode_raft, encode_raft, RAFT_WIRE_VERSION};

/// The encoded `FileDescriptorSet` of every `tally.v1` file, for tonic-reflection (so
/// grpcurl works without the `.proto` files).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tally_v1_descriptor.bin"));

/// Largest gRPC message either side accepts or sends. A full batch of commands, a Raft
/// append of one such batch, and a snapshot chunk all fit well within it.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Commands in one `Batch`/`Forward` request: one Raft entry carries at most this many
/// (the 12 command bits of the budget commit index, docs/spec.md §6).
pub const MAX_BATCH_COMMANDS: usize = tally_ledger::limits::MAX_COMMANDS_PER_ENTRY;

/// `Decision.cluster.guarantee_level` (docs/spec.md §6): committed by a quorum and applied.
pub const GUARANTEE_LEVEL: &str = "raft_linearizable";

/// Reply trailer that tells whether the outcome is final (docs/spec.md §10).
pub const OUTCOME_TRAILER: &str = "tally-outcome";

/// Header naming the leader's address: when this node cannot serve a write (docs/spec.md §10), and
/// on a write a follower served by forwarding it, so the client sends the next one there.
pub const LEADER_HEADER: &str = "x-tally-leader";

#[cfg(test)]
mod tests {
    use super::*;

    fn contains(haystack: &[u8], needle: &str) -> bool {
        haystack
            .windows(needle.len())
            .any(|window| window == needle.as_bytes())
    }

    #[test]
    fn descriptor_set_names_every_service_for_reflection() {
        for name in [
            "tally/v1/common.proto",
            "Budget",
            "Admin",
            "Raft",
            "ResolveEvent",
            "Forward",
        ] {
            assert!(
                contains(FILE_DESCRIPTOR_SET, name),
                "{name} missing from the descriptor set"
            );
        }
    }

    #[test]
    fn generated_clients_and_servers_are_where_callers_look() {
        fn names<T>() -> &'static str {
            std::any::type_name::<T>()
        }
        type Channel = tonic::transport::Channel;
        assert!(names::<pb::budget_client::BudgetClient<Channel>>().contains("BudgetClient"));
        assert!(names::<pb::admin_client::AdminClient<Channel>>().contains("AdminClient"));
        assert!(names::<pb::raft_client::RaftClient<Channel>>().contains("RaftClient"));
        assert_eq!(pb::budget_server::SERVICE_NAME, "tally.v1.Budget");
        assert_eq!(pb::admin_server::SERVICE_NAME, "tally.v1.Admin");
        assert_eq!(pb::raft_server::SERVICE_NAME, "tally.v1.Raft");
        assert_eq!(MAX_BATCH_COMMANDS, 4_096);
    }
}
