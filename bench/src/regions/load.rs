//! The callers of one region, run inside that region's caller namespace: a `TallyClient` that
//! knows its region (so it talks to the nodes there, which forward writes and serve reads
//! with one round trip to the leader), and what it measured.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::Rng;
use tally_client::{ClientConfig, Outcome, TallyClient, Transport};
use tally_ledger::{
    AccountKey, BudgetCommitIndex, ClientCommand, CommandHeader, EventId, EventLookup, FamilyId,
    GrantLimits, HoldId, Operation,
};

const CAPABILITY: &str = "regions-cap";

/// The family every region's failover callers spend from: one budget, shared by all regions.
pub const SHARED_FAMILY: &str = "regions-shared";

/// Units each authorize asks for.
pub const UNITS_PER_CALL: u64 = 100;

/// A client of one region: the nodes of its region first, a WAN-sized attempt timeout.
pub fn client(
    endpoints: Vec<String>,
    transport: Transport,
    region: &str,
) -> anyhow::Result<Arc<TallyClient>> {
    let mut config = ClientConfig::new(endpoints, transport);
    config.region = Some(region.to_owned());
    // Ten times the widest round trip: an attempt sent to a node that was just cut off is
    // given up soon enough that the retry finds the new leader.
    config.attempt_timeout = Duration::from_secs(1);
    config.retry_for = Duration::from_secs(30);
    config.resolve_for = Duration::from_secs(30);
    Ok(Arc::new(TallyClient::new(config)?))
}

