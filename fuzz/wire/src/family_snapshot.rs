//! A family's snapshot bytes (`Family::from_snapshot_bytes`, ledger/src/snapshot.rs): what
//! every passivated family is kept as, what a snapshot (from disk or from the leader's
//! `InstallSnapshot`) carries per family, and what an actor decodes on activation.
//!
//! Asserts: a decoded family re-encodes to bytes that decode to the same family, with the
//! same bytes and digest again (the canonical encoding replicas compare); the invariant
//! check and the list reads run without panicking; and what they return (holds, hold views,
//! usages, events) survives the protobuf wire unchanged.
//! Not asserted: that the invariants hold, since a decoded state may be any state; a
//! snapshot's contents are trusted (checksummed file, authenticated leader), its decoding and
//! encoding are what must be robust.

use tally_api::pb;
use tally_fuzz_common::harness::{sample_commands, Harness};
use tally_ledger::limits::MAX_LIST_LIMIT;
use tally_ledger::{Family, HoldFilter};

pub fn run(data: &[u8]) {
    let Ok(family) = Family::from_snapshot_bytes(data) else {
        return;
    };
    let bytes = family.to_snapshot_bytes();
    let back = Family::from_snapshot_bytes(&bytes)
        .unwrap_or_else(|e| panic!("a decoded family's own bytes do not decode: {e}\n{family:?}"));
    assert_eq!(back, family, "snapshot round trip changed the family");
    assert_eq!(
        back.to_snapshot_bytes(),
        bytes,
        "snapshot encoding is not canonical"
    );
    assert_eq!(back.digest(), family.digest());
    let _ = family.invariant_violations();
    let family_id = family.family_id().clone();
    let _ = family.live_hold_count();
    let _ = family.journal_len();
    let holds: Vec<_> = family
        .list_holds(&HoldFilter::default(), MAX_LIST_LIMIT)
        .into_iter()
        .map(|hold| (family_id.clone(), hold))
        .collect();
    let page = pb::ListHoldsReply::from_holds(&holds, MAX_LIST_LIMIT)
        .into_page()
        .unwrap_or_else(|e| panic!("holds page: {e:?}"));
    assert_eq!(page.holds, holds, "holds changed on the wire");
    for (_, hold) in &holds {
        let view = family.get_hold(&hold.hold_id);
        let back = pb::GetHoldReply::from_view(&family_id, view.as_ref())
            .into_view()
            .unwrap_or_else(|e| panic!("hold view: {e:?}"));
        assert_eq!(back, view, "hold view changed on the wire");
    }
    let usages: Vec<_> = family
        .list_usages(None, None, MAX_LIST_LIMIT)
        .into_iter()
        .map(|row| (family_id.clone(), row))
        .collect();
    let page = pb::ListUsagesReply::from_rows(&usages, MAX_LIST_LIMIT)
        .into_page()
        .unwrap_or_else(|e| panic!("usage page: {e:?}"));
    assert_eq!(page.rows, usages, "usages changed on the wire");
    let events = family.list_events(None, None, None, MAX_LIST_LIMIT);
    let back = pb::ListEventsReply::from_records(&events)
        .into_records()
        .unwrap_or_else(|e| panic!("events: {e:?}"));
    assert_eq!(back, events, "events changed on the wire");
    // Not `get_event`: it assumes what `apply` guarantees about the state (an expiry event
    // names its hold), and a snapshot's state is trusted (checksummed file, authenticated
    // leader); only its decoding is fuzzed here. The apply harness checks lookups on states
    // `apply` produced.
}

/// Families after a realistic command stream, cut after every few commands.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    const T0: u64 = 1_700_000_000_000;
    let commands = sample_commands(T0);
    let mut seeds = vec![(
        "empty".into(),
        Family::new("fam".into()).to_snapshot_bytes(),
    )];
    for cut in [2, 6, 10, commands.len()] {
        let mut family = Family::new("fam".into());
        let mut harness = Harness::new();
        for (i, command) in commands[..cut].iter().enumerate() {
            let (log_id, now_ms) = harness.enter(T0 + 1_000 * i as u64, None);
            let ctx = tally_ledger::ApplyCtx {
                log_id,
                command_position: 0,
                now_ms,
                params: harness.params(),
                no_space: false,
            };
            let _ = family.apply(command, &ctx);
        }
        seeds.push((
            format!("after-{cut:02}-commands"),
            family.to_snapshot_bytes(),
        ));
    }
    seeds
}
