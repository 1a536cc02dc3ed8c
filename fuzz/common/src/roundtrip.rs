//! Round-trip assertions. A decoder of untrusted bytes must, for every input it accepts,
//! produce a value that encodes, and whose encoding decodes back to the same value: a node
//! that writes what it cannot read again (a log entry, a snapshot, a reply) is broken.

use std::fmt::Debug;

use prost::Message;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// `value` (already decoded from untrusted bytes) through positional msgpack, the form
/// `encode_raft`, family snapshots, tokens and tickets use: it must encode, decode back equal,
/// and encode to the same bytes again.
pub fn msgpack<T>(what: &str, value: &T) -> Vec<u8>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let bytes = rmp_serde::to_vec(value)
        .unwrap_or_else(|e| panic!("{what}: a decoded value does not encode: {e}\n{value:?}"));
    let back: T = rmp_serde::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{what}: its own encoding does not decode: {e}\n{value:?}"));
    assert_eq!(&back, value, "{what}: decode(encode(x)) != x");
    let again = rmp_serde::to_vec(&back).expect("encodes");
    assert_eq!(
        again, bytes,
        "{what}: encoding is not a function of the value"
    );
    bytes
}

/// As [`msgpack`] with field names (`rmp_serde::to_vec_named`), the form the Raft log store
/// writes entries in.
pub fn msgpack_named<T>(what: &str, value: &T) -> Vec<u8>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let bytes = rmp_serde::to_vec_named(value)
        .unwrap_or_else(|e| panic!("{what}: a decoded value does not encode: {e}\n{value:?}"));
    let back: T = rmp_serde::from_slice(&bytes).unwrap_or_else(|e| {
        panic!("{what}: its own named encoding does not decode: {e}\n{value:?}")
    });
    assert_eq!(&back, value, "{what}: decode(encode_named(x)) != x");
    bytes
}

/// For types without `PartialEq` (some openraft messages): the encoding of a decoded value
/// must decode, and re-encode to the same bytes (a fixpoint after one round).
pub fn msgpack_fixpoint<T>(what: &str, value: &T, encode: impl Fn(&T) -> Vec<u8>) -> Vec<u8>
where
    T: DeserializeOwned + Debug,
{
    let bytes = encode(value);
    let back: T = rmp_serde::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{what}: its own encoding does not decode: {e}\n{value:?}"));
    let again = encode(&back);
    assert_eq!(
        again, bytes,
        "{what}: encode(decode(encode(x))) != encode(x)"
    );
    bytes
}

/// A domain value through its protobuf form and bytes and back: `D → W → bytes → W → D`.
pub fn proto<D, W>(what: &str, value: &D) -> D
where
    for<'a> W: From<&'a D>,
    W: Message + Default,
    D: TryFrom<W> + PartialEq + Debug,
    <D as TryFrom<W>>::Error: Debug,
{
    let bytes = W::from(value).encode_to_vec();
    let wire = W::decode(bytes.as_slice())
        .unwrap_or_else(|e| panic!("{what}: our own protobuf does not decode: {e}"));
    let back = D::try_from(wire)
        .unwrap_or_else(|e| panic!("{what}: wire form of {value:?} does not convert back: {e:?}"));
    assert_eq!(
        &back, value,
        "{what}: domain -> wire -> domain changed the value"
    );
    back
}
