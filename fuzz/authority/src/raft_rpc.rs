//! The payloads of the internal `tally.v1.Raft` service, as peers decode them with
//! `tally_api::decode_raft` (version byte + positional msgpack): the requests a node serves
//! (authority/src/service/raft.rs) and the replies it reads back (raft/network.rs,
//! node/proposer.rs, service/read_gate.rs). `Forward`'s request (`Vec<Command>`) is the
//! `forward_commands` target of the wire package.
//!
//! Input: a selector byte (which payload, see [`PAYLOADS`]), then the `RaftBytes` payload.
//!
//! Asserts: every payload that decodes re-encodes with `encode_raft` to bytes that decode to
//! the same value (or, for the types without `PartialEq`, to the same bytes again), and its
//! `Display`/`Debug` forms, which the node logs, do not panic. An `AppendEntries` request's
//! entries also pass the log-entry checks of `raft_entry` (named and positional round trips).

use std::fmt::Debug;

use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::VoteOf;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tally_api::{decode_raft, encode_raft};
use tally_authority::node::proposer::ForwardReply;
use tally_authority::node::write_error::WriteError;
use tally_authority::raft::types::{ProposalReply, SnapshotMeta, TypeConfig};
use tally_fuzz_common::roundtrip::{msgpack, msgpack_named};
use tally_fuzz_common::seeds::selected;

type Vote = VoteOf<TypeConfig>;

pub const PAYLOADS: &[&str] = &[
    "VoteRequest",
    "VoteResponse",
    "AppendEntriesRequest",
    "AppendEntriesResponse",
    "TransferLeaderRequest",
    "TransferLeaderResponse",
    "InstallSnapshot header (Vote, SnapshotMeta, digest)",
    "SnapshotResponse",
    "Forward reply",
    "ReadIndex reply",
];

/// `decode_raft` then `encode_raft` and back, for a type with `PartialEq`.
fn exact<T>(what: &str, bytes: &[u8]) -> Option<T>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let value: T = decode_raft(bytes).ok()?;
    let encoded = encode_raft(&value)
        .unwrap_or_else(|e| panic!("{what}: a decoded payload does not encode: {e}\n{value:?}"));
    let back: T = decode_raft(&encoded)
        .unwrap_or_else(|e| panic!("{what}: its own encoding does not decode: {e}\n{value:?}"));
    assert_eq!(back, value, "{what}: decode(encode(x)) != x");
    let _ = format!("{value:?}");
    Some(value)
}

/// As [`exact`] for a type without `PartialEq`: the encoding is a fixpoint after one round.
fn fixpoint<T>(what: &str, bytes: &[u8]) -> Option<T>
where
    T: Serialize + DeserializeOwned + Debug,
{
    let value: T = decode_raft(bytes).ok()?;
    let encoded = encode_raft(&value)
        .unwrap_or_else(|e| panic!("{what}: a decoded payload does not encode: {e}\n{value:?}"));
    let back: T = decode_raft(&encoded)
        .unwrap_or_else(|e| panic!("{what}: its own encoding does not decode: {e}\n{value:?}"));
    let again = encode_raft(&back).expect("encodes");
    assert_eq!(
        again, encoded,
        "{what}: encode(decode(encode(x))) != encode(x)"
    );
    let _ = format!("{value:?}");
    Some(value)
}

pub fn run(data: &[u8]) {
    let Some((selector, bytes)) = tally_fuzz_common::split_selector(data) else {
        return;
    };
    match usize::from(selector) % PAYLOADS.len() {
        0 => {
            if let Some(request) = exact::<VoteRequest<TypeConfig>>("VoteRequest", bytes) {
                let _ = request.to_string();
            }
        }
        1 => {
            if let Some(response) = exact::<VoteResponse<TypeConfig>>("VoteResponse", bytes) {
                let _ = response.to_string();
                let _ = response.is_granted_to(&response.vote);
            }
        }
        2 => {
            if let Some(request) =
                fixpoint::<AppendEntriesRequest<TypeConfig>>("AppendEntriesRequest", bytes)
            {
                let _ = request.to_string();
                for entry in &request.entries {
                    msgpack_named("appended entry (named, as the log store writes it)", entry);
                    msgpack("appended entry", entry);
                }
            }
        }
        3 => {
            if let Some(response) =
                exact::<AppendEntriesResponse<TypeConfig>>("AppendEntriesResponse", bytes)
            {
                let _ = response.to_string();
            }
        }
        4 => {
            if let Some(request) =
                exact::<TransferLeaderRequest<TypeConfig>>("TransferLeaderRequest", bytes)
            {
                let _ = request.to_string();
            }
        }
        5 => drop(fixpoint::<TransferLeaderResponse<TypeConfig>>(
            "TransferLeaderResponse",
            bytes,
        )),
        6 => {
            if let Some((vote, meta, _digest)) =
                exact::<(Vote, SnapshotMeta, [u8; 32])>("InstallSnapshot header", bytes)
            {
                let _ = vote.to_string();
                let _ = meta.to_string();
                // The snapshot file stores the meta in the same positional encoding.
                msgpack("snapshot meta", &meta);
            }
        }
        7 => drop(exact::<SnapshotResponse<TypeConfig>>(
            "SnapshotResponse",
            bytes,
        )),
        8 => {
            if let Some(reply) = exact::<ForwardReply>("Forward reply", bytes) {
                if let Ok(reply) = &reply {
                    let _: &ProposalReply = reply;
                }
                let _ = reply.map_err(|e| e.to_string());
            }
        }
        9 => {
            if let Some(Err(error)) = exact::<Result<u64, WriteError>>("ReadIndex reply", bytes) {
                let _ = error.to_string();
            }
        }
        _ => unreachable!(),
    }
}

