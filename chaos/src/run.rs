//! One chaos run, start to verdict: cluster up (and, unless disabled, two kernel processes
//! with a shared rail and tool server), workloads and nemeses for the profile's
//! duration, heal, liveness (resolve every unknown), convergence, final reads from every
//! replica, the checker, and the reports. Every phase is bounded in time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tally_client::TallyClient;
use tally_ledger::{EventId, EventLookup, FamilyId};

use crate::checker::{self, CheckInput, ReplicaState};
use crate::cluster::ChaosCluster;
use crate::history::{Recorder, Resolution, Settlement};
use crate::journal::JournalFollower;
use crate::kernel::KernelFleet;
use crate::kernel_workload::{self, KernelHistory, KernelOp, KernelWorkloadConfig};
use crate::leader_watch::{leader_changes, LeaderWatch};
use crate::nemesis::{self, FaultKind, Nemesis};
use crate::profile::Profile;
use crate::report::{self, KernelFigures, RunReport};
use crate::workload;

/// How long in-flight requests get to finish once the workload is told to stop.
const DRAIN: Duration = Duration::from_secs(60);
/// How long the healed cluster gets for a leader, for resolving, for converging.
const LIVENESS: Duration = Duration::from_secs(60);
/// Unknowns resolved at once.
const RESOLVE_CONCURRENCY: usize = 8;
/// Final-read rounds until every replica is read at one applied index.
const READ_ROUNDS: usize = 30;
/// Kernel node processes in a run with the kernel layer.
const KERNELS: u64 = 2;
/// `GetEvent` lookups at once when cross-checking receipts, and tries per event.
const LOOKUP_CONCURRENCY: usize = 8;
const LOOKUP_TRIES: usize = 3;

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub profile: Profile,
    pub seed: u64,
    pub out: PathBuf,
    pub node_binary: PathBuf,
    /// The kernel binary (`chaos-kernel`); none runs without the kernel layer.
    pub kernel_binary: Option<PathBuf>,
}

impl RunOptions {
    /// The command line that replays this run.
    pub fn repro(&self) -> String {
        format!(
            "cargo run -p tally-chaos --bin tally-chaos -- run --profile {} --seed {} --duration-s {} --nodes {}{}",
            self.profile.name.as_str(),
            self.seed,
            self.profile.duration_s,
            self.profile.nodes,
            if self.kernel_binary.is_none() { " --no-kernels" } else { "" }
        )
    }
}

