//! Round-trip and malformed-input tests of the conversions: every command kind, outcome
//! variant, read type and error goes domain → wire → bytes → wire → domain unchanged.

use proptest::prelude::*;
use prost::Message;
use tally_ledger::hold::HoldTransition;
use tally_ledger::{
    Account, AccountImage, AccountKey, AncestorAccount, ArchivedHold, BudgetCommitIndex,
    ClientCommand, Command, CommandHeader, ConflictReason, Decision, DenyReason, DenyRule,
    EventKind, EventLookup, EventRecord, FamilyId, GrantLimits, Hold, HoldFilter, HoldPosition,
    HoldStates, HoldView, InvocationState, LedgerError, LegacyUnheld, LogPosition, MonetaryState,
    Operation, Outcome, PreconditionCode, Resolution, UsagePosition, UsageRecord,
};

use super::error::{precondition_code, precondition_index, PRECONDITION_CODES_FOR_TESTS};
use crate::convert::error::RemoteError;
use crate::error::WireError;
use crate::pb;
use crate::status::{error_detail, leader_hint, Definiteness};

/// domain → wire → bytes → wire → domain.
fn through_bytes<D, W>(value: &D) -> D
where
    for<'a> W: From<&'a D>,
    W: Message + Default,
    D: TryFrom<W, Error = WireError>,
{
    let bytes = W::from(value).encode_to_vec();
    let wire = W::decode(bytes.as_slice()).expect("decodes");
    D::try_from(wire).expect("converts back")
}

fn header(event_id: &str) -> CommandHeader {
    CommandHeader {
        family_id: "fam".into(),
        capability_id: "cap".into(),
        grant_index: 3,
        event_id: event_id.into(),
        not_after_ms: 1_700_000_000_000,
    }
}

fn monetary() -> GrantLimits {
    GrantLimits::monetary(Some(5), Some(100), Some(1_000), "USD")
}

fn operations() -> Vec<Operation> {
    vec![
        Operation::AuthorizeHold {
            hold_id: "h1".into(),
            requested_exposure_units: 40,
            limits: monetary(),
            ancestors: vec![
                AncestorAccount {
                    account: AccountKey::new("parent", 0),
                    limits: GrantLimits::monetary(None, None, Some(5_000), "USD"),
                },
                AncestorAccount {
                    account: AccountKey::new("root", 1),
                    limits: GrantLimits::default(),
                },
            ],
            hold_timeout_ms: Some(30_000),
        },
        Operation::AuthorizeHold {
            hold_id: "h2".into(),
            requested_exposure_units: 0,
            limits: GrantLimits::default(),
            ancestors: vec![],
            hold_timeout_ms: None,
        },
        Operation::CaptureInvocation {
            hold_id: "h1".into(),
            attempt_id: "att".into(),
        },
        Operation::CancelCapturedBeforeDispatch {
            hold_id: "h1".into(),
        },
        Operation::ReverseHold {
            hold_id: "h1".into(),
            exposure_units: 40,
        },
        Operation::ReleaseHold {
            hold_id: "h1".into(),
            released_exposure_units: 10,
        },
        Operation::ReconcileHold {
            hold_id: "h1".into(),
            exposed_cost_units: 30,
            realized_spend_units: 25,
        },
        Operation::TryIncrement {
            limits: GrantLimits::invocations(7),
        },
        Operation::TryChargeCost {
            cost_units: 9,
            limits: monetary(),
        },
        Operation::ReverseChargeCost { cost_units: 9 },
        Operation::ReduceChargeCost { cost_units: 4 },
        Operation::SettleChargeCost {
            exposed_cost_units: 5,
            realized_spend_units: 0,
        },
        Operation::ConsumeNonce {
            nonce_id: "n".into(),
            expires_at_ms: u64::MAX,
        },
    ]
}

fn commands() -> Vec<ClientCommand> {
    operations()
        .into_iter()
        .enumerate()
        .map(|(i, op)| ClientCommand {
            header: header(&format!("ev{i}")),
            op,
        })
        .collect()
}

#[test]
fn every_command_round_trips_through_the_command_oneof() {
    for command in commands() {
        assert_eq!(
            through_bytes::<ClientCommand, pb::Command>(&command),
            command
        );
        let wire = pb::Command::from(&command);
        assert_eq!(wire.name(), Some(command.op.name()));
        assert_eq!(
            wire.header().map(|h| h.event_id.as_str()),
            Some(command.header.event_id.as_str())
        );
        let applied = Command::try_from(wire).expect("converts");
        assert_eq!(applied, Command::Apply(command));
    }
}

