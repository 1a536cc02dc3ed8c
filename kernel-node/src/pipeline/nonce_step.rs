//! Execution nonces in the pipeline. With nonces required and none presented, the preflight
//! proves the budget would admit the call (a hold under its own id, reversed at once) and only
//! then mints a nonce; if that reverse cannot be confirmed, no nonce is minted. A presented
//! nonce must be bound to this very request and is spent in the cluster (`ConsumeNonce`)
//! before the capture; any failure there reverses the hold.

use serde_json::{json, Value};
use tally_client::Outcome;
use tally_ledger::Outcome as LedgerOutcome;

use super::cleanup::Cleanup;
use super::evaluation::{Evaluation, Held, Step, Stop};
use super::reasons;
use crate::nonce::{self, consume_command, NonceBinding};
use crate::receipt::ExecutionNonceMetadata;
use crate::token::VerifiedCapability;

impl Evaluation<'_> {
    fn binding(&self, capability: &VerifiedCapability) -> Result<NonceBinding, String> {
        Ok(NonceBinding {
            subject: capability.subject(),
            request_id: self.request.request_id.clone(),
            family_id: capability.family_id().to_string(),
            capability_id: capability.capability_id().to_string(),
            server: self.request.server.clone(),
            tool: self.request.tool.clone(),
            parameter_hash: nonce::parameter_hash(self.request.arguments.value())
                .map_err(|e| e.to_string())?,
        })
    }

    pub(super) async fn preflight(
        &mut self,
        capability: &VerifiedCapability,
        grants: &[u32],
    ) -> Stop {
        let held = match self.authorize(capability, grants, true).await {
            Ok(held) => held,
            Err(stop) => return stop,
        };
        if self.reverse(&held).await == Cleanup::Unconfirmed {
            self.extra.insert(
                "execution_nonce".into(),
                json!({ "cleanup_unconfirmed": true, "minted": false }),
            );
            return Stop::Deny(reasons::PREFLIGHT_CLEANUP_UNCONFIRMED.into());
        }
        let minted = self.binding(capability).and_then(|binding| {
            nonce::mint(
                &self.kernel.keypair,
                binding,
                self.kernel.config.nonce_ttl_ms,
                self.now_ms,
            )
            .map_err(|e| e.to_string())
        });
        match minted {
            Ok(minted) => {
                self.extra.insert(
                    "execution_nonce".into(),
                    json!({
                        "minted": true,
                        "nonce_id": minted.nonce.nonce_id.as_str(),
                        "expires_at_ms": minted.nonce.expires_at_ms,
                    }),
                );
                self.minted_nonce = Some(minted);
                Stop::Deny(reasons::NONCE_REQUIRED.into())
            }
            Err(error) => Stop::Deny(format!("execution nonce could not be minted: {error}")),
        }
    }

    /// A pre-capture failure: reverse the hold; deny with `why` only if the reverse is confirmed.
    async fn pre_capture_failure(&mut self, held: &Held, why: String) -> Stop {
        match self.reverse(held).await {
            Cleanup::Confirmed => Stop::Deny(why),
            Cleanup::Unconfirmed => {
                self.budget_extra
                    .insert("pre_dispatch_cleanup_unconfirmed".into(), Value::from(true));
                if let Some(nonce) = self.nonce.as_mut() {
                    nonce.cleanup_unconfirmed = true;
                }
                Stop::Deny(reasons::PRE_DISPATCH_CLEANUP_UNCONFIRMED.into())
            }
        }
    }

    pub(super) async fn check_and_consume_nonce(
        &mut self,
        capability: &VerifiedCapability,
        held: &Held,
    ) -> Step<()> {
        let Some(presented) = self.request.execution_nonce.as_ref() else {
            return Ok(());
        };
        let checked = self.binding(capability).and_then(|binding| {
            nonce::verify(presented, &self.kernel.kernel_keys, &binding, self.now_ms)
                .map_err(|e| e.to_string())
        });
        if let Err(error) = checked {
            let why = format!("execution nonce rejected: {error}");
            return Err(self.pre_capture_failure(held, why).await);
        }
        let command = consume_command(held.header.clone(), presented, &self.attempt_id);
        let event_id = command.header.event_id.clone();
        let record = |commit_index| ExecutionNonceMetadata {
            nonce_id: presented.nonce.nonce_id.clone(),
            event_id: event_id.clone(),
            commit_index,
            cleanup_unconfirmed: false,
        };
        let why = match self.kernel.ledger.submit(command).await {
            Outcome::Decided(decision) => match decision.outcome {
                LedgerOutcome::NonceConsumed { .. } => {
                    self.nonce = Some(record(decision.commit_index));
                    return Ok(());
                }
                other => format!("unexpected nonce answer {other:?}"),
            },
            Outcome::Refused(error) => format!("execution nonce refused: {error}"),
            Outcome::Unavailable { .. } | Outcome::NotApplied { .. } => {
                format!("execution nonce: {}", reasons::BUDGET_UNAVAILABLE)
            }
            Outcome::Unknown { .. } => {
                self.nonce = Some(record(None));
                "execution nonce consumption could not be confirmed".to_owned()
            }
        };
        Err(self.pre_capture_failure(held, why).await)
    }
}
