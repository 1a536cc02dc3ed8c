//! A bounded cache of parsed certificate identities, so the client and peer ports parse a
//! caller's x509 certificate once rather than on every request: a unary call pays for the
//! parse on every request, and a connection keeps presenting the same certificate.
//!
//! Only the parse is cached, never a decision: the roles, a kernel's namespaces and the peer
//! port's membership check still run on every request against the identity returned here.
//! The key is the certificate's whole DER encoding (compared byte for byte, so two
//! certificates can never share an entry), and the chain behind those bytes was verified by
//! rustls at the connection's handshake, which the cache does not skip: it reuses what the
//! bytes say, not that they were trusted.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tally_tls::identity::{self, CertIdentity, IdentityError};

/// Certificates remembered per port. A cluster sees a few nodes and at most a few hundred
/// kernel, reader and operator certificates at a time, so 1,024 keeps every live caller's
/// entry. The bound keeps a caller that presents a new certificate on every connection (each
/// still signed by the CA) from growing the cache: past it the oldest entry goes, and a caller
/// whose entry went pays one parse more. With [`MAX_CACHED_DER_BYTES`] it caps the cache at
/// about 17 MiB; Tally's own certificates fill it to about 2 MiB.
pub const MAX_CACHED_IDENTITIES: usize = 1_024;

/// A certificate longer than this is parsed on every request and never cached. Tally's
/// certificates are under 2 KiB (one with [`tally_tls::identity::MAX_NAMESPACES`] namespaces is
/// under 10 KiB), so this only keeps an odd one from taking a large share of the cache.
pub const MAX_CACHED_DER_BYTES: usize = 16 * 1024;

/// Parsed identities by certificate, the oldest evicted first.
pub struct IdentityCache {
    entries: Mutex<Entries>,
    capacity: usize,
    max_der_bytes: usize,
}

#[derive(Default)]
struct Entries {
    by_der: HashMap<Arc<[u8]>, CertIdentity>,
    /// The keys of `by_der`, oldest first.
    order: VecDeque<Arc<[u8]>>,
}

impl Default for IdentityCache {
    fn default() -> Self {
        Self::with_limits(MAX_CACHED_IDENTITIES, MAX_CACHED_DER_BYTES)
    }
}

impl IdentityCache {
    /// At most `capacity` entries, each of a certificate of at most `max_der_bytes`.
    pub fn with_limits(capacity: usize, max_der_bytes: usize) -> Self {
        assert!(capacity > 0, "an identity cache holds at least one entry");
        Self {
            entries: Mutex::new(Entries::default()),
            capacity,
            max_der_bytes,
        }
    }

    /// The identity `der` names: remembered, or parsed now (and remembered if it parses).
    /// Refusals are not remembered, so they cannot push out the entries of callers that pass.
    pub fn identity(&self, der: &[u8]) -> Result<CertIdentity, IdentityError> {
        if let Some(known) = self.lock().by_der.get(der) {
            return Ok(known.clone());
        }
        // Parsed outside the lock: concurrent first requests of one certificate may both
        // parse it, which is harmless (the second insert finds the entry).
        let parsed = identity::parse(der)?;
        if der.len() <= self.max_der_bytes {
            self.remember(der, &parsed);
        }
        Ok(parsed)
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.lock().by_der.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn remember(&self, der: &[u8], parsed: &CertIdentity) {
        let mut entries = self.lock();
        let key: Arc<[u8]> = Arc::from(der);
        if let Entry::Vacant(vacant) = entries.by_der.entry(Arc::clone(&key)) {
            vacant.insert(parsed.clone());
            entries.order.push_back(key);
        }
        while entries.order.len() > self.capacity {
            if let Some(oldest) = entries.order.pop_front() {
                entries.by_der.remove(&oldest);
            }
        }
        assert!(
            entries.by_der.len() == entries.order.len() && entries.order.len() <= self.capacity,
            "the identity cache holds {} entries and {} keys, at most {}",
            entries.by_der.len(),
            entries.order.len(),
            self.capacity
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // Every update leaves the map and the order consistent before it can panic (the
        // assert above runs last), so a poisoned lock still guards a usable cache.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_tls::files::first_certificate_der;
    use tally_tls::identity::{Namespace, Role};
    use tally_tls::CertAuthority;

    fn node(ca: &CertAuthority, id: u64) -> Vec<u8> {
        let issued = ca.issue_node(id, &[], 1).expect("issue");
        first_certificate_der(issued.cert_pem.as_bytes()).expect("der")
    }

    fn kernel(ca: &CertAuthority, name: &str, namespaces: Vec<Namespace>) -> Vec<u8> {
        let issued = ca
            .issue_client(name, Role::Kernel, namespaces, 1)
            .expect("issue");
        first_certificate_der(issued.cert_pem.as_bytes()).expect("der")
    }

    #[test]
    fn a_cached_identity_equals_a_fresh_parse() {
        let ca = CertAuthority::generate("tally-test", 1).expect("ca");
        let cache = IdentityCache::default();
        let namespaces = vec![Namespace::Issuer("ab12".to_owned()), Namespace::Any];
        let cases = [
            (node(&ca, 3), CertIdentity::Node { id: 3 }),
            (
                kernel(&ca, "kernel-eu", namespaces.clone()),
                CertIdentity::Client {
                    name: "kernel-eu".to_owned(),
                    role: Role::Kernel,
                    namespaces,
                },
            ),
        ];
        for (der, expected) in cases {
            let first = cache.identity(&der).expect("parses");
            let cached = cache.identity(&der).expect("cached");
            assert_eq!(cached, identity::parse(&der).expect("parses"));
            assert_eq!(cached, first);
            assert_eq!(cached, expected);
        }
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn the_bound_holds_and_the_oldest_entry_goes_first() {
        let ca = CertAuthority::generate("tally-test", 1).expect("ca");
        let cache = IdentityCache::with_limits(3, MAX_CACHED_DER_BYTES);
        let ders: Vec<Vec<u8>> = (1..=5).map(|id| node(&ca, id)).collect();
        for (i, der) in ders.iter().enumerate() {
            cache.identity(der).expect("parses");
            assert_eq!(cache.len(), (i + 1).min(3), "at most 3 entries");
        }
        let held: Vec<bool> = ders
            .iter()
            .map(|der| cache.lock().by_der.contains_key(der.as_slice()))
            .collect();
        assert_eq!(
            held,
            [false, false, true, true, true],
            "the two oldest went"
        );
        // A hit neither grows the cache nor changes what it answers.
        assert_eq!(
            cache.identity(&ders[4]).expect("cached"),
            CertIdentity::Node { id: 5 }
        );
        assert_eq!(cache.len(), 3);
        assert_eq!(IdentityCache::default().capacity, MAX_CACHED_IDENTITIES);
    }

    #[test]
    fn refusals_and_oversized_certificates_are_not_remembered() {
        let ca = CertAuthority::generate("tally-test", 1).expect("ca");
        let der = node(&ca, 1);
        let cache = IdentityCache::with_limits(3, der.len() - 1);
        assert!(cache.identity(b"not a certificate").is_err());
        assert!(cache.is_empty(), "a refusal is not remembered");
        assert_eq!(
            cache.identity(&der).expect("parses"),
            CertIdentity::Node { id: 1 }
        );
        assert!(
            cache.is_empty(),
            "a certificate past the size bound is not remembered"
        );
        let roomy = IdentityCache::with_limits(3, der.len());
        roomy.identity(&der).expect("parses");
        assert_eq!(roomy.len(), 1);
    }
}