/// Runs the whole thing; the report says whether every invariant held.
pub async fn run(options: &RunOptions) -> anyhow::Result<RunReport> {
    let started = Instant::now();
    let out = &options.out;
    prepare_dir(out)?;
    let profile = &options.profile;
    let mut cluster = ChaosCluster::start(
        &options.node_binary,
        &out.join("data"),
        profile.nodes,
        profile.snapshot_every_entries,
        profile.max_live_families,
    )
    .await
    .context("start the cluster")?;
    if let Some(retention_ms) = profile.retention_ms {
        cluster
            .set_retention_ms(retention_ms, LIVENESS)
            .await
            .context("set the profile's retention")?;
    }
    let start = Instant::now();
    let recorder = Recorder::new(start);
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watch = LeaderWatch::default();
    let direct: Vec<(u64, String)> = cluster
        .nodes
        .iter()
        .map(|(id, n)| (*id, n.spec.listen.clone()))
        .collect();
    let watcher = watch.spawn(
        direct.clone(),
        cluster.transport("reader")?,
        start,
        stop_watch.clone(),
    );
    let journal = JournalFollower::default();
    let follower = journal.spawn(
        direct,
        cluster.transport("reader")?,
        workload::family_ids(&profile.workload),
        stop_watch.clone(),
    );
    let fleet = match &options.kernel_binary {
        Some(binary) => {
            let (fleet, processes) = KernelFleet::start(
                binary,
                &out.join("kernels"),
                KERNELS,
                cluster.client_endpoints(),
                &cluster.tls_dir,
                options.seed,
            )
            .await
            .context("start the kernel layer")?;
            cluster.kernels = processes;
            Some(fleet)
        }
        None => None,
    };

    // Workload and nemeses, side by side, until the deadline.
    let stop = Arc::new(AtomicBool::new(false));
    let workload = tokio::spawn(workload::run(
        profile.workload.clone(),
        options.seed,
        cluster.client_endpoints(),
        cluster.transport("kernel")?,
        recorder.clone(),
        stop.clone(),
    ));
    let kernel_history = KernelHistory::default();
    let kernel_task = match &fleet {
        Some(fleet) => Some(tokio::spawn(kernel_workload::run(
            KernelWorkloadConfig::default(),
            options.seed,
            fleet.endpoints.clone(),
            kernel_workload::capabilities(&fleet.issuer, &fleet.agent, options.seed)?,
            kernel_history.clone(),
            start,
            stop.clone(),
        ))),
        None => None,
    };
    let deadline = Instant::now() + Duration::from_secs(profile.duration_s);
    let mut nemesis = Nemesis::new(options.seed, start);
    let steps = nemesis::schedule(options.seed, profile.planned_faults());
    nemesis.run(&mut cluster, &steps, deadline).await;
    tokio::time::sleep(deadline.saturating_duration_since(Instant::now())).await;
    nemesis::heal(&mut cluster).await;
    stop.store(true, Ordering::Relaxed);
    match tokio::time::timeout(DRAIN, workload).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(error))) => tracing::warn!(%error, "workload ended with an error"),
        Ok(Err(error)) => tracing::warn!(%error, "workload task failed"),
        Err(_) => tracing::warn!("workload did not drain in time"),
    }
    if let Some(task) = kernel_task {
        match tokio::time::timeout(DRAIN, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => tracing::warn!(%error, "kernel workload ended with an error"),
            Ok(Err(error)) => tracing::warn!(%error, "kernel workload task failed"),
            Err(_) => tracing::warn!("kernel workload did not drain in time"),
        }
    }

    // Liveness: a leader, every unknown resolved, replicas converged.
    nemesis::heal(&mut cluster).await;
    let (liveness, has_leader) = match cluster.wait_leader(LIVENESS).await {
        Ok((leader, term)) => (
            format!("leader {leader} at term {term} after healing"),
            true,
        ),
        Err(error) => (format!("FAILED: {error:#}"), false),
    };
    let history = recorder.snapshot();
    let resolutions = if has_leader {
        resolve_unknowns(&cluster, &history).await?
    } else {
        // Nothing can commit: every unknown stays one, and the checker reports each.
        unresolved(&history, "no leader after healing")
    };
    // Abandoned holds expire 1.5 s after they were opened; let the leader's expiry run.
    tokio::time::sleep(Duration::from_secs(3)).await;
    if has_leader {
        if let Err(error) = cluster.quiet_cluster_time_keeper(LIVENESS).await {
            tracing::warn!(%error, "could not quiet the cluster time keeper before the final read");
        }
    }
    let (replicas, converged) = read_replicas(&cluster, &profile.workload).await;
    // The leader raises the rules once every member reports knowing them (a new cluster's
    // first seconds): under faults too, every node ends on the newest.
    let liveness = format!(
        "{liveness}; rules version by node: {}",
        cluster.rules_versions().await
    );
    stop_watch.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(5), watcher).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), follower).await;
    let (followed, follower) = journal.followed();
    if follower.full || follower.reads_answered == 0 {
        tracing::warn!(
            ?follower,
            "the journal follower stopped or never read: compacted events are checked through \
             GetEvent's compact records only"
        );
    }
    let compacted =
        look_up_compacted(&cluster, &history, &resolutions, &replicas, &followed).await?;

    let kernel_ops = kernel_history.snapshot();
    let kernel_input = match &fleet {
        Some(fleet) => Some(collect_kernel_input(&mut cluster, fleet, &kernel_ops).await?),
        None => None,
    };
    let check = checker::check(&CheckInput {
        history: history.clone(),
        resolutions: resolutions.clone(),
        replicas: replicas.clone(),
        kernels: kernel_input.clone(),
        followed,
        compacted,
    });
    let kernel = match (&fleet, &kernel_input) {
        (Some(fleet), Some(input)) => Some(kernel_figures(fleet, input, &kernel_ops, &nemesis)),
        _ => None,
    };
    let samples = watch.samples();
    let report = RunReport {
        seed: options.seed,
        profile: profile.name.as_str().to_owned(),
        duration_s: profile.duration_s,
        wall_s: started.elapsed().as_secs_f64(),
        repro: options.repro(),
        ops: report::count_ops(&history),
        failpoints_fired: nemesis
            .faults
            .iter()
            .filter(|f| f.detail.contains("aborted at the failpoint"))
            .count(),
        faults: nemesis.faults.clone(),
        leader_changes: leader_changes(&samples),
        journal_follower: follower,
        unknowns: report::count_unknowns(&resolutions),
        liveness,
        converged_at_index: converged,
        digests: replicas
            .iter()
            .map(|r| (r.node_id, r.digest.clone()))
            .collect(),
        check,
        out_dir: out.display().to_string(),
        leader_samples: samples,
        kernel,
    };
    report::write_files(out, &report, &history, &resolutions)
        .with_context(|| format!("write the reports into {}", out.display()))?;
    if !kernel_ops.is_empty() {
        std::fs::write(
            out.join("kernel-history.json"),
            serde_json::to_vec(&kernel_ops)?,
        )?;
    }
    if let Err(error) = crate::timeline::draw(&out.join("timeline.png"), &report, &history) {
        tracing::warn!(%error, "could not draw the timeline");
    }
    drop(cluster);
    if let Some(fleet) = fleet {
        fleet.shutdown().await;
    }
    Ok(report)
}

