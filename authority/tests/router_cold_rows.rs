//! Rows out of memory (docs/spec.md §5.5): once retention ends, a family's compact dedupe rows
//! and archived holds leave memory for the family store. A router that keeps them on disk,
//! and spills whole families too, answers every command (replays and conflicts on those rows,
//! new commands on archived holds) exactly as the ledger does with the rows in hand, reads
//! them back for `GetEvent` and `GetHold`, digests alike whatever its budget, and carries them
//! through a snapshot that checks each family's rows against its count and digest.

mod router_support;

use router_support::*;
use tally_authority::families::{self, EntryInput, FamilyRouter, FamilyStore, RouterConfig};
use tally_ledger::{
    ClusterParams, ColdKey, Command, Decision, EventLookup, HoldView, LedgerError, Outcome,
    PreconditionCode, CURRENT_RULES,
};
use tokio::sync::Mutex;

const FAMILIES: usize = 6;
const RETENTION_MS: u64 = 1_000;

/// Entries one second apart: new holds run authorize → capture → reconcile, and every few
/// entries an earlier command is sent again (a replay, long after it left memory), a new
/// authorize reuses an old hold id, and a capture names an old hold under a new event id.
/// Every fourth entry also carries an authorize the per-call limit denies, and later one that
/// reuses the hold id an old denial claimed (out of memory from rules version 2).
fn entries(first_index: u64, count: u64, sent: &mut Vec<Command>) -> Vec<EntryInput> {
    let mut out = Vec::new();
    for n in 0..count {
        let index = first_index + n;
        let now = T0 + index * 1_000;
        let fam = family((index as usize) % FAMILIES);
        let hold = format!("h-{index}");
        let mut commands = vec![
            authorize(&fam, &hold, 10, now, None),
            capture(&fam, &hold, now),
            reconcile(&fam, &hold, 10, 7, now),
        ];
        if index.is_multiple_of(3) && !sent.is_empty() {
            let earlier = sent[(index as usize * 7) % sent.len()].clone();
            commands.push(earlier);
        }
        if index.is_multiple_of(5) && index > 100 {
            let old_hold = format!("h-{}", index - 90);
            let old_family = family(((index - 90) as usize) % FAMILIES);
            let mut reuse = authorize(&old_family, &old_hold, 10, now, None);
            let mut late_capture = capture(&old_family, &old_hold, now);
            for (command, id) in [(&mut reuse, "again"), (&mut late_capture, "late")] {
                if let Command::Apply(c) = command {
                    c.header.event_id = format!("{old_hold}:{id}").as_str().into();
                }
            }
            commands.push(reuse);
            commands.push(late_capture);
        }
        sent.extend(commands.iter().take(3).cloned());
        if index.is_multiple_of(4) {
            let denied = authorize(&fam, &format!("d-{index}"), 500, now, None);
            sent.push(denied.clone());
            commands.push(denied);
            if index > 100 {
                let old = index - 88;
                let old_family = family((old as usize) % FAMILIES);
                let mut reuse = authorize(&old_family, &format!("d-{old}"), 10, now, None);
                if let Command::Apply(c) = &mut reuse {
                    c.header.event_id = format!("d-{old}:again").as_str().into();
                }
                commands.push(reuse);
            }
        }
        out.push(entry(index, now, commands));
    }
    out
}

