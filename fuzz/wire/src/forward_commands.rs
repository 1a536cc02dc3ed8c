//! `Raft.Forward` payloads: `decode_raft::<Vec<Command>>`, the bytes a follower forwards to
//! the leader (authority/src/service/raft.rs, `forward`), which the leader proposes and every
//! replica then applies.
//!
//! Input: one control byte, then the Raft payload (version byte + msgpack). The control byte
//! sets how the commands are cut into log entries (`1 + (b & 7)` per entry) and how far the
//! leader's clock moves between entries (`(b >> 3) * 500` ms), so the fuzzer controls time too.
//!
//! Asserts: a decoded payload re-encodes (`encode_raft`) to bytes that decode to the same
//! commands; every client command survives the protobuf wire (`pb::Command`); and applied
//! on two replicas (`tally_fuzz_common::harness`), the ledger keeps its invariants, answers
//! alike on both, and every answer, read and snapshot round-trips.

use tally_api::{decode_raft, encode_raft, pb, WireError};
use tally_fuzz_common::harness::{sample_commands, Harness};
use tally_fuzz_common::seeds::selected;
use tally_ledger::{ClientCommand, Command};

const T0: u64 = 1_700_000_000_000;

pub fn run(data: &[u8]) {
    let Some((control, payload)) = tally_fuzz_common::split_selector(data) else {
        return;
    };
    let Ok(commands) = decode_raft::<Vec<Command>>(payload) else {
        return;
    };
    let bytes = encode_raft(&commands).expect("decoded commands encode");
    assert_eq!(
        decode_raft::<Vec<Command>>(&bytes).as_ref(),
        Ok(&commands),
        "Forward payload round trip"
    );
    tally_fuzz_common::roundtrip::msgpack("forward commands", &commands);
    for command in &commands {
        let _ = command.validate();
        client_wire(command);
    }
    let per_entry = 1 + usize::from(control & 7);
    let step_ms = u64::from(control >> 3) * 500;
    let mut harness = Harness::new();
    for (i, entry) in commands.chunks(per_entry).enumerate() {
        harness.apply_entry(T0 + step_ms * i as u64, entry);
    }
    harness.finish();
}

/// A command a client could send goes through `pb::Command` and back unchanged; the internal
/// `ExpireHolds` has no client form.
fn client_wire(command: &Command) {
    match pb::Command::try_from(command) {
        Ok(wire) => {
            let bytes = prost::Message::encode_to_vec(&wire);
            let wire: pb::Command = prost::Message::decode(bytes.as_slice()).expect("decodes");
            let name = wire.name();
            assert_eq!(name, Some(command.name()), "wire name of {command:?}");
            let back = Command::try_from(wire)
                .unwrap_or_else(|e| panic!("{command:?} does not come back from the wire: {e}"));
            assert_eq!(&back, command, "command changed on the wire");
            if let Command::Apply(client) | Command::Resolve(client) = command {
                let back = ClientCommand::try_from(pb::Command::from(client))
                    .unwrap_or_else(|e| panic!("{client:?}: {e}"));
                assert_eq!(&back, client);
            }
        }
        Err(WireError::Invalid { .. }) => {
            assert!(
                matches!(command, Command::ExpireHolds { .. }),
                "{command:?} has no wire form"
            );
        }
        Err(other) => panic!("{command:?}: unexpected wire error {other}"),
    }
}

pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let all = sample_commands(T0);
    let payload = |commands: &[Command]| encode_raft(&commands.to_vec()).expect("encodes");
    let mut seeds = vec![
        ("all-one-per-entry".into(), selected(0, &payload(&all))),
        (
            "all-eight-per-entry-slow-clock".into(),
            selected(0xff, &payload(&all)),
        ),
        ("empty".into(), selected(0, &payload(&[]))),
    ];
    for (i, command) in all.iter().enumerate() {
        seeds.push((
            format!("single-{i:02}-{}", command.name()),
            selected(3, &payload(std::slice::from_ref(command))),
        ));
    }
    seeds
}
