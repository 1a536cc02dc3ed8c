//! The memory budget (docs/spec.md §5.5): a router that spills families to its family store by
//! footprint answers, reads and digests exactly like one that keeps every family in memory,
//! whatever the spilling (random workloads, several seeds), and keeps its live families within
//! the budget.

mod router_support;

use router_support::*;
use tally_authority::families::{
    self, every_family, EntryInput, FamilyRouter, FamilyStore, RouterConfig,
};
use tally_ledger::HoldFilter;
use tokio::sync::Mutex;

/// Live families' footprint the tiny router may keep: a handful of small families.
const TINY_BUDGET_BYTES: usize = 24 * 1024;
const FAMILIES: usize = 40;

/// A small deterministic generator (no randomness in what is compared, only in the shape).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// Entries that each touch a random few families with authorize, capture, reconcile, replays
/// and denials, so which families are live when differs from seed to seed.
fn random_entries(seed: u64, count: usize) -> Vec<EntryInput> {
    let mut lcg = Lcg(seed);
    let mut out = Vec::new();
    for e in 0..count {
        let index = e as u64 + 1;
        let now = T0 + e as u64 * 50;
        let mut commands = Vec::new();
        for _ in 0..=lcg.next(4) {
            let f = lcg.next(FAMILIES as u64) as usize;
            let fam = family(f);
            let hold = format!("h-{index}-{f}");
            match lcg.next(5) {
                0 => commands.push(authorize(&fam, &hold, 10, now, None)),
                1 => commands.push(authorize(&fam, &hold, 1_000, now, None)),
                2 => {
                    commands.push(authorize(&fam, &hold, 5, now, Some(30_000)));
                    commands.push(capture(&fam, &hold, now));
                    commands.push(reconcile(&fam, &hold, 5, 3, now));
                }
                3 => {
                    let earlier = format!("h-{}-{f}", lcg.next(index) + 1);
                    commands.push(authorize(&fam, &earlier, 5, now, Some(30_000)));
                }
                _ => commands.push(capture(&fam, &format!("h-{}-{f}", index - 1), now)),
            }
        }
        out.push(entry(index, now, commands));
    }
    out
}

fn roomy() -> FamilyRouter {
    FamilyRouter::new(RouterConfig::default()).expect("config")
}

