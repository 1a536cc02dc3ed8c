//! `tally.v1.Budget` on the wire: every request message the authority decodes (prost
//! `Message::decode`) and the wire → domain conversion it runs on it (api/src/convert/), and
//! every reply message a client decodes and converts back.
//!
//! Input: a selector byte (which message, see [`MESSAGES`]) and the protobuf bytes.
//!
//! Asserts, for every message that decodes:
//! - prost: the decoded message re-encodes to bytes that decode to the same message;
//! - requests: a command that converts (`ClientCommand`/`Command::try_from`) goes back
//!   through `pb::Command` unchanged, and `validate` runs without panicking; a read's
//!   positions and filters convert and validate without panicking, and positions survive
//!   the wire;
//! - replies: a reply that converts to a domain value converts back to the same value
//!   (decisions, event lookups, hold views, pages of holds and usages, events, usage rows);
//! - errors: an `ErrorDetail` in a gRPC status reads back as the same detail, and the client's
//!   `RemoteError` is definite exactly when the detail (and the `tally-outcome` trailer the
//!   server sets from it) says so: a wrong "definite" would let a client free funds for a
//!   command that may have applied.

use std::fmt::Debug;

use prost::Message;
use tally_api::convert::error::RemoteError;
use tally_api::pb;
use tally_api::status::{error_detail, leader_hint, Definiteness};
use tally_fuzz_common::roundtrip::proto;
use tally_fuzz_common::seeds::selected;
use tally_ledger::{
    AccountKey, ClientCommand, Command, Decision, EventId, EventLookup, FamilyId, HoldFilter,
    HoldPosition, LedgerError, UsagePosition, UsageRecord,
};

/// The messages, by selector (`data[0] % MESSAGES.len()`).
pub const MESSAGES: &[&str] = &[
    "AuthorizeHoldRequest",
    "CaptureInvocationRequest",
    "CancelCapturedBeforeDispatchRequest",
    "ReverseHoldRequest",
    "ReleaseHoldRequest",
    "ReconcileHoldRequest",
    "TryIncrementRequest",
    "TryChargeCostRequest",
    "ReverseChargeCostRequest",
    "ReduceChargeCostRequest",
    "SettleChargeCostRequest",
    "ConsumeNonceRequest",
    "ResolveEventRequest",
    "BatchRequest",
    "Command",
    "GetUsageRequest",
    "ListUsagesRequest",
    "ListEventsRequest",
    "GetEventRequest",
    "GetHoldRequest",
    "ListHoldsRequest",
    "Decision",
    "BatchReply",
    "EventLookup",
    "GetHoldReply",
    "ListHoldsReply",
    "ListUsagesReply",
    "ListEventsReply",
    "GetUsageReply",
    "ErrorDetail",
];

/// Decodes `bytes` as `M`, checking prost's own round trip.
fn decode<M: Message + Default + PartialEq + Debug>(bytes: &[u8]) -> Option<M> {
    let message = M::decode(bytes).ok()?;
    let again = message.encode_to_vec();
    let back = M::decode(again.as_slice()).expect("prost: our own encoding does not decode");
    assert_eq!(back, message, "prost: decode(encode(m)) != m");
    Some(message)
}

/// A client command through `pb::Command` and back.
fn client_command(command: &ClientCommand) {
    let _ = command.validate();
    let wire = pb::Command::from(command);
    let bytes = wire.encode_to_vec();
    let back = ClientCommand::try_from(pb::Command::decode(bytes.as_slice()).expect("decodes"))
        .unwrap_or_else(|e| panic!("{command:?} does not come back from pb::Command: {e}"));
    assert_eq!(&back, command, "client command changed on the wire");
    let resolve = pb::ResolveEventRequest::from(command);
    assert_eq!(
        Command::try_from(resolve).as_ref(),
        Ok(&Command::Resolve(command.clone())),
        "resolve of {command:?}"
    );
}

/// A command (plain or resolve) through `pb::Command` and back.
fn command(command: &Command) {
    let _ = command.validate();
    let wire = pb::Command::try_from(command)
        .unwrap_or_else(|e| panic!("{command:?} came from the wire but has no wire form: {e}"));
    assert_eq!(wire.name(), Some(command.name()));
    let back = Command::try_from(wire).unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert_eq!(&back, command, "command changed on the wire");
    match command {
        Command::Apply(client) | Command::Resolve(client) => client_command(client),
        Command::ExpireHolds { .. } => panic!("ExpireHolds came from the client wire"),
    }
}

