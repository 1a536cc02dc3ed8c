//! Copies of a few dozen bytes without a call to the C library's `memcpy`, and loads of up to
//! 16 bytes as one word.
//!
//! Encoding an identity copies ten or so short slices per command (ids, a tail to pad for
//! SHA-256, each field's tail for its hash). A slice copy of a length the compiler cannot see
//! becomes a call to `memcpy`, whose dispatch on size and alignment costs more than moving
//! 60 bytes. Here every move has a fixed size (16, 8, 4, 2 or 1 bytes: plain loads and
//! stores) and the moves overlap to cover any length without a byte loop.

/// Copies `src` into `dst`, which must be exactly as long.
#[inline(always)]
pub(crate) fn copy_short(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_short between unequal slices");
    let len = src.len();
    if len >= 16 {
        let mut at = 0;
        while at + 16 <= len {
            dst[at..at + 16].copy_from_slice(&src[at..at + 16]);
            at += 16;
        }
        if at < len {
            // The last 16 bytes, overlapping what is already copied.
            dst[len - 16..].copy_from_slice(&src[len - 16..]);
        }
    } else if len >= 8 {
        dst[..8].copy_from_slice(&src[..8]);
        dst[len - 8..].copy_from_slice(&src[len - 8..]);
    } else if len >= 4 {
        dst[..4].copy_from_slice(&src[..4]);
        dst[len - 4..].copy_from_slice(&src[len - 4..]);
    } else if len >= 2 {
        dst[..2].copy_from_slice(&src[..2]);
        dst[len - 2..].copy_from_slice(&src[len - 2..]);
    } else if len == 1 {
        dst[0] = src[0];
    }
}

/// The first bytes of a little-endian `u128` holding `bytes` (at most 16), the rest zero.
///
/// Read with two overlapping loads and joined in registers: copying the bytes into a zeroed
/// buffer and reading it back as one word makes the processor wait for the small stores to
/// land before the wide load (a failed store-to-load forwarding, about a dozen cycles each).
#[inline(always)]
pub(crate) fn load_short(bytes: &[u8]) -> u128 {
    let len = bytes.len();
    assert!(len <= 16, "load_short of {len} bytes");
    // Two loads of `n` bytes, at the start and at the end; the second is shifted to where its
    // bytes belong, so the bytes the two share coincide (and are equal).
    let join = |low: u128, high: u128, n: usize| low | (high << ((len - n) * 8));
    if len >= 8 {
        let low = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        let high = u64::from_le_bytes(bytes[len - 8..].try_into().expect("8 bytes"));
        join(u128::from(low), u128::from(high), 8)
    } else if len >= 4 {
        let low = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
        let high = u32::from_le_bytes(bytes[len - 4..].try_into().expect("4 bytes"));
        join(u128::from(low), u128::from(high), 4)
    } else if len >= 2 {
        let low = u16::from_le_bytes(bytes[..2].try_into().expect("2 bytes"));
        let high = u16::from_le_bytes(bytes[len - 2..].try_into().expect("2 bytes"));
        join(u128::from(low), u128::from(high), 2)
    } else if len == 1 {
        u128::from(bytes[0])
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_load_is_the_zero_padded_little_endian_word() {
        let source: Vec<u8> = (1..=16u8).map(|b| b.wrapping_mul(37)).collect();
        for len in 0..=16 {
            let mut padded = [0u8; 16];
            padded[..len].copy_from_slice(&source[..len]);
            assert_eq!(
                load_short(&source[..len]),
                u128::from_le_bytes(padded),
                "{len} bytes"
            );
        }
    }

    #[test]
    #[should_panic(expected = "load_short of 17 bytes")]
    fn a_short_load_is_short() {
        load_short(&[0u8; 17]);
    }

    #[test]
    fn every_length_is_copied_exactly_and_nothing_beside_it() {
        let source: Vec<u8> = (1..=200u8).collect();
        for len in 0..=160 {
            for offset in [0, 1, 7] {
                let mut target = [0u8; 200];
                copy_short(&mut target[offset..offset + len], &source[..len]);
                assert_eq!(&target[offset..offset + len], &source[..len], "len {len}");
                assert!(
                    target[..offset]
                        .iter()
                        .chain(&target[offset + len..])
                        .all(|b| *b == 0),
                    "len {len} at {offset} wrote outside its slice"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "unequal slices")]
    fn unequal_slices_are_refused() {
        copy_short(&mut [0u8; 3], &[1, 2]);
    }
}
