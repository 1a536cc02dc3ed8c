//! What a node reads back from its Raft log and applies: `Proposal` (a normal entry's
//! payload, authority/src/raft/types.rs), whole openraft entries as the log store keeps them
//! (raft-store/src/codec.rs: `rmp_serde::to_vec_named` / `from_slice`), and the vote and log
//! ids the store keeps beside them.
//!
//! Input: a selector byte, then a stream of msgpack values:
//! - `0`: proposals, one per log entry (named or positional encoding, as rmp-serde reads both);
//! - `1`: openraft entries (`EntryOf<TypeConfig>`) with their own log ids;
//! - `2`: one vote, then one log id.
//!
//! Asserts: every decoded value re-encodes, named and positional, to bytes that decode to
//! the same value; then, as the state machine does (authority/src/raft/state_machine.rs), an
//! entry of another proposal version stops the replay, and the rest go through the real
//! `RouterState::enter` (log order, clock clamping, parameter changes) and the apply harness
//! (`tally_fuzz_common::harness`): two replicas, the ledger's invariants after every
//! command, identical answers and snapshots, and answers and reads that survive the wire.

use openraft::type_config::alias::{EntryOf, VoteOf};
use openraft::EntryPayload as RaftPayload;
use tally_authority::families::{EntryInput, EntryPayload, RouterState};
use tally_authority::raft::types::{
    log_position, LogId, Membership, Proposal, ProposalBody, TallyNode, TypeConfig,
    PROPOSAL_VERSION,
};
use tally_fuzz_common::harness::{sample_commands, Harness};
use tally_fuzz_common::roundtrip::{msgpack, msgpack_named};
use tally_fuzz_common::seeds::selected;
use tally_ledger::limits::MAX_LOG_INDEX;
use tally_ledger::{LogPosition, ParamsChange};

type Entry = EntryOf<TypeConfig>;
type Vote = VoteOf<TypeConfig>;

/// Entries read from one input at most.
const MAX_ENTRIES: usize = 64;

/// The router's side of the replay: its real state plus the two-replica apply harness.
struct Replay {
    state: RouterState,
    harness: Harness,
}

impl Replay {
    fn new() -> Self {
        Self {
            state: RouterState::default(),
            harness: Harness::new(),
        }
    }

    /// Applies one entry; `false` when the router would stop (log order broken).
    fn apply(&mut self, log_id: LogPosition, stamped_ms: u64, payload: EntryPayload) -> bool {
        let input = EntryInput {
            log_id,
            stamped_ms,
            payload,
        };
        let before = self.state.clone();
        let Ok(now_ms) = self.state.enter(&input) else {
            assert_eq!(
                self.state, before,
                "a refused entry changed the router state"
            );
            return false;
        };
        assert_eq!(self.state.last_applied, Some(log_id));
        assert!(now_ms >= before.cluster_time_ms, "cluster time went back");
        assert!(
            now_ms - before.cluster_time_ms <= before.params.max_clock_step_ms
                || before.cluster_time_ms == 0,
            "cluster time stepped {} ms with max step {}",
            now_ms - before.cluster_time_ms,
            before.params.max_clock_step_ms
        );
        if let EntryPayload::Commands(commands) = &input.payload {
            self.harness
                .apply_commands(log_id, now_ms, self.state.params, commands);
        }
        true
    }
}

/// One decoded proposal: round trips, then applied unless its version stops the replay.
fn proposal(replay: &mut Replay, log_id: LogPosition, proposal: Proposal) -> bool {
    msgpack_named("proposal (named, as logged)", &proposal);
    msgpack("proposal (positional)", &proposal);
    let _ = proposal.to_string();
    if proposal.version != PROPOSAL_VERSION {
        return false;
    }
    // An entry applies what it carries (old logs replay unchanged); `validate` only gates
    // proposing. It must not panic either way.
    let _ = change_of(&proposal.body).validate();
    let stamped_ms = proposal.stamped_ms;
    replay.apply(log_id, stamped_ms, proposal.body.into_payload())
}

fn change_of(body: &ProposalBody) -> ParamsChange {
    match body {
        ProposalBody::ChangeParams(change) => change.clone(),
        ProposalBody::SetParams(params) => ParamsChange::from(*params),
        ProposalBody::Commands(_) | ProposalBody::Alarm(_) | ProposalBody::RaiseRules(_) => {
            ParamsChange::default()
        }
    }
}

fn membership_checks(log_id: &LogId, membership: &openraft::Membership<u64, TallyNode>) {
    let stored = Membership::new(Some(log_id.clone()), membership.clone());
    msgpack_named("stored membership", &stored);
    for (_, node) in membership.nodes() {
        let _ = node.peer_address();
        let _ = node.to_string();
    }
    let _ = membership.voter_ids().count();
}

