//! The family router against a bare-ledger reference: ordering, commit indexes, snapshots,
//! passivation, cluster time, parameters, expiry scheduling and fatal family failures.

mod router_support;

use router_support::*;
use tally_authority::families::{
    EntryOutput, FamilyRouter, RouterConfig, RouterError, RouterSnapshot,
};
use tally_ledger::limits::MAX_LOG_INDEX;
use tally_ledger::{
    AccountKey, BudgetCommitIndex, ClusterParams, Command, HoldFilter, HoldView, InvocationState,
    LedgerError, Outcome,
};

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

    let snapshot = cut.encode();
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
    let usages = router.list_usages(None, None, None, 100).await?;
    let order: Vec<_> = usages.iter().map(|(f, _)| f.clone()).collect();
    assert_eq!(
        order,
        (0..5).rev().map(family).collect::<Vec<_>>(),
        "newest first"
    );
    let holds = router.list_holds(None, &HoldFilter::default(), 3).await?;
    let order: Vec<_> = holds.iter().map(|(f, _)| f.clone()).collect();
    assert_eq!(
        order,
        (0..3).map(family).collect::<Vec<_>>(),
        "oldest first"
    );
    assert_eq!(
        router
            .list_usages(Some(&family(4)), None, None, 100)
            .await?
            .len(),
        1
    );
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