fn tiny(store: FamilyStore) -> FamilyRouter {
    let config = RouterConfig {
        max_live_bytes: TINY_BUDGET_BYTES,
        min_idle_entries_to_spill: 0,
        ..RouterConfig::default()
    };
    FamilyRouter::with_store(config, store).expect("config")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_budget_spills_to_disk_and_answers_like_a_roomy_router() -> anyhow::Result<()> {
    for seed in 1..=6 {
        let dir = tempfile::tempdir()?;
        let store = FamilyStore::create(&dir.path().join("families.redb"), 0)?;
        let mut reference = roomy();
        let mut spilling = tiny(store.clone());
        let entries = random_entries(seed, 120);
        let mut lcg = Lcg(seed ^ 0xfeed);
        let mut rest = entries.as_slice();
        while !rest.is_empty() {
            let take = (lcg.next(6) as usize + 1).min(rest.len());
            let (chunk, after) = rest.split_at(take);
            rest = after;
            let expected = reference.apply(chunk.to_vec()).await?;
            let got = spilling.apply(chunk.to_vec()).await?;
            assert_eq!(got, expected, "seed {seed}: answers differ");
            assert!(
                spilling.live_footprint_bytes() <= TINY_BUDGET_BYTES
                    || spilling.live_actors() <= chunk.len() * 5,
                "seed {seed}: {} live bytes in {} live families, over the budget and not all \
                 of the last round",
                spilling.live_footprint_bytes(),
                spilling.live_actors()
            );
        }
        assert_eq!(
            spilling.digest().await?,
            reference.digest().await?,
            "seed {seed}"
        );
        assert!(
            spilling.passivated_families() > FAMILIES / 2,
            "seed {seed}: the budget must spill most families, spilled {}",
            spilling.passivated_families()
        );
        assert_eq!(reference.passivated_families(), 0);
        assert!(
            store.reads() > 0,
            "seed {seed}: families came back from disk"
        );
        assert!(store.file_bytes().unwrap_or(0) > 0);

        let (reference, spilling) = (Mutex::new(reference), Mutex::new(spilling));
        let usages = |r: &FamilyRouter| r.list_usages(None, &every_family, None, None, 10_000);
        assert_eq!(
            families::read(&spilling, usages).await?,
            families::read(&reference, usages).await?,
            "seed {seed}: usages"
        );
        let holds =
            |r: &FamilyRouter| r.list_holds(None, &every_family, &HoldFilter::default(), 10_000);
        assert_eq!(
            families::read(&spilling, holds).await?,
            families::read(&reference, holds).await?,
            "seed {seed}: holds"
        );
        let spilled = spilling.lock().await.snapshot().await?;
        assert_eq!(
            spilled,
            reference.lock().await.snapshot().await?,
            "seed {seed}: snapshots byte for byte"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_family_larger_than_the_budget_stays_live_alone() -> anyhow::Result<()> {
    let config = RouterConfig {
        max_live_bytes: 1,
        min_idle_entries_to_spill: 0,
        ..RouterConfig::default()
    };
    let mut router = FamilyRouter::new(config)?;
    let fam = family(1);
    for index in 1..=3u64 {
        let now = T0 + index;
        let hold = format!("h-{index}");
        router
            .apply(vec![entry(
                index,
                now,
                vec![authorize(&fam, &hold, 5, now, None)],
            )])
            .await?;
        assert_eq!(
            (router.live_actors(), router.passivated_families()),
            (1, 0),
            "the family used by the round just applied is not spilled"
        );
    }
    let other = family(2);
    router
        .apply(vec![entry(
            4,
            T0 + 4,
            vec![authorize(&other, "h", 5, T0 + 4, None)],
        )])
        .await?;
    assert_eq!(
        (router.live_actors(), router.passivated_families()),
        (1, 1),
        "the older family went to the store"
    );
    assert!(router.store().reads() == 0, "nothing had to come back yet");
    router
        .apply(vec![entry(
            5,
            T0 + 5,
            vec![authorize(&fam, "h-5", 5, T0 + 5, None)],
        )])
        .await?;
    assert_eq!(
        router.store().reads(),
        1,
        "the family came back from the store"
    );
    Ok(())
}

/// A snapshot streamed from a cut has exactly `RouterSnapshot::to_bytes`'s bytes and the
/// router's digest; read back into a store it restores that digest; a stream altered in any
/// way is refused or gives another digest (what the receiver checks against the sender's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_snapshot_restores_the_same_state_and_a_changed_one_is_caught(
) -> anyhow::Result<()> {
    use tally_authority::families::snapshot_stream::{digest_of, restore_from, write_cut};

    let dir = tempfile::tempdir()?;
    let mut router = tiny(FamilyStore::create(&dir.path().join("a.redb"), 0)?);
    for entry in random_entries(7, 80) {
        router.apply(vec![entry]).await?;
    }
    assert!(router.passivated_families() > 0 && router.live_actors() > 0);
    let digest = router.digest().await?;
    let whole = router.snapshot().await?.to_bytes()?;
    let cut = router.cut().await?;
    let (streamed, streamed_digest) = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        write_cut(cut, &mut out).map(|digest| (out, digest))
    })
    .await??;
    assert_eq!(streamed, whole, "the stream is the snapshot's bytes");
    assert_eq!(streamed_digest, digest);

    let store = FamilyStore::create(&dir.path().join("b.redb"), 0)?;
    let (mut restored, read_digest) =
        restore_from(RouterConfig::default(), &mut streamed.as_slice(), store)?;
    assert_eq!(read_digest, digest);
    assert_eq!(restored.digest().await?, digest);
    assert_eq!(
        restored.live_actors(),
        0,
        "every family starts in the store"
    );
    let more = random_entries(8, 100).split_off(80);
    restored.apply(more.clone()).await?;
    router.apply(more).await?;
    assert_eq!(
        restored.digest().await?,
        router.digest().await?,
        "the same future"
    );

    // One byte changed near the end (inside the last family's bytes): it still decodes, but
    // to another state.
    let mut changed = streamed.clone();
    let at = changed.len() - 2;
    changed[at] ^= 1;
    if let Ok(other) = digest_of(&mut changed.as_slice()) {
        assert_ne!(other, digest, "a changed family changes the digest");
    }
    let mut cut_short = streamed.clone();
    cut_short.truncate(streamed.len() - 1);
    assert!(
        digest_of(&mut cut_short.as_slice()).is_err(),
        "a short stream"
    );
    let mut longer = streamed.clone();
    longer.push(0);
    assert!(
        digest_of(&mut longer.as_slice()).is_err(),
        "bytes after the end"
    );
    Ok(())
}

/// A family used in the last `min_idle_entries_to_spill` entries stays in memory whatever the
/// budget says (spilling one in use costs more than it saves); once idle longer, it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn families_in_recent_use_are_not_spilled_for_bytes() -> anyhow::Result<()> {
    let config = RouterConfig {
        max_live_bytes: 1,
        min_idle_entries_to_spill: 10,
        ..RouterConfig::default()
    };
    let mut router = FamilyRouter::new(config)?;
    for index in 1..=10u64 {
        let now = T0 + index;
        let fam = family(index as usize % 3);
        router
            .apply(vec![entry(
                index,
                now,
                vec![authorize(&fam, &format!("h-{index}"), 5, now, None)],
            )])
            .await?;
    }
    assert_eq!(
        (router.live_actors(), router.passivated_families()),
        (3, 0),
        "all three families were used in the last 10 entries"
    );
    let now = T0 + 30;
    router
        .apply(vec![entry(
            30,
            now,
            vec![authorize(&family(7), "h-30", 5, now, None)],
        )])
        .await?;
    assert_eq!(
        (router.live_actors(), router.passivated_families()),
        (1, 3),
        "idle for 20 entries, the three are spilled; the one in use stays"
    );
    Ok(())
}

