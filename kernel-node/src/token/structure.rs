//! Shape checks of one token on its own (ids, names, counts, currencies), done before any
//! signature work so a hostile token costs little.

use super::error::TokenError;
use super::model::{Grant, TokenBody};
use super::{MAX_GRANTS_PER_TOKEN, MAX_NAME_BYTES, MAX_TOKEN_ID_BYTES};

/// Token ids go inside `budget-hold:{request_id}:{capability_id}:{grant_index}`, so they may
/// not contain `:` (the hold id would become ambiguous) nor anything a header cannot carry.
pub(crate) fn check_id(id: &str) -> Result<(), TokenError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_TOKEN_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(TokenError::malformed(format!(
            "token id must be 1-{MAX_TOKEN_ID_BYTES} bytes of [A-Za-z0-9._-]"
        )))
    }
}

pub(crate) fn check_body(body: &TokenBody) -> Result<(), TokenError> {
    check_id(body.id.as_str())?;
    let id = body.id.as_str();
    if body.issued_at_ms > body.expires_at_ms {
        return Err(TokenError::malformed(format!(
            "token {id} expires before it is issued"
        )));
    }
    if body.grants.is_empty() || body.grants.len() > MAX_GRANTS_PER_TOKEN {
        return Err(TokenError::malformed(format!(
            "token {id} has {} grants; 1-{MAX_GRANTS_PER_TOKEN} allowed",
            body.grants.len()
        )));
    }
    let delegated = body.parent.is_some();
    for (index, grant) in body.grants.iter().enumerate() {
        check_grant(grant).map_err(|detail| {
            TokenError::malformed(format!("token {id} grant {index}: {detail}"))
        })?;
        if !delegated && grant.parent_grant_index.is_some() {
            return Err(TokenError::malformed(format!(
                "token {id} grant {index}: a root token's grant has no parent grant"
            )));
        }
    }
    Ok(())
}

fn check_grant(grant: &Grant) -> Result<(), String> {
    for (field, name) in [("server", &grant.server), ("tool", &grant.tool)] {
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(format!("{field} must be 1-{MAX_NAME_BYTES} bytes"));
        }
    }
    for money in [&grant.max_cost_per_invocation, &grant.max_total_cost]
        .into_iter()
        .flatten()
    {
        money.validate().map_err(|e| e.to_string())?;
    }
    if let (Some(per_call), Some(total)) = (&grant.max_cost_per_invocation, &grant.max_total_cost) {
        if per_call.currency != total.currency {
            return Err("the two cost limits name different currencies".into());
        }
    }
    Ok(())
}
