//! One `grpc.health.v1` check of a Tally port, for the `healthcheck` commands that container
//! and Kubernetes probes exec (`tally-node healthcheck`, `tally-kernel healthcheck`): they
//! run inside the pod and present a certificate, so a probe works on a mutual-TLS-only port
//! where an HTTP or plain gRPC probe could not.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// Why a probe got no status.
#[derive(Debug, thiserror::Error)]
pub enum HealthProbeError {
    #[error("{0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("{}", .0.message())]
    Rpc(#[from] tonic::Status),
    #[error("no answer within {0} ms")]
    Timeout(u128),
}

/// What the server said of itself (the whole server: service name ""), and the channel, for
/// a caller that wants to ask more (the node's probe lists raised alarms).
#[derive(Debug)]
pub struct HealthProbe {
    pub serving: bool,
    pub channel: Channel,
}

/// Connects to `endpoint` and asks for the server's status, all within `timeout`.
pub async fn probe_health(
    endpoint: Endpoint,
    timeout: Duration,
) -> Result<HealthProbe, HealthProbeError> {
    let check = async {
        let channel = endpoint.connect().await?;
        let reply = HealthClient::new(channel.clone())
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await?;
        let serving = reply.into_inner().status == ServingStatus::Serving as i32;
        Ok(HealthProbe { serving, channel })
    };
    tokio::time::timeout(timeout, check)
        .await
        .map_err(|_| HealthProbeError::Timeout(timeout.as_millis()))?
}
