//! Why a token was refused. Each variant names the token (by id) so an operator can find it.

use crate::keys::PublicKey;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum TokenError {
    #[error("token {id}: signature does not verify against its issuer key")]
    BadSignature { id: String },
    #[error("token {id} expired at {expires_at_ms} ms (now {now_ms} ms)")]
    Expired {
        id: String,
        expires_at_ms: u64,
        now_ms: u64,
    },
    #[error("token {id} is issued at {issued_at_ms} ms, in the future (now {now_ms} ms)")]
    NotYetValid {
        id: String,
        issued_at_ms: u64,
        now_ms: u64,
    },
    #[error("root token issuer {issuer} is not in the trust list")]
    UnknownIssuer { issuer: PublicKey },
    #[error("token {id} is held by another subject than the one presenting it")]
    WrongSubject { id: String },
    #[error("token {id}: grant {index} widens its parent grant ({field})")]
    WidenedGrant {
        id: String,
        index: u32,
        field: &'static str,
    },
    #[error("broken delegation chain at token {id}: {detail}")]
    BrokenChain { id: String, detail: String },
    #[error("delegation chain has {depth} tokens; at most {max} allowed")]
    TooDeep { depth: usize, max: usize },
    #[error(
        "token nests arrays and maps more than {max_levels} levels deep, more than a chain of \
         {chain} tokens needs; refused while decoding",
        chain = super::MAX_CHAIN_DEPTH
    )]
    TooDeeplyNested { max_levels: usize },
    #[error("token is {bytes} bytes encoded; at most {max} allowed")]
    TooLarge { bytes: usize, max: usize },
    #[error("malformed token: {0}")]
    Malformed(String),
}

impl TokenError {
    pub(crate) fn malformed(detail: impl Into<String>) -> Self {
        Self::Malformed(detail.into())
    }
}