#[test]
fn every_per_command_request_converts_to_the_same_client_command() {
    use pb::command::Command as Op;
    for command in commands() {
        let wire = pb::Command::from(&command).command.expect("set");
        let back = match wire {
            Op::AuthorizeHold(r) => ClientCommand::try_from(r),
            Op::CaptureInvocation(r) => ClientCommand::try_from(r),
            Op::CancelCapturedBeforeDispatch(r) => ClientCommand::try_from(r),
            Op::ReverseHold(r) => ClientCommand::try_from(r),
            Op::ReleaseHold(r) => ClientCommand::try_from(r),
            Op::ReconcileHold(r) => ClientCommand::try_from(r),
            Op::TryIncrement(r) => ClientCommand::try_from(r),
            Op::TryChargeCost(r) => ClientCommand::try_from(r),
            Op::ReverseChargeCost(r) => ClientCommand::try_from(r),
            Op::ReduceChargeCost(r) => ClientCommand::try_from(r),
            Op::SettleChargeCost(r) => ClientCommand::try_from(r),
            Op::ConsumeNonce(r) => ClientCommand::try_from(r),
            Op::ResolveEvent(_) => panic!("not produced from a client command"),
        };
        assert_eq!(back.expect("converts"), command);
    }
}

#[test]
fn resolve_event_round_trips_for_every_command() {
    for command in commands() {
        let resolve = Command::Resolve(command.clone());
        let wire = pb::Command::try_from(&resolve).expect("has a wire form");
        assert_eq!(wire.name(), Some("resolve_event"));
        assert_eq!(
            wire.header().map(|h| h.event_id.clone()),
            Some(command.header.event_id.to_string())
        );
        let bytes = wire.encode_to_vec();
        let back = Command::try_from(pb::Command::decode(bytes.as_slice()).expect("decodes"));
        assert_eq!(back.expect("converts"), resolve);
        let request = pb::ResolveEventRequest::from(&command);
        assert_eq!(Command::try_from(request).expect("converts"), resolve);
    }
}

#[test]
fn expire_holds_has_no_client_wire_form() {
    let internal = Command::ExpireHolds {
        family_id: "fam".into(),
        up_to_ms: 5,
    };
    assert!(matches!(
        pb::Command::try_from(&internal),
        Err(WireError::Invalid { .. })
    ));
}

#[test]
fn limits_presence_survives_the_wire() {
    // Pinning tells None from Some(0): the wire must too.
    let zero = GrantLimits {
        max_invocations: Some(0),
        max_cost_per_invocation_units: Some(0),
        max_total_cost_units: None,
        currency: Some("EUR".into()),
    };
    let bytes = pb::GrantLimits::from(&zero).encode_to_vec();
    let back = GrantLimits::from(pb::GrantLimits::decode(bytes.as_slice()).expect("decodes"));
    assert_eq!(back, zero);
    assert_ne!(
        back,
        GrantLimits {
            max_invocations: None,
            ..zero.clone()
        }
    );
}

fn decision(outcome: Outcome) -> Decision {
    Decision {
        event_id: "ev".into(),
        outcome,
        commit_index: Some(BudgetCommitIndex::new(12, 3, 1)),
        log_id: Some(LogPosition { term: 2, index: 12 }),
        replayed: true,
    }
}

fn outcomes() -> Vec<Outcome> {
    vec![
        Outcome::Authorized {
            hold_id: "h".into(),
            exposure_units: 40,
        },
        Outcome::Denied {
            reason: DenyReason {
                rule: DenyRule::InvocationLimit,
                account: AccountKey::new("c", 0),
            },
        },
        Outcome::Denied {
            reason: DenyReason {
                rule: DenyRule::PerInvocationCostLimit,
                account: AccountKey::new("parent", 2),
            },
        },
        Outcome::Denied {
            reason: DenyReason {
                rule: DenyRule::TotalCostLimit,
                account: AccountKey::new("c", 1),
            },
        },
        Outcome::Captured {
            hold_id: "h".into(),
            attempt_id: "a".into(),
        },
        Outcome::AlreadyCaptured {
            hold_id: "h".into(),
            owner_attempt_id: "other".into(),
            capture_event_id: "h:capture".into(),
            capture_commit_index: BudgetCommitIndex::new(9, 0, 0),
        },
        Outcome::Cancelled {
            hold_id: "h".into(),
            exposure_units: 40,
        },
        Outcome::Reversed {
            hold_id: "h".into(),
            exposure_units: 0,
        },
        Outcome::AlreadyReversed {
            hold_id: "h".into(),
            by_event_id: "auto:expire:h".into(),
        },
        Outcome::Released {
            hold_id: "h".into(),
            released_units: 10,
            remaining_units: 30,
        },
        Outcome::Reconciled {
            hold_id: "h".into(),
            realized_units: 25,
            unspent_units: 5,
        },
        Outcome::Incremented,
        Outcome::Charged { cost_units: 9 },
        Outcome::ChargeReversed { cost_units: 9 },
        Outcome::ChargeReduced { cost_units: 4 },
        Outcome::ChargeSettled {
            exposed_cost_units: 5,
            realized_spend_units: 3,
        },
        Outcome::NonceConsumed {
            nonce_id: "n".into(),
        },
        Outcome::Resolved(Resolution::NotApplied),
        Outcome::Resolved(Resolution::Applied(Box::new(decision(Outcome::Charged {
            cost_units: 1,
        })))),
        Outcome::HoldsExpired {
            hold_ids: vec!["a".into(), "b".into()],
            more_due: true,
        },
        Outcome::HoldsExpired {
            hold_ids: vec![],
            more_due: false,
        },
    ]
}