/// A request converted by its own `TryFrom<Request> for ClientCommand`.
fn request<R>(bytes: &[u8])
where
    R: Message + Default + PartialEq + Debug,
    ClientCommand: TryFrom<R>,
{
    let Some(message) = decode::<R>(bytes) else {
        return;
    };
    if let Ok(client) = ClientCommand::try_from(message) {
        client_command(&client);
    }
}

fn family(value: &str) {
    let _ = FamilyId::from(value).validate();
}

fn usage_position(position: pb::UsagePosition) {
    if let Ok(position) = UsagePosition::try_from(position) {
        let _ = position.validate();
        proto::<UsagePosition, pb::UsagePosition>("usage position", &position);
    }
}

fn hold_position(position: &HoldPosition) {
    let _ = position.validate();
    let back = HoldPosition::from(pb::HoldPosition::from(position));
    assert_eq!(&back, position, "hold position changed on the wire");
}

/// An error detail, as the server sends it inside a status and as the client reads it.
fn error(detail: pb::ErrorDetail) {
    let status = tonic::Status::from(detail.clone());
    // An all-default detail encodes to no bytes, and a status without details reads as a
    // transport error (indefinite): safe, and never sent (the server always sets a kind).
    if detail.encoded_len() > 0 {
        let read = error_detail(&status).expect("a status we built carries its detail");
        assert_eq!(read, detail, "error detail changed inside a status");
    }
    let trailer = Definiteness::from_metadata(status.metadata());
    let expected = if detail.is_definite() {
        Definiteness::Definite
    } else {
        Definiteness::Indefinite
    };
    assert_eq!(trailer, Some(expected), "tally-outcome trailer");
    let _ = leader_hint(&status);
    let remote = RemoteError::from(&status);
    if let Ok(typed) = RemoteError::try_from(detail.clone()) {
        assert_eq!(remote, typed, "status and detail read differently");
        assert_eq!(
            typed.is_definite(),
            detail.is_definite(),
            "client and trailer disagree on definiteness of {detail:?}"
        );
    } else {
        assert!(
            !remote.is_definite(),
            "an unreadable detail read as definite"
        );
    }
    if let Ok(ledger) = LedgerError::try_from(detail) {
        proto::<LedgerError, pb::ErrorDetail>("ledger error", &ledger);
    }
}

