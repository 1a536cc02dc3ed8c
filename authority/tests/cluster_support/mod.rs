//! Helpers for the authority's cluster tests: request builders and assertions. The cluster
//! itself is `tally_authority::testing::TestCluster`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use tally_api::pb;
use tally_api::pb::budget_client::BudgetClient;
use tally_api::status::{error_detail, Definiteness};
use tonic::transport::Channel;
use tonic::Status;

pub use tally_authority::testing::*;

pub fn header(family: &str, event_id: &str) -> pb::CommandHeader {
    pb::CommandHeader {
        family_id: family.to_owned(),
        capability_id: "cap".to_owned(),
        grant_index: 0,
        event_id: event_id.to_owned(),
        not_after_ms: tally_authority::node::clock::wall_clock_ms() + 60_000,
    }
}

pub fn limits() -> pb::GrantLimits {
    pb::GrantLimits {
        max_invocations: Some(1_000),
        max_cost_per_invocation_units: Some(100),
        max_total_cost_units: Some(100_000),
        currency: Some("USD".to_owned()),
    }
}

pub fn authorize(family: &str, hold: &str, units: u64) -> pb::AuthorizeHoldRequest {
    pb::AuthorizeHoldRequest {
        header: Some(header(family, &format!("{hold}:authorize"))),
        hold_id: hold.to_owned(),
        requested_exposure_units: units,
        limits: Some(limits()),
        ancestors: vec![],
        hold_timeout_ms: None,
    }
}

pub fn capture(family: &str, hold: &str, attempt: &str) -> pb::CaptureInvocationRequest {
    pb::CaptureInvocationRequest {
        header: Some(header(family, &format!("{hold}:capture"))),
        hold_id: hold.to_owned(),
        attempt_id: attempt.to_owned(),
    }
}

pub fn reconcile(
    family: &str,
    hold: &str,
    exposed: u64,
    realized: u64,
) -> pb::ReconcileHoldRequest {
    pb::ReconcileHoldRequest {
        header: Some(header(family, &format!("{hold}:reconcile"))),
        hold_id: hold.to_owned(),
        exposed_cost_units: exposed,
        realized_spend_units: realized,
    }
}

/// Asserts every digest is the same one and returns it.
pub fn assert_converged(digests: &BTreeMap<u64, [u8; 32]>) -> [u8; 32] {
    let first = *digests.values().next().expect("at least one digest");
    assert!(
        digests.values().all(|d| *d == first),
        "replicas diverged: {digests:?}"
    );
    first
}

/// The outcome of a decision.
pub fn outcome(decision: &pb::Decision) -> &pb::outcome::Outcome {
    decision
        .outcome
        .as_ref()
        .and_then(|o| o.outcome.as_ref())
        .expect("a decision carries an outcome")
}

/// The Tally error detail of a failed call.
pub fn detail(status: &Status) -> pb::ErrorDetail {
    error_detail(status).unwrap_or_else(|e| panic!("{status:?} carries no ErrorDetail: {e}"))
}

pub fn definiteness(status: &Status) -> Option<Definiteness> {
    Definiteness::from_metadata(status.metadata())
}

/// A definite refusal: the command certainly did not apply.
pub fn is_definite_refusal(status: &Status) -> bool {
    definiteness(status) == Some(Definiteness::Definite)
        && matches!(
            status.code(),
            tonic::Code::InvalidArgument
                | tonic::Code::AlreadyExists
                | tonic::Code::FailedPrecondition
                | tonic::Code::OutOfRange
                | tonic::Code::Unavailable
                | tonic::Code::ResourceExhausted
        )
}

/// A linearizable GetEvent.
pub async fn get_event(
    client: &mut BudgetClient<Channel>,
    family: &str,
    event_id: &str,
) -> pb::event_lookup::Lookup {
    client
        .get_event(pb::GetEventRequest {
            family_id: family.to_owned(),
            event_id: event_id.to_owned(),
            consistency: pb::Consistency::Linearizable as i32,
        })
        .await
        .expect("get_event")
        .into_inner()
        .lookup
        .expect("a lookup answer")
}

/// The budget commit index GetEvent reports for an applied event.
pub async fn applied_index(
    client: &mut BudgetClient<Channel>,
    family: &str,
    event_id: &str,
) -> Option<u64> {
    match get_event(client, family, event_id).await {
        pb::event_lookup::Lookup::Applied(applied) => {
            applied
                .decision
                .expect("an applied event has its decision")
                .budget_commit_index
        }
        _ => None,
    }
}