#[test]
fn every_outcome_round_trips_in_a_decision() {
    for outcome in outcomes() {
        let original = decision(outcome);
        assert_eq!(through_bytes::<Decision, pb::Decision>(&original), original);
    }
    let bare = Decision {
        event_id: "e".into(),
        outcome: Outcome::Resolved(Resolution::NotApplied),
        commit_index: None,
        log_id: None,
        replayed: false,
    };
    assert_eq!(through_bytes::<Decision, pb::Decision>(&bare), bare);
}

#[test]
fn the_cluster_stamp_is_the_authoritys_and_not_the_ledgers() {
    let mut wire = pb::Decision::from(decision(Outcome::Incremented));
    assert_eq!(wire.cluster, None);
    wire.cluster = Some(pb::ClusterStamp::raft_linearizable("c1", 4, 77));
    assert_eq!(
        wire.cluster.as_ref().map(|c| c.guarantee_level.as_str()),
        Some("raft_linearizable")
    );
    assert_eq!(
        Decision::try_from(wire).expect("converts"),
        decision(Outcome::Incremented)
    );
}

fn account() -> Account {
    Account {
        limits: monetary(),
        invocation_count: 3,
        reserved_invocations: 1,
        captured_invocations: 1,
        legacy_unheld: LegacyUnheld {
            count: 1,
            exposed_units: 9,
        },
        total_cost_exposed_units: 49,
        total_cost_realized_spend_units: 25,
        seq: BudgetCommitIndex::new(12, 3, 1),
        updated_at_ms: 1_700_000_000_123,
    }
}

#[test]
fn usage_records_round_trip() {
    let record = UsageRecord {
        key: AccountKey::new("cap", 4_095),
        account: account(),
    };
    let family = FamilyId::from("fam");
    let wire = pb::UsageRecord::of_family(&family, &record);
    assert_eq!(wire.family_id, "fam", "a row names its family");
    let decoded = pb::UsageRecord::decode(wire.encode_to_vec().as_slice()).expect("decodes");
    assert_eq!(UsageRecord::try_from(decoded).expect("converts"), record);
    assert_eq!(
        pb::GetUsageReply::from_record(&family, Some(&record))
            .into_record()
            .expect("converts"),
        Some(record)
    );
    assert_eq!(
        pb::GetUsageReply::from_record(&family, None)
            .into_record()
            .expect("converts"),
        None
    );
}

#[test]
fn usage_pages_carry_each_rows_family_and_a_next_position_only_when_full() {
    let row = |cap: &str, updated_at_ms: u64| UsageRecord {
        key: AccountKey::new(cap, 1),
        account: Account {
            updated_at_ms,
            ..account()
        },
    };
    let rows = vec![
        (FamilyId::from("fam-b"), row("cap-1", 9)),
        (FamilyId::from("fam-a"), row("cap-2", 7)),
    ];
    let full = pb::ListUsagesReply::from_rows(&rows, 2);
    let bytes = full.encode_to_vec();
    let page = pb::ListUsagesReply::decode(bytes.as_slice())
        .expect("decodes")
        .into_page()
        .expect("converts");
    assert_eq!(page.rows, rows, "every row with its own family");
    assert_eq!(
        page.next,
        Some(UsagePosition {
            updated_at_ms: 7,
            key: AccountKey::new("cap-2", 1),
            family_id: "fam-a".into(),
        }),
        "a full page ends where its last row sits"
    );
    let short = pb::ListUsagesReply::from_rows(&rows, 3)
        .into_page()
        .expect("converts");
    assert_eq!(
        short.next, None,
        "a page shorter than the limit is the last"
    );

    let mut nameless = pb::ListUsagesReply::from_rows(&rows, 3);
    nameless.usages[1].family_id.clear();
    let error = nameless.into_page().expect_err("a row without its family");
    assert!(
        error.to_string().contains("usages[1]") && error.to_string().contains("family_id"),
        "{error}"
    );
    let mut broken = pb::ListUsagesReply::from_rows(&rows, 2);
    broken.next.as_mut().expect("full").account = None;
    let error = broken
        .into_page()
        .expect_err("a position without its account");
    assert!(error.to_string().contains("account"), "{error}");
}

fn event_record(kind: EventKind) -> EventRecord {
    EventRecord {
        event_id: "ev".into(),
        kind,
        commit_index: BudgetCommitIndex::new(12, 3, 1),
        log_id: LogPosition { term: 2, index: 12 },
        at_ms: 1_700_000_000_123,
        capability_id: "cap".into(),
        grant_index: 3,
        hold_id: Some("h".into()),
        attempt_id: Some("a".into()),
        nonce_id: None,
        allowed: false,
        deny_reason: Some(DenyReason {
            rule: DenyRule::TotalCostLimit,
            account: AccountKey::new("parent", 0),
        }),
        exposure_units: 40,
        realized_units: 0,
        limits: Some(monetary()),
        hold_before: Some(HoldStates {
            invocation: InvocationState::Authorized,
            monetary: MonetaryState::Exposed,
        }),
        hold_after: Some(HoldStates {
            invocation: InvocationState::Captured,
            monetary: MonetaryState::Reconciled,
        }),
        after_images: vec![AccountImage {
            key: AccountKey::new("cap", 3),
            account: account(),
        }]
        .into(),
    }
}