fn short_retention(index: u64) -> EntryInput {
    set_params(
        index,
        T0 + index * 1_000,
        ClusterParams {
            retention_ms: RETENTION_MS,
            ..ClusterParams::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_out_of_memory_answer_like_the_ledger_and_survive_a_snapshot() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = FamilyStore::create(&dir.path().join("families.redb"), 0)?;
    let config = RouterConfig {
        max_live_bytes: 16 * 1024,
        min_idle_entries_to_spill: 0,
        ..RouterConfig::default()
    };
    let mut router = FamilyRouter::with_store(config, store.clone())?;
    // The default budget keeps every family live: only rows leave memory there.
    let mut roomy = FamilyRouter::new(RouterConfig::default())?;
    let mut reference = Reference::default();
    let mut sent = Vec::new();
    let mut all = vec![
        short_retention(1),
        raise_rules(2, T0 + 2_000, CURRENT_RULES),
    ];
    all.extend(entries(3, 240, &mut sent));
    let mut replayed = (0, 0);
    for (n, chunk) in all.chunks(3).enumerate() {
        if n % 10 == 9 {
            // Rows reach disk a few MiB at a time, one run per flush; this test has far
            // fewer, so it writes them out now and then, and later rounds read some from
            // runs, and from runs merged together.
            store.flush_cold_rows()?;
        }
        let expected = reference.apply(chunk);
        let got = router.apply(chunk.to_vec()).await?;
        assert_eq!(
            roomy.apply(chunk.to_vec()).await?,
            got,
            "the budget changed an answer"
        );
        for (got, expected) in got.iter().zip(&expected) {
            assert_eq!(&got.results, expected, "entry {:?}", got.log_id);
            count_outcomes(expected, &mut replayed);
        }
    }
    let rows = router.cold_rows();
    assert!(rows > 200, "only {rows} rows left memory");
    let (runs, merges) = store.cold_run_counts();
    assert!(
        merges >= 1 && runs >= 1,
        "rows were read from merged runs ({runs} runs, {merges} merges)"
    );
    // Which rows leave memory follows from the log, not the budget (docs/spec.md §5.5): a
    // replica that spills whole families digests and counts alike.
    assert_eq!(roomy.digest().await?, router.digest().await?);
    assert_eq!(roomy.cold_rows(), rows);
    assert_eq!(roomy.passivated_families(), 0);
    assert!(store.cold_reads() > 0, "replays read rows back from disk");
    assert!(
        router.passivated_families() > 0,
        "whole families spilled too"
    );
    let (looked_up, passed) = router.cold_lookups();
    assert!(
        passed * 4 < looked_up,
        "the filters passed {passed} of {looked_up} ids to the store"
    );

    // Replays of rows out of memory answered their first decision; reuse and late captures
    // were refused definitely (the reference agreed, above).
    assert!(replayed.0 > 20, "{} replays", replayed.0);
    assert!(replayed.1 > 10, "{} reused hold ids refused", replayed.1);

    // Point reads find rows out of memory.
    let router = Mutex::new(router);
    let fam = family(3);
    let event = "h-3:reconcile".into();
    let lookup = families::read(&router, |r| r.get_event(&fam, &event)).await?;
    let EventLookup::Applied { decision, record } = lookup else {
        panic!("an event out of memory reads as {lookup:?}")
    };
    assert!(record.is_none(), "the full record is compacted");
    assert!(matches!(decision.outcome, Outcome::Reconciled { .. }));
    let hold = "h-3".into();
    let view = families::read(&router, |r| r.get_hold(&fam, &hold)).await?;
    assert!(matches!(view, Some(HoldView::Archived { .. })), "{view:?}");
    // A denied authorize's claim, out of memory since rules version 2, reads as it was.
    let fam = family(4);
    let claim = "d-4".into();
    let view = families::read(&router, |r| r.get_hold(&fam, &claim)).await?;
    assert_eq!(
        view,
        Some(HoldView::Denied {
            hold_id: claim.clone(),
            event_id: "d-4:authorize".into(),
        })
    );
    let key = families::cold_row_key(&fam, &ColdKey::Hold(claim).to_bytes());
    assert!(
        store.view()?.cold_row(&key)?.is_some(),
        "the denied claim is in the store"
    );
    let unknown = "never-sent".into();
    let lookup = families::read(&router, |r| r.get_event(&fam, &unknown)).await?;
    assert_eq!(lookup, EventLookup::Unknown);

    // A snapshot carries the rows; the restored router answers alike from then on.
    let mut router = router.into_inner();
    let snapshot = router.snapshot().await?;
    assert_eq!(
        snapshot
            .cold_rows
            .values()
            .map(|r| r.len() as u64)
            .sum::<u64>(),
        router.cold_rows()
    );
    let mut restored = FamilyRouter::restore(RouterConfig::default(), snapshot.clone())?;
    assert_eq!(restored.digest().await?, router.digest().await?);
    assert_eq!(restored.cold_rows(), router.cold_rows());
    let more = entries(243, 60, &mut sent);
    assert_eq!(
        restored.apply(more.clone()).await?,
        router.apply(more).await?
    );
    assert_eq!(restored.digest().await?, router.digest().await?);

    // A row changed, dropped or added in a snapshot is caught before it restores.
    let mut changed = snapshot.clone();
    let rows = changed.cold_rows.values_mut().next().expect("rows");
    let first = rows.values_mut().next().expect("a row");
    let last = first.len() - 1;
    first[last] ^= 1;
    let refused = FamilyRouter::restore(RouterConfig::default(), changed).err();
    assert!(
        refused
            .as_ref()
            .is_some_and(|e| e.to_string().contains("do not match")),
        "{refused:?}"
    );
    let mut dropped = snapshot;
    let rows = dropped.cold_rows.values_mut().next().expect("rows");
    let key = rows.keys().next().cloned().expect("a row");
    rows.remove(&key);
    assert!(FamilyRouter::restore(RouterConfig::default(), dropped).is_err());
    Ok(())
}

/// Adds up the replays and the refused reuses of old holds among `results`.
fn count_outcomes(results: &[Result<Decision, LedgerError>], counts: &mut (usize, usize)) {
    for result in results {
        match result {
            Ok(decision) if decision.replayed => counts.0 += 1,
            Err(LedgerError::Conflict(_)) => counts.1 += 1,
            Err(LedgerError::FailedPrecondition { code, .. })
                if *code == PreconditionCode::HoldNotAuthorized =>
            {
                counts.1 += 1
            }
            _ => {}
        }
    }
}

/// The filters over rows out of memory cost memory for ever (2 bytes a row), so they leave
/// memory with their passivated family and come back with it: with many families that each
/// have rows, and a budget that keeps a few live, the filters in memory stay those of the live
/// families, within the budget, while every answer (replays of ids long out of memory among
/// them) stays the roomy router's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_leave_memory_with_their_passivated_family() -> anyhow::Result<()> {
    const MANY: usize = 40;
    const BUDGET_BYTES: usize = 16 * 1024;
    let dir = tempfile::tempdir()?;
    let store = FamilyStore::create(&dir.path().join("families.redb"), 0)?;
    let config = RouterConfig {
        max_live_bytes: BUDGET_BYTES,
        min_idle_entries_to_spill: 0,
        ..RouterConfig::default()
    };
    let mut router = FamilyRouter::with_store(config, store)?;
    let mut roomy = FamilyRouter::new(RouterConfig::default())?;
    let mut sent: Vec<Command> = Vec::new();
    let mut all = vec![short_retention(1)];
    for index in 2..60u64 {
        let now = T0 + index * 1_000;
        // Every family in the first entries, then two at a time, and a replay of a command
        // sent long ago (its row out of memory by then) every few entries.
        let families: Vec<usize> = if index < 10 {
            (0..MANY).collect()
        } else {
            vec![index as usize % MANY, (index as usize * 7) % MANY]
        };
        let mut commands = Vec::new();
        for f in families {
            let hold = format!("h-{index}-{f}");
            commands.push(authorize(&family(f), &hold, 10, now, None));
            commands.push(capture(&family(f), &hold, now));
            commands.push(reconcile(&family(f), &hold, 10, 7, now));
        }
        if index > 20 && index.is_multiple_of(3) {
            commands.push(sent[(index as usize * 13) % (MANY * 6)].clone());
        }
        sent.extend(commands.iter().cloned());
        all.push(entry(index, now, commands));
    }
    for chunk in all.chunks(2) {
        let got = router.apply(chunk.to_vec()).await?;
        assert_eq!(
            roomy.apply(chunk.to_vec()).await?,
            got,
            "the budget changed an answer"
        );
    }
    let everyone = roomy.cold_filter_bytes();
    assert!(
        router.cold_rows() == roomy.cold_rows() && everyone >= MANY * 2048,
        "every family has rows out of memory, and a filter of at least 2 KiB: {} rows, {everyone} bytes",
        router.cold_rows()
    );
    assert!(
        router.cold_filter_bytes() <= BUDGET_BYTES,
        "{} bytes of filters in memory over a budget of {BUDGET_BYTES} (all of them: {everyone})",
        router.cold_filter_bytes()
    );
    assert!(
        router.passivated_families() >= MANY - 8,
        "most families passivated"
    );
    assert_eq!(router.digest().await?, roomy.digest().await?);
    Ok(())
}

/// A node's own snapshot links the store's runs instead of copying its rows: a router restored
/// from it (runs taken in by link, filters loaded, no row read) digests and answers like the
/// original, even once the original and its store are gone; expanded for another node it is
/// byte for byte the stream a cut writes; and links that do not hold the rows the families
/// count are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_snapshot_restores_without_reading_rows_and_expands_to_the_stream(
) -> anyhow::Result<()> {
    use tally_authority::families::snapshot_stream::{
        expand_linked, restore_linked, write_cut, write_linked,
    };
    let dir = tempfile::tempdir()?;
    let store = FamilyStore::create(&dir.path().join("families-a.redb"), 0)?;
    let config = RouterConfig {
        max_live_bytes: 16 * 1024,
        min_idle_entries_to_spill: 0,
        ..RouterConfig::default()
    };
    let mut router = FamilyRouter::with_store(config, store.clone())?;
    let mut sent = Vec::new();
    let mut all = vec![short_retention(1)];
    all.extend(entries(2, 200, &mut sent));
    for (n, chunk) in all.chunks(3).enumerate() {
        if n % 10 == 9 {
            store.flush_cold_rows()?;
        }
        router.apply(chunk.to_vec()).await?;
    }
    let (runs, _) = store.cold_run_counts();
    assert!(runs >= 1, "rows on disk in runs");
    let rows = router.cold_rows();
    assert!(rows > 150, "only {rows} rows left memory");

    let mut full = Vec::new();
    let full_digest = write_cut(router.cut().await?, &mut full)?;
    let runs_dir = dir.path().join("snapshot.runs");
    std::fs::create_dir(&runs_dir)?;
    let mut linked = Vec::new();
    let linked_digest = write_linked(router.cut().await?, &mut linked, &runs_dir)?;
    assert_eq!(linked_digest, full_digest);
    assert_eq!(linked_digest, router.digest().await?);
    // It holds the filters (~2 KiB per family here) instead of the rows.
    assert!(
        linked.len() < full.len(),
        "the linked snapshot copies no rows ({} vs {} bytes)",
        linked.len(),
        full.len()
    );
    let linked_runs = std::fs::read_dir(&runs_dir)?.count();
    assert_eq!(
        linked_runs,
        runs + 1,
        "every run, and the buffered rows as one more"
    );

    let mut expanded = Vec::new();
    let expanded_digest = expand_linked(linked.as_slice(), &runs_dir, &mut expanded)?;
    assert_eq!(expanded_digest, full_digest);
    assert!(
        expanded == full,
        "the expansion is the stream, byte for byte"
    );

    let restored_store = FamilyStore::create(&dir.path().join("families-b.redb"), 0)?;
    let (mut restored, digest) = restore_linked(
        RouterConfig::default(),
        &mut linked.as_slice(),
        &runs_dir,
        restored_store.clone(),
    )?;
    assert_eq!(digest, full_digest);
    let adopted: Vec<u64> = (std::fs::read_dir(dir.path())?)
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.to_string_lossy().contains("families-b-rows-"))
        .map(|path| std::os::unix::fs::MetadataExt::nlink(&path.metadata().expect("meta")))
        .collect();
    // Linked from the snapshot (and, but for the buffered rows' run, the original store).
    assert!(
        adopted.len() == linked_runs && adopted.iter().all(|links| *links >= 2),
        "every run taken in by link, none rewritten: {adopted:?}"
    );
    assert_eq!(restored.cold_rows(), rows);
    assert_eq!(
        restored.cold_filter_bytes(),
        0,
        "every family starts passivated, with its filters in the store"
    );
    assert_eq!(restored.digest().await?, full_digest);

    // The original goes (its runs are removed); the restored router reads the links.
    let more = entries(202, 60, &mut sent);
    let more_again = more.clone();
    let expected = router.apply(more.clone()).await?;
    let expected_digest = router.digest().await?;
    drop((router, store));
    assert_eq!(restored.apply(more).await?, expected);
    assert_eq!(restored.digest().await?, expected_digest);
    assert!(restored_store.cold_reads() > 0, "rows read from the links");
    assert!(
        restored.cold_filter_bytes() > 0,
        "the families the entries used have their filters back"
    );
    // With every family passivated, every filter is in the store; a snapshot reads them there.
    restored.passivate_idle(0).await?;
    assert_eq!(restored.live_actors(), 0);
    assert_eq!(restored.cold_filter_bytes(), 0);
    let again_dir = dir.path().join("again.runs");
    std::fs::create_dir(&again_dir)?;
    let mut again = Vec::new();
    write_linked(restored.cut().await?, &mut again, &again_dir)?;
    let (mut twice, digest) = restore_linked(
        RouterConfig::default(),
        &mut again.as_slice(),
        &again_dir,
        FamilyStore::create(&dir.path().join("families-c.redb"), 0)?,
    )?;
    assert_eq!(digest, expected_digest);
    let last = entries(262, 30, &mut sent);
    assert_eq!(
        twice.apply(last.clone()).await?,
        restored.apply(last).await?
    );
    assert_eq!(twice.digest().await?, restored.digest().await?);

    // Filters saved by a build before they were blocked (format 1) are rebuilt from the runs'
    // rows: the router digests and answers as the original did.
    let last_name = format!("{:06}.run", linked_runs - 1);
    let at = (linked.windows(last_name.len()))
        .rposition(|window| window == last_name.as_bytes())
        .expect("the last run's name")
        + last_name.len();
    assert_eq!(
        linked[at..at + 4],
        2u32.to_le_bytes(),
        "the filters' format"
    );
    let mut unblocked = linked.clone();
    unblocked[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
    let (mut rebuilt, digest) = restore_linked(
        RouterConfig::default(),
        &mut unblocked.as_slice(),
        &runs_dir,
        FamilyStore::create(&dir.path().join("families-d.redb"), 0)?,
    )?;
    assert_eq!(digest, full_digest);
    assert_eq!(rebuilt.cold_rows(), rows);
    assert_eq!(rebuilt.apply(more_again).await?, expected);
    assert_eq!(rebuilt.digest().await?, expected_digest);

    // Links that lost a run, or filters cut short, are refused before a router exists.
    let refused = |bytes: &[u8], runs: &std::path::Path, what: &str| {
        let store = FamilyStore::in_memory().expect("store");
        let result = restore_linked(RouterConfig::default(), &mut &bytes[..], runs, store);
        assert!(result.is_err(), "{what} restored");
    };
    refused(&linked[..linked.len() - 9], &runs_dir, "filters cut short");
    std::fs::remove_file(runs_dir.join("000000.run"))?;
    refused(&linked, &runs_dir, "a run missing");
    let expanded = expand_linked(linked.as_slice(), &runs_dir, &mut Vec::new());
    assert!(expanded.is_err(), "expanded without a run");
    Ok(())
}

