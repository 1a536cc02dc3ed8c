//! The `tally` operator CLI. Exit codes scripts can rely on: 0 done (a decision, allowed or
//! denied, or a read); 1 no node answered or a node fault; 2 bad usage; 3 refused or definitely
//! not applied; 4 outcome unknown (resolve it later with `tally resolve`).

mod alarm;
pub mod bench;
mod command_args;
mod output;
mod params;

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tally_api::pb;
use tally_ledger::limits::MAX_LIST_LIMIT;
use tally_ledger::{AccountKey, EventId, EventLookup, FamilyId, UsageRecord};

use self::command_args::HoldCommand;
use self::output::{print_decision_outcome, print_json, Table};
use crate::{ClientConfig, Outcome, TallyClient, Transport};

/// Operate a Tally cluster: status, membership, parameters, usage, events, holds, and load.
#[derive(Debug, Parser)]
#[command(name = "tally", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// Cluster endpoints, comma separated; any member will do, the client finds the leader.
    #[arg(
        long,
        global = true,
        env = "TALLY_ENDPOINTS",
        value_delimiter = ',',
        default_value = "127.0.0.1:7401,127.0.0.1:7402,127.0.0.1:7403"
    )]
    pub endpoints: Vec<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// Per-attempt timeout.
    #[arg(long, global = true, default_value_t = 3_000)]
    pub timeout_ms: u64,
    /// Directory of the cluster's CA and client certificates (`tally-node dev` writes
    /// ./tally-data/tls).
    #[arg(
        long,
        global = true,
        env = "TALLY_TLS_DIR",
        default_value = "./tally-data/tls"
    )]
    pub tls_dir: std::path::PathBuf,
    /// The certificate to present (<tls-dir>/<identity>.pem and .key). By default `operator`
    /// for status, members, params and alarm, `reader` for usage, events and get-event, `kernel`
    /// for hold, resolve and bench.
    #[arg(long, global = true, env = "TALLY_IDENTITY")]
    pub identity: Option<String>,
    /// Plaintext, for a cluster started with --insecure.
    #[arg(long, global = true)]
    pub insecure: bool,
    /// The region this client runs in: reads and writes go to a node of this region when
    /// there is one (it forwards writes to the leader).
    #[arg(long, global = true, env = "TALLY_REGION")]
    pub region: Option<String>,
    #[command(subcommand)]
    pub command: TallyCommand,
}

const EXIT_CODES: &str = "Exit codes: 0 done (decision or read), 1 unreachable or node fault, \
2 bad usage, 3 refused / definitely not applied, 4 outcome unknown (resolve it).";

#[derive(Debug, Subcommand)]
pub enum TallyCommand {
    /// Every node's role, term, leader, log indexes, apply lag and memory (what counts against
    /// the families' half of its budget), with warnings for what needs an operator.
    Status,
    /// Add or remove a cluster member.
    #[command(subcommand)]
    Members(MembersCommand),
    /// Usage rows of a family (or one account with --capability and --grant).
    Usage(UsageArgs),
    /// A family's retained events, in commit order.
    Events(EventsArgs),
    /// Send one hold command (authorize, capture, cancel, reverse, release, reconcile).
    #[command(subcommand)]
    Hold(HoldCommand),
    /// Resolve a command whose acknowledgement was lost: same arguments as `tally hold`.
    /// Answers the committed decision, or tombstones it so it can never apply.
    #[command(subcommand)]
    Resolve(HoldCommand),
    /// Look an event id up: applied (with its decision), tombstoned, or unknown.
    GetEvent {
        #[arg(long)]
        family: String,
        #[arg(long)]
        event_id: String,
    },
    /// Show the replicated cluster parameters (retention, clock step), or change them
    /// through the log.
    Params(params::ParamsArgs),
    /// The alarms raised through the log (NoSpace: new holds, charges and nonces are
    /// refused), and clearing them once space is back.
    #[command(subcommand)]
    Alarm(alarm::AlarmCommand),
    /// Drive a load against the cluster and print throughput and latency percentiles.
    Bench(bench::BenchArgs),
}

