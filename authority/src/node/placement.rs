//! Where the leader should be: the pure choice behind the leader placement task
//! ([`super::leader_placement`]) and the status flag "the leader is in its preferred region".
//! No clocks, no Raft: the caller says which members are healthy.

use crate::raft::types::NodeId;

/// A member as the choice sees it. `healthy` means, for a voter other than the leader, that
/// it acknowledged the leader recently and its log is within a few entries of the leader's;
/// the leader itself is always healthy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member<'a> {
    pub id: NodeId,
    pub region: &'a str,
    pub voter: bool,
    pub healthy: bool,
}

/// The position of `region` in the preference list, best first; a region not listed ranks
/// after every listed one.
fn rank(preferred: &[String], region: &str) -> usize {
    preferred
        .iter()
        .position(|r| r == region)
        .unwrap_or(preferred.len())
}

/// The best preferred region that has a voter matching `eligible`, or `None` when no listed
/// region has one (or nothing is preferred).
pub fn best_region<'p>(
    preferred: &'p [String],
    members: &[Member<'_>],
    eligible: impl Fn(&Member<'_>) -> bool,
) -> Option<&'p str> {
    preferred
        .iter()
        .find(|region| {
            members
                .iter()
                .any(|m| m.voter && m.region == region.as_str() && eligible(m))
        })
        .map(String::as_str)
}

/// The voter leadership should move to, if any: the healthy voter in the best preferred
/// region, when that region is better than the leader's own. Ties go to the lowest id, so
/// every call over the same inputs answers the same. Learners are never chosen, and nothing is
/// moved when no region is preferred or the leader is not among the members.
pub fn transfer_target(
    preferred: &[String],
    leader: NodeId,
    members: &[Member<'_>],
) -> Option<NodeId> {
    if preferred.is_empty() {
        return None;
    }
    let leader_rank = rank(preferred, members.iter().find(|m| m.id == leader)?.region);
    members
        .iter()
        .filter(|m| m.id != leader && m.voter && m.healthy)
        .map(|m| (rank(preferred, m.region), m.id))
        .filter(|(rank, _)| *rank < leader_rank)
        .min()
        .map(|(_, id)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preferred(regions: &[&str]) -> Vec<String> {
        regions.iter().map(|r| (*r).to_owned()).collect()
    }

    fn voter(id: NodeId, region: &str) -> Member<'_> {
        Member {
            id,
            region,
            voter: true,
            healthy: true,
        }
    }

    #[test]
    fn no_preference_moves_nothing() {
        let members = [voter(1, "us-east"), voter(2, "eu-west")];
        assert_eq!(transfer_target(&[], 1, &members), None);
    }

    #[test]
    fn a_leader_in_the_best_region_stays() {
        let list = preferred(&["eu-west", "us-east"]);
        let members = [
            voter(1, "eu-west"),
            voter(2, "eu-west"),
            voter(3, "us-east"),
        ];
        assert_eq!(transfer_target(&list, 1, &members), None);
        assert_eq!(
            transfer_target(&list, 2, &members),
            None,
            "same region, no move"
        );
    }

    #[test]
    fn a_leader_outside_the_best_region_moves_to_the_lowest_healthy_voter_there() {
        let list = preferred(&["eu-west", "us-east"]);
        let members = [
            voter(1, "ap-south"),
            voter(4, "eu-west"),
            voter(2, "eu-west"),
            voter(3, "us-east"),
        ];
        assert_eq!(transfer_target(&list, 1, &members), Some(2));
        assert_eq!(transfer_target(&list, 3, &members), Some(2));
    }

    #[test]
    fn an_unhealthy_best_region_falls_back_to_the_next() {
        let list = preferred(&["eu-west", "us-east"]);
        let mut members = [
            voter(1, "ap-south"),
            voter(2, "eu-west"),
            voter(3, "us-east"),
        ];
        members[1].healthy = false;
        assert_eq!(transfer_target(&list, 1, &members), Some(3));
        // Already in the best region that has a healthy voter: stays.
        assert_eq!(transfer_target(&list, 3, &members), None);
    }

    #[test]
    fn learners_and_unlisted_regions_are_never_targets() {
        let list = preferred(&["eu-west"]);
        let mut members = [
            voter(1, "us-east"),
            voter(2, "eu-west"),
            voter(3, "ap-south"),
        ];
        members[1].voter = false;
        assert_eq!(
            transfer_target(&list, 1, &members),
            None,
            "only a learner there"
        );
        // A leader in an unlisted region does not move to another unlisted one.
        assert_eq!(transfer_target(&list, 3, &members), None);
    }

    #[test]
    fn a_leader_missing_from_the_members_moves_nothing() {
        let list = preferred(&["eu-west"]);
        let members = [voter(2, "eu-west")];
        assert_eq!(transfer_target(&list, 9, &members), None);
    }

    #[test]
    fn the_best_region_is_the_first_listed_with_an_eligible_voter() {
        let list = preferred(&["eu-west", "us-east"]);
        let mut members = [voter(1, "us-east"), voter(2, "eu-west")];
        assert_eq!(best_region(&list, &members, |_| true), Some("eu-west"));
        members[1].healthy = false;
        assert_eq!(best_region(&list, &members, |m| m.healthy), Some("us-east"));
        members[1].voter = false;
        assert_eq!(best_region(&list, &members, |_| true), Some("us-east"));
        assert_eq!(best_region(&[], &members, |_| true), None);
        assert_eq!(
            best_region(&preferred(&["ap-south"]), &members, |_| true),
            None
        );
    }
}