pub fn resolve(original: pb::command::Command) -> pb::ResolveEventRequest {
    pb::ResolveEventRequest {
        original: Some(Box::new(pb::Command {
            command: Some(original),
        })),
    }
}

/// What a write answered, comparable across replays: the outcome and its commit index, or
/// the status code and reason.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Decision(pb::outcome::Outcome, Option<u64>),
    Error(tonic::Code, String),
}

impl Answer {
    pub fn of(result: &Result<tonic::Response<pb::Decision>, Status>) -> Self {
        match result {
            Ok(reply) => {
                let d = reply.get_ref();
                Answer::Decision(outcome(d).clone(), d.budget_commit_index)
            }
            Err(status) => Answer::Error(
                status.code(),
                error_detail(status).map(|d| d.reason).unwrap_or_default(),
            ),
        }
    }
}

/// Sends any one command over its unary rpc.
pub async fn send(
    client: &mut BudgetClient<Channel>,
    command: pb::command::Command,
) -> Result<tonic::Response<pb::Decision>, Status> {
    use pb::command::Command as C;
    match command {
        C::AuthorizeHold(r) => client.authorize_hold(r).await,
        C::CaptureInvocation(r) => client.capture_invocation(r).await,
        C::CancelCapturedBeforeDispatch(r) => client.cancel_captured_before_dispatch(r).await,
        C::ReverseHold(r) => client.reverse_hold(r).await,
        C::ReleaseHold(r) => client.release_hold(r).await,
        C::ReconcileHold(r) => client.reconcile_hold(r).await,
        C::TryIncrement(r) => client.try_increment(r).await,
        C::TryChargeCost(r) => client.try_charge_cost(r).await,
        C::ReverseChargeCost(r) => client.reverse_charge_cost(r).await,
        C::ReduceChargeCost(r) => client.reduce_charge_cost(r).await,
        C::SettleChargeCost(r) => client.settle_charge_cost(r).await,
        C::ConsumeNonce(r) => client.consume_nonce(r).await,
        C::ResolveEvent(r) => client.resolve_event(*r).await,
    }
}

/// The family and event id of a command.
pub fn ids_of(command: &pb::command::Command) -> (String, String) {
    use pb::command::Command as C;
    let header = match command {
        C::AuthorizeHold(r) => r.header.as_ref(),
        C::CaptureInvocation(r) => r.header.as_ref(),
        C::CancelCapturedBeforeDispatch(r) => r.header.as_ref(),
        C::ReverseHold(r) => r.header.as_ref(),
        C::ReleaseHold(r) => r.header.as_ref(),
        C::ReconcileHold(r) => r.header.as_ref(),
        C::TryIncrement(r) => r.header.as_ref(),
        C::TryChargeCost(r) => r.header.as_ref(),
        C::ReverseChargeCost(r) => r.header.as_ref(),
        C::ReduceChargeCost(r) => r.header.as_ref(),
        C::SettleChargeCost(r) => r.header.as_ref(),
        C::ConsumeNonce(r) => r.header.as_ref(),
        C::ResolveEvent(_) => None,
    }
    .expect("a command with a header");
    (header.family_id.clone(), header.event_id.clone())
}

/// A client for whichever node leads now (any node, if none is known).
pub async fn budget_at(
    transport: &tally_tls::Transport,
    address: &str,
) -> Option<BudgetClient<Channel>> {
    let endpoint = transport
        .endpoint(address)
        .ok()?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10));
    Some(BudgetClient::new(endpoint.connect().await.ok()?))
}

/// A channel to node `to`'s peer port, presenting certificate `identity` (`node-<id>`, or a
/// client's, to be refused).
pub async fn peer_channel(cluster: &TestCluster, identity: &str, to: u64) -> Channel {
    cluster
        .transport(identity)
        .endpoint(&cluster.nodes[&to].peer_local_addr.to_string())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect")
}

/// A node that is not `leader`.
pub fn a_follower(cluster: &TestCluster, leader: u64) -> u64 {
    *cluster
        .nodes
        .keys()
        .find(|id| **id != leader)
        .expect("a follower")
}

/// A gRPC codec for a call that never sends a message and expects none: enough to open a
/// request stream and leave it hanging.
#[derive(Default)]
pub struct Silent;

