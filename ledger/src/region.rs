//! Region names, and the ordered list of regions the cluster prefers its leader in
//! (docs/architecture.md "Deployment and regions"). The rules live here, beside the other
//! replicated parameters, so a node's own region and the preference list are judged alike.

use crate::error::LedgerError;

/// A region name is 1 ..= 64 bytes: it is shown in `tally status` and recorded in the
/// membership, so it stays short and printable.
pub const MAX_REGION_BYTES: usize = 64;

/// At most 8 preferred regions: more than a cluster of at most 7 voters can be spread over,
/// with one to spare for a region being moved into.
pub const MAX_PREFERRED_LEADER_REGIONS: usize = 8;

/// Refuses a region name that is empty, longer than [`MAX_REGION_BYTES`], or holds anything but
/// ASCII letters, digits, `-` and `_`.
pub fn validate_region(field: &str, region: &str) -> Result<(), LedgerError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    if region.is_empty() || region.len() > MAX_REGION_BYTES || !region.bytes().all(allowed) {
        return Err(LedgerError::invalid(
            field,
            format!(
                "region must be 1-{MAX_REGION_BYTES} letters, digits, '-' or '_', got {region:?}"
            ),
        ));
    }
    Ok(())
}

/// Refuses a preference list longer than [`MAX_PREFERRED_LEADER_REGIONS`], naming a region
/// twice, or naming an invalid region. The empty list is valid: no preference.
pub fn validate_preferred_leader_regions(regions: &[String]) -> Result<(), LedgerError> {
    const FIELD: &str = "preferred_leader_regions";
    if regions.len() > MAX_PREFERRED_LEADER_REGIONS {
        return Err(LedgerError::invalid(
            FIELD,
            format!(
                "at most {MAX_PREFERRED_LEADER_REGIONS} regions, got {}",
                regions.len()
            ),
        ));
    }
    for (position, region) in regions.iter().enumerate() {
        validate_region(FIELD, region)?;
        if regions[..position].contains(region) {
            return Err(LedgerError::invalid(
                FIELD,
                format!("region {region:?} is named twice"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(result: Result<(), LedgerError>) -> String {
        match result {
            Err(LedgerError::InvalidArgument { field, reason }) => format!("{field}: {reason}"),
            other => panic!("must be refused, got {other:?}"),
        }
    }

    fn list(regions: &[&str]) -> Vec<String> {
        regions.iter().map(|r| (*r).to_owned()).collect()
    }

    #[test]
    fn region_names_are_short_and_printable() {
        for good in ["eu-west", "us_east_1", "a", &"x".repeat(64)] {
            assert_eq!(validate_region("region", good), Ok(()), "{good}");
        }
        for bad in ["", "eu west", "eu/west", "é", &"x".repeat(65)] {
            assert!(
                reason(validate_region("region", bad)).starts_with("region: region must be 1-64"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_preference_list_is_short_distinct_and_valid_and_may_be_empty() {
        assert_eq!(validate_preferred_leader_regions(&[]), Ok(()));
        assert_eq!(
            validate_preferred_leader_regions(&list(&["eu-west", "us-east"])),
            Ok(())
        );
        let eight: Vec<String> = (0..8).map(|i| format!("r{i}")).collect();
        assert_eq!(validate_preferred_leader_regions(&eight), Ok(()));
        let nine: Vec<String> = (0..9).map(|i| format!("r{i}")).collect();
        assert_eq!(
            reason(validate_preferred_leader_regions(&nine)),
            "preferred_leader_regions: at most 8 regions, got 9"
        );
        assert_eq!(
            reason(validate_preferred_leader_regions(&list(&[
                "eu-west", "us-east", "eu-west"
            ]))),
            "preferred_leader_regions: region \"eu-west\" is named twice"
        );
        assert!(
            reason(validate_preferred_leader_regions(&list(&["eu-west", ""])))
                .contains("region must be 1-64")
        );
    }
}