fn prepare_dir(out: &Path) -> anyhow::Result<()> {
    let data = out.join("data");
    if data.exists() {
        std::fs::remove_dir_all(&data).with_context(|| format!("clear {}", data.display()))?;
    }
    for log in 1..=7 {
        let _ = std::fs::remove_file(out.join(format!("node-{log}.log")));
    }
    std::fs::create_dir_all(&data).with_context(|| format!("create {}", data.display()))?;
    Ok(())
}

/// `ResolveEvent` for every unknown in the history, a few at a time.
async fn resolve_unknowns(
    cluster: &ChaosCluster,
    history: &[crate::history::Op],
) -> anyhow::Result<Vec<Resolution>> {
    let mut config =
        workload::client_config(cluster.client_endpoints(), cluster.transport("kernel")?);
    config.resolve_for = LIVENESS / 2;
    let client = Arc::new(TallyClient::new(config)?);
    // One budget for the whole phase: a cluster that stops answering must end the run with a
    // report, not keep it waiting chunk after chunk.
    let deadline = tokio::time::Instant::now() + LIVENESS;
    let unknowns: Vec<_> = history
        .iter()
        .filter(|op| op.is_unknown())
        .cloned()
        .collect();
    let mut out = Vec::with_capacity(unknowns.len());
    for chunk in unknowns.chunks(RESOLVE_CONCURRENCY) {
        let mut tasks = tokio::task::JoinSet::new();
        for op in chunk {
            let (client, op) = (client.clone(), op.clone());
            tasks.spawn(async move {
                let settlement =
                    match tokio::time::timeout_at(deadline, client.resolve(op.command.clone()))
                        .await
                    {
                        Ok(outcome) => Settlement::from_outcome(&outcome),
                        Err(_) => Settlement::Unresolved {
                            reason: format!("the resolve phase ran out of its {LIVENESS:?}"),
                        },
                    };
                op.settled(settlement)
            });
        }
        while let Some(done) = tasks.join_next().await {
            out.push(done?);
        }
    }
    out.sort_by_key(|r| r.op_index);
    Ok(out)
}