#[test]
fn every_event_kind_round_trips_in_an_event_record() {
    for kind in EventKind::all() {
        let record = event_record(kind);
        assert_eq!(
            through_bytes::<EventRecord, pb::EventRecord>(&record),
            record
        );
        assert_eq!(pb::EventRecord::from(&record).kind, kind.as_str());
    }
    let sparse = EventRecord {
        hold_id: None,
        attempt_id: None,
        nonce_id: Some("n".into()),
        allowed: true,
        deny_reason: None,
        limits: None,
        hold_before: None,
        hold_after: None,
        after_images: Default::default(),
        ..event_record(EventKind::ConsumeNonce)
    };
    assert_eq!(
        through_bytes::<EventRecord, pb::EventRecord>(&sparse),
        sparse
    );
    let reply = pb::ListEventsReply::from_records(std::slice::from_ref(&sparse));
    assert_eq!(reply.into_records().expect("converts"), vec![sparse]);
}

#[test]
fn every_event_lookup_round_trips() {
    let lookups = [
        EventLookup::Applied {
            decision: decision(Outcome::Incremented),
            record: Some(event_record(EventKind::IncrementInvocation)),
        },
        EventLookup::Applied {
            decision: decision(Outcome::Charged { cost_units: 2 }),
            record: None,
        },
        EventLookup::Tombstoned,
        EventLookup::Unknown,
    ];
    for lookup in lookups {
        assert_eq!(
            through_bytes::<EventLookup, pb::EventLookup>(&lookup),
            lookup
        );
    }
}

fn transition(event_id: &str, log_index: u64) -> HoldTransition {
    HoldTransition {
        event_id: event_id.into(),
        commit_index: BudgetCommitIndex::new(log_index, 0, 0),
    }
}

fn live_hold() -> Hold {
    Hold {
        hold_id: "h".into(),
        capability_id: "cap".into(),
        grant_index: 3,
        accounts: vec![AccountKey::new("cap", 3), AccountKey::new("parent", 0)].into(),
        authorized_exposure_units: 100,
        remaining_exposure_units: 0,
        released_units: 10,
        reversed_units: 0,
        realized_units: 80,
        unspent_units: 10,
        invocation_state: InvocationState::Captured,
        monetary_state: MonetaryState::Reconciled,
        expires_at_ms: Some(1_700_000_030_000),
        created_at_ms: 1_700_000_000_000,
        capture_attempt_id: Some("att".into()),
        authorized: transition("h:authorize", 1),
        captured: Some(transition("h:capture", 2)),
        last_release: Some(transition("h:release", 3)),
        terminal: Some(transition("h:reconcile", 4)),
        terminal_at_ms: Some(1_700_000_040_000),
    }
}

#[test]
fn every_hold_view_round_trips() {
    let fresh = Hold {
        remaining_exposure_units: 100,
        released_units: 0,
        realized_units: 0,
        unspent_units: 0,
        invocation_state: InvocationState::Authorized,
        monetary_state: MonetaryState::None,
        expires_at_ms: None,
        capture_attempt_id: None,
        captured: None,
        last_release: None,
        terminal: None,
        terminal_at_ms: None,
        ..live_hold()
    };
    let views = [
        HoldView::Live(live_hold()),
        HoldView::Live(fresh.clone()),
        HoldView::Denied {
            hold_id: "h".into(),
            event_id: "h:authorize".into(),
        },
        HoldView::Archived {
            hold_id: "h".into(),
            hold: ArchivedHold {
                capability_id: "cap".into(),
                grant_index: 3,
                states: HoldStates {
                    invocation: InvocationState::Reversed,
                    monetary: MonetaryState::Reversed,
                },
                capture_attempt_id: None,
                captured: None,
                terminal: Some(transition("auto:expire:h", 5)),
            },
        },
    ];
    for view in views {
        assert_eq!(through_bytes::<HoldView, pb::HoldView>(&view), view);
    }
    let holds = vec![
        (FamilyId::from("fam-a"), live_hold()),
        (FamilyId::from("fam-b"), fresh),
    ];
    let full = pb::ListHoldsReply::from_holds(&holds, 2);
    assert!(full.holds.iter().all(|hold| !hold.family_id.is_empty()));
    let page = pb::ListHoldsReply::decode(full.encode_to_vec().as_slice())
        .expect("decodes")
        .into_page()
        .expect("converts");
    assert_eq!(page.holds, holds, "every hold with its own family");
    let (last_family, last) = holds.last().expect("two holds");
    assert_eq!(
        page.next,
        Some(HoldPosition {
            created_at_ms: last.created_at_ms,
            family_id: last_family.clone(),
            hold_id: last.hold_id.clone(),
        }),
        "a full page ends where its last hold sits"
    );
    assert_eq!(
        pb::ListHoldsReply::from_holds(&holds, 3)
            .into_page()
            .expect("converts")
            .next,
        None,
        "a page shorter than the limit is the last"
    );
    let mut nameless = pb::ListHoldsReply::from_holds(&holds, 3);
    nameless.holds[0].family_id.clear();
    let error = nameless.into_page().expect_err("a hold without its family");
    assert!(error.to_string().contains("holds[0]"), "{error}");

    let view = HoldView::Live(live_hold());
    let family = FamilyId::from("fam-a");
    let reply = pb::GetHoldReply::from_view(&family, Some(&view));
    assert!(
        matches!(
            &reply.hold,
            Some(pb::HoldView { view: Some(pb::hold_view::View::Live(hold)) }) if hold.family_id == "fam-a"
        ),
        "a live hold names its family: {reply:?}"
    );
    assert_eq!(reply.into_view().expect("converts"), Some(view));
    assert_eq!(
        pb::GetHoldReply::from_view(&family, None)
            .into_view()
            .expect("converts"),
        None
    );
}

