//! Delegation may only narrow (docs/spec.md §8): a child grant names the parent grant it narrows and
//! must stay inside it on every field, because the ledger reserves a child's spending on the
//! parent's account too and trusts the limits the kernel hands it.

use super::error::TokenError;
use super::model::{Grant, TokenBody, WILDCARD};
use crate::money::Money;

/// Checks every grant of `child` against the grants of `parent`.
pub(crate) fn check_narrows(child: &TokenBody, parent: &TokenBody) -> Result<(), TokenError> {
    for (index, grant) in child.grants.iter().enumerate() {
        let index = u32::try_from(index).map_err(|_| TokenError::malformed("grant index"))?;
        let widened = |field| TokenError::WidenedGrant {
            id: child.id.to_string(),
            index,
            field,
        };
        let parent_grant = grant
            .parent_grant_index
            .and_then(|p| parent.grants.get(usize::try_from(p).ok()?))
            .ok_or_else(|| widened("parent_grant_index"))?;
        if let Some(field) = widened_field(grant, parent_grant) {
            return Err(widened(field));
        }
    }
    Ok(())
}

/// The first field on which `child` is wider than `parent`, if any.
fn widened_field(child: &Grant, parent: &Grant) -> Option<&'static str> {
    if !name_narrows(&child.server, &parent.server) {
        return Some("server");
    }
    if !name_narrows(&child.tool, &parent.tool) {
        return Some("tool");
    }
    if let (Some(mine), Some(theirs)) = (child.currency(), parent.currency()) {
        if mine != theirs {
            return Some("currency");
        }
    }
    if !count_narrows(child.max_invocations, parent.max_invocations) {
        return Some("max_invocations");
    }
    if !money_narrows(
        &child.max_cost_per_invocation,
        &parent.max_cost_per_invocation,
    ) {
        return Some("max_cost_per_invocation");
    }
    if !money_narrows(&child.max_total_cost, &parent.max_total_cost) {
        return Some("max_total_cost");
    }
    None
}

fn name_narrows(child: &str, parent: &str) -> bool {
    parent == WILDCARD || child == parent
}

/// A limit the parent has must be kept, at most as high; one the parent lacks is free.
fn count_narrows(child: Option<u32>, parent: Option<u32>) -> bool {
    match (child, parent) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(mine), Some(theirs)) => mine <= theirs,
    }
}

fn money_narrows(child: &Option<Money>, parent: &Option<Money>) -> bool {
    match (child, parent) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(mine), Some(theirs)) => {
            mine.currency == theirs.currency && mine.units <= theirs.units
        }
    }
}