impl TallyCommand {
    /// The least-privileged dev certificate that can run the command.
    fn default_identity(&self) -> &'static str {
        match self {
            Self::Status | Self::Members(_) | Self::Params(_) | Self::Alarm(_) => "operator",
            Self::Usage(_) | Self::Events(_) | Self::GetEvent { .. } => "reader",
            Self::Hold(_) | Self::Resolve(_) | Self::Bench(_) => "kernel",
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum MembersCommand {
    /// Add a node: first as a learner (it catches up), then as a voter.
    Add {
        #[arg(long)]
        id: u64,
        /// The new node's client port (host:port).
        #[arg(long)]
        address: String,
        /// The new node's peer port (host:port).
        #[arg(long)]
        peer_address: String,
        /// The new node's region.
        #[arg(long)]
        region: String,
        /// Keep it a learner.
        #[arg(long)]
        learner: bool,
    },
    /// Remove a voter from the membership.
    Remove {
        #[arg(long)]
        id: u64,
    },
}

#[derive(Debug, Args)]
pub struct UsageArgs {
    #[arg(long)]
    pub family: Option<String>,
    #[arg(long)]
    pub capability: Option<String>,
    #[arg(long, requires = "capability")]
    pub grant: Option<u32>,
    /// Rows to print at most, most recently updated first; past 10,000 (one page) the rows
    /// are read page by page.
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    #[arg(long)]
    pub family: String,
    #[arg(long)]
    pub capability: Option<String>,
    #[arg(long)]
    pub grant: Option<u32>,
    /// Only events after this budget commit index.
    #[arg(long)]
    pub after: Option<u64>,
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Keep printing new events as they commit (Ctrl-C stops).
    #[arg(long)]
    pub follow: bool,
}

/// Runs a parsed command and returns the process exit code.
pub async fn run(cli: Cli) -> anyhow::Result<u8> {
    // A malformed hold command is bad usage whatever the credentials: answer it first.
    if let TallyCommand::Hold(hold) | TallyCommand::Resolve(hold) = &cli.command {
        if let Err(error) = hold.clone().into_command() {
            return usage_error(error);
        }
    }
    let identity = cli
        .identity
        .clone()
        .unwrap_or_else(|| cli.command.default_identity().to_owned());
    let transport = Transport::from_dir(&cli.tls_dir, &identity, cli.insecure)?;
    if let Some(region) = &cli.region {
        if let Err(error) = tally_ledger::region::validate_region("--region", region) {
            return usage_error(error.into());
        }
    }
    let mut config = ClientConfig::new(cli.endpoints.clone(), transport);
    config.attempt_timeout = Duration::from_millis(cli.timeout_ms);
    config.region = cli.region.clone();
    let client = Arc::new(TallyClient::new(config)?);
    match cli.command {
        TallyCommand::Status => status(&client, cli.json).await,
        TallyCommand::Members(members) => members_command(&client, members).await,
        TallyCommand::Usage(args) => usage(&client, args, cli.json).await,
        TallyCommand::Events(args) => events(&client, args, cli.json).await,
        TallyCommand::Hold(hold) => match hold.into_command() {
            Ok(command) => Ok(print_decision_outcome(
                &client.submit(command).await,
                cli.json,
            )),
            Err(error) => usage_error(error),
        },
        TallyCommand::Resolve(hold) => match hold.into_command() {
            Ok(command) => Ok(print_decision_outcome(
                &client.resolve(command).await,
                cli.json,
            )),
            Err(error) => usage_error(error),
        },
        TallyCommand::GetEvent { family, event_id } => {
            let lookup = client
                .get_event(&FamilyId::from(family), &EventId::from(event_id))
                .await?;
            if cli.json {
                print_json(&lookup);
            } else {
                match &lookup {
                    EventLookup::Applied { decision, record } => {
                        print_decision_outcome(&Outcome::Decided(decision.clone()), false);
                        if record.is_none() {
                            println!("(full record compacted; the answer above is kept for ever)");
                        }
                    }
                    EventLookup::Tombstoned => {
                        println!("tombstoned: it never applied and never will")
                    }
                    EventLookup::Unknown => {
                        println!("unknown: not applied yet; that is NOT a no (resolve it)")
                    }
                }
            }
            Ok(0)
        }
        TallyCommand::Params(args) => params::run(&client, args, cli.json).await,
        TallyCommand::Alarm(command) => alarm::run(&client, command, cli.json).await,
        TallyCommand::Bench(args) => bench::run(client, args, cli.json).await,
    }
}

/// A command that cannot be built is bad usage (exit 2), like a clap error.
fn usage_error(error: anyhow::Error) -> anyhow::Result<u8> {
    eprintln!("tally: {error:#}");
    Ok(2)
}

async fn status(client: &TallyClient, json: bool) -> anyhow::Result<u8> {
    let mut replies = Vec::new();
    let mut failures = 0;
    for endpoint in client.endpoints() {
        match client.status(&endpoint).await {
            Ok(reply) => replies.push((endpoint, Some(reply))),
            Err(error) => {
                failures += 1;
                eprintln!("{endpoint}: {error}");
                replies.push((endpoint, None));
            }
        }
    }
    let leader_last = replies
        .iter()
        .filter_map(|(_, r)| r.as_ref())
        .find(|r| r.role == pb::NodeRole::Leader as i32)
        .and_then(|r| r.last_log_index);
    if json {
        let rows: Vec<serde_json::Value> = replies
            .iter()
            .map(|(endpoint, reply)| match reply {
                Some(r) => serde_json::json!({
                    "endpoint": endpoint, "node_id": r.node_id, "role": role_name(r.role), "term": r.term,
                    "leader_id": r.leader_id, "last_log_index": r.last_log_index, "committed_index": r.committed_index,
                    "applied_index": r.applied_index, "lag": lag(leader_last, r.applied_index), "healthy": r.healthy,
                    "cluster_id": r.cluster_id, "clock_offset_ms": r.clock_offset_ms,
                    "region": region_of(r, r.node_id),
                    "preferred_leader_regions": r.params.as_ref().map(|p| p.preferred_leader_regions.clone()),
                    "leader_in_preferred_region": r.leader_in_preferred_region,
                    "rules_version": r.params.as_ref().map(|p| p.rules_version), "rules_known": r.rules_known,
                    "cluster_time_ms": r.cluster_time_ms, "cluster_time_lag_ms": r.cluster_time_lag_ms,
                    "writes_wait_for_cluster_time": r.writes_wait_for_cluster_time,
                    "alarms": r.alarms.iter().map(|a| serde_json::json!({
                        "kind": alarm::kind_name(a.kind), "node_id": a.node_id, "reason": a.reason,
                        "raised_at_index": a.raised_at_index,
                    })).collect::<Vec<_>>(),
                    "load_shedding": r.load_shedding.as_ref().map(|l| serde_json::json!({
                        "shedding": l.shedding, "oldest_proposal_age_ms": l.oldest_proposal_age_ms,
                        "proposals_pending": l.proposals_pending, "commands_pending": l.commands_pending,
                        "commands_answered_per_s": l.commands_answered_per_s,
                        "shed_after_ms": l.shed_after_ms, "shed_writes": l.shed_writes,
                    })),
                    "memory": r.memory.as_ref().map(|m| serde_json::json!({
                        "budget_bytes": m.budget_bytes, "families_share_bytes": m.families_share_bytes,
                        "families_bytes": m.families_bytes, "filter_bytes": m.filter_bytes,
                        "store_memory_bytes": m.store_memory_bytes,
                        "families_in_memory": m.families_in_memory, "families_on_disk": m.families_on_disk,
                        "process_resident_bytes": m.process_resident_bytes,
                        "heap_in_use_bytes": m.heap_in_use_bytes,
                        "over_budget": memory_over_share(m).is_some(),
                    })),
                }),
                None => serde_json::json!({ "endpoint": endpoint, "error": "unreachable" }),
            })
            .collect();
        print_json(&rows);
    } else {
        let mut table = Table::new(&[
            "ENDPOINT",
            "NODE",
            "REGION",
            "ROLE",
            "TERM",
            "LEADER",
            "LAST LOG",
            "COMMITTED",
            "APPLIED",
            "LAG",
            "HEALTHY",
            "MEMORY",
        ]);
        for (endpoint, reply) in &replies {
            match reply {
                Some(r) => table.row(vec![
                    endpoint.clone(),
                    r.node_id.to_string(),
                    region_of(r, r.node_id).to_owned(),
                    role_name(r.role).to_owned(),
                    r.term.to_string(),
                    opt(r.leader_id),
                    opt(r.last_log_index),
                    opt(r.committed_index),
                    opt(r.applied_index),
                    opt(lag(leader_last, r.applied_index)),
                    r.healthy.to_string(),
                    r.memory
                        .as_ref()
                        .map_or_else(|| "-".to_owned(), memory_cell),
                ]),
                None => table.row(vec![endpoint.clone(), "-".into(), "unreachable".into()]),
            }
        }
        table.print();
        // Replicated: shown once, from the node that has applied most.
        let most_applied = replies
            .iter()
            .filter_map(|(_, r)| r.as_ref())
            .max_by_key(|r| r.applied_index);
        if let Some(line) = most_applied.and_then(placement_line) {
            println!("\n{line}");
        }
        let answered: Vec<&pb::StatusReply> =
            replies.iter().filter_map(|(_, r)| r.as_ref()).collect();
        if let Some(line) = most_applied.and_then(|r| rules_line(r, &answered)) {
            println!("\n{line}");
        }
        let alarms = most_applied.map(|r| r.alarms.clone()).unwrap_or_default();
        if !alarms.is_empty() {
            println!();
            println!(
                "ALARMS RAISED: new holds, charges and nonces are refused (RESOURCE_EXHAUSTED) \
                 until `tally alarm clear`"
            );
            alarm::print_alarms(&alarms);
        }
        for (endpoint, reply) in &replies {
            let shedding = reply.as_ref().and_then(|r| r.load_shedding.as_ref());
            if let Some(line) = shedding.and_then(|s| shedding_line(endpoint, s)) {
                println!("\n{line}");
            }
            if let Some(line) = reply.as_ref().and_then(|r| catching_up_line(endpoint, r)) {
                println!("\n{line}");
            }
            let memory = reply.as_ref().and_then(|r| r.memory.as_ref());
            if let Some(line) = memory.and_then(|m| memory_line(endpoint, m)) {
                println!("\n{line}");
            }
        }
    }
    Ok(if failures == replies.len() { 1 } else { 0 })
}

/// The warning for a node that refuses writes by load shedding, `None` while it takes them.
fn shedding_line(endpoint: &str, shedding: &pb::LoadShedding) -> Option<String> {
    shedding.shedding.then(|| {
        format!(
            "{endpoint} SHEDS WRITES (UNAVAILABLE, definite): its oldest proposal has waited {} \
             ms for commit (shed_after_ms {}), {} proposals of {} commands pending, {} commands \
             answered a second",
            opt(shedding.oldest_proposal_age_ms),
            shedding.shed_after_ms,
            shedding.proposals_pending,
            shedding.commands_pending,
            opt(shedding.commands_answered_per_s)
        )
    })
}

/// The warning for a leader whose writes wait for cluster time to catch up (after downtime),
/// `None` otherwise.
fn catching_up_line(endpoint: &str, reply: &pb::StatusReply) -> Option<String> {
    reply.writes_wait_for_cluster_time.then(|| {
        format!(
            "{endpoint} CATCHES CLUSTER TIME UP: it trails this leader's clock by {} ms; writes \
             wait (then UNAVAILABLE, definite) until it is within a step",
            reply.cluster_time_lag_ms
        )
    })
}

/// The status table's MEMORY cell: what counts against the families' half of the budget, and
/// that half ("412M/512M"), in MiB.
fn memory_cell(memory: &pb::MemoryUse) -> String {
    format!(
        "{}M/{}M",
        mib(memory_counted(memory)),
        mib(memory.families_share_bytes)
    )
}

/// Bytes in MiB, rounded.
fn mib(bytes: u64) -> u64 {
    (bytes + (1 << 19)) >> 20
}

/// What counts against the families' half of the memory budget.
fn memory_counted(memory: &pb::MemoryUse) -> u64 {
    memory
        .families_bytes
        .saturating_add(memory.filter_bytes)
        .saturating_add(memory.store_memory_bytes)
}

/// What counts against the families' share of the memory budget, when it passes the share.
fn memory_over_share(memory: &pb::MemoryUse) -> Option<u64> {
    let used = memory_counted(memory);
    (used > memory.families_share_bytes).then_some(used)
}

/// The warning for a node whose families hold more than their share of its memory budget
/// (families in use are not spilled for bytes), with what to do about the larger part: the
/// retained windows, or the filters that grow with a never-idle family's history. `None`
/// within the share.
fn memory_line(endpoint: &str, memory: &pb::MemoryUse) -> Option<String> {
    let used = memory_over_share(memory)?;
    let remedy = if memory.filter_bytes > memory.families_bytes {
        "their filters grow with the history of families never idle; give the node more \
         memory (docs/sizing.md, \"What still grows with the history\")"
    } else {
        "shorten the retention of full events (`tally params --retention-ms`; from rules \
         version 3 it frees what is retained already) or give the node more memory \
         (docs/sizing.md)"
    };
    Some(format!(
        "{endpoint} IS OVER ITS MEMORY BUDGET: its families in memory count {} MiB ({} MiB \
         of retained state, {} MiB of filters, {} MiB of rows on their way to disk) against \
         their {} MiB half of the {} MiB budget; families in use are not spilled for bytes: \
         {remedy}",
        mib(used),
        mib(memory.families_bytes),
        mib(memory.filter_bytes),
        mib(memory.store_memory_bytes),
        mib(memory.families_share_bytes),
        mib(memory.budget_bytes),
    ))
}

/// The region of member `id` in `reply`'s membership ("" when it is not listed).
fn region_of(reply: &pb::StatusReply, id: u64) -> &str {
    reply
        .members
        .iter()
        .find(|m| m.id == id)
        .map_or("", |m| m.region.as_str())
}

/// "preferred leader regions: eu-west, us-east; the leader (node 2, us-east) is not in the
/// best of them", or `None` when no region is preferred.
fn placement_line(reply: &pb::StatusReply) -> Option<String> {
    let preferred = &reply.params.as_ref()?.preferred_leader_regions;
    if preferred.is_empty() {
        return None;
    }
    let leader = match (reply.leader_id, reply.leader_in_preferred_region) {
        (Some(id), Some(placed)) => format!(
            "; the leader (node {id}, {}) is {}in the best of them",
            region_of(reply, id),
            if placed { "" } else { "not " }
        ),
        _ => "; no leader known".to_owned(),
    };
    Some(format!(
        "preferred leader regions: {}{leader}",
        preferred.join(", ")
    ))
}

/// "rules version 1 in force; 2 waits until every member knows it: node 3 lets it rise to 1
/// (max_rules_version)", or `None` when no node answering knows newer rules than those in
/// force (`in_force` is the most applied reply). A node reporting 0 predates rules versions.
fn rules_line(in_force: &pb::StatusReply, replies: &[&pb::StatusReply]) -> Option<String> {
    let version = in_force.params.as_ref()?.rules_version;
    let newest = replies.iter().map(|r| r.rules_known).max()?;
    if newest <= version {
        return None;
    }
    let holding: Vec<String> = replies
        .iter()
        .filter(|r| r.rules_known < newest)
        .map(|r| match r.rules_known {
            0 => format!(
                "node {} runs a release from before rules versions",
                r.node_id
            ),
            known => format!(
                "node {} lets it rise to {known} (max_rules_version or an older release)",
                r.node_id
            ),
        })
        .collect();
    Some(format!(
        "rules version {version} in force; {newest} waits until every member knows it: {}",
        if holding.is_empty() {
            "the leader raises it within seconds".to_owned()
        } else {
            holding.join("; ")
        }
    ))
}

fn lag(leader_last: Option<u64>, applied: Option<u64>) -> Option<u64> {
    Some(leader_last?.saturating_sub(applied.unwrap_or(0)))
}

fn opt<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn role_name(role: i32) -> &'static str {
    match pb::NodeRole::try_from(role) {
        Ok(pb::NodeRole::Leader) => "leader",
        Ok(pb::NodeRole::Follower) => "follower",
        Ok(pb::NodeRole::Candidate) => "candidate",
        Ok(pb::NodeRole::Learner) => "learner",
        Ok(pb::NodeRole::Shutdown) => "shutdown",
        _ => "unknown",
    }
}

async fn members_command(client: &TallyClient, command: MembersCommand) -> anyhow::Result<u8> {
    let leader = find_leader(client).await?;
    let mut admin = client.admin_client(&leader)?;
    let status = client.status(&leader).await?;
    let mut voters: Vec<u64> = status
        .members
        .iter()
        .filter(|m| m.voter)
        .map(|m| m.id)
        .collect();
    match command {
        MembersCommand::Add {
            id,
            address,
            peer_address,
            region,
            learner,
        } => {
            admin
                .add_learner(pb::AddLearnerRequest {
                    id,
                    address,
                    blocking: true,
                    peer_address,
                    region,
                })
                .await?;
            println!("node {id} added as a learner");
            if !learner {
                voters.push(id);
                admin
                    .change_membership(pb::ChangeMembershipRequest {
                        voters: voters.clone(),
                        retain: false,
                    })
                    .await?;
                println!("voters: {voters:?}");
            }
        }
        MembersCommand::Remove { id } => {
            voters.retain(|v| *v != id);
            admin
                .change_membership(pb::ChangeMembershipRequest {
                    voters: voters.clone(),
                    retain: false,
                })
                .await?;
            println!("node {id} removed; voters: {voters:?}");
        }
    }
    Ok(0)
}

async fn find_leader(client: &TallyClient) -> anyhow::Result<String> {
    for endpoint in client.endpoints() {
        if let Ok(status) = client.status(&endpoint).await {
            if !status.leader_address.is_empty() {
                return Ok(status.leader_address);
            }
        }
    }
    anyhow::bail!("no node knows a leader")
}

/// A usage row as `--json` prints it: the account and its family.
#[derive(serde::Serialize)]
struct UsageRow {
    family_id: FamilyId,
    #[serde(flatten)]
    usage: UsageRecord,
}

async fn usage(client: &TallyClient, args: UsageArgs, json: bool) -> anyhow::Result<u8> {
    let family = args.family.map(FamilyId::from);
    let rows = match (&family, &args.capability, args.grant) {
        (Some(family), Some(capability), Some(grant)) => client
            .get_usage(family, &AccountKey::new(capability.as_str(), grant))
            .await?
            .into_iter()
            .map(|usage| (family.clone(), usage))
            .collect(),
        _ => {
            list_usages(
                client,
                family.as_ref(),
                args.capability.as_deref(),
                args.limit,
            )
            .await?
        }
    };
    if json {
        let rows: Vec<_> = rows
            .into_iter()
            .map(|(family_id, usage)| UsageRow { family_id, usage })
            .collect();
        print_json(&rows);
        return Ok(0);
    }
    let mut table = Table::new(&[
        "FAMILY",
        "CAPABILITY",
        "GRANT",
        "CALLS",
        "RESERVED",
        "CAPTURED",
        "EXPOSED",
        "REALIZED",
        "LIMIT",
        "UPDATED MS",
    ]);
    for (family_id, row) in &rows {
        let a = &row.account;
        table.row(vec![
            family_id.to_string(),
            row.key.capability_id.to_string(),
            row.key.grant_index.to_string(),
            a.invocation_count.to_string(),
            a.reserved_invocations.to_string(),
            a.captured_invocations.to_string(),
            a.total_cost_exposed_units.to_string(),
            a.total_cost_realized_spend_units.to_string(),
            opt(a.limits.max_total_cost_units),
            a.updated_at_ms.to_string(),
        ]);
    }
    table.print();
    Ok(0)
}

/// Up to `limit` rows, page after page (a page holds at most `MAX_LIST_LIMIT`).
async fn list_usages(
    client: &TallyClient,
    family: Option<&FamilyId>,
    capability: Option<&str>,
    limit: u32,
) -> anyhow::Result<Vec<(FamilyId, UsageRecord)>> {
    let mut rows = Vec::new();
    let mut after = None;
    while rows.len() < limit as usize {
        let wanted = (limit as usize - rows.len()).min(MAX_LIST_LIMIT) as u32;
        let page = client
            .list_usages(family, capability, after.as_ref(), wanted)
            .await?;
        rows.extend(page.rows);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
        if rows.len() < limit as usize {
            eprintln!("read {} rows, reading the next page", rows.len());
        }
    }
    Ok(rows)
}

async fn events(client: &TallyClient, args: EventsArgs, json: bool) -> anyhow::Result<u8> {
    let family = FamilyId::from(args.family.clone());
    let mut after = args.after;
    let mut printed_header = false;
    loop {
        let events = client
            .list_events(
                &family,
                args.capability.as_deref(),
                args.grant,
                after,
                args.limit,
            )
            .await?;
        if let Some(last) = events.last() {
            after = Some(last.commit_index.0);
        }
        if json {
            for event in &events {
                print_json(event);
            }
        } else {
            let mut table = Table::new(&[
                "COMMIT INDEX",
                "KIND",
                "EVENT ID",
                "HOLD",
                "ALLOWED",
                "EXPOSURE",
                "REALIZED",
            ]);
            for e in &events {
                table.row(vec![
                    e.commit_index.0.to_string(),
                    e.kind.as_str().to_owned(),
                    e.event_id.to_string(),
                    e.hold_id
                        .as_ref()
                        .map_or_else(|| "-".to_owned(), ToString::to_string),
                    e.allowed.to_string(),
                    e.exposure_units.to_string(),
                    e.realized_units.to_string(),
                ]);
            }
            if !events.is_empty() || !printed_header {
                table.print_with_header(!printed_header);
                printed_header = true;
            }
        }
        if !args.follow {
            return Ok(0);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(preferred: &[&str], leader: Option<u64>, placed: Option<bool>) -> pb::StatusReply {
        let member = |id: u64, region: &str| pb::Member {
            id,
            region: region.to_owned(),
            voter: true,
            ..pb::Member::default()
        };
        pb::StatusReply {
            node_id: 1,
            leader_id: leader,
            members: vec![member(1, "eu-west"), member(2, "us-east")],
            params: Some(pb::ClusterParams {
                preferred_leader_regions: preferred.iter().map(|r| (*r).to_owned()).collect(),
                ..pb::ClusterParams::default()
            }),
            leader_in_preferred_region: placed,
            ..pb::StatusReply::default()
        }
    }

    #[test]
    fn status_names_each_nodes_region_and_where_the_leader_is() {
        let reply = status(&["us-east", "eu-west"], Some(1), Some(false));
        assert_eq!(region_of(&reply, 2), "us-east");
        assert_eq!(region_of(&reply, 9), "");
        assert_eq!(
            placement_line(&reply).as_deref(),
            Some(
                "preferred leader regions: us-east, eu-west; the leader (node 1, eu-west) is not \
                 in the best of them"
            )
        );
        let placed = status(&["us-east"], Some(2), Some(true));
        assert_eq!(
            placement_line(&placed).as_deref(),
            Some("preferred leader regions: us-east; the leader (node 2, us-east) is in the best of them")
        );
        let leaderless = status(&["us-east"], None, None);
        assert_eq!(
            placement_line(&leaderless).as_deref(),
            Some("preferred leader regions: us-east; no leader known")
        );
        assert_eq!(placement_line(&status(&[], Some(1), None)), None);
    }

    #[test]
    fn status_names_the_members_that_hold_the_rules_back() {
        let node = |id: u64, in_force: u32, known: u32| pb::StatusReply {
            node_id: id,
            rules_known: known,
            params: Some(pb::ClusterParams {
                rules_version: in_force,
                ..pb::ClusterParams::default()
            }),
            ..pb::StatusReply::default()
        };
        let (one, two, three) = (node(1, 1, 2), node(2, 1, 2), node(3, 1, 1));
        assert_eq!(
            rules_line(&one, &[&one, &two, &three]).as_deref(),
            Some(
                "rules version 1 in force; 2 waits until every member knows it: node 3 lets it \
                 rise to 1 (max_rules_version or an older release)"
            )
        );
        let old = node(3, 1, 0);
        assert_eq!(
            rules_line(&one, &[&one, &old]).as_deref(),
            Some(
                "rules version 1 in force; 2 waits until every member knows it: node 3 runs a \
                 release from before rules versions"
            )
        );
        // Everyone knows 2 but the raise has not applied yet.
        assert_eq!(
            rules_line(&one, &[&one, &two]).as_deref(),
            Some("rules version 1 in force; 2 waits until every member knows it: the leader raises it within seconds")
        );
        // Raised, or nobody knows newer: nothing to say.
        let raised = node(1, 2, 2);
        assert_eq!(rules_line(&raised, &[&raised]), None);
        assert_eq!(rules_line(&three, &[&three]), None);
    }

    #[test]
    fn status_warns_of_a_leader_catching_cluster_time_up_and_only_then() {
        let mut reply = status(&[], Some(1), None);
        reply.cluster_time_lag_ms = 86_400_000;
        reply.writes_wait_for_cluster_time = true;
        assert_eq!(
            catching_up_line("127.0.0.1:7401", &reply).as_deref(),
            Some(
                "127.0.0.1:7401 CATCHES CLUSTER TIME UP: it trails this leader's clock by \
                 86400000 ms; writes wait (then UNAVAILABLE, definite) until it is within a step"
            )
        );
        reply.writes_wait_for_cluster_time = false;
        assert_eq!(catching_up_line("127.0.0.1:7401", &reply), None);
    }

    #[test]
    fn status_warns_of_a_node_over_its_memory_budget_and_only_then() {
        const MIB: u64 = 1 << 20;
        let mut memory = pb::MemoryUse {
            budget_bytes: 1_024 * MIB,
            families_share_bytes: 512 * MIB,
            families_bytes: 300 * MIB,
            filter_bytes: 200 * MIB,
            store_memory_bytes: 12 * MIB,
            ..pb::MemoryUse::default()
        };
        // Exactly at the share: within it.
        assert_eq!(memory_line("127.0.0.1:7401", &memory), None);
        assert_eq!(memory_cell(&memory), "512M/512M");
        memory.filter_bytes += 1;
        assert!(
            memory_line("127.0.0.1:7401", &memory).is_some(),
            "a byte over"
        );
        memory.filter_bytes += 230 * MIB - 1;
        assert_eq!(
            memory_line("127.0.0.1:7401", &memory).as_deref(),
            Some(
                "127.0.0.1:7401 IS OVER ITS MEMORY BUDGET: its families in memory count 742 MiB \
                 (300 MiB of retained state, 430 MiB of filters, 12 MiB of rows on their way to \
                 disk) against their 512 MiB half of the 1024 MiB budget; families in use are \
                 not spilled for bytes: their filters grow with the history of families never \
                 idle; give the node more memory (docs/sizing.md, \"What still grows with the \
                 history\")"
            )
        );
        // Mostly retained state: the retention is the lever.
        memory.families_bytes = 1_000 * MIB;
        let line = memory_line("127.0.0.1:7401", &memory).expect("over");
        assert!(
            line.ends_with(
                "shorten the retention of full events (`tally params --retention-ms`; from rules \
                 version 3 it frees what is retained already) or give the node more memory \
                 (docs/sizing.md)"
            ),
            "{line}"
        );
    }

    #[test]
    fn status_warns_of_a_node_that_sheds_writes_and_only_then() {
        let shedding = pb::LoadShedding {
            shedding: true,
            oldest_proposal_age_ms: Some(2_350),
            proposals_pending: 17,
            commands_pending: 1_088,
            commands_answered_per_s: Some(420),
            shed_after_ms: 2_000,
            ..pb::LoadShedding::default()
        };
        assert_eq!(
            shedding_line("127.0.0.1:7401", &shedding).as_deref(),
            Some(
                "127.0.0.1:7401 SHEDS WRITES (UNAVAILABLE, definite): its oldest proposal has \
                 waited 2350 ms for commit (shed_after_ms 2000), 17 proposals of 1088 commands \
                 pending, 420 commands answered a second"
            )
        );
        let calm = pb::LoadShedding {
            shedding: false,
            ..shedding
        };
        assert_eq!(shedding_line("127.0.0.1:7401", &calm), None);
    }
}