#[test]
fn every_monetary_state_round_trips() {
    use MonetaryState::*;
    for monetary in [None, Exposed, Released, Reconciled, Reversed] {
        for invocation in [
            InvocationState::Authorized,
            InvocationState::Captured,
            InvocationState::Reversed,
        ] {
            let states = HoldStates {
                invocation,
                monetary,
            };
            assert_eq!(
                HoldStates::try_from(pb::HoldStates::from(states)),
                Ok(states)
            );
        }
    }
}

#[test]
fn list_holds_filter_treats_unset_and_unspecified_as_any_state() {
    let mut request = pb::ListHoldsRequest {
        created_before_ms: Some(9),
        ..Default::default()
    };
    assert_eq!(
        HoldFilter::try_from(&request),
        Ok(HoldFilter {
            state: Option::None,
            created_before_ms: Some(9),
            with_remaining_exposure: false,
            after: None,
        })
    );
    request.after = Some(pb::HoldPosition {
        created_at_ms: 5,
        family_id: "fam".into(),
        hold_id: "h".into(),
    });
    assert_eq!(
        HoldFilter::try_from(&request).map(|f| f.after),
        Ok(Some(HoldPosition {
            created_at_ms: 5,
            family_id: "fam".into(),
            hold_id: "h".into(),
        }))
    );
    request.after = None;
    request.state = Some(0);
    assert_eq!(
        HoldFilter::try_from(&request).map(|f| f.state),
        Ok(Option::None)
    );
    request.state = Some(pb::InvocationState::Captured.into());
    assert_eq!(
        HoldFilter::try_from(&request).map(|f| f.state),
        Ok(Some(InvocationState::Captured))
    );
    request.state = Some(42);
    assert!(
        matches!(HoldFilter::try_from(&request), Err(WireError::Invalid { field, .. }) if field == "state")
    );
}

fn ledger_errors() -> Vec<LedgerError> {
    let mut errors = vec![
        LedgerError::invalid("limits", "limits changed"),
        LedgerError::conflict_fields(vec!["hold_id".into(), "amounts".into()]),
        LedgerError::Conflict(ConflictReason::HoldReused {
            hold_id: "h".into(),
        }),
        LedgerError::overflow("total_cost_exposed"),
        LedgerError::no_space("authorize_hold"),
    ];
    errors.extend(
        PRECONDITION_CODES_FOR_TESTS
            .iter()
            .map(|code| LedgerError::precondition(*code, format!("because {}", code.as_str()))),
    );
    errors
}

#[test]
fn every_ledger_error_round_trips_through_error_detail() {
    for error in ledger_errors() {
        let detail = pb::ErrorDetail::from(&error);
        assert!(detail.is_definite(), "{error:?} is definite");
        let bytes = detail.encode_to_vec();
        let back = pb::ErrorDetail::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(LedgerError::try_from(back.clone()), Ok(error.clone()));
        assert_eq!(RemoteError::try_from(back), Ok(RemoteError::Ledger(error)));
    }
}

#[test]
fn precondition_codes_are_complete_and_parse_back() {
    for (i, code) in PRECONDITION_CODES_FOR_TESTS.iter().enumerate() {
        assert_eq!(precondition_index(*code), i);
        assert_eq!(precondition_code(code.as_str()), Some(*code));
    }
    assert_eq!(precondition_code("no_such_code"), Option::None);
}