/// A family that is never idle keeps its filters within their share of the budget: beyond
/// it, the pages of its largest filters go to the page file, lookups of fresh ids read a
/// block of each from disk, keys added to pages on disk wait beside them until they are read
/// back, and every answer (replays of ids long out of memory among them), the digest and a
/// snapshot stay the roomy router's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_family_in_use_keeps_its_filters_within_their_share() -> anyhow::Result<()> {
    use tally_authority::families::snapshot_stream::{restore_from, write_cut};
    const SHARE_BYTES: usize = 32 * 1024;
    let dir = tempfile::tempdir()?;
    let store = FamilyStore::create(&dir.path().join("families.redb"), 0)?;
    let config = RouterConfig {
        max_live_bytes: SHARE_BYTES * 4,
        // Never idle long enough to be spilled: its filters must stay within the share.
        min_idle_entries_to_spill: u64::MAX,
        ..RouterConfig::default()
    };
    let mut router = FamilyRouter::with_store(config, store)?;
    let mut roomy = FamilyRouter::new(RouterConfig::default())?;
    let fam = family(0);
    let mut sent: Vec<Command> = Vec::new();
    let mut all = vec![short_retention(1)];
    for index in 2..200u64 {
        let now = T0 + index * 1_000;
        let mut commands: Vec<Command> = (0..300)
            .map(|k| authorize(&fam, &format!("h-{index}-{k}"), 1, now, Some(500)))
            .collect();
        if sent.len() > 1_000 {
            commands.push(sent[(index as usize * 7_919) % (sent.len() - 1_000)].clone());
        }
        sent.extend(commands.iter().take(300).cloned());
        all.push(entry(index, now, commands));
    }
    let mut most_bytes = 0;
    for chunk in all.chunks(4) {
        let got = router.apply(chunk.to_vec()).await?;
        assert_eq!(
            roomy.apply(chunk.to_vec()).await?,
            got,
            "the share changed an answer"
        );
        most_bytes = most_bytes.max(router.cold_filter_bytes());
    }
    let rows = router.cold_rows();
    let everyone = roomy.cold_filter_bytes();
    assert!(rows > 40_000, "{rows} rows out of memory");
    assert!(
        everyone > 4 * SHARE_BYTES,
        "all the filters: {everyone} bytes"
    );
    let pages = router.filter_pages();
    assert_eq!(pages.share_bytes, SHARE_BYTES);
    // Over the share at most by the pages one round adds before they are written out.
    assert!(
        most_bytes <= 2 * SHARE_BYTES,
        "{most_bytes} bytes of filters in memory at most, share {SHARE_BYTES}"
    );
    assert!(pages.page_writes > 0 && pages.file_bytes > 0, "{pages:?}");
    assert!(pages.block_reads > 0, "fresh ids read blocks: {pages:?}");
    assert!(pages.page_reads > 0, "waiting keys were set: {pages:?}");
    assert_eq!(router.live_actors(), 1, "the family stayed in memory");
    assert_eq!(router.digest().await?, roomy.digest().await?);
    let (lookups, passed) = router.cold_lookups();
    assert!(
        passed < lookups / 50,
        "{passed} of {lookups} lookups went to the store"
    );

    // A snapshot cut with pages on disk is the roomy router's, byte for byte.
    let (mut mine, mut theirs) = (Vec::new(), Vec::new());
    write_cut(router.cut().await?, &mut mine)?;
    write_cut(roomy.cut().await?, &mut theirs)?;
    assert!(mine == theirs, "the same snapshot");
    let (mut restored, _) = restore_from(
        config,
        &mut mine.as_slice(),
        FamilyStore::create(&dir.path().join("restored.redb"), 0)?,
    )?;
    let last = vec![entry(
        200,
        T0 + 200_000,
        vec![
            sent[5].clone(),
            authorize(&fam, "fresh", 1, T0 + 200_000, None),
        ],
    )];
    assert_eq!(
        restored.apply(last.clone()).await?,
        roomy.apply(last).await?
    );
    assert_eq!(restored.digest().await?, roomy.digest().await?);
    Ok(())
}