/// Expiry is not use: a family that only an `ExpireHolds` brought back from the store is the
/// first spilled over the budget, however recent the expiry (after a long downtime the first
/// leader expires holds in every family at once), and a live family keeps its place in the
/// LRU order. Expiring their holds answers alike either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn families_only_expiry_touched_are_spilled_at_once() -> anyhow::Result<()> {
    let config = RouterConfig {
        max_live_bytes: 1,
        min_idle_entries_to_spill: 100,
        ..RouterConfig::default()
    };
    let mut both = Alike::new(config)?;
    for f in 0..3usize {
        let now = T0 + f as u64;
        let hold = format!("h-{f}");
        both.apply(vec![entry(
            f as u64 + 1,
            now,
            vec![authorize(&family(f), &hold, 5, now, Some(1_000))],
        )])
        .await?;
    }
    let now = T0 + 10;
    both.apply(vec![entry(
        200,
        now,
        vec![authorize(&family(7), "h-7", 5, now, None)],
    )])
    .await?;
    assert_eq!(
        counts(&both.spilling),
        (1, 3),
        "idle for ~200 entries, the three are spilled"
    );
    let now = T0 + 60_000;
    let expiries = (0..3usize).map(|f| expire(&family(f), now)).collect();
    both.apply(vec![entry(201, now, expiries)]).await?;
    assert_eq!(
        counts(&both.spilling),
        (1, 3),
        "brought back only to expire their holds, the three go again at once"
    );
    both.apply(vec![entry(
        202,
        now,
        vec![authorize(&family(0), "h-0b", 5, now, None)],
    )])
    .await?;
    assert_eq!(
        counts(&both.spilling),
        (2, 2),
        "a client command is use: family 0 stays"
    );
    both.apply(vec![entry(203, now, vec![expire(&family(0), now)])])
        .await?;
    assert_eq!(
        counts(&both.spilling),
        (2, 2),
        "expiring a family in use leaves it in its place"
    );
    Ok(())
}

/// A round that brings back more stored families than a slice holds (the first hold expiry
/// after a long downtime touches every family) answers alike slice by slice, ends in the same
/// state, and leaves every family it only expired spilled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_that_brings_back_every_family_answers_alike_in_slices() -> anyhow::Result<()> {
    const MANY: usize = 300;
    let config = RouterConfig {
        max_live_bytes: 1,
        min_idle_entries_to_spill: 0,
        ..RouterConfig::default()
    };
    let mut both = Alike::new(config)?;
    for f in 0..MANY {
        let (index, now) = (f as u64 + 1, T0 + f as u64);
        let hold = format!("h-{f}");
        let command = authorize(&family(f), &hold, 5, now, Some(1_000));
        both.apply(vec![entry(index, now, vec![command])]).await?;
    }
    assert_eq!(
        counts(&both.spilling),
        (1, MANY - 1),
        "all but the last spilled"
    );
    let now = T0 + 60_000;
    let expiries = (0..MANY).map(|f| expire(&family(f), now)).collect();
    both.apply(vec![entry(MANY as u64 + 1, now, expiries)])
        .await?;
    assert_eq!(
        counts(&both.spilling),
        (0, MANY),
        "every family only expired, so every one is spilled again"
    );
    assert_eq!(both.spilling.digest().await?, both.roomy.digest().await?);
    Ok(())
}

/// Two routers fed the same entries, which must answer alike: one spilling under `config`,
/// one roomy.
struct Alike {
    spilling: FamilyRouter,
    roomy: FamilyRouter,
}

impl Alike {
    fn new(config: RouterConfig) -> anyhow::Result<Self> {
        Ok(Self {
            spilling: FamilyRouter::new(config)?,
            roomy: roomy(),
        })
    }

    async fn apply(&mut self, entries: Vec<EntryInput>) -> anyhow::Result<()> {
        let spilling = self.spilling.apply(entries.clone()).await?;
        let kept = self.roomy.apply(entries).await?;
        assert_eq!(spilling, kept, "answers differ with spilling");
        Ok(())
    }
}

/// `(live, passivated)` families.
fn counts(router: &FamilyRouter) -> (usize, usize) {
    (router.live_actors(), router.passivated_families())
}