#[test]
fn cluster_errors_round_trip_and_know_whether_they_are_definite() {
    let unavailable = pb::ErrorDetail::unavailable(Some(2), Some("10.0.0.2:7000"), "not leader");
    assert!(unavailable.is_definite());
    assert_eq!(
        RemoteError::try_from(unavailable),
        Ok(RemoteError::Unavailable {
            leader_id: Some(2),
            leader_address: Some("10.0.0.2:7000".into()),
            message: "not leader".into(),
        })
    );
    let unknown = pb::ErrorDetail::unknown(&"ev".into(), "leader lost");
    assert!(!unknown.is_definite());
    let unknown = RemoteError::try_from(unknown).expect("converts");
    assert!(!unknown.is_definite());
    assert_eq!(
        unknown,
        RemoteError::Unknown {
            event_id: Some("ev".into()),
            message: "leader lost".into()
        }
    );
    let internal = pb::ErrorDetail::internal("disk");
    assert!(!internal.is_definite());
    assert_eq!(
        RemoteError::try_from(internal),
        Ok(RemoteError::Internal {
            message: "disk".into()
        })
    );
    assert!(LedgerError::try_from(pb::ErrorDetail::internal("disk")).is_err());
}

#[test]
fn statuses_carry_code_detail_trailer_and_leader_hint() {
    use tonic::Code;
    let cases = [
        (
            pb::ErrorDetail::from(LedgerError::invalid("f", "r")),
            Code::InvalidArgument,
            true,
        ),
        (
            pb::ErrorDetail::from(LedgerError::conflict_fields(vec!["x".into()])),
            Code::AlreadyExists,
            true,
        ),
        (
            pb::ErrorDetail::from(LedgerError::precondition(
                PreconditionCode::HoldExpired,
                "m",
            )),
            Code::FailedPrecondition,
            true,
        ),
        (
            pb::ErrorDetail::from(LedgerError::overflow("x")),
            Code::OutOfRange,
            true,
        ),
        (
            pb::ErrorDetail::from(LedgerError::no_space("try_increment")),
            Code::ResourceExhausted,
            true,
        ),
        (
            pb::ErrorDetail::unavailable(None, Some("n2:7000"), "m"),
            Code::Unavailable,
            true,
        ),
        (
            pb::ErrorDetail::unknown(&"ev".into(), "m"),
            Code::Unknown,
            false,
        ),
        (pb::ErrorDetail::internal("m"), Code::Internal, false),
    ];
    for (detail, code, definite) in cases {
        let status = tonic::Status::from(detail.clone());
        assert_eq!(status.code(), code);
        assert_eq!(error_detail(&status), Ok(detail.clone()));
        let expected = if definite {
            Definiteness::Definite
        } else {
            Definiteness::Indefinite
        };
        assert_eq!(
            Definiteness::from_metadata(status.metadata()),
            Some(expected)
        );
        assert_eq!(RemoteError::from(&status).is_definite(), definite);
        let hint = (!detail.leader_address.is_empty()).then(|| detail.leader_address.clone());
        assert_eq!(leader_hint(&status), hint);
    }
    let bare = tonic::Status::unavailable("connection reset");
    assert_eq!(error_detail(&bare), Err(WireError::missing("details")));
    let transport = RemoteError::from(&bare);
    assert!(matches!(transport, RemoteError::Transport { .. }));
    assert!(
        !transport.is_definite(),
        "a status without a Tally detail is never a definite no"
    );
}

#[test]
fn malformed_commands_name_the_field() {
    use pb::command::Command as Op;
    let missing = |command: pb::Command| match Command::try_from(command) {
        Err(WireError::Missing { field }) => field,
        other => panic!("expected a missing field, got {other:?}"),
    };
    assert_eq!(missing(pb::Command::default()), "command");

    let no_header = pb::AuthorizeHoldRequest {
        limits: Some(Default::default()),
        ..Default::default()
    };
    assert_eq!(
        ClientCommand::try_from(no_header.clone()),
        Err(WireError::missing("header"))
    );
    let wrapped = pb::Command {
        command: Some(Op::AuthorizeHold(no_header)),
    };
    assert_eq!(missing(wrapped), "authorize_hold.header");

    let no_limits = pb::TryChargeCostRequest {
        header: Some(Default::default()),
        ..Default::default()
    };
    assert_eq!(
        missing(pb::Command {
            command: Some(Op::TryChargeCost(no_limits))
        }),
        "try_charge_cost.limits"
    );

    let bad_ancestor = pb::AuthorizeHoldRequest {
        header: Some(Default::default()),
        limits: Some(Default::default()),
        ancestors: vec![
            pb::AncestorAccount {
                account: Some(Default::default()),
                limits: Some(Default::default()),
            },
            pb::AncestorAccount {
                account: Some(Default::default()),
                limits: None,
            },
        ],
        ..Default::default()
    };
    assert_eq!(
        missing(pb::Command {
            command: Some(Op::AuthorizeHold(bad_ancestor))
        }),
        "authorize_hold.ancestors[1].limits"
    );

    let resolve_nothing = pb::Command {
        command: Some(Op::ResolveEvent(Box::new(pb::ResolveEventRequest {
            original: None,
        }))),
    };
    assert_eq!(missing(resolve_nothing), "resolve_event.original");

    let resolve_empty = pb::Command {
        command: Some(Op::ResolveEvent(Box::new(pb::ResolveEventRequest {
            original: Some(Box::default()),
        }))),
    };
    assert_eq!(missing(resolve_empty), "resolve_event.original.command");
}

