//! The actor that owns one budget family. It applies what the router sends, in mailbox
//! order, and never stops itself: passivation is the router's decision.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tally_ledger::{ApplyCtx, ColdFetch, Command, Family, FamilyId};

use super::messages::{AppliedBatch, FamilyMsg};

pub(crate) struct FamilyActor;

/// How an actor starts: a new family, or one resumed from its passivated (or snapshot) bytes.
/// Decoding happens in the actor, so respawning many families decodes in parallel.
pub(crate) enum FamilyStart {
    New(FamilyId),
    Resume {
        family_id: FamilyId,
        bytes: Arc<Vec<u8>>,
    },
}

pub(crate) enum FamilyState {
    /// Behind an `Arc`: a snapshot cut shares it (see `FamilyMsg::Share`); an apply writes
    /// through `Arc::make_mut`, which copies it only while a cut still holds it.
    Ready(Arc<Family>),
    /// The state could not be decoded, or an apply panicked: every apply answers the reason
    /// so the router can halt with it. Never serves a read.
    Broken(String),
}

impl Actor for FamilyActor {
    type Msg = FamilyMsg;
    type State = FamilyState;
    type Arguments = FamilyStart;

    async fn pre_start(
        &self,
        _myself: ActorRef<FamilyMsg>,
        start: FamilyStart,
    ) -> Result<FamilyState, ActorProcessingErr> {
        Ok(match start {
            FamilyStart::New(family_id) => FamilyState::Ready(Arc::new(Family::new(family_id))),
            FamilyStart::Resume { family_id, bytes } => match Family::from_snapshot_bytes(&bytes) {
                Ok(family) if family.family_id() == &family_id => {
                    FamilyState::Ready(Arc::new(family))
                }
                Ok(family) => FamilyState::Broken(format!(
                    "stored state belongs to family {}",
                    family.family_id()
                )),
                Err(error) => FamilyState::Broken(error.to_string()),
            },
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<FamilyMsg>,
        message: FamilyMsg,
        state: &mut FamilyState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            FamilyMsg::Apply {
                commands,
                cold,
                reply,
            } => {
                let family = match state {
                    FamilyState::Ready(family) => Arc::make_mut(family),
                    FamilyState::Broken(reason) => {
                        // The router may be gone already; then nobody needs the answer.
                        let _ = reply.send(Err(reason.clone()));
                        return Ok(());
                    }
                };
                let applied =
                    catch_unwind(AssertUnwindSafe(|| apply_batch(family, &commands, cold)));
                match applied {
                    Ok(batch) => {
                        let _ = reply.send(Ok(batch));
                        Ok(())
                    }
                    Err(panic) => {
                        let reason = format!("apply panicked: {}", panic_message(panic.as_ref()));
                        *state = FamilyState::Broken(reason.clone());
                        let _ = reply.send(Err(reason.clone()));
                        // Stop the actor: its family may be half-applied.
                        Err(reason.into())
                    }
                }
            }
            FamilyMsg::Share(reply) => {
                // A broken family answers nothing: the cut fails with the router's "gone".
                if let FamilyState::Ready(family) = state {
                    let _ = reply.send(Arc::clone(family));
                }
                Ok(())
            }
            FamilyMsg::Read(read) => {
                if let FamilyState::Ready(family) = state {
                    // A read panic drops the reader's reply channel; the router reports it.
                    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| read(family))) {
                        return Err(
                            format!("read panicked: {}", panic_message(panic.as_ref())).into()
                        );
                    }
                }
                Ok(())
            }
        }
    }
}

fn apply_batch(
    family: &mut Family,
    commands: &[(ApplyCtx, Command)],
    cold: ColdFetch,
) -> AppliedBatch {
    family.start_batch(cold);
    let results = commands
        .iter()
        .map(|(ctx, command)| family.apply(command, ctx))
        .collect();
    // The parameters of the round's last entry are in force after it: a parameter change
    // starts a round of its own (`batch::split_rounds`), so every command of a round has them.
    let params = commands
        .last()
        .map(|(ctx, _)| ctx.params)
        .expect("a family is sent a batch only for commands");
    let next_compaction_ms = family.next_compaction_ms(&params);
    let maintenance_due_ms = match (family.next_expiry_ms(), next_compaction_ms) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let pristine = *family == Family::new(family.family_id().clone());
    AppliedBatch {
        results,
        maintenance_due_ms,
        pristine,
        has_live_holds: family.live_hold_count() > 0,
        footprint_bytes: family.footprint_bytes(),
        moved: family.take_moved_rows(),
        cold_rows: family.cold_meta().rows,
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(message) = panic.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