pub fn run(data: &[u8]) {
    let Some((selector, bytes)) = tally_fuzz_common::split_selector(data) else {
        return;
    };
    match usize::from(selector) % MESSAGES.len() {
        0 => request::<pb::AuthorizeHoldRequest>(bytes),
        1 => request::<pb::CaptureInvocationRequest>(bytes),
        2 => request::<pb::CancelCapturedBeforeDispatchRequest>(bytes),
        3 => request::<pb::ReverseHoldRequest>(bytes),
        4 => request::<pb::ReleaseHoldRequest>(bytes),
        5 => request::<pb::ReconcileHoldRequest>(bytes),
        6 => request::<pb::TryIncrementRequest>(bytes),
        7 => request::<pb::TryChargeCostRequest>(bytes),
        8 => request::<pb::ReverseChargeCostRequest>(bytes),
        9 => request::<pb::ReduceChargeCostRequest>(bytes),
        10 => request::<pb::SettleChargeCostRequest>(bytes),
        11 => request::<pb::ConsumeNonceRequest>(bytes),
        12 => {
            if let Some(message) = decode::<pb::ResolveEventRequest>(bytes) {
                if let Ok(resolve) = Command::try_from(message) {
                    assert!(matches!(resolve, Command::Resolve(_)), "{resolve:?}");
                    command(&resolve);
                }
            }
        }
        13 => {
            if let Some(batch) = decode::<pb::BatchRequest>(bytes) {
                let count = batch.commands.len();
                let converted = batch.into_commands();
                assert_eq!(converted.len(), count, "a batch lost commands");
                for converted in converted.iter().flatten() {
                    command(converted);
                }
            }
        }
        14 => {
            if let Some(wire) = decode::<pb::Command>(bytes) {
                let _ = wire.header();
                let _ = wire.name();
                if let Ok(converted) = Command::try_from(wire.clone()) {
                    command(&converted);
                }
                if let Ok(client) = ClientCommand::try_from(wire) {
                    client_command(&client);
                }
            }
        }
        15 => {
            if let Some(request) = decode::<pb::GetUsageRequest>(bytes) {
                family(&request.family_id);
                if let Some(account) = request.account {
                    let key = AccountKey::from(account);
                    let _ = key.validate();
                    assert_eq!(AccountKey::from(pb::AccountKey::from(&key)), key);
                }
            }
        }
        16 => {
            if let Some(request) = decode::<pb::ListUsagesRequest>(bytes) {
                if let Some(id) = &request.family_id {
                    family(id);
                }
                if let Some(after) = request.after {
                    usage_position(after);
                }
            }
        }
        17 => {
            if let Some(request) = decode::<pb::ListEventsRequest>(bytes) {
                family(&request.family_id);
            }
        }
        18 => {
            if let Some(request) = decode::<pb::GetEventRequest>(bytes) {
                family(&request.family_id);
                let _ = EventId::from(request.event_id.as_str()).validate();
            }
        }
        19 => {
            if let Some(request) = decode::<pb::GetHoldRequest>(bytes) {
                family(&request.family_id);
            }
        }
        20 => {
            if let Some(request) = decode::<pb::ListHoldsRequest>(bytes) {
                if let Ok(filter) = HoldFilter::try_from(&request) {
                    if let Some(after) = &filter.after {
                        hold_position(after);
                    }
                }
            }
        }
        21 => {
            if let Some(wire) = decode::<pb::Decision>(bytes) {
                if let Ok(decision) = Decision::try_from(wire) {
                    proto::<Decision, pb::Decision>("decision", &decision);
                }
            }
        }
        22 => {
            if let Some(reply) = decode::<pb::BatchReply>(bytes) {
                for result in reply.results {
                    match result.result {
                        Some(pb::batch_result::Result::Decision(wire)) => {
                            if let Ok(decision) = Decision::try_from(wire) {
                                proto::<Decision, pb::Decision>("batch decision", &decision);
                            }
                        }
                        Some(pb::batch_result::Result::Error(detail)) => error(detail),
                        None => {}
                    }
                }
            }
        }
        23 => {
            if let Some(wire) = decode::<pb::EventLookup>(bytes) {
                if let Ok(lookup) = EventLookup::try_from(wire) {
                    proto::<EventLookup, pb::EventLookup>("event lookup", &lookup);
                }
            }
        }
        24 => {
            if let Some(reply) = decode::<pb::GetHoldReply>(bytes) {
                let family_id = reply
                    .hold
                    .as_ref()
                    .and_then(|h| match &h.view {
                        Some(pb::hold_view::View::Live(hold)) => Some(hold.family_id.clone()),
                        _ => None,
                    })
                    .unwrap_or_default();
                if let Ok(view) = reply.into_view() {
                    let back =
                        pb::GetHoldReply::from_view(&family_id.as_str().into(), view.as_ref())
                            .into_view()
                            .unwrap_or_else(|e| panic!("hold view {view:?}: {e}"));
                    assert_eq!(back, view, "hold view changed on the wire");
                }
            }
        }
        25 => {
            if let Some(reply) = decode::<pb::ListHoldsReply>(bytes) {
                if let Ok(page) = reply.into_page() {
                    if let Some(next) = &page.next {
                        hold_position(next);
                    }
                    let back = pb::ListHoldsReply::from_holds(&page.holds, usize::MAX)
                        .into_page()
                        .unwrap_or_else(|e| panic!("holds page: {e}"));
                    assert_eq!(back.holds, page.holds, "holds changed on the wire");
                    assert_eq!(back.next, None);
                }
            }
        }
        26 => {
            if let Some(reply) = decode::<pb::ListUsagesReply>(bytes) {
                if let Ok(page) = reply.into_page() {
                    if let Some(next) = &page.next {
                        let _ = next.validate();
                        proto::<UsagePosition, pb::UsagePosition>("usage position", next);
                    }
                    let back = pb::ListUsagesReply::from_rows(&page.rows, usize::MAX)
                        .into_page()
                        .unwrap_or_else(|e| panic!("usage page: {e}"));
                    assert_eq!(back.rows, page.rows, "usages changed on the wire");
                }
            }
        }
        27 => {
            if let Some(reply) = decode::<pb::ListEventsReply>(bytes) {
                if let Ok(records) = reply.into_records() {
                    let back = pb::ListEventsReply::from_records(&records)
                        .into_records()
                        .unwrap_or_else(|e| panic!("events: {e}"));
                    assert_eq!(back, records, "events changed on the wire");
                }
            }
        }
        28 => {
            if let Some(reply) = decode::<pb::GetUsageReply>(bytes) {
                if let Some(wire) = reply.usage {
                    let family_id: FamilyId = wire.family_id.as_str().into();
                    if let Ok(record) = UsageRecord::try_from(wire) {
                        let back =
                            UsageRecord::try_from(pb::UsageRecord::of_family(&family_id, &record))
                                .unwrap_or_else(|e| panic!("usage row: {e}"));
                        assert_eq!(back, record, "usage row changed on the wire");
                    }
                }
            }
        }
        29 => {
            if let Some(detail) = decode::<pb::ErrorDetail>(bytes) {
                error(detail);
            }
        }
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

/// Every command kind as its own request and in a batch, every reply kind from a real run
/// of the sample commands, and each error kind.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    use tally_fuzz_common::harness::{sample_commands, Harness};
    use tally_ledger::limits::MAX_LIST_LIMIT;
    use tally_ledger::{Family, PreconditionCode};

    const T0: u64 = 1_700_000_000_000;
    let mut seeds = Vec::new();
    let mut add = |name: &str, message: &str, bytes: Vec<u8>| {
        seeds.push((name.to_owned(), selected(index_of(message), &bytes)));
    };
    let commands = sample_commands(T0);
    let mut wires = Vec::new();
    for (i, cmd) in commands.iter().enumerate() {
        let Ok(wire) = pb::Command::try_from(cmd) else {
            continue;
        };
        add(
            &format!("command-{i:02}-{}", cmd.name()),
            "Command",
            wire.encode_to_vec(),
        );
        use pb::command::Command as Op;
        let (message, bytes) = match wire.command.clone().expect("set") {
            Op::AuthorizeHold(r) => ("AuthorizeHoldRequest", r.encode_to_vec()),
            Op::CaptureInvocation(r) => ("CaptureInvocationRequest", r.encode_to_vec()),
            Op::CancelCapturedBeforeDispatch(r) => {
                ("CancelCapturedBeforeDispatchRequest", r.encode_to_vec())
            }
            Op::ReverseHold(r) => ("ReverseHoldRequest", r.encode_to_vec()),
            Op::ReleaseHold(r) => ("ReleaseHoldRequest", r.encode_to_vec()),
            Op::ReconcileHold(r) => ("ReconcileHoldRequest", r.encode_to_vec()),
            Op::TryIncrement(r) => ("TryIncrementRequest", r.encode_to_vec()),
            Op::TryChargeCost(r) => ("TryChargeCostRequest", r.encode_to_vec()),
            Op::ReverseChargeCost(r) => ("ReverseChargeCostRequest", r.encode_to_vec()),
            Op::ReduceChargeCost(r) => ("ReduceChargeCostRequest", r.encode_to_vec()),
            Op::SettleChargeCost(r) => ("SettleChargeCostRequest", r.encode_to_vec()),
            Op::ConsumeNonce(r) => ("ConsumeNonceRequest", r.encode_to_vec()),
            Op::ResolveEvent(r) => ("ResolveEventRequest", r.encode_to_vec()),
        };
        add(&format!("request-{i:02}-{}", cmd.name()), message, bytes);
        wires.push(wire);
    }
    add(
        "batch",
        "BatchRequest",
        pb::BatchRequest { commands: wires }.encode_to_vec(),
    );
    // Replies from a real run.
    let mut family = Family::new("fam".into());
    let mut harness = Harness::new();
    let mut results = Vec::new();
    for (i, cmd) in commands.iter().enumerate() {
        let (log_id, now_ms) = harness.enter(T0 + 1_000 * i as u64, None);
        let ctx = tally_ledger::ApplyCtx {
            log_id,
            command_position: 0,
            now_ms,
            params: harness.params(),
            no_space: false,
        };
        results.push((cmd.clone(), family.apply(cmd, &ctx)));
    }
    let mut batch = Vec::new();
    for (i, (cmd, result)) in results.iter().enumerate() {
        match result {
            Ok(decision) => {
                let wire = pb::Decision::from(decision);
                add(
                    &format!("decision-{i:02}-{}", cmd.name()),
                    "Decision",
                    wire.encode_to_vec(),
                );
                batch.push(pb::BatchResult {
                    result: Some(pb::batch_result::Result::Decision(wire)),
                });
                let lookup = family.get_event(&decision.event_id);
                add(
                    &format!("event-lookup-{i:02}"),
                    "EventLookup",
                    pb::EventLookup::from(&lookup).encode_to_vec(),
                );
            }
            Err(error) => {
                let detail = pb::ErrorDetail::from(error);
                add(
                    &format!("error-{i:02}"),
                    "ErrorDetail",
                    detail.encode_to_vec(),
                );
                batch.push(pb::BatchResult {
                    result: Some(pb::batch_result::Result::Error(detail)),
                });
            }
        }
    }
    add(
        "batch-reply",
        "BatchReply",
        pb::BatchReply { results: batch }.encode_to_vec(),
    );
    let family_id: FamilyId = "fam".into();
    let holds: Vec<_> = family
        .list_holds(&HoldFilter::default(), MAX_LIST_LIMIT)
        .into_iter()
        .map(|h| (family_id.clone(), h))
        .collect();
    add(
        "holds-page",
        "ListHoldsReply",
        pb::ListHoldsReply::from_holds(&holds, 1).encode_to_vec(),
    );
    for hold_id in ["h1", "h2"] {
        let view = family.get_hold(&hold_id.into());
        add(
            &format!("hold-view-{hold_id}"),
            "GetHoldReply",
            pb::GetHoldReply::from_view(&family_id, view.as_ref()).encode_to_vec(),
        );
    }
    let usages: Vec<_> = family
        .list_usages(None, None, MAX_LIST_LIMIT)
        .into_iter()
        .map(|r| (family_id.clone(), r))
        .collect();
    add(
        "usages-page",
        "ListUsagesReply",
        pb::ListUsagesReply::from_rows(&usages, 1).encode_to_vec(),
    );
    if let Some((_, row)) = usages.first() {
        add(
            "usage",
            "GetUsageReply",
            pb::GetUsageReply {
                usage: Some(pb::UsageRecord::of_family(&family_id, row)),
            }
            .encode_to_vec(),
        );
        add(
            "list-usages-after",
            "ListUsagesRequest",
            pb::ListUsagesRequest {
                family_id: Some("fam".into()),
                after: Some((&UsagePosition::of(&family_id, row)).into()),
                limit: 10,
                ..Default::default()
            }
            .encode_to_vec(),
        );
    }
    let events = family.list_events(None, None, None, MAX_LIST_LIMIT);
    add(
        "events",
        "ListEventsReply",
        pb::ListEventsReply::from_records(&events).encode_to_vec(),
    );
    add(
        "list-holds-filter",
        "ListHoldsRequest",
        pb::ListHoldsRequest {
            family_id: Some("fam".into()),
            state: Some(1),
            created_before_ms: Some(T0 + 5_000),
            limit: 5,
            with_remaining_exposure: true,
            after: holds.first().map(|(f, h)| (&HoldPosition::of(f, h)).into()),
            ..Default::default()
        }
        .encode_to_vec(),
    );
    add(
        "get-usage",
        "GetUsageRequest",
        pb::GetUsageRequest {
            family_id: "fam".into(),
            account: Some((&AccountKey::new("cap", 0)).into()),
            consistency: 1,
        }
        .encode_to_vec(),
    );
    add(
        "get-event",
        "GetEventRequest",
        pb::GetEventRequest {
            family_id: "fam".into(),
            event_id: "ev-auth".into(),
            consistency: 0,
        }
        .encode_to_vec(),
    );
    add(
        "get-hold",
        "GetHoldRequest",
        pb::GetHoldRequest {
            family_id: "fam".into(),
            hold_id: "h1".into(),
            consistency: 0,
        }
        .encode_to_vec(),
    );
    add(
        "list-events",
        "ListEventsRequest",
        pb::ListEventsRequest {
            family_id: "fam".into(),
            capability_id: Some("cap".into()),
            grant_index: Some(0),
            after_commit_index: Some(1),
            limit: 3,
            consistency: 0,
        }
        .encode_to_vec(),
    );
    // Every error kind number (and one past the last), as the server would send it.
    for kind in 0..=12 {
        let detail = pb::ErrorDetail {
            kind,
            reason: "unknown_hold".into(),
            message: format!("kind {kind}"),
            event_id: "ev-1".into(),
            leader_id: Some(2),
            leader_address: "10.0.0.2:7401".into(),
            ..Default::default()
        };
        add(
            &format!("error-kind-{kind:02}"),
            "ErrorDetail",
            detail.encode_to_vec(),
        );
    }
    add(
        "error-precondition",
        "ErrorDetail",
        pb::ErrorDetail::from(LedgerError::FailedPrecondition {
            code: PreconditionCode::UnknownHold,
            message: "no hold".into(),
        })
        .encode_to_vec(),
    );
    seeds
}
