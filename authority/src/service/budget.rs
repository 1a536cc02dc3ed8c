//! The `Budget` service: every docs/spec.md command, `Batch`, and the reads of docs/spec.md §7. Commands
//! are validated before proposing (a bad one is refused, definite, with nothing proposed),
//! proposed on the leader or forwarded to it, and answered only once committed and applied.

use std::sync::Arc;
use std::time::Instant;

use tally_api::pb::budget_server::Budget;
use tally_api::pb::{self, Consistency};
use tally_api::WireError;
use tally_ledger::{
    AccountKey, BudgetCommitIndex, CapabilityId, ClientCommand, Command, EventId, FamilyId,
    HoldFilter, HoldId, UsagePosition,
};
use tonic::{Request, Response, Status};

use super::access::Caller;
use super::outcome::{decision_message, definite, failure_detail, failure_status, Failure, Stamp};
use super::read_gate::ReadGate;
use crate::families::RouterError;
use crate::faults::ServiceFaults;
use crate::node::metrics::NodeMetrics;
use crate::node::proposer::Proposer;
use crate::raft::state_machine::SharedRouter;
use crate::raft::types::ProposalReply;

pub struct BudgetService {
    proposer: Arc<Proposer>,
    reads: Arc<ReadGate>,
    router: SharedRouter,
    cluster_id: String,
    max_batch_commands: usize,
    faults: Arc<ServiceFaults>,
    metrics: Arc<NodeMetrics>,
}

impl BudgetService {
    pub fn new(
        proposer: Arc<Proposer>,
        reads: Arc<ReadGate>,
        router: SharedRouter,
        cluster_id: String,
        max_batch_commands: usize,
        faults: Arc<ServiceFaults>,
        metrics: Arc<NodeMetrics>,
    ) -> Self {
        Self {
            proposer,
            reads,
            router,
            cluster_id,
            max_batch_commands,
            faults,
            metrics,
        }
    }

    /// Proposes validated commands; the only place injected request/reply losses happen.
    async fn propose(
        &self,
        commands: Vec<Command>,
        event_id: Option<&EventId>,
    ) -> Result<ProposalReply, Status> {
        if self.faults.drops_request(&commands) {
            return Err(Status::unknown(
                "request lost before reaching the leader (fault injection)",
            ));
        }
        let ids = self.faults.drops_reply(&commands).then_some(());
        #[cfg(feature = "failpoints")]
        let kinds = crate::failpoints::kinds(commands.iter());
        let started = Instant::now();
        let reply = self
            .proposer
            .propose(commands)
            .await
            .map_err(|e| failure_status(e.into(), event_id))?;
        self.metrics.write_spans.propose.record(started.elapsed());
        if ids.is_some() {
            return Err(Status::unknown("reply lost after commit (fault injection)"));
        }
        #[cfg(feature = "failpoints")]
        crate::failpoints::hit_kinds("reply.before_send", &kinds);
        Ok(reply)
    }

    /// One command: validate, propose, answer its decision or its failure.
    async fn submit(
        &self,
        caller: Caller,
        command: Result<Command, WireError>,
    ) -> Result<Response<pb::Decision>, Status> {
        let started = Instant::now();
        let command = command.map_err(|e| failure_status(e.into(), None))?;
        caller.may_touch([command.family_id()])?;
        let event_id = command.event_id().cloned();
        let command = accepted(command).map_err(|f| failure_status(f, event_id.as_ref()))?;
        let reply = self.propose(vec![command], event_id.as_ref()).await?;
        let stamp = Stamp {
            cluster_id: self.cluster_id.clone(),
            entry: reply.log_id,
        };
        match reply.results.into_iter().next() {
            Some(Ok(decision)) => {
                let reply = self.with_leader_hint(definite(decision_message(&decision, &stamp)));
                self.metrics.write_spans.handler.record(started.elapsed());
                Ok(reply)
            }
            Some(Err(error)) => Err(failure_status(error.into(), event_id.as_ref())),
            None => Err(Status::internal("the state machine answered no result")),
        }
    }

