//! The family router against a bare-ledger reference: ordering, commit indexes, snapshots,
//! passivation, cluster time, parameters, expiry scheduling, fatal family failures, reads that
//! leave apply alone and the hold index.

mod router_support;

use std::pin::pin;
use std::time::Duration;

use router_support::*;
use tally_authority::families::{
    self, every_family, AlarmChange, AlarmKind, EntryInput, EntryOutput, FamilyRouter,
    RouterConfig, RouterError, RouterSnapshot,
};
use tally_ledger::limits::MAX_LOG_INDEX;
use tally_ledger::{
    AccountKey, BudgetCommitIndex, ClientCommand, ClusterParams, Command, FamilyId, GrantLimits,
    Hold, HoldFilter, HoldPosition, HoldView, InvocationState, LedgerError, Operation, Outcome,
};
use tokio::sync::{oneshot, Mutex};

fn router(max_live_actors: usize) -> FamilyRouter {
    let config = RouterConfig {
        max_live_actors,
        ..RouterConfig::default()
    };
    FamilyRouter::new(config).expect("valid config")
}

fn results(outputs: &[EntryOutput]) -> Vec<Vec<Result<tally_ledger::Decision, LedgerError>>> {
    outputs.iter().map(|o| o.results.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_families_match_one_by_one_application() -> anyhow::Result<()> {
    let entries = mixed_entries(1, 12, 20, T0);
    let mut reference = Reference::default();
    let expected = reference.apply(&entries);
    let mut router = router(1_000);
    let outputs = router.apply(entries).await?;
    assert_eq!(results(&outputs), expected);
    let kinds: std::collections::BTreeSet<&str> = expected
        .iter()
        .flatten()
        .map(|r| match r {
            Ok(d) if d.replayed => "replayed",
            Ok(d) if d.outcome.is_denied() => "denied",
            Ok(_) => "applied",
            Err(_) => "error",
        })
        .collect();
    assert_eq!(
        kinds.len(),
        4,
        "the workload must exercise every kind of answer: {kinds:?}"
    );
    for (family_id, family) in &reference.families {
        assert_eq!(
            router.family_digest(family_id).await?,
            Some(family.digest()),
            "{family_id}"
        );
    }
    assert_eq!(router.family_count(), reference.families.len());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_come_back_in_input_order_with_commit_indexes_from_log_positions(
) -> anyhow::Result<()> {
    let entries = mixed_entries(7, 9, 6, T0);
    let sent: Vec<Vec<Command>> = entries
        .iter()
        .map(|e| match &e.payload {
            tally_authority::families::EntryPayload::Commands(c) => c.clone(),
            _ => vec![],
        })
        .collect();
    let mut router = router(1_000);
    let outputs = router.apply(entries.clone()).await?;
    assert_eq!(outputs.len(), entries.len());
    let mut checked = 0;
    for ((output, input), commands) in outputs.iter().zip(&entries).zip(&sent) {
        assert_eq!(output.log_id, input.log_id);
        assert_eq!(output.results.len(), commands.len());
        for (position, (result, command)) in output.results.iter().zip(commands).enumerate() {
            let Ok(decision) = result else { continue };
            assert_eq!(
                Some(&decision.event_id),
                command.event_id(),
                "answer out of order"
            );
            if decision.replayed || decision.commit_index.is_none() {
                continue;
            }
            let expected = BudgetCommitIndex::new(input.log_id.index, position, 0);
            assert_eq!(decision.commit_index, Some(expected));
            assert_eq!(decision.log_id, Some(input.log_id));
            checked += 1;
        }
    }
    assert!(checked > 20, "too few fresh decisions checked: {checked}");
    assert_eq!(router.last_applied(), entries.last().map(|e| e.log_id));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_restore_gives_identical_digest_and_identical_future() -> anyhow::Result<()> {
    let mut small = router(3);
    let mut roomy = router(1_000);
    let first = mixed_entries(1, 10, 15, T0);
    small.apply(first.clone()).await?;
    roomy.apply(first).await?;
    assert!(small.passivated_families() > 0 && small.live_actors() > 0);
    assert_eq!(roomy.passivated_families(), 0);
    let digest = small.digest().await?;
    assert_eq!(
        digest,
        roomy.digest().await?,
        "the digest depends on which families are live"
    );

    let snapshot = small.snapshot().await?;
    assert_eq!(snapshot.digest(), digest);
    let decoded = RouterSnapshot::from_bytes(&snapshot.to_bytes()?)?;
    assert_eq!(decoded, snapshot);
    let mut restored = FamilyRouter::restore(RouterConfig::default(), decoded)?;
    assert_eq!(restored.live_actors(), 0);
    assert_eq!(restored.digest().await?, digest);
    assert_eq!(restored.last_applied(), small.last_applied());

    let further = mixed_entries(16, 11, 10, T0 + 1_500);
    let a = small.apply(further.clone()).await?;
    let b = restored.apply(further).await?;
    assert_eq!(a, b);
    assert_eq!(small.digest().await?, restored.digest().await?);
    assert_ne!(
        small.digest().await?,
        digest,
        "further entries must change the state"
    );
    Ok(())
}

/// docs/spec.md §5.6: the `NoSpace` alarm goes through the log. From its entry on, a new hold
/// is refused on every replica alike (and nothing of it is recorded); the alarm is in the
/// snapshot and the digest, survives a restore, and once cleared the same event id applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_no_space_alarm_survives_snapshot_and_restore_and_changes_the_digest(
) -> anyhow::Result<()> {
    let f = family(0);
    let mut router = router(1_000);
    router
        .apply(vec![entry(1, T0, vec![authorize(&f, "old", 5, T0, None)])])
        .await?;
    let before = router.digest().await?;
    let before_snapshot = router.snapshot().await?;
    let raise = AlarmChange::raise(AlarmKind::NoSpace, 2, "data dir 95% of its quota");
    let out = router
        .apply(vec![
            alarm(2, T0 + 1, raise),
            entry(3, T0 + 2, vec![authorize(&f, "new", 5, T0, None)]),
            entry(4, T0 + 3, vec![capture(&f, "old", T0)]),
        ])
        .await?;
    assert!(
        matches!(out[1].results[0], Err(LedgerError::NoSpace { .. })),
        "{:?}",
        out[1].results
    );
    assert!(out[2].results[0].is_ok(), "{:?}", out[2].results);
    assert!(router.alarms().no_space());

    let raised = router.digest().await?;
    assert_ne!(raised, before, "the digest covers the alarm");
    let snapshot = router.snapshot().await?;
    assert_eq!(snapshot.digest(), raised);
    let decoded = RouterSnapshot::from_bytes(&snapshot.to_bytes()?)?;
    let mut restored = FamilyRouter::restore(RouterConfig::default(), decoded)?;
    assert_eq!(restored.digest().await?, raised);
    let (kind, node, alarm_row) = restored.alarms().iter().next().expect("restored alarm");
    assert_eq!((kind, node), (AlarmKind::NoSpace, 2));
    assert_eq!(alarm_row.raised_at.index, 2);

    // Refused alike after the restore, then cleared through the log: the same id applies.
    let retried = restored
        .apply(vec![
            entry(5, T0 + 4, vec![authorize(&f, "new", 5, T0, None)]),
            alarm(
                6,
                T0 + 5,
                AlarmChange::Clear {
                    kind: AlarmKind::NoSpace,
                    node_id: None,
                },
            ),
            entry(7, T0 + 6, vec![authorize(&f, "new", 5, T0, None)]),
        ])
        .await?;
    assert!(matches!(
        retried[0].results[0],
        Err(LedgerError::NoSpace { .. })
    ));
    let applied = retried[2].results[0]
        .as_ref()
        .expect("applies once cleared");
    assert!(!applied.replayed);
    assert!(matches!(applied.outcome, Outcome::Authorized { .. }));
    assert!(restored.alarms().is_empty());

    // A snapshot taken before alarms existed (version 1: the same bytes without them)
    // still restores, with none raised.
    let mut old = before_snapshot;
    old.format_version = 1;
    let old = RouterSnapshot::from_bytes(&old.to_bytes()?)?;
    let old = FamilyRouter::restore(RouterConfig::default(), old)?;
    assert!(old.alarms().is_empty());
    assert_eq!(old.digest().await?, before);
    Ok(())
}

/// The cut shares the live families with their actors (copy on write): commands applied
/// after it, before it is encoded, change the router but not the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_encodes_the_state_at_the_cut_whatever_is_applied_after_it() -> anyhow::Result<()> {
    let mut reference = router(1_000);
    // Few live actors: the cut also holds passivated families, which the later entries wake.
    let mut live = router(3);
    let first = mixed_entries(1, 10, 15, T0);
    live.apply(first.clone()).await?;
    reference.apply(first).await?;
    assert!(live.passivated_families() > 0 && live.live_actors() > 0);
    let digest_at_cut = live.digest().await?;
    let cut = live.cut().await?;

    let further = mixed_entries(16, 11, 10, T0 + 1_500);
    live.apply(further.clone()).await?;
    let digest_after = live.digest().await?;
    assert_ne!(
        digest_after, digest_at_cut,
        "further entries change the state"
    );

    let snapshot = cut.encode()?;
    assert_eq!(
        snapshot.digest(),
        digest_at_cut,
        "the cut's state, not the later one"
    );
    assert_eq!(snapshot, reference.snapshot().await?, "byte for byte");
    let mut restored = FamilyRouter::restore(RouterConfig::default(), snapshot)?;
    restored.apply(further).await?;
    assert_eq!(restored.digest().await?, digest_after);
    assert_eq!(
        live.digest().await?,
        digest_after,
        "encoding left the router alone"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passivated_family_resumes_with_exactly_its_state() -> anyhow::Result<()> {
    let f = family(1);
    let mut passivating = router(1_000);
    let mut staying = router(1_000);
    let first = vec![entry(1, T0, vec![authorize(&f, "h1", 40, T0, None)])];
    let original = passivating.apply(first.clone()).await?;
    staying.apply(first).await?;
    let before = passivating.family_digest(&f).await?;
    assert!(passivating.is_live(&f));

    assert_eq!(passivating.passivate_idle(0).await?, 1);
    assert!(!passivating.is_live(&f));
    assert_eq!(passivating.passivated_families(), 1);
    assert_eq!(
        passivating.family_digest(&f).await?,
        before,
        "passivation changed the state"
    );
    let usage = passivating
        .get_usage(&f, &AccountKey::new(format!("{f}-cap"), 0))
        .await?;
    assert_eq!(usage.map(|u| u.account.total_cost_exposed_units), Some(40));
    assert!(!passivating.is_live(&f), "a read must not respawn a family");

    let replay = vec![entry(2, T0 + 10, vec![authorize(&f, "h1", 40, T0, None)])];
    let a = passivating.apply(replay.clone()).await?;
    let b = staying.apply(replay).await?;
    assert!(passivating.is_live(&f));
    assert_eq!(a, b);
    let Ok(decision) = &a[0].results[0] else {
        panic!("replay failed: {a:?}")
    };
    let Ok(first_decision) = &original[0].results[0] else {
        panic!("authorize failed")
    };
    assert!(decision.replayed);
    assert_eq!(decision.commit_index, first_decision.commit_index);
    assert_eq!(
        passivating.family_digest(&f).await?,
        staying.family_digest(&f).await?
    );
    Ok(())
}

/// A passivation of many families writes them a bounded group per commit (1/32 of the
/// families' share), so it never holds every family's encoding and the store's pages for
/// them at once; every family still resumes with exactly its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_passivation_commits_a_bounded_group_at_a_time() -> anyhow::Result<()> {
    let families: Vec<FamilyId> = (10..26).map(family).collect();
    let commands = |f: &FamilyId| vec![authorize(f, "h", 5, T0, None)];
    let mut probe = router(1_000);
    probe
        .apply(vec![entry(1, T0, commands(&families[0]))])
        .await?;
    let footprint = probe.live_footprint_bytes();
    assert!(footprint > 0, "a family with a hold has a footprint");
    // A step of two and a half families: groups of two.
    let mut router = FamilyRouter::new(RouterConfig {
        max_live_bytes: 32 * footprint * 5 / 2,
        ..RouterConfig::default()
    })?;
    let entries = (families.iter().enumerate())
        .map(|(i, f)| entry(i as u64 + 1, T0, commands(f)))
        .collect();
    router.apply(entries).await?;
    assert_eq!(router.live_actors(), families.len(), "all fit in the share");
    let mut digests = Vec::new();
    for f in &families {
        digests.push(router.family_digest(f).await?);
    }
    let commits_before = router.store().commits();

    assert_eq!(router.passivate_idle(0).await?, families.len());
    let commits = router.store().commits() - commits_before;
    assert!(
        (families.len() as u64 / 3..=families.len() as u64 / 2).contains(&commits),
        "16 families of about {footprint} bytes in steps of 2.5 families took {commits} commits"
    );
    assert_eq!(router.passivated_families(), families.len());
    for (f, digest) in families.iter().zip(digests) {
        assert_eq!(router.family_digest(f).await?, digest, "family {f} changed");
    }
    Ok(())
}

/// A family whose encoding spans several of the store's chunks (1 MiB each) spills and
/// resumes with exactly its state, and so does it once compaction has shrunk it to fewer
/// chunks (its open holds stay; a chunk left from the larger row would break it): replays,
/// new commands and digests match a router that never spilled it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_family_larger_than_a_store_chunk_resumes_exactly_as_it_grows_and_shrinks(
) -> anyhow::Result<()> {
    let f = family(1);
    let mut spilling = router(1_000);
    let mut staying = router(1_000);
    let params = ClusterParams {
        retention_ms: 1_000,
        ..ClusterParams::default()
    };
    // Holds left open (no call cap, no timeout), ids as long as kernels make them.
    let open_hold = |n: u64, now_ms: u64| {
        let hold = format!("budget-hold:{n:036}:{f}-cap:0");
        Command::Apply(ClientCommand {
            header: header(&f, &format!("{hold}:authorize"), now_ms),
            op: Operation::AuthorizeHold {
                hold_id: hold.into(),
                requested_exposure_units: 1,
                limits: GrantLimits::monetary(None, Some(100), None, "USD"),
                ancestors: vec![],
                hold_timeout_ms: None,
            },
        })
    };
    let mut entries = vec![set_params(1, T0, params)];
    entries.extend((0..100).map(|e| {
        let holds = (0..100).map(|n| open_hold(e * 100 + n, T0));
        entry(e + 2, T0, holds.collect())
    }));
    let mut index = entries.len() as u64;
    for router in [&mut spilling, &mut staying] {
        router.apply(entries.clone()).await?;
    }
    let usage = (staying.get_usage(&f, &AccountKey::new(format!("{f}-cap"), 0))).await?;
    assert_eq!(
        usage.map(|u| u.account.total_cost_exposed_units),
        Some(10_000),
        "every hold is open, none denied"
    );

    // Grown over 4 chunks; then compacted to fewer, but more than one (the open holds).
    let mut encoded = Vec::new();
    for (round, chunks) in [("grown", 4..usize::MAX), ("compacted", 1..4)] {
        let digest = staying.family_digest(&f).await?;
        assert_eq!(spilling.passivate_idle(0).await?, 1, "{round}: spilled");
        assert!(!spilling.is_live(&f));
        encoded.push(spilling.store().view()?.get(&f)?.len());
        let mib = encoded.last().copied().unwrap_or(0) >> 20;
        assert!(
            chunks.contains(&mib),
            "{round}: {mib} MiB encoded, outside {chunks:?} (all so far: {encoded:?})"
        );
        assert_eq!(
            spilling.family_digest(&f).await?,
            digest,
            "{round}: the stored family differs"
        );
        // A replay of the first command and a new one, against the router that kept it.
        index += 1;
        let now = spilling.cluster_time_ms();
        let next = vec![entry(
            index,
            now,
            vec![open_hold(0, T0), open_hold(1_000_000 + index, now)],
        )];
        let resumed = spilling.apply(next.clone()).await?;
        assert!(spilling.is_live(&f), "{round}: a command resumes it");
        assert_eq!(
            resumed,
            staying.apply(next).await?,
            "{round}: answers differ"
        );
        assert!(
            matches!(&resumed[0].results[0], Ok(d) if d.replayed),
            "{round}: the first command replays: {:?}",
            resumed[0].results[0]
        );
        assert_eq!(
            spilling.family_digest(&f).await?,
            staying.family_digest(&f).await?,
            "{round}: resumed state differs"
        );
        // Past every command's deadline and retention, 10 s per entry (the clock's step),
        // then enough expiry rounds to compact the backlog (a command compacts 1,024 steps).
        let mut compaction: Vec<_> = (1..=8)
            .map(|step| blank(index + step, now + step * 10_000))
            .collect();
        index += 8;
        let later = now + 80_000;
        for _ in 0..40 {
            index += 1;
            compaction.push(entry(index, later, vec![expire(&f, later)]));
        }
        for router in [&mut spilling, &mut staying] {
            router.apply(compaction.clone()).await?;
        }
    }
    Ok(())
}

/// A family brought back only by maintenance that leaves work due now (a compaction
/// backlog: a command compacts a bounded number of steps) counts as in use: spilled, it
/// would be encoded only to be decoded again by the next round. One whose maintenance is
/// done goes first, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_family_with_maintenance_still_due_stays_live_between_rounds() -> anyhow::Result<()> {
    let (backlog, done) = (family(1), family(2));
    let mut router = FamilyRouter::new(RouterConfig {
        max_live_bytes: 1,
        min_idle_entries_to_spill: 0,
        ..RouterConfig::default()
    })?;
    let params = ClusterParams {
        retention_ms: 1_000,
        ..ClusterParams::default()
    };
    let mut entries = vec![set_params(1, T0, params)];
    // More commands to compact than one command compacts (1,024).
    for chunk in 0..12 {
        let holds = (0..100).map(|n| authorize(&backlog, &format!("h{chunk}-{n}"), 1, T0, None));
        entries.push(entry(chunk + 2, T0, holds.collect()));
    }
    entries.push(entry(14, T0, vec![authorize(&done, "h", 1, T0, None)]));
    // Past every command's deadline and retention, 10 s per entry (the clock's step).
    entries.extend((1..=8).map(|step| blank(14 + step, T0 + step * 10_000)));
    router.apply(entries).await?;
    router.passivate_idle(0).await?;
    assert_eq!(router.passivated_families(), 2);

    let now = T0 + 90_000;
    let expiry = vec![expire(&backlog, now), expire(&done, now)];
    router.apply(vec![entry(23, now, expiry)]).await?;
    let due = router.maintenance_due_ms(&backlog);
    assert!(
        due.is_some_and(|due| due <= router.cluster_time_ms()),
        "the backlog is left due: {due:?} at {}",
        router.cluster_time_ms()
    );
    assert!(router.is_live(&backlog), "a family still due stays live");
    assert!(
        !router.is_live(&done),
        "a family whose maintenance is done is spilled"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_recently_used_families_are_passivated_beyond_the_limit() -> anyhow::Result<()> {
    let mut router = router(2);
    for i in 0..5 {
        let f = family(i);
        let now = T0 + i as u64;
        router
            .apply(vec![entry(
                i as u64 + 1,
                now,
                vec![authorize(&f, "h", 1, now, None)],
            )])
            .await?;
    }
    assert_eq!((router.live_actors(), router.passivated_families()), (2, 3));
    assert!(router.is_live(&family(3)) && router.is_live(&family(4)));
    assert_eq!(
        router.passivate_idle(1).await?,
        1,
        "only family 3 is idle for an entry"
    );
    assert!(router.is_live(&family(4)));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_time_clamps_per_entry() -> anyhow::Result<()> {
    let f = family(0);
    let stamps = [T0, T0 + 5_000, T0 - 100_000, T0 + 1_000_000, T0 + 16_000];
    let expected = [T0, T0 + 5_000, T0 + 5_000, T0 + 15_000, T0 + 16_000];
    let entries: Vec<_> = stamps
        .iter()
        .enumerate()
        .map(|(i, stamp)| {
            let hold = format!("h{i}");
            entry(
                i as u64 + 1,
                *stamp,
                vec![authorize(&f, &hold, 1, T0, None)],
            )
        })
        .collect();
    let mut router = router(1_000);
    let outputs = router.apply(entries).await?;
    let times: Vec<u64> = outputs.iter().map(|o| o.cluster_time_ms).collect();
    assert_eq!(times, expected);
    assert_eq!(router.cluster_time_ms(), T0 + 16_000);
    let events = router.list_events(&f, None, None, None, 100).await?;
    let at: Vec<u64> = events.iter().map(|e| e.at_ms).collect();
    assert_eq!(at, expected, "events must carry the clamped time");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_params_through_the_log_changes_retention_for_later_commands() -> anyhow::Result<()> {
    let f = family(0);
    let short = ClusterParams {
        retention_ms: 1_000,
        ..ClusterParams::default()
    };
    let mut entries = vec![
        set_params(1, T0, short),
        entry(2, T0, vec![authorize(&f, "h", 1, T0, None)]),
    ];
    // 10 s steps: cluster time passes not_after (T0 + 60 s) + retention (1 s).
    for i in 0..8u64 {
        entries.push(blank(3 + i, T0 + (i + 1) * 10_000));
    }
    let touch = Command::ExpireHolds {
        family_id: f.clone(),
        up_to_ms: T0 + 80_000,
    };
    entries.push(entry(11, T0 + 80_000, vec![touch]));

    let mut with_params = router(1_000);
    let mut without = router(1_000);
    with_params.apply(entries.clone()).await?;
    let unchanged: Vec<_> = entries.into_iter().skip(1).collect();
    without.apply(unchanged).await?;
    assert_eq!(with_params.params(), short);
    assert_eq!(with_params.cluster_time_ms(), T0 + 80_000);
    assert_eq!(
        without.list_events(&f, None, None, None, 10).await?.len(),
        1
    );
    assert!(
        with_params
            .list_events(&f, None, None, None, 10)
            .await?
            .is_empty(),
        "not compacted"
    );
    // The compacted command still replays exactly.
    let lookup = with_params.get_event(&f, &"h:authorize".into()).await?;
    assert!(
        matches!(
            lookup,
            tally_ledger::EventLookup::Applied { record: None, .. }
        ),
        "{lookup:?}"
    );
    Ok(())
}

/// Rules version 3: a lowered retention brings forward the compaction of what was queued
/// before it, in families the change's round never touches and families on disk too; their
/// maintenance times move with it, the same whether a replica applied the entries one at a
/// time or together. Under version 2 what was queued keeps its time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_retention_brings_idle_families_maintenance_forward_from_rules_3(
) -> anyhow::Result<()> {
    for rules_version in [2, 3] {
        let families: Vec<FamilyId> = (0..6).map(family).collect();
        let live = family(9);
        let mut entries = vec![raise_rules(1, T0, rules_version)];
        for f in &families {
            let index = entries.len() as u64 + 1;
            let call = vec![
                authorize(f, "h", 5, T0, None),
                capture(f, "h", T0),
                reconcile(f, "h", 5, 3, T0),
            ];
            entries.push(entry(index, T0, call));
        }
        let hour_ms = 3_600_000;
        let held = authorize(&live, "g", 5, T0, Some(hour_ms));
        entries.push(entry(entries.len() as u64 + 1, T0, vec![held]));
        // Cluster time moves at most 10 s an entry.
        for step in 1..=12 {
            entries.push(blank(entries.len() as u64 + 1, T0 + step * 10_000));
        }
        let lowered = ClusterParams {
            retention_ms: 1_000,
            ..ClusterParams::default()
        };
        let change_at = entries.len() as u64 + 1;
        entries.push(set_params(change_at, T0 + 120_000, lowered));

        // Together (2 live families: the others wait on disk), and one entry at a time.
        let mut together = router(2);
        let mut one_by_one = router(1_000);
        together.apply(entries.clone()).await?;
        for one in entries {
            one_by_one.apply(vec![one]).await?;
        }
        assert_eq!(together.digest().await?, one_by_one.digest().await?);
        let now_ms = T0 + 120_000;
        assert_eq!(together.cluster_time_ms(), now_ms);
        let due = together.due_families(now_ms, 100);
        assert_eq!(due, one_by_one.due_families(now_ms, 100));
        if rules_version < 3 {
            assert!(due.is_empty(), "version 2 keeps the 24 h: {due:?}");
            continue;
        }
        let mut expected = families.clone();
        expected.push(live.clone());
        expected.sort();
        let mut listed = due.clone();
        listed.sort();
        assert_eq!(listed, expected, "every family's compaction came forward");

        let maintenance: Vec<Command> = due.iter().map(|f| expire(f, now_ms)).collect();
        let at = entry(change_at + 1, now_ms + 1_000, maintenance);
        together.apply(vec![at.clone()]).await?;
        one_by_one.apply(vec![at]).await?;
        assert_eq!(together.digest().await?, one_by_one.digest().await?);
        for f in &families {
            assert!(
                together
                    .list_events(f, None, None, None, 10)
                    .await?
                    .is_empty(),
                "{f}: compacted"
            );
            let lookup = together.get_event(f, &"h:reconcile".into()).await?;
            assert!(
                matches!(
                    lookup,
                    tally_ledger::EventLookup::Applied { record: None, .. }
                ),
                "{f}: {lookup:?}"
            );
            assert_eq!(together.maintenance_due_ms(f), None, "{f}: nothing left");
        }
        // The live hold's family was woken early (its time was its hold's expiry, brought
        // forward with the rest); its maintenance set it back to that expiry.
        assert_eq!(together.maintenance_due_ms(&live), Some(T0 + hour_ms));
        assert_eq!(one_by_one.maintenance_due_ms(&live), Some(T0 + hour_ms));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_families_reflect_hold_expiry() -> anyhow::Result<()> {
    let (f, g) = (family(0), family(1));
    let mut router = router(1_000);
    let first = entry(
        1,
        T0,
        vec![
            authorize(&f, "hf", 5, T0, Some(5_000)),
            authorize(&g, "hg", 5, T0, None),
        ],
    );
    router.apply(vec![first]).await?;
    assert!(router.due_families(T0 + 4_999, 10).is_empty());
    assert_eq!(router.due_families(T0 + 5_000, 10), vec![f.clone()]);

    let expire = Command::ExpireHolds {
        family_id: f.clone(),
        up_to_ms: T0 + 5_000,
    };
    let out = router
        .apply(vec![entry(2, T0 + 6_000, vec![expire])])
        .await?;
    let Ok(decision) = &out[0].results[0] else {
        panic!("expiry failed: {out:?}")
    };
    assert!(
        matches!(&decision.outcome, Outcome::HoldsExpired { hold_ids, .. } if hold_ids.len() == 1)
    );
    assert!(
        router.due_families(T0 + 6_000, 10).is_empty(),
        "expired family still due"
    );
    let hold = router.get_hold(&f, &"hf".into()).await?;
    assert!(
        matches!(hold, Some(HoldView::Live(h)) if h.invocation_state == InvocationState::Reversed)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_merge_across_families_and_leave_passivation_alone() -> anyhow::Result<()> {
    let mut router = router(2);
    let entries: Vec<_> = (0..5)
        .map(|i| {
            let now = T0 + i as u64 * 10;
            entry(
                i as u64 + 1,
                now,
                vec![authorize(&family(i), "h", 10, now, Some(60_000))],
            )
        })
        .collect();
    router.apply(entries).await?;
    let live = router.live_actors();
    let usages = router
        .list_usages(None, &every_family, None, None, 100)
        .await?;
    let order: Vec<_> = usages.iter().map(|(f, _)| f.clone()).collect();
    assert_eq!(
        order,
        (0..5).rev().map(family).collect::<Vec<_>>(),
        "newest first"
    );
    let holds = router
        .list_holds(None, &every_family, &HoldFilter::default(), 3)
        .await?;
    let order: Vec<_> = holds.iter().map(|(f, _)| f.clone()).collect();
    assert_eq!(
        order,
        (0..3).map(family).collect::<Vec<_>>(),
        "oldest first"
    );
    assert_eq!(
        router
            .list_usages(Some(&family(4)), &every_family, None, None, 100)
            .await?
            .len(),
        1
    );
    // A namespace-bound caller's read across families sees only the families it covers,
    // live and passivated alike.
    let mine = |f: &FamilyId| *f == family(0) || *f == family(3);
    let usages = router.list_usages(None, &mine, None, None, 100).await?;
    let seen: Vec<_> = usages.iter().map(|(f, _)| f.clone()).collect();
    assert_eq!(seen, vec![family(3), family(0)], "usages within");
    let holds = router
        .list_holds(None, &mine, &HoldFilter::default(), 100)
        .await?;
    let seen: Vec<_> = holds.iter().map(|(f, _)| f.clone()).collect();
    assert_eq!(seen, vec![family(0), family(3)], "holds within");
    assert_eq!(router.live_actors(), live);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_change_nothing_leave_no_family_behind() -> anyhow::Result<()> {
    let mut router = router(1_000);
    let f = family(0);
    let stale = authorize(&f, "h", 1, T0 - 120_000, None); // not_after before cluster time
    let mut bad_id = authorize(&f, "h2", 1, T0, None);
    if let Command::Apply(cmd) = &mut bad_id {
        cmd.header.family_id = "".into();
    }
    let out = router
        .apply(vec![entry(1, T0, vec![stale, bad_id])])
        .await?;
    assert!(out[0].results.iter().all(Result::is_err), "{out:?}");
    assert_eq!(router.family_count(), 0);
    assert_eq!(router.family_digest(&f).await?, None);
    assert!(router.due_families(u64::MAX, 10).is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_family_panic_is_fatal_and_halts_the_router() -> anyhow::Result<()> {
    let f = family(0);
    let mut router = router(1_000);
    router
        .apply(vec![entry(1, T0, vec![authorize(&f, "h", 1, T0, None)])])
        .await?;
    // A log index beyond the commit index's 44 bits makes the ledger assert inside the actor.
    let bad = entry(
        MAX_LOG_INDEX + 1,
        T0,
        vec![authorize(&f, "h2", 1, T0, None)],
    );
    let error = router
        .apply(vec![bad])
        .await
        .expect_err("the family panicked");
    assert!(
        matches!(&error, RouterError::FamilyFailed { family_id, reason } if *family_id == f && reason.contains("44 bits")),
        "{error:?}"
    );
    assert!(error.is_fatal());
    assert!(router.halted().is_some());
    let next = router.apply(vec![blank(MAX_LOG_INDEX + 2, T0)]).await;
    assert!(matches!(next, Err(RouterError::Halted(_))), "{next:?}");
    assert!(matches!(router.digest().await, Err(RouterError::Halted(_))));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_log_index_is_fatal() -> anyhow::Result<()> {
    let f = family(0);
    let mut router = router(1_000);
    router
        .apply(vec![entry(5, T0, vec![authorize(&f, "h", 1, T0, None)])])
        .await?;
    let again = router
        .apply(vec![entry(5, T0, vec![authorize(&f, "h2", 1, T0, None)])])
        .await;
    assert!(
        matches!(again, Err(RouterError::LogOrder { .. })),
        "{again:?}"
    );
    assert!(matches!(
        router.apply(vec![blank(6, T0)]).await,
        Err(RouterError::Halted(_))
    ));
    Ok(())
}

/// What a test waits at most for something that must happen (never a performance bound).
const WATCHDOG: Duration = Duration::from_secs(10);

/// A read that decodes passivated families does so with the router lock released: an apply
/// that comes after the read took its cut completes while the read still waits to decode,
/// and the read then answers the state at its cut. The only blocking thread is kept busy, so
/// the read cannot finish before the apply whatever the timing; a read holding the lock while
/// it decodes would hold the apply up until the watchdog fires.
#[test]
fn a_read_decoding_passivated_families_does_not_hold_up_apply() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut router = router(1);
        let count = 200;
        let entries: Vec<_> = (0..count)
            .map(|i| {
                let now = T0 + i as u64;
                entry(
                    i as u64 + 1,
                    now,
                    vec![authorize(&family(i), "h", 10, now, None)],
                )
            })
            .collect();
        router.apply(entries).await?;
        // Passivated families are on disk: the scan reads and decodes them on a blocking
        // thread.
        assert!(router.passivated_families() >= count - 1);
        let shared = Mutex::new(router);
        let usages = |r: &FamilyRouter| r.list_usages(None, &every_family, None, None, 10_000);
        let at_cut = families::read(&shared, usages).await?;
        assert_eq!(at_cut.len(), count);

        let (busy_tx, busy_rx) = oneshot::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let blocker = tokio::task::spawn_blocking(move || {
            let _ = busy_tx.send(());
            let _ = release_rx.recv();
        });
        busy_rx.await?;
        let mut reading = pin!(families::read(&shared, usages));
        // One poll: the read takes the lock and its cut, then waits for a blocking thread.
        tokio::select! {
            biased;
            _ = &mut reading => panic!("the read decoded without a blocking thread"),
            () = std::future::ready(()) => {}
        }
        let now = T0 + 1_000;
        let more = entry(
            count as u64 + 1,
            now,
            // The one live family: an apply that needs no blocking thread to fetch it.
            vec![authorize(&family(count - 1), "h2", 10, now, None)],
        );
        let mut applying = pin!(async { shared.lock().await.apply(vec![more]).await });
        let first = tokio::select! {
            applied = &mut applying => {
                applied?;
                "apply"
            }
            _ = &mut reading => "read",
            () = tokio::time::sleep(WATCHDOG) => "neither (apply waits for the read's lock)",
        };
        release_tx.send(())?;
        blocker.await?;
        assert_eq!(first, "apply", "apply must not wait for a read in flight");
        assert_eq!(
            reading.await?,
            at_cut,
            "the read answers the state at its cut"
        );
        let after = families::read(&shared, usages).await?;
        assert_ne!(after, at_cut, "the apply changed the last family's usage");
        Ok(())
    })
}

/// Holds in every state over 15 families (3 live actors, the rest passivated), in three
/// phases: (1) open holds (authorized, partly released, captured with exposure), final ones
/// (reconciled, captured without exposure, reversed by expiry) and denials; (2) 70 s later,
/// with a retention of 3 s, every final hold archived, so only kind-0 families keep live
/// holds; (3) more holds, some finished.
fn hold_phase(phase: u8, first_index: u64, start_ms: u64) -> Vec<EntryInput> {
    let families = 15;
    let mut out = Vec::new();
    let mut index = first_index;
    let mut push = |now: u64, commands: Vec<Command>| {
        out.push(entry(index, now, commands));
        index += 1;
    };
    match phase {
        1 => {
            for i in 0..families {
                let (f, now) = (family(i), start_ms + i as u64 * 100);
                let id = |kind: &str| format!("{kind}-{i}");
                let commands = match i % 5 {
                    0 => vec![
                        authorize(&f, &id("open"), 10, now, None),
                        authorize(&f, &id("cap"), 20, now, None),
                        capture(&f, &id("cap"), now),
                        authorize(&f, &id("rel"), 30, now, None),
                        release(&f, &id("rel"), 10, now),
                    ],
                    1 => vec![
                        authorize(&f, &id("done"), 5, now, None),
                        capture(&f, &id("done"), now),
                        reconcile(&f, &id("done"), 5, 3, now),
                    ],
                    2 => vec![authorize(&f, &id("denied"), 1_000, now, None)],
                    3 => vec![authorize(&f, &id("exp"), 10, now, Some(500))],
                    _ => vec![
                        authorize(&f, &id("zero"), 0, now, None),
                        capture(&f, &id("zero"), now),
                    ],
                };
                push(now, commands);
            }
            // Every expiring hold is due; no final hold is past its retention yet.
            let now = start_ms + 2_000;
            push(
                now,
                (0..families).map(|i| expire(&family(i), now)).collect(),
            );
        }
        2 => {
            // Cluster time moves at most 10 s per entry.
            for step in 1..=7 {
                let now = start_ms + step * 10_000;
                push(
                    now,
                    (0..families).map(|i| expire(&family(i), now)).collect(),
                );
            }
        }
        _ => {
            let now = start_ms;
            push(
                now,
                vec![
                    authorize(&family(2), "late-2", 10, now, None),
                    authorize(&family(7), "late-7", 10, now, Some(1_000)),
                    capture(&family(0), "open-0", now),
                    reconcile(&family(0), "cap-0", 20, 20, now),
                    authorize(&family(5), "late-5", 10, now, None),
                ],
            );
        }
    }
    out
}

fn named(rows: &[(FamilyId, Hold)]) -> Vec<String> {
    rows.iter()
        .map(|(f, h)| format!("{f}/{}", h.hold_id))
        .collect()
}

/// Every filter a reader uses, each read page by page at several page sizes, equals the
/// brute-force list over every family of `reference`, and the hold index names exactly the
/// families with live holds.
async fn assert_hold_lists_match(
    shared: &Mutex<FamilyRouter>,
    reference: &Reference,
    phase: &str,
) -> anyhow::Result<()> {
    let filters = [
        HoldFilter::default(),
        HoldFilter {
            state: Some(InvocationState::Captured),
            with_remaining_exposure: true,
            ..HoldFilter::default()
        },
        HoldFilter {
            state: Some(InvocationState::Reversed),
            ..HoldFilter::default()
        },
        HoldFilter {
            state: Some(InvocationState::Authorized),
            created_before_ms: Some(T0 + 800),
            ..HoldFilter::default()
        },
    ];
    for filter in &filters {
        let expected = reference.all_holds(filter);
        for limit in [1, 4, 1_000] {
            let mut pages: Vec<Vec<(FamilyId, Hold)>> = Vec::new();
            let mut after = None;
            loop {
                let filter = HoldFilter {
                    after: after.clone(),
                    ..filter.clone()
                };
                let page = families::read(shared, |r| {
                    r.list_holds(None, &every_family, &filter, limit)
                })
                .await?;
                let full = page.len() == limit;
                after = page.last().map(|(f, h)| HoldPosition::of(f, h));
                pages.push(page);
                if !full {
                    break;
                }
            }
            let chunks: Vec<_> = expected.chunks(limit).map(<[_]>::to_vec).collect();
            let pages: Vec<_> = pages.into_iter().filter(|p| !p.is_empty()).collect();
            assert!(
                pages == chunks,
                "{phase}: {filter:?} in pages of {limit}:\n got {:?}\nwant {:?}",
                pages.iter().map(|p| named(p)).collect::<Vec<_>>(),
                chunks.iter().map(|p| named(p)).collect::<Vec<_>>(),
            );
        }
    }
    let router = shared.lock().await;
    if router.families_uncounted() == 0 {
        assert_eq!(
            router.families_with_live_holds(),
            reference.families_with_live_holds(),
            "{phase}: the hold index"
        );
    }
    Ok(())
}

/// `ListHolds` without a family reads only the families the hold index names, and answers
/// exactly what a scan of every family answers: with every filter, page by page, with most
/// families passivated, as holds open, end and are archived, and after a restore, both
/// before the restored families are counted and after `rebuild_hold_index` counted them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_holds_reads_the_hold_index_and_answers_like_a_scan_of_every_family(
) -> anyhow::Result<()> {
    let mut reference = Reference::default();
    let short = ClusterParams {
        retention_ms: 3_000,
        ..ClusterParams::default()
    };
    let mut entries = vec![set_params(1, T0, short)];
    entries.extend(hold_phase(1, 2, T0));
    reference.apply(&entries);
    let next = entries.len() as u64 + 1;
    let shared = Mutex::new(router(3));
    shared.lock().await.apply(entries).await?;
    {
        let router = shared.lock().await;
        assert!(
            router.passivated_families() >= 10,
            "most families are passivated"
        );
        assert_eq!(router.families_uncounted(), 0);
    }
    assert_eq!(
        reference.families_with_live_holds().len(),
        12,
        "every family but the denied-only ones holds live holds"
    );
    for state in [
        InvocationState::Authorized,
        InvocationState::Captured,
        InvocationState::Reversed,
    ] {
        let filter = HoldFilter {
            state: Some(state),
            ..HoldFilter::default()
        };
        assert!(
            !reference.all_holds(&filter).is_empty(),
            "no {state:?} hold"
        );
    }
    assert_hold_lists_match(&shared, &reference, "open, final and expired").await?;

    let archiving = hold_phase(2, next, T0);
    let next = next + archiving.len() as u64;
    reference.apply(&archiving);
    shared.lock().await.apply(archiving).await?;
    assert_eq!(
        reference.families_with_live_holds(),
        [0, 5, 10].map(family).to_vec(),
        "final holds are archived: only open ones are left"
    );
    assert_hold_lists_match(&shared, &reference, "after archiving").await?;

    let snapshot = shared.lock().await.snapshot().await?;
    let restored = Mutex::new(FamilyRouter::restore(RouterConfig::default(), snapshot)?);
    assert_eq!(restored.lock().await.families_uncounted(), 15);
    assert!(restored.lock().await.families_with_live_holds().is_empty());
    assert_hold_lists_match(&restored, &reference, "restored, uncounted").await?;
    let late = hold_phase(3, next, T0 + 80_000);
    reference.apply(&late);
    restored.lock().await.apply(late.clone()).await?;
    assert_eq!(
        restored.lock().await.families_uncounted(),
        11,
        "an apply counts its families"
    );
    assert_hold_lists_match(&restored, &reference, "restored, partly counted").await?;
    assert_eq!(families::rebuild_hold_index(&restored).await?, 11);
    assert_eq!(restored.lock().await.families_uncounted(), 0);
    assert_eq!(
        families::rebuild_hold_index(&restored).await?,
        0,
        "nothing left"
    );
    assert_hold_lists_match(&restored, &reference, "restored and rebuilt").await?;

    // The router that never restored got the same entries: the same index.
    shared.lock().await.apply(late).await?;
    assert_hold_lists_match(&shared, &reference, "late holds").await?;
    assert_eq!(
        shared.lock().await.families_with_live_holds(),
        restored.lock().await.families_with_live_holds()
    );
    assert_eq!(
        shared.lock().await.digest().await?,
        restored.lock().await.digest().await?,
        "the index is not replicated state"
    );
    Ok(())
}