#[test]
fn a_resolve_cannot_resolve_a_resolve() {
    let inner = pb::Command::try_from(&Command::Resolve(commands().remove(2))).expect("wire form");
    let nested = pb::Command {
        command: Some(pb::command::Command::ResolveEvent(Box::new(
            pb::ResolveEventRequest {
                original: Some(Box::new(inner)),
            },
        ))),
    };
    match Command::try_from(nested) {
        Err(WireError::Invalid { field, .. }) => {
            assert_eq!(field, "resolve_event.original.resolve_event")
        }
        other => panic!("expected invalid, got {other:?}"),
    }
}

#[test]
fn batch_conversion_keeps_good_commands_and_indexes_bad_ones() {
    let good = pb::Command::from(&commands()[3]);
    let batch = pb::BatchRequest {
        commands: vec![good, pb::Command::default()],
    };
    let converted = batch.into_commands();
    assert_eq!(converted[0], Ok(Command::Apply(commands()[3].clone())));
    assert_eq!(converted[1], Err(WireError::missing("commands[1].command")));
    let detail = pb::ErrorDetail::from(&WireError::missing("commands[1].command"));
    assert_eq!(detail.field, "commands[1].command");
    assert_eq!(
        pb::ErrorKind::try_from(detail.kind),
        Ok(pb::ErrorKind::InvalidArgument)
    );
}

#[test]
fn malformed_outcomes_and_reads_name_the_field() {
    let no_outcome = pb::Decision {
        event_id: "e".into(),
        ..Default::default()
    };
    assert_eq!(
        Decision::try_from(no_outcome),
        Err(WireError::missing("outcome"))
    );

    let empty_oneof = pb::Decision {
        outcome: Some(Box::new(pb::Outcome { outcome: None })),
        ..Default::default()
    };
    assert_eq!(
        Decision::try_from(empty_oneof),
        Err(WireError::missing("outcome.outcome"))
    );

    let mut denied = pb::Decision::from(decision(outcomes().remove(1)));
    if let Some(pb::outcome::Outcome::Denied(d)) =
        denied.outcome.as_mut().and_then(|o| o.outcome.as_mut())
    {
        d.reason.as_mut().expect("set").rule = 0;
    }
    assert_eq!(
        Decision::try_from(denied.clone()),
        Err(WireError::missing("outcome.denied.reason.rule"))
    );
    if let Some(pb::outcome::Outcome::Denied(d)) =
        denied.outcome.as_mut().and_then(|o| o.outcome.as_mut())
    {
        d.reason.as_mut().expect("set").rule = 99;
    }
    assert!(matches!(
        Decision::try_from(denied),
        Err(WireError::Invalid { field, .. }) if field == "outcome.denied.reason.rule"
    ));

    let mut record = pb::EventRecord::from(&event_record(EventKind::ReserveInvocation));
    record.kind = "teleport".into();
    assert!(
        matches!(EventRecord::try_from(record), Err(WireError::Invalid { field, .. }) if field == "kind")
    );

    assert_eq!(
        EventLookup::try_from(pb::EventLookup::default()),
        Err(WireError::missing("lookup"))
    );

    let mut hold = pb::Hold::from(&live_hold());
    hold.authorized = None;
    assert_eq!(Hold::try_from(hold), Err(WireError::missing("authorized")));
    let view = pb::HoldView {
        view: Some(pb::hold_view::View::Live(pb::Hold {
            invocation_state: 0,
            ..pb::Hold::from(&live_hold())
        })),
    };
    assert_eq!(
        HoldView::try_from(view),
        Err(WireError::missing("live.invocation_state"))
    );

    let usage = pb::UsageRecord {
        key: Some(Default::default()),
        account: Some(Default::default()),
        family_id: "fam".into(),
    };
    assert_eq!(
        UsageRecord::try_from(usage),
        Err(WireError::missing("account.limits"))
    );

    let unknown_kind = pb::ErrorDetail {
        kind: 77,
        ..Default::default()
    };
    assert!(matches!(
        RemoteError::try_from(unknown_kind.clone()),
        Err(WireError::Invalid { .. })
    ));
    assert!(
        !unknown_kind.is_definite(),
        "an unknown kind is never a definite no"
    );
    let bad_code = pb::ErrorDetail {
        kind: pb::ErrorKind::FailedPrecondition.into(),
        reason: "made_up".into(),
        ..Default::default()
    };
    assert!(
        matches!(RemoteError::try_from(bad_code), Err(WireError::Invalid { field, .. }) if field == "reason")
    );
}

fn arb_id() -> impl Strategy<Value = String> {
    "[a-z0-9:_-]{0,12}"
}

fn arb_limits() -> impl Strategy<Value = GrantLimits> {
    (
        any::<Option<u32>>(),
        any::<Option<u64>>(),
        any::<Option<u64>>(),
        proptest::option::of("[A-Z]{0,4}"),
    )
        .prop_map(|(max_invocations, per_call, total, currency)| GrantLimits {
            max_invocations,
            max_cost_per_invocation_units: per_call,
            max_total_cost_units: total,
            currency: currency.map(Into::into),
        })
}