    /// A write this follower served by forwarding it names the leader in `x-tally-leader`,
    /// so the client sends the next one there and saves the extra hop.
    fn with_leader_hint<T>(&self, mut response: Response<T>) -> Response<T> {
        if self.proposer.is_leader() {
            return response;
        }
        if let Some(address) = self
            .proposer
            .leader()
            .and_then(|(_, address)| address.parse().ok())
        {
            response
                .metadata_mut()
                .insert(tally_api::LEADER_HEADER, address);
        }
        response
    }

    /// Every read passes here, so it is where reads are counted (`tally_reads_total`).
    async fn read_barrier(&self, consistency: i32) -> Result<(), Status> {
        self.metrics.observe_read();
        match Consistency::try_from(consistency) {
            Ok(Consistency::Local) => Ok(()),
            Ok(Consistency::Linearizable) => self
                .reads
                .linearize()
                .await
                .map_err(|e| failure_status(e.into(), None)),
            Err(_) => Err(failure_status(
                WireError::invalid("consistency", "unknown value").into(),
                None,
            )),
        }
    }
}

fn client(command: Result<ClientCommand, WireError>) -> Result<Command, WireError> {
    command.map(Command::Apply)
}

impl BudgetService {
    /// Runs a read against the router: it holds the router lock only to start
    /// (`families::read`), so apply never waits for a read's decoding or actor round trips.
    async fn read<T, Fut>(
        &self,
        start: impl Fn(&crate::families::FamilyRouter) -> Fut,
    ) -> Result<T, Status>
    where
        Fut: std::future::Future<Output = Result<T, RouterError>>,
    {
        crate::families::read(&self.router, start)
            .await
            .map_err(router_status)
    }
}

fn router_status(error: RouterError) -> Status {
    failure_status(
        Failure::Write(crate::node::write_error::WriteError::Internal {
            reason: error.to_string(),
        }),
        None,
    )
}

/// What a client may propose: a valid client command. `ExpireHolds` is the leader's alone.
fn accepted(command: Command) -> Result<Command, Failure> {
    if let Command::ExpireHolds { .. } = command {
        return Err(Failure::Ledger(tally_ledger::LedgerError::invalid(
            "command",
            "ExpireHolds is proposed by the leader only",
        )));
    }
    command.validate()?;
    Ok(command)
}

/// An id from a read request, refused (INVALID_ARGUMENT) before any read if malformed.
fn valid_id<I>(
    id: I,
    validate: impl FnOnce(&I) -> Result<(), tally_ledger::LedgerError>,
) -> Result<I, Status> {
    validate(&id).map_err(|e| failure_status(e.into(), None))?;
    Ok(id)
}

fn family(value: &str) -> Result<FamilyId, Status> {
    valid_id(FamilyId::from(value), FamilyId::validate)
}

/// Where the previous page of `ListUsages` ended; malformed or invalid ids are refused.
fn usage_position(position: pb::UsagePosition) -> Result<UsagePosition, Status> {
    let position = UsagePosition::try_from(position)
        .map_err(|e| failure_status(e.at("after").into(), None))?;
    valid_id(position, UsagePosition::validate)
}

fn limit(value: u32) -> usize {
    match value {
        0 => 100,
        n => (n as usize).min(tally_ledger::limits::MAX_LIST_LIMIT),
    }
}

#[tonic::async_trait]
impl Budget for BudgetService {
    async fn authorize_hold(
        &self,
        request: Request<pb::AuthorizeHoldRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.submit(
            Caller::of(&request)?,
            client(ClientCommand::try_from(request.into_inner())),
        )
        .await
    }

    async fn capture_invocation(
        &self,
        request: Request<pb::CaptureInvocationRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.submit(
            Caller::of(&request)?,
            client(ClientCommand::try_from(request.into_inner())),
        )
        .await
    }

    async fn cancel_captured_before_dispatch(
        &self,
        request: Request<pb::CancelCapturedBeforeDispatchRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.submit(
            Caller::of(&request)?,
            client(ClientCommand::try_from(request.into_inner())),
        )
        .await
    }

    async fn reverse_hold(
        &self,
        request: Request<pb::ReverseHoldRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.submit(
            Caller::of(&request)?,
            client(ClientCommand::try_from(request.into_inner())),
        )
        .await
    }

    async fn release_hold(
        &self,
        request: Request<pb::ReleaseHoldRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.submit(
            Caller::of(&request)?,
            client(ClientCommand::try_from(request.into_inner())),
        )
        .await
    }