/// An authorize of `UNITS_PER_CALL` on `family` under a total limit, with a fresh event id.
fn authorize(family: &FamilyId, total_limit_units: u64) -> ClientCommand {
    let tag: u128 = rand::rng().random();
    let hold_id: HoldId = format!("hold-{tag:032x}").into();
    ClientCommand {
        header: CommandHeader {
            family_id: family.clone(),
            capability_id: CAPABILITY.into(),
            grant_index: 0,
            event_id: format!("authorize-{tag:032x}").into(),
            not_after_ms: tally_client::wall_clock_ms() + 60_000,
        },
        op: Operation::AuthorizeHold {
            hold_id,
            requested_exposure_units: UNITS_PER_CALL,
            limits: GrantLimits::monetary(
                None,
                Some(UNITS_PER_CALL),
                Some(total_limit_units),
                "USD",
            ),
            ancestors: vec![],
            // Longer than the run: no hold expires, so the shared family's exposure only grows.
            hold_timeout_ms: Some(3_600_000),
        },
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid bounds")
}

/// Write and read latencies of one region's callers, in microseconds.
pub struct RegionLatency {
    pub writes: Histogram<u64>,
    pub reads: Histogram<u64>,
    pub failed: u64,
}

/// `callers` callers, each on a family of its own, each writing (authorize) then reading back
/// (linearizable `GetEvent`) until `until`; calls that start before `measure_from` warm up
/// connections and are not counted.
pub async fn latency(
    client: Arc<TallyClient>,
    region: String,
    callers: usize,
    measure_from: Instant,
    until: Instant,
) -> anyhow::Result<RegionLatency> {
    let measured = Arc::new(Mutex::new(RegionLatency {
        writes: histogram(),
        reads: histogram(),
        failed: 0,
    }));
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let (client, measured) = (client.clone(), measured.clone());
        let family: FamilyId = format!("regions-{region}-{caller}").into();
        tasks.spawn(async move {
            while Instant::now() < until {
                let command = authorize(&family, u64::MAX / 2);
                let event_id = command.header.event_id.clone();
                let began = Instant::now();
                let outcome = client.submit(command).await;
                let wrote = Instant::now();
                let read = match outcome {
                    Outcome::Decided(_) => client.get_event(&family, &event_id).await.ok(),
                    _ => None,
                };
                let done = Instant::now();
                let mut m = measured.lock().unwrap_or_else(|p| p.into_inner());
                match read {
                    Some(EventLookup::Applied { .. }) if began >= measure_from => {
                        let _ = m.writes.record(micros(wrote - began));
                        let _ = m.reads.record(micros(done - wrote));
                    }
                    Some(EventLookup::Applied { .. }) => {}
                    _ => m.failed += 1,
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    Arc::try_unwrap(measured)
        .map_err(|_| anyhow::anyhow!("a caller outlived the load"))
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
}

fn micros(elapsed: Duration) -> u64 {
    (elapsed.as_micros() as u64).max(1)
}

/// A write that was acknowledged: what must still be there at the end.
#[derive(Clone, Debug)]
pub struct Acked {
    pub event_id: EventId,
    pub commit_index: Option<BudgetCommitIndex>,
    /// The term of the leader that committed it.
    pub term: u64,
    pub authorized: bool,
    /// When the caller got it, seconds since the run's epoch.
    pub at_s: f64,
}

/// What one region's failover callers saw.
#[derive(Default)]
pub struct FailoverLoad {
    pub acked: Vec<Acked>,
    /// Writes that ended `Unknown`: resolved by the client with `ResolveEvent` first, so
    /// these are the ones it could not settle even then.
    pub unknown: u64,
    /// Writes no node would take before the client's deadline (not applied).
    pub unavailable: u64,
}

/// `callers` callers authorizing on the shared family (total `limit_units`) until `until`.
pub async fn failover(
    client: Arc<TallyClient>,
    callers: usize,
    limit_units: u64,
    epoch: Instant,
    until: Instant,
) -> anyhow::Result<FailoverLoad> {
    let seen = Arc::new(Mutex::new(FailoverLoad::default()));
    let family: FamilyId = SHARED_FAMILY.into();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let (client, seen, family) = (client.clone(), seen.clone(), family.clone());
        tasks.spawn(async move {
            while Instant::now() < until {
                let outcome = client.submit(authorize(&family, limit_units)).await;
                let at_s = epoch.elapsed().as_secs_f64();
                let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
                match outcome {
                    Outcome::Decided(decision) => s.acked.push(Acked {
                        authorized: matches!(
                            decision.outcome,
                            tally_ledger::Outcome::Authorized { .. }
                        ),
                        term: decision.log_id.map_or(0, |log| log.term),
                        event_id: decision.event_id,
                        commit_index: decision.commit_index,
                        at_s,
                    }),
                    Outcome::Unknown { .. } => s.unknown += 1,
                    _ => s.unavailable += 1,
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    Arc::try_unwrap(seen)
        .map_err(|_| anyhow::anyhow!("a caller outlived the load"))
        .map(|s| s.into_inner().unwrap_or_else(|p| p.into_inner()))
}

/// What the cluster says of the acknowledged writes after the run.
#[derive(Debug, Default, serde::Serialize)]
pub struct Audit {
    pub acknowledged: usize,
    /// Acknowledged but missing, or found with another commit index.
    pub lost: usize,
    pub authorized_acknowledged: usize,
    /// Exposure of the shared family's account, and its limit.
    pub exposed_units: u64,
    pub limit_units: u64,
}

impl Audit {
    pub fn overspent(&self) -> bool {
        self.exposed_units > self.limit_units
            || self.authorized_acknowledged as u64 * UNITS_PER_CALL > self.limit_units
    }
}

/// Reads back every acknowledged write (linearizable `GetEvent`, 32 at a time) and the shared
/// account.
pub async fn audit(
    client: Arc<TallyClient>,
    acked: Vec<Acked>,
    limit_units: u64,
) -> anyhow::Result<Audit> {
    let family: FamilyId = SHARED_FAMILY.into();
    let mut audit = Audit {
        acknowledged: acked.len(),
        authorized_acknowledged: acked.iter().filter(|a| a.authorized).count(),
        limit_units,
        ..Audit::default()
    };
    for chunk in acked.chunks(32) {
        let mut reads = tokio::task::JoinSet::new();
        for write in chunk.iter().cloned() {
            let (client, family) = (client.clone(), family.clone());
            reads.spawn(async move {
                match client.get_event(&family, &write.event_id).await {
                    Ok(EventLookup::Applied { decision, .. }) => {
                        Ok(decision.commit_index == write.commit_index)
                    }
                    Ok(_) => Ok(false),
                    Err(error) => Err(anyhow::anyhow!("reading {}: {error}", write.event_id)),
                }
            });
        }
        while let Some(found) = reads.join_next().await {
            if !found?? {
                audit.lost += 1;
            }
        }
    }
    let usage = client
        .get_usage(&family, &AccountKey::new(CAPABILITY, 0))
        .await
        .map_err(|e| anyhow::anyhow!("reading the shared account: {e}"))?;
    audit.exposed_units = usage.map_or(0, |u| {
        u.account.total_cost_exposed_units + u.account.total_cost_realized_spend_units
    });
    Ok(audit)
}