impl tonic::codec::Codec for Silent {
    type Encode = ();
    type Decode = ();
    type Encoder = Silent;
    type Decoder = Silent;

    fn encoder(&mut self) -> Silent {
        Silent
    }

    fn decoder(&mut self) -> Silent {
        Silent
    }
}

impl tonic::codec::Encoder for Silent {
    type Item = ();
    type Error = tonic::Status;

    fn encode(&mut self, _: (), _: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        Ok(())
    }
}

impl tonic::codec::Decoder for Silent {
    type Item = ();
    type Error = tonic::Status;

    fn decode(&mut self, _: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        Err(tonic::Status::internal("a hanging call expects no message"))
    }
}

/// The row of account `cap`/0 in `family`, read through `client` (None when it has none).
pub async fn account_of(client: &mut BudgetClient<Channel>, family: &str) -> Option<pb::Account> {
    client
        .get_usage(pb::GetUsageRequest {
            family_id: family.to_owned(),
            account: Some(pb::AccountKey {
                capability_id: "cap".to_owned(),
                grant_index: 0,
            }),
            consistency: 0,
        })
        .await
        .expect("get_usage")
        .into_inner()
        .usage
        .and_then(|u| u.account)
}

/// Hold `hold` of `family` while it is live (not yet archived), read through `client`.
pub async fn live_hold(client: &mut BudgetClient<Channel>, family: &str, hold: &str) -> pb::Hold {
    let view = client
        .get_hold(pb::GetHoldRequest {
            family_id: family.to_owned(),
            hold_id: hold.to_owned(),
            consistency: 0,
        })
        .await
        .expect("get_hold")
        .into_inner()
        .hold
        .and_then(|v| v.view);
    match view {
        Some(pb::hold_view::View::Live(hold)) => hold,
        other => panic!("hold {hold} of {family} is live until archived: {other:?}"),
    }
}

/// The value of the sample `name` (with its labels, e.g. `tally_family_actors{state="live"}`)
/// in a `/metrics` text.
pub fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            (key == name).then(|| value.parse().expect("a number"))
        })
        .unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
}

/// [`sample`] of a counter or a byte gauge: a whole number.
pub fn count(text: &str, name: &str) -> u64 {
    let value = sample(text, name);
    assert!(
        value >= 0.0 && value.fract() == 0.0,
        "{name} is not a count: {value}"
    );
    value as u64
}

/// Node `id`'s `/metrics` text.
pub async fn scrape(cluster: &TestCluster, id: u64) -> String {
    let node = &cluster.nodes[&id];
    tally_authority::node::metrics::render(&tally_authority::node::metrics::Sources {
        node_id: id,
        metrics: node.metrics.clone(),
        raft: node.raft.clone(),
        store: node.store_metrics.clone(),
        router: node.router.clone(),
        clock: node.clock.clone(),
    })
    .await
}

/// Sets the cluster's retention of full events through `leader` (and nothing else).
pub async fn set_retention(cluster: &TestCluster, leader: u64, retention_ms: u64) {
    (cluster.admin(leader).await)
        .set_params(pb::SetParamsRequest {
            retention_ms: Some(retention_ms),
            max_clock_step_ms: None,
            preferred_leader_regions: None,
        })
        .await
        .expect("the retention is set");
}

/// `request` is refused by SetParams: INVALID_ARGUMENT, definite, and a message that says
/// every one of `expected`.
pub async fn assert_params_refused(
    admin: &mut tally_api::pb::admin_client::AdminClient<Channel>,
    request: pb::SetParamsRequest,
    expected: &[&str],
) {
    let status = admin
        .set_params(request.clone())
        .await
        .expect_err("refused");
    assert_eq!(
        status.code(),
        tonic::Code::InvalidArgument,
        "{request:?}: {status:?}"
    );
    assert_eq!(
        definiteness(&status),
        Some(Definiteness::Definite),
        "{request:?}: definite"
    );
    for said in expected {
        assert!(
            status.message().contains(said),
            "{request:?}: {:?} must say {said:?}",
            status.message()
        );
    }
}

/// Node `id`'s `Admin.Status`.
pub async fn status_of(cluster: &TestCluster, id: u64) -> pb::StatusReply {
    cluster
        .admin(id)
        .await
        .status(pb::StatusRequest {})
        .await
        .expect("status")
        .into_inner()
}