    async fn reconcile_hold(
        &self,
        request: Request<pb::ReconcileHoldRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.submit(
            Caller::of(&request)?,
            client(ClientCommand::try_from(request.into_inner())),
        )
        .await
    }

    async fn try_increment(
        &self,
        request: Request<pb::TryIncrementRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.submit(
            Caller::of(&request)?,
            client(ClientCommand::try_from(request.into_inner())),
        )
        .await
    }

    async fn try_charge_cost(
        &self,
        request: Request<pb::TryChargeCostRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.submit(
            Caller::of(&request)?,
            client(ClientCommand::try_from(request.into_inner())),
        )
        .await
    }

    async fn reverse_charge_cost(
        &self,
        request: Request<pb::ReverseChargeCostRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.submit(
            Caller::of(&request)?,
            client(ClientCommand::try_from(request.into_inner())),
        )
        .await
    }

    async fn reduce_charge_cost(
        &self,
        request: Request<pb::ReduceChargeCostRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.submit(
            Caller::of(&request)?,
            client(ClientCommand::try_from(request.into_inner())),
        )
        .await
    }

    async fn settle_charge_cost(
        &self,
        request: Request<pb::SettleChargeCostRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.submit(
            Caller::of(&request)?,
            client(ClientCommand::try_from(request.into_inner())),
        )
        .await
    }

    async fn consume_nonce(
        &self,
        request: Request<pb::ConsumeNonceRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.submit(
            Caller::of(&request)?,
            client(ClientCommand::try_from(request.into_inner())),
        )
        .await
    }

    async fn resolve_event(
        &self,
        request: Request<pb::ResolveEventRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.submit(
            Caller::of(&request)?,
            Command::try_from(request.into_inner()),
        )
        .await
    }

    /// Valid commands go into one log entry; each result (or its own error) in input order.
    async fn batch(
        &self,
        request: Request<pb::BatchRequest>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        let started = Instant::now();
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        if request.commands.is_empty() || request.commands.len() > self.max_batch_commands {
            return Err(failure_status(
                WireError::invalid(
                    "commands",
                    format!(
                        "{} commands; a batch holds 1..={}",
                        request.commands.len(),
                        self.max_batch_commands
                    ),
                )
                .into(),
                None,
            ));
        }
        let parsed = request.into_commands();
        // One command outside the caller's namespaces refuses the whole batch: nothing of it
        // is proposed.
        caller.may_touch(parsed.iter().flatten().map(Command::family_id))?;
        let mut results: Vec<Option<pb::batch_result::Result>> = Vec::with_capacity(parsed.len());
        let mut to_propose = Vec::new();
        let mut positions = Vec::new();
        for (position, command) in parsed.into_iter().enumerate() {
            let checked = command.map_err(Failure::from).and_then(accepted);
            match checked {
                Ok(command) => {
                    positions.push(position);
                    to_propose.push(command);
                    results.push(None);
                }
                Err(failure) => results.push(Some(pb::batch_result::Result::Error(
                    failure_detail(&failure, None),
                ))),
            }
        }
        let proposed = !to_propose.is_empty();
        if proposed {
            let event_ids: Vec<Option<EventId>> =
                to_propose.iter().map(|c| c.event_id().cloned()).collect();
            let reply = self.propose(to_propose, None).await?;
            let stamp = Stamp {
                cluster_id: self.cluster_id.clone(),
                entry: reply.log_id,
            };
            for ((position, result), event_id) in
                positions.into_iter().zip(reply.results).zip(event_ids)
            {
                results[position] = Some(match result {
                    Ok(decision) => {
                        pb::batch_result::Result::Decision(decision_message(&decision, &stamp))
                    }
                    Err(error) => pb::batch_result::Result::Error(failure_detail(
                        &error.into(),
                        event_id.as_ref(),
                    )),
                });
            }
        }
        let results = results
            .into_iter()
            .map(|result| pb::BatchResult { result })
            .collect();
        let reply = self.with_leader_hint(definite(pb::BatchReply { results }));
        if proposed {
            self.metrics.write_spans.handler.record(started.elapsed());
        }
        Ok(reply)
    }

