//! A tool call's budget flow on one family, without a cluster: authorize a hold, capture it
//! (the dispatch fence), reconcile the actual cost, replay a lost acknowledgement, and print
//! the journal. `cargo run -p tally-ledger --example demo`

use tally_ledger::*;

fn main() {
    let mut family = Family::new("family-acme".into());
    let mut now_ms = 1_700_000_000_000;
    let header = |event_id: &str, now_ms: u64| CommandHeader {
        family_id: "family-acme".into(),
        capability_id: "cap-agent-7".into(),
        grant_index: 0,
        event_id: event_id.into(),
        not_after_ms: now_ms + 30_000,
    };
    let hold: HoldId = "budget-hold:req-42:cap-agent-7:0".into();
    let limits = GrantLimits::monetary(Some(50), Some(10_000), Some(100_000), "USD");
    let steps = [
        (
            "authorize $100 (the grant's per-call maximum)",
            Operation::AuthorizeHold {
                hold_id: hold.clone(),
                requested_exposure_units: 10_000,
                limits,
                ancestors: vec![],
                hold_timeout_ms: Some(60_000),
            },
            "budget-hold:req-42:cap-agent-7:0:authorize",
        ),
        (
            "capture before paying (this kernel's attempt owns it)",
            Operation::CaptureInvocation {
                hold_id: hold.clone(),
                attempt_id: "attempt-a".into(),
            },
            "budget-hold:req-42:cap-agent-7:0:capture-invocation",
        ),
        (
            "a twin kernel retries the same capture: it learns it is not the owner",
            Operation::CaptureInvocation {
                hold_id: hold.clone(),
                attempt_id: "attempt-b".into(),
            },
            "budget-hold:req-42:cap-agent-7:0:capture-invocation",
        ),
        (
            "reconcile: the tool cost $37.50",
            Operation::ReconcileHold {
                hold_id: hold.clone(),
                exposed_cost_units: 10_000,
                realized_spend_units: 3_750,
            },
            "budget-hold:req-42:cap-agent-7:0:reconcile",
        ),
    ];
    for (log_index, (what, op, event_id)) in (1..).zip(steps) {
        now_ms += 250;
        let command = Command::Apply(ClientCommand {
            header: header(event_id, now_ms),
            op,
        });
        let ctx = ApplyCtx {
            log_id: LogPosition {
                term: 1,
                index: log_index,
            },
            command_position: 0,
            now_ms,
            params: ClusterParams::default(),
            no_space: false,
        };
        match family.apply(&command, &ctx) {
            Ok(decision) => println!(
                "{what}\n  -> {:?} (commit index {:?}, replayed {})",
                decision.outcome, decision.commit_index, decision.replayed
            ),
            Err(err) => println!("{what}\n  -> error: {err}"),
        }
    }
    println!("\njournal:");
    for event in family.list_events(None, None, None, 100) {
        println!(
            "  {:>14} {:<20} {:<55} exposure {:>6} realized {:>6}",
            event.commit_index.to_string(),
            event.kind.as_str(),
            event.event_id.to_string(),
            event.exposure_units,
            event.realized_units
        );
    }
    let usage = family
        .get_usage(&AccountKey::new("cap-agent-7", 0))
        .expect("row exists");
    println!(
        "\nusage cap-agent-7/0: {} calls, exposed {} realized {} (committed {} of {:?})",
        usage.account.invocation_count,
        usage.account.total_cost_exposed_units,
        usage.account.total_cost_realized_spend_units,
        usage.account.committed_cost_units().expect("no overflow"),
        usage.account.limits.max_total_cost_units
    );
    println!("state digest: {}", hex(&family.digest()));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