/// Every unknown of `history`, settled as unresolved for `reason`.
fn unresolved(history: &[crate::history::Op], reason: &str) -> Vec<Resolution> {
    history
        .iter()
        .filter(|op| op.is_unknown())
        .map(|op| {
            op.settled(Settlement::Unresolved {
                reason: reason.to_owned(),
            })
        })
        .collect()
}

/// Every replica's final state, read at one applied index: all nodes at once, retried while
/// entries still land (leader maintenance may propose a few after the workload stops), within
/// one `LIVENESS` budget in all: replicas that do not converge are reported, not waited for.
async fn read_replicas(
    cluster: &ChaosCluster,
    workload: &workload::WorkloadConfig,
) -> (Vec<ReplicaState>, Option<u64>) {
    let families = workload::family_ids(workload);
    let mut replicas = Vec::new();
    let mut converged = None;
    let deadline = Instant::now() + LIVENESS;
    for _ in 0..READ_ROUNDS {
        let left = deadline.saturating_duration_since(Instant::now());
        converged = match cluster.wait_converged(left).await {
            Ok(index) => Some(index),
            Err(error) => {
                tracing::warn!(%error, "replicas did not converge");
                None
            }
        };
        let reads = cluster
            .ids()
            .into_iter()
            .map(|id| {
                let families = &families;
                async move { (id, cluster.read_state(id, families).await) }
            })
            .collect::<Vec<_>>();
        replicas.clear();
        for (id, read) in futures_util::future::join_all(reads).await {
            match read {
                Ok(state) => replicas.push(state),
                Err(error) => tracing::warn!(%error, id, "final read failed"),
            }
        }
        let mut after = BTreeMap::new();
        for id in cluster.ids() {
            if let Ok((index, _)) = cluster.digest(id).await {
                after.insert(id, index);
            }
        }
        let stable = replicas.len() == cluster.ids().len()
            && replicas
                .iter()
                .all(|r| after.get(&r.node_id) == Some(&r.applied_index))
            && replicas
                .windows(2)
                .all(|w| w[0].applied_index == w[1].applied_index);
        if stable || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    (replicas, converged)
}

/// Stops the kernels, then gathers what the kernel checks need: every receipt of every log,
/// the tool server's and the rail's counts per request id, and the journal's answer for every
/// event a receipt names.
async fn collect_kernel_input(
    cluster: &mut ChaosCluster,
    fleet: &KernelFleet,
    ops: &[KernelOp],
) -> anyhow::Result<checker::KernelCheckInput> {
    for kernel in cluster.kernels.values_mut() {
        kernel.kill();
    }
    let mut receipts = Vec::new();
    for log in &fleet.receipt_logs {
        if !log.exists() {
            continue;
        }
        let read = tally_kernel::receipt::read_receipts(log)
            .with_context(|| format!("read {}", log.display()))?;
        receipts.extend(read.receipts);
    }
    let dispatches = fleet.tools.snapshot();
    let mut ids: std::collections::BTreeSet<String> =
        ops.iter().map(|op| op.request_id.clone()).collect();
    ids.extend(receipts.iter().map(|r| r.request_id.clone()));
    ids.extend(dispatches.keys().cloned());
    let payments = fleet.payments(&ids);
    let mut wanted = std::collections::BTreeSet::new();
    for receipt in &receipts {
        let (Some(family), Ok(refs)) = (
            &receipt.family_id,
            tally_kernel::receipt::event_refs(&receipt.metadata),
        ) else {
            continue;
        };
        for event in refs {
            wanted.insert((family.clone(), event.event_id));
        }
    }
    let wanted: Vec<_> = wanted.into_iter().collect();
    let journal = get_events(cluster, &wanted)
        .await?
        .into_iter()
        .map(|((_, event_id), found)| (event_id, found))
        .collect();
    Ok(checker::KernelCheckInput {
        receipts,
        kernel_keys: fleet.kernel_keys.clone(),
        dispatches,
        payments,
        journal,
    })
}

/// `GetEvent` (linearizable, through the client) for each of `wanted`, a few at a time, with
/// a few tries each; what no try found is left out.
async fn get_events(
    cluster: &ChaosCluster,
    wanted: &[(FamilyId, EventId)],
) -> anyhow::Result<BTreeMap<(FamilyId, EventId), EventLookup>> {
    let client = Arc::new(TallyClient::new(workload::client_config(
        cluster.client_endpoints(),
        cluster.transport("reader")?,
    ))?);
    let mut found = BTreeMap::new();
    for chunk in wanted.chunks(LOOKUP_CONCURRENCY) {
        let lookups = chunk.iter().map(|(family, event_id)| {
            let client = client.clone();
            async move {
                for _ in 0..LOOKUP_TRIES {
                    if let Ok(lookup) = client.get_event(family, event_id).await {
                        return Some(((family.clone(), event_id.clone()), lookup));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                None
            }
        });
        found.extend(
            futures_util::future::join_all(lookups)
                .await
                .into_iter()
                .flatten(),
        );
    }
    Ok(found)
}

/// The compact records of the history's events that neither the final read of the first
/// replica nor the journal follower saw: compacted before either read them. `GetEvent`
/// answers for them exactly, for ever (docs/spec.md §5.5).
async fn look_up_compacted(
    cluster: &ChaosCluster,
    history: &[crate::history::Op],
    resolutions: &[Resolution],
    replicas: &[ReplicaState],
    followed: &crate::journal::Followed,
) -> anyhow::Result<checker::Compacted> {
    let Some(reference) = replicas.first() else {
        return Ok(checker::Compacted::new());
    };
    let mut seen: std::collections::HashSet<(&str, &str)> = std::collections::HashSet::new();
    for (family, state) in &reference.families {
        seen.extend(
            state
                .events
                .iter()
                .map(|e| (family.as_str(), e.event_id.as_str())),
        );
    }
    for (family, events) in followed {
        seen.extend(
            events
                .values()
                .map(|e| (family.as_str(), e.event_id.as_str())),
        );
    }
    let mut wanted = std::collections::BTreeSet::new();
    let ids = history
        .iter()
        .map(|op| (op.family.as_str(), op.event_id.as_str()))
        .chain(
            resolutions
                .iter()
                .map(|r| (r.family.as_str(), r.event_id.as_str())),
        );
    for (family, event_id) in ids {
        if !seen.contains(&(family, event_id)) {
            wanted.insert((FamilyId::from(family), EventId::from(event_id)));
        }
    }
    let wanted: Vec<_> = wanted.into_iter().collect();
    let mut compacted = checker::Compacted::new();
    for ((family, event_id), lookup) in get_events(cluster, &wanted).await? {
        if let EventLookup::Applied { decision, .. } = lookup {
            if let Some(index) = decision.commit_index {
                compacted
                    .entry(family.to_string())
                    .or_default()
                    .insert(event_id.to_string(), index);
            }
        }
    }
    Ok(compacted)
}

fn kernel_figures(
    fleet: &KernelFleet,
    input: &checker::KernelCheckInput,
    ops: &[KernelOp],
    nemesis: &Nemesis,
) -> KernelFigures {
    let count = |outcome: &str| ops.iter().filter(|op| op.outcome == outcome).count();
    let ids: std::collections::BTreeSet<&str> =
        ops.iter().map(|op| op.request_id.as_str()).collect();
    KernelFigures {
        kernels: fleet.kernel_keys.len(),
        evaluations: ops.len(),
        allows: count("allow"),
        denies: count("deny"),
        errors: count("error"),
        twin_evaluations: ops.iter().filter(|op| op.twin).count(),
        request_ids: ids.len(),
        dispatches: input.dispatches.values().sum(),
        payment_authorizations: input.payments.values().map(|(a, _)| u64::from(*a)).sum(),
        payment_captures: input.payments.values().map(|(_, c)| u64::from(*c)).sum(),
        receipts: input.receipts.len(),
        kernel_kills: nemesis
            .faults
            .iter()
            .filter(|f| f.kind == FaultKind::KillKernel && !f.detail.starts_with("skipped"))
            .count(),
        rail_faults: fleet.rail_faults.clone(),
    }
}