/// Real payloads of each kind, encoded as the node encodes them.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    use openraft::EntryPayload;
    use tally_authority::raft::types::{Proposal, TallyNode};
    use tally_fuzz_common::harness::sample_commands;
    use tally_ledger::{Decision, LedgerError, LogPosition, Outcome};

    const T0: u64 = 1_700_000_000_000;
    let index_of = |name: &str| PAYLOADS.iter().position(|p| *p == name).expect("known") as u8;
    let mut seeds = Vec::new();
    let mut add = |name: &str, payload: &str, bytes: Vec<u8>| {
        seeds.push((name.to_owned(), selected(index_of(payload), &bytes)));
    };
    let log_id = |index| openraft::testing::log_id::<TypeConfig>(2, 1, index);
    let vote = Vote::new_committed(2, 1);
    let enc = |v: &dyn erased::Encode| v.encode();
    add(
        "vote-request",
        "VoteRequest",
        enc(&VoteRequest::<TypeConfig> {
            vote: Vote::new(3, 2),
            last_log_id: Some(log_id(7)),
            leadership_transfer: true,
        }),
    );
    add(
        "vote-response",
        "VoteResponse",
        enc(&VoteResponse::<TypeConfig>::new(
            vote,
            Some(log_id(7)),
            true,
        )),
    );
    let members: std::collections::BTreeMap<u64, TallyNode> = (1..=3)
        .map(|i| {
            (
                i,
                TallyNode::new(format!("127.0.0.1:740{i}"), String::new(), String::new()),
            )
        })
        .collect();
    let membership =
        openraft::Membership::new(vec![[1, 2, 3].into()], members).expect("a valid membership");
    let entries = vec![
        openraft::type_config::alias::EntryOf::<TypeConfig> {
            log_id: log_id(8),
            payload: EntryPayload::Blank,
        },
        openraft::type_config::alias::EntryOf::<TypeConfig> {
            log_id: log_id(9),
            payload: EntryPayload::Membership(membership.clone()),
        },
        openraft::type_config::alias::EntryOf::<TypeConfig> {
            log_id: log_id(10),
            payload: EntryPayload::Normal(Proposal::commands(
                T0,
                sample_commands(T0)[..4].to_vec(),
            )),
        },
    ];
    add(
        "append-entries",
        "AppendEntriesRequest",
        enc(&AppendEntriesRequest::<TypeConfig> {
            vote,
            prev_log_id: Some(log_id(7)),
            entries,
            leader_commit: Some(log_id(7)),
        }),
    );
    add(
        "append-heartbeat",
        "AppendEntriesRequest",
        enc(&AppendEntriesRequest::<TypeConfig> {
            vote,
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        }),
    );
    for (name, response) in [
        ("success", AppendEntriesResponse::<TypeConfig>::Success),
        (
            "partial",
            AppendEntriesResponse::PartialSuccess(Some(log_id(9))),
        ),
        ("conflict", AppendEntriesResponse::Conflict),
        (
            "higher-vote",
            AppendEntriesResponse::HigherVote(Vote::new(5, 3)),
        ),
    ] {
        add(
            &format!("append-{name}"),
            "AppendEntriesResponse",
            enc(&response),
        );
    }
    add(
        "transfer-leader",
        "TransferLeaderRequest",
        enc(&TransferLeaderRequest::<TypeConfig>::new(
            vote,
            2,
            Some(log_id(10)),
        )),
    );
    add(
        "transfer-leader-ok",
        "TransferLeaderResponse",
        enc(&TransferLeaderResponse::<TypeConfig>::Ok(())),
    );
    let meta = SnapshotMeta {
        last_log_id: Some(log_id(10)),
        last_membership: openraft::StoredMembership::new(Some(log_id(9)), membership),
    };
    add(
        "snapshot-header",
        "InstallSnapshot header (Vote, SnapshotMeta, digest)",
        enc(&(vote, meta)),
    );
    add(
        "snapshot-response",
        "SnapshotResponse",
        enc(&SnapshotResponse::<TypeConfig>::new(vote)),
    );
    let reply: ForwardReply = Ok(ProposalReply {
        log_id: LogPosition { term: 2, index: 10 },
        cluster_time_ms: T0,
        results: vec![
            Ok(Decision {
                event_id: "ev".into(),
                outcome: Outcome::Incremented,
                commit_index: None,
                log_id: Some(LogPosition { term: 2, index: 10 }),
                replayed: false,
            }),
            Err(LedgerError::invalid("hold_id", "empty")),
        ],
    });
    add("forward-reply", "Forward reply", enc(&reply));
    let refused: ForwardReply = Err(WriteError::Unavailable {
        leader: Some((2, "127.0.0.1:7402".into())),
        reason: "not leader".into(),
    });
    add("forward-unavailable", "Forward reply", enc(&refused));
    add(
        "read-index",
        "ReadIndex reply",
        enc(&Ok::<u64, WriteError>(10)),
    );
    add(
        "read-index-unknown",
        "ReadIndex reply",
        enc(&Err::<u64, WriteError>(WriteError::Unknown {
            reason: "lost".into(),
        })),
    );
    seeds
}

/// `encode_raft` behind a trait object, so the seed list can hold any payload type.
mod erased {
    pub trait Encode {
        fn encode(&self) -> Vec<u8>;
    }

    impl<T: serde::Serialize> Encode for T {
        fn encode(&self) -> Vec<u8> {
            tally_api::encode_raft(self).expect("a seed encodes")
        }
    }
}