fn arb_operation() -> impl Strategy<Value = Operation> {
    let ancestor =
        (arb_id(), any::<u32>(), arb_limits()).prop_map(|(cap, grant, limits)| AncestorAccount {
            account: AccountKey::new(cap, grant),
            limits,
        });
    prop_oneof![
        (
            arb_id(),
            any::<u64>(),
            arb_limits(),
            proptest::collection::vec(ancestor, 0..8),
            any::<Option<u64>>()
        )
            .prop_map(|(hold_id, units, limits, ancestors, timeout)| {
                Operation::AuthorizeHold {
                    hold_id: hold_id.into(),
                    requested_exposure_units: units,
                    limits,
                    ancestors,
                    hold_timeout_ms: timeout,
                }
            }),
        (arb_id(), arb_id()).prop_map(|(h, a)| Operation::CaptureInvocation {
            hold_id: h.into(),
            attempt_id: a.into()
        }),
        arb_id().prop_map(|h| Operation::CancelCapturedBeforeDispatch { hold_id: h.into() }),
        (arb_id(), any::<u64>()).prop_map(|(h, u)| Operation::ReverseHold {
            hold_id: h.into(),
            exposure_units: u
        }),
        (arb_id(), any::<u64>()).prop_map(|(h, u)| Operation::ReleaseHold {
            hold_id: h.into(),
            released_exposure_units: u
        }),
        (arb_id(), any::<u64>(), any::<u64>()).prop_map(|(h, e, r)| Operation::ReconcileHold {
            hold_id: h.into(),
            exposed_cost_units: e,
            realized_spend_units: r
        }),
        arb_limits().prop_map(|limits| Operation::TryIncrement { limits }),
        (any::<u64>(), arb_limits())
            .prop_map(|(cost_units, limits)| Operation::TryChargeCost { cost_units, limits }),
        any::<u64>().prop_map(|cost_units| Operation::ReverseChargeCost { cost_units }),
        any::<u64>().prop_map(|cost_units| Operation::ReduceChargeCost { cost_units }),
        (any::<u64>(), any::<u64>()).prop_map(|(e, r)| Operation::SettleChargeCost {
            exposed_cost_units: e,
            realized_spend_units: r
        }),
        (arb_id(), any::<u64>()).prop_map(|(n, t)| Operation::ConsumeNonce {
            nonce_id: n.into(),
            expires_at_ms: t
        }),
    ]
}

fn arb_command() -> impl Strategy<Value = ClientCommand> {
    (
        arb_id(),
        arb_id(),
        any::<u32>(),
        arb_id(),
        any::<u64>(),
        arb_operation(),
    )
        .prop_map(
            |(family, cap, grant_index, event, not_after_ms, op)| ClientCommand {
                header: CommandHeader {
                    family_id: family.into(),
                    capability_id: cap.into(),
                    grant_index,
                    event_id: event.into(),
                    not_after_ms,
                },
                op,
            },
        )
}

proptest! {
    #[test]
    fn any_command_round_trips(command in arb_command(), resolve in any::<bool>()) {
        let domain = if resolve { Command::Resolve(command) } else { Command::Apply(command) };
        let wire = pb::Command::try_from(&domain).expect("client commands have a wire form");
        let bytes = wire.encode_to_vec();
        let back = Command::try_from(pb::Command::decode(bytes.as_slice()).expect("decodes"));
        prop_assert_eq!(back, Ok(domain));
    }
}

proptest! {
    /// Only the fields a request names reach the change: an unset field stays unset (it keeps
    /// its value in force), it never becomes 0 or the value the node happened to read.
    #[test]
    fn a_params_request_carries_exactly_the_named_fields(
        retention_ms in proptest::option::of(any::<u64>()),
        max_clock_step_ms in proptest::option::of(any::<u64>()),
        preferred_leader_regions in proptest::option::of(
            proptest::collection::vec("[a-z-]{0,8}", 0..4)
        ),
    ) {
        let change = tally_ledger::ParamsChange {
            retention_ms,
            max_clock_step_ms,
            preferred_leader_regions,
        };
        let bytes = pb::SetParamsRequest::from(&change).encode_to_vec();
        let wire = pb::SetParamsRequest::decode(bytes.as_slice()).expect("decodes");
        prop_assert_eq!(tally_ledger::ParamsChange::from(&wire), change);
    }
}

#[test]
fn a_refused_params_change_is_invalid_argument_and_definite() {
    let change = tally_ledger::ParamsChange {
        retention_ms: Some(u64::MAX),
        ..Default::default()
    };
    let error = change.validate().expect_err("out of range");
    let status = tonic::Status::from(pb::ErrorDetail::from(&error));
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("retention_ms")
            && status.message().contains("1000..=31536000000"),
        "{}",
        status.message()
    );
    assert_eq!(
        Definiteness::from_metadata(status.metadata()),
        Some(Definiteness::Definite)
    );
}
