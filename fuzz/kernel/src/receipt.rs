//! Signed receipts (kernel-node/src/receipt/): a receipt as JSON (a receipt-log line, an
//! `Evaluation.receipt_json`), the receipt log reader (`read_receipts`, `ReceiptLog::open`),
//! `verify_receipt`, and the reconciler's `event_refs`/`cross_check` over the metadata.
//!
//! Input: a selector byte, then: `0` one JSON receipt; `1` a whole receipt log file; `2` a
//! JSON receipt re-signed by a known kernel key.
//!
//! Asserts:
//! - a receipt that parses serializes, parses back equal, and has the same signing bytes
//!   (the signature covers canonical metadata, so a receipt read back from a JSON log, in any
//!   key order, still verifies; it is also checked for real signatures in mode 2);
//! - `verify_receipt` never panics and refuses an untrusted kernel; a freshly signed receipt
//!   verifies, also after a JSON round trip, and not once its verdict changes;
//! - `event_refs` never panics, and `cross_check` against a journal that agrees with every
//!   claim passes;
//! - log files: reading never panics; opening a log cuts a torn tail and keeps every complete
//!   receipt, and a receipt appended after that reads back after them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use tally_fuzz_common::seeds::selected;
use tally_kernel::receipt::{
    cross_check, event_refs, read_receipts, EventClaim, ReceiptDraft, ReceiptLog,
};
use tally_kernel::{verify_receipt, Receipt, ReceiptError, TrustList, Verdict};
use tally_ledger::{Decision, EventId, EventLookup, Outcome};

use crate::fixtures;

pub fn run(data: &[u8]) {
    let Some((selector, rest)) = tally_fuzz_common::split_selector(data) else {
        return;
    };
    match selector % 3 {
        0 => {
            if let Ok(receipt) = serde_json::from_slice::<Receipt>(rest) {
                check(&receipt);
            }
        }
        1 => log(rest),
        _ => resigned(rest),
    }
}

fn check(receipt: &Receipt) {
    let signing = receipt.signing_bytes();
    let text = serde_json::to_string(receipt).expect("a parsed receipt serializes");
    let back: Receipt = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("a receipt's own JSON does not parse: {e}\n{text}"));
    // Floats may move by an ulp through serde_json (no `float_roundtrip`); signed metadata
    // is integers only, so compare values only when the receipt can be signed at all.
    if signing.is_ok() {
        assert_eq!(&back, receipt, "JSON round trip changed the receipt");
    }
    assert_eq!(
        back.signing_bytes().ok(),
        signing.ok(),
        "signing bytes changed through JSON"
    );
    assert!(matches!(
        verify_receipt(receipt, &TrustList::default()),
        Err(ReceiptError::UntrustedKernel { .. })
    ));
    let _ = verify_receipt(receipt, &TrustList::new([receipt.kernel_key]));
    journal_checks(receipt);
}

/// `cross_check` against a journal built to agree with every claim must pass.
fn journal_checks(receipt: &Receipt) {
    let Ok(refs) = event_refs(&receipt.metadata) else {
        return;
    };
    let mut journal: BTreeMap<EventId, EventLookup> = BTreeMap::new();
    for event in &refs {
        let lookup = match event.claim {
            EventClaim::Committed(index) => EventLookup::Applied {
                decision: Decision {
                    event_id: event.event_id.clone(),
                    outcome: Outcome::Incremented,
                    commit_index: Some(index),
                    log_id: None,
                    replayed: false,
                },
                record: None,
            },
            EventClaim::Ambiguous => EventLookup::Tombstoned,
        };
        if let Some(previous) = journal.insert(event.event_id.clone(), lookup.clone()) {
            if previous != lookup {
                // One event id claimed two ways: no journal agrees with both.
                return;
            }
        }
    }
    let checked = cross_check(receipt, &journal)
        .unwrap_or_else(|e| panic!("a journal that agrees with the receipt fails: {e}"));
    assert_eq!(checked.len(), refs.len());
}

fn resigned(data: &[u8]) {
    let Ok(parsed) = serde_json::from_slice::<Receipt>(data) else {
        return;
    };
    let kernel = fixtures::key_for(&parsed.kernel_key);
    let mut draft = ReceiptDraft::new(
        &parsed.request_id,
        &parsed.server,
        &parsed.tool,
        parsed.verdict,
        parsed.issued_at_ms,
    )
    .with_metadata(parsed.metadata.clone());
    draft.receipt_id = parsed.receipt_id.clone();
    draft.capability_id = parsed.capability_id.clone();
    draft.family_id = parsed.family_id.clone();
    draft.reason = parsed.reason.clone();
    let Ok(signed) = draft.sign(&kernel) else {
        return;
    };
    let trust = TrustList::new([kernel.public_key()]);
    assert_eq!(
        verify_receipt(&signed, &trust),
        Ok(()),
        "a fresh receipt does not verify"
    );
    let text = serde_json::to_string(&signed).expect("serializes");
    let back: Receipt = serde_json::from_str(&text).expect("parses");
    assert_eq!(
        verify_receipt(&back, &trust),
        Ok(()),
        "a receipt stopped verifying after a JSON round trip"
    );
    let mut flipped = signed.clone();
    flipped.verdict = match signed.verdict {
        Verdict::Allow => Verdict::Deny,
        Verdict::Deny => Verdict::Allow,
    };
    assert!(
        verify_receipt(&flipped, &trust).is_err(),
        "a flipped verdict still verifies"
    );
    check(&signed);
}

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("tally-fuzz-receipt-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    })
}

fn log(data: &[u8]) {
    let path = scratch().join("receipts.jsonl");
    std::fs::write(&path, data).expect("write the log");
    let Ok(first) = read_receipts(&path) else {
        return;
    };
    for receipt in &first.receipts {
        let text = serde_json::to_string(receipt).expect("serializes");
        let back: Receipt = serde_json::from_str(&text).expect("parses");
        assert_eq!(back.signing_bytes().ok(), receipt.signing_bytes().ok());
    }
    let log =
        ReceiptLog::open(&path).unwrap_or_else(|e| panic!("a readable log does not open: {e}"));
    let second =
        read_receipts(&path).unwrap_or_else(|e| panic!("an opened log does not read: {e}"));
    assert_eq!(
        second.receipts, first.receipts,
        "opening the log lost or changed receipts"
    );
    assert!(!second.torn_tail, "opening the log left a torn tail");
    let (_, extra) = fixtures::receipts().swap_remove(1);
    log.append(&extra).expect("append");
    let third = read_receipts(&path).expect("reads after an append");
    assert_eq!(third.receipts.len(), first.receipts.len() + 1);
    assert_eq!(
        third.receipts.last(),
        Some(&extra),
        "the appended receipt reads back"
    );
    assert!(!third.torn_tail);
}

pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let receipts = fixtures::receipts();
    let mut seeds = Vec::new();
    let mut file = Vec::new();
    for (name, receipt) in &receipts {
        let json = serde_json::to_vec(receipt).expect("serializes");
        seeds.push((format!("{name}-json"), selected(0, &json)));
        seeds.push((format!("{name}-resign"), selected(2, &json)));
        file.extend_from_slice(&json);
        file.push(b'\n');
    }
    seeds.push(("log".into(), selected(1, &file)));
    let mut torn = file.clone();
    torn.extend_from_slice(b"{\"receipt_id\":\"rcpt-tor");
    seeds.push(("log-torn-tail".into(), selected(1, &torn)));
    seeds
}
