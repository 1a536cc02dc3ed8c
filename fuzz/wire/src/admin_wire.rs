//! `tally.v1.Admin` on the wire: every request and reply message (prost `Message::decode`)
//! and the wire → domain conversions api/src/convert/params.rs defines for them.
//!
//! Input: a selector byte (which message, see [`MESSAGES`]) and the protobuf bytes.
//!
//! Asserts: prost's round trip for every message; a `SetParamsRequest` converts to a
//! `ParamsChange` that validates without panicking, comes back from the wire unchanged, and,
//! when valid, applies to the parameters in force without panicking and yields parameters
//! inside the validated ranges for the fields it names; `ClusterParams` survive the wire.
//!
//! Not reachable from here: the membership conversions (`member_node` in
//! authority/src/service/admin.rs is private) and the failpoint spec parser.

use std::fmt::Debug;

use prost::Message;
use tally_api::pb;
use tally_fuzz_common::seeds::selected;
use tally_ledger::{ClusterParams, ParamsChange};

pub const MESSAGES: &[&str] = &[
    "InitializeRequest",
    "AddLearnerRequest",
    "ChangeMembershipRequest",
    "TransferLeaderRequest",
    "TriggerSnapshotRequest",
    "SetParamsRequest",
    "StatusRequest",
    "ClockProbeRequest",
    "StateDigestRequest",
    "SetFailpointsRequest",
    "AdminReply",
    "SetParamsReply",
    "StatusReply",
    "ClockProbeReply",
    "StateDigestReply",
];

fn decode<M: Message + Default + PartialEq + Debug>(bytes: &[u8]) -> Option<M> {
    let message = M::decode(bytes).ok()?;
    let again = message.encode_to_vec();
    let back = M::decode(again.as_slice()).expect("prost: our own encoding does not decode");
    assert_eq!(back, message, "prost: decode(encode(m)) != m");
    Some(message)
}

/// The parameters a node holds go out as they are: built from any wire values (the rules
/// raised as the log raises them), their reply carries the same fields.
fn params(wire: pb::ClusterParams) {
    let params = ClusterParams {
        retention_ms: wire.retention_ms,
        max_clock_step_ms: wire.max_clock_step_ms,
        ..ClusterParams::default()
    }
    .at_rules(wire.rules_version);
    let back = pb::ClusterParams::from(params);
    assert_eq!(
        (
            back.retention_ms,
            back.max_clock_step_ms,
            back.rules_version
        ),
        (
            wire.retention_ms,
            wire.max_clock_step_ms,
            wire.rules_version.max(tally_ledger::LEGACY_RULES)
        )
    );
}

fn set_params(request: &pb::SetParamsRequest) {
    let change = ParamsChange::from(request);
    assert_eq!(
        ParamsChange::from(&pb::SetParamsRequest::from(&change)),
        change,
        "params change changed on the wire"
    );
    if change.validate().is_ok() {
        let current = ClusterParams::default();
        let next = change.apply_to(current);
        if change.retention_ms.is_none() {
            assert_eq!(next.retention_ms, current.retention_ms);
        }
        if change.max_clock_step_ms.is_none() {
            assert_eq!(next.max_clock_step_ms, current.max_clock_step_ms);
        } else {
            assert!(
                tally_ledger::cluster_time::MAX_CLOCK_STEP_MS.contains(&next.max_clock_step_ms),
                "a valid change set max_clock_step_ms to {}",
                next.max_clock_step_ms
            );
        }
    }
}

pub fn run(data: &[u8]) {
    let Some((selector, bytes)) = tally_fuzz_common::split_selector(data) else {
        return;
    };
    match usize::from(selector) % MESSAGES.len() {
        0 => drop(decode::<pb::InitializeRequest>(bytes)),
        1 => drop(decode::<pb::AddLearnerRequest>(bytes)),
        2 => drop(decode::<pb::ChangeMembershipRequest>(bytes)),
        3 => drop(decode::<pb::TransferLeaderRequest>(bytes)),
        4 => drop(decode::<pb::TriggerSnapshotRequest>(bytes)),
        5 => {
            if let Some(request) = decode::<pb::SetParamsRequest>(bytes) {
                set_params(&request);
            }
        }
        6 => drop(decode::<pb::StatusRequest>(bytes)),
        7 => drop(decode::<pb::ClockProbeRequest>(bytes)),
        8 => drop(decode::<pb::StateDigestRequest>(bytes)),
        9 => drop(decode::<pb::SetFailpointsRequest>(bytes)),
        10 => drop(decode::<pb::AdminReply>(bytes)),
        11 => {
            if let Some(reply) = decode::<pb::SetParamsReply>(bytes) {
                if let Some(wire) = reply.params {
                    params(wire);
                }
            }
        }
        12 => {
            if let Some(reply) = decode::<pb::StatusReply>(bytes) {
                if let Some(wire) = reply.params {
                    params(wire);
                }
            }
        }
        13 => drop(decode::<pb::ClockProbeReply>(bytes)),
        14 => drop(decode::<pb::StateDigestReply>(bytes)),
        _ => unreachable!(),
    }
}