pub fn run(data: &[u8]) {
    let Some((selector, mut rest)) = tally_fuzz_common::split_selector(data) else {
        return;
    };
    match selector % 3 {
        0 => {
            let mut replay = Replay::new();
            for index in 1..=MAX_ENTRIES as u64 {
                let Ok(decoded) = rmp_serde::from_read::<_, Proposal>(&mut rest) else {
                    break;
                };
                if !proposal(&mut replay, LogPosition { term: 1, index }, decoded) {
                    break;
                }
            }
            replay.harness.finish();
        }
        1 => {
            let mut replay = Replay::new();
            for _ in 0..MAX_ENTRIES {
                let Ok(entry) = rmp_serde::from_read::<_, Entry>(&mut rest) else {
                    break;
                };
                msgpack_named("log entry (named, as the log store writes it)", &entry);
                msgpack("log entry (positional, as in an append)", &entry);
                let log_id = log_position(&entry.log_id);
                if log_id.index > MAX_LOG_INDEX {
                    // The budget commit index has 44 bits of log index; a log this long is
                    // out of reach (see the report).
                    break;
                }
                let go_on = match entry.payload {
                    RaftPayload::Blank => replay.apply(log_id, 0, EntryPayload::Blank),
                    RaftPayload::Membership(membership) => {
                        membership_checks(&entry.log_id, &membership);
                        replay.apply(log_id, 0, EntryPayload::Blank)
                    }
                    RaftPayload::Normal(decoded) => proposal(&mut replay, log_id, decoded),
                };
                if !go_on {
                    break;
                }
            }
            replay.harness.finish();
        }
        _ => {
            if let Ok(vote) = rmp_serde::from_read::<_, Vote>(&mut rest) {
                msgpack_named("vote (as stored)", &vote);
                msgpack("vote", &vote);
            }
            if let Ok(log_id) = rmp_serde::from_read::<_, LogId>(&mut rest) {
                msgpack_named("log id (as stored)", &log_id);
                msgpack("log id", &log_id);
            }
        }
    }
}

/// A realistic log: the sample commands in entries of three, a parameter change, the
/// whole-struct `SetParams` entry old nodes wrote, and the same as openraft entries with a
/// blank and a membership entry first.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    const T0: u64 = 1_700_000_000_000;
    let commands = sample_commands(T0);
    let mut proposals: Vec<Proposal> = commands
        .chunks(3)
        .enumerate()
        .map(|(i, chunk)| Proposal::commands(T0 + 1_000 * i as u64, chunk.to_vec()))
        .collect();
    // The rules raised early, so the commands after it apply under the newest rules.
    proposals.insert(
        1,
        Proposal::raise_rules(T0 + 500, tally_ledger::CURRENT_RULES),
    );
    proposals.insert(
        2,
        Proposal::change_params(
            T0 + 1_500,
            ParamsChange {
                retention_ms: Some(60_000),
                max_clock_step_ms: Some(2_000),
                preferred_leader_regions: Some(vec!["eu-west".to_owned()]),
            },
        ),
    );
    proposals.push(Proposal {
        version: PROPOSAL_VERSION,
        stamped_ms: T0 + 20_000,
        body: ProposalBody::SetParams(tally_ledger::ClusterParams {
            retention_ms: 3_600_000,
            max_clock_step_ms: 5_000,
            rules_version: tally_ledger::LEGACY_RULES,
            keyed_retention_ms: None,
        }),
    });
    let named = |p: &Proposal| rmp_serde::to_vec_named(p).expect("encodes");
    let mut seeds = vec![
        (
            "proposals-named".to_owned(),
            selected(0, &proposals.iter().flat_map(named).collect::<Vec<_>>()),
        ),
        (
            "proposals-positional".to_owned(),
            selected(
                0,
                &proposals
                    .iter()
                    .flat_map(|p| rmp_serde::to_vec(p).expect("encodes"))
                    .collect::<Vec<_>>(),
            ),
        ),
    ];
    for (i, proposal) in proposals.iter().enumerate() {
        seeds.push((format!("proposal-{i:02}"), selected(0, &named(proposal))));
    }
    let log_id = |index| openraft::testing::log_id::<TypeConfig>(1, 1, index);
    let members: std::collections::BTreeMap<u64, TallyNode> = (1..=3)
        .map(|i| {
            (
                i,
                TallyNode::new(
                    format!("127.0.0.1:740{i}"),
                    format!("127.0.0.1:760{i}"),
                    "eu-west".into(),
                ),
            )
        })
        .collect();
    let membership =
        openraft::Membership::new(vec![[1, 2, 3].into()], members).expect("a valid membership");
    let mut entries: Vec<Entry> = vec![
        Entry {
            log_id: log_id(1),
            payload: RaftPayload::Blank,
        },
        Entry {
            log_id: log_id(2),
            payload: RaftPayload::Membership(membership),
        },
    ];
    for (i, proposal) in proposals.iter().enumerate() {
        entries.push(Entry {
            log_id: log_id(3 + i as u64),
            payload: RaftPayload::Normal(proposal.clone()),
        });
    }
    seeds.push((
        "entries-named".to_owned(),
        selected(
            1,
            &entries
                .iter()
                .flat_map(|e| rmp_serde::to_vec_named(e).expect("encodes"))
                .collect::<Vec<_>>(),
        ),
    ));
    let vote = Vote::new_committed(3, 1);
    let mut stored = rmp_serde::to_vec_named(&vote).expect("encodes");
    stored.extend(rmp_serde::to_vec_named(&log_id(9)).expect("encodes"));
    seeds.push(("vote-and-log-id".to_owned(), selected(2, &stored)));
    seeds
}
