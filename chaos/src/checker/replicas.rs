//! Invariant 10: at the same applied index every replica's digest, and every family's
//! journal, rows and holds, are identical.

use super::{CheckReport, ReplicaState};

pub(super) fn check_convergence(replicas: &[ReplicaState], report: &mut CheckReport) {
    report.replicas_compared = replicas.len();
    let Some(reference) = replicas.first() else {
        return;
    };
    for replica in &replicas[1..] {
        if replica.applied_index != reference.applied_index {
            report.report(
                10,
                None,
                format!(
                    "node {} applied up to {} but node {} up to {}: not converged",
                    replica.node_id,
                    replica.applied_index,
                    reference.node_id,
                    reference.applied_index
                ),
            );
            continue;
        }
        if replica.digest != reference.digest {
            report.report(
                10,
                None,
                format!(
                    "at applied index {}: node {} digest {} != node {} digest {}",
                    reference.applied_index,
                    replica.node_id,
                    replica.digest,
                    reference.node_id,
                    reference.digest
                ),
            );
        }
        let names = reference
            .families
            .keys()
            .chain(replica.families.keys())
            .collect::<std::collections::BTreeSet<_>>();
        for name in names {
            if reference.families.get(name) != replica.families.get(name) {
                report.report(
                    10,
                    Some(name),
                    format!(
                        "node {} and node {} disagree on family {name}'s journal, rows or holds",
                        replica.node_id, reference.node_id
                    ),
                );
            }
        }
    }
}
