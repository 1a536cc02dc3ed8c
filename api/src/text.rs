//! Text put in a bounded field (a status message, an alarm's reason, a receipt's field): cut to
//! a byte limit without splitting a character.

/// The longest prefix of `text` within `max_bytes` bytes, cut on a character boundary.
pub fn bounded(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_text_is_cut_on_a_character_boundary() {
        assert_eq!(bounded("short", 10), "short");
        assert_eq!(bounded("abcdef", 3), "abc");
        // "é" is two bytes: a cut inside it keeps the characters before it.
        assert_eq!(bounded("aé", 2), "a");
        assert_eq!(bounded("éé", 3), "é");
        assert_eq!(bounded("é", 0), "");
    }
}
