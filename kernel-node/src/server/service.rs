//! The `tally.kernel.v1.Kernel` service: a thin shell over [`Kernel`]. Each call decodes,
//! runs the pipeline, counts the verdict and encodes; nothing is kept between calls.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::convert::{
    abort_from_pb, complete_from_pb, error_to_status, request_from_pb, result_to_pb,
};
use super::metrics::Metrics;
use super::pb::kernel_server::{Kernel as KernelApi, KernelServer};
use super::pb::{self, Verdict};
use super::MAX_KERNEL_MESSAGE_BYTES;
use crate::pipeline::{Kernel, KernelError};

pub struct KernelService {
    kernel: Arc<Kernel>,
    metrics: Arc<Metrics>,
}

impl KernelService {
    pub fn new(kernel: Arc<Kernel>, metrics: Arc<Metrics>) -> Self {
        Self { kernel, metrics }
    }

    /// The tonic service, with message sizes bounded both ways.
    pub fn into_server(self) -> KernelServer<Self> {
        KernelServer::new(self)
            .max_decoding_message_size(MAX_KERNEL_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_KERNEL_MESSAGE_BYTES)
    }

    fn invalid<T>(&self, result: Result<T, Status>) -> Result<T, Status> {
        if result.is_err() {
            Metrics::count(&self.metrics.invalid_requests);
        }
        result
    }

    /// Counts a refusal by a node whose receipt log failed.
    fn gated<T>(&self, result: Result<T, KernelError>) -> Result<T, KernelError> {
        if matches!(result, Err(KernelError::ReceiptLogUnavailable(_))) {
            Metrics::count(&self.metrics.receipt_log_refusals);
        }
        result
    }

    fn counted(&self, evaluation: pb::Evaluation) -> pb::Evaluation {
        if evaluation.url_elicitation.is_some() {
            Metrics::count(&self.metrics.url_elicitations);
        }
        if evaluation.verdict == Verdict::Allow as i32 {
            Metrics::count(&self.metrics.allowed);
        } else {
            Metrics::count(&self.metrics.denied);
        }
        evaluation
    }
}

#[tonic::async_trait]
impl KernelApi for KernelService {
    async fn evaluate_tool_call(
        &self,
        request: Request<pb::ToolCall>,
    ) -> Result<Response<pb::Evaluation>, Status> {
        let call = self.invalid(request_from_pb(request.into_inner()))?;
        let evaluation = result_to_pb(self.gated(self.kernel.evaluate(&call).await))?;
        Ok(Response::new(self.counted(evaluation)))
    }

    async fn admit(
        &self,
        request: Request<pb::ToolCall>,
    ) -> Result<Response<pb::Admission>, Status> {
        let call = self.invalid(request_from_pb(request.into_inner()))?;
        let admission = self
            .gated(self.kernel.admit(&call).await)
            .map_err(error_to_status)?;
        let ticket = admission
            .ticket
            .as_ref()
            .map(|t| t.to_bytes())
            .transpose()
            .map_err(|e| Status::internal(e.to_string()))?;
        if ticket.is_some() {
            Metrics::count(&self.metrics.admissions);
        }
        let evaluation = result_to_pb(Ok(admission.response))?;
        Ok(Response::new(pb::Admission {
            evaluation: Some(self.counted(evaluation)),
            ticket,
        }))
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::Evaluation>, Status> {
        let call = self.invalid(complete_from_pb(request.into_inner()))?;
        Metrics::count(&self.metrics.completions);
        let evaluation = result_to_pb(self.kernel.complete(&call).await)?;
        Ok(Response::new(self.counted(evaluation)))
    }

    async fn abort(
        &self,
        request: Request<pb::AbortRequest>,
    ) -> Result<Response<pb::Evaluation>, Status> {
        let call = self.invalid(abort_from_pb(request.into_inner()))?;
        Metrics::count(&self.metrics.aborts);
        let evaluation = result_to_pb(self.kernel.abort(&call).await)?;
        Ok(Response::new(self.counted(evaluation)))
    }
}
