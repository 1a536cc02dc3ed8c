//! `tally alarm list|clear`: the alarms raised through the log (docs/spec.md §5.6). While
//! `NO_SPACE` is raised the cluster refuses commands that open new exposure (new holds,
//! increments, charges, nonces) with RESOURCE_EXHAUSTED, definitely; everything on existing
//! holds and charges, hold expiry, `ResolveEvent`, replays and reads go on. A node's disk
//! watcher raises it; only an operator clears it, and a node still short of space raises it
//! again at its next check.

use clap::{Args, Subcommand};
use tally_api::pb;

use super::find_leader;
use super::output::{print_json, Table};
use crate::TallyClient;

#[derive(Debug, Subcommand)]
pub enum AlarmCommand {
    /// The raised alarms, as the leader applied them: kind, node, reason, raising entry.
    List,
    /// Clear an alarm through the log (on the leader). Free the space first: a node still
    /// short raises it again at its next disk check.
    #[command(after_help = CLEAR_HELP)]
    Clear(ClearArgs),
}

const CLEAR_HELP: &str = "Example: tally alarm clear --kind no-space (every node's), or \
tally alarm clear --kind no-space --node 2 (node 2's only). Commands refused while the alarm \
was raised were not applied: retry them with the same event id.";

#[derive(Debug, Args)]
pub struct ClearArgs {
    /// The alarm kind.
    #[arg(long, value_enum, default_value_t = KindArg::NoSpace)]
    pub kind: KindArg,
    /// Clear only this node's alarm (default: every node's).
    #[arg(long)]
    pub node: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KindArg {
    /// A node is short of disk: new exposure is refused.
    NoSpace,
}

impl From<KindArg> for pb::AlarmKind {
    fn from(kind: KindArg) -> Self {
        match kind {
            KindArg::NoSpace => pb::AlarmKind::NoSpace,
        }
    }
}

/// The kind's name as the CLI prints it.
pub fn kind_name(kind: i32) -> &'static str {
    match pb::AlarmKind::try_from(kind) {
        Ok(pb::AlarmKind::NoSpace) => "no_space",
        _ => "unknown",
    }
}

pub async fn run(client: &TallyClient, command: AlarmCommand, json: bool) -> anyhow::Result<u8> {
    let leader = find_leader(client).await?;
    let mut admin = client.admin_client(&leader)?;
    match command {
        AlarmCommand::List => {
            let reply = admin
                .list_alarms(pb::ListAlarmsRequest {})
                .await?
                .into_inner();
            if json {
                let rows: Vec<serde_json::Value> = reply
                    .alarms
                    .iter()
                    .map(|alarm| {
                        serde_json::json!({
                            "kind": kind_name(alarm.kind), "node_id": alarm.node_id,
                            "reason": alarm.reason, "raised_at_index": alarm.raised_at_index,
                            "raised_at_term": alarm.raised_at_term, "raised_at_ms": alarm.raised_at_ms,
                        })
                    })
                    .collect();
                print_json(&serde_json::json!({
                    "alarms": rows,
                    "applied_index": reply.applied_index,
                }));
            } else if reply.alarms.is_empty() {
                println!(
                    "no alarm raised (leader {leader}, applied index {})",
                    reply.applied_index
                );
            } else {
                print_alarms(&reply.alarms);
            }
            Ok(0)
        }
        AlarmCommand::Clear(args) => {
            let reply = admin
                .clear_alarm(pb::ClearAlarmRequest {
                    kind: pb::AlarmKind::from(args.kind) as i32,
                    node_id: args.node,
                })
                .await?
                .into_inner();
            if json {
                print_json(&serde_json::json!({
                    "message": reply.message,
                    "log_index": reply.log_index,
                }));
            } else {
                println!("{}", reply.message);
            }
            Ok(0)
        }
    }
}

/// A table of raised alarms (also under `tally status`).
pub fn print_alarms(alarms: &[pb::Alarm]) {
    let mut table = Table::new(&["ALARM", "NODE", "RAISED AT", "REASON"]);
    for alarm in alarms {
        table.row(vec![
            kind_name(alarm.kind).to_owned(),
            alarm.node_id.to_string(),
            alarm.raised_at_index.to_string(),
            alarm.reason.clone(),
        ]);
    }
    table.print();
}