fn index_of(name: &str) -> u8 {
    MESSAGES
        .iter()
        .position(|m| *m == name)
        .map(|i| i as u8)
        .unwrap_or_else(|| panic!("no message {name}"))
}

pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let member = |i: u64| pb::MemberAddress {
        address: format!("127.0.0.1:740{i}"),
        peer_address: format!("127.0.0.1:760{i}"),
        region: "eu-west".into(),
    };
    let mut seeds = Vec::new();
    let mut add = |name: &str, message: &str, bytes: Vec<u8>| {
        seeds.push((name.to_owned(), selected(index_of(message), &bytes)));
    };
    add(
        "initialize",
        "InitializeRequest",
        pb::InitializeRequest {
            members: (1..=3).map(|i| (i, format!("127.0.0.1:740{i}"))).collect(),
            nodes: (1..=3).map(|i| (i, member(i))).collect(),
        }
        .encode_to_vec(),
    );
    add(
        "add-learner",
        "AddLearnerRequest",
        pb::AddLearnerRequest {
            id: 4,
            address: "127.0.0.1:7404".into(),
            blocking: true,
            peer_address: "127.0.0.1:7604".into(),
            region: "eu-west".into(),
        }
        .encode_to_vec(),
    );
    add(
        "change-membership",
        "ChangeMembershipRequest",
        pb::ChangeMembershipRequest {
            voters: vec![1, 2, 4],
            retain: true,
        }
        .encode_to_vec(),
    );
    add(
        "transfer-leader",
        "TransferLeaderRequest",
        pb::TransferLeaderRequest { to: 2 }.encode_to_vec(),
    );
    for (name, change) in [
        ("both", (Some(3_600_000), Some(5_000))),
        ("retention", (Some(60_000), None)),
        ("step", (None, Some(2_000))),
        ("empty", (None, None)),
    ] {
        add(
            &format!("set-params-{name}"),
            "SetParamsRequest",
            pb::SetParamsRequest {
                retention_ms: change.0,
                max_clock_step_ms: change.1,
                preferred_leader_regions: None,
            }
            .encode_to_vec(),
        );
    }
    add(
        "set-params-reply",
        "SetParamsReply",
        pb::SetParamsReply {
            params: Some(ClusterParams::default().into()),
            log_index: 9,
        }
        .encode_to_vec(),
    );
    add(
        "status-reply",
        "StatusReply",
        pb::StatusReply {
            node_id: 1,
            role: 1,
            term: 3,
            leader_id: Some(1),
            leader_address: "127.0.0.1:7401".into(),
            last_log_index: Some(10),
            committed_index: Some(10),
            applied_index: Some(10),
            snapshot_index: Some(5),
            members: vec![pb::Member {
                id: 1,
                address: "127.0.0.1:7401".into(),
                voter: true,
                matched_index: Some(10),
                peer_address: "127.0.0.1:7601".into(),
                region: "eu-west".into(),
            }],
            alarms: Vec::new(),
            cluster_time_ms: 1_700_000_000_000,
            healthy: true,
            load_shedding: None,
            clock_offset_ms: -3,
            cluster_id: "tally-dev".into(),
            params: Some(ClusterParams::default().into()),
            leader_in_preferred_region: Some(true),
            rules_known: 2,
            cluster_time_lag_ms: 4_000,
            writes_wait_for_cluster_time: false,
            memory: Some(pb::MemoryUse {
                budget_bytes: 1 << 30,
                families_share_bytes: 1 << 29,
                families_bytes: 300 << 20,
                filter_bytes: 20 << 20,
                store_memory_bytes: 8 << 20,
                families_in_memory: 1_000,
                families_on_disk: 20_000,
                process_resident_bytes: Some(1_500 << 20),
                heap_in_use_bytes: Some(1_200 << 20),
            }),
        }
        .encode_to_vec(),
    );
    add(
        "clock-probe",
        "ClockProbeRequest",
        pb::ClockProbeRequest {
            sent_at_ms: 1_700_000_000_000,
        }
        .encode_to_vec(),
    );
    add(
        "state-digest",
        "StateDigestReply",
        pb::StateDigestReply {
            node_id: 1,
            applied_index: 10,
            digest: vec![7; 32].into(),
        }
        .encode_to_vec(),
    );
    add(
        "admin-reply",
        "AdminReply",
        pb::AdminReply {
            log_index: Some(3),
            message: "ok".into(),
        }
        .encode_to_vec(),
    );
    add(
        "failpoints",
        "SetFailpointsRequest",
        pb::SetFailpointsRequest {
            spec: "apply_before=abort".into(),
        }
        .encode_to_vec(),
    );
    seeds
}