    async fn get_usage(
        &self,
        request: Request<pb::GetUsageRequest>,
    ) -> Result<Response<pb::GetUsageReply>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let family_id = family(&request.family_id)?;
        caller.may_touch([&family_id])?;
        let key: AccountKey = request
            .account
            .ok_or_else(|| failure_status(WireError::missing("account").into(), None))?
            .into();
        self.read_barrier(request.consistency).await?;
        let usage = self
            .read(|router| router.get_usage(&family_id, &key))
            .await?;
        Ok(definite(pb::GetUsageReply::from_record(
            &family_id,
            usage.as_ref(),
        )))
    }

    async fn list_usages(
        &self,
        request: Request<pb::ListUsagesRequest>,
    ) -> Result<Response<pb::ListUsagesReply>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let family_id = request.family_id.as_deref().map(family).transpose()?;
        // Without a family, a namespace-bound kernel reads its own families only.
        caller.may_touch(&family_id)?;
        let capability = request.capability_id.map(CapabilityId::from);
        let after = request.after.map(usage_position).transpose()?;
        let limit = limit(request.limit);
        self.read_barrier(request.consistency).await?;
        let rows = self
            .read(|router| {
                router.list_usages(
                    family_id.as_ref(),
                    &|f| caller.covers(f),
                    capability.as_ref(),
                    after.as_ref(),
                    limit,
                )
            })
            .await?;
        Ok(definite(pb::ListUsagesReply::from_rows(&rows, limit)))
    }

    async fn list_events(
        &self,
        request: Request<pb::ListEventsRequest>,
    ) -> Result<Response<pb::ListEventsReply>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let family_id = family(&request.family_id)?;
        caller.may_touch([&family_id])?;
        let capability = request.capability_id.map(CapabilityId::from);
        self.read_barrier(request.consistency).await?;
        let events = self
            .read(|router| {
                router.list_events(
                    &family_id,
                    capability.as_ref(),
                    request.grant_index,
                    request.after_commit_index.map(BudgetCommitIndex),
                    limit(request.limit),
                )
            })
            .await?;
        Ok(definite(pb::ListEventsReply::from_records(&events)))
    }

    async fn get_event(
        &self,
        request: Request<pb::GetEventRequest>,
    ) -> Result<Response<pb::EventLookup>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let family_id = family(&request.family_id)?;
        caller.may_touch([&family_id])?;
        let event_id = valid_id(EventId::from(request.event_id), EventId::validate)?;
        self.read_barrier(request.consistency).await?;
        let lookup = self
            .read(|router| router.get_event(&family_id, &event_id))
            .await?;
        Ok(definite(pb::EventLookup::from(&lookup)))
    }

    async fn get_hold(
        &self,
        request: Request<pb::GetHoldRequest>,
    ) -> Result<Response<pb::GetHoldReply>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let family_id = family(&request.family_id)?;
        caller.may_touch([&family_id])?;
        let hold_id = valid_id(HoldId::from(request.hold_id), HoldId::validate)?;
        self.read_barrier(request.consistency).await?;
        let view = self
            .read(|router| router.get_hold(&family_id, &hold_id))
            .await?;
        Ok(definite(pb::GetHoldReply::from_view(
            &family_id,
            view.as_ref(),
        )))
    }

    async fn list_holds(
        &self,
        request: Request<pb::ListHoldsRequest>,
    ) -> Result<Response<pb::ListHoldsReply>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let filter = HoldFilter::try_from(&request).map_err(|e| failure_status(e.into(), None))?;
        if let Some(after) = &filter.after {
            after
                .validate()
                .map_err(|e| failure_status(e.into(), None))?;
        }
        let family_id = request.family_id.as_deref().map(family).transpose()?;
        // Without a family, a namespace-bound kernel reads its own families only.
        caller.may_touch(&family_id)?;
        let limit = limit(request.limit);
        self.read_barrier(request.consistency).await?;
        let holds = self
            .read(|router| {
                router.list_holds(family_id.as_ref(), &|f| caller.covers(f), &filter, limit)
            })
            .await?;
        Ok(definite(pb::ListHoldsReply::from_holds(&holds, limit)))
    }

    /// Not a read of budget state: no barrier, no family, and not counted as a read.
    async fn members(
        &self,
        _request: Request<pb::MembersRequest>,
    ) -> Result<Response<pb::MembersReply>, Status> {
        Ok(definite(self.proposer.members()))
    }
}
