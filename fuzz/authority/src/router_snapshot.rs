//! The router's snapshot payload (`RouterSnapshot::from_bytes`,
//! authority/src/families/snapshot.rs): what `install_snapshot` decodes from the leader's
//! `InstallSnapshot` stream and from the newest snapshot file on start.
//!
//! Asserts: a decoded snapshot re-encodes (`to_bytes`) to bytes that decode to the same
//! snapshot and encode to the same bytes again, with the same digest; `FamilyRouter::restore`
//! runs without panicking, and a restored router's digest equals the snapshot's and its own
//! snapshot equals the one it was restored from, in the current format version (restore,
//! then snapshot, is the identity but for upgrading an older format);
//! every family's bytes that decode pass the `family_snapshot` checks of the wire package
//! (canonical round trip, same digest). The streaming reader (`snapshot_stream`, what an
//! install runs) never accepts what `from_bytes` refuses, and where it accepts, its digest is
//! the snapshot's and the router it restores streams back the same bytes.

use tally_authority::families::snapshot_stream::{digest_of, restore_from, write_cut};
use tally_authority::families::SNAPSHOT_FORMAT_VERSION;
use tally_authority::families::{
    FamilyRouter, FamilyStore, RouterConfig, RouterSnapshot, RouterState,
};
use tally_fuzz_common::harness::sample_commands;
use tally_ledger::{Family, FamilyId, IdMap, LogPosition};

use crate::ready;

pub fn run(data: &[u8]) {
    check(data);
}

/// The checks on one snapshot payload; `snapshot_file` runs them on the data of the files it
/// loads.
pub fn check(data: &[u8]) {
    let streamed = digest_of(&mut &data[..]);
    let Ok(snapshot) = RouterSnapshot::from_bytes(data) else {
        assert!(
            streamed.is_err(),
            "the stream reader accepted a snapshot from_bytes refuses"
        );
        return;
    };
    let bytes = snapshot
        .to_bytes()
        .unwrap_or_else(|e| panic!("a decoded router snapshot does not encode: {e}"));
    let back = RouterSnapshot::from_bytes(&bytes)
        .unwrap_or_else(|e| panic!("a router snapshot's own bytes do not decode: {e}"));
    assert_eq!(back, snapshot, "router snapshot round trip");
    assert_eq!(
        back.to_bytes().expect("encodes"),
        bytes,
        "encoding is not canonical"
    );
    let digest = snapshot.digest();
    assert_eq!(back.digest(), digest);
    for (family_id, family_bytes) in &snapshot.families {
        let Ok(family) = Family::from_snapshot_bytes(family_bytes) else {
            continue;
        };
        let encoded = family.to_snapshot_bytes();
        let again = Family::from_snapshot_bytes(&encoded)
            .unwrap_or_else(|e| panic!("family {family_id}: own bytes do not decode: {e}"));
        assert_eq!(again, family, "family {family_id}: round trip");
        assert_eq!(again.to_snapshot_bytes(), encoded);
    }
    let restored = FamilyRouter::restore(RouterConfig::default(), snapshot.clone());
    let Ok(streamed) = streamed else {
        return;
    };
    assert_eq!(streamed, digest, "the stream reader's digest is not the snapshot's");
    assert!(
        restored.is_ok(),
        "the stream reader accepted a snapshot restore refuses"
    );
    let store = FamilyStore::in_memory().expect("an in-memory store");
    let (router, read) = restore_from(RouterConfig::default(), &mut &data[..], store)
        .unwrap_or_else(|e| panic!("a stream that reads through does not restore: {e}"));
    assert_eq!(read, digest);
    // Every family starts in the store, so the cut needs no actor: it is ready at once.
    let cut = ready(router.cut())
        .expect("a cut of a router without live families is immediate")
        .unwrap_or_else(|e| panic!("cut of a restored router: {e}"));
    let mut again = Vec::new();
    let written = write_cut(cut, &mut again)
        .unwrap_or_else(|e| panic!("a restored router does not stream: {e}"));
    assert_eq!(written, digest, "a restored router's digest is not the snapshot's");
    // An older format a node still reads is written back in the current one.
    let expected = RouterSnapshot {
        format_version: SNAPSHOT_FORMAT_VERSION,
        ..snapshot
    };
    assert_eq!(
        again,
        expected.to_bytes().expect("encodes"),
        "restore then snapshot changed the snapshot"
    );
}

/// Snapshots of routers that applied the sample commands over one and two families.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    seed_snapshots()
        .into_iter()
        .map(|(name, snapshot)| (name, snapshot.to_bytes().expect("encodes")))
        .collect()
}

pub(crate) fn seed_snapshots() -> Vec<(String, RouterSnapshot)> {
    const T0: u64 = 1_700_000_000_000;
    let empty = RouterSnapshot {
        format_version: SNAPSHOT_FORMAT_VERSION,
        state: RouterState::default(),
        maintenance_due: IdMap::default(),
        families: Default::default(),
        cold_rows: Default::default(),
    };
    let mut families = std::collections::BTreeMap::new();
    let mut maintenance_due = IdMap::default();
    for (name, cut) in [("fam", 6), ("other", 16)] {
        let mut family = Family::new(name.into());
        for (i, command) in sample_commands(T0).into_iter().take(cut).enumerate() {
            let command = rename(command, name);
            let ctx = tally_ledger::ApplyCtx {
                log_id: LogPosition {
                    term: 1,
                    index: 1 + i as u64,
                },
                command_position: 0,
                now_ms: T0 + 1_000 * i as u64,
                params: Default::default(),
                no_space: false,
            };
            let _ = family.apply(&command, &ctx);
        }
        maintenance_due.insert(FamilyId::from(name), T0 + 30_000);
        families.insert(
            FamilyId::from(name),
            serde_bytes::ByteBuf::from(family.to_snapshot_bytes()),
        );
    }
    let full = RouterSnapshot {
        format_version: SNAPSHOT_FORMAT_VERSION,
        state: RouterState {
            last_applied: Some(LogPosition { term: 1, index: 16 }),
            cluster_time_ms: T0 + 16_000,
            params: Default::default(),
            alarms: Default::default(),
            preferred_leader_regions: vec!["eu-west".to_owned(), "us-east".to_owned()],
        },
        maintenance_due,
        families,
        cold_rows: Default::default(),
    };
    vec![("empty".into(), empty), ("two-families".into(), full)]
}

fn rename(command: tally_ledger::Command, family: &str) -> tally_ledger::Command {
    use tally_ledger::Command;
    match command {
        Command::Apply(mut c) => {
            c.header.family_id = family.into();
            Command::Apply(c)
        }
        Command::Resolve(mut c) => {
            c.header.family_id = family.into();
            Command::Resolve(c)
        }
        Command::ExpireHolds { up_to_ms, .. } => Command::ExpireHolds {
            family_id: family.into(),
            up_to_ms,
        },
    }
}
